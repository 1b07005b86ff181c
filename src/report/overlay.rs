//! `diff --out DIR`: two runs on one axis, for a paper or a bug report.
//!
//! `side` replays one run of a [`DiffReport`] keeping its memory over time (while its trace is
//! at hand), and `place` puts both on A's axis: x is the number of A's allocations made so far, and a moment of B sits where
//! the alignment of the two allocation sequences ([`crate::blame::diff`]) puts B's allocations
//! made so far, so the same step of the same program lines up even when B runs longer or
//! allocates more. Where both traces record times, a second chart puts them on a time axis
//! (seconds since each trace's first event). [`write_dir`] writes `overlay.*` (and
//! `overlay-time.*`), `site-delta.*` (the site deltas as bars left and right of zero), both as
//! PNG and SVG, `diff.json` (the `diff --format json` object) and `diff.html`.

use super::html::escape;
use super::plot::style::{self, *};
use crate::blame::diff::{DiffReport, Side};
use crate::blame::{keep_end, BlameOptions};
use crate::error::{Error, Result};
use crate::metrics::Point;
use crate::replay::{run_spec, ReplayOptions};
use crate::trace::Action;
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use std::path::{Path, PathBuf};

/// The most points each run's plotted lines keep (every peak kept).
const POINTS: usize = 2_000;

/// One run's lines: `(x, reserved, allocated)` per point, on the shared axis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lines {
    /// The run's label: trace file name and policy.
    pub(crate) label: String,
    /// The points.
    pub(crate) points: Vec<(f64, u64, u64)>,
}

/// What the overlay directory shows.
#[derive(Clone, Debug)]
pub struct OverlayData {
    /// The diff.
    pub(crate) report: DiffReport,
    /// A and B on A's allocation axis.
    pub(crate) aligned: [Lines; 2],
    /// A and B on a time axis (time since each run's earliest event, in `time_unit`), when
    /// both record times.
    pub(crate) timed: Option<[Lines; 2]>,
    /// The time axis's unit (`s`, `ms` or `µs`), chosen by the longer run's span.
    pub(crate) time_unit: &'static str,
}

/// The label of a run: its trace's file name and policy.
fn label(side: &str, trace: &str, policy: &str) -> String {
    let name = Path::new(trace).file_name().map_or(trace.into(), |n| n.to_string_lossy());
    format!("{side}: {name} ({policy})")
}

/// One run's memory over time, kept while its trace is at hand (`side`), so that the overlay
/// of two large traces never holds both.
#[derive(Clone, Debug, Default)]
pub struct SideLines {
    /// Its memory over time, at most [`POINTS`] points.
    points: Vec<Point>,
    /// For each point, the allocations (`alloc` of non-zero size) made at and before its event.
    counts: Vec<u64>,
    /// All its allocations.
    total: u64,
    /// Its earliest event time (the first event's, unless times go backwards): where its time
    /// axis starts, so every point lies on it.
    earliest_time: i64,
    /// Whether its trace records times.
    has_times: bool,
}

/// Replays `s` keeping its memory over time.
pub fn side(s: &Side, options: &BlameOptions) -> Result<SideLines> {
    let replay =
        ReplayOptions { keep_series: true, series_budget: POINTS, ..options.replay.clone() };
    let out = run_spec(&s.spec, s.input, &replay)?;
    let points = out.series.map(|s| s.downsampled(POINTS)).unwrap_or_default();
    let events = crate::blame::events(s.input);
    let mut wanted: Vec<u64> = points.iter().map(|p| p.event).collect();
    wanted.sort_unstable();
    wanted.dedup();
    // One pass: the running count of allocations, read at each wanted event (an event past
    // the last counts none), and the earliest time.
    let mut at: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let (mut n, mut next, mut earliest_time) = (0u64, 0usize, None::<i64>);
    for (i, e) in events.iter().enumerate() {
        earliest_time = Some(earliest_time.map_or(e.time_us, |t| t.min(e.time_us)));
        n += u64::from(e.action == Action::Alloc && e.size > 0);
        while next < wanted.len() && wanted[next] < i as u64 {
            next += 1;
        }
        if next < wanted.len() && wanted[next] == i as u64 {
            at.insert(i as u64, n);
        }
    }
    let counts = points.iter().map(|p| at.get(&p.event).copied().unwrap_or(0)).collect();
    Ok(SideLines {
        points,
        counts,
        total: n,
        earliest_time: earliest_time.unwrap_or(0),
        has_times: s.input.trace().has_times,
    })
}

/// Places two runs on A's axis through the aligned allocation pairs of
/// `crate::blame::diff::compare`.
pub fn place(
    report: DiffReport,
    a: &SideLines,
    b: &SideLines,
    mut pairs: Vec<(usize, usize)>,
) -> OverlayData {
    pairs.sort_unstable_by_key(|p| p.1);
    // B's allocation count → A's, through the last matched pair at or before it.
    let total_b = b.total as usize;
    let mut b_to_a = vec![0u64; total_b + 1];
    let mut k = 0;
    for (j, slot) in b_to_a.iter_mut().enumerate() {
        while k < pairs.len() && pairs[k].1 < j {
            k += 1;
        }
        // Pairs up to index k-1 have B ordinal < j: j allocations of B are made, so A's made
        // are the A ordinal of the last of them plus one.
        *slot = k.checked_sub(1).map_or(0, |p| pairs[p].0 as u64 + 1);
    }
    let la = label("A", &report.a.trace, &report.a.policy);
    let lb = label("B", &report.b.trace, &report.b.policy);
    let aligned = [
        Lines {
            label: la.clone(),
            points: a
                .points
                .iter()
                .zip(&a.counts)
                .map(|(p, &c)| (c as f64, p.reserved, p.allocated))
                .collect(),
        },
        Lines {
            label: lb.clone(),
            points: b
                .points
                .iter()
                .zip(&b.counts)
                .map(|(p, &c)| (b_to_a[(c as usize).min(total_b)] as f64, p.reserved, p.allocated))
                .collect(),
        },
    ];
    let since = |s: &SideLines, t: i64| t.saturating_sub(s.earliest_time);
    let span = |s: &SideLines| s.points.iter().map(|p| since(s, p.time_us)).max().unwrap_or(0);
    let (per_unit, time_unit) = super::bundle::time_unit(span(a).max(span(b)));
    let timed = (a.has_times && b.has_times).then(|| {
        let t = |s: &SideLines| -> Vec<(f64, u64, u64)> {
            s.points
                .iter()
                .map(|p| (since(s, p.time_us) as f64 / per_unit, p.reserved, p.allocated))
                .collect()
        };
        [Lines { label: la, points: t(a) }, Lines { label: lb, points: t(b) }]
    });
    OverlayData { report, aligned, timed, time_unit }
}

/// The overlay chart: both runs' reserved (solid) and allocated (dashed) bytes on one axis.
pub struct Overlay<'a> {
    /// The two runs.
    pub(crate) lines: &'a [Lines; 2],
    /// The x axis description.
    pub(crate) x_desc: &'a str,
    /// The title.
    pub(crate) title: String,
}

impl Chart for Overlay<'_> {
    fn size(&self) -> (u32, u32) {
        (1400, 760)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let (w, _) = self.size();
        draw_title(root, &self.title, w)?;
        let mut legend = Vec::new();
        for (i, l) in self.lines.iter().enumerate() {
            let peak = l.points.iter().map(|p| p.1).max().unwrap_or(0);
            legend.push(LegendEntry {
                sample: Sample::Line(policy_color(i), None),
                label: format!("{} reserved, peak {}", keep_end(&l.label, 60), format_bytes(peak)),
            });
        }
        legend.push(LegendEntry {
            sample: Sample::Dashed(INK),
            label: "allocated (each run's colour)".into(),
        });
        style::draw_legend(root, (90, 46), &legend)?;
        let x_max = x_end(self.lines);
        let peak = self
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1.max(p.2)))
            .max()
            .unwrap_or(1);
        let scale = ByteScale::for_max(peak);
        let y_max = scale.of(peak).max(1e-9) * 1.08;
        let mut chart = ChartBuilder::on(root)
            .margin_top(46 + 3 * LEGEND_LINE + 16)
            .margin_left(16)
            .margin_right(40)
            .margin_bottom(12)
            .x_label_area_size(52)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .or_draw_error()?;
        draw_memory_mesh(&mut chart, self.x_desc, &format!("memory ({})", scale.unit))?;
        for (i, l) in self.lines.iter().enumerate() {
            let color = policy_color(i);
            let reserved: Vec<(f64, f64)> = l.points.iter().map(|p| (p.0, scale.of(p.1))).collect();
            let allocated: Vec<(f64, f64)> =
                l.points.iter().map(|p| (p.0, scale.of(p.2))).collect();
            let x_end = l.points.last().map_or(0.0, |p| p.0);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    step_path(&reserved, x_end),
                    color.stroke_width(2),
                )))
                .or_draw_error()?;
            let period = x_max / 120.0;
            for piece in dash_by_x(&step_path(&allocated, x_end), period, period * 0.55) {
                chart
                    .draw_series(std::iter::once(PathElement::new(piece, color.stroke_width(1))))
                    .or_draw_error()?;
            }
        }
        Ok(())
    }
}

/// The site-delta chart: each site's live bytes B − A at the runs' peak-live moments, growth to
/// the right of zero, shrinkage to the left, names in a column of their own.
pub struct SiteDelta<'a> {
    /// The diff.
    pub(crate) report: &'a DiffReport,
}

const DELTA_ROW: i32 = 28;
const NAME_CHARS: usize = 64;
/// The most sites the site-delta chart draws (the largest changes; `diff.json` has them all):
/// the bitmap grows with every row, and `--top 0` on a trace of 200,000 sites would need
/// gigabytes.
pub const MAX_DELTA_ROWS: usize = 100;

impl SiteDelta<'_> {
    /// The sites drawn: the first [`MAX_DELTA_ROWS`] (the report lists the largest changes first).
    fn drawn(&self) -> &[crate::blame::diff::SiteDelta] {
        let s = &self.report.sites;
        &s[..s.len().min(MAX_DELTA_ROWS)]
    }

    /// How many sites are not drawn.
    fn left_out(&self) -> usize {
        self.report.sites.len() - self.drawn().len()
    }
}

impl Chart for SiteDelta<'_> {
    fn size(&self) -> (u32, u32) {
        let rows = self.drawn().len().max(1) + usize::from(self.left_out() > 0);
        (1400, (150 + DELTA_ROW * rows as i32) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let (w, _) = self.size();
        let r = self.report;
        let title = format!(
            "Live bytes by site, B − A at each run's peak-live moment (total {})",
            signed(r.delta.peak_live_bytes)
        );
        draw_title(root, &title, w)?;
        root.draw(&Text::new(
            format!("A: {}   B: {}", keep_end(&r.a.trace, 50), keep_end(&r.b.trace, 50)),
            (w as i32 / 2, 48),
            anchored(text(SMALL), HPos::Center, VPos::Top),
        ))
        .or_draw_error()?;
        let sites = self.drawn();
        if sites.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = sites.iter().map(|s| keep_end(&s.site, NAME_CHARS)).collect();
        let name_w =
            names.iter().map(|n| text_width(n, SMALL)).max().unwrap_or(100).clamp(100, 620) + 20;
        let max = sites.iter().map(|s| s.delta_bytes.unsigned_abs()).max().unwrap_or(1).max(1);
        let (x0, x1) = (16 + name_w + 110, w as i32 - 130);
        let zero = (x0 + x1) / 2;
        let half = (x1 - x0) / 2;
        let px = |d: i64| zero + (half as f64 * d as f64 / max as f64).round() as i32;
        let mut y = 90;
        root.draw(&PathElement::new(
            vec![(zero, y - 6), (zero, y + DELTA_ROW * sites.len() as i32 + 6)],
            INK.stroke_width(1),
        ))
        .or_draw_error()?;
        for (s, name) in sites.iter().zip(names) {
            let (top, bottom) = (y + 5, y + DELTA_ROW - 5);
            let end = px(s.delta_bytes);
            let color = if s.delta_bytes >= 0 { ROUNDING } else { REQUESTED };
            if s.delta_bytes != 0 {
                root.draw(&Rectangle::new(
                    [(zero.min(end), top), (zero.max(end).max(zero.min(end) + 1), bottom)],
                    color.filled(),
                ))
                .or_draw_error()?;
            }
            let mark = match s.only_in.as_deref() {
                Some("a") => " (A only)",
                Some("b") => " (B only)",
                _ => "",
            };
            root.draw(&Text::new(
                format!("{name}{mark}"),
                (16 + name_w, y + DELTA_ROW / 2),
                anchored(text(SMALL), HPos::Right, VPos::Center),
            ))
            .or_draw_error()?;
            let (x, h) =
                if s.delta_bytes >= 0 { (end + 8, HPos::Left) } else { (end - 8, HPos::Right) };
            root.draw(&Text::new(
                signed(s.delta_bytes),
                (x, y + DELTA_ROW / 2),
                anchored(text(SMALL), h, VPos::Center),
            ))
            .or_draw_error()?;
            y += DELTA_ROW;
        }
        if self.left_out() > 0 {
            root.draw(&Text::new(
                format!(
                    "… and {} more sites with smaller changes (diff.json lists every site)",
                    self.left_out()
                ),
                (16, y + DELTA_ROW / 2),
                anchored(text(SMALL), HPos::Left, VPos::Center),
            ))
            .or_draw_error()?;
        }
        Ok(())
    }
}

/// A signed byte count.
fn signed(d: i64) -> String {
    let sign = match d.signum() {
        1 => "+",
        -1 => "−",
        _ => "",
    };
    format!("{sign}{}", format_bytes(d.unsigned_abs()))
}

/// Writes the overlay directory (see the module docs) and returns the files written. Every file
/// is built in a staging folder inside `out` and renamed into place with `diff.html` last
/// ([`super::output::Staging`]): a failed or killed run leaves the old files as they were.
pub fn write_dir(data: &OverlayData, out: &Path) -> Result<Vec<PathBuf>> {
    let staging = super::output::Staging::for_flag(out, "--out")?;
    let files = write_files(data, staging.path())?;
    staging.commit(&files, "diff.html")
}

/// Writes the overlay's files into `dir`.
fn write_files(data: &OverlayData, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let aligned = Overlay {
        lines: &data.aligned,
        x_desc: "allocations of A made so far (B placed by aligning its allocations with A's)",
        title: "Two runs on one axis: reserved (solid) and allocated (dashed) memory".into(),
    };
    files.extend(style::write_chart(&aligned, dir, "overlay")?);
    if let Some(timed) = &data.timed {
        let x_desc = format!("time since each run's first event ({})", data.time_unit);
        let chart = Overlay {
            lines: timed,
            x_desc: &x_desc,
            title: "Two runs on one time axis: reserved (solid) and allocated (dashed) memory"
                .into(),
        };
        files.extend(style::write_chart(&chart, dir, "overlay-time")?);
    }
    files.extend(style::write_chart(&SiteDelta { report: &data.report }, dir, "site-delta")?);
    let json = dir.join("diff.json");
    let text =
        serde_json::to_string_pretty(&data.report).map_err(|e| Error::writing("JSON", e.into()))?;
    std::fs::write(&json, text + "\n").map_err(|e| Error::io(&json, e))?;
    files.push(json);
    let html = dir.join("diff.html");
    std::fs::write(&html, page(data)).map_err(|e| Error::io(&html, e))?;
    files.push(html);
    Ok(files)
}

/// `diff.html`.
fn page(data: &OverlayData) -> String {
    let r = &data.report;
    let mut h =
        String::from("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    h += "<title>fragsim diff</title>\n<style>body{font-family:system-ui,sans-serif;max-width:1280px;\
          margin:2em auto;padding:0 1em;color:#222}img{max-width:100%;border:1px solid #e4e4e4}\
          td,th{padding:.3em .7em;border-bottom:1px solid #e4e4e4}td.n{text-align:right}\
          code{background:#f3f3f3;padding:0 .25em}</style>\n</head>\n<body>\n";
    h += "<h1>fragsim diff</h1>\n<table>\n<tr><th></th><th>trace</th><th>policy</th><th>peak reserved</th>\
          <th>peak allocated</th><th>peak live</th></tr>\n";
    for (name, p) in [("A", &r.a), ("B", &r.b)] {
        h += &format!(
            "<tr><td>{name}</td><td><code>{}</code></td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
            escape(&p.trace),
            escape(&p.policy),
            format_bytes(p.peak_reserved_bytes),
            format_bytes(p.peak_allocated_bytes),
            format_bytes(p.peak_live_bytes)
        );
    }
    h += &format!(
        "<tr><td>B − A</td><td></td><td></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n</table>\n",
        signed(r.delta.peak_reserved_bytes),
        signed(r.delta.peak_allocated_bytes),
        signed(r.delta.peak_live_bytes)
    );
    let mut figure = |stem: &str, title: &str| {
        h += &format!(
            "<h2>{title}</h2>\n<figure><a href=\"{stem}.svg\"><img src=\"{stem}.png\" alt=\"{title}\"/></a>\
             <figcaption><a href=\"{stem}.svg\">SVG</a> · <a href=\"{stem}.png\">PNG</a></figcaption></figure>\n"
        );
    };
    figure("overlay", "Both runs on one axis");
    if data.timed.is_some() {
        figure("overlay-time", "Both runs on a time axis");
    }
    figure("site-delta", "What changed, by site");
    if !r.moved.is_empty() {
        h += "<h2>Moved between sites</h2>\n<p>Blocks of the same size live in both runs under \
              another site (the same tensors, allocated by another op): left out of the sites \
              above.</p>\n<table>\n<tr><th>in A</th><th>in B</th><th>bytes</th><th>blocks</th></tr>\n";
        for m in &r.moved {
            h += &format!(
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
                escape(&m.from_site),
                escape(&m.to_site),
                format_bytes(m.bytes),
                m.blocks
            );
        }
        h += "</table>\n";
    }
    if let Some(note) = &r.note {
        h += &format!("<p><strong>Note:</strong> {}</p>\n", escape(note));
    }
    h += &format!(
        "<p>Allocations aligned by {} ({}): {} matched pairs. The exact numbers: <a href=\"diff.json\">diff.json</a> \
         (the <code>diff --format json</code> object).</p>\n</body>\n</html>\n",
        r.by.name(),
        escape(&r.alignment),
        r.matched_count
    );
    h
}

/// The right end of an overlay's x axis: the runs' own extent and a little room, so that a short
/// recording (a fraction of a second on the time axis) fills the chart instead of sitting in the
/// corner of a fixed minimum; 1 when no point lies right of zero.
fn x_end(lines: &[Lines]) -> f64 {
    let extent = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)).fold(0.0, f64::max);
    if extent > 0.0 {
        extent * 1.01
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(xs: &[f64]) -> Lines {
        Lines { label: "run".into(), points: xs.iter().map(|&x| (x, 1, 1)).collect() }
    }

    /// A diff of two empty runs whose site deltas are `sites`.
    fn report_with(sites: Vec<serde_json::Value>) -> DiffReport {
        let run = serde_json::json!({"trace": "t", "policy": "pytorch", "config": "",
            "peak_reserved_bytes": 0, "peak_allocated_bytes": 0, "peak_live_bytes": 0,
            "peak_event": 0, "peak_live_event": 0});
        serde_json::from_value(serde_json::json!({
            "a": run, "b": run, "by": "site", "sites": sites, "alignment": "site-rank",
            "matched_count": 0, "matched": [],
            "delta": {"peak_reserved_bytes": 0, "peak_allocated_bytes": 0, "peak_live_bytes": 0},
        }))
        .unwrap()
    }

    /// A timed run whose points are at `times` (µs), its earliest event at `earliest`.
    fn timed_side(times: &[i64], earliest: i64) -> SideLines {
        let points = times
            .iter()
            .enumerate()
            .map(|(i, &t)| Point {
                event: i as u64,
                time_us: t,
                reserved: 1,
                allocated: 1,
                requested: 1,
            })
            .collect::<Vec<_>>();
        let counts = vec![0; points.len()];
        SideLines { points, counts, total: 0, earliest_time: earliest, has_times: true }
    }

    #[test]
    fn the_time_axis_reads_in_the_unit_of_the_longer_run_and_starts_at_the_earliest_event() {
        // 5 ms and 3 ms runs: ticks in ms (in seconds they would all read 0).
        let t0 = 1_767_225_600_000_000;
        let a = timed_side(&[t0, t0 + 5_000], t0);
        let b = timed_side(&[t0 + 100, t0 + 3_100], t0 + 100);
        let data = place(report_with(Vec::new()), &a, &b, Vec::new());
        assert_eq!(data.time_unit, "ms");
        let timed = data.timed.expect("both runs are timed");
        assert_eq!(timed[0].points.iter().map(|p| p.0).collect::<Vec<_>>(), [0.0, 5.0]);
        assert_eq!(timed[1].points.iter().map(|p| p.0).collect::<Vec<_>>(), [0.0, 3.0]);
        // A last time a tenth of the others (a truncated line): the axis starts there, so no
        // point lies left of it.
        let back = timed_side(&[t0, t0 + 10, t0 / 10], t0 / 10);
        let data = place(report_with(Vec::new()), &back, &back, Vec::new());
        assert_eq!(data.time_unit, "s");
        let xs: Vec<f64> = data.timed.unwrap()[0].points.iter().map(|p| p.0).collect();
        assert!(xs.iter().all(|&x| x >= 0.0) && xs[2] == 0.0, "{xs:?}");
    }

    #[test]
    fn the_site_delta_chart_draws_a_bounded_number_of_sites() {
        let sites: Vec<serde_json::Value> = (0..200_000)
            .map(|i| {
                serde_json::json!({"site": format!("m.py:{i}:f"), "a_bytes": 0, "b_bytes": 512,
                    "delta_bytes": 512, "only_in": "b"})
            })
            .collect();
        let report = report_with(sites);
        let chart = SiteDelta { report: &report };
        assert_eq!(chart.drawn().len(), MAX_DELTA_ROWS);
        assert_eq!(chart.left_out(), 200_000 - MAX_DELTA_ROWS);
        let (w, h) = chart.size();
        assert!(u64::from(w) * u64::from(h) * 3 < 64 << 20, "{w}×{h}");
    }

    #[test]
    fn the_x_axis_spans_the_runs_however_short() {
        let short = [run(&[0.0, 0.05]), run(&[0.0, 0.23])];
        let end = x_end(&short);
        assert!((0.23..0.24).contains(&end), "{end}");
        let long = [run(&[0.0, 6500.0]), run(&[0.0, 2600.0])];
        assert!((6500.0..6600.0).contains(&x_end(&long)));
        assert_eq!(x_end(&[run(&[0.0])]), 1.0);
        assert_eq!(x_end(&[]), 1.0);
    }
}
