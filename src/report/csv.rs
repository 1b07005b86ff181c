//! CSV of replay results: one row per policy, the `replay --json` keys as header.

use crate::error::{Error, ErrorKind, Result};
use crate::replay::PolicyResult;
use std::io::Write;

/// The CSV header: exactly the JSON keys of a [`PolicyResult`], in their order.
pub const COLUMNS: [&str; 15] = [
    "policy",
    "config",
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "peak_requested_bytes",
    "reserved_at_end_bytes",
    "fragmentation_at_peak",
    "device_malloc_count",
    "device_free_count",
    "map_count",
    "unmap_count",
    "alloc_retries",
    "oom",
    "first_oom_event",
    "replay_seconds",
];

/// Writes `results` as CSV (RFC 4180 quoting where needed).
pub fn write_results(results: &[PolicyResult], out: &mut impl Write) -> Result<()> {
    let io = |e: std::io::Error| Error::new(ErrorKind::Io, format!("writing CSV: {e}"));
    writeln!(out, "{}", COLUMNS.join(",")).map_err(io)?;
    for r in results {
        let cells = [
            quote(&r.policy),
            quote(&r.config),
            r.peak_reserved_bytes.to_string(),
            r.peak_allocated_bytes.to_string(),
            r.peak_requested_bytes.to_string(),
            r.reserved_at_end_bytes.to_string(),
            r.fragmentation_at_peak.to_string(),
            r.device_malloc_count.to_string(),
            r.device_free_count.to_string(),
            r.map_count.to_string(),
            r.unmap_count.to_string(),
            r.alloc_retries.to_string(),
            r.oom.to_string(),
            r.first_oom_event.map(|e| e.to_string()).unwrap_or_default(),
            r.replay_seconds.to_string(),
        ];
        writeln!(out, "{}", cells.join(",")).map_err(io)?;
    }
    Ok(())
}

fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
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
        let json = serde_json::to_value(PolicyResult::default()).unwrap();
        let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        let mut sorted_cols = COLUMNS.to_vec();
        sorted_cols.sort_unstable();
        let mut sorted_keys = keys.clone();
        sorted_keys.sort_unstable();
        assert_eq!(sorted_cols, sorted_keys);
    }

    #[test]
    fn quotes_configs_with_commas() {
        let r = PolicyResult {
            policy: "pytorch".into(),
            config: "a:1,b:2".into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        write_results(&[r], &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("pytorch,\"a:1,b:2\","));
    }
}
