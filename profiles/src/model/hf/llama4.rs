//! `Llama4ForCausalLM` (Llama 4's text model: Scout, Maverick): a Llama-style decoder whose
//! feed-forward is, on the layers `moe_layers` names, a mixture of experts with a shared expert,
//! and elsewhere a dense gated MLP of `intermediate_size_mlp`.
//!
//! Module names (transformers 4.57 and 5.x alike, `models/llama4/modeling_llama4.py`):
//! `model.embed_tokens`, `model.layers.N.{self_attn.{q_proj, k_proj, v_proj, o_proj},
//! feed_forward, input_layernorm, post_attention_layernorm}`, `model.norm`, `model.rotary_emb`,
//! `lm_head`. A MoE `feed_forward` is `Llama4TextMoe`: `experts` (`Llama4TextExperts`, fused in
//! both versions: `gate_up_proj` `[E, H, 2I]` and `down_proj` `[E, I, H]`), `router` (an
//! `nn.Linear` subclass, `Llama4Router`) and `shared_expert` (`Llama4TextMLP` of
//! `intermediate_size`), created in that order. The q/k L2 norm (`use_qk_norm`, only on the layers
//! that rotate) has no parameters.
//!
//! Layers: `no_rope_layers[i]` is 1 where layer `i` applies the rotary embedding (absent or empty:
//! all but every `no_rope_layer_interval`-th); `layer_types` (when absent: the rotating layers are
//! `chunked_attention` where `attention_chunk_size` is set) says which attend within chunks of
//! `attention_chunk_size`. transformers' caches keep a chunked layer's keys and values as a sliding
//! window of the chunk size (`cache_utils.py`: `"chunked_attention": DynamicSlidingWindowLayer`,
//! built with `sliding_window = attention_chunk_size`), so a chunked layer's window is the chunk.
//!
//! Version differences: 4.57's `Llama4TextConfig` always sets `attention_bias` false (5.x reads
//! it), and 4.57's rotary module has no `original_inv_freq` buffer.

use super::HfConfig;
use super::llama::{BaseModel, causal_lm, finish, gated_mlp, layer_facts};
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, MoeFacts, Naming, NormKind,
};

/// `Llama4TextConfig`'s defaults (transformers 5.24 and 4.57 `configuration_llama4.py`), which
/// reproduce Llama-4-Scout-17B-16E.
const DEFAULT_VOCAB: u64 = 202_048;
const DEFAULT_HIDDEN: u64 = 5120;
const DEFAULT_INTERMEDIATE: u64 = 8192;
const DEFAULT_INTERMEDIATE_MLP: u64 = 16_384;
const DEFAULT_LAYERS: u64 = 48;
const DEFAULT_HEADS: u64 = 40;
const DEFAULT_KV_HEADS: u64 = 8;
const DEFAULT_HEAD_DIM: u64 = 128;
const DEFAULT_EXPERTS: u64 = 16;
const DEFAULT_CHUNK: u64 = 8192;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let layers = config.positive_or(&["num_hidden_layers"], DEFAULT_LAYERS)?;
    let hidden = config.positive_or(&["hidden_size"], DEFAULT_HIDDEN)?;
    let heads = config.positive_or(&["num_attention_heads"], DEFAULT_HEADS)?;
    // An explicit null means `hidden_size / num_attention_heads`, as the config class says.
    let head_dim = match config.object().get("head_dim") {
        None => DEFAULT_HEAD_DIM,
        Some(_) => config.head_dim(&["head_dim"], hidden, heads, "num_attention_heads")?,
    };
    // Null key/value heads mean one per attention head (`Llama4TextConfig.__post_init__`).
    let kv_heads = config.kv_heads(heads, DEFAULT_KV_HEADS)?;
    let vocab = config.positive_or(&["vocab_size"], DEFAULT_VOCAB)?;
    let expert_width = config.positive_or(&["intermediate_size"], DEFAULT_INTERMEDIATE)?;
    let dense_width = config.positive_or(&["intermediate_size_mlp"], DEFAULT_INTERMEDIATE_MLP)?;
    let experts = config.positive_or(&["num_local_experts"], DEFAULT_EXPERTS)?;
    let experts = u32::try_from(experts).map_err(|_| {
        InputError::new(config.origin(), format!("{experts} experts is more than any model has"))
            .at_key("num_local_experts")
    })?;
    let top_k = config.positive_or(&["num_experts_per_tok"], 1)?;
    if top_k > u64::from(experts) {
        return Err(InputError::new(
            config.origin(),
            format!("{top_k} experts per token, but only {experts} experts"),
        )
        .at_key("num_experts_per_tok")
        .with_fix("`num_experts_per_tok` is at most `num_local_experts`"));
    }
    let max_positions = config.positive_or(&["max_position_embeddings"], 4096 * 32)?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let bias = options.naming == Naming::V5 && config.bool_or(&["attention_bias"], false)?;
    let activation = config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into());
    let sparse = moe_layers(config, layers)?;
    let windows = chunk_windows(config, layers)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let list = "model.layers";
    let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
    let blocks = sparse
        .iter()
        .enumerate()
        .map(|(i, is_sparse)| {
            let path = format!("{list}.{i}");
            let attn = b.container(&path, "self_attn", "Llama4TextAttention");
            let p = attn.path.clone();
            let attn = attn
                .with_child(b.linear(&p, "q_proj", hidden, q_out, bias))
                .with_child(b.linear(&p, "k_proj", hidden, kv_out, bias))
                .with_child(b.linear(&p, "v_proj", hidden, kv_out, bias))
                .with_child(b.linear(&p, "o_proj", q_out, hidden, bias));
            let feed_forward = if *is_sparse {
                moe(&b, &path, hidden, expert_width, experts)
            } else {
                gated_mlp(&b, &path, "feed_forward", "Llama4TextMLP", hidden, dense_width, false)
            };
            b.block(list, &i.to_string(), "Llama4TextDecoderLayer")
                .with_child(attn)
                .with_child(feed_forward)
                .with_child(b.norm(&path, "input_layernorm", "Llama4TextRMSNorm", hidden, false))
                .with_child(b.norm(&path, "post_attention_layernorm", "Llama4TextRMSNorm", hidden, false))
        })
        .collect();
    let parts = BaseModel {
        embed_tokens: b.embedding(super::llama::MODEL, "embed_tokens", vocab, hidden),
        blocks,
        hidden,
        vocab,
        // `Llama4TextRotaryEmbedding` rotates the whole head (no partial rotary).
        rotary_dim: head_dim.div_ceil(2) * 2,
    };
    let root = causal_lm(&b, arch, "Llama4Text", parts);
    let any_sparse = sparse.iter().any(|s| *s);
    let facts = ArchFacts {
        model_type: "llama4_text".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: if sparse.iter().all(|s| *s) { 0 } else { dense_width },
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        activation,
        moe: any_sparse.then_some(MoeFacts {
            experts,
            top_k: top_k as u32,
            expert_intermediate_size: expert_width,
            shared_experts: 1,
            shared_intermediate_size: expert_width,
        }),
        tie_word_embeddings: tie,
        layers: layer_facts(list, &sparse, &windows),
        no_split_classes: vec!["Llama4TextDecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    finish(super::describe(config, arch, options, dtype, facts, root, Vec::new()))
}

/// `Llama4TextMoe`: the fused experts, the router, the shared expert.
fn moe(b: &Builder, layer: &str, hidden: u64, width: u64, experts: u32) -> Module {
    let block = b.container(layer, "feed_forward", "Llama4TextMoe");
    let p = block.path.clone();
    let count = u64::from(experts);
    block
        .with_child(b.fused_experts(
            &p,
            "experts",
            "Llama4TextExperts",
            experts,
            &[("gate_up_proj", &[count, hidden, 2 * width]), ("down_proj", &[count, width, hidden])],
        ))
        .with_child(b.router(&p, "router", "Llama4Router", hidden, experts, false))
        .with_child(gated_mlp(b, &p, "shared_expert", "Llama4TextMLP", hidden, width, false))
}

/// Which layers are MoE: `moe_layers` when given, else every `interleave_moe_layer_step`-th
/// layer from the step's last (`range(step - 1, layers, step)`).
fn moe_layers(config: &HfConfig, layers: u64) -> Result<Vec<bool>, InputError> {
    let count = layers as usize;
    if let Some(listed) = config.uint_list(&["moe_layers"])? {
        if let Some(bad) = listed.iter().find(|l| **l >= layers) {
            return Err(InputError::new(
                config.origin(),
                format!("layer {bad} is past the model's {layers} layers"),
            )
            .at_key("moe_layers")
            .with_fix("list layer indices below `num_hidden_layers`"));
        }
        return Ok((0..count).map(|i| listed.contains(&(i as u64))).collect());
    }
    let step = config.positive_or(&["interleave_moe_layer_step"], 1)? as usize;
    Ok((0..count).map(|i| i + 1 >= step && (i + 1 - step).is_multiple_of(step)).collect())
}

/// The window of each layer: the chunk size on `chunked_attention` layers, none on full ones.
fn chunk_windows(config: &HfConfig, layers: u64) -> Result<Vec<Option<u64>>, InputError> {
    let count = layers as usize;
    let chunk = match config.object().get("attention_chunk_size") {
        None => Some(DEFAULT_CHUNK),
        Some(_) => config.opt_positive(&["attention_chunk_size"])?,
    };
    if let Some(windows) = super::llama::windows_by_layer_type(config, count, "chunked_attention", chunk)? {
        return Ok(windows);
    }
    let rope = rope_layers(config, count)?;
    // 5.x makes the rotating layers chunked only when there is a chunk size; 4.57 names them
    // chunked regardless, with no window to bound its cache without one.
    Ok(rope.into_iter().map(|r| chunk.filter(|_| r)).collect())
}

/// `no_rope_layers` (1: the layer rotates) when given and non-empty, else all but every
/// `no_rope_layer_interval`-th layer (4 when absent).
fn rope_layers(config: &HfConfig, count: usize) -> Result<Vec<bool>, InputError> {
    if let Some(flags) = config.uint_list(&["no_rope_layers"])?.filter(|f| !f.is_empty()) {
        if flags.len() != count {
            return Err(InputError::new(
                config.origin(),
                format!("expected one entry per layer ({count}), found {}", flags.len()),
            )
            .at_key("no_rope_layers")
            .with_fix("give `no_rope_layers` exactly `num_hidden_layers` entries (1: the layer rotates)"));
        }
        return Ok(flags.iter().map(|f| *f != 0).collect());
    }
    let interval = config.positive_or(&["no_rope_layer_interval"], 4)? as usize;
    Ok((0..count).map(|i| !(i + 1).is_multiple_of(interval)).collect())
}
