//! Device maps at any granularity, against the real runtime: for one built-in of every
//! architecture, in both namings, one placement written four ways (whole layers; submodules;
//! every parameter and buffer by name; one layer split between the GPUs), and the bytes
//! transformers and accelerate put on each GPU (`fixtures/reference/granularity/`, recorded by
//! `scripts/reference/run granularity` on fake GPUs). `estimate --device-map` must load exactly
//! those bytes on each GPU.

use serde_json::Value;
use vramplan_tests::{vramplan, write};

fn check(naming: &str) -> (usize, Vec<String>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/reference/granularity")
        .join(format!("{naming}.json"));
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read fixture")).expect("JSON");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    let mut count = 0;
    for record in data["records"].as_array().expect("records") {
        let label =
            format!("{} {} ({naming})", record["model"].as_str().unwrap(), record["way"].as_str().unwrap());
        let Some(placed) = record["placed"].as_object() else {
            failures.push(format!("{label}: the runtime did not place it: {}", record["error"]));
            continue;
        };
        count += 1;
        let config = write(dir.path(), "config.json", record["config"].to_string());
        let map: serde_json::Map<String, Value> = record["device_map"]
            .as_array()
            .expect("pairs")
            .iter()
            .map(|pair| (pair[0].as_str().expect("key").to_string(), pair[1].clone()))
            .collect();
        let map = write(dir.path(), "map.json", Value::Object(map).to_string());
        let out = vramplan(&[
            "estimate",
            &config,
            "--naming",
            naming,
            "--hardware",
            "2xh100-80gb",
            "--mode",
            "inference",
            "--batch",
            "1",
            "--seq",
            "8",
            "--device-map",
            &map,
            "--json",
        ]);
        if out.code != 0 {
            failures.push(format!("{label}: exit {}: {}", out.code, out.stderr.trim()));
            continue;
        }
        let estimate = out.json();
        for gpu in 0..2u64 {
            let expected = placed.get(&format!("cuda:{gpu}")).and_then(Value::as_u64).unwrap_or(0);
            let loaded = estimate["devices"]
                .as_array()
                .expect("devices")
                .iter()
                .find(|d| d["id"] == gpu)
                .and_then(|d| d["loaded_bytes"].as_u64())
                .unwrap_or(0);
            if loaded != expected {
                failures.push(format!(
                    "{label}: GPU {gpu} loads {loaded} B, the runtime {expected} B ({:+} B)",
                    loaded as i128 - expected as i128
                ));
            }
        }
    }
    (count, failures)
}

#[test]
fn every_key_charges_what_transformers_5_places_there() {
    let (count, failures) = check("v5");
    assert!(count >= 90, "only {count} maps recorded");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_key_charges_what_transformers_4_places_there() {
    let (count, failures) = check("v4");
    assert!(count >= 90, "only {count} maps recorded");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
