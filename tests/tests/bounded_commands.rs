//! Every subcommand bounded (issue 32, "Must show"): each subcommand (`inspect`, `profiles`,
//! `estimate`, `plan`, `check`, every `whatif` question, `validate`, every `plot` kind, `report`)
//! run with inputs at the documented bounds (docs/limits.md: a hardware profile of 4 nodes ×
//! 1,024 GPUs, a config at every size bound, a custom model of 2¹⁸ modules, the largest batch and
//! the most tokens in a step, a grid of 10,000 points) as a process of its own under a 4 GB
//! address-space cap (`ulimit -v`) and a 30 s wall-clock limit. Each must end within them with the
//! answer the input calls for: an out-of-memory abort (the cap) or a kill (the limit) fails it.
//!
//! The commands run one at a time (a lock), so one's time is not another's. `whatif frontier`,
//! `whatif grid` and `plot grid` at the bounds run into their time limit: the default (60 s) is
//! past this test's 30 s, so they are given `--time-limit 20` and must stop there with what they
//! have (exit 4) or finish. `plan` of the models at the bounds on 4 × 1,024 GPUs is given
//! `--time-limit 20` too, and answers within seconds: a whole chain is placed by its partitions
//! with no MIP model built (`solver/src/ilp/whole_chain.rs`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vramplan_tests::{BOUNDS_PROFILE_YAML, Output, vramplan_capped, write};

/// The wall-clock limit of one command.
const LIMIT: Duration = Duration::from_secs(30);

/// Held while a command runs: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The inputs at the bounds, written to a temporary folder.
struct Bounds {
    dir: tempfile::TempDir,
    /// A hardware profile of 4 nodes × 1,024 H100s (4,096 devices, the profile bound).
    profile: String,
    /// A model folder whose `config.json` is at every size bound: 1,024 layers, width 65,536,
    /// feed-forward 262,144, 4,096 heads, a vocabulary and positions of 2²⁴.
    config: String,
    /// A custom model of 1,024 blocks of 250 experts each: some 258,000 modules, next to the
    /// bound of 2¹⁸ = 262,144 (`repeat` at most 4,096).
    custom: String,
}

impl Bounds {
    fn new() -> Bounds {
        let dir = tempfile::tempdir().unwrap();
        let profile = write(dir.path(), "bounds.yaml", BOUNDS_PROFILE_YAML);
        let base = include_str!("../../profiles/catalog/models/llama-3.2-1b.json");
        let mut config: serde_json::Map<String, serde_json::Value> = serde_json::from_str(base).unwrap();
        for (key, value) in [
            ("num_hidden_layers", 1024),
            ("hidden_size", 65_536),
            ("intermediate_size", 262_144),
            ("num_attention_heads", 4_096),
            ("num_key_value_heads", 4_096),
            ("head_dim", 16),
            ("vocab_size", 16_777_216),
            ("max_position_embeddings", 16_777_216),
        ] {
            config.insert(key.into(), value.into());
        }
        let folder = dir.path().join("bounds-model");
        std::fs::create_dir(&folder).unwrap();
        write(&folder, "config.json", serde_json::to_string(&config).unwrap());
        let custom = write(
            dir.path(),
            "modules.yaml",
            "name: module-bound\ndtype: bf16\nhidden_size: 64\nattention_heads: 4\nmodules:\n  \
             - name: embed\n    embedding: {count: 1000, dim: 64}\n  - name: layers\n    repeat: 1024\n    \
             modules:\n      - name: experts\n        repeat: 250\n        linear: {in: 64, out: 64}\n  \
             - name: head\n    linear: {in: 64, out: 1000}\n",
        );
        Bounds { profile, config: folder.display().to_string(), custom, dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn out(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

/// A grid at the bound of 10,000 points (100 batches × 100 lengths).
const GRID_AXES: [&str; 4] = ["--batch", "1..100+1", "--seq", "10..1000+10"];

/// Runs `vramplan ARGS…` under the cap and the limit, and asserts it ended with one of `codes`
/// and, for bad input, an error with its fix.
fn bounded(case: &str, args: &[&str], codes: &[i32]) -> Output {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let Some(out) = vramplan_capped(env!("CARGO_BIN_EXE_vramplan-under-test"), args, LIMIT) else {
        panic!("{case}: `vramplan {}` still running after {LIMIT:?}", args.join(" "));
    };
    let took = started.elapsed();
    assert!(
        codes.contains(&out.code),
        "{case}: `vramplan {}` exit {} after {took:?} (expected {codes:?}; -1 is a signal, the cap's abort)\n\
         stdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.code,
        out.stdout.chars().take(2000).collect::<String>(),
        out.stderr.chars().take(4000).collect::<String>(),
    );
    assert!(!out.stderr.contains("panicked"), "{case}: {}", out.stderr);
    if out.code == 2 {
        assert!(out.stderr.contains("error:") && out.stderr.contains("fix:"), "{case}: {}", out.stderr);
    }
    println!("{case}: exit {} in {:.2} s", out.code, took.as_secs_f64());
    out
}

#[test]
fn inspect_and_profiles_at_the_bounds() {
    let b = Bounds::new();
    let out = bounded("inspect the config at every size bound", &["inspect", &b.config, "--json"], &[0]);
    assert_eq!(out.json()["layers"], 1024, "{}", out.stdout);
    let out = bounded("inspect a custom model of 2^18 modules", &["inspect", &b.custom, "--json"], &[0]);
    // 1,024 × 250 linears of 64 × 64, an embedding and a head of 1,000 × 64.
    assert_eq!(out.json()["params"], 1024 * 250 * 64 * 64 + 2 * 1000 * 64, "{}", out.stdout);
    let out = bounded("profiles show the 4 x 1,024 profile", &["profiles", "show", &b.profile], &[0]);
    assert!(out.stdout.contains("count: 1024"), "{}", out.stdout);
    bounded("profiles", &["profiles"], &[0]);
}

#[test]
fn estimate_at_the_bounds() {
    let b = Bounds::new();
    let p = b.profile.as_str();
    // Each of the model's 1,024 layers is 128 GiB of bf16: no GPU holds one, exit 1.
    bounded(
        "estimate the config at the bounds",
        &["estimate", &b.config, "--hardware", p, "--seq", "4096"],
        &[1],
    );
    // 2^20 sequences of 4,096 tokens: 2^32 tokens in one step, the bound on a step.
    bounded(
        "estimate at the most tokens in a step",
        &["estimate", "llama-3.2-1b", "--hardware", p, "--batch", "1048576", "--seq", "4096"],
        &[1],
    );
    // The same step on the model at the bounds forms past 2^60 bytes: refused (docs/limits.md).
    let out = bounded(
        "estimate past 2^60 bytes",
        &["estimate", &b.config, "--hardware", p, "--batch", "1048576", "--seq", "4096"],
        &[2],
    );
    assert!(out.stderr.contains("2⁶⁰"), "{}", out.stderr);
    bounded(
        "estimate a custom model of 2^18 modules, training",
        &["estimate", &b.custom, "--hardware", p, "--mode", "train"],
        &[0],
    );
}

#[test]
fn plan_check_and_validate_at_the_bounds() {
    let b = Bounds::new();
    let p = b.profile.as_str();
    let plan = b.out("plan.yaml");
    let map = b.out("map.json");
    bounded("plan gpt2 on 4 x 1,024 GPUs", &["plan", "gpt2", "--hardware", p, "-o", &plan], &[0]);
    bounded("plan gpt2 on 4 x 1,024 GPUs, a map", &["plan", "gpt2", "--hardware", p, "-o", &map], &[0]);
    bounded("check the plan's map", &["check", &map, "gpt2", "--hardware", p], &[0]);
    bounded("validate the plan, cpu backend", &["validate", &plan, "--backend", "cpu"], &[0]);
    // The config at the bounds with its 1,024 layers over 1,024 of the GPUs: a layer is more than
    // a GPU holds, exit 1.
    let mut entries: Vec<String> = (0..1024).map(|i| format!("\"model.layers.{i}\": {}", 4 * i)).collect();
    entries
        .extend(["\"model.embed_tokens\": 0", "\"model.norm\": 4095", "\"lm_head\": 4095"].map(String::from));
    let big_map = write(b.dir.path(), "bounds-map.json", format!("{{{}}}", entries.join(", ")));
    bounded(
        "check a map of 1,024 layers on 4,096 GPUs",
        &["check", &big_map, &b.config, "--hardware", p],
        &[1],
    );
}

/// The largest models on the largest profile: a plan must answer within its time limit. The
/// config at the bounds does not fit (a layer is more than a GPU holds: exit 1); the custom
/// model of 2¹⁸ modules fits, one unit per GPU over 1,026 of them. Both ran past 60 s before a
/// whole chain was answered by its partitions alone (the custom model with 8.2 GB of MIP model
/// for 1,026 units × 4,096 GPUs, the config scanning 1,028 splits between GPUs and hosts that
/// no partition could have).
#[test]
fn plan_of_models_at_the_bounds_on_the_largest_profile() {
    let b = Bounds::new();
    let p = b.profile.as_str();
    bounded(
        "plan the config at the bounds on 4 x 1,024 GPUs",
        &["plan", &b.config, "--hardware", p, "--time-limit", "20"],
        &[1],
    );
    let out = bounded(
        "plan a custom model of 2^18 modules on 4 x 1,024 GPUs",
        &["plan", &b.custom, "--hardware", p, "--time-limit", "20", "--json"],
        &[0],
    );
    // The embedding, 1,024 blocks and the head: each alone on a GPU is the least utilisation.
    let gpus = out.json()["devices"].as_array().map_or(0, |d| d.len());
    assert_eq!(gpus, 1026, "{}", out.stdout.chars().take(2000).collect::<String>());
}

#[test]
fn whatif_each_question_at_the_bounds() {
    let b = Bounds::new();
    let p = b.profile.as_str();
    for query in ["max-batch", "max-seq", "max-concurrency", "min-gpus", "best-quant"] {
        bounded(
            &format!("whatif {query} on 4 x 1,024 GPUs"),
            &["whatif", query, "gpt2", "--hardware", p],
            &[0],
        );
    }
    bounded("whatif cheapest over every profile", &["whatif", "cheapest", "gpt2", "--hardware", "all"], &[0]);
    bounded(
        "whatif frontier on 4 x 1,024 GPUs",
        &["whatif", "frontier", "gpt2", "--hardware", p, "--time-limit", "20"],
        &[0, 4],
    );
    let out = bounded(
        "whatif grid of 10,000 points on 4 x 1,024 GPUs",
        &[&["whatif", "grid", "gpt2", "--hardware", p][..], &GRID_AXES, &["--time-limit", "20"]].concat(),
        &[0, 4],
    );
    assert!(!out.stdout.is_empty(), "a grid cut short still prints what it has");
}

#[test]
fn plot_each_kind_and_report_at_the_bounds() {
    let b = Bounds::new();
    let p = b.profile.as_str();
    for kind in ["breakdown", "timeline", "plan"] {
        let svg = b.out(&format!("{kind}.svg"));
        bounded(
            &format!("plot {kind} on 4 x 1,024 GPUs"),
            &["plot", kind, "gpt2", "--hardware", p, "-o", &svg],
            &[0],
        );
        assert!(Path::new(&svg).exists(), "{svg}");
    }
    let svg = b.out("sweep.svg");
    bounded(
        "plot sweep on 4 x 1,024 GPUs",
        &["plot", "sweep", "gpt2", "--hardware", p, "--batch", "1..1024", "-o", &svg],
        &[0],
    );
    // The grid bound, 10,000 points, on one GPU (on 4 × 1,024, the test below).
    let svg = b.out("grid.svg");
    bounded(
        "plot grid of 10,000 points on one H100",
        &[&["plot", "grid", "gpt2", "--hardware", "1xh100-80gb"][..], &GRID_AXES, &["-o", &svg]].concat(),
        &[0],
    );
    for name in ["report.md", "report.html"] {
        let file = b.out(name);
        bounded(
            &format!("report {name} on 4 x 1,024 GPUs"),
            &["report", "gpt2", "--hardware", p, "-o", &file],
            &[0],
        );
        assert!(Path::new(&file).exists(), "{file}");
    }
}

/// `plot grid` at the bounds must stop at its time limit as `whatif grid` does (exit 4 at 20 s).
/// `plot grid` bounds its points' plans by `--time-limit` (`api/src/plot.rs`, `whatif_inputs`):
/// this grid of 10,000 points on 4 × 1,024 GPUs ran past 60 s before it did; the points not
/// answered by then are drawn as such (`?`).
#[test]
fn plot_grid_at_the_bounds_stops_at_its_time_limit() {
    let b = Bounds::new();
    let p = b.profile.as_str();
    let svg = b.out("grid.svg");
    bounded(
        "plot grid of 10,000 points on 4 x 1,024 GPUs",
        &[&["plot", "grid", "gpt2", "--hardware", p][..], &GRID_AXES, &["--time-limit", "20", "-o", &svg]]
            .concat(),
        &[0, 4],
    );
}
