//! Which dtype each kind of tensor has, from the workload's precision settings, with the real
//! semantics of each recipe:
//! - fp32: everything fp32.
//! - AMP (`fp16=True` / `bf16=True` in the HF Trainer, weights loaded fp32): weights, gradients
//!   and optimizer states stay fp32; matmuls run on autocast copies of the weights in half
//!   precision; layer norm, softmax and the loss run in fp32 (torch autocast op lists).
//! - pure half (weights loaded in bf16/fp16 and no autocast, as torchtune trains): weights,
//!   gradients, optimizer states and activations all in that dtype.
//! - k-bit LoRA under transformers + PEFT: activations in fp32 (see `Precision::of`).

use crate::workload::{Finetune, Mode, Quant, Trainer, Workload};
use vramplan_profiles::DType;
use vramplan_profiles::model::ModelDescription;

/// The resolved dtypes of one workload on one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Precision {
    /// Floating-point weights as held (before quantization of linear layers).
    pub weights: DType,
    /// Activations of matmuls (the autocast dtype, else the weights').
    pub compute: DType,
    /// Ops autocast runs in fp32 (norms, softmax) produce this; without autocast, `compute`.
    pub upcast: DType,
    /// True under autocast: linear layers cast their weight to `compute` on every forward.
    pub autocast: bool,
}

impl Precision {
    pub(crate) fn of(model: &ModelDescription, workload: &Workload) -> Precision {
        let weights = workload.weight_dtype.unwrap_or(model.dtype);
        // A quantized checkpoint's own dtype (fp8, int4) is not what unquantized parts are held in.
        let weights = if weights.is_float() && weights.bits() >= 16 { weights } else { DType::BF16 };
        let kbit_training = workload.mode == Mode::Train
            && matches!(workload.finetune, Finetune::Lora { .. })
            && workload.trainer == Trainer::Transformers
            && !matches!(workload.quant, Quant::None | Quant::Gguf { .. });
        if kbit_training {
            // `prepare_model_for_kbit_training` casts embeddings and norms to fp32, so the
            // residual stream is fp32, and bitsandbytes casts each 4/8-bit linear's output back
            // to its input's dtype: activations are fp32 throughout.
            return Precision { weights, compute: DType::F32, upcast: DType::F32, autocast: false };
        }
        match workload.autocast {
            Some(half) if half != weights => {
                Precision { weights, compute: half, upcast: DType::F32, autocast: true }
            }
            _ => Precision { weights, compute: weights, upcast: weights, autocast: false },
        }
    }

    pub(crate) fn compute_bytes(&self) -> u64 {
        self.compute.bits() / 8
    }

    pub(crate) fn upcast_bytes(&self) -> u64 {
        self.upcast.bits() / 8
    }
}
