//! `validate`: runs a plan (a file `vramplan plan -o plan.yaml` wrote, or a model with a device
//! map, the hardware and the workload) on a backend, after `check`'s static rules, and sets the
//! prediction beside what the run measured. A static finding stops it before anything is
//! allocated (unless `run_anyway`); a backend that cannot run here says what is missing.

use crate::estimate::DeviceMapSource;
use crate::inputs::{ModelSource, held_by_runtime};
use crate::{InputError, Outcome};
use serde::Serialize;
use std::path::PathBuf;
use vramplan_profiles::DType;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::estimate::{DeviceEstimate, is_data_parallel};
use vramplan_sim::input::{WorkloadFlags, WorkloadSource, lora_target_modules};
use vramplan_sim::program::step_program;
use vramplan_sim::workload::{Engine, Finetune, GradCheckpointing, Mode, Quant, Workload};
use vramplan_sim::{Placement, input};
use vramplan_solver::Runtime;
use vramplan_solver::check::{Finding, map_findings};
use vramplan_solver::export::{DeviceMapEntries, PlanFile, PlanTarget, read_plan_file};
use vramplan_validate::{Backend, TorchLora, TorchRequest, Unavailable, Validation};

/// The plan `validate` runs.
#[derive(Debug, Clone)]
pub enum PlanSource {
    /// A plan written by `vramplan plan -o plan.yaml` (its model, hardware, target, workload and
    /// device map).
    File(PathBuf),
    /// A model with a device map, on the hardware, with a workload.
    Map(Box<MapPlan>),
}

/// A model with a device map, on the hardware, with a workload: the plan it stands for.
#[derive(Debug, Clone)]
pub struct MapPlan {
    /// The model.
    pub model: ModelSource,
    /// The device map to run.
    pub device_map: DeviceMapSource,
    /// The hardware profile.
    pub hardware: String,
    /// A workload YAML file (the flags override it).
    pub workload: Option<PathBuf>,
    /// The workload flags.
    pub flags: WorkloadFlags,
    /// The runtime that loads the map (accelerate | accelerate-v4).
    pub target: String,
}

/// What `validate` reads.
#[derive(Debug, Clone)]
pub struct ValidateRequest {
    /// The plan.
    pub plan: PlanSource,
    /// Where to run it: cuda (real devices), torch (the real runtime), cpu (candle, reduced
    /// scale).
    pub backend: Backend,
    /// The Python that runs the torch backend's harness.
    pub python: String,
    /// Training steps the torch and cpu backends run.
    pub steps: u32,
    /// torch backend: run every module on the CPU instead of the plan's devices.
    pub cpu: bool,
    /// torch backend: the plan's GPUs as PyTorch fake CUDA devices.
    pub fake_gpus: bool,
    /// cuda backend: run plan GPU i on CUDA device i mod n.
    pub fold_devices: bool,
    /// Run the backend even when the static check finds a mismatch.
    pub run_anyway: bool,
    /// torch backend: the most its Python may take before it is stopped, with all it started.
    pub time_limit: std::time::Duration,
}

impl ValidateRequest {
    /// The defaults of the command line for `plan`: the cuda backend, `python3`, two steps,
    /// 600 s for the torch backend's run.
    pub fn new(plan: PlanSource) -> ValidateRequest {
        ValidateRequest {
            plan,
            backend: Backend::Cuda,
            python: "python3".into(),
            steps: 2,
            cpu: false,
            fake_gpus: false,
            fold_devices: false,
            run_anyway: false,
            time_limit: std::time::Duration::from_secs(600),
        }
    }
}

/// What `validate` found.
#[derive(Debug, Clone)]
pub struct ValidateResult {
    /// The runtime the plan is for.
    pub runtime: Runtime,
    /// The backend asked for.
    pub backend: Backend,
    /// The static check's findings (nothing ran when there is one, unless `run_anyway`).
    pub findings: Vec<Finding>,
    /// The prediction; `None` when the static check stopped the run.
    pub estimate: Option<vramplan_sim::Estimate>,
    /// What the run measured.
    pub run: Option<Validation>,
    /// Why the backend could not run.
    pub unavailable: Option<Unavailable>,
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

impl ValidateResult {
    /// The run completed (findings reach a run only with `run_anyway`, which asks what the
    /// runtime does: the run's outcome decides).
    pub fn ok(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.outcome == vramplan_validate::Outcome::Completed)
    }

    /// Completed; a finding or an out-of-memory; or no usable backend here.
    pub fn outcome(&self) -> Outcome {
        if self.unavailable.is_some() { Outcome::NoDevice } else { Outcome::of(self.ok()) }
    }

    /// What `validate --json` prints.
    pub fn to_json(&self) -> String {
        crate::json_text(&ValidateOutput {
            findings: &self.findings,
            predicted: self.estimate.as_ref().map(|e| e.devices.as_slice()),
            run: self.run.as_ref(),
            unavailable: self.unavailable.as_ref(),
            ok: self.ok(),
        })
    }
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

/// The plan a model with a device map stands for: the map as read for the model, with the
/// workload from the file and the flags.
fn plan_of_map(map_plan: &MapPlan) -> Result<(PlanFile, ModelDescription, HardwareProfile), InputError> {
    let MapPlan { model: model_source, device_map: map, hardware: hardware_spec, workload, flags, target } =
        map_plan;
    let workload_file = workload.as_deref();
    let runtime = Runtime::parse(target)?;
    let model = model_source.load(ImportOptions { naming: runtime.naming() })?;
    let hardware = hardware::load(hardware_spec)?;
    let base = match workload_file {
        Some(path) => input::workload_from_yaml(path)?,
        None => Workload::default(),
    };
    let mut workload = flags.apply(base)?;
    let seq_given = flags.seq.is_some() || workload_file.is_some();
    // The default sequence as estimate takes it (validate prints no workload notes).
    let _ = input::fit_default_seq(&mut workload, seq_given, &model);
    // In file order: the first GPU the map lists runs what it offloads.
    let device_map = DeviceMapEntries(
        map.read(&model, &hardware)?
            .into_iter()
            .map(|(module, target)| (module, PlanTarget::of(target)))
            .collect(),
    );
    let plan = PlanFile {
        vramplan_plan: 1,
        model: model_source.spec().to_string(),
        hardware: hardware_spec.to_string(),
        target: runtime.name().to_string(),
        workload,
        device_map,
    };
    Ok((plan, model, hardware))
}

/// `vramplan validate`: the static check, then the run on the backend.
pub fn validate(request: &ValidateRequest) -> Result<ValidateResult, InputError> {
    // The plan, and the model and hardware where reading the map has loaded them already.
    let (plan, loaded, origin) = match &request.plan {
        PlanSource::Map(map) => {
            let (plan, model, hardware) = plan_of_map(map)?;
            (plan, Some((model, hardware)), map.device_map.origin())
        }
        PlanSource::File(path) => (read_plan_file(path)?, None, path.display().to_string()),
    };
    let runtime = Runtime::parse(&plan.target).map_err(|e| InputError::new(&origin, e.to_string()))?;
    let (model, hardware) = match loaded {
        Some(loaded) => loaded,
        None => (
            model::load(&plan.model, ImportOptions { naming: runtime.naming() })
                .map_err(|e| e.inside(&origin, "model"))?,
            hardware::load(&plan.hardware).map_err(|e| e.inside(&origin, "hardware"))?,
        ),
    };
    let mut workload = plan.workload.clone();
    if is_data_parallel(&workload) {
        return Err(InputError::new(
            format!("{origin}: workload.parallelism"),
            "validate runs a plan's device map; a data-parallel plan has none",
        )
        .with_fix("estimate each rank with `vramplan estimate` and the same workload"));
    }
    let mut loading = Vec::new();
    crate::inputs::fp8_while_loading(&model, &hardware, &mut workload, &mut loading)?;
    let mut warnings = input::validate(&workload, &model, &hardware).map_err(|e| match &request.plan {
        PlanSource::File(path) => {
            input::place_check_error(e, &workload, &WorkloadFlags::default(), WorkloadSource::Plan(path))
        }
        PlanSource::Map(map) => match &map.workload {
            Some(path) => match input::workload_from_yaml(path) {
                Ok(base) => input::place_check_error(e, &base, &map.flags, WorkloadSource::File(path)),
                Err(_) => e,
            },
            None => e,
        },
    })?;
    warnings.extend(loading);
    let model = held_by_runtime(model, &hardware, &workload, &mut warnings)?;
    let gpus = u32::try_from(hardware.devices.len()).unwrap_or(u32::MAX);
    let entries = plan.entries(&origin, gpus)?;
    let backend = request.backend;
    if request.fold_devices && backend != Backend::Cuda {
        return Err(InputError::new(
            "validate --fold-devices",
            "only the cuda backend runs a plan's GPUs on fewer devices",
        )
        .with_fix("drop --fold-devices, or use --backend cuda"));
    }

    // Static first: a mismatch the rules find needs no device.
    let findings = map_findings(&model, &entries, runtime, &workload, hardware.devices.len());
    let mut result =
        ValidateResult { runtime, backend, findings, estimate: None, run: None, unavailable: None };
    if !result.findings.is_empty() && !request.run_anyway {
        return Ok(result);
    }

    let placement = Placement::from_entries(entries.clone());
    result.estimate = Some(vramplan_sim::estimate(&model, &hardware, &workload, &placement)?);
    let outcome = match backend {
        Backend::Cuda => {
            let program = step_program(&model, &hardware, &workload, &placement);
            vramplan_validate::run_cuda(&program, &model, &workload, &hardware, request.fold_devices)
        }
        Backend::Torch => {
            let mut torch = torch_request(&plan, &model, &workload, request.steps, &origin)?;
            if request.cpu {
                torch.device_map = DeviceMapEntries(vec![(String::new(), PlanTarget::Host("cpu".into()))]);
            }
            if request.fake_gpus {
                torch.fake_gpus = gpus;
            }
            vramplan_validate::run_torch(&torch, &request.python, request.time_limit)
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
            let steps = (workload.mode == Mode::Train).then_some(request.steps);
            // LoRA adapts the model for training, as the torch backend's harness does.
            let targets = match (&workload.finetune, steps) {
                (Finetune::Lora { .. }, Some(_)) => Some(lora_target_modules(&workload, &model)?),
                _ => None,
            };
            let cpu = vramplan_validate::CpuRequest {
                model: &model,
                entries: &entries,
                train_steps: steps,
                lora_targets: targets.as_deref(),
            };
            Ok(vramplan_validate::run_cpu(&cpu).map_err(|e| {
                InputError::new("validate --backend cpu", format!("candle failed: {e}"))
                    .with_fix("this is a fault of vramplan's cpu backend; please report it with the plan")
            })?)
        }
    };
    match outcome {
        Err(why) => result.unavailable = Some(why),
        Ok(run) => result.run = Some(run),
    }
    Ok(result)
}
