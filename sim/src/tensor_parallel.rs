//! Tensor parallelism as vLLM (and Megatron) shards a model: what one rank of a `tp`-way
//! tensor-parallel group holds, and how many KV-cache bytes each token costs it.
//!
//! Every tensor of the description is classified by the module that owns it:
//! - column-parallel linears (`q_proj`, `gate_proj`, `up_proj`, `w1`, `w3`, `fc1`, `q_b_proj`,
//!   `kv_b_proj`, …) split their output features, biases included;
//! - row-parallel linears (`o_proj`, `down_proj`, `w2`, `fc2`, `c_proj`, `dense`, …) split their
//!   input features; their biases are replicated (vLLM adds the bias once, after the all-reduce);
//! - `k_proj` / `v_proj` split by KV head, and when there are fewer KV heads than ranks each rank
//!   keeps one whole head (vLLM's `QKVParallelLinear` replicates them: `num_kv_head_replicas`);
//!   fused QKV projections (`qkv_proj`, `query_key_value`, `c_attn`, `Wqkv`) split the same way;
//! - the token embedding and the LM head are vocab-parallel: the vocabulary is padded to a
//!   multiple of 64 × `tp` and each rank holds `padded / tp` rows (vLLM's
//!   `VocabParallelEmbedding` / `ParallelLMHead`, `DEFAULT_VOCAB_PADDING_SIZE = 64`);
//! - routed experts are split on their intermediate dimension (vLLM's `FusedMoE` without expert
//!   parallelism: `intermediate_size_per_partition = intermediate / tp`); the biases of their
//!   down projections are replicated;
//! - norms, routers (`ReplicatedLinear`), MLA's down projections (`q_a_proj`,
//!   `kv_a_proj_with_mqa`, `ReplicatedLinear` in vLLM's DeepSeek code), position embeddings,
//!   buffers and every linear this module does not recognise are replicated, which errs on the
//!   side of more memory.
//!
//! Splitting works on bytes (`bytes × share`), so the same rule serves plain weights
//! (`[out, in]`), GPT-2's transposed `Conv1D`, and packed GPTQ/AWQ tensors whose layout differs.
//! Uneven splits round up: the first rank, which holds the most, is the one reported.

use vramplan_profiles::DType;
use vramplan_profiles::model::{AttentionKind, ModelDescription, Module, ModuleKind, StackKind, Tensor};

/// vLLM pads the vocabulary of parallel embeddings to a multiple of this many rows
/// (`DEFAULT_VOCAB_PADDING_SIZE`, vllm/model_executor/layers/vocab_parallel_embedding.py).
pub const VOCAB_PADDING: u64 = 64;

/// How one tensor is divided over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    Replicated,
    /// Split evenly `tp` ways (column- or row-parallel, or the intermediate of experts).
    Even,
    /// Split by KV head, a whole head per rank at least.
    KvHeads,
    /// A fused Q/K/V projection: query heads split, KV heads as in `KvHeads`.
    FusedQkv,
    /// Vocab-parallel rows, padded to `VOCAB_PADDING × tp`.
    Vocab,
}

/// Bytes of weights (parameters, quantization constants and buffers, tied tensors once) that one
/// rank of a `tp`-way tensor-parallel group holds: the largest rank when the split is uneven.
/// `tp` 0 is read as 1.
pub fn shard_bytes(model: &ModelDescription, tp: u32) -> u64 {
    shard_bytes_expert_parallel(model, tp, ExpertSplit::Intermediate(tp))
}

/// How a rank holds the routed experts, where it differs from the tensor-parallel split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertSplit {
    /// Each expert split on its intermediate dimension over this many ranks: vLLM's `FusedMoE`
    /// flattens its tensor-parallel group across data parallel (`tp × dp`,
    /// `FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp`), with or without data parallel.
    Intermediate(u32),
    /// The experts spread whole over this many ranks (`--enable-expert-parallel`:
    /// `ep = tp × dp`, `ceil(experts / ep)` each, `determine_expert_map`).
    Whole(u32),
}

/// As [`shard_bytes`], with the routed experts held as `experts` says (the tensor-parallel
/// split is `ExpertSplit::Intermediate(tp)`).
pub fn shard_bytes_expert_parallel(model: &ModelDescription, tp: u32, experts: ExpertSplit) -> u64 {
    let tp = u64::from(tp.max(1));
    let mut total = 0u64;
    visit_with_parent(&model.root, None, &mut |module, parent| {
        for tensor in module.tensors.iter().filter(|t| t.tied_to.is_none()) {
            let split = classify(model, module, parent, tensor);
            let bytes = match (module.kind, experts) {
                (ModuleKind::Experts { count }, ExpertSplit::Whole(ep)) => {
                    let count = u64::from(count.max(1));
                    scaled(tensor.bytes(), count.div_ceil(u64::from(ep.max(1))), count)
                }
                (ModuleKind::Experts { .. }, ExpertSplit::Intermediate(n)) => {
                    rank_bytes(model, tensor, split, u64::from(n.max(1)))
                }
                _ => rank_bytes(model, tensor, split, tp),
            };
            total = total.saturating_add(bytes);
        }
    });
    total
}

/// Why vLLM refuses to shard `model` over `tp` ranks, if it does (SGLang's layers are vLLM's and
/// refuse the same): the attention heads must divide (`num_heads % tp_size == 0`), the KV heads
/// must divide or be divided (`total_num_kv_heads % tp == 0` or `tp % total_num_kv_heads == 0`,
/// `LlamaAttention`), and the MLP's and each expert's intermediate features must divide
/// (`divide(output_size, tp_size)` of the column-parallel linears).
pub fn serving_tp_refusal(model: &ModelDescription, tp: u32) -> Option<String> {
    let tp = u64::from(tp.max(1));
    let facts = &model.facts;
    let heads = facts.num_attention_heads;
    let kv = facts.num_kv_heads;
    if heads > 0 && !heads.is_multiple_of(tp) {
        return Some(format!(
            "tensor parallelism over {tp} GPUs does not divide the {heads} attention heads"
        ));
    }
    if kv > 0 && !kv.is_multiple_of(tp) && !tp.is_multiple_of(kv) {
        return Some(format!(
            "tensor parallelism over {tp} GPUs neither divides the {kv} KV heads nor is a multiple of them"
        ));
    }
    let expert = facts.moe.as_ref().map_or(0, |m| m.expert_intermediate_size);
    for (what, size) in [("MLP", facts.intermediate_size), ("expert", expert)] {
        if size > 0 && !size.is_multiple_of(tp) {
            return Some(format!(
                "tensor parallelism over {tp} GPUs does not divide the {size} {what} features"
            ));
        }
    }
    None
}

/// KV heads one rank holds: `kv_heads / tp`, and one (a replica) when `tp` exceeds the KV heads.
pub fn kv_heads_per_rank(model: &ModelDescription, tp: u32) -> u64 {
    let tp = u64::from(tp.max(1));
    let kv = model.facts.num_kv_heads.max(1);
    kv.div_ceil(tp).max(1)
}

/// Query heads one rank holds (`heads / tp`, rounded up).
pub fn query_heads_per_rank(model: &ModelDescription, tp: u32) -> u64 {
    model.facts.num_attention_heads.div_ceil(u64::from(tp.max(1)))
}

/// Rows of a vocab-parallel embedding on one rank: the vocabulary padded to a multiple of
/// `VOCAB_PADDING × tp`, divided by `tp`.
pub fn padded_vocab_per_rank(vocab: u64, tp: u32) -> u64 {
    let tp = u64::from(tp.max(1));
    let multiple = VOCAB_PADDING * tp;
    vocab.div_ceil(multiple).saturating_mul(multiple) / tp
}

/// KV-cache bytes one token costs one rank, over all decoder layers, with elements of
/// `kv_dtype`:
/// - standard attention: `2 × kv_heads_per_rank × head_dim` values per layer (K and V);
/// - multi-head latent attention (DeepSeek): `kv_lora_rank + qk_rope_head_dim` values per layer,
///   the compressed latent and the rotary key, held whole on every rank (vLLM's MLA backends do
///   not split the latent over tensor-parallel ranks).
pub fn kv_bytes_per_token(model: &ModelDescription, tp: u32, kv_dtype: DType) -> u64 {
    let layers = decoder_layers(model);
    let values_per_layer = match model.facts.attention {
        AttentionKind::MultiLatent { kv_lora_rank, qk_rope_head_dim, .. } => kv_lora_rank + qk_rope_head_dim,
        AttentionKind::Standard => 2 * kv_heads_per_rank(model, tp) * model.facts.head_dim,
    };
    kv_dtype.bytes_for(values_per_layer.saturating_mul(layers))
}

/// Decoder blocks, the ones that keep a KV cache.
pub fn decoder_layers(model: &ModelDescription) -> u64 {
    model.facts.layers.iter().filter(|l| l.stack == StackKind::Decoder).count() as u64
}

/// Calls `f` on every module with its parent, parents first.
fn visit_with_parent<'a>(
    module: &'a Module,
    parent: Option<&'a Module>,
    f: &mut dyn FnMut(&'a Module, Option<&'a Module>),
) {
    f(module, parent);
    for child in &module.children {
        visit_with_parent(child, Some(module), f);
    }
}

/// Column-parallel linears: their output features are split.
const COLUMN: &[&str] = &[
    "q_proj",
    "gate_proj",
    "up_proj",
    "gate_up_proj",
    "w1",
    "w3",
    "fc1",
    "c_fc",
    "fc_in",
    "dense_h_to_4h",
    "q_b_proj",
    "kv_b_proj",
    "query",
];

/// Row-parallel linears: their input features are split, the bias is replicated.
const ROW: &[&str] =
    &["o_proj", "down_proj", "w2", "fc2", "c_proj", "fc_out", "dense_4h_to_h", "dense", "out_proj", "wo"];

/// Per-head key and value projections.
const KV: &[&str] = &["k_proj", "v_proj", "key", "value"];

/// Fused query-key-value projections.
const FUSED_QKV: &[&str] = &["qkv_proj", "query_key_value", "c_attn", "Wqkv", "wqkv"];

/// Vocab-parallel output heads.
const LM_HEADS: &[&str] = &["lm_head", "embed_out"];

fn is_bias(tensor: &Tensor) -> bool {
    tensor.name == "bias" || tensor.name.ends_with("_bias")
}

fn classify(model: &ModelDescription, module: &Module, parent: Option<&Module>, tensor: &Tensor) -> Split {
    if matches!(tensor.kind, vramplan_profiles::model::TensorKind::Buffer { .. }) {
        return Split::Replicated;
    }
    let name = module.name();
    match module.kind {
        ModuleKind::Embedding => {
            // Only the token embedding is vocab-parallel; position and type embeddings are
            // replicated.
            if tensor.shape.first() == Some(&model.facts.vocab_size) {
                Split::Vocab
            } else {
                Split::Replicated
            }
        }
        ModuleKind::Experts { .. } => {
            // Fused expert tensors: gate/up and down all split on the intermediate dimension; a
            // down projection's bias lives on the hidden dimension and is replicated.
            if is_bias(tensor) && tensor.name.contains("down") { Split::Replicated } else { Split::Even }
        }
        ModuleKind::Linear => {
            let parent_is_top = parent.is_none_or(|p| p.path.is_empty());
            if LM_HEADS.contains(&name) && parent_is_top {
                Split::Vocab
            } else if KV.contains(&name) {
                Split::KvHeads
            } else if FUSED_QKV.contains(&name) {
                Split::FusedQkv
            } else if COLUMN.contains(&name) {
                Split::Even
            } else if ROW.contains(&name) {
                if is_bias(tensor) { Split::Replicated } else { Split::Even }
            } else {
                Split::Replicated
            }
        }
        ModuleKind::Norm
        | ModuleKind::Router
        | ModuleKind::Container
        | ModuleKind::Block
        | ModuleKind::Other => Split::Replicated,
    }
}

/// `bytes × numerator / denominator`, rounded up, without overflow.
fn scaled(bytes: u64, numerator: u64, denominator: u64) -> u64 {
    if denominator == 0 {
        return bytes;
    }
    let value = (u128::from(bytes) * u128::from(numerator)).div_ceil(u128::from(denominator));
    u64::try_from(value).unwrap_or(u64::MAX)
}

fn rank_bytes(model: &ModelDescription, tensor: &Tensor, split: Split, tp: u64) -> u64 {
    let bytes = tensor.bytes();
    if tp == 1 && split != Split::Vocab {
        return bytes;
    }
    let facts = &model.facts;
    let heads = facts.num_attention_heads.max(1);
    let kv = facts.num_kv_heads.max(1);
    let kv_rank = kv.div_ceil(tp).max(1);
    match split {
        Split::Replicated => bytes,
        Split::Even => bytes.div_ceil(tp),
        Split::KvHeads => scaled(bytes, kv_rank, kv),
        Split::FusedQkv => {
            let heads_rank = heads.div_ceil(tp);
            scaled(bytes, heads_rank + 2 * kv_rank, heads + 2 * kv)
        }
        Split::Vocab => {
            let rows = tensor.shape.first().copied().unwrap_or(0);
            scaled(bytes, padded_vocab_per_rank(rows, u32::try_from(tp).unwrap_or(u32::MAX)), rows)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_padding_rounds_to_64_times_tp() {
        assert_eq!(padded_vocab_per_rank(32000, 1), 32000);
        assert_eq!(padded_vocab_per_rank(32001, 1), 32064);
        assert_eq!(padded_vocab_per_rank(50257, 2), 25152); // 50304 / 2
        assert_eq!(padded_vocab_per_rank(151936, 8), 19008); // 152064 / 8
    }
}
