//! Where a workload check's error came from. The checks ([`super::validate`]) see the merged
//! workload (a file or a plan's, the flags over it) and name a key of it under the origin
//! `workload`; this puts such an error in the file that set the key, at the key's line, unless a
//! flag set it.

use super::WorkloadFlags;
use crate::workload::Workload;
use std::path::Path;
use vramplan_profiles::files::{self, FileKind};
use vramplan_profiles::{InputError, Location};

/// The origin the checks give their errors.
const CHECKS_ORIGIN: &str = "workload";

/// Where the workload under the flags came from.
#[derive(Debug, Clone, Copy)]
pub enum WorkloadSource<'a> {
    /// The defaults.
    Defaults,
    /// A workload YAML file (`--workload FILE`): its keys at the top level.
    File(&'a Path),
    /// A plan file's `workload` (`--plan FILE`, `validate FILE`).
    Plan(&'a Path),
}

/// `err`, from the checks of the workload `flags` made of `base` (read from `source`), placed
/// in `source`: a key the flags left as `base` has it is reported in the file (with its line,
/// when the file writes it); other errors are returned as they are.
pub fn place_check_error(
    err: InputError,
    base: &Workload,
    flags: &WorkloadFlags,
    source: WorkloadSource,
) -> InputError {
    let Some(Location::Key(key)) = &err.location else { return err };
    if err.origin != CHECKS_ORIGIN {
        return err;
    }
    let (path, prefix, kind) = match source {
        WorkloadSource::Defaults => return err,
        WorkloadSource::File(path) => (path, "", FileKind::Workload),
        WorkloadSource::Plan(path) => (path, "workload.", FileKind::Plan),
    };
    if set_by_flags(key, base, flags) {
        return err;
    }
    let full_key = format!("{prefix}{key}");
    let problem = if err.problem.contains(&format!("`{key}`")) {
        err.problem.clone()
    } else {
        format!("`{key}`: {}", err.problem)
    };
    let mut placed = InputError::new(path.display().to_string(), problem).at_key(&full_key);
    placed.fix = err.fix.clone();
    match files::read_text(path, kind).ok().and_then(|text| key_line(&text, &full_key)) {
        Some((line, column)) => placed.at_line(line, column),
        None => placed,
    }
}

/// Whether the flags change the value at `key` (a dotted key path, `engine.n_ctx`) of `base`.
fn set_by_flags(key: &str, base: &Workload, flags: &WorkloadFlags) -> bool {
    let Ok(merged) = flags.apply(base.clone()) else { return true };
    let pointer: String = segments(key).map(|s| format!("/{s}")).collect();
    let value = |w: &Workload| serde_json::to_value(w).ok().map(|v| v.pointer(&pointer).cloned());
    value(base) != value(&merged)
}

/// The segments of a dotted key path, list indices (`[2]`) left out.
fn segments(key: &str) -> impl Iterator<Item = &str> {
    key.split('.').map(|s| s.split('[').next().unwrap_or(s).trim())
}

/// The 1-based line and column of the dotted `key` in block-style YAML `text`: the line of its
/// last segment written there (a parent whose value is a flow mapping `{...}` on one line
/// stands for what is inside it); `None` when its first segment is not a top-level key.
pub fn key_line(text: &str, key: &str) -> Option<(u64, u64)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found: Option<(u64, u64)> = None;
    // Where the current parent's block starts, and the parent's indentation.
    let (mut from, mut parent) = (0usize, None::<usize>);
    for segment in segments(key) {
        let mut child_indent = None;
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().skip(from) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("---") {
                continue;
            }
            let indent = line.len() - trimmed.len();
            if parent.is_some_and(|p| indent <= p) {
                break;
            }
            let child = *child_indent.get_or_insert(indent);
            if indent != child {
                continue;
            }
            if let Some(rest) = trimmed.strip_prefix(segment).and_then(|r| r.trim_start().strip_prefix(':')) {
                hit = Some((i, indent, rest.trim_start().starts_with('{')));
                break;
            }
        }
        let Some((i, indent, flow)) = hit else { return found };
        found = Some((i as u64 + 1, indent as u64 + 1));
        if flow {
            return found;
        }
        (from, parent) = (i + 1, Some(indent));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_at_their_lines() {
        let text = "# a workload\nmode: inference\nbatch: 0\nengine:\n  kind: vllm\n  max_num_batched_tokens: 0\n\
                    quant: {kind: gptq, group_size: 0}\nworkload:\n  batch: 3\n";
        assert_eq!(key_line(text, "batch"), Some((3, 1)));
        assert_eq!(key_line(text, "engine.max_num_batched_tokens"), Some((6, 3)));
        // Not written: the parent's line.
        assert_eq!(key_line(text, "engine.n_ctx"), Some((4, 1)));
        // Inside a flow mapping: the line that holds it.
        assert_eq!(key_line(text, "quant.group_size"), Some((7, 1)));
        assert_eq!(key_line(text, "workload.batch"), Some((9, 3)));
        assert_eq!(key_line(text, "seq"), None);
        // `kind` is not a top-level key, though a line has it.
        assert_eq!(key_line(text, "kind"), None);
    }
}
