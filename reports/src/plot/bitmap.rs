//! The PNG backend: plotters' bitmap backend with text drawn here. plotters' `ab_glyph` text
//! drawing places each glyph at its advance without the glyph's left side bearing, so narrow
//! glyphs (`1`, `i`, `l`) sit against their left neighbour and leave a gap after them; this
//! backend rasterises each glyph with ab_glyph at its pen position plus its own bounds, the
//! layout plotters measured (so anchors agree with the SVG), and every other drawing call is
//! the bitmap backend's.

use ab_glyph::{Font, FontRef, ScaleFont, point};
use plotters::prelude::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

/// A bitmap backend drawing text with correctly placed glyphs of `font`.
pub(crate) struct Bitmap<'a> {
    pub inner: BitMapBackend<'a>,
    pub font: FontRef<'static>,
}

impl DrawingBackend for Bitmap<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let colour = style.color();
        if colour.alpha == 0.0 {
            return Ok(());
        }
        // The box plotters lays the text out in (the same measure the SVG's layout used).
        let ((min_x, min_y), (max_x, max_y)) =
            style.layout_box(text).map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let (dx, dy) = anchor_offset(style, width, height);
        let font = self.font.as_scaled(style.size() as f32);
        // The baseline sits a layout height down, as plotters' box is the text's cap height.
        let baseline = height as f32;
        let transform = style.transform();
        let (w, h) = self.get_size();
        let mut pen = 0f32;
        let mut previous = None;
        let mut pixels: Vec<(i32, i32, f32)> = Vec::new();
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = previous {
                pen += font.kern(p, id);
            }
            previous = Some(id);
            let glyph = id.with_scale_and_position(font.scale(), point(pen, baseline));
            if let Some(outline) = self.font.outline_glyph(glyph) {
                let bounds = outline.px_bounds();
                outline.draw(|x, y, coverage| {
                    pixels.push((bounds.min.x as i32 + x as i32, bounds.min.y as i32 + y as i32, coverage))
                });
            }
            pen += font.h_advance(id);
        }
        for (x, y, coverage) in pixels {
            let (x, y) = transform.transform(x + dx, y + dy);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                let alpha = colour.alpha * f64::from(coverage.clamp(0.0, 1.0));
                self.inner.draw_pixel((x, y), BackendColor { alpha, rgb: colour.rgb })?;
            }
        }
        Ok(())
    }
}

/// Where a text box of `width` × `height` starts from its anchor point, as plotters anchors text
/// (the PNG backend and the recording of text boxes, `record.rs`, place it alike).
pub(super) fn anchor_offset<TStyle: BackendTextStyle>(style: &TStyle, width: i32, height: i32) -> (i32, i32) {
    let dx = match style.anchor().h_pos {
        HPos::Left => 0,
        HPos::Right => -width,
        HPos::Center => -width / 2,
    };
    let dy = match style.anchor().v_pos {
        VPos::Top => 0,
        VPos::Center => -height / 2,
        VPos::Bottom => -height,
    };
    (dx, dy)
}
