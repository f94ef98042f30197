//! The `cpu` backend: the plan's model run with candle tensors on the CPU, on virtual devices
//! placed as accelerate places them (`dispatch.rs`), at a reduced scale: every activation is
//! `TOKENS × WIDTH`, every tensor of the model a `WIDTH`-vector, so the run exercises the map,
//! accelerate's hooks and PyTorch's device rule, not the model's numbers.
//!
//! How a module runs (`Run::module`), by its kind in the model description:
//! - a module the forward does not run without its input (Phi-4 multimodal's audio embedding)
//!   is skipped;
//! - an accelerate hook first moves the module's inputs to its execution device; a weight
//!   accelerate streams (`cpu`/`disk` offload) is a new copy on that device for each forward;
//! - `Embedding`, `Linear`, `Norm`, `Router`: one operation on the input and the module's tensors;
//! - a container that holds the stack (blocks, embeddings): its children in order, buffer-only
//!   children (rotary embeddings) first, their output handed to every later child; its own
//!   tensors (XLNet's `mask_emb`) are used only off a plain step's path, so not here;
//! - a `Block`: each sublayer, behind its norm where one precedes it, added to the residual;
//! - an MoE container (a router and experts): the experts fused (one operation on the input and
//!   the routing weights) or, as transformers 4.x runs them, each expert's output multiplied by
//!   the routing weights and added into the result in the container;
//! - any other container: its children read the input, and their outputs meet in one
//!   operation with the container's own tensors; a last `Linear` reads what they make.
//!
//! - a `Linear` LoRA adapts (`lora.rs`): PEFT's wrapper, which runs the original module (its
//!   hook included) as `base_layer`, then its adapters on the wrapper's own input.
//!
//! Every operation checks PyTorch's rule: all its tensors on one device, or the run stops with
//! the module, the operation and the two devices. Training runs the steps with candle's
//! autograd and SGD, and reports trainable tensors no gradient reached (accelerate's offload
//! trains a streamed copy, not the weight); with LoRA only the adapters are trained.

mod dispatch;
mod lora;

use crate::{Backend, Outcome, Validation};
use candle_core::{DType, Device as Host, Tensor, Var};
use dispatch::{Device, Dispatched, Home};
use std::collections::BTreeMap;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind, TensorKind, join};
use vramplan_sim::placement::Target;

/// Tokens in every activation.
const TOKENS: usize = 4;
/// Width of every activation and tensor.
const WIDTH: usize = 4;
/// SGD's learning rate.
const RATE: f64 = 0.1;

/// What the cpu backend runs.
#[derive(Debug, Clone)]
pub struct CpuRequest<'a> {
    /// The model, as the plan's target names it.
    pub model: &'a ModelDescription,
    /// The map, in file order.
    pub entries: &'a [(String, Target)],
    /// Training steps; `None` for one prefill.
    pub train_steps: Option<u32>,
    /// The linear modules LoRA adapts (as `vramplan_sim::input::lora_target_modules` resolves
    /// them), after the model is dispatched, as PEFT's `get_peft_model` does; `None` for no LoRA.
    pub lora_targets: Option<&'a [String]>,
}

/// A tensor of the run, on its virtual device.
#[derive(Clone)]
struct Placed {
    tensor: Tensor,
    device: Device,
}

/// Why the run stopped.
enum Stop {
    /// PyTorch's "Expected all tensors to be on the same device".
    Mismatch { module: String, operation: &'static str, devices: [Device; 2] },
    /// candle failed (a bug of this backend, not of the plan).
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for Stop {
    fn from(e: candle_core::Error) -> Stop {
        Stop::Candle(e)
    }
}

struct Run<'a> {
    dispatched: &'a Dispatched,
    /// Each storage's weights.
    weights: BTreeMap<String, Var>,
    /// Which storages are trained (parameters, not buffers or quantization constants).
    trainable: BTreeMap<String, bool>,
    /// The modules running, outermost first.
    running: Vec<String>,
    /// LoRA's adapters, by the path of the linear module they adapt.
    adapters: BTreeMap<String, lora::Adapter>,
    /// Modules the forward does not run in this step (`VisionFacts::idle_paths`).
    idle: &'a [String],
}

impl Run<'_> {
    /// PyTorch's rule for `operation` in the innermost running module.
    fn same(&self, operation: &'static str, operands: &[&Placed]) -> Result<Device, Stop> {
        let first = operands[0].device;
        match operands.iter().find(|p| p.device != first) {
            None => Ok(first),
            Some(other) => Err(Stop::Mismatch {
                module: self.running.last().cloned().unwrap_or_default(),
                operation,
                devices: [first, other.device],
            }),
        }
    }

    /// The module's own tensors, where they are (a streamed weight: a new copy on `device`).
    fn tensors(&self, m: &Module, device: Device) -> Result<Vec<Placed>, Stop> {
        let mut out = Vec::new();
        // A parent's own tensor that a child's is tied to (BERT's `cls.predictions.bias`, its
        // decoder's bias) is the child's operand, not the parent's.
        let mut children_use = std::collections::BTreeSet::new();
        if !m.tensors.is_empty() {
            for child in &m.children {
                child.visit(&mut |c: &Module| {
                    for t in &c.tensors {
                        children_use.insert(self.dispatched.storage[&join(&c.path, &t.name)].clone());
                    }
                });
            }
        }
        for t in &m.tensors {
            let path = join(&m.path, &t.name);
            let storage = &self.dispatched.storage[&path];
            if children_use.contains(storage) {
                continue;
            }
            let var = &self.weights[storage];
            out.push(match self.dispatched.homes[storage] {
                Home::On(d) => Placed { tensor: var.as_tensor().clone(), device: d },
                Home::Streamed => Placed { tensor: var.as_tensor().detach().copy()?, device },
            });
        }
        Ok(out)
    }

    /// One operation: the input times each of `weights`, plus the other inputs.
    fn operation(
        &self,
        name: &'static str,
        input: &Placed,
        others: &[Placed],
        weights: &[Placed],
    ) -> Result<Placed, Stop> {
        let mut all: Vec<&Placed> = vec![input];
        all.extend(others);
        all.extend(weights);
        let device = self.same(name, &all)?;
        let mut y = input.tensor.clone();
        for w in weights {
            y = y.broadcast_mul(&w.tensor.tanh()?)?;
        }
        for o in others {
            y = (y + &o.tensor)?;
        }
        Ok(Placed { tensor: y, device })
    }

    fn module(&mut self, m: &Module, input: Placed, side: &[Placed]) -> Result<Placed, Stop> {
        // A module holding no tensor (a dropout, an activation) gets no hook and takes only the
        // hidden states: it runs wherever they are (GPT-NeoX's `emb_dropout`).
        if holds_nothing(m) {
            return Ok(input);
        }
        // A module the forward does not run in this step (Phi-4 multimodal's audio embedding,
        // without audio: `VisionFacts::idle_paths`) is left out, as the model's forward leaves it.
        if self.idle.contains(&m.path) {
            return Ok(input);
        }
        if let Some(adapter) = self.adapters.get(&m.path).cloned() {
            return self.adapted(m, &adapter, input, side);
        }
        self.hooked(m, m.path.clone(), input, side)
    }

    /// `m` behind its hook, running under the name `name`.
    fn hooked(&mut self, m: &Module, name: String, input: Placed, side: &[Placed]) -> Result<Placed, Stop> {
        let hook = self.dispatched.hooks.get(&m.path).copied();
        let moved = |p: &Placed| Placed { tensor: p.tensor.clone(), device: hook.unwrap_or(p.device) };
        let input = moved(&input);
        let side: Vec<Placed> = side.iter().map(moved).collect();
        self.running.push(name);
        let device = input.device;
        let own = self.tensors(m, device)?;
        let out = match m.kind {
            ModuleKind::Embedding => self.operation("embedding", &input, &[], &own)?,
            ModuleKind::Linear | ModuleKind::Norm | ModuleKind::Router => {
                self.operation("linear", &input, &[], &own)?
            }
            ModuleKind::Experts { .. } if m.children.is_empty() => {
                self.operation("grouped_mm", &input, &side, &own)?
            }
            ModuleKind::Block => self.block(m, input, &side, &own)?,
            _ if holds_stack(m) => self.stack(m, input, &side)?,
            _ if is_moe(m) => self.moe(m, input, &own)?,
            _ => self.parts(m, input, &side, &own)?,
        };
        self.running.pop();
        Ok(out)
    }

    /// The model's own tensors (XLNet's `mask_emb`) take part only in paths a plain step does
    /// not take, so they are not operands here.
    fn stack(&mut self, m: &Module, input: Placed, side: &[Placed]) -> Result<Placed, Stop> {
        let mut side = side.to_vec();
        let mut x = input.clone();
        for child in m.children.iter().filter(|c| buffers_only(c)) {
            let made = self.module(child, input.clone(), &[])?;
            side.push(made);
        }
        for child in m.children.iter().filter(|c| !buffers_only(c)) {
            x = self.module(child, x, &side)?;
        }
        Ok(x)
    }

    fn block(&mut self, m: &Module, input: Placed, side: &[Placed], own: &[Placed]) -> Result<Placed, Stop> {
        let mut x = if own.is_empty() { input } else { self.operation("mix", &input, &[], own)? };
        let children: Vec<&Module> = m.children.iter().filter(|c| !buffers_only(c)).collect();
        let mut i = 0;
        while i < children.len() {
            let (c, next) = (children[i], children.get(i + 1));
            let is_norm = |c: &Module| matches!(c.kind, ModuleKind::Norm);
            if is_norm(c) && next.is_some_and(|n| !is_norm(n)) {
                let h = self.module(c, x.clone(), side)?;
                let y = self.module(next.expect("checked"), h, side)?;
                x = self.operation("add", &x, &[y], &[])?;
                i += 2;
            } else if is_norm(c) {
                x = self.module(c, x, side)?;
                i += 1;
            } else {
                let y = self.module(c, x.clone(), side)?;
                x = self.operation("add", &x, &[y], &[])?;
                if let Some(n) = next.filter(|n| is_norm(n)) {
                    x = self.module(n, x, side)?;
                    i += 1;
                }
                i += 1;
            }
        }
        Ok(x)
    }

    fn moe(&mut self, m: &Module, input: Placed, own: &[Placed]) -> Result<Placed, Stop> {
        let mut routing = None;
        let mut x = input.clone();
        for child in &m.children {
            match child.kind {
                ModuleKind::Router => routing = Some(self.module(child, input.clone(), &[])?),
                ModuleKind::Experts { .. } if child.children.is_empty() => {
                    let side: Vec<Placed> = routing.iter().cloned().collect();
                    x = self.module(child, input.clone(), &side)?;
                }
                ModuleKind::Experts { .. } => {
                    // transformers 4.x: each expert's output, weighted in the MoE block, added
                    // into the block's result (`index_add_`); the expert list has no forward.
                    let mut sum = Placed { tensor: input.tensor.zeros_like()?, device: input.device };
                    for expert in &child.children {
                        let out = self.module(expert, input.clone(), &[])?;
                        let weighted = match &routing {
                            Some(r) => self.operation("mul", &out, &[], std::slice::from_ref(r))?,
                            None => out,
                        };
                        sum = self.operation("index_add_", &sum, &[weighted], &[])?;
                    }
                    x = sum;
                }
                _ => x = self.module(child, x, &[])?,
            }
        }
        if own.is_empty() { Ok(x) } else { self.operation("mix", &x, &[], own) }
    }

    fn parts(&mut self, m: &Module, input: Placed, side: &[Placed], own: &[Placed]) -> Result<Placed, Stop> {
        // A wrapper of one module and no tensor of its own returns what it returns (BERT's
        // `cls` around its `predictions`).
        if let ([only], []) = (m.children.as_slice(), own) {
            return self.module(only, input, side);
        }
        let last_linear = m.children.iter().rposition(|c| matches!(c.kind, ModuleKind::Linear));
        let mut outputs = side.to_vec();
        for (i, child) in m.children.iter().enumerate() {
            if Some(i) != last_linear || m.children.len() == 1 {
                outputs.push(self.module(child, input.clone(), side)?);
            }
        }
        let met = self.operation("meet", &input, &outputs, own)?;
        match last_linear {
            Some(i) if m.children.len() > 1 => self.module(&m.children[i], met, side),
            _ => Ok(met),
        }
    }
}

/// A module with buffers only and no children (rotary embeddings).
/// A module with no tensor under it.
fn holds_nothing(m: &Module) -> bool {
    m.tensors.is_empty() && m.children.iter().all(holds_nothing)
}

fn buffers_only(m: &Module) -> bool {
    m.children.is_empty()
        && !m.tensors.is_empty()
        && m.tensors.iter().all(|t| matches!(t.kind, TensorKind::Buffer { .. }))
}

/// Whether the module holds blocks or embeddings: the model, or a list of blocks.
fn holds_stack(m: &Module) -> bool {
    m.children.iter().any(|c| matches!(c.kind, ModuleKind::Block | ModuleKind::Embedding) || holds_stack(c))
}

/// A router and its experts.
fn is_moe(m: &Module) -> bool {
    m.children.iter().any(|c| matches!(c.kind, ModuleKind::Router))
        && m.children.iter().any(|c| matches!(c.kind, ModuleKind::Experts { .. }))
}

/// Runs the request: `Ok` with the outcome, `Err` when candle fails.
pub(crate) fn run(request: &CpuRequest) -> candle_core::Result<Validation> {
    let dispatched = dispatch::dispatch(request.model, request.entries);
    let placed = dispatch::placed(request.model, &dispatched);
    // Each storage once, with whether it is trained (parameters, not buffers or constants).
    let mut trainable = BTreeMap::new();
    request.model.root.visit(&mut |m: &Module| {
        for t in &m.tensors {
            let path = join(&m.path, &t.name);
            if dispatched.storage[&path] == path {
                trainable.insert(path, matches!(t.kind, TensorKind::Parameter));
            }
        }
    });
    let host = Host::Cpu;
    let mut weights = BTreeMap::new();
    for (k, path) in trainable.keys().enumerate() {
        let start = 0.1 + (k % 17) as f64 * 0.05;
        let values: Vec<f32> = (0..WIDTH).map(|i| (start + i as f64 * 0.01) as f32).collect();
        weights.insert(path.clone(), Var::from_vec(values, WIDTH, &host)?);
    }
    let adapters = match request.lora_targets {
        Some(targets) => lora::adapt(targets, &dispatched, &mut weights, &mut trainable)?,
        None => BTreeMap::new(),
    };
    let idle = request.model.facts.vision.as_ref().map_or(&[][..], |v| v.idle_paths.as_slice());
    let mut run = Run { dispatched: &dispatched, weights, trainable, running: Vec::new(), adapters, idle };
    let ids = Tensor::ones((TOKENS, WIDTH), DType::F32, &host)?;
    let steps = request.train_steps.unwrap_or(1);
    let mut outcome = Outcome::Completed;
    // PyTorch's `param.grad is None` after a backward: no gradient reached the weight.
    let mut untrained = std::collections::BTreeSet::new();
    for _ in 0..steps {
        run.running.clear();
        let input = Placed { tensor: ids.clone(), device: dispatched.main };
        match run.module(&request.model.root, input, &[]) {
            Ok(logits) => {
                if request.train_steps.is_some() {
                    let loss = logits.tensor.sum_all()?;
                    let grads = loss.backward()?;
                    for (path, var) in &run.weights {
                        if !run.trainable[path] {
                            continue;
                        }
                        let Some(g) = grads.get(var.as_tensor()) else {
                            // A weight no plain step uses (XLNet's `mask_emb`) gets none either;
                            // the plan's fault is a streamed one.
                            if dispatched.homes.get(path) == Some(&Home::Streamed) {
                                untrained.insert(path.clone());
                            }
                            continue;
                        };
                        var.set(&(var.as_tensor() - (g * RATE)?)?)?;
                    }
                }
            }
            Err(Stop::Candle(e)) => return Err(e),
            Err(Stop::Mismatch { module, operation, devices }) => {
                outcome = Outcome::RuntimeError {
                    error: "device_mismatch".to_string(),
                    module,
                    message: format!(
                        "Expected all tensors to be on the same device, but found at least two devices, {} and {}! \
                         (in {operation})",
                        devices[0], devices[1]
                    ),
                    devices: devices.iter().map(Device::to_string).collect(),
                };
                break;
            }
        }
    }
    if outcome == Outcome::Completed
        && let Some(first) = untrained.first()
    {
        let count = run.trainable.values().filter(|t| **t).count();
        outcome = Outcome::RuntimeError {
            error: "not_trained".to_string(),
            module: first.rsplit_once('.').map_or(first.as_str(), |(m, _)| m).to_string(),
            message: format!(
                "{} of {count} trainable tensors got no gradient (accelerate's offload streams a new copy \
                 of them for each forward, and the gradient goes to the copy), {first} first",
                untrained.len()
            ),
            devices: Vec::new(),
        };
    }
    Ok(Validation { backend: Backend::Cpu, outcome, devices: Vec::new(), samples: Vec::new(), placed })
}
