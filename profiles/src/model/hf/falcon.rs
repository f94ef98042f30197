//! `FalconForCausalLM` (Falcon-7B/40B/180B, Falcon2-11B), including configs written for the old
//! remote code (`RWForCausalLM`, `model_type` `RefinedWeb`/`RefinedWebModel`), whose keys are
//! `n_layer`, `n_head`, `n_head_kv` and `n_embed`.
//!
//! Module names (transformers 4.4x/5.x, `modeling_falcon.py`): `transformer.word_embeddings`,
//! `transformer.h.N.{self_attention.{query_key_value, dense}, mlp.{dense_h_to_4h, dense_4h_to_h},
//! <norms>}`, `transformer.ln_f`, `transformer.rotary_emb`, `lm_head` (tied to the word
//! embeddings unless `tie_word_embeddings` is false).
//!
//! The layouts differ by config:
//! - fused QKV width: `new_decoder_architecture` (40B, 180B) gives `(2 * num_kv_heads + heads) *
//!   head_dim`; otherwise `multi_query` (7B, the default) gives `hidden + 2 * head_dim`; otherwise
//!   `3 * hidden`;
//! - norms: sequential blocks (`parallel_attn` false) have `input_layernorm` and
//!   `post_attention_layernorm`; parallel blocks have `ln_attn` and `ln_mlp` when
//!   `num_ln_in_parallel_attn` is 2 (the default with `new_decoder_architecture`, as in 40B) and
//!   a single `input_layernorm` otherwise (7B).
//!
//! Buffers: `transformer.rotary_emb.inv_freq` (fp32, `head_dim / 2`, not saved; built even for
//! ALiBi models); 5.x also keeps `original_inv_freq`.

use super::{CoreSizes, HfConfig, SizeKeys, dense_layers, describe, tie_if};
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, NormKind, StackKind,
};

const SIZE_KEYS: SizeKeys = SizeKeys {
    layers: &["num_hidden_layers", "n_layer"],
    hidden: &["hidden_size", "n_embed"],
    heads: &["num_attention_heads", "n_head"],
};
const KV_HEAD_KEYS: &[&str] = &["num_kv_heads", "n_head_kv"];

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden, heads, heads_key } = SIZE_KEYS.read(config)?;
    let head_dim = config.head_dim(&[], hidden, heads, heads_key)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 2048)?;
    let ffn = config.positive_or(&["ffn_hidden_size"], 4 * hidden)?;
    let new_decoder = config.bool_or(&["new_decoder_architecture"], false)?;
    let multi_query = config.bool_or(&["multi_query"], true)?;
    let parallel_attn = config.bool_or(&["parallel_attn"], true)?;
    let bias = config.bool_or(&["bias"], false)?;
    let alibi = config.bool_or(&["alibi"], false)?;
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let configured_kv_heads = config.positive_or(KV_HEAD_KEYS, heads)?;
    let norms_in_parallel = match config.opt_positive(&["num_ln_in_parallel_attn"])? {
        Some(count) => Some(count),
        None if new_decoder => Some(2),
        None => None,
    };
    if new_decoder && heads % configured_kv_heads != 0 {
        let key = config.get(KV_HEAD_KEYS).map_or(KV_HEAD_KEYS[0], |(key, _)| key);
        return Err(InputError::new(
            config.origin(),
            format!("{configured_kv_heads} key/value heads do not divide {heads} attention heads"),
        )
        .at_key(key)
        .with_fix("grouped-query attention needs the head count to be a multiple of the key/value heads"));
    }
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    // What `FalconAttention` computes: the key/value head count and the fused QKV width.
    let (kv_heads, qkv_out) = if new_decoder {
        (configured_kv_heads, (2 * configured_kv_heads + heads) * head_dim)
    } else if multi_query {
        (1, hidden + 2 * head_dim)
    } else {
        (heads, 3 * hidden)
    };

    let base = "transformer";
    let list = "transformer.h";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attention = b
                .container(&path, "self_attention", "FalconAttention")
                .with_child(falcon_linear(
                    &b,
                    &format!("{path}.self_attention"),
                    "query_key_value",
                    hidden,
                    qkv_out,
                    bias,
                ))
                .with_child(falcon_linear(
                    &b,
                    &format!("{path}.self_attention"),
                    "dense",
                    hidden,
                    hidden,
                    bias,
                ));
            let mlp = b
                .container(&path, "mlp", "FalconMLP")
                .with_child(falcon_linear(&b, &format!("{path}.mlp"), "dense_h_to_4h", hidden, ffn, bias))
                .with_child(falcon_linear(&b, &format!("{path}.mlp"), "dense_4h_to_h", ffn, hidden, bias));
            let block =
                b.block(list, &i.to_string(), "FalconDecoderLayer").with_child(attention).with_child(mlp);
            let norm = |name: &str| b.norm(&path, name, "LayerNorm", hidden, true);
            if !parallel_attn {
                block.with_child(norm("post_attention_layernorm")).with_child(norm("input_layernorm"))
            } else if norms_in_parallel == Some(2) {
                block.with_child(norm("ln_attn")).with_child(norm("ln_mlp"))
            } else {
                block.with_child(norm("input_layernorm"))
            }
        })
        .collect();
    let rotary = b.rotary(base, "rotary_emb", "FalconRotaryEmbedding", head_dim);
    let model = b
        .container("", base, "FalconModel")
        .with_child(b.embedding(base, "word_embeddings", vocab, hidden))
        .with_child(b.module_list(base, "h", blocks))
        .with_child(b.norm(base, "ln_f", "LayerNorm", hidden, true))
        .with_child(rotary);
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, false));

    let facts = ArchFacts {
        model_type: "falcon".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: ffn,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: config.string_opt(&["activation"])?.unwrap_or_else(|| "gelu".into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: dense_layers(list, layers, StackKind::Decoder, false),
        no_split_classes: vec!["FalconDecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let mut notes = Vec::new();
    if alibi {
        notes.push("positions are ALiBi biases; `rotary_emb` is built but unused".to_string());
    }
    let description = describe(config, arch, options, dtype, facts, root, notes);
    tie_if(tie, description, "lm_head.weight", "transformer.word_embeddings.weight")
}

/// `FalconLinear`: an `nn.Linear` subclass with the same tensors.
fn falcon_linear(b: &Builder, parent: &str, name: &str, inputs: u64, outputs: u64, bias: bool) -> Module {
    let mut module = b.linear(parent, name, inputs, outputs, bias);
    module.class = "FalconLinear".into();
    module
}
