//! The load stage without HiGHS: a floor no plan beats, computed from the loads themselves, and
//! a plan that meets it, built as for any makespan problem (module documentation of `ilp`,
//! "Objectives").
//!
//! # What the stage asks
//!
//! Expert parallelism with `--expert-load` gives each copy a load (the tokens routed to its
//! expert, a layer's experts grouped in load classes by `build.rs`). Once the balance stage has
//! held the largest GPU utilisation at `U`, the load stage asks for the smallest largest load
//! a GPU carries, `max_d Σ_b load_b·v[b][d]`, over the mean load per GPU. Memory is what makes
//! it more than a makespan problem: with `U` held, GPU `d` takes at most `cap_d` copies of a
//! pool (`⌊(U·S_d − fixed_d) / bytes⌋`, and the pool's own bound there), so a GPU that must
//! hold many copies cannot hold only the heavy ones.
//!
//! # The floor ([`Formulation::load_floor`])
//!
//! Let `w_1 ≥ w_2 ≥ … ≥ w_N` be the loads of the `N` copies that must sit on the `G` GPUs
//! (every copy of a pool that may use no other device), and `m` the fewest of them any one GPU
//! must hold: `N` less what all the other GPUs can take, `min_d (N − Σ_{e≠d} cap_e)`, or 0.
//! Every plan with `U` held has a GPU carrying at least:
//!
//! - the even share, `Σ w / G` (what cannot leave the GPUs spreads at best evenly);
//! - for every `t ≥ 0` with `tG + 1 ≤ N`, `Σ_{i=tG+1−t}^{tG+1} w_i` plus, where `m > t + 1`,
//!   the `m − t − 1` smallest loads: of the `tG + 1` heaviest copies some GPU holds `t + 1`
//!   (pigeonhole), whose loads are at least the `t + 1` smallest of them, and that GPU holds
//!   at least `m` copies in all, the others at least the smallest loads there are (disjoint from
//!   the window when `N − (tG + 1) ≥ m − t − 1`, the only case counted). `t = 0` is the
//!   heaviest copy and its company; `t = 1` the classic `w_G + w_{G+1}`.
//!
//! Each is a lower bound on the largest load of every plan, so their largest is. The floor of
//! `objectives.rs` (even share and heaviest copy) is the case `m = 0`, `t = 0`.
//!
//! Where the plan is still not within the gap of that, and few copies go to each GPU, memory
//! can bind harder: Mixtral-8x22B's 448 experts over 128 GPUs take at most 4 a GPU, and with
//! Zipf-shaped loads the 56 hottest weigh nearly the even share each, so a hot expert alone on
//! its GPU leaves the other GPUs too little room. The *count bound* ([`count_floor`]) is the
//! smallest largest load `M` that passes, for every `j` where the loads step down, this test:
//! a GPU holding `t` of the `j` heaviest carries at least `t·w_j`, so beside them at most the
//! `s(t)` lightest copies whose loads fit within `M − t·w_j`; it holds at most `t + s(t)`
//! copies, and gives up at least `least − t − s(t)` of its room (`least` the smallest `cap_d`).
//! The `j` heaviest sit somewhere: over every split of `j` into such `t` (a knapsack, at most
//! `most` a GPU), the least room given up must leave room for all `N` copies. Every plan of
//! largest load `M` passes at every `j`, and the test only gets easier as `M` grows, so the `M`
//! found by bisection, keeping the failing side, is a floor. Beside it, where no two of the `j`
//! heaviest fit one GPU within `M`, the copies the others have no room for must go beside them
//! under a budget, and each place beside a heavy copy needs a copy below a bound of its own:
//! there must be enough of those ([`alone_fit`], Hall's condition). Counting copies alone lets
//! every hot GPU take the two lightest; there may be too few of them.
//!
//! # The plan ([`Formulation::split_by_load`])
//!
//! With each pool's count per device held as the plan in hand has it (so every row but the
//! load's still holds), the copies of the pools split by load are placed by *longest
//! processing time first*: the heaviest part first, copy by copy, each on the GPU of least load
//! so far with room left in its pool (a device other than a GPU carries no load and is taken
//! first). Graham's bound puts the result within one copy's load of even before memory binds;
//! where it binds, the last, lightest copies go where the room is, which is how the floor's
//! `m` term is met. Then *pairwise exchanges*: while some copy `a` on the most loaded GPU and a
//! lighter copy `b` of the same pool on another GPU `e` can trade places so that both end
//! below the current largest load, the trade that leaves the pair's larger load smallest is
//! made (`δ = w_a − w_b` closest to half the two GPUs' difference: a binary search over `e`'s
//! parts sorted by load). Each trade keeps every pool's count per device, so bytes, `U` and
//! every earlier stage's value are unchanged. Where the held `U` leaves a GPU room for one more
//! copy (448 experts over 128 GPUs: some hold 3, room for 4), a copy may also *move* off the
//! most loaded GPU into that room ([`Formulation::load_start`]), on the same rule; the room is
//! counted in bytes, fixed bytes and workspace included, so the plan still keeps `U`. Every
//! trade or move lowers the sorted vector of loads lexicographically, so the loop ends (and is
//! capped at a number of trades proportional to the parts).
//!
//! Where the plan is within the relative gap of the floor, the stage is proven without HiGHS;
//! otherwise the plan is HiGHS's start and the floor its cut, so the MIP starts from both ends.
//! Mixtral-8x22B's 56 × 8 experts over 16 H100s with measured, skewed loads ran past two
//! minutes in HiGHS; the floor and the exchanges prove it within the gap in milliseconds.

use super::formulation::{Copies, Formulation};
use crate::problem::Problem;

/// Copies the floor expands one by one; past this the even share and the heaviest copy alone
/// (the routed experts of a model are bounded by 2¹⁶, docs/limits.md).
const MOST_COPIES: u64 = 1 << 20;

/// The count bound's work: copies times the most a GPU takes, past which it is not tried.
const MOST_COUNTED: u64 = 1 << 14;

/// The smallest largest load, in `[low, high]`, at which every count of the heaviest copies
/// passes [`counts_fit`]: bisected, keeping the side where it fails, so the result is never
/// above a largest load some plan reaches (module documentation, "The floor").
#[allow(clippy::too_many_arguments)]
fn count_floor(
    loads: &[f64],
    prefix: &[f64],
    room: usize,
    gpus: usize,
    least: usize,
    most: usize,
    low: f64,
    high: f64,
) -> f64 {
    // The counts checked: where the loads step down (at most 64 of them, evenly spread).
    let steps: Vec<usize> =
        (1..=loads.len()).filter(|&j| j == loads.len() || loads[j] < loads[j - 1]).collect();
    let stride = steps.len().div_ceil(64).max(1);
    let checked: Vec<usize> = steps.iter().copied().step_by(stride).collect();
    let fits = |limit: f64| {
        checked.iter().all(|&j| {
            counts_fit(loads, prefix, room, least, most, j, limit)
                && alone_fit(loads, room, gpus, least, most, j, limit)
        })
    };
    if fits(low) {
        return low;
    }
    let (mut low, mut high) = (low, high);
    for _ in 0..50 {
        let middle = 0.5 * (low + high);
        if fits(middle) {
            high = middle
        } else {
            low = middle
        }
        if high - low <= high * 1e-6 {
            break;
        }
    }
    low
}

/// Whether the `N` copies (`loads`, heaviest first; `prefix` their running sums) can fit the
/// GPUs' `room` copies in all (each GPU at least `least`, at most `most`) with no GPU's load
/// above `limit`, as far as the `j` heaviest tell: a GPU holding `t` of them carries at least
/// `t·w_j`, and with `s` more copies at least the `s` lightest loads, so it holds at most
/// `t + s(t)` copies, `s(t)` the most lightest loads that fit beside; it gives up
/// `least − t − s(t)` of the room it could have had. The fewest given up over every way of
/// spreading the `j` (a knapsack over `t`) must leave room for every copy.
fn counts_fit(
    loads: &[f64],
    prefix: &[f64],
    room: usize,
    least: usize,
    most: usize,
    j: usize,
    limit: f64,
) -> bool {
    let n = loads.len();
    let w = loads[j - 1];
    // The sum of the `s` lightest loads.
    let lightest = |s: usize| prefix[n] - prefix[n - s];
    let beside = |t: usize| -> Option<usize> {
        let left = limit - t as f64 * w;
        if left < 0.0 {
            return None;
        }
        // The most `s` with the `s` lightest within `left`, at most `most − t`.
        let (mut lo, mut hi) = (0, most.saturating_sub(t).min(n));
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if lightest(mid) <= left { lo = mid } else { hi = mid - 1 }
        }
        Some(lo)
    };
    let largest_t = most.min(j);
    let lost: Vec<Option<usize>> = (0..=largest_t)
        .map(|t| if t == 0 { None } else { beside(t).map(|s| least.saturating_sub(t + s)) })
        .collect();
    // fewest[x]: the least room given up by GPUs holding `x` of the `j` heaviest.
    let mut fewest = vec![usize::MAX; j + 1];
    fewest[0] = 0;
    for x in 1..=j {
        for (t, lost) in lost.iter().enumerate().skip(1) {
            if let Some(lost) = lost
                && t <= x
                && fewest[x - t] != usize::MAX
            {
                fewest[x] = fewest[x].min(fewest[x - t] + lost);
            }
        }
    }
    fewest[j] != usize::MAX && room.saturating_sub(fewest[j]) >= n
}

/// The most GPUs, and copies beside a heavy one, [`alone_fit`] enumerates.
const MOST_ALONE: usize = 256;
const MOST_BESIDE: usize = 7;

/// Where no two of the `j` heaviest copies fit one GPU within `limit` (`2·w_j > limit`), they
/// sit on `j` GPUs, and the copies the other GPUs have no room for (`E`, the others' room
/// being at most `room − j·least`) go beside them, at most `most − 1` on each, within the
/// budget `b = limit − w_j` a GPU. A GPU with `k` copies beside its heavy one holds them in
/// ascending order, the `r`-th at most `(b − (r − 1)·w_min) / (k − r + 1)` (the others at
/// least the lightest load `w_min`); the copies below each such bound must be at least as many
/// as the places that need one (Hall's condition for nested sets). Whether some count of GPUs
/// with 1, 2, … copies beside (at most [`MOST_BESIDE`]) places all `E` so: this is what
/// proves Mixtral-8x22B's Zipf loads over 128 GPUs, where a hot expert with two of the
/// lightest beside it is within the budget but there are too few of the lightest. True (no
/// proof) where it does not apply.
fn alone_fit(
    loads: &[f64],
    room: usize,
    gpus: usize,
    least: usize,
    most: usize,
    j: usize,
    limit: f64,
) -> bool {
    let n = loads.len();
    let w = loads[j - 1];
    if 2.0 * w <= limit || j > MOST_ALONE {
        return true;
    }
    if j > gpus || w > limit {
        return false;
    }
    let others = room.saturating_sub(j * least);
    let needed = n.saturating_sub(j + others);
    if needed == 0 {
        return true;
    }
    let beside = most.saturating_sub(1);
    if beside == 0 {
        return false;
    }
    if beside > MOST_BESIDE {
        return true;
    }
    let budget = limit - w;
    let lightest = loads[n - 1];
    // The copies outside the j heaviest with load at most x (the tail is heaviest first).
    let tail = &loads[j..];
    let at_most = |x: f64| tail.len() - tail.partition_point(|&l| l > x * (1.0 + 1e-12));
    // (bound, k): the r-th place of a GPU with k beside.
    let mut places: Vec<(f64, usize)> = Vec::new();
    for k in 1..=beside {
        for r in 1..=k {
            places.push(((budget - (r - 1) as f64 * lightest) / (k - r + 1) as f64, k));
        }
    }
    places.sort_by(|a, b| a.0.total_cmp(&b.0));
    let counts: Vec<usize> = places.iter().map(|&(x, _)| at_most(x)).collect();
    let hall = |q: &[usize]| {
        let mut need = 0;
        places.iter().zip(&counts).all(|(&(_, k), &have)| {
            need += q[k];
            need <= have
        })
    };
    // GPUs with k beside, chosen from the most down; a choice whose places already fail, or
    // that cannot take the copies needed, ends its branch; past `MOST_TRIED` choices, no proof.
    let mut q = vec![0usize; beside + 1];
    let mut tried = 0usize;
    search(&mut q, beside, j, needed, &hall, &mut tried).unwrap_or(true)
}

/// Choices of GPUs tried by [`alone_fit`] before it gives up its proof.
const MOST_TRIED: usize = 20_000;

/// [`alone_fit`]'s search: counts `q[k]` of GPUs with `k` copies beside a heavy one for
/// `k = level` down to 2 (`q[1]` what is left to place), `gpus` heavy GPUs in all, `needed`
/// copies to place. `Some(true)` where a choice passes `hall`, `Some(false)` where none does,
/// `None` past [`MOST_TRIED`].
fn search(
    q: &mut [usize],
    level: usize,
    gpus: usize,
    needed: usize,
    hall: &dyn Fn(&[usize]) -> bool,
    tried: &mut usize,
) -> Option<bool> {
    *tried += 1;
    if *tried > MOST_TRIED {
        return None;
    }
    let used: usize = q[level + 1..].iter().sum();
    let placed: usize = q.iter().enumerate().skip(level + 1).map(|(k, n)| k * n).sum();
    if level == 1 {
        q[1] = needed.saturating_sub(placed);
        let fits = used + q[1] <= gpus && hall(q);
        q[1] = 0;
        return Some(fits);
    }
    for n in 0..=gpus - used {
        q[level] = n;
        // The rest take at most `level − 1` each: enough to place every copy?
        let most = placed + level * n + (gpus - used - n) * (level - 1);
        if most >= needed && hall(q) && search(q, level - 1, gpus, needed, hall, tried)? {
            q[level] = 0;
            return Some(true);
        }
    }
    q[level] = 0;
    Some(false)
}

/// Trades per part of the split pools before the exchanges stop, and at least this many.
const TRADES_PER_PART: usize = 64;
const LEAST_TRADES: usize = 4_096;

impl Formulation {
    /// A lower bound on the load stage's objective (largest GPU load over the mean) for every
    /// plan whose largest GPU utilisation is at most `balance` (module documentation, "The
    /// floor"); 0 without loads.
    pub(super) fn load_floor(
        &self,
        problem: &Problem,
        capacities: &[u64],
        balance: f64,
        upper: Option<f64>,
        relative_gap: f64,
    ) -> f64 {
        let Some((per_gpu, even)) = self.loads else { return 0.0 };
        if per_gpu <= 0.0 {
            return even;
        }
        let gpus: Vec<usize> = (0..self.shape.1).filter(|&d| self.is_gpu[d]).collect();
        // The pools held to GPUs with some load, and their copies' loads.
        let on_gpus: Vec<usize> = (0..self.pools.len())
            .filter(|&p| {
                let pool = &self.pools[p];
                pool.copies > 0 && pool.load > 0.0 && pool.allowed.iter().all(|&(d, _)| self.is_gpu[d])
            })
            .collect();
        let copies: u64 = on_gpus.iter().map(|&p| u64::from(self.pools[p].copies)).sum();
        if gpus.is_empty() || copies == 0 || copies > MOST_COPIES {
            return even;
        }
        let mut loads: Vec<f64> = Vec::with_capacity(copies as usize);
        for &p in &on_gpus {
            for &b in &self.parts[p] {
                let block = &self.blocks[b];
                loads.extend(std::iter::repeat_n(block.load.max(0.0), block.copies as usize));
            }
        }
        loads.sort_by(|a, b| b.total_cmp(a));
        let n = loads.len();
        let mut prefix = Vec::with_capacity(n + 1);
        prefix.push(0.0);
        for &w in &loads {
            prefix.push(prefix.last().copied().unwrap_or(0.0) + w);
        }
        // The most copies of these pools each GPU takes with the utilisation held.
        let cap = |d: usize| -> u64 {
            let fixed = problem.devices[d].fixed_bytes as f64;
            let size = capacities[d].saturating_add(problem.devices[d].fixed_bytes) as f64;
            let room = (balance * size - fixed).max(0.0);
            on_gpus
                .iter()
                .map(|&p| {
                    let pool = &self.pools[p];
                    let most = pool.allowed.iter().find(|a| a.0 == d).map_or(0, |a| u64::from(a.1));
                    let bytes = pool.bytes_on(false);
                    if bytes == 0 || !room.is_finite() {
                        most
                    } else {
                        most.min((room / bytes as f64).floor() as u64)
                    }
                })
                .sum()
        };
        let caps: Vec<u64> = gpus.iter().map(|&d| cap(d)).collect();
        let all: u64 = caps.iter().sum();
        let fewest = caps.iter().map(|&c| copies.saturating_sub(all - c)).min().unwrap_or(0) as usize;
        let g = gpus.len();
        let mut floor = even * per_gpu;
        let mut t = 0;
        while t * g < n {
            let last = t * g;
            let window = prefix[last + 1] - prefix[last - t];
            let more = fewest.saturating_sub(t + 1);
            let company = if more > 0 && n - (last + 1) >= more { prefix[n] - prefix[n - more] } else { 0.0 };
            floor = floor.max(window + company);
            t += 1;
        }
        // Where a plan of `upper` is not within the gap of that, the count bound may be.
        if let Some(upper) = upper.map(|u| u * per_gpu)
            && upper > floor * (1.0 + relative_gap)
            && (n as u64).saturating_mul(caps.iter().copied().max().unwrap_or(0)) <= MOST_COUNTED
        {
            let least = caps.iter().copied().min().unwrap_or(0) as usize;
            let most = caps.iter().copied().max().unwrap_or(0) as usize;
            floor = count_floor(&loads, &prefix, all as usize, g, least, most, floor, upper);
        }
        floor / per_gpu
    }

    /// Re-splits the pools with loads in `counts` (each pool's count per device as `values`
    /// has it): longest processing time first, then pairwise exchanges (module documentation,
    /// "The plan").
    pub(super) fn split_by_load(&self, values: &[f64], counts: &mut [Vec<u32>]) {
        let split: Vec<usize> = (0..self.pools.len()).filter(|&p| !self.split[p].is_empty()).collect();
        if split.is_empty() {
            return;
        }
        let n_devices = self.shape.1;
        let mut room = self.pool_counts(values);
        let mut in_split = vec![false; self.blocks.len()];
        for &p in &split {
            for &b in &self.parts[p] {
                in_split[b] = true;
            }
        }
        let mut load = vec![0.0; n_devices];
        for (b, block) in self.blocks.iter().enumerate().filter(|&(b, _)| !in_split[b]) {
            for (d, &count) in counts[b].iter().enumerate() {
                load[d] += block.load * f64::from(count);
            }
        }
        // (pool, part), heaviest first; ties in block order.
        let mut parts: Vec<(usize, usize)> =
            split.iter().flat_map(|&p| self.parts[p].iter().map(move |&b| (p, b))).collect();
        parts.sort_by(|&(_, a), &(_, b)| self.blocks[b].load.total_cmp(&self.blocks[a].load).then(a.cmp(&b)));
        for &(p, b) in &parts {
            let block = &self.blocks[b];
            counts[b] = vec![0; n_devices];
            for _ in 0..block.copies {
                let weight = |d: usize| if self.is_gpu[d] { load[d] } else { f64::NEG_INFINITY };
                let lightest = (0..n_devices)
                    .filter(|&d| room[p][d] > 0)
                    .min_by(|&a, &c| weight(a).total_cmp(&weight(c)));
                let Some(d) = lightest else { break };
                room[p][d] -= 1;
                counts[b][d] += 1;
                load[d] += block.load;
            }
        }
        self.exchange(&split, &parts, counts, &mut load, None);
    }

    /// The load stage's start from `start` (a plan with the balance held at `balance`): its
    /// split as [`Formulation::split_by_load`] made it, improved by moves of a copy off the most
    /// loaded GPU into room the held balance leaves on another, beside the exchanges (module
    /// documentation, "The plan"). The pool counts it changes are written into the start.
    pub(super) fn load_start(
        &self,
        problem: &Problem,
        capacities: &[u64],
        mut start: Vec<f64>,
        balance: f64,
    ) -> Vec<f64> {
        let split: Vec<usize> = (0..self.pools.len()).filter(|&p| !self.split[p].is_empty()).collect();
        if split.is_empty() || !balance.is_finite() {
            return start;
        }
        let mut counts = self.block_counts(&start);
        let assignment = self.assignment(problem, &start);
        let n_devices = self.shape.1;
        let held = balance.min(1.0);
        let room: Vec<f64> = (0..n_devices)
            .map(|d| {
                let device = &problem.devices[d];
                let size = capacities[d].saturating_add(device.fixed_bytes) as f64;
                let bytes = match problem.device_bytes(&assignment, d) {
                    0 => device.fixed_bytes,
                    bytes => bytes,
                };
                // A byte short of the limit, for the rounding of `held · size`.
                if self.is_gpu[d] { (held * size - bytes as f64 - 1.0).max(0.0) } else { 0.0 }
            })
            .collect();
        let mut load = vec![0.0; n_devices];
        for (b, block) in self.blocks.iter().enumerate() {
            for (d, &count) in counts[b].iter().enumerate() {
                load[d] += block.load * f64::from(count);
            }
        }
        let parts: Vec<(usize, usize)> =
            split.iter().flat_map(|&p| self.parts[p].iter().map(move |&b| (p, b))).collect();
        let mut spare = Spare { room, pools: self.pool_counts(&start) };
        self.exchange(&split, &parts, &mut counts, &mut load, Some(&mut spare));
        for &p in &split {
            for (d, copies) in self.copies[p].iter().enumerate() {
                if let Copies::Free(v) = copies
                    && let Some(slot) = start.get_mut(self.column[v])
                {
                    *slot = f64::from(spare.pools[p][d]);
                }
            }
            for (&b, row) in self.parts[p].iter().zip(&self.split[p]) {
                for (cell, &count) in row.iter().zip(&counts[b]) {
                    if let Some(slot) = cell.and_then(|v| start.get_mut(self.column[&v])) {
                        *slot = f64::from(count);
                    }
                }
            }
        }
        start
    }

    /// Pairwise exchanges between the most loaded GPU and the others, and with `spare`, moves
    /// of a copy into another GPU's room, as long as one lowers the pair's larger load below
    /// the largest (module documentation, "The plan").
    fn exchange(
        &self,
        split: &[usize],
        parts: &[(usize, usize)],
        counts: &mut [Vec<u32>],
        load: &mut [f64],
        mut spare: Option<&mut Spare>,
    ) {
        let gpus: Vec<usize> = (0..self.shape.1).filter(|&d| self.is_gpu[d]).collect();
        if gpus.len() < 2 {
            return;
        }
        let w = |b: usize| self.blocks[b].load;
        let by_load = |a: &usize, b: &usize| w(*a).total_cmp(&w(*b)).then(a.cmp(b));
        // Per device, per split pool: the parts it holds, lightest first.
        let mut held: Vec<Vec<Vec<usize>>> = vec![vec![Vec::new(); split.len()]; self.shape.1];
        for (k, &p) in split.iter().enumerate() {
            for &b in &self.parts[p] {
                for &d in &gpus {
                    if counts[b][d] > 0 {
                        held[d][k].push(b);
                    }
                }
            }
        }
        for lists in &mut held {
            for list in lists.iter_mut() {
                list.sort_by(by_load);
            }
        }
        let pool_of: Vec<usize> = {
            let mut of = vec![usize::MAX; self.blocks.len()];
            for (k, &p) in split.iter().enumerate() {
                for &b in &self.parts[p] {
                    of[b] = k;
                }
            }
            of
        };
        // Whether a copy of split pool `k` fits in `e`'s spare room.
        let fits = |spare: &Spare, k: usize, e: usize| {
            let pool = &self.pools[split[k]];
            let most = pool.allowed.iter().find(|a| a.0 == e).map_or(0, |a| a.1);
            spare.pools[split[k]][e] < most
                && spare.room[e] >= pool.bytes_on(false) as f64
                && (pool.transient == 0 || spare.pools[split[k]][e] > 0)
        };
        let trades = (TRADES_PER_PART * parts.len()).max(LEAST_TRADES);
        for _ in 0..trades {
            let top = gpus.iter().copied().fold(gpus[0], |m, d| if load[d] > load[m] { d } else { m });
            let peak = load[top];
            // (the pair's larger load after, other GPU, part leaving the top, part coming in:
            // none for a move)
            let mut best: Option<(f64, usize, usize, Option<usize>)> = None;
            let mut consider = |after: f64, e: usize, a: usize, b: Option<usize>| {
                if best.is_none_or(|(value, ..)| after < value) {
                    best = Some((after, e, a, b));
                }
            };
            for &e in &gpus {
                let difference = peak - load[e];
                if e == top || difference <= peak.abs() * 1e-12 {
                    continue;
                }
                for (k, theirs) in held[e].iter().enumerate() {
                    let movable = spare.as_deref().is_some_and(|spare| fits(spare, k, e));
                    for &a in &held[top][k] {
                        if movable && w(a) > 0.0 && w(a) < difference {
                            consider((peak - w(a)).max(load[e] + w(a)), e, a, None);
                        }
                        let wanted = w(a) - difference / 2.0;
                        let at = theirs.partition_point(|&b| w(b) < wanted);
                        for &b in
                            [at.checked_sub(1), Some(at)].iter().flatten().filter_map(|&i| theirs.get(i))
                        {
                            let delta = w(a) - w(b);
                            if delta > 0.0 && delta < difference {
                                consider((peak - delta).max(load[e] + delta), e, a, Some(b));
                            }
                        }
                    }
                }
            }
            let Some((_, e, a, b)) = best.filter(|&(after, ..)| after < peak * (1.0 - 1e-12)) else { break };
            let k = pool_of[a];
            let mut change = |part: usize, from: usize, to: usize, held: &mut [Vec<Vec<usize>>]| {
                counts[part][from] -= 1;
                counts[part][to] += 1;
                load[from] -= w(part);
                load[to] += w(part);
                if counts[part][from] == 0
                    && let Ok(i) = held[from][k].binary_search_by(|x| by_load(x, &part))
                {
                    held[from][k].remove(i);
                }
                if counts[part][to] == 1
                    && let Err(i) = held[to][k].binary_search_by(|x| by_load(x, &part))
                {
                    held[to][k].insert(i, part);
                }
            };
            change(a, top, e, &mut held);
            match b {
                Some(b) => change(b, e, top, &mut held),
                None => {
                    if let Some(spare) = spare.as_deref_mut() {
                        let p = split[k];
                        let bytes = self.pools[p].bytes_on(false) as f64;
                        spare.pools[p][top] -= 1;
                        spare.pools[p][e] += 1;
                        spare.room[top] += bytes;
                        spare.room[e] -= bytes;
                    }
                }
            }
        }
    }
}

/// The room a held balance leaves on each device, in bytes, and each pool's copies per device,
/// for the moves of [`Formulation::load_start`].
struct Spare {
    room: Vec<f64>,
    pools: Vec<Vec<u32>>,
}

#[cfg(test)]
mod tests {
    use super::count_floor;

    /// `count_floor` over `loads` (heaviest first) on `gpus` GPUs of `cap` copies each, from
    /// `low` up to `high`.
    fn floor(loads: &[f64], gpus: usize, cap: usize, low: f64, high: f64) -> f64 {
        let mut prefix = vec![0.0];
        for &w in loads {
            prefix.push(prefix.last().copied().unwrap_or(0.0) + w);
        }
        count_floor(loads, &prefix, gpus * cap, gpus, cap, cap, low, high)
    }

    #[test]
    fn the_hot_experts_alone_leave_too_little_room() {
        // Two of 10 and eight of 1 on four GPUs of three: with the hot ones alone (a largest
        // load below 11), two GPUs hold at most six of the eight others: 11.
        let mut loads = vec![10.0, 10.0];
        loads.extend([1.0; 8]);
        let found = floor(&loads, 4, 3, 10.0, 12.0);
        assert!((found - 11.0).abs() < 1e-4, "{found}");
    }

    #[test]
    fn too_few_light_experts_go_beside_the_hot_ones() {
        // Two of 10, one of 1 and nine of 2 on four GPUs of three (every GPU full): each hot
        // expert has two beside it, {1, 2} for one, {2, 2} for the other (one expert of 1):
        // 14. Counting alone allows 13 (the two lightest beside each).
        let mut loads = vec![10.0, 10.0];
        loads.extend([2.0; 9]);
        loads.push(1.0);
        let found = floor(&loads, 4, 3, 10.0, 15.0);
        assert!((found - 14.0).abs() < 1e-4, "{found}");
    }
}
