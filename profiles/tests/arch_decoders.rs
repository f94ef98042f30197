//! The Llama-style decoders and DeepSeek built from `config.json`, checked against figures that do
//! not come from the importer: the real checkpoints' `model.safetensors.index.json` in
//! `fixtures/published/models` (exact byte sizes and every tensor name), published parameter counts, and
//! closed forms computed here from the config numbers.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vramplan_profiles::model::hf::{from_config_file, from_config_text};
use vramplan_profiles::model::{ImportOptions, ModelDescription, Naming, TensorKind};
use vramplan_profiles::{DType, Location};

fn shared_model(folder: &str, file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/published/models").join(folder).join(file)
}

fn v4() -> ImportOptions {
    ImportOptions { naming: Naming::V4 }
}

fn load_shared(folder: &str, options: ImportOptions) -> ModelDescription {
    let path = shared_model(folder, "config.json");
    from_config_file(&path, options).unwrap_or_else(|e| panic!("{e}"))
}

fn build(config: &str, options: ImportOptions) -> ModelDescription {
    from_config_text(config, "inline config.json", options).unwrap_or_else(|e| panic!("{e}"))
}

/// The checkpoint's `metadata.total_size` and the names in its `weight_map`.
fn checkpoint_index(folder: &str) -> (u64, BTreeSet<String>) {
    let path = shared_model(folder, "model.safetensors.index.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let index: serde_json::Value = serde_json::from_str(&text).expect("valid index JSON");
    let total = index["metadata"]["total_size"].as_u64().expect("metadata.total_size");
    let names = index["weight_map"].as_object().expect("weight_map").keys().cloned().collect();
    (total, names)
}

/// The tensors a checkpoint stores for `model`: parameters that are not tied to another.
fn stored_names(model: &ModelDescription) -> BTreeSet<String> {
    model
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.kind == TensorKind::Parameter && t.tied_to.is_none())
        .map(|(path, _)| path)
        .collect()
}

/// Asserts that `params` agrees with a figure published in billions to one decimal, whether the
/// publisher rounded or truncated (3.35B is published as 3.3B, 12.88B as 12.9B).
fn assert_published(params: u64, billions: f64, what: &str) {
    let value = params as f64 / 1e9;
    assert!((value - billions).abs() < 0.06, "{what}: {value:.3}B is not the published {billions}B");
}

/// Closed form of a dense Llama-style decoder's parameter count.
struct Dense {
    vocab: u64,
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    intermediate: u64,
    tied: bool,
    qkv_bias: bool,
    qk_norm: bool,
    norms_per_layer: u64,
}

impl Dense {
    fn embeddings(&self) -> u64 {
        self.vocab * self.hidden
    }

    fn params(&self) -> u64 {
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        let mut attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden;
        if self.qkv_bias {
            attention += q + 2 * kv;
        }
        if self.qk_norm {
            attention += 2 * self.head_dim;
        }
        let mlp = 3 * self.hidden * self.intermediate;
        let layer = attention + mlp + self.norms_per_layer * self.hidden;
        let heads = if self.tied { 1 } else { 2 };
        heads * self.embeddings() + self.layers * layer + self.hidden
    }
}

// ---------------------------------------------------------------- real checkpoints

#[test]
fn llama_3_8b_matches_its_checkpoint_exactly() {
    let folder = "meta-llama__Meta-Llama-3-8B";
    let model = load_shared(folder, ImportOptions::default());
    let (total_size, names) = checkpoint_index(folder);
    let closed = Dense {
        vocab: 128256,
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        tied: false,
        qkv_bias: false,
        qk_norm: false,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    // The checkpoint is bf16 and stores no buffer (no `inv_freq` in its weight map).
    assert_eq!(model.params() * 2, total_size);
    assert_eq!(model.params(), 8_030_261_248);
    let summary = model.summary();
    assert_eq!(summary.bytes - summary.buffer_bytes, total_size);
    // The model-level rotary buffers of transformers 5.x: `inv_freq` and its copy
    // `original_inv_freq`, head_dim / 2 fp32 values each.
    assert_eq!(summary.buffer_bytes, 2 * 64 * 4);
    assert_eq!(stored_names(&model), names);
    assert_eq!(model.facts.no_split_classes, ["LlamaDecoderLayer"]);
    assert!(model.facts.layers.iter().all(|l| l.attention_window.is_none() && !l.moe));
}

#[test]
fn mistral_7b_matches_its_checkpoint_and_slides_every_layer() {
    let folder = "mistralai__Mistral-7B-v0.1";
    let model = load_shared(folder, ImportOptions::default());
    let (total_size, names) = checkpoint_index(folder);
    let closed = Dense {
        vocab: 32000,
        hidden: 4096,
        layers: 32,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        tied: false,
        qkv_bias: false,
        qk_norm: false,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    assert_eq!(model.params() * 2, total_size);
    assert_eq!(stored_names(&model), names);
    assert_eq!(model.facts.layers.len(), 32);
    assert!(model.facts.layers.iter().all(|l| l.attention_window == Some(4096)));
}

/// Mixtral 8x7B: 32 layers of 8 experts (w1, w2, w3 of 4096 × 14336), top-2.
fn mixtral_expert_params() -> u64 {
    3 * 4096 * 14336
}

#[test]
fn mixtral_8x7b_matches_its_checkpoint_in_4x_naming() {
    let folder = "mistralai__Mixtral-8x7B-v0.1";
    let model = load_shared(folder, v4());
    let (total_size, names) = checkpoint_index(folder);
    assert_eq!(model.params() * 2, total_size);
    assert_eq!(stored_names(&model), names, "4.x names are the checkpoint's names");
    assert!(names.contains("model.layers.0.block_sparse_moe.experts.3.w1.weight"));

    let attention = 4096 * 4096 * 2 + 2 * 4096 * 1024;
    let layer = attention + 2 * 4096 + 8 * 4096 + 8 * mixtral_expert_params();
    let closed = 2 * 32000 * 4096 + 32 * layer + 4096;
    assert_eq!(model.params(), closed);

    let moe = model.summary().moe.expect("MoE summary");
    assert_eq!((moe.experts, moe.top_k), (8, 2));
    // Published: 46.7B total, 12.9B active.
    assert_published(moe.total_params, 46.7, "Mixtral total");
    let active = closed - 32 * 6 * mixtral_expert_params();
    assert_eq!(moe.active_params, active);
    assert_published(active, 12.9, "Mixtral active");
}

#[test]
fn mixtral_5x_naming_fuses_experts_and_keeps_the_count() {
    let folder = "mistralai__Mixtral-8x7B-v0.1";
    let v5 = load_shared(folder, ImportOptions::default());
    let old = load_shared(folder, v4());
    assert_eq!(v5.params(), old.params());
    // 5.x adds only the rotary `original_inv_freq` copy: head_dim / 2 fp32 values.
    assert_eq!(v5.bytes(), old.bytes() + 64 * 4);
    assert_eq!(v5.summary().moe, old.summary().moe);

    let fused = v5.root.tensor("model.layers.0.mlp.experts.gate_up_proj").expect("fused gate/up");
    assert_eq!(fused.shape, [8, 2 * 14336, 4096]);
    let down = v5.root.tensor("model.layers.0.mlp.experts.down_proj").expect("fused down");
    assert_eq!(down.shape, [8, 4096, 14336]);
    assert_eq!(v5.root.find("model.layers.0.mlp.gate").map(|m| m.class.as_str()), Some("MixtralTopKRouter"));
    assert!(v5.root.tensor("model.layers.0.block_sparse_moe.experts.3.w1.weight").is_none());
    let w1 = old.root.tensor("model.layers.0.block_sparse_moe.experts.3.w1.weight").expect("4.x expert");
    assert_eq!(w1.shape, [14336, 4096]);
    assert!(old.root.tensor("model.layers.0.mlp.experts.gate_up_proj").is_none());
}

#[test]
fn gemma_2b_ties_its_head_and_matches_the_checkpoint_names() {
    let folder = "google__gemma-2b";
    let model = load_shared(folder, ImportOptions::default());
    let (total_size, names) = checkpoint_index(folder);
    let closed = Dense {
        vocab: 256000,
        hidden: 2048,
        layers: 18,
        heads: 8,
        kv_heads: 1,
        head_dim: 256,
        intermediate: 16384,
        tied: true,
        qkv_bias: false,
        qk_norm: false,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    // The checkpoint is bf16 and stores no buffer.
    assert_eq!(model.params() * 2, total_size);
    assert_eq!(model.params(), 2_506_172_416);
    // Gemma ties by default (the config has no `tie_word_embeddings`): the checkpoint has no
    // `lm_head.weight` and the model has one tied group.
    assert_eq!(stored_names(&model), names);
    assert_eq!(model.tied_groups(), [["model.embed_tokens.weight", "lm_head.weight"]]);
}

// ---------------------------------------------------------------- DeepSeek-V3 (R1's files)

/// DeepSeek-V3 sizes (the R1 config): H 7168, 128 heads, q rank 1536, kv rank 512, nope 128,
/// rope 64, v 128, dense intermediate 18432, 256 routed experts of 2048, 1 shared, 3 dense layers
/// of 61, vocabulary 129280.
struct V3;

impl V3 {
    const H: u64 = 7168;
    const HEADS: u64 = 128;

    fn attention_linears() -> [(u64, u64); 5] {
        [
            (Self::H, 1536),                  // q_a_proj
            (1536, Self::HEADS * (128 + 64)), // q_b_proj
            (Self::H, 512 + 64),              // kv_a_proj_with_mqa
            (512, Self::HEADS * (128 + 128)), // kv_b_proj
            (Self::HEADS * 128, Self::H),     // o_proj
        ]
    }

    fn attention() -> u64 {
        Self::attention_linears().iter().map(|(i, o)| i * o).sum::<u64>() + 1536 + 512
    }

    fn expert() -> u64 {
        3 * Self::H * 2048
    }

    fn dense_layer() -> u64 {
        Self::attention() + 2 * Self::H + 3 * Self::H * 18432
    }

    fn moe_layer() -> u64 {
        Self::attention() + 2 * Self::H + 256 * Self::H + 256 * Self::expert() + Self::expert()
    }

    fn params() -> u64 {
        2 * 129280 * Self::H + 3 * Self::dense_layer() + 58 * Self::moe_layer() + Self::H
    }
}

fn deepseek_r1(options: ImportOptions) -> ModelDescription {
    load_shared("deepseek-ai__DeepSeek-R1", options)
}

#[test]
fn deepseek_v3_main_model_is_671b() {
    let model = deepseek_r1(ImportOptions::default());
    assert_eq!(model.params(), V3::params());
    // Published: 671B main-model parameters (685B with the 14B MTP module, not built here).
    let billions = model.params() as f64 / 1e9;
    assert_eq!(format!("{billions:.1}"), "671.0");

    assert_eq!(model.facts.layers.len(), 61);
    let moe_layers: Vec<bool> = model.facts.layers.iter().map(|l| l.moe).collect();
    assert_eq!(moe_layers.iter().filter(|m| !**m).count(), 3);
    assert!(moe_layers[..3].iter().all(|m| !m) && moe_layers[3..].iter().all(|m| *m));

    let summary = model.summary();
    let moe = summary.moe.expect("MoE summary");
    assert_eq!((moe.experts, moe.top_k), (256, 8));
    let active = V3::params() - 58 * 248 * V3::expert();
    assert_eq!(moe.active_params, active);
    // Published: 37B activated per token (37.55B here, published without decimals).
    assert!((37e9..38e9).contains(&(active as f64)), "{active}");
    assert!(summary.tied.is_empty(), "DeepSeek-V3 does not tie its head");
    assert!(
        summary
            .notes
            .iter()
            .any(|n| n.contains("num_nextn_predict_layers") && n.contains("not in this model")),
        "{:?}",
        summary.notes
    );
    assert!(summary.notes.iter().any(|n| n.contains("fp8")), "{:?}", summary.notes);
    assert_eq!(model.facts.no_split_classes, ["DeepseekV3DecoderLayer"]);
}

#[test]
fn deepseek_v3_fp8_weights_are_built_as_stored() {
    let model = deepseek_r1(ImportOptions::default());
    let blocks = |n: u64| n.div_ceil(128);
    // Closed form of the bytes held: fp8 weights (1 byte) with fp32 128×128 block scales for
    // every linear layer but `lm_head` and the routers; bf16 embeddings, head, norms, routers; the
    // router's fp32 `e_score_correction_bias` and the rotary `inv_freq` and 5.x's
    // `original_inv_freq` (32 fp32 each) buffers.
    let fp8 = |rows: u64, cols: u64| rows * cols + 4 * blocks(rows) * blocks(cols);
    let attention: u64 =
        V3::attention_linears().iter().map(|(i, o)| fp8(*o, *i)).sum::<u64>() + 2 * (1536 + 512);
    let mlp = |inter: u64| 2 * fp8(inter, V3::H) + fp8(V3::H, inter);
    let norms = 2 * 2 * V3::H;
    let dense_layer = attention + norms + mlp(18432);
    let moe_layer = attention + norms + 257 * mlp(2048) + 2 * 256 * V3::H + 4 * 256;
    let bytes = 2 * 2 * 129280 * V3::H + 3 * dense_layer + 58 * moe_layer + 2 * V3::H + 2 * 4 * 32;
    assert_eq!(model.bytes(), bytes);

    let scale =
        model.root.tensor("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv").expect("scale");
    assert_eq!(
        (scale.shape.as_slice(), scale.dtype, scale.kind),
        (&[5, 56][..], DType::F32, TensorKind::QuantConstant)
    );
    let weight = model.root.tensor("model.layers.0.self_attn.kv_a_proj_with_mqa.weight").expect("weight");
    assert_eq!((weight.shape.as_slice(), weight.dtype), (&[576, 7168][..], DType::F8E4M3));
    let fused =
        model.root.tensor("model.layers.3.mlp.experts.gate_up_proj_scale_inv").expect("expert scales");
    assert_eq!(fused.shape, [256, 32, 56]);
    let router = model.root.tensor("model.layers.3.mlp.gate.weight").expect("router");
    assert_eq!(router.dtype, DType::BF16);
    let bias = model.root.tensor("model.layers.3.mlp.gate.e_score_correction_bias").expect("correction bias");
    assert_eq!((bias.dtype, bias.kind), (DType::F32, TensorKind::Buffer { persistent: true }));
    assert_eq!(model.root.tensor("lm_head.weight").map(|t| t.dtype), Some(DType::BF16));
}

#[test]
fn deepseek_v3_4x_naming_lists_experts_with_the_same_count() {
    let v5 = deepseek_r1(ImportOptions::default());
    let old = deepseek_r1(v4());
    assert_eq!(old.params(), v5.params());
    // 5.x adds the rotary `original_inv_freq` copy (qk_rope_head_dim / 2 fp32 values) and keeps
    // the 58 MoE layers' `e_score_correction_bias` (256 values each) in fp32 where 4.x loads it
    // in bf16.
    assert_eq!(old.bytes() + 32 * 4 + 58 * 256 * (4 - 2), v5.bytes());
    let bias = |m: &ModelDescription| {
        m.root.tensor("model.layers.3.mlp.gate.e_score_correction_bias").map(|t| t.dtype)
    };
    assert_eq!((bias(&old), bias(&v5)), (Some(DType::BF16), Some(DType::F32)));
    assert_eq!(old.summary().moe, v5.summary().moe);
    let expert = old.root.tensor("model.layers.3.mlp.experts.255.down_proj.weight").expect("4.x expert");
    assert_eq!((expert.shape.as_slice(), expert.dtype), (&[7168, 2048][..], DType::F8E4M3));
    assert!(old.root.tensor("model.layers.3.mlp.experts.255.down_proj.weight_scale_inv").is_some());
    assert!(old.root.tensor("model.layers.3.mlp.shared_experts.gate_proj.weight").is_some());
    assert!(v5.root.tensor("model.layers.3.mlp.experts.gate_up_proj").is_some());
    assert!(v5.root.tensor("model.layers.3.mlp.experts.0.gate_proj.weight").is_none());
}

#[test]
fn deepseek_v3_inspect_is_fast() {
    let path = shared_model("deepseek-ai__DeepSeek-R1", "config.json");
    let text = std::fs::read_to_string(&path).expect("config");
    let runs = 10u32;
    let start = Instant::now();
    for _ in 0..runs {
        let model = from_config_text(&text, "DeepSeek-R1", ImportOptions::default()).expect("builds");
        std::hint::black_box(model.summary());
    }
    let each = start.elapsed() / runs;
    // 5 ms is the budget of an optimized build; unoptimized test builds (about 5 ms measured) get five times that for loaded machines.
    let budget = if cfg!(debug_assertions) { Duration::from_millis(25) } else { Duration::from_millis(5) };
    assert!(each < budget, "inspect took {each:?}");
}

// ---------------------------------------------------------------- published configs

#[test]
fn qwen2_5_7b_is_7_615_616_512() {
    let model = build(
        r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584,
            "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
            "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
            "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "use_sliding_window": false, "vocab_size": 152064}"#,
        ImportOptions::default(),
    );
    let closed = Dense {
        vocab: 152064,
        hidden: 3584,
        layers: 28,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
        intermediate: 18944,
        tied: false,
        qkv_bias: true,
        qk_norm: false,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    assert_eq!(model.params(), 7_615_616_512);
    assert!(model.root.tensor("model.layers.0.self_attn.q_proj.bias").is_some());
    assert!(model.root.tensor("model.layers.0.self_attn.o_proj.bias").is_none());
    assert!(model.facts.layers.iter().all(|l| l.attention_window.is_none()), "use_sliding_window is false");
}

#[test]
fn qwen3_8b_and_0_6b_match_their_published_sizes() {
    // Qwen3-8B: 8.2B parameters, 6.95B without embeddings.
    let model = build(
        r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
            "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
            "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936}"#,
        ImportOptions::default(),
    );
    let closed = Dense {
        vocab: 151936,
        hidden: 4096,
        layers: 36,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 12288,
        tied: false,
        qkv_bias: false,
        qk_norm: true,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    assert_published(model.params(), 8.2, "Qwen3-8B total");
    let non_embedding = model.params() - 2 * closed.embeddings();
    assert_eq!(format!("{:.2}", non_embedding as f64 / 1e9), "6.95");
    let q_norm = model.root.tensor("model.layers.0.self_attn.q_norm.weight").expect("q_norm");
    assert_eq!(q_norm.shape, [128]);

    // Qwen3-0.6B: head_dim 128 although 1024 / 16 = 64, and tied embeddings: 0.6B, 0.44B
    // without embeddings.
    let model = build(
        r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
            "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 16,
            "num_hidden_layers": 28, "num_key_value_heads": 8, "tie_word_embeddings": true,
            "torch_dtype": "bfloat16", "vocab_size": 151936}"#,
        ImportOptions::default(),
    );
    let closed = Dense {
        vocab: 151936,
        hidden: 1024,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 3072,
        tied: true,
        qkv_bias: false,
        qk_norm: true,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    assert_published(model.params(), 0.6, "Qwen3-0.6B total");
    assert_eq!(format!("{:.2}", (model.params() - closed.embeddings()) as f64 / 1e9), "0.44");
    assert_eq!(model.summary().tied, [["model.embed_tokens.weight", "lm_head.weight"]]);
}

#[test]
fn gemma_2_9b_is_9_241_705_984_with_alternating_windows() {
    let model = build(
        r#"{"architectures": ["Gemma2ForCausalLM"], "attention_bias": false,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
            "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 3584, "intermediate_size": 14336, "max_position_embeddings": 8192,
            "model_type": "gemma2", "num_attention_heads": 16, "num_hidden_layers": 42,
            "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
            "vocab_size": 256000}"#,
        ImportOptions::default(),
    );
    let closed = Dense {
        vocab: 256000,
        hidden: 3584,
        layers: 42,
        heads: 16,
        kv_heads: 8,
        head_dim: 256,
        intermediate: 14336,
        tied: true,
        qkv_bias: false,
        qk_norm: false,
        norms_per_layer: 4,
    };
    assert_eq!(model.params(), closed.params());
    assert_eq!(model.params(), 9_241_705_984);
    assert_eq!(model.dtype, DType::F32);
    assert!(model.root.tensor("model.layers.41.post_feedforward_layernorm.weight").is_some());
    let windows: Vec<Option<u64>> = model.facts.layers.iter().map(|l| l.attention_window).collect();
    assert_eq!(&windows[..4], [Some(4096), None, Some(4096), None]);
    assert_eq!(windows.iter().filter(|w| w.is_some()).count(), 21);
}

#[test]
fn phi_3_mini_is_3_821_079_552_with_fused_projections() {
    let model = build(
        r#"{"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "hidden_act": "silu",
            "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
            "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
            "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
            "sliding_window": 2047, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "vocab_size": 32064}"#,
        ImportOptions::default(),
    );
    let closed = Dense {
        vocab: 32064,
        hidden: 3072,
        layers: 32,
        heads: 32,
        kv_heads: 32,
        head_dim: 96,
        intermediate: 8192,
        tied: false,
        qkv_bias: false,
        qk_norm: false,
        norms_per_layer: 2,
    };
    assert_eq!(model.params(), closed.params());
    assert_eq!(model.params(), 3_821_079_552);
    let qkv = model.root.tensor("model.layers.0.self_attn.qkv_proj.weight").expect("fused qkv");
    assert_eq!(qkv.shape, [3 * 3072, 3072]);
    let gate_up = model.root.tensor("model.layers.0.mlp.gate_up_proj.weight").expect("fused gate/up");
    assert_eq!(gate_up.shape, [2 * 8192, 3072]);
    assert!(model.facts.layers.iter().all(|l| l.attention_window == Some(2047)));
}

#[test]
fn qwen1_5_moe_a2_7b_has_shared_experts_and_2_7b_active() {
    let config = r#"{"architectures": ["Qwen2MoeForCausalLM"], "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192,
        "max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 16,
        "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936,
        "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
        "norm_topk_prob": false}"#;
    let model = build(config, ImportOptions::default());
    let h = 2048u64;
    let attention = 4 * h * h + 3 * h;
    let experts = 60 * 3 * h * 1408;
    let layer = attention + 2 * h + 60 * h + experts + 3 * h * 5632 + h;
    let total = 2 * 151936 * h + 24 * layer + h;
    assert_eq!(model.params(), total);
    // Published: 14.3B total, 2.7B activated.
    assert_published(total, 14.3, "Qwen1.5-MoE total");
    let moe = model.summary().moe.expect("MoE summary");
    let active = total - 24 * (experts - experts * 4 / 60);
    assert_eq!(moe.active_params, active);
    assert_published(active, 2.7, "Qwen1.5-MoE active");
    assert!(model.root.tensor("model.layers.0.mlp.shared_expert_gate.weight").is_some());

    let old = build(config, v4());
    assert_eq!(old.params(), total);
    assert!(old.root.tensor("model.layers.5.mlp.experts.59.up_proj.weight").is_some());
    assert!(old.root.tensor("model.layers.5.mlp.shared_expert.down_proj.weight").is_some());
}

#[test]
fn qwen3_30b_a3b_is_30_5b_with_3_3b_active_in_both_namings() {
    let config = r#"{"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
        "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
        "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936}"#;
    let model = build(config, ImportOptions::default());
    let h = 2048u64;
    let attention = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128;
    let experts = 128 * 3 * h * 768;
    let layer = attention + 2 * h + 128 * h + experts;
    let total = 2 * 151936 * h + 48 * layer + h;
    assert_eq!(model.params(), total);
    assert_published(total, 30.5, "Qwen3-30B-A3B total");
    let active = total - 48 * (experts - experts * 8 / 128);
    assert_eq!(model.summary().moe.expect("MoE").active_params, active);
    assert_published(active, 3.3, "Qwen3-30B-A3B active");

    let old = build(config, v4());
    assert_eq!(old.params(), total);
    assert_eq!(old.summary().moe.expect("MoE").active_params, active);
    assert!(old.root.tensor("model.layers.0.mlp.experts.3.gate_proj.weight").is_some());
    assert!(model.root.tensor("model.layers.0.mlp.experts.gate_up_proj").is_some());
    assert!(model.root.tensor("model.layers.0.mlp.experts.3.gate_proj.weight").is_none());

    // `mlp_only_layers` and `decoder_sparse_step` give dense layers of `intermediate_size`.
    let mixed = build(
        &config
            .replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [0]")
            .replace("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2"),
        ImportOptions::default(),
    );
    let sparse: Vec<bool> = mixed.facts.layers.iter().map(|l| l.moe).collect();
    assert_eq!(&sparse[..4], [false, true, false, true]);
    let dense_layers = 24u64;
    let dense_layer = attention + 2 * h + 3 * h * 6144;
    assert_eq!(mixed.params(), 2 * 151936 * h + dense_layers * dense_layer + 24 * layer + h);
}

#[test]
fn olmoe_1b_7b_is_6_9b_with_1_3b_active() {
    let model = build(
        r#"{"architectures": ["OlmoeForCausalLM"], "attention_bias": false, "clip_qkv": null,
            "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 1024,
            "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": false,
            "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
            "num_hidden_layers": 16, "num_key_value_heads": 16, "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
            "vocab_size": 50304}"#,
        ImportOptions::default(),
    );
    let h = 2048u64;
    // q_norm and k_norm span the whole projections (2048 each here).
    let attention = 4 * h * h + 2 * h;
    let experts = 64 * 3 * h * 1024;
    let layer = attention + 2 * h + 64 * h + experts;
    let total = 2 * 50304 * h + 16 * layer + h;
    assert_eq!(model.params(), total);
    assert_published(total, 6.9, "OLMoE total");
    let active = total - 16 * (experts - experts / 8);
    assert_eq!(model.summary().moe.expect("MoE").active_params, active);
    assert_published(active, 1.3, "OLMoE active");
    let k_norm = model.root.tensor("model.layers.0.self_attn.k_norm.weight").expect("k_norm");
    assert_eq!(k_norm.shape, [2048]);
}

#[test]
fn gpt_oss_20b_is_20_9b_with_3_6b_active() {
    let types = ["\"sliding_attention\"", "\"full_attention\""].repeat(12).join(", ");
    let config = format!(
        r#"{{"architectures": ["GptOssForCausalLM"], "attention_bias": true,
            "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
            "intermediate_size": 2880, "layer_types": [{types}], "max_position_embeddings": 131072,
            "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
            "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
            "quantization_config": {{"modules_to_not_convert": ["model.layers.*.self_attn",
            "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}},
            "rms_norm_eps": 1e-05, "rope_theta": 150000, "sliding_window": 128,
            "tie_word_embeddings": false, "vocab_size": 201088}}"#
    );
    let model = build(&config, ImportOptions::default());
    let h = 2880u64;
    let (q, kv) = (64 * 64, 8 * 64);
    let attention = h * q + q + 2 * (h * kv + kv) + q * h + h + 64;
    let experts = 32 * (h * 2 * h + 2 * h + h * h + h);
    let layer = attention + 2 * h + 32 * h + 32 + experts;
    let embedding = 201088 * h;
    let total = 2 * embedding + 24 * layer + h;
    assert_eq!(model.params(), total);
    // Published: 20.9B total, 3.6B active (OpenAI counts active parameters without the input
    // embedding table).
    assert_published(total, 20.9, "gpt-oss-20b total");
    let active = total - 24 * (experts - experts * 4 / 32);
    assert_eq!(model.summary().moe.expect("MoE").active_params, active);
    assert_published(active - embedding, 3.6, "gpt-oss-20b active");

    let sinks = model.root.tensor("model.layers.0.self_attn.sinks").expect("attention sinks");
    assert_eq!(sinks.shape, [64]);
    // The config's MXFP4 experts are held as transformers' `Mxfp4GptOssExperts` holds them;
    // without the quantization they are the fused `GptOssExperts` parameters.
    let blocks = model.root.tensor("model.layers.0.mlp.experts.gate_up_proj_blocks").expect("MXFP4 experts");
    assert_eq!(blocks.shape, [32, 2 * h, h / 32, 16]);
    let unquantized = model.dequantized(vramplan_profiles::DType::BF16);
    let gate_up = unquantized.root.tensor("model.layers.0.mlp.experts.gate_up_proj").expect("experts");
    assert_eq!(gate_up.shape, [32, h, 2 * h]);
    assert!(model.root.tensor("model.layers.0.mlp.experts.down_proj_bias").is_some());
    assert!(model.root.tensor("model.layers.0.mlp.router.bias").is_some());
    let windows: Vec<Option<u64>> = model.facts.layers.iter().map(|l| l.attention_window).collect();
    assert_eq!(&windows[..3], [Some(128), None, Some(128)]);
    assert!(model.notes.iter().any(|n| n.contains("MXFP4")), "{:?}", model.notes);
}

#[test]
fn deepseek_v2_lite_without_q_lora_is_15_7b() {
    let config = r#"{"architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1,
        "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
        "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
        "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "tie_word_embeddings": false,
        "topk_method": "greedy", "torch_dtype": "bfloat16", "v_head_dim": 128,
        "vocab_size": 102400}"#;
    let model = build(config, ImportOptions::default());
    let h = 2048u64;
    let attention = h * 16 * 192 + h * (512 + 64) + 512 + 512 * 16 * 256 + 16 * 128 * h;
    let expert = 3 * h * 1408;
    let dense_layer = attention + 2 * h + 3 * h * 10944;
    let moe_layer = attention + 2 * h + 64 * h + 64 * expert + 2 * expert;
    let embedding = 102400 * h;
    let total = 2 * embedding + dense_layer + 26 * moe_layer + h;
    assert_eq!(model.params(), total);
    // Published: 15.7B total, 2.4B activated (without the input embedding table).
    assert_published(total, 15.7, "DeepSeek-V2-Lite total");
    let active = total - 26 * 58 * expert;
    assert_eq!(model.summary().moe.expect("MoE").active_params, active);
    assert_published(active - embedding, 2.4, "DeepSeek-V2-Lite active");
    assert!(model.root.tensor("model.layers.0.self_attn.q_proj.weight").is_some());
    assert!(model.root.tensor("model.layers.0.self_attn.q_a_proj.weight").is_none());
    assert!(model.root.tensor("model.layers.1.mlp.gate.e_score_correction_bias").is_none());
    assert_eq!(build(config, v4()).params(), total);
}

// ---------------------------------------------------------------- bad input

const LLAMA_TINY: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 2,
    "num_key_value_heads": 8, "vocab_size": 32000}"#;

fn error_key(config: &str) -> Option<Location> {
    from_config_text(config, "bad.json", ImportOptions::default()).err().and_then(|e| e.location)
}

#[test]
fn bad_sizes_name_the_key_to_fix() {
    let key = |k: &str| Some(Location::Key(k.to_string()));
    assert_eq!(
        error_key(&LLAMA_TINY.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 0")),
        key("num_hidden_layers")
    );
    assert_eq!(
        error_key(&LLAMA_TINY.replace("\"num_attention_heads\": 32", "\"num_attention_heads\": 30")),
        key("num_attention_heads"),
        "30 heads do not divide 4096 and there is no head_dim"
    );
    assert_eq!(
        error_key(&LLAMA_TINY.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5")),
        key("num_key_value_heads")
    );
    assert_eq!(
        error_key(&LLAMA_TINY.replace("\"vocab_size\": 32000", "\"vocab_size\": \"big\"")),
        key("vocab_size")
    );
    // With an explicit head_dim the head count need not divide the hidden size.
    let explicit = LLAMA_TINY
        .replace("\"num_attention_heads\": 32", "\"num_attention_heads\": 30, \"head_dim\": 128")
        .replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 6");
    assert!(from_config_text(&explicit, "ok.json", ImportOptions::default()).is_ok());

    let r1 =
        std::fs::read_to_string(shared_model("deepseek-ai__DeepSeek-R1", "config.json")).expect("config");
    assert_eq!(
        error_key(&r1.replace("\"num_hidden_layers\": 61", "\"num_hidden_layers\": 0")),
        key("num_hidden_layers")
    );
    assert_eq!(
        error_key(
            &r1.replace(
                "\"weight_block_size\": [\n      128,\n      128\n    ]",
                "\"weight_block_size\": 128"
            )
        ),
        key("quantization_config.weight_block_size")
    );
    let types = LLAMA_TINY
        .replace("LlamaForCausalLM", "Gemma2ForCausalLM")
        .replace("\"vocab_size\": 32000", "\"vocab_size\": 32000, \"layer_types\": [\"full_attention\"]");
    assert_eq!(error_key(&types), key("layer_types"), "one entry for two layers");
}

// ---------------------------------------------------------------- names observed in transformers
//
// The tiny configs below were instantiated on the meta device in transformers 5.23.0 and 4.57.6
// (`AutoModelForCausalLM.from_config`, with the fine-grained FP8 quantizer's
// `_process_model_before_weight_loading` for `quantization_config`); the names, shapes, class
// names and parameter counts asserted here are what those builds hold.

fn v5() -> ImportOptions {
    ImportOptions { naming: Naming::V5 }
}

fn class_of<'m>(model: &'m ModelDescription, path: &str) -> Option<&'m str> {
    model.root.find(path).map(|m| m.class.as_str())
}

fn shape_of(model: &ModelDescription, tensor: &str) -> Option<Vec<u64>> {
    model.root.tensor(tensor).map(|t| t.shape.clone())
}

fn dtype_of(model: &ModelDescription, tensor: &str) -> Option<DType> {
    model.root.tensor(tensor).map(|t| t.dtype)
}

/// H 64, 4 heads, q rank 20, kv rank 16, nope 8, rope 4, v 12; 4 layers, the first dense (96),
/// 4 routed experts of 24 and no shared expert; `moe_layer_freq` 2; biases everywhere V2 has them.
const DEEPSEEK_V2_TINY: &str = r#"{"architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2", "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 101,
    "torch_dtype": "bfloat16", "q_lora_rank": 20, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 12, "first_k_dense_replace": 1, "moe_layer_freq": 2,
    "n_shared_experts": 0, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 24, "attention_bias": true, "mlp_bias": true,
    "tie_word_embeddings": false}"#;

#[test]
fn deepseek_v2_follows_transformers_moe_layout() {
    let model = build(DEEPSEEK_V2_TINY, v5());
    let (h, vocab) = (64u64, 101u64);
    // q_a (+bias), q_a_layernorm, q_b, kv_a (+bias), kv_a_layernorm, kv_b, o (+bias).
    let attention = (h * 20 + 20) + 20 + 20 * 4 * 12 + (h * 20 + 20) + 16 + 16 * 4 * 20 + (4 * 12 * h + h);
    let dense_mlp = 3 * h * 96 + 96 + 96 + h;
    // Fused routed experts (no biases), router, and zero-width shared experts whose down_proj
    // bias still has `hidden_size` values.
    let moe_mlp = 4 * (2 * 24 * h + h * 24) + 4 * h + h;
    let layer = |mlp: u64| attention + mlp + 2 * h;
    let total = 2 * vocab * h + layer(dense_mlp) + 3 * layer(moe_mlp) + h;
    assert_eq!(model.params(), total);
    assert_eq!(total, 120_496, "transformers 5.23 on the meta device");
    // transformers makes every layer from `first_k_dense_replace` on MoE, ignoring `moe_layer_freq`.
    let moe: Vec<bool> = model.facts.layers.iter().map(|l| l.moe).collect();
    assert_eq!(moe, [false, true, true, true]);
    assert!(model.notes.iter().any(|n| n.contains("moe_layer_freq")), "{:?}", model.notes);
    assert_eq!(class_of(&model, "model.layers.1.mlp.gate"), Some("DeepseekV2TopkRouter"));
    assert_eq!(class_of(&model, "model.layers.1.mlp.experts"), Some("DeepseekV2Experts"));
    assert_eq!(shape_of(&model, "model.layers.1.mlp.shared_experts.gate_proj.weight"), Some(vec![0, h]));
    assert_eq!(shape_of(&model, "model.layers.1.mlp.shared_experts.down_proj.bias"), Some(vec![h]));
    assert_eq!(shape_of(&model, "model.layers.0.mlp.up_proj.bias"), Some(vec![96]));

    // 4.x: per-expert `DeepseekV2MLP` modules, each with `mlp_bias` biases.
    let old = build(DEEPSEEK_V2_TINY, v4());
    assert_eq!(old.params(), total + 3 * 4 * (24 + 24 + h));
    assert_eq!(old.params(), 121_840, "transformers 4.57 on the meta device");
    assert_eq!(class_of(&old, "model.layers.1.mlp.gate"), Some("DeepseekV2MoEGate"));
    assert_eq!(class_of(&old, "model.layers.1.mlp.experts.3"), Some("DeepseekV2MLP"));
    assert_eq!(shape_of(&old, "model.layers.3.mlp.experts.3.down_proj.bias"), Some(vec![h]));
}

#[test]
fn deepseek_v3_experts_and_router_buffer_follow_each_version() {
    let config = r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 3, "vocab_size": 101,
        "torch_dtype": "bfloat16", "q_lora_rank": 20, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 12, "first_k_dense_replace": 1,
        "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
        "topk_group": 1, "moe_intermediate_size": 24, "tie_word_embeddings": false}"#;
    let model = build(config, v5());
    assert_eq!(model.params(), 102_124, "transformers 5.23 and 4.57 on the meta device");
    assert_eq!(class_of(&model, "model.layers.1.mlp.experts"), Some("DeepseekV3Experts"));
    assert_eq!(class_of(&model, "model.layers.1.mlp.gate"), Some("DeepseekV3TopkRouter"));
    let bias = "model.layers.2.mlp.gate.e_score_correction_bias";
    // 5.x loads the correction bias in fp32 (`_keep_in_fp32_modules_strict`), 4.x in bf16.
    assert_eq!(dtype_of(&model, bias), Some(DType::F32));
    let old = build(config, v4());
    assert_eq!(old.params(), 102_124);
    assert_eq!(dtype_of(&old, bias), Some(DType::BF16));
    assert_eq!(class_of(&old, "model.layers.1.mlp.experts"), Some("ModuleList"));
    assert_eq!(class_of(&old, "model.layers.1.mlp.experts.0"), Some("DeepseekV3MLP"));
}

/// A Llama-shaped config of `arch` with `extra` keys (a JSON fragment starting with a comma).
fn tiny(arch: &str, model_type: &str, extra: &str) -> String {
    format!(
        r#"{{"architectures": ["{arch}"], "model_type": "{model_type}", "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 3, "vocab_size": 101,
            "torch_dtype": "bfloat16"{extra}}}"#
    )
}

#[test]
fn gemma_5x_embeds_with_a_scaled_embedding_holding_a_scalar_buffer() {
    for (arch, model_type, class) in [
        ("GemmaForCausalLM", "gemma", "GemmaTextScaledWordEmbedding"),
        ("Gemma2ForCausalLM", "gemma2", "Gemma2TextScaledWordEmbedding"),
    ] {
        let config =
            tiny(arch, model_type, r#", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32"#);
        let model = build(&config, v5());
        assert_eq!(class_of(&model, "model.embed_tokens"), Some(class));
        let scale = model.root.tensor("model.embed_tokens.embed_scale").expect("embed_scale");
        assert_eq!(
            (scale.shape.as_slice(), scale.dtype, scale.kind),
            (&[][..], DType::BF16, TensorKind::Buffer { persistent: false })
        );
        let old = build(&config, v4());
        assert_eq!(class_of(&old, "model.embed_tokens"), Some("Embedding"));
        assert!(old.root.tensor("model.embed_tokens.embed_scale").is_none());
        assert_eq!(old.params(), model.params());
    }
}

#[test]
fn absent_sizes_take_each_config_class_default() {
    // (architecture, model type, heads, expected key/value heads, expected head_dim) when
    // `num_key_value_heads` and `head_dim` are absent.
    let cases = [
        ("MistralForCausalLM", "mistral", 16, 8, 4),
        ("MixtralForCausalLM", "mixtral", 16, 8, 4),
        ("Qwen2ForCausalLM", "qwen2", 64, 32, 1),
        ("Qwen3ForCausalLM", "qwen3", 64, 32, 128),
        ("Qwen3MoeForCausalLM", "qwen3_moe", 8, 4, 8),
        ("GemmaForCausalLM", "gemma", 32, 16, 256),
        ("Gemma2ForCausalLM", "gemma2", 8, 4, 256),
        ("GptOssForCausalLM", "gpt_oss", 16, 8, 64),
        ("LlamaForCausalLM", "llama", 4, 4, 16),
        ("OlmoeForCausalLM", "olmoe", 4, 4, 16),
    ];
    for (arch, model_type, heads, kv_heads, head_dim) in cases {
        let extra = format!(
            r#", "num_attention_heads": {heads}, "num_experts": 2, "num_local_experts": 2,
            "num_experts_per_tok": 2, "experts_per_token": 2, "moe_intermediate_size": 8"#
        );
        let model = build(&tiny(arch, model_type, &extra), v5());
        let k = shape_of(&model, "model.layers.0.self_attn.k_proj.weight");
        assert_eq!(k, Some(vec![kv_heads * head_dim, 64]), "{arch}");
        assert_eq!((model.facts.num_kv_heads, model.facts.head_dim), (kv_heads, head_dim), "{arch}");
    }
    // An explicit null means one key/value head per attention head.
    let null =
        tiny("MistralForCausalLM", "mistral", r#", "num_attention_heads": 16, "num_key_value_heads": null"#);
    assert_eq!(build(&null, v5()).facts.num_kv_heads, 16);
}

#[test]
fn moe_layouts_follow_each_version() {
    // 5.x `Qwen3MoeSparseMoeBlock` creates its experts before its router.
    let qwen3 = tiny(
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 48"#,
    );
    let model = build(&qwen3, v5());
    let mlp = model.root.find("model.layers.0.mlp").expect("mlp");
    let children: Vec<&str> = mlp.children.iter().map(|c| c.name()).collect();
    assert_eq!(children, ["experts", "gate"]);
    let mixtral = tiny(
        "MixtralForCausalLM",
        "mixtral",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4"#,
    );
    let model = build(&mixtral, v5());
    let mlp = model.root.find("model.layers.0.mlp").expect("mlp");
    let children: Vec<&str> = mlp.children.iter().map(|c| c.name()).collect();
    assert_eq!(children, ["gate", "experts"]);

    // 4.x Qwen2-MoE keeps a rotary module in every attention block, and both it and OLMoE name
    // their attention after the default SDPA implementation.
    let qwen2 = tiny(
        "Qwen2MoeForCausalLM",
        "qwen2_moe",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80,
            "mlp_only_layers": [1]"#,
    );
    let old = build(&qwen2, v4());
    assert_eq!(class_of(&old, "model.layers.0.self_attn"), Some("Qwen2MoeSdpaAttention"));
    let inv_freq = old.root.tensor("model.layers.2.self_attn.rotary_emb.inv_freq").expect("per-layer rotary");
    assert_eq!((inv_freq.shape.as_slice(), inv_freq.dtype), (&[16 / 2][..], DType::F32));
    assert!(old.root.tensor("model.rotary_emb.inv_freq").is_some());
    let new = build(&qwen2, v5());
    assert_eq!(class_of(&new, "model.layers.0.self_attn"), Some("Qwen2MoeAttention"));
    assert!(new.root.tensor("model.layers.0.self_attn.rotary_emb.inv_freq").is_none());
    assert_eq!(old.params(), 174_144, "transformers 4.57 on the meta device");
    assert_eq!(new.params(), 174_144, "transformers 5.23 on the meta device");

    let olmoe = tiny(
        "OlmoeForCausalLM",
        "olmoe",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2"#,
    );
    assert_eq!(class_of(&build(&olmoe, v4()), "model.layers.0.self_attn"), Some("OlmoeSdpaAttention"));
    assert_eq!(class_of(&build(&olmoe, v5()), "model.layers.0.self_attn"), Some("OlmoeAttention"));
}

#[test]
fn partial_rotary_factor_applies_where_each_version_applies_it() {
    let inv_freq = |model: &ModelDescription| shape_of(model, "model.rotary_emb.inv_freq");
    // head_dim 16: a factor of 0.5 rotates 8 dimensions, 4 frequencies.
    let llama = tiny(
        "LlamaForCausalLM",
        "llama",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "partial_rotary_factor": 0.5"#,
    );
    // 5.x's default rotary embedding ignores the factor; 4.x's applies it.
    assert_eq!(inv_freq(&build(&llama, v5())), Some(vec![8]));
    assert_eq!(inv_freq(&build(&llama, v4())), Some(vec![4]));
    // Scaled rope types apply it in 5.x too.
    let linear = llama.replace(
        "\"partial_rotary_factor\": 0.5",
        "\"partial_rotary_factor\": 0.5, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}",
    );
    assert_eq!(inv_freq(&build(&linear, v5())), Some(vec![4]));
    // Phi-3's own rotary embedding applies it in both.
    let phi3 = llama.replace("LlamaForCausalLM", "Phi3ForCausalLM").replace("\"llama\"", "\"phi3\"");
    assert_eq!(inv_freq(&build(&phi3, v5())), Some(vec![4]));
    assert_eq!(inv_freq(&build(&phi3, v4())), Some(vec![4]));
}

#[test]
fn sliding_windows_follow_the_config_classes() {
    let windows = |config: &str, options: ImportOptions| -> Vec<Option<u64>> {
        build(config, options).facts.layers.iter().map(|l| l.attention_window).collect()
    };
    let heads = r#", "num_attention_heads": 4, "num_key_value_heads": 2"#;
    // Mistral: 4096 when `sliding_window` is absent, none when it is null.
    let mistral = tiny("MistralForCausalLM", "mistral", heads);
    assert_eq!(windows(&mistral, v5()), [Some(4096); 3]);
    let null = tiny("MistralForCausalLM", "mistral", &format!("{heads}, \"sliding_window\": null"));
    assert_eq!(windows(&null, v5()), [None; 3]);
    // Qwen2: layers from `max_window_layers` (28 when absent) on, only with `use_sliding_window`.
    let qwen2 = |extra: &str| {
        format!(
            r#"{{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
                "num_hidden_layers": 30, "vocab_size": 101, "num_attention_heads": 4,
                "num_key_value_heads": 2, "sliding_window": 32{extra}}}"#
        )
    };
    let slid = windows(&qwen2(", \"use_sliding_window\": true"), v5());
    assert_eq!(slid.iter().position(Option::is_some), Some(28));
    assert_eq!(slid.iter().filter(|w| **w == Some(32)).count(), 2);
    assert!(windows(&qwen2(""), v5()).iter().all(Option::is_none));
    // Qwen2-MoE: 5.x slides on even layers below `max_window_layers`, 4.x on layers from it on.
    let qwen2_moe = qwen2(
        r#", "use_sliding_window": true, "max_window_layers": 2, "num_experts": 2,
            "num_experts_per_tok": 2, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8"#,
    )
    .replace("Qwen2ForCausalLM", "Qwen2MoeForCausalLM");
    assert_eq!(&windows(&qwen2_moe, v5())[..4], [Some(32), None, None, None]);
    assert_eq!(&windows(&qwen2_moe, v4())[..4], [None, None, Some(32), Some(32)]);
    // Qwen3-MoE: every layer.
    let qwen3_moe = tiny(
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        &format!(
            r#"{heads}, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2,
                "num_experts": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 8"#
        ),
    );
    assert_eq!(windows(&qwen3_moe, v5()), [Some(16); 3]);
}

/// Qwen2-MoE, H 64, 4 heads of 16 (2 key/value heads), 2 experts of 8, a shared expert of 16,
/// layer 1 dense (96), quantized with 16×16 blocks and an explicit skip list.
const QWEN2_MOE_FP8: &str = r#"{"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 3, "vocab_size": 101, "torch_dtype": "bfloat16", "num_experts": 2,
    "num_experts_per_tok": 2, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 16,
    "mlp_only_layers": [1], "quantization_config": {"quant_method": "fp8",
    "activation_scheme": "dynamic", "weight_block_size": [16, 16],
    "modules_to_not_convert": ["mlp.gate", "model.layers.*.self_attn"]}}"#;

#[test]
fn fp8_skip_lists_match_as_each_version_matches_them() {
    let blocks = |rows: u64, cols: u64| Some(vec![rows.div_ceil(16), cols.div_ceil(16)]);
    let model = build(QWEN2_MOE_FP8, v5());
    // An explicit list replaces the default one, so `lm_head` is converted.
    assert_eq!(dtype_of(&model, "lm_head.weight"), Some(DType::F8E4M3));
    assert_eq!(shape_of(&model, "lm_head.weight_scale_inv"), blocks(101, 64));
    assert_eq!(class_of(&model, "lm_head"), Some("FP8Linear"));
    // 5.x: `model.layers.*.self_attn` is a regular expression; `mlp.gate` must match from the
    // start of the path (or be its suffix), so the dense `mlp.gate_proj` is converted.
    assert_eq!(dtype_of(&model, "model.layers.0.self_attn.q_proj.weight"), Some(DType::BF16));
    assert!(model.root.tensor("model.layers.0.self_attn.q_proj.weight_scale_inv").is_none());
    assert_eq!(shape_of(&model, "model.layers.1.mlp.gate_proj.weight_scale_inv"), blocks(96, 64));
    assert_eq!(shape_of(&model, "model.layers.0.mlp.shared_expert_gate.weight_scale_inv"), blocks(1, 64));
    // Fused experts: the gate/up scales keep at least two rows (2 × 8 = 16 rows is one block).
    assert_eq!(class_of(&model, "model.layers.0.mlp.experts"), Some("FP8Experts"));
    assert_eq!(shape_of(&model, "model.layers.0.mlp.experts.gate_up_proj_scale_inv"), Some(vec![2, 2, 4]));
    assert_eq!(shape_of(&model, "model.layers.0.mlp.experts.down_proj_scale_inv"), Some(vec![2, 4, 1]));
    // 5.x routers are not linear layers.
    assert_eq!(dtype_of(&model, "model.layers.0.mlp.gate.weight"), Some(DType::BF16));

    // 4.x: entries are substrings, so `mlp.gate` also skips `mlp.gate_proj` and the `*` entry
    // matches nothing.
    let old = build(QWEN2_MOE_FP8, v4());
    assert_eq!(shape_of(&old, "lm_head.weight_scale_inv"), blocks(101, 64));
    assert_eq!(shape_of(&old, "model.layers.0.self_attn.q_proj.weight_scale_inv"), blocks(64, 64));
    assert_eq!(dtype_of(&old, "model.layers.1.mlp.gate_proj.weight"), Some(DType::BF16));
    assert!(old.root.tensor("model.layers.0.mlp.gate.weight_scale_inv").is_none());
    assert_eq!(shape_of(&old, "model.layers.0.mlp.experts.1.down_proj.weight_scale_inv"), blocks(64, 8));

    // 5.x bounds an entry at a module: `model.layers.1` leaves `model.layers.10` converted; 4.x's
    // substring skips it.
    let mixtral = tiny(
        "MixtralForCausalLM",
        "mixtral",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
            "num_experts_per_tok": 2, "num_hidden_layers": 12, "quantization_config": {
            "quant_method": "fp8", "weight_block_size": [16, 32],
            "modules_to_not_convert": ["model.layers.1", "layers.2.self_attn.q"]}"#,
    )
    .replace("\"num_hidden_layers\": 3,", "");
    let model = build(&mixtral, v5());
    assert_eq!(dtype_of(&model, "model.layers.1.self_attn.q_proj.weight"), Some(DType::BF16));
    assert_eq!(shape_of(&model, "model.layers.10.self_attn.q_proj.weight_scale_inv"), Some(vec![4, 2]));
    assert_eq!(shape_of(&model, "model.layers.10.mlp.experts.gate_up_proj_scale_inv"), Some(vec![4, 12, 2]));
    assert_eq!(shape_of(&model, "model.layers.2.self_attn.q_proj.weight_scale_inv"), Some(vec![4, 2]));
    let old = build(&mixtral, v4());
    assert_eq!(dtype_of(&old, "model.layers.10.self_attn.q_proj.weight"), Some(DType::BF16));
    assert_eq!(dtype_of(&old, "model.layers.2.self_attn.q_proj.weight"), Some(DType::BF16));
    // 4.x converts the `nn.Linear` router too.
    assert_eq!(shape_of(&old, "model.layers.3.block_sparse_moe.gate.weight_scale_inv"), Some(vec![1, 2]));
    assert_eq!(class_of(&old, "model.layers.3.block_sparse_moe.gate"), Some("FP8Linear"));
    assert_eq!(
        shape_of(&old, "model.layers.3.block_sparse_moe.experts.1.w2.weight_scale_inv"),
        Some(vec![4, 3])
    );
}

#[test]
fn fp8_scales_take_the_shapes_and_types_transformers_allocates() {
    // Per-tensor scales and static activation scales are scalars in 5.x.
    let per_tensor = tiny(
        "LlamaForCausalLM",
        "llama",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "attention_bias": true,
            "quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
            "weight_block_size": null}"#,
    );
    let model = build(&per_tensor, v5());
    let scalar = Some(Vec::<u64>::new());
    assert_eq!(shape_of(&model, "model.layers.0.self_attn.q_proj.weight_scale_inv"), scalar);
    assert_eq!(shape_of(&model, "model.layers.0.self_attn.q_proj.activation_scale"), scalar);
    assert_eq!(dtype_of(&model, "model.layers.0.self_attn.q_proj.bias"), Some(DType::BF16));
    let names: Vec<&str> = model
        .root
        .find("model.layers.0.self_attn.q_proj")
        .map(|m| m.tensors.iter().map(|t| t.name.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["weight", "bias", "weight_scale_inv", "activation_scale"]);
    // 4.x refuses static activations: no activation scales, and a note.
    let old = build(&per_tensor, v4());
    assert!(old.root.tensor("model.layers.0.self_attn.q_proj.activation_scale").is_none());
    assert!(old.notes.iter().any(|n| n.contains("static")), "{:?}", old.notes);

    // Without `weight_block_size` the default is 128 × 128 blocks.
    let default_blocks = tiny(
        "Qwen3MoeForCausalLM",
        "qwen3_moe",
        r#", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 24,
            "quantization_config": {"quant_method": "fp8"}"#,
    );
    let model = build(&default_blocks, v5());
    assert_eq!(shape_of(&model, "model.layers.0.self_attn.q_proj.weight_scale_inv"), Some(vec![1, 1]));
    assert_eq!(shape_of(&model, "model.layers.0.mlp.experts.gate_up_proj_scale_inv"), Some(vec![4, 2, 1]));
    assert_eq!(dtype_of(&model, "lm_head.weight"), Some(DType::BF16), "skipped by default");
    // 4.x converts the Qwen3-MoE router (an `nn.Linear`), 5.x does not.
    let old = build(&default_blocks, v4());
    assert_eq!(shape_of(&old, "model.layers.0.mlp.gate.weight_scale_inv"), Some(vec![1, 1]));
    assert!(model.root.tensor("model.layers.0.mlp.gate.weight_scale_inv").is_none());

    // `scale_fmt: "ue8m0"` keeps 5.x's scales as one-byte e8m0; 4.x ignores the key.
    let ue8m0 = r#"{"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64,
        "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 2,
        "vocab_size": 101, "torch_dtype": "bfloat16", "q_lora_rank": 20, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "first_k_dense_replace": 1,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
        "weight_block_size": [8, 16]}}"#;
    let scale = "model.layers.0.self_attn.q_b_proj.weight_scale_inv";
    let model = build(ue8m0, v5());
    assert_eq!((shape_of(&model, scale), dtype_of(&model, scale)), (Some(vec![6, 2]), Some(DType::F8E8M0)));
    let experts = "model.layers.1.mlp.experts.gate_up_proj_scale_inv";
    assert_eq!(shape_of(&model, experts), Some(vec![4, 6, 4]));
    assert_eq!(dtype_of(&build(ue8m0, v4()), scale), Some(DType::F32));
}

/// Phi-4-mini (`microsoft/Phi-4-mini-instruct`) is a `Phi3ForCausalLM` with a partial rotary
/// embedding (`partial_rotary_factor` 0.75 of a 128-wide head) and tied embeddings. Its sizes,
/// as third-party tests quote the published `config.json` (the `longrope` factor lists left out:
/// no shape depends on them, and their values were not at hand), built by the real transformers
/// on the meta device (5.24 and 4.57, `from_pretrained`'s construction in bf16, ties applied):
/// 3,836,021,760 parameters, the embedding and head one tensor, and a rotary `inv_freq` of 48
/// fp32 values (5.x also `original_inv_freq`), no other buffer.
#[test]
fn phi_4_mini_builds_as_transformers_builds_it() {
    let config = r#"{
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
        "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
        "intermediate_size": 8192, "num_hidden_layers": 32, "rms_norm_eps": 1e-5,
        "vocab_size": 200064, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "sliding_window": null, "attention_bias": false, "mlp_bias": false, "hidden_act": "silu"
    }"#;
    for (options, buffers) in [(ImportOptions::default(), 2), (v4(), 1)] {
        let model = build(config, options);
        assert_eq!(model.params(), 3_836_021_760, "{:?}", options.naming);
        assert_eq!(
            model.tied_groups(),
            vec![vec!["model.embed_tokens.weight".to_string(), "lm_head.weight".to_string()]]
        );
        let rotary = model.root.find("model.rotary_emb").expect("model-level rotary embedding");
        assert_eq!(rotary.tensors.len(), buffers, "{:?}", options.naming);
        assert!(rotary.tensors.iter().all(|t| t.shape == [48] && t.dtype == DType::F32));
    }
}
