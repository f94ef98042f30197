//! Maps the real runtime loads. `scripts/reference/run loads` ran each case of
//! `fixtures/reference/loads/v{4,5}.json` through `vramplan plan -o map.json` and then through
//! the real stack (a tiny random checkpoint with the model's exact module tree,
//! `from_pretrained(device_map=map)` with GPU indices mapped to `cpu`, one forward pass), and
//! recorded the map and what happened. Here every case is planned again and must give:
//!
//! 1. a map that obeys the loading rules against the runtime's own names
//!    (`fixtures/reference/models/v{4,5}/<model>.json`, from transformers on the meta device):
//!    keys are disjoint prefixes, each names a real module or tensor, every parameter and
//!    persistent buffer is covered, and every tied group sits on one device;
//! 2. the very map the runtime loaded, whose recorded outcome is a load and a forward pass.
//!    A map that changed has not been loaded by anyone: rerun the script to record it.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use vramplan_tests::vramplan;

fn reference(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference").join(path)
}

fn read_json(path: &PathBuf) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The cases of a loads file (a list, or an object holding `cases`).
fn cases(file: &Value) -> Vec<Value> {
    match file {
        Value::Array(list) => list.clone(),
        other => other["cases"].as_array().cloned().unwrap_or_default(),
    }
}

/// `[[key, device], …]` or `{key: device}` as ordered pairs.
fn map_pairs(value: &Value) -> Vec<(String, Value)> {
    match value {
        Value::Array(list) => {
            list.iter().map(|pair| (pair[0].as_str().expect("key").to_string(), pair[1].clone())).collect()
        }
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        _ => Vec::new(),
    }
}

fn covers(key: &str, path: &str) -> bool {
    key.is_empty() || path == key || path.strip_prefix(key).is_some_and(|rest| rest.starts_with('.'))
}

/// What the runtime's model says: every state-dict name (parameters under all their tied
/// names, persistent buffers), every buffer, and the tied groups.
struct RuntimeModel {
    state: Vec<String>,
    all: Vec<String>,
    tied: Vec<Vec<String>>,
}

fn runtime_model(naming: &str, model: &str) -> RuntimeModel {
    let path = reference(&format!("models/{naming}/{model}.json"));
    let json = read_json(&path);
    let names = |key: &str| -> Vec<(String, Value)> {
        json[key]
            .as_array()
            .map(|l| l.iter().map(|e| (e[0].as_str().unwrap_or_default().to_string(), e.clone())).collect())
            .unwrap_or_default()
    };
    let tied: Vec<Vec<String>> = json["tied"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .map(|g| {
                    g.as_array().map(|n| n.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                })
                .map(Option::unwrap_or_default)
                .collect()
        })
        .unwrap_or_default();
    let mut state: Vec<String> = names("parameters").into_iter().map(|(n, _)| n).collect();
    state.extend(tied.iter().flatten().cloned());
    let buffers = names("buffers");
    state.extend(buffers.iter().filter(|(_, b)| b[3].as_bool() != Some(false)).map(|(n, _)| n.clone()));
    let mut all = state.clone();
    all.extend(buffers.into_iter().map(|(n, _)| n));
    RuntimeModel { state, all, tied }
}

/// The loading rules, as sentences for each breach.
fn breaches(map: &[(String, Value)], model: &RuntimeModel) -> Vec<String> {
    let mut out = Vec::new();
    let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str()).collect();
    for a in &keys {
        for b in &keys {
            if a != b && covers(a, b) {
                out.push(format!("`{a}` sits beside its own descendant `{b}`"));
            }
        }
        if !model.all.iter().any(|name| covers(a, name)) {
            out.push(format!("`{a}` names nothing in the model"));
        }
    }
    let device_of = |name: &str| {
        map.iter().filter(|(k, _)| covers(k, name)).max_by_key(|(k, _)| k.len()).map(|(_, d)| d.clone())
    };
    let uncovered: Vec<&String> = model.state.iter().filter(|n| device_of(n).is_none()).collect();
    if !uncovered.is_empty() {
        out.push(format!(
            "{} tensors on no device, e.g. {:?}",
            uncovered.len(),
            &uncovered[..uncovered.len().min(3)]
        ));
    }
    for group in &model.tied {
        let devices: BTreeSet<String> =
            group.iter().filter_map(|n| device_of(n)).map(|d| d.to_string()).collect();
        if devices.len() > 1 {
            out.push(format!("tied {group:?} split over {devices:?}"));
        }
    }
    out
}

/// A plan that wrote no map: its exit code and output.
struct Failed {
    code: i32,
    text: String,
}

/// Plans a case again and returns its map.
fn plan_again(args: &[String]) -> Result<Vec<(String, Value)>, Failed> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("map.json");
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    // The recorded `-o` pointed at the script's own folder.
    if let Some(i) = argv.iter().position(|a| *a == "-o") {
        argv.drain(i..(i + 2).min(argv.len()));
    }
    let file_arg = file.display().to_string();
    argv.extend(["-o", &file_arg]);
    let out = vramplan(&argv);
    if out.code != 0 {
        return Err(Failed { code: out.code, text: format!("{}{}", out.stdout, out.stderr) });
    }
    let unreadable = |e: String| Failed { code: 0, text: e };
    let text = std::fs::read_to_string(&file).map_err(|e| unreadable(e.to_string()))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| unreadable(e.to_string()))?;
    Ok(map_pairs(&value))
}

fn check_file(naming: &str) -> (usize, Vec<String>) {
    let path = reference(&format!("loads/{naming}.json"));
    let file = read_json(&path);
    let mut failures = Vec::new();
    let mut count = 0;
    for case in cases(&file) {
        let args: Vec<String> = case["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let label = args.join(" ");
        let recorded_exit = case["plan_exit"].as_i64().unwrap_or(0);
        let map = match (plan_again(&args), recorded_exit) {
            (Ok(map), 0) => map,
            // A plan that wrote no map when recorded gave the runtime nothing to load; it must
            // still write none (proven "does not fit", or no answer), and is not a load case.
            (Err(Failed { code, .. }), recorded) if i64::from(code) == recorded => continue,
            (Ok(_), recorded) => {
                failures.push(format!("{label}: now fits; recorded exit {recorded}: rerun the script"));
                continue;
            }
            (Err(Failed { code, text }), _) => {
                failures.push(format!("{label}: exit {code}: {text}"));
                continue;
            }
        };
        count += 1;
        for breach in breaches(&map, &runtime_model(naming, &args[1])) {
            failures.push(format!("{label}: {breach}"));
        }
        // As dicts: the loader reads keys, not their order (serde_json reads ours sorted).
        let recorded = map_pairs(&case["device_map"]);
        let now: BTreeMap<&str, &Value> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let was: BTreeMap<&str, &Value> = recorded.iter().map(|(k, v)| (k.as_str(), v)).collect();
        if now != was {
            let differ: Vec<&&str> =
                now.keys().chain(was.keys()).filter(|k| now.get(*k) != was.get(*k)).take(3).collect();
            failures.push(format!(
                "{label}: the map differs from the one the runtime loaded (e.g. {differ:?}); rerun `scripts/reference/run loads`"
            ));
            continue;
        }
        if case["loaded"] != Value::Bool(true) || case["forward"] != Value::Bool(true) {
            failures.push(format!("{label}: the runtime did not run this map: {}", case["error"]));
        }
        // Loaded is not enough: no weight may stay on the meta device, no tied group be split.
        for field in ["meta_params_left", "tied_split_in_original_map"] {
            if case[field].as_array().is_none_or(|v| !v.is_empty()) {
                failures.push(format!("{label}: the runtime recorded `{field}`: {}", case[field]));
            }
        }
    }
    (count, failures)
}

#[test]
fn every_exported_map_loads_in_transformers_5() {
    let (count, failures) = check_file("v5");
    assert!(count >= 40, "only {count} maps were loaded by the runtime");
    assert!(failures.is_empty(), "{} of {count} cases fail:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn accelerate_v4_maps_load_in_transformers_4() {
    let (count, failures) = check_file("v4");
    assert!(count >= 1, "no 4.x load cases recorded");
    assert!(failures.is_empty(), "{} of {count} cases fail:\n{}", failures.len(), failures.join("\n"));
}
