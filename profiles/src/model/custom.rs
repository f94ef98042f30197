//! Custom-model YAML: models that are not on the list of HF architectures (a research model with
//! extra memory modules, a graph network, a small time-series transformer), described by their
//! modules — tensor shapes, `nn.Linear` / `nn.Embedding` / norm shorthands or bare parameter
//! counts — which of them are blocks (placement units, in execution order), their activation
//! sizes, and the dtype; or a HF config (`extend:`) with extra modules added to its tree.
//!
//! The schema is documented for users in `docs/custom-models.md`, with complete examples in
//! `docs/examples/`. Errors name the file and the line and column of the offending value.
//!
//! Submodules: [`schema`] is the YAML as serde types, [`assemble`] turns it into a
//! [`ModelDescription`], [`head`] builds an extended model with another head (`head:`).

mod assemble;
mod head;
mod schema;

use super::{ImportOptions, ModelDescription};
use crate::InputError;
use serde::Serialize;
use std::path::Path;

/// Activation memory a module declares for a training step, in place of the transformer
/// formula the memory model uses for HF architectures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ActivationSizes {
    /// Bytes per token of the batch (scales with batch × sequence length).
    pub per_token: u64,
    /// Bytes per sample of the batch (scales with the batch only: graphs, fixed-size inputs).
    pub per_sample: u64,
}

/// A custom model: its description and the activation sizes its modules declare.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomModel {
    /// The model's module tree and facts, as any other import gives them.
    pub description: ModelDescription,
    /// Module path → declared activation sizes, blocks in execution order first.
    pub activations: Vec<(String, ActivationSizes)>,
}

/// Loads a custom-model YAML file with its declared activation sizes.
pub fn load(path: &Path, options: ImportOptions) -> Result<CustomModel, InputError> {
    let origin = path.display().to_string();
    let text = crate::files::read_text(path, crate::files::FileKind::CustomModel)?;
    let file: schema::ModelFile = serde_saphyr::from_str(&text).map_err(|e| {
        InputError::yaml(
            &origin,
            &e,
            "custom-model",
            "see docs/custom-models.md for the keys and what each expects",
        )
    })?;
    let folder = path.parent().unwrap_or(Path::new("."));
    assemble::assemble(file, &origin, folder, options)
}

/// Loads a custom-model YAML file.
pub fn load_file(path: &Path, options: ImportOptions) -> Result<ModelDescription, InputError> {
    load(path, options).map(|model| model.description)
}
