//! A run's measured activations as a model's declarations: what the first training forward left
//! for backward, per module, put on the model's modules in place of declared (or modelled) ones
//! (`--activations FILE`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vramplan_profiles::model::custom::ActivationSizes;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind};

/// What the first training forward of a run left for backward: per module (its path from the
/// outermost module, `""` for that one), the bytes of GPU storages made while it was the
/// innermost module running and still alive when the forward returned, each module's total
/// with its submodules'; with the batch and sequence length of the forward's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredActivations {
    /// The input's first dimension (none where the forward took no tensor).
    pub batch: Option<u64>,
    /// Its second, where it has one (token ids, or [batch, sequence, features]).
    pub seq: Option<u64>,
    /// Module path → bytes.
    pub modules: BTreeMap<String, u64>,
}

/// Why measured activations do not describe a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivationsMismatch {
    /// The run's forward took no tensor with a batch dimension.
    NoBatch,
    /// None of the run's modules is a module of the model: some of each side's names.
    NoCommonModule {
        /// Module paths the run measured.
        measured: Vec<String>,
        /// Module paths the model has.
        model: Vec<String>,
    },
}

/// Declares on `model` the activations a script run measured: every module the run names that
/// the model has and that holds no block takes its bytes as its declaration (`per_token` over the
/// run's batch × sequence, or `per_sample` over its batch where the input had no sequence), so
/// that a block's declaration covers everything inside it, as a declared one does
/// (docs/custom-models.md); containers of blocks are left out, since the memory model would
/// charge their total to their first block again. Returns how many modules took one.
pub fn declare_measured(
    model: &mut ModelDescription,
    measured: &MeasuredActivations,
) -> Result<usize, ActivationsMismatch> {
    let batch = measured.batch.filter(|b| *b > 0).ok_or(ActivationsMismatch::NoBatch)?;
    let per = |bytes: u64| match measured.seq.filter(|s| *s > 0) {
        Some(seq) => ActivationSizes { per_token: bytes.div_ceil(batch * seq), per_sample: 0 },
        None => ActivationSizes { per_token: 0, per_sample: bytes.div_ceil(batch) },
    };
    let mut declared = 0;
    model.root.visit_mut(&mut |module| {
        if module.path.is_empty() || module.children.iter().any(holds_block) {
            return;
        }
        if let Some(bytes) = measured.modules.get(&module.path) {
            module.activations = Some(per(*bytes));
            declared += 1;
        }
    });
    if declared == 0 {
        let mut names = Vec::new();
        model.root.visit(&mut |m| {
            if !m.path.is_empty() && names.len() < 6 {
                names.push(m.path.clone());
            }
        });
        return Err(ActivationsMismatch::NoCommonModule {
            measured: measured.modules.keys().filter(|k| !k.is_empty()).take(6).cloned().collect(),
            model: names,
        });
    }
    Ok(declared)
}

/// Whether `module` is a block or holds one.
fn holds_block(module: &Module) -> bool {
    module.kind == ModuleKind::Block || module.children.iter().any(holds_block)
}
