//! `vramplan validate PLAN [--backend cuda|torch|cpu] [--python PATH] [--steps N] [--fake-gpus] [--run-anyway] [--json]`:
//! runs a plan written by
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
use vramplan_profiles::DType;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::estimate::{DeviceEstimate, is_data_parallel};
use vramplan_sim::input::{WorkloadFlags, lora_target_modules};
use vramplan_sim::program::step_program;
use vramplan_sim::workload::{Engine, Finetune, GradCheckpointing, Mode, Quant, Workload};
use vramplan_sim::{Placement, device_map, input};
use vramplan_solver::Runtime;
use vramplan_solver::check::{Finding, map_findings};
use vramplan_solver::export::PlanTarget;
use vramplan_solver::export::{DeviceMapEntries, PlanFile, read_plan_file};
use vramplan_validate::{Backend, TorchLora, TorchRequest, Unavailable, Validation};

/// Exit code when the backend has no usable device here.
pub const EXIT_NO_DEVICE: i32 = 3;

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
    /// With --script: the most the run may take, in seconds, all ranks together.
    #[arg(long, value_name = "S", default_value_t = 600, requires = "script",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) time_limit: u64,
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

/// A fix that offers the cuda backend only where a CUDA driver loads, beside `otherwise`.
fn cuda_or(otherwise: &str) -> String {
    if vramplan_validate::cuda_driver_present().is_ok() {
        format!("use --backend cuda, or {otherwise}")
    } else {
        format!("{otherwise}; --backend cuda runs it on a machine with an NVIDIA GPU (none here)")
    }
}

/// What the torch backend's harness runs for `plan`: the model's raw config (a built-in's, or
/// the `config.json` of a file or folder), the plan's map as written, and the workload.
fn torch_request(
    plan: &PlanFile,
    model: &ModelDescription,
    workload: &Workload,
    steps: u32,
    origin: &str,
) -> Result<TorchRequest, InputError> {
    let unsupported = |what: &str| {
        InputError::new(format!("{origin}: workload"), format!("the torch backend does not run {what} yet"))
            .with_fix(cuda_or("use a plan without it"))
    };
    let Some(text) = model::config_text(&plan.model)? else {
        return Err(InputError::new(
            origin,
            format!(
                "the torch backend builds transformers models from a config.json; `{}` has none",
                plan.model
            ),
        )
        .with_fix(cuda_or("check its map with `vramplan check`, or the cpu backend (`--backend cpu`)")));
    };
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| InputError::new(plan.model.clone(), format!("not a JSON config: {e}")))?;
    if workload.quant != Quant::None {
        return Err(unsupported("quantized weights"));
    }
    if workload.engine != Engine::Transformers {
        return Err(unsupported("another engine than transformers"));
    }
    let dtype = workload.weight_dtype.unwrap_or(model.dtype);
    let dtype = match dtype {
        DType::BF16 => "bf16",
        DType::F16 => "fp16",
        DType::F32 => "fp32",
        _ => return Err(unsupported(&format!("{dtype} weights"))),
    };
    // The modules the simulation adapts, by full path (PEFT matches a path exactly), so the
    // runtime adapts the same ones (no targets means PEFT's default for the architecture).
    let lora = match &workload.finetune {
        Finetune::Lora { rank, alpha, .. } => {
            Some(TorchLora { rank: *rank, alpha: *alpha, targets: lora_target_modules(workload, model)? })
        }
        Finetune::Full => None,
    };
    Ok(TorchRequest {
        config,
        device_map: plan.device_map.clone(),
        mode: if workload.mode == Mode::Train { "train" } else { "inference" }.to_string(),
        batch: workload.batch,
        seq: workload.seq,
        dtype: dtype.to_string(),
        lora,
        grad_checkpointing: workload.grad_checkpointing != GradCheckpointing::Off,
        steps,
        fake_gpus: 0,
    })
}

/// The plan `validate MODEL --device-map FILE --hardware HW [workload]` stands for: the map as
/// read for the model, with the workload from the file and the flags.
fn plan_of_map(
    args: &ValidateArgs,
    map: &std::path::Path,
    hardware_spec: &str,
) -> Result<(PlanFile, ModelDescription, HardwareProfile), InputError> {
    let runtime = Runtime::parse(&args.target)?;
    let model_arg = args.plan.clone().unwrap_or_default();
    let model = model::load(&model_arg, ImportOptions { naming: runtime.naming() })?;
    let hardware = hardware::load(hardware_spec)?;
    let base = match &args.workload {
        Some(path) => input::workload_from_yaml(path)?,
        None => Workload::default(),
    };
    let mut workload = args.flags.apply(base)?;
    let seq_given = args.flags.seq.is_some() || args.workload.is_some();
    // The default sequence as estimate takes it (validate prints no workload notes).
    let _ = input::fit_default_seq(&mut workload, seq_given, &model);
    // In file order: the first GPU the map lists runs what it offloads.
    let device_map = DeviceMapEntries(
        device_map::read_device_map(map, &model, &hardware)?
            .into_iter()
            .map(|(module, target)| (module, PlanTarget::of(target)))
            .collect(),
    );
    let plan = PlanFile {
        vramplan_plan: 1,
        model: model_arg,
        hardware: hardware_spec.to_string(),
        target: runtime.name().to_string(),
        workload,
        device_map,
    };
    Ok((plan, model, hardware))
}

/// Runs `vramplan validate`.
pub(crate) fn run(args: &ValidateArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, InputError> {
    if let Some(script) = &args.script {
        return crate::validate_script::run(args, script, out, err);
    }
    let plan_arg = args.plan.clone().unwrap_or_default();
    if args.hardware.is_some() && args.device_map.is_none() {
        return Err(InputError::new("validate --hardware", "goes with --device-map or --script").with_fix(
            "a plan file names its hardware: leave --hardware out, or give --device-map or --script",
        ));
    }
    // The plan, and the model and hardware where reading the map has loaded them already.
    let (plan, loaded) = match (&args.device_map, &args.hardware) {
        (Some(map), Some(hardware)) => {
            let (plan, model, hardware) = plan_of_map(args, map, hardware)?;
            (plan, Some((model, hardware)))
        }
        _ => {
            if args.target != "accelerate" || args.flags != WorkloadFlags::default() {
                return Err(InputError::new(
                    "validate",
                    "a plan file carries its target and workload: --target and the workload flags go with \
                     --device-map",
                )
                .with_fix("leave them out, or give MODEL --device-map FILE --hardware HW with them"));
            }
            (read_plan_file(std::path::Path::new(&plan_arg))?, None)
        }
    };
    let origin = args.device_map.as_ref().map_or_else(|| plan_arg.clone(), |m| m.display().to_string());
    let runtime = Runtime::parse(&plan.target).map_err(|e| InputError::new(&origin, e.to_string()))?;
    let (model, hardware) = match loaded {
        Some(loaded) => loaded,
        None => (
            model::load(&plan.model, ImportOptions { naming: runtime.naming() })?,
            hardware::load(&plan.hardware)?,
        ),
    };
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
    if args.fold_devices && backend != Backend::Cuda {
        return Err(InputError::new(
            "validate --fold-devices",
            "only the cuda backend runs a plan's GPUs on fewer devices",
        )
        .with_fix("drop --fold-devices, or use --backend cuda"));
    }

    // Static first: a mismatch the rules find needs no device.
    let findings = map_findings(&model, &entries, runtime, &workload, hardware.devices.len());
    if !findings.is_empty() && !args.run_anyway {
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

    let placement = Placement::from_entries(entries.clone());
    let estimate = vramplan_sim::estimate(&model, &hardware, &workload, &placement)?;
    let outcome = match backend {
        Backend::Cuda => {
            let program = step_program(&model, &hardware, &workload, &placement);
            vramplan_validate::run_cuda(&program, &model, &workload, &hardware, args.fold_devices)
        }
        Backend::Torch => {
            let mut request = torch_request(&plan, &model, &workload, args.steps, &origin)?;
            if args.cpu {
                request.device_map = DeviceMapEntries(vec![(String::new(), PlanTarget::Host("cpu".into()))]);
            }
            if args.fake_gpus {
                request.fake_gpus = gpus;
            }
            vramplan_validate::run_torch(&request, &args.python)
        }
        Backend::Cpu => {
            if !matches!(runtime, Runtime::Accelerate | Runtime::AccelerateV4) {
                return Err(InputError::new(
                    format!("{origin}: target"),
                    format!(
                        "the cpu backend runs accelerate's placement; `{}` is another runtime's",
                        runtime.name()
                    ),
                )
                .with_fix("validate a plan for --target accelerate or accelerate-v4 on it"));
            }
            if workload.quant != Quant::None {
                return Err(InputError::new(
                    format!("{origin}: workload.quant"),
                    "the cpu backend runs every weight at full precision, so a quantized plan's \
                     placement and bytes would not be the plan's",
                )
                .with_fix(
                    "run `vramplan check` on the map for the runtime's device rules, or --backend cuda where \
                     there is a GPU",
                ));
            }
            let steps = (workload.mode == Mode::Train).then_some(args.steps);
            // LoRA adapts the model for training, as the torch backend's harness does.
            let targets = match (&workload.finetune, steps) {
                (Finetune::Lora { .. }, Some(_)) => Some(lora_target_modules(&workload, &model)?),
                _ => None,
            };
            let request = vramplan_validate::CpuRequest {
                model: &model,
                entries: &entries,
                train_steps: steps,
                lora_targets: targets.as_deref(),
            };
            Ok(vramplan_validate::run_cpu(&request).map_err(|e| {
                InputError::new("validate --backend cpu", format!("candle failed: {e}"))
                    .with_fix("this is a fault of vramplan's cpu backend; please report it with the plan")
            })?)
        }
    };
    match outcome {
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
            // Findings reach a run only under --run-anyway, which asks what the runtime does: the
            // run's outcome decides.
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
            } else if findings.is_empty() {
                vramplan_reports::validate_table(&estimate, &run)
            } else {
                let checked = vramplan_reports::check_table(
                    runtime,
                    None,
                    Some("--run-anyway: the run went ahead, and its outcome is below"),
                    &findings,
                );
                format!("{checked}\n{}", vramplan_reports::validate_table(&estimate, &run))
            };
            crate::print(out, &text)?;
            Ok(if ok { 0 } else { crate::EXIT_NEGATIVE })
        }
    }
}
