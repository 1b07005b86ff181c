//! `sweep` and `merge`: rank configs by an objective over several traces, worst case first.
//!
//! The command replays every (trace, spec) and hands the results here as [`SweepRow`]s; this
//! module ranks them and names the winner. A config's score is its objective's **worst** value
//! across the traces (lower is better: every result key measures a cost). Configs that ran out of
//! memory on any trace rank after every config that did not, and are marked `oom_free: false`.
//! Ties keep the order the specs were given in, so a grid that lists simpler settings first
//! recommends the simplest of equally good ones, and a merged sweep ranks exactly as the
//! unsharded one.
//!
//! `--shard I/N` splits the specs into N contiguous parts (1-based I); `merge` puts the parts
//! back in order and ranks again, giving the unsharded report.

use super::grid::export_line;
use super::row::{as_number, Row};
use crate::error::{Error, Result};
use crate::policy::pytorch::config::Config;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The default objective.
pub const DEFAULT_OBJECTIVE: &str = "peak_reserved_bytes";

/// One (trace, spec) result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// The spec as expanded, e.g. `pytorch:max_split_size_mb:128`: what identifies a config
    /// across traces (the effective `config` of `pytorch` with recorded settings differs per trace).
    pub spec: String,
    /// The trace and the replay's result keys.
    #[serde(flatten)]
    pub row: Row,
}

/// One config's place in the ranking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ranked {
    /// The policy name.
    pub policy: String,
    /// The spec's options as written (empty for a bare name).
    pub config: String,
    /// The whole spec.
    pub spec: String,
    /// The objective's worst value across the traces.
    pub worst: Value,
    /// False when the config ran out of memory on some trace.
    pub oom_free: bool,
}

/// How much the best config saves against the reference (the trace's recorded settings).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Saving {
    /// The reference spec, e.g. `pytorch` (recorded settings).
    pub reference: String,
    /// The reference's worst objective value.
    pub reference_worst: Value,
    /// Reference minus best, in the objective's unit.
    pub amount: f64,
    /// `amount` as a fraction of the reference (0.25 = 25% less).
    pub fraction: f64,
}

/// The winner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// The policy name.
    pub policy: String,
    /// The spec's options as written.
    pub config: String,
    /// The whole spec.
    pub spec: String,
    /// The objective's key and its worst value, e.g. `"peak_reserved_bytes": 123`.
    #[serde(flatten)]
    pub objective: Map<String, Value>,
    /// `export PYTORCH_CUDA_ALLOC_CONF=...` for a PyTorch config; `null` otherwise.
    pub env: Option<String>,
    /// Against the reference, when it was swept and is not itself the best.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saving: Option<Saving>,
}

/// Which part of the specs a sharded sweep runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 1-based part number.
    pub index: usize,
    /// Number of parts.
    pub count: usize,
}

impl Shard {
    /// Parses `I/N` with 1 ≤ I ≤ N.
    pub fn parse(text: &str) -> Result<Shard> {
        let bad = || {
            Error::usage(format!("invalid shard '{text}': expected I/N with 1 <= I <= N, e.g. 2/4"))
        };
        let (i, n) = text.trim().split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// The contiguous range of `total` specs this part runs (computed wide, so no index or count
    /// read from a file can overflow it).
    pub fn range(&self, total: usize) -> std::ops::Range<usize> {
        let at = |i: usize| {
            let count = self.count.max(1) as u128;
            ((total as u128 * i.min(self.count) as u128) / count) as usize
        };
        at(self.index.saturating_sub(1))..at(self.index)
    }
}

/// What `sweep --json` (and `merge`) prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// The traces, as given.
    pub traces: Vec<String>,
    /// The result key ranked by.
    pub objective: String,
    /// Every (trace, spec) result, specs in the order given.
    pub results: Vec<SweepRow>,
    /// Best first.
    pub ranking: Vec<Ranked>,
    /// The first of the ranking; `null` when nothing was swept.
    pub best: Option<Best>,
    /// The reference spec savings are measured against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Identifies the grid swept (see `grid_id`): parts of different grids never merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<String>,
    /// Set on a part of a sharded sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// In a file `sweep --out` writes: every spec of the grid (all shards), in order; with
    /// [`SweepReport::grid_settings`] what [`SweepReport::grid`] hashes, so `merge` can check
    /// each part holds exactly its shard of the grid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid_specs: Option<Vec<String>>,
    /// In a file `sweep --out` writes: the settings the grid hash covers beside the specs
    /// (`capacity=...`, `device=N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid_settings: Option<Vec<String>>,
    /// True when the memory swept is host memory (device -1, a CPU profiler trace): no CUDA
    /// allocator setting applies to it, so [`Best::env`] is `null` (`SweepReport::on_host`).
    #[serde(default)]
    pub host_memory: bool,
    /// How the capacity was chosen: `recorded` (each trace under the limit its recording
    /// implies, where it shows one: the default), `none` (unlimited), or the size or card
    /// given. Each result's `capacity_bytes` is the capacity it ran under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
}

impl SweepReport {
    /// This report for host memory: `host_memory` set and no `PYTORCH_CUDA_ALLOC_CONF` line,
    /// since the CUDA allocator's settings do not apply to the memory replayed.
    pub fn on_host(mut self) -> SweepReport {
        self.host_memory = true;
        if let Some(best) = &mut self.best {
            best.env = None;
        }
        self
    }
}

/// A short, stable name for a sweep's grid: 16 hex digits of the FNV-1a hash of `parts` (the
/// whole expanded spec list and every setting that changes results, e.g. the capacity). The same
/// on every machine and build, so parts run by different jobs of a scheduler compare equal.
pub fn grid_id<S: AsRef<str>>(parts: &[S]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.as_ref().bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Ranks the configs of `rows` by `objective` (see the module docs). Every spec must have a row
/// on every trace of `traces`; an objective that is not a numeric result key is an error listing
/// the numeric keys.
pub(crate) fn rank(traces: &[String], rows: &[SweepRow], objective: &str) -> Result<Vec<Ranked>> {
    let mut specs: Vec<&str> = Vec::new();
    for r in rows {
        if !specs.contains(&r.spec.as_str()) {
            specs.push(&r.spec);
        }
    }
    let mut ranked = Vec::with_capacity(specs.len());
    for spec in specs {
        let mine: Vec<&SweepRow> = rows.iter().filter(|r| r.spec == spec).collect();
        if let Some(t) = traces.iter().find(|t| !mine.iter().any(|r| &r.row.trace == *t)) {
            return Err(Error::usage(format!("spec '{spec}' has no result on trace '{t}'")));
        }
        let mut worst: Option<(f64, Value)> = None;
        for r in &mine {
            let x = r.row.number(objective)?;
            if worst.as_ref().is_none_or(|w| x > w.0) {
                let v = r.row.result.get(objective).cloned().unwrap_or(Value::Null);
                worst = Some((x, v));
            }
        }
        let (score, worst) = worst.unwrap_or((f64::INFINITY, Value::Null));
        let (policy, config) = spec.split_once(':').unwrap_or((spec, ""));
        let oom_free = !mine.iter().any(|r| r.row.oom());
        ranked.push((
            score,
            Ranked {
                policy: policy.into(),
                config: config.into(),
                spec: spec.into(),
                worst,
                oom_free,
            },
        ));
    }
    ranked.sort_by(|a, b| (!a.1.oom_free).cmp(&!b.1.oom_free).then(a.0.total_cmp(&b.0)));
    Ok(ranked.into_iter().map(|r| r.1).collect())
}

/// The `export PYTORCH_CUDA_ALLOC_CONF=...` line for `spec` when it is a PyTorch config and its
/// effective configuration is the same on every trace.
fn env_for(spec: &str, rows: &[SweepRow]) -> Option<String> {
    let policy = spec.split(':').next().unwrap_or(spec);
    if !crate::policy::lookup(policy).is_ok_and(|p| p.has_allocator_settings()) {
        return None;
    }
    let mut configs = rows.iter().filter(|r| r.spec == spec).map(|r| r.row.config());
    let first = configs.next()?;
    if configs.any(|c| c != first) {
        return None;
    }
    Config::parse_shown(first).ok().map(|c| export_line(&c))
}

/// Builds the report: ranks `results` by `objective` and names the best config, with its saving
/// against `reference` (e.g. `pytorch`, the recorded settings) when that spec was swept.
pub fn report(
    traces: Vec<String>,
    objective: &str,
    results: Vec<SweepRow>,
    reference: Option<&str>,
) -> Result<SweepReport> {
    let ranking = rank(&traces, &results, objective)?;
    let best = ranking.first().map(|b| {
        let mut objective_map = Map::new();
        objective_map.insert(objective.to_string(), b.worst.clone());
        let saving = reference.filter(|r| *r != b.spec).and_then(|r| {
            let reference = ranking.iter().find(|x| x.spec == r)?;
            let (rw, bw) = (as_number(&reference.worst)?, as_number(&b.worst)?);
            Some(Saving {
                reference: r.to_string(),
                reference_worst: reference.worst.clone(),
                amount: rw - bw,
                fraction: if rw > 0.0 { (rw - bw) / rw } else { 0.0 },
            })
        });
        Best {
            policy: b.policy.clone(),
            config: b.config.clone(),
            spec: b.spec.clone(),
            objective: objective_map,
            env: env_for(&b.spec, &results),
            saving,
        }
    });
    Ok(SweepReport {
        traces,
        objective: objective.to_string(),
        results,
        ranking,
        best,
        reference: reference.map(str::to_string),
        grid: None,
        shard: None,
        grid_specs: None,
        grid_settings: None,
        host_memory: false,
        capacity: None,
    })
}

/// One file given to `merge`: where it came from (for errors) and what it holds.
#[derive(Clone, Debug)]
pub struct Part {
    /// The file, as given.
    pub file: std::path::PathBuf,
    /// Its sweep, read by `super::input::read_part`.
    pub report: SweepReport,
}

/// Combines the parts of a sharded sweep into the unsharded report: every part of the same
/// sweep (same traces, objective, reference, grid and part count) exactly once, in any order.
/// Errors name the file and the field that differs. Nothing is sized by a count a part claims:
/// the count must equal the number of parts given.
pub fn merge(mut parts: Vec<Part>) -> Result<SweepReport> {
    let first = parts.first().ok_or_else(|| Error::usage("merge needs at least one part"))?;
    let first_file = first.file.display().to_string();
    let f = &first.report;
    let count = f.shard.map_or(1, |s| s.count);
    let (traces, objective, reference, grid) =
        (f.traces.clone(), f.objective.clone(), f.reference.clone(), f.grid.clone());
    let differs = |p: &Part, field: &str, this: String, that: String, why: &str| {
        Error::input(format!("{field}: {this} differs from {that} in {first_file}: {why}"))
            .in_file(&p.file)
    };
    let show = |v: &Option<String>| v.as_deref().map_or("none".to_string(), |s| format!("'{s}'"));
    for p in &parts[1..] {
        let r = &p.report;
        if r.traces != traces {
            return Err(differs(
                p,
                "traces",
                format!("[{}]", r.traces.join(", ")),
                format!("[{}]", traces.join(", ")),
                "the parts come from sweeps of different traces",
            ));
        }
        if r.objective != objective {
            return Err(differs(
                p,
                "objective",
                format!("'{}'", r.objective),
                format!("'{objective}'"),
                "the parts come from sweeps of different objectives",
            ));
        }
        if r.reference != reference {
            return Err(differs(
                p,
                "reference",
                show(&r.reference),
                show(&reference),
                "the parts come from different sweeps",
            ));
        }
        if r.grid != grid {
            return Err(differs(
                p,
                "grid",
                show(&r.grid),
                show(&grid),
                "the parts come from different sweeps (another grid, --capacity or --device)",
            ));
        }
        if r.capacity != f.capacity {
            return Err(differs(
                p,
                "capacity",
                show(&r.capacity),
                show(&f.capacity),
                "the parts come from sweeps under different capacities (or one was edited)",
            ));
        }
        let c = r.shard.map_or(1, |s| s.count);
        if c != count {
            return Err(differs(
                p,
                "shard.count",
                c.to_string(),
                count.to_string(),
                "the parts disagree on the number of shards",
            ));
        }
    }
    parts.sort_by_key(|p| p.report.shard.map_or(1, |s| s.index));
    if let Some(w) = parts.windows(2).find(|w| {
        w[0].report.shard.map_or(1, |s| s.index) == w[1].report.shard.map_or(1, |s| s.index)
    }) {
        let i = w[0].report.shard.map_or(1, |s| s.index);
        return Err(Error::input(format!(
            "shard.index: part {i}/{count} again, already read from {} (merge needs every shard exactly once)",
            w[0].file.display()
        ))
        .in_file(&w[1].file));
    }
    if parts.len() != count {
        // Name at most a few missing shards, walking the gaps between the ones given.
        let mut missing = Vec::new();
        let mut next = 1usize;
        for i in parts
            .iter()
            .map(|p| p.report.shard.map_or(1, |s| s.index))
            .chain([count.saturating_add(1)])
        {
            while next < i && missing.len() < 5 {
                missing.push(format!("{next}/{count}"));
                next += 1;
            }
            next = i.saturating_add(1);
        }
        let left = count - parts.len();
        if left > missing.len() {
            missing.push(format!("and {} more", left - missing.len()));
        }
        return Err(Error::usage(format!(
            "merge needs every shard exactly once: got {} of {count}; missing {}",
            parts.len(),
            missing.join(", ")
        )));
    }
    let host = parts.iter().any(|p| p.report.host_memory);
    // The parts share one grid id, which covers the capacity setting, and one capacity text.
    let capacity = parts.iter().find_map(|p| p.report.capacity.clone());
    let results = parts.into_iter().flat_map(|p| p.report.results).collect();
    let mut merged = report(traces, &objective, results, reference.as_deref())?;
    merged.grid = grid;
    merged.capacity = capacity;
    Ok(if host { merged.on_host() } else { merged })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::PolicyResult;

    fn row(spec: &str, trace: &str, config: &str, peak: u64, oom: bool) -> SweepRow {
        let policy = spec.split(':').next().unwrap();
        let r = PolicyResult {
            policy: policy.into(),
            config: config.into(),
            peak_reserved_bytes: peak,
            device_malloc_count: peak / 100,
            oom,
            ..PolicyResult::default()
        };
        SweepRow { spec: spec.into(), row: Row::new(trace, &r) }
    }

    fn traces() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    fn rows() -> Vec<SweepRow> {
        let e = "expandable_segments:True";
        vec![
            row("pytorch", "a", "expandable_segments:False,max_split_size_mb:64", 1000, false),
            row("pytorch", "b", "expandable_segments:False,max_split_size_mb:64", 3000, false),
            row("pytorch:expandable_segments:True", "a", e, 2500, false),
            row("pytorch:expandable_segments:True", "b", e, 2500, false),
            row("bfc", "a", "", 100, false),
            row("bfc", "b", "", 200, true),
            row(
                "pytorch:max_split_size_mb:128",
                "a",
                "expandable_segments:False,max_split_size_mb:128",
                2500,
                false,
            ),
            row(
                "pytorch:max_split_size_mb:128",
                "b",
                "expandable_segments:False,max_split_size_mb:128",
                2400,
                false,
            ),
        ]
    }

    #[test]
    fn ranks_by_worst_case_oom_last_ties_in_given_order() {
        let ranked = rank(&traces(), &rows(), DEFAULT_OBJECTIVE).unwrap();
        let specs: Vec<&str> = ranked.iter().map(|r| r.spec.as_str()).collect();
        assert_eq!(
            specs,
            vec![
                "pytorch:expandable_segments:True",
                "pytorch:max_split_size_mb:128",
                "pytorch",
                "bfc"
            ]
        );
        assert_eq!(ranked[0].worst, Value::from(2500));
        assert_eq!(
            (ranked[0].policy.as_str(), ranked[0].config.as_str()),
            ("pytorch", "expandable_segments:True")
        );
        assert!(!ranked[3].oom_free && ranked[2].oom_free);
    }

    #[test]
    fn any_numeric_key_is_an_objective() {
        let ranked = rank(&traces(), &rows(), "device_malloc_count").unwrap();
        assert_eq!(ranked[0].worst, Value::from(25));
        let e = rank(&traces(), &rows(), "peak").unwrap_err().to_string();
        assert!(
            e.contains("unknown result key 'peak'") && e.contains("peak_reserved_bytes"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_result_is_an_error() {
        let mut r = rows();
        r.remove(1);
        let e = rank(&traces(), &r, DEFAULT_OBJECTIVE).unwrap_err().to_string();
        assert_eq!(e, "spec 'pytorch' has no result on trace 'b'");
    }

    #[test]
    fn the_best_names_its_env_line_and_saving() {
        let rep = report(traces(), DEFAULT_OBJECTIVE, rows(), Some("pytorch")).unwrap();
        let best = rep.best.as_ref().unwrap();
        assert_eq!(
            best.env.as_deref(),
            Some("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        );
        let s = best.saving.as_ref().unwrap();
        assert_eq!((s.amount, s.reference_worst.clone()), (500.0, Value::from(3000)));
        assert!((s.fraction - 500.0 / 3000.0).abs() < 1e-12);
        let json = serde_json::to_value(&rep).unwrap();
        assert_eq!(json["best"]["peak_reserved_bytes"], 2500);
        assert_eq!(json["ranking"][0]["worst"], 2500);
        assert_eq!(json["ranking"][3]["oom_free"], false);
        assert_eq!(json["results"][0]["trace"], "a");
        assert_eq!(json["results"][0]["spec"], "pytorch");
        assert_eq!(json["results"][0]["peak_reserved_bytes"], 1000);
        assert!(json.get("shard").is_none());
        let back: SweepReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, rep);
    }

    #[test]
    fn recorded_settings_that_differ_per_trace_get_no_env_line() {
        let mut r = rows();
        r.retain(|x| x.spec == "pytorch");
        let same = report(traces(), DEFAULT_OBJECTIVE, r.clone(), None).unwrap();
        let env = same.best.unwrap().env;
        assert_eq!(env.as_deref(), Some("export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64"));
        r[1].row.result.insert("config".into(), Value::from("expandable_segments:True"));
        let rep = report(traces(), DEFAULT_OBJECTIVE, r, Some("pytorch")).unwrap();
        let best = rep.best.unwrap();
        assert_eq!(best.env, None);
        assert_eq!(best.saving, None, "the reference is the best");
        let bfc =
            report(vec!["a".into()], DEFAULT_OBJECTIVE, vec![row("bfc", "a", "", 1, false)], None);
        assert_eq!(bfc.unwrap().best.unwrap().env, None);
    }

    #[test]
    fn a_part_read_back_keeps_every_bit_of_its_floats() {
        // `merge` reads parts back from their JSON text: a float that comes back one ulp off
        // prints differently (0.1879107934145113 for 0.18791079341451133, found by
        // scripts/slurm-check.sh), and the merged sweep would differ from the unsharded one.
        let mut part = report(traces(), DEFAULT_OBJECTIVE, rows(), Some("pytorch")).unwrap();
        let fragmentation = 0.18791079341451133_f64;
        part.results[0].row.result.insert("fragmentation_at_peak".into(), fragmentation.into());
        let text = serde_json::to_string(&part).unwrap();
        let back: SweepReport = serde_json::from_str(&text).unwrap();
        let read = back.results[0].row.result["fragmentation_at_peak"].as_f64().unwrap();
        assert_eq!(read.to_bits(), fragmentation.to_bits(), "{read} != {fragmentation}");
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
    }

    #[test]
    fn shards_cover_the_specs_and_merge_back_to_the_unsharded_report() {
        let whole = report(traces(), DEFAULT_OBJECTIVE, rows(), Some("pytorch")).unwrap();
        let specs =
            ["pytorch", "pytorch:expandable_segments:True", "bfc", "pytorch:max_split_size_mb:128"];
        let mut parts = Vec::new();
        for i in [3, 1, 2] {
            let shard = Shard::parse(&format!("{i}/3")).unwrap();
            let mine = &specs[shard.range(specs.len())];
            let rows: Vec<SweepRow> =
                rows().into_iter().filter(|r| mine.contains(&r.spec.as_str())).collect();
            let mut part = report(traces(), DEFAULT_OBJECTIVE, rows, Some("pytorch")).unwrap();
            part.shard = Some(shard);
            parts.push(part);
        }
        let parts: Vec<Part> = parts
            .into_iter()
            .enumerate()
            .map(|(i, report)| Part { file: format!("p{i}.json").into(), report })
            .collect();
        assert_eq!(merge(parts.clone()).unwrap(), whole);
        let mut other = parts.clone();
        other[1].report.grid = Some(grid_id(&["another grid"]));
        let e = merge(other).unwrap_err().to_string();
        assert!(
            e.starts_with("p1.json: grid: ") && e.contains("differs from none in p0.json"),
            "{e}"
        );
        assert!(e.contains("different sweeps"), "{e}");
        let mut other = parts.clone();
        other[1].report.traces = vec!["c".into()];
        let e = merge(other).unwrap_err().to_string();
        assert!(e.starts_with("p1.json: traces: [c] differs from [a, b] in p0.json"), "{e}");
        assert!(e.contains("different traces"), "{e}");
        let mut other = parts.clone();
        other[2].report.shard = Some(Shard { index: 2, count: 4 });
        let e = merge(other).unwrap_err().to_string();
        assert!(e.starts_with("p2.json: shard.count: 4 differs from 3 in p0.json"), "{e}");
        let mut other = parts.clone();
        other[2].report.capacity = Some("40GiB".into());
        let e = merge(other).unwrap_err().to_string();
        assert!(e.starts_with("p2.json: capacity: '40GiB' differs from none in p0.json"), "{e}");
        assert_eq!(grid_id(&["a", "b"]), grid_id(&["a".to_string(), "b".to_string()]));
        assert_ne!(grid_id(&["ab"]), grid_id(&["a", "b"]));
        let e = merge(parts[..2].to_vec()).unwrap_err().to_string();
        assert!(e.contains("missing 2/3"), "{e}");
        let mut huge = parts[..2].to_vec();
        for p in &mut huge {
            p.report.shard =
                Some(Shard { index: p.report.shard.unwrap().index, count: usize::MAX });
        }
        let e = merge(huge).unwrap_err().to_string();
        assert!(e.contains("missing 2/") && e.contains("more"), "{e}");
        let mut twice = parts.clone();
        twice[0].report.shard = twice[1].report.shard;
        let e = merge(twice).unwrap_err().to_string();
        assert!(e.contains("shard.index: part") && e.contains("again"), "{e}");
        assert!(
            Shard::parse("0/3").is_err()
                && Shard::parse("4/3").is_err()
                && Shard::parse("x").is_err()
        );
        assert_eq!(Shard { index: 4, count: 4 }.range(10), 7..10);
        assert_eq!(Shard { index: usize::MAX, count: usize::MAX }.range(10), 9..10);
    }
}
