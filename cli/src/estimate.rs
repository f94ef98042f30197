//! `vramplan estimate MODEL --hardware HW [--workload FILE] [flags] [--device-map FILE] [--json]`:
//! reads the inputs, merges the workload flags over the file, checks the workload, places the
//! model (a device map; without one, everything on GPU 0, or one copy split evenly over the
//! GPUs; under data parallelism, a replica on every GPU, one section per rank), asks the
//! simulator, and prints the table or the JSON. Exit 0 when it fits, 1 when it does not.

use crate::NamingArg;
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use vramplan_profiles::InputError;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, Naming};
use vramplan_sim::input::{self, WorkloadFlags};
use vramplan_sim::workload::{Engine, Parallelism, Workload};
use vramplan_sim::{Placement, device_map};
use vramplan_solver::export::{PlanFile, read_plan_file};

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
    /// Whether a device map or a plan file was given.
    pub(crate) fn given(&self) -> bool {
        self.device_map.is_some() || self.plan.is_some()
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

/// The inputs, read and checked.
pub(crate) struct Loaded {
    pub model: model::ModelDescription,
    pub hardware: hardware::HardwareProfile,
    pub workload: Workload,
    /// What the workload checks found odd for this model and hardware.
    pub warnings: Vec<String>,
}

impl Inputs {
    /// Reads the model with `naming` and the hardware, and the workload: the `--workload`
    /// file, else `fallback` (a plan file's), else the defaults, with the flags over it.
    pub(crate) fn load(&self, naming: Naming, fallback: Option<Workload>) -> Result<Loaded, InputError> {
        self.load_on(naming, fallback, &self.hardware)
    }

    /// As [`Inputs::load`], on the hardware `spec` instead of `--hardware` (one of a list).
    pub(crate) fn load_on(
        &self,
        naming: Naming,
        fallback: Option<Workload>,
        spec: &str,
    ) -> Result<Loaded, InputError> {
        let mut model = model::load(&self.model, ImportOptions { naming })?;
        if let Some(path) = &self.activations {
            measured_activations(&mut model, path)?;
        }
        let hardware = hardware::load(spec)?;
        let base = match (&self.workload, fallback) {
            (Some(path), _) => input::workload_from_yaml(path)?,
            (None, Some(workload)) => workload,
            (None, None) => Workload::default(),
        };
        let mut workload = self.flags.apply(base)?;
        let seq_given = self.flags.seq.is_some() || self.workload.is_some();
        let note = input::fit_default_seq(&mut workload, seq_given, &model);
        let mut warnings = input::validate(&workload, &model, &hardware)?;
        warnings.extend(note);
        let model = held_by_runtime(model, &hardware, &workload, &mut warnings)?;
        Ok(Loaded { model, hardware, workload, warnings })
    }
}

/// Declares on `model` the activations of the run `path` (a `--trace-out` file) measured.
fn measured_activations(
    model: &mut model::ModelDescription,
    path: &std::path::Path,
) -> Result<(), InputError> {
    let file = crate::validate_script::read_trace_file(path, "--activations")?;
    let shown = path.display().to_string();
    let Some(measured) = &file.activations else {
        return Err(InputError::new(
            &shown,
            "holds no activations: the run never trained (no forward was followed by a backward)",
        )
        .at_key("activations")
        .with_fix("measure a training script: `vramplan validate --script train.py --trace-out FILE`"));
    };
    vramplan_validate::declare_measured(model, measured).map(|_| ()).map_err(|why| match why {
        vramplan_validate::ActivationsMismatch::NoBatch => {
            InputError::new(&shown, "the run's forward took no tensor with a batch dimension")
                .at_key("activations.batch")
                .with_fix("measure a script whose model takes its batch as a tensor")
        }
        vramplan_validate::ActivationsMismatch::NoCommonModule { measured, model: names } => InputError::new(
            &shown,
            format!(
                "none of the run's modules ({}) is a module of `{}` ({})",
                measured.join(", "),
                model.name,
                names.join(", ")
            ),
        )
        .at_key("activations.modules")
        .with_fix("describe the model with the names the script's modules have (`named_modules()`)"),
    })
}

/// A device map places one copy of the model; `key` is the option that asked for another
/// parallelism.
pub(crate) fn device_map_needs_one_copy(key: &str, fix: &str) -> InputError {
    InputError::new(
        key,
        "a device map spreads one copy of the model over GPUs (naive model parallelism); DDP, ZeRO, \
         FSDP and tensor parallelism place the model themselves",
    )
    .with_fix(fix)
}

/// What the runtime holds of a pre-quantized checkpoint on these GPUs (the oldest one
/// decides: every GPU loads the same weights): the stored layout where it has the kernels, the
/// dequantized model where it falls back (with a warning), or a refusal where it stops.
/// llama.cpp reads GGUF files, not the checkpoint's layout.
pub(crate) fn held_by_runtime(
    model: vramplan_profiles::model::ModelDescription,
    hardware: &hardware::HardwareProfile,
    workload: &Workload,
    warnings: &mut Vec<String>,
) -> Result<vramplan_profiles::model::ModelDescription, InputError> {
    use vramplan_profiles::model::quantization::held::{Loader, held_on};
    let loader = match workload.engine {
        Engine::Transformers => Loader::Transformers,
        Engine::Vllm { .. } => Loader::Vllm,
        Engine::LlamaCpp { .. } => return Ok(model),
    };
    // vLLM runs on its tensor-parallel group, transformers on any of the GPUs.
    let gpus = match workload.engine {
        Engine::Vllm { .. } => vramplan_sim::engines::vllm::tensor_parallel_size(workload) as usize,
        _ => hardware.devices.len(),
    };
    let Some(capability) = hardware.devices.iter().take(gpus).map(|d| d.compute_capability).min() else {
        return Ok(model);
    };
    let held = held_on(&model, loader, capability, workload.weight_dtype.unwrap_or(model.dtype))?;
    if let Some(warning) = held.warning(&model, loader, capability) {
        warnings.push(warning);
    }
    Ok(held.model)
}

/// Adds the warnings of `from` that `into` does not have yet, in order.
pub(crate) fn merge_warnings(into: &mut Vec<String>, from: Vec<String>) {
    for warning in from {
        if !into.contains(&warning) {
            into.push(warning);
        }
    }
}

/// Without a device map: everything on GPU 0, except that one copy of the model on a profile
/// with several GPUs (no DDP, ZeRO or tensor parallelism) is spread the way people run it there,
/// an even split of the layers in order, under transformers (vLLM and llama.cpp place the
/// model themselves). Under DDP and ZeRO the simulator puts a replica on every GPU of the
/// profile, each on its own (`vramplan_sim::estimate::data_parallel_estimate`).
fn default_placement(
    model: &model::ModelDescription,
    hardware: &hardware::HardwareProfile,
    workload: &Workload,
) -> Placement {
    let gpus = hardware.devices.len() as u32;
    if gpus > 1
        && workload.parallelism == Parallelism::Single
        && matches!(workload.engine, Engine::Transformers)
    {
        Placement::even_layers(model, gpus)
    } else {
        Placement::single(0)
    }
}

/// A simulation's inputs, read and placed, and what it found.
pub(crate) struct Simulated {
    pub loaded: Loaded,
    pub placement: Placement,
    /// The runtime that loads the map (`accelerate`, or `accelerate-v4` for 4.x names).
    pub runtime: vramplan_solver::Runtime,
    /// The estimate, with every warning of the inputs and the placement merged in.
    pub estimate: vramplan_sim::Estimate,
}

/// Runs `vramplan estimate`; the exit code is 0 when every device fits, 1 when one does not.
pub(crate) fn run(args: &EstimateArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let Simulated { loaded, estimate, .. } = simulate(&args.inputs, &args.map)?;
    let text = if args.json {
        json_labelled(&estimate, &loaded.model)
    } else {
        model::generic::line(&loaded.model)
            + &data_parallel_heading(&loaded.workload, &loaded.hardware)
            + &vramplan_reports::estimate_table(&estimate)
    };
    crate::print(out, &text)?;
    Ok(if estimate.fits { 0 } else { crate::EXIT_NEGATIVE })
}

/// `value` as JSON; for a generic model (`model::generic`), an object with its label as the
/// `generic` field.
pub(crate) fn json_labelled<T: serde::Serialize>(value: &T, model: &model::ModelDescription) -> String {
    let Some(label) = model::generic::of(model) else { return crate::json_text(value) };
    match (serde_json::to_value(value), serde_json::to_value(label)) {
        (Ok(serde_json::Value::Object(mut object)), Ok(label)) => {
            object.insert("generic".into(), label);
            crate::json_text(&object)
        }
        _ => crate::json_text(value),
    }
}

/// Reads the inputs, places the model as `map` says and simulates the step.
pub(crate) fn simulate(inputs: &Inputs, map: &MapSource) -> Result<Simulated, InputError> {
    let plan_file = map.plan.as_deref().map(read_plan_file).transpose()?;
    let naming = match (map.naming, &plan_file) {
        (_, Some(p)) if p.target == vramplan_solver::Runtime::AccelerateV4.name() => Naming::V4,
        (NamingArg::V5, _) => Naming::V5,
        (NamingArg::V4, _) => Naming::V4,
    };
    let loaded = inputs.load(naming, plan_file.as_ref().map(|p| p.workload.clone()))?;
    let Loaded { model, hardware, workload, warnings } = &loaded;
    let mut warnings = warnings.clone();
    if let (Some(plan), Some(path)) = (&plan_file, &map.plan) {
        check_plan_model(plan, path, &inputs.model, model, naming, &mut warnings)?;
    }
    let gpus = u32::try_from(hardware.devices.len()).unwrap_or(u32::MAX);
    let placement = match (&map.device_map, &plan_file, &map.plan) {
        (_, Some(p), Some(path)) => Placement::from_entries(p.entries(&path.display().to_string(), gpus)?),
        (Some(path), _, _) => {
            if workload.parallelism != Parallelism::Single {
                return Err(device_map_needs_one_copy(
                    "--device-map",
                    "leave out --device-map, or use `--parallel single` with it",
                ));
            }
            device_map::placement_from_device_map(path, model, hardware)?
        }
        (None, _, _) => default_placement(model, hardware, workload),
    };
    let mut estimate = vramplan_sim::estimate(model, hardware, workload, &placement)?;
    let mut all_warnings = warnings;
    if map.device_map.is_none() && plan_file.is_none() && placement.gpus().len() > 1 {
        all_warnings.push(format!(
            "no --device-map: the model's layers are split evenly over the {} GPUs (like \
             `device_map=\"balanced\"`), one batch in flight; give the map you use, or run \
             `vramplan plan` for the best one",
            placement.gpus().len()
        ));
    }
    merge_warnings(&mut all_warnings, std::mem::take(&mut estimate.warnings));
    estimate.warnings = all_warnings;
    let runtime = match naming {
        Naming::V4 => vramplan_solver::Runtime::AccelerateV4,
        Naming::V5 => vramplan_solver::Runtime::Accelerate,
    };
    Ok(Simulated { loaded, placement, runtime, estimate })
}

/// The line that says what each rank holds, under data parallelism (one section per rank
/// follows); empty otherwise.
pub(crate) fn data_parallel_heading(workload: &Workload, hardware: &hardware::HardwareProfile) -> String {
    if !vramplan_sim::estimate::is_data_parallel(workload) {
        return String::new();
    }
    vramplan_reports::data_parallel_line(&workload.parallelism, hardware.devices.len()).unwrap_or_default()
}

/// Refuses a plan file written for another model than `given`: the same spelling, or a spec
/// that loads to the same description (a built-in name and its config, two paths to one
/// folder), passes. Where the plan's model cannot be read from here (a relative path from
/// another folder), its device map must name only modules of the given model, and a warning
/// says that only that was checked.
fn check_plan_model(
    plan: &PlanFile,
    path: &Path,
    given: &str,
    model: &model::ModelDescription,
    naming: Naming,
    warnings: &mut Vec<String>,
) -> Result<(), InputError> {
    if plan.model == given {
        return Ok(());
    }
    let mismatch = |why: String| {
        InputError::new(
            path.display().to_string(),
            format!("the plan was written for `{}`, not `{given}`: {why}", plan.model),
        )
        .at_key("model")
        .with_fix(format!(
            "estimate the model the plan is for (`vramplan estimate {} --plan {}`), or plan `{given}` and \
                 write its own plan (`vramplan plan {given} --hardware {} -o plan.yaml`)",
            plan.model,
            path.display(),
            plan.hardware
        ))
    };
    match model::load(&plan.model, ImportOptions { naming }) {
        Ok(mut planned) => {
            planned.name = model.name.clone();
            planned.notes = model.notes.clone();
            if planned == *model {
                Ok(())
            } else {
                let shape = |m: &model::ModelDescription| {
                    format!("{} parameters in {} layers", m.params(), m.facts.layers.len())
                };
                Err(mismatch(format!(
                    "a different model ({} has {}, {given} has {})",
                    plan.model,
                    shape(&planned),
                    shape(model)
                )))
            }
        }
        Err(_) => {
            let unknown = plan
                .device_map
                .0
                .iter()
                .map(|(key, _)| key)
                .find(|key| !key.is_empty() && !model.has_path(key));
            if let Some(key) = unknown {
                return Err(mismatch(format!("its device map places `{key}`, which {given} does not have")));
            }
            warnings.push(format!(
                "{} was written for `{}`, which cannot be read from here; only that its device map names \
                 modules of `{given}` was checked",
                path.display(),
                plan.model
            ));
            Ok(())
        }
    }
}
