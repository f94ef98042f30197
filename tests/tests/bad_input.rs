//! Bad input never panics: each case exits with code 2 and a message naming the file and the
//! line, column or key, what was expected, and the fix.

use vramplan_tests::{assert_bad_input, vramplan, write};

/// A Pythia-like GPT-NeoX config with one key replaced.
fn neox_config(key: &str, value: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(
        r#"{"architectures": ["GPTNeoXForCausalLM"], "hidden_size": 2560, "num_attention_heads": 32,
            "num_hidden_layers": 32, "intermediate_size": 10240, "vocab_size": 50304}"#,
    )
    .unwrap();
    config[key] = serde_json::from_str(value).unwrap();
    config.to_string()
}

#[test]
fn missing_file() {
    let out = vramplan(&["inspect", "/no/such/dir/config.json"]);
    assert_bad_input(&out, &["/no/such/dir/config.json", "not a built-in model, a file or a folder"]);
}

#[test]
fn unknown_builtin_suggests_close_names() {
    let out = vramplan(&["inspect", "pythia"]);
    assert_bad_input(&out, &["did you mean", "pythia-2.8b"]);
}

#[test]
fn malformed_json_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", b"{\n  \"hidden_size\": 4096,\n  \"vocab_size\" 32000\n}\n");
    let out = vramplan(&["inspect", &path]);
    assert_bad_input(&out, &[&format!("{path}:3:16"), "malformed JSON"]);
}

#[test]
fn unknown_architecture_lists_the_supported_ones_and_points_to_custom_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", br#"{"architectures": ["MambaForCausalLM"]}"#);
    let out = vramplan(&["inspect", &path]);
    assert_bad_input(
        &out,
        &[
            "unsupported architecture `MambaForCausalLM`",
            "LlamaForCausalLM",
            "XLNetLMHeadModel",
            "custom YAML",
        ],
    );
}

#[test]
fn zero_layers() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", neox_config("num_hidden_layers", "0").as_bytes());
    let out = vramplan(&["inspect", &path]);
    assert_bad_input(&out, &["key `num_hidden_layers`", "positive integer", "found `0`"]);
}

#[test]
fn heads_that_do_not_divide_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", neox_config("num_attention_heads", "30").as_bytes());
    let out = vramplan(&["inspect", &path]);
    assert_bad_input(
        &out,
        &["key `num_attention_heads`", "30 attention heads do not divide the hidden size 2560", "fix:"],
    );
}

#[test]
fn wrong_type_says_what_was_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", neox_config("hidden_size", "\"2560\"").as_bytes());
    let out = vramplan(&["inspect", &path]);
    assert_bad_input(&out, &["key `hidden_size`", "expected a positive integer, found the string \"2560\""]);
}

#[test]
fn unknown_dtype_flag() {
    let out = vramplan(&["inspect", "pythia-2.8b", "--dtype", "fp12"]);
    assert_bad_input(&out, &["--dtype", "unknown dtype `fp12`", "bf16"]);
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = vramplan(&["inspect", "pythia-2.8b", "--frobnicate"]);
    assert_bad_input(&out, &["--frobnicate"]);
}

#[test]
fn safetensors_header_that_lies_about_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(br#"{"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}"#);
    write(dir.path(), "model.safetensors", &bytes);
    let out = vramplan(&["inspect", &dir.path().display().to_string()]);
    assert_bad_input(&out, &["model.safetensors", "1000000"]);
}

#[test]
fn truncated_safetensors_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "model.safetensors", [7, 0, 0]);
    let out = vramplan(&["inspect", &dir.path().display().to_string()]);
    assert_bad_input(&out, &["model.safetensors"]);
}

#[test]
fn implausibly_large_sizes_are_refused_not_overflowed() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config.json", neox_config("vocab_size", "1e30").as_bytes());
    let out = vramplan(&["inspect", &path]);
    assert_bad_input(&out, &["key `vocab_size`", "implausibly large"]);
}

#[test]
fn profile_memory_without_a_unit_names_file_line_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "name: lab\ndevices:\n  - gpu: t4\n    memory: 15360\n";
    let path = write(dir.path(), "lab.yaml", yaml.as_bytes());
    let out = vramplan(&["profiles", "show", &path]);
    assert_bad_input(&out, &[&format!("{path}:4:"), "no unit", "MiB"]);
}

#[test]
fn profile_with_negative_memory() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "name: lab\ndevices:\n  - gpu: t4\n    memory: -16GiB\n";
    let path = write(dir.path(), "lab.yaml", yaml.as_bytes());
    let out = vramplan(&["profiles", "show", &path]);
    assert_bad_input(&out, &[&format!("{path}:4:"), "negative"]);
}

#[test]
fn malformed_profile_yaml_names_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "lab.yaml", b"name: lab\ndevices: [\n  - gpu: t4\n");
    let out = vramplan(&["profiles", "show", &path]);
    assert_bad_input(&out, &[&format!("{path}:"), "malformed hardware profile"]);
}

#[test]
fn unknown_hardware_name_suggests_built_ins() {
    let out = vramplan(&["profiles", "show", "a100"]);
    assert_bad_input(&out, &["a100"]);
    assert!(out.stderr.contains("a100-80gb") || out.stderr.contains("a100-40gb"), "{}", out.stderr);
}
