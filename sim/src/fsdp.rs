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
//! - the wrap (`_init_param_handle_from_module`, layer by layer, the root last) brings each
//!   unit's parameters to the GPU unsharded (`_move_module_to_device`, or on ranks other than 0
//!   fsdp_qlora's `param_init_fn`, `to_empty`), broadcasts them from rank 0 in flat buckets
//!   (`sync_module_states=True`, fsdp_qlora's `--low_memory` default), flattens them into a new
//!   flat parameter (`flatten_tensors`, a `torch.cat`), and keeps a clone of the rank's shard
//!   (`FlatParamHandle.shard`, `_get_shard`): two unsharded copies of the unit live at once,
//!   which leaves the caching allocator's segments reserved before the first step.
//! - with `CPUOffload(offload_params=True)` the shards, the sharded gradients (`_cpu_grad`) and
//!   so the optimizer's states live on the host; each unit's shard is copied to the GPU for the
//!   all-gather and dropped when the unsharded parameter replaces it (`pre_unshard`,
//!   `_use_unsharded_flat_param`).
//! - FSDP1 allocates on CUDA streams of its own (`_init_streams`): the unsharded parameters on
//!   its unshard stream, the gradient shards on its post-backward stream, the offloaded shard's
//!   copy on its pre-unshard stream. PyTorch's caching allocator serves each stream from its
//!   own pools, so these never reuse the segments the wrap left cached on the compute stream;
//!   the replay allocates them on [`UNSHARD_STREAM`], [`POST_BACKWARD_STREAM`] and
//!   [`PRE_UNSHARD_STREAM`].

use crate::model::units::{Unit, UnitKind};
use crate::workload::{Mode, Parallelism, Trainer, Workload};

/// The CUDA stream FSDP1 all-gathers on (`state._unshard_stream`): `_unshard` allocates each
/// unsharded flat parameter under it (`FlatParamHandle.unshard` →
/// `_alloc_padded_unsharded_flat_param`, a storage resize), so the caching allocator serves it
/// from that stream's pools alone.
pub(crate) const UNSHARD_STREAM: u8 = 1;

/// The CUDA stream FSDP1 reduce-scatters gradients on (`state._post_backward_stream`):
/// `_reduce_grad` allocates each gradient shard there (`new_sharded_grad`, kept as `.grad`).
pub(crate) const POST_BACKWARD_STREAM: u8 = 2;

/// The CUDA stream FSDP1 copies an offloaded shard to the GPU on (`state._pre_unshard_stream`):
/// `FlatParamHandle.pre_unshard` → `flat_param_to(device, non_blocking=True)` before the
/// all-gather.
pub(crate) const PRE_UNSHARD_STREAM: u8 = 3;

/// FSDP1's `PARAM_BROADCAST_BUCKET_SIZE` (`torch/distributed/fsdp/_init_utils.py`).
const BROADCAST_BUCKET: u64 = 250 << 20;

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

    /// What a rank holds of `unit` between its computations beside its frozen flat
    /// parameter's shard: its quantization state whole, and each adapter's shard (none when
    /// offloaded to the host). Each adapter is a flat parameter of its own, wrapped before its
    /// layer; its wrap's transients (a few MiB) are not modelled.
    pub(crate) fn held_besides_frozen(&self, unit: &Unit) -> Vec<u64> {
        let mut out = vec![unit.quant_constants];
        if !self.offload {
            out.extend(Self::adapters(unit).map(|bytes| bytes.div_ceil(self.shards)));
        }
        out.retain(|&bytes| bytes > 0);
        out
    }

    /// The frozen flat parameters in the order `FullyShardedDataParallel.__init__` wraps them
    /// (`_recursive_wrap` wraps children first): each decoder layer, then the root, which takes
    /// every unit outside the layers.
    pub(crate) fn wrap_order(units: &[Unit]) -> Vec<Vec<usize>> {
        let block = |u: &Unit| matches!(u.kind, UnitKind::Block(_));
        let mut out: Vec<Vec<usize>> =
            (0..units.len()).filter(|&i| block(&units[i])).map(|i| vec![i]).collect();
        let root: Vec<usize> = (0..units.len()).filter(|&i| !block(&units[i])).collect();
        if !root.is_empty() {
            out.push(root);
        }
        out
    }

    /// The flat buffers `sync_module_states` broadcasts a unit of `unsharded` bytes in:
    /// `_sync_params_and_buffers` → `dist._broadcast_coalesced` with `PARAM_BROADCAST_BUCKET_SIZE`
    /// (250 MiB), each bucket flattened into a copy, at most two in flight
    /// (`torch/csrc/distributed/c10d/comm.cpp`).
    pub(crate) fn broadcast_bytes(unsharded: u64) -> u64 {
        unsharded.min(2 * BROADCAST_BUCKET)
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

    /// The bytes of the host-to-device copy of a shard of a flat parameter of `unsharded`
    /// bytes that `pre_unshard` makes before its all-gather when parameters are offloaded
    /// (none otherwise); freed once the unsharded parameter replaces it.
    pub(crate) fn shard_copy(&self, unsharded: u64) -> u64 {
        if self.offload { unsharded.div_ceil(self.shards) } else { 0 }
    }

    /// The unsharded bytes of the layer whose all-gather unit `unit`'s forward or `backward`
    /// starts: the layer itself in forward, the previous layer (prefetched) in backward; 0
    /// outside the layers.
    pub(crate) fn gathered_layer(units: &[Unit], unit: usize, backward: bool) -> u64 {
        if !matches!(units[unit].kind, UnitKind::Block(_)) {
            return 0;
        }
        if backward {
            Self::previous_block(units, unit).map_or(0, Self::unsharded)
        } else {
            Self::unsharded(&units[unit])
        }
    }

    fn previous_block(units: &[Unit], unit: usize) -> Option<&Unit> {
        units[..unit].iter().rev().find(|u| matches!(u.kind, UnitKind::Block(_)))
    }
}
