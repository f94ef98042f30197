//! The simulator against the reference tracer for vision-language models with images:
//! `scripts/reference/trace_vlm.py` ran each configuration of `fixtures/reference/trace/vlm-v5.json`
//! with the real transformers (+ PEFT) under FakeTensorMode, the images' index tensors computed
//! from their real grids (versions in the file). Each estimate's peak of allocated bytes, less the
//! cuBLAS workspace the CPU never makes (as `tracer.rs` compares), is held within 3 % of the
//! traced peak.

use serde::Deserialize;
use vramplan_profiles::DType;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions};
use vramplan_sim::program::cublas_workspace;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Images, Mode, Optimizer, Workload};
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
    images: Images,
    #[serde(default)]
    lora_rank: Option<u64>,
    #[serde(default)]
    lora_targets: Vec<String>,
    peak_bytes: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

impl Record {
    fn label(&self) -> String {
        let ckpt = if self.ckpt { " ckpt" } else { "" };
        let Images { per_sample, width, height } = self.images;
        format!(
            "{} {} {}{ckpt} {}x{} + {per_sample} × {width}x{height}",
            self.model, self.mode, self.finetune, self.batch, self.seq
        )
    }

    fn workload(&self) -> Workload {
        let mut w = Workload {
            mode: if self.mode == "train" { Mode::Train } else { Mode::Inference },
            batch: self.batch,
            seq: self.seq,
            images: Some(self.images),
            weight_dtype: Some(DType::parse(&self.dtype).expect("a dtype")),
            optimizer: Optimizer::Adamw,
            grad_checkpointing: if self.ckpt { GradCheckpointing::Full } else { GradCheckpointing::Off },
            ..Workload::default()
        };
        if let Some(rank) = self.lora_rank {
            w.finetune = Finetune::Lora { rank, alpha: 2 * rank, targets: self.lora_targets.clone() };
        }
        w
    }
}

#[test]
fn vision_language_estimates_follow_the_traced_runtime() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference/trace/vlm-v5.json");
    let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture"))
        .expect("the tracer's JSON");
    let hardware = hardware::load("h200").expect("profile");
    let workspace = cublas_workspace(9);
    println!("tracer: {}", fixture.versions);
    let mut failures = Vec::new();
    for r in &fixture.records {
        let (Some(traced), None) = (r.peak_bytes, &r.error) else {
            failures.push(format!("{}: not traced ({})", r.label(), r.error.as_deref().unwrap_or("no peak")));
            continue;
        };
        let model = model::load(&r.model, ImportOptions::default()).expect("a built-in");
        let e = estimate(&model, &hardware, &r.workload(), &Placement::even_layers(&model, 1))
            .expect("an estimate");
        let ours = e.devices[0].peak_allocated_bytes - workspace;
        let error = (ours as f64 - traced as f64) / traced as f64;
        println!("{:<70} {:>8.1}% (ours at {})", r.label(), 100.0 * error, e.devices[0].peak_at);
        if error.abs() > 0.03 {
            failures.push(format!("{}: {:+.1}%", r.label(), 100.0 * error));
        }
    }
    assert!(failures.is_empty(), "past 3 %:\n{}", failures.join("\n"));
}
