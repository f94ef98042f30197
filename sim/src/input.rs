//! Reading a workload and checking it: the workload YAML file (`--workload FILE`), the command
//! line's workload flags over it ([`WorkloadFlags`]), and the checks against the model and the
//! hardware before a simulation ([`validate`], with the LoRA targets matched as PEFT matches
//! them, [`lora_target_modules`]; their errors placed in the file that set the key,
//! [`place_check_error`]). The schema and every flag are in `docs/workloads.md`.

mod checks;
mod flags;
mod lora;
mod place;
mod serving;
mod trainers;

pub use checks::{validate, validate_configuration, validate_shape};
pub use flags::{WorkloadFlags, parse_quant, trainer_word};
pub use lora::lora_target_modules;
pub use place::{WorkloadSource, key_line, place_check_error};

use crate::workload::Workload;
use std::path::Path;
use vramplan_profiles::InputError;

/// Where the user gave no sequence (no `--seq`, no workload file), the default one is
/// vramplan's, not theirs: it stops at a model's learned table of positions, past which no
/// sequence runs ([`vramplan_profiles::model::ModelDescription::learned_positions`]). Returns the
/// note that says so when it does.
pub fn fit_default_seq(
    workload: &mut Workload,
    seq_given: bool,
    model: &vramplan_profiles::model::ModelDescription,
) -> Option<String> {
    if seq_given {
        return None;
    }
    let (table, limit) = model.learned_positions()?;
    if workload.seq <= limit {
        return None;
    }
    workload.seq = limit;
    workload.prompt = workload.prompt.map(|p| p.min(limit));
    Some(format!(
        "the sequence defaults to {limit} tokens, the length of {}'s learned positions (`{table}`)",
        model.name
    ))
}

/// Reads a workload YAML file; keys left out take their defaults, unknown keys are refused. An
/// empty file is the default workload.
pub fn workload_from_yaml(path: &Path) -> Result<Workload, InputError> {
    let text = vramplan_profiles::files::read_text(path, vramplan_profiles::files::FileKind::Workload)
        .map_err(|e| {
            e.with_fix("give the path of a workload YAML file (docs/workloads.md has the schema)")
        })?;
    workload_from_yaml_text(&text, &path.display().to_string())
}

/// Parses workload YAML `text` read from `origin`.
pub(crate) fn workload_from_yaml_text(text: &str, origin: &str) -> Result<Workload, InputError> {
    if text.lines().all(|line| line.trim().is_empty() || line.trim_start().starts_with('#')) {
        return Ok(Workload::default());
    }
    serde_saphyr::from_str::<Workload>(text).map_err(|e| {
        InputError::yaml(
            origin,
            &e,
            "workload",
            "see docs/workloads.md for the keys and their values (e.g. `mode: train`, `batch: 4`, \
             `quant: {kind: nf4, double_quant: true}`)",
        )
    })
}
