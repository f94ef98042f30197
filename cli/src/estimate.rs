//! `vramplan estimate MODEL --hardware HW [--workload FILE] [flags] [--device-map FILE] [--json]`:
//! the arguments every command that simulates shares ([`Inputs`], [`MapSource`]) as
//! `vramplan-api` requests, and the estimate printed as a table or JSON. Exit 0 when it fits, 1
//! when it does not.

use crate::NamingArg;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use vramplan_api::{DeviceMapSource, EstimateRequest, InputError};
use vramplan_sim::input::WorkloadFlags;

#[derive(Args, Debug)]
pub(crate) struct EstimateArgs {
    #[command(flatten)]
    inputs: Inputs,
    #[command(flatten)]
    map: MapSource,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Where the model is placed for a simulation: a device map, a plan file, or the default.
#[derive(Args, Debug)]
pub(crate) struct MapSource {
    /// An accelerate device_map JSON placing the model's modules (default: everything on GPU 0).
    #[arg(long, value_name = "FILE")]
    device_map: Option<PathBuf>,
    /// A plan written by `vramplan plan -o plan.yaml`: its device map, and its workload unless
    /// --workload is given (the flags still override).
    #[arg(long, value_name = "FILE", conflicts_with = "device_map")]
    plan: Option<PathBuf>,
    /// Module naming: transformers 5.x (default) or 4.x, as the device map uses.
    #[arg(long, value_enum, default_value_t = NamingArg::V5)]
    naming: NamingArg,
}

impl MapSource {
    /// The API's map source.
    pub(crate) fn request(&self) -> vramplan_api::MapSource {
        vramplan_api::MapSource {
            device_map: self.device_map.clone().map(DeviceMapSource::File),
            plan: self.plan.clone(),
            naming: self.naming.naming(),
        }
    }
}

/// What every command that simulates reads: the model, the hardware, and the workload (a file,
/// the flags over it).
#[derive(Args, Debug)]
pub(crate) struct Inputs {
    /// A built-in name (`mixtral-8x7b`), a config.json, a model folder, a custom YAML, a Hugging
    /// Face Hub id (`org/name[@revision]`, `org/name:Q4_K_M` for a GGUF file), or a GGUF file.
    pub model: String,
    /// A built-in profile (`t4x2`, `a100-80gb-x4`), a short form (`2xt4`) or a YAML file.
    #[arg(long)]
    pub hardware: String,
    /// A workload YAML file (docs/workloads.md); the workload flags override it.
    #[arg(long, value_name = "FILE")]
    pub workload: Option<PathBuf>,
    /// The workload flags (docs/workloads.md), declared once in `vramplan-sim`.
    #[command(flatten)]
    pub flags: WorkloadFlags,
    /// The activations your script measured (`vramplan validate --script FILE.py --trace-out
    /// FILE`), in place of declared or modelled ones: each module the run names that the model has
    /// keeps what it held for backward, per token of the run's batch (docs/validate-script.md).
    #[arg(long, value_name = "FILE")]
    pub activations: Option<PathBuf>,
    /// Ends the workload flags' help heading, so that the command's own options that follow
    /// are listed under "Options", not among the workload flags.
    #[command(flatten, next_help_heading = None::<&str>)]
    end_of_flags: EndOfFlags,
}

/// No arguments: see [`Inputs::end_of_flags`].
#[derive(Args, Debug)]
struct EndOfFlags {}

impl Inputs {
    /// The API's inputs.
    pub(crate) fn request(&self) -> vramplan_api::Inputs {
        vramplan_api::Inputs {
            model: crate::model_source(&self.model),
            hardware: self.hardware.clone(),
            workload: self.workload.clone(),
            flags: self.flags.clone(),
            activations: self.activations.clone(),
        }
    }
}

/// Runs `vramplan estimate`; the exit code is 0 when every device fits, 1 when one does not.
pub(crate) fn run(args: &EstimateArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let request = EstimateRequest { inputs: args.inputs.request(), map: args.map.request() };
    let result = vramplan_api::estimate(&request)?;
    let text = if args.json {
        result.to_json()
    } else {
        let loaded = &result.loaded;
        vramplan_profiles::model::generic::line(&loaded.model)
            + &vramplan_api::data_parallel_heading(&loaded.workload, &loaded.hardware)
            + &vramplan_reports::estimate_table(&result.estimate)
    };
    crate::print(out, &text)?;
    Ok(result.outcome().exit_code())
}
