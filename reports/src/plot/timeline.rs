//! `vramplan plot timeline`: allocated and reserved bytes over the step's operations, one panel
//! per GPU on a shared axis of operations, the phases (load, forward, loss, backward, optimizer;
//! prefill) shaded behind, what PyTorch may use dashed, and the peak of allocated bytes marked
//! and labelled with its event. The curve is the simulator's aggregated trace
//! ([`vramplan_sim::trace`]), so a large model stays a small file.

use super::measure::{self, title_height};
use super::{Drawn, FAINT, Figure, Key, USABLE, dashed, gib, legend, text, title};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use vramplan_profiles::units::format_bytes;
use vramplan_sim::trace::{Phase, Trace};

/// Allocated bytes.
pub(crate) const ALLOCATED: RGBColor = RGBColor(0x00, 0x72, 0xB2);
/// Reserved bytes.
pub(crate) const RESERVED: RGBColor = RGBColor(0xE6, 0x9F, 0x00);
/// The peak's marker.
pub(crate) const PEAK: RGBColor = RGBColor(0xB0, 0x00, 0x20);

/// Pixels per GPU's panel.
const PANEL: u32 = 250;

/// A step's timeline.
pub struct TimelineFigure<'a> {
    /// The heading (model, hardware, workload).
    pub title: String,
    /// The trace (each GPU with its name and usable memory).
    pub trace: &'a Trace,
}

/// A phase's shade and name.
fn phase_style(phase: Phase) -> (RGBColor, &'static str) {
    match phase {
        Phase::Load => (RGBColor(0xF2, 0xF2, 0xF2), "load"),
        Phase::Forward => (RGBColor(0xE3, 0xF0, 0xFA), "forward"),
        Phase::Loss => (RGBColor(0xFD, 0xEB, 0xD9), "loss"),
        Phase::Backward => (RGBColor(0xF7, 0xE6, 0xF0), "backward"),
        Phase::Optimizer => (RGBColor(0xE2, 0xF4, 0xEC), "optimizer"),
        Phase::Prefill => (RGBColor(0xE3, 0xF0, 0xFA), "prefill"),
    }
}

impl Figure for TimelineFigure<'_> {
    fn size(&self) -> (u32, u32) {
        (1100, title_height(&self.title, 1100) + 20 + PANEL * self.trace.devices.len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Drawn<DB> {
        title(root, &self.title)?;
        let (body, side) = root.margin(title_height(&self.title, 1100), 0, 0, 0).split_horizontally(880);
        let panels = body.split_evenly((self.trace.devices.len().max(1), 1));
        let ops = self.trace.ops.max(1) as f64;
        for (k, (device, panel)) in self.trace.devices.iter().zip(&panels).enumerate() {
            let usable = device.usable_bytes;
            let top = device.samples.iter().map(|s| s.reserved).max().unwrap_or(0).max(usable).max(1 << 20);
            let mut chart = ChartBuilder::on(panel)
                .margin(10)
                .margin_top(22)
                .x_label_area_size(if k + 1 == panels.len() { 40 } else { 16 })
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..ops, 0f64..gib(top) * 1.1)?;
            let at = |x: f64, y: f64| chart.plotting_area().map_coordinate(&(x, y));
            // Phases behind the curves, named where there is room (on the first panel).
            for span in &self.trace.phases {
                let (shade, name) = phase_style(span.phase);
                let (a, b) = (at(span.first_op as f64, gib(top) * 1.1), at(span.end_op as f64, 0.0));
                root.draw(&Rectangle::new([a, b], shade.filled()))?;
                let label = if span.step > 0 { format!("{name} {}", span.step) } else { name.to_string() };
                if k == 0 && measure::width(&label, 11) + 6 <= b.0 - a.0 {
                    root.draw(&Text::new(
                        label,
                        ((a.0 + b.0) / 2, a.1 - 4),
                        text(11).pos(Pos::new(HPos::Center, VPos::Bottom)),
                    ))?;
                }
            }
            let last = k + 1 == panels.len();
            let mut mesh = chart.configure_mesh();
            mesh.disable_x_mesh()
                .y_desc("GiB")
                .y_labels(5)
                .y_label_formatter(&|v| format!("{v:.1}"))
                .light_line_style(FAINT)
                .label_style(text(12))
                .axis_desc_style(text(12));
            if last {
                mesh.x_desc("operations of the step (each allocation and free)")
                    .x_label_formatter(&|v| format!("{v:.0}"));
            } else {
                mesh.x_label_formatter(&|_| String::new());
            }
            mesh.draw()?;
            let at = |x: f64, y: f64| chart.plotting_area().map_coordinate(&(x, y));
            let curve = |pick: fn(&vramplan_sim::trace::Sample) -> u64| -> Vec<(i32, i32)> {
                device.samples.iter().map(|s| at(s.op as f64, gib(pick(s)))).collect()
            };
            root.draw(&PathElement::new(curve(|s| s.reserved), RESERVED.stroke_width(2)))?;
            root.draw(&PathElement::new(curve(|s| s.allocated), ALLOCATED.stroke_width(2)))?;
            let span = (at(0.0, 0.0).0, at(ops, 0.0).0);
            if usable > 0 {
                dashed(root, span, at(0.0, gib(usable)).1, USABLE)?;
            }
            let peak = at(device.peak.op as f64, gib(device.peak.allocated));
            root.draw(&Circle::new(peak, 5, PEAK.stroke_width(2)))?;
            let name = if device.name.is_empty() { String::new() } else { format!(" ({})", device.name) };
            let words = format!(
                "GPU {}{name} · peak (circled) {}: {}",
                device.device,
                format_bytes(device.peak.allocated),
                device.peak_at
            );
            let words = measure::fit(&words, 12, span.1 - span.0 - 12);
            root.draw(&Text::new(words, (span.0 + 6, at(0.0, gib(top) * 1.1).1 + 4), text(12)))?;
        }
        let mut rows = vec![
            (Key::Line(ALLOCATED), "allocated".to_string()),
            (Key::Line(RESERVED), "reserved".to_string()),
        ];
        for phase in
            [Phase::Load, Phase::Forward, Phase::Loss, Phase::Backward, Phase::Optimizer, Phase::Prefill]
        {
            if self.trace.phases.iter().any(|p| p.phase == phase) {
                let (shade, name) = phase_style(phase);
                rows.push((Key::Swatch(shade), name.to_string()));
            }
        }
        rows.push((Key::Dashed(USABLE), "usable by PyTorch".into()));
        rows.push((Key::Ring(PEAK), "peak allocated".into()));
        legend(&side, (10, 30), &rows, 200)?;
        Ok(())
    }
}
