//! `XLNetLMHeadModel` (xlnet-base-cased, xlnet-large-cased): relative-position two-stream
//! attention whose projections are raw `[d_model, n_head, d_head]` parameters rather than
//! `nn.Linear`s, a post-LayerNorm feed-forward, and `lm_loss` tied to the word embedding.
//!
//! Module names (transformers 4.4x/5.x, `modeling_xlnet.py`): `transformer.word_embedding`,
//! `transformer.mask_emb` (`[1, 1, d_model]`), `transformer.layer.N.{rel_attn.{q, k, v, o, r,
//! r_r_bias, r_s_bias, r_w_bias, seg_embed, layer_norm}, ff.{layer_norm, layer_1, layer_2}}`,
//! `lm_loss` (weight tied unless `tie_word_embeddings` is false, bias its own). No buffers.
//! The raw parameters (`mask_emb` and those of `rel_attn`) are made with `torch.FloatTensor`, so
//! they are float32 whatever the load dtype (from_pretrained keeps a parameter's own dtype).
//!
//! XLNet has no `_no_split_modules`, so transformers refuses `device_map="auto"` for it (an
//! explicit device map loads); each `XLNetLayer` is still built as a block. It has no position
//! limit (relative positions); `max_positions` is the 512-token length it was trained on.
//! `untie_r` only matters to the TensorFlow checkpoint converter: every layer has its own biases.

use super::{CoreSizes, HfConfig, SizeKeys, dense_layers, describe, tie_if};
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, NormKind, StackKind, Tensor,
};
use crate::{DType, InputError};

const SIZE_KEYS: SizeKeys = SizeKeys {
    layers: &["n_layer", "num_hidden_layers"],
    hidden: &["d_model", "hidden_size"],
    heads: &["n_head", "num_attention_heads"],
};

/// The sequence length XLNet was pre-trained on.
const TRAINED_SEQUENCE: u64 = 512;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden: d_model, heads, heads_key } = SIZE_KEYS.read(config)?;
    let derived_head = config.head_dim(&[], d_model, heads, heads_key)?;
    let d_head = config.positive_or(&["d_head"], derived_head)?;
    if d_head != derived_head {
        return Err(InputError::new(
            config.origin(),
            format!("expected d_model / n_head = {derived_head}, found `{d_head}`"),
        )
        .at_key("d_head")
        .with_fix("transformers requires `d_head` to equal `d_model / n_head`; remove it or correct it"));
    }
    let d_inner = config.positive_or(&["d_inner"], 4096)?;
    let vocab = config.positive(&["vocab_size", "n_token"])?;
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let base = "transformer";
    let list = "transformer.layer";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let projection = [d_model, heads, d_head];
            let mut attention = b.container(&path, "rel_attn", "XLNetRelativeAttention");
            for name in ["q", "k", "v", "o", "r"] {
                attention = attention.with_tensor(Tensor::fixed_parameter(name, &projection, DType::F32));
            }
            for name in ["r_r_bias", "r_s_bias", "r_w_bias"] {
                attention =
                    attention.with_tensor(Tensor::fixed_parameter(name, &[heads, d_head], DType::F32));
            }
            attention = attention
                .with_tensor(Tensor::fixed_parameter("seg_embed", &[2, heads, d_head], DType::F32))
                .with_child(b.norm(&format!("{path}.rel_attn"), "layer_norm", "LayerNorm", d_model, true))
                .with_child(b.dropout(&format!("{path}.rel_attn"), "dropout"));
            let ff_path = format!("{path}.ff");
            let ff = b
                .container(&path, "ff", "XLNetFeedForward")
                .with_child(b.norm(&ff_path, "layer_norm", "LayerNorm", d_model, true))
                .with_child(b.linear(&ff_path, "layer_1", d_model, d_inner, true))
                .with_child(b.linear(&ff_path, "layer_2", d_inner, d_model, true))
                .with_child(b.dropout(&ff_path, "dropout"));
            b.block(list, &i.to_string(), "XLNetLayer")
                .with_child(attention)
                .with_child(ff)
                .with_child(b.dropout(&path, "dropout"))
        })
        .collect();
    let model = b
        .container("", base, "XLNetModel")
        .with_tensor(Tensor::fixed_parameter("mask_emb", &[1, 1, d_model], DType::F32))
        .with_child(b.embedding(base, "word_embedding", vocab, d_model))
        .with_child(b.module_list(base, "layer", blocks))
        .with_child(b.dropout(base, "dropout"));
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_loss", d_model, vocab, true));

    let facts = ArchFacts {
        model_type: "xlnet".into(),
        hidden_size: d_model,
        num_attention_heads: heads,
        num_kv_heads: heads,
        head_dim: d_head,
        intermediate_size: d_inner,
        vocab_size: vocab,
        max_positions: TRAINED_SEQUENCE,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: config.string_opt(&["ff_activation"])?.unwrap_or_else(|| "gelu".into()),
        moe: None,
        tie_word_embeddings: tie,
        // XLNetLMHeadModel generates autoregressively, caching per-layer states (`mems`).
        layers: dense_layers(list, layers, StackKind::Decoder, false),
        no_split_classes: Vec::new(),
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, "lm_loss.weight", "transformer.word_embedding.weight")
}
