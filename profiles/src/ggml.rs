//! The ggml tensor types: the element types of GGUF files, with their numbers in a GGUF header,
//! their block layouts and the names ggml prints. One table, which the GGUF reader
//! ([`crate::model::gguf`]), [`crate::DType::Ggml`] and the llama.cpp engine of `vramplan-sim` all
//! read.
//!
//! A block of `block_size` weights takes `type_size` bytes (`ggml-common.h`'s `block_*` structs;
//! `GGML_QUANT_SIZES` in the `gguf` Python package, which `profiles/tests/gguf.rs` checks this
//! table against). Plain types have blocks of one element.

use serde::Serialize;

/// A ggml tensor type.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum GgmlType {
    /// 32-bit float, 4 bytes a weight: what the converter writes norms, biases and routers in.
    F32,
    /// IEEE half precision, 2 bytes a weight: the converter's default output type.
    F16,
    /// `block_q4_0`: 32 weights as 4-bit nibbles with one fp16 scale, 18 bytes (4.5 bits a weight).
    Q4_0,
    /// `block_q4_1`: 32 4-bit weights with an fp16 scale and min, 20 bytes (5 bits a weight).
    Q4_1,
    /// `block_q5_0`: 32 5-bit weights (nibbles plus 32 high bits) with an fp16 scale, 22 bytes
    /// (5.5 bits a weight).
    Q5_0,
    /// `block_q5_1`: 32 5-bit weights with an fp16 scale and min, 24 bytes (6 bits a weight).
    Q5_1,
    /// `block_q8_0`: 32 int8 weights with an fp16 scale, 34 bytes (8.5 bits a weight).
    Q8_0,
    /// `block_q8_1`: 32 int8 weights with an fp16 scale and sum, 40 bytes (intermediate type).
    Q8_1,
    /// `block_q2_K`: a 256-weight super-block of 2-bit quants, 4-bit scales and mins per 16
    /// weights, fp16 `d` and `dmin`; 84 bytes (2.625 bits a weight).
    Q2_K,
    /// `block_q3_K`: 256 3-bit weights (2-bit quants plus a high-bit mask), 6-bit scales per 16
    /// weights, fp16 `d`; 110 bytes (3.4375 bits a weight).
    Q3_K,
    /// `block_q4_K`: 256 4-bit weights in 8 sub-blocks of 32 with 6-bit scales and mins, fp16 `d`
    /// and `dmin`; 144 bytes (4.5 bits a weight).
    Q4_K,
    /// `block_q5_K`: 256 5-bit weights (nibbles plus high bits) in 8 sub-blocks of 32 with 6-bit
    /// scales and mins, fp16 `d` and `dmin`; 176 bytes (5.5 bits a weight).
    Q5_K,
    /// `block_q6_K`: 256 6-bit weights (low nibbles plus high 2 bits), an int8 scale per 16
    /// weights, fp16 `d`; 210 bytes (6.5625 bits a weight).
    Q6_K,
    /// `block_q8_K`: 256 int8 weights with an fp32 scale and 16 int16 sums, 292 bytes
    /// (intermediate type).
    Q8_K,
    /// `block_iq2_xxs`: 256 weights, 66 bytes (2.0625 bits a weight).
    IQ2_XXS,
    /// `block_iq2_xs`: 256 weights, 74 bytes (2.3125 bits a weight).
    IQ2_XS,
    /// `block_iq3_xxs`: 256 weights, 98 bytes (3.0625 bits a weight).
    IQ3_XXS,
    /// `block_iq1_s`: 256 weights, 50 bytes (1.5625 bits a weight).
    IQ1_S,
    /// `block_iq4_nl`: 32 weights, 18 bytes (4.5 bits a weight).
    IQ4_NL,
    /// `block_iq3_s`: 256 weights, 110 bytes (3.4375 bits a weight).
    IQ3_S,
    /// `block_iq2_s`: 256 weights, 82 bytes (2.5625 bits a weight).
    IQ2_S,
    /// `block_iq4_xs`: 256 weights, 136 bytes (4.25 bits a weight).
    IQ4_XS,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
    /// `block_iq1_m`: 256 weights, 56 bytes (1.75 bits a weight).
    IQ1_M,
    /// bfloat16, 2 bytes a weight.
    BF16,
    /// `block_tq1_0`: ternary, 256 weights, 54 bytes (1.6875 bits a weight).
    TQ1_0,
    /// `block_tq2_0`: ternary, 256 weights, 66 bytes (2.0625 bits a weight).
    TQ2_0,
    /// `block_mxfp4`: 32 e2m1 weights with one e8m0 exponent, 17 bytes (4.25 bits a weight).
    MXFP4,
    /// `block_nvfp4`: 64 e2m1 weights with fp8 scales per 16, 36 bytes (4.5 bits a weight).
    NVFP4,
    /// `block_q1_0`: 128 1-bit weights with an fp16 scale, 18 bytes (1.125 bits a weight).
    Q1_0,
}

/// One type: its number in a GGUF header (`enum ggml_type`), ggml's name, block size, bytes a
/// block.
struct Row {
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_size: u64,
    type_size: u64,
}

const fn row(ty: GgmlType, id: u32, name: &'static str, block_size: u64, type_size: u64) -> Row {
    Row { ty, id, name, block_size, type_size }
}

/// Every type, in the order of [`GgmlType`]'s variants. Ids 4 and 5 (the removed Q4_2, Q4_3),
/// 31–33 (Q4_0_4_4 and its kin, now repacked at load) and 36–38 (removed IQ4_NL repacks) are
/// no longer written by any converter.
const TABLE: &[Row] = &[
    row(GgmlType::F32, 0, "f32", 1, 4),
    row(GgmlType::F16, 1, "f16", 1, 2),
    row(GgmlType::Q4_0, 2, "q4_0", 32, 18),
    row(GgmlType::Q4_1, 3, "q4_1", 32, 20),
    row(GgmlType::Q5_0, 6, "q5_0", 32, 22),
    row(GgmlType::Q5_1, 7, "q5_1", 32, 24),
    row(GgmlType::Q8_0, 8, "q8_0", 32, 34),
    row(GgmlType::Q8_1, 9, "q8_1", 32, 40),
    row(GgmlType::Q2_K, 10, "q2_K", 256, 84),
    row(GgmlType::Q3_K, 11, "q3_K", 256, 110),
    row(GgmlType::Q4_K, 12, "q4_K", 256, 144),
    row(GgmlType::Q5_K, 13, "q5_K", 256, 176),
    row(GgmlType::Q6_K, 14, "q6_K", 256, 210),
    row(GgmlType::Q8_K, 15, "q8_K", 256, 292),
    row(GgmlType::IQ2_XXS, 16, "iq2_xxs", 256, 66),
    row(GgmlType::IQ2_XS, 17, "iq2_xs", 256, 74),
    row(GgmlType::IQ3_XXS, 18, "iq3_xxs", 256, 98),
    row(GgmlType::IQ1_S, 19, "iq1_s", 256, 50),
    row(GgmlType::IQ4_NL, 20, "iq4_nl", 32, 18),
    row(GgmlType::IQ3_S, 21, "iq3_s", 256, 110),
    row(GgmlType::IQ2_S, 22, "iq2_s", 256, 82),
    row(GgmlType::IQ4_XS, 23, "iq4_xs", 256, 136),
    row(GgmlType::I8, 24, "i8", 1, 1),
    row(GgmlType::I16, 25, "i16", 1, 2),
    row(GgmlType::I32, 26, "i32", 1, 4),
    row(GgmlType::I64, 27, "i64", 1, 8),
    row(GgmlType::F64, 28, "f64", 1, 8),
    row(GgmlType::IQ1_M, 29, "iq1_m", 256, 56),
    row(GgmlType::BF16, 30, "bf16", 1, 2),
    row(GgmlType::TQ1_0, 34, "tq1_0", 256, 54),
    row(GgmlType::TQ2_0, 35, "tq2_0", 256, 66),
    row(GgmlType::MXFP4, 39, "mxfp4", 32, 17),
    row(GgmlType::NVFP4, 40, "nvfp4", 64, 36),
    row(GgmlType::Q1_0, 41, "q1_0", 128, 18),
];

impl GgmlType {
    fn row(self) -> &'static Row {
        // Every variant has its row (checked by a test).
        TABLE.iter().find(|r| r.ty == self).unwrap_or(&TABLE[0])
    }

    /// The type a GGUF header numbers `id`; `None` for a number no current ggml has.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.id == id).map(|r| r.ty)
    }

    /// Its number in a GGUF header.
    pub fn id(self) -> u32 {
        self.row().id
    }

    /// Weights per block (`QK4_0 = 32`, `QK_K = 256`; 1 for plain types).
    pub fn block_size(self) -> u64 {
        self.row().block_size
    }

    /// Bytes per block, from the `block_*` structs of `ggml-common.h`.
    pub fn type_size(self) -> u64 {
        self.row().type_size
    }

    /// Bits per weight: `8 × type_size / block_size` (Q4_K 4.5, Q6_K 6.5625, Q8_0 8.5).
    pub fn bits_per_weight(self) -> f64 {
        8.0 * self.type_size() as f64 / self.block_size() as f64
    }

    /// Bytes of one row of `elements` weights (`ggml_row_size`); a row that is not a whole number
    /// of blocks counts its last block whole.
    pub fn row_bytes(self, elements: u64) -> u64 {
        elements.div_ceil(self.block_size()).saturating_mul(self.type_size())
    }

    /// Block-quantized (not a plain float or integer type).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// The name ggml prints (`q4_K`, `f16`).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The type ggml prints as `name` (case-insensitive: `Q4_K`, `q4_k`).
    pub fn parse(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.name.eq_ignore_ascii_case(name.trim())).map(|r| r.ty)
    }

    /// Every type, in the table's order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_unique_and_round_trip() {
        let mut ids = std::collections::BTreeSet::new();
        for ty in GgmlType::all() {
            assert!(ids.insert(ty.id()), "{ty:?}");
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
            assert_eq!(GgmlType::parse(&ty.name().to_ascii_uppercase()), Some(ty));
        }
        assert_eq!(ids.len(), TABLE.len());
        assert_eq!(GgmlType::from_id(4), None);
    }

    #[test]
    fn published_bits_per_weight() {
        assert_eq!(GgmlType::Q4_K.bits_per_weight(), 4.5);
        assert_eq!(GgmlType::Q6_K.bits_per_weight(), 6.5625);
        assert_eq!(GgmlType::Q8_0.bits_per_weight(), 8.5);
        assert_eq!(GgmlType::Q4_K.row_bytes(4096), 16 * 144);
    }
}
