//! The generic model (`model::generic`): a config whose class has no importer, over the
//! checkpoint's headers. The tree is `from_names::tree` (every tensor as stored); the facts are
//! the config's sizes (`num_hidden_layers`, `hidden_size`, heads, `head_dim`,
//! `intermediate_size`, `vocab_size`, positions, ties, MoE counts; a nested `text_config` where
//! the config nests them), each checked against what the tensors say. What the generic decoder
//! layer cannot describe is refused with the key and what is missing: no repeated block list,
//! several stacks (an encoder-decoder, a vision tower), blocks without attention projections,
//! blocks that differ outside their MLP, and cache types other than attention's (`layer_types`
//! naming other layers, `mamba_*`, `ssm_*`, `linear_*` keys).

use super::super::from_names;
use super::super::{Checkpoint, names};
use crate::model::hf::HfConfig;
use crate::model::{
    ArchFacts, AttentionKind, LayerFacts, ModelDescription, Module, ModuleKind, MoeFacts, NormKind,
    OutputHead, StackKind, Tensor, TensorKind, generic, join, summary,
};
use crate::{DType, InputError};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Config keys of each size, first present wins: transformers' names, then the `attribute_map`
/// aliases its config classes share (GPT-2's `n_layer`, T5's `d_model`).
const LAYERS: &[&str] = &["num_hidden_layers", "n_layer", "num_layers", "n_layers"];
const HIDDEN: &[&str] = &["hidden_size", "n_embd", "n_embed", "d_model", "dim"];
const HEADS: &[&str] = &["num_attention_heads", "n_head", "num_heads", "n_heads"];
const KV_HEADS: &[&str] = &["num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv"];
const HEAD_DIM: &[&str] = &["head_dim"];
const INTERMEDIATE: &[&str] = &["intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size"];
const VOCAB: &[&str] = &["vocab_size", "n_vocab"];
const POSITIONS: &[&str] = &["max_position_embeddings", "n_positions", "max_seq_len", "seq_length"];
const ACTIVATION: &[&str] = &["hidden_act", "activation_function", "hidden_activation"];
const EXPERTS: &[&str] = &["num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"];
const TOP_K: &[&str] = &["num_experts_per_tok", "moe_top_k", "top_k", "num_selected_experts"];
const EXPERT_WIDTH: &[&str] = &["moe_intermediate_size", "expert_intermediate_size"];
const SHARED_EXPERTS: &[&str] = &["n_shared_experts", "num_shared_experts"];
const SHARED_WIDTH: &[&str] = &["shared_expert_intermediate_size"];

/// Config key prefixes of layers whose cache is not attention's K and V.
const OTHER_CACHE_PREFIXES: &[&str] = &["mamba_", "ssm_", "linear_"];
/// `layer_types` entries the generic decoder layer describes.
const ATTENTION_LAYER_TYPES: &[&str] = &["full_attention", "sliding_attention"];

/// Attention projection names: separate query, key and value, or one fused projection.
const QUERY: &[&str] = &["q_proj", "query", "q", "wq", "q_lin"];
const KEY: &[&str] = &["k_proj", "key", "k", "wk", "k_lin"];
const VALUE: &[&str] = &["v_proj", "value", "v", "wv", "v_lin"];
const FUSED_QKV: &[&str] = &["qkv_proj", "query_key_value", "c_attn", "Wqkv", "qkv", "W_pack", "wqkv"];
/// Names of a causal LM's output head.
const OUTPUT_HEADS: &[&str] = &["lm_head", "embed_out", "output", "lm_loss", "output_layer"];

/// Builds the generic description of `config` (class `arch`) over `checkpoint`.
pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    checkpoint: &Checkpoint,
    origin: &str,
) -> Result<ModelDescription, InputError> {
    let refuse = |key: &str, problem: String, fix: &str| {
        InputError::new(config.origin(), format!("`{arch}` has no importer, and {problem}"))
            .at_key(key)
            .with_fix(fix.to_string())
    };
    if checkpoint.names_only() {
        return Err(refuse(
            "architectures",
            "a generic model needs the checkpoint's headers, but the folder has only its index".into(),
            "add the safetensors shards (or use the Hub id, whose headers are read by range requests), or \
             describe the model in a custom YAML file (docs/custom-models.md)",
        ));
    }
    let (sizes, prefix) = sizes_config(config);
    let key = |k: &str| format!("{prefix}{k}");
    refuse_other_caches(config, &sizes, &prefix, arch)?;
    if config.bool_or(&["is_encoder_decoder"], false)? {
        return Err(refuse(
            "is_encoder_decoder",
            "it is an encoder-decoder: the generic model describes one decoder stack".into(),
            "describe the model in a custom YAML file (docs/custom-models.md)",
        ));
    }

    let (mut root, guesses) = from_names::tree(checkpoint);
    let blocks = block_paths(&root);
    let lists: BTreeSet<&str> = blocks.iter().map(|b| names::split(b).0).collect();
    if blocks.is_empty() {
        return Err(refuse(
            "architectures",
            "its checkpoint has no repeated block list (`layers.N`, `h.N`, `block.N`) to describe as \
             decoder layers"
                .into(),
            "describe the model in a custom YAML file (docs/custom-models.md)",
        ));
    }
    if lists.len() > 1 {
        let listed: Vec<String> = lists
            .iter()
            .map(|l| format!("`{l}` ({})", blocks.iter().filter(|b| names::split(b).0 == *l).count()))
            .collect();
        let what =
            if lists.iter().any(|l| l.contains("encoder")) && lists.iter().any(|l| l.contains("decoder")) {
                "an encoder and a decoder"
            } else {
                "several stacks (a vision tower beside a language model, or an encoder)"
            };
        return Err(refuse(
            "architectures",
            format!(
                "its checkpoint has {} block lists, {}: {what}, where the generic model describes one \
                 decoder stack",
                lists.len(),
                listed.join(", ")
            ),
            "describe the model in a custom YAML file (docs/custom-models.md)",
        ));
    }

    // Sizes, each checked against the tensors.
    let layers = sizes.positive(LAYERS)?;
    if layers != blocks.len() as u64 {
        return Err(refuse(
            &key(first_present(&sizes, LAYERS)),
            format!(
                "config.json says {layers} layers where the checkpoint has {} blocks in `{}`",
                blocks.len(),
                lists.first().copied().unwrap_or_default()
            ),
            "give the config.json that belongs to this checkpoint",
        ));
    }
    let hidden = sizes.positive(HIDDEN)?;
    let heads = sizes.positive(HEADS)?;
    let heads_key = first_present(&sizes, HEADS);
    let head_dim = sizes.head_dim(HEAD_DIM, hidden, heads, heads_key)?;
    let in_block =
        |path: &str| blocks.iter().any(|b| path.strip_prefix(b.as_str()).is_some_and(|r| r.starts_with('.')));

    let vocab = sizes.opt_positive(VOCAB)?;
    let output_head = output_head(&root, &in_block);
    let embedding = token_embedding(&root, &in_block, vocab, output_head.as_deref()).ok_or_else(|| {
        refuse(
            "architectures",
            "its checkpoint has no token embedding (a 2-D `embed…`/`wte`/`word_embeddings` weight \
             outside the blocks)"
                .into(),
            "describe the model in a custom YAML file (docs/custom-models.md)",
        )
    })?;
    let (embedding_path, rows, width) = embedding;
    if width != hidden {
        return Err(refuse(
            &key(first_present(&sizes, HIDDEN)),
            format!(
                "config.json says hidden size {hidden} where `{embedding_path}.weight` is [{rows}, {width}]"
            ),
            "give the config.json that belongs to this checkpoint",
        ));
    }
    if let Some(v) = vocab
        && v != rows
    {
        return Err(refuse(
            &key(first_present(&sizes, VOCAB)),
            format!("config.json says vocabulary {v} where `{embedding_path}.weight` has {rows} rows"),
            "give the config.json that belongs to this checkpoint",
        ));
    }

    // Attention: every block has its projections, and their widths are heads × head_dim.
    let kv_given = sizes.opt_positive(KV_HEADS)?;
    let mut kv_heads = None;
    let mut conv1d = false;
    for block in &blocks {
        let module = root.find(block).expect("a block found in the tree");
        let found = attention(module).ok_or_else(|| {
            refuse(
                "architectures",
                format!(
                    "block `{block}` has no attention projections (`q_proj`/`k_proj`/`v_proj` or a fused \
                     `qkv_proj`/`query_key_value`/`c_attn`): its layer keeps another kind of state \
                     (state-space or linear attention) that the generic decoder layer does not describe"
                ),
                "describe the model in a custom YAML file (docs/custom-models.md), declaring each \
                 block's activations and cache",
            )
        })?;
        let check = found.check(hidden, heads, head_dim, kv_given).map_err(|(k, problem)| {
            let k = if k == "heads" {
                if sizes.get(HEAD_DIM).is_some() { key("head_dim") } else { key(heads_key) }
            } else {
                key(first_present(&sizes, KV_HEADS))
            };
            refuse(&k, problem, "give the config.json that belongs to this checkpoint")
        })?;
        conv1d |= check.transposed;
        match kv_heads {
            None => kv_heads = Some(check.kv_heads),
            Some(k) if k != check.kv_heads => {
                return Err(refuse(
                    &key(first_present(&sizes, KV_HEADS)),
                    format!(
                        "block `{block}` has {} key/value heads where the first block has {k}",
                        check.kv_heads
                    ),
                    "describe the model in a custom YAML file (docs/custom-models.md)",
                ));
            }
            Some(_) => {}
        }
    }
    let kv_heads = kv_heads.unwrap_or(heads);
    uniform_blocks(&root, &blocks).map_err(|problem| {
        refuse(
            "architectures",
            problem,
            "describe the model in a custom YAML file (docs/custom-models.md), with each kind of block",
        )
    })?;

    // MLP: dense blocks' width and gating, experts' counts.
    let mut notes = Vec::new();
    mark_fused_experts(&mut root);
    let experts = expert_counts(&root, &blocks, hidden);
    let dense: Vec<&String> = blocks.iter().filter(|b| !experts.contains_key(b.as_str())).collect();
    let intermediate_given = sizes.opt_positive(INTERMEDIATE)?;
    let mut intermediate = 0;
    let mut gated = false;
    if let Some(first) = dense.first() {
        let module = root.find(first).expect("a block");
        let widths = mlp_widths(module, hidden);
        intermediate = match intermediate_given {
            Some(i) if widths.contains(&i) || widths.contains(&(2 * i)) => i,
            Some(i) => {
                return Err(refuse(
                    &key(first_present(&sizes, INTERMEDIATE)),
                    format!(
                        "config.json says intermediate size {i} where the MLP weights of `{first}` have \
                         widths {widths:?} besides the hidden size"
                    ),
                    "give the config.json that belongs to this checkpoint",
                ));
            }
            None => {
                let Some(&w) = widths.iter().min() else {
                    return Err(refuse(
                        "intermediate_size",
                        format!("block `{first}` has no MLP weights besides its attention"),
                        "describe the model in a custom YAML file (docs/custom-models.md)",
                    ));
                };
                notes.push(format!(
                    "config.json gives no intermediate size; the MLP weights of `{first}` say {w}"
                ));
                w
            }
        };
        gated = mlp_gated(module, hidden, intermediate);
    }
    let moe = match experts.values().next() {
        None => None,
        Some(&(count, width, expert_gated)) => {
            let given = sizes.opt_positive(EXPERTS)?;
            if let Some(e) = given
                && e != u64::from(count)
            {
                return Err(refuse(
                    &key(first_present(&sizes, EXPERTS)),
                    format!("config.json says {e} experts where the checkpoint's MoE layers have {count}"),
                    "give the config.json that belongs to this checkpoint",
                ));
            }
            let Some(top_k) = sizes.opt_positive(TOP_K)? else {
                return Err(refuse(
                    &key(TOP_K[0]),
                    format!(
                        "its checkpoint has {count} experts per MoE layer, and config.json does not say how \
                         many each token is routed to"
                    ),
                    "add `num_experts_per_tok` to config.json",
                ));
            };
            if let Some(w) = sizes.opt_positive(EXPERT_WIDTH)?
                && w != width
            {
                return Err(refuse(
                    &key(first_present(&sizes, EXPERT_WIDTH)),
                    format!("config.json says expert width {w} where the checkpoint's experts have {width}"),
                    "give the config.json that belongs to this checkpoint",
                ));
            }
            let shared_width = match sizes.opt_positive(SHARED_WIDTH)? {
                Some(w) => w,
                None => sizes.uint_or(SHARED_EXPERTS, 0)? * width,
            };
            let shared_experts = match sizes.uint_or(SHARED_EXPERTS, 0)? {
                0 if shared_width > 0 => 1,
                n => n,
            };
            if dense.is_empty() {
                gated = expert_gated;
            }
            Some(MoeFacts {
                experts: count,
                top_k: u32::try_from(top_k).unwrap_or(u32::MAX),
                expert_intermediate_size: width,
                shared_experts: u32::try_from(shared_experts).unwrap_or(u32::MAX),
                shared_intermediate_size: shared_width,
            })
        }
    };

    let windows = attention_windows(&sizes, &prefix, layers, &mut notes)?;
    let layer_facts: Vec<LayerFacts> = blocks
        .iter()
        .zip(windows)
        .map(|(path, window)| LayerFacts {
            path: path.clone(),
            stack: StackKind::Decoder,
            moe: experts.contains_key(path.as_str()),
            attention_window: window,
            cross_attention: false,
            ssm: None,
        })
        .collect();

    // The output head: tied as config.json says (absent: tied when the checkpoint has no head),
    // and added where a causal LM's tied head is left out of the checkpoint, as `save_pretrained`
    // leaves tied tensors out.
    let tie_given =
        config.get(&["tie_word_embeddings"]).is_some() || sizes.get(&["tie_word_embeddings"]).is_some();
    let tied = if tie_given {
        sizes.bool_or(&["tie_word_embeddings"], false)? || config.bool_or(&["tie_word_embeddings"], false)?
    } else {
        output_head.is_none()
    };
    let causal_lm = arch.ends_with("ForCausalLM") || arch.ends_with("LMHeadModel");
    let head_path = match (&output_head, causal_lm) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => {
            root.children.push(
                Module::new("lm_head", "Linear", ModuleKind::Linear).with_tensor(Tensor::parameter(
                    "weight",
                    &[rows, hidden],
                    dominant_of(&root),
                )),
            );
            notes.push(if tied {
                "the checkpoint leaves the tied output head out (as save_pretrained does); `lm_head` \
                 (transformers' name for a causal LM's head) is tied to the token embedding"
                    .to_string()
            } else {
                "the checkpoint has no output head and config.json does not tie it: `lm_head` is held \
                 untied, as transformers would initialize it"
                    .to_string()
            });
            Some("lm_head".to_string())
        }
        (None, false) => None,
    };
    if conv1d {
        mark_conv1d(&mut root, &blocks);
    }
    if let Some(head) = &head_path
        && let Some(module) = root.find_mut(head)
    {
        // `embed_out` reads as an embedding by its name; it is GPT-NeoX's output linear.
        module.kind = ModuleKind::Linear;
        module.class = "Linear".into();
    }

    let activation = sizes.string_opt(ACTIVATION)?.unwrap_or_else(|| "unknown".into());
    let positions = sizes.uint_or(POSITIONS, 0)?;
    let norm = norm_kind(&root, &blocks);
    let dtype = from_names::dominant_dtype(checkpoint);
    let naming = super::detect_naming(checkpoint.tensors.keys().map(String::as_str)).unwrap_or_default();
    let model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "not given".into());
    let mut all_notes = checkpoint.notes.clone();
    all_notes.push(format!(
        "generic model: config.json names `{arch}` (model_type `{model_type}`), which vramplan has no \
         importer for. The tree is the checkpoint's {} tensors as stored ({} shard headers), modules \
         named as the checkpoint names them; the sizes are config.json's{}, checked against the tensors; \
         activations follow the generic decoder layer (Llama-style, no family's traits)",
        checkpoint.tensors.len(),
        checkpoint.shards_read,
        if prefix.is_empty() { String::new() } else { format!(" (`{}`)", prefix.trim_end_matches('.')) }
    ));
    all_notes.extend(notes);
    if guesses.packed_assumed_4bit > 0 {
        all_notes.push(format!(
            "{} packed quantized weights counted as 4-bit values (a generic model's quantization_config is \
             not read)",
            guesses.packed_assumed_4bit
        ));
    }
    let missing = checkpoint.tensors.values().filter(|s| s.is_none()).count();
    if missing > 0 {
        return Err(refuse(
            "architectures",
            format!("{missing} tensors the index names are in shard files not in the folder"),
            "add every shard file to the folder",
        ));
    }
    let facts = ArchFacts {
        model_type: generic::MODEL_TYPE.into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: intermediate,
        vocab_size: rows,
        max_positions: positions,
        attention: AttentionKind::Standard,
        norm,
        gated_mlp: gated,
        activation,
        moe,
        tie_word_embeddings: tied,
        layers: layer_facts,
        no_split_classes: vec!["Block".into()],
        head: if head_path.is_some() { OutputHead::LanguageModel } else { OutputHead::None },
        vision: None,
    };
    let mut model = ModelDescription {
        custom: false,
        name: origin.to_string(),
        architecture: arch.to_string(),
        naming,
        dtype,
        facts,
        root,
        notes: all_notes,
        quantization: None,
        float_forms: Default::default(),
    };
    if let Some(head) = head_path
        && tied
    {
        let (head_weight, embedding_weight) = (join(&head, "weight"), join(&embedding_path, "weight"));
        let same = model.root.tensor(&head_weight).map(|t| t.shape.clone())
            == model.root.tensor(&embedding_weight).map(|t| t.shape.clone());
        if same {
            model.tie(&head_weight, &embedding_weight)?;
        }
    }
    summary::validate(&model, origin)?;
    Ok(model)
}

/// The config holding the sizes: the top level, or a nested `text_config` where the top level
/// has no layer count (the key prefix errors name).
fn sizes_config(config: &HfConfig) -> (HfConfig, String) {
    if config.get(LAYERS).is_none()
        && let Some(Value::Object(text)) = config.object().get("text_config")
    {
        return (HfConfig::from_object(text.clone(), config.origin()), "text_config.".into());
    }
    (HfConfig::from_object(config.object().clone(), config.origin()), String::new())
}

/// The first of `keys` the config has, else the first of them (for errors).
fn first_present<'k>(config: &HfConfig, keys: &[&'k str]) -> &'k str {
    config.get(keys).map_or(keys[0], |(k, _)| k)
}

/// Refuses layers whose cache is not attention's: `layer_types` naming other kinds, and keys of
/// state-space or linear-attention layers.
fn refuse_other_caches(
    config: &HfConfig,
    sizes: &HfConfig,
    prefix: &str,
    arch: &str,
) -> Result<(), InputError> {
    let fix = "describe the model in a custom YAML file (docs/custom-models.md), declaring each block's \
               activations and cache";
    for (p, object) in [("", config.object()), (prefix, sizes.object())] {
        if let Some(k) = object.keys().find(|k| OTHER_CACHE_PREFIXES.iter().any(|p| k.starts_with(p))) {
            return Err(InputError::new(
                config.origin(),
                format!(
                    "`{arch}` has no importer, and config.json's `{k}` belongs to layers that keep a \
                     state-space or linear-attention cache, which the generic decoder layer (attention's \
                     K and V) does not describe"
                ),
            )
            .at_key(format!("{p}{k}"))
            .with_fix(fix));
        }
    }
    if let Some(types) = sizes.string_list(&["layer_types"])?
        && let Some(other) = types.iter().find(|t| !ATTENTION_LAYER_TYPES.contains(&t.as_str()))
    {
        let count = types.iter().filter(|t| *t == other).count();
        return Err(InputError::new(
            config.origin(),
            format!(
                "`{arch}` has no importer, and config.json's layer_types names {count} `{other}` layers: \
                 an unknown cache type (the generic decoder layer describes {})",
                ATTENTION_LAYER_TYPES.join(" and ")
            ),
        )
        .at_key(format!("{prefix}layer_types"))
        .with_fix(fix));
    }
    Ok(())
}

/// Each layer's sliding window: `layer_types` with `sliding_window` where the config has them;
/// a window without `layer_types` is not applied (every layer attends to the whole sequence, an
/// upper bound), and a note says so.
fn attention_windows(
    sizes: &HfConfig,
    prefix: &str,
    layers: u64,
    notes: &mut Vec<String>,
) -> Result<Vec<Option<u64>>, InputError> {
    let window = sizes.opt_positive(&["sliding_window"])?;
    let types = sizes.string_list(&["layer_types"])?;
    match (types, window) {
        (Some(types), _) if types.len() as u64 != layers => Err(InputError::new(
            sizes.origin(),
            format!("layer_types lists {} layers where there are {layers}", types.len()),
        )
        .at_key(format!("{prefix}layer_types"))
        .with_fix("give one entry per layer")),
        (Some(types), Some(w)) => Ok(types.iter().map(|t| (t == "sliding_attention").then_some(w)).collect()),
        (Some(types), None) if types.iter().any(|t| t == "sliding_attention") => Err(InputError::new(
            sizes.origin(),
            "layer_types names sliding_attention layers but config.json gives no sliding_window".to_string(),
        )
        .at_key(format!("{prefix}sliding_window"))
        .with_fix("add the window's length as `sliding_window`")),
        (None, Some(w)) => {
            notes.push(format!(
                "config.json has sliding_window {w} but no layer_types saying which layers use it: every \
                 layer is taken to attend to the whole sequence (an upper bound)"
            ));
            Ok(vec![None; layers as usize])
        }
        _ => Ok(vec![None; layers as usize]),
    }
}

/// The blocks' paths, in order.
fn block_paths(root: &Module) -> Vec<String> {
    let mut blocks = Vec::new();
    root.visit(&mut |m| {
        if m.kind == ModuleKind::Block {
            blocks.push(m.path.clone());
        }
    });
    blocks
}

/// The 2-D float weight of a linear-like leaf, `[rows, columns]` as stored.
fn matrix(module: &Module) -> Option<(u64, u64)> {
    let weight = module.tensors.iter().find(|t| t.name == "weight" && t.kind == TensorKind::Parameter)?;
    match weight.shape.as_slice() {
        [rows, columns] if weight.dtype.is_float() => Some((*rows, *columns)),
        _ => None,
    }
}

/// A block's attention projections, as found by name.
struct Attention {
    /// (path, [rows, columns]) of q, k and v, or of the fused projection.
    projections: Vec<(String, (u64, u64))>,
    fused: bool,
    /// The attention's module paths (the parents of the projections).
    parents: BTreeSet<String>,
}

/// What the attention check found.
struct AttentionCheck {
    kv_heads: u64,
    /// The weights are stored `[in, out]` (GPT-2's `Conv1D`).
    transposed: bool,
}

fn attention(block: &Module) -> Option<Attention> {
    let mut by_name: BTreeMap<&str, Vec<&Module>> = BTreeMap::new();
    block.visit(&mut |m| {
        if m.children.is_empty() {
            by_name.entry(m.name()).or_default().push(m);
        }
    });
    let pick = |names: &[&str]| names.iter().find_map(|n| by_name.get(n).and_then(|v| v.first().copied()));
    let with_matrix = |m: &Module| (m.path.clone(), matrix(m).unwrap_or((0, 0)));
    let parent = |m: &Module| names::split(&m.path).0.to_string();
    if let (Some(q), Some(k), Some(v)) = (pick(QUERY), pick(KEY), pick(VALUE)) {
        return Some(Attention {
            projections: vec![with_matrix(q), with_matrix(k), with_matrix(v)],
            fused: false,
            parents: [parent(q), parent(k), parent(v)].into_iter().collect(),
        });
    }
    let fused = pick(FUSED_QKV)?;
    Some(Attention { projections: vec![with_matrix(fused)], fused: true, parents: [parent(fused)].into() })
}

impl Attention {
    /// Checks the projections' widths against heads × head_dim; on a mismatch, which size
    /// (`heads` or `kv`) and the problem.
    fn check(
        &self,
        hidden: u64,
        heads: u64,
        d: u64,
        kv_given: Option<u64>,
    ) -> Result<AttentionCheck, (&'static str, String)> {
        // `[out, in]` (nn.Linear) or `[in, out]` (Conv1D): the side that is not the hidden size.
        let out = |(rows, columns): (u64, u64)| -> Option<(u64, bool)> {
            if columns == hidden {
                Some((rows, false))
            } else if rows == hidden {
                Some((columns, true))
            } else {
                None
            }
        };
        let unreadable = |path: &str, shape: (u64, u64)| {
            (
                "heads",
                format!(
                    "`{path}.weight` is [{}, {}], neither side the hidden size {hidden} (or not a float matrix)",
                    shape.0, shape.1
                ),
            )
        };
        let q_width = heads * d;
        if self.fused {
            let (path, shape) = &self.projections[0];
            let (width, transposed) = out(*shape).ok_or_else(|| unreadable(path, *shape))?;
            let kv = match kv_given {
                Some(kv) => kv,
                None if width > q_width && (width - q_width).is_multiple_of(2 * d) => {
                    (width - q_width) / (2 * d)
                }
                None => 0,
            };
            if width != (heads + 2 * kv) * d {
                let which = if kv_given.is_some() { "kv" } else { "heads" };
                return Err((
                    which,
                    format!(
                        "`{path}.weight` is [{}, {}]: {width} outputs, where (num_attention_heads + 2 × \
                         num_key_value_heads) × head_dim = ({heads} + 2 × {kv}) × {d} = {}",
                        shape.0,
                        shape.1,
                        (heads + 2 * kv) * d
                    ),
                ));
            }
            return Ok(AttentionCheck { kv_heads: kv, transposed });
        }
        let (q_path, q_shape) = &self.projections[0];
        let (q_out, transposed) = out(*q_shape).ok_or_else(|| unreadable(q_path, *q_shape))?;
        if q_out != q_width {
            return Err((
                "heads",
                format!(
                    "`{q_path}.weight` is [{}, {}]: {q_out} outputs, where num_attention_heads × head_dim = \
                     {heads} × {d} = {q_width}",
                    q_shape.0, q_shape.1
                ),
            ));
        }
        let mut kv_heads = None;
        for (path, shape) in &self.projections[1..] {
            let (width, _) = out(*shape).ok_or_else(|| unreadable(path, *shape))?;
            let expected = kv_given.map(|kv| kv * d);
            let found = width / d;
            if expected.is_some_and(|e| e != width)
                || !width.is_multiple_of(d)
                || kv_heads.is_some_and(|k| k != found)
            {
                return Err((
                    "kv",
                    format!(
                        "`{path}.weight` is [{}, {}]: {width} outputs, where num_key_value_heads × head_dim = \
                         {} × {d}",
                        shape.0,
                        shape.1,
                        kv_given.map_or_else(
                            || "(from the key projection) ".to_string()
                                + &kv_heads.unwrap_or(found).to_string(),
                            |k| k.to_string()
                        )
                    ),
                ));
            }
            kv_heads = Some(found);
        }
        Ok(AttentionCheck { kv_heads: kv_heads.unwrap_or(heads), transposed })
    }
}

/// Refuses blocks that differ outside their MLP: each block's tensor names (relative, list
/// indices as `N`) must equal the first block's, but for what lies under the one child that
/// holds the experts in the MoE blocks (a dense MLP in its place is a dense layer).
fn uniform_blocks(root: &Module, blocks: &[String]) -> Result<(), String> {
    let signature = |path: &str| -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        if let Some(block) = root.find(path) {
            block.visit(&mut |m| {
                for t in &m.tensors {
                    let full = join(&m.path, &t.name);
                    names.insert(names::pattern(&full[path.len() + 1..]));
                }
            });
        }
        names
    };
    let first = signature(&blocks[0]);
    for block in &blocks[1..] {
        let this = signature(block);
        if this == first {
            continue;
        }
        let differing: Vec<&String> = first.symmetric_difference(&this).collect();
        let children: BTreeSet<&str> = differing.iter().map(|n| n.split('.').next().unwrap_or("")).collect();
        let has_experts = |names: &BTreeSet<String>| names.iter().any(|n| n.contains("experts"));
        let mlp_only = children.len() == 1 && (has_experts(&first) != has_experts(&this));
        if !mlp_only {
            let shown: Vec<String> = differing.iter().take(6).map(|n| format!("`{n}`")).collect();
            return Err(format!(
                "block `{block}` differs from `{}` in {} tensors ({}{}), beyond a dense or mixture-of-experts \
                 MLP: the generic decoder layer describes blocks of one kind",
                blocks[0],
                differing.len(),
                shown.join(", "),
                if differing.len() > 6 { ", …" } else { "" }
            ));
        }
    }
    Ok(())
}

/// Gives fused experts (5.x names: a module `experts` holding 3-D tensors, experts first) the
/// experts kind.
fn mark_fused_experts(root: &mut Module) {
    root.visit_mut(&mut |m| {
        if m.name() == "experts" && m.children.is_empty() {
            let counts: BTreeSet<u64> =
                m.tensors.iter().filter(|t| t.shape.len() == 3).map(|t| t.shape[0]).collect();
            if counts.len() == 1 {
                let count = counts.into_iter().next().unwrap_or(0);
                m.kind = ModuleKind::Experts { count: u32::try_from(count).unwrap_or(u32::MAX) };
            }
        }
    });
}

/// Per MoE block: experts, one expert's width, and whether it is gated.
fn expert_counts(root: &Module, blocks: &[String], hidden: u64) -> BTreeMap<String, (u32, u64, bool)> {
    let mut out = BTreeMap::new();
    for block in blocks {
        let Some(module) = root.find(block) else { continue };
        let mut found = None;
        module.visit(&mut |m| {
            if let ModuleKind::Experts { count } = m.kind
                && found.is_none()
            {
                found = Some((count, m));
            }
        });
        let Some((count, experts)) = found else { continue };
        // One expert's matrices, with the experts' dimension dropped where they are fused.
        let mut dims: Vec<Vec<u64>> = Vec::new();
        match experts.children.first() {
            Some(first) => first.visit(&mut |m| {
                if let Some((r, c)) = matrix(m) {
                    dims.push(vec![r, c]);
                }
            }),
            None => dims
                .extend(experts.tensors.iter().filter(|t| t.shape.len() == 3).map(|t| t.shape[1..].to_vec())),
        }
        let widths: Vec<u64> = dims.iter().flatten().copied().filter(|d| *d != hidden).collect();
        let width = widths.iter().copied().min().unwrap_or(0);
        let elements: u64 = dims.iter().map(|d| d.iter().product::<u64>()).sum();
        out.insert(block.clone(), (count, width, gated_by_size(elements, hidden, width)));
    }
    out
}

/// A gated MLP (gate, up and down, or a fused gate and up with down) holds three matrices of
/// `hidden × width`, a plain one two.
fn gated_by_size(elements: u64, hidden: u64, width: u64) -> bool {
    width > 0 && 2 * elements >= 5 * hidden * width
}

/// The widths besides `hidden` of a dense block's matrices outside its attention.
fn mlp_widths(block: &Module, hidden: u64) -> Vec<u64> {
    let attention = attention(block).map(|a| a.parents).unwrap_or_default();
    let mut widths = Vec::new();
    block.visit(&mut |m| {
        let inside_attention = attention.iter().any(|p| m.path == *p || m.path.starts_with(&format!("{p}.")));
        if inside_attention {
            return;
        }
        if let Some((r, c)) = matrix(m) {
            widths.extend([r, c].into_iter().filter(|d| *d != hidden));
        }
    });
    widths.sort_unstable();
    widths.dedup();
    widths
}

/// Whether a dense block's MLP (its matrices outside the attention) is gated.
fn mlp_gated(block: &Module, hidden: u64, intermediate: u64) -> bool {
    let attention = attention(block).map(|a| a.parents).unwrap_or_default();
    let mut elements = 0;
    block.visit(&mut |m| {
        if attention.iter().any(|p| m.path == *p || m.path.starts_with(&format!("{p}."))) {
            return;
        }
        if let Some((r, c)) = matrix(m) {
            elements += r * c;
        }
    });
    gated_by_size(elements, hidden, intermediate)
}

/// RMSNorm unless the blocks' norms have biases (LayerNorm).
fn norm_kind(root: &Module, blocks: &[String]) -> NormKind {
    let mut biased = false;
    for block in blocks.iter().take(1) {
        if let Some(module) = root.find(block) {
            module.visit(&mut |m| {
                biased |= m.kind == ModuleKind::Norm && m.tensors.iter().any(|t| t.name == "bias");
            });
        }
    }
    if biased { NormKind::LayerNorm } else { NormKind::RmsNorm }
}

/// The output head among the modules outside the blocks: a module named as transformers names
/// a causal LM's head, holding a 2-D weight.
fn output_head(root: &Module, in_block: &dyn Fn(&str) -> bool) -> Option<String> {
    let mut found = None;
    root.visit(&mut |m| {
        if found.is_none()
            && !in_block(&m.path)
            && OUTPUT_HEADS.contains(&m.name())
            && m.tensors.iter().any(|t| t.name == "weight" && t.shape.len() == 2)
        {
            found = Some(m.path.clone());
        }
    });
    found
}

/// The token embedding: an embedding outside the blocks with `vocab` rows (the most rows when
/// the config does not say), not the output head: (path, rows, width).
fn token_embedding(
    root: &Module,
    in_block: &dyn Fn(&str) -> bool,
    vocab: Option<u64>,
    head: Option<&str>,
) -> Option<(String, u64, u64)> {
    let mut candidates: Vec<(String, u64, u64)> = Vec::new();
    root.visit(&mut |m| {
        if m.kind != ModuleKind::Embedding || in_block(&m.path) || Some(m.path.as_str()) == head {
            return;
        }
        if let Some(t) = m.tensors.iter().find(|t| t.name == "weight")
            && let [rows, width] = t.shape.as_slice()
        {
            candidates.push((m.path.clone(), *rows, *width));
        }
    });
    candidates
        .iter()
        .find(|(_, rows, _)| Some(*rows) == vocab)
        .or_else(|| candidates.iter().max_by_key(|(_, rows, _)| *rows))
        .cloned()
}

/// The dominant floating-point dtype of the tree's parameters (for a head the checkpoint left
/// out).
fn dominant_of(root: &Module) -> DType {
    let mut counts: BTreeMap<DType, u64> = BTreeMap::new();
    root.visit(&mut |m| {
        for t in m.tensors.iter().filter(|t| t.kind == TensorKind::Parameter && t.dtype.is_float()) {
            *counts.entry(t.dtype).or_default() += t.numel();
        }
    });
    counts.into_iter().max_by_key(|(_, n)| *n).map_or(DType::F32, |(d, _)| d)
}

/// GPT-2's `Conv1D` stores weights `[in, out]`: the blocks' linear layers get its class, which
/// the simulator reads the input width by.
fn mark_conv1d(root: &mut Module, blocks: &[String]) {
    for block in blocks {
        if let Some(module) = root.find_mut(block) {
            module.visit_mut(&mut |m| {
                if m.kind == ModuleKind::Linear {
                    m.class = "Conv1D".into();
                }
            });
        }
    }
}
