//! HF `config.json` importers: one module per architecture family, a dispatch on the
//! `architectures` entry, and the typed config accessor they share.
//!
//! Each importer builds the module tree transformers builds for that class, with the same
//! module and parameter names, in the naming the options ask for (5.x by default).

mod bert;
mod bloom;
mod config;
mod deepseek;
mod falcon;
mod gpt2;
mod gpt_neox;
mod llama;
mod opt;
mod phi;
mod t5;
mod xlnet;

pub use config::HfConfig;

use super::{ImportOptions, ModelDescription};
use crate::InputError;
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
    "T5ForConditionalGeneration",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertModel",
    "XLNetLMHeadModel",
];

/// Reads and imports a `config.json` file.
pub fn from_config_file(path: &Path, options: ImportOptions) -> Result<ModelDescription, InputError> {
    let text = std::fs::read_to_string(path).map_err(|e| InputError::io(path, &e))?;
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

/// Builds the description for a parsed config, dispatching on its architecture.
pub fn from_config(config: &HfConfig, options: ImportOptions) -> Result<ModelDescription, InputError> {
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
        | "GptOssForCausalLM" => llama::build(config, &arch, options),
        "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => deepseek::build(config, &arch, options),
        "GPTNeoXForCausalLM" => gpt_neox::build(config, &arch, options),
        "GPT2LMHeadModel" | "GPTBigCodeForCausalLM" => gpt2::build(config, &arch, options),
        "PhiForCausalLM" => phi::build(config, &arch, options),
        "FalconForCausalLM" => falcon::build(config, &arch, options),
        "OPTForCausalLM" => opt::build(config, &arch, options),
        "BloomForCausalLM" => bloom::build(config, &arch, options),
        "T5ForConditionalGeneration" => t5::build(config, &arch, options),
        "BertForMaskedLM" | "BertForSequenceClassification" | "BertModel" => {
            bert::build(config, &arch, options)
        }
        "XLNetLMHeadModel" => xlnet::build(config, &arch, options),
        other => {
            return Err(InputError::new(config.origin(), format!("unsupported architecture `{other}`"))
                .at_key("architectures")
                .with_fix(format!(
                    "vramplan builds these from a config.json: {}. For any other model, describe it \
                     in a custom YAML file (see docs/custom-models.md), optionally with `extend:` \
                     pointing at a supported config",
                    SUPPORTED.join(", ")
                )));
        }
    }?;
    super::summary::validate(&model, config.origin())?;
    Ok(model)
}
