//! What `vramplan inspect` reports about a model: totals, top-level modules, layer kinds, the
//! largest placement unit, tied groups and MoE active parameters; and the sanity checks every
//! import passes through.

use super::{AttentionKind, ModelDescription, Module, ModuleKind};
use crate::{DType, InputError};
use serde::Serialize;

/// One module of the top levels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleSummary {
    /// The module's path (`model.embed_tokens`, `lm_head`).
    pub name: String,
    /// Its PyTorch class (`Embedding`, `ModuleList`, `MixtralDecoderLayer`).
    pub class: String,
    /// Logical parameters in it and below, tied tensors counted once.
    pub params: u64,
    /// Bytes it holds in memory (parameters, quantization constants, buffers), tied tensors
    /// counted once.
    pub bytes: u64,
}

/// Blocks of one kind (same class, same parameters): `MixtralDecoderLayer × 32`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerKindSummary {
    /// The blocks' PyTorch class (`MixtralDecoderLayer`).
    pub class: String,
    /// Whether these blocks' MLP is a mixture of experts.
    pub moe: bool,
    /// How many blocks are of this kind.
    pub count: u32,
    /// Logical parameters in one block.
    pub params_each: u64,
    /// Bytes one block holds in memory.
    pub bytes_each: u64,
}

/// A module accelerate would place whole: a block, or a top-level module outside the blocks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlacementUnit {
    /// The module's path, as an accelerate `device_map` key (`model.layers.0`, `lm_head`).
    pub name: String,
    /// Logical parameters it places (a parent's own tensors only, when it has children).
    pub params: u64,
    /// Bytes it places on its device.
    pub bytes: u64,
}

/// Mixture-of-experts totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeSummary {
    /// Routed experts per MoE layer.
    pub experts: u32,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: u32,
    /// Every logical parameter of the model, all experts included (tied tensors counted once).
    pub total_params: u64,
    /// Parameters one token passes through: everything but the routed experts, plus `top_k` of
    /// them in each MoE layer.
    pub active_params: u64,
}

/// The inspect report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// What the user named the model (`mixtral-8x7b`, a path).
    pub name: String,
    /// The top-level class (`MixtralForCausalLM`).
    pub architecture: String,
    /// The dtype of floating-point parameters (the checkpoint's, or config's `torch_dtype`).
    pub dtype: DType,
    /// Logical parameter count, each tied group once.
    pub params: u64,
    /// Parameters, quantization constants and buffers, as held in memory.
    pub bytes: u64,
    /// Bytes of buffers alone (rotary `inv_freq`, `position_ids`, causal masks), part of `bytes`.
    pub buffer_bytes: u64,
    /// Number of blocks (transformer layers, every stack together).
    pub layers: u32,
    /// The top-level modules, with a base-model container (`model`, `transformer`) opened one
    /// level so that embeddings, the block list, norms and heads each get a line.
    pub modules: Vec<ModuleSummary>,
    /// The blocks grouped by class, MoE or not, and parameter count, in execution order.
    pub layer_kinds: Vec<LayerKindSummary>,
    /// The placement unit holding the most bytes: the smallest GPU share the model can be split
    /// into. `None` when no module holds bytes.
    pub largest_unit: Option<PlacementUnit>,
    /// Groups of tensor paths that share one storage (`lm_head.weight` tied to
    /// `model.embed_tokens.weight`), the canonical path first.
    pub tied: Vec<Vec<String>>,
    /// Mixture-of-experts totals; `None` for a dense model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSummary>,
    /// Disagreements found while importing (config vs checkpoint headers, unusual values).
    pub notes: Vec<String>,
}

impl Summary {
    /// The inspect report of `model`.
    pub fn of(model: &ModelDescription) -> Summary {
        Summary {
            name: model.name.clone(),
            architecture: model.architecture.clone(),
            dtype: model.dtype,
            params: model.params(),
            bytes: model.bytes(),
            buffer_bytes: model.root.buffer_bytes(),
            layers: model.facts.layers.len() as u32,
            modules: top_modules(&model.root),
            layer_kinds: layer_kinds(model),
            largest_unit: placement_units(&model.root).into_iter().max_by_key(|u| (u.bytes, u.params)),
            tied: model.tied_groups(),
            moe: moe_summary(model),
            notes: model.notes.clone(),
        }
    }
}

fn module_summary(m: &Module) -> ModuleSummary {
    ModuleSummary { name: m.path.clone(), class: m.class.clone(), params: m.params(), bytes: m.bytes() }
}

/// The root's children, with a base-model container (`model`, `transformer`, an encoder stack)
/// opened one level so that embeddings, the block list, norms and heads each get a line.
fn top_modules(root: &Module) -> Vec<ModuleSummary> {
    let mut out = Vec::new();
    for child in &root.children {
        if child.kind == ModuleKind::Container && child.class != "ModuleList" && !child.children.is_empty() {
            out.extend(child.children.iter().map(module_summary));
            if !child.tensors.is_empty() {
                let own = Module { children: Vec::new(), ..child.clone() };
                out.push(module_summary(&own));
            }
        } else {
            out.push(module_summary(child));
        }
    }
    if !root.tensors.is_empty() {
        out.push(module_summary(&Module { children: Vec::new(), ..root.clone() }));
    }
    out
}

fn layer_kinds(model: &ModelDescription) -> Vec<LayerKindSummary> {
    let mut kinds: Vec<LayerKindSummary> = Vec::new();
    for layer in &model.facts.layers {
        let Some(block) = model.root.find(&layer.path) else { continue };
        let (params, bytes) = (block.params(), block.bytes());
        match kinds
            .iter_mut()
            .find(|k| k.class == block.class && k.moe == layer.moe && k.params_each == params)
        {
            Some(kind) => kind.count += 1,
            None => kinds.push(LayerKindSummary {
                class: block.class.clone(),
                moe: layer.moe,
                count: 1,
                params_each: params,
                bytes_each: bytes,
            }),
        }
    }
    kinds
}

/// Blocks and the modules outside blocks that hold tensors, as accelerate dispatches them.
fn placement_units(root: &Module) -> Vec<PlacementUnit> {
    fn walk(m: &Module, out: &mut Vec<PlacementUnit>) {
        let whole = m.kind == ModuleKind::Block || m.children.is_empty();
        if whole {
            if m.bytes() > 0 {
                out.push(PlacementUnit { name: m.path.clone(), params: m.params(), bytes: m.bytes() });
            }
            return;
        }
        if m.tensors.iter().any(|t| t.tied_to.is_none()) {
            let own = Module { children: Vec::new(), ..m.clone() };
            out.push(PlacementUnit { name: m.path.clone(), params: own.params(), bytes: own.bytes() });
        }
        for child in &m.children {
            walk(child, out);
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out
}

fn moe_summary(model: &ModelDescription) -> Option<MoeSummary> {
    let moe = model.facts.moe.as_ref()?;
    let mut inactive = 0u64;
    model.root.visit(&mut |m| {
        if let ModuleKind::Experts { count } = m.kind {
            let count = u64::from(count.max(1));
            let active_share = u64::from(moe.top_k).min(count);
            inactive += m.params() - m.params() * active_share / count;
        }
    });
    let total = model.params();
    Some(MoeSummary {
        experts: moe.experts,
        top_k: moe.top_k,
        total_params: total,
        active_params: total - inactive,
    })
}

/// Checks every import: values a real model cannot have are refused with the key to fix.
pub(crate) fn validate(model: &ModelDescription, origin: &str) -> Result<(), InputError> {
    let f = &model.facts;
    let fail = |key: &str, problem: String, fix: &str| {
        Err(InputError::new(origin, problem).at_key(key).with_fix(fix))
    };
    if f.layers.is_empty() {
        return fail("num_hidden_layers", "the model has no layers".into(), "give at least one layer");
    }
    if f.hidden_size == 0 || f.num_attention_heads == 0 || f.num_kv_heads == 0 {
        return fail(
            "hidden_size",
            "hidden size, attention heads and key/value heads must all be positive".into(),
            "check hidden_size, num_attention_heads and num_key_value_heads",
        );
    }
    if f.attention == AttentionKind::Standard && !f.num_attention_heads.is_multiple_of(f.num_kv_heads) {
        return fail(
            "num_key_value_heads",
            format!(
                "{} key/value heads do not divide {} attention heads",
                f.num_kv_heads, f.num_attention_heads
            ),
            "grouped-query attention needs the head count to be a multiple of the key/value heads",
        );
    }
    if let Some(moe) = &f.moe
        && (moe.top_k == 0 || moe.top_k > moe.experts)
    {
        return fail(
            "num_experts_per_tok",
            format!("top-k {} must be between 1 and the {} experts", moe.top_k, moe.experts),
            "set num_experts_per_tok to at most the number of experts",
        );
    }
    if model.params() == 0 {
        return fail("architectures", "the model has no parameters".into(), "check the config's sizes");
    }
    Ok(())
}
