//! How each inference engine places a model by default, and what vLLM's bitsandbytes loader and
//! profiler hold, against independent figures: llama.cpp's own logs (a Command-R split over two
//! GPUs, llama.cpp PR #6122), closed forms of llama.cpp's split rule and graph inputs worked out
//! here from the published configs, vLLM's loader arithmetic from the configs, and the
//! llm-d-planner vLLM 0.19 runs of models the accuracy test does not check.

use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::engines::llamacpp::{self, GraphShare, PIPELINE_COPIES};
use vramplan_sim::engines::llamacpp_split::{self, LayerPlacement};
use vramplan_sim::engines::vllm;
use vramplan_sim::workload::{Engine, Parallelism, Quant, Workload};
use vramplan_sim::{Placement, Target};

const MIB: f64 = (1u64 << 20) as f64;
const GIB: u64 = 1 << 30;

fn load(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("a built-in model")
}

fn hw(spec: &str) -> HardwareProfile {
    hardware::load(spec).expect("a hardware profile")
}

fn llamacpp(quant: &str, n_ctx: u64) -> Workload {
    Workload {
        seq: n_ctx,
        quant: Quant::Gguf { quant_type: quant.into() },
        engine: Engine::LlamaCpp { n_ctx, n_ubatch: 512 },
        ..Workload::default()
    }
}

/// Command-R v01 (35B) as llama.cpp sees it: 40 layers, `n_embd` 8192, 64 heads without GQA,
/// `n_ff` 22528, a 256000-token vocabulary tied to the output (CohereForAI/c4ai-command-r-v01
/// config.json), written as a Llama config since these are all the buffers depend on.
fn command_r() -> ModelDescription {
    let config = r#"{
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
        "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 256000,
        "max_position_embeddings": 8192, "rope_theta": 8000000.0, "rms_norm_eps": 1e-05,
        "tie_word_embeddings": true, "torch_dtype": "float16"
    }"#;
    model::hf::from_config_text(config, "command-r-v01", ImportOptions::default()).expect("a config")
}

#[test]
fn pipeline_parallel_compute_and_kv_buffers_match_the_logged_command_r_split() {
    // llama.cpp PR #6122 (a two-GPU run, RTX 4070 Ti + RTX 3090 Ti, n_ctx 4096, n_ubatch 512, no
    // flash attention, "pipeline parallelism enabled (n_copies=4)"):
    //   CUDA0 KV buffer size = 1536.00 MiB, CUDA1 KV buffer size = 3584.00 MiB (12 and 28 layers),
    //   CUDA0 compute buffer size = 672.01 MiB (a device holding layers, not the output).
    let model = command_r();
    let share = GraphShare { layers: true, output: false, copies: PIPELINE_COPIES };
    let (compute, at) = llamacpp::compute_buffer_share(&model, 4096, 512, false, share);
    println!("CUDA0 compute: {:.3} MiB ({at}) vs 672.01 logged", compute as f64 / MIB);
    assert!((compute as f64 / MIB - 672.01).abs() < 0.005, "{} MiB", compute as f64 / MIB);

    let placement = LayerPlacement {
        layers: (0..40).map(|i| Some(if i < 12 { 0 } else { 1 })).collect(),
        experts: (0..40).map(|i| Some(if i < 12 { 0 } else { 1 })).collect(),
        output: Some(1),
    };
    let budget =
        llamacpp_split::split_budget(&model, &hw("2xrtx4090"), &llamacpp("Q4_K_M", 4096), &placement)
            .expect("a split budget");
    assert!(budget.pipeline_parallel);
    let kv: Vec<f64> = budget.devices.iter().map(|d| d.kv_bytes as f64 / MIB).collect();
    assert_eq!(kv, vec![1536.0, 3584.0]);
    for d in &budget.devices {
        println!(
            "GPU {}: {} layers, output {}, model {:.2} MiB, kv {:.2} MiB, compute {:.2} MiB ({})",
            d.gpu,
            d.layers,
            d.output,
            d.model_bytes as f64 / MIB,
            d.kv_bytes as f64 / MIB,
            d.compute_bytes as f64 / MIB,
            d.compute_peak_at
        );
    }
    assert!((budget.devices[0].compute_bytes as f64 / MIB - 672.01).abs() < 0.005);
    // The token embedding stays on the host (logged "CPU buffer size = 1640.62 MiB": Q6_K, the
    // type Q4_K_M gives a tied `token_embd`), and its copy as `output` is on the second GPU.
    assert!((budget.host_model_bytes as f64 / MIB - 1640.62).abs() < 0.0051, "{}", budget.host_model_bytes);
}

#[test]
fn one_gpu_has_no_pipeline_copies() {
    // With one device the whole graph runs there with one copy of its inputs: the single-GPU
    // compute buffer, which the published single-GPU logs check (sim/tests/engines.rs).
    let model = load("llama-3-8b");
    let whole = llamacpp::compute_buffer(&model, 4096, 512, false);
    let share = GraphShare { layers: true, output: true, copies: 1 };
    assert_eq!(llamacpp::compute_buffer_share(&model, 4096, 512, false, share), whole);
}

#[test]
fn llamacpp_splits_layers_over_two_equal_gpus_by_default() {
    // Two T4s, equal free memory: llama.cpp splits the 33 slots (32 layers, then the output) at
    // 0.5, so slot il goes to GPU 0 while il / 33 < 0.5: layers 0..=16 on GPU 0 (17), layers
    // 17..=31 and the output layer on GPU 1.
    let model = load("llama-3-8b");
    let hardware = hw("t4x2");
    let workload = llamacpp("Q4_K_M", 4096);
    let estimate =
        vramplan_sim::estimate(&model, &hardware, &workload, &Placement::single(0)).expect("an estimate");
    assert_eq!(estimate.devices.len(), 2, "one row per GPU");
    // KV per layer: K and V of 4096 cells × 8 KV heads × 128 in f16 = 16 MiB.
    let layer_kv = 2 * 4096 * 8 * 128 * 2;
    assert_eq!(estimate.devices[0].components.kv_cache, 17 * layer_kv);
    assert_eq!(estimate.devices[1].components.kv_cache, 15 * layer_kv);
    // The same tensors as on one GPU, divided: the two model buffers add up to the one-GPU
    // buffer (checked against a llama.cpp log in sim/tests/engines.rs).
    let one = llamacpp::budget(&model, &hardware.devices[0], &workload).expect("a budget");
    let weights: u64 = estimate.devices.iter().map(|d| d.components.weights).sum();
    assert_eq!(weights, one.model_bytes_gpu);
    // Compute, with pipeline parallelism (two devices, all offloaded): the attention stage
    // without the mask (KQ of 32 heads × 4096 × 512 and four 4096-wide rows, f32) plus four
    // copies of the inputs (mask 4096 × 512 f32, hidden states 4096 × 512 f32, positions
    // 512 int32; GPU 1 also the output rows' ids, 512 int32).
    let stage = 4 * 512 * (32 * 4096 + 4 * 4096);
    let inputs = 4 * 4096 * 512 + 4 * 4096 * 512 + 4 * 512;
    assert_eq!(estimate.devices[0].components.activations, stage + 4 * inputs);
    assert_eq!(estimate.devices[1].components.activations, stage + 4 * (inputs + 4 * 512));
    assert!(estimate.fits);
}

#[test]
fn uneven_gpus_get_layers_in_proportion_to_free_memory() {
    let model = load("llama-2-13b");
    let hardware = hw("rtx4090+t4");
    let free: Vec<f64> = hardware.devices.iter().map(|d| d.usable_bytes() as f64).collect();
    let share = free[0] / (free[0] + free[1]);
    // 41 slots; GPU 0 takes those with il / 41 < share.
    let expected_first = (0..=40).filter(|il| (*il as f64) / 41.0 < share).count() as u64;
    let estimate =
        vramplan_sim::estimate(&model, &hardware, &llamacpp("Q4_K_M", 2048), &Placement::single(0))
            .expect("estimate");
    // KV per layer of Llama-2-13B: 2 × 2048 × 40 heads × 128 × 2 B = 40 MiB.
    let layer_kv = 2 * 2048 * 40 * 128 * 2;
    assert_eq!(estimate.devices[0].components.kv_cache, expected_first * layer_kv);
    assert_eq!(estimate.devices[1].components.kv_cache, (40 - expected_first) * layer_kv);
    assert!(expected_first > 20, "the 24 GB card takes more than half: {expected_first}");
}

#[test]
fn a_plan_places_the_layers_and_partial_offload_has_no_pipeline() {
    let model = load("llama-3-8b");
    let hardware = hw("t4x2");
    let workload = llamacpp("Q4_K_M", 4096);
    // A `--target llama.cpp` plan: blk.0..=19 on GPU 0, the rest and the output on GPU 1.
    let mut entries: Vec<(String, Target)> =
        (0..32).map(|i| (format!("blk.{i}"), Target::Gpu(if i < 20 { 0 } else { 1 }))).collect();
    entries.push(("output".into(), Target::Gpu(1)));
    let estimate =
        vramplan_sim::estimate(&model, &hardware, &workload, &Placement::from_entries(entries.clone()))
            .expect("e");
    let layer_kv = 2 * 4096 * 8 * 128 * 2;
    assert_eq!(estimate.devices[0].components.kv_cache, 20 * layer_kv);
    assert_eq!(estimate.devices[1].components.kv_cache, 12 * layer_kv);

    // The first four layers on the CPU: no pipeline parallelism, so each GPU's compute buffer is
    // the one-copy graph's stages (with the mask), and a warning names the host's share.
    for entry in entries.iter_mut().take(4) {
        entry.1 = Target::Cpu;
    }
    let partial =
        vramplan_sim::estimate(&model, &hardware, &workload, &Placement::from_entries(entries)).expect("e");
    let one_copy = GraphShare { layers: true, output: false, copies: 1 };
    let (gpu0, _) = llamacpp::compute_buffer_share(&model, 4096, 512, false, one_copy);
    assert_eq!(partial.devices[0].components.activations, gpu0);
    assert_eq!(partial.devices[0].components.kv_cache, 16 * layer_kv);
    assert!(
        partial.warnings.iter().any(|w| w.contains("4 of 32 layers stay on the host")),
        "{:?}",
        partial.warnings
    );
}

#[test]
fn an_accelerate_map_places_llamacpp_layers_by_module_path() {
    let model = load("llama-3-8b");
    let mut entries = vec![("".to_string(), Target::Gpu(0))];
    entries.extend((10..32).map(|i| (format!("model.layers.{i}"), Target::Gpu(1))));
    entries.push(("lm_head".into(), Target::Gpu(1)));
    let placement = LayerPlacement::from_placement(&model, &Placement::from_entries(entries));
    assert_eq!(placement.layers.iter().filter(|l| **l == Some(0)).count(), 10);
    assert_eq!(placement.output, Some(1));
}

#[test]
fn vllm_serves_from_one_gpu_without_tensor_parallelism() {
    let model = load("llama-3.1-8b-instruct");
    let hardware = hw("2xh100-80gb");
    let workload = Workload {
        seq: 8192,
        engine: Engine::Vllm { gpu_memory_utilization: 0.9, max_num_batched_tokens: 8192 },
        ..Workload::default()
    };
    let estimate = vramplan_sim::estimate(&model, &hardware, &workload, &Placement::single(0)).expect("e");
    assert_eq!(estimate.devices.len(), 1, "vLLM's --tensor-parallel-size defaults to 1");
    assert!(estimate.warnings.iter().any(|w| w.contains("--parallel tp=2")), "{:?}", estimate.warnings);
    let tp2 = Workload { parallelism: Parallelism::tensor(2), ..workload };
    let sharded = vramplan_sim::estimate(&model, &hardware, &tp2, &Placement::single(0)).expect("e");
    assert_eq!(sharded.devices.len(), 2);
    assert!(sharded.warnings.is_empty());
}

fn vllm_workload(quant: Quant) -> Workload {
    Workload {
        seq: 8192,
        quant,
        engine: Engine::Vllm { gpu_memory_utilization: 0.9, max_num_batched_tokens: 8192 },
        ..Workload::default()
    }
}

#[test]
fn vllm_nf4_weights_are_what_its_bitsandbytes_loader_holds() {
    // Llama-3.1-8B (meta-llama config.json): per layer q 4096², k and v 1024 × 4096, o 4096²,
    // gate/up/down 3 × 14336 × 4096; embedding and untied lm_head 128256 × 4096 in bf16; 65 norms
    // of 4096; the rotary cache 131072 × 128 in bf16.
    let linear_per_layer: u64 = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096;
    let linear = 32 * linear_per_layer;
    let packed = linear / 2;
    let absmax = 4 * linear / 64; // fp32 per 64-value block, double quantization undone
    let codes = 32 * 7 * 16 * 4; // a 16-value fp32 code per quant state, 7 per layer
    let unquantized = 2 * 128256 * 4096 * 2 + 65 * 4096 * 2 + 131072 * 128 * 2;
    let expected = packed + absmax + codes + unquantized;

    let model = load("llama-3.1-8b-instruct");
    let device = hw("h100-80gb").devices[0].clone();
    for double_quant in [false, true] {
        let b =
            vllm::budget(&model, &device, &vllm_workload(Quant::Nf4 { double_quant }), 1).expect("budget");
        assert_eq!(b.weights_bytes, expected, "nf4 double_quant={double_quant}");
    }
    let fp4 =
        vllm::budget(&model, &device, &vllm_workload(Quant::Fp4 { double_quant: false }), 1).expect("b");
    assert_eq!(fp4.weights_bytes, expected);
    let bf16 = vllm::budget(&model, &device, &vllm_workload(Quant::None), 1).expect("budget");
    println!(
        "Llama-3.1-8B under vLLM: bf16 {:.2} GiB, nf4 {:.2} GiB",
        bf16.weights_bytes as f64 / GIB as f64,
        expected as f64 / GIB as f64
    );
    assert!(bf16.weights_bytes > 2 * expected);

    // LLM.int8 (pre-quantized): int8 weights and an fp32 scale per output row.
    let rows_per_layer: u64 = 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096;
    let int8 = vllm::budget(&model, &device, &vllm_workload(Quant::Int8), 1).expect("budget");
    assert_eq!(int8.weights_bytes, linear + 4 * 32 * rows_per_layer + unquantized);
}

#[test]
fn vllm_refuses_what_its_bitsandbytes_loader_refuses() {
    let llama = load("llama-3.1-8b-instruct");
    let device = hw("h100-80gb").devices[0].clone();
    let err =
        vllm::budget(&llama, &device, &vllm_workload(Quant::Int8), 2).expect_err("pre-quantized with TP");
    assert!(err.to_string().contains("tensor parallelism"), "{err}");
    let mixtral = load("mixtral-8x7b");
    assert!(vllm::budget(&mixtral, &device, &vllm_workload(Quant::Int8), 1).is_err(), "no 8-bit MoE");
    // 4-bit MoE dequantizes the layer's experts during the profiling pass: the MoE stage grows by
    // every expert of a layer in bf16 (8 × 3 × 14336 × 4096 × 2 B = 2.625 GiB at TP 1).
    let nf4 =
        vllm::budget(&mixtral, &device, &vllm_workload(Quant::Nf4 { double_quant: false }), 1).expect("b");
    let bf16 = vllm::budget(&mixtral, &device, &vllm_workload(Quant::None), 1).expect("b");
    assert!(nf4.activation_peak_at.ends_with("moe"), "{}", nf4.activation_peak_at);
    assert!(nf4.activation_peak_bytes >= 8 * 3 * 14336 * 4096 * 2, "{}", nf4.activation_peak_bytes);
    assert!(nf4.activation_peak_bytes > bf16.activation_peak_bytes);
}

/// The llm-d-planner vLLM 0.19 campaign on H100 80GB (jgchn/llm-d-planner
/// `accuracy/results/v0.19.0/results_raw.csv`), runs of models the accuracy rows do not check:
/// (model, tp, `non_torch_forward_gib`, `cuda_graph_actual_gib`, `init_cuda_memory_gib`).
const OTHER_RUNS: &[(&str, u32, f64, f64, f64)] = &[
    ("CodeLlama-7b", 1, 0.25, 0.89, 0.51),
    ("Llama-3.3-70B-fp8-dynamic", 2, 2.10, 1.79, 1.53),
    ("Llama-3.3-70B-fp8-dynamic", 4, 2.21, 1.66, 1.55),
    ("Qwen2.5-7B-fp8-dynamic", 1, 0.24, 0.81, 0.51),
    ("gemma-2-27b", 1, 0.26, 1.23, 0.51),
    ("gemma-2-2b", 1, 0.24, 0.71, 0.51),
    ("gemma-2-9b", 1, 0.25, 1.09, 0.51),
    ("gemma-3-12b", 1, 0.25, 0.94, 0.51),
    ("gemma-3-27b", 1, 0.26, 1.14, 0.51),
    ("gemma-3-4b", 1, 0.25, 0.67, 0.51),
    ("granite-3.1-2b", 1, 0.46, 0.84, 0.51),
    ("granite-3.1-8b", 1, 0.46, 0.98, 0.51),
    ("granite-vision-3.3-2b", 1, 0.25, 0.82, 0.51),
    ("phi-4", 1, 0.25, 1.07, 0.51),
    ("Mistral-Small-3.1-24B", 1, 0.25, 1.06, 0.51),
    ("Kimi-Dev-72B", 2, 2.09, 1.61, 1.53),
    ("Kimi-Dev-72B", 4, 2.21, 1.54, 1.55),
    ("Kimi-VL-A3B", 1, 0.25, 1.50, 0.51),
    ("Kimi-VL-A3B", 2, 2.07, 1.26, 2.01),
    ("Qwen2.5-72B", 2, 2.09, 1.61, 1.53),
    ("Qwen2.5-7B", 1, 0.24, 0.87, 0.51),
    ("Qwen2.5-7B", 2, 2.06, 0.71, 1.53),
    ("Qwen2.5-7B", 4, 2.13, 0.64, 1.55),
    ("Qwen3-30B-A3B", 1, 0.27, 1.41, 0.51),
    ("Qwen3-8B", 1, 0.25, 0.96, 0.51),
    ("Llama-3.3-70B-w8a8", 2, 2.11, 1.85, 1.53),
    ("Llama-3.1-8B-w4a16", 1, 0.25, 0.96, 0.51),
    ("Mistral-Small-24B-w8a8", 1, 0.26, 1.22, 0.51),
    ("Mistral-Small-24B-w8a8", 2, 2.07, 1.03, 1.53),
];

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

#[test]
fn vllm_measured_constants_are_the_medians_of_runs_outside_the_checked_rows() {
    let at = |pick: &dyn Fn(u32) -> bool, field: fn(&(&str, u32, f64, f64, f64)) -> f64| {
        median(OTHER_RUNS.iter().filter(|r| pick(r.1)).map(field).collect())
    };
    let non_torch = |r: &(&str, u32, f64, f64, f64)| r.2;
    let graphs = |r: &(&str, u32, f64, f64, f64)| r.3;
    let init = |r: &(&str, u32, f64, f64, f64)| r.4;
    let close = |ours: u64, median: f64| (gib(ours) - median).abs() < 0.005;
    assert!(close(vllm::non_torch_bytes(1), at(&|tp| tp == 1, non_torch)));
    assert!(close(vllm::non_torch_bytes(2), at(&|tp| tp == 2, non_torch)));
    assert!(close(vllm::non_torch_bytes(4), at(&|tp| tp == 4, non_torch)));
    assert!(close(vllm::CUDA_GRAPH_BYTES, at(&|_| true, graphs)));
    let init_tp1 = at(&|tp| tp == 1, init);
    let init_tp = at(&|tp| tp > 1, init);
    assert!(close(vllm::DISTRIBUTED_INIT_BYTES, init_tp - init_tp1));
    // The H100 profile's CUDA context is the TP-1 figure itself.
    let h100 = hw("h100-80gb").devices[0].clone();
    assert!((gib(h100.context_reserve_bytes) - init_tp1).abs() < 0.005);
}
