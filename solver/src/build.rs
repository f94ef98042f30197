//! From a model, a hardware profile, a workload and a target runtime to a [`Problem`]: the
//! placement units the runtime can dispatch on their own, each with the memory the simulator
//! charges it, and the devices with their capacities after headroom and fixed workspaces.
//!
//! - `accelerate`, `accelerate-v4`, `pipeline`: the simulator's units (embeddings, each decoder
//!   layer whole, the final norm, the head, buffer-only modules), in forward order, each with
//!   the `device_map` keys that place it. The units holding one tied group's tensors share a
//!   device: the first keeps its place in the order and the others go with it (a head tied to
//!   the input embedding). A unit holding no bytes never goes to `cpu` or `disk`.
//! - `llama.cpp`: per layer its attention and dense tensors (with its KV cache), and for MoE
//!   layers the fused expert tensors as a unit of their own; the output layer last. The CPU is
//!   the first device in order, as `-ngl` keeps the first layers there.
//! - `expert-parallel`: the experts of each MoE layer, counted per layer (or per load class
//!   with `--expert-load`); everything else is replicated on every GPU (data-parallel
//!   attention) and charged as the devices' fixed bytes.

use crate::problem::{Device, Problem, Unit};
use crate::runtime::Runtime;
use std::collections::BTreeMap;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind};
use vramplan_sim::charges::{self, Steady, UnitRole};
use vramplan_sim::engines::{gguf, llamacpp};
use vramplan_sim::placement::{Target, covers};
use vramplan_sim::workload::{Mode, Workload};

/// How many load classes the experts of one layer are grouped into under `--expert-load`.
const LOAD_CLASSES: usize = 8;

/// What the caller asks of the plan beyond model, hardware and workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The runtime the plan is for (`--target`).
    pub runtime: Runtime,
    /// Share of each GPU's usable memory kept free (0.10 = 10 %).
    pub headroom: f64,
    /// `(module pattern, device)` pins, as `--pin` gives them (see [`parse_pin`]).
    pub pins: Vec<(String, Target)>,
    /// Allow the CPU and disk (inference under accelerate; llama.cpp's CPU layers).
    pub offload: bool,
    /// After balance and traffic, prefer plans that use fewer GPUs (`--min-devices`).
    pub min_devices: bool,
    /// Tokens routed to each expert, per MoE layer path (`--expert-load`).
    pub expert_load: BTreeMap<String, Vec<f64>>,
    /// When a what-if's probes must end (`whatif --time-limit`): each probe's plan gets the
    /// time left, and a query stops where it stands once it has passed; `None` for none.
    pub deadline: Option<std::time::Instant>,
}

impl Request {
    /// The defaults of `vramplan plan`: accelerate, 10 % headroom, offload allowed.
    pub fn new(runtime: Runtime) -> Request {
        Request {
            runtime,
            headroom: 0.10,
            pins: Vec::new(),
            offload: true,
            min_devices: false,
            expert_load: BTreeMap::new(),
            deadline: None,
        }
    }
}

/// How a problem's units map back to the model, for the device map and the exports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum UnitSource {
    /// A module placed whole, by its `device_map` keys (disjoint prefixes).
    Module(Vec<String>),
    /// llama.cpp: the non-expert tensors of block `layer` (`blk.N`).
    LlamaLayer { layer: usize },
    /// llama.cpp: the fused expert tensors of block `layer`.
    LlamaExperts { layer: usize },
    /// llama.cpp: `output` and `output_norm`.
    LlamaOutput,
    /// Expert-parallel: these experts (indices) of the MoE layer at `path`.
    Experts { path: String, experts: Vec<u32> },
}

/// A problem and the way back from its units to the model.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub problem: Problem,
    pub sources: Vec<UnitSource>,
    /// Expert-parallel: bytes every GPU holds for the replicated dense part.
    pub replicated_bytes: u64,
    /// Of `replicated_bytes`, the weights.
    pub replicated_weight_bytes: u64,
}

/// Builds the problem for `request`.
pub(crate) fn build(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Result<Built, InputError> {
    let mut built = match request.runtime {
        Runtime::Accelerate | Runtime::AccelerateV4 | Runtime::Pipeline => {
            module_units(model, hardware, workload, request)
        }
        Runtime::LlamaCpp => llamacpp_units(model, hardware, workload, request)?,
        Runtime::ExpertParallel => expert_units(model, hardware, workload, request)?,
    };
    built.problem.pins = resolve_pins(&built, request)?;
    // accelerate runs a module wherever the map puts it (its hooks move the hidden states there
    // and back), so a pinned unit leaves the chain: the order rule holds for the units the user
    // did not pin, and the replay charges the hand-back (the hidden states copied to the pinned
    // unit's device). Pipelines and llama.cpp need their layers in order, pins included.
    if matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4) {
        // With the units it is held together with (a tied head and its embedding).
        let pinned: Vec<usize> = built.problem.pins.iter().map(|&(u, _)| u).collect();
        for u in pinned {
            let group =
                built.problem.together.iter().find(|g| g.contains(&u)).cloned().unwrap_or_else(|| vec![u]);
            for v in group {
                built.problem.units[v].order = None;
            }
        }
    }
    Ok(built)
}

/// The GPUs of the profile: capacity after headroom and the BLAS workspaces `model` under
/// `workload` holds there (plus `fixed`), interchangeable devices sharing a class.
fn gpu_devices(
    model: &ModelDescription,
    workload: &Workload,
    hardware: &HardwareProfile,
    headroom: f64,
    fixed: u64,
) -> Vec<Device> {
    let mut classes: Vec<(String, u64, u64)> = Vec::new();
    let workspaces = vramplan_sim::program::BlasWorkspaces::of(model, workload);
    hardware
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let workspace = workspaces.bytes_on(d.compute_capability.major);
            let fixed_bytes = workspace + fixed;
            let limit = vramplan_sim::estimate::limit_bytes(d.usable_bytes(), headroom);
            let key = (d.name.clone(), d.memory_bytes, u64::from(d.node));
            let class = classes.iter().position(|c| *c == key).unwrap_or_else(|| {
                classes.push(key);
                classes.len() - 1
            }) as u32;
            let next = hardware.devices.get(i + 1).map(|n| n.index).unwrap_or(hardware.devices[0].index);
            Device {
                name: format!("GPU {} ({})", d.index, d.name),
                tier: Target::Gpu(d.index),
                capacity_bytes: limit.saturating_sub(fixed_bytes),
                fixed_bytes,
                class,
                link_bytes_per_s: hardware.link_bandwidth(d.index, next),
            }
        })
        .collect()
}

/// Host RAM a plan assumes where the profile states none (`host: {ram: ...}`, `--host-ram`):
/// printed with every plan that offloads on it (the figure is a workstation's, not a fact of
/// the profile).
pub const DEFAULT_HOST_RAM: u64 = 64 << 30;

/// Disk a plan assumes where the profile states none (`host: {disk: ...}`, `--disk`): accelerate
/// puts no cap on disk, and a finite figure keeps the ILP's coefficients in a range HiGHS handles
/// well. Printed with every plan that offloads on it.
pub const DEFAULT_HOST_DISK: u64 = 4 << 40;

/// The host tiers: CPU RAM (of the first node) and disk, the profile's or the defaults.
fn host_devices(hardware: &HardwareProfile, first_class: u32) -> Vec<Device> {
    let host = hardware.nodes.first().map(|n| n.host).unwrap_or_default();
    let pcie = hardware.devices.first().map_or(0, |d| d.pcie_bandwidth_bytes_per_s());
    let mut out = vec![Device {
        name: "cpu".into(),
        tier: Target::Cpu,
        capacity_bytes: host.ram_bytes.unwrap_or(DEFAULT_HOST_RAM),
        fixed_bytes: 0,
        class: first_class,
        link_bytes_per_s: pcie,
    }];
    out.push(Device {
        name: "disk".into(),
        tier: Target::Disk,
        capacity_bytes: host.disk_bytes.unwrap_or(DEFAULT_HOST_DISK),
        fixed_bytes: 0,
        class: first_class + 1,
        link_bytes_per_s: pcie / 8,
    });
    out
}

fn module_units(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Built {
    let charges = charges::unit_charges(model, hardware, workload);
    let together = tied_units(model, &charges.units);
    let grouped: Vec<bool> =
        (0..charges.units.len()).map(|u| together.iter().any(|g| g.contains(&u))).collect();
    // In a group, the first member keeps the group's place in the order; the others go with it.
    let follows: Vec<bool> =
        (0..charges.units.len()).map(|u| together.iter().any(|g| g.contains(&u) && g[0] != u)).collect();
    let mut units = Vec::new();
    let mut sources = Vec::new();
    for (i, c) in charges.units.iter().enumerate() {
        // A unit that holds nothing gains nothing on `cpu` or `disk`: offloading it would only
        // add a device hop while a GPU has room (BERT's tied `cls.predictions`).
        let holds_nothing = c.resident_bytes == 0 && c.peak_bytes == 0 && c.transient_bytes == 0;
        units.push(Unit {
            name: c.path.clone(),
            count: 1,
            resident_bytes: c.resident_bytes,
            weight_bytes: c.weight_bytes,
            floor_bytes: c.floor_bytes,
            steady: c.steady,
            peak_bytes: c.peak_bytes,
            transient_bytes: c.transient_bytes,
            order: if follows[i] { None } else { Some(i as u32) },
            handoff_bytes: if matches!(c.role, UnitRole::Block(_)) { charges.handoff_bytes } else { 0 },
            load: 0.0,
            // Training state lives on GPUs. In inference an offloaded module's weights stay on
            // the host and its KV cache on the first GPU (`offload_runs_on`).
            gpu_only: workload.mode == Mode::Train || (holds_nothing && !grouped[i]),
        });
        sources.push(UnitSource::Module(c.keys.clone()));
    }
    let mut devices = gpu_devices(model, workload, hardware, request.headroom, 0);
    let offload = request.offload && request.runtime != Runtime::Pipeline && workload.mode == Mode::Inference;
    // accelerate runs offloaded modules on its main device, the first GPU of the map: with
    // devices in order, GPU 0 whenever anything is on a GPU.
    let offload_runs_on = (offload && !devices.is_empty()).then_some(0);
    if offload {
        let next = devices.iter().map(|d| d.class).max().unwrap_or(0) + 1;
        devices.extend(host_devices(hardware, next));
    }
    Built {
        problem: Problem {
            units,
            devices,
            together,
            pins: Vec::new(),
            ordered: true,
            min_devices: request.min_devices,
            offload_runs_on,
        },
        sources,
        replicated_bytes: 0,
        replicated_weight_bytes: 0,
    }
}

/// The units that hold a tied group's tensors, merged where groups share a unit: accelerate
/// and transformers load a tied group on one device, so its units form one `together` group
/// (an input embedding and the head tied to it; BERT's `cls.predictions` bias and decoder).
/// Each group lists its units in order.
fn tied_units(model: &ModelDescription, units: &[charges::UnitCharge]) -> Vec<Vec<usize>> {
    let unit_of = |tensor: &str| {
        units
            .iter()
            .enumerate()
            .filter_map(|(u, c)| {
                let key = c.keys.iter().filter(|k| covers(k, tensor)).max_by_key(|k| k.len())?;
                Some((key.len(), u))
            })
            .max()
            .map(|(_, u)| u)
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for tied in model.tied_groups() {
        let mut members: Vec<usize> = tied.iter().filter_map(|t| unit_of(t)).collect();
        members.sort_unstable();
        members.dedup();
        if members.len() < 2 {
            continue;
        }
        // Merge with every group sharing a unit.
        let mut merged = members;
        groups.retain(|g| {
            if g.iter().any(|u| merged.contains(u)) {
                merged.extend(g);
                false
            } else {
                true
            }
        });
        merged.sort_unstable();
        merged.dedup();
        groups.push(merged);
    }
    groups.sort();
    groups
}

fn llamacpp_units(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Result<Built, InputError> {
    let first =
        hardware.devices.first().ok_or_else(|| InputError::new(&hardware.name, "the profile has no GPU"))?;
    let budget = llamacpp::budget(model, first, workload)?;
    let tensors = gguf::quantize(model, budget.file_type)?;
    let layers = model.facts.layers.len();
    let mut dense = vec![0u64; layers];
    let mut experts = vec![0u64; layers];
    let mut output = 0u64;
    let tied = !tensors.iter().any(|t| t.role == gguf::Role::Output);
    for t in &tensors {
        match t.layer {
            Some(l) if (l as usize) < layers => {
                if t.path.contains(".experts.") {
                    experts[l as usize] += t.bytes;
                } else {
                    dense[l as usize] += t.bytes;
                }
            }
            _ => match t.role {
                // `token_embd` stays in host memory; a tied output is a copy of it on the GPU.
                gguf::Role::TokenEmbedding if tied => output += t.bytes,
                gguf::Role::TokenEmbedding => {}
                _ => output += t.bytes,
            },
        }
    }
    let kv_per_layer = budget.kv_bytes / layers.max(1) as u64;
    let mut units = Vec::new();
    let mut sources = Vec::new();
    for l in 0..layers {
        units.push(Unit {
            name: format!("blk.{l}"),
            count: 1,
            resident_bytes: dense[l],
            weight_bytes: dense[l],
            floor_bytes: dense[l] + kv_per_layer,
            steady: Steady::lasting(dense[l], kv_per_layer),
            peak_bytes: kv_per_layer,
            transient_bytes: 0,
            order: Some(2 * l as u32),
            handoff_bytes: 0,
            load: 0.0,
            gpu_only: false,
        });
        sources.push(UnitSource::LlamaLayer { layer: l });
        if experts[l] > 0 {
            units.push(Unit::weights(format!("blk.{l}.ffn_*_exps"), experts[l]));
            sources.push(UnitSource::LlamaExperts { layer: l });
        }
    }
    units.push(Unit { order: Some(2 * layers as u32), gpu_only: true, ..Unit::weights("output", output) });
    sources.push(UnitSource::LlamaOutput);
    // Every GPU holding layers allocates a compute buffer of the graph's size.
    let gpus = gpu_devices(model, workload, hardware, request.headroom, budget.compute_bytes);
    let mut devices = Vec::new();
    if request.offload {
        let next = gpus.iter().map(|d| d.class).max().unwrap_or(0) + 1;
        devices.extend(host_devices(hardware, next).into_iter().filter(|d| d.tier == Target::Cpu));
    }
    devices.extend(gpus);
    Ok(Built {
        problem: Problem {
            units,
            devices,
            together: Vec::new(),
            pins: Vec::new(),
            ordered: true,
            min_devices: request.min_devices,
            offload_runs_on: None,
        },
        sources,
        replicated_bytes: 0,
        replicated_weight_bytes: 0,
    })
}

fn expert_units(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Result<Built, InputError> {
    let Some(moe) = &model.facts.moe else {
        return Err(InputError::new(
            "--target",
            format!("expert-parallel places experts, and {} has none", model.name),
        )
        .with_fix("use `--target accelerate` or `--target pipeline` for a dense model"));
    };
    let charges = charges::unit_charges(model, hardware, workload);
    let gpus = hardware.devices.len().max(1) as u64;
    let mut replicated = 0u64;
    let mut replicated_weights = 0u64;
    let mut transient = 0u64;
    let mut units = Vec::new();
    let mut sources = Vec::new();
    for c in &charges.units {
        transient = transient.max(c.transient_bytes);
        let experts_module = match c.role {
            UnitRole::Block(layer) if model.facts.layers[layer].moe => experts_of(model, &c.path),
            _ => None,
        };
        let Some((experts_path, expert_params)) = experts_module else {
            replicated += c.resident_bytes + c.peak_bytes.div_ceil(gpus);
            replicated_weights += c.weight_bytes;
            continue;
        };
        let block_params = model.root.find(&c.path).map(|m| m.params()).unwrap_or(1).max(1);
        let expert_share = (c.weight_bytes as f64 * expert_params as f64 / block_params as f64) as u64;
        let count = u64::from(moe.experts).max(1);
        let per_expert_weights = expert_share / count;
        let per_expert_state = (c.resident_bytes - c.weight_bytes) * expert_params / block_params / count;
        // The dense rest of the block (attention, router, shared experts) is replicated; its KV
        // cache and activations are split with the sequences (data-parallel attention).
        replicated += c.resident_bytes.saturating_sub((per_expert_weights + per_expert_state) * count)
            + c.peak_bytes.div_ceil(gpus);
        replicated_weights += c.weight_bytes.saturating_sub(per_expert_weights * count);
        let loads = request.expert_load.get(&c.path).or_else(|| request.expert_load.get(&experts_path));
        for (experts, load) in load_classes(moe.experts, loads) {
            units.push(Unit {
                name: format!("{experts_path}[{}]", describe_indices(&experts)),
                count: experts.len() as u32,
                resident_bytes: per_expert_weights + per_expert_state,
                weight_bytes: per_expert_weights,
                floor_bytes: per_expert_weights + per_expert_state,
                steady: Steady::lasting(per_expert_weights + per_expert_state, 0),
                peak_bytes: 0,
                transient_bytes: 0,
                order: None,
                handoff_bytes: 0,
                load,
                gpu_only: true,
            });
            sources.push(UnitSource::Experts { path: experts_path.clone(), experts });
        }
    }
    let fixed = replicated + transient;
    let devices = gpu_devices(model, workload, hardware, request.headroom, fixed);
    Ok(Built {
        problem: Problem {
            units,
            devices,
            together: Vec::new(),
            pins: Vec::new(),
            ordered: false,
            min_devices: request.min_devices,
            offload_runs_on: None,
        },
        sources,
        replicated_bytes: replicated,
        replicated_weight_bytes: replicated_weights,
    })
}

/// The routed-experts module inside block `block` and its parameter count.
fn experts_of(model: &ModelDescription, block: &str) -> Option<(String, u64)> {
    experts_module(model, block).map(|m| (m.path.clone(), m.params()))
}

/// The routed-experts module inside the block at `block`.
pub fn experts_module<'m>(model: &'m ModelDescription, block: &str) -> Option<&'m Module> {
    let mut found = None;
    model.root.find(block)?.visit(&mut |m| {
        if found.is_none() && matches!(m.kind, ModuleKind::Experts { .. }) {
            found = Some(m);
        }
    });
    found
}

/// The experts of a layer grouped into classes of (nearly) equal load, each with its mean load;
/// one class of all experts and load 0 without statistics.
fn load_classes(experts: u32, loads: Option<&Vec<f64>>) -> Vec<(Vec<u32>, f64)> {
    let Some(loads) = loads.filter(|l| l.len() == experts as usize) else {
        return vec![((0..experts).collect(), 0.0)];
    };
    let mut order: Vec<u32> = (0..experts).collect();
    order.sort_by(|a, b| loads[*b as usize].total_cmp(&loads[*a as usize]).then(a.cmp(b)));
    let per_class = (experts as usize).div_ceil(LOAD_CLASSES);
    order
        .chunks(per_class.max(1))
        .map(|chunk| {
            let mut members = chunk.to_vec();
            members.sort_unstable();
            let mean = chunk.iter().map(|e| loads[*e as usize]).sum::<f64>() / chunk.len() as f64;
            (members, mean)
        })
        .collect()
}

/// `0..64` for a contiguous range, `3,7,9` otherwise.
fn describe_indices(experts: &[u32]) -> String {
    match (experts.first(), experts.last()) {
        (Some(a), Some(b)) if (*b - *a) as usize + 1 == experts.len() => format!("{a}..{}", b + 1),
        _ => experts.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}

/// Reads `--pin PATTERN=DEVICE`: a module path (`lm_head`), or a range of layers
/// (`model.layers.0-3`, first to last, both included), to a device as [`Target::parse`] reads
/// it (a GPU index, `cuda:1`, `cpu` or `disk`) on hardware with `gpus` GPUs. A range that runs
/// backwards (`model.layers.5-2`) is refused, not read as `2-5`.
pub fn parse_pin(text: &str, gpus: u32) -> Result<(String, Target), InputError> {
    let fix = "write `--pin lm_head=0` or `--pin 'model.layers.0-3=cpu'`";
    let (pattern, device) = text
        .rsplit_once('=')
        .ok_or_else(|| InputError::new("--pin", format!("`{text}` has no `=DEVICE`")).with_fix(fix))?;
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return Err(InputError::new("--pin", format!("`{text}` names no module before `=`")).with_fix(fix));
    }
    let tier = Target::parse_lenient(device, gpus)
        .map_err(|e| InputError::new("--pin", format!("`{text}`: {e}")).at_key(pattern).with_fix(e.fix()))?;
    if let Some((prefix, a, b)) = pin_range(pattern)
        && a > b
    {
        return Err(InputError::new(
            "--pin",
            format!("the range {a}-{b} runs backwards: a range goes from its first layer to its last"),
        )
        .at_key(pattern)
        .with_fix(format!("write `{prefix}.{b}-{a}={}`", device.trim())));
    }
    Ok((pattern.to_string(), tier))
}

/// `prefix.A-B` as `(prefix, A, B)`.
fn pin_range(pattern: &str) -> Option<(&str, u32, u32)> {
    let (prefix, range) = pattern.rsplit_once('.')?;
    let (a, b) = range.split_once('-')?;
    Some((prefix, a.parse().ok()?, b.parse().ok()?))
}

/// The paths a pin pattern names: itself, or `prefix.A-B` expanded to `prefix.A` … `prefix.B`.
fn expand_pattern(pattern: &str) -> Vec<String> {
    match pin_range(pattern) {
        Some((prefix, a, b)) => (a..=b).map(|i| format!("{prefix}.{i}")).collect(),
        None => vec![pattern.to_string()],
    }
}

/// Whether the unit named `unit` is `path` or inside it.
fn unit_under(unit: &str, path: &str) -> bool {
    covers(path, unit) || unit.strip_prefix(path).is_some_and(|rest| rest.starts_with('['))
}

/// The indices `i` for which some unit is `prefix.i` or inside it, sorted.
fn indices_under(built: &Built, prefix: &str) -> Vec<u32> {
    let mut found: Vec<u32> = built
        .problem
        .units
        .iter()
        .filter_map(|u| {
            let rest = u.name.strip_prefix(prefix)?.strip_prefix('.')?;
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// The devices of the problem in its order, for messages: `GPU 0, GPU 1, cpu, disk`.
fn device_list(devices: &[Device]) -> String {
    devices.iter().map(|d| d.tier.to_string()).collect::<Vec<_>>().join(", ")
}

/// Why a device is not in the plan, for a pin to it.
fn no_such_device(built: &Built, request: &Request, pattern: &str, tier: Target) -> InputError {
    let gpus: Vec<String> = built
        .problem
        .devices
        .iter()
        .filter_map(|d| match d.tier {
            Target::Gpu(i) => Some(i.to_string()),
            _ => None,
        })
        .collect();
    let gpu_list = if gpus.is_empty() { "none".to_string() } else { gpus.join(", ") };
    let (problem, fix) = match tier {
        Target::Gpu(i) => (
            format!("there is no GPU {i}: the profile's GPUs are {gpu_list}"),
            format!("pin to one of the GPUs {gpu_list}{}", host_hint(built)),
        ),
        Target::Cpu | Target::Disk => {
            let why = if request.runtime == Runtime::ExpertParallel || request.runtime == Runtime::Pipeline {
                format!("the {} target places everything on GPUs", request.runtime.name())
            } else if !request.offload {
                "--no-offload keeps everything on GPUs".to_string()
            } else if tier == Target::Disk && request.runtime == Runtime::LlamaCpp {
                "llama.cpp offloads to the CPU, never to disk".to_string()
            } else {
                "offload to the host is for inference only".to_string()
            };
            (
                format!("this plan has no {tier}: {why}"),
                format!("pin to one of the GPUs {gpu_list}{}", host_hint(built)),
            )
        }
    };
    InputError::new("--pin", problem).at_key(pattern).with_fix(fix)
}

fn host_hint(built: &Built) -> String {
    let hosts: Vec<String> = built
        .problem
        .devices
        .iter()
        .filter(|d| !matches!(d.tier, Target::Gpu(_)))
        .map(|d| d.tier.to_string())
        .collect();
    if hosts.is_empty() { String::new() } else { format!(", or to {}", hosts.join(" or ")) }
}

/// The pins as `(unit, device)`, refused with the reason where they name nothing, a device the
/// plan lacks, layers past the model's end, one unit twice, or contradict the target's order
/// (see [`check_pin_order`]).
fn resolve_pins(built: &Built, request: &Request) -> Result<Vec<(usize, usize)>, InputError> {
    let units = &built.problem.units;
    // Per unit: the pin that fixes it and its device.
    let mut by_unit: BTreeMap<usize, (&str, usize)> = BTreeMap::new();
    for (pattern, tier) in &request.pins {
        let device = built
            .problem
            .devices
            .iter()
            .position(|d| d.tier == *tier)
            .ok_or_else(|| no_such_device(built, request, pattern, *tier))?;
        if let Some((prefix, a, b)) = pin_range(pattern) {
            let present = indices_under(built, prefix);
            if let Some(&last) = present.last()
                && b > last
            {
                let count = present.len();
                let fix = if a <= last {
                    format!("write `{prefix}.{a}-{last}={tier_arg}`", tier_arg = pin_device_arg(*tier))
                } else {
                    format!("pin layers from 0 to {last}")
                };
                return Err(InputError::new(
                    "--pin",
                    format!("the model has {count} layers under `{prefix}` ({prefix}.0-{last}): there is no {prefix}.{b}"),
                )
                .at_key(pattern.as_str())
                .with_fix(fix));
            }
        }
        let mut matched = false;
        for path in expand_pattern(pattern) {
            for (u, unit) in units.iter().enumerate() {
                if !unit_under(&unit.name, &path) {
                    continue;
                }
                matched = true;
                match by_unit.get(&u) {
                    Some(&(other, d)) if d != device => {
                        return Err(InputError::new(
                            "--pin",
                            format!(
                                "`{}` is pinned twice: to {} by `{other}` and to {} by `{pattern}`",
                                unit.name, built.problem.devices[d].tier, built.problem.devices[device].tier
                            ),
                        )
                        .at_key(pattern.as_str())
                        .with_fix(format!("keep one of the two pins `{other}` and `{pattern}`")));
                    }
                    Some(_) => {}
                    None => {
                        by_unit.insert(u, (pattern.as_str(), device));
                    }
                }
            }
        }
        if !matched {
            let names: Vec<&str> = units.iter().take(6).map(|u| u.name.as_str()).collect();
            return Err(InputError::new("--pin", format!("`{pattern}` names no placement unit"))
                .at_key(pattern.as_str())
                .with_fix(format!("pin units by their names, e.g. {}", names.join(", "))));
        }
    }
    check_pin_together(built, &by_unit)?;
    if built.problem.ordered && !matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4) {
        check_pin_order(built, request, &by_unit)?;
    }
    Ok(by_unit.into_iter().map(|(u, (_, d))| (u, d)).collect())
}

/// `` `unit` (pinned to GPU 1 by `pattern`) ``, the pattern left out where it is the unit.
fn pinned_to(unit: &str, tier: Target, pattern: &str) -> String {
    if unit == pattern {
        format!("`{unit}` (pinned to {tier})")
    } else {
        format!("`{unit}` (pinned to {tier} by `{pattern}`)")
    }
}

/// How a device is written in `--pin`.
fn pin_device_arg(tier: Target) -> String {
    match tier {
        Target::Gpu(i) => i.to_string(),
        other => other.to_string(),
    }
}

/// Units that must share a device (a tied group) pinned to different devices.
fn check_pin_together(built: &Built, by_unit: &BTreeMap<usize, (&str, usize)>) -> Result<(), InputError> {
    let units = &built.problem.units;
    let devices = &built.problem.devices;
    for group in &built.problem.together {
        let pinned: Vec<(usize, &str, usize)> =
            group.iter().filter_map(|u| by_unit.get(u).map(|&(p, d)| (*u, p, d))).collect();
        if let Some(&(a, pa, da)) = pinned.first()
            && let Some(&(b, pb, db)) = pinned.iter().find(|&&(_, _, d)| d != da)
        {
            return Err(InputError::new(
                "--pin",
                format!(
                    "{} and {} hold tied weights, which the runtime loads on one device",
                    pinned_to(&units[a].name, devices[da].tier, pa),
                    pinned_to(&units[b].name, devices[db].tier, pb)
                ),
            )
            .at_key(pb)
            .with_fix(format!("pin both to one device, or keep only `{pa}`")));
        }
    }
    Ok(())
}

/// The layer-order rule of pipelines and llama.cpp: the runtime runs the units of an ordered
/// problem in forward order and the plan keeps their devices non-decreasing along that chain,
/// in the problem's device order (pipelines: the GPUs by index; llama.cpp: `cpu` first, as
/// `-ngl` keeps the first layers there). accelerate's pins leave the chain instead. A unit tied to an earlier one takes its
/// place. Refused: two pins out of that order, and a pin that leaves the units before it (or
/// after it) more bytes than the devices on that side can hold at all.
fn check_pin_order(
    built: &Built,
    request: &Request,
    by_unit: &BTreeMap<usize, (&str, usize)>,
) -> Result<(), InputError> {
    let units = &built.problem.units;
    let devices = &built.problem.devices;
    let position: Vec<Option<u32>> = (0..units.len())
        .map(|u| {
            units[u].order.or_else(|| {
                let group = built.problem.together.iter().find(|g| g.contains(&u))?;
                units[group[0]].order
            })
        })
        .collect();
    let rule = format!(
        "{} runs the layers in order, so the plan keeps each later layer on the same or a later device, \
         in the order {}",
        request.runtime.name(),
        device_list(devices)
    );
    let mut pinned: Vec<(u32, usize, &str, usize)> =
        by_unit.iter().filter_map(|(&u, &(p, d))| Some((position[u]?, u, p, d))).collect();
    pinned.sort_unstable();
    for w in pinned.windows(2) {
        let ((_, a, pa, da), (_, b, pb, db)) = (w[0], w[1]);
        if db < da {
            return Err(InputError::new(
                "--pin",
                format!(
                    "{} runs after {}: {rule}",
                    pinned_to(&units[b].name, devices[db].tier, pb),
                    pinned_to(&units[a].name, devices[da].tier, pa)
                ),
            )
            .at_key(pb)
            .with_fix(format!(
                "pin `{pb}` to {} or a later device, or `{pa}` to {} or an earlier one",
                devices[da].tier, devices[db].tier
            )));
        }
    }
    // Bytes each unit needs at least on the devices of its side: its resident bytes and its
    // peak (a unit on the host leaves its peak on the GPU that runs it, `offload_runs_on`).
    for &(at, u, pattern, d) in &pinned {
        let mut before = 0u64;
        let mut after = 0u64;
        for (v, unit) in units.iter().enumerate() {
            let Some(p) = position[v] else { continue };
            let count = u64::from(unit.count);
            if p <= at {
                before = before.saturating_add(count.saturating_mul(unit.resident_bytes + unit.peak_bytes));
            }
            if p >= at {
                // The peak leaves the side only for a host device run by an earlier GPU.
                let peak =
                    if built.problem.offload_runs_on.is_some_and(|g| g < d) { 0 } else { unit.peak_bytes };
                after = after.saturating_add(count.saturating_mul(unit.resident_bytes + peak));
            }
        }
        let room_before: u64 = devices[..=d].iter().map(|x| x.capacity_bytes).fold(0, u64::saturating_add);
        let room_after: u64 = devices[d..].iter().map(|x| x.capacity_bytes).fold(0, u64::saturating_add);
        let side = if before > room_before {
            Some(("before", before, room_before, &devices[..=d], "a later device"))
        } else if after > room_after {
            Some(("after", after, room_after, &devices[d..], "an earlier device"))
        } else {
            None
        };
        if let Some((side, need, room, span, instead)) = side {
            return Err(InputError::new(
                "--pin",
                format!(
                    "{}: it and every unit {side} it must sit on {}, with room for {}, and they \
                     need at least {}; {rule}",
                    pinned_to(&units[u].name, devices[d].tier, pattern),
                    device_list(span),
                    vramplan_profiles::units::format_bytes(room),
                    vramplan_profiles::units::format_bytes(need)
                ),
            )
            .at_key(pattern)
            .with_fix(format!("pin `{pattern}` to {instead}, or leave the pin out")));
        }
    }
    Ok(())
}
