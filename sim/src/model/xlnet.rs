//! XLNet's layer (`XLNetLayer`: relative attention, then the feed-forward) as transformers'
//! `modeling_xlnet.py` runs it, tensor by tensor, for the standard stream (no `perm_mask` or
//! `target_mapping`: fine-tuning and evaluation; the query stream `g` only runs in
//! pre-training). Its attention is not SDPA: each score tensor is made by `torch.einsum`, which
//! reshapes its operands for `bmm` (a permuted operand is copied, and the copy is what autograd
//! keeps), and the scores are the sum of three of them.
//!
//! Per token, `h = n·d`, `c` the compute dtype's bytes, `r` the residual stream's (fp32 under
//! autocast), `w` the weights' (`XLNetModel.dtype`: the masks' dtype); per score (`b·n·i·j`):
//! - `XLNetRelativeAttention.forward` projects with `einsum("ibh,hnd->ibnd", ·, self.q|k|v|r)`.
//!   Under autocast each einsum casts its input anew (the layer input is not a leaf, so
//!   autocast's cache does not hold it): 3 half copies of `h` kept, and the relative positions
//!   `pos_emb` (`[2·i, b, h]`, the forward's `relative_positional_encoding` expanded over the
//!   batch) cast and kept by every layer: `2·c·h`. Without autocast the three keep the layer
//!   input itself (`c·h`) and `r` keeps the model's `pos_emb` (held for all layers, below).
//! - `rel_attn_core`: `ac = einsum(q + r_w_bias, k)`, `bd = einsum(q + r_r_bias, k_r)` then
//!   `rel_shift_bnij`, `ef = einsum(q + r_s_bias, seg_embed)` then `einsum(seg_mat, ef)`: the bmm
//!   copies of `q + r_w_bias`, `k`, `q + r_r_bias`, `k_r` (`2·c·h`: `2·i` positions), `q +
//!   r_s_bias`, and `seg_mat` (`2·c` per `b·i·j`); `softmax` (fp32 under autocast, CUDA's
//!   autocast fp32 list; else the scores' dtype) keeps its output, dropout its 1-byte mask, and
//!   the `attn_prob · v` einsum the half copy of the dropped probabilities (the dropout output
//!   itself without autocast) and `v`'s copy; `post_attention`'s `einsum(attn_vec, o)` the
//!   contiguous copy of `attn_vec`. That is `8·c·h` and `softmax + 1 + c` per score, beside
//!   the attention dropout's mask (`h` bytes) and the `layer_norm`'s input (`r·h`).
//! - `XLNetFeedForward`: `layer_1`'s input (`c·h`), the activation's input and the inner
//!   dropout's mask and output (`c·I`, `I`, `c·I`), the output dropout's mask (`h`) and the
//!   `layer_norm`'s input (`r·h`).
//!
//! `XLNetModel.forward` holds across its layers (charged with the first): `word_emb_k`
//! (`w·h`), in training `pos_emb` after dropout (`[2·i, b, h]`: `2·w·h`), the one-hot
//! `seg_mat` (`[i, j, b, 2]`, `2·w` per pair) and `non_tgt_mask` (`[i, j, b, 1]`, `w` per pair);
//! the embedding dropout's mask is kept (`h`). In evaluation (`use_mems_eval`, true in every
//! published config) it keeps each layer's input as that layer's `mems` (`r·h`), which the
//! program holds as XLNet's cache ([`mems_per_token`]).
//!
//! At the widest moment of a layer in evaluation (the last `einsum` of `rel_attn_core`) the
//! locals `ac`, `bd` (shifted), `ef`, the masked scores, the softmax and its half copy are live
//! (`4·c + softmax + c` per score under autocast), with `q`, `k`, `v` (`3·c·h`), `k_r` (`2·c·h`)
//! and `v`'s bmm copy (`c·h`). In training, past what it keeps, the dropout's output (`softmax`
//! bytes per score) is live then.

use super::activations::BlockActivations;
use super::precision::Precision;
use crate::workload::{Mode, Workload};
use vramplan_profiles::model::ModelDescription;

/// Bytes per token of the `mems` evaluation keeps per layer: the layer's input, in the residual
/// stream's dtype (`XLNetModel.cache_mem`: `curr_out.detach()`).
pub(crate) fn mems_per_token(model: &ModelDescription, precision: &Precision) -> u64 {
    residual_bytes(precision) * model.facts.hidden_size
}

fn residual_bytes(precision: &Precision) -> u64 {
    if precision.autocast { 4 } else { precision.compute_bytes() }
}

/// Layer `layer`'s activations for `batch` sequences of `seq` tokens.
pub(crate) fn block(
    model: &ModelDescription,
    workload: &Workload,
    precision: &Precision,
    layer: usize,
    batch: u64,
    seq: u64,
) -> BlockActivations {
    let f = &model.facts;
    let (h, inner) = (f.hidden_size, f.intermediate_size);
    let c = precision.compute_bytes();
    let r = residual_bytes(precision);
    let w = precision.weights.bits() / 8;
    let autocast = precision.autocast;
    let tokens = batch.saturating_mul(seq);
    let scores = batch.saturating_mul(f.num_attention_heads).saturating_mul(seq).saturating_mul(seq);
    let pairs = batch.saturating_mul(seq).saturating_mul(seq);
    let softmax = if autocast { 4 } else { c };
    let training = workload.mode == Mode::Train;

    if !training {
        // Evaluation: the layer's widest moment; its input is its `mems`, which the program holds
        // as the cache, and the model's masks are its prefill holdings ([`held_in_prefill`]).
        let per_score = 4 * c + softmax + if autocast { c } else { 0 };
        return BlockActivations {
            saved: Vec::new(),
            forward_transient: 0,
            working_set: vec![per_score * scores, 6 * c * h * tokens],
            backward_transient: 0,
            input: 0,
        };
    }

    let mut saved = Vec::new();
    // Relative attention.
    if autocast {
        saved.extend([3 * c * h * tokens, 2 * c * h * tokens]); // q/k/v input copies, pos_emb copy
    } else {
        saved.push(c * h * tokens); // the layer input, kept by the q, k and v einsums
    }
    saved.push(8 * c * h * tokens); // the bmm operands' copies and attn_vec's
    saved.push(2 * c * pairs); // seg_mat's copy for `ef`
    saved.extend([softmax * scores, scores, c * scores]); // softmax, dropout mask, half probabilities
    saved.extend([h * tokens, r * h * tokens]); // attention dropout mask, layer_norm input
    // Feed-forward.
    saved.extend([c * h * tokens, c * inner * tokens, inner * tokens, c * inner * tokens]);
    saved.extend([h * tokens, r * h * tokens]);
    if layer == 0 {
        // What the forward of `XLNetModel` holds across the layers, charged with the first.
        saved.extend([w * h * tokens, 3 * w * pairs]); // word_emb_k; seg_mat and non_tgt_mask
        saved.extend([2 * w * h * tokens, h * tokens]); // pos_emb after dropout; the embedding dropout's mask
    }

    BlockActivations {
        saved,
        // The attention dropout's output, live through the last einsum.
        forward_transient: softmax * scores,
        working_set: vec![(4 * c + softmax + if autocast { c } else { 0 }) * scores, 6 * c * h * tokens],
        // Backward of the scores at its widest: the dropout's and the softmax's gradients
        // (fp32 under autocast), one made from the other; `rel_shift`'s backward (the shifted
        // gradient scattered into `[b, n, i, 2j]` zeros, `3·c`) comes after both are freed.
        backward_transient: (2 * softmax).max(3 * c) * scores,
        input: r * h * tokens,
    }
}

/// What evaluation's forward of `XLNetModel` holds across its layers for `batch` sequences of
/// `seq` tokens: `seg_mat` and `non_tgt_mask` (`word_emb_k` is the first layer's `mems`).
pub(crate) fn held_in_prefill(precision: &Precision, batch: u64, seq: u64) -> Vec<u64> {
    let w = precision.weights.bits() / 8;
    vec![3 * w * batch.saturating_mul(seq).saturating_mul(seq)]
}
