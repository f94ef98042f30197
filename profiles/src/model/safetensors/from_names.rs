//! A description from a checkpoint alone (no `config.json`): the module tree follows the tensor
//! names (split on dots, list indices numbered), the blocks are the items of the `layers.N`,
//! `h.N`, `block.N` lists, and the few facts the shapes reveal (hidden size and vocabulary from
//! the embedding) are filled in. Everything else (heads, context length, MoE routing, module
//! classes) is unknown, and the notes say so.

use super::names;
use super::quant::{self, Role};
use super::{Checkpoint, StoredTensor};
use crate::InputError;
use crate::model::{
    ArchFacts, AttentionKind, LayerFacts, ModelDescription, Module, ModuleKind, MoeFacts, NormKind,
    StackKind, Tensor, TensorKind, summary,
};
use std::collections::HashMap;

/// Lists whose items are transformer blocks.
const BLOCK_LISTS: &[&str] = &["layers", "layer", "h", "block", "blocks", "decoder_layers", "encoder_layers"];

/// Names of modules that are embeddings.
const EMBEDDING_NAMES: &[&str] =
    &["wte", "wpe", "word_embeddings", "position_embeddings", "token_type_embeddings", "shared", "embed_in"];

/// Tensor names that are buffers, not parameters.
const BUFFER_NAMES: &[&str] =
    &["inv_freq", "position_ids", "masked_bias", "running_mean", "running_var", "num_batches_tracked"];

/// Builds the tree from the checkpoint's names and header shapes.
pub(crate) fn build(checkpoint: Checkpoint, origin: &str) -> Result<ModelDescription, InputError> {
    if checkpoint.tensors.is_empty() {
        return Err(InputError::new(origin, "the checkpoint has no tensors")
            .with_fix("give a folder with a model's config.json or a non-empty safetensors checkpoint"));
    }
    if checkpoint.names_only() {
        return Err(InputError::new(
            origin,
            "the folder has an index file but neither shard files nor config.json: tensor names \
             alone give no sizes",
        )
        .with_fix("add the model's config.json to the folder (or the safetensors shards)"));
    }
    let (root, guesses) = tree(&checkpoint);
    check_lists(&root, origin)?;
    let missing_header = checkpoint.tensors.values().filter(|s| s.is_none()).count();
    describe(root, checkpoint, guesses, missing_header, origin)
}

/// The module tree the checkpoint's names give, every tensor as its header stores it (tensors
/// the index names without a header are left out): the blocks are the items of the block
/// lists, quantized weights and constants are told by their names. Also used by the generic
/// model of a config whose class has no importer (`overlay::generic`).
pub(super) fn tree(checkpoint: &Checkpoint) -> (Module, Guesses) {
    let mut entries: Vec<(&String, &StoredTensor)> =
        checkpoint.tensors.iter().filter_map(|(n, s)| s.as_ref().map(|s| (n, s))).collect();
    entries.sort_by(|a, b| names::natural_cmp(a.0, b.0));
    let mut root = Node::default();
    for (name, stored) in entries {
        let (module, tensor) = names::split(name);
        let mut node = &mut root;
        if !module.is_empty() {
            for component in module.split('.') {
                node = node.child(component);
            }
        }
        node.tensors.push(Tensor::parameter(tensor, &stored.shape, stored.dtype));
    }
    let mut guesses = Guesses::default();
    let root = root.into_module("", "", Placement::Plain, &mut guesses);
    (root, guesses)
}

/// Refuses a list of blocks or experts whose items are not numbered 0 to n − 1: PyTorch numbers
/// a `ModuleList`'s items so, and every block and expert holds weights, so a checkpoint that
/// names `layers.0` and `layers.5000` lacks the items between; building two blocks from it would
/// describe a model that is not there. (Other lists may skip the indices of parameter-free
/// items, as `Sequential(Linear, GELU, Linear)` names `0` and `2`.)
pub(super) fn check_lists(module: &Module, origin: &str) -> Result<(), InputError> {
    let name = module.name();
    let is_list = (BLOCK_LISTS.contains(&name) || name == "experts")
        && !module.children.is_empty()
        && module.children.iter().all(|c| names::is_index(c.name()));
    if is_list {
        let count = module.children.len() as u64;
        // Indices too large for u64 are past any list's end.
        // Past the end, too large for u64, or written with leading zeros (`01`): not an item of
        // a list of `count`.
        let beyond = module
            .children
            .iter()
            .map(|c| c.name())
            .find(|n| n.parse::<u64>().map_or(true, |i| i >= count || i.to_string() != *n));
        if let Some(item) = beyond {
            let path =
                if module.path.is_empty() { item.to_string() } else { format!("{}.{item}", module.path) };
            return Err(InputError::new(
                origin,
                format!(
                    "the checkpoint names `{path}`, but `{}` has {count} item{} in all: the items between are missing",
                    module.path,
                    if count == 1 { "" } else { "s" }
                ),
            )
            .at_key(path)
            .with_fix("give the whole checkpoint (every shard), or add the model's config.json to the folder"));
        }
    }
    module.children.iter().try_for_each(|c| check_lists(c, origin))
}

/// How a node's parent sees it.
#[derive(Clone, Copy, PartialEq)]
enum Placement {
    Plain,
    /// An item of a block list: a transformer block.
    Block,
    /// Anything inside a block (no nested blocks).
    InsideBlock,
}

/// What the tree took for granted, for the notes.
#[derive(Default)]
pub(super) struct Guesses {
    /// Packed quantized weights counted as 4-bit values, for want of a quantization config.
    pub packed_assumed_4bit: usize,
}

#[derive(Default)]
struct Node {
    tensors: Vec<Tensor>,
    children: Vec<(String, Node)>,
    index: HashMap<String, usize>,
}

impl Node {
    fn child(&mut self, component: &str) -> &mut Node {
        let position = match self.index.get(component) {
            Some(&p) => p,
            None => {
                self.children.push((component.to_string(), Node::default()));
                self.index.insert(component.to_string(), self.children.len() - 1);
                self.children.len() - 1
            }
        };
        &mut self.children[position].1
    }

    fn into_module(self, path: &str, name: &str, role: Placement, guesses: &mut Guesses) -> Module {
        let is_list = !self.children.is_empty()
            && self.tensors.is_empty()
            && self.children.iter().all(|(c, _)| names::is_index(c));
        let item_role = match role {
            Placement::Block | Placement::InsideBlock => Placement::InsideBlock,
            Placement::Plain if is_list && BLOCK_LISTS.contains(&name) => Placement::Block,
            Placement::Plain => Placement::Plain,
        };
        let child_count = self.children.len();
        let has_quant_state = self.tensors.iter().any(|t| t.name.starts_with("weight."));
        let mut tensors = self.tensors;
        for tensor in &mut tensors {
            classify_tensor(tensor, has_quant_state, guesses);
        }
        let leaf = self.children.is_empty();
        let children: Vec<Module> = self
            .children
            .into_iter()
            .map(|(c, node)| {
                let child_path = if path.is_empty() { c.clone() } else { format!("{path}.{c}") };
                node.into_module(&child_path, &c, item_role, guesses)
            })
            .collect();
        let (class, kind) = if role == Placement::Block {
            ("Block", ModuleKind::Block)
        } else if is_list && name == "experts" {
            ("ModuleList", ModuleKind::Experts { count: u32::try_from(child_count).unwrap_or(u32::MAX) })
        } else if is_list {
            ("ModuleList", ModuleKind::Container)
        } else if leaf {
            leaf_kind(name, &tensors)
        } else {
            ("Module", ModuleKind::Container)
        };
        Module { tensors, children, ..Module::new(path, class, kind) }
    }
}

fn classify_tensor(tensor: &mut Tensor, has_quant_state: bool, guesses: &mut Guesses) {
    if BUFFER_NAMES.contains(&tensor.name.as_str()) {
        tensor.kind = TensorKind::Buffer { persistent: true };
        // Rotary frequencies are computed in float32; the others are made in the default dtype.
        tensor.follows_load_dtype = tensor.name != "inv_freq";
        return;
    }
    match quant::role(&tensor.name) {
        Some(Role::Constant) => tensor.kind = TensorKind::QuantConstant,
        Some(Role::PackedWeight) => {
            guesses.packed_assumed_4bit += 1;
            tensor.kind =
                TensorKind::PackedParameter { per_element: (tensor.dtype.bits() / 4).max(1) as u32 };
        }
        None if tensor.name == "weight" && has_quant_state && !tensor.dtype.is_float() => {
            // bitsandbytes 4-bit: two values per byte.
            tensor.kind =
                TensorKind::PackedParameter { per_element: (tensor.dtype.bits() / 4).max(1) as u32 };
        }
        None => {}
    }
}

fn leaf_kind(name: &str, tensors: &[Tensor]) -> (&'static str, ModuleKind) {
    let weight = tensors.iter().find(|t| t.name == "weight" || t.name == "qweight");
    let rank = weight.map_or(0, |w| w.shape.len());
    let lower = name.to_ascii_lowercase();
    if rank == 2 && (lower.contains("embed") || EMBEDDING_NAMES.contains(&name)) {
        ("Embedding", ModuleKind::Embedding)
    } else if rank == 2 || weight.is_some_and(|w| w.kind != TensorKind::Parameter) {
        ("Linear", ModuleKind::Linear)
    } else if rank == 1 && (lower.contains("norm") || lower.starts_with("ln")) {
        ("Norm", ModuleKind::Norm)
    } else {
        ("Module", ModuleKind::Other)
    }
}

/// Fills in the facts the tree shows and writes the notes.
fn describe(
    root: Module,
    checkpoint: Checkpoint,
    guesses: Guesses,
    missing_header: usize,
    origin: &str,
) -> Result<ModelDescription, InputError> {
    let mut blocks = Vec::new();
    let mut embeddings: Vec<(u64, u64)> = Vec::new();
    let mut norm_widths: HashMap<u64, usize> = HashMap::new();
    let mut norms_with_bias = 0usize;
    let mut experts: Option<u32> = None;
    let mut positions = 0u64;
    root.visit(&mut |m| match m.kind {
        ModuleKind::Block => blocks.push(m.path.clone()),
        ModuleKind::Embedding => {
            if let Some([rows, dim]) =
                m.tensors.iter().find(|t| t.name == "weight").map(|t| t.shape.as_slice())
            {
                embeddings.push((*rows, *dim));
                let lower = m.name().to_ascii_lowercase();
                if lower.contains("pos") || lower == "wpe" {
                    positions = positions.max(*rows);
                }
            }
        }
        ModuleKind::Norm => {
            if let Some([width]) = m.tensors.iter().find(|t| t.name == "weight").map(|t| t.shape.as_slice()) {
                *norm_widths.entry(*width).or_default() += 1;
            }
            if m.tensors.iter().any(|t| t.name == "bias") {
                norms_with_bias += 1;
            }
        }
        ModuleKind::Experts { count } => experts = Some(experts.unwrap_or(0).max(count)),
        _ => {}
    });
    if blocks.is_empty() {
        return Err(InputError::new(
            origin,
            "found no repeated blocks (`layers.N`, `h.N`, `block.N`) among the checkpoint's tensor names",
        )
        .with_fix("add the model's config.json to the folder so its structure is known"));
    }
    let vocab_embedding = embeddings.iter().max_by_key(|(rows, _)| *rows).copied();
    let norm_width = norm_widths.iter().max_by_key(|(w, n)| (**n, **w)).map(|(w, _)| *w);
    let hidden = vocab_embedding.map(|(_, dim)| dim).or(norm_width).unwrap_or(0);
    if hidden == 0 {
        return Err(InputError::new(
            origin,
            "cannot tell the hidden size: no embedding or norm among the tensors",
        )
        .with_fix("add the model's config.json to the folder"));
    }
    let layers: Vec<LayerFacts> = blocks
        .iter()
        .map(|path| LayerFacts {
            path: path.clone(),
            stack: if path.contains("encoder") { StackKind::Encoder } else { StackKind::Decoder },
            moe: root.find(path).is_some_and(|b| {
                let mut found = false;
                b.visit(&mut |m| found |= matches!(m.kind, ModuleKind::Experts { .. }));
                found
            }),
            attention_window: None,
            cross_attention: false,
            ssm: None,
        })
        .collect();
    let moe = experts.map(|count| MoeFacts {
        experts: count,
        top_k: count.min(2),
        expert_intermediate_size: 0,
        shared_experts: 0,
        shared_intermediate_size: 0,
    });
    let dtype = dominant_dtype(&checkpoint);
    let naming = super::overlay::detect_naming(checkpoint.tensors.keys().map(String::as_str));
    let mut notes = checkpoint.notes.clone();
    notes.push(format!(
        "no config.json: the tree is built from {} tensor names in {} shard headers; module classes and \
         structure facts are missing (attention heads assumed 1 of width {hidden}, which sizes the KV cache \
         as multi-head attention; context length, activation, MoE routing unknown). Add the model's \
         config.json for a full description",
        checkpoint.tensors.len(),
        checkpoint.shards_read
    ));
    if let Some(moe) = &moe {
        notes.push(format!(
            "{} experts per MoE layer found; experts per token unknown, assumed {}",
            moe.experts, moe.top_k
        ));
    }
    if guesses.packed_assumed_4bit > 0 {
        notes.push(format!(
            "{} packed quantized weights counted as 4-bit values (no quantization_config to say)",
            guesses.packed_assumed_4bit
        ));
    }
    if missing_header > 0 {
        notes.push(format!("{missing_header} tensors the index names are in shard files not in the folder"));
    }
    let facts = ArchFacts {
        model_type: "unknown".into(),
        hidden_size: hidden,
        num_attention_heads: 1,
        num_kv_heads: 1,
        head_dim: hidden,
        intermediate_size: 0,
        vocab_size: vocab_embedding.map_or(0, |(rows, _)| rows),
        max_positions: positions,
        attention: AttentionKind::Standard,
        norm: if norms_with_bias > 0 { NormKind::LayerNorm } else { NormKind::RmsNorm },
        gated_mlp: false,
        activation: "unknown".into(),
        moe,
        tie_word_embeddings: false,
        layers,
        no_split_classes: vec!["Block".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    let model = ModelDescription {
        custom: false,
        name: origin.to_string(),
        architecture: "unknown (from safetensors headers)".into(),
        naming: naming.unwrap_or_default(),
        dtype,
        facts,
        root,
        notes,
        quantization: None,
        float_forms: Default::default(),
    };
    summary::validate(&model, origin)?;
    Ok(model)
}

/// The floating-point dtype holding the most elements among the headers (float32 when none).
pub(super) fn dominant_dtype(checkpoint: &Checkpoint) -> crate::DType {
    checkpoint
        .tensors
        .values()
        .flatten()
        .filter(|t| t.dtype.is_float())
        .fold(HashMap::new(), |mut acc: HashMap<crate::DType, u64>, t| {
            *acc.entry(t.dtype).or_default() += t.numel();
            acc
        })
        .into_iter()
        .max_by_key(|(d, n)| (*n, *d))
        .map_or(crate::DType::F32, |(d, _)| d)
}
