//! `from_pretrained(device_map="auto")`, the baseline every plan is compared with, rewritten
//! from the source of the two versions that compute it differently ([`Version`]):
//!
//! - transformers 5.x (the `accelerate` target): `transformers.integrations.accelerate.
//!   _get_device_map`, which no longer calls accelerate's balancing or fill but its own
//!   `get_max_memory`, `get_balanced_memory`, `compute_module_sizes` and
//!   `infer_auto_device_map` (same file), the quantizer's `param_element_size` and
//!   `adjust_max_memory`, and accelerate's `get_max_layer_size` and `clean_device_map`;
//! - transformers 4.x (the `accelerate-v4` target): `modeling_utils._get_device_map`, which
//!   calls accelerate 1.x's `get_balanced_memory` and `infer_auto_device_map`
//!   (`accelerate/utils/modeling.py`) with a target dtype and `special_dtypes`.
//!
//! Both run in two steps:
//!
//! 1. [`max_memory`]: `get_max_memory` (each GPU's free memory once the CUDA context exists,
//!    the host's available RAM; 5.x keeps 90 % of the RAM), `get_balanced_memory` for "auto" /
//!    "balanced" / "balanced_low_0", then the quantizer's `adjust_max_memory`.
//! 2. [`auto_device_map`]: `infer_auto_device_map` (a greedy fill in module definition order
//!    that splits what does not fit unless it is a no-split class, moves on to the next device
//!    and never comes back, keeps the largest layer free on GPU 0 and the CPU, keeps tied
//!    parameters together, and ends on an uncapped disk), then `clean_device_map`.
//!
//! Sizes are what transformers believes, not what memory holds ([`Sizing`]); nothing here
//! knows about activations or the KV cache, exactly as transformers does not.
//!
//! What 5.x changed (transformers 5.23.0, `integrations/accelerate.py`):
//! - `get_max_memory`: without a user `max_memory`, `final_max_memory["cpu"] *= 0.90`;
//! - `get_balanced_memory`: the buffer added to `total // n` is ⌊1.25 · max(the largest module
//!   of any no-split class, the largest leaf module)⌋ (4.x: the *first* module of each class
//!   and the *mean* leaf);
//! - `compute_module_sizes`: each tensor at `hf_quantizer.param_element_size` (bitsandbytes:
//!   0.5 or 1 byte for the weight of an `nn.Linear` it replaced, the tensor's own element size
//!   otherwise, so fused 3-D expert parameters stay 16-bit); 4.x sized every floating-point
//!   tensor at min(target dtype, its own) unless `special_dtypes` names it;
//! - `get_module_size_with_ties`: each module holding a tied parameter counted once, whole;
//! - `infer_auto_device_map`: a module that does not fit with its ties is split whenever it can
//!   be (4.x only when it does not fit alone either), and there is no fallback allocation.

use crate::runtime::Runtime;
use std::collections::{HashMap, HashSet, VecDeque};
use vramplan_profiles::DType;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind, Naming, Tensor, TensorKind};
use vramplan_sim::placement::{Target, covers};
use vramplan_sim::workload::{Quant, Workload};

/// Share of a lone GPU's free memory `get_balanced_memory` keeps when the user sets no
/// `max_memory` ("90% is a good compromise"; accelerate PR #1798, copied into transformers 5.x).
const SINGLE_GPU_SHARE: f64 = 0.9;
/// Share of every device's budget the bitsandbytes quantizers keep ("need more space for
/// buffers that are created during quantization"; `Bnb8BitHfQuantizer.adjust_max_memory` and
/// `Bnb4BitHfQuantizer.adjust_max_memory`, both versions).
const QUANTIZER_SHARE: f64 = 0.9;
/// Share of the host's available RAM transformers 5.x's `get_max_memory` keeps when the user
/// sets no `max_memory` (`final_max_memory["cpu"] *= 0.90`, "we don't want to set extremely
/// tight bound and pressure for cpu").
const CPU_SHARE_V5: f64 = 0.9;
/// `_keep_in_fp32_modules` of the model families in the catalog that set one (transformers'
/// `modeling_<type>.py`): `T5PreTrainedModel` keeps `wo`, `GptOssPreTrainedModel` its norms.
const KEEP_IN_FP32: [(&str, &[&str]); 2] =
    [("t5", &["wo"]), ("gpt_oss", &["post_attention_layernorm", "input_layernorm", "norm"])];

/// Which transformers computes the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// transformers 5.x: `transformers.integrations.accelerate._get_device_map`.
    #[default]
    Transformers5,
    /// transformers 4.x: accelerate 1.x's `get_balanced_memory` + `infer_auto_device_map`.
    Transformers4,
}

impl Version {
    /// The version whose `device_map="auto"` the target's names follow: 4.x for
    /// `accelerate-v4`, 5.x for `accelerate`, and the model's naming for the other targets.
    pub fn of(runtime: Runtime, naming: Naming) -> Version {
        match (runtime, naming) {
            (Runtime::AccelerateV4, _) => Version::Transformers4,
            (Runtime::Accelerate, _) => Version::Transformers5,
            (_, naming) => naming.into(),
        }
    }
}

/// The version whose module names a naming follows.
impl From<Naming> for Version {
    fn from(naming: Naming) -> Version {
        match naming {
            Naming::V4 => Version::Transformers4,
            Naming::V5 => Version::Transformers5,
        }
    }
}

/// One entry of accelerate's `max_memory`: a device and the bytes it may fill (the floor of
/// the float transformers computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxMemory {
    /// The device (`max_memory`'s key: a GPU index, `"cpu"` or `"disk"`).
    pub tier: Target,
    /// The bytes accelerate may fill on it.
    pub bytes: u64,
}

/// Which `device_map` string the user passed to `from_pretrained`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `"auto"` or `"balanced"` (the same in transformers): balanced caps on all GPUs but the last.
    Balanced,
    /// `"balanced_low_0"`: GPU 0 keeps only what the other GPUs cannot take.
    BalancedLow0,
    /// `"sequential"`: every GPU's full free memory, no balancing.
    Sequential,
}

/// How transformers quantizes linear weights while it sizes the model for the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GreedyQuant {
    /// Unquantized: every tensor at the load dtype (or its own, where it keeps it).
    None,
    /// bitsandbytes LLM.int8: quantized weights at 1 byte per element; budgets × 0.9.
    Int8,
    /// bitsandbytes 4-bit (nf4, fp4): quantized weights at half a byte per element; budgets × 0.9.
    Int4,
    /// A packed checkpoint (GPTQ, AWQ, fp8) described unquantized: quantized weights at `bits`
    /// per element, their scales and zeros left out; no budget factor.
    Packed {
        /// Bits per quantized weight (4 for GPTQ and AWQ, 8 for fp8).
        bits: u32,
    },
}

/// How transformers sizes the model's tensors for the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The dtype floating-point parameters are loaded in (`from_pretrained(dtype=...)`).
    pub dtype: DType,
    /// How linear weights are quantized.
    pub quant: GreedyQuant,
    /// Whose rules: transformers 5.x or 4.x with accelerate 1.x.
    pub version: Version,
}

impl Sizing {
    /// The sizing `from_pretrained` would use for this workload: its weight dtype (else the
    /// checkpoint's; a quantized checkpoint's own dtype falls back to bf16, as the simulator
    /// holds unquantized parts), its quantization, and the version the model's naming follows.
    pub fn of(model: &ModelDescription, workload: &Workload) -> Sizing {
        Sizing::with_version(model, workload, model.naming.into())
    }

    /// [`Sizing::of`] for a target: `accelerate-v4` is 4.x, `accelerate` 5.x ([`Version::of`]).
    pub fn for_target(model: &ModelDescription, workload: &Workload, runtime: Runtime) -> Sizing {
        Sizing::with_version(model, workload, Version::of(runtime, model.naming))
    }

    fn with_version(model: &ModelDescription, workload: &Workload, version: Version) -> Sizing {
        let dtype = workload.weight_dtype.unwrap_or(model.dtype);
        let dtype = if dtype.is_float() && dtype.bits() >= 16 { dtype } else { DType::BF16 };
        let quant = match &workload.quant {
            Quant::None | Quant::Gguf { .. } => GreedyQuant::None,
            Quant::Int8 => GreedyQuant::Int8,
            Quant::Nf4 { .. } | Quant::Fp4 { .. } => GreedyQuant::Int4,
            Quant::Gptq { bits, .. } | Quant::Awq { bits, .. } => GreedyQuant::Packed { bits: *bits },
            Quant::Fp8 { .. } => GreedyQuant::Packed { bits: 8 },
        };
        Sizing { dtype, quant, version }
    }

    /// Bits per element of a quantized linear weight, `None` when nothing is quantized.
    fn quantized_bits(&self) -> Option<u64> {
        match self.quant {
            GreedyQuant::None => None,
            GreedyQuant::Int8 => Some(8),
            GreedyQuant::Int4 => Some(4),
            GreedyQuant::Packed { bits } => Some(u64::from(bits)),
        }
    }

    fn bitsandbytes(&self) -> bool {
        matches!(self.quant, GreedyQuant::Int8 | GreedyQuant::Int4)
    }

    /// The bitsandbytes quantizers shrink every budget (`adjust_max_memory`); others do not.
    fn budget_share(&self) -> f64 {
        if self.bitsandbytes() { QUANTIZER_SHARE } else { 1.0 }
    }
}

/// `max_memory` for `model` on `hardware`, GPUs in order then `cpu`: the free memory after the
/// CUDA context on each GPU of the first node (`mem_get_info` after `get_max_memory` creates the
/// context) and the host's RAM (5.x: × 0.9), balanced as `strategy` asks
/// (`get_balanced_memory`), then × 0.9 everywhere under bitsandbytes (`adjust_max_memory`).
/// Without a model there is nothing to balance for: the budgets are `get_max_memory`'s.
///
/// Balancing (`get_balanced_memory`, user `max_memory` unset):
/// - one GPU: its budget × 0.9, no cap;
/// - several: every GPU but the last is capped at total ÷ n + the buffer, ⌊1.25 · x⌋, where x
///   is (5.x) max(the largest module of a no-split class, the largest leaf module) or (4.x)
///   max(the first module of each no-split class, the mean leaf module); the last GPU keeps
///   its budget;
/// - `balanced_low_0`: total ÷ (n − 1) for the caps, and GPU 0 only what the others cannot take.
pub fn max_memory(
    hardware: &HardwareProfile,
    sizing: &Sizing,
    strategy: Strategy,
    model: Option<&ModelDescription>,
) -> Vec<MaxMemory> {
    let (mut gpus, mut cpu) = free_memory(hardware);
    if sizing.version == Version::Transformers5 {
        cpu *= CPU_SHARE_V5;
    }
    if let Some(model) = model
        && strategy != Strategy::Sequential
    {
        balance(&mut gpus, model, sizing, strategy == Strategy::BalancedLow0);
    }
    let share = sizing.budget_share();
    let mut out: Vec<MaxMemory> =
        gpus.iter().map(|&(i, b)| MaxMemory { tier: Target::Gpu(i), bytes: (b * share) as u64 }).collect();
    out.push(MaxMemory { tier: Target::Cpu, bytes: (cpu * share) as u64 });
    out
}

/// What accelerate's `get_max_memory` reads before any share is taken: each GPU of the first
/// node with its free memory (`mem_get_info` once the context exists), and the host's RAM
/// (`psutil.virtual_memory().available`; 64 GiB where the profile gives none).
pub fn free_memory(hardware: &HardwareProfile) -> (Vec<(u32, f64)>, f64) {
    let node = hardware.devices.first().map_or(0, |d| d.node);
    let mut gpus: Vec<(u32, f64)> =
        hardware.devices_of(node).map(|d| (d.index, d.usable_bytes() as f64)).collect();
    gpus.sort_by_key(|g| g.0);
    let ram = hardware.nodes.iter().find(|n| n.index == node).and_then(|n| n.host.ram_bytes);
    (gpus, ram.unwrap_or(crate::build::DEFAULT_HOST_RAM) as f64)
}

/// `get_balanced_memory` on the GPU budgets (index, bytes), with `max_memory` unset by the user.
fn balance(gpus: &mut [(u32, f64)], model: &ModelDescription, sizing: &Sizing, mut low_zero: bool) {
    let count = gpus.iter().filter(|g| g.1 > 0.0).count() as u64;
    if count == 0 {
        return;
    }
    if count == 1 {
        low_zero = false;
        if let Some(first) = gpus.first_mut() {
            first.1 *= SINGLE_GPU_SHARE;
        }
    }
    let sizes = Sizes::of(model, sizing);
    let total = sizes.module("");
    // `module_sizes[""] // n`: a float floor division where sizes are fractional.
    let mut per_gpu = (total / (if low_zero { count - 1 } else { count }) as f64).floor();
    let no_split = &model.facts.no_split_classes;
    let (block, leaf) = match sizing.version {
        Version::Transformers5 => {
            // Every module of a no-split class, the largest ("a single _no_split_module class …
            // may have different sizes depending on the layer idx"), and the largest leaf.
            let mut block = 0.0f64;
            model.root.visit(&mut |m| {
                if no_split.contains(&m.class) {
                    block = block.max(sizes.module(&m.path));
                }
            });
            (block, sizes.leaves.iter().copied().fold(0.0, f64::max))
        }
        Version::Transformers4 => {
            // The first module of each no-split class in definition order (not the largest: an
            // MoE model whose first layers are dense gets a buffer sized for a dense layer).
            let mut first_of_class: Vec<(&str, f64)> = Vec::new();
            model.root.visit(&mut |m| {
                if no_split.contains(&m.class)
                    && sizes.modules.contains_key(m.path.as_str())
                    && !first_of_class.iter().any(|(class, _)| *class == m.class)
                {
                    first_of_class.push((&m.class, sizes.module(&m.path)));
                }
            });
            let block = first_of_class.iter().map(|c| c.1).fold(0.0, f64::max);
            // `int(sum(...) / max(len(leaves), 1))`
            let leaves = sizes.leaves.len().max(1) as f64;
            (block, (sizes.leaves.iter().sum::<f64>() / leaves).trunc())
        }
    };
    // `int(1.25 * max(buffer, leaf))`
    per_gpu += (1.25 * block.max(leaf)).trunc();
    let gpu0 = gpus.iter().find(|g| g.0 == 0).map(|g| g.1);
    let positive: Vec<usize> = (0..gpus.len()).filter(|&i| gpus[i].1 > 0.0).collect();
    if let Some((_, capped)) = positive.split_last() {
        for &i in capped {
            let cap = match gpu0 {
                Some(own) if low_zero && gpus[i].0 == 0 => own,
                _ => per_gpu,
            };
            gpus[i].1 = gpus[i].1.min(cap);
        }
    }
    if low_zero {
        let others: f64 = gpus.iter().filter(|g| g.0 >= 1 && u64::from(g.0) < count).map(|g| g.1).sum();
        let min_zero = (total - others).max(0.0);
        if let Some(zero) = gpus.iter_mut().find(|g| g.0 == 0) {
            zero.1 = zero.1.min(min_zero);
        }
    }
}

/// The map `from_pretrained(device_map="auto")` ends with: [`infer_auto_device_map`] as
/// transformers calls it (no fallback allocation), cleaned.
pub fn auto_device_map(
    model: &ModelDescription,
    sizing: &Sizing,
    max_memory: &[MaxMemory],
) -> Vec<(String, Target)> {
    infer_auto_device_map(model, sizing, max_memory, Options::default())
}

/// Switches of `infer_auto_device_map` that transformers leaves at their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// When a device would stay empty, first look (depth first) for a module that fits it
    /// (accelerate PR #3066; off by default, and transformers never turns it on). accelerate's
    /// fill only: transformers 5.x's has no such switch, and it is ignored there.
    pub fallback_allocation: bool,
    /// Merge the children that share a device into their parent (`clean_device_map`).
    pub clean_result: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { fallback_allocation: false, clean_result: true }
    }
}

/// `infer_auto_device_map` of the sizing's version: module name → device, in the order placed
/// (after cleaning, a merged parent takes the place of its first child). Devices are
/// `max_memory`'s in order, then an uncapped disk.
pub fn infer_auto_device_map(
    model: &ModelDescription,
    sizing: &Sizing,
    max_memory: &[MaxMemory],
    options: Options,
) -> Vec<(String, Target)> {
    let sizes = Sizes::of(model, sizing);
    let mut fill = Fill::new(model, &sizes, max_memory);
    let fallback = options.fallback_allocation && sizing.version == Version::Transformers4;
    let mut map = fill.run(fallback);
    if options.clean_result {
        clean_device_map(&mut map, "");
    }
    map
}

/// What `compute_module_sizes` gives: bytes under every module path (tied copies left out),
/// any tensor's bytes on demand, and the leaf modules whose largest (5.x) or mean (4.x)
/// `get_balanced_memory` takes. Bytes are `f64`, as in Python: 4.x sizes a 4-bit tensor at
/// half a byte per element, so an odd element count (Gemma's scalar `embed_scale`) leaves half
/// a byte.
struct Sizes<'m> {
    root: &'m Module,
    sizing: Sizing,
    /// 5.x: modules bitsandbytes does not replace (`modules_to_not_convert`); 4.x: modules
    /// whose parameters `special_dtypes` keeps at the load dtype; with `kept_fp32` below.
    kept: HashSet<&'m str>,
    /// 4.x: modules whose parameters `keep_in_fp32_regex` keeps in float32.
    kept_fp32: HashSet<&'m str>,
    /// Packed checkpoints: the modules left unquantized ([`unquantized_modules`]).
    packed_kept: HashSet<&'m str>,
    /// Bytes under each module path that holds a counted tensor.
    modules: HashMap<&'m str, f64>,
    /// Bytes of each leaf module: (5.x) every module holding a counted tensor itself (the
    /// root's own tensors excepted: `if "." in name`); (4.x) every module with counted tensors
    /// below it and no child module that has any (accelerate's `get_module_leaves`, twice).
    leaves: Vec<f64>,
}

impl<'m> Sizes<'m> {
    fn of(model: &'m ModelDescription, sizing: &Sizing) -> Sizes<'m> {
        // Each set only where the sizing reads it (this runs for every greedy plan and probe).
        let (kept, kept_fp32) = match sizing.version {
            Version::Transformers5 if sizing.bitsandbytes() => {
                (modules_to_not_convert(model), HashSet::new())
            }
            Version::Transformers5 => (HashSet::new(), HashSet::new()),
            Version::Transformers4 => special_modules(model, sizing),
        };
        let mut sizes = Sizes {
            root: &model.root,
            sizing: *sizing,
            kept,
            kept_fp32,
            packed_kept: match sizing.quant {
                GreedyQuant::Packed { .. } => unquantized_modules(model),
                _ => HashSet::new(),
            },
            modules: HashMap::new(),
            leaves: Vec::new(),
        };
        sizes.add(&model.root);
        sizes
    }

    /// Adds `module` and everything below; returns its bytes, `None` when it holds no counted tensor.
    fn add(&mut self, module: &'m Module) -> Option<f64> {
        let mut own: Option<f64> = None;
        for tensor in module.tensors.iter().filter(|t| t.tied_to.is_none()) {
            own = Some(own.unwrap_or(0.0) + self.tensor(module, tensor));
        }
        let mut below: Option<f64> = None;
        for child in &module.children {
            if let Some(bytes) = self.add(child) {
                below = Some(below.unwrap_or(0.0) + bytes);
            }
        }
        let leaf = match self.sizing.version {
            Version::Transformers5 => own,
            Version::Transformers4 if below.is_none() => own,
            Version::Transformers4 => None,
        };
        if let Some(bytes) = leaf
            && !module.path.is_empty()
        {
            self.leaves.push(bytes);
        }
        let total = match (own, below) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        if let Some(bytes) = total {
            self.modules.insert(&module.path, bytes);
        }
        total
    }

    /// A tensor's bytes (0 for a tied copy).
    ///
    /// 5.x (`compute_module_sizes` with `hf_quantizer.param_element_size`): the weight of an
    /// `nn.Linear` (or `Conv1D`) that bitsandbytes replaces at 0.5 or 1 byte per element
    /// (`param_needs_quantization`: `isinstance(module, Linear4bit) and name != "bias"`);
    /// anything else at its own element size: parameters and default-dtype buffers in the load
    /// dtype, other buffers as created. Fused 3-D expert parameters are no `nn.Linear`, so they
    /// stay at the load dtype.
    ///
    /// 4.x (accelerate's `compute_module_sizes(model, dtype=target_dtype, special_dtypes)`):
    /// `special_dtypes` first (kept modules' parameters at the load dtype, `keep_in_fp32`
    /// ones at float32), integer tensors as they are, bool ones at `dtype_byte_size`'s 1/8
    /// byte, every other tensor at
    /// min(target dtype, its own element size), the target being bitsandbytes' `int4` (0.5)
    /// or `int8` (1), else the load dtype.
    ///
    /// Packed checkpoints (GPTQ, AWQ, fp8), both versions: quantized linear weights at their
    /// bits per element (scales and zeros left out), the head and tied modules kept.
    fn tensor(&self, module: &Module, tensor: &Tensor) -> f64 {
        if tensor.tied_to.is_some() {
            return 0.0;
        }
        let numel = tensor.numel() as f64;
        let float_param = tensor.kind == TensorKind::Parameter && tensor.dtype.is_float();
        let load = self.sizing.dtype.bits() as f64 / 8.0;
        // The element size on the meta model: parameters and buffers made in the default dtype
        // are in the load dtype, those of a fixed dtype (`torch.FloatTensor`, rotary
        // `inv_freq`) as made; integer and bool tensors are never converted.
        let own = if tensor.dtype.is_float() && tensor.follows_load_dtype {
            load
        } else if tensor.dtype.is_float() {
            tensor.dtype.bits() as f64 / 8.0
        } else if tensor.dtype == DType::Bool && self.sizing.version == Version::Transformers4 {
            // accelerate's `dtype_byte_size(torch.bool)` is 1/8 (GPT-2's causal-mask buffer).
            return numel / 8.0;
        } else {
            return tensor.bytes() as f64;
        };
        let path = module.path.as_str();
        if let GreedyQuant::Packed { bits } = self.sizing.quant {
            let linear = matches!(module.kind, ModuleKind::Linear | ModuleKind::Experts { .. })
                || module.class == "Linear";
            if float_param && tensor.shape.len() >= 2 && linear && !self.packed_kept.contains(path) {
                return (u128::from(tensor.numel()) * u128::from(bits)).div_ceil(8) as f64;
            }
        }
        match self.sizing.version {
            Version::Transformers5 => {
                let replaced = self.sizing.bitsandbytes()
                    && module.kind == ModuleKind::Linear
                    && !self.kept.contains(path);
                match self.sizing.quantized_bits() {
                    Some(bits) if replaced && float_param && tensor.name != "bias" => {
                        numel * bits as f64 / 8.0
                    }
                    _ => numel * own,
                }
            }
            Version::Transformers4 => {
                let target = match self.sizing.quant {
                    GreedyQuant::Int4 => 0.5,
                    GreedyQuant::Int8 => 1.0,
                    GreedyQuant::None | GreedyQuant::Packed { .. } => load,
                };
                if float_param && self.kept_fp32.contains(path) {
                    numel * 4.0
                } else if float_param && self.kept.contains(path) {
                    numel * load
                } else {
                    numel * own.min(target)
                }
            }
        }
    }

    /// Bytes under a module path (0 for one that holds nothing counted).
    fn module(&self, path: &str) -> f64 {
        self.modules.get(path).copied().unwrap_or(0.0)
    }

    /// Bytes under a module or tensor path.
    fn named(&self, name: &str) -> f64 {
        if let Some(&bytes) = self.modules.get(name) {
            return bytes;
        }
        let (module, tensor) = name.rsplit_once('.').unwrap_or(("", name));
        let Some(module) = self.root.find(module) else { return 0.0 };
        module.tensors.iter().find(|t| t.name == tensor).map_or(0.0, |t| self.tensor(module, t))
    }

    /// Bytes of a queue item.
    fn item(&self, item: &Item<'m>) -> f64 {
        match item.node {
            Node::Module(module) => self.module(&module.path),
            Node::Tensor(module, tensor) => self.tensor(module, tensor),
        }
    }
}

/// The model's `_keep_in_fp32_modules` (by `model_type`; see [`KEEP_IN_FP32`]).
fn keep_in_fp32(model: &ModelDescription) -> &'static [&'static str] {
    KEEP_IN_FP32.iter().find(|(t, _)| *t == model.facts.model_type).map_or(&[], |(_, names)| *names)
}

/// transformers 5.x `should_convert_module(name, patterns)` negated: a pattern matches a module
/// from the start up to a module boundary (`layer.1` matches `layer.1.attn`) or as a suffix
/// (`fc1` matches `model.decoder.layers.23.fc1`). Patterns are module names here, matched
/// literally (the regex reading of their dots never matters for these names).
fn pattern_matches(pattern: &str, name: &str) -> bool {
    covers(pattern, name) || name.ends_with(pattern)
}

/// transformers 5.x: the modules bitsandbytes leaves as they are (`Bnb4BitHfQuantizer.
/// _process_model_before_weight_loading`: `get_modules_to_not_convert`): every module matched
/// by a pattern of `get_keys_to_not_convert` (both ends of every tie, the last parameter's
/// module, the output embedding `lm_head`, ".weight" removed) or of `_keep_in_fp32_modules`.
fn modules_to_not_convert(model: &ModelDescription) -> HashSet<&str> {
    let mut patterns: Vec<&str> = Vec::new();
    let mut last = None;
    model.root.visit(&mut |m| {
        for tensor in &m.tensors {
            if let Some(target) = &tensor.tied_to {
                patterns.push(m.path.as_str());
                patterns.push(split_tensor_path(target));
            }
            // `list(model.named_parameters())[-1]`: the weights are not tied yet, so a tied
            // head is still listed.
            if is_parameter(tensor) {
                last = Some(m.path.as_str());
            }
        }
    });
    patterns.extend(last);
    if model.root.children.iter().any(|c| c.path == "lm_head") {
        patterns.push("lm_head");
    }
    patterns.extend(keep_in_fp32(model).iter().copied());
    let mut kept = HashSet::new();
    model.root.visit(&mut |m| {
        if !m.path.is_empty() && patterns.iter().any(|p| !p.is_empty() && pattern_matches(p, &m.path)) {
            kept.insert(m.path.as_str());
        }
    });
    kept
}

/// transformers 4.x with accelerate: the modules whose parameters `special_dtypes` names.
/// Under bitsandbytes (`get_special_dtypes_update`): every parameter whose name contains one
/// of `modules_to_not_convert` as a substring, which are `get_keys_to_not_convert` (the output
/// embedding when nothing is tied; else both ends of every tie and the last parameter of the
/// tied model, ".weight" removed) and `_keep_in_fp32_modules`. Then `keep_in_fp32_regex`
/// (`(^|\.)name($|\.)`, when the load dtype is float16 or under bitsandbytes, whose
/// `use_keep_in_fp32_modules` is set) puts those modules' parameters in float32.
fn special_modules<'m>(model: &'m ModelDescription, sizing: &Sizing) -> (HashSet<&'m str>, HashSet<&'m str>) {
    let mut kept = HashSet::new();
    let mut kept_fp32 = HashSet::new();
    let fp32 = keep_in_fp32(model);
    if sizing.bitsandbytes() {
        let (ties, last) = tie_ends_and_last(model);
        let mut patterns: Vec<&str> = if ties.is_empty() {
            model.root.children.iter().filter(|c| c.path == "lm_head").map(|c| c.path.as_str()).collect()
        } else {
            ties.into_iter().chain(last).collect()
        };
        if patterns.is_empty() {
            patterns.extend(last);
        }
        patterns.extend(fp32.iter().copied());
        model.root.visit(&mut |m| {
            let holds_parameter = m.tensors.iter().any(is_parameter);
            if holds_parameter && patterns.iter().any(|p| !p.is_empty() && m.path.contains(p)) {
                kept.insert(m.path.as_str());
            }
        });
    }
    if sizing.dtype == DType::F16 || sizing.bitsandbytes() {
        model.root.visit(&mut |m| {
            let segments: Vec<&str> = m.path.split('.').collect();
            if fp32.iter().any(|name| segments.contains(name)) {
                kept_fp32.insert(m.path.as_str());
            }
        });
    }
    (kept, kept_fp32)
}

/// The modules a packed checkpoint keeps unquantized: the module of the last parameter (the
/// head), and both ends of every tie.
fn unquantized_modules(model: &ModelDescription) -> HashSet<&str> {
    let (ties, last) = tie_ends_and_last(model);
    ties.into_iter().chain(last).collect()
}

/// Both ends' modules of every tie, and the module of the last untied parameter
/// (`named_parameters()` of the tied model lists a tied copy once, first).
fn tie_ends_and_last(model: &ModelDescription) -> (Vec<&str>, Option<&str>) {
    let mut ties = Vec::new();
    let mut last = None;
    model.root.visit(&mut |m| {
        for tensor in &m.tensors {
            if let Some(target) = &tensor.tied_to {
                ties.push(m.path.as_str());
                ties.push(split_tensor_path(target));
            } else if is_parameter(tensor) {
                last = Some(m.path.as_str());
            }
        }
    });
    (ties, last)
}

/// The module part of a full tensor path.
fn split_tensor_path(path: &str) -> &str {
    path.rsplit_once('.').map_or("", |(module, _)| module)
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_string() } else { format!("{parent}.{name}") }
}

/// One item of accelerate's `modules_to_treat`: a module, or a parameter or buffer taken on its own.
#[derive(Clone)]
struct Item<'m> {
    name: String,
    node: Node<'m>,
}

#[derive(Clone, Copy)]
enum Node<'m> {
    Module(&'m Module),
    /// A tensor and the module that holds it.
    Tensor(&'m Module, &'m Tensor),
}

/// True for what `named_parameters` lists (buffers and quantization constants are buffers).
fn is_parameter(tensor: &Tensor) -> bool {
    matches!(tensor.kind, TensorKind::Parameter | TensorKind::PackedParameter { .. })
}

impl<'m> Item<'m> {
    fn of_module(module: &'m Module) -> Item<'m> {
        Item { name: module.path.clone(), node: Node::Module(module) }
    }

    fn of_tensor(module: &'m Module, tensor: &'m Tensor) -> Item<'m> {
        Item { name: join(&module.path, &tensor.name), node: Node::Tensor(module, tensor) }
    }

    fn module(&self) -> Option<&'m Module> {
        match self.node {
            Node::Module(module) => Some(module),
            Node::Tensor(..) => None,
        }
    }

    /// What splitting it gives: its own parameters, then its child modules (`named_parameters(
    /// recurse=False) + named_children()`; its own buffers are not listed, as in accelerate).
    fn split(&self) -> Vec<Item<'m>> {
        let Some(module) = self.module() else { return Vec::new() };
        let params = module.tensors.iter().filter(|t| is_parameter(t)).map(|t| Item::of_tensor(module, t));
        params.chain(module.children.iter().map(Item::of_module)).collect()
    }

    /// True if it has child modules and its class may be split.
    fn splittable(&self, no_split: &[String]) -> bool {
        self.module().is_some_and(|m| !m.children.is_empty() && !no_split.contains(&m.class))
    }
}

/// True if `name` lies inside module `inside` by accelerate's test (`inside + "." in name + "."`,
/// a substring test).
fn contains(inside: &str, name: &str) -> bool {
    format!("{name}.").contains(format!("{inside}.").as_str())
}

/// The state of one `infer_auto_device_map` run.
struct Fill<'m, 's> {
    sizes: &'s Sizes<'m>,
    no_split: &'m [String],
    /// Tied parameter groups, each sorted.
    tied: Vec<Vec<String>>,
    /// Devices in order with their budget; `None` for the uncapped disk.
    devices: Vec<(Target, Option<f64>)>,
    /// GPU 0 (the first GPU listed) and the CPU keep the largest layer free.
    main: Vec<Target>,
    queue: VecDeque<Item<'m>>,
}

/// A module's size with the modules its tied parameters live in, and those modules.
struct WithTies<'m> {
    bytes: f64,
    modules: Vec<Item<'m>>,
}

impl<'m, 's> Fill<'m, 's> {
    fn new(model: &'m ModelDescription, sizes: &'s Sizes<'m>, max_memory: &[MaxMemory]) -> Fill<'m, 's> {
        let mut devices: Vec<(Target, Option<f64>)> =
            max_memory.iter().map(|m| (m.tier, (m.tier != Target::Disk).then_some(m.bytes as f64))).collect();
        if !devices.iter().any(|d| d.0 == Target::Disk) {
            devices.push((Target::Disk, None));
        }
        let main = match devices.iter().find(|d| matches!(d.0, Target::Gpu(_))) {
            Some(gpu) => vec![gpu.0, Target::Cpu],
            None => vec![Target::Cpu],
        };
        // Listing the groups names every tensor; most models have none.
        let mut any_tied = false;
        model.root.visit(&mut |m| any_tied |= m.tensors.iter().any(|t| t.tied_to.is_some()));
        let mut tied = if any_tied { model.tied_groups() } else { Vec::new() };
        for group in &mut tied {
            group.sort();
        }
        // The root's own parameters, its children, its own buffers.
        let root = &model.root;
        let params = root.tensors.iter().filter(|t| is_parameter(t));
        let buffers = root.tensors.iter().filter(|t| !is_parameter(t));
        let queue = params
            .map(|t| Item::of_tensor(root, t))
            .chain(root.children.iter().map(Item::of_module))
            .chain(buffers.map(|t| Item::of_tensor(root, t)))
            .collect();
        Fill { sizes, no_split: &model.facts.no_split_classes, tied, devices, main, queue }
    }

    fn size(&self, item: &Item<'m>) -> f64 {
        self.sizes.item(item)
    }

    fn size_named(&self, name: &str) -> f64 {
        self.sizes.named(name)
    }

    fn version(&self) -> Version {
        self.sizes.sizing.version
    }

    /// `get_max_layer_size`: the largest leaf module or no-split block among `items` (depth
    /// first), and every name that reaches it.
    fn max_layer<'a>(&self, items: impl Iterator<Item = &'a Item<'m>>) -> (f64, Vec<String>)
    where
        'm: 'a,
    {
        let mut best = (0.0, Vec::new());
        for item in items {
            self.max_layer_below(item, &mut best);
        }
        best
    }

    fn max_layer_below(&self, item: &Item<'m>, best: &mut (f64, Vec<String>)) {
        let children = item.module().map_or(&[][..], |m| &m.children[..]);
        let whole = item.module().is_some_and(|m| self.no_split.contains(&m.class));
        if children.is_empty() || whole {
            let size = self.size(item);
            if size > best.0 {
                *best = (size, vec![item.name.clone()]);
            } else if size == best.0 {
                best.1.push(item.name.clone());
            }
        } else {
            for child in children {
                self.max_layer_below(&Item::of_module(child), best);
            }
        }
    }

    /// The recomputed largest layer over the modules still to place (parameters excluded).
    fn max_layer_left(&self) -> (f64, Vec<String>) {
        self.max_layer(self.queue.iter().filter(|i| i.module().is_some()))
    }

    /// The parameters tied to something in `name` but lying outside it.
    fn tied_outside(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        for group in &self.tied {
            let inside = group.iter().filter(|p| contains(name, p)).count();
            if inside > 0 && inside < group.len() {
                out.extend(group.iter().filter(|p| !contains(name, p)).cloned());
            }
        }
        out
    }

    /// `get_module_size_with_ties`: `size` plus, for each tied parameter, the first module of
    /// `among` it lies in: accelerate adds that module less the parameter itself, once per
    /// parameter; transformers 5.x adds each module once, whole (the tied copies weigh nothing
    /// in its sizes anyway).
    fn with_ties(&self, tied: &[String], size: f64, among: &VecDeque<Item<'m>>) -> WithTies<'m> {
        let mut out = WithTies { bytes: size, modules: Vec::new() };
        for param in tied {
            // Both raise here when no module to place holds the parameter; it is skipped.
            let inside =
                |i: &&Item<'m>| param.strip_prefix(i.name.as_str()).is_some_and(|rest| rest.starts_with('.'));
            let Some(holder) = among.iter().find(inside) else {
                continue;
            };
            match self.version() {
                Version::Transformers4 => out.bytes += self.size(holder) - self.size_named(param),
                Version::Transformers5 if out.modules.iter().any(|m| m.name == holder.name) => continue,
                Version::Transformers5 => out.bytes += self.size(holder),
            }
            out.modules.push(holder.clone());
        }
        out
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.queue.iter().position(|i| i.name == name)
    }

    /// The greedy fill: module name → device, uncleaned.
    fn run(&mut self, fallback: bool) -> Vec<(String, Target)> {
        let mut map = Vec::new();
        let mut current = 0;
        let mut used = vec![0.0f64; self.devices.len()];
        let (mut max_layer, mut max_layer_names) = self.max_layer(self.queue.iter());
        while let Some(item) = self.queue.pop_front() {
            let prefix = format!("{}.", item.name);
            max_layer_names.retain(|n| *n != item.name && !n.starts_with(&prefix));
            if max_layer_names.is_empty() {
                (max_layer, max_layer_names) = self.max_layer_left();
            }
            let size = self.size(&item);
            let tied = self.tied_outside(&item.name);
            let Some(&(tier, budget)) = self.devices.get(current) else {
                // Past the disk (cannot happen: the disk takes everything); keep every module placed.
                assign(&mut map, item.name, Target::Disk);
                continue;
            };
            let reserved = if self.main.contains(&tier) { max_layer } else { 0.0 };
            let limit = budget.map(|b| b - reserved);
            let with_ties = self.with_ties(&tied, size, &self.queue);

            // It fits, with what it is tied to.
            if limit.is_none_or(|l| used[current] + with_ties.bytes <= l) {
                used[current] += with_ties.bytes;
                assign(&mut map, item.name, tier);
                for holder in with_ties.modules {
                    if let Some(at) = self.position(&holder.name) {
                        self.queue.remove(at);
                    }
                    assign(&mut map, holder.name, tier);
                }
                continue;
            }
            // Only a capped device gets here (the uncapped disk took it above).
            let (Some(limit), Some(budget)) = (limit, budget) else { continue };

            // It fits alone: split one of the modules it is tied to, if one may be split.
            if !tied.is_empty() && used[current] + size <= limit {
                let splittable = with_ties.modules.iter().find(|m| m.splittable(self.no_split));
                if let Some(holder) = splittable
                    && let Some(at) = self.position(&holder.name)
                {
                    self.queue.remove(at);
                    for (k, child) in holder.split().into_iter().enumerate() {
                        self.queue.insert(at + k, child);
                    }
                    self.queue.push_front(item);
                    (max_layer, max_layer_names) = self.max_layer_left();
                    continue;
                }
            }

            // It does not fit alone (accelerate), or not with its ties (transformers 5.x, "as
            // last resort"): split it, unless it is a parameter, a leaf or a no-split block.
            let split = match self.version() {
                Version::Transformers4 => used[current] + size >= limit,
                Version::Transformers5 => true,
            };
            if split && item.splittable(self.no_split) {
                for child in item.split().into_iter().rev() {
                    self.queue.push_front(child);
                }
                (max_layer, max_layer_names) = self.max_layer_left();
                continue;
            }

            // An empty device first looks for something else that fits it.
            if fallback && used[current] == 0.0 && tier != Target::Disk {
                let room = budget - max_layer.max(with_ties.bytes) - used[current];
                if let Some((found, rest)) = self.fallback_allocate(room) {
                    self.queue = rest;
                    self.queue.push_front(item);
                    self.queue.push_front(found);
                    continue;
                }
            }

            // Next device, for good; the reservation stays counted on this one.
            used[current] += reserved;
            current += 1;
            self.queue.push_front(item);
        }
        map
    }

    /// `fallback_allocate`: the first module (depth first, splitting what may be split) whose
    /// size with ties is at most `room`, and the queue without it (its ancestors in the queue
    /// replaced by their parameters and children).
    fn fallback_allocate(&self, room: f64) -> Option<(Item<'m>, VecDeque<Item<'m>>)> {
        if room < 0.0 {
            return None;
        }
        let mut search = self.queue.clone();
        let found = loop {
            let item = search.pop_front()?;
            let tied = self.tied_outside(&item.name);
            if self.with_ties(&tied, self.size(&item), &search).bytes <= room {
                break item.name;
            }
            if item.splittable(self.no_split) {
                for child in item.split().into_iter().rev() {
                    search.push_front(child);
                }
            }
        };
        let mut rest = self.queue.clone();
        for (dot, _) in found.match_indices('.') {
            let parent = &found[..dot];
            if let Some(at) = rest.iter().position(|i| i.name == parent) {
                let Some(expanded) = rest.remove(at) else { continue };
                for (k, child) in expanded.split().into_iter().enumerate() {
                    rest.insert(at + k, child);
                }
            }
        }
        let at = rest.iter().position(|i| i.name == found)?;
        let item = rest.remove(at)?;
        Some((item, rest))
    }
}

/// Sets `name`'s device, keeping its place if it has one already (a Python dict assignment).
fn assign(map: &mut Vec<(String, Target)>, name: String, tier: Target) {
    match map.iter_mut().find(|entry| entry.0 == name) {
        Some(entry) => entry.1 = tier,
        None => map.push((name, tier)),
    }
}

/// accelerate's `clean_device_map`: where every entry under `module` (two or more) shares one
/// device, they become one entry for `module`, which, as a new key of a Python dict, goes to
/// the end of the map; then the same below each child. Python walks the children as a `set`,
/// whose order follows string hashes; here they go in map order, which gives Python's result
/// whenever at most one subtree merges below a split parent (every fixture case).
fn clean_device_map(map: &mut Vec<(String, Target)>, module: &str) {
    let prefix = if module.is_empty() { String::new() } else { format!("{module}.") };
    let under: Vec<usize> = (0..map.len()).filter(|&i| map[i].0.starts_with(&prefix)).collect();
    if under.len() > 1 && under.iter().all(|&i| map[i].1 == map[under[0]].1) {
        let tier = map[under[0]].1;
        for &i in under.iter().rev() {
            map.remove(i);
        }
        map.push((module.to_string(), tier));
    }
    let depth = if module.is_empty() { 1 } else { module.split('.').count() + 1 };
    let mut children: Vec<String> = Vec::new();
    for (name, _) in map.iter() {
        if name.starts_with(&prefix) && name.len() > module.len() {
            let child = name.split('.').take(depth).collect::<Vec<_>>().join(".");
            if !children.contains(&child) {
                children.push(child);
            }
        }
    }
    for child in children {
        clean_device_map(map, &child);
    }
}
