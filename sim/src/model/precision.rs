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
        // `--dtype` (`weight_dtype`) is the load dtype: it sets the parts a pre-quantized
        // checkpoint leaves unquantized, as `from_pretrained(dtype=...)` and vLLM's `--dtype` do;
        // the quantized weights keep their stored types (`Tensor::takes_load_dtype`).
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

#[cfg(test)]
mod tests {
    use crate::closed_form::model_states;
    use crate::workload::{Quant, Workload};
    use vramplan_profiles::DType;
    use vramplan_profiles::model::{self, ImportOptions};

    /// DeepSeek-V3's parameters left unquantized by its fp8 `quantization_config`: embedding and
    /// head (129280 × 7168 each), four norms per layer (2 × 7168, q_a 1536, kv_a 512) and the
    /// final one, and the 58 routers (256 × 7168).
    const DEEPSEEK_V3_FLOATS: u64 =
        2 * 129_280 * 7168 + 61 * (2 * 7168 + 1536 + 512) + 7168 + 58 * 256 * 7168;

    #[test]
    fn a_prequantized_checkpoint_holds_its_fp8_weights_and_dtype_sets_only_the_rest() {
        let model = model::load("deepseek-v3", ImportOptions::default()).expect("built-in");
        let held = |workload: &Workload| model_states(&model, workload, 1).weights;
        let default = held(&Workload::default());
        // As the description holds it: one byte per fp8 parameter (with its block scales), two
        // per bf16 one; dequantized to bf16 it would be two bytes for each.
        let fp8_params = model.params() - DEEPSEEK_V3_FLOATS;
        assert_eq!(default, model.bytes());
        assert!(default < fp8_params + 2 * DEEPSEEK_V3_FLOATS + fp8_params / 100, "{default}");
        let fp16 = Workload { weight_dtype: Some(DType::F16), ..Workload::default() };
        assert_eq!(held(&fp16), default, "fp16 and bf16 are both two bytes");
        let fp32 = Workload { weight_dtype: Some(DType::F32), ..Workload::default() };
        assert_eq!(held(&fp32) - default, 2 * DEEPSEEK_V3_FLOATS);
        // `--quant nf4` quantizes floating-point linear weights only: every linear weight but the
        // head's is fp8 already and stays as stored.
        let nf4 = Workload { quant: Quant::Nf4 { double_quant: false }, ..Workload::default() };
        assert_eq!(held(&nf4), default);
    }
}
