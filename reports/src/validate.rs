//! `vramplan validate`'s report: per device, the prediction beside what the run measured
//! (allocated, reserved, the driver's used bytes, the peak event), the outcome in words, and
//! why a backend could not run.

use crate::table::Table;
use vramplan_profiles::units::format_bytes;
use vramplan_sim::Estimate;
use vramplan_validate::{Backend, Outcome, Unavailable, Validation};

/// The human report of a run: the outcome, then predicted beside measured per device.
pub fn validate_table(estimate: &Estimate, run: &Validation) -> String {
    let mut text = match &run.outcome {
        Outcome::Completed => match run.backend {
            Backend::Cuda => "validate on cuda: every allocation of the step succeeded\n\n".to_string(),
            _ => format!("validate on {}: the workload's steps ran to the end\n\n", run.backend.name()),
        },
        Outcome::OutOfMemory { event, device, requested_bytes, free_bytes } => format!(
            "validate on {}: out of memory on GPU {device} at \"{event}\": a segment of {} was refused \
             with {} free\n\n",
            run.backend.name(),
            format_bytes(*requested_bytes),
            format_bytes(*free_bytes)
        ),
        Outcome::RuntimeError { error, module, message, .. } => {
            let what = match error.as_str() {
                "out_of_memory" => "out of memory",
                "device_mismatch" => "a device mismatch",
                "not_trained" => "weights the steps never trained",
                _ => "an error",
            };
            let place = if module.is_empty() { String::new() } else { format!(" in {module}") };
            let first = message.lines().next().unwrap_or("");
            format!("validate on {}: {what}{place}: {first}\n\n", run.backend.name())
        }
    };
    if !run.placed.is_empty() {
        let placed: Vec<String> = run
            .placed
            .iter()
            .map(|(device, bytes)| format!("{} on {device}", format_bytes(*bytes)))
            .collect();
        text += &format!("the model's tensors were placed: {}\n", placed.join(", "));
    }
    if run.devices.is_empty() {
        text += "no CUDA device was used, so no memory was measured\n";
        return text;
    }
    let mut table = Table::new(&[
        "device",
        "allocated (pred / meas)",
        "reserved (pred / meas)",
        "device used (pred / meas)",
        "peak at (pred / meas)",
    ]);
    for measured in &run.devices {
        let predicted = estimate.devices.iter().find(|d| d.id == measured.device);
        let pair = |p: Option<u64>, m: u64| {
            format!("{} / {}", p.map_or_else(|| "-".to_string(), format_bytes), format_bytes(m))
        };
        table.row(&[
            &format!("GPU {} ({})", measured.device, measured.name),
            &pair(predicted.map(|d| d.peak_allocated_bytes), measured.allocated_bytes),
            &pair(predicted.map(|d| d.peak_reserved_bytes), measured.reserved_bytes),
            &pair(predicted.map(|d| d.device_used_bytes), measured.driver_used_bytes),
            &format!("{} / {}", predicted.map_or("-", |d| d.peak_at.as_str()), measured.peak_event),
        ]);
    }
    text += &table.render();
    text += "\nmeasured device used is the driver's count (total − free), the CUDA context and other \
             processes included; before the run it was ";
    let before: Vec<String> = run
        .devices
        .iter()
        .map(|d| format!("{} on GPU {}", format_bytes(d.driver_used_before_bytes), d.device))
        .collect();
    text += &before.join(", ");
    text += "\n";
    text
}

/// The driver library names worth showing of those tried (the list has some thirty).
const NAMED: [&str; 3] = ["libcuda.so", "libcuda.so.1", "nvcuda.dll"];

/// Why `backend` cannot run here, and what to do.
pub fn unavailable_message(backend: Backend, why: &Unavailable) -> String {
    match why {
        Unavailable::NoDriver { tried } => {
            let shown: Vec<&str> = tried.iter().map(String::as_str).filter(|n| NAMED.contains(n)).collect();
            format!(
                "validate --backend {}: no CUDA driver here: none of the {} library names cudarc looks for loads \
                 ({} among them); run it on a machine with the NVIDIA driver, or add its folder to \
                 LD_LIBRARY_PATH",
                backend.name(),
                tried.len(),
                shown.join(", ")
            )
        }
        Unavailable::NoLibrary { library, tried } => format!(
            "validate --backend {}: no {library} library here: none of the {} names cudarc looks for loads \
             ({}); install the CUDA toolkit's {library}, or add the folder that holds it to \
             LD_LIBRARY_PATH",
            backend.name(),
            tried.len(),
            tried.iter().take(3).map(String::as_str).collect::<Vec<_>>().join(", ")
        ),
        Unavailable::DriverFailed { error } => format!(
            "validate --backend {}: the CUDA driver loaded but did not start ({error}); check that \
             `nvidia-smi` works here",
            backend.name()
        ),
        Unavailable::TooFewDevices { needed, found } => format!(
            "validate --backend {}: the plan uses GPU {} and this machine has {found} CUDA device{}; run it \
             where the plan's GPUs are",
            backend.name(),
            needed.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            if *found == 1 { "" } else { "s" }
        ),
        Unavailable::NoPython { python, error } => format!(
            "validate --backend {}: `{python}` did not run vramplan's harness ({error}); give the Python that \
             has torch, transformers and accelerate with --python PATH",
            backend.name()
        ),
        Unavailable::MissingLibrary { python, message } => format!(
            "validate --backend {}: `{python}` lacks what the harness imports ({message}); install torch, \
             transformers and accelerate (and peft for LoRA) there, or give another with --python PATH",
            backend.name()
        ),
    }
}
