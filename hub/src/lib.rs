//! The Hugging Face Hub, read the way `huggingface_hub` reads it, for the few bytes a memory plan
//! needs: a revision's commit and file list, small whole files (configs, the checkpoint index),
//! and byte ranges of large ones (safetensors headers), never the weights.
//!
//! - Addresses: `{HF_ENDPOINT}/api/models/{repo}/revision/{revision}` (the commit, `sha`, and the
//!   files, `siblings`) and `{HF_ENDPOINT}/{repo}/resolve/{revision}/{file}`, the revision
//!   percent-encoded whole and the file path but its `/` (`hf_hub_url`).
//! - The environment ([`settings`]): endpoint, token, offline mode, cache folder, timeout.
//! - The shared cache ([`cache`]), in `huggingface_hub`'s layout: a model it downloaded is read
//!   from there with no request, and the small files fetched here are stored there for it.
//! - Requests ([`http`]): bounded, retried when transient, redirects followed with the `Range`
//!   kept; every request, byte and cache hit counted in the calling thread's [`Activity`].
//!
//! Why not the `hf-hub` crate: hf-hub 1.0 is async (reqwest and tokio), and its file API
//! downloads whole files, where a plan needs range reads of safetensors headers (a 70B checkpoint
//! is 140 GB; its 30 headers are a few KiB each). The cache layout it and `huggingface_hub` share
//! is kept here.
//!
//! Invariants: no request when offline; no byte of a tensor's data is asked for except those a
//! speculative header read ([`HEADER_PROBE`]) covers; only whole files enter `blobs/` and
//! `snapshots/`; every request has a timeout and a body limit.

mod cache;
mod error;
mod http;
mod id;
mod settings;

pub use cache::{HEADERS, RepoCache, is_commit};
pub use error::{HubError, Missing};
pub use id::HubId;
pub use settings::{DEFAULT_ENDPOINT, Settings, TokenSource, is_true};

use http::{Answer, Client};
use id::quote;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The first read of a safetensors file: its 8-byte length and, usually, the whole JSON header.
/// 16 KiB holds the header of a shard of a dense model (a Llama-3.1-70B shard lists some 25
/// tensors in about 3 KiB); a longer header takes one more read of exactly the rest. 30 shards
/// cost under 0.5 MiB.
pub const HEADER_PROBE: u64 = 16 * 1024;
/// The safetensors library refuses headers above 100 MB; so do we, before asking for them.
pub const MAX_HEADER: u64 = 100_000_000;
/// The largest whole file fetched (configs, an index of a large MoE checkpoint is a few MB).
pub const MAX_FILE: u64 = 64 * 1024 * 1024;
/// The largest revision listing read (`siblings` of a repository with many files).
const MAX_LISTING: u64 = 16 * 1024 * 1024;
/// Header reads at once.
const PARALLEL: usize = 8;

/// What a [`Hub`] did, for `--verbose`: requests, bytes of bodies read, cache hits, a line each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Activity {
    /// HTTP requests sent (each redirect and retry counts).
    pub requests: u64,
    /// Bytes of answers' bodies read.
    pub bytes_read: u64,
    /// Files and headers answered by the cache.
    pub cache_hits: u64,
    /// One line per request, cache hit or retry, in order.
    pub lines: Vec<String>,
}

thread_local! {
    static ACTIVITY: Arc<Mutex<Activity>> = Arc::default();
}

/// Takes what the Hubs made on this thread have done since the last call.
pub fn take_activity() -> Activity {
    ACTIVITY.with(|a| a.lock().map(|mut a| std::mem::take(&mut *a)).unwrap_or_default())
}

/// A revision of a repository: its commit and files, from the Hub or the cache.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `org/name`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it stands for (40 hex digits).
    pub commit: String,
    /// Every file of the revision (the Hub's `siblings`), or, from the cache, every file the
    /// cache holds for the commit; sorted.
    pub files: Vec<String>,
    /// The cache answered (offline, or the Hub could not be reached).
    pub from_cache: bool,
    cache: RepoCache,
}

impl Snapshot {
    /// The repository's folder in the cache.
    pub fn cache(&self) -> &RepoCache {
        &self.cache
    }
}

/// A byte range read.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeRead {
    /// The bytes, from the start asked for; fewer than asked where the file ends first.
    pub bytes: Vec<u8>,
    /// The file's total size.
    pub total: u64,
}

/// Where a safetensors header came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderSource {
    /// The whole file in the cache's snapshot (a model `huggingface_hub` downloaded).
    Snapshot,
    /// vramplan's header cache (`vramplan-headers/`).
    HeaderCache,
    /// Range requests to the Hub.
    Fetched,
}

/// The start of a safetensors file: its 8-byte length prefix and JSON header.
#[derive(Debug, Clone, PartialEq)]
pub struct FileStart {
    /// The first `8 + N` bytes of the file (fewer where the file is shorter).
    pub bytes: Vec<u8>,
    /// The file's total size.
    pub total: u64,
    /// Where they came from.
    pub source: HeaderSource,
}

/// A client of one Hub endpoint and its cache.
#[derive(Debug)]
pub struct Hub {
    settings: Settings,
    client: Client,
    activity: Arc<Mutex<Activity>>,
    /// The endpoint was unreachable once: the rest of the run reads the cache only.
    unreachable: AtomicBool,
}

impl Hub {
    /// A client with `settings`, recording into the calling thread's [`Activity`].
    pub fn new(settings: Settings) -> Hub {
        let activity = ACTIVITY.with(Arc::clone);
        let client = Client::new(&settings, Arc::clone(&activity));
        Hub { settings, client, activity, unreachable: AtomicBool::new(false) }
    }

    /// A client configured by this process's environment.
    pub fn from_env() -> Result<Hub, HubError> {
        Ok(Hub::new(Settings::from_env()?))
    }

    /// The settings in use.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn offline(&self) -> bool {
        self.settings.offline || self.unreachable.load(Ordering::Relaxed)
    }

    fn note(&self, line: String, hit: bool) {
        if let Ok(mut activity) = self.activity.lock() {
            activity.cache_hits += u64::from(hit);
            activity.lines.push(line);
        }
    }

    fn offline_error(&self, id: &str, missing: String) -> HubError {
        HubError::Offline { repo: id.to_string(), missing, asked: self.settings.offline }
    }

    /// Resolves `id` to a commit and its files: from the Hub's API, or, offline or when the Hub
    /// cannot be reached, from the cache (`refs/{revision}`, then what the cache holds for that
    /// commit).
    pub fn snapshot(&self, id: &HubId) -> Result<Snapshot, HubError> {
        let cache = RepoCache::new(&self.settings.cache, &id.repo);
        if !self.offline() {
            let url = format!(
                "{}/api/models/{}/revision/{}",
                self.settings.endpoint,
                id.repo,
                quote(&id.revision, false)
            );
            match self.client.get(&url, None, MAX_LISTING).and_then(|a| self.check(a, id, None)) {
                Ok(answer) => {
                    let (commit, files) = parse_listing(&answer.body, &url)?;
                    cache.write_ref(&id.revision, &commit)?;
                    return Ok(Snapshot {
                        repo: id.repo.clone(),
                        revision: id.revision.clone(),
                        commit,
                        files,
                        from_cache: false,
                        cache,
                    });
                }
                // As huggingface_hub: a connection failure or a server error falls back to the
                // cache; an answer about the repository (not found, no access) does not.
                Err(e @ (HubError::Unreachable { .. } | HubError::Status { .. })) => {
                    if cache.commit_of(&id.revision).is_none_or(|c| cache.files(&c).is_empty()) {
                        return Err(e);
                    }
                    self.note(format!("{e}; reading the cache"), false);
                    self.unreachable.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        let label = format!("{}@{}", id.repo, id.revision);
        let Some(commit) = cache.commit_of(&id.revision) else {
            return Err(self.offline_error(
                &label,
                format!("`refs/{}` (the commit it names) in {}", id.revision, cache.root().display()),
            ));
        };
        let files = cache.files(&commit);
        if files.is_empty() {
            return Err(self.offline_error(
                &label,
                format!("every file (nothing in {})", cache.root().join("snapshots").join(&commit).display()),
            ));
        }
        self.note(format!("cache: {} is commit {commit} with {} files", label, files.len()), true);
        Ok(Snapshot {
            repo: id.repo.clone(),
            revision: id.revision.clone(),
            commit,
            files,
            from_cache: true,
            cache,
        })
    }

    /// A small whole file of the snapshot, on disk in the cache: there already, or fetched and
    /// stored in `huggingface_hub`'s layout. `None` when the revision has no such file.
    pub fn file(&self, snapshot: &Snapshot, file: &str) -> Result<Option<PathBuf>, HubError> {
        let cache = &snapshot.cache;
        if let Some(path) = cache.snapshot_file(&snapshot.commit, file) {
            self.note(format!("cache: {}", path.display()), true);
            return Ok(Some(path));
        }
        if !snapshot.files.iter().any(|f| f == file) || cache.known_missing(&snapshot.commit, file) {
            return Ok(None);
        }
        if self.offline() {
            return Err(
                self.offline_error(&format!("{}@{}", snapshot.repo, snapshot.revision), format!("`{file}`"))
            );
        }
        let id = HubId { repo: snapshot.repo.clone(), revision: snapshot.commit.clone() };
        let url = self.resolve_url(&id.repo, &snapshot.commit, file);
        let answer = match self.client.get(&url, None, MAX_FILE).and_then(|a| self.check(a, &id, Some(file)))
        {
            Ok(answer) => answer,
            Err(HubError::NotFound { missing: Missing::File, .. }) => {
                cache.mark_missing(&snapshot.commit, file)?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if let Some(commit) = answer.header("X-Repo-Commit")
            && commit != snapshot.commit
        {
            return Err(HubError::Protocol {
                url,
                problem: format!("answered from commit {commit}, not the {} asked for", snapshot.commit),
            });
        }
        if answer.body.len() as u64 > MAX_FILE {
            return Err(HubError::Protocol {
                url,
                problem: format!("larger than the {MAX_FILE} bytes vramplan reads whole"),
            });
        }
        let etag = answer.header("X-Linked-Etag").or_else(|| answer.header("ETag")).map(normalize_etag);
        let Some(etag) = etag.filter(|e| !e.is_empty() && !e.contains(['/', '\\']) && e != "..") else {
            return Err(HubError::Protocol { url, problem: "no ETag: the file cannot be cached".into() });
        };
        Ok(Some(cache.store_file(&snapshot.commit, file, &etag, &answer.body)?))
    }

    /// Reads `len` bytes of `file` from byte `start`: from the cache's snapshot when the whole
    /// file is there, else with one HTTP range request (the file's size from `Content-Range`).
    pub fn read_range(
        &self,
        repo: &str,
        revision: &str,
        file: &str,
        start: u64,
        len: u64,
    ) -> Result<RangeRead, HubError> {
        let cache = RepoCache::new(&self.settings.cache, repo);
        if let Some(path) = cache.commit_of(revision).and_then(|c| cache.snapshot_file(&c, file)) {
            self.note(format!("cache: {} bytes {start}+{len}", path.display()), true);
            return read_local(&path, start, len);
        }
        if self.offline() {
            return Err(self.offline_error(&format!("{repo}@{revision}"), format!("`{file}`")));
        }
        if len == 0 {
            return Err(HubError::Protocol { url: file.into(), problem: "a range of 0 bytes".into() });
        }
        let id = HubId { repo: repo.into(), revision: revision.into() };
        let url = self.resolve_url(repo, revision, file);
        let last = start.saturating_add(len - 1);
        let answer = self.client.get(&url, Some((start, last)), len)?;
        if answer.status == 416 {
            let total = answer.header("Content-Range").and_then(range_total);
            return match total {
                Some(total) if total <= start => Ok(RangeRead { bytes: Vec::new(), total }),
                _ => Err(HubError::Protocol { url, problem: "HTTP 416 without the file's size".into() }),
            };
        }
        let mut answer = self.check(answer, &id, Some(file))?;
        let total = match answer.status {
            206 => {
                let range = answer.header("Content-Range");
                match range.and_then(|r| range_start(r).zip(range_total(r))) {
                    Some((first, total)) if first == start => total,
                    _ => {
                        return Err(HubError::Protocol {
                            url,
                            problem: format!("a 206 answer with Content-Range `{}`", range.unwrap_or("")),
                        });
                    }
                }
            }
            _ if start == 0 => {
                let size = answer.header("Content-Length").or_else(|| answer.header("X-Linked-Size"));
                match size.and_then(|s| s.trim().parse().ok()) {
                    Some(total) => total,
                    None => return Err(HubError::Protocol { url, problem: "no Content-Length".into() }),
                }
            }
            status => {
                return Err(HubError::Protocol { url, problem: format!("HTTP {status} to a range request") });
            }
        };
        answer.body.truncate(len as usize);
        Ok(RangeRead { bytes: answer.body, total })
    }

    /// The start of safetensors `file` (length prefix and JSON header): from the whole file in
    /// the snapshot, vramplan's header cache, or range requests (a [`HEADER_PROBE`] first, the
    /// rest of a longer header second), then kept in the header cache.
    pub fn safetensors_header(&self, snapshot: &Snapshot, file: &str) -> Result<FileStart, HubError> {
        let cache = &snapshot.cache;
        let commit = &snapshot.commit;
        if let Some(path) = cache.snapshot_file(commit, file) {
            self.note(format!("cache: {} (header)", path.display()), true);
            let head = read_local(&path, 0, 8)?;
            let want = header_end(&head.bytes, &path.display().to_string())?;
            let read = read_local(&path, 0, want.min(head.total))?;
            return Ok(FileStart { bytes: read.bytes, total: read.total, source: HeaderSource::Snapshot });
        }
        if let Some((bytes, total)) = cache.header(commit, file) {
            self.note(format!("cache: {}/{commit}/{file}", HEADERS), true);
            return Ok(FileStart { bytes, total, source: HeaderSource::HeaderCache });
        }
        if self.offline() {
            return Err(self.offline_error(
                &format!("{}@{}", snapshot.repo, snapshot.revision),
                format!("the header of `{file}`"),
            ));
        }
        let mut read = self.read_range(&snapshot.repo, commit, file, 0, HEADER_PROBE)?;
        let url = self.resolve_url(&snapshot.repo, commit, file);
        let want = header_end(&read.bytes, &url)?.min(read.total);
        if want > read.bytes.len() as u64 {
            let have = read.bytes.len() as u64;
            let rest = self.read_range(&snapshot.repo, commit, file, have, want - have)?;
            read.bytes.extend(rest.bytes);
        }
        read.bytes.truncate(want as usize);
        cache.store_header(commit, file, &read.bytes, read.total)?;
        Ok(FileStart { bytes: read.bytes, total: read.total, source: HeaderSource::Fetched })
    }

    /// [`Hub::safetensors_header`] of several files, up to 8 at once, in the order given.
    pub fn safetensors_headers(
        &self,
        snapshot: &Snapshot,
        files: &[String],
    ) -> Vec<Result<FileStart, HubError>> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<FileStart, HubError>>>> = Mutex::new(vec![None; files.len()]);
        std::thread::scope(|scope| {
            for _ in 0..PARALLEL.min(files.len()) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(file) = files.get(i) else { break };
                        let result = self.safetensors_header(snapshot, file);
                        if let Ok(mut all) = results.lock() {
                            all[i] = Some(result);
                        }
                    }
                });
            }
        });
        let results = results.into_inner().unwrap_or_default();
        results
            .into_iter()
            .zip(files)
            .map(|(r, f)| {
                r.unwrap_or_else(|| Err(HubError::Protocol { url: f.clone(), problem: "not read".into() }))
            })
            .collect()
    }

    fn resolve_url(&self, repo: &str, revision: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/{}/{}", self.settings.endpoint, quote(revision, false), quote(file, true))
    }

    /// An answer that is not a success, as the typed error `hf_raise_for_status` raises.
    fn check(&self, answer: Answer, id: &HubId, file: Option<&str>) -> Result<Answer, HubError> {
        if (200..300).contains(&answer.status) {
            return Ok(answer);
        }
        let code = answer.header("X-Error-Code").unwrap_or("");
        let message = answer.header("X-Error-Message").map(str::to_string);
        let not_found = |missing| HubError::NotFound {
            repo: id.repo.clone(),
            revision: id.revision.clone(),
            file: file.map(str::to_string),
            missing,
        };
        Err(match (answer.status, code) {
            (_, "RevisionNotFound") => not_found(Missing::Revision),
            (_, "EntryNotFound") => not_found(Missing::File),
            (_, "GatedRepo") | (403, _) | (401, "") => HubError::Access {
                repo: id.repo.clone(),
                status: answer.status,
                gated: code == "GatedRepo",
                token: self.settings.token.as_ref().map(|(_, from)| match from {
                    TokenSource::Env(var) => var.to_string(),
                    TokenSource::File(path) => path.display().to_string(),
                }),
                message,
            },
            (401, _) | (_, "RepoNotFound") => not_found(Missing::Repo),
            (404, _) => not_found(if file.is_some() { Missing::File } else { Missing::Repo }),
            (status, _) => {
                HubError::Status { url: format!("{}/{}", self.settings.endpoint, id.repo), status, message }
            }
        })
    }
}

/// The commit and files of an API answer.
fn parse_listing(body: &[u8], url: &str) -> Result<(String, Vec<String>), HubError> {
    let protocol = |problem: &str| HubError::Protocol { url: url.into(), problem: problem.into() };
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| protocol(&format!("the answer is not JSON ({e})")))?;
    let commit = value.get("sha").and_then(|v| v.as_str()).filter(|s| is_commit(s));
    let Some(commit) = commit else { return Err(protocol("the answer has no commit (`sha`)")) };
    let Some(siblings) = value.get("siblings").and_then(|v| v.as_array()) else {
        return Err(protocol("the answer lists no files (`siblings`)"));
    };
    let mut files: Vec<String> = siblings
        .iter()
        .filter_map(|s| s.get("rfilename").and_then(|f| f.as_str()).map(str::to_string))
        .collect();
    files.sort();
    Ok((commit.to_string(), files))
}

/// How many bytes a safetensors file's start must hold: 8 and the header length it gives.
fn header_end(bytes: &[u8], origin: &str) -> Result<u64, HubError> {
    let Some(prefix) = bytes.get(..8) else {
        return Err(HubError::Protocol {
            url: origin.into(),
            problem: format!("{} bytes, too short for a safetensors file", bytes.len()),
        });
    };
    let mut length = [0u8; 8];
    length.copy_from_slice(prefix);
    let length = u64::from_le_bytes(length);
    if length > MAX_HEADER {
        return Err(HubError::Protocol {
            url: origin.into(),
            problem: format!("the header says {length} bytes, more than the {MAX_HEADER} safetensors allows"),
        });
    }
    Ok(8 + length)
}

/// Reads `len` bytes from `start` of a local file (fewer where it ends first).
fn read_local(path: &Path, start: u64, len: u64) -> Result<RangeRead, HubError> {
    let fail = |e: std::io::Error| HubError::Cache { path: path.to_path_buf(), detail: e.to_string() };
    // A FIFO or device in a snapshot would block the read: only regular files are read.
    if !std::fs::metadata(path).map_err(fail)?.is_file() {
        return Err(HubError::Cache { path: path.to_path_buf(), detail: "not a regular file".into() });
    }
    let mut file = std::fs::File::open(path).map_err(fail)?;
    let total = file.metadata().map_err(fail)?.len();
    file.seek(SeekFrom::Start(start)).map_err(fail)?;
    let mut bytes = Vec::new();
    file.take(len).read_to_end(&mut bytes).map_err(fail)?;
    Ok(RangeRead { bytes, total })
}

/// `file_download._normalize_etag`: `W/` and quotes removed.
fn normalize_etag(etag: &str) -> String {
    etag.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

/// `first` of `Content-Range: bytes first-last/total`.
fn range_start(value: &str) -> Option<u64> {
    value.trim().strip_prefix("bytes ")?.split(['-', '/']).next()?.trim().parse().ok()
}

/// `total` of `Content-Range: bytes first-last/total` (or `bytes */total`).
fn range_total(value: &str) -> Option<u64> {
    value.rsplit_once('/')?.1.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_huggingface_hub_reads_them() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(range_total("bytes 0-16383/1234567"), Some(1_234_567));
        assert_eq!(range_start("bytes 16384-20000/1234567"), Some(16384));
        assert_eq!(range_total("bytes */99"), Some(99));
    }

    #[test]
    fn offline_reads_only_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().display().to_string();
        let settings = Settings::from_vars(|n| match n {
            "HF_HOME" => Some(home.clone()),
            "HF_HUB_OFFLINE" => Some("1".into()),
            _ => None,
        })
        .unwrap();
        let hub = Hub::new(settings);
        let id = HubId::parse("org/name").unwrap().unwrap();
        let e = hub.snapshot(&id).unwrap_err();
        assert!(matches!(e, HubError::Offline { asked: true, .. }), "{e}");
        assert!(e.to_string().contains("offline"), "{e}");
        let commit = "a".repeat(40);
        let cache = RepoCache::new(&dir.path().join("hub"), "org/name");
        cache.write_ref("main", &commit).unwrap();
        cache.store_file(&commit, "config.json", "e1", b"{}").unwrap();
        let snapshot = hub.snapshot(&id).unwrap();
        assert!(snapshot.from_cache);
        assert_eq!(snapshot.files, ["config.json"]);
        assert!(hub.file(&snapshot, "config.json").unwrap().is_some());
        let e = hub.safetensors_header(&snapshot, "model.safetensors").unwrap_err();
        assert!(e.to_string().contains("header of `model.safetensors`"), "{e}");
        let activity = take_activity();
        assert_eq!(activity.requests, 0);
        assert!(activity.cache_hits >= 2, "{activity:?}");
    }
}
