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

mod inference;
mod loss;
mod ops;
mod train_step;
mod workspaces;

use ops::describe;
pub use ops::{
    Alloc, AllocId, Component, Compute, Event, Op, ProgramUnit, Step, StepProgram, UnitIndex, UnitRole,
};
pub use workspaces::{BlasWorkspaces, CUBLASLT_WORKSPACE, blas_workspaces, cublas_workspace};

use crate::fsdp::{self, Fsdp1};
use crate::model::activations::{ActivationModel, BlockActivations};
use crate::model::declared::{self, Declarations, Declared};
use crate::model::precision::Precision;
use crate::model::units::{self, Unit, UnitKind};
use crate::placement::{Placement, Target, TensorPlacement};
use crate::workload::{Mode, Parallelism, Quant, Trainer, Workload};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, ModuleKind, NormKind};

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
        let workspaces = BlasWorkspaces::of(self.r.model, self.workload);
        for g in used {
            let major =
                self.r.hardware.devices.get(g as usize).map(|d| d.compute_capability.major).unwrap_or(8);
            for bytes in workspaces.on(major) {
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

    /// Hidden states of `tokens` tokens per sequence as they pass between units (fp32 residual
    /// stream under autocast).
    fn handoff_bytes(&self, tokens: u64) -> u64 {
        let residual = if self.r.precision.autocast { 4 } else { self.r.precision.compute_bytes() };
        residual * self.r.model.facts.hidden_size * self.workload.batch * tokens.max(1)
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
}
