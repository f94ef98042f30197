//! `vramplan plot sweep`: each GPU's peak reserved (what the verdict judges) against the batch
//! or the sequence length, from `whatif`'s probes, with each GPU's limit (dashed) and capacity
//! (solid), and the boundary `whatif max-batch` / `max-seq` found marked where it crosses: the
//! largest value that fits, the next that does not, and what binds.
//!
//! A curve keeps to one placement. Where the placement is fixed (one GPU, data parallelism) every
//! probe is replayed on it. Where it is solved (one copy of the model over several GPUs), each
//! value that fits has its own device map, the value past the boundary is replayed on the
//! boundary's map (as `whatif` reports it), and a value no map fits is estimated with the layers
//! split evenly, a placement nobody would run: a GPU's line joins only consecutive values on one
//! map (it breaks where the plan changes, so that it never falls because layers moved), and the
//! values no map fits are hollow rings on a thin line of their own.

use super::measure::{self, Spaced, title_height};
use super::{
    CAPACITY, Drawn, FAINT, Figure, INK, Key, USABLE, dashed, gib, legend, legend_width, text, title,
};
use crate::whatif::binding_words;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_solver::Target;
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

/// Pixels of the plot (the legend is at its right), of the legend at least and at most, and
/// of the figure below the title.
const PLOT: u32 = 750;
const SIDE: (i32, i32) = (250, 430);
const BODY: u32 = 560;
/// The size of the axes' labels.
const LABEL: u32 = 13;

/// Peaks over one swept quantity, and the boundary.
pub struct SweepFigure<'a> {
    /// The heading (model, hardware, workload).
    pub title: String,
    /// Each swept value and its probe, in increasing order (the boundary's two are added).
    pub points: &'a [(u64, Fit)],
    /// The boundary search's answer.
    pub answer: &'a Largest,
}

/// The placement a probe was estimated on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Placed<'a> {
    /// The sweep's one fixed placement (`None`), or a solved device map.
    Map(Option<&'a [(String, Target)]>),
    /// Solved, and no map fits: the layers split evenly.
    NoMap,
}

/// A value of the sweep, its probe and where that was estimated.
struct Point<'a> {
    value: u64,
    fit: &'a Fit,
    placed: Placed<'a>,
}

impl SweepFigure<'_> {
    /// Whether the placement is solved at each value (some probe carries a device map).
    fn solved(&self) -> bool {
        self.points.iter().any(|(_, f)| f.device_map.is_some())
            || self.answer.fit.as_ref().is_some_and(|f| f.device_map.is_some())
    }

    /// The probes by value, the boundary's two (the largest that fits, the next, replayed on
    /// the boundary's map where maps are solved) in place of any probe of the same values.
    fn series(&self) -> Vec<Point<'_>> {
        let answer = self.answer;
        let boundary_map = answer.fit.as_ref().and_then(|f| f.device_map.as_deref());
        let solved = self.solved();
        let mut series: Vec<Point> = Vec::new();
        for (value, fit) in [(answer.value, &answer.fit), (answer.next, &answer.next_fit)] {
            if let (Some(value), Some(fit)) = (value, fit) {
                let placed = match fit.device_map.as_deref() {
                    Some(map) => Placed::Map(Some(map)),
                    None if !solved => Placed::Map(None),
                    None if boundary_map.is_some() => Placed::Map(boundary_map),
                    None => Placed::NoMap,
                };
                series.push(Point { value, fit, placed });
            }
        }
        for (value, fit) in self.points {
            if series.iter().any(|p| p.value == *value) {
                continue;
            }
            let placed = match fit.device_map.as_deref() {
                Some(map) => Placed::Map(Some(map)),
                None if solved => Placed::NoMap,
                None => Placed::Map(None),
            };
            series.push(Point { value: *value, fit, placed });
        }
        series.sort_by_key(|p| p.value);
        series
    }

    /// Every GPU some probe used, by id, with its name and limit.
    fn gpus(&self) -> Vec<(u32, String, u64, u64)> {
        let mut gpus: Vec<(u32, String, u64, u64)> = Vec::new();
        for point in self.series() {
            for (d, limit) in point.fit.devices.iter().zip(&point.fit.limits) {
                if !gpus.iter().any(|g| g.0 == d.id) {
                    gpus.push((d.id, d.name.clone(), *limit, d.capacity_bytes));
                }
            }
        }
        gpus.sort_by_key(|g| g.0);
        gpus
    }

    /// The x range, and whether it is drawn on a log scale (a doubling sweep).
    fn range(&self) -> (f64, f64, bool) {
        let series = self.series();
        let values = series.iter().map(|p| p.value as f64);
        let low = values.clone().fold(f64::INFINITY, f64::min).max(1.0);
        let high = values.fold(1.0, f64::max).max(low + 1.0);
        (low, high, high / low >= 8.0)
    }

    /// The legend's rows.
    fn legend_rows(&self) -> Vec<(Key, String)> {
        let mut rows: Vec<(Key, String)> = self
            .gpus()
            .iter()
            .enumerate()
            .map(|(k, g)| (Key::Line(LINES[k % LINES.len()]), format!("GPU {} ({})", g.0, g.1)))
            .collect();
        rows.truncate(12);
        if self.series().iter().any(|p| p.placed == Placed::NoMap) {
            rows.push((Key::Ring(INK), "no device map fits: layers split evenly (△ above the axis)".into()));
        }
        rows.push((Key::Line(CAPACITY), "capacity".into()));
        rows.push((Key::Dashed(USABLE), "limit (usable × (1 − headroom))".into()));
        rows
    }

    /// The legend's width.
    fn side(&self) -> i32 {
        (legend_width(&self.legend_rows()) + 24).clamp(SIDE.0, SIDE.1)
    }
}

impl Figure for SweepFigure<'_> {
    fn size(&self) -> (u32, u32) {
        let width = PLOT + self.side() as u32;
        (width, title_height(&self.title, width) + BODY)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (width, _) = self.size();
        let (plot, side) = root.margin(title_height(&self.title, width), 60, 0, 0).split_horizontally(PLOT);
        let gpus = self.gpus();
        let series = self.series();
        // The axis reaches the peaks on a placement and the capacities; a value no map fits,
        // estimated on a placement nobody would run, does not stretch it.
        let top = series
            .iter()
            .filter(|p| p.placed != Placed::NoMap)
            .flat_map(|p| p.fit.devices.iter().map(|d| d.peak_reserved_bytes))
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
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .x_desc(quantity)
            .y_desc("peak reserved, GiB")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(FAINT)
            .label_style(text(LABEL))
            .axis_desc_style(text(LABEL))
            .draw()?;
        let at = |x: f64, y: f64| chart.plotting_area().map_coordinate(&(scale(x), y));
        self.draw_ticks(root, &at, &series, (low, high, log))?;
        self.draw_lines(root, &at, &gpus, (low, high), gib(top) * 1.08)?;
        let room = self.side() - 16;
        let rows = self.legend_rows();
        legend(&side, (10, 30), &rows, room)?;
        if self.solved() {
            let y = 30 + super::LEGEND_ROW * rows.len() as i32 + 6;
            let note = "a line joins values planned with one device map; it breaks where the plan changes";
            for (k, line) in measure::wrap(note, 12, room, 3).into_iter().enumerate() {
                side.draw(&Text::new(line, (10, y + 15 * k as i32), text(12)))?;
            }
        }
        Ok(())
    }
}

impl SweepFigure<'_> {
    /// The x axis's ticks and labels: the boundary's value first, then (log) each value
    /// probed or (linear) round values, each labelled only where it keeps clear of the labels
    /// already drawn.
    fn draw_ticks<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        at: &dyn Fn(f64, f64) -> (i32, i32),
        series: &[Point],
        (low, high, log): (f64, f64, bool),
    ) -> Drawn<DB> {
        let inside = |v: u64| (low..=high).contains(&(v as f64));
        let mut values: Vec<u64> = self.answer.value.filter(|&v| inside(v)).into_iter().collect();
        if log {
            values.extend(series.iter().map(|p| p.value));
        } else {
            values.extend(round_values(low, high));
        }
        let mut spaced = Spaced::default();
        for v in values {
            let (x, y) = at(v as f64, 0.0);
            root.draw(&PathElement::new(vec![(x, y), (x, y + 5)], INK.stroke_width(1)))?;
            let label = v.to_string();
            let half = measure::width(&label, LABEL) / 2 + 1;
            if spaced.place((x - half, x + half), 8) {
                root.draw(&Text::new(label, (x, y + 8), text(LABEL).pos(Pos::new(HPos::Center, VPos::Top))))?;
            }
        }
        Ok(())
    }

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
        let series = self.series();
        let mut limits_drawn: Vec<u64> = Vec::new();
        for (k, (id, _, limit, capacity)) in gpus.iter().enumerate() {
            let colour = LINES[k % LINES.len()];
            // Runs of consecutive values on one placement, each its own line.
            let mut runs: Vec<(Placed, Vec<(i32, i32)>)> = Vec::new();
            for point in &series {
                let Some(d) = point.fit.devices.iter().find(|d| d.id == *id) else {
                    runs.push((Placed::NoMap, Vec::new()));
                    continue;
                };
                let xy = at(point.value as f64, gib(d.peak_reserved_bytes));
                match runs.last_mut() {
                    Some((placed, line)) if *placed == point.placed && !line.is_empty() => line.push(xy),
                    _ => runs.push((point.placed, vec![xy])),
                }
            }
            let roof = at(low, ceiling).1;
            for (placed, line) in runs.into_iter().filter(|(_, l)| !l.is_empty()) {
                if placed != Placed::NoMap {
                    root.draw(&PathElement::new(line.clone(), colour.stroke_width(2)))?;
                    for point in line {
                        root.draw(&Circle::new(point, 3, colour.filled()))?;
                    }
                    continue;
                }
                // No map fits: hollow rings on a thin line, and a hollow triangle at the top for
                // a value above the axis.
                for pair in line.windows(2).filter(|p| p[0].1 >= roof && p[1].1 >= roof) {
                    root.draw(&PathElement::new(pair.to_vec(), colour.stroke_width(1)))?;
                }
                for (x, y) in line {
                    if y >= roof {
                        root.draw(&Circle::new((x, y), 3, colour.stroke_width(1)))?;
                    } else {
                        let triangle =
                            vec![(x - 4, roof + 7), (x + 4, roof + 7), (x, roof), (x - 4, roof + 7)];
                        root.draw(&PathElement::new(triangle, colour.stroke_width(1)))?;
                    }
                }
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
            notes.push(binding_words(b));
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
        let (x0, y0) = (left, root.get_pixel_range().1.end - 50);
        let room = root.dim_in_pixel().0 as i32 - x0 - 16;
        for (k, note) in notes.iter().enumerate() {
            let style = text(13).color(&INK).pos(Pos::new(HPos::Left, VPos::Top));
            root.draw(&Text::new(measure::fit(note, 13, room), (x0, y0 + 18 * k as i32), style))?;
        }
        Ok(())
    }
}

/// Round values from `low` to `high` for a linear axis: multiples of 1, 2 or 5 × 10ⁿ, about
/// eight of them.
fn round_values(low: f64, high: f64) -> Vec<u64> {
    let raw = ((high - low) / 8.0).max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|&s| s >= raw).unwrap_or(raw);
    let step = step.round().max(1.0) as u64;
    let first = (low / step as f64).ceil() as u64 * step;
    (0..).map(|k| first + k * step).take_while(|&v| v as f64 <= high).collect()
}

#[cfg(test)]
mod tests {
    use super::round_values;

    #[test]
    fn round_values_step_by_one_two_or_five() {
        assert_eq!(round_values(0.0, 100.0), vec![0, 20, 40, 60, 80, 100]);
        assert_eq!(round_values(8.0, 40.0), vec![10, 15, 20, 25, 30, 35, 40]);
        assert_eq!(round_values(1.0, 4.0), vec![1, 2, 3, 4]);
    }
}
