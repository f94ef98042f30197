//! `vramplan validate --script FILE.py --hardware HW [--steps N] [--nproc N] [--python PATH]
//! [--time-limit S] [--json] [-- ARGS...]`: the user's own script run on the profile's GPUs as
//! fake CUDA devices, through `vramplan_api::validate_script`, with its progress on stderr and
//! `--trace-out` written. Exit 0 when it completed with work on the GPUs; 1 for a device
//! mismatch, an out-of-memory, idle GPUs or an error of the script; 2 for bad input; 3 when the
//! Python cannot run it (missing, or without torch).

use crate::validate::ValidateArgs;
use std::io::{IsTerminal, Write};
use std::path::Path;
use vramplan_api::{InputError, ValidateScriptRequest};
use vramplan_sim::input::WorkloadFlags;

/// Runs `vramplan validate --script`.
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
    // The harness follows this torch's workspace rule (validate/harness/script_workspace.py).
    if let Ok(torch) = std::env::var("VRAMPLAN_SCRIPT_TORCH") {
        let mut parts = torch.trim().split(['.', '+']);
        let number =
            |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !(number(parts.next()) && number(parts.next())) {
            return Err(InputError::new(
                "VRAMPLAN_SCRIPT_TORCH",
                format!("{torch:?} is not a torch version: expected MAJOR.MINOR, e.g. 2.11 or 2.11.0+cu130"),
            )
            .with_fix(
                "set it to the torch version whose cuBLAS workspace rule the run follows, or unset it",
            ));
        }
    }
    let request = ValidateScriptRequest {
        script: script.to_path_buf(),
        args: args.script_args.clone(),
        hardware: args.hardware.clone().unwrap_or_default(),
        nproc: args.nproc,
        steps: args.steps,
        time_limit: args.time_limit.unwrap_or(crate::validate::DEFAULT_TIME_LIMIT_S),
        trace: args.trace_out.is_some(),
        real_gpus: args.real_gpus,
        python: args.python.clone(),
    };
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let result = {
        let mut progress = |line: &str| {
            if show_progress {
                let _ = write!(err, "\r\x1b[2K{}", vramplan_reports::terminal_safe(&progress_words(line)));
                let _ = err.flush();
            }
        };
        vramplan_api::validate_script(&request, &mut progress)
    };
    if show_progress {
        let _ = write!(err, "\r\x1b[2K");
    }
    let result = result?;
    match &result.run {
        None => {
            if let Some(why) = &result.unavailable {
                let message = vramplan_reports::script_unavailable_message(why);
                let _ = writeln!(err, "{}", vramplan_reports::terminal_safe(&message));
            }
            if args.json {
                crate::print(out, &result.to_json())?;
            }
        }
        Some(run) => {
            if let (Some(path), Some(file)) = (&args.trace_out, &result.trace_file) {
                crate::write_atomic(path, file.to_json().as_bytes())?;
            }
            let text = if args.json {
                result.to_json()
            } else {
                vramplan_reports::script_table(run, &result.hardware, result.nproc)
            };
            crate::print(out, &text)?;
        }
    }
    Ok(result.outcome().exit_code())
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
