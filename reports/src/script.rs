//! `vramplan validate --script`'s report: how the user's script ended on the fake GPUs (the
//! mismatch with its file, line, operation, devices and shapes; the out-of-memory; the idle
//! GPUs), the fix in words, and per GPU the memory the run held.

use crate::table::Table;
use vramplan_profiles::units::format_bytes;
use vramplan_validate::{Location, RankRun, ScriptOutcome, ScriptValidation, Unavailable};

/// The human report of a script run on `hardware_name`'s GPUs.
pub fn script_table(run: &ScriptValidation, hardware_name: &str, nproc: u32) -> String {
    let answer = run.ranks.iter().find(|r| r.rank == run.rank);
    let ranks = if nproc > 1 { format!(", {nproc} ranks") } else { String::new() };
    let mut text = format!("validate --script on {hardware_name}{ranks}: {}\n", headline(run, nproc));
    if let Some(rank) = answer {
        text += &details(run, rank, nproc);
    }
    if nproc > 1 {
        let mut table = Table::new(&["rank", "outcome", "where", "steps", "peak allocated", "on"]);
        for r in &run.ranks {
            let own = r.per_device.iter().max_by_key(|d| d.peak_allocated_bytes);
            table.row(&[
                &r.rank.to_string(),
                outcome_words(r.outcome),
                &r.location.as_ref().map_or_else(|| "-".to_string(), place),
                &r.steps.to_string(),
                &own.map_or_else(|| "-".to_string(), |d| format_bytes(d.peak_allocated_bytes)),
                &own.map_or_else(|| "-".to_string(), |d| format!("GPU {}", d.device)),
            ]);
        }
        text += "\n";
        text += &table.render();
    }
    let used: Vec<_> = run.per_device.iter().filter(|d| d.peak_allocated_bytes > 0).collect();
    if run.per_device.is_empty() || (used.is_empty() && run.outcome == ScriptOutcome::Error) {
        // Nothing was measured, or nothing reached a GPU before the error: no table to give.
    } else if used.is_empty() {
        text += "\nno tensor was made on a GPU\n";
    } else {
        text += "\n";
        let mut table =
            Table::new(&["GPU", "peak allocated", "peak reserved", "device used", "usable", "peak at"]);
        for d in used {
            let at = match &d.peak_at {
                Some(l) if d.peak_module.is_empty() => place(l),
                Some(l) => format!("{} ({})", place(l), d.peak_module),
                None => d.peak_module.clone(),
            };
            table.row(&[
                &format!("{} ({})", d.device, d.name),
                &format_bytes(d.peak_allocated_bytes),
                &format_bytes(d.peak_reserved_bytes),
                &format_bytes(d.device_used_bytes),
                &format_bytes(d.usable_bytes),
                &at,
            ]);
        }
        text += &table.render();
        let idle: Vec<String> = run
            .per_device
            .iter()
            .filter(|d| d.peak_allocated_bytes == 0)
            .map(|d| format!("GPU {} ({})", d.device, d.name))
            .collect();
        if !idle.is_empty() {
            text += &format!(
                "{} held nothing: the run never used {}\n",
                idle.join(", "),
                if idle.len() == 1 { "it" } else { "them" }
            );
        }
        text += "\nallocated: every storage on the GPU from creation to death; reserved: the same allocations \
                 through PyTorch's caching allocator (vramplan's model); device used: reserved plus the CUDA \
                 context\n";
    }
    let notes: Vec<&String> = run.ranks.iter().flat_map(|r| r.notes.iter()).collect();
    if !notes.is_empty() {
        text += "\nvalues the script read from GPU tensors (fake tensors have none):\n";
        let mut seen = std::collections::BTreeSet::new();
        for note in notes {
            if seen.insert(note) {
                text += &format!("  {note}\n");
            }
        }
    }
    text
}

/// `train.py:42 in step`.
fn place(l: &Location) -> String {
    let file = l.file_name();
    if l.function == "<module>" {
        format!("{file}:{}", l.line)
    } else {
        format!("{file}:{} in {}", l.line, l.function)
    }
}

fn outcome_words(outcome: ScriptOutcome) -> &'static str {
    match outcome {
        ScriptOutcome::Completed => "completed",
        ScriptOutcome::DeviceMismatch => "device mismatch",
        ScriptOutcome::OutOfMemory => "out of memory",
        ScriptOutcome::GpuIdle => "GPUs idle",
        ScriptOutcome::Error => "error",
    }
}

/// Whose GPU `device` is, under `torchrun` with `nproc` ranks (rank r on GPU r).
fn owner(device: &str, nproc: u32) -> String {
    match device.strip_prefix("cuda:").and_then(|i| i.parse::<u32>().ok()) {
        Some(i) if nproc > 1 && i < nproc => format!("{device} (rank {i}'s GPU)"),
        _ => device.to_string(),
    }
}

fn headline(run: &ScriptValidation, nproc: u32) -> String {
    let rank = if nproc > 1 { format!(" in rank {}", run.rank) } else { String::new() };
    match run.outcome {
        ScriptOutcome::Completed => {
            let steps = run.ranks.iter().map(|r| r.steps).max().unwrap_or(0);
            let forwards = run.ranks.iter().map(|r| r.forwards).max().unwrap_or(0);
            if steps > 0 {
                format!("completed {steps} optimizer step{}", if steps == 1 { "" } else { "s" })
            } else {
                format!("completed {forwards} forward pass{}", if forwards == 1 { "" } else { "es" })
            }
        }
        ScriptOutcome::DeviceMismatch => {
            let devices: Vec<String> = run.devices.iter().map(|d| owner(d, nproc)).collect();
            format!("device mismatch{rank}: {}", devices.join(" and "))
        }
        ScriptOutcome::OutOfMemory => format!("out of memory{rank} on {}", run.devices.join(", ")),
        ScriptOutcome::GpuIdle => "the GPUs sat idle: every operation ran on the CPU".to_string(),
        ScriptOutcome::Error => format!("the script stopped with an error{rank}"),
    }
}

fn details(run: &ScriptValidation, rank: &RankRun, nproc: u32) -> String {
    let mut text = String::new();
    if let Some(l) = &run.location {
        text += &format!("  at {}:{} in {}\n", l.file, l.line, l.function);
    }
    match run.outcome {
        ScriptOutcome::DeviceMismatch => {
            if let Some(m) = &rank.mismatch {
                let shapes: Vec<String> = m.shapes.iter().map(|(s, d)| format!("{s:?} on {d}")).collect();
                text +=
                    &format!("  operation: {} ({}), tensors: {}\n", m.operation, m.phase, shapes.join(", "));
            }
            if !rank.module.is_empty() {
                text += &format!("  module running: {}\n", rank.module);
            }
            text += &format!("  PyTorch's error: {}\n", rank.message.lines().next().unwrap_or(""));
            text += &mismatch_fix(rank, nproc);
        }
        ScriptOutcome::OutOfMemory => {
            if !rank.module.is_empty() && run.outcome == rank.outcome {
                text += &format!("  module running: {}\n", rank.module);
            }
            text += &format!("  {}\n", run.message);
            text += "  fix: a smaller batch or sequence, gradient checkpointing, LoRA or quantization (`vramplan \
                     whatif` sizes each), or more GPUs\n";
        }
        ScriptOutcome::GpuIdle => {
            text += "  the profile has GPUs and the script never put a tensor on one: the model and the batches \
                     stay on the CPU\n  fix: `model.to(device)` and each batch `.to(device)`, with device = \
                     torch.device(\"cuda\")\n";
        }
        ScriptOutcome::Error => {
            let lines: Vec<&str> = run.message.lines().collect();
            let shown = lines.len().min(14);
            for line in &lines[lines.len() - shown..] {
                text += &format!("  {line}\n");
            }
        }
        ScriptOutcome::Completed => {}
    }
    text
}

/// The fix for a mismatch, in the user's terms.
fn mismatch_fix(rank: &RankRun, nproc: u32) -> String {
    let cpu = rank.devices.iter().any(|d| d == "cpu");
    let gpus: Vec<&String> = rank.devices.iter().filter(|d| d.starts_with("cuda")).collect();
    if cpu {
        "  fix: make the CPU tensor where its partner is: `device=x.device` when creating it, or `.to(x.device)` \
         (a parameter made after `from_pretrained(device_map=...)` must be moved to the device of the layer that \
         uses it)\n"
            .to_string()
    } else if nproc > 1 && gpus.len() == 2 {
        format!(
            "  fix: rank {} must keep its tensors on its own GPU: create them with `device=x.device` (or the \
             rank's `torch.device(\"cuda\", LOCAL_RANK)`), not a fixed `cuda:N`\n",
            rank.rank
        )
    } else {
        "  fix: move one tensor to the other's device (`.to(x.device)`) before the operation\n".to_string()
    }
}

/// Why `validate --script` could not run the script, in the user's terms.
pub fn script_unavailable_message(why: &Unavailable) -> String {
    match why {
        Unavailable::TooFewDevices { needed, found } => format!(
            "validate --script --real-gpus: the profile has {} GPU{} and this machine {found}; give the profile \
             of this machine's GPUs, or leave out --real-gpus to run on fake ones",
            needed.len(),
            if needed.len() == 1 { "" } else { "s" }
        ),
        Unavailable::NoPython { python, error } => format!(
            "validate --script: `{python}` did not run vramplan's harness ({error}); give the Python your script \
             runs with (torch installed) with --python PATH"
        ),
        Unavailable::MissingLibrary { python, message } => format!(
            "validate --script: `{python}` cannot import torch ({message}); give the Python your script runs \
             with, with --python PATH"
        ),
        other => crate::unavailable_message(vramplan_validate::Backend::Torch, other),
    }
}
