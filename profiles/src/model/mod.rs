//! Model descriptions: one internal form for every source.
//!
//! A [`ModelDescription`] is a tree of [`Module`]s whose paths are exactly the module names
//! PyTorch/transformers gives (`model.layers.17.self_attn.q_proj`), each holding its own
//! [`Tensor`]s (parameters, quantization constants and buffers, with shapes and dtypes), plus the
//! architectural [`ArchFacts`] later stages need (layers, heads, experts, …).
//!
//! Sources, each in its own module:
//! - [`hf`]: a HF `config.json`, one importer per architecture family;
//! - [`safetensors`]: checkpoint headers (never the data), alone or overlaid on a config;
//! - [`custom`]: a YAML description for models not on the list, optionally extending a config;
//! - [`gguf`]: GGUF files (llama.cpp's names and stored ggml types, from the header);
//! - [`catalog`]: built-in models, embedded published configs.
//!
//! [`load`] picks the source from what the user typed.
//!
//! Invariants: paths are unique; a tensor's path is its module's path, a dot, and its name; a
//! tied tensor (`tied_to`) names a tensor that exists and is not itself tied; parameter counts
//! are logical (a packed int32 GPTQ word counts 8 parameters) and count each tied group once.

mod build;
pub mod catalog;
pub mod custom;
pub mod generic;
pub mod gguf;
pub mod hf;
mod hub;
pub mod quantization;
pub mod safetensors;
pub mod ssm;
mod summary;
mod tree;
pub mod vision;

pub use build::Builder;
pub use quantization::Quantization;
pub use summary::{LayerKindSummary, ModuleSummary, PlacementUnit, Summary};
pub use tree::{FloatForm, Module, ModuleKind, Tensor, TensorKind, join};

use crate::{DType, InputError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Module naming scheme: transformers 5.x (default; fused MoE experts `mlp.experts.gate_up_proj`)
/// or 4.x (`block_sparse_moe.experts.3.w1`), which most checkpoints also use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Naming {
    /// transformers 5.x names: routed experts fused into 3-D parameters
    /// (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`). The default.
    #[default]
    V5,
    /// transformers 4.x names: one module per routed expert (`block_sparse_moe.experts.3.w1`), as
    /// most published checkpoints store them.
    V4,
}

/// Options for building a description.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportOptions {
    /// Which transformers version's module names to build (`--naming`).
    pub naming: Naming,
}

/// How a layer's attention is computed, as far as memory is concerned.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum AttentionKind {
    /// Multi-head, grouped-query or multi-query attention (see `num_kv_heads`).
    Standard,
    /// DeepSeek's multi-head latent attention: the KV cache holds the compressed latent and the
    /// rotary key, `kv_lora_rank + qk_rope_head_dim` values per token and layer.
    MultiLatent {
        /// `q_lora_rank` from config.json: width of the compressed query (`q_a_proj`); `None`
        /// when queries are projected directly (`q_proj`, as in DeepSeek-V2-Lite).
        q_lora_rank: Option<u64>,
        /// `kv_lora_rank` from config.json: width of the compressed key/value latent that the KV
        /// cache holds.
        kv_lora_rank: u64,
        /// `qk_nope_head_dim` from config.json: the per-head query/key dimensions without rotary
        /// embedding.
        qk_nope_head_dim: u64,
        /// `qk_rope_head_dim` from config.json: the per-head query/key dimensions with rotary
        /// embedding; the rotary key is cached alongside the latent.
        qk_rope_head_dim: u64,
        /// `v_head_dim` from config.json: the per-head value dimension.
        v_head_dim: u64,
    },
}

/// The normalization layers a model uses; it decides what a norm keeps for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `nn.LayerNorm`: mean and variance, weight and usually bias (GPT-2, BERT, OPT, Falcon).
    LayerNorm,
    /// RMSNorm (`LlamaRMSNorm`, T5's `T5LayerNorm`): root mean square only, weight only.
    RmsNorm,
}

/// Which stack a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StackKind {
    /// An encoder stack: BERT's `encoder.layer.N`, T5's `encoder.block.N`.
    Encoder,
    /// A decoder stack: every block of a decoder-only model, T5's `decoder.block.N`.
    Decoder,
    /// A vision tower's blocks (`model.visual.blocks.N`), which run on image patches before the
    /// language model ([`ArchFacts::vision`]).
    Vision,
}

/// One transformer block of the model, in execution order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerFacts {
    /// The block's module path (`model.layers.3`, `encoder.block.0`).
    pub path: String,
    /// Which stack the block belongs to (encoder or decoder).
    pub stack: StackKind,
    /// The MLP is a mixture of experts.
    pub moe: bool,
    /// Sliding-window attention span, `None` for full attention.
    pub attention_window: Option<u64>,
    /// The block also attends to the encoder's output (T5 decoder).
    pub cross_attention: bool,
    /// The block's state-space (Mamba-2) mixer, beside or in place of attention (Falcon-H1);
    /// `None` for a block without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssm: Option<ssm::SsmFacts>,
}

/// Mixture-of-experts facts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeFacts {
    /// Routed experts per MoE layer.
    pub experts: u32,
    /// Experts each token is routed to.
    pub top_k: u32,
    /// Intermediate size of one routed expert.
    pub expert_intermediate_size: u64,
    /// Shared (always active) experts per MoE layer.
    pub shared_experts: u32,
    /// Intermediate size of all shared experts together (0 when none).
    pub shared_intermediate_size: u64,
}

/// The architectural facts later stages need, beyond the tensors themselves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArchFacts {
    /// HF `model_type` (`llama`, `mixtral`, …) or `custom`.
    pub model_type: String,
    /// `hidden_size` from config.json (`n_embd`, `d_model` in some families): the width of the
    /// residual stream.
    pub hidden_size: u64,
    /// `num_attention_heads` from config.json (`n_head`, `num_heads` in some families): query
    /// heads per attention layer.
    pub num_attention_heads: u64,
    /// Key/value heads per attention layer: `num_key_value_heads` from config.json, equal to
    /// `num_attention_heads` for multi-head attention, 1 for multi-query attention.
    pub num_kv_heads: u64,
    /// Dimension of one attention head: `head_dim` from config.json, else
    /// `hidden_size / num_attention_heads`; for multi-latent attention the query/key head
    /// (`qk_nope_head_dim + qk_rope_head_dim`).
    pub head_dim: u64,
    /// Intermediate size of the dense MLP (0 when every layer is MoE and no dense size is given).
    pub intermediate_size: u64,
    /// `vocab_size` from config.json: rows of the token embedding (0 when a custom model has
    /// none).
    pub vocab_size: u64,
    /// The longest sequence the model takes, in tokens: `max_position_embeddings` from
    /// config.json (`n_positions`, `seq_length` in some families), the trained length for
    /// relative-position models; 0 when unknown.
    pub max_positions: u64,
    /// How attention is computed, which sets the KV cache's size per token.
    pub attention: AttentionKind,
    /// The kind of normalization layers the blocks use.
    pub norm: NormKind,
    /// Gated MLP (SwiGLU / GeGLU: gate, up, down) rather than two projections.
    pub gated_mlp: bool,
    /// The MLP's activation function as config.json names it (`hidden_act`: `silu`,
    /// `gelu_new`); `unknown` where the source does not say.
    pub activation: String,
    /// Mixture-of-experts sizes; `None` for a dense model.
    pub moe: Option<MoeFacts>,
    /// `tie_word_embeddings` from config.json: the output head (`lm_head.weight`) shares the
    /// input embedding's tensor.
    pub tie_word_embeddings: bool,
    /// Every block, in execution order.
    pub layers: Vec<LayerFacts>,
    /// Module classes accelerate must not split across devices (`_no_split_modules`).
    pub no_split_classes: Vec<String>,
    /// What the output head produces for the loss to read: vocabulary logits, a task head's
    /// logits, or nothing (a base model). The simulator charges the logits and loss by it.
    pub head: OutputHead,
    /// A vision-language model's vision tower (its blocks are the [`StackKind::Vision`]
    /// layers); `None` for a text model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<vision::VisionFacts>,
}

/// What a model's output head produces per step, which sets the logits and loss a training
/// step holds (docs/memory-model.md, "Logits and loss").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum OutputHead {
    /// Logits over the vocabulary for every token (`…ForCausalLM`, `GPT2LMHeadModel`,
    /// `BertForMaskedLM`, `T5ForConditionalGeneration`, `XLNetLMHeadModel`).
    #[default]
    LanguageModel,
    /// `labels` logits per sequence, from one pooled or last token
    /// (`…ForSequenceClassification`).
    SequenceClassification {
        /// Classes (`num_labels`, or the length of `id2label`).
        labels: u64,
    },
    /// `labels` logits per token (`…ForTokenClassification`).
    TokenClassification {
        /// Classes per token.
        labels: u64,
    },
    /// Span start and end logits per token from one linear (`qa_outputs`,
    /// `…ForQuestionAnswering`, `XLNetForQuestionAnsweringSimple`).
    QuestionAnswering {
        /// Outputs per token: 2 (start, end), or `num_labels` where the class uses it.
        outputs: u64,
    },
    /// XLNet's beam-search question-answering head (`XLNetForQuestionAnswering`): start logits,
    /// end logits conditioned on the start (in evaluation, for each of the `start_top` best
    /// starts), and the answer class.
    XlnetBeam {
        /// `start_n_top` from config.json (5): the starts evaluation expands.
        start_top: u64,
    },
    /// No head: the base model's hidden states (`LlamaModel`, `BertModel`, `T5EncoderModel`).
    None,
}

/// A model: its module tree and facts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelDescription {
    /// What the user named (`mixtral-8x7b`, a path).
    pub name: String,
    /// The top-level class (`MixtralForCausalLM`).
    pub architecture: String,
    /// Built from a custom-model YAML: its classes are the user's own, and no transformers class
    /// loads it (`from_pretrained` of `architecture` would not make this model).
    #[serde(skip)]
    pub custom: bool,
    /// The transformers naming its module paths follow.
    pub naming: Naming,
    /// The checkpoint's (or config's `torch_dtype`) dtype of floating-point parameters.
    pub dtype: DType,
    /// Architectural facts (sizes, heads, experts, blocks) beyond the tensors themselves.
    pub facts: ArchFacts,
    /// The module tree; its root has the empty path.
    pub root: Module,
    /// Disagreements found while building (config vs checkpoint headers, unusual values).
    pub notes: Vec<String>,
    /// The checkpoint's `quantization_config`, read; `None` for an unquantized checkpoint. Its
    /// quantized weights are in the tree as the runtime holds them where it keeps the
    /// quantization ([`quantization::held`] says where it does not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// Every weight stored quantized, by its full path (`…q_proj.qweight`, `…experts.
    /// gate_up_proj_blocks`): the floating-point parameter it stands for, which
    /// [`ModelDescription::dequantized`] restores.
    #[serde(skip)]
    pub float_forms: BTreeMap<String, FloatForm>,
}

impl ModelDescription {
    /// Logical parameter count, each tied group once.
    pub fn params(&self) -> u64 {
        self.root.params()
    }

    /// Bytes in memory as stored: every parameter, quantization constant and buffer, each tied
    /// group once.
    pub fn bytes(&self) -> u64 {
        self.root.bytes()
    }

    /// Every tensor with its full path, in tree order.
    pub fn tensors(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::new();
        self.root.visit(&mut |module| {
            for tensor in &module.tensors {
                out.push((tree::join(&module.path, &tensor.name), tensor));
            }
        });
        out
    }

    /// Whether `path` names a module or a tensor of the model.
    pub fn has_path(&self, path: &str) -> bool {
        self.root.find(path).is_some() || self.root.tensor(path).is_some()
    }

    /// A learned table of absolute positions, where the model has one: the embedding outside
    /// the blocks whose rows are the model's positions (GPT-2's `wpe`, BERT's
    /// `position_embeddings`, OPT's `embed_positions` with its offset of 2, a custom model's
    /// own), and the longest sequence it indexes. Past it the embedding raises `IndexError:
    /// index out of range in self`: a hard limit, unlike rotary or relative positions (XLNet,
    /// T5, BLOOM's ALiBi), which only degrade.
    pub fn learned_positions(&self) -> Option<(String, u64)> {
        let positions = self.facts.max_positions;
        if positions == 0 {
            return None;
        }
        let in_block = |path: &str| {
            self.facts.layers.iter().any(|l| path.strip_prefix(&l.path).is_some_and(|r| r.starts_with('.')))
        };
        let mut found = None;
        self.root.visit(&mut |m| {
            if found.is_some() || m.kind != ModuleKind::Embedding || in_block(&m.path) {
                return;
            }
            let rows = m.tensors.iter().find(|t| t.name == "weight").and_then(|t| t.shape.first().copied());
            if let Some(rows) = rows
                && rows != self.facts.vocab_size
                && (rows == positions || rows == positions + 2)
            {
                found = Some((m.path.clone(), positions));
            }
        });
        found
    }

    /// Groups of parameter paths that share one storage (the canonical path first), sorted.
    pub fn tied_groups(&self) -> Vec<Vec<String>> {
        let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (path, tensor) in self.tensors() {
            if let Some(target) = &tensor.tied_to {
                groups.entry(target.clone()).or_default().push(path);
            }
        }
        groups
            .into_iter()
            .map(|(canonical, mut others)| {
                others.sort();
                others.insert(0, canonical);
                others
            })
            .collect()
    }

    /// The same model loaded in `dtype` (`from_pretrained(dtype=...)`, vLLM's `--dtype`): the
    /// parts left unquantized are held in `dtype`; quantized weights (fp8, MXFP4 blocks, packed
    /// GPTQ/AWQ/bitsandbytes words) and their constants keep their stored types, as both
    /// runtimes keep them. As in transformers, only tensors created in the default dtype follow
    /// ([`Tensor::takes_load_dtype`]: parameters and some buffers); the others keep their types
    /// (float32 rotary frequencies, XLNet's `torch.FloatTensor` parameters).
    pub fn cast(&self, dtype: DType) -> ModelDescription {
        let mut out = self.clone();
        out.dtype = dtype;
        out.root.visit_mut(&mut |module| {
            for tensor in &mut module.tensors {
                if tensor.takes_load_dtype() {
                    tensor.dtype = dtype;
                }
            }
        });
        out
    }

    /// The same model without its quantization, loaded in `dtype`: every quantized weight back
    /// to the floating-point parameter it stands for, the quantizers' modules back to the classes
    /// they replaced and their constants gone, then [`ModelDescription::cast`]. This is what
    /// transformers builds from the config with `quantization_config` removed.
    pub fn dequantized(&self, dtype: DType) -> ModelDescription {
        quantization::dequantize_weights(self, dtype).cast(dtype)
    }

    /// Ties `tensor_path` to `canonical_path` (both full tensor paths): to the tensor that
    /// `canonical_path` is itself tied to, if it is, so that every group has one tensor that
    /// holds the memory. Fails if either is missing (an importer cannot tie a name it did not
    /// build), and for a tie of a tensor to itself or one that closes a cycle, in which no
    /// tensor of the group would hold its memory.
    pub fn tie(&mut self, tensor_path: &str, canonical_path: &str) -> Result<(), InputError> {
        let refuse = |problem: String| InputError::new(&self.name, problem);
        if self.root.tensor(canonical_path).is_none() || self.root.tensor(tensor_path).is_none() {
            return Err(refuse(format!("cannot tie `{tensor_path}` to `{canonical_path}`: no such tensor")));
        }
        // Follow `canonical_path`'s own ties to the tensor that holds the group's memory.
        let mut holder = canonical_path.to_string();
        let mut seen = vec![holder.clone()];
        loop {
            if holder == tensor_path {
                let problem = if canonical_path == tensor_path {
                    format!("`{tensor_path}` is tied to itself")
                } else {
                    format!(
                        "tying `{tensor_path}` to `{canonical_path}` closes a cycle of ties ({})",
                        seen.join(" → ")
                    )
                };
                return Err(refuse(problem + ": no tensor of the group would hold its memory").with_fix(
                    "tie each tensor to the one that holds the weights, which is tied to nothing",
                ));
            }
            match self.root.tensor(&holder).and_then(|t| t.tied_to.clone()) {
                Some(next) if !seen.contains(&next) => {
                    seen.push(next.clone());
                    holder = next;
                }
                Some(next) => {
                    return Err(refuse(format!("the ties through `{next}` form a cycle")).with_fix(
                        "tie each tensor to the one that holds the weights, which is tied to nothing",
                    ));
                }
                None => break,
            }
        }
        if let Some(tensor) = self.root.tensor_mut(tensor_path) {
            tensor.tied_to = Some(holder.clone());
        }
        // Tensors tied to `tensor_path` follow it to the holder: no tie names a tied tensor.
        self.root.visit_mut(&mut |module| {
            for t in &mut module.tensors {
                if t.tied_to.as_deref() == Some(tensor_path) {
                    t.tied_to = Some(holder.clone());
                }
            }
        });
        Ok(())
    }

    /// A vision-language model's image processor settings from its `preprocessor_config.json`
    /// (`text`, read from `origin`); nothing for a model without a vision tower.
    pub(crate) fn read_processor_config(&mut self, text: &str, origin: &str) -> Result<(), InputError> {
        match &mut self.facts.vision {
            Some(vision) => vision.read_processor_config(text, origin),
            None => Ok(()),
        }
    }

    /// The image processor's settings where the model came with them (`processor`: the text
    /// and where it was read), else a note that the class's defaults stand in (they can count
    /// several times fewer tokens an image than a checkpoint's own settings); nothing for a
    /// model without a vision tower.
    pub(crate) fn apply_processor(&mut self, processor: Option<(&str, &str)>) -> Result<(), InputError> {
        let Some(vision) = &self.facts.vision else { return Ok(()) };
        match processor {
            Some((text, origin)) => self.read_processor_config(text, origin),
            None => {
                let note = format!(
                    "no {}: the image processor's class defaults count the images' tokens \
                     ({}); a checkpoint's own settings can differ",
                    vision::PREPROCESSOR_FILE,
                    vision.processor_settings()
                );
                self.notes.push(note);
                Ok(())
            }
        }
    }

    /// [`ModelDescription::apply_processor`] with the `preprocessor_config.json` in `folder`,
    /// if there is one.
    pub(crate) fn apply_processor_beside(&mut self, folder: &Path) -> Result<(), InputError> {
        if self.facts.vision.is_none() {
            return Ok(());
        }
        let path = folder.join(vision::PREPROCESSOR_FILE);
        if !path.is_file() {
            return self.apply_processor(None);
        }
        let text = crate::files::read_text(&path, crate::files::FileKind::ModelJson)?;
        self.apply_processor(Some((&text, &path.display().to_string())))
    }

    /// [`ModelDescription::apply_processor`] with built-in `name`'s embedded one.
    pub(crate) fn apply_builtin_processor(&mut self, name: &str) -> Result<(), InputError> {
        let origin = format!("{name} ({})", vision::PREPROCESSOR_FILE);
        self.apply_processor(catalog::builtin_preprocessor(name).map(|text| (text, origin.as_str())))
    }

    /// The summary `vramplan inspect` prints.
    pub fn summary(&self) -> Summary {
        Summary::of(self)
    }
}

/// The `config.json` text of the model `spec` names, as transformers would read it: a built-in's
/// embedded one, a config file, a folder's `config.json`, or a Hub repository's (from the shared
/// cache, fetched if needed); `None` for a model without one (a custom YAML, a GGUF file).
pub fn config_text(spec: &str) -> Result<Option<String>, InputError> {
    if let Some(text) = catalog::builtin_config(spec) {
        return Ok(Some(text.to_string()));
    }
    let path = Path::new(spec);
    let file = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
    if file.is_file() {
        if file.extension().and_then(|e| e.to_str()) != Some("json") {
            return Ok(None);
        }
        return crate::files::read_text(&file, crate::files::FileKind::ModelJson).map(Some);
    }
    if path.exists() {
        return Ok(None);
    }
    let Some(id) = vramplan_hub::HubId::parse(spec) else { return Ok(None) };
    let id = id.map_err(|e| hub::input_error(spec, &e))?;
    match hub::config_path(&id, spec)? {
        Some(path) => crate::files::read_text(&path, crate::files::FileKind::ModelJson).map(Some),
        None => Ok(None),
    }
}

/// Loads a model from what the user typed: a built-in name, a `config.json`, a model folder
/// (config and/or safetensors), a custom-model YAML file, or a Hugging Face Hub id
/// (`org/name`, `org/name@revision`: not a path that exists, see [`hub`]).
pub fn load(spec: &str, options: ImportOptions) -> Result<ModelDescription, InputError> {
    if let Some(text) = catalog::builtin_config(spec) {
        let mut model = hf::from_config_text(text, spec, options)?;
        model.apply_builtin_processor(spec)?;
        return Ok(model);
    }
    let path = Path::new(spec);
    if (path.is_file() && gguf::is_gguf(path)) || (path.is_dir() && gguf::folder_has_gguf(path)) {
        return gguf::load(path, options);
    }
    if path.is_dir() {
        return safetensors::load_folder(path, options);
    }
    if path.is_file() {
        let lower = spec.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            return custom::load_file(path, options);
        }
        let mut model = hf::from_config_file(path, options)?;
        model.apply_processor_beside(path.parent().unwrap_or(Path::new(".")))?;
        return Ok(model);
    }
    if path.exists() {
        // Neither a file nor a folder (a FIFO, a device): refused by name, never opened.
        use crate::files::FileKind;
        let kind = if spec.to_ascii_lowercase().ends_with(".json") {
            FileKind::ModelJson
        } else {
            FileKind::CustomModel
        };
        crate::files::check_regular(path, kind)?;
    }
    // A Hub id's name part (`meta-llama/Llama-2-7B@main` → `llama-2-7b`) is also compared.
    let hub_name =
        spec.split('@').next().and_then(|r| r.rsplit('/').next()).unwrap_or(spec).to_ascii_lowercase();
    let close: Vec<&str> = catalog::builtin_names()
        .iter()
        .copied()
        .filter(|name| {
            name.contains(spec) || spec.contains(name) || (spec.contains('/') && hub_name == *name)
        })
        .collect();
    let lower = spec.to_ascii_lowercase();
    let names_a_file = [".json", ".yaml", ".yml", ".safetensors", ".gguf"].iter().any(|e| lower.ends_with(e));
    // `org/name:Q4_K_M`: a GGUF file of a Hub repository, as llama.cpp's `-hf` names one.
    if let Some((repo, tag)) = spec.rsplit_once(':')
        && !names_a_file
        && let Some(id) = vramplan_hub::HubId::parse(repo)
    {
        let id = id.map_err(|e| hub::input_error(spec, &e))?;
        return hub::load_gguf(&id, tag, spec);
    }
    if !names_a_file && let Some(id) = vramplan_hub::HubId::parse(spec) {
        let loaded = id.map_err(|e| hub::input_error(spec, &e)).and_then(|id| hub::load(&id, spec, options));
        return match loaded {
            Err(e) if !close.is_empty() => Err(e.with_fix(format!("did you mean {}?", close.join(" or ")))),
            loaded => loaded,
        };
    }
    let mut err = InputError::new(spec, "not a built-in model, a file or a folder");
    err = if close.is_empty() {
        err.with_fix(format!(
            "give a config.json, a model folder, a custom YAML, or one of: {}",
            catalog::builtin_names().join(", ")
        ))
    } else {
        err.with_fix(format!("did you mean {}?", close.join(" or ")))
    };
    Err(err)
}
