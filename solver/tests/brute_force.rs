//! The placement solver against exhaustive enumeration on 1,500 small random problems.
//!
//! The solver skips HiGHS where a heuristic plan (`fill.rs`) is within the relative gap of a
//! floor known without it (the bytes' floor, the chain's partition, `packing.rs`'s floor of
//! whole copies), and reports that floor as its proven `bound`. A floor above the true optimum
//! is a wrong proof: it would call a poor plan optimal, and a hand-worked test catches it only
//! if it happens to hit the case. So this file draws small problems from a deterministic
//! generator (splitmix64, no dependency), enumerates every plan of each (every device for a
//! single unit, every split of a pool's copies over the devices, the order rule of ordered
//! problems, every device within its limit as [`Problem::device_bytes`] charges it), and takes
//! the smallest largest GPU utilisation as the true optimum. Then, for every problem:
//!
//! - the solver says `Infeasible` exactly when no plan exists (a missing plan for a feasible
//!   problem, `TimeLimit` or `GaveUp` included, is a failure);
//! - its plan places every copy, keeps every device within its limit and the order rule, and
//!   its `objective` is the largest utilisation of that plan;
//! - its `bound`, and the bound of its balance stage in `stages`, are at most the optimum (the
//!   main check: a bound above it is a wrong proof);
//! - its objective is within the gap of the optimum. HiGHS measures the gap as
//!   `(objective − bound) / objective`, so "within 1 %" allows `objective ≤ optimum / 0.99`
//!   (the fills are accepted at `objective ≤ floor · 1.01`, which that includes), and later
//!   stages hold the balance at its value plus 10⁻⁶, HiGHS's absolute gap being 10⁻⁶ too.
//!   How many plans are above the optimum, and above `optimum · (1 + gap)`, is printed.
//!
//! 500 unordered and 500 ordered problems are solved with the default options (1 % gap), and
//! 250 of each at a gap of 10⁻⁶, where a fill stands without HiGHS only if a floor meets it.
//! Some 8 s in a release build, 10 s in a debug one (HiGHS is optimised in both).
//!
//! The problems have two or three GPUs (identical or not, some with fixed bytes, a few with so
//! many that the GPU is best left empty) and no `cpu` or `disk`, so nothing is offloaded and
//! the balance stage decides; three to seven units, single or pools of two to four identical
//! copies, some with a workspace or peak bytes, some of the same size as another (pools the
//! solver merges); some ask for the fewest GPUs, some have handoffs, so that later stages run
//! after the balance. Ordered problems have llama.cpp's shape: a chain of single units in
//! order, with handoffs, beside one or two unordered pools (expert tensors), positions
//! sometimes against the units' indices or shared by neighbours. Capacities leave most problems
//! feasible, some tight and some infeasible (a tenth to a fifth). A failure prints the
//! problem's index, its seed (`draw(seed, ordered)` draws it again) and the problem itself,
//! the problems with the fewest plans first.

use vramplan_solver::ilp::{self, SolveOptions, Stage, Status};
use vramplan_solver::{Assignment, Device, Problem, Steady, Target, Unit};

const GB: u64 = 1_000_000_000;
const MB: u64 = 1_000_000;

/// Problems per test.
const PROBLEMS: u64 = 500;

/// The most plans one problem's enumeration may visit (before the order and capacity checks);
/// a problem with more is drawn again.
const MOST_PLANS: u64 = 40_000;

/// splitmix64: small, deterministic, good enough to draw problems.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// Uniform in `[lo, hi)`.
    fn real(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn unit(name: String, count: u32, bytes: u64) -> Unit {
    Unit { count, ..Unit::weights(name, bytes) }
}

/// One copy's bytes: whole gigabytes, quarters of one, or any byte count (ties and exact
/// equalities are where a floor computed in floating point can slip above the optimum).
fn bytes(rng: &mut Rng, grain: u64) -> u64 {
    match grain {
        0 => rng.range(200 * MB, 8 * GB),
        g => g * rng.range(1, 8 * GB / g),
    }
}

/// The problem drawn from `seed` (`ordered` chooses the shape), or `None` where its
/// enumeration would visit more than [`MOST_PLANS`] plans.
fn draw(seed: u64, ordered: bool) -> Option<Problem> {
    let mut rng = Rng(seed);
    let grain = [GB, GB / 4, 0][rng.range(0, 2) as usize];
    let n_units = rng.range(3, 7) as usize;
    let mut units: Vec<Unit> = Vec::with_capacity(n_units);
    if ordered {
        // A chain of single units in order with handoffs, and one or two pools beside it.
        let pools = rng.range(1, 2) as usize;
        let chain = n_units - pools;
        // Positions as llama.cpp numbers its layers, or against the units' indices, or shared
        // by neighbours: the chain is sorted by `(order, index)`, whatever the indices.
        let numbering = rng.range(0, 9);
        for k in 0..chain {
            let mut u = unit(format!("blk.{k}"), 1, bytes(&mut rng, grain));
            u.order = Some(match numbering {
                0..=1 => (chain - 1 - k) as u32,
                2 => (k / 2) as u32,
                _ => k as u32,
            });
            u.handoff_bytes = rng.range(1, 16) * MB;
            units.push(u);
        }
        for k in 0..pools {
            let count = rng.range(1, 4) as u32;
            units.push(unit(format!("ffn_exps.{k}"), count, bytes(&mut rng, grain)));
        }
        // The pools among the chain, not after it: order is by position, not by index.
        if rng.chance(50) {
            let pool = units.pop().expect("a pool");
            let at = rng.range(0, units.len() as u64) as usize;
            units.insert(at, pool);
        }
    } else {
        for k in 0..n_units {
            let count = if rng.chance(50) { 1 } else { rng.range(2, 4) as u32 };
            let mut u = unit(format!("unit.{k}"), count, bytes(&mut rng, grain));
            // Copies of an earlier unit's size: pools the solver merges.
            if k > 0 && rng.chance(25) {
                let twin = rng.range(0, k as u64 - 1) as usize;
                u.resident_bytes = units[twin].resident_bytes;
                u.weight_bytes = u.resident_bytes;
                u.floor_bytes = u.resident_bytes;
                u.steady = units[twin].steady;
            }
            units.push(u);
        }
        // Handoffs between single units, not required to be contiguous: a crossing stage
        // after the balance.
        if rng.chance(30) {
            for (k, u) in units.iter_mut().filter(|u| u.count == 1).enumerate() {
                u.order = Some(k as u32);
                u.handoff_bytes = MB;
            }
        }
    }
    for u in &mut units {
        if rng.chance(25) {
            u.transient_bytes = (u.resident_bytes as f64 * rng.real(0.05, 0.6)) as u64;
        }
        // KV cache: peak bytes charged beside the resident ones.
        if rng.chance(15) {
            u.peak_bytes = (u.resident_bytes as f64 * rng.real(0.05, 0.5)) as u64;
            u.steady = Steady::lasting(u.resident_bytes, u.peak_bytes);
        }
    }
    let n_gpus = rng.range(2, 3) as usize;
    let total: u64 =
        units.iter().map(|u| u64::from(u.count) * (u.resident_bytes + u.peak_bytes)).sum::<u64>()
            + units.iter().map(|u| u.transient_bytes).max().unwrap_or(0);
    let identical = rng.chance(50);
    // A chain in order packs less evenly than free units: more room for ordered problems.
    let slack = if ordered { rng.real(1.1, 2.0) } else { rng.real(1.0, 1.8) };
    let even = total as f64 / n_gpus as f64 * slack;
    let mut devices: Vec<Device> = Vec::with_capacity(n_gpus);
    for d in 0..n_gpus {
        let (capacity, fixed) = match devices.first() {
            Some(first) if identical => (first.capacity_bytes, first.fixed_bytes),
            _ => {
                let capacity = (even * rng.real(0.7, 1.3)) as u64;
                let capacity = capacity.checked_div(grain).map_or(capacity, |c| c * grain);
                // Fixed bytes, now and then so many that using the GPU at all costs more
                // than leaving it empty.
                let fixed = match rng.range(0, 9) {
                    0..=2 => (capacity as f64 * rng.real(0.05, 0.5)) as u64,
                    3 => (capacity as f64 * rng.real(0.5, 3.0)) as u64,
                    _ => 0,
                };
                (capacity, fixed)
            }
        };
        let class = devices
            .iter()
            .find(|e| e.capacity_bytes == capacity && e.fixed_bytes == fixed)
            .map_or(d as u32, |e| e.class);
        devices.push(Device {
            name: format!("GPU {d}"),
            tier: Target::Gpu(d as u32),
            capacity_bytes: capacity,
            fixed_bytes: fixed,
            class,
            link_bytes_per_s: 0,
        });
    }
    let problem = Problem {
        units,
        devices,
        together: vec![],
        pins: vec![],
        ordered,
        min_devices: rng.chance(20),
        offload_runs_on: None,
    };
    (plans(&problem) <= MOST_PLANS).then_some(problem)
}

/// Every way to put `copies` copies on `devices` devices: the compositions of `copies`.
fn splits(copies: u32, devices: usize) -> Vec<Vec<u32>> {
    if devices == 1 {
        return vec![vec![copies]];
    }
    (0..=copies)
        .flat_map(|here| {
            splits(copies - here, devices - 1).into_iter().map(move |mut rest| {
                rest.insert(0, here);
                rest
            })
        })
        .collect()
}

fn binomial(n: u64, k: u64) -> u64 {
    (0..k).fold(1, |acc, i| acc * (n - i) / (i + 1))
}

/// How many plans the enumeration visits.
fn plans(problem: &Problem) -> u64 {
    let n = problem.devices.len() as u64;
    problem
        .units
        .iter()
        .map(|u| binomial(u64::from(u.count) + n - 1, n - 1))
        .fold(1u64, |acc, k| acc.saturating_mul(k))
}

/// The units with a position, sorted by `(order, index)`: the chain of an ordered problem.
fn chain(problem: &Problem) -> Vec<usize> {
    let mut ordered: Vec<(u32, usize)> =
        problem.units.iter().enumerate().filter_map(|(u, unit)| Some((unit.order?, u))).collect();
    ordered.sort_unstable();
    ordered.into_iter().map(|(_, u)| u).collect()
}

/// Why `assignment` is not a plan of `problem`, if it is not: a copy missing, a device over its
/// limit, or (ordered problems) the chain out of device order. The chain holds single units
/// only (the generator makes no other), so "non-decreasing device indices along the chain" is
/// the whole rule: each device's range is then contiguous.
fn violation(problem: &Problem, assignment: &Assignment) -> Option<String> {
    for (u, unit) in problem.units.iter().enumerate() {
        let placed: u32 = assignment.counts[u].iter().sum();
        if placed != unit.count {
            return Some(format!("unit {u} has {placed} of {} copies placed", unit.count));
        }
    }
    for (d, device) in problem.devices.iter().enumerate() {
        let held = problem.device_bytes(assignment, d);
        if held > device.capacity_bytes + device.fixed_bytes {
            return Some(format!("device {d} holds {held} > {}", device.capacity_bytes + device.fixed_bytes));
        }
    }
    if problem.ordered {
        let mut last = 0;
        for u in chain(problem) {
            assert_eq!(problem.units[u].count, 1, "the enumeration's order rule is for single units");
            let d = assignment.device_of(u).expect("placed");
            if d < last {
                return Some(format!("unit {u} on device {d} after one on device {last}"));
            }
            last = d;
        }
    }
    None
}

/// The largest GPU utilisation of a plan.
fn largest(problem: &Problem, assignment: &Assignment) -> f64 {
    (0..problem.devices.len())
        .filter(|&d| matches!(problem.devices[d].tier, Target::Gpu(_)))
        .map(|d| problem.utilisation(assignment, d))
        .fold(0.0, f64::max)
}

/// The smallest largest GPU utilisation over every plan, by enumeration; `None` where there is
/// no plan.
fn optimum(problem: &Problem) -> Option<f64> {
    let n = problem.devices.len();
    let options: Vec<Vec<Vec<u32>>> = problem.units.iter().map(|u| splits(u.count, n)).collect();
    let mut at = vec![0usize; options.len()];
    let mut assignment = Assignment { counts: options.iter().map(|o| o[0].clone()).collect() };
    let mut best: Option<f64> = None;
    loop {
        if violation(problem, &assignment).is_none() {
            let value = largest(problem, &assignment);
            best = Some(best.map_or(value, |b| b.min(value)));
        }
        // The next plan, as an odometer over the units' options.
        let mut u = 0;
        loop {
            if u == options.len() {
                return best;
            }
            at[u] += 1;
            if at[u] < options[u].len() {
                assignment.counts[u].clone_from(&options[u][at[u]]);
                break;
            }
            at[u] = 0;
            assignment.counts[u].clone_from(&options[u][0]);
            u += 1;
        }
    }
}

/// What one problem showed.
#[derive(Default)]
struct Tally {
    problems: usize,
    infeasible: usize,
    /// Feasible problems whose plan is above the optimum (by more than 10⁻⁹).
    above: usize,
    /// Feasible problems whose plan is above `optimum · (1 + gap)`.
    beyond_gap: usize,
    /// Problems the solver called optimal.
    optimal: usize,
    /// Failures: (plans enumerated, the report).
    failures: Vec<(u64, String)>,
}

/// Checks the solver on one problem against its enumerated optimum (module documentation).
fn check(tally: &mut Tally, index: u64, seed: u64, problem: &Problem, options: &SolveOptions) {
    let gap = options.relative_gap;
    let optimum = optimum(problem);
    let solution = ilp::solve(problem, options);
    tally.problems += 1;
    tally.optimal += usize::from(solution.status == Status::Optimal);
    let mut wrong: Vec<String> = Vec::new();
    match (optimum, &solution.assignment) {
        (None, _) => {
            tally.infeasible += 1;
            if solution.status != Status::Infeasible || solution.assignment.is_some() {
                wrong.push(format!("no plan exists, but the solver says {:?}", solution.status));
            }
        }
        (Some(best), None) => {
            wrong.push(format!(
                "a plan at {best} exists, but the solver says {:?} with none",
                solution.status
            ));
        }
        (Some(best), Some(plan)) => {
            if let Some(why) = violation(problem, plan) {
                wrong.push(format!("the solver's plan is not a plan: {why}"));
            }
            let value = largest(problem, plan);
            if solution.objective != value {
                wrong.push(format!(
                    "objective {} but the plan's largest utilisation is {value}",
                    solution.objective
                ));
            }
            // HiGHS's gap is `(objective − bound) / objective`, and each later stage holds the
            // balance at its value plus 10⁻⁶ (HiGHS's absolute gap is 10⁻⁶ too).
            if solution.objective.is_nan() || solution.objective > best / (1.0 - gap - 1e-9) + 2e-6 {
                wrong.push(format!(
                    "objective {} is beyond the {gap} gap of the optimum {best}",
                    solution.objective
                ));
            }
            if solution.bound.is_nan() || solution.bound > best + 1e-9 {
                wrong.push(format!("bound {} above the optimum {best}", solution.bound));
            }
            for stage in solution.stages.iter().filter(|s| s.stage == Stage::Balance) {
                // NaN: nothing proven, nothing claimed.
                if stage.bound > best + 1e-9 {
                    wrong.push(format!("balance stage bound {} above the optimum {best}", stage.bound));
                }
            }
            if solution.objective > best * (1.0 + 1e-9) {
                tally.above += 1;
            }
            if solution.objective > best * (1.0 + gap) + 1e-12 {
                tally.beyond_gap += 1;
            }
        }
    }
    if !wrong.is_empty() {
        let report = format!(
            "problem {index} (seed {seed:#x}): {}\n  optimum {optimum:?}; solver {:?}, objective {}, \
             bound {}, stages {:?}\n  plan {:?}\n  {problem:?}",
            wrong.join("; "),
            solution.status,
            solution.objective,
            solution.bound,
            solution.stages,
            solution.assignment.as_ref().map(|a| &a.counts),
        );
        tally.failures.push((plans(problem), report));
    }
}

/// Draws and checks `problems` problems of one shape under `options`, then fails with every
/// failure, the smallest (fewest plans) first.
fn run(salt: u64, ordered: bool, problems: u64, options: &SolveOptions) {
    let mut tally = Tally::default();
    let mut index = 0u64;
    let mut attempt = 0u64;
    while index < problems {
        let seed = salt ^ attempt.wrapping_mul(0xD1B5_4A32_D192_ED03);
        attempt += 1;
        let Some(problem) = draw(seed, ordered) else { continue };
        check(&mut tally, index, seed, &problem, options);
        index += 1;
    }
    eprintln!(
        "{} problems ({} drawn), gap {}: {} infeasible, {} called optimal, {} above the optimum, \
         {} beyond the gap, {} failures",
        tally.problems,
        attempt,
        options.relative_gap,
        tally.infeasible,
        tally.optimal,
        tally.above,
        tally.beyond_gap,
        tally.failures.len()
    );
    // The generator must leave most problems feasible, yet test infeasibility too.
    assert!(tally.infeasible > 0 && tally.infeasible * 3 < tally.problems, "{} infeasible", tally.infeasible);
    if !tally.failures.is_empty() {
        tally.failures.sort_by_key(|f| f.0);
        let all: Vec<&str> = tally.failures.iter().map(|f| f.1.as_str()).collect();
        panic!("{} of {} problems failed:\n{}", all.len(), tally.problems, all.join("\n\n"));
    }
}

#[test]
fn enumeration_finds_compositions_and_the_order_rule() {
    // The enumeration itself, on cases worked by hand. Three copies over two devices split
    // 3+0, 2+1, 1+2, 0+3; four over three devices in C(6, 2) = 15 ways.
    assert_eq!(splits(3, 2), vec![vec![0, 3], vec![1, 2], vec![2, 1], vec![3, 0]]);
    assert_eq!(splits(4, 3).len(), 15);
    let gpu = |d: u32, capacity: u64| Device {
        name: format!("GPU {d}"),
        tier: Target::Gpu(d),
        capacity_bytes: capacity,
        fixed_bytes: 0,
        class: 0,
        link_bytes_per_s: 0,
    };
    // Units 1, 2, 3, 4, 5, 6 GB in order over three 10 GB GPUs: 0.9 ([1, 2, 3] | [4, 5] | [6]),
    // where unordered they split 7/7/7.
    let mut units: Vec<Unit> = (1..=6).map(|g| unit(format!("layer {g}"), 1, g * GB)).collect();
    for (k, u) in units.iter_mut().enumerate() {
        u.order = Some(k as u32);
    }
    let mut p = Problem {
        units,
        devices: (0..3).map(|d| gpu(d, 10 * GB)).collect(),
        together: vec![],
        pins: vec![],
        ordered: true,
        min_devices: false,
        offload_runs_on: None,
    };
    assert!((optimum(&p).expect("a plan") - 0.9).abs() < 1e-12);
    p.ordered = false;
    assert!((optimum(&p).expect("a plan") - 0.7).abs() < 1e-12);
    // Five copies of 3 GB and a 2 GB unit with a 2 GB workspace over two 10 GB GPUs: 17 GB
    // and a workspace. Three copies (9) and the unit (2 + 2) cannot share; two copies and the
    // unit give 10, three copies 9: 1.0. Six copies do not fit at all.
    let mut pool = unit("experts".into(), 5, 3 * GB);
    let mut small = unit("small".into(), 1, 2 * GB);
    small.transient_bytes = 2 * GB;
    p.units = vec![pool.clone(), small.clone()];
    p.devices.truncate(2);
    assert!((optimum(&p).expect("a plan") - 1.0).abs() < 1e-12);
    pool.count = 6;
    p.units = vec![pool, small];
    assert_eq!(optimum(&p), None);
}

#[test]
fn unordered_pools_match_exhaustive_enumeration() {
    run(0x5EED_0000_0000_0001, false, PROBLEMS, &SolveOptions::default());
}

#[test]
fn ordered_chains_beside_pools_match_exhaustive_enumeration() {
    run(0x5EED_0000_0000_0002, true, PROBLEMS, &SolveOptions::default());
}

#[test]
fn a_tight_gap_leaves_no_room_for_a_wrong_floor() {
    // At a gap of 10⁻⁶ a fill is kept without HiGHS only where a floor meets it: a packing
    // floor, bytes' floor or chain partition that is too high shows as a bound above the
    // optimum, and a fill above the optimum accepted on it as an objective beyond the gap.
    let options = SolveOptions { relative_gap: 1e-6, ..SolveOptions::default() };
    run(0x5EED_0000_0000_0003, false, PROBLEMS / 2, &options);
    run(0x5EED_0000_0000_0004, true, PROBLEMS / 2, &options);
}
