//! The lexicographic sequence: each stage in turn, skipped when its objective is constant or
//! a bound known without HiGHS already holds, each one's value held by a row for the next
//! (module documentation, "Objectives" and "Chains").

use std::time::Instant;

use good_lp::Constraint;

use super::blocks::blocks;
use super::formulation::{Formulation, Stage};
use super::highs::{Run, run_stage};
use super::{SolveOptions, Staged, Status};
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
