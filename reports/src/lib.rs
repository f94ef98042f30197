//! Human output: the tables `inspect` and `profiles` print (and, with later issues, `estimate`,
//! `plan` and plots). Each function returns text; the command line prints it.

mod check;
pub mod document;
mod estimate;
mod plan;
pub mod plot;
mod script;
mod table;
mod terminal;
mod validate;
mod whatif;

pub use check::check_table;
pub use estimate::{data_parallel_line, estimate_table};
pub use plan::{
    accelerate_load_call, accelerate_loading, change_flags, change_words, launch_lines, plan_table,
    plan_table_untimed,
};
pub use script::{script_table, script_unavailable_message};
pub use table::{Table, group_digits};
pub use terminal::terminal_safe;
pub use validate::{unavailable_message, validate_table};
pub use whatif::{
    binding_words, cheapest_text, concurrency_text, fewest_text, frontier_csv, frontier_text, grid_csv,
    grid_text, largest_text, quant_name, quant_text, run_text,
};

use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::Summary;
use vramplan_profiles::units::format_bytes;

/// `vramplan inspect`'s report.
pub fn inspect_table(summary: &Summary) -> String {
    let mut text = format!("{}  {}  ({})\n\n", summary.name, summary.architecture, summary.dtype);
    let mut facts = Table::new(&["", ""]).without_header();
    facts
        .row(&["parameters", &format!("{} ({})", group_digits(summary.params), short_count(summary.params))]);
    facts.row(&[
        "memory",
        &format!(
            "{} ({} bytes, buffers {})",
            format_bytes(summary.bytes),
            group_digits(summary.bytes),
            format_bytes(summary.buffer_bytes)
        ),
    ]);
    facts.row(&["layers", &summary.layers.to_string()]);
    if let Some(moe) = &summary.moe {
        facts.row(&[
            "experts",
            &format!(
                "{} routed, top-{}: {} active of {} ({:.1}%)",
                moe.experts,
                moe.top_k,
                short_count(moe.active_params),
                short_count(moe.total_params),
                100.0 * moe.active_params as f64 / moe.total_params.max(1) as f64
            ),
        ]);
    }
    if let Some(unit) = &summary.largest_unit {
        facts.row(&["largest unit", &format!("{} ({})", unit.name, format_bytes(unit.bytes))]);
    }
    text += &facts.render();

    let mut modules = Table::new(&["module", "class", "params", "bytes"]).right_align(&[2, 3]);
    for m in &summary.modules {
        modules.row(&[&m.name, &m.class, &group_digits(m.params), &format_bytes(m.bytes)]);
    }
    text += "\n";
    text += &modules.render();

    if !summary.layer_kinds.is_empty() {
        let mut kinds =
            Table::new(&["layer kind", "count", "params each", "bytes each"]).right_align(&[1, 2, 3]);
        for k in &summary.layer_kinds {
            let label = if k.moe { format!("{} (MoE)", k.class) } else { k.class.clone() };
            kinds.row(&[
                &label,
                &k.count.to_string(),
                &group_digits(k.params_each),
                &format_bytes(k.bytes_each),
            ]);
        }
        text += "\n";
        text += &kinds.render();
    }
    if !summary.tied.is_empty() {
        text += "\ntied parameters (one storage each):\n";
        for group in &summary.tied {
            text += &format!("  {}\n", group.join(" = "));
        }
    }
    if !summary.notes.is_empty() {
        text += "\nnotes:\n";
        for note in &summary.notes {
            text += &format!("  - {note}\n");
        }
    }
    text
}

/// `vramplan profiles`'s listing: one line per profile, with each kind of GPU's total memory and
/// what is left for PyTorch once the driver and the CUDA context have theirs.
pub fn profiles_table(profiles: &[HardwareProfile]) -> String {
    let mut table = Table::new(&["profile", "GPUs", "devices", "memory each", "usable each", "total"])
        .right_align(&[1, 3, 4, 5]);
    for p in profiles {
        let total: u64 = p.devices.iter().map(|d| d.memory_bytes).sum();
        let mut kinds: Vec<DeviceKind> = Vec::new();
        for d in &p.devices {
            match kinds.iter_mut().find(|k| k.name == d.name && k.memory == d.memory_bytes) {
                Some(kind) => kind.count += 1,
                None => kinds.push(DeviceKind {
                    name: &d.name,
                    memory: d.memory_bytes,
                    usable: d.usable_bytes(),
                    count: 1,
                }),
            }
        }
        let join =
            |f: fn(&DeviceKind) -> String, sep: &str| kinds.iter().map(f).collect::<Vec<_>>().join(sep);
        table.row(&[
            &p.name,
            &p.devices.len().to_string(),
            &join(|k| format!("{}× {}", k.count, k.name), " + "),
            &join(|k| format_bytes(k.memory), " + "),
            &join(|k| format_bytes(k.usable), " + "),
            &format_bytes(total),
        ]);
    }
    table.render()
}

/// Devices of one kind in a profile, in profile order.
struct DeviceKind<'a> {
    name: &'a str,
    memory: u64,
    usable: u64,
    count: usize,
}

/// `46702792704` → `46.70B`.
fn short_count(n: u64) -> String {
    let v = n as f64;
    if v >= 1e12 {
        format!("{:.2}T", v / 1e12)
    } else if v >= 1e9 {
        format!("{:.2}B", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2}K", v / 1e3)
    } else {
        n.to_string()
    }
}
