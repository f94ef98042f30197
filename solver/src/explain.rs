//! Why a plan does not fit, and what would make it fit. The shortfall comes from simulating the
//! plainest placement (the layers split evenly over the GPUs): which device runs out, by how
//! many bytes, at which moment of the step. Each remedy is one change a user can make —
//! a smaller batch or sequence, 8-bit or 4-bit weights, gradient checkpointing, LoRA instead of
//! a full fine-tune, more GPUs of the profile's kind, layers offloaded to the CPU — and each is
//! verified by solving again with the change; only changes that fit are offered.

use crate::build::Request;
use crate::plan::{Settings, plan};
use crate::runtime::Runtime;
use serde::Serialize;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::ModelDescription;
use vramplan_profiles::units::format_bytes;
use vramplan_sim::placement::Placement;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Workload};

/// The most GPUs a "more GPUs" remedy looks for.
const MAX_GPUS: u32 = 64;

/// The longest one remedy's re-solve may take, in seconds.
const PROBE_SECONDS: f64 = 5.0;

/// A device that runs out, in the even split.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shortfall {
    pub device: String,
    /// Bytes beyond the limit (usable × (1 − headroom)).
    pub short_bytes: u64,
    /// The moment of the step the peak happens (`backward of model.layers.0 (step 2)`).
    pub at: String,
}

/// A change that makes the plan fit, verified by re-solving.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remedy {
    /// In words: `gradient checkpointing (per decoder layer)`.
    pub change: String,
    /// The flags that apply it (`--grad-ckpt full`, `--hardware 4xt4`).
    pub flags: String,
    /// The re-solved plan's largest GPU utilisation (peak reserved / usable).
    pub utilisation: f64,
}

/// Why it does not fit and what would.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub shortfalls: Vec<Shortfall>,
    pub remedies: Vec<Remedy>,
}

/// Explains an infeasible request.
pub fn explain(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Explanation {
    Explanation {
        shortfalls: shortfalls(model, hardware, workload, request),
        remedies: remedies(model, hardware, workload, request, settings),
    }
}

fn shortfalls(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Vec<Shortfall> {
    let gpus = hardware.devices.len() as u32;
    let placement = if gpus > 1 { Placement::even_layers(model, gpus) } else { Placement::single(0) };
    let Ok(estimate) = vramplan_sim::estimate(model, hardware, workload, &placement) else {
        return Vec::new();
    };
    estimate
        .devices
        .iter()
        .filter_map(|d| {
            let limit = (d.usable_bytes as f64 * (1.0 - request.headroom)).floor() as u64;
            (d.peak_reserved_bytes > limit).then(|| Shortfall {
                device: format!("GPU {} ({})", d.id, d.name),
                short_bytes: d.peak_reserved_bytes - limit,
                at: d.peak_at.clone(),
            })
        })
        .collect()
}

/// Solves with the change; the largest GPU utilisation when it fits. Each probe has at most
/// [`PROBE_SECONDS`]: a plan found by then is verified all the same (simulated, within limits),
/// it need not be the most balanced.
fn fits(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Option<f64> {
    let limit = settings.time_limit_s.map_or(PROBE_SECONDS, |s| s.min(PROBE_SECONDS));
    let settings = Settings { time_limit_s: Some(limit), ..*settings };
    let plan = plan(model, hardware, workload, request, &settings).ok()?;
    plan.feasible.then(|| {
        plan.devices.iter().filter(|d| d.estimate.is_some()).map(|d| d.utilisation).fold(0.0, f64::max)
    })
}

/// The largest value in `low..=high` for which `ok` holds, assuming it is monotone; `None` when
/// even `low` fails.
fn largest(low: u64, high: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    if low > high || !ok(low) {
        return None;
    }
    let (mut good, mut bad) = (low, high + 1);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if ok(mid) { good = mid } else { bad = mid }
    }
    Some(good)
}

/// The smallest value in `low..=high` for which `ok` holds, assuming it is monotone: doubling
/// until it holds, then bisecting.
fn fewest(low: u32, high: u32, mut ok: impl FnMut(u32) -> bool) -> Option<u32> {
    let mut failed = low - 1;
    let mut k = low;
    loop {
        if k > high {
            return None;
        }
        if ok(k) {
            break;
        }
        failed = k;
        k = (k * 2).min(high.max(k + 1));
        if failed == high {
            return None;
        }
    }
    let mut good = k;
    while good - failed > 1 {
        let mid = failed + (good - failed) / 2;
        if ok(mid) { good = mid } else { failed = mid }
    }
    Some(good)
}

/// The profile with `n` GPUs of its first GPU's kind, when it has a catalog kind.
fn more_gpus(hardware: &HardwareProfile, n: u32) -> Option<(HardwareProfile, String)> {
    let kind = hardware.devices.first()?.model.clone()?;
    let spec = format!("{n}x{kind}");
    hardware::load(&spec).ok().map(|h| (h, spec))
}

fn remedies(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Vec<Remedy> {
    let mut out = Vec::new();
    let offer = |out: &mut Vec<Remedy>, change: String, flags: String, utilisation: Option<f64>| {
        if let Some(utilisation) = utilisation {
            out.push(Remedy { change, flags, utilisation });
        }
    };
    let try_workload = |w: &Workload| fits(model, hardware, w, request, settings);
    // Smaller batch, then shorter sequences.
    if workload.batch > 1 {
        let best = largest(1, workload.batch - 1, |b| {
            try_workload(&Workload { batch: b, ..workload.clone() }).is_some()
        });
        if let Some(b) = best {
            let w = Workload { batch: b, ..workload.clone() };
            offer(
                &mut out,
                format!("batch {b} (the largest that fits)"),
                format!("--batch {b}"),
                try_workload(&w),
            );
        }
    }
    if workload.seq > 128 {
        let step = 128;
        let best = largest(1, (workload.seq - 1) / step, |k| {
            try_workload(&Workload {
                seq: k * step,
                prompt: workload.prompt.map(|p| p.min(k * step)),
                ..workload.clone()
            })
            .is_some()
        });
        if let Some(k) = best {
            let seq = k * step;
            let w = Workload { seq, prompt: workload.prompt.map(|p| p.min(seq)), ..workload.clone() };
            offer(
                &mut out,
                format!("sequence length {seq} (the longest multiple of 128 that fits)"),
                format!("--seq {seq}"),
                try_workload(&w),
            );
        }
    }
    let training = workload.mode == Mode::Train;
    let full = matches!(workload.finetune, Finetune::Full);
    if training && workload.grad_checkpointing == GradCheckpointing::Off {
        let w = Workload { grad_checkpointing: GradCheckpointing::Full, ..workload.clone() };
        offer(
            &mut out,
            "gradient checkpointing (per decoder layer)".into(),
            "--grad-ckpt full".into(),
            try_workload(&w),
        );
    }
    let lora = Finetune::Lora { rank: 16, alpha: 32, targets: Vec::new() };
    if training && full {
        let w = Workload { finetune: lora.clone(), ..workload.clone() };
        offer(
            &mut out,
            "LoRA (rank 16) instead of a full fine-tune".into(),
            "--lora-rank 16".into(),
            try_workload(&w),
        );
    }
    let mut quantized = Vec::new();
    if workload.quant == Quant::None {
        // bitsandbytes weights cannot be fully fine-tuned: quantized training is (Q)LoRA.
        let finetune = if training { lora.clone() } else { workload.finetune.clone() };
        let extra = if training && full { " --lora-rank 16" } else { "" };
        for (quant, name, flag) in [
            (Quant::Int8, "8-bit weights (bitsandbytes LLM.int8)", "--quant int8"),
            (
                Quant::Nf4 { double_quant: true },
                "4-bit NF4 weights (bitsandbytes, double quantization)",
                "--quant nf4 --double-quant",
            ),
        ] {
            let w = Workload { quant: quant.clone(), finetune: finetune.clone(), ..workload.clone() };
            let label = if training && full { format!("{name} with LoRA") } else { name.to_string() };
            quantized.push((w.clone(), label.clone(), format!("{flag}{extra}")));
            offer(&mut out, label, format!("{flag}{extra}"), try_workload(&w));
        }
    }
    // CPU offload of layers (inference under accelerate).
    if !training && !request.offload && matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4)
    {
        let r = Request { offload: true, ..request.clone() };
        if let Ok(p) = plan(model, hardware, workload, &r, settings)
            && p.feasible
        {
            let on_cpu = p.device_map.iter().filter(|(_, t)| !matches!(t, crate::Tier::Gpu(_))).count();
            let util =
                p.devices.iter().filter(|d| d.estimate.is_some()).map(|d| d.utilisation).fold(0.0, f64::max);
            offer(
                &mut out,
                format!("{on_cpu} modules offloaded to the CPU (slower: weights cross PCIe every step)"),
                "leave out --no-offload".into(),
                Some(util),
            );
        }
    }
    // More GPUs of the profile's kind: the original workload, and the quantized ones.
    let n = hardware.devices.len() as u32;
    let mut candidates = vec![(workload.clone(), String::new(), String::new())];
    candidates.extend(quantized);
    for (w, label, flags) in candidates {
        let found = fewest(n + 1, MAX_GPUS, |k| {
            more_gpus(hardware, k).is_some_and(|(h, _)| fits(model, &h, &w, request, settings).is_some())
        });
        if let Some(k) = found
            && let Some((h, spec)) = more_gpus(hardware, k)
        {
            let kind = h.devices[0].name.clone();
            let change = if label.is_empty() {
                format!("{k} × {kind} ({} more)", k - n)
            } else {
                format!("{label} on {k} × {kind}")
            };
            let flags = if flags.is_empty() {
                format!("--hardware {spec}")
            } else {
                format!("{flags} --hardware {spec}")
            };
            offer(&mut out, change, flags, fits(model, &h, &w, request, settings));
        }
        if out.len() >= 6 {
            break;
        }
    }
    out
}

/// One line per shortfall, in words.
pub fn describe_shortfall(s: &Shortfall) -> String {
    format!("{} is short by {} at {}", s.device, format_bytes(s.short_bytes), s.at)
}
