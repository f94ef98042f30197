//! The result of simulating one step: per device, the three peak figures people measure, the
//! event where the peak happens, and the bytes by component at that moment.

use crate::placement::Placement;
use crate::workload::Workload;
use serde::Serialize;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;

/// Bytes by component on one device at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Components {
    /// Parameters (and quantization constants) held on the device, plus autocast copies.
    pub weights: u64,
    pub gradients: u64,
    /// Optimizer states and fp32 master weights.
    pub optimizer: u64,
    /// Activations kept for backward and transient workspace.
    pub activations: u64,
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
    pub id: u32,
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
    pub fits: bool,
}

/// The whole estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    pub devices: Vec<DeviceEstimate>,
    /// The largest device-used figure.
    pub peak_bytes: u64,
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
    let targets = crate::closed_form::lora_targets(model, workload);
    let runs = crate::timeline::simulate(model, hardware, workload, placement, &targets);
    let mut devices = Vec::new();
    for (gpu, run) in runs {
        let Some(device) = hardware.devices.get(gpu as usize) else {
            return Err(InputError::new(
                "--device-map",
                format!("GPU {gpu} is not in the hardware profile `{}`", hardware.name),
            )
            .with_fix(format!("the profile has GPUs 0 to {}", hardware.devices.len().saturating_sub(1))));
        };
        // nvidia-smi counts the allocator's segments plus the CUDA context, kernels and the
        // driver's own reserve, none of which PyTorch sees.
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
    let peak_bytes = devices.iter().map(|d| d.device_used_bytes).max().unwrap_or(0);
    let fits = devices.iter().all(|d| d.fits);
    Ok(Estimate { devices, peak_bytes, fits, kv_capacity_tokens: None, warnings: Vec::new() })
}
