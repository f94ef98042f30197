//! `vramplan plot plan`: a device map drawn, one column per device of the plan (GPUs, then the
//! host tiers it offloads to), each holding its units as boxes in model order from the bottom,
//! their heights what each keeps for the whole step; above them on a GPU, the rest of its peak
//! (activations, cache, context); the plan's limit (dashed) and the capacity (solid). With
//! `--baseline`, accelerate's `device_map="auto"` is drawn on the left on the same scale.

use super::{CAPACITY, Drawn, FAINT, Figure, Key, USABLE, clip, dashed, gib, legend, text, title};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_profiles::units::format_bytes;
use vramplan_solver::plan::{Plan, PlanDevice};

/// The two colours unit boxes alternate between, so that neighbours stay apart.
pub(crate) const UNIT_COLOURS: [RGBColor; 2] = [RGBColor(0x00, 0x72, 0xB2), RGBColor(0x5A, 0xA8, 0xD8)];
/// The rest of a GPU's peak above its units.
pub(crate) const REST: RGBColor = RGBColor(0xCC, 0x79, 0xA7);

/// Pixels per device column.
const COLUMN: u32 = 170;

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

    /// The top of the byte axis: every GPU's capacity and use (host tiers, often far larger, are
    /// cut at the top with their total written there); the host's holdings where no GPU has any.
    fn top(&self) -> u64 {
        let devices = || self.panels().into_iter().flat_map(|(_, p)| &p.devices);
        let gpus = devices()
            .filter_map(|d| {
                d.estimate.as_ref().map(|e| e.capacity_bytes.max(e.device_used_bytes).max(d.limit_bytes))
            })
            .max();
        gpus.or_else(|| devices().map(|d| d.unit_bytes.iter().sum()).max()).unwrap_or(1 << 30).max(1)
    }
}

impl Figure for PlacementFigure<'_> {
    fn size(&self) -> (u32, u32) {
        let columns: usize = self.panels().iter().map(|(_, p)| p.devices.len().max(1)).sum();
        (140 + 240 + COLUMN * columns as u32 + 40 * self.panels().len() as u32, 640)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (width, _) = self.size();
        let (body, side) = root.margin(40, 0, 0, 0).split_horizontally(width - 240);
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
            root.draw(&Text::new(
                heading.clone(),
                (hx, hy - 22),
                text(14).pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
            for (i, device) in plan.devices.iter().enumerate() {
                draw_column(root, &at, i as f64, top, device)?;
            }
        }
        let rows = [
            (Key::Swatch(UNIT_COLOURS[0]), "a unit (alternating shades)".to_string()),
            (Key::Swatch(REST), "rest of the GPU's peak".to_string()),
            (Key::Line(CAPACITY), "capacity".to_string()),
            (Key::Dashed(USABLE), "the plan's limit".to_string()),
        ];
        legend(&side, (10, 40), &rows)?;
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
    let (x0, x1) = (left + 0.2, left + 0.8);
    let ceiling = at(x0, top).1;
    let mut bottom = 0u64;
    for (k, name) in device.units.iter().enumerate() {
        let bytes = device.unit_bytes.get(k).copied().unwrap_or(0);
        let (mut a, mut b) = (at(x0, gib(bottom)), at(x1, gib(bottom + bytes)));
        (a.1, b.1) = (a.1.max(ceiling), b.1.max(ceiling));
        root.draw(&Rectangle::new([a, b], UNIT_COLOURS[k % 2].filled()))?;
        if a.1 - b.1 >= 13 {
            let label = clip(name.strip_prefix("model.").unwrap_or(name), 18);
            let centre = ((a.0 + b.0) / 2, (a.1 + b.1) / 2);
            root.draw(&Text::new(
                label,
                centre,
                text(10).color(&WHITE).pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
        }
        bottom += bytes;
    }
    let span = (at(left + 0.06, 0.0).0, at(left + 0.94, 0.0).0);
    let (centre, base) = at(left + 0.5, 0.0);
    let mut lines = vec![clip(&device.name, 26)];
    if let Some(e) = &device.estimate {
        let rest = e.device_used_bytes.saturating_sub(bottom);
        if rest > 0 {
            root.draw(&Rectangle::new([at(x0, gib(bottom)), at(x1, gib(bottom + rest))], REST.filled()))?;
        }
        let capacity = at(0.0, gib(e.capacity_bytes)).1;
        root.draw(&PathElement::new(vec![(span.0, capacity), (span.1, capacity)], CAPACITY.stroke_width(2)))?;
        dashed(root, span, at(0.0, gib(device.limit_bytes)).1, USABLE)?;
        lines.push(format!("{:.0} % of usable", device.utilisation * 100.0));
        lines.push(format!("{} units", device.units.len()));
    } else {
        lines.push(format!("{} units, {}", device.units.len(), format_bytes(bottom)));
        if at(x0, gib(bottom)).1 < ceiling {
            let style = text(11).pos(Pos::new(HPos::Center, VPos::Bottom));
            root.draw(&Text::new(
                format!("↑ {} in all", format_bytes(bottom)),
                (centre, ceiling - 3),
                style,
            ))?;
        }
    }
    for (k, line) in lines.iter().enumerate() {
        let style = text(12).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(line.clone(), (centre, base + 8 + 15 * k as i32), style))?;
    }
    Ok(())
}
