//! torchtune's allocations that differ from transformers' and between its own releases
//! (`trainer: torchtune`, `trainer_version`): torchao's `NF4Tensor` dequantization working set,
//! and the quantization at model initialisation of torchtune 0.1 (torchao 0.1), which compared
//! every value of a weight with the 16 NF4 levels at once. Traced in
//! `sim/tests/tracer_torchtune.rs`; docs/memory-model.md, "torchtune".

use crate::workload::{Quant, Trainer, Workload};
use vramplan_profiles::InputError;

/// The release a `trainer_version` names, as (major, minor); torchtune's latest on PyPI (0.6)
/// when none is given.
pub(crate) fn version(w: &Workload) -> (u32, u32) {
    w.trainer_version.as_deref().and_then(parse).unwrap_or((0, 6))
}

/// `major.minor` or `major.minor.patch`, digits only.
fn parse(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    match (parts.next(), parts.next()) {
        (None, _) => Some((major, minor)),
        (Some(patch), None) if patch.parse::<u32>().is_ok() => Some((major, minor)),
        _ => None,
    }
}

/// Refuses a `trainer_version` that is not a version, or one given to a trainer that reads none.
pub(crate) fn check_version(w: &Workload) -> Result<(), InputError> {
    let Some(text) = &w.trainer_version else { return Ok(()) };
    if w.trainer != Trainer::Torchtune {
        return Err(InputError::new(
            "workload",
            format!("trainer_version {text}: only `trainer: torchtune` reads a version"),
        )
        .at_key("trainer_version")
        .with_fix("leave out `--trainer-version`, or add `--trainer torchtune`"));
    }
    if parse(text).is_none() {
        return Err(InputError::new("workload", format!("trainer_version {text:?} is not a version"))
            .at_key("trainer_version")
            .with_fix("give torchtune's release as `0.1`, `0.6` or `0.6.1`"));
    }
    Ok(())
}

/// Bytes torchao's `NF4Tensor.get_original_weight` holds at once while it dequantizes a weight of
/// `numel` values for a matmul (`LinearNF4` forward, and again in backward): the codes' high and
/// low nibbles as int64 indices (`.to(torch.long)`, `n/2` each: `8n` bytes, locals until it
/// returns), both halves looked up in the NF4 table and scaled (`c·n` each pair), and their
/// interleaving `stack` (`c·n`): `(8 + 3c)·n`. Same code in torchao 0.1 and 0.10. Compiled
/// (`compile`: torchtune compiles each layer, `LinearNF4` and the `NF4Tensor` subclass trace
/// through), inductor fuses the unpacking, lookup and scaling into the kernel that writes the
/// dequantized weight: `c·n`.
pub(crate) fn dequant_working_set(numel: u64, compute_bytes: u64, compiled: bool) -> u64 {
    if compiled { compute_bytes * numel } else { (8 + 3 * compute_bytes) * numel }
}

/// Bytes live beyond the model while torchtune 0.1 loads one NF4 weight of `numel` values, at
/// the widest point of torchao 0.1's `to_nf4`: the checkpoint tensor copied to the GPU
/// (torchtune's `inplace_copy`: `to_nf4(src.to(device))`, `c·n`), its blocks divided by their
/// absmax (`c·n`), and in `quantize_tensor_nearest` the `n × 16` differences from the NF4 levels
/// and their absolute values (`16·c·n` each, unchunked): `34·c·n` in all. torchao 0.3.1 (torchtune 0.2)
/// quantizes 2^20 values at a time, and the transient is gone. The four tensors, in the order
/// they are made.
pub(crate) fn unchunked_quantization_transient(numel: u64, compute_bytes: u64) -> [u64; 4] {
    let c = compute_bytes * numel;
    [c, c, 16 * c, 16 * c]
}

/// Bytes an NF4 weight of `numel` values holds beyond bitsandbytes' layout under torchtune 0.1:
/// torchao 0.1's `double_quantize_scalers` divides over the absmax expanded to every block
/// (`256 / (2 * scaler_absmax)`, one value per block of 64 in the weight's dtype) and keeps
/// `quantization_factor[:, 0]`, a view that holds that whole tensor (torchao 0.3.1 adds
/// `.contiguous()`): `c·n/64`.
pub(crate) fn nf4_factor_storage(w: &Workload, numel: u64, compute_bytes: u64) -> u64 {
    if quantizes_unchunked(w) { compute_bytes * numel / 64 } else { 0 }
}

/// Whether loading the model runs torchao 0.1's unchunked quantization: torchtune before 0.2
/// with 4-bit weights.
pub(crate) fn quantizes_unchunked(w: &Workload) -> bool {
    w.trainer == Trainer::Torchtune && matches!(w.quant, Quant::Nf4 { .. }) && version(w) < (0, 2)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn versions_parse_as_major_minor() {
        assert_eq!(parse("0.1"), Some((0, 1)));
        assert_eq!(parse("0.6.1"), Some((0, 6)));
        assert_eq!(parse(" 0.10 "), Some((0, 10)));
        for bad in ["", "0", "v0.6", "0.6.1.2", "0.x", "0.6.rc1"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
