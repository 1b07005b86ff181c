//! `sizes.*`: the trace's allocation sizes in power-of-two bins, two panels over the same bins:
//! how many allocations, and how many bytes they requested. Many small requests and a few huge
//! ones are the usual picture; the pair shows which of them the memory goes to.

use super::style::*;
use crate::report::bundle::ReportData;
use crate::trace::summary::SizeBucket;
use crate::units::{compact_bytes, short_size};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The chart; see the module docs.
pub struct Sizes<'a> {
    /// What to draw.
    pub(crate) data: &'a ReportData,
}

const COUNT: RGBColor = RGBColor(0, 114, 178);
const BYTES: RGBColor = RGBColor(213, 94, 0);

impl Chart for Sizes<'_> {
    fn size(&self) -> (u32, u32) {
        (1300, 820)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let data = self.data;
        let trace = &data.trace;
        let bins = &data.sizes;
        let (w, h) = self.size();
        let total: u64 = bins.iter().map(|b| b.count).sum();
        let title = format!(
            "Allocation sizes: {} (device {}, {} allocations)",
            truncate(&trace.file_name(), 60),
            trace.device,
            total
        );
        draw_title(root, &title, w)?;
        if bins.is_empty() {
            root.draw(&Text::new(
                "The trace has no allocations on this device.".to_string(),
                (w as i32 / 2, h as i32 / 2),
                anchored(text(LABEL + 2), HPos::Center, VPos::Center),
            ))
            .or_draw_error()?;
            return Ok(());
        }
        let body = root.margin(50, 0, 0, 0);
        let (top, bottom) = body.split_vertically((h as i32 - 50) / 2);
        let max_bytes = bins.iter().map(|b| b.bytes).max().unwrap_or(0);
        let scale = ByteScale::for_max(max_bytes);
        let panel = |area: &DrawingArea<DB, Shift>,
                     value: &dyn Fn(&SizeBucket) -> f64,
                     label: &dyn Fn(&SizeBucket) -> String,
                     y_desc: String,
                     color: RGBColor,
                     x_axis: bool|
         -> ChartResult {
            let y_max = bins.iter().map(value).fold(0.0, f64::max).max(1e-9) * 1.15;
            let n = bins.len();
            let mut chart = ChartBuilder::on(area)
                .margin_left(12)
                .margin_right(24)
                .margin_top(10)
                .margin_bottom(6)
                .y_label_area_size(86)
                .x_label_area_size(if x_axis { 64 } else { 26 })
                .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)
                .or_draw_error()?;
            let x_label = |v: &f64| {
                let k = v.round();
                if (v - k).abs() > 1e-6 || k < 0.0 {
                    return String::new();
                }
                bins.get(k as usize).map(|b| short_size(b.min_bytes)).unwrap_or_default()
            };
            let mut mesh = chart.configure_mesh();
            mesh.disable_x_mesh()
                .y_desc(y_desc)
                .y_label_formatter(&|v| tick(*v))
                .x_labels(n.max(2) * 2 + 1)
                .x_label_formatter(&x_label);
            house_mesh(&mut mesh);
            if x_axis {
                mesh.x_desc("allocation size class: from the size shown up to twice it (bytes; K = KiB, M = MiB, G = GiB)");
            }
            mesh.draw().or_draw_error()?;
            for (k, b) in bins.iter().enumerate() {
                let v = value(b);
                if v <= 0.0 {
                    continue;
                }
                let x = k as f64;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x - 0.38, 0.0), (x + 0.38, v)],
                        color.filled(),
                    )))
                    .or_draw_error()?;
                let at = chart.backend_coord(&(x, v));
                if n <= 40 {
                    area.draw(&Text::new(
                        label(b),
                        (at.0 - area.get_base_pixel().0, at.1 - area.get_base_pixel().1 - 3),
                        anchored(text(SMALL - 1), HPos::Center, VPos::Bottom),
                    ))
                    .or_draw_error()?;
                }
            }
            Ok(())
        };
        panel(
            &top,
            &|b| b.count as f64,
            &|b| b.count.to_string(),
            "allocations (count)".into(),
            COUNT,
            false,
        )?;
        panel(
            &bottom,
            &|b| scale.of(b.bytes),
            &|b| compact_bytes(b.bytes),
            format!("bytes requested over the trace ({})", scale.unit),
            BYTES,
            true,
        )?;
        Ok(())
    }
}
