//! A whole chain placed on the GPUs, answered by its partitions alone, with no MIP model built
//! (module documentation, "Chains"). Where the chain holds every pool once (the accelerate and
//! pipeline targets) and no unit carries a load, each stage the sequence would run (offload,
//! disk, balance, crossings, fewest GPUs) is answered exactly by [`crate::chain::partition`]
//! whenever that partition sits on GPUs alone, and [`super::stages::solve_stages`] takes each
//! such partition without calling HiGHS. Then the model's variables and rows are never needed:
//! they are `units × devices` of them (a custom model of 1,026 units over 4,096 GPUs made 8 GB
//! of them before any stage ran), where the partitions need the chain and the devices alone.
//!
//! [`solve`] runs the same stages on the same partitions as the sequence does and gives the
//! same plan, values and gaps; where a stage's partition is not a plan on the GPUs (offload
//! needed, a unit left to `cpu` or `disk`, fewest GPUs without a partition) it gives nothing,
//! and the full model is built and solved as before.

use super::blocks::{Block, apportion, pools, spills};
use super::bounds::{chain_links, chain_slots, is_whole};
use super::formulation::Handoffs;
use super::split::{held, possible_splits};
use super::{Stage, StageGap, Staged, Status, ordered_pairs};
use crate::chain::{self, Goal};
use crate::problem::{Assignment, Problem};
use vramplan_sim::placement::Target;

/// The stages the sequence would run on `problem` and the plan of the last one, where every
/// one is a partition of the whole chain on the GPUs; `None` where some stage needs the model
/// (see the module documentation). `blocks` and `block_of` are [`super::blocks::blocks`]'s.
pub(super) fn solve(
    problem: &Problem,
    capacities: &[u64],
    blocks: &[Block],
    block_of: &[usize],
) -> Option<Staged> {
    if !problem.ordered {
        return None;
    }
    let n_devices = problem.devices.len();
    let is_gpu: Vec<bool> = problem.devices.iter().map(|d| matches!(d.tier, Target::Gpu(_))).collect();
    // Units with loads have a load stage, which only the model answers.
    let total_load: f64 = blocks.iter().map(|b| b.load * f64::from(b.copies)).sum();
    if total_load > 0.0 && is_gpu.iter().any(|&gpu| gpu) {
        return None;
    }
    let pairs = ordered_pairs(problem);
    let spilling: Vec<bool> = (0..n_devices).map(|d| spills(problem, d)).collect();
    let (pooled, parts, pool_of) = pools(capacities, &spilling, blocks, block_of, &pairs);
    let unit_pool: Vec<usize> = block_of.iter().map(|&b| pool_of[b]).collect();
    let handoffs = Handoffs::new(problem, &pairs, &unit_pool, &pooled);
    let (chain, links) = chain_links(&handoffs, &pooled, n_devices)?;
    if !is_whole(&chain, &pooled) {
        return None;
    }
    // The stages the model has (`Formulation::new`): offload and disk where a pool may go to a
    // host with bytes it would leave there; crossings where a handoff has bytes; fewest GPUs
    // where asked for and a GPU may hold something.
    let to_host = |disk: bool| {
        pooled.iter().any(|pool| {
            pool.allowed.len() > 1
                && pool.allowed.iter().any(|&(d, _)| {
                    !is_gpu[d]
                        && (!disk || problem.devices[d].tier == Target::Disk)
                        && pool.bytes_on(spilling[d]) > 0
                })
        })
    };
    let mut stages = Vec::new();
    if to_host(false) {
        stages.push(Stage::Offload);
        if to_host(true) {
            stages.push(Stage::Disk);
        }
    }
    stages.push(Stage::Balance);
    if handoffs.pairs.iter().any(|p| p.2 > 0.0) {
        stages.push(Stage::Crossing);
    }
    if problem.min_devices && pooled.iter().any(|pool| pool.allowed.iter().any(|&(d, _)| is_gpu[d])) {
        stages.push(Stage::Devices);
    }
    let scale = (0..n_devices)
        .map(|d| capacities[d].saturating_add(problem.devices[d].fixed_bytes).max(1) as f64)
        .fold(1.0, f64::max);
    // Nothing is offloaded: where the offload stage proved it, the hosts stay empty; where
    // there is no such stage, no pool may go to a host with bytes, and the partitions give
    // the hosts what the held value allows, as the sequence does.
    let offloaded_bytes = if stages[0] == Stage::Offload { 0.0 } else { held(0.0) * scale };
    let on_gpus = |slot_of: &[usize]| slot_of.iter().all(|&d| is_gpu[d]);
    let mut gaps = Vec::with_capacity(stages.len());
    let (mut balance, mut bound) = (f64::INFINITY, 0.0);
    let mut plan: Option<Vec<usize>> = None;
    for stage in stages {
        let (goal, host_bytes) = match stage {
            Stage::Offload => (Goal::Balance, 0.0),
            Stage::Disk => {
                gaps.push(StageGap::proven(Stage::Disk, super::StageStatus::Optimal, 0.0, 0.0));
                continue;
            }
            Stage::Balance => (Goal::Balance, offloaded_bytes),
            Stage::Crossing => (Goal::Crossing { limit: balance }, offloaded_bytes),
            Stage::Devices => (Goal::Fewest { limit: balance }, offloaded_bytes),
            Stage::Load => return None,
        };
        let slots = chain_slots(problem, capacities, &handoffs.weight, host_bytes);
        let Some((value, slot_of)) = chain::partition(&links, &slots, goal) else {
            // No partition of a whole chain on GPUs alone: no plan at all (the sequence's
            // balance stage says the same); with hosts after the GPUs, none either where no
            // split between them may have one (its offload stage scans the splits, and a fill
            // of the GPUs alone is this partition); otherwise the model scans them.
            let hosts_last = is_gpu.iter().rposition(|&gpu| gpu) < is_gpu.iter().position(|&gpu| !gpu);
            let no_split = || {
                possible_splits(&links, &chain_slots(problem, capacities, &handoffs.weight, f64::INFINITY))
                    .is_empty()
            };
            let infeasible = match stage {
                Stage::Balance => is_gpu.iter().all(|&gpu| gpu),
                Stage::Offload => hosts_last && no_split(),
                _ => false,
            };
            return infeasible.then_some(Staged {
                status: Status::Infeasible,
                assignment: None,
                bound: f64::NAN,
                stages: Vec::new(),
            });
        };
        if !on_gpus(&slot_of) {
            return None;
        }
        let value = if stage == Stage::Offload { 0.0 } else { value };
        if stage == Stage::Balance {
            bound = value;
            balance = held(value);
        }
        gaps.push(StageGap::proven(stage, super::StageStatus::Optimal, value, value));
        plan = Some(slot_of);
    }
    let slot_of = plan?;
    // Copies of each pool on each device: one for each position of the chain.
    let mut on_devices = vec![vec![0u32; n_devices]; pooled.len()];
    for (&pool, &d) in chain.iter().zip(&slot_of) {
        let copies = pooled[pool].copies;
        on_devices[pool][d] = if pooled[pool].allowed.len() == 1 { copies } else { copies.min(1) };
    }
    let mut counts = vec![vec![0u32; n_devices]; problem.units.len()];
    for (p, row) in on_devices.into_iter().enumerate() {
        let split = match &parts[p][..] {
            [_] => vec![row],
            many => apportion(&row, &many.iter().map(|&b| blocks[b].copies).collect::<Vec<_>>()),
        };
        for (&b, row) in parts[p].iter().zip(split) {
            let block = &blocks[b];
            for &u in &block.members {
                counts[u] = row.iter().map(|&c| c * block.per_copy(problem, u)).collect();
            }
        }
    }
    Some(Staged { status: Status::Optimal, assignment: Some(Assignment { counts }), bound, stages: gaps })
}
