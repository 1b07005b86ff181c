//! `timeline.*`: reserved (solid) and allocated (dashed) bytes over time for every policy on one
//! chart, the live requested bytes as a grey floor, each policy's peak marked and labelled. With
//! more than [`MOST_DRAWN`] policies (`-p all`), the main chart draws only its `focus` (the
//! recorded settings, the best policy and `bound`, over the recorded band) and `timeline-all.*`
//! draws every policy.
//!
//! Lines are steps (a value holds until the next event changes it), drawn from the down-sampled
//! series, which keeps every peak exactly. Policies differ by colour and marker shape; the legend
//! sits in its own column right of the plot so it never hides data, and peak labels are placed
//! where they hide the least data ([`super::labels`]), never on each other. When the trace
//! records the real allocator's figures, the `recorded` run's reserved memory is a wide
//! translucent band under the policies' lines, with its own peak label.

use super::labels::{self, Occupancy};
use super::style::{self, *};
use super::{plotted_points, recorded_points, x_range, xy};
use crate::policy::{role_of, Role};
use crate::report::bundle::{PolicyRun, ReportData};
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The chart; see the module docs.
pub struct Timeline<'a> {
    /// What to draw.
    pub(crate) data: &'a ReportData,
    /// The policies drawn: all of them, or the `focus` of many.
    pub(crate) runs: Vec<&'a PolicyRun>,
}

/// More policies than this and the main timeline draws only its `focus`: ten overlapping
/// step lines and their peak labels read as spaghetti.
pub const MOST_DRAWN: usize = 4;

impl<'a> Timeline<'a> {
    /// The main timeline: every policy when there are at most [`MOST_DRAWN`], else the
    /// [`focus`].
    pub(crate) fn main(data: &'a ReportData) -> Timeline<'a> {
        Timeline { data, runs: focus(data) }
    }

    /// Every policy, for `timeline-all.*` beside a main timeline that drew only its focus.
    pub(crate) fn every(data: &'a ReportData) -> Timeline<'a> {
        Timeline { data, runs: data.runs.iter().collect() }
    }
}

/// The runs a timeline of many policies draws, in report order: the recorded settings
/// (`pytorch`, the policy that replays what the program ran with), the best (least peak reserved
/// among the runs that did not run out of memory) and `bound` (the floor no policy beats); the
/// recorded run is drawn anyway, as a band. Every run when there are at most [`MOST_DRAWN`].
pub(crate) fn focus(data: &ReportData) -> Vec<&PolicyRun> {
    if data.runs.len() <= MOST_DRAWN {
        return data.runs.iter().collect();
    }
    let settings = data.runs.iter().find(|r| r.runs_recorded_settings()).map(|r| r.index);
    let floor = |r: &PolicyRun| role_of(&r.output.result.policy) == Some(Role::Floor);
    let best = data
        .runs
        .iter()
        .filter(|r| !r.output.result.oom && !floor(r))
        .min_by_key(|r| r.output.result.peak_reserved_bytes)
        .map(|r| r.index);
    let bound = data.runs.iter().find(|r| floor(r)).map(|r| r.index);
    let keep = [settings, best, bound];
    let chosen: Vec<&PolicyRun> =
        data.runs.iter().filter(|r| keep.contains(&Some(r.index))).collect();
    if chosen.is_empty() {
        data.runs.iter().take(MOST_DRAWN).collect()
    } else {
        chosen
    }
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
        if let Some(peak) = self.recorded_peak() {
            entries.push(LegendEntry {
                sample: Sample::Band(RECORDED),
                label: format!("{} ({})", crate::recorded::POLICY_NAME, format_bytes(peak)),
            });
        }
        for run in &self.runs {
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

    /// The highest peak reserved of any policy and of the recorded run.
    fn peak(&self) -> u64 {
        let policies = self.runs.iter().map(|r| r.output.result.peak_reserved_bytes);
        policies.chain(self.recorded_peak()).max().unwrap_or(0)
    }

    /// The recorded run's peak reserved, when the timeline draws it.
    fn recorded_peak(&self) -> Option<u64> {
        let series = self.data.recorded_series.as_ref()?;
        series.points().iter().map(|p| p.reserved).max()
    }

    /// True when `--capacity` is close enough to the peaks (at most twice the highest) to draw it
    /// without flattening the lines.
    fn capacity_drawn(&self) -> bool {
        self.data.capacity.is_some_and(|c| c <= self.peak().saturating_mul(2))
    }
}

/// Room for the marker at the start of a peak label.
const LABEL_MARK: i32 = 14;

/// The radius of the marker at each peak.
const PEAK_MARKER: i32 = 7;

/// One peak the timeline marks and labels.
struct Peak {
    /// The peak's pixel.
    at: (i32, i32),
    /// The label's text.
    label: String,
    /// The policy's index (its colour and marker); `None` for the recorded run.
    index: Option<usize>,
}

/// The capacity line's colour.
const CAPACITY: RGBColor = RGBColor(200, 0, 0);

impl Timeline<'_> {
    /// The peaks to mark: the recorded run's, then each policy's from the highest down, each
    /// placed by `at(x, bytes)`.
    fn peaks(
        &self,
        recorded: &[crate::metrics::Point],
        at: &dyn Fn(f64, u64) -> (i32, i32),
    ) -> Vec<Peak> {
        let trace = &self.data.trace;
        let mut peaks: Vec<Peak> = Vec::new();
        if let Some(p) = recorded.iter().max_by_key(|p| (p.reserved, std::cmp::Reverse(p.event))) {
            let x = trace.x_of(p.time_us, p.event);
            peaks.push(Peak {
                at: at(x, p.reserved),
                label: format!(
                    "{} {} peak (event {})",
                    crate::recorded::POLICY_NAME,
                    format_bytes(p.reserved),
                    p.event
                ),
                index: None,
            });
        }
        let mut by_peak: Vec<&PolicyRun> = self.runs.clone();
        by_peak.sort_by_key(|r| std::cmp::Reverse(r.output.result.peak_reserved_bytes));
        for run in by_peak {
            let d = &run.output.detail;
            let x = trace.x_of(d.peak_reserved_time_us, d.peak_reserved_event);
            // The value and the moment (the event at which reserved first reaches its peak);
            // the marker and the legend say whose peak it is.
            peaks.push(Peak {
                at: at(x, run.output.result.peak_reserved_bytes),
                label: format!(
                    "{} peak (event {})",
                    format_bytes(run.output.result.peak_reserved_bytes),
                    d.peak_reserved_event
                ),
                index: Some(run.index),
            });
        }
        peaks
    }
}

/// The capacity `c` (at `y` on the chart) as a dashed red line across `x` with its value, its
/// pixels marked taken so that no peak label covers it.
fn draw_capacity<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &mut Plane<'_, DB>,
    occupancy: &mut Occupancy,
    (c, y): (u64, f64),
    (x_start, x_end): (f64, f64),
    period: f64,
    (px_start, px_end): (i32, i32),
) -> ChartResult {
    let line = vec![(x_start, y), (x_end, y)];
    let dashes = dash_by_x(&line, period, period * 0.5);
    chart
        .draw_series(dashes.into_iter().map(|d| PathElement::new(d, CAPACITY.stroke_width(2))))
        .or_draw_error()?;
    let at = chart.backend_coord(&(x_start, y));
    let capacity_text = format!("capacity {}", format_bytes(c));
    occupancy.mark_path(&[(px_start, at.1), (px_end, at.1)], 1, 3);
    occupancy.mark_rect(
        (at.0 + 6, at.1 - 4 - SMALL as i32),
        (at.0 + 6 + text_width(&capacity_text, SMALL), at.1 - 4),
        4,
    );
    root.draw(&Text::new(
        capacity_text,
        (at.0 + 6, at.1 - 4),
        anchored(text(SMALL).color(&CAPACITY), HPos::Left, VPos::Bottom),
    ))
    .or_draw_error()?;
    Ok(())
}

/// Draws each peak's label in its box (`boxes`, from [`labels::place`]) with a line to the
/// peak, then the peak markers over everything.
fn draw_peaks<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    peaks: &[Peak],
    boxes: &[(i32, i32, i32, i32)],
) -> ChartResult {
    for (peak, b) in peaks.iter().zip(boxes) {
        let color = peak.index.map_or(RECORDED, policy_color);
        root.draw(&PathElement::new(
            vec![peak.at, labels::nearest_edge(*b, peak.at)],
            color.mix(0.8).stroke_width(1),
        ))
        .or_draw_error()?;
    }
    for (peak, b) in peaks.iter().zip(boxes) {
        let color = peak.index.map_or(RECORDED, policy_color);
        let (bx0, by0, bx1, by1) = *b;
        let y = (by0 + by1) / 2;
        root.draw(&Rectangle::new([(bx0, by0), (bx1, by1)], WHITE.mix(0.9).filled()))
            .or_draw_error()?;
        root.draw(&Rectangle::new([(bx0, by0), (bx1, by1)], color.stroke_width(1)))
            .or_draw_error()?;
        // The box holds the policy's marker, then the value: it reads in greyscale too.
        let text_x = match peak.index {
            Some(i) => {
                draw_marker(root, policy_marker(i), (bx0 + 8, y), 4, color)?;
                bx0 + 3 + LABEL_MARK
            }
            None => bx0 + 5,
        };
        root.draw(&Text::new(
            peak.label.clone(),
            (text_x, y),
            anchored(text(SMALL), HPos::Left, VPos::Center),
        ))
        .or_draw_error()?;
    }
    for peak in peaks {
        match peak.index {
            Some(i) => draw_marker(root, policy_marker(i), peak.at, PEAK_MARKER, policy_color(i))?,
            None => root
                .draw(&Circle::new(peak.at, PEAK_MARKER, RECORDED.stroke_width(2)))
                .or_draw_error()?,
        }
    }

    Ok(())
}

impl Chart for Timeline<'_> {
    fn size(&self) -> (u32, u32) {
        let rows = self.runs.len() as u32 + 7 + u32::from(self.recorded_peak().is_some());
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
        draw_title(root, &title, w)?;
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
        draw_memory_mesh(&mut chart, trace.x_desc(), &format!("device memory ({})", scale.unit))?;

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

        // Pixels that hold data, so the peak labels go elsewhere.
        let (px_range, py_range) =
            (chart.plotting_area().get_pixel_range().0, chart.plotting_area().get_pixel_range().1);
        let mut occupancy =
            Occupancy::new((px_range.start, px_range.end), (py_range.start, py_range.end));
        let coord = chart.as_coord_spec().clone();
        let to_px = |line: &[(f64, f64)]| -> Vec<(i32, i32)> {
            line.iter().map(|p| coord.translate(p)).collect()
        };
        if let Some(first) = data.runs.first() {
            let pts = plotted_points(first);
            let line = step_path(&xy(trace, &pts, |p| scale.of(p.requested)), x_end);
            occupancy.mark_below(&to_px(&line), 1);
        }

        // The recorded run: a wide translucent band under the policies' lines.
        let recorded = recorded_points(data);
        let recorded_line = step_path(&xy(trace, &recorded, |p| scale.of(p.reserved)), x_end);
        if recorded_line.len() > 1 {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    recorded_line.clone(),
                    RECORDED.mix(BAND_ALPHA).stroke_width(BAND_WIDTH),
                )))
                .or_draw_error()?;
            occupancy.mark_path(&to_px(&recorded_line), BAND_WIDTH as i32 / 2, 4);
        }

        // Allocated, dashed (dashes cut by x: a few dozen path elements however jagged the line).
        let plot_px = (main.dim_in_pixel().0 as f64 - 120.0).max(100.0);
        let period = (x_end - xr.start) * 14.0 / plot_px;
        for run in &self.runs {
            let pts = plotted_points(run);
            let line = step_path(&xy(trace, &pts, |p| scale.of(p.allocated)), x_end);
            let color = policy_color(run.index);
            occupancy.mark_path(&to_px(&line), 1, 3);
            let dashes = dash_by_x(&line, period, period * 0.6);
            chart
                .draw_series(
                    dashes.into_iter().map(|d| PathElement::new(d, color.mix(0.9).stroke_width(1))),
                )
                .or_draw_error()?;
        }
        // Reserved, solid, with the policy's marker at a few places so it reads in greyscale.
        let n = self.runs.len().max(1) as f64;
        // Markers staggered by the run's place among those drawn (not its report index, which
        // can exceed their count when only the focus is drawn), so all stay inside the plot.
        for (place, run) in self.runs.iter().enumerate() {
            let pts = plotted_points(run);
            let xy_r = xy(trace, &pts, |p| scale.of(p.reserved));
            let color = policy_color(run.index);
            let line = step_path(&xy_r, x_end);
            occupancy.mark_path(&to_px(&line), 2, 4);
            chart
                .draw_series(std::iter::once(PathElement::new(line, color.stroke_width(2))))
                .or_draw_error()?;
            for k in 0..5 {
                let x = xr.start + (x_end - xr.start) * (k as f64 + (place as f64 + 0.5) / n) / 5.0;
                if let Some(y) = step_value(&xy_r, x) {
                    let at = chart.backend_coord(&(x, y));
                    occupancy.mark_rect((at.0 - 5, at.1 - 5), (at.0 + 5, at.1 + 5), 4);
                    draw_marker(root, policy_marker(run.index), at, 4, color)?;
                }
            }
        }
        if let Some(c) = data.capacity.filter(|&c| scale.of(c) <= y_max) {
            let x = (xr.start, x_end);
            let px = (px_range.start, px_range.end);
            draw_capacity(root, &mut chart, &mut occupancy, (c, scale.of(c)), x, period, px)?;
        }

        // Peaks: a big marker at each; each label where it hides the least data, the recorded
        // run's first, then from the highest peak down.
        occupancy.finish();
        let peaks = self.peaks(&recorded, &|x, y| chart.backend_coord(&(x, scale.of(y))));
        let anchors: Vec<(i32, i32)> = peaks.iter().map(|p| p.at).collect();
        let sizes: Vec<(i32, i32)> =
            peaks.iter().map(|p| (LABEL_MARK + text_width(&p.label, SMALL) + 6, 19)).collect();
        let boxes = labels::place(&occupancy, &anchors, &sizes, PEAK_MARKER + 2);
        draw_peaks(root, &peaks, &boxes)?;

        style::draw_legend(root, (w as i32 - legend_w + 8, 60), &legend)?;
        let _ = h;
        Ok(())
    }
}
