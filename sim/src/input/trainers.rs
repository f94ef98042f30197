//! What each trainer's own program runs, and so what it refuses: a workload that names a
//! trainer (`--trainer`) with a setting that program does not have is refused before it is
//! estimated, since the estimate would describe no run.
//!
//! - LitGPT (`litgpt/finetune/lora.py`, v0.5.13): `--quantize` takes bitsandbytes' `bnb.nf4`,
//!   `bnb.nf4-dq`, `bnb.fp4`, `bnb.fp4-dq` and `bnb.int8-training` only, raises
//!   `NotImplementedError("Quantization is currently not supported for multi-GPU training")` on
//!   more than one device, and with a bitsandbytes precision always builds bitsandbytes'
//!   `PagedAdamW` (`litgpt/utils.py`, `instantiate_bnb_optimizer`, which refuses any optimizer
//!   but AdamW). Its loss is its own, in 128-token chunks.
//! - fsdp_qlora (`train.py` at 05ed9f2): 4-bit weights are bitsandbytes' `Linear4bit` with
//!   `quant_type="nf4"` (or HQQ, not modelled); its loss is transformers'.
//! - Unsloth: its fused linear cross-entropy is its own loss.
//!
//! `--chunked-ce` is torchtune's `CEWithChunkedOutputLoss` (or, under the HF Trainer, a loss the
//! user chunks); a trainer with a loss of its own refuses it.

use crate::workload::{Mode, Optimizer, Parallelism, Quant, Trainer, Workload};
use vramplan_profiles::InputError;

const ORIGIN: &str = "workload";

/// Refuses the settings the workload's trainer does not run (see the module's list).
pub(crate) fn check_trainer(w: &Workload) -> Result<(), InputError> {
    if w.mode != Mode::Train {
        return Ok(());
    }
    let trainer = super::flags::trainer_word(w.trainer);
    let own_loss = matches!(w.trainer, Trainer::Litgpt | Trainer::Unsloth | Trainer::FsdpQlora);
    if own_loss && w.switches.chunked_cross_entropy {
        return Err(InputError::new(
            ORIGIN,
            format!(
                "`--chunked-ce` is torchtune's chunked loss; `--trainer {trainer}` runs a loss of its own"
            ),
        )
        .at_key("switches.chunked_cross_entropy")
        .with_fix(format!(
            "leave out --chunked-ce: the estimate under `--trainer {trainer}` charges its own loss"
        )));
    }
    match w.trainer {
        Trainer::Litgpt => check_litgpt(w),
        Trainer::FsdpQlora => match w.quant {
            Quant::None | Quant::Nf4 { .. } => Ok(()),
            _ => Err(InputError::new(
                ORIGIN,
                "fsdp_qlora's `train.py` quantizes with bitsandbytes' nf4 `Linear4bit` only".to_string(),
            )
            .at_key("quant")
            .with_fix("give `--quant nf4` (its `--train_type qlora`), or leave out --quant for LoRA")),
        },
        _ => Ok(()),
    }
}

fn check_litgpt(w: &Workload) -> Result<(), InputError> {
    if matches!(w.quant, Quant::None) {
        return Ok(());
    }
    if !matches!(w.quant, Quant::Nf4 { .. } | Quant::Fp4 { .. } | Quant::Int8) {
        return Err(InputError::new(
            ORIGIN,
            "LitGPT's `--quantize` takes bitsandbytes' nf4, fp4 and int8 only (`litgpt/finetune/lora.py`)",
        )
        .at_key("quant")
        .with_fix("give `--quant nf4` (`bnb.nf4`), `fp4` or `int8`, or leave out --quant"));
    }
    if !matches!(w.parallelism, Parallelism::Single) {
        return Err(InputError::new(
            ORIGIN,
            "LitGPT refuses quantization on more than one GPU (`NotImplementedError: Quantization is currently \
             not supported for multi-GPU training`, `litgpt/finetune/lora.py`)",
        )
        .at_key("parallelism")
        .with_fix("train the quantized model on one GPU, or leave out --quant to shard it"));
    }
    if w.optimizer != Optimizer::PagedAdamw {
        return Err(InputError::new(
            ORIGIN,
            "LitGPT with a bitsandbytes precision always steps with bitsandbytes' PagedAdamW \
             (`instantiate_bnb_optimizer`, `litgpt/utils.py`)",
        )
        .at_key("optimizer")
        .with_fix("give `--optimizer paged-adamw`"));
    }
    Ok(())
}
