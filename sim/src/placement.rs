//! Placements: which device holds each module. A placement maps module-path prefixes to a
//! target (a GPU index, the CPU, or disk); a module goes where its longest matching prefix says,
//! as accelerate's `device_map` does.

use serde::Serialize;
use vramplan_profiles::model::{ModelDescription, ModuleKind};

/// Where a module lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Gpu(u32),
    Cpu,
    Disk,
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
}
