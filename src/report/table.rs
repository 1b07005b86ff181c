//! The terminal table `replay` prints.

use crate::replay::PolicyResult;
use crate::units::format_bytes;
use std::fmt::Write;

/// Renders `results` as an aligned text table, sorted as given. `bound`, when present, gives the
/// overhead column.
pub fn render(results: &[PolicyResult]) -> String {
    let bound = results.iter().find(|r| r.policy == "bound").map(|r| r.peak_reserved_bytes);
    let header = [
        "policy",
        "peak reserved",
        "peak allocated",
        "peak requested",
        "frag@peak",
        "mallocs",
        "frees",
        "over bound",
        "oom",
    ];
    let mut rows: Vec<[String; 9]> = Vec::new();
    for r in results {
        let over = match bound {
            Some(b) if b > 0 => {
                format!("{:+.1}%", (r.peak_reserved_bytes as f64 / b as f64 - 1.0) * 100.0)
            }
            _ => "-".into(),
        };
        let oom = match r.first_oom_event {
            Some(e) => format!("at event {e}"),
            None => "no".into(),
        };
        rows.push([
            r.policy.clone(),
            format_bytes(r.peak_reserved_bytes),
            format_bytes(r.peak_allocated_bytes),
            format_bytes(r.peak_requested_bytes),
            format!("{:.1}%", r.fragmentation_at_peak * 100.0),
            (r.device_malloc_count + r.map_count).to_string(),
            (r.device_free_count + r.unmap_count).to_string(),
            over,
            oom,
        ]);
    }
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i == 0 {
                let _ = write!(out, "{cell:<w$}");
            } else {
                let _ = write!(out, "  {cell:>w$}");
            }
        }
        out.push('\n');
    };
    line(&mut out, &header);
    for row in &rows {
        line(&mut out, &row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out
}
