//! The simulator under `--trainer torchtune` against the reference tracer of torchtune's own
//! LoRA / QLoRA step: `scripts/reference/trace_torchtune.py` builds Llama-3.2-1B with torchtune's
//! builders (`lora_llama3_2_1b`, `qlora_llama3_2_1b`: torchao `NF4Tensor` weights) and runs
//! `recipes/lora_finetune_single_device.py`'s step (the loss, backward, fused AdamW, two steps)
//! under PyTorch's FakeTensorMode, each storage followed by PyTorch's MemTracker; the versions
//! (torch, torchtune, torchao) are in `fixtures/reference/trace/torchtune-v5.json`.
//!
//! Two releases: torchtune 0.6.1 (torchao 0.10) on Llama-3.2-1B, and torchtune 0.1.1 (torchao 0.1,
//! `trainer_version: 0.1`) on Llama-2-7B, the QLoRA tutorial's recipe, whose peak can come while
//! the model is loaded (each NF4 weight quantized without chunks).
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
    let attention = r["lora_attn_modules"].as_array().expect("lora_attn_modules").iter().map(|m| {
        match m.as_str().expect("module name") {
            "output_proj" => "o_proj".to_string(),
            other => other.to_string(),
        }
    });
    let mlp = if r["apply_lora_to_mlp"].as_bool() == Some(true) {
        ["gate_proj", "up_proj", "down_proj"].map(String::from).to_vec()
    } else {
        Vec::new()
    };
    let mut w = Workload {
        mode: Mode::Train,
        batch: number("batch"),
        seq: number("seq"),
        weight_dtype: Some(DType::BF16),
        finetune: Finetune::Lora {
            rank: number("lora_rank"),
            alpha: number("lora_alpha"),
            targets: attention.chain(mlp).collect(),
        },
        quant: if text("builder") == "qlora" { Quant::Nf4 { double_quant: true } } else { Quant::None },
        grad_checkpointing: if r["ac"].as_bool() == Some(true) {
            GradCheckpointing::Full
        } else {
            GradCheckpointing::Off
        },
        trainer: Trainer::Torchtune,
        trainer_version: Some(r["versions"]["torchtune"].as_str().expect("torchtune's version").to_string()),
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

    println!(
        "{:<20} {:<18} {:>10} {:>10} {:>8}  tracer's peak at",
        "configuration", "torchtune/torchao", "tracer", "estimate", "error"
    );
    let mut errors = Vec::new();
    for r in fixture["records"].as_array().expect("records") {
        let name = r["name"].as_str().expect("name");
        let built = model::load(r["model"].as_str().expect("model"), ImportOptions::default())
            .expect("built-in model");
        let step = r["peak_bytes"].as_u64().unwrap_or_else(|| panic!("{name}: not traced: {}", r["error"]));
        // The estimate's peak covers loading the model too: the tracer's is the larger of the
        // step's and the build-and-load's.
        let traced = step.max(r["init_peak_bytes"].as_u64().expect("init_peak_bytes"));
        let c = compare(&built, &hardware, &workload(r), traced, name);
        println!(
            "{:<20} {:<18} {:>10.3} {:>10.3} {:>7.1}%  {} / ours: {}",
            name,
            format!(
                "{}/{}",
                r["versions"]["torchtune"].as_str().unwrap_or("?"),
                r["versions"]["torchao"].as_str().unwrap_or("?")
            ),
            gib(traced),
            gib(c.ours),
            100.0 * c.error,
            if traced == step { &r["peak_where"] } else { &r["init_peak_where"] },
            c.peak_at
        );
        errors.push((name.to_string(), c.error));
    }
    assert!(errors.len() >= 4, "at least 4 configurations traced");
    for (name, error) in &errors {
        assert!(error.abs() <= 0.03, "{name}: {:.1}% from the traced peak", 100.0 * error);
    }
}
