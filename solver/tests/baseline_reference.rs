//! The greedy baseline against what `from_pretrained(device_map="auto")` really produced.
//!
//! `fixtures/reference/maps/v5.json` (transformers 5.x) and `v4.json` (transformers 4.x with
//! accelerate 1.x) record, per (model, hardware, dtype, quantization) case, the budgets
//! transformers read from simulated GPUs whose free memory is the hardware profile's, the
//! `max_memory` it finally gave `infer_auto_device_map`, and the map it returned
//! (`scripts/reference/maps.py` runs transformers' own code on the meta model). For every case
//! the built-in model (5.x names for v5, 4.x names for v4) and the profile are loaded, and the
//! baseline of the matching target (`accelerate`, `accelerate-v4`) must give:
//! (a) the same raw budgets (`gpus_free_bytes`, `cpu_available_bytes`);
//! (b) the same final `max_memory`, within 1 byte per device: transformers' budgets are floats
//!     (× 0.9 shares) that the fixture truncates with `int()`, as [`greedy::max_memory`] does,
//!     so the byte of slack only absorbs a float rounding on the other side of an integer;
//! (c) the same map: the same keys in the same order on the same devices.
//!
//! No Python runs here; the fixture is data. A table of matches is printed (`--nocapture`) and
//! any mismatch fails the test. Debugging aids: `VRAMPLAN_REFERENCE_MAPS=<dir>` reads the
//! fixtures from another folder, `BASELINE_ONLY="<model> <hardware>"` (a substring) checks only
//! the matching cases, `BASELINE_SHOW=1` prints both maps of a mismatch.

use serde_json::Value;
use std::path::PathBuf;
use vramplan_profiles::DType;
use vramplan_profiles::hardware;
use vramplan_profiles::model::{self, ImportOptions, Naming};
use vramplan_sim::workload::{Quant, Workload};
use vramplan_solver::greedy::{self, Sizing, Strategy};
use vramplan_solver::{Runtime, Target};

/// The fixture `name`, from `fixtures/reference/maps` or the folder `VRAMPLAN_REFERENCE_MAPS`
/// names (to check a regenerated reference before it replaces the committed one).
fn fixture(name: &str) -> Value {
    let dir = std::env::var_os("VRAMPLAN_REFERENCE_MAPS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/maps"),
        PathBuf::from,
    );
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The cases of a fixture: a list, or an object with `cases`.
fn cases(doc: &Value) -> &Vec<Value> {
    match doc {
        Value::Array(cases) => cases,
        other => other["cases"].as_array().expect("`cases` is a list"),
    }
}

fn dtype(name: &str) -> DType {
    match name {
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float32" => DType::F32,
        other => panic!("unknown dtype {other}"),
    }
}

fn quant(name: &str) -> Quant {
    match name {
        "none" => Quant::None,
        // BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"): no double quant.
        "nf4" => Quant::Nf4 { double_quant: false },
        "int8" => Quant::Int8,
        other => panic!("unknown quantization {other}"),
    }
}

/// A device as the fixture writes it: a GPU index, "cpu" or "disk".
fn device(tier: Target) -> Value {
    match tier {
        Target::Gpu(i) => Value::from(i),
        Target::Cpu => Value::from("cpu"),
        Target::Disk => Value::from("disk"),
    }
}

fn max_memory_key(tier: Target) -> String {
    match tier {
        Target::Gpu(i) => i.to_string(),
        Target::Cpu => "cpu".into(),
        Target::Disk => "disk".into(),
    }
}

fn show(device: &Value) -> String {
    match device {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What went wrong with one case, or nothing.
fn check(case: &Value, naming: Naming, runtime: Runtime) -> Vec<String> {
    let mut problems = Vec::new();
    let name = case["model"].as_str().expect("model");
    let hw_name = case["hardware"].as_str().expect("hardware");
    let load_dtype = dtype(case["dtype"].as_str().expect("dtype"));
    // The recording strips a built-in's own `quantization_config` (`maps.py`): the same model
    // dequantized.
    let model = model::load(name, ImportOptions { naming }).expect("built-in model").dequantized(load_dtype);
    let hw = hardware::load(hw_name).expect("built-in profile");
    let workload = Workload {
        weight_dtype: Some(load_dtype),
        quant: quant(case["quant"].as_str().expect("quant")),
        ..Workload::default()
    };
    let sizing = Sizing::for_target(&model, &workload, runtime);

    // (a) the raw budgets.
    let (gpus, cpu) = greedy::free_memory(&hw);
    let ours: Vec<u64> = gpus.iter().map(|g| g.1 as u64).collect();
    let theirs: Vec<u64> =
        case["gpus_free_bytes"].as_array().expect("gpus").iter().filter_map(Value::as_u64).collect();
    if ours != theirs {
        problems.push(format!("gpus_free_bytes: ours {ours:?}, transformers {theirs:?}"));
    }
    let their_cpu = case["cpu_available_bytes"].as_u64().expect("cpu");
    if cpu as u64 != their_cpu {
        problems.push(format!("cpu_available_bytes: ours {}, transformers {their_cpu}", cpu as u64));
    }

    // (b) the final max_memory.
    let budgets = greedy::max_memory(&hw, &sizing, Strategy::Balanced, Some(&model));
    let used = case["max_memory_used"].as_object().expect("max_memory_used");
    let mut keys: Vec<String> = budgets.iter().map(|b| max_memory_key(b.tier)).collect();
    let mut their_keys: Vec<String> = used.keys().cloned().collect();
    keys.sort();
    their_keys.sort();
    if keys != their_keys {
        problems.push(format!("max_memory devices: ours {keys:?}, transformers {their_keys:?}"));
    }
    for budget in &budgets {
        let key = max_memory_key(budget.tier);
        let Some(theirs) = used.get(&key).and_then(Value::as_f64) else { continue };
        if (budget.bytes as f64 - theirs).abs() > 1.0 {
            problems.push(format!("max_memory[{key}]: ours {}, transformers {theirs}", budget.bytes));
        }
    }

    // (c) the map.
    let map = greedy::auto_device_map(&model, &sizing, &budgets);
    let expected: Vec<(String, Value)> = case["device_map"]
        .as_array()
        .expect("device_map")
        .iter()
        .map(|e| (e[0].as_str().expect("module").to_string(), e[1].clone()))
        .collect();
    let got: Vec<(String, Value)> = map.iter().map(|(n, t)| (n.clone(), device(*t))).collect();
    if got != expected && std::env::var_os("BASELINE_SHOW").is_some() {
        println!("    ours:         {got:?}\n    transformers: {expected:?}");
    }
    if got != expected {
        let first = (0..got.len().max(expected.len())).find(|&i| got.get(i) != expected.get(i)).unwrap_or(0);
        let at = |m: &[(String, Value)]| {
            m.get(first).map_or("(end)".to_string(), |(n, d)| format!("{n:?} on {}", show(d)))
        };
        problems.push(format!(
            "device_map: {} entries vs {}; first difference at #{first}: ours {}, transformers {}",
            got.len(),
            expected.len(),
            at(&got),
            at(&expected)
        ));
        // A diagnosis, not a pass: modules the description does not hold (no tensors, such as
        // `nn.Dropout`) cannot appear in our map; say when they are the whole difference.
        let held_by_us = |n: &str| model.root.find(n).is_some() || model.root.tensor(n).is_some();
        let absent: Vec<&str> = expected.iter().map(|e| e.0.as_str()).filter(|n| !held_by_us(n)).collect();
        let held: Vec<(String, Value)> =
            expected.iter().filter(|e| !absent.contains(&e.0.as_str())).cloned().collect();
        if !absent.is_empty() && held == got {
            problems.push(format!("the only difference: modules absent from the description {absent:?}"));
        }
    }
    problems
}

/// Checks every case of `file`, prints the table, and fails on any mismatch.
fn run(file: &str, naming: Naming, runtime: Runtime) {
    let doc = fixture(file);
    if let Some(versions) = doc.get("versions") {
        println!("{file}: {versions}");
    }
    let mut failures = Vec::new();
    let all = cases(&doc);
    println!("{:<20} {:<14} {:<9} {:<5} result", "model", "hardware", "dtype", "quant");
    for case in all {
        if let Ok(only) = std::env::var("BASELINE_ONLY")
            && !format!(
                "{} {}",
                case["model"].as_str().unwrap_or(""),
                case["hardware"].as_str().unwrap_or("")
            )
            .contains(&only)
        {
            continue;
        }
        if let Some(error) = case.get("error").and_then(Value::as_str) {
            // Every recorded case has a map today; one without is not a match.
            failures.push(format!("{}: transformers failed before a map ({error})", case["model"]));
            continue;
        }
        let problems = check(case, naming, runtime);
        let label = format!(
            "{:<20} {:<14} {:<9} {:<5}",
            case["model"].as_str().unwrap_or("?"),
            case["hardware"].as_str().unwrap_or("?"),
            case["dtype"].as_str().unwrap_or("?"),
            case["quant"].as_str().unwrap_or("?")
        );
        if problems.is_empty() {
            println!("{label} match");
        } else {
            println!("{label} MISMATCH");
            for p in &problems {
                println!("    {p}");
            }
            failures.push(format!("{label}: {}", problems.join("; ")));
        }
    }
    println!("{file}: {}/{} cases match", all.len() - failures.len(), all.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn greedy_equals_transformers_5_device_map_auto() {
    run("v5.json", Naming::V5, Runtime::Accelerate);
}

#[test]
fn greedy_equals_transformers_4_with_accelerate_on_the_v4_target() {
    run("v4.json", Naming::V4, Runtime::AccelerateV4);
}
