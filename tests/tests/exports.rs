//! Every runnable export `plan -o` writes is one the real tool accepted:
//! `fixtures/reference/exports/v5.json` holds, for 18 plans over vLLM, SGLang, DeepSpeed, FSDP
//! (accelerate) and torchrun, every file the export wrote and what the tool's own parser made of
//! each (`scripts/reference/exports.py`: vLLM's `make_arg_parser`, SGLang's
//! `ServerArgs.add_cli_args`, DeepSpeed's `DeepSpeedConfig`, accelerate's config loader and
//! `accelerate launch`'s validation, torchrun's `get_args_parser`, `bash -n`), checked against
//! values written by hand from each plan's flags. The plans must write exactly the recorded
//! files, and every recorded verdict must be an acceptance.

use serde_json::Value;
use vramplan_tests::vramplan;

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/exports/v5.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON")
}

#[test]
fn every_export_is_written_as_the_real_parser_accepted_it() {
    let data = fixture();
    let records = data["records"].as_array().expect("records");
    assert!(records.len() >= 12, "{} plans", records.len());
    let mut failures = Vec::new();
    for record in records {
        let name = record["name"].as_str().expect("name");
        assert!(record.get("error").is_none(), "{name}: recorded without an export: {}", record["error"]);
        let dir = tempfile::tempdir().expect("temp dir");
        let file = record["file"].as_str().expect("file");
        let out = dir.path().join(file);
        let mut args: Vec<String> = vec!["plan".into()];
        args.extend(
            record["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("arg").to_string()),
        );
        args.push("-o".into());
        args.push(out.display().to_string());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = vramplan(&argv);
        if run.code != 0 {
            failures.push(format!("{name}: exit {}: {}", run.code, run.stderr));
            continue;
        }
        let recorded = record["files"].as_object().expect("files");
        let mut written: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        written.sort();
        let mut names: Vec<String> = recorded.keys().cloned().collect();
        names.sort();
        if written != names {
            failures.push(format!("{name}: wrote {written:?}, recorded {names:?}"));
            continue;
        }
        for (fname, text) in recorded {
            let now = std::fs::read_to_string(dir.path().join(fname)).expect("written file");
            if now != text.as_str().expect("text") {
                failures.push(format!(
                    "{name}: {fname} differs from the recorded one (run scripts/reference/run exports):\n{now}"
                ));
            }
        }
        let verdicts = record["verdicts"].as_array().expect("verdicts");
        // Every file was parsed: each script by bash and its lines by their tool, each config by
        // its tool.
        for fname in recorded.keys() {
            if !verdicts.iter().any(|v| v["where"].as_str().is_some_and(|w| w.starts_with(fname.as_str()))) {
                failures.push(format!("{name}: {fname} has no verdict"));
            }
        }
        for v in verdicts {
            if v["accepted"] != Value::Bool(true) {
                failures.push(format!("{name}: {} refused {}: {}", v["tool"], v["where"], v));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every engine and launcher was parsed by its own tool, at a recorded version.
#[test]
fn the_four_engines_and_torchrun_each_parsed_some_export() {
    let data = fixture();
    let versions = &data["versions"];
    for tool in ["vllm", "sglang", "deepspeed", "accelerate", "torch"] {
        let v = versions[tool].as_str().unwrap_or("");
        assert!(!v.is_empty() && !v.starts_with("unavailable"), "{tool}: {v}");
    }
    let tools: std::collections::BTreeSet<&str> = data["records"]
        .as_array()
        .expect("records")
        .iter()
        .flat_map(|r| r["verdicts"].as_array().into_iter().flatten())
        .filter_map(|v| v["tool"].as_str())
        .collect();
    for tool in
        ["vllm", "sglang", "deepspeed", "accelerate config", "accelerate launch", "torchrun", "bash -n"]
    {
        assert!(tools.contains(tool), "no export parsed by {tool}: {tools:?}");
    }
    // The checks can fail: each tool refused an export with one value broken.
    let controls = data["controls"].as_array().expect("controls");
    for tool in ["vllm", "sglang", "deepspeed", "accelerate config", "torchrun", "bash -n"] {
        assert!(controls.iter().any(|c| c["tool"] == tool), "no control for {tool}");
    }
    for c in controls {
        assert_eq!(c["refused"], Value::Bool(true), "a broken export was accepted: {c}");
    }
}

/// Where an export does not apply to the plan, it is refused with the reason and the fix
/// (exit 2), and nothing is written.
#[test]
fn an_export_that_does_not_apply_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&[&str], &str, &str); 5] = [
        (
            &[
                "llama-3.2-1b",
                "--hardware",
                "a100-80gb-x4",
                "--mode",
                "train",
                "--parallel",
                "ddp",
                "--format",
                "vllm",
            ],
            "a.sh",
            "trains",
        ),
        (
            &[
                "llama-3.2-1b",
                "--hardware",
                "a100-80gb",
                "--mode",
                "inference",
                "--engine",
                "vllm",
                "--gpu-memory-utilization",
                "0.8",
                "--format",
                "fsdp",
            ],
            "a.yaml",
            "serves",
        ),
        (
            &["llama-3.2-1b", "--hardware", "a100-80gb", "--mode", "inference", "--format", "vllm"],
            "a.sh",
            "--engine vllm",
        ),
        (
            &[
                "llama-3.2-1b",
                "--hardware",
                "a100-80gb-x4",
                "--mode",
                "train",
                "--parallel",
                "zero1",
                "--format",
                "fsdp",
            ],
            "a.yaml",
            "ZeRO-1",
        ),
        (
            &[
                "llama-3.2-1b",
                "--hardware",
                "a100-80gb-x4",
                "--mode",
                "train",
                "--parallel",
                "zero2",
                "--format",
                "torchrun",
            ],
            "a.sh",
            "deepspeed",
        ),
    ];
    for (args, file, says) in cases {
        let out = dir.path().join(file);
        let out = out.display().to_string();
        let mut argv = vec!["plan"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["-o", &out]);
        let run = vramplan(&argv);
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
        assert!(!std::path::Path::new(&out).exists(), "{args:?} wrote {out}");
    }
}

/// A `.sh` name picks the workload's launch only where there is one: a llama.cpp plan's flags
/// stay llama.cpp's, a DDP training plan's are torchrun's.
#[test]
fn a_script_name_picks_the_workloads_launch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&[&str], &str); 2] = [
        (
            &[
                "llama-3.2-1b",
                "--hardware",
                "t4",
                "--target",
                "llama.cpp",
                "--engine",
                "llama.cpp",
                "--quant",
                "Q4_K_M",
            ],
            "-ngl ",
        ),
        (
            &["llama-3.2-1b", "--hardware", "a100-80gb-x4", "--mode", "train", "--parallel", "ddp"],
            "torchrun ",
        ),
    ];
    for (args, says) in cases {
        let out = dir.path().join("run.sh").display().to_string();
        let mut argv = vec!["plan"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["-o", &out]);
        let run = vramplan(&argv);
        assert_eq!(run.code, 0, "{args:?}: {}{}", run.stdout, run.stderr);
        let text = std::fs::read_to_string(&out).expect("written");
        assert!(text.lines().any(|l| l.starts_with(says)), "{args:?}:\n{text}");
    }
}

/// The commands of a recorded script, as `exports.py`'s `command_lines` reads them: the one line,
/// or each node's line of the `case`.
fn command_lines(script: &str) -> Vec<String> {
    let skip = ["#", ":", "set ", "case ", "esac", "*)"];
    script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !skip.iter().any(|s| l.starts_with(s)))
        .map(|l| {
            let l = match l.split_once(") ") {
                Some((rank, rest)) if rank.chars().all(|c| c.is_ascii_digit()) => rest,
                _ => l,
            };
            l.strip_suffix(";;").unwrap_or(l).trim_end().to_string()
        })
        .collect()
}

/// A 70B on two nodes of 8 H100s: `plan` prints each node's command, the very lines of the
/// recorded script that vLLM's parser accepted (tensor parallel 8 × pipeline parallel 2, node 1
/// headless) and, for DDP training on the same nodes, each node's torchrun line that torchrun's
/// parser accepted.
#[test]
fn a_two_node_plan_prints_each_nodes_command_as_recorded() {
    let data = fixture();
    let records = data["records"].as_array().expect("records");
    let record = |name: &str| records.iter().find(|r| r["name"] == name).expect("a record").clone();
    let vllm = record("vllm-70b-2-nodes");
    let args: Vec<String> =
        vllm["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("arg").to_string()).collect();
    assert!(args.iter().any(|a| a == "h100-80gb-x8-n2") && args.iter().any(|a| a == "tp=8,pp=2"), "{args:?}");
    let script = vllm["files"]["serve.sh"].as_str().expect("the script");
    let lines = command_lines(script);
    assert_eq!(lines.len(), 2, "{script}");
    assert!(lines[0].contains("--tensor-parallel-size 8 --pipeline-parallel-size 2"), "{}", lines[0]);
    assert!(lines[1].ends_with("--node-rank 1 --headless"), "{}", lines[1]);
    let mut argv = vec!["plan"];
    argv.extend(args.iter().map(String::as_str));
    let run = vramplan(&argv);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.starts_with("plan for vLLM (tensor parallel 8 × pipeline parallel 2, 16 GPUs): fits"),
        "{}",
        run.stdout
    );
    for (node, line) in lines.iter().enumerate() {
        assert!(run.stdout.contains(&format!("  node {node}: {line}\n")), "node {node}:\n{}", run.stdout);
    }

    let ddp = [
        "llama-3.2-1b",
        "--hardware",
        "h100-80gb-x8-n2",
        "--mode",
        "train",
        "--dtype",
        "bf16",
        "--grad-ckpt",
        "full",
        "--parallel",
        "ddp",
        "--batch",
        "8",
        "--seq",
        "2048",
    ];
    let mut argv = vec!["plan"];
    argv.extend(ddp);
    let run = vramplan(&argv);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    // The 4-node record's lines with two nodes: the same flags, `--nnodes 2`.
    let four = record("torchrun-ddp-4-nodes");
    let recorded = command_lines(
        four["files"].as_object().expect("files").values().next().and_then(Value::as_str).expect("script"),
    );
    for (node, line) in recorded.iter().take(2).enumerate() {
        let line = line.replace("--nnodes 4", "--nnodes 2");
        assert!(
            run.stdout.contains(&format!("  node {node}: {line}\n")),
            "node {node}: {line}\n{}",
            run.stdout
        );
    }
    assert!(!run.stdout.contains("node 2:"), "{}", run.stdout);
}

/// Under `--quant awq|gptq` the engine reads the method from a pre-quantized checkpoint, so the
/// script serves `${CHECKPOINT:?…}`, never the model's own repository (unquantized weights):
/// run by bash with a stand-in `vllm` on the PATH, it stops with the message while CHECKPOINT
/// is unset and serves the named checkpoint once it is set.
#[test]
fn a_prequantized_export_serves_the_checkpoint_the_user_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("serve.sh");
    let run = vramplan(&[
        "plan",
        "mistral-7b",
        "--hardware",
        "a100-80gb",
        "--mode",
        "inference",
        "--engine",
        "vllm",
        "--quant",
        "awq",
        "--batch",
        "1",
        "--seq",
        "2048",
        "-o",
        script.to_str().expect("path"),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        !run.stdout.contains("vllm serve mistralai/"),
        "the printed line serves the base repository:\n{}",
        run.stdout
    );
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    let stub = bin.join("vllm");
    std::fs::write(&stub, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").expect("stub");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let unset = std::process::Command::new("bash")
        .arg(&script)
        .env("PATH", &path)
        .env_remove("CHECKPOINT")
        .output()
        .expect("bash");
    let stderr = String::from_utf8_lossy(&unset.stderr);
    assert!(!unset.status.success(), "ran without a checkpoint");
    assert!(
        stderr.contains("set CHECKPOINT to") && stderr.contains("already quantized with AWQ"),
        "{stderr}"
    );
    let set = std::process::Command::new("bash")
        .arg(&script)
        .env("PATH", &path)
        .env("CHECKPOINT", "TheBloke/Mistral-7B-v0.1-AWQ")
        .output()
        .expect("bash");
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let argv: Vec<String> = String::from_utf8_lossy(&set.stdout).lines().map(str::to_string).collect();
    assert_eq!(argv.first().map(String::as_str), Some("serve"));
    assert_eq!(argv.get(1).map(String::as_str), Some("TheBloke/Mistral-7B-v0.1-AWQ"));
    assert!(argv.windows(2).any(|w| w == ["--quantization", "awq"]), "{argv:?}");
}
