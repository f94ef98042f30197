//! A model named by its Hugging Face Hub id, against a local server that answers as the Hub does
//! (`vramplan_tests::hub_server`): the command line runs as a process of its own, with the
//! `HF_*` variables a user would set, so nothing here reaches the network.
//!
//! What is checked against what: a Hub id's `inspect`, `estimate` and `plan` against the same
//! model read from a local folder holding the same files (the folder reader is checked against
//! published checkpoints elsewhere); the bytes read against the server's own count; the cache
//! against `huggingface_hub`'s layout (`file_download.py`), written by hand for a full download.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramplan_tests::Output;
use vramplan_tests::hub_server::{
    Content, HubServer, Repo, checkpoint_files, checkpoint_files_named, write_folder,
};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const OTHER_COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";
const GATE_TOKEN: &str = "hf_test_granted";

/// Every variable `huggingface_hub` reads, cleared so the caller's own never leak in.
const HF_VARS: [&str; 12] = [
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HUB_DOWNLOAD_TIMEOUT",
    "XDG_CACHE_HOME",
    "HTTP_PROXY",
];

/// Runs the command line as a process with `env` (and nothing else of the Hub's), killed after
/// `limit`.
fn run_with(env: &[(&str, &str)], args: &[&str], limit: Duration) -> (Output, Duration) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vramplan-under-test"));
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for var in HF_VARS.iter().chain(&["HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]) {
        command.env_remove(var);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("start vramplan-under-test");
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code().unwrap_or(-1);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`vramplan {}` ran past {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    (Output { code, stdout: out.join().unwrap(), stderr: err.join().unwrap() }, elapsed)
}

fn run(env: &[(&str, &str)], args: &[&str]) -> Output {
    run_with(env, args, Duration::from_secs(120)).0
}

/// The repositories the server holds.
fn repos() -> BTreeMap<String, Repo> {
    let mut repos = BTreeMap::new();
    repos.insert("test-org/qwen-single".into(), Repo::new(COMMIT, checkpoint_files("qwen2.5-0.5b", 1)));
    repos.insert("test-org/llama-sharded".into(), Repo::new(COMMIT, checkpoint_files("llama-3.2-1b", 3)));
    repos.insert("meta-llama/Llama-3.1-70B".into(), Repo::new(COMMIT, checkpoint_files("llama-3.1-70b", 30)));
    let mut gated = Repo::new(COMMIT, checkpoint_files("qwen2.5-0.5b", 2));
    gated.gated_token = Some(GATE_TOKEN.into());
    repos.insert("gated-org/model".into(), gated);
    let mut revisions = Repo::new(COMMIT, checkpoint_files("qwen2.5-0.5b", 1));
    revisions.add_revision("v2", OTHER_COMMIT, checkpoint_files("qwen2.5-1.5b", 2));
    repos.insert("test-org/revisions".into(), revisions);
    repos.insert("test-org/busy".into(), Repo::new(COMMIT, checkpoint_files("qwen2.5-0.5b", 1)));
    // As published: 4.51's names (`visual.…`, `model.layers.…`), five shards, the processor's
    // config beside the model's.
    let published = |path: &str| {
        path.strip_prefix("model.visual.")
            .map(|rest| format!("visual.{rest}"))
            .or_else(|| path.strip_prefix("model.language_model.").map(|rest| format!("model.{rest}")))
            .unwrap_or_else(|| path.to_string())
    };
    // A repository of GGUF files as llama.cpp's users find them: two quantizations (one split in
    // three) and a projector (files written by the `gguf` package, fixtures/reference/gguf).
    let gguf = |name: &str| {
        let path = format!("{}/../fixtures/reference/gguf/{name}", env!("CARGO_MANIFEST_DIR"));
        Content::Bytes(std::fs::read(path).expect("a GGUF fixture"))
    };
    let mut gguf_files = BTreeMap::new();
    gguf_files.insert("tiny-llama-Q4_K_M.gguf".to_string(), gguf("tiny-llama-q4_k_m.gguf"));
    for part in
        ["tiny-split-00001-of-00003.gguf", "tiny-split-00002-of-00003.gguf", "tiny-split-00003-of-00003.gguf"]
    {
        gguf_files.insert(format!("Q8/{}", part.replace("tiny-split", "tiny-llama-Q8_0")), gguf(part));
    }
    gguf_files.insert("mmproj-tiny-f16.gguf".to_string(), gguf("mmproj-tiny.gguf"));
    repos.insert("test-org/tiny-GGUF".into(), Repo::new(COMMIT, gguf_files));
    // As published: the LLaVA layout (`language_model.model.…`, `vision_tower.…`).
    let llava = |path: &str| {
        path.strip_prefix("model.language_model.")
            .map(|rest| format!("language_model.model.{rest}"))
            .or_else(|| path.strip_prefix("model.vision_tower.").map(|rest| format!("vision_tower.{rest}")))
            .or_else(|| {
                path.strip_prefix("model.multi_modal_projector.")
                    .map(|rest| format!("multi_modal_projector.{rest}"))
            })
            .unwrap_or_else(|| path.to_string())
    };
    repos.insert(
        "google/gemma-3-4b-it".into(),
        Repo::new(COMMIT, checkpoint_files_named("gemma-3-4b-it", 2, llava)),
    );
    repos.insert(
        "Qwen/Qwen2.5-VL-7B-Instruct".into(),
        Repo::new(COMMIT, checkpoint_files_named("qwen2.5-vl-7b-instruct", 5, published)),
    );
    repos
}

/// A temporary `HF_HOME` and the variables pointing at it and at `endpoint`.
struct Home {
    dir: tempfile::TempDir,
    endpoint: String,
}

impl Home {
    fn new(endpoint: &str) -> Home {
        Home { dir: tempfile::tempdir().expect("temp HF_HOME"), endpoint: endpoint.to_string() }
    }

    fn path(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn run(&self, extra: &[(&str, &str)], args: &[&str]) -> Output {
        let home = self.path();
        let mut env = vec![("HF_HOME", home.as_str()), ("HF_ENDPOINT", self.endpoint.as_str())];
        env.extend_from_slice(extra);
        run(&env, args)
    }

    fn repo_cache(&self, repo: &str) -> std::path::PathBuf {
        self.dir.path().join("hub").join(format!("models--{}", repo.replace('/', "--")))
    }
}

/// The `N` of `--verbose`'s `hub: R requests, N bytes read`.
fn bytes_read(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(" bytes read"))
        .unwrap_or_else(|| panic!("no totals in:\n{stderr}"));
    let before = line.split(" bytes read").next().unwrap_or("");
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in `{line}`"))
}

/// The `R` of `--verbose`'s `hub: R requests`.
fn requests(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(" requests, "))
        .unwrap_or_else(|| panic!("no totals in:\n{stderr}"));
    let count = line.trim_start_matches("hub: ").split(' ').next().unwrap_or("");
    count.parse().unwrap_or_else(|_| panic!("no request count in `{line}`"))
}

/// An endpoint where nothing listens.
fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn assert_ok(out: &Output) {
    assert_eq!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
}

/// The JSON of `args` with `model` in the place of `{}`: for the Hub id, then for a folder
/// holding the repository's files (its path written as the Hub id, the one intended difference).
fn same_for_hub_and_folder(home: &Home, repo: &str, files: &BTreeMap<String, Content>, args: &[&str]) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join(repo.replace('/', "_"));
    std::fs::create_dir_all(&path).unwrap();
    write_folder(&path, files);
    let path = path.display().to_string();
    let with = |model: &str| -> Vec<String> {
        args.iter().map(|a| if *a == "{}" { model.to_string() } else { a.to_string() }).collect()
    };
    let (hub_args, local_args) = (with(repo), with(&path));
    let hub = home.run(&[], &hub_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&hub);
    let local = home.run(&[], &local_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_ok(&local);
    let local_text = local.stdout.replace(&path, repo);
    let (mut hub_json, mut local_json): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(&hub.stdout).unwrap(), serde_json::from_str(&local_text).unwrap());
    // The solver's time is the one figure that differs between two runs of anything.
    without_seconds(&mut hub_json);
    without_seconds(&mut local_json);
    assert_eq!(hub_json, local_json, "`{}` differs between the Hub id and the folder", args.join(" "));
}

fn without_seconds(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove("seconds");
            map.values_mut().for_each(without_seconds);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(without_seconds),
        _ => {}
    }
}

#[test]
fn hub_ids_read_as_the_same_files_in_a_folder() {
    let repos = repos();
    let server = HubServer::start(repos.clone());
    let home = Home::new(&server.endpoint());
    for repo in ["test-org/qwen-single", "test-org/llama-sharded"] {
        let files = &repos[repo].commits[COMMIT];
        same_for_hub_and_folder(&home, repo, files, &["inspect", "{}", "--json"]);
        same_for_hub_and_folder(&home, repo, files, &["estimate", "{}", "--hardware", "t4", "--json"]);
        same_for_hub_and_folder(&home, repo, files, &["plan", "{}", "--hardware", "2xt4", "--json"]);
    }
    // The other commands that read a model take it the same way.
    let map = tempfile::tempdir().unwrap();
    let map = vramplan_tests::write(map.path(), "map.json", r#"{"": 0}"#);
    let files = &repos["test-org/llama-sharded"].commits[COMMIT];
    let repo = "test-org/llama-sharded";
    same_for_hub_and_folder(&home, repo, files, &["check", &map, "{}", "--hardware", "t4", "--json"]);
    same_for_hub_and_folder(&home, repo, files, &["whatif", "max-batch", "{}", "--hardware", "t4", "--json"]);
    let out = home.run(&[], &["inspect", "test-org/llama-sharded", "--json"]);
    assert_eq!(out.json()["name"], "test-org/llama-sharded", "the model's name is the Hub id");
}

#[test]
fn a_70b_checkpoint_in_30_shards_is_read_in_under_a_mebibyte() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    let out = home.run(&[], &["inspect", "meta-llama/Llama-3.1-70B", "--json", "--verbose"]);
    assert_ok(&out);
    let client = bytes_read(&out.stderr);
    let served = server.body_bytes();
    assert!(served < 1 << 20, "the server sent {served} bytes");
    assert_eq!(client, served, "the client counts what the server sent:\n{}", out.stderr);
    let lines = |needle: &str| out.stderr.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(lines("/resolve/"), 33, "config, generation config, index, 30 shards:\n{}", out.stderr);
    assert_eq!(lines(" -> 302"), 30, "each shard's resolve URL redirects:\n{}", out.stderr);
    assert_eq!(lines("/cdn/"), 30, "each redirect followed:\n{}", out.stderr);
    assert_eq!(lines(" bytes=0-16383 -> 206"), 30, "one range read per shard:\n{}", out.stderr);
    assert!(!out.stderr.contains("signature"), "signed URLs are not printed");
    // The same parameters as the published config gives (70.55 B, the model card's 70B).
    let builtin = run(&[], &["inspect", "llama-3.1-70b", "--json"]);
    assert_eq!(out.json()["params"], builtin.json()["params"]);
    // A second run reads nothing but the revision.
    let again = home.run(&[], &["inspect", "meta-llama/Llama-3.1-70B", "--json", "--verbose"]);
    assert_ok(&again);
    assert_eq!(requests(&again.stderr), 1, "{}", again.stderr);
}

#[test]
fn the_cache_is_laid_out_as_huggingface_hub_lays_it() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    assert_ok(&home.run(&[], &["inspect", "test-org/llama-sharded"]));
    let root = home.repo_cache("test-org/llama-sharded");
    assert_eq!(std::fs::read_to_string(root.join("refs/main")).unwrap(), COMMIT);
    let snapshot = root.join("snapshots").join(COMMIT);
    for file in ["config.json", "generation_config.json", "model.safetensors.index.json"] {
        let pointer = snapshot.join(file);
        #[cfg(unix)]
        {
            let target = std::fs::read_link(&pointer).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(target.starts_with("../../blobs"), "{file} -> {}", target.display());
        }
        assert!(pointer.is_file(), "{file}");
    }
    let headers = root.join("vramplan-headers").join(COMMIT);
    for shard in 1..=3 {
        let name = format!("model-{shard:05}-of-00003.safetensors");
        assert!(headers.join(&name).is_file(), "{name}'s header");
        assert!(!snapshot.join(&name).exists(), "a header is not a whole file: not in snapshots/");
    }
    let blobs = std::fs::read_dir(root.join("blobs")).unwrap().count();
    assert_eq!(blobs, 3, "only the whole files are blobs");
}

#[test]
fn gated_repos_need_a_token_with_access() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    let out = home.run(&[], &["inspect", "gated-org/model"]);
    vramplan_tests::assert_refused(
        &out,
        &["gated-org/model", "gated", "request access", "HF_TOKEN", "hf auth login"],
    );
    let out = home.run(&[("HF_TOKEN", "hf_someone_else")], &["inspect", "gated-org/model"]);
    vramplan_tests::assert_refused(&out, &["gated-org/model", "has no access", "HF_TOKEN"]);
    assert_ok(&home.run(&[("HF_TOKEN", GATE_TOKEN)], &["inspect", "gated-org/model"]));
    // The token file `hf auth login` writes works the same.
    std::fs::write(home.dir.path().join("token"), format!("{GATE_TOKEN}\n")).unwrap();
    let other = Home { dir: tempfile::tempdir().unwrap(), endpoint: home.endpoint.clone() };
    let token_path = home.dir.path().join("token").display().to_string();
    assert_ok(&other.run(&[("HF_TOKEN_PATH", &token_path)], &["inspect", "gated-org/model"]));
}

#[test]
fn offline_reads_a_warm_cache_and_says_what_a_cold_one_lacks() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    let online = home.run(&[], &["inspect", "test-org/llama-sharded", "--json"]);
    assert_ok(&online);
    let dead = dead_endpoint();
    let offline = home.run(
        &[("HF_HUB_OFFLINE", "1"), ("HF_ENDPOINT", &dead)],
        &["inspect", "test-org/llama-sharded", "--json", "-v"],
    );
    assert_ok(&offline);
    assert_eq!(offline.stdout, online.stdout);
    assert_eq!(requests(&offline.stderr), 0, "{}", offline.stderr);
    let cold = Home::new(&server.endpoint());
    let served = server.requests();
    let out = cold.run(&[("HF_HUB_OFFLINE", "true")], &["inspect", "test-org/llama-sharded"]);
    vramplan_tests::assert_refused(
        &out,
        &["offline", "HF_HUB_OFFLINE", "refs/main", "test-org/llama-sharded"],
    );
    assert_eq!(server.requests(), served, "offline asks the server nothing");
}

#[test]
fn a_full_download_by_huggingface_hub_is_read_from_the_cache() {
    let repos = repos();
    let files = &repos["test-org/qwen-single"].commits[COMMIT];
    let home = Home::new(&dead_endpoint());
    // As `hf_hub_download` leaves it: blobs named by ETag, snapshot entries as relative symlinks,
    // refs/main naming the commit; the safetensors file whole (sparse here).
    let root = home.repo_cache("test-org/qwen-single");
    let snapshot = root.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    for (i, (name, content)) in files.iter().enumerate() {
        let etag = format!("{i:040x}");
        write_folder(&root.join("blobs"), &BTreeMap::from([(etag.clone(), content.clone())]));
        link(&Path::new("../../blobs").join(&etag), &snapshot.join(name), &root.join("blobs").join(&etag));
    }
    let out = home.run(&[("HF_HUB_OFFLINE", "1")], &["inspect", "test-org/qwen-single", "--json", "-v"]);
    assert_ok(&out);
    assert_eq!(requests(&out.stderr), 0, "{}", out.stderr);
    assert!(!root.join("vramplan-headers").exists(), "headers of whole files are read from them");
    let folder = tempfile::tempdir().unwrap();
    write_folder(folder.path(), files);
    let local = home.run(&[], &["inspect", &folder.path().display().to_string(), "--json"]);
    assert_eq!(out.json()["params"], local.json()["params"]);
    assert_eq!(out.json()["bytes"], local.json()["bytes"]);
    // Online with the Hub unreachable, the cache answers too (as huggingface_hub falls back).
    let (out, took) = run_with(
        &[("HF_HOME", &home.path()), ("HF_ENDPOINT", &home.endpoint), ("HF_HUB_DOWNLOAD_TIMEOUT", "2")],
        &["inspect", "test-org/qwen-single", "--json"],
        Duration::from_secs(60),
    );
    assert_ok(&out);
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[cfg(unix)]
fn link(target: &Path, link: &Path, _blob: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

#[cfg(not(unix))]
fn link(_target: &Path, link: &Path, blob: &Path) {
    std::fs::copy(blob, link).unwrap();
}

#[test]
fn a_revision_picks_its_commit() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    let main = home.run(&[], &["inspect", "test-org/revisions", "--json"]);
    let v2 = home.run(&[], &["inspect", "test-org/revisions@v2", "--json"]);
    let by_commit = home.run(&[], &["inspect", &format!("test-org/revisions@{OTHER_COMMIT}"), "--json"]);
    for out in [&main, &v2, &by_commit] {
        assert_ok(out);
    }
    let params = |name: &str| run(&[], &["inspect", name, "--json"]).json()["params"].clone();
    assert_eq!(main.json()["params"], params("qwen2.5-0.5b"));
    assert_eq!(v2.json()["params"], params("qwen2.5-1.5b"));
    assert_eq!(by_commit.json()["params"], params("qwen2.5-1.5b"));
    assert_eq!(v2.json()["name"], "test-org/revisions@v2");
    let refs = home.repo_cache("test-org/revisions").join("refs");
    assert_eq!(std::fs::read_to_string(refs.join("v2")).unwrap(), OTHER_COMMIT);
    let out = home.run(&[], &["inspect", "test-org/revisions@v9"]);
    vramplan_tests::assert_refused(&out, &["test-org/revisions", "no revision `v9`"]);
}

#[test]
fn a_busy_hub_is_retried_then_given_up_on() {
    let repos = repos();
    let busy = std::sync::Arc::clone(&repos["test-org/busy"].unavailable);
    let server = HubServer::start(repos);
    let home = Home::new(&server.endpoint());
    busy.store(2, std::sync::atomic::Ordering::Relaxed);
    let out = home.run(&[], &["inspect", "test-org/busy", "-v"]);
    assert_ok(&out);
    assert_eq!(out.stderr.matches("-> 503").count(), 2, "{}", out.stderr);
    assert_eq!(out.stderr.matches("hub: retry in").count(), 2, "{}", out.stderr);
    busy.store(100, std::sync::atomic::Ordering::Relaxed);
    let cold = Home::new(&server.endpoint());
    let out = cold.run(&[], &["inspect", "test-org/busy", "-v"]);
    vramplan_tests::assert_bad_input(&out, &["HTTP 503", "4 attempts"]);
    assert_eq!(out.stderr.matches("-> 503").count(), 4, "{}", out.stderr);
}

#[test]
fn unknown_repos_and_unreachable_endpoints_are_bad_input_with_a_fix() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    let out = home.run(&[], &["inspect", "test-org/no-such-model"]);
    vramplan_tests::assert_refused(&out, &["no repository `test-org/no-such-model`"]);
    let dead = dead_endpoint();
    let (out, took) = run_with(
        &[("HF_HOME", &home.path()), ("HF_ENDPOINT", &dead)],
        &["estimate", "test-org/llama-sharded", "--hardware", "t4"],
        Duration::from_secs(60),
    );
    vramplan_tests::assert_refused(&out, &["cannot reach the Hub", &dead, "HF_HUB_OFFLINE=1", "HF_ENDPOINT"]);
    assert!(took < Duration::from_secs(15), "a refused connection fails fast: {took:?}");
    // An endpoint that accepts and never answers: the timeout ends it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    let (out, took) = run_with(
        &[("HF_HOME", &home.path()), ("HF_ENDPOINT", &silent_endpoint), ("HF_HUB_DOWNLOAD_TIMEOUT", "1")],
        &["inspect", "test-org/llama-sharded"],
        Duration::from_secs(60),
    );
    vramplan_tests::assert_refused(&out, &["cannot reach the Hub", "timed out"]);
    assert!(took < Duration::from_secs(20), "{took:?}");
    drop(silent);
    // A name meant as a built-in keeps the suggestion.
    let out = home.run(&[], &["inspect", "someone/llama-3.2-1b"]);
    vramplan_tests::assert_refused(&out, &["someone/llama-3.2-1b", "did you mean llama-3.2-1b"]);
}

/// The case of `fixtures/reference/loads/v5.json` whose arguments are `args`.
fn loads_case(args: &[&str]) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/reference/loads/v5.json");
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = file["cases"].as_array().expect("cases");
    cases.iter().find(|c| c["args"] == serde_json::json!(args)).cloned().expect("the case is in the fixture")
}

#[test]
fn a_vision_language_plan_by_hub_id_writes_the_map_transformers_loaded() {
    let repos = repos();
    let server = HubServer::start(repos);
    let home = Home::new(&server.endpoint());
    let workload = [
        "--hardware",
        "t4x2",
        "--mode",
        "inference",
        "--dtype",
        "fp16",
        "--seq",
        "1024",
        "--images",
        "2",
        "--image-size",
        "1024x1024",
    ];
    // The built-in's plan for this workload loaded in transformers 5.24 (a tiny random
    // checkpoint with the same module tree) and ran a forward pass: `scripts/reference/loads.py`.
    let mut args = vec!["plan", "qwen2.5-vl-7b-instruct"];
    args.extend_from_slice(&workload);
    let case = loads_case(&args);
    assert_eq!((case["loaded"].as_bool(), case["forward"].as_bool()), (Some(true), Some(true)), "{case}");
    let out_dir = tempfile::tempdir().unwrap();
    let map_path = out_dir.path().join("map.json");
    let map_arg = map_path.display().to_string();
    let mut hub_args = vec!["plan", "Qwen/Qwen2.5-VL-7B-Instruct"];
    hub_args.extend_from_slice(&workload);
    hub_args.extend_from_slice(&["-o", &map_arg]);
    let out = home.run(&[], &hub_args);
    assert_ok(&out);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&map_path).unwrap()).unwrap();
    let written: Vec<serde_json::Value> = written
        .as_object()
        .expect("a device_map object")
        .iter()
        .map(|(k, v)| serde_json::json!([k, v]))
        .collect();
    // (serde_json's map sorts the keys: compare the pairs sorted, and the order from the text.)
    let mut loaded: Vec<serde_json::Value> = case["device_map"].as_array().expect("a map").clone();
    let mut written = written;
    let key = |pair: &serde_json::Value| pair[0].as_str().unwrap_or_default().to_string();
    loaded.sort_by_key(key);
    written.sort_by_key(key);
    assert_eq!(written, loaded, "the Hub id's map is not the one loaded");
    let text = std::fs::read_to_string(&map_path).unwrap();
    let first_key = case["device_map"][0][0].as_str().expect("a key");
    assert!(text.trim_start_matches(['{', '\n', ' ']).starts_with(&format!("\"{first_key}\"")), "{text}");
    // The published names were read as transformers reads them, and the processor's bounds too.
    let inspect = home.run(&[], &["inspect", "Qwen/Qwen2.5-VL-7B-Instruct", "--json"]).json();
    let notes = inspect["notes"].to_string();
    assert!(notes.contains("conversion"), "{notes}");
}

#[test]
fn a_gguf_of_a_hub_repository_is_read_as_the_same_files_in_a_folder() {
    let repos = repos();
    let server = HubServer::start(repos);
    let home = Home::new(&server.endpoint());
    let fixtures = format!("{}/../fixtures/reference/gguf", env!("CARGO_MANIFEST_DIR"));
    // `org/name:TAG` picks the file as llama.cpp's `-hf` does, with the repository's projector.
    let folder = tempfile::tempdir().unwrap();
    for (from, to) in
        [("tiny-llama-q4_k_m.gguf", "tiny-llama-Q4_K_M.gguf"), ("mmproj-tiny.gguf", "mmproj-tiny-f16.gguf")]
    {
        std::fs::copy(format!("{fixtures}/{from}"), folder.path().join(to)).unwrap();
    }
    let local = home.run(&[], &["inspect", &folder.path().display().to_string(), "--json"]);
    assert_ok(&local);
    let hub = home.run(&[], &["inspect", "test-org/tiny-GGUF:Q4_K_M", "--json", "--verbose"]);
    assert_ok(&hub);
    let (hub_json, local_json) = (hub.json(), local.json());
    assert_eq!(hub_json["modules"], local_json["modules"]);
    assert_eq!(hub_json["bytes"], local_json["bytes"]);
    let files_bytes: u64 = ["tiny-llama-q4_k_m.gguf", "mmproj-tiny.gguf"]
        .iter()
        .map(|f| std::fs::metadata(format!("{fixtures}/{f}")).unwrap().len())
        .sum();
    assert!(bytes_read(&hub.stderr) < files_bytes / 2, "headers only: {}", hub.stderr);
    // A split file in a subfolder: every part read.
    let split = home.run(&[], &["inspect", "test-org/tiny-GGUF:q8_0", "--json"]);
    assert_ok(&split);
    // (The same model written in three parts, with the repository's one projector.)
    assert_eq!(split.json()["bytes"], local_json["bytes"]);
    assert!(
        local_json["modules"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["name"].as_str().is_some_and(|n| n.starts_with("mmproj."))))
    );
    // A tag that matches nothing names what there is.
    let none = home.run(&[], &["inspect", "test-org/tiny-GGUF:Q2_K"]);
    assert_eq!(none.code, 2);
    assert!(none.stderr.contains("tiny-llama-Q4_K_M.gguf"), "{}", none.stderr);
}

#[test]
fn published_vision_language_checkpoints_are_read_under_the_names_transformers_loads() {
    let server = HubServer::start(repos());
    let home = Home::new(&server.endpoint());
    for (repo, builtin) in
        [("google/gemma-3-4b-it", "gemma-3-4b-it"), ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl-7b-instruct")]
    {
        let hub = home.run(&[], &["inspect", repo, "--json"]).json();
        let local = home.run(&[], &["inspect", builtin, "--json"]).json();
        for key in ["params", "bytes", "modules", "layer_kinds"] {
            assert_eq!(hub[key], local[key], "{repo}: {key}");
        }
        let notes = hub["notes"].to_string();
        assert!(notes.contains("conversion"), "{repo}: {notes}");
        assert!(!notes.contains("have no place in the tree"), "{repo}: names the tree lacks: {notes}");
        assert!(!notes.contains("are not in the checkpoint"), "{repo}: names the checkpoint lacks: {notes}");
    }
}
