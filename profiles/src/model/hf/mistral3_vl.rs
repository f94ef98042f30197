//! `Mistral3ForConditionalGeneration` (Mistral Small 3.1 / 3.2): a Pixtral vision tower
//! (`model.vision_tower`: a patch convolution, an RMSNorm, RMSNorm blocks with q/k/v/o, a gated
//! SiLU MLP and 2-D rotary embeddings), a projector (`model.multi_modal_projector`: an RMSNorm,
//! a patch merger of 2 × 2 patches, two linears with GELU between), the Mistral decoder of
//! `text_config` (`model.language_model`), and `lm_head`.
//!
//! Module names (`modeling_pixtral.py`, `modeling_mistral3.py`, transformers 5.24 and 4.57):
//! `model.vision_tower.{patch_conv, ln_pre, transformer.layers.N.{attention_norm, feed_forward.
//! {gate_proj, up_proj, down_proj}, attention.{k_proj, v_proj, q_proj, o_proj}, ffn_norm},
//! patch_positional_embedding}`, `model.multi_modal_projector.{norm, patch_merger.merging_layer,
//! linear_1, linear_2}`. The rotary module holds `inv_freq` of `head_dim / 4` frequencies and
//! its original in 5.x; 4.57 precomputes the whole table, `(image_size / patch_size)² ×
//! head_dim`. Where `tie_word_embeddings` is absent, 5.x ties `lm_head` by the top level's
//! default (true) and 4.57 by the text config's (Mistral: false).

use super::HfConfig;
use super::nested_text::{self, Tie, TowerSizes, VISION_KEYS};
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{Builder, ImportOptions, ModelDescription, Module, ModuleKind, Naming, Tensor};
use crate::{DType, InputError};

/// `MistralConfig`'s defaults (transformers 5.24 and 4.57) for the keys the Mistral reading
/// has none for.
const TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("vocab_size", 32_000),
    ("hidden_size", 4096),
    ("intermediate_size", 14_336),
    ("num_hidden_layers", 32),
    ("num_attention_heads", 32),
];

/// `PixtralVisionConfig`'s defaults (transformers 5.24 and 4.57).
const VISION_DEFAULTS: &[(&str, u64)] = &[
    ("hidden_size", 1024),
    ("intermediate_size", 4096),
    ("num_hidden_layers", 24),
    ("num_attention_heads", 16),
    ("num_channels", 3),
    ("image_size", 1024),
    ("patch_size", 16),
];

/// The classes accelerate must not split: the `_no_split_modules` of the language model
/// (`MistralPreTrainedModel`) and of the tower (`PixtralPreTrainedModel`), transformers 5.24
/// and 4.57.
const NO_SPLIT: &[&str] = &["MistralDecoderLayer", "PixtralAttentionLayer"];

/// `PixtralImageProcessor`'s `size.longest_edge` when `preprocessor_config.json` gives none.
const DEFAULT_LONGEST_EDGE: u64 = 1024;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let tie = match options.naming {
        Naming::V5 => Tie::Top(true),
        Naming::V4 => Tie::Text(false),
    };
    let (vision, text) = nested_text::build(config, "MistralForCausalLM", TEXT_DEFAULTS, tie, &[], options)?;
    let dtype = text.model.dtype;
    let hidden = text.model.facts.hidden_size;

    let v = TowerSizes::read(&vision, VISION_DEFAULTS, VISION_KEYS)?;
    let image_size = nested_text::positive_or_default(&vision, VISION_DEFAULTS, "image_size")?;
    let head_dim = vision.head_dim(&["head_dim"], v.hidden, v.heads, "num_attention_heads")?;
    let merge = config.positive_or(&["spatial_merge_size"], 2)?;
    let projector_bias = config.bool_or(&["multimodal_projector_bias"], false)?;
    let feature_layers = match config.object().get("vision_feature_layer") {
        Some(serde_json::Value::Array(list)) => list.len().max(1) as u64,
        _ => 1,
    };

    let b = Builder::new(dtype, options.naming);
    let tower = "model.vision_tower";
    let layers_path = format!("{tower}.transformer.layers");
    let blocks: Vec<Module> = (0..v.depth)
        .map(|i| {
            let path = format!("{layers_path}.{i}");
            let (ff, attn) = (format!("{path}.feed_forward"), format!("{path}.attention"));
            let (q, kv) = (v.heads * head_dim, v.heads * head_dim);
            b.block(&layers_path, &i.to_string(), "PixtralAttentionLayer")
                .with_child(b.norm(&path, "attention_norm", "PixtralRMSNorm", v.hidden, false))
                .with_child(
                    b.container(&path, "feed_forward", "PixtralMLP")
                        .with_child(b.linear(&ff, "gate_proj", v.hidden, v.intermediate, false))
                        .with_child(b.linear(&ff, "up_proj", v.hidden, v.intermediate, false))
                        .with_child(b.linear(&ff, "down_proj", v.intermediate, v.hidden, false)),
                )
                .with_child(
                    b.container(&path, "attention", "PixtralAttention")
                        .with_child(b.linear(&attn, "k_proj", v.hidden, kv, false))
                        .with_child(b.linear(&attn, "v_proj", v.hidden, kv, false))
                        .with_child(b.linear(&attn, "q_proj", v.hidden, q, false))
                        .with_child(b.linear(&attn, "o_proj", q, v.hidden, false)),
                )
                .with_child(b.norm(&path, "ffn_norm", "PixtralRMSNorm", v.hidden, false))
        })
        .collect();
    let rotary_path = format!("{tower}.patch_positional_embedding");
    let rotary =
        match options.naming {
            // `inv_freq` of `head_dim / 2` frequencies (a quarter for each axis, twice), and its
            // original.
            Naming::V5 => b.rotary(tower, "patch_positional_embedding", "PixtralRotaryEmbedding", head_dim),
            // The whole 2-D table: one row per v.patch position of the largest image.
            Naming::V4 => {
                let side = image_size / v.patch;
                Module::new(rotary_path, "PixtralRotaryEmbedding", ModuleKind::Other)
                    .with_tensor(Tensor::buffer("inv_freq", &[side * side, head_dim], DType::F32, false))
            }
        };
    let vision_tower = b
        .container("model", "vision_tower", "PixtralVisionModel")
        .with_child(
            Module::new(format!("{tower}.patch_conv"), "Conv2d", ModuleKind::Other)
                .with_tensor(Tensor::parameter("weight", &[v.hidden, v.channels, v.patch, v.patch], dtype)),
        )
        .with_child(b.norm(tower, "ln_pre", "PixtralRMSNorm", v.hidden, false))
        .with_child(b.container(tower, "transformer", "PixtralTransformer").with_child(b.module_list(
            &format!("{tower}.transformer"),
            "layers",
            blocks,
        )))
        .with_child(rotary);
    let projector_path = "model.multi_modal_projector";
    let merger_path = format!("{projector_path}.patch_merger");
    let projector = b
        .container("model", "multi_modal_projector", "Mistral3MultiModalProjector")
        .with_child(b.norm(projector_path, "norm", "Mistral3RMSNorm", v.hidden, false))
        .with_child(b.container(projector_path, "patch_merger", "Mistral3PatchMerger").with_child(b.linear(
            &merger_path,
            "merging_layer",
            v.hidden * merge * merge,
            v.hidden,
            false,
        )))
        .with_child(b.linear(projector_path, "linear_1", v.hidden * feature_layers, hidden, projector_bias))
        .with_child(Module::new(format!("{projector_path}.act"), "GELUActivation", ModuleKind::Other))
        .with_child(b.linear(projector_path, "linear_2", hidden, hidden, projector_bias));

    let activation = vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into());
    let processor = ImageProcessor::LongestEdge { longest_edge: DEFAULT_LONGEST_EDGE };
    // Pixtral's blocks: RMSNorm, 2-D rotary embeddings, a gated MLP; every image in one sequence.
    let vision_facts = VisionFacts {
        rms_norm: true,
        rotary: true,
        gated_mlp: true,
        packed_images: true,
        ..v.facts(tower, processor, 1, merge, activation)
    };
    let model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "mistral3".into());
    let base = b.container("", "model", "Mistral3Model").with_child(vision_tower).with_child(projector);
    let mut model = text.assemble(&b, arch, base, model_type, NO_SPLIT);
    vision_facts.attach(&mut model.facts, &layers_path, v.depth);
    Ok(model)
}
