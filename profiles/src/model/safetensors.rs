//! Model folders: `config.json` and/or safetensors checkpoints, of which only the headers are
//! read (tensor names, dtypes and shapes), never the tensor data.
//!
//! - With a `config.json`, the description is built from the config (in the checkpoint's module
//!   naming: MoE checkpoints mostly use transformers 4.x names) and the checkpoint is laid over
//!   it: each tensor's stored dtype and shape, quantized weights (GPTQ/AWQ `qweight`,
//!   bitsandbytes 4/8-bit, fp8 with `weight_scale_inv`) and their constants. Names only one side
//!   has are summarised in the notes.
//! - With only an index file (`model.safetensors.index.json`, no shards), its `weight_map` names
//!   are compared with the tree and its `metadata.total_size` with the description's bytes.
//! - Without a `config.json`, a tree is built from the tensor names alone; the architectural
//!   facts it cannot know are marked as such in the notes.
//!
//! A folder's files come from a directory ([`load_folder`]) or a Hub snapshot
//! (`model::hub`): [`Folder`] is either, and the same reading follows.
//!
//! Submodules: [`header`] reads one file's header, [`index`] the index file, [`names`] handles
//! dotted tensor names, [`overlay`] lays a checkpoint over a config's tree, [`from_names`]
//! builds a tree without a config, [`quant`] knows quantized checkpoints' tensors.

mod from_names;
mod header;
mod index;
mod names;
mod overlay;
mod quant;

use super::{ImportOptions, ModelDescription};
use crate::{DType, InputError};
pub(crate) use header::{ShardHeader, parse_file_start};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Loads a model folder: `config.json`, `model.safetensors.index.json` and `*.safetensors`
/// shards, any of which may be missing as long as there is a config or a checkpoint.
pub fn load_folder(path: &Path, options: ImportOptions) -> Result<ModelDescription, InputError> {
    let origin = path.display().to_string();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| InputError::io(path, &e))? {
        let entry = entry.map_err(|e| InputError::io(path, &e))?;
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    let read = |name: &str| header::read_header(&path.join(name));
    let folder = Folder::new(&origin, &names, |name| Some(path.join(name)), &read)?;
    load(folder, options, &origin)
}

/// A model whose tensors are listed rather than stored: a safetensors header's JSON
/// (`header_json`: each tensor's `dtype`, `shape` and `data_offsets`, as `safetensors` writes
/// them, over virtual data) and, where there is one, its `config.json` text (`config`: the text
/// and where it came from). Built as a folder holding that config and one shard with that
/// header: the config's tree with the listed tensors laid over it, or without a config a tree
/// from the names. The Python package describes a live `torch.nn.Module` this way (its
/// parameters, tied ones once, and its buffers; its config where it has one).
pub fn load_listed(
    config: Option<(&str, &str)>,
    header_json: &str,
    origin: &str,
    options: ImportOptions,
) -> Result<ModelDescription, InputError> {
    let data_len = listed_data_len(header_json, origin)?;
    let header = header::parse_header(header_json.as_bytes(), data_len, origin)?;
    let mut checkpoint = Checkpoint::default();
    checkpoint.add_shard("model.safetensors", header, None);
    let mut model = match config {
        Some((text, config_origin)) => {
            overlay::build_from_text(text, config_origin, checkpoint, options, origin)
        }
        None => from_names::build(checkpoint, origin),
    }?;
    mark_listed_buffers(&mut model, header_json, origin)?;
    model.apply_processor(None)?;
    Ok(model)
}

/// The listing's buffers: `__metadata__.buffers`, a JSON object (as the string safetensors
/// metadata holds) of each buffer's full name and whether it is persistent. A tree built from
/// names alone takes every tensor for a parameter; these become buffers of a fixed dtype.
fn mark_listed_buffers(
    model: &mut ModelDescription,
    header_json: &str,
    origin: &str,
) -> Result<(), InputError> {
    let value: serde_json::Value = serde_json::from_str(header_json).unwrap_or_default();
    let Some(listed) = value.get("__metadata__").and_then(|m| m.get("buffers")) else { return Ok(()) };
    let buffers: BTreeMap<String, bool> =
        listed.as_str().and_then(|text| serde_json::from_str(text).ok()).ok_or_else(|| {
            InputError::new(origin, "`__metadata__.buffers` is not a JSON object of names and true/false")
                .at_key("__metadata__.buffers")
                .with_fix("give the buffers as a string holding {\"name\": persistent, …}")
        })?;
    model.root.visit_mut(&mut |module| {
        for tensor in &mut module.tensors {
            let full = super::join(&module.path, &tensor.name);
            if let (Some(persistent), super::TensorKind::Parameter) = (buffers.get(&full), &tensor.kind) {
                tensor.kind = super::TensorKind::Buffer { persistent: *persistent };
                tensor.follows_load_dtype = false;
            }
        }
    });
    Ok(())
}

/// The end of the last tensor's `data_offsets` in a header's JSON: the virtual data's length.
fn listed_data_len(header_json: &str, origin: &str) -> Result<u64, InputError> {
    let value: serde_json::Value = serde_json::from_str(header_json).map_err(|e| {
        InputError::new(origin, format!("the tensor listing is not valid JSON: {e}")).with_fix(
            "list each tensor as {\"dtype\": \"BF16\", \"shape\": [..], \"data_offsets\": [begin, end]}",
        )
    })?;
    let ends =
        value.as_object().into_iter().flatten().filter(|(k, _)| *k != "__metadata__").filter_map(|(_, v)| {
            v.get("data_offsets").and_then(|o| o.get(1)).and_then(serde_json::Value::as_u64)
        });
    Ok(ends.max().unwrap_or(0))
}

/// Builds the description from a folder's files, wherever they are.
pub(crate) fn load(
    folder: Folder,
    options: ImportOptions,
    origin: &str,
) -> Result<ModelDescription, InputError> {
    let checkpoint = Checkpoint::read(&folder)?;
    let mut model = match &folder.config {
        Some(config) => overlay::build(config, checkpoint, options, origin),
        None => from_names::build(checkpoint, origin),
    }?;
    match &folder.preprocessor {
        Some(path) => {
            let text = crate::files::read_text(path, crate::files::FileKind::ModelJson)?;
            model.apply_processor(Some((&text, &path.display().to_string())))?;
        }
        None => model.apply_processor(None)?,
    }
    Ok(model)
}

/// A model folder's files: a directory's, or a Hub snapshot's (small files in the cache,
/// shard headers read on demand).
pub(crate) struct Folder<'a> {
    config: Option<PathBuf>,
    /// A vision-language model's `preprocessor_config.json`.
    preprocessor: Option<PathBuf>,
    index: Option<PathBuf>,
    /// `*.safetensors` file names, sorted.
    shards: Vec<String>,
    notes: Vec<String>,
    /// Reads a shard's header by file name.
    headers: &'a dyn Fn(&str) -> Result<ShardHeader, InputError>,
}

impl<'a> Folder<'a> {
    /// The folder whose files are `names`: `path` gives a small file's path on disk (the config,
    /// the index; `None` when it cannot), `headers` a shard's header.
    pub(crate) fn new(
        origin: &str,
        names: &[String],
        path: impl Fn(&str) -> Option<PathBuf>,
        headers: &'a dyn Fn(&str) -> Result<ShardHeader, InputError>,
    ) -> Result<Folder<'a>, InputError> {
        let mut names = names.to_vec();
        names.sort();
        let mut folder = Folder {
            config: None,
            preprocessor: None,
            index: None,
            shards: Vec::new(),
            notes: Vec::new(),
            headers,
        };
        if names.iter().any(|n| n == "config.json") {
            folder.config = path("config.json");
        }
        if names.iter().any(|n| n == super::vision::PREPROCESSOR_FILE) {
            folder.preprocessor = path(super::vision::PREPROCESSOR_FILE);
        }
        if let Some(index) = Folder::index_name(&names) {
            folder.index = path(index);
            let count = names.iter().filter(|n| n.ends_with(".safetensors.index.json")).count();
            if count > 1 {
                folder.notes.push(format!(
                    "{count} index files in the folder; read `{index}` and ignored the others"
                ));
            }
        }
        folder.shards = names.iter().filter(|n| n.ends_with(".safetensors")).cloned().collect();
        if folder.config.is_none() && folder.index.is_none() && folder.shards.is_empty() {
            return Err(InputError::new(
                origin,
                "the folder has no config.json, no model.safetensors.index.json and no *.safetensors files",
            )
            .with_fix("give a folder holding a model's config.json and/or its safetensors checkpoint"));
        }
        Ok(folder)
    }

    /// The index file chosen, the way [`Folder::new`] chooses it among `names`.
    pub(crate) fn index_name(names: &[String]) -> Option<&str> {
        let mut indexes: Vec<&str> =
            names.iter().map(String::as_str).filter(|n| n.ends_with(".safetensors.index.json")).collect();
        indexes.sort_unstable();
        indexes.iter().find(|n| **n == "model.safetensors.index.json").or_else(|| indexes.first()).copied()
    }
}

/// The shard files an index names, each once, sorted.
pub(crate) fn index_files(path: &Path) -> Result<Vec<String>, InputError> {
    let index = index::read_index(path)?;
    let files: std::collections::BTreeSet<String> = index.weight_map.into_values().collect();
    Ok(files.into_iter().collect())
}

/// A tensor as the checkpoint stores it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredTensor {
    pub dtype: DType,
    pub shape: Vec<u64>,
}

impl StoredTensor {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.numel())
    }
}

/// Everything the folder's checkpoint files say.
#[derive(Debug, Default)]
pub(crate) struct Checkpoint {
    /// Every tensor name, with its header entry where its shard was read (`None`: named by the
    /// index only).
    pub tensors: BTreeMap<String, Option<StoredTensor>>,
    /// The index's `metadata.total_size`.
    pub total_size: Option<u64>,
    /// The index file's path, when there is one.
    pub index_path: Option<String>,
    /// Shards whose headers were read.
    pub shards_read: usize,
    pub notes: Vec<String>,
}

impl Checkpoint {
    /// Renames every tensor `rename` gives a new name (transformers' conversion mapping of a
    /// class); returns how many it renamed.
    pub fn rename(&mut self, rename: impl Fn(&str) -> Option<String>) -> usize {
        let mut count = 0;
        self.tensors = std::mem::take(&mut self.tensors)
            .into_iter()
            .map(|(name, stored)| match rename(&name) {
                Some(new) => {
                    count += 1;
                    (new, stored)
                }
                None => (name, stored),
            })
            .collect();
        count
    }

    /// True when no tensor has header information (an index without shards, or no checkpoint).
    pub fn names_only(&self) -> bool {
        self.tensors.values().all(Option::is_none)
    }

    /// Bytes of the tensors whose headers were read.
    pub fn header_bytes(&self) -> u64 {
        self.tensors.values().flatten().map(StoredTensor::bytes).fold(0, u64::saturating_add)
    }

    fn read(folder: &Folder) -> Result<Checkpoint, InputError> {
        let mut checkpoint = Checkpoint { notes: folder.notes.clone(), ..Checkpoint::default() };
        match &folder.index {
            Some(index_path) => checkpoint.read_indexed(folder, index_path)?,
            None => {
                for shard in &folder.shards {
                    let header = (folder.headers)(shard)?;
                    checkpoint.add_shard(shard, header, None);
                }
            }
        }
        Ok(checkpoint)
    }

    fn read_indexed(&mut self, folder: &Folder, index_path: &Path) -> Result<(), InputError> {
        let index = index::read_index(index_path)?;
        self.total_size = index.total_size;
        self.index_path = Some(index_path.display().to_string());
        let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, file) in &index.weight_map {
            by_shard.entry(file.as_str()).or_default().push(name.as_str());
        }
        let mut absent = Vec::new();
        for (file, listed) in &by_shard {
            if !folder.shards.iter().any(|s| s == file) {
                absent.push(*file);
                for name in listed {
                    self.tensors.entry((*name).to_string()).or_insert(None);
                }
                continue;
            }
            let header = (folder.headers)(file)?;
            let in_header: std::collections::HashSet<&str> =
                header.tensors.iter().map(|t| t.name.as_str()).collect();
            let lacking: Vec<&str> = listed.iter().copied().filter(|n| !in_header.contains(n)).collect();
            if !lacking.is_empty() {
                self.notes.push(format!(
                    "the index places {} tensors in `{file}` that its header does not have: {}",
                    lacking.len(),
                    names::summarize(lacking.iter().copied(), 6)
                ));
            }
            self.add_shard(file, header, Some((&index.weight_map, file)));
        }
        let unlisted: Vec<String> = folder
            .shards
            .iter()
            .filter(|n| !by_shard.contains_key(n.as_str()))
            .map(|n| format!("`{n}`"))
            .collect();
        if !unlisted.is_empty() {
            self.notes
                .push(format!("ignored safetensors files the index does not list: {}", unlisted.join(", ")));
        }
        if self.shards_read > 0 && !absent.is_empty() {
            self.notes.push(format!(
                "{} of {} shard files the index lists are not in the folder; their tensors are compared \
                 by name only",
                absent.len(),
                by_shard.len()
            ));
        }
        Ok(())
    }

    /// Adds a shard's tensors; with an index, tensors it places in another file are noted.
    fn add_shard(
        &mut self,
        file: &str,
        header: ShardHeader,
        index: Option<(&BTreeMap<String, String>, &str)>,
    ) {
        self.shards_read += 1;
        let mut misplaced = Vec::new();
        let mut duplicates = Vec::new();
        for tensor in header.tensors {
            if let Some((map, this_file)) = index
                && map.get(&tensor.name).is_some_and(|f| f != this_file)
            {
                misplaced.push(tensor.name);
                continue;
            }
            let stored = StoredTensor { dtype: tensor.dtype, shape: tensor.shape };
            if let Some(Some(_)) = self.tensors.insert(tensor.name.clone(), Some(stored)) {
                duplicates.push(tensor.name);
            }
        }
        if !misplaced.is_empty() {
            self.notes.push(format!(
                "`{file}` also holds {} tensors the index places in other files (ignored): {}",
                misplaced.len(),
                names::summarize(misplaced.iter().map(String::as_str), 6)
            ));
        }
        if !duplicates.is_empty() {
            self.notes.push(format!(
                "`{file}` repeats {} tensors of an earlier shard (the later one counts): {}",
                duplicates.len(),
                names::summarize(duplicates.iter().map(String::as_str), 6)
            ));
        }
    }
}
