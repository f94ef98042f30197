//! Memory budgets of the inference engines people serve models with, as the engines themselves
//! compute them, so vramplan's answer matches what the engine will log:
//! - [`vllm`]: the paged KV cache vLLM sizes from `gpu_memory_utilization` after a profiling
//!   forward pass, per tensor-parallel rank; [`vllm_bnb`]: bitsandbytes weights as vLLM loads
//!   them; [`vllm_quant`]: fp8, GPTQ, AWQ and the other checkpoints' weights as vLLM holds them;
//!   [`vllm_extras`]: CUDA-graph captures, LoRA slots, speculative proposers and the KV-cache
//!   overrides (`--kv-cache-memory-bytes`, `--max-model-len auto`); [`pipeline_stage`]: the
//!   layers and modules each pipeline stage holds;
//! - [`llamacpp`]: llama.cpp's model, KV and compute buffers for a GGUF file;
//!   [`layer_split`]: llama.cpp's rule for which device holds each layer;
//!   [`llamacpp_split`]: the buffers of each GPU when the layers are split over several;
//! - [`sglang`]: SGLang's token pool, sized from `--mem-fraction-static` of the memory free
//!   before loading, its default by GPU size, and the TP / DP / EP sizes it accepts;
//! - [`gguf`]: GGUF tensor types and the per-tensor type mix of each llama.cpp file type;
//! - [`estimate`]: each engine's budgets as an [`crate::Estimate`], placed the way the engine
//!   places the model by default.
//!
//! Every constant carries its source here and in `docs/memory-model.md` ("Inference engines").

pub mod estimate;
pub mod gguf;
pub mod layer_split;
pub mod llamacpp;
pub mod llamacpp_split;
pub mod pipeline_stage;
pub mod sglang;
pub mod vllm;
pub mod vllm_bnb;
pub mod vllm_extras;
pub mod vllm_quant;

use vramplan_profiles::DType;
use vramplan_profiles::model::ModelDescription;

/// The dtype activations are computed in: the weights' dtype (`--dtype` / the workload's
/// `weight_dtype`), or bf16 when weights are stored in a narrower or non-float type (fp8, packed
/// integers), which both engines run in 16-bit.
pub(crate) fn activation_dtype(model: &ModelDescription, weight_dtype: Option<DType>) -> DType {
    let dtype = weight_dtype.unwrap_or(model.dtype);
    if dtype.is_float() && dtype.bits() >= 16 { dtype } else { DType::BF16 }
}
