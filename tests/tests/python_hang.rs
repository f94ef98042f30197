//! A Python that never answers (issue 32): `validate PLAN --backend torch --python P` and
//! `validate --script` with such a Python end at `--time-limit` with an error that says so
//! (exit 3: the run could not be made), the Python and all it started stopped, where the torch
//! backend used to wait for ever.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use vramplan_tests::{vramplan, vramplan_within, write};

/// A "python" that starts a child and sleeps for ten minutes, answering nothing.
fn hanging_python(dir: &Path) -> String {
    let path = write(dir, "python", "#!/bin/sh\necho starting >&2\nsleep 600 &\nsleep 600\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn run(args: &[&str]) -> vramplan_tests::Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let start = Instant::now();
    let out = vramplan_within(env!("CARGO_BIN_EXE_vramplan-under-test"), &args, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("`vramplan {}` still running after 30 s", args.join(" ")));
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    out
}

#[test]
fn the_torch_backend_stops_a_python_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    let python = hanging_python(dir.path());
    let plan = dir.path().join("plan.yaml").display().to_string();
    let made = vramplan(&["plan", "llama-3.2-1b", "--hardware", "1xa100-80gb", "-o", &plan]);
    assert_eq!(made.code, 0, "{}", made.stderr);
    let out = run(&["validate", &plan, "--backend", "torch", "--python", &python, "--time-limit", "2"]);
    assert_eq!(out.code, 3, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    for needle in [python.as_str(), "did not answer within the time limit of 2 s", "starting"] {
        assert!(out.stderr.contains(needle), "`{needle}` not in:\n{}", out.stderr);
    }
}

#[test]
fn a_script_run_stops_a_python_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    let python = hanging_python(dir.path());
    let script = write(dir.path(), "train.py", "print('never run')\n");
    let out = run(&[
        "validate",
        "--script",
        &script,
        "--hardware",
        "1xa100-80gb",
        "--python",
        &python,
        "--time-limit",
        "2",
    ]);
    assert_ne!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("time limit of 2 s") || out.stdout.contains("time limit of 2 s"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn a_time_limit_where_no_python_runs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.yaml").display().to_string();
    let made = vramplan(&["plan", "llama-3.2-1b", "--hardware", "1xa100-80gb", "-o", &plan]);
    assert_eq!(made.code, 0, "{}", made.stderr);
    let out = vramplan(&["validate", &plan, "--time-limit", "5"]);
    vramplan_tests::assert_refused(&out, &["--time-limit", "--backend torch"]);
}
