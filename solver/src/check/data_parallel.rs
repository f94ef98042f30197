//! The rule a device map meets under data parallelism (DDP, ZeRO-1/2): every process loads the
//! model whole on its own GPU, so a map for one rank has one entry, the rank's GPU
//! (`device_map={"": local_rank}`; transformers reads an integer `device_map` as that).
//!
//! What the runtime does with any other map, from accelerate's source:
//! - `dispatch_model` (big_modeling.py) keeps the map as written: `model.hf_device_map =
//!   dict(device_map)`;
//! - `Accelerator.prepare` (accelerator.py), which the HF Trainer calls, raises in any
//!   distributed mode when `verify_device_map` finds a module whose `hf_device_map` has more
//!   than one entry: it counts entries, not devices, so a map listing modules one by one fails
//!   even with all of them on one GPU;
//! - and a map that spreads the model over devices would put every rank's copy on those same
//!   devices, whichever the rank.

use super::{Finding, Rule, json_device, label, listed_with_more};
use vramplan_sim::placement::Target;

/// accelerate's refusal in `Accelerator.prepare`.
const PREPARE_ERROR: &str = "\"ValueError: You can't train a model that has been loaded with \
                             `device_map='auto'` in any distributed mode.\"";

/// The finding of a map a data-parallel run over `ranks` GPUs cannot load as it is, if any:
/// more than one entry (on several devices, or listed one by one on one GPU).
pub fn data_parallel_map(entries: &[(String, Target)], ranks: usize) -> Option<Finding> {
    let mut keys: Vec<String> = Vec::new();
    let mut targets: Vec<Target> = Vec::new();
    for (key, target) in entries {
        if !keys.contains(key) {
            keys.push(key.clone());
        }
        if !targets.contains(target) {
            targets.push(*target);
        }
    }
    if keys.len() <= 1 {
        return None;
    }
    let one_entry = match targets.first() {
        Some(gpu @ Target::Gpu(_)) => json_device(*gpu),
        _ => "0".to_string(),
    };
    let fix = format!(
        "Fix: give the whole model as one entry on the rank's GPU: `{{\"\": {one_entry}}}` for this one, \
         `device_map={{\"\": local_rank}}` in `from_pretrained` for every rank."
    );
    let devices: Vec<String> = targets.iter().map(|t| label(*t)).collect();
    let message = if targets.len() > 1 || !matches!(targets[0], Target::Gpu(_)) {
        format!(
            "Under data parallelism each of the {ranks} processes loads the model whole on its own GPU, and \
             this map spreads it over {}: every rank would put its copy on these same devices, and accelerate \
             (`Accelerator.prepare`, which the HF Trainer calls) refuses it: {PREPARE_ERROR} {fix}",
            listed_with_more(&devices),
        )
    } else {
        format!(
            "The map lists {} entries, all on {}. Under data parallelism accelerate (`Accelerator.prepare`, \
             which the HF Trainer calls) counts the entries of the map, not its devices, and refuses more than \
             one: {PREPARE_ERROR} {fix}",
            keys.len(),
            devices[0],
        )
    };
    let modules: Vec<String> =
        keys.into_iter().map(|k| if k.is_empty() { "\"\"".into() } else { k }).collect();
    Some(Finding { rule: Rule::DataParallelMap, modules, devices, message })
}
