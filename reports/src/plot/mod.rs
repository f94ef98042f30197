//! Plots for docs, drawn with plotters: each figure is one type that draws itself onto any
//! plotters backend ([`Figure`]); [`render`] picks SVG or PNG.
//!
//! - Text is measured and drawn with DejaVu Sans, embedded in the binary (`assets/`, with its
//!   licence) and registered with plotters' `ab_glyph` font table, so PNG text renders on a
//!   machine without system fonts and SVG layout does not depend on what fonts are installed.
//! - SVG is deterministic: the same figure gives the same bytes (plotters writes elements in
//!   drawing order with integer pixel coordinates; nothing here iterates a hash map or reads
//!   the clock).
//! - PNG is plotters' RGB bitmap (with text drawn by [`bitmap::Bitmap`]) encoded by the `png`
//!   crate.
//! - Words are laid out in pixels measured in the embedded font (`measure.rs`): titles wrap,
//!   labels are cut to their room or left out where they would touch another, so that no text
//!   leaves the canvas or overlaps another; [`text_boxes`] records where each text lands, and
//!   the tests hold every figure to that (`tests.rs`).
//!
//! Colours follow Okabe and Ito's palette for colour-blind readers; one colour per component,
//! the same in every figure.

mod bitmap;
mod breakdown;
mod grid;
mod measure;
mod placement;
mod record;
mod sweep;
#[cfg(test)]
mod tests;
mod timeline;

pub use breakdown::Breakdown;
pub use grid::GridFigure;
pub use placement::PlacementFigure;
pub use record::{Layout, TextBox, text_boxes};
pub use sweep::SweepFigure;
pub use timeline::TimelineFigure;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use std::path::Path;
use std::sync::OnceLock;
use vramplan_sim::estimate::Part;
use vramplan_sim::workload::{Engine, Finetune, GradCheckpointing, Mode, Parallelism, Quant, Workload};

/// The file formats a plot is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// Scalable vector graphics, text as text.
    Svg,
    /// A bitmap, text rasterised with the embedded font.
    Png,
}

impl ImageFormat {
    /// The format a file name asks for by its extension (`.svg`, `.png`, any case); `None`
    /// for any other.
    pub fn from_path(path: &Path) -> Option<ImageFormat> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "svg" => Some(ImageFormat::Svg),
            "png" => Some(ImageFormat::Png),
            _ => None,
        }
    }
}

/// Why a figure could not be drawn (a font or encoder failure: the inputs cannot cause one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotError(pub String);

impl std::fmt::Display for PlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "could not draw the plot: {}", self.0)
    }
}

/// A figure: its size in pixels, and how it draws itself on a backend's whole area.
pub trait Figure {
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the figure on `area` (the whole image, white already).
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Drawn<DB>;
}

/// What drawing on a backend returns.
pub type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The embedded font (DejaVu Sans 2.37; licence in `assets/DejaVuSans-LICENSE.txt`).
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// The family every text style names; registered once per process.
pub(crate) const FAMILY: &str = "sans-serif";

/// The embedded font, parsed once, for measuring text.
pub(crate) fn font() -> &'static ab_glyph::FontRef<'static> {
    static PARSED: OnceLock<ab_glyph::FontRef<'static>> = OnceLock::new();
    PARSED.get_or_init(|| ab_glyph::FontRef::try_from_slice(FONT).expect("the embedded font parses"))
}

fn register_embedded_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(PlotError("the embedded font does not parse".into())) }
}

/// `figure` as the bytes of a file in `format`.
pub fn render(figure: &impl Figure, format: ImageFormat) -> Result<Vec<u8>, PlotError> {
    register_embedded_font()?;
    let (width, height) = figure.size();
    let failed = |e: &dyn std::fmt::Display| PlotError(e.to_string());
    match format {
        ImageFormat::Svg => {
            let mut text = String::new();
            {
                let area = SVGBackend::with_string(&mut text, (width, height)).into_drawing_area();
                area.fill(&WHITE).map_err(|e| failed(&e))?;
                figure.draw(&area).map_err(|e| failed(&e))?;
                area.present().map_err(|e| failed(&e))?;
            }
            // A name from an input file may hold control characters, which XML does not allow.
            Ok(crate::terminal_safe(&text).into_owned().into_bytes())
        }
        ImageFormat::Png => {
            let mut rgb = vec![0u8; width as usize * height as usize * 3];
            {
                let font = ab_glyph::FontRef::try_from_slice(FONT).map_err(|e| failed(&e))?;
                let inner = BitMapBackend::with_buffer(&mut rgb, (width, height));
                let area = bitmap::Bitmap { inner, font }.into_drawing_area();
                area.fill(&WHITE).map_err(|e| failed(&e))?;
                figure.draw(&area).map_err(|e| failed(&e))?;
                area.present().map_err(|e| failed(&e))?;
            }
            let mut bytes = Vec::new();
            let mut encoder = png::Encoder::new(&mut bytes, width, height);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            let mut writer = encoder.write_header().map_err(|e| failed(&e))?;
            writer.write_image_data(&rgb).map_err(|e| failed(&e))?;
            writer.finish().map_err(|e| failed(&e))?;
            Ok(bytes)
        }
    }
}

/// Each component's colour (Okabe–Ito), the same in every figure.
pub fn part_colour(part: Part) -> RGBColor {
    match part {
        Part::Weights => RGBColor(0x00, 0x72, 0xB2),
        Part::Gradients => RGBColor(0xE6, 0x9F, 0x00),
        Part::Optimizer => RGBColor(0x00, 0x9E, 0x73),
        Part::Activations => RGBColor(0xCC, 0x79, 0xA7),
        Part::KvCache => RGBColor(0x56, 0xB4, 0xE9),
        Part::Logits => RGBColor(0xD5, 0x5E, 0x00),
        Part::Overhead => RGBColor(0xA0, 0xA0, 0xA0),
    }
}

/// The capacity line (a GPU's total memory).
pub(crate) const CAPACITY: RGBColor = RGBColor(0xB0, 0x00, 0x20);
/// The usable line (what PyTorch may take) and the limit a plan keeps to.
pub(crate) const USABLE: RGBColor = RGBColor(0x33, 0x33, 0x33);
/// Text and axes.
pub(crate) const INK: RGBColor = RGBColor(0x22, 0x22, 0x22);
/// Grid lines and shading.
pub(crate) const FAINT: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);

/// A text style of `size` pixels in the embedded font.
pub(crate) fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(&INK)
}

/// Bytes as GiB, the unit of every axis of bytes.
pub(crate) fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A horizontal dashed line from `x0` to `x1` at `y` (pixels), in `colour`.
pub(crate) fn dashed<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x0, x1): (i32, i32),
    y: i32,
    colour: RGBColor,
) -> Drawn<DB> {
    let mut x = x0;
    while x < x1 {
        let end = (x + 8).min(x1);
        area.draw(&PathElement::new(vec![(x, y), (end, y)], colour.stroke_width(2)))?;
        x += 13;
    }
    Ok(())
}

/// What a legend row shows before its name.
pub(crate) enum Key {
    /// A filled square (a bar's or a cell's colour).
    Swatch(RGBColor),
    /// A solid line.
    Line(RGBColor),
    /// A dashed line.
    Dashed(RGBColor),
    /// A ring (a marker).
    Ring(RGBColor),
}

/// A legend: a key and a name per row, from `(x, y)` down (pixels), each row at most `room`
/// pixels wide (a longer name is cut with an ellipsis).
pub(crate) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    rows: &[(Key, String)],
    room: i32,
) -> Drawn<DB> {
    for (i, (key, name)) in rows.iter().enumerate() {
        let top = y + LEGEND_ROW * i as i32;
        match key {
            Key::Swatch(colour) => {
                area.draw(&Rectangle::new([(x, top), (x + 14, top + 14)], colour.filled()))?
            }
            Key::Line(colour) => {
                area.draw(&PathElement::new(vec![(x, top + 7), (x + 24, top + 7)], colour.stroke_width(2)))?
            }
            Key::Dashed(colour) => dashed(area, (x, x + 24), top + 7, *colour)?,
            Key::Ring(colour) => area.draw(&Circle::new((x + 12, top + 7), 5, colour.stroke_width(2)))?,
        }
        let indent = key.indent();
        area.draw(&Text::new(
            measure::fit(name, LEGEND_TEXT, room - indent),
            (x + indent, top),
            text(LEGEND_TEXT),
        ))?;
    }
    Ok(())
}

/// Pixels between a legend's rows, and the size of its text.
pub(crate) const LEGEND_ROW: i32 = 22;
const LEGEND_TEXT: u32 = 13;

impl Key {
    /// Where a legend row's name starts after its key.
    fn indent(&self) -> i32 {
        if matches!(self, Key::Swatch(_)) { 20 } else { 30 }
    }
}

/// The width of a legend's widest row, uncut.
pub(crate) fn legend_width(rows: &[(Key, String)]) -> i32 {
    rows.iter().map(|(key, name)| key.indent() + measure::width(name, LEGEND_TEXT)).max().unwrap_or(0)
}

/// The title across the top of `area`, on as many lines as [`measure::title_lines`] breaks it
/// into for the area's width ([`measure::title_height`] is the room it takes).
pub(crate) fn title<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, words: &str) -> Drawn<DB> {
    let width = area.dim_in_pixel().0;
    for (k, line) in measure::title_lines(words, width).into_iter().enumerate() {
        let top = measure::title_line_top(k);
        area.draw(&Text::new(line, (measure::TITLE_LEFT, top), text(measure::TITLE_SIZE)))?;
    }
    Ok(())
}

/// A workload in a few words for a heading: `train, LoRA r16, DDP, nf4, batch 4 × 2048 per GPU,
/// 2 × 1024x768 images a sample, checkpointing`; `shape` replaces `batch 4 × 2048` where a figure sweeps it. Training names
/// what is trained (all parameters, or LoRA adapters: a workload does not say whether the
/// weights were pretrained), and the parallelism and engine are named where they are not the
/// default (one copy of the model under transformers).
pub fn workload_words(workload: &Workload, shape: Option<&str>) -> String {
    let mut words = vec![match workload.mode {
        Mode::Train => "train".to_string(),
        Mode::Inference => "inference".to_string(),
    }];
    if workload.mode == Mode::Train {
        words.push(match &workload.finetune {
            Finetune::Full => "all parameters".to_string(),
            Finetune::Lora { rank, .. } => format!("LoRA r{rank}"),
        });
    }
    match &workload.engine {
        Engine::Transformers => {}
        Engine::Vllm { .. } => words.push("vLLM".to_string()),
        Engine::Sglang { .. } => words.push("SGLang".to_string()),
        Engine::LlamaCpp { .. } => words.push("llama.cpp".to_string()),
    }
    let data_parallel = matches!(workload.parallelism, Parallelism::Ddp | Parallelism::Zero { .. });
    match workload.parallelism {
        Parallelism::Single => {}
        Parallelism::Ddp => words.push("DDP".to_string()),
        Parallelism::Zero { stage, offload_optimizer, offload_params } => {
            words.push(if stage >= 3 { "ZeRO-3 / FSDP".to_string() } else { format!("ZeRO-{stage}") });
            if offload_optimizer {
                words.push("optimizer states on the CPU".to_string());
            }
            if offload_params {
                words.push("parameters on the CPU".to_string());
            }
        }
        Parallelism::Tensor { size, pipeline: 1 } => words.push(format!("tensor parallel over {size} GPUs")),
        Parallelism::Tensor { size, pipeline } => {
            words.push(format!("tensor parallel over {size} GPUs in {pipeline} pipeline stages"))
        }
    }
    if workload.quant != Quant::None {
        words.push(crate::quant_name(&workload.quant));
    } else if let Some(dtype) = workload.weight_dtype {
        words.push(dtype.to_string());
    }
    let shape = shape.map_or_else(|| format!("batch {} × {}", workload.batch, workload.seq), str::to_string);
    words.push(if data_parallel { format!("{shape} per GPU") } else { shape });
    if let Some(images) = &workload.images {
        words.push(format!("{} × {}x{} images a sample", images.per_sample, images.width, images.height));
    }
    if workload.mode == Mode::Train && workload.grad_checkpointing != GradCheckpointing::Off {
        words.push("checkpointing".to_string());
    }
    words.join(", ")
}
