//! Queries that expose single terms of the memory model, for checks against published closed
//! forms (ZeRO's model states, Korthikanti et al.'s activations per layer) and for reports.

use crate::model::activations;
use crate::model::precision::Precision;
use crate::model::units;
use crate::workload::{Parallelism, Workload};
use serde::Serialize;
use vramplan_profiles::model::ModelDescription;

/// Model states on one data-parallel rank: weights, gradients, optimizer states (with master
/// weights), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelStates {
    /// Weights as held.
    pub weights: u64,
    /// Gradients of the trainable parameters.
    pub gradients: u64,
    /// Optimizer states and master weights.
    pub optimizer: u64,
}

impl ModelStates {
    /// All three.
    pub fn total(&self) -> u64 {
        self.weights + self.gradients + self.optimizer
    }
}

/// Model states per rank when training `model` under `workload` over `ranks` data-parallel
/// ranks: ZeRO stage 1 shards optimizer states, stage 2 also gradients, stage 3 also weights.
pub fn model_states(model: &ModelDescription, workload: &Workload, ranks: u64) -> ModelStates {
    let precision = Precision::of(model, workload);
    let targets = lora_targets(model, workload);
    let dtype = units::trainable_dtype(workload, &precision);
    let stage = match workload.parallelism {
        Parallelism::Zero { stage, .. } => stage,
        _ => 0,
    };
    let shard =
        |bytes: u64, from_stage: u8| if stage >= from_stage { bytes.div_ceil(ranks.max(1)) } else { bytes };
    let mut states = ModelStates { weights: 0, gradients: 0, optimizer: 0 };
    for unit in units::units(model, workload, &precision, &targets) {
        states.weights += shard(unit.weight_tensors.iter().sum(), 3);
        states.gradients += shard(dtype.bytes_for(unit.trainable_params()), 2);
        states.optimizer += shard(units::optimizer_state_bytes(workload, &unit.trainable_tensors, dtype), 1);
    }
    states
}

/// Bytes block `layer` (an index into `facts.layers`) keeps for backward under `workload`.
pub fn saved_activation_bytes(model: &ModelDescription, workload: &Workload, layer: usize) -> u64 {
    let precision = Precision::of(model, workload);
    let targets = lora_targets(model, workload);
    let activations = activations::ActivationModel::new(model, workload, precision, &targets);
    activations.block(layer, workload.batch, workload.seq).saved.iter().sum()
}

/// The linear modules LoRA wraps, as PEFT resolves the workload's targets (the architecture's
/// defaults when none are given). Targets that match nothing were refused by the input checks;
/// here they wrap nothing.
pub(crate) fn lora_targets(model: &ModelDescription, workload: &Workload) -> Vec<String> {
    crate::input::lora_target_modules(workload, model).unwrap_or_default()
}
