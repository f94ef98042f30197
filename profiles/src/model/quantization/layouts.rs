//! What a quantizer puts in place of the floating-point weights it converts, for the methods
//! besides fp8 ([`super::fp8`]): the tensors the runtime module holds, with their names, shapes
//! and dtypes, each from the module's source.
//!
//! For `nn.Linear(in, out)` with `b` bits and groups of `g` inputs (`groups = ⌈in / g⌉`, one
//! group when `g` is -1):
//! - MXFP4 (`integrations/mxfp4.py`, `Mxfp4GptOssExperts`): each fused projection `X` `[E, a, b]`
//!   of a `GptOssExperts` becomes `X_blocks` uint8 `[E, b, ⌈a/32⌉, 16]` (two e2m1 values a byte)
//!   and `X_scales` uint8 `[E, b, ⌈a/32⌉]` (one e8m0 exponent per 32 values); the biases stay.
//! - GPTQ (gptqmodel / auto-gptq `QuantLinear`, which transformers loads through optimum):
//!   `qweight` int32 `[⌈in·b/32⌉, out]`, `qzeros` int32 `[groups, ⌈out·b/32⌉]`, `scales` fp16
//!   `[groups, out]`, `g_idx` int32 `[in]`, in the linear layers of the blocks.
//! - AWQ (AutoAWQ `WQLinear_GEMM`, `integrations/awq.py`): `qweight` int32 `[in, out/8]`,
//!   `qzeros` int32 `[groups, out/8]`, `scales` fp16 `[groups, out]`.
//! - bitsandbytes 4-bit (`Linear4bit`, `Params4bit`): `weight` `[⌈out·in/2⌉, 1]` in the storage
//!   dtype (uint8), an `absmax` per 64-value block (fp32, or uint8 with double quantization,
//!   which adds an fp32 `nested_absmax` per 256 blocks and its 256-entry code) and the 16-entry
//!   fp32 code (`quant_map`), named as the checkpoint names them (`weight.absmax`, …).
//! - bitsandbytes 8-bit (`Linear8bitLt`, `Int8Params`): `weight` int8 `[out, in]` and `SCB`
//!   fp32 `[out]`, one scale per row.
//! - compressed-tensors (`CompressedLinear`, `run_compressed=True`): `pack-quantized` integers
//!   as `weight_packed` int32 `[out, ⌈in·b/32⌉]`, `weight_scale` `[out, groups]` (`[out, 1]` per
//!   channel, `[1]` per tensor) in the model's dtype, `weight_zero_point` int32 `[⌈out·b/32⌉,
//!   groups]` when asymmetric, `weight_shape` int64 `[2]`; `float-quantized` / `naive-quantized`
//!   8-bit as `weight` fp8 e4m3 (or int8) `[out, in]` with `weight_scale` (per channel, tensor or
//!   `block_structure` block) and an `input_scale` for static activations.

use super::{CtGroup, CtStrategy, Forms, constant, pattern, replace_class};
use crate::DType;
use crate::model::{FloatForm, join};
use crate::model::{Module, ModuleKind, Tensor, TensorKind};

/// The weight of a linear module: `(out, in)` from `weight [out, in]` (GPT-2's `Conv1D` stores
/// `[in, out]`).
fn linear_dims(module: &Module) -> Option<(u64, u64)> {
    let weight = module.tensors.iter().find(|t| t.name == "weight" && t.kind == TensorKind::Parameter)?;
    match (weight.shape.as_slice(), module.class.as_str()) {
        ([input, output], "Conv1D") => Some((*output, *input)),
        ([output, input], _) => Some((*output, *input)),
        _ => None,
    }
}

/// Replaces the tensor `float_name` of `module` by `stored` (the packed weight first, then its
/// constants), in its place; the packed weight records the parameter it stands for.
fn replace_weight(module: &mut Module, float_name: &str, stored: Vec<Tensor>, forms: &mut Forms) {
    let Some(index) = module.tensors.iter().position(|t| t.name == float_name) else { return };
    let float = module.tensors.remove(index);
    if let Some(first) = stored.first() {
        forms.push((join(&module.path, &first.name), FloatForm { name: float.name, shape: float.shape }));
    }
    for (offset, tensor) in stored.into_iter().enumerate() {
        module.tensors.insert(index + offset, tensor);
    }
}

/// A packed weight holding `per_element` values in each stored element.
fn packed(name: &str, shape: &[u64], dtype: DType, per_element: u32) -> Tensor {
    Tensor {
        kind: TensorKind::PackedParameter { per_element },
        follows_load_dtype: false,
        ..Tensor::parameter(name, shape, dtype)
    }
}

/// Values of `bits` bits packed into 32-bit words.
fn words(values: u64, bits: u32) -> u64 {
    (values * u64::from(bits)).div_ceil(32)
}

/// MXFP4 `GptOssExperts` → `Mxfp4GptOssExperts`; returns whether it converted.
pub(super) fn mxfp4_experts(module: &mut Module, forms: &mut Forms) -> bool {
    if module.class != "GptOssExperts" || !matches!(module.kind, ModuleKind::Experts { .. }) {
        return false;
    }
    let projections: Vec<(String, Vec<u64>)> = module
        .tensors
        .iter()
        .filter(|t| t.shape.len() == 3 && !t.name.ends_with("_bias"))
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    for (name, shape) in &projections {
        let [experts, rows, cols] = shape.as_slice() else { continue };
        let groups = rows.div_ceil(32);
        replace_weight(
            module,
            name,
            vec![
                packed(&format!("{name}_blocks"), &[*experts, *cols, groups, 16], DType::U8, 2),
                constant(&format!("{name}_scales"), &[*experts, *cols, groups], DType::U8),
            ],
            forms,
        );
    }
    replace_class(module, "Mxfp4GptOssExperts");
    !projections.is_empty()
}

/// GPTQ (`awq: false`) or AWQ (`awq: true`) packing of a linear module.
pub(super) fn gptq_awq_linear(
    module: &mut Module,
    bits: u32,
    group: Option<u64>,
    awq: bool,
    forms: &mut Forms,
) -> bool {
    let Some((out, inp)) = linear_dims(module) else { return false };
    let groups = group.map_or(1, |g| inp.div_ceil(g));
    let per = 32 / bits.max(1);
    let stored = if awq {
        vec![
            packed("qweight", &[inp, words(out, bits)], DType::I32, per),
            constant("qzeros", &[groups, words(out, bits)], DType::I32),
            constant("scales", &[groups, out], DType::F16),
        ]
    } else {
        vec![
            packed("qweight", &[words(inp, bits), out], DType::I32, per),
            constant("qzeros", &[groups, words(out, bits)], DType::I32),
            constant("scales", &[groups, out], DType::F16),
            constant("g_idx", &[inp], DType::I32),
        ]
    };
    replace_weight(module, "weight", stored, forms);
    replace_class(module, if awq { "WQLinear_GEMM" } else { "QuantLinear" });
    true
}

/// bitsandbytes 4-bit `Linear4bit` with 64-value blocks.
pub(super) fn bnb4_linear(
    module: &mut Module,
    double_quant: bool,
    storage: DType,
    forms: &mut Forms,
) -> bool {
    let Some((out, inp)) = linear_dims(module) else { return false };
    let values = out * inp;
    let storage_bytes = (storage.bits() / 8).max(1);
    let blocks = values.div_ceil(64);
    let per = u32::try_from(2 * storage_bytes).unwrap_or(2);
    let mut stored = vec![packed("weight", &[values.div_ceil(2).div_ceil(storage_bytes), 1], storage, per)];
    if double_quant {
        stored.push(constant("weight.absmax", &[blocks], DType::U8));
        stored.push(constant("weight.quant_map", &[16], DType::F32));
        stored.push(constant("weight.nested_absmax", &[blocks.div_ceil(256)], DType::F32));
        stored.push(constant("weight.nested_quant_map", &[256], DType::F32));
    } else {
        stored.push(constant("weight.absmax", &[blocks], DType::F32));
        stored.push(constant("weight.quant_map", &[16], DType::F32));
    }
    replace_weight(module, "weight", stored, forms);
    replace_class(module, "Linear4bit");
    true
}

/// bitsandbytes 8-bit `Linear8bitLt`.
pub(super) fn bnb8_linear(module: &mut Module, forms: &mut Forms) -> bool {
    let Some((out, inp)) = linear_dims(module) else { return false };
    let weight = Tensor { follows_load_dtype: false, ..Tensor::parameter("weight", &[out, inp], DType::I8) };
    replace_weight(module, "weight", vec![weight, constant("SCB", &[out], DType::F32)], forms);
    replace_class(module, "Linear8bitLt");
    true
}

/// Whether a compressed-tensors target or ignore entry names `module`: `re:` patterns match the
/// path from its start (`re.match`), other entries the full path or the class.
pub(super) fn ct_names(entry: &str, module: &Module) -> bool {
    match entry.strip_prefix("re:") {
        Some(pattern) => pattern::matches_prefix(pattern, &module.path),
        None => entry == module.path || entry == module.class,
    }
}

/// compressed-tensors `CompressedLinear` for one scheme in `format`; `scale_dtype` is the
/// model's dtype. Returns whether it converted (formats other than pack-, float- and
/// naive-/int-quantized are left as they are).
pub(super) fn compressed_linear(
    module: &mut Module,
    group: &CtGroup,
    format: &str,
    scale_dtype: DType,
    forms: &mut Forms,
) -> bool {
    let Some((out, inp)) = linear_dims(module) else { return false };
    let scale_shape = |strategy: CtStrategy| -> Vec<u64> {
        match strategy {
            CtStrategy::Tensor => vec![1],
            CtStrategy::Channel => vec![out, 1],
            CtStrategy::Group(size) => vec![out, inp.div_ceil(size)],
            CtStrategy::Block([rows, cols]) => vec![out.div_ceil(rows), inp.div_ceil(cols)],
        }
    };
    let scale = scale_shape(group.strategy);
    let mut stored = match format {
        "pack-quantized" if !group.float && group.bits < 16 => {
            let groups = scale.last().copied().unwrap_or(1);
            let mut stored = vec![
                packed("weight_packed", &[out, words(inp, group.bits)], DType::I32, 32 / group.bits.max(1)),
                constant("weight_scale", &scale, scale_dtype),
            ];
            if !group.symmetric {
                stored.push(constant("weight_zero_point", &[words(out, group.bits), groups], DType::I32));
            }
            stored.push(constant("weight_shape", &[2], DType::I64));
            stored
        }
        "float-quantized" | "naive-quantized" | "int-quantized" if group.bits == 8 => {
            let dtype = if group.float { DType::F8E4M3 } else { DType::I8 };
            let weight =
                Tensor { follows_load_dtype: false, ..Tensor::parameter("weight", &[out, inp], dtype) };
            let mut stored = vec![weight, constant("weight_scale", &scale, scale_dtype)];
            if !group.symmetric {
                stored.push(constant("weight_zero_point", &scale, DType::I8));
            }
            stored
        }
        _ => return false,
    };
    if group.static_input {
        stored.push(constant("input_scale", &[1], DType::F32));
    }
    replace_weight(module, "weight", stored, forms);
    replace_class(module, "CompressedLinear");
    true
}
