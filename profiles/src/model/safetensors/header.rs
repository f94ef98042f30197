//! Reading one safetensors file's header, and only its header: an 8-byte little-endian length
//! `N`, then `N` bytes of JSON naming every tensor with its dtype, shape and byte range in the
//! data section that follows. The data itself is never read.
//!
//! Every header is checked the way the safetensors library checks it on load: the length fits in
//! the file, the JSON parses, each dtype is known, each byte range holds exactly dtype × shape
//! bytes, ranges do not overlap and end inside the file.

use crate::files::{self, FileKind};
use crate::{DType, InputError};
use serde_json::{Map, Value};
use std::io::Read;
use std::path::Path;

/// The safetensors library refuses headers above 100 MB; so do we, before allocating (the bound
/// on safetensors files in `crate::files`, the Hub's too).
const MAX_HEADER_BYTES: u64 = crate::files::FileKind::Safetensors.max_bytes();

/// One tensor entry of a header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeaderTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// A parsed header: its tensors (in the header's key order, which serde_json sorts by name).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardHeader {
    pub tensors: Vec<HeaderTensor>,
}

/// Reads and checks the header of the safetensors file at `path`.
pub(crate) fn read_header(path: &Path) -> Result<ShardHeader, InputError> {
    let origin = path.display().to_string();
    let (mut file, file_len) = files::open(path, FileKind::Safetensors)?;
    let mut start = Vec::with_capacity(8);
    (&mut file).take(8).read_to_end(&mut start).map_err(|e| InputError::io(path, &e))?;
    // The length is checked against the file before anything that size is allocated.
    let header_len = check_prefix(&start, file_len, &origin)?;
    (&mut file).take(header_len).read_to_end(&mut start).map_err(|e| InputError::io(path, &e))?;
    parse_file_start(&start, file_len, &origin)
}

/// Checks and parses the start of a safetensors file of `file_len` bytes: `bytes` holds its
/// 8-byte length prefix and the JSON header after it (what a range read of the file's first
/// bytes gives; more bytes are ignored).
pub(crate) fn parse_file_start(bytes: &[u8], file_len: u64, origin: &str) -> Result<ShardHeader, InputError> {
    let header_len = check_prefix(bytes, file_len, origin)?;
    let json = &bytes[8..];
    if (json.len() as u64) < header_len {
        return Err(InputError::new(
            origin,
            format!("the header says {header_len} bytes but only {} could be read", json.len()),
        )
        .with_fix("the file is truncated: download it again"));
    }
    parse_header(&json[..header_len as usize], file_len - 8 - header_len, origin)
}

/// The header length the first 8 bytes give, checked against the file's length and the
/// format's limit.
fn check_prefix(bytes: &[u8], file_len: u64, origin: &str) -> Result<u64, InputError> {
    let Some(prefix) = bytes.get(..8).filter(|_| file_len >= 8) else {
        return Err(InputError::new(
            origin,
            format!(
                "the file is {file_len} bytes, too short for a safetensors file (an 8-byte header \
                 length, then the JSON header)"
            ),
        )
        .with_fix("the file is truncated or not a safetensors file: download it again"));
    };
    let mut length_bytes = [0u8; 8];
    length_bytes.copy_from_slice(prefix);
    let header_len = u64::from_le_bytes(length_bytes);
    let after_prefix = file_len - 8;
    if header_len > after_prefix {
        return Err(InputError::new(
            origin,
            format!(
                "the header says {header_len} bytes but the file has only {after_prefix} after its \
                 8-byte length prefix"
            ),
        )
        .with_fix("the file is truncated or not a safetensors file: download it again"));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(InputError::new(
            origin,
            format!(
                "the header says {header_len} bytes, more than the {MAX_HEADER_BYTES} bytes the \
                 safetensors format allows"
            ),
        )
        .with_fix("the file is corrupt or not a safetensors file"));
    }
    Ok(header_len)
}

/// Parses header JSON whose data section is `data_len` bytes long.
pub(crate) fn parse_header(json: &[u8], data_len: u64, origin: &str) -> Result<ShardHeader, InputError> {
    let value: Value = serde_json::from_slice(json).map_err(|e| {
        let mut err = InputError::json(origin, &e);
        err.problem = format!("{} (in the JSON header, which starts at byte 8)", err.problem);
        err.with_fix("the file is corrupt or not a safetensors file: download it again")
    })?;
    let Value::Object(entries) = value else {
        return Err(InputError::new(origin, "the header is not a JSON object of tensors")
            .with_fix("the file is corrupt or not a safetensors file: download it again"));
    };
    if let Some(name) = crate::json_keys::repeated_key(json) {
        return Err(InputError::new(origin, format!("the header lists tensor `{name}` twice"))
            .at_key(name)
            .with_fix("the file is corrupt: download it again"));
    }
    let mut tensors = Vec::with_capacity(entries.len());
    let mut ranges = Vec::with_capacity(entries.len());
    for (name, entry) in &entries {
        if name == "__metadata__" {
            continue;
        }
        let (tensor, range) = parse_entry(name, entry, data_len, origin)?;
        tensors.push(tensor);
        ranges.push((range, name.as_str()));
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if let [((_, end), first), ((begin, _), second)] = pair
            && begin < end
        {
            return Err(InputError::new(
                origin,
                format!("tensors `{first}` and `{second}` overlap in the data section"),
            )
            .at_key(*second)
            .with_fix("the file is corrupt: download it again"));
        }
    }
    Ok(ShardHeader { tensors })
}

fn parse_entry(
    name: &str,
    entry: &Value,
    data_len: u64,
    origin: &str,
) -> Result<(HeaderTensor, (u64, u64)), InputError> {
    let fail = |problem: String| {
        Err(InputError::new(origin, problem)
            .at_key(name)
            .with_fix("the file is corrupt or not a safetensors file: download it again"))
    };
    let Value::Object(fields) = entry else {
        return fail("expected an object with `dtype`, `shape` and `data_offsets`".into());
    };
    let dtype_name = match fields.get("dtype") {
        Some(Value::String(s)) => s.as_str(),
        _ => return fail("missing or non-string `dtype`".into()),
    };
    let Some(dtype) = DType::from_safetensors(dtype_name) else {
        return Err(InputError::new(origin, format!("unknown dtype `{dtype_name}`")).at_key(name).with_fix(
            format!(
                "vramplan reads these safetensors dtypes: {}",
                DType::safetensors_names().collect::<Vec<_>>().join(", ")
            ),
        ));
    };
    let Some(shape) = integer_list(fields, "shape") else {
        return fail("`shape` must be a list of non-negative integers".into());
    };
    let Some(&[begin, end]) = integer_list(fields, "data_offsets").as_deref() else {
        return fail("`data_offsets` must be two non-negative integers [begin, end]".into());
    };
    let numel = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let expected = numel.and_then(|n| n.checked_mul(dtype.bits())).map(|bits| bits.div_ceil(8));
    let Some(expected) = expected else {
        return fail(format!("shape {shape:?} is too large to exist"));
    };
    if end < begin || end - begin != expected {
        return fail(format!(
            "data_offsets [{begin}, {end}] hold {} bytes, but {dtype_name} × {shape:?} needs {expected}",
            end.saturating_sub(begin)
        ));
    }
    if end > data_len {
        return Err(InputError::new(
            origin,
            format!(
                "tensor data ends at byte {end} of the data section but the file has only {data_len} \
                 bytes of data: the file is truncated"
            ),
        )
        .at_key(name)
        .with_fix("download the file again"));
    }
    Ok((HeaderTensor { name: name.to_string(), dtype, shape }, (begin, end)))
}

fn integer_list(fields: &Map<String, Value>, key: &str) -> Option<Vec<u64>> {
    match fields.get(key)? {
        Value::Array(items) => items.iter().map(Value::as_u64).collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_must_match_dtype_times_shape() {
        let ok =
            br#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"__metadata__":{"format":"pt"}}"#;
        let header = parse_header(ok, 12, "x").unwrap();
        assert_eq!(header.tensors[0].shape, [2, 3]);
        let short = br#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}}"#;
        let e = parse_header(short, 12, "x").unwrap_err().to_string();
        assert!(e.contains("needs 12"), "{e}");
        let overlap = br#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
        let e = parse_header(overlap, 6, "x").unwrap_err().to_string();
        assert!(e.contains("overlap"), "{e}");
    }

    #[test]
    fn a_file_start_is_checked_against_the_whole_files_length() {
        let json = br#"{"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}"#;
        let mut start = (json.len() as u64).to_le_bytes().to_vec();
        start.extend_from_slice(json);
        let total = start.len() as u64 + 12;
        assert_eq!(parse_file_start(&start, total, "x").unwrap().tensors[0].shape, [2, 3]);
        // Extra bytes after the header (a speculative range read) are ignored.
        let mut longer = start.clone();
        longer.extend_from_slice(&[0; 12]);
        assert_eq!(parse_file_start(&longer, total, "x").unwrap().tensors.len(), 1);
        let e = parse_file_start(&start, total - 1, "x").unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = parse_file_start(&start[..20], total, "x").unwrap_err().to_string();
        assert!(e.contains("only 12 could be read"), "{e}");
        let e = parse_file_start(&start[..4], total, "x").unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
    }
}
