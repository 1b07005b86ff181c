//! `fragmentation.*`: 1 − allocated ÷ reserved over time, one small panel per policy (shared x
//! axis, 0–100 % y axis), with the moment of peak reserved memory marked by a vertical line and
//! the policy's marker.
//!
//! One panel per policy rather than many lines on one plot: fragmentation curves jump between 0
//! and high values many times, and eight such curves on one plot cannot be told apart.

use super::style::*;
use super::{plotted_points, x_range};
use crate::report::bundle::{PolicyRun, ReportData, TraceSummary};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The chart; see the module docs.
pub struct Fragmentation<'a> {
    /// What to draw.
    pub(crate) data: &'a ReportData,
}

const PANEL: u32 = 140;
const LONG_DESC: &str = "fragmentation (% of reserved bytes held in free blocks)";
const TOP: u32 = 56;
const BOTTOM: u32 = 60;

/// Pieces of the fragmentation step line of `run` in percent: broken where reserved is zero
/// (no memory held, so no fragmentation to speak of).
pub(crate) fn fragmentation_pieces(trace: &TraceSummary, run: &PolicyRun) -> Vec<Vec<(f64, f64)>> {
    let pts = plotted_points(run);
    let x_end = x_range(trace).end;
    let mut pieces = Vec::new();
    let mut current: Vec<(f64, f64)> = Vec::new();
    for (k, p) in pts.iter().enumerate() {
        let x = trace.x_of(p.time_us, p.event);
        if p.reserved == 0 {
            if !current.is_empty() {
                current.push((x, current.last().map_or(0.0, |c| c.1)));
                pieces.push(std::mem::take(&mut current));
            }
            continue;
        }
        let f = 100.0 * (1.0 - p.allocated.min(p.reserved) as f64 / p.reserved as f64);
        if let Some(&(_, prev)) = current.last() {
            current.push((x, prev));
        }
        current.push((x, f));
        if k + 1 == pts.len() && x_end > x {
            current.push((x_end, f));
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

impl Chart for Fragmentation<'_> {
    fn size(&self) -> (u32, u32) {
        (1300, TOP + BOTTOM + (PANEL * self.data.runs.len().max(1) as u32).max(200))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let data = self.data;
        let trace = &data.trace;
        let (w, h) = self.size();
        let title = format!(
            "Fragmentation (1 − allocated ÷ reserved) over time: {} (device {})",
            truncate(&trace.file_name(), 50),
            trace.device
        );
        draw_title(root, &title, w)?;
        let body = root.margin(TOP, 0, 0, 0);
        let (panels_area, axis_area) = body.split_vertically(h as i32 - TOP as i32 - BOTTOM as i32);
        let panels = panels_area.split_evenly((data.runs.len().max(1), 1));
        let xr = x_range(trace);
        let last = data.runs.len().saturating_sub(1);
        for (i, (run, area)) in data.runs.iter().zip(&panels).enumerate() {
            let color = policy_color(run.index);
            let mut chart = ChartBuilder::on(area)
                .margin_left(12)
                .margin_right(24)
                .margin_top(28)
                .margin_bottom(4)
                .y_label_area_size(78)
                .x_label_area_size(if i == last { 24 } else { 0 })
                .build_cartesian_2d(xr.clone(), 0.0..100.0)
                .or_draw_error()?;
            let mut mesh = chart.configure_mesh();
            mesh.y_labels(3)
                .y_label_formatter(&|v| format!("{v:.0}%"))
                .x_label_formatter(&|v| tick(*v));
            house_mesh(&mut mesh);
            if i != last {
                mesh.disable_x_axis();
            }
            mesh.draw().or_draw_error()?;
            let d = &run.output.detail;
            let peak_x = trace.x_of(d.peak_reserved_time_us, d.peak_reserved_event);
            // The peak reserved moment (reserved first reaches its peak): a dashed vertical line.
            let top = chart.backend_coord(&(peak_x, 100.0));
            let bottom = chart.backend_coord(&(peak_x, 0.0));
            let mut y = top.1;
            while y < bottom.1 {
                root.draw(&PathElement::new(
                    vec![(top.0, y), (top.0, (y + 5).min(bottom.1))],
                    INK.stroke_width(1),
                ))
                .or_draw_error()?;
                y += 9;
            }
            for piece in fragmentation_pieces(trace, run) {
                chart
                    .draw_series(std::iter::once(PathElement::new(piece, color.stroke_width(2))))
                    .or_draw_error()?;
            }
            let frag = run.output.result.fragmentation_at_peak * 100.0;
            let at = chart.backend_coord(&(peak_x, frag));
            draw_marker(root, policy_marker(run.index), at, 6, color)?;
            // The panel's name, above its plot (never over its data).
            let corner = chart.backend_coord(&(xr.start, 100.0));
            let label = format!(
                "{}: {:.1}% at peak reserved (event {})",
                run.label, frag, d.peak_reserved_event
            );
            draw_marker(root, policy_marker(run.index), (corner.0 + 8, corner.1 - 13), 5, color)?;
            root.draw(&Text::new(
                label,
                (corner.0 + 20, corner.1 - 13),
                anchored(bold(LABEL), HPos::Left, VPos::Center),
            ))
            .or_draw_error()?;
        }
        root.draw(&Text::new(
            // The long description where the panels are tall enough for it.
            if text_width(LONG_DESC, LABEL) < h as i32 - TOP as i32 - BOTTOM as i32 {
                LONG_DESC
            } else {
                "fragmentation (%)"
            },
            (16, TOP as i32 + (h as i32 - TOP as i32 - BOTTOM as i32) / 2),
            anchored(text(LABEL), HPos::Center, VPos::Center).transform(FontTransform::Rotate270),
        ))
        .or_draw_error()?;
        axis_area
            .draw(&Text::new(
                trace.x_desc(),
                (w as i32 / 2, 22),
                anchored(text(LABEL), HPos::Center, VPos::Top),
            ))
            .or_draw_error()?;
        Ok(())
    }
}
