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
//!   row comparing device indices. Each prefix sum is a continuous variable `P[b][d] =
//!   P[b][d − 1] + v[b][d]`, so the rows hold a few terms each: written out, the sums made
//!   `O(units × devices²)` terms (6.6 GB for GPT-2 over a profile of 4,096 GPUs). A unit of
//!   several copies gets continuous `first`/`last` positions from its `y` and the pair needs
//!   `last_a ≤ first_b`.
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
//! - loads: the load that cannot leave the GPUs spreads at best evenly, no copy is split, of
//!   the `tG + 1` heaviest copies some GPU holds `t + 1`, and with the utilisation held a GPU
//!   may have to hold many copies, light ones with the heavy (`loads.rs`). The plan in hand
//!   has its pools with loads re-split by longest processing time first, then improved by
//!   pairwise exchanges between the most loaded GPU and the others: 58 layers × 8 load
//!   classes of DeepSeek-V3's experts, and Mixtral-8x22B's skewed measured loads over 16
//!   GPUs, need no MIP for the loads;
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
//! Where some of a whole chain must go to `cpu` and `disk`, every plan splits the chain at one
//! position between the GPUs and the hosts, and with the split fixed what the hosts leave to
//! the GPU that runs them is known: `split.rs` scans the splits, one partition each, and
//! answers the offload, disk, balance, crossing and fewest-GPU stages exactly (the same values
//! as HiGHS's to 10⁻⁸ on the offload cases checked, in milliseconds where HiGHS took seconds).
//! The fewest GPUs of a whole chain are a partition too, crossings first, then GPUs used
//! ([`crate::chain`]'s `Fewest` goal), where binaries per GPU left HiGHS without a proof
//! after minutes over 24 GPUs. The GPU that runs offloaded units must hold one itself: its
//! slot in the partition is required to hold a range, so every split's partition is a plan
//! (DeepSeek-V3 over 32 A100-40GB: 11.8 s of MIPs before, 27 ms now, the same values). A split
//! is only scanned where it can have a partition: every position before it fits some GPU alone,
//! and every one after it may go to a host (a 2 TB embedding before a GPU-only head leaves
//! none, where 1,028 partitions over 4,096 GPUs took a minute to find none).
//!
//! Once a stage has held the hosts empty (the offload stage proved nothing needs them), the
//! later stages' partitions give the hosts nothing either, so that their plans are plans of
//! the model (a host given the held value's slack, a millionth of a 4 TiB disk, took units of
//! a few megabytes and left HiGHS a model of 1,026 units over 4,096 GPUs to solve). Where every
//! stage is such a partition on the GPUs, `whole_chain.rs` answers without building the model
//! at all: the same stages, values, gaps and plan, in memory of the chain times the devices
//! (bytes each), not `units × devices` variables and rows.
//!
//! # Fills and packing
//!
//! Beside a chain that is not the whole problem (llama.cpp's expert tensors), or with no chain
//! (expert parallelism), `fill.rs` makes a plan on the GPUs alone: the better of two fills
//! (the chain's partition, then the rest largest first on the least-used GPU; or the rest
//! first, then the chain's partition around it), each improved by moving a copy off the most
//! used GPU or trading it for a smaller one. A fill proves the offload stage (nothing needs
//! offloading), and the balance stage needs no MIP when the fill is within the gap of a floor:
//! the bytes' floor, or where whole copies cannot be split that evenly, `packing.rs`'s: the
//! largest utilisation at which every copy, whole, still fits the GPUs' rooms, found by a
//! reachability over copy counts (Mixtral-8x7B's 32 expert tensors on 12 T4s: 4 % above the
//! bytes' floor, proven optimal to 10⁻⁴). Where the MIP still runs, the floor is its cut.
//!
//! # Gaps
//!
//! Every stage reports what it proved ([`StageGap`]): its plan's value, a bound no plan with the
//! earlier values held beats (HiGHS's dual bound, a partition, or a floor known without HiGHS),
//! and the gap between them. [`Status::Optimal`] means every stage is within
//! [`SolveOptions::relative_gap`] (1 % by default); a plan with a stage above it is
//! [`Status::Feasible`]; stages the time limit never reached are `not_run`, gap 1.
//!
//! good_lp hands HiGHS an objective without its constant (the copies of a pool pinned to one
//! device), so the objective HiGHS reports is corrected by it before a stage's value is held:
//! otherwise the row that holds it would exclude every plan, and the next stage would stop
//! with no plan (a unit pinned to the CPU once left every later stage unrun).
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
//! the problem is solved again (three rounds at most, within the same time limit). Should the
//! rounds run out, or a problem with shrunk capacities have no plan (which proves nothing of
//! the problem as given), the solve reports [`Status::GaveUp`]: no plan, nothing proven.
//!
//! # Layout
//!
//! This file holds the public face ([`solve`], its options and answer) and the repair rounds;
//! `blocks.rs` makes blocks and pools and the early infeasibility checks; `formulation.rs`
//! the model, built in steps whose rows are in `rows.rs` (every stage) and `objectives.rs`
//! (load, crossings, fewest GPUs); `bounds.rs` the bounds and starts known without HiGHS;
//! `fill.rs` plans on the GPUs alone without HiGHS; `packing.rs` the floor of whole copies;
//! `loads.rs` the load stage's floor and plan without HiGHS;
//! `split.rs` the whole chain split between GPUs and hosts; `whole_chain.rs` the stages of a
//! whole chain on the GPUs answered by partitions alone, before any model is built;
//! `stages.rs` runs the lexicographic sequence, each MIP through `highs.rs`; `readback.rs`
//! reads HiGHS's values back as a plan.

mod blocks;
mod bounds;
mod fill;
mod formulation;
mod highs;
mod loads;
mod objectives;
mod packing;
mod readback;
mod rows;
mod split;
mod stages;
mod whole_chain;

use std::time::Instant;

use serde::Serialize;

use crate::problem::{Assignment, Problem};
use vramplan_sim::placement::Target;

/// How long and how closely to solve.
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Wall-clock limit for all stages together, in seconds; `None` for none.
    pub time_limit_s: Option<f64>,
    /// A stage stops once its plan is proven within this fraction of the best possible (HiGHS's
    /// `mip_rel_gap`), and the solve is [`Status::Optimal`] only when every stage is. The
    /// default, [`DEFAULT_RELATIVE_GAP`], is a percent of the worst device's utilisation:
    /// below what a memory estimate can promise, and loose enough that a proof of the last
    /// fraction of a copy never keeps a large instance busy.
    pub relative_gap: f64,
}

/// The default tolerance of every stage: 1 %.
pub const DEFAULT_RELATIVE_GAP: f64 = 0.01;

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { time_limit_s: None, relative_gap: DEFAULT_RELATIVE_GAP }
    }
}

/// The lexicographic stages, in order (module documentation, "Objectives").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Bytes on `cpu` and `disk`.
    Offload,
    /// Bytes on `disk`.
    Disk,
    /// The largest GPU utilisation.
    Balance,
    /// The largest GPU load, over the mean load per GPU.
    Load,
    /// Handoffs crossing devices, weighted by link, over the largest handoff.
    Crossing,
    /// GPUs used.
    #[serde(rename = "fewest_gpus")]
    Devices,
}

/// How one stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Its plan is proven within the relative gap of the best possible.
    Optimal,
    /// The time limit cut it short: its plan is the best found, its gap says how good.
    TimeLimit,
    /// The time limit came before it: the plan is not chosen for this objective at all.
    NotRun,
}

/// The proof one stage gives for its objective: the plan's value, a bound no plan (with the
/// earlier stages' values held) beats, and the gap between them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageGap {
    /// Which objective.
    pub stage: Stage,
    /// How it ended.
    pub status: StageStatus,
    /// The plan's value, in the stage's unit (bytes for offload and disk; a share for
    /// balance; the largest load over the mean for load; GPUs for fewest GPUs); NaN when not
    /// known.
    pub objective: f64,
    /// The proven bound, same unit; NaN when nothing is proven.
    pub bound: f64,
    /// `(objective − bound) / objective`, 0 when the objective is 0; 1 when nothing is proven.
    pub gap: f64,
}

impl StageGap {
    /// A stage with value `objective` and bound `bound`.
    pub(crate) fn proven(stage: Stage, status: StageStatus, objective: f64, bound: f64) -> StageGap {
        let gap = if !objective.is_finite() || !bound.is_finite() {
            1.0
        } else if objective.abs() <= 1e-12 {
            0.0
        } else {
            ((objective - bound) / objective.abs()).clamp(0.0, 1.0)
        };
        StageGap { stage, status, objective, bound: bound.min(objective), gap }
    }
}

/// How the solve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every stage finished within the relative gap ([`Solution::stages`]).
    Optimal,
    /// The time limit cut a stage short; the plan is the best found, `gap` says how good.
    TimeLimit,
    /// No plan satisfies the constraints: proven, by HiGHS or by the checks before it.
    Infeasible,
    /// No plan was found and none was proven impossible, before the time limit: HiGHS's plans
    /// stayed over a limit by its tolerance through every repair round, or a repair left a
    /// problem with no plan (see [`solve`]). Like `TimeLimit` without a plan, it proves nothing.
    GaveUp,
    /// Every stage ran to its end, but some stage's proven gap is above the relative gap.
    Feasible,
}

/// The answer to a [`Problem`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Solution {
    /// How the solve ended.
    pub status: Status,
    /// The plan; `None` when infeasible or when the time ran out before any plan was found.
    pub assignment: Option<Assignment>,
    /// The largest GPU utilisation ([`Problem::utilisation`]) of the plan; NaN without a plan.
    pub objective: f64,
    /// A proven lower bound on that utilisation among plans with the least offload; 0 when
    /// the balance stage was not reached, NaN when infeasible or given up.
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
    /// Each stage of the sequence that the problem has, in order, with the gap it proved.
    pub stages: Vec<StageGap>,
}

/// Solves `problem` under `options`. Never panics on odd input: unknown indices in pins or
/// groups, or contradictory pins, make the problem infeasible. A HiGHS failure other than
/// infeasibility reads as `TimeLimit` with the best plan found before it, if any; a plan still
/// over a limit after the repairs described in the module documentation reads as `GaveUp`, and
/// so does infeasibility found only once a repair has shrunk the capacities.
pub fn solve(problem: &Problem, options: &SolveOptions) -> Solution {
    const REPAIR_ROUNDS: usize = 3;
    let started = Instant::now();
    let mut capacities: Vec<u64> = problem.devices.iter().map(|d| d.capacity_bytes).collect();
    for round in 0..=REPAIR_ROUNDS {
        let mut staged = stages::solve_stages(problem, &capacities, options, started);
        // Infeasible once capacities shrank: a proof about the repaired problem, not this one.
        if round > 0 && staged.status == Status::Infeasible {
            staged.status = Status::GaveUp;
        }
        let Some(assignment) = &staged.assignment else {
            return report(problem, staged, options, started);
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
            return report(problem, staged, options, started);
        }
    }
    let gave_up = Staged { status: Status::GaveUp, assignment: None, bound: f64::NAN, stages: Vec::new() };
    report(problem, gave_up, options, started)
}

/// What the stages found, before the figures of the plan are worked out.
struct Staged {
    status: Status,
    assignment: Option<Assignment>,
    bound: f64,
    stages: Vec<StageGap>,
}

fn report(problem: &Problem, staged: Staged, options: &SolveOptions, started: Instant) -> Solution {
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
            stages: staged.stages,
        };
    };
    let mut objective: f64 = 0.0;
    let mut offloaded_bytes = 0;
    let mut gpus_used = 0;
    for (d, device) in problem.devices.iter().enumerate() {
        match device.tier {
            Target::Gpu(_) => {
                objective = objective.max(problem.utilisation(&assignment, d));
                gpus_used += u32::from(problem.device_bytes(&assignment, d) > 0);
            }
            Target::Cpu | Target::Disk => {
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
    // "Optimal" is a promise about every stage: within the tolerance (HiGHS stops at a gap a
    // hair over its own, hence the allowance of 10⁻⁹).
    let tolerance = options.relative_gap.max(0.0) + 1e-9;
    let status = match staged.status {
        Status::Optimal if staged.stages.iter().any(|s| s.gap > tolerance) => Status::Feasible,
        status => status,
    };
    Solution {
        status,
        assignment: Some(assignment),
        objective,
        bound,
        gap,
        seconds,
        offloaded_bytes,
        crossing_bytes,
        gpus_used,
        stages: staged.stages,
    }
}

/// Consecutive units in forward order: those with a position, sorted by `(order, index)`.
fn ordered_pairs(problem: &Problem) -> Vec<(usize, usize)> {
    let mut ordered: Vec<(u32, usize)> =
        problem.units.iter().enumerate().filter_map(|(u, unit)| Some((unit.order?, u))).collect();
    ordered.sort_unstable();
    ordered.windows(2).map(|w| (w[0].1, w[1].1)).collect()
}
