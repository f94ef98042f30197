//! What `vramplan whatif` prints: each query's answer in a sentence or a table, what binds the
//! next value, and the arguments that run the answer; the grid and the frontier as tables or CSV.

use crate::estimate::part_name;
use crate::table::{Table, group_digits};
use vramplan_profiles::units::format_bytes;
use vramplan_sim::workload::Quant;
use vramplan_solver::whatif::{
    AxisValue, Binding, Cap, Cheapest, Concurrency, EngineKind, Fewest, Fit, Frontier, Grid, Largest,
    QuantChoice, Quantity, RunFlags,
};

/// `none`, `int8`, `nf4 (double quant)`, `fp8`, `gptq 4-bit`, `Q4_K_M`.
pub fn quant_name(quant: &Quant) -> String {
    match quant {
        Quant::None => "none".into(),
        Quant::Int8 => "int8".into(),
        Quant::Nf4 { double_quant: true } => "nf4 (double quant)".into(),
        Quant::Nf4 { double_quant: false } => "nf4".into(),
        Quant::Fp4 { double_quant: true } => "fp4 (double quant)".into(),
        Quant::Fp4 { double_quant: false } => "fp4".into(),
        Quant::Gptq { bits, .. } => format!("gptq {bits}-bit"),
        Quant::Awq { bits, .. } => format!("awq {bits}-bit"),
        Quant::Fp8 { .. } => "fp8".into(),
        Quant::Gguf { quant_type } => quant_type.clone(),
    }
}

fn quantity_name(quantity: Quantity) -> &'static str {
    match quantity {
        Quantity::Batch => "batch",
        Quantity::Seq => "sequence",
        Quantity::Context => "context",
    }
}

/// "GPU 0 (Tesla T4) runs out by 1.20 GiB at backward of model.layers.0 (step 2); activations
/// grow most".
pub fn binding_words(binding: &Binding) -> String {
    if binding.over_bytes == 0 {
        return format!(
            "GPU {} ({}): the engine's KV cache holds less than one sequence",
            binding.device, binding.name
        );
    }
    let part = if binding.grew { "grew most" } else { "is the largest part" };
    format!(
        "GPU {} ({}) runs out by {} at {}; {} {part}",
        binding.device,
        binding.name,
        format_bytes(binding.over_bytes),
        binding.at,
        part_name(binding.component)
    )
}

fn fit_words(fit: &Fit) -> String {
    format!("peak {} used, {:.1}% of the limit", format_bytes(fit.peak_bytes), 100.0 * fit.utilisation)
}

/// `max-batch` / `max-seq`.
pub fn largest_text(answer: &Largest) -> String {
    let what = quantity_name(answer.quantity);
    let mut text = match (answer.value, &answer.fit) {
        (Some(value), Some(fit)) => {
            format!("largest {what} that fits: {}  ({})\n", group_digits(value), fit_words(fit))
        }
        _ => format!("no {what} fits, not even 1\n"),
    };
    match (answer.next, &answer.binding, answer.cap) {
        (Some(next), Some(binding), _) => {
            let verdict = if answer.next_fit.as_ref().is_none_or(|f| f.proven) {
                "does not fit"
            } else {
                "has no map found that fits (not proven impossible; the answer's map"
            };
            let close = if verdict.ends_with("map") { ")" } else { "" };
            text += &format!("{what} {} {verdict}: {}{close}\n", group_digits(next), binding_words(binding));
        }
        (_, _, Some(Cap::Positions(p))) => {
            text += &format!(
                "capped at the model's {} positions (max_position_embeddings); memory allows more: \
                 --past-positions searches past them\n",
                group_digits(p)
            );
        }
        (_, _, Some(Cap::Range(r))) => {
            text += &format!("every {what} up to {} fits; the search stops there\n", group_digits(r));
        }
        _ => {}
    }
    text += &search_words(answer);
    text + &run_text(&answer.run)
}

fn search_words(answer: &Largest) -> String {
    if answer.monotone {
        format!(
            "({} simulations; the peak grew with the {} over all of them)\n",
            answer.probes,
            quantity_name(answer.quantity)
        )
    } else {
        format!(
            "({} simulations; the peak did not grow steadily with the {}, so the range was scanned every {})\n",
            answer.probes,
            quantity_name(answer.quantity),
            answer.stride
        )
    }
}

/// The arguments that run an answer, one call per block.
pub fn run_text(run: &[RunFlags]) -> String {
    if run.is_empty() {
        return String::new();
    }
    format!("\nto run it:\n{}", run_lines(run))
}

/// The lines that run an answer, indented: the shell commands, then one Python block (its
/// imports first) that runs as printed, a custom model's note and the inference batch as
/// comments.
pub fn run_lines(run: &[RunFlags]) -> String {
    let mut text = String::new();
    for flags in run.iter().filter(|f| f.command_line) {
        let args: Vec<String> = flags
            .args
            .iter()
            .map(|(n, v)| if v.is_empty() { n.clone() } else { format!("{n} {v}") })
            .collect();
        text += &format!("  {} {}\n", flags.call, args.join(" "));
    }
    let python: Vec<&RunFlags> = run.iter().filter(|f| !f.command_line).collect();
    if python.is_empty() {
        return text;
    }
    // `import torch`, then `from transformers import A, B`, each module once, in order.
    let mut plain: Vec<&str> = Vec::new();
    let mut from: Vec<(&str, Vec<&str>)> = Vec::new();
    for (module, name) in python.iter().flat_map(|f| f.imports.iter()) {
        if name.is_empty() {
            if !plain.contains(&module.as_str()) {
                plain.push(module);
            }
        } else {
            match from.iter_mut().find(|(m, _)| m == module) {
                Some((_, names)) if !names.contains(&name.as_str()) => names.push(name),
                Some(_) => {}
                None => from.push((module, vec![name])),
            }
        }
    }
    if !plain.is_empty() {
        text += &format!("  import {}\n", plain.join(", "));
    }
    for (module, names) in from {
        text += &format!("  from {module} import {}\n", names.join(", "));
    }
    for flags in python {
        if flags.call == "#" {
            for (name, value) in &flags.args {
                text += &format!("  # {name}: {value}\n");
            }
            continue;
        }
        let mut args: Vec<String> = flags.positional.clone();
        args.extend(flags.args.iter().map(|(n, v)| format!("{n}={v}")));
        let assign = flags.assign.map_or_else(String::new, |a| format!("{a} = "));
        text += &format!("  {assign}{}({})\n", flags.call, args.join(", "));
        if flags.device_map.is_some() {
            text += "  # device_map.json: write it with `vramplan plan` and the same flags, `-o device_map.json`\n";
        }
    }
    text
}

fn engine_name(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Transformers => "transformers",
        EngineKind::Vllm => "vLLM",
        EngineKind::Sglang => "SGLang",
        EngineKind::LlamaCpp => "llama.cpp",
    }
}

/// `max-concurrency`: one row per engine, then how to run each.
pub fn concurrency_text(answers: &[Concurrency]) -> String {
    let Some(seq) = answers.first().map(|a| a.seq) else { return String::new() };
    let mut table =
        Table::new(&["engine", "sequences at once", "KV capacity (tokens)", "note"]).right_align(&[1, 2]);
    for a in answers {
        let sequences = a.sequences.map_or_else(|| "0".to_string(), group_digits);
        let kv = a.kv_capacity_tokens.map_or_else(String::new, group_digits);
        // What binds: vLLM's own where not one sequence fits, else the search's.
        let binding = a.binding.as_ref().or_else(|| a.search.as_ref().and_then(|s| s.binding.as_ref()));
        let note = match (&a.refused, a.tensor_parallel, a.scheduler_limit, binding) {
            (Some(why), ..) => format!("refused: {why}"),
            (_, Some(tp), ..) => format!(
                "with --parallel tp={tp}: {} runs on one GPU unless told, and one does not hold the model",
                engine_name(a.engine)
            ),
            (_, _, Some(limit), _) => {
                format!("schedules at most {} per step (--max-num-seqs)", group_digits(limit))
            }
            (_, _, _, Some(b)) => binding_words(b),
            _ => String::new(),
        };
        table.row(&[engine_name(a.engine), &sequences, &kv, &note]);
    }
    let mut text = format!("sequences of {} tokens served at once\n", group_digits(seq));
    text += &table.render();
    for a in answers.iter().filter(|a| !a.run.is_empty()) {
        text += &format!("\n{}:\n{}", engine_name(a.engine), run_lines(&a.run));
    }
    text
}

/// `min-gpus`.
pub fn fewest_text(answer: &Fewest) -> String {
    let mut text = match (answer.gpus, &answer.fit, &answer.hardware) {
        (Some(n), Some(fit), Some(hw)) => {
            let layout = answer.parallel.as_ref().map_or(String::new(), |p| format!(" --parallel {p}"));
            format!(
                "fewest {} GPUs that fit: {n}  (--hardware {hw}{layout}; {})\n",
                answer.kind,
                fit_words(fit)
            )
        }
        _ => format!("no count of {} GPUs up to the search's end fits\n", answer.kind),
    };
    if let (Some(fewer), Some(binding)) = (answer.fewer, &answer.binding) {
        text += &format!("{fewer} do not: {}\n", binding_words(binding));
    }
    if !answer.counts.is_empty() {
        let counts: Vec<String> = answer.counts.iter().map(|c| c.to_string()).collect();
        text += &format!("(the counts the engine can shard the model over: {})\n", counts.join(", "));
    }
    text + &run_text(&answer.run)
}

fn fit_cells(fit: Option<&Fit>, refused: Option<&String>) -> [String; 3] {
    match (fit, refused) {
        (Some(f), _) => [
            if f.fits { "fits".into() } else { "does not fit".into() },
            format_bytes(f.peak_bytes),
            format!("{:.1}%", 100.0 * f.utilisation),
        ],
        (None, Some(why)) => [format!("refused: {why}"), String::new(), String::new()],
        _ => [String::new(), String::new(), String::new()],
    }
}

/// `best-quant`: every precision tried, the first that fits marked.
pub fn quant_text(choices: &[QuantChoice]) -> String {
    let mut table = Table::new(&["weights", "verdict", "peak used", "of the limit"]).right_align(&[2, 3]);
    let best = choices.iter().position(|c| c.fit.as_ref().is_some_and(|f| f.fits));
    for (i, c) in choices.iter().enumerate() {
        let mut name = quant_name(&c.quant);
        if let Some(rank) = c.lora_rank {
            name += &format!(" + LoRA r{rank}");
        }
        if Some(i) == best {
            name = format!("▶ {name}");
        }
        let [verdict, peak, share] = fit_cells(c.fit.as_ref(), c.refused.as_ref());
        table.row(&[&name, &verdict, &peak, &share]);
    }
    let mut text = match best {
        Some(i) => format!("highest precision that fits: {}\n", quant_name(&choices[i].quant)),
        None => "no weight precision fits\n".to_string(),
    };
    text += &table.render();
    if let Some(i) = best {
        text += &run_text(&choices[i].run);
    }
    text
}

/// `cheapest`: every profile with its price, the cheapest that fits first.
pub fn cheapest_text(answer: &Cheapest, currency: &str) -> String {
    let mut table = Table::new(&[
        "hardware",
        "GPUs",
        &format!("{currency}/hour"),
        "verdict",
        "peak used",
        "of the limit",
    ])
    .right_align(&[1, 2, 4, 5]);
    for p in &answer.profiles {
        let price = p.per_hour.map_or_else(|| "no price".to_string(), |h| format!("{h:.2}"));
        let [verdict, peak, share] = fit_cells(p.fit.as_ref(), p.refused.as_ref());
        table.row(&[&p.hardware, &p.gpus.to_string(), &price, &verdict, &peak, &share]);
    }
    let mut text = match &answer.answer {
        Some(hw) => format!("cheapest that fits: {hw}\n"),
        None => "none of these fits (or none that fits has a price)\n".to_string(),
    };
    text += &table.render();
    text + &run_text(&answer.run)
}

/// An axis value's column name and cell.
pub(crate) fn axis_cell(value: &AxisValue) -> (&'static str, String) {
    match value {
        AxisValue::Batch(b) => ("batch", b.to_string()),
        AxisValue::Seq(s) => ("seq", s.to_string()),
        AxisValue::Quant(q) => ("quant", quant_name(q)),
        AxisValue::KvDtype(d) => ("kv_dtype", d.name().to_string()),
        AxisValue::Hardware(h) => ("hardware", h.clone()),
    }
}

/// How a table or CSV writes bytes: binary units for people, whole numbers for programs.
type BytesCell = fn(u64) -> String;

fn bytes_number(bytes: u64) -> String {
    bytes.to_string()
}

/// The grid's rows: the axes, then fits, the peak (written by `bytes`), the share of the limit
/// and what binds.
fn grid_rows(grid: &Grid, bytes: BytesCell) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let mut header: Vec<&'static str> =
        grid.points.first().map(|p| p.at.iter().map(|v| axis_cell(v).0).collect()).unwrap_or_default();
    header.extend(["fits", "peak_bytes", "utilisation", "binding"]);
    let rows = grid
        .points
        .iter()
        .map(|p| {
            let mut row: Vec<String> = p.at.iter().map(|v| axis_cell(v).1).collect();
            row.push(if p.refused.is_some() {
                "refused".into()
            } else if p.unanswered {
                "unanswered".into()
            } else {
                p.fits.to_string()
            });
            row.push(bytes(p.peak_bytes));
            row.push(format!("{:.4}", p.utilisation));
            row.push(match (&p.refused, &p.binding) {
                (Some(why), _) => why.clone(),
                (_, Some(b)) => format!("GPU {} {}", b.device, part_name(b.component)),
                _ => String::new(),
            });
            row
        })
        .collect();
    (header, rows)
}

/// The grid as a table.
pub fn grid_text(grid: &Grid) -> String {
    let (header, rows) = grid_rows(grid, format_bytes);
    let mut table = Table::new(&header).right_align(&[header.len() - 3, header.len() - 2]);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        table.row(&cells);
    }
    let fits = grid.points.iter().filter(|p| p.fits).count();
    let unanswered = grid.points.iter().filter(|p| p.unanswered).count();
    let more = if unanswered > 0 {
        format!("; {unanswered} not answered within the time limit (--time-limit)")
    } else {
        String::new()
    };
    format!("{}\n{} of {} points fit{more}\n", table.render().trim_end(), fits, grid.points.len())
}

/// The grid as CSV (bytes unformatted).
pub fn grid_csv(grid: &Grid) -> String {
    let (header, rows) = grid_rows(grid, bytes_number);
    csv(&header, &rows)
}

fn frontier_rows(frontier: &Frontier, bytes: BytesCell) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec!["quant", "kv_dtype", "gpus", "offload", "seq", "batch", "peak_bytes", "binding"];
    let rows = frontier
        .points
        .iter()
        .map(|p| {
            vec![
                quant_name(&p.quant),
                p.kv_dtype.map_or_else(|| "compute".to_string(), |d| d.name().to_string()),
                p.gpus.to_string(),
                p.offload.to_string(),
                p.seq.to_string(),
                p.batch.to_string(),
                bytes(p.peak_bytes),
                p.binding
                    .as_ref()
                    .map_or_else(String::new, |b| format!("GPU {} {}", b.device, part_name(b.component))),
            ]
        })
        .collect();
    (header, rows)
}

/// The frontier as a table.
pub fn frontier_text(frontier: &Frontier) -> String {
    let (header, rows) = frontier_rows(frontier, format_bytes);
    let mut table = Table::new(&header).right_align(&[2, 4, 5, 6]);
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        table.row(&cells);
    }
    format!(
        "{} trade-offs no other point beats (of {} points: the largest batch per sequence length and choice)\n{}",
        frontier.points.len(),
        frontier.candidates,
        table.render()
    )
}

/// The frontier as CSV.
pub fn frontier_csv(frontier: &Frontier) -> String {
    let (header, rows) = frontier_rows(frontier, bytes_number);
    csv(&header, &rows)
}

/// RFC 4180 CSV: a cell with a comma, a quote or a line break is quoted, its quotes doubled.
fn csv(header: &[&str], rows: &[Vec<String>]) -> String {
    let cell = |c: &str| {
        if c.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", c.replace('"', "\"\""))
        } else {
            c.to_string()
        }
    };
    let mut text = header.iter().map(|h| cell(h)).collect::<Vec<_>>().join(",") + "\n";
    for row in rows {
        text += &(row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(",") + "\n");
    }
    text
}
