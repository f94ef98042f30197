//! The built-in model catalog (`vramplan_profiles::model::catalog`).
//!
//! Every entry is a published HF `config.json` that parses, names a class vramplan supports and
//! builds. Its parameter count is checked three independent ways: against the publisher's figure
//! (exact where one is given, else to the precision published), against the closed form of its
//! architecture computed here from the config's own numbers, and, for the reference models in
//! `fixtures/published/models`, against the checkpoint's `metadata.total_size`. The copies of the shared
//! reference configs are byte-identical, and `docs/models.md` lists every entry with the count
//! vramplan computes (regenerate it with `cargo test -p vramplan-profiles --test catalog --
//! --ignored write_models_doc`).

use serde_json::Value;
use std::path::{Path, PathBuf};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming, catalog, hf};

/// The models the catalog must hold (issues 2 and 3, and every model in
/// `fixtures/published/measurements/measured.csv`).
const REQUIRED: &[&str] = &[
    "pythia-410m",
    "pythia-1b",
    "pythia-2.8b",
    "xlnet-base-cased",
    "bert-base-uncased",
    "gpt2",
    "llama-2-7b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "mistral-7b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen2.5-7b",
    "qwen3-30b-a3b",
    "deepseek-v3",
    "phi-3-mini",
    "gemma-2-9b",
    "olmoe-1b-7b",
    "bert-large-uncased",
    "bert-base-cased",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-3.3-70b",
    "llama-2-13b",
    "codellama-7b",
    "codellama-34b",
    "tinyllama-1.1b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-235b-a22b",
    "qwen1.5-moe-a2.7b",
    "deepseek-v2-lite",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "phi-1.5",
    "phi-2",
    "gemma-2b",
    "gemma-2-2b",
    "gemma-2-27b",
    "bloom-560m",
    "bloom-7b1",
    "t0-3b",
    "t5-base",
    "octocoder",
    "starcoder",
    "falcon-7b",
    "opt-1.3b",
    "opt-6.7b",
];

/// Built-ins copied unchanged from `fixtures/published/models/<folder>/config.json`.
const SHARED_COPIES: &[(&str, &str)] = &[
    ("llama-3-8b", "meta-llama__Meta-Llama-3-8B"),
    ("mistral-7b", "mistralai__Mistral-7B-v0.1"),
    ("mixtral-8x7b", "mistralai__Mixtral-8x7B-v0.1"),
    ("gemma-2b", "google__gemma-2b"),
    ("bert-base-uncased", "google-bert__bert-base-uncased"),
    ("xlnet-base-cased", "xlnet__xlnet-base-cased"),
    ("deepseek-v3", "deepseek-ai__DeepSeek-R1"),
];

/// Parameter counts published as exact integers. Each is also reproduced by the closed form in
/// [`closed_form`], so a wrong figure here or a wrong config fails one of the two tests.
const PUBLISHED_EXACT: &[(&str, u64, &str)] = &[
    ("pythia-410m", 405_334_016, "Pythia model card, parameter table"),
    ("pythia-1b", 1_011_781_632, "Pythia model card, parameter table"),
    ("pythia-2.8b", 2_775_208_960, "Pythia model card, parameter table"),
    ("gpt2", 124_439_808, "exact count of the published GPT-2 (small) checkpoint"),
    ("llama-2-7b", 6_738_415_616, "exact count of the published checkpoint"),
    ("llama-2-13b", 13_015_864_320, "exact count of the published checkpoint"),
    ("llama-2-70b", 68_976_648_192, "exact count of the published checkpoint"),
    ("llama-3-8b", 8_030_261_248, "checkpoint index total_size 16,060,522,496 B / 2 (bf16)"),
    ("llama-3-70b", 70_553_706_496, "exact count of the published checkpoint"),
    ("mistral-7b", 7_241_732_096, "checkpoint index total_size 14,483,464,192 B / 2 (bf16)"),
    ("mixtral-8x7b", 46_702_792_704, "checkpoint index total_size 93,405,585,408 B / 2 (bf16)"),
    ("qwen2.5-7b", 7_615_616_512, "exact count of the published checkpoint"),
    ("phi-3-mini", 3_821_079_552, "exact count of the published checkpoint"),
    ("gemma-2b", 2_506_172_416, "checkpoint index total_size 5,012,344,832 B / 2 (bf16)"),
    ("gemma-2-9b", 9_241_705_984, "exact count of the published checkpoint"),
    ("bloom-560m", 559_214_592, "BLOOM-560m model card"),
    ("bloom-7b1", 7_069_016_064, "BLOOM-7b1 model card"),
];

/// A published count rounded by its publisher: the value and the half-width of the last digit
/// given (30.5B → 30.5e9 ± 0.1e9, accepting the publisher's rounding or truncation).
type Rounded = Option<(u64, u64)>;

/// A published figure given to some precision: total and active parameters.
struct PublishedRounded {
    name: &'static str,
    total: Rounded,
    active: Rounded,
    /// The publisher's active count leaves out the input embedding (`vocab × hidden`).
    active_without_input_embedding: bool,
    source: &'static str,
}

const B: u64 = 1_000_000_000;
const M: u64 = 1_000_000;

const fn rounded(
    name: &'static str,
    total: Rounded,
    active: Rounded,
    active_without_input_embedding: bool,
    source: &'static str,
) -> PublishedRounded {
    PublishedRounded { name, total, active, active_without_input_embedding, source }
}

const PUBLISHED_ROUNDED: &[PublishedRounded] = &[
    rounded("mixtral-8x7b", None, Some((12_900 * M, 100 * M)), false, "Mistral AI: 12.9B active"),
    rounded(
        "mixtral-8x22b",
        Some((141 * B, B)),
        Some((39 * B, B)),
        false,
        "Mistral AI: 141B total, 39B active",
    ),
    rounded(
        "qwen3-30b-a3b",
        Some((30_500 * M, 100 * M)),
        Some((3_300 * M, 100 * M)),
        false,
        "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated",
    ),
    rounded(
        "qwen3-235b-a22b",
        Some((235 * B, B)),
        Some((22 * B, B)),
        false,
        "Qwen3-235B-A22B model card: 235B total, 22B activated",
    ),
    rounded(
        "qwen1.5-moe-a2.7b",
        Some((14_300 * M, 100 * M)),
        Some((2_700 * M, 100 * M)),
        false,
        "Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated",
    ),
    rounded(
        "deepseek-v3",
        Some((671 * B, B)),
        Some((37 * B, B)),
        false,
        "DeepSeek-V3 README: 671B main model (the 14B MTP module is not built by transformers), 37B activated",
    ),
    rounded(
        "deepseek-v2-lite",
        Some((15_700 * M, 100 * M)),
        Some((2_400 * M, 100 * M)),
        true,
        "DeepSeek-V2-Lite README: 15.7B total, 2.4B activated (the activated figure leaves out the input embedding)",
    ),
    rounded(
        "olmoe-1b-7b",
        Some((6_900 * M, 100 * M)),
        Some((1_300 * M, 100 * M)),
        false,
        "OLMoE paper: 6.9B total, 1.3B active",
    ),
    rounded(
        "gpt-oss-20b",
        Some((20_900 * M, 100 * M)),
        Some((3_600 * M, 100 * M)),
        true,
        "OpenAI gpt-oss model card: 20.9B total, 3.6B active (active leaves out the embedding)",
    ),
    rounded(
        "gpt-oss-120b",
        Some((116_800 * M, 100 * M)),
        Some((5_100 * M, 100 * M)),
        true,
        "OpenAI gpt-oss model card: 116.8B total, 5.1B active (active leaves out the embedding)",
    ),
    rounded("llama-3.1-405b", Some((405_800 * M, 100 * M)), None, false, "Meta: 405.8B"),
    rounded("llama-3.2-1b", Some((1_230 * M, 10 * M)), None, false, "Meta Llama 3.2 model card: 1.23B"),
    rounded("llama-3.2-3b", Some((3_210 * M, 10 * M)), None, false, "Meta Llama 3.2 model card: 3.21B"),
    rounded(
        "t0-3b",
        Some((2_850 * M, 10 * M)),
        None,
        false,
        "fixtures/published/measurements: T0_3B 2.85B, with its own lm_head (4.x; 5.x ties it)",
    ),
    rounded(
        "octocoder",
        Some((15_500 * M, 100 * M)),
        None,
        false,
        "fixtures/published/measurements: octocoder 15.5B",
    ),
    rounded("starcoder", Some((15_500 * M, 100 * M)), None, false, "StarCoder paper: 15.5B"),
    rounded("bert-large-uncased", Some((335 * M, M)), None, false, "fixtures/published/measurements: ~335M"),
    rounded("bert-base-cased", Some((108 * M, M)), None, false, "accelerate model_size_estimator doc: 108M"),
    rounded("bert-base-uncased", Some((110 * M, M)), None, false, "BERT paper: BERT-Base 110M"),
    rounded("t5-base", Some((220 * M, 10 * M)), None, false, "T5 model card: 220 million"),
    rounded("qwen2.5-0.5b", Some((490 * M, 10 * M)), None, false, "Qwen2.5-0.5B model card: 0.49B"),
    rounded("qwen2.5-1.5b", Some((1_540 * M, 10 * M)), None, false, "Qwen2.5-1.5B model card: 1.54B"),
    rounded("qwen2.5-3b", Some((3_090 * M, 10 * M)), None, false, "Qwen2.5-3B model card: 3.09B"),
    rounded("qwen2.5-14b", Some((14_700 * M, 100 * M)), None, false, "Qwen2.5-14B model card: 14.7B"),
    rounded("qwen2.5-72b", Some((72_700 * M, 100 * M)), None, false, "Qwen2.5-72B model card: 72.7B"),
    rounded("qwen3-0.6b", Some((600 * M, 100 * M)), None, false, "Qwen3-0.6B model card: 0.6B"),
    rounded("qwen3-1.7b", Some((1_700 * M, 100 * M)), None, false, "Qwen3-1.7B model card: 1.7B"),
    rounded("qwen3-4b", Some((4_000 * M, 100 * M)), None, false, "Qwen3-4B model card: 4.0B"),
    rounded("qwen3-8b", Some((8_200 * M, 100 * M)), None, false, "Qwen3-8B model card: 8.2B"),
    rounded("qwen3-14b", Some((14_800 * M, 100 * M)), None, false, "Qwen3-14B model card: 14.8B"),
    rounded("qwen3-32b", Some((32_800 * M, 100 * M)), None, false, "Qwen3-32B model card: 32.8B"),
    rounded("gemma-2-27b", Some((27_200 * M, 100 * M)), None, false, "Gemma 2 report: 27.2B"),
    rounded(
        "gemma-3-1b-it",
        Some((1_000 * M, M)),
        None,
        false,
        "Gemma 3 technical report, table 1: 302M embedding and 698M non-embedding parameters",
    ),
    rounded(
        "granite-3.3-8b-instruct",
        Some((8 * B, B / 2)),
        None,
        false,
        "Granite-3.3-8B-Instruct model card: 8 billion",
    ),
    rounded("smollm3-3b", Some((3 * B, B / 2)), None, false, "SmolLM3 model card: 3B"),
    rounded(
        "falcon-h1-0.5b-instruct",
        Some((500 * M, 50 * M)),
        None,
        false,
        "Falcon-H1 technical report (arXiv 2507.22448) and model card: 0.5B",
    ),
    rounded(
        "llama-4-scout-text",
        None,
        Some((17 * B, B / 2)),
        false,
        "Llama 4 model card: Scout, 17B active parameters (109B total with the vision tower, which \
         this text model leaves out)",
    ),
    rounded(
        "llama-4-scout-17b-16e",
        Some((109 * B, B / 2)),
        None,
        false,
        "Llama 4 model card: Scout, 109B total parameters (its 17B active leave the vision tower \
         out)",
    ),
    rounded(
        "qwen2.5-vl-7b-instruct",
        Some((8_290 * M, 5 * M)),
        None,
        false,
        "8.29B: the published checkpoint as loaded by transformers 4.57.1, counted by verl in a \
         training log",
    ),
    rounded(
        "gemma-3-4b-it",
        Some((4_301 * M, 2 * M)),
        None,
        false,
        "Gemma 3 technical report, table 1: 417M vision encoder, 675M embedding and 3,209M \
         non-embedding parameters",
    ),
    rounded("phi-2", Some((2_700 * M, 100 * M)), None, false, "Phi-2 model card: 2.7B"),
    rounded("tinyllama-1.1b", Some((1_100 * M, 100 * M)), None, false, "TinyLlama model card: 1.1B"),
    rounded("codellama-7b", Some((6_700 * M, 100 * M)), None, false, "Code Llama paper: 7B (6.7B)"),
    rounded("codellama-34b", Some((34 * B, B)), None, false, "Code Llama paper: 34B"),
    rounded("opt-1.3b", Some((1_300 * M, 100 * M)), None, false, "OPT paper: 1.3B"),
    rounded("opt-6.7b", Some((6_700 * M, 100 * M)), None, false, "OPT paper: 6.7B"),
    rounded("falcon-7b", Some((7 * B, B)), None, false, "Falcon model card: 7B"),
];

// ---------------------------------------------------------------------------------------------
// Helpers

fn config(name: &str) -> Value {
    let text = catalog::builtin_config(name).unwrap_or_else(|| panic!("`{name}` is not a built-in"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("built-in `{name}`: {e}"))
}

fn build(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default())
        .unwrap_or_else(|e| panic!("built-in `{name}` does not load: {e}"))
}

fn architecture(config: &Value) -> String {
    config["architectures"][0].as_str().map(str::to_string).unwrap_or_default()
}

fn int(config: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| config.get(*k).and_then(Value::as_u64))
}

fn required(config: &Value, keys: &[&str]) -> u64 {
    int(config, keys).unwrap_or_else(|| panic!("config has none of {keys:?}"))
}

fn flag(config: &Value, key: &str, default: bool) -> bool {
    config.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The copies of public configs and checkpoint indexes kept in the repository
/// (`fixtures/published/models`, sources in its README).
fn published_models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/published/models")
}

fn docs_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/models.md")
}

fn with_commas(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn billions(n: u64) -> String {
    format!("{:.2}B", n as f64 / 1e9)
}

// ---------------------------------------------------------------------------------------------
// Closed forms, written here from the transformers module definitions, computed from the
// config's own numbers. Each returns the acceptable (total, active) pairs; `active` is `None`
// for dense models.

type Counts = Vec<(u64, Option<u64>)>;

/// Llama-style decoders with a gated MLP: Llama, Mistral, Mixtral, Qwen2/2-MoE/3/3-MoE, Gemma,
/// Gemma 2, OLMoE, gpt-oss.
/// Qwen2.5-VL's vision tower (`modeling_qwen2_5_vl.py`): the 3-D patch embedding
/// (`hidden × channels × temporal × patch²`, no bias); per block two RMSNorms, `qkv` and `proj`
/// with biases and a gated MLP with biases; the merger's RMSNorm and two linears over
/// `hidden × merge²`.
fn qwen25_vision(c: &Value) -> u64 {
    let v = &c["vision_config"];
    let (h, i, depth) =
        (required(v, &["hidden_size"]), required(v, &["intermediate_size"]), required(v, &["depth"]));
    let (p, t, ch) =
        (required(v, &["patch_size"]), required(v, &["temporal_patch_size"]), required(v, &["in_chans"]));
    let (merge, out) = (required(v, &["spatial_merge_size"]), required(v, &["out_hidden_size"]));
    let block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (3 * h * i + 2 * i + h);
    let m = h * merge * merge;
    h * ch * t * p * p + depth * block + h + (m * m + m) + (m * out + out)
}

/// `text_config` of a vision-language config with its config class's defaults for the keys it
/// leaves out (`Gemma3TextConfig`: transformers 5.24 and 4.57), and `tie_word_embeddings` from
/// the top level.
fn nested_text(c: &Value, defaults: &[(&str, u64)]) -> Value {
    let mut text = c["text_config"].clone();
    for (key, value) in defaults {
        if text.get(*key).is_none() {
            text[*key] = Value::from(*value);
        }
    }
    if let Some(tie) = c.get("tie_word_embeddings") {
        text["tie_word_embeddings"] = tie.clone();
    }
    text
}

/// Gemma 3's SigLIP tower and projector (`modeling_siglip.py`, `modeling_gemma3.py`): the patch
/// convolution with its bias, one learned position per patch, per layer two LayerNorms,
/// q/k/v/out with biases and `fc1`/`fc2` with biases, the final LayerNorm; the projector's
/// `vision × text` matrix and its RMSNorm.
fn gemma3_vision(c: &Value) -> u64 {
    let v = &c["vision_config"];
    let (h, i, depth) = (
        required(v, &["hidden_size"]),
        required(v, &["intermediate_size"]),
        required(v, &["num_hidden_layers"]),
    );
    let (p, side) =
        (required(v, &["patch_size"]), required(v, &["image_size"]) / required(v, &["patch_size"]));
    let channels = int(v, &["num_channels"]).unwrap_or(3);
    let text_h = required(&c["text_config"], &["hidden_size"]);
    let layer = 4 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h);
    (h * channels * p * p + h) + side * side * h + depth * layer + 2 * h + (h * text_h + h)
}

/// Qwen3-VL's tower (`modeling_qwen3_vl.py`): the 3-D patch convolution with its bias, the
/// learned position table, per block two LayerNorms, `qkv` and `proj` with biases and
/// `linear_fc1`/`linear_fc2` with biases; the merger (a LayerNorm over one patch, two linears
/// over `hidden × merge²`) and one DeepStack merger per listed block (its LayerNorm over the
/// merged width).
fn qwen3_vision(c: &Value) -> u64 {
    let v = &c["vision_config"];
    let (h, i, depth) =
        (required(v, &["hidden_size"]), required(v, &["intermediate_size"]), required(v, &["depth"]));
    let (p, t, ch) =
        (required(v, &["patch_size"]), required(v, &["temporal_patch_size"]), required(v, &["in_channels"]));
    let (merge, out) = (required(v, &["spatial_merge_size"]), required(v, &["out_hidden_size"]));
    let positions = required(v, &["num_position_embeddings"]);
    let deepstack = v["deepstack_visual_indexes"].as_array().map_or(0, Vec::len) as u64;
    let block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h);
    let m = h * merge * merge;
    let linears = (m * m + m) + (m * out + out);
    (h * ch * t * p * p + h)
        + positions * h
        + depth * block
        + (2 * h + linears)
        + deepstack * (2 * m + linears)
}

/// Phi-4 multimodal's image and audio embeddings (`modeling_phi4_multimodal.py`): the tower
/// (patch convolution with bias, the position table of `(image_size / patch)²`, per layer two
/// LayerNorms, q/k/v/out and fc1/fc2 with biases; `post_layernorm`; the pooling head's probe,
/// `in_proj` (3 × width) and `out_proj`, LayerNorm and MLP), the two HD separators and the two
/// projections to and within the text width; the conformer (the subsampling's first
/// convolution, a depthwise and a pointwise convolution per further halving, `out` over
/// channels × the frequency bins left; the relative bias table; per block two half-step MLPs
/// with a LayerNorm and a fused gate/up, attention with biases, the convolution module's
/// LayerNorm, GLU (`b1`, `b2`, a pointwise convolution to twice its channels), depthwise and
/// pointwise convolutions and output convolution, two LayerNorms) and the speech and
/// vision-speech projections. Buffers excluded.
fn phi4_multimodal_encoders(c: &Value) -> u64 {
    let text_h = required(c, &["hidden_size"]);
    let v = &c["vision_config"];
    let (h, i, depth) = (
        required(v, &["hidden_size"]),
        required(v, &["intermediate_size"]),
        required(v, &["num_hidden_layers"]),
    );
    let (p, ch) = (required(v, &["patch_size"]), required(v, &["num_channels"]));
    let side = required(v, &["image_size"]) / p;
    let mlp = (h * i + i) + (i * h + h);
    let layer = 4 * h + 4 * (h * h + h) + mlp;
    let head = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + mlp;
    let vision = (h * ch * p * p + h)
        + side * side * h
        + depth * layer
        + 2 * h
        + head
        + 2 * h
        + (h * text_h + text_h)
        + (text_h * text_h + text_h);
    let a = &c["audio_config"];
    let (ah, ai, blocks) =
        (required(a, &["hidden_size"]), required(a, &["intermediate_size"]), required(a, &["num_blocks"]));
    let conv = required(a, &["nemo_conv_channels"]);
    let halvings = u64::from(required(a, &["time_reduction"]).trailing_zeros());
    let bins = (0..halvings).fold(required(a, &["input_size"]), |n, _| (n - 1) / 2 + 1);
    let subsampling =
        (conv * 9 + conv) + (halvings - 1) * (conv * 9 + conv + conv * conv + conv) + (conv * bins * ah + ah);
    let buckets = 2 * required(a, &["bias_max_distance"]);
    assert!(!flag(a, "bias_symmetric", false), "closed form assumes an asymmetric bias table");
    let (ext, sep, k) = (
        required(a, &["ext_pw_out_channel"]),
        required(a, &["depthwise_separable_out_channel"]),
        required(a, &["kernel_size"]),
    );
    let dw = ah * required(a, &["depthwise_multiplier"]);
    let half_mlp = 2 * ah + (ah * 2 * ai + 2 * ai) + (ai * ah + ah);
    let convolution =
        2 * ah + 2 * ext + (2 * ext * ah + 2 * ext) + (dw * k + dw) + (sep * dw + sep) + (ext * ah + ext);
    let block = 2 * half_mlp + 4 * (ah * ah + ah) + convolution + 4 * ah;
    let width = ah * required(a, &["downsample_rate"]);
    let audio = subsampling
        + buckets * required(a, &["num_attention_heads"])
        + blocks * block
        + 2 * ((width * text_h + text_h) + (text_h * text_h + text_h));
    vision + audio
}

/// Mistral 3's Pixtral tower and projector (`modeling_pixtral.py`, `modeling_mistral3.py`): the
/// patch convolution (no bias), `ln_pre`, per layer two RMSNorms, q/k/v/o over `heads ×
/// head_dim` and a gated MLP, none with biases; the projector's RMSNorm, the patch merger's
/// `hidden × merge² → hidden` and the two linears to and within the text width.
fn pixtral_vision(c: &Value) -> u64 {
    let v = &c["vision_config"];
    let (h, i, depth) = (
        required(v, &["hidden_size"]),
        required(v, &["intermediate_size"]),
        required(v, &["num_hidden_layers"]),
    );
    let (p, ch) = (required(v, &["patch_size"]), required(v, &["num_channels"]));
    let q = required(v, &["num_attention_heads"]) * required(v, &["head_dim"]);
    let merge = required(c, &["spatial_merge_size"]);
    let text_h = required(&c["text_config"], &["hidden_size"]);
    assert!(!flag(c, "multimodal_projector_bias", false), "closed form assumes no projector bias");
    let layer = 2 * h + 4 * h * q + 3 * h * i;
    h * ch * p * p + h + depth * layer + h + h * merge * merge * h + h * text_h + text_h * text_h
}

/// Llama 4's tower and projector (`modeling_llama4.py`): the unfold "convolution"'s linear
/// without a bias, the class token and one learned position per patch and for the class token,
/// two LayerNorms around the blocks, per block two LayerNorms, q/k/v/o and `fc1`/`fc2` with
/// biases; the adapter's `fc1` (`intermediate × projector_input_dim`) and `fc2`
/// (`projector_output_dim²`) without biases; the projector's `vision_output_dim × text hidden`.
fn llama4_vision(c: &Value) -> u64 {
    let v = &c["vision_config"];
    let (h, i, depth) = (
        required(v, &["hidden_size"]),
        required(v, &["intermediate_size"]),
        required(v, &["num_hidden_layers"]),
    );
    let (p, ch, side) =
        (required(v, &["patch_size"]), required(v, &["num_channels"]), required(v, &["image_size"]));
    let positions = (side / p) * (side / p) + 1;
    let layer = 4 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h);
    let adapter = i * required(v, &["projector_input_dim"]) + required(v, &["projector_output_dim"]).pow(2);
    let projector = required(v, &["vision_output_dim"]) * required(&c["text_config"], &["hidden_size"]);
    ch * p * p * h + h + positions * h + 4 * h + depth * layer + adapter + projector
}

fn gated_decoder(c: &Value, arch: &str) -> Counts {
    let h = required(c, &["hidden_size"]);
    let layers = required(c, &["num_hidden_layers"]);
    let heads = required(c, &["num_attention_heads"]);
    let kv_heads = int(c, &["num_key_value_heads"]).unwrap_or(heads);
    let head_dim = int(c, &["head_dim"]).unwrap_or(h / heads);
    let vocab = required(c, &["vocab_size"]);
    let inter = required(c, &["intermediate_size"]);
    let (q, kv) = (heads * head_dim, kv_heads * head_dim);

    let mut attention = h * q + 2 * h * kv + q * h;
    let qkv_bias =
        matches!(arch, "Qwen2ForCausalLM" | "Qwen2MoeForCausalLM") || flag(c, "attention_bias", false);
    if qkv_bias {
        attention += q + 2 * kv;
    }
    match arch {
        // o_proj bias and one attention sink per head
        "GptOssForCausalLM" => attention += h + heads,
        // q_norm and k_norm over one head
        "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM" | "Gemma3ForCausalLM" => attention += 2 * head_dim,
        // q_norm and k_norm over the whole projections
        "OlmoeForCausalLM" => attention += q + kv,
        _ => {}
    }
    let norms = if matches!(arch, "Gemma2ForCausalLM" | "Gemma3ForCausalLM") { 4 * h } else { 2 * h };

    // (router and always-on parameters, routed experts, experts per token, parameters of one)
    let moe = match arch {
        "MixtralForCausalLM" => {
            let e = required(c, &["num_local_experts"]);
            Some((h * e, e, required(c, &["num_experts_per_tok"]), 3 * h * inter))
        }
        "OlmoeForCausalLM" => {
            let e = required(c, &["num_experts"]);
            Some((h * e, e, required(c, &["num_experts_per_tok"]), 3 * h * inter))
        }
        "Qwen3MoeForCausalLM" => {
            assert_eq!(int(c, &["decoder_sparse_step"]), Some(1), "closed form assumes every layer is MoE");
            assert!(c["mlp_only_layers"].as_array().is_none_or(Vec::is_empty));
            let e = required(c, &["num_experts"]);
            let expert = 3 * h * required(c, &["moe_intermediate_size"]);
            Some((h * e, e, required(c, &["num_experts_per_tok"]), expert))
        }
        "Qwen2MoeForCausalLM" => {
            assert_eq!(int(c, &["decoder_sparse_step"]), Some(1), "closed form assumes every layer is MoE");
            let e = required(c, &["num_experts"]);
            let expert = 3 * h * required(c, &["moe_intermediate_size"]);
            // router, shared expert and its one-output gate
            let always = h * e + 3 * h * required(c, &["shared_expert_intermediate_size"]) + h;
            Some((always, e, required(c, &["num_experts_per_tok"]), expert))
        }
        "GptOssForCausalLM" => {
            let e = required(c, &["num_local_experts"]);
            // gate_up_proj (h × 2i) and its bias, down_proj (i × h) and its bias
            let expert = 2 * h * inter + 2 * inter + inter * h + h;
            Some((h * e + e, e, required(c, &["experts_per_token", "num_experts_per_tok"]), expert))
        }
        _ => None,
    };
    let (mlp_total, mlp_active) = match moe {
        Some((always, experts, top_k, expert)) => (always + experts * expert, always + top_k * expert),
        None => (3 * h * inter, 3 * h * inter),
    };
    let tied_by_default =
        matches!(arch, "GemmaForCausalLM" | "Gemma2ForCausalLM" | "Gemma3ForCausalLM" | "SmolLM3ForCausalLM");
    let tied = flag(c, "tie_word_embeddings", tied_by_default);
    let embeddings = vocab * h + if tied { 0 } else { vocab * h };
    let total = embeddings + layers * (attention + norms + mlp_total) + h;
    let active = moe.map(|_| embeddings + layers * (attention + norms + mlp_active) + h);
    vec![(total, active)]
}

/// DeepSeek-V2/V3: multi-head latent attention, the first layers dense, then routed and shared
/// experts. transformers keeps V3's `e_score_correction_bias` as a buffer and the original code
/// as a parameter; both counts are accepted.
fn deepseek(c: &Value) -> Counts {
    let h = required(c, &["hidden_size"]);
    let layers = required(c, &["num_hidden_layers"]);
    let heads = required(c, &["num_attention_heads"]);
    let vocab = required(c, &["vocab_size"]);
    let kv_rank = required(c, &["kv_lora_rank"]);
    let (nope, rope, v) = (
        required(c, &["qk_nope_head_dim"]),
        required(c, &["qk_rope_head_dim"]),
        required(c, &["v_head_dim"]),
    );
    let q_head = nope + rope;
    let q = match int(c, &["q_lora_rank"]) {
        Some(rank) => h * rank + rank + rank * heads * q_head,
        None => h * heads * q_head,
    };
    let attention = q + h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v) + heads * v * h;
    let dense_layers = required(c, &["first_k_dense_replace"]);
    assert_eq!(int(c, &["moe_layer_freq"]), Some(1), "closed form assumes every later layer is MoE");
    let moe_layers = layers - dense_layers;
    let experts = required(c, &["n_routed_experts"]);
    let top_k = required(c, &["num_experts_per_tok"]);
    let expert = 3 * h * required(c, &["moe_intermediate_size"]);
    let shared = required(c, &["n_shared_experts"]) * expert;
    let dense = 3 * h * required(c, &["intermediate_size"]);
    let outside = 2 * vocab * h + h + layers * (attention + 2 * h) + dense_layers * dense;
    let total = outside + moe_layers * (h * experts + shared + experts * expert);
    let active = outside + moe_layers * (h * experts + shared + top_k * expert);
    let mut counts = vec![(total, Some(active))];
    if c["topk_method"] == "noaux_tc" {
        counts.push((total + moe_layers * experts, Some(active + moe_layers * experts)));
    }
    counts
}

fn gpt_neox(c: &Value) -> u64 {
    let h = required(c, &["hidden_size"]);
    let i = int(c, &["intermediate_size"]).unwrap_or(4 * h);
    let layer = (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h;
    let vocab = required(c, &["vocab_size"]);
    let head = if flag(c, "tie_word_embeddings", false) { 0 } else { vocab * h };
    vocab * h + head + required(c, &["num_hidden_layers"]) * layer + 2 * h
}

/// GPT-2 and GPTBigCode (multi-query: one key and one value head).
fn gpt2(c: &Value) -> u64 {
    let h = required(c, &["n_embd"]);
    let i = int(c, &["n_inner"]).unwrap_or(4 * h);
    let kv = if flag(c, "multi_query", false) { h / required(c, &["n_head"]) } else { h };
    let layer = 4 * h + (h * (h + 2 * kv) + h + 2 * kv) + (h * h + h) + (h * i + i) + (i * h + h);
    let embeddings = (required(c, &["vocab_size"]) + required(c, &["n_positions"])) * h;
    embeddings + required(c, &["n_layer"]) * layer + 2 * h
}

/// `BertForMaskedLM`: embeddings, encoder, prediction head (transform + decoder bias; the
/// decoder weight is tied to the word embeddings); no pooler.
fn bert(c: &Value) -> u64 {
    let h = required(c, &["hidden_size"]);
    let i = required(c, &["intermediate_size"]);
    let vocab = required(c, &["vocab_size"]);
    let embeddings =
        (vocab + required(c, &["max_position_embeddings"]) + required(c, &["type_vocab_size"])) * h + 2 * h;
    let layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h;
    let head = h * h + h + 2 * h + vocab;
    embeddings + required(c, &["num_hidden_layers"]) * layer + head
}

fn xlnet(c: &Value) -> u64 {
    let d = required(c, &["d_model"]);
    let inner = required(c, &["n_head"]) * required(c, &["d_head"]);
    let i = required(c, &["d_inner"]);
    let vocab = required(c, &["vocab_size"]);
    // q, k, v, o, r; r_r/r_s/r_w biases; two segment embeddings; layer norm; feed-forward
    let layer = 5 * d * inner + 3 * inner + 2 * inner + 2 * d + (d * i + i) + (i * d + d) + 2 * d;
    // word embedding, mask embedding, layers, lm_loss bias (its weight is tied)
    vocab * d + d + required(c, &["n_layer"]) * layer + vocab
}

fn t5(c: &Value) -> u64 {
    let d = required(c, &["d_model"]);
    let f = required(c, &["d_ff"]);
    let inner = required(c, &["num_heads"]) * required(c, &["d_kv"]);
    let relative = required(c, &["num_heads"]) * required(c, &["relative_attention_num_buckets"]);
    let encoder_layers = required(c, &["num_layers"]);
    let decoder_layers = int(c, &["num_decoder_layers"]).unwrap_or(encoder_layers);
    let gated = c["feed_forward_proj"].as_str().is_some_and(|p| p.starts_with("gated"));
    let feed_forward = if gated { 2 * d * f } else { d * f } + f * d;
    let attention = 4 * d * inner;
    let encoder = encoder_layers * (attention + feed_forward + 2 * d) + relative + d;
    let decoder = decoder_layers * (2 * attention + feed_forward + 3 * d) + relative + d;
    let vocab = required(c, &["vocab_size"]);
    // No head of its own: transformers 5.x ties `lm_head` to `shared` in every T5, whatever
    // `tie_word_embeddings` says (`T5Config` forces it to true; fixtures/reference/models/v5/
    // t0-3b.json has `lm_head.weight` in the tied group).
    vocab * d + encoder + decoder
}

/// `PhiForCausalLM` (Phi-1.5, Phi-2): biased projections, one LayerNorm per parallel block,
/// biased untied head.
fn phi(c: &Value) -> u64 {
    let h = required(c, &["hidden_size"]);
    let i = required(c, &["intermediate_size"]);
    let vocab = required(c, &["vocab_size"]);
    let layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * h;
    2 * vocab * h + vocab + required(c, &["num_hidden_layers"]) * layer + 2 * h
}

/// `Phi3ForCausalLM`: fused qkv and gate_up projections without bias.
fn phi3(c: &Value) -> u64 {
    let h = required(c, &["hidden_size"]);
    let i = required(c, &["intermediate_size"]);
    let heads = required(c, &["num_attention_heads"]);
    let kv = int(c, &["num_key_value_heads"]).unwrap_or(heads) * (h / heads);
    let layer = h * (h + 2 * kv) + h * h + h * 2 * i + i * h + 2 * h;
    let vocab = required(c, &["vocab_size"]);
    let head = if flag(c, "tie_word_embeddings", false) { 0 } else { vocab * h };
    vocab * h + head + required(c, &["num_hidden_layers"]) * layer + h
}

fn bloom(c: &Value) -> u64 {
    let h = required(c, &["hidden_size", "n_embed"]);
    let layer = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h) + 4 * h;
    required(c, &["vocab_size"]) * h + 2 * h + required(c, &["n_layer", "num_hidden_layers"]) * layer + 2 * h
}

/// Falcon-7B layout: parallel attention, one LayerNorm per block, multi-query, no biases.
fn falcon(c: &Value) -> u64 {
    assert!(!flag(c, "new_decoder_architecture", false), "closed form is for the Falcon-7B layout");
    let h = required(c, &["hidden_size"]);
    let head_dim = h / required(c, &["num_attention_heads"]);
    let kv = if flag(c, "multi_query", true) { head_dim } else { h };
    let layer = h * (h + 2 * kv) + h * h + 2 * h * 4 * h + 2 * h;
    required(c, &["vocab_size"]) * h + required(c, &["num_hidden_layers"]) * layer + 2 * h
}

/// Falcon-H1: grouped-query attention and a Mamba-2 mixer in every block (`in_proj` to the
/// gate, the convolution's channels and one `dt` per head; a depthwise `conv1d` with its bias;
/// `dt_bias`, `A_log`, `D` per head; `out_proj`; the gated RMSNorm where `mamba_rms_norm`), a
/// SwiGLU MLP, two RMSNorms per block, no biases.
fn falcon_h1(c: &Value) -> u64 {
    let h = required(c, &["hidden_size"]);
    let heads = required(c, &["num_attention_heads"]);
    let kv = required(c, &["num_key_value_heads"]);
    let head_dim = required(c, &["head_dim"]);
    let attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim;
    let mlp = 3 * h * required(c, &["intermediate_size"]);
    let inner = required(c, &["mamba_d_ssm"]);
    let ssm_heads = required(c, &["mamba_n_heads"]);
    let conv_dim = inner + 2 * required(c, &["mamba_n_groups"]) * required(c, &["mamba_d_state"]);
    let norm = if flag(c, "mamba_rms_norm", false) { inner } else { 0 };
    let mixer = h * (inner + conv_dim + ssm_heads)
        + conv_dim * required(c, &["mamba_d_conv"])
        + conv_dim
        + 3 * ssm_heads
        + norm
        + inner * h;
    let vocab = required(c, &["vocab_size"]);
    let head = if flag(c, "tie_word_embeddings", false) { 0 } else { vocab * h };
    vocab * h + head + required(c, &["num_hidden_layers"]) * (attention + mlp + mixer + 2 * h) + h
}

/// Llama 4's text model: grouped-query attention without biases (the q/k L2 norm has no
/// parameters), two RMSNorms per block; on the layers `moe_layers` lists, `Llama4TextMoe`: fused
/// experts (`gate_up_proj` `[E, H, 2I]`, `down_proj` `[E, I, H]`), a router `[E, H]` and a shared
/// SwiGLU expert of `intermediate_size`; elsewhere a SwiGLU MLP of `intermediate_size_mlp`.
/// Active: the shared expert, the router and `num_experts_per_tok` experts per MoE layer.
fn llama4(c: &Value) -> Counts {
    let h = required(c, &["hidden_size"]);
    let heads = required(c, &["num_attention_heads"]);
    let kv = required(c, &["num_key_value_heads"]);
    let d = required(c, &["head_dim"]);
    let attention = 2 * h * heads * d + 2 * h * kv * d;
    let i = required(c, &["intermediate_size"]);
    let experts = required(c, &["num_local_experts"]);
    let top_k = required(c, &["num_experts_per_tok"]);
    let layers = required(c, &["num_hidden_layers"]);
    let moe_layers = c["moe_layers"].as_array().expect("moe_layers").len() as u64;
    let dense = 3 * h * required(c, &["intermediate_size_mlp"]);
    let shared_and_router = 3 * h * i + experts * h;
    let vocab = required(c, &["vocab_size"]);
    let head = if flag(c, "tie_word_embeddings", false) { 0 } else { vocab * h };
    let outside = vocab * h + head + h + layers * (attention + 2 * h) + (layers - moe_layers) * dense;
    let total = outside + moe_layers * (shared_and_router + experts * 3 * h * i);
    let active = outside + moe_layers * (shared_and_router + top_k * 3 * h * i);
    vec![(total, Some(active))]
}

fn opt(c: &Value) -> u64 {
    let h = required(c, &["hidden_size"]);
    assert_eq!(int(c, &["word_embed_proj_dim"]), Some(h), "closed form assumes no projection");
    let f = required(c, &["ffn_dim"]);
    let layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h;
    // learned positions carry an offset of 2
    let positions = (required(c, &["max_position_embeddings"]) + 2) * h;
    required(c, &["vocab_size"]) * h + positions + required(c, &["num_hidden_layers"]) * layer + 2 * h
}

fn closed_form(name: &str) -> Counts {
    let c = config(name);
    let arch = architecture(&c);
    match arch.as_str() {
        "DeepseekV2ForCausalLM" | "DeepseekV3ForCausalLM" => deepseek(&c),
        "GPTNeoXForCausalLM" => vec![(gpt_neox(&c), None)],
        "GPT2LMHeadModel" | "GPTBigCodeForCausalLM" => vec![(gpt2(&c), None)],
        "BertForMaskedLM" => vec![(bert(&c), None)],
        "XLNetLMHeadModel" => vec![(xlnet(&c), None)],
        "T5ForConditionalGeneration" => vec![(t5(&c), None)],
        "PhiForCausalLM" => vec![(phi(&c), None)],
        "Phi3ForCausalLM" => vec![(phi3(&c), None)],
        "BloomForCausalLM" => vec![(bloom(&c), None)],
        "FalconForCausalLM" => vec![(falcon(&c), None)],
        "FalconH1ForCausalLM" => vec![(falcon_h1(&c), None)],
        "Llama4ForCausalLM" => llama4(&c),
        // The Llama 4 text model of `text_config` (untied) behind its tower.
        "Llama4ForConditionalGeneration" => llama4(&nested_text(&c, &[]))
            .into_iter()
            .map(|(t, a)| (t + llama4_vision(&c), a.map(|a| a + llama4_vision(&c))))
            .collect(),
        "OPTForCausalLM" => vec![(opt(&c), None)],
        "Qwen2_5_VLForConditionalGeneration" => {
            // A Qwen2 decoder (q/k/v biases) behind the vision tower.
            gated_decoder(&c, "Qwen2ForCausalLM")
                .into_iter()
                .map(|(t, a)| (t + qwen25_vision(&c), a))
                .collect()
        }
        "Gemma3ForConditionalGeneration" => {
            // The Gemma 3 decoder of `text_config` (tied by default) behind the SigLIP tower.
            let defaults = [
                ("vocab_size", 262_208),
                ("num_attention_heads", 8),
                ("num_key_value_heads", 4),
                ("head_dim", 256),
            ];
            gated_decoder(&nested_text(&c, &defaults), "Gemma3ForCausalLM")
                .into_iter()
                .map(|(t, a)| (t + gemma3_vision(&c), a))
                .collect()
        }
        "Qwen3VLForConditionalGeneration" => {
            // The Qwen3 decoder of `text_config` (per-head q/k norms) behind the tower.
            gated_decoder(&nested_text(&c, &[]), "Qwen3ForCausalLM")
                .into_iter()
                .map(|(t, a)| (t + qwen3_vision(&c), a))
                .collect()
        }
        // The Phi-3 decoder at the top level with the image and audio embeddings.
        "Phi4MultimodalForCausalLM" => vec![(phi3(&c) + phi4_multimodal_encoders(&c), None)],
        "Mistral3ForConditionalGeneration" => {
            // The Mistral decoder of `text_config` behind the Pixtral tower; without its own
            // `tie_word_embeddings` 5.x ties `lm_head` by the top level's default (true).
            let mut text = nested_text(&c, &[]);
            text["tie_word_embeddings"] = Value::from(flag(&c, "tie_word_embeddings", true));
            gated_decoder(&text, "MistralForCausalLM")
                .into_iter()
                .map(|(t, a)| (t + pixtral_vision(&c), a))
                .collect()
        }
        other => gated_decoder(&c, other),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests that need no importer

#[test]
fn catalog_holds_every_required_model_under_a_clean_unique_name() {
    let names = catalog::builtin_names();
    let missing: Vec<&str> = REQUIRED.iter().copied().filter(|n| !names.contains(n)).collect();
    assert!(missing.is_empty(), "missing built-ins: {missing:?}");
    for (i, name) in names.iter().enumerate() {
        assert!(
            name.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-' || ch == '.'),
            "`{name}`: names are lowercase with dashes"
        );
        assert!(!names[..i].contains(name), "`{name}` is listed twice");
    }
    let entries = catalog::builtin_entries();
    assert_eq!(entries.iter().map(|(n, _)| *n).collect::<Vec<_>>(), names);
    for (name, repo) in entries {
        let parts: Vec<&str> = repo.split('/').collect();
        assert!(parts.len() == 2 && parts.iter().all(|p| !p.is_empty()), "`{name}`: repo `{repo}`");
    }
}

#[test]
fn every_config_is_a_json_object_naming_a_supported_class() {
    for name in catalog::builtin_names() {
        let c = config(name);
        assert!(c.is_object(), "`{name}`: not a JSON object");
        let arch = architecture(&c);
        assert!(hf::SUPPORTED.contains(&arch.as_str()), "`{name}`: `{arch}` is not a supported class");
        assert!(c["model_type"].is_string(), "`{name}`: no model_type");
    }
}

#[test]
fn every_config_states_the_shapes_its_closed_form_needs() {
    // Builds the closed form of every entry; a missing or misspelt key panics with its name.
    for name in catalog::builtin_names() {
        let counts = closed_form(name);
        assert!(counts.iter().all(|(total, _)| *total > 0), "`{name}`: zero parameters");
    }
}

#[test]
fn published_figures_match_the_closed_forms() {
    // Ties the configs to the publishers' numbers without any importer.
    for (name, published, source) in PUBLISHED_EXACT {
        let counts = closed_form(name);
        assert!(
            counts.iter().any(|(total, _)| total == published),
            "`{name}`: closed form {counts:?} ≠ published {published} ({source})"
        );
    }
    for p in PUBLISHED_ROUNDED {
        let c = config(p.name);
        // A head of its own (4.x) is one more `vocab × hidden` matrix than 5.x builds.
        let own_head = PUBLISHED_WITH_OWN_HEAD.iter().any(|(name, _)| *name == p.name);
        // Read only where used: a vision-language config nests these in `text_config`.
        let embedding = if own_head || p.active_without_input_embedding {
            required(&c, &["vocab_size"]) * required(&c, &["hidden_size", "n_embd", "d_model"])
        } else {
            0
        };
        let counts: Counts = closed_form(p.name)
            .into_iter()
            .map(|(total, active)| if own_head { (total + embedding, active) } else { (total, active) })
            .collect();
        let fits = counts.iter().any(|(total, active)| {
            let total_ok = p.total.is_none_or(|(v, tol)| total.abs_diff(v) <= tol);
            let active_ok = p.active.is_none_or(|(v, tol)| {
                let mut a = active.unwrap_or(*total);
                if p.active_without_input_embedding {
                    a -= embedding;
                }
                a.abs_diff(v) <= tol
            });
            total_ok && active_ok
        });
        assert!(fits, "`{}`: closed form {counts:?} does not match {}", p.name, p.source);
    }
}

#[test]
fn copies_of_the_shared_reference_configs_are_byte_identical() {
    let dir = published_models();
    for (name, folder) in SHARED_COPIES {
        let path = dir.join(folder).join("config.json");
        let reference = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(catalog::builtin_config(name), Some(reference.as_str()), "`{name}` differs from {folder}");
    }
    assert_eq!(catalog::builtin_config_source("deepseek-v3"), Some("deepseek-ai/DeepSeek-R1"));
}

// ---------------------------------------------------------------------------------------------
// Tests through the importers

#[test]
fn every_builtin_loads() {
    let failures: Vec<String> = catalog::builtin_names()
        .into_iter()
        .filter_map(|name| model::load(name, ImportOptions::default()).err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{} built-ins do not load:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn published_exact_parameter_counts() {
    let mut wrong = Vec::new();
    for (name, published, source) in PUBLISHED_EXACT {
        let params = build(name).params();
        if params != *published {
            wrong.push(format!("{name}: {params} ≠ {published} ({source})"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Built-ins whose published count keeps a head that transformers 5.x ties: checked in 4.x
/// naming, which builds the checkpoint's own head.
const PUBLISHED_WITH_OWN_HEAD: &[(&str, &str)] = &[(
    "t0-3b",
    "T5 v1.1 ships a separate lm_head (`tie_word_embeddings: false`), which 4.x builds; 5.x ties it \
     to `shared` (fixtures/reference/models/v5/t0-3b.json: 2,783,959,040; v4: 2,849,757,184)",
)];

#[test]
fn published_rounded_parameter_counts() {
    let mut wrong = Vec::new();
    for p in PUBLISHED_ROUNDED {
        let model = if PUBLISHED_WITH_OWN_HEAD.iter().any(|(name, _)| *name == p.name) {
            model::load(p.name, ImportOptions { naming: Naming::V4 })
                .unwrap_or_else(|e| panic!("built-in `{}` does not load: {e}", p.name))
        } else {
            build(p.name)
        };
        let total = model.params();
        if let Some((v, tol)) = p.total
            && total.abs_diff(v) > tol
        {
            wrong.push(format!("{}: total {} vs {} ({})", p.name, billions(total), billions(v), p.source));
        }
        if let Some((v, tol)) = p.active {
            let moe = model.summary().moe;
            let Some(moe) = moe else {
                wrong.push(format!("{}: no MoE summary", p.name));
                continue;
            };
            let embedding = model.facts.vocab_size * model.facts.hidden_size;
            let active = if p.active_without_input_embedding {
                moe.active_params - embedding
            } else {
                moe.active_params
            };
            if active.abs_diff(v) > tol {
                wrong.push(format!(
                    "{}: active {} vs {} ({})",
                    p.name,
                    billions(active),
                    billions(v),
                    p.source
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_builtin_matches_its_closed_form() {
    let mut wrong = Vec::new();
    for name in catalog::builtin_names() {
        let model = match model::load(name, ImportOptions::default()) {
            Ok(model) => model,
            Err(e) => {
                wrong.push(format!("{name}: does not load: {e}"));
                continue;
            }
        };
        let actual = (model.params(), model.summary().moe.map(|m| m.active_params));
        let expected = closed_form(name);
        if !expected.contains(&actual) {
            wrong.push(format!("{name}: vramplan {actual:?}, closed form {expected:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn reference_checkpoint_sizes_match_parameter_counts() {
    let dir = published_models();
    let mut checked = 0;
    for (name, folder) in SHARED_COPIES {
        let index = dir.join(folder).join("model.safetensors.index.json");
        let Ok(text) = std::fs::read_to_string(&index) else { continue };
        let index: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", folder));
        let total_size = index["metadata"]["total_size"].as_u64().expect("metadata.total_size");
        assert_eq!(config(name)["torch_dtype"], "bfloat16", "`{name}`: checkpoint assumed bf16");
        assert_eq!(build(name).params() * 2, total_size, "`{name}`: 2 bytes per parameter");
        checked += 1;
    }
    assert!(checked >= 4, "expected the four reference checkpoint indexes, found {checked}");
}

// ---------------------------------------------------------------------------------------------
// docs/models.md

/// Provenance and caveats printed under the table in `docs/models.md` (not checked).
const NOTES: &[(&str, &str)] = &[
    (
        "deepseek-v3",
        "the embedded file is DeepSeek-R1's `config.json` (copied unchanged from `fixtures/published/models`): the same \
         `DeepseekV3ForCausalLM` shapes, R1's `transformers_version`, the fp8 `quantization_config`: fp8 weights with \
         128×128 fp32 block scales, 626.92 GiB held where the runtime keeps fp8 (transformers from compute \
         capability 8.9, vLLM from 8.0), 1.22 TiB dequantized to bf16 (transformers 5.x below 8.9). The \
         multi-token-prediction layer (`num_nextn_predict_layers`, 14B) is not built, as in transformers.",
    ),
    (
        "qwen2.5-1.5b",
        "the file is the Instruct repository's; the base repository's differs in metadata (`eos_token_id`, \
         context and window lengths), not in parameter shapes.",
    ),
    (
        "qwen2.5-72b",
        "the file is the Instruct repository's; the base repository's differs in metadata (`eos_token_id`, \
         context and window lengths), not in parameter shapes.",
    ),
    (
        "qwen1.5-moe-a2.7b",
        "the file is the Chat repository's, with the MoE keys after the others as published.",
    ),
    (
        "qwen2.5-32b",
        "the model card says 32.5B; the config's shapes give 32.76B, which the closed form in the test \
         reproduces.",
    ),
    (
        "phi-1.5",
        "the model card says 1.3B; the config's shapes give 1.42B, which the closed form reproduces.",
    ),
    (
        "gpt-oss-20b",
        "the config has no `torch_dtype`: the routed experts are stored MXFP4 (`quantization_config`), \
         everything else bf16 (the MXFP4 quantizer's default). Described as held where the runtime keeps \
         MXFP4 (transformers from compute capability 7.5, vLLM from 8.0): 12.82 GiB, the checkpoint \
         index's `total_size` 13,761,264,768 B plus 256 B of rotary buffers (docs/memory-model.md, \
         \"Pre-quantized checkpoints\").",
    ),
    (
        "gpt-oss-120b",
        "the config has no `torch_dtype`: the routed experts are stored MXFP4 (`quantization_config`), \
         everything else bf16 (the MXFP4 quantizer's default); 60.77 GiB held where the runtime keeps \
         MXFP4.",
    ),
    (
        "bloom-560m",
        "published with the legacy keys `n_embed` and `num_attention_heads`, and without `torch_dtype`.",
    ),
    (
        "bloom-7b1",
        "published with the legacy keys `n_embed` and `num_attention_heads`, and without `torch_dtype`.",
    ),
    ("octocoder", "a StarCoder fine-tune with StarCoder's shapes."),
    ("llama-3.3-70b", "Meta published only the Instruct model."),
    (
        "gemma-3-1b-it",
        "the repository's `config.json` (written by transformers 4.52.4) as reproduced in the \
         Liwink/gemma-jax repository's `models/README.md` (no Hub access when it was embedded); \
         its shapes give the Gemma 3 report's 302M embedding and 698M non-embedding parameters.",
    ),
    (
        "granite-3.3-8b-instruct",
        "the repository's `config.json` (written by transformers 4.49.0) as dumped beside the model's \
         parameter shapes in a third-party listing held by the reference search index (no Hub access \
         when it was embedded); its shapes give 8,170,864,640 parameters, the count the same listing \
         and another independent one give for the published safetensors.",
    ),
    (
        "smollm3-3b",
        "written from the repository's `config.json` values as quoted by two independent third-party \
         test suites (no Hub access when it was embedded; they agree with each other and with the \
         defaults transformers' `SmolLM3Config` documents as HuggingFaceTB/SmolLM3-3B); \
         `transformers_version` is left out, which no shape depends on.",
    ),
    (
        "falcon-h1-0.5b-instruct",
        "written from the 0.5B `config.json` as NVIDIA's Megatron-Bridge quotes it in its Falcon-H1 \
         bridge test (`tests/unit_tests/models/falcon_h1/test_falcon_h1_bridge.py`, \
         `FALCON_H1_500M_CONFIG`; its Falcon-H1 examples target tiiuae/Falcon-H1-0.5B-Instruct), \
         which leaves out `mamba_d_ssm`: 1536 here, the 24 Mamba heads of 64 that transformers' \
         Falcon-H1 documentation lists for H1 0.5B (the bridge writes it back as heads × head \
         width); no Hub access when it was embedded. 521,411,104 parameters, as transformers \
         5.24 and 4.57 build it (fixtures/reference/models).",
    ),
    (
        "llama-4-scout-text",
        "the `text_config` of meta-llama/Llama-4-Scout-17B-16E's `config.json` (written by \
         transformers 4.51.0) as a third-party listing held by the reference search index prints it \
         (`Llama4Config`, beside a parameter table totalling 109,676,279,296 for the \
         vision-language model), with `moe_layers` written out (0 to 47) and the \
         `architectures` of the text class, `Llama4ForCausalLM` (a vLLM issue quotes a text-only \
         fine-tune's config.json with the same values under that class); `attn_temperature_tuning` \
         is published as 4 and written here as true, since transformers 5.24's strict \
         `Llama4TextConfig` refuses an integer (4.57 reads it as true; no shape depends on it); no \
         Hub access when it was embedded. 107,769,861,120 parameters, as transformers 5.24 and \
         4.57 build it (fixtures/reference/models).",
    ),
    (
        "gemma-3-4b-it",
        "the repository's `config.json` (written by transformers 4.50.0.dev0; few keys, \
         `Gemma3TextConfig` and `SiglipVisionConfig` defaults fill the rest) as a third-party test \
         quotes \"the original gemma-3-4b-it's config.json\", with the values that the 12B's embedded \
         copy in another project and an MLC test pinning google/gemma-3-4b-it share (no Hub access \
         when it was embedded; that quote also lists `final_logit_softcapping` 30.0 in \
         `text_config`, which no other source has, no shape depends on and \
         `Gemma3ForConditionalGeneration.forward` does not apply in 5.24: left out); with the \
         repository's `preprocessor_config.json` (`Gemma3ImageProcessor`, `size` 896 × 896, \
         `image_seq_length` 256, pan-and-scan off) as NeMo-RL's Gemma 3 example writes it. \
         4,300,079,472 parameters, as transformers 5.24 and 4.57 build it.",
    ),
    (
        "qwen3-vl-8b-instruct",
        "the repository's `config.json` as quoted by TensorRT-LLM's Qwen3-VL test \
         (`QWEN3_VL_8B_CONFIG`, loaded from `Qwen3/Qwen3-VL-8B-Instruct`; it lowers \
         `text_config.num_hidden_layers` to 4 for testing and notes 36 for the full model, the \
         count two other third-party copies of the 8B config give), its test-only \
         `_attn_implementation` and `_name_or_path` left out; with the `preprocessor_config.json` \
         Qwen3-VL publishes (`size.shortest_edge` 65536, `size.longest_edge` 16777216, patch 16, \
         merge 2, `Qwen2VLImageProcessorFast`) as third-party projects quote it for the Qwen3-VL \
         and Qwen3.5 checkpoints (no Hub access when it was embedded). 8,767,123,696 parameters, \
         as transformers 5.24 and 4.57 build it.",
    ),
    (
        "llama-4-scout-17b-16e",
        "the repository's `config.json` (written by transformers 4.51.0) as the third-party \
         listing `llama-4-scout-text` comes from prints it (`Llama4Config {…}`), its \
         `text_config` written as `llama-4-scout-text`'s (`moe_layers` written out, \
         `attn_temperature_tuning` true), its `vision_config` with the values TensorRT-LLM's \
         Llama 4 test quotes for Maverick's tower (which lowers `num_hidden_layers` to 0; 34 in \
         the listing and in NeuronX's Scout test config). No `preprocessor_config.json` is \
         embedded: `Llama4ImageProcessor`'s class defaults (336-pixel tiles, `max_patches` 16) \
         stand in. 108,641,793,536 parameters, as transformers 5.24 and 4.57 build it \
         (fixtures/reference/models); the listing's total, 109,676,279,296, is one \
         vocabulary × hidden matrix (1,034,485,760) more.",
    ),
    (
        "phi-4-multimodal-instruct",
        "the transformers-format `config.json` that transformers' own conversion script \
         (`convert_phi4_multimodal_weights_to_hf.py`, `convert_config`, run with 4.57) makes of the \
         repository's original remote-code `config.json` (`Phi4MMForCausalLM`, written by \
         transformers 4.46.1) as TensorRT-LLM's Phi-4-MM test quotes it (`PHI4MM_CONFIG`; it lowers \
         `num_hidden_layers` to 2 and the audio `num_blocks` to 2 for CI and notes the originals, 32 \
         and 24, restored here); with the repository's remote-code `preprocessor_config.json` \
         (`dynamic_hd` 36) as the model's own vision fine-tuning sample writes it, which \
         transformers' `Phi4MultimodalImageProcessor` reads (448-pixel crops, patch 14 by default); \
         no Hub access when it was embedded. 4,743,988,032 parameters, as transformers 5.24 and 4.57 \
         build it: the model card's 5.6B also counts the vision and speech LoRA adapters the \
         original checkpoint carried, which transformers' port moves out to PEFT adapters \
         (r 256 and 320 over `qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj` of the 32 layers: \
         369,098,752 and 461,373,440 parameters, 5,574,460,224 in all).",
    ),
    (
        "mistral-small-3.1-24b-instruct",
        "the repository's `config.json` (written by transformers 4.50.0.dev0) as quoted by \
         TensorRT-LLM's Mistral 3 test (`mistral_small_3_1_24b_config`; it lowers \
         `text_config.num_hidden_layers` to 4 for CI and notes the original 40), the same values \
         as another project's copy written by 4.57.1; with a `preprocessor_config.json` for \
         Mistral 3 (`PixtralImageProcessor`, `size.longest_edge` 1540, patch 14) as a \
         third-party test quotes one from a model bundle (no Hub access when it was embedded). \
         Neither file sets `tie_word_embeddings` at the top level, where transformers 5.24's \
         `Mistral3Config` defaults it to true: 5.24 builds `lm_head` tied to the embedding \
         (23,340,272,640 parameters, as here), 4.57 reads the text config's false and builds \
         24,011,361,280 (`--naming v4`); the published checkpoint stores its own `lm_head`.",
    ),
    (
        "qwen2.5-vl-7b-instruct",
        "the repository's `config.json` as quoted by TensorRT-LLM's Qwen2.5-VL test (which lowers \
         the layer counts for testing; the full ones, and every other value, as a transformers \
         4.57.1 load of the checkpoint prints its config in a verl training log); with the \
         repository's `preprocessor_config.json` (`min_pixels` 3136, `max_pixels` 12845056, patch \
         14, merge 2), as several third-party projects quote it (no Hub access when it was embedded).",
    ),
];

fn published_text(name: &str) -> String {
    if let Some((_, v, source)) = PUBLISHED_EXACT.iter().find(|(n, ..)| *n == name) {
        return format!("{} ({source})", with_commas(*v));
    }
    if let Some(p) = PUBLISHED_ROUNDED.iter().find(|p| p.name == name) {
        return p.source.to_string();
    }
    "—".to_string()
}

fn models_doc() -> String {
    let mut out = String::from(
        "# Built-in models\n\n\
         `vramplan` embeds the published `config.json` of these models; give the short name wherever a \
         MODEL is expected (`vramplan inspect mixtral-8x7b`). Parameters are what vramplan builds \
         from the config (`vramplan inspect NAME`): every parameter tensor of the transformers \
         model, tied groups once, buffers excluded. For mixtures of experts the second figure is \
         the parameters one token passes through (all but the routed experts, plus `top_k` of \
         them per MoE layer), embeddings included; some publishers leave the input embedding out \
         of their active figure, as noted.\n\n\
         Where the embedded file comes from a sibling repository with the same architecture and \
         shapes, the repository column says so. The table is generated by `cargo test -p \
         vramplan-profiles --test catalog -- --ignored write_models_doc` and checked by the \
         `models_doc_lists_every_builtin` test.\n\n\
         | name | HF repo | architecture | params (vramplan) | published |\n\
         |---|---|---|---|---|\n",
    );
    for (name, repo) in catalog::builtin_entries() {
        let arch = architecture(&config(name));
        let repo_cell = match catalog::builtin_config_source(name) {
            Some(from) => format!("[{repo}](https://huggingface.co/{repo}) (config.json of `{from}`)"),
            None => format!("[{repo}](https://huggingface.co/{repo})"),
        };
        let params = match model::load(name, ImportOptions::default()) {
            Ok(model) => match model.summary().moe {
                Some(moe) => {
                    format!("{} ({} active)", with_commas(model.params()), with_commas(moe.active_params))
                }
                None => with_commas(model.params()),
            },
            Err(_) => "importer not built yet".to_string(),
        };
        out.push_str(&format!(
            "| `{name}` | {repo_cell} | `{arch}` | {params} | {} |\n",
            published_text(name)
        ));
    }
    out.push_str("\nNotes:\n\n");
    for (name, note) in NOTES {
        out.push_str(&format!("- `{name}`: {note}\n"));
    }
    out
}

#[test]
#[ignore = "writes docs/models.md; run with --ignored to regenerate it"]
fn write_models_doc() {
    let path = docs_path();
    let dir = path.parent().expect("docs folder");
    std::fs::create_dir_all(dir).expect("create docs/");
    let temp = dir.join(".models.md.tmp");
    std::fs::write(&temp, models_doc()).expect("write docs/models.md");
    std::fs::rename(&temp, &path).expect("rename docs/models.md");
}

#[test]
fn models_doc_lists_every_builtin() {
    let doc = std::fs::read_to_string(docs_path()).expect("docs/models.md");
    assert_eq!(doc, models_doc(), "docs/models.md is stale: regenerate it (see its header)");
}
