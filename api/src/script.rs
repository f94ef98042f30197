//! `validate --script`: the user's own script run on the profile's GPUs as fake CUDA devices
//! (`vramplan_validate::run_script`), rank by rank under `torchrun`'s variables when asked; and
//! the trace file `--trace-out` writes and `plot timeline --trace` and `--activations` read.

use crate::{InputError, Outcome};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vramplan_profiles::files::{self, FileKind};
use vramplan_profiles::hardware;
use vramplan_validate::{ScriptOutcome, ScriptValidation, Unavailable};

/// What `validate --script` reads.
#[derive(Debug, Clone)]
pub struct ValidateScriptRequest {
    /// The script, unmodified.
    pub script: PathBuf,
    /// Its own arguments.
    pub args: Vec<String>,
    /// The hardware profile whose GPUs are faked.
    pub hardware: String,
    /// Run it as `torchrun --nproc-per-node N` would, rank by rank; `None` runs it as
    /// `python FILE.py` does.
    pub nproc: Option<u32>,
    /// Optimizer steps to run (or forward passes, where the script makes no optimizer).
    pub steps: u32,
    /// The most the run may take, in seconds, all ranks together.
    pub time_limit: u64,
    /// Keep the run over time, for [`ValidateScriptResult::trace_file`].
    pub trace: bool,
    /// Run it on this machine's GPUs instead of fake ones.
    pub real_gpus: bool,
    /// The Python that runs it (with torch).
    pub python: String,
}

impl ValidateScriptRequest {
    /// The command line's defaults for `script` on `hardware`: two steps, ten minutes,
    /// `python3`, one process.
    pub fn new(script: PathBuf, hardware: &str) -> ValidateScriptRequest {
        ValidateScriptRequest {
            script,
            args: Vec::new(),
            hardware: hardware.to_string(),
            nproc: None,
            steps: 2,
            time_limit: 600,
            trace: false,
            real_gpus: false,
            python: "python3".into(),
        }
    }
}

/// What `validate --script` found.
#[derive(Debug, Clone)]
pub struct ValidateScriptResult {
    /// The profile's name.
    pub hardware: String,
    /// The processes that ran.
    pub nproc: u32,
    /// What the run found; `None` when the Python could not run it.
    pub run: Option<ScriptValidation>,
    /// Why the Python could not run it (missing, or without torch).
    pub unavailable: Option<Unavailable>,
    /// The run over time, as `--trace-out` writes it (with [`ValidateScriptRequest::trace`]).
    pub trace_file: Option<TraceFile>,
}

impl ValidateScriptResult {
    /// Completed with work on the GPUs; a mismatch, an out-of-memory, idle GPUs or an error;
    /// or no Python to run it.
    pub fn outcome(&self) -> Outcome {
        match &self.run {
            None => Outcome::NoDevice,
            Some(run) => Outcome::of(run.outcome == ScriptOutcome::Completed),
        }
    }

    /// What `validate --script --json` prints.
    pub fn to_json(&self) -> String {
        match (&self.run, &self.unavailable) {
            (Some(run), _) => crate::json_text(run),
            (None, why) => crate::json_text(&serde_json::json!({ "outcome": "error", "unavailable": why })),
        }
    }
}

/// `vramplan validate --script`; `progress` is given each progress line of the harness
/// (`rank=0 steps=1 forwards=2 module=model.layers.3`) as it comes.
pub fn validate_script(
    request: &ValidateScriptRequest,
    progress: &mut dyn FnMut(&str),
) -> Result<ValidateScriptResult, InputError> {
    let shown = request.script.display().to_string();
    files::check_regular(&request.script, FileKind::Script)?;
    let script = std::fs::canonicalize(&request.script)
        .map_err(|e| InputError::new(&shown, format!("cannot resolve the path: {e}")))?;
    let hardware = hardware::load(&request.hardware)?;
    let nproc = request.nproc.unwrap_or(1);
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
    let run_request = vramplan_validate::ScriptRequest {
        script,
        args: request.args.clone(),
        steps: request.steps,
        nproc,
        torchrun: request.nproc.is_some(),
        time_limit: Duration::from_secs(request.time_limit),
        trace_points: request.trace.then_some(crate::TIMELINE_POINTS),
        real: request.real_gpus,
    };
    let result = vramplan_validate::run_script(&run_request, &hardware, &request.python, progress);
    let mut answer = ValidateScriptResult {
        hardware: hardware.name.clone(),
        nproc,
        run: None,
        unavailable: None,
        trace_file: None,
    };
    match result {
        Err(why) => answer.unavailable = Some(why),
        Ok(run) => {
            if request.trace {
                let rank = run.ranks.iter().find(|r| r.rank == run.rank);
                answer.trace_file = Some(TraceFile {
                    vramplan_trace: 1,
                    script: run_request.script.display().to_string(),
                    hardware: hardware.name.clone(),
                    rank: run.rank,
                    trace: rank.and_then(|r| r.trace.clone()),
                    activations: rank.and_then(|r| r.activations.clone()),
                });
            }
            answer.run = Some(run);
        }
    }
    Ok(answer)
}

/// What `--trace-out` writes: the measured run over time, as `plot timeline --trace` reads it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TraceFile {
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

impl TraceFile {
    /// The file as written: pretty JSON.
    pub fn to_json(&self) -> String {
        crate::json_text(self)
    }
}

/// Reads a file `--trace-out` wrote (for `plot timeline --trace` and `--activations`; `flag`
/// names the option in errors).
pub fn read_trace_file(path: &Path, flag: &str) -> Result<TraceFile, InputError> {
    let shown = path.display().to_string();
    let fix = "give the file `vramplan validate --script FILE.py --trace-out FILE` wrote";
    let text = files::read_text(path, FileKind::Trace).map_err(|e| e.with_fix(format!("{flag}: {fix}")))?;
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
