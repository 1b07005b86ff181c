//! `index.html`: one self-contained page (inline CSS, no scripts, no network) that shows a report:
//! the results table, every chart, the trace's facts, each policy's exact configuration, and the
//! fragsim version. It references only the chart files written beside it.

use super::bundle::ReportData;
use super::columns;
use crate::error::{Error, Result};
use crate::units::format_bytes;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Escapes text for HTML content and attribute values, control characters written out
/// ([`crate::trace::sites::printable`]), so the page is well-formed XML whatever a trace names.
pub(crate) fn escape(s: &str) -> String {
    crate::trace::sites::xml_escape(s)
}

/// The charts in page order: file stem, heading, what to look for.
const CHARTS: [(&str, &str, &str); 7] = [
    (
        "timeline",
        "Memory over time",
        "Reserved (solid) and allocated (dashed) bytes of every policy (with more than four: the \
         recorded settings, the best policy and bound; the next chart has them all); the grey \
         floor is the live requested bytes. Each policy's peak is marked.",
    ),
    (
        "timeline-all",
        "Memory over time, every policy",
        "The same chart with every policy replayed.",
    ),
    (
        "peaks",
        "Peak reserved memory by policy",
        "Each bar splits the peak into requested bytes, rounding (allocated − requested) and \
         reserved-but-free bytes (reserved − allocated: cached blocks, or page padding), measured at \
         the moment of the peak.",
    ),
    (
        "sites",
        "Where the memory went",
        "Each policy's reserved bytes at its peak by allocation site (the innermost line of your own \
         code; docs/interface.md, Sites): live requested bytes, rounding, and the cached-but-free \
         bytes in the memory that site's requests obtained. fragsim blame prints the same \
         breakdown with the holes also attributed to the site last freed into them.",
    ),
    (
        "fragmentation",
        "Fragmentation over time",
        "1 − allocated ÷ reserved for each policy; the vertical line marks its peak reserved moment.",
    ),
    (
        "segments",
        "Segment map at the peak",
        "Every segment of one policy at the moment its reserved memory peaked, blocks coloured by \
         state and sized by bytes.",
    ),
    (
        "sizes",
        "Allocation sizes",
        "Allocations of the trace in power-of-two size bins: how many, and how many bytes.",
    ),
];

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1280px;\
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}h1{font-size:1.6em;margin-bottom:.2em}\
h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;margin:.8em 0}th,td{padding:.3em .7em;border-bottom:1px solid #e4e4e4}\
th{text-align:left;background:#f5f5f5}td.n{text-align:right;font-variant-numeric:tabular-nums}\
code{background:#f3f3f3;padding:0 .25em;border-radius:3px;word-break:break-all}\
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #e4e4e4}\
figcaption{color:#555;font-size:.95em}.note{color:#8a4b00}dl{display:grid;\
grid-template-columns:max-content auto;gap:.2em 1em}dt{font-weight:600}dd{margin:0}";

/// Writes the page for `data`. `files` are the files already written into `dir`: a chart appears
/// only when both its PNG and SVG are among them, so the page never links a missing file.
pub(crate) fn write_index(
    data: &ReportData,
    files: &[PathBuf],
    dir: &Path,
    out: &mut impl Write,
) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("HTML", e);
    let have = |name: &str| files.iter().any(|f| f == &dir.join(name));
    let t = &data.trace;
    let mut h = String::new();
    h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n";
    h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n";
    h += &format!("<title>fragsim report: {}</title>\n", escape(&t.file_name()));
    h += &format!("<style>{STYLE}</style>\n</head>\n<body>\n");
    h += &format!("<h1>fragsim report: {}</h1>\n", escape(&t.file_name()));
    h += &format!(
        "<p>Device {} of <code>{}</code>, replayed against {} polic{}{}.</p>\n",
        t.device,
        escape(&t.file_name()),
        data.runs.len(),
        if data.runs.len() == 1 { "y" } else { "ies" },
        data.capacity
            .map(|c| format!(" with a capacity of {}", format_bytes(c)))
            .unwrap_or_default()
    );

    h += &results_html(data);
    h += &charts_html(data, &have);
    h += &trace_html(t);
    h += &configs_html(data);
    h += &format!(
        "<p><small>Made by fragsim {} with <code>fragsim report</code>.</small></p>\n",
        escape(data.version)
    );
    h += "</body>\n</html>\n";
    out.write_all(h.as_bytes()).map_err(io)
}

/// The results table and the links to its exact numbers.
fn results_html(data: &ReportData) -> String {
    let mut h = String::new();
    let results = data.results();
    let labels = data.runs.iter().map(|r| r.label.clone()).collect();
    let table = columns::summary_table(&results, labels, data.recorded.as_ref());
    h += "<h2>Results</h2>\n<table>\n<tr>";
    for (header, unit) in &table.headers {
        h += &format!("<th title=\"{}\">{}</th>", escape(unit), escape(header));
    }
    h += "</tr>\n";
    for (label, row) in &table.rows {
        h += "<tr>";
        for (i, c) in row.iter().enumerate() {
            let text = if i == 0 { label.clone() } else { c.human() };
            let class = if c.is_numeric() { " class=\"n\"" } else { "" };
            h += &format!("<td{class}>{}</td>", escape(&text));
        }
        h += "</tr>\n";
    }
    h += "</table>\n";
    h += "<p>The same numbers, exact: <a href=\"results.json\">results.json</a> (the \
          <code>replay --json</code> object), <a href=\"results.csv\">results.csv</a>, \
          <a href=\"summary.md\">summary.md</a>.</p>\n";
    for s in &data.skipped {
        h += &format!(
            "<p class=\"note\">Skipped <code>{}</code>: {}.</p>\n",
            escape(&s.label),
            escape(&s.reason)
        );
    }

    h
}

/// Each chart written, with its caption.
fn charts_html(data: &ReportData, have: &dyn Fn(&str) -> bool) -> String {
    let mut h = String::new();
    for (stem, title, what) in CHARTS {
        let (png, svg) = (format!("{stem}.png"), format!("{stem}.svg"));
        if !(have(&png) && have(&svg)) {
            continue;
        }
        h += &format!("<h2>{}</h2>\n<figure>\n", escape(title));
        h += &format!("<a href=\"{svg}\"><img src=\"{png}\" alt=\"{}\"/></a>\n", escape(title));
        let mut caption = what.to_string();
        if stem == "segments" {
            if let Some(note) = &data.segment_map.note {
                caption = format!("{caption} {note}.");
            }
        }
        let flame = if stem == "sites" && have("flame.svg") {
            " · <a href=\"flame.svg\">flame graph</a> (live bytes by full stack)"
        } else {
            ""
        };
        h += &format!(
            "<figcaption>{} <a href=\"{svg}\">SVG</a> · <a href=\"{png}\">PNG</a>{flame}</figcaption>\n",
            escape(&caption)
        );
        h += "</figure>\n";
    }

    h
}

/// What the trace holds.
fn trace_html(t: &super::bundle::TraceSummary) -> String {
    let mut h = String::new();
    h += "<h2>Trace</h2>\n<dl>\n";
    let mut fact = |k: &str, v: String| h += &format!("<dt>{}</dt><dd>{}</dd>\n", escape(k), v);
    // The file's name only: the path given may be this machine's absolute one.
    fact("file", format!("<code>{}</code>", escape(&t.file_name())));
    fact("format", escape(t.format));
    fact("device replayed", t.device.to_string());
    let devices: Vec<String> = t.devices.iter().map(|(d, n)| format!("{d} ({n} events)")).collect();
    fact("devices", escape(&devices.join(", ")));
    fact("events", t.events.to_string());
    fact("time span", escape(&t.span_text()));
    let actions: Vec<String> = crate::trace::Action::ALL
        .iter()
        .map(|&a| (a.name(), t.info.by_action.get(a)))
        .filter(|&(_, n)| n > 0)
        .map(|(a, n)| format!("{a}: {n}"))
        .collect();
    fact("events by action", escape(&actions.join(", ")));
    let i = &t.info;
    fact(
        "streams",
        escape(&i.streams.iter().map(|s| format!("{s:#x}")).collect::<Vec<_>>().join(", ")),
    );
    if let (Some(lo), Some(hi)) = (i.alloc_size_min, i.alloc_size_max) {
        fact("allocation sizes", escape(&format!("{} to {}", format_bytes(lo), format_bytes(hi))));
    }
    fact(
        "peak live bytes of blocks allocated in the trace",
        escape(&format_bytes(i.peak_live_bytes)),
    );
    fact("frees of blocks allocated before recording began", i.orphan_frees.to_string());
    fact(
        "live at the end",
        escape(&format!(
            "{} blocks allocated in the trace, {}",
            i.allocated_in_trace_live_at_end,
            format_bytes(i.live_at_end_bytes)
        )),
    );
    if i.segments_at_dump > 0 {
        fact(
            "segments at the dump",
            escape(&format!(
                "{}, {} reserved",
                i.segments_at_dump,
                format_bytes(i.reserved_at_dump_bytes)
            )),
        );
    }
    h += "</dl>\n";

    h
}

/// Each policy's exact configuration.
fn configs_html(data: &ReportData) -> String {
    let mut h = String::new();
    h += "<h2>Policy configurations</h2>\n<table>\n<tr><th>policy</th><th>exact configuration</th></tr>\n";
    for run in &data.runs {
        let config = &run.output.result.config;
        let config = if config.is_empty() { "(no options)" } else { config.as_str() };
        h += &format!(
            "<tr><td>{}</td><td><code>{}</code></td></tr>\n",
            escape(&run.label),
            escape(config)
        );
    }
    h += "</table>\n";
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_shows_the_trace_name_not_this_machines_path() {
        let trace = crate::report::testing::text_trace(&crate::report::testing::training_text(2));
        let mut data = crate::report::testing::toy_report(&trace, 1);
        data.trace.path = "/home/someone/runs/secret-dir/step.pickle".into();
        let mut out = Vec::new();
        write_index(&data, &[], Path::new("/tmp/r"), &mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        assert!(page.contains("step.pickle"), "{page}");
        assert!(!page.contains("/home/someone") && !page.contains("secret-dir"), "{page}");
    }

    #[test]
    fn no_zero_percent_has_a_sign() {
        use crate::report::columns::signed_percent;
        for p in [0.0, -0.0, -0.04, 0.04, -1e-9] {
            assert_eq!(signed_percent(p), "0.0%", "{p}");
        }
        assert_eq!(signed_percent(-0.06), "-0.1%");
        assert_eq!(signed_percent(12.34), "+12.3%");
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
