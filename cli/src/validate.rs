//! `vramplan validate PLAN [--backend cuda|torch|cpu] [--json]`: runs a plan written by
//! `vramplan plan -o plan.yaml` (its model, hardware, target, workload and device map) on a
//! backend, after `check`'s static rules, and prints the prediction beside what the run
//! measured. Exit 0 when every allocation of the step succeeded; 1 when the static check finds
//! a mismatch (nothing is allocated then) or the run runs out of memory; 2 for bad input; 3 when
//! the backend cannot run here (no CUDA driver, too few devices), with what is missing.

use crate::estimate::held_by_runtime;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::estimate::{DeviceEstimate, is_data_parallel};
use vramplan_sim::program::step_program;
use vramplan_sim::{Placement, input};
use vramplan_solver::Runtime;
use vramplan_solver::check::{Finding, check_device_map, offloaded_in_training};
use vramplan_solver::export::read_plan_file;
use vramplan_validate::{Backend, Unavailable, Validation};

/// Exit code when the backend has no usable device here.
pub const EXIT_NO_DEVICE: i32 = 3;

#[derive(Args, Debug)]
pub(crate) struct ValidateArgs {
    /// A plan written by `vramplan plan -o plan.yaml`.
    plan: PathBuf,
    /// Where to run it: cuda (real devices), torch (the real runtime), cpu (candle, reduced
    /// scale).
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda)]
    backend: BackendArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum BackendArg {
    Cuda,
    Torch,
    Cpu,
}

impl BackendArg {
    fn backend(self) -> Backend {
        match self {
            BackendArg::Cuda => Backend::Cuda,
            BackendArg::Torch => Backend::Torch,
            BackendArg::Cpu => Backend::Cpu,
        }
    }
}

/// What `validate --json` prints.
#[derive(Serialize)]
struct ValidateOutput<'a> {
    /// The static check's findings (nothing ran when there is one).
    findings: &'a [Finding],
    /// The prediction per device, as `estimate --json` gives it.
    #[serde(skip_serializing_if = "Option::is_none")]
    predicted: Option<&'a [DeviceEstimate]>,
    /// What the run measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<&'a Validation>,
    /// Why the backend could not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable: Option<&'a Unavailable>,
    /// No finding, and the run completed.
    ok: bool,
}

/// Runs `vramplan validate`.
pub(crate) fn run(args: &ValidateArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, InputError> {
    let origin = args.plan.display().to_string();
    let plan = read_plan_file(&args.plan)?;
    let runtime = Runtime::parse(&plan.target).map_err(|e| InputError::new(&origin, e.to_string()))?;
    let model = model::load(&plan.model, ImportOptions { naming: runtime.naming() })?;
    let hardware = hardware::load(&plan.hardware)?;
    let workload = plan.workload.clone();
    if is_data_parallel(&workload) {
        return Err(InputError::new(
            format!("{origin}: workload.parallelism"),
            "validate runs a plan's device map; a data-parallel plan has none",
        )
        .with_fix("estimate each rank with `vramplan estimate` and the same workload"));
    }
    let mut warnings = input::validate(&workload, &model, &hardware)?;
    let model = held_by_runtime(model, &hardware, &workload, &mut warnings)?;
    let gpus = u32::try_from(hardware.devices.len()).unwrap_or(u32::MAX);
    let entries = plan.entries(&origin, gpus)?;
    let backend = args.backend.backend();

    // Static first: a mismatch the rules find needs no device.
    let mut findings = check_device_map(&model, &entries, runtime);
    findings.extend(offloaded_in_training(&model, &entries, runtime, &workload));
    if !findings.is_empty() {
        let text = if args.json {
            crate::json_text(&ValidateOutput {
                findings: &findings,
                predicted: None,
                run: None,
                unavailable: None,
                ok: false,
            })
        } else {
            vramplan_reports::check_table(
                runtime,
                None,
                Some("the static check found a mismatch, so nothing was run"),
                &findings,
            )
        };
        crate::print(out, &text)?;
        return Ok(crate::EXIT_NEGATIVE);
    }

    let placement = Placement::from_entries(entries);
    let estimate = vramplan_sim::estimate(&model, &hardware, &workload, &placement)?;
    let program = step_program(&model, &hardware, &workload, &placement);
    match vramplan_validate::run(&program, &hardware, backend) {
        Err(why) => {
            let _ = writeln!(err, "{}", vramplan_reports::unavailable_message(backend, &why));
            if args.json {
                let output = ValidateOutput {
                    findings: &findings,
                    predicted: Some(&estimate.devices),
                    run: None,
                    unavailable: Some(&why),
                    ok: false,
                };
                crate::print(out, &crate::json_text(&output))?;
            }
            Ok(EXIT_NO_DEVICE)
        }
        Ok(run) => {
            let ok = run.outcome == vramplan_validate::Outcome::Completed;
            let text = if args.json {
                let output = ValidateOutput {
                    findings: &findings,
                    predicted: Some(&estimate.devices),
                    run: Some(&run),
                    unavailable: None,
                    ok,
                };
                crate::json_text(&output)
            } else {
                vramplan_reports::validate_table(&estimate, &run)
            };
            crate::print(out, &text)?;
            Ok(if ok { 0 } else { crate::EXIT_NEGATIVE })
        }
    }
}
