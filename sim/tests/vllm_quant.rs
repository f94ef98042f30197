//! vLLM's quantized weights (`sim/src/engines/vllm_quant.rs`) against closed forms worked out
//! here from the published Llama-3.1-8B config and vLLM 0.19's loaders, vLLM's own refusals, and
//! the weights and KV capacities vLLM 0.19 logged for quantized models on H100s
//! (`fixtures/published/vllm-quant/`, rows of the llm-d-planner campaign that
//! `fixtures/published/measurements/` does not hold), and an AWQ checkpoint's weights as vLLM 0.7.2
//! logged them on two A40s (`vllm_awq.csv` beside them).

use serde_json::{Value, json};
use vramplan_profiles::hardware::{self, Device};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, catalog};
use vramplan_profiles::{DType, InputError};
use vramplan_sim::engines::vllm::{self, VllmBudget};
use vramplan_sim::workload::{Engine, Quant, Workload};

const GIB: f64 = (1u64 << 30) as f64;

// Llama-3.1-8B (meta-llama config.json): per layer q and o 4096², k and v 1024 × 4096,
// gate/up/down 14336 × 4096; 32 layers.
const LAYERS: u64 = 32;
const LINEAR: u64 = LAYERS * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096);
/// Output rows of the seven linears of a layer.
const ROWS_PER_LAYER: u64 = 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096;
/// Input features of the seven linears of a layer.
const INPUTS_PER_LAYER: u64 = 6 * 4096 + 14336;
/// In 16-bit: the embedding and the untied `lm_head` (128256 × 4096), 65 norms of 4096, and
/// vLLM's rotary `cos_sin_cache` (131072 positions × 128).
const UNQUANTIZED: u64 = 2 * 128256 * 4096 * 2 + 65 * 4096 * 2 + 131072 * 128 * 2;

fn device(profile: &str) -> Device {
    hardware::load(profile).expect("a hardware profile").devices[0].clone()
}

fn llama() -> ModelDescription {
    model::load("llama-3.1-8b-instruct", ImportOptions::default()).expect("a built-in model")
}

/// A built-in config with `changes` merged over it (a checkpoint's `quantization_config`).
fn with_config(builtin: &str, changes: Value) -> ModelDescription {
    let text = catalog::builtin_config(builtin).expect("a built-in config");
    let mut config: Value = serde_json::from_str(text).expect("JSON");
    for (key, value) in changes.as_object().expect("an object") {
        config[key] = value.clone();
    }
    model::hf::from_config_text(&config.to_string(), builtin, ImportOptions::default()).expect("a config")
}

fn serve(quant: Quant, utilization: f64) -> Workload {
    Workload {
        seq: 8192,
        quant,
        engine: Engine::Vllm { gpu_memory_utilization: utilization, max_num_batched_tokens: 8192 },
        ..Workload::default()
    }
}

fn budget(
    model: &ModelDescription,
    profile: &str,
    workload: &Workload,
    tp: u32,
) -> Result<VllmBudget, InputError> {
    vllm::budget(model, &device(profile), workload, tp)
}

#[test]
fn fp8_from_a_bf16_checkpoint_is_fp8_weights_and_a_scale_per_layer() {
    let model = llama();
    let fp8 = Quant::Fp8 { block: 128 };
    // H100 (8.9+): per-tensor dynamic quantization, one fp32 scale per vLLM layer (qkv_proj,
    // o_proj, gate_up_proj, down_proj).
    let h100 = budget(&model, "h100-80gb", &serve(fp8.clone(), 0.9), 1).expect("budget");
    assert_eq!(h100.weights_bytes, LINEAR + 4 * 4 * LAYERS + UNQUANTIZED);
    assert!(
        h100.quantization.as_deref().is_some_and(|q| q.contains("per tensor")),
        "{:?}",
        h100.quantization
    );
    // The load peak: the largest layer materialized in bf16 before it is quantized (the fused
    // gate_up_proj, 2 × 14336 × 4096 × 2 B).
    assert_eq!(h100.load_peak_bytes - h100.weights_bytes, 2 * 14336 * 4096 * 2);

    // A100 (8.0): FP8 Marlin, weight-only: the scale becomes one bf16 value per output row.
    let a100 = budget(&model, "a100-80gb", &serve(fp8, 0.9), 1).expect("budget");
    assert_eq!(a100.weights_bytes, LINEAR + 2 * LAYERS * ROWS_PER_LAYER + UNQUANTIZED);
    let bf16 = budget(&model, "h100-80gb", &serve(Quant::None, 0.9), 1).expect("budget");
    assert_eq!(bf16.weights_bytes, 2 * LINEAR + UNQUANTIZED);
    println!(
        "Llama-3.1-8B under vLLM: bf16 {:.2} GiB, --quant fp8 {:.2} GiB (H100), {:.2} GiB (A100)",
        bf16.weights_bytes as f64 / GIB,
        h100.weights_bytes as f64 / GIB,
        a100.weights_bytes as f64 / GIB
    );
}

#[test]
fn gptq_is_repacked_for_machete_on_hopper_and_marlin_on_ampere() {
    let model = llama();
    let gptq = Quant::Gptq { bits: 4, group_size: 128 };
    let packed = LINEAR / 2;
    let scales = 2 * LINEAR / 128; // fp16 per group of 128 and output
    let qzeros = LINEAR / 128 / 2; // 4-bit per group and output, packed in int32
    let g_idx = 4 * LAYERS * INPUTS_PER_LAYER;
    // Machete keeps qzeros and g_idx as loaded; Marlin empties both (symmetric, no act-order).
    let h100 = budget(&model, "h100-80gb", &serve(gptq.clone(), 0.9), 1).expect("budget");
    assert_eq!(h100.weights_bytes, packed + scales + qzeros + g_idx + UNQUANTIZED);
    assert!(h100.quantization.as_deref().is_some_and(|q| q.contains("Machete")), "{:?}", h100.quantization);
    let a100 = budget(&model, "a100-80gb", &serve(gptq, 0.9), 1).expect("budget");
    assert_eq!(a100.weights_bytes, packed + scales + UNQUANTIZED);
    // The repack writes a new qweight beside the loaded one: the largest is the fused
    // gate_up_proj's, 2 × 14336 × 4096 4-bit values.
    assert_eq!(a100.load_peak_bytes - a100.weights_bytes, 2 * 14336 * 4096 / 2);
    // An asymmetric checkpoint is not Marlin-compatible: the ExLlama kernel keeps the stored
    // zeros and empties `g_idx` (no act-order).
    let asym = with_config(
        "llama-3.1-8b-instruct",
        json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
               "sym": false, "desc_act": false}}),
    );
    let exllama = budget(&asym, "a100-80gb", &serve(Quant::None, 0.9), 1).expect("budget");
    assert_eq!(exllama.weights_bytes, packed + scales + qzeros + UNQUANTIZED);
}

#[test]
fn awq_zero_points_become_16_bit_under_machete() {
    let model = llama();
    let awq = Quant::Awq { bits: 4, group_size: 128 };
    let packed = LINEAR / 2;
    let scales = 2 * LINEAR / 128;
    // Marlin converts the packed zeros to its own packing (same bytes); Machete pre-multiplies
    // them by the scales into a [groups, out] tensor in the activation dtype.
    let a100 = budget(&model, "a100-80gb", &serve(awq.clone(), 0.9), 1).expect("budget");
    assert_eq!(a100.weights_bytes, packed + scales + LINEAR / 128 / 2 + UNQUANTIZED);
    let h100 = budget(&model, "h100-80gb", &serve(awq, 0.9), 1).expect("budget");
    assert_eq!(h100.weights_bytes, packed + 2 * scales + UNQUANTIZED);
}

#[test]
fn an_fp8_block_checkpoint_takes_group_scales_under_fp8_marlin() {
    // An fp8 checkpoint with 128 × 128 block scales (the `quant_method: fp8` layout of
    // DeepSeek-V3 and Qwen3-FP8): stored on an H100, fp32 scales per 128 × 128 block; on an
    // A100 FP8 Marlin holds bf16 scales per 128 inputs and output.
    let model = with_config(
        "llama-3.1-8b-instruct",
        json!({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
               "weight_block_size": [128, 128]}}),
    );
    let linears: [(u64, u64); 7] =
        [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (14336, 4096), (4096, 14336)];
    let blocks_per_layer: u64 = linears.iter().map(|(out, inp)| out.div_ceil(128) * inp.div_ceil(128)).sum();
    let groups_per_layer: u64 = linears.iter().map(|(out, inp)| inp / 128 * out).sum();
    let h100 = budget(&model, "h100-80gb", &serve(Quant::None, 0.9), 1).expect("budget");
    assert_eq!(h100.weights_bytes, LINEAR + 4 * LAYERS * blocks_per_layer + UNQUANTIZED);
    let a100 = budget(&model, "a100-80gb", &serve(Quant::None, 0.9), 1).expect("budget");
    assert_eq!(a100.weights_bytes, LINEAR + 2 * LAYERS * groups_per_layer + UNQUANTIZED);
}

#[test]
fn gguf_weights_are_the_files_blocks_embedding_and_head_included() {
    // Q8_0 (llama-quantize): every 2-D tensor in 34-byte blocks of 32 weights, the token
    // embedding and the output head too; vLLM's GGUF methods hold the blocks as they are (linear,
    // embedding), the F32 norms as ordinary parameters in the model dtype.
    let model = llama();
    let q8 =
        budget(&model, "h100-80gb", &serve(Quant::Gguf { quant_type: "Q8_0".into() }, 0.9), 1).expect("q8");
    let blocks = (LINEAR + 2 * 128256 * 4096) / 32 * 34;
    assert_eq!(q8.weights_bytes, blocks + 65 * 4096 * 2 + 131072 * 128 * 2);
    // Tensor parallelism splits the blocks with their rows.
    let tp2 = budget(&model, "2xh100-80gb", &serve(Quant::Gguf { quant_type: "Q8_0".into() }, 0.9), 2);
    assert!(tp2.expect("tp2").weights_bytes < q8.weights_bytes * 51 / 100);
}

#[test]
fn vllm_refuses_what_its_quantization_configs_refuse() {
    let model = llama();
    // `Fp8Config.get_min_capability()` is 75: a V100 (7.0) is refused with vLLM's message.
    let err = budget(&model, "v100-32gb", &serve(Quant::Fp8 { block: 128 }, 0.9), 1).expect_err("V100");
    assert_eq!(err.origin, "--hardware");
    assert!(err.problem.contains("Minimum capability: 75"), "{err}");
    // A T4 (7.5) runs fp8 through FP8 Marlin.
    assert!(budget(&model, "t4", &serve(Quant::Fp8 { block: 128 }, 0.9), 1).is_ok());
    // fp8 and the Marlin kernels take fp16 and bf16 activations only.
    let fp32 = Workload { weight_dtype: Some(DType::F32), ..serve(Quant::Fp8 { block: 128 }, 0.9) };
    assert_eq!(budget(&model, "h100-80gb", &fp32, 1).expect_err("fp32").origin, "--dtype");
    // A flag that names another method than the checkpoint's `quantization_config`.
    let gptq = with_config(
        "llama-3.1-8b-instruct",
        json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
               "sym": true, "desc_act": false}}),
    );
    let err = budget(&gptq, "h100-80gb", &serve(Quant::Awq { bits: 4, group_size: 128 }, 0.9), 1)
        .expect_err("awq over gptq");
    assert!(err.problem.contains("does not match"), "{err}");
    assert!(err.fix.as_deref().is_some_and(|f| f.contains("leave `--quant` out")), "{err}");
    // The same method, or none, is the checkpoint.
    let same = budget(&gptq, "h100-80gb", &serve(Quant::Gptq { bits: 4, group_size: 128 }, 0.9), 1);
    let none = budget(&gptq, "h100-80gb", &serve(Quant::None, 0.9), 1);
    assert_eq!(same.expect("gptq").weights_bytes, none.expect("none").weights_bytes);
}

/// One row of `fixtures/published/vllm-quant/vllm_quant.csv`.
struct Row {
    id: String,
    tp: u32,
    dtype: String,
    utilization: f64,
    weights_gib: f64,
    kv_tokens: u64,
}

fn rows() -> Vec<Row> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/published/vllm-quant/vllm_quant.csv");
    let mut reader = csv::Reader::from_path(path).expect("the fixture");
    reader
        .records()
        .map(|r| {
            let r = r.expect("a row");
            Row {
                id: r[0].to_string(),
                tp: r[5].parse().expect("tp"),
                dtype: r[6].to_string(),
                utilization: r[7].parse().expect("utilization"),
                weights_gib: r[9].parse().expect("weights"),
                kv_tokens: r[10].parse().expect("tokens"),
            }
        })
        .collect()
}

/// compressed-tensors' `config_groups` for llm-compressor's preset schemes
/// (`compressed_tensors/quantization/quant_scheme.py`): `FP8_DYNAMIC` (fp8 weights per channel,
/// dynamic per-token fp8 activations) and `W8A8` (int8 weights per channel, dynamic per-token
/// int8 activations), every `Linear` but `lm_head`.
fn compressed_tensors(float: bool) -> Value {
    let kind = if float { "float" } else { "int" };
    json!({"quantization_config": {
        "quant_method": "compressed-tensors",
        "format": if float { "float-quantized" } else { "int-quantized" },
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": kind, "strategy": "channel", "symmetric": true, "dynamic": false},
            "input_activations": {"num_bits": 8, "type": kind, "strategy": "token", "symmetric": true,
                                  "dynamic": true}
        }}
    }})
}

/// The model each row ran, from the published configs (README of the fixture).
fn row_model(id: &str) -> (ModelDescription, Quant) {
    // Qwen/Qwen2.5-7B-Instruct config.json: 32768 positions (the built-in is the base model's).
    let qwen_instruct = |mut changes: Value| {
        changes["max_position_embeddings"] = json!(32768);
        with_config("qwen2.5-7b", changes)
    };
    match id {
        "llama31_8b_qfp8" => (llama(), Quant::Fp8 { block: 128 }),
        "llama31_8b_w4a16_gptq" => (
            with_config(
                "llama-3.1-8b-instruct",
                json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                       "sym": true, "desc_act": false}}),
            ),
            Quant::None,
        ),
        "qwen25_7b_fp8_dynamic" => (qwen_instruct(compressed_tensors(true)), Quant::None),
        "qwen25_7b_w8a8_int8" => (qwen_instruct(compressed_tensors(false)), Quant::None),
        "llama33_70b_fp8_dynamic_tp2" | "llama33_70b_fp8_dynamic_tp4" => {
            (with_config("llama-3.3-70b", compressed_tensors(true)), Quant::None)
        }
        "llama31_8b_w8a8_int8" => {
            (with_config("llama-3.1-8b-instruct", compressed_tensors(false)), Quant::None)
        }
        other => panic!("no model for {other}"),
    }
}

#[test]
fn quantized_weights_and_kv_capacity_match_published_vllm_logs() {
    let mut worst = 0.0f64;
    for row in rows() {
        let (model, quant) = row_model(&row.id);
        let dtype = if row.dtype == "float16" { DType::F16 } else { DType::BF16 };
        let workload = Workload { weight_dtype: Some(dtype), ..serve(quant, row.utilization) };
        let profile = if row.tp == 1 { "h100-80gb".to_string() } else { format!("{}xh100-80gb", row.tp) };
        let b = budget(&model, &profile, &workload, row.tp).expect("budget");
        let weights = b.weights_bytes as f64 / GIB;
        let weights_err = (weights - row.weights_gib) / row.weights_gib * 100.0;
        let kv_err = (b.kv_capacity_tokens as f64 - row.kv_tokens as f64) / row.kv_tokens as f64 * 100.0;
        println!(
            "{:<30} weights {:>6.2} / {:>6.2} GiB ({:+.2} %)  KV {:>9} / {:>9} tokens ({:+.2} %)  {}",
            row.id,
            weights,
            row.weights_gib,
            weights_err,
            b.kv_capacity_tokens,
            row.kv_tokens,
            kv_err,
            b.quantization.as_deref().unwrap_or("-")
        );
        assert!(weights_err.abs() <= 2.0, "{}: weights {weights_err:+.2} %", row.id);
        assert!(kv_err.abs() <= 2.0, "{}: KV tokens {kv_err:+.2} %", row.id);
        worst = worst.max(weights_err.abs()).max(kv_err.abs());
    }
    println!("worst error {worst:.2} %");
}

/// A mixture of experts under vLLM's AWQ and GPTQ MoE methods: the stacked experts are packed
/// too (4 bits a weight, a scale in the model dtype per 128 inputs of each output, AWQ's zero
/// points packed like the weights), where transformers' conversion leaves them in bf16. On an
/// A100 (Marlin): Mixtral-8x7B's 32 layers × 8 experts × 3 × 14336 × 4096 expert weights.
#[test]
fn experts_are_packed_under_vllms_moe_methods() {
    let model = model::load("mixtral-8x7b", ImportOptions::default()).expect("a built-in model");
    let float = budget(&model, "a100-80gb", &serve(Quant::None, 0.9), 1).expect("budget");
    let experts: u64 = 32 * 8 * 3 * 14336 * 4096;
    let gptq = budget(&model, "a100-80gb", &serve(Quant::Gptq { bits: 4, group_size: 128 }, 0.9), 1)
        .expect("budget");
    let awq =
        budget(&model, "a100-80gb", &serve(Quant::Awq { bits: 4, group_size: 128 }, 0.9), 1).expect("budget");
    // The experts alone: bf16 before; 4-bit values and bf16 group scales after (AWQ: and
    // 4-bit zero points per group).
    let packed = experts / 2 + 2 * experts / 128;
    // The experts alone give up at least this much (the linears outside them give up more).
    assert!(float.weights_bytes - gptq.weights_bytes >= 2 * experts - packed, "{gptq:?}");
    let zeros = experts / 128 / 2;
    assert_eq!(awq.weights_bytes - gptq.weights_bytes, zeros + awq_minus_gptq_outside_experts(&model));
}

/// What AWQ holds beyond GPTQ outside the experts on Marlin: the zero points of every packed
/// linear (GPTQ's symmetric Marlin path drops them), 4-bit per group of 128 and output.
fn awq_minus_gptq_outside_experts(model: &ModelDescription) -> u64 {
    let mut linear = 0u64;
    model.root.visit(&mut |m| {
        if m.kind == vramplan_profiles::model::ModuleKind::Linear
            && m.path != "lm_head"
            && m.path.contains(".layers.")
        {
            linear += m.tensors.iter().filter(|t| t.name == "weight").map(|t| t.numel()).sum::<u64>();
        }
    });
    linear / 128 / 2
}

/// One row of `fixtures/published/vllm-quant/vllm_awq.csv`: an AWQ checkpoint under vLLM's
/// `awq_marlin`, with the terms vLLM logged (V0's `model weights take …; non_torch_memory takes
/// …; PyTorch activation peak memory takes …; the rest of the memory reserved for KV Cache is …`).
struct AwqRow {
    id: String,
    gpu_memory_mib: u64,
    tp: u32,
    utilization: f64,
    max_model_len: u64,
    max_num_batched_tokens: u64,
    weights_gib: f64,
    non_torch_gib: f64,
    activation_peak_gib: f64,
    kv_cache_gib: f64,
}

fn awq_rows() -> Vec<AwqRow> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/published/vllm-quant/vllm_awq.csv");
    let mut reader = csv::Reader::from_path(path).expect("the fixture");
    reader
        .deserialize::<std::collections::BTreeMap<String, String>>()
        .map(|r| {
            let r = r.expect("a row");
            let num = |key: &str| r[key].parse::<f64>().unwrap_or_else(|_| panic!("{key}"));
            AwqRow {
                id: r["id"].clone(),
                gpu_memory_mib: r["gpu_memory_mib"].parse().expect("MiB"),
                tp: r["tp"].parse().expect("tp"),
                utilization: num("gpu_memory_utilization"),
                max_model_len: r["max_model_len"].parse().expect("max_model_len"),
                max_num_batched_tokens: r["max_num_batched_tokens"].parse().expect("tokens"),
                weights_gib: num("weights_gib"),
                non_torch_gib: num("non_torch_gib"),
                activation_peak_gib: num("activation_peak_gib"),
                kv_cache_gib: num("kv_cache_gib"),
            }
        })
        .collect()
}

/// The NVIDIA A40 of the AWQ row: an Ampere GPU of compute capability 8.6 (NVIDIA's table),
/// `nvidia-smi` total 46068 MiB (the log's `nvidia-smi`), the catalog's Ampere driver reserve;
/// built here from the catalog's A100 (same generation) since the catalog has no A40.
fn a40(memory_mib: u64) -> Device {
    let mut gpu = device("a100-80gb");
    gpu.name = "NVIDIA A40".into();
    gpu.model = None;
    gpu.memory_bytes = memory_mib << 20;
    gpu.compute_capability = vramplan_profiles::hardware::ComputeCapability { major: 8, minor: 6 };
    gpu
}

/// Qwen/Qwen2.5-72B-Instruct-AWQ: the built-in Qwen2.5-72B with the MLP padded to 29696 (29568 /
/// 128 = 231 groups do not split over the log's 2 ranks; Qwen pads its official quantized 72B
/// checkpoints to 29696, sources in the fixture's README) and AutoAWQ's GEMM
/// `quantization_config`.
fn qwen25_72b_awq() -> ModelDescription {
    with_config(
        "qwen2.5-72b",
        json!({"intermediate_size": 29696, "torch_dtype": "float16",
               "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                       "zero_point": true, "version": "gemm",
                                       "modules_to_not_convert": null}}),
    )
}

/// The AWQ rows, logged by vLLM 0.7.2's V0 engine. vLLM 0.19's terms apply to the weights and
/// to the device: `awq_marlin` holds 4-bit weights, fp16 scales and 4-bit zero points per group of
/// 128 in both versions (the Marlin repack keeps their bytes), so the weights are held to 2 %,
/// and so is the KV cache that our weights and our CUDA total leave beside the log's own
/// activation and non-torch terms (0.7.2's `determine_num_available_blocks`: requested − weights
/// − non-torch increase − torch peak increase, the identity vLLM 0.19 keeps). Those two terms
/// are not vLLM 0.19's on H100s, and the test records that known miss so that it fails if either
/// moves: 0.7.2 takes its baseline snapshot before `init_worker_distributed_environment`, so its
/// non-torch term holds the whole distributed footprint, 0.32 GiB on the A40 pair, against the
/// 1.02 + 2.09 GiB vLLM 0.19 shows on H100 SXM (`DISTRIBUTED_INIT_BYTES`, `NON_TORCH_TP2_BYTES`,
/// applied to every GPU for want of other measurements); and 0.7.2's V0 profile run is eager (no
/// `torch.compile`), its temporaries living until their Python names drop, where our activation
/// peak models V1's compiled graph: ours is 25 % to 40 % below the logged 5.66 GiB. With all of
/// vLLM 0.19's terms the KV cache comes within 2 % of the log only because these two differences
/// cancel; that agreement is printed, not asserted.
#[test]
fn awq_weights_match_a_published_vllm_log() {
    for row in awq_rows() {
        let model = match row.id.as_str() {
            "qwen25_72b_awq_tp2_a40" => qwen25_72b_awq(),
            other => panic!("no model for {other}"),
        };
        let gpu = a40(row.gpu_memory_mib);
        let workload = Workload {
            seq: row.max_model_len,
            weight_dtype: Some(DType::F16),
            engine: Engine::Vllm {
                gpu_memory_utilization: row.utilization,
                max_num_batched_tokens: row.max_num_batched_tokens,
            },
            ..Workload::default()
        };
        let b = vllm::budget(&model, &gpu, &workload, row.tp).expect("budget");
        let gib = |bytes: u64| bytes as f64 / GIB;
        let pct = |ours: f64, logged: f64| (ours - logged) / logged * 100.0;
        let weights_err = pct(gib(b.weights_bytes), row.weights_gib);
        let v0_kv =
            gib(b.requested_bytes) - gib(b.weights_bytes) - row.activation_peak_gib - row.non_torch_gib;
        let v0_kv_err = pct(v0_kv, row.kv_cache_gib);
        let act_err = pct(gib(b.activation_peak_bytes), row.activation_peak_gib);
        let kv_019_err = pct(gib(b.kv_cache_bytes), row.kv_cache_gib);
        println!(
            "{}: weights {:.2} / {:.2} GiB ({weights_err:+.2} %) [{}]; KV with V0's activation and non-torch \
             terms {v0_kv:.2} / {:.2} GiB ({v0_kv_err:+.2} %); known miss: activation {:.2} / {:.2} GiB \
             ({act_err:+.2} %), non-torch {:.2} / {:.2} GiB, KV with vLLM 0.19's terms {:.2} GiB ({kv_019_err:+.2} %)",
            row.id,
            gib(b.weights_bytes),
            row.weights_gib,
            b.quantization.as_deref().unwrap_or("-"),
            row.kv_cache_gib,
            gib(b.activation_peak_bytes),
            row.activation_peak_gib,
            gib(b.non_torch_bytes),
            row.non_torch_gib,
            gib(b.kv_cache_bytes),
        );
        assert!(b.quantization.as_deref().is_some_and(|q| q.contains("Marlin")), "{:?}", b.quantization);
        assert!(weights_err.abs() <= 2.0, "{}: weights {weights_err:+.2} %", row.id);
        assert!(v0_kv_err.abs() <= 2.0, "{}: KV under V0's terms {v0_kv_err:+.2} %", row.id);
        assert!(
            (-40.0..=-25.0).contains(&act_err),
            "{}: activation {act_err:+.2} % (known miss moved)",
            row.id
        );
        assert!(gib(b.non_torch_bytes) - row.non_torch_gib > 1.5, "{}: non-torch (known miss moved)", row.id);
    }
}
