//! The step program: model + workload + placement → one ordered list of operations (a unit
//! starts computing; a tensor is allocated on a device for a unit and a component; a tensor is
//! freed). Everything that needs the step reads this list and nothing re-derives it: the replay
//! (`timeline.rs`) runs it per device through the caching-allocator model, the solver's per-unit
//! charges (`charges.rs`) are read off it, and the validator and the timeline plot are to read it
//! too.
//!
//! What the list holds, in order (`docs/memory-model.md` gives every term's source):
//! - load: each unit's weights as held (quantized, cast, ZeRO-3 shard), then each used GPU's
//!   cuBLAS workspace;
//! - training, two steps (the first creates the optimizer states lazily at its optimizer step,
//!   as torch optimizers do; the second is the steady state): forward unit by unit (activations
//!   kept for backward, or the block input under checkpointing; autocast copies; workspace),
//!   the loss on the head's device, backward in reverse order (recompute, gradients, workspace),
//!   the optimizer step, and `zero_grad`;
//! - inference: the KV cache for the whole context (under `--awq-fused`, AutoAWQ's fuse, which
//!   makes its own), then prefill unit by unit and the logits of the last prompt token.
//!
//! Placement changes the program in two places only: in training, hidden states cross a device
//! boundary (both GPUs hold a copy in flight; prefill's crossings are not modelled), and in
//! inference a unit offloaded to `cpu` or `disk` has its weights copied to the main GPU around
//! its forward, where its KV cache also lives.

mod loss;

use crate::fsdp::{self, Fsdp1};
use crate::model::activations::{ActivationModel, BlockActivations};
use crate::model::declared::{self, Declarations, Declared};
use crate::model::precision::Precision;
use crate::model::units::{self, Unit, UnitKind};
use crate::placement::{Placement, Target, TensorPlacement, covers};
use crate::workload::{Finetune, GradCheckpointing, Mode, Parallelism, Quant, Trainer, Workload};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{AttentionKind, ModelDescription, ModuleKind, NormKind, StackKind};

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
fn describe(units: &[ProgramUnit], event: Event) -> String {
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

/// One cuBLAS handle's workspace, as torch 2.11 sizes it (`parseChosenWorkspaceSize` in
/// aten/src/ATen/cuda/CublasHandlePool.cpp) with `CUBLAS_WORKSPACE_CONFIG` unset: 32 MiB
/// (`4096 * 8 * 1024`) on compute capability 9 (Hopper), else `:4096:2:16:8` = 4096 KiB × 2 +
/// 16 KiB × 8 = 8,519,680 B. PyTorch PR #175344 (in 2.12) gives 32 MiB to 10 and 12 as well, and
/// 2.15's source to 9 to 12. `setWorkspaceForHandle` allocates it through the caching allocator
/// once per (handle, stream) at the handle's first matmul and keeps it.
pub fn cublas_workspace(compute_major: u32) -> u64 {
    if compute_major == 9 { 32 << 20 } else { 8_519_680 }
}

/// cuBLASLt's own workspace (`CUBLASLT_WORKSPACE_SIZE` unset: 1024 KiB, PyTorch PR #73439), kept
/// per (handle, stream) beside the cuBLAS one up to torch 2.11 (PR #156495; unified with it by
/// default only from PR #175879, after 2.11's branch cut). ATen runs cuBLASLt for `addmm` with a
/// 1-D bias, i.e. a `Linear` (or GPT-2's `Conv1D`) with a bias.
pub const CUBLASLT_WORKSPACE: u64 = 1 << 20;

/// The BLAS workspaces (each its own allocation) a GPU of compute capability `compute_major`
/// holds for `model` under `mode`: a cuBLAS workspace per thread that runs matmuls there (handles
/// are per thread and device, `DeviceThreadHandlePool`): the script's forward, and in training
/// the autograd engine's worker thread of the device, which runs its backward; plus cuBLASLt's on
/// the forward thread where a linear layer has a bias. Torch 2.15 allocates both per operation
/// instead (`TORCH_CUBLAS_WORKSPACE_CACHE` unset, PR #194311): not modelled here
/// (docs/memory-model.md).
pub fn blas_workspaces(model: &ModelDescription, compute_major: u32, mode: Mode) -> Vec<u64> {
    let handles = if mode == Mode::Train { 2 } else { 1 };
    let mut biased = false;
    model.root.visit(&mut |m| {
        biased |= m.kind == ModuleKind::Linear && m.tensors.iter().any(|t| t.name == "bias");
    });
    let mut sizes = vec![cublas_workspace(compute_major); handles];
    if biased {
        sizes.push(CUBLASLT_WORKSPACE);
    }
    sizes
}

/// The step program of `workload` for `model` placed on `hardware` by `placement`.
pub fn step_program(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
) -> StepProgram {
    Resolved::new(model, hardware, workload, placement).program(workload)
}

/// What the program takes from the model, the workload and the placement that does not depend
/// on the batch or the sequence length, resolved once: the LoRA targets, the dtypes, the units
/// and what each holds, the activation model's per-model traits, and where each unit runs; and
/// the load, written once. A sweep over shapes (`sweep.rs`) writes every point's program from one
/// of these.
pub(crate) struct Resolved<'a> {
    model: &'a ModelDescription,
    hardware: &'a HardwareProfile,
    precision: Precision,
    blocks: ActivationModel<'a>,
    units: Vec<Unit>,
    /// The GPU each unit runs on: where it is placed, or for inference the main GPU when it is
    /// offloaded to `cpu` or `disk`.
    devices: Vec<Option<u32>>,
    /// Per unit, the GPU each of its weight tensors is loaded on (`None`: on `cpu` or `disk`, or
    /// on no device), by accelerate's rules for the map's keys at any depth
    /// ([`TensorPlacement`]). A map may split a unit, so the tensors of one may sit on several.
    homes: Vec<Vec<Option<u32>>>,
    /// Per unit, its tensors on `cpu` or `disk` in inference, which accelerate's hook copies to
    /// the main GPU around the unit's forward (`AlignDevicesHook` with offload); a unit with
    /// nothing on a GPU runs there, and its KV cache stays there.
    streamed: Vec<Vec<usize>>,
    /// Per unit, its trainable tensors grouped by the GPU their weight is on, in order of first
    /// appearance: their gradients and optimizer states live there.
    trainable_groups: Vec<Vec<(u32, Vec<units::TrainableTensor>)>>,
    /// Per unit, the other GPUs that hold some of its tensors (a map that splits it): its hidden
    /// states are handed to each of them and back in its forward and backward.
    spans: Vec<Vec<u32>>,
    /// The GPU that runs what is offloaded in inference (the first the map lists).
    main_gpu: Option<u32>,
    shards: u64,
    /// FSDP1's flat parameters under `--trainer fsdp-qlora --parallel fsdp` (`fsdp.rs`).
    fsdp: Option<Fsdp1>,
    /// The units as every program lists them.
    program_units: Vec<ProgramUnit>,
    /// Per unit, what a custom model declares for it when it is not a block (the activation
    /// model has the blocks'), and what a declaring container above it adds to it
    /// (`model/declared.rs`).
    declared: Vec<(Option<Declarations>, Option<Declarations>)>,
    /// Per unit outside the blocks, whether its module holds a norm (which keeps activations in
    /// training).
    holds_norm: Vec<bool>,
    /// The operations of the last program written: the next one's is about as long.
    ops_hint: AtomicUsize,
    /// The load's operations and the allocations live after it, written once: the same at
    /// every shape ([`StepProgram::load_ops`]).
    loaded: OnceLock<Load>,
}

/// The load's operations, and by id the allocations live after it (device and component).
type Load = (Vec<Op>, Vec<Option<(u32, Component)>>);

/// The operations of one shape's program after its load, which a sweep replays at each shape.
pub(crate) struct StepOps {
    /// The operations, their ids going on from the load's.
    pub ops: Vec<Op>,
    /// As [`StepProgram::managed_bytes`].
    pub managed_bytes: BTreeMap<u32, u64>,
}

impl<'a> Resolved<'a> {
    pub(crate) fn new(
        model: &'a ModelDescription,
        hardware: &'a HardwareProfile,
        workload: &'a Workload,
        placement: &Placement,
    ) -> Resolved<'a> {
        let lora_targets = crate::closed_form::lora_targets(model, workload);
        let precision = Precision::of(model, workload);
        let units = units::units(model, workload, &precision, &lora_targets);
        let main_gpu = placement.main_gpu().filter(|_| workload.mode == Mode::Inference);
        let tensors = TensorPlacement::new(placement, model);
        // The names tied to each tensor (a head's weight to the input embedding's).
        let tied: std::collections::HashMap<String, Vec<String>> = model
            .tied_groups()
            .into_iter()
            .filter_map(|mut group| (!group.is_empty()).then(|| (group.remove(0), group)))
            .collect();
        let mut homes = Vec::with_capacity(units.len());
        let mut streamed = Vec::with_capacity(units.len());
        let mut devices: Vec<Option<u32>> = Vec::with_capacity(units.len());
        for u in &units {
            // A unit with no tensors of its own (a head tied to the embedding) goes where its
            // key says.
            let targets: Vec<Option<Target>> = if u.placed_by.is_empty() {
                vec![placement.target_of(&u.keys[0])]
            } else {
                u.placed_by
                    .iter()
                    .map(|p| match tied.get(p) {
                        Some(names) => tensors.tied_target(p, names),
                        None => tensors.target(p),
                    })
                    .collect()
            };
            let home: Vec<Option<u32>> =
                targets.iter().map(|t| if let Some(Target::Gpu(g)) = t { Some(*g) } else { None }).collect();
            let hosted: Vec<usize> = (0..u.weight_tensors.len())
                .filter(|&j| matches!(targets.get(j), Some(Some(Target::Cpu | Target::Disk))))
                .collect();
            // It runs where its first tensor on a GPU is (where a block's input arrives); with
            // nothing on a GPU, on the main GPU in inference when offloaded.
            let device = match home.iter().flatten().next() {
                Some(g) => Some(*g),
                None if targets.iter().any(|t| matches!(t, Some(Target::Cpu | Target::Disk))) => main_gpu,
                None => None,
            };
            devices.push(device);
            streamed.push(if main_gpu.is_some() { hosted } else { Vec::new() });
            homes.push(if u.placed_by.is_empty() { Vec::new() } else { home });
        }
        let trainable_groups: Vec<Vec<(u32, Vec<units::TrainableTensor>)>> = units
            .iter()
            .zip(&homes)
            .map(|(u, home)| {
                let mut groups: Vec<(u32, Vec<units::TrainableTensor>)> = Vec::new();
                for t in &u.trainable_tensors {
                    let Some(Some(g)) = home.get(t.weight) else { continue };
                    match groups.iter_mut().find(|(d, _)| d == g) {
                        Some((_, tensors)) => tensors.push(*t),
                        None => groups.push((*g, vec![*t])),
                    }
                }
                groups
            })
            .collect();
        let spans: Vec<Vec<u32>> = homes
            .iter()
            .zip(&devices)
            .map(|(home, device)| {
                let mut others: Vec<u32> = Vec::new();
                for g in home.iter().flatten() {
                    if Some(*g) != *device && !others.contains(g) {
                        others.push(*g);
                    }
                }
                others
            })
            .collect();
        let shards = match workload.parallelism {
            Parallelism::Zero { .. } => hardware.devices.len().max(1) as u64,
            _ => 1,
        };
        let program_units = units
            .iter()
            .zip(&devices)
            .map(|(u, device)| ProgramUnit {
                path: u.path.clone(),
                keys: u.keys.clone(),
                role: match u.kind {
                    UnitKind::Block(layer) => UnitRole::Block(layer),
                    UnitKind::Embedding => UnitRole::Embedding,
                    UnitKind::Head => UnitRole::Head,
                    UnitKind::Other => UnitRole::Other,
                },
                device: *device,
            })
            .collect();
        let declared = (0..units.len())
            .map(|i| {
                let block = matches!(units[i].kind, UnitKind::Block(_));
                let outside = if block { None } else { declared::outside_blocks(model, &units, i) };
                (outside, declared::above(model, &units, i))
            })
            .collect();
        let holds_norm = units
            .iter()
            .map(|u| {
                // A vision tower's norms run on its patches, not the language model's tokens
                // (`model/vision.rs`); modules the step never runs keep nothing.
                !matches!(u.kind, UnitKind::Block(_))
                    && !crate::model::vision::in_tower(model, &u.path)
                    && !crate::model::vision::idle(model, &u.path)
                    && model.root.find(&u.path).is_some_and(|m| {
                        let mut found = false;
                        m.visit(&mut |x| found |= x.kind == ModuleKind::Norm);
                        found
                    })
            })
            .collect();
        Resolved {
            model,
            hardware,
            program_units,
            declared,
            holds_norm,
            precision,
            blocks: ActivationModel::new(model, workload, precision, &lora_targets),
            units,
            devices,
            homes,
            streamed,
            trainable_groups,
            spans,
            main_gpu,
            shards,
            fsdp: Fsdp1::of(workload, shards),
            ops_hint: AtomicUsize::new(0),
            loaded: OnceLock::new(),
        }
    }

    /// The program of `workload`, which differs from the one this was resolved for at most in
    /// its batch, sequence and prompt lengths.
    pub(crate) fn program(&self, workload: &Workload) -> StepProgram {
        let workload = &*workload.with_image_tokens(self.model);
        let mut builder = Builder::new(self, workload);
        builder.load();
        let load_ops = builder.ops.len();
        builder.steps();
        let tokens = match workload.mode {
            Mode::Train => workload.seq,
            Mode::Inference => builder.prompt(),
        };
        let handoff_bytes = builder.handoff_bytes(tokens);
        self.ops_hint.store(builder.ops.len(), Ordering::Relaxed);
        StepProgram {
            units: self.program_units.clone(),
            ops: builder.ops,
            handoff_bytes,
            managed_bytes: builder.managed,
            load_ops,
        }
    }

    /// The operations of [`Resolved::program`] after the load, from the load written once.
    pub(crate) fn step(&self, workload: &Workload) -> StepOps {
        let workload = &*workload.with_image_tokens(self.model);
        let loaded = self.loaded.get_or_init(|| self.write_load(workload));
        // The load reads no shape; the tests hold a sweep to whole programs.
        debug_assert!(self.write_load(workload) == *loaded, "the load differs between shapes");
        let mut builder = Builder::new(self, workload);
        builder.live.extend_from_slice(&loaded.1);
        builder.steps();
        StepOps { ops: builder.ops, managed_bytes: builder.managed }
    }

    /// The load of `workload`'s program.
    fn write_load(&self, workload: &Workload) -> Load {
        let mut builder = Builder::new(self, workload);
        builder.load();
        (builder.ops, builder.live)
    }

    /// `event` in words, as [`StepProgram::describe`] puts it.
    pub(crate) fn describe(&self, event: Event) -> String {
        describe(&self.program_units, event)
    }
}

/// Writes one shape's program from what is [`Resolved`].
struct Builder<'r, 'a> {
    r: &'r Resolved<'a>,
    workload: &'r Workload,
    /// Each unit's activations for one training step.
    activations: Vec<BlockActivations>,
    ops: Vec<Op>,
    /// Live allocations by id: device and component.
    live: Vec<Option<(u32, Component)>>,
    /// Bytes per GPU in CUDA managed memory (paged optimizer states).
    managed: BTreeMap<u32, u64>,
    /// GPUs holding Unsloth's buffers for offloaded checkpoints.
    offload_buffers: Vec<u32>,
    /// GPUs holding Unsloth's dequantization scratch buffer.
    weight_scratch: Vec<u32>,
    /// LitGPT's logits of the last step, which its loop's `logits` holds until the next
    /// step's forward replaces them (`model/litgpt.rs`).
    litgpt_logits: Option<AllocId>,
}

impl<'r, 'a> Builder<'r, 'a> {
    fn new(r: &'r Resolved<'a>, workload: &'r Workload) -> Builder<'r, 'a> {
        let mut builder = Builder {
            r,
            workload,
            activations: Vec::with_capacity(r.units.len()),
            ops: Vec::with_capacity(r.ops_hint.load(Ordering::Relaxed)),
            // (Fewer allocations than operations.)
            live: Vec::with_capacity(r.ops_hint.load(Ordering::Relaxed)),
            managed: BTreeMap::new(),
            offload_buffers: Vec::new(),
            weight_scratch: Vec::new(),
            litgpt_logits: None,
        };
        builder.activations = (0..r.units.len()).map(|i| builder.activations_of(i)).collect();
        builder
    }

    /// The steps after the load: two training steps, or the inference.
    fn steps(&mut self) {
        match self.workload.mode {
            Mode::Train => {
                self.train_step(1);
                self.train_step(2);
            }
            Mode::Inference => self.inference(),
        }
    }

    fn compute(&mut self, unit: Option<usize>, device: Option<u32>, event: Event) {
        self.ops.push(Op::Compute(Compute { unit, device, event }));
    }

    /// Allocates `bytes` on `device` for `unit`; nothing (and `None`) for 0 bytes.
    fn alloc(
        &mut self,
        device: u32,
        unit: Option<usize>,
        component: Component,
        bytes: u64,
    ) -> Option<AllocId> {
        self.alloc_on(device, unit, component, bytes, 0)
    }

    /// [`Builder::alloc`] on CUDA stream `stream` (FSDP1's, `fsdp.rs`).
    fn alloc_on(
        &mut self,
        device: u32,
        unit: Option<usize>,
        component: Component,
        bytes: u64,
        stream: u8,
    ) -> Option<AllocId> {
        if bytes == 0 {
            return None;
        }
        let id = self.live.len();
        self.live.push(Some((device, component)));
        self.ops.push(Op::Alloc(Alloc { id, device, unit, component, bytes, stream }));
        Some(id)
    }

    /// Tensors live at once while `unit` runs, and a dequantization buffer beside them, all
    /// freed when it is done.
    fn transient_activations(&mut self, device: u32, unit: Option<usize>, tensors: &[u64], dequant: u64) {
        // Ids are handed out in sequence: those from `first` on are these allocations.
        let first = self.live.len();
        for bytes in tensors.iter().chain(std::iter::once(&dequant)) {
            self.alloc(device, unit, Component::Activations, *bytes);
        }
        (first..self.live.len()).for_each(|id| self.free(Some(id)));
    }

    fn free(&mut self, id: Option<AllocId>) {
        if let Some(id) = id
            && self.live.get_mut(id).and_then(Option::take).is_some()
        {
            self.ops.push(Op::Free(id));
        }
    }

    fn prompt(&self) -> u64 {
        self.workload.prompt.unwrap_or(self.workload.seq).min(self.workload.seq)
    }

    /// A vision-language step's `pixel_values`, on the GPU of the vision tower's first unit,
    /// held by the caller for the whole step (`model/vision.rs`).
    fn pixel_values(&mut self) -> Option<AllocId> {
        let model = self.r.model;
        let vision = model.facts.vision.as_ref()?;
        let bytes = crate::model::vision::pixel_values_bytes(
            model,
            self.workload.batch,
            self.workload.images.as_ref(),
        );
        let prefix = format!("{}.", vision.path);
        let unit = self.r.units.iter().position(|u| u.path.starts_with(&prefix) || u.path == vision.path)?;
        let device = self.r.devices[unit]?;
        self.alloc(device, Some(unit), Component::Activations, bytes)
    }

    /// Weights of every unit on a GPU (sharded under ZeRO-3), DDP's gradient buckets, and the
    /// cuBLAS workspaces.
    fn load(&mut self) {
        self.compute(None, None, Event::Load);
        for i in 0..self.r.units.len() {
            if let Some(fsdp) = self.r.fsdp {
                if i == 0 {
                    self.fsdp_wrap(fsdp);
                }
                continue;
            }
            for (j, home) in self.r.homes[i].iter().enumerate() {
                if let Some(device) = *home {
                    let bytes = self.held_tensor_bytes(self.r.units[i].weight_tensors[j]);
                    self.alloc(device, Some(i), Component::Weights, bytes);
                }
            }
        }
        // LitGPT's QLoRA: the script's `old_embedding` keeps the replaced embedding beside the
        // `StableEmbedding` it copies into (`model/litgpt.rs`).
        for i in 0..self.r.units.len() {
            if let (UnitKind::Embedding, Some(device)) = (self.r.units[i].kind, self.r.devices[i]) {
                let bytes = crate::model::litgpt::stable_embedding_gradient(
                    self.workload,
                    self.r.units[i].weight_bytes(),
                );
                self.alloc_held(device, Component::Weights, bytes);
            }
        }
        // torchtune 0.1 loads each NF4 weight through torchao 0.1's unchunked `to_nf4`, with the
        // rest of the model in place (`model/torchtune.rs`); the largest sets the peak.
        if crate::model::torchtune::quantizes_unchunked(self.workload) {
            let c = self.r.precision.compute_bytes();
            for i in 0..self.r.units.len() {
                if let Some(device) = self.r.devices[i] {
                    let numel = self.r.units[i].largest_quantized_linear;
                    let sizes = crate::model::torchtune::unchunked_quantization_transient(numel, c);
                    let made: Vec<_> =
                        sizes.iter().map(|&b| self.alloc(device, Some(i), Component::Weights, b)).collect();
                    made.into_iter().for_each(|t| self.free(t));
                }
            }
        }
        // `DistributedDataParallel(model)` wraps the model once its weights are on the GPU; the
        // workspaces come with the first matmul.
        for (device, bytes) in self.ddp_bucket_bytes() {
            self.alloc_held(device, Component::Gradients, bytes);
        }
        let mut used: Vec<u32> = self.r.devices.iter().flatten().copied().collect();
        used.sort_unstable();
        used.dedup();
        // Once per compute capability: `blas_workspaces` walks the whole module tree.
        let mut workspaces: Vec<(u32, Vec<u64>)> = Vec::new();
        for g in used {
            let major =
                self.r.hardware.devices.get(g as usize).map(|d| d.compute_capability.major).unwrap_or(8);
            if !workspaces.iter().any(|(m, _)| *m == major) {
                workspaces.push((major, blas_workspaces(self.r.model, major, self.workload.mode)));
            }
            let sizes =
                workspaces.iter().find(|(m, _)| *m == major).map(|(_, s)| s.clone()).unwrap_or_default();
            for bytes in sizes {
                self.alloc(g, None, Component::Workspace, bytes);
            }
        }
    }

    /// FSDP1's wrap, unit by unit in its order (`fsdp.rs`): the unit's parameters moved to the
    /// GPU whole with its quantization state, their broadcast from rank 0, the flat parameter
    /// made of them, then the rank's shard kept (none when offloaded) and the rest freed.
    fn fsdp_wrap(&mut self, fsdp: Fsdp1) {
        let r = self.r;
        for group in Fsdp1::wrap_order(&r.units) {
            let first = group[0];
            let Some(device) = r.homes[first].iter().flatten().next().copied() else { continue };
            for &i in &group {
                for bytes in fsdp.held_besides_frozen(&r.units[i]) {
                    self.alloc(device, Some(i), Component::Weights, bytes);
                }
            }
            let unit = Some(first);
            let unsharded: u64 = group.iter().map(|&i| Fsdp1::unsharded(&r.units[i])).sum();
            let moved = self.alloc(device, unit, Component::Weights, unsharded);
            let broadcast = self.alloc(device, unit, Component::Weights, Fsdp1::broadcast_bytes(unsharded));
            self.free(broadcast);
            let flat = self.alloc(device, unit, Component::Weights, unsharded);
            self.free(moved);
            if !fsdp.offload {
                self.alloc(device, unit, Component::Weights, unsharded.div_ceil(fsdp.shards));
            }
            self.free(flat);
        }
    }

    /// DDP's gradient buckets, per GPU: the bytes of the flat `gradients` tensor PyTorch's
    /// `Reducer` allocates for them when the model is wrapped. What sizes them
    /// (torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp):
    /// - `_build_params_for_reducer` takes the parameters with `requires_grad`, each shared one
    ///   once, so the buckets hold exactly the trainable parameters (LoRA: the adapters);
    /// - `_ddp_init_helper`, with the defaults (`find_unused_parameters=False`, no static
    ///   graph), calls `_compute_bucket_assignment_by_size` with the limit `sys.maxsize`: one
    ///   bucket per (dtype, device), all of them in it (`bucket_cap_mb=25` and the 1 MiB
    ///   `_DEFAULT_FIRST_BUCKET_BYTES` apply from `rebuild_buckets` on, before the second
    ///   forward, which frees these and allocates the same bytes again in 25 MiB pieces);
    /// - `Reducer::initialize_buckets` allocates each bucket as `at::empty({numel})` in the
    ///   parameters' dtype, the dtype of their gradients;
    /// - with `gradient_as_bucket_view=False` (the default) `mark_variable_ready_dense` copies
    ///   each gradient into its bucket view and `.grad` stays a tensor of its own: the buckets
    ///   are a second copy of the gradients, held from the wrap to the end of training, through
    ///   `zero_grad`.
    ///
    /// Every trainable tensor has one dtype here ([`units::trainable_dtype`]), so a GPU has one
    /// bucket. Nothing outside DDP training (inference has no `Reducer`).
    fn ddp_bucket_bytes(&self) -> Vec<(u32, u64)> {
        if self.workload.parallelism != Parallelism::Ddp || self.workload.mode != Mode::Train {
            return Vec::new();
        }
        let mut buckets: Vec<(u32, u64)> = Vec::new();
        for i in 0..self.r.units.len() {
            for (device, bytes) in self.grad_bytes(i) {
                match buckets.iter_mut().find(|(d, _)| *d == device) {
                    Some((_, total)) => *total += bytes,
                    None => buckets.push((device, bytes)),
                }
            }
        }
        buckets.retain(|(_, bytes)| *bytes > 0);
        buckets
    }

    /// Allocates `bytes` on `device` for no unit and for the whole run: no free of the step
    /// ends it (the step frees every live gradient at `zero_grad`; DDP's buckets stay).
    fn alloc_held(&mut self, device: u32, component: Component, bytes: u64) {
        self.alloc_held_on(device, component, bytes, 0);
    }

    /// [`Builder::alloc_held`] on CUDA stream `stream` (FSDP1's, `fsdp.rs`).
    fn alloc_held_on(&mut self, device: u32, component: Component, bytes: u64, stream: u8) {
        if bytes == 0 {
            return;
        }
        let id = self.live.len();
        // Not tracked as live, so that the step's frees by component pass it over.
        self.live.push(None);
        self.ops.push(Op::Alloc(Alloc { id, device, unit: None, component, bytes, stream }));
    }

    /// Bytes of one weight tensor this rank holds: all of it, its ZeRO-3 shard, or none when
    /// parameters are offloaded.
    fn held_tensor_bytes(&self, bytes: u64) -> u64 {
        match self.workload.parallelism {
            Parallelism::Zero { offload_params: true, .. } => 0,
            Parallelism::Zero { stage: 3, .. } => bytes.div_ceil(self.r.shards),
            _ => bytes,
        }
    }

    /// Optimizer states (and master weights) of trainable `tensors` once created: the bytes in
    /// PyTorch's allocator, and those a paged optimizer keeps in CUDA managed memory.
    fn optimizer_state_held(&self, tensors: &[units::TrainableTensor]) -> (u64, u64) {
        // FSDP's offloaded parameters are stepped on the host, where their states are made.
        if tensors.is_empty()
            || matches!(self.workload.parallelism, Parallelism::Zero { offload_optimizer: true, .. })
            || self.r.fsdp.is_some_and(|f| f.offload)
        {
            return (0, 0);
        }
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        let all = units::optimizer_state_bytes(self.workload, tensors, dtype);
        let paged = units::paged_state_bytes(self.workload.optimizer, tensors).min(all);
        ((all - paged).div_ceil(self.r.shards), paged.div_ceil(self.r.shards))
    }

    /// LitGPT's foreach AdamW step: one temporary the size of one state of every trainable
    /// tensor on each GPU (`model/litgpt.rs`), allocated and freed at the step.
    fn litgpt_step_transient(&mut self) {
        if !crate::model::litgpt::runs(self.workload) {
            return;
        }
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        let mut per_device: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for groups in &self.r.trainable_groups {
            for (device, tensors) in groups {
                *per_device.entry(*device).or_default() +=
                    dtype.bytes_for(tensors.iter().map(|t| t.numel).sum());
            }
        }
        for (device, bytes) in per_device {
            let transient =
                crate::model::litgpt::optimizer_step_transient(self.workload, bytes.div_ceil(self.r.shards));
            let t = self.alloc(device, None, Component::Optimizer, transient);
            self.free(t);
        }
    }

    /// Creates unit `unit`'s optimizer states (the optimizer's first step of it), each beside
    /// its parameter.
    fn create_optimizer_states(&mut self, unit: usize) {
        let r = self.r;
        for (device, tensors) in &r.trainable_groups[unit] {
            let (in_torch, paged) = self.optimizer_state_held(tensors);
            self.alloc(*device, Some(unit), Component::Optimizer, in_torch);
            if paged > 0 {
                *self.managed.entry(*device).or_default() += paged;
            }
        }
    }

    /// Hidden states of `tokens` tokens per sequence as they pass between units (fp32 residual
    /// stream under autocast).
    fn handoff_bytes(&self, tokens: u64) -> u64 {
        let residual = if self.r.precision.autocast { 4 } else { self.r.precision.compute_bytes() };
        residual * self.r.model.facts.hidden_size * self.workload.batch * tokens.max(1)
    }

    /// Per unit, the KV cache its block holds for the whole context (0 for other units).
    fn kv_cache_bytes(&self) -> Vec<u64> {
        let w = self.workload;
        let kv_dtype = w.kv_dtype.unwrap_or(self.r.precision.compute);
        let f = &self.r.model.facts;
        if f.model_type == "xlnet" {
            // XLNet keeps each layer's input as its `mems` (`model/xlnet.rs`), not keys and values.
            let mems = crate::model::xlnet::mems_per_token(self.r.model, &self.r.precision);
            let per_layer = mems.saturating_mul(w.seq).saturating_mul(w.batch);
            let block = |u: &Unit| matches!(u.kind, UnitKind::Block(_));
            return self.r.units.iter().map(|u| if block(u) { per_layer } else { 0 }).collect();
        }
        let per_token_layer = match &f.attention {
            AttentionKind::MultiLatent { qk_nope_head_dim, qk_rope_head_dim, v_head_dim, .. } => {
                // transformers caches the decompressed keys and values of every head.
                f.num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)
            }
            AttentionKind::Standard => 2 * f.num_kv_heads * f.head_dim,
        };
        self.r
            .units
            .iter()
            .map(|u| match u.kind {
                // Encoder blocks (BERT, T5's encoder) attend once and cache nothing.
                UnitKind::Block(layer)
                    if f.layers.get(layer).is_some_and(|l| l.stack == StackKind::Decoder) =>
                {
                    // A windowed (sliding or chunked) layer caches its last `window` tokens; but
                    // after a prompt longer than that, transformers' `DynamicSlidingWindowLayer`
                    // keeps them as a view of the prompt's concatenated keys and values
                    // (`full_key_states[:, :, -self.sliding_window + 1 :, :]`, cache_utils.py),
                    // which holds the whole prompt's storage until the next token replaces it.
                    let window = f.layers.get(layer).and_then(|l| l.attention_window).unwrap_or(u64::MAX);
                    let held = w.seq.min(window.max(self.prompt()));
                    let kv = kv_dtype.bytes_for(per_token_layer * held * w.batch);
                    // A state-space mixer's fixed state per sequence (`model/ssm.rs`).
                    let ssm = f.layers[layer].ssm.as_ref().map_or(0, |ssm| {
                        crate::model::ssm::state_bytes(ssm, w.batch, self.r.precision.compute_bytes())
                    });
                    kv + ssm
                }
                _ => 0,
            })
            .collect()
    }

    /// Unit `unit`'s activations for one training step: a block's from the activation model, a
    /// norm's outside the blocks, and a custom model's declared sizes (`model/declared.rs`),
    /// including those of a container above the unit that holds no unit of its own, charged to
    /// the first unit under it.
    fn activations_of(&self, unit: usize) -> BlockActivations {
        let w = self.workload;
        let mut acts = match self.r.units[unit].kind {
            UnitKind::Block(layer) => self.r.blocks.block(layer, w.batch, w.seq),
            UnitKind::Other | UnitKind::Embedding => self.norm_unit_activations(unit),
            UnitKind::Head => self
                .declared_outside_blocks(unit)
                .map_or_else(BlockActivations::default, |d| d.or_formula(BlockActivations::default)),
        };
        if let Some(above) = &self.r.declared[unit].1 {
            let (Declared::Whole(above) | Declared::Inside(above)) =
                above.at(self.r.model, w, &self.r.precision, w.batch, w.seq);
            acts.saved.extend(above.saved);
            acts.working_set.extend(above.working_set);
        }
        acts
    }

    /// A unit outside the blocks: what a custom model declares for it (`model/declared.rs`), in
    /// place of or added to the rest; otherwise a norm outside the blocks (final norm, embedding
    /// LayerNorm) keeps its input and output.
    fn norm_unit_activations(&self, unit: usize) -> BlockActivations {
        let w = self.workload;
        let norm = || {
            if w.mode != Mode::Train || !self.r.holds_norm[unit] {
                return BlockActivations::default();
            }
            let tokens = w.batch * w.seq;
            let h = self.r.model.facts.hidden_size;
            let c = self.r.precision.compute_bytes();
            let saved = if self.r.model.facts.norm == NormKind::RmsNorm {
                vec![4 * h * tokens, self.r.precision.upcast_bytes() * h * tokens, c * h * tokens]
            } else {
                vec![self.r.precision.upcast_bytes() * h * tokens, c * h * tokens]
            };
            BlockActivations {
                saved,
                forward_transient: 0,
                working_set: Vec::new(),
                backward_transient: 0,
                input: 0,
            }
        };
        match self.declared_outside_blocks(unit) {
            Some(declared) => declared.or_formula(norm),
            None => norm(),
        }
    }

    /// What a custom model declares for unit `unit` outside the blocks (`model/declared.rs`).
    fn declared_outside_blocks(&self, unit: usize) -> Option<Declared> {
        let w = self.workload;
        let declarations = self.r.declared[unit].0.as_ref()?;
        Some(declarations.at(self.r.model, w, &self.r.precision, w.batch, w.seq))
    }

    /// When unit `to` runs on another GPU than unit `from`, the hidden states (forward) or their
    /// gradient (backward) cross over: both GPUs hold a copy while the transfer is in flight.
    fn cross_boundary(&mut self, to: usize, from: Option<usize>, event: Event) {
        let (Some(from), Some(dst)) = (from, self.r.devices[to]) else { return };
        let Some(src) = self.r.devices[from] else { return };
        if src != dst {
            self.hand_over(to, src, dst, event);
        }
    }

    /// Unit `unit`'s hidden states (or their gradient) in flight from GPU `src` to GPU `dst`:
    /// both hold a copy while the transfer runs.
    fn hand_over(&mut self, unit: usize, src: u32, dst: u32, event: Event) {
        let bytes = self.handoff_bytes(self.workload.seq);
        self.compute(Some(unit), Some(src), event);
        self.compute(Some(unit), Some(dst), event);
        let sent = self.alloc(src, Some(unit), Component::Activations, bytes);
        let received = self.alloc(dst, Some(unit), Component::Activations, bytes);
        self.free(received);
        self.free(sent);
    }

    /// Allocates the `gathered` weights of unit `unit`'s forward or `backward`: under FSDP1 on
    /// its unshard stream, after the host-to-device copy of the shard when offloaded, freed once
    /// gathered (`fsdp.rs`).
    fn gather(&mut self, device: u32, unit: usize, gathered: u64, backward: bool) -> Option<AllocId> {
        let Some(fsdp) = self.r.fsdp else {
            return self.alloc(device, Some(unit), Component::Weights, gathered);
        };
        let copy_bytes = fsdp.shard_copy(Fsdp1::gathered_layer(&self.r.units, unit, backward));
        let copy =
            self.alloc_on(device, Some(unit), Component::Weights, copy_bytes, fsdp::PRE_UNSHARD_STREAM);
        let gather = self.alloc_on(device, Some(unit), Component::Weights, gathered, fsdp::UNSHARD_STREAM);
        self.free(copy);
        gather
    }

    /// ZeRO-3: bytes all-gathered on each rank around unit `unit`'s compute — the parts of its
    /// weights other ranks hold (all of them when parameters are offloaded), and the next unit's
    /// too, which DeepSpeed prefetches while this one runs.
    fn gathered_weights(&self, unit: usize) -> u64 {
        if self.r.fsdp.is_some() {
            return Fsdp1::gathered(&self.r.units, unit, false);
        }
        let Parallelism::Zero { stage: 3, offload_params, .. } = self.workload.parallelism else { return 0 };
        let missing = |u: &Unit| {
            let full = u.weight_bytes();
            if offload_params { full } else { full - full.div_ceil(self.r.shards) }
        };
        let next = self.r.units.get(unit + 1).map(missing).unwrap_or(0);
        missing(&self.r.units[unit]) + next
    }

    /// A full fine-tune of a model whose head shares its weight with a unit before it (tied
    /// input and output embeddings): that unit, and the bytes of one gradient of the shared
    /// weight. The head's backward makes one gradient of it, which autograd holds in the shared
    /// weight's input buffer until the embedding's backward makes the other; the two are then
    /// summed out of place (the head's is a transposed view, which `InputBuffer::accumulate`
    /// does not add into in place) and the sum becomes `.grad`.
    fn tied_head_gradient(&self) -> Option<(usize, u64)> {
        // LitGPT's head is a parameter of its own (`model/litgpt.rs`).
        if self.workload.mode != Mode::Train
            || !matches!(self.workload.finetune, Finetune::Full)
            || crate::model::litgpt::runs(self.workload)
        {
            return None;
        }
        let head = self.r.units.iter().position(|u| u.kind == UnitKind::Head)?;
        let module = self.r.model.root.find(&self.r.units[head].path)?;
        let mut tied = None;
        module.visit(&mut |m| {
            for t in &m.tensors {
                if let (None, Some(target)) = (&tied, &t.tied_to) {
                    tied = Some((target.clone(), t.numel()));
                }
            }
        });
        let (target, numel) = tied?;
        let owner = self.r.units.iter().position(|u| covers(&u.keys[0], &target))?;
        // An embedding off the GPUs runs no backward there: nothing to hold for it.
        self.r.devices[owner]?;
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        (owner != head).then(|| (owner, dtype.bytes_for(numel)))
    }

    /// Bytes of unit `unit`'s gradients on each GPU that holds trainable tensors of it.
    fn grad_bytes(&self, unit: usize) -> Vec<(u32, u64)> {
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        self.r.trainable_groups[unit]
            .iter()
            .map(|(device, tensors)| (*device, dtype.bytes_for(tensors.iter().map(|t| t.numel).sum())))
            .collect()
    }

    /// A unit a map splits over several GPUs runs each part on its own GPU, the hidden states
    /// handed across at each part (accelerate's hooks move a module's inputs to its device): the
    /// GPU that runs the unit and each other one it spans hold a copy while it is in flight.
    fn cross_within(&mut self, unit: usize, device: u32, event: Event) {
        let r = self.r;
        for &other in &r.spans[unit] {
            self.hand_over(unit, device, other, event);
        }
    }

    /// Bytes of the dequantized weight a 4-bit linear materialises for its matmul, in the
    /// compute dtype (`bnb_4bit_compute_dtype`, float32 unless set).
    fn dequant_transient(&self, unit: usize) -> u64 {
        match self.workload.quant {
            Quant::Nf4 { .. } if self.workload.trainer == Trainer::Torchtune => {
                // torchao's `NF4Tensor.get_original_weight` (`model/torchtune.rs`).
                let c = self.r.precision.compute_bytes();
                let (numel, compiled) =
                    (self.r.units[unit].largest_quantized_linear, self.workload.switches.compile);
                crate::model::torchtune::dequant_working_set(numel, c, compiled)
            }
            Quant::Nf4 { .. } | Quant::Fp4 { .. } => {
                let bytes = if self.workload.trainer.dequantizes_in_model_dtype() {
                    self.r.precision.compute_bytes()
                } else {
                    self.workload.autocast.map(|d| d.bits() / 8).unwrap_or(4)
                };
                self.r.units[unit].largest_quantized_linear * bytes
            }
            _ => 0,
        }
    }

    fn train_step(&mut self, step: u8) {
        let w = self.workload;
        let first = step == 1;
        let pixel_values = self.pixel_values();
        let checkpoint = w.grad_checkpointing == GradCheckpointing::Full;
        let offload = w.switches.activation_offload;
        // What each unit keeps from its forward to its backward: unit `i`'s are
        // `kept[kept_by_unit[i]]`.
        let mut kept: Vec<Option<AllocId>> = Vec::new();
        let mut kept_by_unit: Vec<std::ops::Range<usize>> = Vec::with_capacity(self.r.units.len());
        let last_block =
            (0..self.r.units.len()).rev().find(|&k| matches!(self.r.units[k].kind, UnitKind::Block(_)));
        let first_block =
            (0..self.r.units.len()).find(|&k| matches!(self.r.units[k].kind, UnitKind::Block(_)));
        // FSDP1: the root's unsharded parameter, held from the first forward on (`fsdp.rs`).
        let fsdp_device = self.r.devices.iter().flatten().next().copied();
        if let (Some(fsdp), Some(device), true) = (self.r.fsdp, fsdp_device, first) {
            let root = Fsdp1::root(&self.r.units);
            let copy_bytes = fsdp.shard_copy(root);
            let copy = self.alloc_on(device, None, Component::Weights, copy_bytes, fsdp::PRE_UNSHARD_STREAM);
            self.alloc_held_on(device, Component::Weights, root, fsdp::UNSHARD_STREAM);
            self.free(copy);
        }
        // Forward.
        for i in 0..self.r.units.len() {
            // The hidden states come from the last unit before this one on their path.
            let from = (0..i).rev().find(|&k| !self.r.units[k].side).filter(|_| !self.r.units[i].side);
            self.cross_boundary(i, from, Event::ActivationsTo(i, step));
            let Some(device) = self.r.devices[i] else {
                kept_by_unit.push(kept.len()..kept.len());
                continue;
            };
            // Taken for the unit's forward (the allocations below borrow the builder), and put
            // back for its backward.
            let acts = std::mem::take(&mut self.activations[i]);
            let is_block = matches!(self.r.units[i].kind, UnitKind::Block(_));
            let autocast = 2 * self.r.units[i].autocast_params;
            let mut dequant = self.dequant_transient(i);
            if w.trainer == Trainer::Unsloth && dequant > 0 {
                // Unsloth's LoRA kernels dequantize in the forward into one scratch buffer per
                // GPU, grown to the largest weight and kept (`_scratch("weight", …)`,
                // unsloth/kernels/utils.py): held, not a transient.
                if !self.weight_scratch.contains(&device) {
                    self.weight_scratch.push(device);
                    let on_device = (0..self.r.units.len()).filter(|&k| self.r.devices[k] == Some(device));
                    let largest = on_device.map(|k| self.dequant_transient(k)).max().unwrap_or(0);
                    self.alloc_held(device, Component::Weights, largest);
                }
                dequant = 0;
            }
            let gathered = self.gathered_weights(i);
            let unit = Some(i);
            self.cross_within(i, device, Event::ActivationsTo(i, step));
            self.compute(unit, Some(device), Event::Forward(i, step));
            let gather = self.gather(device, i, gathered, false);
            let first_kept = kept.len();
            // `UnslothCheckpointFunction` offloads a layer's input over `MINIMUM_SIZE` (2 MiB),
            // and from the second step not the last layer's (`CURRENT_GC_INDEX ==
            // LAST_GC_INDEX`), whose backward comes first.
            let unsloth_offloads = w.trainer == Trainer::Unsloth
                && acts.input > crate::model::unsloth::OFFLOAD_MINIMUM_BYTES
                && (first || Some(i) != last_block);
            if is_block && checkpoint {
                if unsloth_offloads {
                    // `UnslothCheckpointFunction` copies each layer's input to pinned CPU
                    // memory; two GPU buffers of that size, made once and kept, take it back
                    // in backward (unsloth_zoo/gradient_checkpointing.py, `GPU_BUFFERS`, and
                    // `GPU_BUFFERS_B` from the second step with 512 MiB free).
                    if !self.offload_buffers.contains(&device) {
                        self.offload_buffers.push(device);
                        self.alloc_held(device, Component::Activations, 2 * acts.input);
                    }
                    if Some(i) == first_block {
                        // Reentrant checkpointing makes the frozen embedding's output a leaf that
                        // requires grad (`enable_input_require_grads`, unsloth_zoo
                        // `prepare_model_for_training`): the first layer's node holds it to its
                        // backward, where its gradient takes its place.
                        kept.push(self.alloc(device, unit, Component::Activations, acts.input));
                    }
                } else {
                    kept.push(self.alloc(device, unit, Component::Activations, acts.input));
                }
                // Nothing is kept for backward inside a checkpointed layer: each intermediate is
                // freed once its consumer has run, so only the layer's working set is live. It
                // is one allocation here, as the recompute in backward is: the segments the
                // forward leaves cached are the ones the recompute takes again.
                let working_set = acts.working_set.iter().fold(0u64, |a, b| a.saturating_add(*b));
                self.transient_activations(device, unit, &[working_set], dequant);
            } else {
                for bytes in &acts.saved {
                    kept.push(self.alloc(device, unit, Component::Activations, *bytes));
                }
                kept.push(self.alloc(device, unit, Component::Weights, autocast));
                let t = self.alloc(device, unit, Component::Activations, acts.forward_transient + dequant);
                self.free(t);
            }
            self.free(gather);
            if offload {
                // Saved tensors move to pinned CPU memory once the unit's forward is done.
                kept.drain(first_kept..).for_each(|id| self.free(id));
            }
            kept_by_unit.push(first_kept..kept.len());
            self.activations[i] = acts;
        }
        // FSDP1: the last layer's unsharded parameter, which the loss's backward prefetches
        // (`fsdp.rs`).
        let mut fsdp_prefetch = None;
        if let (Some(_), Some(device)) = (self.r.fsdp, fsdp_device) {
            let bytes = Fsdp1::prefetched_at_loss(&self.r.units);
            fsdp_prefetch = self.alloc_on(device, None, Component::Weights, bytes, fsdp::UNSHARD_STREAM);
        }
        // Loss, on the head's device, as part of the head's run: a task head's (`model/head.rs`)
        // on the last unit, which runs last and backward first; vocabulary logits otherwise.
        let task = crate::model::head::task_head(self.r.model, w, &self.r.precision);
        let head = match &task {
            Some(_) => (0..self.r.units.len()).rev().find(|&i| self.r.devices[i].is_some()),
            None => self.r.units.iter().position(|u| u.kind == UnitKind::Head),
        };
        let mut logits_ids = Vec::new();
        if let (Some(task), Some(h)) = (&task, head)
            && let Some(device) = self.r.devices[h]
        {
            let unit = Some(h);
            self.compute(unit, Some(device), Event::Loss(step));
            for bytes in &task.kept {
                logits_ids.push(self.alloc(device, unit, Component::Logits, *bytes));
            }
            self.compute(unit, Some(device), Event::LossBackward(step));
            let transient = self.alloc(device, unit, Component::Logits, task.loss_transient);
            self.free(transient);
        } else if let Some(h) = head
            && let Some(device) = self.r.devices[h]
        {
            self.vocabulary_loss(h, device, step, &mut logits_ids);
        }
        // Backward.
        let zero2 = matches!(w.parallelism, Parallelism::Zero { stage: 2.., .. });
        let tied = self.tied_head_gradient();
        let mut tied_part = None;
        for i in (0..self.r.units.len()).rev() {
            let from = (i + 1..self.r.units.len())
                .find(|&k| !self.r.units[k].side)
                .filter(|_| !self.r.units[i].side);
            self.cross_boundary(i, from, Event::GradientsTo(i, step));
            let Some(device) = self.r.devices[i] else { continue };
            let acts = &self.activations[i];
            let (saved, backward_transient) = (acts.saved.iter().sum(), acts.backward_transient);
            let is_block = matches!(self.r.units[i].kind, UnitKind::Block(_));
            // Gradients zeroed in place stay allocated from the first backward on.
            let keep = w.switches.keep_gradients && !first;
            let grads: Vec<(u32, u64)> =
                self.grad_bytes(i).into_iter().map(|(d, b)| (d, if keep { 0 } else { b })).collect();
            let grads_new: u64 = grads.iter().map(|(_, b)| b).sum();
            let gathered = match self.r.fsdp {
                Some(_) => Fsdp1::gathered(&self.r.units, i, true),
                None => self.gathered_weights(i),
            };
            if is_block {
                // The prefetched layer is this one: counted in `gathered` from here on.
                self.free(fsdp_prefetch.take());
            }
            let unit = Some(i);
            self.cross_within(i, device, Event::GradientsTo(i, step));
            self.compute(unit, Some(device), Event::Backward(i, step));
            let gather = self.gather(device, i, gathered, true);
            let mut recomputed = None;
            if (is_block && checkpoint) || offload {
                // Recomputed (or reloaded) together and freed together: one block.
                recomputed = self.alloc(device, unit, Component::Activations, saved);
            }
            let mut contribution = None;
            let mut sum = None;
            match tied {
                Some((owner, bytes)) if Some(i) == head => {
                    let shared = self.r.devices[owner].unwrap_or(device);
                    tied_part = self.alloc(shared, unit, Component::Gradients, bytes);
                }
                Some((owner, bytes)) if owner == i && tied_part.is_some() => {
                    // This unit's gradient of the shared weight, then the sum, which is the
                    // `.grad` below unless gradients are kept (then it is added in place).
                    contribution = self.alloc(device, unit, Component::Gradients, bytes);
                    if grads_new < bytes {
                        sum = self.alloc(device, unit, Component::Gradients, bytes);
                    }
                }
                _ => {}
            }
            let grad: Vec<(u32, Option<AllocId>)> = grads
                .iter()
                .map(|&(d, bytes)| (d, self.alloc(d, unit, Component::Gradients, bytes)))
                .collect();
            if self.r.units[i].kind == UnitKind::Embedding {
                // LitGPT's QLoRA `StableEmbedding`: its gradient, never stepped nor zeroed, is
                // held from the first backward; later ones add a new one into it in place.
                let bytes =
                    crate::model::litgpt::stable_embedding_gradient(w, self.r.units[i].weight_bytes());
                if first {
                    self.alloc_held(device, Component::Gradients, bytes);
                } else {
                    let added = self.alloc(device, unit, Component::Gradients, bytes);
                    self.free(added);
                }
            }
            // The weight dequantized again (`Trainer::dequantizes_again_in_backward`); under
            // LitGPT the head's is the largest.
            let again = w.trainer.dequantizes_again_in_backward();
            let dequant = if again { self.dequant_transient(i) } else { 0 };
            let t = self.alloc(device, unit, Component::Activations, backward_transient + dequant);
            self.free(t);
            if contribution.is_some() {
                self.free(sum);
                self.free(contribution);
                self.free(tied_part.take());
            }
            self.free(recomputed);
            kept_by_unit[i].clone().for_each(|k| self.free(kept[k]));
            self.free(gather);
            if Some(i) == head {
                logits_ids.drain(..).for_each(|id| self.free(id));
            }
            if w.switches.optimizer_in_backward {
                // torchtune's `register_optim_in_bwd_hooks`: a per-parameter optimizer steps in
                // the gradient's post-accumulate hook, creating its states on its first step,
                // and sets `.grad = None`.
                if first {
                    self.create_optimizer_states(i);
                }
                grad.into_iter().for_each(|(_, id)| self.free(id));
            } else if zero2 {
                // Reduce-scatter keeps this rank's shard of the gradients (FSDP's offload copies
                // it to the host's `_cpu_grad`).
                let host = self.r.fsdp.is_some_and(|f| f.offload);
                for ((d, id), (_, bytes)) in grad.into_iter().zip(&grads) {
                    self.free(id);
                    if !host {
                        let shard = bytes.div_ceil(self.r.shards);
                        let stream = if self.r.fsdp.is_some() { fsdp::POST_BACKWARD_STREAM } else { 0 };
                        self.alloc_on(d, unit, Component::Gradients, shard, stream);
                    }
                }
            }
        }
        // Optimizer step: the first creates the states (and master weights) it keeps; in
        // backward, each unit's were created by its own first step there.
        self.compute(None, None, Event::OptimizerStep(step));
        if first && !w.switches.optimizer_in_backward {
            for i in 0..self.r.units.len() {
                if self.r.devices[i].is_some() {
                    self.create_optimizer_states(i);
                }
            }
        }
        self.litgpt_step_transient();
        if !w.switches.keep_gradients {
            // zero_grad(set_to_none=True): gradients are freed between steps.
            let grads: Vec<AllocId> = (0..self.live.len())
                .filter(|id| matches!(self.live[*id], Some((_, Component::Gradients))))
                .collect();
            grads.into_iter().for_each(|id| self.free(Some(id)));
        }
        // The Trainer's loop holds the batch until the next one replaces it.
        self.free(pixel_values);
    }

    /// AutoAWQ's `LlamaFuser.fuse_transformer`, layer by layer (`model/awq_fused.rs`): the fused
    /// qkv's zero-filled buffers each replaced by the `torch.cat` of q's, k's and v's, the
    /// `WindowedCache` (V, then K: fp32 on the GPU, then its fp16 copy) and the rotary table;
    /// the unfused q, k and v are freed with the unfused model after the last layer.
    fn awq_fuse(&mut self, max_seq_len: u64) {
        let f = &self.r.model.facts;
        let (batch, kv_heads, head_dim) = (self.workload.batch, f.num_kv_heads, f.head_dim);
        let cache = crate::model::awq_fused::cache_tensor_bytes(batch, max_seq_len, kv_heads, head_dim);
        let rope = crate::model::awq_fused::rope_bytes(max_seq_len, head_dim);
        self.compute(None, None, Event::Load);
        let mut unfused: Vec<Option<AllocId>> = Vec::new();
        for i in 0..self.r.units.len() {
            let (UnitKind::Block(_), Some(device)) = (self.r.units[i].kind, self.r.devices[i]) else {
                continue;
            };
            let unit = Some(i);
            // The fused tensors: each the bytes of q's, k's and v's (a quantized `weight` holds
            // AWQ's qweight, qzeros and scales together).
            let fused: Vec<u64> = ["weight", "bias"]
                .iter()
                .map(|suffix| {
                    let u = &self.r.units[i];
                    u.placed_by
                        .iter()
                        .zip(&u.weight_tensors)
                        .filter(|(name, _)| {
                            ["q_proj", "k_proj", "v_proj"]
                                .iter()
                                .any(|p| name.ends_with(&format!(".self_attn.{p}.{suffix}")))
                        })
                        .map(|(_, b)| *b)
                        .sum()
                })
                .collect();
            let zeros: Vec<Option<AllocId>> =
                fused.iter().map(|&b| self.alloc(device, unit, Component::Weights, b)).collect();
            for (&bytes, zero) in fused.iter().zip(zeros) {
                // The cat replaces the zero-filled buffer. It has the bytes of the load's q, k
                // and v, which stand for it from here on: the cat stands for the unfused copies
                // the fuse frees at its end.
                unfused.push(self.alloc(device, unit, Component::Weights, bytes));
                self.free(zero);
            }
            // 0.1.6's `WindowedCache` is `torch.zeros(..).to(device).half()`: fp32 on the GPU
            // first. From 0.2.7.post3 (`--attn flash`) it is made in fp16 directly
            // (`torch.zeros(size, device=device, dtype=torch.float16)`, awq/modules/fused/cache.py).
            let made_in_fp32 = crate::model::awq_fused::attention(self.workload)
                != Some(crate::workload::AttentionImpl::Flash);
            for _ in 0..2 {
                let fp32 = made_in_fp32.then(|| self.alloc(device, unit, Component::KvCache, 2 * cache));
                self.alloc(device, unit, Component::KvCache, cache);
                self.free(fp32.flatten());
            }
            self.alloc(device, unit, Component::Weights, rope);
        }
        unfused.into_iter().for_each(|id| self.free(id));
    }

    /// The KV cache for the whole context, on the GPU of each unit that keeps one.
    fn alloc_kv_cache(&mut self) {
        for (i, bytes) in self.kv_cache_bytes().into_iter().enumerate() {
            if let Some(device) = self.r.devices[i] {
                self.alloc(device, Some(i), Component::KvCache, bytes);
            }
        }
    }

    /// Inference: the KV cache for the whole context, then prefill one unit at a time.
    fn inference(&mut self) {
        let w = self.workload;
        let prompt = self.prompt();
        let pixel_values = self.pixel_values();
        // transformers' cache starts empty and grows as each language layer runs; a vision
        // tower runs before any of them, so a vision-language model's cache is made after it
        // (docs/memory-model.md, "Vision-language models"). Others make it up front.
        let model = self.r.model;
        let mut kv_pending = model.facts.vision.is_some();
        if let Some(max_seq_len) = w.awq_fused {
            // AutoAWQ's fuse makes its own cache at load, for the batch (`model/awq_fused.rs`).
            self.awq_fuse(max_seq_len);
        } else if !kv_pending {
            self.alloc_kv_cache();
        }
        let vocab = self.r.model.facts.vocab_size;
        let c = self.r.precision.compute_bytes();
        let follows = self.r.blocks.runs_transformers_forward();
        // What the model's own forward holds across its layers, made at the embedding.
        let mut model_held: Vec<Option<AllocId>> = Vec::new();
        // The GPU of the input embeddings, while they are the hidden states the loop names.
        let mut embeddings_on: Option<u32> = None;
        let mut autocast_cache: Vec<Option<AllocId>> = Vec::new();
        for i in 0..self.r.units.len() {
            let Some(device) = self.r.devices[i] else { continue };
            let kind = self.r.units[i].kind;
            let unit = Some(i);
            let event = if kind == UnitKind::Head { Event::LastLogits } else { Event::Prefill(i) };
            let language = match kind {
                UnitKind::Block(layer) => model.facts.layers[layer].stack != StackKind::Vision,
                _ => kind == UnitKind::Head,
            };
            if kv_pending && language {
                kv_pending = false;
                self.alloc_kv_cache();
            }
            if kind == UnitKind::Head {
                // The inner model's forward has returned: its locals are freed.
                std::mem::take(&mut model_held).into_iter().for_each(|id| self.free(id));
            }
            self.compute(unit, Some(device), event);
            // Autocast's cache keeps each weight's half copy (a leaf that requires grad, even
            // under no_grad) until the autocast region ends, after the forward
            // (`at::autocast::cached_cast`, cleared on leaving the outermost region).
            let autocast_copies = c * self.r.units[i].autocast_params;
            autocast_cache.push(self.alloc(device, unit, Component::Weights, autocast_copies));
            if kind == UnitKind::Embedding && follows && model_held.is_empty() {
                let held = self.r.blocks.prefill_held(w.batch, prompt);
                model_held =
                    held.into_iter().map(|b| self.alloc(device, unit, Component::Activations, b)).collect();
                embeddings_on = Some(device);
            }
            // A layer's input is the hidden states the model's loop hands it: the previous
            // layer's output, or accelerate's copy of it on this GPU; the first layer's, the
            // input embeddings held above when on their GPU. Charged to the layer it feeds,
            // live while it runs: the previous layer's output outlives that layer only while
            // nothing else runs.
            let acts = match kind {
                UnitKind::Block(layer) => Some(self.r.blocks.block(layer, w.batch, prompt)),
                _ => None,
            };
            let first_block_with_embeddings = acts.is_some() && embeddings_on.take() == Some(device);
            let input = match &acts {
                Some(acts) if follows && !first_block_with_embeddings => {
                    self.alloc(device, unit, Component::Activations, acts.input)
                }
                _ => None,
            };
            // accelerate's pre-forward hook loads a unit's offloaded weights to the main GPU.
            let r = self.r;
            let main = r.main_gpu.unwrap_or(device);
            let copies: Vec<Option<AllocId>> = r.streamed[i]
                .iter()
                .map(|&j| {
                    let bytes = self.held_tensor_bytes(r.units[i].weight_tensors[j]);
                    self.alloc(main, unit, Component::Weights, bytes)
                })
                .collect();
            match kind {
                UnitKind::Block(_) => {
                    let working_set = acts.map(|a| a.working_set).unwrap_or_default();
                    self.transient_activations(device, unit, &working_set, self.dequant_transient(i));
                }
                UnitKind::Head => {
                    let half = self.alloc(device, unit, Component::Logits, c * vocab * w.batch);
                    let upcast = self.alloc(device, unit, Component::Logits, 4 * vocab * w.batch);
                    self.free(upcast);
                    self.free(half);
                }
                UnitKind::Embedding | UnitKind::Other => {}
            }
            // The post-forward hook drops the streamed weights; the loop's reassignment frees
            // the input.
            copies.into_iter().for_each(|id| self.free(id));
            self.free(input);
        }
        autocast_cache.into_iter().for_each(|id| self.free(id));
        self.free(pixel_values);
    }
}
