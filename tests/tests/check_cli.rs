//! `vramplan check` as a user runs it on device maps written by hand: each mismatch the runtime
//! would hit is reported with its rule and modules and exits 1, a clean map that fits exits 0,
//! a map that leaves a tensor on no device is reported without a memory simulation, and bad
//! input exits 2 saying where. Module names are transformers' own, written out here.

use vramplan_tests::{Output, vramplan, write};

/// A JSON object from `(key, device)` pairs, written as they are (repeats kept).
fn map_text(entries: &[(String, String)]) -> String {
    let lines: Vec<String> = entries.iter().map(|(k, v)| format!("  \"{k}\": {v}")).collect();
    format!("{{\n{}\n}}\n", lines.join(",\n"))
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Llama 3 8B's 32 layers whole, halves on GPUs 0 and 1, as accelerate writes a map.
fn llama_even_split() -> Vec<(String, String)> {
    let mut map = pairs(&[("model.embed_tokens", "0")]);
    for i in 0..32 {
        map.push((format!("model.layers.{i}"), if i < 16 { "0" } else { "1" }.to_string()));
    }
    map.extend(pairs(&[("model.norm", "1"), ("lm_head", "1")]));
    map
}

fn check(map: &str, model: &str, extra: &[&str]) -> Output {
    let mut args = vec!["check", map, model];
    args.extend_from_slice(extra);
    vramplan(&args)
}

/// The rules and modules of `--json`'s findings.
fn findings(out: &Output) -> Vec<(String, Vec<String>)> {
    let json = out.json();
    json["findings"]
        .as_array()
        .expect("findings list")
        .iter()
        .map(|f| {
            let modules = f["modules"].as_array().expect("modules").iter();
            (
                f["rule"].as_str().expect("rule").to_string(),
                modules.map(|m| m.as_str().expect("module").to_string()).collect(),
            )
        })
        .collect()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn mixtral_experts_split_from_their_router_under_accelerate_v4() {
    let dir = tempfile::tempdir().unwrap();
    // Layer 0 module by module as transformers 4.x names it, experts 6 and 7 with the later
    // layers on GPU 1.
    let mut map = pairs(&[
        ("model.embed_tokens", "0"),
        ("model.layers.0.input_layernorm", "0"),
        ("model.layers.0.self_attn", "0"),
        ("model.layers.0.post_attention_layernorm", "0"),
        ("model.layers.0.block_sparse_moe.gate", "0"),
    ]);
    for e in 0..8 {
        map.push((
            format!("model.layers.0.block_sparse_moe.experts.{e}"),
            if e < 6 { "0" } else { "1" }.into(),
        ));
    }
    for i in 1..32 {
        map.push((format!("model.layers.{i}"), "1".into()));
    }
    map.extend(pairs(&[("model.norm", "1"), ("lm_head", "1")]));
    let file = write(dir.path(), "mixtral.json", map_text(&map));
    let args = ["--hardware", "2xa100-80gb", "--quant", "nf4", "--target", "accelerate-v4", "--json"];
    let out = check(&file, "mixtral-8x7b", &args);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        findings(&out),
        vec![(
            "experts-apart-from-router".to_string(),
            strings(&[
                "model.layers.0.block_sparse_moe.gate",
                "model.layers.0.block_sparse_moe.experts.6",
                "model.layers.0.block_sparse_moe.experts.7",
            ])
        )]
    );
    let json = out.json();
    assert_eq!(json["ok"], false);
    assert_eq!(json["target"], "accelerate-v4");
    // 46.7 B parameters in 4 bits are about 23 GiB over two 80 GB GPUs: memory is not the issue.
    assert_eq!(json["fits"], true);
    assert_eq!(json["devices"].as_array().map(Vec::len), Some(2));

    // The same names under the 5.x target are bad input, with the target that reads them.
    let out = check(&file, "mixtral-8x7b", &["--hardware", "2xa100-80gb", "--target", "accelerate"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("`model.layers.0.block_sparse_moe.gate`"), "{}", out.stderr);
    assert!(out.stderr.contains("--target accelerate-v4"), "{}", out.stderr);

    // The human report names the rule and ends with the verdict.
    let out = check(&file, "mixtral-8x7b", &args[..args.len() - 1]);
    assert_eq!(out.code, 1);
    assert!(out.stdout.contains("1 mismatch for accelerate-v4"), "{}", out.stdout);
    assert!(out.stdout.contains("1. experts-apart-from-router  (GPU 0, GPU 1)"), "{}", out.stdout);
    assert!(out.stdout.trim_end().ends_with("check: the map has mismatches to fix"), "{}", out.stdout);
}

#[test]
fn tied_embeddings_on_two_gpus() {
    // GPT-2 ties `lm_head.weight` to `transformer.wte.weight`.
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "gpt2.json", map_text(&pairs(&[("transformer", "0"), ("lm_head", "1")])));
    let out = check(&file, "gpt2", &["--hardware", "t4x2", "--json"]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        findings(&out),
        vec![("tied-weights-split".to_string(), strings(&["transformer.wte", "lm_head"]))]
    );
    // 124 M parameters in fp32 (0.5 GB) fit a 15 GiB T4 with room to spare.
    assert_eq!(out.json()["fits"], true);
    // Gemma-2B ties them too.
    let file = write(dir.path(), "gemma.json", map_text(&pairs(&[("model", "0"), ("lm_head", "1")])));
    let out = check(&file, "gemma-2b", &["--hardware", "2xa100-80gb", "--json"]);
    assert_eq!(
        findings(&out),
        vec![("tied-weights-split".to_string(), strings(&["model.embed_tokens", "lm_head"]))]
    );
}

#[test]
fn split_inside_a_decoder_layer() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = llama_even_split();
    // Layer 17's MLP on GPU 0, the rest of the layer on GPU 1.
    map.retain(|(k, _)| k != "model.layers.17");
    map.extend(pairs(&[
        ("model.layers.17.self_attn", "1"),
        ("model.layers.17.input_layernorm", "1"),
        ("model.layers.17.post_attention_layernorm", "1"),
        ("model.layers.17.mlp", "0"),
    ]));
    let file = write(dir.path(), "split.json", map_text(&map));
    let out = check(&file, "llama-3-8b", &["--hardware", "2xa100-80gb", "--dtype", "bf16", "--json"]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let found = findings(&out);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "split-block");
    // The MLP (3·4096·14336 = 176 M parameters) outweighs attention and norms (42 M): the
    // layer's home is GPU 0 and the attention side is named to move.
    assert_eq!(found[0].1[0], "model.layers.17");
    assert!(found[0].1.contains(&"model.layers.17.self_attn".to_string()), "{found:?}");
    assert!(!found[0].1.contains(&"model.layers.17.mlp".to_string()), "{found:?}");
    assert_eq!(out.json()["findings"][0]["devices"], serde_json::json!(["GPU 0", "GPU 1"]));
}

#[test]
fn uncovered_parameter_skips_the_memory_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = llama_even_split();
    map.retain(|(k, _)| k != "lm_head");
    let file = write(dir.path(), "no-head.json", map_text(&map));
    let out = check(&file, "llama-3-8b", &["--hardware", "2xa100-80gb", "--json"]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert_eq!(findings(&out), vec![("uncovered".to_string(), strings(&["lm_head"]))]);
    let json = out.json();
    assert_eq!(json["fits"], serde_json::Value::Null);
    assert_eq!(json["devices"], serde_json::json!([]));
    assert!(json["memory_skipped"].as_str().is_some_and(|s| s.contains("`lm_head`")), "{json}");
    let out = check(&file, "llama-3-8b", &["--hardware", "2xa100-80gb"]);
    assert!(out.stdout.starts_with("memory: not simulated"), "{}", out.stdout);
}

#[test]
fn name_listed_twice_is_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = llama_even_split();
    map.push(("model.layers.3".into(), "1".into()));
    let file = write(dir.path(), "twice.json", map_text(&map));
    let out = check(&file, "llama-3-8b", &["--hardware", "2xa100-80gb", "--json"]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert_eq!(findings(&out), vec![("listed-twice".to_string(), strings(&["model.layers.3"]))]);
    assert_eq!(out.json()["findings"][0]["devices"], serde_json::json!(["GPU 0", "GPU 1"]));
    // `estimate` still refuses it as bad input, at the second occurrence (line 37 of the file:
    // the brace, 35 entries, then the repeat).
    let out = vramplan(&["estimate", "llama-3-8b", "--hardware", "2xa100-80gb", "--device-map", &file]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains(&format!("{file}:37:3")), "{}", out.stderr);
    assert!(out.stderr.contains("listed twice"), "{}", out.stderr);
}

#[test]
fn clean_maps_pass() {
    let dir = tempfile::tempdir().unwrap();
    let whole = write(dir.path(), "whole.json", "{\"\": 0}");
    let out = check(&whole, "gpt2", &["--hardware", "t4", "--json"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let json = out.json();
    assert_eq!(json["ok"], true);
    assert_eq!(json["fits"], true);
    assert_eq!(json["findings"], serde_json::json!([]));
    // Llama 3 8B in bf16 (16 GB of weights) split evenly by hand over two 80 GB GPUs.
    let even = write(dir.path(), "even.json", map_text(&llama_even_split()));
    for target in ["accelerate", "pipeline"] {
        let out =
            check(&even, "llama-3-8b", &["--hardware", "2xa100-80gb", "--dtype", "bf16", "--target", target]);
        assert_eq!(out.code, 0, "{target}: {}{}", out.stdout, out.stderr);
        assert!(out.stdout.contains(&format!("no mismatch for {target}")), "{}", out.stdout);
        assert!(out.stdout.contains("GPU 0") && out.stdout.contains("GPU 1"), "{}", out.stdout);
    }
}

#[test]
fn a_clean_map_that_does_not_fit_exits_1() {
    // Llama 3 8B in bf16 is 16 GB of weights: on one 15 GiB T4 it cannot fit.
    let dir = tempfile::tempdir().unwrap();
    let whole = write(dir.path(), "whole.json", "{\"\": 0}");
    let out = check(&whole, "llama-3-8b", &["--hardware", "t4", "--dtype", "bf16", "--json"]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    let json = out.json();
    assert_eq!(
        (json["fits"].clone(), json["ok"].clone()),
        (serde_json::json!(false), serde_json::json!(false))
    );
    assert_eq!(json["findings"], serde_json::json!([]));
}

#[test]
fn bad_input_exits_2_saying_where() {
    let dir = tempfile::tempdir().unwrap();
    let map = write(dir.path(), "typo.json", "{\"\": 0,\n  \"model.layer.3\": 1}");
    let out = check(&map, "llama-3-8b", &["--hardware", "t4x2"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stdout.is_empty());
    assert!(
        out.stderr.contains(&format!("{map}:2:3")) && out.stderr.contains("`model.layers.3`"),
        "{}",
        out.stderr
    );
    let whole = write(dir.path(), "whole.json", "{\"\": 0}");
    let out = check(&whole, "llama-3-8b", &["--hardware", "t4x2", "--target", "vllm"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("unknown target `vllm`") && out.stderr.contains("fix:"), "{}", out.stderr);
    let out = check(&whole, "llama-3-8b", &["--hardware", "t4x2", "--parallel", "tp=2"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("--parallel single"), "{}", out.stderr);
}

#[test]
fn maps_written_by_plan_pass_check() {
    // What `plan -o` exports must load as it is: tied heads with their embedding, experts with
    // their router, whole layers.
    let dir = tempfile::tempdir().unwrap();
    let cases: [&[&str]; 2] = [
        &["gemma-2b", "--hardware", "t4x2"],
        &["mixtral-8x7b", "--hardware", "2xa100-80gb", "--quant", "nf4", "--target", "accelerate-v4"],
    ];
    for (i, case) in cases.iter().enumerate() {
        let file = dir.path().join(format!("plan-{i}.json")).display().to_string();
        let mut plan = vec!["plan"];
        plan.extend_from_slice(case);
        plan.extend_from_slice(&["-o", &file]);
        let out = vramplan(&plan);
        assert_eq!(out.code, 0, "{case:?}: {}", out.stderr);
        let mut args = case[1..].to_vec();
        args.push("--json");
        let out = check(&file, case[0], &args);
        assert_eq!(out.code, 0, "{case:?}: {}{}", out.stdout, out.stderr);
        assert_eq!(out.json()["findings"], serde_json::json!([]), "{case:?}");
    }
}

/// `report --device-map` checks the map as `check` does: a map whose every layer is split (the
/// runtime stops at the first residual add) is reported with its mismatches, the map and the
/// call that loads it, never as fitting alone.
#[test]
fn a_report_of_a_given_map_carries_its_findings_the_map_and_the_load_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = pairs(&[("model.embed_tokens", "0")]);
    for i in 0..32 {
        map.push((format!("model.layers.{i}.self_attn"), "0".into()));
        map.push((format!("model.layers.{i}.input_layernorm"), "0".into()));
        map.push((format!("model.layers.{i}.mlp"), "1".into()));
        map.push((format!("model.layers.{i}.post_attention_layernorm"), "1".into()));
    }
    map.extend(pairs(&[("model.norm", "1"), ("model.rotary_emb", "1"), ("lm_head", "1")]));
    let map = write(dir.path(), "map.json", map_text(&map));
    let report = dir.path().join("report.md");
    let out = vramplan(&[
        "report",
        "llama-3-8b",
        "--hardware",
        "2xa100-80gb",
        "--device-map",
        &map,
        "-o",
        report.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("device map: 32 mismatches for accelerate"), "{text}");
    assert!(text.contains("check: the map has mismatches to fix"), "{text}");
    assert!(text.contains("\"model.layers.31.mlp\": 1"), "{text}");
    assert!(text.contains(
        "model = LlamaForCausalLM.from_pretrained(\"meta-llama/Meta-Llama-3-8B\", device_map=json.load(open(\"device_map.json\")))"
    ));
}
