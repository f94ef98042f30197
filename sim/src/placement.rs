//! Placements: which device holds each module. A placement maps module-path prefixes to a
//! target (a GPU index, the CPU, or disk); a module goes where its longest matching prefix says,
//! as accelerate's `device_map` does. [`Target::parse`] is the one reading of a device as users
//! write it, in device maps, `--pin` and plan files.

use serde::Serialize;
use std::fmt;
use vramplan_profiles::model::{ModelDescription, ModuleKind};

/// Where a module lives, in the order a plan prefers them (GPUs, then the CPU, then disk).
/// Serialized as accelerate writes a device: the GPU index, `"cpu"` or `"disk"`; displayed as
/// `GPU 0`, `cpu`, `disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// A GPU: its index in the hardware profile.
    Gpu(u32),
    /// Host memory (accelerate's `"cpu"` offload).
    Cpu,
    /// Disk (accelerate's `"disk"` offload).
    Disk,
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Target::Gpu(index) => serializer.serialize_u32(*index),
            Target::Cpu => serializer.serialize_str("cpu"),
            Target::Disk => serializer.serialize_str("disk"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Gpu(index) => write!(f, "GPU {index}"),
            Target::Cpu => write!(f, "cpu"),
            Target::Disk => write!(f, "disk"),
        }
    }
}

impl Target {
    /// Reads a device as torch's `torch.device` reads it, and accelerate's `disk`: `cpu`,
    /// `disk`, `cuda` (the current device, GPU 0), `cuda:N`, or a GPU index `N` (a device map's
    /// JSON number), exactly so: torch refuses `CPU`, ` cpu`, `cuda: 1` and `cuda:01`, and so
    /// does this. A GPU must be one of the hardware's `gpus` GPUs. `--pin` reads its device with
    /// [`Target::parse_lenient`].
    pub fn parse(text: &str, gpus: u32) -> Result<Target, DeviceError> {
        match text {
            "cpu" => return Ok(Target::Cpu),
            "disk" => return Ok(Target::Disk),
            "cuda" => return Target::gpu(0, gpus),
            _ => {}
        }
        let not_a_device = || DeviceError::NotADevice { text: text.to_string(), gpus };
        let digits = text.strip_prefix("cuda:").unwrap_or(text);
        let canonical = digits == "0" || !digits.starts_with('0');
        if digits.is_empty() || !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(not_a_device());
        }
        let index: u64 = digits.parse().map_err(|_| not_a_device())?;
        Target::gpu(index, gpus)
    }

    /// As [`Target::parse`] for a device written as a string in a device map or plan file
    /// (`"cuda:1"`, `"cpu"`): a bare index in quotes (`"1"`) is refused, since `torch.device("1")`
    /// is no device (the map's JSON number `1` is).
    pub fn parse_string(text: &str, gpus: u32) -> Result<Target, DeviceError> {
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(DeviceError::NotADevice { text: format!("\"{text}\""), gpus });
        }
        Target::parse(text, gpus)
    }

    /// As [`Target::parse`], for vramplan's own flags (`--pin lm_head=CPU`): spaces around the
    /// device and its case do not matter.
    pub fn parse_lenient(text: &str, gpus: u32) -> Result<Target, DeviceError> {
        let lower = text.trim().to_ascii_lowercase();
        let compact = lower.strip_prefix("cuda:").map_or(lower.clone(), |n| format!("cuda:{}", n.trim()));
        Target::parse(&compact, gpus).map_err(|e| match e {
            // Named as written, and without the exactness a flag does not need.
            DeviceError::NotADevice { gpus, .. } => {
                DeviceError::NotAFlagDevice { text: text.trim().to_string(), gpus }
            }
            other => other,
        })
    }

    fn gpu(index: u64, gpus: u32) -> Result<Target, DeviceError> {
        match u32::try_from(index) {
            Ok(gpu) if gpu < gpus => Ok(Target::Gpu(gpu)),
            _ => Err(DeviceError::NoSuchGpu { index, gpus }),
        }
    }
}

/// A device [`Target::parse`] cannot read: its `Display` is the problem, [`DeviceError::fix`]
/// the fix; the caller adds where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// Neither a GPU index, `cpu` nor `disk` (`mps`, `gpu1`, `-1`).
    NotADevice {
        /// The device as written, trimmed.
        text: String,
        /// The hardware's GPU count.
        gpus: u32,
    },
    /// As `NotADevice`, for a device in vramplan's own flags, whose case and spaces do not
    /// matter (`--pin lm_head=gpu1`).
    NotAFlagDevice {
        /// The device as written, trimmed.
        text: String,
        /// The hardware's GPU count.
        gpus: u32,
    },
    /// A GPU index past the hardware's `gpus` GPUs.
    NoSuchGpu {
        /// The GPU index as written.
        index: u64,
        /// The hardware's GPU count.
        gpus: u32,
    },
}

impl DeviceError {
    /// How to write the device instead.
    pub fn fix(&self) -> String {
        match self {
            DeviceError::NotADevice { gpus, .. } | DeviceError::NotAFlagDevice { gpus, .. } => {
                format!("use a GPU index ({}), `cpu` or `disk`", gpu_range(*gpus))
            }
            DeviceError::NoSuchGpu { gpus: 0, .. } => {
                "use `cpu` or `disk`, or a hardware profile with GPUs".to_string()
            }
            DeviceError::NoSuchGpu { gpus, .. } => {
                format!("use {}, `cpu` or `disk`, or a hardware profile with more GPUs", gpu_range(*gpus))
            }
        }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::NotADevice { text, .. } => {
                write!(
                    f,
                    "`{text}` is not a device as torch reads one (exactly, in lower case, no spaces): a GPU \
                     index (`0`, `cuda:0`), `cpu` or `disk`"
                )
            }
            DeviceError::NotAFlagDevice { text, .. } => {
                write!(f, "`{text}` is not a device: a GPU index (`0`, `cuda:0`), `cpu` or `disk`")
            }
            DeviceError::NoSuchGpu { index, gpus } => {
                let has = match gpus {
                    0 => "it has no GPU".to_string(),
                    1 => "it has GPU 0".to_string(),
                    n => format!("it has GPUs 0 to {}", n - 1),
                };
                write!(f, "GPU {index} is not in the hardware profile ({has})")
            }
        }
    }
}

impl std::error::Error for DeviceError {}

/// "GPU 0", "GPU 0 or 1", "GPUs 0 to 3" as a fix names them; "no GPU" for none.
fn gpu_range(gpus: u32) -> String {
    match gpus {
        0 => "the profile has no GPU".to_string(),
        1 => "GPU 0".to_string(),
        2 => "GPU 0 or 1".to_string(),
        n => format!("GPUs 0 to {}", n - 1),
    }
}

/// Module-path prefixes and their targets. The empty prefix is the whole model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    entries: Vec<(String, Target)>,
}

impl Placement {
    /// Everything on one GPU.
    pub fn single(gpu: u32) -> Placement {
        Placement { entries: vec![(String::new(), Target::Gpu(gpu))] }
    }

    /// From `(module prefix, target)` pairs, as a device map lists them.
    pub fn from_entries(entries: Vec<(String, Target)>) -> Placement {
        Placement { entries }
    }

    /// A map's entries as the runtime reads them (`json.load` builds a Python dict): a name
    /// listed twice keeps its first position and its last target.
    pub fn as_read(written: &[(String, Target)]) -> Placement {
        let mut entries: Vec<(String, Target)> = Vec::new();
        for (key, target) in written {
            match entries.iter_mut().find(|(k, _)| k == key) {
                Some(entry) => entry.1 = *target,
                None => entries.push((key.clone(), *target)),
            }
        }
        Placement { entries }
    }

    /// The model's blocks split into `gpus` contiguous ranges of (nearly) equal count, in
    /// order; what comes before the blocks goes to the first GPU, what comes after to the last.
    /// A plain starting point for naive model parallelism, not an optimised plan.
    pub fn even_layers(model: &ModelDescription, gpus: u32) -> Placement {
        let gpus = gpus.max(1);
        let blocks = model.facts.layers.len() as u64;
        let mut entries = vec![(String::new(), Target::Gpu(0))];
        let last = Target::Gpu(gpus - 1);
        for (i, layer) in model.facts.layers.iter().enumerate() {
            let gpu = (i as u64 * u64::from(gpus) / blocks.max(1)) as u32;
            entries.push((layer.path.clone(), Target::Gpu(gpu)));
        }
        // Modules after the last block (final norm, head) go with it.
        if let Some(last_block) = model.facts.layers.last() {
            let mut after = false;
            for child in top_level_modules(model) {
                if after {
                    entries.push((child, last));
                } else if last_block.path.starts_with(&format!("{child}.")) || child == last_block.path {
                    after = true;
                }
            }
        }
        Placement { entries }
    }

    /// The `(module prefix, target)` pairs, in the order they were given.
    pub fn entries(&self) -> &[(String, Target)] {
        &self.entries
    }

    /// The target of the module at `path`: its longest matching prefix's, if any.
    pub fn target_of(&self, path: &str) -> Option<Target> {
        self.entries
            .iter()
            .filter(|(prefix, _)| covers(prefix, path))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, target)| *target)
    }

    /// The GPU that runs the modules placed on `cpu` or `disk`: the first GPU the map lists, as
    /// accelerate's `dispatch_model` takes its `main_device`.
    pub fn main_gpu(&self) -> Option<u32> {
        self.entries.iter().find_map(|(_, t)| match t {
            Target::Gpu(i) => Some(*i),
            _ => None,
        })
    }

    /// The GPUs the placement uses, ascending.
    pub fn gpus(&self) -> Vec<u32> {
        let mut gpus: Vec<u32> = self
            .entries
            .iter()
            .filter_map(|(_, t)| match t {
                Target::Gpu(i) => Some(*i),
                _ => None,
            })
            .collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }
}

/// Where each tensor of a model ends up under a [`Placement`], by accelerate's rules for a
/// `device_map` whose keys may name modules at any depth, single parameters and buffers, or `""`:
/// `from_pretrained` first puts every tensor where its longest matching key says; then
/// `dispatch_model` gives every listed *module* a hook that moves all the tensors under it to
/// its device (`AlignDevicesHook(place_submodules=True)`, parents before children). So a tensor
/// ends on the device of the longest module key above it, and only where no module key is above
/// it does its own key (a parameter or buffer listed by name) decide. A tensor no key covers is
/// placed nowhere.
#[derive(Debug, Clone)]
pub struct TensorPlacement {
    /// Each key's target, and whether the key names a tensor (not a module).
    keys: std::collections::HashMap<String, (Target, bool)>,
}

impl TensorPlacement {
    /// The rules above for `placement` on `model` (which keys name tensors).
    pub fn new(placement: &Placement, model: &ModelDescription) -> TensorPlacement {
        let mut keys: std::collections::HashMap<String, (Target, bool)> =
            placement.entries.iter().map(|(k, t)| (k.clone(), (*t, false))).collect();
        model.root.visit(&mut |m| {
            for tensor in &m.tensors {
                let name = vramplan_profiles::model::join(&m.path, &tensor.name);
                if let Some(entry) = keys.get_mut(&name) {
                    entry.1 = true;
                }
            }
        });
        TensorPlacement { keys }
    }

    /// Where the tensor named `path` (`model.layers.0.mlp.down_proj.weight`) ends up.
    pub fn target(&self, path: &str) -> Option<Target> {
        self.module_target(path).or_else(|| self.keys.get(path).map(|(target, _)| *target))
    }

    /// The device of the longest *module* key above `path`, whose hook moves it there.
    fn module_target(&self, path: &str) -> Option<Target> {
        self.longest(path, |names_tensor| !names_tensor)
    }

    /// The target of the longest key at or above `path` that `accept` takes (told whether the
    /// key names a tensor).
    fn longest(&self, path: &str, accept: impl Fn(bool) -> bool) -> Option<Target> {
        let mut prefix = path;
        loop {
            if let Some(&(target, names_tensor)) = self.keys.get(prefix)
                && accept(names_tensor)
            {
                return Some(target);
            }
            if prefix.is_empty() {
                return None;
            }
            prefix = prefix.rfind('.').map_or("", |dot| &prefix[..dot]);
        }
    }

    /// Where the one tensor that `source` and the names tied to it (`tied`) share ends up:
    /// `from_pretrained` loads it where the longest key above `source` says and ties the others
    /// to it; each listed module's hook then gives that module its own copy on its device, and
    /// `dispatch_model` ends by tying every name back to the tensor of the first of them in
    /// sorted order (`retie_parameters` over `find_tied_parameters`' sorted groups). So it is
    /// where that first name's module key put it, or, with no module key above that name, where
    /// the load put it.
    pub fn tied_target(&self, source: &str, tied: &[String]) -> Option<Target> {
        let first = tied.iter().map(String::as_str).chain(std::iter::once(source)).min().unwrap_or(source);
        self.module_target(first).or_else(|| self.loaded_at(source))
    }

    /// Where `from_pretrained` loads the tensor at `path`: its longest matching key, module or
    /// tensor.
    fn loaded_at(&self, path: &str) -> Option<Target> {
        self.longest(path, |_| true)
    }
}

/// The root's children and, for a base-model container (`model`, `transformer`), its children,
/// in definition order.
fn top_level_modules(model: &ModelDescription) -> Vec<String> {
    let mut out = Vec::new();
    for child in &model.root.children {
        if child.kind == ModuleKind::Container && child.class != "ModuleList" {
            out.extend(child.children.iter().map(|c| c.path.clone()));
        } else {
            out.push(child.path.clone());
        }
    }
    out
}

/// accelerate's prefix rule: the `device_map` key `prefix` places the module or tensor at
/// `path` when it is empty, equals `path`, or is a dotted ancestor of it.
pub fn covers(prefix: &str, path: &str) -> bool {
    prefix.is_empty()
        || (path.starts_with(prefix) && (path.len() == prefix.len() || path.as_bytes()[prefix.len()] == b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins_and_respects_dots() {
        let p = Placement::from_entries(vec![
            ("model".into(), Target::Gpu(0)),
            ("model.layers.1".into(), Target::Gpu(1)),
            ("lm_head".into(), Target::Cpu),
        ]);
        assert_eq!(p.target_of("model.layers.1.mlp"), Some(Target::Gpu(1)));
        assert_eq!(p.target_of("model.layers.10.mlp"), Some(Target::Gpu(0)));
        assert_eq!(p.target_of("lm_head"), Some(Target::Cpu));
        assert_eq!(p.target_of("other"), None);
        assert_eq!(p.gpus(), vec![0, 1]);
    }

    #[test]
    fn targets_write_as_accelerate_and_messages_do() {
        let json = serde_json::to_string(&[Target::Gpu(1), Target::Cpu, Target::Disk]).unwrap();
        assert_eq!(json, r#"[1,"cpu","disk"]"#);
        let shown: Vec<String> =
            [Target::Gpu(0), Target::Cpu, Target::Disk].iter().map(|t| t.to_string()).collect();
        assert_eq!(shown, ["GPU 0", "cpu", "disk"]);
        assert!(Target::Gpu(7) < Target::Cpu && Target::Cpu < Target::Disk);
    }

    #[test]
    fn devices_read_alike_wherever_they_are_written() {
        for (text, target) in [
            ("0", Target::Gpu(0)),
            ("cuda:1", Target::Gpu(1)),
            ("cuda", Target::Gpu(0)),
            ("cpu", Target::Cpu),
            ("disk", Target::Disk),
        ] {
            assert_eq!(Target::parse(text, 2), Ok(target), "{text}");
        }
        // What torch.device refuses (torch 2.15: "Invalid device string", "Expected one of cpu,
        // cuda, …"), and what is no device at all.
        for text in [
            "CPU",
            " cpu",
            "cuda: 1",
            "cuda:01",
            "cuda:1 ",
            "CUDA:0",
            "Disk",
            "mps",
            "",
            "-1",
            "1.5",
            "gpu1",
            "cuda:x",
            "99999999999999999999999",
        ] {
            assert!(matches!(Target::parse(text, 2), Err(DeviceError::NotADevice { .. })), "{text}");
        }
        assert!(Target::parse_string("1", 2).is_err(), "torch.device(\"1\") is no device");
        assert_eq!(Target::parse_string("cuda:1", 2), Ok(Target::Gpu(1)));
        for (text, target) in [(" 1 ", Target::Gpu(1)), ("CUDA: 1", Target::Gpu(1)), ("CPU", Target::Cpu)] {
            assert_eq!(Target::parse_lenient(text, 2), Ok(target), "{text}");
        }
        let err = Target::parse("cuda:7", 2).unwrap_err();
        assert_eq!(err, DeviceError::NoSuchGpu { index: 7, gpus: 2 });
        assert_eq!(err.to_string(), "GPU 7 is not in the hardware profile (it has GPUs 0 to 1)");
        assert!(err.fix().contains("GPU 0 or 1"), "{}", err.fix());
        assert!(Target::parse("4294967296", 2).is_err());
    }
}
