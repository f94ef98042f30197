//! Laying a checkpoint over the tree a `config.json` builds: the config gives the structure and
//! the facts, the checkpoint what is really stored — each tensor's dtype and shape, quantized
//! weights in place of float ones, and quantization constants beside them. What only one side
//! has is summarised in the description's notes, as is the comparison of the description's
//! bytes with the index's `metadata.total_size`. A config whose class has no importer builds
//! the [`generic`] model from the checkpoint instead.

mod generic;

use super::names;
use super::quant::{self, QuantConfig, Role};
use super::{Checkpoint, StoredTensor};
use crate::model::hf::{self, HfConfig};
use crate::model::{
    FloatForm, ImportOptions, ModelDescription, Module, Naming, Tensor, TensorKind, join, quantization,
    summary,
};
use crate::{DType, InputError};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Builds the description from `config_path` in the checkpoint's naming and overlays the
/// checkpoint.
pub(crate) fn build(
    config_path: &Path,
    checkpoint: Checkpoint,
    options: ImportOptions,
    origin: &str,
) -> Result<ModelDescription, InputError> {
    let text = crate::files::read_text(config_path, crate::files::FileKind::ModelJson)?;
    build_from_text(&text, &config_path.display().to_string(), checkpoint, options, origin)
}

/// [`build`] from a config's text (`config_origin` names it in errors).
pub(crate) fn build_from_text(
    text: &str,
    config_origin: &str,
    checkpoint: Checkpoint,
    options: ImportOptions,
    origin: &str,
) -> Result<ModelDescription, InputError> {
    let config = HfConfig::parse(text, config_origin)?;
    let mut checkpoint = checkpoint;
    let arch = config.architecture()?;
    let renamed = checkpoint.rename(|name| hf::checkpoint_name(&arch, options.naming, name));
    let mut notes = checkpoint.notes.clone();
    if renamed > 0 {
        notes.push(format!(
            "{renamed} tensor names of the checkpoint read as transformers loads them (its conversion \
             mapping for {arch})"
        ));
    }
    let naming = match detect_naming(checkpoint.tensors.keys().map(String::as_str)) {
        Some(found) => {
            if found != options.naming {
                notes.push(format!(
                    "the checkpoint uses transformers {} module names; the tree is built in that \
                     naming so that its names match the checkpoint's",
                    if found == Naming::V4 { "4.x" } else { "5.x" }
                ));
            }
            found
        }
        None => options.naming,
    };
    // A class with no importer, over a checkpoint's headers: the generic model.
    if !hf::has_importer(&arch) && !checkpoint.tensors.is_empty() {
        return generic::build(&config, &arch, &checkpoint, origin);
    }
    // The floating-point tree: the checkpoint's own headers say how it is quantized.
    let quantization = quantization::read(config.origin(), config.object(), naming)?;
    let mut model = hf::from_config_unquantized(&config, ImportOptions { naming })?;
    model.name = origin.to_string();
    if checkpoint.tensors.is_empty() {
        notes.push("no safetensors checkpoint in the folder: built from config.json alone".into());
        let mut model = hf::from_config(&config, ImportOptions { naming })?;
        model.name = origin.to_string();
        model.notes.extend(notes);
        return Ok(model);
    }
    let quant = QuantConfig::new(quantization.clone());
    let config_dtype = model.dtype;
    let floats = float_parameters(&model);
    let report = Overlay::new(&model, &quant).apply(&mut model, &checkpoint);
    record_float_forms(&mut model, &floats, &report);
    model.quantization = quantization;
    if !checkpoint.names_only()
        && let Some(dtype) = dominant_float_dtype(&model.root)
    {
        model.dtype = dtype;
        // Buffers made in the default dtype are held in the load dtype, whatever a checkpoint
        // that stores them says (a persistent one is cast to it on load).
        model.root.visit_mut(&mut |module| {
            let buffers = module.tensors.iter_mut().filter(|t| matches!(t.kind, TensorKind::Buffer { .. }));
            for tensor in buffers.filter(|t| t.takes_load_dtype()) {
                tensor.dtype = dtype;
            }
        });
        if dtype != config_dtype {
            notes.push(format!(
                "the checkpoint stores its floating-point parameters as {dtype}; config.json says \
                 {config_dtype}"
            ));
        }
    }
    notes.extend(report.notes(&checkpoint, &quant));
    notes.extend(size_notes(&model, &checkpoint, &report));
    model.notes.extend(notes);
    summary::validate(&model, origin)?;
    Ok(model)
}

/// The naming a checkpoint's MoE tensors reveal: per-expert modules (`experts.3.w1`) are 4.x,
/// fused 3-D experts (`experts.gate_up_proj`) 5.x; `None` for dense models.
pub(super) fn detect_naming<'a>(names: impl Iterator<Item = &'a str>) -> Option<Naming> {
    for name in names {
        let mut parts = name.split('.').peekable();
        while let Some(part) = parts.next() {
            if part != "experts" {
                continue;
            }
            match parts.peek() {
                Some(next) if names::is_index(next) => return Some(Naming::V4),
                Some(&"gate_up_proj" | &"down_proj" | &"gate_proj" | &"up_proj") => return Some(Naming::V5),
                _ => {}
            }
        }
    }
    None
}

/// The floating-point dtype holding the most parameters.
fn dominant_float_dtype(root: &Module) -> Option<DType> {
    let mut params: BTreeMap<DType, u64> = BTreeMap::new();
    root.visit(&mut |m| {
        for t in &m.tensors {
            if t.kind == TensorKind::Parameter && t.dtype.is_float() && t.tied_to.is_none() {
                *params.entry(t.dtype).or_default() += t.numel();
            }
        }
    });
    params.into_iter().max_by_key(|(_, n)| *n).map(|(d, _)| d)
}

/// What the overlay did, for the notes.
#[derive(Debug, Default)]
struct Report {
    /// Checkpoint tensors with no place in the tree (and their bytes, when known).
    unmatched: Vec<(String, Option<u64>)>,
    /// Tensors whose checkpoint shape differs: (name, config shape, checkpoint shape).
    reshaped: Vec<(String, Vec<u64>, Vec<u64>)>,
    /// Quantized weights: (stored dtype, values per element) → count.
    packed: BTreeMap<(DType, u32), usize>,
    /// Quantization constants added.
    constants: usize,
    /// Quantization tensors named by the index whose size is unknown without headers.
    unknown_sizes: Vec<String>,
    /// Packed weights whose stored size does not divide the config's parameter count.
    odd_packing: Vec<String>,
    /// Packed weights that replaced a floating-point parameter: full path and that parameter.
    replaced: Vec<(String, FloatForm)>,
}

struct Overlay<'q> {
    quant: &'q QuantConfig,
    tensor_paths: HashSet<String>,
    module_paths: HashSet<String>,
    /// The config's shape of every floating-point parameter, by full path.
    floats: HashMap<String, Vec<u64>>,
}

/// The shape of every floating-point parameter of the config's tree, by full path.
fn float_parameters(model: &ModelDescription) -> HashMap<String, Vec<u64>> {
    model
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.kind == TensorKind::Parameter && t.dtype.is_float())
        .map(|(path, t)| (path, t.shape.clone()))
        .collect()
}

/// Records, for every weight the checkpoint stores quantized, the floating-point parameter of the
/// config's tree it stands for: packed weights that replaced one, and parameters the headers
/// give an integer or fp8 type.
fn record_float_forms(model: &mut ModelDescription, floats: &HashMap<String, Vec<u64>>, report: &Report) {
    let mut forms: Vec<(String, FloatForm)> = report.replaced.clone();
    for (path, tensor) in model.tensors() {
        let Some(shape) = floats.get(&path) else { continue };
        let stored_quantized = matches!(tensor.kind, TensorKind::PackedParameter { .. })
            || (tensor.kind == TensorKind::Parameter && tensor.dtype.bits() < 16)
            || !tensor.dtype.is_float();
        if stored_quantized && tensor.tied_to.is_none() {
            forms.push((path.clone(), FloatForm { name: tensor.name.clone(), shape: shape.clone() }));
        }
    }
    model.float_forms.extend(forms);
}

impl<'q> Overlay<'q> {
    fn new(model: &ModelDescription, quant: &'q QuantConfig) -> Overlay<'q> {
        let tensor_paths = model.tensors().into_iter().map(|(path, _)| path).collect();
        let mut module_paths = HashSet::new();
        model.root.visit(&mut |m| {
            module_paths.insert(m.path.clone());
        });
        Overlay { quant, tensor_paths, module_paths, floats: float_parameters(model) }
    }

    fn apply(&self, model: &mut ModelDescription, checkpoint: &Checkpoint) -> Report {
        let mut report = Report::default();
        for (name, stored) in &checkpoint.tensors {
            if self.tensor_paths.contains(name) {
                if let Some(stored) = stored
                    && let Some(tensor) = model.root.tensor_mut(name)
                {
                    overlay_tensor(name, tensor, stored, &mut report);
                }
                continue;
            }
            let (module_path, tensor_name) = names::split(name);
            let module = match quant::role(tensor_name) {
                Some(role) if self.module_paths.contains(module_path) => {
                    model.root.find_mut(module_path).map(|module| (role, module))
                }
                _ => None,
            };
            match module {
                Some((role, module)) => {
                    self.add_quantized(module, name, tensor_name, role, stored.as_ref(), &mut report)
                }
                None => report.unmatched.push((name.clone(), stored.as_ref().map(StoredTensor::bytes))),
            }
        }
        report
    }

    /// Adds a quantized weight or constant of the checkpoint to `module`.
    fn add_quantized(
        &self,
        module: &mut Module,
        full_name: &str,
        tensor_name: &str,
        role: Role,
        stored: Option<&StoredTensor>,
        report: &mut Report,
    ) {
        // The floating-point parameter this tensor stores or belongs to.
        let replaced = quant::replaces(tensor_name);
        let belongs_to = if role == Role::Constant && tensor_name.ends_with("_scales") {
            tensor_name.strip_suffix("_scales").unwrap_or("weight")
        } else {
            replaced
        };
        let config_weight = self.floats.get(&join(&module.path, belongs_to));
        let formula = || self.quant.stored_shape(tensor_name, config_weight?);
        let Some(stored) = stored.cloned().or_else(formula) else {
            report.unknown_sizes.push(full_name.to_string());
            return;
        };
        match role {
            Role::PackedWeight => {
                let logical: Option<u64> = config_weight.map(|s| s.iter().product());
                let numel = stored.numel();
                let per_element = match logical {
                    Some(l) if numel > 0 && l % numel == 0 && l / numel <= u64::from(u32::MAX) => {
                        (l / numel) as u32
                    }
                    _ => {
                        report.odd_packing.push(full_name.to_string());
                        self.quant.per_element(stored.dtype)
                    }
                };
                let packed = Tensor {
                    kind: TensorKind::PackedParameter { per_element },
                    follows_load_dtype: false,
                    ..Tensor::parameter(tensor_name, &stored.shape, stored.dtype)
                };
                match module.tensors.iter().position(|t| t.name == replaced) {
                    Some(index) => {
                        let float = module.tensors.remove(index);
                        report.replaced.push((
                            full_name.to_string(),
                            FloatForm { name: float.name, shape: float.shape },
                        ));
                        module.tensors.insert(index, packed);
                    }
                    None => module.tensors.push(packed),
                }
                *report.packed.entry((stored.dtype, per_element)).or_default() += 1;
            }
            Role::Constant => {
                if tensor_name == "weight_scale_inv"
                    && let Some(fp8) = self.quant.fp8_weight_dtype()
                    && let Some(weight) = module.tensors.iter_mut().find(|t| t.name == "weight")
                    && weight.dtype.is_float()
                    && weight.dtype.bits() > 8
                {
                    // Index only: the weight's dtype comes from the quantization config.
                    weight.dtype = fp8;
                }
                report.constants += 1;
                module.tensors.push(Tensor::constant(tensor_name, &stored.shape, stored.dtype));
            }
        }
    }
}

/// Gives a tree tensor the checkpoint's dtype and shape. An integer tensor standing for a float
/// parameter is a quantized weight: int8 when the element counts agree, packed otherwise
/// (bitsandbytes 4-bit: two values per byte).
fn overlay_tensor(name: &str, tensor: &mut Tensor, stored: &StoredTensor, report: &mut Report) {
    let integer = !stored.dtype.is_float() && stored.dtype != DType::F8E8M0;
    if tensor.kind == TensorKind::Parameter && tensor.dtype.is_float() && integer {
        let (logical, numel) = (tensor.numel(), stored.numel());
        if numel > 0 && logical != numel && logical % numel == 0 && logical / numel <= u64::from(u32::MAX) {
            let per_element = (logical / numel) as u32;
            tensor.kind = TensorKind::PackedParameter { per_element };
            *report.packed.entry((stored.dtype, per_element)).or_default() += 1;
        } else if logical == numel {
            *report.packed.entry((stored.dtype, 1)).or_default() += 1;
        }
    }
    let packed = matches!(tensor.kind, TensorKind::PackedParameter { .. });
    if tensor.shape != stored.shape && !packed && tensor.numel() != 0 {
        report.reshaped.push((name.to_string(), tensor.shape.clone(), stored.shape.clone()));
    }
    tensor.shape = stored.shape.clone();
    tensor.dtype = stored.dtype;
}

impl Report {
    fn notes(&self, checkpoint: &Checkpoint, quant: &QuantConfig) -> Vec<String> {
        let mut notes = Vec::new();
        let count = checkpoint.tensors.len();
        notes.push(if checkpoint.names_only() {
            format!(
                "checkpoint: {count} tensor names from the index (no shard files in the folder); dtypes \
                 and shapes come from config.json"
            )
        } else {
            format!(
                "checkpoint: {count} tensors, dtypes and shapes from {} shard headers",
                checkpoint.shards_read
            )
        });
        if !self.packed.is_empty() || self.constants > 0 {
            let kinds: Vec<String> = self
                .packed
                .iter()
                .map(|((dtype, per), n)| match per {
                    1 => format!("{n} {dtype} weights"),
                    _ => format!("{n} {dtype} weights packing {per} values each"),
                })
                .collect();
            let method = quant.describe().map(|m| format!(" ({m})")).unwrap_or_default();
            notes.push(format!(
                "quantized checkpoint{method}: {}; {} quantization constants",
                if kinds.is_empty() { "no packed weights".to_string() } else { kinds.join(", ") },
                self.constants
            ));
        }
        if !self.unmatched.is_empty() {
            notes.push(format!(
                "{} checkpoint tensors have no place in the tree config.json builds: {}",
                self.unmatched.len(),
                names::summarize(self.unmatched.iter().map(|(n, _)| n.as_str()), 8)
            ));
        }
        if !self.reshaped.is_empty() {
            let shown: Vec<String> = self
                .reshaped
                .iter()
                .take(3)
                .map(|(n, c, s)| format!("`{n}` config {c:?}, checkpoint {s:?}"))
                .collect();
            notes.push(format!(
                "{} tensors have another shape in the checkpoint than config.json gives (the \
                 checkpoint's is used): {}{}",
                self.reshaped.len(),
                shown.join("; "),
                if self.reshaped.len() > 3 { "; …" } else { "" }
            ));
        }
        if !self.unknown_sizes.is_empty() {
            notes.push(format!(
                "{} quantization tensors have no known size without the shard files and are not \
                 counted: {}",
                self.unknown_sizes.len(),
                names::summarize(self.unknown_sizes.iter().map(String::as_str), 6)
            ));
        }
        if !self.odd_packing.is_empty() {
            notes.push(format!(
                "{} packed weights do not divide the config's parameter count; counted as {}-bit \
                 values: {}",
                self.odd_packing.len(),
                quant.bits(),
                names::summarize(self.odd_packing.iter().map(String::as_str), 4)
            ));
        }
        notes
    }
}

/// Notes on tree tensors the checkpoint lacks, and on bytes against `metadata.total_size` and
/// the headers.
fn size_notes(model: &ModelDescription, checkpoint: &Checkpoint, report: &Report) -> Vec<String> {
    let mut notes = Vec::new();
    let mut lacking = Vec::new();
    let mut absent_bytes = 0u64;
    let mut absent = Vec::new();
    for (path, tensor) in model.tensors() {
        if tensor.tied_to.is_some() || checkpoint.tensors.contains_key(&path) {
            continue;
        }
        absent_bytes += tensor.bytes();
        absent.push(format!("`{path}` {} B", tensor.bytes()));
        if tensor.kind != (TensorKind::Buffer { persistent: false }) {
            lacking.push(path);
        }
    }
    if !lacking.is_empty() {
        notes.push(format!(
            "{} tensors of the tree config.json builds are not in the checkpoint: {}",
            lacking.len(),
            names::summarize(lacking.iter().map(String::as_str), 8)
        ));
    }
    let bytes = model.bytes();
    let extra_bytes = report.unmatched.iter().filter_map(|(_, b)| *b).fold(0, u64::saturating_add);
    if let Some(total) = checkpoint.total_size {
        let difference = i128::from(bytes) - i128::from(total);
        if difference == 0 {
            notes.push(format!("bytes in memory ({bytes}) equal the index's metadata.total_size"));
        } else {
            let mut why = Vec::new();
            if absent_bytes > 0 {
                let listed: Vec<&str> = absent.iter().take(4).map(String::as_str).collect();
                why.push(format!(
                    "the tree holds {absent_bytes} B the checkpoint does not store ({}{})",
                    listed.join(", "),
                    if absent.len() > 4 { ", …" } else { "" }
                ));
            }
            if extra_bytes > 0 {
                why.push(format!("the checkpoint stores {extra_bytes} B the tree does not hold"));
            }
            notes.push(format!(
                "bytes in memory ({bytes}) differ from the index's metadata.total_size ({total}) by \
                 {difference:+} B{}{}",
                if why.is_empty() { "" } else { ": " },
                why.join("; ")
            ));
        }
        let header_bytes = checkpoint.header_bytes();
        let complete = checkpoint.tensors.values().all(Option::is_some);
        if complete && header_bytes != total {
            notes.push(format!(
                "the shard headers hold {header_bytes} B of tensors but the index's total_size says {total}"
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_naming_is_read_from_expert_names() {
        let v4 = ["model.layers.0.block_sparse_moe.experts.3.w1.weight"];
        assert_eq!(detect_naming(v4.into_iter()), Some(Naming::V4));
        let v5 = ["model.layers.0.mlp.experts.gate_up_proj"];
        assert_eq!(detect_naming(v5.into_iter()), Some(Naming::V5));
        assert_eq!(detect_naming(["model.layers.0.mlp.up_proj.weight"].into_iter()), None);
    }
}
