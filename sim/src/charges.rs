//! Per-unit memory charges for the device-map solver: what each placement unit adds to the
//! device that holds it, split the way a linear capacity constraint can use them. They come
//! from the same units, activations and precision rules as the step timeline, so the solver and
//! the simulator agree; the solver still checks its plan against the full simulation, which
//! also counts what a sum of charges cannot (allocator slack, the order of frees).

use crate::placement::Placement;
use crate::workload::Workload;
use serde::Serialize;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;

/// What kind of placement unit a charge is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitRole {
    /// The block at this index of `facts.layers` (a decoder layer, never split).
    Block(usize),
    Embedding,
    /// The output projection to the vocabulary; the logits and the loss are charged to it.
    Head,
    Other,
}

/// One placement unit's charges, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitCharge {
    /// The module path (for a parent's own tensors, the parent's).
    pub path: String,
    /// The `device_map` keys that place the unit: disjoint prefixes, the first finding it in a
    /// placement (see the simulator's units).
    pub keys: Vec<String>,
    pub role: UnitRole,
    /// Held for the whole step: weights as stored (quantized, cast), optimizer states and
    /// master weights, and gradients when they are kept between steps.
    pub resident_bytes: u64,
    /// Weights alone (part of `resident_bytes`).
    pub weight_bytes: u64,
    /// Added at the step's peak: training, the activations kept for backward (the block's input
    /// under checkpointing) and autocast copies, or the gradients when larger; inference, the
    /// KV cache.
    pub peak_bytes: u64,
    /// Live only while the unit runs: forward and backward workspace, recomputed activations,
    /// dequantized weights, and for the head the logits and the loss with their gradients.
    pub transient_bytes: u64,
}

/// Every unit's charges, in execution order, and what a device boundary costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Charges {
    pub units: Vec<UnitCharge>,
    /// Hidden states handed from one unit to the next (both devices hold a copy while they
    /// cross a boundary).
    pub handoff_bytes: u64,
}

/// The charges of `model`'s units under `workload` (one copy of the model; `hardware` matters
/// for ZeRO sharding only).
pub fn unit_charges(model: &ModelDescription, hardware: &HardwareProfile, workload: &Workload) -> Charges {
    let targets = crate::closed_form::lora_targets(model, workload);
    crate::timeline::charges(model, hardware, workload, &Placement::single(0), &targets)
}

/// Bytes of library workspace each used GPU of compute capability `major` holds (cuBLAS and
/// cuBLASLt), allocated through PyTorch at the first matmul.
pub fn workspace_bytes(major: u32) -> u64 {
    crate::timeline::cublas_workspace(major)
}
