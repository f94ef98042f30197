//! How a plan's map or an answer's model is loaded, where transformers loads it: the
//! `from_pretrained` call `plan -o` prints for an accelerate map ([`map_loading`]) and its
//! arguments as data (`plan --json`'s `load_kwargs`, [`LoadKwargs`]); the program that loads
//! it instead under another trainer or AutoAWQ's fused runtime ([`loading_program`]); and for a
//! pre-quantized method (AWQ, GPTQ; fp8 into a map with host entries), whose weights come from a
//! checkpoint quantized that way and never from the model's own repository, the call as a
//! comment with [`CHECKPOINT`] in that repository's place ([`prequantized`]), and the serving
//! commands' [`checkpoint_word`].

use super::run_flags::{RunFlags, pretrained_source};
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::workload::{Mode, Quant, Trainer, Workload};

/// The calls that load an accelerate map saved as `file` into `model` as it is (`plan -o`): the
/// model's own class and repository (or folder) with the map, its dtype, bitsandbytes'
/// `quantization_config` (with `llm_int8_enable_fp32_cpu_offload` once a module is on `cpu` or
/// `disk`, which bitsandbytes otherwise refuses) and `offload_folder` once one is on `disk`; for
/// a custom model, which no transformers class loads, accelerate's `dispatch_model` on the
/// user's own instance; for a workload another program runs (`--trainer` other than
/// `transformers`, `--awq-fused`), a comment only.
pub fn map_loading(
    file: &str,
    model: &ModelDescription,
    device_map: &[(String, vramplan_sim::placement::Target)],
    workload: &Workload,
) -> Vec<RunFlags> {
    // Another program loads the model its own way: no transformers call for it (as `run_flags`).
    if let Some(program) = loading_program(workload) {
        let mut note = RunFlags::new("#");
        note.arg(&format!("{program} run"), loaded_by_reason(&program));
        note.arg(
            "not printed as code",
            "vramplan prints runnable code for transformers/TRL, vLLM, SGLang and llama.cpp only",
        );
        return vec![note];
    }
    let map = format!("json.load(open({file:?}))");
    let Some(source) = pretrained_source(model) else {
        let mut note = RunFlags::new("#");
        note.arg("model", "your own model's instance (no transformers class loads a custom model)");
        let mut dispatch = RunFlags::new("dispatch_model");
        dispatch.assign = Some("model");
        dispatch.import("json", "");
        dispatch.import("accelerate", "dispatch_model");
        dispatch.positional.push("model".into());
        dispatch.arg("device_map", map);
        return vec![note, dispatch];
    };
    let mut load = RunFlags::new(format!("{}.from_pretrained", model.architecture));
    load.assign = Some("model");
    load.import("json", "");
    load.import("transformers", &model.architecture);
    load.positional.push(format!("{source:?}"));
    load.arg("device_map", map);
    // bitsandbytes quantizes at load; pre-quantized checkpoints carry their own config.
    let kwargs = LoadKwargs::of(model, device_map, workload);
    if let Some(dtype) = &kwargs.dtype {
        load.import("torch", "");
        load.arg("dtype", format!("torch.{dtype}"));
    }
    if let Some(config) = &kwargs.quantization_config {
        load.import("transformers", config.class);
        load.arg("quantization_config", config.python());
    }
    if let Some(folder) = &kwargs.offload_folder {
        load.arg("offload_folder", format!("{folder:?}"));
    }
    match &kwargs.prequantized {
        Some(method) => vec![checkpoint_note(load, &source, method)],
        None => vec![load],
    }
}

/// Whether `device_map` puts a module on the host (`cpu` or `disk`).
pub(super) fn on_host(device_map: &[(String, vramplan_sim::placement::Target)]) -> bool {
    use vramplan_sim::placement::Target;
    device_map.iter().any(|(_, t)| matches!(t, Target::Cpu | Target::Disk))
}

/// The program other than transformers that loads the model for `workload`, by its name:
/// AutoAWQ for inference under `--awq-fused`, the `--trainer` word (`torchtune`, `unsloth`,
/// `litgpt`, `fsdp-qlora`) for another trainer; `None` where transformers loads it
/// (`from_pretrained`, the HF Trainer/TRL).
pub fn loading_program(workload: &Workload) -> Option<String> {
    match (workload.awq_fused, workload.trainer, workload.mode) {
        (Some(_), _, Mode::Inference) => Some("AutoAWQ".to_string()),
        (_, Trainer::Transformers, _) => None,
        (_, trainer, _) => Some(vramplan_sim::input::trainer_word(trainer).to_string()),
    }
}

/// Why no transformers call loads a map for `program` ([`loading_program`]): what `plan -o`
/// prints as a comment and `plan --json` gives as `loaded_by.reason`.
pub fn loaded_by_reason(program: &str) -> String {
    format!(
        "{program} loads the model itself; the map names transformers' modules, for a loader that takes an \
         accelerate device map"
    )
}

/// The method and layout of a pre-quantized checkpoint (`AWQ (4-bit, group size 128)`) where
/// `quant` is one that transformers, vLLM and SGLang read from a checkpoint quantized that way
/// (its config.json's `quantization_config`: AWQ, GPTQ): the model's own repository holds the
/// unquantized weights, which `from_pretrained` would load as they are. fp8 too where the map
/// puts modules on `cpu` or `disk` (`host`): transformers quantizes fp8 while loading only onto
/// accelerators (`FineGrainedFP8HfQuantizer.validate_environment` refuses a map with cpu/disk
/// entries unless the checkpoint is pre-quantized). `None` for weights quantized while loading
/// (bitsandbytes, fp8 onto GPUs) or loaded as stored, and for a `model` whose own checkpoint is
/// already quantized (its config's `quantization_config`), which loads as it is.
pub fn prequantized(model: &ModelDescription, quant: &Quant, host: bool) -> Option<String> {
    if model.quantization.is_some() {
        return None;
    }
    let (method, bits, group_size) = match quant {
        Quant::Awq { bits, group_size } => ("AWQ", bits, group_size),
        Quant::Gptq { bits, group_size } => ("GPTQ", bits, group_size),
        Quant::Fp8 { block } if host => return Some(format!("FP8 (blocks of {block} × {block})")),
        _ => return None,
    };
    Some(format!("{method} ({bits}-bit, group size {group_size})"))
}

/// The placeholder the loading call of a pre-quantized checkpoint takes for its repository.
pub const CHECKPOINT: &str = "CHECKPOINT";

/// What the `# checkpoint:` comment says: which checkpoint to give as [`CHECKPOINT`] in place
/// of the model's own repository `source`.
fn checkpoint_text(source: &str, method: &str) -> String {
    format!(
        "this runs a checkpoint already quantized with {method}, not {source:?}, whose weights are not quantized: \
         give that checkpoint's repository or folder (its config.json holds the quantization_config) as \
         {CHECKPOINT} below"
    )
}

/// The shell word that stands for a checkpoint of `source` already quantized with `method` in
/// a serving command: `${CHECKPOINT:?…}`, which the shell expands to the checkpoint the user
/// names in `CHECKPOINT` and stops at, with the message, while it is unset (POSIX parameter
/// expansion), so the line runs as printed once the variable is set. Unquoted: the caller
/// quotes it for the shell.
pub fn checkpoint_word(source: Option<&str>, method: &str) -> String {
    // The message is inside the expansion: no `}` (its end), `$`, backquote, quote or backslash.
    let of = match source {
        Some(source) if !source.contains(['}', '$', '`', '"', '\\']) => format!(" of {source}"),
        _ => String::new(),
    };
    format!(
        "${{{CHECKPOINT}:?set {CHECKPOINT} to the Hub repository or folder of a checkpoint{of} already quantized with {method}}}"
    )
}

/// A serving engine's command `serve` for `answer`: as it is, or for a pre-quantized method
/// ([`prequantized`]; vLLM and SGLang read AWQ and GPTQ from the checkpoint's config) with
/// [`checkpoint_word`] in place of the model's own repository.
pub(super) fn prequantized_command(
    model: &ModelDescription,
    answer: &Workload,
    mut serve: RunFlags,
) -> RunFlags {
    let (Some(method), Some(source)) = (prequantized(model, &answer.quant, false), pretrained_source(model))
    else {
        return serve;
    };
    let word = format!("\"{}\"", checkpoint_word(Some(&source), &method));
    for (name, value) in &mut serve.args {
        if *name == source && value.is_empty() {
            *name = word.clone();
        } else if *value == source {
            *value = word.clone();
        }
    }
    serve
}

/// A loading call of a pre-quantized `method` ([`prequantized`]) as comments, not code: which
/// checkpoint to load in place of the model's own repository `source` (whose weights are not
/// quantized), and the call itself, imports first, with [`CHECKPOINT`] for that checkpoint.
pub(super) fn checkpoint_note(mut load: RunFlags, source: &str, method: &str) -> RunFlags {
    load.positional = vec![CHECKPOINT.to_string()];
    let mut plain: Vec<&str> = Vec::new();
    let mut from: Vec<String> = Vec::new();
    for (module, name) in &load.imports {
        if name.is_empty() {
            plain.push(module);
        } else {
            from.push(format!("from {module} import {name}"));
        }
    }
    let mut statements = Vec::new();
    if !plain.is_empty() {
        statements.push(format!("import {}", plain.join(", ")));
    }
    statements.extend(from);
    let mut args = load.positional.clone();
    args.extend(load.args.iter().map(|(n, v)| format!("{n}={v}")));
    let assign = load.assign.map_or_else(String::new, |a| format!("{a} = "));
    statements.push(format!("{assign}{}({})", load.call, args.join(", ")));
    let mut note = RunFlags::new("#");
    note.arg("checkpoint", checkpoint_text(source, method));
    note.arg("load it", statements.join("; "));
    note.device_map = load.device_map;
    note
}

/// transformers' `quantization_config` for `quant` as a Python literal (`BitsAndBytesConfig`,
/// or `FineGrainedFP8Config` for fp8); `cpu_offload` adds bitsandbytes' switch for modules kept
/// on the CPU (`llm_int8_enable_fp32_cpu_offload`). `None` for weights loaded as stored.
pub fn quantization_config(quant: &Quant, cpu_offload: bool) -> Option<String> {
    QuantizationConfig::of(quant, cpu_offload).map(|config| config.python())
}

/// A transformers quantization config as data: its class and keyword arguments in order
/// ([`quantization_config`] writes it as Python; `plan --json` carries it in `load_kwargs`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizationConfig {
    /// `BitsAndBytesConfig`, `FineGrainedFP8Config`.
    pub class: &'static str,
    /// Each keyword argument and its value (booleans, strings, integer tuples as lists).
    pub kwargs: Vec<(&'static str, serde_json::Value)>,
}

impl QuantizationConfig {
    /// The config transformers loads `quant` with (see [`quantization_config`]).
    pub fn of(quant: &Quant, cpu_offload: bool) -> Option<QuantizationConfig> {
        use serde_json::Value;
        let mut kwargs = Vec::new();
        let class = match quant {
            Quant::Int8 => {
                kwargs.push(("load_in_8bit", Value::Bool(true)));
                "BitsAndBytesConfig"
            }
            Quant::Nf4 { double_quant } | Quant::Fp4 { double_quant } => {
                let kind = if matches!(quant, Quant::Nf4 { .. }) { "nf4" } else { "fp4" };
                kwargs.push(("load_in_4bit", Value::Bool(true)));
                kwargs.push(("bnb_4bit_quant_type", Value::from(kind)));
                if *double_quant {
                    kwargs.push(("bnb_4bit_use_double_quant", Value::Bool(true)));
                }
                "BitsAndBytesConfig"
            }
            Quant::Fp8 { block } => {
                return Some(QuantizationConfig {
                    class: "FineGrainedFP8Config",
                    kwargs: vec![("weight_block_size", Value::from(vec![*block, *block]))],
                });
            }
            _ => return None,
        };
        if cpu_offload {
            kwargs.push(("llm_int8_enable_fp32_cpu_offload", Value::Bool(true)));
        }
        Some(QuantizationConfig { class, kwargs })
    }

    /// The config as a Python expression: `BitsAndBytesConfig(load_in_4bit=True, …)`.
    pub fn python(&self) -> String {
        fn literal(value: &serde_json::Value) -> String {
            match value {
                serde_json::Value::Bool(true) => "True".into(),
                serde_json::Value::Bool(false) => "False".into(),
                serde_json::Value::String(s) => format!("{s:?}"),
                serde_json::Value::Array(items) => {
                    format!("({})", items.iter().map(literal).collect::<Vec<_>>().join(", "))
                }
                other => other.to_string(),
            }
        }
        let args: Vec<String> = self.kwargs.iter().map(|(k, v)| format!("{k}={}", literal(v))).collect();
        format!("{}({})", self.class, args.join(", "))
    }
}

impl serde::Serialize for QuantizationConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Kwargs<'a>(&'a [(&'static str, serde_json::Value)]);
        impl serde::Serialize for Kwargs<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(self.0.len()))?;
                for (k, v) in self.0 {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("class", self.class)?;
        map.serialize_entry("kwargs", &Kwargs(&self.kwargs))?;
        map.end()
    }
}

/// `from_pretrained`'s other keyword arguments that load an accelerate map as it is, as data
/// (what [`map_loading`] writes as Python): the load dtype, bitsandbytes' or fp8's
/// quantization config, and `offload_folder` once a module is on `disk`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoadKwargs {
    /// torch's name of the load dtype (`bfloat16`), for `dtype=torch.bfloat16`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The quantization config transformers quantizes with while loading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization_config: Option<QuantizationConfig>,
    /// The folder for the modules on `disk`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload_folder: Option<String>,
    /// For AWQ and GPTQ, the method of the pre-quantized checkpoint these arguments load
    /// (`AWQ (4-bit, group size 128)`, [`prequantized`]): the model's own repository holds
    /// unquantized weights, so the call takes that checkpoint in its place. Not an argument.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequantized: Option<String>,
}

impl LoadKwargs {
    /// The arguments that load `device_map` of `model` for `workload` (see [`map_loading`]).
    pub fn of(
        model: &ModelDescription,
        device_map: &[(String, vramplan_sim::placement::Target)],
        workload: &Workload,
    ) -> LoadKwargs {
        use vramplan_sim::placement::Target;
        let bitsandbytes = matches!(workload.quant, Quant::Int8 | Quant::Nf4 { .. } | Quant::Fp4 { .. });
        let host = on_host(device_map);
        // Quantized while loading: bitsandbytes anywhere, fp8 onto accelerators only
        // ([`prequantized`] otherwise).
        let at_load = bitsandbytes || (matches!(workload.quant, Quant::Fp8 { .. }) && !host);
        LoadKwargs {
            dtype: workload.weight_dtype.filter(|d| d.is_float()).map(|d| d.torch_name().to_string()),
            quantization_config: QuantizationConfig::of(&workload.quant, host).filter(|_| at_load),
            offload_folder: device_map.iter().any(|(_, t)| *t == Target::Disk).then(|| "offload".to_string()),
            prequantized: prequantized(model, &workload.quant, host),
        }
    }
}
