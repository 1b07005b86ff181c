//! The terminal table `replay` prints: the [`super::columns::SUMMARY`] columns,
//! aligned, numbers to the right.

use super::columns::{self, Cell};
use crate::recorded::RecordedRow;
use crate::replay::PolicyResult;
use std::fmt::Write;

/// Renders `results` as an aligned text table, in the order given. When `bound` is among them,
/// the `over bound` column gives each policy's overhead over it.
pub fn render(results: &[PolicyResult]) -> String {
    render_with_recorded(results, None)
}

/// Like [`render`], with the recorded run (when the trace carries its figures) as a first row,
/// `-` where the file cannot tell, and a `vs recorded` column: each policy's peak reserved
/// against the recorded peak.
pub fn render_with_recorded(results: &[PolicyResult], recorded: Option<&RecordedRow>) -> String {
    let mut header: Vec<&str> = columns::SUMMARY.iter().map(|c| c.header).collect();
    let mut rows = columns::cells(results, &columns::SUMMARY);
    if let Some(rec) = recorded {
        header.push(columns::VS_RECORDED);
        for (row, r) in rows.iter_mut().zip(results) {
            row.push(columns::vs_recorded(r, rec));
        }
        let mut first = columns::recorded_cells(rec, results, &columns::SUMMARY);
        first.push(Cell::Unknown);
        rows.insert(0, first);
    }
    let text: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(Cell::human).collect()).collect();
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
            "policy   peak reserved  peak allocated  peak requested  frag@peak  mallocs  frees  over bound  oom"
        );
        assert_eq!(
            lines[2],
            "nocache       6.00 KiB         0 bytes         0 bytes       0.0%        3      0      +50.0%   no"
        );
        assert!(lines.iter().all(|l| l.chars().count() == lines[0].chars().count()));
    }
}
