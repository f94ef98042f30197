//! SGLang's memory budget on one tensor-parallel rank, as SGLang sizes itself (the code of
//! SGLang 0.5.23, `python/sglang/srt/` in sgl-project/sglang; the same identity holds since
//! 0.3, where it lived in `ModelRunner.profile_max_num_token`):
//!
//! ```text
//! pre     = free memory after the CUDA context and the distributed environment
//! rest    = (pre − weights) − pre × (1 − mem_fraction_static)
//! tokens  = floor(rest / KV bytes per token), to a page, at most --max-total-tokens
//! ```
//!
//! - **pre** (`pre_model_load_memory`, `distributed/bootstrap.py` `measure_pre_model_load_memory`,
//!   logged as `Load weight begin. avail mem=X GB`): the free memory `torch.cuda.mem_get_info`
//!   reports once the CUDA context and the NCCL communicators exist, the minimum over the ranks;
//! - **weights**: what loading the model took on the rank (`Load weight end. … mem usage=X GB`):
//!   the rank's shard ([`crate::tensor_parallel::shard_bytes`]) of the model as held (fp8, GPTQ,
//!   AWQ: as [`super::vllm_quant`] holds them, SGLang running the same kernels);
//! - **rest** (`KVCacheConfigurator._profile_available_bytes`, `mem_cache/kv_cache_configurator.py`):
//!   the free memory after loading less the slack `pre × (1 − mem_fraction_static)` kept for
//!   activations and CUDA graphs. Below zero SGLang refuses to start ("Loaded weights leave no GPU
//!   memory for the KV cache");
//! - **tokens** (`DefaultPoolConfigurator.calculate_pool_sizes`, `model_executor/pool_configurator.py`):
//!   `rest // cell_size`, rounded down to `page_size` (1 by default), then capped by
//!   `--max-total-tokens` (`_apply_token_constraints`); logged as `KV Cache is allocated.
//!   #tokens: N` and `max_total_num_tokens=N`. The cell is
//!   [`crate::tensor_parallel::kv_bytes_per_token`]: K and V of the rank's KV heads per layer, or
//!   MLA's one latent `kv_lora_rank + qk_rope_head_dim` per layer, replicated on every rank.
//!
//! `--mem-fraction-static`'s default depends on the GPU ([`default_settings`]), and with it the
//! chunked prefill size and the CUDA-graph batch sizes. The request pool (`req_to_token`, one
//! int32 row of `context_len` slots per request) is allocated beside the KV cache out of the same
//! static budget; the CUDA graphs are captured afterwards out of the slack.

use super::vllm_quant;
use crate::tensor_parallel::{kv_bytes_per_token, shard_bytes};
use crate::workload::{Engine, Quant, Workload};
use serde::Serialize;
use std::borrow::Cow;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::Device;
use vramplan_profiles::model::{AttentionKind, ModelDescription};

use super::activation_dtype;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Memory the distributed environment takes before SGLang's baseline at TP ≥ 2 when custom
/// all-reduce runs (NVLink, or two PCIe GPUs): 2.01 GB, the median of the eight ranks' `Init torch
/// distributed ends. mem usage=` on 8×H200 in sgl-project/sglang PR #11716's log (1.77 to 2.01).
pub const DISTRIBUTED_INIT_CUSTOM_AR_BYTES: u64 = GIB * 201 / 100;

/// The same without custom all-reduce (more than two PCIe-only GPUs, where SGLang logs "Custom
/// allreduce is disabled because it's not supported on more than two PCIe-only GPUs"): NCCL's
/// communicators alone, 0.13 GB on 4×L4 (the QwQ-32B log in `fixtures/published/sglang`).
pub const DISTRIBUTED_INIT_NCCL_BYTES: u64 = GIB * 13 / 100;

/// SGLang's defaults for one GPU size (`arg_groups/memory_hook.py`,
/// `handle_gpu_memory_settings`), from `nvidia-smi`'s total in MiB.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Defaults {
    /// `--chunked-prefill-size`: 2048 under 20 GiB, 4096 under 60 GiB, 8192 under 160 GiB, 16384
    /// above.
    pub chunked_prefill_size: u64,
    /// The decode CUDA graphs' largest batch (`--cuda-graph-max-bs`).
    pub cuda_graph_max_bs: u64,
    /// The decode batch sizes captured (`generate_decode_cuda_graph_batch_sizes`).
    pub cuda_graph_bs: Vec<u64>,
    /// The prefill token counts captured (`generate_prefill_cuda_graph_batch_sizes`).
    pub prefill_graph_tokens: Vec<u64>,
    /// What the default fraction keeps outside the static memory, MiB: 512 + 1.5 × max(chunked
    /// prefill, 2048) + TP × PP / 8 × 1024 + the graphs' reserve, at least 10 GiB on GPUs over 60
    /// GiB.
    pub reserved_mib: f64,
    /// `--mem-fraction-static`'s default: `round((gpu_mem − reserved) / gpu_mem, 3)`.
    pub mem_fraction_static: f64,
}

/// SGLang's GPU-dependent defaults for a GPU whose `nvidia-smi` total is `gpu_mem_mib`, at
/// tensor-parallel size `tp` (pipeline size 1), for a standard-attention or MLA model. The CUDA
/// graphs' reserve (`reserve_for_graph_mb`): 2 MiB per decode batch of the largest, and 8 MiB per
/// captured prefill size (1.5 GiB under MLA).
pub fn default_settings(gpu_mem_mib: f64, tp: u32, mla: bool) -> Defaults {
    let small_tp = tp < 4;
    let (chunked, max_bs) = if gpu_mem_mib < 20.0 * 1024.0 {
        (2048, 8)
    } else if gpu_mem_mib < 35.0 * 1024.0 {
        (4096, if small_tp { 48 } else { 160 })
    } else if gpu_mem_mib < 60.0 * 1024.0 {
        (4096, if small_tp { 32 } else { 160 })
    } else if gpu_mem_mib < 160.0 * 1024.0 {
        (8192, if small_tp { 256 } else { 512 })
    } else {
        (16384, 512)
    };
    let cuda_graph_bs = decode_graph_batch_sizes(max_bs);
    let prefill_max = if mla { chunked.min(8192) } else { chunked };
    let prefill_graph_tokens = prefill_graph_token_counts(prefill_max);
    let activation_tokens = chunked.max(2048) as f64;
    let mut reserved = 512.0 + activation_tokens * 1.5 + f64::from(tp) / 8.0 * 1024.0;
    reserved += max_bs as f64 * 2.0;
    reserved += if mla { 1.5 * 1024.0 } else { prefill_graph_tokens.len() as f64 * 8.0 };
    if gpu_mem_mib > 60.0 * 1024.0 {
        reserved = reserved.max(10.0 * 1024.0);
    }
    let fraction = ((gpu_mem_mib - reserved) / gpu_mem_mib * 1000.0).round() / 1000.0;
    Defaults {
        chunked_prefill_size: chunked,
        cuda_graph_max_bs: max_bs,
        cuda_graph_bs,
        prefill_graph_tokens,
        reserved_mib: reserved,
        mem_fraction_static: fraction,
    }
}

/// The decode batch sizes SGLang captures up to `max_bs`: 1, 2, 4, 8, 12, every 8 to 256, every
/// 16 to 512, every 32 above, and `max_bs` itself.
pub fn decode_graph_batch_sizes(max_bs: u64) -> Vec<u64> {
    let mut sizes: Vec<u64> = [1, 2, 4, 8, 12]
        .into_iter()
        .chain((16..=256).step_by(8))
        .chain((272..512).step_by(16))
        .chain((512..=max_bs.max(512)).step_by(32))
        .filter(|&bs| bs <= max_bs)
        .collect();
    if !sizes.contains(&max_bs) {
        sizes.push(max_bs);
    }
    sizes
}

/// The prefill token counts SGLang captures up to `max_tokens`.
pub fn prefill_graph_token_counts(max_tokens: u64) -> Vec<u64> {
    (4..=32)
        .step_by(4)
        .chain((48..=256).step_by(16))
        .chain((288..=512).step_by(32))
        .chain((576..=1024).step_by(64))
        .chain((1280..=4096).step_by(256))
        .chain((4608..=max_tokens.max(4608)).step_by(512))
        .filter(|&t| t <= max_tokens)
        .collect()
}

/// One rank's budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SglangBudget {
    /// Ranks in the tensor-parallel group (`--tp-size`).
    pub tensor_parallel: u32,
    /// Replicas of the group (`--dp-size`), each on its own `tp` GPUs.
    pub data_parallel: u32,
    /// The static fraction used: the flag's, or SGLang's default for the GPU.
    pub mem_fraction_static: f64,
    /// The GPU-dependent defaults (chunked prefill, CUDA-graph sizes, the default fraction).
    pub defaults: Defaults,
    /// Memory CUDA reports for the device.
    pub total_bytes: u64,
    /// The distributed environment's memory before the baseline (0 at TP 1).
    pub distributed_init_bytes: u64,
    /// Free memory before loading (`pre_model_load_memory`).
    pub pre_load_bytes: u64,
    /// The rank's weights as loaded.
    pub weights_bytes: u64,
    /// `pre × (1 − mem_fraction_static)`: kept for activations and CUDA graphs.
    pub slack_bytes: u64,
    /// The activations of one chunked-prefill forward on the rank (`chunked_prefill_size`
    /// tokens, the decode graphs' largest batch sampled), modelled as vLLM's profiling forward
    /// ([`super::vllm::activation_peak`]: the same fused layers), at most the slack.
    pub activation_peak_bytes: u64,
    /// Where that peak is.
    pub activation_peak_at: String,
    /// What is left for the token pool.
    pub kv_cache_bytes: u64,
    /// KV bytes of one token on this rank (`cell_size`).
    pub kv_bytes_per_token: u64,
    /// Tokens of the pool before `--max-total-tokens`.
    pub profiled_tokens: u64,
    /// `max_total_num_tokens`: the pool, capped by `--max-total-tokens`.
    pub max_total_num_tokens: u64,
    /// Request slots (`max_running_requests`, `resolve_max_num_reqs`): `tokens / context × 512`
    /// within 2048 to 4096, at most half the tokens.
    pub max_running_requests: u64,
    /// The request pool `req_to_token`: `(max_running_requests + 1) × context` int32 slots.
    pub req_to_token_bytes: u64,
    /// One request of `context_len` (the workload's `seq`) fits in the pool and the weights in
    /// the static budget.
    pub fits: bool,
}

/// SGLang's budget for `model` on one `device` of a `tp`-way group under `workload`, whose engine
/// must be [`Engine::Sglang`]. `custom_all_reduce` says whether the group runs SGLang's custom
/// all-reduce (NVLink, or two GPUs), which sizes the distributed environment.
pub fn budget(
    model: &ModelDescription,
    device: &Device,
    workload: &Workload,
    tp: u32,
    custom_all_reduce: bool,
) -> Result<SglangBudget, InputError> {
    let Engine::Sglang { mem_fraction_static, max_total_tokens, dp_size, ep_size } = workload.engine else {
        return Err(InputError::new("workload", "the engine is not SGLang")
            .at_key("engine.kind")
            .with_fix("set `engine: {kind: sglang}`"));
    };
    check(model, tp, dp_size.unwrap_or(1), ep_size.unwrap_or(1), mem_fraction_static)?;
    let act_dtype = activation_dtype(model, workload.weight_dtype);
    let kv_dtype = workload.kv_dtype.unwrap_or(act_dtype);
    let cast: Cow<ModelDescription> = match workload.weight_dtype {
        Some(dtype) if dtype != model.dtype => Cow::Owned(model.cast(dtype)),
        _ => Cow::Borrowed(model),
    };
    // fp8, GPTQ, AWQ and checkpoints' own quantizations: SGLang loads them with the kernels vLLM
    // holds them with (`sglang/srt/layers/quantization`), so they are held as vLLM holds them.
    if matches!(workload.quant, Quant::Int8 | Quant::Nf4 { .. } | Quant::Fp4 { .. } | Quant::Gguf { .. }) {
        return Err(InputError::new("--quant", "bitsandbytes and GGUF weights under SGLang are not sized")
            .with_fix("use `--quant fp8`, `gptq` or `awq`, or `--engine vllm` / `llama.cpp`"));
    }
    vllm_quant::check(model, &workload.quant, device, act_dtype)?;
    let weights: Cow<ModelDescription> = match vllm_quant::held(&cast, &workload.quant, device, act_dtype)? {
        Some(held) => Cow::Owned(held.model),
        None => cast,
    };
    let mla = matches!(model.facts.attention, AttentionKind::MultiLatent { .. });
    let gpu_mem_mib = device.memory_bytes as f64 / MIB as f64;
    let defaults = default_settings(gpu_mem_mib, tp, mla);
    let fraction = mem_fraction_static.unwrap_or(defaults.mem_fraction_static);

    let total_bytes = device.memory_bytes.saturating_sub(device.driver_reserve_bytes);
    let distributed_init_bytes = match (tp > 1, custom_all_reduce) {
        (false, _) => 0,
        (true, true) => DISTRIBUTED_INIT_CUSTOM_AR_BYTES,
        (true, false) => DISTRIBUTED_INIT_NCCL_BYTES,
    };
    let pre_load_bytes =
        total_bytes.saturating_sub(device.context_reserve_bytes).saturating_sub(distributed_init_bytes);
    let weights_bytes = shard_bytes(&weights, tp);
    let slack_bytes = (pre_load_bytes as f64 * (1.0 - fraction)).round() as u64;
    let (activation_peak_bytes, activation_peak_at) = super::vllm::activation_peak(
        model,
        tp,
        act_dtype,
        defaults.chunked_prefill_size,
        defaults.cuda_graph_max_bs,
    );
    let activation_peak_bytes = activation_peak_bytes.min(slack_bytes);
    let kv_cache_bytes = pre_load_bytes.saturating_sub(weights_bytes).saturating_sub(slack_bytes);
    let cell = kv_bytes_per_token(model, tp, kv_dtype).max(1);
    let profiled_tokens = kv_cache_bytes / cell;
    let max_total_num_tokens = max_total_tokens.map_or(profiled_tokens, |cap| cap.min(profiled_tokens));
    let context = if workload.seq > 0 { workload.seq } else { model.facts.max_positions.max(1) };
    let estimated = (max_total_num_tokens as f64 / context as f64 * 512.0) as u64;
    let max_running_requests = estimated.clamp(2048, 4096).min(max_total_num_tokens / 2);
    let req_to_token_bytes = (max_running_requests + 1).saturating_mul(context).saturating_mul(4);
    let fits = max_total_num_tokens >= context && max_total_num_tokens > 0;
    Ok(SglangBudget {
        tensor_parallel: tp,
        data_parallel: dp_size.unwrap_or(1).max(1),
        mem_fraction_static: fraction,
        defaults,
        total_bytes,
        distributed_init_bytes,
        pre_load_bytes,
        weights_bytes,
        slack_bytes,
        activation_peak_bytes,
        activation_peak_at,
        kv_cache_bytes,
        kv_bytes_per_token: cell,
        profiled_tokens,
        max_total_num_tokens,
        max_running_requests,
        req_to_token_bytes,
        fits,
    })
}

/// What SGLang itself refuses: a fraction outside (0, 1); attention heads that do not split over
/// `--tp-size` (`QKVParallelLinear`), KV heads that neither split nor replicate evenly; an
/// `--ep-size` above 1 other than `--tp-size` (`arg_groups/parallel_hook.py`: "ep_size *
/// moe_dp_size must be equal to tp_size"), or one for a model without experts.
pub fn check(
    model: &ModelDescription,
    tp: u32,
    dp: u32,
    ep: u32,
    fraction: Option<f64>,
) -> Result<(), InputError> {
    if let Some(f) = fraction
        && !(f > 0.0 && f < 1.0)
    {
        return Err(InputError::new("--mem-fraction-static", format!("{f} is not a fraction in (0, 1)"))
            .with_fix("leave it out for SGLang's default by GPU size, or use a value such as 0.85"));
    }
    if tp == 0 || dp == 0 || ep == 0 {
        return Err(InputError::new("--tp-size", "0 ranks").with_fix("use 1 or more GPUs per group"));
    }
    let tp64 = u64::from(tp);
    let heads = model.facts.num_attention_heads;
    if heads > 0 && !heads.is_multiple_of(tp64) {
        return Err(InputError::new(
            "--tp-size",
            format!("{heads} attention heads do not split over {tp} ranks; SGLang requires a divisor"),
        )
        .with_fix(format!("use a tensor-parallel size that divides {heads}")));
    }
    let kv = model.facts.num_kv_heads.max(1);
    let standard = model.facts.attention == AttentionKind::Standard;
    if standard && ((kv >= tp64 && !kv.is_multiple_of(tp64)) || (kv < tp64 && !tp64.is_multiple_of(kv))) {
        return Err(InputError::new(
            "--tp-size",
            format!("{kv} KV heads neither split over nor replicate evenly across {tp} ranks"),
        )
        .with_fix(format!("use a tensor-parallel size that divides {kv} or is a multiple of it")));
    }
    if ep > 1 {
        if model.facts.moe.is_none() {
            return Err(InputError::new("--ep-size", "expert parallelism for a model without experts")
                .with_fix("leave --ep-size out"));
        }
        if ep != tp {
            return Err(InputError::new(
                "--ep-size",
                format!("ep_size {ep} with tp_size {tp}: SGLang requires ep_size * moe_dp_size == tp_size"),
            )
            .with_fix(format!("use --ep-size {tp}, or --ep-size 1")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `round((gpu_mem − reserved) / gpu_mem, 3)` worked by hand from `memory_hook.py` for the
    /// `nvidia-smi` totals of the catalog's GPUs.
    #[test]
    fn default_fraction_by_gpu_size() {
        // H100 80GB (81559 MiB), TP 1: reserved = max(512 + 12288 + 128 + 512 + 58 × 8, 10240)
        // = 13904 → (81559 − 13904) / 81559 = 0.8295 → 0.830.
        let h100 = default_settings(81559.0, 1, false);
        assert_eq!(h100.chunked_prefill_size, 8192);
        assert_eq!(h100.cuda_graph_max_bs, 256);
        assert_eq!(h100.prefill_graph_tokens.len(), 58);
        assert_eq!(h100.reserved_mib, 13904.0);
        assert_eq!(h100.mem_fraction_static, 0.830);
        // H100, TP 8: 512 + 12288 + 1024 + 1024 + 464 = 15312 → 0.812.
        assert_eq!(default_settings(81559.0, 8, false).mem_fraction_static, 0.812);
        // L4 (23034 MiB), TP 1: 512 + 6144 + 128 + 96 + 50 × 8 = 7280 → 0.684.
        let l4 = default_settings(23034.0, 1, false);
        assert_eq!((l4.chunked_prefill_size, l4.cuda_graph_max_bs), (4096, 48));
        assert_eq!(l4.prefill_graph_tokens.len(), 50);
        assert_eq!(l4.mem_fraction_static, 0.684);
        // T4 (15360 MiB): 512 + 3072 + 128 + 16 + 42 × 8 = 4064 → 0.735.
        let t4 = default_settings(15360.0, 1, false);
        assert_eq!((t4.chunked_prefill_size, t4.cuda_graph_max_bs), (2048, 8));
        assert_eq!(t4.mem_fraction_static, 0.735);
        // A100 40GB (40960 MiB), TP 4: 512 + 6144 + 512 + 320 + 400 = 7888 → 0.807.
        assert_eq!(default_settings(40960.0, 4, false).mem_fraction_static, 0.807);
        // H200 (143771 MiB), MLA, TP 8: 512 + 12288 + 1024 + 1024 + 1536 = 16384 → 0.886.
        assert_eq!(default_settings(143771.0, 8, true).mem_fraction_static, 0.886);
    }

    #[test]
    fn capture_lists_follow_sglang() {
        let decode = decode_graph_batch_sizes(256);
        assert_eq!(&decode[..6], &[1, 2, 4, 8, 12, 16]);
        assert_eq!(decode.len(), 5 + 31);
        assert_eq!(decode.last(), Some(&256));
        let wide = decode_graph_batch_sizes(512);
        assert_eq!(wide.len(), 5 + 31 + 15 + 1);
        assert_eq!(decode_graph_batch_sizes(48).last(), Some(&48));
        assert_eq!(prefill_graph_token_counts(2048).len(), 8 + 14 + 8 + 8 + 4);
    }
}
