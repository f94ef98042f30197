//! Sweeps: [`grid`] probes every point of two or three axes (batch, sequence, quantization, KV
//! dtype, hardware), split over the machine's cores; [`frontier`] keeps the trade-offs: for every
//! weight quantization × KV dtype × GPU count × offload choice and every sequence length of a
//! doubling ladder, the largest batch that fits, and of those points the ones no other point
//! beats on every axis at once (larger batch, longer sequence, more precise weights and KV cache,
//! fewer GPUs, no offload).

use super::queries::{max_batch, quant_candidates};
use super::{Binding, Prober, Question, binding, fp8_capable, out_of_time, with_quant};
use crate::build::Request;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::{DType, InputError};
use vramplan_sim::workload::{Engine, Mode, Quant, Workload};

/// One value of one axis.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "axis", content = "value")]
pub enum AxisValue {
    /// `--batch`.
    Batch(u64),
    /// `--seq` (llama.cpp's `-c` follows it).
    Seq(u64),
    /// `--quant` (`none` is the model's dtype).
    Quant(Quant),
    /// `--kv-dtype`.
    KvDtype(DType),
    /// `--hardware`, as given.
    Hardware(String),
}

/// An axis: its values in the order given.
pub type Axis = Vec<AxisValue>;

/// One point of a grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridPoint {
    /// The point's value on each axis, in the axes' order.
    pub at: Vec<AxisValue>,
    /// Whether it fits.
    pub fits: bool,
    /// The largest device-used figure.
    pub peak_bytes: u64,
    /// The largest peak reserved over its limit.
    pub utilisation: f64,
    /// Where it does not fit: the GPU, moment and largest component of the peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<Binding>,
    /// The runtime refuses the point (why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Not answered: no plan was found and none was proven impossible before the what-if's time
    /// limit (`fits` is then false without a proof).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unanswered: bool,
}

/// A grid's points, the first axis varying slowest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grid {
    /// The points.
    pub points: Vec<GridPoint>,
}

/// Probes every point of `axes` (the question's workload and hardware elsewhere); `progress` is
/// told each point done (from any thread).
pub fn grid(
    question: &Question,
    axes: &[Axis],
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Grid, InputError> {
    // Every hardware of the axes, loaded once.
    let mut profiles: BTreeMap<String, HardwareProfile> = BTreeMap::new();
    for value in axes.iter().flatten() {
        if let AxisValue::Hardware(spec) = value
            && !profiles.contains_key(spec)
        {
            profiles.insert(spec.clone(), hardware::load(spec)?);
        }
    }
    let total: usize = axes.iter().map(|a| a.len()).product();
    // Points that differ only in batch and sequence share a configuration (hardware,
    // quantization, KV dtype), probed by one prober: each configuration resolved once.
    let shape_axis =
        |axis: &Axis| axis.first().is_some_and(|v| matches!(v, AxisValue::Batch(_) | AxisValue::Seq(_)));
    let every_axis: Vec<usize> = (0..axes.len()).collect();
    let configuration_axes: Vec<usize> =
        every_axis.iter().copied().filter(|&a| !shape_axis(&axes[a])).collect();
    // Number `index` written in the mixed radix of the axes `of` (the first varies slowest):
    // the index of its value on each.
    let digits = |mut index: usize, of: &[usize]| -> Vec<usize> {
        let mut digits = vec![0; of.len()];
        for (digit, &a) in digits.iter_mut().zip(of).rev() {
            *digit = index % axes[a].len();
            index /= axes[a].len();
        }
        digits
    };
    let configurations: usize = configuration_axes.iter().map(|&a| axes[a].len()).product();
    let bases: Vec<(&HardwareProfile, Workload)> = (0..configurations)
        .map(|c| {
            let mut workload = question.workload.clone();
            let mut hw = question.hardware;
            for (&a, d) in configuration_axes.iter().zip(digits(c, &configuration_axes)) {
                match &axes[a][d] {
                    AxisValue::Hardware(spec) => hw = &profiles[spec],
                    other => workload = apply(&workload, other),
                }
            }
            (hw, workload)
        })
        .collect();
    let probers: Vec<Prober> = bases.iter().map(|(hw, w)| Prober::new(*question, hw, w)).collect();
    let point = |index: usize| -> GridPoint {
        let digits = digits(index, &every_axis);
        let configuration = configuration_axes.iter().fold(0, |c, &a| c * axes[a].len() + digits[a]);
        let mut workload = bases[configuration].1.clone();
        for (a, axis) in axes.iter().enumerate().filter(|(_, axis)| shape_axis(axis)) {
            workload = apply(&workload, &axis[digits[a]]);
        }
        let at: Vec<AxisValue> = axes.iter().zip(&digits).map(|(axis, &d)| axis[d].clone()).collect();
        let point = match probers[configuration].probe(&workload) {
            Ok(fit) => GridPoint {
                fits: fit.fits,
                peak_bytes: fit.peak_bytes,
                utilisation: fit.utilisation,
                binding: if fit.fits || !fit.proven { None } else { binding(None, &fit) },
                refused: None,
                unanswered: !fit.fits && !fit.proven,
                at,
            },
            Err(e) => GridPoint {
                at,
                fits: false,
                peak_bytes: 0,
                utilisation: 0.0,
                binding: None,
                refused: Some(e.to_string()),
                unanswered: false,
            },
        };
        progress(1);
        point
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(total.max(1));
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, GridPoint)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            break mine;
                        }
                        mine.push((i, point(i)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    Ok(Grid { points: done.into_iter().map(|(_, p)| p).collect() })
}

/// `workload` with one axis value set.
fn apply(workload: &Workload, value: &AxisValue) -> Workload {
    let mut w = workload.clone();
    match value {
        AxisValue::Batch(b) => w.batch = *b,
        AxisValue::Seq(s) => {
            w.seq = *s;
            w.prompt = w.prompt.map(|p| p.min(*s));
            if let Engine::LlamaCpp { n_ubatch, .. } = w.engine {
                w.engine = Engine::LlamaCpp { n_ctx: *s, n_ubatch };
            }
        }
        AxisValue::Quant(q) => w = with_quant(&w, q.clone()).0,
        AxisValue::KvDtype(d) => w.kv_dtype = Some(*d),
        AxisValue::Hardware(_) => {}
    }
    w
}

/// One point of the frontier: the largest batch at one sequence length for one choice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrontierPoint {
    /// Tokens per sequence.
    pub seq: u64,
    /// The largest batch that fits.
    pub batch: u64,
    /// The weights' quantization.
    pub quant: Quant,
    /// The KV cache's dtype (inference); `None` for the compute dtype.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<DType>,
    /// GPUs of the hardware used.
    pub gpus: u64,
    /// Layers may be offloaded to the CPU (inference under accelerate).
    pub offload: bool,
    /// The largest device-used figure.
    pub peak_bytes: u64,
    /// What stops one more sequence.
    pub binding: Option<Binding>,
}

/// The points no other point beats.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Frontier {
    /// The Pareto set, by quantization, KV dtype, GPUs, offload, then sequence.
    pub points: Vec<FrontierPoint>,
    /// Points found before the Pareto filter.
    pub candidates: usize,
    /// Every configuration was searched; false where the time limit stopped the search first
    /// (the points are those of the configurations searched by then, and a point a later one
    /// would have beaten may be among them).
    pub complete: bool,
}

/// The trade-off set over batch × sequence × weight quantization × KV dtype × GPU count ×
/// offload, on the question's hardware (counts: 1, 2, 4 … up to its GPUs, each the first GPUs of
/// it; the count only varies for profiles of one GPU kind).
pub fn frontier(question: &Question) -> Result<Frontier, InputError> {
    let w = question.workload;
    let inference = w.mode == Mode::Inference;
    let transformers = matches!(w.engine, Engine::Transformers);
    // A precision the runtime refuses gives no point (its first search fails).
    let quants = quant_candidates(question);
    let mut kvs: Vec<Option<DType>> = vec![None];
    if inference && fp8_capable(question.hardware) && !matches!(w.engine, Engine::LlamaCpp { .. }) {
        kvs.push(Some(DType::F8E4M3));
    }
    let total = question.hardware.devices.len() as u64;
    let kind = question.hardware.devices.first().and_then(|d| d.model.clone());
    let one_kind = question.hardware.devices.iter().all(|d| d.model == kind);
    // Each count's profile, loaded once: the first GPUs of the question's kind.
    let mut counts: Vec<(u64, Cow<HardwareProfile>)> = Vec::new();
    if let (true, Some(kind)) = (one_kind, &kind) {
        // A short form counts at most 1,024 GPUs (docs/limits.md): a profile at the bounds
        // (4,096 GPUs) gets its smaller counts up to that, then its own.
        for n in std::iter::successors(Some(1u64), |n| Some(n * 2)).take_while(|&n| n < total && n <= 1024) {
            counts.push((n, Cow::Owned(hardware::load(&format!("{n}x{kind}"))?)));
        }
    }
    counts.push((total, Cow::Borrowed(question.hardware)));
    let offloads: Vec<bool> = if inference && transformers { vec![false, true] } else { vec![false] };
    let positions = question.model.facts.max_positions;
    let top = if positions > 0 { positions } else { 1 << 17 };
    let seqs: Vec<u64> = std::iter::successors(Some(256u64.min(top)), |s| Some(s * 2))
        .take_while(|&s| s < top)
        .chain(std::iter::once(top))
        .collect();
    let mut candidates = Vec::new();
    let mut complete = true;
    'search: for quant in &quants {
        for &kv in &kvs {
            for (gpus, hw) in &counts {
                let (gpus, hw) = (*gpus, hw.as_ref());
                for &offload in &offloads {
                    let request = Request { offload, ..question.request.clone() };
                    let mut start = w.batch;
                    for &seq in &seqs {
                        if out_of_time(question.request) {
                            complete = false;
                            break 'search;
                        }
                        let base = apply(&apply(w, &AxisValue::Quant(quant.clone())), &AxisValue::Seq(seq));
                        let workload = Workload { kv_dtype: kv.or(base.kv_dtype), batch: start, ..base };
                        let q =
                            Question { hardware: hw, workload: &workload, request: &request, ..*question };
                        let Ok(found) = max_batch(&q) else { break };
                        let (Some(batch), Some(fit)) = (found.value, &found.fit) else { break };
                        candidates.push(FrontierPoint {
                            seq,
                            batch,
                            quant: quant.clone(),
                            kv_dtype: kv,
                            gpus,
                            offload,
                            peak_bytes: fit.peak_bytes,
                            binding: found.binding.clone(),
                        });
                        start = batch;
                    }
                }
            }
        }
    }
    let rank = |q: &Quant| quants.iter().position(|x| x == q).unwrap_or(usize::MAX);
    let kv_rank = |k: Option<DType>| kvs.iter().position(|x| *x == k).unwrap_or(usize::MAX);
    // `a` is at least as good as `b` on every axis, and better on one.
    let beats = |a: &FrontierPoint, b: &FrontierPoint| {
        let at_least = a.batch >= b.batch
            && a.seq >= b.seq
            && rank(&a.quant) <= rank(&b.quant)
            && kv_rank(a.kv_dtype) <= kv_rank(b.kv_dtype)
            && a.gpus <= b.gpus
            && (!a.offload || b.offload);
        let better = a.batch > b.batch
            || a.seq > b.seq
            || rank(&a.quant) < rank(&b.quant)
            || kv_rank(a.kv_dtype) < kv_rank(b.kv_dtype)
            || a.gpus < b.gpus
            || (!a.offload && b.offload);
        at_least && better
    };
    let count = candidates.len();
    let points: Vec<FrontierPoint> =
        candidates.iter().filter(|b| !candidates.iter().any(|a| beats(a, b))).cloned().collect();
    Ok(Frontier { points, candidates: count, complete })
}
