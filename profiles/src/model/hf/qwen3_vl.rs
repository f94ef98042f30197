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
use super::nested_text::{self, QWEN_VISION_KEYS, Tie, TowerSizes};
use crate::InputError;
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{Builder, ImportOptions, ModelDescription, Module, ModuleKind, Tensor};

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

/// The classes `Qwen3VLPreTrainedModel._no_split_modules` names (transformers 5.24 and 4.57).
const NO_SPLIT: &[&str] = &["Qwen3VLTextDecoderLayer", "Qwen3VLVisionBlock"];

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
    let (vision, text) = nested_text::build(
        config,
        "Qwen3ForCausalLM",
        TEXT_DEFAULTS,
        Tie::Top(false),
        TEXT_CLASSES,
        options,
    )?;
    let dtype = text.model.dtype;
    let hidden = text.model.facts.hidden_size;

    let v = TowerSizes::read(&vision, VISION_DEFAULTS, QWEN_VISION_KEYS)?;
    let read = |key: &str| nested_text::positive_or_default(&vision, VISION_DEFAULTS, key);
    let temporal = read("temporal_patch_size")?;
    let merge = read("spatial_merge_size")?;
    let positions = read("num_position_embeddings")?;
    let out_hidden = vision.positive_or(&["out_hidden_size"], hidden)?;
    let deepstack = vision.uint_list(&["deepstack_visual_indexes"])?.unwrap_or_else(|| vec![8, 16, 24]);
    if let Some(&past) = deepstack.iter().find(|&&i| i >= v.depth) {
        return Err(InputError::new(
            vision.origin(),
            format!("DeepStack block {past} is past the tower's {} blocks", v.depth),
        )
        .at_key("deepstack_visual_indexes")
        .with_fix("give block indexes below `depth`, as the published config does"));
    }
    if !v.hidden.is_multiple_of(v.heads) {
        return Err(InputError::new(
            vision.origin(),
            format!("{} is not a whole number of {} heads", v.hidden, v.heads),
        )
        .at_key("num_heads")
        .with_fix("give the published `hidden_size` and `num_heads`"));
    }

    let b = Builder::new(dtype, options.naming);
    let visual = "model.visual";
    let blocks_path = format!("{visual}.blocks");
    let blocks: Vec<Module> = (0..v.depth)
        .map(|i| {
            let path = format!("{blocks_path}.{i}");
            let attn = b
                .container(&path, "attn", "Qwen3VLVisionAttention")
                .with_child(b.linear(&format!("{path}.attn"), "qkv", v.hidden, 3 * v.hidden, true))
                .with_child(b.linear(&format!("{path}.attn"), "proj", v.hidden, v.hidden, true));
            let mlp = b
                .container(&path, "mlp", "Qwen3VLVisionMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "linear_fc1", v.hidden, v.intermediate, true))
                .with_child(b.linear(&format!("{path}.mlp"), "linear_fc2", v.intermediate, v.hidden, true));
            b.block(&blocks_path, &i.to_string(), "Qwen3VLVisionBlock")
                .with_child(b.norm(&path, "norm1", "LayerNorm", v.hidden, true))
                .with_child(b.norm(&path, "norm2", "LayerNorm", v.hidden, true))
                .with_child(attn)
                .with_child(mlp)
        })
        .collect();
    let merged = v.hidden * merge * merge;
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
                        &[v.hidden, v.channels, temporal, v.patch, v.patch],
                        dtype,
                    ))
                    .with_tensor(Tensor::parameter("bias", &[v.hidden], dtype)),
            ),
        )
        .with_child(b.embedding(visual, "pos_embed", positions, v.hidden))
        .with_child(b.rotary(
            visual,
            "rotary_pos_emb",
            "Qwen3VLVisionRotaryEmbedding",
            v.hidden / v.heads / 2,
        ))
        .with_child(b.module_list(visual, "blocks", blocks))
        .with_child(merger(&b, visual, "merger", v.hidden, merged, out_hidden))
        .with_child(b.module_list(visual, "deepstack_merger_list", deepstack_mergers));

    let activation = vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu_pytorch_tanh".into());
    // 2-D rotary embeddings, DeepStack, and no input embeddings for PEFT to hook.
    let vision_facts = VisionFacts {
        rotary: true,
        deepstack_blocks: deepstack,
        hooked_input_embeddings: false,
        ..v.facts(visual, ImageProcessor::SmartResize, temporal, merge, activation)
    };
    let model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "qwen3_vl".into());
    let base = b.container("", "model", "Qwen3VLModel").with_child(tower);
    let mut model = text.assemble(&b, arch, base, model_type, NO_SPLIT);
    vision_facts.attach(&mut model.facts, &blocks_path, v.depth);
    Ok(model)
}
