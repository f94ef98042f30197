//! `T5ForConditionalGeneration` (T5, T5 v1.1, Flan-T5, mT5-style configs): an encoder stack and a
//! decoder stack sharing one embedding, RMS-style `T5LayerNorm`s (weight only), bias-free
//! projections, relative position biases in the first block of each stack.
//!
//! Module names (transformers 4.4x/5.x, `modeling_t5.py`): `shared`, `{encoder,
//! decoder}.embed_tokens` (both tied to `shared.weight`), `{encoder, decoder}.block.N.layer.0.
//! {SelfAttention.{q, k, v, o, [relative_attention_bias]}, layer_norm}`, in the decoder
//! `decoder.block.N.layer.1.{EncDecAttention.{q, k, v, o}, layer_norm}`, then the feed-forward
//! layer (`layer.1` in the encoder, `layer.2` in the decoder) `{DenseReluDense.{wi, wo}, layer_norm}`
//! or, for a gated `feed_forward_proj` (`gated-gelu`: v1.1, Flan-T5), `DenseReluDense.{wi_0, wi_1,
//! wo}`; `{encoder, decoder}.final_layer_norm`; `lm_head`.
//!
//! `relative_attention_bias` (`[relative_attention_num_buckets, num_heads]`) exists only in block
//! 0's self-attention of each stack. In 4.x `lm_head` is tied to `shared` unless
//! `tie_word_embeddings` is false (T5 v1.1 and Flan-T5 ship a separate `lm_head`); 5.x ties it
//! always (`T5Config` forces `tie_word_embeddings = True` and reads a false value only as "do not
//! scale the decoder output"), so a 5.x model holds one embedding where 4.x holds two.

use super::{HfConfig, dense_layers, describe, tie_if};
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, Naming, NormKind, StackKind,
};

/// Shapes shared by every block.
struct Dims {
    model: u64,
    /// `num_heads * d_kv`, the width of q/k/v (not always `d_model`: t5-11b has 128 × 128).
    inner: u64,
    ff: u64,
    heads: u64,
    buckets: u64,
    gated: bool,
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let encoder_layers = config.positive(&["num_layers", "num_hidden_layers"])?;
    let decoder_layers = config.positive_or(&["num_decoder_layers"], encoder_layers)?;
    let d_model = config.positive(&["d_model", "hidden_size"])?;
    let heads = config.positive(&["num_heads", "num_attention_heads"])?;
    let d_kv = config.positive_or(&["d_kv", "head_dim"], 64)?;
    let d_ff = config.positive_or(&["d_ff"], 2048)?;
    let vocab = config.positive(&["vocab_size"])?;
    let buckets = config.positive_or(&["relative_attention_num_buckets"], 32)?;
    let max_positions = config.positive_or(&["n_positions"], 512)?;
    let tie_key = config.bool_or(&["tie_word_embeddings"], true)?;
    let tie = tie_key || options.naming == Naming::V5;
    let (gated, activation) = feed_forward(config)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let inner = heads.checked_mul(d_kv).filter(|w| *w <= 1 << 32).ok_or_else(|| {
        InputError::new(config.origin(), format!("{heads} heads of width {d_kv} are implausibly wide"))
            .at_key("d_kv")
            .with_fix("T5 checkpoints use d_kv 64 (t5-11b: 128)")
    })?;
    let dims = Dims { model: d_model, inner, ff: d_ff, heads, buckets, gated };
    let encoder = stack(&b, &dims, "encoder", encoder_layers, false, vocab);
    let decoder = stack(&b, &dims, "decoder", decoder_layers, true, vocab);
    let root = b
        .container("", "", arch)
        .with_child(b.embedding("", "shared", vocab, d_model))
        .with_child(encoder)
        .with_child(decoder)
        .with_child(b.linear("", "lm_head", d_model, vocab, false));

    // Decoder blocks also attend to the encoder's output.
    let layers = dense_layers("encoder.block", encoder_layers, StackKind::Encoder, false)
        .into_iter()
        .chain(dense_layers("decoder.block", decoder_layers, StackKind::Decoder, true))
        .collect();
    let facts = ArchFacts {
        model_type: "t5".into(),
        hidden_size: d_model,
        num_attention_heads: heads,
        num_kv_heads: heads,
        head_dim: d_kv,
        intermediate_size: d_ff,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::RmsNorm,
        gated_mlp: gated,
        activation,
        moe: None,
        tie_word_embeddings: tie,
        layers,
        no_split_classes: vec!["T5Block".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let mut notes = Vec::new();
    if tie && !tie_key {
        notes.push(
            "`tie_word_embeddings` is false, but transformers 5.x ties `lm_head` to `shared` in every T5 \
             (the flag only turns off the decoder output scaling): 4.x naming keeps them apart"
                .to_string(),
        );
    }
    let mut description = describe(config, arch, options, dtype, facts, root, notes);
    description.tie("encoder.embed_tokens.weight", "shared.weight")?;
    description.tie("decoder.embed_tokens.weight", "shared.weight")?;
    tie_if(tie, description, "lm_head.weight", "shared.weight")
}

/// `feed_forward_proj`: `ACT` or `gated-ACT` (transformers maps `gated-gelu` to `gelu_new`).
/// Returns whether the MLP is gated, and its activation.
fn feed_forward(config: &HfConfig) -> Result<(bool, String), InputError> {
    let text = config.string_opt(&["feed_forward_proj"])?.unwrap_or_else(|| "relu".into());
    let parts: Vec<&str> = text.split('-').collect();
    match parts.as_slice() {
        [activation] if !activation.is_empty() && *activation != "gated" => {
            Ok((false, activation.to_string()))
        }
        ["gated", "gelu"] => Ok((true, "gelu_new".into())),
        ["gated", activation] if !activation.is_empty() => Ok((true, activation.to_string())),
        _ => Err(InputError::new(
            config.origin(),
            format!("expected an activation such as \"relu\" or \"gated-gelu\", found \"{text}\""),
        )
        .at_key("feed_forward_proj")
        .with_fix("use `ACT` or `gated-ACT` (T5: \"relu\"; T5 v1.1 and Flan-T5: \"gated-gelu\")")),
    }
}

/// The encoder or decoder `T5Stack` at `name`.
fn stack(b: &Builder, dims: &Dims, name: &str, count: u64, decoder: bool, vocab: u64) -> Module {
    let list = format!("{name}.block");
    let blocks = (0..count).map(|i| block(b, dims, &list, i, decoder)).collect();
    b.container("", name, "T5Stack")
        .with_child(b.embedding(name, "embed_tokens", vocab, dims.model))
        .with_child(b.module_list(name, "block", blocks))
        .with_child(b.norm(name, "final_layer_norm", "T5LayerNorm", dims.model, false))
        .with_child(b.dropout(name, "dropout"))
}

/// `T5Block` `index` of `list`: self-attention, cross-attention (decoder only), feed-forward.
fn block(b: &Builder, dims: &Dims, list: &str, index: u64, decoder: bool) -> Module {
    let path = format!("{list}.{index}");
    let layers = format!("{path}.layer");
    let mut sublayers = vec![sublayer(
        b,
        dims,
        &layers,
        0,
        "T5LayerSelfAttention",
        attention(b, dims, &format!("{layers}.0"), "SelfAttention", index == 0),
    )];
    if decoder {
        sublayers.push(sublayer(
            b,
            dims,
            &layers,
            1,
            "T5LayerCrossAttention",
            attention(b, dims, &format!("{layers}.1"), "EncDecAttention", false),
        ));
    }
    let ff_index = sublayers.len() as u64;
    let ff_path = format!("{layers}.{ff_index}");
    let dense_path = format!("{ff_path}.DenseReluDense");
    let dense = if dims.gated {
        b.container(&ff_path, "DenseReluDense", "T5DenseGatedActDense")
            .with_child(b.linear(&dense_path, "wi_0", dims.model, dims.ff, false))
            .with_child(b.linear(&dense_path, "wi_1", dims.model, dims.ff, false))
            .with_child(b.linear(&dense_path, "wo", dims.ff, dims.model, false))
    } else {
        b.container(&ff_path, "DenseReluDense", "T5DenseActDense")
            .with_child(b.linear(&dense_path, "wi", dims.model, dims.ff, false))
            .with_child(b.linear(&dense_path, "wo", dims.ff, dims.model, false))
    };
    sublayers.push(sublayer(b, dims, &layers, ff_index, "T5LayerFF", dense));
    b.block(list, &index.to_string(), "T5Block").with_child(b.module_list(&path, "layer", sublayers))
}

/// `layer.N`: `inner` (attention or feed-forward) followed by its `layer_norm`.
fn sublayer(b: &Builder, dims: &Dims, layers: &str, index: u64, class: &str, inner: Module) -> Module {
    let path = format!("{layers}.{index}");
    b.container(layers, &index.to_string(), class).with_child(inner).with_child(b.norm(
        &path,
        "layer_norm",
        "T5LayerNorm",
        dims.model,
        false,
    ))
}

/// A `T5Attention` named `name` under `parent`.
fn attention(b: &Builder, dims: &Dims, parent: &str, name: &str, relative_bias: bool) -> Module {
    let path = format!("{parent}.{name}");
    let mut module = b
        .container(parent, name, "T5Attention")
        .with_child(b.linear(&path, "q", dims.model, dims.inner, false))
        .with_child(b.linear(&path, "k", dims.model, dims.inner, false))
        .with_child(b.linear(&path, "v", dims.model, dims.inner, false))
        .with_child(b.linear(&path, "o", dims.inner, dims.model, false));
    if relative_bias {
        module = module.with_child(b.embedding(&path, "relative_attention_bias", dims.buckets, dims.heads));
    }
    module
}
