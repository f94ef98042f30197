//! vLLM's pipeline stages: which decoder layers each stage holds, and the part of the model a
//! rank of that stage loads.
//!
//! vLLM splits the decoder layers over `--pipeline-parallel-size` stages with
//! `vllm.distributed.utils.get_pp_indices` (vLLM 0.33): `layers / pp` each, and the remainder,
//! one layer each, to the stages just before the last (the last holds the final norm and, in
//! the stages' words, "the first and last partitions ... contain the input and output
//! embeddings"). The layers a stage does not hold are `PPMissingLayer` placeholders with no
//! weights; the input embedding lives on the first stage only, the final norm and the LM head on
//! the last only, and a tied head becomes a weight of its own on the last stage (vLLM loads the
//! embedding's values into it). Modules with only buffers (rotary embeddings) are built on every
//! stage.
//!
//! [`stage_model`] cuts the model description to what one stage holds, so the rest of the
//! engine's budget (weights, the KV cache of its layers, the activations of its layers) reads it
//! as it reads a whole model.

use std::collections::BTreeSet;
use std::ops::Range;
use vramplan_profiles::model::{ModelDescription, Module, StackKind, TensorKind};

/// One pipeline stage of `count`: `index` from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// The stage, from 0 (the one with the input embedding).
    pub index: u32,
    /// The stages in all (`--pipeline-parallel-size`).
    pub count: u32,
}

impl Stage {
    /// The whole model: one stage of one.
    pub const WHOLE: Stage = Stage { index: 0, count: 1 };

    /// Whether this stage holds the input embedding.
    pub fn is_first(self) -> bool {
        self.index == 0
    }

    /// Whether this stage holds the final norm, the LM head and the sampler.
    pub fn is_last(self) -> bool {
        self.index + 1 >= self.count
    }
}

/// The decoder layers of each of `stages` stages, as vLLM's `get_pp_indices` splits `layers`
/// (without `VLLM_PP_LAYER_PARTITION`).
pub fn stage_layers(layers: u64, stages: u32) -> Vec<Range<u64>> {
    let stages = u64::from(stages.max(1));
    let mut sizes = vec![layers / stages; stages as usize];
    let remaining = (layers % stages) as usize;
    // `for i in range(2, remaining + 2): partitions[-i] += 1`
    for i in 2..remaining + 2 {
        let at = sizes.len() - i;
        sizes[at] += 1;
    }
    let mut start = 0;
    sizes
        .into_iter()
        .map(|n| {
            let range = start..start + n;
            start += n;
            range
        })
        .collect()
}

/// What a rank of `stage` holds of `model`: its decoder layers (as [`stage_layers`] splits
/// them), the modules before the layers on the first stage, those after them on the last,
/// parameter-free modules everywhere. `model` itself for a single stage, or for a model whose
/// decoder layers share no container.
pub fn stage_model(model: &ModelDescription, stage: Stage) -> ModelDescription {
    if stage.count <= 1 {
        return model.clone();
    }
    let decoder: Vec<&str> = model
        .facts
        .layers
        .iter()
        .filter(|l| l.stack == StackKind::Decoder)
        .map(|l| l.path.as_str())
        .collect();
    let Some(container) = decoder.first().and_then(|p| p.rsplit_once('.')).map(|(c, _)| c.to_string()) else {
        return model.clone();
    };
    let range = stage_layers(decoder.len() as u64, stage.count)[stage.index as usize].clone();
    let kept: BTreeSet<&str> = decoder[range.start as usize..range.end as usize].iter().copied().collect();
    let dropped_layers: BTreeSet<&str> = decoder.iter().copied().filter(|p| !kept.contains(p)).collect();

    let mut out = model.clone();
    let mut dropped_paths = Vec::new();
    prune(&mut out.root, &container, stage, &dropped_layers, &mut dropped_paths);
    // A tensor tied to one this stage does not hold is a weight of its own here.
    let gone =
        |path: &str| dropped_paths.iter().any(|d: &String| path == d || path.starts_with(&format!("{d}.")));
    untie(&mut out.root, &gone);
    out.facts.layers.retain(|l| l.stack != StackKind::Decoder || kept.contains(l.path.as_str()));
    out
}

/// Removes from `module` the decoder layers of `dropped_layers`, and, along the path to the
/// layers' `container`, the modules before it (unless `stage` is the first) and after it
/// (unless it is the last) that hold parameters. Records every removed path in `dropped`.
fn prune(
    module: &mut Module,
    container: &str,
    stage: Stage,
    dropped_layers: &BTreeSet<&str>,
    dropped: &mut Vec<String>,
) {
    if module.path == container {
        module.children.retain(|c| {
            let keep = !dropped_layers.contains(c.path.as_str());
            if !keep {
                dropped.push(c.path.clone());
            }
            keep
        });
        return;
    }
    let on_path = |c: &Module| container == c.path || container.starts_with(&format!("{}.", c.path));
    let Some(at) = module.children.iter().position(on_path) else { return };
    let mut index = 0;
    module.children.retain(|c| {
        let i = index;
        index += 1;
        let keep = i == at || only_buffers(c) || (i < at && stage.is_first()) || (i > at && stage.is_last());
        if !keep {
            dropped.push(c.path.clone());
        }
        keep
    });
    if let Some(child) = module.children.iter_mut().find(|c| on_path(c)) {
        prune(child, container, stage, dropped_layers, dropped);
    }
}

/// Whether `module` holds no weights of its own or tied ones (only buffers: a rotary
/// embedding). A tied head counts none in `params()`, yet it is a module of the last stage.
fn only_buffers(module: &Module) -> bool {
    let mut weights = false;
    module.visit(&mut |m| {
        weights |= m.tensors.iter().any(|t| !matches!(t.kind, TensorKind::Buffer { .. }));
    });
    !weights
}

/// Clears `tied_to` on every tensor tied to a tensor under a removed path.
fn untie(module: &mut Module, gone: &dyn Fn(&str) -> bool) {
    for tensor in &mut module.tensors {
        if tensor.tied_to.as_deref().is_some_and(|to| gone(to.rsplit_once('.').map_or(to, |(m, _)| m))) {
            tensor.tied_to = None;
        }
    }
    for child in &mut module.children {
        untie(child, gone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (layers, stages, the stages' ranges) as vLLM 0.33's `get_pp_indices` returned them
    /// (called from scripts/reference/.venv5-engines, no `VLLM_PP_LAYER_PARTITION`).
    #[test]
    fn layers_are_split_as_vllm_splits_them() {
        type Case = (u64, u32, &'static [(u64, u64)]);
        let cases: [Case; 6] = [
            (20, 4, &[(0, 5), (5, 10), (10, 15), (15, 20)]),
            (21, 4, &[(0, 5), (5, 10), (10, 16), (16, 21)]),
            (22, 4, &[(0, 5), (5, 11), (11, 17), (17, 22)]),
            (23, 4, &[(0, 6), (6, 12), (12, 18), (18, 23)]),
            (80, 2, &[(0, 40), (40, 80)]),
            (61, 3, &[(0, 20), (20, 41), (41, 61)]),
        ];
        for (layers, stages, want) in cases {
            let got: Vec<(u64, u64)> =
                stage_layers(layers, stages).iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(got, want, "{layers} layers over {stages}");
        }
        let stages = stage_layers(126, 16);
        assert_eq!((stages[0].clone(), stages[14].clone(), stages[15].clone()), (0..7, 111..119, 119..126));
    }
}
