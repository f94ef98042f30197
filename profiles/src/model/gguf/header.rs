//! Reading a GGUF file's header, and only its header: the magic `GGUF`, the version (2 or 3),
//! the metadata key/value pairs and the tensor infos (name, dimensions, ggml type, offset), as
//! `gguf_init_from_file` in ggml's `gguf.cpp` reads them. The tensor data is never read.
//!
//! The header is parsed from a prefix of the file; when the prefix ends inside the header the
//! parser says how much it has consumed ([`Parse::NeedMore`]) and the caller reads a longer one,
//! so a file on disk and a file on the Hub (read by HTTP ranges) go through the same code.
//! Checked as ggml checks it: known value and tensor types, at most 4 dimensions, rows that are
//! whole blocks, offsets aligned, in order and not overlapping, and the data inside the file
//! where its length is known.

use crate::GgmlType;
use std::collections::BTreeMap;

/// The most bytes a header may take (the bound on GGUF files in `crate::files`).
pub(crate) const MAX_HEADER_BYTES: u64 = crate::files::FileKind::Gguf.max_bytes();

/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// Any integer type (u8 … i64), widened.
    Int(i128),
    /// f32 or f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// A UTF-8 string (invalid UTF-8 is replaced).
    Str(String),
    /// An array; long arrays of numbers or strings (tokenizers) keep only their length.
    Array { len: u64, items: Vec<Value> },
}

impl Value {
    /// The value as a non-negative integer (the largest element of an integer array: per-layer
    /// head counts).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(n) => u64::try_from(*n).ok(),
            Value::Array { items, .. } if !items.is_empty() => {
                items.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>()?.into_iter().max()
            }
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor info.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorInfo {
    pub name: String,
    /// ggml's `ne`, innermost first (`[in_features, out_features]` for a linear's weight).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// From the start of the data section.
    pub offset: u64,
    /// Bytes in the file: whole rows of whole blocks.
    pub bytes: u64,
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Where the data section starts (the header, padded to the alignment).
    pub data_start: u64,
}

/// The outcome of parsing a prefix of a file.
#[derive(Debug)]
pub(crate) enum Parse {
    /// The whole header was in the prefix.
    Done(Header),
    /// The prefix ends inside the header: read at least this many bytes and parse again.
    NeedMore(u64),
}

/// What is wrong with a header: a sentence, and the byte offset where it was found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Invalid {
    pub offset: u64,
    pub problem: String,
}

/// Arrays longer than this keep only their length (a tokenizer's 150,000 tokens are not needed).
const KEPT_ARRAY_ITEMS: u64 = 4096;

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// Reading past the prefix: not an error yet.
struct Truncated;

enum Fail {
    Truncated,
    Invalid(Invalid),
}

impl From<Truncated> for Fail {
    fn from(_: Truncated) -> Fail {
        Fail::Truncated
    }
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], Truncated> {
        let n = usize::try_from(n).map_err(|_| Truncated)?;
        let end = self.at.checked_add(n).ok_or(Truncated)?;
        let slice = self.bytes.get(self.at..end).ok_or(Truncated)?;
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn offset(&self) -> u64 {
        self.at as u64
    }

    fn invalid(&self, problem: String) -> Fail {
        Fail::Invalid(Invalid { offset: self.offset(), problem })
    }

    /// A `gguf_string`: a u64 length, then that many bytes.
    fn string(&mut self) -> Result<String, Fail> {
        let len = self.u64()?;
        if len > MAX_HEADER_BYTES {
            return Err(self.invalid(format!("a string of {len} bytes, past the header bound")));
        }
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }

    fn value(&mut self, type_id: u32, depth: u32) -> Result<Value, Fail> {
        Ok(match type_id {
            0 => Value::Int(i128::from(self.array::<1>()?[0])),
            1 => Value::Int(i128::from(i8::from_le_bytes(self.array()?))),
            2 => Value::Int(i128::from(u16::from_le_bytes(self.array()?))),
            3 => Value::Int(i128::from(i16::from_le_bytes(self.array()?))),
            4 => Value::Int(i128::from(self.u32()?)),
            5 => Value::Int(i128::from(i32::from_le_bytes(self.array()?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.array()?))),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                other => return Err(self.invalid(format!("a bool of value {other}"))),
            },
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.invalid("an array nested in an array".into()));
                }
                let item_type = self.u32()?;
                let len = self.u64()?;
                if len > MAX_HEADER_BYTES {
                    return Err(self.invalid(format!("an array of {len} items, past the header bound")));
                }
                let mut items = Vec::new();
                for i in 0..len {
                    let item = self.value(item_type, depth + 1)?;
                    if i < KEPT_ARRAY_ITEMS {
                        items.push(item);
                    }
                }
                if len > KEPT_ARRAY_ITEMS {
                    items.clear();
                }
                Value::Array { len, items }
            }
            10 => Value::Int(i128::from(self.u64()?)),
            11 => Value::Int(i128::from(i64::from_le_bytes(self.array()?))),
            12 => Value::Float(f64::from_le_bytes(self.array()?)),
            other => return Err(self.invalid(format!("unknown metadata value type {other}"))),
        })
    }
}

/// Parses the header at the start of `prefix`; `file_len` is the whole file's length where known
/// (a local file, or a Hub file whose size the server gave), against which tensor data is checked.
pub(crate) fn parse(prefix: &[u8], file_len: Option<u64>) -> Result<Parse, Invalid> {
    let mut cursor = Cursor { bytes: prefix, at: 0 };
    match parse_inner(&mut cursor, file_len) {
        Ok(header) => Ok(Parse::Done(header)),
        Err(Fail::Truncated) => {
            let wanted = (prefix.len() as u64).saturating_mul(2).max(1 << 16);
            match file_len {
                Some(len) if prefix.len() as u64 >= len => {
                    Err(Invalid { offset: len, problem: "the file ends inside its header".into() })
                }
                _ if prefix.len() as u64 >= MAX_HEADER_BYTES => Err(Invalid {
                    offset: MAX_HEADER_BYTES,
                    problem: format!("the header is longer than {} MiB", MAX_HEADER_BYTES >> 20),
                }),
                Some(len) => Ok(Parse::NeedMore(wanted.min(len).min(MAX_HEADER_BYTES))),
                None => Ok(Parse::NeedMore(wanted.min(MAX_HEADER_BYTES))),
            }
        }
        Err(Fail::Invalid(invalid)) => Err(invalid),
    }
}

fn parse_inner(cursor: &mut Cursor, file_len: Option<u64>) -> Result<Header, Fail> {
    let magic = cursor.array::<4>()?;
    if &magic != b"GGUF" {
        return Err(Fail::Invalid(Invalid {
            offset: 0,
            problem: format!("the file starts with {magic:?}, not the GGUF magic `GGUF`"),
        }));
    }
    let version = cursor.u32()?;
    if !(2..=3).contains(&version) {
        return Err(cursor.invalid(format!(
            "GGUF version {version}; vramplan reads versions 2 and 3 (version 1 files predate August \
             2023 and ggml no longer reads them)"
        )));
    }
    let tensor_count = cursor.u64()?;
    let kv_count = cursor.u64()?;
    // Each tensor info and each pair take at least 8 bytes: counts past the bound are corrupt.
    if tensor_count > MAX_HEADER_BYTES / 8 || kv_count > MAX_HEADER_BYTES / 8 {
        return Err(cursor.invalid(format!(
            "{tensor_count} tensors and {kv_count} metadata pairs: more than a header can hold"
        )));
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..kv_count {
        let key = cursor.string()?;
        let type_id = cursor.u32()?;
        let value = cursor.value(type_id, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(cursor.invalid(format!("the metadata key `{key}` appears twice")));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(value) => match value.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return Err(cursor.invalid("`general.alignment` is not a power of two".into())),
        },
    };
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut names = std::collections::HashSet::new();
    for _ in 0..tensor_count {
        let name = cursor.string()?;
        let n_dims = cursor.u32()?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(
                cursor.invalid(format!("tensor `{name}` has {n_dims} dimensions; ggml allows 1 to 4"))
            );
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(cursor.u64()?);
        }
        let type_id = cursor.u32()?;
        let offset = cursor.u64()?;
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(
                cursor.invalid(format!("tensor `{name}` has ggml type {type_id}, which ggml does not have"))
            );
        };
        if dims[0] % ggml_type.block_size() != 0 {
            return Err(cursor.invalid(format!(
                "tensor `{name}` has rows of {} elements, not a whole number of {} blocks of {}",
                dims[0],
                ggml_type.name(),
                ggml_type.block_size()
            )));
        }
        let rows = dims[1..].iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let bytes = rows.and_then(|r| ggml_type.row_bytes(dims[0]).checked_mul(r));
        let Some(bytes) = bytes.filter(|&b| b < u64::MAX / 2) else {
            return Err(cursor.invalid(format!("tensor `{name}` has dimensions {dims:?} too large to hold")));
        };
        if offset % alignment != 0 {
            return Err(cursor.invalid(format!(
                "tensor `{name}` starts at offset {offset}, not a multiple of {alignment}"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(cursor.invalid(format!("the tensor `{name}` appears twice")));
        }
        tensors.push(TensorInfo { name, dims, ggml_type, offset, bytes });
    }
    let data_start = cursor.offset().div_ceil(alignment) * alignment;
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].bytes > pair[1].offset {
            return Err(cursor.invalid(format!(
                "tensors `{}` and `{}` overlap in the data section",
                pair[0].name, pair[1].name
            )));
        }
    }
    if let (Some(len), Some(last)) = (file_len, by_offset.last()) {
        let end = data_start + last.offset + last.bytes;
        if end > len {
            return Err(cursor.invalid(format!(
                "tensor `{}` ends at byte {end}, past the end of the {len}-byte file",
                last.name
            )));
        }
    }
    Ok(Header { version, metadata, tensors, data_start })
}
