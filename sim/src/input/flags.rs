//! The workload flags of the command line, as typed, and how they override a workload read from
//! a file: a flag that is given wins; a flag that refines a choice (`--double-quant`,
//! `--group-size`, `--gpu-memory-utilization`, `--offload-optimizer`) applies to the choice the
//! flags or the file made, and is refused where it means nothing. Values are parsed here, so
//! that the words a flag accepts and the message for one it does not are the same everywhere.
//! The flags are declared here once: with the `clap` feature, [`WorkloadFlags`] is the command
//! line's `clap::Args`, flattened into every command that simulates.

use super::serving::engine_flag_unused;
use crate::engines::gguf::FileType;
use crate::workload::{
    AttentionImpl, Engine, Finetune, GradCheckpointing, Images, Mode, Optimizer, Parallelism, Quant, Trainer,
    Workload,
};
use vramplan_profiles::suggest::{closest, ticked, ticked_or};
use vramplan_profiles::{DType, InputError};

/// The workload flags as the user gave them; `None` / `false` leaves the file's value. Declared
/// once: with the `clap` feature this is the command line's `clap::Args` (the doc comments are
/// the `--help` texts). Values stay text until [`WorkloadFlags::apply`], which reads them with the
/// aliases, case and `_`/`-` spellings people use and refuses a bad one naming the flag, the
/// accepted words and the closest (clap's `ValueEnum` would refuse those spellings and word its
/// own message).
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(feature = "clap", command(next_help_heading = "Workload (overrides --workload)"))]
pub struct WorkloadFlags {
    /// train | inference
    #[cfg_attr(feature = "clap", arg(long))]
    pub mode: Option<String>,
    /// Micro-batch (training) or concurrent sequences (inference).
    #[cfg_attr(feature = "clap", arg(long))]
    pub batch: Option<u64>,
    /// Tokens per sequence (inference: prompt + generated).
    #[cfg_attr(feature = "clap", arg(long))]
    pub seq: Option<u64>,
    /// Inference: prompt tokens prefilled at once (default: --seq).
    #[cfg_attr(feature = "clap", arg(long))]
    pub prompt: Option<u64>,
    /// Vision-language models: images per sample (their tokens come on top of --seq).
    #[cfg_attr(feature = "clap", arg(long))]
    pub images: Option<u64>,
    /// Vision-language models: each image's size before the processor resizes it, WIDTHxHEIGHT
    /// (`1024x768`).
    #[cfg_attr(feature = "clap", arg(long, value_name = "WxH"))]
    pub image_size: Option<String>,
    /// Gradient-accumulation steps.
    #[cfg_attr(feature = "clap", arg(long))]
    pub grad_accum: Option<u64>,
    /// Weight dtype: fp32 | fp16 | bf16 | fp8 … (default: the checkpoint's).
    #[cfg_attr(feature = "clap", arg(long))]
    pub dtype: Option<String>,
    /// Mixed precision on fp32 weights: fp16 | bf16 | none.
    #[cfg_attr(feature = "clap", arg(long))]
    pub autocast: Option<String>,
    /// none | int8 | nf4 | fp4 | gptq | gptq-8bit | awq | fp8 | a GGUF type (Q4_K_M, Q8_0, …).
    #[cfg_attr(feature = "clap", arg(long))]
    pub quant: Option<String>,
    /// bitsandbytes 4-bit: quantize the absmax constants too.
    #[cfg_attr(feature = "clap", arg(long))]
    pub double_quant: bool,
    /// GPTQ / AWQ group size (default 128), or the fp8 scale block.
    #[cfg_attr(feature = "clap", arg(long))]
    pub group_size: Option<u32>,
    /// LoRA rank (given: LoRA adapters instead of a full fine-tune).
    #[cfg_attr(feature = "clap", arg(long))]
    pub lora_rank: Option<u64>,
    /// LoRA alpha (default 8, PEFT's).
    #[cfg_attr(feature = "clap", arg(long))]
    pub lora_alpha: Option<u64>,
    /// Modules LoRA wraps: q_proj,v_proj | all-linear (default: PEFT's for the architecture).
    #[cfg_attr(feature = "clap", arg(long))]
    pub lora_targets: Option<String>,
    /// Activation checkpointing: off | full | selective.
    #[cfg_attr(feature = "clap", arg(long))]
    pub grad_ckpt: Option<String>,
    /// adamw | adamw8bit | paged-adamw8bit | paged-adamw | sgd | sgd-momentum | adafactor.
    #[cfg_attr(feature = "clap", arg(long))]
    pub optimizer: Option<String>,
    /// Attention: eager | sdpa | flash.
    #[cfg_attr(feature = "clap", arg(long))]
    pub attn: Option<String>,
    /// single | ddp | zero1 | zero2 | zero3 | fsdp | tp=N | tp=N,pp=M (pipeline stages, vLLM).
    #[cfg_attr(feature = "clap", arg(long))]
    pub parallel: Option<String>,
    /// ZeRO / FSDP: optimizer states in CPU memory.
    #[cfg_attr(feature = "clap", arg(long))]
    pub offload_optimizer: bool,
    /// ZeRO-3 / FSDP: parameters in CPU memory.
    #[cfg_attr(feature = "clap", arg(long))]
    pub offload_params: bool,
    /// transformers | vllm | sglang | llama.cpp.
    #[cfg_attr(feature = "clap", arg(long))]
    pub engine: Option<String>,
    /// vLLM: fraction of GPU memory it may take (default 0.9).
    #[cfg_attr(feature = "clap", arg(long))]
    pub gpu_memory_utilization: Option<f64>,
    /// vLLM: tokens per forward pass (default 8192).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_num_batched_tokens: Option<u64>,
    /// llama.cpp: context tokens (default: --seq).
    #[cfg_attr(feature = "clap", arg(long))]
    pub n_ctx: Option<u64>,
    /// llama.cpp: physical batch (default 512).
    #[cfg_attr(feature = "clap", arg(long))]
    pub n_ubatch: Option<u64>,
    /// SGLang: fraction of the memory free before loading for weights and the token pool
    /// (default: SGLang's by GPU size).
    #[cfg_attr(feature = "clap", arg(long))]
    pub mem_fraction_static: Option<f64>,
    /// SGLang: an upper bound on the token pool (`--max-total-tokens`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_total_tokens: Option<u64>,
    /// SGLang: data-parallel replicas of the tensor-parallel group (default 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub dp_size: Option<u32>,
    /// SGLang: expert-parallel size, 1 or the tensor-parallel size (default 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub ep_size: Option<u32>,
    /// vLLM: capture no CUDA graphs.
    #[cfg_attr(feature = "clap", arg(long))]
    pub enforce_eager: bool,
    /// vLLM: serve LoRA adapters (one slot unless --max-loras).
    #[cfg_attr(feature = "clap", arg(long))]
    pub enable_lora: bool,
    /// vLLM: LoRA adapter slots preallocated (implies --enable-lora; vLLM's default 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_loras: Option<u64>,
    /// vLLM: rank of each LoRA slot (default 16).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_lora_rank: Option<u64>,
    /// vLLM: the KV cache's size in bytes (`8G`, `20Gi`…), instead of --gpu-memory-utilization's.
    #[cfg_attr(feature = "clap", arg(long, value_name = "BYTES"))]
    pub kv_cache_memory_bytes: Option<String>,
    /// vLLM: the context length, or `auto` for the longest one request the KV cache holds
    /// (a number is --seq).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N|auto"))]
    pub max_model_len: Option<String>,
    /// vLLM: speculative decoding as vLLM's JSON (`{"method": "eagle", "num_speculative_tokens":
    /// 3}`; methods draft_model with "model", eagle, eagle3, mtp, ngram).
    #[cfg_attr(feature = "clap", arg(long, value_name = "JSON"))]
    pub speculative_config: Option<String>,
    /// vLLM: replicas of the tensor × pipeline group (`--data-parallel-size`, default 1).
    #[cfg_attr(feature = "clap", arg(long, value_name = "D"))]
    pub data_parallel_size: Option<u32>,
    /// vLLM: spread the routed experts whole over the tp × dp ranks (`--enable-expert-parallel`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub enable_expert_parallel: bool,
    /// KV-cache dtype (default: the compute dtype): fp16 | bf16 | fp8 …
    #[cfg_attr(feature = "clap", arg(long))]
    pub kv_dtype: Option<String>,
    /// Training framework: transformers | torchtune | unsloth | litgpt | fsdp-qlora.
    #[cfg_attr(feature = "clap", arg(long))]
    pub trainer: Option<String>,
    /// The trainer's release, where its allocations differ (torchtune: 0.1 quantizes at load
    /// without chunks; default the latest).
    #[cfg_attr(feature = "clap", arg(long, value_name = "X.Y"))]
    pub trainer_version: Option<String>,
    /// AutoAWQ's fused modules, their cache MAX_SEQ_LEN tokens of each sequence
    /// (`from_quantized(fuse_layers=True, max_new_tokens=MAX_SEQ_LEN, batch_size=--batch)`);
    /// inference of AWQ checkpoints only.
    #[cfg_attr(feature = "clap", arg(long, value_name = "MAX_SEQ_LEN"))]
    pub awq_fused: Option<u64>,
    /// Cross-entropy chunk by chunk.
    #[cfg_attr(feature = "clap", arg(long))]
    pub chunked_ce: bool,
    /// Step the optimizer per parameter during backward, freeing each gradient.
    #[cfg_attr(feature = "clap", arg(long))]
    pub optimizer_in_backward: bool,
    /// Move saved activations to CPU memory between forward and backward.
    #[cfg_attr(feature = "clap", arg(long))]
    pub activation_offload: bool,
    /// torch.compile (fused pointwise chains).
    #[cfg_attr(feature = "clap", arg(long))]
    pub compile: bool,
    /// Keep gradients allocated between steps (zero_grad(set_to_none=False)).
    #[cfg_attr(feature = "clap", arg(long))]
    pub keep_gradients: bool,
}

/// PEFT's `LoraConfig` default `lora_alpha` (alpha scales the update; it costs no memory).
const DEFAULT_LORA_ALPHA: u64 = 8;
/// GPTQ/AWQ group size when none is given (AutoGPTQ's and AutoAWQ's default).
const DEFAULT_GROUP_SIZE: u32 = 128;
/// fp8 weight scale tiles: 128×128, as DeepSeek-V3's `weight_block_size`.
const DEFAULT_FP8_BLOCK: u32 = 128;

/// llama.cpp's quantization types as `llama-quantize` names them; those the simulator models
/// (`engines::gguf::FileType`) are accepted, see [`gguf_type_names`].
const GGUF_CANDIDATES: &[&str] = &[
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_1",
    "Q5_0",
    "Q4_K_M",
    "Q4_K_S",
    "Q4_1",
    "Q4_0",
    "Q3_K_L",
    "Q3_K_M",
    "Q3_K_S",
    "Q2_K",
    "Q2_K_S",
    "IQ4_NL",
    "IQ4_XS",
    "IQ3_M",
    "IQ3_S",
    "IQ3_XS",
    "IQ3_XXS",
    "IQ2_M",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
    "TQ2_0",
    "TQ1_0",
    "MXFP4_MOE",
];

/// The GGUF types the simulator models, as `llama-quantize` names them.
pub(crate) fn gguf_type_names() -> Vec<&'static str> {
    GGUF_CANDIDATES.iter().copied().filter(|name| FileType::parse(name).is_ok()).collect()
}

impl WorkloadFlags {
    /// `--images N` and `--image-size WxH` over the workload's images: both are needed unless
    /// the workload file gave the other (`--images 0` drops them).
    fn apply_images(&self, w: &mut Workload) -> Result<(), InputError> {
        let size = self.image_size.as_deref().map(parse_image_size).transpose()?;
        match (self.images, size, w.images) {
            (None, None, _) => {}
            (Some(0), _, _) => w.images = None,
            (Some(per_sample), Some((width, height)), _) => {
                w.images = Some(Images { per_sample, width, height })
            }
            (Some(per_sample), None, Some(given)) => w.images = Some(Images { per_sample, ..given }),
            (None, Some((width, height)), Some(given)) => w.images = Some(Images { width, height, ..given }),
            (Some(_), None, None) => {
                return Err(InputError::new(
                    "--images",
                    "images of no size: the processor's resize needs it",
                )
                .with_fix("add --image-size WIDTHxHEIGHT (`--image-size 1024x1024`)"));
            }
            (None, Some(_), None) => {
                return Err(InputError::new("--image-size", "an image size without images")
                    .with_fix("add --images N (images per sample)"));
            }
        }
        Ok(())
    }

    /// `workload` with these flags applied over it.
    pub fn apply(&self, workload: Workload) -> Result<Workload, InputError> {
        let mut w = workload;
        if let Some(text) = &self.mode {
            w.mode = pick("--mode", text, MODES)?;
        }
        if let Some(batch) = self.batch {
            w.batch = batch;
        }
        if let Some(seq) = self.seq {
            w.seq = seq;
        }
        if let Some(prompt) = self.prompt {
            w.prompt = Some(prompt);
        }
        self.apply_images(&mut w)?;
        if let Some(grad_accum) = self.grad_accum {
            w.grad_accum = grad_accum;
        }
        if let Some(text) = &self.dtype {
            w.weight_dtype = Some(DType::parse_input("--dtype", text)?);
        }
        if let Some(text) = &self.autocast {
            w.autocast = parse_autocast(text)?;
        }
        self.apply_quant(&mut w)?;
        self.apply_lora(&mut w)?;
        if let Some(text) = &self.grad_ckpt {
            w.grad_checkpointing = pick("--grad-ckpt", text, GRAD_CKPT)?;
        }
        if let Some(text) = &self.optimizer {
            w.optimizer = pick("--optimizer", text, OPTIMIZERS)?;
        }
        if let Some(text) = &self.attn {
            w.attention = pick("--attn", text, ATTENTION)?;
        }
        self.apply_parallel(&mut w)?;
        self.apply_engine(&mut w)?;
        self.apply_vllm_options(&mut w)?;
        if let Some(text) = &self.kv_dtype {
            w.kv_dtype = Some(DType::parse_input("--kv-dtype", text)?);
        }
        if let Some(text) = &self.trainer {
            w.trainer = pick("--trainer", text, TRAINERS)?;
        }
        if let Some(text) = &self.trainer_version {
            w.trainer_version = Some(text.clone());
        }
        if let Some(max_seq_len) = self.awq_fused {
            w.awq_fused = Some(max_seq_len);
        }
        let s = &mut w.switches;
        s.chunked_cross_entropy |= self.chunked_ce;
        s.optimizer_in_backward |= self.optimizer_in_backward;
        s.activation_offload |= self.activation_offload;
        s.compile |= self.compile;
        s.keep_gradients |= self.keep_gradients;
        self.refuse_inapplicable(&w)?;
        Ok(w)
    }

    /// Flags given that the workload as built does not read: training flags in inference, the
    /// transformers trainer's under a serving engine. Each would be ignored silently, and the
    /// answer read as if it had applied.
    fn refuse_inapplicable(&self, w: &Workload) -> Result<(), InputError> {
        let training = [
            ("--grad-ckpt", self.grad_ckpt.is_some()),
            ("--grad-accum", self.grad_accum.is_some_and(|n| n > 1)),
            ("--optimizer", self.optimizer.is_some()),
            ("--trainer", self.trainer.is_some()),
            ("--trainer-version", self.trainer_version.is_some()),
            ("--offload-optimizer", self.offload_optimizer),
            ("--optimizer-in-backward", self.optimizer_in_backward),
            ("--activation-offload", self.activation_offload),
            ("--keep-gradients", self.keep_gradients),
        ];
        if w.mode == Mode::Inference
            && let Some((flag, _)) = training.iter().find(|(_, given)| *given)
        {
            return Err(InputError::new(
                *flag,
                format!("{flag} applies to training, and the workload runs inference"),
            )
            .with_fix(format!("add `--mode train`, or leave out {flag}")));
        }
        let engine = match w.engine {
            Engine::Transformers => None,
            Engine::Vllm { .. } => Some("vllm"),
            Engine::Sglang { .. } => Some("sglang"),
            Engine::LlamaCpp { .. } => Some("llama.cpp"),
        };
        let transformers_only = [("--attn", self.attn.is_some()), ("--autocast", self.autocast.is_some())];
        if let (Some(engine), Some((flag, _))) = (engine, transformers_only.iter().find(|(_, given)| *given))
        {
            return Err(InputError::new(
                *flag,
                format!(
                    "{flag} sets how transformers runs the model, and --engine {engine} runs it its own way"
                ),
            )
            .with_fix(format!("leave out {flag} under --engine {engine}")));
        }
        Ok(())
    }

    fn apply_quant(&self, w: &mut Workload) -> Result<(), InputError> {
        if let Some(text) = &self.quant {
            w.quant = parse_quant(text, &w.quant)?;
        }
        if self.double_quant {
            match &mut w.quant {
                Quant::Nf4 { double_quant } | Quant::Fp4 { double_quant } => *double_quant = true,
                _ => {
                    return Err(InputError::new(
                        "--double-quant",
                        "double quantization is a bitsandbytes 4-bit option",
                    )
                    .with_fix("use it with `--quant nf4` or `--quant fp4`, or leave it out"));
                }
            }
        }
        if let Some(size) = self.group_size {
            match &mut w.quant {
                Quant::Gptq { group_size, .. } | Quant::Awq { group_size, .. } => *group_size = size,
                Quant::Fp8 { block } => *block = size,
                _ => {
                    return Err(InputError::new(
                        "--group-size",
                        "a group size applies to GPTQ and AWQ weights (and the fp8 scale block)",
                    )
                    .with_fix(
                        "use it with `--quant gptq`, `--quant awq` or `--quant fp8`, or leave it out",
                    ));
                }
            }
        }
        Ok(())
    }

    fn apply_lora(&self, w: &mut Workload) -> Result<(), InputError> {
        let targets = match &self.lora_targets {
            Some(text) => Some(parse_targets(text)?),
            None => None,
        };
        match (&mut w.finetune, self.lora_rank) {
            (finetune, Some(rank)) => {
                let (old_alpha, old_targets) = match finetune {
                    Finetune::Lora { alpha, targets, .. } => (Some(*alpha), Some(std::mem::take(targets))),
                    Finetune::Full => (None, None),
                };
                *finetune = Finetune::Lora {
                    rank,
                    alpha: self.lora_alpha.or(old_alpha).unwrap_or(DEFAULT_LORA_ALPHA),
                    targets: targets.or(old_targets).unwrap_or_default(),
                };
            }
            (Finetune::Lora { alpha, targets: old, .. }, None) => {
                if let Some(a) = self.lora_alpha {
                    *alpha = a;
                }
                if let Some(t) = targets {
                    *old = t;
                }
            }
            (Finetune::Full, None) => {
                let flag = if self.lora_alpha.is_some() {
                    Some("--lora-alpha")
                } else if targets.is_some() {
                    Some("--lora-targets")
                } else {
                    None
                };
                if let Some(flag) = flag {
                    return Err(InputError::new(flag, "LoRA settings without LoRA: no rank is given")
                        .with_fix(
                            "add `--lora-rank 16` (or `finetune: {kind: lora, ...}` in the workload file)",
                        ));
                }
            }
        }
        Ok(())
    }

    fn apply_parallel(&self, w: &mut Workload) -> Result<(), InputError> {
        if let Some(text) = &self.parallel {
            w.parallelism = parse_parallel(text)?;
        }
        if !self.offload_optimizer && !self.offload_params {
            return Ok(());
        }
        let Parallelism::Zero { stage, offload_optimizer, offload_params } = &mut w.parallelism else {
            let flag = if self.offload_optimizer { "--offload-optimizer" } else { "--offload-params" };
            return Err(InputError::new(flag, "CPU offload is a ZeRO / FSDP option")
                .with_fix("add `--parallel zero2`, `zero3` or `fsdp`"));
        };
        if self.offload_params && *stage < 3 {
            return Err(InputError::new(
                "--offload-params",
                format!("parameters are offloaded only when they are sharded (ZeRO-3 / FSDP), not with ZeRO-{stage}"),
            )
            .with_fix("use `--parallel zero3` or `fsdp`, or `--offload-optimizer` alone"));
        }
        *offload_optimizer |= self.offload_optimizer;
        *offload_params |= self.offload_params;
        Ok(())
    }

    fn apply_engine(&self, w: &mut Workload) -> Result<(), InputError> {
        if let Some(text) = &self.engine {
            let wanted = pick("--engine", text, ENGINES)?;
            w.engine = match (wanted, &w.engine) {
                // The same engine as the file's keeps the file's settings.
                (EngineKind::Vllm, Engine::Vllm { .. })
                | (EngineKind::LlamaCpp, Engine::LlamaCpp { .. })
                | (EngineKind::Sglang, Engine::Sglang { .. }) => w.engine.clone(),
                (EngineKind::Transformers, _) => Engine::Transformers,
                (EngineKind::Vllm, _) => Engine::VLLM_DEFAULT,
                (EngineKind::Sglang, _) => Engine::SGLANG_DEFAULT,
                (EngineKind::LlamaCpp, _) => Engine::llamacpp(w.seq),
            };
        }
        if !matches!(w.engine, Engine::Sglang { .. }) {
            engine_flag_unused(
                &[
                    ("--mem-fraction-static", self.mem_fraction_static.is_some()),
                    ("--max-total-tokens", self.max_total_tokens.is_some()),
                    ("--dp-size", self.dp_size.is_some()),
                    ("--ep-size", self.ep_size.is_some()),
                ],
                "sglang",
            )?;
        }
        match &mut w.engine {
            Engine::Sglang { mem_fraction_static, max_total_tokens, dp_size, ep_size } => {
                if self.mem_fraction_static.is_some() {
                    *mem_fraction_static = self.mem_fraction_static;
                }
                if self.max_total_tokens.is_some() {
                    *max_total_tokens = self.max_total_tokens;
                }
                if self.dp_size.is_some() {
                    *dp_size = self.dp_size;
                }
                if self.ep_size.is_some() {
                    *ep_size = self.ep_size;
                }
                engine_flag_unused(
                    &[
                        ("--gpu-memory-utilization", self.gpu_memory_utilization.is_some()),
                        ("--max-num-batched-tokens", self.max_num_batched_tokens.is_some()),
                    ],
                    "vllm",
                )?;
                engine_flag_unused(
                    &[("--n-ctx", self.n_ctx.is_some()), ("--n-ubatch", self.n_ubatch.is_some())],
                    "llama.cpp",
                )
            }
            Engine::Vllm { gpu_memory_utilization, max_num_batched_tokens } => {
                if let Some(u) = self.gpu_memory_utilization {
                    *gpu_memory_utilization = u;
                }
                if let Some(t) = self.max_num_batched_tokens {
                    *max_num_batched_tokens = t;
                }
                engine_flag_unused(
                    &[("--n-ctx", self.n_ctx.is_some()), ("--n-ubatch", self.n_ubatch.is_some())],
                    "llama.cpp",
                )
            }
            Engine::LlamaCpp { n_ctx, n_ubatch } => {
                if let Some(c) = self.n_ctx {
                    *n_ctx = c;
                }
                if let Some(u) = self.n_ubatch {
                    *n_ubatch = u;
                }
                engine_flag_unused(
                    &[
                        ("--gpu-memory-utilization", self.gpu_memory_utilization.is_some()),
                        ("--max-num-batched-tokens", self.max_num_batched_tokens.is_some()),
                    ],
                    "vllm",
                )
            }
            Engine::Transformers => {
                engine_flag_unused(
                    &[
                        ("--gpu-memory-utilization", self.gpu_memory_utilization.is_some()),
                        ("--max-num-batched-tokens", self.max_num_batched_tokens.is_some()),
                    ],
                    "vllm",
                )?;
                engine_flag_unused(
                    &[("--n-ctx", self.n_ctx.is_some()), ("--n-ubatch", self.n_ubatch.is_some())],
                    "llama.cpp",
                )
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum EngineKind {
    Transformers,
    Vllm,
    Sglang,
    LlamaCpp,
}

/// A flag's words: the canonical one first in each entry, then accepted aliases.
type Words<T> = &'static [(&'static [&'static str], T)];

const MODES: Words<Mode> =
    &[(&["train", "training"], Mode::Train), (&["inference", "infer"], Mode::Inference)];
const GRAD_CKPT: Words<GradCheckpointing> = &[
    (&["off", "none", "false", "no"], GradCheckpointing::Off),
    (&["full", "on", "true", "yes"], GradCheckpointing::Full),
    (&["selective"], GradCheckpointing::Selective),
];
const OPTIMIZERS: Words<Optimizer> = &[
    (&["adamw", "adam", "adamw-torch", "adamw-torch-fused"], Optimizer::Adamw),
    (&["adamw8bit", "adamw-8bit", "adamw-bnb-8bit", "adam8bit", "bnb-adamw8bit"], Optimizer::Adamw8bit),
    (&["paged-adamw8bit", "paged-adamw-8bit"], Optimizer::PagedAdamw8bit),
    (&["paged-adamw", "paged-adamw-32bit", "paged-adamw32bit"], Optimizer::PagedAdamw),
    (&["sgd"], Optimizer::Sgd),
    (&["sgd-momentum"], Optimizer::SgdMomentum),
    (&["adafactor"], Optimizer::Adafactor),
];
const ATTENTION: Words<AttentionImpl> = &[
    (&["eager"], AttentionImpl::Eager),
    (&["sdpa"], AttentionImpl::Sdpa),
    (&["flash", "flash-attention-2", "flash-attn", "fa2"], AttentionImpl::Flash),
];
const ENGINES: Words<EngineKind> = &[
    (&["transformers", "hf"], EngineKind::Transformers),
    (&["vllm"], EngineKind::Vllm),
    (&["sglang"], EngineKind::Sglang),
    (&["llama.cpp", "llamacpp", "llama-cpp"], EngineKind::LlamaCpp),
];
const TRAINERS: Words<Trainer> = &[
    (&["transformers", "hf", "trl"], Trainer::Transformers),
    (&["torchtune"], Trainer::Torchtune),
    (&["unsloth"], Trainer::Unsloth),
    (&["litgpt"], Trainer::Litgpt),
    (&["fsdp-qlora"], Trainer::FsdpQlora),
];

/// `--trainer`'s canonical word for `trainer`, as messages name it.
pub fn trainer_word(trainer: Trainer) -> &'static str {
    TRAINERS.iter().find(|(_, t)| *t == trainer).and_then(|(names, _)| names.first().copied()).unwrap_or("?")
}

/// The value whose words include `text` (case-insensitive, `_` read as `-`), else an error
/// listing the canonical words and the closest.
fn pick<T: Copy>(flag: &str, text: &str, words: Words<T>) -> Result<T, InputError> {
    let wanted = text.trim().to_ascii_lowercase().replace('_', "-");
    if let Some((_, value)) = words.iter().find(|(names, _)| names.contains(&wanted.as_str())) {
        return Ok(*value);
    }
    let canonical: Vec<&str> = words.iter().filter_map(|(names, _)| names.first().copied()).collect();
    Err(unknown_value(flag, text, &canonical, words.iter().flat_map(|(names, _)| names.iter().copied())))
}

fn unknown_value<'a>(
    flag: &str,
    text: &str,
    accepted: &[&str],
    spellings: impl IntoIterator<Item = &'a str>,
) -> InputError {
    let close = closest(&text.trim().to_ascii_lowercase(), spellings, 2);
    let hint = if close.is_empty() { String::new() } else { format!("did you mean {}? ", ticked_or(&close)) };
    InputError::new(flag, format!("unknown value `{text}`"))
        .with_fix(format!("{hint}accepted: {}", ticked(accepted)))
}

/// `fp16` or `bf16` (any spelling [`DType::parse`] reads), or `none` / `off`.
fn parse_autocast(text: &str) -> Result<Option<DType>, InputError> {
    if matches!(text.trim().to_ascii_lowercase().as_str(), "none" | "off") {
        return Ok(None);
    }
    match DType::parse(text) {
        Some(dtype @ (DType::F16 | DType::BF16)) => Ok(Some(dtype)),
        _ => {
            let accepted = ["fp16", "bf16", "none"];
            Err(unknown_value("--autocast", text, &accepted, accepted.into_iter().chain(["off"])))
        }
    }
}

/// `none`, `int8`, `nf4`, `fp4`, `gptq` (4-bit; `gptq-8bit` …), `awq`, `fp8`, or a GGUF type
/// (`Q4_K_M`). Settings of the same kind in `current` (the file's) are kept.
pub fn parse_quant(text: &str, current: &Quant) -> Result<Quant, InputError> {
    let lower = text.trim().to_ascii_lowercase().replace('_', "-");
    let keep_double = match current {
        Quant::Nf4 { double_quant } | Quant::Fp4 { double_quant } => *double_quant,
        _ => false,
    };
    let group_of = |want_gptq: bool| match current {
        Quant::Gptq { group_size, .. } if want_gptq => *group_size,
        Quant::Awq { group_size, .. } if !want_gptq => *group_size,
        _ => DEFAULT_GROUP_SIZE,
    };
    let quant = match lower.as_str() {
        "none" | "off" => Quant::None,
        "int8" | "8bit" | "llm.int8" | "bnb-int8" => Quant::Int8,
        "nf4" | "4bit" | "bnb-nf4" => Quant::Nf4 { double_quant: keep_double },
        "fp4" | "bnb-fp4" => Quant::Fp4 { double_quant: keep_double },
        "awq" | "awq-4bit" => Quant::Awq { bits: 4, group_size: group_of(false) },
        "fp8" => {
            Quant::Fp8 { block: if let Quant::Fp8 { block } = current { *block } else { DEFAULT_FP8_BLOCK } }
        }
        _ => {
            if let Some(bits) = gptq_bits(&lower) {
                return Ok(Quant::Gptq { bits, group_size: group_of(true) });
            }
            if let Ok(file_type) = FileType::parse(text) {
                return Ok(Quant::Gguf { quant_type: file_type.name().to_string() });
            }
            let upper = text.trim().to_ascii_uppercase().replace('-', "_");
            let gguf = gguf_type_names();
            let mut accepted = vec!["none", "int8", "nf4", "fp4", "gptq", "gptq-8bit", "awq", "fp8"];
            let spellings: Vec<&str> = accepted.iter().copied().chain(gguf.iter().copied()).collect();
            let close = closest(&upper, gguf.iter().copied(), 2);
            let close = if close.is_empty() { closest(&lower, spellings, 2) } else { close };
            accepted.push("a GGUF type (`Q4_K_M`, `Q8_0`, …)");
            let hint = if close.is_empty() {
                String::new()
            } else {
                format!("did you mean {}? ", ticked_or(&close))
            };
            let weight_dtype = DType::parse(text).is_some_and(DType::is_float);
            let dtype_hint = if weight_dtype { " (a plain weight dtype is `--dtype`)" } else { "" };
            return Err(InputError::new("--quant", format!("unknown quantization `{text}`{dtype_hint}"))
                .with_fix(format!(
                    "{hint}accepted: {}; GGUF types: {}",
                    accepted.join(", "),
                    gguf.join(", ")
                )));
        }
    };
    Ok(quant)
}

/// `gptq` (4 bits) or `gptq-Nbit` / `gptqN` for N in 2, 3, 4, 8.
fn gptq_bits(lower: &str) -> Option<u32> {
    let rest = lower.strip_prefix("gptq")?;
    if rest.is_empty() {
        return Some(4);
    }
    let digits = rest.trim_start_matches('-');
    let digits = digits.strip_suffix("bit").unwrap_or(digits);
    digits.parse().ok().filter(|b| matches!(b, 2 | 3 | 4 | 8))
}

/// `single`, `ddp`, `zero1`–`zero3`, `fsdp` (= ZeRO-3), `tp=N`, `tp=N,pp=M`, `pp=M`.
fn parse_parallel(text: &str) -> Result<Parallelism, InputError> {
    let lower = text.trim().to_ascii_lowercase().replace('_', "-");
    let zero = |stage| Parallelism::Zero { stage, offload_optimizer: false, offload_params: false };
    let parallel = match lower.as_str() {
        "single" | "none" => Parallelism::Single,
        "ddp" => Parallelism::Ddp,
        "zero1" | "zero-1" => zero(1),
        "zero2" | "zero-2" => zero(2),
        "zero3" | "zero-3" | "fsdp" => zero(3),
        _ => match parse_tensor_pipeline(&lower) {
            Some(parallel) => parallel,
            None => {
                let accepted = ["single", "ddp", "zero1", "zero2", "zero3", "fsdp", "tp=N", "tp=N,pp=M"];
                return Err(unknown_value("--parallel", text, &accepted, accepted));
            }
        },
    };
    Ok(parallel)
}

/// `tp=N`, `pp=M` or both, comma-separated, each at most once: tensor parallelism over N GPUs
/// (1 when left out) in M pipeline stages (1 when left out).
fn parse_tensor_pipeline(text: &str) -> Option<Parallelism> {
    let (mut size, mut pipeline) = (None, None);
    for part in text.split(',') {
        let part = part.trim();
        let (slot, rest) = if let Some(rest) = part.strip_prefix("tp") {
            (&mut size, rest)
        } else {
            (&mut pipeline, part.strip_prefix("pp")?)
        };
        let value = rest.strip_prefix(['=', ':'])?.trim().parse::<u32>().ok()?;
        if slot.replace(value).is_some() {
            return None;
        }
    }
    (size.is_some() || pipeline.is_some())
        .then(|| Parallelism::Tensor { size: size.unwrap_or(1), pipeline: pipeline.unwrap_or(1) })
}

/// `q_proj,v_proj` or `all-linear`.
fn parse_targets(text: &str) -> Result<Vec<String>, InputError> {
    let targets: Vec<String> =
        text.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect();
    if targets.is_empty() {
        return Err(InputError::new("--lora-targets", "no module names given")
            .with_fix("list module names separated by commas (`q_proj,v_proj`), or `all-linear`"));
    }
    Ok(targets)
}

/// `WIDTHxHEIGHT` (`1024x768`; `X` and `×` too), both positive.
fn parse_image_size(text: &str) -> Result<(u64, u64), InputError> {
    let lower = text.trim().to_ascii_lowercase();
    let parsed = lower
        .split_once('x')
        .or_else(|| lower.split_once('×'))
        .and_then(|(w, h)| Some((w.trim().parse::<u64>().ok()?, h.trim().parse::<u64>().ok()?)))
        .filter(|&(w, h)| {
            let side = vramplan_profiles::model::vision::MAX_SIDE;
            w > 0 && h > 0 && w <= side && h <= side
        });
    parsed.ok_or_else(|| {
        InputError::new("--image-size", format!("`{text}` is not WIDTHxHEIGHT in pixels"))
            .with_fix("give two positive sizes up to 1048576, such as `--image-size 1024x768`")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_case_and_separator_insensitive() {
        assert_eq!(pick("--optimizer", "Paged_AdamW8bit", OPTIMIZERS).ok(), Some(Optimizer::PagedAdamw8bit));
        let err = pick("--optimizer", "adamv", OPTIMIZERS).unwrap_err();
        assert!(
            err.fix.as_deref().is_some_and(|f| f.contains("`adamw`") && f.contains("`adafactor`")),
            "{err}"
        );
    }

    #[test]
    fn quant_spellings() {
        assert_eq!(
            parse_quant("q4_k_m", &Quant::None).ok(),
            Some(Quant::Gguf { quant_type: "Q4_K_M".into() })
        );
        assert_eq!(
            parse_quant("gptq-8bit", &Quant::None).ok(),
            Some(Quant::Gptq { bits: 8, group_size: 128 })
        );
        assert_eq!(
            parse_quant("gptq", &Quant::Gptq { bits: 4, group_size: 32 }).ok(),
            Some(Quant::Gptq { bits: 4, group_size: 32 })
        );
        assert!(parse_quant("gptq-5bit", &Quant::None).is_err());
        assert!(parse_quant("float16", &Quant::None).unwrap_err().problem.contains("--dtype"));
        assert_eq!(parse_parallel("tp=4").ok(), Some(Parallelism::tensor(4)));
        assert_eq!(parse_parallel("tp=8,pp=2").ok(), Some(Parallelism::Tensor { size: 8, pipeline: 2 }));
        assert_eq!(parse_parallel("pp=4").ok(), Some(Parallelism::Tensor { size: 1, pipeline: 4 }));
        assert!(parse_parallel("tp=2,tp=4").is_err());
        assert!(parse_parallel("tp=2,pq=4").is_err());
        assert!(parse_parallel("tp=x").is_err());
    }
}
