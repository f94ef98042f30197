//! Every file input is a regular file within its bound (issue 32): a FIFO given as any kind of
//! input file (hardware, workload, device map, plan, `--measured`, `--prices`, `--expert-load`,
//! `--trace`, `--activations`, a script, a model file or a folder's `config.json`, index or
//! shard, a custom model's base) is refused with exit 2 and its path, at once, where opening it
//! would wait for a writer for ever; a file past its kind's bound (docs/limits.md) is refused
//! before it is read. Each case runs the command line as a process of its own, killed after a
//! few seconds, so a hang fails the test instead of stalling it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use vramplan_tests::{Output, vramplan_within, write};

const LLAMA: &str = include_str!("../../profiles/catalog/models/llama-3.2-1b.json");

/// Runs `vramplan ARGS…` as a process; `None` when it had not ended after `limit` (then killed).
fn run_within(args: &[String], limit: Duration) -> Option<Output> {
    vramplan_within(env!("CARGO_BIN_EXE_vramplan-under-test"), args, limit)
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Asserts that `args` ended within a few seconds with exit 2, naming `path` and `what` it is.
fn assert_refused_fast(case: &str, args: &[String], path: &str, what: &str) {
    let Some(out) = run_within(args, Duration::from_secs(20)) else {
        panic!("{case}: `vramplan {}` still running after 20 s", args.join(" "));
    };
    assert_eq!(
        out.code,
        2,
        "{case}: `vramplan {}`\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.stdout,
        out.stderr
    );
    assert!(out.stderr.contains(path), "{case}: the path `{path}` not in:\n{}", out.stderr);
    assert!(out.stderr.contains(what), "{case}: `{what}` not in:\n{}", out.stderr);
    assert!(out.stderr.contains("fix:"), "{case}: no fix in:\n{}", out.stderr);
}

#[test]
fn a_fifo_given_as_any_input_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = |name: &str| {
        let path = d.join(name);
        mkfifo(&path);
        path.display().to_string()
    };
    let svg = d.join("out.svg").display().to_string();
    let plain = ["--hardware", "1xa100-80gb"];
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> {
        head.iter().chain(tail.iter()).map(|s| s.to_string()).collect()
    };

    // Model folders with one FIFO each: the config, the index, a shard, a GGUF file.
    let config_fifo = d.join("config-fifo");
    std::fs::create_dir(&config_fifo).unwrap();
    mkfifo(&config_fifo.join("config.json"));
    let shard_fifo = d.join("shard-fifo");
    std::fs::create_dir(&shard_fifo).unwrap();
    write(&shard_fifo, "config.json", LLAMA);
    mkfifo(&shard_fifo.join("model.safetensors"));
    let index_fifo = d.join("index-fifo");
    std::fs::create_dir(&index_fifo).unwrap();
    write(&index_fifo, "config.json", LLAMA);
    mkfifo(&index_fifo.join("model.safetensors.index.json"));
    let gguf_folder = d.join("gguf-fifo");
    std::fs::create_dir(&gguf_folder).unwrap();
    mkfifo(&gguf_folder.join("model.gguf"));
    let base = fifo("base.json");
    let custom = write(
        d,
        "custom.yaml",
        "extend: base.json\nmodules:\n  - name: model.extra\n    linear: {in: 8, out: 8}\n",
    );

    let cases: Vec<(&str, Vec<String>, String)> = vec![
        (
            "hardware",
            args(&["estimate", "llama-3.2-1b", "--hardware", &fifo("hw.yaml")]),
            d.join("hw.yaml").display().to_string(),
        ),
        (
            "workload",
            with(&["estimate", "llama-3.2-1b", "--workload", &fifo("w.yaml")], &plain),
            String::new(),
        ),
        (
            "device map",
            with(&["estimate", "llama-3.2-1b", "--device-map", &fifo("map.json")], &plain),
            String::new(),
        ),
        ("plan", with(&["estimate", "llama-3.2-1b", "--plan", &fifo("plan.yaml")], &plain), String::new()),
        ("validate plan", args(&["validate", &fifo("vplan.yaml")]), String::new()),
        ("check's map", with(&["check", &fifo("cmap.json"), "llama-3.2-1b"], &plain), String::new()),
        (
            "validate's map",
            with(&["validate", "llama-3.2-1b", "--device-map", &fifo("vmap.json")], &plain),
            String::new(),
        ),
        (
            "validate's workload",
            with(
                &[
                    "validate",
                    "llama-3.2-1b",
                    "--device-map",
                    &write(d, "ok.json", "{\"\": 0}"),
                    "--workload",
                    &fifo("vw.yaml"),
                ],
                &plain,
            ),
            String::new(),
        ),
        (
            "measured",
            with(&["plot", "breakdown", "llama-3.2-1b", "--measured", &fifo("m.json"), "-o", &svg], &plain),
            String::new(),
        ),
        (
            "prices",
            args(&[
                "whatif",
                "cheapest",
                "llama-3.2-1b",
                "--hardware",
                "1xa100-80gb,1xt4",
                "--prices",
                &fifo("p.yaml"),
            ]),
            String::new(),
        ),
        (
            "expert load",
            args(&[
                "plan",
                "mixtral-8x7b",
                "--hardware",
                "8xh100-80gb",
                "--target",
                "expert-parallel",
                "--expert-load",
                &fifo("load.json"),
            ]),
            String::new(),
        ),
        ("trace", args(&["plot", "timeline", "--trace", &fifo("trace.json"), "-o", &svg]), String::new()),
        (
            "activations",
            with(&["estimate", "llama-3.2-1b", "--activations", &fifo("act.json")], &plain),
            String::new(),
        ),
        ("script", with(&["validate", "--script", &fifo("train.py")], &plain), String::new()),
        ("model config file", with(&["estimate", &fifo("model.json")], &plain), String::new()),
        ("custom model file", with(&["estimate", &fifo("model.yaml")], &plain), String::new()),
        ("gguf file", with(&["estimate", &fifo("model.gguf")], &plain), String::new()),
        (
            "folder's config",
            args(&["inspect", &config_fifo.display().to_string()]),
            config_fifo.join("config.json").display().to_string(),
        ),
        (
            "folder's shard",
            args(&["inspect", &shard_fifo.display().to_string()]),
            shard_fifo.join("model.safetensors").display().to_string(),
        ),
        (
            "folder's index",
            args(&["inspect", &index_fifo.display().to_string()]),
            index_fifo.join("model.safetensors.index.json").display().to_string(),
        ),
        (
            "folder's gguf",
            args(&["inspect", &gguf_folder.display().to_string()]),
            gguf_folder.join("model.gguf").display().to_string(),
        ),
        ("custom model's base", args(&["inspect", &custom]), base.clone()),
    ];
    std::thread::scope(|scope| {
        for (case, argv, path) in &cases {
            // The FIFO is the argument that names one, unless the case says which file it is.
            let path = if path.is_empty() {
                argv.iter()
                    .find(|a| Path::new(a).metadata().is_ok_and(|m| !m.is_file() && !m.is_dir()))
                    .cloned()
                    .unwrap()
            } else {
                path.clone()
            };
            scope.spawn(move || assert_refused_fast(case, argv, &path, "is a FIFO (named pipe), not a file"));
        }
    });
}

#[test]
fn a_folder_given_as_an_input_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().display().to_string();
    let argv = args(&["estimate", "llama-3.2-1b", "--hardware", "1xa100-80gb", "--workload", &folder]);
    assert_refused_fast("workload folder", &argv, &folder, "is a folder, not a file");
}

#[test]
fn a_file_past_its_kinds_bound_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // Sparse files: their length is past the bound, nothing is written.
    let sized = |name: &str, len: u64| {
        let path = dir.path().join(name);
        std::fs::File::create(&path).unwrap().set_len(len).unwrap();
        path.display().to_string()
    };
    let workload = sized("w.yaml", (1 << 20) + 1);
    let argv = args(&["estimate", "llama-3.2-1b", "--hardware", "1xa100-80gb", "--workload", &workload]);
    assert_refused_fast(
        "workload",
        &argv,
        &workload,
        "more than the 1048576 bytes read of a workload YAML file",
    );
    let config = sized("config.json", (64 << 20) + 1);
    let argv = args(&["inspect", &config]);
    assert_refused_fast(
        "config.json",
        &argv,
        &config,
        "more than the 67108864 bytes read of a model's JSON file",
    );
    let hardware = sized("hw.yaml", (16 << 20) + 1);
    let argv = args(&["estimate", "llama-3.2-1b", "--hardware", &hardware]);
    assert_refused_fast("hardware", &argv, &hardware, "more than the 16777216 bytes");
}
