//! `--expert-load`: the tokens routed to each expert, per MoE layer, read and checked against
//! the model, for `--target expert-parallel` plans.

use crate::InputError;
use std::collections::BTreeMap;
use std::path::Path;
use vramplan_profiles::model::ModelDescription;
use vramplan_solver::Runtime;
use vramplan_solver::build::experts_module;

/// Reads `--expert-load`: `{"model.layers.3.mlp.experts": [tokens per expert, …], …}`, one
/// entry per MoE layer (keyed by its experts module or its block), each with one finite,
/// non-negative load per routed expert. Refused on a dense model and for a target that does
/// not read it (only `expert-parallel` places experts one by one).
pub(crate) fn read_expert_load(
    path: &Path,
    model: &ModelDescription,
    runtime: Runtime,
) -> Result<BTreeMap<String, Vec<f64>>, InputError> {
    let origin = path.display().to_string();
    let Some(moe) = &model.facts.moe else {
        return Err(InputError::new(
            "--expert-load",
            format!("{} is a dense model: it has no experts to load", model.name),
        )
        .with_fix("leave out --expert-load; it is for mixture-of-experts models"));
    };
    if runtime != Runtime::ExpertParallel {
        return Err(InputError::new(
            "--expert-load",
            format!("--target {} places whole layers and would ignore the expert loads", runtime.name()),
        )
        .with_fix("add `--target expert-parallel`, or leave out --expert-load"));
    }
    let text = vramplan_profiles::files::read_text(path, vramplan_profiles::files::FileKind::ExpertLoad)?;
    let example =
        "write `{\"model.layers.3.mlp.experts\": [1200, 800, …]}`: tokens per expert, per MoE layer";
    let loads: BTreeMap<String, Vec<f64>> =
        serde_json::from_str(&text).map_err(|e| InputError::json(origin.clone(), &e).with_fix(example))?;
    if let Some(key) = vramplan_profiles::json_keys::repeated_key(text.as_bytes()) {
        let e = InputError::new(origin.clone(), format!("`{key}` is listed twice"))
            .with_fix("give each MoE layer's loads once");
        return Err(match vramplan_sim::device_map::locate_key(&text, &key, 1) {
            Some((line, column)) => e.at_line(line, column),
            None => e.at_key(key),
        });
    }
    // Each MoE layer: its block path and its experts module's path.
    let layers: Vec<(String, String)> = model
        .facts
        .layers
        .iter()
        .filter(|l| l.moe)
        .map(|l| {
            let experts = experts_module(model, &l.path).map_or_else(|| l.path.clone(), |m| m.path.clone());
            (l.path.clone(), experts)
        })
        .collect();
    let at = |key: &str, problem: String| {
        let e = InputError::new(origin.clone(), problem);
        match vramplan_sim::device_map::locate_key(&text, key, 0) {
            Some((line, column)) => e.at_line(line, column),
            None => e.at_key(key),
        }
    };
    let mut seen: BTreeMap<usize, &str> = BTreeMap::new();
    for (key, values) in &loads {
        let Some(layer) = layers.iter().position(|(block, experts)| key == block || key == experts) else {
            let first = layers.first().map_or("model.layers.0.mlp.experts", |(_, e)| e.as_str());
            return Err(at(key, format!("`{key}` is not a MoE layer of {}", model.name))
                .with_fix(format!("key each MoE layer by its experts module, e.g. `{first}`")));
        };
        if let Some(other) = seen.insert(layer, key) {
            return Err(at(key, format!("`{key}` and `{other}` are the same layer"))
                .with_fix("give each MoE layer once"));
        }
        if values.len() != moe.experts as usize {
            return Err(at(
                key,
                format!(
                    "`{key}` has {} loads, but {} has {} routed experts per layer",
                    values.len(),
                    model.name,
                    moe.experts
                ),
            )
            .with_fix(format!(
                "give {} numbers, the tokens routed to each expert in expert order",
                moe.experts
            )));
        }
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0)) {
            return Err(at(key, format!("`{key}`[{i}] is {v}: a load counts tokens, a finite number ≥ 0"))
                .with_fix("give the tokens routed to each expert, 0 for an expert that got none"));
        }
    }
    let missing: Vec<&str> = layers
        .iter()
        .enumerate()
        .filter(|(i, _)| !seen.contains_key(i))
        .map(|(_, (_, e))| e.as_str())
        .collect();
    if !missing.is_empty() {
        let shown: Vec<&str> = missing.iter().take(3).copied().collect();
        let more = if missing.len() > 3 { ", …" } else { "" };
        return Err(InputError::new(
            origin,
            format!(
                "no loads for {} of the {} MoE layers of {}: {}{more}",
                missing.len(),
                layers.len(),
                model.name,
                shown.join(", ")
            ),
        )
        .with_fix("give every MoE layer's loads, measured over the same tokens"));
    }
    Ok(loads)
}
