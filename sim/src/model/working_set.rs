//! What a block holds at once while its forward runs and keeps nothing for backward (an
//! inference prefill, or a checkpointed block's first forward): the tensors live at the
//! forward's peak, as transformers' decoder layers hold them under `torch.no_grad`.
//!
//! A Python variable keeps its tensor until it is reassigned or its frame returns, so the
//! working set is what the layer's frames still name when its widest op runs:
//! - the layer's input, named by the model's loop (`hidden_states = layer(hidden_states)`)
//!   until the layer returns (held by the step program, not counted here);
//! - in the MLP's half, the residual sum (`hidden_states = residual + hidden_states`; in a
//!   parallel block, the attention's output instead) and the norm's output; GPT-2, GPTBigCode
//!   and GPT-Neo also still name the attention's output (`attn_output + residual`);
//! - at the MLP's widest op: a gated MLP's act(gate), up and their product (gate is freed once
//!   act has read it); a plain MLP's first output and what the activation holds while it runs
//!   (its output for a native kernel; `gelu_new`, composed in Python, `0.5·x` and two
//!   temporaries); transformers' grouped-mm experts (`grouped_mm_experts_forward`) the gathered
//!   inputs, the gate-up output and the gated product, or at the end four tensors of `h` per
//!   routed copy (gathered input, down output, weighted output, its re-ordering);
//! - in the attention's half, the norm's output, rotated q and k, v, and SDPA's output (or, where
//!   wider, at a per-head `q_norm`: the projection's output, its fp32 upcast and product); eager
//!   attention adds `repeat_kv`'s copies and its scores at the softmax: the masked scores, and
//!   for an fp32 softmax of half scores its fp32 output plus, except CUDA's fp16 path
//!   (`at::_softmax(.., half_to_float)` in ATen's `softmax`), the fp32 copy of its input; then
//!   the half copy of the probabilities (`.to(query.dtype)`) beside the fp32 ones.
//!
//! Measured against the traced runtime (`scripts/reference/trace.py`): Llama, Qwen2, OLMoE,
//! Gemma 2, Phi-2, GPT-2, Pythia and OPT prefills hold exactly these tensors at their peaks.

use super::activations::Shape;
use crate::workload::AttentionImpl;
use vramplan_profiles::DType;

/// What a forward that keeps nothing needs to know besides the block's shape.
pub(super) struct Forward<'a> {
    /// Compute dtype (matmul outputs).
    pub compute: DType,
    /// Bytes of the residual stream's dtype (fp32 under autocast).
    pub residual: u64,
    /// The forward runs under autocast (softmax casts its input to fp32).
    pub autocast: bool,
    pub attention: AttentionImpl,
    /// The softmax of eager attention is fp32 (`softmax(.., dtype=torch.float32)`).
    pub fp32_softmax: bool,
    /// transformers' `ACT2FN` key of the MLP's activation.
    pub activation: &'a str,
    /// The layer's frame still names the attention's output at the MLP (GPT-2 style blocks).
    pub keeps_attention_output: bool,
    pub tokens: u64,
    /// Score elements of eager attention: batch · heads · queries · keys.
    pub scores: u64,
}

/// Names of model families whose decoder block keeps the attention's output named through
/// the MLP (`attn_output + residual` with `attn_output` still bound).
pub(super) fn keeps_attention_output(model_type: &str) -> bool {
    matches!(model_type, "gpt2" | "gpt_bigcode" | "gpt_neo")
}

/// Tensors the activation holds beside its input while it runs.
fn activation_holds(name: &str) -> u64 {
    match name {
        // `0.5 * x * (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`: 0.5·x and two temporaries.
        "gelu_new" => 3,
        _ => 1,
    }
}

/// The bytes of each tensor live at the block's forward peak, besides the layer's input (the
/// program holds it: the previous layer's output in a prefill, the checkpoint's input in
/// training) and the output it is about to make.
pub(super) fn working_set(sh: &Shape, f: &Forward) -> Vec<u64> {
    let t = f.tokens;
    let c = f.compute.bits() / 8;
    let (h, a, k, d) = (sh.hidden, sh.heads, sh.kv_heads, sh.head_dim);
    let (q, kv) = (a * d, k * d);
    let hidden = f.residual * h * t;
    let normed = c * h * t;

    // Attention's half (at most 9 tensors; the MLP's, of a dense block, 7: each list is made
    // once, at its size).
    let mut attention = Vec::with_capacity(9);
    attention.extend([normed, c * q * t, c * kv * t, c * kv * t]);
    if f.attention == AttentionImpl::Eager {
        if k < a {
            attention.extend([c * q * t, c * q * t]); // repeat_kv of k and v
        }
        // Saturating: scores of a long context may not fit in u64.
        let (half, full) = (f.scores.saturating_mul(c), f.scores.saturating_mul(4));
        if f.fp32_softmax && c < 4 {
            let copies_input = f.autocast || f.compute != DType::F16;
            let at_softmax = if copies_input { vec![half, full, full] } else { vec![half, full] };
            attention.extend(widest(at_softmax, vec![half, full, half]));
        } else {
            attention.extend([half, half]); // scores and probabilities, in one dtype
        }
    } else {
        attention.push(c * q * t); // SDPA's output
    }
    if sh.qk_norm {
        // `q_norm(q_proj(x).view(..))` (Qwen3, OLMoE, Gemma 3): while the RMSNorm multiplies, the
        // projection's output (the caller's argument), its fp32 upcast and the fp32 product are
        // live beside the norm's output; an fp32 q is its own upcast (`.to` returns it).
        let at_q_norm = if c < 4 {
            vec![normed, c * q * t, 4 * q * t, 4 * q * t]
        } else {
            vec![normed, 4 * q * t, 4 * q * t]
        };
        attention = widest(attention, at_q_norm);
    }

    // MLP's half.
    let mut mlp = Vec::with_capacity(7);
    mlp.extend([hidden, normed]);
    if f.keeps_attention_output {
        mlp.push(c * h * t);
    }
    let i = sh.intermediate;
    let dense = |width: u64| {
        let act = activation_holds(f.activation);
        let n = if sh.gated { (1 + act).max(3) } else { 1 + act };
        std::iter::repeat_n(c * width * t, n as usize)
    };
    match sh.moe {
        Some((_, top_k, shared)) => {
            let routed = t * top_k;
            let routed_peak = if sh.moe_weights_input {
                // Llama 4's `Llama4TextExperts`: `bmm(up * act_fn(gate), down_proj)` over every
                // expert's copy of every token, at the product: the weighted input, the gate-up
                // output (`gate` and `up` are its views), act(gate) and the product.
                vec![c * h * routed, 2 * c * i * routed, c * i * routed, c * i * routed]
            } else if 4 * h >= h + 3 * i {
                vec![c * h * routed; 4]
            } else {
                vec![c * h * routed, 2 * c * i * routed, c * i * routed]
            };
            let shared = if shared > 0 { dense(shared).collect() } else { Vec::new() };
            mlp.extend(widest(routed_peak, shared));
        }
        None => mlp.extend(dense(i)),
    }

    widest(attention, mlp)
}

/// The list of larger total (the first on a tie).
fn widest(a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    let total = |v: &[u64]| v.iter().fold(0u64, |s, x| s.saturating_add(*x));
    if total(&a) >= total(&b) { a } else { b }
}
