//! The generic model (`model::generic`): a config whose class has no importer, over the
//! checkpoint's headers. The tree is `from_names::tree` (every tensor as stored); the facts are
//! the config's sizes (`num_hidden_layers`, `hidden_size`, heads, `head_dim`,
//! `intermediate_size`, `vocab_size`, positions, ties, MoE counts; a nested `text_config` where
//! the config nests them), each checked against what the tensors say. What the generic decoder
//! layer cannot describe is refused with the key and what is missing: no repeated block list,
//! several stacks (an encoder-decoder, a vision tower), blocks without attention projections,
//! blocks that differ outside their MLP, and cache types other than attention's (`layer_types`
//! naming other layers, `mamba_*`, `ssm_*`, `linear_*` keys).

mod layout;

use super::super::from_names;
use super::super::{Checkpoint, names};
use crate::InputError;
use crate::model::hf::HfConfig;
use crate::model::{
    ArchFacts, AttentionKind, LayerFacts, ModelDescription, Module, ModuleKind, MoeFacts, Naming, OutputHead,
    StackKind, Tensor, generic, join, summary,
};
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

/// Builds the generic description of `config` (class `arch`) over `checkpoint`.
pub(crate) fn build(
    config: &HfConfig,
    arch: &str,
    checkpoint: &Checkpoint,
    origin: &str,
) -> Result<ModelDescription, InputError> {
    let r = Reading::new(config, arch);
    if checkpoint.names_only() || checkpoint.tensors.values().any(Option::is_none) {
        return Err(r.refuse(
            "architectures",
            "a generic model needs every shard's header, and the folder lacks shard files its index names"
                .into(),
            "add every safetensors shard (or use the Hub id, whose headers are read by range requests), \
             or describe the model in a custom YAML file (docs/custom-models.md)",
        ));
    }
    refuse_other_caches(&r)?;
    if config.bool_or(&["is_encoder_decoder"], false)? {
        return Err(r.refuse(
            "is_encoder_decoder",
            "it is an encoder-decoder: the generic model describes one decoder stack".into(),
            CUSTOM,
        ));
    }
    let (mut root, guesses) = from_names::tree(checkpoint);
    from_names::check_lists(&root, origin)?;
    let blocks = r.stack(&root)?;
    let (hidden, heads) = (r.sizes.positive(HIDDEN)?, r.sizes.positive(HEADS)?);
    let head_dim = r.sizes.head_dim(HEAD_DIM, hidden, heads, first_present(&r.sizes, HEADS))?;
    let in_block =
        |path: &str| blocks.iter().any(|b| path.strip_prefix(b.as_str()).is_some_and(|r| r.starts_with('.')));
    let output_head = layout::output_head(&root, &in_block);
    let (embedding, vocab) = r.embedding(&root, &in_block, output_head.as_deref(), hidden)?;
    let mut notes = Vec::new();
    let (kv_heads, conv1d) = r.attention(&root, &blocks, hidden, heads, head_dim, &mut notes)?;
    layout::uniform_blocks(&root, &blocks).map_err(|problem| {
        r.refuse(
            "architectures",
            problem,
            "describe the model in a custom YAML file (docs/custom-models.md), with each kind of block",
        )
    })?;
    layout::mark_fused_experts(&mut root);
    let mlp = r.mlp(&root, &blocks, hidden, &mut notes)?;
    let naming = super::detect_naming(checkpoint.tensors.keys().map(String::as_str)).unwrap_or_default();
    if mlp.moe.is_some() && naming == Naming::V4 {
        notes.push(
            "the experts are stored one module each (transformers 4.x names) and described so; \
             transformers 5.x fuses them into 3-D parameters, which bitsandbytes leaves unquantized, \
             so a QLoRA estimate of this description quantizes experts that 5.x keeps in 16 bits \
             (docs/memory-model.md, \"Generic models\")"
                .into(),
        );
    }
    let windows = attention_windows(&r, blocks.len() as u64, &mut notes)?;
    let layers: Vec<LayerFacts> = blocks
        .iter()
        .zip(windows)
        .map(|(path, window)| LayerFacts {
            path: path.clone(),
            stack: StackKind::Decoder,
            moe: mlp.experts.contains_key(path.as_str()),
            attention_window: window,
            cross_attention: false,
            ssm: None,
        })
        .collect();
    let (head_path, tied) = r.head(&mut root, output_head, vocab, hidden, &mut notes)?;
    if conv1d {
        layout::mark_conv1d(&mut root, &blocks);
    }

    let model_type = config.string_opt(&["model_type"])?.unwrap_or_else(|| "not given".into());
    let mut all_notes = checkpoint.notes.clone();
    all_notes.push(format!(
        "generic model: config.json names `{arch}` (model_type `{model_type}`), which vramplan has no \
         importer for. The tree is the checkpoint's {} tensors as stored ({} shard headers), modules \
         named as the checkpoint names them; the sizes are config.json's{}, checked against the tensors; \
         activations follow the generic decoder layer (Llama-style, no family's traits)",
        checkpoint.tensors.len(),
        checkpoint.shards_read,
        if r.prefix.is_empty() { String::new() } else { format!(" (`{}`)", r.prefix.trim_end_matches('.')) }
    ));
    all_notes.extend(notes);
    if guesses.packed_assumed_4bit > 0 {
        all_notes.push(format!(
            "{} packed quantized weights counted as 4-bit values (a generic model's quantization_config is \
             not read)",
            guesses.packed_assumed_4bit
        ));
    }
    let facts = ArchFacts {
        model_type: generic::MODEL_TYPE.into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: mlp.intermediate,
        vocab_size: vocab,
        max_positions: r.sizes.uint_or(POSITIONS, 0)?,
        attention: AttentionKind::Standard,
        norm: layout::norm_kind(&root, &blocks),
        gated_mlp: mlp.gated,
        activation: r.sizes.string_opt(ACTIVATION)?.unwrap_or_else(|| "unknown".into()),
        moe: mlp.moe,
        tie_word_embeddings: tied,
        layers,
        no_split_classes: vec!["Block".into()],
        head: if head_path.is_some() { OutputHead::LanguageModel } else { OutputHead::None },
        vision: None,
    };
    let mut model = ModelDescription {
        custom: false,
        name: origin.to_string(),
        architecture: arch.to_string(),
        naming,
        dtype: from_names::dominant_dtype(checkpoint),
        facts,
        root,
        notes: all_notes,
        quantization: None,
        float_forms: Default::default(),
    };
    if let Some(head) = head_path
        && tied
    {
        let (head_weight, embedding_weight) = (join(&head, "weight"), join(&embedding, "weight"));
        let shape = |path: &str| model.root.tensor(path).map(|t| t.shape.clone());
        if shape(&head_weight) == shape(&embedding_weight) {
            model.tie(&head_weight, &embedding_weight)?;
        }
    }
    summary::validate(&model, origin)?;
    Ok(model)
}

/// The fix of a refusal the generic decoder layer cannot describe.
const CUSTOM: &str = "describe the model in a custom YAML file (docs/custom-models.md)";
/// The fix of a size that disagrees with the tensors.
const MISMATCH: &str = "give the config.json that belongs to this checkpoint";

/// The config being read: the whole, the part holding the sizes (`text_config` where it nests
/// them) and the prefix that part's keys take in errors.
struct Reading<'a> {
    config: &'a HfConfig,
    arch: &'a str,
    sizes: HfConfig,
    prefix: String,
}

/// What the MLPs are: the dense width and gating, and the experts where there are any.
struct Mlp {
    intermediate: u64,
    gated: bool,
    moe: Option<MoeFacts>,
    /// The MoE blocks: experts, one expert's width, gated.
    experts: BTreeMap<String, (u32, u64, bool)>,
}

impl<'a> Reading<'a> {
    fn new(config: &'a HfConfig, arch: &'a str) -> Reading<'a> {
        let (sizes, prefix) = sizes_config(config);
        Reading { config, arch, sizes, prefix }
    }

    /// A refusal at `key`, saying that the class has no importer and what else is wrong.
    fn refuse(&self, key: &str, problem: String, fix: &str) -> InputError {
        InputError::new(self.config.origin(), format!("`{}` has no importer, and {problem}", self.arch))
            .at_key(key)
            .with_fix(fix.to_string())
    }

    /// The key of `keys` the sizes have (else the first), as errors name it.
    fn key(&self, keys: &[&str]) -> String {
        format!("{}{}", self.prefix, first_present(&self.sizes, keys))
    }

    /// The blocks: one list of them, as many as `num_hidden_layers` says.
    fn stack(&self, root: &Module) -> Result<Vec<String>, InputError> {
        let blocks = layout::block_paths(root);
        let lists: BTreeSet<&str> = blocks.iter().map(|b| names::split(b).0).collect();
        if blocks.is_empty() {
            return Err(self.refuse(
                "architectures",
                "its checkpoint has no repeated block list (`layers.N`, `h.N`, `block.N`) to describe as \
                 decoder layers"
                    .into(),
                CUSTOM,
            ));
        }
        if lists.len() > 1 {
            let listed: Vec<String> = lists
                .iter()
                .map(|l| format!("`{l}` ({})", blocks.iter().filter(|b| names::split(b).0 == *l).count()))
                .collect();
            let encoder_decoder =
                lists.iter().any(|l| l.contains("encoder")) && lists.iter().any(|l| l.contains("decoder"));
            let what = if encoder_decoder {
                "an encoder and a decoder"
            } else {
                "several stacks (a vision tower beside a language model, or an encoder)"
            };
            return Err(self.refuse(
                "architectures",
                format!(
                    "its checkpoint has {} block lists, {}: {what}, where the generic model describes one \
                     decoder stack",
                    lists.len(),
                    listed.join(", ")
                ),
                CUSTOM,
            ));
        }
        let layers = self.sizes.positive(LAYERS)?;
        if layers != blocks.len() as u64 {
            return Err(self.refuse(
                &self.key(LAYERS),
                format!(
                    "config.json says {layers} layers where the checkpoint has {} blocks in `{}`",
                    blocks.len(),
                    lists.first().copied().unwrap_or_default()
                ),
                MISMATCH,
            ));
        }
        Ok(blocks)
    }

    /// The token embedding's path and rows, its width the hidden size and its rows the
    /// vocabulary where config.json gives one.
    fn embedding(
        &self,
        root: &Module,
        in_block: &dyn Fn(&str) -> bool,
        head: Option<&str>,
        hidden: u64,
    ) -> Result<(String, u64), InputError> {
        let vocab = self.sizes.opt_positive(VOCAB)?;
        let (path, rows, width) = layout::token_embedding(root, in_block, vocab, head).ok_or_else(|| {
            self.refuse(
                "architectures",
                "its checkpoint has no token embedding (a 2-D `embed…`/`wte`/`word_embeddings` weight \
                 outside the blocks)"
                    .into(),
                CUSTOM,
            )
        })?;
        if width != hidden {
            return Err(self.refuse(
                &self.key(HIDDEN),
                format!("config.json says hidden size {hidden} where `{path}.weight` is [{rows}, {width}]"),
                MISMATCH,
            ));
        }
        if let Some(v) = vocab
            && v != rows
        {
            return Err(self.refuse(
                &self.key(VOCAB),
                format!("config.json says vocabulary {v} where `{path}.weight` has {rows} rows"),
                MISMATCH,
            ));
        }
        Ok((path, rows))
    }

    /// Every block's attention projections, their widths heads × head_dim: the key/value heads,
    /// and whether the weights are stored `[in, out]`.
    fn attention(
        &self,
        root: &Module,
        blocks: &[String],
        hidden: u64,
        heads: u64,
        head_dim: u64,
        notes: &mut Vec<String>,
    ) -> Result<(u64, bool), InputError> {
        let kv_given = self.sizes.opt_positive(KV_HEADS)?;
        let mut kv_heads = None;
        let (mut transposed, mut unchecked) = (false, false);
        for block in blocks {
            let module = root.find(block).expect("a block found in the tree");
            let found = layout::attention(module).ok_or_else(|| {
                self.refuse(
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
            let check = found.check(hidden, heads, head_dim, kv_given).map_err(|(which, problem)| {
                let key = match which {
                    "heads" if self.sizes.get(HEAD_DIM).is_some() => self.key(HEAD_DIM),
                    "heads" => self.key(HEADS),
                    _ => self.key(KV_HEADS),
                };
                self.refuse(&key, problem, MISMATCH)
            })?;
            transposed |= check.transposed;
            unchecked |= check.unchecked;
            match kv_heads {
                Some(k) if k != check.kv_heads => {
                    return Err(self.refuse(
                        &self.key(KV_HEADS),
                        format!(
                            "block `{block}` has {} key/value heads where the first block has {k}",
                            check.kv_heads
                        ),
                        CUSTOM,
                    ));
                }
                _ => kv_heads = Some(check.kv_heads),
            }
        }
        if unchecked {
            notes.push(
                "the attention projections are stored quantized: their widths are not checked against the \
                 heads, whose counts are config.json's"
                    .into(),
            );
        }
        Ok((kv_heads.unwrap_or(heads), transposed))
    }

    /// The dense MLP's width (config.json's, found among the first dense block's matrices; the
    /// tensors' where config.json gives none) and gating, and the experts' counts.
    fn mlp(
        &self,
        root: &Module,
        blocks: &[String],
        hidden: u64,
        notes: &mut Vec<String>,
    ) -> Result<Mlp, InputError> {
        let experts = layout::expert_counts(root, blocks, hidden);
        let dense = blocks.iter().find(|b| !experts.contains_key(b.as_str()));
        let (mut intermediate, mut gated) = (0, false);
        if let Some(first) = dense {
            let module = root.find(first).expect("a block");
            let widths = layout::mlp_widths(module, hidden);
            intermediate = match self.sizes.opt_positive(INTERMEDIATE)? {
                Some(i) if widths.contains(&i) || widths.contains(&(2 * i)) => i,
                Some(i) if widths.is_empty() => {
                    notes.push(format!(
                        "the MLP of `{first}` is stored quantized: config.json's intermediate size {i} is \
                         not checked against it"
                    ));
                    i
                }
                Some(i) => {
                    return Err(self.refuse(
                        &self.key(INTERMEDIATE),
                        format!(
                            "config.json says intermediate size {i} where the MLP weights of `{first}` have \
                             widths {widths:?} besides the hidden size"
                        ),
                        MISMATCH,
                    ));
                }
                None => {
                    let Some(&w) = widths.iter().min() else {
                        return Err(self.refuse(
                            &self.key(INTERMEDIATE),
                            format!("block `{first}` has no MLP weights besides its attention"),
                            CUSTOM,
                        ));
                    };
                    notes.push(format!(
                        "config.json gives no intermediate size; the MLP weights of `{first}` say {w}"
                    ));
                    w
                }
            };
            gated = layout::mlp_gated(module, hidden, intermediate);
        }
        let moe = match experts.values().next() {
            None => None,
            Some(&(count, width, expert_gated)) => {
                if dense.is_none() {
                    gated = expert_gated;
                }
                Some(self.moe(count, width)?)
            }
        };
        Ok(Mlp { intermediate, gated, moe, experts })
    }

    /// The MoE facts: `count` experts of `width` in the checkpoint, config.json's routing.
    fn moe(&self, count: u32, width: u64) -> Result<MoeFacts, InputError> {
        // Quantized experts have no float matrix to measure; config.json's width stands.
        let width = match (width, self.sizes.opt_positive(EXPERT_WIDTH)?) {
            (0, Some(w)) => w,
            (0, None) => {
                return Err(self.refuse(
                    &self.key(EXPERT_WIDTH),
                    "its experts are stored quantized and config.json does not give their width".into(),
                    "add `moe_intermediate_size` to config.json",
                ));
            }
            (w, _) => w,
        };
        if let Some(e) = self.sizes.opt_positive(EXPERTS)?
            && e != u64::from(count)
        {
            return Err(self.refuse(
                &self.key(EXPERTS),
                format!("config.json says {e} experts where the checkpoint's MoE layers have {count}"),
                MISMATCH,
            ));
        }
        let Some(top_k) = self.sizes.opt_positive(TOP_K)? else {
            return Err(self.refuse(
                &self.key(TOP_K),
                format!(
                    "its checkpoint has {count} experts per MoE layer, and config.json does not say how \
                     many each token is routed to"
                ),
                "add `num_experts_per_tok` to config.json",
            ));
        };
        if let Some(w) = self.sizes.opt_positive(EXPERT_WIDTH)?
            && w != width
        {
            return Err(self.refuse(
                &self.key(EXPERT_WIDTH),
                format!("config.json says expert width {w} where the checkpoint's experts have {width}"),
                MISMATCH,
            ));
        }
        let shared = self.sizes.uint_or(SHARED_EXPERTS, 0)?;
        let shared_width = match self.sizes.opt_positive(SHARED_WIDTH)? {
            Some(w) => w,
            None => shared * width,
        };
        Ok(MoeFacts {
            experts: count,
            top_k: u32::try_from(top_k).unwrap_or(u32::MAX),
            expert_intermediate_size: width,
            shared_experts: u32::try_from(if shared == 0 && shared_width > 0 { 1 } else { shared })
                .unwrap_or(u32::MAX),
            shared_intermediate_size: shared_width,
        })
    }

    /// The output head and whether it is tied: as config.json says (absent: tied when the
    /// checkpoint has no head). A causal LM's head the checkpoint leaves out (`save_pretrained`
    /// leaves tied tensors out) is added as `lm_head`, transformers' name for it.
    fn head(
        &self,
        root: &mut Module,
        found: Option<String>,
        vocab: u64,
        hidden: u64,
        notes: &mut Vec<String>,
    ) -> Result<(Option<String>, bool), InputError> {
        let key = ["tie_word_embeddings"];
        let tied = match (self.config.get(&key).is_some(), self.sizes.get(&key).is_some()) {
            (false, false) => found.is_none(),
            _ => self.sizes.bool_or(&key, false)? || self.config.bool_or(&key, false)?,
        };
        let causal_lm = self.arch.ends_with("ForCausalLM") || self.arch.ends_with("LMHeadModel");
        let path = match found {
            Some(path) => path,
            None if causal_lm => {
                let weight = Tensor::parameter("weight", &[vocab, hidden], layout::dominant_of(root));
                root.children.push(Module::new("lm_head", "Linear", ModuleKind::Linear).with_tensor(weight));
                notes.push(if tied {
                    "the checkpoint leaves the tied output head out (as save_pretrained does); `lm_head` \
                     (transformers' name for a causal LM's head) is tied to the token embedding"
                        .to_string()
                } else {
                    "the checkpoint has no output head and config.json does not tie it: `lm_head` is held \
                     untied, as transformers would initialize it"
                        .to_string()
                });
                "lm_head".to_string()
            }
            None => return Ok((None, tied)),
        };
        if let Some(module) = root.find_mut(&path) {
            // `embed_out` reads as an embedding by its name; it is GPT-NeoX's output linear.
            module.kind = ModuleKind::Linear;
            module.class = "Linear".into();
        }
        Ok((Some(path), tied))
    }
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
fn refuse_other_caches(r: &Reading) -> Result<(), InputError> {
    let fix = "describe the model in a custom YAML file (docs/custom-models.md), declaring each block's \
               activations and cache";
    for (prefix, object) in [("", r.config.object()), (r.prefix.as_str(), r.sizes.object())] {
        if let Some(k) = object.keys().find(|k| OTHER_CACHE_PREFIXES.iter().any(|p| k.starts_with(p))) {
            return Err(r.refuse(
                &format!("{prefix}{k}"),
                format!(
                    "config.json's `{k}` belongs to layers that keep a state-space or linear-attention \
                     cache, which the generic decoder layer (attention's K and V) does not describe"
                ),
                fix,
            ));
        }
    }
    if let Some(types) = r.sizes.string_list(&["layer_types"])?
        && let Some(other) = types.iter().find(|t| !ATTENTION_LAYER_TYPES.contains(&t.as_str()))
    {
        let count = types.iter().filter(|t| *t == other).count();
        return Err(r.refuse(
            &format!("{}layer_types", r.prefix),
            format!(
                "config.json's layer_types names {count} `{other}` layers: an unknown cache type (the \
                 generic decoder layer describes {})",
                ATTENTION_LAYER_TYPES.join(" and ")
            ),
            fix,
        ));
    }
    Ok(())
}

/// Each layer's sliding window: `layer_types` with `sliding_window` where the config has them;
/// a window without `layer_types` is not applied (every layer attends to the whole sequence, an
/// upper bound), and a note says so.
fn attention_windows(
    r: &Reading,
    layers: u64,
    notes: &mut Vec<String>,
) -> Result<Vec<Option<u64>>, InputError> {
    let window = r.sizes.opt_positive(&["sliding_window"])?;
    match (r.sizes.string_list(&["layer_types"])?, window) {
        (Some(types), _) if types.len() as u64 != layers => Err(r.refuse(
            &format!("{}layer_types", r.prefix),
            format!("config.json's layer_types lists {} layers where there are {layers}", types.len()),
            "give one entry per layer",
        )),
        (Some(types), Some(w)) => Ok(types.iter().map(|t| (t == "sliding_attention").then_some(w)).collect()),
        (Some(types), None) if types.iter().any(|t| t == "sliding_attention") => Err(r.refuse(
            &format!("{}sliding_window", r.prefix),
            "config.json's layer_types names sliding_attention layers but it gives no sliding_window".into(),
            "add the window's length as `sliding_window`",
        )),
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
