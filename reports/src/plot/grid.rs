//! `vramplan plot grid`: a heatmap of `whatif grid`'s points over two axes, the first down the
//! side and the second along the bottom; each cell is shaded by utilisation (peak reserved over
//! the limit), a cell that does not fit is red with a cross, one the runtime refuses is grey
//! with a dash, and the utilisation is written in cells wide enough.

use super::measure::{self, Spaced, title_height};
use super::{Drawn, Figure, INK, Key, legend, text, title};
use crate::whatif::axis_cell;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_solver::whatif::{Axis, AxisValue, Grid, GridPoint};

/// A cell that does not fit.
pub(crate) const OVER: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
/// A cell the runtime refuses.
pub(crate) const REFUSED: RGBColor = RGBColor(0xB4, 0xB4, 0xB4);
/// The shades of utilisation from 0 to 1 (light to dark blue).
const EMPTY: (f64, f64, f64) = (0xEF as f64, 0xF3 as f64, 0xFF as f64);
const FULL: (f64, f64, f64) = (0x08 as f64, 0x45 as f64, 0x94 as f64);

/// Room for the labels of the first axis, at the left: at least this, at most [`WIDEST`].
const LEFT: i32 = 110;
const WIDEST: i32 = 260;
/// Room between the title and the cells (the first axis's name), and below the cells (labels
/// of the second axis, their name).
const ABOVE: i32 = 20;
const BOTTOM: i32 = 70;
/// The size of the axes' labels, and the most pixels a column's label takes.
const LABEL: u32 = 12;
const COLUMN_LABEL: i32 = 240;
/// The fewest pixels a column's label is cut to before labels are left out.
const SHORTEST: i32 = 90;
/// The widest a cell grows for its column's label.
const WIDE_CELL: i32 = 120;
/// Pixels from one row of the columns' labels to the next, where they alternate between two.
const LABEL_ROW: i32 = 15;
/// Room for the legend at the right.
const RIGHT: i32 = 230;

/// A grid of two axes.
pub struct GridFigure<'a> {
    /// The heading (model, hardware, workload).
    pub title: String,
    /// The two axes, as the grid was asked for.
    pub axes: &'a [Axis],
    /// Its points, the first axis varying slowest.
    pub grid: &'a Grid,
}

impl GridFigure<'_> {
    /// Rows (first axis) and columns (second axis).
    fn shape(&self) -> (usize, usize) {
        (self.axes.first().map_or(1, Vec::len).max(1), self.axes.get(1).map_or(1, Vec::len).max(1))
    }

    /// A cell's side in pixels: the grid spans about 700 by 480, within 14 to 64 a cell, or
    /// up to [`WIDE_CELL`] wide where the columns' labels need it and the grid has room.
    fn cell(&self) -> (i32, i32) {
        let (rows, columns) = self.shape();
        let fair = 700 / columns as i32;
        let wanted = (self.widest_column_label() + 8).clamp(64, WIDE_CELL).min(fair.max(64));
        (fair.clamp(14, wanted), (480 / rows as i32).clamp(14, 44))
    }

    /// The widest of the second axis's labels, uncut (at most [`COLUMN_LABEL`]).
    fn widest_column_label(&self) -> i32 {
        self.labels(1).iter().map(|l| measure::width(l, LABEL)).max().unwrap_or(0).min(COLUMN_LABEL)
    }

    /// The labels of axis `k`'s values.
    fn labels(&self, k: usize) -> Vec<String> {
        self.axes.get(k).map_or_else(Vec::new, |axis| axis.iter().map(value_label).collect())
    }

    /// Room at the left for the first axis's labels: the widest, within [`LEFT`]..[`WIDEST`].
    fn left(&self) -> i32 {
        let widest = self.labels(0).iter().map(|l| measure::width(l, LABEL)).max().unwrap_or(0);
        (widest + 20).clamp(LEFT, WIDEST)
    }

    /// Where the cells start below the title.
    fn top(&self) -> i32 {
        title_height(&self.title, self.width()) as i32 + ABOVE
    }

    fn width(&self) -> u32 {
        let (_, columns) = self.shape();
        (self.left() + self.cell().0 * columns as i32 + RIGHT) as u32
    }
}

/// A value as its axis labels it: a hardware profile's file by its name, without its folder.
fn value_label(value: &AxisValue) -> String {
    let cell = axis_cell(value).1;
    match value {
        AxisValue::Hardware(spec) if spec.contains(['/', '\\']) => {
            std::path::Path::new(spec).file_name().map_or(cell, |name| name.to_string_lossy().into_owned())
        }
        _ => cell,
    }
}

/// The shade of a cell that fits at `utilisation`.
pub(crate) fn shade(utilisation: f64) -> RGBColor {
    let t = utilisation.clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    RGBColor(mix(EMPTY.0, FULL.0), mix(EMPTY.1, FULL.1), mix(EMPTY.2, FULL.2))
}

impl Figure for GridFigure<'_> {
    fn size(&self) -> (u32, u32) {
        let (rows, _) = self.shape();
        let (_, h) = self.cell();
        (self.width(), (self.top() + h * rows as i32 + BOTTOM).max(360) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (rows, columns) = self.shape();
        let (w, h) = self.cell();
        let (left, top) = (self.left(), self.top());
        let name = |axis: usize| self.axes.get(axis).and_then(|a| a.first()).map_or("", |v| axis_cell(v).0);
        for (k, point) in self.grid.points.iter().enumerate() {
            let (row, column) = (k / columns, k % columns);
            if row >= rows {
                break;
            }
            // The first axis grows upwards, as a plot's y does.
            let (x0, y0) = (left + w * column as i32, top + h * (rows - 1 - row) as i32);
            let (x1, y1) = (x0 + w - 1, y0 + h - 1);
            let (fill, mark) = cell_style(point);
            root.draw(&Rectangle::new([(x0, y0), (x1, y1)], fill.filled()))?;
            let centre = ((x0 + x1) / 2, (y0 + y1) / 2);
            let ink = if point.fits && point.utilisation < 0.55 { INK } else { WHITE };
            let words = match mark {
                Some(mark) => mark.to_string(),
                None if w >= 36 => format!("{:.0}%", point.utilisation * 100.0),
                None => String::new(),
            };
            if !words.is_empty() {
                let style = text(if mark.is_some() { 15 } else { 11 })
                    .color(&ink)
                    .pos(Pos::new(HPos::Center, VPos::Center));
                root.draw(&Text::new(words, centre, style))?;
            }
        }
        // Labels: every value where there is room, else every few.
        let every = |room: i32, need: i32| (need / room.max(1) + 1).max(1) as usize;
        let step = every(h, 16);
        for (row, label) in self.labels(0).into_iter().enumerate().filter(|(r, _)| r % step == 0) {
            let y = top + h * (rows - 1 - row) as i32 + h / 2;
            let style = text(LABEL).pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(measure::fit(&label, LABEL, left - 20), (left - 8, y), style))?;
        }
        // The columns' labels on one row where they fit, else alternating between two rows,
        // and every few where even that is too tight.
        let labels = self.labels(1);
        let widest = self.widest_column_label() + 8;
        let lines = if widest <= w { 1 } else { 2 };
        // Every label where each keeps [`SHORTEST`] pixels at least (a longer one is cut).
        let need = widest.min(SHORTEST + 8);
        let step = (1..).find(|s| need <= lines * s * w).unwrap_or(1) as usize;
        let room = lines * step as i32 * w - 8;
        let mut spaced = [Spaced::default(), Spaced::default()];
        for (column, label) in labels.into_iter().enumerate().filter(|(c, _)| c % step == 0) {
            let line = (column / step) % lines as usize;
            let x = left + w * column as i32 + w / 2;
            let label = measure::fit(&label, LABEL, room);
            let half = measure::width(&label, LABEL) / 2;
            if spaced[line].place((x - half, x + half), 4) {
                let y = top + h * rows as i32 + 6 + LABEL_ROW * line as i32;
                root.draw(&Text::new(label, (x, y), text(LABEL).pos(Pos::new(HPos::Center, VPos::Top))))?;
            }
        }
        let bottom = top + h * rows as i32;
        let centre = left + w * columns as i32 / 2;
        root.draw(&Text::new(
            name(1),
            (centre, bottom + 32 + LABEL_ROW * (lines - 1)),
            text(13).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
        root.draw(&Text::new(name(0), (12, top - 22), text(13)))?;
        let right = left + w * columns as i32 + 20;
        let rows = [
            (Key::Swatch(shade(0.25)), "fits, 25 % of the limit".to_string()),
            (Key::Swatch(shade(0.75)), "fits, 75 % of the limit".to_string()),
            (Key::Swatch(shade(1.0)), "fits, at the limit".to_string()),
            (Key::Swatch(OVER), "× does not fit".to_string()),
            (Key::Swatch(REFUSED), "– refused by the runtime, ? not answered in time".to_string()),
        ];
        legend(root, (right, top), &rows, RIGHT - 30)
    }
}

/// A cell's colour and mark.
fn cell_style(point: &GridPoint) -> (RGBColor, Option<&'static str>) {
    if point.refused.is_some() {
        (REFUSED, Some("–"))
    } else if point.unanswered {
        (REFUSED, Some("?"))
    } else if !point.fits {
        (OVER, Some("×"))
    } else {
        (shade(point.utilisation), None)
    }
}
