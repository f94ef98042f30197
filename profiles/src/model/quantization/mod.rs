//! Pre-quantized checkpoints: the one reading of a `config.json`'s `quantization_config`
//! ([`read`]), the layout each method's runtime module holds in place of the floating-point
//! weights it converts ([`apply`], with [`fp8`] and [`layouts`]), and what each runtime does with
//! that layout on a GPU of a given compute capability ([`held`]: kept, dequantized, refused).
//!
//! A description built from such a config holds the weights as the runtime holds them where it
//! keeps the quantization: MXFP4 experts as `*_blocks` and `*_scales` bytes, fp8 weights with
//! their scales, GPTQ/AWQ packed words, bitsandbytes 4-bit bytes with their absmax, compressed-
//! tensors' packed words and scales. Every quantized weight records the floating-point parameter
//! it stands for ([`crate::model::FloatForm`]) and every replaced module its class, so the same
//! description can be dequantized ([`crate::model::ModelDescription::dequantized`]) exactly to
//! what transformers builds without the quantization. The parts a method leaves unquantized take
//! the load dtype (`--dtype`), as `from_pretrained(dtype=...)` and vLLM's `--dtype` do.
//!
//! When the config gives no `torch_dtype`, the quantizer's own default is the load dtype, as its
//! `update_dtype` sets it: bf16 for MXFP4 (`quantizer_mxfp4.py`), fp16 for GPTQ, AWQ,
//! bitsandbytes and compressed-tensors.

mod fp8;
pub mod held;
mod layouts;
mod pattern;
mod read;

pub(crate) use read::read;

use crate::model::hf::HfConfig;
use crate::model::{FloatForm, ModelDescription, Module, ModuleKind, Naming, Tensor, TensorKind, join};
use crate::{DType, InputError};
use serde::Serialize;

/// A checkpoint's `quantization_config`, as read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quantization {
    /// The method and its settings.
    pub method: Method,
    /// The modules the config keeps in floating point, as written (`modules_to_not_convert`,
    /// 5.x's `ignored_layers` for fp8, `llm_int8_skip_modules`, compressed-tensors' `ignore`);
    /// `None` when the config names none and the runtime's default applies (the output head).
    pub skip: Option<Vec<String>>,
}

/// A quantization method with the settings that decide what is stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Method {
    /// `quant_method: "fp8"`: float8 weights with block-wise or per-tensor scales
    /// (`FineGrainedFP8Config`).
    Fp8 {
        /// `weight_block_size` `[out, in]`; `None` for one scale per tensor.
        block: Option<[u64; 2]>,
        /// `fmt`: the checkpoint's float8 format (transformers allocates e4m3 whatever it says).
        weight_dtype: DType,
        /// `scale_fmt: "ue8m0"`: scales kept as e8m0 bytes (5.x).
        e8m0_scales: bool,
        /// `activation_scheme: "static"`: one stored activation scale per weight.
        static_activations: bool,
    },
    /// `quant_method: "mxfp4"` (gpt-oss): routed experts in OCP MXFP4, e2m1 values in 32-value
    /// blocks sharing an e8m0 scale (`Mxfp4Config`).
    Mxfp4 {
        /// `dequantize: true`: transformers dequantizes to bf16 on load, on every GPU.
        dequantize: bool,
    },
    /// `quant_method: "gptq"` (`GPTQConfig`).
    Gptq {
        /// Bits per weight: 2, 3, 4 or 8.
        bits: u32,
        /// Inputs per group; `None` for one group per row (`group_size: -1`).
        group_size: Option<u64>,
        /// `sym`: symmetric quantization (`GPTQConfig` default true). vLLM's Marlin kernels take
        /// symmetric checkpoints only and then drop the stored zeros.
        sym: bool,
        /// `desc_act`: act-order, inputs permuted by `g_idx` (`GPTQConfig` default false). vLLM
        /// keeps `g_idx` (sorted, with its sort indices) only then.
        desc_act: bool,
    },
    /// `quant_method: "awq"` (`AwqConfig`).
    Awq {
        /// Bits per weight (`bits` / `w_bit`): 4.
        bits: u32,
        /// Inputs per group (`group_size` / `q_group_size`); `None` for one group per row.
        group_size: Option<u64>,
        /// `zero_point`: asymmetric quantization (the packed zeros are stored either way).
        zero_point: bool,
    },
    /// `quant_method: "bitsandbytes"` with `load_in_4bit` (`BitsAndBytesConfig`).
    Bitsandbytes4 {
        /// `bnb_4bit_quant_type: "nf4"` (else fp4, the config class's default).
        nf4: bool,
        /// `bnb_4bit_use_double_quant`: the block absmax quantized to 8 bits.
        double_quant: bool,
        /// `bnb_4bit_quant_storage`: the dtype the packed values are stored in (uint8).
        storage: DType,
    },
    /// `quant_method: "bitsandbytes"` with `load_in_8bit` (LLM.int8()).
    Bitsandbytes8,
    /// `quant_method: "compressed-tensors"` (llm-compressor checkpoints).
    CompressedTensors {
        /// `format`: how the weights are compressed (`pack-quantized`, `float-quantized`,
        /// `naive-quantized`, …).
        format: String,
        /// The schemes of `config_groups`, in the config's order.
        groups: Vec<CtGroup>,
    },
    /// Any other method: named in notes, its weights described unquantized.
    Other {
        /// The `quant_method` as written.
        name: String,
    },
}

/// One scheme of a compressed-tensors `config_groups`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CtGroup {
    /// `targets`: module classes (`Linear`) or `re:` patterns of module names.
    pub targets: Vec<String>,
    /// `weights.num_bits`.
    pub bits: u32,
    /// `weights.type: "float"` (fp8) rather than `"int"`.
    pub float: bool,
    /// `weights.strategy` with its size.
    pub strategy: CtStrategy,
    /// `weights.symmetric` (no zero points stored when true).
    pub symmetric: bool,
    /// `input_activations` given and not dynamic: a stored `input_scale`.
    pub static_input: bool,
}

/// How many weights share one scale in a compressed-tensors scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CtStrategy {
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per output row.
    Channel,
    /// One scale per row and this many inputs.
    Group(u64),
    /// One scale per `[rows, cols]` block.
    Block([u64; 2]),
}

impl Quantization {
    /// A short name for notes and warnings (`fp8 128×128 blocks`, `gptq 4-bit`).
    pub fn name(&self) -> String {
        match &self.method {
            Method::Fp8 { block: Some([rows, cols]), .. } => format!("fp8 ({rows}×{cols} blocks)"),
            Method::Fp8 { block: None, .. } => "fp8 (per tensor)".into(),
            Method::Mxfp4 { .. } => "MXFP4".into(),
            Method::Gptq { bits, .. } => format!("GPTQ {bits}-bit"),
            Method::Awq { bits, .. } => format!("AWQ {bits}-bit"),
            Method::Bitsandbytes4 { nf4, .. } => {
                format!("bitsandbytes 4-bit {}", if *nf4 { "nf4" } else { "fp4" })
            }
            Method::Bitsandbytes8 => "bitsandbytes 8-bit".into(),
            Method::CompressedTensors { format, .. } => format!("compressed-tensors {format}"),
            Method::Other { name } => name.clone(),
        }
    }

    /// The load dtype the method's quantizer sets when the config gives none (`update_dtype`).
    fn default_dtype(&self) -> Option<DType> {
        match self.method {
            Method::Mxfp4 { .. } => Some(DType::BF16),
            Method::Gptq { .. }
            | Method::Awq { .. }
            | Method::Bitsandbytes4 { .. }
            | Method::Bitsandbytes8
            | Method::CompressedTensors { .. } => Some(DType::F16),
            Method::Fp8 { .. } | Method::Other { .. } => None,
        }
    }
}

/// A quantization constant (scales, zeros, absmax): bytes, no parameters.
pub(crate) fn constant(name: &str, shape: &[u64], dtype: DType) -> Tensor {
    Tensor::constant(name, shape, dtype)
}

/// The quantized weights a conversion made: each one's full path and the floating-point
/// parameter it stands for.
type Forms = Vec<(String, FloatForm)>;

/// Stores `tensor` of the module at `module_path` in `dtype`, recording the floating-point
/// parameter it was.
fn mark_quantized(module_path: &str, tensor: &mut Tensor, dtype: DType, forms: &mut Forms) {
    let form = FloatForm { name: tensor.name.clone(), shape: tensor.shape.clone() };
    forms.push((join(module_path, &tensor.name), form));
    tensor.dtype = dtype;
}

/// Gives `module` the quantizer's class, remembering the one it replaced.
fn replace_class(module: &mut Module, class: &str) {
    if module.float_class.is_none() {
        module.float_class = Some(std::mem::replace(&mut module.class, class.to_string()));
    } else {
        module.class = class.to_string();
    }
}

/// Whether a transformers skip entry names `path` the way bitsandbytes and AWQ match it
/// (`integrations/bitsandbytes.py`: `key + "." in name or key == name`, and the leaf name).
fn named_by(entry: &str, path: &str) -> bool {
    path == entry || path.contains(&format!("{entry}.")) || path.rsplit('.').next() == Some(entry)
}

/// The output head transformers keeps unquantized by default (`get_keys_to_not_convert`).
const OUTPUT_HEAD: &str = "lm_head";

/// Applies the config's `quantization_config`, if any, to `model` built from it: records the
/// reading, sets the quantizer's default dtype when the config gives none, converts the modules
/// the method converts, and notes what was done.
pub(crate) fn apply(config: &HfConfig, model: &mut ModelDescription) -> Result<(), InputError> {
    let Some(quantization) = read(config.origin(), config.object(), model.naming)? else { return Ok(()) };
    let dtype_given = config.get(&["torch_dtype", "dtype"]).is_some();
    if !dtype_given && let Some(dtype) = quantization.default_dtype() {
        *model = model.cast(dtype);
        model.notes.push(format!(
            "config.json gives no `torch_dtype`; the {} quantizer loads the unquantized parts in {dtype} \
             (its `update_dtype`)",
            quantization.name()
        ));
    }
    let note = convert(model, &quantization);
    model.notes.push(note);
    model.quantization = Some(quantization);
    Ok(())
}

/// `model`, given unquantized, described as a checkpoint quantized with `quantization` would be:
/// the modules the method converts hold its stored layout, exactly as [`apply`] describes a
/// config's `quantization_config`. Sizes a quantization a runtime loads only pre-quantized (vLLM
/// has no online GPTQ or AWQ) for a model given in floating point. A model that already holds a
/// quantization is returned unchanged.
pub fn converted(model: &ModelDescription, quantization: &Quantization) -> ModelDescription {
    let mut out = model.clone();
    if out.quantization.is_none() {
        let note = convert(&mut out, quantization);
        out.notes.push(note);
        out.quantization = Some(quantization.clone());
    }
    out
}

/// Converts the modules `quantization` converts; returns the note saying what was done.
fn convert(model: &mut ModelDescription, quantization: &Quantization) -> String {
    let naming = model.naming;
    let skip = quantization.skip.clone();
    let default_skip = || vec![OUTPUT_HEAD.to_string()];
    let scale_dtype = model.dtype;
    let mut converted = 0usize;
    let mut forms = Forms::new();
    match &quantization.method {
        Method::Fp8 { block, e8m0_scales, static_activations, .. } => {
            let scheme = fp8::Fp8Scheme {
                naming,
                block: *block,
                // 4.x does not know `scale_fmt` and allocates fp32 scales.
                scale_dtype: if *e8m0_scales && naming == Naming::V5 { DType::F8E8M0 } else { DType::F32 },
                static_activations: *static_activations && naming == Naming::V5,
                skip: skip.unwrap_or_else(default_skip),
            };
            let mut note = fp8::apply(model, &scheme, &mut forms);
            model.float_forms.extend(forms);
            if *static_activations && naming == Naming::V4 {
                note.push_str(
                    "; `activation_scheme` \"static\": transformers 4.x refuses to load it (5.x adds an \
                     `activation_scale` per quantized weight), so no activation scales are described",
                );
            }
            return note;
        }
        Method::Mxfp4 { .. } => {
            // `replace_with_mxfp4_linear`: `["lm_head"]` plus the config's list, matched with
            // `re.match` from the start of the path.
            let mut skip = skip.unwrap_or_default();
            skip.push(OUTPUT_HEAD.into());
            model.root.visit_mut(&mut |m| {
                if !skip.iter().any(|entry| pattern::matches_prefix(entry, &m.path))
                    && layouts::mxfp4_experts(m, &mut forms)
                {
                    converted += 1;
                }
            });
        }
        Method::Gptq { bits, group_size, .. } => {
            // optimum's `GPTQQuantizer.convert_model`: the linear layers inside the blocks.
            convert_in_blocks(&mut model.root, false, &mut |m| {
                if m.kind == ModuleKind::Linear
                    && layouts::gptq_awq_linear(m, *bits, *group_size, false, &mut forms)
                {
                    converted += 1;
                }
            });
        }
        Method::Awq { bits, group_size, .. } => {
            let skip = skip.unwrap_or_else(default_skip);
            model.root.visit_mut(&mut |m| {
                let linear = m.kind == ModuleKind::Linear && m.class == "Linear";
                if linear
                    && !skip.iter().any(|entry| m.path.contains(entry.as_str()))
                    && layouts::gptq_awq_linear(m, *bits, *group_size, true, &mut forms)
                {
                    converted += 1;
                }
            });
        }
        Method::Bitsandbytes4 { double_quant, storage, .. } => {
            let skip = skip.unwrap_or_else(default_skip);
            model.root.visit_mut(&mut |m| {
                if bnb_converts(m)
                    && !skip.iter().any(|e| named_by(e, &m.path))
                    && layouts::bnb4_linear(m, *double_quant, *storage, &mut forms)
                {
                    converted += 1;
                }
            });
        }
        Method::Bitsandbytes8 => {
            let skip = skip.unwrap_or_else(default_skip);
            model.root.visit_mut(&mut |m| {
                if bnb_converts(m)
                    && !skip.iter().any(|e| named_by(e, &m.path))
                    && layouts::bnb8_linear(m, &mut forms)
                {
                    converted += 1;
                }
            });
        }
        Method::CompressedTensors { format, groups } => {
            let ignore = skip.unwrap_or_default();
            model.root.visit_mut(&mut |m| {
                let linear = matches!(m.kind, ModuleKind::Linear | ModuleKind::Router) && m.class == "Linear";
                if !linear || ignore.iter().any(|entry| layouts::ct_names(entry, m)) {
                    return;
                }
                let group = groups.iter().find(|g| g.targets.iter().any(|t| layouts::ct_names(t, m)));
                if let Some(group) = group
                    && layouts::compressed_linear(m, group, format, scale_dtype, &mut forms)
                {
                    converted += 1;
                }
            });
        }
        Method::Other { name } => {
            return format!(
                "`quantization_config` method `{name}` is not modelled from a config alone: weights are \
                 described unquantized in {}; give the checkpoint's safetensors files for the stored layout",
                model.dtype.name()
            );
        }
    }
    model.float_forms.extend(forms);
    format!(
        "`quantization_config` {}: {converted} modules hold their weights quantized, as the runtime's \
         quantized modules hold them; parameter counts are unaffected",
        quantization.name()
    )
}

/// Whether bitsandbytes replaces `module`: every `nn.Linear` and GPT-2 `Conv1D`
/// (`_replace_with_bnb_linear`), 4.x routers included; 5.x's fused experts are parameters, not
/// linear layers, and stay.
fn bnb_converts(module: &Module) -> bool {
    matches!(module.kind, ModuleKind::Linear | ModuleKind::Router)
        && matches!(module.class.as_str(), "Linear" | "Conv1D")
}

/// Calls `f` on every module inside a block (the block's descendants, not the block).
fn convert_in_blocks(module: &mut Module, inside: bool, f: &mut dyn FnMut(&mut Module)) {
    if inside {
        f(module);
    }
    let inside = inside || module.kind == ModuleKind::Block;
    for child in &mut module.children {
        convert_in_blocks(child, inside, f);
    }
}

/// `model` with every quantized weight back to its floating-point parameter in `dtype` and the
/// quantizers' classes and constants gone; the unquantized parts are left as they are. A module
/// whose packed weight records no floating-point form keeps its stored layout.
pub(crate) fn dequantize_weights(model: &ModelDescription, dtype: DType) -> ModelDescription {
    let mut out = model.clone();
    let forms = std::mem::take(&mut out.float_forms);
    out.root.visit_mut(&mut |module| {
        let path = module.path.clone();
        let form = |tensor: &Tensor| forms.get(&join(&path, &tensor.name));
        let known = module.tensors.iter().any(|t| form(t).is_some());
        let unknown = module
            .tensors
            .iter()
            .any(|t| matches!(t.kind, TensorKind::PackedParameter { .. }) && form(t).is_none());
        if !known || unknown {
            return;
        }
        let mut tensors = std::mem::take(&mut module.tensors);
        tensors.retain(|t| t.kind != TensorKind::QuantConstant);
        for tensor in &mut tensors {
            if let Some(float) = form(tensor) {
                tensor.name = float.name.clone();
                tensor.shape = float.shape.clone();
                tensor.dtype = dtype;
                tensor.kind = TensorKind::Parameter;
                tensor.follows_load_dtype = true;
            }
        }
        module.tensors = tensors;
        if let Some(class) = module.float_class.take() {
            module.class = class;
        }
    });
    // Forms of modules left stored (unknown packing) stay with them.
    out.float_forms = forms.into_iter().filter(|(path, _)| out.root.tensor(path).is_some()).collect();
    out.quantization = None;
    out
}
