//! Generic models: a `config.json` whose class vramplan has no importer for, over a safetensors
//! checkpoint (a folder's shards or a Hub repository's range-read headers). The tensors are the
//! checkpoint's as stored, so the weights are exact; the module tree follows their names; the
//! architectural facts are the config's sizes, checked against the tensors; the activations are
//! the generic decoder layer's (the Llama-style activation model fed with those sizes, with no
//! family's own traits). The builder is `safetensors::overlay::generic`; this module is the
//! label every output carries, with the error that activation model showed on the families the
//! tracer covers (docs/memory-model.md, "Generic models", measured by
//! `tests/tests/generic_traced.rs`).

use super::ModelDescription;
use serde::Serialize;

/// `ArchFacts::model_type` of a generic model: no family's traits apply (dropout, eager
/// fallbacks, soft-capping, PEFT's default targets are all keyed on a known `model_type`).
pub const MODEL_TYPE: &str = "generic";

/// Traced configurations the generic activation model was compared on
/// (docs/memory-model.md, "Generic models").
pub const TRACED_CONFIGURATIONS: usize = 105;

/// The families those configurations cover.
pub const TRACED_FAMILIES: usize = 19;

/// The median |error| of the generic model's peak against the traced one, in percent.
pub const TRACED_MEDIAN_PERCENT: f64 = 0.4;

/// The worst |error| of the generic model's peak against the traced one, in percent.
pub const TRACED_WORST_PERCENT: f64 = 28.7;

/// What an output says about a generic model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Generic {
    /// The config's class, which vramplan has no importer for.
    pub architecture: String,
    /// How the description was made and what it is worth, in one sentence.
    pub description: String,
    /// Traced configurations the generic activation model was compared on.
    pub traced_configurations: usize,
    /// Their median |error| of the peak, in percent.
    pub traced_median_error_percent: f64,
    /// Their worst |error| of the peak, in percent.
    pub traced_worst_error_percent: f64,
}

/// The label of `model` when it is generic; `None` for a model built by an importer.
pub fn of(model: &ModelDescription) -> Option<Generic> {
    if model.facts.model_type != MODEL_TYPE {
        return None;
    }
    Some(Generic {
        architecture: model.architecture.clone(),
        description: format!(
            "generic model: vramplan has no importer for `{}`; weights exact from the safetensors \
             headers, activations from the generic decoder layer fed with config.json's sizes, whose \
             peak was off by {TRACED_MEDIAN_PERCENT:.1} % at the median and {TRACED_WORST_PERCENT:.1} % \
             at worst (low, where a family's own traits were missing) on {TRACED_CONFIGURATIONS} traced \
             configurations of {TRACED_FAMILIES} families (docs/memory-model.md, \"Generic models\")",
            model.architecture
        ),
        traced_configurations: TRACED_CONFIGURATIONS,
        traced_median_error_percent: TRACED_MEDIAN_PERCENT,
        traced_worst_error_percent: TRACED_WORST_PERCENT,
    })
}

/// The line text outputs print for a generic model (empty otherwise), ending in a newline.
pub fn line(model: &ModelDescription) -> String {
    of(model).map(|g| format!("{}\n", g.description)).unwrap_or_default()
}
