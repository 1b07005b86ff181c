//! `segments.*`: one policy's segments at the moment its reserved memory peaked, each a strip
//! whose length is its size, blocks laid out by address inside it and coloured by state:
//! allocated (the requested part), rounding (block size − request, where the request is known)
//! and cached free. This is memory_viz's segment view reduced to what a page can print.
//!
//! Up to [`ONE_PER_ROW`] segments get a row each (largest first, size written beside it). More
//! are packed largest first into lines of equal byte length, a gap between neighbours, so that
//! hundreds of segments stay distinct strips on one page rather than a solid block of 3-pixel
//! rows. Lengths are linear in bytes everywhere: a 2 MiB segment beside a 1 GiB one is a sliver,
//! as it should be. A policy without segments gets a chart that says so instead of an empty plot.

use super::style::{self, *};
use crate::report::bundle::ReportData;
use crate::trace::{BlockState, Segment};
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The most segments drawn one per row; more are packed into lines.
pub const ONE_PER_ROW: usize = 40;

/// About how many lines packed segments fill.
const TARGET_LINES: u64 = 48;

/// Lays segments (sorted largest first) into lines of `line_bytes` each, in order, starting a new
/// line when the next segment does not fit (the first segment of a line always fits, as no
/// segment is longer than a line). Returns the lines as index lists into `sizes`.
pub(crate) fn pack(sizes: &[u64], line_bytes: u64) -> Vec<Vec<usize>> {
    let mut lines: Vec<Vec<usize>> = Vec::new();
    let mut used = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        match lines.last_mut() {
            Some(line) if used.saturating_add(size) <= line_bytes => {
                line.push(i);
                used += size;
            }
            _ => {
                lines.push(vec![i]);
                used = size;
            }
        }
    }
    lines
}

/// What a stretch of a segment holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Requested bytes of a live (or pending-free) block.
    Allocated,
    /// The rest of a live block: the policy's rounding.
    Rounding,
    /// A free block the policy keeps cached.
    Cached,
}

impl Part {
    fn color(self) -> RGBColor {
        match self {
            Part::Allocated => REQUESTED,
            Part::Rounding => ROUNDING,
            Part::Cached => CACHED,
        }
    }
}

/// A segment's blocks as `(offset, length, part)` runs in address order, neighbouring runs of
/// the same part merged (their boundaries cannot be seen at any useful size).
pub(crate) fn runs(segment: &Segment) -> Vec<(u64, u64, Part)> {
    let mut out: Vec<(u64, u64, Part)> = Vec::new();
    let mut push = |offset: u64, len: u64, part: Part| {
        if len == 0 {
            return;
        }
        match out.last_mut() {
            Some(last) if last.2 == part && last.0 + last.1 == offset => last.1 += len,
            _ => out.push((offset, len, part)),
        }
    };
    for b in &segment.blocks {
        let offset = b.address.saturating_sub(segment.address);
        match b.state {
            BlockState::Inactive => push(offset, b.size, Part::Cached),
            BlockState::ActiveAllocated | BlockState::ActivePendingFree => {
                // A request of 0 means "not known": show the whole block as allocated.
                let req = if b.requested_size == 0 { b.size } else { b.requested_size.min(b.size) };
                push(offset, req, Part::Allocated);
                push(offset + req, b.size - req, Part::Rounding);
            }
        }
    }
    out
}

/// Turns byte runs into pixel spans `[a, b)` for drawing, `bytes_per_px` bytes to a pixel and
/// offset 0 at pixel `x0`. A pixel shared by several runs takes the part that holds most of its
/// bytes; neighbouring spans of one part are merged. So a segment costs at most one rectangle per
/// pixel column however many blocks it has: a trace with a hundred thousand live blocks at its
/// peak still makes a small SVG.
pub(crate) fn pixel_runs(
    runs: &[(u64, u64, Part)],
    x0: i32,
    bytes_per_px: f64,
) -> Vec<(i32, i32, Part)> {
    let bpp = if bytes_per_px > 0.0 { bytes_per_px } else { 1.0 };
    let pixel = |o: u64| (o as f64 / bpp).floor() as i64;
    let first_byte = |p: i64| (p as f64 * bpp).ceil().max(0.0) as u64;
    let slot = |part: Part| match part {
        Part::Allocated => 0,
        Part::Rounding => 1,
        Part::Cached => 2,
    };
    let dominant = |bytes: [u64; 3]| {
        let parts = [Part::Allocated, Part::Rounding, Part::Cached];
        parts[(0..3).max_by_key(|&k| (bytes[k], std::cmp::Reverse(k))).unwrap_or(0)]
    };
    let mut out: Vec<(i64, i64, Part)> = Vec::new();
    let mut push = |a: i64, b: i64, part: Part| match out.last_mut() {
        Some(last) if last.2 == part && last.1 >= a => last.1 = last.1.max(b),
        _ => out.push((a, b, part)),
    };
    // The pixel column being shared, with its bytes per part.
    let mut column: Option<(i64, [u64; 3])> = None;
    for &(off, len, part) in runs {
        let end = off.saturating_add(len);
        let mut o = off;
        while o < end {
            let p = pixel(o);
            let next = first_byte(p + 1).max(o + 1);
            if let Some((c, bytes)) = column {
                if c != p {
                    push(c, c + 1, dominant(bytes));
                    column = None;
                }
            }
            if o == first_byte(p) && end >= next {
                // Whole pixels from p up to the one holding `end`.
                let q = pixel(end).max(p + 1);
                push(p, q, part);
                o = first_byte(q).clamp(o + 1, end);
            } else {
                let piece = end.min(next) - o;
                let (_, bytes) = column.get_or_insert((p, [0; 3]));
                bytes[slot(part)] += piece;
                o += piece;
            }
        }
    }
    if let Some((c, bytes)) = column {
        push(c, c + 1, dominant(bytes));
    }
    out.into_iter().map(|(a, b, part)| (x0 + a as i32, x0 + b as i32, part)).collect()
}

/// The chart; see the module docs.
pub struct SegmentChart<'a> {
    data: &'a ReportData,
    /// The segments, largest first.
    order: Vec<&'a Segment>,
    /// Lines of indices into `order`.
    lines: Vec<Vec<usize>>,
    /// Bytes one line holds.
    line_bytes: u64,
    row_h: u32,
}

impl<'a> SegmentChart<'a> {
    /// Prepares the layout of `data`'s segment map.
    pub(crate) fn new(data: &'a ReportData) -> SegmentChart<'a> {
        let mut order: Vec<&Segment> = data.segment_map.segments.iter().collect();
        order.sort_by_key(|s| (std::cmp::Reverse(s.total_size), s.address));
        let largest = order.first().map_or(1, |s| s.total_size.max(1));
        let total: u64 = order.iter().map(|s| s.total_size).sum();
        let (lines, line_bytes) = if order.len() <= ONE_PER_ROW {
            ((0..order.len()).map(|i| vec![i]).collect(), largest)
        } else {
            let line_bytes = largest.max(total.div_ceil(TARGET_LINES));
            let sizes: Vec<u64> = order.iter().map(|s| s.total_size).collect();
            (pack(&sizes, line_bytes), line_bytes)
        };
        let row_h = match lines.len() {
            0..=30 => 22,
            31..=60 => 16,
            61..=120 => 10,
            _ => 6,
        };
        SegmentChart { data, order, lines, line_bytes, row_h }
    }

    fn packed(&self) -> bool {
        self.order.len() > ONE_PER_ROW
    }
}

impl Chart for SegmentChart<'_> {
    fn size(&self) -> (u32, u32) {
        if self.order.is_empty() {
            (1300, 360)
        } else {
            (1300, 210 + self.row_h * self.lines.len() as u32)
        }
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let (w, h) = self.size();
        draw_title(root, &self.title(), w)?;
        if self.order.is_empty() {
            let note = self.data.segment_map.note.clone();
            return draw_no_segments(
                root,
                &note.unwrap_or_else(|| "no segments at the peak".into()),
                (w, h),
            );
        }
        root.draw(&Text::new(
            self.subtitle(),
            (w as i32 / 2, 42),
            anchored(text(LABEL), HPos::Center, VPos::Top),
        ))
        .or_draw_error()?;
        style::draw_parts_legend(
            root,
            (90, 84),
            ["allocated (requested bytes)", "rounding (block − request)", "cached free"],
        )?;
        let scale = ByteScale::for_max(self.line_bytes);
        let n = self.lines.len();
        let x_factor = if self.packed() { 1.02 } else { 1.1 };
        let mut chart = ChartBuilder::on(root)
            .margin_top(104)
            .margin_left(12)
            .margin_right(30)
            .margin_bottom(8)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(0.0..scale.of(self.line_bytes) * x_factor, 0.0..n as f64)
            .or_draw_error()?;
        let (x_desc, y_desc) = if self.packed() {
            (
                format!("bytes along the line ({}); each strip is one segment", scale.unit),
                "line of segments, largest first",
            )
        } else {
            (format!("offset within the segment ({})", scale.unit), "segment, largest at the top")
        };
        let mut mesh = chart.configure_mesh();
        mesh.disable_y_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|_| String::new())
            .y_labels(0);
        house_mesh(&mut mesh).draw().or_draw_error()?;
        self.draw_line_numbers(root, &chart)?;
        self.draw_lines(root, &chart, &scale, x_factor)
    }
}

impl SegmentChart<'_> {
    /// The chart's title: the policy's segments at its peak, or the trace's own segment map.
    fn title(&self) -> String {
        let (map, trace) = (&self.data.segment_map, &self.data.trace);
        if map.policy.is_empty() {
            format!("Segment map: {} (device {})", truncate(&trace.file_name(), 60), trace.device)
        } else {
            format!(
                "Segments of {} at its peak reserved: {} (device {})",
                map.policy.clone(),
                truncate(&trace.file_name(), 50),
                trace.device
            )
        }
    }

    /// The line under the title: when, how many segments, and reserved split into requested,
    /// rounding and cached free bytes.
    fn subtitle(&self) -> String {
        let map = &self.data.segment_map;
        let segs = &map.segments;
        let reserved: u64 = segs.iter().map(|s| s.total_size).sum();
        let (mut alloc, mut round, mut cached) = (0u64, 0u64, 0u64);
        for s in segs {
            for (_, len, part) in runs(s) {
                match part {
                    Part::Allocated => alloc += len,
                    Part::Rounding => round += len,
                    Part::Cached => cached += len,
                }
            }
        }
        let sub = format!(
            "after event {}: {} segments, {} reserved = {} requested + {} rounding + {} cached free",
            map.event,
            segs.len(),
            format_bytes(reserved),
            format_bytes(alloc),
            format_bytes(round),
            format_bytes(cached)
        );
        if self.packed() {
            format!("{sub}; packed largest first, {} per line", format_bytes(self.line_bytes))
        } else {
            sub
        }
    }

    /// Line numbers on the left: every line when there is room, else about ten.
    fn draw_line_numbers<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        chart: &Plane<'_, DB>,
    ) -> ChartResult {
        let n = self.lines.len();
        let every = if self.row_h >= 16 { 1 } else { n.div_ceil(10).max(1) };
        for i in (0..n).filter(|i| i % every == 0 || *i + 1 == n) {
            let at = chart.backend_coord(&(0.0, (n - i) as f64 - 0.5));
            root.draw(&Text::new(
                format!("#{}", i + 1),
                (at.0 - 8, at.1),
                anchored(text(SMALL), HPos::Right, VPos::Center),
            ))
            .or_draw_error()?;
        }
        Ok(())
    }

    /// Each line's segments as strips of coloured runs, outlined where tall enough, labelled
    /// with their size when one per row.
    fn draw_lines<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        chart: &Plane<'_, DB>,
        scale: &ByteScale,
        x_factor: f64,
    ) -> ChartResult {
        let n = self.lines.len();
        let plot_px = {
            let r = chart.plotting_area().get_pixel_range().0;
            (r.end - r.start) as f64
        };
        let bytes_per_px = self.line_bytes as f64 * x_factor / plot_px.max(1.0);
        let gap = if self.row_h >= 10 { 0.15 } else { 0.1 };
        for (i, line) in self.lines.iter().enumerate() {
            let y1 = (n - i) as f64 - gap;
            let y0 = (n - i - 1) as f64 + gap;
            let (top, bottom) =
                (chart.backend_coord(&(0.0, y1)).1, chart.backend_coord(&(0.0, y0)).1);
            let mut start = 0u64;
            for &k in line {
                let Some(s) = self.order.get(k) else { continue };
                // Pixel span of the segment, 1 px kept free at each end so neighbours stay apart.
                let px = |off: u64| chart.backend_coord(&(scale.of(start + off), y0)).0;
                let (left, right) = (px(0), px(s.total_size));
                let inset = if self.packed() && right - left >= 4 { 1 } else { 0 };
                let (left, right) = (left + inset, (right - inset).max(left + inset + 1));
                for (a, b, part) in pixel_runs(&runs(s), px(0), bytes_per_px) {
                    let (a, b) = (a.max(left), b.min(right));
                    root.draw(&Rectangle::new(
                        [(a, top), (b.max(a + 1), bottom)],
                        part.color().filled(),
                    ))
                    .or_draw_error()?;
                }
                if bottom - top >= 6 {
                    root.draw(&Rectangle::new([(left, top), (right, bottom)], INK.stroke_width(1)))
                        .or_draw_error()?;
                }
                if !self.packed() && self.row_h >= 12 {
                    let label = format!(
                        "{}{}",
                        format_bytes(s.total_size),
                        if s.is_expandable { " (expandable)" } else { "" }
                    );
                    root.draw(&Text::new(
                        label,
                        (right + 6, (top + bottom) / 2),
                        anchored(text(SMALL), HPos::Left, VPos::Center),
                    ))
                    .or_draw_error()?;
                }
                start += s.total_size;
            }
        }
        Ok(())
    }
}

/// The chart of a map with no segments: a grey panel that says why (`note`) and how to get one.
fn draw_no_segments<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    note: &str,
    (w, h): (u32, u32),
) -> ChartResult {
    root.draw(&Rectangle::new([(40, 60), (w as i32 - 40, h as i32 - 40)], GRID.filled()))
        .or_draw_error()?;
    root.draw(&Text::new(
        "No segment map to draw".to_string(),
        (w as i32 / 2, h as i32 / 2 - 30),
        anchored(bold(LABEL + 4), HPos::Center, VPos::Center),
    ))
    .or_draw_error()?;
    root.draw(&Text::new(
        truncate(note, 120),
        (w as i32 / 2, h as i32 / 2 + 6),
        anchored(text(LABEL), HPos::Center, VPos::Center),
    ))
    .or_draw_error()?;
    root.draw(&Text::new(
        "Name a policy that models segments with --segment-map-policy (e.g. pytorch).".to_string(),
        (w as i32 / 2, h as i32 / 2 + 34),
        anchored(text(LABEL), HPos::Center, VPos::Center),
    ))
    .or_draw_error()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Block, PoolKind};

    #[test]
    fn sub_pixel_blocks_share_a_pixel_and_the_majority_colours_it() {
        // 10 bytes per pixel, drawn from pixel 100.
        let runs = [
            (0, 25, Part::Allocated), // pixels 0, 1 whole; 5 bytes of pixel 2
            (25, 2, Part::Rounding),  // 2 bytes of pixel 2
            (27, 3, Part::Cached),    // 3 bytes of pixel 2: allocated (5) wins it
            (30, 4, Part::Rounding),  // 4 bytes of pixel 3
            (34, 1, Part::Allocated), // 1 byte of pixel 3
            (35, 31, Part::Cached),   // 5 bytes of pixel 3 (cached wins it), 4 and 5 whole, and 6
            // bytes of pixel 6, against the 4 of the next run: cached wins pixel 6 too
            (66, 34, Part::Rounding), // then pixels 7, 8, 9 whole
        ];
        assert_eq!(
            pixel_runs(&runs, 100, 10.0),
            vec![(100, 103, Part::Allocated), (103, 107, Part::Cached), (107, 110, Part::Rounding)]
        );
        // Thousands of tiny alternating blocks cost at most one span per pixel.
        let many: Vec<(u64, u64, Part)> = (0..10_000u64)
            .map(|i| (i * 3, 3, if i % 2 == 0 { Part::Allocated } else { Part::Rounding }))
            .collect();
        assert!(pixel_runs(&many, 0, 1000.0).len() <= 31);
        // Wider pixels than bytes: a 4-byte block over 8 pixels.
        assert_eq!(pixel_runs(&[(0, 4, Part::Cached)], 0, 0.5), vec![(0, 8, Part::Cached)]);
    }

    #[test]
    fn packing_fills_lines_in_order_and_starts_a_new_one_when_full() {
        assert_eq!(pack(&[8, 5, 3, 3, 2, 1], 8), vec![vec![0], vec![1, 2], vec![3, 4, 5]]);
        assert_eq!(pack(&[], 8), Vec::<Vec<usize>>::new());
    }

    #[test]
    fn blocks_split_into_request_rounding_and_cached_runs() {
        let block =
            |address, size, requested_size, state| Block { address, size, requested_size, state };
        let seg = Segment {
            device: 0,
            address: 0x1000,
            total_size: 4096,
            stream: 0,
            pool: PoolKind::Small,
            is_expandable: false,
            private_pool: None,
            blocks: vec![
                block(0x1000, 1024, 1000, BlockState::ActiveAllocated),
                block(0x1400, 512, 512, BlockState::ActivePendingFree),
                block(0x1600, 512, 0, BlockState::Inactive),
                block(0x1800, 2048, 0, BlockState::Inactive),
            ],
        };
        assert_eq!(
            runs(&seg),
            vec![
                (0, 1000, Part::Allocated),
                (1000, 24, Part::Rounding),
                (1024, 512, Part::Allocated),
                (1536, 2560, Part::Cached),
            ]
        );
    }
}
