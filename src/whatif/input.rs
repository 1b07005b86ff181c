//! Reading the what-if commands' own files as the untrusted input they are: `merge`'s sweep
//! parts and `check`'s baselines.
//!
//! These files are fragsim's own JSON, but a file can be edited, truncated, hand-written or made
//! by another build, and a number read from it must never size memory or rank a config. So each
//! is parsed into typed values with the rigour the trace readers apply: every result key has the
//! type `replay --json` writes (sizes and counts are non-negative integers that fit 64 bits,
//! fractions are finite and in range, flags are booleans), the keys a result always has are
//! present, no key is unknown, no (trace, policy, config) row is repeated, and every count is
//! checked against what is present before anything is built from it. Errors name the file, the
//! key path (`results[3].peak_reserved_bytes`) and what was expected.

use super::row::Row;
use super::sweep::{grid_id, Shard, SweepReport, SweepRow};
use crate::error::{quoted, Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// What a result key must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A non-negative integer of at most 64 bits (bytes, counts, event indices).
    Count,
    /// A non-negative integer or `null`.
    OptionalCount,
    /// A finite number from 0 to 1.
    Fraction,
    /// A finite number of seconds, at least 0.
    Seconds,
    /// `true` or `false`.
    Flag,
    /// A string.
    Text,
    /// The `first_oom` object.
    Oom,
    /// The `cuda` object.
    Cuda,
    /// The `start_state` object.
    StartState,
    /// The `start_assumed` object.
    StartAssumed,
}

/// Every key a `replay --json` result may hold, what it holds, and whether every result has it.
const KEYS: &[(&str, Kind, bool)] = &[
    ("policy", Kind::Text, true),
    ("config", Kind::Text, true),
    ("peak_reserved_bytes", Kind::Count, true),
    ("peak_allocated_bytes", Kind::Count, true),
    ("peak_requested_bytes", Kind::Count, true),
    ("reserved_at_end_bytes", Kind::Count, true),
    ("fragmentation_at_peak", Kind::Fraction, true),
    ("peak_event", Kind::Count, true),
    ("device_malloc_count", Kind::Count, true),
    ("device_free_count", Kind::Count, true),
    ("map_count", Kind::Count, true),
    ("unmap_count", Kind::Count, true),
    ("alloc_retries", Kind::Count, true),
    ("oom", Kind::Flag, true),
    ("first_oom_event", Kind::OptionalCount, false),
    ("replay_seconds", Kind::Seconds, true),
    ("planning_seconds", Kind::Seconds, false),
    ("first_oom", Kind::Oom, false),
    ("cuda", Kind::Cuda, false),
    ("peak_at_start", Kind::Flag, false),
    ("peak_allocated_event", Kind::Count, false),
    ("fragmentation_at_peak_allocated", Kind::Fraction, false),
    ("start_malloc_count", Kind::Count, false),
    ("start_map_count", Kind::Count, false),
    ("start_state", Kind::StartState, false),
    ("start_assumed", Kind::StartAssumed, false),
    ("gpu_memory_bytes", Kind::Count, false),
    ("capacity_bytes", Kind::Count, false),
];

impl Kind {
    fn expected(self) -> &'static str {
        match self {
            Kind::Count => "a non-negative integer below 2^64",
            Kind::OptionalCount => "a non-negative integer below 2^64, or null",
            Kind::Fraction => "a number from 0 to 1",
            Kind::Seconds => "a non-negative number of seconds",
            Kind::Flag => "true or false",
            Kind::Text => "a string",
            Kind::Oom => "the first_oom object replay --json writes",
            Kind::Cuda => "the cuda object replay --json writes",
            Kind::StartState => "the start_state object replay --json writes",
            Kind::StartAssumed => "the start_assumed object replay --json writes",
        }
    }

    fn accepts(self, v: &Value) -> bool {
        let finite = |v: &Value| v.as_f64().filter(|x| x.is_finite());
        match self {
            Kind::Count => v.as_u64().is_some(),
            Kind::OptionalCount => v.is_null() || v.as_u64().is_some(),
            Kind::Fraction => finite(v).is_some_and(|x| (0.0..=1.0).contains(&x)),
            Kind::Seconds => finite(v).is_some_and(|x| x >= 0.0),
            Kind::Flag => v.is_boolean(),
            Kind::Text => v.is_string(),
            Kind::Oom => serde_json::from_value::<crate::metrics::OomDetail>(v.clone()).is_ok(),
            Kind::Cuda => {
                serde_json::from_value::<crate::backend::cuda::CudaMeasures>(v.clone()).is_ok()
            }
            Kind::StartState => {
                serde_json::from_value::<crate::backend::StartFit>(v.clone()).is_ok()
            }
            Kind::StartAssumed => {
                serde_json::from_value::<crate::backend::AssumedStart>(v.clone()).is_ok()
            }
        }
    }
}

/// A JSON value as an error shows it: short, whatever its size.
fn shown(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(b) => return b.to_string(),
        Value::Number(n) => return n.to_string(),
        Value::String(s) if s.chars().count() <= 40 => return format!("the string {v}"),
        Value::String(_) => "a long string",
        Value::Array(a) => return format!("an array of {} items", a.len()),
        Value::Object(_) => "an object",
    };
    kind.to_string()
}

/// An input error for `file` at key path `path`.
fn bad(file: &Path, path: &str, what: String) -> Error {
    Error::input(format!("{path}: {what}")).in_file(file)
}

fn expected(file: &Path, path: &str, wanted: &str, found: &Value) -> Error {
    bad(file, path, format!("expected {wanted}, found {}", shown(found)))
}

/// Checks one result object at `path` in `file`: every key known and of its type, every key a
/// result always has present (the timings too unless `timings_optional`, as a baseline leaves them
/// out). `skip` lists keys the caller handles itself (`trace`, `spec`).
pub(crate) fn check_result(
    map: &Map<String, Value>,
    file: &Path,
    path: &str,
    timings_optional: bool,
    skip: &[&str],
) -> Result<()> {
    check_result_with(map, file, path, timings_optional, skip, false)
}

/// [`check_result`] for a result a baseline is read from (`replay --json`, `sweep --json`): a
/// metric may be `null`, a row with no value for it (the `recorded` row's
/// `fragmentation_at_peak`, or a profiler trace's `oom`), which `check` then skips.
pub(crate) fn check_baseline_result(
    map: &Map<String, Value>,
    file: &Path,
    path: &str,
    skip: &[&str],
) -> Result<()> {
    check_result_with(map, file, path, true, skip, true)
}

fn check_result_with(
    map: &Map<String, Value>,
    file: &Path,
    path: &str,
    timings_optional: bool,
    skip: &[&str],
    nulls: bool,
) -> Result<()> {
    for (key, v) in map {
        if skip.contains(&key.as_str()) {
            continue;
        }
        let Some(&(_, kind, _)) = KEYS.iter().find(|k| k.0 == key) else {
            let known: Vec<&str> = KEYS.iter().map(|k| k.0).collect();
            return Err(bad(
                file,
                &format!("{path}.{key}"),
                format!("unknown result key (a result holds {})", known.join(", ")),
            ));
        };
        // A metric a row has no value for (the recorded row of a profiler trace, which does not
        // say whether the run ran out of memory: `oom`).
        let metric = matches!(kind, Kind::Count | Kind::Fraction | Kind::Seconds | Kind::Flag);
        if !(kind.accepts(v) || (nulls && metric && v.is_null())) {
            return Err(expected(file, &format!("{path}.{key}"), kind.expected(), v));
        }
    }
    for &(key, kind, required) in KEYS {
        let timing = super::check::TIMINGS.contains(&key);
        if required && !(timing && timings_optional) && !map.contains_key(key) {
            return Err(bad(
                file,
                path,
                format!("the result has no \"{key}\" ({})", kind.expected()),
            ));
        }
    }
    Ok(())
}

/// The object at `path`, or an error.
fn object<'v>(v: &'v Value, file: &Path, path: &str) -> Result<&'v Map<String, Value>> {
    v.as_object().ok_or_else(|| expected(file, path, "an object", v))
}

/// The array at `obj[key]`, or an error naming `path.key`.
fn array<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<&'v [Value]> {
    let at = join(path, key);
    match obj.get(key) {
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(expected(file, &at, "an array", v)),
        None => Err(bad(file, path_or_top(path), format!("no \"{key}\" (an array)"))),
    }
}

/// The string at `obj[key]`: required, or `None` when absent and `optional`.
fn text<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<Option<&'v str>> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(expected(file, &join(path, key), "a string", v)),
        None => Ok(None),
    }
}

fn required_text<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    file: &Path,
    path: &str,
) -> Result<&'v str> {
    text(obj, key, file, path)?
        .ok_or_else(|| bad(file, path_or_top(path), format!("no \"{key}\" (a string)")))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn path_or_top(path: &str) -> &str {
    if path.is_empty() {
        "the top level"
    } else {
        path
    }
}

/// Parses JSON text, naming the line and column of a syntax error.
/// An object that names a key twice is refused: which of the two a reader keeps is up to the reader,
/// and a baseline or a part must not mean one thing to fragsim and another to the tool that made it.
pub(crate) fn parse_json(data: &[u8], file: &Path, hint: &str) -> Result<Value> {
    let mut reader = serde_json::Deserializer::from_slice(data);
    serde::de::DeserializeSeed::deserialize(KeysOnce, &mut reader)
        .and_then(|v| reader.end().map(|()| v))
        .map_err(|e| {
            if data.iter().all(u8::is_ascii_whitespace) {
                return Error::input(format!("the file is empty, not JSON; {hint}")).in_file(file);
            }
            let (line, column) = (e.line(), e.column());
            Error::input(format!(
                "not JSON: {} (line {line}, column {column}); {hint}",
                json_reason(&e)
            ))
            .in_file(file)
        })
}

/// Reads a JSON value as `serde_json::Value` does, refusing an object that names a key twice
/// (serde_json's own keeps the last).
struct KeysOnce;

impl<'de> serde::de::DeserializeSeed<'de> for KeysOnce {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeysOnce {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(KeysOnce)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "an object names the key {} twice",
                    quoted(&key)
                )));
            }
            let value = map.next_value_seed(KeysOnce)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// What is wrong with JSON text, in fragsim's words, for serde_json's error `e` (its own text,
/// without its place, where no case below fits).
fn json_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let text = text.rsplit_once(" at line ").map_or(text.as_str(), |(m, _)| m);
    if e.is_eof() {
        return "the text ends inside a value (truncated?)".to_string();
    }
    let words = [
        ("trailing characters", "more text follows the JSON value"),
        ("number out of range", "a number beyond what JSON numbers hold here"),
        ("escape", "a string holds an invalid \\ escape (a lone surrogate or a cut \\u)"),
        ("control character", "a string holds a raw control character"),
        ("expected value", "a value was expected"),
        ("key must be a string", "an object key is not a string"),
        ("recursion limit exceeded", "values nest too deep"),
    ];
    match words.iter().find(|(serde, _)| text.contains(serde)) {
        Some((_, ours)) => ours.to_string(),
        None => text.to_string(),
    }
}

/// The keys a sweep part's top level may hold.
const PART_KEYS: &[&str] = &[
    "traces",
    "objective",
    "results",
    "ranking",
    "best",
    "reference",
    "grid",
    "shard",
    "grid_specs",
    "grid_settings",
    "host_memory",
    "capacity",
];

/// Reads one `sweep --out` file (a part of a sharded sweep, or a whole sweep) as `merge` needs
/// it: its traces, objective, reference, grid and shard, and its results, each checked (see the
/// module docs). The grid's spec list and settings must hash to its `grid`, and its results must
/// be exactly the specs of its shard of that list, each once on every trace, spec-major; its
/// `ranking` and `best` are left out, as `merge` ranks again.
pub fn read_part(data: &[u8], file: &Path) -> Result<SweepReport> {
    let hint = "write parts with sweep --shard I/N --out FILE";
    let v = parse_json(data, file, hint)?;
    let top = object(&v, file, "the top level")
        .map_err(|e| Error::input(format!("{}; {hint}", e.message())).in_file(file))?;
    if let Some(key) = top.keys().find(|k| !PART_KEYS.contains(&k.as_str())) {
        return Err(bad(file, key, format!("unknown key in a sweep part; {hint}")));
    }
    let traces = read_traces(top, file)?;
    let objective = required_text(top, "objective", file, "")?.to_string();
    if !KEYS.iter().any(|k| {
        k.0 == objective && matches!(k.1, Kind::Count | Kind::Fraction | Kind::Seconds | Kind::Flag)
    }) {
        return Err(bad(
            file,
            "objective",
            format!("{objective} is not a numeric result key", objective = quoted(&objective)),
        ));
    }
    let reference = text(top, "reference", file, "")?.map(str::to_string);
    let grid = required_text(top, "grid", file, "")?.to_string();
    let shard = read_shard(top, file)?;
    let grid_specs = strings(top, "grid_specs", "a spec", file)?;
    let grid_settings = strings(top, "grid_settings", "a string", file)?;
    let hashed = grid_id(&[grid_specs.as_slice(), grid_settings.as_slice()].concat());
    if hashed != grid {
        return Err(bad(
            file,
            "grid",
            format!("{grid} is not the hash of grid_specs and grid_settings ({hashed}): the part was edited", grid = quoted(&grid)),
        ));
    }
    {
        let mut seen = std::collections::HashSet::new();
        if let Some((i, s)) = grid_specs.iter().enumerate().find(|(_, s)| !seen.insert(*s)) {
            return Err(bad(
                file,
                &format!("grid_specs[{i}]"),
                format!("{s} is listed twice", s = quoted(s)),
            ));
        }
    }
    let mine = match shard {
        Some(s) => &grid_specs[s.range(grid_specs.len())],
        None => &grid_specs[..],
    };
    let results = read_rows(top, file, mine, &traces)?;
    let capacity = match top.get("capacity") {
        None => None,
        Some(Value::String(c)) => {
            capacity_agrees(c, &grid_settings).map_err(|m| bad(file, "capacity", m))?;
            Some(c.clone())
        }
        Some(v) => return Err(expected(file, "capacity", "a string", v)),
    };
    Ok(SweepReport {
        traces,
        objective,
        results,
        ranking: Vec::new(),
        best: None,
        reference,
        grid: Some(grid),
        shard,
        grid_specs: Some(grid_specs),
        grid_settings: Some(grid_settings),
        host_memory: match top.get("host_memory") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(expected(file, "host_memory", "true or false", v)),
        },
        capacity,
    })
}

/// Checks a part's `capacity` (the text given to `--capacity`) against the capacity setting its
/// grid id covers (`grid_settings`): `recorded` and `none` are settings of their own, and any
/// other text is a size. A part whose text was edited to another kind is refused.
fn capacity_agrees(text: &str, grid_settings: &[String]) -> std::result::Result<(), String> {
    let setting = grid_settings.iter().find_map(|s| s.strip_prefix("capacity="));
    let kind = |setting: &str| match setting {
        "recorded" => "recorded",
        "None" => "none",
        _ => "a size",
    };
    let typed = match text.trim().to_ascii_lowercase().as_str() {
        "recorded" => "recorded",
        "none" => "none",
        _ => "a size",
    };
    match setting.map(kind) {
        Some(k) if k != typed => Err(format!(
            "'{text}' is not the capacity the grid was swept under ({k}, grid_settings): the part was edited"
        )),
        _ => Ok(()),
    }
}

/// A part's `traces`: at least one, none twice.
fn read_traces(top: &Map<String, Value>, file: &Path) -> Result<Vec<String>> {
    let traces_v = array(top, "traces", file, "")?;
    let mut traces: Vec<String> = Vec::with_capacity(traces_v.len());
    for (i, t) in traces_v.iter().enumerate() {
        let t = t.as_str().ok_or_else(|| expected(file, &format!("traces[{i}]"), "a path", t))?;
        if traces.iter().any(|x| x == t) {
            return Err(bad(
                file,
                &format!("traces[{i}]"),
                format!("{t} is listed twice", t = quoted(t)),
            ));
        }
        traces.push(t.to_string());
    }
    if traces.is_empty() {
        return Err(bad(file, "traces", "a sweep holds at least one trace".into()));
    }
    Ok(traces)
}

/// A part's `shard`, if it names one: `index` of `count`, 1 <= index <= count.
fn read_shard(top: &Map<String, Value>, file: &Path) -> Result<Option<Shard>> {
    Ok(match top.get("shard") {
        None | Some(Value::Null) => None,
        Some(s) => {
            let o = object(s, file, "shard")?;
            let n = |key: &str| -> Result<usize> {
                let v = o.get(key).ok_or_else(|| bad(file, "shard", format!("no \"{key}\"")))?;
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| expected(file, &format!("shard.{key}"), "a positive integer", v))
            };
            let (index, count) = (n("index")?, n("count")?);
            if let Some(key) = o.keys().find(|k| *k != "index" && *k != "count") {
                return Err(bad(file, &format!("shard.{key}"), "unknown key".into()));
            }
            if index == 0 || index > count {
                return Err(bad(
                    file,
                    "shard",
                    format!("index {index} of {count}: expected 1 <= index <= count"),
                ));
            }
            Some(Shard { index, count })
        }
    })
}

/// The list of strings at `key`, each `what`.
fn strings(top: &Map<String, Value>, key: &str, what: &str, file: &Path) -> Result<Vec<String>> {
    let list = array(top, key, file, "")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let s = s.as_str().ok_or_else(|| expected(file, &format!("{key}[{i}]"), what, s))?;
        out.push(s.to_string());
    }
    Ok(out)
}

/// A part's `results`: spec-major, every spec of its shard (`mine`) on every trace, in order,
/// each a result row whose labels are its spec's.
fn read_rows(
    top: &Map<String, Value>,
    file: &Path,
    mine: &[String],
    traces: &[String],
) -> Result<Vec<SweepRow>> {
    let results_v = array(top, "results", file, "")?;
    let expected_rows = mine.len().saturating_mul(traces.len());
    if results_v.len() != expected_rows {
        return Err(bad(
            file,
            "results",
            format!(
                "{} results, but its shard of the grid holds {} specs on {} traces ({expected_rows} results)",
                results_v.len(),
                mine.len(),
                traces.len()
            ),
        ));
    }
    let mut results = Vec::with_capacity(results_v.len());
    for (i, r) in results_v.iter().enumerate() {
        let path = format!("results[{i}]");
        let map = object(r, file, &path)?;
        let spec = required_text(map, "spec", file, &path)?;
        let trace = required_text(map, "trace", file, &path)?;
        check_result(map, file, &path, false, &["spec", "trace"])?;
        let (want_spec, want_trace) = (&mine[i / traces.len()], &traces[i % traces.len()]);
        if spec != want_spec || trace != want_trace {
            return Err(bad(
                file,
                &path,
                format!(
                    "holds {spec} on {trace} where its shard of the grid has {want_spec} on {want_trace} (a config dropped, added, repeated or renamed)", spec = quoted(spec), trace = quoted(trace), want_spec = quoted(want_spec), want_trace = quoted(want_trace)),
            ));
        }
        check_labels(map, spec, file, &path)?;
        let mut result = map.clone();
        result.remove("spec");
        result.remove("trace");
        results.push(SweepRow { spec: spec.to_string(), row: Row::from_json(trace, result) });
    }
    Ok(results)
}

/// Refuses a part's row at `path` whose `policy` is not its spec's, or whose `config` is not one
/// its spec would produce ([`config_mismatch`]).
fn check_labels(map: &Map<String, Value>, spec: &str, file: &Path, path: &str) -> Result<()> {
    let policy = map.get("policy").and_then(Value::as_str).unwrap_or("");
    let spec_policy = spec.split(':').next().unwrap_or(spec);
    if policy != spec_policy {
        return Err(bad(
            file,
            &format!("{path}.policy"),
            format!(
                "{policy} is not the policy of its spec {spec}",
                policy = quoted(policy),
                spec = quoted(spec)
            ),
        ));
    }
    let config = map.get("config").and_then(Value::as_str).unwrap_or("");
    match config_mismatch(spec, config) {
        Some(why) => Err(bad(file, &format!("{path}.config"), why)),
        None => Ok(()),
    }
}

/// Why `config` is not a configuration the policy `spec` names would report, or `None` when it
/// could be. A part's rows are checked with it, so a relabelled config is refused.
///
/// A policy other than PyTorch's reports the same configuration on every trace: it is built
/// from the spec's options and must show exactly `config`. PyTorch's policies start from a
/// trace's recorded settings, which a part does not carry, so for them `config` must be a
/// configuration the policy shows (it reads back to itself), of the right allocator
/// (`pytorch-npu` torch_npu's, `pytorch-cuda` CUDA's), with expandable segments for
/// `pytorch-expandable`, and holding every option the spec sets (setting the spec's options on
/// it changes nothing).
pub(crate) fn config_mismatch(spec: &str, config: &str) -> Option<String> {
    use crate::policy::pytorch::config::{split_version, Config, Flavour};
    let (name, options) = spec.split_once(':').unwrap_or((spec, ""));
    let info = match crate::policy::lookup(name) {
        Ok(info) => info,
        Err(e) => return Some(e.message().to_string()),
    };
    if !info.has_allocator_settings() {
        let shown = match built_config(info, options) {
            Ok(shown) => shown,
            Err(e) => {
                return Some(format!(
                    "its spec {spec} does not build: {}",
                    e.message(),
                    spec = quoted(spec)
                ))
            }
        };
        return (shown != config).then(|| {
            format!(
                "{config} is not the configuration of {spec} ({shown}): the row was relabelled",
                config = quoted(config),
                spec = quoted(spec),
                shown = quoted(&shown)
            )
        });
    }
    let relabelled = |why: String| {
        Some(format!("{config} {why}: the row was relabelled", config = quoted(config)))
    };
    // A release asked for (`version=X.Y`) is shown after the settings, and must be the spec's.
    let (settings, shown_version) = match split_version(config) {
        Ok(split) => split,
        Err(e) => return relabelled(format!("names no release fragsim models ({})", e.message())),
    };
    // The spec's options read once: the release it asks for here, its other options below.
    let spec_split = split_version(options);
    let asked_version = spec_split.as_ref().ok().and_then(|(_, v)| *v);
    if shown_version != asked_version {
        let shown = |v: Option<_>| v.map_or("the recording's".to_string(), |v| format!("{v}"));
        return relabelled(format!(
            "models PyTorch {}, and its spec {spec} asks for {}",
            shown(shown_version),
            shown(asked_version),
            spec = quoted(spec)
        ));
    }
    let config = settings.as_str();
    let c = match Config::parse_shown(config) {
        Ok(c) => c,
        Err(e) => {
            return relabelled(format!(
                "is not a configuration {name} shows ({})",
                e.message(),
                name = quoted(name)
            ))
        }
    };
    if c.to_conf_string() != config {
        return relabelled(format!(
            "is not a configuration as {name} shows it (it would show '{}')",
            c.to_conf_string(),
            name = quoted(name)
        ));
    }
    match name {
        "pytorch-npu" if c.flavour != Flavour::Npu => {
            return relabelled("is not torch_npu's allocator's".into())
        }
        "pytorch-cuda" if c.flavour != Flavour::Cuda => {
            return relabelled("is not CUDA's allocator's".into())
        }
        "pytorch-expandable" if !c.expandable_segments => {
            return relabelled(
                "has expandable segments off, which 'pytorch-expandable' forces on".into(),
            )
        }
        _ => {}
    }
    let options = match spec_split {
        Ok((o, _)) => o,
        Err(e) => {
            return Some(format!(
                "its spec {spec} does not parse: {}",
                e.message(),
                spec = quoted(spec)
            ))
        }
    };
    let o = options.trim();
    if o.is_empty() || o == "recorded" {
        return None;
    }
    let mut with_spec = c.clone();
    if let Err(e) = with_spec.apply(o) {
        return Some(format!(
            "its spec {spec} does not parse: {}",
            e.message(),
            spec = quoted(spec)
        ));
    }
    with_spec.expandable_segments |= name == "pytorch-expandable";
    (with_spec.to_conf_string() != config).then(|| {
        format!(
            "{config} does not hold the options its spec {spec} sets (it would show '{}'): the row was relabelled",
            with_spec.to_conf_string(), config = quoted(config), spec = quoted(spec))
    })
}

/// The configuration `info` reports when built from `options` (for a policy whose
/// configuration does not depend on the trace).
fn built_config(info: &crate::policy::PolicyInfo, options: &str) -> Result<String> {
    use crate::policy::{Policy, PolicyContext, PolicyRunner, PolicySpec};
    struct Shown;
    impl PolicyRunner for Shown {
        type Output = String;
        fn run<P: Policy>(self, _name: &str, policy: P) -> String {
            policy.config()
        }
    }
    let trace = crate::trace::Trace::default();
    let context = PolicyContext {
        trace: &trace,
        device: 0,
        events: &[],
        live_at_start: &[],
        lifetimes: &crate::trace::lifetimes::scan(&[]),
        capacity: None,
        gpu_memory: None,
        recorded_peak_reserved: None,
        exported: false,
        cancel: &crate::error::Cancel::default(),
    };
    let spec = PolicySpec { name: info.name.into(), options: options.into() };
    Ok(info.build(&spec, &context)?.run_with(info.name, Shown))
}

/// Refuses a second row for the same (trace, policy, config) among `rows`, naming both indices
/// as `what[i]` in `file`.
pub(crate) fn no_repeated_rows(rows: &[Row], file: &Path, what: &str) -> Result<()> {
    let mut seen = std::collections::HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        if let Some(first) = seen.insert((r.trace.as_str(), r.policy(), r.config()), i) {
            return Err(bad(
                file,
                &format!("{what}[{i}]"),
                format!(
                    "repeats {what}[{first}] (trace '{}', policy '{}', config '{}'): one row per trace and policy",
                    r.trace,
                    r.policy(),
                    r.config()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key a result can be written with is one a baseline and a sweep part read back. The
    /// literal names every field (no `..Default::default()`), so a new field does not compile
    /// here until this test holds it: a key `replay --json` writes and `check` refuses is how
    /// `start_assumed` broke a warm profiler trace's baseline.
    #[test]
    fn a_parts_capacity_text_is_of_the_kind_its_grid_was_swept_under() {
        let settings = |s: &str| vec![format!("capacity={s}")];
        assert!(capacity_agrees("recorded", &settings("recorded")).is_ok());
        assert!(capacity_agrees("none", &settings("None")).is_ok());
        assert!(capacity_agrees("a100-40gb", &settings("Some(42949672960)")).is_ok());
        assert!(capacity_agrees("40GiB", &[]).is_ok(), "older parts name no setting");
        let e = capacity_agrees("40GiB", &settings("recorded")).unwrap_err();
        assert!(e.contains("not the capacity the grid was swept under (recorded"), "{e}");
        assert!(capacity_agrees("recorded", &settings("Some(1)")).is_err());
        assert!(capacity_agrees("none", &settings("recorded")).is_err());
    }

    #[test]
    fn every_key_a_result_is_written_with_reads_back() {
        use crate::metrics::{OomDetail, PolicyResult};
        let full = PolicyResult {
            policy: "pytorch".into(),
            config: "expandable_segments:False".into(),
            peak_reserved_bytes: 1,
            peak_allocated_bytes: 1,
            peak_requested_bytes: 1,
            reserved_at_end_bytes: 1,
            fragmentation_at_peak: 0.5,
            peak_event: 1,
            device_malloc_count: 1,
            device_free_count: 1,
            map_count: 1,
            unmap_count: 1,
            alloc_retries: 1,
            oom: true,
            first_oom_event: Some(1),
            peak_at_start: true,
            peak_allocated_event: 1,
            fragmentation_at_peak_allocated: 0.5,
            start_malloc_count: 1,
            start_map_count: 1,
            start_state: Some(Default::default()),
            start_assumed: Some(Default::default()),
            gpu_memory_bytes: Some(1),
            capacity_bytes: Some(1),
            replay_seconds: 0.5,
            planning_seconds: Some(0.5),
            first_oom: Some(OomDetail::default()),
            cuda: Some(Default::default()),
        };
        let Value::Object(map) = serde_json::to_value(&full).unwrap() else { panic!() };
        assert_eq!(map.len(), KEYS.len(), "{:?}", map.keys().collect::<Vec<_>>());
        check_result(&map, Path::new("r.json"), "results[0]", false, &[]).unwrap();
        check_baseline_result(&map, Path::new("r.json"), "results[0]", &[]).unwrap();
    }
    use crate::metrics::PolicyResult;

    fn row_json(spec: &str, trace: &str) -> Value {
        let mut v = serde_json::to_value(PolicyResult {
            policy: spec.split(':').next().unwrap().into(),
            config: match spec {
                "bfc" => "allow_growth=true,memory_limit=none,garbage_collection=true".into(),
                _ => "expandable_segments:False".into(),
            },
            peak_reserved_bytes: 4096,
            ..Default::default()
        })
        .unwrap();
        v["spec"] = spec.into();
        v["trace"] = trace.into();
        v
    }

    fn part() -> Value {
        let specs = vec!["pytorch".to_string(), "bfc".to_string()];
        let settings = vec!["capacity=None".to_string()];
        serde_json::json!({
            "traces": ["a"],
            "objective": "peak_reserved_bytes",
            "results": [row_json("pytorch", "a"), row_json("bfc", "a")],
            "ranking": [],
            "best": null,
            "reference": "pytorch",
            "grid": grid_id(&[specs.clone(), settings.clone()].concat()),
            "grid_specs": specs,
            "grid_settings": settings,
        })
    }

    fn read(v: &Value) -> Result<SweepReport> {
        read_part(v.to_string().as_bytes(), Path::new("p.json"))
    }

    #[test]
    fn a_relabelled_config_is_refused() {
        assert_eq!(config_mismatch("pytorch", "expandable_segments:False"), None);
        assert_eq!(
            config_mismatch(
                "pytorch:max_split_size_mb:128",
                "expandable_segments:False,max_split_size_mb:128"
            ),
            None
        );
        let asked = "expandable_segments:False,max_split_size_mb:128,version=2.15";
        assert_eq!(config_mismatch("pytorch:max_split_size_mb:128,version=2.15", asked), None);
        for (spec, config) in [
            ("pytorch:max_split_size_mb:128", asked),
            ("pytorch:max_split_size_mb:128,version=2.13", asked),
            ("pytorch:version=2.15", "expandable_segments:False"),
            ("pytorch", "expandable_segments:False,version=2.016"),
            ("bfc", "allow_growth=false,memory_limit=none,garbage_collection=true"),
            ("pytorch:max_split_size_mb:128", "expandable_segments:False,max_split_size_mb:256"),
            ("pytorch:max_split_size_mb:128", "expandable_segments:False"),
            ("pytorch-expandable", "expandable_segments:False"),
            ("pytorch", "not a config"),
        ] {
            assert!(config_mismatch(spec, config).is_some(), "{spec} / {config}");
        }
        let mut v = part();
        v["results"][1]["config"] = "allow_growth=false".into();
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("results[1].config: 'allow_growth=false'"), "{e}");
    }

    #[test]
    fn a_whole_part_reads() {
        let p = read(&part()).unwrap();
        assert_eq!(p.results.len(), 2);
        assert_eq!(p.results[1].spec, "bfc");
    }

    #[test]
    fn values_out_of_range_name_the_key_path() {
        for (value, found) in [
            (serde_json::json!(-5), "-5"),
            (serde_json::json!(1e300), "1e+300"),
            (serde_json::json!("7"), "the string \"7\""),
            (serde_json::json!(true), "true"),
            (serde_json::json!(null), "null"),
        ] {
            let mut v = part();
            v["results"][1]["peak_reserved_bytes"] = value;
            let e = read(&v).unwrap_err().to_string();
            assert!(
                e.starts_with(
                    "p.json: results[1].peak_reserved_bytes: expected a non-negative integer"
                ),
                "{e}"
            );
            assert!(e.ends_with(&format!("found {found}")), "{e}");
        }
        let mut v = part();
        v["results"][0]["fragmentation_at_peak"] = serde_json::json!(1.5);
        let e = read(&v).unwrap_err().to_string();
        assert!(
            e.contains("results[0].fragmentation_at_peak: expected a number from 0 to 1"),
            "{e}"
        );
    }

    #[test]
    fn a_part_cannot_drop_add_repeat_or_relabel_a_config() {
        let mut v = part();
        v["results"] = serde_json::json!([]);
        assert!(read(&v).unwrap_err().to_string().contains("0 results"));
        let mut v = part();
        v["results"][1] = row_json("pytorch", "a");
        assert!(read(&v).unwrap_err().to_string().contains("results[1]: holds 'pytorch'"));
        let mut v = part();
        v["results"][1]["spec"] = "nocache".into();
        assert!(read(&v).unwrap_err().to_string().contains("a config dropped"));
        let mut v = part();
        v["grid_specs"][1] = "nocache".into();
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("grid: ") && e.contains("not the hash"), "{e}");
        let mut v = part();
        v["results"][1]["policy"] = "pytorch".into();
        assert!(read(&v).unwrap_err().to_string().contains("not the policy of its spec"));
    }

    #[test]
    fn missing_and_unknown_keys_are_named() {
        let mut v = part();
        v["results"][0].as_object_mut().unwrap().remove("oom");
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("results[0]: the result has no \"oom\""), "{e}");
        let mut v = part();
        v["results"][0]["peak"] = 1.into();
        assert!(read(&v).unwrap_err().to_string().contains("results[0].peak: unknown result key"));
        let mut v = part();
        v["shard"] = serde_json::json!({"index": 2, "count": u64::MAX});
        // A count no part could fill is only a number: nothing is sized by it.
        let e = read(&v).unwrap_err().to_string();
        assert!(e.contains("results"), "{e}");
    }
}
