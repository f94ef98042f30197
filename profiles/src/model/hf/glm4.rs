//! `Glm4ForCausalLM` (GLM-4-0414): a Llama-style decoder with biased q/k/v projections, a fused
//! `gate_up_proj`, a partial rotary embedding and "sandwich" norms: each sublayer's output is
//! normed again before the residual add.
//!
//! Module names (transformers 4.57 and 5.x alike, `models/glm4/modeling_glm4.py`):
//! `model.embed_tokens`, `model.layers.N.{self_attn.{q_proj, k_proj, v_proj, o_proj},
//! mlp.{gate_up_proj, down_proj}, input_layernorm, post_attention_layernorm,
//! post_self_attn_layernorm, post_mlp_layernorm}`, `model.norm`, `model.rotary_emb`, `lm_head`.
//! q/k/v carry a bias where `attention_bias` (default true), `o_proj` never.
//!
//! The rotary embedding rotates `head_dim × partial_rotary_factor` (0.5 by default:
//! `Glm4Config` sets it for backward compatibility; 5.x reads it from `rope_parameters` too, and
//! `Glm4RotaryEmbedding` applies it to the default rope). Absent keys take `Glm4Config`'s defaults.

use super::HfConfig;
use super::llama::{BaseModel, MODEL, causal_lm, finish, layer_facts};
use crate::InputError;
use crate::model::{ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Naming, NormKind};
use serde_json::Value;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let layers = config.positive_or(&["num_hidden_layers"], 40)?;
    let hidden = config.positive_or(&["hidden_size"], 4096)?;
    let heads = config.positive_or(&["num_attention_heads"], 32)?;
    // An explicit null means `hidden_size / num_attention_heads` (the attention's `getattr`).
    let head_dim = match config.object().get("head_dim") {
        None => 128,
        Some(_) => config.head_dim(&["head_dim"], hidden, heads, "num_attention_heads")?,
    };
    let kv_heads = config.kv_heads(heads, 2)?;
    let intermediate = config.positive_or(&["intermediate_size"], 13696)?;
    let vocab = config.positive_or(&["vocab_size"], 151_552)?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 131_072)?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let qkv_bias = config.bool_or(&["attention_bias"], true)?;
    let activation = config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into());
    let rotary_dim = rotary_dim(config, options.naming, head_dim)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let list = "model.layers";
    let (q_out, kv_out) = (heads * head_dim, kv_heads * head_dim);
    let norm = "Glm4RMSNorm";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attn = b.container(&path, "self_attn", "Glm4Attention");
            let p = attn.path.clone();
            let attn = attn
                .with_child(b.linear(&p, "q_proj", hidden, q_out, qkv_bias))
                .with_child(b.linear(&p, "k_proj", hidden, kv_out, qkv_bias))
                .with_child(b.linear(&p, "v_proj", hidden, kv_out, qkv_bias))
                .with_child(b.linear(&p, "o_proj", q_out, hidden, false));
            let mlp = b.container(&path, "mlp", "Glm4MLP");
            let m = mlp.path.clone();
            let mlp = mlp
                .with_child(b.linear(&m, "gate_up_proj", hidden, 2 * intermediate, false))
                .with_child(b.linear(&m, "down_proj", intermediate, hidden, false));
            b.block(list, &i.to_string(), "Glm4DecoderLayer")
                .with_child(attn)
                .with_child(mlp)
                .with_child(b.norm(&path, "input_layernorm", norm, hidden, false))
                .with_child(b.norm(&path, "post_attention_layernorm", norm, hidden, false))
                .with_child(b.norm(&path, "post_self_attn_layernorm", norm, hidden, false))
                .with_child(b.norm(&path, "post_mlp_layernorm", norm, hidden, false))
        })
        .collect();
    let parts = BaseModel {
        embed_tokens: b.embedding(MODEL, "embed_tokens", vocab, hidden),
        blocks,
        hidden,
        vocab,
        rotary_dim,
    };
    let root = causal_lm(&b, arch, "Glm4", parts);
    let sparse = vec![false; layers as usize];
    let facts = ArchFacts {
        model_type: "glm4".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        activation,
        moe: None,
        tie_word_embeddings: tie,
        layers: layer_facts(list, &sparse, &vec![None; layers as usize]),
        no_split_classes: vec!["Glm4DecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    finish(super::describe(config, arch, options, dtype, facts, root, Vec::new()))
}

/// `head_dim × partial_rotary_factor`, rounded up to even as `torch.arange(0, dim, 2)` does: the
/// top-level key, else (5.x) the one in `rope_parameters`, else `Glm4Config`'s 0.5.
fn rotary_dim(config: &HfConfig, naming: Naming, head_dim: u64) -> Result<u64, InputError> {
    let nested = match config.get(&["rope_parameters"]) {
        Some((_, Value::Object(settings))) if naming == Naming::V5 => {
            settings.get("partial_rotary_factor").and_then(Value::as_f64)
        }
        _ => None,
    };
    let factor = config.float_opt(&["partial_rotary_factor"])?.or(nested).unwrap_or(0.5);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(InputError::new(config.origin(), format!("a rotary factor of {factor}"))
            .at_key("partial_rotary_factor")
            .with_fix("`partial_rotary_factor` is a fraction of the head width, above 0 and at most 1"));
    }
    Ok(((head_dim as f64 * factor) as u64).div_ceil(2) * 2)
}
