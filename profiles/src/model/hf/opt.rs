//! `OPTForCausalLM` (OPT-125m … OPT-66B): learned positions with an offset of 2, separate
//! q/k/v/out projections, two-projection ReLU MLP, `lm_head` tied to the token embeddings.
//!
//! Module names (transformers 4.4x/5.x, `modeling_opt.py`): `model.decoder.{embed_tokens,
//! embed_positions, [project_out, project_in], [final_layer_norm], layers.N.{self_attn.{k_proj,
//! v_proj, q_proj, out_proj}, self_attn_layer_norm, fc1, fc2, final_layer_norm}}`, `lm_head`.
//!
//! Config-dependent parts:
//! - `embed_positions` has `max_position_embeddings + 2` rows (OPT offsets position ids by 2);
//! - when `word_embed_proj_dim` differs from `hidden_size` (opt-350m: 512 vs 1024), the token
//!   embeddings and `lm_head` are `word_embed_proj_dim` wide and the decoder has bias-free
//!   `project_in` / `project_out` between the two widths;
//! - the decoder's `final_layer_norm` exists only with `do_layer_norm_before` (every size but
//!   350m) and without `_remove_final_layer_norm`;
//! - `enable_bias` (default true) gives every projection a bias; `layer_norm_elementwise_affine`
//!   false leaves the LayerNorms without weights.

use super::{CoreSizes, HfConfig, STANDARD_SIZE_KEYS, dense_layers, describe, tie_if};
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, ModuleKind, NormKind,
    StackKind,
};

/// How far OPT shifts position ids (`OPTLearnedPositionalEmbedding.offset`).
const POSITION_OFFSET: u64 = 2;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden, heads, heads_key } = STANDARD_SIZE_KEYS.read(config)?;
    let head_dim = config.head_dim(&[], hidden, heads, heads_key)?;
    let ffn = config.positive_or(&["ffn_dim"], 3072)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 2048)?;
    let word_dim = config.positive_or(&["word_embed_proj_dim"], hidden)?;
    let layer_norm_before = config.bool_or(&["do_layer_norm_before"], true)?;
    let remove_final_norm = config.bool_or(&["_remove_final_layer_norm"], false)?;
    let bias = config.bool_or(&["enable_bias"], true)?;
    let affine = config.bool_or(&["layer_norm_elementwise_affine"], true)?;
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let norm = |parent: &str, name: &str| {
        if affine {
            b.norm(parent, name, "LayerNorm", hidden, true)
        } else {
            Module::new(format!("{parent}.{name}"), "LayerNorm", ModuleKind::Norm)
        }
    };
    let decoder = "model.decoder";
    let list = "model.decoder.layers";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attn_path = format!("{path}.self_attn");
            let attention = b
                .container(&path, "self_attn", "OPTAttention")
                .with_child(b.linear(&attn_path, "k_proj", hidden, hidden, bias))
                .with_child(b.linear(&attn_path, "v_proj", hidden, hidden, bias))
                .with_child(b.linear(&attn_path, "q_proj", hidden, hidden, bias))
                .with_child(b.linear(&attn_path, "out_proj", hidden, hidden, bias));
            b.block(list, &i.to_string(), "OPTDecoderLayer")
                .with_child(attention)
                .with_child(norm(&path, "self_attn_layer_norm"))
                .with_child(b.linear(&path, "fc1", hidden, ffn, bias))
                .with_child(b.linear(&path, "fc2", ffn, hidden, bias))
                .with_child(norm(&path, "final_layer_norm"))
        })
        .collect();

    let mut positions = b.embedding(decoder, "embed_positions", max_positions + POSITION_OFFSET, hidden);
    positions.class = "OPTLearnedPositionalEmbedding".into();
    let mut stack = b
        .container("model", "decoder", "OPTDecoder")
        .with_child(b.embedding(decoder, "embed_tokens", vocab, word_dim))
        .with_child(positions);
    if word_dim != hidden {
        stack = stack
            .with_child(b.linear(decoder, "project_out", hidden, word_dim, false))
            .with_child(b.linear(decoder, "project_in", word_dim, hidden, false));
    }
    if layer_norm_before && !remove_final_norm {
        stack = stack.with_child(norm(decoder, "final_layer_norm"));
    }
    stack = stack.with_child(b.module_list(decoder, "layers", blocks));
    let model = b.container("", "model", "OPTModel").with_child(stack);
    let root = b
        .container("", "", arch)
        .with_child(model)
        .with_child(b.linear("", "lm_head", word_dim, vocab, false));

    let facts = ArchFacts {
        model_type: "opt".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: heads,
        head_dim,
        intermediate_size: ffn,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: config.string_opt(&["activation_function"])?.unwrap_or_else(|| "relu".into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: dense_layers(list, layers, StackKind::Decoder, false),
        no_split_classes: vec!["OPTDecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, "lm_head.weight", "model.decoder.embed_tokens.weight")
}
