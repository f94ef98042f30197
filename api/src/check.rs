//! `check`: reads a device map written by anyone (accelerate's, a plan's, hand-made), finds the
//! device mismatches the target runtime would hit with it, and simulates each device's memory
//! under it when every tensor has a device. It is clean when it has no finding and fits.
//!
//! Under DDP and ZeRO-1/2 (`--parallel ddp`) the map is one rank's (`{"": 0}`: each process
//! loads the model whole on its own GPU): it must hold one entry, and every GPU of the profile
//! is checked as a rank with the replica on it, against its own memory.

use crate::estimate::DeviceMapSource;
use crate::inputs::{Inputs, Loaded, device_map_needs_one_copy, merge_warnings};
use crate::{InputError, Outcome};
use serde::Serialize;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ImportOptions, Naming};
use vramplan_sim::Placement;
use vramplan_sim::estimate::{DeviceEstimate, is_data_parallel, keeps_replica_whole};
use vramplan_sim::workload::{Parallelism, Workload};
use vramplan_solver::Runtime;
use vramplan_solver::check::{Finding, Rule, map_findings};

/// What `check` reads.
#[derive(Debug, Clone)]
pub struct CheckRequest {
    /// The map to check: module name → GPU index, "cpu" or "disk".
    pub device_map: DeviceMapSource,
    /// The model, hardware and workload.
    pub inputs: Inputs,
    /// The runtime that loads the map: accelerate (transformers 5.x names, default) |
    /// accelerate-v4 (4.x names) | pipeline | expert-parallel | llama.cpp.
    pub target: String,
}

/// What `check` found.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// The inputs as read; the warnings include the simulation's.
    pub loaded: Loaded,
    /// The runtime that loads the map.
    pub runtime: Runtime,
    /// The device mismatches the runtime would hit, by rule.
    pub findings: Vec<Finding>,
    /// Each device's memory under the map; `None` when it was not simulated.
    pub estimate: Option<vramplan_sim::Estimate>,
    /// Why memory was not simulated.
    pub memory_skipped: Option<String>,
}

/// What `check --json` prints.
#[derive(Serialize)]
struct CheckOutput<'a> {
    target: &'static str,
    /// Whether every device fits; `null` when memory was not simulated.
    fits: Option<bool>,
    /// Per device, as `estimate --json` gives them.
    devices: &'a [DeviceEstimate],
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_capacity_tokens: Option<u64>,
    findings: &'a [Finding],
    /// No finding, and every device fits.
    ok: bool,
    /// Why memory was not simulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_skipped: Option<&'a str>,
    warnings: &'a [String],
}

impl CheckResult {
    /// Whether every device fits; `None` when memory was not simulated.
    pub fn fits(&self) -> Option<bool> {
        self.estimate.as_ref().map(|e| e.fits)
    }

    /// No finding, and no device runs out of memory.
    pub fn ok(&self) -> bool {
        self.findings.is_empty() && self.fits() != Some(false)
    }

    /// Clean, or not.
    pub fn outcome(&self) -> Outcome {
        Outcome::of(self.ok())
    }

    /// What `check --json` prints.
    pub fn to_json(&self) -> String {
        crate::json_text(&CheckOutput {
            target: self.runtime.name(),
            fits: self.fits(),
            devices: self.estimate.as_ref().map_or(&[], |e| e.devices.as_slice()),
            kv_capacity_tokens: self.estimate.as_ref().and_then(|e| e.kv_capacity_tokens),
            findings: &self.findings,
            ok: self.ok(),
            memory_skipped: self.memory_skipped.as_deref(),
            warnings: &self.loaded.warnings,
        })
    }
}

/// `vramplan check`: the map's findings, and its memory.
pub fn check(request: &CheckRequest) -> Result<CheckResult, InputError> {
    let runtime = Runtime::parse(&request.target)?;
    let Loaded { model, hardware, workload, mut warnings } = request.inputs.load(runtime.naming(), None)?;
    let data_parallel = is_data_parallel(&workload);
    refuse_parallelism(request, &workload, runtime)?;
    let entries = request
        .device_map
        .read(&model, &hardware)
        .map_err(|e| with_naming_hint(e, request, runtime, &hardware))?;
    let findings = map_findings(&model, &entries, runtime, &workload, hardware.devices.len());
    let placement = Placement::from_entries(entries);
    let memory_skipped = findings.iter().find(|f| f.rule == Rule::Uncovered).map(|f| {
        format!(
            "the map leaves {} on no device, so it does not load (see `uncovered` below)",
            ticked_short(&f.modules)
        )
    });
    let memory_skipped = memory_skipped.or_else(|| {
        (data_parallel && !keeps_replica_whole(&placement)).then(|| {
            "every rank would load its copy onto the map's devices, and a data-parallel replica is simulated \
             whole on each rank's own GPU (see `data-parallel-map` below)"
                .to_string()
        })
    });
    let estimate = match memory_skipped {
        Some(_) => None,
        None => {
            let mut estimate = vramplan_sim::estimate(&model, &hardware, &workload, &placement)?;
            merge_warnings(&mut warnings, std::mem::take(&mut estimate.warnings));
            estimate.warnings = warnings.clone();
            Some(estimate)
        }
    };
    Ok(CheckResult {
        loaded: Loaded { model, hardware, workload, warnings },
        runtime,
        findings,
        estimate,
        memory_skipped,
    })
}

/// Refuses the parallelisms a device map does not describe: tensor parallelism (and any under
/// vLLM or llama.cpp, which place the model themselves), ZeRO-3 / FSDP (they shard the weights
/// as they load them, and transformers refuses a map under DeepSpeed ZeRO-3:
/// `check_and_set_device_map`, "DeepSpeed Zero-3 is not compatible with passing a
/// `device_map`"), and a target that splits the model under DDP or ZeRO-1/2. DDP and ZeRO-1/2
/// take a map of one rank's replica: each rank is checked with the model on its own GPU.
fn refuse_parallelism(
    request: &CheckRequest,
    workload: &Workload,
    runtime: Runtime,
) -> Result<(), InputError> {
    let flag = vramplan_solver::plan::parallel_flag(workload.parallelism);
    match workload.parallelism {
        Parallelism::Single => Ok(()),
        Parallelism::Zero { stage: 3, .. } if is_data_parallel(workload) => Err(InputError::new(
            "--parallel",
            format!(
                "--parallel {flag} (ZeRO-3, FSDP full shard) shards the weights as they load, with no device map: \
                 transformers refuses one under DeepSpeed ZeRO-3 (`DeepSpeed Zero-3 is not compatible with \
                 passing a device_map`)"
            ),
        )
        .with_fix(format!(
            "estimate each rank without a map: `vramplan estimate {} --hardware {} --parallel {flag}` with the \
             same workload flags",
            request.inputs.model.spec(),
            request.inputs.hardware
        ))),
        _ if is_data_parallel(workload) => match runtime {
            Runtime::Accelerate | Runtime::AccelerateV4 => Ok(()),
            other => Err(InputError::new(
                "--target",
                format!(
                    "--target {} splits the model over GPUs, and under --parallel {flag} every rank loads it \
                     whole on its own GPU",
                    other.name()
                ),
            )
            .with_fix(format!(
                "check the map with `--target accelerate`, or use `--parallel single` for a {} map",
                other.name()
            ))),
        },
        _ => Err(device_map_needs_one_copy("--parallel", "leave out --parallel, or use `--parallel single`")),
    }
}

/// A map that does not read under the target's module naming but reads under the other one
/// was written for the other transformers version: says so in the fix.
fn with_naming_hint(
    err: InputError,
    request: &CheckRequest,
    runtime: Runtime,
    hardware: &HardwareProfile,
) -> InputError {
    let (other_naming, other_target, version) = match runtime {
        Runtime::AccelerateV4 => (Naming::V5, Runtime::Accelerate, "5.x"),
        Runtime::Accelerate => (Naming::V4, Runtime::AccelerateV4, "4.x"),
        _ => return err,
    };
    let reads_otherwise = request
        .inputs
        .model
        .load(ImportOptions { naming: other_naming })
        .ok()
        .filter(|other| request.device_map.read(other, hardware).is_ok())
        .is_some();
    if !reads_otherwise {
        return err;
    }
    err.with_fix(format!(
        "these are transformers {version} module names: check the map with `--target {}`",
        other_target.name()
    ))
}

/// The first few names ticked, then how many more.
fn ticked_short(names: &[String]) -> String {
    let shown: Vec<String> = names.iter().take(3).map(|n| format!("`{n}`")).collect();
    let more = names.len().saturating_sub(shown.len());
    shown.join(", ") + &if more > 0 { format!(" and {more} more") } else { String::new() }
}
