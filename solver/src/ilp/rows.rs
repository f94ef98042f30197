//! The rows every stage has (module documentation, "Constraints"): every copy placed, the
//! order of an ordered problem in contiguous ranges, each device's charge, workspace, capacity
//! and utilisation, and the order of interchangeable devices. Each group is one step of
//! [`Formulation::new`](super::formulation::Formulation::new).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use good_lp::{Expression, Variable, variable};

use super::blocks::interchangeable;
use super::formulation::{Builder, Copies};
use crate::problem::Problem;
use vramplan_sim::placement::Target;

/// What the per-device rows give the stages.
pub(super) struct DeviceTerms {
    /// `U`, the largest GPU utilisation: the balance stage's objective.
    pub(super) max_utilisation: Variable,
    /// Bytes on `cpu` and `disk` over the largest `S_d`: the offload stage's objective.
    pub(super) offloaded: Expression,
    /// Bytes on `disk` alone, likewise: the disk stage's objective.
    pub(super) on_disk: Expression,
    /// Copies on `cpu` and `disk` (see [`Formulation`](super::formulation::Formulation)).
    pub(super) host_copies: Expression,
    /// Each device's charge over `S_d`: resident and peak bytes, without workspace or fixed
    /// bytes.
    pub(super) charges: Vec<Expression>,
}

impl Builder {
    /// Counts: every copy placed.
    pub(super) fn place_every_copy(&mut self) {
        for b in 0..self.blocks.len() {
            let block = &self.blocks[b];
            if let [(d, _)] = block.allowed[..] {
                self.copies[b][d] = Copies::All;
                continue;
            }
            let mut placed = Expression::default();
            for &(d, most) in &block.allowed {
                let v = self.vars.add(if block.copies == 1 {
                    variable().binary()
                } else {
                    variable().integer().clamp(0, most)
                });
                self.copies[b][d] = Copies::Free(v);
                placed += v;
            }
            self.rows.push(placed.eq(f64::from(block.copies)));
        }
    }

    /// Order: contiguous ranges in device order, for the consecutive units `pairs` (unit
    /// indices) whose pools `block_of` gives.
    pub(super) fn keep_order(&mut self, pairs: &[(usize, usize)], block_of: &[usize]) {
        let mut ends: HashMap<usize, (Expression, Expression)> = HashMap::new();
        let mut prefixes: HashMap<usize, Vec<Expression>> = HashMap::new();
        for &(a, b) in pairs {
            let (a, b) = (block_of[a], block_of[b]);
            if a == b || self.blocks[a].copies == 0 || self.blocks[b].copies == 0 {
                continue;
            }
            if self.blocks[a].copies == 1 && self.blocks[b].copies == 1 {
                for block in [a, b] {
                    if let Entry::Vacant(slot) = prefixes.entry(block) {
                        slot.insert(self.prefix_sums(block));
                    }
                }
                for (sum_b, sum_a) in prefixes[&b].iter().zip(&prefixes[&a]) {
                    self.rows.push((sum_b.clone() - sum_a.clone()).leq(0.0));
                }
                continue;
            }
            for block in [a, b] {
                if let Entry::Vacant(slot) = ends.entry(block) {
                    slot.insert(block_ends(self, block));
                }
            }
            self.rows.push((ends[&a].1.clone() - ends[&b].0.clone()).leq(0.0));
        }
    }

    /// The prefix sums `Σ_{d' ≤ d} v[b][d']` of a single-copy pool, for every device but the
    /// last: each a variable `P[d] = P[d − 1] + v[b][d]` where the count is a variable (a
    /// constant otherwise), so that the order rows of a chain over `D` devices hold `O(D)`
    /// terms, not the `O(D²)` of the sums written out (a profile of 4,096 GPUs made 6.6 GB of
    /// them for GPT-2's 14 units). The relaxation is the same: `P` only names the sums.
    fn prefix_sums(&mut self, b: usize) -> Vec<Expression> {
        let n_devices = self.size.len();
        let mut sums = Vec::with_capacity(n_devices.saturating_sub(1));
        let mut running = Expression::default();
        for d in 0..n_devices.saturating_sub(1) {
            match self.copies[b][d] {
                Copies::None => {}
                Copies::All => running += 1.0,
                Copies::Free(v) => {
                    let sum = self.vars.add(variable().clamp(0.0, 1.0));
                    self.rows.push((Expression::from(sum) - running - v).eq(0.0));
                    running = Expression::from(sum);
                }
            }
            sums.push(running.clone());
        }
        sums
    }

    /// Per device: charge, workspace, capacity, utilisation. A GPU whose fixed bytes over
    /// `S_d` stay within `floor` counts them as a constant (module documentation, "Fixed
    /// bytes"); `scale` is the largest `S_d`.
    pub(super) fn device_rows(
        &mut self,
        problem: &Problem,
        capacities: &[u64],
        floor: f64,
        scale: f64,
    ) -> DeviceTerms {
        let n_devices = self.size.len();
        let max_utilisation = self.vars.add(variable().min(0.0));
        let mut offloaded = Expression::default();
        let mut on_disk = Expression::default();
        let mut host_copies = Expression::default();
        let mut charges: Vec<Expression> = Vec::with_capacity(n_devices);
        for (d, device) in problem.devices.iter().enumerate() {
            let s = self.size[d];
            let holders: Vec<usize> =
                (0..self.blocks.len()).filter(|&b| !matches!(self.copies[b][d], Copies::None)).collect();
            let mut charge = Expression::default();
            for &b in &holders {
                charge.add_mul(self.blocks[b].bytes_on(self.spilling[d]) as f64 / s, self.count(b, d));
            }
            let mut held = charge.clone();
            // The GPU running offloaded units holds their peak bytes, and each one's weights
            // (with its workspace) while it runs.
            let mut streamed: Vec<(u64, usize, usize)> = Vec::new();
            if problem.offload_runs_on == Some(d) {
                for h in (0..n_devices).filter(|&h| self.spilling[h]) {
                    for b in (0..self.blocks.len()).filter(|&b| !matches!(self.copies[b][h], Copies::None)) {
                        held.add_mul(self.blocks[b].peak as f64 / s, self.count(b, h));
                        let block = &self.blocks[b];
                        streamed.push((block.bytes - block.peak + block.transient, b, h));
                    }
                }
            }
            if !streamed.is_empty() {
                // accelerate runs offloaded modules on the map's first GPU: this one only if it
                // holds something, so nothing is offloaded while it holds nothing.
                let on_this_gpu = holders.iter().fold(Expression::default(), |e, &b| e + self.count(b, d));
                for &(_, b, h) in &streamed {
                    let present = self.presence(b, h);
                    self.rows.push((present - on_this_gpu.clone()).leq(0.0));
                }
            }
            let largest_workspace = holders
                .iter()
                .map(|&b| self.blocks[b].transient)
                .chain(streamed.iter().map(|s| s.0))
                .max()
                .unwrap_or(0);
            if largest_workspace > 0 {
                let reserved = workspace(self, d, &holders, largest_workspace);
                for &(bytes, b, h) in &streamed {
                    let present = self.presence(b, h);
                    self.rows.push((bytes as f64 / s * present - reserved.clone()).leq(0.0));
                }
                held += reserved;
            }
            let fixed_share = device.fixed_bytes as f64 / s;
            let always_counted = fixed_share <= floor;
            let used = (self.is_gpu[d] && !holders.is_empty() && !always_counted).then(|| self.used(d));
            let limit = capacities[d] as f64 / s;
            match used {
                Some(flag) => self.rows.push((held.clone() - limit * flag).leq(0.0)),
                None => self.rows.push(held.clone().leq(limit)),
            }
            self.held[d] = held.clone();
            if self.is_gpu[d] {
                match used {
                    _ if always_counted => held += fixed_share,
                    Some(flag) => held.add_mul(fixed_share, flag),
                    None => {}
                }
                if !holders.is_empty() || always_counted {
                    self.rows.push((held - max_utilisation).leq(0.0));
                }
            } else {
                for &b in &holders {
                    host_copies.add_mul(1.0, self.count(b, d));
                }
                offloaded.add_mul(s / scale, &charge);
                if device.tier == Target::Disk {
                    on_disk.add_mul(s / scale, &charge);
                }
            }
            charges.push(charge);
        }

        DeviceTerms { max_utilisation, offloaded, on_disk, host_copies, charges }
    }

    /// Interchangeable devices: charges non-increasing along each class (module
    /// documentation, "Symmetry"). Only for problems that are not ordered.
    pub(super) fn order_interchangeable(
        &mut self,
        problem: &Problem,
        capacities: &[u64],
        charges: &[Expression],
    ) {
        for class in interchangeable(problem, capacities) {
            for pair in class.windows(2) {
                self.rows.push((charges[pair[1]].clone() - charges[pair[0]].clone()).leq(0.0));
            }
        }
    }
}

/// The workspace device `d` reserves, over `S_d`: at least each present pool's. A pool of one
/// copy, or one with a presence indicator, gets a row of its own; the other pools of several
/// copies share one indicator per workspace size, "some copy of a pool with at least this
/// workspace is here", and the workspace is the sum of the steps between sizes reached.
fn workspace(x: &mut Builder, d: usize, holders: &[usize], largest: u64) -> Expression {
    let s = x.size[d];
    let workspace = x.vars.add(variable().clamp(0.0, largest as f64 / s));
    let by_level = |x: &Builder, b: usize| {
        matches!(x.copies[b][d], Copies::Free(_)) && x.blocks[b].copies > 1 && x.presence[b][d].is_none()
    };
    let mut levels: Vec<u64> = Vec::new();
    let with_workspace: Vec<usize> = holders.iter().copied().filter(|&b| x.blocks[b].transient > 0).collect();
    for b in with_workspace {
        if by_level(x, b) {
            levels.push(x.blocks[b].transient);
        } else {
            let present = x.presence(b, d);
            x.rows.push((x.blocks[b].transient as f64 / s * present - workspace).leq(0.0));
        }
    }
    levels.sort_unstable_by(|a, b| b.cmp(a));
    levels.dedup();
    let mut stepped = Expression::default();
    for (k, &level) in levels.iter().enumerate() {
        let reached = x.vars.add(variable().binary());
        let mut copies_at = Expression::default();
        let mut most_at = 0.0;
        for &b in holders.iter().filter(|&&b| by_level(x, b) && x.blocks[b].transient >= level) {
            copies_at += x.count(b, d);
            most_at += x.most(b, d);
        }
        x.rows.push((copies_at - most_at * reached).leq(0.0));
        let below = levels.get(k + 1).copied().unwrap_or(0);
        stepped.add_mul((level - below) as f64 / s, reached);
    }
    if !levels.is_empty() {
        x.rows.push((stepped - workspace).leq(0.0));
    }
    Expression::from(workspace)
}

/// First and last device positions of pool `b`: for one copy both are `Σ_d d·v[b][d]`; for
/// several, continuous variables with `last ≥ d·y[d]` and `first ≤ d + (D − 1)(1 − y[d])`.
fn block_ends(x: &mut Builder, b: usize) -> (Expression, Expression) {
    let top = x.size.len().saturating_sub(1) as f64;
    let devices: Vec<usize> = x.blocks[b].allowed.iter().map(|a| a.0).collect();
    if x.blocks[b].copies == 1 || devices.len() == 1 {
        let mut position = Expression::default();
        for &d in &devices {
            position.add_mul(d as f64, x.presence(b, d));
        }
        return (position.clone(), position);
    }
    let first = x.vars.add(variable().clamp(0.0, top));
    let last = x.vars.add(variable().clamp(0.0, top));
    for d in devices {
        let present = x.presence(b, d);
        x.rows.push((d as f64 * present.clone() - last).leq(0.0));
        x.rows.push((Expression::from(first) + top * present).leq(d as f64 + top));
    }
    (Expression::from(first), Expression::from(last))
}
