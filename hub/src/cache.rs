//! The shared cache, laid out exactly as `huggingface_hub` lays it (`file_download.py`), so a
//! model downloaded by Python is read here and what vramplan fetches is seen there:
//!
//! ```text
//! {HF_HUB_CACHE}/models--{org}--{name}/
//!     refs/{revision}                  the commit hash a branch or tag pointed to
//!     blobs/{etag}                     a whole file, named by its ETag (X-Linked-Etag for LFS)
//!     snapshots/{commit}/{file}        -> ../../blobs/{etag} (a relative symlink; a copy where
//!                                         symlinks cannot be made)
//!     .no_exist/{commit}/{file}        empty: the Hub said the file does not exist
//!     vramplan-headers/{commit}/{file} vramplan's own: the first 8 + N bytes of a safetensors
//!                                      file (its length prefix and JSON header), never a blob
//!     vramplan-headers/{commit}/{file}.size   that file's total size in bytes, in decimal
//! ```
//!
//! Header pieces are not whole files, so they never go to `blobs/` or `snapshots/`, where
//! `huggingface_hub` would take them for the file. Every write goes through a temporary file in
//! the same folder and a rename, so a reader never sees half a file.

use crate::HubError;
use std::path::{Path, PathBuf};

/// `constants.REPO_ID_SEPARATOR`.
const SEPARATOR: &str = "--";
/// vramplan's own folder inside a repository's cache folder.
pub const HEADERS: &str = "vramplan-headers";

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
}

/// Whether `revision` is a full commit hash (`file_download.REGEX_COMMIT_HASH`).
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl RepoCache {
    /// The folder of model repository `repo` (`org/name`) in cache `cache`:
    /// `models--org--name` (`file_download.repo_folder_name`).
    pub fn new(cache: &Path, repo: &str) -> RepoCache {
        let name = std::iter::once("models").chain(repo.split('/')).collect::<Vec<_>>().join(SEPARATOR);
        RepoCache { root: cache.join(name) }
    }

    /// The repository's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The commit `revision` stands for, as far as the cache knows: a commit hash itself, else
    /// what `refs/{revision}` holds.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let text = String::from_utf8(read_cached(&self.root.join("refs").join(revision))?).ok()?;
        let commit = text.trim();
        (!commit.is_empty()).then(|| commit.to_string())
    }

    /// Records that `revision` points at `commit` (`_cache_commit_hash_for_specific_revision`:
    /// nothing for a commit hash, nothing when already so).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit || self.commit_of(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        write_atomic(&self.root.join("refs").join(revision), commit.as_bytes())
    }

    /// `snapshots/{commit}/{file}` when it is there (a whole file).
    pub fn snapshot_file(&self, commit: &str, file: &str) -> Option<PathBuf> {
        let path = self.root.join("snapshots").join(commit).join(file);
        path.is_file().then_some(path)
    }

    /// Stores a whole file: `blobs/{etag}`, then `snapshots/{commit}/{file}` pointing at it.
    pub fn store_file(
        &self,
        commit: &str,
        file: &str,
        etag: &str,
        bytes: &[u8],
    ) -> Result<PathBuf, HubError> {
        let blob = self.root.join("blobs").join(etag);
        if !blob.is_file() {
            write_atomic(&blob, bytes)?;
        }
        let pointer = self.root.join("snapshots").join(commit).join(file);
        let folder = pointer.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&folder).map_err(|e| cache_error(&folder, &e))?;
        let _ = std::fs::remove_file(&pointer);
        // `../../blobs/{etag}` from `snapshots/{commit}/`, one more `..` per folder in `file`.
        let depth = 2 + file.matches('/').count();
        let target = PathBuf::from("../".repeat(depth)).join("blobs").join(etag);
        if !symlink(&target, &pointer) {
            // As huggingface_hub does where symlinks are not supported: a copy.
            write_atomic(&pointer, bytes)?;
        }
        Ok(pointer)
    }

    /// Whether the Hub said `file` does not exist at `commit` (`.no_exist/{commit}/{file}`).
    pub fn known_missing(&self, commit: &str, file: &str) -> bool {
        self.root.join(".no_exist").join(commit).join(file).is_file()
    }

    /// Records that `file` does not exist at `commit`, as huggingface_hub does.
    pub fn mark_missing(&self, commit: &str, file: &str) -> Result<(), HubError> {
        write_atomic(&self.root.join(".no_exist").join(commit).join(file), b"")
    }

    /// A cached safetensors header: the file's first bytes and its total size.
    pub fn header(&self, commit: &str, file: &str) -> Option<(Vec<u8>, u64)> {
        let path = self.root.join(HEADERS).join(commit).join(file);
        let size = String::from_utf8(read_cached(&sidecar(&path))?).ok()?.trim().parse().ok()?;
        let bytes = read_cached(&path)?;
        Some((bytes, size))
    }

    /// Keeps a safetensors header (the file's first `bytes`, and its total size) in
    /// `vramplan-headers/`. The size is written first: a header file is only ever there with it.
    pub fn store_header(
        &self,
        commit: &str,
        file: &str,
        bytes: &[u8],
        size: u64,
    ) -> Result<PathBuf, HubError> {
        let path = self.root.join(HEADERS).join(commit).join(file);
        write_atomic(&sidecar(&path), size.to_string().as_bytes())?;
        write_atomic(&path, bytes)?;
        Ok(path)
    }

    /// Every file the cache holds for `commit`, whole (`snapshots/`) or as a header
    /// (`vramplan-headers/`), as repository paths, sorted; empty when the cache has nothing.
    pub fn files(&self, commit: &str) -> Vec<String> {
        let mut out = Vec::new();
        list(&self.root.join("snapshots").join(commit), "", &mut out);
        let mut headers = Vec::new();
        list(&self.root.join(HEADERS).join(commit), "", &mut headers);
        out.extend(headers.into_iter().filter_map(|name| name.strip_suffix(".size").map(str::to_string)));
        out.sort();
        out.dedup();
        out
    }
}

/// `{path}.size`.
fn sidecar(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".size");
    path.with_file_name(name)
}

/// Files under `folder`, recursively, as `/`-joined paths after `prefix`.
fn list(folder: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(folder) else { return };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let full = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        if path.is_dir() {
            list(&path, &full, out);
        } else if path.is_file() {
            out.push(full);
        }
    }
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> bool {
    std::os::unix::fs::symlink(target, link).is_ok()
}

#[cfg(not(unix))]
fn symlink(_target: &Path, _link: &Path) -> bool {
    false
}

fn cache_error(path: &Path, e: &std::io::Error) -> HubError {
    HubError::Cache { path: path.to_path_buf(), detail: e.to_string() }
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), HubError> {
    let folder = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(folder).map_err(|e| cache_error(folder, &e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let unique =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let temp = folder.join(format!(".{name}.{}.{unique}.incomplete", std::process::id()));
    let result = std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, path));
    result.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        cache_error(path, &e)
    })
}

/// The bytes of a file of the cache, if it is a regular file of at most [`crate::MAX_HEADER`]
/// bytes (the largest thing kept there); anything else is read as not cached. A FIFO or device
/// put in the cache would otherwise block the read (`vramplan_profiles::files` refuses them in a
/// user's input the same way).
fn read_cached(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let meta = std::fs::metadata(path).ok().filter(|m| m.is_file() && m.len() <= crate::MAX_HEADER)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    std::fs::File::open(path).ok()?.take(crate::MAX_HEADER).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn folder_names_and_commits_follow_huggingface_hub() {
        let cache = RepoCache::new(Path::new("/c"), "meta-llama/Llama-3.1-8B");
        assert_eq!(cache.root(), Path::new("/c/models--meta-llama--Llama-3.1-8B"));
        assert!(is_commit(COMMIT));
        assert!(!is_commit("main"));
        assert!(!is_commit(&COMMIT.to_uppercase()));
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_in_the_cache_is_read_as_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(dir.path(), "org/name");
        std::fs::create_dir_all(cache.root().join("refs")).unwrap();
        let fifo = cache.root().join("refs/main");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        // Opening it would wait for a writer for ever.
        assert_eq!(cache.commit_of("main"), None);
    }

    #[test]
    fn whole_files_are_blobs_behind_relative_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(dir.path(), "org/name");
        assert_eq!(cache.commit_of("main"), None);
        cache.write_ref("main", COMMIT).unwrap();
        assert_eq!(std::fs::read_to_string(cache.root().join("refs/main")).unwrap(), COMMIT);
        assert_eq!(cache.commit_of("main").as_deref(), Some(COMMIT));
        assert_eq!(cache.commit_of(COMMIT).as_deref(), Some(COMMIT));
        let pointer = cache.store_file(COMMIT, "config.json", "abc123", b"{}").unwrap();
        assert_eq!(pointer, cache.root().join("snapshots").join(COMMIT).join("config.json"));
        assert_eq!(std::fs::read(cache.root().join("blobs/abc123")).unwrap(), b"{}");
        #[cfg(unix)]
        assert_eq!(std::fs::read_link(&pointer).unwrap(), Path::new("../../blobs/abc123"));
        assert_eq!(std::fs::read(&pointer).unwrap(), b"{}");
        let nested = cache.store_file(COMMIT, "sub/x.json", "def", b"1").unwrap();
        #[cfg(unix)]
        assert_eq!(std::fs::read_link(&nested).unwrap(), Path::new("../../../blobs/def"));
        assert_eq!(std::fs::read(&nested).unwrap(), b"1");
        assert_eq!(cache.snapshot_file(COMMIT, "config.json"), Some(pointer));
        assert_eq!(cache.snapshot_file(COMMIT, "other.json"), None);
        cache.mark_missing(COMMIT, "generation_config.json").unwrap();
        assert!(cache.known_missing(COMMIT, "generation_config.json"));
        assert!(cache.root().join(".no_exist").join(COMMIT).join("generation_config.json").is_file());
    }

    #[test]
    fn headers_live_apart_from_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(dir.path(), "org/name");
        cache.store_header(COMMIT, "model.safetensors", b"\x02\0\0\0\0\0\0\0{}", 1234).unwrap();
        assert_eq!(cache.header(COMMIT, "model.safetensors"), Some((b"\x02\0\0\0\0\0\0\0{}".to_vec(), 1234)));
        assert!(!cache.root().join("blobs").exists());
        assert!(!cache.root().join("snapshots").exists());
        cache.store_file(COMMIT, "config.json", "e1", b"{}").unwrap();
        assert_eq!(cache.files(COMMIT), ["config.json", "model.safetensors"]);
        assert!(cache.files("f".repeat(40).as_str()).is_empty());
    }
}
