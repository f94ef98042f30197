//! `Gemma3ForConditionalGeneration` (Gemma 3 4B, 12B, 27B): a SigLIP vision tower
//! (`model.vision_tower`), a projector that pools the tower's patches to `mm_tokens_per_image`
//! tokens and projects them to the language model's width (`model.multi_modal_projector`), the
//! Gemma 3 text decoder (`model.language_model`), and `lm_head` tied to its embedding.
//!
//! Module names (`modeling_gemma3.py`, `modeling_siglip.py`): 5.x `model.vision_tower.
//! {embeddings.{patch_embedding, position_embedding}, encoder.layers.N.{layer_norm1, self_attn.
//! {k_proj, v_proj, q_proj, out_proj}, layer_norm2, mlp.{fc1, fc2}}, post_layernorm}`; 4.57 puts
//! the same modules under `model.vision_tower.vision_model`. The projector holds
//! `mm_input_projection_weight` itself, then `mm_soft_emb_norm` and a parameterless `avg_pool`.
//! The language model is the `Gemma3ForCausalLM` decoder of `text_config` ([`super::llama`]),
//! moved under `model.language_model`. Every class's `_no_split_modules` names SigLIP's
//! embeddings, text embeddings and pooling head besides the two layer classes.

use super::HfConfig;
use super::nested_text::{self, NestedText, sub_config};
use crate::DType;
use crate::InputError;
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{
    Builder, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind, Naming, StackKind, Tensor,
};

/// `Gemma3Config.mm_tokens_per_image` when the config does not give it.
const DEFAULT_TOKENS_PER_IMAGE: u64 = 256;

/// `Gemma3TextConfig`'s defaults (transformers 5.24 and 4.57) for the keys the published
/// configs leave out, which `Gemma3ForCausalLM`'s own reading has no default for.
const TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
];

/// `SiglipVisionConfig`'s defaults (transformers 5.24 and 4.57) for absent `vision_config` keys.
const VISION_DEFAULTS: &[(&str, u64)] = &[
    ("hidden_size", 768),
    ("intermediate_size", 3072),
    ("num_hidden_layers", 12),
    ("num_attention_heads", 12),
    ("image_size", 224),
    ("patch_size", 16),
    ("num_channels", 3),
];

/// The value of `key` in `defaults`.
fn default_of(defaults: &[(&str, u64)], key: &str) -> u64 {
    defaults.iter().find(|(k, _)| *k == key).map_or(1, |(_, v)| *v)
}

/// The classes `Gemma3PreTrainedModel._no_split_modules` names (transformers 5.24 and 4.57),
/// the SigLIP text embeddings and pooling head among them, which this model does not hold.
const NO_SPLIT: &[&str] = &[
    "Gemma3DecoderLayer",
    "SiglipEncoderLayer",
    "SiglipMultiheadAttentionPoolingHead",
    "SiglipTextEmbeddings",
    "SiglipVisionEmbeddings",
];

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let vision = sub_config(config, "vision_config")?;
    let text = sub_config(config, "text_config")?;
    let dtype = config.dtype()?;
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;

    // The language model: Gemma3ForCausalLM from `text_config`, in the top level's dtype.
    let classes = [("Gemma3Model", "Gemma3TextModel")];
    let text = nested_text::build(config, &text, "Gemma3ForCausalLM", TEXT_DEFAULTS, tie, &classes, options)?;
    let NestedText { mut model, language_model, lm_head } = text;

    // The SigLIP tower.
    let read = |key: &str| vision.positive_or(&[key], default_of(VISION_DEFAULTS, key));
    let depth = read("num_hidden_layers")?;
    let v_hidden = read("hidden_size")?;
    let v_heads = read("num_attention_heads")?;
    let v_intermediate = read("intermediate_size")?;
    let patch = read("patch_size")?;
    let image_size = read("image_size")?;
    let channels = read("num_channels")?;
    let tokens = config.positive_or(&["mm_tokens_per_image"], DEFAULT_TOKENS_PER_IMAGE)?;
    let side = image_size / patch;
    let pooled_side = (tokens as f64).sqrt() as u64;
    if side == 0 || pooled_side * pooled_side != tokens || side % pooled_side != 0 {
        return Err(InputError::new(
            config.origin(),
            format!(
                "{tokens} tokens an image do not pool {side} × {side} patches (`image_size` {image_size} / \
                 `patch_size` {patch}) into a square of whole kernels"
            ),
        )
        .at_key("mm_tokens_per_image")
        .with_fix("give the published `mm_tokens_per_image` (256) and vision_config's `image_size` and `patch_size`"));
    }
    if vision.bool_or(&["vision_use_head"], false)? {
        return Err(InputError::new(vision.origin(), "a SigLIP pooling head in Gemma 3's vision tower")
            .at_key("vision_use_head")
            .with_fix("Gemma 3's published configs set `vision_use_head` false; describe another tower in custom YAML"));
    }
    let b = Builder::new(dtype, options.naming);
    let tower = "model.vision_tower";
    let inner = match options.naming {
        Naming::V5 => tower.to_string(),
        Naming::V4 => format!("{tower}.vision_model"),
    };
    let layers_path = format!("{inner}.encoder.layers");
    let blocks: Vec<Module> = (0..depth)
        .map(|i| {
            let path = format!("{layers_path}.{i}");
            let attn_path = format!("{path}.self_attn");
            let attn = b
                .container(&path, "self_attn", "SiglipAttention")
                .with_child(b.linear(&attn_path, "k_proj", v_hidden, v_hidden, true))
                .with_child(b.linear(&attn_path, "v_proj", v_hidden, v_hidden, true))
                .with_child(b.linear(&attn_path, "q_proj", v_hidden, v_hidden, true))
                .with_child(b.linear(&attn_path, "out_proj", v_hidden, v_hidden, true));
            let mlp = b
                .container(&path, "mlp", "SiglipMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "fc1", v_hidden, v_intermediate, true))
                .with_child(b.linear(&format!("{path}.mlp"), "fc2", v_intermediate, v_hidden, true));
            b.block(&layers_path, &i.to_string(), "SiglipEncoderLayer")
                .with_child(b.norm(&path, "layer_norm1", "LayerNorm", v_hidden, true))
                .with_child(attn)
                .with_child(b.norm(&path, "layer_norm2", "LayerNorm", v_hidden, true))
                .with_child(mlp)
        })
        .collect();
    let embeddings_path = format!("{inner}.embeddings");
    let embeddings = b
        .container(&inner, "embeddings", "SiglipVisionEmbeddings")
        .with_tensor(Tensor::buffer("position_ids", &[1, side * side], DType::I64, false))
        .with_child(
            Module::new(format!("{embeddings_path}.patch_embedding"), "Conv2d", ModuleKind::Other)
                .with_tensor(Tensor::parameter("weight", &[v_hidden, channels, patch, patch], dtype))
                .with_tensor(Tensor::parameter("bias", &[v_hidden], dtype)),
        )
        .with_child(b.embedding(&embeddings_path, "position_embedding", side * side, v_hidden));
    let transformer = b
        .container(tower, "vision_model", "SiglipVisionTransformer")
        .with_child(embeddings)
        .with_child(b.container(&inner, "encoder", "SiglipEncoder").with_child(b.module_list(
            &format!("{inner}.encoder"),
            "layers",
            blocks,
        )))
        .with_child(b.norm(&inner, "post_layernorm", "LayerNorm", v_hidden, true));
    let vision_tower = match options.naming {
        Naming::V5 => Module { path: tower.into(), class: "SiglipVisionModel".into(), ..transformer },
        Naming::V4 => b.container("model", "vision_tower", "SiglipVisionModel").with_child(transformer),
    };
    let projector_path = "model.multi_modal_projector";
    let hidden = model.facts.hidden_size;
    let projector = b
        .container("model", "multi_modal_projector", "Gemma3MultiModalProjector")
        .with_tensor(Tensor::parameter("mm_input_projection_weight", &[v_hidden, hidden], dtype))
        .with_child(b.norm(projector_path, "mm_soft_emb_norm", "Gemma3RMSNorm", v_hidden, false))
        .with_child(Module::new(format!("{projector_path}.avg_pool"), "AvgPool2d", ModuleKind::Other));

    model.root = b
        .container("", "", arch)
        .with_child(
            b.container("", "model", "Gemma3Model")
                .with_child(vision_tower)
                .with_child(projector)
                .with_child(language_model),
        )
        .with_child(lm_head);
    model.architecture = arch.to_string();
    model.facts.model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "gemma3".into());
    model.facts.no_split_classes = NO_SPLIT.iter().map(|c| c.to_string()).collect();
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
        processor: ImageProcessor::Fixed { height: image_size, width: image_size, tokens },
        rms_norm: false,
        rotary: false,
        hidden_size: v_hidden,
        num_heads: v_heads,
        intermediate_size: v_intermediate,
        gated_mlp: false,
        activation: vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu_pytorch_tanh".into()),
        patch_size: patch,
        merge_size: side / pooled_side,
        temporal_patch_size: 1,
        patch_values: channels * patch * patch,
        window_pixels: None,
        full_attention_blocks: Vec::new(),
        deepstack_blocks: Vec::new(),
        hooked_input_embeddings: true,
        packed_images: false,
        min_pixels: image_size * image_size,
        max_pixels: image_size * image_size,
    });
    Ok(model)
}
