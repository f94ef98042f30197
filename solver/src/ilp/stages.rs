//! The lexicographic sequence: each stage in turn, skipped when its objective is constant or
//! a bound known without HiGHS already holds, each one's value held by a row for the next
//! (module documentation, "Objectives" and "Chains").

use std::time::Instant;

use good_lp::Constraint;

use super::blocks::blocks;
use super::bounds::{Partition, utilisation_floor};
use super::formulation::Formulation;
use super::highs::{Run, run_stage};
use super::split::{Held, held};
use super::whole_chain;
use super::{SolveOptions, Stage, StageGap, StageStatus, Staged, Status};
use crate::chain::Goal;
use crate::problem::Problem;

/// Runs the stages of `problem` with device capacities `capacities` in order, holding each
/// one's value for the next, until all are done or the time left after `started` runs out.
pub(super) fn solve_stages(
    problem: &Problem,
    capacities: &[u64],
    options: &SolveOptions,
    started: Instant,
) -> Staged {
    let infeasible =
        Staged { status: Status::Infeasible, assignment: None, bound: f64::NAN, stages: Vec::new() };
    if problem.devices.is_empty() && problem.units.iter().any(|u| u.count > 0) {
        return infeasible;
    }
    let Some((blocks, block_of)) = blocks(problem, capacities) else { return infeasible };
    // A whole chain on the GPUs needs no model: its partitions answer every stage.
    if let Some(staged) = whole_chain::solve(problem, capacities, &blocks, &block_of) {
        return staged;
    }
    let formulation = Formulation::new(problem, capacities, blocks, &block_of);
    let relative_gap = options.relative_gap.max(0.0);
    let time_limit = options.time_limit_s.filter(|l| !l.is_nan());
    let mut fixes: Vec<Constraint> = Vec::new();
    let mut incumbent: Option<Vec<f64>> = None;
    let mut bound = 0.0;
    let mut status = Status::Optimal;
    let mut offloaded: f64 = 0.0;
    let mut balance = f64::INFINITY;
    let (mut on_disk, mut crossing) = (f64::INFINITY, f64::INFINITY);
    // Whether the whole chain is split between GPUs and hosts ([`Formulation::split_partition`]).
    let mut split = false;
    // Whether a held row keeps every copy off `cpu` and `disk`.
    let mut hosts_empty = false;
    let mut gaps: Vec<StageGap> = Vec::with_capacity(formulation.stages.len());
    // A stage's value and bound in its own unit: whole bytes for offload and disk (HiGHS's
    // tolerance leaves a millionth of a byte where nothing is offloaded, not a gap).
    let gap = |stage: Stage, status: StageStatus, value: f64, floor: f64| {
        let (value, floor) = match stage {
            Stage::Offload | Stage::Disk => {
                ((value * formulation.scale).round().max(0.0), (floor * formulation.scale).floor().max(0.0))
            }
            _ => (value, floor),
        };
        StageGap::proven(stage, status, value, floor)
    };
    let proven = |stage: Stage, value: f64, floor: f64| gap(stage, StageStatus::Optimal, value, floor);
    for (i, model) in formulation.stages.iter().enumerate() {
        if model.stage == Stage::Disk && offloaded <= 1e-9 {
            gaps.push(proven(Stage::Disk, 0.0, 0.0));
            continue;
        }
        let mut start = incumbent.as_deref().map(|values| formulation.start(model, values));
        // The chain's best partition: a bound no plan beats, and a plan to start from.
        // Once a stage has held the hosts empty (`host_copies ≤ 0`), the partitions leave them
        // empty too: their plans are then plans of the model, not only bounds.
        let offloaded_bytes = if hosts_empty { 0.0 } else { held(offloaded) * formulation.scale };
        let values_held = Held { offloaded, on_disk, balance, crossing };
        let partition = match model.stage {
            _ if split => formulation.split_partition(problem, capacities, model, model.stage, &values_held),
            // Whether everything fits on the GPUs, when the chain is the whole problem; if not,
            // how much must leave them.
            Stage::Offload => {
                let on_gpus = formulation.partition(problem, capacities, model, Goal::Balance, 0.0);
                if on_gpus.as_ref().is_some_and(|p| p.complete) {
                    on_gpus
                } else {
                    let split_chain =
                        formulation.split_partition(problem, capacities, model, model.stage, &values_held);
                    split = split_chain.is_some();
                    // A fill of the GPUs alone is a plan that offloads nothing.
                    let filled = || {
                        let start = formulation.filled_start(problem, capacities, model)?;
                        Some(Partition { value: 0.0, start, complete: true })
                    };
                    split_chain.or_else(filled).or(on_gpus)
                }
            }
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
            // Crossings first, then GPUs: exact where the chain is the whole problem, and no
            // bound otherwise (the chain's least crossing may be below the problem's).
            Stage::Devices if formulation.chain_is_whole() => formulation
                .partition(problem, capacities, model, Goal::Fewest { limit: balance }, offloaded_bytes)
                .filter(|p| p.complete),
            _ => None,
        };
        // A whole chain with no partition has no plan at all: without `cpu` and `disk`, at the
        // balance stage; with them after the GPUs, at the offload stage, where every split
        // between GPUs and hosts was tried (`split.rs`: the longest run on `cpu` leaves the
        // least to `disk`).
        let no_plan = match model.stage {
            Stage::Balance => formulation.chain_is_whole() && formulation.is_gpu.iter().all(|&gpu| gpu),
            Stage::Offload => formulation.splits_whole_chain(),
            _ => false,
        };
        if partition.is_none() && no_plan {
            return infeasible;
        }
        if let Some(chain) = partition.as_ref().filter(|p| p.complete) {
            let value = if model.stage == Stage::Offload && !split { 0.0 } else { chain.value };
            match model.stage {
                // Everything fits on the GPUs: nothing goes to `cpu` or `disk`, however small.
                Stage::Offload if !split => {
                    fixes.push(formulation.host_copies.clone().leq(0.0));
                    hosts_empty = true;
                }
                Stage::Offload => offloaded = value,
                Stage::Disk => on_disk = value,
                Stage::Balance => {
                    bound = value;
                    balance = held(value);
                }
                Stage::Crossing => crossing = value,
                Stage::Load | Stage::Devices => {}
            }
            fixes.push(model.objective.clone().leq(held(value)));
            incumbent = Some(chain.start.clone());
            gaps.push(proven(model.stage, value, value));
            continue;
        }
        if let (Stage::Crossing, Some(values)) = (model.stage, &incumbent) {
            let cost = formulation.crossing_cost(values);
            let floor = formulation.crossing_floor(problem, capacities, balance);
            let floor = partition.as_ref().map_or(floor, |chain| floor.max(chain.value));
            if cost <= floor * (1.0 + 1e-9) {
                fixes.push(model.objective.clone().leq(held(cost)));
                gaps.push(proven(Stage::Crossing, cost, floor.min(cost)));
                continue;
            }
        }
        // A bound and a start, but not for fewest GPUs: the chain's least crossing may be
        // below the problem's, and its count with it.
        let partition_value = partition.as_ref().map(|p| p.value);
        if let Some(chain) = partition.filter(|_| !matches!(model.stage, Stage::Offload | Stage::Devices)) {
            fixes.push(model.objective.clone().geq(chain.value * (1.0 - 1e-9)));
            start = Some(chain.start);
        }
        // A plan without HiGHS, often within the gap of what no plan beats: where nothing is
        // offloaded, a fill of the GPUs alone (beside a chain that is not the whole problem, or
        // with none); where some bytes are, the offload stage's own plan (the GPUs are full).
        let nothing_offloaded = offloaded <= 1e-9;
        if model.stage == Stage::Balance
            && !split
            && let Some(values) = if nothing_offloaded {
                formulation.filled_start(problem, capacities, model)
            } else {
                incumbent.clone()
            }
        {
            let value = formulation.largest_utilisation(problem, &values);
            let floor = if nothing_offloaded {
                formulation.floor_on_gpus
            } else {
                utilisation_floor(problem, capacities, &formulation.pools, Some(offloaded_bytes))
            };
            let floor = partition_value.map_or(floor, |v| v.max(floor));
            // Whole copies pack less evenly than bytes: a floor of its own where it is needed.
            let packed = (nothing_offloaded && value > floor * (1.0 + relative_gap))
                .then(|| formulation.packing_floor(problem, capacities, value, relative_gap))
                .flatten();
            let floor = packed.map_or(floor, |packed| packed.max(floor));
            if value <= floor * (1.0 + relative_gap) {
                bound = floor.min(value);
                balance = held(value);
                fixes.push(model.objective.clone().leq(balance));
                incumbent = Some(values);
                gaps.push(proven(Stage::Balance, value, floor.min(value)));
                continue;
            }
            // The floor as a cut: HiGHS's relaxation spreads copies as bytes, below it.
            fixes.push(model.objective.clone().geq(floor * (1.0 - 1e-9)));
            if nothing_offloaded {
                start = Some(values);
            }
        }
        // The load stage's start (longest processing time first, then exchanges) is often
        // within the gap of the floor from the loads themselves (`loads.rs`); otherwise the
        // floor is HiGHS's cut.
        if model.stage == Stage::Load {
            start = start.map(|values| formulation.load_start(problem, capacities, values, balance));
        }
        // The load stage's own plan and floor, should HiGHS stop without a better one.
        let mut load_plan: Option<(Vec<f64>, f64, f64)> = None;
        if let (Stage::Load, Some(start), Some(_)) = (model.stage, &start, formulation.loads) {
            let value = formulation.load_value(&formulation.block_counts(start));
            let floor = formulation.load_floor(problem, capacities, balance, Some(value), relative_gap);
            if value <= floor * (1.0 + relative_gap) {
                fixes.push(model.objective.clone().leq(held(value)));
                incumbent = Some(start.clone());
                gaps.push(proven(Stage::Load, value, floor.min(value)));
                continue;
            }
            fixes.push(model.objective.clone().geq(floor * (1.0 - 1e-9)));
            load_plan = Some((start.clone(), value, floor));
        }
        // Cut short at the load stage: its plan keeps every earlier stage's value, and its gap
        // to the floor is what is proven.
        let mut stop_at_load = |incumbent: &mut Option<Vec<f64>>, gaps: &mut Vec<StageGap>| {
            if let Some((values, value, floor)) = load_plan.take() {
                *incumbent = Some(values);
                gaps.push(gap(Stage::Load, StageStatus::TimeLimit, value, floor.min(value)));
            }
        };
        let remaining = time_limit.map(|limit| limit - started.elapsed().as_secs_f64());
        if remaining.is_some_and(|r| r <= 0.0) {
            stop_at_load(&mut incumbent, &mut gaps);
            status = Status::TimeLimit;
            break;
        }
        let rows = formulation
            .base
            .iter()
            .chain(formulation.stages[..=i].iter().flat_map(|m| &m.rows))
            .chain(&fixes);
        let run = run_stage(model, rows.cloned(), start.as_deref(), relative_gap, remaining);
        match run {
            Run::Found { values, objective, bound: stage_bound, optimal } => {
                if model.stage == Stage::Offload {
                    offloaded = objective;
                    if formulation.nothing_on_hosts(problem, &values) {
                        fixes.push(formulation.host_copies.clone().leq(0.0));
                        hosts_empty = true;
                    }
                }
                if model.stage == Stage::Balance {
                    bound = stage_bound.max(0.0);
                    balance = held(objective);
                }
                match model.stage {
                    Stage::Disk => on_disk = objective,
                    Stage::Crossing => crossing = objective,
                    _ => {}
                }
                fixes.push(model.objective.clone().leq(held(objective)));
                incumbent = Some(values);
                let ended = if optimal { StageStatus::Optimal } else { StageStatus::TimeLimit };
                gaps.push(gap(model.stage, ended, objective, stage_bound.max(0.0)));
                if !optimal {
                    status = Status::TimeLimit;
                    break;
                }
            }
            Run::Infeasible if incumbent.is_none() => return infeasible,
            Run::Infeasible | Run::Stopped => {
                stop_at_load(&mut incumbent, &mut gaps);
                status = Status::TimeLimit;
                break;
            }
        }
    }
    // Stages the time limit stopped or never reached: nothing proven of them.
    for model in &formulation.stages[gaps.len()..] {
        gaps.push(StageGap::proven(model.stage, StageStatus::NotRun, f64::NAN, f64::NAN));
    }
    let assignment = incumbent.map(|values| formulation.assignment(problem, &values));
    Staged { status, assignment, bound, stages: gaps }
}
