//! `PhiForCausalLM` (phi-1, phi-1.5, phi-2): one LayerNorm per block feeding attention and MLP
//! in parallel, separate q/k/v projections with bias, partial rotary embeddings, a final
//! `final_layernorm`, and an `lm_head` with a bias (untied unless `tie_word_embeddings`).
//!
//! Module names (transformers 4.4x/5.x, `modeling_phi.py`): `model.embed_tokens`,
//! `model.layers.N.{self_attn.{q_proj, k_proj, v_proj, dense, [q_layernorm, k_layernorm]},
//! mlp.{fc1, fc2}, input_layernorm}`, `model.rotary_emb`, `model.final_layernorm`, `lm_head`.
//!
//! Buffers: `model.rotary_emb.inv_freq` (fp32, `rotary_dim / 2` values, not saved); 5.x also keeps
//! `original_inv_freq`, a copy of it.

use super::{CoreSizes, HfConfig, STANDARD_SIZE_KEYS, dense_layers, describe, tie_if};
use crate::InputError;
use crate::model::{ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, NormKind, StackKind};

/// transformers' default share of each head that is rotated (`PhiConfig`).
const DEFAULT_PARTIAL_ROTARY_FACTOR: f64 = 0.5;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden, heads, heads_key } = STANDARD_SIZE_KEYS.read(config)?;
    let kv_heads = config.positive_or(&["num_key_value_heads"], heads)?;
    let head_dim = config.head_dim(&["head_dim"], hidden, heads, heads_key)?;
    let attention_width = heads.checked_mul(head_dim).filter(|w| *w <= 1 << 32).ok_or_else(|| {
        InputError::new(config.origin(), format!("{heads} heads of width {head_dim} are implausibly wide"))
            .at_key("head_dim")
            .with_fix("`head_dim` is usually hidden_size / num_attention_heads")
    })?;
    if heads % kv_heads != 0 {
        return Err(InputError::new(
            config.origin(),
            format!("{kv_heads} key/value heads do not divide {heads} attention heads"),
        )
        .at_key("num_key_value_heads")
        .with_fix("grouped-query attention needs the head count to be a multiple of the key/value heads"));
    }
    let kv_width = kv_heads * head_dim;
    let intermediate = config.positive_or(&["intermediate_size"], 8192)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 2048)?;
    let qk_layernorm = config.bool_or(&["qk_layernorm"], false)?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let rotary_factor = partial_rotary_factor(config)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let list = "model.layers";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attn_path = format!("{path}.self_attn");
            let mut attention = b
                .container(&path, "self_attn", "PhiAttention")
                .with_child(b.linear(&attn_path, "q_proj", hidden, attention_width, true))
                .with_child(b.linear(&attn_path, "k_proj", hidden, kv_width, true))
                .with_child(b.linear(&attn_path, "v_proj", hidden, kv_width, true))
                .with_child(b.linear(&attn_path, "dense", attention_width, hidden, true));
            if qk_layernorm {
                // transformers sizes these by hidden / heads, whatever `head_dim` says.
                let width = hidden / heads;
                attention = attention
                    .with_child(b.norm(&attn_path, "q_layernorm", "LayerNorm", width, true))
                    .with_child(b.norm(&attn_path, "k_layernorm", "LayerNorm", width, true));
            }
            let mlp = b
                .container(&path, "mlp", "PhiMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "fc1", hidden, intermediate, true))
                .with_child(b.linear(&format!("{path}.mlp"), "fc2", intermediate, hidden, true));
            b.block(list, &i.to_string(), "PhiDecoderLayer")
                .with_child(attention)
                .with_child(mlp)
                .with_child(b.norm(&path, "input_layernorm", "LayerNorm", hidden, true))
        })
        .collect();
    let rotary_dim = (head_dim as f64 * rotary_factor) as u64;
    let rotary = b.rotary("model", "rotary_emb", "PhiRotaryEmbedding", rotary_dim);
    let model = b
        .container("", "model", "PhiModel")
        .with_child(b.embedding("model", "embed_tokens", vocab, hidden))
        .with_child(b.module_list("model", "layers", blocks))
        .with_child(rotary)
        .with_child(b.dropout("model", "embed_dropout"))
        .with_child(b.norm("model", "final_layernorm", "LayerNorm", hidden, true));
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, true));

    let facts = ArchFacts {
        model_type: "phi".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu_new".into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: dense_layers(list, layers, StackKind::Decoder, false),
        no_split_classes: vec!["PhiDecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, "lm_head.weight", "model.embed_tokens.weight")
}

/// The share of each head that is rotated: `partial_rotary_factor` at the top level (4.x
/// configs) or inside `rope_parameters` (5.x), 0.5 when neither says; must lie in (0, 1].
fn partial_rotary_factor(config: &HfConfig) -> Result<f64, InputError> {
    let (key, factor) = match config.float_opt(&["partial_rotary_factor"])? {
        Some(factor) => ("partial_rotary_factor", factor),
        None => {
            let nested = config
                .object()
                .get("rope_parameters")
                .and_then(|rope| rope.get("partial_rotary_factor"))
                .and_then(|value| value.as_f64());
            ("rope_parameters.partial_rotary_factor", nested.unwrap_or(DEFAULT_PARTIAL_ROTARY_FACTOR))
        }
    };
    if factor > 0.0 && factor <= 1.0 {
        Ok(factor)
    } else {
        Err(InputError::new(
            config.origin(),
            format!("expected a share of the head between 0 (exclusive) and 1, found `{factor}`"),
        )
        .at_key(key)
        .with_fix("phi-1.5 uses 0.5 and phi-2 uses 0.4"))
    }
}
