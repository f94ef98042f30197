//! Reading and checking workloads and device maps: the workload YAML with flags over it, LoRA
//! targets matched as PEFT matches them (counted from the checkpoint index's tensor names, not
//! from the module tree), the errors and warnings of `validate`, and device maps built from the
//! index's names.

use std::collections::BTreeSet;
use std::path::PathBuf;
use vramplan_profiles::hardware::{self, HardwareProfile};
use vramplan_profiles::model::{self, ImportOptions, ModelDescription, Naming};
use vramplan_profiles::{DType, InputError};
use vramplan_sim::device_map::placement_from_device_map;
use vramplan_sim::input::{WorkloadFlags, lora_target_modules, validate, workload_from_yaml};
use vramplan_sim::workload::{Engine, Finetune, Mode, Parallelism, Quant, Workload};
use vramplan_sim::{Placement, Target};

fn shared_model(folder: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/published/models").join(folder)
}

fn load(folder: &str, naming: Naming) -> ModelDescription {
    let path = shared_model(folder);
    model::load(&path.display().to_string(), ImportOptions { naming }).expect("shared model loads")
}

fn llama3() -> ModelDescription {
    load("meta-llama__Meta-Llama-3-8B", Naming::V5)
}

fn config(folder: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(shared_model(folder).join("config.json")).expect("config.json");
    serde_json::from_str(&text).expect("config JSON")
}

/// The tensor names of the checkpoint (`weight_map` of model.safetensors.index.json).
fn index_names(folder: &str) -> Vec<String> {
    let path = shared_model(folder).join("model.safetensors.index.json");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("index")).expect("JSON");
    index["weight_map"].as_object().expect("weight_map").keys().cloned().collect()
}

fn hw(name: &str) -> HardwareProfile {
    hardware::load(name).expect("built-in profile")
}

/// A file in the temp folder, unique to this test process and `name`.
fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("vramplan-sim-input-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write temp file");
    path
}

fn lora(targets: &[&str]) -> Workload {
    Workload {
        mode: Mode::Train,
        finetune: Finetune::Lora {
            rank: 16,
            alpha: 32,
            targets: targets.iter().map(|t| t.to_string()).collect(),
        },
        ..Workload::default()
    }
}

fn layers(folder: &str) -> usize {
    config(folder)["num_hidden_layers"].as_u64().expect("num_hidden_layers") as usize
}

#[test]
fn yaml_file_then_flags_flags_win() {
    let path = temp_file(
        "merge.yaml",
        "# QLoRA on a T4\nmode: train\nbatch: 4\nseq: 1024\nquant: {kind: nf4, double_quant: true}\n\
         finetune: {kind: lora, rank: 16, alpha: 32, targets: [q_proj, v_proj]}\n\
         engine: {kind: transformers}\nswitches: {compile: true}\n",
    );
    let file = workload_from_yaml(&path).expect("valid workload");
    assert_eq!((file.mode, file.batch, file.seq), (Mode::Train, 4, 1024));
    assert_eq!(file.quant, Quant::Nf4 { double_quant: true });
    // Keys left out keep the defaults.
    assert_eq!(file.grad_accum, Workload::default().grad_accum);

    let flags = WorkloadFlags {
        batch: Some(8),
        lora_rank: Some(64),
        optimizer: Some("paged_adamw_8bit".into()),
        chunked_ce: true,
        ..WorkloadFlags::default()
    };
    let merged = flags.apply(file).expect("flags apply");
    assert_eq!(merged.batch, 8, "the flag wins");
    assert_eq!(merged.seq, 1024, "the file's value stays where no flag is given");
    assert_eq!(
        merged.finetune,
        Finetune::Lora { rank: 64, alpha: 32, targets: vec!["q_proj".into(), "v_proj".into()] },
        "a new rank keeps the file's alpha and targets"
    );
    assert_eq!(merged.quant, Quant::Nf4 { double_quant: true });
    assert!(merged.switches.compile && merged.switches.chunked_cross_entropy);
    assert_eq!(merged.optimizer, vramplan_sim::workload::Optimizer::PagedAdamw8bit);
}

#[test]
fn empty_workload_file_is_the_default() {
    let path = temp_file("empty.yaml", "# nothing\n\n");
    assert_eq!(workload_from_yaml(&path).expect("empty is fine"), Workload::default());
}

#[test]
fn yaml_errors_name_file_line_and_column() {
    let path = temp_file("typo.yaml", "mode: train\nbatchsize: 4\n");
    let err = workload_from_yaml(&path).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with(&format!("{}:2:1:", path.display())), "{text}");
    assert!(text.contains("batchsize") && text.contains("expected one of"), "{text}");
    assert!(err.fix.is_some());

    let path = temp_file("type.yaml", "mode: train\nbatch: four\n");
    let text = workload_from_yaml(&path).unwrap_err().to_string();
    assert!(text.starts_with(&format!("{}:2:8:", path.display())), "{text}");
    assert!(text.contains("whole number"), "{text}");
}

#[test]
fn engine_and_quant_flags_take_their_defaults_and_refinements() {
    let flags = WorkloadFlags {
        engine: Some("vllm".into()),
        gpu_memory_utilization: Some(0.8),
        quant: Some("gptq".into()),
        group_size: Some(32),
        ..WorkloadFlags::default()
    };
    let w = flags.apply(Workload::default()).expect("flags apply");
    assert_eq!(w.engine, Engine::Vllm { gpu_memory_utilization: 0.8, max_num_batched_tokens: 8192 });
    assert_eq!(w.quant, Quant::Gptq { bits: 4, group_size: 32 });

    let flags =
        WorkloadFlags { parallel: Some("zero3".into()), offload_params: true, ..WorkloadFlags::default() };
    let w = flags.apply(Workload::default()).expect("flags apply");
    assert_eq!(w.parallelism, Parallelism::Zero { stage: 3, offload_optimizer: false, offload_params: true });

    let refused = [
        WorkloadFlags { double_quant: true, ..WorkloadFlags::default() },
        WorkloadFlags { n_ctx: Some(4096), ..WorkloadFlags::default() },
        WorkloadFlags { lora_alpha: Some(16), ..WorkloadFlags::default() },
        WorkloadFlags { parallel: Some("zero2".into()), offload_params: true, ..WorkloadFlags::default() },
        WorkloadFlags { optimizer: Some("adam9bit".into()), ..WorkloadFlags::default() },
        WorkloadFlags { dtype: Some("fp12".into()), ..WorkloadFlags::default() },
        WorkloadFlags { quant: Some("Q4_K_X".into()), ..WorkloadFlags::default() },
    ];
    for flags in refused {
        let err = flags.apply(Workload::default()).expect_err("refused");
        assert!(err.origin.starts_with("--") && err.fix.is_some(), "{err}");
    }
    let err = WorkloadFlags { optimizer: Some("adamw9bit".into()), ..WorkloadFlags::default() }
        .apply(Workload::default())
        .unwrap_err();
    let fix = err.fix.unwrap_or_default();
    for accepted in
        ["adamw", "adamw8bit", "paged-adamw8bit", "paged-adamw", "sgd", "sgd-momentum", "adafactor"]
    {
        assert!(fix.contains(&format!("`{accepted}`")), "{fix}");
    }
}

#[test]
fn lora_targets_match_like_peft() {
    let model = llama3();
    let n = layers("meta-llama__Meta-Llama-3-8B");
    // The checkpoint's own names: every `*.q_proj.weight` is one q_proj module.
    let names = index_names("meta-llama__Meta-Llama-3-8B");
    let count =
        |suffix: &str| names.iter().filter(|name| name.ends_with(&format!(".{suffix}.weight"))).count();
    assert_eq!(count("q_proj"), n);

    let qv = lora_target_modules(&lora(&["q_proj", "v_proj"]), &model).expect("targets match");
    assert_eq!(qv.len(), count("q_proj") + count("v_proj"));
    assert!(qv.contains(&"model.layers.0.self_attn.q_proj".to_string()));

    // Llama's linear layers: four attention and three MLP projections per block, plus the head,
    // which `all-linear` leaves out.
    let all = lora_target_modules(&lora(&["all-linear"]), &model).expect("all-linear");
    let per_block = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
    assert_eq!(all.len(), per_block.iter().map(|p| count(p)).sum::<usize>());
    assert_eq!(all.len(), 7 * n);
    assert!(!all.iter().any(|p| p == "lm_head"));

    // A longer suffix matches only its own modules; the head can be named explicitly.
    let o = lora_target_modules(&lora(&["self_attn.o_proj", "lm_head"]), &model).expect("targets");
    assert_eq!(o.len(), n + 1);

    // No targets: PEFT's default for `llama` is q_proj and v_proj.
    assert_eq!(lora_target_modules(&lora(&[]), &model).expect("default"), qv);
    // Not LoRA: nothing.
    assert!(lora_target_modules(&Workload::default(), &model).expect("full").is_empty());
}

#[test]
fn all_linear_on_4x_mixtral_includes_experts_and_the_linear_router() {
    let folder = "mistralai__Mixtral-8x7B-v0.1";
    let model = load(folder, Naming::V4);
    // Every 2-D `.weight` of the 4.x checkpoint except embeddings, norms and the head is an
    // nn.Linear (attention projections, the router `gate`, each expert's w1/w2/w3).
    let linear: BTreeSet<String> = index_names(folder)
        .into_iter()
        .filter_map(|name| name.strip_suffix(".weight").map(str::to_string))
        .filter(|m| !m.contains("norm") && !m.ends_with("embed_tokens") && m != "lm_head")
        .collect();
    let config = config(folder);
    let experts = config["num_local_experts"].as_u64().unwrap() as usize;
    assert_eq!(linear.len(), layers(folder) * (4 + 1 + 3 * experts));
    let all: BTreeSet<String> =
        lora_target_modules(&lora(&["all-linear"]), &model).expect("all-linear").into_iter().collect();
    assert_eq!(all, linear);
}

fn err_text(result: Result<Vec<String>, InputError>) -> String {
    match result {
        Err(e) => e.to_string(),
        Ok(w) => panic!("expected an error, got warnings {w:?}"),
    }
}

#[test]
fn validate_refuses_what_cannot_run() {
    let model = llama3();
    let t4 = hw("t4");
    let text = err_text(validate(&Workload { batch: 0, ..Workload::default() }, &model, &t4));
    assert!(text.contains("`batch` is 0") && text.contains("--batch"), "{text}");
    let text = err_text(validate(&Workload { grad_accum: 0, ..Workload::default() }, &model, &t4));
    assert!(text.contains("grad_accum"), "{text}");

    let text = err_text(validate(&lora(&["q_prj"]), &model, &t4));
    assert!(text.contains("`q_prj` matches no module"), "{text}");
    assert!(text.contains("did you mean `q_proj`"), "{text}");
    assert!(
        text.contains(
            "`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`, `lm_head`"
        ),
        "{text}"
    );
    let text = err_text(validate(&lora(&["self_attn"]), &model, &t4));
    assert!(text.contains("not a linear layer"), "{text}");

    let qfull =
        Workload { mode: Mode::Train, quant: Quant::Nf4 { double_quant: false }, ..Workload::default() };
    assert!(err_text(validate(&qfull, &model, &t4)).contains("QLoRA"));

    // 32 heads over 3 GPUs do not split evenly.
    let heads = config("meta-llama__Meta-Llama-3-8B")["num_attention_heads"].as_u64().unwrap();
    assert_ne!(heads % 3, 0);
    let tp3 = Workload { parallelism: Parallelism::tensor(3), ..Workload::default() };
    let text = err_text(validate(&tp3, &model, &hw("a100-80gb-x4")));
    assert!(text.contains(&format!("{heads} attention heads")), "{text}");
    let tp8 = Workload { parallelism: Parallelism::tensor(8), ..Workload::default() };
    assert!(err_text(validate(&tp8, &model, &hw("a100-80gb-x4"))).contains("has 4"));
}

#[test]
fn validate_warns_about_bf16_fp8_and_long_sequences() {
    let model = llama3();
    let fp16 = Workload { weight_dtype: Some(DType::F16), ..Workload::default() };
    let bf16 = Workload { weight_dtype: Some(DType::BF16), ..Workload::default() };
    // T4 (Turing, 7.5) has no bf16; the A100 (Ampere) has.
    let warnings = validate(&bf16, &model, &hw("t4")).expect("runs");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("bf16") && warnings[0].contains("T4"), "{warnings:?}");
    assert!(validate(&bf16, &model, &hw("a100-80gb")).expect("runs").is_empty());
    assert!(validate(&fp16, &model, &hw("t4")).expect("runs").is_empty());
    let autocast =
        Workload { weight_dtype: Some(DType::F32), autocast: Some(DType::BF16), ..Workload::default() };
    assert_eq!(validate(&autocast, &model, &hw("v100-32gb-x4")).expect("runs").len(), 1);

    // fp8 KV cache: Ampere has no fp8, Hopper has.
    let fp8_kv = Workload { kv_dtype: Some(DType::F8E4M3), ..fp16.clone() };
    let warnings = validate(&fp8_kv, &model, &hw("a100-80gb")).expect("runs");
    assert!(warnings.len() == 1 && warnings[0].contains("fp8"), "{warnings:?}");
    assert!(validate(&fp8_kv, &model, &hw("h100-80gb")).expect("runs").is_empty());

    let positions = config("meta-llama__Meta-Llama-3-8B")["max_position_embeddings"].as_u64().unwrap();
    let long = Workload { seq: positions + 1, ..fp16.clone() };
    let warnings = validate(&long, &model, &hw("a100-80gb")).expect("runs");
    assert!(warnings.len() == 1 && warnings[0].contains(&positions.to_string()), "{warnings:?}");
    let at_limit = Workload { seq: positions, ..fp16 };
    assert!(validate(&at_limit, &model, &hw("a100-80gb")).expect("runs").is_empty());
}

/// A device map giving every checkpoint tensor (by its full name) a device.
fn device_map_json(entries: &[(String, serde_json::Value)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = entries.iter().cloned().collect();
    serde_json::to_string_pretty(&serde_json::Value::Object(map)).expect("JSON")
}

#[test]
fn device_map_of_the_checkpoints_own_names_loads() {
    let folder = "meta-llama__Meta-Llama-3-8B";
    let model = llama3();
    let n = layers(folder);
    // Modules as accelerate writes them: embeddings, each block, the final norm, the head.
    let mut entries = vec![("model.embed_tokens".to_string(), serde_json::json!(0))];
    for i in 0..n {
        entries.push((format!("model.layers.{i}"), serde_json::json!(if i < n / 2 { 0 } else { 1 })));
    }
    entries.push(("model.norm".into(), serde_json::json!(1)));
    entries.push(("lm_head".into(), serde_json::json!("cpu")));
    let path = temp_file("modules.json", &device_map_json(&entries));
    let placement = placement_from_device_map(&path, &model, &hw("t4x2")).expect("valid map");
    assert_eq!(placement.target_of("model.layers.0.mlp.up_proj"), Some(Target::Gpu(0)));
    assert_eq!(placement.target_of(&format!("model.layers.{}.self_attn", n - 1)), Some(Target::Gpu(1)));
    assert_eq!(placement.target_of("lm_head"), Some(Target::Cpu));
    assert_eq!(placement.gpus(), vec![0, 1]);

    // Every tensor of the checkpoint index named on its own loads too.
    let names = index_names(folder);
    let entries: Vec<(String, serde_json::Value)> =
        names.iter().map(|n| (n.clone(), serde_json::json!("disk"))).collect();
    let path = temp_file("tensors.json", &device_map_json(&entries));
    let placement = placement_from_device_map(&path, &model, &hw("t4")).expect("valid map");
    assert_eq!(placement.entries().len(), names.len());

    // Leaving one tensor out is refused, naming it and the count.
    let without_head: Vec<(String, serde_json::Value)> =
        entries.iter().filter(|(n, _)| n != "lm_head.weight").cloned().collect();
    let path = temp_file("unplaced.json", &device_map_json(&without_head));
    let text = placement_from_device_map(&path, &model, &hw("t4")).unwrap_err().to_string();
    assert!(text.contains("1 tensor of") && text.contains("`lm_head.weight`"), "{text}");
    assert!(text.contains("`\"lm_head\": 0`"), "{text}");
    let _ = Placement::single(0);
}

#[test]
fn device_map_errors_say_where_and_what_to_write() {
    let model = llama3();
    let t4x2 = hw("t4x2");
    let cases: [(&str, &str, &[&str]); 7] = [
        (
            "{\"\": 0,\n \"model.layer.3\": 1}",
            "unknown.json",
            &[":2:2:", "`model.layer.3` is not a module", "`model.layers.3`"],
        ),
        ("{\"layers.3\": 1, \"\": 0}", "prefix.json", &["did you mean `model.layers.3`"]),
        ("{\"\": 0, \"model.layers.40\": 1}", "range.json", &["holds 32 entries, 0 to 31"]),
        (
            "{\"\": 0,\n  \"lm_head\": 2}",
            "gpu.json",
            &[":2:3:", "GPU 2 is not in the hardware profile", "GPUs 0 to 1"],
        ),
        ("{\"\": \"mps\"}", "mps.json", &["`mps` is not a device", "`cuda:0`", "GPU 0 or 1"]),
        (
            "{\"model.embed_tokens\": 0, \"model.layers\": 0}",
            "unplaced.json",
            &["`model.norm`", "`lm_head`", "on no device"],
        ),
        ("{\"\": 0,\n  \"lm_head\" 1}", "broken.json", &[":2:13:", "malformed JSON"]),
    ];
    for (text, name, needles) in cases {
        let path = temp_file(name, text);
        let message = placement_from_device_map(&path, &model, &t4x2).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        for needle in needles {
            assert!(message.contains(needle), "{name}: expected `{needle}` in\n{message}");
        }
        assert!(message.contains("fix:"), "{message}");
    }
}

#[test]
fn every_yaml_example_in_docs_workloads_md_reads() {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/workloads.md")).expect("docs");
    let blocks: Vec<&str> =
        docs.split("```yaml\n").skip(1).filter_map(|rest| rest.split("```").next()).collect();
    assert!(blocks.len() >= 2, "the doc shows at least two workloads");
    for (i, block) in blocks.iter().enumerate() {
        let path = temp_file(&format!("docs-{i}.yaml"), block);
        let workload = workload_from_yaml(&path).unwrap_or_else(|e| panic!("docs example {i}: {e}"));
        validate(&workload, &llama3(), &hw("a100-80gb")).unwrap_or_else(|e| panic!("docs example {i}: {e}"));
    }
}
