//! `vramplan plan`'s report: the solver's verdict and numbers, then per device the units it
//! holds and its memory by component; accelerate's greedy map beside it for comparison; when
//! nothing fits (proven), where it runs out and the verified remedies; and when the time limit
//! came before an answer, the best placement found so far, if any, and no verdict.

use crate::table::Table;
use vramplan_profiles::units::format_bytes;
use vramplan_solver::Tier;
use vramplan_solver::explain::{Explanation, describe_shortfall};
use vramplan_solver::plan::{Plan, PlanDevice, Verdict};

/// The human report of a plan.
pub fn plan_table(
    plan: &Plan,
    baseline: Option<&Plan>,
    explanation: Option<&Explanation>,
    warnings: &[String],
) -> String {
    let s = &plan.solver;
    let mut text = format!(
        "plan for {}: {}  (solver {:?}: {}, {:.1} ms, objective {:.3}, bound {:.3}, gap {:.2}%)\n\n",
        plan.target.name(),
        plan.verdict.describe(),
        s.kind,
        s.status,
        s.seconds * 1e3,
        s.objective,
        s.bound,
        100.0 * s.gap
    );
    let placed = !plan.device_map.is_empty() || plan.devices.iter().any(|d| !d.units.is_empty());
    match plan.verdict {
        Verdict::Fits => {
            text += &devices_table(&plan.devices);
            if plan.offloaded_bytes > 0 {
                text += &format!("offloaded: {}\n", format_bytes(plan.offloaded_bytes));
            }
            if s.status == "time_limit" {
                text += &format!(
                    "the best plan found within the time limit, not proven the most balanced (gap {:.2}%)\n",
                    100.0 * s.gap
                );
            }
        }
        Verdict::Unknown if placed => {
            text += "the best placement found so far (not within every limit; nothing is proven):\n";
            text += &devices_table(&plan.devices);
            text += "give it more time (a larger --time-limit) for an answer\n";
        }
        Verdict::Unknown => {
            text += "no placement was found and none was proven impossible within the time limit; \
                     give it more time (a larger --time-limit) for an answer\n";
        }
        Verdict::DoesNotFit => {}
    }
    if let Some(b) = baseline {
        text += "\naccelerate's device_map=\"auto\" for the same input (greedy baseline):\n";
        text += &devices_table(&b.devices);
        text += &format!("  {}\n", if b.feasible { "fits" } else { "runs out of memory" });
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
            text +=
                &format!("  - {}: {}  (largest GPU at {:.0}%)\n", r.change, r.flags, 100.0 * r.utilisation);
        }
        if !e.undecided.is_empty() {
            text += "\nnot decided within the time limit (may or may not fit):\n";
            for u in &e.undecided {
                text += &format!("  - {u}\n");
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

fn devices_table(devices: &[PlanDevice]) -> String {
    let mut table = Table::new(&[
        "device",
        "holds",
        "weights",
        "activations",
        "KV cache",
        "peak reserved",
        "limit",
        "used",
    ])
    .right_align(&[2, 3, 4, 5, 6, 7]);
    for d in devices {
        let (weights, acts, kv, reserved) = match &d.estimate {
            Some(e) => (
                e.components.weights + e.components.gradients + e.components.optimizer,
                e.components.activations + e.components.logits,
                e.components.kv_cache,
                e.peak_reserved_bytes,
            ),
            None => (0, 0, 0, 0),
        };
        let name = match d.device {
            Tier::Gpu(_) => d.name.clone(),
            _ => d.device.to_string(),
        };
        table.row(&[
            &name,
            &summarise_units(&d.units),
            &format_bytes(weights),
            &format_bytes(acts),
            &format_bytes(kv),
            &format_bytes(reserved),
            &format_bytes(d.limit_bytes),
            &format!("{:.1}%", 100.0 * d.utilisation),
        ]);
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

/// How to load an accelerate map written to `file` into the model class `architecture`
/// (`architectures[0]` of its config): the `from_pretrained` arguments that take it as it is. `offload_folder` is required once a module is on `disk`, and bitsandbytes
/// refuses `cpu` or `disk` entries unless told to keep those modules in fp32
/// (`llm_int8_enable_fp32_cpu_offload`).
pub fn accelerate_loading(
    file: &str,
    architecture: &str,
    plan: &Plan,
    workload: &vramplan_sim::workload::Workload,
) -> String {
    use vramplan_sim::workload::Quant;
    let on = |tier: Tier| plan.device_map.iter().any(|(_, t)| *t == tier);
    let host = on(Tier::Cpu) || on(Tier::Disk);
    let mut args = vec![format!("device_map=json.load(open({file:?}))")];
    if let Some(dtype) = workload.weight_dtype.filter(|d| d.is_float()) {
        args.push(format!("dtype=torch.{}", dtype.torch_name()));
    }
    let bnb = match &workload.quant {
        Quant::Int8 => Some("load_in_8bit=True".to_string()),
        Quant::Nf4 { double_quant } | Quant::Fp4 { double_quant } => {
            let kind = if matches!(workload.quant, Quant::Nf4 { .. }) { "nf4" } else { "fp4" };
            let double = if *double_quant { ", bnb_4bit_use_double_quant=True" } else { "" };
            Some(format!("load_in_4bit=True, bnb_4bit_quant_type=\"{kind}\"{double}"))
        }
        _ => None,
    };
    if let Some(config) = bnb {
        let offload = if host { ", llm_int8_enable_fp32_cpu_offload=True" } else { "" };
        args.push(format!("quantization_config=BitsAndBytesConfig({config}{offload})"));
    }
    if on(Tier::Disk) {
        args.push("offload_folder=\"offload\"".into());
    }
    format!(
        "\nwrote {file}; load it as it is (no max_memory: transformers ignores it beside a map):\n  \
         model = {architecture}.from_pretrained(MODEL, {})\n",
        args.join(", ")
    )
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
}
