//! The scenarios users reported (see the anchors in the design brief), each simulated with its breakdown
//! printed, and checked against figures known independently: closed-form weight sizes, and
//! whether the setup is known to run.

use vramplan_profiles::model::{self, ImportOptions, ModelDescription};
use vramplan_profiles::{DType, hardware};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Workload};
use vramplan_sim::{Estimate, Placement, estimate};

const GIB: f64 = (1u64 << 30) as f64;

fn builtin(name: &str) -> ModelDescription {
    model::load(name, ImportOptions::default()).expect("built-in")
}

fn print(title: &str, e: &Estimate) {
    println!("{title}");
    for d in &e.devices {
        let c = d.components;
        println!(
            "  GPU {} {}: weights {:.2} grads {:.2} optimizer {:.2} activations {:.2} kv {:.2} logits {:.2} \
             overhead {:.2} | allocated {:.2} reserved {:.2} nvidia-smi {:.2} of usable {:.2} GiB, peak at {}",
            d.id,
            d.name,
            c.weights as f64 / GIB,
            c.gradients as f64 / GIB,
            c.optimizer as f64 / GIB,
            c.activations as f64 / GIB,
            c.kv_cache as f64 / GIB,
            c.logits as f64 / GIB,
            c.overhead as f64 / GIB,
            d.peak_allocated_bytes as f64 / GIB,
            d.peak_reserved_bytes as f64 / GIB,
            d.device_used_bytes as f64 / GIB,
            d.usable_bytes as f64 / GIB,
            d.peak_at
        );
    }
}

fn lora(rank: u64, targets: &[&str]) -> Finetune {
    Finetune::Lora { rank, alpha: 2 * rank, targets: targets.iter().map(|t| t.to_string()).collect() }
}

/// Pythia-2.8B, LoRA in fp16, batch 2 × 2048, gradient checkpointing, on Kaggle's two T4s split
/// layer by layer: the fp16 weights are 2 bytes per parameter (Pythia card: 2,775,208,960), half
/// on each GPU, and the run fits.
#[test]
fn pythia_lora_on_two_t4() {
    let model = builtin("pythia-2.8b");
    let hw = hardware::load("t4x2").expect("profile");
    let workload = Workload {
        mode: Mode::Train,
        batch: 2,
        seq: 2048,
        weight_dtype: Some(DType::F16),
        grad_checkpointing: GradCheckpointing::Full,
        finetune: lora(8, &["query_key_value"]),
        ..Workload::default()
    };
    let e = estimate(&model, &hw, &workload, &Placement::even_layers(&model, 2)).expect("estimate");
    print("Pythia-2.8B LoRA fp16, batch 2 × 2048, checkpointing, t4x2", &e);
    // Adapters: rank 8 on query_key_value (2560 → 7680) in each of 32 layers, fp32.
    let adapters = 32 * 8 * (2560 + 7680) * 4;
    let weights: u64 = e.devices.iter().map(|d| d.components.weights).sum();
    let fp16 = 2 * 2_775_208_960u64 + adapters;
    assert!(weights >= fp16 && (weights - fp16) as f64 / (fp16 as f64) < 0.01, "{weights} vs {fp16}");
    assert_eq!(e.devices.len(), 2);
    assert!(e.fits);
}

/// The Mixtral-8x7B 4-bit inference workload on two T4s (accelerate #3041).
fn mixtral_nf4_workload() -> Workload {
    Workload {
        batch: 1,
        seq: 4096,
        prompt: Some(1024),
        weight_dtype: Some(DType::F16),
        quant: Quant::Nf4 { double_quant: true },
        ..Workload::default()
    }
}

/// Mixtral-8x7B in 4-bit (nf4, double quantization) for inference on two 16 GB GPUs, as the
/// report's user ran it (transformers 4.x, whose experts are `nn.Linear`s bitsandbytes
/// quantizes): its linear weights at ~0.52 bytes per parameter total ~22.6 GiB — more than one
/// T4, less than two.
#[test]
fn mixtral_nf4_inference_on_two_t4() {
    let model = model::load("mixtral-8x7b", ImportOptions { naming: model::Naming::V4 }).expect("built-in");
    let hw = hardware::load("t4x2").expect("profile");
    let e =
        estimate(&model, &hw, &mixtral_nf4_workload(), &Placement::even_layers(&model, 2)).expect("estimate");
    print("Mixtral-8x7B nf4 inference, 4096 context, t4x2 (transformers 4.x)", &e);
    // Closed form: 46,702,792,704 parameters, of which the embedding and head (2 × 32000 × 4096)
    // stay fp16 and the rest (linear and expert weights; norms are negligible) take 4 bits plus
    // an 8-bit absmax per 64 values and an fp32 scale per 256 blocks.
    let halves = 2 * 32000 * 4096u64;
    let quantized = 46_702_792_704u64 - halves;
    let expected = 2.0 * halves as f64 + quantized as f64 * (0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0));
    let weights: u64 = e.devices.iter().map(|d| d.components.weights).sum();
    assert!((weights as f64 - expected).abs() / expected < 0.01, "{weights} vs {expected}");
    assert!(expected / GIB > 15.0, "more than one T4 holds");
    assert!(e.fits, "fits on two T4s");
}

/// The same workload under transformers 5.x: each layer's experts are two fused 3-D
/// parameters, not `nn.Linear`s, so bitsandbytes leaves them in fp16: 32 layers × 8 experts ×
/// 3 × 4096 × 14336 parameters × 2 bytes = 90.2 GB, 2.82 GB a layer, far past two T4s.
#[test]
fn mixtral_nf4_under_transformers_5_keeps_its_experts_in_fp16() {
    let model = builtin("mixtral-8x7b");
    let hw = hardware::load("t4x2").expect("profile");
    let e =
        estimate(&model, &hw, &mixtral_nf4_workload(), &Placement::even_layers(&model, 2)).expect("estimate");
    print("Mixtral-8x7B nf4 inference, 4096 context, t4x2 (transformers 5.x)", &e);
    let experts = 32 * 8 * 3 * 4096 * 14336u64;
    let halves = 2 * 32000 * 4096u64;
    let quantized = 46_702_792_704u64 - halves - experts;
    let expected =
        2.0 * (halves + experts) as f64 + quantized as f64 * (0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0));
    let weights: u64 = e.devices.iter().map(|d| d.components.weights).sum();
    assert!((weights as f64 - expected).abs() / expected < 0.01, "{weights} vs {expected}");
    assert!(!e.fits, "90 GB of fp16 experts do not fit two T4s");
}

/// XLNet-base full fine-tune in fp32 with AdamW on a T4, batch 8 × 512: model states are 16
/// bytes per parameter (4 weight, 4 gradient, 8 Adam).
#[test]
fn xlnet_base_fine_tune_on_t4() {
    let model = builtin("xlnet-base-cased");
    let hw = hardware::load("t4").expect("profile");
    let workload = Workload {
        mode: Mode::Train,
        batch: 8,
        seq: 512,
        weight_dtype: Some(DType::F32),
        ..Workload::default()
    };
    let e = estimate(&model, &hw, &workload, &Placement::single(0)).expect("estimate");
    print("XLNet-base full fine-tune fp32, batch 8 × 512, t4", &e);
    let states = vramplan_sim::model_states(&model, &workload, 1);
    let params = model.params();
    assert_eq!(states.gradients, 4 * params);
    assert_eq!(states.optimizer, 8 * params);
}

/// Llama-3-8B QLoRA (nf4 + double quantization, rank 16 on the attention projections) on a
/// Colab T4, batch 1 × 1024, checkpointing: the recipe free-tier notebooks run.
#[test]
fn llama3_8b_qlora_on_t4() {
    let model = builtin("llama-3-8b");
    let hw = hardware::load("t4").expect("profile");
    let workload = Workload {
        mode: Mode::Train,
        batch: 1,
        seq: 1024,
        weight_dtype: Some(DType::F16),
        autocast: Some(DType::F16),
        quant: Quant::Nf4 { double_quant: true },
        grad_checkpointing: GradCheckpointing::Full,
        finetune: lora(16, &["q_proj", "k_proj", "v_proj", "o_proj"]),
        ..Workload::default()
    };
    let e = estimate(&model, &hw, &workload, &Placement::single(0)).expect("estimate");
    print("Llama-3-8B QLoRA, batch 1 × 1024, checkpointing, t4", &e);
    assert!(e.fits, "free-tier Colab runs this");
}
