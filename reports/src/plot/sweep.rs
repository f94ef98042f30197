//! `vramplan plot sweep`: each GPU's peak reserved (what the verdict judges) against the batch
//! or the sequence length, from `whatif`'s probes, with each GPU's limit (dashed) and capacity
//! (solid), and the boundary `whatif max-batch` / `max-seq` found marked where it crosses: the
//! largest value that fits, the next that does not, and what binds.

use super::{CAPACITY, Drawn, FAINT, Figure, INK, Key, USABLE, clip, dashed, gib, legend, text, title};
use crate::whatif::binding_words;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_solver::whatif::{Fit, Largest, Quantity};

/// One colour per GPU's line (Okabe–Ito, in order).
const LINES: [RGBColor; 6] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
];
/// The boundary's marker.
pub(crate) const BOUNDARY: RGBColor = RGBColor(0x00, 0x00, 0x00);

/// Peaks over one swept quantity, and the boundary.
pub struct SweepFigure<'a> {
    /// The heading (model, hardware, workload).
    pub title: String,
    /// Each swept value and its probe, in increasing order (the boundary's two are added).
    pub points: &'a [(u64, Fit)],
    /// The boundary search's answer.
    pub answer: &'a Largest,
}

impl SweepFigure<'_> {
    /// Every GPU some probe used, by id, with its name and limit.
    fn gpus(&self) -> Vec<(u32, String, u64, u64)> {
        let mut gpus: Vec<(u32, String, u64, u64)> = Vec::new();
        for (_, fit) in self.series() {
            for (d, limit) in fit.devices.iter().zip(&fit.limits) {
                if !gpus.iter().any(|g| g.0 == d.id) {
                    gpus.push((d.id, d.name.clone(), *limit, d.capacity_bytes));
                }
            }
        }
        gpus.sort_by_key(|g| g.0);
        gpus
    }

    /// The probes and the boundary's two (the largest that fits, the next), by value.
    fn series(&self) -> Vec<(u64, &Fit)> {
        let mut series: Vec<(u64, &Fit)> = self.points.iter().map(|(v, f)| (*v, f)).collect();
        let answer = self.answer;
        for (value, fit) in [(answer.value, &answer.fit), (answer.next, &answer.next_fit)] {
            if let (Some(v), Some(f)) = (value, fit)
                && !series.iter().any(|(s, _)| *s == v)
            {
                series.push((v, f));
            }
        }
        series.sort_by_key(|(v, _)| *v);
        series
    }

    /// The x range, and whether it is drawn on a log scale (a doubling sweep).
    fn range(&self) -> (f64, f64, bool) {
        let series = self.series();
        let values = series.iter().map(|(v, _)| *v as f64);
        let low = values.clone().fold(f64::INFINITY, f64::min).max(1.0);
        let high = values.fold(1.0, f64::max).max(low + 1.0);
        (low, high, high / low >= 8.0)
    }
}

impl Figure for SweepFigure<'_> {
    fn size(&self) -> (u32, u32) {
        (1000, 600)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (plot, side) = root.margin(40, 60, 0, 0).split_horizontally(750);
        let gpus = self.gpus();
        let top = self
            .series()
            .iter()
            .flat_map(|(_, f)| f.devices.iter().map(|d| d.peak_reserved_bytes))
            .chain(gpus.iter().map(|g| g.3))
            .max()
            .unwrap_or(1 << 30);
        let (low, high, log) = self.range();
        let quantity = match self.answer.quantity {
            Quantity::Batch => "batch",
            Quantity::Seq => "sequence length (tokens)",
            Quantity::Context => "context (tokens)",
        };
        // A doubling sweep is drawn on a log-2 axis, ticked at the values probed.
        let scale = |v: f64| if log { v.log2() } else { v };
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(scale(low)..scale(high), 0f64..gib(top) * 1.08)?;
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(quantity)
            .y_desc("peak reserved, GiB")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(FAINT)
            .label_style(text(13))
            .axis_desc_style(text(13));
        if log {
            mesh.disable_x_mesh().x_label_formatter(&|_| String::new());
        } else {
            mesh.x_label_formatter(&|v| format!("{v:.0}"));
        }
        mesh.draw()?;
        let at = |x: f64, y: f64| chart.plotting_area().map_coordinate(&(scale(x), y));
        if log {
            // Ticks at the values probed; a label too close to the last one drawn is left out,
            // except the boundary's.
            let mut last_label: Option<i32> = None;
            for (v, _) in self.series() {
                let (x, y) = at(v as f64, 0.0);
                root.draw(&PathElement::new(vec![(x, y), (x, y + 5)], INK.stroke_width(1)))?;
                if last_label.is_none_or(|l| x - l >= 40) || Some(v) == self.answer.value {
                    root.draw(&Text::new(
                        v.to_string(),
                        (x, y + 8),
                        text(13).pos(Pos::new(HPos::Center, VPos::Top)),
                    ))?;
                    last_label = Some(x);
                }
            }
        }
        self.draw_lines(root, &at, &gpus, (low, high), gib(top) * 1.08)?;
        let mut rows: Vec<(Key, String)> = gpus
            .iter()
            .enumerate()
            .map(|(k, g)| (Key::Line(LINES[k % LINES.len()]), format!("GPU {} ({})", g.0, g.1)))
            .collect();
        rows.truncate(12);
        rows.push((Key::Line(CAPACITY), "capacity".into()));
        rows.push((Key::Dashed(USABLE), "limit (usable × (1 − headroom))".into()));
        legend(&side, (10, 30), &rows)?;
        Ok(())
    }
}

impl SweepFigure<'_> {
    /// The lines, the limits and the boundary, through `at` (data to pixels); `ceiling` is the
    /// top of the byte axis.
    fn draw_lines<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        at: &dyn Fn(f64, f64) -> (i32, i32),
        gpus: &[(u32, String, u64, u64)],
        (low, high): (f64, f64),
        ceiling: f64,
    ) -> Drawn<DB> {
        let (left, right) = (at(low, 0.0).0, at(high, 0.0).0);
        let mut limits_drawn: Vec<u64> = Vec::new();
        for (k, (id, _, limit, capacity)) in gpus.iter().enumerate() {
            let colour = LINES[k % LINES.len()];
            let line: Vec<(i32, i32)> = self
                .series()
                .into_iter()
                .filter_map(|(v, f)| {
                    f.devices.iter().find(|d| d.id == *id).map(|d| at(v as f64, gib(d.peak_reserved_bytes)))
                })
                .collect();
            root.draw(&PathElement::new(line.clone(), colour.stroke_width(2)))?;
            for point in line {
                root.draw(&Circle::new(point, 3, colour.filled()))?;
            }
            if !limits_drawn.contains(limit) {
                dashed(root, (left, right), at(low, gib(*limit)).1, USABLE)?;
                let y = at(low, gib(*capacity)).1;
                root.draw(&PathElement::new(vec![(left, y), (right, y)], CAPACITY.stroke_width(2)))?;
                limits_drawn.push(*limit);
            }
        }
        let answer = self.answer;
        let words = match (answer.value, answer.next) {
            (Some(v), Some(n)) => format!("largest that fits: {v} ({n} does not)"),
            (Some(v), None) => format!("largest that fits: {v} (a cap, not memory, stopped the search)"),
            (None, _) => "even the smallest value does not fit".to_string(),
        };
        let mut notes = vec![words];
        if let Some(b) = &answer.binding {
            notes.push(clip(&binding_words(b), 95));
        }
        if let Some(v) = answer.value.filter(|&v| (low..=high).contains(&(v as f64))) {
            let (x, bottom) = at(v as f64, 0.0);
            let top = at(v as f64, ceiling).1;
            let mut y = bottom;
            while y > top {
                root.draw(&PathElement::new(vec![(x, y), (x, (y - 5).max(top))], BOUNDARY.stroke_width(1)))?;
                y -= 9;
            }
            if let Some(fit) = &answer.fit
                && let Some(d) = fit.devices.iter().max_by_key(|d| d.peak_reserved_bytes)
            {
                root.draw(&Circle::new(
                    at(v as f64, gib(d.peak_reserved_bytes)),
                    6,
                    BOUNDARY.stroke_width(2),
                ))?;
            }
        }
        let (x0, y0) = (left + 10, root.get_pixel_range().1.end - 50);
        for (k, note) in notes.iter().enumerate() {
            let style = text(13).color(&INK).pos(Pos::new(HPos::Left, VPos::Top));
            root.draw(&Text::new(note.clone(), (x0 - 10, y0 + 18 * k as i32), style))?;
        }
        Ok(())
    }
}
