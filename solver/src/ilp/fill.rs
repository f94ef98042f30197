//! A plan on the GPUs alone without HiGHS, for the balance stage of a problem whose chain is
//! not the whole of it (llama.cpp's expert tensors beside its layers) or that has no chain at
//! all (expert parallelism): a start for the MIP, and often within the gap of the bytes'
//! floor, in which case the MIP is not needed (module documentation, "Chains").
//!
//! Two fills, the better one kept: the chain's best partition ([`chain::partition`]) and then
//! the other pools' copies, largest first, each on the GPU where it raises the utilisation
//! least (a longest-processing-time fill); or those copies first and the chain's partition
//! around them. Each fill is then improved by local search on the copies outside the chain:
//! while a copy on the most used GPU can move to another GPU, or trade places with a smaller
//! copy there, so that both end below that GPU's utilisation, the best such move is made.
//! Every move lowers the most used GPU without raising another to its level, so the search
//! ends; on Qwen3-30B's 144 expert tensors over 8 GPUs it closes most of the few percent
//! the greedy fill leaves above the floor.

use super::formulation::{Copies, Formulation, StageModel};
use crate::chain::{self, Goal};
use crate::problem::Problem;

/// Moves the local search makes at most (each is cheap; the bound only guards the time).
const MOST_MOVES: usize = 20_000;

/// Where a fill stands: each pool's copies per device, and per device the bytes held and
/// the largest workspace.
struct Fill<'a> {
    formulation: &'a Formulation,
    problem: &'a Problem,
    capacities: &'a [u64],
    counts: Vec<Vec<u32>>,
    bytes: Vec<u64>,
    workspace: Vec<u64>,
}

impl Formulation {
    /// The better of the two fills (module documentation), each pool's count per device set
    /// in a start for `model`; `None` where a copy fits no GPU it may use.
    pub(super) fn filled_start(
        &self,
        problem: &Problem,
        capacities: &[u64],
        model: &StageModel,
    ) -> Option<Vec<f64>> {
        [false, true]
            .into_iter()
            .filter_map(|rest_first| {
                let counts = self.fill(problem, capacities, rest_first)?;
                let mut start = vec![f64::INFINITY; model.vars.len()];
                for (p, on_devices) in counts.iter().enumerate() {
                    for (d, &count) in on_devices.iter().enumerate() {
                        if let Copies::Free(v) = self.copies[p][d]
                            && let Some(slot) = start.get_mut(self.column[&v])
                        {
                            *slot = f64::from(count);
                        }
                    }
                }
                Some((self.largest_utilisation(problem, &start), start))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, start)| start)
    }

    /// One fill: each pool's copies per device.
    fn fill(&self, problem: &Problem, capacities: &[u64], rest_first: bool) -> Option<Vec<Vec<u32>>> {
        let n_devices = self.shape.1;
        let mut fill = Fill {
            formulation: self,
            problem,
            capacities,
            counts: vec![vec![0u32; n_devices]; self.pools.len()],
            bytes: vec![0; n_devices],
            workspace: vec![0; n_devices],
        };
        let mut in_chain = vec![false; self.pools.len()];
        for &p in self.chain.iter().flat_map(|(pools, _)| pools) {
            in_chain[p] = true;
        }
        if !rest_first {
            fill.place_chain()?;
        }
        let mut rest: Vec<usize> = (0..self.pools.len()).filter(|&p| !in_chain[p]).collect();
        rest.sort_by_key(|&p| (std::cmp::Reverse(self.pools[p].bytes), p));
        for &p in &rest {
            for _ in 0..self.pools[p].copies {
                let d = fill.least_raised(p)?;
                fill.add(p, d);
            }
        }
        if rest_first {
            fill.improve(&rest);
            fill.place_chain()?;
        }
        fill.improve(&rest);
        Some(fill.counts)
    }
}

impl Fill<'_> {
    fn size(&self, d: usize) -> f64 {
        self.capacities[d].saturating_add(self.problem.devices[d].fixed_bytes).max(1) as f64
    }

    /// GPU `d`'s utilisation holding `bytes` with workspace `workspace`, where they fit.
    fn utilisation(&self, d: usize, bytes: u64, workspace: u64) -> Option<f64> {
        let held = bytes.checked_add(workspace)?;
        (held <= self.capacities[d])
            .then(|| (self.problem.devices[d].fixed_bytes + held) as f64 / self.size(d))
    }

    fn current(&self, d: usize) -> f64 {
        (self.problem.devices[d].fixed_bytes + self.bytes[d] + self.workspace[d]) as f64 / self.size(d)
    }

    /// Whether pool `p` may take one more copy on GPU `d`.
    fn has_room(&self, p: usize, d: usize) -> bool {
        self.formulation.is_gpu[d]
            && self.formulation.pools[p].allowed.iter().any(|&(e, most)| e == d && self.counts[p][d] < most)
    }

    /// The GPU where one more copy of pool `p` raises the utilisation least.
    fn least_raised(&self, p: usize) -> Option<usize> {
        let pool = &self.formulation.pools[p];
        pool.allowed
            .iter()
            .filter(|&&(d, most)| self.formulation.is_gpu[d] && self.counts[p][d] < most)
            .filter_map(|&(d, _)| {
                let u =
                    self.utilisation(d, self.bytes[d] + pool.bytes, self.workspace[d].max(pool.transient))?;
                Some((u, d))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, d)| d)
    }

    fn add(&mut self, p: usize, d: usize) {
        let pool = &self.formulation.pools[p];
        self.counts[p][d] += 1;
        self.bytes[d] += pool.bytes;
        self.workspace[d] = self.workspace[d].max(pool.transient);
    }

    fn remove(&mut self, p: usize, d: usize) {
        self.counts[p][d] -= 1;
        self.bytes[d] -= self.formulation.pools[p].bytes;
        self.workspace[d] = self.workspace_without(d, p, None);
    }

    /// GPU `d`'s largest workspace with one copy of `gone` fewer and one of `added` more.
    fn workspace_without(&self, d: usize, gone: usize, added: Option<usize>) -> u64 {
        let pools = &self.formulation.pools;
        let kept = (0..pools.len())
            .filter(|&q| self.counts[q][d] > u32::from(q == gone))
            .map(|q| pools[q].transient)
            .max()
            .unwrap_or(0);
        added.map_or(kept, |q| kept.max(pools[q].transient))
    }

    /// The chain's best partition around what the GPUs hold already.
    fn place_chain(&mut self) -> Option<()> {
        let formulation = self.formulation;
        let Some((chain_pools, links)) = formulation.chain.as_ref() else { return Some(()) };
        let mut slots = formulation.slots(self.problem, self.capacities, 0.0);
        for (d, slot) in slots.iter_mut().enumerate() {
            slot.capacity = slot.capacity.checked_sub(self.bytes[d])?;
            slot.fixed += self.bytes[d];
            slot.workspace = self.workspace[d];
        }
        let (_, slot_of) = chain::partition(links, &slots, Goal::Balance)?;
        let mut placed = vec![false; formulation.pools.len()];
        for (&p, &d) in chain_pools.iter().zip(&slot_of) {
            if !placed[p] {
                for _ in 0..formulation.pools[p].copies {
                    self.add(p, d);
                }
            }
            placed[p] = true;
        }
        Some(())
    }

    /// The local search of the module documentation over the copies of `movable` pools.
    fn improve(&mut self, movable: &[usize]) {
        let gpus: Vec<usize> =
            (0..self.formulation.shape.1).filter(|&d| self.formulation.is_gpu[d]).collect();
        let pools = &self.formulation.pools;
        for _ in 0..MOST_MOVES {
            let Some(&top) =
                gpus.iter().max_by(|&&a, &&b| self.current(a).total_cmp(&self.current(b)).then(b.cmp(&a)))
            else {
                return;
            };
            let level = self.current(top);
            // (the larger of the two utilisations after it, the copy leaving `top`, where it
            // goes, the copy coming back if a trade)
            let mut best: Option<(f64, usize, usize, Option<usize>)> = None;
            let mut consider = |score: Option<f64>, p: usize, e: usize, q: Option<usize>| {
                if let Some(score) = score
                    && score < level * (1.0 - 1e-12)
                    && best.is_none_or(|b| score < b.0)
                {
                    best = Some((score, p, e, q));
                }
            };
            for &p in movable.iter().filter(|&&p| self.counts[p][top] > 0) {
                // `top` without one copy of `p`, wherever it goes.
                let moved = self.utilisation(
                    top,
                    self.bytes[top] - pools[p].bytes,
                    self.workspace_without(top, p, None),
                );
                for &e in gpus.iter().filter(|&&e| e != top && self.has_room(p, e)) {
                    let there = self.utilisation(
                        e,
                        self.bytes[e] + pools[p].bytes,
                        self.workspace[e].max(pools[p].transient),
                    );
                    consider(moved.zip(there).map(|(a, b)| a.max(b)), p, e, None);
                    for &q in movable.iter().filter(|&&q| {
                        self.counts[q][e] > 0 && pools[q].bytes < pools[p].bytes && self.has_room(q, top)
                    }) {
                        let here = self.bytes[top] - pools[p].bytes + pools[q].bytes;
                        let there = self.bytes[e] + pools[p].bytes - pools[q].bytes;
                        let a = self.utilisation(top, here, self.workspace_without(top, p, Some(q)));
                        let b = self.utilisation(e, there, self.workspace_without(e, q, Some(p)));
                        consider(a.zip(b).map(|(a, b)| a.max(b)), p, e, Some(q));
                    }
                }
            }
            let Some((_, p, e, q)) = best else { return };
            self.remove(p, top);
            self.add(p, e);
            if let Some(q) = q {
                self.remove(q, e);
                self.add(q, top);
            }
        }
    }
}
