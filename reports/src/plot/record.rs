//! Where a figure's text lands: a backend that draws nothing and records each text's box as
//! the PNG backend ([`super::bitmap::Bitmap`]) would ink it (plotters' measure of the text in
//! the embedded font, moved by its anchor and rotated by its transform, from the top of the
//! layout box down to the font's descent below the baseline), so that a layout can be checked:
//! no text past the canvas, no two texts over each other ([`Layout::faults`]).

use super::{Figure, PlotError, font, register_embedded_font};
use ab_glyph::{Font, ScaleFont};
use plotters::prelude::{DrawingBackend, IntoDrawingArea};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};
use std::convert::Infallible;

/// One drawn text and the pixels it covers: `left..right` by `top..bottom`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextBox {
    /// The words drawn.
    pub text: String,
    /// The leftmost pixel column it may ink.
    pub left: i32,
    /// The topmost pixel row.
    pub top: i32,
    /// One past the rightmost column.
    pub right: i32,
    /// One past the lowest row (the descent below the baseline included).
    pub bottom: i32,
}

impl TextBox {
    /// Whether the two boxes share a pixel.
    pub fn overlaps(&self, other: &TextBox) -> bool {
        self.left < other.right
            && other.left < self.right
            && self.top < other.bottom
            && other.top < self.bottom
    }
}

/// Every text a figure draws, and the canvas.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The canvas, width and height in pixels.
    pub size: (u32, u32),
    /// The texts in drawing order (empty and blank ones left out: nothing is inked).
    pub boxes: Vec<TextBox>,
}

impl Layout {
    /// What is wrong with the layout, one line each: a text that leaves the canvas, two texts
    /// that overlap. Empty for a clean layout.
    pub fn faults(&self) -> Vec<String> {
        let (width, height) = (self.size.0 as i32, self.size.1 as i32);
        let mut faults = Vec::new();
        for b in &self.boxes {
            if b.left < 0 || b.top < 0 || b.right > width || b.bottom > height {
                faults.push(format!(
                    "`{}` leaves the {width}×{height} canvas: x {}..{}, y {}..{}",
                    b.text, b.left, b.right, b.top, b.bottom
                ));
            }
        }
        for (i, a) in self.boxes.iter().enumerate() {
            for b in &self.boxes[i + 1..] {
                if a.overlaps(b) {
                    faults.push(format!(
                        "`{}` (x {}..{}, y {}..{}) overlaps `{}` (x {}..{}, y {}..{})",
                        a.text, a.left, a.right, a.top, a.bottom, b.text, b.left, b.right, b.top, b.bottom
                    ));
                }
            }
        }
        faults
    }
}

/// Draws `figure` on a recording backend: where each of its texts lands.
pub fn text_boxes(figure: &impl Figure) -> Result<Layout, PlotError> {
    register_embedded_font()?;
    let size = figure.size();
    let mut boxes = Vec::new();
    {
        let area = Recorder { size, boxes: &mut boxes }.into_drawing_area();
        figure.draw(&area).map_err(|e| PlotError(e.to_string()))?;
    }
    Ok(Layout { size, boxes })
}

/// The recording backend.
struct Recorder<'a> {
    size: (u32, u32),
    boxes: &'a mut Vec<TextBox>,
}

type Done = Result<(), DrawingErrorKind<Infallible>>;

impl DrawingBackend for Recorder<'_> {
    type ErrorType = Infallible;

    fn get_size(&self) -> (u32, u32) {
        self.size
    }

    fn ensure_prepared(&mut self) -> Done {
        Ok(())
    }

    fn present(&mut self) -> Done {
        Ok(())
    }

    fn draw_pixel(&mut self, _: BackendCoord, _: BackendColor) -> Done {
        Ok(())
    }

    fn draw_line<S: BackendStyle>(&mut self, _: BackendCoord, _: BackendCoord, _: &S) -> Done {
        Ok(())
    }

    fn draw_rect<S: BackendStyle>(&mut self, _: BackendCoord, _: BackendCoord, _: &S, _: bool) -> Done {
        Ok(())
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(&mut self, _: I, _: &S) -> Done {
        Ok(())
    }

    fn draw_circle<S: BackendStyle>(&mut self, _: BackendCoord, _: u32, _: &S, _: bool) -> Done {
        Ok(())
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(&mut self, _: I, _: &S) -> Done {
        Ok(())
    }

    fn blit_bitmap(&mut self, _: BackendCoord, _: (u32, u32), _: &[u8]) -> Done {
        Ok(())
    }

    fn draw_text<TStyle: BackendTextStyle>(&mut self, text: &str, style: &TStyle, pos: BackendCoord) -> Done {
        if text.trim().is_empty() || style.color().alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) =
            style.layout_box(text).map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        // Anchored as the PNG backend anchors it.
        let (dx, dy) = super::bitmap::anchor_offset(style, width, height);
        let descent = -font().as_scaled(style.size() as f32).descent();
        let corners = [(dx, dy), (dx + width, dy + height + descent.ceil() as i32)];
        let transform = style.transform();
        let (a, b) = (
            transform.transform(corners[0].0, corners[0].1),
            transform.transform(corners[1].0, corners[1].1),
        );
        self.boxes.push(TextBox {
            text: text.to_string(),
            left: pos.0 + a.0.min(b.0),
            top: pos.1 + a.1.min(b.1),
            right: pos.0 + a.0.max(b.0),
            bottom: pos.1 + a.1.max(b.1),
        });
        Ok(())
    }
}
