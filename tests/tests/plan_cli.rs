//! `vramplan plan` as a user runs it: an infeasible training run is explained and every remedy
//! it offers fits when the user applies its flags; the reported Mixtral case on two T4s gives
//! an accelerate map that `check` accepts; a llama.cpp plan prints the `-ngl`
//! llama.cpp needs to keep every layer on the GPU. Figures come from the models' published
//! configurations and the hardware's memory, not from the solver.

use vramplan_tests::{Output, vramplan};

/// The arguments of a remedy applied to `base`: its flags added, a `--hardware` in them
/// replacing the base's.
fn with_flags(base: &[&str], flags: &str) -> Vec<String> {
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let replaces_hardware = flags.contains(&"--hardware");
    let mut args = Vec::new();
    let mut skip = false;
    for &arg in base {
        if skip {
            skip = false;
            continue;
        }
        if arg == "--hardware" && replaces_hardware {
            skip = true;
            continue;
        }
        args.push(arg.to_string());
    }
    args.extend(flags.iter().map(|f| f.to_string()));
    args
}

/// The flags that apply a remedy of `plan --json` (its `change`, typed data), as a user writes
/// them from the data: `--quant nf4 --double-quant --lora-rank 16 --hardware 20xt4`.
fn remedy_flags(change: &serde_json::Value) -> String {
    let quantization = |q: &serde_json::Value| {
        let quant = match q["quant"].as_str().expect("quant") {
            "int8" => "--quant int8",
            "nf4_double_quant" => "--quant nf4 --double-quant",
            other => panic!("unexpected quantization {other}"),
        };
        match q["lora_rank"].as_u64() {
            Some(rank) => format!("{quant} --lora-rank {rank}"),
            None => quant.to_string(),
        }
    };
    let number = |key: &str| change[key].as_u64().unwrap_or_else(|| panic!("{key}: {change}"));
    match change["change"].as_str().expect("change") {
        "batch" => format!("--batch {}", number("batch")),
        "sequence" => format!("--seq {}", number("seq")),
        "grad_checkpointing" => "--grad-ckpt full".into(),
        "lora" => format!("--lora-rank {}", number("rank")),
        "quantize" => quantization(change),
        // Offload is the default: the base arguments without `--no-offload`.
        "offload" => String::new(),
        "more_gpus" => {
            let hardware = format!("--hardware {}", change["hardware"].as_str().expect("hardware"));
            match change.get("quantize").filter(|q| !q.is_null()) {
                Some(q) => format!("{} {hardware}", quantization(q)),
                None => hardware,
            }
        }
        other => panic!("unexpected change {other}"),
    }
}

/// Every GPU of a plan's `--json` within usable memory less 10 % headroom.
fn assert_within_headroom(out: &Output) {
    let json = out.json();
    for device in json["devices"].as_array().expect("devices") {
        let Some(estimate) = device.get("estimate") else { continue };
        let peak = estimate["peak_reserved_bytes"].as_u64().expect("peak");
        let usable = estimate["usable_bytes"].as_u64().expect("usable");
        assert!(peak as f64 <= 0.9 * usable as f64, "{}: {peak} of {usable}", device["name"]);
    }
}

#[test]
fn llama_2_70b_training_on_one_t4_is_explained_with_remedies_that_fit() {
    // 70B parameters of bf16 weights alone are 140 GB; a T4 has 15 GiB. Nothing is written.
    let dir = tempfile::tempdir().expect("temp dir");
    let map = dir.path().join("map.json").display().to_string();
    let base = ["plan", "llama-2-70b", "--hardware", "t4", "--mode", "train", "--dtype", "bf16"];
    let mut args = base.to_vec();
    args.extend(["--json", "-o", &map]);
    let out = vramplan(&args);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let json = out.json();
    assert_eq!(json["feasible"], false);
    assert!(!std::path::Path::new(&map).exists(), "an infeasible plan writes no map");
    let shortfalls = json["explanation"]["shortfalls"].as_array().expect("shortfalls");
    let short = shortfalls[0]["short_bytes"].as_u64().expect("short bytes");
    assert!(short > 140_000_000_000 - 16 * (1 << 30), "short by only {short} bytes");
    let remedies = json["explanation"]["remedies"].as_array().expect("remedies");
    assert!(remedies.len() >= 2, "{remedies:#?}");
    for remedy in remedies {
        let flags = remedy_flags(&remedy["change"]);
        let mut args = with_flags(&base, &flags);
        args.push("--json".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let applied = vramplan(&argv);
        assert_eq!(applied.code, 0, "remedy `{flags}` does not fit: {}", applied.stdout);
        assert_eq!(applied.json()["feasible"], true);
        assert_within_headroom(&applied);
    }
}

/// The Mixtral 4-bit workload of accelerate #3041.
const MIXTRAL_NF4: [&str; 9] =
    ["--mode", "inference", "--quant", "nf4", "--double-quant", "--dtype", "fp16", "--seq", "1024"];

#[test]
fn mixtral_4bit_on_two_t4s_exports_a_map_that_check_accepts() {
    // As the report's user ran it: transformers 4.x, whose experts bitsandbytes quantizes.
    let dir = tempfile::tempdir().expect("temp dir");
    let map = dir.path().join("device_map.json");
    let map_arg = map.display().to_string();
    let workload: Vec<&str> = MIXTRAL_NF4.iter().copied().chain(["--target", "accelerate-v4"]).collect();
    let mut args = vec!["plan", "mixtral-8x7b", "--hardware", "t4x2", "--json", "-o", &map_arg];
    args.extend(&workload);
    let out = vramplan(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_within_headroom(&out);

    // The map names Mixtral's modules as transformers does: the embedding, its 32 decoder
    // layers (config.json: num_hidden_layers 32), the final norm, the rotary buffers, the head.
    let text = std::fs::read_to_string(&map).expect("the map is written");
    let written: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).expect("JSON map");
    let mut expected: Vec<String> = (0..32).map(|i| format!("model.layers.{i}")).collect();
    expected.extend(["model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"].map(String::from));
    let mut keys: Vec<String> = written.keys().cloned().collect();
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected);
    let gpus: std::collections::BTreeSet<u64> =
        written.values().map(|v| v.as_u64().expect("a GPU index")).collect();
    assert_eq!(gpus, [0, 1].into(), "both T4s hold layers");

    // Nothing else beside it: transformers reads `max_memory` only for `device_map="auto"`.
    let written: Vec<_> = std::fs::read_dir(dir.path()).expect("folder").collect();
    assert_eq!(written.len(), 1, "only the map is written: {written:?}");

    let mut args = vec!["check", &map_arg, "mixtral-8x7b", "--hardware", "t4x2"];
    args.extend(&workload);
    let checked = vramplan(&args);
    assert_eq!(checked.code, 0, "check rejects the solver's own map:\n{}", checked.stdout);
}

#[test]
fn mixtral_4bit_under_transformers_5_offloads_and_says_how_to_load_it() {
    // transformers 5.x fuses each layer's experts into 3-D parameters that bitsandbytes does
    // not quantize: 32 × 2.82 GB of fp16 experts cannot fit two T4s, so layers go to the host,
    // and bitsandbytes then needs `llm_int8_enable_fp32_cpu_offload` (and disk an
    // `offload_folder`) to load the map.
    let dir = tempfile::tempdir().expect("temp dir");
    let map = dir.path().join("device_map.json");
    let map_arg = map.display().to_string();
    let mut args = vec!["plan", "mixtral-8x7b", "--hardware", "t4x2", "-o", &map_arg];
    args.extend(MIXTRAL_NF4);
    let out = vramplan(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let written: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&map).expect("map")).expect("JSON map");
    let on_host = written.values().filter(|v| v.is_string()).count();
    assert!(on_host >= 16, "most layers leave the GPUs: {written:?}");
    assert!(out.stdout.contains("llm_int8_enable_fp32_cpu_offload=True"), "{}", out.stdout);
    let has_disk = written.values().any(|v| v == "disk");
    assert_eq!(out.stdout.contains("offload_folder="), has_disk, "{}", out.stdout);
}

#[test]
fn llama_cpp_plan_offloads_every_layer_and_the_output() {
    // Llama-2-7B has 32 blocks; llama.cpp counts the output layer as one more, so keeping all
    // on the GPU is `-ngl 33`. F16 weights (13.5 GB) and a 4096-token KV cache (2 GiB) fit
    // a 24 GB RTX 4090.
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = dir.path().join("flags.txt");
    let flags_arg = flags.display().to_string();
    let out = vramplan(&[
        "plan",
        "llama-2-7b",
        "--hardware",
        "rtx4090",
        "--target",
        "llama.cpp",
        "--engine",
        "llama.cpp",
        "--mode",
        "inference",
        "--seq",
        "4096",
        "-o",
        &flags_arg,
    ]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let text = std::fs::read_to_string(&flags).expect("flags written");
    assert!(text.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w == ["-ngl", "33"]), "{text}");
}

/// Host memory is a fact or a question: a plan that offloads on a profile with no host figures
/// says what it assumed; the profile's figures (Kaggle's T4 x2: 29 GiB of RAM, 73 GB of disk) or
/// `--host-ram`/`--disk` bound the offload instead, and then nothing is assumed.
#[test]
fn an_offloading_plan_states_the_host_memory_it_assumes() {
    let args = ["plan", "mixtral-8x7b", "--mode", "inference", "--dtype", "fp16", "--seq", "1024", "--json"];
    let assumed = vramplan(&[&args[..], &["--hardware", "2xt4"]].concat());
    assert_eq!(assumed.code, 0, "{}", assumed.stderr);
    let warnings = assumed.json()["warnings"].to_string();
    assert!(
        warnings.contains("assumes 64.00 GiB of RAM (--host-ram) and 4.00 TiB of disk (--disk)"),
        "{warnings}"
    );
    let kaggle = vramplan(&[&args[..], &["--hardware", "t4x2"]].concat());
    let json = kaggle.json();
    assert!(!json["warnings"].to_string().contains("assumes"), "{}", json["warnings"]);
    let host = |json: &serde_json::Value, name: &str| {
        json["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .map(|d| d["limit_bytes"].clone())
    };
    assert_eq!(host(&json, "cpu"), Some(serde_json::json!(29u64 << 30)), "{json}");
    assert_eq!(host(&json, "disk"), Some(serde_json::json!(73_000_000_000u64)), "{json}");
    let given =
        vramplan(&[&args[..], &["--hardware", "2xt4", "--host-ram", "32GiB", "--disk", "100GB"]].concat());
    let json = given.json();
    assert!(!json["warnings"].to_string().contains("assumes"), "{}", json["warnings"]);
    assert_eq!(host(&json, "cpu"), Some(serde_json::json!(32u64 << 30)), "{json}");
    let bad = vramplan(&[&args[..], &["--hardware", "2xt4", "--host-ram", "32"]].concat());
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--host-ram"), "{}", bad.stderr);
}

/// Under a serving engine the default headroom is 0: vLLM fills `gpu_memory_utilization` (0.9)
/// of the GPU's total with weights and KV cache and keeps the rest free itself, so a further
/// 10 % of the usable memory (0.9 × 78.68 GiB on an H100, below vLLM's 0.9 × 79.65 GiB) would
/// refuse every plan it makes. A headroom the user gives still applies.
#[test]
fn serving_engines_keep_their_own_headroom() {
    let base = [
        "plan",
        "llama-3.1-8b",
        "--hardware",
        "h100-80gb",
        "--engine",
        "vllm",
        "--mode",
        "inference",
        "--seq",
        "4096",
    ];
    let plan = vramplan(&base);
    assert_eq!(plan.code, 0, "{}\n{}", plan.stdout, plan.stderr);
    let with_headroom = vramplan(&[&base[..], &["--headroom", "10%"]].concat());
    assert_ne!(with_headroom.code, 0, "{}", with_headroom.stdout);
}
