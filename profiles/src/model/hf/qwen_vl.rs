//! `Qwen2_5_VLForConditionalGeneration` (Qwen2.5-VL): a vision tower (`model.visual`: a 3-D
//! patch embedding, RMSNorm blocks with a fused `qkv` and a gated MLP, windowed attention but
//! in `fullatt_block_indexes`, a merger of 2 × 2 patches into one token of the language
//! model's width) in front of a Qwen2 decoder (`model.language_model`) and an untied `lm_head`.
//!
//! Module names (transformers 5.x and 4.52+, `modeling_qwen2_5_vl.py`): `model.visual.
//! {patch_embed.proj, rotary_pos_emb, blocks.N.{norm1, norm2, attn.{qkv, proj}, mlp.{gate_proj,
//! up_proj, down_proj}}, merger.{ln_q, mlp.0, mlp.2}}`, `model.language_model.{embed_tokens,
//! layers.N, norm, rotary_emb}`, `lm_head`. 4.x also gives every decoder layer's attention its
//! own `rotary_emb`. The vision sizes come from `vision_config`, the text sizes from
//! `text_config` where the config nests them (5.x saves it so) or from the top level.

use super::nested_text::TowerSizes;
use super::{HfConfig, describe, llama};
use crate::InputError;
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, ModuleKind, Naming, NormKind,
    OutputHead, Tensor,
};

/// transformers' `Qwen2VLImageProcessor` bounds (`size.shortest_edge`, `size.longest_edge`)
/// when the model's `preprocessor_config.json` does not give its own.
pub(crate) const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
/// See [`DEFAULT_MIN_PIXELS`].
pub(crate) const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;

/// The nested config at `key` (`vision_config`, `text_config`), named after its parent in errors.
fn sub_config(config: &HfConfig, key: &str) -> Option<HfConfig> {
    let object = config.object().get(key)?.as_object()?.clone();
    Some(HfConfig::from_object(object, &format!("{} ({key})", config.origin())))
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let vision = sub_config(config, "vision_config").ok_or_else(|| {
        InputError::new(config.origin(), "a vision-language config without `vision_config`")
            .at_key("vision_config")
            .with_fix("give the model's published config.json, which nests the vision tower's sizes")
    })?;
    let text = sub_config(config, "text_config").unwrap_or_else(|| config.clone());
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    // The language model.
    let layers = text.positive(&["num_hidden_layers"])?;
    let hidden = text.positive(&["hidden_size"])?;
    let heads = text.positive(&["num_attention_heads"])?;
    let kv_heads = text.positive_or(&["num_key_value_heads"], heads)?;
    let head_dim = text.head_dim(&["head_dim"], hidden, heads, "num_attention_heads")?;
    let intermediate = text.positive(&["intermediate_size"])?;
    let vocab = text.positive(&["vocab_size"])?;
    let max_positions = text.positive_or(&["max_position_embeddings"], 128_000)?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;

    // The vision tower.
    let v = TowerSizes {
        depth: vision.positive(&["depth", "num_hidden_layers"])?,
        hidden: vision.positive(&["hidden_size", "embed_dim"])?,
        heads: vision.positive(&["num_heads"])?,
        intermediate: vision.positive(&["intermediate_size"])?,
        patch: vision.positive_or(&["patch_size", "spatial_patch_size"], 14)?,
        channels: vision.positive_or(&["in_channels", "in_chans"], 3)?,
    };
    let temporal = vision.positive_or(&["temporal_patch_size"], 2)?;
    let merge = vision.positive_or(&["spatial_merge_size"], 2)?;
    let out_hidden = vision.positive_or(&["out_hidden_size"], hidden)?;
    let window = vision.opt_positive(&["window_size"])?;
    let full_blocks = vision.uint_list(&["fullatt_block_indexes"])?.unwrap_or_default();

    let visual_path = "model.visual";
    let blocks_path = format!("{visual_path}.blocks");
    let vision_blocks: Vec<Module> = (0..v.depth)
        .map(|i| {
            let path = format!("{blocks_path}.{i}");
            let attn = b
                .container(&path, "attn", "Qwen2_5_VLVisionAttention")
                .with_child(b.linear(&format!("{path}.attn"), "qkv", v.hidden, 3 * v.hidden, true))
                .with_child(b.linear(&format!("{path}.attn"), "proj", v.hidden, v.hidden, true));
            b.block(&blocks_path, &i.to_string(), "Qwen2_5_VLVisionBlock")
                .with_child(b.norm(&path, "norm1", "Qwen2RMSNorm", v.hidden, false))
                .with_child(b.norm(&path, "norm2", "Qwen2RMSNorm", v.hidden, false))
                .with_child(attn)
                .with_child(llama::gated_mlp(
                    &b,
                    &path,
                    "mlp",
                    "Qwen2_5_VLMLP",
                    v.hidden,
                    v.intermediate,
                    true,
                ))
        })
        .collect();
    let patch_embed = b.container(visual_path, "patch_embed", "Qwen2_5_VisionPatchEmbed").with_child(
        Module::new(format!("{visual_path}.patch_embed.proj"), "Conv3d", ModuleKind::Other).with_tensor(
            Tensor::parameter("weight", &[v.hidden, v.channels, temporal, v.patch, v.patch], dtype),
        ),
    );
    let merged = v.hidden * merge * merge;
    let merger_path = format!("{visual_path}.merger");
    let merger = b
        .container(visual_path, "merger", "Qwen2_5_VLPatchMerger")
        .with_child(b.norm(&merger_path, "ln_q", "Qwen2RMSNorm", v.hidden, false))
        .with_child(
            b.container(&merger_path, "mlp", "Sequential")
                .with_child(b.linear(&format!("{merger_path}.mlp"), "0", merged, merged, true))
                .with_child(Module::new(format!("{merger_path}.mlp.1"), "GELU", ModuleKind::Other))
                .with_child(b.linear(&format!("{merger_path}.mlp"), "2", merged, out_hidden, true)),
        );
    let visual = b
        .container("model", "visual", "Qwen2_5_VisionTransformerPretrainedModel")
        .with_child(patch_embed)
        .with_child(b.rotary(
            visual_path,
            "rotary_pos_emb",
            "Qwen2_5_VisionRotaryEmbedding",
            v.hidden / v.heads / 2,
        ))
        .with_child(b.module_list(visual_path, "blocks", vision_blocks))
        .with_child(merger);

    let lm_path = "model.language_model";
    let list = format!("{lm_path}.layers");
    let decoder_blocks: Vec<Module> = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let attn_path = format!("{path}.self_attn");
            let mut attn = b
                .container(&path, "self_attn", "Qwen2_5_VLAttention")
                .with_child(b.linear(&attn_path, "q_proj", hidden, heads * head_dim, true))
                .with_child(b.linear(&attn_path, "k_proj", hidden, kv_heads * head_dim, true))
                .with_child(b.linear(&attn_path, "v_proj", hidden, kv_heads * head_dim, true))
                .with_child(b.linear(&attn_path, "o_proj", heads * head_dim, hidden, false));
            if options.naming == Naming::V4 {
                attn = attn.with_child(b.rotary(
                    &attn_path,
                    "rotary_emb",
                    "Qwen2_5_VLRotaryEmbedding",
                    head_dim,
                ));
            }
            b.block(&list, &i.to_string(), "Qwen2_5_VLDecoderLayer")
                .with_child(attn)
                .with_child(llama::gated_mlp(&b, &path, "mlp", "Qwen2MLP", hidden, intermediate, false))
                .with_child(b.norm(&path, "input_layernorm", "Qwen2RMSNorm", hidden, false))
                .with_child(b.norm(&path, "post_attention_layernorm", "Qwen2RMSNorm", hidden, false))
        })
        .collect();
    let language_model = b
        .container("model", "language_model", "Qwen2_5_VLTextModel")
        .with_child(b.embedding(lm_path, "embed_tokens", vocab, hidden))
        .with_child(b.module_list(lm_path, "layers", decoder_blocks))
        .with_child(b.norm(lm_path, "norm", "Qwen2RMSNorm", hidden, false))
        .with_child(b.rotary(lm_path, "rotary_emb", "Qwen2_5_VLRotaryEmbedding", head_dim));
    let root = b
        .container("", "", arch)
        .with_child(b.container("", "model", "Qwen2_5_VLModel").with_child(visual).with_child(language_model))
        .with_child(b.linear("", "lm_head", hidden, vocab, false));

    let activation = vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into());
    // RMSNorm blocks with 2-D rotary embeddings and a gated MLP, all but a few windowed.
    let vision_facts = VisionFacts {
        rms_norm: true,
        rotary: true,
        gated_mlp: true,
        window_pixels: window,
        full_attention_blocks: full_blocks,
        ..v.facts(visual_path, ImageProcessor::SmartResize, temporal, merge, activation)
    };
    let mut facts = ArchFacts {
        model_type: config.string_opt(&["model_type"])?.unwrap_or_else(|| "qwen2_5_vl".into()),
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
        activation: text.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: llama::layer_facts(&list, &vec![false; layers as usize], &[]),
        no_split_classes: vec!["Qwen2_5_VLDecoderLayer".into(), "Qwen2_5_VLVisionBlock".into()],
        head: OutputHead::LanguageModel,
        vision: None,
    };
    // The tower runs before the language model's layers.
    vision_facts.attach(&mut facts, &blocks_path, v.depth);
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    super::tie_if(tie, description, "lm_head.weight", &format!("{lm_path}.embed_tokens.weight"))
}

/// The name transformers loads a published checkpoint's tensor `name` under, where it differs:
/// Qwen2-VL and Qwen2.5-VL checkpoints keep 4.51's names (`visual.…`, `model.layers.…`), which
/// the class's conversion mapping moves under `model.visual` and `model.language_model`
/// (`conversion_mapping.py`, transformers 5.24, "Qwen2VLForConditionalGeneration"; 4.52+'s
/// `_checkpoint_conversion_mapping`).
pub(crate) fn checkpoint_name(name: &str) -> Option<String> {
    if let Some(rest) = name.strip_prefix("visual.") {
        return Some(format!("model.visual.{rest}"));
    }
    let rest = name.strip_prefix("model.")?;
    (!rest.starts_with("language_model.") && !rest.starts_with("visual."))
        .then(|| format!("model.language_model.{rest}"))
}
