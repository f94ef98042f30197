//! `vramplan plan MODEL --hardware HW [WORKLOAD] [--target T] [--headroom P] [--pin M=D]
//! [--solver ilp|greedy] [-o FILE [--format F]] [--json]`: the solving options as a
//! `vramplan-api` request; prints the plan (with accelerate's greedy map beside it for
//! accelerate targets) and writes the export atomically. Exit 0 with a plan that fits (optimal,
//! or the best found within `--time-limit`, with its gap), 1 when nothing fits, proven (with the
//! remedies), 4 when `--time-limit` (60 s unless given) ran out before either.

use crate::estimate::Inputs;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use vramplan_api::{InputError, PlanRequest};
use vramplan_solver::export::Format;

#[derive(Args, Debug)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    inputs: Inputs,
    #[command(flatten)]
    solve: SolveOptions,
    /// Write the plan here (atomically).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// accelerate | llama.cpp | expert-parallel | pipeline | yaml | vllm | sglang | deepspeed |
    /// fsdp | torchrun (default: from the file name and the target; `.sh` is the workload's
    /// launch: torchrun for training, vllm under `--engine vllm`). deepspeed and fsdp write their launch lines
    /// beside the config (`ds.json` → `ds.sh`).
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
    /// share below 1); a bare `2` is refused (write `2%` or `0.02`). Default 10 % (under
    /// `--engine vllm` or `sglang`, 0: the engine keeps its own `1 − gpu_memory_utilization`
    /// free and fills the rest with KV cache; for `plot sweep` and `plot grid`, 0, as `whatif`
    /// judges).
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
    /// its proven gap; with none found and nothing proven, exit 4. Every plan of the bench grid
    /// takes under a second, so the default only stops what would otherwise run on.
    #[arg(long, value_name = "SECONDS", default_value_t = vramplan_api::DEFAULT_TIME_LIMIT_S)]
    time_limit: f64,
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
    /// The API's solving options.
    pub(crate) fn request(&self) -> vramplan_api::SolveOptions {
        vramplan_api::SolveOptions {
            target: self.target.clone(),
            headroom: self.headroom.clone(),
            pin: self.pin.clone(),
            no_offload: self.no_offload,
            min_devices: self.min_devices,
            time_limit: Some(self.time_limit),
            gap: self.gap.clone(),
            solver: self.solver.clone(),
            expert_load: self.expert_load.clone(),
            host_ram: self.host_ram.clone(),
            disk: self.disk.clone(),
        }
    }
}

/// Runs `vramplan plan`.
pub(crate) fn run(args: &PlanArgs, out: &mut dyn Write) -> Result<i32, InputError> {
    let request = PlanRequest {
        inputs: args.inputs.request(),
        solve: args.solve.request(),
        output: args.output.as_ref().map(|p| p.display().to_string()),
        format: args.format.clone(),
    };
    let solved = vramplan_api::plan(&request)?;
    let mut written_map = None;
    if let (Some(path), Some((format, exported))) = (&args.output, &solved.export) {
        // The export and its launch script together: both written, or neither.
        let launch = vramplan_solver::export::launch_path(path);
        let mut files: Vec<(&std::path::Path, &[u8])> = vec![(path.as_path(), exported.text.as_bytes())];
        if let Some(script) = &exported.launch {
            files.push((launch.as_path(), script.as_bytes()));
        }
        crate::write_all_atomic(&files)?;
        if *format == Format::Accelerate {
            written_map = Some(path.display().to_string());
        }
    }
    let text = if args.json {
        solved.to_json()
    } else {
        let (model, workload, warnings) =
            (&solved.loaded.model, &solved.loaded.workload, &solved.loaded.warnings);
        let mut text = vramplan_profiles::model::generic::line(model)
            + &vramplan_reports::plan_table(
                &solved.result,
                solved.baseline.as_ref(),
                solved.explanation.as_ref(),
                warnings,
            );
        if let Some(file) = &written_map {
            text += &vramplan_reports::accelerate_loading(file, model, &solved.result.device_map, workload);
        }
        if let Some(launch) = &solved.launch {
            text +=
                &vramplan_reports::launch_lines(&launch.format, &launch.commands, launch.refused.as_deref());
        }
        text
    };
    crate::print(out, &text)?;
    Ok(solved.outcome().exit_code())
}
