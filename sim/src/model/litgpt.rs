//! LitGPT's fine-tuning step (`--trainer litgpt`; LitGPT 0.5.13, `litgpt/finetune/full.py` and
//! `litgpt/finetune/lora.py` on Lightning Fabric 2.6): what it holds that transformers' Trainer
//! does not, from its source (docs/memory-model.md "LitGPT").
//!
//! - Its own `GPT` (`litgpt/model.py`) never ties the head to the embedding: `lm_head` and
//!   `transformer.wte` are two parameters (the checkpoint converter copies the embedding into
//!   `lm_head.weight` for a tied checkpoint), so a tied model's head counts as a tensor of its
//!   own, trains in a full fine-tune and takes no tied gradient (`model/units.rs`, `program.rs`).
//! - `bf16-true` (the default precision): the model, LoRA's adapters included, is built in bf16
//!   under `fabric.init_module()`, so gradients and `torch.optim.AdamW`'s states are bf16
//!   (`units::trainable_dtype` puts every trainer but transformers' and Unsloth's there).
//! - `instantiate_torch_optimizer` passes no `fused`, so AdamW runs its foreach implementation
//!   on CUDA: `_multi_tensor_adamw` takes `torch._foreach_sqrt(exp_avg_sqs)` into a new list,
//!   one temporary the size of every state (of one of the two) at once ([`optimizer_step_transient`]).
//! - The loss: `lora.py` calls `model(input_ids, lm_head_chunk_size=128)`, which returns the
//!   logits as a list of 128-token chunks, and `chunked_cross_entropy` takes each chunk's
//!   `cross_entropy(reduction="none")` in the model's dtype (log-softmax kept for backward);
//!   `full.py` takes the logits whole and `chunked_cross_entropy` splits their
//!   `reshape(-1, vocab)` (a copy when the batch has more than one row: the shifted slice is not
//!   contiguous) into 128-row chunks. Either way the `logits` variable holds the logits through
//!   `fabric.backward` ([`LossBytes`]).
//! - QLoRA (`--quantize bnb.nf4`): Fabric's `BitsandbytesPrecision` replaces every
//!   `nn.Linear` (`_convert_layers` with no `ignore_modules`), the head's included; then the
//!   script swaps `transformer.wte` for a bitsandbytes `StableEmbedding`, after the optimizer is
//!   built: its weight requires a gradient that no optimizer steps or zeroes, so the embedding's
//!   gradient is held from the first backward on ([`stable_embedding_gradient`]). The optimizer
//!   is `bnb.optim.PagedAdamW` (`instantiate_bnb_optimizer`): `--optimizer paged-adamw`.

use super::activations::LoraSite;
use super::precision::Precision;
use crate::workload::{Finetune, Mode, Quant, Trainer, Workload};

/// The chunk of the sequence LitGPT's head and loss work in (`lm_head_chunk_size=128` in
/// `lora.py`; `chunk_size=128`, `chunked_cross_entropy`'s default, in `full.py`).
pub(crate) const CHUNK: u64 = 128;

/// Whether `workload` runs LitGPT's finetune scripts.
pub(crate) fn runs(workload: &Workload) -> bool {
    workload.trainer == Trainer::Litgpt
}

/// Whether the head is quantized with the blocks' linears: LitGPT's 4-bit precision plugin
/// converts every `nn.Linear`.
pub(crate) fn quantizes_head(workload: &Workload) -> bool {
    runs(workload) && matches!(workload.quant, Quant::Nf4 { .. } | Quant::Fp4 { .. } | Quant::Int8)
}

/// The bytes of an embedding of `weight_bytes` that LitGPT's QLoRA holds twice more: the
/// `StableEmbedding`'s gradient, from the first backward on, and the replaced embedding, which
/// the script's `old_embedding` keeps to its end (both in the model's dtype); 0 otherwise.
pub(crate) fn stable_embedding_gradient(workload: &Workload, weight_bytes: u64) -> u64 {
    let qlora = matches!(workload.finetune, Finetune::Lora { .. })
        && matches!(workload.quant, Quant::Nf4 { .. } | Quant::Fp4 { .. });
    if runs(workload) && workload.mode == Mode::Train && qlora { weight_bytes } else { 0 }
}

/// The optimizer step's widest temporary on a device whose trainable tensors take
/// `state_bytes` per state: foreach AdamW's `exp_avg_sq_sqrt` list, one state's size (torch's
/// AdamW only; bitsandbytes' kernels update in place).
pub(crate) fn optimizer_step_transient(workload: &Workload, state_bytes: u64) -> u64 {
    let torch_adamw = workload.optimizer == crate::workload::Optimizer::Adamw;
    if runs(workload) && torch_adamw { state_bytes } else { 0 }
}

/// What LitGPT's loss holds, in bytes, for `batch` sequences of `seq` tokens, a vocabulary of
/// `vocab` and `c`-byte logits.
pub(crate) struct LossBytes {
    /// The logits (all chunks), held by the loop's `logits` through backward.
    pub logits: u64,
    /// The log-softmax of every chunk, kept by `cross_entropy` for backward (the shifted
    /// `seq - 1` tokens).
    pub log_softmax: u64,
    /// The loss's forward temporary: the contiguous copy of the shifted logits in `full.py`
    /// (batch above 1), freed when the loss returns.
    pub forward_copy: u64,
    /// One chunk's gradient (`nll_loss` and `log_softmax` backward make one each).
    pub chunk: u64,
    /// `full.py` only: the gradient reassembled for the whole logits (the chunks' gradients
    /// concatenated by the split's backward, then the slice's backward writes them into a
    /// zero tensor the logits' size); 0 where each chunk's gradient goes to its own head chunk.
    pub whole_gradient: u64,
}

/// LitGPT's loss for `batch × seq` tokens (`full`: `full.py`'s, else `lora.py`'s).
pub(crate) fn loss_bytes(full: bool, batch: u64, seq: u64, vocab: u64, c: u64) -> LossBytes {
    let row = c.saturating_mul(vocab);
    let logits = row.saturating_mul(batch).saturating_mul(seq);
    let shifted = row.saturating_mul(batch).saturating_mul(seq.saturating_sub(1));
    if full {
        LossBytes {
            logits,
            log_softmax: shifted,
            forward_copy: if batch > 1 { shifted } else { 0 },
            chunk: row.saturating_mul(CHUNK.min(batch.saturating_mul(seq))),
            whole_gradient: shifted,
        }
    } else {
        LossBytes {
            logits,
            log_softmax: shifted,
            forward_copy: 0,
            chunk: row.saturating_mul(batch).saturating_mul(CHUNK.min(seq)),
            whole_gradient: 0,
        }
    }
}

/// Per token, what LitGPT's `CausalSelfAttention` keeps for backward under SDPA, for `q` query
/// and `kv` key/value features of `c` bytes over `heads` heads: q and k as `torch.cat` rebuilds
/// them after `apply_rope` (which keeps only its constant `cos` and `sin`); under grouped-query
/// attention k and v as `repeat_interleave` copies them to every head (LitGPT repeats them for
/// training, `n_query_groups != n_head`), else v as a view of the fused `qkv` output, whose
/// whole storage it keeps; SDPA's output (of which the output projection's input is a view:
/// `y.transpose(1, 2).reshape(...)` of the kernel's sequence-major output copies nothing) and
/// its fp32 log-sum-exp per head.
pub(crate) fn attention_saved(c: u64, q: u64, kv: u64, grouped: bool, heads: u64) -> Vec<u64> {
    let (k, v) = if grouped { (c * q, c * q) } else { (c * kv, c * (q + 2 * kv)) };
    vec![c * q, k, v, c * q, 4 * heads]
}

/// Per token, what LitGPT's LoRA adapters keep in a block (`litgpt/lora.py`, `lora_dropout=0.05`
/// by default in `finetune/lora.py` and in the config hub's files): each adapter's `lora_A`
/// output for `lora_B`'s gradient, and for each dropout its 1-byte mask and the dropped copy
/// `lora_A` keeps for its gradient, in place of the input itself (which the frozen base does not
/// keep). q, k and v are one `LoRAQKVLinear` with one dropout; every other wrapped linear
/// (the projection, `fc_1`, `fc_2`, the MLP's `proj`) is a `LoRALinear` with its own.
///
/// `LoRAQKVLinear.zero_pad` scatters the adapters' output into a zero tensor of the fused
/// projection's width (`index_copy_`) when not all of q, k and v are wrapped (LitGPT's default
/// wraps q and v), and autograd keeps the scattered source, of the wrapped parts' width (`q`
/// features for the query, `kv` for a key or value). A fused target (transformers'
/// `query_key_value`) is read as LitGPT's default, q and v.
pub(crate) fn lora_saved(
    sites: &[LoraSite],
    workload: &Workload,
    precision: &Precision,
    q: u64,
    kv: u64,
) -> Vec<u64> {
    let Finetune::Lora { rank, .. } = &workload.finetune else { return Vec::new() };
    let c = precision.compute_bytes();
    let adapter = super::units::trainable_dtype(workload, precision).bits() / 8;
    let mut saved = Vec::new();
    let mut fused: Vec<&str> = Vec::new();
    for site in sites {
        saved.push(adapter * rank);
        let qkv = !site.last && site.parent.to_ascii_lowercase().contains("att");
        if qkv {
            if fused.contains(&site.parent.as_str()) {
                continue;
            }
            fused.push(&site.parent);
        }
        saved.extend([site.inputs, c * site.inputs]);
    }
    let attention: Vec<&str> = sites
        .iter()
        .filter(|s| !s.last && s.parent.to_ascii_lowercase().contains("att"))
        .map(|s| s.path.rsplit('.').next().unwrap_or(""))
        .collect();
    if !attention.is_empty() {
        let any = |names: &[&str]| attention.iter().any(|n| names.contains(n));
        let separate =
            attention.iter().all(|n| ["q_proj", "k_proj", "v_proj", "query", "key", "value"].contains(n));
        let (query, key, value) = if separate {
            (any(&["q_proj", "query"]), any(&["k_proj", "key"]), any(&["v_proj", "value"]))
        } else {
            (true, false, true)
        };
        if !(query && key && value) {
            saved.push(c * (u64::from(query) * q + u64::from(key) * kv + u64::from(value) * kv));
        }
    }
    saved
}

/// Whether a block's two norms read the same input under LitGPT: its GPT-NeoX (Pythia) configs
/// are `parallel_residual=True` with `shared_attention_norm=False`, so `norm_1(x)` and
/// `norm_2(x)` both take the block's input, which each LayerNorm keeps for backward: one tensor.
/// (Phi's configs share one norm, `shared_attention_norm=True`, as transformers' Phi does.)
pub(crate) fn norms_share_input(
    model: &vramplan_profiles::model::ModelDescription,
    workload: &Workload,
) -> bool {
    runs(workload) && model.facts.model_type == "gpt_neox"
}
