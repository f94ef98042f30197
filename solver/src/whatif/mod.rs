//! What-if: capacity planning backwards. Instead of "does this configuration fit?", each query
//! asks for the configuration at a boundary: the largest batch or sequence that fits, the
//! sequences an engine serves at once, the fewest GPUs, the highest weight precision, the
//! cheapest hardware; a grid sweeps two or three axes, and the frontier keeps the trade-offs
//! that no other point beats.
//!
//! Every answer comes from full simulations ([`probe`]): where placement is fixed (one GPU, data
//! parallelism, vLLM and llama.cpp, which place the model themselves) the replay of
//! `vramplan_sim::estimate`; where it is not (one copy of the model over several GPUs under
//! transformers) a plan solved for each probe, so "fits" means "some device map fits", as
//! `vramplan plan` would find it. A boundary is found by galloping then bisecting over the
//! probes, checked for monotonicity against every probe made (and scanned where it is not
//! monotone); the answer carries its own probe and the probe of the next value, which does not
//! fit, with the device, moment and component that bind ([`Binding`]).
//!
//! Answers are data; `vramplan-reports` puts them in words, with the flags that run them
//! ([`run_flags`]).

mod grid;
mod loading;
mod queries;
mod run_flags;
pub(crate) mod search;

pub use grid::{Axis, AxisValue, Frontier, FrontierPoint, Grid, GridPoint, frontier, grid};
pub use loading::{
    CHECKPOINT, LoadKwargs, QuantizationConfig, checkpoint_word, loaded_by_reason, loading_program,
    map_loading, prequantized, quantization_config,
};
pub use queries::{
    Cap, Cheapest, Concurrency, EngineKind, Fewest, Largest, PricedProfile, QuantChoice, Quantity,
    best_quant, cheapest, max_batch, max_concurrency, max_seq, min_gpus,
};
pub use run_flags::{RunFlags, accumulation, keeps_effective_batch, pretrained_source, run_flags};

use crate::build::Request;
use crate::explain::LORA_RANK;
use crate::plan::{Settings, Verdict, plan, seconds_left};
use serde::Serialize;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::Sweep;
use vramplan_sim::estimate::{DeviceEstimate, Part, estimate_within, is_data_parallel, limit_bytes};
use vramplan_sim::input::{validate_configuration, validate_shape};
use vramplan_sim::placement::{Placement, Target};
use vramplan_sim::workload::{Engine, Finetune, Mode, Parallelism, Quant, Workload};

/// Whether the what-if's time limit (`request.deadline`) has passed: a query that loops over
/// many searches (the frontier) stops where it stands, and the answer is what it found.
pub fn out_of_time(request: &Request) -> bool {
    request.deadline.is_some_and(|d| std::time::Instant::now() >= d)
}

/// What every query starts from: the model, the hardware, the workload as given, and how plans
/// are made (the runtime, the headroom kept on each GPU).
#[derive(Debug, Clone, Copy)]
pub struct Question<'a> {
    /// The model.
    pub model: &'a ModelDescription,
    /// The hardware (for `min-gpus`, its first GPU's kind).
    pub hardware: &'a HardwareProfile,
    /// The workload; each query changes one or more of its fields.
    pub workload: &'a Workload,
    /// The runtime plans are for, and the share of each GPU kept free (0 judges as
    /// `vramplan estimate` does: peak reserved within usable memory).
    pub request: &'a Request,
}

/// One configuration simulated: whether it fits, and its figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    /// Every used GPU keeps its peak reserved within its limit, and the engine accepts it
    /// (vLLM: its KV cache holds one sequence of `max_model_len`).
    pub fits: bool,
    /// Where it does not fit: proven (the replay of a fixed placement, or a plan proven
    /// infeasible), rather than no map found that fits (the solver gave up; see `vramplan plan`).
    pub proven: bool,
    /// The largest device-used figure (what `nvidia-smi` shows).
    pub peak_bytes: u64,
    /// The largest peak reserved over its limit (1.0 = full).
    pub utilisation: f64,
    /// Each used GPU's step.
    pub devices: Vec<DeviceEstimate>,
    /// Each used GPU's limit: usable × (1 − headroom), in `devices`' order.
    pub limits: Vec<u64>,
    /// vLLM: tokens its paged KV cache holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    /// The device map that fits, where placement was solved (one copy over several GPUs).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "optional_map")]
    pub device_map: Option<Vec<(String, Target)>>,
}

/// What stops the next value from fitting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Binding {
    /// The GPU that runs out first.
    pub device: u32,
    /// Its name (`Tesla T4`).
    pub name: String,
    /// The moment of its peak (`backward of model.layers.0 (step 2)`).
    pub at: String,
    /// The component that grew most from the fitting configuration to this one (or, without
    /// one to compare with, the largest at the peak).
    pub component: Part,
    /// `component` is the one that grew most (false: the largest at the peak).
    pub grew: bool,
    /// Bytes of peak reserved past the limit; 0 where the engine refuses within its memory
    /// (vLLM's KV cache holding less than one sequence).
    pub over_bytes: u64,
}

/// Simulates `workload` on `hardware` as the question's request judges it: the replay of the
/// fixed placement where the runtime or the parallelism fixes it, a solved plan where one copy of
/// the model is spread over several GPUs by a device map.
pub fn probe(
    question: &Question,
    hardware: &HardwareProfile,
    workload: &Workload,
) -> Result<Fit, InputError> {
    Prober::new(*question, hardware, workload).probe(workload)
}

/// [`probe`] for one configuration at many shapes (a grid's batch × sequence points, a
/// boundary search): what holds whatever the shape is checked once, and where the placement is
/// fixed the step program is resolved once ([`Sweep`]). A workload that is not the
/// configuration at another shape ([`Workload::same_but_shape`]) is probed whole.
pub(crate) struct Prober<'q> {
    question: Question<'q>,
    hardware: &'q HardwareProfile,
    base: &'q Workload,
    /// The shape-free checks of `base`.
    configuration: Result<(), InputError>,
    /// Where the placement is fixed: one GPU's (or each rank's) replay.
    sweep: Option<Sweep<'q>>,
}

impl<'q> Prober<'q> {
    pub(crate) fn new(
        question: Question<'q>,
        hardware: &'q HardwareProfile,
        base: &'q Workload,
    ) -> Prober<'q> {
        let configuration = validate_configuration(base, question.model, hardware);
        let fixed = !placement_is_solved(hardware, base, question.request);
        let sweep = (configuration.is_ok() && fixed).then(|| {
            Sweep::new(question.model, hardware, base, Placement::single(0), question.request.headroom)
        });
        Prober { question, hardware, base, configuration, sweep }
    }

    /// Simulates `workload` on the prober's hardware, as [`probe`] does.
    pub(crate) fn probe(&self, workload: &Workload) -> Result<Fit, InputError> {
        if !self.base.same_but_shape(workload) {
            return Prober::new(self.question, self.hardware, workload).probe(workload);
        }
        self.configuration.clone()?;
        validate_shape(workload, self.question.model)?;
        let (question, hardware) = (&self.question, self.hardware);
        let headroom = question.request.headroom;
        if let Some(sweep) = &self.sweep {
            let estimate = sweep.estimate(workload)?;
            return Ok(fit_of(estimate.devices, headroom, estimate.kv_capacity_tokens, estimate.fits));
        }
        // Past the what-if's time limit no plan is solved: the probe says "not found", not
        // proven, and the query answers with what it has (the caller reports the limit).
        if out_of_time(question.request) {
            return Ok(Fit { proven: false, ..fit_of(Vec::new(), headroom, None, false) });
        }
        // A what-if's time limit bounds each plan it solves: what is left of it.
        let settings =
            Settings { time_limit_s: seconds_left(question.request.deadline), ..Settings::default() };
        let planned = plan(question.model, hardware, workload, question.request, &settings)?;
        let mut devices: Vec<DeviceEstimate> =
            planned.devices.iter().filter_map(|d| d.estimate.clone()).collect();
        if devices.is_empty() {
            // Proven not to fit without a placement to replay: the even split of the layers
            // shows where the memory runs out.
            let gpus = hardware.devices.len() as u32;
            let even = Placement::even_layers(question.model, gpus);
            devices = estimate_within(question.model, hardware, workload, &even, headroom)?.devices;
        }
        let mut fit = fit_of(devices, headroom, None, planned.verdict == Verdict::Fits);
        fit.proven = planned.verdict != Verdict::Unknown;
        fit.device_map = (planned.verdict == Verdict::Fits).then_some(planned.device_map);
        Ok(fit)
    }
}

/// Whether the device map is the question (one copy of the model under transformers, over
/// several GPUs or, where the request allows offload, over a GPU and the CPU), rather than fixed
/// by the runtime or the parallelism.
fn placement_is_solved(hardware: &HardwareProfile, workload: &Workload, request: &Request) -> bool {
    let spread = hardware.devices.len() > 1 || (request.offload && workload.mode == Mode::Inference);
    spread
        && matches!(workload.engine, Engine::Transformers)
        && workload.parallelism == Parallelism::Single
        && !is_data_parallel(workload)
}

/// `workload` with weights held as `quant`. Quantized weights (bitsandbytes, fp8) cannot be fully
/// fine-tuned, so a full fine-tune becomes LoRA of rank [`LORA_RANK`] (QLoRA, alpha 32, PEFT's
/// default targets); the rank is returned where that happened.
pub fn with_quant(workload: &Workload, quant: Quant) -> (Workload, Option<u64>) {
    let adapters = workload.mode == Mode::Train
        && matches!(workload.finetune, Finetune::Full)
        && !matches!(quant, Quant::None | Quant::Gguf { .. });
    let mut w = Workload { quant, ..workload.clone() };
    if adapters {
        w.finetune = Finetune::Lora { rank: LORA_RANK, alpha: 32, targets: Vec::new() };
    }
    (w, adapters.then_some(LORA_RANK))
}

/// Whether every GPU of `hardware` computes in fp8 (Ada and Hopper, compute capability 8.9 and
/// up): fp8 weights and KV caches are offered only there.
pub(crate) fn fp8_capable(hardware: &HardwareProfile) -> bool {
    hardware.devices.iter().all(|d| (d.compute_capability.major, d.compute_capability.minor) >= (8, 9))
}

fn fit_of(
    devices: Vec<DeviceEstimate>,
    headroom: f64,
    kv_capacity_tokens: Option<u64>,
    accepted: bool,
) -> Fit {
    let limits: Vec<u64> = devices.iter().map(|d| limit_bytes(d.usable_bytes, headroom)).collect();
    let within = devices.iter().zip(&limits).all(|(d, &limit)| d.peak_reserved_bytes <= limit);
    let utilisation = devices
        .iter()
        .zip(&limits)
        .map(|(d, &limit)| d.peak_reserved_bytes as f64 / limit.max(1) as f64)
        .fold(0.0, f64::max);
    Fit {
        fits: accepted && within && !devices.is_empty(),
        proven: true,
        peak_bytes: devices.iter().map(|d| d.device_used_bytes).max().unwrap_or(0),
        utilisation,
        devices,
        limits,
        kv_capacity_tokens,
        device_map: None,
    }
}

/// What binds in `fails`, compared with `fitting` where there is one: the GPU furthest past its
/// limit (or the one the engine refuses), and the component that grew most on it.
pub fn binding(fitting: Option<&Fit>, fails: &Fit) -> Option<Binding> {
    let over = |i: usize| fails.devices[i].peak_reserved_bytes as i128 - fails.limits[i] as i128;
    let index = (0..fails.devices.len())
        .max_by_key(|&i| (over(i), std::cmp::Reverse(i)))
        .filter(|&i| over(i) > 0)
        .or_else(|| fails.devices.iter().position(|d| !d.fits))
        .or_else(|| (!fails.devices.is_empty()).then_some(0))?;
    let device = &fails.devices[index];
    let over_bytes = over(index).max(0) as u64;
    let before = fitting.and_then(|f| f.devices.iter().find(|d| d.id == device.id));
    let grew = |p: Part| device.components.get(p) as i128 - before.map_or(0, |b| b.components.get(p) as i128);
    let tensors = Part::ALL.iter().copied().filter(|&p| p != Part::Overhead);
    let component = if over_bytes == 0 {
        // Within memory, yet refused: the engine's own check (vLLM's KV cache for one sequence).
        Part::KvCache
    } else {
        tensors.max_by_key(|&p| (grew(p), std::cmp::Reverse(p))).unwrap_or(Part::Weights)
    };
    Some(Binding {
        device: device.id,
        name: device.name.clone(),
        at: device.peak_at.clone(),
        component,
        grew: before.is_some() && over_bytes > 0,
        over_bytes,
    })
}

/// `workload` replayed on `hardware` with the device map `map` (a fitting neighbour's), judged
/// as [`probe`] judges: where a solved plan proves a configuration does not fit, this shows
/// where the neighbour's own map runs out.
pub(crate) fn replay_on_map(
    question: &Question,
    hardware: &HardwareProfile,
    workload: &Workload,
    map: &[(String, Target)],
) -> Result<Fit, InputError> {
    let placement = Placement::from_entries(map.to_vec());
    let headroom = question.request.headroom;
    let estimate = estimate_within(question.model, hardware, workload, &placement, headroom)?;
    Ok(fit_of(estimate.devices, headroom, None, false))
}

fn optional_map<S: serde::Serializer>(map: &Option<Vec<(String, Target)>>, s: S) -> Result<S::Ok, S::Error> {
    match map {
        Some(entries) => crate::plan::ordered_map(entries, s),
        None => s.serialize_none(),
    }
}
