//! What the harness writes for one rank, read and checked against the profile: the outcome
//! with its place, the peaks per fake device, the allocation sequence (replayed here through the
//! simulator's caching-allocator model for the reserved bytes, and into a timeline when one is
//! asked for), the phases, and what the first training forward left for backward.

use super::activations::MeasuredActivations;
use super::{DeviceMemory, Location, Mismatch, RankRun, ScriptOutcome};
use serde::Deserialize;
use std::collections::BTreeMap;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_sim::allocator::CachingAllocator;
use vramplan_sim::trace::{Phase, TraceBuilder};

/// What the harness writes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HarnessResult {
    outcome: String,
    message: String,
    location: Option<Location>,
    module: String,
    mismatch: Option<HarnessMismatch>,
    oom: Option<HarnessOom>,
    steps: u32,
    forwards: u32,
    #[allow(dead_code)]
    optimizers: u32,
    #[allow(dead_code)]
    cuda_ops: u64,
    #[allow(dead_code)]
    cpu_ops: u64,
    per_device: Vec<HarnessDevice>,
    peak_total_bytes: u64,
    #[serde(default)]
    peak_total_workspace_bytes: u64,
    events: Vec<(u32, u64, u64)>,
    phases: Vec<(usize, String, u8)>,
    activations: Option<MeasuredActivations>,
    notes: Vec<String>,
    versions: BTreeMap<String, String>,
    seconds: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HarnessMismatch {
    operation: String,
    devices: Vec<String>,
    shapes: Vec<(Vec<u64>, String)>,
    module: String,
    location: Option<Location>,
    phase: String,
    message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HarnessOom {
    device: u32,
    location: Option<Location>,
    module: String,
    allocated_bytes: u64,
    usable_bytes: u64,
    requested_bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HarnessDevice {
    device: u32,
    peak_allocated_bytes: u64,
    /// On real GPUs, `max_memory_reserved` (a fake run's comes from the allocator model).
    #[serde(default)]
    peak_reserved_bytes: Option<u64>,
    peak_at: Option<Location>,
    peak_module: String,
    usable_bytes: u64,
}

/// What the harness prints on stdout when it cannot start (no torch).
#[derive(Debug, Deserialize)]
pub(super) struct HarnessRefusal {
    pub(super) outcome: String,
    pub(super) message: String,
    /// For `no_device`: the GPUs the profile has.
    #[serde(default)]
    pub(super) needed: u32,
    /// For `no_device`: the GPUs this machine has.
    #[serde(default)]
    pub(super) found: u32,
}

/// A rank's run from what the harness wrote, checked against the profile.
pub(super) fn rank_run(
    parsed: HarnessResult,
    rank: u32,
    hardware: &HardwareProfile,
    trace_points: Option<usize>,
) -> Result<(RankRun, BTreeMap<String, String>), String> {
    let count = hardware.devices.len();
    if parsed.per_device.len() != count {
        return Err(format!("{} devices reported for a profile of {count}", parsed.per_device.len()));
    }
    let known = |name: &str| -> bool {
        name == "cpu"
            || name == "meta"
            || name.strip_prefix("cuda:").and_then(|i| i.parse::<usize>().ok()).is_some_and(|i| i < count)
    };
    if let Some(e) = parsed.events.iter().find(|e| e.0 as usize >= count) {
        return Err(format!("an allocation on GPU {}, which the profile lacks", e.0));
    }
    let phases = parsed
        .phases
        .iter()
        .map(|(at, name, step)| phase_named(name).map(|p| (*at, p, *step)).ok_or(format!("a phase `{name}`")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut builder = trace_points.map(|points| TraceBuilder::<()>::new(parsed.events.len(), points));
    let reserved = replay(&parsed.events, hardware, &phases, builder.as_mut());
    let mut per_device = Vec::with_capacity(count);
    for (i, d) in parsed.per_device.into_iter().enumerate() {
        if d.device as usize != i {
            return Err(format!("device {} reported in place {i}", d.device));
        }
        let device = &hardware.devices[i];
        let peak_reserved = d.peak_reserved_bytes.unwrap_or(reserved[i]).max(d.peak_allocated_bytes);
        per_device.push(DeviceMemory {
            device: d.device,
            name: device.name.clone(),
            peak_allocated_bytes: d.peak_allocated_bytes,
            peak_reserved_bytes: peak_reserved,
            device_used_bytes: peak_reserved + device.context_reserve_bytes,
            usable_bytes: d.usable_bytes,
            peak_at: d.peak_at,
            peak_module: d.peak_module,
        });
    }
    let mut run = RankRun {
        rank,
        outcome: ScriptOutcome::Completed,
        location: parsed.location,
        devices: Vec::new(),
        mismatch: None,
        module: parsed.module,
        message: parsed.message,
        steps: parsed.steps,
        forwards: parsed.forwards,
        // A GPU's peak in the timeline is where the harness saw it: its place in the script.
        trace: builder.map(|b| {
            b.finish(
                |gpu, ()| {
                    let Some(d) = per_device.iter().find(|d| d.device == gpu) else { return String::new() };
                    let at = d
                        .peak_at
                        .as_ref()
                        .map_or_else(String::new, |l| format!("{}:{}", l.file_name(), l.line));
                    if d.peak_module.is_empty() { at } else { format!("{at} in {}", d.peak_module) }
                },
                |gpu| {
                    let device = &hardware.devices[gpu as usize];
                    (device.name.clone(), device.usable_bytes())
                },
            )
        }),
        per_device,
        peak_total_bytes: parsed.peak_total_bytes,
        peak_total_workspace_bytes: parsed.peak_total_workspace_bytes,
        notes: parsed.notes,
        seconds: parsed.seconds,
        activations: parsed.activations,
    };
    // A run with no backward is inference: its forward passes are prefills.
    if let Some(trace) = &mut run.trace
        && !trace.phases.iter().any(|p| p.phase == Phase::Backward)
    {
        for span in trace.phases.iter_mut().filter(|p| p.phase == Phase::Forward) {
            span.phase = Phase::Prefill;
            span.step = 0;
        }
    }
    match parsed.outcome.as_str() {
        "device_mismatch" => {
            let m = parsed.mismatch.ok_or("a device mismatch without its operation")?;
            if let Some(bad) = m.devices.iter().find(|d| !known(d)) {
                return Err(format!("a mismatch on `{bad}`, a device the profile lacks"));
            }
            run.outcome = ScriptOutcome::DeviceMismatch;
            run.location = m.location;
            run.devices = m.devices;
            run.module = m.module;
            run.message = m.message;
            run.mismatch = Some(Mismatch { operation: m.operation, shapes: m.shapes, phase: m.phase });
        }
        "out_of_memory" => {
            let o = parsed.oom.ok_or("an out-of-memory without its device")?;
            if o.device as usize >= count {
                return Err(format!("out of memory on GPU {}, which the profile lacks", o.device));
            }
            run.outcome = ScriptOutcome::OutOfMemory;
            run.location = o.location;
            run.devices = vec![format!("cuda:{}", o.device)];
            run.module = o.module;
            run.message = format!(
                "{} bytes allocated on GPU {} against {} usable, asking for {} more",
                o.allocated_bytes, o.device, o.usable_bytes, o.requested_bytes
            );
        }
        "gpu_idle" => run.outcome = ScriptOutcome::GpuIdle,
        "error" => run.outcome = ScriptOutcome::Error,
        "completed" => {
            // Segments the allocator model needs past a device's usable memory: the allocations
            // fit, their fragments do not.
            if let Some(d) = run.per_device.iter().find(|d| d.peak_reserved_bytes > d.usable_bytes) {
                run.outcome = ScriptOutcome::OutOfMemory;
                run.devices = vec![format!("cuda:{}", d.device)];
                run.location = d.peak_at.clone();
                run.module = d.peak_module.clone();
                run.message = format!(
                    "the caching allocator would reserve {} bytes on GPU {} against {} usable ({} allocated at \
                     the peak)",
                    d.peak_reserved_bytes, d.device, d.usable_bytes, d.peak_allocated_bytes
                );
            }
        }
        other => return Err(format!("an outcome `{other}` the harness does not write")),
    }
    Ok((run, parsed.versions))
}

/// The phase a harness names.
fn phase_named(name: &str) -> Option<Phase> {
    Some(match name {
        "load" => Phase::Load,
        "forward" => Phase::Forward,
        "loss" => Phase::Loss,
        "backward" => Phase::Backward,
        "optimizer" => Phase::Optimizer,
        _ => return None,
    })
}

/// The peak reserved bytes per GPU of the allocation sequence `events` (device, id, bytes: an
/// allocation, or with 0 bytes the free of `id`), through the caching allocator model; with a
/// `trace`, every event observed in it (allocated and reserved after it) in `phases` (the event
/// each phase begins at).
fn replay(
    events: &[(u32, u64, u64)],
    hardware: &HardwareProfile,
    phases: &[(usize, Phase, u8)],
    mut trace: Option<&mut TraceBuilder<()>>,
) -> Vec<u64> {
    let mut allocators: Vec<CachingAllocator> =
        hardware.devices.iter().map(|d| CachingAllocator::with_capacity(d.usable_bytes())).collect();
    let mut peaks = vec![0u64; allocators.len()];
    // The harness numbers allocations over all devices; each allocator wants its own compact ids.
    let mut ids: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); allocators.len()];
    let mut next = vec![0u64; allocators.len()];
    let mut marks = phases.iter().peekable();
    for (index, &(device, id, bytes)) in events.iter().enumerate() {
        let d = device as usize;
        if bytes > 0 {
            let local = next[d];
            next[d] += 1;
            ids[d].insert(id, local);
            allocators[d].alloc(local, bytes);
            peaks[d] = peaks[d].max(allocators[d].reserved);
        } else if let Some(local) = ids[d].remove(&id) {
            allocators[d].free(local);
        }
        if let Some(trace) = trace.as_deref_mut() {
            while let Some(&&(at, phase, step)) = marks.peek() {
                if at > index {
                    break;
                }
                trace.phase(index, phase, step);
                marks.next();
            }
            trace.reach(index);
            trace.observe(device, index, allocators[d].allocated, allocators[d].reserved, ());
        }
    }
    peaks
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
