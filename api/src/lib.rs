//! vramplan's commands as functions: each takes a typed request (plain structs with public
//! fields, built from the strings and numbers the flags take) and returns a typed result (the
//! value `--json` prints, with [`Outcome`] saying what the exit code says). The command line
//! (`vramplan`) only parses arguments into these requests and prints the results; the Python
//! binding calls the same functions.
//!
//! - [`inspect`], [`profiles`], [`profile`]: a model's summary, the hardware catalog.
//! - [`estimate()`]: one step simulated on a placement ([`EstimateRequest`]).
//! - [`plan()`]: a device map solved, with accelerate's beside it, the remedies when nothing
//!   fits, and the export for `-o` ([`PlanRequest`]).
//! - [`check()`], [`whatif()`], [`validate()`], [`validate_script`]: the other commands.
//! - [`plot()`], [`plot_trace`], [`report()`]: figures and documents as bytes.
//!
//! Every function takes owned or shared plain data and writes nothing (files are the caller's
//! to write), so a caller may run it on any thread, a Python binding with the GIL released.
//! Progress, where a command has any, is reported through a callback. Bad input is an
//! [`InputError`] (file or flag, key or line, the problem, the fix).

mod check;
mod estimate;
mod expert_load;
mod inputs;
mod plan;
mod plot;
mod report;
mod script;
mod shares;
mod validate;
mod whatif;

pub use check::{CheckRequest, CheckResult, check};
pub use estimate::{
    DeviceMapSource, EstimateRequest, EstimateResult, MapSource, data_parallel_heading, estimate,
    json_labelled,
};
pub use inputs::{Inputs, Loaded, ModelSource};
pub use plan::{DEFAULT_TIME_LIMIT_S, Launched, LoadedBy, PlanRequest, PlanResult, SolveOptions, plan};
pub use plot::{PlotKind, PlotRequest, TIMELINE_POINTS, plot, plot_trace, plot_with_progress};
pub use report::{Report, ReportKind, ReportRequest, report};
pub use script::{TraceFile, ValidateScriptRequest, ValidateScriptResult, read_trace_file, validate_script};
pub use shares::parse_headroom;
pub use validate::{MapPlan, PlanSource, ValidateRequest, ValidateResult, validate};
pub use vramplan_reports::plot::ImageFormat;
pub use whatif::{
    GridAxes, Query, WhatifAnswer, WhatifRequest, WhatifResult, grid_axes, hardware_list, whatif,
    whatif_with_progress,
};

pub use vramplan_profiles::InputError;
pub use vramplan_profiles::model::{ModelDescription, Naming};
pub use vramplan_sim::input::WorkloadFlags;
pub use vramplan_solver::export::{Export, Format};
pub use vramplan_validate::Backend;

use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{ImportOptions, Summary};

/// Exit code for a negative answer, proven (nothing fits, a mismatch, an OOM).
pub const EXIT_NEGATIVE: i32 = 1;
/// Exit code for bad input.
pub const EXIT_BAD_INPUT: i32 = 2;
/// Exit code when `validate`'s backend has no usable device here.
pub const EXIT_NO_DEVICE: i32 = 3;
/// Exit code when `--time-limit` ran out before an answer either way.
pub const EXIT_NO_ANSWER: i32 = 4;

/// What a command's answer means, as its exit code says it (DESIGN.md's contract), so that a
/// caller need not read text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Yes: it fits, the map is clean, the query has an answer, the run completed (exit 0).
    Positive,
    /// No, proven: nothing fits, a mismatch, an out-of-memory (exit 1).
    Negative,
    /// No answer either way within the time limit (exit 4).
    NoAnswer,
    /// The backend cannot run here: no device, no driver, no Python with torch (exit 3).
    NoDevice,
}

impl Outcome {
    /// The process exit code that says this.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Positive => 0,
            Outcome::Negative => EXIT_NEGATIVE,
            Outcome::NoAnswer => EXIT_NO_ANSWER,
            Outcome::NoDevice => EXIT_NO_DEVICE,
        }
    }

    /// [`Outcome::Positive`] when `yes`, else [`Outcome::Negative`].
    pub fn of(yes: bool) -> Outcome {
        if yes { Outcome::Positive } else { Outcome::Negative }
    }
}

/// `value` as the pretty JSON `--json` prints.
pub fn json_text<T: serde::Serialize>(value: &T) -> String {
    // Serializing our own plain data types cannot fail; an empty object is never printed.
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// What `inspect` reads: the model, the module naming, and the dtype floating-point parameters
/// are counted in (`--dtype`).
#[derive(Debug, Clone, Default)]
pub struct InspectRequest {
    /// The model.
    pub model: ModelSource,
    /// Report bytes as if floating-point parameters were cast to this dtype (`bf16`, …).
    pub dtype: Option<String>,
    /// Module naming: transformers 5.x (default) or 4.x.
    pub naming: Naming,
}

/// `vramplan inspect`: the model's parameters, bytes, modules, layer kinds, largest unit and
/// tied groups (what `inspect --json` prints).
pub fn inspect(request: &InspectRequest) -> Result<Summary, InputError> {
    let mut description = request.model.load(ImportOptions { naming: request.naming })?;
    if let Some(name) = &request.dtype {
        description = description.cast(vramplan_profiles::DType::parse_input("--dtype", name)?);
    }
    Ok(description.summary())
}

/// `vramplan profiles`: every built-in hardware profile (what `profiles --json` prints).
pub fn profiles() -> Result<Vec<HardwareProfile>, InputError> {
    hardware::builtin_names().into_iter().map(hardware::load).collect()
}

/// `vramplan profiles show SPEC`: one profile (a built-in name, a short form such as `2xt4`, or
/// a YAML file).
pub fn profile(spec: &str) -> Result<HardwareProfile, InputError> {
    hardware::load(spec)
}
