//! `vramplan whatif QUERY MODEL --hardware HW [WORKLOAD] [--json|--csv]`: the query and its
//! options as a `vramplan-api` request; prints the answer. Exit 0 when the query has an answer
//! (something fits), 1 when nothing does (proven by simulation), 4 when `--time-limit` (60 s
//! unless given) was reached first (the answer found by then is printed).
//!
//! `grid` takes its axes as the workload flags with a range or a list for a value (`--batch
//! 1..128`, `--seq 512..32768`, `--quant none,int8,nf4`, `--hardware t4,t4x2`); those values are
//! moved to the grid's own options before clap reads the line ([`grid_axis_args`]), so that the
//! workload flags keep their types everywhere else.

use crate::estimate::Inputs;
use clap::{Args, ValueEnum};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::OnceLock;
use vramplan_api::{InputError, WhatifAnswer, WhatifRequest};

#[derive(Copy, Clone, Debug, PartialEq, ValueEnum)]
pub(crate) enum Query {
    /// The largest batch that fits.
    MaxBatch,
    /// The longest sequence (training length, inference context) that fits.
    MaxSeq,
    /// Sequences of `--seq` tokens served at once, per engine, with the KV capacity.
    MaxConcurrency,
    /// The fewest GPUs of the profile's kind (or `--gpu`) that fit, with the plan.
    MinGpus,
    /// The cheapest profile of `--hardware LIST` (or `all`) that fits, by price per GPU-hour.
    Cheapest,
    /// The highest weight precision that fits.
    BestQuant,
    /// The trade-offs over batch × sequence × quantization × KV dtype × GPUs × offload.
    Frontier,
    /// Every point of two or three axes (`--batch 1..128 --seq 512..4096 --quant none,nf4`).
    Grid,
}

impl Query {
    /// The API's query.
    fn query(self) -> vramplan_api::Query {
        match self {
            Query::MaxBatch => vramplan_api::Query::MaxBatch,
            Query::MaxSeq => vramplan_api::Query::MaxSeq,
            Query::MaxConcurrency => vramplan_api::Query::MaxConcurrency,
            Query::MinGpus => vramplan_api::Query::MinGpus,
            Query::Cheapest => vramplan_api::Query::Cheapest,
            Query::BestQuant => vramplan_api::Query::BestQuant,
            Query::Frontier => vramplan_api::Query::Frontier,
            Query::Grid => vramplan_api::Query::Grid,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct WhatifArgs {
    /// max-batch | max-seq | max-concurrency | min-gpus | cheapest | best-quant | frontier | grid
    #[arg(value_enum)]
    query: Query,
    #[command(flatten)]
    inputs: Inputs,
    /// Share of each GPU's usable memory kept free, as `vramplan plan --headroom` (default 0: the
    /// boundary as `vramplan estimate` judges it).
    #[arg(long, default_value = "0")]
    headroom: String,
    /// The runtime plans are made for where one copy of the model spans several GPUs.
    #[arg(long, default_value = "accelerate")]
    target: String,
    /// Let plans put layers on the CPU and disk (inference under accelerate); by default
    /// everything stays on the GPUs.
    #[arg(long)]
    offload: bool,
    /// max-seq: search past the model's positions (`max_position_embeddings`).
    #[arg(long)]
    past_positions: bool,
    /// min-gpus: the GPU kind to count (a catalog key, `t4`); default the profile's first GPU.
    #[arg(long)]
    gpu: Option<String>,
    /// cheapest: a price table shaped like the built-in one (catalog/hardware/prices.yaml).
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV instead of a table.
    #[arg(long)]
    csv: bool,
    /// Bound the query to this many seconds: each plan a probe solves gets what is left, the
    /// frontier stops where it stands; an answer the limit cut short is printed as it is, with
    /// exit 4.
    #[arg(long, value_name = "SECONDS", default_value_t = vramplan_api::DEFAULT_TIME_LIMIT_S)]
    time_limit: f64,
    #[command(flatten)]
    axes: GridAxes,
}

/// A grid's axes, as [`grid_axis_args`] moves them from the workload flags.
#[derive(Args, Debug)]
pub(crate) struct GridAxes {
    #[arg(long = "grid-batch", hide = true)]
    grid_batch: Option<String>,
    #[arg(long = "grid-seq", hide = true)]
    grid_seq: Option<String>,
    #[arg(long = "grid-quant", hide = true)]
    grid_quant: Option<String>,
    #[arg(long = "grid-kv-dtype", hide = true)]
    grid_kv_dtype: Option<String>,
}

impl GridAxes {
    /// The API's axes.
    pub(crate) fn request(&self) -> vramplan_api::GridAxes {
        vramplan_api::GridAxes {
            batch: self.grid_batch.clone(),
            seq: self.grid_seq.clone(),
            quant: self.grid_quant.clone(),
            kv_dtype: self.grid_kv_dtype.clone(),
        }
    }
}

/// The workload flags a grid axis may take, and the grid option each moves to.
const AXIS_FLAGS: [(&str, &str); 4] = [
    ("--batch", "--grid-batch"),
    ("--seq", "--grid-seq"),
    ("--quant", "--grid-quant"),
    ("--kv-dtype", "--grid-kv-dtype"),
];

/// For `whatif grid`, `plot sweep` and `plot grid`: moves `--batch 1..128` (a range or a list for a
/// value) to `--grid-batch 1..128`, and likewise `--seq`, `--quant`, `--kv-dtype`; every other
/// argument is left as it is.
pub(crate) fn grid_axis_args(args: Vec<OsString>) -> Vec<OsString> {
    let word = |i: usize, w: &str| args.get(i).is_some_and(|a| a == w);
    let is_grid =
        (word(1, "whatif") && word(2, "grid")) || (word(1, "plot") && (word(2, "sweep") || word(2, "grid")));
    if !is_grid {
        return args;
    }
    let axis_value = |v: &str| v.contains("..") || v.contains(',');
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].to_string_lossy().into_owned();
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        if let Some((_, grid)) = AXIS_FLAGS.iter().find(|(f, _)| *f == flag) {
            let value = inline.clone().or_else(|| args.get(i + 1).map(|v| v.to_string_lossy().into_owned()));
            if let Some(value) = value.filter(|v| axis_value(v)) {
                out.push(OsString::from(*grid));
                out.push(OsString::from(value));
                i += if inline.is_some() { 1 } else { 2 };
                continue;
            }
        }
        out.push(args[i].clone());
        i += 1;
    }
    out
}

/// Runs `vramplan whatif`.
pub(crate) fn run(args: &WhatifArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    if args.csv && !matches!(args.query, Query::Grid | Query::Frontier) {
        return Err(InputError::new("--csv", "CSV is for the tables of `grid` and `frontier`")
            .with_fix("use --json for this query, or leave --csv out"));
    }
    let request = WhatifRequest {
        query: args.query.query(),
        inputs: args.inputs.request(),
        headroom: args.headroom.clone(),
        target: args.target.clone(),
        offload: args.offload,
        past_positions: args.past_positions,
        gpu: args.gpu.clone(),
        prices: args.prices.clone(),
        axes: args.axes.request(),
        time_limit: Some(args.time_limit),
    };
    let bar = Progress::default();
    let result = vramplan_api::whatif_with_progress(&request, &|done, total| bar.advance(done, total));
    bar.finish();
    let result = result?;
    let text = if args.csv {
        match &result.answer {
            WhatifAnswer::Grid(a) => vramplan_reports::grid_csv(a),
            WhatifAnswer::Frontier(a) => vramplan_reports::frontier_csv(a),
            _ => String::new(),
        }
    } else if args.json {
        result.to_json()
    } else {
        let text = match &result.answer {
            WhatifAnswer::MaxBatch(a) | WhatifAnswer::MaxSeq(a) => vramplan_reports::largest_text(a),
            WhatifAnswer::MaxConcurrency(a) => vramplan_reports::concurrency_text(a),
            WhatifAnswer::MinGpus(a) => vramplan_reports::fewest_text(a),
            WhatifAnswer::BestQuant(a) => vramplan_reports::quant_text(a),
            WhatifAnswer::Cheapest { answer, currency } => vramplan_reports::cheapest_text(answer, currency),
            WhatifAnswer::Frontier(a) => vramplan_reports::frontier_text(a),
            WhatifAnswer::Grid(a) => vramplan_reports::grid_text(a),
        };
        // A generic model says so (and its measured error) above the answer, as estimate and
        // plan do.
        let text = vramplan_profiles::model::generic::line(&result.model) + &text;
        match result.time_limit_reached {
            Some(limit) => format!(
                "{text}\nThe time limit ({limit} s, --time-limit) was reached first: this is what was found by then.\n"
            ),
            None => text,
        }
    };
    crate::print(out, &text)?;
    Ok(result.outcome().exit_code())
}

/// A progress bar on stderr for a grid's points, made when the API says how many there are:
/// shown when stderr is a terminal and there is more than one point.
#[derive(Default)]
pub(crate) struct Progress(OnceLock<indicatif::ProgressBar>);

impl Progress {
    /// `done` more points of `total`.
    pub(crate) fn advance(&self, done: u64, total: u64) {
        let bar = self.0.get_or_init(|| {
            if std::io::stderr().is_terminal() && total > 1 {
                indicatif::ProgressBar::new(total)
            } else {
                indicatif::ProgressBar::hidden()
            }
        });
        bar.inc(done);
    }

    /// Clears the bar, if there was one.
    pub(crate) fn finish(&self) {
        if let Some(bar) = self.0.get() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_grid_values_move() {
        let line = |s: &str| s.split(' ').map(OsString::from).collect::<Vec<_>>();
        let moved = grid_axis_args(line(
            "vramplan whatif grid m --batch 1..8 --seq=512,1024 --quant nf4 --hardware t4",
        ));
        assert_eq!(
            moved,
            line("vramplan whatif grid m --grid-batch 1..8 --grid-seq 512,1024 --quant nf4 --hardware t4")
        );
        let kept = line("vramplan whatif max-batch m --batch 1..8");
        assert_eq!(grid_axis_args(kept.clone()), kept);
    }
}
