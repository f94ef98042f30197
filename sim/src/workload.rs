//! The workload: what the user runs — inference or training, batch and sequence, precision,
//! quantization, fine-tuning method, optimizer, attention implementation, parallelism, engine,
//! and the memory-saving switches people use. Read from `--workload FILE.yaml` and flags (flags
//! win); every field has the default a user of transformers would get.

use serde::{Deserialize, Serialize};
use vramplan_profiles::DType;
use vramplan_profiles::model::ModelDescription;

/// Inference or training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Serving or generation: weights, KV cache and one forward pass (`mode: inference`,
    /// `--mode inference`).
    #[default]
    Inference,
    /// Training: gradients, optimizer states and the activations kept for backward as well
    /// (`mode: train`, `--mode train`).
    Train,
}

/// How weights are stored on the GPU, beyond a plain dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Quant {
    /// Plain weights in `weight_dtype` (`quant: {kind: none}`, `--quant none`).
    #[default]
    None,
    /// bitsandbytes LLM.int8 (`load_in_8bit`): int8 linear weights with an fp32 scale per row.
    Int8,
    /// bitsandbytes 4-bit (`load_in_4bit`): nf4 or fp4 in blocks of 64 with an absmax each,
    /// optionally double-quantized.
    Nf4 {
        /// The per-block absmax constants are quantized too, to 8 bits
        /// (`bnb_4bit_use_double_quant`, `--double-quant`).
        double_quant: bool,
    },
    /// bitsandbytes 4-bit with the fp4 data type (`bnb_4bit_quant_type="fp4"`, `--quant fp4`):
    /// the same blocks and absmax as nf4.
    Fp4 {
        /// The per-block absmax constants are quantized too, to 8 bits
        /// (`bnb_4bit_use_double_quant`, `--double-quant`).
        double_quant: bool,
    },
    /// GPTQ / AWQ: `bits`-bit weights packed in int32 with fp16 scales and packed zeros per
    /// `group_size` inputs.
    Gptq {
        /// Bits a weight: 2, 3, 4 or 8 (`--quant gptq` is 4, `--quant gptq-8bit` 8).
        bits: u32,
        /// Inputs that share a scale and a zero point (the quantization config's `group_size`,
        /// `--group-size`; default 128).
        group_size: u32,
    },
    /// AWQ (`--quant awq`): the same packed layout as GPTQ.
    Awq {
        /// Bits a weight: always 4, the only width AWQ has.
        bits: u32,
        /// Inputs that share a scale and a zero point (the quantization config's `group_size`,
        /// `--group-size`; default 128).
        group_size: u32,
    },
    /// fp8 e4m3 weights with fp32 scales per `block`×`block` tile (DeepSeek-V3 style).
    Fp8 {
        /// Side of a scale tile, in weights (`weight_block_size`, `--group-size`; default 128).
        block: u32,
    },
    /// A llama.cpp GGUF quantization type (`Q4_K_M`, `Q8_0`, `F16`).
    Gguf {
        /// The file type as `llama-quantize` names it (`quant.quant_type`, or the type given to
        /// `--quant`); read by [`crate::engines::gguf::FileType::parse`].
        quant_type: String,
    },
}

/// Full fine-tune or LoRA adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Finetune {
    /// Every parameter is trained, with a gradient and optimizer states each
    /// (`finetune: {kind: full}`).
    #[default]
    Full,
    /// LoRA on the linear modules whose name matches a pattern (a name such as `q_proj`, or
    /// `all-linear`); QLoRA is LoRA over a 4-bit `quant`.
    Lora {
        /// Rank of the adapter matrices (PEFT's `r`, `--lora-rank`).
        rank: u64,
        /// Scaling of the update (PEFT's `lora_alpha`, `--lora-alpha`; default 8); it costs no
        /// memory.
        alpha: u64,
        /// Module names to wrap, matched as PEFT's `target_modules` (`--lora-targets`); empty
        /// takes PEFT's default for the architecture.
        targets: Vec<String>,
    },
}

/// Activation (gradient) checkpointing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GradCheckpointing {
    /// Every activation needed for backward is kept from the forward pass
    /// (`grad_checkpointing: off`).
    #[default]
    Off,
    /// Each decoder layer recomputed in backward (transformers' `gradient_checkpointing_enable`).
    Full,
    /// Only attention recomputed (Korthikanti et al. 2022 "selective recomputation").
    Selective,
}

/// The optimizer, which sets the states kept per trainable parameter (`optimizer`, `--optimizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// AdamW with two states per trainable parameter, in the parameter's dtype (torch).
    #[default]
    Adamw,
    /// bitsandbytes 8-bit AdamW: two 8-bit states with block-wise fp32 absmax.
    Adamw8bit,
    /// bitsandbytes paged 8-bit AdamW: the same states in unified memory that can page out.
    PagedAdamw8bit,
    /// Paged 32-bit AdamW.
    PagedAdamw,
    /// Plain SGD (`torch.optim.SGD` without momentum): no state.
    Sgd,
    /// SGD with momentum: one momentum buffer per trainable parameter, in the parameter's dtype.
    SgdMomentum,
    /// Adafactor: factored second moment (row and column vectors), no first moment.
    Adafactor,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttentionImpl {
    /// Materialises the scores and their softmax per head (`attn_implementation="eager"`).
    Eager,
    /// `scaled_dot_product_attention`: memory-efficient / flash kernels, no scores kept.
    #[default]
    Sdpa,
    /// flash-attention 2.
    Flash,
}

/// How the work is spread over devices.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Parallelism {
    /// One device, or a device map over several (naive model parallel: one batch in flight).
    #[default]
    Single,
    /// DDP: a full replica per GPU, gradients all-reduced in buckets.
    Ddp,
    /// ZeRO stage 1/2/3 (DeepSpeed) or FSDP (stage 3 = full shard) across the profile's GPUs,
    /// optionally offloading optimizer states and/or parameters to the CPU.
    Zero {
        /// 1 shards optimizer states and master weights, 2 also gradients, 3 also the weights
        /// (`--parallel zero1` … `zero3`, `fsdp`).
        stage: u8,
        /// Optimizer states live in CPU memory (DeepSpeed `offload_optimizer`,
        /// `--offload-optimizer`).
        offload_optimizer: bool,
        /// Parameters live in CPU memory, stage 3 only (DeepSpeed `offload_param`,
        /// `--offload-params`).
        offload_params: bool,
    },
    /// Tensor parallelism over `size` GPUs: heads and MLP columns split, KV heads replicated
    /// when fewer than `size`; under vLLM, `pipeline` stages of such a group, each with its
    /// share of the layers (`size × pipeline` GPUs).
    Tensor {
        /// GPUs in the tensor-parallel group (`--parallel tp=N`, vLLM's `--tensor-parallel-size`).
        size: u32,
        /// Pipeline stages (`--parallel tp=N,pp=M`, vLLM's `--pipeline-parallel-size`), 1 by
        /// default; only vLLM runs more than one.
        #[serde(default = "one_stage", skip_serializing_if = "is_one_stage")]
        pipeline: u32,
    },
}

/// The default number of pipeline stages: one.
fn one_stage() -> u32 {
    1
}

fn is_one_stage(stages: &u32) -> bool {
    *stages == 1
}

impl Parallelism {
    /// Tensor parallelism over `size` GPUs, one pipeline stage.
    pub fn tensor(size: u32) -> Parallelism {
        Parallelism::Tensor { size, pipeline: 1 }
    }
}

/// The program that runs inference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Engine {
    /// transformers `generate`: a contiguous KV cache grown to the context length.
    #[default]
    Transformers,
    /// vLLM: a paged KV cache sized from `gpu_memory_utilization` × total memory.
    Vllm {
        /// Fraction of the device's memory vLLM may take, above 0 and at most 1 (vLLM's
        /// `--gpu-memory-utilization`; default 0.9).
        gpu_memory_utilization: f64,
        /// Tokens in one forward pass, which sizes the profiling run's activations (vLLM's
        /// `--max-num-batched-tokens`; default 8192).
        max_num_batched_tokens: u64,
    },
    /// llama.cpp: GGUF weights, a KV cache of `n_ctx` tokens, compute buffers for `n_ubatch`.
    LlamaCpp {
        /// Context size in tokens (llama.cpp's `-c` / `--ctx-size`, `--n-ctx`; default `seq`);
        /// 0 means the model's trained context.
        n_ctx: u64,
        /// Physical batch in tokens, which sizes the compute buffer (llama.cpp's `-ub` /
        /// `--ubatch-size`, `--n-ubatch`; default 512).
        n_ubatch: u64,
    },
    /// SGLang: a token pool sized from `mem_fraction_static` of the memory free before loading
    /// (`engines::sglang`); the context length is the workload's `seq` (`--context-length`).
    Sglang {
        /// Fraction of the memory free before loading that weights and the token pool may take
        /// (`--mem-fraction-static`); none: SGLang's default for the GPU's size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mem_fraction_static: Option<f64>,
        /// An upper bound on the pool's tokens (`--max-total-tokens`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_total_tokens: Option<u64>,
        /// Data-parallel replicas, each on its own tensor-parallel group (`--dp-size`; default 1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dp_size: Option<u32>,
        /// Expert-parallel size (`--ep-size`; default 1, else equal to the tensor-parallel size).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ep_size: Option<u32>,
    },
}

impl Engine {
    /// vLLM with its defaults: `--gpu-memory-utilization 0.9`, and `--max-num-batched-tokens`
    /// 8192, the V1 engine's online serving default.
    pub const VLLM_DEFAULT: Engine =
        Engine::Vllm { gpu_memory_utilization: 0.9, max_num_batched_tokens: 8192 };

    /// SGLang with its defaults (the fraction by GPU size, one replica, no expert parallelism).
    pub const SGLANG_DEFAULT: Engine =
        Engine::Sglang { mem_fraction_static: None, max_total_tokens: None, dp_size: None, ep_size: None };

    /// llama.cpp's default `--ubatch-size`.
    pub const LLAMACPP_UBATCH: u64 = 512;

    /// llama.cpp with a context of `n_ctx` tokens and its default micro-batch.
    pub fn llamacpp(n_ctx: u64) -> Engine {
        Engine::LlamaCpp { n_ctx, n_ubatch: Engine::LLAMACPP_UBATCH }
    }
}

/// vLLM's serving options beyond the engine's budget fractions (`vllm` in the workload file;
/// flags `--enforce-eager`, `--max-loras`, `--max-lora-rank`, `--kv-cache-memory-bytes`,
/// `--max-model-len auto`, `--data-parallel-size`, `--enable-expert-parallel`); read only under
/// [`Engine::Vllm`] (`engines::vllm_extras`, `engines::estimate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct VllmOptions {
    /// No CUDA graphs are captured (vLLM's `--enforce-eager`).
    pub enforce_eager: bool,
    /// Adapter slots vLLM preallocates (`--enable-lora --max-loras N`); 0 serves no LoRA.
    pub max_loras: u64,
    /// Rank of each slot (`--max-lora-rank`; vLLM's default 16).
    pub max_lora_rank: u64,
    /// The KV cache's size in bytes, replacing the one `gpu_memory_utilization` leaves
    /// (`--kv-cache-memory-bytes`).
    pub kv_cache_memory_bytes: Option<u64>,
    /// `--max-model-len auto`: the context is the longest one request the KV cache holds, not
    /// the workload's `seq`.
    pub max_model_len_auto: bool,
    /// Speculative decoding (`--speculative-config`); none by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<Speculative>,
    /// Replicas of the tensor × pipeline group (`--data-parallel-size`); 1 when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_parallel_size: Option<u32>,
    /// The routed experts spread whole over the `tp × dp` ranks (`--enable-expert-parallel`)
    /// instead of split on their intermediate dimension.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enable_expert_parallel: bool,
}

/// vLLM's `--speculative-config`: what proposes the tokens the model verifies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Speculative {
    /// vLLM's `method`: `draft_model`, `eagle`, `eagle3`, `mtp` or `ngram`.
    pub method: String,
    /// Tokens proposed per step (`num_speculative_tokens`).
    pub num_speculative_tokens: u64,
    /// The draft model (`model`), a built-in config or a config file; `draft_model` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The training loop, where frameworks differ in what they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Trainer {
    /// The HF Trainer (or TRL) with PEFT: LoRA adapters in fp32 (`autocast_adapter_dtype=True`),
    /// k-bit training casts the unquantized parameters to fp32 (`prepare_model_for_kbit_training`),
    /// and the loss upcasts the logits to fp32 (`ForCausalLMLoss`).
    #[default]
    Transformers,
    /// torchtune: adapters in the model's dtype, no fp32 cast of unquantized parameters, its own
    /// attention (K and V expanded to every head), and cross-entropy on the model's fp32 logits
    /// (`nn.CrossEntropyLoss`), or chunk by chunk with `CEWithChunkedOutputLoss`.
    Torchtune,
    /// Unsloth (`FastLanguageModel`, LoRA/QLoRA with its own kernels): frozen parameters stay
    /// in the model's dtype (no fp32 cast), adapters in fp32; fused RMSNorm, in-place RoPE and
    /// fused LoRA MLP/QKV kernels keep less for backward; `use_gradient_checkpointing="unsloth"`
    /// offloads each layer's input to pinned CPU memory; its fused cross-entropy computes the
    /// loss's gradient chunk by chunk in the forward pass and returns no logits.
    Unsloth,
    /// LitGPT's finetune scripts (0.5.13: `litgpt/finetune/{full,lora}.py` on Lightning
    /// Fabric): its own `GPT` model, whose head is never tied to the embedding; `bf16-true`
    /// (adapters and optimizer states in the model's dtype); `torch.optim.AdamW`'s foreach step;
    /// the logits, in `lm_head_chunk_size=128` chunks, held through backward beside
    /// `chunked_cross_entropy`'s log-softmax; under `--quantize bnb.nf4` every linear is 4-bit,
    /// the head's too, and the embedding trains as a `StableEmbedding` (`model/litgpt.rs`).
    Litgpt,
    /// Answer.AI's fsdp_qlora (`train.py`): transformers' model with PEFT LoRA over bitsandbytes
    /// 4-bit linears whose packed bytes are stored as bf16 (`quant_storage`), wrapped in torch's
    /// FSDP1 (one flat parameter per decoder layer and per LoRA linear, `use_orig_params=False`,
    /// no mixed-precision policy at its default `--precision bf16`), without
    /// `prepare_model_for_kbit_training` (no fp32 cast), the 4-bit compute dtype the model's.
    /// Under `--parallel fsdp` its flat parameters are sharded and gathered one unit at a time
    /// (`sim/src/fsdp.rs`; docs/memory-model.md, "FSDP with QLoRA").
    #[serde(rename = "fsdp-qlora", alias = "fsdp_qlora")]
    FsdpQlora,
}

impl Trainer {
    /// Whether the step runs transformers' own modules and loss (`ForCausalLMLoss`): the HF
    /// Trainer's, and fsdp_qlora's, which calls the model with its labels.
    pub fn runs_transformers_modules(self) -> bool {
        matches!(self, Trainer::Transformers | Trainer::FsdpQlora)
    }

    /// Whether bitsandbytes' 4-bit linears compute in the model's dtype rather than the
    /// `bnb_4bit_compute_dtype` transformers' config leaves at fp32: Unsloth sets every
    /// `Linear4bit`'s compute dtype to the model's, as Fabric's `BitsandbytesPrecision` does
    /// for LitGPT (`m.compute_dtype = self.dtype`) and fsdp_qlora at `--precision bf16`.
    pub fn dequantizes_in_model_dtype(self) -> bool {
        matches!(self, Trainer::Unsloth | Trainer::Litgpt | Trainer::FsdpQlora)
    }

    /// Whether a 4-bit linear's backward is charged its weight dequantized again: LitGPT's
    /// (bitsandbytes' `MatMul4Bit.backward`), torchtune's (`LinearNF4.backward`) and Unsloth's
    /// (its LoRA kernels' `fast_dequantize`), each traced. The HF Trainer and fsdp_qlora run the
    /// same bitsandbytes backward but are not charged it: not yet set beside their traced rows
    /// (docs/memory-model.md, "Known gaps").
    pub fn dequantizes_again_in_backward(self) -> bool {
        matches!(self, Trainer::Litgpt | Trainer::Torchtune | Trainer::Unsloth)
    }

    /// Whether the plain loss runs on fp32 logits: transformers' `ForCausalLMLoss` upcasts them
    /// (`logits.float()`), and torchtune's `TransformerDecoder` returns `self.output(h).float()`
    /// (since 2024-01, pytorch/torchtune #137).
    pub fn loss_on_fp32_logits(self) -> bool {
        matches!(self, Trainer::Transformers | Trainer::Torchtune | Trainer::FsdpQlora)
    }
}

/// The images each sample of a vision-language workload carries (`images`, `--images`,
/// `--image-size`): every image of one size, which the model's processor resizes
/// (`profiles::model::vision::VisionFacts::image_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Images {
    /// Images per sample (per sequence).
    pub per_sample: u64,
    /// Width of each image in pixels, before the processor's resize.
    pub width: u64,
    /// Height of each image in pixels, before the processor's resize.
    pub height: u64,
}

/// Memory-saving switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Switches {
    /// Cross-entropy over chunks of the sequence, upcasting one chunk at a time.
    pub chunked_cross_entropy: bool,
    /// The optimizer steps each parameter as soon as its gradient is ready, freeing it.
    pub optimizer_in_backward: bool,
    /// Activations kept for backward are moved to CPU memory between forward and backward.
    pub activation_offload: bool,
    /// `torch.compile`: pointwise chains fuse, so their intermediates are not kept.
    pub compile: bool,
    /// Gradients are zeroed in place rather than freed between steps (`zero_grad(set_to_none=False)`,
    /// the default before PyTorch 2.0), so they stay allocated through the forward pass.
    pub keep_gradients: bool,
}

/// One workload. Field defaults are what transformers users get without asking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Inference or training (`mode`, `--mode`).
    pub mode: Mode,
    /// Micro-batch (training) or concurrent sequences (inference).
    pub batch: u64,
    /// Tokens per sequence: the training length, or the inference context (prompt + generated).
    /// A vision-language model's image tokens come on top ([`Workload::images`]).
    pub seq: u64,
    /// Images per sample, for a vision-language model: their patches run through the vision
    /// tower, and their tokens join each sequence's `seq` text tokens.
    pub images: Option<Images>,
    /// Inference: tokens of the prompt processed at once in prefill (default: `seq`).
    pub prompt: Option<u64>,
    /// Gradient-accumulation steps per optimizer step (`grad_accum`, `--grad-accum`); checked but
    /// not replayed (docs/memory-model.md).
    pub grad_accum: u64,
    /// The dtype weights are held in (default: the checkpoint's).
    pub weight_dtype: Option<DType>,
    /// Autocast dtype for matmuls (`fp16=True` / `bf16=True` in the HF Trainer on an fp32 model);
    /// `None` computes in the weight dtype.
    pub autocast: Option<DType>,
    /// How weights are quantized (`quant`, `--quant`).
    pub quant: Quant,
    /// Full fine-tune or LoRA (`finetune`, `--lora-rank`).
    pub finetune: Finetune,
    /// Activation checkpointing (`grad_checkpointing`, `--grad-ckpt`).
    pub grad_checkpointing: GradCheckpointing,
    /// The optimizer, for training (`optimizer`, `--optimizer`).
    pub optimizer: Optimizer,
    /// The attention implementation (transformers' `attn_implementation`; `attention`, `--attn`).
    pub attention: AttentionImpl,
    /// How the work is spread over the profile's GPUs (`parallelism`, `--parallel`).
    pub parallelism: Parallelism,
    /// The program that runs inference (`engine`, `--engine`).
    pub engine: Engine,
    /// vLLM's serving options: CUDA graphs, LoRA slots, the KV-cache override (`vllm`).
    pub vllm: VllmOptions,
    /// KV-cache dtype (default: the compute dtype).
    pub kv_dtype: Option<DType>,
    /// The training framework (`trainer`, `--trainer`).
    pub trainer: Trainer,
    /// The trainer's release where its allocations differ by version (`trainer_version`,
    /// `--trainer-version`; torchtune only: `0.1` quantizes at load without chunks); the latest
    /// when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trainer_version: Option<String>,
    /// AutoAWQ's fused modules with a cache of this many tokens (`awq_fused`, `--awq-fused`:
    /// `from_quantized(fuse_layers=True, max_new_tokens=N)`, `model/awq_fused.rs`); `None` runs
    /// transformers' AWQ linears.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub awq_fused: Option<u64>,
    /// Memory-saving switches (`switches`, each with its own flag).
    pub switches: Switches,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            mode: Mode::Inference,
            batch: 1,
            seq: 2048,
            images: None,
            prompt: None,
            grad_accum: 1,
            weight_dtype: None,
            autocast: None,
            quant: Quant::None,
            finetune: Finetune::Full,
            grad_checkpointing: GradCheckpointing::Off,
            optimizer: Optimizer::Adamw,
            attention: AttentionImpl::Sdpa,
            parallelism: Parallelism::Single,
            engine: Engine::Transformers,
            vllm: VllmOptions::default(),
            kv_dtype: None,
            trainer: Trainer::Transformers,
            trainer_version: None,
            awq_fused: None,
            switches: Switches::default(),
        }
    }
}

impl Workload {
    /// The GPUs of the tensor-parallel group a serving engine runs on (`--parallel tp=N`,
    /// vLLM's `--tensor-parallel-size`, SGLang's `--tp-size`), 1 by default.
    pub fn tensor_parallel_size(&self) -> u32 {
        match self.parallelism {
            Parallelism::Tensor { size, .. } => size.max(1),
            _ => 1,
        }
    }

    /// vLLM's data-parallel replicas (`--data-parallel-size`), 1 by default.
    pub fn data_parallel_size(&self) -> u32 {
        self.vllm.data_parallel_size.unwrap_or(1).max(1)
    }

    /// The pipeline stages a serving engine runs (`--parallel tp=N,pp=M`, vLLM's
    /// `--pipeline-parallel-size`), 1 by default.
    pub fn pipeline_parallel_size(&self) -> u32 {
        match self.parallelism {
            Parallelism::Tensor { pipeline, .. } => pipeline.max(1),
            _ => 1,
        }
    }

    /// The image tokens each sequence of a vision-language model carries: every image's tokens
    /// as the model's processor counts them (0 without images or a vision tower, or for an
    /// image the processor refuses, which the input checks report).
    pub fn image_tokens(&self, model: &ModelDescription) -> u64 {
        let (Some(images), Some(vision)) = (&self.images, &model.facts.vision) else { return 0 };
        vision
            .image_tokens(images.width, images.height)
            .map_or(0, |image| image.tokens.saturating_mul(images.per_sample))
    }

    /// This workload as the language model sees it: each sequence (and prompt) longer by its
    /// image tokens, which the processor puts in the prompt (`<|image_pad|>` repeated).
    pub fn with_image_tokens(&self, model: &ModelDescription) -> std::borrow::Cow<'_, Workload> {
        let tokens = self.image_tokens(model);
        if tokens == 0 {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(Workload {
            seq: self.seq.saturating_add(tokens),
            prompt: self.prompt.map(|p| p.saturating_add(tokens)),
            ..self.clone()
        })
    }

    /// Whether `other` is this workload at another shape: it differs at most in `batch`, `seq`
    /// and `prompt`. What the step takes from the model and the placement is then the same
    /// (a sweep over shapes resolves it once, `sweep.rs`).
    pub fn same_but_shape(&self, other: &Workload) -> bool {
        *other == Workload { batch: other.batch, seq: other.seq, prompt: other.prompt, ..self.clone() }
    }
}
