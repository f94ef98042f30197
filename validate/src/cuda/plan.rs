//! The operations each moment of the step program runs, from the unit's modules in the model
//! description and the workload: pure, no CUDA.
//!
//! - Forward (training, prefill): per module, in the tree's order — an `Embedding` gathers rows
//!   (a position bias inside a block, T5's, `seq²` of them); a `Norm` is RMSNorm or LayerNorm
//!   as `facts.norm` says; a `Linear` (or GPT-2's `Conv1D`) is one GEMM, `m` = tokens, `n` = out,
//!   `k` = in, its bias added, its LoRA adapters two more GEMMs; the MLP's activation (SiLU/GELU,
//!   times the up projection when gated) runs before the projection that reads the intermediate
//!   width; a `Router` is a GEMM and top-k routing; `Experts` are batched GEMMs over the experts,
//!   each taking its share of the routed tokens (`tokens × top_k / experts`); each attention
//!   container (a child named `*att*`) adds rotary to q and k (models with `inv_freq`) and the
//!   attention core — eager (batched GEMMs for the scores and the context, and a softmax
//!   kernel) when the workload's attention is `eager`, else one kernel with an online softmax.
//! - Backward, in reverse: per GEMM the input's gradient, and the weight's where it is trained
//!   (every float parameter in a full fine-tune; only the adapters under LoRA); each kernel's
//!   backward; with activation checkpointing a block's forward again first.
//! - The loss: cross-entropy over the vocabulary on the head's device, and its backward.
//! - The optimizer step: AdamW (SGD, SGD with momentum) per trainable tensor.
//! - A device boundary: a copy of the hidden states to the next unit's GPU.
//!
//! The dtype is the workload's compute dtype (the trainable dtype for the update). Weights are
//! named by tensor so that `bind.rs` finds the allocation holding each; `Planner::held` lists
//! a unit's tensors in the order the program allocates them (`vramplan_sim`'s unit description).
//! Rotary angles use θ = 10000 (the contents are random; the work is the same at any θ).

use super::ops::{Elem, Operand, Operation, Param, Pass, Source, Work};
use super::walk::Walk;
use std::collections::HashMap;
use vramplan_profiles::DType;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind, TensorKind, join};
use vramplan_sim::program::{Event, ProgramUnit, StepProgram, UnitRole};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Optimizer, Quant, Trainer, Workload};

/// What the plans read, resolved once per run.
pub(crate) struct Planner<'a> {
    pub(super) model: &'a ModelDescription,
    pub(super) workload: &'a Workload,
    pub(super) units: &'a [ProgramUnit],
    /// Per unit, the tensors its load allocates, in order.
    pub held: Vec<Vec<String>>,
    /// Per unit, its trainable tensors and their elements, in the order of its gradients.
    pub trainable: Vec<Vec<(String, u64)>>,
    /// The unit holding each tensor (and adapter).
    pub owner: HashMap<String, usize>,
    pub(super) lora: Vec<String>,
    pub(super) rank: u64,
    /// Activations' element type, and the trainable tensors'.
    pub compute: Elem,
    pub train: Elem,
    /// Rotary dims per head, where the model has rotary embeddings.
    pub(super) rotary: Option<u64>,
    handoff_bytes: u64,
}

/// The rotary base (the contents are random; the work is the same at any θ).
pub(super) const THETA: f32 = 10_000.0;

impl<'a> Planner<'a> {
    pub(crate) fn new(
        model: &'a ModelDescription,
        workload: &'a Workload,
        program: &'a StepProgram,
    ) -> Planner<'a> {
        let training = workload.mode == Mode::Train;
        let lora = if training {
            vramplan_sim::input::lora_target_modules(workload, model).unwrap_or_default()
        } else {
            Vec::new()
        };
        let rank = match &workload.finetune {
            Finetune::Lora { rank, .. } => *rank,
            Finetune::Full => 0,
        };
        let (compute, train) = dtypes(model, workload);
        let head = program.units.iter().find(|u| u.role == UnitRole::Head).map(|u| u.path.as_str());
        let mut planner = Planner {
            model,
            workload,
            units: &program.units,
            held: Vec::new(),
            trainable: Vec::new(),
            owner: HashMap::new(),
            lora,
            rank,
            compute: Elem::of(compute),
            train: Elem::of(train),
            rotary: None,
            handoff_bytes: program.handoff_bytes,
        };
        model.root.visit(&mut |m| {
            if let Some(t) = m.tensors.iter().find(|t| t.name == "inv_freq") {
                planner.rotary = Some(2 * t.numel());
            }
        });
        for (u, unit) in program.units.iter().enumerate() {
            let (held, trainable) = planner.unit_tensors(unit, head, training);
            for path in &held {
                planner.owner.insert(path.clone(), u);
            }
            planner.held.push(held);
            planner.trainable.push(trainable);
        }
        planner
    }

    /// The tensors of `unit` as the program's load allocates them, and its trainable ones: the
    /// order of `vramplan_sim`'s unit description (every untied tensor of its modules, parents
    /// first; each LoRA target's `lora_A` and `lora_B` after its own tensors).
    fn unit_tensors(
        &self,
        unit: &ProgramUnit,
        head: Option<&str>,
        training: bool,
    ) -> (Vec<String>, Vec<(String, u64)>) {
        let (mut held, mut trainable) = (Vec::new(), Vec::new());
        let Some(module) = self.model.root.find(&unit.path) else { return (held, trainable) };
        let own_only = unit.keys.first() != Some(&unit.path);
        let bitsandbytes = matches!(self.workload.quant, Quant::Int8 | Quant::Nf4 { .. } | Quant::Fp4 { .. });
        let quantizing = !matches!(self.workload.quant, Quant::None | Quant::Gguf { .. });
        let mut visit = |m: &Module| {
            let quantizable = match m.kind {
                ModuleKind::Linear => true,
                ModuleKind::Experts { .. } => !bitsandbytes,
                _ => false,
            } && Some(m.path.as_str()) != head;
            for t in m.tensors.iter().filter(|t| t.tied_to.is_none() && t.numel() > 0) {
                let path = join(&m.path, &t.name);
                let float = t.kind == TensorKind::Parameter && t.dtype.is_float();
                let quantized =
                    float && t.dtype.bits() >= 16 && quantizable && t.shape.len() >= 2 && quantizing;
                if training
                    && self.lora.is_empty()
                    && matches!(self.workload.finetune, Finetune::Full)
                    && float
                    && !quantized
                {
                    trainable.push((path.clone(), t.numel()));
                }
                held.push(path);
            }
            if let Some((out, inp)) = self.adapted(m) {
                for (name, numel) in [("lora_A", self.rank * inp), ("lora_B", out * self.rank)] {
                    let path = format!("{}.{name}.default.weight", m.path);
                    held.push(path.clone());
                    trainable.push((path, numel));
                }
            }
        };
        if own_only {
            visit(module);
        } else {
            module.visit(&mut |m| visit(m));
        }
        (held, trainable)
    }

    /// A LoRA target's `(out, in)`.
    pub(super) fn adapted(&self, m: &Module) -> Option<(u64, u64)> {
        if m.kind != ModuleKind::Linear || !self.lora.contains(&m.path) {
            return None;
        }
        let w = m.tensors.iter().find(|t| t.name == "weight")?;
        match w.shape.as_slice() {
            [o, i] if m.class == "Conv1D" => Some((*i, *o)),
            [o, i] => Some((*o, *i)),
            _ => None,
        }
    }

    /// The tensor `path` shares storage with (itself unless tied).
    pub(super) fn resolve(&self, path: &str) -> String {
        self.model.root.tensor(path).and_then(|t| t.tied_to.clone()).unwrap_or_else(|| path.to_string())
    }

    pub(super) fn trains(&self, path: &str) -> bool {
        let path = self.resolve(path);
        self.owner.get(&path).is_some_and(|u| self.trainable[*u].iter().any(|(p, _)| *p == path))
    }

    /// The operations of the moment `event` of `unit` on `device`; `from` is the GPU the hidden
    /// states leave at a device boundary.
    pub(crate) fn plan(
        &self,
        unit: Option<usize>,
        device: Option<u32>,
        event: Event,
        from: Option<u32>,
    ) -> Vec<Operation> {
        let w = self.workload;
        let (batch, seq) = (w.batch, w.seq);
        let prompt = w.prompt.unwrap_or(seq).min(seq);
        let run = |tokens: u64, seq: u64, pass: Pass| {
            let (Some(u), Some(device)) = (unit, device) else { return Vec::new() };
            let mut walk =
                Walk { p: self, unit: u, device, pass, batch: tokens / seq.max(1), seq, ops: Vec::new() };
            walk.unit_forward(tokens);
            walk.ops
        };
        match event {
            Event::Load => Vec::new(),
            Event::Forward(..) => run(batch * seq, seq, Pass::Forward),
            Event::Prefill(_) => run(batch * prompt, prompt, Pass::Forward),
            // The logits of the last prompt token only (`logits_to_keep=1`).
            Event::LastLogits => run(batch, 1, Pass::Forward),
            Event::Backward(u, step) => {
                let block = matches!(self.units[u].role, UnitRole::Block(_));
                let recompute = block && w.grad_checkpointing == GradCheckpointing::Full;
                let mut ops = if recompute { run(batch * seq, seq, Pass::Recompute) } else { Vec::new() };
                let forward = run(batch * seq, seq, Pass::Forward);
                let mut walk = Walk {
                    p: self,
                    unit: u,
                    device: device.unwrap_or(0),
                    pass: Pass::Backward,
                    batch,
                    seq,
                    ops: Vec::new(),
                };
                forward.iter().rev().for_each(|op| walk.backward(op));
                ops.append(&mut walk.ops);
                if w.switches.optimizer_in_backward {
                    ops.extend(self.update(u, step));
                }
                ops
            }
            Event::Loss(_) | Event::LossBackward(_) => {
                let (Some(u), Some(device)) = (unit, device) else { return Vec::new() };
                let fused = w.trainer == Trainer::Unsloth;
                let names: &[&'static str] = match (event, fused) {
                    (Event::Loss(_), false) => &["vp_cross_entropy"],
                    (Event::Loss(_), true) => &["vp_cross_entropy", "vp_cross_entropy_backward"],
                    (_, false) => &["vp_cross_entropy_backward"],
                    (_, true) => &[],
                };
                let e = self.compute.bytes();
                let last = |name| {
                    if name == "vp_cross_entropy" {
                        Operand::new(Source::Scratch, 4, &[0])
                    } else {
                        Operand::new(Source::Scratch, e, &[0, 1])
                    }
                };
                let tokens = batch * seq;
                names
                    .iter()
                    .map(|name| {
                        self.kernel(
                            &self.units[u].path,
                            device,
                            Pass::Loss,
                            self.compute,
                            name,
                            vec![tokens, self.model.facts.vocab_size],
                            vec![0, 1],
                            vec![
                                Operand::new(Source::Scratch, e, &[0, 1]),
                                Operand::new(Source::Scratch, 4, &[0]),
                                last(*name),
                            ],
                            vec![],
                        )
                    })
                    .collect()
            }
            Event::OptimizerStep(step) if !w.switches.optimizer_in_backward => {
                (0..self.units.len()).flat_map(|u| self.update(u, step)).collect()
            }
            Event::OptimizerStep(_) => Vec::new(),
            Event::ActivationsTo(..) | Event::GradientsTo(..) => {
                let (Some(to), Some(from)) = (device, from) else { return Vec::new() };
                let module = unit.map(|u| self.units[u].path.clone()).unwrap_or_default();
                vec![Operation {
                    module,
                    name: "to",
                    device: to,
                    pass: Pass::Transfer,
                    elem: self.compute,
                    work: Work::Copy,
                    dims: vec![self.handoff_bytes],
                    split: vec![0],
                    operands: vec![
                        Operand::new(Source::Handoff(from), 1, &[0]),
                        Operand::new(Source::Handoff(to), 1, &[0]),
                    ],
                }]
            }
        }
    }

    /// The optimizer's update of unit `u`'s trainable tensors, on its GPU.
    fn update(&self, u: usize, step: u8) -> Vec<Operation> {
        let Some(device) = self.units[u].device else { return Vec::new() };
        let e = self.train.bytes();
        let (name, states, params): (&'static str, u8, Vec<Param>) = match self.workload.optimizer {
            Optimizer::Adamw | Optimizer::PagedAdamw => {
                let p = [1e-5, 0.9, 0.999, 1e-8, 0.01].map(Param::F32);
                ("vp_adamw", 2, p.into_iter().chain([Param::I32(i32::from(step))]).collect())
            }
            Optimizer::Sgd => ("vp_sgd", 0, vec![Param::F32(1e-3)]),
            Optimizer::SgdMomentum => ("vp_sgd_momentum", 1, vec![Param::F32(1e-3), Param::F32(0.9)]),
            // bitsandbytes' 8-bit states and Adafactor's factored ones are not reproduced.
            Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit | Optimizer::Adafactor => return Vec::new(),
        };
        self.trainable[u]
            .iter()
            .map(|(path, numel)| {
                let mut operands = vec![
                    Operand::new(Source::Tensor(path.clone()), e, &[0]),
                    Operand::new(Source::Gradient(path.clone()), e, &[0]),
                ];
                operands.extend((0..states).map(|s| Operand::new(Source::State(path.clone(), s), e, &[0])));
                let module = path.rsplit_once('.').map_or("", |(m, _)| m);
                self.kernel(
                    module,
                    device,
                    Pass::Optimizer,
                    self.train,
                    name,
                    vec![*numel],
                    vec![0],
                    operands,
                    params.clone(),
                )
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn kernel(
        &self,
        module: &str,
        device: u32,
        pass: Pass,
        elem: Elem,
        name: &'static str,
        dims: Vec<u64>,
        split: Vec<usize>,
        operands: Vec<Operand>,
        params: Vec<Param>,
    ) -> Operation {
        Operation {
            module: module.to_string(),
            name: name.trim_start_matches("vp_"),
            device,
            pass,
            elem,
            work: Work::Kernel { name, params },
            dims,
            split,
            operands,
        }
    }
}

/// The compute dtype and the trainable tensors' dtype, as `vramplan_sim` resolves them: the
/// load dtype (a quantized checkpoint's unquantized parts in bf16), fp32 throughout for k-bit
/// LoRA under transformers, the autocast dtype under AMP; adapters in fp32 under PEFT and
/// Unsloth.
pub(crate) fn dtypes(model: &ModelDescription, w: &Workload) -> (DType, DType) {
    let weights = w.weight_dtype.unwrap_or(model.dtype);
    let weights = if weights.is_float() && weights.bits() >= 16 { weights } else { DType::BF16 };
    let lora = matches!(w.finetune, Finetune::Lora { .. });
    let kbit = w.mode == Mode::Train
        && lora
        && w.trainer == Trainer::Transformers
        && !matches!(w.quant, Quant::None | Quant::Gguf { .. });
    let compute = match w.autocast {
        _ if kbit => DType::F32,
        Some(half) if half != weights => half,
        _ => weights,
    };
    let train = if lora && matches!(w.trainer, Trainer::Transformers | Trainer::Unsloth) {
        DType::F32
    } else {
        weights
    };
    (compute, train)
}
