//! CSV of replay results: one row per policy, the `replay --json` keys as header
//! ([`super::columns::RESULT`]), values as the JSON writes them (null is empty).

use super::columns::{self, Cell};
use crate::error::{Error, Result};
use crate::metrics::PolicyResult;
use crate::recorded::RecordedRow;
use std::io::Write;

/// Writes `results` as CSV (RFC 4180 quoting where needed).
pub fn write_results(results: &[PolicyResult], out: &mut impl Write) -> Result<()> {
    write_with_recorded(results, None, out)
}

/// Like [`write_results`], with the recorded run as a last row when the trace carries its
/// figures (the JSON's `null`s empty).
pub fn write_with_recorded(
    results: &[PolicyResult],
    recorded: Option<&RecordedRow>,
    out: &mut impl Write,
) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("CSV", e);
    let header: Vec<&str> = columns::RESULT.iter().map(|c| c.key).collect();
    writeln!(out, "{}", header.join(",")).map_err(io)?;
    let mut rows = columns::cells(results, &columns::RESULT);
    rows.extend(recorded.map(|r| columns::recorded_cells(r, results, &columns::RESULT)));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| quote(&Cell::raw(c))).collect();
        writeln!(out, "{}", cells.join(",")).map_err(io)?;
    }
    Ok(())
}

/// One CSV field: quoted (quotes doubled) where it holds a comma, a quote or a line break.
pub fn field(s: &str) -> String {
    quote(s)
}

fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_equals_the_json_keys() {
        let mut out = Vec::new();
        write_results(&[], &mut out).unwrap();
        let json = serde_json::to_value(PolicyResult::default()).unwrap();
        let mut keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        let text = String::from_utf8(out).unwrap();
        let mut header: Vec<&str> = text.trim_end().split(',').collect();
        keys.sort_unstable();
        header.sort_unstable();
        assert_eq!(header, keys);
    }

    #[test]
    fn quotes_configs_with_commas_and_writes_null_as_empty() {
        let r = PolicyResult {
            policy: "pytorch".into(),
            config: "a:1,b:\"2\"".into(),
            peak_reserved_bytes: 2097152,
            ..Default::default()
        };
        let mut out = Vec::new();
        write_results(&[r], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let row = text.lines().nth(1).unwrap();
        assert!(row.starts_with("pytorch,\"a:1,b:\"\"2\"\"\",2097152,0,0,0,0.0,"), "{row}");
        assert!(row.ends_with(",false,,false,0,0.0,0,0,0.0"), "{row}");
    }
}
