//! Every semantic error names the file and the line or key it came from (issue 32): a workload
//! check's error (`batch: 0`) names the workload file and the key's line, unless a flag set the
//! value; a plan file's workload, `model` and `hardware` errors name the plan file.

use std::path::Path;
use vramplan_tests::{Output, assert_refused, vramplan, write};

/// The 1-based number of the first line of `path` that starts with `prefix`, read from the file.
fn line_of(path: &str, prefix: &str) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().position(|l| l.starts_with(prefix)).expect("the line is in the file") + 1
}

fn estimate_with(workload: &str, more: &[&str]) -> Output {
    let mut args = vec!["estimate", "llama-3.2-1b", "--hardware", "1xa100-80gb", "--workload", workload];
    args.extend(more);
    vramplan(&args)
}

#[test]
fn a_workload_files_semantic_error_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "w.yaml", "# training\nmode: train\nbatch: 0\n");
    assert_refused(&estimate_with(&path, &[]), &[&format!("{path}:3:1:"), "`batch` is 0"]);
    let path = write(
        dir.path(),
        "vllm.yaml",
        "mode: inference\nengine:\n  kind: vllm\n  gpu_memory_utilization: 0.9\n  max_num_batched_tokens: 0\n",
    );
    assert_refused(&estimate_with(&path, &[]), &[&format!("{path}:5:3:"), "max_num_batched_tokens"]);
    // Found by the engine as the step is simulated, not by the checks before it.
    let path = write(
        dir.path(),
        "llamacpp.yaml",
        "mode: inference\nkv_dtype: fp8\nengine:\n  kind: llama_cpp\n  n_ctx: 4096\n  n_ubatch: 512\n",
    );
    assert_refused(&estimate_with(&path, &[]), &[&format!("{path}:2:1:"), "kv_dtype"]);
}

#[test]
fn a_value_a_flag_set_is_not_blamed_on_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "w.yaml", "mode: train\nbatch: 2\n");
    let out = estimate_with(&path, &["--batch", "0"]);
    assert_refused(&out, &["`batch` is 0"]);
    assert!(!out.stderr.contains(&path), "the file set batch: 2, the flag 0:\n{}", out.stderr);
}

/// A plan for llama-3.2-1b on one A100, written by `plan -o`, with `edit` applied to its text.
fn plan_file(dir: &Path, name: &str, edit: impl Fn(&str) -> String) -> String {
    let path = dir.join("plan.yaml").display().to_string();
    let out = vramplan(&["plan", "llama-3.2-1b", "--hardware", "1xa100-80gb", "-o", &path]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = std::fs::read_to_string(&path).unwrap();
    write(dir, name, edit(&text))
}

#[test]
fn a_plan_files_errors_name_the_plan_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let batch = plan_file(d, "batch.yaml", |t| {
        t.lines()
            .map(|l| if l.starts_with("  batch:") { "  batch: 0" } else { l })
            .collect::<Vec<_>>()
            .join("\n")
    });
    let line = line_of(&batch, "  batch: 0");
    let place = format!("{batch}:{line}:3:");
    assert_refused(&vramplan(&["validate", &batch]), &[&place, "`batch` is 0"]);
    let out = vramplan(&["estimate", "llama-3.2-1b", "--hardware", "1xa100-80gb", "--plan", &batch]);
    assert_refused(&out, &[&place, "`batch` is 0"]);

    let model = plan_file(d, "model.yaml", |t| t.replace("model: llama-3.2-1b", "model: llama-9"));
    assert_refused(&vramplan(&["validate", &model]), &[&format!("{model}: key `model`: llama-9")]);
    let hardware =
        plan_file(d, "hardware.yaml", |t| t.replace("hardware: 1xa100-80gb", "hardware: no-such.yaml"));
    assert_refused(
        &vramplan(&["validate", &hardware]),
        &[&format!("{hardware}: key `hardware`: no-such.yaml")],
    );
}
