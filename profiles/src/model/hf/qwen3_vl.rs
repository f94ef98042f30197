//! `Qwen3VLForConditionalGeneration` (Qwen3-VL 2B–32B, dense): a vision tower (`model.visual`:
//! a 3-D patch embedding, learned position embeddings resampled to each image's grid, LayerNorm
//! blocks with a fused `qkv`, 2-D rotary and a plain MLP, a merger of 2 × 2 patches, and the
//! DeepStack mergers whose outputs join the first language layers) in front of the Qwen3 decoder
//! of `text_config` (`model.language_model`), and `lm_head`.
//!
//! Module names (`modeling_qwen3_vl.py`, transformers 5.24 and 4.57 alike): `model.visual.
//! {patch_embed.proj, pos_embed, rotary_pos_emb, blocks.N.{norm1, norm2, attn.{qkv, proj},
//! mlp.{linear_fc1, linear_fc2}}, merger.{norm, linear_fc1, linear_fc2},
//! deepstack_merger_list.N.{norm, linear_fc1, linear_fc2}}`, `model.language_model.
//! {embed_tokens, layers.N, norm, rotary_emb}`, `lm_head`. The main merger normalises each
//! patch (`hidden_size`) before the 2 × 2 shuffle, the DeepStack ones after it (`hidden_size ×
//! 4`). The decoder is Qwen3's (per-head q/k norms), its classes named `Qwen3VLText…`.

use super::HfConfig;
use super::nested_text::{self, NestedText, sub_config};
use super::qwen_vl::{DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS};
use crate::InputError;
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{
    Builder, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind, StackKind, Tensor,
};

/// `Qwen3VLTextConfig`'s defaults (transformers 5.24 and 4.57) for the keys the Qwen3 reading
/// has no default for.
const TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("vocab_size", 151_936),
    ("hidden_size", 4096),
    ("intermediate_size", 22_016),
    ("num_hidden_layers", 32),
    ("num_attention_heads", 32),
    ("num_key_value_heads", 32),
    ("head_dim", 128),
];

/// `Qwen3VLVisionConfig`'s defaults (transformers 5.24 and 4.57).
const VISION_DEFAULTS: &[(&str, u64)] = &[
    ("depth", 27),
    ("hidden_size", 1152),
    ("intermediate_size", 4304),
    ("num_heads", 16),
    ("in_channels", 3),
    ("patch_size", 16),
    ("spatial_merge_size", 2),
    ("temporal_patch_size", 2),
    ("out_hidden_size", 3584),
    ("num_position_embeddings", 2304),
];

/// The decoder's classes as Qwen3-VL names them.
const TEXT_CLASSES: &[(&str, &str)] = &[
    ("Qwen3Model", "Qwen3VLTextModel"),
    ("Qwen3DecoderLayer", "Qwen3VLTextDecoderLayer"),
    ("Qwen3Attention", "Qwen3VLTextAttention"),
    ("Qwen3MLP", "Qwen3VLTextMLP"),
    ("Qwen3RMSNorm", "Qwen3VLTextRMSNorm"),
    ("Qwen3RotaryEmbedding", "Qwen3VLTextRotaryEmbedding"),
];

/// A patch merger at `parent.name`: a LayerNorm over `norm_width`, then `linear_fc1`
/// (`merged` → `merged`), GELU, `linear_fc2` (`merged` → `out`).
fn merger(b: &Builder, parent: &str, name: &str, norm_width: u64, merged: u64, out: u64) -> Module {
    let path = format!("{parent}.{name}");
    b.container(parent, name, "Qwen3VLVisionPatchMerger")
        .with_child(b.norm(&path, "norm", "LayerNorm", norm_width, true))
        .with_child(b.linear(&path, "linear_fc1", merged, merged, true))
        .with_child(Module::new(format!("{path}.act_fn"), "GELU", ModuleKind::Other))
        .with_child(b.linear(&path, "linear_fc2", merged, out, true))
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let vision = sub_config(config, "vision_config")?;
    let text = sub_config(config, "text_config")?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let NestedText { mut model, language_model, lm_head } =
        nested_text::build(config, &text, "Qwen3ForCausalLM", TEXT_DEFAULTS, tie, TEXT_CLASSES, options)?;
    let dtype = model.dtype;
    let hidden = model.facts.hidden_size;

    let read = |key: &str| {
        let default = VISION_DEFAULTS.iter().find(|(k, _)| *k == key).map_or(1, |(_, v)| *v);
        vision.positive_or(&[key], default)
    };
    let depth = read("depth")?;
    let v_hidden = read("hidden_size")?;
    let v_heads = read("num_heads")?;
    let v_intermediate = read("intermediate_size")?;
    let patch = read("patch_size")?;
    let temporal = read("temporal_patch_size")?;
    let merge = read("spatial_merge_size")?;
    let channels = read("in_channels")?;
    let positions = read("num_position_embeddings")?;
    let out_hidden = vision.positive_or(&["out_hidden_size"], hidden)?;
    let deepstack = vision.uint_list(&["deepstack_visual_indexes"])?.unwrap_or_else(|| vec![8, 16, 24]);
    if let Some(&past) = deepstack.iter().find(|&&i| i >= depth) {
        return Err(InputError::new(
            vision.origin(),
            format!("DeepStack block {past} is past the tower's {depth} blocks"),
        )
        .at_key("deepstack_visual_indexes")
        .with_fix("give block indexes below `depth`, as the published config does"));
    }
    if !v_hidden.is_multiple_of(v_heads) {
        return Err(InputError::new(
            vision.origin(),
            format!("{v_hidden} is not a whole number of {v_heads} heads"),
        )
        .at_key("num_heads")
        .with_fix("give the published `hidden_size` and `num_heads`"));
    }

    let b = Builder::new(dtype, options.naming);
    let visual = "model.visual";
    let blocks_path = format!("{visual}.blocks");
    let blocks: Vec<Module> = (0..depth)
        .map(|i| {
            let path = format!("{blocks_path}.{i}");
            let attn = b
                .container(&path, "attn", "Qwen3VLVisionAttention")
                .with_child(b.linear(&format!("{path}.attn"), "qkv", v_hidden, 3 * v_hidden, true))
                .with_child(b.linear(&format!("{path}.attn"), "proj", v_hidden, v_hidden, true));
            let mlp = b
                .container(&path, "mlp", "Qwen3VLVisionMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "linear_fc1", v_hidden, v_intermediate, true))
                .with_child(b.linear(&format!("{path}.mlp"), "linear_fc2", v_intermediate, v_hidden, true));
            b.block(&blocks_path, &i.to_string(), "Qwen3VLVisionBlock")
                .with_child(b.norm(&path, "norm1", "LayerNorm", v_hidden, true))
                .with_child(b.norm(&path, "norm2", "LayerNorm", v_hidden, true))
                .with_child(attn)
                .with_child(mlp)
        })
        .collect();
    let merged = v_hidden * merge * merge;
    let list_path = format!("{visual}.deepstack_merger_list");
    let deepstack_mergers: Vec<Module> = (0..deepstack.len())
        .map(|i| merger(&b, &list_path, &i.to_string(), merged, merged, out_hidden))
        .collect();
    let tower = b
        .container("model", "visual", "Qwen3VLVisionModel")
        .with_child(
            b.container(visual, "patch_embed", "Qwen3VLVisionPatchEmbed").with_child(
                Module::new(format!("{visual}.patch_embed.proj"), "Conv3d", ModuleKind::Other)
                    .with_tensor(Tensor::parameter(
                        "weight",
                        &[v_hidden, channels, temporal, patch, patch],
                        dtype,
                    ))
                    .with_tensor(Tensor::parameter("bias", &[v_hidden], dtype)),
            ),
        )
        .with_child(b.embedding(visual, "pos_embed", positions, v_hidden))
        .with_child(b.rotary(
            visual,
            "rotary_pos_emb",
            "Qwen3VLVisionRotaryEmbedding",
            v_hidden / v_heads / 2,
        ))
        .with_child(b.module_list(visual, "blocks", blocks))
        .with_child(merger(&b, visual, "merger", v_hidden, merged, out_hidden))
        .with_child(b.module_list(visual, "deepstack_merger_list", deepstack_mergers));

    model.root = b
        .container("", "", arch)
        .with_child(b.container("", "model", "Qwen3VLModel").with_child(tower).with_child(language_model))
        .with_child(lm_head);
    model.architecture = arch.to_string();
    model.facts.model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "qwen3_vl".into());
    model.facts.no_split_classes = vec!["Qwen3VLTextDecoderLayer".into(), "Qwen3VLVisionBlock".into()];
    let mut layers: Vec<LayerFacts> = (0..depth)
        .map(|i| LayerFacts {
            path: format!("{blocks_path}.{i}"),
            stack: StackKind::Vision,
            moe: false,
            attention_window: None,
            cross_attention: false,
            ssm: None,
        })
        .collect();
    layers.append(&mut model.facts.layers);
    model.facts.layers = layers;
    model.facts.vision = Some(VisionFacts {
        path: visual.into(),
        processor: ImageProcessor::SmartResize,
        rms_norm: false,
        rotary: true,
        hidden_size: v_hidden,
        num_heads: v_heads,
        intermediate_size: v_intermediate,
        gated_mlp: false,
        activation: vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu_pytorch_tanh".into()),
        patch_size: patch,
        merge_size: merge,
        temporal_patch_size: temporal,
        patch_values: channels * temporal * patch * patch,
        window_pixels: None,
        full_attention_blocks: Vec::new(),
        deepstack_blocks: deepstack,
        hooked_input_embeddings: false,
        packed_images: false,
        min_pixels: DEFAULT_MIN_PIXELS,
        max_pixels: DEFAULT_MAX_PIXELS,
    });
    Ok(model)
}
