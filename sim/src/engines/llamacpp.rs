//! llama.cpp's memory on one CUDA device with every layer offloaded (`-ngl` all): the model
//! buffer, the KV cache and the compute buffer, as `llama_model_load` and
//! `llama_init_from_model` log them (`CUDA0 buffer size`, `KV buffer size`, `CUDA0 compute
//! buffer size`).
//!
//! - **Model.** Each tensor is sized from its GGUF type ([`super::gguf`]); the CUDA buffer type
//!   pads a quantized tensor whose rows are not a multiple of `MATRIX_ROW_PADDING` (512) by the
//!   bytes of the missing elements, and places tensors at 128-byte boundaries. The token
//!   embedding stays in host memory (llama.cpp always keeps the input layer on the CPU); with tied
//!   embeddings the output layer is a GPU copy of it.
//! - **KV cache.** K and V per layer: `n_ctx × n_kv_heads × head_dim` elements each, f16 by
//!   default; sliding-window layers of the architectures llama.cpp runs with an SWA cache
//!   ([`SWA_MODEL_TYPES`]) keep `min(n_ctx, window + n_ubatch)` cells (rounded up to 256); MLA
//!   models keep `kv_lora_rank + qk_rope_head_dim` values per cell in K and none in V (V is a
//!   view of K).
//! - **Compute buffer.** ggml-alloc plans the worst-case graph for `n_ubatch` tokens against the
//!   full cache; its size is the largest set of f32 tensors alive at once. See
//!   [`compute_buffer`].

use super::gguf::{self, FileType, GgmlType, Role};
use crate::workload::{AttentionImpl, Engine, Quant, Workload};
use serde::Serialize;
use vramplan_profiles::hardware::Device;
use vramplan_profiles::model::{AttentionKind, ModelDescription, StackKind};
use vramplan_profiles::{DType, InputError};

/// `MATRIX_ROW_PADDING` (ggml-cuda/common.cuh): the last row of a quantized matrix is padded to
/// a multiple of this many elements to keep kernels in bounds.
pub const MATRIX_ROW_PADDING: u64 = 512;

/// Alignment of tensors in a CUDA buffer (`ggml_backend_cuda_buffer_type_get_alignment`).
pub const CUDA_BUFFER_ALIGNMENT: u64 = 128;

/// llama.cpp's SWA cache is sized in multiples of this many cells (`n_pad` of the KV cache).
pub const KV_CELL_PADDING: u64 = 256;

/// `model_type`s llama.cpp runs with a sliding-window KV cache (`LLAMA_SWA_TYPE_*` set by the
/// model loader: Gemma 2/3, Cohere2, gpt-oss, Llama 4's chunked attention). Other models with a
/// `sliding_window` in their config (Mistral-7B-v0.1) run with full attention in llama.cpp.
pub const SWA_MODEL_TYPES: &[&str] =
    &["gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss", "llama4", "llama4_text"];

/// Bytes of an f32 activation (ggml computes the graph in f32).
const F32_BYTES: u64 = 4;

/// What llama.cpp allocates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaCppBudget {
    /// The GGUF file type the weights are in: the workload's `quant.quant_type`, or the weights'
    /// float type (F16 / BF16 / F32) when it has no quantization.
    pub file_type: FileType,
    /// The CUDA model buffer: every offloaded tensor, padded and aligned.
    pub model_bytes_gpu: u64,
    /// The host model buffer: the token embedding.
    pub model_bytes_cpu: u64,
    /// The KV cache (K and V of every layer).
    pub kv_bytes: u64,
    /// The CUDA compute buffer for the worst-case `n_ubatch` graph.
    pub compute_bytes: u64,
    /// The graph stage that sets the compute buffer (`attention scores`, `output logits`, `ffn`).
    pub compute_peak_at: String,
    /// Model + KV + compute fit in the memory a CUDA process can allocate.
    pub fits: bool,
}

impl LlamaCppBudget {
    /// All CUDA buffers together: what llama.cpp needs on the device beyond its CUDA context.
    pub fn gpu_bytes(&self) -> u64 {
        self.model_bytes_gpu.saturating_add(self.kv_bytes).saturating_add(self.compute_bytes)
    }
}

/// The buffers llama.cpp allocates for `model` on `device` under `workload`, whose engine must be
/// [`Engine::LlamaCpp`]. The GGUF type comes from `Quant::Gguf`, or is the weights' float type
/// (F16 / BF16 / F32) when the workload has no quantization. `n_ctx` 0 means the model's trained
/// context, as `-c 0` does. Flash attention is on when the workload's attention is `flash`.
pub fn budget(
    model: &ModelDescription,
    device: &Device,
    workload: &Workload,
) -> Result<LlamaCppBudget, InputError> {
    let Settings { n_ctx, n_ubatch, file_type, kv_dtype, flash_attention } = settings(model, workload)?;
    let tensors = gguf::quantize(model, file_type)?;
    let mut model_bytes_gpu = 0u64;
    let mut model_bytes_cpu = 0u64;
    let tied = !tensors.iter().any(|t| t.role == Role::Output);
    for tensor in &tensors {
        if tensor.role == Role::TokenEmbedding {
            model_bytes_cpu = model_bytes_cpu.saturating_add(tensor.bytes);
            if tied {
                // `output` is duplicated from `token_embd` and offloaded with the output layer.
                model_bytes_gpu = model_bytes_gpu.saturating_add(cuda_alloc_size(tensor));
            }
        } else {
            model_bytes_gpu = model_bytes_gpu.saturating_add(cuda_alloc_size(tensor));
        }
    }

    let kv_bytes = kv_cache_bytes(model, n_ctx, n_ubatch, kv_dtype);
    let (compute_bytes, compute_peak_at) = compute_buffer(model, n_ctx, n_ubatch, flash_attention);
    let mut budget = LlamaCppBudget {
        file_type,
        model_bytes_gpu,
        model_bytes_cpu,
        kv_bytes,
        compute_bytes,
        compute_peak_at: compute_peak_at.to_string(),
        fits: false,
    };
    budget.fits = budget.gpu_bytes() <= device.usable_bytes();
    Ok(budget)
}

/// The llama.cpp settings a workload gives, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Settings {
    /// Context cells (`-c`; 0 in the workload is the model's trained context).
    pub n_ctx: u64,
    /// Tokens per micro-batch (`-ub`).
    pub n_ubatch: u64,
    /// The GGUF file type of the weights.
    pub file_type: FileType,
    /// The KV cache's type (`-ctk`/`-ctv`).
    pub kv_dtype: DType,
    /// Flash attention (`-fa`): the workload's attention is `flash`.
    pub flash_attention: bool,
}

/// Reads and checks the llama.cpp settings of `workload`, whose engine must be llama.cpp.
pub(crate) fn settings(model: &ModelDescription, workload: &Workload) -> Result<Settings, InputError> {
    let Engine::LlamaCpp { n_ctx, n_ubatch } = workload.engine else {
        return Err(InputError::new("workload", "the engine is not llama.cpp")
            .at_key("engine.kind")
            .with_fix("set `engine: {kind: llama_cpp, n_ctx: 4096, n_ubatch: 512}`"));
    };
    if n_ubatch == 0 {
        return Err(InputError::new(
            "workload",
            "n_ubatch is 0; llama.cpp needs at least one token per micro-batch",
        )
        .at_key("engine.n_ubatch")
        .with_fix("use llama.cpp's default, 512"));
    }
    Ok(Settings {
        n_ctx: if n_ctx == 0 { model.facts.max_positions } else { n_ctx },
        n_ubatch,
        file_type: file_type(model, workload)?,
        kv_dtype: kv_dtype(workload)?,
        flash_attention: workload.attention == AttentionImpl::Flash,
    })
}

fn file_type(model: &ModelDescription, workload: &Workload) -> Result<FileType, InputError> {
    // A GGUF model's tensors keep their stored types (a `quant` for it is refused by the input
    // checks, `check_gguf_engine`).
    if vramplan_profiles::model::gguf::is_gguf_model(model) {
        return Ok(FileType::Stored);
    }
    match &workload.quant {
        Quant::Gguf { quant_type } => FileType::parse(quant_type),
        Quant::None => Ok(match workload.weight_dtype.unwrap_or(model.dtype) {
            DType::F32 | DType::F64 => FileType::F32,
            DType::BF16 => FileType::BF16,
            _ => FileType::F16,
        }),
        other => {
            Err(InputError::new("workload", format!("llama.cpp runs GGUF files, not {}", quant_name(other)))
                .at_key("quant.kind")
                .with_fix("set `quant: {kind: gguf, quant_type: Q4_K_M}` (or another GGUF type)"))
        }
    }
}

fn quant_name(quant: &Quant) -> &'static str {
    match quant {
        Quant::None => "unquantized weights",
        Quant::Int8 => "bitsandbytes int8",
        Quant::Nf4 { .. } => "bitsandbytes nf4",
        Quant::Fp4 { .. } => "bitsandbytes fp4",
        Quant::Gptq { .. } => "GPTQ",
        Quant::Awq { .. } => "AWQ",
        Quant::Fp8 { .. } => "fp8 checkpoints",
        Quant::Gguf { .. } => "GGUF",
    }
}

fn kv_dtype(workload: &Workload) -> Result<DType, InputError> {
    match workload.kv_dtype {
        None => Ok(DType::F16),
        Some(dtype @ (DType::F16 | DType::BF16 | DType::F32)) => Ok(dtype),
        Some(other) => Err(InputError::new(
            "workload",
            format!("KV-cache dtype {} is not one vramplan models for llama.cpp", other.name()),
        )
        .at_key("kv_dtype")
        .with_fix("use fp16 (llama.cpp's default, `-ctk f16 -ctv f16`), bf16 or fp32")),
    }
}

/// Bytes a tensor takes in a CUDA buffer: its size, plus the row padding of a quantized tensor
/// whose rows are not a multiple of [`MATRIX_ROW_PADDING`] elements
/// (`ggml_backend_cuda_buffer_type_get_alloc_size`), rounded up to [`CUDA_BUFFER_ALIGNMENT`].
pub(crate) fn cuda_alloc_size(tensor: &gguf::GgufTensor) -> u64 {
    let mut size = tensor.bytes;
    let ty: GgmlType = tensor.ggml_type;
    let remainder = tensor.row_elements % MATRIX_ROW_PADDING;
    if ty.is_quantized() && remainder != 0 {
        size = size.saturating_add(ty.row_bytes(MATRIX_ROW_PADDING - remainder));
    }
    size.div_ceil(CUDA_BUFFER_ALIGNMENT).saturating_mul(CUDA_BUFFER_ALIGNMENT)
}

/// The sliding window llama.cpp applies to a layer: the description's, for the architectures in
/// [`SWA_MODEL_TYPES`] only.
fn llamacpp_window(model: &ModelDescription, window: Option<u64>) -> Option<u64> {
    window.filter(|_| SWA_MODEL_TYPES.contains(&model.facts.model_type.as_str()))
}

/// Cells of one layer's cache: the context, or for a sliding-window layer the window plus one
/// micro-batch, rounded up to [`KV_CELL_PADDING`] and capped by the context.
fn layer_cells(window: Option<u64>, n_ctx: u64, n_ubatch: u64) -> u64 {
    match window {
        Some(w) => n_ctx.min((w + n_ubatch).div_ceil(KV_CELL_PADDING) * KV_CELL_PADDING),
        None => n_ctx,
    }
}

/// The KV cache: per decoder layer, K and V of `cells × kv_heads × head_dim` elements (MLA: K of
/// `cells × (kv_lora_rank + qk_rope_head_dim)`, V none).
fn kv_cache_bytes(model: &ModelDescription, n_ctx: u64, n_ubatch: u64, dtype: DType) -> u64 {
    (0..model.facts.layers.len())
        .map(|i| layer_kv_bytes(model, i, n_ctx, n_ubatch, dtype))
        .fold(0u64, u64::saturating_add)
}

/// The KV cache of layer `index` (of `facts.layers`): K and V of `cells × kv_heads × head_dim`
/// elements (MLA: K of `cells × (kv_lora_rank + qk_rope_head_dim)`, V none); 0 for a layer that
/// keeps none (an encoder block).
pub(crate) fn layer_kv_bytes(
    model: &ModelDescription,
    index: usize,
    n_ctx: u64,
    n_ubatch: u64,
    dtype: DType,
) -> u64 {
    let facts = &model.facts;
    let Some(layer) = facts.layers.get(index).filter(|l| l.stack == StackKind::Decoder) else {
        return 0;
    };
    let per_cell = match facts.attention {
        AttentionKind::MultiLatent { kv_lora_rank, qk_rope_head_dim, .. } => kv_lora_rank + qk_rope_head_dim,
        AttentionKind::Standard => 2 * facts.num_kv_heads * facts.head_dim,
    };
    let cells = layer_cells(llamacpp_window(model, layer.attention_window), n_ctx, n_ubatch);
    dtype.bytes_for(cells.saturating_mul(per_cell))
}

/// The compute buffer: the largest of the graph stages below, all f32, for `n_ub` tokens
/// against `n_kv` cache cells (the full context: the worst case llama.cpp reserves).
///
/// - **attention scores** (no flash attention): `KQ` of `n_head × n_kv × n_ub`, the mask copied
///   to the device (`n_kv × n_ub`), and four hidden-size rows per token that sit below `KQ` in
///   ggml-alloc's layout (the layer input, its residual, the normed input and Q);
///   with flash attention, no `KQ`: the four rows and an f16 mask of `n_kv × n_ub`;
/// - **output logits**: `n_vocab × n_ub` logits and the final norm's output;
/// - **ffn**: gate and up (`2 × n_ff`) and two hidden rows; for MoE the router logits, and per
///   routed expert of a token its gate, up and output.
///
/// Published logs this reproduces: Llama-2-7B at `n_ctx` 2048 (164.01 MiB, measured.csv);
/// Mistral-7B-Instruct-v0.2 at `n_ctx` 2048 and 32768 (164.00 and 2144.00 MiB,
/// fedora-copr/logdetective PR #106); Llama-3-8B at `n_ctx` 512 and 2048 (258.50 MiB, logits),
/// all with `n_ubatch` 512.
pub fn compute_buffer(
    model: &ModelDescription,
    n_ctx: u64,
    n_ub: u64,
    flash_attention: bool,
) -> (u64, &'static str) {
    let whole = GraphShare { layers: true, output: true, copies: 1 };
    compute_buffer_share(model, n_ctx, n_ub, flash_attention, whole)
}

/// The part of the graph one device runs when llama.cpp splits the layers over devices, and how
/// many copies ggml's scheduler keeps of each input it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphShare {
    /// The device holds decoder layers (it runs their attention and feed-forward).
    pub layers: bool,
    /// The device holds the output layer (it computes the logits).
    pub output: bool,
    /// Copies of each input the scheduler keeps on the device: [`PIPELINE_COPIES`] with pipeline
    /// parallelism, else 1.
    pub copies: u64,
}

/// `GGML_SCHED_MAX_COPIES` (ggml/src/ggml-backend.cpp): the copies of every split input that
/// `ggml_backend_sched` keeps when created with `parallel = true`, which llama.cpp asks for
/// (`llama_context`, "pipeline parallelism enabled (n_copies=4)") when the model spans more than
/// one device, every layer is offloaded, the split mode is `layer`, the KV cache is offloaded and
/// no tensor is overridden (`-ot`).
pub const PIPELINE_COPIES: u64 = 4;

/// The compute buffer of one device running `share` of the graph: the stages of
/// [`compute_buffer`] it runs (attention and feed-forward where it holds layers, the logits where
/// it holds the output layer). With `copies` > 1 (pipeline parallelism) every input the device
/// receives is a graph input kept in `copies` copies for the whole graph
/// (`ggml_backend_sched_split_graph` flags each copy input and output, so ggml-alloc never reuses
/// it): the KQ mask (f32, or f16 with flash attention), the hidden states arriving from the host
/// or the previous device (`n_embd × n_ub` f32) and the positions (`n_ub` int32), plus the
/// output rows' ids on the device with the output layer; the mask then leaves the attention
/// stage. This reproduces the logged 672.01 MiB of a Command-R 35B device holding 12 of 40
/// layers at `n_ctx` 4096 (llama.cpp PR #6122).
pub fn compute_buffer_share(
    model: &ModelDescription,
    n_ctx: u64,
    n_ub: u64,
    flash_attention: bool,
    share: GraphShare,
) -> (u64, &'static str) {
    let facts = &model.facts;
    let embd = facts.hidden_size;
    let heads = facts.num_attention_heads;
    let n_kv = facts
        .layers
        .iter()
        .filter(|l| l.stack == StackKind::Decoder)
        .map(|l| layer_cells(llamacpp_window(model, l.attention_window), n_ctx, n_ub))
        .max()
        .unwrap_or(n_ctx);
    let f32_rows = |values_per_token: u64| F32_BYTES.saturating_mul(n_ub).saturating_mul(values_per_token);
    let mask = if flash_attention { 2 } else { F32_BYTES }.saturating_mul(n_kv).saturating_mul(n_ub);
    let pipelined = share.copies > 1;
    let stage_mask = if pipelined { 0 } else { mask };
    let attention = if flash_attention {
        f32_rows(4 * embd).saturating_add(stage_mask)
    } else {
        f32_rows(heads.saturating_mul(n_kv) + 4 * embd).saturating_add(stage_mask)
    };
    let output = f32_rows(facts.vocab_size + embd);
    let dense_ffn = f32_rows(2 * facts.intermediate_size + 2 * embd);
    let moe_ffn = facts.moe.as_ref().map_or(0, |moe| {
        let top_k = u64::from(moe.top_k);
        let routed = u64::from(moe.experts) + top_k * (2 * moe.expert_intermediate_size + embd) + 2 * embd;
        let shared = 2 * moe.shared_intermediate_size + 2 * embd;
        f32_rows(routed.max(shared))
    });
    let mut stages = Vec::new();
    if share.layers {
        stages.push((attention, "attention scores"));
        stages.push((dense_ffn.max(moe_ffn), "ffn"));
    }
    if share.output {
        stages.push((output, "output logits"));
    }
    let (stage, at) = stages.iter().copied().max_by_key(|(b, _)| *b).unwrap_or((0, "attention scores"));
    if !pipelined || !(share.layers || share.output) {
        return (stage, at);
    }
    // Inputs kept in `copies` copies: the mask and positions where layers run, the hidden states
    // arriving, and the output rows' ids (int32) where the logits are taken.
    let mut inputs = f32_rows(embd);
    if share.layers {
        inputs = inputs.saturating_add(mask).saturating_add(F32_BYTES * n_ub);
    }
    if share.output {
        inputs = inputs.saturating_add(F32_BYTES * n_ub);
    }
    (stage.saturating_add(share.copies.saturating_mul(inputs)), at)
}
