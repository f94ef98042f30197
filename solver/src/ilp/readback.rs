//! Reading HiGHS's column values back: counts per pool, per block (a pool's parts split as the
//! load stage did, or spread in proportion by [`apportion`]) and the plan per unit.

use good_lp::Variable;

use super::blocks::apportion;
use super::formulation::{Copies, Formulation};
use crate::problem::{Assignment, Problem};

impl Formulation {
    /// Whether the plan `values` leaves `cpu` and `disk` empty.
    pub(super) fn nothing_on_hosts(&self, problem: &Problem, values: &[f64]) -> bool {
        let assignment = self.assignment(problem, values);
        assignment
            .counts
            .iter()
            .all(|per_device| per_device.iter().enumerate().all(|(d, &n)| n == 0 || !problem.is_host(d)))
    }

    /// Copies of each pool on each device in `values` (one value per variable, in order of
    /// creation).
    pub(super) fn pool_counts(&self, values: &[f64]) -> Vec<Vec<u32>> {
        let mut counts = vec![vec![0; self.shape.1]; self.pools.len()];
        for (p, pool) in self.pools.iter().enumerate() {
            for (d, count) in counts[p].iter_mut().enumerate() {
                *count = match self.copies[p][d] {
                    Copies::None => 0,
                    Copies::All => pool.copies,
                    Copies::Free(v) => self.read(values, v, pool.copies).unwrap_or(0),
                };
            }
        }
        counts
    }

    /// A count variable's value, rounded, if `values` has it.
    fn read(&self, values: &[f64], v: Variable, most: u32) -> Option<u32> {
        let value = *values.get(self.column[&v])?;
        value.is_finite().then(|| value.round().clamp(0.0, f64::from(most)) as u32)
    }

    /// Copies of each block on each device: a pool's parts as the load stage split them, or
    /// where it did not, spread in proportion over the pool's devices.
    pub(super) fn block_counts(&self, values: &[f64]) -> Vec<Vec<u32>> {
        let mut counts = vec![Vec::new(); self.blocks.len()];
        for (p, on_devices) in self.pool_counts(values).into_iter().enumerate() {
            let parts = &self.parts[p];
            if let [b] = parts[..] {
                counts[b] = on_devices;
                continue;
            }
            let read: Option<Vec<Vec<u32>>> = self.split[p]
                .iter()
                .zip(parts)
                .map(|(row, &b)| {
                    let copies = self.blocks[b].copies;
                    row.iter()
                        .zip(&on_devices)
                        .map(|(cell, &all)| match cell {
                            Some(v) => self.read(values, *v, copies),
                            None => Some(all.min(copies)),
                        })
                        .collect()
                })
                .collect();
            let split = match read {
                Some(split) if !self.split[p].is_empty() => split,
                _ => {
                    apportion(&on_devices, &parts.iter().map(|&b| self.blocks[b].copies).collect::<Vec<_>>())
                }
            };
            for (&b, row) in parts.iter().zip(split) {
                counts[b] = row;
            }
        }
        counts
    }

    /// The plan in `values`.
    pub(super) fn assignment(&self, problem: &Problem, values: &[f64]) -> Assignment {
        let (n_units, n_devices) = self.shape;
        let mut counts = vec![vec![0; n_devices]; n_units];
        for (b, on_devices) in self.block_counts(values).into_iter().enumerate() {
            let block = &self.blocks[b];
            for &u in &block.members {
                counts[u] = on_devices.iter().map(|&c| c * block.per_copy(problem, u)).collect();
            }
        }
        Assignment { counts }
    }
}
