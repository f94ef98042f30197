//! Bounds and starts known without HiGHS: the utilisation floor from bytes alone, the chain's
//! exact partition ([`crate::chain`]) as a cut and a start, the load stage's price of a plan
//! (its floor and re-split are `loads.rs`'s), and the crossing stage's price of a plan and floor.

use super::blocks::{Block, spills};
use super::formulation::{Copies, Formulation, Handoffs, StageModel};
use crate::chain::{self, Goal, Link, Slot};
use crate::problem::Problem;
use vramplan_sim::placement::Target;

/// The chain's best partition for one stage.
pub(super) struct Partition {
    /// Its value: a lower bound on the stage's objective.
    pub(super) value: f64,
    /// Its plan as a start: the chain's counts, the other columns unknown (infinite).
    pub(super) start: Vec<f64>,
    /// Whether it is a plan of the whole problem on GPUs alone: every pool is in the chain
    /// once, so the partition is the stage's optimum and HiGHS is not needed.
    pub(super) complete: bool,
}

impl Formulation {
    /// Whether the chain holds every pool once: then its partitions are exactly the plans.
    pub(super) fn chain_is_whole(&self) -> bool {
        self.chain.as_ref().is_some_and(|(chain, _)| is_whole(chain, &self.pools))
    }

    /// The best partition of the chain for `goal` ([`chain::partition`]), `cpu` and `disk` each
    /// holding at most `offloaded_bytes`.
    pub(super) fn partition(
        &self,
        problem: &Problem,
        capacities: &[u64],
        model: &StageModel,
        goal: Goal,
        offloaded_bytes: f64,
    ) -> Option<Partition> {
        let (pools, links) = self.chain.as_ref()?;
        let slots = self.slots(problem, capacities, offloaded_bytes);
        let (value, slot_of) = chain::partition(links, &slots, goal)?;
        let complete = self.chain_is_whole() && slot_of.iter().all(|&d| self.is_gpu[d]);
        let start = self.chain_start(model, pools, &slot_of);
        Some(Partition { value, start, complete })
    }

    /// Each device as the chain's partition sees it, `cpu` and `disk` holding at most
    /// `host_bytes` each.
    pub(super) fn slots(&self, problem: &Problem, capacities: &[u64], host_bytes: f64) -> Vec<Slot> {
        chain_slots(problem, capacities, &self.handoffs.weight, host_bytes)
    }

    /// A partition of the chain (`pools` at each position, `slot_of` their devices) as a start
    /// for `model`: the chain's counts, the other columns unknown (infinite).
    pub(super) fn chain_start(&self, model: &StageModel, pools: &[usize], slot_of: &[usize]) -> Vec<f64> {
        let mut start = vec![f64::INFINITY; model.vars.len()];
        for (&pool, &device) in pools.iter().zip(slot_of) {
            for (d, copies) in self.copies[pool].iter().enumerate() {
                if let Copies::Free(v) = copies
                    && let Some(slot) = start.get_mut(self.column[v])
                    && slot.is_infinite()
                {
                    *slot = if d == device { 1.0 } else { 0.0 };
                }
            }
        }
        start
    }

    /// The largest GPU utilisation of the plan `values` ([`Problem::utilisation`]).
    pub(super) fn largest_utilisation(&self, problem: &Problem, values: &[f64]) -> f64 {
        let assignment = self.assignment(problem, values);
        (0..self.shape.1)
            .filter(|&d| self.is_gpu[d])
            .map(|d| problem.utilisation(&assignment, d))
            .fold(0.0, f64::max)
    }

    /// `values` extended to `model`'s variables: the columns it adds are unknown to HiGHS
    /// (infinity, which HiGHS completes with the others fixed), except the split of pools,
    /// which [`Formulation::split_by_load`] fills.
    pub(super) fn start(&self, model: &StageModel, values: &[f64]) -> Vec<f64> {
        let mut start = values.to_vec();
        start.resize(model.vars.len(), f64::INFINITY);
        let mut counts = self.block_counts(values);
        self.split_by_load(values, &mut counts);
        for (p, rows) in self.split.iter().enumerate() {
            for (&b, row) in self.parts[p].iter().zip(rows) {
                for (cell, &count) in row.iter().zip(&counts[b]) {
                    if let Some(slot) = cell.and_then(|v| start.get_mut(self.column[&v]))
                        && slot.is_infinite()
                    {
                        *slot = f64::from(count);
                    }
                }
            }
        }
        start
    }

    /// The load stage's objective for block counts `counts`.
    pub(super) fn load_value(&self, counts: &[Vec<u32>]) -> f64 {
        let Some((per_gpu, _)) = self.loads else { return 0.0 };
        (0..self.shape.1)
            .filter(|&d| self.is_gpu[d])
            .map(|d| {
                self.blocks.iter().zip(counts).map(|(b, c)| b.load * f64::from(c[d])).sum::<f64>() / per_gpu
            })
            .fold(0.0, f64::max)
    }

    /// The crossing stage's objective for the plan in `values`.
    pub(super) fn crossing_cost(&self, values: &[f64]) -> f64 {
        let counts = self.pool_counts(values);
        let mut cost = 0.0;
        for &(a, b, bytes) in &self.handoffs.pairs {
            for ((here, next), weight) in counts[a].iter().zip(&counts[b]).zip(&self.handoffs.weight) {
                if *here > 0 && *next == 0 {
                    cost += bytes * weight;
                }
            }
        }
        cost
    }

    /// A lower bound on the crossing stage's objective once the largest utilisation is held at
    /// `balance`: the chain of ordered units must visit at least as many devices as it takes
    /// to hold its bytes (the largest rooms first, a GPU's room being what `balance` leaves of
    /// it), and each change of device costs at least the smallest handoff times the smallest
    /// link weight.
    /// 0 where a pool of several copies is in the chain (it can sit on several devices at once).
    pub(super) fn crossing_floor(&self, problem: &Problem, capacities: &[u64], balance: f64) -> f64 {
        let pairs = &self.handoffs.pairs;
        let mut chain: Vec<usize> = pairs.iter().flat_map(|&(a, b, _)| [a, b]).collect();
        chain.sort_unstable();
        chain.dedup();
        if chain.iter().any(|&b| self.pools[b].copies != 1) {
            return 0.0;
        }
        let bytes: f64 = chain.iter().map(|&b| self.pools[b].bytes as f64).sum();
        let mut rooms: Vec<f64> = (0..self.shape.1)
            .map(|d| {
                let device = &problem.devices[d];
                let capacity = capacities[d] as f64;
                match device.tier {
                    Target::Gpu(_) => {
                        let size = capacities[d].saturating_add(device.fixed_bytes) as f64;
                        (balance * size - device.fixed_bytes as f64).clamp(0.0, capacity)
                    }
                    Target::Cpu | Target::Disk => capacity,
                }
            })
            .collect();
        rooms.sort_unstable_by(|a, b| b.total_cmp(a));
        let mut held = 0.0;
        let visited = rooms.iter().take_while(|&&room| {
            let short = held < bytes;
            held += room;
            short
        });
        let changes = visited.count().saturating_sub(1) as f64;
        let cheapest = pairs.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
        let lightest = self.handoffs.weight.iter().copied().fold(f64::INFINITY, f64::min);
        if changes == 0.0 { 0.0 } else { changes * cheapest * lightest }
    }
}

/// A lower bound on the largest GPU utilisation of any plan, from bytes alone: the bytes that
/// cannot leave the GPUs (all of them without offload devices; otherwise those of GPU-only
/// blocks, or what the offload devices cannot take, whichever is more) must fit under
/// `Σ_d max(0, U·S_d − fixed_d)` over the GPUs. A GPU whose fixed bytes alone stay under this
/// bound may count them as if it were always used: that adds `U ≥ fixed_d / S_d`, which every
/// plan meets, and keeps the relaxation from paying a fraction of the fixed bytes. With
/// `offloaded_at_most`, the bound for plans that offload at most that many bytes (once the
/// offload stage has held its value; 0 where it proved that none needs to): every byte but
/// those stays on the GPUs.
pub(super) fn utilisation_floor(
    problem: &Problem,
    capacities: &[u64],
    blocks: &[Block],
    offloaded_at_most: Option<f64>,
) -> f64 {
    let offload: Vec<usize> =
        (0..problem.devices.len()).filter(|&d| !matches!(problem.devices[d].tier, Target::Gpu(_))).collect();
    let total = |stays: &dyn Fn(&Block) -> bool| -> f64 {
        blocks.iter().filter(|b| stays(b)).map(|b| b.bytes as f64 * f64::from(b.copies)).sum()
    };
    let everything = total(&|_| true);
    let on_gpus = if offload.is_empty() {
        everything
    } else {
        let gpu_only = total(&|b| b.allowed.iter().all(|(d, _)| !offload.contains(d)));
        let offload_room: f64 = offload.iter().map(|&d| capacities[d] as f64).sum();
        let held = offloaded_at_most.map_or(0.0, |most| everything - most.max(0.0));
        gpu_only.max(everything - offload_room).max(held)
    };
    let gpus: Vec<(f64, f64)> = (0..problem.devices.len())
        .filter(|d| !offload.contains(d))
        .map(|d| {
            (
                capacities[d].saturating_add(problem.devices[d].fixed_bytes) as f64,
                problem.devices[d].fixed_bytes as f64,
            )
        })
        .collect();
    let room = |u: f64| -> f64 { gpus.iter().map(|&(size, fixed)| (u * size - fixed).max(0.0)).sum() };
    if on_gpus <= 0.0 || room(1.0) < on_gpus {
        return 0.0;
    }
    // Bisection, keeping the side below the root: the result never exceeds the true bound.
    let (mut low, mut high) = (0.0, 1.0);
    for _ in 0..60 {
        let middle = 0.5 * (low + high);
        if room(middle) < on_gpus { low = middle } else { high = middle }
    }
    low
}

/// The chain of an ordered problem for [`chain::partition`]: the pool at each position, and
/// the positions. `None` where the consecutive pairs do not form one chain or a pool in it has
/// several copies (it could sit on several devices at once).
pub(super) fn chain_links(
    handoffs: &Handoffs,
    pooled: &[Block],
    n_devices: usize,
) -> Option<(Vec<usize>, Vec<Link>)> {
    let first = handoffs.pairs.first()?;
    let mut pools = vec![first.0];
    for (k, &(a, b, _)) in handoffs.pairs.iter().enumerate() {
        if pools[k] != a {
            return None;
        }
        pools.push(b);
    }
    let mut seen = vec![false; pooled.len()];
    let mut links = Vec::with_capacity(pools.len());
    for (k, &p) in pools.iter().enumerate() {
        let pool = &pooled[p];
        if pool.copies != 1 {
            return None;
        }
        let mut allowed = vec![false; n_devices];
        for &(d, _) in &pool.allowed {
            allowed[d] = true;
        }
        links.push(Link {
            bytes: if seen[p] { 0 } else { pool.bytes },
            host_bytes: if seen[p] { 0 } else { pool.bytes_on(true) },
            transient: pool.transient,
            allowed,
            handoff: handoffs.pairs.get(k).map_or(0.0, |pair| pair.2),
        });
        seen[p] = true;
    }
    Some((pools, links))
}

/// Whether the chain (`chain`: the pool at each position) holds every pool of `pooled` once (or
/// none of its copies): then its partitions are exactly the plans.
pub(super) fn is_whole(chain: &[usize], pooled: &[Block]) -> bool {
    let mut seen = vec![0u32; pooled.len()];
    for &pool in chain {
        seen[pool] += 1;
    }
    seen.iter().zip(pooled).all(|(&n, pool)| n == 1 || (n == 0 && pool.copies == 0))
}

/// Each device as the chain's partition sees it (`weight`: a handoff's weight leaving it),
/// `cpu` and `disk` holding at most `host_bytes` each.
pub(super) fn chain_slots(
    problem: &Problem,
    capacities: &[u64],
    weight: &[f64],
    host_bytes: f64,
) -> Vec<Slot> {
    (0..problem.devices.len())
        .map(|d| {
            let fixed = problem.devices[d].fixed_bytes;
            let gpu = matches!(problem.devices[d].tier, Target::Gpu(_));
            let capacity = if gpu { capacities[d] } else { capacities[d].min(host_bytes.max(0.0) as u64) };
            Slot {
                capacity,
                fixed,
                size: capacities[d].saturating_add(fixed).max(1) as f64,
                counted: gpu,
                spills: spills(problem, d),
                weight: weight[d],
                workspace: 0,
                required: false,
            }
        })
        .collect()
}
