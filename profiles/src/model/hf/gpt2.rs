//! `GPT2LMHeadModel` (GPT-2, DistilGPT-2) and `GPTBigCodeForCausalLM` (SantaCoder, StarCoder,
//! OctoCoder): learned absolute positions, pre-LayerNorm blocks, fused QKV, two-projection MLP,
//! `lm_head` tied to `transformer.wte` unless `tie_word_embeddings` is false.
//!
//! Module names (transformers 4.4x/5.x, `modeling_gpt2.py` / `modeling_gpt_bigcode.py`):
//! `transformer.{wte, wpe, h.N.{ln_1, attn.{c_attn, c_proj}, ln_2, mlp.{c_fc, c_proj}}, ln_f}`,
//! `lm_head`; with `add_cross_attention`, each block also has `crossattention.{c_attn, q_attn,
//! c_proj}` and `ln_cross_attn`.
//!
//! The two differ in ways that matter for memory:
//! - GPT-2 uses `Conv1D` (weight stored `[in, out]`); GPTBigCode uses `nn.Linear`.
//! - GPTBigCode's `multi_query` (default true) shares one key/value head across all query heads:
//!   `c_attn` projects to `hidden + 2 * head_dim` instead of `3 * hidden`.
//! - Buffers: GPTBigCode keeps one causal mask `transformer.bias` (`[P, P]` bool, not saved) in
//!   4.x and 5.x; GPT-2 4.x keeps one per attention module (`attn.bias`, `[1, 1, P, P]` bool, and
//!   the scalar `attn.masked_bias`), which 5.x dropped.

use super::{CoreSizes, HfConfig, SizeKeys, dense_layers, describe, tie_if};
use crate::model::{
    ArchFacts, AttentionKind, Builder, ImportOptions, ModelDescription, Module, Naming, NormKind, StackKind,
    Tensor,
};
use crate::{DType, InputError};

const SIZE_KEYS: SizeKeys = SizeKeys {
    layers: &["n_layer", "num_hidden_layers"],
    hidden: &["n_embd", "hidden_size"],
    heads: &["n_head", "num_attention_heads"],
};
const POSITION_KEYS: &[&str] = &["n_positions", "max_position_embeddings"];

/// The two classes this file builds and the names that differ between them.
#[derive(Clone, Copy, PartialEq)]
enum Flavour {
    Gpt2,
    BigCode,
}

impl Flavour {
    fn model_type(self) -> &'static str {
        match self {
            Flavour::Gpt2 => "gpt2",
            Flavour::BigCode => "gpt_bigcode",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Flavour::Gpt2 => "GPT2",
            Flavour::BigCode => "GPTBigCode",
        }
    }

    fn default_activation(self) -> &'static str {
        match self {
            Flavour::Gpt2 => "gelu_new",
            Flavour::BigCode => "gelu_pytorch_tanh",
        }
    }
}

/// Shapes shared by every block.
struct Dims {
    hidden: u64,
    inner: u64,
    /// Output width of the self-attention `c_attn` (queries, keys and values together).
    qkv_out: u64,
    positions: u64,
    cross_attention: bool,
}

pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let flavour = if arch == "GPTBigCodeForCausalLM" { Flavour::BigCode } else { Flavour::Gpt2 };
    let CoreSizes { layers, hidden, heads, heads_key } = SIZE_KEYS.read(config)?;
    let head_dim = config.head_dim(&[], hidden, heads, heads_key)?;
    let inner = config.positive_or(&["n_inner"], 4 * hidden)?;
    let vocab = config.positive(&["vocab_size"])?;
    let positions = config.positive_or(POSITION_KEYS, 1024)?;
    let cross_attention = config.bool_or(&["add_cross_attention"], false)?;
    let multi_query = flavour == Flavour::BigCode && config.bool_or(&["multi_query"], true)?;
    if multi_query && cross_attention {
        return Err(InputError::new(
            config.origin(),
            "GPTBigCode has no cross-attention with multi-query attention (transformers raises \
             NotImplementedError)",
        )
        .at_key("add_cross_attention")
        .with_fix("set \"add_cross_attention\": false, or \"multi_query\": false"));
    }
    let tie = config.bool_or(&["tie_word_embeddings"], true)?;
    let dtype = config.dtype()?;
    let b = Builder::new(dtype, options.naming);

    let kv_heads = if multi_query { 1 } else { heads };
    let dims = Dims { hidden, inner, qkv_out: hidden + 2 * kv_heads * head_dim, positions, cross_attention };

    let base = "transformer";
    let list = "transformer.h";
    let blocks = (0..layers).map(|i| block(&b, flavour, options.naming, &dims, list, i)).collect();
    let mut model = b
        .container("", base, &format!("{}Model", flavour.prefix()))
        .with_child(b.embedding(base, "wte", vocab, hidden))
        .with_child(b.embedding(base, "wpe", positions, hidden))
        .with_child(b.dropout(base, "drop"))
        .with_child(b.module_list(base, "h", blocks))
        .with_child(b.norm(base, "ln_f", "LayerNorm", hidden, true));
    if flavour == Flavour::BigCode {
        model = model.with_tensor(Tensor::buffer("bias", &[positions, positions], DType::Bool, false));
    }
    let root =
        b.container("", "", arch).with_child(model).with_child(b.linear("", "lm_head", hidden, vocab, false));

    let facts = ArchFacts {
        model_type: flavour.model_type().into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: inner,
        vocab_size: vocab,
        max_positions: positions,
        attention: AttentionKind::Standard,
        norm: NormKind::LayerNorm,
        gated_mlp: false,
        activation: config
            .string_opt(&["activation_function"])?
            .unwrap_or_else(|| flavour.default_activation().into()),
        moe: None,
        tie_word_embeddings: tie,
        layers: dense_layers(list, layers, StackKind::Decoder, cross_attention),
        no_split_classes: vec![format!("{}Block", flavour.prefix())],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let description = describe(config, arch, options, dtype, facts, root, Vec::new());
    tie_if(tie, description, "lm_head.weight", "transformer.wte.weight")
}

/// Block `index` of `list` (`transformer.h.N`), children in transformers' registration order.
fn block(b: &Builder, flavour: Flavour, naming: Naming, dims: &Dims, list: &str, index: u64) -> Module {
    let hidden = dims.hidden;
    let path = &format!("{list}.{index}");
    let self_attention = attention(b, flavour, naming, dims, path, "attn", false);
    let mlp_path = format!("{path}.mlp");
    let mlp = b
        .container(path, "mlp", &format!("{}MLP", flavour.prefix()))
        .with_child(projection(b, flavour, &mlp_path, "c_fc", hidden, dims.inner))
        .with_child(projection(b, flavour, &mlp_path, "c_proj", dims.inner, hidden));
    let mut block = b
        .block(list, &index.to_string(), &format!("{}Block", flavour.prefix()))
        .with_child(b.norm(path, "ln_1", "LayerNorm", hidden, true))
        .with_child(self_attention)
        .with_child(b.norm(path, "ln_2", "LayerNorm", hidden, true));
    if dims.cross_attention {
        block = block
            .with_child(attention(b, flavour, naming, dims, path, "crossattention", true))
            .with_child(b.norm(path, "ln_cross_attn", "LayerNorm", hidden, true));
    }
    block.with_child(mlp)
}

/// Self-attention (`attn`) or cross-attention (`crossattention`: keys and values from the
/// encoder through `c_attn`, queries through `q_attn`).
fn attention(
    b: &Builder,
    flavour: Flavour,
    naming: Naming,
    dims: &Dims,
    parent: &str,
    name: &str,
    cross: bool,
) -> Module {
    let hidden = dims.hidden;
    let path = format!("{parent}.{name}");
    let mut module = b.container(parent, name, &format!("{}Attention", flavour.prefix()));
    if flavour == Flavour::Gpt2 && naming == Naming::V4 {
        // transformers 4.x: a causal mask and the old masking constant in every attention module.
        let p = dims.positions;
        module = module
            .with_tensor(Tensor::buffer("bias", &[1, 1, p, p], DType::Bool, false))
            .with_tensor(Tensor::load_dtype_buffer("masked_bias", &[], b.dtype, false));
    }
    if cross {
        module = module
            .with_child(projection(b, flavour, &path, "c_attn", hidden, 2 * hidden))
            .with_child(projection(b, flavour, &path, "q_attn", hidden, hidden));
    } else {
        module = module.with_child(projection(b, flavour, &path, "c_attn", hidden, dims.qkv_out));
    }
    module.with_child(projection(b, flavour, &path, "c_proj", hidden, hidden))
}

/// A projection with bias: GPT-2's `Conv1D` or GPTBigCode's `nn.Linear`.
fn projection(b: &Builder, flavour: Flavour, parent: &str, name: &str, inputs: u64, outputs: u64) -> Module {
    match flavour {
        Flavour::Gpt2 => b.conv1d(parent, name, inputs, outputs),
        Flavour::BigCode => b.linear(parent, name, inputs, outputs, true),
    }
}
