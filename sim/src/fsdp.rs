//! torch's FSDP1 (`FullyShardedDataParallel`) as Answer.AI's fsdp_qlora wraps a QLoRA model
//! (`--trainer fsdp-qlora --parallel fsdp`): what each rank holds of every unit's weights, what
//! it all-gathers around a unit's compute, and the root unit's parameters, which stay
//! unsharded. The step program (`program.rs`) asks these questions; the sources are in
//! docs/memory-model.md, "FSDP with QLoRA".
//!
//! - fsdp_qlora's wrapping policy (`train.py`, `get_wrapping_policy`: `lambda_auto_wrap_policy`
//!   for every trainable leaf, `transformer_auto_wrap_policy` for every decoder layer) gives one
//!   flat parameter per decoder layer (its 4-bit weights, stored as bf16 by `quant_storage`, and
//!   its norms), one per LoRA linear, and the root's (embeddings, final norm, head). A unit
//!   here is a decoder layer with its adapters, or a module outside the layers, which the root
//!   holds.
//! - `FlatParamHandle.shard` keeps `ceil(numel / world)` elements a rank; bitsandbytes'
//!   quantization state (absmax, nested absmax, code) is no parameter, so FSDP neither flattens
//!   nor shards it: every rank holds all of it, on the GPU even when parameters are offloaded.
//! - `_unshard` all-gathers a unit's whole flat parameter into its padded unsharded tensor;
//!   `_post_forward_reshard` frees it after the unit's forward, except the root's
//!   (`not state._is_root`): the root's stays unsharded, and since its parameters take no
//!   gradient and its inputs (token ids) none either, no post-backward hook reshards it
//!   (`_register_post_backward_hook` and `_register_post_backward_reshard_only_hook` return
//!   early): it is held from the first forward on.
//! - backward prefetches the next unit's all-gather (`backward_prefetch=BACKWARD_PRE`, the
//!   default): from the loss's backward on, the next decoder layer's unsharded parameter is
//!   live beside the current one's. The forward does not prefetch (`forward_prefetch=False`).
//! - with `CPUOffload(offload_params=True)` the shards, the sharded gradients (`_cpu_grad`) and
//!   so the optimizer's states live on the host; each unit's shard is copied to the GPU for the
//!   all-gather and dropped when the unsharded parameter replaces it (`pre_unshard`,
//!   `_use_unsharded_flat_param`).

use crate::model::units::{Unit, UnitKind};
use crate::workload::{Mode, Parallelism, Trainer, Workload};

/// FSDP1's full sharding of a QLoRA model over `shards` ranks, as fsdp_qlora sets it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fsdp1 {
    /// Ranks the flat parameters are sharded over (the profile's GPUs).
    pub shards: u64,
    /// `CPUOffload(offload_params=True)` (`--offload-params`, fsdp_qlora's `--use_cpu_offload`).
    pub offload: bool,
}

impl Fsdp1 {
    /// FSDP1 under `workload`, where it applies: fsdp_qlora's training over `--parallel fsdp`.
    pub(crate) fn of(workload: &Workload, shards: u64) -> Option<Fsdp1> {
        let Parallelism::Zero { stage: 3, offload_params, .. } = workload.parallelism else { return None };
        (workload.trainer == Trainer::FsdpQlora && workload.mode == Mode::Train)
            .then_some(Fsdp1 { shards: shards.max(1), offload: offload_params })
    }

    /// Bytes of `unit`'s frozen flat parameter unsharded: its weights less the quantization
    /// state (not flattened) and the LoRA adapters (each its own flat parameter, all-gathered
    /// only around its own matmul: a few MiB at most, not modelled).
    pub(crate) fn unsharded(unit: &Unit) -> u64 {
        unit.weight_bytes().saturating_sub(unit.quant_constants).saturating_sub(Self::adapters(unit).sum())
    }

    /// The bytes of each trainable tensor of `unit` (LoRA's A and B), as held unsharded.
    fn adapters(unit: &Unit) -> impl Iterator<Item = u64> + '_ {
        unit.trainable_tensors.iter().map(|t| unit.weight_tensors.get(t.weight).copied().unwrap_or(0))
    }

    /// The allocations a rank holds of `unit` between its computations: the shard of its frozen
    /// flat parameter and of each adapter's (none when offloaded to the host), and its
    /// quantization state whole.
    pub(crate) fn held(&self, unit: &Unit) -> Vec<u64> {
        let mut out = vec![unit.quant_constants];
        if !self.offload {
            out.push(Self::unsharded(unit).div_ceil(self.shards));
            out.extend(Self::adapters(unit).map(|bytes| bytes.div_ceil(self.shards)));
        }
        out.retain(|&bytes| bytes > 0);
        out
    }

    /// The root's unsharded flat parameter: every unit outside the decoder layers, held from
    /// the first forward on.
    pub(crate) fn root(units: &[Unit]) -> u64 {
        units.iter().filter(|u| !matches!(u.kind, UnitKind::Block(_))).map(Self::unsharded).sum()
    }

    /// Bytes all-gathered around unit `unit`'s compute beyond what the rank holds: a decoder
    /// layer's unsharded flat parameter in its forward, and in its backward the previous
    /// layer's too (prefetched). Units outside the layers are the root's, already unsharded.
    pub(crate) fn gathered(units: &[Unit], unit: usize, backward: bool) -> u64 {
        if !matches!(units[unit].kind, UnitKind::Block(_)) {
            return 0;
        }
        let prefetched =
            if backward { Self::previous_block(units, unit).map_or(0, Self::unsharded) } else { 0 };
        Self::unsharded(&units[unit]) + prefetched
    }

    /// The layer the loss's backward prefetches: the last decoder layer's unsharded flat
    /// parameter, live from the root's pre-backward hook until that layer's backward.
    pub(crate) fn prefetched_at_loss(units: &[Unit]) -> u64 {
        units.iter().rev().find(|u| matches!(u.kind, UnitKind::Block(_))).map_or(0, Self::unsharded)
    }

    fn previous_block(units: &[Unit], unit: usize) -> Option<&Unit> {
        units[..unit].iter().rev().find(|u| matches!(u.kind, UnitKind::Block(_)))
    }
}
