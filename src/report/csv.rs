//! CSV of replay results: one row per policy, the `replay --json` keys as header
//! ([`super::columns::RESULT`]: nested keys as `parent.key`), values as the JSON writes them
//! (null, and a key the result does not hold, are empty).

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
        let text = String::from_utf8(out).unwrap();
        let header: Vec<&str> = text.trim_end().split(',').collect();
        let columns: Vec<&str> = columns::RESULT.iter().map(|c| c.key).collect();
        assert_eq!(header, columns);
        // Every key a result always holds is a column of its own name.
        for key in json.as_object().unwrap().keys() {
            assert!(header.contains(&key.as_str()), "{key}");
        }
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
        // The keys a result holds only sometimes (start_state, start_assumed, gpu_memory_bytes,
        // capacity_bytes before replay_seconds; planning_seconds, first_oom, cuda after it) are
        // empty without them.
        let end = format!(",false,,false,0,0.0,0,0{}0.0{}", ",".repeat(11), ",".repeat(14));
        assert!(row.ends_with(&end), "{row}");
    }

    #[test]
    fn nested_keys_are_columns_of_their_own() {
        let r = PolicyResult {
            policy: "pytorch".into(),
            start_state: Some(crate::backend::StartFit {
                segments: 3,
                bytes: 6291456,
                limit_bytes: None,
                ..Default::default()
            }),
            gpu_memory_bytes: Some(17179869184),
            first_oom: Some(crate::metrics::OomDetail { size: 512, ..Default::default() }),
            ..Default::default()
        };
        let mut out = Vec::new();
        write_results(&[r], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let row: Vec<&str> = lines.next().unwrap().split(',').collect();
        let cell = |key: &str| row[header.iter().position(|h| *h == key).unwrap()];
        assert_eq!(cell("start_state.segments"), "3");
        assert_eq!(cell("start_state.bytes"), "6291456");
        assert_eq!(cell("start_state.limit_bytes"), "");
        assert_eq!(cell("gpu_memory_bytes"), "17179869184");
        assert_eq!(cell("first_oom.size"), "512");
        assert_eq!(cell("first_oom.free_bytes"), "");
        assert_eq!(cell("cuda.touched"), "");
    }
}
