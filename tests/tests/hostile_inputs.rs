//! Hostile inputs (issue 32, "Must show"): a seeded property test that writes random malformed
//! files of every input kind (hardware YAML, workload YAML, device map, plan file, `--measured`,
//! `--prices`, `--expert-load`, a custom model, a model folder's `config.json` and safetensors
//! shard, a GGUF file) and random flag values, and runs each case through the real binary as a
//! process of its own (under a 4 GB address-space cap, killed after 15 s).
//!
//! The malformed files start from valid ones (written by the command line itself or kept in the
//! repository) and are truncated, emptied, given a duplicated key, a value of the wrong type, a
//! huge or negative number, a deeply nested value, a very long string, control characters,
//! flipped bytes or garbage, or replaced by a FIFO or a folder. Every case must end within the
//! limit, without a panic, with an exit code of 0 to 4, an exit 2 carrying an `error:` line and
//! its `fix:`, and no raw escape character on the terminal. Where the docs say an input is refused
//! (a FIFO or folder, `docs/limits.md`; a truncated or nested-past-the-parser JSON document; a
//! YAML key given twice, `docs/workloads.md`; an expert-load layer or a safetensors tensor given
//! twice; a flag past its documented bound), the case must be refused with exit 2.
//!
//! `VRAMPLAN_HOSTILE_CASES` sets the number of cases (default 300, a minute or two on two
//! cores) and `VRAMPLAN_HOSTILE_SEED` the seed; `ten_thousand_hostile_cases` (ignored by
//! default) runs 10,000. Case `i` draws from its own generator seeded with `seed + i`, so a failing
//! case is replayed alone with `VRAMPLAN_HOSTILE_SEED=seed+i VRAMPLAN_HOSTILE_CASES=1`.

mod hostile;

use hostile::{
    Bases, Case, KINDS, Kind, Rng, base_data_len, command, draw, repo, safetensors_file, safetensors_header,
};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use vramplan_tests::{Output, vramplan, vramplan_capped};

/// The most one case may take.
const LIMIT: Duration = Duration::from_secs(15);

/// The seed when `VRAMPLAN_HOSTILE_SEED` is not set.
const DEFAULT_SEED: u64 = 0x5EED_0032;

/// `vramplan ARGS…` under the address-space cap, killed after [`LIMIT`].
fn run_capped(args: &[String]) -> Option<Output> {
    vramplan_capped(env!("CARGO_BIN_EXE_vramplan-under-test"), args, LIMIT)
}

/// The counts over a run.
#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    by_code: [usize; 5],
    panics: usize,
    hangs: usize,
    other_codes: usize,
    exit_2_without_fix: usize,
    refused_cases: usize,
    exit_0_on_refused: usize,
    not_refused: usize,
    raw_escapes: usize,
    failing: usize,
    failures: Vec<String>,
    /// The longest case, and which.
    slowest: (Duration, u64),
}

/// Checks one case's outcome, counting it in `tally`.
fn judge(case: &Case, index: u64, seed: u64, out: Option<Output>, tally: &mut Tally) {
    tally.cases += 1;
    tally.refused_cases += case.refused as usize;
    let replay = format!(
        "case {index} (seed {}) {}: vramplan {}",
        seed.wrapping_add(index),
        case.what,
        case.args.join(" ")
    );
    let fail = |tally: &mut Tally, problem: String| {
        tally.failing += 1;
        if tally.failures.len() < 200 {
            tally.failures.push(format!("{replay}\n  {problem}"));
        }
    };
    let Some(out) = out else {
        tally.hangs += 1;
        return fail(tally, format!("still running after {LIMIT:?}"));
    };
    let tail = |s: &str| s.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect::<String>();
    if out.code == 101 || out.stderr.contains("panicked") {
        tally.panics += 1;
        return fail(tally, format!("panicked (exit {}):\n{}", out.code, tail(&out.stderr)));
    }
    if !(0..=4).contains(&out.code) {
        tally.other_codes += 1;
        return fail(
            tally,
            format!("exit {} (killed by a signal when -1):\n{}", out.code, tail(&out.stderr)),
        );
    }
    tally.by_code[out.code as usize] += 1;
    // A usage error clap finds (an unknown flag, a value that does not parse) ends with its own
    // pointer to the fix, `try '--help'`; the rest with a `fix:` line.
    let fix = out.stderr.contains("fix:") || out.stderr.contains("For more information, try '--help'");
    if out.code == 2 && !(out.stderr.contains("error:") && fix) {
        tally.exit_2_without_fix += 1;
        fail(tally, format!("exit 2 without `error:` and `fix:`:\n{}", tail(&out.stderr)));
    }
    if out.stdout.contains('\x1b') || out.stderr.contains('\x1b') {
        tally.raw_escapes += 1;
        fail(tally, "a raw escape character reached the terminal".into());
    }
    if case.refused && out.code != 2 {
        if out.code == 0 {
            tally.exit_0_on_refused += 1;
        } else {
            tally.not_refused += 1;
        }
        fail(tally, format!("the docs refuse this input, but exit {}:\n{}", out.code, tail(&out.stderr)));
    }
}

/// Runs `cases` cases from `seed` over a few worker threads, and returns the tally.
fn run_cases(cases: u64, seed: u64) -> (Tally, Duration) {
    let root = tempfile::tempdir().unwrap();
    let bases = Bases::new(root.path());
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed) as u64;
                    if index >= cases {
                        break;
                    }
                    let dir = root.path().join(format!("case-{index}"));
                    std::fs::create_dir_all(&dir).unwrap();
                    let case = draw(index, seed, &bases, &dir);
                    let started = Instant::now();
                    let out = run_capped(&case.args);
                    let took = started.elapsed();
                    let _ = std::fs::remove_dir_all(&dir);
                    let mut tally = tally.lock().unwrap();
                    tally.slowest = tally.slowest.max((took, index));
                    judge(&case, index, seed, out, &mut tally);
                }
            });
        }
    });
    (tally.into_inner().unwrap(), started.elapsed())
}

/// Runs the cases and asserts none failed, printing the counts.
fn assert_hostile_cases_hold(cases: u64) {
    let seed =
        std::env::var("VRAMPLAN_HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_SEED);
    let (tally, took) = run_cases(cases, seed);
    println!(
        "hostile inputs: {} cases from seed {seed} in {:.1} s: exit 0/1/2/3/4 {:?}; {} panics, {} hangs, \
         {} other exit codes, {} exits 2 without a fix, {} raw escapes; {} inputs the docs refuse: \
         {} exits 0, {} other exits; slowest case {} in {:.2} s",
        tally.cases,
        took.as_secs_f64(),
        tally.by_code,
        tally.panics,
        tally.hangs,
        tally.other_codes,
        tally.exit_2_without_fix,
        tally.raw_escapes,
        tally.refused_cases,
        tally.exit_0_on_refused,
        tally.not_refused,
        tally.slowest.1,
        tally.slowest.0.as_secs_f64(),
    );
    assert_eq!(tally.cases as u64, cases);
    assert!(
        tally.failures.is_empty(),
        "{} failing cases (first 200):\n{}",
        tally.failing,
        tally.failures.join("\n")
    );
    // The mix reaches every outcome: refusals, and cases that still plan.
    assert!(tally.by_code[2] > 0 && (cases < 100 || tally.by_code[0] > 0), "{:?}", tally.by_code);
}

/// The cases `VRAMPLAN_HOSTILE_CASES` asks for, 300 by default.
#[test]
fn hostile_inputs_end_without_panic_and_refuse_what_the_docs_refuse() {
    let cases = std::env::var("VRAMPLAN_HOSTILE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    assert_hostile_cases_hold(cases);
}

/// The seeded run of 10,000 cases (`cargo test -p vramplan-tests --test hostile_inputs
/// -- --ignored`).
#[test]
#[ignore = "10,000 cases: run on demand"]
fn ten_thousand_hostile_cases() {
    assert_hostile_cases_hold(10_000);
}

/// Every base file is accepted as it is (exit 0), so each mutation starts from a valid input and
/// what it breaks is the mutation's.
#[test]
fn the_unmutated_bases_are_accepted() {
    let root = tempfile::tempdir().unwrap();
    let bases = Bases::new(root.path());
    let mut rng = Rng(1);
    for kind in KINDS.into_iter().filter(|k| *k != Kind::Flags) {
        for _ in 0..2 {
            let dir = root.path().join(format!("{kind:?}"));
            let _ = std::fs::remove_dir_all(&dir);
            let holder =
                if matches!(kind, Kind::Config | Kind::Shard) { dir.join("model") } else { dir.clone() };
            std::fs::create_dir_all(&holder).unwrap();
            let path = holder.join(kind.file_name());
            let bytes = match kind {
                Kind::Gguf => bases.gguf.clone(),
                Kind::Shard => safetensors_file(bases.header.as_bytes(), base_data_len(&bases.header)),
                _ => bases.text(kind).as_bytes().to_vec(),
            };
            std::fs::write(&path, bytes).unwrap();
            let args = command(kind, &path.display().to_string(), &dir, &mut rng);
            let out = run_capped(&args).unwrap_or_else(|| panic!("{kind:?}: still running"));
            assert_eq!(out.code, 0, "{kind:?}: vramplan {}\n{}", args.join(" "), out.stderr);
        }
    }
}

/// The generator is SplitMix64: its first outputs from seed 0 are the published ones (the
/// reference implementation's `next()` from `x = 0`).
#[test]
fn the_generator_is_splitmix64() {
    let mut rng = Rng(0);
    assert_eq!(rng.next(), 0xE220_A839_7B1D_CDAF);
    assert_eq!(rng.next(), 0x6E78_9E6A_A1B9_65F4);
}

/// Regression (found by the cases above): a `config.json` that is not JSON, not an object or
/// holds a value of the wrong type, a safetensors header entry that is malformed and an index
/// that is not an object were refused with exit 2 but without a fix.
#[test]
fn malformed_model_files_are_refused_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(repo("profiles/catalog/models/llama-3.2-1b.json")).unwrap();
    let typed = config.replacen("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1.5", 1);
    assert_ne!(typed, config, "the base config names tie_word_embeddings");
    for (name, text, says) in [
        ("empty", String::new(), "malformed JSON"),
        ("list", "[1]".to_string(), "expected a JSON object"),
        ("huge", config.replacen("\"hidden_size\": 2048", "\"hidden_size\": 1e400", 1), "malformed JSON"),
        ("typed", typed, "tie_word_embeddings"),
    ] {
        let folder = dir.path().join(name);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("config.json"), text).unwrap();
        let out = vramplan(&["inspect", &folder.display().to_string()]);
        vramplan_tests::assert_refused(&out, &["config.json", says]);
    }
    let header = safetensors_header().replacen("\"shape\":[16]", "\"shape\":[-1]", 1);
    let folder = dir.path().join("shard");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("model.safetensors"),
        safetensors_file(header.as_bytes(), base_data_len(&header)),
    )
    .unwrap();
    let out = vramplan(&["inspect", &folder.display().to_string()]);
    vramplan_tests::assert_refused(&out, &["model.safetensors", "`shape` must be a list"]);
    let folder = dir.path().join("index");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("config.json"), &config).unwrap();
    std::fs::write(folder.join("model.safetensors.index.json"), "[]").unwrap();
    let out = vramplan(&["inspect", &folder.display().to_string()]);
    vramplan_tests::assert_refused(&out, &["model.safetensors.index.json", "expected a JSON object"]);
}

/// Regression (found by the 10,000-case run): a custom model's size that is not positive
/// (`intermediate_size: 0`, or -2⁶³) was refused with its line but without a fix.
#[test]
fn a_custom_size_that_is_not_positive_is_refused_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(repo("docs/examples/timeseries-transformer.yaml")).unwrap();
    for value in ["0", "-9223372036854775808"] {
        let text = base.replacen("intermediate_size: 512", &format!("intermediate_size: {value}"), 1);
        assert_ne!(text, base, "the example names intermediate_size");
        let path = vramplan_tests::write(dir.path(), "custom.yaml", text);
        let out = vramplan(&["inspect", &path]);
        vramplan_tests::assert_refused(
            &out,
            &["custom.yaml:", "`intermediate_size` must be a positive integer"],
        );
    }
}
