//! Reading an accelerate `device_map` JSON (`{"model.embed_tokens": 0, "model.layers.0": 0, …,
//! "lm_head": "cpu"}`).
//!
//! [`read_device_map`] reads the entries as written, in file order and with repeated names kept,
//! refusing what is not a device map of this model on this hardware: malformed JSON, names that
//! are not modules or tensors of the model, GPUs the hardware profile does not have, and what is
//! not a device (`"mps"`); devices are read by [`Target::parse`], as `--pin` reads them. `vramplan check` judges the rest
//! (names listed twice, tensors no entry covers) as findings.
//!
//! [`placement_from_device_map`] is what `estimate` places a model with: the same reading, and
//! a name listed twice or a tensor left on no device refused too, as `from_pretrained` would
//! refuse or misplace them. [`unplaced`] says which tensors a placement leaves on no device.

use crate::placement::{DeviceError, Placement, Target};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::{ModelDescription, Module, TensorKind, join};
use vramplan_profiles::suggest::{closest, ticked, ticked_or};

/// How many unplaced tensors or unknown names an error lists before counting the rest.
const LISTED: usize = 5;

/// Reads the device map at `path` for `model` on `hardware` into a placement.
pub fn placement_from_device_map(
    path: &Path,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<Placement, InputError> {
    let text = read_text(path)?;
    placement_from_device_map_text(&text, &path.display().to_string(), model, hardware)
}

/// Reads the device map at `path` for `model` on `hardware`: its `(name, device)` entries in
/// file order, a name listed twice kept twice. Malformed JSON, an empty map, a name that is not
/// a module or tensor of the model and a device the profile does not have are bad input.
pub fn read_device_map(
    path: &Path,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<Vec<(String, Target)>, InputError> {
    let text = read_text(path)?;
    entries_from_text(&text, &path.display().to_string(), model, hardware)
}

/// As [`read_device_map`], for device-map JSON `text` read from `origin` (a map given in memory).
pub fn read_device_map_text(
    text: &str,
    origin: &str,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<Vec<(String, Target)>, InputError> {
    entries_from_text(text, origin, model, hardware)
}

fn read_text(path: &Path) -> Result<String, InputError> {
    vramplan_profiles::files::read_text(path, vramplan_profiles::files::FileKind::DeviceMap).map_err(|e| {
        e.with_fix("give the path of a device_map JSON file (module name → GPU index, \"cpu\" or \"disk\")")
    })
}

/// Parses device-map JSON `text` read from `origin` into a placement, refusing a name listed
/// twice and tensors left on no device (a map given in memory, as [`placement_from_device_map`]
/// reads a file).
pub fn placement_from_device_map_text(
    text: &str,
    origin: &str,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<Placement, InputError> {
    let entries = entries_from_text(text, origin, model, hardware)?;
    if let Some(key) = first_repeat(&entries) {
        let err = InputError::new(origin, format!("{} is listed twice", shown_key(key)));
        let err = match locate_key(text, key, 1) {
            Some((line, column)) => err.at_line(line, column),
            None => err.at_key(key),
        };
        return Err(err.with_fix("keep one entry per name"));
    }
    let placement = Placement::from_entries(entries);
    check_everything_placed(origin, &placement, model)?;
    Ok(placement)
}

/// A placement from `(name, device)` entries read from the map at `key` of the file `origin`
/// (a plan file's `device_map`), checked as a device map file is: not empty, every name a module
/// or tensor of the model, no name twice, every tensor on a device. Errors name the entry's key
/// (`device_map.model.layers.99`).
pub fn placement_from_entries(
    origin: &str,
    key: &str,
    entries: Vec<(String, Target)>,
    model: &ModelDescription,
) -> Result<Placement, InputError> {
    if entries.is_empty() {
        return Err(InputError::new(origin, "the device map is empty: it places nothing")
            .at_key(key)
            .with_fix(
                "write the plan again with `vramplan plan … -o plan.yaml`, or map modules to devices",
            ));
    }
    let unknown = unknown_names(&entries, model);
    if let Some(first) = unknown.first() {
        return Err(unknown_names_error(origin, &unknown, model).at_key(format!("{key}.{first}")));
    }
    if let Some(name) = first_repeat(&entries) {
        return Err(InputError::new(origin, format!("{} is listed twice", shown_key(name)))
            .at_key(format!("{key}.{name}"))
            .with_fix("keep one entry per name"));
    }
    let placement = Placement::from_entries(entries);
    check_everything_placed(origin, &placement, model).map_err(|e| e.at_key(key))?;
    Ok(placement)
}

/// The entries of device-map JSON `text` read from `origin`, in file order, repeats kept.
fn entries_from_text(
    text: &str,
    origin: &str,
    model: &ModelDescription,
    hardware: &HardwareProfile,
) -> Result<Vec<(String, Target)>, InputError> {
    let entries = match serde_json::from_str::<Entries>(text) {
        Ok(Entries(entries)) => entries,
        Err(e) if e.is_data() => {
            return Err(InputError::new(origin, "a device map is one JSON object: module name → device")
                .with_fix(
                    "write it as `{\"model.embed_tokens\": 0, \"model.layers.0\": 0, \"lm_head\": \"cpu\"}`",
                ));
        }
        Err(e) => {
            return Err(InputError::json(origin, &e).with_fix(
                "a device map is one JSON object: `{\"model.embed_tokens\": 0, \"model.layers.0\": 0, \"lm_head\": \"cpu\"}`",
            ));
        }
    };
    if entries.is_empty() {
        return Err(InputError::new(origin, "the device map is empty")
            .with_fix("map module names to devices, or `{\"\": 0}` for the whole model on GPU 0"));
    }
    let at = |key: &str, err: InputError| match locate_key(text, key, 0) {
        Some((line, column)) => err.at_line(line, column),
        None => err.at_key(key),
    };
    let gpus = u32::try_from(hardware.devices.len()).unwrap_or(u32::MAX);
    let mut placed: Vec<(String, Target)> = Vec::with_capacity(entries.len());
    for (key, value) in &entries {
        let target = parse_target(value, gpus).map_err(|e| {
            let fix = match e {
                DeviceError::NoSuchGpu { .. } => format!("{} than `{}`", e.fix(), hardware.name),
                DeviceError::NotADevice { .. } | DeviceError::NotAFlagDevice { .. } => e.fix(),
            };
            at(key, InputError::new(origin, format!("{}: {e}", shown_key(key))).with_fix(fix))
        })?;
        placed.push((key.clone(), target));
    }
    let unknown = unknown_names(&placed, model);
    if let Some(first) = unknown.first() {
        return Err(at(first, unknown_names_error(origin, &unknown, model)));
    }
    Ok(placed)
}

/// The names of `entries` that are neither a module nor a tensor of `model`, in order, each
/// once (`""`, the whole model, is a name): a set keeps this linear in the map's length.
fn unknown_names<'a, T>(entries: &'a [(String, T)], model: &ModelDescription) -> Vec<&'a str> {
    let mut seen: HashSet<&str> = HashSet::new();
    entries
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| {
            !name.is_empty()
                && model.root.find(name).is_none()
                && model.root.tensor(name).is_none()
                && seen.insert(name)
        })
        .collect()
}

/// The first name of `entries` listed a second time.
fn first_repeat<T>(entries: &[(String, T)]) -> Option<&str> {
    let mut listed: HashSet<&str> = HashSet::with_capacity(entries.len());
    entries.iter().map(|(name, _)| name.as_str()).find(|name| !listed.insert(name))
}

/// The object's entries in file order, repeats kept.
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object mapping module names to devices")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// A key as messages show it: `` `model.norm` ``, or `"" (the whole model)`.
fn shown_key(key: &str) -> String {
    if key.is_empty() { "`\"\"` (the whole model)".to_string() } else { format!("`{key}`") }
}

/// A device map's value: a JSON number, or a string [`Target::parse`] reads (`"cpu"`,
/// `"disk"`, `"cuda:1"`, `"1"`).
fn parse_target(value: &Value, gpus: u32) -> Result<Target, DeviceError> {
    match value {
        Value::Number(n) => Target::parse(&n.to_string(), gpus),
        Value::String(s) => Target::parse_string(s, gpus),
        other => Err(DeviceError::NotADevice { text: other.to_string(), gpus }),
    }
}

fn unknown_names_error(origin: &str, unknown: &[&str], model: &ModelDescription) -> InputError {
    let listed: Vec<&str> = unknown.iter().take(LISTED).copied().collect();
    let more = unknown.len().saturating_sub(LISTED);
    let problem = format!(
        "{} {} not {} or parameter{} of {}{}",
        ticked(&listed),
        if unknown.len() == 1 { "is" } else { "are" },
        if unknown.len() == 1 { "a module" } else { "modules" },
        if unknown.len() == 1 { "" } else { "s" },
        model.name,
        if more > 0 { format!(" (and {more} more)") } else { String::new() },
    );
    let hints: Vec<String> = listed.iter().filter_map(|name| suggest_path(model, name)).collect();
    let top: Vec<&str> = model.root.children.iter().map(|c| c.path.as_str()).collect();
    let fix = if hints.is_empty() {
        format!("use the names `vramplan inspect` prints; the model's top-level modules are {}", ticked(&top))
    } else {
        format!("{} (module names are those `vramplan inspect` prints)", hints.join("; "))
    };
    InputError::new(origin, problem).with_fix(fix)
}

/// A "did you mean" for a name that is not in the model: the same name under a prefix the user
/// left out (`layers.0` → `model.layers.0`), else the path with its first unknown component
/// replaced by the closest name there (`model.layer.0` → `model.layers.0`), or the range of an
/// index past a list's end.
fn suggest_path(model: &ModelDescription, name: &str) -> Option<String> {
    let suffix = format!(".{name}");
    let mut under_prefix: Option<&str> = None;
    model.root.visit(&mut |m| {
        if under_prefix.is_none() && m.path.ends_with(&suffix) {
            under_prefix = Some(&m.path);
        }
    });
    if let Some(path) = under_prefix {
        return Some(format!("`{name}` → did you mean `{path}`?"));
    }
    let components: Vec<&str> = name.split('.').collect();
    let mut current: &Module = &model.root;
    for (i, component) in components.iter().enumerate() {
        if let Some(child) = current.children.iter().find(|c| c.name() == *component) {
            current = child;
            continue;
        }
        let rest = components.get(i + 1..).unwrap_or_default().join(".");
        let numbered =
            !current.children.is_empty() && current.children.iter().all(|c| c.name().parse::<u64>().is_ok());
        if numbered && component.parse::<u64>().is_ok() {
            return Some(format!(
                "`{name}`: `{}` holds {} entries, 0 to {}",
                current.path,
                current.children.len(),
                current.children.len() - 1
            ));
        }
        let child_names = current.children.iter().map(Module::name);
        let tensor_names = current.tensors.iter().map(|t| t.name.as_str());
        let close = closest(component, child_names.chain(tensor_names), 2);
        if close.is_empty() {
            return None;
        }
        let prefix = if current.path.is_empty() { String::new() } else { format!("{}.", current.path) };
        let fixed: Vec<String> = close
            .iter()
            .map(|c| if rest.is_empty() { format!("{prefix}{c}") } else { format!("{prefix}{c}.{rest}") })
            .collect();
        let found: Vec<&String> = fixed.iter().filter(|p| model.has_path(p)).collect();
        let best: Vec<String> = if found.is_empty() {
            close.iter().map(|c| format!("{prefix}{c}")).collect()
        } else {
            found.into_iter().cloned().collect()
        };
        let best: Vec<&str> = best.iter().map(String::as_str).collect();
        return Some(format!("`{name}` → did you mean {}?", ticked_or(&best)));
    }
    None
}

/// What a placement leaves on no device: tensors of the state dict (parameters, quantization
/// constants, persistent buffers, a tied tensor under each of its names, as accelerate's
/// `check_device_map` walks `state_dict()`), and the largest modules they make up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unplaced {
    /// Full tensor paths, in model order.
    pub tensors: Vec<String>,
    /// The largest modules all of whose state-dict tensors are unplaced, or that own one, in
    /// model order.
    pub modules: Vec<String>,
}

/// The tensors `placement` leaves on no device.
pub fn unplaced(model: &ModelDescription, placement: &Placement) -> Unplaced {
    let mut tensors = Vec::new();
    model.root.visit(&mut |m| {
        for t in m.tensors.iter().filter(|t| in_state_dict(t.kind)) {
            let path = join(&m.path, &t.name);
            if placement.target_of(&path).is_none() {
                tensors.push(path);
            }
        }
    });
    let mut modules = Vec::new();
    if !tensors.is_empty() {
        unplaced_modules(&model.root, placement, &mut |path| modules.push(path.to_string()));
    }
    Unplaced { tensors, modules }
}

/// Refuses a map that leaves tensors of the state dict on no device, as accelerate does, naming
/// the modules they make up. `"": 0` is offered as the catch-all only when no entry names
/// another GPU: accelerate hooks every submodule of `""` to GPU 0 before it reads the entries
/// inside, so a module listed on GPU 1 under it would run its parts on GPU 0.
fn check_everything_placed(
    origin: &str,
    placement: &Placement,
    model: &ModelDescription,
) -> Result<(), InputError> {
    let Unplaced { tensors, modules } = unplaced(model, placement);
    if tensors.is_empty() {
        return Ok(());
    }
    let examples: Vec<&str> = tensors.iter().take(3).map(String::as_str).collect();
    let listed: Vec<&str> = modules.iter().take(LISTED).map(String::as_str).collect();
    let more = modules.len().saturating_sub(listed.len());
    let only_gpu_0 = placement.gpus().iter().all(|&gpu| gpu == 0);
    Err(InputError::new(
        origin,
        format!(
            "{} tensor{} of {} {} on no device (e.g. {})",
            tensors.len(),
            if tensors.len() == 1 { "" } else { "s" },
            model.name,
            if tensors.len() == 1 { "is" } else { "are" },
            ticked(&examples)
        ),
    )
    .with_fix(format!(
        "add entries for {}{}, e.g. `\"{}\": 0`{}",
        ticked(&listed),
        if more > 0 { format!(" and {more} more") } else { String::new() },
        listed.first().copied().unwrap_or("lm_head"),
        if only_gpu_0 { ", or `\"\": 0` for everything the map does not list" } else { "" },
    )))
}

/// Tensors `model.state_dict()` holds: everything but non-persistent buffers.
fn in_state_dict(kind: TensorKind) -> bool {
    !matches!(kind, TensorKind::Buffer { persistent: false })
}

/// Calls `f` with each largest module all of whose state-dict tensors are unplaced (and that
/// has some), or that owns an unplaced one.
fn unplaced_modules<'a>(module: &'a Module, placement: &Placement, f: &mut dyn FnMut(&'a str)) {
    let (total, unplaced) = count_unplaced(module, placement);
    if total == 0 {
        return;
    }
    if unplaced == total && !module.path.is_empty() {
        f(&module.path);
        return;
    }
    if unplaced == 0 {
        return;
    }
    let own_unplaced = module
        .tensors
        .iter()
        .filter(|t| in_state_dict(t.kind))
        .any(|t| placement.target_of(&join(&module.path, &t.name)).is_none());
    if own_unplaced && !module.path.is_empty() {
        f(&module.path);
        return;
    }
    for child in &module.children {
        unplaced_modules(child, placement, f);
    }
}

/// (state-dict tensors, of which unplaced) in `module` and below.
fn count_unplaced(module: &Module, placement: &Placement) -> (usize, usize) {
    let mut total = 0;
    let mut unplaced = 0;
    module.visit(&mut |m| {
        for t in m.tensors.iter().filter(|t| in_state_dict(t.kind)) {
            total += 1;
            if placement.target_of(&join(&m.path, &t.name)).is_none() {
                unplaced += 1;
            }
        }
    });
    (total, unplaced)
}

/// The 1-based line and column of the `nth` (from 0) occurrence of `"key"` used as an object
/// key in the JSON `text`.
pub fn locate_key(text: &str, key: &str, nth: usize) -> Option<(u64, u64)> {
    let quoted = format!("\"{key}\"");
    let mut from = 0;
    let mut seen = 0;
    while let Some(found) = text.get(from..).and_then(|rest| rest.find(&quoted)) {
        let start = from + found;
        let after = text.get(start + quoted.len()..).unwrap_or("");
        if after.trim_start().starts_with(':') {
            if seen == nth {
                let before = text.get(..start).unwrap_or("");
                let line = before.matches('\n').count() as u64 + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before.get(line_start..).map_or(0, |s| s.chars().count()) as u64 + 1;
                return Some((line, column));
            }
            seen += 1;
        }
        from = start + quoted.len();
    }
    None
}
