//! The planted device maps of `fixtures/reference/mismatches/v5.json`, whose outcomes the real
//! runtime gave (transformers, accelerate and PyTorch on fake GPUs, through the `torch`
//! backend's harness: `scripts/reference/mismatches.py`): `validate --backend cpu` must stop in
//! the same module with the same two devices, or complete where the runtime completed, and say
//! the same bytes were placed on each device; the static check must find a problem exactly where
//! the runtime met one. Among them: a listed tensor, and a listed module, inside a listed
//! layer; and LoRA (PEFT) steps, with adapters on two GPUs, next to a split tied group, and with
//! a frozen and an adapted module offloaded. Two more planted maps the real runtime cannot run on fake GPUs (a
//! transformers 4.x Mixtral loops over the experts a batch hits, a data-dependent shape; a
//! custom model has no Python class) are checked against accelerate's rules as the cpu
//! backend's docs state them.

use serde_json::Value;
use std::collections::BTreeSet;
use vramplan_tests::{Output, vramplan, write};

fn fixture() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference/mismatches/v5.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn hardware(gpus: u64) -> &'static str {
    if gpus == 1 { "t4" } else { "2xt4" }
}

fn devices(v: &Value) -> BTreeSet<String> {
    v.as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect()
}

/// The device map of `[name, device]` pairs as a JSON object in their order (the first GPU it
/// lists is accelerate's main device).
fn map_text(pairs: &Value) -> String {
    let entries: Vec<String> =
        pairs.as_array().unwrap().iter().map(|p| format!("{}: {}", p[0], p[1])).collect();
    format!("{{{}}}", entries.join(", "))
}

/// `validate MODEL --device-map MAP --hardware HW --batch 2 --seq 16 --backend cpu --json`, and
/// `extra` (the mode, the target, `--run-anyway`).
fn validate_cpu(model: &str, map: &str, hardware: &str, extra: &[&str]) -> Output {
    let base = [
        "validate",
        model,
        "--device-map",
        map,
        "--hardware",
        hardware,
        "--batch",
        "2",
        "--seq",
        "16",
        "--backend",
        "cpu",
        "--json",
    ];
    vramplan(&[&base[..], extra].concat())
}

/// The run stopped in `module` on a mismatch between GPU 0 and GPU 1, and the static check
/// found `rule` (exit 1 either way).
fn assert_stopped(out: &Output, module: &str, rule: &str) {
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let got = out.json();
    let outcome = &got["run"]["outcome"];
    assert_eq!(outcome["error"], "device_mismatch", "{outcome}");
    assert_eq!(outcome["module"], module, "{outcome}");
    assert_eq!(devices(&outcome["devices"]), BTreeSet::from(["cuda:0".into(), "cuda:1".into()]));
    assert!(got["findings"].as_array().unwrap().iter().any(|f| f["rule"] == rule), "{}", got["findings"]);
}

#[test]
fn the_cpu_backend_and_the_static_check_agree_with_the_real_runtime_on_every_planted_map() {
    let doc = fixture();
    let records = doc["records"].as_array().unwrap();
    assert_eq!(records.len(), 33);
    let dir = tempfile::tempdir().unwrap();
    let mut mismatches = 0;
    let mut tied = 0;
    let mut loras = 0;
    for (i, r) in records.iter().enumerate() {
        let name = format!("{} {}", r["name"].as_str().unwrap(), r["mode"].as_str().unwrap());
        let config = write(dir.path(), &format!("config{i}.json"), r["config"].to_string());
        let map = write(dir.path(), &format!("map{i}.json"), map_text(&r["device_map"]));
        assert_eq!((r["batch"].as_u64(), r["seq"].as_u64()), (Some(2), Some(16)), "{name}");
        let mode = r["mode"].as_str().unwrap();
        let mut extra = vec!["--mode".to_string(), mode.to_string(), "--run-anyway".to_string()];
        if let Some(lora) = r["lora"].as_object() {
            let targets: Vec<&str> =
                lora["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
            extra.extend([
                "--lora-rank".into(),
                lora["rank"].to_string(),
                "--lora-targets".into(),
                targets.join(","),
            ]);
            loras += 1;
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let out = validate_cpu(&config, &map, hardware(r["gpus"].as_u64().unwrap()), &extra);
        assert!(out.code == 0 || out.code == 1, "{name}: {}\n{}", out.stdout, out.stderr);
        let got = out.json();
        let run = &got["run"];
        let real = r["outcome"].as_str().unwrap();
        let ours = run["outcome"]["kind"].as_str().unwrap();
        if real == "completed" {
            assert_eq!(ours, "completed", "{name}: {}", run["outcome"]);
        } else {
            assert_eq!(ours, "runtime_error", "{name}: {}", run["outcome"]);
            assert_eq!(run["outcome"]["error"], real, "{name}");
            assert_eq!(run["outcome"]["module"], r["module"], "{name}");
            assert_eq!(devices(&run["outcome"]["devices"]), devices(&r["mismatched"]), "{name}");
        }
        assert_eq!(run["placed"], r["placed"], "{name}: bytes per device once placed");
        // The static rules: a finding exactly where the runtime stopped or left weights untrained;
        // besides, idle GPUs where the map puts nothing on one (the run completes, on the CPU).
        let findings = got["findings"].as_array().unwrap();
        let found = findings.iter().any(|f| f["rule"] != "gpus-idle");
        assert_eq!(found, real != "completed", "{name}: findings {}", got["findings"]);
        let idle = findings.iter().any(|f| f["rule"] == "gpus-idle");
        assert_eq!(idle, r["name"] == "llama-all-on-cpu", "{name}: findings {}", got["findings"]);
        // A split tied group names the module the runtime stopped in (accelerate re-ties the
        // storage to the group's first name in sorted order, so the other module meets it).
        for f in got["findings"].as_array().unwrap().iter().filter(|f| f["rule"] == "tied-weights-split") {
            let module = r["module"].as_str().unwrap();
            let message = f["message"].as_str().unwrap();
            assert!(message.contains(&format!("so `{module}` on")), "{name}: {message}");
            tied += 1;
        }
        assert_eq!(out.code, if real == "completed" { 0 } else { 1 }, "{name}");
        mismatches += usize::from(real == "device_mismatch");
    }
    assert_eq!(mismatches, 9);
    assert_eq!(tied, 4, "the Llama tied splits (one with LoRA) and XLNet's");
    assert_eq!(loras, 5);
}

/// transformers 4.x's Mixtral runs each expert a batch hits and weights its output in the MoE
/// block: an expert on another GPU than the router meets the routing weights there.
#[test]
fn a_mixtral_expert_apart_from_its_router_under_accelerate_v4_stops_in_the_moe_block() {
    let doc = fixture();
    let config = doc["records"].as_array().unwrap().iter().find(|r| r["name"] == "mixtral-two-gpus").unwrap()
        ["config"]
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "config.json", config);
    let map = r#"{"model.embed_tokens": 0, "model.layers.0.self_attn": 0, "model.layers.0.input_layernorm": 0,
        "model.layers.0.post_attention_layernorm": 0, "model.layers.0.block_sparse_moe.gate": 0,
        "model.layers.0.block_sparse_moe.experts.0": 0, "model.layers.0.block_sparse_moe.experts.1": 1,
        "model.layers.0.block_sparse_moe.experts.2": 0, "model.layers.0.block_sparse_moe.experts.3": 0,
        "model.layers.1": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}"#;
    let map = write(dir.path(), "map.json", map);
    for mode in ["inference", "train"] {
        let out = validate_cpu(
            &config,
            &map,
            "2xt4",
            &["--target", "accelerate-v4", "--mode", mode, "--run-anyway"],
        );
        // Not the expert, whose hook moved its input to GPU 1: the block that weights its output.
        assert_stopped(&out, "model.layers.0.block_sparse_moe", "experts-apart-from-router");
    }
}

/// A custom module whose state buffer the map lists on another GPU than the module's own
/// tensors, with the module itself unlisted: no hook gathers them, so its forward meets both.
#[test]
fn a_custom_models_state_buffer_apart_from_its_module_stops_in_that_module() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/xlnet-memory-mixture.yaml");
    let mut entries = vec![
        r#""transformer.word_embedding": 0"#.to_string(),
        r#""transformer.mask_emb": 0"#.to_string(),
        r#""lm_loss": 0"#.to_string(),
    ];
    for i in 0..12 {
        entries.push(format!(r#""transformer.layer.{i}": {}"#, u32::from(i >= 6)));
    }
    for tensor in ["slot_keys", "slot_values", "usage", "query", "gate", "norm"] {
        entries.push(format!(r#""transformer.memory.{tensor}": 1"#));
    }
    entries.push(r#""transformer.memory.state": 0"#.to_string());
    let dir = tempfile::tempdir().unwrap();
    let map = write(dir.path(), "map.json", format!("{{{}}}", entries.join(", ")));
    let out = validate_cpu(model, &map, "2xt4", &["--mode", "train", "--run-anyway"]);
    assert_stopped(&out, "transformer.memory", "split-block");
    // Without --run-anyway the static finding alone answers, and nothing runs.
    let out = validate_cpu(model, &map, "2xt4", &["--mode", "train"]);
    assert_eq!(out.code, 1);
    assert!(out.json().get("run").is_none());
}
