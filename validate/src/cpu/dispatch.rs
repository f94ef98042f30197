//! Where accelerate puts each tensor of a model for a device map, and which device each
//! module's hook moves its inputs to: `dispatch_model` (accelerate/big_modeling.py,
//! accelerate 1.15) after `from_pretrained` has loaded the weights where the map says.
//!
//! The rules, from the runtime's code:
//! - **Load.** A tensor goes where its longest listed prefix says (`cpu` and `disk` are host
//!   memory); tied tensors are one storage.
//! - **No hooks on one device.** A map that names one device, `cpu` included, is
//!   `model.to(device)` (`len(set(device_map.values())) > 1` decides).
//! - **Listed modules on a GPU** get an `AlignDevicesHook(place_submodules=True)`: its
//!   `init_hook` moves every tensor under the module to its GPU (a listed module deeper down moves
//!   its own subtree again, later), and the hook moves the module's inputs there. Their unlisted
//!   submodules holding tensors get the same GPU's hook (`attach_execution_device_hook`), which a
//!   deeper listing does not replace.
//! - **Listed modules on `cpu`/`disk`** run on the main device (the map's first GPU): their
//!   parameters are put on `meta` and a new copy is streamed in for each forward; their buffers
//!   are moved to the main device (`offload_buffers=False`).
//! - **Listed tensors** of an unlisted parent get no hook: they stay where they were loaded.
//! - **Tied parameters** are tied again after the hooks (`retie_parameters`): every name of a
//!   group takes the tensor of the first name, in sorted order, that is not on `meta`.

use std::collections::BTreeMap;
use std::fmt;
use vramplan_profiles::model::{ModelDescription, Module, TensorKind, join};
use vramplan_sim::placement::{Placement, Target};

/// A device of the run: a GPU of the plan, or the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Device {
    /// `cuda:N`.
    Gpu(u32),
    /// `cpu`.
    Cpu,
    /// `meta`: a tensor with no data (PEFT's adapters of a module whose weights accelerate's
    /// offload left there).
    Meta,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Gpu(g) => write!(f, "cuda:{g}"),
            Device::Cpu => f.write_str("cpu"),
            Device::Meta => f.write_str("meta"),
        }
    }
}

/// Where a tensor lives once the model is dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Home {
    /// On a device for the whole run.
    On(Device),
    /// On `meta`: accelerate streams a new copy to the module's execution device at each forward.
    Streamed,
}

/// The model as dispatched.
#[derive(Debug, Clone)]
pub(crate) struct Dispatched {
    /// Each tensor's storage: its own path, or the path its tied group keeps.
    pub storage: BTreeMap<String, String>,
    /// Where each storage lives.
    pub homes: BTreeMap<String, Home>,
    /// The device each hooked module moves its inputs to.
    pub hooks: BTreeMap<String, Device>,
    /// The device the input ids are put on (the map's first GPU).
    pub main: Device,
}

fn device(target: Target) -> Device {
    match target {
        Target::Gpu(g) => Device::Gpu(g),
        Target::Cpu | Target::Disk => Device::Cpu,
    }
}

/// Dispatches `model` with the map `entries` (file order; a name listed twice keeps its last
/// device, as `json.load` reads it).
pub(crate) fn dispatch(model: &ModelDescription, entries: &[(String, Target)]) -> Dispatched {
    let map = Placement::as_read(entries);
    let main = map.main_gpu().map_or(Device::Cpu, Device::Gpu);
    let mut homes: BTreeMap<String, Home> = BTreeMap::new();
    let mut tied: Vec<(String, Option<String>)> = Vec::new();
    model.root.visit(&mut |m: &Module| {
        for t in &m.tensors {
            let path = join(&m.path, &t.name);
            homes.insert(path.clone(), Home::On(map.target_of(&path).map_or(Device::Cpu, device)));
            tied.push((path, t.tied_to.clone()));
        }
    });
    let mut hooks = BTreeMap::new();
    // `dispatch_model` hooks the model only where the map names more than one device (`cpu` and
    // `disk` count apart); on one it is `model.to(device)`, `{"": "cpu"}` included.
    let distinct: std::collections::BTreeSet<Target> = map.entries().iter().map(|(_, t)| *t).collect();
    if distinct.len() > 1 {
        let listed: BTreeMap<&str, Target> = map.entries().iter().map(|(k, t)| (k.as_str(), *t)).collect();
        hook(&model.root, &listed, main, None, &mut homes, &mut hooks);
    } else if let Some(only) = distinct.iter().next() {
        homes.values_mut().for_each(|h| *h = Home::On(device(*only)));
    }
    // Tied groups: every name takes the first non-meta home in sorted order.
    let mut storage: BTreeMap<String, String> = BTreeMap::new();
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, tied_to) in tied {
        let root = tied_to.unwrap_or_else(|| path.clone());
        groups.entry(root).or_default().push(path);
    }
    let mut kept = BTreeMap::new();
    for (root, mut names) in groups {
        names.sort();
        let home = names.iter().map(|n| homes[n]).find(|h| *h != Home::Streamed).unwrap_or(Home::Streamed);
        for name in &names {
            storage.insert(name.clone(), root.clone());
        }
        kept.insert(root, home);
    }
    Dispatched { storage, homes: kept, hooks, main }
}

/// `attach_align_device_hook_on_blocks`, depth first: `outer` is the outermost listed
/// ancestor's execution device.
fn hook(
    m: &Module,
    listed: &BTreeMap<&str, Target>,
    main: Device,
    outer: Option<Device>,
    homes: &mut BTreeMap<String, Home>,
    hooks: &mut BTreeMap<String, Device>,
) {
    // Every tensor under `m`, with whether it is a buffer: what `place_submodules` moves.
    let under = || {
        let mut found = Vec::new();
        m.visit(&mut |sub: &Module| {
            for t in &sub.tensors {
                found.push((join(&sub.path, &t.name), matches!(t.kind, TensorKind::Buffer { .. })));
            }
        });
        found
    };
    let mut outer = outer;
    match listed.get(m.path.as_str()) {
        Some(Target::Gpu(g)) => {
            let gpu = Device::Gpu(*g);
            hooks.insert(m.path.clone(), gpu);
            for (p, _) in under() {
                homes.insert(p, Home::On(gpu));
            }
            outer = outer.or(Some(gpu));
        }
        Some(_) => {
            for (p, buffer) in under() {
                homes.insert(p, if buffer { Home::On(main) } else { Home::Streamed });
            }
            m.visit(&mut |sub: &Module| {
                if !sub.tensors.is_empty() || sub.path == m.path {
                    hooks.entry(sub.path.clone()).or_insert(main);
                }
            });
            outer = outer.or(Some(main));
        }
        None => {
            if let Some(device) = outer
                && m.bytes() > 0
            {
                hooks.entry(m.path.clone()).or_insert(device);
            }
        }
    }
    for child in &m.children {
        hook(child, listed, main, outer, homes, hooks);
    }
}

/// Bytes per device as dispatched, each storage once (`meta` for streamed weights): the
/// torch backend's `placed`.
pub(crate) fn placed(model: &ModelDescription, dispatched: &Dispatched) -> BTreeMap<String, u64> {
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    model.root.visit(&mut |m: &Module| {
        for t in &m.tensors {
            let path = join(&m.path, &t.name);
            if dispatched.storage.get(&path) != Some(&path) {
                continue;
            }
            let key = match dispatched.homes[&path] {
                Home::On(d) => d.to_string(),
                Home::Streamed => "meta".to_string(),
            };
            *bytes.entry(key).or_default() += t.bytes();
        }
    });
    bytes
}
