//! `GPTNeoXForCausalLM` (Pythia, GPT-NeoX-20B): parallel attention and MLP, fused QKV with bias,
//! LayerNorms with bias, partial rotary embeddings, an untied output head.
//!
//! Module names (transformers 4.4x/5.x, `modeling_gpt_neox.py`): `gpt_neox.embed_in`,
//! `gpt_neox.layers.N.{input_layernorm, post_attention_layernorm, attention.query_key_value,
//! attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h}`, `gpt_neox.final_layer_norm`,
//! `gpt_neox.rotary_emb`, and the head: `lm_head` in 5.x (`GPTNeoXForCausalLM.lm_head`; its
//! conversion mapping renames the checkpoints' `embed_out.`), `embed_out` in 4.x.

use super::{CoreSizes, HfConfig, STANDARD_SIZE_KEYS, dense_layers, describe, tie_if};
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Naming, NormKind, StackKind,
};

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden, heads, heads_key } = STANDARD_SIZE_KEYS.read(config)?;
    let head_dim = config.head_dim(&[], hidden, heads, heads_key)?;
    let intermediate = config.positive_or(&["intermediate_size"], 4 * hidden)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 2048)?;
    let rotary_pct = config.float_opt(&["rotary_pct", "partial_rotary_factor"])?.unwrap_or(0.25);
    let bias = config.bool_or(&["attention_bias"], true)?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let base = "gpt_neox";
    let list = "gpt_neox.layers";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attention = b
                .container(&path, "attention", "GPTNeoXAttention")
                .with_child(b.linear(
                    &format!("{path}.attention"),
                    "query_key_value",
                    hidden,
                    3 * hidden,
                    bias,
                ))
                .with_child(b.linear(&format!("{path}.attention"), "dense", hidden, hidden, bias));
            let mlp = b
                .container(&path, "mlp", "GPTNeoXMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "dense_h_to_4h", hidden, intermediate, true))
                .with_child(b.linear(&format!("{path}.mlp"), "dense_4h_to_h", intermediate, hidden, true));
            b.block(list, &i.to_string(), "GPTNeoXLayer")
                .with_child(b.norm(&path, "input_layernorm", "LayerNorm", hidden, true))
                .with_child(b.norm(&path, "post_attention_layernorm", "LayerNorm", hidden, true))
                .with_child(attention)
                .with_child(mlp)
        })
        .collect();
    let rotary_dim = (head_dim as f64 * rotary_pct) as u64;
    let model = b
        .container("", base, "GPTNeoXModel")
        .with_child(b.embedding(base, "embed_in", vocab, hidden))
        .with_child(b.dropout(base, "emb_dropout"))
        .with_child(b.module_list(base, "layers", blocks))
        .with_child(b.norm(base, "final_layer_norm", "LayerNorm", hidden, true))
        .with_child(b.rotary(base, "rotary_emb", "GPTNeoXRotaryEmbedding", rotary_dim));
    let head = match options.naming {
        Naming::V5 => "lm_head",
        Naming::V4 => "embed_out",
    };
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", head, hidden, vocab, false));

    let facts = ArchFacts {
        model_type: "gpt_neox".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: heads,
        head_dim,
        intermediate_size: intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu".into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: dense_layers(list, layers, StackKind::Decoder, false),
        no_split_classes: vec!["GPTNeoXLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, &format!("{head}.weight"), "gpt_neox.embed_in.weight")
}
