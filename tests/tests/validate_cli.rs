//! `vramplan validate` as users run it: a plan from `plan -o plan.yaml`, on the `cuda` backend.
//! Where no CUDA driver is installed (CI), it answers exit 3 with what is missing, never a
//! panic; where one is, the run completes or reports its out-of-memory. The static check runs
//! first: a plan file whose map splits a tied embedding from its head is refused with exit 1
//! before anything is allocated.

use vramplan_tests::{Output, vramplan};

fn plan_file(dir: &std::path::Path, args: &[&str]) -> String {
    let path = dir.join("plan.yaml").display().to_string();
    let mut full = vec!["plan"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", &path]);
    let out = vramplan(&full);
    assert_eq!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    path
}

fn no_panic(out: &Output) {
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

#[test]
fn cuda_backend_without_a_driver_exits_3_and_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let plan =
        plan_file(dir.path(), &["llama-3.2-1b", "--hardware", "t4", "--mode", "inference", "--seq", "1024"]);
    let out = vramplan(&["validate", &plan]);
    no_panic(&out);
    if vramplan_validate::cuda_driver_present().is_ok() {
        // A machine with a driver runs it: completed, or a reported out-of-memory.
        assert!(out.code == 0 || out.code == 1 || out.code == 3, "{}\n{}", out.stdout, out.stderr);
        return;
    }
    assert_eq!(out.code, 3, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("no CUDA driver here"), "{}", out.stderr);
    assert!(out.stderr.contains("libcuda.so.1"), "{}", out.stderr);
    // With --json the prediction and the reason are on stdout, as one document.
    let out = vramplan(&["validate", &plan, "--json"]);
    assert_eq!(out.code, 3);
    let doc = out.json();
    assert_eq!(doc["unavailable"]["kind"], "no_driver");
    assert!(doc["predicted"][0]["peak_allocated_bytes"].as_u64().unwrap() > 0);
    assert_eq!(doc["ok"], false);
}

/// The cpu backend runs a built-in model's plan to the end (two training steps) where there is
/// no GPU, and says where the bytes went.
#[test]
fn the_cpu_backend_runs_a_plan_with_no_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan_file(dir.path(), &["gpt2", "--hardware", "2xt4", "--mode", "train", "--seq", "128"]);
    let out = vramplan(&["validate", &plan, "--backend", "cpu"]);
    no_panic(&out);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("validate on cpu: the workload's steps ran to the end"), "{}", out.stdout);
    assert!(out.stdout.contains("the model's tensors were placed:"), "{}", out.stdout);
}

/// Llama 3.2 1B ties its head to its input embedding: a map that puts them on two GPUs is a
/// mismatch the static rules find (`tied-split`), so nothing is run and the answer is 1.
#[test]
fn the_static_check_runs_first() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan_file(
        dir.path(),
        &[
            "llama-3.2-1b",
            "--hardware",
            "t4x2",
            "--mode",
            "inference",
            "--seq",
            "1024",
            "--pin",
            "model.embed_tokens=0",
        ],
    );
    let text = std::fs::read_to_string(&plan).unwrap();
    let planted = text.replace("lm_head: 0", "lm_head: 1");
    assert_ne!(planted, text, "the plan puts lm_head on GPU 0:\n{text}");
    std::fs::write(&plan, planted).unwrap();
    let out = vramplan(&["validate", &plan]);
    no_panic(&out);
    assert_eq!(out.code, 1, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("the static check found a mismatch, so nothing was run"), "{}", out.stdout);
    assert!(out.stdout.contains("lm_head"), "{}", out.stdout);
    let out = vramplan(&["validate", &plan, "--json"]);
    assert_eq!(out.code, 1);
    let doc = out.json();
    assert!(!doc["findings"].as_array().unwrap().is_empty());
    assert!(doc.get("run").is_none());
}

#[test]
fn a_missing_plan_file_is_bad_input() {
    let out = vramplan(&["validate", "no-such-plan.yaml"]);
    no_panic(&out);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("no-such-plan.yaml"), "{}", out.stderr);
}

/// The torch backend end to end on the CPU: GPT-2's training plan, its modules run on the CPU
/// (`--cpu`) by the real transformers + accelerate for two steps, and a split map on fake GPUs. Needs a Python with torch,
/// transformers and accelerate, given by `VRAMPLAN_PYTHON` (`scripts/reference/run venvs`
/// makes one); without it the test says so and checks only that a Python without torch is
/// answered with exit 3.
#[test]
fn torch_backend_runs_a_tiny_plan_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan_file(
        dir.path(),
        &["gpt2", "--hardware", "t4", "--mode", "train", "--batch", "1", "--seq", "64", "--dtype", "fp32"],
    );
    let out = vramplan(&["validate", &plan, "--backend", "torch", "--python", "/no/such/python"]);
    no_panic(&out);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("did not run vramplan's harness"), "{}", out.stderr);
    let Ok(python) = std::env::var("VRAMPLAN_PYTHON") else {
        println!("VRAMPLAN_PYTHON is not set: the real runtime was not run");
        return;
    };
    let out = vramplan(&["validate", &plan, "--backend", "torch", "--python", &python, "--cpu", "--json"]);
    no_panic(&out);
    assert_eq!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert_eq!(out.json()["run"]["outcome"]["kind"], "completed");
    // The plan's two GPUs as fake CUDA devices: GPT-2's head on the other GPU than its tied
    // `transformer.wte`; accelerate reties the one storage to `lm_head.weight`'s GPU (sorted
    // first), so the embedding meets it there.
    let split = vramplan_tests::write(
        dir.path(),
        "split.json",
        r#"{"transformer.wte": 0, "transformer.wpe": 0, "transformer.h": 0, "transformer.ln_f": 0, "lm_head": 1}"#,
    );
    let out = vramplan(&[
        "validate",
        "gpt2",
        "--device-map",
        &split,
        "--hardware",
        "t4x2",
        "--mode",
        "inference",
        "--seq",
        "32",
        "--backend",
        "torch",
        "--python",
        &python,
        "--fake-gpus",
        "--run-anyway",
        "--json",
    ]);
    no_panic(&out);
    assert_eq!(out.code, 1, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    let outcome = &out.json()["run"]["outcome"];
    assert_eq!(outcome["error"], "device_mismatch", "{outcome}");
    assert_eq!(outcome["module"], "transformer.wte", "{outcome}");
}

/// The other form: a model, a device map and the workload flags, as `estimate` takes them. GPT-2
/// ties its head to `transformer.wte`; a map with the head on the other GPU is refused by the
/// static check (exit 1); the map on one GPU passes it and reaches the backend.
#[test]
fn a_model_with_a_device_map_is_validated_as_a_plan_is() {
    let dir = tempfile::tempdir().unwrap();
    let split = vramplan_tests::write(
        dir.path(),
        "split.json",
        r#"{"transformer.wte": 0, "transformer.wpe": 0, "transformer.h": 0, "transformer.ln_f": 0, "lm_head": 1}"#,
    );
    let args = |map: &str| {
        vec![
            "validate",
            "gpt2",
            "--device-map",
            map,
            "--hardware",
            "t4x2",
            "--mode",
            "inference",
            "--seq",
            "256",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| vramplan(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let out = run(args(&split));
    no_panic(&out);
    assert_eq!(out.code, 1, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("lm_head"), "{}", out.stdout);
    let whole = vramplan_tests::write(dir.path(), "whole.json", r#"{"": 0}"#);
    let out = run(args(&whole));
    no_panic(&out);
    let expected = if vramplan_validate::cuda_driver_present().is_ok() { [0, 1] } else { [3, 3] };
    assert!(expected.contains(&out.code), "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
}
