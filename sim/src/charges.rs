//! Per-unit memory charges for the device-map solver, read off the step program
//! ([`crate::program`]) that the replay runs: what each placement unit adds to the device that
//! holds it, split the way a linear capacity constraint can use them.
//!
//! A unit's allocations are of two kinds:
//! - *resident*: weights, gradients or optimizer states still allocated when the step ends
//!   (they go with the unit's tensors, to the host when it is offloaded);
//! - the rest, whose live bytes `L(t)` rise and fall over the step: activations kept from
//!   forward to backward, gradients until the optimizer step, the KV cache, workspaces.
//!
//! A unit's resident charge is the sum of its resident allocations; its peak charge `P` the most
//! `L` reaches while other units run (or the step's own work: load, the optimizer step); its
//! transient charge what `L` reaches beyond `P` during its own runs (its forward; its backward;
//! for the head, its forward, the loss and its backward, one run). Runs do not overlap, so at any
//! moment a device holds at most Σ resident + Σ `P` of its units plus the transient charge of
//! the one unit running: on one GPU the solver's capacity row bounds the replay's allocated
//! bytes (`tests/invariants.rs`, every built-in), and is tight where units take turns (in a full fine-tune, layer `i` holds its activations until its
//! backward and its gradients after; `P` is the larger, and the moment both are live is
//! transient). Each allocation counts what the allocator charges it in the replay of the same
//! program on one GPU (its size rounded to 512 B, or the whole block when the remainder is too
//! small to split off). What the sum cannot see: the allocator's slack (reserved beyond
//! allocated); on several GPUs, blocks the allocator leaves unsplit differently (at most 1 MiB
//! per allocation); and hidden states crossing a boundary ([`Charges::handoff_bytes`]), which the
//! solver weighs as link traffic, not as memory. The replay judges the plan, and a device it
//! finds over its limit is refined (`vramplan-solver`'s `plan`).

use crate::placement::Placement;
use crate::program::{Alloc, Component, Compute, Event, Op};
use crate::workload::Workload;
use serde::Serialize;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;

pub use crate::program::UnitRole;

/// One placement unit's charges, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitCharge {
    /// The module path (for a parent's own tensors, the parent's).
    pub path: String,
    /// The `device_map` keys that place the unit: disjoint prefixes, the first finding it in a
    /// placement (see the simulator's units).
    pub keys: Vec<String>,
    /// What kind of unit it is.
    pub role: UnitRole,
    /// Held for the whole step: weights as stored (quantized, cast), optimizer states and
    /// master weights, and gradients when they are kept between steps.
    pub resident_bytes: u64,
    /// Weights alone (part of `resident_bytes`).
    pub weight_bytes: u64,
    /// The most the unit holds beyond its resident bytes while other units run: activations
    /// kept for backward, autocast copies, gradients until the optimizer step, the KV cache.
    pub peak_bytes: u64,
    /// What it holds beyond that while it runs itself: forward and backward workspace,
    /// recomputed activations, dequantized weights, ZeRO-3 gathers, the moment its gradients
    /// and kept activations are both live, and for the head the logits and the loss with their
    /// gradients.
    pub transient_bytes: u64,
    /// What the unit surely holds at one moment of the step, the same moment for every unit:
    /// its live bytes (each allocation rounded to 512 B only) when the step on one GPU reaches
    /// its peak. Summed over any set of units it is a lower bound of that set's device at that
    /// moment, so a placement whose floors exceed a device's limit cannot fit.
    pub floor_bytes: u64,
    /// What the unit surely holds at every moment of the steady step, and during its own runs
    /// there: a lower bound at every moment, where `floor_bytes` is one at one moment.
    pub steady: Steady,
}

/// What a unit surely holds over the steady step (the last training step, or the prefill),
/// each allocation rounded to 512 B only (the least the allocator charges). At the moment
/// any unit runs on a device, that device holds at least the `throughout_bytes` of every
/// other unit on it and the `running_bytes` of the one running: a lower bound that, unlike
/// the floors at one moment, sees each unit's own working set (tight in inference, where the
/// weights and the KV cache are all that lasts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Steady {
    /// Allocations that go with the unit's tensors (weights, gradients, optimizer states),
    /// made before the steady step and never freed.
    pub resident_bytes: u64,
    /// The least the unit holds at any moment of the steady step (at least `resident_bytes`).
    pub throughout_bytes: u64,
    /// The most it holds during its own runs in the steady step (at least
    /// `throughout_bytes`).
    pub running_bytes: u64,
}

impl Steady {
    /// Holdings of a unit that keeps `resident` with its tensors and `lasting` more at every
    /// moment, nothing beyond while it runs (llama.cpp's layers: weights and KV cache).
    pub fn lasting(resident: u64, lasting: u64) -> Steady {
        let throughout = resident.saturating_add(lasting);
        Steady { resident_bytes: resident, throughout_bytes: throughout, running_bytes: throughout }
    }
}

/// Every unit's charges, in execution order, and what a device boundary costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Charges {
    /// Every unit's charges, in execution order.
    pub units: Vec<UnitCharge>,
    /// Hidden states handed from one unit to the next (both devices hold a copy while they
    /// cross a boundary).
    pub handoff_bytes: u64,
}

/// The charges of `model`'s units under `workload` (one copy of the model; `hardware` matters
/// for ZeRO sharding only): the step program of everything on one GPU, read unit by unit.
pub fn unit_charges(model: &ModelDescription, hardware: &HardwareProfile, workload: &Workload) -> Charges {
    let program = crate::program::step_program(model, hardware, workload, &Placement::single(0));
    let charged = crate::timeline::replay(&program, |_| u64::MAX).charged;
    // Each allocation's unit, charged bytes, and whether it is resident.
    let mut allocations: Vec<Option<(usize, u64, Component)>> = Vec::new();
    let mut freed: Vec<bool> = Vec::new();
    for op in &program.ops {
        match *op {
            Op::Alloc(Alloc { id, unit: Some(unit), component, bytes, .. }) => {
                if allocations.len() <= id {
                    allocations.resize(id + 1, None);
                    freed.resize(id + 1, false);
                }
                allocations[id] = Some((unit, charged.get(id).copied().unwrap_or(bytes), component));
            }
            Op::Free(id) if id < freed.len() => freed[id] = true,
            _ => {}
        }
    }
    let resident_allocation = |id: usize| match allocations.get(id) {
        Some(Some((_, _, component))) => !freed[id] && component.held_with_weights(),
        _ => false,
    };
    let n = program.units.len();
    let mut resident = vec![0u64; n];
    let mut weights = vec![0u64; n];
    for (id, a) in allocations.iter().enumerate() {
        if let Some((unit, bytes, component)) = *a
            && resident_allocation(id)
        {
            resident[unit] += bytes;
            if component == Component::Weights {
                weights[unit] += bytes;
            }
        }
    }
    // Each unit's live non-resident bytes, the most they reach outside its runs (peak) and
    // inside them.
    let mut live = vec![0u64; n];
    let mut outside = vec![0u64; n];
    let mut inside = vec![0u64; n];
    let mut running: Option<usize> = None;
    for op in &program.ops {
        let unit = match *op {
            Op::Compute(Compute { unit, .. }) => {
                if unit != running {
                    if let Some(u) = running {
                        outside[u] = outside[u].max(live[u]);
                    }
                    if let Some(u) = unit {
                        inside[u] = inside[u].max(live[u]);
                    }
                }
                running = unit;
                continue;
            }
            Op::Alloc(Alloc { id, .. }) | Op::Free(id) => match allocations.get(id) {
                Some(Some((unit, bytes, _))) if !resident_allocation(id) => {
                    if matches!(op, Op::Alloc(_)) {
                        live[*unit] += bytes;
                    } else {
                        live[*unit] -= bytes;
                    }
                    *unit
                }
                _ => continue,
            },
        };
        let most = if running == Some(unit) { &mut inside } else { &mut outside };
        most[unit] = most[unit].max(live[unit]);
    }
    let floors = floors_at_the_peak(&program.ops, n);
    let steady = steady_holdings(&program.ops, n);
    let units = program
        .units
        .into_iter()
        .enumerate()
        .map(|(i, u)| UnitCharge {
            path: u.path,
            keys: u.keys,
            role: u.role,
            resident_bytes: resident[i],
            weight_bytes: weights[i],
            peak_bytes: outside[i],
            transient_bytes: inside[i].saturating_sub(outside[i]),
            floor_bytes: floors[i],
            steady: steady[i],
        })
        .collect();
    Charges { units, handoff_bytes: program.handoff_bytes }
}

/// The least the caching allocator charges an allocation of `bytes`: its size rounded to 512 B.
fn least(bytes: u64) -> u64 {
    bytes.div_ceil(512).saturating_mul(512)
}

/// Each unit's live bytes, each allocation rounded to 512 B (the least the allocator charges),
/// at the moment the whole program's live bytes peak.
fn floors_at_the_peak(ops: &[Op], units: usize) -> Vec<u64> {
    let mut sizes: Vec<(Option<usize>, u64)> = Vec::new();
    let (mut live, mut most, mut at) = (0u64, 0u64, 0usize);
    for (index, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc(Alloc { id, unit, bytes, .. }) => {
                if sizes.len() <= id {
                    sizes.resize(id + 1, (None, 0));
                }
                sizes[id] = (unit, least(bytes));
                live += least(bytes);
                if live > most {
                    (most, at) = (live, index);
                }
            }
            Op::Free(id) => live -= sizes.get(id).map_or(0, |s| s.1),
            Op::Compute(_) => {}
        }
    }
    let mut floors = vec![0u64; units];
    for op in &ops[..=at.min(ops.len().saturating_sub(1))] {
        match *op {
            Op::Alloc(Alloc { id, unit: Some(unit), .. }) if unit < units => floors[unit] += sizes[id].1,
            Op::Free(id) => {
                if let Some(&(Some(unit), bytes)) = sizes.get(id)
                    && unit < units
                {
                    floors[unit] -= bytes;
                }
            }
            _ => {}
        }
    }
    floors
}

/// Where the steady step starts: the last training step's first forward, or the prefill's
/// first unit; the program's start when it has neither.
fn steady_start(ops: &[Op]) -> usize {
    let step_of = |op: &Op| match op {
        Op::Compute(Compute { event: Event::Forward(_, step), .. }) => Some(*step),
        _ => None,
    };
    if let Some(last) = ops.iter().filter_map(step_of).max() {
        return ops.iter().position(|op| step_of(op) == Some(last)).unwrap_or(0);
    }
    ops.iter().position(|op| matches!(op, Op::Compute(Compute { event: Event::Prefill(_), .. }))).unwrap_or(0)
}

/// Each unit's [`Steady`] holdings, from the program on one GPU.
fn steady_holdings(ops: &[Op], units: usize) -> Vec<Steady> {
    let start = steady_start(ops);
    // Each allocation's unit, rounded bytes, component, and where it was made.
    let mut allocations: Vec<Option<(usize, u64, Component, usize)>> = Vec::new();
    let mut freed: Vec<bool> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc(Alloc { id, unit: Some(unit), component, bytes, .. }) if unit < units => {
                if allocations.len() <= id {
                    allocations.resize(id + 1, None);
                    freed.resize(id + 1, false);
                }
                allocations[id] = Some((unit, least(bytes), component, index));
            }
            Op::Free(id) if id < freed.len() => freed[id] = true,
            _ => {}
        }
    }
    let mut out = vec![Steady::default(); units];
    for (id, a) in allocations.iter().enumerate() {
        if let Some((unit, bytes, component, made)) = *a
            && made < start
            && !freed[id]
            && component.held_with_weights()
        {
            out[unit].resident_bytes += bytes;
        }
    }
    let mut live = vec![0u64; units];
    let mut running: Option<usize> = None;
    for (index, op) in ops.iter().enumerate() {
        if index == start {
            for (s, l) in out.iter_mut().zip(&live) {
                s.throughout_bytes = *l;
            }
        }
        let unit = match *op {
            Op::Compute(Compute { unit, .. }) => {
                running = unit.filter(|u| *u < units);
                running
            }
            Op::Alloc(Alloc { id, .. }) | Op::Free(id) => match allocations.get(id) {
                Some(Some((unit, bytes, ..))) => {
                    if matches!(op, Op::Alloc(_)) {
                        live[*unit] += bytes;
                    } else {
                        live[*unit] -= bytes;
                    }
                    Some(*unit)
                }
                _ => None,
            },
        };
        if index >= start
            && let Some(u) = unit
        {
            out[u].throughout_bytes = out[u].throughout_bytes.min(live[u]);
            if running == Some(u) {
                out[u].running_bytes = out[u].running_bytes.max(live[u]);
            }
        }
    }
    for s in &mut out {
        s.throughout_bytes = s.throughout_bytes.max(s.resident_bytes);
        s.running_bytes = s.running_bytes.max(s.throughout_bytes);
    }
    out
}
