//! `vramplan whatif QUERY MODEL --hardware HW [WORKLOAD] [--json|--csv]`: reads the inputs and
//! the query's options, asks `vramplan_solver::whatif`, and prints the answer. Exit 0 when the
//! query has an answer (something fits), 1 when nothing does (proven by simulation).
//!
//! `grid` takes its axes as the workload flags with a range or a list for a value (`--batch
//! 1..128`, `--seq 512..32768`, `--quant none,int8,nf4`, `--hardware t4,t4x2`); those values are
//! moved to the grid's own options before clap reads the line ([`grid_axis_args`]), so that the
//! workload flags keep their types everywhere else.

use crate::estimate::{Inputs, Loaded};
use clap::{Args, ValueEnum};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use vramplan_profiles::hardware::{self, Prices};
use vramplan_profiles::{DType, InputError};
use vramplan_sim::workload::Quant;
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::whatif::{self, Axis, AxisValue, Question};

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
    #[command(flatten)]
    axes: GridAxes,
}

/// A grid's axes, as [`grid_axis_args`] moves them from the workload flags.
#[derive(Args, Debug)]
pub(crate) struct GridAxes {
    #[arg(long = "grid-batch", hide = true)]
    pub grid_batch: Option<String>,
    #[arg(long = "grid-seq", hide = true)]
    pub grid_seq: Option<String>,
    #[arg(long = "grid-quant", hide = true)]
    grid_quant: Option<String>,
    #[arg(long = "grid-kv-dtype", hide = true)]
    grid_kv_dtype: Option<String>,
}

impl GridAxes {
    /// Whether any axis was given.
    pub(crate) fn given(&self) -> bool {
        self.grid_batch.is_some()
            || self.grid_seq.is_some()
            || self.grid_quant.is_some()
            || self.grid_kv_dtype.is_some()
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
    let runtime = Runtime::parse(&args.target)?;
    let specs = hardware_list(&args.inputs.hardware)?;
    let many = specs.len() > 1;
    if many && !matches!(args.query, Query::Cheapest | Query::Grid) {
        return Err(InputError::new("--hardware", "a list of profiles is for `cheapest` and `grid`")
            .with_fix("give one profile, e.g. `--hardware t4x2`"));
    }
    let Loaded { model, hardware, workload, .. } = args.inputs.load_on(runtime.naming(), None, &specs[0])?;
    let mut request = Request::new(runtime);
    request.headroom = crate::plan::parse_headroom(&args.headroom)?;
    request.offload = args.offload;
    let question = Question { model: &model, hardware: &hardware, workload: &workload, request: &request };
    if args.csv && !matches!(args.query, Query::Grid | Query::Frontier) {
        return Err(InputError::new("--csv", "CSV is for the tables of `grid` and `frontier`")
            .with_fix("use --json for this query, or leave --csv out"));
    }
    let (text, found) = match args.query {
        Query::MaxBatch => {
            let a = whatif::max_batch(&question)?;
            (render(args, &a, || vramplan_reports::largest_text(&a)), a.value.is_some())
        }
        Query::MaxSeq => {
            let a = whatif::max_seq(&question, args.past_positions)?;
            (render(args, &a, || vramplan_reports::largest_text(&a)), a.value.is_some())
        }
        Query::MaxConcurrency => {
            let a = whatif::max_concurrency(&question, workload.seq);
            let found = a.iter().any(|c| c.sequences.is_some());
            (render(args, &a, || vramplan_reports::concurrency_text(&a)), found)
        }
        Query::MinGpus => {
            let a = whatif::min_gpus(&question, args.gpu.as_deref())?;
            (render(args, &a, || vramplan_reports::fewest_text(&a)), a.gpus.is_some())
        }
        Query::BestQuant => {
            let a = whatif::best_quant(&question);
            let found = a.iter().any(|c| c.fit.as_ref().is_some_and(|f| f.fits));
            (render(args, &a, || vramplan_reports::quant_text(&a)), found)
        }
        Query::Cheapest => {
            let prices = match &args.prices {
                Some(path) => Prices::from_file(path)?,
                None => Prices::builtin()?,
            };
            let a = whatif::cheapest(&question, &specs, &prices)?;
            (render(args, &a, || vramplan_reports::cheapest_text(&a, &prices.currency)), a.answer.is_some())
        }
        Query::Frontier => {
            let a = whatif::frontier(&question)?;
            let text = if args.csv {
                vramplan_reports::frontier_csv(&a)
            } else {
                render(args, &a, || vramplan_reports::frontier_text(&a))
            };
            (text, !a.points.is_empty())
        }
        Query::Grid => {
            let axes = grid_axes(&args.axes, &specs, "whatif grid")?;
            let total: usize = axes.iter().map(Vec::len).product();
            let bar = progress_bar(total as u64);
            let a = whatif::grid(&question, &axes, &|n| bar.inc(n as u64))?;
            bar.finish_and_clear();
            let text = if args.csv {
                vramplan_reports::grid_csv(&a)
            } else {
                render(args, &a, || vramplan_reports::grid_text(&a))
            };
            (text, a.points.iter().any(|p| p.fits))
        }
    };
    // A generic model says so (and its measured error) above the answer, as estimate and plan do;
    // in JSON, as a `generic` field beside the answer's.
    let text = if args.csv {
        text
    } else if args.json {
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(value) if vramplan_profiles::model::generic::of(&model).is_some() => {
                crate::estimate::json_labelled(&value, &model)
            }
            _ => text,
        }
    } else {
        vramplan_profiles::model::generic::line(&model) + &text
    };
    crate::print(out, &text)?;
    Ok(if found { 0 } else { crate::EXIT_NEGATIVE })
}

/// The answer as JSON with `--json`, else as `text` makes it.
fn render<T: serde::Serialize>(args: &WhatifArgs, answer: &T, text: impl FnOnce() -> String) -> String {
    if args.json { crate::json_text(answer) } else { text() }
}

/// A bar on stderr when it is a terminal; hidden otherwise.
pub(crate) fn progress_bar(total: u64) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() && total > 1 {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// `--hardware`: one profile, a comma list, or `all` (every built-in profile).
pub(crate) fn hardware_list(text: &str) -> Result<Vec<String>, InputError> {
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
pub(crate) fn grid_axes(args: &GridAxes, specs: &[String], command: &str) -> Result<Vec<Axis>, InputError> {
    let mut axes: Vec<Axis> = Vec::new();
    if let Some(text) = &args.grid_batch {
        axes.push(numbers("--batch", text)?.into_iter().map(AxisValue::Batch).collect());
    }
    if let Some(text) = &args.grid_seq {
        axes.push(numbers("--seq", text)?.into_iter().map(AxisValue::Seq).collect());
    }
    if let Some(text) = &args.grid_quant {
        let quants: Result<Vec<Quant>, InputError> =
            text.split(',').map(|q| vramplan_sim::input::parse_quant(q, &Quant::None)).collect();
        axes.push(quants?.into_iter().map(AxisValue::Quant).collect());
    }
    if let Some(text) = &args.grid_kv_dtype {
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
    Ok(axes)
}

/// The most points one axis may have.
const MAX_AXIS_POINTS: u64 = 100_000;

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
        for bad in ["0..4", "8..4", "1..x", "1..9+0", "1,,2", "1..1000000000+1"] {
            assert!(numbers("--batch", bad).is_err(), "{bad}");
        }
    }

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
