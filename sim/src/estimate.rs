//! The result of simulating one step: per device, the three peak figures people measure, the
//! event where the peak happens, and the bytes by component at that moment.
//!
//! Under data parallelism (DDP, ZeRO, FSDP) every GPU of the profile is a rank running its own
//! step: each holds a replica (DDP) or its shard (ZeRO), so the estimate has one device per GPU
//! of the profile, each replayed on its own GPU and judged against that GPU's memory
//! ([`data_parallel_estimate`]).

use crate::placement::{Placement, Target};
use crate::workload::{Engine, Parallelism, Workload};
use serde::Serialize;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;

/// Bytes by component on one device at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Components {
    /// Parameters (and quantization constants) held on the device, plus autocast copies.
    pub weights: u64,
    /// Gradients of the trainable parameters.
    pub gradients: u64,
    /// Optimizer states and fp32 master weights.
    pub optimizer: u64,
    /// Activations kept for backward and transient workspace.
    pub activations: u64,
    /// The KV cache.
    pub kv_cache: u64,
    /// Logits, their fp32 upcast, the loss and their gradients.
    pub logits: u64,
    /// CUDA context, driver reserve, library workspaces and allocator slack.
    pub overhead: u64,
}

impl Components {
    /// Tensor bytes (everything but `overhead`).
    pub fn tensors(&self) -> u64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache + self.logits
    }

    /// The bytes of one component.
    pub fn get(&self, part: Part) -> u64 {
        match part {
            Part::Weights => self.weights,
            Part::Gradients => self.gradients,
            Part::Optimizer => self.optimizer,
            Part::Activations => self.activations,
            Part::KvCache => self.kv_cache,
            Part::Logits => self.logits,
            Part::Overhead => self.overhead,
        }
    }
}

/// One component of [`Components`], by name: a row of the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// [`Components::weights`].
    Weights,
    /// [`Components::gradients`].
    Gradients,
    /// [`Components::optimizer`].
    Optimizer,
    /// [`Components::activations`].
    Activations,
    /// [`Components::kv_cache`].
    KvCache,
    /// [`Components::logits`].
    Logits,
    /// [`Components::overhead`].
    Overhead,
}

impl Part {
    /// Every component, in the breakdown's order.
    pub const ALL: [Part; 7] = [
        Part::Weights,
        Part::Gradients,
        Part::Optimizer,
        Part::Activations,
        Part::KvCache,
        Part::Logits,
        Part::Overhead,
    ];
}

/// One device's simulated step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceEstimate {
    /// The GPU's index in the hardware profile.
    pub id: u32,
    /// Its name (`Tesla T4`).
    pub name: String,
    /// Total memory as `nvidia-smi` reports it.
    pub capacity_bytes: u64,
    /// Memory PyTorch can allocate: total less the driver and CUDA-context reserves.
    pub usable_bytes: u64,
    /// `torch.cuda.max_memory_allocated()`: live tensors at the peak.
    pub peak_allocated_bytes: u64,
    /// `torch.cuda.max_memory_reserved()`: the caching allocator's segments at the peak.
    pub peak_reserved_bytes: u64,
    /// What `nvidia-smi` shows: reserved + CUDA context + library workspaces outside PyTorch.
    pub device_used_bytes: u64,
    /// The event of the peak (`backward of model.layers.31`).
    pub peak_at: String,
    /// Live tensor bytes between steps (weights, optimizer states, persistent buffers).
    pub steady_bytes: u64,
    /// Bytes of the model's tensors the load puts on this GPU, as stored (weights as held,
    /// buffers, LoRA adapters; before the allocator's rounding): what `from_pretrained` and
    /// accelerate's dispatch place here under the map.
    pub loaded_bytes: u64,
    /// Components at the peak; `overhead` is device-used minus tensors.
    pub components: Components,
    /// Whether peak reserved stays within usable memory.
    pub fits: bool,
}

/// The whole estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Every used GPU's step.
    pub devices: Vec<DeviceEstimate>,
    /// The largest device-used figure.
    pub peak_bytes: u64,
    /// Whether every GPU fits.
    pub fits: bool,
    /// vLLM: tokens the paged KV cache holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    /// Odd choices for the hardware (bf16 on a T4, a sequence past the model's positions).
    pub warnings: Vec<String>,
}

/// Simulates `workload` for `model` placed on `hardware` by `placement`, and reports each used
/// device's peak: allocated, reserved, and device-used as `nvidia-smi` shows it.
pub fn estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
) -> Result<Estimate, InputError> {
    estimate_within(model, hardware, workload, placement, 0.0)
}

/// The memory a plan lets a device fill: `usable` × (1 − `headroom`), rounded down.
pub fn limit_bytes(usable: u64, headroom: f64) -> u64 {
    (usable as f64 * (1.0 - headroom.clamp(0.0, 1.0))).floor() as u64
}

/// As [`estimate`], on GPUs that hold only their [`limit_bytes`] under `headroom`: the caching
/// allocator returns its free segments once it would reserve past the limit, as it does at the
/// device's real capacity. A plan is judged by this replay.
pub fn estimate_within(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
    headroom: f64,
) -> Result<Estimate, InputError> {
    match workload.engine {
        Engine::Vllm { .. } => return crate::engines::estimate::vllm_estimate(model, hardware, workload),
        Engine::Sglang { .. } => return crate::engines::estimate::sglang_estimate(model, hardware, workload),
        Engine::LlamaCpp { .. } => {
            return crate::engines::estimate::llamacpp_estimate(model, hardware, workload, placement);
        }
        Engine::Transformers => {}
    }
    if is_data_parallel(workload) {
        return data_parallel_estimate(model, hardware, workload, placement, headroom);
    }
    let program = crate::program::step_program(model, hardware, workload, placement);
    let replay = crate::timeline::replay(&program, gpu_limits(hardware, headroom));
    replayed_estimate(hardware, replay.devices)
}

/// Each GPU's limit under `headroom` ([`limit_bytes`]), by its index in `hardware`.
pub(crate) fn gpu_limits(hardware: &HardwareProfile, headroom: f64) -> impl Fn(u32) -> u64 + '_ {
    move |gpu: u32| {
        hardware.devices.get(gpu as usize).map_or(u64::MAX, |d| limit_bytes(d.usable_bytes(), headroom))
    }
}

/// The estimate from each GPU's replay of one program on `hardware`.
pub(crate) fn replayed_estimate(
    hardware: &HardwareProfile,
    runs: std::collections::BTreeMap<u32, crate::timeline::DeviceRun>,
) -> Result<Estimate, InputError> {
    let mut devices = Vec::new();
    for (gpu, run) in runs {
        let Some(device) = hardware.devices.get(gpu as usize) else {
            return Err(InputError::new(
                "--device-map",
                format!("GPU {gpu} is not in the hardware profile `{}`", hardware.name),
            )
            .with_fix(format!("the profile has GPUs 0 to {}", hardware.devices.len().saturating_sub(1))));
        };
        devices.push(device_estimate(gpu, device, run));
    }
    Ok(finish(devices, None))
}

/// One GPU's figures from its replay.
fn device_estimate(
    gpu: u32,
    device: &vramplan_profiles::hardware::Device,
    run: crate::timeline::DeviceRun,
) -> DeviceEstimate {
    // nvidia-smi counts the allocator's segments plus the CUDA context and the kernels it
    // loads, which PyTorch does not see, and managed memory (paged optimizer states) as far as
    // it is resident: the driver pages it out rather than fail, so it fills what is left.
    let outside_torch = device.context_reserve_bytes;
    let device_used = run.peak_reserved + outside_torch;
    let resident_managed = run.managed.min(device.memory_bytes.saturating_sub(device_used));
    let device_used = device_used + resident_managed;
    let mut components = run.components;
    components.optimizer += resident_managed;
    // Overhead: everything device-used holds beyond the live tensors at the peak (workspaces
    // allocated through PyTorch are already in `components.overhead`).
    components.overhead = device_used - components.tensors().min(device_used);
    let usable = device.usable_bytes();
    DeviceEstimate {
        id: gpu,
        name: device.name.clone(),
        capacity_bytes: device.memory_bytes,
        usable_bytes: usable,
        peak_allocated_bytes: run.peak_allocated,
        peak_reserved_bytes: run.peak_reserved,
        device_used_bytes: device_used,
        peak_at: run.peak_at,
        steady_bytes: run.steady,
        loaded_bytes: run.loaded,
        components,
        fits: run.peak_reserved <= usable,
    }
}

/// Whether `workload` is data parallel under transformers: DDP, or ZeRO / FSDP, one rank per
/// GPU of the profile, each running the whole step on its own batch. (vLLM and llama.cpp place
/// the model themselves; tensor parallelism splits layers, not batches.)
pub fn is_data_parallel(workload: &Workload) -> bool {
    matches!(workload.engine, Engine::Transformers)
        && matches!(workload.parallelism, Parallelism::Ddp | Parallelism::Zero { .. })
}

/// Whether `placement` keeps a data-parallel replica whole: every entry names one and the same
/// GPU (each process loads the model whole on its own GPU, so a map for one rank is
/// `{"": rank}`), or there is no entry at all (a plan that needs no map). A placement that
/// spreads the model over several devices, or offloads part of it, does not.
pub fn keeps_replica_whole(placement: &Placement) -> bool {
    let mut targets = placement.entries().iter().map(|(_, t)| *t);
    match targets.next() {
        None => true,
        Some(first @ Target::Gpu(_)) => targets.all(|t| t == first),
        Some(_) => false,
    }
}

/// Data parallelism: every GPU of the profile is a rank that holds the model whole (DDP; its
/// ZeRO shard) on its own GPU and runs the step on its own micro-batch (`batch` is per rank, as
/// each process's DataLoader gives it). Each rank is replayed with the model on its GPU, under
/// that GPU's limit (`usable` × (1 − `headroom`)), and judged against its own memory: on a
/// profile of mixed GPUs the ranks hold the same tensors (ZeRO shards evenly, whatever each
/// GPU's size) and the smallest GPU decides. `placement` must keep the replica whole on one GPU
/// ([`keeps_replica_whole`]); which one does not matter, since each rank uses its own.
pub fn data_parallel_estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    placement: &Placement,
    headroom: f64,
) -> Result<Estimate, InputError> {
    if !keeps_replica_whole(placement) {
        return Err(InputError::new(
            "device map",
            "under data parallelism each process loads the whole model on its own GPU, and this \
             placement spreads it over several devices",
        )
        .with_fix("place the whole model on one GPU (`{\"\": 0}`), or leave the device map out"));
    }
    if hardware.devices.is_empty() {
        return Err(InputError::new(&hardware.name, "the profile has no GPU")
            .with_fix("give a profile with the GPUs the ranks run on (e.g. `--hardware 4xa10g`)"));
    }
    // Ranks on GPUs of the same kind and limit replay the same program: run each kind once.
    let mut runs: Vec<((u32, u64), crate::timeline::DeviceRun)> = Vec::new();
    let mut devices = Vec::new();
    for (rank, device) in hardware.devices.iter().enumerate() {
        let gpu = u32::try_from(rank).unwrap_or(u32::MAX);
        let limit = limit_bytes(device.usable_bytes(), headroom);
        let key = (device.compute_capability.major, limit);
        let run = match runs.iter().find(|(k, _)| *k == key) {
            Some((_, run)) => run.clone(),
            None => {
                let program =
                    crate::program::step_program(model, hardware, workload, &Placement::single(gpu));
                let run = crate::timeline::replay(&program, |_| limit).devices.remove(&gpu);
                // A model with nothing to place replays nothing: an empty run.
                let run = run.unwrap_or_else(|| crate::timeline::DeviceRun {
                    peak_allocated: 0,
                    peak_reserved: 0,
                    peak_at: "load".into(),
                    components: Components::default(),
                    steady: 0,
                    managed: 0,
                    loaded: 0,
                });
                runs.push((key, run.clone()));
                run
            }
        };
        devices.push(device_estimate(gpu, device, run));
    }
    Ok(finish(devices, None))
}

fn finish(devices: Vec<DeviceEstimate>, kv_capacity_tokens: Option<u64>) -> Estimate {
    let peak_bytes = devices.iter().map(|d| d.device_used_bytes).max().unwrap_or(0);
    let fits = devices.iter().all(|d| d.fits);
    Estimate { devices, peak_bytes, fits, kv_capacity_tokens, warnings: Vec::new() }
}
