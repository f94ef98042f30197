//! The HiGHS boundary: one stage's MIP handed to HiGHS through good_lp, with the options that
//! keep it deterministic and the time limit, and its outcome read back as a [`Run`].

use good_lp::{Constraint, IntoAffineExpression, SolverModel};

use super::formulation::StageModel;

/// How one stage's MIP ended.
pub(super) enum Run {
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

/// Solves `model`'s MIP over `rows` (the base rows, those of the stages so far and the held
/// objectives), from the plan `start` where given, within `time_limit_s`.
pub(super) fn run_stage(
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
        // good_lp hands HiGHS the objective's terms without its constant (a pool pinned to
        // one device counts as a constant): add it back, or a stage's value held for the next
        // misses it and the next stage has no plan.
        let constant = model.objective.constant();
        return Run::Found {
            values: solved.get_solution().columns().to_vec(),
            objective: solved.objective_value() + constant,
            bound: solved.double_info_value(c"mip_dual_bound").unwrap_or(0.0) + constant,
            optimal: status_is(status, HIGHS_OPTIMAL),
        };
    }
    if status_is(status, HIGHS_INFEASIBLE) || status_is(status, HIGHS_UNBOUNDED_OR_INFEASIBLE) {
        Run::Infeasible
    } else {
        Run::Stopped
    }
}
