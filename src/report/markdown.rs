//! `summary.md`: the results table in Markdown (the [`super::columns::SUMMARY`]
//! columns), each policy's exact configuration, and the trace it was measured on.

use super::bundle::ReportData;
use super::columns::{self, Cell};
use crate::error::{Error, Result};
use crate::trace::sites::printable;
use std::io::Write;

/// Escapes text for a Markdown table cell: control characters written out ([`printable`]; a name
/// from the trace must not put an ESC in the file), then the characters that would end the cell
/// or start HTML (`\\`, `|`, `<`, `>`, `&`) backslash-escaped.
fn cell(s: &str) -> String {
    escaped(s, |c| matches!(c, '\\' | '|' | '<' | '>' | '&'))
}

/// Escapes text for a Markdown heading: as [`cell`], and every other character Markdown reads as
/// markup too (CommonMark lets a backslash escape any ASCII punctuation), so a trace named
/// `*x* #1.pickle` is a heading that shows that name.
fn heading(s: &str) -> String {
    escaped(s, |c| "\\`*_[]<>&#|!~(){}\"".contains(c))
}

/// `s` with control characters written out and a backslash before each character `markup` names.
fn escaped(s: &str, markup: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in printable(s).chars() {
        if markup(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Text for a Markdown code span: control characters written out ([`printable`]; a span has no
/// escapes of its own, so its backslashes stay as they are) and backticks, which would end it,
/// made quotes.
fn code(s: &str) -> String {
    printable(s).replace('`', "'")
}

/// Writes the summary of `data` as Markdown.
pub(crate) fn write_summary(data: &ReportData, out: &mut impl Write) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("Markdown", e);
    let t = &data.trace;
    let mut s = String::new();
    s += &format!("# fragsim report: {}\n\n", heading(&t.file_name()));
    s += &format!(
        "Trace `{}` ({}), device {}, {} events, time span {}. fragsim {}.\n\n",
        // The file's name only: the path given may be this machine's absolute one.
        code(&t.file_name()),
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
        s += &format!("- `{}`: `{}`\n", code(&run.label), code(config));
    }
    for skip in &data.skipped {
        s += &format!("- `{}`: skipped ({})\n", code(&skip.label), code(&skip.reason));
    }
    out.write_all(s.as_bytes()).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_a_trace_are_text_in_cells_and_headings() {
        assert_eq!(cell("a|b\\c<img>&x"), "a\\|b\\\\c\\<img\\>\\&x");
        assert_eq!(cell("max_split_size_mb:128"), "max_split_size_mb:128");
        assert_eq!(heading("*x* #1 [a](b).pickle"), "\\*x\\* \\#1 \\[a\\]\\(b\\).pickle");
        assert_eq!(heading("esc\u{1b}"), "esc\\\\x1b");
    }
}
