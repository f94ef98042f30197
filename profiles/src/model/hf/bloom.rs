//! `BloomForCausalLM` (BLOOM, BLOOMZ): ALiBi position biases (no position embeddings, no
//! buffers), a LayerNorm right after the word embeddings, fused QKV with bias, 4x GELU MLP,
//! `lm_head` tied to the word embeddings.
//!
//! Module names (transformers 4.4x/5.x, `modeling_bloom.py`): `transformer.{word_embeddings,
//! word_embeddings_layernorm, h.N.{input_layernorm, self_attention.{query_key_value, dense},
//! post_attention_layernorm, mlp.{dense_h_to_4h, dense_4h_to_h}}, ln_f}`, `lm_head`.

use super::{CoreSizes, HfConfig, SizeKeys, dense_layers, describe, tie_if};
use crate::InputError;
use crate::model::{ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, NormKind, StackKind};

const SIZE_KEYS: SizeKeys = SizeKeys {
    layers: &["n_layer", "num_hidden_layers"],
    hidden: &["hidden_size", "n_embed"],
    heads: &["n_head", "num_attention_heads"],
};

/// BLOOM was trained on 2048-token sequences; ALiBi sets no hard limit.
const TRAINED_SEQUENCE: u64 = 2048;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden, heads, heads_key } = SIZE_KEYS.read(config)?;
    let head_dim = config.head_dim(&[], hidden, heads, heads_key)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["seq_length", "max_position_embeddings"], TRAINED_SEQUENCE)?;
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let base = "transformer";
    let list = "transformer.h";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attn_path = format!("{path}.self_attention");
            let attention = b
                .container(&path, "self_attention", "BloomAttention")
                .with_child(b.linear(&attn_path, "query_key_value", hidden, 3 * hidden, true))
                .with_child(b.linear(&attn_path, "dense", hidden, hidden, true));
            let mlp = b
                .container(&path, "mlp", "BloomMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "dense_h_to_4h", hidden, 4 * hidden, true))
                .with_child(b.linear(&format!("{path}.mlp"), "dense_4h_to_h", 4 * hidden, hidden, true));
            b.block(list, &i.to_string(), "BloomBlock")
                .with_child(b.norm(&path, "input_layernorm", "LayerNorm", hidden, true))
                .with_child(attention)
                .with_child(b.norm(&path, "post_attention_layernorm", "LayerNorm", hidden, true))
                .with_child(mlp)
        })
        .collect();
    let model = b
        .container("", base, "BloomModel")
        .with_child(b.embedding(base, "word_embeddings", vocab, hidden))
        .with_child(b.norm(base, "word_embeddings_layernorm", "LayerNorm", hidden, true))
        .with_child(b.module_list(base, "h", blocks))
        .with_child(b.norm(base, "ln_f", "LayerNorm", hidden, true));
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, false));

    let facts = ArchFacts {
        model_type: "bloom".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: heads,
        head_dim,
        intermediate_size: 4 * hidden,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: "gelu".into(),
        moe: None,
        tie_word_embeddings: tie,
        layers: dense_layers(list, layers, StackKind::Decoder, false),
        no_split_classes: vec!["BloomBlock".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, "lm_head.weight", "transformer.word_embeddings.weight")
}
