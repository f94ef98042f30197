//! Element types of tensors: the safetensors dtypes plus 4-bit storage, with their sizes in bits
//! and the spellings people use for them (`bf16`, `bfloat16`, `torch.bfloat16`, `BF16`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    /// float8 e4m3 (`torch.float8_e4m3fn`), the usual fp8 weight format.
    F8E4M3,
    F8E5M2,
    /// float8 e8m0, the shared exponent of MX formats.
    F8E8M0,
    /// 4-bit floating point (e2m1), the element of MXFP4 / NVFP4.
    F4,
    I64,
    I32,
    I16,
    I8,
    U64,
    U32,
    U16,
    U8,
    /// 4-bit integer storage (int4 / nf4 / fp4 packed two to a byte).
    I4,
    Bool,
}

impl DType {
    /// Size of one element in bits.
    pub fn bits(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E8M0 | DType::I8 | DType::U8 | DType::Bool => 8,
            DType::F4 | DType::I4 => 4,
        }
    }

    /// Bytes taken by `elements` values, rounded up to whole bytes.
    pub fn bytes_for(self, elements: u64) -> u64 {
        let bytes = (u128::from(elements) * u128::from(self.bits())).div_ceil(8);
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// True for the floating-point types a `torch_dtype` cast applies to.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }

    /// The safetensors header spelling (`BF16`, `F8_E4M3`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F64 => "F64",
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E8M0 => "F8_E8M0",
            DType::F4 => "F4",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::I16 => "I16",
            DType::I8 => "I8",
            DType::U64 => "U64",
            DType::U32 => "U32",
            DType::U16 => "U16",
            DType::U8 => "U8",
            DType::I4 => "I4",
            DType::Bool => "BOOL",
        }
    }

    /// torch's name (`torch.bfloat16` without the module), for the Python vramplan prints.
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E8M0 => "float8_e8m0fnu",
            DType::F4 => "float4_e2m1fn_x2",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U64 => "uint64",
            DType::U32 => "uint32",
            DType::U16 => "uint16",
            DType::U8 => "uint8",
            // torch has no 4-bit integer dtype; bitsandbytes packs two values in a uint8.
            DType::I4 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// The short name vramplan prints (`bf16`, `fp8_e4m3`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "fp64",
            DType::F32 => "fp32",
            DType::F16 => "fp16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "fp8_e4m3",
            DType::F8E5M2 => "fp8_e5m2",
            DType::F8E8M0 => "fp8_e8m0",
            DType::F4 => "fp4",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U64 => "uint64",
            DType::U32 => "uint32",
            DType::U16 => "uint16",
            DType::U8 => "uint8",
            DType::I4 => "int4",
            DType::Bool => "bool",
        }
    }

    /// Parses any common spelling: vramplan's (`bf16`), torch's (`bfloat16`, `torch.float16`),
    /// safetensors' (`BF16`, `F8_E4M3`). Case-insensitive.
    pub fn parse(text: &str) -> Option<DType> {
        let lower = text.trim().to_ascii_lowercase();
        let name = lower.strip_prefix("torch.").unwrap_or(&lower);
        Some(match name {
            "fp64" | "f64" | "float64" | "double" => DType::F64,
            "fp32" | "f32" | "float32" | "float" => DType::F32,
            "fp16" | "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "fp8" | "f8" | "fp8_e4m3" | "f8_e4m3" | "float8_e4m3fn" | "float8_e4m3" | "e4m3" => DType::F8E4M3,
            "fp8_e5m2" | "f8_e5m2" | "float8_e5m2" | "e5m2" => DType::F8E5M2,
            "fp8_e8m0" | "f8_e8m0" | "float8_e8m0fnu" | "e8m0" => DType::F8E8M0,
            "fp4" | "f4" | "float4_e2m1fn_x2" | "mxfp4" | "e2m1" => DType::F4,
            "int64" | "i64" | "long" => DType::I64,
            "int32" | "i32" | "int" => DType::I32,
            "int16" | "i16" | "short" => DType::I16,
            "int8" | "i8" => DType::I8,
            "uint64" | "u64" => DType::U64,
            "uint32" | "u32" => DType::U32,
            "uint16" | "u16" => DType::U16,
            "uint8" | "u8" => DType::U8,
            "int4" | "i4" | "nf4" | "4bit" => DType::I4,
            "bool" => DType::Bool,
            _ => return None,
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
    fn sizes_round_up_to_bytes() {
        assert_eq!(DType::BF16.bytes_for(3), 6);
        assert_eq!(DType::I4.bytes_for(3), 2);
        assert_eq!(DType::F32.bytes_for(1), 4);
    }
}
