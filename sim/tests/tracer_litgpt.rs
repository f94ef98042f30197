//! The simulator under `--trainer litgpt` against the reference tracer of LitGPT's own
//! fine-tuning step: `scripts/reference/trace_litgpt.py` builds LitGPT 0.5.13's `GPT` (its fused
//! `qkv`, `GptNeoxMLP` / `LLaMAMLP`, untied `lm_head`) for Pythia-1B, Phi-2 and Llama-3.2-1B and
//! runs `litgpt/finetune/full.py`'s and `lora.py`'s step (bf16-true, the head in 128-token chunks,
//! `chunked_cross_entropy`, backward, foreach AdamW or, under `bnb.nf4`, PagedAdamW; two steps)
//! under PyTorch's FakeTensorMode, each storage followed by PyTorch's MemTracker; the versions
//! (torch, bitsandbytes, litgpt, lightning) are in `fixtures/reference/trace/litgpt-v5.json`.
//!
//! Each configuration is estimated as a user describes the run to vramplan (`--trainer litgpt`,
//! `--dtype bf16`, LoRA at LitGPT's defaults on the query and value projections, `--quant nf4`
//! without double quantization and `--optimizer paged-adamw` for `--quantize bnb.nf4`) and its
//! peak of live tensor bytes compared with the tracer's (less the cuBLAS workspace the CPU never
//! makes, as in `tracer.rs`). Nothing else is adjusted. The CPU's flash attention writes its
//! output head-major, so a full fine-tune's output projection keeps a copy of it (`reshape` of
//! the transposed output) that CUDA's sequence-major kernels do not make: the traced full
//! fine-tunes whose peak falls in backward carry it (TinyLlama at 4 × 512: 185 MB, 1.7 %).
//! The three TinyLlama rows (the config hub's shapes and LoRA on every linear) were traced
//! after the model was set beside the first nine; the full one then showed LitGPT's fp32
//! normalised value in `RMSNorm`, modelled after it.

mod support;

use serde_json::Value;
use support::{compare, gib};
use vramplan_profiles::DType;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::workload::{Finetune, Mode, Optimizer, Quant, Trainer, Workload};

/// transformers' names of the projections LitGPT's LoRA wraps by default (`lora_query`,
/// `lora_value` in its fused `qkv`): GPT-NeoX fuses them too (`query_key_value`), the others
/// keep q and v apart; the adapters' sizes agree (LitGPT's `lora_A` is `[2r, in]` and its
/// `lora_B` `[q + v, r]`, PEFT's on the fused projection `[r, in]` and `[3·in, r]`).
fn lora_targets(model: &str) -> Vec<String> {
    match model {
        "pythia-1b" => vec!["query_key_value".into()],
        _ => vec!["q_proj".into(), "v_proj".into()],
    }
}

/// The workload a LitGPT user describes for one traced configuration.
fn workload(r: &Value) -> Workload {
    let text = |k: &str| r[k].as_str().unwrap_or_else(|| panic!("{k} missing"));
    let number = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} missing"));
    let finetune = text("finetune");
    let mut w = Workload {
        mode: Mode::Train,
        batch: number("batch"),
        seq: number("seq"),
        weight_dtype: Some(DType::BF16),
        trainer: Trainer::Litgpt,
        ..Workload::default()
    };
    if finetune != "full" {
        // The config hub's files wrap every linear (`all-linear`; the head's adapter aside).
        let targets =
            if r["lora_targets"] == "all" { vec!["all-linear".into()] } else { lora_targets(text("model")) };
        w.finetune = Finetune::Lora { rank: number("lora_rank"), alpha: number("lora_alpha"), targets };
    }
    if finetune == "qlora" {
        w.quant = Quant::Nf4 { double_quant: false };
        w.optimizer = Optimizer::PagedAdamw;
    }
    w
}

#[test]
fn litgpt_estimates_follow_the_traced_step() {
    let path = format!("{}/../fixtures/reference/trace/litgpt-v5.json", env!("CARGO_MANIFEST_DIR"));
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON");
    let hardware = hardware::load("h100-80gb").expect("profile");
    println!("tracer: {}", fixture["versions"]);
    println!("{:<36} {:>10} {:>10} {:>8}  tracer's peak at", "configuration", "tracer", "estimate", "error");
    let mut errors = Vec::new();
    for r in fixture["records"].as_array().expect("records") {
        let name =
            format!("{} {} {}x{}", r["model"].as_str().unwrap_or("?"), r["finetune"], r["batch"], r["seq"]);
        let traced = r["peak_bytes"].as_u64().unwrap_or_else(|| panic!("{name}: not traced: {}", r["error"]));
        let built =
            model::load(r["model"].as_str().expect("model"), ImportOptions::default()).expect("built-in");
        let c = compare(&built, &hardware, &workload(r), traced, &name);
        println!(
            "{:<36} {:>10.3} {:>10.3} {:>7.1}%  {} / ours: {}",
            name,
            gib(traced),
            gib(c.ours),
            100.0 * c.error,
            r["peak_where"],
            c.peak_at
        );
        errors.push((name, r["finetune"].as_str().unwrap_or("").to_string(), c.error));
    }
    let within: Vec<&(String, String, f64)> = errors.iter().filter(|e| e.2.abs() <= 0.03).collect();
    println!("{} of {} configurations within 3%", within.len(), errors.len());
    for kind in ["full", "lora", "qlora"] {
        assert!(within.iter().any(|e| e.1 == kind), "no {kind} configuration within 3%: {errors:?}");
    }
    assert!(within.len() >= 4, "fewer than 4 configurations within 3%: {errors:?}");
    // The rest within 5% (Llama-3.2-1B's QLoRA step is 4.6% low: docs/memory-model.md "LitGPT").
    assert!(errors.iter().all(|e| e.2.abs() <= 0.05), "a configuration off by more than 5%: {errors:?}");
}
