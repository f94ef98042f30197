//! The training step of the step program: forward unit by unit, the loss, backward in reverse
//! order, the optimizer step (its states created lazily at the first) and `zero_grad`
//! (`Builder::train_step`, run twice by `program.rs`).

use super::{AllocId, Builder, Component, Event};
use crate::fsdp::{self, Fsdp1};
use crate::model::units::{self, UnitKind};
use crate::placement::covers;
use crate::workload::{Finetune, GradCheckpointing, Mode, Parallelism, Trainer};

impl Builder<'_, '_> {
    /// Optimizer states (and master weights) of trainable `tensors` once created: the bytes in
    /// PyTorch's allocator, and those a paged optimizer keeps in CUDA managed memory.
    fn optimizer_state_held(&self, tensors: &[units::TrainableTensor]) -> (u64, u64) {
        // FSDP's offloaded parameters are stepped on the host, where their states are made.
        if tensors.is_empty()
            || matches!(self.workload.parallelism, Parallelism::Zero { offload_optimizer: true, .. })
            || self.r.fsdp.is_some_and(|f| f.offload)
        {
            return (0, 0);
        }
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        let all = units::optimizer_state_bytes(self.workload, tensors, dtype);
        let paged = units::paged_state_bytes(self.workload.optimizer, tensors).min(all);
        ((all - paged).div_ceil(self.r.shards), paged.div_ceil(self.r.shards))
    }

    /// LitGPT's foreach AdamW step: one temporary the size of one state of every trainable
    /// tensor on each GPU (`model/litgpt.rs`), allocated and freed at the step.
    fn litgpt_step_transient(&mut self) {
        if !crate::model::litgpt::runs(self.workload) {
            return;
        }
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        let mut per_device: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
        for groups in &self.r.trainable_groups {
            for (device, tensors) in groups {
                *per_device.entry(*device).or_default() +=
                    dtype.bytes_for(tensors.iter().map(|t| t.numel).sum());
            }
        }
        for (device, bytes) in per_device {
            let transient =
                crate::model::litgpt::optimizer_step_transient(self.workload, bytes.div_ceil(self.r.shards));
            let t = self.alloc(device, None, Component::Optimizer, transient);
            self.free(t);
        }
    }

    /// Creates unit `unit`'s optimizer states (the optimizer's first step of it), each beside
    /// its parameter.
    fn create_optimizer_states(&mut self, unit: usize) {
        let r = self.r;
        for (device, tensors) in &r.trainable_groups[unit] {
            let (in_torch, paged) = self.optimizer_state_held(tensors);
            self.alloc(*device, Some(unit), Component::Optimizer, in_torch);
            if paged > 0 {
                *self.managed.entry(*device).or_default() += paged;
            }
        }
    }

    /// A full fine-tune of a model whose head shares its weight with a unit before it (tied
    /// input and output embeddings): that unit, and the bytes of one gradient of the shared
    /// weight. The head's backward makes one gradient of it, which autograd holds in the shared
    /// weight's input buffer until the embedding's backward makes the other; the two are then
    /// summed out of place (the head's is a transposed view, which `InputBuffer::accumulate`
    /// does not add into in place) and the sum becomes `.grad`.
    fn tied_head_gradient(&self) -> Option<(usize, u64)> {
        // LitGPT's head is a parameter of its own (`model/litgpt.rs`).
        if self.workload.mode != Mode::Train
            || !matches!(self.workload.finetune, Finetune::Full)
            || crate::model::litgpt::runs(self.workload)
        {
            return None;
        }
        let head = self.r.units.iter().position(|u| u.kind == UnitKind::Head)?;
        let module = self.r.model.root.find(&self.r.units[head].path)?;
        let mut tied = None;
        module.visit(&mut |m| {
            for t in &m.tensors {
                if let (None, Some(target)) = (&tied, &t.tied_to) {
                    tied = Some((target.clone(), t.numel()));
                }
            }
        });
        let (target, numel) = tied?;
        let owner = self.r.units.iter().position(|u| covers(&u.keys[0], &target))?;
        // An embedding off the GPUs runs no backward there: nothing to hold for it.
        self.r.devices[owner]?;
        let dtype = units::trainable_dtype(self.workload, &self.r.precision);
        (owner != head).then(|| (owner, dtype.bytes_for(numel)))
    }

    pub(super) fn train_step(&mut self, step: u8) {
        let w = self.workload;
        let first = step == 1;
        let pixel_values = self.pixel_values();
        let checkpoint = w.grad_checkpointing == GradCheckpointing::Full;
        let offload = w.switches.activation_offload;
        // What each unit keeps from its forward to its backward: unit `i`'s are
        // `kept[kept_by_unit[i]]`.
        let mut kept: Vec<Option<AllocId>> = Vec::new();
        let mut kept_by_unit: Vec<std::ops::Range<usize>> = Vec::with_capacity(self.r.units.len());
        let last_block =
            (0..self.r.units.len()).rev().find(|&k| matches!(self.r.units[k].kind, UnitKind::Block(_)));
        let first_block =
            (0..self.r.units.len()).find(|&k| matches!(self.r.units[k].kind, UnitKind::Block(_)));
        // FSDP1: the root's unsharded parameter, held from the first forward on (`fsdp.rs`).
        let fsdp_device = self.r.devices.iter().flatten().next().copied();
        if let (Some(fsdp), Some(device), true) = (self.r.fsdp, fsdp_device, first) {
            let root = Fsdp1::root(&self.r.units);
            let copy_bytes = fsdp.shard_copy(root);
            let copy = self.alloc_on(device, None, Component::Weights, copy_bytes, fsdp::PRE_UNSHARD_STREAM);
            self.alloc_held_on(device, Component::Weights, root, fsdp::UNSHARD_STREAM);
            self.free(copy);
        }
        // Forward.
        for i in 0..self.r.units.len() {
            // The hidden states come from the last unit before this one on their path.
            let from = (0..i).rev().find(|&k| !self.r.units[k].side).filter(|_| !self.r.units[i].side);
            self.cross_boundary(i, from, Event::ActivationsTo(i, step));
            let Some(device) = self.r.devices[i] else {
                kept_by_unit.push(kept.len()..kept.len());
                continue;
            };
            // Taken for the unit's forward (the allocations below borrow the builder), and put
            // back for its backward.
            let acts = std::mem::take(&mut self.activations[i]);
            let is_block = matches!(self.r.units[i].kind, UnitKind::Block(_));
            let autocast = 2 * self.r.units[i].autocast_params;
            let mut dequant = self.dequant_transient(i);
            if w.trainer == Trainer::Unsloth && dequant > 0 {
                // Unsloth's LoRA kernels dequantize in the forward into one scratch buffer per
                // GPU, grown to the largest weight and kept (`_scratch("weight", …)`,
                // unsloth/kernels/utils.py): held, not a transient.
                if !self.weight_scratch.contains(&device) {
                    self.weight_scratch.push(device);
                    let on_device = (0..self.r.units.len()).filter(|&k| self.r.devices[k] == Some(device));
                    let largest = on_device.map(|k| self.dequant_transient(k)).max().unwrap_or(0);
                    self.alloc_held(device, Component::Weights, largest);
                }
                dequant = 0;
            }
            let gathered = self.gathered_weights(i);
            let unit = Some(i);
            self.cross_within(i, device, Event::ActivationsTo(i, step));
            self.compute(unit, Some(device), Event::Forward(i, step));
            let gather = self.gather(device, i, gathered, false);
            let first_kept = kept.len();
            // `UnslothCheckpointFunction` offloads a layer's input over `MINIMUM_SIZE` (2 MiB),
            // and from the second step not the last layer's (`CURRENT_GC_INDEX ==
            // LAST_GC_INDEX`), whose backward comes first.
            let unsloth_offloads = w.trainer == Trainer::Unsloth
                && acts.input > crate::model::unsloth::OFFLOAD_MINIMUM_BYTES
                && (first || Some(i) != last_block);
            if is_block && checkpoint {
                if unsloth_offloads {
                    // `UnslothCheckpointFunction` copies each layer's input to pinned CPU
                    // memory; two GPU buffers of that size, made once and kept, take it back
                    // in backward (unsloth_zoo/gradient_checkpointing.py, `GPU_BUFFERS`, and
                    // `GPU_BUFFERS_B` from the second step with 512 MiB free).
                    if !self.offload_buffers.contains(&device) {
                        self.offload_buffers.push(device);
                        self.alloc_held(device, Component::Activations, 2 * acts.input);
                    }
                    if Some(i) == first_block {
                        // Reentrant checkpointing makes the frozen embedding's output a leaf that
                        // requires grad (`enable_input_require_grads`, unsloth_zoo
                        // `prepare_model_for_training`): the first layer's node holds it to its
                        // backward, where its gradient takes its place.
                        kept.push(self.alloc(device, unit, Component::Activations, acts.input));
                    }
                } else {
                    kept.push(self.alloc(device, unit, Component::Activations, acts.input));
                }
                // Nothing is kept for backward inside a checkpointed layer: each intermediate is
                // freed once its consumer has run, so only the layer's working set is live. It
                // is one allocation here, as the recompute in backward is: the segments the
                // forward leaves cached are the ones the recompute takes again.
                let working_set = acts.working_set.iter().fold(0u64, |a, b| a.saturating_add(*b));
                self.transient_activations(device, unit, &[working_set], dequant);
            } else {
                for bytes in &acts.saved {
                    kept.push(self.alloc(device, unit, Component::Activations, *bytes));
                }
                kept.push(self.alloc(device, unit, Component::Weights, autocast));
                let t = self.alloc(device, unit, Component::Activations, acts.forward_transient + dequant);
                self.free(t);
            }
            self.free(gather);
            if offload {
                // Saved tensors move to pinned CPU memory once the unit's forward is done.
                kept.drain(first_kept..).for_each(|id| self.free(id));
            }
            kept_by_unit.push(first_kept..kept.len());
            self.activations[i] = acts;
        }
        // FSDP1: the last layer's unsharded parameter, which the loss's backward prefetches
        // (`fsdp.rs`).
        let mut fsdp_prefetch = None;
        if let (Some(_), Some(device)) = (self.r.fsdp, fsdp_device) {
            let bytes = Fsdp1::prefetched_at_loss(&self.r.units);
            fsdp_prefetch = self.alloc_on(device, None, Component::Weights, bytes, fsdp::UNSHARD_STREAM);
        }
        // Loss, on the head's device, as part of the head's run: a task head's (`model/head.rs`)
        // on the last unit, which runs last and backward first; vocabulary logits otherwise.
        let task = crate::model::head::task_head(self.r.model, w, &self.r.precision);
        let head = match &task {
            Some(_) => (0..self.r.units.len()).rev().find(|&i| self.r.devices[i].is_some()),
            None => self.r.units.iter().position(|u| u.kind == UnitKind::Head),
        };
        let mut logits_ids = Vec::new();
        if let (Some(task), Some(h)) = (&task, head)
            && let Some(device) = self.r.devices[h]
        {
            let unit = Some(h);
            self.compute(unit, Some(device), Event::Loss(step));
            for bytes in &task.kept {
                logits_ids.push(self.alloc(device, unit, Component::Logits, *bytes));
            }
            self.compute(unit, Some(device), Event::LossBackward(step));
            let transient = self.alloc(device, unit, Component::Logits, task.loss_transient);
            self.free(transient);
        } else if let Some(h) = head
            && let Some(device) = self.r.devices[h]
        {
            self.vocabulary_loss(h, device, step, &mut logits_ids);
        }
        // Backward.
        let zero2 = matches!(w.parallelism, Parallelism::Zero { stage: 2.., .. });
        let tied = self.tied_head_gradient();
        let mut tied_part = None;
        for i in (0..self.r.units.len()).rev() {
            let from = (i + 1..self.r.units.len())
                .find(|&k| !self.r.units[k].side)
                .filter(|_| !self.r.units[i].side);
            self.cross_boundary(i, from, Event::GradientsTo(i, step));
            let Some(device) = self.r.devices[i] else { continue };
            let acts = &self.activations[i];
            let (saved, backward_transient) = (acts.saved.iter().sum(), acts.backward_transient);
            let is_block = matches!(self.r.units[i].kind, UnitKind::Block(_));
            // Gradients zeroed in place stay allocated from the first backward on.
            let keep = w.switches.keep_gradients && !first;
            let grads: Vec<(u32, u64)> =
                self.grad_bytes(i).into_iter().map(|(d, b)| (d, if keep { 0 } else { b })).collect();
            let grads_new: u64 = grads.iter().map(|(_, b)| b).sum();
            let gathered = match self.r.fsdp {
                Some(_) => Fsdp1::gathered(&self.r.units, i, true),
                None => self.gathered_weights(i),
            };
            if is_block {
                // The prefetched layer is this one: counted in `gathered` from here on.
                self.free(fsdp_prefetch.take());
            }
            let unit = Some(i);
            self.cross_within(i, device, Event::GradientsTo(i, step));
            self.compute(unit, Some(device), Event::Backward(i, step));
            let gather = self.gather(device, i, gathered, true);
            let mut recomputed = None;
            if (is_block && checkpoint) || offload {
                // Recomputed (or reloaded) together and freed together: one block.
                recomputed = self.alloc(device, unit, Component::Activations, saved);
            }
            let mut contribution = None;
            let mut sum = None;
            match tied {
                Some((owner, bytes)) if Some(i) == head => {
                    let shared = self.r.devices[owner].unwrap_or(device);
                    tied_part = self.alloc(shared, unit, Component::Gradients, bytes);
                }
                Some((owner, bytes)) if owner == i && tied_part.is_some() => {
                    // This unit's gradient of the shared weight, then the sum, which is the
                    // `.grad` below unless gradients are kept (then it is added in place).
                    contribution = self.alloc(device, unit, Component::Gradients, bytes);
                    if grads_new < bytes {
                        sum = self.alloc(device, unit, Component::Gradients, bytes);
                    }
                }
                _ => {}
            }
            let grad: Vec<(u32, Option<AllocId>)> = grads
                .iter()
                .map(|&(d, bytes)| (d, self.alloc(d, unit, Component::Gradients, bytes)))
                .collect();
            if self.r.units[i].kind == UnitKind::Embedding {
                // LitGPT's QLoRA `StableEmbedding`: its gradient, never stepped nor zeroed, is
                // held from the first backward; later ones add a new one into it in place.
                let bytes =
                    crate::model::litgpt::stable_embedding_gradient(w, self.r.units[i].weight_bytes());
                if first {
                    self.alloc_held(device, Component::Gradients, bytes);
                } else {
                    let added = self.alloc(device, unit, Component::Gradients, bytes);
                    self.free(added);
                }
            }
            // The weight dequantized again (`Trainer::dequantizes_again_in_backward`); under
            // LitGPT the head's is the largest.
            let again = w.trainer.dequantizes_again_in_backward();
            let dequant = if again { self.dequant_transient(i) } else { 0 };
            let t = self.alloc(device, unit, Component::Activations, backward_transient + dequant);
            self.free(t);
            if contribution.is_some() {
                self.free(sum);
                self.free(contribution);
                self.free(tied_part.take());
            }
            self.free(recomputed);
            kept_by_unit[i].clone().for_each(|k| self.free(kept[k]));
            self.free(gather);
            if Some(i) == head {
                logits_ids.drain(..).for_each(|id| self.free(id));
            }
            if w.switches.optimizer_in_backward {
                // torchtune's `register_optim_in_bwd_hooks`: a per-parameter optimizer steps in
                // the gradient's post-accumulate hook, creating its states on its first step,
                // and sets `.grad = None`.
                if first {
                    self.create_optimizer_states(i);
                }
                grad.into_iter().for_each(|(_, id)| self.free(id));
            } else if zero2 {
                // Reduce-scatter keeps this rank's shard of the gradients (FSDP's offload copies
                // it to the host's `_cpu_grad`).
                let host = self.r.fsdp.is_some_and(|f| f.offload);
                for ((d, id), (_, bytes)) in grad.into_iter().zip(&grads) {
                    self.free(id);
                    if !host {
                        let shard = bytes.div_ceil(self.r.shards);
                        let stream = if self.r.fsdp.is_some() { fsdp::POST_BACKWARD_STREAM } else { 0 };
                        self.alloc_on(d, unit, Component::Gradients, shard, stream);
                    }
                }
            }
        }
        // Optimizer step: the first creates the states (and master weights) it keeps; in
        // backward, each unit's were created by its own first step there.
        self.compute(None, None, Event::OptimizerStep(step));
        if first && !w.switches.optimizer_in_backward {
            for i in 0..self.r.units.len() {
                if self.r.devices[i].is_some() {
                    self.create_optimizer_states(i);
                }
            }
        }
        self.litgpt_step_transient();
        if !w.switches.keep_gradients {
            // zero_grad(set_to_none=True): gradients are freed between steps.
            let grads: Vec<AllocId> = (0..self.live.len())
                .filter(|id| matches!(self.live[*id], Some((_, Component::Gradients))))
                .collect();
            grads.into_iter().for_each(|id| self.free(Some(id)));
        }
        // The Trainer's loop holds the batch until the next one replaces it.
        self.free(pixel_values);
    }
}
