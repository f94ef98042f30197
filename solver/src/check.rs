//! The static check of a device map against a target runtime's rules: the device mismatches
//! the runtime would hit with it, each as a [`Finding`] that names the modules, the devices,
//! the error the runtime raises and the fix.
//!
//! A map is read with Python's dict semantics (a name listed twice keeps its first position and
//! its last device) and a tensor goes where its longest listed prefix says, as transformers
//! loads it. Under accelerate, modules listed on `"cpu"` or `"disk"` run on the map's first GPU
//! (`dispatch_model`'s main device), so only execution devices can mismatch. What each target
//! checks:
//!
//! | rule | accelerate, accelerate-v4 | pipeline | expert-parallel | llama.cpp |
//! |---|---|---|---|---|
//! | listed twice, uncovered | yes | yes | yes | yes |
//! | overlapping entries (accelerate's hooks; 5.x: any nesting) | yes | – | – | – |
//! | tied weights apart | yes | – (tied layers are copied to each stage) | – | – (`output` is a copy) |
//! | experts apart from their router | yes | as a split block | – (the point of it) | – |
//! | split block | yes | yes | yes, experts aside | – (ggml copies between devices) |
//!
//! Under data parallelism (DDP, ZeRO-1/2) a map must also hold one entry, the rank's GPU
//! ([`data_parallel_map`], `check/data_parallel.rs`). A training map must put nothing on `cpu`
//! or `disk` under accelerate ([`offloaded_in_training`], `check/offload_training.rs`).

mod data_parallel;
mod idle_gpus;
mod offload_training;

pub use data_parallel::data_parallel_map;
pub use idle_gpus::idle_gpus;
pub use offload_training::offloaded_in_training;

use crate::runtime::Runtime;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind};
use vramplan_profiles::suggest::{or_list, ticked};
use vramplan_sim::device_map::unplaced;
use vramplan_sim::placement::{Placement, Target, covers};

/// How many names a message lists before counting the rest.
const LISTED: usize = 4;

/// The error PyTorch raises when one operation gets tensors from two devices.
const DEVICE_ERROR: &str =
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices";

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The map lists a name twice.
    ListedTwice,
    /// State-dict tensors no entry covers: `from_pretrained` refuses the map.
    Uncovered,
    /// An entry inside another entry on another GPU: accelerate hooks the inner entry's
    /// submodules to the outer entry's GPU, while their weights load to the inner one's.
    OverlappingEntries,
    /// Tensors sharing one storage (tied embeddings) on different devices.
    TiedWeightsSplit,
    /// Routed experts on another device than their router.
    ExpertsApartFromRouter,
    /// A block the runtime keeps whole (`_no_split_modules`) spread over devices.
    SplitBlock,
    /// Data parallelism (DDP, ZeRO-1/2): a map of more than one entry, where every rank loads
    /// the model whole on its own GPU ([`data_parallel_map`]).
    DataParallelMap,
    /// Training with modules offloaded to `cpu` or `disk` under accelerate: their weights are
    /// streamed in for each forward and never updated, the HF Trainer refuses to move the model,
    /// and listed tensors of a parent stay on the CPU ([`offloaded_in_training`]).
    OffloadedInTraining,
    /// Nothing on any GPU of a profile that has GPUs: the step runs on the CPU ([`idle_gpus`]).
    GpusIdle,
}

impl Rule {
    /// The rule's name as JSON writes it (`tied-weights-split`).
    pub fn name(self) -> &'static str {
        match self {
            Rule::ListedTwice => "listed-twice",
            Rule::Uncovered => "uncovered",
            Rule::OverlappingEntries => "overlapping-entries",
            Rule::TiedWeightsSplit => "tied-weights-split",
            Rule::ExpertsApartFromRouter => "experts-apart-from-router",
            Rule::SplitBlock => "split-block",
            Rule::DataParallelMap => "data-parallel-map",
            Rule::OffloadedInTraining => "offloaded-in-training",
            Rule::GpusIdle => "gpus-idle",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One mismatch. `modules[0]` is the anchor where there is one (the router, the block, the
/// canonical tied module, the inner entry) and `devices[0]` its device; the modules after it
/// are those to move, the devices after it the other devices involved. `uncovered` lists the
/// largest unplaced modules and no device; `listed-twice` the name and its devices in file order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which rule the map breaks.
    pub rule: Rule,
    /// The modules involved (see above for their order).
    pub modules: Vec<String>,
    /// `GPU 0`, `cpu`, `disk`.
    pub devices: Vec<String>,
    /// What the runtime does with the map, the error it raises, and the fix.
    pub message: String,
}

/// Every static rule a map of `model` meets under `runtime` for `workload` on a profile of
/// `gpus` GPUs: the runtime's device rules ([`check_device_map`]), a data-parallel run's
/// ([`data_parallel_map`]), a training step's ([`offloaded_in_training`]) and the idle GPUs
/// ([`idle_gpus`]). What `check`, `validate` and `report` run.
pub fn map_findings(
    model: &ModelDescription,
    entries: &[(String, Target)],
    runtime: Runtime,
    workload: &vramplan_sim::workload::Workload,
    gpus: usize,
) -> Vec<Finding> {
    let mut findings = check_device_map(model, entries, runtime);
    if vramplan_sim::estimate::is_data_parallel(workload) {
        findings.extend(data_parallel_map(entries, gpus));
    }
    findings.extend(offloaded_in_training(model, entries, runtime, workload));
    findings.extend(idle_gpus(entries, gpus));
    findings
}

/// Checks the device map `entries` (in file order, repeats kept) of `model` against the rules
/// of `runtime`. Names must be modules or tensors of `model` (as
/// [`vramplan_sim::device_map::read_device_map`] ensures); others cover nothing.
pub fn check_device_map(
    model: &ModelDescription,
    entries: &[(String, Target)],
    runtime: Runtime,
) -> Vec<Finding> {
    let map = Map::new(model, entries, runtime);
    let accelerate = matches!(runtime, Runtime::Accelerate | Runtime::AccelerateV4);
    let mut findings = listed_twice(entries);
    findings.extend(uncovered(&map));
    if runtime == Runtime::LlamaCpp {
        return findings;
    }
    let mut split = Vec::new();
    let mut explained = Vec::new();
    if accelerate {
        findings.extend(tied_weights(&map));
        for (finding, block) in experts_apart(&map) {
            explained.extend(finding.modules.iter().skip(1).cloned());
            split.push(block);
            findings.push(finding);
        }
    }
    let mut blocks = Vec::new();
    split_blocks(&map, runtime, &model.root, &explained, &mut blocks);
    for (finding, block) in blocks {
        split.push(block);
        findings.push(finding);
    }
    if accelerate {
        findings.extend(overlapping_entries(&map, &split));
    }
    // A parent listed beside its children on the same device is no finding: transformers 5.24
    // and 4.57 load such maps whole and run them (recorded, fixtures/reference/nested).
    findings
}

/// The map as the runtime reads it.
struct Map<'a> {
    model: &'a ModelDescription,
    /// The entries with Python's dict semantics: first position, last device.
    entries: Vec<(String, Target)>,
    placement: Placement,
    /// Per entry of `entries`: a tensor's own entry that places nothing at run time
    /// ([`overridden_entries`]).
    overridden: Vec<bool>,
    /// Where accelerate runs modules offloaded to cpu or disk: the map's first GPU.
    main: Target,
    runtime: Runtime,
}

impl<'a> Map<'a> {
    fn new(model: &'a ModelDescription, written: &[(String, Target)], runtime: Runtime) -> Map<'a> {
        let placement = Placement::as_read(written);
        let entries = placement.entries().to_vec();
        let main = placement.main_gpu().map_or(Target::Cpu, Target::Gpu);
        let overridden = if matches!(runtime, Runtime::Accelerate | Runtime::AccelerateV4) {
            overridden_entries(model, &entries)
        } else {
            vec![false; entries.len()]
        };
        Map { model, entries, placement, overridden, main, runtime }
    }

    /// Where the tensor or module at `path` runs: the GPU of the entry that places it at run
    /// time ([`longest_entry`]), or the main device for an offloaded one; `None` when no entry
    /// covers it.
    fn runs_on(&self, path: &str) -> Option<Target> {
        longest_entry(self, path).map(|i| self.execution(self.entries[i].1))
    }

    fn execution(&self, target: Target) -> Target {
        match target {
            Target::Gpu(_) => target,
            Target::Cpu | Target::Disk => self.main,
        }
    }

    /// ` (accelerate runs the modules offloaded to cpu or disk on GPU 0, …)` when the map
    /// offloads any under accelerate.
    fn offload_note(&self) -> String {
        let accelerate = matches!(self.runtime, Runtime::Accelerate | Runtime::AccelerateV4);
        let offloads = self.entries.iter().any(|(_, t)| !matches!(t, Target::Gpu(_)));
        if accelerate && offloads && matches!(self.main, Target::Gpu(_)) {
            format!(
                " (accelerate runs the modules offloaded to cpu or disk on {}, the map's first GPU)",
                label(self.main)
            )
        } else {
            String::new()
        }
    }
}

fn listed_twice(entries: &[(String, Target)]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (i, (key, _)) in entries.iter().enumerate() {
        if entries[..i].iter().any(|(k, _)| k == key) {
            continue;
        }
        let targets: Vec<Target> = entries.iter().filter(|(k, _)| k == key).map(|(_, t)| *t).collect();
        let (Some(first), Some(last)) = (targets.first(), targets.last()) else { continue };
        if targets.len() < 2 {
            continue;
        }
        let devices: Vec<String> = targets.iter().map(|t| label(*t)).collect();
        let name = shown(key);
        let times = if targets.len() == 2 { "twice".to_string() } else { format!("{} times", targets.len()) };
        let message = if targets.iter().all(|t| t == first) {
            format!(
                "{name} is listed {times}, each time on {}. Python's `json.load` keeps the last entry, so as \
                 it stands nothing changes, but an edit to any other entry for it would be silently ignored. \
                 Fix: delete all but one entry for {name}.",
                label(*first)
            )
        } else {
            format!(
                "{name} is listed {times}, on {}. Python's `json.load` keeps the last entry, so transformers \
                 puts {name} on {} and silently ignores the others. Fix: keep one entry for {name}, on the \
                 device you mean.",
                devices.join(", then "),
                label(*last)
            )
        };
        findings.push(Finding { rule: Rule::ListedTwice, modules: vec![key.clone()], devices, message });
    }
    findings
}

fn uncovered(map: &Map) -> Option<Finding> {
    let missing = unplaced(map.model, &map.placement);
    let first = missing.modules.first()?.clone();
    let examples: Vec<&str> = missing.tensors.iter().take(3).map(String::as_str).collect();
    // Suggest the device of what comes just before it (or after it) in the model, so that the
    // layers stay in order.
    let tensors = map.model.tensors();
    // A tied tensor goes with its storage.
    let start = tensors.iter().position(|(path, _)| covers(&first, path)).unwrap_or(0);
    let tied = tensors[start..]
        .iter()
        .take_while(|(path, _)| covers(&first, path))
        .find_map(|(_, t)| map.placement.target_of(t.tied_to.as_deref()?));
    let before = || tensors[..start].iter().rev().find_map(|(path, _)| map.placement.target_of(path));
    let after = || tensors[start..].iter().find_map(|(path, _)| map.placement.target_of(path));
    let device = tied.or_else(before).or_else(after).unwrap_or(Target::Gpu(0));
    let count = missing.tensors.len();
    let message = format!(
        "{count} tensor{} of {} {} on no device ({}{}), so `from_pretrained` refuses the map: \
         `ValueError: The device_map provided does not give any device for the following parameters: {}`. \
         Fix: add entries for {}, e.g. `\"{first}\": {}`.",
        plural(count),
        map.model.name,
        if count == 1 { "is" } else { "are" },
        ticked(&examples),
        if count > examples.len() { ", …" } else { "" },
        examples.join(", ") + if count > examples.len() { ", …" } else { "" },
        ticked_list(&missing.modules),
        json_device(device),
    );
    Some(Finding { rule: Rule::Uncovered, modules: missing.modules, devices: Vec::new(), message })
}

/// Tied groups whose tensors the map puts on different GPUs (as written, which is what
/// accelerate's `check_tied_parameters_on_same_device` compares). A name on `cpu` or `disk` is
/// offloaded: its module runs on the main GPU with a streamed copy, and `retie_parameters` keeps
/// the storage of the first name in sorted order that is not on `meta`, so only names on
/// different GPUs meet (recorded: the Llama head on `cpu` beside its embedding on GPU 0
/// completes, in training and inference).
fn tied_weights(map: &Map) -> Vec<Finding> {
    let mut findings = Vec::new();
    for group in map.model.tied_groups() {
        let placed: Vec<(&str, Target)> = group
            .iter()
            .filter_map(|path| Some((module_of(path), map.placement.target_of(path)?)))
            .filter(|(_, t)| matches!(t, Target::Gpu(_)))
            .collect();
        let Some(&(anchor, anchor_device)) = placed.first() else { continue };
        let apart: Vec<(&str, Target)> =
            placed.iter().copied().filter(|(_, t)| *t != anchor_device).collect();
        if apart.is_empty() {
            continue;
        }
        let mut modules = vec![anchor.to_string()];
        modules.extend(apart.iter().map(|(m, _)| m.to_string()));
        let mut devices = vec![label(anchor_device)];
        for (_, t) in &apart {
            if !devices.contains(&label(*t)) {
                devices.push(label(*t));
            }
        }
        let others: Vec<String> = apart.iter().map(|(m, t)| format!("`{m}` on {}", label(*t))).collect();
        let moves: Vec<String> =
            apart.iter().map(|(m, _)| format!("`\"{m}\": {}`", json_device(anchor_device))).collect();
        // accelerate's `retie_parameters` points every name of the group at the parameter of the
        // first name in sorted order (accelerate 1.15, recorded in fixtures/reference/mismatches:
        // `lm_head.weight` keeps the storage, so the embedding is the module that fails).
        let keeper = group
            .iter()
            .filter_map(|path| Some((path.as_str(), map.placement.target_of(path)?)))
            .filter(|(_, t)| matches!(t, Target::Gpu(_)))
            .min_by(|a, b| a.0.cmp(b.0));
        let (keeper_path, keeper_device) = keeper.unwrap_or((anchor, anchor_device));
        let failing: Vec<(&str, Target)> =
            placed.iter().copied().filter(|(_, t)| *t != keeper_device).collect();
        let fails = match failing.first() {
            Some(&(m, t)) => format!("`{m}` on {} meets it on {}", label(t), label(keeper_device)),
            None => "a module meets it on another device".to_string(),
        };
        let message = format!(
            "{} share one storage (tied weights), but the map puts `{anchor}` on {} and {}. accelerate warns \
             \"Tied parameters are on different devices\" and keeps the one storage where `{keeper_path}` is \
             (the group's first name in sorted order), so {fails}: `{DEVICE_ERROR}{}`. Fix: put {} with \
             `{anchor}`: {}.",
            ticked(&group.iter().map(String::as_str).collect::<Vec<_>>()),
            label(anchor_device),
            others.join(", "),
            match (failing.first().map(|f| f.1), keeper_device) {
                (Some(t @ Target::Gpu(_)), Target::Gpu(_)) =>
                    format!(", {} and {}!", cuda(t), cuda(keeper_device)),
                _ => "…".to_string(),
            },
            ticked(&apart.iter().map(|(m, _)| *m).collect::<Vec<_>>()),
            moves.join(", "),
        );
        findings.push(Finding { rule: Rule::TiedWeightsSplit, modules, devices, message });
    }
    findings
}

/// Routers whose experts run elsewhere, each with the block (decoder layer) holding them.
fn experts_apart(map: &Map) -> Vec<(Finding, String)> {
    let mut routers: Vec<&Module> = Vec::new();
    map.model.root.visit(&mut |m| {
        if m.kind == ModuleKind::Router {
            routers.push(m);
        }
    });
    let mut findings = Vec::new();
    for router in routers {
        let Some((moe_path, _)) = router.path.rsplit_once('.') else { continue };
        let Some(moe) = map.model.root.find(moe_path) else { continue };
        let Some(experts) = moe.children.iter().find(|c| matches!(c.kind, ModuleKind::Experts { .. })) else {
            continue;
        };
        let Some(router_device) = devices_of(map, router, &[]).into_iter().next() else { continue };
        // 4.x: one module per expert; 5.x: one fused module.
        let listed = !experts.children.is_empty();
        let units: Vec<&Module> = if listed { experts.children.iter().collect() } else { vec![experts] };
        let apart: Vec<(&Module, Target)> = units
            .into_iter()
            .filter_map(|e| {
                let devices = devices_of(map, e, &[]);
                devices.iter().find(|d| **d != router_device).map(|d| (e, *d))
            })
            .collect();
        if apart.is_empty() {
            continue;
        }
        let block = enclosing_block(map.model, moe_path).unwrap_or(moe);
        let mut modules = vec![router.path.clone()];
        modules.extend(apart.iter().map(|(e, _)| e.path.clone()));
        let mut devices = vec![label(router_device)];
        for (_, d) in &apart {
            if !devices.contains(&label(*d)) {
                devices.push(label(*d));
            }
        }
        let other = apart[0].1;
        let error = format!("`{DEVICE_ERROR}, {} and {}!`", cuda(other), cuda(router_device));
        let paths: Vec<&str> = apart.iter().map(|(e, _)| e.path.as_str()).collect();
        let what = if listed {
            format!(
                "{} of the {} experts of `{}` ({}) {} on {}, their router `{}` on {}{}. `{}.forward` \
                 multiplies each expert's output by the routing weights the router computed \
                 (`expert_layer(current_state) * routing_weights[top_x, idx, None]`), so the first token routed \
                 to {} raises {error}",
                apart.len(),
                experts.children.len(),
                moe.path,
                ticked_list(&paths.iter().map(|p| p.to_string()).collect::<Vec<_>>()),
                if apart.len() == 1 { "runs" } else { "run" },
                or_list(&devices[1..]),
                router.path,
                label(router_device),
                map.offload_note(),
                moe.class,
                if apart.len() == 1 { "it" } else { "one of them" },
            )
        } else {
            format!(
                "the fused experts `{}` run on {}, their router `{}` on {}{}. accelerate hands the experts the \
                 hidden states and routing weights on {}, but their weighted sum comes back there and meets \
                 tensors of `{}` ({}) left on {}: {error}",
                experts.path,
                label(other),
                router.path,
                label(router_device),
                map.offload_note(),
                label(other),
                block.path,
                block.class,
                label(router_device),
            )
        };
        let fix = if listed {
            format!(
                "move them to {}, e.g. `\"{}\": {}`, or put the whole `{}` on one device",
                label(router_device),
                paths[0],
                json_device(router_device),
                block.path
            )
        } else {
            format!(
                "move `{}` to {} (`\"{}\": {}`), or put the whole `{}` on one device",
                experts.path,
                label(router_device),
                experts.path,
                json_device(router_device),
                block.path
            )
        };
        let message = format!("{}. Fix: {fix}.", capitalised(&what));
        findings.push((
            Finding { rule: Rule::ExpertsApartFromRouter, modules, devices, message },
            block.path.clone(),
        ));
    }
    findings
}

/// The outermost block (a module the runtime keeps whole) at or above `path`.
fn enclosing_block<'a>(model: &'a ModelDescription, path: &str) -> Option<&'a Module> {
    let mut found = None;
    model.root.visit(&mut |m| {
        if found.is_none() && kept_whole(model, m) && covers(&m.path, path) {
            found = Some(m);
        }
    });
    found
}

/// A module accelerate never splits: a transformer block, or a class in `_no_split_modules`.
fn kept_whole(model: &ModelDescription, module: &Module) -> bool {
    !module.path.is_empty()
        && (module.kind == ModuleKind::Block || model.facts.no_split_classes.contains(&module.class))
}

/// Blocks spread over devices (the outermost only), in model order. Tensors under `explained`
/// (experts already reported apart from their router) do not make a block split on their own;
/// under expert-parallel, routed experts never do.
fn split_blocks(
    map: &Map,
    runtime: Runtime,
    module: &Module,
    explained: &[String],
    out: &mut Vec<(Finding, String)>,
) {
    if !kept_whole(map.model, module) {
        for child in &module.children {
            split_blocks(map, runtime, child, explained, out);
        }
        return;
    }
    let mut ignored: Vec<String> = explained.to_vec();
    if runtime == Runtime::ExpertParallel {
        module.visit(&mut |m| {
            if matches!(m.kind, ModuleKind::Experts { .. }) {
                ignored.push(m.path.clone());
            }
        });
    }
    if devices_of(map, module, &ignored).len() < 2 {
        return;
    }
    let bytes = bytes_by_device(map, module, &ignored);
    // The device holding most of the block stays; ties go to the lower device.
    let Some(home) = bytes.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(d, _)| *d) else {
        return;
    };
    let mut parts = Vec::new();
    parts_by_device(map, module, &ignored, &mut parts);
    let away: Vec<&(String, Target)> = parts.iter().filter(|(_, d)| *d != home).collect();
    let mut modules = vec![module.path.clone()];
    modules.extend(away.iter().map(|(p, _)| p.clone()));
    let mut devices = vec![label(home)];
    for (_, d) in &away {
        if !devices.contains(&label(*d)) {
            devices.push(label(*d));
        }
    }
    let mut by_device: Vec<(Target, Vec<String>)> = Vec::new();
    for (path, device) in &away {
        match by_device.iter_mut().find(|(d, _)| d == device) {
            Some((_, paths)) => paths.push(path.clone()),
            None => by_device.push((*device, vec![path.clone()])),
        }
    }
    let placed: Vec<String> =
        by_device.iter().map(|(d, paths)| format!("{} on {}", ticked_list(paths), label(*d))).collect();
    let first = away.first().map(|(p, _)| p.as_str()).unwrap_or(module.path.as_str());
    let why = match runtime {
        Runtime::Pipeline => "A pipeline stage holds whole layers (DeepSpeed's `PipelineModule` and torch's \
             pipelining partition between layers), so this map has no stage to give it"
            .to_string(),
        _ => {
            let other = away.first().map_or(home, |(_, d)| *d);
            format!(
                "{} keeps a `{}` on one device (`_no_split_modules`) because inside its forward the outputs of \
                 its parts meet (the residual add, attention's q·k), and here they come from two devices: \
                 `{DEVICE_ERROR}, {} and {}!`",
                if runtime == Runtime::ExpertParallel { "an expert-parallel engine" } else { "accelerate" },
                module.class,
                cuda(home),
                cuda(other)
            )
        }
    };
    let message = format!(
        "`{}` ({}) is split: {}, the rest on {}{}. {}. Fix: move {} to {}, e.g. `\"{}\": {}` in place of \
         the entries inside it.",
        module.path,
        module.class,
        placed.join(", "),
        label(home),
        map.offload_note(),
        why,
        if away.len() == 1 { format!("`{first}`") } else { "them".to_string() },
        label(home),
        module.path,
        json_device(home),
    );
    out.push((Finding { rule: Rule::SplitBlock, modules, devices, message }, module.path.clone()));
}

/// The execution devices of the tensors under `module`, outside `ignored` and tied tensors
/// (whose device is their storage's), ascending.
fn devices_of(map: &Map, module: &Module, ignored: &[String]) -> Vec<Target> {
    bytes_by_device(map, module, ignored).into_keys().collect()
}

fn bytes_by_device(map: &Map, module: &Module, ignored: &[String]) -> BTreeMap<Target, u64> {
    let mut bytes = BTreeMap::new();
    module.visit(&mut |m| {
        if ignored.iter().any(|i| covers(i, &m.path)) {
            return;
        }
        for t in m.tensors.iter().filter(|t| t.tied_to.is_none()) {
            if let Some(d) = map.runs_on(&join(&m.path, &t.name)) {
                *bytes.entry(d).or_insert(0) += t.bytes();
            }
        }
    });
    bytes
}

/// The largest pieces of `module` that each run on one device: modules, or tensors of a module
/// whose own tensors disagree.
fn parts_by_device(map: &Map, module: &Module, ignored: &[String], out: &mut Vec<(String, Target)>) {
    let devices = devices_of(map, module, ignored);
    match devices.as_slice() {
        [] => {}
        [one] => out.push((module.path.clone(), *one)),
        _ => {
            for t in module.tensors.iter().filter(|t| t.tied_to.is_none()) {
                let path = join(&module.path, &t.name);
                if let Some(d) = map.runs_on(&path) {
                    out.push((path, d));
                }
            }
            for child in &module.children {
                parts_by_device(map, child, ignored, out);
            }
        }
    }
}

/// accelerate's `dispatch_model` hooks every submodule of a listed module to that module's
/// device (`attach_execution_device_hook`, parents first) and does not re-hook a submodule that
/// has a hook already; only a listed module gets a hook of its own. A listed module inside
/// another listed module on another GPU thus loads its weights to its own GPU (the longest name
/// wins), while its submodules still move their inputs to the outer GPU. Found per inner entry,
/// except inside blocks already reported (whose fix covers it).
fn overlapping_entries(map: &Map, reported_blocks: &[String]) -> Vec<Finding> {
    // (inner entry, outer entry) → modules whose hook and weights disagree.
    let mut clashes: BTreeMap<(usize, usize), Vec<String>> = BTreeMap::new();
    map.model.root.visit(&mut |m| {
        let tensors: Vec<String> = m.tensors.iter().map(|t| join(&m.path, &t.name)).collect();
        if tensors.is_empty() {
            return;
        }
        let Some(hook) = hook_entry(map, &m.path) else { return };
        for path in &tensors {
            let Some(weights) = longest_entry(map, path) else { continue };
            let (Target::Gpu(a), Target::Gpu(b)) = (map.entries[hook].1, map.entries[weights].1) else {
                continue;
            };
            if a != b {
                let modules = clashes.entry((weights, hook)).or_default();
                if !modules.contains(&m.path) {
                    modules.push(m.path.clone());
                }
            }
        }
    });
    let mut findings = Vec::new();
    for ((inner, outer), modules) in clashes {
        let (inner_key, inner_device) = &map.entries[inner];
        let (outer_key, outer_device) = &map.entries[outer];
        if reported_blocks.iter().any(|b| covers(b, inner_key)) {
            continue;
        }
        let replacement = disjoint_cover(map, outer_key);
        let message = format!(
            "{} ({}) lies inside {} ({}{}). transformers loads its weights to {} (the longest name wins), but \
             accelerate's `dispatch_model` first hooked every submodule of {} to run on {} and does not hook \
             them again for {}: {} get{} inputs on {} while {} weights are on {}, and the first forward \
             raises `{DEVICE_ERROR}, {} and {}!`. Fix: make the entries disjoint: replace {} by {}{}.",
            shown(inner_key),
            label(*inner_device),
            shown(outer_key),
            if outer_key.is_empty() { "the whole model, on " } else { "" },
            label(*outer_device),
            label(*inner_device),
            shown(outer_key),
            label(*outer_device),
            shown(inner_key),
            ticked_list(&modules),
            if modules.len() == 1 { "s its" } else { " their" },
            cuda(*outer_device),
            if modules.len() == 1 { "its" } else { "their" },
            cuda(*inner_device),
            cuda(*outer_device),
            cuda(*inner_device),
            shown(outer_key),
            ticked_list(&replacement),
            if replacement.len() > LISTED {
                format!(" ({} entries, each on {})", replacement.len(), label(*outer_device))
            } else {
                format!(" on {}", label(*outer_device))
            },
        );
        findings.push(Finding {
            rule: Rule::OverlappingEntries,
            modules: vec![inner_key.clone(), outer_key.clone()],
            devices: vec![label(*inner_device), label(*outer_device)],
            message,
        });
    }
    findings
}

/// The entry whose device the module at `path` is hooked to: the module's own entry, else the
/// outermost entry above it.
fn hook_entry(map: &Map, path: &str) -> Option<usize> {
    if let Some(own) = map.entries.iter().position(|(k, _)| k == path) {
        return Some(own);
    }
    map.entries
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| covers(k, path))
        .min_by_key(|(_, (k, _))| k.len())
        .map(|(i, _)| i)
}

/// The entry that places the tensor at `path` once dispatched: the longest that covers it (as
/// transformers loads it), an overridden tensor entry aside.
fn longest_entry(map: &Map, path: &str) -> Option<usize> {
    map.entries
        .iter()
        .enumerate()
        .filter(|(i, (k, _))| !map.overridden[*i] && covers(k, path))
        .max_by_key(|(_, (k, _))| k.len())
        .map(|(i, _)| i)
}

/// Per entry of `entries` (read with dict semantics): whether accelerate overrides it, a
/// tensor's own entry inside a listed module. transformers loads the tensor where its own entry
/// says, but `dispatch_model` hooks the module with `AlignDevicesHook(place_submodules=True)`
/// (the innermost listed module last), whose `init_hook` moves every tensor under it to the
/// module's device, or to the meta device for an offloaded one: the tensor's entry changes
/// nothing at run time. The real runtime on fake GPUs runs such a map as if the entry were not
/// there (fixtures/reference/mismatches: `llama-tensor-inside-listed-layer`), and
/// `from_pretrained` (transformers 4.57 and 5.23) loads it with no weight left on meta.
pub(crate) fn overridden_entries(model: &ModelDescription, entries: &[(String, Target)]) -> Vec<bool> {
    let is_module = |key: &str| model.root.find(key).is_some();
    entries
        .iter()
        .map(|(key, _)| {
            !is_module(key) && entries.iter().any(|(k, _)| k != key && covers(k, key) && is_module(k))
        })
        .collect()
}

/// The modules (and own tensors) that cover what `outer` covers outside the other entries
/// inside it: what to list instead of `outer`.
fn disjoint_cover(map: &Map, outer: &str) -> Vec<String> {
    let inside: Vec<&str> =
        map.entries.iter().map(|(k, _)| k.as_str()).filter(|k| *k != outer && covers(outer, k)).collect();
    let mut out = Vec::new();
    if let Some(module) = map.model.root.find(outer) {
        cover_around(module, &inside, &mut out);
    }
    out
}

fn cover_around(module: &Module, inside: &[&str], out: &mut Vec<String>) {
    if inside.contains(&module.path.as_str()) {
        return;
    }
    if !inside.iter().any(|k| covers(&module.path, k)) {
        if module.bytes() > 0 || !module.tensors.is_empty() {
            out.push(module.path.clone());
        }
        return;
    }
    for t in &module.tensors {
        let path = join(&module.path, &t.name);
        if !inside.contains(&path.as_str()) {
            out.push(path);
        }
    }
    for child in &module.children {
        cover_around(child, inside, out);
    }
}

fn join(module: &str, name: &str) -> String {
    if module.is_empty() { name.to_string() } else { format!("{module}.{name}") }
}

/// The module of a tensor path (`lm_head.weight` → `lm_head`).
fn module_of(tensor: &str) -> &str {
    tensor.rsplit_once('.').map_or("", |(m, _)| m)
}

/// `GPU 0`, `cpu`, `disk`: the target's `Display`.
fn label(target: Target) -> String {
    target.to_string()
}

/// The device as PyTorch names it in its error (`cuda:1`).
fn cuda(target: Target) -> String {
    match target {
        Target::Gpu(i) => format!("cuda:{i}"),
        Target::Cpu | Target::Disk => "cpu".into(),
    }
}

/// The device as a device map writes it: `0`, `"cpu"`.
fn json_device(target: Target) -> String {
    match target {
        Target::Gpu(i) => i.to_string(),
        Target::Cpu => "\"cpu\"".into(),
        Target::Disk => "\"disk\"".into(),
    }
}

/// A map key as messages show it: `` `lm_head` ``, `` `""` ``.
fn shown(key: &str) -> String {
    format!("`{}`", if key.is_empty() { "\"\"" } else { key })
}

/// The first few names ticked, then how many more.
fn ticked_list(names: &[String]) -> String {
    let ticked: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    listed_with_more(&ticked)
}

/// The first few items, then `and N more` when there are more.
fn listed_with_more(items: &[String]) -> String {
    let mut text = items.iter().take(LISTED).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > LISTED {
        text += &format!(" and {} more", items.len() - LISTED);
    }
    text
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
