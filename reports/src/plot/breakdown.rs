//! `vramplan plot breakdown`: one stacked bar per device, its bytes by component at the peak
//! (the segments sum to device-used, what `nvidia-smi` shows), against the device's capacity
//! (solid line) and what PyTorch may use (dashed); under each bar its verdict and the event
//! of the peak. With a validation's measurements, a second bar beside each: measured
//! allocated, the allocator's cache above it (reserved − allocated), and what the driver
//! counts outside PyTorch (driver-used − reserved).

use super::measure::{self, title_height};
use super::{
    CAPACITY, Drawn, FAINT, Figure, INK, Key, USABLE, dashed, gib, legend, part_colour, text, title,
};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_profiles::units::format_bytes;
use vramplan_sim::estimate::{DeviceEstimate, Part};
use vramplan_validate::DevicePeaks;

/// Measured allocated bytes.
pub(crate) const MEASURED_ALLOCATED: RGBColor = RGBColor(0x3B, 0x3B, 0x5C);
/// Measured reserved but not allocated (the allocator's cache).
pub(crate) const MEASURED_CACHED: RGBColor = RGBColor(0x8C, 0x8C, 0xB4);
/// Measured driver-used beyond reserved (context, other processes).
pub(crate) const MEASURED_OUTSIDE: RGBColor = RGBColor(0xC8, 0xC8, 0xDC);

/// Pixels per device column.
const COLUMN: u32 = 250;
/// Pixels for the legend at the right.
const LEGEND: u32 = 280;
/// Pixels of the figure below the title with one line under each bar; each further line adds
/// [`LINE`].
const BODY: u32 = 580;
/// Pixels per line of words under a bar, their size, and how many at most.
const LINE: i32 = 15;
const WORDS: u32 = 12;
const MOST_LINES: usize = 5;

/// The breakdown of an estimate, and what a validation measured where there is one.
pub struct Breakdown<'a> {
    /// The heading (model, hardware, workload).
    pub title: String,
    /// The estimate's devices.
    pub devices: &'a [DeviceEstimate],
    /// A validation's per-device peaks (`validate --json`'s `run.devices`).
    pub measured: Option<&'a [DevicePeaks]>,
}

impl Breakdown<'_> {
    fn measured_on(&self, device: u32) -> Option<&DevicePeaks> {
        self.measured?.iter().find(|m| m.device == device)
    }

    /// The words under a device's bar, wrapped to its column.
    fn words_under(device: &DeviceEstimate) -> Vec<String> {
        let lines = [
            format!("GPU {} · {}", device.id, device.name),
            verdict(device),
            format!("peak: {}", device.peak_at),
        ];
        let room = COLUMN as i32 - 14;
        let mut out: Vec<String> = Vec::new();
        for line in lines {
            let left = MOST_LINES.saturating_sub(out.len());
            out.extend(measure::wrap(&line, WORDS, room, left));
        }
        out
    }

    /// The room under the bars: the words (below the predicted / measured captions where a
    /// validation is drawn) and a margin.
    fn label_area(&self) -> u32 {
        let lines = self.devices.iter().map(|d| Breakdown::words_under(d).len()).max().unwrap_or(1).max(1);
        let captions = if self.measured.is_some() { 22 } else { 8 };
        (captions + LINE * lines as i32 + 8) as u32
    }

    /// The bar's segments of a measured device, bottom up.
    fn measured_segments(m: &DevicePeaks) -> [(RGBColor, u64); 3] {
        [
            (MEASURED_ALLOCATED, m.allocated_bytes),
            (MEASURED_CACHED, m.reserved_bytes.saturating_sub(m.allocated_bytes)),
            (MEASURED_OUTSIDE, m.driver_used_bytes.saturating_sub(m.reserved_bytes.max(m.allocated_bytes))),
        ]
    }
}

impl Figure for Breakdown<'_> {
    fn size(&self) -> (u32, u32) {
        let columns = self.devices.len().max(1) as u32;
        let width = 120 + LEGEND + COLUMN * columns;
        (width, title_height(&self.title, width) + BODY + self.label_area().saturating_sub(70))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (width, _) = self.size();
        let (plot, side) =
            root.margin(title_height(&self.title, width), 0, 0, 0).split_horizontally(width - LEGEND);
        let top = self
            .devices
            .iter()
            .map(|d| {
                let measured = self.measured_on(d.id).map_or(0, |m| m.driver_used_bytes);
                d.capacity_bytes.max(d.device_used_bytes).max(measured)
            })
            .max()
            .unwrap_or(1 << 30);
        let n = self.devices.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(self.label_area().max(70))
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..n, 0f64..gib(top) * 1.08)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("GiB")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(FAINT)
            .label_style(text(13))
            .axis_desc_style(text(13))
            .draw()?;
        let at = |x: f64, y: f64| chart.plotting_area().map_coordinate(&(x, y));
        for (i, device) in self.devices.iter().enumerate() {
            let left = i as f64;
            let measured = self.measured_on(device.id);
            let (bar, beside) = match measured {
                Some(_) => ((left + 0.1, left + 0.48), Some((left + 0.52, left + 0.9))),
                None => ((left + 0.2, left + 0.8), None),
            };
            let mut bottom = 0u64;
            for part in Part::ALL {
                let bytes = device.components.get(part);
                if bytes == 0 {
                    continue;
                }
                let (a, b) = (at(bar.0, gib(bottom)), at(bar.1, gib(bottom + bytes)));
                root.draw(&Rectangle::new([a, b], part_colour(part).filled()))?;
                bottom += bytes;
            }
            if let (Some(m), Some(span)) = (measured, beside) {
                let mut bottom = 0u64;
                for (colour, bytes) in Breakdown::measured_segments(m) {
                    if bytes == 0 {
                        continue;
                    }
                    let (a, b) = (at(span.0, gib(bottom)), at(span.1, gib(bottom + bytes)));
                    root.draw(&Rectangle::new([a, b], colour.filled()))?;
                    bottom += bytes;
                }
                for (x, words) in [(bar, "predicted"), (span, "measured")] {
                    let (px, py) = at((x.0 + x.1) / 2.0, 0.0);
                    let style = text(11).pos(Pos::new(HPos::Center, VPos::Top));
                    root.draw(&Text::new(words, (px, py + 4), style))?;
                }
            }
            let span = (at(left + 0.04, 0.0).0, at(left + 0.96, 0.0).0);
            let capacity = at(0.0, gib(device.capacity_bytes)).1;
            root.draw(&PathElement::new(
                vec![(span.0, capacity), (span.1, capacity)],
                CAPACITY.stroke_width(2),
            ))?;
            dashed(root, span, at(0.0, gib(device.usable_bytes)).1, USABLE)?;
            let (centre, base) = at(left + 0.5, 0.0);
            let mut y = base + if measured.is_some() { 22 } else { 8 };
            for line in Breakdown::words_under(device) {
                let style = text(WORDS).pos(Pos::new(HPos::Center, VPos::Top));
                root.draw(&Text::new(line, (centre, y), style))?;
                y += LINE;
            }
        }
        let mut rows: Vec<(Key, String)> = Part::ALL
            .into_iter()
            .filter(|p| self.devices.iter().any(|d| d.components.get(*p) > 0))
            .map(|p| (Key::Swatch(part_colour(p)), legend_name(p)))
            .collect();
        if self.measured.is_some() {
            rows.push((Key::Swatch(MEASURED_ALLOCATED), "measured allocated".into()));
            rows.push((Key::Swatch(MEASURED_CACHED), "measured reserved − allocated".into()));
            rows.push((Key::Swatch(MEASURED_OUTSIDE), "measured outside PyTorch".into()));
        }
        rows.push((Key::Line(CAPACITY), "capacity (nvidia-smi total)".into()));
        rows.push((Key::Dashed(USABLE), "usable by PyTorch".into()));
        let room = LEGEND as i32 - 20;
        legend(&side, (10, 30), &rows, room)?;
        let y = 30 + super::LEGEND_ROW * rows.len() as i32 + 10;
        let note = measure::fit("bars: device-used at the peak", 12, room);
        side.draw(&Text::new(note, (10, y), text(12).color(&INK)))?;
        Ok(())
    }
}

/// A component's name in the legend: overhead says what it holds.
fn legend_name(part: Part) -> String {
    match part {
        Part::Overhead => "overhead (context, cache, workspaces)".to_string(),
        _ => crate::estimate::part_name(part).to_string(),
    }
}

/// `fits, 1.2 GiB to spare` or `OOM by 3.4 GiB`, judged as `estimate` judges.
fn verdict(d: &DeviceEstimate) -> String {
    if d.fits {
        format!(
            "{} used · {} spare",
            format_bytes(d.device_used_bytes),
            format_bytes(d.usable_bytes.saturating_sub(d.peak_reserved_bytes))
        )
    } else {
        format!(
            "{} used · OOM by {}",
            format_bytes(d.device_used_bytes),
            format_bytes(d.peak_reserved_bytes.saturating_sub(d.usable_bytes))
        )
    }
}
