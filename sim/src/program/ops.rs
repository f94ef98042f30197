//! The step program's instruction set: the components an allocation belongs to, the events a
//! unit's compute is labelled with, the operations (compute, alloc, free), the program's units,
//! and the program itself.

use std::collections::BTreeMap;

/// Which component an allocation belongs to (the rows of an estimate's breakdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// Weights as held, their autocast copies, ZeRO-3 gathers and offloaded weights streamed in.
    Weights,
    /// Gradients of the trainable parameters.
    Gradients,
    /// Optimizer states and fp32 master weights.
    Optimizer,
    /// Activations kept for backward, recomputed ones, workspaces, hidden states in flight.
    Activations,
    /// The KV cache of the whole context (inference).
    KvCache,
    /// Logits, their fp32 upcast, the loss and their gradients.
    Logits,
    /// Library workspaces allocated through PyTorch (cuBLAS).
    Workspace,
}

impl Component {
    /// A dense index (0..7), for per-component arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether bytes of this component go with the unit's tensors when it is offloaded
    /// (weights, gradients and optimizer states), rather than with the GPU that runs it.
    pub fn held_with_weights(self) -> bool {
        matches!(self, Component::Weights | Component::Gradients | Component::Optimizer)
    }
}

/// A unit by its index in [`StepProgram::units`].
pub type UnitIndex = usize;

/// A training step: 1 (creates the optimizer states) or 2 (the steady state).
pub type Step = u8;

/// A moment of the step, named for the peak it may be reported at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Event {
    /// Loading the weights, and the cuBLAS workspaces.
    #[default]
    Load,
    /// A unit's forward in a training step.
    Forward(UnitIndex, Step),
    /// The loss on the head's device.
    Loss(Step),
    /// The loss's backward.
    LossBackward(Step),
    /// A unit's backward.
    Backward(UnitIndex, Step),
    /// The optimizer step (the first creates the states).
    OptimizerStep(Step),
    /// Hidden states crossing to a unit on another GPU.
    ActivationsTo(UnitIndex, Step),
    /// Their gradient crossing back to a unit on another GPU.
    GradientsTo(UnitIndex, Step),
    /// A unit's prefill of the prompt (inference).
    Prefill(UnitIndex),
    /// The logits of the last prompt token (inference).
    LastLogits,
}

/// An allocation's handle, unique within a program (allocations are numbered in order).
pub type AllocId = usize;

/// One operation of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// From here on, a unit computes. Consecutive `Compute`s of one unit are one run of it (its
    /// forward; its backward; for the head, its forward, the loss and its backward).
    Compute(Compute),
    /// A tensor is allocated.
    Alloc(Alloc),
    /// The allocation is freed.
    Free(AllocId),
}

/// The start of a unit's computation, or of the step's own work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compute {
    /// The unit; `None` for work of the whole step (loading, the optimizer step).
    pub unit: Option<UnitIndex>,
    /// The GPU it runs on; `None` for every GPU.
    pub device: Option<u32>,
    /// The moment, for reports.
    pub event: Event,
}

/// An allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alloc {
    /// Its handle, for the [`Op::Free`] that ends it.
    pub id: AllocId,
    /// The GPU.
    pub device: u32,
    /// The unit it is for; `None` for a device's own workspace.
    pub unit: Option<UnitIndex>,
    /// What it holds.
    pub component: Component,
    /// Bytes requested (before the allocator rounds them).
    pub bytes: u64,
    /// The CUDA stream it is allocated on, whose pools alone serve it: 0, the compute stream,
    /// but for FSDP1's own streams (`fsdp.rs`; the allocator's `alloc_on`).
    pub stream: u8,
}

/// What kind of placement unit a program unit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitRole {
    /// The block at this index of `facts.layers` (a decoder layer, never split).
    Block(usize),
    /// The token embedding (and what loads with it).
    Embedding,
    /// The output projection to the vocabulary; the logits and the loss are charged to it.
    Head,
    /// Any other module holding tensors (final norm, rotary buffers).
    Other,
}

/// One placement unit as the program knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramUnit {
    /// The module path (for a parent's own tensors, the parent's).
    pub path: String,
    /// The `device_map` keys that place the unit: disjoint prefixes, the first finding it in a
    /// placement.
    pub keys: Vec<String>,
    /// What kind of unit it is.
    pub role: UnitRole,
    /// The GPU it runs on (its own, or the main GPU when offloaded in inference); `None` when
    /// it runs on the host.
    pub device: Option<u32>,
}

/// The step as a list of operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepProgram {
    /// The placement units, in execution order.
    pub units: Vec<ProgramUnit>,
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// Hidden states handed from one unit to the next in the forward pass (also their gradient
    /// in backward): what a device boundary costs both sides while in flight.
    pub handoff_bytes: u64,
    /// Bytes per GPU outside PyTorch's caching allocator, in CUDA managed memory: the states of
    /// a paged optimizer. `max_memory_allocated` and `_reserved` do not see them; `nvidia-smi`
    /// does, while they are resident (the driver pages them to host memory under pressure).
    pub managed_bytes: BTreeMap<u32, u64>,
    /// How many of `ops` load the model (weights, DDP's buckets, the cuBLAS workspaces): the
    /// same operations at every batch and sequence length.
    pub load_ops: usize,
}

impl StepProgram {
    /// `event` in words, with the unit paths it names.
    pub fn describe(&self, event: Event) -> String {
        describe(&self.units, event)
    }
}

/// `event` of a program of `units` in words.
pub(super) fn describe(units: &[ProgramUnit], event: Event) -> String {
    let path = |unit: usize| units.get(unit).map(|u| u.path.as_str()).unwrap_or("?");
    match event {
        Event::Load => "load".into(),
        Event::Forward(unit, step) => format!("forward of {} (step {step})", path(unit)),
        Event::Loss(step) => format!("loss (step {step})"),
        Event::LossBackward(step) => format!("backward of the loss (step {step})"),
        Event::Backward(unit, step) => format!("backward of {} (step {step})", path(unit)),
        Event::OptimizerStep(step) => format!("optimizer step (step {step})"),
        Event::ActivationsTo(unit, step) => format!("activations to {} (step {step})", path(unit)),
        Event::GradientsTo(unit, step) => format!("gradients to {} (step {step})", path(unit)),
        Event::Prefill(unit) => format!("prefill of {}", path(unit)),
        Event::LastLogits => "logits of the last prompt token".into(),
    }
}
