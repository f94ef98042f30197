//! The model of one problem: its count variables per pool and device, the rows every stage
//! shares and the stages' objectives (module documentation, "Variables", "Constraints" and
//! "Objectives"). [`Formulation::new`] builds it in steps, one per group of rows: those are in
//! `rows.rs` (every stage) and `objectives.rs` (the stages after the balance).

use std::collections::HashMap;

use good_lp::{Constraint, Expression, IntoAffineExpression, ProblemVariables, Variable, variable};

use super::blocks::{Block, pools, spills};
use super::bounds::{chain_links, utilisation_floor};
use super::{Stage, ordered_pairs};
use crate::chain::Link;
use crate::problem::Problem;
use vramplan_sim::placement::Target;

/// Copies of a pool on a device in the model.
#[derive(Debug, Clone, Copy)]
pub(super) enum Copies {
    /// The pool may not use the device.
    None,
    /// The device is the pool's only one: all its copies are there.
    All,
    /// A count variable.
    Free(Variable),
}

/// One stage's MIP. Each stage's variables extend those of the stage before it (a stage that
/// needs more creates them after all earlier ones), so a plan of one stage is a partial start
/// of the next.
pub(super) struct StageModel {
    pub(super) stage: Stage,
    pub(super) objective: Expression,
    /// The variables that exist by this stage.
    pub(super) vars: ProblemVariables,
    /// The rows this stage adds to the base rows and those of the stages before it.
    pub(super) rows: Vec<Constraint>,
}

/// The variables, rows and stages of one problem.
pub(super) struct Formulation {
    /// Rows every stage has.
    pub(super) base: Vec<Constraint>,
    pub(super) stages: Vec<StageModel>,
    /// The problem's blocks.
    pub(super) blocks: Vec<Block>,
    /// The pools the model counts, each one block or several identical ones (see [`pools`]).
    pub(super) pools: Vec<Block>,
    /// Block indices of each pool.
    pub(super) parts: Vec<Vec<usize>>,
    /// `copies[pool][device]`.
    pub(super) copies: Vec<Vec<Copies>>,
    /// `split[pool][part][device]`: copies of one part where the load stage needs them.
    pub(super) split: Vec<Vec<Vec<Option<Variable>>>>,
    /// Column of every variable, in the last stage's model.
    pub(super) column: HashMap<Variable, usize>,
    /// The load stage's scale (mean load per GPU) and a bound on its objective, where loads exist.
    pub(super) loads: Option<(f64, f64)>,
    /// Whether each device is a GPU.
    pub(super) is_gpu: Vec<bool>,
    /// Units and devices, for reading plans back.
    pub(super) shape: (usize, usize),
    pub(super) handoffs: Handoffs,
    /// The largest `S_d`: the offload stage's objective is bytes over this.
    pub(super) scale: f64,
    /// Copies on `cpu` and `disk`, all units counted alike. Offloaded bytes over `scale` cannot
    /// see a unit of a few megabytes next to a 4 TiB disk (10⁻⁶ of the objective); once no
    /// offload is needed this count is held at zero, so no small unit is offloaded while a GPU
    /// has room for it.
    pub(super) host_copies: Expression,
    /// A bound on the largest GPU utilisation from bytes alone when nothing is offloaded
    /// ([`utilisation_floor`]).
    pub(super) floor_on_gpus: f64,
    /// Ordered problems: the pool at each position of the chain and the chain as
    /// [`chain::partition`](crate::chain::partition) takes it.
    pub(super) chain: Option<(Vec<usize>, Vec<Link>)>,
}

/// The terms of the crossing stage, to price a plan and bound the stage without the solver.
pub(super) struct Handoffs {
    /// `(pool of a, pool of b, handoff of a over the largest handoff)` for consecutive units
    /// `a`, `b` in different blocks, zero handoffs included (a unit with a neighbour in order
    /// is never pooled).
    pub(super) pairs: Vec<(usize, usize, f64)>,
    /// Weight of a handoff leaving each device.
    pub(super) weight: Vec<f64>,
}

/// Builds a [`Formulation`]: the variables so far and the rows of the part being built.
pub(super) struct Builder {
    pub(super) blocks: Vec<Block>,
    /// `S_d`: capacity plus fixed bytes, the unit of device `d`'s rows.
    pub(super) size: Vec<f64>,
    /// Whether each device is a GPU.
    pub(super) is_gpu: Vec<bool>,
    /// Whether each device is a host that leaves its units' peak bytes to a GPU ([`spills`]).
    pub(super) spilling: Vec<bool>,
    pub(super) vars: ProblemVariables,
    pub(super) rows: Vec<Constraint>,
    pub(super) copies: Vec<Vec<Copies>>,
    /// Presence indicators of pools of several copies, made when first needed.
    pub(super) presence: Vec<Vec<Option<Variable>>>,
    /// Per device: resident, peak and workspace bytes over `S_d`, without fixed bytes.
    pub(super) held: Vec<Expression>,
    /// Per GPU: the "used" indicator, where one exists.
    pub(super) used: Vec<Option<Variable>>,
}

impl Builder {
    /// A builder with no variable and no row yet, every pool on no device.
    fn new(blocks: Vec<Block>, size: Vec<f64>, is_gpu: Vec<bool>, spilling: Vec<bool>) -> Self {
        let n_devices = size.len();
        Builder {
            size,
            is_gpu,
            spilling,
            vars: ProblemVariables::new(),
            rows: Vec::new(),
            copies: vec![vec![Copies::None; n_devices]; blocks.len()],
            presence: vec![vec![None; n_devices]; blocks.len()],
            held: vec![Expression::default(); n_devices],
            used: vec![None; n_devices],
            blocks,
        }
    }

    pub(super) fn count(&self, b: usize, d: usize) -> Expression {
        match self.copies[b][d] {
            Copies::None => Expression::default(),
            Copies::All => Expression::from(f64::from(self.blocks[b].copies)),
            Copies::Free(v) => Expression::from(v),
        }
    }

    /// The most copies of pool `b` device `d` can take.
    pub(super) fn most(&self, b: usize, d: usize) -> f64 {
        self.blocks[b].allowed.iter().find(|a| a.0 == d).map_or(0.0, |a| f64::from(a.1))
    }

    /// 1 when device `d` holds some copy of pool `b`.
    pub(super) fn presence(&mut self, b: usize, d: usize) -> Expression {
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
    pub(super) fn used(&mut self, d: usize) -> Variable {
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

    pub(super) fn take(&mut self, stage: Stage, objective: Expression) -> StageModel {
        StageModel { stage, objective, vars: self.vars.clone(), rows: std::mem::take(&mut self.rows) }
    }
}

impl Formulation {
    /// The model of `problem` with device capacities `capacities`, over its `blocks` (`block_of`
    /// gives each unit's): blocks pooled, then the rows every stage has (counts, order,
    /// per-device charges, symmetry), then each stage's objective with the variables and rows
    /// only it needs, in a fixed order so that the same problem gives the same model.
    pub(super) fn new(problem: &Problem, capacities: &[u64], blocks: Vec<Block>, block_of: &[usize]) -> Self {
        let n_devices = problem.devices.len();
        let pairs = ordered_pairs(problem);
        let spilling: Vec<bool> = (0..n_devices).map(|d| spills(problem, d)).collect();
        let (pooled, parts, pool_of) = pools(capacities, &spilling, &blocks, block_of, &pairs);
        let block_of: Vec<usize> = block_of.iter().map(|&b| pool_of[b]).collect();
        let is_gpu: Vec<bool> = problem.devices.iter().map(|d| matches!(d.tier, Target::Gpu(_))).collect();
        let size: Vec<f64> = (0..n_devices)
            .map(|d| capacities[d].saturating_add(problem.devices[d].fixed_bytes).max(1) as f64)
            .collect();
        let scale = size.iter().copied().fold(1.0, f64::max);
        let floor = utilisation_floor(problem, capacities, &pooled, None);
        let mut x = Builder::new(pooled, size, is_gpu, spilling);

        // Rows every stage has.
        x.place_every_copy();
        if problem.ordered {
            x.keep_order(&pairs, &block_of);
        }
        let terms = x.device_rows(problem, capacities, floor, scale);
        if !problem.ordered {
            x.order_interchangeable(problem, capacities, &terms.charges);
        }
        let base = std::mem::take(&mut x.rows);

        // The stages, each with the variables and rows it adds.
        let mut stages = Vec::new();
        if has_variables(&terms.offloaded) {
            stages.push(x.take(Stage::Offload, terms.offloaded));
            if has_variables(&terms.on_disk) {
                stages.push(x.take(Stage::Disk, terms.on_disk));
            }
        }
        stages.push(x.take(Stage::Balance, Expression::from(terms.max_utilisation)));
        let gpus: Vec<usize> = (0..n_devices).filter(|&d| x.is_gpu[d]).collect();
        let mut split: Vec<Vec<Vec<Option<Variable>>>> = vec![Vec::new(); x.blocks.len()];
        let mut loads = None;
        if let Some((model, bound)) = x.load_stage(&blocks, &parts, &gpus, &mut split) {
            stages.push(model);
            loads = Some(bound);
        }
        let handoffs = Handoffs::new(problem, &pairs, &block_of, &x.blocks);
        if let Some(model) = x.crossing_stage(&handoffs) {
            stages.push(model);
        }
        if problem.min_devices
            && let Some(model) = x.fewest_gpus_stage(capacities, &gpus)
        {
            stages.push(model);
        }

        let chain = if problem.ordered { chain_links(&handoffs, &x.blocks, x.size.len()) } else { None };
        let floor_on_gpus = utilisation_floor(problem, capacities, &x.blocks, Some(0.0));
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
            is_gpu: x.is_gpu,
            shape: (problem.units.len(), n_devices),
            chain,
            handoffs,
            floor_on_gpus,
            scale,
            host_copies: terms.host_copies,
        }
    }
}

/// Whether an expression involves any variable (a stage over constants is skipped).
pub(super) fn has_variables(expression: &Expression) -> bool {
    expression.linear_coefficients().into_iter().any(|(_, c)| c != 0.0)
}
