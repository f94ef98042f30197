//! A state-space (Mamba-2) mixer in a block (Falcon-H1's `FalconH1Mixer`, transformers 5.24
//! `models/falcon_h1/modeling_falcon_h1.py`): the fixed state it caches per sequence, what its
//! forward keeps for backward, and what it holds at once in a forward that keeps nothing.
//!
//! The path modelled is the one transformers takes without the CUDA kernels (`mamba_ssm`,
//! `causal_conv1d` absent: `mamba2_split_conv1d_scan_combined` returns None, and
//! `causal_conv1d_fn` / `mamba2_chunk_scan` fall back to their torch bodies), which is what
//! `pip install transformers` gives and what the reference tracer runs. With the kernels
//! installed, training takes the fused `mamba_split_conv1d_scan_combined`, which keeps its
//! inputs and recomputes the scan: far less than below (docs/memory-model.md, "State-space
//! mixers").
//!
//! Sizes, as `FalconH1Mixer` names them: `H` heads of width `P` (`inner = H·P`), `N` the
//! state size, `G` groups, `K` the convolution's kernel, `Q` the chunk size, `conv_dim = inner
//! + 2·G·N`, `proj = inner + conv_dim + H` (`in_proj`'s output); `c` the compute dtype's bytes;
//! a sequence of `s` tokens is padded to `nc = ⌈s/Q⌉` chunks (`pad_tensor_by_size`).

use super::precision::Precision;
use vramplan_profiles::model::ssm::SsmFacts;

/// Bytes of the per-sequence state one mixer caches in an inference step, for `batch`
/// sequences (transformers 5.24 `cache_utils.LinearAttentionLayer.lazy_initialization`): the
/// convolution's state, `batch × conv_dim × K` in the dtype of the hidden states it is made
/// from (the compute dtype), and the recurrent state, `batch × H × P × N` as
/// `mamba2_chunk_scan` returns its final state (fp32: it computes in `float()`). Neither grows
/// with the sequence.
pub(crate) fn state_bytes(ssm: &SsmFacts, batch: u64, compute_bytes: u64) -> u64 {
    let conv = compute_bytes * ssm.conv_dim() * ssm.conv_kernel;
    let recurrent = 4 * ssm.heads * ssm.head_dim * ssm.state_size;
    batch.saturating_mul(conv + recurrent)
}

/// The padded length and chunk count of `seq` tokens.
fn chunks(ssm: &SsmFacts, seq: u64) -> (u64, u64) {
    let chunks = seq.div_ceil(ssm.chunk_size).max(1);
    (chunks * ssm.chunk_size, chunks)
}

/// What the mixer's forward keeps for backward, tensor group by tensor group, for `batch`
/// sequences of `seq` tokens; `trainable` when its own weights train (a full fine-tune), else
/// (LoRA over a frozen base) only what the gradient of its input needs, which is almost all of
/// it: every operand of the scan's einsums and products derives from the input.
///
/// From `FalconH1Mixer.forward` and `mamba2_chunk_scan` (autograd's saved operands):
/// - `conv1d` keeps its input, a view of `in_proj`'s output (`c·proj` per token), and SiLU its
///   input, the padded convolution output (`c·conv_dim` per token and `K − 1` more per
///   sequence); `softplus` and `clamp` of `dt + dt_bias` keep `c·H` each, `dt.float()` `4·H`;
/// - `hidden_states.float() * dt` keeps the fp32 input (`4·inner`);
/// - per padded token, in fp32: `exp(segment_sum(A))` (L), `G * L` (G), the einsums' operands
///   `M` (`3·H·Q`); C and B for G, B for `B * decay_states`, `B_decay` and C for the
///   state einsums (`5·H·N`); the chunked input twice and `C_times_states` (`3·H·P`); the
///   decay vectors (`2·H`); each chunk's state for the output einsum (`H·P·N / Q`); and the
///   scan's output (`4·inner`), kept by `* silu(gate)`, with `silu(gate)` (`c·inner`);
/// - per sequence, the states of the `nc + 1` chunk boundaries (`4·H·P·N` each) and the
///   chunk-decay matrix (`4·H·(nc + 1)²`);
/// - a full fine-tune adds what the weights' gradients need: `in_proj`'s input (`c·h`),
///   `out_proj`'s input (`c·inner`) and the padded input `D` multiplies (`4·inner`).
pub(crate) fn saved(
    ssm: &SsmFacts,
    hidden: u64,
    precision: &Precision,
    trainable: bool,
    batch: u64,
    seq: u64,
) -> Vec<u64> {
    let c = precision.compute_bytes();
    let (h, p, n, q) = (ssm.heads, ssm.head_dim, ssm.state_size, ssm.chunk_size);
    let inner = ssm.inner;
    let (padded, nc) = chunks(ssm, seq);
    let tokens = batch * seq;
    let padded_tokens = batch * padded;
    let mut out = vec![
        c * ssm.projection() * tokens, // conv1d's input (in_proj's output)
        c * ssm.conv_dim() * batch * (seq + ssm.conv_kernel - 1), // SiLU's input
        (2 * c * h + 4 * h) * tokens,  // dt: softplus, clamp, float
        4 * inner * tokens,            // the input in fp32
        4 * h * 3 * q * padded_tokens, // L, G, M
        4 * h * 5 * n * padded_tokens, // C, B (twice), B_decay, C
        4 * h * 3 * p * padded_tokens, // chunked input (twice), C_times_states
        4 * h * 2 * padded_tokens,     // decay vectors
        4 * h * p * n * nc * batch,    // each chunk's state
        4 * inner * padded_tokens,     // the scan's output
        c * inner * tokens,            // silu(gate)
        4 * h * p * n * (nc + 1) * batch, // boundary states
        4 * h * (nc + 1) * (nc + 1) * batch, // chunk decays
    ];
    if trainable {
        out.extend([c * hidden * tokens, c * inner * tokens, 4 * inner * padded_tokens]);
    }
    out
}

/// What the mixer's frames hold at once in a forward that keeps nothing (a prefill), at the
/// inter-chunk einsum of `mamba2_chunk_scan` (`new_states = einsum(decay_chunk, states)`),
/// where what the function has named so far is all live: the block's normed input and the
/// mixer's `in_proj` output and convolution output (`c·(h + proj + conv_dim)` per token);
/// in fp32 per token, the input times `dt` and `D`'s residual (`2·inner`) and B and C repeated
/// per head (`2·H·N`); per padded token L, G and M (`3·H·Q`), `B_decay` and a chunked operand
/// (`2·H·N`), `Y_diag` and a chunked operand (`2·H·P`); per sequence, the zero initial state,
/// the boundary states and their copy for the einsum (`(2·(nc + 1) + 1)·H·P·N`).
/// Counted against the tracer's listing of live tensors on Falcon-H1-0.5B at chunks of 128 and
/// 64 (docs/memory-model.md).
pub(crate) fn working_set(
    ssm: &SsmFacts,
    hidden: u64,
    precision: &Precision,
    batch: u64,
    seq: u64,
) -> Vec<u64> {
    let c = precision.compute_bytes();
    let (h, p, n, q) = (ssm.heads, ssm.head_dim, ssm.state_size, ssm.chunk_size);
    let (padded, nc) = chunks(ssm, seq);
    let tokens = batch * seq;
    let padded_tokens = batch * padded;
    vec![
        c * hidden * tokens,                        // the normed input
        c * ssm.projection() * tokens,              // in_proj's output
        c * ssm.conv_dim() * tokens,                // the convolution's output
        4 * 2 * ssm.inner * tokens,                 // input × dt, D's residual
        4 * 2 * h * n * tokens,                     // B and C per head
        4 * h * 3 * q * padded_tokens,              // L, G, M
        4 * h * 2 * n * padded_tokens,              // B_decay, a chunked operand
        4 * h * 2 * p * padded_tokens,              // Y_diag, a chunked operand
        4 * h * p * n * (2 * (nc + 1) + 1) * batch, // initial, boundary states, their copy
    ]
}
