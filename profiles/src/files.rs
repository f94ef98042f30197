//! The one way every input file is read: the path must name a regular file (symlinks followed)
//! before it is opened, since opening a FIFO waits for a writer and reading a device never ends,
//! and no more than a bound per kind of file is read (docs/limits.md, "Input files").
//!
//! Every reader of a user's file (a hardware profile, a workload, a device map, a plan, a model's
//! `config.json` and shards, a price table, an expert-load file, a validation result, a trace)
//! goes through [`read_text`], or through [`open`] where only a header at the file's start is
//! read (safetensors, GGUF), each reader bounding what it reads there. No input is read from a
//! stream: none is documented as accepting one.

use crate::InputError;
use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// What a file is, for its bound and for the words of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A model repository's small JSON files: `config.json`, `preprocessor_config.json`,
    /// `model.safetensors.index.json`.
    ModelJson,
    /// A safetensors file, of which only the header is read.
    Safetensors,
    /// A GGUF file, of which only the header is read.
    Gguf,
    /// A custom-model YAML file.
    CustomModel,
    /// A hardware profile YAML file.
    Hardware,
    /// A price table (`--prices`).
    Prices,
    /// A workload YAML file (`--workload`).
    Workload,
    /// A device map JSON file (`--device-map`).
    DeviceMap,
    /// A plan file written by `plan -o` (`--plan`, `validate`).
    Plan,
    /// A validation result written by `validate --json` (`--measured`).
    Measured,
    /// An expert-load JSON file (`--expert-load`).
    ExpertLoad,
    /// A trace written by `validate --script --trace-out` (`--trace`, `--activations`).
    Trace,
    /// A Python script run by `validate --script` (only checked here; Python reads it).
    Script,
}

impl FileKind {
    /// The file in words, as a message says what was expected ("a hardware profile YAML").
    pub fn what(self) -> &'static str {
        match self {
            FileKind::ModelJson => "a model's JSON file (config.json or a checkpoint index)",
            FileKind::Safetensors => "a safetensors file",
            FileKind::Gguf => "a GGUF file",
            FileKind::CustomModel => "a custom-model YAML file",
            FileKind::Hardware => "a hardware profile YAML file",
            FileKind::Prices => "a price table YAML file",
            FileKind::Workload => "a workload YAML file",
            FileKind::DeviceMap => "a device_map JSON file",
            FileKind::Plan => "a plan file (`vramplan plan -o plan.yaml`)",
            FileKind::Measured => "a validation result (`vramplan validate --json`)",
            FileKind::ExpertLoad => "an expert-load JSON file",
            FileKind::Trace => "a trace file (`vramplan validate --script --trace-out`)",
            FileKind::Script => "a Python script",
        }
    }

    /// The most bytes read of such a file (for safetensors and GGUF, of its header); each bound
    /// and its reason is in docs/limits.md, "Input files".
    pub const fn max_bytes(self) -> u64 {
        const MIB: u64 = 1 << 20;
        match self {
            // The bound the Hub reads a repository's small files with: one for both places.
            FileKind::ModelJson => vramplan_hub::MAX_FILE,
            // The safetensors library's own bound on a header.
            FileKind::Safetensors => vramplan_hub::MAX_HEADER,
            // The largest tokenizers (256k tokens with scores and merges) take tens of MiB.
            FileKind::Gguf => 256 * MIB,
            FileKind::CustomModel | FileKind::DeviceMap | FileKind::Plan | FileKind::Measured => 64 * MIB,
            // A script is not read here (Python reads it); its bound is not applied.
            FileKind::Hardware | FileKind::ExpertLoad | FileKind::Script => 16 * MIB,
            FileKind::Prices | FileKind::Workload => MIB,
            FileKind::Trace => 256 * MIB,
        }
    }
}

/// Refuses `path` unless it names a regular file (after following symlinks), before anything
/// opens it; returns its metadata.
pub fn check_regular(path: &Path, kind: FileKind) -> Result<Metadata, InputError> {
    let meta = std::fs::metadata(path).map_err(|e| InputError::io(path, &e).with_fix(give(kind)))?;
    if meta.is_file() {
        return Ok(meta);
    }
    Err(InputError::new(path.display().to_string(), format!("is {}, not a file", special_kind(&meta)))
        .with_fix(format!(
            "{}; vramplan reads its inputs whole, so save what a pipe or device gives to a file first",
            give(kind)
        )))
}

/// Opens `path` for reading once [`check_regular`] accepts it, for readers that read only a
/// header at its start (safetensors, GGUF) and bound that read themselves.
pub fn open(path: &Path, kind: FileKind) -> Result<(File, u64), InputError> {
    check_regular(path, kind)?;
    let file = File::open(path).map_err(|e| InputError::io(path, &e).with_fix(give(kind)))?;
    // Checked again on the open file: the path may have been replaced in between.
    let meta = file.metadata().map_err(|e| InputError::io(path, &e))?;
    if !meta.is_file() {
        return Err(InputError::new(
            path.display().to_string(),
            format!("is {}, not a file", special_kind(&meta)),
        )
        .with_fix(give(kind)));
    }
    Ok((file, meta.len()))
}

/// Reads the whole of `path` as UTF-8 text: refused unless it is a regular file, larger than
/// [`FileKind::max_bytes`], or not UTF-8.
pub fn read_text(path: &Path, kind: FileKind) -> Result<String, InputError> {
    let (file, len) = open(path, kind)?;
    let shown = path.display().to_string();
    let cap = kind.max_bytes();
    let too_large = |size: &str| {
        InputError::new(&shown, format!("is {size}, more than the {} bytes read of {}", cap, kind.what()))
            .with_fix(format!("give {} (docs/limits.md has the bound on each input file)", kind.what()))
    };
    if len > cap {
        return Err(too_large(&format!("{len} bytes")));
    }
    let mut bytes = Vec::new();
    // A file that grows while it is read is still read no further than the bound.
    file.take(cap + 1).read_to_end(&mut bytes).map_err(|e| InputError::io(path, &e).with_fix(give(kind)))?;
    if bytes.len() as u64 > cap {
        return Err(too_large(&format!("over {cap} bytes (it grew while it was read)")));
    }
    String::from_utf8(bytes).map_err(|e| {
        InputError::new(
            &shown,
            format!("is not UTF-8 text (invalid at byte {})", e.utf8_error().valid_up_to()),
        )
        .with_fix(give(kind))
    })
}

/// "give the path of KIND".
fn give(kind: FileKind) -> String {
    format!("give the path of {}", kind.what())
}

/// What a path that is not a regular file is, in words.
fn special_kind(meta: &Metadata) -> &'static str {
    if meta.is_dir() {
        return "a folder";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    "not a regular file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_text(dir.path(), FileKind::Workload).unwrap_err();
        assert_eq!(err.origin, dir.path().display().to_string());
        assert_eq!(err.problem, "is a folder, not a file");
        assert!(err.fix.unwrap().contains("a workload YAML file"));
    }

    #[test]
    fn a_file_past_its_bound_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.yaml");
        let file = File::create(&path).unwrap();
        file.set_len(FileKind::Workload.max_bytes() + 1).unwrap();
        let err = read_text(&path, FileKind::Workload).unwrap_err();
        assert!(err.problem.contains("1048577 bytes, more than the 1048576"), "{}", err.problem);
    }

    #[test]
    fn text_within_the_bound_is_read_and_other_bytes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.yaml");
        std::fs::write(&path, "batch: 2\n").unwrap();
        assert_eq!(read_text(&path, FileKind::Workload).unwrap(), "batch: 2\n");
        std::fs::write(&path, b"batch: \xff\n").unwrap();
        let err = read_text(&path, FileKind::Workload).unwrap_err();
        assert!(err.problem.contains("not UTF-8 text (invalid at byte 7)"), "{}", err.problem);
    }
}
