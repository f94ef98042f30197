//! Every line vramplan prints for a user to paste runs as printed: `fixtures/reference/pasteable`
//! holds, for 22 cases (LoRA over all linear layers and over named ones, QLoRA and 8-bit LoRA,
//! full fine-tunes, an encoder, an encoder-decoder, XLNet, a custom model, DDP, inference,
//! vLLM, llama.cpp, and `plan -o` maps with offload, over GPUs, for an encoder and a custom
//! model), the lines as printed and what running them with the real transformers, PEFT, TRL and
//! accelerate did (`scripts/reference/pasteable.py`: objects built, PEFT wrapped, nothing
//! trained; `torchrun` through its own parser). The command line must print exactly the lines
//! that were run, and every one of them ran.

use serde_json::Value;
use vramplan_tests::vramplan;

/// The lines a user pastes: the Python block and the shell commands, indented by two spaces
/// (what the recorder takes).
fn pasteable(stdout: &str) -> Vec<String> {
    const STARTS: [&str; 9] = [
        "import ",
        "from ",
        "model = ",
        "peft_config = ",
        "args = ",
        "# ",
        "vllm serve ",
        "llama-server ",
        "torchrun ",
    ];
    stdout
        .lines()
        .filter_map(|line| line.strip_prefix("  "))
        .filter(|line| {
            STARTS.iter().any(|s| line.starts_with(s))
                && (!line.starts_with("from ") || line.contains(" import "))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_line_printed_to_paste_is_one_that_ran() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/pasteable/v5.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
    let records = data["records"].as_array().expect("records");
    assert!(records.len() >= 20, "{} cases", records.len());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("root");
    let mut failures = Vec::new();
    for record in records {
        let name = record["name"].as_str().expect("name");
        let dir = tempfile::tempdir().expect("temp dir");
        let map = dir.path().join("device_map.json");
        // The map `plan -o` writes goes to a folder of the test's own; paths of the repository's
        // examples are relative to its root.
        let args: Vec<String> = record["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| {
                let a = a.as_str().expect("arg").replace("@MAP@", &map.display().to_string());
                if a.starts_with("docs/examples/") { root.join(&a).display().to_string() } else { a }
            })
            .collect();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = vramplan(&argv);
        let prefix = format!("{}/", dir.path().display());
        let lines: Vec<String> = pasteable(&out.stdout).iter().map(|l| l.replace(&prefix, "")).collect();
        let recorded: Vec<String> = record["lines"]
            .as_array()
            .expect("lines")
            .iter()
            .map(|l| l.as_str().expect("line").to_string())
            .collect();
        if lines != recorded {
            failures.push(format!(
                "{name}: the lines differ from those that ran; rerun `scripts/reference/run pasteable`\n  now: {lines:#?}\n  ran: {recorded:#?}"
            ));
        }
        if record["python"].is_object() && record["python"]["ran"] != true {
            failures.push(format!("{name}: the Python lines did not run: {}", record["python"]["error"]));
        }
        for shell in record["shell"].as_array().expect("shell") {
            if !shell["error"].is_null() {
                failures.push(format!("{name}: `{}`: {}", shell["line"], shell["error"]));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
