//! Writing output files all-or-nothing: each file goes to a temporary name in its own folder and
//! is renamed into place, so nothing half-written is ever left at a path; a group of files (a
//! report and its drawings, an export and its launch script) is renamed into place together,
//! and where one rename fails the files already renamed are put back as they were, so the old
//! files are unchanged and nothing new is left beside them.

use std::path::{Path, PathBuf};
use vramplan_api::InputError;

/// Writes `bytes` to `path` atomically ([`write_all_atomic`] with one file).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), InputError> {
    write_all_atomic(&[(path, bytes)])
}

/// Writes every `(path, bytes)` of `files`, all or none: on an error no file of the group has
/// changed and no temporary file is left.
pub(crate) fn write_all_atomic(files: &[(&Path, &[u8])]) -> Result<(), InputError> {
    let fail = |path: &Path, e: &std::io::Error| {
        InputError::io(path, e).with_fix("write to a folder that exists and that you can write to")
    };
    // Every file written under a temporary name first.
    let mut temps: Vec<PathBuf> = Vec::with_capacity(files.len());
    for (path, bytes) in files {
        let temp = beside(path, "tmp");
        if let Err(e) = std::fs::write(&temp, bytes) {
            let _ = std::fs::remove_file(&temp);
            remove_all(&temps);
            return Err(fail(path, &e));
        }
        // A file replaced keeps its mode (a launch script made executable stays so).
        if let Some(old) = std::fs::metadata(path).ok().filter(|m| m.is_file()) {
            let _ = std::fs::set_permissions(&temp, old.permissions());
        }
        temps.push(temp);
    }
    // Then each into place, the file it replaces kept aside until all are in place.
    let mut done: Vec<(&Path, Option<PathBuf>)> = Vec::with_capacity(files.len());
    for ((path, _), temp) in files.iter().zip(&temps) {
        // A file or a link is kept aside; a folder is not, and the rename onto it fails.
        let kept = if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_dir()) {
            let kept = beside(path, "old");
            if let Err(e) = std::fs::rename(path, &kept) {
                undo(&done);
                remove_all(&temps);
                return Err(fail(path, &e));
            }
            Some(kept)
        } else {
            None
        };
        if let Err(e) = std::fs::rename(temp, path) {
            if let Some(kept) = &kept {
                let _ = std::fs::rename(kept, path);
            }
            undo(&done);
            remove_all(&temps);
            return Err(fail(path, &e));
        }
        done.push((path, kept));
    }
    for (_, kept) in &done {
        if let Some(kept) = kept {
            let _ = std::fs::remove_file(kept);
        }
    }
    Ok(())
}

/// `.NAME.PID.SUFFIX` in `path`'s folder.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    folder.join(format!(".{name}.{}.{suffix}", std::process::id()))
}

/// Puts back what `done` renamed into place: the kept file where there was one, else nothing.
fn undo(done: &[(&Path, Option<PathBuf>)]) {
    for (path, kept) in done.iter().rev() {
        match kept {
            Some(kept) => {
                let _ = std::fs::rename(kept, path);
            }
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn remove_all(paths: &[PathBuf]) {
    for path in paths {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_group_that_fails_part_way_leaves_the_old_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("r.md"), "old report").unwrap();
        std::fs::write(d.join("r-a.svg"), "old a").unwrap();
        // The third file's path is a folder: its rename fails after the first two.
        std::fs::create_dir(d.join("r-c.svg")).unwrap();
        let files: [(&Path, &[u8]); 4] = [
            (&d.join("r-a.svg"), b"new a"),
            (&d.join("r-b.svg"), b"new b"),
            (&d.join("r-c.svg"), b"new c"),
            (&d.join("r.md"), b"new report"),
        ];
        assert!(write_all_atomic(&files).is_err());
        assert_eq!(listing(d), ["r-a.svg", "r-c.svg", "r.md"]);
        assert_eq!(std::fs::read_to_string(d.join("r.md")).unwrap(), "old report");
        assert_eq!(std::fs::read_to_string(d.join("r-a.svg")).unwrap(), "old a");
    }

    #[test]
    fn a_group_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("r.md"), "old report").unwrap();
        let files: [(&Path, &[u8]); 2] = [(&d.join("r-a.svg"), b"new a"), (&d.join("r.md"), b"new report")];
        write_all_atomic(&files).unwrap();
        assert_eq!(listing(d), ["r-a.svg", "r.md"]);
        assert_eq!(std::fs::read_to_string(d.join("r.md")).unwrap(), "new report");
    }

    /// A launch script the user made executable stays executable when it is written again.
    #[test]
    fn a_replaced_file_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("serve.sh");
        std::fs::write(&script, "old").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        write_all_atomic(&[(&script, b"new")]).unwrap();
        let mode = std::fs::metadata(&script).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
    }
}
