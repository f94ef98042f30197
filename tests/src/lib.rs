//! Helpers shared by the integration tests: running the command line in-process as a user would,
//! and finding the reference data kept in the repository (`fixtures/published`).

pub mod hub_server;

use std::path::PathBuf;

/// What one run of the command line produced.
#[derive(Debug)]
pub struct Output {
    /// The exit code: 0 it fits, 1 it does not, 2 bad input.
    pub code: i32,
    /// Everything written to standard output (the table, or the JSON with `--json`).
    pub stdout: String,
    /// Everything written to standard error (errors with their fix, warnings).
    pub stderr: String,
}

impl Output {
    /// Parses stdout as one JSON document (what `--json` promises).
    pub fn json(&self) -> serde_json::Value {
        match serde_json::from_str(&self.stdout) {
            Ok(value) => value,
            Err(e) => {
                panic!("stdout is not one JSON document ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr)
            }
        }
    }
}

/// Runs `vramplan ARGS…` in-process.
pub fn vramplan(args: &[&str]) -> Output {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let argv = std::iter::once("vramplan").chain(args.iter().copied());
    let code = vramplan::run(argv, &mut stdout, &mut stderr);
    Output {
        code,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// `fixtures/published`: copies of public configs, checkpoint indexes and measured figures.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/published")
}

/// A folder of `fixtures/published/models`, as a string argument.
pub fn shared_model(folder: &str) -> String {
    shared_dir().join("models").join(folder).display().to_string()
}

/// Writes `text` to `dir/name` and returns the path as an argument.
pub fn write(dir: &std::path::Path, name: &str, text: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write temp file");
    path.display().to_string()
}

/// [`assert_bad_input`] whose message also gives the fix (a `fix:` line).
pub fn assert_refused(out: &Output, needles: &[&str]) {
    assert_bad_input(out, needles);
    assert!(out.stderr.contains("fix:"), "no fix in:\n{}", out.stderr);
}

/// Bad input as the contract has it: exit code 2, nothing on stdout, and every needle (the
/// file, line or key, what was expected) in the message on stderr.
pub fn assert_bad_input(out: &Output, needles: &[&str]) {
    assert_eq!(out.code, 2, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stdout.is_empty(), "nothing on stdout for bad input: {}", out.stdout);
    for needle in needles {
        assert!(out.stderr.contains(needle), "expected `{needle}` in:\n{}", out.stderr);
    }
}

/// Runs `vramplan ARGS…` as a process of its own (the `vramplan-under-test` binary, offline from
/// the Hub, stdin closed), killed after `limit`: `None` when it had not ended by then. For tests
/// of what must end, where a hang in-process would stall the suite. Its stdout and stderr are
/// read as it writes them (threads of their own), so output past a pipe's buffer (64 KiB) does
/// not stall it.
pub fn vramplan_within(bin: &str, args: &[String], limit: std::time::Duration) -> Option<Output> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("HF_HUB_OFFLINE", "1")
        .spawn()
        .expect("start vramplan-under-test");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(Output {
                code: status.code().unwrap_or(-1),
                stdout: stdout.join().expect("read stdout"),
                stderr: stderr.join().expect("read stderr"),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The address-space cap, in KiB (`ulimit -v`), under which the bounded-resource tests run
/// each command: 4 GB.
pub const ADDRESS_CAP_KIB: u64 = 4_000_000;

/// A hardware profile at the documented bounds (docs/limits.md): 4 nodes of 1,024 H100s.
pub const BOUNDS_PROFILE_YAML: &str = "name: bounds\ndescription: \"4 nodes of 1,024 GPUs, the documented bound\"\nnodes:\n  - count: 4\n    \
     devices:\n      - gpu: h100-80gb\n        count: 1024\ninter_node_link: {kind: infiniband, bandwidth: 50GB/s}\n";

/// [`vramplan_within`] under the address-space cap [`ADDRESS_CAP_KIB`] (`ulimit -v` through
/// `sh -c`): `bin ARGS…`, killed after `limit`, `None` when it had not ended by then.
pub fn vramplan_capped<S: AsRef<str>>(bin: &str, args: &[S], limit: std::time::Duration) -> Option<Output> {
    let mut line: Vec<String> =
        vec!["-c".into(), format!("ulimit -v {ADDRESS_CAP_KIB} && exec \"$0\" \"$@\""), bin.into()];
    line.extend(args.iter().map(|a| a.as_ref().to_string()));
    vramplan_within("sh", &line, limit)
}
