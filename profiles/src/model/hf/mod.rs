//! HF `config.json` importers: one module per architecture family, a dispatch on the
//! `architectures` entry, the typed config accessor they share, and the few steps every importer
//! takes alike (reading the core sizes, listing dense layers, assembling the description).
//!
//! Each importer builds the module tree transformers builds for that class, with the same
//! module and parameter names, in the naming the options ask for (5.x by default).

mod bert;
mod bloom;
mod cohere2;
mod config;
pub(crate) use config::describe as describe_value;
mod deepseek;
mod falcon;
mod falcon_h1;
mod gemma3_vl;
mod glm4;
mod gpt2;
mod heads;
mod mistral3_vl;
mod nested_text;
pub use heads::classes as head_classes;
pub(crate) use heads::{TASKS as HEAD_TASKS, class_for as head_class_for};
mod gpt_neox;
mod llama;
mod llama4;
mod llama4_vl;
mod opt;
mod phi;
mod phi4_mm;
mod qwen3_vl;
mod qwen_vl;
mod t5;
mod xlnet;

pub use config::HfConfig;

use super::{ArchFacts, ImportOptions, LayerFacts, ModelDescription, Module, StackKind};
use crate::{DType, InputError};
use std::path::Path;

/// The top-level classes vramplan builds from a `config.json`.
pub const SUPPORTED: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "GPTNeoXForCausalLM",
    "GPT2LMHeadModel",
    "PhiForCausalLM",
    "Phi3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "FalconForCausalLM",
    "OPTForCausalLM",
    "BloomForCausalLM",
    "GPTBigCodeForCausalLM",
    "GptOssForCausalLM",
    "OlmoeForCausalLM",
    "Gemma3ForCausalLM",
    "GraniteForCausalLM",
    "SmolLM3ForCausalLM",
    "T5ForConditionalGeneration",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertModel",
    "XLNetLMHeadModel",
    "Qwen2_5_VLForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "Qwen3VLForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
    "FalconH1ForCausalLM",
    "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration",
    "Glm4ForCausalLM",
    "Cohere2ForCausalLM",
    "Phi4MultimodalForCausalLM",
];

/// The name transformers loads checkpoint tensor `name` under in class `arch` (in `naming`),
/// where its conversion mapping renames it (published checkpoints of some classes keep older
/// names).
pub(crate) fn checkpoint_name(arch: &str, naming: super::Naming, name: &str) -> Option<String> {
    match arch {
        "Qwen2_5_VLForConditionalGeneration" => qwen_vl::checkpoint_name(name),
        "Gemma3ForConditionalGeneration" => {
            let moved = llava_checkpoint_name(name)?;
            // 5.x's SigLIP tower has no `vision_model` level (`SiglipVisionModel`'s base-model
            // prefix, which loading removes); 4.x keeps it.
            Some(match (naming, moved.strip_prefix("model.vision_tower.vision_model.")) {
                (super::Naming::V5, Some(rest)) => format!("model.vision_tower.{rest}"),
                _ => moved,
            })
        }
        "Mistral3ForConditionalGeneration" => llava_checkpoint_name(name),
        _ => None,
    }
}

/// LLaVA-style checkpoints (Gemma 3 and Mistral 3 as published) keep the language model's
/// `…ForCausalLM` names under `language_model.` and the tower and projector at the top; the
/// classes' conversion mapping moves them under `model.` (4.5x's `_checkpoint_conversion_mapping`
/// of both classes, the "llava" entry of 5.x's `conversion_mapping.py`).
fn llava_checkpoint_name(name: &str) -> Option<String> {
    const MOVES: [(&str, &str); 4] = [
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ];
    MOVES.iter().find_map(|(from, to)| name.strip_prefix(from).map(|rest| format!("{to}{rest}")))
}

/// Whether `arch` has an importer here; a folder (or Hub id) whose config names another class
/// builds a generic model from its safetensors checkpoint (`model::generic`).
pub(crate) fn has_importer(arch: &str) -> bool {
    SUPPORTED.contains(&arch) || heads::builds(arch)
}

/// Reads and imports a `config.json` file.
pub fn from_config_file(path: &Path, options: ImportOptions) -> Result<ModelDescription, InputError> {
    let text = crate::files::read_text(path, crate::files::FileKind::ModelJson)?;
    from_config_text(&text, &path.display().to_string(), options)
}

/// Imports a `config.json` given as text; `origin` names it in errors and becomes the model name.
pub fn from_config_text(
    text: &str,
    origin: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let config = HfConfig::parse(text, origin)?;
    from_config(&config, options)
}

/// Builds the description for a parsed config, dispatching on its architecture, with the
/// config's `quantization_config` applied ([`super::quantization`]).
pub fn from_config(config: &HfConfig, options: ImportOptions) -> Result<ModelDescription, InputError> {
    let mut model = from_config_unquantized(config, options)?;
    super::quantization::apply(config, &mut model)?;
    super::summary::validate(&model, config.origin())?;
    Ok(model)
}

/// As [`from_config`], without applying `quantization_config`: the floating-point tree a
/// checkpoint's headers are laid over.
pub(crate) fn from_config_unquantized(
    config: &HfConfig,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let arch = config.architecture()?;
    let model = match arch.as_str() {
        "LlamaForCausalLM"
        | "MistralForCausalLM"
        | "MixtralForCausalLM"
        | "Qwen2ForCausalLM"
        | "Qwen2MoeForCausalLM"
        | "Qwen3ForCausalLM"
        | "Qwen3MoeForCausalLM"
        | "GemmaForCausalLM"
        | "Gemma2ForCausalLM"
        | "Phi3ForCausalLM"
        | "OlmoeForCausalLM"
        | "GptOssForCausalLM"
        | "Gemma3ForCausalLM"
        | "GraniteForCausalLM"
        | "SmolLM3ForCausalLM" => llama::build(config, &arch, options),
        "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => deepseek::build(config, &arch, options),
        "GPTNeoXForCausalLM" => gpt_neox::build(config, &arch, options),
        "GPT2LMHeadModel" | "GPTBigCodeForCausalLM" => gpt2::build(config, &arch, options),
        "PhiForCausalLM" => phi::build(config, &arch, options),
        "FalconForCausalLM" => falcon::build(config, &arch, options),
        "FalconH1ForCausalLM" => falcon_h1::build(config, &arch, options),
        "Llama4ForCausalLM" => llama4::build(config, &arch, options),
        "Llama4ForConditionalGeneration" => llama4_vl::build(config, &arch, options),
        "Glm4ForCausalLM" => glm4::build(config, &arch, options),
        "Cohere2ForCausalLM" => cohere2::build(config, &arch, options),
        "OPTForCausalLM" => opt::build(config, &arch, options),
        "BloomForCausalLM" => bloom::build(config, &arch, options),
        "T5ForConditionalGeneration" => t5::build(config, &arch, options),
        "BertForMaskedLM" | "BertModel" => bert::build(config, &arch, options),
        "XLNetLMHeadModel" => xlnet::build(config, &arch, options),
        "Qwen2_5_VLForConditionalGeneration" => qwen_vl::build(config, &arch, options),
        "Gemma3ForConditionalGeneration" => gemma3_vl::build(config, &arch, options),
        "Qwen3VLForConditionalGeneration" => qwen3_vl::build(config, &arch, options),
        "Mistral3ForConditionalGeneration" => mistral3_vl::build(config, &arch, options),
        "Phi4MultimodalForCausalLM" => phi4_mm::build(config, &arch, options),
        // Base models and task heads of every family (`LlamaModel`, `XLNetForQuestionAnswering`).
        head if heads::builds(head) => heads::build(config, head, options),
        other => {
            return Err(InputError::new(config.origin(), format!("unsupported architecture `{other}`"))
                .at_key("architectures")
                .with_fix(format!(
                    "vramplan builds these from a config.json: {}. For any other model, describe it \
                     in a custom YAML file (see docs/custom-models.md), optionally with `extend:` \
                     pointing at a supported config; or give the model's folder (or Hub id) with its \
                     safetensors checkpoint, which builds a generic model from the headers",
                    SUPPORTED.join(", ") + ", " + &heads::classes().join(", ")
                )));
        }
    }?;
    check_expert_count(&model, config)?;
    super::summary::validate(&model, config.origin())?;
    Ok(model)
}

/// The most routed experts over all layers (2¹⁶): Kimi K2 has 60 × 384 = 23,040, DeepSeek-V3
/// 58 × 256 = 14,848. Each is a placement choice for the solver and a module the simulator
/// replays, so the bound keeps `plan` and `estimate` to seconds (docs/limits.md).
const MAX_EXPERTS_IN_ALL_LAYERS: u64 = 1 << 16;

fn check_expert_count(model: &ModelDescription, config: &HfConfig) -> Result<(), InputError> {
    let Some(moe) = &model.facts.moe else { return Ok(()) };
    let moe_layers = model.facts.layers.iter().filter(|l| l.moe).count() as u64;
    let total = u64::from(moe.experts).saturating_mul(moe_layers);
    if total > MAX_EXPERTS_IN_ALL_LAYERS {
        let key = config
            .get(&["num_local_experts", "num_experts", "n_routed_experts"])
            .map_or("num_local_experts", |(k, _)| k);
        return Err(InputError::new(
            config.origin(),
            format!(
                "{} experts in each of {moe_layers} layers make {total} experts, past the bound of \
                 {MAX_EXPERTS_IN_ALL_LAYERS} (docs/limits.md)",
                moe.experts
            ),
        )
        .at_key(key)
        .with_fix(
            "check `num_hidden_layers` and the expert count; the largest real models have about 23,000",
        ));
    }
    Ok(())
}

/// Where a config keeps the three sizes every importer starts from; in each list the first key
/// present wins (e.g. `n_layer` before `num_hidden_layers` in GPT-2's own configs).
struct SizeKeys {
    layers: &'static [&'static str],
    hidden: &'static [&'static str],
    heads: &'static [&'static str],
}

/// The key names transformers' current config classes use.
const STANDARD_SIZE_KEYS: SizeKeys =
    SizeKeys { layers: &["num_hidden_layers"], hidden: &["hidden_size"], heads: &["num_attention_heads"] };

/// The block count, hidden width and attention-head count of a config, all required positive.
struct CoreSizes {
    layers: u64,
    hidden: u64,
    heads: u64,
    /// The key the head count came from, which errors about the head width point at.
    heads_key: &'static str,
}

impl SizeKeys {
    /// Reads layers, hidden width and heads, in that order, so the first bad key is the one
    /// reported.
    fn read(&self, config: &HfConfig) -> Result<CoreSizes, InputError> {
        let layers = config.positive(self.layers)?;
        let hidden = config.positive(self.hidden)?;
        let heads = config.positive(self.heads)?;
        // `positive` found one of the keys, so `get` does too.
        let heads_key = config.get(self.heads).map_or("", |(key, _)| key);
        Ok(CoreSizes { layers, hidden, heads, heads_key })
    }
}

/// The facts of the `count` blocks `{list}.0`, `{list}.1`, … of one stack, all with a dense MLP
/// and full attention; `cross_attention` says whether they also attend to an encoder's output.
fn dense_layers(list: &str, count: u64, stack: StackKind, cross_attention: bool) -> Vec<LayerFacts> {
    (0..count)
        .map(|i| LayerFacts {
            path: format!("{list}.{i}"),
            stack,
            moe: false,
            attention_window: None,
            cross_attention,
            ssm: None,
        })
        .collect()
}

/// The description of a model imported from `config`: named after the config's origin, with
/// `arch` as its class and the naming the options asked for; ties come afterwards (`tie_if`).
fn describe(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
    dtype: DType,
    facts: ArchFacts,
    root: Module,
    notes: Vec<String>,
) -> ModelDescription {
    ModelDescription {
        custom: false,
        name: config.origin().to_string(),
        architecture: arch.to_string(),
        naming: options.naming,
        dtype,
        facts,
        root,
        notes,
        quantization: None,
        float_forms: Default::default(),
    }
}

/// `description` with `tensor_path` tied to `canonical_path` when `tied` (an output head's
/// weight to the input embedding's, as the config's `tie_word_embeddings` says); fails if either
/// tensor was not built.
fn tie_if(
    tied: bool,
    mut description: ModelDescription,
    tensor_path: &str,
    canonical_path: &str,
) -> Result<ModelDescription, InputError> {
    if tied {
        description.tie(tensor_path, canonical_path)?;
    }
    Ok(description)
}
