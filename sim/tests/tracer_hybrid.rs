//! The simulator against the reference tracer for the hybrid attention + state-space family
//! (Falcon-H1): the rows of `fixtures/reference/trace/v5.json` whose model is a built-in with
//! Mamba-2 mixers (`LayerFacts::ssm`), traced by `scripts/reference/trace.py` (transformers'
//! torch path of the mixer, as it runs without the `mamba_ssm` / `causal_conv1d` kernels; the
//! versions in the file). Each estimate's peak of allocated bytes, less the cuBLAS workspace
//! the CPU never makes (as `tracer.rs` compares), is held within 3 % of the traced peak.

use serde::Deserialize;
use vramplan_profiles::DType;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::program::cublas_workspace;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Optimizer, Workload};
use vramplan_sim::{Placement, estimate};

#[derive(Deserialize)]
struct Fixture {
    versions: serde_json::Value,
    records: Vec<Record>,
}

#[derive(Deserialize)]
struct Record {
    model: String,
    mode: String,
    finetune: String,
    ckpt: bool,
    batch: u64,
    seq: u64,
    dtype: String,
    #[serde(default)]
    lora_rank: Option<u64>,
    #[serde(default)]
    lora_targets: serde_json::Value,
    #[serde(default)]
    peak_bytes: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

impl Record {
    fn label(&self) -> String {
        let ckpt = if self.ckpt { " ckpt" } else { "" };
        format!("{} {} {}{ckpt} {}x{}", self.model, self.mode, self.finetune, self.batch, self.seq)
    }

    fn workload(&self) -> Workload {
        let mut w = Workload {
            mode: if self.mode == "train" { Mode::Train } else { Mode::Inference },
            batch: self.batch,
            seq: self.seq,
            weight_dtype: Some(DType::parse(&self.dtype).expect("a dtype")),
            optimizer: Optimizer::Adamw,
            grad_checkpointing: if self.ckpt { GradCheckpointing::Full } else { GradCheckpointing::Off },
            ..Workload::default()
        };
        if let Some(rank) = self.lora_rank {
            let targets = match &self.lora_targets {
                serde_json::Value::String(one) => vec![one.clone()],
                list => list
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str().map(String::from))
                    .collect(),
            };
            w.finetune = Finetune::Lora { rank, alpha: 2 * rank, targets };
        }
        w
    }
}

#[test]
fn hybrid_estimates_follow_the_traced_runtime() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference/trace/v5.json");
    let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture"))
        .expect("the tracer's JSON");
    let hardware = hardware::load("h100-80gb").expect("profile");
    let workspace = cublas_workspace(9);
    println!("tracer: {}", fixture.versions);
    let (mut rows, mut failures) = (0, Vec::new());
    for r in &fixture.records {
        // Built-ins only (a row may name a model another helper's importer builds).
        let Ok(model) = model::load(&r.model, ImportOptions::default()) else { continue };
        if !model.facts.layers.iter().any(|l| l.ssm.is_some()) {
            continue;
        }
        rows += 1;
        let (Some(traced), None) = (r.peak_bytes, &r.error) else {
            failures.push(format!("{}: not traced ({})", r.label(), r.error.as_deref().unwrap_or("no peak")));
            continue;
        };
        let e = estimate(&model, &hardware, &r.workload(), &Placement::even_layers(&model, 1))
            .expect("an estimate");
        let ours = e.devices[0].peak_allocated_bytes - workspace;
        let error = (ours as f64 - traced as f64) / traced as f64;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "{:<56} {:>8.3} {:>8.3} GiB {:>7.1}% (ours at {})",
            r.label(),
            gib(traced),
            gib(ours),
            100.0 * error,
            e.devices[0].peak_at
        );
        if error.abs() > 0.03 {
            failures.push(format!("{}: {:+.1}%", r.label(), 100.0 * error));
        }
    }
    assert!(rows >= 2, "{rows} hybrid rows in the fixture: a training and an inference row expected");
    assert!(failures.is_empty(), "past 3 %:\n{}", failures.join("\n"));
}
