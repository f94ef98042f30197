//! A config's `quantization_config`, applied to the built tree as the weights are really loaded.
//!
//! `quant_method: "fp8"` (DeepSeek-V3/R1, the FP8 releases of Qwen3 and others) is what
//! transformers' fine-grained FP8 integration loads: every `nn.Linear` outside
//! `modules_to_not_convert` (and `lm_head`, which transformers never converts) keeps its weight in
//! float8 e4m3 plus a `weight_scale_inv` of fp32 block scales shaped `[ceil(out / block_out),
//! ceil(in / block_in)]` (`[1]` without `weight_block_size`); 5.x fused experts keep
//! `gate_up_proj` / `down_proj` in fp8 with `gate_up_proj_scale_inv` / `down_proj_scale_inv`
//! `[E, ceil(rows / block_out), ceil(cols / block_in)]`. Routers, norms and embeddings stay in the
//! model dtype. A static activation scheme adds an fp32 `activation_scale` per quantized weight.
//! Logical parameter counts do not change; bytes do.
//!
//! Other quantization methods are not modelled from a config alone: a note says so, and the
//! safetensors headers describe such checkpoints exactly.

use crate::model::hf::HfConfig;
use crate::model::{ModelDescription, Module, ModuleKind, Tensor, TensorKind};
use crate::{DType, InputError};
use serde_json::Value;

/// How a quantized tensor is stored.
struct Fp8Scheme {
    weight_dtype: DType,
    /// `[block_out, block_in]`; `None` for one scale per tensor.
    block: Option<[u64; 2]>,
    static_activations: bool,
    /// Module-path fragments left unconverted (`lm_head` and the config's list).
    keep: Vec<String>,
}

/// Applies the config's `quantization_config`, if any, to `model` and notes what was done.
pub(in crate::model::hf) fn apply_quantization(
    config: &HfConfig,
    model: &mut ModelDescription,
) -> Result<(), InputError> {
    let Some((key, value)) = config.get(&["quantization_config"]) else { return Ok(()) };
    let Value::Object(settings) = value else {
        return Err(InputError::new(config.origin(), "expected an object of quantization settings")
            .at_key(key)
            .with_fix("remove `quantization_config` or give it as transformers writes it"));
    };
    let method = settings.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
    if method != "fp8" {
        model.notes.push(format!(
            "`quantization_config` method `{method}` is not modelled from a config alone: weights are \
             described unquantized in {}; give the checkpoint's safetensors files for the stored layout",
            model.dtype.name()
        ));
        return Ok(());
    }
    let scheme = read_fp8(config, settings)?;
    let mut converted = 0usize;
    model.root.visit_mut(&mut |module| {
        if scheme.keep.iter().any(|fragment| module.path.contains(fragment.as_str())) {
            return;
        }
        converted += quantize_module(module, &scheme);
    });
    let blocks = match scheme.block {
        Some([rows, cols]) => format!("{rows}×{cols} block scales"),
        None => "one scale per tensor".to_string(),
    };
    model.notes.push(format!(
        "`quantization_config` fp8: {converted} weight tensors stored as {} with {blocks} \
         (`*_scale_inv`, fp32); left in {}: {}, routers, norms and embeddings (as transformers' \
         fine-grained FP8 loads them); parameter counts are unaffected",
        scheme.weight_dtype.name(),
        model.dtype.name(),
        scheme.keep.join(", "),
    ));
    Ok(())
}

fn read_fp8(config: &HfConfig, settings: &serde_json::Map<String, Value>) -> Result<Fp8Scheme, InputError> {
    let bad = |key: &str, expected: &str| {
        InputError::new(config.origin(), format!("expected {expected}"))
            .at_key(format!("quantization_config.{key}"))
            .with_fix("give the value transformers writes for fine-grained FP8 (e.g. [128, 128])")
    };
    let weight_dtype = match settings.get("fmt").and_then(Value::as_str) {
        None | Some("e4m3") => DType::F8E4M3,
        Some("e5m2") => DType::F8E5M2,
        Some(_) => return Err(bad("fmt", "\"e4m3\" or \"e5m2\"")),
    };
    let block = match settings.get("weight_block_size") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let sizes: Vec<u64> = items.iter().filter_map(Value::as_u64).filter(|v| *v > 0).collect();
            match sizes.as_slice() {
                [rows, cols] if items.len() == 2 => Some([*rows, *cols]),
                _ => return Err(bad("weight_block_size", "two positive integers")),
            }
        }
        Some(_) => return Err(bad("weight_block_size", "a list of two positive integers")),
    };
    let static_activations = settings.get("activation_scheme").and_then(Value::as_str) == Some("static");
    let mut keep = vec!["lm_head".to_string()];
    match settings.get("modules_to_not_convert") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                match item.as_str() {
                    Some(name) if !keep.iter().any(|k| k == name) => keep.push(name.to_string()),
                    Some(_) => {}
                    None => return Err(bad("modules_to_not_convert", "a list of module names")),
                }
            }
        }
        Some(_) => return Err(bad("modules_to_not_convert", "a list of module names")),
    }
    Ok(Fp8Scheme { weight_dtype, block, static_activations, keep })
}

/// Converts the quantizable weights held directly by `module`; returns how many.
fn quantize_module(module: &mut Module, scheme: &Fp8Scheme) -> usize {
    let mut added = Vec::new();
    match module.kind {
        ModuleKind::Linear => {
            if let Some(weight) = module.tensors.iter_mut().find(|t| t.name == "weight" && t.shape.len() == 2)
            {
                weight.dtype = scheme.weight_dtype;
                added.push(constant("weight_scale_inv", scales(scheme, None, &weight.shape)));
                if scheme.static_activations {
                    added.push(constant("activation_scale", vec![1]));
                }
            }
        }
        ModuleKind::Experts { .. } => {
            for tensor in
                module.tensors.iter_mut().filter(|t| t.shape.len() == 3 && !t.name.ends_with("_bias"))
            {
                tensor.dtype = scheme.weight_dtype;
                let experts = tensor.shape.first().copied();
                added.push(constant(
                    &format!("{}_scale_inv", tensor.name),
                    scales(scheme, experts, &tensor.shape[1..]),
                ));
                if scheme.static_activations {
                    added.push(constant(
                        &format!("{}_activation_scale", tensor.name),
                        vec![experts.unwrap_or(1)],
                    ));
                }
            }
        }
        _ => {}
    }
    let converted = added.iter().filter(|t| t.name.ends_with("_scale_inv")).count();
    module.tensors.extend(added);
    converted
}

/// The scale tensor's shape for a `[rows, cols]` weight, with a leading expert dimension when
/// the weight is one of fused experts.
fn scales(scheme: &Fp8Scheme, experts: Option<u64>, matrix: &[u64]) -> Vec<u64> {
    let (rows, cols) = match matrix {
        [rows, cols] => (*rows, *cols),
        _ => (1, 1),
    };
    let per_matrix = match scheme.block {
        Some([block_rows, block_cols]) => vec![rows.div_ceil(block_rows), cols.div_ceil(block_cols)],
        None => vec![1],
    };
    match experts {
        Some(count) => std::iter::once(count).chain(per_matrix).collect(),
        None => per_matrix,
    }
}

fn constant(name: &str, shape: Vec<u64>) -> Tensor {
    Tensor { kind: TensorKind::QuantConstant, ..Tensor::parameter(name, &shape, DType::F32) }
}
