//! The whole chain with offload, exactly: where an ordered problem's chain holds every pool and
//! some of it must go to `cpu` and `disk`, every plan is a split of the chain at one position
//! `k`: the GPUs hold the positions before it in contiguous ranges, the hosts those from it on
//! (`cpu`, then `disk`). With `k` fixed, what the hosts leave to the GPU that runs them
//! ([`Problem::offload_runs_on`]) is known: their peak bytes, and as workspace the largest of
//! their weights streamed in with its own workspace (module documentation, "Offload that runs
//! on a GPU"). So each `k` is one [`chain::partition`] with that GPU's capacity lowered and its
//! workspace raised, and the positions restricted to their side of the split; the stages
//! scan the splits:
//!
//! - offload: the bytes from `k` on shrink as `k` grows, so the largest `k` with a partition;
//! - disk: for a split within the offload held, `cpu` takes the longest run it can hold;
//! - balance, crossings, fewest GPUs: the best partition over the splits within the values
//!   held, each stage as [`chain::partition`] answers it.
//!
//! The GPU running offloaded units holds some unit itself (the ILP's rule): its slot is
//! [`Slot::required`] whenever the hosts hold anything, so every split's partition is a plan.

use super::Stage;
use super::bounds::Partition;
use super::formulation::{Formulation, StageModel};
use crate::chain::{self, Goal, Link, Slot};
use crate::problem::Problem;

/// What the earlier stages hold, in their objectives' units (bytes over the formulation's
/// scale for offload and disk).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) offloaded: f64,
    pub(super) on_disk: f64,
    pub(super) balance: f64,
    pub(super) crossing: f64,
}

/// The most a stage's objective may reach once its value `value` is held: 10⁻⁶ relative above
/// it (above HiGHS's feasibility tolerance of 10⁻⁷), as the row that holds it allows.
pub(super) fn held(value: f64) -> f64 {
    value + 1e-6 * value.abs().max(1.0)
}

/// A value `value` within the held `limit`.
fn within(value: f64, limit: f64) -> bool {
    value <= held(limit)
}

impl Formulation {
    /// Whether every plan is a split of the whole chain as this module scans them: the chain
    /// holds every pool, and there are hosts, all after every GPU in device order (accelerate's
    /// and the pipeline's; llama.cpp puts `cpu` first, its first layers there). Then a chain
    /// with no split has no plan.
    pub(super) fn splits_whole_chain(&self) -> bool {
        let first_host = self.is_gpu.iter().position(|&gpu| !gpu);
        let last_gpu = self.is_gpu.iter().rposition(|&gpu| gpu);
        self.chain_is_whole() && first_host.is_some_and(|h| last_gpu.is_none_or(|g| g < h))
    }

    /// The best split of the whole chain between GPUs and hosts for `stage`, the earlier
    /// stages held at `held`; `None` where the chain is not the whole problem, there is no
    /// host, or no split has a partition.
    pub(super) fn split_partition(
        &self,
        problem: &Problem,
        capacities: &[u64],
        model: &StageModel,
        stage: Stage,
        held: &Held,
    ) -> Option<Partition> {
        let (pools, links) = self.chain.as_ref()?;
        if !self.splits_whole_chain() {
            return None;
        }
        let hosts: Vec<usize> = (0..self.shape.1).filter(|&d| !self.is_gpu[d]).collect();
        let base = self.slots(problem, capacities, f64::INFINITY);
        let runs_on = problem.offload_runs_on.filter(|&r| self.is_gpu.get(r).copied().unwrap_or(false));
        let m = links.len();
        // Per position: bytes on a host, bytes left to the running GPU, and the workspace there.
        let on_host = |i: usize| if runs_on.is_some() { links[i].host_bytes } else { links[i].bytes };
        let peak = |i: usize| if runs_on.is_some() { links[i].bytes - links[i].host_bytes } else { 0 };
        let mut suffix = vec![0u64; m + 1];
        for i in (0..m).rev() {
            suffix[i] = suffix[i + 1].saturating_add(on_host(i));
        }
        // The hosts in order (`cpu`, then `disk`): the first takes the positions from `k` to
        // `j`, the second those from `j` on.
        let (first, second) = (hosts[0], hosts.get(1).copied());
        // Whether `first` holds positions `k..j`: its bytes and its largest workspace.
        let first_holds = |k: usize, j: usize, capacity: u64| {
            let bytes: u64 = (k..j).map(on_host).sum();
            let workspace = (k..j).map(|i| links[i].transient).max().unwrap_or(0);
            (k..j).all(|i| links[i].allowed[first]) && bytes.saturating_add(workspace) <= capacity
        };
        let mut best: Option<(f64, Vec<usize>)> = None;
        for k in possible_splits(links, &base).rev() {
            let offloaded = suffix[k] as f64 / self.scale;
            if stage != Stage::Offload && !within(offloaded, held.offloaded) {
                break;
            }
            let mut slots = base.clone();
            if let Some(r) = runs_on.filter(|_| k < m) {
                let peaks: u64 = (k..m).map(peak).sum();
                let streamed = (k..m).map(|i| on_host(i) + links[i].transient).max().unwrap_or(0);
                let Some(capacity) = slots[r].capacity.checked_sub(peaks) else { continue };
                slots[r] = Slot {
                    capacity,
                    fixed: slots[r].fixed + peaks,
                    workspace: streamed,
                    required: true,
                    ..slots[r].clone()
                };
            }
            // The splits between the hosts to try: for offload and disk, the longest run the
            // first holds (the least on the second); after them, every split within the held.
            let longest = (k..=m).rev().find(|&j| first_holds(k, j, slots[first].capacity)).unwrap_or(k);
            let splits: Vec<usize> = match (stage, second) {
                (_, None) => vec![m],
                (Stage::Offload | Stage::Disk, Some(_)) => vec![longest],
                (_, Some(_)) => (k..=longest)
                    .rev()
                    .take_while(|&j| within(suffix[j] as f64 / self.scale, held.on_disk))
                    .collect(),
            };
            for j in splits {
                let sided: Vec<Link> = links
                    .iter()
                    .enumerate()
                    .map(|(i, link)| {
                        let side = |d: usize| match i {
                            _ if i < k => self.is_gpu[d],
                            _ if i < j => d == first,
                            _ => Some(d) == second,
                        };
                        let mut link = link.clone();
                        for (d, allowed) in link.allowed.iter_mut().enumerate() {
                            *allowed &= side(d);
                        }
                        link
                    })
                    .collect();
                let answer = match stage {
                    Stage::Offload | Stage::Balance => chain::partition(&sided, &slots, Goal::Balance),
                    Stage::Disk => chain::partition(&sided, &slots, Goal::Balance)
                        .map(|(_, slot_of)| (suffix[j] as f64 / self.scale, slot_of)),
                    Stage::Crossing => {
                        chain::partition(&sided, &slots, Goal::Crossing { limit: held.balance })
                    }
                    Stage::Devices => {
                        chain::partition(&sided, &slots, Goal::Crossing { limit: held.balance })
                            .filter(|(crossing, _)| within(*crossing, held.crossing))
                            .and_then(|_| {
                                chain::partition(&sided, &slots, Goal::Fewest { limit: held.balance })
                            })
                    }
                    Stage::Load => return None,
                };
                let Some((value, slot_of)) = answer else { continue };
                let value = if stage == Stage::Offload { offloaded } else { value };
                if best.as_ref().is_none_or(|b| value < b.0) {
                    best = Some((value, slot_of));
                }
            }
            if stage == Stage::Offload && best.is_some() {
                break;
            }
        }
        let (value, slot_of) = best?;
        Some(Partition { value, start: self.chain_start(model, pools, &slot_of), complete: true })
    }
}

/// The splits of the chain `links` between GPUs and hosts (the first position on a host) that
/// may have a partition over `slots` (as [`Formulation::slots`] gives them, hosts unbounded):
/// every position before the split needs a GPU it fits on alone, and every one after it a host
/// it may go to. Empty where none may.
pub(super) fn possible_splits(links: &[Link], slots: &[Slot]) -> std::ops::RangeInclusive<usize> {
    let m = links.len();
    let fits_a_gpu = |link: &Link| {
        slots.iter().enumerate().any(|(d, slot)| {
            slot.counted && link.allowed[d] && link.bytes.saturating_add(link.transient) <= slot.capacity
        })
    };
    let to_a_host = |link: &Link| slots.iter().enumerate().any(|(d, slot)| !slot.counted && link.allowed[d]);
    let highest = links.iter().position(|link| !fits_a_gpu(link)).unwrap_or(m);
    let lowest = links.iter().rposition(|link| !to_a_host(link)).map_or(0, |i| i + 1);
    lowest..=highest
}
