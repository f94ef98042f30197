//! `FalconH1ForCausalLM` (Falcon-H1): every block runs grouped-query attention and a Mamba-2
//! mixer side by side on the same normed input, adds their scaled outputs to the residual, then
//! a SwiGLU MLP (`feed_forward`) after a second RMSNorm.
//!
//! Module names (transformers 4.57 and 5.x alike, `models/falcon_h1/modeling_falcon_h1.py`):
//! `model.embed_tokens`, `model.layers.N.{feed_forward.{gate_proj, up_proj, down_proj},
//! mamba.{dt_bias, A_log, D, conv1d, in_proj, norm, out_proj}, self_attn.{q_proj, k_proj,
//! v_proj, o_proj}, input_layernorm, pre_ff_layernorm}`, `model.final_layernorm`,
//! `model.rotary_emb`, `lm_head`. `mamba.norm` is `FalconH1RMSNormGated` (weight of the inner
//! width) where `mamba_rms_norm`, else an `nn.Identity`.
//!
//! Buffers: each mixer's `mup_vector` (`[1, 1, projection]`, not saved: `FalconH1Model.__init__`
//! registers the µP multipliers of `in_proj`'s output, made in the default dtype so held in the
//! load dtype). 5.x registers a clone per layer; 4.57 registers the same tensor in every layer,
//! which `named_buffers()` lists once, under layer 0, and which is held once: so the 4.x tree
//! has it in layer 0 only. The rotary embedding's `inv_freq` (and 5.x's `original_inv_freq`).
//!
//! The mixer's sizes go to each block's [`crate::model::ssm::SsmFacts`].

use super::{CoreSizes, HfConfig, STANDARD_SIZE_KEYS, describe, tie_if};
use crate::InputError;
use crate::model::ssm::SsmFacts;
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind,
    Naming, NormKind, StackKind, Tensor, join,
};
use serde_json::Value;

/// `FalconH1Config`'s defaults (transformers 5.24 `configuration_falcon_h1.py`).
const DEFAULT_D_SSM: u64 = 1024;
const DEFAULT_HEADS: u64 = 128;
const DEFAULT_STATE: u64 = 256;
const DEFAULT_CONV: u64 = 4;
const DEFAULT_EXPAND: u64 = 2;
const DEFAULT_CHUNK: u64 = 256;

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let CoreSizes { layers, hidden, heads, heads_key } = STANDARD_SIZE_KEYS.read(config)?;
    let kv_heads = config.kv_heads(heads, 8.min(heads))?;
    let head_dim = config.head_dim(&["head_dim"], hidden, heads, heads_key)?;
    let attention_width = heads * head_dim;
    let kv_width = kv_heads * head_dim;
    let intermediate = config.positive_or(&["intermediate_size"], 14336)?;
    let vocab = config.positive(&["vocab_size"])?;
    let max_positions = config.positive_or(&["max_position_embeddings"], 8192)?;
    let tie = config.bool_or(&["tie_word_embeddings"], false)?;
    let attention_bias = config.bool_or(&["attention_bias"], false)?;
    let mlp_bias = config.bool_or(&["mlp_bias"], false)?;
    let ssm = mixer_sizes(config, hidden)?;
    let conv_bias = config.bool_or(&["mamba_conv_bias"], true)?;
    let proj_bias = config.bool_or(&["mamba_proj_bias"], false)?;
    let projectors_bias = config.bool_or(&["projectors_bias"], false)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let list = "model.layers";
    let blocks = (0..layers)
        .map(|i| {
            let path = format!("{list}.{i}");
            let mlp_path = join(&path, "feed_forward");
            let mlp = b
                .container(&path, "feed_forward", "FalconH1MLP")
                .with_child(b.linear(&mlp_path, "gate_proj", hidden, intermediate, mlp_bias))
                .with_child(b.linear(&mlp_path, "up_proj", hidden, intermediate, mlp_bias))
                .with_child(b.linear(&mlp_path, "down_proj", intermediate, hidden, mlp_bias));
            // 4.57 shares one `mup_vector` among the layers (see the module documentation).
            let mup = i == 0 || options.naming == Naming::V5;
            let mixer = mixer(&b, &path, &ssm, hidden, conv_bias, proj_bias, projectors_bias, mup);
            let attn_path = join(&path, "self_attn");
            let attention = b
                .container(&path, "self_attn", "FalconH1Attention")
                .with_child(b.linear(&attn_path, "q_proj", hidden, attention_width, attention_bias))
                .with_child(b.linear(&attn_path, "k_proj", hidden, kv_width, attention_bias))
                .with_child(b.linear(&attn_path, "v_proj", hidden, kv_width, attention_bias))
                .with_child(b.linear(&attn_path, "o_proj", attention_width, hidden, attention_bias));
            b.block(list, &i.to_string(), "FalconH1DecoderLayer")
                .with_child(mlp)
                .with_child(mixer)
                .with_child(attention)
                .with_child(b.norm(&path, "input_layernorm", "FalconH1RMSNorm", hidden, false))
                .with_child(b.norm(&path, "pre_ff_layernorm", "FalconH1RMSNorm", hidden, false))
        })
        .collect();
    let model = b
        .container("", "model", "FalconH1Model")
        .with_child(b.embedding("model", "embed_tokens", vocab, hidden))
        .with_child(b.module_list("model", "layers", blocks))
        .with_child(b.norm("model", "final_layernorm", "FalconH1RMSNorm", hidden, false))
        .with_child(b.rotary("model", "rotary_emb", "FalconH1RotaryEmbedding", head_dim));
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, false));

    let layer_facts = (0..layers)
        .map(|i| LayerFacts {
            path: format!("{list}.{i}"),
            stack: StackKind::Decoder,
            moe: false,
            attention_window: None,
            cross_attention: false,
            ssm: Some(ssm.clone()),
        })
        .collect();
    let facts = ArchFacts {
        model_type: "falcon_h1".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: intermediate,
        vocab_size: vocab,
        max_positions,
        attention: AttentionKind::Standard,
        norm: NormKind::RmsNorm,
        gated_mlp: true,
        activation: config.string_opt(&["hidden_act"])?.unwrap_or_else(|| "silu".into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: layer_facts,
        no_split_classes: vec!["FalconH1DecoderLayer".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, "lm_head.weight", "model.embed_tokens.weight")
}

/// The mixer's sizes as `FalconH1Config` and `FalconH1Mixer` read them: the inner width is
/// `mamba_d_ssm` (1024 when absent; `mamba_expand × hidden_size` when null), `mamba_d_head`
/// `"auto"` is the inner width over the heads, and heads × head width must be the inner width
/// (`validate_architecture`).
fn mixer_sizes(config: &HfConfig, hidden: u64) -> Result<SsmFacts, InputError> {
    let expand = config.positive_or(&["mamba_expand"], DEFAULT_EXPAND)?;
    let inner = match config.object().get("mamba_d_ssm") {
        Some(Value::Null) => hidden.saturating_mul(expand),
        _ => config.positive_or(&["mamba_d_ssm"], DEFAULT_D_SSM)?,
    };
    let heads = config.positive_or(&["mamba_n_heads"], DEFAULT_HEADS)?;
    if !inner.is_multiple_of(heads) {
        return Err(InputError::new(
            config.origin(),
            format!("{heads} Mamba heads do not divide the mixer's width {inner}"),
        )
        .at_key("mamba_n_heads")
        .with_fix("`mamba_n_heads` must divide `mamba_d_ssm` (or `mamba_expand × hidden_size`)"));
    }
    let head_dim = match config.object().get("mamba_d_head") {
        None | Some(Value::Null) => inner / heads,
        Some(Value::String(s)) if s == "auto" => inner / heads,
        _ => config.positive(&["mamba_d_head"])?,
    };
    if head_dim * heads != inner {
        return Err(InputError::new(
            config.origin(),
            format!("{heads} Mamba heads of width {head_dim} are not the mixer's width {inner}"),
        )
        .at_key("mamba_d_head")
        .with_fix("`mamba_n_heads × mamba_d_head` must equal `mamba_d_ssm`, or give `\"auto\"`"));
    }
    let groups = config.positive_or(&["mamba_n_groups"], 1)?;
    if !heads.is_multiple_of(groups) {
        return Err(InputError::new(
            config.origin(),
            format!("{groups} groups do not divide {heads} Mamba heads"),
        )
        .at_key("mamba_n_groups")
        .with_fix("`mamba_n_groups` must divide `mamba_n_heads`"));
    }
    let state_size = config.positive_or(&["mamba_d_state"], DEFAULT_STATE)?;
    let conv_kernel = config.positive_or(&["mamba_d_conv"], DEFAULT_CONV)?;
    let chunk_size = config.positive_or(&["mamba_chunk_size"], DEFAULT_CHUNK)?;
    let gated_norm = config.bool_or(&["mamba_rms_norm"], false)?;
    let implausible = [inner, state_size, conv_kernel, chunk_size].iter().any(|v| *v > 1 << 24);
    if implausible {
        return Err(InputError::new(config.origin(), "the Mamba sizes are implausibly large")
            .at_key("mamba_d_ssm")
            .with_fix("check `mamba_d_ssm`, `mamba_d_state`, `mamba_d_conv` and `mamba_chunk_size`"));
    }
    Ok(SsmFacts { inner, heads, head_dim, groups, state_size, conv_kernel, chunk_size, gated_norm })
}

/// `FalconH1Mixer` at `{block}.mamba`: its own `dt_bias`, `A_log`, `D` (one per head) and
/// `mup_vector` buffer where `mup`, then `conv1d` (depthwise over `conv_dim` channels), `in_proj`,
/// `norm` and `out_proj`.
#[allow(clippy::too_many_arguments)]
fn mixer(
    b: &Builder,
    block: &str,
    ssm: &SsmFacts,
    hidden: u64,
    conv_bias: bool,
    proj_bias: bool,
    projectors_bias: bool,
    mup: bool,
) -> Module {
    let path = join(block, "mamba");
    let conv_dim = ssm.conv_dim();
    let mut conv = Module::new(join(&path, "conv1d"), "Conv1d", ModuleKind::Other)
        .with_tensor(Tensor::parameter("weight", &[conv_dim, 1, ssm.conv_kernel], b.dtype));
    if conv_bias {
        conv = conv.with_tensor(Tensor::parameter("bias", &[conv_dim], b.dtype));
    }
    let norm = if ssm.gated_norm {
        b.norm(&path, "norm", "FalconH1RMSNormGated", ssm.inner, false)
    } else {
        Module::new(join(&path, "norm"), "Identity", ModuleKind::Other)
    };
    let mut m = b
        .container(block, "mamba", "FalconH1Mixer")
        .with_tensor(Tensor::parameter("dt_bias", &[ssm.heads], b.dtype))
        .with_tensor(Tensor::parameter("A_log", &[ssm.heads], b.dtype))
        .with_tensor(Tensor::parameter("D", &[ssm.heads], b.dtype));
    if mup {
        m = m.with_tensor(Tensor::load_dtype_buffer("mup_vector", &[1, 1, ssm.projection()], b.dtype, false));
    }
    m.with_child(conv)
        .with_child(b.linear(&path, "in_proj", hidden, ssm.projection(), proj_bias))
        .with_child(norm)
        .with_child(b.linear(&path, "out_proj", ssm.inner, hidden, projectors_bias))
}
