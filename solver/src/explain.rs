//! Why a plan does not fit, and what would make it fit. The shortfall comes from simulating the
//! plainest placement (the layers split evenly over the GPUs): which device runs out, by how
//! many bytes, at which moment of the step. Each remedy is one change a user can make —
//! a smaller batch or sequence, 8-bit or 4-bit weights, gradient checkpointing, LoRA instead of
//! a full fine-tune, more GPUs of the profile's kind, layers offloaded to the CPU — and each is
//! verified by solving again with the change; only changes that fit are offered.
//!
//! Shortfalls and remedies are data (a device as a [`Target`] and its name, a change as a
//! [`Change`]); `vramplan-reports` puts them in words and flags.
//!
//! Explanations follow a proven infeasibility only. `Settings::time_limit_s` is what is left of
//! the command's time: all the probes share it (each also capped at [`PROBE_SECONDS`]), and a
//! change whose probes ran out of time is listed as undecided, never as one that does not fit.

use crate::Target;
use crate::build::Request;
use crate::plan::{Plan, Settings, Verdict, deadline_after, plan, seconds_left};
use crate::runtime::Runtime;
use crate::whatif::{search, with_quant};
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Instant;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::placement::Placement;
use vramplan_sim::workload::{Finetune, GradCheckpointing, Mode, Quant, Workload};

/// The most GPUs a "more GPUs" remedy looks for.
const MAX_GPUS: u32 = 64;

/// The longest one remedy's re-solve may take, in seconds.
const PROBE_SECONDS: f64 = 5.0;

/// The LoRA rank a remedy proposes in place of a full fine-tune (alpha 32, the default targets).
pub const LORA_RANK: u64 = 16;

/// The sequence lengths a "shorter sequence" remedy tries: multiples of this.
pub const SEQ_STEP: u64 = 128;

/// A device that runs out, in the even split.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shortfall {
    /// The device (`GPU 0`).
    pub device: Target,
    /// Its name in the hardware profile (`Tesla T4`).
    pub name: String,
    /// Bytes beyond the limit (usable × (1 − headroom)).
    pub short_bytes: u64,
    /// The moment of the step the peak happens (`backward of model.layers.0 (step 2)`).
    pub at: String,
}

/// The bitsandbytes quantizations a remedy proposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bitsandbytes {
    /// LLM.int8 weights (`--quant int8`).
    Int8,
    /// 4-bit NF4 weights with double quantization (`--quant nf4 --double-quant`).
    Nf4DoubleQuant,
}

impl Bitsandbytes {
    /// The workload's quantization.
    pub fn quant(self) -> Quant {
        match self {
            Bitsandbytes::Int8 => Quant::Int8,
            Bitsandbytes::Nf4DoubleQuant => Quant::Nf4 { double_quant: true },
        }
    }
}

/// bitsandbytes weights, as one remedy or as part of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Quantization {
    /// The quantization.
    pub quant: Bitsandbytes,
    /// The LoRA rank that replaces a full fine-tune (bitsandbytes weights cannot be fully
    /// fine-tuned: quantized training is QLoRA); `None` when the workload's fine-tuning stays.
    pub lora_rank: Option<u64>,
}

/// One change to the user's input, as data. In a [`Remedy`] it was verified to fit; in
/// [`Explanation::undecided`] its probes ran out of time, and what they were looking for and
/// did not find (the largest batch, the number of GPUs) is `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// A smaller batch (`--batch`).
    Batch {
        /// The largest batch found to fit; `None` when none was found.
        batch: Option<u64>,
        /// Larger batches were left undecided by the time limit: `batch` fits, but need not be
        /// the largest that does. False when `batch` is `None`.
        larger_undecided: bool,
    },
    /// A shorter sequence, a multiple of [`SEQ_STEP`] (`--seq`; a prompt longer than it is
    /// shortened to it).
    Sequence {
        /// The longest sequence found to fit; `None` when none was found.
        seq: Option<u64>,
        /// Longer sequences were left undecided by the time limit: `seq` fits, but need not be
        /// the longest that does. False when `seq` is `None`.
        longer_undecided: bool,
    },
    /// Gradient checkpointing per decoder layer (`--grad-ckpt full`).
    GradCheckpointing,
    /// LoRA instead of a full fine-tune (`--lora-rank`).
    Lora {
        /// The rank ([`LORA_RANK`]).
        rank: u64,
    },
    /// bitsandbytes weights (`--quant`), with LoRA where the workload was a full fine-tune.
    Quantize(Quantization),
    /// Modules offloaded to the CPU, for inference under accelerate (leaving out
    /// `--no-offload`); slower, since their weights cross PCIe every step.
    Offload {
        /// How many `device_map` entries the plan found puts off the GPUs; `None` when no plan
        /// was found.
        modules: Option<usize>,
    },
    /// More GPUs of the profile's first GPU's kind (`--hardware`), alone or with bitsandbytes
    /// weights.
    MoreGpus {
        /// The fewest GPUs found to fit; `None` when no count was found.
        gpus: Option<u32>,
        /// How many more than the profile has (`gpus` less the profile's count).
        added: Option<u32>,
        /// The GPU's name (`Tesla T4`).
        kind: String,
        /// The hardware short form that gives them (`8xt4`, for `--hardware`).
        hardware: Option<String>,
        /// The quantization it goes with, if any.
        quantize: Option<Quantization>,
    },
}

/// A change that makes the plan fit, verified by re-solving.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remedy {
    /// The change.
    pub change: Change,
    /// The re-solved plan's largest GPU utilisation (peak reserved / usable).
    pub utilisation: f64,
}

/// Why it does not fit and what would.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The devices that run out when the layers are split evenly (none: the split fits
    /// everywhere, yet no placement keeps every device within its limit).
    pub shortfalls: Vec<Shortfall>,
    /// Changes that fit, each verified by solving again.
    pub remedies: Vec<Remedy>,
    /// Changes whose checks ran out of time: they may or may not fit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub undecided: Vec<Change>,
}

/// Explains an infeasible request.
pub fn explain(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Explanation {
    let deadline = deadline_after(settings.time_limit_s);
    // The even split's replay is skipped, like every probe, once the time is up.
    let out_of_time = seconds_left(deadline).is_some_and(|s| s <= 0.0);
    let shortfalls = if out_of_time { Vec::new() } else { shortfalls(model, hardware, workload, request) };
    let probes = Probes { settings: *settings, deadline, undecided: RefCell::new(false) };
    let (remedies, undecided) = remedies(model, hardware, workload, request, &probes);
    Explanation { shortfalls, remedies, undecided }
}

fn shortfalls(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
) -> Vec<Shortfall> {
    let gpus = hardware.devices.len() as u32;
    let placement = if gpus > 1 { Placement::even_layers(model, gpus) } else { Placement::single(0) };
    let replayed =
        vramplan_sim::estimate::estimate_within(model, hardware, workload, &placement, request.headroom);
    let Ok(estimate) = replayed else {
        return Vec::new();
    };
    estimate
        .devices
        .iter()
        .filter_map(|d| {
            let limit = vramplan_sim::estimate::limit_bytes(d.usable_bytes, request.headroom);
            (d.peak_reserved_bytes > limit).then(|| Shortfall {
                device: Target::Gpu(d.id),
                name: d.name.clone(),
                short_bytes: d.peak_reserved_bytes - limit,
                at: d.peak_at.clone(),
            })
        })
        .collect()
}

/// What one re-solve with a change found.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Probe {
    /// It fits; the largest GPU utilisation.
    Fits(f64),
    DoesNotFit,
    /// The probe ran out of time (or could not be built): nothing is known.
    Unknown,
}

impl Probe {
    /// The largest GPU utilisation when it fits.
    fn utilisation(self) -> Option<f64> {
        match self {
            Probe::Fits(utilisation) => Some(utilisation),
            Probe::DoesNotFit | Probe::Unknown => None,
        }
    }
}

/// The probes' shared settings and deadline, and whether any probe since the last
/// [`Probes::take_undecided`] ended without an answer.
struct Probes {
    settings: Settings,
    deadline: Option<Instant>,
    undecided: RefCell<bool>,
}

impl Probes {
    /// Solves with the change. Each probe has at most [`PROBE_SECONDS`] and what is left of the
    /// deadline: a plan found by then is verified all the same (simulated, within limits), it
    /// need not be the most balanced.
    fn plan(
        &self,
        model: &ModelDescription,
        hardware: &HardwareProfile,
        workload: &Workload,
        request: &Request,
    ) -> (Probe, Option<Plan>) {
        let left = seconds_left(self.deadline).map_or(PROBE_SECONDS, |s| s.min(PROBE_SECONDS));
        let settings = Settings { time_limit_s: Some(left), ..self.settings };
        let plan = if left > 0.0 { plan(model, hardware, workload, request, &settings).ok() } else { None };
        let probe = match plan.as_ref().map(|p| p.verdict) {
            Some(Verdict::Fits) => Probe::Fits(plan.as_ref().map_or(0.0, largest_utilisation)),
            Some(Verdict::DoesNotFit) => Probe::DoesNotFit,
            Some(Verdict::Unknown) | None => Probe::Unknown,
        };
        if probe == Probe::Unknown {
            *self.undecided.borrow_mut() = true;
        }
        (probe, plan)
    }

    /// The largest GPU utilisation when the change fits.
    fn fits(
        &self,
        model: &ModelDescription,
        hardware: &HardwareProfile,
        workload: &Workload,
        request: &Request,
    ) -> Option<f64> {
        self.plan(model, hardware, workload, request).0.utilisation()
    }

    /// Whether a probe since the last call ran out of time; resets the flag.
    fn take_undecided(&self) -> bool {
        self.undecided.replace(false)
    }
}

fn largest_utilisation(plan: &Plan) -> f64 {
    plan.devices.iter().filter(|d| d.estimate.is_some()).map(|d| d.utilisation).fold(0.0, f64::max)
}

/// The largest value in `low..=high` for which `ok` holds (the what-if boundary search, from
/// `high` down); `None` when even `low` fails.
fn largest(low: u64, high: u64, mut ok: impl FnMut(u64) -> bool) -> Option<u64> {
    let found = search::largest::<(), Infallible>(low, high, high, |v| Ok((ok(v), ())));
    found.ok()?.below.map(|(v, _)| v)
}

/// The smallest value in `low..=high` for which `ok` holds (the what-if boundary search, from
/// `low` up); `None` when none does.
fn fewest(low: u32, high: u32, mut ok: impl FnMut(u32) -> bool) -> Option<u32> {
    let found = search::smallest::<(), Infallible>(low.into(), high.into(), low.into(), |v| {
        Ok((u32::try_from(v).is_ok_and(&mut ok), ()))
    });
    found.ok()?.above.and_then(|(v, _)| u32::try_from(v).ok())
}

/// The profile with `n` GPUs of its first GPU's kind, when it has a catalog kind.
fn more_gpus(hardware: &HardwareProfile, n: u32) -> Option<(HardwareProfile, String)> {
    let kind = hardware.devices.first()?.model.clone()?;
    let spec = format!("{n}x{kind}");
    hardware::load(&spec).ok().map(|h| (h, spec))
}

/// The verified remedies, and the changes whose probes ran out of time without a remedy.
fn remedies(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    probes: &Probes,
) -> (Vec<Remedy>, Vec<Change>) {
    let mut out = Vec::new();
    let mut undecided = Vec::new();
    // Offers the change when it fits; lists it as undecided when a probe behind it ran out of
    // time and nothing was offered.
    let mut offer = |out: &mut Vec<Remedy>, change: Change, utilisation: Option<f64>| {
        let timed_out = probes.take_undecided();
        match utilisation {
            Some(utilisation) => out.push(Remedy { change, utilisation }),
            None if timed_out => undecided.push(change),
            None => {}
        }
    };
    let try_workload = |w: &Workload| probes.fits(model, hardware, w, request);
    probes.take_undecided();
    // Smaller batch, then shorter sequences.
    if workload.batch > 1 {
        let mut seen = BTreeMap::new();
        let best = largest(1, workload.batch - 1, |b| {
            let fit = try_workload(&Workload { batch: b, ..workload.clone() });
            seen.extend(fit.map(|u| (b, u)));
            fit.is_some()
        });
        let partial = *probes.undecided.borrow();
        let utilisation = best.and_then(|b| seen.get(&b).copied());
        offer(
            &mut out,
            Change::Batch { batch: best, larger_undecided: partial && best.is_some() },
            utilisation,
        );
    }
    if workload.seq > SEQ_STEP {
        let step = SEQ_STEP;
        let shorter = |k: u64| Workload {
            seq: k * step,
            prompt: workload.prompt.map(|p| p.min(k * step)),
            ..workload.clone()
        };
        let mut seen = BTreeMap::new();
        let best = largest(1, (workload.seq - 1) / step, |k| {
            let fit = try_workload(&shorter(k));
            seen.extend(fit.map(|u| (k, u)));
            fit.is_some()
        });
        let partial = *probes.undecided.borrow();
        let utilisation = best.and_then(|k| seen.get(&k).copied());
        offer(
            &mut out,
            Change::Sequence { seq: best.map(|k| k * step), longer_undecided: partial && best.is_some() },
            utilisation,
        );
    }
    let training = workload.mode == Mode::Train;
    let full = matches!(workload.finetune, Finetune::Full);
    if training && workload.grad_checkpointing == GradCheckpointing::Off {
        let w = Workload { grad_checkpointing: GradCheckpointing::Full, ..workload.clone() };
        offer(&mut out, Change::GradCheckpointing, try_workload(&w));
    }
    let lora = Finetune::Lora { rank: LORA_RANK, alpha: 32, targets: Vec::new() };
    if training && full {
        let w = Workload { finetune: lora.clone(), ..workload.clone() };
        offer(&mut out, Change::Lora { rank: LORA_RANK }, try_workload(&w));
    }
    let mut quantized = Vec::new();
    if workload.quant == Quant::None {
        for quant in [Bitsandbytes::Int8, Bitsandbytes::Nf4DoubleQuant] {
            let (w, lora_rank) = with_quant(workload, quant.quant());
            let quantization = Quantization { quant, lora_rank };
            quantized.push((w.clone(), Some(quantization)));
            offer(&mut out, Change::Quantize(quantization), try_workload(&w));
        }
    }
    // CPU offload of layers (inference under accelerate).
    if !training && !request.offload && matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4)
    {
        let r = Request { offload: true, ..request.clone() };
        let (probe, found) = probes.plan(model, hardware, workload, &r);
        let utilisation = probe.utilisation();
        let on_cpu = found
            .as_ref()
            .map_or(0, |p| p.device_map.iter().filter(|(_, t)| !matches!(t, Target::Gpu(_))).count());
        let modules = utilisation.is_some().then_some(on_cpu);
        offer(&mut out, Change::Offload { modules }, utilisation);
    }
    // More GPUs of the profile's kind: the original workload, and the quantized ones.
    let n = hardware.devices.len() as u32;
    let mut candidates = vec![(workload.clone(), None)];
    candidates.extend(quantized);
    let kind = hardware.devices.first().map_or_else(String::new, |d| d.name.clone());
    for (w, quantize) in candidates {
        // Each count that fits, with its profile and spelling, so the answer is not loaded again.
        let mut seen = BTreeMap::new();
        let found = fewest(n + 1, MAX_GPUS, |k| {
            let Some((h, spec)) = more_gpus(hardware, k) else { return false };
            let fit = probes.fits(model, &h, &w, request);
            seen.extend(fit.map(|u| (k, (u, h, spec))));
            fit.is_some()
        });
        match found.and_then(|k| seen.remove(&k).map(|(u, h, spec)| (k, u, h, spec))) {
            Some((k, utilisation, h, spec)) => {
                let change = Change::MoreGpus {
                    gpus: Some(k),
                    added: Some(k - n),
                    kind: h.devices[0].name.clone(),
                    hardware: Some(spec),
                    quantize,
                };
                offer(&mut out, change, Some(utilisation));
            }
            None => {
                let change = Change::MoreGpus {
                    gpus: None,
                    added: None,
                    kind: kind.clone(),
                    hardware: None,
                    quantize,
                };
                offer(&mut out, change, None);
            }
        }
        if out.len() >= 6 {
            break;
        }
    }
    (out, undecided)
}
