//! The step timeline: the allocations and frees of loading and of training or inference steps,
//! unit by unit, replayed per device through the caching-allocator model. It records each
//! device's peak of live tensors (`max_memory_allocated`) with the event where it happens and
//! the bytes by component at that moment, and the allocator's peak reserve.
//!
//! Training runs two steps: the first creates the optimizer states lazily at its optimizer
//! step (as torch optimizers do), the second runs with them — the steady state.

use crate::allocator::CachingAllocator;
use crate::estimate::Components;
use crate::model::activations::{ActivationModel, BlockActivations};
use crate::model::precision::Precision;
use crate::model::units::{self, Unit, UnitKind};
use crate::placement::{Placement, Target};
use crate::workload::{Finetune, GradCheckpointing, Mode, Parallelism, Quant, Trainer, Workload};
use std::collections::BTreeMap;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, NormKind};

/// Which component an allocation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Weights,
    Gradients,
    Optimizer,
    Activations,
    KvCache,
    Logits,
    /// Library workspaces allocated through PyTorch (cuBLAS).
    Workspace,
}

/// A moment of the step program, formatted only for the peak it is reported at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Load,
    Forward { unit: usize, step: u8 },
    Loss { step: u8 },
    LossBackward { step: u8 },
    Backward { unit: usize, step: u8 },
    OptimizerStep { step: u8 },
    ActivationsTo { unit: usize, step: u8 },
    GradientsTo { unit: usize, step: u8 },
    Prefill { unit: usize },
    LastLogits,
}

impl Event {
    fn describe(self, units: &[Unit]) -> String {
        let path = |unit: usize| units.get(unit).map(|u| u.path.as_str()).unwrap_or("?");
        match self {
            Event::Load => "load".into(),
            Event::Forward { unit, step } => format!("forward of {} (step {step})", path(unit)),
            Event::Loss { step } => format!("loss (step {step})"),
            Event::LossBackward { step } => format!("backward of the loss (step {step})"),
            Event::Backward { unit, step } => format!("backward of {} (step {step})", path(unit)),
            Event::OptimizerStep { step } => format!("optimizer step (step {step})"),
            Event::ActivationsTo { unit, step } => format!("activations to {} (step {step})", path(unit)),
            Event::GradientsTo { unit, step } => format!("gradients to {} (step {step})", path(unit)),
            Event::Prefill { unit } => format!("prefill of {}", path(unit)),
            Event::LastLogits => "logits of the last prompt token".into(),
        }
    }
}

/// One device's replay.
#[derive(Debug)]
struct Track {
    allocator: CachingAllocator,
    next_id: u64,
    /// Live allocations by id (sequential): their part and charged bytes.
    live: Vec<Option<(Part, u64)>>,
    by_part: [u64; 7],
    event: Event,
    peak_allocated: u64,
    peak_reserved: u64,
    peak_at: Event,
    peak_parts: [u64; 7],
}

impl Track {
    fn new() -> Track {
        Track {
            allocator: CachingAllocator::default(),
            next_id: 0,
            live: Vec::new(),
            by_part: [0; 7],
            event: Event::Load,
            peak_allocated: 0,
            peak_reserved: 0,
            peak_at: Event::Load,
            peak_parts: [0; 7],
        }
    }

    fn alloc(&mut self, part: Part, bytes: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        if bytes == 0 {
            return id;
        }
        let charged = self.allocator.alloc(id, bytes);
        self.live.resize(id as usize + 1, None);
        self.live[id as usize] = Some((part, charged));
        self.by_part[part as usize] += charged;
        self.observe();
        id
    }

    fn free(&mut self, id: u64) {
        if let Some((part, charged)) = self.live.get_mut(id as usize).and_then(Option::take) {
            self.allocator.free(id);
            self.by_part[part as usize] -= charged;
        }
    }

    fn mark(&mut self, event: Event) {
        self.event = event;
        self.observe();
    }

    fn observe(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.allocator.reserved);
        if self.allocator.allocated > self.peak_allocated {
            self.peak_allocated = self.allocator.allocated;
            self.peak_at = self.event;
            self.peak_parts = self.by_part;
        }
    }
}

/// What the replay found on one device.
#[derive(Debug, Clone)]
pub(crate) struct DeviceRun {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_at: String,
    pub components: Components,
    pub steady: u64,
}

/// Everything the step program needs, resolved once.
struct Program<'a> {
    model: &'a ModelDescription,
    workload: &'a Workload,
    precision: Precision,
    units: Vec<Unit>,
    /// Each unit's activations for one step, computed once.
    activations: Vec<BlockActivations>,
    /// The GPU each unit runs on: where it is placed, or for inference the main GPU when it is
    /// offloaded to `cpu` or `disk`.
    devices: Vec<Option<u32>>,
    /// Units whose weights live on `cpu` or `disk` and are copied to their GPU around their
    /// forward (accelerate's `AlignDevicesHook` with offload): their KV cache stays there.
    offloaded: Vec<bool>,
    shards: u64,
    tracks: BTreeMap<u32, Track>,
}

/// cuBLAS workspace per handle and stream with the default `CUBLAS_WORKSPACE_CONFIG`
/// (`:4096:2:16:8` = 4096 KiB × 2 + 16 KiB × 8 = 8,519,680 B; PyTorch PR #83461), allocated
/// through the caching allocator at the first matmul; plus the cuBLASLt workspace (1 MiB, 32 MiB
/// on Hopper; PyTorch PR #120925).
pub(crate) fn cublas_workspace(compute_major: u32) -> u64 {
    8_519_680 + if compute_major >= 9 { 32 << 20 } else { 1 << 20 }
}

/// The per-unit charges of [`crate::charges`], from the same step program the replay runs.
pub(crate) fn charges(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
    lora_targets: &[String],
) -> crate::charges::Charges {
    use crate::charges::{Charges, UnitCharge, UnitRole};
    let program = Program::new(model, hardware, workload, placement, lora_targets);
    let blocks = ActivationModel::new(model, workload, program.precision);
    let w = workload;
    let checkpoint = w.grad_checkpointing == GradCheckpointing::Full;
    let prompt = w.prompt.unwrap_or(w.seq).min(w.seq);
    let kv = program.kv_cache_bytes();
    let units = (0..program.units.len())
        .map(|i| {
            let unit = &program.units[i];
            let weight_bytes = program.held_weight_bytes(i);
            let role = match unit.kind {
                UnitKind::Block(layer) => UnitRole::Block(layer),
                UnitKind::Embedding => UnitRole::Embedding,
                UnitKind::Head => UnitRole::Head,
                UnitKind::Other => UnitRole::Other,
            };
            let dequant = program.dequant_transient(i);
            let (resident, peak, transient) = match w.mode {
                Mode::Train => {
                    let acts = &program.activations[i];
                    let grads = program.trainable_grad_bytes(i);
                    let states = program.optimizer_state_held(i);
                    let is_block = matches!(unit.kind, UnitKind::Block(_));
                    let saved: u64 = acts.saved.iter().sum();
                    let kept = if w.switches.activation_offload {
                        0
                    } else if is_block && checkpoint {
                        acts.input
                    } else {
                        saved + 2 * unit.autocast_params
                    };
                    let recompute =
                        if (is_block && checkpoint) || w.switches.activation_offload { saved } else { 0 };
                    let gathered = program.gathered_weights(i);
                    let (resident_grads, peak) =
                        if w.switches.keep_gradients { (grads, kept) } else { (0, kept.max(grads)) };
                    let mut transient = gathered
                        + (acts.forward_transient + dequant).max(recompute + acts.backward_transient);
                    if unit.kind == UnitKind::Head {
                        transient += program.loss_peak_bytes();
                    }
                    (weight_bytes + states + resident_grads, peak, transient)
                }
                Mode::Inference => {
                    let (peak, mut transient) = match unit.kind {
                        UnitKind::Block(layer) => {
                            (kv[i], blocks.block(layer, w.batch, prompt).forward_transient + dequant)
                        }
                        _ => (0, 0),
                    };
                    if unit.kind == UnitKind::Head {
                        transient += program.last_logits_bytes();
                    }
                    (weight_bytes, peak, transient)
                }
            };
            UnitCharge {
                path: unit.path.clone(),
                keys: unit.keys.clone(),
                role,
                resident_bytes: resident,
                weight_bytes,
                peak_bytes: peak,
                transient_bytes: transient,
            }
        })
        .collect();
    let tokens = match w.mode {
        Mode::Train => w.seq,
        Mode::Inference => prompt,
    };
    Charges { units, handoff_bytes: program.handoff_bytes(tokens) }
}

/// Simulates the workload and returns each used GPU's replay.
pub(crate) fn simulate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
    lora_targets: &[String],
) -> BTreeMap<u32, DeviceRun> {
    let mut program = Program::new(model, hardware, workload, placement, lora_targets);
    let blocks = ActivationModel::new(model, workload, program.precision);
    program.load(hardware);
    match workload.mode {
        Mode::Train => {
            program.train_step(true);
            program.train_step(false);
        }
        Mode::Inference => program.inference(&blocks),
    }
    let program_units = program.units;
    program
        .tracks
        .into_iter()
        .map(|(g, t)| {
            let p = t.peak_parts;
            let components = Components {
                weights: p[Part::Weights as usize],
                gradients: p[Part::Gradients as usize],
                optimizer: p[Part::Optimizer as usize],
                activations: p[Part::Activations as usize],
                kv_cache: p[Part::KvCache as usize],
                logits: p[Part::Logits as usize],
                overhead: p[Part::Workspace as usize],
            };
            let steady = t.by_part.iter().sum();
            (
                g,
                DeviceRun {
                    peak_allocated: t.peak_allocated,
                    peak_reserved: t.peak_reserved,
                    peak_at: t.peak_at.describe(&program_units),
                    components,
                    steady,
                },
            )
        })
        .collect()
}

impl<'a> Program<'a> {
    fn new(
        model: &'a ModelDescription,
        hardware: &HardwareProfile,
        workload: &'a Workload,
        placement: &Placement,
        lora_targets: &[String],
    ) -> Program<'a> {
        let precision = Precision::of(model, workload);
        let units = units::units(model, workload, &precision, lora_targets);
        let main_gpu = placement.main_gpu().filter(|_| workload.mode == Mode::Inference);
        let mut offloaded = vec![false; units.len()];
        let devices: Vec<Option<u32>> = units
            .iter()
            .zip(offloaded.iter_mut())
            .map(|(u, offloaded)| match placement.target_of(&u.keys[0]) {
                Some(Target::Gpu(g)) => Some(g),
                Some(Target::Cpu | Target::Disk) if main_gpu.is_some() => {
                    *offloaded = true;
                    main_gpu
                }
                _ => None,
            })
            .collect();
        let shards = match workload.parallelism {
            Parallelism::Zero { .. } => hardware.devices.len().max(1) as u64,
            _ => 1,
        };
        let mut tracks = BTreeMap::new();
        for g in devices.iter().flatten() {
            tracks.entry(*g).or_insert_with(Track::new);
        }
        let mut program = Program {
            model,
            workload,
            precision,
            units,
            activations: Vec::new(),
            devices,
            offloaded,
            shards,
            tracks,
        };
        let blocks = ActivationModel::new(model, workload, precision);
        program.activations = (0..program.units.len()).map(|i| program.activations_of(i, &blocks)).collect();
        program
    }

    fn track(&mut self, unit: usize) -> Option<&mut Track> {
        let g = self.devices[unit]?;
        self.tracks.get_mut(&g)
    }

    fn training_lora(&self) -> bool {
        matches!(self.workload.finetune, Finetune::Lora { .. })
    }

    /// Weights of every unit on a GPU (sharded under ZeRO-3), and the cuBLAS workspaces.
    fn load(&mut self, hardware: &HardwareProfile) {
        for i in 0..self.units.len() {
            if self.offloaded[i] {
                continue;
            }
            let held: Vec<u64> =
                self.units[i].weight_tensors.iter().map(|b| self.held_tensor_bytes(*b)).collect();
            if let Some(track) = self.track(i) {
                for bytes in held {
                    track.alloc(Part::Weights, bytes);
                }
            }
        }
        for (g, track) in self.tracks.iter_mut() {
            let major = hardware.devices.get(*g as usize).map(|d| d.compute_capability.major).unwrap_or(8);
            track.alloc(Part::Workspace, cublas_workspace(major));
        }
    }

    /// Bytes of one weight tensor this rank holds: all of it, its ZeRO-3 shard, or none when
    /// parameters are offloaded.
    fn held_tensor_bytes(&self, bytes: u64) -> u64 {
        match self.workload.parallelism {
            Parallelism::Zero { offload_params: true, .. } => 0,
            Parallelism::Zero { stage: 3, .. } => bytes.div_ceil(self.shards),
            _ => bytes,
        }
    }

    /// Weight bytes unit `unit` holds on its device.
    fn held_weight_bytes(&self, unit: usize) -> u64 {
        self.units[unit].weight_tensors.iter().map(|b| self.held_tensor_bytes(*b)).sum()
    }

    /// Optimizer states (and master weights) unit `unit` holds on its device once created.
    fn optimizer_state_held(&self, unit: usize) -> u64 {
        let tensors = &self.units[unit].trainable_tensors;
        if tensors.is_empty()
            || matches!(self.workload.parallelism, Parallelism::Zero { offload_optimizer: true, .. })
        {
            return 0;
        }
        let dtype = units::trainable_dtype(self.workload, &self.precision);
        units::optimizer_state_bytes(self.workload, tensors, dtype).div_ceil(self.shards)
    }

    /// Hidden states of `tokens` tokens per sequence as they pass between units (fp32 residual
    /// stream under autocast).
    fn handoff_bytes(&self, tokens: u64) -> u64 {
        let residual = if self.precision.autocast { 4 } else { self.precision.compute_bytes() };
        residual * self.model.facts.hidden_size * self.workload.batch * tokens.max(1)
    }

    /// Per unit, the KV cache its block holds for the whole context (0 for other units).
    fn kv_cache_bytes(&self) -> Vec<u64> {
        let w = self.workload;
        let kv_dtype = w.kv_dtype.unwrap_or(self.precision.compute);
        let f = &self.model.facts;
        let per_token_layer = match &f.attention {
            vramplan_profiles::model::AttentionKind::MultiLatent {
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                ..
            } => {
                // transformers caches the decompressed keys and values of every head.
                f.num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)
            }
            vramplan_profiles::model::AttentionKind::Standard => 2 * f.num_kv_heads * f.head_dim,
        };
        self.units
            .iter()
            .map(|u| match u.kind {
                // Encoder blocks (BERT, T5's encoder) attend once and cache nothing.
                UnitKind::Block(layer)
                    if f.layers
                        .get(layer)
                        .is_some_and(|l| l.stack == vramplan_profiles::model::StackKind::Decoder) =>
                {
                    let window = f.layers.get(layer).and_then(|l| l.attention_window).unwrap_or(u64::MAX);
                    kv_dtype.bytes_for(per_token_layer * w.seq.min(window) * w.batch)
                }
                _ => 0,
            })
            .collect()
    }

    /// The logits of the last prompt token and their fp32 upcast (generation).
    fn last_logits_bytes(&self) -> u64 {
        (self.precision.compute_bytes() + 4) * self.model.facts.vocab_size * self.workload.batch
    }

    /// The head's device at the loss's backward, beyond the activations: the logits, the loss's
    /// saved log-softmax and the gradients backward makes (see `train_step`).
    fn loss_peak_bytes(&self) -> u64 {
        let w = self.workload;
        let tokens = w.batch * w.seq;
        let vocab = self.model.facts.vocab_size;
        let c = self.precision.compute_bytes();
        let logits = c * vocab * tokens;
        if w.switches.chunked_cross_entropy {
            let per_chunk = if w.switches.compile { c } else { 4 + 4 + c };
            return logits + per_chunk * (vocab * tokens / 8);
        }
        match w.trainer {
            Trainer::Transformers => logits + 3 * 4 * vocab * tokens,
            Trainer::Torchtune => 3 * c * vocab * tokens,
        }
    }

    /// Per-unit bytes that stay between steps once the optimizer has run: states, master
    /// weights, and gradients when they are zeroed in place.
    fn create_optimizer_state(&mut self) {
        for i in 0..self.units.len() {
            let held = self.optimizer_state_held(i);
            if let Some(track) = self.track(i) {
                track.alloc(Part::Optimizer, held);
            }
        }
    }

    fn activations_of(&self, unit: usize, blocks: &ActivationModel) -> BlockActivations {
        let w = self.workload;
        match self.units[unit].kind {
            UnitKind::Block(layer) => blocks.block(layer, w.batch, w.seq),
            UnitKind::Other | UnitKind::Embedding => self.norm_unit_activations(unit),
            UnitKind::Head => BlockActivations::default(),
        }
    }

    /// A norm outside the blocks (final norm, embedding LayerNorm) keeps its input and output.
    fn norm_unit_activations(&self, unit: usize) -> BlockActivations {
        let w = self.workload;
        let has_norm = self.model.root.find(&self.units[unit].path).is_some_and(|m| {
            let mut found = false;
            m.visit(&mut |x| found |= x.kind == vramplan_profiles::model::ModuleKind::Norm);
            found
        });
        if w.mode != Mode::Train || !has_norm {
            return BlockActivations::default();
        }
        let tokens = w.batch * w.seq;
        let h = self.model.facts.hidden_size;
        let c = self.precision.compute_bytes();
        let saved = if self.model.facts.norm == NormKind::RmsNorm {
            vec![4 * h * tokens, self.precision.upcast_bytes() * h * tokens, c * h * tokens]
        } else {
            vec![self.precision.upcast_bytes() * h * tokens, c * h * tokens]
        };
        BlockActivations { saved, forward_transient: 0, backward_transient: 0, input: 0 }
    }

    /// When unit `to` runs on another GPU than unit `from`, the hidden states (forward) or their
    /// gradient (backward) cross over: both GPUs hold a copy while the transfer is in flight.
    fn cross_boundary(&mut self, to: usize, from: Option<usize>, event: Event) {
        let (Some(from), Some(dst)) = (from, self.devices[to]) else { return };
        let Some(src) = self.devices[from] else { return };
        if src == dst {
            return;
        }
        let bytes = self.handoff_bytes(self.workload.seq);
        let sent = self.tracks.get_mut(&src).map(|t| t.alloc(Part::Activations, bytes));
        if let Some(track) = self.tracks.get_mut(&dst) {
            let received = track.alloc(Part::Activations, bytes);
            track.mark(event);
            track.free(received);
        }
        if let (Some(id), Some(track)) = (sent, self.tracks.get_mut(&src)) {
            track.free(id);
        }
    }

    /// ZeRO-3: bytes all-gathered on each rank around unit `unit`'s compute — the parts of its
    /// weights other ranks hold (all of them when parameters are offloaded), and the next unit's
    /// too, which DeepSpeed prefetches while this one runs.
    fn gathered_weights(&self, unit: usize) -> u64 {
        let Parallelism::Zero { stage: 3, offload_params, .. } = self.workload.parallelism else { return 0 };
        let missing = |u: &Unit| {
            let full = u.weight_bytes();
            if offload_params { full } else { full - full.div_ceil(self.shards) }
        };
        let next = self.units.get(unit + 1).map(missing).unwrap_or(0);
        missing(&self.units[unit]) + next
    }

    fn trainable_grad_bytes(&self, unit: usize) -> u64 {
        let dtype = units::trainable_dtype(self.workload, &self.precision);
        dtype.bytes_for(self.units[unit].trainable_params())
    }

    /// Bytes of the dequantized weight a 4-bit linear materialises for its matmul, in the
    /// compute dtype (`bnb_4bit_compute_dtype`, float32 unless set).
    fn dequant_transient(&self, unit: usize) -> u64 {
        match self.workload.quant {
            Quant::Nf4 { .. } | Quant::Fp4 { .. } => {
                let bytes = self.workload.autocast.map(|d| d.bits() / 8).unwrap_or(4);
                self.units[unit].largest_quantized_linear * bytes
            }
            _ => 0,
        }
    }

    fn train_step(&mut self, first: bool) {
        let w = self.workload;
        let checkpoint = w.grad_checkpointing == GradCheckpointing::Full;
        let offload = w.switches.activation_offload;
        let step: u8 = if first { 1 } else { 2 };
        if !first {
            // Gradients zeroed in place stay allocated from the first backward on.
        }
        let mut kept: Vec<Vec<u64>> = vec![Vec::new(); self.units.len()];
        // Forward.
        for (i, slot) in kept.iter_mut().enumerate() {
            self.cross_boundary(i, i.checked_sub(1), Event::ActivationsTo { unit: i, step });
            let acts = self.activations[i].clone();
            let is_block = matches!(self.units[i].kind, UnitKind::Block(_));
            let autocast = 2 * self.units[i].autocast_params;
            let dequant = self.dequant_transient(i);
            let gathered = self.gathered_weights(i);
            let Some(track) = self.track(i) else { continue };
            track.mark(Event::Forward { unit: i, step });
            let gather = track.alloc(Part::Weights, gathered);
            let mut ids = Vec::new();
            if is_block && checkpoint {
                ids.push(track.alloc(Part::Activations, acts.input));
                // Nothing is kept for backward inside a checkpointed layer: each intermediate is
                // freed once its consumer has run, so only the layer's working set is live.
                let t = track.alloc(Part::Activations, acts.forward_transient + dequant);
                track.free(t);
            } else {
                ids.extend(acts.saved.iter().map(|b| track.alloc(Part::Activations, *b)));
                ids.push(track.alloc(Part::Weights, autocast));
                let t = track.alloc(Part::Activations, acts.forward_transient + dequant);
                track.free(t);
            }
            track.free(gather);
            if offload {
                // Saved tensors move to pinned CPU memory once the unit's forward is done.
                ids.drain(..).for_each(|id| track.free(id));
            }
            *slot = ids;
        }
        // Loss.
        let head = self.units.iter().position(|u| u.kind == UnitKind::Head);
        let mut logits_ids = Vec::new();
        if let Some(h) = head {
            let tokens = w.batch * w.seq;
            let vocab = self.model.facts.vocab_size;
            let c = self.precision.compute_bytes();
            let logits = c * vocab * tokens;
            let trainer = w.trainer;
            if let Some(track) = self.track(h) {
                track.mark(Event::Loss { step });
                logits_ids.push(track.alloc(Part::Logits, logits));
                if w.switches.chunked_cross_entropy {
                    // Chunked cross-entropy upcasts one of 8 chunks at a time; only the logits
                    // (and a per-token log-sum-exp) stay for backward, and each chunk's gradient
                    // replaces it. Compiled (`torch.compile` of the loss) the upcast is fused
                    // away and a chunk's backward makes only its model-dtype gradient.
                    let chunk = vocab * tokens / 8;
                    let per_chunk = if w.switches.compile { c } else { 4 + 4 + c };
                    track.mark(Event::LossBackward { step });
                    let grad = track.alloc(Part::Logits, per_chunk * chunk);
                    track.free(grad);
                } else {
                    // The loss takes log-softmax of the logits — upcast to fp32 first by
                    // transformers' `ForCausalLMLoss`, in the model dtype by torchtune — and keeps
                    // it for backward; backward makes the dense NLL gradient and the log-softmax
                    // gradient of the same size, then the logits' gradient.
                    let loss_bytes = match trainer {
                        Trainer::Transformers => 4,
                        Trainer::Torchtune => c,
                    } * vocab
                        * tokens;
                    let log_softmax = track.alloc(Part::Logits, loss_bytes);
                    if trainer == Trainer::Torchtune {
                        // The recipe drops its reference to the logits after the loss.
                        logits_ids.drain(..).for_each(|id| track.free(id));
                    }
                    track.mark(Event::LossBackward { step });
                    let nll_grad = track.alloc(Part::Logits, loss_bytes);
                    let grad = track.alloc(Part::Logits, loss_bytes);
                    track.free(nll_grad);
                    track.free(log_softmax);
                    logits_ids.push(track.alloc(Part::Logits, logits));
                    track.free(grad);
                }
            }
        }
        // Backward.
        let optimizer_in_backward = w.switches.optimizer_in_backward;
        let keep_gradients = w.switches.keep_gradients;
        for i in (0..self.units.len()).rev() {
            let from = (i + 1 < self.units.len()).then_some(i + 1);
            self.cross_boundary(i, from, Event::GradientsTo { unit: i, step });
            let acts = self.activations[i].clone();
            let is_block = matches!(self.units[i].kind, UnitKind::Block(_));
            let grads = self.trainable_grad_bytes(i);
            let grads_new = if keep_gradients && !first { 0 } else { grads };
            let shards = self.shards;
            let zero2 = matches!(w.parallelism, Parallelism::Zero { stage: 2.., .. });
            let ids = std::mem::take(&mut kept[i]);
            let gathered = self.gathered_weights(i);
            let Some(track) = self.track(i) else { continue };
            let gather = track.alloc(Part::Weights, gathered);
            let mut recomputed: Vec<u64> = Vec::new();
            if (is_block && checkpoint) || offload {
                // Recomputed (or reloaded) together and freed together: one block.
                recomputed.push(track.alloc(Part::Activations, acts.saved.iter().sum()));
            }
            let grad = track.alloc(Part::Gradients, grads_new);
            let t = track.alloc(Part::Activations, acts.backward_transient);
            track.mark(Event::Backward { unit: i, step });
            track.free(t);
            recomputed.into_iter().chain(ids).for_each(|id| track.free(id));
            track.free(gather);
            if Some(i) == head {
                logits_ids.drain(..).for_each(|id| track.free(id));
            }
            if optimizer_in_backward && !first {
                track.free(grad);
            } else if zero2 {
                // Reduce-scatter keeps this rank's shard of the gradients.
                track.free(grad);
                track.alloc(Part::Gradients, grads_new.div_ceil(shards));
            }
        }
        // Optimizer step.
        if first {
            self.create_optimizer_state();
        }
        for track in self.tracks.values_mut() {
            track.mark(Event::OptimizerStep { step });
        }
        if !keep_gradients {
            // zero_grad(set_to_none=True): gradients are freed between steps.
            for track in self.tracks.values_mut() {
                let ids: Vec<u64> = (0..track.live.len() as u64)
                    .filter(|id| matches!(track.live[*id as usize], Some((Part::Gradients, _))))
                    .collect();
                ids.into_iter().for_each(|id| track.free(id));
            }
        }
        let _ = self.training_lora();
    }

    /// Inference: the KV cache for the whole context, then prefill one block at a time.
    fn inference(&mut self, blocks: &ActivationModel) {
        let w = self.workload;
        let prompt = w.prompt.unwrap_or(w.seq).min(w.seq);
        for (i, bytes) in self.kv_cache_bytes().into_iter().enumerate() {
            if bytes == 0 {
                continue;
            }
            if let Some(track) = self.track(i) {
                track.alloc(Part::KvCache, bytes);
            }
        }
        let vocab = self.model.facts.vocab_size;
        let c = self.precision.compute_bytes();
        for i in 0..self.units.len() {
            let kind = self.units[i].kind;
            let acts = match kind {
                UnitKind::Block(layer) => blocks.block(layer, w.batch, prompt).forward_transient,
                _ => 0,
            };
            let dequant = if matches!(kind, UnitKind::Block(_)) { self.dequant_transient(i) } else { 0 };
            let streamed: Vec<u64> = if self.offloaded[i] {
                self.units[i].weight_tensors.iter().map(|b| self.held_tensor_bytes(*b)).collect()
            } else {
                Vec::new()
            };
            let Some(track) = self.track(i) else { continue };
            match kind {
                UnitKind::Block(_) => track.mark(Event::Prefill { unit: i }),
                UnitKind::Head => track.mark(Event::LastLogits),
                UnitKind::Embedding | UnitKind::Other => {}
            }
            let copies: Vec<u64> =
                streamed.into_iter().map(|bytes| track.alloc(Part::Weights, bytes)).collect();
            match kind {
                UnitKind::Block(_) => {
                    let t = track.alloc(Part::Activations, acts + dequant);
                    track.free(t);
                }
                UnitKind::Head => {
                    let half = track.alloc(Part::Logits, c * vocab * w.batch);
                    let upcast = track.alloc(Part::Logits, 4 * vocab * w.batch);
                    track.free(upcast);
                    track.free(half);
                }
                UnitKind::Embedding | UnitKind::Other => {}
            }
            for id in copies {
                track.free(id);
            }
        }
    }
}
