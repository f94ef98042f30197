//! Plans with nothing to place: every GPU used is a rank that the runtime fills itself.
//!
//! - [`data_parallel_plan`]: DDP, ZeRO and FSDP, where every GPU of the profile holds the model
//!   (or its shard) and runs its own micro-batch;
//! - [`serving_plan`]: vLLM and SGLang, which shard every layer over a tensor-parallel group,
//!   split the layers over vLLM's pipeline stages, and run SGLang's data-parallel replicas,
//!   each rank sized by the engine's own budget.
//!
//! Both are the engine's estimate, rank by rank, judged against each rank's limit: the plan
//! fits when every rank does and otherwise does not (there is no other placement to try).
//! Pins, `--min-devices` and targets that split the model are refused: the runtime decides
//! where everything goes.

use crate::build::Request;
use crate::plan::{Plan, PlanDevice, Settings, SolverReport, Verdict, parallel_flag};
use crate::runtime::Runtime;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::engines::pipeline_stage::{Stage, stage_model};
use vramplan_sim::estimate::DeviceEstimate;
use vramplan_sim::placement::{Placement, Target};
use vramplan_sim::workload::{Engine, Workload};

/// How a serving engine lays its ranks over the GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServingLayout {
    /// The engine (`vllm`, `sglang`).
    pub engine: String,
    /// GPUs of each tensor-parallel group.
    pub tensor_parallel: u32,
    /// Pipeline stages (vLLM).
    pub pipeline_parallel: u32,
    /// Replicas of the whole pipeline (vLLM's `--data-parallel-size`, SGLang's `--dp-size`).
    pub data_parallel: u32,
    /// Tokens the KV cache holds (the smallest rank's).
    pub kv_capacity_tokens: u64,
    /// What the engine's estimate warns of (one GPU used of several, a group across nodes);
    /// the API adds them to the plan's warnings.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// The plan under data parallelism (DDP, ZeRO-1/2/3, FSDP): no placement to search. Every GPU
/// of the profile is a rank that loads the model whole on its own GPU (DDP: a replica; ZeRO:
/// the whole model, then its shard), so the plan is each rank's replay under its own limit
/// (usable × (1 − headroom)); it fits when every rank does, and otherwise does not (proven
/// under the memory model: there is no other placement). No device map: each process places
/// its copy itself (`device_map={"": local_rank}` or `model.to(local_rank)`; DeepSpeed ZeRO-3
/// and FSDP partition the weights as they load them). `settings.solver` is reported as given,
/// with the status `fixed`.
///
/// A target that splits the model over GPUs (`pipeline`, `llama.cpp`, `expert-parallel`), pins
/// and `--min-devices` are refused: a rank runs on every GPU of the profile, each with all of
/// the model.
pub fn data_parallel_plan(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Result<Plan, InputError> {
    let kind = parallel_flag(workload.parallelism);
    refuse_placing(
        request,
        hardware,
        &format!("--parallel {kind}"),
        "every rank holds all of the model (or its shard) on its own GPU",
        ", or use `--parallel single` to split one copy of the model by hand",
    )?;
    let start = Instant::now();
    let estimate = vramplan_sim::estimate::data_parallel_estimate(
        model,
        hardware,
        workload,
        &Placement::from_entries(Vec::new()),
        request.headroom,
    )?;
    // Each rank holds every unit (whole, or its shard of each).
    let program = vramplan_sim::program::step_program(model, hardware, workload, &Placement::single(0));
    let units: Vec<String> = program.units.iter().map(|u| u.path.clone()).collect();
    let mut plan = ranks_plan(estimate.devices, |_| units.clone(), request, settings, start);
    plan.data_parallel = Some(workload.parallelism);
    Ok(plan)
}

/// The plan under a serving engine (vLLM, SGLang): its estimate, one row per rank, each rank
/// holding its stage's units (every layer of it sharded over the tensor-parallel group).
/// `settings.solver` is reported as given, with the status `fixed`.
pub fn serving_plan(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Result<Plan, InputError> {
    let (engine, dp) = match workload.engine {
        Engine::Vllm { .. } => ("vllm", workload.data_parallel_size()),
        Engine::Sglang { dp_size, .. } => ("sglang", dp_size.unwrap_or(1).max(1)),
        _ => {
            return Err(InputError::new("--engine", "not a serving engine")
                .with_fix("use `--engine vllm` or `sglang`"));
        }
    };
    refuse_placing(
        request,
        hardware,
        &format!("--engine {engine}"),
        "the engine places the model itself",
        ", or plan for transformers (leave out --engine)",
    )?;
    let start = Instant::now();
    let estimate = vramplan_sim::estimate::estimate(model, hardware, workload, &Placement::single(0))?;
    let tp = workload.tensor_parallel_size();
    let pp = workload.pipeline_parallel_size();
    let program = vramplan_sim::program::step_program(model, hardware, workload, &Placement::single(0));
    let stages: Vec<Vec<String>> = (0..pp)
        .map(|index| {
            let held = stage_model(model, Stage { index, count: pp });
            program.units.iter().filter(|u| held.has_path(&u.path)).map(|u| u.path.clone()).collect()
        })
        .collect();
    let ranks_per_replica = (tp * pp) as usize;
    let mut plan = ranks_plan(
        estimate.devices,
        |rank| stages[(rank % ranks_per_replica) / tp as usize].clone(),
        request,
        settings,
        start,
    );
    plan.serving = Some(ServingLayout {
        engine: engine.into(),
        tensor_parallel: tp,
        pipeline_parallel: pp,
        data_parallel: dp,
        kv_capacity_tokens: estimate.kv_capacity_tokens.unwrap_or(0),
        warnings: estimate.warnings,
    });
    Ok(plan)
}

/// The refusals of a plan whose runtime places everything: a target that splits the model,
/// pins, `--min-devices`. `layout` names what decides (`--parallel ddp`, `--engine vllm`),
/// `why` says why nothing can be pinned, `otherwise` ends the fix with the other way.
fn refuse_placing(
    request: &Request,
    hardware: &HardwareProfile,
    layout: &str,
    why: &str,
    otherwise: &str,
) -> Result<(), InputError> {
    if !matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4) {
        return Err(InputError::new(
            "--target",
            format!(
                "--target {} splits the model over the GPUs by a map, and under {layout} {why}",
                request.runtime.name()
            ),
        )
        .with_fix(format!("leave out --target with {layout}{otherwise}")));
    }
    if let Some((module, _)) = request.pins.first() {
        return Err(InputError::new("--pin", format!("`{module}` cannot be pinned: under {layout} {why}"))
            .with_fix(format!("leave out --pin with {layout}{otherwise}")));
    }
    if request.min_devices {
        return Err(InputError::new(
            "--min-devices",
            format!("under {layout} the ranks run on the GPUs of `{}` the layout names", hardware.name),
        )
        .with_fix("give the profile of the GPUs you will run on (e.g. `--hardware 2xa10g`), or leave out --min-devices"));
    }
    Ok(())
}

/// A plan of ranks: each estimated device against its limit under the request's headroom, with
/// the units `units_of(rank)` it holds.
fn ranks_plan(
    estimates: Vec<DeviceEstimate>,
    units_of: impl Fn(usize) -> Vec<String>,
    request: &Request,
    settings: &Settings,
    start: Instant,
) -> Plan {
    let mut devices = Vec::new();
    let mut objective: f64 = 0.0;
    for (rank, e) in estimates.into_iter().enumerate() {
        let limit = vramplan_sim::estimate::limit_bytes(e.usable_bytes, request.headroom);
        let utilisation = e.peak_reserved_bytes as f64 / e.usable_bytes.max(1) as f64;
        objective = objective.max(utilisation);
        devices.push(PlanDevice {
            device: Target::Gpu(e.id),
            name: format!("GPU {} ({})", e.id, e.name),
            units: units_of(rank),
            unit_bytes: Vec::new(),
            limit_bytes: limit,
            utilisation,
            estimate: Some(e),
        });
    }
    let feasible = !devices.is_empty()
        && devices
            .iter()
            .all(|d| d.estimate.as_ref().is_some_and(|e| e.fits && e.peak_reserved_bytes <= d.limit_bytes));
    let peak_bytes =
        devices.iter().filter_map(|d| d.estimate.as_ref()).map(|e| e.device_used_bytes).max().unwrap_or(0);
    Plan {
        verdict: if feasible { Verdict::Fits } else { Verdict::DoesNotFit },
        feasible,
        target: request.runtime,
        solver: SolverReport {
            kind: settings.solver,
            status: "fixed".into(),
            seconds: start.elapsed().as_secs_f64(),
            objective,
            bound: objective,
            gap: 0.0,
            rounds: 1,
            relative_gap: settings.relative_gap,
            stages: Vec::new(),
        },
        device_map: Vec::new(),
        devices,
        experts: BTreeMap::new(),
        peak_bytes,
        unanswered: None,
        offloaded_bytes: 0,
        data_parallel: None,
        serving: None,
    }
}
