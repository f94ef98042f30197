//! Turning a parsed custom-model file into a [`ModelDescription`]: building each module's
//! tensors and children, collecting the blocks in execution order with their activation sizes,
//! and either filling in the facts the file gives (a model from scratch) or adding the modules
//! to the extended model's tree and block order.
//!
//! Every value that must be positive, every size and every name is checked here, with the line
//! and column it came from.

use super::schema::{ActivationsSpec, ModelFile, ModuleSpec, NormName, SizeText, StackName};
use super::{ActivationSizes, CustomModel};
use crate::model::tree::join;
use crate::model::{
    ArchFacts, AttentionKind, ImportOptions, LayerFacts, ModelDescription, Module, ModuleKind, NormKind,
    StackKind, Tensor, catalog, hf, safetensors, summary,
};
use crate::{DType, InputError, units};
use serde_saphyr::{Location, Spanned};
use std::path::Path;

/// More modules than any real model has (DeepSeek-V3 listed expert by expert has about 60,000):
/// a guard against `repeat` typos, and a bound on the work of a simulation (docs/limits.md).
const MAX_MODULES: usize = 1 << 18;
/// The most copies one `repeat` makes: the bound on experts (docs/limits.md), above the
/// bound on layers (1,024).
const MAX_REPEAT: u64 = 1 << 12;
/// The largest dimension of a tensor or a layer (2²⁴, the vocabulary bound; hidden sizes are
/// below 2¹⁶), and the most elements or `params` one tensor holds (2⁴⁰; DeepSeek-V3's largest
/// tensor has about 2³³), so that byte sums stay far from `u64::MAX`.
const MAX_DIM: u64 = 1 << 24;
const MAX_ELEMENTS: u64 = 1 << 40;

pub(super) fn at(origin: &str, location: &Location, problem: impl Into<String>) -> InputError {
    let err = InputError::new(origin, problem);
    if location.line() > 0 { err.at_line(location.line(), location.column()) } else { err }
}

/// A positive integer; refused with its line and a fix otherwise (a caller with a more precise
/// fix replaces it).
fn positive(origin: &str, value: &Spanned<i64>, what: &str) -> Result<u64, InputError> {
    u64::try_from(value.value).ok().filter(|v| *v > 0).ok_or_else(|| {
        at(origin, &value.referenced, format!("{what} must be a positive integer, found {}", value.value))
            .with_fix(format!("give {what} as a whole number of at least 1 (docs/custom-models.md)"))
    })
}

/// A positive integer at most `max`.
fn bounded(origin: &str, value: &Spanned<i64>, what: &str, max: u64) -> Result<u64, InputError> {
    let v = positive(origin, value, what)?;
    if v > max {
        return Err(at(origin, &value.referenced, format!("{what} is {v}, past the bound of {max}"))
            .with_fix(format!("give at most {max} (docs/limits.md gives the bounds and their reasons)")));
    }
    Ok(v)
}

fn shape(origin: &str, dims: &Spanned<Vec<i64>>, what: &str) -> Result<Vec<u64>, InputError> {
    let shape = dims
        .value
        .iter()
        .map(|&d| {
            u64::try_from(d).ok().filter(|d| *d > 0 && *d <= MAX_DIM).ok_or_else(|| {
                at(
                    origin,
                    &dims.referenced,
                    format!(
                        "dimension {d} of `{what}` must be a positive integer of at most {MAX_DIM} (shape {:?})",
                        dims.value
                    ),
                )
                .with_fix("docs/limits.md gives the bounds on sizes and their reasons")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d).filter(|n| *n <= MAX_ELEMENTS));
    if elements.is_none() {
        return Err(at(
            origin,
            &dims.referenced,
            format!("`{what}` has more than {MAX_ELEMENTS} elements (shape {:?})", dims.value),
        )
        .with_fix("docs/limits.md gives the bounds on sizes and their reasons"));
    }
    Ok(shape)
}

fn size(origin: &str, text: &Spanned<SizeText>, what: &str) -> Result<u64, InputError> {
    units::parse_bytes(&text.value.0).map_err(|problem| {
        at(origin, &text.referenced, format!("{what}: {problem}"))
            .with_fix("write a size with its unit, such as `24KiB`, `1.5MiB` or `2GB`")
    })
}

/// The most activation memory a model may declare per token (256 MiB) and per sample (1 TiB), each
/// declaration and all of them together: with the workload's bounds (2³² tokens, 2²⁰ samples a
/// step) a step's declared bytes stay below 2⁶¹, so the simulator's `u64` sums cannot overflow.
/// The memory model gives Llama-3.1-405B, trained in bf16, about 7.6 MiB per token over its 126
/// layers.
const MAX_PER_TOKEN: u64 = 1 << 28;
const MAX_PER_SAMPLE: u64 = 1 << 40;

fn activations(origin: &str, spec: &ActivationsSpec) -> Result<ActivationSizes, InputError> {
    let bounded_size = |text: &Spanned<SizeText>, what: &str, max: u64| {
        let bytes = size(origin, text, what)?;
        if bytes > max {
            return Err(at(
                origin,
                &text.referenced,
                format!("{what}: {} is past the bound of {}", text.value.0, units::format_bytes(max)),
            )
            .with_fix(format!("declare at most {} (docs/custom-models.md)", units::format_bytes(max))));
        }
        Ok(bytes)
    };
    let per_token =
        spec.per_token.as_ref().map(|s| bounded_size(s, "per_token", MAX_PER_TOKEN)).transpose()?;
    let per_sample =
        spec.per_sample.as_ref().map(|s| bounded_size(s, "per_sample", MAX_PER_SAMPLE)).transpose()?;
    Ok(ActivationSizes { per_token: per_token.unwrap_or(0), per_sample: per_sample.unwrap_or(0) })
}

/// Refuses declarations that add up past [`MAX_PER_TOKEN`] or [`MAX_PER_SAMPLE`] over the model.
fn bounded_total(origin: &str, declared: &[(String, ActivationSizes)]) -> Result<(), InputError> {
    let total =
        |f: fn(&ActivationSizes) -> u64| declared.iter().fold(0u64, |a, (_, s)| a.saturating_add(f(s)));
    for (what, sum, max) in [
        ("per_token", total(|s| s.per_token), MAX_PER_TOKEN),
        ("per_sample", total(|s| s.per_sample), MAX_PER_SAMPLE),
    ] {
        if sum > max {
            return Err(InputError::new(
                origin,
                format!(
                    "the modules declare {} of activations {what} in all ({} declarations), past the bound of {}",
                    units::format_bytes(sum),
                    declared.len(),
                    units::format_bytes(max)
                ),
            )
            .at_key("activations")
            .with_fix("check the sizes' units (`KiB`, not `GiB`): Llama-3.1-405B keeps about 7.6 MiB per token"));
        }
    }
    Ok(())
}

fn check_name(origin: &str, name: &Spanned<String>) -> Result<(), InputError> {
    let valid = name
        .value
        .split('.')
        .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    if valid {
        Ok(())
    } else {
        Err(at(origin, &name.referenced, format!("`{}` is not a module name", name.value))
            .with_fix("use letters, digits and `_`, with dots between nested modules (`self_attn.q_proj`)"))
    }
}

/// Builds the model the file describes.
pub(super) fn assemble(
    file: ModelFile,
    origin: &str,
    folder: &Path,
    options: ImportOptions,
) -> Result<CustomModel, InputError> {
    let mut builder = ModuleBuilder {
        origin,
        dtype: file.dtype.unwrap_or(DType::F32),
        default_activations: file.activations.as_ref().map(|a| activations(origin, a)).transpose()?,
        blocks: Vec::new(),
        block_classes: Vec::new(),
        activations: Vec::new(),
        modules_built: 0,
    };
    // An extended model may only change its head (`head:`), with no modules of its own.
    if file.modules.value.is_empty() && !(file.extend.is_some() && file.head.is_some()) {
        return Err(at(origin, &file.modules.referenced, "`modules` is empty")
            .with_fix("list the model's modules in execution order"));
    }
    if let (None, Some(head)) = (&file.extend, &file.head) {
        return Err(at(origin, &head.referenced, "`head` replaces the head of the model `extend` names")
            .with_fix(
                "add `extend:` with a config or built-in model, or describe the head among `modules`",
            ));
    }
    let mut model = match &file.extend {
        None => from_scratch(&file, &mut builder)?,
        Some(base) => extended(&file, base, folder, options, &mut builder)?,
    };
    // Extended or not, its own modules make it a model no transformers class loads (a new head
    // alone is a transformers class).
    model.custom = !file.modules.value.is_empty();
    if let Some(ties) = &file.ties {
        for (tensor, canonical) in &ties.0 {
            model.tie(&tensor.value, &canonical.value).map_err(|e| {
                at(origin, &tensor.referenced, e.problem).with_fix(e.fix.unwrap_or_else(|| {
                    "name both tensors by their full paths (`lm_head.weight: model.embed.weight`)".to_string()
                }))
            })?;
        }
    }
    summary::validate(&model, origin)?;
    bounded_total(origin, &builder.activations)?;
    Ok(CustomModel { description: model, activations: builder.activations })
}

/// A model described entirely by the file.
fn from_scratch(file: &ModelFile, builder: &mut ModuleBuilder) -> Result<ModelDescription, InputError> {
    let origin = builder.origin;
    let mut root =
        Module::new("", file.architecture.as_deref().unwrap_or("CustomModel"), ModuleKind::Container);
    for spec in &file.modules.value {
        if let Some(after) = &spec.after {
            return Err(at(
                origin,
                &after.referenced,
                "`after` places a module among an extended model's blocks",
            )
            .with_fix("without `extend`, modules run in the order they are written: remove `after`"));
        }
        check_name(origin, &spec.name)?;
        let module = builder.spec(spec, &spec.name.value, false)?;
        insert(origin, &mut root, &spec.name, module, None)?;
    }
    if builder.blocks.is_empty() {
        return Err(at(origin, &file.modules.referenced, "the model has no blocks (zero layers)")
            .with_fix("mark the model's layers with `block: true`, or write them once with `repeat: N`"));
    }
    let mut notes = vec![format!("custom model described in {origin}")];
    let Some(hidden) = &file.hidden_size else {
        return Err(InputError::new(origin, "missing `hidden_size`: expected the model's width")
            .at_key("hidden_size")
            .with_fix("add e.g. `hidden_size: 256` (the width of the residual stream)"));
    };
    let hidden = positive(origin, hidden, "`hidden_size`")?;
    let heads = match &file.attention_heads {
        Some(h) => positive(origin, h, "`attention_heads`")?,
        None => {
            notes.push("no `attention_heads`: one head of the hidden size assumed".into());
            1
        }
    };
    let kv_heads =
        file.kv_heads.as_ref().map(|k| positive(origin, k, "`kv_heads`")).transpose()?.unwrap_or(heads);
    if heads % kv_heads != 0
        && let Some(k) = &file.kv_heads
    {
        return Err(at(
            origin,
            &k.referenced,
            format!("{kv_heads} key/value heads do not divide {heads} heads"),
        )
        .with_fix("grouped-query attention needs `attention_heads` to be a multiple of `kv_heads`"));
    }
    let head_dim = match &file.head_dim {
        Some(d) => positive(origin, d, "`head_dim`")?,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            let location = file.attention_heads.as_ref().map(|h| h.referenced).unwrap_or(Location::UNKNOWN);
            return Err(at(
                origin,
                &location,
                format!("{heads} heads do not divide the hidden size {hidden}"),
            )
            .with_fix("give `head_dim`, or a head count that divides `hidden_size`"));
        }
    };
    let optional = |value: &Option<Spanned<i64>>, what: &str| -> Result<u64, InputError> {
        value.as_ref().map(|v| positive(origin, v, what)).transpose().map(|v| v.unwrap_or(0))
    };
    let facts = ArchFacts {
        model_type: "custom".into(),
        hidden_size: hidden,
        num_attention_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: optional(&file.intermediate_size, "`intermediate_size`")?,
        vocab_size: optional(&file.vocab_size, "`vocab_size`")?,
        max_positions: optional(&file.max_positions, "`max_positions`")?,
        attention: AttentionKind::Standard,
        norm: match file.norm {
            Some(NormName::RmsNorm) => NormKind::RmsNorm,
            Some(NormName::LayerNorm) | None => NormKind::LayerNorm,
        },
        gated_mlp: file.gated_mlp.unwrap_or(false),
        activation: file.activation.clone().unwrap_or_else(|| "unknown".into()),
        moe: None,
        tie_word_embeddings: file.ties.as_ref().is_some_and(|t| !t.0.is_empty()),
        layers: std::mem::take(&mut builder.blocks),
        no_split_classes: builder.block_classes.clone(),
        head: crate::model::OutputHead::LanguageModel,
        vision: None,
    };
    Ok(ModelDescription {
        custom: true,
        name: file.name.clone().unwrap_or_else(|| origin.to_string()),
        architecture: root.class.clone(),
        naming: Default::default(),
        dtype: builder.dtype,
        facts,
        root,
        notes,
        quantization: None,
        float_forms: Default::default(),
    })
}

/// The keys that describe the architecture, which an extended config already gives.
fn fact_keys(file: &ModelFile) -> Vec<(&'static str, Location)> {
    let spanned = [
        ("hidden_size", &file.hidden_size),
        ("attention_heads", &file.attention_heads),
        ("kv_heads", &file.kv_heads),
        ("head_dim", &file.head_dim),
        ("intermediate_size", &file.intermediate_size),
        ("vocab_size", &file.vocab_size),
        ("max_positions", &file.max_positions),
    ];
    let mut keys: Vec<(&'static str, Location)> =
        spanned.into_iter().filter_map(|(k, v)| v.as_ref().map(|v| (k, v.referenced))).collect();
    for (key, given) in [
        ("norm", file.norm.is_some()),
        ("activation", file.activation.is_some()),
        ("gated_mlp", file.gated_mlp.is_some()),
    ] {
        if given {
            keys.push((key, Location::UNKNOWN));
        }
    }
    keys
}

/// A model from a config (or folder, or built-in name) with the file's modules added.
fn extended(
    file: &ModelFile,
    base_name: &Spanned<String>,
    folder: &Path,
    options: ImportOptions,
    builder: &mut ModuleBuilder,
) -> Result<ModelDescription, InputError> {
    let origin = builder.origin;
    if let Some((key, location)) = fact_keys(file).first() {
        let err = at(origin, location, format!("`{key}` comes from the extended model's config"));
        return Err((if location.line() == 0 { err.at_key(*key) } else { err })
            .with_fix(format!("remove `{key}` here, or change it in the config that `extend` names")));
    }
    let mut model = load_base(origin, base_name, folder, options, file.head.as_ref())?;
    let (base_params, base_bytes) = (model.params(), model.bytes());
    if let Some(dtype) = file.dtype {
        model = model.cast(dtype);
    }
    builder.dtype = model.dtype;
    let mut inserted_after: Vec<(String, usize)> = Vec::new();
    for spec in &file.modules.value {
        check_name(origin, &spec.name)?;
        let path = spec.name.value.as_str();
        if model.root.find(path).is_some_and(|m| m.path == path) {
            return Err(at(
                origin,
                &spec.name.referenced,
                format!("`{path}` already exists in the extended model"),
            )
            .with_fix("give the added module a new name"));
        }
        let inside_block =
            ancestors(path).any(|a| model.root.find(a).is_some_and(|m| m.kind == ModuleKind::Block));
        let target = match &spec.after {
            None => None,
            Some(after) => {
                let known = model.facts.layers.iter().any(|l| l.path == after.value);
                if !known {
                    let first = model.facts.layers.first().map(|l| l.path.as_str()).unwrap_or("");
                    let last = model.facts.layers.last().map(|l| l.path.as_str()).unwrap_or("");
                    return Err(at(
                        origin,
                        &after.referenced,
                        format!("`{}` is not a block of the model", after.value),
                    )
                    .with_fix(format!("name one of its blocks, `{first}` … `{last}`")));
                }
                Some(after.value.as_str())
            }
        };
        let first_new_block = builder.blocks.len();
        let module = builder.spec(spec, path, inside_block)?;
        insert(origin, &mut model.root, &spec.name, module, target)?;
        let new_blocks: Vec<LayerFacts> = builder.blocks.drain(first_new_block..).collect();
        place_blocks(&mut model.facts.layers, new_blocks, target, &mut inserted_after);
    }
    for class in &builder.block_classes {
        if !model.facts.no_split_classes.contains(class) {
            model.facts.no_split_classes.push(class.clone());
        }
    }
    if let Some(name) = &file.name {
        model.name = name.clone();
    } else {
        model.name = origin.to_string();
    }
    if let Some(architecture) = &file.architecture {
        model.architecture = architecture.clone();
        model.root.class = architecture.clone();
    }
    let added = file.modules.value.len();
    model.notes.push(format!(
        "{origin} extends `{}` with {added} module{}: +{} parameters, +{} bytes (base {} parameters, {} bytes)",
        base_name.value,
        if added == 1 { "" } else { "s" },
        model.params().saturating_sub(base_params),
        model.bytes().saturating_sub(base_bytes),
        base_params,
        base_bytes,
    ));
    Ok(model)
}

/// Loads what `extend:` names: a built-in model, or a config / model folder next to the file.
fn load_base(
    origin: &str,
    base: &Spanned<String>,
    folder: &Path,
    options: ImportOptions,
    head: Option<&Spanned<serde_json::Value>>,
) -> Result<ModelDescription, InputError> {
    if let Some(text) = catalog::builtin_config(&base.value) {
        let mut model = match head {
            Some(head) => super::head::build(origin, head, text, &base.value, options),
            None => hf::from_config_text(text, &base.value, options),
        }?;
        model.apply_builtin_processor(&base.value)?;
        return Ok(model);
    }
    let path = folder.join(&base.value);
    if path.is_dir() {
        if let Some(head) = head {
            return Err(at(origin, &head.referenced, "`head` with a model folder")
                .with_fix("extend the folder's config.json to change its head"));
        }
        return safetensors::load_folder(&path, options);
    }
    if path.is_file() {
        let lower = base.value.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            return Err(at(origin, &base.referenced, "`extend` names another custom YAML file")
                .with_fix("extend a HF config.json, a model folder or a built-in model"));
        }
        if lower.ends_with(".gguf") {
            return Err(at(
                origin,
                &base.referenced,
                "`extend` names a GGUF file, which llama.cpp runs as it is",
            )
            .with_fix("extend a HF config.json, a model folder or a built-in model"));
        }
        let mut model = match head {
            Some(head) => {
                let text = crate::files::read_text(&path, crate::files::FileKind::ModelJson)?;
                super::head::build(origin, head, &text, &path.display().to_string(), options)
            }
            None => hf::from_config_file(&path, options),
        }?;
        model.apply_processor_beside(path.parent().unwrap_or(folder))?;
        return Ok(model);
    }
    if path.exists() {
        // Neither a file nor a folder (a FIFO, a device): refused by name, never opened.
        crate::files::check_regular(&path, crate::files::FileKind::ModelJson).map_err(|e| {
            let fix = e.fix.unwrap_or_default();
            at(origin, &base.referenced, format!("`extend`: {}: {}", e.origin, e.problem)).with_fix(fix)
        })?;
    }
    Err(at(
        origin,
        &base.referenced,
        format!("`{}` is neither a built-in model nor a file or folder at {}", base.value, path.display()),
    )
    .with_fix(format!(
        "give a config.json path relative to this file, or one of: {}",
        catalog::builtin_names().join(", ")
    )))
}

/// `a.b.c` → `a`, `a.b` (proper ancestors, outermost first).
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('.').map(move |(i, _)| &path[..i])
}

/// Inserts `module` at `name` under `parent` (a dotted name nests, creating containers); with
/// `after`, right after the child of the parent that holds that path.
fn insert(
    origin: &str,
    parent: &mut Module,
    name: &Spanned<String>,
    module: Module,
    after: Option<&str>,
) -> Result<(), InputError> {
    let (outer, _) = name.value.rsplit_once('.').unwrap_or(("", &name.value));
    let holder = if outer.is_empty() { parent } else { ensure_relative(parent, outer) };
    if holder.children.iter().any(|c| c.path == module.path) {
        return Err(at(origin, &name.referenced, format!("`{}` is declared twice", module.path))
            .with_fix("give each module its own name (a dotted name also declares its containers)"));
    }
    let position = after.and_then(|target| {
        holder.children.iter().position(|c| c.path == target || target.starts_with(&format!("{}.", c.path)))
    });
    match position {
        Some(p) => holder.children.insert(p + 1, module),
        None => holder.children.push(module),
    }
    Ok(())
}

/// The descendant of `parent` at the relative dotted `path`, creating containers.
fn ensure_relative<'m>(parent: &'m mut Module, path: &str) -> &'m mut Module {
    let mut node = parent;
    for part in path.split('.') {
        let child_path = join(&node.path, part);
        let position = match node.children.iter().position(|c| c.path == child_path) {
            Some(p) => p,
            None => {
                node.children.push(Module::new(child_path, "Module", ModuleKind::Container));
                node.children.len() - 1
            }
        };
        node = &mut node.children[position];
    }
    node
}

/// Puts new blocks into the execution order: after `target` (following blocks added earlier
/// after the same target), or at the end.
fn place_blocks(
    layers: &mut Vec<LayerFacts>,
    new_blocks: Vec<LayerFacts>,
    target: Option<&str>,
    inserted_after: &mut Vec<(String, usize)>,
) {
    let Some(target) = target else {
        layers.extend(new_blocks);
        return;
    };
    let Some(target_position) = layers.iter().position(|l| l.path == target) else {
        layers.extend(new_blocks);
        return;
    };
    let earlier = inserted_after.iter().filter(|(t, _)| t == target).map(|(_, n)| n).sum::<usize>();
    let at = (target_position + 1 + earlier).min(layers.len());
    let count = new_blocks.len();
    layers.splice(at..at, new_blocks);
    inserted_after.push((target.to_string(), count));
}

/// Builds modules from their specs, collecting blocks and activation sizes on the way.
struct ModuleBuilder<'o> {
    origin: &'o str,
    dtype: DType,
    default_activations: Option<ActivationSizes>,
    /// Blocks built so far, in execution order.
    blocks: Vec<LayerFacts>,
    block_classes: Vec<String>,
    activations: Vec<(String, ActivationSizes)>,
    modules_built: usize,
}

impl ModuleBuilder<'_> {
    /// The module `spec` at `path`: one module, or with `repeat` a list of copies.
    fn spec(&mut self, spec: &ModuleSpec, path: &str, inside_block: bool) -> Result<Module, InputError> {
        let Some(repeat) = &spec.repeat else {
            return self.single(spec, path, spec.block.unwrap_or(false), inside_block);
        };
        let count = positive(self.origin, repeat, "`repeat`")
            .map_err(|e| e.with_fix("`repeat: N` makes N copies; a model needs at least one layer"))?;
        if count > MAX_REPEAT {
            return Err(at(
                self.origin,
                &repeat.referenced,
                format!("`repeat: {count}` is more copies than any model has (the bound is {MAX_REPEAT})"),
            )
            .with_fix(format!(
                "give at most {MAX_REPEAT} copies (the largest models have about 128 layers and 512 experts)"
            )));
        }
        let as_blocks = spec.block.unwrap_or(!inside_block);
        let items = (0..count)
            .map(|i| self.single(spec, &join(path, &i.to_string()), as_blocks, inside_block))
            .collect::<Result<Vec<_>, _>>()?;
        let name = path.rsplit('.').next().unwrap_or(path);
        let kind = if name == "experts" {
            ModuleKind::Experts { count: u32::try_from(count).unwrap_or(u32::MAX) }
        } else {
            ModuleKind::Container
        };
        Ok(Module::new(path, "ModuleList", kind).with_children(items))
    }

    fn single(
        &mut self,
        spec: &ModuleSpec,
        path: &str,
        as_block: bool,
        inside_block: bool,
    ) -> Result<Module, InputError> {
        let origin = self.origin;
        let here = &spec.name.referenced;
        self.modules_built += 1;
        if self.modules_built > MAX_MODULES {
            return Err(at(
                origin,
                here,
                format!("more than {MAX_MODULES} modules: check the `repeat` counts"),
            ));
        }
        if as_block && inside_block {
            return Err(at(origin, here, format!("`{path}` is a block inside a block"))
                .with_fix("blocks are the placement units: only the outermost one can be a block"));
        }
        let shorthands =
            [spec.linear.is_some(), spec.embedding.is_some(), spec.norm.is_some(), spec.params.is_some()];
        if shorthands.iter().filter(|s| **s).count() > 1 {
            return Err(at(
                origin,
                here,
                format!("`{path}` has more than one of `linear`, `embedding`, `norm`, `params`"),
            )
            .with_fix("give one of them (and `tensors` for any further parameters)"));
        }
        let dtype = spec.dtype.unwrap_or(self.dtype);
        let mut tensors = Vec::new();
        let mut kind = ModuleKind::Other;
        let mut class = "Module";
        if let Some(linear) = &spec.linear {
            let inp = bounded(origin, &linear.in_features, "`linear.in`", MAX_DIM)?;
            let out = bounded(origin, &linear.out_features, "`linear.out`", MAX_DIM)?;
            tensors.push(Tensor::parameter("weight", &[out, inp], dtype));
            if linear.bias {
                tensors.push(Tensor::parameter("bias", &[out], dtype));
            }
            (kind, class) = (ModuleKind::Linear, "Linear");
        }
        if let Some(embedding) = &spec.embedding {
            let count = bounded(origin, &embedding.count, "`embedding.count`", MAX_DIM)?;
            let dim = bounded(origin, &embedding.dim, "`embedding.dim`", MAX_DIM)?;
            tensors.push(Tensor::parameter("weight", &[count, dim], dtype));
            (kind, class) = (ModuleKind::Embedding, "Embedding");
        }
        if let Some(norm) = &spec.norm {
            let dim = bounded(origin, &norm.dim, "`norm.dim`", MAX_DIM)?;
            tensors.push(Tensor::parameter("weight", &[dim], dtype));
            if norm.bias {
                tensors.push(Tensor::parameter("bias", &[dim], dtype));
            }
            (kind, class) = (ModuleKind::Norm, "LayerNorm");
        }
        if let Some(params) = &spec.params {
            let count = bounded(origin, params, "`params`", MAX_ELEMENTS)?;
            tensors.push(Tensor::parameter("parameters", &[count], dtype));
        }
        for (name, dims) in spec.tensors.iter().flat_map(|t| &t.0) {
            let shape = shape(origin, dims, &name.value)?;
            push_tensor(origin, &mut tensors, name, Tensor::parameter(&name.value, &shape, dtype))?;
        }
        for (name, buffer) in spec.buffers.iter().flat_map(|b| &b.0) {
            let shape = shape(origin, &buffer.shape, &name.value)?;
            let buffer_dtype = buffer.dtype.unwrap_or(DType::F32);
            push_tensor(
                origin,
                &mut tensors,
                name,
                Tensor::buffer(&name.value, &shape, buffer_dtype, buffer.persistent),
            )?;
        }
        let mut module = Module::new(path, class, kind);
        module.tensors = tensors;
        for child in spec.modules.iter().flatten() {
            check_name(origin, &child.name)?;
            if let Some(after) = &child.after {
                return Err(at(
                    origin,
                    &after.referenced,
                    "`after` is for modules added to an extended model's top level",
                )
                .with_fix("children run in the order they are written: remove `after`"));
            }
            let child_path = join(path, &child.name.value);
            let built = self.spec(child, &child_path, inside_block || as_block)?;
            insert(origin, &mut module, &child.name, built, None)?;
        }
        if module.tensors.is_empty() && module.children.is_empty() {
            return Err(at(
                origin,
                here,
                format!("module `{path}` has no shape: it holds no tensors and no modules"),
            )
            .with_fix(
                "give `tensors: {name: [dims]}`, `linear`, `embedding`, `norm`, `params` or `modules`",
            ));
        }
        if kind == ModuleKind::Other && !module.children.is_empty() {
            module.kind = ModuleKind::Container;
        }
        if let Some(class) = &spec.class {
            module.class = class.clone();
        }
        let declared = spec.activations.as_ref().map(|a| activations(origin, a)).transpose()?;
        if as_block {
            module.kind = ModuleKind::Block;
            if spec.class.is_none() {
                module.class = "Block".into();
            }
            if !self.block_classes.contains(&module.class) {
                self.block_classes.push(module.class.clone());
            }
            let window = spec
                .attention_window
                .as_ref()
                .map(|w| positive(origin, w, "`attention_window`"))
                .transpose()?;
            let mut moe = false;
            module.visit(&mut |m| moe |= matches!(m.kind, ModuleKind::Experts { .. }));
            self.blocks.push(LayerFacts {
                path: path.to_string(),
                stack: match spec.stack {
                    Some(StackName::Encoder) => StackKind::Encoder,
                    Some(StackName::Decoder) | None => StackKind::Decoder,
                },
                moe,
                attention_window: window,
                cross_attention: false,
                ssm: None,
            });
            if let Some(sizes) = declared.or(self.default_activations) {
                self.activations.push((path.to_string(), sizes));
                module.activations = Some(sizes);
            }
        } else {
            if spec.stack.is_some() || spec.attention_window.is_some() {
                return Err(at(
                    origin,
                    here,
                    format!("`{path}` is not a block: `stack` and `attention_window` describe blocks"),
                )
                .with_fix("add `block: true`, or remove them"));
            }
            if let Some(sizes) = declared {
                self.activations.push((path.to_string(), sizes));
                module.activations = Some(sizes);
            }
        }
        Ok(module)
    }
}

fn push_tensor(
    origin: &str,
    tensors: &mut Vec<Tensor>,
    name: &Spanned<String>,
    tensor: Tensor,
) -> Result<(), InputError> {
    if name.value.is_empty() || name.value.contains('.') {
        return Err(at(origin, &name.referenced, format!("`{}` is not a tensor name", name.value))
            .with_fix("tensor names have no dots; nest modules with `modules` instead"));
    }
    if tensors.iter().any(|t| t.name == tensor.name) {
        return Err(at(origin, &name.referenced, format!("tensor `{}` is given twice", name.value))
            .with_fix("`linear`, `embedding` and `norm` already give `weight` (and `bias`)"));
    }
    tensors.push(tensor);
    Ok(())
}
