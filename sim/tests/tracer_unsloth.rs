//! Unsloth's training step against its trace (issue 33): `scripts/reference/trace_unsloth.py`
//! runs unsloth and unsloth_zoo 2026.10.9 (`FastLlamaModel`'s patched Llama, its LoRA kernels'
//! autograd functions, `use_gradient_checkpointing="unsloth"`, its fused linear cross-entropy)
//! on fake CUDA tensors under FakeTensorMode and records the peak of allocated bytes on the GPU in
//! `fixtures/reference/trace/unsloth-v5.json`. What stands in for the GPU (Triton launches that
//! do not run, an xformers stand-in keeping what its kernel keeps, an idle 80 GiB A100) is written
//! in the fixture (`stand_ins`).
//!
//! Each record is estimated as `--trainer unsloth` on an `a100-80gb` (QLoRA nf4 with double
//! quantization, LoRA of the given rank on every linear, offloaded checkpointing, AdamW, bf16),
//! packed rows as `--batch` rows of `--seq` tokens; the estimate's cuBLAS workspace, which the
//! tracer never makes, is left out (as `support::compare` does). Every record must be within 3 %.

use vramplan_profiles::DType;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::program::blas_workspaces;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Optimizer, Quant, Trainer, Workload};
use vramplan_sim::{Placement, estimate};

/// The gate per traced configuration.
const TOLERANCE: f64 = 0.03;

const ALL_LINEAR: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

fn fixture() -> serde_json::Value {
    let path = format!("{}/../fixtures/reference/trace/unsloth-v5.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn number(record: &serde_json::Value, key: &str) -> u64 {
    record[key].as_u64().unwrap_or_else(|| panic!("record without `{key}`: {record}"))
}

/// The traced configuration as a vramplan workload.
fn workload(record: &serde_json::Value) -> Workload {
    assert_eq!(record["finetune"], "qlora", "{record}");
    assert_eq!(record["ckpt"], "unsloth", "{record}");
    assert_eq!(record["lora_targets"], "all-linear", "{record}");
    let rank = number(record, "lora_rank");
    Workload {
        mode: Mode::Train,
        batch: number(record, "batch"),
        seq: number(record, "seq"),
        weight_dtype: Some(DType::parse(record["dtype"].as_str().expect("a dtype")).expect("a dtype")),
        trainer: Trainer::Unsloth,
        quant: Quant::Nf4 { double_quant: true },
        finetune: Finetune::Lora { rank, alpha: rank, targets: ALL_LINEAR.map(String::from).to_vec() },
        optimizer: Optimizer::Adamw,
        grad_checkpointing: GradCheckpointing::Full,
        ..Workload::default()
    }
}

fn label(record: &serde_json::Value) -> String {
    let packed = record["packed"].as_u64().map(|n| format!(" ({n} packed)")).unwrap_or_default();
    format!(
        "{} r{} {}x{}{packed}",
        record["model"].as_str().unwrap_or("?"),
        number(record, "lora_rank"),
        number(record, "batch"),
        number(record, "seq")
    )
}

#[test]
fn unsloth_estimates_follow_its_traced_step() {
    let fixture = fixture();
    let hw = hardware::load("a100-80gb").expect("profile");
    let major = hw.devices[0].compute_capability.major;
    println!("tracer: {}", fixture["versions"]);
    println!(
        "{:<36} {:>10} {:>10} {:>8}  tracer's peak at / ours",
        "configuration", "tracer", "estimate", "error"
    );
    let mut off = Vec::new();
    let mut compared = 0;
    for record in fixture["records"].as_array().expect("records") {
        assert!(
            record.get("error").is_none(),
            "{}: the tracer could not run it: {}",
            label(record),
            record["error"]
        );
        let model = model::load(record["model"].as_str().expect("a model"), ImportOptions::default())
            .expect("built-in model");
        let w = workload(record);
        let e = estimate(&model, &hw, &w, &Placement::single(0))
            .unwrap_or_else(|e| panic!("{}: {e}", label(record)));
        let device = &e.devices[0];
        let ours = device.peak_allocated_bytes - blas_workspaces(&model, major, &w).iter().sum::<u64>();
        let traced = number(record, "peak_bytes");
        let error = (ours as f64 - traced as f64) / traced as f64;
        println!(
            "{:<36} {:>10.3} {:>10.3} {:>7.2}%  {} / {}",
            label(record),
            traced as f64 / (1u64 << 30) as f64,
            ours as f64 / (1u64 << 30) as f64,
            100.0 * error,
            record["peak_where"],
            device.peak_at
        );
        if error.abs() > TOLERANCE {
            off.push(format!("{}: {:+.2}%", label(record), 100.0 * error));
        }
        compared += 1;
    }
    assert!(compared >= 4, "{compared} traced configurations");
    assert!(off.is_empty(), "off by more than 3%: {off:?}");
}
