//! The report's charts, one file each, every one written as PNG and SVG through
//! `style::write_chart`. Colours, markers, fonts and shared drawing helpers live in [`style`],
//! so no chart copies another's plotting code.

pub mod fragmentation;
pub mod labels;
pub mod peaks;
mod printable;
pub mod segments;
pub mod sites;
pub mod sizes;
pub mod style;
pub mod timeline;

use super::bundle::{PolicyRun, ReportData, TraceSummary, PLOT_POINTS};
use crate::error::Result;
use crate::metrics::Point;
use std::path::{Path, PathBuf};

/// The points of `run`'s series that a chart draws: at most [`PLOT_POINTS`], every peak kept
/// (see [`crate::metrics::series::downsample`]).
pub(crate) fn plotted_points(run: &PolicyRun) -> Vec<Point> {
    run.output.series.as_ref().map(|s| s.downsampled(PLOT_POINTS)).unwrap_or_default()
}

/// The points of the recorded run's reserved-memory series that the timeline draws (empty when
/// the trace records none).
pub(crate) fn recorded_points(data: &ReportData) -> Vec<Point> {
    data.recorded_series.as_ref().map(|s| s.downsampled(PLOT_POINTS)).unwrap_or_default()
}

/// `(x, f(point))` for each point, x as [`TraceSummary::x_of`] places it.
pub(crate) fn xy(
    trace: &TraceSummary,
    points: &[Point],
    f: impl Fn(&Point) -> f64,
) -> Vec<(f64, f64)> {
    points.iter().map(|p| (trace.x_of(p.time_us, p.event), f(p))).collect()
}

/// The x range every time chart shares: from the first event to a little past the last, so the
/// value after the last event shows as a short step rather than a jump at the frame's edge.
pub(crate) fn x_range(trace: &TraceSummary) -> std::ops::Range<f64> {
    let end = trace.x_end();
    let pad = if trace.has_times { end * 0.01 } else { 1.0 };
    0.0..if end > 0.0 { end + pad } else { 1.0 }
}

/// Writes `timeline.png` and `timeline.svg`; with more policies than the main timeline draws
/// ([`timeline::MOST_DRAWN`]), also `timeline-all.png` and `.svg` with every policy.
pub(crate) fn write_timeline(data: &ReportData, dir: &Path) -> Result<Vec<PathBuf>> {
    let main = timeline::Timeline::main(data);
    let focused = main.runs.len() < data.runs.len();
    let mut files = style::write_chart(&main, dir, "timeline")?;
    if focused {
        files.extend(style::write_chart(&timeline::Timeline::every(data), dir, "timeline-all")?);
    }
    Ok(files)
}

/// Writes `peaks.png` and `peaks.svg`.
pub(crate) fn write_peaks(data: &ReportData, dir: &Path) -> Result<Vec<PathBuf>> {
    style::write_chart(&peaks::Peaks { data }, dir, "peaks")
}

/// Writes `sites.png` and `sites.svg` (nothing when no policy was broken down by site).
pub(crate) fn write_sites(data: &ReportData, dir: &Path) -> Result<Vec<PathBuf>> {
    if data.sites.is_empty() {
        return Ok(Vec::new());
    }
    style::write_chart(&sites::Sites { data }, dir, "sites")
}

/// Writes `fragmentation.png` and `fragmentation.svg`.
pub(crate) fn write_fragmentation(data: &ReportData, dir: &Path) -> Result<Vec<PathBuf>> {
    style::write_chart(&fragmentation::Fragmentation { data }, dir, "fragmentation")
}

/// Writes `segments.png` and `segments.svg`.
pub(crate) fn write_segments(data: &ReportData, dir: &Path) -> Result<Vec<PathBuf>> {
    style::write_chart(&segments::SegmentChart::new(data), dir, "segments")
}

/// Writes `sizes.png` and `sizes.svg`.
pub(crate) fn write_sizes(data: &ReportData, dir: &Path) -> Result<Vec<PathBuf>> {
    style::write_chart(&sizes::Sizes { data }, dir, "sizes")
}
