//! AWQ and GPTQ (`--quant awq`, `--quant gptq`, not `--awq-fused`) run weights quantized ahead
//! of time, read from a checkpoint quantized that way (its config.json's `quantization_config`);
//! the model's own repository holds unquantized weights, which `from_pretrained` would load as
//! they are. So no printed line loads the model's repository: `whatif`'s lines to run and
//! `plan -o`'s loading lines give the Python call as a comment (`# load it:`) with `CHECKPOINT`
//! in place of the repository, after a `# checkpoint:` line saying what to put there; the
//! serving commands take `"${CHECKPOINT:?…}"`, the checkpoint the user names in the shell; and
//! `plan --json`'s `load_kwargs` carries `prequantized`. Every line printed as code still runs
//! as printed: with `VRAMPLAN_PYTHON` (a Python with torch, transformers, PEFT and TRL, such as
//! `scripts/reference/.venv5/bin/python`) the lines run as one script, and the commented call
//! compiles and its imports run.

use vramplan_tests::vramplan;

/// `(name, arguments, the model's repository, the method the checkpoint line names)`; `@MAP@`
/// is the file `plan -o` writes.
const CASES: [(&str, &str, &str, &str); 4] = [
    (
        "whatif-awq-inference",
        "whatif max-batch mistral-7b --hardware a100-80gb --mode inference --seq 512 --dtype fp16 --quant awq",
        "mistralai/Mistral-7B-v0.1",
        "AWQ (4-bit, group size 128)",
    ),
    (
        "whatif-gptq-lora",
        "whatif max-batch llama-3-8b --hardware t4 --mode train --quant gptq --lora-rank 16 --seq 512",
        "meta-llama/Meta-Llama-3-8B",
        "GPTQ (4-bit, group size 128)",
    ),
    (
        "plan-awq-map",
        "plan mistral-7b --hardware t4 --mode inference --seq 512 --dtype fp16 --quant awq -o @MAP@",
        "mistralai/Mistral-7B-v0.1",
        "AWQ (4-bit, group size 128)",
    ),
    (
        "plan-gptq-8bit-map",
        "plan llama-3-8b --hardware 2xt4 --mode inference --seq 512 --dtype fp16 --quant gptq-8bit --group-size 64 \
         -o @MAP@",
        "meta-llama/Meta-Llama-3-8B",
        "GPTQ (8-bit, group size 64)",
    ),
];

/// The lines printed to paste: `whatif`'s under `to run it:`, `plan -o`'s under `wrote FILE`
/// (indented by two spaces).
fn pasted(stdout: &str) -> Vec<String> {
    let rest = match stdout.split_once("\nto run it:\n") {
        Some((_, rest)) => rest,
        None => match stdout.split_once("\nwrote ") {
            Some((_, rest)) => rest.split_once('\n').map_or("", |(_, r)| r),
            None => return Vec::new(),
        },
    };
    rest.lines().map_while(|l| l.strip_prefix("  ")).map(str::to_string).collect()
}

/// Runs each case: its lines, the folder `plan -o` wrote into (kept alive with them).
fn run_cases() -> Vec<(&'static str, Vec<String>, &'static str, &'static str, tempfile::TempDir)> {
    CASES
        .iter()
        .map(|&(name, args, repo, method)| {
            let dir = tempfile::tempdir().expect("temp dir");
            let map = dir.path().join("device_map.json").display().to_string();
            let args = args.replace("@MAP@", &map);
            let argv: Vec<&str> = args.split_whitespace().collect();
            let out = vramplan(&argv);
            assert_eq!(out.code, 0, "{name}: {}{}", out.stdout, out.stderr);
            let lines = pasted(&out.stdout);
            assert!(!lines.is_empty(), "{name}: nothing to paste:\n{}", out.stdout);
            (name, lines, repo, method, dir)
        })
        .collect()
}

#[test]
fn no_line_loads_the_base_repository_of_a_prequantized_method() {
    for (name, lines, repo, method, _dir) in run_cases() {
        for line in lines.iter().filter(|l| !l.starts_with('#')) {
            assert!(!line.contains("from_pretrained("), "{name}: loads as code: {line}");
            assert!(
                !line.contains(&format!("{repo:?}")),
                "{name}: names the base repository as code: {line}"
            );
        }
        let checkpoint = lines.iter().find(|l| l.starts_with("# checkpoint: ")).unwrap_or_else(|| {
            panic!("{name}: no `# checkpoint:` line: {lines:#?}");
        });
        assert!(
            checkpoint.contains(method) && checkpoint.contains(&format!("not {repo:?}")),
            "{name}: {checkpoint}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("# load it: ") && l.contains(".from_pretrained(CHECKPOINT, ")),
            "{name}: no commented call with CHECKPOINT: {lines:#?}"
        );
    }
}

/// `plan --json` says the arguments load a pre-quantized checkpoint; bitsandbytes', which
/// quantizes the model's own repository as it loads, does not.
#[test]
fn plan_json_load_kwargs_name_the_prequantized_checkpoint() {
    let cases = [
        (
            "plan mistral-7b --hardware t4 --mode inference --seq 512 --dtype fp16 --quant awq --json",
            Some("AWQ (4-bit, group size 128)"),
        ),
        ("plan mistral-7b --hardware t4 --mode inference --seq 512 --dtype fp16 --quant nf4 --json", None),
    ];
    for (args, method) in cases {
        let argv: Vec<&str> = args.split_whitespace().collect();
        let out = vramplan(&argv);
        assert_eq!(out.code, 0, "{args}: {}{}", out.stdout, out.stderr);
        let json = out.json();
        assert!(json["load_kwargs"].is_object(), "{args}: {json:#}");
        assert_eq!(json["load_kwargs"]["prequantized"].as_str(), method, "{args}");
    }
}

/// With `VRAMPLAN_PYTHON`: the printed lines run as one script, and the commented call
/// compiles, its imports running, once `CHECKPOINT` is given.
#[test]
fn the_printed_lines_run_with_the_real_library() {
    let Ok(python) = std::env::var("VRAMPLAN_PYTHON") else {
        println!("VRAMPLAN_PYTHON is not set: the lines were not run");
        return;
    };
    let mut failures = Vec::new();
    for (name, lines, _, _, dir) in run_cases() {
        let load =
            lines.iter().find_map(|l| l.strip_prefix("# load it: ")).expect("a load it line").to_string();
        let (imports, call) = load.rsplit_once("; ").expect("imports, then the call");
        // The Trainer's arguments refuse bf16 where no GPU has it: a GPU with bf16 here, as
        // `scripts/reference/pasteable.py` runs them.
        let script = format!(
            "import transformers.training_args\ntransformers.training_args.is_torch_bf16_gpu_available = lambda: True\n\
             {}\n{imports}\nCHECKPOINT = 'unused'\ncompile({call:?}, '<load it>', 'exec')\nprint('ran')\n",
            lines.join("\n")
        );
        // CI's Python (scripts/setup-torch) has torch, transformers, accelerate, PEFT and
        // bitsandbytes, not TRL: a case whose lines import it runs only where it is installed.
        let missing: Vec<&str> = ["trl", "peft"]
            .into_iter()
            .filter(|m| script.contains(&format!("from {m} import")))
            .filter(|m| {
                !std::process::Command::new(&python)
                    .args(["-c", &format!("import {m}")])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .collect();
        if !missing.is_empty() {
            println!("{name}: not run, {missing:?} missing from VRAMPLAN_PYTHON");
            continue;
        }
        let file = dir.path().join("pasted.py");
        std::fs::write(&file, &script).expect("script written");
        let out = std::process::Command::new(&python)
            .arg(&file)
            .current_dir(dir.path())
            .output()
            .expect("python runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains("ran") {
            failures.push(format!("{name}:\n{script}\n{}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// vLLM and SGLang read AWQ and GPTQ from the checkpoint's config too: their lines serve
/// `"${CHECKPOINT:?…}"`, which the shell expands to the checkpoint the user names and stops at
/// while it is unset; fp8 is quantized as the engine loads the model's own repository, by
/// `--quantization fp8` on both. With `VRAMPLAN_PYTHON` and the engines' argument code
/// (`scripts/reference/.venv5-engines`, as `scripts/reference/exports.py` parses the exports),
/// each line, with CHECKPOINT set as `exports.words` sets it, goes through the engine's own
/// parser.
#[test]
fn serving_lines_of_a_prequantized_method_name_the_users_checkpoint_and_parse() {
    // On an H100: transformers quantizes fp8 while loading only from compute capability 8.9
    // (tests/tests/fp8_while_loading.rs).
    let served = |quant: &str| -> Vec<String> {
        let args = format!("whatif max-concurrency mistral-7b --hardware h100-80gb --quant {quant}");
        let argv: Vec<&str> = args.split_whitespace().collect();
        let out = vramplan(&argv);
        assert_eq!(out.code, 0, "{quant}: {}{}", out.stdout, out.stderr);
        out.stdout.lines().filter_map(|l| l.strip_prefix("  ")).map(str::to_string).collect()
    };
    let mut commands = Vec::new();
    for quant in ["awq", "gptq"] {
        let lines = served(quant);
        for engine in ["vllm serve ", "python -m sglang.launch_server "] {
            let line = lines
                .iter()
                .find(|l| l.starts_with(engine) && l.contains(" \"${CHECKPOINT:?set CHECKPOINT to "))
                .unwrap_or_else(|| {
                    panic!("{quant}: no {engine}line serving ${{CHECKPOINT:?...}}: {lines:#?}")
                });
            assert!(
                !line.contains("serve mistralai/") && !line.contains("--model-path mistralai/"),
                "{quant}: serves the base repository: {line}"
            );
            commands.push(line.clone());
        }
        let notes = lines.iter().filter(|l| l.starts_with("# checkpoint: ")).count();
        assert_eq!(notes, 1, "{quant}: a checkpoint line for transformers' commented call: {lines:#?}");
    }
    let lines = served("fp8");
    for engine in ["vllm serve mistralai/Mistral-7B-v0.1 ", "python -m sglang.launch_server "] {
        let line =
            lines.iter().find(|l| l.starts_with(engine)).unwrap_or_else(|| panic!("{engine}: {lines:#?}"));
        assert!(line.contains(" --quantization fp8"), "{line}");
        commands.push(line.clone());
    }
    let Ok(python) = std::env::var("VRAMPLAN_PYTHON") else {
        println!("VRAMPLAN_PYTHON is not set: the engines' parsers were not run");
        return;
    };
    let reference = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference");
    if !reference.join(".venv5-engines").is_dir() {
        println!("scripts/reference/.venv5-engines is missing: the engines' parsers were not run");
        return;
    }
    let script = format!(
        "import json, sys\nsys.path.insert(0, {dir:?})\nimport exports\n\
         for line in json.loads(sys.argv[1]):\n    argv = exports.words(line)\n    \
         parsed = exports.parse_vllm(argv) if argv[0] == 'vllm' else exports.parse_sglang(argv)\n    \
         print(json.dumps(parsed, default=str))\n",
        dir = reference.display().to_string()
    );
    let out = std::process::Command::new(&python)
        .args(["-c", &script, &serde_json::to_string(&commands).expect("JSON")])
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
    let parsed: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert_eq!(parsed.len(), commands.len(), "{stdout}");
    for (line, parsed) in commands.iter().zip(&parsed) {
        let model = parsed.get("model_tag").or_else(|| parsed.get("model_path")).expect("the model");
        // exports.CHECKPOINT, what `exports.words` puts for the user's checkpoint.
        let expected = if line.contains("${CHECKPOINT:?") {
            "an-org/a-checkpoint-quantized-AWQ-or-GPTQ"
        } else {
            "mistralai/Mistral-7B-v0.1"
        };
        assert_eq!(model, expected, "{line}: {parsed}");
        if line.contains("--quantization fp8") {
            assert_eq!(parsed["quantization"], "fp8", "{line}: {parsed}");
        }
    }
}

/// A model whose own checkpoint is already AWQ (its config.json's `quantization_config`, here
/// the built-in Qwen2.5-7B's config with AutoAWQ's GEMM layout) is loaded and served as it is:
/// no `CHECKPOINT` stands in for it, and `plan --json` names no other checkpoint to find.
#[test]
fn a_checkpoint_already_quantized_is_loaded_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("Qwen2.5-7B-Instruct-AWQ");
    std::fs::create_dir(&folder).unwrap();
    let catalog =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/catalog/models/qwen2.5-7b.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(catalog).unwrap()).unwrap();
    config["torch_dtype"] = "float16".into();
    config["quantization_config"] = serde_json::json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": true});
    std::fs::write(folder.join("config.json"), config.to_string()).unwrap();
    let model = folder.to_str().unwrap();
    let common = ["--hardware", "a100-80gb", "--mode", "inference", "--quant", "awq", "--seq", "2048"];
    let mut whatif = vec!["whatif", "max-batch", model];
    whatif.extend(common);
    let out = vramplan(&whatif);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains(&format!("from_pretrained({model:?}")), "{}", out.stdout);
    assert!(!out.stdout.contains("CHECKPOINT"), "{}", out.stdout);
    let mut plan = vec!["plan", model, "--engine", "vllm", "--batch", "1"];
    plan.extend(common);
    let out = vramplan(&plan);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains(&format!("vllm serve {model} ")), "{}", out.stdout);
    assert!(!out.stdout.contains("CHECKPOINT"), "{}", out.stdout);
    let mut json = vec!["plan", model, "--batch", "1", "--json"];
    json.extend(common);
    let out = vramplan(&json);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let kwargs = &out.json()["load_kwargs"];
    assert!(kwargs.is_object() && kwargs.get("prequantized").is_none(), "{kwargs}");
}

/// fp8 is quantized while loading onto GPUs (`FineGrainedFP8Config` in the loading line and in
/// `load_kwargs`), but transformers refuses to quantize it on the fly into a map with `cpu` or
/// `disk` entries (`FineGrainedFP8HfQuantizer.validate_environment`, transformers 5.24): such a
/// map takes a checkpoint already in fp8, as AWQ does.
#[test]
fn fp8_maps_quantize_at_load_onto_gpus_and_need_an_fp8_checkpoint_beside_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |model: &str, hardware: &str, file: &str| {
        let path = dir.path().join(file);
        let args = format!(
            "plan {model} --hardware {hardware} --mode inference --quant fp8 --batch 1 --seq 1024 -o {}",
            path.display()
        );
        let argv: Vec<&str> = args.split_whitespace().collect();
        let out = vramplan(&argv);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let mut json: Vec<&str> = argv[..argv.len() - 2].to_vec();
        json.push("--json");
        let kwargs = vramplan(&json).json()["load_kwargs"].clone();
        let map: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        (out.stdout, kwargs, map)
    };
    let (stdout, kwargs, map) = plan("llama-3-8b", "h100-80gb", "gpu.json");
    assert!(map.as_object().unwrap().values().all(|t| t.is_number()), "{map}");
    assert!(
        stdout.contains("quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128))"),
        "{stdout}"
    );
    assert_eq!(kwargs["quantization_config"]["class"], "FineGrainedFP8Config", "{kwargs}");
    let (stdout, kwargs, map) = plan("llama-3.1-70b", "l40s", "host.json");
    assert!(map.as_object().unwrap().values().any(|t| t == "cpu" || t == "disk"), "{map}");
    assert!(!stdout.contains("\n  model = "), "loads the unquantized repository as code: {stdout}");
    assert!(stdout.contains("# checkpoint: ") && stdout.contains("already quantized with FP8"), "{stdout}");
    assert!(kwargs.get("quantization_config").is_none(), "{kwargs}");
    assert!(kwargs["prequantized"].as_str().is_some_and(|p| p.starts_with("FP8")), "{kwargs}");
}
