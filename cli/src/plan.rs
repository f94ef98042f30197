//! `vramplan plan MODEL --hardware HW [WORKLOAD] [--target T] [--headroom P] [--pin M=D]
//! [--solver ilp|greedy] [-o FILE [--format F]] [--json]`: reads the inputs, asks the solver for
//! a placement, prints it (with accelerate's greedy map beside it for accelerate targets), and
//! writes the export atomically. Exit 0 with a plan that fits (optimal, or the best found
//! within `--time-limit`, with its gap), 1 when nothing fits, proven (with the remedies), 4 when
//! `--time-limit` ran out before either. `--time-limit` bounds the whole command: the ILP and
//! its refinement rounds, the greedy baseline and the remedy probes share one deadline. Under
//! data parallelism (`--parallel ddp`, `zero1`–`zero3`, `fsdp`) nothing is placed: each GPU is
//! a rank judged on its own memory, no baseline or remedies are run, and no device map is
//! written (`-o` takes only the YAML plan).

use crate::estimate::{Inputs, Loaded};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use vramplan_profiles::InputError;
use vramplan_solver::Runtime;
use vramplan_solver::build::{Request, experts_module, parse_pin};
use vramplan_solver::explain::{DEFAULT_BUDGET_S, Explanation, explain};
use vramplan_solver::export::{Format, export};
use vramplan_solver::plan::{Plan, Settings, SolverKind, Verdict, deadline_after, plan, seconds_left};

#[derive(Args, Debug)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    inputs: Inputs,
    #[command(flatten)]
    solve: SolveOptions,
    /// Write the plan here (atomically).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// accelerate | llama.cpp | expert-parallel | pipeline | yaml (default: from the file name
    /// and the target).
    #[arg(long)]
    format: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// How a plan is solved: the runtime, the headroom, pins, offload and the solver's limits.
#[derive(Args, Debug)]
pub(crate) struct SolveOptions {
    /// The runtime the plan is for: accelerate | accelerate-v4 | llama.cpp | expert-parallel | pipeline.
    #[arg(long, default_value = "accelerate")]
    pub target: String,
    /// Share of each GPU's usable memory kept free, 0 to 90 %: `10%` (a percentage) or `0.1` (a
    /// share below 1); a bare `2` is refused (write `2%` or `0.02`). Default 10 % (for
    /// `plot sweep` and `plot grid`, 0, as `whatif` judges).
    #[arg(long)]
    pub headroom: Option<String>,
    /// Fix a module to a device: `lm_head=0`, `model.layers.28-31=cpu` (a range from first to
    /// last layer; repeatable). Layers run in order, so a plan keeps each later layer on the same
    /// or a later device (GPUs by index, then cpu and disk; llama.cpp: cpu first): pins against
    /// that order, or that leave the layers before or after them no room, are refused.
    #[arg(long, value_name = "MODULE=DEVICE")]
    pin: Vec<String>,
    /// Never place modules on the CPU or disk.
    #[arg(long)]
    no_offload: bool,
    /// Among equally balanced plans, use the fewest GPUs.
    #[arg(long)]
    min_devices: bool,
    /// Bound the whole command to this many seconds: the best plan found by then is printed with
    /// its proven gap; with none found and nothing proven, exit 4.
    #[arg(long, value_name = "SECONDS")]
    time_limit: Option<f64>,
    /// The solver's tolerance: each objective (offload, balance, load, crossings, fewest GPUs)
    /// stops once its plan is proven within this share of the best possible, and the plan is
    /// called optimal only when every one is. `1%` (default) or `0.01`; `0` for exact.
    #[arg(long, value_name = "SHARE")]
    gap: Option<String>,
    /// ilp (exact, default) | greedy (accelerate's device_map="auto", the baseline).
    #[arg(long, default_value = "ilp")]
    solver: String,
    /// Tokens routed to each expert, per MoE layer: JSON `{"model.layers.3.mlp.experts": [..]}`.
    #[arg(long, value_name = "FILE")]
    expert_load: Option<PathBuf>,
    /// Host RAM that offloaded modules may fill (`29GiB`), in place of the profile's `host: {ram:}`;
    /// where neither says, a plan that offloads assumes 64 GiB and says so.
    #[arg(long, value_name = "SIZE")]
    host_ram: Option<String>,
    /// Disk that offloaded modules may fill (`73GB`), in place of the profile's `host: {disk:}`;
    /// where neither says, a plan that offloads assumes 4 TiB and says so.
    #[arg(long, value_name = "SIZE")]
    disk: Option<String>,
}

impl SolveOptions {
    /// The host figures given on the command line, set on every node of `hardware`.
    fn apply_host(
        &self,
        hardware: &mut vramplan_profiles::hardware::HardwareProfile,
    ) -> Result<(), InputError> {
        let read = |key: &str, text: &Option<String>| -> Result<Option<u64>, InputError> {
            text.as_deref()
                .map(|t| {
                    vramplan_profiles::units::parse_bytes(t).map_err(|e| {
                        InputError::new(key, e)
                            .with_fix(format!("give a size with its unit, e.g. `{key} 32GiB`"))
                    })
                })
                .transpose()
        };
        let (ram, disk) = (read("--host-ram", &self.host_ram)?, read("--disk", &self.disk)?);
        for node in &mut hardware.nodes {
            node.host.ram_bytes = ram.or(node.host.ram_bytes);
            node.host.disk_bytes = disk.or(node.host.disk_bytes);
        }
        Ok(())
    }
}

/// The line a plan that offloads adds where the host figures it used are vramplan's defaults,
/// not the profile's or the user's.
fn assumed_host(plan: &Plan, hardware: &vramplan_profiles::hardware::HardwareProfile) -> Option<String> {
    use vramplan_profiles::units::format_bytes;
    use vramplan_solver::Target;
    use vramplan_solver::build::{DEFAULT_HOST_DISK, DEFAULT_HOST_RAM};
    let host = hardware.nodes.first().map(|n| n.host).unwrap_or_default();
    let on = |tier: Target| plan.device_map.iter().any(|(_, t)| *t == tier);
    let mut assumed = Vec::new();
    if on(Target::Cpu) && host.ram_bytes.is_none() {
        assumed.push(format!("{} of RAM (--host-ram)", format_bytes(DEFAULT_HOST_RAM)));
    }
    if on(Target::Disk) && host.disk_bytes.is_none() {
        assumed.push(format!("{} of disk (--disk)", format_bytes(DEFAULT_HOST_DISK)));
    }
    (!assumed.is_empty()).then(|| {
        format!(
            "the plan offloads to a host the profile `{}` gives no figures for, and assumes {}: give the \
             machine's with those flags, or `host:` in a profile (docs/hardware-profiles.md)",
            hardware.name,
            assumed.join(" and ")
        )
    })
}

/// What `plan --json` prints.
#[derive(Serialize)]
struct PlanOutput<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline: Option<&'a Plan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    explanation: Option<&'a Explanation>,
    warnings: &'a [String],
    /// A generic model's label (`model::generic`).
    #[serde(skip_serializing_if = "Option::is_none")]
    generic: Option<vramplan_profiles::model::generic::Generic>,
}

/// A plan, with what it was solved from, accelerate's map beside it and why nothing fits.
pub(crate) struct Solved {
    pub loaded: Loaded,
    pub result: Plan,
    /// accelerate's `device_map="auto"` for accelerate targets (while time is left).
    pub baseline: Option<Plan>,
    /// Why nothing fits and what would, after a proof that nothing does.
    pub explanation: Option<Explanation>,
}

/// Runs `vramplan plan`.
pub(crate) fn run(args: &PlanArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let refuse = |loaded: &Loaded| {
        if vramplan_sim::estimate::is_data_parallel(&loaded.workload) {
            refuse_map_export(args, &loaded.workload)?;
        }
        Ok(())
    };
    let Solved { loaded: Loaded { model, workload, warnings, .. }, result, baseline, explanation } =
        solve(&args.inputs, &args.solve, refuse)?;
    let mut written_map = None;
    if let Some(path) = &args.output
        && result.verdict == Verdict::Fits
    {
        let format = match &args.format {
            Some(f) => Format::parse(f)?,
            None => Format::for_output(&path.display().to_string(), &result),
        };
        let exported = export(&result, format, &args.inputs.model, &args.inputs.hardware, &workload)?;
        crate::write_atomic(path, exported.text.as_bytes())?;
        if format == Format::Accelerate {
            written_map = Some(path.display().to_string());
        }
    }
    let text = if args.json {
        crate::json_text(&PlanOutput {
            plan: &result,
            baseline: baseline.as_ref(),
            explanation: explanation.as_ref(),
            warnings: &warnings,
            generic: vramplan_profiles::model::generic::of(&model),
        })
    } else {
        let mut text = vramplan_profiles::model::generic::line(&model)
            + &vramplan_reports::plan_table(&result, baseline.as_ref(), explanation.as_ref(), &warnings);
        if let Some(file) = &written_map {
            text += &vramplan_reports::accelerate_loading(file, &model, &result.device_map, &workload);
        }
        text
    };
    crate::print(out, &text)?;
    Ok(match result.verdict {
        Verdict::Fits => 0,
        Verdict::DoesNotFit => crate::EXIT_NEGATIVE,
        Verdict::Unknown => crate::EXIT_NO_ANSWER,
    })
}

/// Reads the inputs and solves the plan `args` asks for, with the baseline and the
/// explanation; `before` may refuse the inputs once read, before anything is solved.
pub(crate) fn solve(
    inputs: &Inputs,
    args: &SolveOptions,
    before: impl FnOnce(&Loaded) -> Result<(), InputError>,
) -> Result<Solved, InputError> {
    // What is left of `--time-limit`, for the next stage.
    let deadline = deadline_after(args.time_limit);
    let left = || seconds_left(deadline);
    let runtime = Runtime::parse(&args.target)?;
    let solver = match args.solver.as_str() {
        "ilp" => SolverKind::Ilp,
        "greedy" => SolverKind::Greedy,
        other => {
            return Err(InputError::new("--solver", format!("unknown solver `{other}`"))
                .with_fix("use `ilp` (exact) or `greedy` (accelerate's algorithm)"));
        }
    };
    let mut loaded = inputs.load(runtime.naming(), None)?;
    args.apply_host(&mut loaded.hardware)?;
    before(&loaded)?;
    let Loaded { model, hardware, workload, .. } = &loaded;
    let data_parallel = vramplan_sim::estimate::is_data_parallel(workload);
    let mut request = Request::new(runtime);
    request.headroom = parse_headroom(args.headroom.as_deref().unwrap_or("10%"))?;
    request.offload = !args.no_offload;
    request.min_devices = args.min_devices;
    let gpus = hardware.devices.len() as u32;
    request.pins = args.pin.iter().map(|p| parse_pin(p, gpus)).collect::<Result<_, _>>()?;
    if let Some(path) = &args.expert_load {
        request.expert_load = read_expert_load(path, model, runtime)?;
    }
    if let Some(limit) = args.time_limit
        && !(limit > 0.0 && limit.is_finite())
    {
        return Err(InputError::new("--time-limit", format!("{limit} is not a positive number of seconds"))
            .with_fix("give seconds, e.g. `--time-limit 5`"));
    }
    let relative_gap = match &args.gap {
        Some(text) => parse_gap(text)?,
        None => Settings::default().relative_gap,
    };
    let settings = Settings { solver, time_limit_s: left(), relative_gap };
    let result = plan(model, hardware, workload, &request, &settings)?;
    // The baseline (no ILP, but a simulation) only while time is left; when the plan already
    // is accelerate's map (the ILP found nothing within its charges), that map.
    let baseline = if data_parallel {
        None
    } else if solver == SolverKind::Ilp && result.solver.kind == SolverKind::Greedy {
        Some(result.clone())
    } else if solver == SolverKind::Ilp
        && matches!(runtime, Runtime::Accelerate | Runtime::AccelerateV4)
        && left().is_none_or(|s| s > 0.0)
    {
        plan(model, hardware, workload, &request, &Settings { solver: SolverKind::Greedy, ..settings }).ok()
    } else {
        None
    };
    // Why, and what would fit, only after a proof that nothing does: the ILP's. The greedy
    // baseline's map running out proves nothing about other maps. The remedies get their usual
    // budget, or less where less of `--time-limit` is left: a limit is a ceiling, and a longer
    // one is for the plan, not for more probes.
    let explanation = (result.verdict == Verdict::DoesNotFit && solver == SolverKind::Ilp && !data_parallel)
        .then(|| {
            let budget = left().map_or(DEFAULT_BUDGET_S, |s| s.min(DEFAULT_BUDGET_S));
            explain(model, hardware, workload, &request, &Settings { time_limit_s: Some(budget), ..settings })
        });
    for plan in std::iter::once(&result).chain(baseline.as_ref()) {
        if let Some(line) = assumed_host(plan, &loaded.hardware)
            && !loaded.warnings.contains(&line)
        {
            loaded.warnings.push(line);
        }
    }
    Ok(Solved { loaded, result, baseline, explanation })
}

/// Under data parallelism there is no device map to write: every rank loads the whole model on
/// its own GPU (`device_map={"": local_rank}`, a different map per rank, so no one file serves
/// them), and DeepSpeed ZeRO-3 and FSDP take none at all. `-o` writes only vramplan's YAML plan
/// (which `estimate --plan` reads back); any other format is refused before solving.
fn refuse_map_export(args: &PlanArgs, workload: &vramplan_sim::workload::Workload) -> Result<(), InputError> {
    let Some(path) = &args.output else { return Ok(()) };
    let name = path.display().to_string();
    let (format, key) = match &args.format {
        Some(f) => (Format::parse(f)?, "--format"),
        None if name.ends_with(".yaml") || name.ends_with(".yml") => (Format::Yaml, "-o"),
        None => (Format::Accelerate, "-o"),
    };
    if format == Format::Yaml {
        return Ok(());
    }
    let flag = vramplan_solver::plan::parallel_flag(workload.parallelism);
    let why = match workload.parallelism {
        vramplan_sim::workload::Parallelism::Zero { stage: 3, .. } => {
            "DeepSpeed ZeRO-3 and FSDP shard the weights as they load them and take no device map".to_string()
        }
        _ => "every rank loads the whole model on its own GPU (`device_map={\"\": local_rank}`), so there is no \
              layer split to write"
            .to_string(),
    };
    Err(InputError::new(key, format!("--parallel {flag} needs no device map: {why}"))
        .with_fix("write the plan as YAML (`-o plan.yaml`), or use `--parallel single` for a map that splits one copy of the model"))
}

/// `--headroom`: `10%` (an explicit percentage) or `0.1` (a share below 1) → 0.1, from 0 to
/// 90 % ([`parse_share`]).
pub(crate) fn parse_headroom(text: &str) -> Result<f64, InputError> {
    parse_share("--headroom", text, 0.9, "of memory")
}

/// `--gap`: the solver's tolerance, as `--headroom` is written, from 0 to 50 %.
fn parse_gap(text: &str) -> Result<f64, InputError> {
    parse_share("--gap", text, 0.5, "of the best plan")
}

/// `10%` (an explicit percentage) or `0.1` (a share below 1) → 0.1, from 0 to `max`, for
/// `flag`. A bare number of 1 or more is refused: `2` could mean 2 % or 200 %, and one
/// spelling has one meaning.
fn parse_share(flag: &str, text: &str, max: f64, of: &str) -> Result<f64, InputError> {
    let range = format!("keep from 0 to {:.0} %, e.g. `{flag} 10%` or `{flag} 0.1`", max * 100.0);
    let bad = |what: &str| InputError::new(flag, format!("`{text}` {what}")).with_fix(range.clone());
    let trimmed = text.trim();
    let (number, percent) = match trimmed.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (trimmed, false),
    };
    let not_a_share = format!("is not a share {of}");
    let value: f64 = number.parse().map_err(|_| bad(&not_a_share))?;
    if !value.is_finite() {
        return Err(bad(&not_a_share));
    }
    if !percent && value >= 1.0 {
        return Err(InputError::new(
            flag,
            format!("`{text}` is ambiguous: a bare number is a share {of} below 1, a percentage needs `%`"),
        )
        .with_fix(format!("write `{number}%` for {number} percent, or `{}` as a share", value / 100.0)));
    }
    let share = if percent { value / 100.0 } else { value };
    if !(0.0..=max).contains(&share) {
        return Err(bad(&format!("is outside 0 to {:.0} % {of}", max * 100.0)));
    }
    Ok(share)
}

/// Reads `--expert-load`: `{"model.layers.3.mlp.experts": [tokens per expert, …], …}`, one
/// entry per MoE layer (keyed by its experts module or its block), each with one finite,
/// non-negative load per routed expert. Refused on a dense model and for a target that does
/// not read it (only `expert-parallel` places experts one by one).
fn read_expert_load(
    path: &Path,
    model: &vramplan_profiles::model::ModelDescription,
    runtime: Runtime,
) -> Result<BTreeMap<String, Vec<f64>>, InputError> {
    let origin = path.display().to_string();
    let Some(moe) = &model.facts.moe else {
        return Err(InputError::new(
            "--expert-load",
            format!("{} is a dense model: it has no experts to load", model.name),
        )
        .with_fix("leave out --expert-load; it is for mixture-of-experts models"));
    };
    if runtime != Runtime::ExpertParallel {
        return Err(InputError::new(
            "--expert-load",
            format!("--target {} places whole layers and would ignore the expert loads", runtime.name()),
        )
        .with_fix("add `--target expert-parallel`, or leave out --expert-load"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| InputError::io(path, &e))?;
    let example =
        "write `{\"model.layers.3.mlp.experts\": [1200, 800, …]}`: tokens per expert, per MoE layer";
    let loads: BTreeMap<String, Vec<f64>> =
        serde_json::from_str(&text).map_err(|e| InputError::json(origin.clone(), &e).with_fix(example))?;
    // Each MoE layer: its block path and its experts module's path.
    let layers: Vec<(String, String)> = model
        .facts
        .layers
        .iter()
        .filter(|l| l.moe)
        .map(|l| {
            let experts = experts_module(model, &l.path).map_or_else(|| l.path.clone(), |m| m.path.clone());
            (l.path.clone(), experts)
        })
        .collect();
    let at = |key: &str, problem: String| {
        let e = InputError::new(origin.clone(), problem);
        match vramplan_sim::device_map::locate_key(&text, key, 0) {
            Some((line, column)) => e.at_line(line, column),
            None => e.at_key(key),
        }
    };
    let mut seen: BTreeMap<usize, &str> = BTreeMap::new();
    for (key, values) in &loads {
        let Some(layer) = layers.iter().position(|(block, experts)| key == block || key == experts) else {
            let first = layers.first().map_or("model.layers.0.mlp.experts", |(_, e)| e.as_str());
            return Err(at(key, format!("`{key}` is not a MoE layer of {}", model.name))
                .with_fix(format!("key each MoE layer by its experts module, e.g. `{first}`")));
        };
        if let Some(other) = seen.insert(layer, key) {
            return Err(at(key, format!("`{key}` and `{other}` are the same layer"))
                .with_fix("give each MoE layer once"));
        }
        if values.len() != moe.experts as usize {
            return Err(at(
                key,
                format!(
                    "`{key}` has {} loads, but {} has {} routed experts per layer",
                    values.len(),
                    model.name,
                    moe.experts
                ),
            )
            .with_fix(format!(
                "give {} numbers, the tokens routed to each expert in expert order",
                moe.experts
            )));
        }
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0)) {
            return Err(at(key, format!("`{key}`[{i}] is {v}: a load counts tokens, a finite number ≥ 0"))
                .with_fix("give the tokens routed to each expert, 0 for an expert that got none"));
        }
    }
    let missing: Vec<&str> = layers
        .iter()
        .enumerate()
        .filter(|(i, _)| !seen.contains_key(i))
        .map(|(_, (_, e))| e.as_str())
        .collect();
    if !missing.is_empty() {
        let shown: Vec<&str> = missing.iter().take(3).copied().collect();
        let more = if missing.len() > 3 { ", …" } else { "" };
        return Err(InputError::new(
            origin,
            format!(
                "no loads for {} of the {} MoE layers of {}: {}{more}",
                missing.len(),
                layers.len(),
                model.name,
                shown.join(", ")
            ),
        )
        .with_fix("give every MoE layer's loads, measured over the same tokens"));
    }
    Ok(loads)
}
