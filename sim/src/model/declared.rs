//! Declared activations: what a module of a custom model keeps for backward when its YAML gives
//! `activations: {per_token, per_sample}` (docs/custom-models.md), in place of the transformer
//! formula of `activations.rs`, which knows nothing of a graph network's messages or a memory
//! layer's retrieved slots.
//!
//! A declaration is the bytes the module holds for the backward pass of one training step: per
//! token of the batch (`per_token` P, times batch × sequence) and per sample (`per_sample` S,
//! times batch). For a batch of b sequences of s tokens the module holds `b·s·P + b·S` bytes.
//! What the runtimes do with those bytes, and so what the step program charges:
//! - training: autograd keeps a module's saved tensors from its forward until its backward has
//!   run (`torch/csrc/autograd/saved_variable.cpp`: a `SavedVariable` holds its tensor until the
//!   node is released after `backward`), so the declared bytes are allocated in the module's
//!   forward and freed after its backward, as one allocation per declaring module (the file
//!   gives a total, not its tensors). Nothing is added on top: the declared figure is the
//!   module's activation memory as measured (the slope of `max_memory_allocated` over batch, as
//!   the docs advise), so no transient workspace of the formula is charged;
//! - full gradient checkpointing (`torch.utils.checkpoint`, `use_reentrant=False` as
//!   transformers calls it): a checkpointed block keeps only its input, the hidden states handed
//!   to it (`hidden_size` values per token, fp32 under autocast, as every unit hands them on:
//!   `program.rs`, `handoff_bytes`), holds its declared bytes while its forward runs (its working
//!   set, below) and recomputes them in backward;
//! - inference: under `torch.no_grad()` autograd saves nothing, and the same forward frees each
//!   intermediate as soon as its last consumer has run, so the tensors live at once are a subset
//!   of those training keeps: the declared bytes bound the module's working set, and are charged
//!   as that, for the prompt's tokens, while the module runs.
//!
//! Where declarations sit: a unit (a block, or a module outside the blocks) whose own module
//! declares is charged its declaration alone, which covers everything inside it; a unit whose
//! module declares nothing but holds modules that do is charged what the memory model gives the
//! unit plus the outermost of those declarations; a module that holds several units without
//! being one (a container of two linears) has its declaration charged to the first of them in
//! execution order ([`above`]). Declared bytes are taken as written, whatever the workload's
//! dtype, fine-tune or attention: they are the user's measurement.

use super::activations::BlockActivations;
use super::precision::Precision;
use super::units::Unit;
use crate::placement::covers;
use crate::workload::{Mode, Workload};
use vramplan_profiles::model::custom::ActivationSizes;
use vramplan_profiles::model::{ModelDescription, Module};

/// What the declaring modules of one unit give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Declared {
    /// The unit's own module declares: the declaration is the unit's whole activation memory.
    Whole(BlockActivations),
    /// Only modules inside the unit declare: their bytes add to what the memory model gives the
    /// rest of the unit.
    Inside(BlockActivations),
}

impl Declared {
    /// The unit's activations: the declaration alone, or `formula` (the memory model's figure
    /// for the unit) with the declarations inside it added.
    pub(crate) fn or_formula(self, formula: impl FnOnce() -> BlockActivations) -> BlockActivations {
        match self {
            Declared::Whole(acts) => acts,
            Declared::Inside(inside) => {
                let mut acts = formula();
                acts.saved.extend(inside.saved);
                acts.forward_transient += inside.forward_transient;
                acts.working_set.extend(inside.working_set);
                acts
            }
        }
    }
}

/// Bytes a declaration stands for with `batch` samples of `seq` tokens: `batch·seq·per_token +
/// batch·per_sample` (saturating: the input checks bound batch × seq long before).
pub(crate) fn declared_bytes(sizes: ActivationSizes, batch: u64, seq: u64) -> u64 {
    batch
        .saturating_mul(seq)
        .saturating_mul(sizes.per_token)
        .saturating_add(batch.saturating_mul(sizes.per_sample))
}

/// The declarations of a unit, the same at every shape: the outermost declaring modules at or
/// under its module, and whether its own module is one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Declarations {
    sizes: Vec<ActivationSizes>,
    whole: bool,
}

impl Declarations {
    /// Those of the unit whose module is `module`, if it or any module inside it declares.
    fn of(module: &Module) -> Option<Declarations> {
        let mut sizes = Vec::new();
        outermost(module, &mut sizes);
        (!sizes.is_empty()).then(|| Declarations { sizes, whole: module.activations.is_some() })
    }

    /// Those of a module's own declaration alone, if it declares (not those inside it).
    fn own(module: &Module) -> Option<Declarations> {
        Some(Declarations { sizes: vec![module.activations?], whole: true })
    }

    /// What they give with `batch` samples of `seq` tokens.
    pub(crate) fn at(
        &self,
        model: &ModelDescription,
        workload: &Workload,
        precision: &Precision,
        batch: u64,
        seq: u64,
    ) -> Declared {
        let bytes: Vec<u64> = self.sizes.iter().map(|s| declared_bytes(*s, batch, seq)).collect();
        // The hidden states handed to the unit, which a checkpointed block keeps.
        let residual = if precision.autocast { 4 } else { precision.compute_bytes() };
        let input =
            residual.saturating_mul(model.facts.hidden_size).saturating_mul(batch).saturating_mul(seq);
        let total = bytes.iter().fold(0u64, |a, b| a.saturating_add(*b));
        let training = workload.mode == Mode::Train;
        let saved = if training { bytes.clone() } else { Vec::new() };
        // In inference nothing is kept: the declaration is what the module holds while it runs.
        let forward_transient = if training { 0 } else { total };
        let acts =
            BlockActivations { saved, forward_transient, working_set: bytes, backward_transient: 0, input };
        if self.whole { Declared::Whole(acts) } else { Declared::Inside(acts) }
    }
}

/// The declarations of block `layer` of `model` (an index into `facts.layers`), if any.
pub(crate) fn block(model: &ModelDescription, layer: usize) -> Option<Declarations> {
    let path = &model.facts.layers.get(layer)?.path;
    let module = model.root.find(path).filter(|m| m.path == *path)?;
    Declarations::of(module)
}

/// The declarations of unit `index` of `units`, a unit outside the blocks (blocks go through
/// [`block`]): its module's, or those inside it; for a unit of a parent's own tensors (its
/// children are units of their own), the parent's own declaration only.
pub(crate) fn outside_blocks(model: &ModelDescription, units: &[Unit], index: usize) -> Option<Declarations> {
    let unit = units.get(index)?;
    let module = model.root.find(&unit.path)?;
    if unit.keys.first() != Some(&unit.path) {
        return Declarations::own(module);
    }
    Declarations::of(module)
}

/// The declaration of a module that holds units without being one (a container such as a
/// two-linear readout whose linears are the units), charged to the first unit under it in
/// execution order when that is unit `index`: the container's own declaration, which adds to
/// that unit's activations.
pub(crate) fn above(model: &ModelDescription, units: &[Unit], index: usize) -> Option<Declarations> {
    let path = &units.get(index)?.path;
    // Outermost first: a declaring container covers the containers inside it.
    let container = path.match_indices('.').map(|(i, _)| &path[..i]).find_map(|ancestor| {
        let module = model.root.find(ancestor)?;
        let declares = module.activations.is_some() && !units.iter().any(|u| u.path == ancestor);
        declares.then_some(module)
    })?;
    let first = units.iter().position(|u| covers(&container.path, &u.path))?;
    if first != index {
        return None;
    }
    Declarations::own(container)
}

/// The outermost declarations at or under `module`, in tree order: a declaring module's
/// declaration covers its submodules.
fn outermost(module: &Module, out: &mut Vec<ActivationSizes>) {
    match module.activations {
        Some(sizes) => out.push(sizes),
        None => module.children.iter().for_each(|c| outermost(c, out)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_scale_per_token_with_batch_times_seq_and_per_sample_with_batch() {
        let sizes = ActivationSizes { per_token: 6 << 10, per_sample: 3 << 20 };
        assert_eq!(declared_bytes(sizes, 8, 512), 8 * 512 * (6 << 10) + 8 * (3 << 20));
        assert_eq!(declared_bytes(sizes, 64, 512), 8 * declared_bytes(sizes, 8, 512));
        assert_eq!(declared_bytes(ActivationSizes::default(), 8, 512), 0);
        assert_eq!(declared_bytes(sizes, u64::MAX, 2), u64::MAX);
    }
}
