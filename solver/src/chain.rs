//! Contiguous partitions of the ordered chain, by dynamic programming: exact answers to the
//! balance and crossing stages of an ordered problem with its unordered parts left out, which
//! the ILP takes as lower bounds (cuts) and as start plans.
//!
//! When the problem is ordered, the units with a position form a chain that every plan lays
//! out in contiguous ranges, devices in problem order. Leave out everything else (unordered
//! pools, pins other than the devices each pool may use, `together` groups beyond the chain's
//! own) and what remains is a linear partition problem: cut the chain into one range per
//! device, in order, each range fitting its device. That problem is solved exactly by dynamic
//! programming over (device, chain prefix) in `O(devices × positions²)` (for the balance, a
//! range stops growing once it alone is no better than the best so far, which leaves
//! `O(devices × positions)` where units are small next to the devices). Since every plan of
//! the full problem is a partition of its chain, the partition's optimum is a lower bound on
//! the full problem's stage, and where nothing was left out (accelerate and pipeline targets,
//! whose chain holds every unit) it is the optimum itself, so HiGHS only has to confirm it.
//!
//! The linear relaxation of the placement ILP is weak on chains: it spreads each unit over
//! neighbouring devices, so its bound is the even split, and proving the optimum of a
//! partition of Llama-2-70B's 83 units over 16 GPUs took HiGHS 35 s of branching. With the
//! partition's value as a cut the root bound is the optimum.

/// One position of the chain.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// Resident and peak bytes; 0 where the same pool appeared earlier in the chain (a group
    /// held together), so that no byte is counted twice.
    pub bytes: u64,
    /// The same on a host that leaves peak bytes to a GPU ([`Slot::spills`]): resident bytes.
    pub host_bytes: u64,
    /// Workspace while it runs.
    pub transient: u64,
    /// Per device (problem order), whether the pool may go there.
    pub allowed: Vec<bool>,
    /// The crossing stage's price of a boundary after this position (its handoff over the
    /// largest handoff); 0 for the last.
    pub handoff: f64,
}

/// One device, as the partition sees it.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// Bytes its range may hold (resident, peak and the largest workspace).
    pub capacity: u64,
    /// Bytes it carries once used.
    pub fixed: u64,
    /// The denominator of its utilisation (capacity plus fixed bytes).
    pub size: f64,
    /// Whether its utilisation counts towards the largest (GPUs do; `cpu` and `disk` do not).
    pub counted: bool,
    /// A host whose units keep their peak bytes on a GPU: its ranges hold [`Link::host_bytes`].
    /// What they put on that GPU is left out, which keeps the partition a lower bound.
    pub spills: bool,
    /// The crossing stage's weight of a handoff leaving it.
    pub weight: f64,
    /// Workspace it reserves whenever it holds a range, beyond its range's own (the weights of
    /// offloaded units streamed through the GPU that runs them).
    pub workspace: u64,
    /// Whether it must hold a range (the GPU that runs offloaded units holds one itself).
    pub required: bool,
}

/// What the partition minimises.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    /// The largest utilisation of a counted device.
    Balance,
    /// The handoffs crossing devices, with every counted device's utilisation at most `limit`.
    Crossing { limit: f64 },
    /// The fewest counted devices holding anything, among the partitions of least crossing
    /// (as [`Goal::Crossing`] with the same `limit`): lexicographically, crossings first.
    Fewest { limit: f64 },
}

/// A partial partition's value: the goal's measure, then (for [`Goal::Fewest`]) the devices it
/// uses. Compared lexicographically, the first within a relative 10⁻¹² (sums of the same
/// handoffs in another order differ in the last bits).
#[derive(Debug, Clone, Copy)]
struct Value(f64, u32);

impl Value {
    fn better_than(self, other: Value) -> bool {
        let tolerance = 1e-12 * other.0.abs().max(1.0);
        if other.0.is_infinite() {
            return self.0.is_finite();
        }
        self.0 < other.0 - tolerance || (self.0 <= other.0 + tolerance && self.1 < other.1)
    }
}

/// The best partition of `links` over `slots` for `goal`: its value and each position's slot,
/// or `None` when no partition fits. The value is the goal's measure, or for [`Goal::Fewest`]
/// the devices used.
pub(crate) fn partition(links: &[Link], slots: &[Slot], goal: Goal) -> Option<(f64, Vec<usize>)> {
    let m = links.len();
    // best[t][i]: the value of the first i positions on the first t slots; from[t][i]: where
    // slot t − 1's range starts.
    let mut best = vec![vec![Value(f64::INFINITY, 0); m + 1]; slots.len() + 1];
    let mut from = vec![vec![0usize; m + 1]; slots.len() + 1];
    best[0][0] = Value(0.0, 0);
    for (t, slot) in slots.iter().enumerate() {
        for i in 0..=m {
            // The empty range, where the slot may stay empty.
            let empty = if slot.required { Value(f64::INFINITY, 0) } else { best[t][i] };
            let (mut value, mut start) = (empty, i);
            let (mut bytes, mut transient) = (0u64, slot.workspace);
            for j in (0..i).rev() {
                let link = &links[j];
                if !link.allowed.get(t).copied().unwrap_or(false) {
                    break;
                }
                bytes = bytes.saturating_add(if slot.spills { link.host_bytes } else { link.bytes });
                transient = transient.max(link.transient);
                if bytes.saturating_add(transient) > slot.capacity {
                    break;
                }
                let utilisation =
                    if slot.counted { (slot.fixed + bytes + transient) as f64 / slot.size } else { 0.0 };
                // A longer range holds at least as much: once this one is no lower than the
                // best so far, no longer one is better for the balance.
                if matches!(goal, Goal::Balance) && utilisation >= value.0 {
                    break;
                }
                let before = best[t][j];
                let candidate = match goal {
                    Goal::Balance => Value(before.0.max(utilisation), 0),
                    Goal::Crossing { limit } | Goal::Fewest { limit } if utilisation <= limit => {
                        let handoff = if i < m { links[i - 1].handoff * slot.weight } else { 0.0 };
                        Value(before.0 + handoff, before.1 + u32::from(slot.counted))
                    }
                    // Longer ranges only fill the slot more.
                    Goal::Crossing { .. } | Goal::Fewest { .. } => break,
                };
                if candidate.better_than(value) {
                    (value, start) = (candidate, j);
                }
            }
            best[t + 1][i] = value;
            from[t + 1][i] = start;
        }
    }
    let value = best[slots.len()][m];
    if !value.0.is_finite() {
        return None;
    }
    let value = match goal {
        Goal::Fewest { .. } => f64::from(value.1),
        Goal::Balance | Goal::Crossing { .. } => value.0,
    };
    let mut slot_of = vec![0; m];
    let mut end = m;
    for t in (1..=slots.len()).rev() {
        let start = from[t][end];
        for position in slot_of.iter_mut().take(end).skip(start) {
            *position = t - 1;
        }
        end = start;
    }
    Some((value, slot_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(bytes: u64, handoff: f64) -> Link {
        Link { bytes, host_bytes: bytes, transient: 0, allowed: vec![true; 3], handoff }
    }

    fn gpu(capacity: u64) -> Slot {
        Slot {
            capacity,
            fixed: 0,
            size: capacity as f64,
            counted: true,
            spills: false,
            weight: 1.0,
            workspace: 0,
            required: false,
        }
    }

    #[test]
    fn balance_is_the_best_min_max_split() {
        // 7 5 4 3 2 1 over three devices of 10: the best contiguous split is {7} {5 4} {3 2 1}
        // at 9/10; an even split of the 22 bytes would be 7.33, which no cut reaches.
        let links: Vec<Link> = [7, 5, 4, 3, 2, 1].iter().map(|&b| link(b, 1.0)).collect();
        let slots = vec![gpu(10), gpu(10), gpu(10)];
        let (value, slot_of) = partition(&links, &slots, Goal::Balance).expect("fits");
        assert!((value - 0.9).abs() < 1e-12, "{value}");
        assert_eq!(slot_of, vec![0, 1, 1, 2, 2, 2]);
    }

    #[test]
    fn crossing_and_then_devices_are_fewest_within_the_limit() {
        // Under a 100 % limit the six units fit on two devices of 15: one boundary, two
        // devices; at 60 % (9 bytes a device) they need all three: {7} {5 4} {3 2 1}, two
        // boundaries. With zero handoffs every partition crosses for free and the fewest
        // devices still win.
        let slots = vec![gpu(15), gpu(15), gpu(15)];
        for handoff in [1.0, 0.0] {
            let links: Vec<Link> = [7, 5, 4, 3, 2, 1].iter().map(|&b| link(b, handoff)).collect();
            for (limit, boundaries, devices) in [(1.0, 1.0, 2.0), (0.6, 2.0, 3.0)] {
                let (crossing, _) = partition(&links, &slots, Goal::Crossing { limit }).expect("fits");
                assert_eq!(crossing, boundaries * handoff);
                let (fewest, slot_of) = partition(&links, &slots, Goal::Fewest { limit }).expect("fits");
                assert_eq!(fewest, devices);
                assert_eq!(slot_of.iter().collect::<std::collections::BTreeSet<_>>().len() as f64, devices);
            }
        }
    }

    #[test]
    fn a_required_slot_holds_a_range() {
        // 4 4 over a device of 10 with 30 fixed bytes once used, and a bare one of 10: both
        // on the bare one (8/10) beats one on each ((30 + 4)/40 = 0.85), unless the first
        // must hold a range.
        let links: Vec<Link> = [4, 4].iter().map(|&b| link(b, 0.0)).collect();
        let busy = Slot { fixed: 30, size: 40.0, ..gpu(10) };
        let (value, slot_of) = partition(&links, &[busy.clone(), gpu(10)], Goal::Balance).expect("fits");
        assert_eq!((value, slot_of), (0.8, vec![1, 1]));
        let required = Slot { required: true, ..busy };
        let (value, slot_of) = partition(&links, &[required, gpu(10)], Goal::Balance).expect("fits");
        assert!((value - 0.85).abs() < 1e-12, "{value}");
        assert_eq!(slot_of, vec![0, 1]);
        let alone = Slot { required: true, ..gpu(10) };
        assert!(partition(&links[..0], &[alone], Goal::Balance).is_none());
    }

    #[test]
    fn a_unit_larger_than_every_device_has_no_partition() {
        let links = vec![link(11, 0.0)];
        assert!(partition(&links, &[gpu(10), gpu(10)], Goal::Balance).is_none());
    }

    #[test]
    fn workspace_counts_once_per_range_and_fixed_bytes_only_when_used() {
        let mut links: Vec<Link> = [4, 4].iter().map(|&b| link(b, 0.0)).collect();
        links[0].transient = 2;
        links[1].transient = 1;
        let slot = Slot { fixed: 2, size: 14.0, ..gpu(12) };
        let slots = vec![slot.clone(), slot];
        // Together: 2 fixed + 8 bytes + 2 workspace = 12/14; apart: (2 + 4 + 2)/14 = 8/14.
        let (value, slot_of) = partition(&links, &slots, Goal::Balance).expect("fits");
        assert!((value - 8.0 / 14.0).abs() < 1e-12, "{value}");
        assert_eq!(slot_of, vec![0, 1]);
    }
}
