//! What a runtime holds of a pre-quantized checkpoint on a GPU of a given compute capability:
//! the stored layout, the weights dequantized on load, or nothing (it refuses). Each rule is the
//! runtime's own check:
//!
//! | method | transformers | vLLM (`get_min_capability`) |
//! |---|---|---|
//! | fp8 | 5.x: kept from 8.9 (Ada, Hopper), dequantized to the load dtype below (`quantizer_finegrained_fp8.py`, PR #42926); 4.x: refused below 8.9 | kept from 7.5 (vLLM 0.19 `Fp8Config.get_min_capability`: 75; FP8 Marlin W8A16 below 8.9, `is_fp8_marlin_supported`) |
//! | MXFP4 | kept from 7.5 (`quantizer_mxfp4.py`, with triton ≥ 3.4 and `kernels` installed), dequantized to bf16 below or when the config says `dequantize: true` | kept from 8.0 (`Mxfp4Config`: 80) |
//! | GPTQ | kept | kept from 6.0 (`GPTQConfig`: 60) |
//! | AWQ | kept | kept from 7.5 (`AWQConfig`: 75) |
//! | bitsandbytes | kept | kept from 7.0 (`BitsAndBytesConfig`: 70) |
//! | compressed-tensors | kept (`CompressedLinear`, `run_compressed`) | from 7.5 (vLLM 0.19: W8A8 fp8 needs 8.9 and falls back to the W8A16 Marlin scheme, 75; wNa16 and int8 W8A8: 75) |
//!
//! transformers' MXFP4 fallback to bf16 also happens on a capable GPU when triton ≥ 3.4 or the
//! `kernels` package is missing; that is the environment, not the GPU, and is not modelled.

use super::{Method, dequantize_weights};
use crate::hardware::ComputeCapability;
use crate::model::{ModelDescription, Naming};
use crate::units::format_bytes;
use crate::{DType, InputError};

/// The runtime that loads the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loader {
    /// transformers `from_pretrained` (the version the description's naming follows).
    Transformers,
    /// vLLM.
    Vllm,
}

impl Loader {
    fn name(self) -> &'static str {
        match self {
            Loader::Transformers => "transformers",
            Loader::Vllm => "vLLM",
        }
    }
}

/// What the runtime does with the quantized weights on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// The stored layout is held: the description as it is.
    Kept,
    /// The quantized weights are dequantized on load to `to`.
    Dequantized {
        /// The dtype the dequantized weights are held in.
        to: DType,
        /// The compute capability the runtime needs to keep the quantization; `None` when the
        /// config itself asks for dequantization (`dequantize: true`).
        needs: Option<ComputeCapability>,
    },
    /// The runtime refuses to load the checkpoint on this GPU.
    Refused {
        /// The compute capability it needs.
        needs: ComputeCapability,
    },
}

/// The model as a runtime holds it on one GPU.
#[derive(Debug, Clone)]
pub struct Held {
    /// The description of what is held (the input's own when the layout is kept).
    pub model: ModelDescription,
    /// What the runtime did.
    pub handling: Handling,
}

const fn cc(major: u32, minor: u32) -> ComputeCapability {
    ComputeCapability { major, minor }
}

/// What `loader` does with `model`'s quantization on a GPU of `capability`; transformers'
/// version is the one `naming` follows. `load_dtype` is the dtype dequantized fp8 weights take.
pub fn handling(
    model: &ModelDescription,
    loader: Loader,
    capability: ComputeCapability,
    load_dtype: DType,
) -> Handling {
    match &model.quantization {
        Some(quantization) => {
            method_handling(&quantization.method, model.naming, loader, capability, load_dtype)
        }
        None => Handling::Kept,
    }
}

/// What `loader` does with weights quantized by `method` on a GPU of `capability`, transformers'
/// version being the one `naming` follows: the rule of [`handling`], for a checkpoint's
/// quantization or one the runtime applies while loading (transformers' `FineGrainedFP8Config`
/// goes through the same `validate_environment`).
pub fn method_handling(
    method: &Method,
    naming: Naming,
    loader: Loader,
    capability: ComputeCapability,
    load_dtype: DType,
) -> Handling {
    let below = |needs: ComputeCapability| capability < needs;
    let refused_below = |needs: ComputeCapability| {
        if below(needs) { Handling::Refused { needs } } else { Handling::Kept }
    };
    match (method, loader) {
        (Method::Fp8 { .. }, Loader::Transformers) => match (below(cc(8, 9)), naming) {
            (false, _) => Handling::Kept,
            (true, Naming::V5) => Handling::Dequantized { to: load_dtype, needs: Some(cc(8, 9)) },
            (true, Naming::V4) => Handling::Refused { needs: cc(8, 9) },
        },
        (Method::Fp8 { .. }, Loader::Vllm) => refused_below(cc(7, 5)),
        (Method::Mxfp4 { dequantize: true }, Loader::Transformers) => {
            Handling::Dequantized { to: DType::BF16, needs: None }
        }
        (Method::Mxfp4 { .. }, Loader::Transformers) if below(cc(7, 5)) => {
            Handling::Dequantized { to: DType::BF16, needs: Some(cc(7, 5)) }
        }
        (Method::Mxfp4 { .. }, Loader::Vllm) => refused_below(cc(8, 0)),
        (Method::Gptq { .. }, Loader::Vllm) => refused_below(cc(6, 0)),
        (Method::Awq { .. }, Loader::Vllm) => refused_below(cc(7, 5)),
        (Method::Bitsandbytes4 { .. } | Method::Bitsandbytes8, Loader::Vllm) => refused_below(cc(7, 0)),
        (Method::CompressedTensors { .. }, Loader::Vllm) => refused_below(cc(7, 5)),
        _ => Handling::Kept,
    }
}

/// The model `loader` holds on a GPU of `capability` (see [`handling`]); refused loads are an
/// [`InputError`] naming `--hardware`, with the GPUs that would do.
pub fn held_on(
    model: &ModelDescription,
    loader: Loader,
    capability: ComputeCapability,
    load_dtype: DType,
) -> Result<Held, InputError> {
    let handling = handling(model, loader, capability, load_dtype);
    let name = model.quantization.as_ref().map_or_else(String::new, |q| q.name());
    match handling {
        Handling::Kept => Ok(Held { model: model.clone(), handling }),
        Handling::Dequantized { to, .. } => Ok(Held { model: dequantize_weights(model, to), handling }),
        Handling::Refused { needs } => Err(InputError::new(
            "--hardware",
            format!(
                "{} does not load {name} checkpoints on a GPU of compute capability {capability}: it \
                 needs {needs} or later",
                loader.name()
            ),
        )
        .with_fix(match (loader, model.naming) {
            (Loader::Transformers, Naming::V4) => format!(
                "use a GPU of compute capability {needs} or later, or transformers 5.x (`--naming v5`), \
                 which dequantizes the weights instead"
            ),
            _ => format!("use a GPU of compute capability {needs} or later"),
        })),
    }
}

impl Held {
    /// A sentence for users when the runtime did not keep the checkpoint's quantization: what it
    /// did, why, and the bytes it costs. `None` when the layout is kept.
    pub fn warning(
        &self,
        stored: &ModelDescription,
        loader: Loader,
        capability: ComputeCapability,
    ) -> Option<String> {
        let Handling::Dequantized { to, needs } = self.handling else { return None };
        let name = stored.quantization.as_ref().map_or_else(String::new, |q| q.name());
        let why = match needs {
            Some(needs) => format!(
                "its {name} kernels need compute capability {needs} or later and this GPU has {capability}"
            ),
            None => "the checkpoint's `quantization_config` says `dequantize: true`".to_string(),
        };
        Some(format!(
            "{} dequantizes the {name} weights to {to} on load ({why}): the model holds {} instead of {}",
            loader.name(),
            format_bytes(self.model.bytes()),
            format_bytes(stored.bytes()),
        ))
    }
}
