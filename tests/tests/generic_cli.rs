//! A generic model (`model::generic`: a config.json whose class has no importer, over its
//! safetensors checkpoint) through the command line: `inspect` notes it, `estimate` and `plan`
//! carry its label (a line in the text, a `generic` field in `--json`) and so does `report`.

use serde_json::json;
use std::io::Write;
use std::path::Path;
use vramplan_tests::vramplan;

/// A Llama-style folder under an unknown class: hidden 256, 4 heads, 2 blocks, vocabulary 1000,
/// a header-only checkpoint (the data section sparse).
fn generic_folder(dir: &Path) -> String {
    let config = json!({
        "architectures": ["SomeNewModelForCausalLM"], "model_type": "some_new_model",
        "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
        "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<u64>)> = vec![("model.embed_tokens.weight".into(), vec![1000, 256])];
    for i in 0..2 {
        let p = format!("model.layers.{i}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![256]),
            ("self_attn.q_proj.weight", vec![256, 256]),
            ("self_attn.k_proj.weight", vec![256, 256]),
            ("self_attn.v_proj.weight", vec![256, 256]),
            ("self_attn.o_proj.weight", vec![256, 256]),
            ("post_attention_layernorm.weight", vec![256]),
            ("mlp.gate_proj.weight", vec![512, 256]),
            ("mlp.up_proj.weight", vec![512, 256]),
            ("mlp.down_proj.weight", vec![256, 512]),
        ] {
            tensors.push((format!("{p}.{name}"), shape));
        }
    }
    tensors.push(("model.norm.weight".into(), vec![256]));
    tensors.push(("lm_head.weight".into(), vec![1000, 256]));
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in &tensors {
        let bytes = 2 * shape.iter().product::<u64>();
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut file = std::fs::File::create(dir.join("model.safetensors")).unwrap();
    file.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    file.write_all(&text).unwrap();
    file.set_len(8 + text.len() as u64 + offset).unwrap();
    dir.display().to_string()
}

#[test]
fn inspect_estimate_and_plan_say_the_model_is_generic() {
    let dir = tempfile::tempdir().unwrap();
    let model = generic_folder(dir.path());

    let inspect = vramplan(&["inspect", &model]);
    assert_eq!(inspect.code, 0, "{}", inspect.stderr);
    assert!(
        inspect.stdout.contains("generic model: config.json names `SomeNewModelForCausalLM`"),
        "{}",
        inspect.stdout
    );

    let estimate = vramplan(&["estimate", &model, "--hardware", "h100-80gb"]);
    assert_eq!(estimate.code, 0, "{}", estimate.stderr);
    assert!(
        estimate.stdout.starts_with("generic model: vramplan has no importer for `SomeNewModelForCausalLM`"),
        "{}",
        estimate.stdout
    );
    let json = vramplan(&["estimate", &model, "--hardware", "h100-80gb", "--json"]).json();
    assert_eq!(json["generic"]["architecture"], "SomeNewModelForCausalLM");
    assert!(json["generic"]["traced_worst_error_percent"].as_f64().is_some(), "{json}");
    assert!(json["devices"].is_array(), "the estimate's own fields stay: {json}");

    let plan = vramplan(&["plan", &model, "--hardware", "h100-80gb"]);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert!(plan.stdout.starts_with("generic model:"), "{}", plan.stdout);
    let json = vramplan(&["plan", &model, "--hardware", "h100-80gb", "--json"]).json();
    assert_eq!(json["generic"]["architecture"], "SomeNewModelForCausalLM");

    let report = dir.path().join("report.md");
    let out = vramplan(&["report", &model, "--hardware", "h100-80gb", "-o", report.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("generic model: vramplan has no importer for `SomeNewModelForCausalLM`"), "{text}");

    // whatif says so too, and its lines to paste do not import a class transformers lacks.
    let whatif = vramplan(&["whatif", "max-batch", &model, "--hardware", "h100-80gb", "--mode", "train"]);
    assert_eq!(whatif.code, 0, "{}", whatif.stderr);
    assert!(whatif.stdout.starts_with("generic model:"), "{}", whatif.stdout);
    assert!(!whatif.stdout.contains("import SomeNewModelForCausalLM"), "{}", whatif.stdout);
    assert!(whatif.stdout.contains("# a generic model:"), "{}", whatif.stdout);
    let json =
        vramplan(&["whatif", "max-batch", &model, "--hardware", "h100-80gb", "--mode", "train", "--json"])
            .json();
    assert_eq!(json["generic"]["architecture"], "SomeNewModelForCausalLM");

    // An importer's model carries no label.
    let json = vramplan(&["estimate", "gpt2", "--hardware", "h100-80gb", "--json"]).json();
    assert!(json.get("generic").is_none(), "{json}");
}

#[test]
fn a_hybrid_under_an_unknown_class_is_exit_2_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let model = generic_folder(dir.path());
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    config["layer_types"] = json!(["mamba", "full_attention"]);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let out = vramplan(&["estimate", &model, "--hardware", "h100-80gb"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert!(
        out.stderr.contains("layer_types") && out.stderr.contains("unknown cache type"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("custom YAML"), "{}", out.stderr);
}

/// Runs the command line as a process with the Hub variables `env` (none of the caller's).
fn run_with_hub(env: &[(&str, &str)], args: &[&str]) -> vramplan_tests::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_vramplan-under-test"));
    command.args(args).stdin(std::process::Stdio::null());
    for var in [
        "HF_ENDPOINT",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "XDG_CACHE_HOME",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let out = command.output().expect("run vramplan-under-test");
    vramplan_tests::Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A Hub repository holding Cohere 2 as transformers writes it (`fixtures/reference/generic`),
/// its config.json naming a class vramplan has no importer for (`MyCohere2ForCausalLM`; it has
/// one for `Cohere2ForCausalLM`): by its Hub id (the header read by range requests) it is the
/// same generic model as from a folder of the same files.
#[test]
fn a_hub_id_of_an_unknown_class_is_the_same_generic_model_as_its_folder() {
    const CLASS: &str = "MyCohere2ForCausalLM";
    use vramplan_tests::hub_server::{Content, HubServer, Repo, write_folder};
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/generic/cohere2");
    let tree: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("transformers.json")).unwrap()).unwrap();
    let start = std::fs::read(source.join("model.safetensors.header")).unwrap();
    let total = start.len() as u64 + tree["data_bytes"].as_u64().unwrap();
    let files: std::collections::BTreeMap<String, Content> = [
        ("config.json".to_string(), Content::Bytes(renamed_config(&source.join("config.json"), CLASS))),
        ("model.safetensors".to_string(), Content::Safetensors { start, total }),
    ]
    .into_iter()
    .collect();
    let repo = "some-org/cohere2-tiny";
    let server = HubServer::start([(repo.to_string(), Repo::new(&"c".repeat(40), files.clone()))].into());
    let home = tempfile::tempdir().unwrap();
    let folder = tempfile::tempdir().unwrap();
    write_folder(folder.path(), &files);
    let local = folder.path().display().to_string();
    let env = [("HF_HOME", home.path().to_str().unwrap()), ("HF_ENDPOINT", &server.endpoint())];
    for args in
        [["estimate", "{}", "--hardware", "t4", "--json"], ["plan", "{}", "--hardware", "t4", "--json"]]
    {
        let with = |model: &str| -> Vec<String> {
            args.iter().map(|a| if *a == "{}" { model.to_string() } else { a.to_string() }).collect()
        };
        let (hub_args, local_args) = (with(repo), with(&local));
        let hub = run_with_hub(&env, &hub_args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(hub.code, 0, "{}\n{}", hub.stdout, hub.stderr);
        let from_folder = run_with_hub(&env, &local_args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(from_folder.code, 0, "{}", from_folder.stderr);
        let mut hub_json = hub.json();
        let mut local_json = from_folder.json();
        assert_eq!(hub_json["generic"]["architecture"], CLASS, "{hub_json}");
        // The solver's time is the one figure that differs between two runs of anything.
        without_seconds(&mut hub_json);
        without_seconds(&mut local_json);
        let text = |v: &serde_json::Value| v.to_string().replace(&local, repo);
        assert_eq!(
            text(&hub_json),
            text(&local_json),
            "`{}` differs between the Hub id and the folder",
            args[0]
        );
    }
}

/// config.json at `path` with `architectures` naming `class`.
fn renamed_config(path: &Path, class: &str) -> Vec<u8> {
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    config["architectures"] = serde_json::json!([class]);
    serde_json::to_vec_pretty(&config).unwrap()
}

fn without_seconds(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("seconds");
            map.values_mut().for_each(without_seconds);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(without_seconds),
        _ => {}
    }
}
