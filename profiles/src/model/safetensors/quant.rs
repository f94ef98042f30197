//! Quantized checkpoints: which tensor names hold packed weights or quantization constants, and
//! the stored shapes the config's `quantization_config` (read once, by
//! [`crate::model::quantization`]) implies for them when only the index (names, no shard headers)
//! is at hand.
//!
//! Layouts (for `nn.Linear(in, out)`, `b` bits, `groups = ⌈in / group⌉`):
//! - GPTQ (AutoGPTQ / gptqmodel): `qweight [⌈in·b/32⌉, out]` I32, `qzeros [groups, ⌈out·b/32⌉]`
//!   I32, `scales [groups, out]` F16, `g_idx [in]` I32.
//! - AWQ (AutoAWQ GEMM): `qweight [in, ⌈out·b/32⌉]` I32, `qzeros [groups, ⌈out·b/32⌉]` I32,
//!   `scales [groups, out]` F16.
//! - Block fp8 (DeepSeek-V3): `weight [out, in]` F8_E4M3 and `weight_scale_inv
//!   [⌈out/b0⌉, ⌈in/b1⌉]` F32 for `weight_block_size: [b0, b1]` (a scalar per tensor without).
//! - MXFP4 (gpt-oss): a fused projection `X [E, a, b]` is stored as `X_blocks [E, b, ⌈a/32⌉, 16]`
//!   U8 and `X_scales [E, b, ⌈a/32⌉]` U8.
//! - compressed-tensors `pack-quantized`: `weight_packed [out, ⌈in·b/32⌉]` I32, `weight_scale
//!   [out, groups]`, `weight_zero_point [⌈out·b/32⌉, groups]` I32 (asymmetric), `weight_shape
//!   [2]` I64.
//! - bitsandbytes: 4-bit `weight` U8 `[⌈out·in/2⌉, 1]` with `weight.absmax`, `weight.quant_map`,
//!   `weight.nested_absmax`, `weight.nested_quant_map`, `weight.quant_state.bitsandbytes__nf4`;
//!   8-bit `weight` I8 with `SCB` and `weight_format`. Their sizes depend on block sizes not in
//!   the config, so they are only read from shard headers.

use super::StoredTensor;
use crate::DType;
use crate::model::quantization::{CtStrategy, Method, Quantization};

/// What a checkpoint-only tensor name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Replaces a floating-point parameter of the module ([`replaces`]): several quantized
    /// values per stored element.
    PackedWeight,
    /// Bytes that belong to the module's quantized weight, no parameters.
    Constant,
}

/// The role of a tensor name (the part after the module path) that a float model lacks.
pub(crate) fn role(tensor: &str) -> Option<Role> {
    match tensor {
        "qweight" | "weight_packed" => Some(Role::PackedWeight),
        "qzeros"
        | "scales"
        | "g_idx"
        | "weight_scale_inv"
        | "weight_scale"
        | "input_scale"
        | "weight_zero_point"
        | "weight_shape"
        | "weight_global_scale"
        | "input_global_scale"
        | "SCB"
        | "weight_format"
        | "weight.absmax"
        | "weight.quant_map"
        | "weight.nested_absmax"
        | "weight.nested_quant_map"
        | "weight.quant_state.bitsandbytes__nf4"
        | "weight.quant_state.bitsandbytes__fp4" => Some(Role::Constant),
        // MXFP4 (gpt-oss): `gate_up_proj_blocks` replaces `gate_up_proj`.
        name if name.ends_with("_blocks") && name.len() > "_blocks".len() => Some(Role::PackedWeight),
        name if name.ends_with("_scales") && name.len() > "_scales".len() => Some(Role::Constant),
        _ => None,
    }
}

/// The floating-point parameter a packed weight replaces: `weight` for `qweight` and
/// `weight_packed`, `X` for MXFP4's `X_blocks`.
pub(crate) fn replaces(tensor: &str) -> &str {
    tensor.strip_suffix("_blocks").unwrap_or("weight")
}

/// The checkpoint's quantization, as far as stored shapes go.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QuantConfig {
    quantization: Option<Quantization>,
}

impl QuantConfig {
    /// The shapes `quantization` implies (`None`: not quantized).
    pub fn new(quantization: Option<Quantization>) -> QuantConfig {
        QuantConfig { quantization }
    }

    fn method(&self) -> Option<&Method> {
        self.quantization.as_ref().map(|q| &q.method)
    }

    /// Bits per quantized value (GPTQ, AWQ, compressed-tensors integers; 4 otherwise).
    pub fn bits(&self) -> u32 {
        match self.method() {
            Some(Method::Gptq { bits, .. } | Method::Awq { bits, .. }) => *bits,
            Some(Method::CompressedTensors { groups, .. }) => groups.first().map_or(4, |g| g.bits),
            _ => 4,
        }
    }

    /// Values per stored element of a packed weight of `dtype` (8 for 4-bit in int32).
    pub fn per_element(&self, dtype: DType) -> u32 {
        (dtype.bits() / u64::from(self.bits().max(1))).max(1) as u32
    }

    /// The stored form of `tensor` of a module whose floating-point parameter it belongs to is
    /// `float` (`[out, in]` for a linear layer, `[E, a, b]` for fused experts), when the config's
    /// method determines it.
    pub fn stored_shape(&self, tensor: &str, float: &[u64]) -> Option<StoredTensor> {
        let words = |values: u64, bits: u32| (values * u64::from(bits)).div_ceil(32);
        let (dtype, shape) = match (self.method()?, tensor, float) {
            (Method::Gptq { bits, group_size, .. }, _, [out, inp]) => {
                let groups = group_size.map_or(1, |g| inp.div_ceil(g));
                match tensor {
                    "qweight" => (DType::I32, vec![words(*inp, *bits), *out]),
                    "qzeros" => (DType::I32, vec![groups, words(*out, *bits)]),
                    "scales" => (DType::F16, vec![groups, *out]),
                    "g_idx" => (DType::I32, vec![*inp]),
                    _ => return None,
                }
            }
            (Method::Awq { bits, group_size, .. }, _, [out, inp]) => {
                let groups = group_size.map_or(1, |g| inp.div_ceil(g));
                match tensor {
                    "qweight" => (DType::I32, vec![*inp, words(*out, *bits)]),
                    "qzeros" => (DType::I32, vec![groups, words(*out, *bits)]),
                    "scales" => (DType::F16, vec![groups, *out]),
                    _ => return None,
                }
            }
            (Method::Fp8 { block, .. }, "weight_scale_inv", [out, inp]) => match block {
                Some([rows, cols]) => (DType::F32, vec![out.div_ceil(*rows), inp.div_ceil(*cols)]),
                None => (DType::F32, Vec::new()),
            },
            (Method::Mxfp4 { .. }, _, [experts, rows, cols]) => {
                let groups = rows.div_ceil(32);
                if tensor.ends_with("_blocks") {
                    (DType::U8, vec![*experts, *cols, groups, 16])
                } else if tensor.ends_with("_scales") {
                    (DType::U8, vec![*experts, *cols, groups])
                } else {
                    return None;
                }
            }
            (Method::CompressedTensors { format, groups }, _, [out, inp]) if format == "pack-quantized" => {
                let group = groups.first()?;
                let scale_groups = match group.strategy {
                    CtStrategy::Group(size) => inp.div_ceil(size),
                    _ => 1,
                };
                match tensor {
                    "weight_packed" => (DType::I32, vec![*out, words(*inp, group.bits)]),
                    "weight_scale" => (DType::BF16, vec![*out, scale_groups]),
                    "weight_zero_point" => (DType::I32, vec![words(*out, group.bits), scale_groups]),
                    "weight_shape" => (DType::I64, vec![2]),
                    _ => return None,
                }
            }
            _ => return None,
        };
        Some(StoredTensor { dtype, shape })
    }

    /// The dtype of a weight whose module has a `weight_scale_inv` (fp8).
    pub fn fp8_weight_dtype(&self) -> Option<DType> {
        match self.method() {
            Some(Method::Fp8 { weight_dtype, .. }) => Some(*weight_dtype),
            _ => None,
        }
    }

    /// A short name of the method for notes (`GPTQ 4-bit`, `fp8 (128×128 blocks)`).
    pub fn describe(&self) -> Option<String> {
        self.quantization.as_ref().map(Quantization::name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Naming;
    use serde_json::Value;

    fn config(text: &str) -> QuantConfig {
        let Value::Object(map) = serde_json::from_str(text).unwrap() else { panic!() };
        QuantConfig::new(crate::model::quantization::read("test", &map, Naming::V5).unwrap())
    }

    #[test]
    fn gptq_shapes_for_a_4096_by_11008_projection() {
        // Llama-2-7B-GPTQ (TheBloke) `mlp.down_proj`: in 11008, out 4096, 4-bit, group 128.
        let q = config(r#"{"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}"#);
        assert_eq!(q.stored_shape("qweight", &[4096, 11008]).unwrap().shape, [1376, 4096]);
        assert_eq!(q.stored_shape("qzeros", &[4096, 11008]).unwrap().shape, [86, 512]);
        assert_eq!(q.stored_shape("scales", &[4096, 11008]).unwrap().shape, [86, 4096]);
        assert_eq!(q.stored_shape("g_idx", &[4096, 11008]).unwrap().shape, [11008]);
        assert_eq!(q.per_element(DType::I32), 8);
    }

    #[test]
    fn block_fp8_scales_round_up() {
        let q = config(
            r#"{"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}"#,
        );
        // DeepSeek-V3 `q_a_proj`: [1536, 7168] → scales [12, 56].
        assert_eq!(q.stored_shape("weight_scale_inv", &[1536, 7168]).unwrap().shape, [12, 56]);
        assert_eq!(q.fp8_weight_dtype(), Some(DType::F8E4M3));
    }

    #[test]
    fn mxfp4_blocks_transpose_the_fused_projection() {
        // gpt-oss-20b `gate_up_proj` [32, 2880, 5760] → blocks [32, 5760, 90, 16].
        let q = config(r#"{"quantization_config": {"quant_method": "mxfp4"}}"#);
        assert_eq!(
            q.stored_shape("gate_up_proj_blocks", &[32, 2880, 5760]).unwrap().shape,
            [32, 5760, 90, 16]
        );
        assert_eq!(q.stored_shape("gate_up_proj_scales", &[32, 2880, 5760]).unwrap().shape, [32, 5760, 90]);
        assert_eq!(replaces("gate_up_proj_blocks"), "gate_up_proj");
        assert_eq!(replaces("qweight"), "weight");
    }
}
