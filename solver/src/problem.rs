//! The placement problem in the solver's own terms, free of any model or runtime: units with
//! their memory charges, devices with their capacities, and the rules a runtime imposes (order,
//! units that must stay together, user pins). `units.rs` builds one from a model, a workload and
//! a target; `ilp.rs` solves it; `greedy.rs` answers it the way accelerate does.

use serde::Serialize;
pub use vramplan_sim::charges::Steady;
use vramplan_sim::placement::Target;

/// One place units can go.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Device {
    /// `GPU 0 (Tesla T4)`, `cpu`, `disk`.
    pub name: String,
    /// Which device it is: a GPU by index, the CPU or disk.
    pub tier: Target,
    /// What units may fill: usable memory × (1 − headroom), less `fixed_bytes`.
    pub capacity_bytes: u64,
    /// Bytes the device carries once it holds any unit (library workspaces, replicated parts),
    /// already left out of `capacity_bytes`. Reported, not optimised.
    pub fixed_bytes: u64,
    /// Devices with the same class are interchangeable: same kind, same capacity, same links.
    /// The solver may permute them (symmetry breaking).
    pub class: u32,
    /// Bandwidth in bytes per second of the link to the next device in order (for the last
    /// device, to the first), used to weight bytes crossing a boundary; 0 where unknown.
    pub link_bytes_per_s: u64,
}

/// One placement unit, or `count` interchangeable copies of one (the experts of a MoE layer
/// that have the same size and load): the solver then decides how many go where, not which.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unit {
    /// The module path (`model.layers.3`), or for a group of copies the path with the range
    /// (`model.layers.3.mlp.experts[0..64]`).
    pub name: String,
    /// How many interchangeable copies this unit stands for (1 for an ordinary module).
    pub count: u32,
    /// Bytes each copy holds for the whole step: weights, gradients, optimizer states.
    pub resident_bytes: u64,
    /// Of `resident_bytes`, the weights (the rest is gradients and optimizer states).
    pub weight_bytes: u64,
    /// What each copy surely holds at one moment of the step shared by all units (a lower
    /// bound: the floors of a device's units exceeding its limit prove it cannot hold them).
    pub floor_bytes: u64,
    /// What each copy surely holds at every moment of the steady step, and while it runs (a
    /// lower bound at every moment, see [`Steady`]).
    pub steady: Steady,
    /// Bytes each copy adds at the step's peak: activations kept for backward, KV cache.
    pub peak_bytes: u64,
    /// Workspace while the unit runs. A device needs only its largest unit's workspace, once.
    pub transient_bytes: u64,
    /// Position in the forward pass. When the problem is `ordered`, units with a position are
    /// laid out in contiguous ranges, devices in their order (a pipeline).
    pub order: Option<u32>,
    /// Bytes handed to the next unit in order (hidden states); crossing a device boundary costs
    /// this on the link, once per step.
    pub handoff_bytes: u64,
    /// Work per copy (tokens routed to it), for balancing compute as well as memory; 0 where
    /// there are no statistics.
    pub load: f64,
    /// The unit may go on GPUs only, not on the CPU or disk (e.g. the KV cache holders).
    pub gpu_only: bool,
}

impl Unit {
    /// A unit of one copy that holds only its weights, `bytes` of them, throughout the step:
    /// nothing at the peak, no workspace, no position, no load, free to go to `cpu` and `disk`.
    /// The other fields are set with struct update syntax where a unit needs them.
    pub fn weights(name: impl Into<String>, bytes: u64) -> Unit {
        Unit {
            name: name.into(),
            count: 1,
            resident_bytes: bytes,
            weight_bytes: bytes,
            floor_bytes: bytes,
            steady: Steady::lasting(bytes, 0),
            peak_bytes: 0,
            transient_bytes: 0,
            order: None,
            handoff_bytes: 0,
            load: 0.0,
            gpu_only: false,
        }
    }
}

/// A placement problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    /// The units to place, in execution order.
    pub units: Vec<Unit>,
    /// GPUs in profile order, then `cpu` and `disk` when offload is allowed.
    pub devices: Vec<Device>,
    /// Unit indices that must share a device (tied parameters, a router and its experts).
    pub together: Vec<Vec<usize>>,
    /// `(unit, device)`: the user's pins. A pinned group of copies goes whole.
    pub pins: Vec<(usize, usize)>,
    /// Whether ordered units form contiguous ranges in device order.
    pub ordered: bool,
    /// After balance and traffic, prefer plans that use fewer GPUs.
    pub min_devices: bool,
    /// The device (index into `devices`) that runs units placed on `cpu` or `disk`, as
    /// accelerate runs offloaded modules on its main device: their weights stay on the host,
    /// their peak bytes (KV cache) live on this device, and their weights are copied here around
    /// their forward, a workspace of resident plus transient bytes. `None`: host units run on
    /// the host (llama.cpp's CPU layers keep their KV cache in RAM).
    pub offload_runs_on: Option<usize>,
}

/// Where the copies of each unit went: `counts[unit][device]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// Per unit, per device (indices into the problem's `units` and `devices`): the copies
    /// of the unit that device holds.
    pub counts: Vec<Vec<u32>>,
}

impl Assignment {
    /// The device of a single-copy unit (the first device holding any copy of it).
    pub fn device_of(&self, unit: usize) -> Option<usize> {
        self.counts.get(unit)?.iter().position(|&c| c > 0)
    }
}

impl Problem {
    /// Bytes device `device` holds at the peak under `assignment`, as the problem charges
    /// them: fixed bytes once used, resident and peak bytes of every copy, the largest
    /// workspace. The solver's constraint is this ≤ `fixed_bytes + capacity_bytes`.
    pub fn device_bytes(&self, assignment: &Assignment, device: usize) -> u64 {
        let mut held = 0;
        let mut transient = 0;
        let runs_offloaded = self.offload_runs_on == Some(device);
        for (u, unit) in self.units.iter().enumerate() {
            let copies = u64::from(assignment.counts[u][device]);
            if copies > 0 {
                held += copies * self.copy_bytes(unit, device);
                transient = transient.max(unit.transient_bytes);
            }
            if runs_offloaded {
                let on_hosts: u64 = (0..self.devices.len())
                    .filter(|&d| self.is_host(d))
                    .map(|d| u64::from(assignment.counts[u][d]))
                    .sum();
                if on_hosts > 0 {
                    held += on_hosts * unit.peak_bytes;
                    transient = transient.max(unit.resident_bytes + unit.transient_bytes);
                }
            }
        }
        if held == 0 { 0 } else { self.devices[device].fixed_bytes + held + transient }
    }

    /// Whether device `device` is `cpu` or `disk`.
    pub fn is_host(&self, device: usize) -> bool {
        !matches!(self.devices[device].tier, Target::Gpu(_))
    }

    /// Bytes one copy of `unit` holds on `device`: resident and peak bytes, or on a host whose
    /// units run on a GPU ([`Problem::offload_runs_on`]) the resident bytes alone.
    pub fn copy_bytes(&self, unit: &Unit, device: usize) -> u64 {
        if self.offload_runs_on.is_some() && self.is_host(device) {
            unit.resident_bytes
        } else {
            unit.resident_bytes + unit.peak_bytes
        }
    }

    /// The share of its capacity (with fixed bytes) that a device's charge fills.
    pub fn utilisation(&self, assignment: &Assignment, device: usize) -> f64 {
        let d = &self.devices[device];
        let cap = (d.capacity_bytes + d.fixed_bytes).max(1);
        self.device_bytes(assignment, device) as f64 / cap as f64
    }
}
