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
use super::nested_text::{self, NestedText, sub_config};
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{
    Builder, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind, Naming, StackKind, Tensor,
};
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

/// `PixtralImageProcessor`'s `size.longest_edge` when `preprocessor_config.json` gives none.
const DEFAULT_LONGEST_EDGE: u64 = 1024;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let vision = sub_config(config, "vision_config")?;
    let text = sub_config(config, "text_config")?;
    let tie = match options.naming {
        Naming::V5 => config.bool_or(&["tie_word_embeddings"], true)?,
        Naming::V4 => text.bool_or(&["tie_word_embeddings"], false)?,
    };
    let NestedText { mut model, language_model, lm_head } =
        nested_text::build(config, &text, "MistralForCausalLM", TEXT_DEFAULTS, tie, &[], options)?;
    let dtype = model.dtype;
    let hidden = model.facts.hidden_size;

    let read = |key: &str| {
        let default = VISION_DEFAULTS.iter().find(|(k, _)| *k == key).map_or(1, |(_, v)| *v);
        vision.positive_or(&[key], default)
    };
    let depth = read("num_hidden_layers")?;
    let v_hidden = read("hidden_size")?;
    let v_heads = read("num_attention_heads")?;
    let v_intermediate = read("intermediate_size")?;
    let patch = read("patch_size")?;
    let channels = read("num_channels")?;
    let image_size = read("image_size")?;
    let head_dim = vision.head_dim(&["head_dim"], v_hidden, v_heads, "num_attention_heads")?;
    let merge = config.positive_or(&["spatial_merge_size"], 2)?;
    let projector_bias = config.bool_or(&["multimodal_projector_bias"], false)?;
    let feature_layers = match config.object().get("vision_feature_layer") {
        Some(serde_json::Value::Array(list)) => list.len().max(1) as u64,
        _ => 1,
    };

    let b = Builder::new(dtype, options.naming);
    let tower = "model.vision_tower";
    let layers_path = format!("{tower}.transformer.layers");
    let blocks: Vec<Module> = (0..depth)
        .map(|i| {
            let path = format!("{layers_path}.{i}");
            let (ff, attn) = (format!("{path}.feed_forward"), format!("{path}.attention"));
            let (q, kv) = (v_heads * head_dim, v_heads * head_dim);
            b.block(&layers_path, &i.to_string(), "PixtralAttentionLayer")
                .with_child(b.norm(&path, "attention_norm", "PixtralRMSNorm", v_hidden, false))
                .with_child(
                    b.container(&path, "feed_forward", "PixtralMLP")
                        .with_child(b.linear(&ff, "gate_proj", v_hidden, v_intermediate, false))
                        .with_child(b.linear(&ff, "up_proj", v_hidden, v_intermediate, false))
                        .with_child(b.linear(&ff, "down_proj", v_intermediate, v_hidden, false)),
                )
                .with_child(
                    b.container(&path, "attention", "PixtralAttention")
                        .with_child(b.linear(&attn, "k_proj", v_hidden, kv, false))
                        .with_child(b.linear(&attn, "v_proj", v_hidden, kv, false))
                        .with_child(b.linear(&attn, "q_proj", v_hidden, q, false))
                        .with_child(b.linear(&attn, "o_proj", q, v_hidden, false)),
                )
                .with_child(b.norm(&path, "ffn_norm", "PixtralRMSNorm", v_hidden, false))
        })
        .collect();
    let rotary_path = format!("{tower}.patch_positional_embedding");
    let rotary =
        match options.naming {
            // `inv_freq` of `head_dim / 2` frequencies (a quarter for each axis, twice), and its
            // original.
            Naming::V5 => b.rotary(tower, "patch_positional_embedding", "PixtralRotaryEmbedding", head_dim),
            // The whole 2-D table: one row per patch position of the largest image.
            Naming::V4 => {
                let side = image_size / patch;
                Module::new(rotary_path, "PixtralRotaryEmbedding", ModuleKind::Other)
                    .with_tensor(Tensor::buffer("inv_freq", &[side * side, head_dim], DType::F32, false))
            }
        };
    let vision_tower = b
        .container("model", "vision_tower", "PixtralVisionModel")
        .with_child(
            Module::new(format!("{tower}.patch_conv"), "Conv2d", ModuleKind::Other)
                .with_tensor(Tensor::parameter("weight", &[v_hidden, channels, patch, patch], dtype)),
        )
        .with_child(b.norm(tower, "ln_pre", "PixtralRMSNorm", v_hidden, false))
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
        .with_child(b.norm(projector_path, "norm", "Mistral3RMSNorm", v_hidden, false))
        .with_child(b.container(projector_path, "patch_merger", "Mistral3PatchMerger").with_child(b.linear(
            &merger_path,
            "merging_layer",
            v_hidden * merge * merge,
            v_hidden,
            false,
        )))
        .with_child(b.linear(projector_path, "linear_1", v_hidden * feature_layers, hidden, projector_bias))
        .with_child(Module::new(format!("{projector_path}.act"), "GELUActivation", ModuleKind::Other))
        .with_child(b.linear(projector_path, "linear_2", hidden, hidden, projector_bias));

    model.root = b
        .container("", "", arch)
        .with_child(
            b.container("", "model", "Mistral3Model")
                .with_child(vision_tower)
                .with_child(projector)
                .with_child(language_model),
        )
        .with_child(lm_head);
    model.architecture = arch.to_string();
    model.facts.model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "mistral3".into());
    model.facts.no_split_classes = vec!["MistralDecoderLayer".into(), "PixtralAttentionLayer".into()];
    let mut layers: Vec<LayerFacts> = (0..depth)
        .map(|i| LayerFacts {
            path: format!("{layers_path}.{i}"),
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
        path: tower.into(),
        processor: ImageProcessor::LongestEdge { longest_edge: DEFAULT_LONGEST_EDGE },
        rms_norm: true,
        rotary: true,
        hidden_size: v_hidden,
        num_heads: v_heads,
        intermediate_size: v_intermediate,
        gated_mlp: true,
        activation: vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into()),
        patch_size: patch,
        merge_size: merge,
        temporal_patch_size: 1,
        patch_values: channels * patch * patch,
        window_pixels: None,
        full_attention_blocks: Vec::new(),
        deepstack_blocks: Vec::new(),
        hooked_input_embeddings: true,
        packed_images: true,
        min_pixels: 1,
        max_pixels: 1,
    });
    Ok(model)
}
