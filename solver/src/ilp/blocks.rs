//! Blocks and pools: the units that move together, the devices each may use and the most
//! copies each device can take, the early infeasibility checks, identical blocks pooled into
//! one count and a pool's count split back among its parts, and the devices that are
//! interchangeable (module documentation, "Blocks", "Pools" and "Symmetry").

use std::collections::HashMap;

use crate::problem::Problem;
use vramplan_sim::placement::Target;

/// Units that move together, and where they may go.
pub(super) struct Block {
    pub(super) members: Vec<usize>,
    /// Copies the block's count variables count: the unit's `count` for a unit alone, 1 for a
    /// group (every member's copies go with it).
    pub(super) copies: u32,
    /// Resident and peak bytes of one copy.
    pub(super) bytes: u64,
    /// Peak bytes of one copy: where the block is offloaded to a host whose units run on a GPU
    /// ([`Problem::offload_runs_on`]), they live on that GPU, not the host.
    pub(super) peak: u64,
    /// The largest workspace of its members.
    pub(super) transient: u64,
    /// Load of one copy.
    pub(super) load: f64,
    /// `(device, most copies that fit there)`, devices in problem order.
    pub(super) allowed: Vec<(usize, u32)>,
}

impl Block {
    /// Bytes one copy holds on a device: all of them, or the resident ones alone on a host
    /// that `spills` its peak bytes to the GPU running its units.
    pub(super) fn bytes_on(&self, spills: bool) -> u64 {
        if spills { self.bytes - self.peak } else { self.bytes }
    }

    /// Copies of unit `u` (a member) per copy of the block.
    pub(super) fn per_copy(&self, problem: &Problem, u: usize) -> u32 {
        if self.members.len() == 1 { 1 } else { problem.units[u].count }
    }
}

/// The blocks of `problem` and the block of each unit, or `None` when the problem is
/// obviously infeasible (see the module documentation).
pub(super) fn blocks(problem: &Problem, capacities: &[u64]) -> Option<(Vec<Block>, Vec<usize>)> {
    let n = problem.units.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut u: usize) -> usize {
        while parent[u] != u {
            parent[u] = parent[parent[u]];
            u = parent[u];
        }
        u
    }
    for group in &problem.together {
        let Some(&first) = group.first() else { continue };
        if group.iter().any(|&u| u >= n) {
            return None;
        }
        for &u in group {
            let (a, b) = (root(&mut parent, first), root(&mut parent, u));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut block_of = vec![usize::MAX; n];
    let mut blocks: Vec<Block> = Vec::new();
    for u in 0..n {
        let r = root(&mut parent, u);
        if block_of[r] == usize::MAX {
            block_of[r] = blocks.len();
            blocks.push(Block {
                members: Vec::new(),
                copies: 0,
                bytes: 0,
                peak: 0,
                transient: 0,
                load: 0.0,
                allowed: Vec::new(),
            });
        }
        block_of[u] = block_of[r];
        blocks[block_of[u]].members.push(u);
    }
    let mut pinned: Vec<Option<usize>> = vec![None; blocks.len()];
    for &(u, d) in &problem.pins {
        if u >= n || d >= problem.devices.len() {
            return None;
        }
        let pin = &mut pinned[block_of[u]];
        if pin.is_some_and(|p| p != d) {
            return None;
        }
        *pin = Some(d);
    }
    let mut total_bytes: u128 = 0;
    for (b, block) in blocks.iter_mut().enumerate() {
        let lone = block.members.len() == 1;
        block.copies = if lone { problem.units[block.members[0]].count } else { 1 };
        let mut gpu_only = false;
        for &u in &block.members {
            let unit = &problem.units[u];
            let per_copy = if lone { 1 } else { u64::from(unit.count) };
            let copy = unit.resident_bytes.saturating_add(unit.peak_bytes);
            block.bytes = per_copy.saturating_mul(copy).saturating_add(block.bytes);
            block.peak = per_copy.saturating_mul(unit.peak_bytes).saturating_add(block.peak);
            block.transient = block.transient.max(unit.transient_bytes);
            if unit.load.is_finite() && unit.load > 0.0 {
                block.load += per_copy as f64 * unit.load;
            }
            gpu_only |= unit.gpu_only;
        }
        if block.copies == 0 {
            continue;
        }
        for (d, device) in problem.devices.iter().enumerate() {
            let tier_ok = matches!(device.tier, Target::Gpu(_)) || !gpu_only;
            let pin_ok = pinned[b].is_none_or(|p| p == d);
            let room = capacities[d].checked_sub(block.transient);
            if let (true, true, Some(room)) = (tier_ok, pin_ok, room) {
                let fit = room.checked_div(block.bytes_on(spills(problem, d))).unwrap_or(u64::MAX);
                let most = fit.min(u64::from(block.copies)) as u32;
                if most > 0 {
                    block.allowed.push((d, most));
                }
            }
        }
        let room: u64 = block.allowed.iter().map(|&(_, most)| u64::from(most)).sum();
        if room < u64::from(block.copies) {
            return None;
        }
        total_bytes += u128::from(block.bytes) * u128::from(block.copies);
    }
    let capacity: u128 = capacities.iter().map(|&c| u128::from(c)).sum();
    if total_bytes > capacity {
        return None;
    }
    Some((blocks, block_of))
}

/// Pools of blocks that no constraint tells apart: the same bytes, workspace and devices, and
/// no unit with a neighbour in order. Any counts of a pool per device split into counts of its
/// parts ([`apportion`]) that every row but the load's accepts, so the stages before the load
/// count pools, not blocks: DeepSeek-V3's 58 expert layers become one integer per GPU. Returns
/// the pools (as blocks: summed copies, the parts' mean load), their parts, and each block's
/// pool.
pub(super) fn pools(
    capacities: &[u64],
    spilling: &[bool],
    blocks: &[Block],
    block_of: &[usize],
    pairs: &[(usize, usize)],
) -> (Vec<Block>, Vec<Vec<usize>>, Vec<usize>) {
    let mut paired = vec![false; blocks.len()];
    for &(a, b) in pairs {
        paired[block_of[a]] = true;
        paired[block_of[b]] = true;
    }
    let mut found: HashMap<(u64, u64, u64, Vec<usize>), usize> = HashMap::new();
    let mut parts: Vec<Vec<usize>> = Vec::new();
    let mut pool_of = vec![0; blocks.len()];
    for (b, block) in blocks.iter().enumerate() {
        let devices: Vec<usize> = block.allowed.iter().map(|a| a.0).collect();
        let key = (block.bytes, block.peak, block.transient, devices);
        let poolable = !paired[b] && block.copies > 0;
        match found.get(&key) {
            Some(&p) if poolable => {
                parts[p].push(b);
                pool_of[b] = p;
            }
            _ => {
                if poolable {
                    found.insert(key, parts.len());
                }
                pool_of[b] = parts.len();
                parts.push(vec![b]);
            }
        }
    }
    let pooled = parts
        .iter()
        .map(|members| {
            let first = &blocks[members[0]];
            if members.len() == 1 {
                return Block { allowed: first.allowed.clone(), members: first.members.clone(), ..*first };
            }
            let copies = members.iter().fold(0u32, |sum, &b| sum.saturating_add(blocks[b].copies));
            let load = members.iter().map(|&b| blocks[b].load * f64::from(blocks[b].copies)).sum::<f64>()
                / f64::from(copies);
            let allowed = first
                .allowed
                .iter()
                .map(|&(d, _)| {
                    let room = capacities[d].saturating_sub(first.transient);
                    let fit = room.checked_div(first.bytes_on(spilling[d])).unwrap_or(u64::MAX);
                    (d, fit.min(u64::from(copies)) as u32)
                })
                .collect();
            let units = members.iter().flat_map(|&b| blocks[b].members.iter().copied()).collect();
            Block {
                members: units,
                copies,
                bytes: first.bytes,
                peak: first.peak,
                transient: first.transient,
                load,
                allowed,
            }
        })
        .collect();
    (pooled, parts, pool_of)
}

/// Splits a pool's copies per device (`totals`) among its parts (`copies` each), every part
/// spread over the devices in proportion to what is left on them (largest remainders first,
/// then lower devices): each expert layer of a pool of layers gets its share of every GPU.
pub(super) fn apportion(totals: &[u32], copies: &[u32]) -> Vec<Vec<u32>> {
    let mut left: Vec<u128> = totals.iter().map(|&t| u128::from(t)).collect();
    let mut split = Vec::with_capacity(copies.len());
    for &wanted in copies {
        let available: u128 = left.iter().sum();
        let wanted = u128::from(wanted).min(available);
        let mut row = vec![0u128; left.len()];
        // Nothing is wanted when nothing is available, so the divisions below never see 0.
        let mut remainders = Vec::with_capacity(left.len());
        for (d, cell) in row.iter_mut().enumerate() {
            let share = wanted * left[d];
            *cell = share.checked_div(available).unwrap_or(0);
            remainders.push((share.checked_rem(available).unwrap_or(0), d));
        }
        remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut given: u128 = row.iter().sum();
        for (_, d) in remainders {
            if given == wanted {
                break;
            }
            if row[d] < left[d] {
                row[d] += 1;
                given += 1;
            }
        }
        for (d, cell) in row.iter().enumerate() {
            left[d] -= cell;
        }
        split.push(row.into_iter().map(|c| c as u32).collect());
    }
    split
}

/// Devices that can be exchanged without changing any plan's feasibility or value: same class,
/// tier kind, capacity, fixed bytes and link, and named by no pin. Each class in problem order.
pub(super) fn interchangeable(problem: &Problem, capacities: &[u64]) -> Vec<Vec<usize>> {
    let pinned: Vec<usize> = problem.pins.iter().map(|&(_, d)| d).collect();
    let mut classes: Vec<Vec<usize>> = Vec::new();
    for d in (0..problem.devices.len()).filter(|d| !pinned.contains(d)) {
        let twin = |e: usize| {
            let (x, y) = (&problem.devices[d], &problem.devices[e]);
            x.class == y.class
                && same_kind(x.tier, y.tier)
                && capacities[d] == capacities[e]
                && x.fixed_bytes == y.fixed_bytes
                && x.link_bytes_per_s == y.link_bytes_per_s
        };
        match classes.iter_mut().find(|class| twin(class[0])) {
            Some(class) => class.push(d),
            None => classes.push(vec![d]),
        }
    }
    classes
}

/// Whether device `d` is a host that leaves its units' peak bytes to the GPU running them.
pub(super) fn spills(problem: &Problem, d: usize) -> bool {
    problem.offload_runs_on.is_some() && problem.is_host(d)
}

/// Whether two tiers are of one kind (two GPUs with different indices are).
fn same_kind(a: Target, b: Target) -> bool {
    std::mem::discriminant(&a) == std::mem::discriminant(&b)
}
