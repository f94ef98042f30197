//! `plot`: reads the inputs as the command each kind draws from (`estimate` for `breakdown` and
//! `timeline`, `plan` for `plan`, `whatif` for `sweep` and `grid`), and draws the figure as the
//! bytes of an SVG or PNG file; and a measured run's timeline ([`plot_trace`]).

use crate::InputError;
use crate::estimate::{EstimateResult, MapSource, simulate};
use crate::inputs::{Inputs, Loaded};
use crate::plan::{PlanResult, SolveOptions, solve};
use crate::shares::parse_headroom;
use crate::whatif::{GridAxes, grid, grid_axes, hardware_list};
use std::path::{Path, PathBuf};
use vramplan_reports::plot::{
    self, Breakdown, Figure, GridFigure, ImageFormat, PlacementFigure, SweepFigure, TimelineFigure,
};
use vramplan_solver::Runtime;
use vramplan_solver::build::Request;
use vramplan_solver::whatif::{self, AxisValue, Quantity, Question};
use vramplan_validate::DevicePeaks;

/// Points per GPU a timeline keeps (each the largest of its run of operations).
pub const TIMELINE_POINTS: usize = 2000;

/// The figure `plot` draws.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum PlotKind {
    /// One stacked bar per device by component at the peak, against capacity.
    #[default]
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

impl PlotKind {
    /// The kind's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PlotKind::Breakdown => "breakdown",
            PlotKind::Timeline => "timeline",
            PlotKind::Plan => "plan",
            PlotKind::Sweep => "sweep",
            PlotKind::Grid => "grid",
        }
    }
}

/// What `plot` reads.
#[derive(Debug, Clone)]
pub struct PlotRequest {
    /// The figure.
    pub kind: PlotKind,
    /// The model, hardware and workload.
    pub inputs: Inputs,
    /// breakdown, timeline: where the model is placed.
    pub map: MapSource,
    /// plan: how it is solved; sweep, grid: `target` and `headroom` (0 unless given).
    pub solve: SolveOptions,
    /// breakdown: a `vramplan validate --json` result, drawn beside the prediction.
    pub measured: Option<PathBuf>,
    /// plan: draw accelerate's `device_map="auto"` beside the plan.
    pub baseline: bool,
    /// sweep (one axis: batch or seq), grid (two).
    pub axes: GridAxes,
    /// SVG or PNG.
    pub format: ImageFormat,
}

impl PlotRequest {
    /// A request for `kind` from `inputs`, everything else as the command line's defaults, as
    /// SVG.
    pub fn new(kind: PlotKind, inputs: Inputs) -> PlotRequest {
        PlotRequest {
            kind,
            inputs,
            map: MapSource::default(),
            solve: SolveOptions::default(),
            measured: None,
            baseline: false,
            axes: GridAxes::default(),
            format: ImageFormat::Svg,
        }
    }
}

/// `vramplan plot`: the image's bytes.
pub fn plot(request: &PlotRequest) -> Result<Vec<u8>, InputError> {
    plot_with_progress(request, &|_, _| {})
}

/// As [`plot()`], calling `progress(points_done, total)` as a grid's points are done.
pub fn plot_with_progress(
    request: &PlotRequest,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<u8>, InputError> {
    let format = request.format;
    refuse_options_of_other_kinds(request)?;
    match request.kind {
        PlotKind::Breakdown => {
            let EstimateResult { loaded, estimate, .. } = simulate(&request.inputs, &request.map)?;
            let measured = request.measured.as_deref().map(read_measured).transpose()?;
            if let (Some(path), Some(peaks)) = (&request.measured, &measured) {
                check_measured(path, peaks, &estimate.devices)?;
            }
            let figure = Breakdown {
                title: caption(&request.inputs, &loaded, "memory at the peak", None),
                devices: &estimate.devices,
                measured: measured.as_deref(),
            };
            draw(&figure, format)
        }
        PlotKind::Timeline => {
            let EstimateResult { loaded, placement, .. } = simulate(&request.inputs, &request.map)?;
            let Loaded { model, hardware, workload, .. } = &loaded;
            let trace = vramplan_sim::trace::trace(model, hardware, workload, &placement, TIMELINE_POINTS)?;
            let title = caption(&request.inputs, &loaded, "the step over time", None);
            draw(&TimelineFigure { title, trace: &trace }, format)
        }
        PlotKind::Plan => {
            let PlanResult { loaded, result, baseline, .. } =
                solve(&request.inputs, &request.solve, |_| Ok(()))?;
            let figure = PlacementFigure {
                title: caption(&request.inputs, &loaded, "device map", None),
                plan: &result,
                baseline: if request.baseline { baseline.as_ref() } else { None },
            };
            if request.baseline && baseline.is_none() {
                // The target is accelerate's already where data parallelism is what leaves no map.
                let fix = if matches!(result.target, Runtime::Accelerate | Runtime::AccelerateV4) {
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
            draw(&figure, format)
        }
        PlotKind::Sweep => {
            let (loaded, solve) = whatif_inputs(request)?;
            let question = question(&loaded, &solve);
            let (quantity, values) = sweep_axis(request)?;
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
            let title = caption(&request.inputs, &loaded, "peak against the sweep", Some(&shape));
            draw(&SweepFigure { title, points: &points, answer: &answer }, format)
        }
        PlotKind::Grid => {
            let (loaded, solve) = whatif_inputs(request)?;
            let specs = hardware_list(&request.inputs.hardware)?;
            let axes = grid_axes(&request.axes, &specs, "plot grid")?;
            if axes.len() != 2 {
                return Err(InputError::new("plot grid", format!("a heatmap has two axes, not {}", axes.len()))
                    .with_fix("give two of --batch, --seq, --quant, --kv-dtype and a --hardware list (`whatif grid` takes three)"));
            }
            let grid = grid(&question(&loaded, &solve), &axes, progress)?;
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
            let title = caption(&request.inputs, &loaded, "utilisation over the grid", Some(&shape));
            draw(&GridFigure { title, axes: &axes, grid: &grid }, format)
        }
    }
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

/// `vramplan plot timeline --trace FILE`: the run `validate --script --trace-out FILE` measured,
/// as the bytes of an image.
pub fn plot_trace(path: &Path, format: ImageFormat) -> Result<Vec<u8>, InputError> {
    let file = crate::script::read_trace_file(path, "--trace")?;
    let shown = path.display().to_string();
    let Some(trace) = &file.trace else {
        return Err(InputError::new(&shown, "holds no run: the script's Python wrote no result")
            .at_key("trace")
            .with_fix("run `vramplan validate --script` again and look at its message"));
    };
    let script = vramplan_validate::file_name(&file.script);
    let title = format!("{script} over time, measured on fake GPUs · {} · rank {}", file.hardware, file.rank);
    draw(&TimelineFigure { title, trace }, format)
}

/// Options that only one kind reads are refused with the others, rather than ignored.
fn refuse_options_of_other_kinds(request: &PlotRequest) -> Result<(), InputError> {
    let kind = format!("plot {}", request.kind.name());
    let refuse = |flag: &str, for_kinds: &str| {
        Err(InputError::new(flag, format!("{flag} is for {for_kinds}, not `{kind}`"))
            .with_fix(format!("leave out {flag}")))
    };
    if request.measured.is_some() && request.kind != PlotKind::Breakdown {
        return refuse("--measured", "`plot breakdown`");
    }
    if request.baseline && request.kind != PlotKind::Plan {
        return refuse("--baseline", "`plot plan`");
    }
    if request.map.given() && !matches!(request.kind, PlotKind::Breakdown | PlotKind::Timeline) {
        return refuse("--device-map / --plan", "`plot breakdown` and `plot timeline`");
    }
    if request.axes.given() && !matches!(request.kind, PlotKind::Sweep | PlotKind::Grid) {
        return refuse("a range or list of values", "`plot sweep` and `plot grid`");
    }
    Ok(())
}

/// The measured peaks of a `vramplan validate --json` result (`run.devices`).
fn read_measured(path: &Path) -> Result<Vec<DevicePeaks>, InputError> {
    let text = vramplan_profiles::files::read_text(path, vramplan_profiles::files::FileKind::Measured)
        .map_err(|e| e.with_fix("give the file `vramplan validate --json` wrote"))?;
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

/// Measured peaks that belong to this estimate: each of a GPU the estimate has, each GPU once,
/// and no figure past what the GPU holds (a peak above its memory was not measured on it), with
/// peak allocated within peak reserved, as torch's caching allocator keeps them.
fn check_measured(
    path: &Path,
    peaks: &[DevicePeaks],
    devices: &[vramplan_sim::estimate::DeviceEstimate],
) -> Result<(), InputError> {
    let origin = path.display().to_string();
    let fix = "give the `vramplan validate --json` result of this plan, unchanged";
    let mut seen = std::collections::BTreeSet::new();
    for (i, peak) in peaks.iter().enumerate() {
        let key = format!("run.devices[{i}]");
        let Some(device) = devices.iter().find(|d| d.id == peak.device) else {
            let ids: Vec<String> = devices.iter().map(|d| d.id.to_string()).collect();
            return Err(InputError::new(
                &origin,
                format!("GPU {} was measured, and the estimate has GPUs {}", peak.device, ids.join(", ")),
            )
            .at_key(key)
            .with_fix(fix));
        };
        if !seen.insert(peak.device) {
            return Err(InputError::new(&origin, format!("GPU {} is measured twice", peak.device))
                .at_key(key)
                .with_fix(fix));
        }
        let over = [
            ("allocated_bytes", peak.allocated_bytes),
            ("reserved_bytes", peak.reserved_bytes),
            ("driver_used_bytes", peak.driver_used_bytes),
            ("driver_used_before_bytes", peak.driver_used_before_bytes),
        ]
        .into_iter()
        .find(|(_, bytes)| *bytes > device.capacity_bytes);
        if let Some((field, bytes)) = over {
            return Err(InputError::new(
                &origin,
                format!(
                    "`{field}` of GPU {} is {bytes} bytes, more than its {} bytes of memory",
                    peak.device, device.capacity_bytes
                ),
            )
            .at_key(format!("{key}.{field}"))
            .with_fix(fix));
        }
        if peak.allocated_bytes > peak.reserved_bytes {
            return Err(InputError::new(
                &origin,
                format!(
                    "GPU {}'s peak allocated bytes exceed its peak reserved bytes, which hold them",
                    peak.device
                ),
            )
            .at_key(format!("{key}.allocated_bytes"))
            .with_fix(fix));
        }
    }
    Ok(())
}

/// The inputs of a sweep or a grid, and how it is judged: the target, the headroom (0 unless
/// given, as `whatif` judges), everything on the GPUs.
fn whatif_inputs(request: &PlotRequest) -> Result<(Loaded, Request), InputError> {
    let runtime = Runtime::parse(&request.solve.target)?;
    let specs = hardware_list(&request.inputs.hardware)?;
    let loaded = request.inputs.load_on(runtime.naming(), None, &specs[0])?;
    let mut solve = Request::new(runtime);
    solve.headroom = parse_headroom(request.solve.headroom.as_deref().unwrap_or("0"))?;
    solve.offload = false;
    // The plot's time limit bounds its points' plans as whatif's bounds its probes: points not
    // answered by then are drawn as such (`?`).
    solve.deadline = vramplan_solver::plan::deadline_after(request.solve.time_limit);
    Ok((loaded, solve))
}

fn question<'a>(loaded: &'a Loaded, request: &'a Request) -> Question<'a> {
    Question { model: &loaded.model, hardware: &loaded.hardware, workload: &loaded.workload, request }
}

/// A sweep's one axis: `--batch A..B` or `--seq A..B` (a range or a list).
fn sweep_axis(request: &PlotRequest) -> Result<(Quantity, Vec<u64>), InputError> {
    let axes = grid_axes(&request.axes, std::slice::from_ref(&request.inputs.hardware), "plot sweep")?;
    let values = |axis: &[AxisValue]| -> Vec<u64> {
        let mut values: Vec<u64> = axis
            .iter()
            .filter_map(|v| match v {
                AxisValue::Batch(n) | AxisValue::Seq(n) => Some(*n),
                _ => None,
            })
            .collect();
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
