//! Built-in models: published `config.json` files embedded in the binary, by short name.
//!
//! Each entry names the Hugging Face repository of the model and embeds that repository's
//! `config.json` from `profiles/catalog/models/<name>.json`. Where the embedded file was taken
//! from a sibling repository of the same architecture and shapes (an instruct variant, the
//! DeepSeek-R1 file standing in for DeepSeek-V3), the entry says which; `docs/models.md` lists
//! every entry with its parameter count.

/// One built-in model.
struct Entry {
    /// Short name users type (`mixtral-8x7b`).
    name: &'static str,
    /// The model's Hugging Face repository.
    repo: &'static str,
    /// The repository the embedded `config.json` was copied from, when not `repo` itself.
    config_from: Option<&'static str>,
    /// The embedded `config.json` text.
    config: &'static str,
}

macro_rules! entry {
    ($name:literal, $repo:literal) => {
        Entry {
            name: $name,
            repo: $repo,
            config_from: None,
            config: include_str!(concat!("../../catalog/models/", $name, ".json")),
        }
    };
    ($name:literal, $repo:literal, from $from:literal) => {
        Entry {
            name: $name,
            repo: $repo,
            config_from: Some($from),
            config: include_str!(concat!("../../catalog/models/", $name, ".json")),
        }
    };
}

const MODELS: &[Entry] = &[
    // GPT-NeoX (Pythia)
    entry!("pythia-410m", "EleutherAI/pythia-410m"),
    entry!("pythia-1b", "EleutherAI/pythia-1b"),
    entry!("pythia-2.8b", "EleutherAI/pythia-2.8b"),
    // GPT-2 and GPTBigCode
    entry!("gpt2", "openai-community/gpt2"),
    entry!("starcoder", "bigcode/starcoder"),
    entry!("octocoder", "bigcode/octocoder"),
    // Encoders and encoder-decoders
    entry!("bert-base-uncased", "google-bert/bert-base-uncased"),
    entry!("bert-base-cased", "google-bert/bert-base-cased"),
    entry!("bert-large-uncased", "google-bert/bert-large-uncased"),
    entry!("xlnet-base-cased", "xlnet/xlnet-base-cased"),
    entry!("t5-base", "google-t5/t5-base"),
    entry!("t0-3b", "bigscience/T0_3B"),
    // Llama 2 and Code Llama
    entry!("llama-2-7b", "meta-llama/Llama-2-7b-hf"),
    entry!("llama-2-13b", "meta-llama/Llama-2-13b-hf"),
    entry!("llama-2-70b", "meta-llama/Llama-2-70b-hf"),
    entry!("codellama-7b", "codellama/CodeLlama-7b-hf"),
    entry!("codellama-34b", "codellama/CodeLlama-34b-hf"),
    entry!("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"),
    // Llama 3.x
    entry!("llama-3-8b", "meta-llama/Meta-Llama-3-8B"),
    entry!("llama-3-70b", "meta-llama/Meta-Llama-3-70B"),
    entry!("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
    entry!("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    entry!("llama-3.1-70b", "meta-llama/Llama-3.1-70B"),
    entry!("llama-3.1-405b", "meta-llama/Llama-3.1-405B"),
    entry!("llama-3.2-1b", "meta-llama/Llama-3.2-1B"),
    entry!("llama-3.2-3b", "meta-llama/Llama-3.2-3B"),
    entry!("llama-3.2-3b-instruct", "meta-llama/Llama-3.2-3B-Instruct"),
    entry!("llama-3.3-70b", "meta-llama/Llama-3.3-70B-Instruct"),
    // Mistral
    entry!("mistral-7b", "mistralai/Mistral-7B-v0.1"),
    entry!("mistral-small-3.1-24b-instruct", "mistralai/Mistral-Small-3.1-24B-Instruct-2503"),
    entry!("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1"),
    entry!("mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1"),
    // Qwen
    entry!("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B"),
    entry!("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", from "Qwen/Qwen2.5-1.5B-Instruct"),
    entry!("qwen2.5-3b", "Qwen/Qwen2.5-3B"),
    entry!("qwen2.5-7b", "Qwen/Qwen2.5-7B"),
    entry!("qwen2.5-14b", "Qwen/Qwen2.5-14B"),
    entry!("qwen2.5-32b", "Qwen/Qwen2.5-32B"),
    entry!("qwen2.5-72b", "Qwen/Qwen2.5-72B", from "Qwen/Qwen2.5-72B-Instruct"),
    entry!("qwen2.5-vl-7b-instruct", "Qwen/Qwen2.5-VL-7B-Instruct"),
    entry!("qwen3-vl-8b-instruct", "Qwen/Qwen3-VL-8B-Instruct"),
    entry!("qwen3-0.6b", "Qwen/Qwen3-0.6B"),
    entry!("qwen3-1.7b", "Qwen/Qwen3-1.7B"),
    entry!("qwen3-4b", "Qwen/Qwen3-4B"),
    entry!("qwen3-8b", "Qwen/Qwen3-8B"),
    entry!("qwen3-14b", "Qwen/Qwen3-14B"),
    entry!("qwen3-32b", "Qwen/Qwen3-32B"),
    entry!("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B"),
    entry!("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B"),
    entry!("qwen1.5-moe-a2.7b", "Qwen/Qwen1.5-MoE-A2.7B", from "Qwen/Qwen1.5-MoE-A2.7B-Chat"),
    // DeepSeek
    entry!("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite"),
    entry!("deepseek-v3", "deepseek-ai/DeepSeek-V3", from "deepseek-ai/DeepSeek-R1"),
    // Other mixtures of experts
    entry!("olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924"),
    entry!("gpt-oss-20b", "openai/gpt-oss-20b"),
    entry!("gpt-oss-120b", "openai/gpt-oss-120b"),
    // Phi
    entry!("phi-1.5", "microsoft/phi-1_5"),
    entry!("phi-2", "microsoft/phi-2"),
    entry!("phi-3-mini", "microsoft/Phi-3-mini-4k-instruct"),
    entry!("phi-4-multimodal-instruct", "microsoft/Phi-4-multimodal-instruct"),
    // Gemma
    entry!("gemma-2b", "google/gemma-2b"),
    entry!("gemma-2-2b", "google/gemma-2-2b"),
    entry!("gemma-2-9b", "google/gemma-2-9b"),
    entry!("gemma-2-27b", "google/gemma-2-27b"),
    entry!("gemma-3-1b-it", "google/gemma-3-1b-it"),
    entry!("gemma-3-4b-it", "google/gemma-3-4b-it"),
    // Granite, SmolLM3
    entry!("granite-3.3-8b-instruct", "ibm-granite/granite-3.3-8b-instruct"),
    entry!("smollm3-3b", "HuggingFaceTB/SmolLM3-3B"),
    // Falcon-H1: attention and Mamba-2 side by side in every block
    entry!("falcon-h1-0.5b-instruct", "tiiuae/Falcon-H1-0.5B-Instruct"),
    // Llama 4: a mixture of experts with a shared expert in every layer, chunked attention
    entry!("llama-4-scout-text", "meta-llama/Llama-4-Scout-17B-16E"),
    entry!("llama-4-scout-17b-16e", "meta-llama/Llama-4-Scout-17B-16E"),
    // BLOOM, Falcon, OPT
    entry!("bloom-560m", "bigscience/bloom-560m"),
    entry!("bloom-7b1", "bigscience/bloom-7b1"),
    entry!("falcon-7b", "tiiuae/falcon-7b"),
    entry!("opt-1.3b", "facebook/opt-1.3b"),
    entry!("opt-6.7b", "facebook/opt-6.7b"),
];

/// The published `preprocessor_config.json` of the built-in vision-language models, whose
/// image processor settings (the pixel bounds) decide an image's tokens.
const PREPROCESSORS: &[(&str, &str)] = &[
    (
        "qwen2.5-vl-7b-instruct",
        include_str!("../../catalog/models/qwen2.5-vl-7b-instruct.preprocessor_config.json"),
    ),
    ("gemma-3-4b-it", include_str!("../../catalog/models/gemma-3-4b-it.preprocessor_config.json")),
    (
        "qwen3-vl-8b-instruct",
        include_str!("../../catalog/models/qwen3-vl-8b-instruct.preprocessor_config.json"),
    ),
    (
        "mistral-small-3.1-24b-instruct",
        include_str!("../../catalog/models/mistral-small-3.1-24b-instruct.preprocessor_config.json"),
    ),
    (
        "phi-4-multimodal-instruct",
        include_str!("../../catalog/models/phi-4-multimodal-instruct.preprocessor_config.json"),
    ),
];

/// The embedded `preprocessor_config.json` of a built-in vision-language model.
pub fn builtin_preprocessor(name: &str) -> Option<&'static str> {
    PREPROCESSORS.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// The embedded `config.json` of a built-in model.
pub fn builtin_config(name: &str) -> Option<&'static str> {
    MODELS.iter().find(|e| e.name == name).map(|e| e.config)
}

/// Names of the built-in models, in catalog order.
pub fn builtin_names() -> Vec<&'static str> {
    MODELS.iter().map(|e| e.name).collect()
}

/// Every built-in model as (short name, Hugging Face repository), in catalog order.
pub fn builtin_entries() -> Vec<(&'static str, &'static str)> {
    MODELS.iter().map(|e| (e.name, e.repo)).collect()
}

/// The repository a built-in's embedded `config.json` was copied from, when it is not the
/// model's own repository (same architecture and shapes; see `docs/models.md`).
pub fn builtin_config_source(name: &str) -> Option<&'static str> {
    MODELS.iter().find(|e| e.name == name).and_then(|e| e.config_from)
}
