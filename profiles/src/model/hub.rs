//! A model named by its Hugging Face Hub id (`org/name`, `org/name@revision`): the snapshot's
//! small files (`config.json`, `generation_config.json`, a quantizer's own config, a
//! vision-language model's `preprocessor_config.json`, the
//! checkpoint index) are fetched whole into the shared cache, each shard's safetensors header is
//! read with range requests (`vramplan-hub`), and the description is built by the same reading a
//! local model folder gets ([`safetensors::load`]). The model's name is the Hub id as typed.
//!
//! Which checkpoint: the index (`model.safetensors.index.json`, else another
//! `*.safetensors.index.json`) and the shards it names; without one, `model.safetensors`, else
//! every top-level `*.safetensors` file (as in a folder). Files in subfolders are not read.

use super::safetensors::{self, Folder, ShardHeader, parse_file_start};
use super::{ImportOptions, ModelDescription};
use crate::InputError;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use vramplan_hub::{Hub, HubError, HubId, Snapshot};

/// Small whole files read beside `config.json` when the revision has them: what the folder
/// reader may read (generation defaults, AutoGPTQ's and AutoAWQ's own quantization configs).
const SMALL_FILES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "quantize_config.json",
    "quant_config.json",
    super::vision::PREPROCESSOR_FILE,
];

/// A Hub error as bad input (exit 2): the message names the repository, the fix says what to do.
pub(crate) fn input_error(spec: &str, e: &HubError) -> InputError {
    let err = InputError::new(spec, e.to_string());
    match e.fix() {
        Some(fix) => err.with_fix(fix),
        None => err,
    }
}

/// The path of the `config.json` of the model `id` names (typed as `spec`), in the shared cache
/// (fetched if it is not there yet); `None` when the repository has none.
pub(crate) fn config_path(id: &HubId, spec: &str) -> Result<Option<std::path::PathBuf>, InputError> {
    let fail = |e: HubError| input_error(spec, &e);
    let hub = Hub::from_env().map_err(fail)?;
    let snapshot = hub.snapshot(id).map_err(fail)?;
    hub.file(&snapshot, "config.json").map_err(fail)
}

/// Loads the GGUF model of repository `id` whose file name holds `tag` (`org/name:Q4_K_M`, as
/// llama.cpp's `-hf` takes it; an empty tag when the repository holds one model file): every
/// part of a split file, and the repository's one `mmproj` projector if it has one, each read
/// by range requests until its header ends (`gguf::GgufFile::read_with`), never the weights.
pub(crate) fn load_gguf(id: &HubId, tag: &str, spec: &str) -> Result<ModelDescription, InputError> {
    use super::gguf::{self, GgufFile};
    let fail = |e: HubError| input_error(spec, &e);
    let hub = Hub::from_env().map_err(fail)?;
    let snapshot = hub.snapshot(id).map_err(fail)?;
    let ggufs: Vec<&String> =
        snapshot.files.iter().filter(|f| f.to_ascii_lowercase().ends_with(".gguf")).collect();
    let (projectors, models): (Vec<&String>, Vec<&String>) =
        ggufs.into_iter().partition(|f| gguf::is_projector_name(f));
    let wanted = tag.to_ascii_lowercase();
    let matching: Vec<&String> =
        models.iter().copied().filter(|f| f.to_ascii_lowercase().contains(&wanted)).collect();
    let listed = || models.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ");
    let Some(first) = matching.first() else {
        return Err(InputError::new(spec, format!("{} holds no GGUF file matching `{tag}`", id.repo))
            .with_fix(if models.is_empty() {
                "give a repository that holds .gguf files, or its Hub id without `:` for its safetensors"
                    .to_string()
            } else {
                format!(
                    "give one of its files' quantization, e.g. `{}:Q4_K_M`; it holds {}",
                    id.repo,
                    listed()
                )
            }));
    };
    let (folder, name) = first.rsplit_once('/').map_or(("", first.as_str()), |(d, n)| (d, n));
    let parts: Vec<String> = gguf::split_names(name)
        .into_iter()
        .map(|part| if folder.is_empty() { part } else { format!("{folder}/{part}") })
        .collect();
    let distinct = matching.iter().filter(|f| !parts.contains(f)).count();
    if distinct > 0 {
        return Err(InputError::new(
            spec,
            format!("`{tag}` matches {} GGUF files of {}", matching.len(), id.repo),
        )
        .with_fix(format!("give a tag that names one of them: {}", listed())));
    }
    let read = |file: &str| -> Result<GgufFile, InputError> {
        let origin = format!("{}/{file}", id.repo);
        // A quarter MiB holds a small model's header; a 128k-token vocabulary's takes a few MiB,
        // read in doubling ranges as the parse asks.
        let first = hub.read_range(&id.repo, &snapshot.commit, file, 0, 256 << 10).map_err(fail)?;
        let total = first.total;
        let mut bytes = first.bytes;
        GgufFile::read_with(&origin, Some(total), |wanted| {
            if wanted > bytes.len() as u64 {
                let more = wanted - bytes.len() as u64;
                let next = hub
                    .read_range(&id.repo, &snapshot.commit, file, bytes.len() as u64, more)
                    .map_err(fail)?;
                bytes.extend_from_slice(&next.bytes);
            }
            Ok(bytes.clone())
        })
    };
    let mut files = Vec::with_capacity(parts.len());
    for part in &parts {
        if !snapshot.files.contains(part) {
            return Err(InputError::new(
                spec,
                format!("{} lacks `{part}`, a part of the split file", id.repo),
            )
            .with_fix("check the repository's files: every part of a split GGUF must be there"));
        }
        files.push(read(part)?);
    }
    let projector = match projectors.as_slice() {
        [one] => Some(read(one)?),
        _ => None,
    };
    gguf::describe(spec, &files, projector.as_ref())
}

/// Loads the model `id` names (typed as `spec`).
pub(crate) fn load(id: &HubId, spec: &str, options: ImportOptions) -> Result<ModelDescription, InputError> {
    let fail = |e: HubError| input_error(spec, &e);
    let hub = Hub::from_env().map_err(fail)?;
    let snapshot = hub.snapshot(id).map_err(fail)?;
    let top: Vec<String> = snapshot.files.iter().filter(|f| !f.contains('/')).cloned().collect();
    let has = |ext: &str| snapshot.files.iter().any(|f| f.to_ascii_lowercase().ends_with(ext));
    if !snapshot.files.iter().any(|f| f == "config.json") && !has(".safetensors") && has(".gguf") {
        let ggufs: Vec<String> = snapshot
            .files
            .iter()
            .filter(|f| f.to_ascii_lowercase().ends_with(".gguf") && !super::gguf::is_projector_name(f))
            .map(|f| format!("`{f}`"))
            .collect();
        return Err(InputError::new(spec, format!("{} holds GGUF files, not a transformers checkpoint", id.repo))
            .with_fix(format!(
                "name the file's quantization after a colon, as llama.cpp's `-hf` does (`{}:Q4_K_M`); it holds {}",
                id.repo,
                ggufs.join(", ")
            )));
    }
    let index = Folder::index_name(&top).map(str::to_string);
    let mut local = BTreeMap::new();
    for name in SMALL_FILES.iter().copied().chain(index.as_deref()) {
        if let Some(path) = hub.file(&snapshot, name).map_err(fail)? {
            local.insert(name.to_string(), path);
        }
    }
    if !local.contains_key("config.json")
        && snapshot.from_cache
        && top.iter().any(|f| f.ends_with(".safetensors"))
    {
        // The cache has headers but no config: not what a run of vramplan leaves; say so rather
        // than build a tree from names alone.
        return Err(fail(HubError::Offline {
            repo: spec.to_string(),
            missing: "`config.json`".into(),
            asked: hub.settings().offline,
        }));
    }
    let index_path = index.as_deref().and_then(|i| local.get(i));
    let shards = shard_files(&snapshot, &top, index_path)?;
    // What a folder holding the same files would list: with an index, every top-level shard
    // (those it does not name are noted, not read); without, the ones read.
    let mut names: BTreeSet<String> = local.keys().cloned().collect();
    names.extend(shards.iter().cloned());
    if index_path.is_some() {
        names.extend(top.iter().filter(|f| f.ends_with(".safetensors")).cloned());
    }
    let names: Vec<String> = names.into_iter().collect();
    let fetched = hub.safetensors_headers(&snapshot, &shards);
    let origin_of = |file: &str| format!("{}/{file}", snapshot.repo);
    let parsed: BTreeMap<String, Result<ShardHeader, InputError>> = shards
        .iter()
        .zip(fetched)
        .map(|(file, start)| {
            let header =
                start.map_err(fail).and_then(|s| parse_file_start(&s.bytes, s.total, &origin_of(file)));
            (file.clone(), header)
        })
        .collect();
    let parsed = RefCell::new(parsed);
    let headers = |file: &str| -> Result<ShardHeader, InputError> {
        let cached = parsed.borrow_mut().remove(file);
        match cached {
            Some(header) => header,
            None => {
                let start = hub.safetensors_header(&snapshot, file).map_err(fail)?;
                parse_file_start(&start.bytes, start.total, &origin_of(file))
            }
        }
    };
    let folder = Folder::new(spec, &names, |name| local.get(name).cloned(), &headers)?;
    safetensors::load(folder, options, spec)
}

/// The shard files to read: those the index names (online, those the revision has; from the
/// cache, all of them, so that a missing header says so); without an index `model.safetensors`,
/// else every top-level `*.safetensors`.
fn shard_files(
    snapshot: &Snapshot,
    top: &[String],
    index: Option<&std::path::PathBuf>,
) -> Result<Vec<String>, InputError> {
    let listed: Vec<String> = top.iter().filter(|f| f.ends_with(".safetensors")).cloned().collect();
    let Some(index) = index else {
        return Ok(if listed.iter().any(|f| f == "model.safetensors") {
            vec!["model.safetensors".to_string()]
        } else {
            listed
        });
    };
    let named = safetensors::index_files(index)?;
    Ok(named.into_iter().filter(|f| snapshot.from_cache || listed.contains(f)).collect())
}
