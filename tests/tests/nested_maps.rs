//! Maps whose keys overlap (a parent listed beside its own children, on one device), against
//! transformers' own `from_pretrained` (`fixtures/reference/nested/`, recorded by
//! `scripts/reference/run nested`: a tiny checkpoint of the built-in's module tree loaded with
//! the map, then a forward pass): where the runtime loaded every weight and ran, `check` finds
//! nothing.

use serde_json::Value;
use vramplan_tests::{vramplan, write};

fn check(naming: &str, target: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/reference/nested")
        .join(format!("{naming}.json"));
    let data: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    let dir = tempfile::tempdir().expect("temp dir");
    let records = data["records"].as_array().expect("records");
    assert!(records.len() >= 5);
    for record in records {
        let name = record["name"].as_str().expect("name");
        let ran = record["loaded"] == true
            && record["forward"] == true
            && record["meta_params_left"].as_array().is_some_and(Vec::is_empty);
        // Recorded on the CPU (every device `cpu`); checked as the same map on one GPU.
        let map: serde_json::Map<String, Value> = record["device_map"]
            .as_array()
            .expect("pairs")
            .iter()
            .map(|p| (p[0].as_str().expect("key").to_string(), Value::from(0)))
            .collect();
        let map = write(dir.path(), "map.json", Value::Object(map).to_string());
        let model = record["model"].as_str().expect("model");
        let out = vramplan(&["check", &map, model, "--hardware", "h100-80gb", "--target", target, "--json"]);
        let findings = out.json()["findings"].as_array().expect("findings").clone();
        assert_eq!(findings.is_empty(), ran, "{name} ({naming}): {findings:?}, runtime {record}");
    }
}

#[test]
fn overlapping_keys_on_one_device_pass_where_transformers_5_runs_them() {
    check("v5", "accelerate");
}

#[test]
fn overlapping_keys_on_one_device_pass_where_transformers_4_runs_them() {
    check("v4", "accelerate-v4");
}
