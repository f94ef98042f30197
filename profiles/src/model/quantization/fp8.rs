//! `quant_method: "fp8"` (DeepSeek-V3/R1, the FP8 releases of Qwen3 and others) as transformers'
//! fine-grained FP8 integration loads it (`integrations/finegrained_fp8.py`,
//! `replace_with_fp8_linear`), reproduced name for name:
//!
//! - Every `nn.Linear` not skipped becomes an `FP8Linear`: its weight is float8 e4m3 (whatever the
//!   config's `fmt` says: transformers always allocates e4m3) followed, after any bias, by a
//!   `weight_scale_inv` of block scales shaped `[ceil(out / block_out), ceil(in / block_in)]`, a
//!   scalar `[]` without `weight_block_size`. 4.x also converts the `nn.Linear` routers of its
//!   MoE blocks (`mlp.gate` of Mixtral, Qwen-MoE, OLMoE); 5.x's routers are not linear layers.
//! - 5.x replaces every module whose path ends in `.experts` (fused experts) by `FP8Experts`:
//!   `gate_up_proj`, `gate_up_proj_scale_inv` `[E, max(ceil(2I / block_out), 2), ceil(H /
//!   block_in)]`, `down_proj`, `down_proj_scale_inv` `[E, ceil(H / block_out), ceil(I /
//!   block_in)]` (`[E, 2, 1]` and `[E, 1, 1]` without blocks). 4.x's per-expert modules are plain
//!   linear layers.
//! - `scale_fmt: "ue8m0"` (5.x) keeps the scales as float8 e8m0 bytes, otherwise fp32.
//! - `activation_scheme: "static"` adds a scalar fp32 `activation_scale` per linear layer and
//!   `gate_up_proj_activation_scale` / `down_proj_activation_scale` `[E]` per fused experts (5.x);
//!   4.x refuses static activations, so nothing is added there and a note says so.
//! - Skipped: when `modules_to_not_convert` (5.x also reads `ignored_layers`) is absent or null,
//!   the output embedding `lm_head`; when it is given, exactly its entries (so `lm_head` is
//!   converted unless listed). 5.x matches an entry as a regular expression from the start of
//!   the path up to a module boundary (`model.layers.1` skips `model.layers.1.mlp`, not
//!   `model.layers.10`; `model.layers.*.self_attn` skips every attention), or as a suffix of the
//!   path; 4.x skips any path that contains the entry as a substring.
//!
//! Logical parameter counts do not change; bytes do. 5.x renames entries written in checkpoint
//! names (Mixtral's `block_sparse_moe`) before matching, and can convert embeddings
//! (`modules_to_convert`) and pack DeepSeek-V4-style fp4 experts; none of that is modelled.

use super::{Forms, constant, mark_quantized, pattern};
use crate::DType;
use crate::model::{ModelDescription, Module, ModuleKind, Naming};

/// How fp8 weights are stored, as one transformers version reads the config.
pub(super) struct Fp8Scheme {
    pub(super) naming: Naming,
    /// `[block_out, block_in]`; `None` for one scale per tensor.
    pub(super) block: Option<[u64; 2]>,
    pub(super) scale_dtype: DType,
    /// Static activation scales (5.x only; 4.x refuses the scheme).
    pub(super) static_activations: bool,
    /// Entries of the skip list (`lm_head` when the config gives none).
    pub(super) skip: Vec<String>,
}

impl Fp8Scheme {
    fn skips(&self, path: &str) -> bool {
        self.skip.iter().any(|entry| match self.naming {
            Naming::V4 => path.contains(entry.as_str()),
            Naming::V5 => path.ends_with(entry.as_str()) || pattern::matches_at_module_boundary(entry, path),
        })
    }
}

/// Converts every module `scheme` quantizes; returns the note saying what was done.
pub(super) fn apply(model: &mut ModelDescription, scheme: &Fp8Scheme, forms: &mut Forms) -> String {
    let mut converted = 0usize;
    model.root.visit_mut(&mut |module| {
        if !scheme.skips(&module.path) {
            converted += quantize_module(module, scheme, forms);
        }
    });
    let blocks = match scheme.block {
        Some([rows, cols]) => format!("{rows}×{cols} block scales"),
        None => "one scale per tensor".to_string(),
    };
    let skipped = if scheme.skip.is_empty() { "nothing".to_string() } else { scheme.skip.join(", ") };
    format!(
        "`quantization_config` fp8: {converted} weight tensors stored as fp8_e4m3 with {blocks} \
         (`*_scale_inv`, {}); not converted: {skipped}, norms, embeddings{} (as transformers' \
         fine-grained FP8 loads them); parameter counts are unaffected",
        scheme.scale_dtype.name(),
        if scheme.naming == Naming::V5 { ", routers" } else { "" },
    )
}

/// Converts the quantizable weights held directly by `module`; returns how many.
fn quantize_module(module: &mut Module, scheme: &Fp8Scheme, forms: &mut Forms) -> usize {
    let path = module.path.clone();
    let is_linear = match module.kind {
        ModuleKind::Linear => true,
        // 4.x routers that are plain `nn.Linear` layers.
        ModuleKind::Router => module.class == "Linear",
        _ => false,
    };
    if is_linear {
        let Some(weight) = module.tensors.iter_mut().find(|t| t.name == "weight" && t.shape.len() == 2)
        else {
            return 0;
        };
        mark_quantized(&path, weight, DType::F8E4M3, forms);
        let (out_features, in_features) = match weight.shape.as_slice() {
            [rows, cols] => (*rows, *cols),
            _ => (1, 1),
        };
        let shape = match scheme.block {
            Some([block_out, block_in]) => {
                vec![out_features.div_ceil(block_out), in_features.div_ceil(block_in)]
            }
            None => Vec::new(),
        };
        module.tensors.push(constant("weight_scale_inv", &shape, scheme.scale_dtype));
        if scheme.static_activations {
            module.tensors.push(constant("activation_scale", &[], DType::F32));
        }
        super::replace_class(module, "FP8Linear");
        return 1;
    }
    let fused = matches!(module.kind, ModuleKind::Experts { .. })
        && scheme.naming == Naming::V5
        && module.path.ends_with(".experts")
        && module.tensors.iter().any(|t| t.shape.len() == 3);
    if !fused {
        return 0;
    }
    let mut tensors = Vec::with_capacity(module.tensors.len() * 2);
    let mut activation_scales = Vec::new();
    let mut converted = 0;
    for mut tensor in std::mem::take(&mut module.tensors) {
        let projection = tensor.shape.len() == 3 && !tensor.name.ends_with("_bias");
        if !projection {
            tensors.push(tensor);
            continue;
        }
        mark_quantized(&path, &mut tensor, DType::F8E4M3, forms);
        let (experts, rows, cols) = match tensor.shape.as_slice() {
            [experts, rows, cols] => (*experts, *rows, *cols),
            _ => (1, 1, 1),
        };
        // The fused gate/up scales keep room for both halves.
        let min_rows = if tensor.name == "gate_up_proj" { 2 } else { 1 };
        let (scale_rows, scale_cols) = match scheme.block {
            Some([block_out, block_in]) => (rows.div_ceil(block_out), cols.div_ceil(block_in)),
            None => (1, 1),
        };
        let scale = [experts, scale_rows.max(min_rows), scale_cols];
        let name = tensor.name.clone();
        tensors.push(tensor);
        tensors.push(constant(&format!("{name}_scale_inv"), &scale, scheme.scale_dtype));
        if scheme.static_activations {
            activation_scales.push(constant(&format!("{name}_activation_scale"), &[experts], DType::F32));
        }
        converted += 1;
    }
    tensors.extend(activation_scales);
    module.tensors = tensors;
    super::replace_class(module, "FP8Experts");
    converted
}
