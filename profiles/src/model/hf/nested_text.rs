//! What the vision-language importers share. The language model of a config that nests it in
//! `text_config` (Gemma 3, Qwen3-VL, Mistral 3): the family's causal LM built from that
//! sub-config by its own importer, then moved under `model.language_model` with the
//! vision-language classes' names, and its `lm_head` (tied to the moved embedding where the
//! config ties them); the whole model assembled around them ([`NestedText::assemble`]). The
//! tower's sizes read from `vision_config` ([`TowerSizes`], Qwen2.5-VL's too) and its facts
//! ([`TowerSizes::facts`]), which [`VisionFacts::attach`] adds to the model's.

use super::HfConfig;
use super::heads::{moved_path, reroot};
use super::qwen_vl::{DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS};
use crate::InputError;
use crate::model::vision::{ImageProcessor, VisionFacts};
use crate::model::{Builder, ImportOptions, ModelDescription, Module, ModuleKind};
use serde_json::Value;

/// Where the language model goes.
pub(super) const LANGUAGE_MODEL: &str = "model.language_model";

/// What [`build`] returns: the description (facts, dtype, name) with an empty root, the
/// language model at [`LANGUAGE_MODEL`] and the head at `lm_head`.
pub(super) struct NestedText {
    /// The causal LM's description; its root is to be replaced by the caller's.
    pub(super) model: ModelDescription,
    /// `model.language_model` and everything under it.
    pub(super) language_model: Module,
    /// `lm_head`.
    pub(super) lm_head: Module,
}

impl NestedText {
    /// The whole vision-language model: a root of class `arch` holding `model` (the modules
    /// that come before the language model: the tower, the projector) with the language model
    /// appended, then `lm_head`; `model_type` and the classes accelerate must not split
    /// (`no_split`) are the vision-language class's.
    pub(super) fn assemble(
        self,
        b: &Builder,
        arch: &str,
        model: Module,
        model_type: String,
        no_split: &[&str],
    ) -> ModelDescription {
        let NestedText { model: mut description, language_model, lm_head } = self;
        description.root =
            b.container("", "", arch).with_child(model.with_child(language_model)).with_child(lm_head);
        description.architecture = arch.to_string();
        description.facts.model_type = model_type;
        description.facts.no_split_classes = no_split.iter().map(|c| c.to_string()).collect();
        description
    }
}

/// The nested config at `key`, named after its parent in errors.
pub(super) fn sub_config(config: &HfConfig, key: &str) -> Result<HfConfig, InputError> {
    let object = config.object().get(key).and_then(Value::as_object).cloned().ok_or_else(|| {
        InputError::new(config.origin(), format!("a vision-language config without `{key}`"))
            .at_key(key)
            .with_fix("give the model's published config.json, which nests `text_config` and `vision_config`")
    })?;
    Ok(HfConfig::from_object(object, &format!("{} ({key})", config.origin())))
}

/// Where the language model's `tie_word_embeddings` is read, and its default where absent.
#[derive(Debug, Clone, Copy)]
pub(super) enum Tie {
    /// The top level's: the vision-language config class's own attribute.
    Top(bool),
    /// `text_config`'s (transformers 4.57's Mistral 3 ties by the text config).
    Text(bool),
}

/// The positive integer at `key` of `config`, or where it is absent the config class's default
/// for it in `defaults` (1 where `defaults` has none).
pub(super) fn positive_or_default(
    config: &HfConfig,
    defaults: &[(&str, u64)],
    key: &str,
) -> Result<u64, InputError> {
    config.positive_or(&[key], defaults.iter().find(|(k, _)| *k == key).map_or(1, |(_, v)| *v))
}

/// The sizes every vision tower's config gives: its blocks, their width, attention heads and
/// MLP width, and its square patches.
#[derive(Debug, Clone, Copy)]
pub(super) struct TowerSizes {
    /// Blocks (`num_hidden_layers`, `depth`).
    pub(super) depth: u64,
    /// Width of the blocks (`hidden_size`).
    pub(super) hidden: u64,
    /// Attention heads per block (`num_attention_heads`, `num_heads`).
    pub(super) heads: u64,
    /// The MLP's width (`intermediate_size`).
    pub(super) intermediate: u64,
    /// Side of a square patch in pixels (`patch_size`).
    pub(super) patch: u64,
    /// Values a pixel (`num_channels`, `in_channels`).
    pub(super) channels: u64,
}

/// The keys of [`TowerSizes`]' fields, in their order, as SigLIP's and Pixtral's vision configs
/// name them.
pub(super) const VISION_KEYS: [&str; 6] = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "patch_size",
    "num_channels",
];

/// The keys of [`TowerSizes`]' fields as Qwen's vision configs name them.
pub(super) const QWEN_VISION_KEYS: [&str; 6] =
    ["depth", "hidden_size", "num_heads", "intermediate_size", "patch_size", "in_channels"];

impl TowerSizes {
    /// Reads the sizes from `vision` under `keys` (in the fields' order), with the tower config
    /// class's `defaults` for absent keys.
    pub(super) fn read(
        vision: &HfConfig,
        defaults: &[(&str, u64)],
        keys: [&str; 6],
    ) -> Result<TowerSizes, InputError> {
        let read = |i: usize| positive_or_default(vision, defaults, keys[i]);
        Ok(TowerSizes {
            depth: read(0)?,
            hidden: read(1)?,
            heads: read(2)?,
            intermediate: read(3)?,
            patch: read(4)?,
            channels: read(5)?,
        })
    }

    /// The facts of a tower of these sizes at `path`: images sized by `processor` (its pixel
    /// bounds: smart_resize's defaults, a fixed size's area, none for Pixtral's), `temporal`
    /// frames a patch, `merge` patches a side to a token, `activation` in the MLP; the rest as
    /// a plain tower has them: LayerNorm blocks without rotary embeddings, a two-projection MLP,
    /// every block attending over the whole image, no DeepStack, the patch embedding hooked
    /// (it is the tower's `get_input_embeddings()`), one sequence an image without a class
    /// token, float32 `pixel_values`.
    pub(super) fn facts(
        &self,
        path: &str,
        processor: ImageProcessor,
        temporal: u64,
        merge: u64,
        activation: String,
    ) -> VisionFacts {
        let (min_pixels, max_pixels) = match processor {
            ImageProcessor::SmartResize => (DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS),
            ImageProcessor::Fixed { height, width, .. } => (height * width, height * width),
            ImageProcessor::LongestEdge { .. }
            | ImageProcessor::Tiled { .. }
            | ImageProcessor::DynamicHd { .. } => (1, 1),
        };
        VisionFacts {
            path: path.into(),
            processor,
            rms_norm: false,
            rotary: false,
            hidden_size: self.hidden,
            num_heads: self.heads,
            intermediate_size: self.intermediate,
            gated_mlp: false,
            activation,
            patch_size: self.patch,
            merge_size: merge,
            temporal_patch_size: temporal,
            patch_values: self.channels * temporal * self.patch * self.patch,
            window_pixels: None,
            full_attention_blocks: Vec::new(),
            deepstack_blocks: Vec::new(),
            hooked_input_embeddings: true,
            packed_images: false,
            class_token: false,
            pixel_value_bytes: 4,
            idle_paths: Vec::new(),
            runs_first: None,
            min_pixels,
            max_pixels,
        }
    }
}

/// `text` (`config`'s `text_config`) as the config of the causal LM class `causal` that builds
/// it: its `architectures` that class, and the top level's dtype where it has none of its own
/// (the published vision-language configs give it once, at the top).
pub(super) fn causal_config(config: &HfConfig, text: &HfConfig, causal: &str) -> HfConfig {
    let mut object = text.object().clone();
    object.insert("architectures".into(), Value::from(vec![causal]));
    if !object.contains_key("torch_dtype") && !object.contains_key("dtype") {
        for key in ["torch_dtype", "dtype"] {
            if let Some(value) = config.object().get(key) {
                object.insert(key.into(), value.clone());
            }
        }
    }
    HfConfig::from_object(object, text.origin())
}

/// Reads `config`'s `vision_config` (returned as it is) and builds its `text_config` as `causal`
/// (`Gemma3ForCausalLM`), with the text config class's `defaults` for absent keys, the top
/// level's dtype where the text config has none, and `tie_word_embeddings` read by `tie`; then
/// renames its classes by `classes` (old, new) and moves it under [`LANGUAGE_MODEL`].
pub(super) fn build(
    config: &HfConfig,
    causal: &str,
    defaults: &[(&str, u64)],
    tie: Tie,
    classes: &[(&str, &str)],
    options: ImportOptions,
) -> Result<(HfConfig, NestedText), InputError> {
    let vision = sub_config(config, "vision_config")?;
    let text = sub_config(config, "text_config")?;
    let tie = match tie {
        Tie::Top(default) => config.bool_or(&["tie_word_embeddings"], default)?,
        Tie::Text(default) => text.bool_or(&["tie_word_embeddings"], default)?,
    };
    let mut object = causal_config(config, &text, causal).object().clone();
    object.insert("tie_word_embeddings".into(), Value::from(tie));
    for (key, value) in defaults {
        object.entry(*key).or_insert_with(|| Value::from(*value));
    }
    let mut model = super::llama::build(&HfConfig::from_object(object, text.origin()), causal, options)?;
    let mut root = std::mem::replace(&mut model.root, Module::new("", "", ModuleKind::Container));
    reroot(&mut root, "model", LANGUAGE_MODEL);
    root.visit_mut(&mut |m| {
        if let Some((_, new)) = classes.iter().find(|(old, _)| m.class == *old) {
            m.class = (*new).into();
        }
    });
    for layer in &mut model.facts.layers {
        layer.path = moved_path(&layer.path, "model", LANGUAGE_MODEL);
    }
    for class in &mut model.facts.no_split_classes {
        if let Some((_, new)) = classes.iter().find(|(old, _)| class == old) {
            *class = (*new).into();
        }
    }
    model.name = config.origin().to_string();
    let mut language_model = None;
    let mut lm_head = None;
    for child in root.children {
        if child.path == LANGUAGE_MODEL {
            language_model = Some(child);
        } else if child.path == "lm_head" {
            lm_head = Some(child);
        }
    }
    match (language_model, lm_head) {
        (Some(language_model), Some(lm_head)) => Ok((vision, NestedText { model, language_model, lm_head })),
        _ => Err(InputError::new(
            config.origin(),
            format!("the `{causal}` decoder has no `model` or `lm_head`"),
        )),
    }
}
