//! `BertModel` and `BertForMaskedLM`: learned word, position and token-type embeddings with a
//! LayerNorm, post-LayerNorm encoder layers, and the masked-LM head. The task heads
//! (`BertForSequenceClassification`, token classification, question answering) are `heads.rs`'s,
//! on the `BertModel` built here.
//!
//! Module names (transformers 4.4x/5.x, `modeling_bert.py`), with the base model at `bert.` in
//! `BertForMaskedLM` and at the root in `BertModel`: `embeddings.{word_embeddings,
//! position_embeddings, token_type_embeddings, LayerNorm}`, `encoder.layer.N.{attention.{self.
//! {query, key, value}, output.{dense, LayerNorm}}, intermediate.dense, output.{dense,
//! LayerNorm}}`, `pooler.dense`. Heads:
//! - `BertModel` keeps the pooler; `BertForMaskedLM` builds its base model with
//!   `add_pooling_layer=False`.
//! - `BertForMaskedLM`: `cls.predictions.{transform.{dense, LayerNorm}, decoder, bias}`; the
//!   decoder's weight is tied to the word embeddings (unless `tie_word_embeddings` is false) and
//!   its bias to `cls.predictions.bias`.
//!
//! Buffers: `embeddings.position_ids` and `embeddings.token_type_ids`, int64 `[1,
//! max_position_embeddings]`, not saved. 4.x also builds `attention.self.distance_embedding` for
//! `position_embedding_type` `relative_key`/`relative_key_query`; 5.x dropped those types.
//!
//! `BertEmbeddings` is in `_no_split_modules` next to `BertLayer` (its three lookups are summed),
//! so it is built as a block that placement keeps whole; only the `BertLayer`s are layers.

use super::{CoreSizes, HfConfig, STANDARD_SIZE_KEYS, dense_layers, describe};
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, Naming, NormKind, OutputHead,
    StackKind, Tensor,
};
use crate::{DType, InputError};

/// Which head sits on the encoder.
#[derive(Clone, Copy, PartialEq)]
enum Head {
    None,
    MaskedLm,
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let head = if arch == "BertForMaskedLM" { Head::MaskedLm } else { Head::None };
    let CoreSizes { layers, hidden, heads, heads_key } = STANDARD_SIZE_KEYS.read(config)?;
    let head_dim = config.head_dim(&[], hidden, heads, heads_key)?;
    let intermediate = config.positive_or(&["intermediate_size"], 3072)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 512)?;
    let type_vocab = config.positive_or(&["type_vocab_size"], 2)?;
    let is_decoder = config.bool_or(&["is_decoder"], false)?;
    let cross_attention = config.bool_or(&["add_cross_attention"], false)?;
    if cross_attention && !is_decoder {
        return Err(InputError::new(
            config.origin(),
            "cross-attention needs a decoder: `add_cross_attention` is true but `is_decoder` is not",
        )
        .at_key("add_cross_attention")
        .with_fix("set \"is_decoder\": true, or \"add_cross_attention\": false"));
    }
    let position_type = config.string_opt(&["position_embedding_type"])?.unwrap_or_else(|| "absolute".into());
    let relative = matches!(position_type.as_str(), "relative_key" | "relative_key_query");
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let base = if head == Head::None { "" } else { "bert" };
    let at = |name: &str| if base.is_empty() { name.to_string() } else { format!("{base}.{name}") };
    let embeddings_path = at("embeddings");
    let list = at("encoder.layer");

    let embeddings = b
        .block(base, "embeddings", "BertEmbeddings")
        .with_child(b.embedding(&embeddings_path, "word_embeddings", vocab, hidden))
        .with_child(b.embedding(&embeddings_path, "position_embeddings", max_positions, hidden))
        .with_child(b.embedding(&embeddings_path, "token_type_embeddings", type_vocab, hidden))
        .with_child(b.norm(&embeddings_path, "LayerNorm", "LayerNorm", hidden, true))
        .with_tensor(Tensor::buffer("position_ids", &[1, max_positions], DType::I64, false))
        .with_tensor(Tensor::buffer("token_type_ids", &[1, max_positions], DType::I64, false));
    let distance_rows = (options.naming == Naming::V4 && relative).then(|| 2 * max_positions - 1);
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let mut layer = b.block(&list, &i.to_string(), "BertLayer").with_child(attention(
                &b,
                &path,
                "attention",
                hidden,
                head_dim,
                distance_rows,
                false,
            ));
            if cross_attention {
                layer =
                    layer.with_child(attention(&b, &path, "crossattention", hidden, head_dim, None, true));
            }
            layer
                .with_child(b.container(&path, "intermediate", "BertIntermediate").with_child(b.linear(
                    &format!("{path}.intermediate"),
                    "dense",
                    hidden,
                    intermediate,
                    true,
                )))
                .with_child(
                    b.container(&path, "output", "BertOutput")
                        .with_child(b.linear(&format!("{path}.output"), "dense", intermediate, hidden, true))
                        .with_child(b.norm(
                            &format!("{path}.output"),
                            "LayerNorm",
                            "LayerNorm",
                            hidden,
                            true,
                        )),
                )
        })
        .collect();
    let encoder = b.container(base, "encoder", "BertEncoder").with_child(b.module_list(
        &at("encoder"),
        "layer",
        blocks,
    ));
    let mut model = b.container("", base, "BertModel").with_child(embeddings).with_child(encoder);
    if head != Head::MaskedLm {
        model = model.with_child(b.container(base, "pooler", "BertPooler").with_child(b.linear(
            &at("pooler"),
            "dense",
            hidden,
            hidden,
            true,
        )));
    }

    let mut notes = Vec::new();
    if relative && options.naming == Naming::V5 {
        notes.push(format!(
            "position_embedding_type \"{position_type}\" is not built by transformers 5.x, which uses \
             absolute positions; with --naming v4 the layers get a `distance_embedding`"
        ));
    }
    let root = match head {
        Head::None => model,
        Head::MaskedLm => {
            b.container("", "", arch).with_child(model).with_child(masked_lm_head(&b, hidden, vocab))
        }
    };

    let stack = if is_decoder { StackKind::Decoder } else { StackKind::Encoder };
    let facts = ArchFacts {
        model_type: "bert".into(),
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
        tie_word_embeddings: tie && head == Head::MaskedLm,
        layers: dense_layers(&list, layers, stack, cross_attention),
        no_split_classes: vec!["BertEmbeddings".into(), "BertLayer".into()],
        head: if head == Head::MaskedLm { OutputHead::LanguageModel } else { OutputHead::None },
        vision: None,
    };
    let mut description = describe(config, arch, options, dtype, facts, root, notes);
    if head == Head::MaskedLm {
        if tie {
            description.tie("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight")?;
        }
        // 4.x makes the decoder's bias the very same parameter; 5.x ties it with the weights.
        if tie || options.naming == Naming::V4 {
            description.tie("cls.predictions.decoder.bias", "cls.predictions.bias")?;
        }
    }
    Ok(description)
}

/// `BertAttention` named `name` under `parent`: `self.{query, key, value}` and `output.{dense,
/// LayerNorm}`; `distance_rows` adds 4.x's relative-position `distance_embedding`.
fn attention(
    b: &Builder,
    parent: &str,
    name: &str,
    hidden: u64,
    head_dim: u64,
    distance_rows: Option<u64>,
    cross: bool,
) -> Module {
    let path = format!("{parent}.{name}");
    let self_path = format!("{path}.self");
    let mut scores = b
        .container(&path, "self", if cross { "BertCrossAttention" } else { "BertSelfAttention" })
        .with_child(b.linear(&self_path, "query", hidden, hidden, true))
        .with_child(b.linear(&self_path, "key", hidden, hidden, true))
        .with_child(b.linear(&self_path, "value", hidden, hidden, true));
    if let Some(rows) = distance_rows {
        scores = scores.with_child(b.embedding(&self_path, "distance_embedding", rows, head_dim));
    }
    let output_path = format!("{path}.output");
    b.container(parent, name, "BertAttention").with_child(scores).with_child(
        b.container(&path, "output", "BertSelfOutput")
            .with_child(b.linear(&output_path, "dense", hidden, hidden, true))
            .with_child(b.norm(&output_path, "LayerNorm", "LayerNorm", hidden, true)),
    )
}

/// `cls`: `BertOnlyMLMHead` → `predictions` with `transform`, `decoder` and the output `bias`.
fn masked_lm_head(b: &Builder, hidden: u64, vocab: u64) -> Module {
    let predictions = "cls.predictions";
    let transform = "cls.predictions.transform";
    let head = b
        .container("cls", "predictions", "BertLMPredictionHead")
        .with_child(
            b.container(predictions, "transform", "BertPredictionHeadTransform")
                .with_child(b.linear(transform, "dense", hidden, hidden, true))
                .with_child(b.norm(transform, "LayerNorm", "LayerNorm", hidden, true)),
        )
        .with_child(b.linear(predictions, "decoder", hidden, vocab, true))
        .with_tensor(Tensor::parameter("bias", &[vocab], b.dtype));
    b.container("", "cls", "BertOnlyMLMHead").with_child(head)
}
