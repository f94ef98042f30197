//! `vramplan plot KIND MODEL --hardware HW [WORKLOAD] [...] -o FILE.svg|FILE.png`: reads the
//! inputs as the command each kind draws from (`estimate` for `breakdown` and `timeline`,
//! `plan` for `plan`, `whatif` for `sweep` and `grid`), asks for the figures, and writes the
//! image atomically in the format of the file's extension. Prints where it wrote; exit 0.
//!
//! - `breakdown [--device-map F | --plan F] [--measured VALIDATE.json]`
//! - `timeline [--device-map F | --plan F]`, or `timeline --trace F` for a script's measured run
//!   (`vramplan validate --script --trace-out F`), with no model or hardware
//! - `plan [plan's options] [--baseline]`
//! - `sweep --batch 8..512` (or `--seq`): one axis
//! - `grid --batch 1..64 --seq 512..8192`: two axes (batch, seq, quant, kv-dtype, hardware list)

use crate::estimate::{Inputs, Loaded, MapSource, Simulated, simulate};
use crate::plan::{SolveOptions, Solved, solve};
use crate::whatif::{GridAxes, grid_axes, hardware_list, progress_bar};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use vramplan_profiles::InputError;
use vramplan_reports::plot::{
    self, Breakdown, Figure, GridFigure, ImageFormat, PlacementFigure, SweepFigure, TimelineFigure,
};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::whatif::{self, AxisValue, Quantity, Question};
use vramplan_validate::DevicePeaks;

#[derive(Copy, Clone, Debug, PartialEq, ValueEnum)]
pub(crate) enum Kind {
    /// One stacked bar per device by component at the peak, against capacity.
    Breakdown,
    /// Allocated and reserved bytes over the step's events, per device.
    Timeline,
    /// The device map: each device's units in order, against the plan's limit.
    Plan,
    /// Peak per device against batch or sequence length, with the crossing.
    Sweep,
    /// Utilisation over two axes; cells that do not fit marked.
    Grid,
}

#[derive(Args, Debug)]
pub(crate) struct PlotArgs {
    /// breakdown | timeline | plan | sweep | grid
    #[arg(value_enum)]
    kind: Kind,
    #[command(flatten)]
    inputs: Inputs,
    #[command(flatten)]
    map: MapSource,
    #[command(flatten)]
    solve: SolveOptions,
    /// breakdown: a `vramplan validate --json` result, drawn beside the prediction.
    #[arg(long, value_name = "FILE")]
    measured: Option<PathBuf>,
    /// timeline: draw the run `vramplan validate --script --trace-out FILE` measured instead
    /// (give only the kind, --trace and -o: `plot timeline --trace run.json -o run.svg`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// plan: draw accelerate's `device_map="auto"` beside the plan.
    #[arg(long)]
    baseline: bool,
    #[command(flatten)]
    axes: GridAxes,
    /// The image to write (atomically): `.svg` or `.png`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
}

/// Points per GPU a timeline keeps (each the largest of its run of operations).
pub(crate) const TIMELINE_POINTS: usize = 2000;

/// Runs `vramplan plot`.
pub(crate) fn run(args: &PlotArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let format = ImageFormat::from_path(&args.output).ok_or_else(|| {
        InputError::new("-o", format!("`{}` is neither .svg nor .png", args.output.display()))
            .with_fix("name the image `plot.svg` or `plot.png`")
    })?;
    refuse_options_of_other_kinds(args)?;
    let bytes = match args.kind {
        Kind::Breakdown => {
            let Simulated { loaded, estimate, .. } = simulate(&args.inputs, &args.map)?;
            let measured = args.measured.as_deref().map(read_measured).transpose()?;
            let figure = Breakdown {
                title: caption(&args.inputs, &loaded, "memory at the peak", None),
                devices: &estimate.devices,
                measured: measured.as_deref(),
            };
            draw(&figure, format)?
        }
        Kind::Timeline => {
            let Simulated { loaded, placement, .. } = simulate(&args.inputs, &args.map)?;
            let Loaded { model, hardware, workload, .. } = &loaded;
            let trace = vramplan_sim::trace::trace(model, hardware, workload, &placement, TIMELINE_POINTS)?;
            let title = caption(&args.inputs, &loaded, "the step over time", None);
            draw(&TimelineFigure { title, trace: &trace }, format)?
        }
        Kind::Plan => {
            let Solved { loaded, result, baseline, .. } = solve(&args.inputs, &args.solve, |_| Ok(()))?;
            let figure = PlacementFigure {
                title: caption(&args.inputs, &loaded, "device map", None),
                plan: &result,
                baseline: if args.baseline { baseline.as_ref() } else { None },
            };
            if args.baseline && baseline.is_none() {
                // The target is accelerate's already where data parallelism is what leaves no map.
                let fix = if matches!(
                    result.target,
                    vramplan_solver::Runtime::Accelerate | vramplan_solver::Runtime::AccelerateV4
                ) {
                    "leave out --baseline: every rank of a data-parallel run loads the whole model, so accelerate draws no map"
                } else {
                    "leave out --baseline, or plan for `--target accelerate`"
                };
                return Err(InputError::new(
                    "--baseline",
                    "accelerate's map is drawn for the accelerate targets of one copy of the model",
                )
                .with_fix(fix));
            }
            draw(&figure, format)?
        }
        Kind::Sweep => {
            let (loaded, request) = whatif_inputs(args)?;
            let question = question(&loaded, &request);
            let (quantity, values) = sweep_axis(args)?;
            let mut points = Vec::with_capacity(values.len());
            for value in values {
                let mut workload = loaded.workload.clone();
                match quantity {
                    Quantity::Batch => workload.batch = value,
                    _ => workload.seq = value,
                }
                points.push((value, whatif::probe(&question, &loaded.hardware, &workload)?));
            }
            let answer = match quantity {
                Quantity::Batch => whatif::max_batch(&question)?,
                _ => whatif::max_seq(&question, false)?,
            };
            let shape = match quantity {
                Quantity::Batch => format!("batch swept × {}", loaded.workload.seq),
                _ => format!("batch {} × sequence swept", loaded.workload.batch),
            };
            let title = caption(&args.inputs, &loaded, "peak against the sweep", Some(&shape));
            let figure = SweepFigure { title, points: &points, answer: &answer };
            draw(&figure, format)?
        }
        Kind::Grid => {
            let (loaded, request) = whatif_inputs(args)?;
            let specs = hardware_list(&args.inputs.hardware)?;
            let axes = grid_axes(&args.axes, &specs, "plot grid")?;
            if axes.len() != 2 {
                return Err(InputError::new("plot grid", format!("a heatmap has two axes, not {}", axes.len()))
                    .with_fix("give two of --batch, --seq, --quant, --kv-dtype and a --hardware list (`whatif grid` takes three)"));
            }
            let total: usize = axes.iter().map(Vec::len).product();
            let bar = progress_bar(total as u64);
            let grid = whatif::grid(&question(&loaded, &request), &axes, &|n| bar.inc(n as u64))?;
            bar.finish_and_clear();
            let swept = |is: fn(&AxisValue) -> bool| axes.iter().any(|a| a.first().is_some_and(is));
            let batch = if swept(|v| matches!(v, AxisValue::Batch(_))) {
                "swept".to_string()
            } else {
                loaded.workload.batch.to_string()
            };
            let seq = if swept(|v| matches!(v, AxisValue::Seq(_))) {
                "swept".to_string()
            } else {
                loaded.workload.seq.to_string()
            };
            let shape = format!("batch {batch} × sequence {seq}");
            let title = caption(&args.inputs, &loaded, "utilisation over the grid", Some(&shape));
            draw(&GridFigure { title, axes: &axes, grid: &grid }, format)?
        }
    };
    crate::write_atomic(&args.output, &bytes)?;
    crate::print(out, &format!("wrote {}", args.output.display()))
}

/// The figure as the bytes of its file.
fn draw(figure: &impl Figure, format: ImageFormat) -> Result<Vec<u8>, InputError> {
    plot::render(figure, format).map_err(|e| InputError::new("plot", e.to_string()))
}

/// The heading of a figure: what it shows, the model, the hardware and the workload (`shape`
/// in place of its batch and sequence where the figure sweeps them).
fn caption(inputs: &Inputs, loaded: &Loaded, what: &str, shape: Option<&str>) -> String {
    let words = plot::workload_words(&loaded.workload, shape);
    format!("{what} · {} on {} · {words}", loaded.model.name, inputs.hardware)
}

/// Whether the command line is `plot ... --trace FILE`: a measured run's timeline, which takes
/// no model, hardware or workload (so it has its own parser, [`TraceArgs`]).
pub(crate) fn draws_a_trace(args: &[std::ffi::OsString]) -> bool {
    args.get(1).is_some_and(|a| a == "plot")
        && args.iter().skip(2).any(|a| a == "--trace" || a.to_string_lossy().starts_with("--trace="))
}

/// `vramplan plot timeline --trace FILE -o FILE.svg|FILE.png`.
#[derive(clap::Parser, Debug)]
#[command(name = "vramplan", bin_name = "vramplan")]
pub(crate) struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(clap::Subcommand, Debug)]
enum TraceCommand {
    /// Draw the run `vramplan validate --script --trace-out FILE` measured.
    Plot(TracePlot),
}

#[derive(Args, Debug)]
struct TracePlot {
    /// timeline (the only kind a measured run draws)
    #[arg(value_enum)]
    kind: Kind,
    /// The run, as `vramplan validate --script --trace-out FILE` wrote it.
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// The image to write (atomically): `.svg` or `.png`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
}

/// Draws a measured run's timeline.
pub(crate) fn run_trace(args: &TraceArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let TraceCommand::Plot(args) = &args.command;
    if args.kind != Kind::Timeline {
        return Err(InputError::new("--trace", "a measured run draws as `plot timeline`")
            .with_fix("plot timeline --trace FILE -o FILE.svg"));
    }
    let format = ImageFormat::from_path(&args.output).ok_or_else(|| {
        InputError::new("-o", format!("`{}` is neither .svg nor .png", args.output.display()))
            .with_fix("name the image `plot.svg` or `plot.png`")
    })?;
    let file = crate::validate_script::read_trace_file(&args.trace, "--trace")?;
    let shown = args.trace.display().to_string();
    let Some(trace) = &file.trace else {
        return Err(InputError::new(&shown, "holds no run: the script's Python wrote no result")
            .at_key("trace")
            .with_fix("run `vramplan validate --script` again and look at its message"));
    };
    let script = vramplan_validate::file_name(&file.script);
    let title = format!("{script} over time, measured on fake GPUs · {} · rank {}", file.hardware, file.rank);
    let bytes = draw(&TimelineFigure { title, trace }, format)?;
    crate::write_atomic(&args.output, &bytes)?;
    crate::print(out, &format!("wrote {}", args.output.display()))
}

/// Options that only one kind reads are refused with the others, rather than ignored.
fn refuse_options_of_other_kinds(args: &PlotArgs) -> Result<(), InputError> {
    let kind = format!(
        "plot {}",
        args.kind.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
    );
    let refuse = |flag: &str, for_kinds: &str| {
        Err(InputError::new(flag, format!("{flag} is for {for_kinds}, not `{kind}`"))
            .with_fix(format!("leave out {flag}")))
    };
    if args.measured.is_some() && args.kind != Kind::Breakdown {
        return refuse("--measured", "`plot breakdown`");
    }
    if args.baseline && args.kind != Kind::Plan {
        return refuse("--baseline", "`plot plan`");
    }
    if args.map.given() && !matches!(args.kind, Kind::Breakdown | Kind::Timeline) {
        return refuse("--device-map / --plan", "`plot breakdown` and `plot timeline`");
    }
    if args.axes.given() && !matches!(args.kind, Kind::Sweep | Kind::Grid) {
        return refuse("a range or list of values", "`plot sweep` and `plot grid`");
    }
    Ok(())
}

/// The measured peaks of a `vramplan validate --json` result (`run.devices`).
fn read_measured(path: &Path) -> Result<Vec<DevicePeaks>, InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError::io(path, &e).with_fix("give the file `vramplan validate --json` wrote"))?;
    let document: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        InputError::new(path.display().to_string(), format!("not JSON: {e}"))
            .with_fix("give the file `vramplan validate PLAN --json > result.json` wrote")
    })?;
    let devices = document.get("run").and_then(|r| r.get("devices")).ok_or_else(|| {
        InputError::new(path.display().to_string(), "has no `run.devices`: the validation did not run")
            .at_key("run.devices")
            .with_fix("give the result of a validation that ran (`vramplan validate PLAN --json`)")
    })?;
    serde_json::from_value(devices.clone()).map_err(|e| {
        InputError::new(
            path.display().to_string(),
            format!("`run.devices` is not a list of device peaks: {e}"),
        )
        .at_key("run.devices")
        .with_fix("give the file `vramplan validate --json` wrote, unchanged")
    })
}

/// The inputs of a sweep or a grid, and how it is judged: `--target`, `--headroom` (0 unless
/// given, as `whatif` judges), everything on the GPUs.
fn whatif_inputs(args: &PlotArgs) -> Result<(Loaded, Request), InputError> {
    let runtime = Runtime::parse(&args.solve.target)?;
    let specs = hardware_list(&args.inputs.hardware)?;
    let loaded = args.inputs.load_on(runtime.naming(), None, &specs[0])?;
    let mut request = Request::new(runtime);
    request.headroom = crate::plan::parse_headroom(args.solve.headroom.as_deref().unwrap_or("0"))?;
    request.offload = false;
    Ok((loaded, request))
}

fn question<'a>(loaded: &'a Loaded, request: &'a Request) -> Question<'a> {
    Question { model: &loaded.model, hardware: &loaded.hardware, workload: &loaded.workload, request }
}

/// A sweep's one axis: `--batch A..B` or `--seq A..B` (a range or a list).
fn sweep_axis(args: &PlotArgs) -> Result<(Quantity, Vec<u64>), InputError> {
    let axes = grid_axes(&args.axes, std::slice::from_ref(&args.inputs.hardware), "plot sweep")?;
    let values = |axis: &[AxisValue]| -> Vec<u64> {
        axis.iter()
            .filter_map(|v| match v {
                AxisValue::Batch(n) | AxisValue::Seq(n) => Some(*n),
                _ => None,
            })
            .collect()
    };
    let values = |axis: &[AxisValue]| {
        let mut values = values(axis);
        values.sort_unstable();
        values.dedup();
        values
    };
    match axes.as_slice() {
        [axis] if matches!(axis.first(), Some(AxisValue::Batch(_))) => Ok((Quantity::Batch, values(axis))),
        [axis] if matches!(axis.first(), Some(AxisValue::Seq(_))) => Ok((Quantity::Seq, values(axis))),
        _ => {
            Err(InputError::new("plot sweep", "a sweep runs over one axis: the batch or the sequence length")
                .with_fix("give one range, e.g. `--batch 8..512` or `--seq 512..32768`"))
        }
    }
}
