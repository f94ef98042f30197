//! Quantized checkpoints: which tensor names hold packed weights or quantization constants, and
//! the `quantization_config` of a `config.json`, from which the stored shapes of GPTQ, AWQ and
//! block-fp8 tensors follow when only the index (names, no shard headers) is at hand.
//!
//! Layouts (for `nn.Linear(in, out)`, `pack = 32 / bits` values per int32, `groups = ⌈in / group⌉`):
//! - GPTQ (AutoGPTQ / gptqmodel): `qweight [in/pack, out]` I32, `qzeros [groups, out/pack]` I32,
//!   `scales [groups, out]` F16, `g_idx [in]` I32.
//! - AWQ (AutoAWQ GEMM): `qweight [in, out/pack]` I32, `qzeros [groups, out/pack]` I32,
//!   `scales [groups, out]` F16.
//! - Block fp8 (DeepSeek-V3): `weight [out, in]` F8_E4M3 and `weight_scale_inv
//!   [⌈out/b0⌉, ⌈in/b1⌉]` F32 for `weight_block_size: [b0, b1]`.
//! - bitsandbytes: 4-bit `weight` U8 `[⌈out·in/2⌉, 1]` with `weight.absmax`, `weight.quant_map`,
//!   `weight.nested_absmax`, `weight.nested_quant_map`, `weight.quant_state.bitsandbytes__nf4`;
//!   8-bit `weight` I8 with `SCB` and `weight_format`. Their sizes depend on block sizes not in
//!   the config, so they are only read from shard headers.

use super::StoredTensor;
use crate::DType;
use serde_json::{Map, Value};

/// What a checkpoint-only tensor name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Replaces the module's `weight`: several quantized values per stored element.
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
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Method {
    Gptq,
    Awq,
    BlockFp8 { block: [u64; 2], dtype: DType },
    Other(String),
    None,
}

/// The parts of `quantization_config` that decide stored shapes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QuantConfig {
    method: Method,
    /// Bits per quantized value (GPTQ/AWQ; 4 when absent).
    pub bits: u64,
    /// Input features per quantization group; `None`: one group per row (`group_size: -1`).
    group: Option<u64>,
}

impl QuantConfig {
    /// Reads `quantization_config` from a config object (absent: not quantized).
    pub fn from_config(config: &Map<String, Value>) -> QuantConfig {
        let none = QuantConfig { method: Method::None, bits: 4, group: Some(128) };
        let Some(Value::Object(q)) = config.get("quantization_config") else { return none };
        let text = |key: &str| q.get(key).and_then(Value::as_str).map(str::to_ascii_lowercase);
        let bits = q.get("bits").and_then(Value::as_u64).filter(|b| (1..=16).contains(b)).unwrap_or(4);
        let group = match q.get("group_size").and_then(Value::as_i64) {
            Some(g) if g > 0 => Some(g as u64),
            Some(_) => None,
            None => Some(128),
        };
        let method = match text("quant_method").as_deref() {
            Some("gptq") => Method::Gptq,
            Some("awq") => Method::Awq,
            Some("fp8") => {
                let block = match q.get("weight_block_size").and_then(Value::as_array).map(Vec::as_slice) {
                    Some([a, b]) => match (a.as_u64(), b.as_u64()) {
                        (Some(a), Some(b)) if a > 0 && b > 0 => Some([a, b]),
                        _ => None,
                    },
                    _ => None,
                };
                let dtype = match text("fmt").as_deref() {
                    Some("e5m2") => DType::F8E5M2,
                    _ => DType::F8E4M3,
                };
                match block {
                    Some(block) => Method::BlockFp8 { block, dtype },
                    None => Method::Other("fp8 (per-tensor)".into()),
                }
            }
            Some(other) => Method::Other(other.to_string()),
            None => Method::None,
        };
        QuantConfig { method, bits, group }
    }

    /// Values per stored element of a packed weight of `dtype` (8 for 4-bit in int32).
    pub fn per_element(&self, dtype: DType) -> u32 {
        (dtype.bits() / self.bits).max(1) as u32
    }

    /// The stored form of `tensor` of a `nn.Linear` whose float weight is `[out, in]`, when the
    /// config's method determines it.
    pub fn stored_shape(&self, tensor: &str, out: u64, inp: u64) -> Option<StoredTensor> {
        let pack = 32 / self.bits.max(1);
        let groups = self.group.map_or(1, |g| inp.div_ceil(g));
        let (dtype, shape) = match (&self.method, tensor) {
            (Method::Gptq, "qweight") => (DType::I32, vec![inp.div_ceil(pack), out]),
            (Method::Awq, "qweight") => (DType::I32, vec![inp, out.div_ceil(pack)]),
            (Method::Gptq | Method::Awq, "qzeros") => (DType::I32, vec![groups, out.div_ceil(pack)]),
            (Method::Gptq | Method::Awq, "scales") => (DType::F16, vec![groups, out]),
            (Method::Gptq, "g_idx") => (DType::I32, vec![inp]),
            (Method::BlockFp8 { block, .. }, "weight_scale_inv") => {
                (DType::F32, vec![out.div_ceil(block[0]), inp.div_ceil(block[1])])
            }
            _ => return None,
        };
        Some(StoredTensor { dtype, shape })
    }

    /// The dtype of a weight whose module has a `weight_scale_inv` (block fp8).
    pub fn fp8_weight_dtype(&self) -> Option<DType> {
        match self.method {
            Method::BlockFp8 { dtype, .. } => Some(dtype),
            _ => None,
        }
    }

    /// A short name of the method for notes (`gptq`, `block fp8 [128, 128]`).
    pub fn describe(&self) -> Option<String> {
        match &self.method {
            Method::Gptq => Some(format!("gptq {}-bit", self.bits)),
            Method::Awq => Some(format!("awq {}-bit", self.bits)),
            Method::BlockFp8 { block, dtype } => {
                Some(format!("{dtype} with [{}, {}] blocks", block[0], block[1]))
            }
            Method::Other(name) => Some(name.clone()),
            Method::None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> QuantConfig {
        let Value::Object(map) = serde_json::from_str(text).unwrap() else { panic!() };
        QuantConfig::from_config(&map)
    }

    #[test]
    fn gptq_shapes_for_a_4096_by_11008_projection() {
        // Llama-2-7B-GPTQ (TheBloke) `mlp.down_proj`: in 11008, out 4096, 4-bit, group 128.
        let q = config(r#"{"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}"#);
        assert_eq!(q.stored_shape("qweight", 4096, 11008).unwrap().shape, [1376, 4096]);
        assert_eq!(q.stored_shape("qzeros", 4096, 11008).unwrap().shape, [86, 512]);
        assert_eq!(q.stored_shape("scales", 4096, 11008).unwrap().shape, [86, 4096]);
        assert_eq!(q.stored_shape("g_idx", 4096, 11008).unwrap().shape, [11008]);
        assert_eq!(q.per_element(DType::I32), 8);
    }

    #[test]
    fn block_fp8_scales_round_up() {
        let q = config(
            r#"{"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}"#,
        );
        // DeepSeek-V3 `q_a_proj`: [1536, 7168] → scales [12, 56].
        assert_eq!(q.stored_shape("weight_scale_inv", 1536, 7168).unwrap().shape, [12, 56]);
        assert_eq!(q.fp8_weight_dtype(), Some(DType::F8E4M3));
    }
}
