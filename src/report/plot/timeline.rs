//! `timeline.*`: reserved (solid) and allocated (dashed) bytes over time for every policy on one
//! chart, the live requested bytes as a grey floor, each policy's peak marked and labelled.
//!
//! Lines are steps (a value holds until the next event changes it), drawn from the down-sampled
//! series, which keeps every peak exactly. Policies differ by colour and marker shape; the legend
//! sits in its own column right of the plot so it never hides data, and peak labels are spread
//! apart vertically so they never overlap, however many policies there are.

use super::style::{self, *};
use super::{plotted_points, x_range, xy};
use crate::report::bundle::ReportData;
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The chart; see the module docs.
pub struct Timeline<'a> {
    /// What to draw.
    pub data: &'a ReportData,
}

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 780;

impl Timeline<'_> {
    /// The legend's width: its longest label, at least 220 px.
    fn legend_width(&self) -> i32 {
        self.legend().iter().map(|e| text_width(&e.label, LABEL) + 60).max().unwrap_or(200).max(220)
    }

    fn legend(&self) -> Vec<LegendEntry> {
        let mut entries =
            vec![LegendEntry { sample: Sample::Heading, label: "policy (peak reserved)".into() }];
        for run in &self.data.runs {
            entries.push(LegendEntry {
                sample: Sample::Line(policy_color(run.index), Some(policy_marker(run.index))),
                label: format!(
                    "{} ({})",
                    run.label.clone(),
                    format_bytes(run.output.result.peak_reserved_bytes)
                ),
            });
        }
        entries.push(LegendEntry { sample: Sample::Heading, label: String::new() });
        entries.push(LegendEntry { sample: Sample::Heading, label: "line".into() });
        entries.push(LegendEntry { sample: Sample::Line(INK, None), label: "reserved".into() });
        entries.push(LegendEntry { sample: Sample::Dashed(INK), label: "allocated".into() });
        entries.push(LegendEntry {
            sample: Sample::Swatch(FLOOR_FILL),
            label: "live requested".into(),
        });
        if let Some(c) = self.data.capacity {
            let label = if self.capacity_drawn() {
                format!("capacity {}", format_bytes(c))
            } else {
                format!("capacity {} (above the chart)", format_bytes(c))
            };
            entries.push(LegendEntry { sample: Sample::Dashed(CAPACITY), label });
        }
        entries
    }

    /// The highest peak reserved of any policy.
    fn peak(&self) -> u64 {
        self.data.runs.iter().map(|r| r.output.result.peak_reserved_bytes).max().unwrap_or(0)
    }

    /// True when `--capacity` is close enough to the peaks (at most twice the highest) to draw it
    /// without flattening the lines.
    fn capacity_drawn(&self) -> bool {
        self.data.capacity.is_some_and(|c| c <= self.peak().saturating_mul(2))
    }
}

/// Room for the marker at the start of a peak label.
const LABEL_MARK: i32 = 14;

/// The capacity line's colour.
const CAPACITY: RGBColor = RGBColor(200, 0, 0);

impl Chart for Timeline<'_> {
    fn size(&self) -> (u32, u32) {
        let rows = self.data.runs.len() as u32 + 7;
        // A legend wider than 520 px widens the chart rather than cutting a policy's label.
        let wider = (self.legend_width() - 520).max(0) as u32;
        (WIDTH + wider, HEIGHT.max(110 + rows * LEGEND_LINE as u32))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let data = self.data;
        let trace = &data.trace;
        let (w, h) = self.size();
        let legend = self.legend();
        let legend_w = self.legend_width();
        let title = format!(
            "Device memory over time: {} (device {}, {} events)",
            truncate(&trace.file_name(), 60),
            trace.device,
            trace.events
        );
        root.draw(&Text::new(
            title,
            (w as i32 / 2, 12),
            anchored(bold(TITLE), HPos::Center, VPos::Top),
        ))
        .or_draw_error()?;
        let (main, _) = root.split_horizontally(w as i32 - legend_w);

        let mut top = self.peak();
        if let (Some(c), true) = (data.capacity, self.capacity_drawn()) {
            top = top.max(c);
        }
        let scale = ByteScale::for_max(top);
        let y_max = (scale.of(top) * 1.08).max(1e-9);
        let xr = x_range(trace);
        let x_end = xr.end;
        let mut chart = ChartBuilder::on(&main)
            .margin_top(50)
            .margin_left(12)
            .margin_right(24)
            .margin_bottom(8)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(xr.clone(), 0.0..y_max)
            .or_draw_error()?;
        chart
            .configure_mesh()
            .x_desc(trace.x_desc())
            .y_desc(format!("device memory ({})", scale.unit))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .axis_desc_style(text(LABEL))
            .label_style(text(TICK))
            .light_line_style(WHITE)
            .bold_line_style(GRID)
            .axis_style(INK)
            .draw()
            .or_draw_error()?;

        // The floor: live requested bytes (the same for every policy unless one ran out).
        if let Some(first) = data.runs.first() {
            let pts = plotted_points(first);
            let line = step_path(&xy(trace, &pts, |p| scale.of(p.requested)), x_end);
            if let (Some(a), Some(b)) = (line.first(), line.last()) {
                let mut poly = vec![(a.0, 0.0)];
                poly.extend(line.iter().copied());
                poly.push((b.0, 0.0));
                chart
                    .draw_series(std::iter::once(Polygon::new(poly, FLOOR_FILL.filled())))
                    .or_draw_error()?;
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        line,
                        FLOOR_LINE.stroke_width(1),
                    )))
                    .or_draw_error()?;
            }
        }

        // Allocated, dashed (dashes cut by x: a few dozen path elements however jagged the line).
        let plot_px = (main.dim_in_pixel().0 as f64 - 120.0).max(100.0);
        let period = (x_end - xr.start) * 14.0 / plot_px;
        for run in &data.runs {
            let pts = plotted_points(run);
            let line = step_path(&xy(trace, &pts, |p| scale.of(p.allocated)), x_end);
            let color = policy_color(run.index);
            let dashes = dash_by_x(&line, period, period * 0.6);
            chart
                .draw_series(
                    dashes.into_iter().map(|d| PathElement::new(d, color.mix(0.9).stroke_width(1))),
                )
                .or_draw_error()?;
        }
        // Reserved, solid, with the policy's marker at a few places so it reads in greyscale.
        let n = data.runs.len().max(1) as f64;
        for run in &data.runs {
            let pts = plotted_points(run);
            let xy_r = xy(trace, &pts, |p| scale.of(p.reserved));
            let color = policy_color(run.index);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    step_path(&xy_r, x_end),
                    color.stroke_width(2),
                )))
                .or_draw_error()?;
            for k in 0..5 {
                let x =
                    xr.start + (x_end - xr.start) * (k as f64 + (run.index as f64 + 0.5) / n) / 5.0;
                if let Some(y) = step_value(&xy_r, x) {
                    let at = chart.backend_coord(&(x, y));
                    draw_marker(root, policy_marker(run.index), at, 4, color)?;
                }
            }
        }
        if let Some(c) = data.capacity {
            let y = scale.of(c);
            if y <= y_max {
                let line = vec![(xr.start, y), (x_end, y)];
                let dashes = dash_by_x(&line, period, period * 0.5);
                chart
                    .draw_series(
                        dashes.into_iter().map(|d| PathElement::new(d, CAPACITY.stroke_width(2))),
                    )
                    .or_draw_error()?;
                let at = chart.backend_coord(&(xr.start, y));
                root.draw(&Text::new(
                    format!("capacity {}", format_bytes(c)),
                    (at.0 + 6, at.1 - 4),
                    anchored(text(SMALL).color(&CAPACITY), HPos::Left, VPos::Bottom),
                ))
                .or_draw_error()?;
            }
        }

        // Peaks: a big marker at each, labels spread so none overlap.
        let (px_range, py_range) =
            (chart.plotting_area().get_pixel_range().0, chart.plotting_area().get_pixel_range().1);
        let peaks: Vec<((i32, i32), String, usize)> = data
            .runs
            .iter()
            .map(|run| {
                let d = &run.output.detail;
                let x = trace.x_of(d.peak_reserved_time_us, d.peak_reserved_event);
                let at = chart.backend_coord(&(x, scale.of(run.output.result.peak_reserved_bytes)));
                // The value and the moment (the event at which reserved first reaches its peak);
                // the marker and the legend say whose peak it is.
                let label = format!(
                    "{} peak (event {})",
                    format_bytes(run.output.result.peak_reserved_bytes),
                    d.peak_reserved_event
                );
                (at, label, run.index)
            })
            .collect();
        // Right of the marker, unless that runs out of the plot.
        let boxes: Vec<(i32, i32, i32)> = peaks
            .iter()
            .map(|(at, label, _)| {
                let width = LABEL_MARK + text_width(label, SMALL);
                let x =
                    if at.0 + 14 + width < px_range.end { at.0 + 14 } else { at.0 - 14 - width };
                (x - 3, x + width + 3, at.1)
            })
            .collect();
        let placed =
            spread_label_boxes(&boxes, SMALL as i32 + 7, py_range.start + 10, py_range.end - 10);
        for ((at, label, index), y) in peaks.iter().zip(placed) {
            let color = policy_color(*index);
            // The box holds the policy's marker, then the value: it reads in greyscale too.
            let width = LABEL_MARK + text_width(label, SMALL);
            let right = at.0 + 14 + width < px_range.end;
            let x = if right { at.0 + 14 } else { at.0 - 14 - width };
            let (bx0, bx1) = (x - 3, x + width + 3);
            if (y - at.1).abs() > 3 {
                let end = if right { bx0 } else { bx1 };
                root.draw(&PathElement::new(vec![*at, (end, y)], color.mix(0.8).stroke_width(1)))
                    .or_draw_error()?;
            }
            root.draw(&Rectangle::new([(bx0, y - 9), (bx1, y + 9)], WHITE.mix(0.85).filled()))
                .or_draw_error()?;
            root.draw(&Rectangle::new([(bx0, y - 9), (bx1, y + 9)], color.stroke_width(1)))
                .or_draw_error()?;
            draw_marker(root, policy_marker(*index), (x + 5, y), 4, color)?;
            root.draw(&Text::new(
                label.clone(),
                (x + LABEL_MARK, y),
                anchored(text(SMALL), HPos::Left, VPos::Center),
            ))
            .or_draw_error()?;
            draw_marker(root, policy_marker(*index), *at, 7, color)?;
        }

        style::draw_legend(root, (w as i32 - legend_w + 8, 60), &legend)?;
        let _ = h;
        Ok(())
    }
}
