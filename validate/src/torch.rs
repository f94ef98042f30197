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
use vramplan_solver::export::{DeviceMapEntries, PlanTarget};

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
    /// Every CUDA device the run saw; absent only from the answers given before a run
    /// (`no_device`, `missing_library`).
    devices: Option<Vec<ReplyDevice>>,
    #[serde(default)]
    mismatched: Vec<String>,
    /// Bytes of the model's tensors per device they ended on (`cuda:0`, `cpu`, `meta`); absent
    /// only before a run.
    placed: Option<BTreeMap<String, u64>>,
}

/// The outcomes the harness reports after a run.
const RUN_OUTCOMES: [&str; 5] = ["completed", "not_trained", "out_of_memory", "device_mismatch", "error"];

/// The harness's answer checked before it is believed: a known outcome, the exit status the
/// harness gives it (0 after a run), every field a run reports, each device once with peak
/// allocated within peak reserved, and the modules placed only on GPUs the plan names.
fn checked(reply: Reply, exit: Option<i32>, request: &TorchRequest) -> Result<Reply, String> {
    if !RUN_OUTCOMES.contains(&reply.outcome.as_str()) {
        return Err(format!("it answered an unknown outcome `{}`", reply.outcome));
    }
    if exit != Some(0) {
        let status = exit.map_or_else(
            || "no exit status (killed by a signal)".to_string(),
            |c| format!("exit status {c}"),
        );
        return Err(format!("it answered `{}` and then ended with {status}", reply.outcome));
    }
    let (Some(devices), Some(placed)) = (&reply.devices, &reply.placed) else {
        return Err(format!("its `{}` answer lacks `devices` or `placed`", reply.outcome));
    };
    let mut seen = std::collections::BTreeSet::new();
    for d in devices {
        if !seen.insert(d.device) {
            return Err(format!("it reported GPU {} twice", d.device));
        }
        if d.allocated_bytes > d.reserved_bytes {
            return Err(format!("GPU {}'s peak allocated bytes exceed its peak reserved bytes", d.device));
        }
    }
    let planned: std::collections::BTreeSet<u32> = request
        .device_map
        .0
        .iter()
        .filter_map(|(_, t)| match t {
            PlanTarget::Gpu(g) => Some(*g),
            PlanTarget::Host(h) => match vramplan_sim::Target::parse_string(h, u32::MAX) {
                Ok(vramplan_sim::Target::Gpu(g)) => Some(g),
                _ => None,
            },
        })
        .collect();
    // The model's tensors on the plan's GPUs, or off them (`cpu`; `meta` for offloaded weights).
    for device in placed.keys() {
        let on_plan = match device.strip_prefix("cuda:").map(str::parse::<u32>) {
            Some(Ok(gpu)) => planned.contains(&gpu),
            Some(Err(_)) => false,
            None => matches!(device.as_str(), "cpu" | "meta" | "disk"),
        };
        if !on_plan {
            return Err(format!("it placed tensors on `{device}`, which the plan does not use"));
        }
    }
    Ok(reply)
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
        let exit = finished.status.and_then(|s| s.code());
        let reply = checked(reply, exit, request).map_err(|why| {
            failed(format!("the harness's answer cannot be right: {why}; its last lines: {tail}"))
        })?;
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
            .unwrap_or_default()
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
        placed: reply.placed.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(map: &str) -> TorchRequest {
        TorchRequest {
            config: serde_json::json!({}),
            device_map: serde_json::from_str(map).expect("a map"),
            mode: "inference".into(),
            batch: 1,
            seq: 8,
            dtype: "bf16".into(),
            lora: None,
            grad_checkpointing: false,
            steps: 1,
            fake_gpus: 0,
        }
    }

    fn reply(text: &str) -> Reply {
        serde_json::from_str(text).expect("a reply")
    }

    const GOOD: &str = r#"{"outcome": "completed", "placed": {"cuda:0": 10, "cuda:1": 5, "meta": 3},
        "devices": [{"device": 0, "name": "T4", "allocated_bytes": 1, "reserved_bytes": 2, "driver_used_bytes": 3},
                    {"device": 1, "name": "T4", "allocated_bytes": 1, "reserved_bytes": 2, "driver_used_bytes": 3}]}"#;

    #[test]
    fn a_consistent_answer_is_believed() {
        let map = request(r#"{"model.embed_tokens": 0, "model.layers.0": "cuda:1", "lm_head": "cpu"}"#);
        assert!(checked(reply(GOOD), Some(0), &map).is_ok());
    }

    #[test]
    fn an_answer_that_cannot_be_right_is_refused() {
        let map = request(r#"{"model.embed_tokens": 0, "model.layers.0": 1}"#);
        let why = |text: &str, exit: Option<i32>| checked(reply(text), exit, &map).expect_err(text);
        assert!(why(GOOD, Some(1)).contains("exit status 1"));
        assert!(why(GOOD, None).contains("signal"));
        assert!(why(&GOOD.replace("completed", "finished"), Some(0)).contains("unknown outcome `finished`"));
        assert!(why(r#"{"outcome": "completed", "placed": {}}"#, Some(0)).contains("lacks `devices`"));
        assert!(why(&GOOD.replace("\"device\": 1", "\"device\": 0"), Some(0)).contains("GPU 0 twice"));
        assert!(
            why(&GOOD.replacen("\"allocated_bytes\": 1", "\"allocated_bytes\": 9", 1), Some(0))
                .contains("exceed")
        );
        assert!(why(&GOOD.replace("cuda:1", "cuda:7"), Some(0)).contains("`cuda:7`"));
    }
}
