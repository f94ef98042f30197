//! `whatif`: capacity planning backwards. Reads the inputs and the question's options, and asks
//! `vramplan_solver::whatif` one of its queries ([`Query`]); a grid's axes are the workload
//! flags' values as ranges or lists (`1..128`, `512..4096+512`, `none,nf4`), read here
//! ([`grid_axes`]).

use crate::inputs::{Inputs, Loaded};
use crate::shares::parse_headroom;
use crate::{InputError, Outcome};
use std::path::PathBuf;
use vramplan_profiles::DType;
use vramplan_profiles::hardware::{self, Prices};
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::workload::Quant;
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::whatif::{
    self, Axis, AxisValue, Cheapest, Concurrency, Fewest, Frontier, Grid, Largest, QuantChoice, Question,
};

/// The question `whatif` answers.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Query {
    /// The largest batch that fits.
    #[default]
    MaxBatch,
    /// The longest sequence (training length, inference context) that fits.
    MaxSeq,
    /// Sequences of the workload's length served at once, per engine, with the KV capacity.
    MaxConcurrency,
    /// The fewest GPUs of the profile's kind (or [`WhatifRequest::gpu`]) that fit, with the plan.
    MinGpus,
    /// The cheapest profile of the hardware list (or `all`) that fits, by price per GPU-hour.
    Cheapest,
    /// The highest weight precision that fits.
    BestQuant,
    /// The trade-offs over batch × sequence × quantization × KV dtype × GPUs × offload.
    Frontier,
    /// Every point of two or three axes ([`WhatifRequest::axes`]).
    Grid,
}

impl Query {
    /// Every query, with its name on the command line.
    pub const ALL: [(Query, &'static str); 8] = [
        (Query::MaxBatch, "max-batch"),
        (Query::MaxSeq, "max-seq"),
        (Query::MaxConcurrency, "max-concurrency"),
        (Query::MinGpus, "min-gpus"),
        (Query::Cheapest, "cheapest"),
        (Query::BestQuant, "best-quant"),
        (Query::Frontier, "frontier"),
        (Query::Grid, "grid"),
    ];

    /// The query named `name` (`max-batch`, …).
    pub fn parse(name: &str) -> Result<Query, InputError> {
        Query::ALL.iter().find(|(_, n)| *n == name).map(|(q, _)| *q).ok_or_else(|| {
            let names: Vec<&str> = Query::ALL.iter().map(|(_, n)| *n).collect();
            InputError::new("whatif", format!("unknown query `{name}`"))
                .with_fix(format!("ask one of: {}", names.join(", ")))
        })
    }
}

/// A grid's axes as the flags write them: a range (`1..128` doubling, `128..4096+128` in steps)
/// or a list (`1,2,8`; `none,nf4` for the quantization).
#[derive(Debug, Clone, Default)]
pub struct GridAxes {
    /// The batch axis.
    pub batch: Option<String>,
    /// The sequence-length axis.
    pub seq: Option<String>,
    /// The quantization axis (`none,int8,nf4`).
    pub quant: Option<String>,
    /// The KV-cache dtype axis (`bf16,fp8`).
    pub kv_dtype: Option<String>,
}

impl GridAxes {
    /// Whether any axis was given.
    pub fn given(&self) -> bool {
        self.batch.is_some() || self.seq.is_some() || self.quant.is_some() || self.kv_dtype.is_some()
    }
}

/// What `whatif` reads.
#[derive(Debug, Clone)]
pub struct WhatifRequest {
    /// The question.
    pub query: Query,
    /// The model, hardware (a comma list or `all` for `cheapest` and `grid`) and workload.
    pub inputs: Inputs,
    /// Share of each GPU's usable memory kept free, as `plan`'s headroom (default `0`: the
    /// boundary as `estimate` judges it).
    pub headroom: String,
    /// The runtime plans are made for where one copy of the model spans several GPUs.
    pub target: String,
    /// Let plans put layers on the CPU and disk; by default everything stays on the GPUs.
    pub offload: bool,
    /// max-seq: search past the model's positions (`max_position_embeddings`).
    pub past_positions: bool,
    /// min-gpus: the GPU kind to count (a catalog key, `t4`); default the profile's first GPU.
    pub gpu: Option<String>,
    /// cheapest: a price table shaped like the built-in one (catalog/hardware/prices.yaml).
    pub prices: Option<PathBuf>,
    /// grid: the axes.
    pub axes: GridAxes,
    /// Seconds the query may take ([`crate::DEFAULT_TIME_LIMIT_S`] by default; `None` for no
    /// limit): each plan a probe solves gets what is left, the frontier stops where it stands,
    /// and an answer given once the time is up is printed as it is with exit 4.
    pub time_limit: Option<f64>,
}

impl Default for WhatifRequest {
    fn default() -> WhatifRequest {
        WhatifRequest {
            query: Query::default(),
            inputs: Inputs::default(),
            headroom: "0".into(),
            target: "accelerate".into(),
            offload: false,
            past_positions: false,
            gpu: None,
            prices: None,
            axes: GridAxes::default(),
            time_limit: Some(crate::DEFAULT_TIME_LIMIT_S),
        }
    }
}

/// A query's answer.
#[derive(Debug, Clone)]
pub enum WhatifAnswer {
    /// The largest batch.
    MaxBatch(Largest),
    /// The longest sequence.
    MaxSeq(Largest),
    /// Sequences served at once, per engine.
    MaxConcurrency(Vec<Concurrency>),
    /// The fewest GPUs.
    MinGpus(Fewest),
    /// The cheapest profile, with the price table's currency.
    Cheapest {
        /// The answer.
        answer: Cheapest,
        /// The prices' currency (`USD`).
        currency: String,
    },
    /// Each precision, and whether it fits.
    BestQuant(Vec<QuantChoice>),
    /// The trade-offs.
    Frontier(Frontier),
    /// Every point of the grid.
    Grid(Grid),
}

/// `whatif`'s answer, and the model it is about.
#[derive(Debug, Clone)]
pub struct WhatifResult {
    /// The model as read (a generic model's answers carry its label).
    pub model: ModelDescription,
    /// The answer.
    pub answer: WhatifAnswer,
    /// The time limit the query ran under, where it was reached before the answer was complete:
    /// the answer is what was found by then (exit 4).
    pub time_limit_reached: Option<f64>,
}

impl WhatifResult {
    /// Whether the query has an answer (something fits).
    pub fn found(&self) -> bool {
        match &self.answer {
            WhatifAnswer::MaxBatch(a) | WhatifAnswer::MaxSeq(a) => a.value.is_some(),
            WhatifAnswer::MaxConcurrency(a) => a.iter().any(|c| c.sequences.is_some()),
            WhatifAnswer::MinGpus(a) => a.gpus.is_some(),
            WhatifAnswer::Cheapest { answer, .. } => answer.answer.is_some(),
            WhatifAnswer::BestQuant(a) => a.iter().any(|c| c.fit.as_ref().is_some_and(|f| f.fits)),
            WhatifAnswer::Frontier(a) => !a.points.is_empty(),
            WhatifAnswer::Grid(a) => a.points.iter().any(|p| p.fits),
        }
    }

    /// Something fits, or nothing does (proven by simulation); no answer either way where the
    /// time limit was reached first.
    pub fn outcome(&self) -> Outcome {
        if self.time_limit_reached.is_some() { Outcome::NoAnswer } else { Outcome::of(self.found()) }
    }

    /// What `whatif --json` prints: the answer, and a generic model's label as a `generic`
    /// field beside it.
    pub fn to_json(&self) -> String {
        let text = match &self.answer {
            WhatifAnswer::MaxBatch(a) | WhatifAnswer::MaxSeq(a) => crate::json_text(a),
            WhatifAnswer::MaxConcurrency(a) => crate::json_text(a),
            WhatifAnswer::MinGpus(a) => crate::json_text(a),
            WhatifAnswer::Cheapest { answer, .. } => crate::json_text(answer),
            WhatifAnswer::BestQuant(a) => crate::json_text(a),
            WhatifAnswer::Frontier(a) => crate::json_text(a),
            WhatifAnswer::Grid(a) => crate::json_text(a),
        };
        let text = match (serde_json::from_str::<serde_json::Value>(&text), self.time_limit_reached) {
            // An answer cut short says so beside it: the limit in seconds.
            (Ok(serde_json::Value::Object(mut object)), Some(limit)) => {
                object.insert("time_limit_reached".into(), serde_json::json!(limit));
                crate::json_text(&object)
            }
            _ => text,
        };
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(value) if vramplan_profiles::model::generic::of(&self.model).is_some() => {
                crate::json_labelled(&value, &self.model)
            }
            _ => text,
        }
    }
}

/// `vramplan whatif`.
pub fn whatif(request: &WhatifRequest) -> Result<WhatifResult, InputError> {
    whatif_with_progress(request, &|_, _| {})
}

/// As [`whatif()`], calling `progress(points_done, total)` as a grid's points are done (first
/// with 0 done, then with each batch of points finished).
pub fn whatif_with_progress(
    request: &WhatifRequest,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<WhatifResult, InputError> {
    let runtime = Runtime::parse(&request.target)?;
    let specs = hardware_list(&request.inputs.hardware)?;
    let many = specs.len() > 1;
    if many && !matches!(request.query, Query::Cheapest | Query::Grid) {
        return Err(InputError::new("--hardware", "a list of profiles is for `cheapest` and `grid`")
            .with_fix("give one profile, e.g. `--hardware t4x2`"));
    }
    let Loaded { model, hardware, workload, .. } =
        request.inputs.load_on(runtime.naming(), None, &specs[0])?;
    if let Some(limit) = request.time_limit
        && !(limit > 0.0 && limit.is_finite())
    {
        return Err(InputError::new("--time-limit", format!("{limit} is not a positive number of seconds"))
            .with_fix("give seconds, e.g. `--time-limit 60`"));
    }
    let mut solve = Request::new(runtime);
    solve.headroom = parse_headroom(&request.headroom)?;
    solve.offload = request.offload;
    solve.deadline = vramplan_solver::plan::deadline_after(request.time_limit);
    let question = Question { model: &model, hardware: &hardware, workload: &workload, request: &solve };
    let answer = match request.query {
        Query::MaxBatch => WhatifAnswer::MaxBatch(whatif::max_batch(&question)?),
        Query::MaxSeq => WhatifAnswer::MaxSeq(whatif::max_seq(&question, request.past_positions)?),
        Query::MaxConcurrency => {
            WhatifAnswer::MaxConcurrency(whatif::max_concurrency(&question, workload.seq))
        }
        Query::MinGpus => WhatifAnswer::MinGpus(whatif::min_gpus(&question, request.gpu.as_deref())?),
        Query::BestQuant => WhatifAnswer::BestQuant(whatif::best_quant(&question)),
        Query::Cheapest => {
            let prices = match &request.prices {
                Some(path) => Prices::from_file(path)?,
                None => Prices::builtin()?,
            };
            let answer = whatif::cheapest(&question, &specs, &prices)?;
            WhatifAnswer::Cheapest { answer, currency: prices.currency.clone() }
        }
        Query::Frontier => WhatifAnswer::Frontier(whatif::frontier(&question)?),
        Query::Grid => {
            let axes = grid_axes(&request.axes, &specs, "whatif grid")?;
            WhatifAnswer::Grid(grid(&question, &axes, progress)?)
        }
    };
    // Past the deadline, the probes' plans had no time left: the answer is what was found.
    let reached = vramplan_solver::whatif::out_of_time(&solve);
    let time_limit_reached = request.time_limit.filter(|_| reached);
    Ok(WhatifResult { model, answer, time_limit_reached })
}

/// `whatif::grid` over `axes`, with `progress` told the total first.
pub(crate) fn grid(
    question: &Question,
    axes: &[Axis],
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Grid, InputError> {
    let total = axes.iter().map(Vec::len).product::<usize>() as u64;
    progress(0, total);
    whatif::grid(question, axes, &|n| progress(n as u64, total))
}

/// The hardware as `whatif` takes it: one profile, a comma list, or `all` (every built-in
/// profile).
pub fn hardware_list(text: &str) -> Result<Vec<String>, InputError> {
    if text.trim() == "all" {
        return Ok(hardware::builtin_names().into_iter().map(String::from).collect());
    }
    let specs: Vec<String> = text.split(',').map(|s| s.trim().to_string()).collect();
    if specs.iter().any(String::is_empty) {
        return Err(InputError::new("--hardware", format!("`{text}` has an empty profile in its list"))
            .with_fix("separate profiles with single commas: `--hardware t4,t4x2,rtx4090`"));
    }
    Ok(specs)
}

/// The grid's axes, in the order batch, seq, quant, kv dtype, hardware; at least one
/// (`command` names the command in the message when there is none).
pub fn grid_axes(args: &GridAxes, specs: &[String], command: &str) -> Result<Vec<Axis>, InputError> {
    let mut axes: Vec<Axis> = Vec::new();
    if let Some(text) = &args.batch {
        axes.push(numbers("--batch", text)?.into_iter().map(AxisValue::Batch).collect());
    }
    if let Some(text) = &args.seq {
        axes.push(numbers("--seq", text)?.into_iter().map(AxisValue::Seq).collect());
    }
    if let Some(text) = &args.quant {
        let quants: Result<Vec<Quant>, InputError> =
            text.split(',').map(|q| vramplan_sim::input::parse_quant(q, &Quant::None)).collect();
        axes.push(quants?.into_iter().map(AxisValue::Quant).collect());
    }
    if let Some(text) = &args.kv_dtype {
        let dtypes: Result<Vec<DType>, InputError> =
            text.split(',').map(|d| DType::parse_input("--kv-dtype", d.trim())).collect();
        axes.push(dtypes?.into_iter().map(AxisValue::KvDtype).collect());
    }
    if specs.len() > 1 {
        axes.push(specs.iter().cloned().map(AxisValue::Hardware).collect());
    }
    if axes.is_empty() {
        return Err(InputError::new(command, "no axis to sweep").with_fix(
            "give one to three axes as ranges or lists: `--batch 1..128 --seq 512..4096 --quant none,nf4 \
             --hardware t4,t4x2`",
        ));
    }
    // Each axis within its bound, their product could still be 10^15 points: refused before any
    // is probed.
    let points = axes.iter().fold(1u128, |n, axis| n.saturating_mul(axis.len() as u128));
    if points > u128::from(MAX_GRID_POINTS) {
        let sizes: Vec<String> = axes.iter().map(|a| a.len().to_string()).collect();
        return Err(InputError::new(
            command,
            format!("the axes give {} points ({}), more than {MAX_GRID_POINTS}", points, sizes.join(" × ")),
        )
        .with_fix(
            "coarsen an axis (a doubling range `1..1024`, a larger step `512..8192+1024`) or split the grid \
             into several runs",
        ));
    }
    Ok(axes)
}

/// The most points a grid (or a sweep) may have, every axis together (docs/limits.md, "Grids"):
/// each point is probed (some 3 ms for Mixtral-8x7B over two A100s, so about 30 s at the bound)
/// and listed in the answer, and a heatmap of 100 × 100 cells is as fine as one can read.
const MAX_GRID_POINTS: u64 = 10_000;

/// The most points one axis may have: the grid's bound, checked before an axis is listed.
const MAX_AXIS_POINTS: u64 = MAX_GRID_POINTS;

/// `A..B` (doubling from A, B included), `A..B+S` (steps of S), or a list `1,2,8`.
fn numbers(flag: &str, text: &str) -> Result<Vec<u64>, InputError> {
    let bad = |what: &str| {
        InputError::new(flag, format!("`{text}` {what}"))
            .with_fix("write `1..128` (doubling), `128..4096+128` (steps of 128) or a list `1,2,8`")
    };
    let number = |s: &str| s.trim().parse::<u64>().ok().filter(|&n| n > 0);
    if let Some((a, rest)) = text.split_once("..") {
        let (b, step) = match rest.split_once('+') {
            Some((b, s)) => {
                (b, Some(number(s).ok_or_else(|| bad("has a step that is not a positive whole number"))?))
            }
            None => (rest, None),
        };
        let (a, b) = (number(a), number(b));
        let (Some(a), Some(b)) = (a, b) else {
            return Err(bad("has an end that is not a positive whole number"));
        };
        if a > b {
            return Err(bad("runs backwards"));
        }
        let mut values: Vec<u64> = match step {
            // A doubling range has at most 64 points; a stepped one is bounded here.
            Some(s) => {
                let count = (b - a) / s + 1;
                if count > MAX_AXIS_POINTS {
                    return Err(bad(&format!("has {count} points, more than {MAX_AXIS_POINTS}")));
                }
                (0..count).map(|k| a + k * s).collect()
            }
            None => std::iter::successors(Some(a), |v| v.checked_mul(2)).take_while(|&v| v <= b).collect(),
        };
        if values.last() != Some(&b) {
            values.push(b);
        }
        return Ok(values);
    }
    let count = text.split(',').count() as u64;
    if count > MAX_AXIS_POINTS {
        return Err(bad(&format!("has {count} values, more than {MAX_AXIS_POINTS}")));
    }
    text.split(',')
        .map(|v| number(v).ok_or_else(|| bad("has a value that is not a positive whole number")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_lists() {
        assert_eq!(numbers("--batch", "1..128").unwrap(), vec![1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(numbers("--batch", "3..20").unwrap(), vec![3, 6, 12, 20]);
        assert_eq!(numbers("--seq", "128..512+128").unwrap(), vec![128, 256, 384, 512]);
        assert_eq!(numbers("--seq", "100..250+100").unwrap(), vec![100, 200, 250]);
        assert_eq!(numbers("--batch", "1,2,8").unwrap(), vec![1, 2, 8]);
        for bad in ["0..4", "8..4", "1..x", "1..9+0", "1,,2", "1..1000000000+1", "1..10001+1"] {
            assert!(numbers("--batch", bad).is_err(), "{bad}");
        }
    }
}
