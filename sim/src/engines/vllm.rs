//! vLLM's memory budget on one tensor-parallel rank (the V1 engine, as of vLLM 0.19):
//!
//! ```text
//! KV cache = gpu_memory_utilization × total − weights − activation peak − non-torch memory
//! tokens   = floor(KV cache / (16 × KV bytes per token)) × 16
//! ```
//!
//! `total` is the memory CUDA reports for the device (`torch.cuda.mem_get_info()[1]`: nvidia-smi's
//! total less the driver's reserve). vLLM measures the terms in `Worker.determine_available_memory`
//! (vllm/v1/worker/gpu_worker.py) with `memory_profiling` (vllm/utils/mem_utils.py) against the
//! `MemorySnapshot` taken at the end of `init_device`, after the CUDA context and the distributed
//! environment (NCCL communicators, custom all-reduce buffers) exist:
//! - **weights**: the torch memory of loading the model (`Model loading took X GiB`): the rank's
//!   shard ([`crate::tensor_parallel::shard_bytes`]) of the model as vLLM holds it (bitsandbytes:
//!   [`super::vllm_bnb`]; fp8, GPTQ, AWQ and checkpoints' own quantizations:
//!   [`super::vllm_quant`]) plus the rotary `cos_sin_cache` vLLM builds (`max_position ×
//!   rotary_dim` in the model dtype, one per model);
//! - **activation peak** (`torch_peak_increase`): the torch peak of `profile_run`, a forward pass
//!   over `max_num_batched_tokens` tokens followed by a sampler run over `max_num_seqs`
//!   sequences; modelled term by term in [`activation_peak`];
//! - **non-torch memory** (`non_torch_increase`): what the device's used memory grew by outside
//!   torch's allocator between the snapshot and the end of profiling: CUDA modules loaded lazily
//!   by the first kernels, library handles, and at TP ≥ 2 the NCCL buffers connected by the first
//!   all-reduce. A quantity of the driver and NCCL, not of the model: measured constants.
//!
//! Memory allocated before the snapshot (the CUDA context, [`DISTRIBUTED_INIT_BYTES`] at TP ≥ 2)
//! and the CUDA graphs captured after the KV cache are not subtracted: vLLM 0.19 leaves the graph
//! estimate off by default (`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`; vllm-project/vllm PR
//! #30515, "off by default", made default in v0.21.0). They must fit in the
//! `1 − gpu_memory_utilization` left over, which [`VllmBudget::fits`] checks.
//!
//! The workload's `vllm` options add vLLM's other reservations ([`super::vllm_extras`]): no
//! graphs under `--enforce-eager`, the LoRA slots and punica metadata among the weights, a
//! speculative proposer's weights and KV, `--kv-cache-memory-bytes` in place of the derived KV
//! cache, and `--max-model-len auto`.
//!
//! The measured constants are medians over the vLLM 0.19 H100 runs of the llm-d-planner campaign
//! (jgchn/llm-d-planner `accuracy/results/v0.19.0/results_raw.csv`) of models *other* than the
//! three the accuracy test checks (Llama-3.1-8B, Mixtral-8x7B, DeepSeek-V2-Lite): CodeLlama,
//! Gemma 2/3, Granite, Phi-4, Mistral-Small, Kimi, Qwen 2.5/3 and quantized Llama/Mistral
//! checkpoints (docs/memory-model.md lists them).

use super::activation_dtype;
use super::pipeline_stage::{self, Stage};
use super::vllm_bnb::{self, Bnb, Transients};
use super::vllm_extras;
use super::vllm_quant;
use crate::tensor_parallel::{
    ExpertSplit, kv_bytes_per_token, kv_heads_per_rank, query_heads_per_rank, shard_bytes_expert_parallel,
};
use crate::workload::{Engine, Workload};
use serde::Serialize;
use std::borrow::Cow;
use vramplan_profiles::hardware::Device;
use vramplan_profiles::model::{AttentionKind, ModelDescription, StackKind, TensorKind};
use vramplan_profiles::{DType, InputError};

const GIB: u64 = 1 << 30;

/// Tokens per KV-cache block (`CacheConfig.block_size` default, vllm/config/cache.py).
pub const BLOCK_SIZE: u64 = 16;

/// Non-torch memory during profiling at TP 1: 0.25 GiB, the median of 19 TP-1 runs of 15 models
/// (0.24 to 0.46 GiB) in the llm-d-planner vLLM 0.19 campaign, none of them a checked row.
/// Previously read off the checked rows themselves (`non_torch_forward_gib` of
/// `vllm019_llama31_8b_tp1`), which gave the same figure.
pub const NON_TORCH_TP1_BYTES: u64 = GIB / 4;

/// Non-torch memory during profiling at TP 2 and 3: 2.09 GiB, the median of 7 TP-2 runs of 6
/// models (2.06 to 2.11 GiB) in the same campaign (NCCL's buffers, connected on the first
/// all-reduce). Previously 2.07 GiB, read off the checked rows `vllm019_llama31_8b_tp2` and
/// `vllm019_mixtral_8x7b_tp2`. TP 3 was not measured and takes this figure.
pub const NON_TORCH_TP2_BYTES: u64 = GIB * 209 / 100;

/// Non-torch memory during profiling at TP ≥ 4: 2.21 GiB, the median of 3 TP-4 runs (2.13 to
/// 2.21 GiB) in the same campaign; wider groups were not measured and take this figure.
pub const NON_TORCH_TP4_BYTES: u64 = GIB * 221 / 100;

/// Memory the distributed environment takes before vLLM's memory snapshot at TP ≥ 2 (NCCL
/// communicators and the custom all-reduce buffers, `init_worker_distributed_environment`):
/// 1.02 GiB, the median of the same campaign's TP ≥ 2 runs' used memory at the snapshot
/// (`init_cuda_memory_gib` 1.53 GiB, against 0.51 GiB at TP 1). Outside
/// `gpu_memory_utilization`, like the CUDA context.
pub const DISTRIBUTED_INIT_BYTES: u64 = GIB * 102 / 100;

/// CUDA-graph memory with vLLM 0.19's default `FULL_AND_PIECEWISE` capture (51 sizes up to 512):
/// 1.06 GiB, the median of the 29 runs above (0.64 to 1.85 GiB, growing with the layers a graph
/// captures). Captured after the KV cache and reported, not subtracted (see the module docs).
/// Previously 0.91 GiB, the median of the five checked rows.
pub const CUDA_GRAPH_BYTES: u64 = GIB * 106 / 100;

/// vLLM raises its scheduler defaults on GPUs with at least this much memory that are not A100s
/// (`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py).
pub const LARGE_GPU_BYTES: u64 = 70 * GIB;

/// `max_num_seqs` for `vllm serve` on large GPUs (H100, H200, MI300X) and on the others.
pub const MAX_NUM_SEQS_LARGE_GPU: u64 = 1024;
/// `max_num_seqs` for `vllm serve` on A100s and GPUs under [`LARGE_GPU_BYTES`].
pub const MAX_NUM_SEQS_OTHER_GPU: u64 = 256;

/// Bytes of an fp32 element (the sampler's logits).
const F32: u64 = 4;

/// One rank's budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VllmBudget {
    /// Ranks in the tensor-parallel group (vLLM's `--tensor-parallel-size`).
    pub tensor_parallel: u32,
    /// Memory CUDA reports for the device (vLLM's "total").
    pub total_bytes: u64,
    /// `gpu_memory_utilization × total`.
    pub requested_bytes: u64,
    /// Torch memory of loading the model on this rank (`Model loading took X GiB`): the weight
    /// shard plus the rotary `cos_sin_cache`, and the LoRA slots under `--max-loras`.
    pub weights_bytes: u64,
    /// The torch peak while loading: the weights plus the largest transient one layer's
    /// quantization or repacking adds on this rank ([`vllm_quant::Held::load_transient_bytes`];
    /// the weights alone for plain weights). Freed before profiling.
    pub load_peak_bytes: u64,
    /// The kernel that holds quantized weights (`MarlinLinearKernel`, `FP8 Marlin`), and what
    /// vLLM did to them; `None` for plain weights and bitsandbytes.
    pub quantization: Option<String>,
    /// Torch peak of `profile_run`: a forward pass over `max_num_batched_tokens` tokens, then the
    /// sampler over `max_num_seqs` sequences.
    pub activation_peak_bytes: u64,
    /// The stage of the profiling run that sets the peak (`sampler`, `model.layers.0 mlp`).
    pub activation_peak_at: String,
    /// Memory outside torch's allocator that profiling adds (lazily loaded CUDA modules, library
    /// handles; NCCL buffers at TP ≥ 2): [`non_torch_bytes`].
    pub non_torch_bytes: u64,
    /// Memory the distributed environment holds before the snapshot: [`DISTRIBUTED_INIT_BYTES`]
    /// at TP ≥ 2, else 0. Outside `gpu_memory_utilization`.
    pub distributed_init_bytes: u64,
    /// Batch sizes vLLM captures CUDA graphs for ([`vllm_extras::capture_sizes`]); 0 under
    /// `--enforce-eager`.
    pub cuda_graph_sizes: u64,
    /// Captured after the KV cache; not part of the identity (see the module docs); 0 under
    /// `--enforce-eager`.
    pub cuda_graph_bytes: u64,
    /// The LoRA slots and the punica metadata (`--max-loras`), allocated while loading and part
    /// of [`VllmBudget::weights_bytes`]: [`vllm_extras::lora_slot_bytes`],
    /// [`vllm_extras::punica_metadata_bytes`].
    pub lora_bytes: u64,
    /// The KV cache was given (`--kv-cache-memory-bytes`), not derived from
    /// `gpu_memory_utilization`.
    pub kv_cache_given: bool,
    /// The context vLLM serves: the workload's `seq`, or under `--max-model-len auto` the
    /// longest one request the KV cache holds.
    pub max_model_len: u64,
    /// The speculative proposer (`--speculative-config`): its weights, part of
    /// [`VllmBudget::weights_bytes`], and its KV per token, part of
    /// [`VllmBudget::kv_bytes_per_token`] ([`vllm_extras::drafter`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter: Option<vllm_extras::Drafter>,
    /// What is left for the paged KV cache (`Available KV cache memory`): requested − weights −
    /// activation peak − non-torch.
    pub kv_cache_bytes: u64,
    /// KV-cache bytes of one token on this rank, over every decoder layer, in the KV dtype
    /// (`--kv-cache-dtype`).
    pub kv_bytes_per_token: u64,
    /// Tokens the paged cache holds (`GPU KV cache size: N tokens`).
    pub kv_capacity_tokens: u64,
    /// Sequences per step: the profile run samples this many.
    pub max_num_seqs: u64,
    /// One request of `max_model_len` (the workload's `seq`) fits in the KV cache, the CUDA
    /// context, the distributed environment and the CUDA graphs fit in the memory left outside
    /// `gpu_memory_utilization`, and the load peak fits beside the context and the distributed
    /// environment.
    pub fits: bool,
    /// The longest context the KV cache holds (vLLM's "estimated maximum model length"), capped
    /// at the model's positions.
    pub max_model_len_that_fits: u64,
}

/// vLLM's budget for `model` on one `device` of a `tp`-way tensor-parallel group, under
/// `workload` (whose engine must be [`Engine::Vllm`]; `seq` is `max_model_len`,
/// `weight_dtype` is `--dtype`, `kv_dtype` is `--kv-cache-dtype`).
pub fn budget(
    model: &ModelDescription,
    device: &Device,
    workload: &Workload,
    tp: u32,
) -> Result<VllmBudget, InputError> {
    stage_budget(model, device, workload, tp, Stage::WHOLE)
}

/// vLLM's budget on one rank of `stage` of a pipeline whose stages are `tp`-way groups: the
/// rank holds its stage's layers ([`pipeline_stage::stage_model`]), their KV cache and their
/// activations; only the last stage runs the sampler and holds a speculative proposer.
pub fn stage_budget(
    model: &ModelDescription,
    device: &Device,
    workload: &Workload,
    tp: u32,
    stage: Stage,
) -> Result<VllmBudget, InputError> {
    let staged;
    let model = if stage.count > 1 {
        staged = pipeline_stage::stage_model(model, stage);
        &staged
    } else {
        model
    };
    let world = tp.max(1).saturating_mul(stage.count.max(1));
    let Engine::Vllm { gpu_memory_utilization, max_num_batched_tokens } = workload.engine else {
        return Err(InputError::new("workload", "the engine is not vLLM").at_key("engine.kind").with_fix(
            "set `engine: {kind: vllm, gpu_memory_utilization: 0.9, max_num_batched_tokens: 8192}`",
        ));
    };
    check(model, gpu_memory_utilization, max_num_batched_tokens, tp)?;
    let options = &workload.vllm;
    vllm_extras::check(model, options)?;
    let act_dtype = activation_dtype(model, workload.weight_dtype);
    let kv_dtype = workload.kv_dtype.unwrap_or(act_dtype);
    vllm_quant::check(model, &workload.quant, device, act_dtype)?;
    let bnb = Bnb::of(&workload.quant);
    if let Some(bnb) = bnb {
        vllm_bnb::check(model, bnb, tp)?;
    }
    // A checkpoint's own quantization is held as stored; the flag quantizes plain weights only.
    let bnb_loads = bnb.filter(|_| model.quantization.is_none());
    let cast: Cow<ModelDescription> = match workload.weight_dtype {
        Some(dtype) if dtype != model.dtype => Cow::Owned(model.cast(dtype)),
        _ => Cow::Borrowed(model),
    };
    let held =
        if bnb_loads.is_some() { None } else { vllm_quant::held(&cast, &workload.quant, device, act_dtype)? };
    let load_transient = held.as_ref().map_or(0, |h| h.load_transient_bytes.div_ceil(u64::from(tp.max(1))));
    let quantization = held.as_ref().map(|h| format!("{}: {}", h.kernel.name(), h.note));
    let weights: Cow<ModelDescription> = match (bnb_loads, held) {
        (Some(bnb), _) => Cow::Owned(vllm_bnb::loaded(&cast, bnb)),
        (None, Some(held)) => Cow::Owned(held.model),
        (None, None) => cast,
    };

    let total_bytes = device.memory_bytes.saturating_sub(device.driver_reserve_bytes);
    let requested_bytes = (total_bytes as f64 * gpu_memory_utilization).floor() as u64;
    let max_num_seqs = default_max_num_seqs(device, total_bytes).min(max_num_batched_tokens);
    let lora_bytes = vllm_extras::lora_slot_bytes(model, options, tp, act_dtype).saturating_add(
        vllm_extras::punica_metadata_bytes(max_num_batched_tokens, max_num_seqs, options.max_loras),
    );
    let drafter = match &options.speculative {
        Some(spec) if stage.is_last() => {
            Some(vllm_extras::drafter(model, &weights, spec, tp, act_dtype, kv_dtype)?)
        }
        _ => None,
    };
    // vLLM's rotary embedding keeps its `cos_sin_cache` instead of transformers' frequency buffers.
    // vLLM's MoE layers take the tensor-parallel group flattened across data parallel.
    let moe_ranks = tp.saturating_mul(workload.data_parallel_size());
    if let Some(moe) = &model.facts.moe
        && !options.enable_expert_parallel
        && moe_ranks > 1
        && !moe.expert_intermediate_size.is_multiple_of(u64::from(moe_ranks))
    {
        return Err(InputError::new(
            "--data-parallel-size",
            format!(
                "vLLM splits each expert's {} intermediate features over tp × dp = {moe_ranks} ranks, and they do not divide",
                moe.expert_intermediate_size
            ),
        )
        .with_fix("add --enable-expert-parallel, or choose tp × dp dividing the experts' intermediate size"));
    }
    let experts = if options.enable_expert_parallel {
        ExpertSplit::Whole(moe_ranks)
    } else {
        ExpertSplit::Intermediate(moe_ranks)
    };
    let weights_bytes = loaded_weights_bytes(&weights, model, tp, experts, act_dtype)
        .saturating_add(lora_bytes)
        .saturating_add(drafter.as_ref().map_or(0, |d| d.weights_bytes));
    let mut transients = bnb.map_or_else(Transients::default, |bnb| {
        vllm_bnb::transients(model, bnb, tp, max_num_batched_tokens, act_dtype.bytes_for(1).max(1))
    });
    transients.attention += vllm_extras::lora_activation_bytes(options, max_num_batched_tokens, 3);
    let mlp_slices = if model.facts.gated_mlp { 2 } else { 1 };
    transients.mlp += vllm_extras::lora_activation_bytes(options, max_num_batched_tokens, mlp_slices);
    let (activation_peak_bytes, activation_peak_at) = activation_peak_with(
        model,
        tp,
        act_dtype,
        max_num_batched_tokens,
        max_num_seqs,
        transients,
        stage.is_last(),
    );
    // The measured terms are of tensor-parallel groups; a pipeline's ranks are taken to hold what a
    // group of the same world size does (NCCL's communicators and buffers; not measured).
    let non_torch_bytes = non_torch_bytes(world);
    let distributed_init_bytes = if world > 1 { DISTRIBUTED_INIT_BYTES } else { 0 };
    let profiled = weights_bytes.saturating_add(activation_peak_bytes).saturating_add(non_torch_bytes);
    let kv_cache_bytes = options.kv_cache_memory_bytes.unwrap_or(requested_bytes.saturating_sub(profiled));
    let kv_bytes_per_token = kv_bytes_per_token(model, tp, kv_dtype)
        .saturating_add(drafter.as_ref().map_or(0, |d| d.kv_bytes_per_token));
    let block_bytes = kv_bytes_per_token.saturating_mul(BLOCK_SIZE);
    let kv_capacity_tokens = kv_cache_bytes.checked_div(block_bytes).unwrap_or(0) * BLOCK_SIZE;
    let positions = if model.facts.max_positions > 0 { model.facts.max_positions } else { u64::MAX };
    let max_model_len_that_fits = kv_capacity_tokens.min(positions);
    let max_model_len = if options.max_model_len_auto { max_model_len_that_fits } else { workload.seq };
    let decode_query_len = 1 + options.speculative.as_ref().map_or(0, |s| s.num_speculative_tokens);
    let sizes = vllm_extras::capture_sizes(
        max_num_seqs,
        decode_query_len,
        max_num_batched_tokens,
        options.enforce_eager,
    );
    let cuda_graph_bytes = vllm_extras::cuda_graph_bytes(&sizes);
    let before_load = device.context_reserve_bytes.saturating_add(distributed_init_bytes);
    let outside = before_load.saturating_add(cuda_graph_bytes);
    let load_peak_bytes = weights_bytes.saturating_add(load_transient);
    // A given KV cache is allocated whatever the fraction: everything must fit the device.
    let held_fits = match options.kv_cache_memory_bytes {
        Some(kv) => profiled.saturating_add(kv).saturating_add(outside) <= total_bytes,
        None => outside <= total_bytes.saturating_sub(requested_bytes),
    };
    let fits = kv_capacity_tokens >= max_model_len
        && kv_capacity_tokens > 0
        && held_fits
        && load_peak_bytes.saturating_add(before_load) <= total_bytes;
    Ok(VllmBudget {
        tensor_parallel: tp,
        total_bytes,
        requested_bytes,
        weights_bytes,
        load_peak_bytes,
        quantization,
        activation_peak_bytes,
        activation_peak_at,
        non_torch_bytes,
        distributed_init_bytes,
        cuda_graph_sizes: sizes.len() as u64,
        cuda_graph_bytes,
        lora_bytes,
        kv_cache_given: options.kv_cache_memory_bytes.is_some(),
        max_model_len,
        drafter,
        kv_cache_bytes,
        kv_bytes_per_token,
        kv_capacity_tokens,
        max_num_seqs,
        fits,
        max_model_len_that_fits,
    })
}

/// The torch memory of loading `weights` (the description as vLLM holds it) on one rank of a
/// `tp`-way group, its routed experts held as `experts` says: its shard without transformers' rotary `inv_freq` buffers, plus vLLM's
/// rotary `cos_sin_cache` for `model`'s positions in `dtype`.
pub(crate) fn loaded_weights_bytes(
    weights: &ModelDescription,
    model: &ModelDescription,
    tp: u32,
    experts: ExpertSplit,
    dtype: DType,
) -> u64 {
    shard_bytes_expert_parallel(weights, tp, experts)
        .saturating_sub(hf_rotary_buffer_bytes(weights))
        .saturating_add(rotary_cache_bytes(model, dtype))
}

/// Non-torch memory vLLM measures during profiling on a rank of a `tp`-way group:
/// [`NON_TORCH_TP1_BYTES`], [`NON_TORCH_TP2_BYTES`] (TP 2 and 3) or [`NON_TORCH_TP4_BYTES`].
pub fn non_torch_bytes(tp: u32) -> u64 {
    match tp {
        0 | 1 => NON_TORCH_TP1_BYTES,
        2 | 3 => NON_TORCH_TP2_BYTES,
        _ => NON_TORCH_TP4_BYTES,
    }
}

/// The settings vLLM itself refuses.
fn check(model: &ModelDescription, utilization: f64, batched_tokens: u64, tp: u32) -> Result<(), InputError> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(InputError::new(
            "workload",
            format!("gpu_memory_utilization {utilization} is not a fraction in (0, 1]"),
        )
        .at_key("engine.gpu_memory_utilization")
        .with_fix("use vLLM's default 0.9, or a value such as 0.95"));
    }
    if batched_tokens == 0 {
        return Err(InputError::new("workload", "max_num_batched_tokens is 0")
            .at_key("engine.max_num_batched_tokens")
            .with_fix("use vLLM's default for `vllm serve`: 8192 on H100-class GPUs, 2048 on others"));
    }
    if tp == 0 {
        return Err(InputError::new("--tensor-parallel-size", "0 ranks")
            .with_fix("use 1 for a single GPU, or the number of GPUs to shard over"));
    }
    let tp64 = u64::from(tp);
    let heads = model.facts.num_attention_heads;
    if !heads.is_multiple_of(tp64) {
        return Err(InputError::new(
            "--tensor-parallel-size",
            format!("{heads} attention heads do not split over {tp} ranks; vLLM requires a divisor"),
        )
        .with_fix(format!("use a tensor-parallel size that divides {heads}")));
    }
    let kv = model.facts.num_kv_heads.max(1);
    let standard = model.facts.attention == AttentionKind::Standard;
    if standard && ((kv >= tp64 && !kv.is_multiple_of(tp64)) || (kv < tp64 && !tp64.is_multiple_of(kv))) {
        return Err(InputError::new(
            "--tensor-parallel-size",
            format!("{kv} KV heads neither split over nor replicate evenly across {tp} ranks"),
        )
        .with_fix(format!("use a tensor-parallel size that divides {kv} or is a multiple of it")));
    }
    Ok(())
}

/// `max_num_seqs` of `vllm serve`: 1024 on GPUs of at least 70 GiB that are not A100s, 256 on
/// the others.
fn default_max_num_seqs(device: &Device, total_bytes: u64) -> u64 {
    if total_bytes >= LARGE_GPU_BYTES && !device.name.to_ascii_lowercase().contains("a100") {
        MAX_NUM_SEQS_LARGE_GPU
    } else {
        MAX_NUM_SEQS_OTHER_GPU
    }
}

/// transformers' rotary frequency buffers (`inv_freq`, `original_inv_freq`), which vLLM's models
/// do not have: their rotary embedding holds the `cos_sin_cache` instead.
fn hf_rotary_buffer_bytes(model: &ModelDescription) -> u64 {
    let mut bytes = 0u64;
    model.root.visit(&mut |module| {
        for t in &module.tensors {
            if t.name.ends_with("inv_freq") && matches!(t.kind, TensorKind::Buffer { .. }) {
                bytes = bytes.saturating_add(t.bytes());
            }
        }
    });
    bytes
}

/// vLLM's rotary `cos_sin_cache`: `max_position × rotary_dim` values in the model dtype (cos and
/// sin halves side by side), one buffer shared by every layer. `rotary_dim` is read from the
/// description's `inv_freq` buffer (`rotary_dim / 2` values); models without rotary embeddings
/// have none.
fn rotary_cache_bytes(model: &ModelDescription, dtype: DType) -> u64 {
    let mut half_dim = None;
    model.root.visit(&mut |module| {
        if half_dim.is_none() {
            half_dim = module
                .tensors
                .iter()
                .find(|t| t.name == "inv_freq" && matches!(t.kind, TensorKind::Buffer { .. }))
                .map(|t| t.numel());
        }
    });
    half_dim.map_or(0, |half| dtype.bytes_for(model.facts.max_positions.saturating_mul(2 * half)))
}

/// The torch peak of vLLM's `profile_run` on one rank: the largest of the stages below, for `T`
/// = `max_num_batched_tokens` tokens, `R` = `max_num_seqs` sampled sequences, `b` bytes per
/// activation, per-rank widths (heads, intermediate sizes divided by `tp`). Every stage holds
/// the residual stream and the layer's hidden states (`2·T·H·b`); with `torch.compile` (vLLM's
/// default) a temporary is freed after its last use.
///
/// - **attention**: the fused QKV output `T·(q + 2·kv)·hd·b` and the attention output `T·q·hd·b`;
///   then the attention output, `o_proj`'s output `T·H·b` and, at TP ≥ 2, the all-reduce's
///   out-of-place result `T·H·b`. MLA (prefill path): Q `T·q·(nope+rope)`, the latent
///   `T·(2·lora+rope)` (projection and its norm), `kv_b_proj`'s output `T·q·(nope+v)`, K and the
///   padded V `2·T·q·(nope+rope)` and the padded output `T·q·(nope+rope)`, all `× b`;
/// - **dense MLP**: gate/up `2·T·I·b` with the activation output `T·I·b` (one `T·I·b` for an
///   ungated MLP), then the activation output with `down_proj`'s output and the all-reduce;
/// - **MoE** (vLLM's fused Triton experts): router logits `T·E·b`, top-k weights and ids
///   (`T·k·12`), the shared `cache13` buffer `T·k·max(2·Ie, H)·b`, `cache2` `T·k·Ie·b`, the
///   output `T·H·b`, the shared experts' output `T·H·b` and the all-reduce; the shared experts
///   alone take `3·T·Is·b`;
/// - **sampler**: the forward's hidden states `T·H·b` (still referenced), the sampled rows
///   `R·H·b`, the logits `R·V·b` (gathered over the vocab-parallel head), their fp32 copy
///   `R·V·4` (none when the model runs in fp32) and FlashInfer's top-k/top-p sampler's masked
///   logits and probabilities `2·R·V·4`.
pub fn activation_peak(
    model: &ModelDescription,
    tp: u32,
    dtype: DType,
    tokens: u64,
    sequences: u64,
) -> (u64, String) {
    activation_peak_with(model, tp, dtype, tokens, sequences, Transients::default(), true)
}

/// [`activation_peak`] with the transients bitsandbytes kernels add to the attention, MLP and MoE
/// stages ([`vllm_bnb::transients`]).
fn activation_peak_with(
    model: &ModelDescription,
    tp: u32,
    dtype: DType,
    tokens: u64,
    sequences: u64,
    extra: Transients,
    sampler: bool,
) -> (u64, String) {
    let facts = &model.facts;
    let b = dtype.bytes_for(1).max(1);
    let tp64 = u64::from(tp.max(1));
    let t = tokens;
    let h = facts.hidden_size;
    let ar = if tp64 > 1 { t * h * b } else { 0 };
    let base = 2 * t * h * b;
    let heads = query_heads_per_rank(model, tp);

    let attention = match facts.attention {
        AttentionKind::Standard => {
            let hd = facts.head_dim;
            let kv = kv_heads_per_rank(model, tp);
            let qkv = t * (heads + 2 * kv) * hd * b;
            let out = t * heads * hd * b;
            base + (qkv + out).max(out + t * h * b + ar) + extra.attention
        }
        AttentionKind::MultiLatent {
            kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, ..
        } => {
            let qk = qk_nope_head_dim + qk_rope_head_dim;
            let q = t * heads * qk;
            let latent = t * (2 * kv_lora_rank + qk_rope_head_dim);
            let kv_b = t * heads * (qk_nope_head_dim + v_head_dim);
            let k_v_out = 3 * t * heads * qk;
            base + (q + latent + kv_b + k_v_out) * b + extra.attention
        }
    };
    let dense_mlp = |intermediate: u64| -> u64 {
        let i = intermediate.div_ceil(tp64);
        let up = if facts.gated_mlp { 3 * t * i * b } else { 2 * t * i * b };
        base + up.max(t * i * b + t * h * b + ar) + extra.mlp
    };
    let moe_mlp = facts.moe.as_ref().map(|moe| {
        let k = u64::from(moe.top_k);
        let ie = moe.expert_intermediate_size.div_ceil(tp64);
        let is = moe.shared_intermediate_size.div_ceil(tp64);
        let router = t * u64::from(moe.experts) * b + t * k * 12;
        let cache13 = t * k * (2 * ie).max(h) * b;
        let cache2 = t * k * ie * b;
        let shared_out = if is > 0 { t * h * b } else { 0 };
        let routed = base + router + cache13 + cache2 + t * h * b + shared_out + ar + extra.moe;
        let shared = base + 3 * t * is * b + if is > 0 { extra.mlp } else { 0 };
        routed.max(shared)
    });

    let mut peak = (attention, "attention".to_string());
    let mut consider = |bytes: u64, at: String| {
        if bytes > peak.0 {
            peak = (bytes, at);
        }
    };
    for layer in facts.layers.iter().filter(|l| l.stack == StackKind::Decoder) {
        match (layer.moe, &moe_mlp) {
            (true, Some(bytes)) => consider(*bytes, format!("{} moe", layer.path)),
            _ => consider(dense_mlp(facts.intermediate_size), format!("{} mlp", layer.path)),
        }
    }
    let r = sequences.min(t);
    let v = facts.vocab_size;
    let fp32_copy = if b == F32 { 0 } else { r * v * F32 };
    let sampler_bytes = t * h * b + r * h * b + r * v * b + fp32_copy + 2 * r * v * F32;
    if sampler {
        consider(sampler_bytes, "sampler".to_string());
    }
    peak
}
