//! Planning end to end: build the problem for the target runtime, solve it (the ILP, or
//! accelerate's greedy algorithm as the baseline), and check the answer against the replay of
//! the step program on devices of the plan's limits. The ILP's charges are read off the same
//! program (`vramplan_sim::charges`) and bound the replay's live bytes on one GPU, so a plan
//! without offload usually holds in one round; where the replay still finds a device over its
//! limit (the allocator's slack, which offload's weight streaming makes large; hidden states in
//! flight between GPUs), that device's capacity shrinks by the excess and the ILP solves again,
//! a few rounds at most. The replay runs on devices of the plan's limit (usable × (1 −
//! headroom)): a plan fits when the step would run on a GPU of that size. The figures reported
//! are the replay's.
//!
//! The charges are an upper bound of the step (they add each unit's own peak, and units peak at
//! different moments), so an ILP with no placement within them proves nothing by itself. Then
//! accelerate's own map is replayed (where the target is accelerate and nothing is pinned) and
//! taken when it fits; and the same problem with lower-bound charges (what each unit surely
//! holds at one moment shared by all: the step's peak on one GPU) is solved: infeasible there
//! is the proof that nothing fits.
//!
//! llama.cpp and expert-parallel plans place parts of layers the step simulator does not split,
//! so their per-device figures are the solver's charges.
//!
//! Under data parallelism (DDP, ZeRO, FSDP) there is nothing to place: every GPU of the profile
//! is a rank holding the model whole (DDP) or its shard (ZeRO) on its own GPU, so the plan is
//! the replay of one rank per GPU, each under its own limit ([`data_parallel_plan`]), and no
//! device map.
//!
//! Every plan carries a [`Verdict`]: it fits (a plan within every limit, optimal or the best
//! found before the time limit, with its gap), it does not fit (proven for every placement by
//! the lower-bound problem; with `--solver greedy`, proven for accelerate's map only), or there
//! is no answer, for the [`Unanswered`] reason it carries.
//! `Settings::time_limit_s` bounds the whole of [`plan`]: every solve and refinement round
//! shares one deadline.

use crate::build::{self, Built, Request, UnitSource};
use crate::greedy;
use crate::ilp::{self, DEFAULT_RELATIVE_GAP, SolveOptions, StageGap, Status};
use crate::problem::{Assignment, Problem};
pub use crate::rank_plan::{ServingLayout, data_parallel_plan, serving_plan};
use crate::runtime::Runtime;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vramplan_profiles::InputError;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::estimate::{Components, DeviceEstimate};
use vramplan_sim::placement::{Placement, Target};
use vramplan_sim::workload::{Engine, Parallelism, Workload};

/// Rounds of solve-then-simulate before the plan is taken as it is.
const REFINE_ROUNDS: usize = 6;

/// Which algorithm places the units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SolverKind {
    /// The exact ILP (HiGHS).
    Ilp,
    /// accelerate's `device_map="auto"`: balanced caps, then a greedy fill in module order.
    Greedy,
}

/// The answer to "does it fit?".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// A plan keeps every device within its limit (optimal, or the best found within the time
    /// limit: the solver's status and gap say which).
    Fits,
    /// Proven: no placement keeps every device within its limit (the greedy baseline: its map
    /// runs out of memory).
    DoesNotFit,
    /// Neither: the time limit came first (or the solver stopped) before a plan within the
    /// limits was found, and nothing was proven.
    Unknown,
}

/// Why a plan has no answer ([`Verdict::Unknown`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unanswered {
    /// The time limit came before a plan within the limits was found.
    TimeLimit,
    /// The replay found a device over its limit, and refining the capacities (a few rounds)
    /// did not give a plan within them.
    Refinement,
    /// No placement fits the solver's charges, which over-approximate the step, while the
    /// lower-bound problem has one: neither answer is proven.
    NotProven,
}

/// The instant `seconds` from now; `None` for no limit (or one too large to represent).
pub fn deadline_after(seconds: Option<f64>) -> Option<Instant> {
    let seconds = seconds.filter(|s| !s.is_nan())?.max(0.0);
    Instant::now().checked_add(Duration::try_from_secs_f64(seconds).ok()?)
}

/// Seconds left until `deadline` (0 once it has passed); `None` for no deadline.
pub fn seconds_left(deadline: Option<Instant>) -> Option<f64> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64())
}

/// How the solver did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SolverReport {
    /// The ILP or the greedy baseline.
    pub kind: SolverKind,
    /// `optimal` (every stage within `relative_gap`), `feasible` (a plan, some stage's gap
    /// above it), `time_limit` (the best plan or none when the time ran out), `infeasible`
    /// (proven), `gave_up` (no plan, nothing proven); the greedy baseline reports `heuristic`;
    /// a data-parallel plan, with nothing to place, `fixed`.
    pub status: String,
    /// Wall-clock seconds of every solve together.
    pub seconds: f64,
    /// The largest GPU utilisation under the solver's charges (ILP objective).
    pub objective: f64,
    /// The proven lower bound on it.
    pub bound: f64,
    /// (objective − bound) / objective.
    pub gap: f64,
    /// Solves the refinement against the simulation took.
    pub rounds: u32,
    /// The tolerance of every stage: `optimal` means each one's proven gap is within it.
    pub relative_gap: f64,
    /// The ILP's stages in order (the last solve's), each with the gap it proved; empty for
    /// the greedy baseline and data-parallel plans.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageGap>,
}

/// One device of a plan: what it holds and the simulated step on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanDevice {
    /// The device (serialized as a device map writes it: `0`, `"cpu"`, `"disk"`).
    pub device: Target,
    /// `GPU 0 (Tesla T4)`, `cpu`, `disk`.
    pub name: String,
    /// The units it holds, in model order (groups of experts as ranges).
    pub units: Vec<String>,
    /// What each of `units` holds for the whole step (weights, gradients, optimizer states), as
    /// the solver charged it; empty where units are not placed one by one (data parallelism,
    /// where every rank holds every unit).
    pub unit_bytes: Vec<u64>,
    /// The step on it (GPUs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<DeviceEstimate>,
    /// The limit the plan keeps to: usable × (1 − headroom).
    pub limit_bytes: u64,
    /// Peak reserved over usable memory (GPUs), bytes held over capacity (host tiers).
    pub utilisation: f64,
}

/// A plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Whether it fits, does not (proven), or no answer came in time.
    pub verdict: Verdict,
    /// `verdict == Fits`.
    pub feasible: bool,
    /// The runtime the plan is for.
    pub target: Runtime,
    /// How the solver did.
    pub solver: SolverReport,
    /// Module (or llama.cpp tensor group) → device, in model order.
    #[serde(serialize_with = "ordered_map")]
    pub device_map: Vec<(String, Target)>,
    /// Every device that holds something, in profile order, then `cpu` and `disk`.
    pub devices: Vec<PlanDevice>,
    /// Expert-parallel: per experts module, the GPU of each expert.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub experts: BTreeMap<String, Vec<u32>>,
    /// The largest device-used figure.
    pub peak_bytes: u64,
    /// Why there is no answer, when the verdict is `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unanswered: Option<Unanswered>,
    /// Bytes on the CPU and disk tiers.
    pub offloaded_bytes: u64,
    /// Data parallelism (DDP, ZeRO, FSDP): every GPU of the profile is a rank with the model
    /// whole or its shard, `device_map` is empty, and `devices` has one entry per rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<Parallelism>,
    /// A serving engine's layout (vLLM, SGLang): every GPU it uses is a rank of its
    /// tensor-parallel group (of a pipeline stage, of a replica), `device_map` is empty, and
    /// `devices` has one entry per rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingLayout>,
}

/// A list of `(key, value)` pairs as a JSON object, in list order (model order, not sorted).
pub(crate) fn ordered_map<S: serde::Serializer, V: Serialize>(
    entries: &[(String, V)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(entries.len()))?;
    for (k, v) in entries {
        map.serialize_entry(k, v)?;
    }
    map.end()
}

/// Solver settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Which algorithm places the units.
    pub solver: SolverKind,
    /// Wall-clock seconds for the whole of [`plan`] (every solve and refinement round).
    pub time_limit_s: Option<f64>,
    /// The tolerance of every stage of the ILP ([`SolveOptions::relative_gap`]).
    pub relative_gap: f64,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { solver: SolverKind::Ilp, time_limit_s: None, relative_gap: DEFAULT_RELATIVE_GAP }
    }
}

/// Plans `model` on `hardware` for `workload` as `request` asks.
pub fn plan(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
) -> Result<Plan, InputError> {
    if vramplan_sim::estimate::is_data_parallel(workload) {
        return data_parallel_plan(model, hardware, workload, request, settings);
    }
    if matches!(workload.engine, Engine::Vllm { .. } | Engine::Sglang { .. }) {
        return serving_plan(model, hardware, workload, request, settings);
    }
    let mut built = build::build(model, hardware, workload, request)?;
    match settings.solver {
        SolverKind::Ilp => solve_ilp(model, hardware, workload, request, settings, &mut built),
        SolverKind::Greedy => solve_greedy(model, hardware, workload, request, &built),
    }
}

fn solve_ilp(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    settings: &Settings,
    built: &mut Built,
) -> Result<Plan, InputError> {
    let deadline = deadline_after(settings.time_limit_s);
    let simulated =
        matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4 | Runtime::Pipeline);
    let mut seconds = 0.0;
    let mut rounds = 0;
    loop {
        rounds += 1;
        let options =
            SolveOptions { time_limit_s: seconds_left(deadline), relative_gap: settings.relative_gap };
        let solution = ilp::solve(&built.problem, &options);
        seconds += solution.seconds;
        let report = SolverReport {
            kind: SolverKind::Ilp,
            status: status_name(solution.status).into(),
            seconds,
            objective: solution.objective,
            bound: solution.bound,
            gap: solution.gap,
            rounds,
            relative_gap: settings.relative_gap,
            stages: solution.stages,
        };
        let Some(assignment) = solution.assignment else {
            return match solution.status {
                // No plan within the charges, or none HiGHS could bring within them (a problem
                // at the edge of its tolerance): the lower bounds may still prove one.
                Status::Infeasible | Status::GaveUp if rounds == 1 => {
                    no_placement_within_charges(model, hardware, workload, request, built, report, deadline)
                }
                // After a refinement the capacities were shrunk by an estimate of the
                // allocator's slack: infeasible there proves nothing.
                Status::Infeasible | Status::GaveUp => {
                    let report = SolverReport { status: "gave_up".into(), ..report };
                    Ok(plan_less(request, report, built, Some(Unanswered::Refinement)))
                }
                Status::Optimal | Status::TimeLimit | Status::Feasible => {
                    Ok(plan_less(request, report, built, Some(Unanswered::TimeLimit)))
                }
            };
        };
        let mut plan = assemble(model, hardware, workload, request, built, &assignment, report, simulated)?;
        if plan.feasible {
            return Ok(plan);
        }
        // One device and nowhere else to go: this placement is the only one, and its replay
        // over the limit proves that nothing fits.
        if simulated && built.problem.devices.len() == 1 {
            plan.verdict = Verdict::DoesNotFit;
            plan.unanswered = None;
            return Ok(plan);
        }
        // Over a limit in the replay: refine, unless the rounds or the time are used up, in
        // which case this plan is the best found and nothing is proven. (The same placement may
        // come back once: the shrinking adds up, so the next round differs.)
        let out_of_time = seconds_left(deadline).is_some_and(|s| s <= 0.0);
        if !simulated || rounds as usize >= REFINE_ROUNDS || out_of_time {
            plan.verdict = Verdict::Unknown;
            plan.unanswered = Some(if out_of_time { Unanswered::TimeLimit } else { Unanswered::Refinement });
            return Ok(plan);
        }
        // Each device the simulation finds over its limit must hold less by the excess: its
        // capacity becomes what the replay found allocated there (the charges bound it from
        // above) less the excess, or the capacity less the excess when that is lower. The
        // allocator's slack on the device is taken to stay as it is.
        let mut over = false;
        for d in &plan.devices {
            let Some(e) = &d.estimate else { continue };
            if e.peak_reserved_bytes > d.limit_bytes
                && let Some(slot) = built.problem.devices.iter_mut().find(|x| x.tier == d.device)
            {
                let excess = e.peak_reserved_bytes - d.limit_bytes + (2 << 20);
                let held = e.peak_allocated_bytes.saturating_sub(slot.fixed_bytes);
                slot.capacity_bytes = slot.capacity_bytes.min(held).saturating_sub(excess);
                over = true;
            }
        }
        if !over {
            plan.verdict = Verdict::Unknown;
            plan.unanswered = Some(Unanswered::Refinement);
            return Ok(plan);
        }
    }
}

/// No placement fits the charges (round 1). They over-approximate the step, so: accelerate's
/// own map, replayed, when it fits; "does not fit" when even the lower-bound problem has no
/// placement; otherwise no answer.
fn no_placement_within_charges(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    built: &Built,
    report: SolverReport,
    deadline: Option<Instant>,
) -> Result<Plan, InputError> {
    let in_time = seconds_left(deadline).is_none_or(|s| s > 0.0);
    if in_time
        && matches!(request.runtime, Runtime::Accelerate | Runtime::AccelerateV4)
        && request.pins.is_empty()
    {
        let baseline = solve_greedy(model, hardware, workload, request, built)?;
        // A map with nothing on a GPU runs on the CPU: not an answer to a GPU plan.
        let on_a_gpu = baseline.device_map.iter().any(|(_, t)| matches!(t, Target::Gpu(_)));
        if baseline.feasible && on_a_gpu {
            return Ok(baseline);
        }
        // One device and nowhere else to go: the baseline's map is the only placement, and its
        // replay over the limit proves that nothing fits.
        if built.problem.devices.len() == 1 && on_a_gpu {
            return Ok(plan_less(request, report, built, None));
        }
    }
    // Two lower-bound problems, each a relaxation of every real step: the floors of all units
    // at one shared moment; and at each unit's own run, the steady holdings of the others with
    // its own running ones (`charges::Steady`). No placement in either proves none fits.
    // They are small work next to the problem already solved: each gets a moment even when
    // the time is up, so that a proof is not lost to the limit.
    let mut report = report;
    let mut unproven = None;
    for lower in [at_the_peak(&built.problem), at_each_run(&built.problem)] {
        let time_limit_s = seconds_left(deadline).map(|s| s.max(0.2));
        let bound = ilp::solve(&lower, &SolveOptions { time_limit_s, relative_gap: report.relative_gap });
        report.seconds += bound.seconds;
        match bound.status {
            Status::Infeasible => return Ok(plan_less(request, report, built, None)),
            Status::TimeLimit => unproven = unproven.or(Some(Unanswered::TimeLimit)),
            Status::Optimal | Status::GaveUp | Status::Feasible => {}
        }
    }
    Ok(plan_less(request, report, built, Some(unproven.unwrap_or(Unanswered::NotProven))))
}

/// The problem whose units hold their floors: what each surely holds at the moment the step
/// on one GPU peaks.
fn at_the_peak(problem: &Problem) -> Problem {
    let mut lower = problem.clone();
    for unit in &mut lower.units {
        unit.resident_bytes = unit.floor_bytes;
        unit.peak_bytes = 0;
        unit.transient_bytes = 0;
    }
    lower
}

/// The problem whose units hold their steady holdings: throughout the step, and beyond them
/// while they run, as the charges' transient (one unit runs at a time).
fn at_each_run(problem: &Problem) -> Problem {
    let mut lower = problem.clone();
    for unit in &mut lower.units {
        let s = unit.steady;
        unit.resident_bytes = s.resident_bytes;
        unit.peak_bytes = s.throughout_bytes - s.resident_bytes;
        unit.transient_bytes = s.running_bytes - s.throughout_bytes;
    }
    lower
}

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Optimal => "optimal",
        Status::TimeLimit => "time_limit",
        Status::Infeasible => "infeasible",
        Status::GaveUp => "gave_up",
        Status::Feasible => "feasible",
    }
}

/// A plan without a placement: proven infeasible (`unanswered` is `None`), or no answer.
fn plan_less(request: &Request, solver: SolverReport, built: &Built, unanswered: Option<Unanswered>) -> Plan {
    let verdict = if unanswered.is_some() { Verdict::Unknown } else { Verdict::DoesNotFit };
    let devices = built
        .problem
        .devices
        .iter()
        .map(|d| PlanDevice {
            device: d.tier,
            name: d.name.clone(),
            units: Vec::new(),
            unit_bytes: Vec::new(),
            estimate: None,
            limit_bytes: d.capacity_bytes + d.fixed_bytes,
            utilisation: 0.0,
        })
        .collect();
    Plan {
        verdict,
        feasible: false,
        target: request.runtime,
        solver,
        device_map: Vec::new(),
        devices,
        experts: BTreeMap::new(),
        peak_bytes: 0,
        unanswered: if verdict == Verdict::Unknown { unanswered } else { None },
        offloaded_bytes: 0,
        data_parallel: None,
        serving: None,
    }
}

fn solve_greedy(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    built: &Built,
) -> Result<Plan, InputError> {
    let start = std::time::Instant::now();
    let sizing = greedy::Sizing::for_target(model, workload, request.runtime);
    let max_memory = greedy::max_memory(hardware, &sizing, greedy::Strategy::Balanced, Some(model));
    let entries = greedy::auto_device_map(model, &sizing, &max_memory);
    let seconds = start.elapsed().as_secs_f64();
    // Express the greedy map as an assignment of the problem's units (longest prefix wins).
    let placement = to_placement(&entries);
    let mut counts = vec![vec![0u32; built.problem.devices.len()]; built.problem.units.len()];
    for (u, source) in built.sources.iter().enumerate() {
        let UnitSource::Module(keys) = source else { continue };
        let tier = placement.target_of(&keys[0]).unwrap_or(Target::Gpu(0));
        let d = built.problem.devices.iter().position(|d| d.tier == tier).unwrap_or(0);
        counts[u][d] = built.problem.units[u].count;
    }
    let assignment = Assignment { counts };
    let objective = (0..built.problem.devices.len())
        .filter(|d| matches!(built.problem.devices[*d].tier, Target::Gpu(_)))
        .map(|d| built.problem.utilisation(&assignment, d))
        .fold(0.0, f64::max);
    let report = SolverReport {
        kind: SolverKind::Greedy,
        status: "heuristic".into(),
        seconds,
        objective,
        bound: 0.0,
        gap: 1.0,
        rounds: 1,
        relative_gap: DEFAULT_RELATIVE_GAP,
        stages: Vec::new(),
    };
    let mut plan = assemble(model, hardware, workload, request, built, &assignment, report, true)?;
    // Judged like the ILP's plans: every GPU's simulated peak within usable × (1 − headroom).
    plan.device_map = entries;
    Ok(plan)
}

fn to_placement(entries: &[(String, Target)]) -> Placement {
    Placement::from_entries(entries.to_vec())
}

/// The plan for an assignment: the device map, the simulated (or charged) figures per device.
#[allow(clippy::too_many_arguments)]
fn assemble(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    workload: &Workload,
    request: &Request,
    built: &Built,
    assignment: &Assignment,
    solver: SolverReport,
    simulated: bool,
) -> Result<Plan, InputError> {
    let problem = &built.problem;
    let mut device_map = Vec::new();
    let mut experts: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut held: Vec<Vec<String>> = vec![Vec::new(); problem.devices.len()];
    let mut held_bytes: Vec<Vec<u64>> = vec![Vec::new(); problem.devices.len()];
    for (u, source) in built.sources.iter().enumerate() {
        let unit = &problem.units[u];
        match source {
            UnitSource::Experts { path, experts: members } => {
                let slots = experts
                    .entry(path.clone())
                    .or_insert_with(|| vec![0; model.facts.moe.as_ref().map_or(0, |m| m.experts) as usize]);
                // Hand out this class's experts to devices in order of their counts.
                let mut next = members.iter();
                for (d, &count) in assignment.counts[u].iter().enumerate() {
                    let Target::Gpu(g) = problem.devices[d].tier else { continue };
                    let taken: Vec<u32> = next.by_ref().take(count as usize).copied().collect();
                    if let (Some(first), Some(last)) = (taken.first(), taken.last()) {
                        held[d].push(format!("{path}[{first}..={last}] ({} experts)", taken.len()));
                        held_bytes[d].push(unit.resident_bytes * taken.len() as u64);
                    }
                    for e in taken {
                        if let Some(slot) = slots.get_mut(e as usize) {
                            *slot = g;
                        }
                    }
                }
            }
            UnitSource::Module(keys) => {
                let d = assignment.device_of(u).unwrap_or(0);
                device_map.extend(keys.iter().map(|k| (k.clone(), problem.devices[d].tier)));
                held[d].push(unit.name.clone());
                held_bytes[d].push(unit.resident_bytes);
            }
            _ => {
                let d = assignment.device_of(u).unwrap_or(0);
                device_map.push((unit.name.clone(), problem.devices[d].tier));
                held[d].push(unit.name.clone());
                held_bytes[d].push(unit.resident_bytes);
            }
        }
    }
    let estimates: BTreeMap<u32, DeviceEstimate> = if simulated {
        let placement = to_placement(&device_map);
        vramplan_sim::estimate::estimate_within(model, hardware, workload, &placement, request.headroom)?
            .devices
            .into_iter()
            .map(|e| (e.id, e))
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut devices = Vec::new();
    let mut offloaded = 0;
    let mut peak = 0;
    for (d, slot) in problem.devices.iter().enumerate() {
        let charged = problem.device_bytes(assignment, d);
        if charged == 0 && held[d].is_empty() {
            continue;
        }
        let (estimate, limit, utilisation) = match slot.tier {
            Target::Gpu(g) => {
                let device = hardware.device(g);
                let usable = device.map_or(0, |x| x.usable_bytes());
                let limit = vramplan_sim::estimate::limit_bytes(usable, request.headroom);
                let estimate = estimates
                    .get(&g)
                    .cloned()
                    .or_else(|| device.map(|x| charged_estimate(built, assignment, d, x)));
                let reserved = estimate.as_ref().map_or(charged, |e| e.peak_reserved_bytes);
                if let Some(e) = &estimate {
                    peak = peak.max(e.device_used_bytes);
                }
                (estimate, limit, reserved as f64 / usable.max(1) as f64)
            }
            Target::Cpu | Target::Disk => {
                offloaded += charged;
                (None, slot.capacity_bytes, charged as f64 / slot.capacity_bytes.max(1) as f64)
            }
        };
        devices.push(PlanDevice {
            device: slot.tier,
            name: slot.name.clone(),
            units: held[d].clone(),
            unit_bytes: held_bytes[d].clone(),
            estimate,
            limit_bytes: limit,
            utilisation,
        });
    }
    let feasible = devices.iter().all(|d| match &d.estimate {
        Some(e) => e.peak_reserved_bytes <= d.limit_bytes,
        None => true,
    });
    // Judged against the simulation: a plan over a limit is not an answer by itself (the ILP
    // refines it; the greedy baseline's map really runs out).
    Ok(Plan {
        verdict: if feasible { Verdict::Fits } else { Verdict::DoesNotFit },
        feasible,
        target: request.runtime,
        solver,
        device_map,
        devices,
        experts,
        peak_bytes: peak,
        unanswered: None,
        offloaded_bytes: offloaded,
        data_parallel: None,
        serving: None,
    })
}

/// A device's figures from the solver's charges, for plans the step simulator does not split.
fn charged_estimate(
    built: &Built,
    assignment: &Assignment,
    d: usize,
    device: &vramplan_profiles::hardware::Device,
) -> DeviceEstimate {
    let problem = &built.problem;
    let (replicated, replicated_weights) = (built.replicated_bytes, built.replicated_weight_bytes);
    let mut resident = 0;
    let mut weights = 0;
    let mut kv = 0;
    let mut transient = 0;
    for (u, unit) in problem.units.iter().enumerate() {
        let copies = u64::from(assignment.counts[u][d]);
        if copies > 0 {
            resident += copies * unit.resident_bytes;
            weights += copies * unit.weight_bytes;
            kv += copies * unit.peak_bytes;
            transient = transient.max(unit.transient_bytes);
        }
    }
    let fixed = problem.devices[d].fixed_bytes;
    let allocated = fixed + resident + kv + transient;
    let usable = device.usable_bytes();
    DeviceEstimate {
        id: device.index,
        name: device.name.clone(),
        capacity_bytes: device.memory_bytes,
        usable_bytes: usable,
        peak_allocated_bytes: allocated,
        peak_reserved_bytes: allocated,
        device_used_bytes: allocated + device.context_reserve_bytes,
        peak_at: "the step's peak (solver charges)".into(),
        steady_bytes: resident + replicated,
        loaded_bytes: weights + replicated_weights,
        components: Components {
            weights: weights + replicated_weights,
            // Gradients and optimizer states, which the charges do not tell apart.
            optimizer: resident - weights + replicated.saturating_sub(replicated_weights),
            kv_cache: kv,
            activations: transient,
            overhead: fixed.saturating_sub(replicated) + device.context_reserve_bytes,
            ..Components::default()
        },
        fits: allocated <= usable,
    }
}

/// `--parallel`'s spelling of a parallelism (`ddp`, `zero2`, `tp=4`).
pub fn parallel_flag(parallelism: Parallelism) -> String {
    match parallelism {
        Parallelism::Single => "single".into(),
        Parallelism::Ddp => "ddp".into(),
        Parallelism::Zero { stage, .. } => format!("zero{stage}"),
        Parallelism::Tensor { size, pipeline: 1 } => format!("tp={size}"),
        Parallelism::Tensor { size, pipeline } => format!("tp={size},pp={pipeline}"),
    }
}
