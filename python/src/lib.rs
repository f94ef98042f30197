//! The native module of the Python package (`vramplan._vramplan`): the command line's parser
//! and the library behind it, called in-process. Two functions:
//!
//! - `call(argv, model)`: runs a command line (no program name) as `vramplan` would, output
//!   captured, with the GIL released; an in-memory model (a config's JSON text and/or a
//!   listing of a module's tensors) stands for MODEL. Returns the exit code, what the command
//!   printed, and for bad input the error's parts (`problem`, `origin`, `key`, `line`, `fix`),
//!   which the Python side raises as `vramplan.BadInput`.
//! - `main(argv)`: the `vramplan` command the wheel installs, printing to this process's
//!   stdout and stderr.
//!
//! Nothing panics across the boundary: a panic is caught and returned as an internal error.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use vramplan::Captured;
use vramplan_profiles::InputError;
use vramplan_profiles::Location;
use vramplan_profiles::model::{ImportOptions, ModelDescription, safetensors};

/// What a failed call returns to Python: the error's parts, for `BadInput(**parts)`.
fn error_parts<'py>(py: Python<'py>, error: &InputError) -> PyResult<Bound<'py, PyDict>> {
    let parts = PyDict::new(py);
    parts.set_item("problem", &error.problem)?;
    parts.set_item("origin", &error.origin)?;
    match &error.location {
        Some(Location::Key(key)) => parts.set_item("key", key)?,
        Some(Location::LineColumn { line, .. }) => parts.set_item("line", line)?,
        _ => {}
    }
    if let Some(fix) = &error.fix {
        parts.set_item("fix", fix)?;
    }
    Ok(parts)
}

/// The description of an in-memory model: a listing of its tensors laid over its config
/// (`safetensors::load_listed`), or a config alone.
fn in_memory(model: &HashMap<String, Option<String>>) -> Result<vramplan_api::ModelSource, InputError> {
    let get = |key: &str| model.get(key).cloned().flatten();
    let origin = get("origin").unwrap_or_else(|| "model".to_string());
    let config_origin = format!("{origin}.config");
    match (get("config"), get("listing")) {
        (config, Some(listing)) => {
            let description: ModelDescription = safetensors::load_listed(
                config.as_deref().map(|text| (text, config_origin.as_str())),
                &listing,
                &origin,
                ImportOptions::default(),
            )?;
            Ok(vramplan_api::ModelSource::Description(Box::new(description)))
        }
        (Some(text), None) => Ok(vramplan_api::ModelSource::ConfigJson { text, origin }),
        (None, None) => Err(InputError::new(origin, "an in-memory model with neither a config nor tensors")
            .with_fix("give a config dict, a PretrainedConfig or a torch.nn.Module")),
    }
}

/// Runs `argv` (no program name) with the GIL released. Returns (exit code, stdout, error
/// parts or None).
#[pyfunction]
#[pyo3(signature = (argv, model=None))]
fn call<'py>(
    py: Python<'py>,
    argv: Vec<String>,
    model: Option<HashMap<String, Option<String>>>,
) -> PyResult<(i32, String, Option<Bound<'py, PyDict>>)> {
    let outcome = py.detach(move || {
        catch_unwind(AssertUnwindSafe(|| -> Result<Captured, InputError> {
            let source = model.as_ref().map(in_memory).transpose()?;
            let mut args = vec!["vramplan".to_string()];
            args.extend(argv);
            Ok(vramplan::run_captured(args, source))
        }))
    });
    match outcome {
        Ok(Ok(captured)) => {
            let out = String::from_utf8_lossy(&captured.out).into_owned();
            let error = captured.error.as_ref().map(|e| error_parts(py, e)).transpose()?;
            Ok((captured.code, out, error))
        }
        Ok(Err(error)) => Ok((vramplan::EXIT_BAD_INPUT, String::new(), Some(error_parts(py, &error)?))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_string());
            let parts = PyDict::new(py);
            parts.set_item("kind", "internal")?;
            parts.set_item("problem", format!("vramplan failed: {what} (please report it with the call)"))?;
            Ok((70, String::new(), Some(parts)))
        }
    }
}

/// The `vramplan` command: `argv` with the program name first; prints to this process's stdout
/// and stderr and returns the exit code.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(move || {
        let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
        catch_unwind(AssertUnwindSafe(|| vramplan::run(argv, &mut out, &mut err))).unwrap_or(70)
    })
}

/// The bench's Rust side (`python/bench/plan_overhead.py`): the seconds each of `repeat` runs
/// of `argv` takes inside Rust (`run_captured`, no Python in between), for the overhead the
/// Python call adds.
#[pyfunction]
fn _rust_seconds(py: Python<'_>, argv: Vec<String>, repeat: usize) -> Vec<f64> {
    py.detach(move || {
        let mut args = vec!["vramplan".to_string()];
        args.extend(argv);
        (0..repeat.clamp(1, 10_000))
            .map(|_| {
                let start = std::time::Instant::now();
                let captured = vramplan::run_captured(args.clone(), None);
                std::hint::black_box(captured);
                start.elapsed().as_secs_f64()
            })
            .collect()
    })
}

#[pymodule]
fn _vramplan(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_function(wrap_pyfunction!(call, module)?)?;
    module.add_function(wrap_pyfunction!(main, module)?)?;
    module.add_function(wrap_pyfunction!(_rust_seconds, module)?)?;
    Ok(())
}
