//! `estimate`: reads the inputs, places the model (a device map, a plan file's map, or the
//! default: everything on GPU 0, or one copy split evenly over the GPUs; under data
//! parallelism, a replica on every GPU, one section per rank), and simulates one step. The
//! placement is what `plot` and `report` draw from too ([`simulate`]).

use crate::inputs::{Inputs, Loaded, device_map_needs_one_copy, merge_warnings};
use crate::{InputError, Outcome};
use std::path::{Path, PathBuf};
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming};
use vramplan_sim::workload::{Engine, Parallelism, Workload};
use vramplan_sim::{Placement, device_map};
use vramplan_solver::export::{PlanFile, read_plan_file};

/// A device map: a JSON file, or the entries in memory in their order (accelerate runs what a
/// map offloads on the first GPU it lists, so the order is kept).
#[derive(Debug, Clone)]
pub enum DeviceMapSource {
    /// An accelerate `device_map` JSON file.
    File(PathBuf),
    /// Module name → device (a GPU index, `"cpu"`, `"disk"`, `"cuda:1"`), in order; read as the
    /// file would be, with `device_map` as its origin in errors.
    Entries(Vec<(String, serde_json::Value)>),
}

impl DeviceMapSource {
    /// How errors name it.
    pub fn origin(&self) -> String {
        match self {
            DeviceMapSource::File(path) => path.display().to_string(),
            DeviceMapSource::Entries(_) => "device_map".to_string(),
        }
    }

    /// Entries given in memory as the JSON text of a device-map file.
    fn entries_text(entries: &[(String, serde_json::Value)]) -> String {
        let pairs: Vec<String> = entries
            .iter()
            .map(|(key, value)| format!("{}: {value}", serde_json::Value::from(key.as_str())))
            .collect();
        format!("{{{}}}", pairs.join(", "))
    }

    /// Its entries for `model` on `hardware`, as written (repeats kept).
    pub(crate) fn read(
        &self,
        model: &ModelDescription,
        hardware: &HardwareProfile,
    ) -> Result<Vec<(String, vramplan_solver::Target)>, InputError> {
        match self {
            DeviceMapSource::File(path) => device_map::read_device_map(path, model, hardware),
            DeviceMapSource::Entries(entries) => device_map::read_device_map_text(
                &Self::entries_text(entries),
                &self.origin(),
                model,
                hardware,
            ),
        }
    }

    /// A placement of `model` on `hardware`, refusing a name listed twice and tensors left on
    /// no device.
    fn placement(
        &self,
        model: &ModelDescription,
        hardware: &HardwareProfile,
    ) -> Result<Placement, InputError> {
        match self {
            DeviceMapSource::File(path) => device_map::placement_from_device_map(path, model, hardware),
            DeviceMapSource::Entries(entries) => device_map::placement_from_device_map_text(
                &Self::entries_text(entries),
                &self.origin(),
                model,
                hardware,
            ),
        }
    }
}

/// Where the model is placed for a simulation: a device map, a plan file, or the default.
#[derive(Debug, Clone, Default)]
pub struct MapSource {
    /// A device map placing the model's modules (default: everything on GPU 0, or one copy
    /// split evenly over the GPUs).
    pub device_map: Option<DeviceMapSource>,
    /// A plan written by `vramplan plan -o plan.yaml`: its device map, and its workload unless
    /// a workload file is given (the flags still override). Not with `device_map`.
    pub plan: Option<PathBuf>,
    /// Module naming: transformers 5.x (default) or 4.x, as the device map uses (a plan for
    /// `accelerate-v4` reads as 4.x).
    pub naming: Naming,
}

impl MapSource {
    /// Whether a device map or a plan file was given.
    pub fn given(&self) -> bool {
        self.device_map.is_some() || self.plan.is_some()
    }
}

/// What `estimate` reads.
#[derive(Debug, Clone, Default)]
pub struct EstimateRequest {
    /// The model, hardware and workload.
    pub inputs: Inputs,
    /// Where the model is placed.
    pub map: MapSource,
}

/// A simulation's inputs, read and placed, and what it found.
#[derive(Debug, Clone)]
pub struct EstimateResult {
    /// The inputs as read.
    pub loaded: Loaded,
    /// Where the model was placed.
    pub placement: Placement,
    /// The runtime that loads the map (`accelerate`, or `accelerate-v4` for 4.x names).
    pub runtime: vramplan_solver::Runtime,
    /// The estimate, with every warning of the inputs and the placement merged in.
    pub estimate: vramplan_sim::Estimate,
}

impl EstimateResult {
    /// What `estimate --json` prints.
    pub fn to_json(&self) -> String {
        json_labelled(&self.estimate, &self.loaded.model)
    }

    /// Fits on every device, or not.
    pub fn outcome(&self) -> Outcome {
        Outcome::of(self.estimate.fits)
    }
}

/// `vramplan estimate`: reads the inputs, places the model as `request.map` says and simulates
/// the step.
pub fn estimate(request: &EstimateRequest) -> Result<EstimateResult, InputError> {
    simulate(&request.inputs, &request.map)
}

/// `value` as JSON; for a generic model (`model::generic`), an object with its label as the
/// `generic` field.
pub fn json_labelled<T: serde::Serialize>(value: &T, model: &ModelDescription) -> String {
    let Some(label) = model::generic::of(model) else { return crate::json_text(value) };
    match (serde_json::to_value(value), serde_json::to_value(label)) {
        (Ok(serde_json::Value::Object(mut object)), Ok(label)) => {
            object.insert("generic".into(), label);
            crate::json_text(&object)
        }
        _ => crate::json_text(value),
    }
}

/// Without a device map: everything on GPU 0, except that one copy of the model on a profile
/// with several GPUs (no DDP, ZeRO or tensor parallelism) is spread the way people run it there,
/// an even split of the layers in order, under transformers (vLLM and llama.cpp place the
/// model themselves). Under DDP and ZeRO the simulator puts a replica on every GPU of the
/// profile, each on its own (`vramplan_sim::estimate::data_parallel_estimate`).
fn default_placement(model: &ModelDescription, hardware: &HardwareProfile, workload: &Workload) -> Placement {
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

/// Reads the inputs, places the model as `map` says and simulates the step.
pub(crate) fn simulate(inputs: &Inputs, map: &MapSource) -> Result<EstimateResult, InputError> {
    if map.device_map.is_some() && map.plan.is_some() {
        return Err(InputError::new("--plan", "a plan file carries its own device map")
            .with_fix("give a device map or a plan, not both"));
    }
    let plan_file = map.plan.as_deref().map(read_plan_file).transpose()?;
    let naming = match &plan_file {
        Some(p) if p.target == vramplan_solver::Runtime::AccelerateV4.name() => Naming::V4,
        _ => map.naming,
    };
    let loaded = inputs.load(
        naming,
        plan_file.as_ref().zip(map.plan.as_deref()).map(|(p, path)| (p.workload.clone(), path)),
    )?;
    let Loaded { model, hardware, workload, warnings } = &loaded;
    let mut warnings = warnings.clone();
    if let (Some(plan), Some(path)) = (&plan_file, &map.plan) {
        check_plan_model(plan, path, inputs.model.spec(), model, naming, &mut warnings)?;
    }
    let gpus = u32::try_from(hardware.devices.len()).unwrap_or(u32::MAX);
    let placement = match (&map.device_map, &plan_file, &map.plan) {
        (_, Some(p), Some(path)) => {
            let origin = path.display().to_string();
            let entries = p.entries(&origin, gpus)?;
            // A data-parallel or serving plan has no map: each rank, or the engine, places it.
            let placed_by_runtime = vramplan_sim::estimate::is_data_parallel(workload)
                || matches!(workload.engine, Engine::Vllm { .. } | Engine::Sglang { .. });
            if entries.is_empty() && placed_by_runtime {
                Placement::from_entries(entries)
            } else {
                device_map::placement_from_entries(&origin, "device_map", entries, model)?
            }
        }
        (Some(source), _, _) => {
            if workload.parallelism != Parallelism::Single {
                return Err(device_map_needs_one_copy(
                    "--device-map",
                    "leave out --device-map, or use `--parallel single` with it",
                ));
            }
            source.placement(model, hardware)?
        }
        (None, _, _) => default_placement(model, hardware, workload),
    };
    let mut estimate = vramplan_sim::estimate(model, hardware, workload, &placement).map_err(|e| {
        inputs
            .place_error(e, plan_file.as_ref().zip(map.plan.as_deref()).map(|(p, path)| (&p.workload, path)))
    })?;
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
    Ok(EstimateResult { loaded, placement, runtime, estimate })
}

/// The line that says what each rank holds, under data parallelism (one section per rank
/// follows); empty otherwise.
pub fn data_parallel_heading(workload: &Workload, hardware: &HardwareProfile) -> String {
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
    model: &ModelDescription,
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
                let shape = |m: &ModelDescription| {
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
