//! The real binary as a separate process: exit codes reach the shell, and `--json` puts exactly
//! one JSON document on stdout.

use std::process::Command;

fn vramplan(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vramplan")).args(args).output().expect("run the vramplan binary")
}

#[test]
fn json_on_stdout_and_zero_exit() {
    let out = vramplan(&["inspect", "pythia-2.8b", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(json["params"], 2_775_208_960u64);
    assert!(out.stderr.is_empty());
}

#[test]
fn bad_input_exits_with_code_two() {
    let out = vramplan(&["inspect", "/no/such/config.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: /no/such/config.json"));
}

#[test]
fn help_exits_zero() {
    let out = vramplan(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("inspect"));
}
