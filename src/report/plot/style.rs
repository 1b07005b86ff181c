//! The look every chart shares: the embedded font, colours, markers, line styles, byte and time
//! scales, the legend, label placement, and the one function that renders a chart as PNG and SVG.
//!
//! Charts must read when printed in greyscale, so each policy gets a colour from a colour-blind
//! safe palette (Okabe–Ito, extended) *and* its own marker shape; block states use fills of clearly
//! different lightness. Text uses DejaVu Sans from the `dejavu` crate, registered with plotters'
//! `ab_glyph` backend once per process, so no system font is needed (plotters' default font path
//! needs fontconfig).

use super::printable::PrintableText;
use crate::error::{Error, ErrorKind, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::{Path, PathBuf};
use std::sync::Once;

/// The font family every chart uses (registered by `ensure_font`).
pub const FONT: &str = "sans-serif";

/// The outcome of drawing: plotters' errors carried as text (they are generic over the backend).
pub type ChartResult<T = ()> = std::result::Result<T, String>;

/// Turns any displayable drawing error into the text of a [`ChartResult`].
pub trait OrDrawError<T> {
    /// The value, or the error's text.
    fn or_draw_error(self) -> ChartResult<T>;
}

impl<T, E: std::fmt::Display> OrDrawError<T> for std::result::Result<T, E> {
    fn or_draw_error(self) -> ChartResult<T> {
        self.map_err(|e| e.to_string())
    }
}

/// Registers DejaVu Sans (regular and bold) as [`FONT`]; later calls do nothing.
pub(crate) fn ensure_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a font compiled into the binary: registration cannot fail on them, and if
        // it did, drawing text would return `FontUnavailable`, which surfaces as a report error.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// A chart that can draw itself on any plotters backend.
pub trait Chart {
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws the whole chart on `root` (already filled white).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult;
}

/// Renders `chart` as `DIR/STEM.png` and `DIR/STEM.svg` and returns both paths.
pub(crate) fn write_chart(chart: &impl Chart, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    ensure_font();
    let size = chart.size();
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    let fail = |path: &Path, e: String| {
        Error::new(ErrorKind::Io, format!("drawing chart: {e}")).in_file(path)
    };
    {
        let root = PrintableText(BitMapBackend::new(&png, size)).into_drawing_area();
        root.fill(&WHITE).or_draw_error().map_err(|e| fail(&png, e))?;
        chart.draw(&root).map_err(|e| fail(&png, e))?;
        root.present().or_draw_error().map_err(|e| fail(&png, e))?;
    }
    {
        let root = PrintableText(SVGBackend::new(&svg, size)).into_drawing_area();
        root.fill(&WHITE).or_draw_error().map_err(|e| fail(&svg, e))?;
        chart.draw(&root).map_err(|e| fail(&svg, e))?;
        root.present().or_draw_error().map_err(|e| fail(&svg, e))?;
    }
    Ok(vec![png, svg])
}

/// Text of `size` pixels in [`FONT`], dark grey.
pub(crate) fn text(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&INK)
}

/// Bold text of `size` pixels.
pub(crate) fn bold(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().style(FontStyle::Bold).color(&INK)
}

/// Text anchored at `h`/`v` of its box.
pub(crate) fn anchored(style: TextStyle<'static>, h: HPos, v: VPos) -> TextStyle<'static> {
    style.pos(Pos::new(h, v))
}

/// Title size in pixels.
pub const TITLE: u32 = 22;
/// Axis description and legend size.
pub const LABEL: u32 = 16;
/// Tick label size.
pub const TICK: u32 = 14;
/// Small annotation size.
pub const SMALL: u32 = 13;

/// Near-black for text and axes.
pub const INK: RGBColor = RGBColor(34, 34, 34);
/// Grid lines.
pub const GRID: RGBColor = RGBColor(230, 230, 230);
/// The live-requested floor (filled).
pub const FLOOR_FILL: RGBColor = RGBColor(214, 214, 214);
/// The floor's outline.
pub const FLOOR_LINE: RGBColor = RGBColor(120, 120, 120);

/// Bytes the program asked for (dark: reads as black in greyscale).
pub const REQUESTED: RGBColor = RGBColor(31, 60, 110);
/// Bytes lost to the policy's rounding (mid lightness).
pub const ROUNDING: RGBColor = RGBColor(213, 120, 0);
/// Bytes held in cached free blocks (light).
pub const CACHED: RGBColor = RGBColor(176, 212, 236);

/// One policy's colour, by its position in the report (Okabe–Ito order, extended).
pub(crate) fn policy_color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(0, 114, 178),   // blue
        RGBColor(213, 94, 0),    // vermillion
        RGBColor(0, 158, 115),   // bluish green
        RGBColor(204, 121, 167), // reddish purple
        RGBColor(34, 34, 34),    // black
        RGBColor(230, 159, 0),   // orange
        RGBColor(86, 180, 233),  // sky blue
        RGBColor(136, 34, 85),   // wine
        RGBColor(153, 153, 51),  // olive
        RGBColor(119, 119, 119), // grey
    ];
    PALETTE[i % PALETTE.len()]
}

/// A marker shape; each policy gets its own, so lines stay apart in greyscale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// Filled circle.
    Circle,
    /// Filled square.
    Square,
    /// Filled upward triangle.
    Triangle,
    /// Filled diamond.
    Diamond,
    /// An × cross.
    Cross,
    /// Open circle.
    OpenCircle,
    /// Open square.
    OpenSquare,
    /// Filled downward triangle.
    TriangleDown,
    /// A + plus.
    Plus,
    /// Open diamond.
    OpenDiamond,
}

/// One policy's marker, by its position in the report.
pub(crate) fn policy_marker(i: usize) -> Marker {
    const MARKERS: [Marker; 10] = [
        Marker::Circle,
        Marker::Square,
        Marker::Triangle,
        Marker::Diamond,
        Marker::Cross,
        Marker::OpenCircle,
        Marker::OpenSquare,
        Marker::TriangleDown,
        Marker::Plus,
        Marker::OpenDiamond,
    ];
    // Offset by the palette's period so colour/marker pairs repeat only after 10 × 11 policies.
    MARKERS[(i + i / 10) % MARKERS.len()]
}

/// Draws `marker` centred at pixel `(x, y)` with half-size `r`.
pub(crate) fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    marker: Marker,
    (x, y): (i32, i32),
    r: i32,
    color: RGBColor,
) -> ChartResult {
    let fill = color.filled();
    let line = color.stroke_width(2);
    let white = WHITE.filled();
    match marker {
        Marker::Circle => area.draw(&Circle::new((x, y), r, fill)),
        Marker::OpenCircle => {
            area.draw(&Circle::new((x, y), r, white)).or_draw_error()?;
            area.draw(&Circle::new((x, y), r, line))
        }
        Marker::Square => area.draw(&Rectangle::new([(x - r, y - r), (x + r, y + r)], fill)),
        Marker::OpenSquare => {
            area.draw(&Rectangle::new([(x - r, y - r), (x + r, y + r)], white)).or_draw_error()?;
            area.draw(&Rectangle::new([(x - r, y - r), (x + r, y + r)], line))
        }
        Marker::Triangle => area.draw(&Polygon::new(
            vec![(x, y - r - 1), (x - r - 1, y + r), (x + r + 1, y + r)],
            fill,
        )),
        Marker::TriangleDown => area.draw(&Polygon::new(
            vec![(x, y + r + 1), (x - r - 1, y - r), (x + r + 1, y - r)],
            fill,
        )),
        Marker::Diamond => area.draw(&Polygon::new(
            vec![(x, y - r - 1), (x + r + 1, y), (x, y + r + 1), (x - r - 1, y)],
            fill,
        )),
        Marker::OpenDiamond => {
            let pts = vec![(x, y - r - 1), (x + r + 1, y), (x, y + r + 1), (x - r - 1, y)];
            area.draw(&Polygon::new(pts.clone(), white)).or_draw_error()?;
            let mut closed = pts;
            closed.push((x, y - r - 1));
            area.draw(&PathElement::new(closed, line))
        }
        Marker::Cross => {
            area.draw(&PathElement::new(vec![(x - r, y - r), (x + r, y + r)], line))
                .or_draw_error()?;
            area.draw(&PathElement::new(vec![(x - r, y + r), (x + r, y - r)], line))
        }
        Marker::Plus => {
            area.draw(&PathElement::new(vec![(x - r - 1, y), (x + r + 1, y)], line))
                .or_draw_error()?;
            area.draw(&PathElement::new(vec![(x, y - r - 1), (x, y + r + 1)], line))
        }
    }
    .or_draw_error()
}

/// How a legend entry's sample is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sample {
    /// A solid line of the colour, with an optional marker in its middle.
    Line(RGBColor, Option<Marker>),
    /// A dashed line of the colour.
    Dashed(RGBColor),
    /// A filled box of the colour.
    Swatch(RGBColor),
    /// A wide, translucent band of the colour: a reference line drawn under the others.
    Band(RGBColor),
    /// No sample: a heading.
    Heading,
}

/// One line of a legend.
#[derive(Clone, Debug, PartialEq)]
pub struct LegendEntry {
    /// What the entry looks like.
    pub(crate) sample: Sample,
    /// Its text.
    pub(crate) label: String,
}

/// The recorded run's colour (a hue no policy has): a [`Sample::Band`] on the timeline, a bar
/// in the peaks chart.
pub const RECORDED: RGBColor = RGBColor(112, 48, 160);

/// [`RECORDED`] as a [`Sample::Band`] shows it over white: the recorded bar's fill.
pub const RECORDED_FILL: RGBColor = RGBColor(205, 183, 222);

/// The opacity of a [`Sample::Band`] line.
pub const BAND_ALPHA: f64 = 0.35;
/// The width of a [`Sample::Band`] line in pixels.
pub const BAND_WIDTH: u32 = 10;

/// Height of one legend line in pixels.
pub const LEGEND_LINE: i32 = 24;

/// Draws `entries` one per line from pixel `(x, y)` (top left) on `area`.
pub(crate) fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    entries: &[LegendEntry],
) -> ChartResult {
    for (i, e) in entries.iter().enumerate() {
        let cy = y + i as i32 * LEGEND_LINE + LEGEND_LINE / 2;
        let text_x = draw_sample(area, e.sample, (x, cy))?;
        let style = if e.sample == Sample::Heading { bold(LABEL) } else { text(LABEL) };
        area.draw(&Text::new(
            e.label.clone(),
            (text_x, cy),
            anchored(style, HPos::Left, VPos::Center),
        ))
        .or_draw_error()?;
    }
    Ok(())
}

/// Draws entries side by side in one row starting at `(x, cy)` (vertical centre).
pub(crate) fn draw_legend_row<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, cy): (i32, i32),
    entries: &[LegendEntry],
) -> ChartResult {
    let mut x = x;
    for e in entries {
        let text_x = draw_sample(area, e.sample, (x, cy))?;
        let style = anchored(text(LABEL), HPos::Left, VPos::Center);
        area.draw(&Text::new(e.label.clone(), (text_x, cy), style)).or_draw_error()?;
        x = text_x + text_width(&e.label, LABEL) + 28;
    }
    Ok(())
}

/// Draws a chart's title, centred at the top of `root`, a chart `width` pixels wide.
pub(crate) fn draw_title<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    width: u32,
) -> ChartResult {
    let at = (width as i32 / 2, 12);
    root.draw(&Text::new(title, at, anchored(bold(TITLE), HPos::Center, VPos::Top))).or_draw_error()
}

/// A chart with a linear `f64` axis each way, as every chart here draws on.
pub(crate) type Plane<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws the grid, axes and labels of a chart of memory against `x_desc`, as every such chart
/// draws them.
pub(crate) fn draw_memory_mesh<DB: DrawingBackend>(
    chart: &mut Plane<'_, DB>,
    x_desc: &str,
    y_desc: &str,
) -> ChartResult {
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v));
    house_mesh(&mut mesh).draw().or_draw_error()
}

/// Gives `mesh` the look every chart's grid, axes and labels share: label and tick text sizes,
/// a white minor grid, a light major grid and ink-coloured axes.
pub(crate) fn house_mesh<'m, 'a, 'b, X: Ranged, Y: Ranged, DB: DrawingBackend>(
    mesh: &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>,
) -> &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB> {
    mesh.axis_desc_style(text(LABEL))
        .label_style(text(TICK))
        .light_line_style(WHITE)
        .bold_line_style(GRID)
        .axis_style(INK)
}

/// Draws the legend of a chart that splits memory into requested, rounding and cached-free
/// parts (the [`REQUESTED`], [`ROUNDING`] and [`CACHED`] swatches), with each chart's own words
/// for the three, in one row at `at` (see [`draw_legend_row`]).
pub(crate) fn draw_parts_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    [requested, rounding, cached]: [&str; 3],
) -> ChartResult {
    let entry =
        |colour, label: &str| LegendEntry { sample: Sample::Swatch(colour), label: label.into() };
    draw_legend_row(
        area,
        at,
        &[entry(REQUESTED, requested), entry(ROUNDING, rounding), entry(CACHED, cached)],
    )
}

/// Draws one legend sample at `(x, cy)` and returns where its text starts.
fn draw_sample<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    sample: Sample,
    (x, cy): (i32, i32),
) -> ChartResult<i32> {
    match sample {
        Sample::Heading => return Ok(x),
        Sample::Line(c, marker) => {
            area.draw(&PathElement::new(vec![(x, cy), (x + 36, cy)], c.stroke_width(2)))
                .or_draw_error()?;
            if let Some(m) = marker {
                draw_marker(area, m, (x + 18, cy), 5, c)?;
            }
        }
        Sample::Dashed(c) => {
            for k in 0..3 {
                let x0 = x + k * 14;
                area.draw(&PathElement::new(vec![(x0, cy), (x0 + 8, cy)], c.stroke_width(2)))
                    .or_draw_error()?;
            }
        }
        Sample::Band(c) => {
            area.draw(&PathElement::new(
                vec![(x, cy), (x + 36, cy)],
                c.mix(BAND_ALPHA).stroke_width(BAND_WIDTH),
            ))
            .or_draw_error()?;
        }
        Sample::Swatch(c) => {
            area.draw(&Rectangle::new([(x + 6, cy - 8), (x + 30, cy + 8)], c.filled()))
                .or_draw_error()?;
            area.draw(&Rectangle::new([(x + 6, cy - 8), (x + 30, cy + 8)], INK.stroke_width(1)))
                .or_draw_error()?;
        }
    }
    Ok(x + 46)
}

/// An estimate of `s`'s width in pixels at `size` (DejaVu Sans averages ~0.58 em per character).
/// Used for layout before drawing; it errs on the wide side.
pub(crate) fn text_width(s: &str, size: u32) -> i32 {
    (s.chars().count() as f64 * size as f64 * 0.60).ceil() as i32
}

/// `s`, shortened to at most `max` characters with a trailing ellipsis.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

pub use crate::units::ByteScale;

/// A tick label with as few decimals as the axis needs.
pub(crate) fn tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Splits a step function (value holds from each point to the next) at `x` boundaries into dash
/// pieces `[k·period, k·period + dash]`, so a dashed line costs one path per dash however jagged the
/// data is (a dash laid along the path's length would cost one element per zig-zag in SVG).
pub(crate) fn dash_by_x(path: &[(f64, f64)], period: f64, dash: f64) -> Vec<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    let (Some(first), Some(last)) = (path.first(), path.last()) else { return out };
    if period.is_nan() || dash.is_nan() || period <= 0.0 || dash <= 0.0 {
        return vec![path.to_vec()];
    }
    let (x_start, x_end) = (first.0, last.0);
    let mut k = (x_start / period).floor();
    let mut i = 0usize; // index of the first path vertex with x >= the current dash start
    while k * period <= x_end {
        let (a, b) = ((k * period).max(x_start), (k * period + dash).min(x_end));
        k += 1.0;
        if b <= a {
            continue;
        }
        while i < path.len() && path[i].0 < a {
            i += 1;
        }
        let mut piece = vec![(a, value_before(path, i, a))];
        let mut j = i;
        while j < path.len() && path[j].0 <= b {
            piece.push(path[j]);
            j += 1;
        }
        piece.push((b, value_before(path, j, b)));
        out.push(piece);
    }
    out
}

/// The y of the path at `x`, where `i` is the first vertex at or after `x` (linear between
/// vertices; a step path has vertical segments, where the earlier value is taken).
fn value_before(path: &[(f64, f64)], i: usize, x: f64) -> f64 {
    match (i.checked_sub(1).and_then(|k| path.get(k)), path.get(i)) {
        (Some(p), Some(q)) if q.0 > p.0 => p.1 + (q.1 - p.1) * (x - p.0) / (q.0 - p.0),
        (Some(p), _) => p.1,
        (None, Some(q)) => q.1,
        (None, None) => 0.0,
    }
}

/// The vertices of a step line through `(x, y)` points, held until `x_end`.
pub(crate) fn step_path(points: &[(f64, f64)], x_end: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2 + 1);
    for (k, &(x, y)) in points.iter().enumerate() {
        if k > 0 {
            out.push((x, points[k - 1].1));
        }
        out.push((x, y));
    }
    if let Some(&(x, y)) = points.last() {
        if x_end > x {
            out.push((x_end, y));
        }
    }
    out
}

/// The value of a step function (points sorted by x) at `x`.
pub(crate) fn step_value(points: &[(f64, f64)], x: f64) -> Option<f64> {
    let k = points.partition_point(|p| p.0 <= x);
    k.checked_sub(1).and_then(|k| points.get(k)).map(|p| p.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_path_holds_each_value_until_the_next_point() {
        let p = step_path(&[(0.0, 1.0), (2.0, 3.0)], 5.0);
        assert_eq!(p, vec![(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0)]);
        assert_eq!(step_value(&[(0.0, 1.0), (2.0, 3.0)], 1.9), Some(1.0));
        assert_eq!(step_value(&[(0.0, 1.0), (2.0, 3.0)], 2.0), Some(3.0));
        assert_eq!(step_value(&[(1.0, 1.0)], 0.5), None);
    }

    #[test]
    fn dashes_cut_by_x_and_keep_the_vertices_inside() {
        let path = step_path(&[(0.0, 0.0), (1.5, 10.0), (1.6, 0.0)], 4.0);
        let dashes = dash_by_x(&path, 2.0, 1.8);
        assert_eq!(dashes.len(), 2, "{dashes:?}"); // [0,1.8], [2,3.8]
        assert_eq!(dashes[0].first(), Some(&(0.0, 0.0)));
        // The spike at 1.5..1.6 lies inside the first dash, whole.
        assert!(dashes[0].contains(&(1.5, 10.0)) && dashes[0].contains(&(1.6, 10.0)));
        assert_eq!(dashes[0].last(), Some(&(1.8, 0.0)));
        assert_eq!(dashes[1].first(), Some(&(2.0, 0.0)));
        assert!(dash_by_x(&[], 1.0, 0.5).is_empty());
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(12.0), "12");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.126), "0.13");
        assert_eq!(tick(12.26), "12.3");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
