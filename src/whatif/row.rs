//! One result row: a trace and one policy's `replay --json` result keys.
//!
//! `sweep` and `check` read results by key name (`--objective device_malloc_count`, a baseline's
//! `peak_reserved_bytes`), so a row keeps the result as a JSON object: any numeric key a replay
//! reports works as an objective or a checked metric, including keys added after this module.

use crate::error::{Error, Result};
use crate::metrics::PolicyResult;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A trace and one policy's result on it, flattened as `{"trace": ..., replay's result keys}`
/// (the shape of `sweep --json`'s `results`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The trace path as given on the command line.
    pub trace: String,
    /// The `replay --json` result keys (`policy`, `config`, `peak_reserved_bytes`, ...).
    #[serde(flatten)]
    pub result: Map<String, Value>,
}

/// Result keys that time fragsim itself: no objective, no baseline metric.
const TIMINGS: [&str; 1] = ["replay_seconds"];

impl Row {
    /// The row of `result` replayed on `trace`.
    pub fn new(trace: impl Into<String>, result: &PolicyResult) -> Row {
        let result = match serde_json::to_value(result) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(), // a struct of plain fields always serialises to an object
        };
        Row { trace: trace.into(), result }
    }

    /// A row from a JSON result object (a `replay --json` `results` entry).
    pub(crate) fn from_json(trace: impl Into<String>, result: Map<String, Value>) -> Row {
        Row { trace: trace.into(), result }
    }

    /// The `policy` key (empty when absent).
    pub(crate) fn policy(&self) -> &str {
        self.result.get("policy").and_then(Value::as_str).unwrap_or("")
    }

    /// The `config` key (empty when absent).
    pub(crate) fn config(&self) -> &str {
        self.result.get("config").and_then(Value::as_str).unwrap_or("")
    }

    /// Whether the replay ran out of memory (`oom`).
    pub(crate) fn oom(&self) -> bool {
        self.result.get("oom").and_then(Value::as_bool).unwrap_or(false)
    }

    /// The numeric value of `key` (booleans count as 0 and 1), or an error naming the numeric
    /// keys this row has.
    pub fn number(&self, key: &str) -> Result<f64> {
        if TIMINGS.contains(&key) {
            return Err(Error::usage(format!(
                "'{key}' is how long fragsim took, which changes from run to run, not a \
                 property of the config: rank by a memory key (numeric keys: {})",
                self.numeric_keys().join(", ")
            )));
        }
        match self.result.get(key) {
            Some(v) => as_number(v).ok_or_else(|| {
                Error::usage(format!(
                    "'{key}' is not a numeric result key (numeric keys: {})",
                    self.numeric_keys().join(", ")
                ))
            }),
            None => Err(Error::usage(format!(
                "unknown result key '{key}' (numeric keys: {})",
                self.numeric_keys().join(", ")
            ))),
        }
    }

    /// The keys whose values are numbers, in the result's order.
    pub(crate) fn numeric_keys(&self) -> Vec<&str> {
        (self.result.iter())
            .filter(|(k, v)| v.is_number() && !TIMINGS.contains(&k.as_str()))
            .map(|(k, _)| k.as_str())
            .collect()
    }
}

/// A JSON number or boolean as a number; anything else (null, text) is `None`.
pub fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reads_result_keys_by_name() {
        let r = PolicyResult {
            policy: "bfc".into(),
            peak_reserved_bytes: 4096,
            oom: true,
            ..PolicyResult::default()
        };
        let row = Row::new("t.txt", &r);
        assert_eq!(row.policy(), "bfc");
        assert!(row.oom());
        assert_eq!(row.number("peak_reserved_bytes").unwrap(), 4096.0);
        assert_eq!(row.number("oom").unwrap(), 1.0);
        let e = row.number("policy").unwrap_err().to_string();
        assert!(e.contains("not a numeric") && e.contains("device_malloc_count"), "{e}");
        assert!(row.number("peak").unwrap_err().to_string().contains("unknown result key 'peak'"));
        let e = row.number("replay_seconds").unwrap_err().to_string();
        assert!(e.contains("how long fragsim took") && !e.contains("replay_seconds,"), "{e}");
        assert!(!row.numeric_keys().contains(&"replay_seconds"));
    }

    #[test]
    fn rows_serialise_flat() {
        let row = Row::new("t.txt", &PolicyResult { policy: "bfc".into(), ..Default::default() });
        let v = serde_json::to_value(&row).unwrap();
        assert_eq!(v["trace"], "t.txt");
        assert_eq!(v["policy"], "bfc");
        let back: Row = serde_json::from_value(v).unwrap();
        assert_eq!(back, row);
    }
}
