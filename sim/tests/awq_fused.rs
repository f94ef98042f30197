//! AutoAWQ's fused modules (`--awq-fused`, `sim/src/model/awq_fused.rs`) against closed forms
//! worked by hand from Llama-2-13B's config (40 layers, hidden 5120, 40 heads of 128, no grouped
//! K/V heads) and AutoAWQ 0.1.6's code: the `WindowedCache` made at the fuse for the whole batch
//! and `max_seq_len`, the fused qkv held beside the unfused q, k, v until the last layer, and the
//! refusals of the switch where the fused runtime does not run.

use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_profiles::{DType, hardware};
use vramplan_sim::input::validate;
use vramplan_sim::workload::{Finetune, Mode, Quant, Workload};
use vramplan_sim::{Placement, estimate};

fn llama_2_13b() -> ModelDescription {
    model::load("llama-2-13b", ImportOptions::default()).expect("built-in model")
}

/// Llama-2-13B AWQ (4-bit, group 128) under AutoAWQ's fused runtime, a prompt of `prompt`
/// tokens of `batch` sequences, a fused cache of `max_seq_len`.
fn fused(batch: u64, prompt: u64, max_seq_len: u64) -> Workload {
    Workload {
        mode: Mode::Inference,
        batch,
        seq: prompt,
        prompt: Some(prompt),
        weight_dtype: Some(DType::F16),
        quant: Quant::Awq { bits: 4, group_size: 128 },
        awq_fused: Some(max_seq_len),
        ..Workload::default()
    }
}

// By hand, Llama-2-13B: K and V per layer, fp16, [batch, 40 kv heads, max_seq_len, 128].
const LAYERS: u64 = 40;
fn windowed_cache(batch: u64, max_seq_len: u64) -> u64 {
    LAYERS * 2 * (batch * 40 * max_seq_len * 128) * 2
}

// One layer's fused qkv, in 5120 → out 3 × 5120 = 15360 (`fuse_qkv`'s `torch.cat`): qweight
// int32 [5120, 15360 / 8], qzeros int32 [5120 / 128, 15360 / 8], scales fp16 [40, 15360].
const QKV: u64 = 5120 * 15360 / 8 * 4 + 40 * 15360 / 8 * 4 + 40 * 15360 * 2;

// One layer's RoPE table: complex64 [2 · max_seq_len, 128 / 2].
fn rope(max_seq_len: u64) -> u64 {
    8 * 2 * max_seq_len * 64
}

#[test]
fn the_windowed_cache_holds_the_batch_for_max_seq_len_from_the_load() {
    let model = llama_2_13b();
    let hw = hardware::load("rtx4090").expect("profile");
    // Batch 3 × 2048 (AutoAWQ's README row): the peak is a layer's prefill, the cache whole.
    let w = fused(3, 2048, 2048);
    validate(&w, &model, &hw).expect("a fused AWQ workload");
    let e = estimate(&model, &hw, &w, &Placement::single(0)).expect("estimate").devices.remove(0);
    assert_eq!(windowed_cache(3, 2048), 5_033_164_800);
    assert_eq!(e.components.kv_cache, windowed_cache(3, 2048), "peak at {}", e.peak_at);
    // A 64-token prompt into the same cache holds the same bytes: made for max_seq_len at load,
    // where transformers' grows with the context.
    let short = estimate(&model, &hw, &fused(3, 64, 2048), &Placement::single(0)).expect("estimate");
    let unfused = Workload { awq_fused: None, ..fused(3, 64, 2048) };
    let grown = estimate(&model, &hw, &unfused, &Placement::single(0)).expect("estimate");
    assert!(
        short.devices[0].peak_allocated_bytes
            >= grown.devices[0].peak_allocated_bytes + windowed_cache(3, 2048) - windowed_cache(3, 64)
    );
}

#[test]
fn the_fuse_holds_every_layers_qkv_twice_until_its_end() {
    let model = llama_2_13b();
    let hw = hardware::load("rtx4090").expect("profile");
    let w = fused(1, 64, 64);
    let e = estimate(&model, &hw, &w, &Placement::single(0)).expect("estimate").devices.remove(0);
    assert_eq!(e.peak_at, "load");
    let unfused = Workload { awq_fused: None, ..w.clone() };
    let plain = estimate(&model, &hw, &unfused, &Placement::single(0)).expect("estimate").devices.remove(0);
    // Weights as loaded (and the cuBLAS workspace, in both), plus at the fuse's last layer every
    // layer's fused qkv, the caches and RoPE tables; at most one layer's zero-filled qkv
    // buffers and one fp32 cache tensor on top (AutoAWQ's transients), and allocator rounding.
    let loaded = plain.components.weights;
    let floor = loaded + LAYERS * QKV + windowed_cache(1, 64) + (LAYERS - 1) * rope(64);
    let ceiling = floor + QKV + rope(64) + 2 * windowed_cache(1, 64) / (2 * LAYERS) + (40 << 20);
    assert!(
        (floor..=ceiling).contains(&e.peak_allocated_bytes),
        "peak {} outside [{floor}, {ceiling}]",
        e.peak_allocated_bytes
    );
    // 40 layers' qkv: 1.52 GiB, what the unfused estimate lacks.
    assert_eq!(LAYERS * QKV, 1_634_304_000);
}

#[test]
fn the_switch_is_refused_where_the_fused_runtime_does_not_run() {
    let model = llama_2_13b();
    let hw = hardware::load("rtx4090").expect("profile");
    let refused = |w: Workload| validate(&w, &model, &hw).expect_err("refused");
    let lora = Finetune::Lora { rank: 16, alpha: 8, targets: Vec::new() };
    let train = refused(Workload { mode: Mode::Train, finetune: lora, ..fused(1, 64, 64) });
    let gptq = refused(Workload { quant: Quant::Gptq { bits: 4, group_size: 128 }, ..fused(1, 64, 64) });
    let long = refused(fused(1, 4096, 2048));
    let kv = refused(Workload { kv_dtype: Some(DType::BF16), ..fused(1, 64, 64) });
    // A cache past the sequence's bound is refused before any figure could overflow.
    let huge = refused(fused(1, 64, u64::MAX));
    for e in [&train, &gptq, &long, &kv, &huge] {
        assert!(e.to_string().contains("--awq-fused"), "{e}");
    }
    assert!(long.to_string().contains("--awq-fused 4096"), "{long}");
}

#[test]
fn a_fused_cache_past_the_step_bound_is_refused_not_overflowed() {
    // A config at the documented bounds with a short run but a cache of 2²⁴ tokens: the cache,
    // not the run's context, makes the step past 2⁶⁰ bytes, so the scale check must count it
    // (it once saw only `--seq`, and the replay's byte sums overflowed).
    let config = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 1024,
        "num_attention_heads": 4096, "num_key_value_heads": 4096, "head_dim": 65536,
        "vocab_size": 32000, "max_position_embeddings": 16777216, "torch_dtype": "float16"}"#;
    let model =
        vramplan_profiles::model::hf::from_config_text(config, "config.json", ImportOptions::default())
            .expect("a config at the bounds");
    let hw = hardware::load("h100-80gb").expect("profile");
    let w = Workload { seq: 16, prompt: Some(16), ..fused(1, 16, 1 << 24) };
    let e = validate(&w, &model, &hw).expect_err("refused");
    assert!(e.to_string().contains("1 EiB"), "{e}");
}
