//! The exact placement ILP over a [`Problem`], solved with HiGHS through good_lp.
//!
//! [`solve`] places every copy of every unit on a device so that each device's charge (as
//! [`Problem::device_bytes`] counts it) stays within its limit, and among those plans picks,
//! in this order of priority:
//!
//! 1. the fewest bytes offloaded to `cpu` and `disk` (then, of those, the fewest on `disk`);
//! 2. the smallest largest GPU utilisation (balance); where units carry a load, then the
//!    smallest largest per-GPU load within that balance;
//! 3. the fewest handoff bytes crossing a device boundary, each crossing weighted by the
//!    inverse bandwidth of the link it leaves on;
//! 4. where the problem asks for it, the fewest GPUs.
//!
//! # Blocks
//!
//! Units that must share a device (`together` groups, merged transitively) form one *block*;
//! a unit alone forms a block of its own. A block of one unit with `count` copies keeps its
//! copies aggregated: the solver decides how many go where, never which, so 256 experts are
//! one integer per device rather than 256 binaries. A block of several units moves whole,
//! all copies of all its members on one device.
//!
//! Before any variable exists, each block gets the devices it may use: not `cpu` or `disk`
//! when a member is `gpu_only`, only the pinned device when a member is pinned, and only
//! devices where one copy of the block and its workspace fit. The most copies a device can
//! take, `⌊(capacity − workspace) / bytes⌋`, bounds the block's count there. A block with
//! no device, pins that disagree or name unknown units or devices, copies that no set of
//! devices can take, or more bytes in all than all capacities together, make the problem
//! infeasible without calling HiGHS.
//!
//! # Pools
//!
//! Blocks that no row tells apart (the same bytes, workspace and possible devices, and no unit
//! with a neighbour in order) pool into one count per device: DeepSeek-V3's 58 expert layers
//! of 256 experts become one integer per GPU, its 3 dense layers another. Any count of a pool
//! per device splits into counts of its parts that every row accepts (a transportation problem
//! whose capacities the pool's bounds already respect), and the split is made at the end: each
//! part spread over the pool's devices in proportion, so that every expert layer gets its
//! share of every GPU, as expert parallelism wants. Only the load stage tells parts apart, and
//! only for pools whose parts carry different loads; there the parts get counts of their own,
//! tied to the pool's (`Σ_parts v = v_pool` per device).
//!
//! # Offload that runs on a GPU
//!
//! Where the problem says so ([`Problem::offload_runs_on`]: accelerate's main device), a unit on
//! `cpu` or `disk` leaves only its resident bytes there. Its peak bytes (KV cache) are charged to
//! the GPU that runs it, `peak_b·v[b][host]` in that GPU's rows, and that GPU's workspace is at
//! least a copy of the unit's weights and its own workspace while it runs: `τ ≥ (resident_b +
//! transient_b)·y[b][host]`. [`Problem::device_bytes`] counts the same.
//!
//! # Variables
//!
//! Device `d`'s rows are divided by `S_d` = its capacity plus fixed bytes (the denominator of
//! [`Problem::utilisation`]), so that coefficients are near 1. For pool `b` and device `d`:
//!
//! - `v[b][d]`, integer in `0..=min(copies_b, most that fit)`, binary for a single copy: the
//!   copies of `b` on `d`; a constant where `b` has a single possible device;
//! - `y[b][d]`, binary, "`d` holds some copy of `b`": `v` itself for a single copy; for
//!   several copies a variable with `v ≤ most·y` and `y ≤ v`, made only where the order or a
//!   handoff needs it;
//! - `τ[d]` ≥ 0, the workspace `d` reserves. A single-copy pool gets `τ[d] ≥ transient_b·v`.
//!   Pools of several copies share, per distinct workspace size `t_k`, one binary `W[d][k]`,
//!   "some copy of a pool with workspace ≥ `t_k` is on `d`" (`Σ v ≤ (Σ most)·W[d][k]` over
//!   those pools), and `τ[d] ≥ Σ_k (t_k − t_{k+1})·W[d][k]`, which telescopes to the largest
//!   workspace present: an expert pool needs one such binary per GPU, where a presence binary
//!   per block and GPU with three rows each made the root LP of DeepSeek-V3 thirty times slower;
//! - `z[d]`, binary, "GPU `d` is used", where its fixed bytes must be counted only when used,
//!   or fewer GPUs are asked for: `z[d] ≥ y[b][d]` (or `v[b][d] / copies_b`) and the capacity
//!   row becomes `… ≤ capacity_d·z[d]`;
//! - `U` ≥ 0, the largest GPU utilisation; `L` ≥ 0, the largest GPU load, where loads exist;
//! - `c[p][d]` ∈ [0, 1], "the handoff of consecutive pair `p` = (a, b) leaves `d`":
//!   `c ≥ y[a][d] − y[b][d]`.
//!
//! # Constraints
//!
//! - every copy is placed: `Σ_d v[b][d] = copies_b`;
//! - capacity: `Σ_b bytes_b·v[b][d] + τ[d] ≤ capacity_d`, which is `device_bytes ≤ fixed +
//!   capacity` exactly, because fixed bytes are already outside `capacity_bytes`;
//! - utilisation on each GPU: `(fixed_d·z[d] + Σ_b bytes_b·v[b][d] + τ[d]) / S_d ≤ U`. At the
//!   optimum `τ` is the largest workspace present and `z` is 1 only where the GPU is used, so
//!   the smallest `U` is the largest [`Problem::utilisation`] of a plan;
//! - load on each GPU: `Σ_b load_b·v[b][d] ≤ L` (over the parts of a split pool);
//! - order (when the problem is `ordered`): units with a position, sorted by `(order, index)`,
//!   sit on non-decreasing device indices (devices in the problem's order, so `cpu` and `disk`
//!   take the tail), and each device holds a contiguous range. For consecutive single-copy
//!   `a`, `b` this is the prefix form `Σ_{d' ≤ d} v[b][d'] ≤ Σ_{d' ≤ d} v[a][d']` for every
//!   `d` ("if `b` sits at or before `d`, so does `a`"), whose relaxation is far tighter than one
//!   row comparing device indices; a unit of several copies gets continuous `first`/`last`
//!   positions from its `y` and the pair needs `last_a ≤ first_b`.
//!
//! ## Fixed bytes
//!
//! With `z` fractional, the relaxation pays `fixed_d·v/copies`, almost nothing: DeepSeek-V3's
//! 20 GB of replicated weights per GPU vanished from the bound (0.30 for an optimum of 0.53).
//! So `z` is left out where it cannot matter. Bytes alone give a bound on every plan: the bytes
//! that must stay on GPUs (all of them without offload devices; else those of GPU-only pools or
//! what the offload devices cannot take, whichever is more) fit under `Σ_d max(0, U·S_d −
//! fixed_d)`, so `U` is at least the root `U₀` of that sum. A GPU with `fixed_d / S_d ≤ U₀`
//! counts its fixed bytes as a constant, used or not: that only adds `U ≥ fixed_d / S_d`,
//! which every plan satisfies, so the optimum and HiGHS's bound are those of the true
//! problem.
//!
//! # Objectives
//!
//! The priorities are solved as a sequence of MIPs (lexicographic optimisation). After a stage,
//! its objective is held at the value of the plan it found (plus 10⁻⁶ relative, above HiGHS's
//! feasibility tolerance of 10⁻⁷) by a new row, and that plan starts the next stage as its
//! incumbent, so every stage has a plan from its first node and a time limit can only cut a
//! stage short, never leave it without a plan. Variables only a later stage needs (`L`, `c`,
//! `z` for fewest GPUs) are made after all others and enter with that stage, so earlier stages
//! stay small; HiGHS completes the start plan's new columns itself.
//!
//! Stage objectives: offloaded bytes; disk bytes; `U`; `L`; `Σ_p Σ_d handoff_a·w_d·c[p][d]`,
//! with `w_d` the inverse of `d`'s link bandwidth over the mean inverse bandwidth of the known
//! links (an unknown link, bandwidth 0, weighs 1: neither preferred nor avoided); `Σ z`.
//! A stage is skipped when its objective is constant (no offload device, nothing offloaded,
//! no loads, no handoffs, fewest GPUs not asked for), or when the plan in hand is already
//! within the relative gap of a bound known without HiGHS:
//!
//! - loads: the load that cannot leave the GPUs spreads at best evenly, and no copy is split.
//!   The plan in hand has its pools with loads re-split greedily (heaviest parts first, each
//!   copy to the least loaded GPU with room left in the pool), which lands within a copy's load
//!   of even: 58 layers × 8 load classes of DeepSeek-V3's experts need no MIP for the loads;
//! - handoffs: with `U` held, the chain of ordered units must visit at least as many devices as
//!   their bytes need (largest rooms first), and each change of device costs at least the
//!   smallest handoff times the smallest link weight. In a pipeline over devices that must all
//!   be used, this proves the balance stage's plan optimal for handoffs without a second MIP.
//!
//! # Chains
//!
//! An ordered problem's units with a position form a chain laid out in contiguous ranges, and
//! the linear relaxation of the order rows is weak on it: it spreads units over neighbouring
//! devices, so its bound is the even split, and HiGHS needed 35 s of branching to prove the
//! balance of Llama-2-70B's 83 units over 16 GPUs. The chain alone (unordered pools and other
//! pins left out) is a linear partition problem that [`crate::chain`] solves exactly by dynamic
//! programming, for the balance and for the crossings under the balance held. Its value is a
//! lower bound on the stage, added as a cut (`U ≥ value`, or crossings ≥ value) with its plan
//! as the start, so the root bound is the optimum. Where the chain is the whole problem (every
//! pool in it once: the accelerate and pipeline targets) and its partition sits on GPUs alone,
//! the partition *is* the stage's optimum, and the stage needs no MIP; with no `cpu` or `disk`
//! to spill to, a whole chain without a partition means the problem has no plan. Before the
//! offload stage, a partition on GPUs alone proves that nothing needs offloading.
//!
//! The reported `objective` is recomputed from the returned plan with
//! [`Problem::utilisation`]; `bound` is HiGHS's dual bound of the balance stage: no plan with
//! the least offload has a smaller largest utilisation.
//!
//! # Symmetry
//!
//! Devices of one class that agree in tier, capacity, fixed bytes and link bandwidth, and that
//! no pin names, are interchangeable: exchanging everything two of them hold maps a plan to a
//! plan that satisfies every constraint (their rows are identical, and the devices each pool
//! may use are the same for both) and has the same value in every stage (utilisation, load,
//! the weight of a crossing and the used count are all the same for both devices). So every
//! orbit of plans under these exchanges contains a plan whose charges `Σ_b bytes_b·v[b][d]`
//! are non-increasing along the class's devices in problem order, and requiring that keeps at
//! least one optimum of every stage. Before pools, DeepSeek-V3 over 32 GPUs did not reach a
//! 0.1 % gap in 20 s without it, and 0.1 s with it; eight expert layers of unequal sizes over
//! eight GPUs still solve three times faster with it. When the problem is `ordered`, device
//! positions matter and no symmetry is broken.
//!
//! # Determinism and numerics
//!
//! HiGHS runs on one thread with a fixed random seed, and the model is built in a fixed
//! order (good_lp's expressions hash with FNV, which has no random state), so the same problem
//! gives the same plan. HiGHS's feasibility-jump heuristic and its presolve's enumeration of
//! small rows are off: on the bench instances they cost half of the work (Llama-2-70B) and a
//! third (DeepSeek-V3), counted in instructions, and found nothing the root LP did not. Counts are read back
//! rounded to the nearest integer and every device's charge is checked in exact bytes; should
//! a plan exceed a limit by HiGHS's tolerance, that device's capacity shrinks by the excess and
//! the problem is solved again (three rounds at most, within the same time limit).

use std::collections::HashMap;
use std::time::Instant;

use good_lp::{
    Constraint, Expression, IntoAffineExpression, ProblemVariables, SolverModel, Variable, variable,
};
use serde::Serialize;

use crate::chain::{self, Goal, Link, Slot};
use crate::problem::{Assignment, Problem, Tier};

/// How long and how closely to solve.
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Wall-clock limit for all stages together, in seconds; `None` for none.
    pub time_limit_s: Option<f64>,
    /// A stage stops once its plan is proven within this fraction of the best possible (HiGHS's
    /// `mip_rel_gap`). The default, 10⁻³, is a tenth of a percent of the worst device's
    /// utilisation: below what any memory estimate can promise, and loose enough that a proof
    /// of the last fraction of a copy never keeps a large instance busy.
    pub relative_gap: f64,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { time_limit_s: None, relative_gap: 1e-3 }
    }
}

/// How the solve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every stage finished within the relative gap.
    Optimal,
    /// The time limit cut a stage short; the plan is the best found, `gap` says how good.
    TimeLimit,
    /// No plan satisfies the constraints (or none was found to, see [`solve`]).
    Infeasible,
}

/// The answer to a [`Problem`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Solution {
    pub status: Status,
    /// The plan; `None` when infeasible or when the time ran out before any plan was found.
    pub assignment: Option<Assignment>,
    /// The largest GPU utilisation ([`Problem::utilisation`]) of the plan; NaN without a plan.
    pub objective: f64,
    /// A proven lower bound on that utilisation among plans with the least offload; 0 when
    /// the balance stage was not reached, NaN when infeasible.
    pub bound: f64,
    /// `(objective − bound) / objective` (0 when the objective is 0).
    pub gap: f64,
    /// Wall-clock seconds, all stages together.
    pub seconds: f64,
    /// Resident and peak bytes of the copies placed on `cpu` and `disk`.
    pub offloaded_bytes: u64,
    /// Handoff bytes crossing devices: for each pair of consecutive units in order, the
    /// handoff of the first times the number of devices holding it but not the second.
    pub crossing_bytes: u64,
    /// GPUs holding anything.
    pub gpus_used: u32,
}

/// Solves `problem` under `options`. Never panics on odd input: unknown indices in pins or
/// groups, or contradictory pins, make the problem infeasible. A HiGHS failure other than
/// infeasibility reads as `TimeLimit` with the best plan found before it, if any; a plan still
/// over a limit after the repairs described in the module documentation reads as `Infeasible`.
pub fn solve(problem: &Problem, options: &SolveOptions) -> Solution {
    const REPAIR_ROUNDS: usize = 3;
    let started = Instant::now();
    let mut capacities: Vec<u64> = problem.devices.iter().map(|d| d.capacity_bytes).collect();
    for _ in 0..=REPAIR_ROUNDS {
        let staged = solve_stages(problem, &capacities, options, started);
        let Some(assignment) = &staged.assignment else {
            return report(problem, staged, started);
        };
        let mut over = false;
        for (d, device) in problem.devices.iter().enumerate() {
            let held = problem.device_bytes(assignment, d);
            let limit = device.capacity_bytes.saturating_add(device.fixed_bytes);
            if held > limit {
                capacities[d] = capacities[d].saturating_sub(held - limit);
                over = true;
            }
        }
        if !over {
            return report(problem, staged, started);
        }
    }
    report(problem, Staged { status: Status::Infeasible, assignment: None, bound: f64::NAN }, started)
}

/// What the stages found, before the figures of the plan are worked out.
struct Staged {
    status: Status,
    assignment: Option<Assignment>,
    bound: f64,
}

fn report(problem: &Problem, staged: Staged, started: Instant) -> Solution {
    let seconds = started.elapsed().as_secs_f64();
    let Some(assignment) = staged.assignment else {
        return Solution {
            status: staged.status,
            assignment: None,
            objective: f64::NAN,
            bound: staged.bound,
            gap: f64::NAN,
            seconds,
            offloaded_bytes: 0,
            crossing_bytes: 0,
            gpus_used: 0,
        };
    };
    let mut objective: f64 = 0.0;
    let mut offloaded_bytes = 0;
    let mut gpus_used = 0;
    for (d, device) in problem.devices.iter().enumerate() {
        match device.tier {
            Tier::Gpu(_) => {
                objective = objective.max(problem.utilisation(&assignment, d));
                gpus_used += u32::from(problem.device_bytes(&assignment, d) > 0);
            }
            Tier::Cpu | Tier::Disk => {
                for (u, unit) in problem.units.iter().enumerate() {
                    let copy = problem.copy_bytes(unit, d);
                    offloaded_bytes = u64::from(assignment.counts[u][d])
                        .saturating_mul(copy)
                        .saturating_add(offloaded_bytes);
                }
            }
        }
    }
    let mut crossing_bytes = 0;
    for (a, b) in ordered_pairs(problem) {
        let leaving = (0..problem.devices.len())
            .filter(|&d| assignment.counts[a][d] > 0 && assignment.counts[b][d] == 0)
            .count() as u64;
        crossing_bytes =
            problem.units[a].handoff_bytes.saturating_mul(leaving).saturating_add(crossing_bytes);
    }
    let bound = staged.bound.min(objective);
    let gap = if objective > 0.0 { ((objective - bound) / objective).max(0.0) } else { 0.0 };
    Solution {
        status: staged.status,
        assignment: Some(assignment),
        objective,
        bound,
        gap,
        seconds,
        offloaded_bytes,
        crossing_bytes,
        gpus_used,
    }
}

/// Consecutive units in forward order: those with a position, sorted by `(order, index)`.
fn ordered_pairs(problem: &Problem) -> Vec<(usize, usize)> {
    let mut ordered: Vec<(u32, usize)> =
        problem.units.iter().enumerate().filter_map(|(u, unit)| Some((unit.order?, u))).collect();
    ordered.sort_unstable();
    ordered.windows(2).map(|w| (w[0].1, w[1].1)).collect()
}

/// Units that move together, and where they may go.
struct Block {
    members: Vec<usize>,
    /// Copies the block's count variables count: the unit's `count` for a unit alone, 1 for a
    /// group (every member's copies go with it).
    copies: u32,
    /// Resident and peak bytes of one copy.
    bytes: u64,
    /// Peak bytes of one copy: where the block is offloaded to a host whose units run on a GPU
    /// ([`Problem::offload_runs_on`]), they live on that GPU, not the host.
    peak: u64,
    /// The largest workspace of its members.
    transient: u64,
    /// Load of one copy.
    load: f64,
    /// `(device, most copies that fit there)`, devices in problem order.
    allowed: Vec<(usize, u32)>,
}

impl Block {
    /// Bytes one copy holds on a device: all of them, or the resident ones alone on a host
    /// that `spills` its peak bytes to the GPU running its units.
    fn bytes_on(&self, spills: bool) -> u64 {
        if spills { self.bytes - self.peak } else { self.bytes }
    }

    /// Copies of unit `u` (a member) per copy of the block.
    fn per_copy(&self, problem: &Problem, u: usize) -> u32 {
        if self.members.len() == 1 { 1 } else { problem.units[u].count }
    }
}

/// The blocks of `problem` and the block of each unit, or `None` when the problem is
/// obviously infeasible (see the module documentation).
fn blocks(problem: &Problem, capacities: &[u64]) -> Option<(Vec<Block>, Vec<usize>)> {
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
            let tier_ok = matches!(device.tier, Tier::Gpu(_)) || !gpu_only;
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

/// Copies of a pool on a device in the model.
#[derive(Debug, Clone, Copy)]
enum Copies {
    /// The pool may not use the device.
    None,
    /// The device is the pool's only one: all its copies are there.
    All,
    /// A count variable.
    Free(Variable),
}

/// The lexicographic stages, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Offload,
    Disk,
    Balance,
    Load,
    Crossing,
    Devices,
}

/// One stage's MIP. Each stage's variables extend those of the stage before it (a stage that
/// needs more creates them after all earlier ones), so a plan of one stage is a partial start
/// of the next.
struct StageModel {
    stage: Stage,
    objective: Expression,
    /// The variables that exist by this stage.
    vars: ProblemVariables,
    /// The rows this stage adds to the base rows and those of the stages before it.
    rows: Vec<Constraint>,
}

/// The variables, rows and stages of one problem.
struct Formulation {
    /// Rows every stage has.
    base: Vec<Constraint>,
    stages: Vec<StageModel>,
    /// The problem's blocks.
    blocks: Vec<Block>,
    /// The pools the model counts, each one block or several identical ones (see [`pools`]).
    pools: Vec<Block>,
    /// Block indices of each pool.
    parts: Vec<Vec<usize>>,
    /// `copies[pool][device]`.
    copies: Vec<Vec<Copies>>,
    /// `split[pool][part][device]`: copies of one part where the load stage needs them.
    split: Vec<Vec<Vec<Option<Variable>>>>,
    /// Column of every variable, in the last stage's model.
    column: HashMap<Variable, usize>,
    /// The load stage's scale (mean load per GPU) and a bound on its objective, where loads exist.
    loads: Option<(f64, f64)>,
    /// Whether each device is a GPU.
    is_gpu: Vec<bool>,
    /// Units and devices, for reading plans back.
    shape: (usize, usize),
    handoffs: Handoffs,
    /// The largest `S_d`: the offload stage's objective is bytes over this.
    scale: f64,
    /// Copies on `cpu` and `disk`, all units counted alike. Offloaded bytes over `scale` cannot
    /// see a unit of a few megabytes next to a 4 TiB disk (10⁻⁶ of the objective); once no
    /// offload is needed this count is held at zero, so no small unit is offloaded while a GPU
    /// has room for it.
    host_copies: Expression,
    /// Ordered problems: the pool at each position of the chain and the chain as
    /// [`chain::partition`] takes it.
    chain: Option<(Vec<usize>, Vec<Link>)>,
}

/// The terms of the crossing stage, to price a plan and bound the stage without the solver.
struct Handoffs {
    /// `(pool of a, pool of b, handoff of a over the largest handoff)` for consecutive units
    /// `a`, `b` in different blocks, zero handoffs included (a unit with a neighbour in order
    /// is never pooled).
    pairs: Vec<(usize, usize, f64)>,
    /// Weight of a handoff leaving each device.
    weight: Vec<f64>,
}

/// The chain's best partition for one stage.
struct Partition {
    /// Its value: a lower bound on the stage's objective.
    value: f64,
    /// Its plan as a start: the chain's counts, the other columns unknown (infinite).
    start: Vec<f64>,
    /// Whether it is a plan of the whole problem on GPUs alone: every pool is in the chain
    /// once, so the partition is the stage's optimum and HiGHS is not needed.
    complete: bool,
}

/// Builds a [`Formulation`]: the variables so far and the rows of the part being built.
struct Builder {
    blocks: Vec<Block>,
    /// `S_d`: capacity plus fixed bytes, the unit of device `d`'s rows.
    size: Vec<f64>,
    vars: ProblemVariables,
    rows: Vec<Constraint>,
    copies: Vec<Vec<Copies>>,
    /// Presence indicators of pools of several copies, made when first needed.
    presence: Vec<Vec<Option<Variable>>>,
    /// Per device: resident, peak and workspace bytes over `S_d`, without fixed bytes.
    held: Vec<Expression>,
    /// Per GPU: the "used" indicator, where one exists.
    used: Vec<Option<Variable>>,
}

impl Builder {
    fn count(&self, b: usize, d: usize) -> Expression {
        match self.copies[b][d] {
            Copies::None => Expression::default(),
            Copies::All => Expression::from(f64::from(self.blocks[b].copies)),
            Copies::Free(v) => Expression::from(v),
        }
    }

    /// The most copies of pool `b` device `d` can take.
    fn most(&self, b: usize, d: usize) -> f64 {
        self.blocks[b].allowed.iter().find(|a| a.0 == d).map_or(0.0, |a| f64::from(a.1))
    }

    /// 1 when device `d` holds some copy of pool `b`.
    fn presence(&mut self, b: usize, d: usize) -> Expression {
        let v = match self.copies[b][d] {
            Copies::None => return Expression::default(),
            Copies::All => return Expression::from(1.0),
            Copies::Free(v) if self.blocks[b].copies == 1 => return Expression::from(v),
            Copies::Free(v) => v,
        };
        if let Some(y) = self.presence[b][d] {
            return Expression::from(y);
        }
        let y = self.vars.add(variable().binary());
        let most = self.most(b, d);
        self.rows.push((Expression::from(v) - most * y).leq(0.0));
        self.rows.push((Expression::from(y) - v).leq(0.0));
        self.presence[b][d] = Some(y);
        Expression::from(y)
    }

    /// A "used" indicator for GPU `d`: 1 when it holds any byte.
    fn used(&mut self, d: usize) -> Variable {
        if let Some(flag) = self.used[d] {
            return flag;
        }
        let flag = self.vars.add(variable().binary());
        for b in 0..self.blocks.len() {
            if matches!(self.copies[b][d], Copies::None) || self.blocks[b].bytes == 0 {
                continue;
            }
            let share = match (self.copies[b][d], self.presence[b][d]) {
                (Copies::Free(_), None) if self.blocks[b].copies > 1 => {
                    self.count(b, d) * (1.0 / f64::from(self.blocks[b].copies))
                }
                _ => self.presence(b, d),
            };
            self.rows.push((share - flag).leq(0.0));
        }
        self.used[d] = Some(flag);
        flag
    }

    fn take(&mut self, stage: Stage, objective: Expression) -> StageModel {
        StageModel { stage, objective, vars: self.vars.clone(), rows: std::mem::take(&mut self.rows) }
    }
}

impl Formulation {
    fn new(problem: &Problem, capacities: &[u64], blocks: Vec<Block>, block_of: &[usize]) -> Self {
        let n_devices = problem.devices.len();
        let pairs = ordered_pairs(problem);
        let spilling: Vec<bool> = (0..n_devices).map(|d| spills(problem, d)).collect();
        let (pooled, parts, pool_of) = pools(capacities, &spilling, &blocks, block_of, &pairs);
        let block_of: Vec<usize> = block_of.iter().map(|&b| pool_of[b]).collect();
        let is_gpu: Vec<bool> = problem.devices.iter().map(|d| matches!(d.tier, Tier::Gpu(_))).collect();
        let size: Vec<f64> = (0..n_devices)
            .map(|d| capacities[d].saturating_add(problem.devices[d].fixed_bytes).max(1) as f64)
            .collect();
        let scale = size.iter().copied().fold(1.0, f64::max);
        let floor = utilisation_floor(problem, capacities, &pooled);
        let mut x = Builder {
            size,
            vars: ProblemVariables::new(),
            rows: Vec::new(),
            copies: vec![vec![Copies::None; n_devices]; pooled.len()],
            presence: vec![vec![None; n_devices]; pooled.len()],
            held: vec![Expression::default(); n_devices],
            used: vec![None; n_devices],
            blocks: pooled,
        };

        // Counts: every copy placed.
        for b in 0..x.blocks.len() {
            let block = &x.blocks[b];
            if let [(d, _)] = block.allowed[..] {
                x.copies[b][d] = Copies::All;
                continue;
            }
            let mut placed = Expression::default();
            for &(d, most) in &block.allowed {
                let v = x.vars.add(if block.copies == 1 {
                    variable().binary()
                } else {
                    variable().integer().clamp(0, most)
                });
                x.copies[b][d] = Copies::Free(v);
                placed += v;
            }
            x.rows.push(placed.eq(f64::from(block.copies)));
        }

        // Order: contiguous ranges in device order.
        if problem.ordered {
            let mut ends: HashMap<usize, (Expression, Expression)> = HashMap::new();
            for &(a, b) in &pairs {
                let (a, b) = (block_of[a], block_of[b]);
                if a == b || x.blocks[a].copies == 0 || x.blocks[b].copies == 0 {
                    continue;
                }
                if x.blocks[a].copies == 1 && x.blocks[b].copies == 1 {
                    let (mut prefix_a, mut prefix_b) = (Expression::default(), Expression::default());
                    for d in 0..n_devices.saturating_sub(1) {
                        prefix_a += x.count(a, d);
                        prefix_b += x.count(b, d);
                        x.rows.push((prefix_b.clone() - prefix_a.clone()).leq(0.0));
                    }
                    continue;
                }
                for block in [a, b] {
                    if let std::collections::hash_map::Entry::Vacant(slot) = ends.entry(block) {
                        slot.insert(block_ends(&mut x, block));
                    }
                }
                x.rows.push((ends[&a].1.clone() - ends[&b].0.clone()).leq(0.0));
            }
        }

        // Per device: charge, workspace, capacity, utilisation.
        let max_utilisation = x.vars.add(variable().min(0.0));
        let mut offloaded = Expression::default();
        let mut on_disk = Expression::default();
        let mut host_copies = Expression::default();
        let mut charges: Vec<Expression> = Vec::with_capacity(n_devices);
        for d in 0..n_devices {
            let device = &problem.devices[d];
            let s = x.size[d];
            let holders: Vec<usize> =
                (0..x.blocks.len()).filter(|&b| !matches!(x.copies[b][d], Copies::None)).collect();
            let mut charge = Expression::default();
            for &b in &holders {
                charge.add_mul(x.blocks[b].bytes_on(spilling[d]) as f64 / s, x.count(b, d));
            }
            let mut held = charge.clone();
            // The GPU running offloaded units holds their peak bytes, and each one's weights
            // (with its workspace) while it runs.
            let mut streamed: Vec<(u64, usize, usize)> = Vec::new();
            if problem.offload_runs_on == Some(d) {
                for h in (0..n_devices).filter(|&h| spilling[h]) {
                    for b in (0..x.blocks.len()).filter(|&b| !matches!(x.copies[b][h], Copies::None)) {
                        held.add_mul(x.blocks[b].peak as f64 / s, x.count(b, h));
                        let block = &x.blocks[b];
                        streamed.push((block.bytes - block.peak + block.transient, b, h));
                    }
                }
            }
            let largest_workspace = holders
                .iter()
                .map(|&b| x.blocks[b].transient)
                .chain(streamed.iter().map(|s| s.0))
                .max()
                .unwrap_or(0);
            if largest_workspace > 0 {
                let reserved = workspace(&mut x, d, &holders, largest_workspace);
                for &(bytes, b, h) in &streamed {
                    let present = x.presence(b, h);
                    x.rows.push((bytes as f64 / s * present - reserved.clone()).leq(0.0));
                }
                held += reserved;
            }
            let fixed_share = device.fixed_bytes as f64 / s;
            let always_counted = fixed_share <= floor;
            let used = (is_gpu[d] && !holders.is_empty() && !always_counted).then(|| x.used(d));
            let limit = capacities[d] as f64 / s;
            match used {
                Some(flag) => x.rows.push((held.clone() - limit * flag).leq(0.0)),
                None => x.rows.push(held.clone().leq(limit)),
            }
            x.held[d] = held.clone();
            if is_gpu[d] {
                match used {
                    _ if always_counted => held += fixed_share,
                    Some(flag) => held.add_mul(fixed_share, flag),
                    None => {}
                }
                if !holders.is_empty() || always_counted {
                    x.rows.push((held - max_utilisation).leq(0.0));
                }
            } else {
                for &b in &holders {
                    host_copies.add_mul(1.0, x.count(b, d));
                }
                offloaded.add_mul(s / scale, &charge);
                if device.tier == Tier::Disk {
                    on_disk.add_mul(s / scale, &charge);
                }
            }
            charges.push(charge);
        }

        // Interchangeable devices: charges non-increasing along each class.
        if !problem.ordered {
            for class in interchangeable(problem, capacities) {
                for pair in class.windows(2) {
                    x.rows.push((charges[pair[1]].clone() - charges[pair[0]].clone()).leq(0.0));
                }
            }
        }

        let base = std::mem::take(&mut x.rows);
        let mut stages = Vec::new();
        if has_variables(&offloaded) {
            stages.push(x.take(Stage::Offload, offloaded));
            if has_variables(&on_disk) {
                stages.push(x.take(Stage::Disk, on_disk));
            }
        }
        stages.push(x.take(Stage::Balance, Expression::from(max_utilisation)));

        // Load balance. A pool whose parts carry different loads is split into per-part counts.
        let mut split: Vec<Vec<Vec<Option<Variable>>>> = vec![Vec::new(); x.blocks.len()];
        let total_load: f64 = blocks.iter().map(|b| b.load * f64::from(b.copies)).sum();
        let gpus: Vec<usize> = (0..n_devices).filter(|&d| is_gpu[d]).collect();
        let mut loads = None;
        if total_load > 0.0 && !gpus.is_empty() {
            let per_gpu = total_load / gpus.len() as f64;
            // Load that cannot leave the GPUs spreads at best evenly, and a copy is indivisible.
            let gpu_only = |b: &&Block| b.allowed.iter().all(|&(d, _)| is_gpu[d]);
            let must: f64 = blocks.iter().filter(gpu_only).map(|b| b.load * f64::from(b.copies)).sum();
            let heaviest = blocks.iter().filter(gpu_only).map(|b| b.load).fold(0.0, f64::max);
            loads = Some((per_gpu, (must / total_load).max(heaviest / per_gpu)));
            let mut load = vec![Expression::default(); n_devices];
            for (p, pool_parts) in parts.iter().enumerate() {
                let varied = pool_parts.iter().any(|&b| blocks[b].load != blocks[pool_parts[0]].load);
                let free = x.copies[p].iter().any(|c| matches!(c, Copies::Free(_)));
                if !varied || !free {
                    if x.blocks[p].load > 0.0 {
                        for (d, load) in load.iter_mut().enumerate() {
                            load.add_mul(x.blocks[p].load / per_gpu, x.count(p, d));
                        }
                    }
                    continue;
                }
                let mut on_device = vec![Expression::default(); n_devices];
                for &b in pool_parts {
                    let mut placed = Expression::default();
                    let mut row = Vec::with_capacity(n_devices);
                    for d in 0..n_devices {
                        let cell = match x.copies[p][d] {
                            Copies::Free(_) => {
                                let most = x.most(p, d).min(f64::from(blocks[b].copies));
                                let v = x.vars.add(variable().integer().clamp(0.0, most));
                                placed += v;
                                on_device[d] += v;
                                load[d].add_mul(blocks[b].load / per_gpu, v);
                                Some(v)
                            }
                            Copies::None | Copies::All => None,
                        };
                        row.push(cell);
                    }
                    x.rows.push(placed.eq(f64::from(blocks[b].copies)));
                    split[p].push(row);
                }
                for (d, parts_here) in on_device.into_iter().enumerate() {
                    if matches!(x.copies[p][d], Copies::Free(_)) {
                        x.rows.push((parts_here - x.count(p, d)).eq(0.0));
                    }
                }
            }
            let max_load = x.vars.add(variable().min(0.0));
            for &d in &gpus {
                x.rows.push((load[d].clone() - max_load).leq(0.0));
            }
            stages.push(x.take(Stage::Load, Expression::from(max_load)));
        }

        // Handoffs crossing devices.
        let largest = pairs.iter().map(|&(a, _)| problem.units[a].handoff_bytes).max().unwrap_or(0).max(1);
        let handoffs = Handoffs {
            pairs: pairs
                .iter()
                .map(|&(a, b)| {
                    (block_of[a], block_of[b], problem.units[a].handoff_bytes as f64 / largest as f64)
                })
                .filter(|&(a, b, _)| a != b && x.blocks[a].copies > 0 && x.blocks[b].copies > 0)
                .collect(),
            weight: link_weights(problem),
        };
        let mut crossing = Expression::default();
        for &(block_a, block_b, bytes) in handoffs.pairs.iter().filter(|p| p.2 > 0.0) {
            let from: Vec<usize> = x.blocks[block_a].allowed.iter().map(|a| a.0).collect();
            for d in from {
                let leaves = x.vars.add(variable().clamp(0.0, 1.0));
                let here = x.presence(block_a, d) - x.presence(block_b, d);
                x.rows.push((here - leaves).leq(0.0));
                crossing.add_mul(bytes * handoffs.weight[d], leaves);
            }
        }
        if has_variables(&crossing) {
            stages.push(x.take(Stage::Crossing, crossing));
        }

        // Fewest GPUs.
        if problem.min_devices {
            let mut used_gpus = Expression::default();
            for &d in &gpus {
                if (0..x.blocks.len()).any(|b| !matches!(x.copies[b][d], Copies::None)) {
                    let known = x.used[d].is_some();
                    let flag = x.used(d);
                    if !known {
                        let limit = capacities[d] as f64 / x.size[d];
                        x.rows.push((x.held[d].clone() - limit * flag).leq(0.0));
                    }
                    used_gpus += flag;
                }
            }
            if has_variables(&used_gpus) {
                stages.push(x.take(Stage::Devices, used_gpus));
            }
        }
        let chain = if problem.ordered { chain_links(&handoffs, &x) } else { None };
        let column = x.vars.iter_variables_with_def().enumerate().map(|(i, (v, _))| (v, i)).collect();
        Formulation {
            base,
            stages,
            blocks,
            pools: x.blocks,
            parts,
            copies: x.copies,
            split,
            column,
            loads,
            is_gpu,
            shape: (problem.units.len(), n_devices),
            chain,
            handoffs,
            scale,
            host_copies,
        }
    }

    /// Whether the plan `values` leaves `cpu` and `disk` empty.
    fn nothing_on_hosts(&self, problem: &Problem, values: &[f64]) -> bool {
        let assignment = self.assignment(problem, values);
        assignment
            .counts
            .iter()
            .all(|per_device| per_device.iter().enumerate().all(|(d, &n)| n == 0 || !problem.is_host(d)))
    }

    /// Whether the chain holds every pool once: then its partitions are exactly the plans.
    fn chain_is_whole(&self) -> bool {
        let Some((pools, _)) = &self.chain else { return false };
        let mut seen = vec![0u32; self.pools.len()];
        for &pool in pools {
            seen[pool] += 1;
        }
        seen.iter().zip(&self.pools).all(|(&n, pool)| n == 1 || (n == 0 && pool.copies == 0))
    }

    /// The best partition of the chain for `goal` ([`chain::partition`]), `cpu` and `disk` each
    /// holding at most `offloaded_bytes`.
    fn partition(
        &self,
        problem: &Problem,
        capacities: &[u64],
        model: &StageModel,
        goal: Goal,
        offloaded_bytes: f64,
    ) -> Option<Partition> {
        let (pools, links) = self.chain.as_ref()?;
        let slots: Vec<Slot> = (0..self.shape.1)
            .map(|d| {
                let fixed = problem.devices[d].fixed_bytes;
                let capacity = if self.is_gpu[d] {
                    capacities[d]
                } else {
                    capacities[d].min(offloaded_bytes.max(0.0) as u64)
                };
                Slot {
                    capacity,
                    fixed,
                    size: capacities[d].saturating_add(fixed).max(1) as f64,
                    counted: self.is_gpu[d],
                    spills: spills(problem, d),
                    weight: self.handoffs.weight[d],
                }
            })
            .collect();
        let (value, slot_of) = chain::partition(links, &slots, goal)?;
        let complete = self.chain_is_whole() && slot_of.iter().all(|&d| self.is_gpu[d]);
        let mut start = vec![f64::INFINITY; model.vars.len()];
        for (&pool, &device) in pools.iter().zip(&slot_of) {
            for (d, copies) in self.copies[pool].iter().enumerate() {
                if let Copies::Free(v) = copies
                    && let Some(slot) = start.get_mut(self.column[v])
                    && slot.is_infinite()
                {
                    *slot = if d == device { 1.0 } else { 0.0 };
                }
            }
        }
        Some(Partition { value, start, complete })
    }

    /// Copies of each pool on each device in `values` (one value per variable, in order of
    /// creation).
    fn pool_counts(&self, values: &[f64]) -> Vec<Vec<u32>> {
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
    fn block_counts(&self, values: &[f64]) -> Vec<Vec<u32>> {
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

    /// `values` extended to `model`'s variables: the columns it adds are unknown to HiGHS
    /// (infinity, which HiGHS completes with the others fixed), except the split of pools,
    /// which [`Formulation::split_by_load`] fills.
    fn start(&self, model: &StageModel, values: &[f64]) -> Vec<f64> {
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

    /// Re-splits the pools with loads in `counts` (each pool's count per device as `values`
    /// has it): the heaviest parts first, copy by copy, each to the GPU of least load so far
    /// with room left in the pool (a device other than a GPU carries no load and is taken
    /// first). Within one copy's load of even, so the load stage often has nothing to do.
    fn split_by_load(&self, values: &[f64], counts: &mut [Vec<u32>]) {
        let pools = self.pool_counts(values);
        let is_split = |b: usize| {
            self.parts.iter().zip(&self.split).any(|(parts, s)| !s.is_empty() && parts.contains(&b))
        };
        let mut load = vec![0.0; self.shape.1];
        for (b, block) in self.blocks.iter().enumerate().filter(|&(b, _)| !is_split(b)) {
            for (d, &count) in counts[b].iter().enumerate() {
                load[d] += block.load * f64::from(count);
            }
        }
        for (p, parts) in self.parts.iter().enumerate().filter(|(p, _)| !self.split[*p].is_empty()) {
            let mut room = pools[p].clone();
            let mut heaviest_first = parts.clone();
            heaviest_first.sort_by(|&a, &b| self.blocks[b].load.total_cmp(&self.blocks[a].load));
            for b in heaviest_first {
                let block = &self.blocks[b];
                counts[b] = vec![0; self.shape.1];
                for _ in 0..block.copies {
                    let lightest = (0..self.shape.1).filter(|&d| room[d] > 0).min_by(|&a, &c| {
                        let weight = |d: usize| if self.is_gpu[d] { load[d] } else { f64::NEG_INFINITY };
                        weight(a).total_cmp(&weight(c))
                    });
                    let Some(d) = lightest else { break };
                    room[d] -= 1;
                    counts[b][d] += 1;
                    load[d] += block.load;
                }
            }
        }
    }

    /// The load stage's objective for block counts `counts`.
    fn load_value(&self, counts: &[Vec<u32>]) -> f64 {
        let Some((per_gpu, _)) = self.loads else { return 0.0 };
        (0..self.shape.1)
            .filter(|&d| self.is_gpu[d])
            .map(|d| {
                self.blocks.iter().zip(counts).map(|(b, c)| b.load * f64::from(c[d])).sum::<f64>() / per_gpu
            })
            .fold(0.0, f64::max)
    }

    /// The plan in `values`.
    fn assignment(&self, problem: &Problem, values: &[f64]) -> Assignment {
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

    /// The crossing stage's objective for the plan in `values`.
    fn crossing_cost(&self, values: &[f64]) -> f64 {
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
    fn crossing_floor(&self, problem: &Problem, capacities: &[u64], balance: f64) -> f64 {
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
                    Tier::Gpu(_) => {
                        let size = capacities[d].saturating_add(device.fixed_bytes) as f64;
                        (balance * size - device.fixed_bytes as f64).clamp(0.0, capacity)
                    }
                    Tier::Cpu | Tier::Disk => capacity,
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

/// Devices that can be exchanged without changing any plan's feasibility or value: same class,
/// tier kind, capacity, fixed bytes and link, and named by no pin. Each class in problem order.
fn interchangeable(problem: &Problem, capacities: &[u64]) -> Vec<Vec<usize>> {
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

/// Pools of blocks that no constraint tells apart: the same bytes, workspace and devices, and
/// no unit with a neighbour in order. Any counts of a pool per device split into counts of its
/// parts ([`apportion`]) that every row but the load's accepts, so the stages before the load
/// count pools, not blocks: DeepSeek-V3's 58 expert layers become one integer per GPU. Returns
/// the pools (as blocks: summed copies, the parts' mean load), their parts, and each block's
/// pool.
fn pools(
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
fn apportion(totals: &[u32], copies: &[u32]) -> Vec<Vec<u32>> {
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

/// A lower bound on the largest GPU utilisation of any plan, from bytes alone: the bytes that
/// cannot leave the GPUs (all of them without offload devices; otherwise those of GPU-only
/// blocks, or what the offload devices cannot take, whichever is more) must fit under
/// `Σ_d max(0, U·S_d − fixed_d)` over the GPUs. A GPU whose fixed bytes alone stay under this
/// bound may count them as if it were always used: that adds `U ≥ fixed_d / S_d`, which every
/// plan meets, and keeps the relaxation from paying a fraction of the fixed bytes.
fn utilisation_floor(problem: &Problem, capacities: &[u64], blocks: &[Block]) -> f64 {
    let offload: Vec<usize> =
        (0..problem.devices.len()).filter(|&d| !matches!(problem.devices[d].tier, Tier::Gpu(_))).collect();
    let total = |stays: &dyn Fn(&Block) -> bool| -> f64 {
        blocks.iter().filter(|b| stays(b)).map(|b| b.bytes as f64 * f64::from(b.copies)).sum()
    };
    let everything = total(&|_| true);
    let on_gpus = if offload.is_empty() {
        everything
    } else {
        let gpu_only = total(&|b| b.allowed.iter().all(|(d, _)| !offload.contains(d)));
        let offload_room: f64 = offload.iter().map(|&d| capacities[d] as f64).sum();
        gpu_only.max(everything - offload_room)
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

/// The chain of an ordered problem for [`chain::partition`]: the pool at each position, and
/// the positions. `None` where the consecutive pairs do not form one chain or a pool in it has
/// several copies (it could sit on several devices at once).
fn chain_links(handoffs: &Handoffs, x: &Builder) -> Option<(Vec<usize>, Vec<Link>)> {
    let first = handoffs.pairs.first()?;
    let mut pools = vec![first.0];
    for (k, &(a, b, _)) in handoffs.pairs.iter().enumerate() {
        if pools[k] != a {
            return None;
        }
        pools.push(b);
    }
    let mut seen = vec![false; x.blocks.len()];
    let mut links = Vec::with_capacity(pools.len());
    for (k, &p) in pools.iter().enumerate() {
        let pool = &x.blocks[p];
        if pool.copies != 1 {
            return None;
        }
        let mut allowed = vec![false; x.size.len()];
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

/// Whether device `d` is a host that leaves its units' peak bytes to the GPU running them.
fn spills(problem: &Problem, d: usize) -> bool {
    problem.offload_runs_on.is_some() && problem.is_host(d)
}

/// Whether two tiers are of one kind (two GPUs with different indices are).
fn same_kind(a: Tier, b: Tier) -> bool {
    std::mem::discriminant(&a) == std::mem::discriminant(&b)
}

/// Whether an expression involves any variable (a stage over constants is skipped).
fn has_variables(expression: &Expression) -> bool {
    expression.linear_coefficients().into_iter().any(|(_, c)| c != 0.0)
}

/// How one stage's MIP ended.
enum Run {
    Found {
        values: Vec<f64>,
        objective: f64,
        bound: f64,
        optimal: bool,
    },
    Infeasible,
    /// Time limit (or a solver error) before any plan.
    Stopped,
}

/// HiGHS model status codes (`kHighsModelStatus…` in its C API).
const HIGHS_OPTIMAL: i32 = 7;
const HIGHS_INFEASIBLE: i32 = 8;
const HIGHS_UNBOUNDED_OR_INFEASIBLE: i32 = 9;
/// HiGHS's `kSolutionStatusFeasible`: the solver holds a feasible plan.
const HIGHS_SOLUTION_FEASIBLE: i64 = 2;

/// Whether a HiGHS model status is the one with C API code `code` (the status type comes from
/// the `highs` crate, which this crate reaches only through good_lp).
fn status_is<S: PartialEq + TryFrom<i32>>(status: S, code: i32) -> bool {
    S::try_from(code).is_ok_and(|expected| expected == status)
}

fn run_stage(
    model: &StageModel,
    rows: impl Iterator<Item = Constraint>,
    start: Option<&[f64]>,
    relative_gap: f64,
    time_limit_s: Option<f64>,
) -> Run {
    let mut problem = model.vars.clone().minimise(model.objective.clone()).using(good_lp::highs);
    for row in rows {
        problem.add_constraint(row);
    }
    let Ok(mut highs) = problem.try_into_inner() else { return Run::Stopped };
    // Options HiGHS rejects (none of these should be) leave its defaults in place.
    let _ = highs.try_set_option("output_flag", false);
    let _ = highs.try_set_option("threads", 1);
    let _ = highs.try_set_option("parallel", "off");
    let _ = highs.try_set_option("random_seed", 0);
    let _ = highs.try_set_option("mip_rel_gap", relative_gap);
    // The feasibility-jump heuristic and presolve's enumeration of small rows cost more than
    // they give on these models (half of the work on the Llama-2-70B bench, a third on
    // DeepSeek-V3): placement rows are long, and the root LP with probing finds plans itself.
    let _ = highs.try_set_option("mip_heuristic_run_feasibility_jump", false);
    let _ = highs.try_set_option("presolve_rule_off", 1 << 16);
    if let Some(limit) = time_limit_s.filter(|l| l.is_finite()) {
        let _ = highs.try_set_option("time_limit", limit.max(0.0));
    }
    if let Some(values) = start {
        let _ = highs.try_set_solution(Some(values), None, None, None);
    }
    let Ok(solved) = highs.try_solve() else { return Run::Stopped };
    let status = solved.status();
    let feasible = solved.int_info_value(c"primal_solution_status") == Ok(HIGHS_SOLUTION_FEASIBLE);
    if feasible {
        return Run::Found {
            values: solved.get_solution().columns().to_vec(),
            objective: solved.objective_value(),
            bound: solved.double_info_value(c"mip_dual_bound").unwrap_or(0.0),
            optimal: status_is(status, HIGHS_OPTIMAL),
        };
    }
    if status_is(status, HIGHS_INFEASIBLE) || status_is(status, HIGHS_UNBOUNDED_OR_INFEASIBLE) {
        Run::Infeasible
    } else {
        Run::Stopped
    }
}

fn solve_stages(problem: &Problem, capacities: &[u64], options: &SolveOptions, started: Instant) -> Staged {
    let infeasible = Staged { status: Status::Infeasible, assignment: None, bound: f64::NAN };
    if problem.devices.is_empty() && problem.units.iter().any(|u| u.count > 0) {
        return infeasible;
    }
    let Some((blocks, block_of)) = blocks(problem, capacities) else { return infeasible };
    let formulation = Formulation::new(problem, capacities, blocks, &block_of);
    let relative_gap = options.relative_gap.max(0.0);
    let time_limit = options.time_limit_s.filter(|l| !l.is_nan());
    let mut fixes: Vec<Constraint> = Vec::new();
    let mut incumbent: Option<Vec<f64>> = None;
    let mut bound = 0.0;
    let mut status = Status::Optimal;
    let mut offloaded: f64 = 0.0;
    let mut balance = f64::INFINITY;
    for (i, model) in formulation.stages.iter().enumerate() {
        if model.stage == Stage::Disk && offloaded <= 1e-9 {
            continue;
        }
        let mut start = incumbent.as_deref().map(|values| formulation.start(model, values));
        // The chain's best partition: a bound no plan beats, and a plan to start from.
        let offloaded_bytes = (offloaded + 1e-6 * offloaded.max(1.0)) * formulation.scale;
        let partition = match model.stage {
            // Whether everything fits on the GPUs, when the chain is the whole problem.
            Stage::Offload => formulation.partition(problem, capacities, model, Goal::Balance, 0.0),
            Stage::Balance => {
                formulation.partition(problem, capacities, model, Goal::Balance, offloaded_bytes)
            }
            Stage::Crossing => formulation.partition(
                problem,
                capacities,
                model,
                Goal::Crossing { limit: balance },
                offloaded_bytes,
            ),
            _ => None,
        };
        // Without `cpu` and `disk`, a whole chain with no partition has no plan at all.
        if model.stage == Stage::Balance
            && partition.is_none()
            && formulation.chain_is_whole()
            && formulation.is_gpu.iter().all(|&gpu| gpu)
        {
            return infeasible;
        }
        if let Some(chain) = partition.as_ref().filter(|p| p.complete) {
            let value = if model.stage == Stage::Offload { 0.0 } else { chain.value };
            if model.stage == Stage::Offload {
                // Everything fits on the GPUs: nothing goes to `cpu` or `disk`, however small.
                fixes.push(formulation.host_copies.clone().leq(0.0));
            }
            if model.stage == Stage::Balance {
                bound = value;
                balance = value + 1e-6 * value.abs().max(1.0);
            }
            fixes.push(model.objective.clone().leq(value + 1e-6 * value.abs().max(1.0)));
            incumbent = Some(chain.start.clone());
            continue;
        }
        if let (Stage::Crossing, Some(values)) = (model.stage, &incumbent) {
            let cost = formulation.crossing_cost(values);
            let floor = formulation.crossing_floor(problem, capacities, balance);
            let floor = partition.as_ref().map_or(floor, |chain| floor.max(chain.value));
            if cost <= floor * (1.0 + 1e-9) {
                fixes.push(model.objective.clone().leq(cost + 1e-6 * cost.max(1.0)));
                continue;
            }
        }
        if let Some(chain) = partition.filter(|_| model.stage != Stage::Offload) {
            fixes.push(model.objective.clone().geq(chain.value * (1.0 - 1e-9)));
            start = Some(chain.start);
        }
        let remaining = time_limit.map(|limit| limit - started.elapsed().as_secs_f64());
        if remaining.is_some_and(|r| r <= 0.0) {
            status = Status::TimeLimit;
            break;
        }
        let rows = formulation
            .base
            .iter()
            .chain(formulation.stages[..=i].iter().flat_map(|m| &m.rows))
            .chain(&fixes);
        if let (Stage::Load, Some(start), Some((_, floor))) = (model.stage, &start, formulation.loads) {
            // The split start is often within the gap of what no plan can beat.
            let value = formulation.load_value(&formulation.block_counts(start));
            if value <= floor * (1.0 + relative_gap) {
                fixes.push(model.objective.clone().leq(value + 1e-6 * value.max(1.0)));
                incumbent = Some(start.clone());
                continue;
            }
        }
        match run_stage(model, rows.cloned(), start.as_deref(), relative_gap, remaining) {
            Run::Found { values, objective, bound: stage_bound, optimal } => {
                if model.stage == Stage::Offload {
                    offloaded = objective;
                    if formulation.nothing_on_hosts(problem, &values) {
                        fixes.push(formulation.host_copies.clone().leq(0.0));
                    }
                }
                if model.stage == Stage::Balance {
                    bound = stage_bound.max(0.0);
                    balance = objective + 1e-6 * objective.abs().max(1.0);
                }
                fixes.push(model.objective.clone().leq(objective + 1e-6 * objective.abs().max(1.0)));
                incumbent = Some(values);
                if !optimal {
                    status = Status::TimeLimit;
                    break;
                }
            }
            Run::Infeasible if incumbent.is_none() => return infeasible,
            Run::Infeasible | Run::Stopped => {
                status = Status::TimeLimit;
                break;
            }
        }
    }
    let assignment = incumbent.map(|values| formulation.assignment(problem, &values));
    Staged { status, assignment, bound }
}
