//! bitsandbytes under vLLM (`--quantization bitsandbytes`): the weights as vLLM's loader holds
//! them, and the transients its kernels add to the profiling forward pass. Sources: vLLM
//! `vllm/model_executor/model_loader/bitsandbytes_loader.py` (`BitsAndBytesModelLoader`) and
//! `vllm/model_executor/layers/quantization/bitsandbytes.py` (`BitsAndBytesLinearMethod`,
//! `BitsAndBytesMoEMethod`).
//!
//! - **What is quantized.** The loader quantizes the weights of every `LinearBase` whose quant
//!   method carries the config (`_get_bnb_target_modules`) and the routed experts of `FusedMoE`
//!   (`BitsAndBytesMoEMethod`). The vocab-parallel embedding and LM head are not linears and stay
//!   in the model dtype, as do norms, biases and routers (built with `quant_config=None`).
//! - **4-bit** (`load_in_4bit`, nf4 or fp4). An unquantized checkpoint is quantized in flight on
//!   each rank's shard (`_unquantized_generator`: `quantize_4bit(..., compress_statistics=True,
//!   quant_type="nf4")`, blocks of 64): the packed weight is `numel / 2` uint8
//!   (`create_qweight_for_4bit`), and each checkpoint tensor gets a quant state. Double
//!   quantization is then undone at load (`dequantize_dq`: "at the cost of increased memory
//!   usage"), so every 64-value block keeps an fp32 absmax, whether or not the checkpoint used
//!   `bnb_4bit_use_double_quant`; each state also keeps its 16-value fp32 code (`quant_map`).
//! - **8-bit** (`load_in_8bit`): only a pre-quantized checkpoint (the loader's
//!   `_quantized_8bit_generator`; in-flight quantization is 4-bit only): int8 weights
//!   (`create_qweight_for_8bit`) and an fp32 scale per output row (`SCB`). vLLM refuses a
//!   pre-quantized bitsandbytes checkpoint with tensor parallelism ("Prequant BitsAndBytes models
//!   with tensor parallelism is not supported") and has no 8-bit MoE
//!   (`_create_weights_8bit` raises `NotImplementedError`).
//! - **Transients.** A 4-bit linear on more than one row runs `matmul_4bit`, which dequantizes the
//!   shard's weight to the activation dtype and writes its output before `apply_bnb_4bit` copies
//!   it into the layer's output; the 4-bit MoE method dequantizes every expert of the layer
//!   (`_apply_4bit_dequnt`: `w13` and `w2`) before `fused_experts`. An 8-bit linear quantizes its
//!   input to int8 (`int8_vectorwise_quant`) and accumulates in int32
//!   (`int8_linear_matmul`).

use crate::workload::Quant;
use vramplan_profiles::model::{ModelDescription, ModuleKind, Tensor, TensorKind};
use vramplan_profiles::{DType, InputError};

/// Values per absmax block (`quantize_4bit`'s default `blocksize`).
pub const BLOCK: u64 = 64;

/// Values of a 4-bit quant state's code (`quant_map`, fp32).
pub const CODE_VALUES: u64 = 16;

/// Which bitsandbytes format vLLM loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bnb {
    /// `load_in_4bit` (nf4 or fp4, same sizes).
    FourBit,
    /// `load_in_8bit` (LLM.int8), pre-quantized checkpoints only.
    Int8,
}

impl Bnb {
    /// The bitsandbytes format of a workload's quantization, if it is one.
    pub fn of(quant: &Quant) -> Option<Bnb> {
        match quant {
            Quant::Nf4 { .. } | Quant::Fp4 { .. } => Some(Bnb::FourBit),
            Quant::Int8 => Some(Bnb::Int8),
            _ => None,
        }
    }
}

/// The settings vLLM refuses with bitsandbytes.
pub fn check(model: &ModelDescription, bnb: Bnb, tp: u32) -> Result<(), InputError> {
    if bnb == Bnb::Int8 && tp > 1 {
        return Err(InputError::new(
            "--parallel",
            format!(
                "vLLM loads bitsandbytes int8 only from a pre-quantized checkpoint, which it refuses with \
                 tensor parallelism ({tp} ranks)"
            ),
        )
        .with_fix("use `--parallel tp=1`, or `--quant nf4`, which vLLM quantizes on each rank"));
    }
    if bnb == Bnb::Int8 && model.facts.moe.is_some() {
        return Err(InputError::new(
            "--quant",
            format!("vLLM has no bitsandbytes int8 kernel for the experts of {}", model.name),
        )
        .with_fix("use `--quant nf4` (vLLM's BitsAndBytesMoEMethod is 4-bit only)"));
    }
    Ok(())
}

/// `model` as vLLM holds it under `bnb`: each quantized weight in its packed type with its
/// constants beside it (in the same module, so tensor parallelism splits them with it).
pub fn loaded(model: &ModelDescription, bnb: Bnb) -> ModelDescription {
    let mut out = model.clone();
    let head = crate::model::units::head_path(model);
    out.root.visit_mut(&mut |module| {
        if !quantizable(module.kind) || Some(module.path.as_str()) == head.as_deref() {
            return;
        }
        let mut constants = Vec::new();
        for tensor in module.tensors.iter_mut().filter(|t| is_weight(t)) {
            let numel = tensor.numel();
            match bnb {
                Bnb::FourBit => {
                    tensor.dtype = DType::I4;
                    // One quant state per checkpoint tensor: per expert, and two for a fused
                    // gate/up projection.
                    let experts: u64 = tensor.shape.iter().rev().skip(2).product();
                    let fused = if tensor.name.contains("gate_up") { 2 } else { 1 };
                    constants.push(constant(&tensor.name, "absmax", numel.div_ceil(BLOCK)));
                    constants.push(constant(&tensor.name, "quant_map", experts * fused * CODE_VALUES));
                }
                Bnb::Int8 => {
                    tensor.dtype = DType::I8;
                    let rows: u64 = tensor.shape.iter().rev().skip(1).product();
                    constants.push(constant(&tensor.name, "SCB", rows));
                }
            }
            tensor.follows_load_dtype = false;
        }
        module.tensors.extend(constants);
    });
    out
}

/// A quantization constant of `weight` (fp32, `values` long).
fn constant(weight: &str, what: &str, values: u64) -> Tensor {
    let name = format!("{weight}.{what}");
    Tensor {
        kind: TensorKind::QuantConstant,
        follows_load_dtype: false,
        ..Tensor::parameter(&name, &[values], DType::F32)
    }
}

/// Modules whose weights vLLM's bitsandbytes loader quantizes (also fp8's, [`super::vllm_quant`]).
pub(crate) fn quantizable(kind: ModuleKind) -> bool {
    matches!(kind, ModuleKind::Linear | ModuleKind::Experts { .. })
}

/// A float matrix parameter (not a bias, not tied).
pub(crate) fn is_weight(tensor: &Tensor) -> bool {
    tensor.kind == TensorKind::Parameter
        && tensor.dtype.is_float()
        && tensor.shape.len() >= 2
        && tensor.tied_to.is_none()
}

/// Bytes the bitsandbytes kernels add, on one rank, to the stage of the profiling pass that runs
/// them, for `tokens` rows in activations of `b` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Transients {
    /// The attention stage: its largest quantized projection.
    pub attention: u64,
    /// A dense MLP stage: its largest quantized projection.
    pub mlp: u64,
    /// An MoE stage: every expert of the layer dequantized.
    pub moe: u64,
}

/// The transients of `bnb` for `model` on one rank of `tp`: per linear, 4-bit adds the
/// dequantized weight shard and the shard's output (`tokens × rows`), 8-bit the int8 copy of the
/// input (`tokens × in`) and the int32 accumulator (`tokens × rows × 4`). A linear's rows on a
/// rank are its output features over `tp`, except for row-parallel linears, whose outputs are the
/// hidden size, whole on every rank.
pub fn transients(model: &ModelDescription, bnb: Bnb, tp: u32, tokens: u64, b: u64) -> Transients {
    let tp = u64::from(tp.max(1));
    let hidden = model.facts.hidden_size;
    let head = crate::model::units::head_path(model);
    let mut t = Transients::default();
    model.root.visit(&mut |module| {
        if Some(module.path.as_str()) == head.as_deref() {
            return;
        }
        match module.kind {
            // Listed experts (transformers 4.x naming) are counted with their experts module.
            ModuleKind::Linear if !module.path.contains(".experts.") => {
                for tensor in module.tensors.iter().filter(|t| is_weight(t)) {
                    let (out, inp) = (tensor.shape[0], tensor.shape[1]);
                    let rows = if out == hidden { out } else { out.div_ceil(tp) };
                    let bytes = match bnb {
                        Bnb::FourBit => (out * inp).div_ceil(tp) * b + tokens * rows * b,
                        Bnb::Int8 => tokens * inp + tokens * rows * 4,
                    };
                    let attention = module.path.contains("attn") || module.path.contains("attention");
                    let slot = if attention { &mut t.attention } else { &mut t.mlp };
                    *slot = (*slot).max(bytes);
                }
            }
            ModuleKind::Experts { .. } if bnb == Bnb::FourBit => {
                let mut numel = 0u64;
                module.visit(&mut |m| {
                    numel += m.tensors.iter().filter(|t| is_weight(t)).map(Tensor::numel).sum::<u64>()
                });
                t.moe = t.moe.max(numel.div_ceil(tp) * b);
            }
            _ => {}
        }
    });
    t
}
