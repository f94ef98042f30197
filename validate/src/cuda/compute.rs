//! The compute beside the replay of the program's allocations: each `Compute` of the program
//! runs its operations (`plan.rs`) when its span has made its allocations, just before the
//! span's first free (or at its end when it frees nothing), so that what the operations read
//! and write is live: the weights, what the unit keeps for backward, its working set, the
//! logits, the gradients, the optimizer states, the hidden states in flight. Each operation is
//! bound to those allocations (`bind.rs`), checked against PyTorch's device rule, tiled to stay
//! inside them, and run by an [`Engine`], which waits for each GPU at the end of the span.

use super::bind::{Binding, Holdings, Live, Moment, tiles};
use super::engine::{Arg, Call, Engine, Touch};
use super::kernels::{self, ParamType};
use super::ops::{Operation, Param, Work, gemm_call, geometry};
use super::plan::Planner;
use crate::Outcome;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::program::{Alloc, AllocId, Component, Compute, Event, Op, StepProgram, UnitIndex};
use vramplan_sim::workload::Workload;

/// Why the run stopped.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stop {
    /// PyTorch's "Expected all tensors to be on the same device": the operand's device first.
    Mismatch { module: String, operation: &'static str, devices: [u32; 2] },
    /// A library call failed.
    Failed { module: String, message: String },
}

impl Stop {
    pub(crate) fn outcome(self) -> Outcome {
        match self {
            Stop::Mismatch { module, operation, devices } => {
                let [a, b] = devices.map(|d| format!("cuda:{d}"));
                Outcome::RuntimeError {
                    error: "device_mismatch".into(),
                    module,
                    message: format!(
                        "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! \
                         (in {operation})"
                    ),
                    devices: vec![a, b],
                }
            }
            Stop::Failed { module, message } => {
                Outcome::RuntimeError { error: "error".into(), module, message, devices: Vec::new() }
            }
        }
    }
}

/// What the compute did.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Stats {
    /// Operations planned.
    pub operations: usize,
    /// Calls made (an operation's tiles).
    pub calls: usize,
    /// GEMM floating-point operations run.
    pub flops: u64,
    /// Operations not run, and why.
    pub skipped: Vec<String>,
}

/// A `Compute` waiting for its span's allocations.
struct Pending {
    unit: Option<UnitIndex>,
    device: Option<u32>,
    event: Event,
    from: Option<u32>,
    span_first: AllocId,
}

/// The compute of one run.
pub(crate) struct Runner<'a> {
    planner: Planner<'a>,
    loaded: HashMap<String, AllocId>,
    engine: Box<dyn Engine + 'a>,
    live: BTreeMap<AllocId, Live>,
    next_id: AllocId,
    pending: Option<Pending>,
    last: Option<(Event, Option<u32>)>,
    pub(crate) stats: Stats,
}

/// Where allocation `id` on a GPU starts, while live.
pub(crate) type Pointers<'p> = &'p dyn Fn(u32, AllocId) -> Option<u64>;

impl<'a> Runner<'a> {
    pub(crate) fn new(
        model: &'a ModelDescription,
        workload: &'a Workload,
        program: &'a StepProgram,
        engine: Box<dyn Engine + 'a>,
    ) -> Runner<'a> {
        let planner = Planner::new(model, workload, program);
        // The load's weight allocations of each unit, matched to its tensors where they are as
        // many.
        let mut by_unit: BTreeMap<usize, Vec<AllocId>> = BTreeMap::new();
        for op in &program.ops[..program.load_ops.min(program.ops.len())] {
            if let Op::Alloc(Alloc { id, unit: Some(u), component: Component::Weights, .. }) = op {
                by_unit.entry(*u).or_default().push(*id);
            }
        }
        let mut loaded = HashMap::new();
        for (u, ids) in by_unit {
            if planner.held.get(u).is_some_and(|held| held.len() == ids.len()) {
                loaded.extend(planner.held[u].iter().cloned().zip(ids));
            }
        }
        Runner {
            planner,
            loaded,
            engine,
            live: BTreeMap::new(),
            next_id: 0,
            pending: None,
            last: None,
            stats: Stats::default(),
        }
    }

    /// A `Compute` at operation `at`: the one before it runs, this one waits for its span.
    pub(crate) fn compute(&mut self, at: usize, c: &Compute, pointers: Pointers) -> Result<(), Stop> {
        self.flush(at, pointers)?;
        let crossing = matches!(c.event, Event::ActivationsTo(..) | Event::GradientsTo(..));
        let from = match self.last {
            Some((event, device)) if crossing && event == c.event => device,
            _ => None,
        };
        self.last = Some((c.event, c.device));
        self.pending =
            Some(Pending { unit: c.unit, device: c.device, event: c.event, from, span_first: self.next_id });
        Ok(())
    }

    /// An allocation made, at `pointer` where its device is part of the run; a GPU's first
    /// workspace becomes cuBLAS's (the run's one handle; the program's others, the backward
    /// thread's and cuBLASLt's, are held as PyTorch holds them).
    pub(crate) fn alloc(&mut self, alloc: &Alloc, pointer: Option<u64>) -> Result<(), Stop> {
        let bound =
            self.live.values().any(|l| l.device == alloc.device && l.component == Component::Workspace);
        let live =
            Live { device: alloc.device, unit: alloc.unit, component: alloc.component, bytes: alloc.bytes };
        self.live.insert(alloc.id, live);
        self.next_id = self.next_id.max(alloc.id + 1);
        if let (Component::Workspace, Some(pointer), false) = (alloc.component, pointer, bound) {
            let failed = |message| Stop::Failed { module: String::new(), message };
            self.engine.set_workspace(alloc.device, pointer, alloc.bytes).map_err(failed)?;
        }
        Ok(())
    }

    /// A free at operation `at`: the waiting compute runs first.
    pub(crate) fn before_free(&mut self, at: usize, pointers: Pointers) -> Result<(), Stop> {
        self.flush(at, pointers)
    }

    pub(crate) fn free(&mut self, id: AllocId) {
        self.live.remove(&id);
    }

    /// The end of the program.
    pub(crate) fn finish(&mut self, at: usize, pointers: Pointers) -> Result<(), Stop> {
        self.flush(at, pointers)
    }

    /// Runs the waiting compute's operations.
    fn flush(&mut self, at: usize, pointers: Pointers) -> Result<(), Stop> {
        let Some(p) = self.pending.take() else { return Ok(()) };
        let Runner { planner, loaded, engine, live, stats, .. } = self;
        let ops = planner.plan(p.unit, p.device, p.event, p.from);
        let holdings = Holdings { planner, loaded };
        let moment = Moment { live, span_first: p.span_first, unit: p.unit };
        let mut used = BTreeSet::new();
        for op in &ops {
            stats.operations += 1;
            let (views, tile) = match holdings.bind(op, &moment) {
                Binding::Ready { views, tile } => (views, tile),
                Binding::Skipped(why) => {
                    stats.skipped.push(format!("{} in {}: {why}", op.name, op.module));
                    continue;
                }
                Binding::Mismatch { device, .. } => {
                    return Err(Stop::Mismatch {
                        module: op.module.clone(),
                        operation: op.name,
                        devices: [device, op.device],
                    });
                }
            };
            let bases: Option<Vec<u64>> =
                views.iter().map(|v| pointers(v.device, v.alloc).map(|p| p + v.offset)).collect();
            let Some(bases) = bases else {
                stats
                    .skipped
                    .push(format!("{} in {}: an operand is on a GPU outside the run", op.name, op.module));
                continue;
            };
            used.insert(op.device);
            for dims in tiles(&op.dims, &tile) {
                let touched: Vec<Touch> = op
                    .operands
                    .iter()
                    .zip(&views)
                    .zip(&bases)
                    .map(|((o, v), &pointer)| Touch {
                        alloc: v.alloc,
                        device: v.device,
                        offset: v.offset,
                        bytes: o.bytes(&dims),
                        pointer,
                    })
                    .collect();
                let call = call(op, &dims, &bases, &views).ok_or_else(|| Stop::Failed {
                    module: op.module.clone(),
                    message: format!("{}: no launch for {dims:?}", op.name),
                })?;
                engine
                    .run(op.device, at, &call, &touched)
                    .map_err(|message| Stop::Failed { module: op.module.clone(), message })?;
                stats.calls += 1;
                stats.flops += op.flops_at(&dims);
            }
        }
        for device in used {
            engine.synchronize(device).map_err(|message| Stop::Failed { module: String::new(), message })?;
        }
        Ok(())
    }
}

/// The call of one tile of `op` at `dims`, its operands at `bases`.
fn call(op: &Operation, dims: &[u64], bases: &[u64], views: &[super::bind::View]) -> Option<Call> {
    match &op.work {
        Work::Gemm(gemm) => {
            let batched = op.operands[1].spans(0);
            gemm_call(*gemm, op.elem, dims, [bases[0], bases[1], bases[2]], batched).map(Call::Gemm)
        }
        Work::Kernel { name, params } => {
            let signature = kernels::signature(name)?;
            // The launch passes what the kernel declares, or nothing runs.
            let types_match = params.iter().zip(signature.params).all(|(p, t)| {
                matches!(
                    (p, t),
                    (Param::U64(_), ParamType::U64)
                        | (Param::I32(_), ParamType::I32)
                        | (Param::F32(_), ParamType::F32)
                )
            });
            if bases.len() != signature.pointers.len()
                || dims.len() != signature.dims
                || params.len() != signature.params.len()
                || !types_match
            {
                return None;
            }
            let (grid, block) = geometry(signature.shape, dims);
            let args = bases
                .iter()
                .map(|p| Arg::Pointer(*p))
                .chain(dims.iter().map(|d| Arg::U64(*d)))
                .chain(params.iter().map(|p| Arg::from(*p)))
                .collect();
            Some(Call::Launch { kernel: signature.name, elem: op.elem, grid, block, args })
        }
        Work::Copy => {
            Some(Call::Copy { to: bases[1], from: bases[0], from_device: views[0].device, bytes: dims[0] })
        }
    }
}
