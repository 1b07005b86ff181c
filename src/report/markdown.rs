//! `summary.md`: the results table in Markdown (the [`super::columns::SUMMARY`]
//! columns), each policy's exact configuration, and the trace it was measured on.

use super::bundle::ReportData;
use super::columns::{self, Cell};
use crate::error::{Error, Result};
use std::io::Write;

/// Escapes text for a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('\\', "\\\\").replace('|', "\\|").replace('\n', " ")
}

/// Writes the summary of `data` as Markdown.
pub(crate) fn write_summary(data: &ReportData, out: &mut impl Write) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("Markdown", e);
    let t = &data.trace;
    let mut s = String::new();
    s += &format!("# fragsim report: {}\n\n", cell(&t.file_name()));
    s += &format!(
        "Trace `{}` ({}), device {}, {} events, time span {}. fragsim {}.\n\n",
        // The file's name only: the path given may be this machine's absolute one.
        t.file_name().replace('`', "'"),
        t.format,
        t.device,
        t.events,
        t.span_text(),
        data.version
    );
    let results = data.results();
    let labels = data.runs.iter().map(|r| r.label.clone()).collect();
    let table = columns::summary_table(&results, labels, data.recorded.as_ref());
    let header: Vec<&str> = table.headers.iter().map(|h| h.0).collect();
    s += &format!("| {} |\n", header.join(" | "));
    let align: Vec<&str> =
        header.iter().enumerate().map(|(i, _)| if i == 0 { ":--" } else { "--:" }).collect();
    s += &format!("| {} |\n", align.join(" | "));
    for (label, row) in &table.rows {
        let mut cells: Vec<String> = row.iter().map(|c| cell(&Cell::human(c))).collect();
        if let Some(first) = cells.first_mut() {
            *first = cell(label);
        }
        s += &format!("| {} |\n", cells.join(" | "));
    }
    s += "\nPeak reserved is the most device memory the policy held; `over bound` is its overhead \
          over `bound`, the peak of live requested bytes that no allocator can go below.\n\n";
    let ooms = super::table::oom_lines(&results);
    if !ooms.is_empty() {
        s += &format!("```{ooms}```\n\n");
    }
    s += "## Configurations\n\n";
    for run in &data.runs {
        let config = &run.output.result.config;
        let config = if config.is_empty() { "(no options)" } else { config.as_str() };
        s += &format!("- `{}`: `{}`\n", run.label, config.replace('`', "'"));
    }
    for skip in &data.skipped {
        s += &format!("- `{}`: skipped ({})\n", skip.label, skip.reason.replace('`', "'"));
    }
    out.write_all(s.as_bytes()).map_err(io)
}
