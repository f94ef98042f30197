//! `vramplan report MODEL --hardware HW [WORKLOAD] [--device-map F | --plan F] [plan's
//! options] -o report.md|report.html`: the options as a `vramplan-api` request; writes the
//! report (Markdown with its SVG drawings beside it, or one HTML file), each file atomically,
//! and prints what it wrote.

use crate::estimate::{Inputs, MapSource};
use crate::plan::SolveOptions;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
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
    let mut written = Vec::new();
    for (path, svg) in &report.drawings {
        crate::write_atomic(path, svg.as_bytes())?;
        written.push(path.display().to_string());
    }
    let (path, text) = &report.document;
    crate::write_atomic(path, text.as_bytes())?;
    written.insert(0, path.display().to_string());
    crate::print(out, &format!("wrote {}", written.join(", ")))
}
