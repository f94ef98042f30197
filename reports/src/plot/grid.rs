//! `vramplan plot grid`: a heatmap of `whatif grid`'s points over two axes, the first down the
//! side and the second along the bottom; each cell is shaded by utilisation (peak reserved over
//! the limit), a cell that does not fit is red with a cross, one the runtime refuses is grey
//! with a dash, and the utilisation is written in cells wide enough.

use super::{Drawn, Figure, INK, Key, clip, legend, text, title};
use crate::whatif::axis_cell;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_solver::whatif::{Axis, Grid, GridPoint};

/// A cell that does not fit.
pub(crate) const OVER: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
/// A cell the runtime refuses.
pub(crate) const REFUSED: RGBColor = RGBColor(0xB4, 0xB4, 0xB4);
/// The shades of utilisation from 0 to 1 (light to dark blue).
const EMPTY: (f64, f64, f64) = (0xEF as f64, 0xF3 as f64, 0xFF as f64);
const FULL: (f64, f64, f64) = (0x08 as f64, 0x45 as f64, 0x94 as f64);

/// Room for the labels of the first axis, at the left.
const LEFT: i32 = 110;
/// Room above the cells (title) and below them (labels of the second axis, their name).
const TOP: i32 = 60;
const BOTTOM: i32 = 70;
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

    /// A cell's side in pixels: the grid spans about 700 by 480, within 14 to 64 a cell.
    fn cell(&self) -> (i32, i32) {
        let (rows, columns) = self.shape();
        ((700 / columns as i32).clamp(14, 64), (480 / rows as i32).clamp(14, 44))
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
        let (rows, columns) = self.shape();
        let (w, h) = self.cell();
        ((LEFT + w * columns as i32 + RIGHT) as u32, (TOP + h * rows as i32 + BOTTOM).max(360) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (rows, columns) = self.shape();
        let (w, h) = self.cell();
        let name = |axis: usize| self.axes.get(axis).and_then(|a| a.first()).map_or("", |v| axis_cell(v).0);
        for (k, point) in self.grid.points.iter().enumerate() {
            let (row, column) = (k / columns, k % columns);
            if row >= rows {
                break;
            }
            // The first axis grows upwards, as a plot's y does.
            let (x0, y0) = (LEFT + w * column as i32, TOP + h * (rows - 1 - row) as i32);
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
        if let Some(axis) = self.axes.first() {
            let step = every(h, 16);
            for (row, value) in axis.iter().enumerate().filter(|(r, _)| r % step == 0) {
                let y = TOP + h * (rows - 1 - row) as i32 + h / 2;
                let style = text(12).pos(Pos::new(HPos::Right, VPos::Center));
                root.draw(&Text::new(clip(&axis_cell(value).1, 14), (LEFT - 8, y), style))?;
            }
        }
        if let Some(axis) = self.axes.get(1) {
            let step = every(w, 46);
            for (column, value) in axis.iter().enumerate().filter(|(c, _)| c % step == 0) {
                let x = LEFT + w * column as i32 + w / 2;
                let style = text(12).pos(Pos::new(HPos::Center, VPos::Top));
                root.draw(&Text::new(clip(&axis_cell(value).1, 8), (x, TOP + h * rows as i32 + 6), style))?;
            }
        }
        let bottom = TOP + h * rows as i32;
        let centre = LEFT + w * columns as i32 / 2;
        root.draw(&Text::new(
            name(1),
            (centre, bottom + 32),
            text(13).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
        root.draw(&Text::new(name(0), (12, TOP - 22), text(13)))?;
        let right = LEFT + w * columns as i32 + 20;
        let rows = [
            (Key::Swatch(shade(0.25)), "fits, 25 % of the limit".to_string()),
            (Key::Swatch(shade(0.75)), "fits, 75 % of the limit".to_string()),
            (Key::Swatch(shade(1.0)), "fits, at the limit".to_string()),
            (Key::Swatch(OVER), "× does not fit".to_string()),
            (Key::Swatch(REFUSED), "– refused by the runtime".to_string()),
        ];
        legend(root, (right, TOP), &rows)
    }
}

/// A cell's colour and mark.
fn cell_style(point: &GridPoint) -> (RGBColor, Option<&'static str>) {
    if point.refused.is_some() {
        (REFUSED, Some("–"))
    } else if !point.fits {
        (OVER, Some("×"))
    } else {
        (shade(point.utilisation), None)
    }
}
