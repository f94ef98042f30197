//! The plan validator: runs a plan's step program (`vramplan_sim::program`, the one list of
//! allocations the simulator replays) on a device and reports what happened there, beside the
//! prediction.
//!
//! Backends:
//! - `cuda` (`cuda/`): the program's allocations on real CUDA devices, through the
//!   simulator's model of PyTorch's caching allocator (`vramplan_sim::allocator`): each segment
//!   the model creates is taken from the driver (`cuMemAlloc`) and each it releases given back,
//!   so the driver's own count of used memory (`cuMemGetInfo`) is measured at every event. Beside
//!   them runs the compute — cuBLAS GEMMs and NVRTC kernels with the model's shapes, on views into
//!   the program's live allocations, each checking PyTorch's device rule. The driver, cuBLAS and
//!   NVRTC are loaded at run time: where one is missing, [`Unavailable`] names it.
//! - `torch` (`torch.rs`): the real runtime (transformers, accelerate, PEFT) run by a Python
//!   harness shipped in the binary, with the user's Python.
//! - `cpu` (`cpu/`): the model run with candle on the CPU at a reduced scale, on virtual
//!   devices placed as accelerate's `dispatch_model` places them, every operation checking
//!   PyTorch's device rule: the map, the hooks and the mismatch rules exercised where there is no
//!   GPU. It measures no memory; it says where the bytes went (`placed`).
//!
//! - `script` (`script.rs`): not a plan but the user's own script, run by the user's Python on
//!   fake CUDA devices shaped as the profile's GPUs (`vramplan validate --script`): PyTorch's
//!   device rule on every operation of the forward, the backward and the optimizer step, the
//!   memory of every fake device, and the rank-by-rank run of a `torchrun` job.
//!
//! Typed results only: the sentences are made by `vramplan-reports` and the CLI.

mod cpu;
mod cuda;
mod process;
mod script;
mod torch;

pub use cpu::CpuRequest;
pub use script::{
    ActivationsMismatch, DeviceMemory, Location, MeasuredActivations, Mismatch, RankRun, ScriptOutcome,
    ScriptRequest, ScriptValidation, declare_measured, file_name, run_script,
};
pub use torch::{TorchLora, TorchRequest};

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::program::StepProgram;
use vramplan_sim::workload::Workload;

/// Where a plan is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Real CUDA devices (cudarc, loaded at run time).
    Cuda,
    /// The real runtime (transformers, accelerate) through a Python harness.
    Torch,
    /// candle on the CPU at reduced scale, with virtual devices.
    Cpu,
}

impl Backend {
    /// The backend's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Torch => "torch",
            Backend::Cpu => "cpu",
        }
    }
}

/// Why a backend cannot run here: the validator's "no usable device" answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Unavailable {
    /// No CUDA driver library could be loaded.
    NoDriver {
        /// The library names tried, in order.
        tried: Vec<String>,
    },
    /// A CUDA library the `cuda` backend's compute needs (cuBLAS, NVRTC) could not be loaded.
    NoLibrary {
        /// The library as cudarc names it (`cublas`, `nvrtc`).
        library: String,
        /// The library names tried, in order.
        tried: Vec<String>,
    },
    /// The driver loaded but did not start (`cuInit` failed): its error.
    DriverFailed {
        /// The CUDA error, as the driver names it.
        error: String,
    },
    /// Fewer CUDA devices than the plan uses.
    TooFewDevices {
        /// GPUs the plan places something on (their indices in the profile).
        needed: Vec<u32>,
        /// CUDA devices visible here.
        found: u32,
    },
    /// The Python given for the `torch` backend did not run the harness.
    NoPython {
        /// The interpreter.
        python: String,
        /// What went wrong.
        error: String,
    },
    /// The Python runs, but lacks torch, transformers or accelerate.
    MissingLibrary {
        /// The interpreter.
        python: String,
        /// The import error.
        message: String,
    },
}

/// What one device held at one event of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The event, as the simulator names it (`backward of model.layers.3 (step 2)`).
    pub event: String,
    /// The plan's GPU index.
    pub device: u32,
    /// Bytes of live allocations (the allocator's count).
    pub allocated_bytes: u64,
    /// Bytes of segments held from the driver.
    pub reserved_bytes: u64,
    /// The driver's used bytes on the device (total − free, every process's).
    pub driver_used_bytes: u64,
}

/// One device's peaks over the run.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DevicePeaks {
    /// The plan's GPU index.
    pub device: u32,
    /// The CUDA device's name.
    pub name: String,
    /// Peak allocated bytes.
    pub allocated_bytes: u64,
    /// Peak reserved bytes.
    pub reserved_bytes: u64,
    /// Peak driver-used bytes.
    pub driver_used_bytes: u64,
    /// Driver-used bytes before the run took anything (the context and other processes).
    pub driver_used_before_bytes: u64,
    /// The event at which driver-used peaked.
    pub peak_event: String,
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    /// Every allocation of the program succeeded.
    Completed,
    /// The driver refused a segment: the event, the device, and the segment asked for.
    OutOfMemory {
        /// The event running when it happened.
        event: String,
        /// The plan's GPU index.
        device: u32,
        /// The segment's size.
        requested_bytes: u64,
        /// The device's free bytes then, as the driver counts them.
        free_bytes: u64,
    },
    /// The run stopped: `out_of_memory`, `device_mismatch`, `not_trained` (trainable weights
    /// no step changed) or `error` (any other failure, a CUDA library call's included).
    RuntimeError {
        /// Which.
        error: String,
        /// The innermost module running then (for `not_trained`, the first weight's module).
        module: String,
        /// The exception's message.
        message: String,
        /// The two devices a mismatch met (`cuda:1`, `cuda:0`), as PyTorch names them.
        devices: Vec<String>,
    },
}

/// What a run saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    /// The backend that ran it.
    pub backend: Backend,
    /// How it ended.
    pub outcome: Outcome,
    /// Per device used, its peaks.
    pub devices: Vec<DevicePeaks>,
    /// Every event's samples, in order (for timelines).
    pub samples: Vec<Sample>,
    /// Bytes of the model's tensors per device once placed (`cuda:0`, `cpu`, `meta` for
    /// weights accelerate streams), each storage once; empty where the backend does not say.
    pub placed: BTreeMap<String, u64>,
}

/// Runs `program` (made for `model`, `workload` and `hardware`) on the CUDA devices here: its
/// allocations, and its compute with the model's shapes. Whatever the run took is given back
/// before this returns, an out-of-memory or a device mismatch included. Plan GPU `i` is CUDA
/// device `i`; with `fold_devices`, device `i mod n` of the `n` here, each plan GPU still with its
/// own allocator and capacity (a plan for several GPUs checked on one; the driver's used bytes
/// are then the shared device's).
pub fn run_cuda(
    program: &StepProgram,
    model: &ModelDescription,
    workload: &Workload,
    hardware: &HardwareProfile,
    fold_devices: bool,
) -> Result<Validation, Unavailable> {
    cuda::run(program, model, workload, hardware, fold_devices)
}

/// Runs `request` with the real runtime, in the Python interpreter `python`.
pub fn run_torch(
    request: &TorchRequest,
    python: &str,
    time_limit: Duration,
) -> Result<Validation, Unavailable> {
    torch::run(request, python, time_limit)
}

/// Runs `request` with candle on the CPU, on virtual devices. `Err` carries candle's error
/// (a fault of this backend, not of the plan).
pub fn run_cpu(request: &CpuRequest) -> Result<Validation, String> {
    cpu::run(request).map_err(|e| e.to_string())
}

/// Whether a CUDA driver can be loaded here, without loading it for use: the probe `run_cuda` makes
/// first.
pub fn cuda_driver_present() -> Result<(), Unavailable> {
    cuda::driver_library().map(|_| ())
}
