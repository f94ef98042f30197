//! GGUF files as models: llama.cpp's names, each tensor's shape and stored ggml type from the
//! header ([`header`]), and the architectural facts from the metadata llama.cpp reads
//! (`{arch}.block_count`, `{arch}.attention.head_count_kv`, …).
//!
//! What a user may give:
//! - one `.gguf` file;
//! - the first (or any) part of a split file, `NAME-00001-of-00003.gguf`: every part is read
//!   (`split.count` says how many), as `llama-gguf-split` writes them;
//! - a folder holding one model's GGUF (whole or split) and optionally a multimodal projector
//!   (`mmproj*.gguf`, `general.architecture = clip`), whose tensors join the model under
//!   `mmproj.`.
//!
//! The tree keeps llama.cpp's tensor names (`blk.3.attn_q.weight`): the files name nothing
//! else, and llama.cpp plans are written in them. Shapes are given in PyTorch's order (ggml's
//! `ne` reversed: `[out_features, in_features]`), types as [`DType::from_ggml`], so every tensor's
//! bytes are exactly its bytes in the file.

mod header;

use super::{
    ArchFacts, AttentionKind, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind, MoeFacts,
    NormKind, StackKind, Tensor,
};
use crate::{DType, InputError};
use header::{Header, Parse, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What [`describe`] appends to the architecture's name: how later stages tell a model read
/// from a GGUF file ([`is_gguf_model`]).
const ARCHITECTURE_SUFFIX: &str = " (GGUF)";

/// Whether `model` was read from GGUF files (its tensors hold their stored ggml types).
pub fn is_gguf_model(model: &ModelDescription) -> bool {
    model.custom && model.architecture.ends_with(ARCHITECTURE_SUFFIX)
}

/// The files llama.cpp is given for a GGUF model named `name` (a file, a split file's first
/// part, or a folder with a model and its projector): `-m`'s file and `--mmproj`'s, if any.
pub fn launch_files(name: &str) -> Option<(PathBuf, Option<PathBuf>)> {
    let path = Path::new(name);
    if path.is_file() {
        return split_parts(path).into_iter().next().map(|first| (first, None));
    }
    let (models, projector) = folder_files(path).ok()?;
    Some((models.into_iter().next()?, projector))
}

/// Whether a GGUF model has recurrent layers (llama.cpp's `ssm_*` tensors of Mamba and its
/// hybrids, RWKV's `time_mix_*`), whose state is not a KV cache.
pub fn has_recurrent_layers(model: &ModelDescription) -> bool {
    let mut found = false;
    model.root.visit(&mut |m| {
        let name = m.name();
        found |= name.starts_with("ssm_") || name.starts_with("time_mix");
    });
    found
}

/// Whether `path` names a GGUF file by its extension.
pub fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Whether a folder holds GGUF files (and so is read as a GGUF model, not a safetensors one).
pub fn folder_has_gguf(path: &Path) -> bool {
    std::fs::read_dir(path).map(|entries| entries.flatten().any(|e| is_gguf(&e.path()))).unwrap_or(false)
}

/// One parsed file: where it came from and its header.
pub struct GgufFile {
    origin: String,
    header: Header,
}

impl GgufFile {
    /// Parses a header from a reader of `file_len` bytes (where known) that `read_prefix` serves:
    /// called with a length, it returns at least that many bytes from the start of the file (or
    /// the whole file when shorter). The same parse serves a local file and a Hub file read by
    /// ranges.
    pub fn read_with(
        origin: &str,
        file_len: Option<u64>,
        mut read_prefix: impl FnMut(u64) -> Result<Vec<u8>, InputError>,
    ) -> Result<GgufFile, InputError> {
        let mut wanted: u64 = 256 << 10;
        if let Some(len) = file_len {
            wanted = wanted.min(len);
        }
        loop {
            let prefix = read_prefix(wanted)?;
            match header::parse(&prefix, file_len) {
                Ok(Parse::Done(header)) => return Ok(GgufFile { origin: origin.to_string(), header }),
                Ok(Parse::NeedMore(more)) if more > prefix.len() as u64 => wanted = more,
                Ok(Parse::NeedMore(_)) => {
                    return Err(InputError::new(origin, "the file ends inside its GGUF header")
                        .with_fix("the file is truncated: download it again"));
                }
                Err(invalid) => {
                    return Err(InputError::new(
                        origin,
                        format!("not a valid GGUF header (at byte {}): {}", invalid.offset, invalid.problem),
                    )
                    .with_fix("give a GGUF file as llama.cpp's converter or `gguf` writes it; download it again if it is truncated"));
                }
            }
        }
    }

    /// Parses the header of the file at `path`, reading only as much as the header takes.
    pub fn read(path: &Path) -> Result<GgufFile, InputError> {
        let origin = path.display().to_string();
        let (mut file, len) = crate::files::open(path, crate::files::FileKind::Gguf)?;
        let mut buffer = Vec::new();
        GgufFile::read_with(&origin, Some(len), |wanted| {
            let missing = wanted.saturating_sub(buffer.len() as u64);
            (&mut file).take(missing).read_to_end(&mut buffer).map_err(|e| InputError::io(path, &e))?;
            Ok(buffer.clone())
        })
    }

    fn string(&self, key: &str) -> Option<&str> {
        self.header.metadata.get(key).and_then(Value::as_str)
    }

    fn count(&self, key: &str) -> Option<u64> {
        self.header.metadata.get(key).and_then(Value::as_u64)
    }
}

/// The parts of a split file named like `path`, in order, or `path` alone.
fn split_parts(path: &Path) -> Vec<PathBuf> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return vec![path.to_path_buf()] };
    let folder = path.parent().unwrap_or(Path::new(""));
    split_names(name).into_iter().map(|part| folder.join(part)).collect()
}

/// The file names of every part of the split file named `name` (`NAME-00002-of-00003.gguf`:
/// parts 1 to 3, as `llama-gguf-split` names them), or `name` alone.
pub(crate) fn split_names(name: &str) -> Vec<String> {
    let stem = &name[..name.len() - ".gguf".len().min(name.len())];
    // `NAME-00001-of-00003`
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    if let [count, "of", _index, base] = parts.as_slice()
        && let Ok(count) = count.parse::<u32>()
        && (1..=9999).contains(&count)
    {
        return (1..=count).map(|i| format!("{base}-{i:05}-of-{count:05}.gguf")).collect();
    }
    vec![name.to_string()]
}

/// Whether a GGUF file name is a multimodal projector's (`mmproj-…`, llama.cpp's convention).
pub(crate) fn is_projector_name(name: &str) -> bool {
    name.rsplit('/').next().is_some_and(|n| n.to_ascii_lowercase().starts_with("mmproj"))
}

/// A folder's model files (every part of one split model, in order) and its projector.
fn folder_files(path: &Path) -> Result<(Vec<PathBuf>, Option<PathBuf>), InputError> {
    let origin = path.display().to_string();
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| InputError::io(path, &e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| is_gguf(p))
        .collect();
    files.sort();
    let (projectors, models): (Vec<PathBuf>, Vec<PathBuf>) = files
        .into_iter()
        .partition(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(is_projector_name));
    let first = models.first().ok_or_else(|| {
        InputError::new(&origin, "the folder holds an mmproj file but no model GGUF")
            .with_fix("put the model's .gguf file beside its projector")
    })?;
    let parts = split_parts(first);
    if models.len() != parts.len() || !parts.iter().all(|p| models.contains(p)) {
        return Err(InputError::new(
            &origin,
            format!(
                "the folder holds {} model GGUF files that are not the parts of one split model",
                models.len()
            ),
        )
        .with_fix("give the one .gguf file to plan (or a folder with one model and its mmproj)"));
    }
    if projectors.len() > 1 {
        return Err(InputError::new(&origin, format!("the folder holds {} mmproj files", projectors.len()))
            .with_fix("keep the one projector that goes with the model"));
    }
    Ok((parts, projectors.into_iter().next()))
}

/// Loads a GGUF model: a file (every part of a split one) or a folder with the model and
/// optionally its `mmproj` projector.
pub fn load(path: &Path, _options: ImportOptions) -> Result<ModelDescription, InputError> {
    let origin = path.display().to_string();
    let (model_files, projector) =
        if path.is_dir() { folder_files(path)? } else { (split_parts(path), None) };
    let mut files = Vec::with_capacity(model_files.len());
    for part in &model_files {
        // A part that is there but is no file (a FIFO, a folder) is refused by `GgufFile::read`.
        if !part.exists() {
            return Err(InputError::new(
                part.display().to_string(),
                "a part of the split GGUF file is missing",
            )
            .with_fix("download every part (`*-0000N-of-0000M.gguf`) into the same folder"));
        }
        files.push(GgufFile::read(part)?);
    }
    let projector = projector.as_deref().map(GgufFile::read).transpose()?;
    describe(&origin, &files, projector.as_ref())
}

/// The description of a model made of `parts` (one file, or every part of a split one, in
/// order) and an optional projector file.
pub fn describe(
    origin: &str,
    parts: &[GgufFile],
    projector: Option<&GgufFile>,
) -> Result<ModelDescription, InputError> {
    let Some(first) = parts.first() else {
        return Err(InputError::new(origin, "no GGUF file to read"));
    };
    if let Some(count) = first.count("split.count")
        && count != parts.len() as u64
    {
        return Err(InputError::new(
            &first.origin,
            format!("the file says it is split in {count} parts, but {} were read", parts.len()),
        )
        .at_key("split.count")
        .with_fix("give the first part of the split file, with every part in the same folder"));
    }
    let arch = first.string("general.architecture").ok_or_else(|| {
        InputError::new(&first.origin, "the GGUF metadata has no `general.architecture`")
            .at_key("general.architecture")
            .with_fix("give a model file written by llama.cpp's converter (it always sets the architecture)")
    })?;
    let mut tree = Tree::default();
    for part in parts {
        for tensor in &part.header.tensors {
            tree.add("", tensor);
        }
    }
    if let Some(projector) = projector {
        for tensor in &projector.header.tensors {
            tree.add("mmproj", tensor);
        }
    }
    // A projector's own tower (`v.blk.N`) is the model's stack only when it is read alone.
    let (key_prefix, block_list) = if arch == "clip" { ("clip.vision", "v.blk") } else { (arch, "blk") };
    let root = tree.build("", "", block_list);
    let facts = facts(first, key_prefix, block_list, &root)?;
    let mut notes = vec![format!(
        "read from GGUF (version {}, architecture `{arch}`): llama.cpp's tensor names and stored types",
        first.header.version
    )];
    let mut types: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    root.visit(&mut |m| {
        for t in &m.tensors {
            let entry = types.entry(t.dtype.name()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.saturating_add(t.bytes());
        }
    });
    let mut by_bytes: Vec<(&str, (usize, u64))> = types.into_iter().collect();
    by_bytes.sort_by_key(|(name, (_, bytes))| (std::cmp::Reverse(*bytes), *name));
    let listed: Vec<String> = by_bytes
        .iter()
        .map(|(name, (count, bytes))| format!("{name} ×{count} ({})", crate::units::format_bytes(*bytes)))
        .collect();
    notes.push(format!("tensor types, by bytes: {}", listed.join(", ")));
    if let Some(projector) = projector {
        notes.push(format!(
            "with the multimodal projector `{}` ({} tensors, under `mmproj.`)",
            projector.origin,
            projector.header.tensors.len()
        ));
    }
    let dtype = root
        .find("token_embd")
        .and_then(|m| m.tensors.first())
        .map(|t| t.dtype)
        .filter(|d| d.is_float())
        .unwrap_or(DType::F16);
    let model = ModelDescription {
        name: origin.to_string(),
        architecture: format!("{arch}{ARCHITECTURE_SUFFIX}"),
        custom: true,
        naming: Default::default(),
        dtype,
        facts,
        root,
        notes,
        quantization: None,
        float_forms: Default::default(),
    };
    super::summary::validate(&model, origin)?;
    Ok(model)
}

/// The module tree as the names split it.
#[derive(Default)]
struct Tree {
    tensors: Vec<Tensor>,
    children: BTreeMap<String, Tree>,
    /// Insertion order of children (llama.cpp's order is the file's).
    order: Vec<String>,
}

impl Tree {
    fn add(&mut self, prefix: &str, info: &header::TensorInfo) {
        let full = if prefix.is_empty() { info.name.clone() } else { format!("{prefix}.{}", info.name) };
        let (module, name) = full.rsplit_once('.').unwrap_or(("", full.as_str()));
        let mut node = self;
        if !module.is_empty() {
            for component in module.split('.') {
                if !node.children.contains_key(component) {
                    node.order.push(component.to_string());
                }
                node = node.children.entry(component.to_string()).or_default();
            }
        }
        let shape: Vec<u64> = info.dims.iter().rev().copied().collect();
        node.tensors.push(Tensor::fixed_parameter(name, &shape, DType::from_ggml(info.ggml_type)));
    }

    /// The module at `path` (last component `name`); the items of the list at `block_list` are
    /// the blocks.
    fn build(mut self, path: &str, name: &str, block_list: &str) -> Module {
        let is_list = !self.order.is_empty()
            && self.tensors.is_empty()
            && self.order.iter().all(|c| c.bytes().all(|b| b.is_ascii_digit()));
        let mut order = std::mem::take(&mut self.order);
        if is_list {
            order.sort_by_key(|c| c.parse::<u64>().unwrap_or(u64::MAX));
        }
        let leaf = order.is_empty();
        let children: Vec<Module> = order
            .into_iter()
            .filter_map(|c| {
                let node = self.children.remove(&c)?;
                let child_path = super::join(path, &c);
                Some(node.build(&child_path, &c, block_list))
            })
            .collect();
        let in_block_list = path.rsplit_once('.').is_some_and(|(list, _)| list == block_list);
        let (class, kind) = if in_block_list {
            ("GGUFBlock", ModuleKind::Block)
        } else if is_list {
            ("ModuleList", ModuleKind::Container)
        } else if leaf {
            leaf_kind(name, &self.tensors)
        } else {
            ("Module", ModuleKind::Container)
        };
        Module { tensors: self.tensors, children, ..Module::new(path, class, kind) }
    }
}

fn leaf_kind(name: &str, tensors: &[Tensor]) -> (&'static str, ModuleKind) {
    let weight = tensors.iter().find(|t| t.name == "weight");
    let rank = weight.map_or(0, |w| w.shape.len());
    if name.ends_with("_exps") && rank == 3 {
        let count = weight.map_or(0, |w| w.shape[0]);
        return ("GGUFExperts", ModuleKind::Experts { count: u32::try_from(count).unwrap_or(u32::MAX) });
    }
    if name == "ffn_gate_inp" {
        return ("Linear", ModuleKind::Router);
    }
    if rank == 2 && (name == "token_embd" || name.ends_with("_embd") && !name.contains("patch")) {
        return ("Embedding", ModuleKind::Embedding);
    }
    if rank == 2 {
        return ("Linear", ModuleKind::Linear);
    }
    if rank == 1 && (name.contains("norm") || name.starts_with("ln")) {
        return ("Norm", ModuleKind::Norm);
    }
    ("Module", ModuleKind::Other)
}

/// The facts llama.cpp reads from the metadata (`llm_load_hparams`), with the tree's shapes
/// where the metadata is silent.
fn facts(
    file: &GgufFile,
    key_prefix: &str,
    block_list: &str,
    root: &Module,
) -> Result<ArchFacts, InputError> {
    let arch = file.string("general.architecture").unwrap_or(key_prefix);
    let key = |suffix: &str| format!("{key_prefix}.{suffix}");
    let required = |suffix: &str| -> Result<u64, InputError> {
        file.count(&key(suffix)).filter(|&n| n > 0).ok_or_else(|| {
            InputError::new(&file.origin, format!("the GGUF metadata has no positive `{}`", key(suffix)))
                .at_key(key(suffix))
                .with_fix("give a model file written by llama.cpp's converter, which sets it")
        })
    };
    let blocks: Vec<&Module> = root.find(block_list).map(|b| b.children.iter().collect()).unwrap_or_default();
    let block_count = required("block_count")?;
    if block_count != blocks.len() as u64 {
        return Err(InputError::new(
            &file.origin,
            format!(
                "`{}` is {block_count} but the file has {} `blk.N` blocks",
                key("block_count"),
                blocks.len()
            ),
        )
        .at_key(key("block_count"))
        .with_fix("the file is inconsistent: convert the model again"));
    }
    let hidden = required("embedding_length")?;
    // A recurrent model (Mamba: `head_count` 0) has no attention heads; `inspect` still shows its
    // tensors, and the engines refuse to size it (`has_recurrent_layers`).
    let mut recurrent = false;
    root.visit(&mut |m| recurrent |= m.name().starts_with("ssm_") || m.name().starts_with("time_mix"));
    let heads = if recurrent {
        file.count(&key("attention.head_count")).unwrap_or(0).max(1)
    } else {
        required("attention.head_count")?
    };
    let kv_heads = file.count(&key("attention.head_count_kv")).filter(|&n| n > 0).unwrap_or(heads);
    let head_dim = file.count(&key("attention.key_length")).unwrap_or(hidden / heads);
    let vocab = root
        .find("token_embd")
        .and_then(|m| m.tensors.first())
        .and_then(|t| t.shape.first().copied())
        .or_else(|| match file.header.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array { len, .. }) => Some(*len),
            _ => None,
        })
        .unwrap_or(0);
    let experts = file.count(&key("expert_count")).filter(|&n| n > 0);
    let layers: Vec<LayerFacts> = blocks
        .iter()
        .map(|b| LayerFacts {
            path: b.path.clone(),
            stack: if arch == "clip" { StackKind::Encoder } else { StackKind::Decoder },
            moe: b.find(&format!("{}.ffn_gate_inp", b.path)).is_some(),
            attention_window: None,
            cross_attention: false,
            ssm: None,
        })
        .collect();
    let moe = experts.map(|count| MoeFacts {
        experts: u32::try_from(count).unwrap_or(u32::MAX),
        top_k: file.count(&key("expert_used_count")).map_or(1, |k| u32::try_from(k).unwrap_or(u32::MAX)),
        expert_intermediate_size: file.count(&key("expert_feed_forward_length")).unwrap_or(0),
        shared_experts: file.count(&key("expert_shared_count")).map_or(0, |k| u32::try_from(k).unwrap_or(0)),
        shared_intermediate_size: 0,
    });
    let attention = match file.count(&key("attention.kv_lora_rank")) {
        Some(kv_lora_rank) if kv_lora_rank > 0 => {
            let rope = file.count(&key("rope.dimension_count")).unwrap_or(0);
            AttentionKind::MultiLatent {
                q_lora_rank: file.count(&key("attention.q_lora_rank")).filter(|&n| n > 0),
                kv_lora_rank,
                qk_nope_head_dim: head_dim.saturating_sub(rope),
                qk_rope_head_dim: rope,
                v_head_dim: file.count(&key("attention.value_length")).unwrap_or(head_dim),
            }
        }
        _ => AttentionKind::Standard,
    };
    let gated = blocks.iter().any(|b| b.find(&format!("{}.ffn_gate", b.path)).is_some())
        || blocks.iter().any(|b| b.find(&format!("{}.ffn_gate_exps", b.path)).is_some());
    Ok(ArchFacts {
        model_type: arch.to_string(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: file.count(&key("feed_forward_length")).unwrap_or(0),
        vocab_size: vocab,
        max_positions: file.count(&key("context_length")).unwrap_or(0),
        attention,
        norm: if file.header.metadata.contains_key(&key("attention.layer_norm_rms_epsilon")) {
            NormKind::RmsNorm
        } else {
            NormKind::LayerNorm
        },
        gated_mlp: gated,
        activation: "unknown".into(),
        moe,
        tie_word_embeddings: root.find("output").is_none(),
        layers,
        no_split_classes: vec!["GGUFBlock".into()],
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    })
}
