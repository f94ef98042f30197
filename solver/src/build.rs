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

use crate::problem::{Device, Problem, Tier, Unit};
use crate::runtime::Runtime;
use std::collections::BTreeMap;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, ModuleKind};
use vramplan_sim::charges::{self, UnitRole};
use vramplan_sim::engines::{gguf, llamacpp};
use vramplan_sim::placement::covers;
use vramplan_sim::workload::{Mode, Workload};

/// How many load classes the experts of one layer are grouped into under `--expert-load`.
const LOAD_CLASSES: usize = 8;

/// What the caller asks of the plan beyond model, hardware and workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub runtime: Runtime,
    /// Share of each GPU's usable memory kept free (0.10 = 10 %).
    pub headroom: f64,
    /// `(module pattern, device)` pins, as `--pin` gives them (see [`parse_pin`]).
    pub pins: Vec<(String, Tier)>,
    /// Allow the CPU and disk tiers (inference under accelerate; llama.cpp's CPU layers).
    pub offload: bool,
    pub min_devices: bool,
    /// Tokens routed to each expert, per MoE layer path (`--expert-load`).
    pub expert_load: BTreeMap<String, Vec<f64>>,
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
    Ok(built)
}

/// The GPUs of the profile: capacity after headroom and the cuBLAS workspaces (plus `fixed`),
/// interchangeable devices sharing a class.
fn gpu_devices(hardware: &HardwareProfile, headroom: f64, fixed: u64) -> Vec<Device> {
    let mut classes: Vec<(String, u64, u64)> = Vec::new();
    hardware
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let workspace = charges::workspace_bytes(d.compute_capability.major);
            let fixed_bytes = workspace + fixed;
            let limit = (d.usable_bytes() as f64 * (1.0 - headroom)).floor() as u64;
            let key = (d.name.clone(), d.memory_bytes, u64::from(d.node));
            let class = classes.iter().position(|c| *c == key).unwrap_or_else(|| {
                classes.push(key);
                classes.len() - 1
            }) as u32;
            let next = hardware.devices.get(i + 1).map(|n| n.index).unwrap_or(hardware.devices[0].index);
            Device {
                name: format!("GPU {} ({})", d.index, d.name),
                tier: Tier::Gpu(d.index),
                capacity_bytes: limit.saturating_sub(fixed_bytes),
                fixed_bytes,
                class,
                link_bytes_per_s: hardware.link_bandwidth(d.index, next),
            }
        })
        .collect()
}

/// The host tiers: CPU RAM (of the first node) and disk, when the profile gives them.
fn host_devices(hardware: &HardwareProfile, first_class: u32) -> Vec<Device> {
    let host = hardware.nodes.first().map(|n| n.host).unwrap_or_default();
    let pcie = hardware.devices.first().map_or(0, |d| d.pcie_bandwidth_bytes_per_s());
    let mut out = vec![Device {
        name: "cpu".into(),
        tier: Tier::Cpu,
        capacity_bytes: host.ram_bytes.unwrap_or(64 << 30),
        fixed_bytes: 0,
        class: first_class,
        link_bytes_per_s: pcie,
    }];
    out.push(Device {
        name: "disk".into(),
        tier: Tier::Disk,
        // accelerate puts no cap on disk; where the profile does not say, 4 TiB (a finite figure
        // keeps the ILP's coefficients in a range HiGHS handles well).
        capacity_bytes: host.disk_bytes.unwrap_or(4 << 40),
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
    let mut devices = gpu_devices(hardware, request.headroom, 0);
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
            peak_bytes: kv_per_layer,
            transient_bytes: 0,
            order: Some(2 * l as u32),
            handoff_bytes: 0,
            load: 0.0,
            gpu_only: false,
        });
        sources.push(UnitSource::LlamaLayer { layer: l });
        if experts[l] > 0 {
            units.push(Unit {
                name: format!("blk.{l}.ffn_*_exps"),
                count: 1,
                resident_bytes: experts[l],
                peak_bytes: 0,
                transient_bytes: 0,
                order: None,
                handoff_bytes: 0,
                load: 0.0,
                gpu_only: false,
            });
            sources.push(UnitSource::LlamaExperts { layer: l });
        }
    }
    units.push(Unit {
        name: "output".into(),
        count: 1,
        resident_bytes: output,
        peak_bytes: 0,
        transient_bytes: 0,
        order: Some(2 * layers as u32),
        handoff_bytes: 0,
        load: 0.0,
        gpu_only: true,
    });
    sources.push(UnitSource::LlamaOutput);
    // Every GPU holding layers allocates a compute buffer of the graph's size.
    let gpus = gpu_devices(hardware, request.headroom, budget.compute_bytes);
    let mut devices = Vec::new();
    if request.offload {
        let next = gpus.iter().map(|d| d.class).max().unwrap_or(0) + 1;
        devices.extend(host_devices(hardware, next).into_iter().filter(|d| d.tier == Tier::Cpu));
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
        let loads = request.expert_load.get(&c.path).or_else(|| request.expert_load.get(&experts_path));
        for (experts, load) in load_classes(moe.experts, loads) {
            units.push(Unit {
                name: format!("{experts_path}[{}]", describe_indices(&experts)),
                count: experts.len() as u32,
                resident_bytes: per_expert_weights + per_expert_state,
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
    let devices = gpu_devices(hardware, request.headroom, fixed);
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
    })
}

/// The routed-experts module inside block `block` and its parameter count.
fn experts_of(model: &ModelDescription, block: &str) -> Option<(String, u64)> {
    let mut found = None;
    model.root.find(block)?.visit(&mut |m| {
        if found.is_none() && matches!(m.kind, ModuleKind::Experts { .. }) {
            found = Some((m.path.clone(), m.params()));
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
/// (`model.layers.0-3`), to a GPU index, `cpu` or `disk`.
pub fn parse_pin(text: &str) -> Result<(String, Tier), InputError> {
    let fix = "write `--pin lm_head=0` or `--pin 'model.layers.0-3=cpu'`";
    let (pattern, device) = text
        .rsplit_once('=')
        .ok_or_else(|| InputError::new("--pin", format!("`{text}` has no `=DEVICE`")).with_fix(fix))?;
    let tier = match device.trim() {
        "cpu" => Tier::Cpu,
        "disk" => Tier::Disk,
        d => Tier::Gpu(d.trim_start_matches("cuda:").parse().map_err(|_| {
            InputError::new("--pin", format!("`{d}` is not a GPU index, `cpu` or `disk`")).with_fix(fix)
        })?),
    };
    Ok((pattern.trim().to_string(), tier))
}

/// The paths a pin pattern names: itself, or `prefix.A-B` expanded to `prefix.A` … `prefix.B`.
fn expand_pattern(pattern: &str) -> Vec<String> {
    if let Some((prefix, range)) = pattern.rsplit_once('.')
        && let Some((a, b)) = range.split_once('-')
        && let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>())
    {
        return (a.min(b)..=a.max(b)).map(|i| format!("{prefix}.{i}")).collect();
    }
    vec![pattern.to_string()]
}

fn resolve_pins(built: &Built, request: &Request) -> Result<Vec<(usize, usize)>, InputError> {
    let mut pins = Vec::new();
    for (pattern, tier) in &request.pins {
        let device = built.problem.devices.iter().position(|d| d.tier == *tier).ok_or_else(|| {
            InputError::new(
                "--pin",
                format!("`{pattern}` is pinned to {tier:?}, which this plan has no place for"),
            )
            .with_fix("pin to a GPU of the profile (0, 1, …), or to `cpu`/`disk` for inference with offload")
        })?;
        let mut matched = false;
        for path in expand_pattern(pattern) {
            for (u, unit) in built.problem.units.iter().enumerate() {
                if unit.name == path || unit.name.starts_with(&format!("{path}.")) {
                    pins.push((u, device));
                    matched = true;
                }
            }
        }
        if !matched {
            let names: Vec<&str> = built.problem.units.iter().take(6).map(|u| u.name.as_str()).collect();
            return Err(InputError::new("--pin", format!("`{pattern}` names no placement unit"))
                .with_fix(format!("pin units by their names, e.g. {}", names.join(", "))));
        }
    }
    Ok(pins)
}
