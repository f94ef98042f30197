//! The result of simulating one step: per device, the three peak figures people measure, the
//! event where the peak happens, and the bytes by component at that moment.

use crate::engines::{llamacpp, vllm};
use crate::placement::Placement;
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
        Engine::Vllm { .. } => return vllm_estimate(model, hardware, workload),
        Engine::LlamaCpp { .. } => return llamacpp_estimate(model, hardware, workload),
        Engine::Transformers => {}
    }
    let program = crate::program::step_program(model, hardware, workload, placement);
    let capacity = |gpu: u32| {
        hardware.devices.get(gpu as usize).map_or(u64::MAX, |d| limit_bytes(d.usable_bytes(), headroom))
    };
    let runs = crate::timeline::replay(&program, capacity).devices;
    let mut devices = Vec::new();
    for (gpu, run) in runs {
        let Some(device) = hardware.devices.get(gpu as usize) else {
            return Err(InputError::new(
                "--device-map",
                format!("GPU {gpu} is not in the hardware profile `{}`", hardware.name),
            )
            .with_fix(format!("the profile has GPUs 0 to {}", hardware.devices.len().saturating_sub(1))));
        };
        // nvidia-smi counts the allocator's segments plus the CUDA context and the kernels it
        // loads, which PyTorch does not see.
        let outside_torch = device.context_reserve_bytes;
        let device_used = run.peak_reserved + outside_torch;
        let mut components = run.components;
        // Overhead: everything device-used holds beyond the live tensors at the peak (workspaces
        // allocated through PyTorch are already in `components.overhead`).
        components.overhead = device_used - components.tensors().min(device_used);
        let usable = device.usable_bytes();
        devices.push(DeviceEstimate {
            id: gpu,
            name: device.name.clone(),
            capacity_bytes: device.memory_bytes,
            usable_bytes: usable,
            peak_allocated_bytes: run.peak_allocated,
            peak_reserved_bytes: run.peak_reserved,
            device_used_bytes: device_used,
            peak_at: run.peak_at,
            steady_bytes: run.steady,
            components,
            fits: run.peak_reserved <= usable,
        });
    }
    Ok(finish(devices, None))
}

fn first_device(hardware: &HardwareProfile) -> Result<&vramplan_profiles::hardware::Device, InputError> {
    hardware.devices.first().ok_or_else(|| InputError::new(&hardware.name, "the profile has no GPU"))
}

/// vLLM: every rank of the tensor-parallel group holds the same budget.
fn vllm_estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
) -> Result<Estimate, InputError> {
    let tp = match workload.parallelism {
        Parallelism::Tensor { size } => size.max(1),
        _ => 1,
    };
    if tp as usize > hardware.devices.len() {
        return Err(InputError::new(
            "--parallel",
            format!(
                "tensor parallelism over {tp} GPUs, but `{}` has {}",
                hardware.name,
                hardware.devices.len()
            ),
        )
        .with_fix("use a profile with enough GPUs (e.g. `4xa100-80gb`) or a smaller tp"));
    }
    let mut devices = Vec::new();
    let mut capacity = u64::MAX;
    for device in hardware.devices.iter().take(tp as usize) {
        let b = vllm::budget(model, device, workload, tp)?;
        capacity = capacity.min(b.kv_capacity_tokens);
        let allocated = b.weights_bytes + b.activation_peak_bytes + b.kv_cache_bytes;
        let components = Components {
            weights: b.weights_bytes,
            activations: b.activation_peak_bytes,
            kv_cache: b.kv_cache_bytes,
            overhead: b.non_torch_bytes + b.cuda_graph_bytes,
            ..Components::default()
        };
        devices.push(DeviceEstimate {
            id: device.index,
            name: device.name.clone(),
            capacity_bytes: device.memory_bytes,
            usable_bytes: device.usable_bytes(),
            peak_allocated_bytes: allocated,
            peak_reserved_bytes: allocated,
            // vLLM takes `gpu_memory_utilization` of the total, plus its context and graphs.
            device_used_bytes: b.requested_bytes.max(allocated + components.overhead),
            peak_at: b.activation_peak_at.clone(),
            steady_bytes: b.weights_bytes + b.kv_cache_bytes,
            components,
            fits: b.fits,
        });
    }
    Ok(finish(devices, Some(capacity)))
}

/// llama.cpp: its CUDA buffers (model, KV cache, compute) on the first GPU.
fn llamacpp_estimate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
) -> Result<Estimate, InputError> {
    let device = first_device(hardware)?;
    let b = llamacpp::budget(model, device, workload)?;
    let allocated = b.gpu_bytes();
    let components = Components {
        weights: b.model_bytes_gpu,
        activations: b.compute_bytes,
        kv_cache: b.kv_bytes,
        overhead: device.context_reserve_bytes,
        ..Components::default()
    };
    let devices = vec![DeviceEstimate {
        id: device.index,
        name: device.name.clone(),
        capacity_bytes: device.memory_bytes,
        usable_bytes: device.usable_bytes(),
        peak_allocated_bytes: allocated,
        peak_reserved_bytes: allocated,
        device_used_bytes: allocated + device.context_reserve_bytes,
        peak_at: b.compute_peak_at.clone(),
        steady_bytes: b.model_bytes_gpu + b.kv_bytes,
        components,
        fits: b.fits,
    }];
    Ok(finish(devices, None))
}

fn finish(devices: Vec<DeviceEstimate>, kv_capacity_tokens: Option<u64>) -> Estimate {
    let peak_bytes = devices.iter().map(|d| d.device_used_bytes).max().unwrap_or(0);
    let fits = devices.iter().all(|d| d.fits);
    Estimate { devices, peak_bytes, fits, kv_capacity_tokens, warnings: Vec::new() }
}
