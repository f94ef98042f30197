//! A plan in the formats runtimes read (`plan -o FILE --format F`):
//!
//! - `accelerate`: the `device_map` JSON (module → GPU index, `"cpu"` or `"disk"`) that
//!   `from_pretrained(device_map=json.load(f))` takes unchanged. No `max_memory` goes with it:
//!   transformers reads `max_memory` only for `device_map="auto"` and its kin, never beside a
//!   dict, and its GPU keys must be integers, which JSON cannot write.
//! - `llama.cpp`: the command-line flags: `-ngl` (layers on GPUs, the output layer counted as one
//!   more when every layer is on a GPU), `-ts` (slots per GPU, in order: its layers, and the
//!   output layer on the last GPU, since llama.cpp splits the `-ngl` slots with the output
//!   layer as the last), `-ot "^output\.=CUDAn"` for a GPU-held output layer while layers
//!   stay on the CPU, `-ot` (expert tensors placed elsewhere than their
//!   layer, e.g. `blk\.(3|4)\.ffn_.*_exps\.=CPU`).
//! - `expert-parallel`: per MoE experts module, the GPU of each expert.
//! - `pipeline`: per GPU its contiguous stage of layers, and DeepSpeed's `parts` boundaries.
//! - `yaml`: vramplan's own plan (model, hardware, target, workload, device map), read back by
//!   `estimate --plan` and `validate`.
//! - `vllm`, `sglang`, `deepspeed`, `fsdp`, `torchrun`: what launches the plan on that engine
//!   or launcher ([`launch`]): a shell script (`.sh`), or a config file (DeepSpeed's JSON,
//!   accelerate's FSDP YAML) with its launch script written beside it.

pub mod launch;

use crate::plan::Plan;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vramplan_profiles::InputError;
use vramplan_sim::placement::Target;
use vramplan_sim::workload::Workload;

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An accelerate `device_map` as JSON, module → GPU index, `"cpu"` or `"disk"`.
    Accelerate,
    /// llama.cpp's `-ngl`, `-ts` and `-ot` flags.
    LlamaCpp,
    /// The GPU of each expert, per experts module (JSON).
    ExpertParallel,
    /// Contiguous layer ranges per stage (DeepSpeed's pipeline partition).
    Pipeline,
    /// vramplan's plan file, read back by `estimate --plan`.
    Yaml,
    /// A `vllm serve` command line (`.sh`).
    Vllm,
    /// SGLang's `python -m sglang.launch_server` line(s) (`.sh`).
    Sglang,
    /// A DeepSpeed config JSON, with its `torchrun` lines beside it.
    DeepSpeed,
    /// An accelerate FSDP config YAML, with its `accelerate launch` lines beside it.
    Fsdp,
    /// `torchrun` lines for DDP, one per node (`.sh`).
    Torchrun,
}

impl Format {
    /// Reads a `--format` value.
    pub fn parse(text: &str) -> Result<Format, InputError> {
        Ok(match text.trim().to_ascii_lowercase().as_str() {
            "accelerate" | "json" => Format::Accelerate,
            "llama.cpp" | "llamacpp" | "llama-cpp" => Format::LlamaCpp,
            "expert-parallel" => Format::ExpertParallel,
            "pipeline" | "deepspeed-pipeline" => Format::Pipeline,
            "yaml" | "yml" => Format::Yaml,
            "vllm" => Format::Vllm,
            "sglang" => Format::Sglang,
            "deepspeed" => Format::DeepSpeed,
            "fsdp" | "accelerate-fsdp" => Format::Fsdp,
            "torchrun" | "ddp" => Format::Torchrun,
            other => {
                return Err(InputError::new("--format", format!("unknown format `{other}`")).with_fix(
                    "use one of accelerate, llama.cpp, expert-parallel, pipeline, yaml, vllm, sglang, deepspeed, fsdp, torchrun",
                ));
            }
        })
    }

    /// The format a file name implies (`.yaml` → yaml; `.sh` → the launch of the workload:
    /// torchrun for training, `vllm serve` under `--engine vllm`), else the target's own.
    /// The FSDP config is YAML too, so it is asked for by `--format fsdp`, never by extension.
    pub fn for_output(path: &str, plan: &Plan, workload: &Workload) -> Format {
        if path.ends_with(".yaml") || path.ends_with(".yml") {
            return Format::Yaml;
        }
        if path.ends_with(".sh") {
            if workload.mode == vramplan_sim::workload::Mode::Train {
                return Format::Torchrun;
            }
            match launch::engine_kind(workload).0.as_str() {
                "vllm" => return Format::Vllm,
                "sglang" => return Format::Sglang,
                _ => {} // llama.cpp's flags, or the target's own
            }
        }
        match plan.target {
            crate::Runtime::LlamaCpp => Format::LlamaCpp,
            crate::Runtime::ExpertParallel => Format::ExpertParallel,
            crate::Runtime::Pipeline => Format::Pipeline,
            _ => Format::Accelerate,
        }
    }
}

/// vramplan's plan file: what `estimate --plan` and `validate` read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    /// The schema version.
    pub vramplan_plan: u32,
    /// The model as given to `plan` (a built-in name or a path).
    pub model: String,
    /// The hardware as given to `plan` (a profile name, short form or path).
    pub hardware: String,
    /// The target runtime the map was made for (`accelerate`, `llama.cpp`, …).
    pub target: String,
    /// The workload the plan was made for.
    pub workload: Workload,
    /// Module → device: a GPU index, `cpu` or `disk`, in the order written.
    pub device_map: DeviceMapEntries,
}

/// A plan file's device map, module → device, in the order written: the order is part of the
/// map, since accelerate's `dispatch_model` runs the modules offloaded to `cpu` or `disk` on the
/// first GPU the map lists. Read and written as a mapping, kept as pairs (a name listed twice
/// is kept twice; [`PlanFile::entries`] hands both on, and the map is read with Python's dict
/// semantics downstream).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceMapEntries(pub Vec<(String, PlanTarget)>);

impl Serialize for DeviceMapEntries {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::plan::ordered_map(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for DeviceMapEntries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = DeviceMapEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping of module names to devices (a GPU index, `cpu` or `disk`)")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, PlanTarget>()? {
                    pairs.push(pair);
                }
                Ok(DeviceMapEntries(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

/// A device in a plan file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PlanTarget {
    /// A GPU index.
    Gpu(u32),
    /// `cpu` or `disk` (or any device spelling, read with `Target::parse`).
    Host(String),
}

impl PlanTarget {
    /// How a plan file writes `target`.
    pub fn of(target: Target) -> PlanTarget {
        match target {
            Target::Gpu(g) => PlanTarget::Gpu(g),
            Target::Cpu => PlanTarget::Host("cpu".into()),
            Target::Disk => PlanTarget::Host("disk".into()),
        }
    }
}

impl Format {
    /// Whether the format launches the plan (a command line or a launcher's config) rather than
    /// placing modules: these are written for data-parallel plans too, which have no map.
    pub fn launches(self) -> bool {
        matches!(self, Format::Vllm | Format::Sglang | Format::DeepSpeed | Format::Fsdp | Format::Torchrun)
    }
}

/// One export: the document to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The document, as written.
    pub text: String,
    /// The launch script written beside a config file (`ds.json` → `ds.sh`, see
    /// [`launch_path`]): DeepSpeed's and accelerate's launch lines.
    pub launch: Option<String>,
    /// The command each node runs, in node order (in the export or in `launch`); empty for an
    /// export that launches nothing (a device map, flags, a plan file).
    pub commands: Vec<String>,
}

/// Where the launch script beside the export `path` goes: the same name with `.sh` in place
/// of its extension (`ds_config.json` → `ds_config.sh`), or `.launch.sh` added where that is the
/// export itself.
pub fn launch_path(path: &std::path::Path) -> std::path::PathBuf {
    let sibling = path.with_extension("sh");
    if sibling == path {
        let mut name = path.as_os_str().to_owned();
        name.push(".launch.sh");
        return name.into();
    }
    sibling
}

/// What an export is made from beside the plan: the inputs as given (written into the YAML
/// plan) and what the launch exports need.
#[derive(Debug, Clone)]
pub struct Source<'a> {
    /// The model as given to `plan` (a built-in name or a path).
    pub model: &'a str,
    /// The hardware as given to `plan`.
    pub hardware: &'a str,
    /// The file name the export is written as (a launch script refers to its config by it).
    pub file: &'a str,
    /// The launch exports' view: the model's source, the GPUs per node, the workload.
    pub launch: launch::Launch<'a>,
}

/// Renders `plan` in `format`, from `source`.
pub fn export(plan: &Plan, format: Format, source: &Source) -> Result<Export, InputError> {
    if !plan.feasible {
        return Err(InputError::new("-o", "the plan does not fit; there is nothing to export")
            .with_fix("apply one of the remedies printed above and plan again"));
    }
    let (model, hardware, workload) = (source.model, source.hardware, source.launch.workload);
    let plan_gpus = {
        let mut gpus: Vec<u32> = plan
            .device_map
            .iter()
            .filter_map(|(_, t)| if let Target::Gpu(g) = t { Some(*g) } else { None })
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus.len()
    };
    let config_name = std::path::Path::new(source.file)
        .file_name()
        .map_or_else(|| source.file.to_string(), |n| n.to_string_lossy().into_owned());
    let text = match format {
        Format::Vllm => return launch::vllm(&source.launch, plan_gpus),
        Format::Sglang => return launch::sglang(&source.launch, plan_gpus),
        Format::DeepSpeed => return launch::deepspeed(&source.launch, &config_name),
        Format::Fsdp => return launch::fsdp(&source.launch, &config_name),
        Format::Torchrun => return launch::torchrun(&source.launch),
        Format::Accelerate => {
            serde_json::to_string_pretty(&InOrder(&plan.device_map)).unwrap_or_default() + "\n"
        }
        Format::LlamaCpp => llamacpp_flags(plan)?,
        Format::ExpertParallel => {
            if plan.experts.is_empty() {
                return Err(not_for(plan, "expert-parallel", "a plan made with `--target expert-parallel`"));
            }
            serde_json::to_string_pretty(&plan.experts).unwrap_or_default() + "\n"
        }
        Format::Pipeline => pipeline(plan)?,
        Format::Yaml => {
            let file = PlanFile {
                vramplan_plan: PLAN_VERSION,
                model: model.to_string(),
                hardware: hardware.to_string(),
                target: plan.target.name().to_string(),
                workload: workload.clone(),
                device_map: DeviceMapEntries(
                    plan.device_map.iter().map(|(k, t)| (k.clone(), PlanTarget::of(*t))).collect(),
                ),
            };
            serde_saphyr::to_string(&file)
                .map_err(|e| InputError::new("-o", format!("cannot write YAML: {e}")))?
        }
    };
    Ok(Export { text, launch: None, commands: Vec::new() })
}

/// Pairs written as a JSON object in their order (a device map in model order; a [`Target`]
/// serializes as accelerate writes a device).
struct InOrder<'a, V>(&'a [(String, V)]);

impl<V: Serialize> Serialize for InOrder<'_, V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::plan::ordered_map(self.0, serializer)
    }
}

fn not_for(plan: &Plan, format: &str, needs: &str) -> InputError {
    InputError::new("--format", format!("a {} plan cannot be written as {format}", plan.target.name()))
        .with_fix(format!("the {format} format needs {needs}"))
}

/// llama.cpp flags from a `--target llama.cpp` plan.
fn llamacpp_flags(plan: &Plan) -> Result<String, InputError> {
    let mut layer_tier: BTreeMap<u32, Target> = BTreeMap::new();
    let mut expert_tier: BTreeMap<u32, Target> = BTreeMap::new();
    let mut output = None;
    for (name, tier) in &plan.device_map {
        if name == "output" {
            output = Some(*tier);
        } else if let Some(rest) = name.strip_prefix("blk.") {
            let (index, experts) = match rest.split_once('.') {
                Some((i, _)) => (i, true),
                None => (rest, false),
            };
            let Ok(index) = index.parse::<u32>() else { continue };
            if experts {
                expert_tier.insert(index, *tier);
            } else {
                layer_tier.insert(index, *tier);
            }
        }
    }
    if layer_tier.is_empty() {
        return Err(not_for(plan, "llama.cpp", "a plan made with `--target llama.cpp`"));
    }
    let gpus: Vec<u32> = {
        let mut g: Vec<u32> = layer_tier
            .values()
            .filter_map(|t| if let Target::Gpu(g) = t { Some(*g) } else { None })
            .collect();
        g.sort_unstable();
        g.dedup();
        g
    };
    // llama.cpp's rule (`llama_model::load_tensors`): `-ngl N` puts the last N of the
    // `n_layer + 1` slots (the layers, then the output layer) on GPUs, split over them in
    // proportion to `-ts`. So the output layer is on a GPU only when every layer is
    // (`-ngl n_layer + 1`), and then it is a slot of its own on the last GPU; with layers left
    // on the CPU, a GPU-held output layer is moved there by `-ot`.
    let mut per_gpu = vec![0u32; gpus.last().map_or(0, |g| *g as usize + 1)];
    for t in layer_tier.values() {
        if let Target::Gpu(g) = t {
            per_gpu[*g as usize] += 1;
        }
    }
    let all_layers_on_gpus = layer_tier.values().all(|t| matches!(t, Target::Gpu(_)));
    let mut output_override = None;
    if let Some(Target::Gpu(g)) = output {
        if all_layers_on_gpus {
            if per_gpu.len() <= g as usize {
                per_gpu.resize(g as usize + 1, 0);
            }
            per_gpu[g as usize] += 1;
        } else {
            output_override = Some(g);
        }
    }
    let on_gpu: u32 = per_gpu.iter().sum();
    let mut flags = format!("-ngl {on_gpu}");
    if per_gpu.len() > 1 {
        let split: Vec<String> = per_gpu.iter().map(u32::to_string).collect();
        flags += &format!(" -ts {}", split.join(","));
    }
    if let Some(g) = output_override {
        // Anchored: `output\.` alone would match every `blk.N.attn_output.weight`.
        flags += &format!(" -ot \"^output\\.=CUDA{g}\"");
    }
    // Expert tensors placed elsewhere than their layer, grouped by where they go.
    let mut moved: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (layer, tier) in &expert_tier {
        if layer_tier.get(layer) != Some(tier) {
            let buffer = match tier {
                Target::Gpu(g) => format!("CUDA{g}"),
                _ => "CPU".into(),
            };
            moved.entry(buffer).or_default().push(*layer);
        }
    }
    for (buffer, layers) in moved {
        let list: Vec<String> = layers.iter().map(u32::to_string).collect();
        flags += &format!(" -ot \"blk\\.({})\\.ffn_.*_exps\\.={buffer}\"", list.join("|"));
    }
    Ok(flags + "\n")
}

/// Pipeline stages from an ordered plan: per GPU its first and last block, and DeepSpeed's
/// `parts` (the block index each stage starts at, then the block count).
fn pipeline(plan: &Plan) -> Result<String, InputError> {
    let mut stages: Vec<(u32, u32, u32)> = Vec::new(); // (gpu, first, last)
    let mut block = 0u32;
    for (name, tier) in &plan.device_map {
        let is_block = name.rsplit('.').next().is_some_and(|last| last.parse::<u32>().is_ok());
        if !is_block {
            continue;
        }
        let Target::Gpu(g) = tier else {
            return Err(not_for(plan, "pipeline", "every layer on a GPU"));
        };
        match stages.last_mut() {
            Some((gpu, _, last)) if gpu == g => *last = block,
            _ => stages.push((*g, block, block)),
        }
        block += 1;
    }
    if stages.is_empty() {
        return Err(not_for(plan, "pipeline", "a plan that places decoder layers"));
    }
    let mut parts: Vec<u32> = stages.iter().map(|s| s.1).collect();
    parts.push(block);
    let stages_json: Vec<serde_json::Value> = stages
        .iter()
        .map(|(gpu, first, last)| serde_json::json!({"gpu": gpu, "first_layer": first, "last_layer": last}))
        .collect();
    let doc = serde_json::json!({"stages": stages_json, "parts": parts});
    Ok(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n")
}

/// The plan file versions this vramplan reads.
pub const PLAN_VERSION: u32 = 1;

/// Reads a plan file written by `plan -o FILE.yaml`; a version other than [`PLAN_VERSION`] is
/// refused before the rest is read (a later version may have keys this one does not know).
pub fn read_plan_file(path: &std::path::Path) -> Result<PlanFile, InputError> {
    let text = vramplan_profiles::files::read_text(path, vramplan_profiles::files::FileKind::Plan)
        .map_err(|e| e.with_fix("give the YAML file `vramplan plan -o plan.yaml` wrote"))?;
    let origin = path.display().to_string();
    let rewrite = "write the plan again with this vramplan: `vramplan plan MODEL --hardware HW -o plan.yaml`";
    /// Only the version, whatever else the file holds.
    #[derive(Deserialize)]
    struct Head {
        vramplan_plan: Option<u64>,
    }
    if let Ok(head) = serde_saphyr::from_str::<Head>(&text) {
        let line = text.lines().position(|l| l.starts_with("vramplan_plan")).map_or(1, |l| l as u64 + 1);
        match head.vramplan_plan {
            None => {
                return Err(InputError::new(
                    origin,
                    "no `vramplan_plan` version: this is not a plan file written by `vramplan plan -o`",
                )
                .at_key("vramplan_plan")
                .with_fix(format!("start the file with `vramplan_plan: {PLAN_VERSION}`, or {rewrite}")));
            }
            Some(v) if v != u64::from(PLAN_VERSION) => {
                return Err(InputError::new(
                    origin,
                    format!("`vramplan_plan: {v}` is a plan format this vramplan does not read (it reads version {PLAN_VERSION})"),
                )
                .at_line(line, 1)
                .with_fix(rewrite));
            }
            Some(_) => {}
        }
    }
    let plan = serde_saphyr::from_str::<PlanFile>(&text).map_err(|e| {
        InputError::yaml(origin.clone(), &e, "plan", "a plan file has `vramplan_plan`, `model`, `hardware`, `target`, `workload` and `device_map`; write one with `vramplan plan -o plan.yaml`")
    })?;
    if let Err(e) = crate::Runtime::parse(&plan.target) {
        let line = text.lines().position(|l| l.starts_with("target:")).map_or(1, |l| l as u64 + 1);
        return Err(InputError::new(origin, e.problem).at_line(line, 1).with_fix(e.fix.unwrap_or_default()));
    }
    Ok(plan)
}

impl PlanFile {
    /// The device map as `(module, target)` entries for the simulator, on hardware with `gpus`
    /// GPUs; a device [`Target::parse`] cannot read, or
    /// a GPU past `gpus`, is refused at its key of the plan file `origin`.
    pub fn entries(&self, origin: &str, gpus: u32) -> Result<Vec<(String, Target)>, InputError> {
        self.device_map
            .0
            .iter()
            .map(|(module, target)| {
                let parsed = match target {
                    PlanTarget::Gpu(g) => Target::parse(&g.to_string(), gpus),
                    PlanTarget::Host(h) => Target::parse_string(h, gpus),
                };
                let t = parsed.map_err(|e| {
                    InputError::new(origin, format!("`{module}`: {e}"))
                        .at_key(format!("device_map.{module}"))
                        .with_fix(e.fix())
                })?;
                Ok((module.clone(), t))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan file keeps its map in the order written, not sorted: accelerate runs what a map
    /// offloads on the first GPU it lists (here GPU 0, where sorting would put `lm_head`, on
    /// GPU 1, first).
    #[test]
    fn a_plan_files_device_map_keeps_its_order() {
        let text = "vramplan_plan: 1\nmodel: gpt2\nhardware: 2xt4\ntarget: accelerate\nworkload: {}\n\
                    device_map:\n  transformer.wte: 0\n  transformer.h: cpu\n  lm_head: 1\n";
        let plan: PlanFile = serde_saphyr::from_str(text).unwrap();
        let entries = plan.entries("plan.yaml", 2).unwrap();
        let names: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["transformer.wte", "transformer.h", "lm_head"]);
        assert_eq!(vramplan_sim::Placement::as_read(&entries).main_gpu(), Some(0));
        // Written back, in the same order.
        let written = serde_saphyr::to_string(&plan).unwrap();
        let at = |name: &str| written.find(name).unwrap();
        assert!(
            at("transformer.wte") < at("transformer.h") && at("transformer.h") < at("lm_head"),
            "{written}"
        );
    }
}
