//! A workload run by a program other than transformers/TRL (`--trainer` torchtune, Unsloth,
//! LitGPT or fsdp_qlora; AutoAWQ's fused runtime under `--awq-fused`) gets no transformers/TRL
//! code to paste: that code would run another program than the one the estimate models, and
//! the other program's own lines were never run against it (`tests/tests/pasteable.rs` holds
//! every printed code line to one recorded from the real library). `whatif` prints comments
//! only, in that program's terms; `plan --format deepspeed|fsdp|torchrun`, which write the HF
//! Trainer's launch files, refuse such a workload at the key `trainer`; `plan --json` gives
//! `load_kwargs: null` and `loaded_by` (the program and why) in place of `from_pretrained`'s
//! arguments.

use vramplan_tests::vramplan;

/// The lines under `to run it:` (indented by two spaces), as printed.
fn run_lines(stdout: &str) -> Vec<String> {
    let Some((_, rest)) = stdout.split_once("\nto run it:\n") else { return Vec::new() };
    rest.lines().map_while(|l| l.strip_prefix("  ")).map(str::to_string).collect()
}

/// What only transformers/TRL code holds.
const TRANSFORMERS_CODE: [&str; 6] =
    ["SFTConfig(", "from_pretrained(", "LoraConfig(", "TrainingArguments(", "import ", "torchrun "];

/// `(name, arguments, the program's name in the comment, a setting written from the flags)`.
const CASES: [(&str, &str, &str, &str); 5] = [
    (
        "torchtune",
        "whatif max-batch llama-3.2-1b --hardware a100-80gb --mode train --lora-rank 8 --seq 512 --trainer torchtune",
        "torchtune",
        "tokenizer.max_seq_len=512",
    ),
    (
        "unsloth",
        "whatif max-batch llama-3.2-1b --hardware a100-80gb --mode train --quant nf4 --lora-rank 8 --seq 512 \
         --trainer unsloth",
        "Unsloth",
        "max_seq_length=512",
    ),
    (
        "litgpt",
        "whatif max-batch llama-3.2-1b --hardware a100-80gb --mode train --quant nf4 --lora-rank 8 --seq 512 \
         --trainer litgpt --optimizer paged-adamw",
        "LitGPT",
        "--train.max_seq_length 512",
    ),
    (
        "fsdp-qlora",
        "whatif max-batch llama-3.2-1b --hardware 2xrtx3090 --mode train --quant nf4 --lora-rank 8 --seq 512 \
         --trainer fsdp-qlora --parallel fsdp",
        "fsdp_qlora",
        "--context_length 512",
    ),
    (
        "awq-fused",
        "whatif max-batch mistral-7b --hardware a100-80gb --mode inference --seq 512 --dtype fp16 --quant awq \
         --awq-fused 512",
        "AutoAWQ",
        "max_seq_len=512",
    ),
];

#[test]
fn another_program_gets_comments_and_no_transformers_code() {
    let mut failures = Vec::new();
    for (name, args, program, setting) in CASES {
        let argv: Vec<&str> = args.split_whitespace().collect();
        let out = vramplan(&argv);
        if out.code != 0 {
            failures.push(format!("{name}: exit {}: {}", out.code, out.stderr));
            continue;
        }
        let lines = run_lines(&out.stdout);
        if lines.is_empty() {
            failures.push(format!("{name}: no lines to run:\n{}", out.stdout));
        }
        for line in lines.iter().filter(|l| !l.starts_with("# ")) {
            failures.push(format!("{name}: a line that is not a comment: {line}"));
        }
        for line in &lines {
            if let Some(code) = TRANSFORMERS_CODE.iter().find(|c| line.starts_with(*c)) {
                failures.push(format!("{name}: transformers/TRL code ({code}): {line}"));
            }
        }
        let run = lines.iter().find(|l| l.starts_with(&format!("# {program} run: ")));
        match run {
            Some(line) if line.contains(setting) => {}
            Some(line) => failures.push(format!("{name}: `{setting}` missing from: {line}")),
            None => failures.push(format!("{name}: no `# {program} run:` line in {lines:#?}")),
        }
        if !lines.iter().any(|l| {
            l.contains("vramplan prints runnable code for transformers/TRL, vLLM, SGLang and llama.cpp only")
        }) {
            failures.push(format!("{name}: the note that no code is printed is missing: {lines:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same workloads under the HF Trainer still get its code: the check above sees the lines
/// it looks for where they are printed.
#[test]
fn the_hf_trainer_still_gets_its_code() {
    let argv: Vec<&str> =
        "whatif max-batch llama-3.2-1b --hardware a100-80gb --mode train --quant nf4 --lora-rank 8 --seq 512"
            .split_whitespace()
            .collect();
    let out = vramplan(&argv);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines = run_lines(&out.stdout);
    for code in ["from_pretrained(", "LoraConfig(", "SFTConfig("] {
        assert!(lines.iter().any(|l| l.contains(code) && !l.starts_with('#')), "{code} missing: {lines:#?}");
    }
    assert!(!lines.iter().any(|l| l.contains(" run: ")), "{lines:#?}");
}

#[test]
fn hf_trainer_launch_exports_refuse_another_trainer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "fsdp",
            "plan llama-2-7b --hardware 2xrtx3090 --mode train --quant nf4 --lora-rank 8 --trainer fsdp-qlora --parallel fsdp",
            "fsdp-qlora",
        ),
        (
            "deepspeed",
            "plan llama-2-7b --hardware 2xrtx3090 --mode train --quant nf4 --lora-rank 8 --trainer fsdp-qlora --parallel fsdp",
            "fsdp-qlora",
        ),
        (
            "torchrun",
            "plan llama-3.2-1b --hardware 2xrtx3090 --mode train --lora-rank 8 --trainer torchtune --parallel ddp",
            "torchtune",
        ),
    ];
    for (format, args, trainer) in cases {
        let file = dir.path().join(format!("launch.{format}"));
        let file = file.display().to_string();
        let mut argv: Vec<&str> = args.split_whitespace().collect();
        argv.extend(["--format", format, "-o", &file]);
        let out = vramplan(&argv);
        assert_eq!(out.code, 2, "{format}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("key `trainer`"), "{format}: {}", out.stderr);
        assert!(out.stderr.contains(&format!("--trainer {trainer}")), "{format}: {}", out.stderr);
        assert!(!std::path::Path::new(&file).exists(), "{format}: {file} written");
    }
    // The HF Trainer's own plan writes the accelerate config.
    let file = dir.path().join("hf.yaml").display().to_string();
    let mut argv: Vec<&str> =
        "plan llama-2-7b --hardware 2xrtx3090 --mode train --quant nf4 --lora-rank 8 --parallel fsdp --format fsdp -o"
            .split_whitespace()
            .collect();
    argv.push(&file);
    let out = vramplan(&argv);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(std::fs::read_to_string(&file).expect("written").contains("distributed_type: FSDP"));
}

/// `plan -o MAP` under another program prints no transformers loading call for the map.
#[test]
fn a_map_for_another_program_gets_no_transformers_loading_call() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "torchtune",
            "plan llama-3.2-1b --hardware 2xt4 --mode train --lora-rank 8 --seq 512 --trainer torchtune",
        ),
        (
            "AutoAWQ",
            "plan mistral-7b --hardware t4 --mode inference --seq 512 --dtype fp16 --quant awq --awq-fused 512",
        ),
    ];
    for (program, args) in cases {
        let file = dir.path().join(format!("{program}.json")).display().to_string();
        let mut argv: Vec<&str> = args.split_whitespace().collect();
        argv.extend(["-o", &file]);
        let out = vramplan(&argv);
        assert_eq!(out.code, 0, "{program}: {}{}", out.stdout, out.stderr);
        // No "load it as it is": there is no transformers call to load it with.
        assert!(!out.stdout.contains("load it as it is"), "{program}: {}", out.stdout);
        let Some((_, rest)) = out.stdout.split_once(&format!("wrote {file}:")) else {
            panic!("{program}: no loading lines:\n{}", out.stdout)
        };
        let lines: Vec<&str> = rest.lines().skip(1).map_while(|l| l.strip_prefix("  ")).collect();
        assert!(!lines.is_empty(), "{program}: {}", out.stdout);
        assert!(lines.iter().all(|l| l.starts_with("# ")), "{program}: {lines:#?}");
        assert!(lines.iter().any(|l| l.starts_with(&format!("# {program} run: "))), "{program}: {lines:#?}");
    }
}

/// `plan --json` under another program gives no transformers arguments: `load_kwargs` is `null`
/// and `loaded_by` names the program and why, where the HF Trainer's plan of the same map gives
/// `load_kwargs` (an object) and no `loaded_by`. A plan with no map (FSDP) gives neither.
#[test]
fn plan_json_under_another_program_names_it_and_gives_no_load_kwargs() {
    let cases = [
        (
            "torchtune",
            "plan llama-3.2-1b --hardware 2xt4 --mode train --lora-rank 8 --seq 512 --trainer torchtune",
        ),
        (
            "unsloth",
            "plan llama-3.2-1b --hardware t4 --mode train --quant nf4 --lora-rank 8 --seq 512 --trainer unsloth",
        ),
        (
            "litgpt",
            "plan llama-3.2-1b --hardware t4 --mode train --quant nf4 --lora-rank 8 --seq 512 --trainer litgpt \
             --optimizer paged-adamw",
        ),
        (
            "fsdp-qlora",
            "plan llama-3.2-1b --hardware t4 --mode train --quant nf4 --lora-rank 8 --seq 512 --trainer fsdp-qlora",
        ),
        (
            "AutoAWQ",
            "plan mistral-7b --hardware t4 --mode inference --seq 512 --dtype fp16 --quant awq --awq-fused 512",
        ),
    ];
    for (program, args) in cases {
        let mut argv: Vec<&str> = args.split_whitespace().collect();
        argv.push("--json");
        let out = vramplan(&argv);
        assert_eq!(out.code, 0, "{program}: {}{}", out.stdout, out.stderr);
        let json = out.json();
        assert!(json.get("load_kwargs").is_some_and(|v| v.is_null()), "{program}: {json:#}");
        assert_eq!(json["loaded_by"]["program"], program, "{program}");
        let reason = json["loaded_by"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("loads the model itself"), "{program}: {reason}");
    }
    // The HF Trainer's plan of the same map: transformers' arguments, no other program.
    let argv: Vec<&str> =
        "plan llama-3.2-1b --hardware t4 --mode train --quant nf4 --lora-rank 8 --seq 512 --json"
            .split_whitespace()
            .collect();
    let out = vramplan(&argv);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let json = out.json();
    assert_eq!(json["load_kwargs"]["quantization_config"]["class"], "BitsAndBytesConfig", "{json:#}");
    assert!(json.get("loaded_by").is_none(), "{json:#}");
    // No map to load (FSDP shards as it loads): neither field.
    let argv: Vec<&str> =
        "plan llama-2-7b --hardware 2xrtx3090 --mode train --quant nf4 --lora-rank 8 --trainer fsdp-qlora --parallel fsdp --json"
            .split_whitespace()
            .collect();
    let out = vramplan(&argv);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let json = out.json();
    assert!(json.get("load_kwargs").is_none() && json.get("loaded_by").is_none(), "{json:#}");
}
