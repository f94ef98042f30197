//! What the comparisons with the reference tracer share (`tracer.rs`, `tracer_vlm.rs`,
//! `tracer_hybrid.rs`, `generic_traced.rs`): the tracer's records as
//! `scripts/reference/trace.py` and `trace_vlm.py` write them under
//! `fixtures/reference/trace/`, each record's workload as a vramplan workload, and an estimate's
//! error against the traced peak.
//!
//! The tracer runs CPU kernels and no CUDA library: the estimate's cuBLAS workspace, which
//! PyTorch allocates on a GPU and the CPU never makes, is left out of the comparison. Nothing
//! else is adjusted.

// Each test binary includes this module and uses part of it.
#![allow(dead_code)]

use serde::Deserialize;
use vramplan_profiles::DType;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, catalog};
use vramplan_sim::program::blas_workspaces;
use vramplan_sim::workload::{
    AttentionImpl, Finetune, GradCheckpointing, Images, Mode, Optimizer, Quant, Workload,
};
use vramplan_sim::{Placement, estimate};

/// One fixture file of the tracer.
#[derive(Deserialize)]
pub struct Fixture {
    /// The libraries the tracer ran (torch, transformers, PEFT, …).
    pub versions: serde_json::Value,
    /// One record a traced configuration.
    pub records: Vec<Record>,
}

/// One traced configuration and what the tracer measured.
#[derive(Deserialize)]
pub struct Record {
    /// The built-in model's name.
    pub model: String,
    /// `train` or `inference`.
    pub mode: String,
    /// `full`, `lora`, `qlora` or `none`.
    pub finetune: String,
    /// Whether gradient checkpointing was on.
    pub ckpt: bool,
    /// Sequences a step.
    pub batch: u64,
    /// Tokens a sequence.
    pub seq: u64,
    /// The weights' dtype (`bf16`).
    pub dtype: String,
    /// Images a sample (the vision-language records).
    #[serde(default)]
    pub images: Option<Images>,
    /// LoRA's rank, where LoRA was applied.
    #[serde(default)]
    pub lora_rank: Option<u64>,
    /// PEFT's `target_modules`: names, or `"all-linear"`.
    #[serde(default)]
    pub lora_targets: serde_json::Value,
    /// The traced peak of live tensor bytes.
    #[serde(default)]
    pub peak_bytes: Option<u64>,
    /// Where the traced peak fell.
    #[serde(default)]
    pub peak_where: Option<serde_json::Value>,
    /// Why the tracer could not run the configuration.
    #[serde(default)]
    pub error: Option<String>,
    /// `eager` where the configuration asks for it (else transformers' default).
    #[serde(default)]
    pub attn: Option<String>,
    /// Traced after the memory model was set beside the other rows, and not used to shape it.
    #[serde(default)]
    pub held_out: bool,
    /// Which held-out set: the first (none) exposed eager attention's fp32 softmax, which was
    /// modelled after it; the second was traced after that, and its families' prefills were
    /// looked at when prefill's working set was modelled; the third was traced after that.
    #[serde(default)]
    pub set: Option<u32>,
    /// The class built from the built-in's config, where it is not the built-in's own (a task
    /// head: `XLNetForQuestionAnswering`).
    #[serde(default)]
    pub cls: Option<String>,
    /// `fp16`/`bf16`: fp32 weights under `torch.autocast` (the HF Trainer's `fp16=True`).
    #[serde(default)]
    pub autocast: Option<String>,
    /// The config.json the tracer built the model from, where the model is no built-in (a class
    /// traced from transformers' default config: `scripts/reference/default_configs.py`).
    #[serde(default)]
    pub config: Option<serde_json::Value>,
}

impl Record {
    /// The configuration in a line: model (or class), mode, fine-tune, what differs from the
    /// defaults, shape, and the images.
    pub fn label(&self) -> String {
        let ckpt = if self.ckpt { " ckpt" } else { "" };
        let attn = self.attn.as_deref().map(|a| format!(" {a}")).unwrap_or_default();
        let lora = self.lora_rank.map(|r| format!(" r{r}")).unwrap_or_default();
        let dtype = if self.dtype == "bf16" { String::new() } else { format!(" {}", self.dtype) };
        let autocast = self.autocast.as_deref().map(|a| format!(" autocast {a}")).unwrap_or_default();
        let images = self
            .images
            .map(|Images { per_sample, width, height }| format!(" + {per_sample} × {width}x{height}"))
            .unwrap_or_default();
        let model = self.cls.as_deref().unwrap_or(&self.model);
        format!(
            "{model} {} {}{lora}{ckpt}{attn}{dtype}{autocast} {}x{}{images}",
            self.mode, self.finetune, self.batch, self.seq
        )
    }

    /// The workload the tracer ran, as a vramplan workload.
    pub fn workload(&self) -> Workload {
        let dtype = DType::parse(&self.dtype).expect("a dtype");
        let mut w = Workload {
            mode: if self.mode == "train" { Mode::Train } else { Mode::Inference },
            batch: self.batch,
            seq: self.seq,
            images: self.images,
            weight_dtype: Some(dtype),
            optimizer: Optimizer::Adamw,
            grad_checkpointing: if self.ckpt { GradCheckpointing::Full } else { GradCheckpointing::Off },
            ..Workload::default()
        };
        if self.attn.as_deref() == Some("eager") {
            w.attention = AttentionImpl::Eager;
        }
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
        if self.finetune == "qlora" {
            w.quant = Quant::Nf4 { double_quant: true };
        }
        w.autocast = self.autocast.as_deref().map(|a| DType::parse(a).expect("an autocast dtype"));
        w
    }

    /// The model the tracer built: the built-in, or its config as the record's class.
    pub fn built_model(&self) -> ModelDescription {
        if let Some(config) = &self.config {
            return model::hf::from_config_text(&config.to_string(), &self.model, ImportOptions::default())
                .expect("the traced config");
        }
        let Some(class) = &self.cls else {
            return model::load(&self.model, ImportOptions::default()).expect("built-in model");
        };
        let text = catalog::builtin_config(&self.model).expect("built-in config");
        let mut config: serde_json::Value = serde_json::from_str(text).expect("JSON");
        config["architectures"] = serde_json::json!([class]);
        let origin = format!("{} as {class}", self.model);
        model::hf::from_config_text(&config.to_string(), &origin, ImportOptions::default())
            .expect("the class")
    }

    /// The traced peak, or a line saying why there is none (`LABEL: not traced (WHY)`, WHY the
    /// tracer's error, else `no peak`).
    pub fn traced_peak(&self) -> Result<u64, String> {
        match (self.peak_bytes, &self.error) {
            (Some(peak), None) => Ok(peak),
            _ => {
                Err(format!("{}: not traced ({})", self.label(), self.error.as_deref().unwrap_or("no peak")))
            }
        }
    }
}

/// Reads `fixtures/reference/trace/NAME` (`v5.json`, `vlm-v5.json`).
pub fn fixture(name: &str) -> Fixture {
    let path = format!("{}/../fixtures/reference/trace/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: the tracer's JSON: {e}"))
}

/// An estimate set beside the traced peak.
pub struct Compared {
    /// The estimate's peak of allocated bytes less the cuBLAS workspace (of a compute
    /// capability 9 GPU, the H100 and H200 these comparisons plan for).
    pub ours: u64,
    /// `(ours - traced) / traced`.
    pub error: f64,
    /// The estimate's event at its peak.
    pub peak_at: String,
}

/// Estimates `workload` for `model` on the first GPU of `hardware` and compares its peak with
/// `traced`; panics with `what` when the estimate fails.
pub fn compare(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    traced: u64,
    what: &str,
) -> Compared {
    let e = estimate(model, hardware, workload, &Placement::even_layers(model, 1))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let device = &e.devices[0];
    let major = hardware.devices[0].compute_capability.major;
    let ours = device.peak_allocated_bytes - blas_workspaces(model, major, workload).iter().sum::<u64>();
    let error = (ours as f64 - traced as f64) / traced as f64;
    Compared { ours, error, peak_at: device.peak_at.clone() }
}

/// Bytes in GiB.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
