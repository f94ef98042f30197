//! The simulator against the reference tracer of FSDP with QLoRA: every configuration that
//! `scripts/reference/trace_fsdp.py` ran (Answer.AI's fsdp_qlora set-up: torch's FSDP1 over a
//! fake process group of 2 ranks, PEFT LoRA over bitsandbytes 4-bit linears stored as bf16,
//! under FakeTensorMode, each storage followed by PyTorch's MemTracker; versions in
//! `fixtures/reference/trace/fsdp-v5.json`) is estimated as `--trainer fsdp-qlora --parallel
//! fsdp` on two H100s and rank 0's peak compared with the tracer's.
//!
//! As in `tracer.rs`, the estimate's cuBLAS workspace (which the CPU never makes) is left out of
//! the comparison; nothing else is adjusted. Host memory (offloaded shards, gradients and
//! optimizer states) is not the GPU's, in the trace or the estimate.

mod support;

use serde::Deserialize;
use support::gib;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::program::blas_workspaces;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Parallelism, Quant, Trainer, Workload};
use vramplan_sim::{Placement, estimate};

/// The tracer's file.
#[derive(Deserialize)]
struct Fixture {
    versions: serde_json::Value,
    records: Vec<Record>,
}

/// One traced configuration.
#[derive(Deserialize)]
struct Record {
    model: String,
    world_size: u64,
    batch: u64,
    seq: u64,
    ckpt: bool,
    offload_params: bool,
    lora_rank: u64,
    lora_alpha: u64,
    lora_targets: Vec<String>,
    #[serde(default)]
    peak_bytes: Option<u64>,
    #[serde(default)]
    peak_where: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<String>,
    /// Traced after the memory model was set beside the other rows, and not used to shape it.
    #[serde(default)]
    held_out: bool,
}

impl Record {
    fn label(&self) -> String {
        let ckpt = if self.ckpt { " ckpt" } else { "" };
        let offload = if self.offload_params { " offload" } else { "" };
        let held = if self.held_out { " (held out)" } else { "" };
        format!(
            "{} r{}{ckpt}{offload} {}x{} on {}{held}",
            self.model, self.lora_rank, self.batch, self.seq, self.world_size
        )
    }

    /// fsdp_qlora's run as vramplan flags would describe it: `--mode train --quant nf4
    /// --double-quant --lora-rank R --lora-alpha A --lora-targets … --grad-ckpt full --parallel
    /// fsdp [--offload-params] --trainer fsdp-qlora`.
    fn workload(&self) -> Workload {
        Workload {
            mode: Mode::Train,
            batch: self.batch,
            seq: self.seq,
            quant: Quant::Nf4 { double_quant: true },
            finetune: Finetune::Lora {
                rank: self.lora_rank,
                alpha: self.lora_alpha,
                targets: self.lora_targets.clone(),
            },
            grad_checkpointing: if self.ckpt { GradCheckpointing::Full } else { GradCheckpointing::Off },
            parallelism: Parallelism::Zero {
                stage: 3,
                offload_optimizer: false,
                offload_params: self.offload_params,
            },
            trainer: Trainer::FsdpQlora,
            ..Workload::default()
        }
    }
}

#[test]
fn fsdp_qlora_estimates_follow_the_traced_runtime() {
    let path = format!("{}/../fixtures/reference/trace/fsdp-v5.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fixture: Fixture = serde_json::from_str(&text).expect("the tracer's JSON");
    println!("tracer: {}", fixture.versions);
    println!(
        "{:<52} {:>10} {:>10} {:>8}  peak at (tracer / ours)",
        "configuration", "tracer", "estimate", "error"
    );
    let (mut errors, mut offloaded, mut batches) = (Vec::new(), 0, Vec::new());
    for r in &fixture.records {
        assert!(r.error.is_none(), "{}: not traced ({:?})", r.label(), r.error);
        let traced = r.peak_bytes.expect("a traced peak");
        let hw = hardware::load(&format!("{}xh100-80gb", r.world_size)).expect("profile");
        let model = model::load(&r.model, ImportOptions::default()).expect("built-in model");
        let workload = r.workload();
        let e = estimate(&model, &hw, &workload, &Placement::single(0)).expect("estimate");
        let major = hw.devices[0].compute_capability.major;
        let workspace: u64 = blas_workspaces(&model, major, &workload).iter().sum();
        let ours = e.devices[0].peak_allocated_bytes - workspace;
        let error = (ours as f64 - traced as f64) / traced as f64;
        let at = r.peak_where.as_ref().and_then(|w| w.get("op")).map(|op| op.to_string()).unwrap_or_default();
        println!(
            "{:<52} {:>10.3} {:>10.3} {:>7.1}%  {at} / {}",
            r.label(),
            gib(traced),
            gib(ours),
            100.0 * error,
            e.devices[0].peak_at
        );
        errors.push((r.label(), error));
        offloaded += usize::from(r.offload_params);
        batches.push(r.batch);
    }
    let off: Vec<String> = errors
        .iter()
        .filter(|(_, e)| e.abs() > 0.03)
        .map(|(label, e)| format!("{label}: {:+.1}%", 100.0 * e))
        .collect();
    let median = {
        let mut e: Vec<f64> = errors.iter().map(|(_, e)| e.abs()).collect();
        e.sort_by(f64::total_cmp);
        e[e.len() / 2]
    };
    println!("{} configurations, median |error| {:.1}%", errors.len(), 100.0 * median);
    assert!(errors.len() >= 4, "{} traced configurations", errors.len());
    assert!(offloaded >= 2 && offloaded < errors.len(), "with and without offload");
    assert!(batches.contains(&1) && batches.iter().any(|&b| b > 1), "batch 1 and larger");
    assert!(off.is_empty(), "off by more than 3%: {off:?}");
}
