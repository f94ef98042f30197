//! The command line: parses arguments with clap, turns them into `vramplan-api` requests, calls
//! the API, and prints its results (text rendered by `vramplan-reports`, or `--json`), writing
//! the files `-o` names. No loading, planning or orchestration lives here.
//!
//! Exit codes (the contract in DESIGN.md): 0 success; 1 the question has a negative answer,
//! proven; 2 bad input (the message says what and where); 3 no usable device for `validate`;
//! 4 no answer: nothing within `--time-limit`, or nothing either found or proven (the best found
//! so far is still printed, with its gap).

mod check;
mod estimate;
mod output;
mod plan;
mod plot;
mod report;
mod validate;
mod validate_script;
mod whatif;

use clap::{Parser, Subcommand, ValueEnum};
use std::cell::RefCell;
use std::ffi::OsString;
use std::io::Write;
use vramplan_api::{InputError, InspectRequest, ModelSource};
use vramplan_profiles::hardware;
use vramplan_profiles::model::Naming;
use vramplan_reports::terminal_safe;

pub(crate) use output::{write_all_atomic, write_atomic};

pub use vramplan_api::{EXIT_BAD_INPUT, EXIT_NEGATIVE, EXIT_NO_ANSWER};
/// Exit code when `validate`'s backend has no usable device here.
pub const EXIT_NO_DEVICE: i32 = validate::EXIT_NO_DEVICE;

#[derive(Parser, Debug)]
#[command(name = "vramplan", version, about = "Plan GPU memory before you launch", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print to stderr what was read from the Hugging Face Hub: each request, the bytes read,
    /// the cache hits.
    #[arg(short, long, global = true)]
    verbose: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the built-in hardware profiles, or show one as YAML that loads back.
    Profiles {
        #[command(subcommand)]
        action: Option<ProfilesAction>,
        /// Print JSON instead of a table or YAML (before or after `show NAME`).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Describe a model: parameters, bytes, modules, layer kinds, largest unit, tied groups.
    Inspect {
        /// A built-in name (`mixtral-8x7b`), a config.json, a model folder, a custom YAML, a
        /// Hugging Face Hub id (`org/name`, `org/name@revision`, a GGUF file `org/name:Q4_K_M`),
        /// or a GGUF file (or a folder with one and its mmproj).
        model: String,
        /// Report bytes as if floating-point parameters were cast to this dtype.
        #[arg(long)]
        dtype: Option<String>,
        /// Module naming: transformers 5.x (default) or 4.x.
        #[arg(long, value_enum, default_value_t = NamingArg::V5)]
        naming: NamingArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Simulate one step of a workload: per-device peaks, where the memory goes, fits or not.
    Estimate(Box<estimate::EstimateArgs>),
    /// Place the model on the GPUs: an exact ILP, exports for accelerate, llama.cpp and others.
    Plan(Box<plan::PlanArgs>),
    /// Check a device map: per-device memory, and the device mismatches the target runtime hits.
    Check(Box<check::CheckArgs>),
    /// Run a plan on a device (after the static checks) and set what it measured beside the
    /// prediction.
    Validate(Box<validate::ValidateArgs>),
    /// Capacity planning backwards: the largest batch or sequence, the sequences served at once,
    /// the fewest GPUs, the cheapest hardware, the best precision, the trade-offs, a grid.
    Whatif(Box<whatif::WhatifArgs>),
    /// Draw a figure for docs: a breakdown, a timeline, a device map, a sweep or a grid, as
    /// SVG or PNG (`-o plot.svg`).
    Plot(Box<plot::PlotArgs>),
    /// Write a report for docs: the estimate, the timeline and the plan with their drawings, as
    /// Markdown (SVG files beside it) or one HTML file.
    Report(Box<report::ReportArgs>),
}

#[derive(Subcommand, Debug)]
enum ProfilesAction {
    /// Print one profile (built-in name, short form such as `2xt4`, or a YAML file).
    Show { name: String },
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub(crate) enum NamingArg {
    V5,
    V4,
}

impl NamingArg {
    /// The naming it names.
    pub(crate) fn naming(self) -> Naming {
        match self {
            NamingArg::V5 => Naming::V5,
            NamingArg::V4 => Naming::V4,
        }
    }
}

/// Runs the command line `args` (program name first), writing to `out` and `err`; returns the
/// process exit code.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match dispatch(args, out, err) {
        Ok(code) => code,
        // The message may quote an argument or a file: made terminal-safe, as all output is.
        Err(Failure::Parse(e)) => {
            let _ = write!(err, "{}", terminal_safe(&e.render().to_string()));
            EXIT_BAD_INPUT
        }
        Err(Failure::Input(e)) => {
            let _ = writeln!(err, "error: {}", terminal_safe(&e.to_string()));
            EXIT_BAD_INPUT
        }
    }
}

/// The MODEL argument that stands for the model [`run_captured`] is given in memory (the Python
/// package's config or `torch.nn.Module`).
pub const IN_MEMORY_MODEL: &str = "<python object>";

thread_local! {
    /// The in-memory model of the [`run_captured`] call running on this thread.
    static IN_MEMORY: RefCell<Option<ModelSource>> = const { RefCell::new(None) };
}

/// The model a MODEL argument names: the in-memory model where the argument is
/// [`IN_MEMORY_MODEL`] and [`run_captured`] was given one, else the argument as a spec.
pub(crate) fn model_source(spec: &str) -> ModelSource {
    if spec == IN_MEMORY_MODEL
        && let Some(model) = IN_MEMORY.with(|m| m.borrow().clone())
    {
        return model;
    }
    ModelSource::Spec(spec.to_string())
}

/// What [`run_captured`] returns: the exit code, what the command printed, and the bad input
/// that stopped it (its message is not printed: the caller raises it).
#[derive(Debug)]
pub struct Captured {
    /// The process exit code the command line would have.
    pub code: i32,
    /// What the command printed to stdout.
    pub out: Vec<u8>,
    /// What it printed to stderr (warnings, `--verbose`), bad input aside.
    pub err: Vec<u8>,
    /// The bad input, when the exit code is [`EXIT_BAD_INPUT`]: an argument the parser refused
    /// (origin `command line`) or an input the command refused.
    pub error: Option<InputError>,
}

/// Runs the command line `args` (program name first) with its output captured, `model` standing
/// for a MODEL argument of [`IN_MEMORY_MODEL`]: the Python package's entry, which parses with
/// the same parser, calls the same API and gets the same `--json`.
pub fn run_captured(args: Vec<String>, model: Option<ModelSource>) -> Captured {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    IN_MEMORY.with(|m| *m.borrow_mut() = model);
    let result = dispatch(args, &mut out, &mut err);
    IN_MEMORY.with(|m| *m.borrow_mut() = None);
    let (code, error) = match result {
        Ok(code) => (code, None),
        Err(Failure::Input(e)) => (EXIT_BAD_INPUT, Some(e)),
        Err(Failure::Parse(e)) => (EXIT_BAD_INPUT, Some(parse_error(&e))),
    };
    Captured { code, out, err, error }
}

/// Why a command stopped without an exit code of its own.
enum Failure {
    /// The parser refused the arguments.
    Parse(clap::Error),
    /// The command refused an input.
    Input(InputError),
}

/// A parser refusal as bad input: clap's message (without its `error: ` and usage) as the
/// problem, its tip, or the command's `--help`, as the fix.
fn parse_error(e: &clap::Error) -> InputError {
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let problem = lines.next().unwrap_or("the arguments were refused");
    let problem = problem.strip_prefix("error: ").unwrap_or(problem);
    let tip = lines.find_map(|l| l.strip_prefix("tip: "));
    let fix = tip.map_or_else(
        || "see `vramplan --help` for the arguments each command takes".to_string(),
        str::to_string,
    );
    InputError::new("command line", problem).with_fix(fix)
}

/// Parses `args` and runs the command, writing to `out` and `err`.
fn dispatch<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, Failure>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = whatif::grid_axis_args(args.into_iter().map(Into::into).collect());
    if plot::draws_a_trace(&args) {
        let trace = parse_or_help(plot::TraceArgs::try_parse_from(&args), out)?;
        let Some(trace) = trace else { return Ok(0) };
        return plot::run_trace(&trace, out).map_err(Failure::Input);
    }
    let Some(cli) = parse_or_help(Cli::try_parse_from(args), out)? else { return Ok(0) };
    vramplan_hub::take_activity();
    let verbose = cli.verbose;
    let result = match cli.command {
        Command::Profiles { action: None, json } => list_profiles(json, out),
        Command::Profiles { action: Some(ProfilesAction::Show { name }), json } => {
            show_profile(&name, json, out)
        }
        Command::Inspect { model, dtype, naming, json } => {
            inspect(&model, dtype.as_deref(), naming, json, out)
        }
        Command::Estimate(args) => estimate::run(&args, out),
        Command::Plan(args) => plan::run(&args, out),
        Command::Check(args) => check::run(&args, out),
        Command::Validate(args) => validate::run(&args, out, err),
        Command::Whatif(args) => whatif::run(&args, out),
        Command::Plot(args) => plot::run(&args, out),
        Command::Report(args) => report::run(&args, out),
    };
    if verbose {
        print_hub_activity(err);
    }
    result.map_err(Failure::Input)
}

/// The parsed arguments; `None` where the parser printed `--help` or `--version` to `out`
/// (exit 0).
fn parse_or_help<A>(parsed: Result<A, clap::Error>, out: &mut dyn Write) -> Result<Option<A>, Failure> {
    match parsed {
        Ok(args) => Ok(Some(args)),
        Err(e) if e.exit_code() == 0 => {
            let _ = write!(out, "{}", e.render());
            Ok(None)
        }
        Err(e) => Err(Failure::Parse(e)),
    }
}

/// `--verbose`: what this command read from the Hub, a line each, then the totals.
fn print_hub_activity(err: &mut dyn Write) {
    let activity = vramplan_hub::take_activity();
    for line in &activity.lines {
        let _ = writeln!(err, "hub: {}", terminal_safe(line));
    }
    let _ = writeln!(
        err,
        "hub: {} requests, {} bytes read ({}), {} cache hits",
        activity.requests,
        activity.bytes_read,
        vramplan_profiles::units::format_bytes(activity.bytes_read),
        activity.cache_hits
    );
}

fn list_profiles(json: bool, out: &mut dyn Write) -> Result<i32, InputError> {
    let profiles = vramplan_api::profiles()?;
    let text =
        if json { vramplan_api::json_text(&profiles) } else { vramplan_reports::profiles_table(&profiles) };
    print(out, &text)
}

fn show_profile(name: &str, json: bool, out: &mut dyn Write) -> Result<i32, InputError> {
    let profile = vramplan_api::profile(name)?;
    let text = if json { vramplan_api::json_text(&profile) } else { hardware::to_yaml(&profile) };
    print(out, &text)
}

fn inspect(
    spec: &str,
    dtype: Option<&str>,
    naming: NamingArg,
    json: bool,
    out: &mut dyn Write,
) -> Result<i32, InputError> {
    let request = InspectRequest {
        model: model_source(spec),
        dtype: dtype.map(str::to_string),
        naming: naming.naming(),
    };
    let summary = vramplan_api::inspect(&request)?;
    let text =
        if json { vramplan_api::json_text(&summary) } else { vramplan_reports::inspect_table(&summary) };
    print(out, &text)
}

fn print(out: &mut dyn Write, text: &str) -> Result<i32, InputError> {
    // Text from input files (names, a currency) reaches the terminal escaped.
    let text = terminal_safe(text);
    // A closed pipe (`vramplan inspect x | head`) is not an input error: write failures are
    // ignored and the command still succeeds.
    let _ = if text.ends_with('\n') { write!(out, "{text}") } else { writeln!(out, "{text}") };
    Ok(0)
}
