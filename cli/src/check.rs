//! `vramplan check DEVICE_MAP MODEL --hardware HW [--workload FILE] [flags] [--target T] [--json]`:
//! the map and the inputs as a `vramplan-api` request; prints the findings and each device's
//! memory as a table or JSON. Exit 0 when the map is clean and fits, 1 when it has a mismatch
//! or a device runs out of memory, 2 for bad input.

use crate::estimate::Inputs;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use vramplan_api::{CheckRequest, DeviceMapSource, InputError};

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

/// Runs `vramplan check`.
pub(crate) fn run(args: &CheckArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let request = CheckRequest {
        device_map: DeviceMapSource::File(args.device_map.clone()),
        inputs: args.inputs.request(),
        target: args.target.clone(),
    };
    let result = vramplan_api::check(&request)?;
    let text = if args.json {
        result.to_json()
    } else {
        let (workload, hardware) = (&result.loaded.workload, &result.loaded.hardware);
        let heading = if result.estimate.is_some() {
            vramplan_api::data_parallel_heading(workload, hardware)
        } else {
            String::new()
        };
        heading
            + &vramplan_reports::check_table(
                result.runtime,
                result.estimate.as_ref(),
                result.memory_skipped.as_deref(),
                &result.findings,
            )
    };
    crate::print(out, &text)?;
    Ok(result.outcome().exit_code())
}
