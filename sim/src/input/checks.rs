//! Checking a workload against the model and the hardware before simulating it: values that
//! cannot run are errors (exit 2, with the key and the fix); choices that run but not as the
//! user likely expects are warnings.

use super::lora::lora_target_modules;
use crate::engines::gguf::FileType;
use crate::workload::{Engine, Finetune, Mode, Parallelism, Quant, Trainer, Workload};
use vramplan_profiles::hardware::{Device, HardwareProfile};
use vramplan_profiles::model::{ModelDescription, NormKind, StackKind, TensorKind};
use vramplan_profiles::{DType, InputError};

/// Where workload errors come from: the merged file and flags.
const ORIGIN: &str = "workload";

/// Checks `workload` for `model` on `hardware`. Errors for what cannot run (a zero batch, a LoRA
/// target that matches nothing, a quantized full fine-tune, a tensor-parallel size the profile or
/// the heads do not allow); warnings for what runs unlike the user likely expects (bf16 or fp8
/// on a GPU without it, a sequence past the model's positions).
pub fn validate(
    workload: &Workload,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<Vec<String>, InputError> {
    validate_shape(workload, model)?;
    validate_configuration(workload, model, hardware)?;
    Ok(warnings(workload, model, hardware))
}

/// The checks of [`validate`] that read the batch, sequence and prompt lengths: what a sweep
/// over shapes checks at every point, having checked the rest once.
pub fn validate_shape(workload: &Workload, model: &ModelDescription) -> Result<(), InputError> {
    check_sizes(workload)?;
    // The fused cache's own bounds first: the step's scale counts the cache.
    crate::model::awq_fused::check_shape(workload, MAX_SEQ, MAX_TOKENS)?;
    check_scale(workload, model)?;
    check_positions(workload, model)
}

/// The context a workload asks the model for: the sequence, or llama.cpp's context.
fn context(w: &Workload, model: &ModelDescription) -> u64 {
    match w.engine {
        Engine::LlamaCpp { n_ctx, .. } if n_ctx > 0 => n_ctx,
        _ => w.seq.saturating_add(w.image_tokens(model)),
    }
}

/// A model with a learned table of positions indexes no position past it
/// ([`ModelDescription::learned_positions`]): a longer sequence is refused.
fn check_positions(w: &Workload, model: &ModelDescription) -> Result<(), InputError> {
    // A learned table is the model's positions long: within them there is nothing to look for
    // (every point of a sweep passes here, and the search walks the module tree).
    let context = context(w, model);
    if context <= model.facts.max_positions || model.facts.max_positions == 0 {
        return Ok(());
    }
    let Some((table, limit)) = model.learned_positions() else { return Ok(()) };
    if context > limit {
        let key =
            if matches!(w.engine, Engine::LlamaCpp { n_ctx, .. } if n_ctx > 0) { "n_ctx" } else { "seq" };
        return Err(InputError::new(
            ORIGIN,
            format!(
                "a context of {context} tokens is past {}'s learned table of {limit} positions (`{table}`): the \
                 runtime raises `IndexError: index out of range in self` at its embedding",
                model.name
            ),
        )
        .at_key(key)
        .with_fix(format!("give a sequence of at most {limit} tokens (`--seq {limit}`)")));
    }
    Ok(())
}

/// The checks of [`validate`] that hold whatever the shape ([`validate_shape`] has the others).
pub fn validate_configuration(
    workload: &Workload,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<(), InputError> {
    // A GGUF or state-space model's refusals first: they say why the other checks do not apply.
    check_gguf_engine(workload, model)?;
    check_quant(workload)?;
    check_mode(workload)?;
    check_engine(workload)?;
    check_images(workload, model)?;
    check_parallelism(workload, model, hardware)?;
    crate::model::torchtune::check_version(workload)?;
    super::trainers::check_trainer(workload)?;
    crate::model::awq_fused::check_configuration(workload, model)?;
    if let Finetune::Lora { rank: 0, .. } = workload.finetune {
        return Err(InputError::new(ORIGIN, "LoRA rank 0 adds no adapter")
            .at_key("finetune.rank")
            .with_fix("give a rank of 1 or more (`--lora-rank 16`), or drop LoRA for a full fine-tune"));
    }
    lora_target_modules(workload, model)?;
    if let Some(dtype) = workload.autocast
        && !matches!(dtype, DType::F16 | DType::BF16)
    {
        return Err(InputError::new(
            ORIGIN,
            format!("autocast to {dtype}: autocast computes in fp16 or bf16"),
        )
        .at_key("autocast")
        .with_fix("use `fp16` or `bf16`, or leave autocast out to compute in the weight dtype"));
    }
    if let Some(dtype) = workload.kv_dtype
        && !dtype.is_float()
    {
        return Err(InputError::new(
            ORIGIN,
            format!("a KV cache in {dtype}: vramplan models float KV caches"),
        )
        .at_key("kv_dtype")
        .with_fix("use fp16, bf16, fp32 or fp8 (e4m3 / e5m2)"));
    }
    Ok(())
}

fn positive(value: u64, key: &str, fix: &str) -> Result<(), InputError> {
    if value == 0 {
        return Err(InputError::new(ORIGIN, format!("`{key}` is 0; it must be at least 1"))
            .at_key(key)
            .with_fix(fix.to_string()));
    }
    Ok(())
}

/// The bounds on the workload's sizes (docs/limits.md gives the largest real value of each).
/// Batch: 2²⁰ sequences (vLLM's largest `max_num_seqs` in use is 1,024; training micro-batches
/// are below 1,024). Sequence: 2²⁴ = 16,777,216 tokens (Llama-4 Scout's context is 10,485,760).
/// Tokens of one step, batch × seq: 2³², so that a step's logits (tokens × vocabulary ≤ 2²⁴ ×
/// 4 bytes) stay below 2⁵⁸ bytes. Gradient accumulation: 2²⁰ steps. LoRA rank and alpha: 2¹⁶
/// (the full rank of the widest layer). Group sizes and fp8 blocks: 2¹⁶.
pub const MAX_BATCH: u64 = 1 << 20;
pub const MAX_SEQ: u64 = 1 << 24;
pub const MAX_TOKENS: u64 = 1 << 32;
pub const MAX_GRAD_ACCUM: u64 = 1 << 20;
pub const MAX_LORA: u64 = 1 << 16;
pub const MAX_GROUP: u32 = 1 << 16;

fn at_most(value: u64, max: u64, key: &str, flag: &str) -> Result<(), InputError> {
    if value > max {
        return Err(InputError::new(
            ORIGIN,
            format!("`{key}` is {value}, past the bound of {max} (docs/limits.md)"),
        )
        .at_key(key)
        .with_fix(format!("give `{flag}` (or `{key}:` in the workload file) at most {max}")));
    }
    Ok(())
}

fn check_bounds(w: &Workload) -> Result<(), InputError> {
    at_most(w.batch, MAX_BATCH, "batch", "--batch")?;
    at_most(w.seq, MAX_SEQ, "seq", "--seq")?;
    at_most(w.grad_accum, MAX_GRAD_ACCUM, "grad_accum", "--grad-accum")?;
    if let Some(prompt) = w.prompt {
        at_most(prompt, MAX_SEQ, "prompt", "--prompt")?;
    }
    let tokens = w.batch.saturating_mul(w.seq);
    if tokens > MAX_TOKENS {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "batch × seq is {tokens} tokens in one step, past the bound of {MAX_TOKENS} (docs/limits.md)"
            ),
        )
        .at_key("batch")
        .with_fix("lower `--batch` or `--seq` so that their product is at most 2³² tokens"));
    }
    if let Finetune::Lora { rank, alpha, .. } = w.finetune {
        at_most(rank, MAX_LORA, "finetune.rank", "--lora-rank")?;
        at_most(alpha, MAX_LORA, "finetune.alpha", "--lora-alpha")?;
    }
    match &w.quant {
        Quant::Gptq { group_size, .. } | Quant::Awq { group_size, .. } => {
            at_most(u64::from(*group_size), u64::from(MAX_GROUP), "quant.group_size", "--group-size")?
        }
        Quant::Fp8 { block } => {
            at_most(u64::from(*block), u64::from(MAX_GROUP), "quant.block", "--group-size")?
        }
        _ => {}
    }
    match &w.engine {
        Engine::Vllm { max_num_batched_tokens, .. } => at_most(
            *max_num_batched_tokens,
            MAX_SEQ,
            "engine.max_num_batched_tokens",
            "--max-num-batched-tokens",
        )?,
        Engine::LlamaCpp { n_ctx, n_ubatch } => {
            at_most(*n_ctx, MAX_SEQ, "engine.n_ctx", "--n-ctx")?;
            at_most(*n_ubatch, MAX_BATCH, "engine.n_ubatch", "--n-ubatch")?;
        }
        Engine::Sglang { max_total_tokens, .. } => {
            if let Some(tokens) = max_total_tokens {
                at_most(*tokens, MAX_SEQ * MAX_BATCH, "engine.max_total_tokens", "--max-total-tokens")?;
            }
        }
        Engine::Transformers => {}
    }
    Ok(())
}

fn check_sizes(w: &Workload) -> Result<(), InputError> {
    positive(w.batch, "batch", "give a batch of 1 or more (`--batch 1`)")?;
    positive(w.seq, "seq", "give the sequence length in tokens (`--seq 2048`)")?;
    positive(w.grad_accum, "grad_accum", "give 1 for no gradient accumulation (`--grad-accum 1`)")?;
    check_bounds(w)?;
    if let Some(prompt) = w.prompt {
        positive(
            prompt,
            "prompt",
            "give the prompt length in tokens, or leave it out to prefill the whole `seq`",
        )?;
        if prompt > w.seq {
            return Err(InputError::new(
                ORIGIN,
                format!(
                    "the prompt ({prompt} tokens) is longer than the whole context `seq` ({} tokens)",
                    w.seq
                ),
            )
            .at_key("prompt")
            .with_fix(
                "`seq` counts prompt and generated tokens together: raise `--seq` or lower `--prompt`",
            ));
        }
    }
    Ok(())
}

/// The most bytes one step may form, 2⁶⁰ (1 EiB, some 5,000 times the largest GPU): with every
/// term of the memory model below it, its sums (a few dozen terms per block, 2¹⁰ blocks at
/// most) stay below `u64::MAX`.
pub const MAX_STEP_BYTES: u128 = 1 << 60;

/// Bounded sizes can still multiply past `u64`: eager attention's scores are batch × heads ×
/// seq², up to 2³² · 2¹² · 2²⁴. This bounds, in `u128`, what the memory model forms per step —
/// every block's activations (up to 64 tensors per token of the widest width, 8 bytes each),
/// eager attention's scores, the KV cache and the logits — and refuses the step past
/// [`MAX_STEP_BYTES`]: no device holds it, and the figures would not fit in `u64`.
/// A bound on what the vision tower's blocks form in one step, as `check_scale` bounds the
/// language model's: 64 tensors of the widest width per patch at 8 bytes, and every image's
/// attention scores (a full-attention block attends over the whole image), per block.
fn vision_step_bytes(w: &Workload, model: &ModelDescription) -> u128 {
    let (Some(images), Some(vision)) = (&w.images, &model.facts.vision) else { return 0 };
    let Some(image) = vision.image_tokens(images.width, images.height) else { return 0 };
    let count = u128::from(w.batch) * u128::from(images.per_sample);
    let patches = u128::from(image.patches);
    let width = u128::from(vision.hidden_size.max(vision.intermediate_size));
    let blocks = model.facts.layers.iter().filter(|l| l.stack == StackKind::Vision).count() as u128;
    blocks
        * (count * patches * width * 64 * 8 + count * u128::from(vision.num_heads) * patches * patches * 16)
}

fn check_scale(w: &Workload, model: &ModelDescription) -> Result<(), InputError> {
    let f = &model.facts;
    // A vision-language sample's images add their tokens to the language model's sequence, and
    // their patches run through the tower.
    let image_tokens = w.image_tokens(model);
    let (batch, seq) = (u128::from(w.batch), u128::from(w.seq) + u128::from(image_tokens));
    if image_tokens > 0 && (seq > u128::from(MAX_SEQ) || batch * seq > u128::from(MAX_TOKENS)) {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "{} text tokens and {image_tokens} image tokens make {seq} tokens a sequence, {} in one step: past \
                 the bounds of {MAX_SEQ} a sequence and 2³² a step (docs/limits.md)",
                w.seq,
                batch * seq
            ),
        )
        .at_key("images")
        .with_fix("give fewer or smaller images (`--images`, `--image-size`), or a smaller `--batch`"));
    }
    let vision = vision_step_bytes(w, model);
    let context = match w.engine {
        Engine::LlamaCpp { n_ctx, n_ubatch } => u128::from(n_ctx.max(n_ubatch)),
        Engine::Vllm { max_num_batched_tokens, .. } => seq.max(u128::from(max_num_batched_tokens)),
        // AutoAWQ's fused modules hold a cache of `--awq-fused` tokens a sequence, however short
        // the run's own context (`model/awq_fused.rs`).
        Engine::Transformers => seq.max(u128::from(w.awq_fused.unwrap_or(0))),
        Engine::Sglang { .. } => seq,
    };
    let tokens = batch * context;
    let moe = f.moe.as_ref().map_or(0, |m| {
        u128::from(m.experts)
            + u128::from(m.top_k.max(1)) * u128::from(m.expert_intermediate_size)
            + u128::from(m.shared_experts) * u128::from(m.shared_intermediate_size)
    });
    let heads = u128::from(f.num_attention_heads.max(1));
    let attention = (heads + 2 * u128::from(f.num_kv_heads)) * u128::from(f.head_dim);
    let width = [u128::from(f.hidden_size), u128::from(f.intermediate_size), attention, moe]
        .into_iter()
        .max()
        .unwrap_or(0);
    let layers = (f.layers.len() as u128).max(1);
    let per_block = tokens * width * 64 * 8 + batch * heads * context * context * 16;
    let step = layers * per_block + tokens * u128::from(f.vocab_size) * 4 * 8 + vision;
    if step > MAX_STEP_BYTES {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "batch {} × seq {}{} on {} ({} layers) forms more than 2⁶⁰ bytes (1 EiB) in one step: \
                 no device holds it, and vramplan's byte figures stop there (docs/limits.md)",
                w.batch,
                w.seq,
                if image_tokens > 0 { " (and its images)" } else { "" },
                model.name,
                f.layers.len()
            ),
        )
        .at_key("batch")
        .with_fix("lower `--batch` or `--seq` (or `--n-ctx` / `--max-num-batched-tokens`, or the images)"));
    }
    Ok(())
}

fn check_quant(w: &Workload) -> Result<(), InputError> {
    let bad = |key: &str, problem: String, fix: &str| {
        Err(InputError::new(ORIGIN, problem).at_key(key).with_fix(fix))
    };
    match &w.quant {
        Quant::Gptq { bits, .. } if !matches!(bits, 2 | 3 | 4 | 8) => {
            bad("quant.bits", format!("GPTQ with {bits} bits"), "GPTQ weights have 2, 3, 4 or 8 bits")
        }
        Quant::Awq { bits, .. } if *bits != 4 => {
            bad("quant.bits", format!("AWQ with {bits} bits"), "AWQ weights have 4 bits")
        }
        Quant::Gptq { group_size: 0, .. } | Quant::Awq { group_size: 0, .. } => bad(
            "quant.group_size",
            "a group size of 0".into(),
            "give the group size of the checkpoint's `quantization_config` (usually 128)",
        ),
        Quant::Fp8 { block: 0 } => bad(
            "quant.block",
            "an fp8 scale block of 0".into(),
            "give the tile size of the scales (128 for DeepSeek-V3)",
        ),
        Quant::Gguf { quant_type } => {
            FileType::parse(quant_type)?;
            if !matches!(w.engine, Engine::LlamaCpp { .. } | Engine::Vllm { .. }) {
                return bad(
                    "quant",
                    format!("GGUF weights ({quant_type}) with an engine other than llama.cpp or vLLM"),
                    "add `--engine llama.cpp` or `--engine vllm` (transformers dequantizes a GGUF file when it \
                     loads it: for plain weights give `--dtype` instead)",
                );
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn check_mode(w: &Workload) -> Result<(), InputError> {
    if w.mode != Mode::Train {
        return Ok(());
    }
    if w.finetune == Finetune::Full && w.quant != Quant::None {
        return Err(InputError::new(
            ORIGIN,
            "a full fine-tune of quantized weights: quantized weights are frozen (the HF Trainer refuses \
             to train a purely quantized model)",
        )
        .at_key("quant")
        .with_fix(
            "train LoRA adapters over them (QLoRA: add `--lora-rank 16`), or train without `--quant`",
        ));
    }
    if w.engine != Engine::Transformers {
        return Err(InputError::new(ORIGIN, "training with an inference engine (vLLM, llama.cpp)")
            .at_key("engine")
            .with_fix("use `--engine transformers` for training, or `--mode inference`"));
    }
    Ok(())
}

/// A model read from a GGUF file runs under llama.cpp, which keeps its stored types; the other
/// engines load a different checkpoint (transformers dequantizes a GGUF into a float model with
/// transformers' names, `from_pretrained(gguf_file=...)`).
fn check_gguf_engine(w: &Workload, model: &ModelDescription) -> Result<(), InputError> {
    use vramplan_profiles::model::gguf;
    if gguf::is_gguf_model(model) && model.facts.model_type == "clip" {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "`{}` is a multimodal projector (`mmproj`), not a model llama.cpp runs alone",
                model.name
            ),
        )
        .with_fix("give a folder holding the model's .gguf and this projector beside it"));
    }
    if gguf::is_gguf_model(model) && gguf::has_recurrent_layers(model) {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "`{}` has recurrent (state-space or RWKV) layers, whose state vramplan does not model under llama.cpp",
                model.name
            ),
        )
        .with_fix("`inspect` shows its tensors; for its memory, give the original checkpoint under transformers"));
    }
    // A state-space mixer's per-sequence state is modelled as transformers holds it; the engines'
    // own caches of it (vLLM's, llama.cpp's) are not.
    if model.facts.layers.iter().any(|l| l.ssm.is_some()) && !matches!(w.engine, Engine::Transformers) {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "{} has state-space mixers, whose state vLLM and llama.cpp size their own way: not modelled yet",
                model.name
            ),
        )
        .at_key("engine.kind")
        .with_fix("drop --engine to size it under transformers, which holds the state as vramplan models it"));
    }
    if gguf::is_gguf_model(model) && w.quant != Quant::None {
        return Err(InputError::new(
            "--quant",
            format!("`{}` is a GGUF file: its tensors already have their types", model.name),
        )
        .with_fix("drop --quant (vramplan reads each tensor's type from the file)"));
    }
    if !gguf::is_gguf_model(model) || matches!(w.engine, Engine::LlamaCpp { .. }) {
        return Ok(());
    }
    Err(InputError::new(ORIGIN, format!("`{}` is a GGUF file, which llama.cpp runs", model.name))
        .at_key("engine.kind")
        .with_fix(
            "add `--engine llamacpp`; for transformers or vLLM, give the original checkpoint (its \
             config.json or Hub id)",
        ))
}

/// The most images one sample may carry: each is hundreds to thousands of tokens, and a long
/// video's frames come as video inputs, which vramplan does not model.
const MAX_IMAGES: u64 = 1 << 10;

/// Images need a vision tower, a size the processor accepts, and transformers (the other
/// engines' multimodal budgets are not modelled yet).
fn check_images(w: &Workload, model: &ModelDescription) -> Result<(), InputError> {
    let Some(images) = &w.images else { return Ok(()) };
    if !matches!(w.engine, Engine::Transformers) {
        return Err(InputError::new(
            ORIGIN,
            "images under an inference engine: vramplan models them under transformers only",
        )
        .at_key("images")
        .with_fix("drop --engine (transformers), or drop --images to size the engine for text"));
    }
    let Some(vision) = &model.facts.vision else {
        return Err(InputError::new(ORIGIN, format!("images for {}, which has no vision tower", model.name))
            .at_key("images")
            .with_fix("drop --images (and `images:`), or give a vision-language model such as qwen2.5-vl-7b-instruct"));
    };
    if images.per_sample == 0 || images.width == 0 || images.height == 0 {
        return Err(InputError::new(ORIGIN, "images of no count or no size")
            .at_key("images")
            .with_fix("give `images: {per_sample: 2, width: 1024, height: 1024}` (or --images 2 --image-size 1024x1024)"));
    }
    at_most(images.per_sample, MAX_IMAGES, "images.per_sample", "--images")?;
    let side = vramplan_profiles::model::vision::MAX_SIDE;
    at_most(images.width, side, "images.width", "--image-size")?;
    at_most(images.height, side, "images.height", "--image-size")?;
    if vision.image_tokens(images.width, images.height).is_none() {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "a {}x{} image: the processor refuses its shape (Qwen2-VL's: sides more than 200 \
                 times apart; Phi-4 multimodal's: a side under 10 pixels once fitted to its crops)",
                images.width, images.height
            ),
        )
        .at_key("images")
        .with_fix("give the image's real size (`--image-size WIDTHxHEIGHT`)"));
    }
    Ok(())
}

fn check_engine(w: &Workload) -> Result<(), InputError> {
    match &w.engine {
        Engine::Vllm { gpu_memory_utilization, max_num_batched_tokens } => {
            if !(*gpu_memory_utilization > 0.0 && *gpu_memory_utilization <= 1.0) {
                return Err(InputError::new(
                    ORIGIN,
                    format!("gpu_memory_utilization {gpu_memory_utilization} is not a fraction of the GPU"),
                )
                .at_key("engine.gpu_memory_utilization")
                .with_fix("give a number above 0 and at most 1 (vLLM's default is 0.9)"));
            }
            positive(*max_num_batched_tokens, "engine.max_num_batched_tokens", "vLLM's default is 8192")
        }
        Engine::LlamaCpp { n_ctx, n_ubatch } => {
            positive(*n_ctx, "engine.n_ctx", "give the context in tokens (`--n-ctx 4096`)")?;
            positive(*n_ubatch, "engine.n_ubatch", "llama.cpp's default is 512")?;
            if !matches!(w.quant, Quant::None | Quant::Gguf { .. }) {
                return Err(InputError::new(
                    ORIGIN,
                    "llama.cpp runs GGUF files, not bitsandbytes, GPTQ, AWQ or fp8 weights",
                )
                .at_key("quant")
                .with_fix("give a GGUF type (`--quant Q4_K_M`), or `--engine vllm` / `transformers`"));
            }
            Ok(())
        }
        Engine::Sglang { mem_fraction_static, max_total_tokens, dp_size, ep_size } => {
            if let Some(f) = mem_fraction_static
                && !(*f > 0.0 && *f < 1.0)
            {
                return Err(InputError::new(
                    ORIGIN,
                    format!("mem_fraction_static {f} is not a fraction in (0, 1)"),
                )
                .at_key("engine.mem_fraction_static")
                .with_fix("leave it out for SGLang's default by GPU size, or give a value such as 0.85"));
            }
            if let Some(tokens) = max_total_tokens {
                positive(*tokens, "engine.max_total_tokens", "leave it out to use the profiled pool")?;
            }
            for (size, key) in [(dp_size, "engine.dp_size"), (ep_size, "engine.ep_size")] {
                if let Some(size) = size {
                    positive(u64::from(*size), key, "SGLang's default is 1")?;
                }
            }
            if matches!(w.quant, Quant::Int8 | Quant::Nf4 { .. } | Quant::Fp4 { .. } | Quant::Gguf { .. }) {
                return Err(InputError::new(
                    ORIGIN,
                    "under SGLang, vramplan sizes plain weights, fp8, GPTQ and AWQ (as vLLM's kernels hold \
                     them), not bitsandbytes or GGUF weights",
                )
                .at_key("quant")
                .with_fix("use `--quant fp8`, `gptq` or `awq`, or `--engine vllm` / `llama.cpp`"));
            }
            Ok(())
        }
        Engine::Transformers => Ok(()),
    }
}

fn check_parallelism(
    w: &Workload,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<(), InputError> {
    let gpus = hardware.devices.len();
    match w.parallelism {
        Parallelism::Zero { stage, .. } if !(1..=3).contains(&stage) => {
            Err(InputError::new(ORIGIN, format!("ZeRO stage {stage}")).at_key("parallelism.stage").with_fix(
                "ZeRO has stages 1 (optimizer states), 2 (+ gradients) and 3 (+ parameters; FSDP full shard)",
            ))
        }
        Parallelism::Zero { stage, offload_params: true, .. } if stage < 3 => Err(InputError::new(
            ORIGIN,
            format!("parameter offload with ZeRO-{stage}: only sharded parameters (ZeRO-3) are offloaded"),
        )
        .at_key("parallelism.offload_params")
        .with_fix("use stage 3, or offload the optimizer alone")),
        Parallelism::Tensor { pipeline: 0, .. } => Err(InputError::new(ORIGIN, "0 pipeline stages")
            .at_key("parallelism.pipeline")
            .with_fix("use `pp=M` with M at least 1, or leave it out for one stage")),
        Parallelism::Tensor { pipeline, .. } if pipeline > 1 && !matches!(w.engine, Engine::Vllm { .. }) => {
            Err(InputError::new(
                ORIGIN,
                format!(
                    "{pipeline} pipeline stages: vramplan sizes pipeline-parallel serving under vLLM only"
                ),
            )
            .at_key("parallelism.pipeline")
            .with_fix(
                "add `--engine vllm`, or plan a layer split with `vramplan plan` (`--target pipeline` for \
                 DeepSpeed's pipeline stages)",
            ))
        }
        Parallelism::Tensor { size: 0, .. } => Err(InputError::new(ORIGIN, "tensor parallelism over 0 GPUs")
            .at_key("parallelism.size")
            .with_fix("use `tp=N` with N at least 1")),
        Parallelism::Tensor { size, pipeline } if pipeline > 1 => {
            let ranks = size as usize * pipeline as usize;
            let layers = crate::tensor_parallel::decoder_layers(model);
            if ranks > gpus {
                Err(InputError::new(
                    ORIGIN,
                    format!(
                        "tensor parallel {size} × pipeline parallel {pipeline} runs on {ranks} GPUs, and `{}` has {gpus}",
                        hardware.name
                    ),
                )
                .at_key("parallelism.pipeline")
                .with_fix("use a profile with enough GPUs, or a smaller tp or pp"))
            } else if u64::from(pipeline) > layers {
                Err(InputError::new(
                    ORIGIN,
                    format!(
                        "{pipeline} pipeline stages for {layers} decoder layers: a stage needs at least one"
                    ),
                )
                .at_key("parallelism.pipeline")
                .with_fix(format!("use at most pp={layers}")))
            } else {
                check_parallelism(
                    &Workload { parallelism: Parallelism::tensor(size), ..w.clone() },
                    model,
                    hardware,
                )
            }
        }
        Parallelism::Tensor { size, .. } => {
            if size == 0 || size as usize > gpus {
                return Err(InputError::new(
                    ORIGIN,
                    format!("tensor parallelism over {size} GPUs, and `{}` has {gpus}", hardware.name),
                )
                .at_key("parallelism.size")
                .with_fix(format!("use `tp=N` with N from 1 to {gpus}, or a profile with more GPUs")));
            }
            // vLLM's and SGLang's layers check more than the heads.
            let serving = matches!(w.engine, Engine::Vllm { .. } | Engine::Sglang { .. });
            let heads = model.facts.num_attention_heads;
            let refusal = |n: u32| {
                if serving {
                    crate::tensor_parallel::serving_tp_refusal(model, n)
                } else {
                    (heads > 0 && !heads.is_multiple_of(u64::from(n))).then(|| {
                        format!(
                            "tensor parallelism over {n} GPUs does not divide the {heads} attention heads"
                        )
                    })
                }
            };
            if let Some(problem) = refusal(size) {
                let sizes: Vec<String> =
                    (1..=gpus as u32).filter(|n| refusal(*n).is_none()).map(|n| n.to_string()).collect();
                return Err(InputError::new(ORIGIN, problem)
                    .at_key("parallelism.size")
                    .with_fix(format!("use a size that divides them: {}", sizes.join(", "))));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The dtype weights are held in on the GPU, where it is a float dtype the checkpoint or the
/// user chose (quantized weights keep the rest of the model in it).
fn weight_dtype(w: &Workload, model: &ModelDescription) -> DType {
    w.weight_dtype.unwrap_or(model.dtype)
}

fn warnings(w: &Workload, model: &ModelDescription, hardware: &HardwareProfile) -> Vec<String> {
    let mut out = Vec::new();
    if w.trainer == Trainer::FsdpQlora
        && w.mode == Mode::Train
        && !matches!(w.parallelism, Parallelism::Single | Parallelism::Zero { stage: 3, .. })
    {
        // fsdp_qlora's FSDP1 sharding is modelled for FULL_SHARD (`sim/src/fsdp.rs`).
        out.push(
            "`trainer: fsdp-qlora` is modelled with `--parallel fsdp` (its default `full_shard`) or on one GPU; \
             this estimate applies only its precision to the parallelism given"
                .to_string(),
        );
    }
    if w.trainer == Trainer::Unsloth && w.mode == Mode::Train {
        // What `trainer: unsloth` models: LoRA over a Llama-style decoder (its fused
        // RMSNorm, LoRA QKV/MLP and SwiGLU kernels; docs/memory-model.md, "Unsloth").
        let llama_style =
            model.facts.gated_mlp && model.facts.norm == NormKind::RmsNorm && model.facts.moe.is_none();
        if !matches!(w.finetune, Finetune::Lora { .. }) || !llama_style {
            out.push(
                "`trainer: unsloth` is modelled for LoRA over a Llama-style decoder (RMSNorm, gated MLP, \
                 no experts); this estimate applies Unsloth's LoRA kernels' saved tensors anyway"
                    .to_string(),
            );
        }
    }
    let gguf = matches!(w.engine, Engine::LlamaCpp { .. });
    let weights = weight_dtype(w, model);
    // fp16 autocast scales the loss (`GradScaler`), whose `unscale_` refuses fp16 gradients: a
    // full fine-tune of fp16 weights stops at the first optimizer step in the HF Trainer.
    if w.mode == Mode::Train
        && w.trainer == Trainer::Transformers
        && matches!(w.finetune, Finetune::Full)
        && weights == DType::F16
        && w.autocast == Some(DType::F16)
    {
        out.push(
            "fp16 weights trained with fp16 autocast: the HF Trainer stops at the first step with `ValueError: \
             Attempting to unscale FP16 gradients.` (its GradScaler needs fp32 parameters); load the weights in \
             fp32 (`--dtype fp32 --autocast fp16`), or use bf16 where the GPU has it"
                .to_string(),
        );
    }
    let mut bf16_uses = Vec::new();
    if !gguf && weights == DType::BF16 {
        bf16_uses.push(if w.weight_dtype.is_some() {
            "bf16 weights"
        } else {
            "bf16 weights (the checkpoint's dtype)"
        });
    }
    if w.autocast == Some(DType::BF16) {
        bf16_uses.push("bf16 autocast");
    }
    if w.kv_dtype == Some(DType::BF16) {
        bf16_uses.push("a bf16 KV cache");
    }
    if !bf16_uses.is_empty() {
        for device in lacking(hardware, |d| d.bf16) {
            out.push(format!(
                "{} on {} (compute capability {}), which has no bf16 support: the HF Trainer refuses \
                 `bf16=True` there and vLLM refuses bfloat16; use fp16 (`--dtype fp16`, `--autocast fp16`) — \
                 the memory is the same",
                bf16_uses.join(" and "),
                device.name,
                device.compute_capability
            ));
        }
    }
    let fp8_weights = matches!(w.quant, Quant::Fp8 { .. })
        || (!gguf && matches!(w.quant, Quant::None) && matches!(weights, DType::F8E4M3 | DType::F8E5M2));
    let fp8_kv = matches!(w.kv_dtype, Some(DType::F8E4M3 | DType::F8E5M2));
    if fp8_weights || fp8_kv {
        let what = match (fp8_weights, fp8_kv) {
            (true, true) => "fp8 weights and an fp8 KV cache",
            (true, false) => "fp8 weights",
            _ => "an fp8 KV cache",
        };
        for device in lacking(hardware, |d| d.fp8) {
            out.push(format!(
                "{what} on {} (compute capability {}), which has no fp8 tensor cores (Ada and Hopper have): \
                 fp8 is only storage there, upcast for every matmul (slower, and not every runtime allows it)",
                device.name, device.compute_capability
            ));
        }
    }
    // Parameters of a fixed float32 dtype (`torch.FloatTensor`, XLNet's attention) stay float32
    // when the model is loaded in half precision, and meet half-precision activations in the
    // forward: transformers raises there, whatever the device map (seen with 4.57 and 5.23).
    if !gguf && weights.is_float() && weights.bits() < 32 {
        let mut fixed = 0u64;
        model.root.visit(&mut |m| {
            let stays = |t: &&vramplan_profiles::model::Tensor| {
                t.kind == TensorKind::Parameter && !t.follows_load_dtype && t.dtype == DType::F32
            };
            fixed += m.tensors.iter().filter(stays).count() as u64;
        });
        if fixed > 0 {
            out.push(format!(
                "{fixed} parameters of {} stay float32 whatever the load dtype (made with `torch.FloatTensor`), \
                 so its forward in {} fails with `RuntimeError: expected scalar type Float but found {}`; \
                 run it in fp32 (`--dtype fp32`)",
                model.name,
                weights.name(),
                if weights == DType::BF16 { "BFloat16" } else { "Half" }
            ));
        }
    }
    let positions = model.facts.max_positions;
    let context = context(w, model);
    // Past a rotary model's positions quality degrades; relative positions (XLNet, T5) have no
    // such length, and a learned table is a hard limit (`check_positions`).
    if positions > 0 && context > positions && crate::model::activations::uses_rotary(model) {
        out.push(format!(
            "a context of {context} tokens is longer than {}'s {positions} positions \
             (`max_position_embeddings`): quality degrades past it unless rope scaling extends it",
            model.name
        ));
    }
    out
}

/// The profile's devices without a feature, one per distinct name.
fn lacking(hardware: &HardwareProfile, has: impl Fn(&Device) -> bool) -> Vec<&Device> {
    let mut out: Vec<&Device> = Vec::new();
    for device in hardware.devices.iter().filter(|d| !has(d)) {
        if !out.iter().any(|d| d.name == device.name) {
            out.push(device);
        }
    }
    out
}
