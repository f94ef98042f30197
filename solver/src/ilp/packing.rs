//! A floor on the largest GPU utilisation from packing whole copies: where the balance stage's
//! fill is not within the gap of the bytes' floor, the copies outside the chain are often few
//! and large (llama.cpp's expert tensors: Mixtral-8x7B's 32 of 0.8 and 0.9 GB over 12 T4s),
//! and no plan can split them the way the bytes' floor does.
//!
//! The test at a utilisation `U`: every GPU may hold `room_d = min(capacity_d, U·S_d − fixed_d)`
//! bytes (none where that is negative: it cannot be used), and a plan with its largest
//! utilisation at most `U` must (a) hold every byte within the rooms together and (b) pack its
//! copies outside the chain whole into them. Each test leaves things out (workspace, the chain's
//! order and whole positions, the devices each pool may use, the hosts, and the smallest copies
//! where there are many sizes, which count as divisible bytes), so a `U` that fails it is
//! below every plan's largest utilisation: a proven floor. Whether the copies pack is a
//! reachability over how many copies of each size are placed, GPU by GPU; the largest sizes
//! are kept whole as long as those counts stay within [`MOST_STATES`].
//!
//! The floor is the largest `U` found to fail, by bisection between the fill's value over one
//! plus the gap (which, failing, is already the proof that the fill is within the gap) and the
//! fill's value.

use super::formulation::Formulation;
use crate::problem::Problem;

/// The most count vectors the reachability keeps (the product over whole sizes of copies + 1).
const MOST_STATES: usize = 100_000;

/// The most state-and-configuration steps one test takes; past it the test is inconclusive
/// (taken as "packs", which proves nothing).
const MOST_STEPS: usize = 20_000_000;

/// Bisection steps after the first failing test.
const BISECTIONS: usize = 8;

impl Formulation {
    /// The largest utilisation in `[value / (1 + relative_gap), value]` that no plan on the
    /// GPUs alone reaches (module documentation), or `None` where the test proves nothing
    /// there.
    pub(super) fn packing_floor(
        &self,
        problem: &Problem,
        capacities: &[u64],
        value: f64,
        relative_gap: f64,
    ) -> Option<f64> {
        let packing = Packing::new(self, problem, capacities)?;
        let mut low = value / (1.0 + relative_gap.max(0.0));
        if packing.fits(low) {
            return None;
        }
        let mut high = value;
        for _ in 0..BISECTIONS {
            let middle = 0.5 * (low + high);
            if packing.fits(middle) { high = middle } else { low = middle }
        }
        Some(low)
    }
}

/// The GPUs and copies of one problem, as the test sees them.
struct Packing {
    /// Per GPU: `S_d`, fixed bytes, capacity.
    gpus: Vec<(f64, u64, u64)>,
    /// Sizes kept whole, largest first, and how many copies of each.
    sizes: Vec<(u64, u32)>,
    /// Every byte that must sit on the GPUs.
    total: u64,
    /// The mixed-radix index of a count vector: `stride[i]` per copy of size `i`.
    stride: Vec<usize>,
}

impl Packing {
    fn new(formulation: &Formulation, problem: &Problem, capacities: &[u64]) -> Option<Packing> {
        let gpus: Vec<(f64, u64, u64)> = (0..formulation.shape.1)
            .filter(|&d| formulation.is_gpu[d])
            .map(|d| {
                let fixed = problem.devices[d].fixed_bytes;
                (capacities[d].saturating_add(fixed).max(1) as f64, fixed, capacities[d])
            })
            .collect();
        let mut total = 0u64;
        let mut copies: Vec<(u64, u32)> = Vec::new();
        for pool in formulation.pools.iter().filter(|p| p.copies > 0 && p.bytes > 0) {
            total = total.saturating_add(pool.bytes.saturating_mul(u64::from(pool.copies)));
            copies.push((pool.bytes, pool.copies));
        }
        copies.sort_unstable_by_key(|&(bytes, _)| std::cmp::Reverse(bytes));
        let mut sizes: Vec<(u64, u32)> = Vec::new();
        for (bytes, count) in copies {
            match sizes.last_mut() {
                Some(last) if last.0 == bytes => last.1 += count,
                _ => sizes.push((bytes, count)),
            }
        }
        // The largest sizes whole while the counts stay few; the rest divisible.
        let mut states = 1usize;
        let whole = sizes
            .iter()
            .take_while(|&&(_, count)| {
                states = states.saturating_mul(count as usize + 1);
                states <= MOST_STATES
            })
            .count();
        sizes.truncate(whole);
        if sizes.is_empty() || gpus.is_empty() {
            return None;
        }
        let mut stride = vec![1usize; sizes.len()];
        for i in (0..sizes.len() - 1).rev() {
            stride[i] = stride[i + 1] * (sizes[i + 1].1 as usize + 1);
        }
        Some(Packing { gpus, sizes, total, stride })
    }

    /// Whether the test of the module documentation passes at utilisation `u` (or cannot say).
    fn fits(&self, u: f64) -> bool {
        let mut rooms: Vec<u64> = self
            .gpus
            .iter()
            .map(|&(size, fixed, capacity)| {
                let room = u * size - fixed as f64;
                if room <= 0.0 { 0 } else { (room as u64).min(capacity) }
            })
            .collect();
        if rooms.iter().fold(0u64, |sum, &r| sum.saturating_add(r)) < self.total {
            return false;
        }
        rooms.sort_unstable_by(|a, b| b.cmp(a));
        let stride = &self.stride;
        let states = stride[0] * (self.sizes[0].1 as usize + 1);
        let full: usize = self.sizes.iter().zip(stride).map(|(s, st)| s.1 as usize * st).sum();
        // The count vectors reachable so far, as a list and as a set.
        let mut seen = vec![false; states];
        let mut frontier = vec![0usize];
        seen[0] = true;
        let mut steps = 0usize;
        for &room in &rooms {
            let configurations = self.configurations(room);
            let mut next = Vec::with_capacity(frontier.len());
            for &state in &frontier {
                for configuration in &configurations {
                    steps += 1;
                    if steps > MOST_STEPS {
                        return true;
                    }
                    // `configuration` added to `state`, each size capped at its count.
                    let mut target = 0;
                    for (i, &k) in configuration.iter().enumerate() {
                        let count = self.sizes[i].1 as usize;
                        let held = (state / stride[i]) % (count + 1);
                        target += (held + k as usize).min(count) * stride[i];
                    }
                    if target == full {
                        return true;
                    }
                    if !seen[target] {
                        seen[target] = true;
                        next.push(target);
                    }
                }
            }
            // A vector reached before stays reachable with a GPU left empty: keep it too.
            next.extend_from_slice(&frontier);
            frontier = next;
        }
        false
    }

    /// Every count vector of whole copies within `room` bytes that is maximal (one more copy
    /// of any size overflows it or its count). Taking more copies on a GPU never keeps the
    /// rest from packing, so [`Packing::fits`] needs only these, capped by what is left.
    fn configurations(&self, room: u64) -> Vec<Vec<u32>> {
        let mut all = Vec::new();
        let mut current = vec![0u32; self.sizes.len()];
        self.enumerate(0, room, &mut current, &mut all);
        all
    }

    fn enumerate(&self, i: usize, room: u64, current: &mut Vec<u32>, all: &mut Vec<Vec<u32>>) {
        if i == self.sizes.len() {
            let maximal =
                self.sizes.iter().zip(current.iter()).all(|(&(bytes, count), &k)| k == count || room < bytes);
            if maximal {
                all.push(current.clone());
            }
            return;
        }
        let (bytes, count) = self.sizes[i];
        let most = (room / bytes.max(1)).min(u64::from(count)) as u32;
        for k in (0..=most).rev() {
            current[i] = k;
            self.enumerate(i + 1, room - u64::from(k) * bytes, current, all);
        }
        current[i] = 0;
    }
}
