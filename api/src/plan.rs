//! `plan`: reads the inputs, asks the solver for a placement, with accelerate's greedy map
//! beside it for accelerate targets and, after a proof that nothing fits, why and what would
//! (the remedies), and renders the export `-o` writes. The time limit bounds the whole command:
//! the ILP and its refinement rounds, the greedy baseline and the remedy probes share one
//! deadline. Under data parallelism (`--parallel ddp`, `zero1`–`zero3`, `fsdp`) nothing is
//! placed: each GPU is a rank judged on its own memory, no baseline or remedies are run, and no
//! device map is exported (only the YAML plan and the launch exports: DeepSpeed, FSDP, torchrun).

use crate::expert_load::read_expert_load;
use crate::inputs::{Inputs, Loaded};
use crate::shares::{parse_gap, parse_headroom};
use crate::{InputError, Outcome};
use serde::Serialize;
use std::path::PathBuf;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_solver::Runtime;
use vramplan_solver::build::{Request, parse_pin};
use vramplan_solver::explain::{DEFAULT_BUDGET_S, Explanation, explain};
use vramplan_solver::export::launch::Launch;
use vramplan_solver::export::{Export, Format, Source, export};
use vramplan_solver::plan::{
    Plan, Settings, SolverKind, Verdict, deadline_after, plan as solve_plan, seconds_left,
};

/// The time limit of `plan` (and of the plans `plot` and `report` make) where none is given,
/// in seconds. Every case of the plan grid bench (`cli/benches/plan_grid.rs`, README "Speed")
/// answers in under a second, so a minute stops only what would otherwise run on (a MIP that
/// finds no proof), and still answers with the best plan found and its gap.
pub const DEFAULT_TIME_LIMIT_S: f64 = 60.0;

/// How a plan is solved: the runtime, the headroom, pins, offload and the solver's limits, as
/// the flags write them.
#[derive(Debug, Clone)]
pub struct SolveOptions {
    /// The runtime the plan is for: accelerate (default) | accelerate-v4 | llama.cpp |
    /// expert-parallel | pipeline.
    pub target: String,
    /// Share of each GPU's usable memory kept free, 0 to 90 %: `10%` or `0.1`. Default 10 %
    /// (under a serving engine, 0: vLLM and SGLang keep their own share free and fill the rest
    /// with KV cache; for `plot sweep` and `plot grid`, 0, as `whatif` judges).
    pub headroom: Option<String>,
    /// Modules fixed to devices: `lm_head=0`, `model.layers.28-31=cpu`.
    pub pin: Vec<String>,
    /// Never place modules on the CPU or disk.
    pub no_offload: bool,
    /// Among equally balanced plans, use the fewest GPUs.
    pub min_devices: bool,
    /// Seconds the whole command may take: the best plan found by then, with its gap.
    /// [`DEFAULT_TIME_LIMIT_S`] by default; `None` for no limit.
    pub time_limit: Option<f64>,
    /// The solver's tolerance, `1%` (default) or `0.01`; `0` for exact.
    pub gap: Option<String>,
    /// ilp (exact, default) | greedy (accelerate's `device_map="auto"`).
    pub solver: String,
    /// Tokens routed to each expert, per MoE layer: JSON `{"model.layers.3.mlp.experts": [..]}`.
    pub expert_load: Option<PathBuf>,
    /// Host RAM offloaded modules may fill (`29GiB`), in place of the profile's.
    pub host_ram: Option<String>,
    /// Disk offloaded modules may fill (`73GB`), in place of the profile's.
    pub disk: Option<String>,
}

impl Default for SolveOptions {
    fn default() -> SolveOptions {
        SolveOptions {
            target: "accelerate".into(),
            headroom: None,
            pin: Vec::new(),
            no_offload: false,
            min_devices: false,
            time_limit: Some(DEFAULT_TIME_LIMIT_S),
            gap: None,
            solver: "ilp".into(),
            expert_load: None,
            host_ram: None,
            disk: None,
        }
    }
}

impl SolveOptions {
    /// The host figures given, set on every node of `hardware`.
    fn apply_host(&self, hardware: &mut HardwareProfile) -> Result<(), InputError> {
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

/// What `plan` reads.
#[derive(Debug, Clone, Default)]
pub struct PlanRequest {
    /// The model, hardware and workload.
    pub inputs: Inputs,
    /// How the plan is solved.
    pub solve: SolveOptions,
    /// The name of the file `-o` writes, when one is: with the target, its extension picks the
    /// export's format (`.yaml` for vramplan's plan), and the export is rendered into
    /// [`PlanResult::export`] when the plan fits.
    pub output: Option<String>,
    /// The export's format, in place of the file name's: accelerate | llama.cpp |
    /// expert-parallel | pipeline | yaml | vllm | sglang | deepspeed | fsdp | torchrun.
    pub format: Option<String>,
}

/// A plan, with what it was solved from, accelerate's map beside it and why nothing fits.
#[derive(Debug, Clone)]
pub struct PlanResult {
    /// The inputs as read (the warnings include the host figures a plan assumed).
    pub loaded: Loaded,
    /// The plan.
    pub result: Plan,
    /// accelerate's `device_map="auto"` for accelerate targets (while time is left).
    pub baseline: Option<Plan>,
    /// Why nothing fits and what would, after a proof that nothing does.
    pub explanation: Option<Explanation>,
    /// The export for [`PlanRequest::output`] in its format, when the plan fits.
    pub export: Option<(Format, Export)>,
    /// The command each node runs to launch a serving or DDP plan that fits.
    pub launch: Option<Launched>,
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
    /// Each node's launch line ([`PlanResult::launch`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    launch: Option<&'a Launched>,
    /// `from_pretrained`'s other arguments that load the map as it is (accelerate targets,
    /// where a transformers class loads the model); `null` where another program loads it
    /// (`loaded_by` says which); absent where there is no map a transformers class loads.
    #[serde(skip_serializing_if = "Option::is_none")]
    load_kwargs: Option<Option<vramplan_solver::whatif::LoadKwargs>>,
    /// The program other than transformers that loads the model ([`PlanResult::loaded_by`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    loaded_by: Option<LoadedBy>,
}

/// Which program loads the model of a plan whose map a transformers class would otherwise load
/// (`--trainer` other than `transformers`, `--awq-fused`): `plan --json`'s `loaded_by`, beside a
/// `load_kwargs` of `null`, as `plan -o` prints a comment in place of `from_pretrained`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadedBy {
    /// The program, by the word its flag takes (`torchtune`, `unsloth`, `litgpt`,
    /// `fsdp-qlora`) or its name (`AutoAWQ` under `--awq-fused`).
    pub program: String,
    /// Why no transformers arguments are given.
    pub reason: String,
}

impl PlanResult {
    /// What `plan --json` prints.
    pub fn to_json(&self) -> String {
        crate::json_text(&PlanOutput {
            plan: &self.result,
            baseline: self.baseline.as_ref(),
            explanation: self.explanation.as_ref(),
            warnings: &self.loaded.warnings,
            generic: vramplan_profiles::model::generic::of(&self.loaded.model),
            load_kwargs: self.loads_with_transformers().then(|| self.load_kwargs()),
            loaded_by: self.loaded_by(),
            launch: self.launch.as_ref(),
        })
    }

    /// Whether the plan's map is one a transformers class would load: an accelerate target's
    /// non-empty map of a model transformers has a class for.
    fn loads_with_transformers(&self) -> bool {
        let accelerate = matches!(self.result.target, Runtime::Accelerate | Runtime::AccelerateV4);
        let loads = vramplan_solver::whatif::pretrained_source(&self.loaded.model).is_some();
        accelerate && loads && !self.result.device_map.is_empty()
    }

    /// `from_pretrained`'s other keyword arguments that load the plan's device map as it is
    /// (`dtype`, the quantization config, `offload_folder`): for a map of an accelerate target
    /// that a transformers class loads; `None` otherwise, and where another program loads the
    /// model ([`PlanResult::loaded_by`]).
    pub fn load_kwargs(&self) -> Option<vramplan_solver::whatif::LoadKwargs> {
        let workload = &self.loaded.workload;
        (self.loads_with_transformers() && vramplan_solver::whatif::loading_program(workload).is_none()).then(
            || vramplan_solver::whatif::LoadKwargs::of(&self.loaded.model, &self.result.device_map, workload),
        )
    }

    /// The program other than transformers that loads the model where the plan's map would
    /// otherwise be loaded by a transformers class (`--trainer` torchtune, unsloth, litgpt,
    /// fsdp-qlora; AutoAWQ under `--awq-fused`), and why no `load_kwargs` are given.
    pub fn loaded_by(&self) -> Option<LoadedBy> {
        let program = vramplan_solver::whatif::loading_program(&self.loaded.workload)
            .filter(|_| self.loads_with_transformers())?;
        let reason = vramplan_solver::whatif::loaded_by_reason(&program);
        Some(LoadedBy { program, reason })
    }

    /// Fits (optimal, or the best within the time limit), does not fit (proven), or no answer.
    pub fn outcome(&self) -> Outcome {
        match self.result.verdict {
            Verdict::Fits => Outcome::Positive,
            Verdict::DoesNotFit => Outcome::Negative,
            Verdict::Unknown => Outcome::NoAnswer,
        }
    }
}

/// `vramplan plan`: the plan, the baseline, the remedies, and the export for `-o`.
pub fn plan(request: &PlanRequest) -> Result<PlanResult, InputError> {
    let refuse = |loaded: &Loaded| {
        if vramplan_sim::estimate::is_data_parallel(&loaded.workload) {
            refuse_map_export(request, &loaded.workload)?;
        }
        Ok(())
    };
    let mut solved = solve(&request.inputs, &request.solve, refuse)?;
    if let Some(name) = &request.output
        && solved.result.verdict == Verdict::Fits
    {
        let format = match &request.format {
            Some(f) => Format::parse(f)?,
            None => Format::for_output(name, &solved.result, &solved.loaded.workload),
        };
        let exported = solved.export_as(format, name, &request.inputs)?;
        solved.export = Some((format, exported));
    }
    solved.launch = solved.launch_commands(&request.inputs);
    Ok(solved)
}

impl PlanResult {
    /// The plan written as `format` to the file `name`.
    fn export_as(&self, format: Format, name: &str, inputs: &Inputs) -> Result<Export, InputError> {
        let hardware = &self.loaded.hardware;
        let source = Source {
            model: inputs.model.spec(),
            hardware: &inputs.hardware,
            file: name,
            launch: Launch {
                source: vramplan_solver::whatif::pretrained_source(&self.loaded.model),
                prequantized: vramplan_solver::whatif::prequantized(
                    &self.loaded.model,
                    &self.loaded.workload.quant,
                    false,
                ),
                gpus_per_node: hardware
                    .nodes
                    .iter()
                    .map(|n| hardware.devices_of(n.index).count() as u32)
                    .collect(),
                workload: &self.loaded.workload,
            },
        };
        export(&self.result, format, &source)
    }

    /// The command each node runs to launch a plan that fits and has nothing to place: a
    /// serving engine's (`vllm serve`, SGLang's `launch_server`) or DDP's `torchrun`, as `-o`
    /// writes them; `None` for other plans, or where the layout has no such line.
    fn launch_commands(&self, inputs: &Inputs) -> Option<Launched> {
        use vramplan_sim::workload::{Engine, Mode, Parallelism};
        if self.result.verdict != Verdict::Fits {
            return None;
        }
        let w = &self.loaded.workload;
        let (format, name) = match (&w.engine, w.mode, w.parallelism) {
            (Engine::Vllm { .. }, Mode::Inference, _) => (Format::Vllm, "vllm"),
            (Engine::Sglang { .. }, Mode::Inference, _) => (Format::Sglang, "sglang"),
            (Engine::Transformers, Mode::Train, Parallelism::Ddp) => (Format::Torchrun, "torchrun"),
            _ => return None,
        };
        Some(match self.export_as(format, "launch.sh", inputs) {
            Ok(exported) => Launched { format: name.to_string(), commands: exported.commands, refused: None },
            Err(e) => Launched { format: name.to_string(), commands: Vec::new(), refused: Some(e.problem) },
        })
    }
}

/// The launch lines of a plan ([`PlanResult::launch`]): what `-o FILE --format FORMAT` writes,
/// as commands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launched {
    /// The `--format` that writes them to a file (`vllm`, `sglang`, `torchrun`).
    pub format: String,
    /// The command each node runs, node 0 first; empty where the export refuses the layout.
    pub commands: Vec<String>,
    /// Why no launch can be written for this layout (the export's refusal), where it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The line a plan that offloads adds where the host figures it used are vramplan's defaults,
/// not the profile's or the user's.
fn assumed_host(plan: &Plan, hardware: &HardwareProfile) -> Option<String> {
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

/// Reads the inputs and solves the plan `args` asks for, with the baseline and the
/// explanation; `before` may refuse the inputs once read, before anything is solved.
pub(crate) fn solve(
    inputs: &Inputs,
    args: &SolveOptions,
    before: impl FnOnce(&Loaded) -> Result<(), InputError>,
) -> Result<PlanResult, InputError> {
    // What is left of the time limit, for the next stage.
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
    // vLLM and SGLang size their KV cache to fill the share of memory they are given and keep
    // the rest free themselves: a headroom on top would refuse every plan they make.
    let serving = matches!(
        workload.engine,
        vramplan_sim::workload::Engine::Vllm { .. } | vramplan_sim::workload::Engine::Sglang { .. }
    );
    let default_headroom = if serving { "0%" } else { "10%" };
    request.headroom = parse_headroom(args.headroom.as_deref().unwrap_or(default_headroom))?;
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
    let result = solve_plan(model, hardware, workload, &request, &settings)?;
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
        solve_plan(model, hardware, workload, &request, &Settings { solver: SolverKind::Greedy, ..settings })
            .ok()
    } else {
        None
    };
    // Why, and what would fit, only after a proof that nothing does: the ILP's. The greedy
    // baseline's map running out proves nothing about other maps. The remedies get their usual
    // budget, or less where less of the time limit is left: a limit is a ceiling, and a longer
    // one is for the plan, not for more probes.
    let explanation = (result.verdict == Verdict::DoesNotFit && solver == SolverKind::Ilp && !data_parallel)
        .then(|| {
            let budget = left().map_or(DEFAULT_BUDGET_S, |s| s.min(DEFAULT_BUDGET_S));
            explain(model, hardware, workload, &request, &Settings { time_limit_s: Some(budget), ..settings })
        });
    if let Some(layout) = &result.serving {
        crate::inputs::merge_warnings(&mut loaded.warnings, layout.warnings.clone());
    }
    for plan in std::iter::once(&result).chain(baseline.as_ref()) {
        if let Some(line) = assumed_host(plan, &loaded.hardware)
            && !loaded.warnings.contains(&line)
        {
            loaded.warnings.push(line);
        }
    }
    Ok(PlanResult { loaded, result, baseline, explanation, export: None, launch: None })
}

/// Under data parallelism there is no device map to write: every rank loads the whole model on
/// its own GPU (`device_map={"": local_rank}`, a different map per rank, so no one file serves
/// them), and DeepSpeed ZeRO-3 and FSDP take none at all. `-o` writes only vramplan's YAML plan
/// (which `estimate --plan` reads back); any other format is refused before solving.
fn refuse_map_export(
    request: &PlanRequest,
    workload: &vramplan_sim::workload::Workload,
) -> Result<(), InputError> {
    let Some(name) = &request.output else { return Ok(()) };
    let (format, key) = match &request.format {
        Some(f) => (Format::parse(f)?, "--format"),
        None if name.ends_with(".yaml") || name.ends_with(".yml") => (Format::Yaml, "-o"),
        None if name.ends_with(".sh") => return Ok(()),
        None => (Format::Accelerate, "-o"),
    };
    if format == Format::Yaml || format.launches() {
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
