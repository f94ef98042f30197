//! `vramplan report MODEL --hardware HW [WORKLOAD] [--device-map F | --plan F] [plan's
//! options] -o report.md|report.html`: the options as a `vramplan-api` request; writes the
//! report (Markdown with its SVG drawings beside it, or one HTML file), all files or none,
//! and prints what it wrote.

use crate::estimate::{Inputs, MapSource};
use crate::plan::SolveOptions;
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use vramplan_api::{InputError, ReportRequest};

#[derive(Args, Debug)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    inputs: Inputs,
    #[command(flatten)]
    map: MapSource,
    #[command(flatten)]
    solve: SolveOptions,
    /// The report to write: `.md` (with SVG files beside it) or `.html` (one file).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
}

/// Runs `vramplan report`.
pub(crate) fn run(args: &ReportArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let request = ReportRequest {
        inputs: args.inputs.request(),
        map: args.map.request(),
        solve: args.solve.request(),
        output: args.output.clone(),
    };
    let report = vramplan_api::report(&request)?;
    // The document and its drawings together: all written, or none (the old ones kept).
    let (path, text) = &report.document;
    let files: Vec<(&Path, &[u8])> = std::iter::once((path.as_path(), text.as_bytes()))
        .chain(report.drawings.iter().map(|(p, svg)| (p.as_path(), svg.as_bytes())))
        .collect();
    crate::write_all_atomic(&files)?;
    let written: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    crate::print(out, &format!("wrote {}", written.join(", ")))
}
