//! The inference-engine budgets (vLLM, llama.cpp) and tensor-parallel sharding against
//! independent figures: the logged vLLM 0.19 memory profiles and llama.cpp buffer sizes of
//! `fixtures/published/measurements/measured.csv`, llama.cpp's own model-size line for the same GGUF
//! file, and closed forms computed here from the published configs.

use std::collections::BTreeMap;
use vramplan_profiles::hardware::{self, Device};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_profiles::{DType, units::format_bytes};
use vramplan_sim::engines::gguf::{self, FileType, GgmlType, Role};
use vramplan_sim::engines::{llamacpp, vllm};
use vramplan_sim::tensor_parallel;
use vramplan_sim::workload::{Engine, Quant, Workload};

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

fn rows() -> Vec<BTreeMap<String, String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/published/measurements/measured.csv");
    let mut reader = csv::Reader::from_path(path).expect("measured.csv in fixtures/published/measurements");
    reader.deserialize::<BTreeMap<String, String>>().map(|row| row.expect("a CSV row")).collect()
}

/// The number right after `key=` in `text` (`weights=14.99;…` → 14.99).
fn number_after(text: &str, key: &str) -> Option<f64> {
    let start = text.find(key)? + key.len();
    let digits: String =
        text[start..].trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    digits.trim_end_matches('.').parse().ok()
}

fn load(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("a built-in model")
}

/// `1x H100-80GB` → (1, the device of profile `h100-80gb`).
fn gpus(text: &str) -> (u32, Device) {
    let (count, kind) = text.split_once('x').expect("`Nx GPU`");
    let count: u32 = count.trim().parse().expect("a GPU count");
    let key = kind.trim().to_ascii_lowercase().replace(' ', "");
    let profile = hardware::load(&key).expect("a built-in GPU");
    (count, profile.devices[0].clone())
}

/// The built-in model of each measured checkpoint (instruct/chat and base share the shapes).
fn builtin(hf_name: &str) -> &'static str {
    if hf_name.starts_with("meta-llama/Llama-3.1-8B") {
        "llama-3.1-8b-instruct"
    } else if hf_name.starts_with("mistralai/Mixtral-8x7B") {
        "mixtral-8x7b"
    } else if hf_name.starts_with("deepseek-ai/DeepSeek-V2-Lite") {
        "deepseek-v2-lite"
    } else {
        panic!("no built-in for {hf_name}")
    }
}

fn within(predicted: f64, logged: f64, tolerance: f64) -> bool {
    (predicted - logged).abs() <= tolerance * logged.abs()
}

fn pct(predicted: f64, logged: f64) -> String {
    format!("{:+.1}%", 100.0 * (predicted - logged) / logged)
}

#[test]
fn vllm_budgets_match_the_logged_v019_profiles() {
    let rows: Vec<_> = rows().into_iter().filter(|r| r["id"].starts_with("vllm019_")).collect();
    assert_eq!(rows.len(), 5, "the five vLLM 0.19 rows");
    let mut failures = Vec::new();
    println!(
        "{:<30} {:>6} {:>16} {:>16} {:>16} {:>16} {:>16} {:>20} {:>8}",
        "id (GiB: predicted / logged)",
        "tp",
        "weights",
        "activation",
        "non-torch",
        "cuda graph",
        "kv cache",
        "kv tokens",
        "bytes/t"
    );
    for row in &rows {
        let id = &row["id"];
        let notes = &row["notes"];
        let model = load(builtin(&row["model"]));
        let (tp, device) = gpus(&row["gpus"]);
        let utilization = number_after(notes, "gpu_memory_utilization=").expect("utilization in notes");
        let batched = number_after(notes, "max_num_batched_tokens=").expect("batched tokens in notes") as u64;
        let max_model_len = number_after(&row["seq_len"], "max_model_len").expect("max_model_len") as u64;
        let weight_dtype = row["weight_dtype"].starts_with("fp32").then_some(DType::F32);
        let workload = Workload {
            seq: max_model_len,
            weight_dtype,
            engine: Engine::Vllm { gpu_memory_utilization: utilization, max_num_batched_tokens: batched },
            ..Workload::default()
        };
        let budget = vllm::budget(&model, &device, &workload, tp).expect("a vLLM budget");
        let logged = |key: &str| number_after(notes, &format!("{key}=")).expect("a logged term");
        let gib = |bytes: u64| bytes as f64 / GIB;
        println!(
            "{:<30} {:>6} {:>7.2} / {:>6.2} {:>7.2} / {:>6.2} {:>7.2} / {:>6.2} {:>7.2} / {:>6.2} {:>7.2} / {:>6.2} {:>9} / {:>8} {:>8}",
            id,
            tp,
            gib(budget.weights_bytes),
            logged("weights"),
            gib(budget.activation_peak_bytes),
            logged("activation_peak"),
            gib(budget.non_torch_bytes),
            logged("non_torch"),
            gib(budget.cuda_graph_bytes),
            logged("cudagraph"),
            gib(budget.kv_cache_bytes),
            logged("kv_cache"),
            budget.kv_capacity_tokens,
            logged("kv_tokens"),
            budget.kv_bytes_per_token,
        );
        println!(
            "{:<30} activation peak at {}; errors: weights {}, activation {}, kv tokens {}",
            "",
            budget.activation_peak_at,
            pct(gib(budget.weights_bytes), logged("weights")),
            pct(gib(budget.activation_peak_bytes), logged("activation_peak")),
            pct(budget.kv_capacity_tokens as f64, logged("kv_tokens")),
        );

        // Weights per GPU within 2 %.
        if !within(gib(budget.weights_bytes), logged("weights"), 0.02) {
            failures.push(format!(
                "{id}: weights {:.2} GiB vs {:.2}",
                gib(budget.weights_bytes),
                logged("weights")
            ));
        }
        // KV bytes per token: 2 × layers × KV heads per GPU × head_dim × dtype bytes from the
        // published configs; MLA: layers × (kv_lora_rank + qk_rope_head_dim) × 2.
        let expected_per_token: u64 = match (builtin(&row["model"]), tp, weight_dtype) {
            ("llama-3.1-8b-instruct", 1, None) => 2 * 32 * 8 * 128 * 2,
            ("llama-3.1-8b-instruct", 1, Some(DType::F32)) => 2 * 32 * 8 * 128 * 4,
            ("llama-3.1-8b-instruct", 2, None) => 2 * 32 * 4 * 128 * 2,
            ("mixtral-8x7b", 2, None) => 2 * 32 * 4 * 128 * 2,
            ("deepseek-v2-lite", 1, None) => 27 * (512 + 64) * 2,
            other => panic!("no KV closed form for {other:?}"),
        };
        if budget.kv_bytes_per_token != expected_per_token {
            failures
                .push(format!("{id}: {} KV bytes/token vs {expected_per_token}", budget.kv_bytes_per_token));
        }
        // Capacity from our own predicted terms, within 5 % of the logged token count.
        if !within(budget.kv_capacity_tokens as f64, logged("kv_tokens"), 0.05) {
            failures.push(format!(
                "{id}: {} KV tokens vs {}",
                budget.kv_capacity_tokens,
                logged("kv_tokens")
            ));
        }
        // The logged terms themselves satisfy the identity vLLM 0.19 uses (without CUDA
        // graphs): total × utilization − weights − activation − non-torch = KV cache.
        let total_gib = gib(device.memory_bytes - device.driver_reserve_bytes);
        let identity =
            total_gib * utilization - logged("weights") - logged("activation_peak") - logged("non_torch");
        if (identity - logged("kv_cache")).abs() > 0.02 {
            failures.push(format!(
                "{id}: logged terms give {identity:.2} GiB of KV, logged {}",
                logged("kv_cache")
            ));
        }
        assert!(budget.fits, "{id}: one request of {max_model_len} tokens fits");
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn llamacpp_buffers_match_the_logged_llama2_q4km_run() {
    let row =
        rows().into_iter().find(|r| r["id"] == "llamacpp_llama2_7b_q4km_ctx2048").expect("the llama.cpp row");
    let quote = &row["quote"];
    let logged_model = number_after(quote, "CUDA0 buffer size =").expect("model buffer");
    let logged_cpu = number_after(quote, "CPU buffer size =").expect("CPU buffer");
    let logged_kv = number_after(quote, "CUDA0 KV buffer size =").expect("KV buffer");
    let logged_compute = number_after(quote, "CUDA0 compute buffer size =").expect("compute buffer");
    let logged_total: f64 = row["measured_value"].parse().expect("a total");
    let n_ctx = number_after(&row["seq_len"], "n_ctx").expect("n_ctx") as u64;
    let (_, device) = gpus(&row["gpus"]);
    let model = load("llama-2-7b");
    // n_ubatch is not in the row: llama.cpp's default (512) at the time of the log.
    let workload = Workload {
        seq: n_ctx,
        quant: Quant::Gguf { quant_type: row["quant"].clone() },
        engine: Engine::LlamaCpp { n_ctx, n_ubatch: 512 },
        ..Workload::default()
    };
    let budget = llamacpp::budget(&model, &device, &workload).expect("a llama.cpp budget");
    let mib = |bytes: u64| bytes as f64 / MIB;
    let terms = [
        ("CUDA0 model buffer", mib(budget.model_bytes_gpu), logged_model, 0.02),
        ("CPU model buffer", mib(budget.model_bytes_cpu), logged_cpu, 0.02),
        ("KV buffer", mib(budget.kv_bytes), logged_kv, 0.0),
        ("compute buffer", mib(budget.compute_bytes), logged_compute, 0.15),
        ("CUDA0 total", mib(budget.gpu_bytes()), logged_total, 0.05),
    ];
    println!("{:<20} {:>12} {:>12} {:>8}", "MiB", "predicted", "logged", "error");
    for (name, predicted, logged, _) in &terms {
        println!("{name:<20} {predicted:>12.2} {logged:>12.2} {:>8}", pct(*predicted, *logged));
    }
    println!("compute buffer set by: {}", budget.compute_peak_at);
    // KV: 2 × 32 layers × 4096 × 2048 cells × 2 bytes, exactly.
    assert_eq!(budget.kv_bytes, 2 * 32 * 4096 * 2048 * 2);
    for (name, predicted, logged, tolerance) in terms {
        assert!(within(predicted, logged, tolerance), "{name}: {predicted:.2} MiB vs {logged:.2}");
    }
    assert!(budget.fits, "5 GiB fits a 24 GiB RTX 3090");
}

#[test]
fn the_q4_k_m_mix_of_llama2_7b_is_llama_cpps() {
    let model = load("llama-2-7b");
    let tensors = gguf::quantize(&model, FileType::Q4_K_M).expect("a float model");
    let of =
        |role: Role, ty: GgmlType| tensors.iter().filter(|t| t.role == role && t.ggml_type == ty).count();
    // use_more_bits picks 16 of 32 layers for Q6_K attn_v and ffn_down; the output is Q6_K, the
    // token embedding Q4_K, the 65 norms F32.
    assert_eq!((of(Role::AttnV, GgmlType::Q6_K), of(Role::AttnV, GgmlType::Q4_K)), (16, 16));
    assert_eq!((of(Role::FfnDown, GgmlType::Q6_K), of(Role::FfnDown, GgmlType::Q4_K)), (16, 16));
    assert_eq!(of(Role::Output, GgmlType::Q6_K), 1);
    assert_eq!(of(Role::TokenEmbedding, GgmlType::Q4_K), 1);
    assert_eq!(of(Role::Kept, GgmlType::F32), 65);
    assert_eq!(of(Role::AttnQ, GgmlType::Q4_K) + of(Role::FfnGate, GgmlType::Q4_K), 64);
    // llama.cpp's loader prints "model size = 3.80 GiB (4.84 BPW)" for this file (the row's
    // model column): 6,738,415,616 parameters.
    let bytes: u64 = tensors.iter().map(|t| t.bytes).sum();
    let params = model.params() as f64;
    println!(
        "llama-2-7b Q4_K_M: {} ({:.4} GiB), {:.3} BPW",
        format_bytes(bytes),
        bytes as f64 / GIB,
        bytes as f64 * 8.0 / params
    );
    assert!(within(bytes as f64 / GIB, 3.80, 0.005));
    assert!(within(bytes as f64 * 8.0 / params, 4.84, 0.005));
}

#[test]
fn other_file_types_follow_their_rules() {
    let llama = load("llama-2-7b");
    let types = |ft: FileType, role: Role| -> Vec<GgmlType> {
        gguf::quantize(&llama, ft)
            .expect("a float model")
            .iter()
            .filter(|t| t.role == role)
            .map(|t| t.ggml_type)
            .collect()
    };
    // Q8_0 keeps the output at Q8_0; Q4_0 raises it to Q6_K.
    assert_eq!(types(FileType::Q8_0, Role::Output), [GgmlType::Q8_0]);
    assert_eq!(types(FileType::Q4_0, Role::Output), [GgmlType::Q6_K]);
    // Q3_K_M: the first two attn_v at Q5_K, the rest Q4_K; attn_output Q4_K.
    let v = types(FileType::Q3_K_M, Role::AttnV);
    assert_eq!(v.iter().filter(|t| **t == GgmlType::Q5_K).count(), 2);
    assert_eq!(v.iter().filter(|t| **t == GgmlType::Q4_K).count(), 30);
    assert!(types(FileType::Q3_K_M, Role::AttnOutput).iter().all(|t| *t == GgmlType::Q4_K));
    // F16: every matrix F16.
    assert!(types(FileType::F16, Role::FfnUp).iter().all(|t| *t == GgmlType::F16));
    // Mixtral (8 experts): attn_v and attn_k to Q8_0, attn_output to Q5_K in Q4_K_M.
    let mixtral = load("mixtral-8x7b");
    let tensors = gguf::quantize(&mixtral, FileType::Q4_K_M).expect("a float model");
    assert!(
        tensors
            .iter()
            .filter(|t| matches!(t.role, Role::AttnV | Role::AttnK))
            .all(|t| t.ggml_type == GgmlType::Q8_0)
    );
    assert!(tensors.iter().filter(|t| t.role == Role::AttnOutput).all(|t| t.ggml_type == GgmlType::Q5_K));
    // Fused expert gate/up become two tensors of half the rows each.
    let gate: u64 = tensors.iter().filter(|t| t.role == Role::FfnGate).map(|t| t.rows).sum();
    assert_eq!(gate, 32 * 8 * 14336);
    // DeepSeek-V2-Lite's 1408-wide expert rows are not whole 256-blocks: Q4_K falls back to Q5_0.
    let lite = load("deepseek-v2-lite");
    let tensors = gguf::quantize(&lite, FileType::Q4_K_M).expect("a float model");
    let down =
        tensors.iter().find(|t| t.role == Role::FfnDown && t.row_elements == 1408).expect("an expert down");
    assert!(matches!(down.ggml_type, GgmlType::Q5_0 | GgmlType::Q8_0), "{:?}", down.ggml_type);
}

#[test]
fn tensor_parallel_shards_follow_vllm() {
    // Llama-3.1-8B at TP 2, from its config: every linear halves (4 of 8 KV heads per rank),
    // the 128256-row embedding and head are already a multiple of 128, norms replicate.
    let llama = load("llama-3.1-8b-instruct");
    let (h, v, i, l, kv_dim) = (4096u64, 128256u64, 14336u64, 32u64, 8 * 128u64);
    let per_layer = h * h / 2 + 2 * h * kv_dim / 2 + h * h / 2 + 3 * h * i / 2 + 2 * h;
    let params = 2 * (v / 2) * h + l * per_layer + h;
    let expected = params * 2 + llama.root.buffer_bytes();
    assert_eq!(tensor_parallel::shard_bytes(&llama, 2), expected);
    assert_eq!(tensor_parallel::shard_bytes(&llama, 1), llama.bytes());
    // 16 ranks, 8 KV heads: each rank keeps one head (vLLM replicates), the queries split.
    assert_eq!(tensor_parallel::kv_heads_per_rank(&llama, 16), 1);
    assert_eq!(tensor_parallel::kv_bytes_per_token(&llama, 16, DType::BF16), 2 * 32 * 128 * 2);
    // Mixtral at TP 2: experts split on the intermediate, routers replicate.
    let mixtral = load("mixtral-8x7b");
    let (h, v, i, e) = (4096u64, 32000u64, 14336u64, 8u64);
    let per_layer = h * h / 2 + 2 * h * 1024 / 2 + h * h / 2 + e * 3 * h * i / 2 + e * h + 2 * h;
    let params = 2 * (v / 2) * h + 32 * per_layer + h;
    assert_eq!(tensor_parallel::shard_bytes(&mixtral, 2), params * 2 + mixtral.root.buffer_bytes());
    // A vocabulary that is no multiple of 64 × tp is padded: GPT-2's 50257 rows at TP 2.
    assert_eq!(tensor_parallel::padded_vocab_per_rank(50257, 2), 50304 / 2);
    // MLA keeps the whole latent on every rank.
    let lite = load("deepseek-v2-lite");
    assert_eq!(
        tensor_parallel::kv_bytes_per_token(&lite, 2, DType::BF16),
        tensor_parallel::kv_bytes_per_token(&lite, 1, DType::BF16)
    );
}

#[test]
fn bad_engine_settings_are_input_errors() {
    let llama = load("llama-3.1-8b-instruct");
    let device = hardware::load("h100-80gb").expect("a built-in GPU").devices[0].clone();
    let vllm_workload = |utilization: f64| Workload {
        engine: Engine::Vllm { gpu_memory_utilization: utilization, max_num_batched_tokens: 8192 },
        ..Workload::default()
    };
    assert!(vllm::budget(&llama, &device, &vllm_workload(1.5), 1).is_err());
    assert!(vllm::budget(&llama, &device, &Workload::default(), 1).is_err(), "not the vLLM engine");
    // 32 heads do not split over 3 ranks: vLLM refuses, and so do we, naming the fix.
    let err = vllm::budget(&llama, &device, &vllm_workload(0.9), 3).expect_err("3 ranks");
    assert!(err.fix.is_some_and(|f| f.contains("32")));
    let gguf = |quant_type: &str| Workload {
        quant: Quant::Gguf { quant_type: quant_type.into() },
        engine: Engine::LlamaCpp { n_ctx: 4096, n_ubatch: 512 },
        ..Workload::default()
    };
    assert!(llamacpp::budget(&llama, &device, &gguf("Q9_Z")).is_err());
    assert!(llamacpp::budget(&llama, &device, &gguf("Q4_K_M")).is_ok());
    // At 0.3 of an H100, Llama-3.1-8B's KV cache holds about 55k tokens: a 131072-token
    // request does not fit, and the longest that does is reported.
    let small = Workload { seq: 131072, ..vllm_workload(0.3) };
    let budget = vllm::budget(&llama, &device, &small, 1).expect("a budget");
    assert!(!budget.fits && budget.max_model_len_that_fits < 131072);
}

#[test]
fn llamacpp_compute_and_kv_buffers_match_other_published_logs() {
    let mib = |bytes: u64| bytes as f64 / MIB;
    // fedora-copr/logdetective PR #106: Mistral-7B-Instruct-v0.2 (32 heads, 4096 wide, no
    // window in llama.cpp), n_ubatch 512, no flash attention: KV 256.00 / 4096.00 MiB and
    // compute 164.00 / 2144.00 MiB at n_ctx 2048 / 32768.
    let mistral = load("mistral-7b");
    let device = hardware::load("rtx4090").expect("a built-in GPU").devices[0].clone();
    for (n_ctx, kv, compute) in [(2048u64, 256.0, 164.0), (32768, 4096.0, 2144.0)] {
        let workload = Workload {
            quant: Quant::Gguf { quant_type: "Q4_K_S".into() },
            engine: Engine::LlamaCpp { n_ctx, n_ubatch: 512 },
            ..Workload::default()
        };
        let budget = llamacpp::budget(&mistral, &device, &workload).expect("a budget");
        println!(
            "mistral-7b n_ctx {n_ctx}: KV {:.2} MiB, compute {:.2} MiB",
            mib(budget.kv_bytes),
            mib(budget.compute_bytes)
        );
        assert_eq!(mib(budget.kv_bytes), kv);
        assert!(within(mib(budget.compute_bytes), compute, 0.01), "{n_ctx}: {}", mib(budget.compute_bytes));
    }
    // Llama-3(.1)-8B logs with n_ubatch 512: "CUDA0 compute buffer size = 258.50 MiB" at n_ctx
    // 512 and 2048, where the 128256-wide logits outweigh the attention scores.
    let llama3 = load("llama-3-8b");
    for n_ctx in [512u64, 2048] {
        let (bytes, at) = llamacpp::compute_buffer(&llama3, n_ctx, 512, false);
        println!("llama-3-8b n_ctx {n_ctx}: compute {:.2} MiB ({at})", mib(bytes));
        assert!(within(mib(bytes), 258.5, 0.01));
    }
}
