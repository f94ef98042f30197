//! `Cohere2ForCausalLM` (Command R7B, Command A): a parallel decoder block (attention and the MLP
//! both read the one normed input and add to the residual together), LayerNorms without a bias,
//! sliding-window attention on three layers of every four, and an `lm_head` tied to the
//! embedding by default, whose logits the model multiplies by `logit_scale` (a constant, no
//! parameter).
//!
//! Module names (transformers 4.57 and 5.x alike, `models/cohere2/modeling_cohere2.py`):
//! `model.embed_tokens`, `model.layers.N.{self_attn.{q_proj, k_proj, v_proj, o_proj},
//! mlp.{gate_proj, up_proj, down_proj}, input_layernorm}`, `model.norm`, `model.rotary_emb`,
//! `lm_head`. The four projections carry a bias where `attention_bias` (default false); the norms
//! are `Cohere2LayerNorm`, a weight only. `head_dim` is always `hidden_size /
//! num_attention_heads` (`Cohere2Config` overwrites any other value).
//!
//! Sliding layers: `layer_types` when given, else every layer but each `sliding_window_pattern`-th
//! (4 when absent), with a window of `sliding_window` (4096 when absent). Absent keys take
//! `Cohere2Config`'s defaults.

use super::HfConfig;
use super::llama::{MODEL, finish, gated_mlp, layer_facts};
use crate::InputError;
use crate::model::{ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, NormKind};

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let layers = config.positive_or(&["num_hidden_layers"], 40)?;
    let hidden = config.positive_or(&["hidden_size"], 8192)?;
    let heads = config.positive_or(&["num_attention_heads"], 64)?;
    if !hidden.is_multiple_of(heads) {
        return Err(InputError::new(
            config.origin(),
            format!("{heads} attention heads do not divide the hidden size {hidden}"),
        )
        .at_key("num_attention_heads")
        .with_fix(
            "`Cohere2Config` makes each head `hidden_size / num_attention_heads` wide: give a divisor",
        ));
    }
    let head_dim = hidden / heads;
    let kv_heads = config.kv_heads(heads, heads)?;
    let intermediate = config.positive_or(&["intermediate_size"], 22528)?;
    let vocab = config.positive_or(&["vocab_size"], 256_000)?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 8192)?;
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let bias = config.bool_or(&["attention_bias"], false)?;
    let activation = config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into());
    let windows = windows(config, layers)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let list = "model.layers";
    let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
    let norm = "Cohere2LayerNorm";
    let blocks: Vec<_> = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attn = b.container(&path, "self_attn", "Cohere2Attention");
            let p = attn.path.clone();
            let attn = attn
                .with_child(b.linear(&p, "q_proj", hidden, q_out, bias))
                .with_child(b.linear(&p, "k_proj", hidden, kv_out, bias))
                .with_child(b.linear(&p, "v_proj", hidden, kv_out, bias))
                .with_child(b.linear(&p, "o_proj", q_out, hidden, bias));
            b.block(list, &i.to_string(), "Cohere2DecoderLayer")
                .with_child(attn)
                .with_child(gated_mlp(&b, &path, "mlp", "Cohere2MLP", hidden, intermediate, false))
                .with_child(b.norm(&path, "input_layernorm", norm, hidden, false))
        })
        .collect();
    let model = b
        .container("", MODEL, "Cohere2Model")
        .with_child(b.embedding(MODEL, "embed_tokens", vocab, hidden))
        .with_child(b.module_list(MODEL, "layers", blocks))
        .with_child(b.norm(MODEL, "norm", norm, hidden, false))
        .with_child(b.rotary(MODEL, "rotary_emb", "Cohere2RotaryEmbedding", head_dim.div_ceil(2) * 2));
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, false));
    let sparse = vec![false; layers as usize];
    let facts = ArchFacts {
        model_type: "cohere2".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: true,
        activation,
        moe: None,
        tie_word_embeddings: tie,
        layers: layer_facts(list, &sparse, &windows),
        no_split_classes: vec!["Cohere2DecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    finish(super::describe(config, arch, options, dtype, facts, root, Vec::new()))
}

/// Each layer's window: `sliding_window` on the sliding layers, none on the full ones.
fn windows(config: &HfConfig, layers: u64) -> Result<Vec<Option<u64>>, InputError> {
    let count = layers as usize;
    let window = match config.object().get("sliding_window") {
        None => Some(4096),
        Some(_) => config.opt_positive(&["sliding_window"])?,
    };
    if let Some(windows) = super::llama::windows_by_layer_type(config, count, "sliding_attention", window)? {
        return Ok(windows);
    }
    let pattern = config.positive_or(&["sliding_window_pattern"], 4)? as usize;
    Ok((0..count).map(|i| window.filter(|_| !(i + 1).is_multiple_of(pattern))).collect())
}
