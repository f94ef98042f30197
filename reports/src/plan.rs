//! `vramplan plan`'s report: the solver's verdict and numbers, then per device the units it
//! holds and its memory by component; accelerate's greedy map beside it for comparison; when
//! nothing fits (proven), where it runs out and the verified remedies; and when the time limit
//! came before an answer, the best placement found so far, if any, and no verdict. A
//! data-parallel plan (DDP, ZeRO, FSDP) reads as each rank against its own GPU, and why it
//! needs no device map; a serving engine's (vLLM, SGLang) as its layout, its KV cache and each
//! rank against its GPU.
//!
//! A greedy map over its limit is said as what it is: a GPU whose simulated peak passes its
//! usable memory "runs out of memory"; one past the headroom but within its memory is "past the
//! 10 % headroom". Neither is a proof that no map fits, and the words say so.

use crate::table::Table;
use vramplan_profiles::units::format_bytes;
use vramplan_sim::workload::Parallelism;
use vramplan_solver::Target;
use vramplan_solver::explain::{Bitsandbytes, Change, Explanation, Quantization, SEQ_STEP, Shortfall};
use vramplan_solver::ilp::{Stage, StageStatus};
use vramplan_solver::plan::{
    Plan, PlanDevice, ServingLayout, SolverKind, SolverReport, Unanswered, Verdict, parallel_flag,
};

/// The human report of a plan.
pub fn plan_table(
    plan: &Plan,
    baseline: Option<&Plan>,
    explanation: Option<&Explanation>,
    warnings: &[String],
) -> String {
    plan_text(plan, baseline, explanation, warnings, true)
}

/// [`plan_table`] without the solver's time, for documents that must read the same each time
/// they are made (`vramplan report`).
pub fn plan_table_untimed(
    plan: &Plan,
    baseline: Option<&Plan>,
    explanation: Option<&Explanation>,
    warnings: &[String],
) -> String {
    plan_text(plan, baseline, explanation, warnings, false)
}

fn plan_text(
    plan: &Plan,
    baseline: Option<&Plan>,
    explanation: Option<&Explanation>,
    warnings: &[String],
    timed: bool,
) -> String {
    let time = |seconds: f64| if timed { format!("{:.1} ms", seconds * 1e3) } else { String::new() };
    if let Some(parallelism) = &plan.data_parallel {
        return data_parallel_table(plan, parallelism, warnings, &time(plan.solver.seconds));
    }
    if let Some(layout) = &plan.serving {
        return serving_table(plan, layout, warnings, &time(plan.solver.seconds));
    }
    let s = &plan.solver;
    // The greedy baseline's map over its limit proves nothing about other maps.
    let greedy_over = s.kind == SolverKind::Greedy && plan.verdict == Verdict::DoesNotFit;
    let verdict = if greedy_over {
        format!(
            "accelerate's map {}; that is its greedy map, not a proof that no map fits (`--solver ilp` searches them all)",
            overruns(plan)
        )
    } else {
        match (plan.verdict, plan.unanswered) {
            (Verdict::Fits, _) => "fits".to_string(),
            (Verdict::DoesNotFit, _) => "does not fit".to_string(),
            (Verdict::Unknown, Some(Unanswered::Refinement)) => {
                "no answer: the replay kept a device over its limit after refining the plan".to_string()
            }
            (Verdict::Unknown, Some(Unanswered::NotProven)) => {
                "no answer: no placement fits the solver's charges, which over-count the step, and none is \
                 proven impossible"
                    .to_string()
            }
            (Verdict::Unknown, _) => "no answer within the time limit".to_string(),
        }
    };
    let more_time = plan.unanswered == Some(Unanswered::TimeLimit);
    // A solve that found no plan has no objective to print (NaN from HiGHS).
    let figures = if s.objective.is_finite() {
        format!(", objective {:.3}, bound {:.3}, gap {:.2}%", s.objective, s.bound, 100.0 * s.gap)
    } else {
        String::new()
    };
    let mut text = format!(
        "plan for {}: {}  (solver {:?}: {}{}{figures})\n\n",
        plan.target.name(),
        verdict,
        s.kind,
        s.status,
        if timed { format!(", {}", time(s.seconds)) } else { String::new() },
    );
    let placed = !plan.device_map.is_empty() || plan.devices.iter().any(|d| !d.units.is_empty());
    match plan.verdict {
        Verdict::Fits => {
            text += &devices_table(&plan.devices);
            if plan.offloaded_bytes > 0 {
                text += &format!("offloaded: {}\n", format_bytes(plan.offloaded_bytes));
            }
            if s.status == "time_limit" {
                text += &format!("the best plan found within the time limit; {}\n", stage_gaps(s));
            } else if s.status == "feasible" {
                text += &format!(
                    "a plan, not proven within the {:.2}% tolerance (--gap); {}\n",
                    100.0 * s.relative_gap,
                    stage_gaps(s)
                );
            }
        }
        Verdict::Unknown if placed => {
            text += "the best placement found so far (not within every limit; nothing is proven):\n";
            text += &devices_table(&plan.devices);
            if more_time {
                text += "give it more time (a larger --time-limit) for an answer\n";
            }
        }
        Verdict::Unknown if more_time => {
            text += "no placement was found and none was proven impossible within the time limit; \
                     give it more time (a larger --time-limit) for an answer\n";
        }
        Verdict::Unknown => {}
        Verdict::DoesNotFit if greedy_over => text += &devices_table(&plan.devices),
        Verdict::DoesNotFit => {}
    }
    if let Some(b) = baseline {
        text += "\naccelerate's device_map=\"auto\" for the same input (greedy baseline):\n";
        text += &devices_table(&b.devices);
        text += &if b.feasible {
            "  fits\n".to_string()
        } else if plan.verdict == Verdict::Fits {
            format!("  accelerate's map {}; the plan above fits\n", overruns(b))
        } else {
            format!("  accelerate's map {}\n", overruns(b))
        };
    }
    if let Some(e) = explanation {
        text += "\nwhy it does not fit (layers split evenly):\n";
        if e.shortfalls.is_empty() {
            text += "  no single device runs out in an even split, but no placement keeps every device within its limit\n";
        }
        for s in &e.shortfalls {
            text += &format!("  - {}\n", describe_shortfall(s));
        }
        text += "\nwhat would fit (each verified by solving again):\n";
        if e.remedies.is_empty() && e.undecided.is_empty() {
            text += "  nothing among: smaller batch or sequence, 8/4-bit weights, checkpointing, LoRA, more GPUs\n";
        } else if e.remedies.is_empty() {
            text += "  none verified within the time limit\n";
        }
        for r in &e.remedies {
            text += &format!(
                "  - {}: {}  (largest GPU at {:.0}%)\n",
                change_words(&r.change),
                change_flags(&r.change).unwrap_or_default(),
                100.0 * r.utilisation
            );
        }
        if !e.undecided.is_empty() {
            text += "\nnot decided (may or may not fit):\n";
            for u in &e.undecided {
                text += &format!("  - {}\n", change_words(u));
            }
        }
    }
    if !warnings.is_empty() {
        text += "\nwarnings:\n";
        for w in warnings {
            text += &format!("  - {w}\n");
        }
    }
    text
}

/// A data-parallel plan: nothing was placed, every GPU is a rank; its verdict, what a rank
/// holds, each rank against its own limit, and why no device map is written.
fn data_parallel_table(plan: &Plan, parallelism: &Parallelism, warnings: &[String], time: &str) -> String {
    let flag = parallel_flag(*parallelism);
    let verdict = match plan.verdict {
        Verdict::Fits => "fits".to_string(),
        _ => format!("does not fit: the step {}", overruns(plan)),
    };
    let mut text = format!(
        "plan for --parallel {flag}: {verdict}  (nothing to place, every GPU is a rank{})\n\n",
        if time.is_empty() { String::new() } else { format!("; {time}") }
    );
    text += &crate::data_parallel_line(parallelism, plan.devices.len()).unwrap_or_default();
    text += &devices_table(&plan.devices);
    let loads = match parallelism {
        Parallelism::Zero { stage: 3, .. } => {
            "DeepSpeed ZeRO-3 and FSDP shard the weights as they load them, and transformers refuses a device_map \
             under ZeRO-3"
        }
        _ => {
            "each rank loads the whole model on its own GPU: `from_pretrained(..., device_map={\"\": local_rank})`, \
             or `model.to(local_rank)` before wrapping it; a map that splits the model would put every rank's \
             copy on the same GPUs"
        }
    };
    text += &format!(
        "\nno device map: {loads}. `-o plan.yaml` keeps this plan (read back by `vramplan estimate --plan`).\n"
    );
    if !warnings.is_empty() {
        text += "\nwarnings:\n";
        for w in warnings {
            text += &format!("  - {w}\n");
        }
    }
    text
}

/// An engine or launcher as the reports name it (`vllm` → vLLM).
fn engine_display(name: &str) -> &str {
    match name {
        "vllm" => "vLLM",
        "sglang" => "SGLang",
        other => other,
    }
}

/// A serving engine's plan: its layout, the KV cache it holds, each rank against its limit.
fn serving_table(plan: &Plan, layout: &ServingLayout, warnings: &[String], time: &str) -> String {
    let engine = engine_display(&layout.engine);
    let mut shape = format!("tensor parallel {}", layout.tensor_parallel);
    if layout.pipeline_parallel > 1 {
        shape += &format!(" × pipeline parallel {}", layout.pipeline_parallel);
    }
    if layout.data_parallel > 1 {
        shape += &format!(" × {} replicas", layout.data_parallel);
    }
    let gpus = plan.devices.len();
    let verdict = match plan.verdict {
        Verdict::Fits => "fits".to_string(),
        _ => "does not fit".to_string(),
    };
    let how = match (layout.tensor_parallel, layout.pipeline_parallel) {
        (1, 1) => "the engine loads the model whole on each GPU it uses".to_string(),
        (_, 1) => "the engine shards every layer over its tensor-parallel group".to_string(),
        (1, _) => "the engine splits the layers over its pipeline stages".to_string(),
        _ => "the engine shards every layer over its tensor-parallel group and splits the layers over the \
              pipeline stages"
            .to_string(),
    };
    let mut text = format!(
        "plan for {engine} ({shape}, {gpus} GPU{}): {verdict}  (nothing to place: {how}{})\n\n",
        if gpus == 1 { "" } else { "s" },
        if time.is_empty() { String::new() } else { format!("; {time}") }
    );
    text += &format!("KV cache: {} tokens", crate::group_digits(layout.kv_capacity_tokens));
    text += match (layout.data_parallel, gpus) {
        (1, 1) => "\n".to_string(),
        (1, _) => " (on every rank: the smallest rank's)\n".to_string(),
        (dp, _) => format!(" in each of the {dp} replicas (on every rank: the smallest rank's)\n"),
    }
    .as_str();
    text += &devices_table(&plan.devices);
    text += &format!("\nno device map: {engine} places the model itself. `-o plan.yaml` keeps this plan.\n");
    if !warnings.is_empty() {
        text += "\nwarnings:\n";
        for w in warnings {
            text += &format!("  - {w}\n");
        }
    }
    text
}

/// How to launch a plan: each node's command (`format` is the `--format` that writes them to a
/// file), with the node's rank where there are several; or why none can be written (`refused`).
pub fn launch_lines(format: &str, commands: &[String], refused: Option<&str>) -> String {
    let engine = engine_display(format);
    if let Some(why) = refused {
        return format!("\nno {engine} launch for this layout: {why}\n");
    }
    let script = if format == "torchrun" { "; train.py stands for your training script" } else { "" };
    let mut text = match commands.len() {
        0 => return String::new(),
        1 => {
            format!("\nto launch it ({engine}; `-o FILE --format {format}` writes it as a script{script}):\n")
        }
        n => format!(
            "\nto launch it ({engine}, on each of {n} nodes with MASTER_ADDR the address of node 0; `-o FILE --format \
             {format}` writes it as a script{script}):\n"
        ),
    };
    for (rank, line) in commands.iter().enumerate() {
        if commands.len() > 1 {
            text += &format!("  node {rank}: {line}\n");
        } else {
            text += &format!("  {line}\n");
        }
    }
    text
}

/// One line per shortfall, in words: `GPU 0 (Tesla T4) is short by 502.35 GiB at backward of
/// model.layers.0 (step 2)`.
fn describe_shortfall(s: &Shortfall) -> String {
    format!("{} ({}) is short by {} at {}", s.device, s.name, format_bytes(s.short_bytes), s.at)
}

/// A change in words: `gradient checkpointing (per decoder layer)`, `8 × Tesla T4 (7 more)`;
/// what its probes did not find reads as the kind of change (`a smaller batch`, `more × Tesla
/// T4`).
pub fn change_words(change: &Change) -> String {
    match change {
        Change::Batch { batch: Some(b), larger_undecided } => {
            let which = if *larger_undecided {
                "fits; larger ones were not decided in time"
            } else {
                "the largest that fits"
            };
            format!("batch {b} ({which})")
        }
        Change::Batch { batch: None, .. } => "a smaller batch".into(),
        Change::Sequence { seq: Some(seq), longer_undecided } => {
            let which = if *longer_undecided {
                "fits; longer ones were not decided in time".to_string()
            } else {
                format!("the longest multiple of {SEQ_STEP} that fits")
            };
            format!("sequence length {seq} ({which})")
        }
        Change::Sequence { seq: None, .. } => "a shorter sequence".into(),
        Change::GradCheckpointing => "gradient checkpointing (per decoder layer)".into(),
        Change::Lora { rank } => format!("LoRA (rank {rank}) instead of a full fine-tune"),
        Change::Quantize(q) => quantization_words(q),
        Change::Headroom { percent: 0 } => {
            "no headroom: the step fills the GPU's usable memory, with nothing kept free".into()
        }
        Change::Headroom { percent } => {
            format!("a {percent} % headroom (the step fits the GPU's memory, with less of it kept free)")
        }
        Change::Offload { modules: Some(on_cpu) } => {
            format!("{on_cpu} modules offloaded to the CPU (slower: weights cross PCIe every step)")
        }
        Change::Offload { modules: None } => "modules offloaded to the CPU".into(),
        Change::MoreGpus { gpus, added, kind, quantize, .. } => {
            let count = gpus.map_or_else(|| "more".to_string(), |k| k.to_string());
            match (quantize, added) {
                (None, Some(added)) if gpus.is_some() => format!("{count} × {kind} ({added} more)"),
                (None, _) => format!("{count} × {kind}"),
                (Some(q), _) => format!("{} on {count} × {kind}", quantization_words(q)),
            }
        }
    }
}

/// The flags that apply a change (`--grad-ckpt full`, `--quant int8 --hardware 8xt4`); `None`
/// for what its probes did not find (no batch, no count of GPUs).
pub fn change_flags(change: &Change) -> Option<String> {
    match change {
        Change::Batch { batch, .. } => batch.map(|b| format!("--batch {b}")),
        Change::Sequence { seq, .. } => seq.map(|seq| format!("--seq {seq}")),
        Change::GradCheckpointing => Some("--grad-ckpt full".into()),
        Change::Lora { rank } => Some(format!("--lora-rank {rank}")),
        Change::Quantize(q) => Some(quantization_flags(q)),
        Change::Headroom { percent } => Some(format!("--headroom {percent}%")),
        Change::Offload { .. } => Some("leave out --no-offload".into()),
        Change::MoreGpus { hardware, quantize, .. } => {
            let hardware = format!("--hardware {}", hardware.as_ref()?);
            Some(match quantize {
                Some(q) => format!("{} {hardware}", quantization_flags(q)),
                None => hardware,
            })
        }
    }
}

/// `8-bit weights (bitsandbytes LLM.int8) with LoRA`.
fn quantization_words(q: &Quantization) -> String {
    let name = match q.quant {
        Bitsandbytes::Int8 => "8-bit weights (bitsandbytes LLM.int8)",
        Bitsandbytes::Nf4DoubleQuant => "4-bit NF4 weights (bitsandbytes, double quantization)",
    };
    if q.lora_rank.is_some() { format!("{name} with LoRA") } else { name.to_string() }
}

/// `--quant nf4 --double-quant --lora-rank 16`.
fn quantization_flags(q: &Quantization) -> String {
    let flag = match q.quant {
        Bitsandbytes::Int8 => "--quant int8",
        Bitsandbytes::Nf4DoubleQuant => "--quant nf4 --double-quant",
    };
    match q.lora_rank {
        Some(rank) => format!("{flag} --lora-rank {rank}"),
        None => flag.to_string(),
    }
}

/// How a plan's GPUs pass their limits: "runs out of memory on GPU 1" where the simulated peak
/// passes usable memory, "goes past the 10 % headroom on GPU 0" where it passes only the limit
/// (usable × (1 − headroom)); joined with "and".
fn overruns(plan: &Plan) -> String {
    let mut out_of_memory: Vec<String> = Vec::new();
    let mut past_headroom: Vec<(String, String)> = Vec::new();
    for d in &plan.devices {
        let Some(e) = &d.estimate else { continue };
        if e.peak_reserved_bytes > e.usable_bytes {
            out_of_memory.push(d.device.to_string());
        } else if e.peak_reserved_bytes > d.limit_bytes {
            let headroom = 1.0 - d.limit_bytes as f64 / e.usable_bytes.max(1) as f64;
            past_headroom.push((percent(headroom), d.device.to_string()));
        }
    }
    let mut phrases: Vec<String> = Vec::new();
    if !out_of_memory.is_empty() {
        phrases.push(format!("runs out of memory on {}", and_list(&out_of_memory)));
    }
    // One phrase per headroom figure (all GPUs share one today), in device order.
    let mut figures: Vec<&str> = past_headroom.iter().map(|(h, _)| h.as_str()).collect();
    figures.dedup();
    for figure in figures {
        let gpus: Vec<String> =
            past_headroom.iter().filter(|(h, _)| h == figure).map(|(_, g)| g.clone()).collect();
        let whose = if gpus.len() == 1 { "its" } else { "their" };
        phrases
            .push(format!("goes past the {figure} headroom on {} (within {whose} memory)", and_list(&gpus)));
    }
    if phrases.is_empty() {
        // Over a limit the report cannot attribute to a GPU (a host tier over its capacity).
        return "does not keep within its limits".to_string();
    }
    phrases.join(" and ")
}

/// "a, b and c".
fn and_list(items: &[String]) -> String {
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => items.join(""),
    }
}

/// `0.1` → "10 %", `0.025` → "2.5 %".
fn percent(share: f64) -> String {
    let p = (share * 1000.0).round() / 10.0;
    if p.fract() == 0.0 { format!("{p:.0} %") } else { format!("{p:.1} %") }
}

fn devices_table(devices: &[PlanDevice]) -> String {
    // Gradients and optimizer states get their own column where any device holds some, so
    // that "weights" holds weights only.
    let component = |f: fn(&vramplan_sim::estimate::DeviceEstimate) -> u64| {
        move |d: &PlanDevice| d.estimate.as_ref().map_or(0, f)
    };
    let weights = component(|e| e.components.weights);
    let training = component(|e| e.components.gradients + e.components.optimizer);
    let activations = component(|e| e.components.activations + e.components.logits);
    let kv = component(|e| e.components.kv_cache);
    let reserved = component(|e| e.peak_reserved_bytes);
    let trains = devices.iter().any(|d| training(d) > 0);
    let mut header = vec!["device", "holds", "weights"];
    if trains {
        header.push("grads + optimizer");
    }
    header.extend(["activations", "KV cache", "peak reserved", "limit", "used"]);
    let numeric: Vec<usize> = (2..header.len()).collect();
    let mut table = Table::new(&header).right_align(&numeric);
    for d in devices {
        let name = match d.device {
            Target::Gpu(_) => d.name.clone(),
            _ => d.device.to_string(),
        };
        let mut row = vec![name, summarise_units(&d.units), format_bytes(weights(d))];
        if trains {
            row.push(format_bytes(training(d)));
        }
        row.extend([
            format_bytes(activations(d)),
            format_bytes(kv(d)),
            format_bytes(reserved(d)),
            format_bytes(d.limit_bytes),
            format!("{:.1}%", 100.0 * d.utilisation),
        ]);
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        table.row(&cells);
    }
    table.render()
}

/// `model.embed_tokens, model.layers.0-15` : runs of numbered siblings collapsed.
fn summarise_units(units: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(String, u64, u64)> = None;
    let flush = |run: &mut Option<(String, u64, u64)>, out: &mut Vec<String>| {
        if let Some((prefix, a, b)) = run.take() {
            out.push(if a == b { format!("{prefix}.{a}") } else { format!("{prefix}.{a}-{b}") });
        }
    };
    for u in units {
        let numbered =
            u.rsplit_once('.').and_then(|(p, n)| n.parse::<u64>().ok().map(|n| (p.to_string(), n)));
        match (numbered, &mut run) {
            (Some((p, n)), Some((rp, _, b))) if *rp == p && *b + 1 == n => *b = n,
            (Some((p, n)), _) => {
                flush(&mut run, &mut out);
                run = Some((p, n, n));
            }
            (None, _) => {
                flush(&mut run, &mut out);
                out.push(u.clone());
            }
        }
    }
    flush(&mut run, &mut out);
    if out.len() > 6 {
        let more = out.len() - 5;
        out.truncate(5);
        out.push(format!("… {more} more"));
    }
    out.join(", ")
}

/// How to load an accelerate map written to `file` for `model`: the `from_pretrained` arguments
/// that take it as it is. `offload_folder` is required once a module is on `disk`, and
/// bitsandbytes refuses `cpu` or `disk` entries unless told to keep those modules in fp32
/// (`llm_int8_enable_fp32_cpu_offload`).
pub fn accelerate_loading(
    file: &str,
    model: &vramplan_profiles::model::ModelDescription,
    device_map: &[(String, Target)],
    workload: &vramplan_sim::workload::Workload,
) -> String {
    let lines: Vec<String> =
        accelerate_load_call(file, model, device_map, workload).iter().map(|l| format!("  {l}")).collect();
    // Under another trainer or runtime the lines are comments only (`map_loading`): no
    // transformers call to load it with.
    let how = if lines.iter().all(|l| l.trim_start().starts_with('#')) {
        ""
    } else {
        "; load it as it is (no max_memory: transformers ignores it beside a map)"
    };
    format!("\nwrote {file}{how}:\n{}\n", lines.join("\n"))
}

/// The Python lines, imports first, that load the accelerate map saved as `file` into `model`
/// as it is (`solver::whatif::map_loading` says why each argument), laid out as `whatif`'s lines
/// to run are ([`crate::whatif::run_lines`]).
pub fn accelerate_load_call(
    file: &str,
    model: &vramplan_profiles::model::ModelDescription,
    device_map: &[(String, Target)],
    workload: &vramplan_sim::workload::Workload,
) -> Vec<String> {
    let flags = vramplan_solver::whatif::map_loading(file, model, device_map, workload);
    crate::whatif::run_lines(&flags).lines().map(|l| l.trim_start().to_string()).collect()
}

/// What each stage of the solve proved, in words: `proven gaps: balance 0.00%, load 3.10%
/// (time limit), fewest GPUs not run`.
fn stage_gaps(s: &SolverReport) -> String {
    let stages: Vec<String> = s
        .stages
        .iter()
        .map(|g| {
            let name = match g.stage {
                Stage::Offload => "offload",
                Stage::Disk => "disk",
                Stage::Balance => "balance",
                Stage::Load => "load",
                Stage::Crossing => "crossings",
                Stage::Devices => "fewest GPUs",
            };
            match g.status {
                StageStatus::Optimal => format!("{name} {:.2}%", 100.0 * g.gap),
                StageStatus::TimeLimit => format!("{name} {:.2}% (cut short)", 100.0 * g.gap),
                StageStatus::NotRun => format!("{name} not reached"),
            }
        })
        .collect();
    if stages.is_empty() {
        format!("gap {:.2}%", 100.0 * s.gap)
    } else {
        format!("proven gaps: {}", stages.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::summarise_units;

    #[test]
    fn numbered_runs_collapse() {
        let units: Vec<String> =
            ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert_eq!(summarise_units(&units), "model.embed_tokens, model.layers.0-2, model.norm");
    }

    #[test]
    fn changes_read_as_words_and_flags() {
        use super::{change_flags, change_words};
        use vramplan_solver::explain::{Bitsandbytes, Change, Quantization};
        let nf4_lora = Quantization { quant: Bitsandbytes::Nf4DoubleQuant, lora_rank: Some(16) };
        let int8 = Quantization { quant: Bitsandbytes::Int8, lora_rank: None };
        let t4 = "Tesla T4".to_string();
        let cases = [
            (
                Change::Batch { batch: Some(4), larger_undecided: false },
                "batch 4 (the largest that fits)",
                Some("--batch 4"),
            ),
            (
                Change::Batch { batch: Some(4), larger_undecided: true },
                "batch 4 (fits; larger ones were not decided in time)",
                Some("--batch 4"),
            ),
            (Change::Batch { batch: None, larger_undecided: false }, "a smaller batch", None),
            (
                Change::Sequence { seq: Some(512), longer_undecided: false },
                "sequence length 512 (the longest multiple of 128 that fits)",
                Some("--seq 512"),
            ),
            (
                Change::Sequence { seq: Some(512), longer_undecided: true },
                "sequence length 512 (fits; longer ones were not decided in time)",
                Some("--seq 512"),
            ),
            (Change::Sequence { seq: None, longer_undecided: false }, "a shorter sequence", None),
            (
                Change::GradCheckpointing,
                "gradient checkpointing (per decoder layer)",
                Some("--grad-ckpt full"),
            ),
            (Change::Lora { rank: 16 }, "LoRA (rank 16) instead of a full fine-tune", Some("--lora-rank 16")),
            (Change::Quantize(int8), "8-bit weights (bitsandbytes LLM.int8)", Some("--quant int8")),
            (
                Change::Quantize(nf4_lora),
                "4-bit NF4 weights (bitsandbytes, double quantization) with LoRA",
                Some("--quant nf4 --double-quant --lora-rank 16"),
            ),
            (
                Change::Offload { modules: Some(32) },
                "32 modules offloaded to the CPU (slower: weights cross PCIe every step)",
                Some("leave out --no-offload"),
            ),
            (
                Change::Offload { modules: None },
                "modules offloaded to the CPU",
                Some("leave out --no-offload"),
            ),
            (
                Change::MoreGpus {
                    gpus: Some(8),
                    added: Some(7),
                    kind: t4.clone(),
                    hardware: Some("8xt4".into()),
                    quantize: None,
                },
                "8 × Tesla T4 (7 more)",
                Some("--hardware 8xt4"),
            ),
            (
                Change::MoreGpus {
                    gpus: Some(20),
                    added: Some(19),
                    kind: t4.clone(),
                    hardware: Some("20xt4".into()),
                    quantize: Some(nf4_lora),
                },
                "4-bit NF4 weights (bitsandbytes, double quantization) with LoRA on 20 × Tesla T4",
                Some("--quant nf4 --double-quant --lora-rank 16 --hardware 20xt4"),
            ),
            (
                Change::MoreGpus {
                    gpus: None,
                    added: None,
                    kind: t4.clone(),
                    hardware: None,
                    quantize: None,
                },
                "more × Tesla T4",
                None,
            ),
            (
                Change::MoreGpus { gpus: None, added: None, kind: t4, hardware: None, quantize: Some(int8) },
                "8-bit weights (bitsandbytes LLM.int8) on more × Tesla T4",
                None,
            ),
        ];
        for (change, words, flags) in cases {
            assert_eq!(change_words(&change), words);
            assert_eq!(change_flags(&change).as_deref(), flags, "{words}");
        }
    }

    #[test]
    fn headroom_reads_as_a_percentage() {
        assert_eq!(super::percent(0.1), "10 %");
        assert_eq!(super::percent(0.025), "2.5 %");
        assert_eq!(super::percent(1.0 - 0.9), "10 %");
    }
}
