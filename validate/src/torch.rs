//! The `torch` backend: the plan run by the real runtime. `harness/run_plan.py` (embedded in
//! the binary) is written to a temporary folder and run with the user's Python, which loads
//! the model from its config with random weights, places it with the plan's `device_map`
//! through accelerate's `dispatch_model`, applies the workload, runs the steps, and prints per
//! CUDA device `max_memory_allocated`, `max_memory_reserved` and the driver's used bytes, or the
//! exception that stopped it (out of memory, a device mismatch) with the module running then.

use crate::{Backend, DevicePeaks, Outcome, Unavailable, Validation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};
use vramplan_solver::export::DeviceMapEntries;

/// The harness, as shipped.
const HARNESS: &str = include_str!("../harness/run_plan.py");

/// What the harness runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TorchRequest {
    /// The model's raw `config.json`.
    pub config: serde_json::Value,
    /// Module → a GPU index, `"cpu"` or `"disk"`, as the plan writes it, in its order.
    pub device_map: DeviceMapEntries,
    /// `train` or `inference`.
    pub mode: String,
    /// Sequences per step.
    pub batch: u64,
    /// Tokens per sequence.
    pub seq: u64,
    /// `bf16`, `fp16` or `fp32`: the dtype the model is built in.
    pub dtype: String,
    /// LoRA's rank, alpha and the paths of the modules it adapts.
    pub lora: Option<TorchLora>,
    /// transformers' gradient checkpointing.
    pub grad_checkpointing: bool,
    /// Training steps (inference runs one prefill).
    pub steps: u32,
    /// Run on this many fake GPUs (`FakeTensorMode`: placement and the device rule, no memory);
    /// 0 for the real ones.
    pub fake_gpus: u32,
}

/// LoRA as PEFT's `LoraConfig` takes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TorchLora {
    /// `r`.
    pub rank: u64,
    /// `lora_alpha`.
    pub alpha: u64,
    /// `target_modules`: the full paths of the linear modules to adapt.
    pub targets: Vec<String>,
}

/// What the harness prints.
#[derive(Debug, Deserialize)]
struct Reply {
    outcome: String,
    #[serde(default)]
    needed: Vec<u32>,
    #[serde(default)]
    found: u32,
    #[serde(default)]
    message: String,
    #[serde(default)]
    module: String,
    #[serde(default)]
    devices: Vec<ReplyDevice>,
    #[serde(default)]
    mismatched: Vec<String>,
    #[serde(default)]
    placed: BTreeMap<String, u64>,
}

#[derive(Debug, Deserialize)]
struct ReplyDevice {
    device: u32,
    name: String,
    allocated_bytes: u64,
    reserved_bytes: u64,
    driver_used_bytes: u64,
}

/// Runs `request` with the Python interpreter `python`, stopped (with all it started) after
/// `time_limit`.
pub(crate) fn run(
    request: &TorchRequest,
    python: &str,
    time_limit: Duration,
) -> Result<Validation, Unavailable> {
    let failed = |error: String| Unavailable::NoPython { python: python.to_string(), error };
    let dir = std::env::temp_dir().join(format!("vramplan-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| failed(format!("cannot make {}: {e}", dir.display())))?;
    let result = (|| {
        let script = dir.join("run_plan.py");
        let input = dir.join("request.json");
        std::fs::write(&script, HARNESS).map_err(|e| failed(e.to_string()))?;
        let text = serde_json::to_string(request).map_err(|e| failed(e.to_string()))?;
        std::fs::write(&input, text).map_err(|e| failed(e.to_string()))?;
        let mut command = Command::new(python);
        command.arg(&script).arg(&input).env("HF_HUB_OFFLINE", "1").env("TRANSFORMERS_OFFLINE", "1");
        let finished = crate::process::run_bounded(command, Instant::now() + time_limit, &mut |_| {})
            .map_err(|e| failed(e.to_string()))?;
        let tail = finished.tail[finished.tail.len().saturating_sub(5)..].join("\n");
        if finished.timed_out {
            return Err(failed(format!(
                "it did not answer within the time limit of {} s (--time-limit) and was stopped, with all \
                 it started; its last lines: {tail}",
                time_limit.as_secs()
            )));
        }
        let reply: Reply = match finished.stdout.iter().rev().find_map(|l| serde_json::from_str(l).ok()) {
            Some(reply) => reply,
            None => {
                let status = finished.status.map_or_else(|| "no exit status".to_string(), |s| s.to_string());
                return Err(failed(format!("the harness printed no result ({status}): {tail}")));
            }
        };
        if reply.outcome == "no_device" {
            return Err(Unavailable::TooFewDevices { needed: reply.needed, found: reply.found });
        }
        if reply.outcome == "missing_library" {
            return Err(Unavailable::MissingLibrary { python: python.to_string(), message: reply.message });
        }
        Ok(validation(reply))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn validation(reply: Reply) -> Validation {
    let outcome = match reply.outcome.as_str() {
        "completed" => Outcome::Completed,
        kind => Outcome::RuntimeError {
            error: kind.to_string(),
            module: reply.module,
            message: reply.message,
            devices: reply.mismatched,
        },
    };
    Validation {
        backend: Backend::Torch,
        outcome,
        devices: reply
            .devices
            .into_iter()
            .map(|d| DevicePeaks {
                device: d.device,
                name: d.name,
                allocated_bytes: d.allocated_bytes,
                reserved_bytes: d.reserved_bytes,
                driver_used_bytes: d.driver_used_bytes,
                driver_used_before_bytes: 0,
                peak_event: String::new(),
            })
            .collect(),
        samples: Vec::new(),
        placed: reply.placed,
    }
}
