//! `Llama4ForConditionalGeneration` (Llama 4 Scout and Maverick with their vision tower): a
//! ViT over square tiles (`vision_model`: a patch "convolution" as `nn.Unfold` and a linear, a
//! class token appended to each tile's patches, learned position embeddings, LayerNorm blocks
//! with biased q/k/v/o, 2-D rotary embeddings computed in complex float32 and a GELU MLP, then
//! a pixel shuffle to a quarter of the patches and a two-linear adapter), a projector
//! (`multi_modal_projector.linear_1`), and the Llama 4 text model (`language_model`, a whole
//! `Llama4ForCausalLM` with its own `model` and `lm_head`).
//!
//! Module names (`models/llama4/modeling_llama4.py`, transformers 5.24 and 4.57 alike; the
//! checkpoints use the same): `vision_model.{class_embedding, positional_embedding_vlm,
//! patch_embedding.{unfold, linear}, rotary_embedding, layernorm_pre, layernorm_post,
//! model.layers.N.{self_attn.{q_proj, k_proj, v_proj, o_proj}, mlp.{activation_fn, fc1, fc2},
//! input_layernorm, post_attention_layernorm}, vision_adapter.mlp.{fc1, fc2, activation_fn}}`,
//! `multi_modal_projector.linear_1`, `language_model.{model.…, lm_head}`. 5.x keeps the vision
//! rotary table as a non-persistent complex64 buffer (`freqs_ci`, one row per patch position
//! and the class token, `head_dim / 2` frequencies); 4.57 keeps it as a plain attribute, which
//! is no buffer and stays on the CPU.

use super::HfConfig;
use super::heads::{moved_path, reroot};
use super::nested_text::{self, TowerSizes, VISION_KEYS};
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{Builder, ImportOptions, ModelDescription, Module, ModuleKind, Naming, Tensor};
use crate::{DType, InputError};

/// `Llama4VisionConfig`'s defaults (transformers 5.24 and 4.57).
const VISION_DEFAULTS: &[(&str, u64)] = &[
    ("hidden_size", 768),
    ("intermediate_size", 5632),
    ("num_hidden_layers", 34),
    ("num_attention_heads", 16),
    ("num_channels", 3),
    ("image_size", 448),
    ("patch_size", 14),
    ("vision_output_dim", 7680),
    ("projector_input_dim", 4096),
    ("projector_output_dim", 4096),
];

/// `Llama4ImageProcessor`'s `max_patches` (tiles of a canvas) when `preprocessor_config.json`
/// gives none.
const DEFAULT_MAX_TILES: u64 = 16;

/// Where the text model goes: `Llama4ForConditionalGeneration.language_model`, a whole causal LM.
const LANGUAGE_MODEL: &str = "language_model";

/// The classes accelerate must not split (`Llama4ForConditionalGeneration._no_split_modules`).
const NO_SPLIT: &[&str] = &["Llama4TextDecoderLayer", "Llama4VisionEncoderLayer"];

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let vision = nested_text::sub_config(config, "vision_config")?;
    let text = nested_text::sub_config(config, "text_config")?;
    let causal = nested_text::causal_config(config, &text, "Llama4ForCausalLM");
    let mut model = super::llama4::build(&causal, "Llama4ForCausalLM", options)?;
    let dtype = model.dtype;
    let text_hidden = model.facts.hidden_size;
    let mut language_model = std::mem::replace(&mut model.root, Module::new("", "", ModuleKind::Container));
    reroot(&mut language_model, "", LANGUAGE_MODEL);
    for layer in &mut model.facts.layers {
        layer.path = moved_path(&layer.path, "", LANGUAGE_MODEL);
    }

    let v = TowerSizes::read(&vision, VISION_DEFAULTS, VISION_KEYS)?;
    let read = |key: &str| nested_text::positive_or_default(&vision, VISION_DEFAULTS, key);
    let (image_size, output_dim) = (read("image_size")?, read("vision_output_dim")?);
    let (adapter_in, adapter_out) = (read("projector_input_dim")?, read("projector_output_dim")?);
    let ratio = vision.float_opt(&["pixel_shuffle_ratio"])?.unwrap_or(0.5);
    // The pixel shuffle keeps `ratio²` of the patches, `ratio` a side: a merge of `1 / ratio`.
    let merge = (1.0 / ratio).round();
    if !(ratio > 0.0 && (1.0..=64.0).contains(&merge) && (merge * ratio - 1.0).abs() < 1e-9) {
        return Err(InputError::new(vision.origin(), format!("a pixel shuffle ratio of {ratio}"))
            .at_key("pixel_shuffle_ratio")
            .with_fix("give the reciprocal of a whole number of patches a side (Llama 4: 0.5)"));
    }
    let merge = merge as u64;
    if !v.hidden.is_multiple_of(v.heads) || !image_size.is_multiple_of(v.patch) {
        return Err(InputError::new(
            vision.origin(),
            format!(
                "a tower of width {} with {} heads over {image_size}-pixel tiles of {}-pixel patches",
                v.hidden, v.heads, v.patch
            ),
        )
        .with_fix("`hidden_size` must divide by `num_attention_heads`, `image_size` by `patch_size`"));
    }
    let head_dim = v.hidden / v.heads;
    // Patch positions of a tile, and the class token.
    let positions = (image_size / v.patch).pow(2) + 1;

    let b = Builder::new(dtype, options.naming);
    let tower = "vision_model";
    let layers_path = format!("{tower}.model.layers");
    let blocks: Vec<Module> = (0..v.depth)
        .map(|i| {
            let path = format!("{layers_path}.{i}");
            let (attn, mlp) = (format!("{path}.self_attn"), format!("{path}.mlp"));
            b.block(&layers_path, &i.to_string(), "Llama4VisionEncoderLayer")
                .with_child(
                    b.container(&path, "self_attn", "Llama4VisionAttention")
                        .with_child(b.linear(&attn, "q_proj", v.hidden, v.hidden, true))
                        .with_child(b.linear(&attn, "k_proj", v.hidden, v.hidden, true))
                        .with_child(b.linear(&attn, "v_proj", v.hidden, v.hidden, true))
                        .with_child(b.linear(&attn, "o_proj", v.hidden, v.hidden, true)),
                )
                .with_child(
                    b.container(&path, "mlp", "Llama4VisionMLP")
                        .with_child(Module::new(format!("{mlp}.activation_fn"), "GELU", ModuleKind::Other))
                        .with_child(b.linear(&mlp, "fc1", v.hidden, v.intermediate, true))
                        .with_child(b.linear(&mlp, "fc2", v.intermediate, v.hidden, true)),
                )
                .with_child(b.norm(&path, "input_layernorm", "LayerNorm", v.hidden, true))
                .with_child(b.norm(&path, "post_attention_layernorm", "LayerNorm", v.hidden, true))
        })
        .collect();
    let patch_path = format!("{tower}.patch_embedding");
    let mut rotary =
        Module::new(format!("{tower}.rotary_embedding"), "Llama4VisionRotaryEmbedding", ModuleKind::Other);
    if options.naming == Naming::V5 {
        rotary =
            rotary.with_tensor(Tensor::buffer("freqs_ci", &[positions, 1, head_dim / 2], DType::C64, false));
    }
    let adapter_path = format!("{tower}.vision_adapter.mlp");
    let vision_model = b
        .container("", tower, "Llama4VisionModel")
        .with_tensor(Tensor::parameter("class_embedding", &[v.hidden], dtype))
        .with_tensor(Tensor::parameter("positional_embedding_vlm", &[positions, v.hidden], dtype))
        .with_child(
            b.container(tower, "patch_embedding", "Llama4UnfoldConvolution")
                .with_child(Module::new(format!("{patch_path}.unfold"), "Unfold", ModuleKind::Other))
                .with_child(b.linear(&patch_path, "linear", v.channels * v.patch * v.patch, v.hidden, false)),
        )
        .with_child(rotary)
        .with_child(b.norm(tower, "layernorm_pre", "LayerNorm", v.hidden, true))
        .with_child(b.norm(tower, "layernorm_post", "LayerNorm", v.hidden, true))
        .with_child(b.container(tower, "model", "Llama4VisionEncoder").with_child(b.module_list(
            &format!("{tower}.model"),
            "layers",
            blocks,
        )))
        .with_child(
            b.container(tower, "vision_adapter", "Llama4VisionPixelShuffleMLP").with_child(
                b.container(&format!("{tower}.vision_adapter"), "mlp", "Llama4VisionMLP2")
                    .with_child(b.linear(&adapter_path, "fc1", v.intermediate, adapter_in, false))
                    .with_child(b.linear(&adapter_path, "fc2", adapter_out, adapter_out, false))
                    .with_child(Module::new(
                        format!("{adapter_path}.activation_fn"),
                        "GELU",
                        ModuleKind::Other,
                    )),
            ),
        );
    let projector = b
        .container("", "multi_modal_projector", "Llama4MultiModalProjector")
        .with_child(b.linear("multi_modal_projector", "linear_1", output_dim, text_hidden, false));

    let max_tiles = DEFAULT_MAX_TILES;
    let processor = ImageProcessor::Tiled { tile: image_size, max_tiles, max_canvas: false };
    let activation = vision.string_opt(&["hidden_act"])?.unwrap_or_else(|| "gelu".into());
    // LayerNorm blocks with rotary q and k (computed in float32, as Qwen's), a plain GELU MLP,
    // each tile its own sequence with its class token, bfloat16 pixel values.
    let vision_facts = VisionFacts {
        rotary: true,
        class_token: true,
        pixel_value_bytes: 2,
        ..v.facts(tower, processor, 1, merge, activation)
    };
    model.root =
        b.container("", "", arch).with_child(vision_model).with_child(projector).with_child(language_model);
    model.architecture = arch.to_string();
    model.name = config.origin().to_string();
    model.facts.model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "llama4".into());
    model.facts.no_split_classes = NO_SPLIT.iter().map(|c| c.to_string()).collect();
    vision_facts.attach(&mut model.facts, &layers_path, v.depth);
    Ok(model)
}
