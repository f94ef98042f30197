//! The simulator against published closed forms, where their assumptions hold.

use vramplan_profiles::model::{self, ImportOptions, ModelDescription, hf};
use vramplan_profiles::{DType, hardware};
use vramplan_sim::workload::{AttentionImpl, GradCheckpointing, Mode, Parallelism, Workload};
use vramplan_sim::{Placement, estimate, model_states, saved_activation_bytes};

fn builtin(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("built-in")
}

/// ZeRO (Rajbhandari et al. 2020, §3.1 and Figure 1): mixed-precision Adam holds 2Ψ fp16
/// weights, 2Ψ fp16 gradients and KΨ = 12Ψ of fp32 master weights and moments; stage 1
/// partitions the 12Ψ over Nd ranks, stage 2 also the gradients, stage 3 also the weights.
#[test]
fn zero_model_states_are_16_bytes_per_parameter_partitioned_by_stage() {
    let model = builtin("llama-2-7b");
    let psi = model.params() as f64;
    let ranks = 64u64;
    let nd = ranks as f64;
    let expected = [16.0 * psi, 4.0 * psi + 12.0 * psi / nd, 2.0 * psi + 14.0 * psi / nd, 16.0 * psi / nd];
    for (stage, expected) in expected.into_iter().enumerate() {
        let workload = Workload {
            mode: Mode::Train,
            weight_dtype: Some(DType::F16),
            parallelism: Parallelism::Zero {
                stage: stage as u8,
                offload_optimizer: false,
                offload_params: false,
            },
            ..Workload::default()
        };
        let states = model_states(&model, &workload, ranks).total() as f64;
        // Buffers (rotary frequencies) and per-unit rounding are the only differences.
        assert!((states - expected).abs() / expected < 1e-4, "stage {stage}: {states} vs {expected}");
    }
}

/// A GPT-2 block of the paper's shape, in fp16, training with dropout and eager attention.
/// A GPT-2 layer as Korthikanti et al. count it: its GeLU one kernel that keeps its input
/// (`gelu`; GPT-2's default `gelu_new` is composed in Python and keeps four tensors).
fn gpt_block(hidden: u64, heads: u64) -> ModelDescription {
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"], "n_embd": hidden, "n_head": heads, "n_layer": 2,
        "n_positions": 4096, "vocab_size": 50257, "torch_dtype": "float16",
        "activation_function": "gelu"
    });
    hf::from_config_text(&config.to_string(), "gpt-block", ImportOptions::default()).expect("config")
}

/// Korthikanti et al. 2022 (arXiv:2205.05198) §4.1, equation (1): a transformer layer keeps
/// s·b·h·(34 + 5·a·s/h) bytes with 16-bit activations and 1-byte dropout masks; with selective
/// recomputation (§4.2) the attention scores go and 34·s·b·h remain.
#[test]
fn activations_per_layer_follow_korthikanti() {
    for (hidden, heads, seq, batch) in [(1024u64, 16u64, 512u64, 4u64), (2048, 32, 1024, 2)] {
        let model = gpt_block(hidden, heads);
        let mut workload = Workload {
            mode: Mode::Train,
            batch,
            seq,
            attention: AttentionImpl::Eager,
            ..Workload::default()
        };
        let (s, b, h, a) = (seq, batch, hidden, heads);
        assert_eq!(saved_activation_bytes(&model, &workload, 0), s * b * h * 34 + 5 * a * s * s * b);
        workload.grad_checkpointing = GradCheckpointing::Selective;
        assert_eq!(saved_activation_bytes(&model, &workload, 0), 34 * s * b * h);
    }
}

/// KV cache: 2 · layers · kv_heads · head_dim · seq · batch · bytes (the measurements README,
/// after the HF optimisation guide and Kwon et al. 2023 §3).
#[test]
fn kv_cache_follows_the_formula() {
    let model = builtin("llama-3-8b");
    let hw = hardware::load("a100-80gb").expect("profile");
    for (seq, batch, dtype, bytes) in [(4096u64, 2u64, DType::BF16, 2u64), (8192, 1, DType::F8E4M3, 1)] {
        let workload =
            Workload { batch, seq, prompt: Some(16), kv_dtype: Some(dtype), ..Workload::default() };
        let e = estimate(&model, &hw, &workload, &Placement::single(0)).expect("estimate");
        assert_eq!(e.devices[0].components.kv_cache, 2 * 32 * 8 * 128 * seq * batch * bytes);
    }
}
