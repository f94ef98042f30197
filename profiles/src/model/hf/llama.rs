//! The Llama-style decoders: `LlamaForCausalLM` and the architectures transformers builds the same
//! way — Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, Gemma, Gemma 2, Phi-3, OLMoE and
//! gpt-oss — with the module and parameter names transformers gives them.
//!
//! Every one of them is `model.embed_tokens`, `model.layers.N.{self_attn, mlp, input_layernorm,
//! post_attention_layernorm}`, `model.norm`, `model.rotary_emb` (one model-level rotary module in
//! current transformers) and `lm_head`. What differs is described by a [`Family`]: projection
//! biases (Qwen2 q/k/v, gpt-oss all four), per-head q/k norms (Qwen3) or whole-projection ones
//! (OLMoE), fused `qkv_proj` / `gate_up_proj` (Phi-3), the four norms of a Gemma 2 layer,
//! attention sinks (gpt-oss), sliding windows, tied embeddings by default (Gemma), and the
//! mixture-of-experts block, whose 4.x and 5.x layouts live in [`moe`]. A `quantization_config`
//! is applied to every family alike, by [`crate::model::quantization`].
//!
//! Absent keys take the defaults of each transformers config class, which are not always derived
//! from the other sizes: Mistral and Mixtral default to 8 key/value heads, Qwen3-MoE and Gemma 2
//! to 4, Qwen2 and Qwen3 to 32, Gemma to 16, gpt-oss to 8; Gemma and Gemma 2 default to a
//! `head_dim` of 256, Qwen3 to 128 and gpt-oss to 64 (an explicit `null` means `hidden_size /
//! num_attention_heads`, and `null` key/value heads mean one per attention head). Version
//! differences this module reproduces: 5.x Gemma embeds with `GemmaTextScaledWordEmbedding`, which
//! holds a scalar `embed_scale` buffer; 4.x Qwen2-MoE keeps a rotary module in every attention
//! block besides the model-level one, and 4.x names Qwen2-MoE's and OLMoE's attention after the
//! default SDPA implementation (`Qwen2MoeSdpaAttention`; `attn_implementation="eager"` would give
//! `Qwen2MoeAttention`); 5.x's default rotary embedding ignores `partial_rotary_factor` except in
//! Phi-3, where 4.x applies it everywhere.

mod moe;
mod positions;

use super::HfConfig;
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind,
    MoeFacts, Naming, NormKind, StackKind, Tensor, tree::join,
};
use moe::MoeStyle;
pub(super) use positions::windows_by_layer_type;
use positions::{attention_windows, rotary_dim, sliding_layer_types};
use serde_json::Value;

/// Which of the q/k/v/o projections carry a bias, and which config key decides it.
#[derive(Debug, Clone, Copy)]
enum AttentionBias {
    /// No projection has a bias (Mistral, Mixtral, Phi-3).
    None,
    /// `attention_bias` (with this default) applies to all four projections.
    AllFromKey(bool),
    /// q/k/v always have a bias, o never (Qwen2).
    QkvAlways,
    /// `qkv_bias` (default true) applies to q/k/v, o never has one (Qwen2-MoE).
    QkvFromKey,
}

/// Normalization of queries and keys before the rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QkNorm {
    None,
    /// `q_norm` / `k_norm` of width `head_dim`, applied per head (Qwen3).
    PerHead,
    /// `q_norm` over the whole query projection (`hidden_size`) and `k_norm` over the whole key
    /// projection (OLMoE).
    WholeProjection,
}

/// Which layers use sliding-window attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowRule {
    /// Always full attention.
    None,
    /// `sliding_window` (this default when the key is absent, none when it is null) for every
    /// layer (Mistral: 4096; Mixtral, Phi-3: none).
    EveryLayer(Option<u64>),
    /// Qwen2, Qwen3: a window only when `use_sliding_window` is true, of `sliding_window` (4096
    /// when absent); then `layer_types` when given, else layers from `max_window_layers` (28) on.
    Qwen,
    /// Qwen2-MoE: as [`WindowRule::Qwen`] in 4.x (which has no `layer_types`); 5.x reads
    /// `layer_types` and otherwise slides on even layers below `max_window_layers`.
    Qwen2Moe,
    /// Qwen3-MoE: `sliding_window` on every layer when `use_sliding_window` is true.
    QwenEveryLayer,
    /// `layer_types` when given, else sliding on even layers and full on odd ones, with this
    /// default window (Gemma 2, gpt-oss).
    Alternating(u64),
    /// Gemma 3: `layer_types` when given, else every `sliding_window_pattern`-th layer (6 when
    /// absent) full and the others sliding, with this default window.
    Pattern(u64),
    /// SmolLM3: a window only when `use_sliding_window` is true and `sliding_window` is given,
    /// on the layers `layer_types` names, else on the layers without rotary embedding.
    NoRopeLayers,
}

/// How `embed_tokens` scales its output by `sqrt(hidden_size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EmbedScale {
    /// A plain `nn.Embedding` (the model may scale its output elsewhere).
    None,
    /// 5.x: a `…TextScaledWordEmbedding` with an `embed_scale` buffer; 4.x scales in the model's
    /// forward (Gemma, Gemma 2).
    V5,
    /// A `…TextScaledWordEmbedding` in both versions (Gemma 3).
    Always,
}

/// How one architecture of the family differs from Llama.
#[derive(Debug, Clone, Copy)]
struct Family {
    /// The class-name prefix (`Qwen2Moe` gives `Qwen2MoeDecoderLayer`, `Qwen2MoeRMSNorm`, …).
    prefix: &'static str,
    model_type: &'static str,
    attention_bias: AttentionBias,
    /// `mlp_bias` is read (Llama only).
    mlp_bias_key: bool,
    qk_norm: QkNorm,
    /// Phi-3: `self_attn.qkv_proj` and `mlp.gate_up_proj`.
    fused_projections: bool,
    /// Gemma 2: `pre_feedforward_layernorm` and `post_feedforward_layernorm` as well.
    sandwich_norms: bool,
    /// gpt-oss: a learned `self_attn.sinks` logit per head.
    attention_sinks: bool,
    moe: Option<MoeStyle>,
    window: WindowRule,
    /// Key/value heads when `num_key_value_heads` is absent; `None`: one per attention head.
    kv_heads_default: Option<u64>,
    /// `head_dim` when the key is absent; `None`: `hidden_size / num_attention_heads`.
    head_dim_default: Option<u64>,
    /// Gemma: `embed_tokens` is a `…TextScaledWordEmbedding` with an `embed_scale` buffer.
    scaled_embedding: EmbedScale,
    /// Gemma 3: a rotary embedding per attention type (sliding layers rotate with their own
    /// base): 5.x keeps one module with `{type}_inv_freq` buffers per type present, 4.x a second
    /// module `rotary_emb_local`.
    rotary_per_layer_type: bool,
    /// 5.x applies `partial_rotary_factor` to the default rotary embedding (Phi-3 only).
    partial_rotary_in_default_rope: bool,
    /// The rope type when the config gives none (`yarn` for gpt-oss).
    rope_type_default: &'static str,
    /// Classes 4.x's `_no_split_modules` lists besides the decoder layer, which this model
    /// does not hold (4.57's `Gemma3PreTrainedModel` lists the SigLIP vision tower's for every
    /// Gemma 3 class).
    no_split_v4_extra: &'static [&'static str],
    tie_default: bool,
    max_positions_default: u64,
    activation_default: &'static str,
}

const LLAMA: Family = Family {
    prefix: "Llama",
    model_type: "llama",
    attention_bias: AttentionBias::AllFromKey(false),
    mlp_bias_key: true,
    qk_norm: QkNorm::None,
    fused_projections: false,
    sandwich_norms: false,
    attention_sinks: false,
    moe: None,
    window: WindowRule::None,
    kv_heads_default: None,
    head_dim_default: None,
    scaled_embedding: EmbedScale::None,
    rotary_per_layer_type: false,
    partial_rotary_in_default_rope: false,
    rope_type_default: "default",
    no_split_v4_extra: &[],
    tie_default: false,
    max_positions_default: 2048,
    activation_default: "silu",
};

fn family(arch: &str) -> Option<Family> {
    Some(match arch {
        "LlamaForCausalLM" => LLAMA,
        "MistralForCausalLM" => Family {
            prefix: "Mistral",
            model_type: "mistral",
            attention_bias: AttentionBias::None,
            mlp_bias_key: false,
            window: WindowRule::EveryLayer(Some(4096)),
            kv_heads_default: Some(8),
            max_positions_default: 131072,
            ..LLAMA
        },
        "MixtralForCausalLM" => Family {
            prefix: "Mixtral",
            model_type: "mixtral",
            attention_bias: AttentionBias::None,
            mlp_bias_key: false,
            moe: Some(MoeStyle::Mixtral),
            window: WindowRule::EveryLayer(None),
            kv_heads_default: Some(8),
            max_positions_default: 131072,
            ..LLAMA
        },
        "Qwen2ForCausalLM" => Family {
            prefix: "Qwen2",
            model_type: "qwen2",
            attention_bias: AttentionBias::QkvAlways,
            mlp_bias_key: false,
            window: WindowRule::Qwen,
            kv_heads_default: Some(32),
            max_positions_default: 32768,
            ..LLAMA
        },
        "Qwen2MoeForCausalLM" => Family {
            prefix: "Qwen2Moe",
            model_type: "qwen2_moe",
            attention_bias: AttentionBias::QkvFromKey,
            mlp_bias_key: false,
            moe: Some(MoeStyle::Qwen2Moe),
            window: WindowRule::Qwen2Moe,
            kv_heads_default: Some(16),
            max_positions_default: 32768,
            ..LLAMA
        },
        "Qwen3ForCausalLM" => Family {
            prefix: "Qwen3",
            model_type: "qwen3",
            mlp_bias_key: false,
            qk_norm: QkNorm::PerHead,
            window: WindowRule::Qwen,
            kv_heads_default: Some(32),
            head_dim_default: Some(128),
            max_positions_default: 32768,
            ..LLAMA
        },
        "Qwen3MoeForCausalLM" => Family {
            prefix: "Qwen3Moe",
            model_type: "qwen3_moe",
            mlp_bias_key: false,
            qk_norm: QkNorm::PerHead,
            moe: Some(MoeStyle::Qwen3Moe),
            window: WindowRule::QwenEveryLayer,
            kv_heads_default: Some(4),
            max_positions_default: 32768,
            ..LLAMA
        },
        "GemmaForCausalLM" => Family {
            prefix: "Gemma",
            model_type: "gemma",
            mlp_bias_key: false,
            kv_heads_default: Some(16),
            head_dim_default: Some(256),
            scaled_embedding: EmbedScale::V5,
            tie_default: true,
            max_positions_default: 8192,
            activation_default: "gelu_pytorch_tanh",
            ..LLAMA
        },
        "Gemma2ForCausalLM" => Family {
            prefix: "Gemma2",
            model_type: "gemma2",
            mlp_bias_key: false,
            sandwich_norms: true,
            window: WindowRule::Alternating(4096),
            kv_heads_default: Some(4),
            head_dim_default: Some(256),
            scaled_embedding: EmbedScale::V5,
            tie_default: true,
            max_positions_default: 8192,
            activation_default: "gelu_pytorch_tanh",
            ..LLAMA
        },
        "Gemma3ForCausalLM" => Family {
            prefix: "Gemma3",
            model_type: "gemma3_text",
            mlp_bias_key: false,
            qk_norm: QkNorm::PerHead,
            sandwich_norms: true,
            window: WindowRule::Pattern(4096),
            kv_heads_default: Some(4),
            head_dim_default: Some(256),
            scaled_embedding: EmbedScale::Always,
            rotary_per_layer_type: true,
            no_split_v4_extra: &[
                "SiglipEncoderLayer",
                "SiglipMultiheadAttentionPoolingHead",
                "SiglipVisionEmbeddings",
            ],
            tie_default: true,
            max_positions_default: 131072,
            activation_default: "gelu_pytorch_tanh",
            ..LLAMA
        },
        "GraniteForCausalLM" => Family { prefix: "Granite", model_type: "granite", ..LLAMA },
        "SmolLM3ForCausalLM" => Family {
            prefix: "SmolLM3",
            model_type: "smollm3",
            window: WindowRule::NoRopeLayers,
            kv_heads_default: Some(4),
            tie_default: true,
            max_positions_default: 32768,
            ..LLAMA
        },
        "Phi3ForCausalLM" => Family {
            prefix: "Phi3",
            model_type: "phi3",
            attention_bias: AttentionBias::None,
            mlp_bias_key: false,
            fused_projections: true,
            window: WindowRule::EveryLayer(None),
            partial_rotary_in_default_rope: true,
            max_positions_default: 4096,
            ..LLAMA
        },
        "OlmoeForCausalLM" => Family {
            prefix: "Olmoe",
            model_type: "olmoe",
            mlp_bias_key: false,
            qk_norm: QkNorm::WholeProjection,
            moe: Some(MoeStyle::Olmoe),
            max_positions_default: 4096,
            ..LLAMA
        },
        "GptOssForCausalLM" => Family {
            prefix: "GptOss",
            model_type: "gpt_oss",
            attention_bias: AttentionBias::AllFromKey(true),
            mlp_bias_key: false,
            attention_sinks: true,
            moe: Some(MoeStyle::GptOss),
            window: WindowRule::Alternating(128),
            kv_heads_default: Some(8),
            head_dim_default: Some(64),
            rope_type_default: "yarn",
            max_positions_default: 131072,
            ..LLAMA
        },
        _ => return None,
    })
}

/// The attention sizes of one decoder.
#[derive(Debug, Clone, Copy)]
struct Dims {
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let family = family(arch).ok_or_else(|| {
        InputError::new(config.origin(), format!("`{arch}` is not a Llama-style decoder"))
            .at_key("architectures")
    })?;
    let prefix = family.prefix;
    let layers = config.positive(&["num_hidden_layers"])?;
    let hidden = config.positive(&["hidden_size"])?;
    let heads = config.positive(&["num_attention_heads"])?;
    let head_dim = match (config.object().get("head_dim"), family.head_dim_default) {
        (None, Some(default)) => default,
        _ => config.head_dim(&["head_dim"], hidden, heads, "num_attention_heads")?,
    };
    let kv_key = "num_key_value_heads";
    let kv_heads = match config.object().get(kv_key) {
        None => family.kv_heads_default.unwrap_or(heads),
        Some(Value::Null) => heads,
        Some(_) => config.positive(&[kv_key])?,
    };
    if !heads.is_multiple_of(kv_heads) {
        let problem = match config.object().get(kv_key) {
            None => format!(
                "`{kv_key}` is absent, so transformers gives `{}` its default of {kv_heads} key/value \
                 heads, which do not divide {heads} attention heads",
                family.model_type
            ),
            _ => format!("{kv_heads} key/value heads do not divide {heads} attention heads"),
        };
        return Err(InputError::new(config.origin(), problem).at_key(kv_key).with_fix(
            "give `num_key_value_heads`: grouped-query attention needs the head count to be a multiple \
             of the key/value heads",
        ));
    }
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], family.max_positions_default)?;
    let tie = config.bool_or(&["tie_word_embeddings"], family.tie_default)?;
    let activation = config
        .string_opt(&["hidden_activation", "hidden_act"])?
        .unwrap_or_else(|| family.activation_default.to_string());
    let (qkv_bias, o_bias) = match family.attention_bias {
        AttentionBias::None => (false, false),
        AttentionBias::AllFromKey(default) => {
            let bias = config.bool_or(&["attention_bias"], default)?;
            (bias, bias)
        }
        AttentionBias::QkvAlways => (true, false),
        AttentionBias::QkvFromKey => (config.bool_or(&["qkv_bias"], true)?, false),
    };
    let mlp_bias = family.mlp_bias_key && config.bool_or(&["mlp_bias"], false)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);
    let dims = Dims { hidden, heads, kv_heads, head_dim };

    let windows = attention_windows(config, family.window, options.naming, layers)?;
    let (moe_shape, sparse) = match family.moe {
        Some(style) => {
            let (shape, sparse) = moe::read_shape(config, style, layers)?;
            (Some((style, shape)), sparse)
        }
        None => (None, vec![false; layers as usize]),
    };
    let all_sparse = !sparse.is_empty() && sparse.iter().all(|s| *s);
    // Dense MLP width: the config's `intermediate_size`, except where it is the expert width
    // (Mixtral, OLMoE, gpt-oss) and every layer is MoE.
    let dense_intermediate = match moe_shape {
        Some((style, _)) if style.intermediate_is_expert_size() && all_sparse => 0,
        _ if all_sparse => config.uint_or(&["intermediate_size"], 0)?,
        _ => config.positive(&["intermediate_size"])?,
    };

    let rotary_dim = rotary_dim(config, &family, options.naming, head_dim)?;
    let list = "model.layers";
    let norm_class = format!("{prefix}RMSNorm");
    let mut blocks = Vec::with_capacity(layers as usize);
    for (i, is_sparse) in sparse.iter().enumerate() {
        let path = format!("{list}.{i}");
        let mut attention = attention(&b, &family, dims, &path, qkv_bias, o_bias);
        if options.naming == Naming::V4 && matches!(family.moe, Some(MoeStyle::Qwen2Moe | MoeStyle::Olmoe)) {
            // 4.x picks the attention class by implementation; SDPA is the default.
            attention.class = format!("{prefix}SdpaAttention");
            if family.moe == Some(MoeStyle::Qwen2Moe) {
                let rotary =
                    b.rotary(&attention.path, "rotary_emb", &format!("{prefix}RotaryEmbedding"), rotary_dim);
                attention = attention.with_child(rotary);
            }
        }
        let mlp = match (&moe_shape, is_sparse) {
            (Some((style, shape)), true) => {
                moe::sparse_block(&b, *style, options.naming, &path, hidden, shape)
            }
            _ if family.fused_projections => fused_mlp(&b, &path, prefix, hidden, dense_intermediate),
            _ => gated_mlp(&b, &path, "mlp", &format!("{prefix}MLP"), hidden, dense_intermediate, mlp_bias),
        };
        let mut block = b
            .block(list, &i.to_string(), &format!("{prefix}DecoderLayer"))
            .with_child(attention)
            .with_child(mlp)
            .with_child(b.norm(&path, "input_layernorm", &norm_class, hidden, false))
            .with_child(b.norm(&path, "post_attention_layernorm", &norm_class, hidden, false));
        if family.sandwich_norms {
            block = block
                .with_child(b.norm(&path, "pre_feedforward_layernorm", &norm_class, hidden, false))
                .with_child(b.norm(&path, "post_feedforward_layernorm", &norm_class, hidden, false));
        }
        blocks.push(block);
    }
    let scaled = match family.scaled_embedding {
        EmbedScale::None => false,
        EmbedScale::V5 => options.naming == Naming::V5,
        EmbedScale::Always => true,
    };
    let embed_tokens = if scaled {
        scaled_embedding(&b, &format!("{prefix}TextScaledWordEmbedding"), vocab, hidden)
    } else {
        b.embedding(MODEL, "embed_tokens", vocab, hidden)
    };
    let rotary_class = format!("{prefix}RotaryEmbedding");
    let rotary = if family.rotary_per_layer_type {
        let sliding = sliding_layer_types(config, layers as usize)?;
        rotary_per_layer_type(&b, &rotary_class, rotary_dim, &sliding)
    } else {
        vec![b.rotary(MODEL, "rotary_emb", &rotary_class, rotary_dim)]
    };
    let parts = BaseModel { embed_tokens, blocks, hidden, vocab, rotary_dim };
    let root = causal_lm_with_rotary(&b, arch, prefix, parts, rotary);

    let moe_facts = moe_shape.as_ref().filter(|_| sparse.iter().any(|s| *s)).map(|(_, shape)| MoeFacts {
        experts: shape.experts,
        top_k: shape.top_k,
        expert_intermediate_size: shape.expert_intermediate,
        shared_experts: u32::from(shape.shared_intermediate > 0),
        shared_intermediate_size: shape.shared_intermediate,
    });
    let facts = ArchFacts {
        model_type: family.model_type.into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: dense_intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        activation,
        moe: moe_facts,
        tie_word_embeddings: tie,
        layers: layer_facts(list, &sparse, &windows),
        no_split_classes: std::iter::once(format!("{prefix}DecoderLayer"))
            .chain(
                family
                    .no_split_v4_extra
                    .iter()
                    .filter(|_| options.naming == Naming::V4)
                    .map(|c| c.to_string()),
            )
            .collect(),
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
        notes: Vec::new(),
        quantization: None,
        float_forms: Default::default(),
    };
    finish(description)
}

/// `self_attn` of one layer.
fn attention(b: &Builder, family: &Family, d: Dims, layer: &str, qkv_bias: bool, o_bias: bool) -> Module {
    let attn = b.container(layer, "self_attn", &format!("{}Attention", family.prefix));
    let p = attn.path.clone();
    let q_out = d.heads * d.head_dim;
    let kv_out = d.kv_heads * d.head_dim;
    if family.fused_projections {
        // Phi3Attention creates `o_proj` before `qkv_proj`.
        return attn.with_child(b.linear(&p, "o_proj", q_out, d.hidden, o_bias)).with_child(b.linear(
            &p,
            "qkv_proj",
            d.hidden,
            q_out + 2 * kv_out,
            qkv_bias,
        ));
    }
    let mut attn = attn
        .with_child(b.linear(&p, "q_proj", d.hidden, q_out, qkv_bias))
        .with_child(b.linear(&p, "k_proj", d.hidden, kv_out, qkv_bias))
        .with_child(b.linear(&p, "v_proj", d.hidden, kv_out, qkv_bias))
        .with_child(b.linear(&p, "o_proj", q_out, d.hidden, o_bias));
    let norm_class = format!("{}RMSNorm", family.prefix);
    match family.qk_norm {
        QkNorm::None => {}
        QkNorm::PerHead => {
            attn = attn.with_child(b.norm(&p, "q_norm", &norm_class, d.head_dim, false)).with_child(b.norm(
                &p,
                "k_norm",
                &norm_class,
                d.head_dim,
                false,
            ));
        }
        QkNorm::WholeProjection => {
            // OlmoeAttention: q_norm over `hidden_size`, k_norm over `hidden / heads * kv_heads`.
            attn = attn.with_child(b.norm(&p, "q_norm", &norm_class, d.hidden, false)).with_child(b.norm(
                &p,
                "k_norm",
                &norm_class,
                d.hidden / d.heads * d.kv_heads,
                false,
            ));
        }
    }
    if family.attention_sinks {
        attn = attn.with_tensor(Tensor::parameter("sinks", &[d.heads], b.dtype));
    }
    attn
}

/// A gated MLP (`gate_proj`, `up_proj`, `down_proj`) at `parent.name`.
pub(super) fn gated_mlp(
    b: &Builder,
    parent: &str,
    name: &str,
    class: &str,
    hidden: u64,
    intermediate: u64,
    bias: bool,
) -> Module {
    let mlp = b.container(parent, name, class);
    let p = mlp.path.clone();
    mlp.with_child(b.linear(&p, "gate_proj", hidden, intermediate, bias))
        .with_child(b.linear(&p, "up_proj", hidden, intermediate, bias))
        .with_child(b.linear(&p, "down_proj", intermediate, hidden, bias))
}

/// Phi-3's MLP: `gate_up_proj` (both halves in one weight) and `down_proj`.
fn fused_mlp(b: &Builder, layer: &str, prefix: &str, hidden: u64, intermediate: u64) -> Module {
    let mlp = b.container(layer, "mlp", &format!("{prefix}MLP"));
    let p = mlp.path.clone();
    mlp.with_child(b.linear(&p, "gate_up_proj", hidden, 2 * intermediate, false)).with_child(b.linear(
        &p,
        "down_proj",
        intermediate,
        hidden,
        false,
    ))
}

/// The path of the base model inside every `…ForCausalLM` of this family and DeepSeek.
pub(super) const MODEL: &str = "model";

/// 5.x Gemma's `embed_tokens`: an embedding that multiplies by `sqrt(hidden_size)`, kept in a
/// non-persistent scalar buffer `embed_scale` made by `torch.tensor(embed_scale)`, so in the
/// load dtype.
fn scaled_embedding(b: &Builder, class: &str, vocab: u64, hidden: u64) -> Module {
    Module::new(join(MODEL, "embed_tokens"), class, ModuleKind::Embedding)
        .with_tensor(Tensor::parameter("weight", &[vocab, hidden], b.dtype))
        .with_tensor(Tensor::load_dtype_buffer("embed_scale", &[], b.dtype, false))
}

/// What a `…ForCausalLM` root is made of besides its class names.
pub(super) struct BaseModel {
    pub(super) embed_tokens: Module,
    pub(super) blocks: Vec<Module>,
    pub(super) hidden: u64,
    pub(super) vocab: u64,
    /// The width the model-level rotary embedding rotates.
    pub(super) rotary_dim: u64,
}

/// The `…ForCausalLM` root: `model.{embed_tokens, layers, norm, rotary_emb}` and `lm_head`.
pub(super) fn causal_lm(b: &Builder, arch: &str, prefix: &str, parts: BaseModel) -> Module {
    let rotary = b.rotary(MODEL, "rotary_emb", &format!("{prefix}RotaryEmbedding"), parts.rotary_dim);
    causal_lm_with_rotary(b, arch, prefix, parts, vec![rotary])
}

/// [`causal_lm`] with the given rotary modules after the final norm (Gemma 3 4.x has two).
fn causal_lm_with_rotary(
    b: &Builder,
    arch: &str,
    prefix: &str,
    parts: BaseModel,
    rotary: Vec<Module>,
) -> Module {
    let BaseModel { embed_tokens, blocks, hidden, vocab, .. } = parts;
    let model = b
        .container("", MODEL, &format!("{prefix}Model"))
        .with_child(embed_tokens)
        .with_child(b.module_list(MODEL, "layers", blocks))
        .with_child(b.norm(MODEL, "norm", &format!("{prefix}RMSNorm"), hidden, false))
        .with_children(rotary);
    b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, false))
}

/// Gemma 3's rotary embeddings, one base per attention type. 5.x: one `rotary_emb` holding
/// `{type}_inv_freq` and `{type}_original_inv_freq` for each type its layers use, in sorted
/// order (`Gemma3RotaryEmbedding`: `sorted(set(config.layer_types))`); 4.x: `rotary_emb` (the
/// global base) and `rotary_emb_local`, whatever the layers use.
fn rotary_per_layer_type(b: &Builder, class: &str, rotary_dim: u64, sliding: &[bool]) -> Vec<Module> {
    if b.naming == Naming::V4 {
        return vec![
            b.rotary(MODEL, "rotary_emb", class, rotary_dim),
            b.rotary(MODEL, "rotary_emb_local", class, rotary_dim),
        ];
    }
    let mut rotary = Module::new(join(MODEL, "rotary_emb"), class, ModuleKind::Other);
    // "full_attention" sorts before "sliding_attention".
    for (kind, present) in
        [("full_attention", sliding.iter().any(|s| !s)), ("sliding_attention", sliding.iter().any(|s| *s))]
    {
        if present {
            for buffer in ["inv_freq", "original_inv_freq"] {
                rotary = rotary.with_tensor(Tensor::buffer(
                    &format!("{kind}_{buffer}"),
                    &[rotary_dim / 2],
                    crate::DType::F32,
                    false,
                ));
            }
        }
    }
    vec![rotary]
}

/// One [`LayerFacts`] per decoder layer.
pub(super) fn layer_facts(list: &str, sparse: &[bool], windows: &[Option<u64>]) -> Vec<LayerFacts> {
    sparse
        .iter()
        .enumerate()
        .map(|(i, moe)| LayerFacts {
            path: format!("{list}.{i}"),
            stack: StackKind::Decoder,
            moe: *moe,
            attention_window: windows.get(i).copied().flatten(),
            cross_attention: false,
            ssm: None,
        })
        .collect()
}

/// Finishes an imported description: ties `lm_head` to the input embedding when the facts say
/// so.
pub(super) fn finish(mut description: ModelDescription) -> Result<ModelDescription, InputError> {
    if description.facts.tie_word_embeddings {
        description.tie("lm_head.weight", "model.embed_tokens.weight")?;
    }
    Ok(description)
}
