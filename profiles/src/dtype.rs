//! Element types of tensors: the safetensors dtypes plus 4-bit storage, with their sizes in bits
//! and the spellings people use for them (`bf16`, `bfloat16`, `torch.bfloat16`, `BF16`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 64-bit IEEE float (`torch.float64`, safetensors `F64`), 8 bytes an element.
    F64,
    /// 32-bit IEEE float (`torch.float32`, safetensors `F32`), 4 bytes an element.
    F32,
    /// 16-bit IEEE half float (`torch.float16`, safetensors `F16`), 2 bytes an element.
    F16,
    /// bfloat16 (`torch.bfloat16`, safetensors `BF16`): float32's exponent range in 2 bytes.
    BF16,
    /// float8 e4m3 (`torch.float8_e4m3fn`), the usual fp8 weight format.
    F8E4M3,
    /// float8 e5m2 (`torch.float8_e5m2`): fp8 with more range and less precision than e4m3.
    F8E5M2,
    /// float8 e8m0, the shared exponent of MX formats.
    F8E8M0,
    /// 4-bit floating point (e2m1), the element of MXFP4 / NVFP4.
    F4,
    /// 64-bit signed integer (`torch.int64`), as in BERT's `position_ids` buffer.
    I64,
    /// 32-bit signed integer (`torch.int32`), the word GPTQ and AWQ pack 4-bit weights into.
    I32,
    /// 16-bit signed integer (`torch.int16`).
    I16,
    /// 8-bit signed integer (`torch.int8`), as in int8-quantized weights.
    I8,
    /// 64-bit unsigned integer (safetensors `U64`).
    U64,
    /// 32-bit unsigned integer (safetensors `U32`).
    U32,
    /// 16-bit unsigned integer (safetensors `U16`).
    U16,
    /// 8-bit unsigned integer (`torch.uint8`, safetensors `U8`); 4-bit weights packed in bytes
    /// are [`DType::I4`] instead.
    U8,
    /// 4-bit integer storage (int4 / nf4 / fp4 packed two to a byte).
    I4,
    /// Boolean (`torch.bool`, safetensors `BOOL`), one byte an element, as in GPT-2's causal-mask buffer.
    Bool,
    /// Complex of two float32 (`torch.complex64`, safetensors `C64`), 8 bytes an element, as in
    /// Llama 4's vision rotary buffer `freqs_ci`.
    C64,
    /// A block-quantized ggml type of a GGUF file (`Q4_K`, `Q8_0`, `IQ4_XS`): blocks of
    /// `block_size` weights in `type_size` bytes. GGUF's plain types are the variants above.
    Ggml(crate::GgmlType),
}

/// One dtype and every name it goes by: the one table the crate's names and sizes come from.
struct Row {
    dtype: DType,
    bits: u64,
    /// vramplan's short name first, then every other spelling [`DType::parse`] accepts (lower
    /// case, without `torch.`).
    names: &'static [&'static str],
    /// torch's name, without the module.
    torch: &'static str,
    /// The safetensors header's name; `None` where safetensors has no such dtype.
    safetensors: Option<&'static str>,
}

const fn row(
    dtype: DType,
    bits: u64,
    names: &'static [&'static str],
    torch: &'static str,
    safetensors: Option<&'static str>,
) -> Row {
    Row { dtype, bits, names, torch, safetensors }
}

/// Every dtype, in the order of [`DType`]'s variants.
const TABLE: &[Row] = &[
    row(DType::F64, 64, &["fp64", "f64", "float64", "double"], "float64", Some("F64")),
    row(DType::F32, 32, &["fp32", "f32", "float32", "float"], "float32", Some("F32")),
    row(DType::F16, 16, &["fp16", "f16", "float16", "half"], "float16", Some("F16")),
    row(DType::BF16, 16, &["bf16", "bfloat16"], "bfloat16", Some("BF16")),
    row(
        DType::F8E4M3,
        8,
        &["fp8_e4m3", "fp8", "f8", "f8_e4m3", "float8_e4m3fn", "float8_e4m3", "e4m3"],
        "float8_e4m3fn",
        Some("F8_E4M3"),
    ),
    row(DType::F8E5M2, 8, &["fp8_e5m2", "f8_e5m2", "float8_e5m2", "e5m2"], "float8_e5m2", Some("F8_E5M2")),
    row(
        DType::F8E8M0,
        8,
        &["fp8_e8m0", "f8_e8m0", "float8_e8m0fnu", "e8m0"],
        "float8_e8m0fnu",
        Some("F8_E8M0"),
    ),
    row(DType::F4, 4, &["fp4", "f4", "float4_e2m1fn_x2", "mxfp4", "e2m1"], "float4_e2m1fn_x2", Some("F4")),
    row(DType::I64, 64, &["int64", "i64", "long"], "int64", Some("I64")),
    row(DType::I32, 32, &["int32", "i32", "int"], "int32", Some("I32")),
    row(DType::I16, 16, &["int16", "i16", "short"], "int16", Some("I16")),
    row(DType::I8, 8, &["int8", "i8"], "int8", Some("I8")),
    row(DType::U64, 64, &["uint64", "u64"], "uint64", Some("U64")),
    row(DType::U32, 32, &["uint32", "u32"], "uint32", Some("U32")),
    row(DType::U16, 16, &["uint16", "u16"], "uint16", Some("U16")),
    row(DType::U8, 8, &["uint8", "u8"], "uint8", Some("U8")),
    // torch has no 4-bit integer dtype: bitsandbytes packs two values in a uint8, and
    // safetensors stores them so.
    row(DType::I4, 4, &["int4", "i4", "nf4", "4bit"], "uint8", None),
    row(DType::Bool, 8, &["bool"], "bool", Some("BOOL")),
    row(DType::C64, 64, &["complex64", "c64", "cfloat"], "complex64", Some("C64")),
];

impl DType {
    fn row(self) -> &'static Row {
        // Every variant but `Ggml` has its row (checked by a test), in variant order.
        TABLE.iter().find(|r| r.dtype == self).unwrap_or(&TABLE[0])
    }

    /// Size of one element in bits; for a ggml block type, its bits per weight rounded down
    /// (Q4_K 4, Q8_0 8), so comparisons such as "narrower than 16 bits" hold.
    pub fn bits(self) -> u64 {
        match self {
            DType::Ggml(ty) => 8 * ty.type_size() / ty.block_size(),
            _ => self.row().bits,
        }
    }

    /// Bytes taken by `elements` values, rounded up to whole bytes (for a ggml block type, whole
    /// blocks: `ggml_row_size` of one row of `elements`).
    pub fn bytes_for(self, elements: u64) -> u64 {
        if let DType::Ggml(ty) = self {
            return ty.row_bytes(elements);
        }
        let bytes = (u128::from(elements) * u128::from(self.bits())).div_ceil(8);
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// The dtype a GGUF tensor of type `ty` is held in: the plain ggml types as the matching
    /// variant, block-quantized ones as [`DType::Ggml`].
    pub fn from_ggml(ty: crate::GgmlType) -> DType {
        use crate::GgmlType as G;
        match ty {
            G::F32 => DType::F32,
            G::F16 => DType::F16,
            G::BF16 => DType::BF16,
            G::F64 => DType::F64,
            G::I8 => DType::I8,
            G::I16 => DType::I16,
            G::I32 => DType::I32,
            G::I64 => DType::I64,
            other => DType::Ggml(other),
        }
    }

    /// True for the floating-point types a `torch_dtype` cast applies to.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }

    /// The safetensors header spelling (`BF16`, `F8_E4M3`); `None` for 4-bit integer storage,
    /// which safetensors has no dtype for.
    pub fn safetensors_name(self) -> Option<&'static str> {
        match self {
            DType::Ggml(_) => None,
            _ => self.row().safetensors,
        }
    }

    /// The dtype a safetensors header names (`BF16`, exactly as written).
    pub fn from_safetensors(name: &str) -> Option<DType> {
        TABLE.iter().find(|r| r.safetensors == Some(name)).map(|r| r.dtype)
    }

    /// The names safetensors headers use, in the order of the variants.
    pub fn safetensors_names() -> impl Iterator<Item = &'static str> {
        TABLE.iter().filter_map(|r| r.safetensors)
    }

    /// torch's name (`torch.bfloat16` without the module), for the Python vramplan prints.
    pub fn torch_name(self) -> &'static str {
        match self {
            // transformers dequantizes GGUF files when it loads them; llama.cpp keeps the bytes.
            DType::Ggml(_) => "uint8",
            _ => self.row().torch,
        }
    }

    /// The short name vramplan prints (`bf16`, `fp8_e4m3`; ggml's for a ggml block type, `q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Ggml(ty) => ty.name(),
            _ => self.row().names[0],
        }
    }

    /// Parses any common spelling: vramplan's (`bf16`), torch's (`bfloat16`, `torch.float16`),
    /// safetensors' (`BF16`, `F8_E4M3`). Case-insensitive.
    pub fn parse(text: &str) -> Option<DType> {
        let lower = text.trim().to_ascii_lowercase();
        let name = lower.strip_prefix("torch.").unwrap_or(&lower);
        TABLE.iter().find(|r| r.names.contains(&name)).map(|r| r.dtype)
    }

    /// [`DType::parse`] for a value given as `origin` (a flag such as `--dtype`), refused with
    /// the accepted spellings.
    pub fn parse_input(origin: &str, text: &str) -> Result<DType, crate::InputError> {
        DType::parse(text).ok_or_else(|| {
            crate::InputError::new(origin, format!("unknown dtype `{text}`"))
                .with_fix(format!("use {}", DType::SPELLINGS))
        })
    }

    /// The spellings `parse` accepts, for error messages.
    pub const SPELLINGS: &'static str =
        "fp32, fp16, bf16, fp8 (e4m3), fp8_e5m2, int8, int4, or torch / safetensors names";
}

/// Serialized as its short name (`bf16`).
impl Serialize for DType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// Deserialized from any spelling [`DType::parse`] accepts.
impl<'de> Deserialize<'de> for DType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        DType::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("unknown dtype `{text}`; use {}", DType::SPELLINGS))
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::DType;

    #[test]
    fn spellings_agree() {
        for (text, dtype) in [
            ("bf16", DType::BF16),
            ("torch.bfloat16", DType::BF16),
            ("BF16", DType::BF16),
            ("float16", DType::F16),
            ("F8_E4M3", DType::F8E4M3),
            ("float8_e4m3fn", DType::F8E4M3),
            ("I32", DType::I32),
        ] {
            assert_eq!(DType::parse(text), Some(dtype), "{text}");
        }
        assert_eq!(DType::parse("fp12"), None);
    }

    #[test]
    fn the_table_has_every_dtype_once_and_names_parse_back() {
        use super::TABLE;
        for (i, row) in TABLE.iter().enumerate() {
            assert!(TABLE[..i].iter().all(|r| r.dtype != row.dtype), "{:?} twice", row.dtype);
            assert_eq!(row.dtype.row().dtype, row.dtype);
            assert_eq!(DType::parse(row.dtype.name()), Some(row.dtype));
            if let Some(name) = row.dtype.safetensors_name() {
                assert_eq!(DType::parse(name), Some(row.dtype), "{name}");
                assert_eq!(DType::from_safetensors(name), Some(row.dtype), "{name}");
            }
            if row.dtype != DType::I4 {
                assert_eq!(DType::parse(row.dtype.torch_name()), Some(row.dtype));
            }
        }
        assert_eq!(TABLE.len(), 19);
        assert_eq!(DType::from_safetensors("I4"), None);
        assert_eq!(DType::parse("uint8"), Some(DType::U8));
    }

    #[test]
    fn sizes_round_up_to_bytes() {
        assert_eq!(DType::BF16.bytes_for(3), 6);
        assert_eq!(DType::I4.bytes_for(3), 2);
        assert_eq!(DType::F32.bytes_for(1), 4);
    }
}
