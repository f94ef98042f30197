//! `vramplan validate --script FILE.py --hardware HW [--steps N] [--nproc N] [--python PATH]
//! [--time-limit S] [--json] [-- ARGS...]`: the user's own script run on the profile's GPUs as
//! fake CUDA devices (`vramplan_validate::run_script`). Exit 0 when it completed with work on
//! the GPUs; 1 for a device mismatch, an out-of-memory, idle GPUs or an error of the script; 2 for
//! bad input; 3 when the Python cannot run it (missing, or without torch).

use crate::validate::{EXIT_NO_DEVICE, ValidateArgs};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware;
use vramplan_sim::input::WorkloadFlags;
use vramplan_validate::{ScriptOutcome, ScriptRequest};

pub(crate) fn run(
    args: &ValidateArgs,
    script: &Path,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, InputError> {
    if args.flags != WorkloadFlags::default() {
        return Err(InputError::new(
            "validate --script",
            "the workload flags describe a plan's run; a script's run is what the script does",
        )
        .with_fix("leave them out: the script's own batch, sequence and precision are what runs"));
    }
    let shown = script.display().to_string();
    regular_file(script, "--script", "give the path of a Python file")?;
    let script = std::fs::canonicalize(script)
        .map_err(|e| InputError::new(&shown, format!("cannot resolve the path: {e}")))?;
    let hardware_spec = args.hardware.as_deref().unwrap_or_default();
    let hardware = hardware::load(hardware_spec)?;
    let nproc = args.nproc.unwrap_or(1);
    if nproc as usize > hardware.devices.len() {
        return Err(InputError::new(
            "validate --nproc",
            format!(
                "{} ranks on `{}`, which has {} GPU{}: torchrun starts one rank per GPU",
                nproc,
                hardware.name,
                hardware.devices.len(),
                if hardware.devices.len() == 1 { "" } else { "s" }
            ),
        )
        .with_fix(format!("--nproc {} or fewer, or a profile with more GPUs", hardware.devices.len())));
    }
    let request = ScriptRequest {
        script,
        args: args.script_args.clone(),
        steps: args.steps,
        nproc,
        torchrun: args.nproc.is_some(),
        time_limit: Duration::from_secs(args.time_limit),
        trace_points: args.trace_out.as_ref().map(|_| crate::plot::TIMELINE_POINTS),
        real: args.real_gpus,
    };
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let mut progress = |line: &str| {
        if show_progress {
            let _ = write!(err, "\r\x1b[2K{}", progress_words(line));
            let _ = err.flush();
        }
    };
    let result = vramplan_validate::run_script(&request, &hardware, &args.python, &mut progress);
    if show_progress {
        let _ = write!(err, "\r\x1b[2K");
    }
    match result {
        Err(why) => {
            let _ = writeln!(err, "{}", vramplan_reports::script_unavailable_message(&why));
            if args.json {
                crate::print(
                    out,
                    &crate::json_text(&serde_json::json!({ "outcome": "error", "unavailable": why })),
                )?;
            }
            Ok(EXIT_NO_DEVICE)
        }
        Ok(run) => {
            if let Some(path) = &args.trace_out {
                let rank = run.ranks.iter().find(|r| r.rank == run.rank);
                let file = TraceFile {
                    vramplan_trace: 1,
                    script: request.script.display().to_string(),
                    hardware: hardware.name.clone(),
                    rank: run.rank,
                    trace: rank.and_then(|r| r.trace.clone()),
                    activations: rank.and_then(|r| r.activations.clone()),
                };
                crate::write_atomic(path, crate::json_text(&file).as_bytes())?;
            }
            let text = if args.json {
                crate::json_text(&run)
            } else {
                vramplan_reports::script_table(&run, &hardware.name, nproc)
            };
            crate::print(out, &text)?;
            Ok(if run.outcome == ScriptOutcome::Completed { 0 } else { crate::EXIT_NEGATIVE })
        }
    }
}

/// What `--trace-out` writes: the measured run over time, as `plot timeline --trace` reads it.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct TraceFile {
    /// The format's version (1).
    pub vramplan_trace: u32,
    /// The script that ran.
    pub script: String,
    /// The hardware profile it ran on.
    pub hardware: String,
    /// The rank whose run this is (the one the answer comes from).
    pub rank: u32,
    /// The run over time (none where the harness wrote no result).
    pub trace: Option<vramplan_sim::trace::Trace>,
    /// What its first training forward left for backward, per module: `estimate --activations`
    /// reads it.
    pub activations: Option<vramplan_validate::MeasuredActivations>,
}

/// Reads a file `--trace-out` wrote (for `plot timeline --trace` and `--activations`).
pub(crate) fn read_trace_file(path: &Path, flag: &str) -> Result<TraceFile, InputError> {
    let shown = path.display().to_string();
    let fix = "give the file `vramplan validate --script FILE.py --trace-out FILE` wrote";
    regular_file(path, flag, fix)?;
    let text = std::fs::read_to_string(path).map_err(|e| InputError::io(path, &e).with_fix(fix))?;
    let file: TraceFile = serde_json::from_str(&text)
        .map_err(|e| InputError::new(&shown, format!("not a vramplan trace: {e}")).with_fix(fix))?;
    if file.vramplan_trace != 1 {
        return Err(InputError::new(
            &shown,
            format!("trace format {}, this vramplan reads 1", file.vramplan_trace),
        )
        .at_key("vramplan_trace")
        .with_fix("write it again with this vramplan"));
    }
    Ok(file)
}

/// Refuses what `flag` names unless it is a regular file (a folder is refused, and a FIFO would
/// block the read).
fn regular_file(path: &Path, flag: &str, fix: &str) -> Result<(), InputError> {
    let meta = std::fs::metadata(path).map_err(|e| InputError::io(path, &e).with_fix(fix))?;
    if !meta.is_file() {
        return Err(InputError::new(path.display().to_string(), format!("{flag}: is not a regular file"))
            .with_fix(fix));
    }
    Ok(())
}

/// A progress line of the harness (`rank=0 steps=1 forwards=2 module=model.layers.3`) in words.
fn progress_words(line: &str) -> String {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .unwrap_or("")
    };
    let module = field("module");
    let running = if module.is_empty() { String::new() } else { format!(", in {module}") };
    let count = |n: &str, one: &str, many: &str| format!("{n} {}", if n == "1" { one } else { many });
    format!(
        "rank {}: {}, {}{running}",
        field("rank"),
        count(field("steps"), "step", "steps"),
        count(field("forwards"), "forward pass", "forward passes")
    )
}
