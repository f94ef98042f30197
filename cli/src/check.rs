//! `vramplan check DEVICE_MAP MODEL --hardware HW [--workload FILE] [flags] [--target T] [--json]`:
//! reads a device map written by anyone (accelerate's, a plan's, hand-made), finds the device
//! mismatches the target runtime would hit with it, simulates each device's memory under it
//! when every tensor has a device, and prints the table or the JSON. Exit 0 when the map is
//! clean and fits, 1 when it has a mismatch or a device runs out of memory, 2 for bad input.
//!
//! Under DDP and ZeRO-1/2 (`--parallel ddp`) the map is one rank's (`{"": 0}`: each process
//! loads the model whole on its own GPU): it must hold one entry, and every GPU of the profile
//! is checked as a rank with the replica on it, against its own memory.

use crate::estimate::{Inputs, Loaded, data_parallel_heading, device_map_needs_one_copy, merge_warnings};
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming};
use vramplan_sim::estimate::{DeviceEstimate, is_data_parallel, keeps_replica_whole};
use vramplan_sim::workload::{Parallelism, Workload};
use vramplan_sim::{Placement, device_map};
use vramplan_solver::Runtime;
use vramplan_solver::check::{Finding, Rule, map_findings};

#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    /// An accelerate device_map JSON: module name → GPU index, "cpu" or "disk".
    device_map: PathBuf,
    #[command(flatten)]
    inputs: Inputs,
    /// The runtime that loads the map: accelerate (transformers 5.x names) | accelerate-v4 (4.x
    /// names) | pipeline | expert-parallel | llama.cpp.
    #[arg(long, default_value = "accelerate")]
    target: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
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

/// Runs `vramplan check`.
pub(crate) fn run(args: &CheckArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let runtime = Runtime::parse(&args.target)?;
    let Loaded { model, hardware, workload, mut warnings } = args.inputs.load(runtime.naming(), None)?;
    let data_parallel = is_data_parallel(&workload);
    refuse_parallelism(args, &workload, runtime)?;
    let entries = device_map::read_device_map(&args.device_map, &model, &hardware)
        .map_err(|e| with_naming_hint(e, args, runtime, &hardware))?;
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
    let fits = estimate.as_ref().map(|e| e.fits);
    let ok = findings.is_empty() && fits != Some(false);
    let text = if args.json {
        crate::json_text(&CheckOutput {
            target: runtime.name(),
            fits,
            devices: estimate.as_ref().map_or(&[], |e| e.devices.as_slice()),
            kv_capacity_tokens: estimate.as_ref().and_then(|e| e.kv_capacity_tokens),
            findings: &findings,
            ok,
            memory_skipped: memory_skipped.as_deref(),
            warnings: &warnings,
        })
    } else {
        let heading =
            if estimate.is_some() { data_parallel_heading(&workload, &hardware) } else { String::new() };
        heading
            + &vramplan_reports::check_table(runtime, estimate.as_ref(), memory_skipped.as_deref(), &findings)
    };
    crate::print(out, &text)?;
    Ok(if ok { 0 } else { crate::EXIT_NEGATIVE })
}

/// Refuses the parallelisms a device map does not describe: tensor parallelism (and any under
/// vLLM or llama.cpp, which place the model themselves), ZeRO-3 / FSDP (they shard the weights
/// as they load them, and transformers refuses a map under DeepSpeed ZeRO-3:
/// `check_and_set_device_map`, "DeepSpeed Zero-3 is not compatible with passing a
/// `device_map`"), and a target that splits the model under DDP or ZeRO-1/2. DDP and ZeRO-1/2
/// take a map of one rank's replica: each rank is checked with the model on its own GPU.
fn refuse_parallelism(args: &CheckArgs, workload: &Workload, runtime: Runtime) -> Result<(), InputError> {
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
            args.inputs.model, args.inputs.hardware
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
            .with_fix(format!("check the map with `--target accelerate`, or use `--parallel single` for a {} map", other.name()))),
        },
        _ => Err(device_map_needs_one_copy("--parallel", "leave out --parallel, or use `--parallel single`")),
    }
}

/// A map that does not read under the target's module naming but reads under the other one
/// was written for the other transformers version: says so in the fix.
fn with_naming_hint(
    err: InputError,
    args: &CheckArgs,
    runtime: Runtime,
    hardware: &hardware::HardwareProfile,
) -> InputError {
    let (other_naming, other_target, version) = match runtime {
        Runtime::AccelerateV4 => (Naming::V5, Runtime::Accelerate, "5.x"),
        Runtime::Accelerate => (Naming::V4, Runtime::AccelerateV4, "4.x"),
        _ => return err,
    };
    let reads_otherwise = model::load(&args.inputs.model, ImportOptions { naming: other_naming })
        .ok()
        .filter(|other: &ModelDescription| {
            device_map::read_device_map(&args.device_map, other, hardware).is_ok()
        })
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
