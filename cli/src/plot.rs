//! `vramplan plot KIND MODEL --hardware HW [WORKLOAD] [...] -o FILE.svg|FILE.png`: the kind
//! and its options as a `vramplan-api` request (read as the command each kind draws from:
//! `estimate` for `breakdown` and `timeline`, `plan` for `plan`, `whatif` for `sweep` and
//! `grid`); writes the image atomically in the format of the file's extension. Prints where it
//! wrote; exit 0.
//!
//! - `breakdown [--device-map F | --plan F] [--measured VALIDATE.json]`
//! - `timeline [--device-map F | --plan F]`, or `timeline --trace F` for a script's measured run
//!   (`vramplan validate --script --trace-out F`), with no model or hardware
//! - `plan [plan's options] [--baseline]`
//! - `sweep --batch 8..512` (or `--seq`): one axis
//! - `grid --batch 1..64 --seq 512..8192`: two axes (batch, seq, quant, kv-dtype, hardware list)

use crate::estimate::{Inputs, MapSource};
use crate::plan::SolveOptions;
use crate::whatif::{GridAxes, Progress};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use vramplan_api::{ImageFormat, InputError, PlotKind, PlotRequest};

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

impl Kind {
    /// The API's kind.
    fn kind(self) -> PlotKind {
        match self {
            Kind::Breakdown => PlotKind::Breakdown,
            Kind::Timeline => PlotKind::Timeline,
            Kind::Plan => PlotKind::Plan,
            Kind::Sweep => PlotKind::Sweep,
            Kind::Grid => PlotKind::Grid,
        }
    }
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

/// The image format `-o`'s extension asks for.
fn image_format(output: &Path) -> Result<ImageFormat, InputError> {
    ImageFormat::from_path(output).ok_or_else(|| {
        InputError::new("-o", format!("`{}` is neither .svg nor .png", output.display()))
            .with_fix("name the image `plot.svg` or `plot.png`")
    })
}

/// Runs `vramplan plot`.
pub(crate) fn run(args: &PlotArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let request = PlotRequest {
        kind: args.kind.kind(),
        inputs: args.inputs.request(),
        map: args.map.request(),
        solve: args.solve.request(),
        measured: args.measured.clone(),
        baseline: args.baseline,
        axes: args.axes.request(),
        format: image_format(&args.output)?,
    };
    let bar = Progress::default();
    let bytes = vramplan_api::plot_with_progress(&request, &|done, total| bar.advance(done, total));
    bar.finish();
    crate::write_atomic(&args.output, &bytes?)?;
    crate::print(out, &format!("wrote {}", args.output.display()))
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
    let bytes = vramplan_api::plot_trace(&args.trace, image_format(&args.output)?)?;
    crate::write_atomic(&args.output, &bytes)?;
    crate::print(out, &format!("wrote {}", args.output.display()))
}
