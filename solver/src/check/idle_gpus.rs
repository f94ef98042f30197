//! The rule a device map meets when it puts nothing on a GPU of a profile that has GPUs: a map
//! of one device runs as `model.to(device)` (`dispatch_model` hooks nothing when the map names a
//! single device), so `{"": "cpu"}` loads and runs the whole step on the CPU with every GPU at
//! 0 %: no error, only a run many times slower than it should be (the "GPU at 0 %" incident,
//! a model left on the CPU). Where every entry is on `cpu` and `disk`, the CPU runs it too.

use super::{Finding, Rule, label, listed_with_more};
use vramplan_sim::placement::Target;

/// The finding of a map that places nothing on any of the profile's `gpus` GPUs, if any.
pub fn idle_gpus(entries: &[(String, Target)], gpus: usize) -> Option<Finding> {
    if gpus == 0 || entries.is_empty() || entries.iter().any(|(_, t)| matches!(t, Target::Gpu(_))) {
        return None;
    }
    let mut devices: Vec<String> = Vec::new();
    for (_, t) in entries {
        if !devices.contains(&label(*t)) {
            devices.push(label(*t));
        }
    }
    let modules: Vec<String> = entries.iter().map(|(k, _)| k.clone()).collect();
    let shown: Vec<String> = modules
        .iter()
        .map(|m| if m.is_empty() { "`\"\"` (the whole model)".to_string() } else { format!("`{m}`") })
        .collect();
    let gpus_text = if gpus == 1 { "GPU 0".to_string() } else { format!("GPUs 0 to {}", gpus - 1) };
    let message = format!(
        "The map puts {} on {} and nothing on the profile's {gpus_text}. With no GPU in the map, \
         `from_pretrained` leaves the model on the CPU (`dispatch_model` hooks nothing when a map names \
         one device), the whole step runs there, and the GPU sits at 0 %: no error, a run many times \
         slower. Fix: put the model on a GPU, `device_map={{\"\": 0}}` (or `model.to(\"cuda\")`), or \
         let `vramplan plan` place it.",
        listed_with_more(&shown),
        devices.join(" and "),
    );
    Some(Finding { rule: Rule::GpusIdle, modules, devices, message })
}
