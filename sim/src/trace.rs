//! A step's memory over time, for timelines: the replay of [`crate::program::StepProgram`]
//! sampled after every operation, per GPU, as allocated and reserved bytes, with the phases of
//! the step (load, forward, loss, backward, optimizer; prefill) as spans of operations.
//!
//! A program has an operation per tensor: some 10⁴ for a small model, 10⁶ for a large MoE. A
//! trace keeps at most `samples` points per GPU, each the largest allocated and reserved figures
//! of its run of operations, so the curve's peaks survive the aggregation and a 405B model's
//! timeline stays a small file; the peak itself is kept exactly, with its operation and event.
//!
//! [`TraceBuilder`] makes the same figure from any sequence of observations: the validator's
//! script runs (`vramplan validate --script --trace-out`) write their measured step with it, and
//! `plot timeline --trace` draws either.

use crate::estimate::{gpu_limits, is_data_parallel};
use crate::placement::Placement;
use crate::program::{Event, Op, StepProgram, step_program};
use crate::timeline::{ReplayState, Touched};
use crate::workload::{Engine, Workload};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;

/// A phase of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Loading the weights (and the library workspaces).
    Load,
    /// The forward pass (training), hidden states crossing GPUs included.
    Forward,
    /// The loss and its backward.
    Loss,
    /// The backward pass, gradients crossing GPUs included.
    Backward,
    /// The optimizer step.
    Optimizer,
    /// Inference: the prefill of the prompt and the logits of its last token.
    Prefill,
}

impl Phase {
    fn of(event: Event) -> (Phase, u8) {
        match event {
            Event::Load => (Phase::Load, 0),
            Event::Forward(_, s) | Event::ActivationsTo(_, s) => (Phase::Forward, s),
            Event::Loss(s) | Event::LossBackward(s) => (Phase::Loss, s),
            Event::Backward(_, s) | Event::GradientsTo(_, s) => (Phase::Backward, s),
            Event::OptimizerStep(s) => (Phase::Optimizer, s),
            Event::Prefill(_) | Event::LastLogits => (Phase::Prefill, 0),
        }
    }
}

/// A run of operations in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseSpan {
    /// The phase.
    pub phase: Phase,
    /// The training step (1, 2), 0 outside training steps.
    pub step: u8,
    /// The first operation's index.
    pub first_op: usize,
    /// One past the last operation's index.
    pub end_op: usize,
}

/// One point of a GPU's curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// The operation's index (the last of the run a point stands for).
    pub op: usize,
    /// Bytes of live tensors (`memory_allocated`), the most within the run.
    pub allocated: u64,
    /// Bytes of segments (`memory_reserved`), the most within the run.
    pub reserved: u64,
}

/// One GPU's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTrace {
    /// The GPU.
    pub device: u32,
    /// Its name (`Tesla T4`).
    pub name: String,
    /// What PyTorch's allocator may use on it.
    pub usable_bytes: u64,
    /// The curve, in operation order.
    pub samples: Vec<Sample>,
    /// The peak of allocated bytes, exactly: its operation and figures.
    pub peak: Sample,
    /// The moment of the peak in words (as `estimate` names it).
    pub peak_at: String,
}

/// A step's timeline on every GPU it uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    /// Operations in the program.
    pub ops: usize,
    /// The phases, in order.
    pub phases: Vec<PhaseSpan>,
    /// Each GPU's timeline, by GPU.
    pub devices: Vec<DeviceTrace>,
}

/// The timeline of `workload` for `model` placed on `hardware` by `placement`, at most
/// `samples` points per GPU (at least 2), replayed as [`crate::estimate()`] replays it. Under data
/// parallelism, the first rank's step (every rank runs the same one). vLLM and llama.cpp are
/// refused: their estimates size the engine's own pools, not a step of PyTorch allocations.
pub fn trace(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
    samples: usize,
) -> Result<Trace, InputError> {
    if !matches!(workload.engine, Engine::Transformers) {
        return Err(InputError::new(
            "--engine",
            "a timeline replays transformers' step; vLLM and llama.cpp allocate their pools up front",
        )
        .with_fix("draw `plot breakdown` for vLLM and llama.cpp, or leave out --engine"));
    }
    let rank = Placement::single(0);
    let placement = if is_data_parallel(workload) { &rank } else { placement };
    let program = step_program(model, hardware, workload, placement);
    let limits = gpu_limits(hardware, 0.0);
    let mut trace = trace_program(&program, &|g| limits(g), samples);
    for device in &mut trace.devices {
        device.name =
            hardware.devices.get(device.device as usize).map_or_else(String::new, |d| d.name.clone());
        device.usable_bytes = limits(device.device);
    }
    Ok(trace)
}

/// [`trace`] of a built program.
fn trace_program(program: &StepProgram, capacity: &dyn Fn(u32) -> u64, samples: usize) -> Trace {
    let mut builder = TraceBuilder::new(program.ops.len(), samples);
    let mut state = ReplayState::new(program, capacity);
    state.run_observed(&program.ops, capacity, |index, op, touched| {
        if let Op::Compute(c) = op {
            let (phase, step) = Phase::of(c.event);
            builder.phase(index, phase, step);
        }
        builder.reach(index);
        if let Some(Touched { device, allocated, reserved, event }) = touched {
            builder.observe(device, index, allocated, reserved, event);
        }
    });
    // `trace` names the GPUs from the hardware.
    builder.finish(|_, event| program.describe(event), |_| (String::new(), 0))
}

/// Builds a [`Trace`] from observations in operation order: phases as they begin, and per GPU
/// its allocated and reserved bytes after an operation, with a label `L` for the moment (the
/// program's event, or a run's location), named once the peak is known.
#[derive(Debug, Clone)]
pub struct TraceBuilder<L> {
    ops: usize,
    per_point: usize,
    phases: Vec<PhaseSpan>,
    curves: BTreeMap<u32, Curve<L>>,
}

impl<L: Copy + Default> TraceBuilder<L> {
    /// A builder for `ops` operations, keeping at most `samples` points per GPU (at least 2).
    pub fn new(ops: usize, samples: usize) -> TraceBuilder<L> {
        TraceBuilder {
            ops,
            per_point: ops.div_ceil(samples.max(2)).max(1),
            phases: Vec::new(),
            curves: BTreeMap::new(),
        }
    }

    /// Operation `op` is in `phase` of training step `step` (0 outside training steps).
    pub fn phase(&mut self, op: usize, phase: Phase, step: u8) {
        match self.phases.last_mut() {
            Some(last) if last.phase == phase && last.step == step => {}
            _ => self.phases.push(PhaseSpan { phase, step, first_op: op, end_op: op }),
        }
    }

    /// Operation `op` ran: the current phase extends to it.
    pub fn reach(&mut self, op: usize) {
        if let Some(last) = self.phases.last_mut() {
            last.end_op = op + 1;
        }
    }

    /// After operation `op`, GPU `device` held `allocated` and `reserved` bytes, at `label`.
    pub fn observe(&mut self, device: u32, op: usize, allocated: u64, reserved: u64, label: L) {
        let per_point = self.per_point;
        self.curves.entry(device).or_default().observe(op, allocated, reserved, label, per_point);
    }

    /// The trace: `describe` names each GPU's peak (the GPU, and the label it was observed at),
    /// `gpu` gives each GPU's name and usable bytes.
    pub fn finish(self, describe: impl Fn(u32, L) -> String, gpu: impl Fn(u32) -> (String, u64)) -> Trace {
        let devices = self
            .curves
            .into_iter()
            .map(|(device, mut curve)| {
                curve.flush();
                let (name, usable_bytes) = gpu(device);
                DeviceTrace {
                    device,
                    name,
                    usable_bytes,
                    samples: curve.samples,
                    peak: curve.peak,
                    peak_at: describe(device, curve.peak_at),
                }
            })
            .collect();
        Trace { ops: self.ops, phases: self.phases, devices }
    }
}

/// One GPU's curve as it is built: the closed points, the run being gathered, the peak.
#[derive(Debug, Clone)]
struct Curve<L> {
    samples: Vec<Sample>,
    open: Option<Sample>,
    peak: Sample,
    peak_at: L,
}

impl<L: Default> Default for Curve<L> {
    fn default() -> Curve<L> {
        Curve {
            samples: Vec::new(),
            open: None,
            peak: Sample { op: 0, allocated: 0, reserved: 0 },
            peak_at: L::default(),
        }
    }
}

impl<L: Copy> Curve<L> {
    fn observe(&mut self, op: usize, allocated: u64, reserved: u64, event: L, per_point: usize) {
        if allocated > self.peak.allocated {
            self.peak = Sample { op, allocated, reserved };
            self.peak_at = event;
        }
        let open = self.open.get_or_insert(Sample { op, allocated, reserved });
        open.op = op;
        open.allocated = open.allocated.max(allocated);
        open.reserved = open.reserved.max(reserved);
        if (op + 1).is_multiple_of(per_point) {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if let Some(sample) = self.open.take() {
            self.samples.push(sample);
        }
    }
}
