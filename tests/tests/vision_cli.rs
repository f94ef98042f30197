//! Vision-language workloads and the inputs around them, driven as a user drives them: the
//! bounds images add to a step, the image processor's settings wherever the model comes from
//! (a built-in, a config file with or without its `preprocessor_config.json`, a custom YAML
//! extending either), the tokens each answer counts, and what the engines refuse to size.

use vramplan_tests::{assert_bad_input, vramplan, write};

const QWEN_VL: &str = include_str!("../../profiles/catalog/models/qwen2.5-vl-7b-instruct.json");
const QWEN_VL_PROCESSOR: &str =
    include_str!("../../profiles/catalog/models/qwen2.5-vl-7b-instruct.preprocessor_config.json");

#[test]
fn images_past_a_steps_bounds_are_refused_not_overflowed() {
    let cases: [&[&str]; 3] = [
        &[
            "--mode",
            "inference",
            "--seq",
            "100",
            "--batch",
            "1024",
            "--images",
            "1024",
            "--image-size",
            "1540x1540",
        ],
        &[
            "--mode",
            "inference",
            "--seq",
            "100",
            "--batch",
            "64",
            "--images",
            "1024",
            "--image-size",
            "1540x1540",
        ],
        &[
            "--mode",
            "train",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj",
            "--seq",
            "100",
            "--batch",
            "4096",
            "--images",
            "1024",
            "--image-size",
            "1540x1540",
        ],
    ];
    for workload in cases {
        let mut args = vec!["estimate", "mistral-small-3.1-24b-instruct", "--hardware", "a100-80gb"];
        args.extend_from_slice(workload);
        let out = vramplan(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("docs/limits.md"), "{}", out.stderr);
    }
}

/// The note a vision-language model carries when no processor settings came with it.
const DEFAULTS_NOTE: &str = "no preprocessor_config.json";

#[test]
fn the_processor_settings_follow_the_model_wherever_it_comes_from() {
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare");
    let full = dir.path().join("full");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::create_dir_all(&full).unwrap();
    let bare_config = write(&bare, "config.json", QWEN_VL);
    let full_config = write(&full, "config.json", QWEN_VL);
    write(&full, "preprocessor_config.json", QWEN_VL_PROCESSOR);
    let estimate = |model: &str| {
        let out = vramplan(&[
            "estimate",
            model,
            "--hardware",
            "h200",
            "--mode",
            "inference",
            "--seq",
            "64",
            "--images",
            "1",
            "--image-size",
            "3000x2000",
            "--json",
        ]);
        assert_eq!(out.code, 0, "{model}: {}", out.stderr);
        out.json()["devices"][0]["peak_allocated_bytes"].as_u64().expect("a peak")
    };
    let notes = |model: &str| vramplan(&["inspect", model, "--json"]).json()["notes"].to_string();
    // The built-in and a config.json beside its preprocessor_config.json count the same tokens;
    // a config.json alone uses the class defaults (max_pixels 1,003,520 against 12,845,056: a
    // 3000 × 2000 image is 1,247 tokens instead of 7,597) and says so.
    let builtin = estimate("qwen2.5-vl-7b-instruct");
    assert_eq!(estimate(&full_config), builtin);
    assert!(estimate(&bare_config) < builtin);
    assert!(!notes("qwen2.5-vl-7b-instruct").contains(DEFAULTS_NOTE));
    assert!(!notes(&full_config).contains(DEFAULTS_NOTE));
    assert!(notes(&bare_config).contains(DEFAULTS_NOTE), "{}", notes(&bare_config));
    // A custom YAML extending the built-in or the folder's config keeps its processor.
    for (name, base) in
        [("builtin.yaml", "qwen2.5-vl-7b-instruct".to_string()), ("folder.yaml", "full/config.json".into())]
    {
        let yaml = format!(
            "extend: {base}\nmodules:\n  - name: model.extra\n    after: model.language_model.layers.0\n    \
             linear: {{in: 64, out: 64}}\n"
        );
        let path = write(dir.path(), name, yaml);
        assert!(!notes(&path).contains(DEFAULTS_NOTE), "{name}: {}", notes(&path));
    }
}

#[test]
fn answers_count_the_images_tokens() {
    let out = vramplan(&[
        "whatif",
        "max-concurrency",
        "qwen2.5-vl-7b-instruct",
        "--hardware",
        "a100-80gb",
        "--images",
        "2",
        "--image-size",
        "1024x768",
        "--json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json = out.json();
    let transformers = &json.as_array().expect("one answer an engine")[0];
    // 2,048 text tokens and two 1024 × 768 images of 999 tokens each (smart_resize to
    // 1036 × 770, 74 × 54 patches, a quarter of them merged).
    assert_eq!(transformers["seq"], 2048 + 2 * 999);
    let sequences = transformers["sequences"].as_u64().expect("sequences");
    assert_eq!(transformers["kv_capacity_tokens"].as_u64(), Some(sequences * (2048 + 2 * 999)));
}

#[test]
fn what_an_engine_does_not_size_is_refused() {
    // A projector alone is not a model llama.cpp runs.
    let projector = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference/gguf/mmproj-tiny.gguf");
    let out = vramplan(&["estimate", projector, "--hardware", "t4", "--engine", "llama.cpp"]);
    assert_bad_input(&out, &["projector"]);
    // A state-space mixer's state under vLLM and llama.cpp is not modelled.
    for engine in ["vllm", "llama.cpp"] {
        let out =
            vramplan(&["estimate", "falcon-h1-0.5b-instruct", "--hardware", "a100-80gb", "--engine", engine]);
        assert_bad_input(&out, &["state-space"]);
    }
    // Images under an engine are refused as such, before the tower is looked for.
    let out = vramplan(&[
        "estimate",
        "qwen2.5-vl-7b-instruct",
        "--hardware",
        "a100-80gb",
        "--engine",
        "vllm",
        "--images",
        "1",
        "--image-size",
        "448x448",
    ]);
    assert_bad_input(&out, &["transformers only"]);
}
