//! `vramplan validate PLAN [--backend cuda|torch|cpu] [--python PATH] [--steps N] [--fake-gpus] [--run-anyway] [--json]`:
//! the plan (a file `vramplan plan -o plan.yaml` wrote, or a model with `--device-map`) and the
//! backend as a `vramplan-api` request; prints the prediction beside what the run measured.
//! Exit 0 when every allocation of the step succeeded; 1 when the static check finds a mismatch
//! (nothing is allocated then) or the run runs out of memory; 2 for bad input; 3 when the
//! backend cannot run here (no CUDA driver, too few devices), with what is missing.

use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use vramplan_api::{DeviceMapSource, InputError, MapPlan, PlanSource, ValidateRequest};
use vramplan_sim::input::WorkloadFlags;
use vramplan_validate::Backend;

/// Exit code when the backend has no usable device here.
pub const EXIT_NO_DEVICE: i32 = vramplan_api::EXIT_NO_DEVICE;

#[derive(Args, Debug)]
pub(crate) struct ValidateArgs {
    /// A plan written by `vramplan plan -o plan.yaml`; or, with --device-map, the model (as
    /// `estimate` takes it). Not with --script.
    #[arg(required_unless_present = "script", conflicts_with = "script")]
    plan: Option<String>,
    /// Run your own training or inference script (unmodified) on the profile's GPUs as fake CUDA
    /// devices, with --hardware: every operation checks PyTorch's device rule, and each GPU's
    /// memory is measured. Its arguments go after `--`.
    #[arg(long, value_name = "FILE.py", requires = "hardware")]
    pub(crate) script: Option<PathBuf>,
    /// With --script: run it as `torchrun --nproc-per-node N` would, rank by rank (RANK,
    /// LOCAL_RANK, WORLD_SIZE set; the process group is PyTorch's fake one). Without it the
    /// script runs as `python FILE.py` does, with none of torchrun's variables.
    #[arg(long, requires = "script", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) nproc: Option<u32>,
    /// With --script or --backend torch: the most the run may take, in seconds (all ranks
    /// together; default 600); at the limit the Python and all it started are stopped.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) time_limit: Option<u64>,
    /// With --script: write the run over time (each GPU's allocated and reserved bytes at every
    /// allocation, the phases) as JSON, for `vramplan plot timeline --trace FILE`.
    #[arg(long, value_name = "FILE.json", requires = "script")]
    pub(crate) trace_out: Option<PathBuf>,
    /// With --script: run it on this machine's GPUs instead of fake ones (as many as the
    /// profile has), with the same stop rule and report: the check of a fake run against the
    /// real one (scripts/gpu-check does it).
    #[arg(long, requires = "script")]
    pub(crate) real_gpus: bool,
    /// With --script: the script's own arguments.
    #[arg(last = true, value_name = "ARGS", requires = "script")]
    pub(crate) script_args: Vec<String>,
    /// An accelerate device_map JSON to run instead of a plan's; PLAN is then the model, with
    /// --hardware and the workload flags.
    #[arg(long, value_name = "FILE", requires = "hardware", conflicts_with = "script")]
    device_map: Option<PathBuf>,
    /// With --device-map or --script: the hardware profile.
    #[arg(long)]
    pub(crate) hardware: Option<String>,
    /// With --device-map: a workload YAML file (the workload flags override it).
    #[arg(long, value_name = "FILE", requires = "device_map", conflicts_with = "script")]
    workload: Option<PathBuf>,
    /// With --device-map: the runtime that loads the map (accelerate | accelerate-v4).
    #[arg(long, default_value = "accelerate", conflicts_with = "script")]
    target: String,
    /// The workload flags (docs/workloads.md), with --device-map.
    #[command(flatten)]
    pub(crate) flags: WorkloadFlags,
    /// Where to run it: cuda (real devices), torch (the real runtime), cpu (candle, reduced
    /// scale).
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda, conflicts_with = "script")]
    backend: BackendArg,
    /// The Python that runs the torch backend's harness (with torch, transformers, accelerate,
    /// and peft for LoRA).
    #[arg(long, value_name = "PATH", default_value = "python3")]
    pub(crate) python: String,
    /// Training steps the torch backend runs (the cuda backend runs the simulator's program:
    /// two steps in training, the prefill in inference).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) steps: u32,
    /// torch backend: run every module on the CPU instead of the plan's devices (where there is
    /// no GPU): the model, the workload and the steps run with the real runtime, and nothing is
    /// measured.
    #[arg(long, conflicts_with = "fake_gpus", conflicts_with = "script")]
    cpu: bool,
    /// torch backend: the plan's GPUs as PyTorch fake CUDA devices (FakeTensorMode), where there
    /// are none: accelerate places the model as on real ones and every operation checks its
    /// operands' devices, but nothing is allocated (training runs the forward and its loss).
    #[arg(long, conflicts_with = "script")]
    fake_gpus: bool,
    /// cuda backend: run plan GPU i on CUDA device i mod n (n the devices here), so a plan for
    /// several GPUs runs on one; each plan GPU keeps its own allocator and capacity, and the
    /// driver's used bytes are the shared device's.
    #[arg(long, conflicts_with = "script")]
    fold_devices: bool,
    /// Run the backend even when the static check finds a mismatch, to see what the runtime
    /// does with the map.
    #[arg(long, conflicts_with = "script")]
    run_anyway: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
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

/// The seconds a Python may run (`--time-limit`) when none is given.
pub(crate) const DEFAULT_TIME_LIMIT_S: u64 = 600;

/// Runs `vramplan validate`.
pub(crate) fn run(args: &ValidateArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, InputError> {
    if let Some(script) = &args.script {
        return crate::validate_script::run(args, script, out, err);
    }
    if args.time_limit.is_some() && !matches!(args.backend, BackendArg::Torch) {
        return Err(InputError::new(
            "validate --time-limit",
            "bounds the Python that --script and --backend torch run; the cuda and cpu backends run none",
        )
        .with_fix("leave --time-limit out, or add --backend torch"));
    }
    let plan_arg = args.plan.clone().unwrap_or_default();
    if args.hardware.is_some() && args.device_map.is_none() {
        return Err(InputError::new("validate --hardware", "goes with --device-map or --script").with_fix(
            "a plan file names its hardware: leave --hardware out, or give --device-map or --script",
        ));
    }
    let plan = match (&args.device_map, &args.hardware) {
        (Some(map), Some(hardware)) => PlanSource::Map(Box::new(MapPlan {
            model: crate::model_source(&plan_arg),
            device_map: DeviceMapSource::File(map.clone()),
            hardware: hardware.clone(),
            workload: args.workload.clone(),
            flags: args.flags.clone(),
            target: args.target.clone(),
        })),
        _ => {
            if args.target != "accelerate" || args.flags != WorkloadFlags::default() {
                return Err(InputError::new(
                    "validate",
                    "a plan file carries its target and workload: --target and the workload flags go with \
                     --device-map",
                )
                .with_fix("leave them out, or give MODEL --device-map FILE --hardware HW with them"));
            }
            PlanSource::File(PathBuf::from(plan_arg))
        }
    };
    let request = ValidateRequest {
        plan,
        backend: args.backend.backend(),
        python: args.python.clone(),
        steps: args.steps,
        cpu: args.cpu,
        fake_gpus: args.fake_gpus,
        fold_devices: args.fold_devices,
        run_anyway: args.run_anyway,
        time_limit: std::time::Duration::from_secs(args.time_limit.unwrap_or(DEFAULT_TIME_LIMIT_S)),
    };
    let result = vramplan_api::validate(&request)?;
    if let Some(why) = &result.unavailable {
        let message = vramplan_reports::unavailable_message(result.backend, why);
        let _ = writeln!(err, "{}", vramplan_reports::terminal_safe(&message));
        if args.json {
            crate::print(out, &result.to_json())?;
        }
        return Ok(result.outcome().exit_code());
    }
    let text = if args.json {
        result.to_json()
    } else {
        match (&result.run, &result.estimate) {
            (Some(run), Some(estimate)) if result.findings.is_empty() => {
                vramplan_reports::validate_table(estimate, run)
            }
            (Some(run), Some(estimate)) => {
                let checked = vramplan_reports::check_table(
                    result.runtime,
                    None,
                    Some("--run-anyway: the run went ahead, and its outcome is below"),
                    &result.findings,
                );
                format!("{checked}\n{}", vramplan_reports::validate_table(estimate, run))
            }
            // Static first: a mismatch the rules find needs no device.
            _ => vramplan_reports::check_table(
                result.runtime,
                None,
                Some("the static check found a mismatch, so nothing was run"),
                &result.findings,
            ),
        }
    };
    crate::print(out, &text)?;
    Ok(result.outcome().exit_code())
}
