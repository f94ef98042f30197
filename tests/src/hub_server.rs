//! A local stand-in for the Hugging Face Hub's HTTP API, for tests that must not touch the
//! network: `std::net::TcpListener` on 127.0.0.1 with an ephemeral port, a thread per
//! connection, stopped when dropped.
//!
//! It answers as the Hub does (the behaviour `huggingface_hub` relies on):
//! - `GET /api/models/{org}/{name}/revision/{revision}`: `{"id", "sha", "siblings"}`;
//! - `GET|HEAD /{org}/{name}/resolve/{revision}/{file}`: the file, with `ETag`,
//!   `X-Repo-Commit` and `Range` support; a `.safetensors` file is a 302 to `/cdn/...` (the
//!   Hub's LFS redirect) carrying `X-Linked-Etag` and `X-Linked-Size`;
//! - a gated repository answers its files with 401 (no token) or 403 (another token) and
//!   `X-Error-Code: GatedRepo`; an unknown repository with 401 `RepoNotFound` (404 with a token),
//!   an unknown revision with 404 `RevisionNotFound`, a missing file with 404 `EntryNotFound`.
//!
//! Safetensors files are virtual: the header is real (real names, shapes, dtypes and offsets),
//! the data is zeros made only while a request asks for them, never stored. The server counts
//! the requests and the body bytes it sent, so a test can check what a client read without
//! trusting the client's own count.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use vramplan_profiles::model::{self, ImportOptions, Naming, TensorKind};

/// One file of a repository.
#[derive(Debug, Clone)]
pub enum Content {
    /// A small file, served as is.
    Bytes(Vec<u8>),
    /// A safetensors file: its first bytes (length prefix and header) and its total size; the
    /// rest is zeros.
    Safetensors {
        /// The 8-byte length and the JSON header.
        start: Vec<u8>,
        /// The whole file's size.
        total: u64,
    },
}

impl Content {
    fn len(&self) -> u64 {
        match self {
            Content::Bytes(bytes) => bytes.len() as u64,
            Content::Safetensors { total, .. } => *total,
        }
    }

    /// The bytes `first..=last`.
    fn slice(&self, first: u64, last: u64) -> Vec<u8> {
        match self {
            Content::Bytes(bytes) => bytes[first as usize..=last as usize].to_vec(),
            Content::Safetensors { start, .. } => (first..=last)
                .map(|i| if (i as usize) < start.len() { start[i as usize] } else { 0 })
                .collect(),
        }
    }

    /// An ETag standing for the content (FNV-1a of what defines it).
    fn etag(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let (bytes, extra) = match self {
            Content::Bytes(bytes) => (bytes.as_slice(), 0),
            Content::Safetensors { start, total } => (start.as_slice(), *total),
        };
        for byte in bytes.iter().copied().chain(extra.to_le_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}{:024x}", bytes.len())
    }
}

/// A repository: its revisions (branch or tag → commit → files) and who may read it.
#[derive(Debug, Clone, Default)]
pub struct Repo {
    /// Branch and tag names → commit hash.
    pub refs: BTreeMap<String, String>,
    /// Commit hash → the files at that commit.
    pub commits: BTreeMap<String, BTreeMap<String, Content>>,
    /// A gated repository: files are served only with `Authorization: Bearer {token}`.
    pub gated_token: Option<String>,
    /// Requests to this repository still to be answered 503 with `Retry-After: 0` (a Hub under
    /// load), shared by the clones of the repository.
    pub unavailable: Arc<AtomicU64>,
}

impl Repo {
    /// A repository whose `main` is `commit` with `files`.
    pub fn new(commit: &str, files: BTreeMap<String, Content>) -> Repo {
        let mut repo = Repo::default();
        repo.add_revision("main", commit, files);
        repo
    }

    /// Adds branch or tag `name` pointing at `commit` with `files`.
    pub fn add_revision(&mut self, name: &str, commit: &str, files: BTreeMap<String, Content>) {
        self.refs.insert(name.to_string(), commit.to_string());
        self.commits.insert(commit.to_string(), files);
    }
}

/// What the server saw.
#[derive(Debug, Default)]
pub struct Served {
    /// Requests answered.
    pub requests: AtomicU64,
    /// Body bytes sent.
    pub body_bytes: AtomicU64,
    /// `METHOD path [Range]`, one per request.
    pub log: Mutex<Vec<String>>,
}

/// The running server.
pub struct HubServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    /// What was served so far.
    pub served: Arc<Served>,
}

impl HubServer {
    /// Starts a server for `repos` (`org/name` → repository).
    pub fn start(repos: BTreeMap<String, Repo>) -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("local address");
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Served::default());
        let repos = Arc::new(repos);
        let accept = {
            let (stop, served) = (Arc::clone(&stop), Arc::clone(&served));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (repos, served) = (Arc::clone(&repos), Arc::clone(&served));
                            std::thread::spawn(move || {
                                let _ = serve(stream, &repos, &served);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        HubServer { addr, stop, accept: Some(accept), served }
    }

    /// `http://127.0.0.1:PORT`, for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Body bytes sent so far.
    pub fn body_bytes(&self) -> u64 {
        self.served.body_bytes.load(Ordering::Relaxed)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.served.requests.load(Ordering::Relaxed)
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// A parsed request.
struct Request {
    method: String,
    path: String,
    range: Option<String>,
    authorization: Option<String>,
}

fn read_request(stream: &TcpStream) -> std::io::Result<Request> {
    let mut reader = BufReader::new(stream.take(64 * 1024));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let (mut range, mut authorization) = (None, None);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(value.trim().to_string()),
                "authorization" => authorization = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    Ok(Request { method, path, range, authorization })
}

/// One answer, before it is written.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Option<(Content, u64, u64)>,
}

impl Answer {
    fn empty(status: u16) -> Answer {
        Answer { status, headers: Vec::new(), body: None }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Answer {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    fn error(status: u16, code: &str, message: &str) -> Answer {
        Answer::empty(status).header("X-Error-Code", code).header("X-Error-Message", message)
    }
}

fn serve(stream: TcpStream, repos: &BTreeMap<String, Repo>, served: &Served) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let request = read_request(&stream)?;
    served.requests.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut log) = served.log.lock() {
        log.push(format!("{} {} {}", request.method, request.path, request.range.as_deref().unwrap_or("")));
    }
    let answer = route(&request, repos);
    write_answer(stream, &request, answer, served)
}

fn route(request: &Request, repos: &BTreeMap<String, Repo>) -> Answer {
    let path = request.path.split('?').next().unwrap_or("");
    let segments: Vec<String> = path.trim_start_matches('/').split('/').map(decode).collect();
    let token = request.authorization.as_deref().and_then(|a| a.strip_prefix("Bearer "));
    let seg = |i: usize| segments.get(i).map(String::as_str).unwrap_or("");
    let find = |org: &str, name: &str| repos.get(&format!("{org}/{name}"));
    let repo_missing = || {
        let status = if token.is_some() { 404 } else { 401 };
        Answer::error(status, "RepoNotFound", "Repository not found")
    };
    let named = if seg(0) == "api" { find(seg(2), seg(3)) } else { find(seg(0), seg(1)) };
    if let Some(repo) = named
        && repo.unavailable.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    {
        return Answer::empty(503).header("Retry-After", "0");
    }
    if seg(0) == "api" && seg(1) == "models" && seg(4) == "revision" && segments.len() == 6 {
        let Some(repo) = find(seg(2), seg(3)) else { return repo_missing() };
        let Some((commit, files)) = revision(repo, seg(5)) else {
            return Answer::error(404, "RevisionNotFound", "Invalid rev id");
        };
        let siblings: Vec<_> = files.keys().map(|f| serde_json::json!({ "rfilename": f })).collect();
        let body = serde_json::json!({
            "id": format!("{}/{}", seg(2), seg(3)), "sha": commit, "gated": repo.gated_token.is_some(),
            "siblings": siblings,
        });
        let content = Content::Bytes(body.to_string().into_bytes());
        return whole(content, request).header("Content-Type", "application/json");
    }
    if seg(2) == "resolve" && segments.len() >= 5 {
        let Some(repo) = find(seg(0), seg(1)) else { return repo_missing() };
        if let Some(required) = &repo.gated_token
            && token != Some(required.as_str())
        {
            let status = if token.is_some() { 403 } else { 401 };
            let message =
                format!("Access to model {}/{} is restricted. You must have access to it.", seg(0), seg(1));
            return Answer::error(status, "GatedRepo", &message);
        }
        let Some((commit, files)) = revision(repo, seg(3)) else {
            return Answer::error(404, "RevisionNotFound", "Invalid rev id");
        };
        let file = segments[4..].join("/");
        let Some(content) = files.get(&file) else {
            return Answer::error(404, "EntryNotFound", "Entry not found").header("X-Repo-Commit", commit);
        };
        if file.ends_with(".safetensors") {
            return Answer::empty(302)
                .header(
                    "Location",
                    format!("/cdn/{commit}/{}/{}/{}?signature=x", seg(0), seg(1), encode_path(&file)),
                )
                .header("X-Repo-Commit", commit)
                .header("X-Linked-Etag", format!("\"{}\"", content.etag()))
                .header("X-Linked-Size", content.len().to_string());
        }
        return whole(content.clone(), request).header("X-Repo-Commit", commit);
    }
    if seg(0) == "cdn" && segments.len() >= 5 {
        let file = segments[4..].join("/");
        let content = find(seg(2), seg(3)).and_then(|r| r.commits.get(seg(1))).and_then(|f| f.get(&file));
        return match content {
            Some(content) => whole(content.clone(), request),
            None => Answer::empty(404),
        };
    }
    Answer::empty(404)
}

/// A revision by branch, tag or commit.
fn revision<'a>(repo: &'a Repo, name: &str) -> Option<(String, &'a BTreeMap<String, Content>)> {
    let commit = repo.refs.get(name).cloned().unwrap_or_else(|| name.to_string());
    repo.commits.get(&commit).map(|files| (commit, files))
}

/// The content, whole or the range asked for.
fn whole(content: Content, request: &Request) -> Answer {
    let total = content.len();
    let etag = format!("\"{}\"", content.etag());
    let Some(range) = request.range.as_deref() else {
        let last = total.saturating_sub(1);
        return Answer { status: 200, headers: vec![("ETag".into(), etag)], body: Some((content, 0, last)) };
    };
    let bounds = range.strip_prefix("bytes=").and_then(|r| r.split_once('-')).and_then(|(a, b)| {
        let first: u64 = a.trim().parse().ok()?;
        let last: u64 = if b.trim().is_empty() { u64::MAX } else { b.trim().parse().ok()? };
        Some((first, last.min(total.saturating_sub(1))))
    });
    match bounds {
        Some((first, last)) if first < total && first <= last => Answer {
            status: 206,
            headers: vec![
                ("ETag".into(), etag),
                ("Content-Range".into(), format!("bytes {first}-{last}/{total}")),
            ],
            body: Some((content, first, last)),
        },
        _ => Answer::empty(416).header("Content-Range", format!("bytes */{total}")),
    }
}

fn write_answer(
    mut stream: TcpStream,
    request: &Request,
    answer: Answer,
    served: &Served,
) -> std::io::Result<()> {
    let length = answer.body.as_ref().map_or(
        0,
        |(content, first, last)| {
            if content.len() == 0 { 0 } else { last - first + 1 }
        },
    );
    let mut head =
        format!("HTTP/1.1 {} X\r\nConnection: close\r\nContent-Length: {length}\r\n", answer.status);
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if request.method == "HEAD" {
        return Ok(());
    }
    if let Some((content, first, last)) = answer.body
        && content.len() > 0
    {
        // In pieces, so that a client that stops reading stops the zeros being made.
        let mut at = first;
        while at <= last {
            let end = (at + 64 * 1024 - 1).min(last);
            let piece = content.slice(at, end);
            stream.write_all(&piece)?;
            served.body_bytes.fetch_add(piece.len() as u64, Ordering::Relaxed);
            at = end + 1;
        }
    }
    stream.flush()
}

/// Percent-decoding of a path segment.
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(value) = segment.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(value);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn encode_path(path: &str) -> String {
    path.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_.-~/".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A stored tensor: name, safetensors dtype, shape, bytes.
type Stored = (String, String, Vec<u64>, u64);

/// The files of a Hub repository holding built-in model `name` as `save_pretrained` writes it:
/// its published `config.json` (from the catalog), and a checkpoint of every tensor the
/// description stores (parameters, quantization constants and persistent buffers; a tied
/// tensor once) in transformers 4.x names, split into `shards` files of about equal size in tree
/// order, with an index (`weight_map`, `metadata.total_size`) when there is more than one.
pub fn checkpoint_files(name: &str, shards: usize) -> BTreeMap<String, Content> {
    checkpoint_files_named(name, shards, |path| path.to_string())
}

/// [`checkpoint_files`] with every tensor stored under `stored_name(its name)`, as a published
/// checkpoint whose names transformers renames on load (Qwen2.5-VL's `visual.…`); a built-in
/// vision-language model's `preprocessor_config.json` is in the repository too.
pub fn checkpoint_files_named(
    name: &str,
    shards: usize,
    stored_name: impl Fn(&str) -> String,
) -> BTreeMap<String, Content> {
    let config = vramplan_profiles::model::catalog::builtin_config(name).expect("a built-in model");
    let model = model::load(name, ImportOptions { naming: Naming::V4 }).expect("a built-in model loads");
    let stored: Vec<Stored> = model
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.tied_to.is_none() && !matches!(t.kind, TensorKind::Buffer { persistent: false }))
        .map(|(path, t)| {
            let dtype = t.dtype.safetensors_name().expect("a safetensors dtype").to_string();
            (stored_name(&path), dtype, t.shape.clone(), t.bytes())
        })
        .collect();
    let total: u64 = stored.iter().map(|t| t.3).sum();
    let shards = shards.max(1);
    let mut groups: Vec<Vec<&Stored>> = vec![Vec::new(); shards];
    let mut running = 0u64;
    for tensor in &stored {
        let group = ((running as u128 * shards as u128) / total.max(1) as u128) as usize;
        groups[group.min(shards - 1)].push(tensor);
        running += tensor.3;
    }
    let mut files = BTreeMap::new();
    files.insert("config.json".to_string(), Content::Bytes(config.as_bytes().to_vec()));
    if let Some(processor) = vramplan_profiles::model::catalog::builtin_preprocessor(name) {
        files.insert("preprocessor_config.json".to_string(), Content::Bytes(processor.as_bytes().to_vec()));
    }
    files.insert(
        "generation_config.json".to_string(),
        Content::Bytes(br#"{"bos_token_id": 1, "eos_token_id": 2}"#.to_vec()),
    );
    let mut weight_map = serde_json::Map::new();
    for (i, group) in groups.iter().enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", i + 1)
        };
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
        let mut offset = 0u64;
        for (path, dtype, shape, bytes) in group {
            header.insert(
                path.clone(),
                serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes] }),
            );
            weight_map.insert(path.clone(), serde_json::Value::String(file.clone()));
            offset += bytes;
        }
        let json = serde_json::Value::Object(header).to_string().into_bytes();
        let mut start = (json.len() as u64).to_le_bytes().to_vec();
        start.extend_from_slice(&json);
        let size = start.len() as u64 + offset;
        files.insert(file, Content::Safetensors { start, total: size });
    }
    if shards > 1 {
        let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        files.insert("model.safetensors.index.json".into(), Content::Bytes(index.to_string().into_bytes()));
    }
    files
}

/// Writes `files` into `dir` as a model folder: small files whole, safetensors files as their
/// header followed by a sparse run of zeros to their full size (`set_len`, so no data is written).
pub fn write_folder(dir: &std::path::Path, files: &BTreeMap<String, Content>) {
    for (name, content) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create folder");
        }
        match content {
            Content::Bytes(bytes) => std::fs::write(&path, bytes).expect("write file"),
            Content::Safetensors { start, total } => {
                let mut file = std::fs::File::create(&path).expect("create file");
                file.write_all(start).expect("write header");
                file.set_len(*total).expect("extend file");
            }
        }
    }
}
