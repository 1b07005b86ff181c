//! `peaks.*`: peak reserved memory by policy as horizontal bars, lowest first, each split at the
//! moment of its peak into requested bytes, rounding (allocated − requested) and cached-but-free
//! bytes (reserved − allocated), with the overhead over `bound` written beside it.
//!
//! The three parts use fills of clearly different lightness (dark, mid, light), so the split reads
//! in greyscale; the legend is a row above the plot. When the trace records the real allocator's
//! figures, the `recorded` run is the first row: one bar of its own colour (its split is not
//! recorded). The x axis reaches far enough that every value written beside a bar fits.

use super::style::{self, *};
use crate::report::bundle::{PolicyRun, ReportData};
use crate::report::columns::{over_bound, signed_percent};
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The chart; see the module docs.
pub struct Peaks<'a> {
    /// What to draw.
    pub(crate) data: &'a ReportData,
}

const ROW: u32 = 46;

/// The three parts of a policy's peak, in bytes: requested, rounding, cached free.
pub(crate) fn split(run: &PolicyRun) -> (u64, u64, u64) {
    let peak = run.output.result.peak_reserved_bytes;
    let d = &run.output.detail;
    let requested = d.requested_at_peak_bytes.min(peak);
    let allocated = d.allocated_at_peak_bytes.clamp(requested, peak);
    (requested, allocated - requested, peak - allocated)
}

/// One bar of the chart.
struct Bar<'a> {
    /// The row's label.
    label: String,
    /// Peak reserved bytes.
    peak: u64,
    /// The policy's run; `None` for the recorded run.
    run: Option<&'a PolicyRun>,
}

impl Peaks<'_> {
    /// The bars top to bottom: the recorded run's (when known), then the policies'.
    fn rows(&self) -> Vec<Bar<'_>> {
        let recorded = self.data.recorded.as_ref().and_then(|r| {
            r.peak_reserved_bytes.map(|peak| Bar { label: r.policy.clone(), peak, run: None })
        });
        recorded
            .into_iter()
            .chain(self.data.runs.iter().map(|r| Bar {
                label: r.label.clone(),
                peak: r.output.result.peak_reserved_bytes,
                run: Some(r),
            }))
            .collect()
    }

    /// The text beside a bar: its value, its overhead over `bound`, OOM.
    fn value_text(&self, bar: &Bar) -> String {
        let data = self.data;
        let mut value = format_bytes(bar.peak);
        let Some(run) = bar.run else {
            return format!("{value}  (what the recorded run reserved)");
        };
        if crate::policy::role_of(&run.output.result.policy) != Some(crate::policy::Role::Floor) {
            if let Some(p) = over_bound(bar.peak, data.bound()) {
                value = format!("{value}  ({} over bound)", signed_percent(p));
            }
        } else if data.capacity.is_some() {
            // Under a capacity bound can OOM too: its peak is no floor for the others.
            value = format!("{value}  (no floor under a capacity)");
        } else {
            value = format!("{value}  (the floor)");
        }
        if run.output.result.oom {
            value = format!("{value}  OOM");
        }
        value
    }
}

impl Chart for Peaks<'_> {
    fn size(&self) -> (u32, u32) {
        (1300, 170 + ROW * self.rows().len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let data = self.data;
        let (w, _) = self.size();
        let title = format!(
            "Peak reserved memory by policy: {} (device {})",
            truncate(&data.trace.file_name(), 60),
            data.trace.device
        );
        draw_title(root, &title, w)?;
        style::draw_parts_legend(
            root,
            (90, 58),
            [
                "requested (live at the peak)",
                "rounding (allocated − requested)",
                "reserved but free (reserved − allocated)",
            ],
        )?;

        let rows = self.rows();
        let values: Vec<String> = rows.iter().map(|b| self.value_text(b)).collect();
        let label_w =
            rows.iter().map(|b| text_width(&b.label, LABEL)).max().unwrap_or(60).clamp(60, 560)
                + 16;
        let peak = rows.iter().map(|b| b.peak).max().unwrap_or(0);
        let scale = ByteScale::for_max(peak);
        // Room right of every bar for its value and overhead: a bar of `p` ends at
        // `plot_px * p / x_max`, and its text needs `8 + width` pixels after that.
        let plot_px = f64::from(w as i32 - 12 - 24 - label_w).max(100.0);
        let x_max = rows
            .iter()
            .zip(&values)
            .map(|(b, v)| {
                let room = (plot_px - 16.0 - f64::from(text_width(v, SMALL))).max(plot_px * 0.2);
                scale.of(b.peak) * plot_px / room
            })
            .fold(scale.of(peak) * 1.05, f64::max)
            .max(1e-9);
        let n = rows.len().max(1);
        let mut chart = ChartBuilder::on(root)
            .margin_top(84)
            .margin_left(12)
            .margin_right(24)
            .margin_bottom(8)
            .x_label_area_size(52)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
            .or_draw_error()?;
        let mut mesh = chart.configure_mesh();
        mesh.disable_y_mesh()
            .disable_y_axis()
            .x_desc(format!("peak reserved memory ({})", scale.unit))
            .x_label_formatter(&|v| tick(*v));
        house_mesh(&mut mesh).draw().or_draw_error()?;

        let bound = data.bound();
        for (i, (bar, value)) in rows.iter().zip(values).enumerate() {
            // Lowest peak on top (after the recorded run).
            let y0 = (n - 1 - i) as f64 + 0.18;
            let y1 = y0 + 0.64;
            let parts = match bar.run {
                Some(run) => {
                    let (req, round, cached) = split(run);
                    vec![(req, REQUESTED), (round, ROUNDING), (cached, CACHED)]
                }
                None => vec![(bar.peak, RECORDED_FILL)],
            };
            let mut x = 0.0;
            for (bytes, color) in parts {
                let x1 = x + scale.of(bytes);
                if bytes > 0 {
                    chart
                        .draw_series(std::iter::once(Rectangle::new(
                            [(x, y0), (x1, y1)],
                            color.filled(),
                        )))
                        .or_draw_error()?;
                }
                x = x1;
            }
            let outline = if bar.run.is_some() { INK } else { RECORDED };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, y0), (x, y1)],
                    outline.stroke_width(1),
                )))
                .or_draw_error()?;
            let at = chart.backend_coord(&(x, (y0 + y1) / 2.0));
            root.draw(&Text::new(
                value,
                (at.0 + 8, at.1),
                anchored(text(SMALL), HPos::Left, VPos::Center),
            ))
            .or_draw_error()?;
            let name_at = chart.backend_coord(&(0.0, (y0 + y1) / 2.0));
            root.draw(&Text::new(
                bar.label.clone(),
                (name_at.0 - 10, name_at.1),
                anchored(text(LABEL), HPos::Right, VPos::Center),
            ))
            .or_draw_error()?;
        }
        if let Some(b) = bound {
            // The floor as a vertical line through every bar.
            let x = scale.of(b);
            let top = chart.backend_coord(&(x, n as f64));
            let bottom = chart.backend_coord(&(x, 0.0));
            let mut y = top.1;
            while y < bottom.1 {
                root.draw(&PathElement::new(
                    vec![(top.0, y), (top.0, (y + 5).min(bottom.1))],
                    INK.stroke_width(1),
                ))
                .or_draw_error()?;
                y += 9;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{PeakDetail, PolicyResult};
    use crate::replay::ReplayOutput;

    #[test]
    fn the_parts_add_up_to_the_peak() {
        let run = PolicyRun {
            label: "p".into(),
            index: 0,
            output: ReplayOutput {
                result: PolicyResult { peak_reserved_bytes: 100, ..Default::default() },
                detail: PeakDetail {
                    allocated_at_peak_bytes: 70,
                    requested_at_peak_bytes: 60,
                    ..Default::default()
                },
                ..Default::default()
            },
        };
        assert_eq!(split(&run), (60, 10, 30));
    }
}
