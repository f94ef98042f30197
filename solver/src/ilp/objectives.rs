//! The variables and rows only the stages after the balance need (module documentation,
//! "Objectives"): the largest GPU load, with pools of parts of different loads split into
//! per-part counts; the handoffs crossing a device boundary, weighted by link; the GPUs used.
//! Each is made after all earlier variables, so that an earlier stage's plan starts the next.

use good_lp::{Expression, Variable, variable};

use super::Stage;
use super::blocks::Block;
use super::formulation::{Builder, Copies, Handoffs, StageModel, has_variables};
use crate::problem::Problem;

/// Counts of each part of a split pool on each device: `split[pool][part][device]`.
type Split = Vec<Vec<Vec<Option<Variable>>>>;

impl Builder {
    /// Load balance, where units carry loads and there are GPUs: the stage's model, and its
    /// scale (mean load per GPU) with a bound on its objective. `blocks` are the problem's
    /// blocks and `parts` each pool's; a pool whose parts carry different loads is split into
    /// per-part counts, recorded in `split`.
    pub(super) fn load_stage(
        &mut self,
        blocks: &[Block],
        parts: &[Vec<usize>],
        gpus: &[usize],
        split: &mut Split,
    ) -> Option<(StageModel, (f64, f64))> {
        let n_devices = self.size.len();
        let total_load: f64 = blocks.iter().map(|b| b.load * f64::from(b.copies)).sum();
        if total_load <= 0.0 || gpus.is_empty() {
            return None;
        }
        let per_gpu = total_load / gpus.len() as f64;
        // Load that cannot leave the GPUs spreads at best evenly, and a copy is indivisible.
        let gpu_only = |b: &&Block| b.allowed.iter().all(|&(d, _)| self.is_gpu[d]);
        let must: f64 = blocks.iter().filter(gpu_only).map(|b| b.load * f64::from(b.copies)).sum();
        let heaviest = blocks.iter().filter(gpu_only).map(|b| b.load).fold(0.0, f64::max);
        let bound = (per_gpu, (must / total_load).max(heaviest / per_gpu));
        let mut load = vec![Expression::default(); n_devices];
        for (p, pool_parts) in parts.iter().enumerate() {
            let varied = pool_parts.iter().any(|&b| blocks[b].load != blocks[pool_parts[0]].load);
            let free = self.copies[p].iter().any(|c| matches!(c, Copies::Free(_)));
            if !varied || !free {
                if self.blocks[p].load > 0.0 {
                    for (d, load) in load.iter_mut().enumerate() {
                        load.add_mul(self.blocks[p].load / per_gpu, self.count(p, d));
                    }
                }
                continue;
            }
            split[p] = self.split_pool(p, pool_parts, blocks, per_gpu, &mut load);
        }
        let max_load = self.vars.add(variable().min(0.0));
        for &d in gpus {
            self.rows.push((load[d].clone() - max_load).leq(0.0));
        }
        Some((self.take(Stage::Load, Expression::from(max_load)), bound))
    }

    /// Per-part counts of pool `p` (parts `pool_parts`), tied to the pool's count on each
    /// device, each part's load over `per_gpu` added to `load`. Returns `[part][device]`.
    fn split_pool(
        &mut self,
        p: usize,
        pool_parts: &[usize],
        blocks: &[Block],
        per_gpu: f64,
        load: &mut [Expression],
    ) -> Vec<Vec<Option<Variable>>> {
        let n_devices = self.size.len();
        let mut split = Vec::with_capacity(pool_parts.len());
        let mut on_device = vec![Expression::default(); n_devices];
        for &b in pool_parts {
            let mut placed = Expression::default();
            let mut row = Vec::with_capacity(n_devices);
            for d in 0..n_devices {
                let cell = match self.copies[p][d] {
                    Copies::Free(_) => {
                        let most = self.most(p, d).min(f64::from(blocks[b].copies));
                        let v = self.vars.add(variable().integer().clamp(0.0, most));
                        placed += v;
                        on_device[d] += v;
                        load[d].add_mul(blocks[b].load / per_gpu, v);
                        Some(v)
                    }
                    Copies::None | Copies::All => None,
                };
                row.push(cell);
            }
            self.rows.push(placed.eq(f64::from(blocks[b].copies)));
            split.push(row);
        }
        for (d, parts_here) in on_device.into_iter().enumerate() {
            if matches!(self.copies[p][d], Copies::Free(_)) {
                self.rows.push((parts_here - self.count(p, d)).eq(0.0));
            }
        }
        split
    }

    /// Handoffs crossing devices: for each pair of consecutive pools and each device the first
    /// may use, `c ≥ y[a][d] − y[b][d]`. The stage's model, unless nothing can cross.
    pub(super) fn crossing_stage(&mut self, handoffs: &Handoffs) -> Option<StageModel> {
        let mut crossing = Expression::default();
        for &(block_a, block_b, bytes) in handoffs.pairs.iter().filter(|p| p.2 > 0.0) {
            let from: Vec<usize> = self.blocks[block_a].allowed.iter().map(|a| a.0).collect();
            for d in from {
                let leaves = self.vars.add(variable().clamp(0.0, 1.0));
                let here = self.presence(block_a, d) - self.presence(block_b, d);
                self.rows.push((here - leaves).leq(0.0));
                crossing.add_mul(bytes * handoffs.weight[d], leaves);
            }
        }
        has_variables(&crossing).then(|| self.take(Stage::Crossing, crossing))
    }

    /// Fewest GPUs: a "used" indicator on each GPU that may hold anything (bounding its
    /// capacity row where it is new). The stage's model, unless no GPU can be left empty.
    pub(super) fn fewest_gpus_stage(&mut self, capacities: &[u64], gpus: &[usize]) -> Option<StageModel> {
        let mut used_gpus = Expression::default();
        for &d in gpus {
            if (0..self.blocks.len()).any(|b| !matches!(self.copies[b][d], Copies::None)) {
                let known = self.used[d].is_some();
                let flag = self.used(d);
                if !known {
                    let limit = capacities[d] as f64 / self.size[d];
                    self.rows.push((self.held[d].clone() - limit * flag).leq(0.0));
                }
                used_gpus += flag;
            }
        }
        has_variables(&used_gpus).then(|| self.take(Stage::Devices, used_gpus))
    }
}

impl Handoffs {
    /// The handoffs of the consecutive units `pairs` (unit indices), between the pools
    /// `block_of` gives, among `pools`.
    pub(super) fn new(
        problem: &Problem,
        pairs: &[(usize, usize)],
        block_of: &[usize],
        pools: &[Block],
    ) -> Self {
        let largest = pairs.iter().map(|&(a, _)| problem.units[a].handoff_bytes).max().unwrap_or(0).max(1);
        Handoffs {
            pairs: pairs
                .iter()
                .map(|&(a, b)| {
                    (block_of[a], block_of[b], problem.units[a].handoff_bytes as f64 / largest as f64)
                })
                .filter(|&(a, b, _)| a != b && pools[a].copies > 0 && pools[b].copies > 0)
                .collect(),
            weight: link_weights(problem),
        }
    }
}

/// Weight of a handoff leaving each device: the inverse of its link bandwidth over the mean
/// inverse bandwidth of the known links; 1 where the bandwidth is unknown (0).
fn link_weights(problem: &Problem) -> Vec<f64> {
    let known: Vec<f64> = problem
        .devices
        .iter()
        .filter(|d| d.link_bytes_per_s > 0)
        .map(|d| 1.0 / d.link_bytes_per_s as f64)
        .collect();
    let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
    problem
        .devices
        .iter()
        .map(|d| if d.link_bytes_per_s > 0 { 1.0 / d.link_bytes_per_s as f64 / mean } else { 1.0 })
        .collect()
}
