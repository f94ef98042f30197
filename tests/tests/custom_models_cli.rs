//! Custom models on the command line as users run them (the seed scenarios of issue 11): the
//! time-series transformer at batch 8/32/64 on an RTX 4090, the graph network with DDP on four
//! GPUs and XLNet with a memory mixture on a T4 give the activations their YAML declares
//! (b·s·per_token + b·per_sample per declaring module, taken from the files' own figures), no
//! logits where there is no vocabulary; and `check` of a training map that leaves modules on the
//! CPU reports what accelerate does with them, with exit code 1 (a finding).

use std::path::PathBuf;
use vramplan_tests::{Output, vramplan, write};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/examples").join(name).display().to_string()
}

fn u(value: &serde_json::Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a number: {value}"))
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.code <= 1, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    out.json()
}

#[test]
fn time_series_transformer_at_batch_8_32_64_on_an_rtx_4090() {
    let model = example("timeseries-transformer.yaml");
    for batch in [8u64, 32, 64] {
        let b = batch.to_string();
        let out = vramplan(&[
            "estimate",
            &model,
            "--hardware",
            "rtx4090",
            "--mode",
            "train",
            "--batch",
            &b,
            "--seq",
            "512",
            "--json",
        ]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let device = &json(&out)["devices"][0];
        // Three encoder layers, each declaring 6 KiB per token (docs/examples).
        assert_eq!(u(&device["components"]["activations"]), 3 * batch * 512 * 6 * KIB, "batch {batch}");
        assert_eq!(u(&device["components"]["logits"]), 0, "no vocabulary: no logits");
    }
}

#[test]
fn graph_network_with_ddp_on_four_gpus_keeps_its_declared_activations_on_every_rank() {
    let model = example("graph-network.yaml");
    let out = vramplan(&[
        "estimate",
        &model,
        "--hardware",
        "4xa10g",
        "--parallel",
        "ddp",
        "--mode",
        "train",
        "--batch",
        "8",
        "--seq",
        "1",
        "--json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let devices = json(&out)["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 4);
    for d in &devices {
        // Six message-passing layers, each declaring 96 MiB per graph.
        assert_eq!(u(&d["components"]["activations"]), 6 * 8 * 96 * MIB, "{d}");
        assert_eq!(u(&d["components"]["logits"]), 0);
        assert_eq!(d["fits"], true);
    }
}

/// XLNet-base's map for a T4 with the word embedding, the LM head, the memory mixture and the
/// base's `mask_emb` left on the CPU, the layers on GPU 0 (the memory-mixture user's map).
fn xlnet_map(cpu: &str) -> String {
    let mut entries =
        vec![format!(r#""transformer.mask_emb": {cpu}"#), format!(r#""transformer.word_embedding": {cpu}"#)];
    for i in 0..6 {
        entries.push(format!(r#""transformer.layer.{i}": 0"#));
    }
    entries.push(format!(r#""transformer.memory": {cpu}"#));
    for i in 6..12 {
        entries.push(format!(r#""transformer.layer.{i}": 0"#));
    }
    entries.push(format!(r#""lm_loss": {cpu}"#));
    format!("{{{}}}", entries.join(", "))
}

#[test]
fn check_reports_modules_left_on_the_cpu_in_a_training_map() {
    let dir = tempfile::tempdir().unwrap();
    let model = example("xlnet-memory-mixture.yaml");
    let on_cpu = write(dir.path(), "cpu.json", xlnet_map(r#""cpu""#));
    let train = ["--hardware", "t4", "--mode", "train", "--batch", "8", "--seq", "512", "--json"];
    let out = vramplan(&[&["check", on_cpu.as_str(), model.as_str()][..], &train].concat());
    assert_eq!(out.code, 1, "a finding is a negative answer: {}", out.stderr);
    let report = out.json();
    assert_eq!(report["ok"], false);
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["rule"] == "offloaded-in-training")
        .unwrap_or_else(|| panic!("no offloaded-in-training finding: {report}"))
        .clone();
    assert_eq!(
        finding["modules"],
        serde_json::json!([
            "transformer.mask_emb",
            "transformer.word_embedding",
            "transformer.memory",
            "lm_loss"
        ])
    );
    assert_eq!(finding["devices"], serde_json::json!(["GPU 0", "cpu"]));
    let message = finding["message"].as_str().unwrap();
    for needle in [
        // GPU 0 is the map's only GPU: the HF Trainer's `.to` meets accelerate's guard.
        "You can't move a model that has some modules offloaded to cpu or disk",
        // The memory state buffers go to the GPU at dispatch unless offload_buffers.
        "`transformer.memory.state`",
        "offload_buffers=True",
        // A parent's own tensor gets no hook and stays on the CPU.
        "`transformer.mask_emb` is a tensor of `transformer` (XLNetModel)",
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
        "never updated",
        r#"`"transformer.memory": 0`"#,
    ] {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
    // The same map for inference is accelerate's offload as designed: no such finding.
    let inference = ["--hardware", "t4", "--mode", "inference", "--batch", "1", "--seq", "512", "--json"];
    let out = vramplan(&[&["check", on_cpu.as_str(), model.as_str()][..], &inference].concat());
    let report = json(&out);
    assert!(
        report["findings"].as_array().unwrap().iter().all(|f| f["rule"] != "offloaded-in-training"),
        "{report}"
    );
    // Everything on GPU 0: no finding, and the step fits a T4.
    let on_gpu = write(dir.path(), "gpu.json", xlnet_map("0"));
    let out = vramplan(&[&["check", on_gpu.as_str(), model.as_str()][..], &train].concat());
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json()["findings"], serde_json::json!([]));
    // The human report names the rule and the fix.
    let text = vramplan(&["check", &on_cpu, &model, "--hardware", "t4", "--mode", "train", "--batch", "8"]);
    assert_eq!(text.code, 1);
    assert!(text.stdout.contains("offloaded-in-training  (GPU 0, cpu)"), "{}", text.stdout);
    assert!(text.stdout.contains("Fix: put them on a GPU"), "{}", text.stdout);
}

/// Over two GPUs the HF Trainer leaves the model where it is (`is_model_parallel`), so the step
/// runs, with the offloaded weights streamed in and never trained.
#[test]
fn check_over_two_gpus_says_the_offloaded_modules_are_not_trained() {
    let dir = tempfile::tempdir().unwrap();
    let model = example("xlnet-memory-mixture.yaml");
    let map = xlnet_map(r#""cpu""#).replace(r#""transformer.layer.11": 0"#, r#""transformer.layer.11": 1"#);
    let map = write(dir.path(), "two.json", map);
    let out =
        vramplan(&["check", &map, &model, "--hardware", "2xt4", "--mode", "train", "--batch", "4", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let report = out.json();
    let finding =
        report["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "offloaded-in-training");
    let message = finding.expect("finding")["message"].as_str().unwrap().to_string();
    assert!(message.contains("The step runs, but"), "{message}");
    assert!(!message.contains("You can't move a model"), "{message}");
}

/// Declared sizes are bounded so that a step's bytes stay within `u64` (docs/custom-models.md):
/// past the bound, a declaration is bad input with its line, and so is a total past it.
#[test]
fn declared_sizes_past_their_bound_are_refused_with_their_location() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(example("timeseries-transformer.yaml")).unwrap();
    let huge = write(dir.path(), "huge.yaml", text.replace("per_token: 6KiB", "per_token: 1000TiB"));
    let out = vramplan(&["estimate", &huge, "--hardware", "rtx4090", "--mode", "train"]);
    vramplan_tests::assert_refused(
        &out,
        &["huge.yaml:", "per_token: 1000TiB is past the bound of 256.00 MiB"],
    );
    // Three layers of 100 MiB each: 300 MiB per token in all.
    let total = write(dir.path(), "total.yaml", text.replace("per_token: 6KiB", "per_token: 100MiB"));
    let out = vramplan(&["estimate", &total, "--hardware", "rtx4090", "--mode", "train"]);
    vramplan_tests::assert_refused(&out, &["total.yaml", "`activations`", "300.00 MiB", "per_token"]);
}
