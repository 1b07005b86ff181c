//! `check`: compares fresh results with a baseline, for CI.
//!
//! **Baseline file** (written by `check --update`, meant to be committed):
//!
//! ```text
//! { "format": "fragsim-baseline", "version": 1,
//!   "rows": [ { "trace": "traces/run.pickle", replay's result keys, without timings } ] }
//! ```
//!
//! One row per (trace, policy); rows are in the order the check ran them, and `replay_seconds`
//! and `planning_seconds` (timings, different on every run) are left out so a re-recorded baseline only differs where
//! memory did. A `replay --json` output (`{"trace": ..., "results": [...]}`) and a
//! `sweep --json` output (rows that carry their own `trace`) are read as baselines too.
//!
//! **Matching.** A result matches the baseline row with the same `policy`, `config` (the
//! effective configuration, so `pytorch` with recorded settings matches only the same settings)
//! and trace: the same path, or else the same file name when exactly one baseline trace has it
//! (a CI job's checkout path differs from a laptop's). A result without a baseline row is an
//! error (exit 2) naming every one missing; baseline rows nothing matched are ignored, so a job
//! may check a subset.
//!
//! **Metrics.** Every numeric or boolean key of the baseline row except the timings, the event
//! indices (`first_oom_event`, `peak_event`, `peak_allocated_event`: where something happened,
//! not an amount that can get better or worse) and `peak_at_start` (which moment the peak was),
//! unless the caller names the metrics. Higher
//! is worse for all of them (bytes, counts, fragmentation; `oom` true is worse than false). A
//! value above `baseline × (1 + tolerance)` is a regression, below `baseline × (1 − tolerance)` an
//! improvement; `change` is `now ÷ baseline − 1` (0.1 = 10% more), `null` when the baseline is 0
//! or for `oom`.

use super::row::{as_number, Row};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::Path;

/// The `format` value of a baseline file.
pub const BASELINE_FORMAT: &str = "fragsim-baseline";
/// The baseline file version this code writes and reads.
pub const BASELINE_VERSION: u32 = 1;
/// Keys never compared: the wall-clock [`TIMINGS`], the event indices, which moment the peak
/// was, and the capacity replayed under (a setting, checked for equality instead): none of them
/// is an amount that improves or regresses.
pub const NOT_COMPARED: &[&str] = &[
    "replay_seconds",
    "planning_seconds",
    "first_oom_event",
    "peak_event",
    "peak_allocated_event",
    "peak_at_start",
    "capacity_bytes",
];
/// The result keys that are timings, which differ from run to run: a baseline leaves them out.
pub const TIMINGS: &[&str] = NOT_COMPARED.split_at(2).0;

/// Results to compare against (see the module docs for the file format).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// Always [`BASELINE_FORMAT`].
    pub format: String,
    /// Always [`BASELINE_VERSION`].
    pub version: u32,
    /// One row per (trace, policy).
    pub rows: Vec<Row>,
}

impl Baseline {
    /// A baseline of `rows` (what `check --update` writes), without the [`TIMINGS`].
    pub fn new(rows: &[Row]) -> Baseline {
        let rows = rows
            .iter()
            .map(|r| {
                let mut r = r.clone();
                for key in TIMINGS {
                    r.result.remove(*key);
                }
                r
            })
            .collect();
        Baseline { format: BASELINE_FORMAT.into(), version: BASELINE_VERSION, rows }
    }

    /// Reads a baseline file, a `replay --json` output or a `sweep --json` output, every row
    /// checked as [`super::input`] checks results (typed keys, required keys, no repeated
    /// (trace, policy, config)); errors name `file` and the key path.
    pub fn parse(data: impl AsRef<[u8]>, file: &Path) -> Result<Baseline> {
        use super::input::{check_baseline_result, check_result, no_repeated_rows, parse_json};
        let bad = |path: &str, m: String| Error::input(format!("{path}: {m}")).in_file(file);
        let v = parse_json(data.as_ref(), file, "record a baseline with check --update")?;
        let obj = v.as_object().ok_or_else(|| {
            Error::input("expected a JSON object (a baseline written by check --update)")
                .in_file(file)
        })?;
        let mut rows = Vec::new();
        // A replay --json output has a "format" too (the trace's): its "results" tell it apart.
        let own = obj.get("format").and_then(Value::as_str) == Some(BASELINE_FORMAT);
        if let Some(format) = obj.get("format").filter(|_| own || !obj.contains_key("results")) {
            if format.as_str() != Some(BASELINE_FORMAT) {
                return Err(bad(
                    "format",
                    format!("expected \"{BASELINE_FORMAT}\", found {format}"),
                ));
            }
            if let Some(key) =
                obj.keys().find(|k| !["format", "version", "rows"].contains(&k.as_str()))
            {
                return Err(bad(key, "unknown key in a baseline".into()));
            }
            match obj.get("version") {
                None => return Err(bad("the top level", "no \"version\" (the integer 1)".into())),
                Some(v) if v.as_u64() == Some(u64::from(BASELINE_VERSION)) => {}
                Some(v) if v.as_u64().is_some() => {
                    return Err(bad(
                        "version",
                        format!("baseline version {v} is not supported (this fragsim reads version {BASELINE_VERSION}); re-record it with check --update"),
                    ))
                }
                Some(v) => {
                    return Err(bad(
                        "version",
                        format!("expected the integer {BASELINE_VERSION}, found {v}"),
                    ))
                }
            }
            let list = match obj.get("rows") {
                Some(Value::Array(a)) => a,
                Some(v) => return Err(bad("rows", format!("expected an array, found {v:.40}"))),
                None => return Err(bad("the top level", "no \"rows\" (an array)".into())),
            };
            rows.reserve(list.len());
            for (i, r) in list.iter().enumerate() {
                let path = format!("rows[{i}]");
                let mut map = r
                    .as_object()
                    .cloned()
                    .ok_or_else(|| bad(&path, "expected an object".into()))?;
                let trace = match map.remove("trace") {
                    Some(Value::String(t)) => t,
                    Some(v) => {
                        return Err(bad(
                            &format!("{path}.trace"),
                            format!("expected a path, found {v:.40}"),
                        ))
                    }
                    None => return Err(bad(&path, "no \"trace\" (a path)".into())),
                };
                check_result(&map, file, &path, true, &[])?;
                rows.push(Row::from_json(trace, map));
            }
            no_repeated_rows(&rows, file, "rows")?;
            return Ok(Baseline {
                format: BASELINE_FORMAT.into(),
                version: BASELINE_VERSION,
                rows,
            });
        }
        let results = match obj.get("results") {
            Some(Value::Array(a)) => a,
            _ => {
                return Err(Error::input(format!(
                    "expected a baseline ({{\"format\": \"{BASELINE_FORMAT}\", ...}}) or a replay --json output with \"results\""
                ))
                .in_file(file))
            }
        };
        let top_trace = obj.get("trace").and_then(Value::as_str);
        rows.reserve(results.len());
        for (i, r) in results.iter().enumerate() {
            let path = format!("results[{i}]");
            let mut map: Map<String, Value> =
                r.as_object().cloned().ok_or_else(|| bad(&path, "expected an object".into()))?;
            let trace = match map.remove("trace") {
                Some(Value::String(t)) => t,
                Some(v) => {
                    return Err(bad(
                        &format!("{path}.trace"),
                        format!("expected a path, found {v:.40}"),
                    ))
                }
                None => top_trace
                    .ok_or_else(|| Error::input(format!("{path} names no trace")).in_file(file))?
                    .to_string(),
            };
            check_baseline_result(&map, file, &path, &["spec"])?;
            rows.push(Row::from_json(trace, map));
        }
        no_repeated_rows(&rows, file, "results")?;
        Ok(Baseline { format: BASELINE_FORMAT.into(), version: BASELINE_VERSION, rows })
    }

    /// This baseline with `rows` (a new run) written over it, as `check --update` keeps a
    /// baseline: each new row replaces the row `Baseline::find` matches it with (in place),
    /// rows with no match are added at the end, and rows this run did not produce are kept, so
    /// updating one policy or one trace never drops the others. Timings are left out as in
    /// [`Baseline::new`].
    pub fn updated(&self, rows: &[Row]) -> (Baseline, Update) {
        let fresh = Baseline::new(rows);
        let mut out = self.rows.clone();
        let mut replaced = vec![false; out.len()];
        let mut added = 0;
        for row in fresh.rows {
            match self.position(&row) {
                Some(i) if !replaced[i] => {
                    out[i] = row;
                    replaced[i] = true;
                }
                _ => {
                    out.push(row);
                    added += 1;
                }
            }
        }
        let kept: Vec<String> = self
            .rows
            .iter()
            .zip(&replaced)
            .filter(|(_, r)| !**r)
            .map(|(b, _)| format!("{} on {}", b.policy(), b.trace))
            .collect();
        let update = Update { replaced: replaced.iter().filter(|r| **r).count(), added, kept };
        (Baseline { rows: out, ..Baseline::new(&[]) }, update)
    }

    /// The file's text: pretty JSON and a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The baseline row `now` compares with (see the module docs on matching).
    pub(crate) fn find(&self, now: &Row) -> Option<&Row> {
        self.position(now).map(|i| &self.rows[i])
    }

    /// Where in [`Baseline::rows`] the row [`Baseline::find`] matches `now` with is.
    fn position(&self, now: &Row) -> Option<usize> {
        let same = |b: &Row| b.policy() == now.policy() && b.config() == now.config();
        let rows = || self.rows.iter().enumerate().filter(|(_, b)| same(b));
        if let Some((i, _)) = rows().find(|(_, b)| b.trace == now.trace) {
            return Some(i);
        }
        let name = file_name(&now.trace);
        let traces: std::collections::BTreeSet<&str> = self
            .rows
            .iter()
            .filter(|b| file_name(&b.trace) == name)
            .map(|b| b.trace.as_str())
            .collect();
        let by_name = rows().find(|(_, b)| file_name(&b.trace) == name).map(|(i, _)| i);
        (traces.len() == 1).then_some(by_name).flatten()
    }
}

/// What [`Baseline::updated`] did, for the line `check --update` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// Rows of the old baseline this run replaced.
    pub(crate) replaced: usize,
    /// Rows this run added (no old row matched them).
    pub(crate) added: usize,
    /// The old rows this run did not produce, kept as they were: `POLICY on TRACE`.
    pub(crate) kept: Vec<String>,
}

impl Update {
    /// `2 replaced, 1 added, 1 kept (not run this time: bfc on a.pickle)`.
    pub fn describe(&self) -> String {
        let mut s =
            format!("{} replaced, {} added, {} kept", self.replaced, self.added, self.kept.len());
        if !self.kept.is_empty() {
            const SHOWN: usize = 3;
            let more = self.kept.len().saturating_sub(SHOWN);
            let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
            let shown: Vec<&str> = self.kept.iter().take(SHOWN).map(String::as_str).collect();
            s += &format!(" (not run this time: {}{tail})", shown.join(", "));
        }
        s
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// Parses `--tolerance`: a percentage, `1%` or `1` (both 1%), `0.5%`; returned as a fraction
/// (0.01), the unit `check --json` prints.
pub fn parse_tolerance(text: &str) -> Result<f64> {
    let t = text.trim();
    let number = t.strip_suffix('%').unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p / 100.0),
        _ => Err(Error::usage(format!(
            "invalid tolerance '{text}': expected a percentage such as 1% or 0.5%"
        ))),
    }
}

/// One metric that moved beyond the tolerance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// The trace, as the fresh run named it.
    pub trace: String,
    /// The policy name.
    pub policy: String,
    /// The policy's effective configuration.
    pub config: String,
    /// The JSON key, e.g. `peak_reserved_bytes`.
    pub metric: String,
    /// The baseline's value.
    pub baseline: Value,
    /// The fresh value.
    pub now: Value,
    /// `now ÷ baseline − 1`; `null` when the baseline is 0 or not a number.
    pub change: Option<f64>,
}

impl Change {
    /// One line for people, sizes with their unit and the change in percent:
    /// `trace  policy  metric  12.00 GiB -> 13.50 GiB (+12.50%)`; a fraction
    /// (`fragmentation_*`) reads as percentages with the change in points (`10.0% -> 12.5%
    /// (+2.5 points)`), a flag as `no -> yes`.
    pub fn line(&self) -> String {
        let policy = if self.config.is_empty() {
            self.policy.clone()
        } else {
            format!("{}:{}", self.policy, self.config)
        };
        let (old, new) = (as_number(&self.baseline), as_number(&self.now));
        let fraction = self.metric.starts_with("fragmentation");
        let change = match (self.change, old, new) {
            (_, Some(o), Some(n)) if fraction => {
                signed(&format!("{:+.1} points", (n - o) * 100.0), "0.0 points")
            }
            (Some(c), _, _) => signed(&format!("{:+.2}%", c * 100.0), "0.00%"),
            (None, _, _) if self.baseline.is_boolean() => "worse".to_string(),
            (None, _, _) => "new".to_string(),
        };
        let (b, n) = (self.value(&self.baseline), self.value(&self.now));
        // Two sizes that read the same in their unit are told apart by their bytes.
        let (b, n) = if b == n && self.metric.ends_with("_bytes") {
            (format!("{} B", self.baseline), format!("{} B", self.now))
        } else {
            (b, n)
        };
        format!("{}  {}  {}  {b} -> {n} ({change})", self.trace, policy, self.metric)
    }

    /// `value` of this metric as people read it: bytes with a unit, a fraction in percent, a
    /// flag as yes or no, a count as it is.
    fn value(&self, value: &Value) -> String {
        match value {
            Value::Bool(b) => if *b { "yes" } else { "no" }.to_string(),
            Value::Number(n) if self.metric.ends_with("_bytes") => {
                n.as_u64().map_or_else(|| n.to_string(), crate::units::format_bytes)
            }
            Value::Number(n) if self.metric.starts_with("fragmentation") => {
                n.as_f64().map_or_else(|| n.to_string(), |f| format!("{:.1}%", f * 100.0))
            }
            v => v.to_string(),
        }
    }
}

/// `text` (a signed number), or `zero` when it reads as zero: never `-0.00%`.
fn signed(text: &str, zero: &str) -> String {
    if text.trim_start_matches(['+', '-']) == zero {
        zero.to_string()
    } else {
        text.to_string()
    }
}

/// What `check --json` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckReport {
    /// The baseline file as given.
    pub baseline: String,
    /// The tolerance as a fraction.
    pub tolerance: f64,
    /// True when nothing regressed (the exit code is 0).
    pub ok: bool,
    /// Metrics worse beyond the tolerance.
    pub regressions: Vec<Change>,
    /// Metrics better beyond the tolerance (reported, never failing).
    pub improvements: Vec<Change>,
}

/// Compares `now` with `baseline` (see the module docs). `metrics` names the keys to compare
/// (`None`: every numeric key but [`NOT_COMPARED`]). A result without a baseline row is an
/// error naming `baseline_path` and every missing row.
pub fn check(
    baseline: &Baseline,
    baseline_path: &Path,
    now: &[Row],
    tolerance: f64,
    metrics: Option<&[String]>,
) -> Result<CheckReport> {
    // Each result with its baseline entry, matched once.
    let found: Vec<(&Row, Option<&Row>)> = now.iter().map(|r| (r, baseline.find(r))).collect();
    let missing: Vec<String> = found
        .iter()
        .filter(|(_, b)| b.is_none())
        .map(|(r, _)| format!("{} {}:{}", r.trace, r.policy(), r.config()))
        .collect();
    if !missing.is_empty() {
        return Err(Error::input(format!(
            "no baseline entry for {} (record them with check --update)",
            missing.join("; ")
        ))
        .in_file(baseline_path));
    }
    let pairs: Vec<(&Row, &Row)> = found.iter().filter_map(|&(r, b)| Some((r, b?))).collect();
    // Results under different device limits do not compare: a lower limit flushes the cache
    // and reads as an improvement, a higher one as a regression.
    let capacity = |r: &Row| r.result.get("capacity_bytes").and_then(Value::as_u64);
    let shown = |c: Option<u64>| c.map_or("unlimited".to_string(), crate::units::format_bytes);
    let differing: Vec<String> = pairs
        .iter()
        .filter(|&&(r, b)| capacity(b) != capacity(r))
        .map(|&(r, b)| {
            format!(
                "{} {}:{}: the baseline ran under {}, this run under {}",
                r.trace,
                r.policy(),
                r.config(),
                shown(capacity(b)),
                shown(capacity(r))
            )
        })
        .collect();
    if !differing.is_empty() {
        return Err(Error::input(format!(
            "results under another capacity than the baseline's do not compare: {}; give \
             --capacity as the baseline was recorded (none: unlimited), or record it again with \
             check --update",
            differing.join("; ")
        ))
        .in_file(baseline_path));
    }
    let mut regressions = Vec::new();
    let mut improvements = Vec::new();
    for (r, b) in pairs {
        for (key, bv) in &b.result {
            let wanted = match metrics {
                Some(m) => m.iter().any(|k| k == key),
                None => !NOT_COMPARED.contains(&key.as_str()),
            };
            let (Some(old), Some(nv)) = (as_number(bv), r.result.get(key)) else { continue };
            let Some(new) = as_number(nv) else { continue };
            if !wanted {
                continue;
            }
            let change = (old != 0.0 && !bv.is_boolean()).then(|| new / old - 1.0);
            let c = || Change {
                trace: r.trace.clone(),
                policy: r.policy().into(),
                config: r.config().into(),
                metric: key.clone(),
                baseline: bv.clone(),
                now: nv.clone(),
                change,
            };
            if new > old * (1.0 + tolerance) {
                regressions.push(c());
            } else if new < old * (1.0 - tolerance) {
                improvements.push(c());
            }
        }
    }
    Ok(CheckReport {
        baseline: baseline_path.display().to_string(),
        tolerance,
        ok: regressions.is_empty(),
        regressions,
        improvements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::PolicyResult;

    fn row(trace: &str, peak: u64, mallocs: u64) -> Row {
        Row::new(
            trace,
            &PolicyResult {
                policy: "pytorch".into(),
                config: "expandable_segments:False".into(),
                peak_reserved_bytes: peak,
                device_malloc_count: mallocs,
                replay_seconds: 0.25,
                planning_seconds: Some(0.5),
                ..PolicyResult::default()
            },
        )
    }

    #[test]
    fn an_update_replaces_in_place_adds_and_keeps() {
        let old = Baseline::new(&[row("a.pickle", 10, 1), row("b.pickle", 20, 2)]);
        let (new, update) = old.updated(&[row("b.pickle", 21, 2), row("c.pickle", 30, 3)]);
        let traces: Vec<&str> = new.rows.iter().map(|r| r.trace.as_str()).collect();
        assert_eq!(traces, ["a.pickle", "b.pickle", "c.pickle"]);
        assert_eq!(new.rows[1].result["peak_reserved_bytes"], 21);
        assert_eq!(new.rows[0], old.rows[0], "kept as it was");
        assert!(new.rows.iter().all(|r| !r.result.contains_key("replay_seconds")), "no timings");
        assert_eq!(update.replaced, 1);
        assert_eq!(update.added, 1);
        assert_eq!(update.kept, ["pytorch on a.pickle"]);
        assert_eq!(
            update.describe(),
            "1 replaced, 1 added, 1 kept (not run this time: pytorch on a.pickle)"
        );
    }

    fn path() -> &'static Path {
        Path::new("base.json")
    }

    #[test]
    fn own_baseline_passes_and_drops_the_timing() {
        let now = vec![row("a.pickle", 1000, 5), row("b.pickle", 2000, 7)];
        let base = Baseline::new(&now);
        assert!(base.rows[0].result.get("replay_seconds").is_none());
        assert!(base.rows[0].result.get("planning_seconds").is_none());
        let text = base.to_json();
        assert!(text.contains("\"format\": \"fragsim-baseline\""), "{text}");
        let back = Baseline::parse(&text, path()).unwrap();
        assert_eq!(back, base);
        let rep = check(&back, path(), &now, 0.0, None).unwrap();
        assert!(rep.ok && rep.regressions.is_empty() && rep.improvements.is_empty(), "{rep:?}");
    }

    #[test]
    fn a_better_baseline_is_a_regression_naming_the_key() {
        let base = Baseline::new(&[row("a.pickle", 900, 5)]);
        let rep = check(&base, path(), &[row("a.pickle", 1000, 5)], 0.01, None).unwrap();
        assert!(!rep.ok);
        assert_eq!(rep.regressions.len(), 1);
        let r = &rep.regressions[0];
        assert_eq!(
            (r.metric.as_str(), r.trace.as_str(), r.policy.as_str()),
            ("peak_reserved_bytes", "a.pickle", "pytorch")
        );
        assert_eq!((r.baseline.clone(), r.now.clone()), (Value::from(900), Value::from(1000)));
        assert!((r.change.unwrap() - 1.0 / 9.0).abs() < 1e-12);
        assert_eq!(r.line(), "a.pickle  pytorch:expandable_segments:False  peak_reserved_bytes  900 bytes -> 1000 bytes (+11.11%)");
        let json = serde_json::to_value(&rep).unwrap();
        assert_eq!(json["regressions"][0]["metric"], "peak_reserved_bytes");
        assert_eq!(json["ok"], false);
    }

    #[test]
    fn within_tolerance_passes_and_improvements_never_fail() {
        let base = Baseline::new(&[row("a.pickle", 1000, 10)]);
        let rep = check(&base, path(), &[row("a.pickle", 1009, 5)], 0.01, None).unwrap();
        assert!(rep.ok, "{rep:?}");
        assert_eq!(rep.improvements.len(), 1);
        assert_eq!(rep.improvements[0].metric, "device_malloc_count");
        let rep = check(&base, path(), &[row("a.pickle", 1011, 10)], 0.01, None).unwrap();
        assert!(!rep.ok);
    }

    #[test]
    fn oom_and_zero_baselines() {
        let mut b = row("a.pickle", 1000, 0);
        b.result.insert("map_count".into(), Value::from(0));
        let mut now = b.clone();
        now.result.insert("oom".into(), Value::Bool(true));
        now.result.insert("map_count".into(), Value::from(3));
        let rep = check(&Baseline::new(&[b]), path(), &[now], 0.01, None).unwrap();
        let metrics: Vec<&str> = rep.regressions.iter().map(|c| c.metric.as_str()).collect();
        assert_eq!(metrics, vec!["map_count", "oom"]);
        assert!(rep.regressions.iter().all(|c| c.change.is_none()));
        assert!(rep.regressions[0].line().ends_with("0 -> 3 (new)"));
        assert!(
            rep.regressions[1].line().ends_with("oom  no -> yes (worse)"),
            "{:?}",
            rep.regressions[1]
        );
    }

    #[test]
    fn lines_give_sizes_units_fractions_points_and_skip_event_indices() {
        let mut b = row("a.pickle", 12 << 30, 4);
        b.result.insert("fragmentation_at_peak".into(), Value::from(0.1));
        b.result.insert("peak_event".into(), Value::from(10));
        b.result.insert("reserved_at_end_bytes".into(), Value::from((12u64 << 30) + 1));
        let mut now = row("a.pickle", 27 << 29, 5);
        now.result.insert("fragmentation_at_peak".into(), Value::from(0.125));
        now.result.insert("peak_event".into(), Value::from(900));
        now.result.insert("reserved_at_end_bytes".into(), Value::from((12u64 << 30) + (2 << 20)));
        let rep = check(&Baseline::new(&[b]), path(), &[now], 0.0, None).unwrap();
        let lines: Vec<String> = rep.regressions.iter().map(Change::line).collect();
        assert_eq!(
            lines,
            [
                "a.pickle  pytorch:expandable_segments:False  device_malloc_count  4 -> 5 (+25.00%)",
                "a.pickle  pytorch:expandable_segments:False  fragmentation_at_peak  10.0% -> 12.5% (+2.5 points)",
                "a.pickle  pytorch:expandable_segments:False  peak_reserved_bytes  12.00 GiB -> 13.50 GiB (+12.50%)",
                "a.pickle  pytorch:expandable_segments:False  reserved_at_end_bytes  12884901889 B -> 12886999040 B (+0.02%)",
            ],
            "an event index moved from 10 to 900 and is no metric"
        );
    }

    #[test]
    fn named_metrics_only() {
        let base = Baseline::new(&[row("a.pickle", 900, 1)]);
        let only = vec!["device_malloc_count".to_string()];
        let rep = check(&base, path(), &[row("a.pickle", 1000, 9)], 0.0, Some(&only)).unwrap();
        assert_eq!(rep.regressions.len(), 1);
        assert_eq!(rep.regressions[0].metric, "device_malloc_count");
    }

    #[test]
    fn a_missing_entry_is_an_error_naming_the_file_and_row() {
        let base = Baseline::new(&[row("a.pickle", 900, 1)]);
        let e = check(&base, path(), &[row("c.pickle", 900, 1)], 0.0, None).unwrap_err();
        assert_eq!(e.kind().exit_code(), 2);
        let m = e.to_string();
        assert!(m.starts_with("base.json: no baseline entry for c.pickle pytorch:"), "{m}");
        assert!(m.contains("--update"), "{m}");
    }

    #[test]
    fn traces_match_by_file_name_when_unambiguous() {
        let base = Baseline::new(&[row("traces/a.pickle", 900, 1)]);
        let rep = check(&base, path(), &[row("/ci/work/traces/a.pickle", 900, 1)], 0.0, None);
        assert!(rep.unwrap().ok);
        let two = Baseline::new(&[row("x/a.pickle", 900, 1), row("y/a.pickle", 900, 1)]);
        assert!(check(&two, path(), &[row("z/a.pickle", 900, 1)], 0.0, None).is_err());
    }

    #[test]
    fn reads_replay_json_as_a_baseline() {
        let mut result = serde_json::to_value(PolicyResult {
            policy: "pytorch".into(),
            config: "expandable_segments:False".into(),
            peak_reserved_bytes: 900,
            ..PolicyResult::default()
        })
        .unwrap();
        let text = serde_json::json!({ "trace": "t.pickle", "format": "pytorch-snapshot",
            "device": 0, "events": 3, "results": [result.clone()] })
        .to_string();
        let base = Baseline::parse(&text, path()).unwrap();
        assert_eq!(base.rows[0].trace, "t.pickle");
        let rep = check(&base, path(), &[row("t.pickle", 1000, 0)], 0.0, None).unwrap();
        assert_eq!(rep.regressions.len(), 1, "{rep:?}");
        // A row that holds no metric is no baseline: it would pass every check.
        result.as_object_mut().unwrap().retain(|k, _| k == "policy" || k == "config");
        let text = serde_json::json!({ "trace": "t.pickle", "results": [result] }).to_string();
        let e = Baseline::parse(&text, path()).unwrap_err().to_string();
        assert!(
            e.starts_with("base.json: results[0]: the result has no \"peak_reserved_bytes\""),
            "{e}"
        );
    }

    #[test]
    fn baseline_values_are_typed_and_rows_unique() {
        let good = Baseline::new(&[row("a.pickle", 900, 1)]).to_json();
        let v: Value = serde_json::from_str(&good).unwrap();
        for (value, want) in [
            (serde_json::json!(-1), "found -1"),
            (serde_json::json!("900"), "found the string \"900\""),
            (serde_json::json!(null), "found null"),
            (serde_json::json!({}), "found an object"),
            (serde_json::json!(true), "found true"),
            (serde_json::json!(18446744073709551621.0), "found 1.8446744073709552e+19"),
        ] {
            let mut bad = v.clone();
            bad["rows"][0]["peak_reserved_bytes"] = value;
            let e = Baseline::parse(bad.to_string(), path()).unwrap_err().to_string();
            assert!(
                e.starts_with(
                    "base.json: rows[0].peak_reserved_bytes: expected a non-negative integer"
                ) && e.ends_with(want),
                "{e}"
            );
        }
        let mut twice = v.clone();
        let first = twice["rows"][0].clone();
        twice["rows"].as_array_mut().unwrap().push(first);
        let e = Baseline::parse(twice.to_string(), path()).unwrap_err().to_string();
        assert!(e.starts_with("base.json: rows[1]: repeats rows[0]"), "{e}");
        let mut text_version = v.clone();
        text_version["version"] = "1".into();
        let e = Baseline::parse(text_version.to_string(), path()).unwrap_err().to_string();
        assert_eq!(e, "base.json: version: expected the integer 1, found \"1\"");
    }

    #[test]
    fn malformed_baselines_name_the_file() {
        for (text, want) in [
            ("[1]", "expected a JSON object"),
            ("{", "not JSON: the text ends inside a value (truncated?) (line 1, column 1)"),
            ("", "the file is empty, not JSON"),
            ("{\"a\":1}x", "not JSON: more text follows the JSON value (line 1, column 8)"),
            ("{\"a\":\"\\ud800\"}", "not JSON: a string holds an invalid \\ escape"),
            ("{\"a\":1e999}", "not JSON: a number beyond what JSON numbers hold here"),
            ("{\"results\": [{\"policy\": \"bfc\"}]}", "results[0] names no trace"),
            ("{\"format\": \"fragsim-baseline\", \"version\": 9, \"rows\": []}", "version 9"),
            ("{\"x\": 1}", "expected a baseline"),
            (
                "{\"rows\": [],\n \"rows\": [1]}",
                "not JSON: an object names the key 'rows' twice (line 2, column 7)",
            ),
            ("[{\"a\": {\"b\": 1, \"b\": 1}}]", "names the key 'b' twice"),
        ] {
            let e = Baseline::parse(text, path()).unwrap_err().to_string();
            assert!(e.starts_with("base.json: ") && e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn tolerances_are_percentages() {
        assert_eq!(parse_tolerance("1%").unwrap(), 0.01);
        assert_eq!(parse_tolerance("1").unwrap(), 0.01);
        assert_eq!(parse_tolerance(" 0.5% ").unwrap(), 0.005);
        assert!(parse_tolerance("-1%").is_err());
        assert!(parse_tolerance("lots").unwrap_err().to_string().contains("'lots'"));
    }
}
