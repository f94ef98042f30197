//! vLLM's reservations beyond weights, activations and the KV cache (vLLM 0.19), read from the
//! workload's [`VllmOptions`]:
//!
//! - **CUDA graphs**: the batch sizes vLLM captures ([`capture_sizes`], `VllmConfig.
//!   _set_cudagraph_sizes`, vllm/config/vllm.py) and the memory the capture holds
//!   ([`cuda_graph_bytes`]): none under `--enforce-eager`, else the measured
//!   [`super::vllm::CUDA_GRAPH_BYTES`] (vLLM 0.19 does not estimate it before the KV cache unless
//!   `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`; the figure is the llm-d-planner campaign's
//!   median of `Graph capturing finished … took X GiB`, for the default 51 sizes up to 512);
//! - **LoRA slots** (`--enable-lora --max-loras N --max-lora-rank R`): vLLM replaces every linear
//!   layer of the decoder with a LoRA layer that preallocates `lora_a_stacked` (`N × 1 × R × in`)
//!   and `lora_b_stacked` (`N × 1 × out × R`) per output slice, in the model dtype
//!   (`create_lora_weights`, vllm/lora/layers/: `ColumnParallelLinearWithLoRA`,
//!   `MergedColumnParallelLinearWithLoRA`, `MergedQKVParallelLinearWithLoRA`,
//!   `RowParallelLinearWithLoRA`); column-parallel layers keep `lora_a` whole and shard
//!   `lora_b`, row-parallel layers shard `lora_a` and keep `lora_b` whole. They are allocated
//!   while loading (`create_lora_manager` in `load_model`), so vLLM counts them as weights.
//!   The punica metadata ([`punica_metadata_bytes`], vllm/lora/punica_wrapper/punica_base.py and
//!   punica_gpu.py) is index tensors over the batched tokens and sequences;
//! - **`--kv-cache-memory-bytes`**: `Worker.determine_available_memory` returns the given bytes
//!   for the KV cache instead of profiling (`gpu_memory_utilization` is then not read);
//! - **`--max-model-len auto`** (-1): `_auto_fit_max_model_len` (vllm/v1/core/kv_cache_utils.py)
//!   takes the largest length whose blocks fit the KV cache, capped at the model's positions;
//! - **speculative decoding** (`--speculative-config`, [`drafter`]): the proposer is loaded with
//!   the model (`drafter.load_model` in `GPUModelRunner.load_model`) and its attention layers get
//!   KV-cache pages beside the model's, every page of a block holding all layers
//!   (`get_kv_cache_config`, vllm/v1/core/kv_cache_utils.py): a draft model's whole weights and
//!   KV (the same budget's terms for its own config), an EAGLE head's one decoder layer and
//!   `fc`, an MTP module's layers. n-gram proposers hold nothing.

use crate::tensor_parallel::{
    kv_bytes_per_token, kv_heads_per_rank, padded_vocab_per_rank, query_heads_per_rank, shard_bytes,
};
use crate::workload::{Speculative, VllmOptions};
use serde::Serialize;
use vramplan_profiles::model::{self, AttentionKind, ImportOptions, ModelDescription, StackKind};
use vramplan_profiles::{DType, InputError};

/// `--max-lora-rank`'s default (`LoRAConfig.max_lora_rank`, vllm/config/lora.py).
pub const DEFAULT_MAX_LORA_RANK: u64 = 16;

/// The ranks vLLM accepts for `--max-lora-rank` (`LoRAConfig.max_lora_rank`'s
/// `MaxLoRARanks` literal, vllm/config/lora.py).
pub const LORA_RANKS: [u64; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];

/// The largest batch vLLM captures by default (`min(max_num_seqs × 2, 512)`).
pub const MAX_CAPTURE_SIZE: u64 = 512;

/// Bytes of a `torch.long` and a `torch.int32`.
const I64: u64 = 8;
const I32: u64 = 4;

/// The batch sizes vLLM 0.19 captures CUDA graphs for with the default compilation config:
/// `[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)` up to `max = min(max_num_seqs ×
/// decode_query_len × 2, 512)` (`decode_query_len` = 1 + `num_speculative_tokens`), capped at
/// `max_num_batched_tokens` (`VllmConfig._set_cudagraph_sizes`); none under `--enforce-eager`.
pub fn capture_sizes(
    max_num_seqs: u64,
    decode_query_len: u64,
    max_num_batched_tokens: u64,
    enforce_eager: bool,
) -> Vec<u64> {
    if enforce_eager {
        return Vec::new();
    }
    let max = max_num_seqs
        .saturating_mul(decode_query_len.max(1))
        .saturating_mul(2)
        .min(MAX_CAPTURE_SIZE)
        .min(max_num_batched_tokens)
        .max(1);
    [1, 2, 4]
        .into_iter()
        .chain((8..256).step_by(8))
        .chain((256..=max.max(256)).step_by(16))
        .filter(|&size| size <= max)
        .collect()
}

/// Memory the captured CUDA graphs hold: 0 without captures (`--enforce-eager`), else the
/// measured [`super::vllm::CUDA_GRAPH_BYTES`].
pub fn cuda_graph_bytes(sizes: &[u64]) -> u64 {
    if sizes.is_empty() { 0 } else { super::vllm::CUDA_GRAPH_BYTES }
}

/// `--max-lora-rank` as vLLM reads it: 0 stands for the default 16.
pub fn lora_rank(options: &VllmOptions) -> u64 {
    if options.max_lora_rank == 0 { DEFAULT_MAX_LORA_RANK } else { options.max_lora_rank }
}

/// The refusals of vLLM's `LoRAConfig` and the models this module does not size.
pub fn check(model: &ModelDescription, options: &VllmOptions) -> Result<(), InputError> {
    if options.data_parallel_size == Some(0) {
        return Err(InputError::new("workload", "0 data-parallel replicas")
            .at_key("vllm.data_parallel_size")
            .with_fix("use 1 or more (vLLM's default is 1)"));
    }
    if options.max_loras == 0 {
        return Ok(());
    }
    let rank = lora_rank(options);
    if !LORA_RANKS.contains(&rank) {
        return Err(InputError::new("--max-lora-rank", format!("rank {rank} is not one vLLM accepts"))
            .with_fix(format!("use one of {LORA_RANKS:?} (vLLM's MaxLoRARanks)")));
    }
    if model.facts.moe.is_some() || !matches!(model.facts.attention, AttentionKind::Standard) {
        return Err(InputError::new(
            "--max-loras",
            "LoRA slots are sized for dense models with standard attention; MoE experts' and MLA's LoRA layers are not modelled",
        )
        .with_fix("leave --max-loras out for this model"));
    }
    Ok(())
}

/// Bytes of the LoRA slots one rank of a `tp`-way group preallocates: `N × R × b × Σ(in + out)`
/// over the output slices of every decoder linear (q, k, v, o, gate, up, down), with the
/// column-parallel layers' outputs and the row-parallel layers' inputs divided by `tp` (per-rank
/// heads for q, k and v); 0 without `--max-loras`.
pub fn lora_slot_bytes(model: &ModelDescription, options: &VllmOptions, tp: u32, dtype: DType) -> u64 {
    if options.max_loras == 0 {
        return 0;
    }
    let facts = &model.facts;
    let tp64 = u64::from(tp.max(1));
    let h = facts.hidden_size;
    let q = query_heads_per_rank(model, tp) * facts.head_dim;
    let kv = kv_heads_per_rank(model, tp) * facts.head_dim;
    let i = facts.intermediate_size.div_ceil(tp64);
    // Column-parallel slices: lora_a holds the whole input, lora_b the rank's outputs.
    let qkv = 3 * h + q + 2 * kv;
    // Row-parallel o_proj: lora_a the rank's inputs, lora_b the whole output.
    let o = q + h;
    let mlp = if facts.gated_mlp { 2 * (h + i) + (i + h) } else { (h + i) + (i + h) };
    let layers = facts.layers.iter().filter(|l| l.stack == StackKind::Decoder).count() as u64;
    let per_slot_rank = layers * (qkv + o + mlp);
    dtype.bytes_for(options.max_loras.saturating_mul(lora_rank(options)).saturating_mul(per_slot_rank))
}

/// Bytes of the punica wrapper's metadata for `tokens` batched tokens, `seqs` sequences and
/// `max_loras` slots: `PunicaWrapperBase`'s token, sampler and padded-sampler indices
/// (`3·T` int64), embedding indices (`2·T` int64) and per-sequence start, length and adapter
/// (`3·S` int64); `PunicaWrapperGPU`'s two `LoRAKernelMeta` (over the tokens and over the
/// sequences), each two int32 index rows and `3·(N+1)+1` int32 per-adapter counts. 0 without
/// LoRA.
pub fn punica_metadata_bytes(tokens: u64, seqs: u64, max_loras: u64) -> u64 {
    if max_loras == 0 {
        return 0;
    }
    let meta = |rows: u64| (2 * rows + 3 * (max_loras + 1) + 1) * I32;
    5 * tokens * I64 + 3 * seqs * I64 + meta(tokens) + meta(seqs)
}

/// The transient the LoRA shrink kernel adds to a linear of the profiling forward: its fp32
/// buffer of `slices × T × R` (`add_lora_linear`, vllm/lora/punica_wrapper/punica_gpu.py): three
/// slices for the fused q/k/v projection, two for the fused gate/up projection (one ungated).
pub fn lora_activation_bytes(options: &VllmOptions, tokens: u64, slices: u64) -> u64 {
    if options.max_loras == 0 {
        return 0;
    }
    slices * tokens * lora_rank(options) * 4
}

/// What a speculative proposer adds on one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drafter {
    /// vLLM's `method` (`draft_model`, `eagle`, `eagle3`, `mtp`, `ngram`).
    pub method: String,
    /// Its weights on this rank, loaded with the model.
    pub weights_bytes: u64,
    /// Its KV-cache bytes per token on this rank, held in the same blocks as the model's.
    pub kv_bytes_per_token: u64,
}

/// The proposer of `spec` for `model` on one rank of `tp` (`held`: the model's weights as vLLM
/// holds them; `dtype` the activation dtype, `kv_dtype` the KV cache's):
/// - `draft_model`: the draft's config loaded by name (a built-in config or a file), held in the
///   model's dtype, sharded over the same `tp` ranks ([`super::vllm::loaded_weights_bytes`]),
///   and its KV per token;
/// - `eagle` / `eagle3`: one decoder layer of the model's shapes (vLLM's `LlamaForCausalLMEagle`
///   / `Eagle3LlamaForCausalLM`: `num_hidden_layers` 1) with `fc` (`2H → H`; EAGLE-3 `3H → H`),
///   EAGLE-3's wider q/k/v input (`2H`) and its own LM head, sized at the model's vocabulary (a
///   head whose `draft_vocab_size` is smaller holds less); the embedding is shared; one layer of
///   KV;
/// - `mtp`: the checkpoint's multi-token-prediction layers (`num_nextn_predict_layers`, as the
///   importer reads them), each a copy of the last decoder layer as held, with `eh_proj`
///   (`2H → H`) and three norms; embedding and head shared; their layers' KV;
/// - `ngram` (and `suffix`): nothing on the GPU.
pub fn drafter(
    model: &ModelDescription,
    held: &ModelDescription,
    spec: &Speculative,
    tp: u32,
    dtype: DType,
    kv_dtype: DType,
) -> Result<Drafter, InputError> {
    let flag = "--speculative-config";
    if spec.num_speculative_tokens == 0 {
        return Err(InputError::new(flag, "num_speculative_tokens is 0")
            .with_fix("propose 1 or more tokens (`\"num_speculative_tokens\": 3`)"));
    }
    let method = spec.method.trim().to_ascii_lowercase();
    let facts = &model.facts;
    let h = facts.hidden_size;
    let layers = facts.layers.iter().filter(|l| l.stack == StackKind::Decoder).count() as u64;
    let kv_per_layer = kv_bytes_per_token(model, tp, kv_dtype).checked_div(layers).unwrap_or(0);
    let b = |n: u64| dtype.bytes_for(n);
    let (weights_bytes, kv) = match method.as_str() {
        "ngram" | "suffix" => (0, 0),
        "draft_model" => {
            let Some(name) = spec.model.as_deref() else {
                return Err(InputError::new(flag, "a draft_model without `model`")
                    .with_fix("name the draft model (`\"model\": \"llama-3.2-1b-instruct\"`)"));
            };
            let draft = model::load(name, ImportOptions::default()).map_err(|e| {
                InputError::new(flag, format!("the draft model `{name}`: {}", e.problem)).with_fix(
                    "name a built-in config (`vramplan profiles`) or a config.json the same way as MODEL",
                )
            })?;
            let draft = if draft.dtype == dtype { draft } else { draft.cast(dtype) };
            (
                super::vllm::loaded_weights_bytes(
                    &draft,
                    &draft,
                    tp,
                    crate::tensor_parallel::ExpertSplit::Intermediate(tp),
                    dtype,
                ),
                kv_bytes_per_token(&draft, tp, kv_dtype),
            )
        }
        "eagle" | "eagle3" => {
            if facts.moe.is_some() || !matches!(facts.attention, AttentionKind::Standard) {
                return Err(InputError::new(
                    flag,
                    "EAGLE heads are sized as one decoder layer of the model's shapes; an MoE or MLA model's head is not modelled",
                )
                .with_fix("use `\"method\": \"draft_model\"` with a draft model, or `ngram`"));
            }
            let first = facts.layers.iter().find(|l| l.stack == StackKind::Decoder).map(|l| l.path.as_str());
            let cast = if model.dtype == dtype { None } else { Some(model.cast(dtype)) };
            let layer = first.map_or(0, |path| layer_bytes(cast.as_ref().unwrap_or(model), path, tp));
            let extra = if method == "eagle3" {
                let qkv =
                    (query_heads_per_rank(model, tp) + 2 * kv_heads_per_rank(model, tp)) * facts.head_dim;
                b(h * qkv + 3 * h * h + padded_vocab_per_rank(facts.vocab_size, tp) * h)
            } else {
                b(2 * h * h)
            };
            (layer + extra, kv_per_layer)
        }
        "mtp" | "deepseek_mtp" => {
            let count = mtp_layers(model);
            let last =
                facts.layers.iter().rev().find(|l| l.stack == StackKind::Decoder).map(|l| l.path.as_str());
            let (Some(last), true) = (last, count > 0) else {
                return Err(InputError::new(
                    flag,
                    format!("{} has no multi-token-prediction layers", model.name),
                )
                .with_fix(
                    "use MTP with a checkpoint that has them (`num_nextn_predict_layers`), or another method",
                ));
            };
            let per_layer = layer_bytes(held, last, tp) + b(2 * h * h + 3 * h);
            (count * per_layer, count * kv_per_layer)
        }
        other => {
            return Err(InputError::new(flag, format!("unknown method `{other}`"))
                .with_fix("use one of `draft_model`, `eagle`, `eagle3`, `mtp`, `ngram`"));
        }
    };
    Ok(Drafter { method, weights_bytes, kv_bytes_per_token: kv })
}

/// One rank's bytes of the module at `path` (a decoder layer), split as the whole model is.
fn layer_bytes(model: &ModelDescription, path: &str, tp: u32) -> u64 {
    model.root.find(path).map_or(0, |module| {
        let layer = ModelDescription { root: module.clone(), ..model.clone() };
        shard_bytes(&layer, tp)
    })
}

/// The multi-token-prediction layers the importer found in the checkpoint's config
/// (`num_nextn_predict_layers`, recorded in its note; transformers does not build them).
fn mtp_layers(model: &ModelDescription) -> u64 {
    model
        .notes
        .iter()
        .find_map(|note| {
            let rest = note.split("also holds ").nth(1)?;
            let (count, tail) = rest.split_once(' ')?;
            tail.starts_with("multi-token-prediction").then(|| count.parse().ok()).flatten()
        })
        .unwrap_or(0)
}
