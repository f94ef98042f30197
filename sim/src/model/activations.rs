//! What a block keeps for backward, tensor by tensor, from the ops transformers' forward runs
//! (autograd saves an op's inputs or outputs as its backward needs them), and the transient
//! workspace at the block's own forward and backward peaks.
//!
//! Per token, with `c` the compute dtype's bytes, `h` hidden, `a` heads, `k` KV heads, `d` head
//! dim, `I` the MLP width and `s` the attended span:
//! - a norm feeding a linear: RMSNorm as transformers writes it saves the fp32 upcast (4h) and
//!   the normalised value (h in the input dtype) and its output feeds the linear, which saves it;
//!   LayerNorm saves its input; under autocast both run in fp32 and the linear saves its fp16
//!   cast of the output;
//! - q, k, v projections' outputs; rotary embeddings save `rotate_half` of q and k and their
//!   rotated results; grouped-query attention through SDPA or eager expands k and v to all heads
//!   (`repeat_kv`);
//! - SDPA/flash keep the output and a log-sum-exp; eager attention keeps the softmax (fp32 in
//!   Llama-style models and under autocast), its half copy or the dropout mask and output: the
//!   `5·a·s/h` term of Korthikanti et al. 2022;
//! - the output projection's input (a contiguous copy of the attention output);
//! - a gated MLP keeps gate, up, act(gate) and their product (4·c·I); a plain MLP the first
//!   projection's output and the activation's (2·c·I); dropout keeps a 1-byte mask;
//! - MoE layers route each token to `top_k` experts: router softmax (fp32), and per routed copy
//!   the gathered input, the expert's MLP tensors and its weighted output.
//!
//! `torch.compile` fuses pointwise chains: norms keep their input, rotary keeps only its
//! results, and a gated MLP keeps gate and up.

use super::precision::Precision;
use crate::workload::{AttentionImpl, GradCheckpointing, Mode, Workload};
use vramplan_profiles::model::{AttentionKind, ModelDescription, NormKind};

/// Activation memory of one block for a given number of tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BlockActivations {
    /// Tensors kept for backward, bytes each.
    pub saved: Vec<u64>,
    /// Bytes live only during the block's forward, on top of `saved`.
    pub forward_transient: u64,
    /// Bytes live only during the block's backward, on top of what it frees.
    pub backward_transient: u64,
    /// The block's input (the residual stream), kept when the block is checkpointed.
    pub input: u64,
}

/// Families whose training configs use dropout by default (attention, hidden, or both).
fn trains_with_dropout(model_type: &str) -> bool {
    matches!(model_type, "bert" | "gpt2" | "gpt_bigcode" | "opt" | "t5" | "xlnet")
}

/// True if the model applies rotary position embeddings: it holds an `inv_freq` buffer.
fn uses_rotary(model: &ModelDescription) -> bool {
    let mut found = false;
    model.root.visit(&mut |m| found |= m.tensors.iter().any(|t| t.name == "inv_freq"));
    found
}

/// Per-token sizes of one block's shape.
struct Shape {
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    /// Width of the MLP each token passes through (dense intermediate, or routed experts').
    intermediate: u64,
    gated: bool,
    rms: bool,
    rotary: bool,
    dropout: bool,
    /// MoE: experts, top-k, shared intermediate.
    moe: Option<(u64, u64, u64)>,
    cross_attention: bool,
}

fn shape(model: &ModelDescription, layer: usize, training: bool, rotary: bool) -> Shape {
    let f = &model.facts;
    let facts = f.layers.get(layer);
    let moe_layer = facts.is_some_and(|l| l.moe);
    let (intermediate, moe) = match (&f.moe, moe_layer) {
        (Some(m), true) => (
            m.expert_intermediate_size,
            Some((u64::from(m.experts), u64::from(m.top_k), m.shared_intermediate_size)),
        ),
        _ => (f.intermediate_size, None),
    };
    let (heads, head_dim) = match &f.attention {
        AttentionKind::MultiLatent { qk_nope_head_dim, qk_rope_head_dim, .. } => {
            (f.num_attention_heads, qk_nope_head_dim + qk_rope_head_dim)
        }
        AttentionKind::Standard => (f.num_attention_heads, f.head_dim),
    };
    Shape {
        hidden: f.hidden_size,
        heads,
        kv_heads: if matches!(f.attention, AttentionKind::MultiLatent { .. }) {
            heads
        } else {
            f.num_kv_heads
        },
        head_dim,
        intermediate,
        gated: f.gated_mlp,
        rms: f.norm == NormKind::RmsNorm,
        rotary,
        dropout: training && trains_with_dropout(&f.model_type),
        moe,
        cross_attention: facts.is_some_and(|l| l.cross_attention),
    }
}

/// The activation model of one model under one workload: traits of the whole model worked out
/// once, then [`ActivationModel::block`] per block.
pub(crate) struct ActivationModel<'a> {
    model: &'a ModelDescription,
    workload: &'a Workload,
    precision: Precision,
    rotary: bool,
}

impl<'a> ActivationModel<'a> {
    pub(crate) fn new(model: &'a ModelDescription, workload: &'a Workload, precision: Precision) -> Self {
        ActivationModel { model, workload, precision, rotary: uses_rotary(model) }
    }

    /// Activations of block `layer` for `batch` sequences of `seq` tokens (training keeps
    /// tensors for backward; inference keeps none, only its transient peak).
    pub(crate) fn block(&self, layer: usize, batch: u64, seq: u64) -> BlockActivations {
        block(self.model, layer, self.workload, &self.precision, batch, seq, self.rotary)
    }
}

fn block(
    model: &ModelDescription,
    layer: usize,
    workload: &Workload,
    precision: &Precision,
    batch: u64,
    seq: u64,
    rotary: bool,
) -> BlockActivations {
    let training = workload.mode == Mode::Train;
    let sh = shape(model, layer, training, rotary);
    let tokens = batch * seq;
    let c = precision.compute_bytes();
    let up = precision.upcast_bytes();
    // The residual stream: fp32 under autocast (fp32 embeddings plus half outputs promote).
    let residual = if precision.autocast { 4 } else { c };
    let compile = workload.switches.compile;
    let (h, a, k, d) = (sh.hidden, sh.heads, sh.kv_heads, sh.head_dim);
    let span = match model.facts.layers.get(layer).and_then(|l| l.attention_window) {
        Some(w) if workload.attention != AttentionImpl::Eager => w.min(seq),
        _ => seq,
    };
    let mut per_token: Vec<u64> = Vec::new();
    let mut per_sequence_sq: Vec<u64> = Vec::new(); // bytes per (batch · heads · s · s) element group
    let norm_then_linear = |out: &mut Vec<u64>| {
        if compile {
            out.extend([residual * h, c * h]);
        } else if sh.rms {
            // fp32 upcast (the residual itself when already fp32), normalised value, output.
            out.extend([4 * h, up * h, c * h]);
        } else {
            // LayerNorm keeps its input; its output (or the linear's half cast of it) feeds on.
            out.extend([residual * h, c * h]);
        }
    };

    // Attention.
    norm_then_linear(&mut per_token);
    let attention_sublayers = if sh.cross_attention { 2 } else { 1 };
    for _ in 0..attention_sublayers {
        let (q, kv) = (a * d, k * d);
        if !(compile && sh.rotary) {
            per_token.extend([c * q, c * kv]);
        }
        per_token.push(c * kv); // v
        if sh.rotary {
            if compile {
                per_token.extend([c * q, c * kv]);
            } else {
                per_token.extend([c * q, c * kv, c * q, c * kv]); // rotate_half and rotated q, k
            }
        }
        if k < a && workload.attention != AttentionImpl::Flash {
            per_token.extend([c * q, c * q]); // repeat_kv of k and v
        }
        match workload.attention {
            AttentionImpl::Eager => {
                // Llama-style models and autocast take the softmax in fp32.
                let softmax = if sh.rms || precision.autocast { 4 } else { c };
                per_sequence_sq.push(softmax);
                if sh.dropout {
                    per_sequence_sq.extend([1, if precision.autocast { c } else { softmax }]);
                } else if softmax != c {
                    per_sequence_sq.push(c);
                }
                // The product with v is not saved; only its contiguous copy (below) is.
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => per_token.extend([c * q, 4 * a]),
        }
        per_token.push(c * q); // o_proj input (contiguous copy)
        if sh.dropout {
            per_token.push(h); // residual dropout mask
        }
    }

    // MLP.
    norm_then_linear(&mut per_token);
    let mlp = |width: u64, out: &mut Vec<u64>| {
        if sh.gated {
            if compile { out.extend([c * width, c * width]) } else { out.extend([c * width; 4]) }
        } else {
            out.extend([c * width, c * width]);
        }
    };
    match sh.moe {
        Some((experts, top_k, shared)) => {
            per_token.push(4 * experts); // router softmax in fp32
            for _ in 0..top_k {
                per_token.push(c * h); // gathered input
                mlp(sh.intermediate, &mut per_token);
                per_token.push(c * h); // expert output, weighted
            }
            if shared > 0 {
                mlp(shared, &mut per_token);
            }
        }
        None => mlp(sh.intermediate, &mut per_token),
    }
    if sh.dropout {
        per_token.push(h);
    }

    // Transients: eager attention materialises raw, scaled and masked scores before softmax;
    // the MLP's backward holds gradients of its widest tensors.
    // Saturating: with sdpa or flash the scores are never formed, and may not fit in u64.
    let scores = batch.saturating_mul(a).saturating_mul(seq).saturating_mul(span);
    let eager = workload.attention == AttentionImpl::Eager;
    let forward_transient =
        if eager { 2 * c * scores } else { 0 } + residual * h * tokens + c * sh.intermediate * tokens;
    let backward_transient = if eager { 2 * 4 * scores } else { 3 * c * a * d * tokens }
        .max(3 * c * sh.intermediate * tokens)
        + 2 * residual * h * tokens;

    let mut saved: Vec<u64> = if training {
        per_token
            .iter()
            .map(|b| b * tokens)
            .chain(per_sequence_sq.iter().map(|b| b * batch * a * seq * span))
            .collect()
    } else {
        Vec::new()
    };
    if training && workload.grad_checkpointing == GradCheckpointing::Selective && eager {
        // Selective recomputation drops the attention-score tensors (Korthikanti et al. §4.2).
        saved.truncate(per_token.len());
    }
    BlockActivations { saved, forward_transient, backward_transient, input: residual * h * tokens }
}
