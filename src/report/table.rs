//! The terminal table `replay` prints: the [`super::columns::SUMMARY`] columns,
//! aligned, numbers to the right.

use super::columns::{self, Cell};
use crate::metrics::PolicyResult;
use crate::recorded::RecordedRow;
use std::fmt::Write;

/// Renders `results` as an aligned text table, in the order given, then one line per policy
/// that ran out of memory (see `oom_lines`). Rows are labelled by `columns::labels`;
/// `retries` shows when a policy retried (`columns::summary_for`). When `bound` is among
/// them, the `over bound` column gives each policy's overhead over it.
pub fn render(results: &[PolicyResult]) -> String {
    render_with_recorded(results, None)
}

/// Like [`render`], with the recorded run (when the trace carries its figures) as a first row,
/// `-` where the file cannot tell, and a `vs recorded` column: each policy's peak reserved
/// against the recorded peak.
pub fn render_with_recorded(results: &[PolicyResult], recorded: Option<&RecordedRow>) -> String {
    let table = columns::summary_table(results, columns::labels(results), recorded);
    let header: Vec<&str> = table.headers.iter().map(|h| h.0).collect();
    let mut text: Vec<Vec<String>> = table
        .rows
        .into_iter()
        .map(|(label, r)| {
            let mut cells: Vec<String> = r.iter().map(Cell::human).collect();
            cells[0] = label;
            cells
        })
        .collect();
    // A run that ran out of memory never reached a peak to compare: its peak cell says where it
    // stopped, and it is not measured against the recording.
    let offset = usize::from(recorded.is_some());
    let column = |name: &str| header.iter().position(|h| *h == name);
    let (peak, vs) = (column(columns::PEAK_RESERVED.header), column(columns::VS_RECORDED));
    let over = column(columns::OVER_BOUND.header);
    for (k, r) in results.iter().enumerate() {
        let (Some(event), Some(row)) = (r.first_oom_event, text.get_mut(offset + k)) else {
            continue;
        };
        if let Some(cell) = peak.and_then(|i| row.get_mut(i)) {
            *cell = format!("OOM at event {event}");
        }
        for i in [vs, over].into_iter().flatten() {
            if let Some(cell) = row.get_mut(i) {
                *cell = "-".into();
            }
        }
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &text {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (i, (cell, &w)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(out, "{cell:<w$}");
            } else {
                let _ = write!(out, "  {cell:>w$}");
            }
        }
        out.push('\n');
    };
    line(&mut out, &header);
    for row in &text {
        line(&mut out, &row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out += &start_peak_line(results, recorded);
    out += &start_fit_lines(results);
    out += &oom_lines(results);
    out
}

/// Under the table, per run whose limit left part of the recorded start state out (a warm
/// snapshot's cache that does not fit under `per_process_memory_fraction` or `--capacity`):
/// what was installed, and that the live blocks left out were allocated anew before the first
/// event (an OOM at event 0 where they could not be). Empty when every start state fit.
pub(crate) fn start_fit_lines(results: &[PolicyResult]) -> String {
    let mut out = String::new();
    for (r, label) in results.iter().zip(columns::labels(results)) {
        let Some(f) = &r.start_state else { continue };
        let limit = f
            .limit_bytes
            .map(|l| format!("the {} limit", crate::units::format_bytes(l)))
            .unwrap_or_else(|| "the device".into());
        let at_start = match &r.first_oom {
            Some(d) if d.event == 0 => "; some did not fit: out of memory at event 0".to_string(),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "\nstart state: {label}: the recorded cache at the first event ({} in {} segments) \
             does not fit under {limit}: {} in {} segments installed, the rest left out; the \
             blocks live in it were allocated anew before the first event{at_start}",
            crate::units::format_bytes(f.bytes),
            f.segments,
            crate::units::format_bytes(f.installed_bytes),
            f.installed_segments,
        );
    }
    out
}

/// Under the table, when some run's reserved memory peaked at the start state (a warm
/// snapshot's recovered cache, before the first event): one line naming those runs, since their
/// peak is no moment the program asked for memory, and saying that `frag@live peak` reads the
/// cache when live bytes peaked. Empty when no run peaked at its start.
pub(crate) fn start_peak_line(results: &[PolicyResult], recorded: Option<&RecordedRow>) -> String {
    let mut names: Vec<String> = recorded
        .filter(|r| r.peak_at_start == Some(true))
        .map(|r| r.policy.clone())
        .into_iter()
        .collect();
    names.extend(
        results
            .iter()
            .zip(columns::labels(results))
            .filter(|(r, _)| r.peak_at_start && r.first_oom_event.is_none())
            .map(|(_, label)| label),
    );
    if names.is_empty() {
        return String::new();
    }
    format!(
        "\npeak at start: {}: peak reserved is the state before the first event (the cache \
         recovered from the recording), not a moment the program asked for memory; frag@live \
         peak is read when live bytes peaked\n",
        names.join(", ")
    )
}

/// The most stack frames an OOM line shows (innermost first).
const OOM_FRAMES: usize = 5;

/// Under the table, per policy that ran out of memory, its first OOM in PyTorch's words
/// ([`crate::metrics::OomDetail::describe`]) and the allocation's innermost frames when the
/// trace kept them. Empty when nothing ran out.
pub(crate) fn oom_lines(results: &[PolicyResult]) -> String {
    let mut out = String::new();
    for (r, label) in results.iter().zip(columns::labels(results)) {
        let Some(d) = &r.first_oom else { continue };
        let _ = writeln!(out, "{label}: out of memory at {}", d.describe());
        for f in d.stack.iter().take(OOM_FRAMES) {
            let _ = writeln!(out, "    at {f}");
        }
        if d.stack.len() > OOM_FRAMES {
            let _ = writeln!(out, "    ... {} more frames", d.stack.len() - OOM_FRAMES);
        }
    }
    if !out.is_empty() {
        out.insert(0, '\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_and_shows_overhead_over_bound() {
        let results = [
            PolicyResult {
                policy: "bound".into(),
                peak_reserved_bytes: 4096,
                ..Default::default()
            },
            PolicyResult {
                policy: "nocache".into(),
                peak_reserved_bytes: 6144,
                device_malloc_count: 3,
                ..Default::default()
            },
        ];
        let t = render(&results);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "policy   peak reserved  peak allocated  peak requested  frag@live peak  mallocs  frees  over bound  oom"
        );
        assert_eq!(
            lines[2],
            "nocache       6.00 KiB         0 bytes         0 bytes            0.0%        3      0      +50.0%   no"
        );
        assert!(lines.iter().all(|l| l.chars().count() == lines[0].chars().count()));
    }

    #[test]
    fn out_of_memory_is_explained_under_the_table() {
        let results = [PolicyResult {
            policy: "bfc".into(),
            oom: true,
            first_oom_event: Some(7),
            first_oom: Some(crate::metrics::OomDetail {
                event: 7,
                size: 3 << 20,
                stream: 2,
                capacity_bytes: Some(8 << 20),
                reserved_bytes: 6 << 20,
                allocated_bytes: 4 << 20,
                free_bytes: Some(2 << 20),
                stack: vec!["train.py:12 step".into()],
                before_first_event: false,
            }),
            ..Default::default()
        }];
        let t = render(&results);
        let tail: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(
            tail,
            [
                "",
                "bfc: out of memory at event 7: tried to allocate 3.00 MiB on stream 2; \
                 capacity 8.00 MiB of which 2.00 MiB is free; 6.00 MiB reserved, of which \
                 2.00 MiB is reserved but unallocated",
                "    at train.py:12 step"
            ]
        );
    }
}
