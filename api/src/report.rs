//! `report`: where one copy of the model spans several GPUs, the plan beside accelerate's map;
//! the estimate of that map (or of the map given) and the step's timeline; as Markdown with the
//! drawings as SVG files beside it (`report-breakdown.svg`, …), or as one self-contained HTML
//! file. Returns the files' contents; writing them is the caller's.

use crate::InputError;
use crate::estimate::{MapSource, simulate};
use crate::inputs::Inputs;
use crate::plan::{PlanResult, SolveOptions, solve};
use std::path::{Path, PathBuf};
use vramplan_profiles::units::format_bytes;
use vramplan_reports::document::{self, Drawing, Section};
use vramplan_reports::plot::{self, Breakdown, Figure, ImageFormat, PlacementFigure, TimelineFigure};
use vramplan_sim::Placement;
use vramplan_solver::check::map_findings;
use vramplan_solver::plan::Verdict;

/// What `report` reads.
#[derive(Debug, Clone, Default)]
pub struct ReportRequest {
    /// The model, hardware and workload.
    pub inputs: Inputs,
    /// The map to report on; without one, the plan's (one copy over several GPUs) or the
    /// default placement.
    pub map: MapSource,
    /// How the plan is solved.
    pub solve: SolveOptions,
    /// Where the report will be written: `.md` (SVG files beside it) or `.html` (one file); its
    /// stem names the drawings.
    pub output: PathBuf,
}

/// The report's kinds, from the output's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    /// Markdown, with SVG files beside it.
    Markdown,
    /// One HTML file, the drawings inline.
    Html,
}

/// A report's files.
#[derive(Debug, Clone)]
pub struct Report {
    /// Markdown or HTML.
    pub kind: ReportKind,
    /// Where the document goes ([`ReportRequest::output`]), and its text.
    pub document: (PathBuf, String),
    /// Markdown's drawings: each SVG file's path (beside the document) and text, in order.
    pub drawings: Vec<(PathBuf, String)>,
}

/// `vramplan report`.
pub fn report(request: &ReportRequest) -> Result<Report, InputError> {
    let output = &request.output;
    let extension = output.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let kind = match extension.as_deref() {
        Some("md") => ReportKind::Markdown,
        Some("html" | "htm") => ReportKind::Html,
        _ => {
            return Err(InputError::new("-o", format!("`{}` is neither .md nor .html", output.display()))
                .with_fix("name the report `report.md` (SVG files beside it) or `report.html` (one file)"));
        }
    };
    let inputs = &request.inputs;
    // One copy of the model over several GPUs, without a map given: the plan's map (the
    // estimate is of it), beside accelerate's. Otherwise the estimate of the map given, or of
    // the default placement.
    let simulated = simulate(inputs, &request.map)?;
    let spans_gpus = simulated.loaded.hardware.devices.len() > 1
        && !vramplan_sim::estimate::is_data_parallel(&simulated.loaded.workload)
        && !request.map.given();
    let solved = if spans_gpus { Some(solve(inputs, &request.solve, |_| Ok(()))?) } else { None };
    let (loaded, estimate) = match &solved {
        Some(PlanResult { loaded, result, .. }) if result.verdict == Verdict::Fits => {
            let placement = Placement::from_entries(result.device_map.clone());
            (loaded, vramplan_sim::estimate(&loaded.model, &loaded.hardware, &loaded.workload, &placement)?)
        }
        _ => (&simulated.loaded, simulated.estimate.clone()),
    };
    let words = plot::workload_words(&loaded.workload, None);
    let title = format!("{} on {}: {words}", loaded.model.name, inputs.hardware);
    let stem = output.file_stem().map_or("report".into(), |s| s.to_string_lossy().into_owned());
    let mut sections = Vec::new();
    if let Some(PlanResult { result, baseline, explanation, loaded, .. }) = &solved {
        sections.push(Section {
            heading: "Device map".into(),
            lead: "The plan `vramplan plan` solves, with accelerate's `device_map=\"auto\"` for the same inputs.".into(),
            table: vramplan_reports::plan_table_untimed(result, baseline.as_ref(), explanation.as_ref(), &loaded.warnings),
            drawing: Some(drawing(
                &PlacementFigure { title: format!("device map · {title}"), plan: result, baseline: baseline.as_ref() },
                format!("{stem}-plan.svg"),
                "one column per device, its units in order, against the plan's limit",
            )?),
        });
    }
    let placed = if solved.as_ref().is_some_and(|s| s.result.verdict == Verdict::Fits) {
        " of the plan's map"
    } else {
        ""
    };
    // A map given is checked as `vramplan check` does: its findings go with its memory, so a
    // map the runtime stops on is never reported as fitting alone.
    let given = request.map.given().then(|| {
        let entries = simulated.placement.entries();
        let findings = map_findings(
            &loaded.model,
            entries,
            simulated.runtime,
            &loaded.workload,
            loaded.hardware.devices.len(),
        );
        (entries, findings)
    });
    let memory = match &given {
        Some((_, findings)) => {
            vramplan_reports::check_table(simulated.runtime, Some(&estimate), None, findings)
        }
        None => vramplan_reports::estimate_table(&estimate),
    };
    if let Some((entries, _)) = &given {
        let lines: Vec<String> = entries
            .iter()
            .map(|(key, target)| {
                format!("  {}: {}", serde_json::Value::from(key.as_str()), crate::json_text(target).trim())
            })
            .collect();
        sections.push(Section {
            heading: "Device map".into(),
            lead: "The map given, as `from_pretrained` reads it, and the call that loads it.".into(),
            table: format!(
                "{{\n{}\n}}\n\nsaved as device_map.json, it loads with\n  {}\n",
                lines.join(",\n"),
                vramplan_reports::accelerate_load_call(
                    "device_map.json",
                    &loaded.model,
                    entries,
                    &loaded.workload
                )
                .join("\n  ")
            ),
            drawing: None,
        });
    }
    sections.push(Section {
        heading: "Memory at the peak".into(),
        lead: format!(
            "{}Each GPU's bytes by component at its peak{placed}, against what PyTorch may use (`vramplan estimate`){}.",
            vramplan_profiles::model::generic::line(&loaded.model).replace('\n', " "),
            if given.is_some() { ", and what `vramplan check` finds in the map" } else { "" }
        ),
        table: crate::estimate::data_parallel_heading(&loaded.workload, &loaded.hardware) + &memory,
        drawing: Some(drawing(
            &Breakdown { title: format!("memory at the peak · {title}"), devices: &estimate.devices, measured: None },
            format!("{stem}-breakdown.svg"),
            "one stacked bar per GPU by component, with the capacity and usable lines",
        )?),
    });
    let placement = match &solved {
        Some(PlanResult { result, .. }) if result.verdict == Verdict::Fits => {
            Placement::from_entries(result.device_map.clone())
        }
        _ => simulated.placement.clone(),
    };
    if let Ok(trace) = vramplan_sim::trace::trace(
        &loaded.model,
        &loaded.hardware,
        &loaded.workload,
        &placement,
        crate::TIMELINE_POINTS,
    ) {
        let peaks: Vec<String> = trace
            .devices
            .iter()
            .map(|d| format!("GPU {}: {} at {}", d.device, format_bytes(d.peak.allocated), d.peak_at))
            .collect();
        sections.push(Section {
            heading: "The step over time".into(),
            lead: "Allocated and reserved bytes over the step's operations, the phases shaded.".into(),
            table: format!("peak allocated\n{}\n", peaks.join("\n")),
            drawing: Some(drawing(
                &TimelineFigure { title: format!("the step over time · {title}"), trace: &trace },
                format!("{stem}-timeline.svg"),
                "allocated and reserved bytes over the step, per GPU, with the peak marked",
            )?),
        });
    }
    let (text, drawings) = match kind {
        ReportKind::Markdown => {
            let folder = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let drawings = sections
                .iter()
                .filter_map(|s| s.drawing.as_ref())
                .map(|d| (folder.join(&d.file), d.svg.clone()))
                .collect();
            (document::markdown(&title, &sections), drawings)
        }
        ReportKind::Html => (document::html(&title, &sections), Vec::new()),
    };
    Ok(Report { kind, document: (output.clone(), text), drawings })
}

/// `figure` as an SVG drawing named `file`.
fn drawing(figure: &impl Figure, file: String, caption: &str) -> Result<Drawing, InputError> {
    let bytes =
        plot::render(figure, ImageFormat::Svg).map_err(|e| InputError::new("report", e.to_string()))?;
    let svg = String::from_utf8(bytes).map_err(|e| InputError::new("report", e.to_string()))?;
    Ok(Drawing { file, caption: caption.to_string(), svg })
}
