//! AutoAWQ's fused modules (`--awq-fused MAX_SEQ_LEN`: AutoAWQ's
//! `from_quantized(fuse_layers=True, max_new_tokens=MAX_SEQ_LEN, batch_size=--batch)`), a runtime
//! of its own rather than transformers' AWQ linears. What it allocates, from AutoAWQ 0.1.6
//! (`awq/models/base.py`, `awq/models/llama.py` and `mistral.py`, `awq/utils/fused_utils.py`,
//! `awq/modules/fused/{attn,cache,block,model}.py`, `awq/modules/linear.py`):
//! - at the fuse, layer by layer (`LlamaFuser.fuse_transformer`): a `WQLinear_GEMM` for q, k and
//!   v together, its zero-filled buffers made at the fused shape and each replaced by the
//!   `torch.cat` of q's, k's and v's (`fuse_qkv`), while the unfused model still holds q, k and
//!   v; the layer's `WindowedCache`, V then K, each `torch.zeros(shape).to(device).half()`
//!   (fp32 on the GPU, then its fp16 copy) for `[batch, kv heads, max_seq_len, head_dim]`; and
//!   its `RoPE.freqs_cis`, complex64 `[2·max_seq_len, head_dim/2]`. The unfused q, k and v go
//!   when `self.model.model` is replaced by the fused `LlamaLikeModel`, after the last layer;
//! - in prefill, `QuantAttentionFused` computes eager scores (`matmul`, `/ sqrt(d)`, `+ mask`)
//!   and takes `F.softmax(scores.float(), dim=-1).type_as(xq)`: the masked half scores, their
//!   fp32 copy and the fp32 probabilities are live at once;
//! - the cache is the `WindowedCache`, fp16 whatever the compute dtype, for `max_seq_len`
//!   tokens of the whole batch from the load on (it rolls past them), not transformers' cache.
//!
//! docs/memory-model.md, "AutoAWQ's fused modules"; checked by hand in `sim/tests/awq_fused.rs`.

use crate::workload::{AttentionImpl, Engine, Mode, Quant, Workload};
use vramplan_profiles::model::{AttentionKind, ModelDescription};
use vramplan_profiles::{DType, InputError};

/// The model families AutoAWQ fuses into its `LlamaLikeBlock` (separate q, k, v projections,
/// a gated MLP, RMSNorm, rotary positions): its fusers for Llama, Mistral, Aquila and Yi (0.1.6;
/// Qwen2 from 0.2).
const FUSED_FAMILIES: &[&str] = &["llama", "mistral", "aquila", "yi", "qwen2"];

/// The flag's name, for errors (the key is `awq_fused`).
const FLAG: &str = "--awq-fused";

/// The attention the fused module runs in prefill, where `--awq-fused` is given: its own eager
/// scores (there is no SDPA path), or `flash_attn_func` where `--attn flash` asks for AutoAWQ
/// 0.2.7.post3 and later (`Fused attention: Switch to Flash Decoding`, #656).
pub(crate) fn attention(w: &Workload) -> Option<AttentionImpl> {
    w.awq_fused.map(|_| match w.attention {
        AttentionImpl::Flash => AttentionImpl::Flash,
        _ => AttentionImpl::Eager,
    })
}

/// Whether the fused attention's softmax reads an fp32 copy of the scores
/// (`F.softmax(scores.float(), dim=-1)`), live beside them and the fp32 probabilities.
pub(crate) fn softmax_copies_input(w: &Workload) -> bool {
    attention(w) == Some(AttentionImpl::Eager)
}

/// Bytes of one of a layer's two `WindowedCache` tensors (V or K): fp16 `[batch, kv heads,
/// max_seq_len, head_dim]` (K as `[.., head_dim / 8, max_seq_len, 8]`, the same bytes).
pub(crate) fn cache_tensor_bytes(batch: u64, max_seq_len: u64, kv_heads: u64, head_dim: u64) -> u64 {
    2 * batch * max_seq_len * kv_heads * head_dim
}

/// Bytes of a layer's `RoPE.freqs_cis`: complex64 (8 bytes) `[2·max_seq_len, head_dim / 2]`.
pub(crate) fn rope_bytes(max_seq_len: u64, head_dim: u64) -> u64 {
    8 * (2 * max_seq_len) * (head_dim / 2)
}

/// Refuses `--awq-fused` where AutoAWQ's fused runtime does not run: training, another engine,
/// weights other than AWQ's, a family AutoAWQ does not fuse, or a KV-cache dtype (its cache is
/// fp16).
pub(crate) fn check_configuration(w: &Workload, model: &ModelDescription) -> Result<(), InputError> {
    let Some(max_seq_len) = w.awq_fused else { return Ok(()) };
    let refuse = |problem: String, fix: &str| {
        Err(InputError::new("workload", format!("{FLAG} {max_seq_len}: {problem}"))
            .at_key("awq_fused")
            .with_fix(fix))
    };
    if max_seq_len == 0 {
        return refuse("a fused cache of 0 tokens".into(), "give the longest context, `--awq-fused 2048`");
    }
    if w.mode != Mode::Inference {
        return refuse(
            "AutoAWQ's fused modules run inference only".into(),
            "add `--mode inference`, or leave out --awq-fused",
        );
    }
    if w.engine != Engine::Transformers {
        return refuse(
            "AutoAWQ's fused modules are a runtime of their own, not a serving engine's".into(),
            "leave out --engine, or leave out --awq-fused",
        );
    }
    if !matches!(w.quant, Quant::Awq { .. }) {
        return refuse(
            "AutoAWQ fuses AWQ checkpoints only".into(),
            "add `--quant awq`, or leave out --awq-fused",
        );
    }
    let family = model.facts.model_type.as_str();
    if !FUSED_FAMILIES.contains(&family)
        || !matches!(model.facts.attention, AttentionKind::Standard)
        || model.facts.vision.is_some()
    {
        return refuse(
            format!(
                "AutoAWQ fuses {} models into its LlamaLikeBlock, and this is `{family}`",
                FUSED_FAMILIES.join(", ")
            ),
            "leave out --awq-fused (transformers' AWQ linears)",
        );
    }
    if let Some(dtype) = w.kv_dtype
        && dtype != DType::F16
    {
        return refuse(
            "the fused modules' WindowedCache is fp16".into(),
            "leave out --kv-dtype under --awq-fused",
        );
    }
    Ok(())
}

/// Refuses a prompt longer than the fused cache: AutoAWQ writes the prompt's keys and values into
/// `max_seq_len` slots at once (`WindowedCache.update_kv`), which fails past them; and a cache past
/// the sequence's bound `max_seq` or, with the batch, the step's `max_tokens` (the bounds on
/// `--seq` and batch × seq that keep every figure within `u64`).
pub(crate) fn check_shape(w: &Workload, max_seq: u64, max_tokens: u64) -> Result<(), InputError> {
    let Some(max_seq_len) = w.awq_fused else { return Ok(()) };
    if max_seq_len > max_seq || w.batch.saturating_mul(max_seq_len) > max_tokens {
        return Err(InputError::new(
            "workload",
            format!(
                "{FLAG} {max_seq_len}: a fused cache past {max_seq} tokens, or {max_tokens} with the batch"
            ),
        )
        .at_key("awq_fused")
        .with_fix("give the context the run needs, `--awq-fused 2048`"));
    }
    let prompt = w.prompt.unwrap_or(w.seq).min(w.seq);
    if prompt > max_seq_len {
        return Err(InputError::new(
            "workload",
            format!("{FLAG} {max_seq_len}: a prompt of {prompt} tokens does not fit the fused cache"),
        )
        .at_key("awq_fused")
        .with_fix(format!("give `--awq-fused {prompt}` or more, or a shorter --prompt")));
    }
    Ok(())
}
