//! A plotters backend that writes every text out with [`printable`] before drawing it.

use crate::trace::sites::printable;
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

/// The backend `DB` with every text it is given written out by [`printable`] before it is
/// measured or drawn. A chart's text holds names from the trace (its file name, sites,
/// annotations); the SVG backend escapes `<` and `&` but passes control characters, which XML
/// forbids even as references. [`super::style::write_chart`] wraps both its backends in this:
/// the one place every chart's titles, labels and ticks pass, so each SVG is well-formed XML
/// whatever a chart is asked to write, and the PNG shows the same text.
pub(crate) struct PrintableText<DB>(pub(crate) DB);

/// A drawing error of the backend `DB`.
type DrawResult<DB> = std::result::Result<(), DrawingErrorKind<<DB as DrawingBackend>::ErrorType>>;

impl<DB: DrawingBackend> DrawingBackend for PrintableText<DB> {
    type ErrorType = DB::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    fn ensure_prepared(&mut self) -> DrawResult<DB> {
        self.0.ensure_prepared()
    }

    fn present(&mut self) -> DrawResult<DB> {
        self.0.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> DrawResult<DB> {
        self.0.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> DrawResult<DB> {
        self.0.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> DrawResult<DB> {
        self.0.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> DrawResult<DB> {
        self.0.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> DrawResult<DB> {
        self.0.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> DrawResult<DB> {
        self.0.fill_polygon(vert, style)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> DrawResult<DB> {
        self.0.draw_text(&printable(text), style, pos)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> std::result::Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        self.0.estimate_text_size(&printable(text), style)
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> DrawResult<DB> {
        self.0.blit_bitmap(pos, size, src)
    }
}
