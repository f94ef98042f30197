//! What every command that simulates reads: the model ([`ModelSource`]), the hardware, and the
//! workload (a YAML file with the flags over it), read and checked into [`Loaded`]; and what
//! the runtime holds of a pre-quantized checkpoint on the hardware ([`held_by_runtime`]).

use std::path::{Path, PathBuf};
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming};
use vramplan_sim::input::{self, WorkloadFlags, WorkloadSource};
use vramplan_sim::workload::{Engine, Workload};

/// Where a model's description comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// What the command line takes: a built-in name (`mixtral-8x7b`), a config.json, a model
    /// folder, a custom YAML, a Hugging Face Hub id (`org/name[@revision]`, `org/name:Q4_K_M`
    /// for a GGUF file), or a GGUF file.
    Spec(String),
    /// A `config.json` given as text (a Python `dict` or `PretrainedConfig` serialised);
    /// `origin` names it in errors and becomes the model's name.
    ConfigJson {
        /// The config's JSON text.
        text: String,
        /// What to call it: the model's name and the origin of errors.
        origin: String,
    },
    /// A description already built (by the binding, from a torch module). Used as it is: the
    /// module naming a command asks for does not change it.
    Description(Box<ModelDescription>),
}

impl Default for ModelSource {
    fn default() -> ModelSource {
        ModelSource::Spec(String::new())
    }
}

impl From<&str> for ModelSource {
    fn from(spec: &str) -> ModelSource {
        ModelSource::Spec(spec.to_string())
    }
}

impl ModelSource {
    /// The description, with `options` (the module naming) where the source is read here.
    pub fn load(&self, options: ImportOptions) -> Result<ModelDescription, InputError> {
        match self {
            ModelSource::Spec(spec) => model::load(spec, options),
            ModelSource::ConfigJson { text, origin } => model::hf::from_config_text(text, origin, options),
            ModelSource::Description(description) => Ok((**description).clone()),
        }
    }

    /// How the model is named where a spec is written: in a plan file (`model:`), in a fix's
    /// command line. The spec as given, a config's origin, or a description's name.
    pub fn spec(&self) -> &str {
        match self {
            ModelSource::Spec(spec) => spec,
            ModelSource::ConfigJson { origin, .. } => origin,
            ModelSource::Description(description) => &description.name,
        }
    }
}

/// The model, the hardware and the workload, as the flags give them.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The model.
    pub model: ModelSource,
    /// A built-in profile (`t4x2`, `a100-80gb-x4`), a short form (`2xt4`) or a YAML file; for
    /// `whatif cheapest` and `grid`, a comma list or `all`.
    pub hardware: String,
    /// A workload YAML file (docs/workloads.md); the flags override it.
    pub workload: Option<PathBuf>,
    /// The workload flags (docs/workloads.md), as typed.
    pub flags: WorkloadFlags,
    /// The activations a script measured (`vramplan validate --script FILE.py --trace-out
    /// FILE`), in place of declared or modelled ones (docs/validate-script.md).
    pub activations: Option<PathBuf>,
}

/// The inputs, read and checked.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The model, as the runtime holds it on this hardware.
    pub model: ModelDescription,
    /// The hardware profile.
    pub hardware: HardwareProfile,
    /// The workload: the file (or a plan's, or the defaults) with the flags over it.
    pub workload: Workload,
    /// What the workload checks found odd for this model and hardware.
    pub warnings: Vec<String>,
}

impl Inputs {
    /// Reads the model with `naming` and the hardware, and the workload: the workload file,
    /// else `fallback` (a plan file's, with its path), else the defaults, with the flags over it.
    pub fn load(&self, naming: Naming, fallback: Option<(Workload, &Path)>) -> Result<Loaded, InputError> {
        self.load_on(naming, fallback, &self.hardware)
    }

    /// As [`Inputs::load`], on the hardware `spec` instead of [`Inputs::hardware`] (one of a
    /// list). `fallback` is a plan's workload and the plan file's path, which its errors name.
    pub fn load_on(
        &self,
        naming: Naming,
        fallback: Option<(Workload, &Path)>,
        spec: &str,
    ) -> Result<Loaded, InputError> {
        let mut model = self.model.load(ImportOptions { naming })?;
        if let Some(path) = &self.activations {
            measured_activations(&mut model, path)?;
        }
        let hardware = hardware::load(spec)?;
        let base = match (&self.workload, &fallback) {
            (Some(path), _) => input::workload_from_yaml(path)?,
            (None, Some((workload, _))) => workload.clone(),
            (None, None) => Workload::default(),
        };
        let mut workload = self.flags.apply(base)?;
        let seq_given = self.flags.seq.is_some() || self.workload.is_some();
        let note = input::fit_default_seq(&mut workload, seq_given, &model);
        let mut loading = Vec::new();
        fp8_while_loading(&model, &hardware, &mut workload, &mut loading)?;
        let mut warnings = input::validate(&workload, &model, &hardware)
            .map_err(|e| self.place_error(e, fallback.as_ref().map(|(w, p)| (w, *p))))?;
        warnings.extend(note);
        warnings.extend(loading);
        let model = held_by_runtime(model, &hardware, &workload, &mut warnings)?;
        Ok(Loaded { model, hardware, workload, warnings })
    }

    /// `err`, from the checks or the simulation of the workload these inputs make (the workload
    /// file, else `fallback`, a plan's workload and the plan file's path, with the flags over
    /// it), placed in the file that set its key ([`input::place_check_error`]).
    pub fn place_error(&self, err: InputError, fallback: Option<(&Workload, &Path)>) -> InputError {
        match (&self.workload, fallback) {
            (Some(path), _) => match input::workload_from_yaml(path) {
                Ok(base) => input::place_check_error(err, &base, &self.flags, WorkloadSource::File(path)),
                Err(_) => err,
            },
            (None, Some((base, plan))) => {
                input::place_check_error(err, base, &self.flags, WorkloadSource::Plan(plan))
            }
            (None, None) => err,
        }
    }
}

/// Declares on `model` the activations of the run `path` (a `--trace-out` file) measured.
fn measured_activations(model: &mut ModelDescription, path: &Path) -> Result<(), InputError> {
    let file = crate::script::read_trace_file(path, "--activations")?;
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

/// `--quant fp8` under transformers, which quantizes while loading with `FineGrainedFP8Config`:
/// its `validate_environment` is the one a pre-quantized fp8 checkpoint meets
/// ([`method_handling`](vramplan_profiles::model::quantization::held::method_handling)), so on a
/// GPU below compute capability 8.9 transformers 5.x sets `dequantize` and
/// `replace_with_fp8_linear` converts no layer: the weights load unquantized, in the load dtype,
/// and the workload is sized so (with a warning); 4.x refuses. The oldest GPU decides, as in
/// [`held_by_runtime`]. vLLM and SGLang keep fp8 storage from 7.5 (FP8 Marlin) and are
/// [`held_by_runtime`]'s.
pub(crate) fn fp8_while_loading(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &mut Workload,
    warnings: &mut Vec<String>,
) -> Result<(), InputError> {
    use vramplan_profiles::model::quantization::Method;
    use vramplan_profiles::model::quantization::held::{Handling, Loader, method_handling};
    use vramplan_sim::workload::Quant;
    let Quant::Fp8 { block } = workload.quant else { return Ok(()) };
    if workload.engine != Engine::Transformers || model.quantization.is_some() {
        return Ok(());
    }
    let Some(capability) = hardware.devices.iter().map(|d| d.compute_capability).min() else {
        return Ok(());
    };
    let method = Method::Fp8 {
        block: Some([u64::from(block); 2]),
        weight_dtype: vramplan_profiles::DType::F8E4M3,
        e8m0_scales: false,
        static_activations: false,
    };
    let load_dtype = workload.weight_dtype.unwrap_or(model.dtype);
    match method_handling(&method, model.naming, Loader::Transformers, capability, load_dtype) {
        Handling::Kept => Ok(()),
        Handling::Dequantized { to, .. } => {
            workload.quant = Quant::None;
            warnings.push(format!(
                "transformers quantizes `--quant fp8` while loading only on GPUs of compute capability 8.9 or later; on this one ({capability}) `FineGrainedFP8Config` leaves every layer unquantized (its `validate_environment` sets `dequantize`), so the weights are sized in {}: serve with vLLM (`--engine vllm`, fp8 weight-only from 7.5) to keep them in fp8",
                to.name()
            ));
            Ok(())
        }
        Handling::Refused { needs } => Err(InputError::new(
            "--quant",
            format!(
                "transformers 4.x does not quantize fp8 while loading on a GPU of compute capability {capability}: it needs {needs} or later"
            ),
        )
        .with_fix("use transformers 5.x (`--naming v5`), which loads the weights unquantized there, or `--engine vllm`")),
    }
}

/// What the runtime holds of a pre-quantized checkpoint on these GPUs (the oldest one
/// decides: every GPU loads the same weights): the stored layout where it has the kernels, the
/// dequantized model where it falls back (with a warning), or a refusal where it stops.
/// llama.cpp reads GGUF files, not the checkpoint's layout.
pub(crate) fn held_by_runtime(
    model: ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    warnings: &mut Vec<String>,
) -> Result<ModelDescription, InputError> {
    use vramplan_profiles::model::quantization::held::{Loader, held_on};
    let loader = match workload.engine {
        Engine::Transformers => Loader::Transformers,
        // SGLang runs a checkpoint's quantization with the kernels vLLM holds it with.
        Engine::Vllm { .. } | Engine::Sglang { .. } => Loader::Vllm,
        Engine::LlamaCpp { .. } => return Ok(model),
    };
    // vLLM runs on its tensor-parallel group, transformers on any of the GPUs.
    let gpus = match workload.engine {
        Engine::Vllm { .. } | Engine::Sglang { .. } => workload.tensor_parallel_size() as usize,
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
