//! `DeepseekV2ForCausalLM` and `DeepseekV3ForCausalLM` (DeepSeek-V2, V2-Lite, V3, R1): multi-head
//! latent attention, a mixture of fine-grained routed experts plus shared experts, and dense MLPs
//! in the first `first_k_dense_replace` layers.
//!
//! Module names (transformers `modeling_deepseek_v2.py` / `modeling_deepseek_v3.py`):
//! `model.layers.N.self_attn.{q_a_proj, q_a_layernorm, q_b_proj}` (or `q_proj` when
//! `q_lora_rank` is null, as in V2-Lite), `…self_attn.{kv_a_proj_with_mqa, kv_a_layernorm,
//! kv_b_proj, o_proj}`; MoE layers `…mlp.{experts, gate, shared_experts}` where 4.x has
//! `experts.E.{gate_proj, up_proj, down_proj}` and 5.x fuses them into `experts.gate_up_proj`
//! `[E, 2I, H]` / `experts.down_proj` `[E, H, I]` (`DeepseekV2Experts` / `DeepseekV3Experts`); the
//! router is `DeepseekV2MoEGate` (4.x) / `DeepseekV2TopkRouter` (5.x) for V2 and
//! `DeepseekV3TopkRouter` for V3, whose persistent `e_score_correction_bias` buffer 5.x loads in
//! fp32 (`_keep_in_fp32_modules_strict`; a meta-device build shows the model dtype) and 4.x in the
//! model dtype. Every MoE layer has `shared_experts`, of width `moe_intermediate_size ×
//! n_shared_experts` (empty when that is 0). Like transformers, layers from
//! `first_k_dense_replace` on are MoE whatever `moe_layer_freq` says (DeepSeek's own remote code
//! honours it; a note says so when it is not 1). V2's `mlp_bias` gives its dense MLPs and shared
//! experts (and 4.x's per-expert modules) biases; V3 has none. The multi-token-prediction layers
//! of the V3 checkpoints (`num_nextn_predict_layers`) are not part of the model transformers
//! builds; a note says how large they are. FP8 checkpoints (`quantization_config`) are described
//! as stored: see [`crate::model::quantization`].

use super::HfConfig;
use super::llama::{BaseModel, MODEL, causal_lm, finish, gated_mlp, layer_facts};
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, MoeFacts, Naming, NormKind,
    Tensor,
};
use crate::{DType, InputError};

/// The multi-head latent attention sizes.
#[derive(Debug, Clone, Copy)]
struct Mla {
    hidden: u64,
    heads: u64,
    q_lora_rank: Option<u64>,
    kv_lora_rank: u64,
    qk_nope: u64,
    qk_rope: u64,
    v_head: u64,
    bias: bool,
}

/// The routed and shared experts of an MoE layer.
#[derive(Debug, Clone, Copy)]
struct Experts {
    routed: u32,
    top_k: u32,
    intermediate: u64,
    shared: u64,
    /// V2's `mlp_bias`: biases on every `DeepseekV2MLP` projection.
    bias: bool,
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let v3 = arch == "DeepseekV3ForCausalLM";
    let prefix = if v3 { "DeepseekV3" } else { "DeepseekV2" };
    let layers = config.positive(&["num_hidden_layers"])?;
    let hidden = config.positive(&["hidden_size"])?;
    let heads = config.positive(&["num_attention_heads"])?;
    let kv_heads = config.positive_or(&["num_key_value_heads"], heads)?;
    let vocab = config.positive(&["vocab_size"])?;
    let intermediate = config.positive(&["intermediate_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], if v3 { 4096 } else { 2048 })?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let activation = config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into());
    let mla = Mla {
        hidden,
        heads,
        q_lora_rank: config.opt_positive(&["q_lora_rank"])?,
        kv_lora_rank: config.positive_or(&["kv_lora_rank"], 512)?,
        qk_nope: config.positive_or(&["qk_nope_head_dim"], 128)?,
        qk_rope: config.positive_or(&["qk_rope_head_dim"], 64)?,
        v_head: config.positive_or(&["v_head_dim"], 128)?,
        bias: config.bool_or(&["attention_bias"], false)?,
    };
    let routed = config.positive_or(&["n_routed_experts"], if v3 { 256 } else { 64 })?;
    let experts = Experts {
        routed: u32::try_from(routed).map_err(|_| {
            InputError::new(config.origin(), format!("{routed} experts is more than any model has"))
                .at_key("n_routed_experts")
        })?,
        top_k: u32::try_from(config.positive_or(&["num_experts_per_tok"], if v3 { 8 } else { 6 })?)
            .unwrap_or(u32::MAX),
        intermediate: config.positive_or(&["moe_intermediate_size"], if v3 { 2048 } else { 1407 })?,
        shared: config.uint_or(&["n_shared_experts"], if v3 { 1 } else { 2 })?,
        bias: !v3 && config.bool_or(&["mlp_bias"], false)?,
    };
    let first_dense = config.uint_or(&["first_k_dense_replace"], if v3 { 3 } else { 0 })?;
    let moe_every = config.positive_or(&["moe_layer_freq"], 1)?;
    let mtp_layers = config.uint_or(&["num_nextn_predict_layers"], 0)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let sparse: Vec<bool> = (0..layers).map(|i| i >= first_dense).collect();
    let list = "model.layers";
    let norm_class = format!("{prefix}RMSNorm");
    let blocks = sparse
        .iter()
        .enumerate()
        .map(|(i, is_sparse)| {
            let path = format!("{list}.{i}");
            let mlp = if *is_sparse {
                moe_block(&b, v3, options.naming, &path, hidden, experts)
            } else {
                gated_mlp(&b, &path, "mlp", &format!("{prefix}MLP"), hidden, intermediate, experts.bias)
            };
            b.block(list, &i.to_string(), &format!("{prefix}DecoderLayer"))
                .with_child(attention(&b, prefix, &path, mla))
                .with_child(mlp)
                .with_child(b.norm(&path, "input_layernorm", &norm_class, hidden, false))
                .with_child(b.norm(&path, "post_attention_layernorm", &norm_class, hidden, false))
        })
        .collect();
    let embed_tokens = b.embedding(MODEL, "embed_tokens", vocab, hidden);
    let root = causal_lm(
        &b,
        arch,
        prefix,
        BaseModel { embed_tokens, blocks, hidden, vocab, rotary_dim: mla.qk_rope },
    );

    let mut notes = Vec::new();
    if moe_every != 1 {
        notes.push(format!(
            "`moe_layer_freq` {moe_every} is ignored, as transformers ignores it: every layer from \
             {first_dense} on is MoE (DeepSeek's own remote code would make only those whose index is a \
             multiple of {moe_every} MoE)"
        ));
    }
    if mtp_layers > 0 {
        notes.push(mtp_note(mtp_layers, hidden, mla, experts));
    }
    let any_sparse = sparse.iter().any(|s| *s);
    let facts = ArchFacts {
        model_type: if v3 { "deepseek_v3" } else { "deepseek_v2" }.into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: mla.qk_nope + mla.qk_rope,
        intermediate_size: intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::MultiLatent {
            q_lora_rank: mla.q_lora_rank,
            kv_lora_rank: mla.kv_lora_rank,
            qk_nope_head_dim: mla.qk_nope,
            qk_rope_head_dim: mla.qk_rope,
            v_head_dim: mla.v_head,
        },
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        activation,
        moe: any_sparse.then(|| MoeFacts {
            experts: experts.routed,
            top_k: experts.top_k,
            expert_intermediate_size: experts.intermediate,
            shared_experts: u32::try_from(experts.shared).unwrap_or(u32::MAX),
            shared_intermediate_size: experts.intermediate * experts.shared,
        }),
        tie_word_embeddings: tie,
        layers: layer_facts(list, &sparse, &[]),
        no_split_classes: vec![format!("{prefix}DecoderLayer")],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = ModelDescription {
        custom: false,
        name: config.origin().to_string(),
        architecture: arch.to_string(),
        naming: options.naming,
        dtype,
        facts,
        root,
        notes,
        quantization: None,
        float_forms: Default::default(),
    };
    finish(description)
}

/// `self_attn`: multi-head latent attention.
fn attention(b: &Builder, prefix: &str, layer: &str, m: Mla) -> Module {
    let attn = b.container(layer, "self_attn", &format!("{prefix}Attention"));
    let p = attn.path.clone();
    let q_head = m.qk_nope + m.qk_rope;
    let norm_class = format!("{prefix}RMSNorm");
    let attn = match m.q_lora_rank {
        Some(rank) => attn
            .with_child(b.linear(&p, "q_a_proj", m.hidden, rank, m.bias))
            .with_child(b.norm(&p, "q_a_layernorm", &norm_class, rank, false))
            .with_child(b.linear(&p, "q_b_proj", rank, m.heads * q_head, false)),
        None => attn.with_child(b.linear(&p, "q_proj", m.hidden, m.heads * q_head, false)),
    };
    attn.with_child(b.linear(&p, "kv_a_proj_with_mqa", m.hidden, m.kv_lora_rank + m.qk_rope, m.bias))
        .with_child(b.norm(&p, "kv_a_layernorm", &norm_class, m.kv_lora_rank, false))
        .with_child(b.linear(&p, "kv_b_proj", m.kv_lora_rank, m.heads * (m.qk_nope + m.v_head), false))
        .with_child(b.linear(&p, "o_proj", m.heads * m.v_head, m.hidden, m.bias))
}

/// The MoE `mlp` of one layer: routed experts, router and shared experts.
fn moe_block(b: &Builder, v3: bool, naming: Naming, layer: &str, hidden: u64, e: Experts) -> Module {
    let prefix = if v3 { "DeepseekV3" } else { "DeepseekV2" };
    let block_class = match (v3, naming) {
        (true, _) => "DeepseekV3MoE",
        (false, Naming::V4) => "DeepseekV2MoE",
        (false, Naming::V5) => "DeepseekV2Moe",
    };
    let block = b.container(layer, "mlp", block_class);
    let p = block.path.clone();
    let inter = e.intermediate;
    let routed = u64::from(e.routed);
    let expert_class = format!("{prefix}MLP");
    let experts = match naming {
        Naming::V4 => b.expert_list(&p, "experts", e.routed, |_, path| {
            Module::new(path, expert_class.as_str(), crate::model::ModuleKind::Container)
                .with_child(b.linear(path, "gate_proj", hidden, inter, e.bias))
                .with_child(b.linear(path, "up_proj", hidden, inter, e.bias))
                .with_child(b.linear(path, "down_proj", inter, hidden, e.bias))
        }),
        Naming::V5 => b.fused_experts(
            &p,
            "experts",
            &format!("{prefix}Experts"),
            e.routed,
            &[("gate_up_proj", &[routed, 2 * inter, hidden]), ("down_proj", &[routed, hidden, inter])],
        ),
    };
    let gate = match (v3, naming) {
        // `torch.zeros(n_routed_experts)`: built in the load dtype. 5.x's loader then casts the
        // checkpoint's values to fp32 (`_keep_in_fp32_modules_strict`, whenever the load dtype is
        // fp16 or bf16), so a loaded 5.x model holds fp32; 4.x keeps the load dtype.
        (true, Naming::V5) => b
            .router(&p, "gate", "DeepseekV3TopkRouter", hidden, e.routed, false)
            .with_tensor(Tensor::buffer("e_score_correction_bias", &[routed], DType::F32, true)),
        (true, Naming::V4) => b
            .router(&p, "gate", "DeepseekV3TopkRouter", hidden, e.routed, false)
            .with_tensor(Tensor::load_dtype_buffer("e_score_correction_bias", &[routed], b.dtype, true)),
        (false, Naming::V4) => b.router(&p, "gate", "DeepseekV2MoEGate", hidden, e.routed, false),
        (false, Naming::V5) => b.router(&p, "gate", "DeepseekV2TopkRouter", hidden, e.routed, false),
    };
    // Built even when `n_shared_experts` is 0, as transformers does (zero-width projections).
    let shared = gated_mlp(b, &p, "shared_experts", &expert_class, hidden, inter * e.shared, e.bias);
    block.with_child(experts).with_child(gate).with_child(shared)
}

/// What the checkpoint holds besides the model transformers builds: the multi-token-prediction
/// layers, each an MoE decoder layer plus `enorm`, `hnorm`, `eh_proj` (`2H → H`) and
/// `shared_head.norm`, with the embedding and output head shared with the main model.
fn mtp_note(count: u64, hidden: u64, m: Mla, e: Experts) -> String {
    let q = match m.q_lora_rank {
        Some(rank) => hidden * rank + rank + rank * m.heads * (m.qk_nope + m.qk_rope),
        None => hidden * m.heads * (m.qk_nope + m.qk_rope),
    };
    let attention = q
        + hidden * (m.kv_lora_rank + m.qk_rope)
        + m.kv_lora_rank
        + m.kv_lora_rank * m.heads * (m.qk_nope + m.v_head)
        + m.heads * m.v_head * hidden;
    let moe = u64::from(e.routed) * hidden + 3 * hidden * e.intermediate * (u64::from(e.routed) + e.shared);
    let per_layer = attention + moe + 2 * hidden + 2 * hidden * hidden + 3 * hidden;
    format!(
        "the checkpoint also holds {count} multi-token-prediction layer(s) (`num_nextn_predict_layers`), \
         about {:.1}B parameters each besides the shared embedding and output head; transformers does \
         not build them (they are skipped on load), so they are not in this model",
        per_layer as f64 / 1e9
    )
}
