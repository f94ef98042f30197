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
use super::nested_text::{self, Tie, TowerSizes, VISION_KEYS};
use crate::DType;
use crate::InputError;
use crate::model::vision::ImageProcessor;
use crate::model::{Builder, ImportOptions, ModelDescription, Module, ModuleKind, Naming, Tensor};

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
    let dtype = config.dtype()?;

    // The language model: Gemma3ForCausalLM from `text_config`, in the top level's dtype.
    let classes = [("Gemma3Model", "Gemma3TextModel")];
    let (vision, text) =
        nested_text::build(config, "Gemma3ForCausalLM", TEXT_DEFAULTS, Tie::Top(true), &classes, options)?;

    // The SigLIP tower.
    let v = TowerSizes::read(&vision, VISION_DEFAULTS, VISION_KEYS)?;
    let image_size = nested_text::positive_or_default(&vision, VISION_DEFAULTS, "image_size")?;
    let tokens = config.positive_or(&["mm_tokens_per_image"], DEFAULT_TOKENS_PER_IMAGE)?;
    let side = image_size / v.patch;
    let pooled_side = (tokens as f64).sqrt() as u64;
    if side == 0 || pooled_side * pooled_side != tokens || side % pooled_side != 0 {
        return Err(InputError::new(
            config.origin(),
            format!(
                "{tokens} tokens an image do not pool {side} × {side} patches (`image_size` {image_size} / \
                 `patch_size` {}) into a square of whole kernels",
                v.patch
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
    let blocks: Vec<Module> = (0..v.depth)
        .map(|i| {
            let path = format!("{layers_path}.{i}");
            let attn_path = format!("{path}.self_attn");
            let attn = b
                .container(&path, "self_attn", "SiglipAttention")
                .with_child(b.linear(&attn_path, "k_proj", v.hidden, v.hidden, true))
                .with_child(b.linear(&attn_path, "v_proj", v.hidden, v.hidden, true))
                .with_child(b.linear(&attn_path, "q_proj", v.hidden, v.hidden, true))
                .with_child(b.linear(&attn_path, "out_proj", v.hidden, v.hidden, true));
            let mlp = b
                .container(&path, "mlp", "SiglipMLP")
                .with_child(b.linear(&format!("{path}.mlp"), "fc1", v.hidden, v.intermediate, true))
                .with_child(b.linear(&format!("{path}.mlp"), "fc2", v.intermediate, v.hidden, true));
            b.block(&layers_path, &i.to_string(), "SiglipEncoderLayer")
                .with_child(b.norm(&path, "layer_norm1", "LayerNorm", v.hidden, true))
                .with_child(attn)
                .with_child(b.norm(&path, "layer_norm2", "LayerNorm", v.hidden, true))
                .with_child(mlp)
        })
        .collect();
    let embeddings_path = format!("{inner}.embeddings");
    let embeddings = b
        .container(&inner, "embeddings", "SiglipVisionEmbeddings")
        .with_tensor(Tensor::buffer("position_ids", &[1, side * side], DType::I64, false))
        .with_child(
            Module::new(format!("{embeddings_path}.patch_embedding"), "Conv2d", ModuleKind::Other)
                .with_tensor(Tensor::parameter("weight", &[v.hidden, v.channels, v.patch, v.patch], dtype))
                .with_tensor(Tensor::parameter("bias", &[v.hidden], dtype)),
        )
        .with_child(b.embedding(&embeddings_path, "position_embedding", side * side, v.hidden));
    let transformer = b
        .container(tower, "vision_model", "SiglipVisionTransformer")
        .with_child(embeddings)
        .with_child(b.container(&inner, "encoder", "SiglipEncoder").with_child(b.module_list(
            &format!("{inner}.encoder"),
            "layers",
            blocks,
        )))
        .with_child(b.norm(&inner, "post_layernorm", "LayerNorm", v.hidden, true));
    let vision_tower = match options.naming {
        Naming::V5 => Module { path: tower.into(), class: "SiglipVisionModel".into(), ..transformer },
        Naming::V4 => b.container("model", "vision_tower", "SiglipVisionModel").with_child(transformer),
    };
    let projector_path = "model.multi_modal_projector";
    let hidden = text.model.facts.hidden_size;
    let projector = b
        .container("model", "multi_modal_projector", "Gemma3MultiModalProjector")
        .with_tensor(Tensor::parameter("mm_input_projection_weight", &[v.hidden, hidden], dtype))
        .with_child(b.norm(projector_path, "mm_soft_emb_norm", "Gemma3RMSNorm", v.hidden, false))
        .with_child(Module::new(format!("{projector_path}.avg_pool"), "AvgPool2d", ModuleKind::Other));

    let activation = vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu_pytorch_tanh".into());
    let processor = ImageProcessor::Fixed { height: image_size, width: image_size, tokens };
    let vision_facts = v.facts(tower, processor, 1, side / pooled_side, activation);
    let model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "gemma3".into());
    let base = b.container("", "model", "Gemma3Model").with_child(vision_tower).with_child(projector);
    let mut model = text.assemble(&b, arch, base, model_type, NO_SPLIT);
    vision_facts.attach(&mut model.facts, &layers_path, v.depth);
    Ok(model)
}
