//! The language model of a vision-language model whose config nests it in `text_config`
//! (Gemma 3, Qwen3-VL): the family's causal LM built from that sub-config by its own importer,
//! then moved under `model.language_model` with the vision-language classes' names, and its
//! `lm_head` (tied to the moved embedding where the config ties them).

use super::HfConfig;
use super::heads::{moved_path, reroot};
use crate::InputError;
use crate::model::{ImportOptions, ModelDescription, Module, ModuleKind};
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

/// The nested config at `key`, named after its parent in errors.
pub(super) fn sub_config(config: &HfConfig, key: &str) -> Result<HfConfig, InputError> {
    let object = config.object().get(key).and_then(Value::as_object).cloned().ok_or_else(|| {
        InputError::new(config.origin(), format!("a vision-language config without `{key}`"))
            .at_key(key)
            .with_fix("give the model's published config.json, which nests `text_config` and `vision_config`")
    })?;
    Ok(HfConfig::from_object(object, &format!("{} ({key})", config.origin())))
}

/// Builds `text` (the `text_config` of `config`) as `causal` (`Gemma3ForCausalLM`), with the
/// text config class's `defaults` for absent keys, the top level's dtype where the text config
/// has none, and `tie` for `tie_word_embeddings`; then renames its classes by `classes` (old,
/// new) and moves it under [`LANGUAGE_MODEL`].
pub(super) fn build(
    config: &HfConfig,
    text: &HfConfig,
    causal: &str,
    defaults: &[(&str, u64)],
    tie: bool,
    classes: &[(&str, &str)],
    options: ImportOptions,
) -> Result<NestedText, InputError> {
    let mut object = text.object().clone();
    object.insert("architectures".into(), Value::from(vec![causal]));
    object.insert("tie_word_embeddings".into(), Value::from(tie));
    for (key, value) in defaults {
        object.entry(*key).or_insert_with(|| Value::from(*value));
    }
    if !object.contains_key("torch_dtype") && !object.contains_key("dtype") {
        for key in ["torch_dtype", "dtype"] {
            if let Some(value) = config.object().get(key) {
                object.insert(key.into(), value.clone());
            }
        }
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
        (Some(language_model), Some(lm_head)) => Ok(NestedText { model, language_model, lm_head }),
        _ => Err(InputError::new(
            config.origin(),
            format!("the `{causal}` decoder has no `model` or `lm_head`"),
        )),
    }
}
