//! The simulator under `--trainer torchtune` against the reference tracer of torchtune's own
//! LoRA / QLoRA step: `scripts/reference/trace_torchtune.py` builds Llama-3.2-1B with torchtune's
//! builders (`lora_llama3_2_1b`, `qlora_llama3_2_1b`: torchao `NF4Tensor` weights) and runs
//! `recipes/lora_finetune_single_device.py`'s step (the loss, backward, fused AdamW, two steps)
//! under PyTorch's FakeTensorMode, each storage followed by PyTorch's MemTracker; the versions
//! (torch, torchtune, torchao) are in `fixtures/reference/trace/torchtune-v5.json`.
//!
//! Each configuration is estimated as a user would describe the run to vramplan and its peak of
//! live tensor bytes compared with the tracer's (less the cuBLAS workspace the CPU never makes,
//! as in `tracer.rs`). Nothing else is adjusted.

mod support;

use serde_json::Value;
use support::{compare, gib};
use vramplan_profiles::DType;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Trainer, Workload};

/// The workload a torchtune user describes for one traced configuration: bf16 weights (the
/// recipe's `dtype: bf16`), LoRA on q, v, output_proj and the MLP (torchtune's `output_proj` is
/// transformers' `o_proj`; `w1`, `w3`, `w2` are `gate_proj`, `up_proj`, `down_proj`), NF4 under
/// QLoRA, the recipe's loss.
fn workload(r: &Value) -> Workload {
    let text = |k: &str| r[k].as_str().unwrap_or_else(|| panic!("{k} missing"));
    let number = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} missing"));
    let mut w = Workload {
        mode: Mode::Train,
        batch: number("batch"),
        seq: number("seq"),
        weight_dtype: Some(DType::BF16),
        finetune: Finetune::Lora {
            rank: number("lora_rank"),
            alpha: number("lora_alpha"),
            targets: ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                .map(String::from)
                .to_vec(),
        },
        quant: if text("builder") == "qlora" { Quant::Nf4 { double_quant: true } } else { Quant::None },
        grad_checkpointing: if r["ac"].as_bool() == Some(true) {
            GradCheckpointing::Full
        } else {
            GradCheckpointing::Off
        },
        trainer: Trainer::Torchtune,
        ..Workload::default()
    };
    w.switches.chunked_cross_entropy = text("loss") == "chunked";
    w
}

#[test]
fn torchtune_estimates_follow_the_traced_recipe() {
    let path = format!("{}/../fixtures/reference/trace/torchtune-v5.json", env!("CARGO_MANIFEST_DIR"));
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    let hardware = hardware::load("h100-80gb").expect("profile");
    let llama = model::load("llama-3.2-1b", ImportOptions::default()).expect("built-in model");
    println!("tracer: {}", fixture["versions"]);
    println!("{:<20} {:>10} {:>10} {:>8}  tracer's peak at", "configuration", "tracer", "estimate", "error");
    let mut errors = Vec::new();
    for r in fixture["records"].as_array().expect("records") {
        let name = r["name"].as_str().expect("name");
        assert_eq!(r["model"], "llama-3.2-1b", "{name}: the test builds Llama-3.2-1B");
        let traced = r["peak_bytes"].as_u64().unwrap_or_else(|| panic!("{name}: not traced: {}", r["error"]));
        let c = compare(&llama, &hardware, &workload(r), traced, name);
        println!(
            "{:<20} {:>10.3} {:>10.3} {:>7.1}%  {} / ours: {}",
            name,
            gib(traced),
            gib(c.ours),
            100.0 * c.error,
            r["peak_where"],
            c.peak_at
        );
        errors.push((name.to_string(), c.error));
    }
    assert!(errors.len() >= 4, "at least 4 configurations traced");
    for (name, error) in &errors {
        assert!(error.abs() <= 0.03, "{name}: {:.1}% from the traced peak", 100.0 * error);
    }
}
