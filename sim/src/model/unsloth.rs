//! What Unsloth (`trainer: unsloth`) allocates beyond a layer's kept tensors, read from
//! unsloth 2026.10.9 and unsloth_zoo 2026.10.9 (PyPI): its LoRA kernels' backward, its fused
//! linear cross-entropy (`unsloth_zoo/fused_losses/fused_linear.py`) and the rules of its
//! offloaded gradient checkpointing (`unsloth_zoo/gradient_checkpointing.py`). What a layer keeps
//! for backward is `activations::unsloth_saved`; docs/memory-model.md, "Unsloth", lists all of it.

use super::activations::Shape;
use vramplan_profiles::DType;

/// Per token, what a decoder layer's backward holds beside its kept tensors under Unsloth's
/// kernels (unsloth/kernels/fast_lora.py, unsloth/utils/attention_dispatch.py):
/// - `LoRA_MLP.backward` makes `DW = dY @ down.T` (`c·I`), runs the SwiGLU backward in place
///   over `DW`, `e` and `g`, and writes `dX` into its saved input (`ctx.inplace`);
/// - the attention's backward then holds the output projection's `dX` (`c·a·d`, `LoRA_W`) and
///   xformers' `dQ`, `dK`, `dV` with K and V expanded to every head (`3·c·a·d`) and an fp32
///   delta per head, while the MLP's saved input, `e`, `g` and the post-attention norm's input
///   are already freed; `LoRA_QKV` writes its `dX` into its saved input too;
/// - beside either, the gradient arriving at the layer and the residual's (`2·c·h`), and the
///   recomputed layer's output, which `UnslothCheckpointFunction.backward` holds while it runs
///   `torch.autograd.backward(outputs, grads)` over it (`c·h`).
pub(super) fn backward_transient_per_token(sh: &Shape, c: u64) -> u64 {
    let (h, a, d, i) = (sh.hidden, sh.heads, sh.head_dim, sh.intermediate);
    let mlp = c * i;
    let attention = (4 * c * a * d + 4 * a).saturating_sub(2 * c * i + 2 * c * h);
    mlp.max(attention) + 3 * c * h
}

/// `MINIMUM_SIZE` of `UnslothCheckpointFunction`: a layer input of this many bytes or fewer
/// stays on the GPU as an ordinary saved tensor instead of going to pinned CPU memory.
pub(crate) const OFFLOAD_MINIMUM_BYTES: u64 = 2 * 1024 * 1024;

/// The GPU the loss runs on, as `fused_linear.py` asks about it.
pub(crate) struct LossDevice {
    /// Compute capability major (`_flash_ce_ok`: 8 and later; bf16 `mm(out_dtype=float32)`).
    pub major: u32,
    /// `torch.cuda.get_device_properties().total_memory` (`_flash_min_rows_auto`).
    pub total_memory: u64,
}

/// `_SPLIT_COLS`: vocabulary columns per split of the tiled pass.
const SPLIT_COLS: u64 = 16384;
/// `_BWD_TILE_BYTES`: 256 MiB, the tiled pass's buffer budget on CUDA.
const TILE_BYTES: u64 = 256 << 20;
/// `_CHUNK_GB`: 2 GiB, the chunked pass's budget when half the free memory is larger.
const CHUNK_BYTES: u64 = 2 << 30;
/// `_MAX_ROWS` and `_BWD_ROWS`: 4096 rows a chunk at most.
const MAX_ROWS: u64 = 4096;
/// `_MIN_LOGITS`: a chunk's rows are at least enough for this many logits (512 rows of
/// Qwen's 151,936-token vocabulary), 512 rows or more.
const MIN_LOGITS: u64 = 512 * 151_936;
/// `_SMALL_CARD_BYTES`: 24.5 GiB; larger cards use the tiled pass only from 4096 rows.
const SMALL_CARD_BYTES: u64 = 49 << 29;

/// The largest power of two at or below `x` (1 for `x` < 2), as `fused_linear_rows` rounds.
fn pow2_floor(x: u64) -> u64 {
    if x < 2 { 1 } else { 1 << (63 - x.leading_zeros()) }
}

/// Bytes Unsloth's fused linear cross-entropy (`fused_linear_cross_entropy`, the default loss of
/// `FastLanguageModel` training) holds at once while it runs over `tokens` labelled rows of
/// width `hidden` against a frozen head of `vocab` rows, beyond its persistent `grad_h`
/// (`_ce_impl`): a frozen head in half precision on an Ampere or later GPU takes the tiled
/// forward (`_tiled_forward`, from 4096 rows on cards over 24.5 GiB), one fp32 buffer of
/// `R × tile` logits (`R` = min(4096, rows), the tile 16,384 columns or as many as 256 MiB
/// holds) and an fp32 `R × hidden` accumulator; otherwise chunks of `R` rows
/// (`fused_linear_rows`: a power of two near `rows·hidden/vocab`, clamped to
/// [min rows, 4096] and to 2 GiB of logits) through one `R × vocab` buffer, in fp32 where
/// `mm(out_dtype=float32)` runs (bf16 from sm 8.0, fp16 everywhere), and an fp32 `R × hidden`
/// gradient (`_dz_w`). Per row, an fp32 log-probability (and in the tiled pass its log-sum-exp).
pub(crate) fn fused_ce_transient(
    tokens: u64,
    hidden: u64,
    vocab: u64,
    compute: DType,
    device: &LossDevice,
) -> u64 {
    if tokens == 0 || vocab == 0 {
        return 0;
    }
    let half = matches!(compute, DType::F16 | DType::BF16);
    let fp32_logits = compute == DType::F16 || (compute == DType::BF16 && device.major >= 8);
    let flash_min_rows = if device.total_memory <= SMALL_CARD_BYTES { 0 } else { 4096 };
    let tiled_vocab = vocab.div_ceil(SPLIT_COLS) > 2;
    if half && fp32_logits && device.major >= 8 && tiled_vocab && tokens >= flash_min_rows {
        // `_tiled_layout`: min(4096, rows, 256 MiB / (16,384 × 4)), at least 1 (`tokens` > 0).
        let rows = MAX_ROWS.min(tokens).min(TILE_BYTES / (SPLIT_COLS * 4));
        let mut tile = (TILE_BYTES / (rows * 4)).max(SPLIT_COLS);
        if flash_min_rows == 0 {
            tile = tile.min(SPLIT_COLS);
        }
        tile = (tile - tile % SPLIT_COLS).min(vocab.div_ceil(SPLIT_COLS) * SPLIT_COLS);
        let splits = vocab.div_ceil(SPLIT_COLS);
        return rows * tile * 4 + rows * hidden * 4 + rows * 4 + 8 * splits * rows * 4 + 2 * 4 * tokens;
    }
    let bytes_per_logit = if fp32_logits { 4 } else { compute.bits() / 8 };
    let mut rows = pow2_floor(tokens * hidden / vocab);
    let min_rows = pow2_floor(MIN_LOGITS / vocab).clamp(512, MAX_ROWS);
    rows = rows.max(min_rows).min(MAX_ROWS);
    rows = rows.min((CHUNK_BYTES / (vocab * bytes_per_logit)).max(2));
    rows = rows.min(tokens).max(1);
    let stride = vocab.div_ceil(8) * 8;
    let splits = vocab.div_ceil(SPLIT_COLS);
    rows * stride * bytes_per_logit + rows * hidden * 4 + 7 * splits * rows * 4 + 4 * tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_rows_follow_fused_linear_rows() {
        // Llama-3.1-8B (hidden 4096, vocab 128,256), 2048 rows on a T4 in fp16: rows·h/V = 65.4
        // -> 64, raised to the minimum 512 (pow2 below 512·151936/128256 = 606.5); fp16 logits
        // written as fp32 (`mm(out_dtype)`), 128,256 columns (a multiple of 8).
        let t4 = LossDevice { major: 7, total_memory: 15 << 30 };
        let expected = 512 * 128_256 * 4 + 512 * 4096 * 4 + 7 * 8 * 512 * 4 + 4 * 2048;
        assert_eq!(fused_ce_transient(2048, 4096, 128_256, DType::F16, &t4), expected);
    }

    #[test]
    fn a_frozen_head_on_a_large_ampere_card_takes_the_tiled_pass_from_4096_rows() {
        let a100 = LossDevice { major: 8, total_memory: 80 << 30 };
        // 4096 rows x 16,384 columns of fp32 (256 MiB), the accumulator 4096 x 4096 fp32.
        let tiled = fused_ce_transient(8192, 4096, 128_256, DType::BF16, &a100);
        assert_eq!(tiled, 4096 * 16384 * 4 + 4096 * 4096 * 4 + 4096 * 4 + 8 * 8 * 4096 * 4 + 8 * 8192);
        // Under 4096 rows the chunked pass: 512 rows of fp32 logits.
        let chunked = fused_ce_transient(2048, 4096, 128_256, DType::BF16, &a100);
        assert_eq!(chunked, 512 * 128_256 * 4 + 512 * 4096 * 4 + 7 * 8 * 512 * 4 + 4 * 2048);
    }
}
