//! `vramplan estimate` as a user runs it: bad input exits with code 2 and says what is wrong,
//! where, and the fix; a workload that cannot fit exits with 1 and one that surely fits with 0;
//! `--json` prints one document with the promised fields; odd precision choices warn.

use vramplan_tests::{Output, assert_bad_input, shared_model, vramplan, write};

/// Bad input with a fix (or clap's list of possible values).
fn assert_refused(out: &Output, needles: &[&str]) {
    assert_bad_input(out, needles);
    assert!(out.stderr.contains("fix:") || out.stderr.contains("possible values"), "{}", out.stderr);
}

fn llama3() -> String {
    shared_model("meta-llama__Meta-Llama-3-8B")
}

fn estimate(extra: &[&str]) -> Output {
    let model = llama3();
    let mut args = vec!["estimate", model.as_str(), "--hardware", "t4x2", "--dtype", "fp16"];
    args.extend_from_slice(extra);
    vramplan(&args)
}

#[test]
fn batch_zero() {
    assert_refused(&estimate(&["--batch", "0"]), &["`batch` is 0", "--batch 1"]);
}

#[test]
fn lora_target_that_matches_nothing_lists_the_linear_layers() {
    let out = estimate(&["--mode", "train", "--lora-rank", "16", "--lora-targets", "q_proj,value"]);
    assert_bad_input(
        &out,
        &[
            "`value` matches no module",
            "`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`, `lm_head`",
            "all-linear",
        ],
    );
}

#[test]
fn unknown_dtype() {
    let model = llama3();
    let out = vramplan(&["estimate", &model, "--hardware", "t4", "--dtype", "fp12"]);
    assert_refused(&out, &["--dtype", "unknown dtype `fp12`", "bf16"]);
}

#[test]
fn unknown_optimizer_lists_the_accepted_ones() {
    let out = estimate(&["--mode", "train", "--optimizer", "adamw_9bit"]);
    assert_bad_input(
        &out,
        &["--optimizer", "unknown value `adamw_9bit`", "`adamw8bit`", "`paged-adamw8bit`", "`adafactor`"],
    );
}

#[test]
fn unknown_quant_suggests_the_gguf_type() {
    assert_refused(&estimate(&["--quant", "Q4_KM"]), &["--quant", "did you mean `Q4_K_M`"]);
}

#[test]
fn device_map_leaving_parameters_unplaced() {
    let dir = tempfile::tempdir().unwrap();
    let map = write(dir.path(), "map.json", r#"{"model.embed_tokens": 0, "model.layers": 0}"#);
    assert_bad_input(
        &estimate(&["--device-map", &map]),
        &[&map, "2 tensors", "on no device", "`model.norm.weight`", "`lm_head.weight`"],
    );
}

#[test]
fn device_map_naming_modules_that_do_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let map =
        write(dir.path(), "map.json", "{\n  \"\": 0,\n  \"model.layer.31\": 1,\n  \"transformer.h.0\": 1\n}");
    assert_bad_input(
        &estimate(&["--device-map", &map]),
        &[&format!("{map}:3:3"), "`model.layer.31`, `transformer.h.0` are not modules", "`model.layers.31`"],
    );
}

#[test]
fn device_map_gpu_index_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let map = write(dir.path(), "map.json", "{\"\": 0,\n \"lm_head\": 2}");
    assert_bad_input(
        &estimate(&["--device-map", &map]),
        &[&format!("{map}:2:2"), "GPU 2 is not in the hardware profile", "GPUs 0 to 1", "`t4x2`"],
    );
}

#[test]
fn device_map_with_a_device_string() {
    // torch's spelling reads as `--pin` reads it: `"cuda:1"` is GPU 1; `"mps"` is no device.
    let dir = tempfile::tempdir().unwrap();
    let named = write(dir.path(), "named.json", r#"{"": "cuda:1"}"#);
    let index = write(dir.path(), "index.json", r#"{"": 1}"#);
    let (named, index) = (estimate(&["--device-map", &named]), estimate(&["--device-map", &index]));
    assert_eq!((named.code, named.stdout), (index.code, index.stdout));
    let map = write(dir.path(), "mps.json", r#"{"": "mps"}"#);
    assert_refused(
        &estimate(&["--device-map", &map]),
        &[&format!("{map}:1:2"), "`mps` is not a device", "`cpu`"],
    );
}

#[test]
fn malformed_workload_yaml_names_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "w.yaml", "mode: train\nbatch: 2\noptimiser: adamw\n");
    assert_bad_input(
        &estimate(&["--workload", &file]),
        &[&format!("{file}:3:1"), "unknown field `optimiser`", "optimizer", "docs/workloads.md"],
    );
    let file = write(dir.path(), "v.yaml", "mode: train\nquant: {kind: nf5}\n");
    assert_refused(&estimate(&["--workload", &file]), &[&format!("{file}:2:"), "nf5"]);
}

#[test]
fn device_map_with_ddp_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let map = write(dir.path(), "map.json", r#"{"": 0}"#);
    assert_bad_input(
        &estimate(&["--device-map", &map, "--parallel", "ddp"]),
        &["--device-map", "--parallel single"],
    );
}

#[test]
fn flag_overrides_the_file_and_bad_flag_value_after_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "w.yaml", "mode: inference\nbatch: 0\n");
    // The file's batch 0 is refused, unless a flag replaces it.
    assert_refused(&estimate(&["--workload", &file]), &["`batch` is 0"]);
    let model = shared_model("meta-llama__Meta-Llama-3-8B");
    let out = vramplan(&[
        "estimate",
        &model,
        "--hardware",
        "h100-80gb",
        "--dtype",
        "fp16",
        "--workload",
        &file,
        "--batch",
        "1",
        "--json",
    ]);
    assert!(out.code == 0 || out.code == 1, "{}", out.stderr);
    out.json();
}

#[test]
fn bf16_on_a_t4_warns_and_fp16_does_not() {
    let model = llama3();
    let args = |dtype: &'static str| {
        vec!["estimate", model.as_str(), "--hardware", "t4", "--dtype", dtype, "--quant", "nf4", "--json"]
    };
    let out = vramplan(&args("bf16"));
    assert!(out.code == 0 || out.code == 1, "{}", out.stderr);
    let warnings = out.json()["warnings"].as_array().cloned().unwrap_or_default();
    assert!(
        warnings.iter().any(|w| w.as_str().is_some_and(|w| w.contains("bf16") && w.contains("T4"))),
        "{warnings:?}"
    );
    let out = vramplan(&args("fp16"));
    let warnings = out.json()["warnings"].as_array().cloned().unwrap_or_default();
    assert!(warnings.is_empty(), "{warnings:?}");

    // The table prints the warning too.
    let out =
        vramplan(&["estimate", model.as_str(), "--hardware", "t4", "--dtype", "bf16", "--quant", "nf4"]);
    assert!(out.stdout.contains("warnings:") && out.stdout.contains("no bf16 support"), "{}", out.stdout);
}

#[test]
fn exit_code_says_whether_it_fits() {
    // Llama 3.1 405B holds 405e9 parameters: 810 GB in bf16 cannot fit a 16 GB T4.
    let out = vramplan(&["estimate", "llama-3.1-405b", "--hardware", "t4", "--dtype", "fp16", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let json = out.json();
    assert_eq!(json["fits"], false);
    let device = &json["devices"][0];
    // nvidia-smi reports a T4's total as 15360 MiB.
    assert_eq!(device["capacity_bytes"], 15360u64 << 20);
    assert!(device["peak_allocated_bytes"].as_u64().unwrap() > 810_000_000_000);
    for key in ["id", "name", "usable_bytes", "peak_reserved_bytes", "device_used_bytes", "peak_at"] {
        assert!(!device[key].is_null(), "{key} missing in {device}");
    }
    for key in ["weights", "gradients", "optimizer", "activations", "kv_cache", "logits", "overhead"] {
        assert!(device["components"][key].is_u64(), "components.{key} missing in {device}");
    }
    assert!(json["peak_bytes"].is_u64());

    // Pythia-410M in fp16, 0.8 GB of weights, on an 80 GB H100 surely fits.
    let out =
        vramplan(&["estimate", "pythia-410m", "--hardware", "h100-80gb", "--dtype", "fp16", "--seq", "512"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("verdict: fits"), "{}", out.stdout);
}
