//! vLLM's reservations beyond weights, activations and the KV cache
//! (`sim/src/engines/vllm_extras.rs`) against closed forms worked out here from vLLM 0.19's
//! source: the CUDA-graph capture list (`VllmConfig._set_cudagraph_sizes`), the LoRA slots
//! (`create_lora_weights` of vLLM's LoRA layers: `lora_a_stacked` `N × 1 × R × in`,
//! `lora_b_stacked` `N × 1 × out × R` per output slice), the punica metadata
//! (`PunicaWrapperBase`, `PunicaWrapperGPU`'s `LoRAKernelMeta`), `--kv-cache-memory-bytes` and
//! `--max-model-len auto`, and the flags that set them.

use vramplan_profiles::hardware::{self, Device};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_sim::engines::vllm::{self, VllmBudget};
use vramplan_sim::engines::vllm_extras::{self, capture_sizes};
use vramplan_sim::input::WorkloadFlags;
use vramplan_sim::workload::{Engine, Speculative, VllmOptions, Workload};

// Llama-3.1-8B (meta-llama config.json): hidden 4096, 32 query heads and 8 KV heads of 128,
// intermediate 14336, 32 layers, 131072 positions.
const H: u64 = 4096;
const KV: u64 = 8 * 128;
const I: u64 = 14336;
const LAYERS: u64 = 32;
/// KV bytes of one token in bf16: 32 layers × K and V × 8 heads × 128 × 2 B.
const KV_PER_TOKEN: u64 = LAYERS * 2 * KV * 2;

fn h100() -> Device {
    hardware::load("h100-80gb").expect("a hardware profile").devices[0].clone()
}

fn llama() -> ModelDescription {
    model::load("llama-3.1-8b-instruct", ImportOptions::default()).expect("a built-in model")
}

fn serve(options: VllmOptions) -> Workload {
    Workload {
        seq: 8192,
        engine: Engine::Vllm { gpu_memory_utilization: 0.9, max_num_batched_tokens: 8192 },
        vllm: options,
        ..Workload::default()
    }
}

fn budget(options: VllmOptions, tp: u32) -> VllmBudget {
    vllm::budget(&llama(), &h100(), &serve(options), tp).expect("a vLLM budget")
}

#[test]
fn capture_sizes_follow_vllms_default_list() {
    // `[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`, max = min(2 × max_num_seqs, 512).
    let full = capture_sizes(1024, 1, 8192, false);
    assert_eq!(full.len(), 3 + 31 + 17, "51 sizes up to 512");
    assert_eq!((full[0], full[3], full[33], full[34], *full.last().unwrap()), (1, 8, 248, 256, 512));
    assert_eq!(capture_sizes(8, 1, 8192, false), [1, 2, 4, 8, 16]);
    assert_eq!(capture_sizes(256, 1, 8192, false).len(), 51);
    assert_eq!(capture_sizes(100, 1, 8192, false).last(), Some(&200));
    // Capped at max_num_batched_tokens.
    assert_eq!(capture_sizes(1024, 1, 8, false), [1, 2, 4, 8]);
    assert!(capture_sizes(1024, 1, 8192, true).is_empty(), "--enforce-eager captures none");
    // Speculative decoding: max = min(max_num_seqs × (1 + k) × 2, 512).
    assert_eq!(capture_sizes(8, 4, 8192, false).last(), Some(&64));
}

#[test]
fn enforce_eager_frees_the_graphs_outside_the_utilization() {
    let graphs = budget(VllmOptions::default(), 1);
    assert_eq!((graphs.cuda_graph_sizes, graphs.cuda_graph_bytes), (51, vllm::CUDA_GRAPH_BYTES));
    let eager = budget(VllmOptions { enforce_eager: true, ..VllmOptions::default() }, 1);
    assert_eq!((eager.cuda_graph_sizes, eager.cuda_graph_bytes), (0, 0));
    // vLLM 0.19 does not subtract the graphs from the KV cache: the same tokens either way.
    assert_eq!(eager.kv_capacity_tokens, graphs.kv_capacity_tokens);
    // A utilization whose remainder holds the CUDA context but not the graphs beside it.
    let device = h100();
    let total = device.memory_bytes - device.driver_reserve_bytes;
    let left = device.context_reserve_bytes + vllm::CUDA_GRAPH_BYTES / 2;
    let utilization = 1.0 - left as f64 / total as f64;
    let at = |enforce_eager| {
        let w = Workload {
            engine: Engine::Vllm { gpu_memory_utilization: utilization, max_num_batched_tokens: 8192 },
            ..serve(VllmOptions { enforce_eager, ..VllmOptions::default() })
        };
        vllm::budget(&llama(), &device, &w, 1).expect("budget").fits
    };
    assert!(!at(false), "the graphs do not fit in the remainder");
    assert!(at(true), "without graphs the remainder holds the context");
}

#[test]
fn lora_slots_are_n_times_r_times_in_plus_out_of_every_decoder_linear() {
    let plain = budget(VllmOptions::default(), 1);
    let lora = VllmOptions { max_loras: 4, max_lora_rank: 16, ..VllmOptions::default() };
    let served = budget(lora.clone(), 1);
    // Per layer, Σ(in + out) over the output slices: q, k, v (in 4096 each; out 4096, 1024,
    // 1024), o (4096 + 4096), gate and up (4096 + 14336 each), down (14336 + 4096).
    let per_layer = (H + H) + 2 * (H + KV) + (H + H) + 2 * (H + I) + (I + H);
    let slots = 4 * 16 * LAYERS * per_layer * 2;
    assert_eq!(slots, 335_544_320, "320 MiB for 4 slots of rank 16 in bf16");
    // Punica: 5 × 8192 int64 token indices, 3 × 1024 int64 per-sequence rows (H100: 1024
    // sequences), two LoRAKernelMeta (8192 and 1024 rows: 2 int32 each, 3 × 5 + 1 counts).
    let punica = 5 * 8192 * 8 + 3 * 1024 * 8 + (2 * 8192 + 16) * 4 + (2 * 1024 + 16) * 4;
    assert_eq!(vllm_extras::punica_metadata_bytes(8192, 1024, 4), punica);
    assert_eq!(served.lora_bytes, slots + punica);
    assert_eq!(served.weights_bytes - plain.weights_bytes, slots + punica);
    // The KV cache loses the slots and the shrink kernel's fp32 buffer where it sets the peak.
    let lost = plain.kv_cache_bytes - served.kv_cache_bytes;
    assert!(lost >= slots + punica, "{lost}");
    assert!(lost <= slots + punica + 3 * 8192 * 16 * 4, "{lost}");
    assert!(served.kv_capacity_tokens < plain.kv_capacity_tokens);

    // Two ranks: column-parallel slices keep lora_a whole and halve lora_b, row-parallel ones
    // halve lora_a and keep lora_b.
    let tp2 = budget(lora, 2);
    let tp2_plain = budget(VllmOptions::default(), 2);
    let per_layer_tp2 = (H + H / 2) + 2 * (H + KV / 2) + (H / 2 + H) + 2 * (H + I / 2) + (I / 2 + H);
    assert_eq!(tp2.weights_bytes - tp2_plain.weights_bytes, 4 * 16 * LAYERS * per_layer_tp2 * 2 + punica);
}

#[test]
fn lora_rank_defaults_and_refusals() {
    let default_rank = budget(VllmOptions { max_loras: 1, ..VllmOptions::default() }, 1);
    let rank16 = budget(VllmOptions { max_loras: 1, max_lora_rank: 16, ..VllmOptions::default() }, 1);
    assert_eq!(default_rank.lora_bytes, rank16.lora_bytes, "vLLM's default rank is 16");
    let err = vllm::budget(
        &llama(),
        &h100(),
        &serve(VllmOptions { max_loras: 1, max_lora_rank: 24, ..VllmOptions::default() }),
        1,
    )
    .expect_err("24 is not a rank vLLM accepts");
    assert!(err.to_string().contains("--max-lora-rank"), "{err}");
}

#[test]
fn kv_cache_memory_bytes_replaces_the_profiled_cache() {
    let given = 8u64 << 30;
    let b = budget(VllmOptions { kv_cache_memory_bytes: Some(given), ..VllmOptions::default() }, 1);
    assert!(b.kv_cache_given);
    assert_eq!(b.kv_cache_bytes, given);
    assert_eq!(b.kv_bytes_per_token, KV_PER_TOKEN);
    assert_eq!(b.kv_capacity_tokens, given / (16 * KV_PER_TOKEN) * 16, "65536 tokens");
    assert!(b.fits);
    // More than the device holds beside the weights does not fit.
    let b = budget(VllmOptions { kv_cache_memory_bytes: Some(80u64 << 30), ..VllmOptions::default() }, 1);
    assert!(!b.fits);
}

#[test]
fn max_model_len_auto_is_the_longest_request_the_cache_holds() {
    let small = 2u64 << 30;
    let auto = VllmOptions {
        kv_cache_memory_bytes: Some(small),
        max_model_len_auto: true,
        ..VllmOptions::default()
    };
    let b = budget(auto.clone(), 1);
    // 2 GiB / (16 × 128 KiB) = 1024 blocks: 16384 tokens, under the 131072 positions.
    assert_eq!(b.max_model_len, 16_384);
    assert!(b.fits, "auto shortens the context to what fits");
    let fixed = budget(VllmOptions { max_model_len_auto: false, ..auto.clone() }, 1);
    assert_eq!(fixed.max_model_len, 8192);
    let long = vllm::budget(&llama(), &h100(), &Workload { seq: 32_768, ..serve(fixed_options(small)) }, 1)
        .expect("budget");
    assert!(!long.fits, "32768 tokens do not fit in 2 GiB of KV cache");
    // A large cache: capped at the model's 131072 positions.
    let b = budget(VllmOptions { max_model_len_auto: true, ..VllmOptions::default() }, 1);
    assert_eq!(b.max_model_len, b.kv_capacity_tokens.min(131_072));
}

fn fixed_options(kv: u64) -> VllmOptions {
    VllmOptions { kv_cache_memory_bytes: Some(kv), ..VllmOptions::default() }
}

#[test]
fn flags_set_the_options_under_vllm_only() {
    let flags = WorkloadFlags {
        engine: Some("vllm".into()),
        enforce_eager: true,
        max_loras: Some(4),
        max_lora_rank: Some(64),
        kv_cache_memory_bytes: Some("8G".into()),
        max_model_len: Some("auto".into()),
        ..WorkloadFlags::default()
    };
    let w = flags.apply(Workload::default()).expect("flags");
    assert_eq!(
        w.vllm,
        VllmOptions {
            enforce_eager: true,
            max_loras: 4,
            max_lora_rank: 64,
            kv_cache_memory_bytes: Some(8 << 30),
            max_model_len_auto: true,
            speculative: None,
            data_parallel_size: None,
            enable_expert_parallel: false,
        }
    );
    // vLLM's human_readable_int: lowercase decimal, uppercase binary.
    let w = WorkloadFlags {
        engine: Some("vllm".into()),
        enable_lora: true,
        kv_cache_memory_bytes: Some("8g".into()),
        max_model_len: Some("32K".into()),
        ..WorkloadFlags::default()
    }
    .apply(Workload::default())
    .expect("flags");
    assert_eq!((w.vllm.max_loras, w.vllm.kv_cache_memory_bytes, w.seq), (1, Some(8_000_000_000), 32_768));
    let err = WorkloadFlags { enforce_eager: true, ..WorkloadFlags::default() }
        .apply(Workload::default())
        .expect_err("not vLLM");
    assert!(err.to_string().contains("--enforce-eager"), "{err}");
    let err = WorkloadFlags {
        engine: Some("vllm".into()),
        kv_cache_memory_bytes: Some("lots".into()),
        ..WorkloadFlags::default()
    }
    .apply(Workload::default())
    .expect_err("not a count");
    assert!(err.to_string().contains("--kv-cache-memory-bytes"), "{err}");
}

/// The published vLLM 0.19 capture log (`fixtures/published/vllm-extras/cuda_graphs.csv`).
#[test]
fn capture_list_and_graph_memory_against_a_published_vllm_019_log() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/published/vllm-extras/cuda_graphs.csv");
    let text = std::fs::read_to_string(path).expect("the fixture");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let column = |row: &[&str], name: &str| -> String {
        let at = header.iter().position(|h| *h == name).expect("a column");
        row[at].to_string()
    };
    let mut rows = 0;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let row: Vec<&str> = line.split(',').collect();
        let num = |name: &str| column(&row, name).parse::<u64>().expect("a number");
        let logged: Vec<u64> =
            column(&row, "cudagraph_capture_sizes").split(' ').map(|s| s.parse().expect("a size")).collect();
        let ours = capture_sizes(num("max_num_seqs"), 1, num("max_num_batched_tokens"), false);
        assert_eq!(ours, logged, "{}", column(&row, "id"));
        assert_eq!(ours.last().copied(), Some(num("max_cudagraph_capture_size")));
        // The H100's defaults give the same max_num_seqs as the log.
        let b = budget(VllmOptions::default(), 1);
        assert_eq!(b.max_num_seqs, num("max_num_seqs"));
        assert_eq!(b.cuda_graph_sizes, logged.len() as u64);
        let gib = column(&row, "graph_gib").parse::<f64>().expect("GiB");
        let ours_gib = b.cuda_graph_bytes as f64 / (1u64 << 30) as f64;
        let err = (ours_gib - gib) / gib * 100.0;
        println!(
            "{}: CUDA graphs {ours_gib:.2} GiB (measured constant) / {gib:.2} GiB logged ({err:+.1} %)",
            column(&row, "id")
        );
        assert!(err.abs() < 20.0, "{err:+.1} %");
        rows += 1;
    }
    assert!(rows > 0);
}

fn speculative(method: &str, tokens: u64, model: Option<&str>) -> VllmOptions {
    let spec =
        Speculative { method: method.into(), num_speculative_tokens: tokens, model: model.map(String::from) };
    VllmOptions { speculative: Some(spec), ..VllmOptions::default() }
}

#[test]
fn a_draft_model_adds_its_weights_and_kv_to_the_budget() {
    let plain = budget(VllmOptions::default(), 1);
    let drafted = budget(speculative("draft_model", 5, Some("llama-3.2-1b")), 1);
    // Llama-3.2-1B (meta-llama config.json): 16 layers of 2048 wide, 32 heads and 8 KV heads of
    // 64, intermediate 8192, 128256 tokens tied; in bf16, with its cos_sin_cache (131072 × 64).
    let per_layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048;
    let params: u64 = 16 * per_layer + 128_256 * 2048 + 2048;
    assert_eq!(params, 1_235_814_400, "Llama-3.2-1B's published 1.24B");
    let draft_weights = params * 2 + 131_072 * 64 * 2;
    assert_eq!(drafted.weights_bytes - plain.weights_bytes, draft_weights);
    // Its KV: 16 layers × K and V × 8 heads × 64 × 2 B beside the target's 128 KiB.
    let draft_kv = 16 * 2 * 8 * 64 * 2;
    assert_eq!(drafted.kv_bytes_per_token, KV_PER_TOKEN + draft_kv);
    assert_eq!(drafted.kv_capacity_tokens, drafted.kv_cache_bytes / (16 * (KV_PER_TOKEN + draft_kv)) * 16);
    assert_eq!(plain.kv_cache_bytes - drafted.kv_cache_bytes, draft_weights, "same activation peak");
    let err =
        vllm::budget(&llama(), &h100(), &serve(speculative("draft_model", 5, Some("no-such-model"))), 1)
            .expect_err("an unknown draft");
    assert!(err.to_string().contains("--speculative-config"), "{err}");
}

#[test]
fn eagle_heads_are_one_decoder_layer_of_the_models_shapes() {
    let plain = budget(VllmOptions::default(), 1);
    // One Llama-3.1-8B decoder layer: q and o 4096², k and v 1024 × 4096, gate/up/down
    // 14336 × 4096, two norms; bf16.
    let layer = (2 * H * H + 2 * KV * H + 3 * I * H + 2 * H) * 2;
    let eagle = budget(speculative("eagle", 3, None), 1);
    assert_eq!(eagle.weights_bytes - plain.weights_bytes, layer + 2 * H * H * 2, "layer + fc (2H → H)");
    assert_eq!(eagle.kv_bytes_per_token, KV_PER_TOKEN + 2 * KV * 2, "one more layer of KV");
    // EAGLE-3: q/k/v read 2H, fc 3H → H, its own LM head (128256 padded to 64: 128256 rows).
    let eagle3 = budget(speculative("eagle3", 3, None), 1);
    let extra = H * (H + 2 * KV) + 3 * H * H + 128_256 * H;
    assert_eq!(eagle3.weights_bytes - plain.weights_bytes, layer + extra * 2);
    let ngram = budget(speculative("ngram", 3, None), 1);
    assert_eq!(
        (ngram.weights_bytes, ngram.kv_bytes_per_token),
        (plain.weights_bytes, plain.kv_bytes_per_token)
    );
    let mtp =
        vllm::budget(&llama(), &h100(), &serve(speculative("mtp", 1, None)), 1).expect_err("no MTP layers");
    assert!(mtp.to_string().contains("multi-token-prediction"), "{mtp}");
}

#[test]
fn mtp_adds_the_checkpoints_prediction_layer() {
    let v3 = model::load("deepseek-v3", ImportOptions::default()).expect("a built-in model");
    let device = hardware::load("h200").expect("a hardware profile").devices[0].clone();
    let run = |options: VllmOptions| {
        let w = Workload { seq: 4096, vllm: options, ..serve(VllmOptions::default()) };
        vllm::budget(&v3, &device, &w, 8).expect("budget")
    };
    let plain = run(VllmOptions::default());
    let mtp = run(speculative("mtp", 1, None));
    // num_nextn_predict_layers 1: one MLA layer of KV, (512 + 64) × 2 B a token.
    assert_eq!(mtp.kv_bytes_per_token - plain.kv_bytes_per_token, (512 + 64) * 2);
    // Its weights: a copy of the last decoder layer (an MoE layer, fp8 as the checkpoint holds
    // it) with eh_proj (2 × 7168²) and three norms in bf16: more than eh_proj alone, less than
    // a 61st of the model.
    let added = mtp.weights_bytes - plain.weights_bytes;
    let eh_proj = 2 * 7168 * 7168 * 2 + 3 * 7168 * 2;
    assert!(added > eh_proj && added < plain.weights_bytes / 50, "{added}");
}
