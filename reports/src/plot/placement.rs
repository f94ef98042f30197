//! `vramplan plot plan`: a device map drawn, one column per device of the plan (GPUs, then the
//! host tiers it offloads to), each holding its units as boxes in model order from the bottom,
//! their heights what each keeps for the whole step, and beside them which units they are:
//! runs of consecutive layers as one label (`layers 0–15`), other units by name. A GPU's bar
//! compares like with like: its units and the rest of its peak reserved (activations, cache)
//! stand against the plan's limit (dashed), which is a limit on peak reserved bytes (usable ×
//! (1 − headroom)); what the device uses outside PyTorch's allocator is not drawn, as the limit
//! leaves it out. With `--baseline`, accelerate's `device_map="auto"` is drawn on the left on
//! the same scale.

use super::measure::{self, spread, title_height};
use super::{Drawn, FAINT, Figure, INK, Key, USABLE, dashed, gib, legend, text, title};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_profiles::units::format_bytes;
use vramplan_solver::plan::{Plan, PlanDevice};

/// The two colours unit boxes alternate between, so that neighbours stay apart.
pub(crate) const UNIT_COLOURS: [RGBColor; 2] = [RGBColor(0x00, 0x72, 0xB2), RGBColor(0x5A, 0xA8, 0xD8)];
/// The rest of a GPU's peak reserved above its units.
pub(crate) const REST: RGBColor = RGBColor(0xCC, 0x79, 0xA7);

/// Pixels per device column: the bar in its left part, its units' labels at the right.
const COLUMN: u32 = 200;
/// Where the bar sits in a column, in columns.
const BAR: (f64, f64) = (0.06, 0.44);
/// The size of a unit label, and the pixels from one label's row to the next.
const LABEL: u32 = 11;
const PITCH: i32 = 13;
/// Pixels for the legend at the right, and of the figure below the title.
const LEGEND: u32 = 300;
const BODY: u32 = 600;

/// A plan's device map, and accelerate's beside it where given.
pub struct PlacementFigure<'a> {
    /// The heading (model, hardware, workload).
    pub title: String,
    /// The plan.
    pub plan: &'a Plan,
    /// accelerate's `device_map="auto"` for the same inputs.
    pub baseline: Option<&'a Plan>,
}

impl PlacementFigure<'_> {
    /// The panels, left to right: (heading, plan).
    fn panels(&self) -> Vec<(String, &Plan)> {
        let mut panels = Vec::new();
        if let Some(b) = self.baseline {
            panels.push(("accelerate device_map=\"auto\"".to_string(), b));
        }
        panels.push(("vramplan plan".to_string(), self.plan));
        panels
    }

    /// The top of the byte axis: every GPU's limit and peak reserved (host tiers, often far
    /// larger, are cut at the top with their total written there); the host's holdings where
    /// no GPU has any.
    fn top(&self) -> u64 {
        let devices = || self.panels().into_iter().flat_map(|(_, p)| &p.devices);
        let gpus = devices()
            .filter_map(|d| {
                let units: u64 = d.unit_bytes.iter().sum();
                d.estimate.as_ref().map(|e| e.peak_reserved_bytes.max(units).max(d.limit_bytes))
            })
            .max();
        gpus.or_else(|| devices().map(|d| d.unit_bytes.iter().sum()).max()).unwrap_or(1 << 30).max(1)
    }
}

impl Figure for PlacementFigure<'_> {
    fn size(&self) -> (u32, u32) {
        let columns: usize = self.panels().iter().map(|(_, p)| p.devices.len().max(1)).sum();
        let width = 140 + LEGEND + COLUMN * columns as u32 + 40 * self.panels().len() as u32;
        (width, title_height(&self.title, width) + BODY)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (width, _) = self.size();
        let (body, side) =
            root.margin(title_height(&self.title, width), 0, 0, 0).split_horizontally(width - LEGEND);
        let top = gib(self.top()) * 1.08;
        let panels = self.panels();
        let widths: Vec<u32> = panels.iter().map(|(_, p)| p.devices.len().max(1) as u32).collect();
        let mut rest = body;
        for (k, ((heading, plan), columns)) in panels.iter().zip(&widths).enumerate() {
            let axis = if k == 0 { 70 } else { 20 };
            let (area, after) = rest.split_horizontally(axis + 30 + COLUMN * columns);
            rest = after;
            let mut chart = ChartBuilder::on(&area)
                .margin(10)
                .margin_top(28)
                .x_label_area_size(60)
                .y_label_area_size(axis)
                .build_cartesian_2d(0f64..*columns as f64, 0f64..top)?;
            let mut mesh = chart.configure_mesh();
            mesh.disable_x_mesh().x_labels(0).light_line_style(FAINT).label_style(text(13));
            if k == 0 {
                mesh.y_desc("GiB").axis_desc_style(text(13)).y_label_formatter(&|v| format!("{v:.0}"));
            } else {
                mesh.y_label_formatter(&|_| String::new());
            }
            mesh.draw()?;
            let at = |x: f64, y: f64| chart.plotting_area().map_coordinate(&(x, y));
            let (hx, hy) = at(*columns as f64 / 2.0, top);
            let room = COLUMN as i32 * *columns as i32 - 8;
            root.draw(&Text::new(
                measure::fit(heading, 14, room),
                (hx, hy - 22),
                text(14).pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
            for (i, device) in plan.devices.iter().enumerate() {
                draw_column(root, &at, i as f64, top, device)?;
            }
        }
        let rows = [
            (Key::Swatch(UNIT_COLOURS[0]), "a unit, as much as it holds all step".to_string()),
            (Key::Swatch(REST), "rest of peak reserved (activations, cache)".to_string()),
            (Key::Dashed(USABLE), "the plan's limit on peak reserved".to_string()),
        ];
        legend(&side, (10, 40), &rows, LEGEND as i32 - 20)?;
        let y = 40 + super::LEGEND_ROW * rows.len() as i32 + 6;
        let note = "A GPU's bar is its peak reserved (what PyTorch's allocator holds), as the limit \
                    counts it: usable memory × (1 − headroom). The CUDA context and what else the \
                    driver counts in nvidia-smi are outside both.";
        for (k, line) in measure::wrap(note, 12, LEGEND as i32 - 20, 6).into_iter().enumerate() {
            side.draw(&Text::new(line, (10, y + 15 * k as i32), text(12).color(&INK)))?;
        }
        Ok(())
    }
}

/// One device's column at `left` (data x).
fn draw_column<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    at: &dyn Fn(f64, f64) -> (i32, i32),
    left: f64,
    top: f64,
    device: &PlanDevice,
) -> Drawn<DB> {
    let (x0, x1) = (left + BAR.0, left + BAR.1);
    let ceiling = at(x0, top).1;
    let mut bottom = 0u64;
    // Each unit's pixel rows, bottom and top, cut at the ceiling.
    let mut spans: Vec<(i32, i32)> = Vec::with_capacity(device.units.len());
    for k in 0..device.units.len() {
        let bytes = device.unit_bytes.get(k).copied().unwrap_or(0);
        let (mut a, mut b) = (at(x0, gib(bottom)), at(x1, gib(bottom + bytes)));
        (a.1, b.1) = (a.1.max(ceiling), b.1.max(ceiling));
        root.draw(&Rectangle::new([a, b], UNIT_COLOURS[k % 2].filled()))?;
        spans.push((a.1, b.1));
        bottom += bytes;
    }
    let span = (at(left + 0.03, 0.0).0, at(left + 0.97, 0.0).0);
    let (centre, base) = at(left + 0.5, 0.0);
    let room = span.1 - span.0;
    let mut lines = measure::wrap(&device.name, 12, room, 2);
    if let Some(e) = &device.estimate {
        let reserved = e.peak_reserved_bytes.max(bottom);
        if reserved > bottom {
            root.draw(&Rectangle::new([at(x0, gib(bottom)), at(x1, gib(reserved))], REST.filled()))?;
        }
        dashed(root, span, at(0.0, gib(device.limit_bytes)).1, USABLE)?;
        let share = e.peak_reserved_bytes as f64 / device.limit_bytes.max(1) as f64;
        lines.push(measure::fit(&format!("reserved: {:.0} % of the limit", share * 100.0), 12, room));
        lines.push(format!("{} units", device.units.len()));
    } else {
        lines.push(measure::fit(
            &format!("{} units, {}", device.units.len(), format_bytes(bottom)),
            12,
            room,
        ));
        if at(x0, gib(bottom)).1 < ceiling {
            let style = text(11).pos(Pos::new(HPos::Center, VPos::Bottom));
            let words = measure::fit(&format!("↑ {} in all", format_bytes(bottom)), 11, room);
            root.draw(&Text::new(words, (centre, ceiling - 3), style))?;
        }
    }
    if !device.unit_bytes.is_empty() {
        let labels = (at(x1, 0.0).0 + 4, span.1);
        label_groups(root, &device.units, &spans, labels, (ceiling, base))?;
    }
    for (k, line) in lines.iter().enumerate() {
        let style = text(12).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(line.clone(), (centre, base + 8 + 15 * k as i32), style))?;
    }
    Ok(())
}

/// Labels the groups of `units` (their boxes' pixel rows in `spans`) in the space `x` (from
/// the bar's right edge to the column's) and rows `ceiling..floor`: a bracket along each
/// group and its label beside it, moved up or down where labels would touch, with a leader
/// to the bracket; where there is no room for all, the thinnest groups go unlabelled.
fn label_groups<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    units: &[String],
    spans: &[(i32, i32)],
    (x, right): (i32, i32),
    (ceiling, floor): (i32, i32),
) -> Drawn<DB> {
    // Each group with its pixel rows: the bottom of its first unit, the top of its last.
    let mut groups: Vec<(Group, i32, i32)> = groups(units)
        .into_iter()
        .map(|g| {
            let (bottom, top) = (spans[g.first].0, spans[g.last].1);
            (g, bottom, top)
        })
        .collect();
    let half = measure::height(LABEL) / 2 + 1;
    let range = (ceiling + half, floor - half);
    let at = loop {
        let wanted: Vec<i32> = groups.iter().map(|(_, bottom, top)| (bottom + top) / 2).collect();
        if let Some(at) = spread(&wanted, PITCH, range) {
            break at;
        }
        let thinnest = (0..groups.len()).min_by_key(|&i| (groups[i].1 - groups[i].2, i)).unwrap_or(0);
        groups.remove(thinnest);
    };
    // A bracket per group, a pixel inside its span so that neighbours' brackets stay apart,
    // with ends turned towards the bar.
    let bracket = x - 1;
    for ((group, bottom, top), y) in groups.iter().zip(at) {
        let (low, high) = (*bottom - 1, (*top + 1).min(*bottom - 1));
        let path = vec![(bracket - 3, low), (bracket, low), (bracket, high), (bracket - 3, high)];
        root.draw(&PathElement::new(path, INK.stroke_width(1)))?;
        let middle = (low + high) / 2;
        root.draw(&PathElement::new(vec![(bracket, middle), (x + 4, y)], INK.stroke_width(1)))?;
        let words = measure::fit(&group.label, LABEL, right - x - 6);
        root.draw(&Text::new(words, (x + 6, y), text(LABEL).pos(Pos::new(HPos::Left, VPos::Center))))?;
    }
    Ok(())
}

/// Consecutive units that read as one: layers of one stack numbered in a row (`layers 0–15`,
/// `encoder.block 3–5`, `layers 0–31 mlp.experts[0..=1]`), or other units side by side
/// (`embed_tokens, rotary_emb`).
#[derive(Debug, Clone, PartialEq)]
struct Group {
    label: String,
    first: usize,
    last: usize,
}

/// A unit's name read as a numbered stack (`model.layers.3.mlp.experts` is stack `layers`,
/// index 3, then `mlp.experts`); `None` for a unit outside any numbered stack.
struct Numbered {
    stack: String,
    index: u64,
    rest: String,
}

fn numbered(name: &str) -> Option<Numbered> {
    let parts: Vec<&str> = short_name(name).split('.').collect();
    let k = parts.iter().position(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))?;
    Some(Numbered {
        stack: parts[..k].join("."),
        index: parts[k].parse().ok()?,
        rest: parts[k + 1..].join("."),
    })
}

/// A unit's name without the `model.` every decoder's names start with.
fn short_name(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

fn groups(units: &[String]) -> Vec<Group> {
    // Each group, with its stack's first and last unit where it is one.
    let mut out: Vec<(Group, Option<(Numbered, u64)>)> = Vec::new();
    for (i, name) in units.iter().enumerate() {
        let read = numbered(name);
        match (out.last_mut(), read) {
            (Some((group, Some((run, last)))), Some(n))
                if n.stack == run.stack && n.rest == run.rest && n.index == *last + 1 =>
            {
                *last = n.index;
                group.last = i;
            }
            (Some((group, None)), None) => {
                group.label = format!("{}, {}", group.label, short_name(name));
                group.last = i;
            }
            (_, read) => {
                let label = short_name(name).to_string();
                let run = read.map(|n| {
                    let index = n.index;
                    (n, index)
                });
                out.push((Group { label, first: i, last: i }, run));
            }
        }
    }
    for (group, run) in &mut out {
        if let Some((n, last)) = run {
            let range = if n.index == *last { n.index.to_string() } else { format!("{}–{last}", n.index) };
            let words = [n.stack.as_str(), &range, n.rest.as_str()];
            group.label = words.iter().filter(|w| !w.is_empty()).copied().collect::<Vec<_>>().join(" ");
        }
    }
    out.into_iter().map(|(group, _)| group).collect()
}

#[cfg(test)]
mod tests {
    use super::{Group, groups};

    fn names(units: &[&str]) -> Vec<String> {
        units.iter().map(|u| u.to_string()).collect()
    }

    fn labels(units: &[&str]) -> Vec<(String, usize, usize)> {
        groups(&names(units)).into_iter().map(|Group { label, first, last }| (label, first, last)).collect()
    }

    #[test]
    fn consecutive_layers_read_as_one_range() {
        let mut units = vec!["model.embed_tokens", "model.rotary_emb"];
        let layers: Vec<String> = (0..16).map(|i| format!("model.layers.{i}")).collect();
        units.extend(layers.iter().map(String::as_str));
        units.extend(["model.norm", "lm_head"]);
        assert_eq!(
            labels(&units),
            vec![
                ("embed_tokens, rotary_emb".to_string(), 0, 1),
                ("layers 0–15".to_string(), 2, 17),
                ("norm, lm_head".to_string(), 18, 19)
            ]
        );
    }

    #[test]
    fn a_gap_or_another_stack_starts_a_new_group() {
        let units = ["encoder.block.4", "encoder.block.5", "decoder.block.0", "decoder.block.2"];
        assert_eq!(
            labels(&units),
            vec![
                ("encoder.block 4–5".to_string(), 0, 1),
                ("decoder.block 0".to_string(), 2, 2),
                ("decoder.block 2".to_string(), 3, 3)
            ]
        );
        let experts = [
            "model.layers.0.mlp.experts[0..=1] (2 experts)",
            "model.layers.1.mlp.experts[0..=1] (2 experts)",
        ];
        assert_eq!(labels(&experts), vec![("layers 0–1 mlp.experts[0..=1] (2 experts)".to_string(), 0, 1)]);
    }
}
