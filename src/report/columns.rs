//! Every column a results table can show, defined once: its JSON key, header, unit and how to read
//! it from a [`PolicyResult`]. The terminal table, the Markdown summary, the HTML page and the CSV
//! all take their columns from here, so they cannot drift apart (hyperfine's
//! hand-synced CSV is the counter-example).

use crate::metrics::PolicyResult;
use crate::policy::Role;
use crate::recorded::RecordedRow;
use crate::units::format_bytes;

/// What a table row is computed from: one result, plus the `bound` policy's peak when it ran.
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    /// The policy's result.
    pub result: &'a PolicyResult,
    /// `bound`'s peak reserved bytes, if `bound` was replayed.
    pub bound: Option<u64>,
}

/// One cell's value, typed so each format can write it its own way.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// Free text (policy name, configuration).
    Text(String),
    /// A byte count.
    Bytes(u64),
    /// A plain count.
    Count(u64),
    /// A fraction in 0..=1, shown as a percentage.
    Ratio(f64),
    /// A signed percentage (e.g. overhead over `bound`); `None` when it cannot be computed.
    Percent(Option<f64>),
    /// Yes or no.
    Flag(bool),
    /// An event index, or none (`first_oom_event`).
    Event(Option<u64>),
    /// Seconds.
    Seconds(f64),
    /// A value the source cannot know (the `recorded` row's JSON `null`).
    Unknown,
}

impl Cell {
    /// The value as `replay --json` writes it (`""` for null), for CSV.
    pub(crate) fn raw(&self) -> String {
        let float = |x: f64| serde_json::to_string(&x).unwrap_or_else(|_| x.to_string());
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Bytes(n) | Cell::Count(n) => n.to_string(),
            Cell::Ratio(x) | Cell::Seconds(x) => float(*x),
            Cell::Percent(p) => p.map(float).unwrap_or_default(),
            Cell::Flag(b) => b.to_string(),
            Cell::Event(e) => e.map(|e| e.to_string()).unwrap_or_default(),
            Cell::Unknown => String::new(),
        }
    }

    /// The value as a person reads it (`12.66 GiB`, `23.4%`, `at event 812`).
    pub(crate) fn human(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Bytes(n) => format_bytes(*n),
            Cell::Count(n) => n.to_string(),
            Cell::Ratio(x) => format!("{:.1}%", x * 100.0),
            Cell::Percent(Some(p)) => signed_percent(*p),
            Cell::Percent(None) => "-".into(),
            Cell::Flag(b) => if *b { "yes" } else { "no" }.into(),
            Cell::Event(Some(e)) => format!("at event {e}"),
            Cell::Event(None) => "no".into(),
            Cell::Seconds(s) => format!("{s:.3} s"),
            Cell::Unknown => "-".into(),
        }
    }

    /// True for values that right-align in a table (everything but text).
    pub fn is_numeric(&self) -> bool {
        !matches!(self, Cell::Text(_))
    }
}

/// One column. See the module docs.
pub struct Column {
    /// The JSON key (or, for a derived column, a key-like name that is not in the JSON).
    pub key: &'static str,
    /// The short header people read.
    pub header: &'static str,
    /// What the value measures, with its unit, for documentation and the HTML page.
    pub unit: &'static str,
    /// Reads the value from a row.
    pub value: fn(&Row) -> Cell,
}

impl std::fmt::Debug for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Column").field("key", &self.key).finish()
    }
}

macro_rules! column {
    ($name:ident, $key:expr, $header:literal, $unit:expr, $value:expr) => {
        #[doc = concat!("`", $key, "`: ", $unit, ".")]
        pub static $name: Column =
            Column { key: $key, header: $header, unit: $unit, value: $value };
    };
}

/// Columns of a nested object of a result (`start_state`, `first_oom`, `cuda`), one row each: `NAME field
/// "header" make`, the column `object.field` whose cell is `make(object.field)`, read through
/// the helper named after the object.
macro_rules! nested_columns {
    ($of:ident: $($name:ident $field:ident $header:literal $make:path;)*) => {
        $(column!(
            $name,
            concat!(stringify!($of), ".", stringify!($field)),
            $header,
            "as the JSON result holds it (CSV only)",
            |r| $of(r, |x| $make(x.$field))
        );)*
    };
}

column!(POLICY, "policy", "policy", "the policy's name", |r| Cell::Text(r.result.policy.clone()));
column!(CONFIG, "config", "config", "the exact configuration, in the policy's own syntax", |r| {
    Cell::Text(r.result.config.clone())
});
column!(PEAK_RESERVED, "peak_reserved_bytes", "peak reserved", "bytes, peak", |r| {
    Cell::Bytes(r.result.peak_reserved_bytes)
});
column!(PEAK_ALLOCATED, "peak_allocated_bytes", "peak allocated", "bytes, peak", |r| {
    Cell::Bytes(r.result.peak_allocated_bytes)
});
column!(PEAK_REQUESTED, "peak_requested_bytes", "peak requested", "bytes, peak", |r| {
    Cell::Bytes(r.result.peak_requested_bytes)
});
column!(
    RESERVED_AT_END,
    "reserved_at_end_bytes",
    "reserved at end",
    "bytes, after the last event",
    |r| { Cell::Bytes(r.result.reserved_at_end_bytes) }
);
column!(
    FRAGMENTATION,
    "fragmentation_at_peak",
    "frag@peak",
    "1 − allocated ÷ reserved when reserved memory peaks",
    |r| Cell::Ratio(r.result.fragmentation_at_peak)
);
column!(
    PEAK_EVENT,
    "peak_event",
    "peak at",
    "index of the event after which reserved memory first reached its peak",
    |r| Cell::Event(Some(r.result.peak_event))
);
column!(
    DEVICE_MALLOCS,
    "device_malloc_count",
    "cudaMalloc",
    "segment allocations, cumulative",
    |r| { Cell::Count(r.result.device_malloc_count) }
);
column!(DEVICE_FREES, "device_free_count", "cudaFree", "segment releases, cumulative", |r| {
    Cell::Count(r.result.device_free_count)
});
column!(MAPS, "map_count", "maps", "page mappings, cumulative", |r| Cell::Count(
    r.result.map_count
));
column!(UNMAPS, "unmap_count", "unmaps", "page unmappings, cumulative", |r| {
    Cell::Count(r.result.unmap_count)
});
column!(
    ALLOC_RETRIES,
    "alloc_retries",
    "retries",
    "mallocs that flushed the cache and retried",
    |r| { Cell::Count(r.result.alloc_retries) }
);
column!(OOM, "oom", "oom", "whether a request could not be served under --capacity", |r| {
    Cell::Flag(r.result.oom)
});
column!(
    FIRST_OOM,
    "first_oom_event",
    "oom",
    "index of the first event that could not be served",
    |r| { Cell::Event(r.result.first_oom_event) }
);
column!(REPLAY_SECONDS, "replay_seconds", "replay time", "wall-clock seconds of the replay", |r| {
    Cell::Seconds(r.result.replay_seconds)
});
column!(
    MALLOCS,
    "mallocs",
    "mallocs",
    "segment allocations plus page mappings (device_malloc_count + map_count), those that \
     placed the start state included (for the recorded run: the segments it held before the \
     first event, plus the recorded ones)",
    |r| Cell::Count(r.result.device_malloc_count + r.result.map_count)
);
column!(
    FREES,
    "frees",
    "frees",
    "segment releases plus page unmappings (device_free_count + unmap_count)",
    |r| Cell::Count(r.result.device_free_count + r.result.unmap_count)
);
column!(
    PEAK_AT_START,
    "peak_at_start",
    "peak at start",
    "whether reserved memory peaked at the start state, before the first event",
    |r| Cell::Flag(r.result.peak_at_start)
);
column!(
    PEAK_ALLOCATED_EVENT,
    "peak_allocated_event",
    "live peak at",
    "index of the event after which allocated bytes first reached their peak",
    |r| Cell::Event(Some(r.result.peak_allocated_event))
);
column!(
    FRAGMENTATION_AT_LIVE_PEAK,
    "fragmentation_at_peak_allocated",
    "frag@live peak",
    "1 − allocated ÷ reserved when allocated (live) bytes peak: what the cache wasted when the \
     program held the most",
    |r| Cell::Ratio(r.result.fragmentation_at_peak_allocated)
);
column!(
    START_MALLOCS,
    "start_malloc_count",
    "start cudaMalloc",
    "segment allocations that placed the state before the first event",
    |r| Cell::Count(r.result.start_malloc_count)
);
column!(
    START_MAPS,
    "start_map_count",
    "start maps",
    "page mappings that placed the state before the first event",
    |r| Cell::Count(r.result.start_map_count)
);
// The nested objects' keys, for CSV only (an empty cell where the result does not hold the
// object); what each key means is the field's doc
// ([`crate::backend::StartFit`], [`crate::metrics::OomDetail`],
// [`crate::backend::cuda::CudaMeasures`]) and docs/interface.md.
nested_columns! { start_state:
    START_STATE_SEGMENTS segments "start segments" Cell::Count;
    START_STATE_BYTES bytes "start bytes" Cell::Bytes;
    START_STATE_INSTALLED_SEGMENTS installed_segments "start installed" Cell::Count;
    START_STATE_INSTALLED_BYTES installed_bytes "start installed bytes" Cell::Bytes;
    START_STATE_LIMIT limit_bytes "start limit" bytes_or_unknown;
}
nested_columns! { start_assumed:
    START_ASSUMED_RESERVED reserved_bytes "assumed start reserve" Cell::Bytes;
    START_ASSUMED_CACHED cached_bytes "assumed start cache" Cell::Bytes;
}
column!(
    START_ASSUMED,
    "start_assumed.assumed",
    "assumed start",
    "as the JSON result holds it (CSV only)",
    |r| start_assumed(r, |x| Cell::Text(x.assumed.clone()))
);
column!(
    GPU_MEMORY,
    "gpu_memory_bytes",
    "GPU memory",
    "the GPU memory a limit that is a share of it assumed, in bytes",
    |r| bytes_or_unknown(r.result.gpu_memory_bytes)
);
column!(
    CAPACITY,
    "capacity_bytes",
    "capacity",
    "the device memory the replay ran under, in bytes (empty: unlimited)",
    |r| bytes_or_unknown(r.result.capacity_bytes)
);
column!(
    PLANNING_SECONDS,
    "planning_seconds",
    "planning time",
    "of replay_seconds, the wall-clock seconds a planner spent before the first event",
    |r| r.result.planning_seconds.map_or(Cell::Unknown, Cell::Seconds)
);
nested_columns! { first_oom:
    FIRST_OOM_DETAIL_EVENT event "oom event" Cell::Count;
    FIRST_OOM_SIZE size "oom size" Cell::Bytes;
    FIRST_OOM_STREAM stream "oom stream" Cell::Count;
    FIRST_OOM_CAPACITY capacity_bytes "oom capacity" bytes_or_unknown;
    FIRST_OOM_RESERVED reserved_bytes "oom reserved" Cell::Bytes;
    FIRST_OOM_ALLOCATED allocated_bytes "oom allocated" Cell::Bytes;
    FIRST_OOM_FREE free_bytes "oom free" bytes_or_unknown;
}
nested_columns! { cuda:
    CUDA_WALL_SECONDS wall_seconds "cuda wall time" Cell::Seconds;
    CUDA_DEVICE_TOTAL device_total_bytes "device total" Cell::Bytes;
    CUDA_USED_AT_START device_used_at_start_bytes "device used at start" Cell::Bytes;
    CUDA_RESERVED_AT_DEVICE_PEAK reserved_at_device_peak_bytes "reserved at device peak" Cell::Bytes;
    CUDA_USED_AT_PEAK device_used_at_peak_bytes "device used at peak" Cell::Bytes;
    CUDA_TOUCHED touched "touched" Cell::Flag;
}
column!(
    OVER_BOUND,
    "over_bound",
    "over bound",
    "peak reserved over the bound policy's peak, in percent",
    |r| Cell::Percent(over_bound(r.result.peak_reserved_bytes, r.bound))
);

/// Every scalar key of a [`PolicyResult`], in the order `replay --json` writes them: the CSV
/// columns. A nested object's keys are flattened as `parent.key` (`start_state.bytes`); the keys a
/// result holds only sometimes are empty cells where it does not. Left out, as lists and tables
/// a CSV row cannot hold: `first_oom.stack` (the frames) and `cuda.device_calls` (latency
/// statistics per kind of call).
pub static RESULT: [&Column; 45] = [
    &POLICY,
    &CONFIG,
    &PEAK_RESERVED,
    &PEAK_ALLOCATED,
    &PEAK_REQUESTED,
    &RESERVED_AT_END,
    &FRAGMENTATION,
    &PEAK_EVENT,
    &DEVICE_MALLOCS,
    &DEVICE_FREES,
    &MAPS,
    &UNMAPS,
    &ALLOC_RETRIES,
    &OOM,
    &FIRST_OOM,
    &PEAK_AT_START,
    &PEAK_ALLOCATED_EVENT,
    &FRAGMENTATION_AT_LIVE_PEAK,
    &START_MALLOCS,
    &START_MAPS,
    &START_STATE_SEGMENTS,
    &START_STATE_BYTES,
    &START_STATE_INSTALLED_SEGMENTS,
    &START_STATE_INSTALLED_BYTES,
    &START_STATE_LIMIT,
    &START_ASSUMED_RESERVED,
    &START_ASSUMED_CACHED,
    &START_ASSUMED,
    &GPU_MEMORY,
    &CAPACITY,
    &REPLAY_SECONDS,
    &PLANNING_SECONDS,
    &FIRST_OOM_DETAIL_EVENT,
    &FIRST_OOM_SIZE,
    &FIRST_OOM_STREAM,
    &FIRST_OOM_CAPACITY,
    &FIRST_OOM_RESERVED,
    &FIRST_OOM_ALLOCATED,
    &FIRST_OOM_FREE,
    &CUDA_WALL_SECONDS,
    &CUDA_DEVICE_TOTAL,
    &CUDA_USED_AT_START,
    &CUDA_RESERVED_AT_DEVICE_PEAK,
    &CUDA_USED_AT_PEAK,
    &CUDA_TOUCHED,
];

/// A byte count the result may not hold: [`Cell::Unknown`] (an empty CSV field) without it.
fn bytes_or_unknown(bytes: Option<u64>) -> Cell {
    bytes.map_or(Cell::Unknown, Cell::Bytes)
}

/// A cell of the result's `start_state`, [`Cell::Unknown`] when the whole state was installed.
fn start_state(r: &Row, cell: fn(&crate::backend::StartFit) -> Cell) -> Cell {
    r.result.start_state.as_ref().map_or(Cell::Unknown, cell)
}

/// A cell of the result's `start_assumed`, [`Cell::Unknown`] where the run assumed no start.
fn start_assumed(r: &Row, cell: fn(&crate::backend::AssumedStart) -> Cell) -> Cell {
    r.result.start_assumed.as_ref().map_or(Cell::Unknown, cell)
}

/// A cell of the result's `first_oom`, [`Cell::Unknown`] when every request was served.
fn first_oom(r: &Row, cell: fn(&crate::metrics::OomDetail) -> Cell) -> Cell {
    r.result.first_oom.as_ref().map_or(Cell::Unknown, cell)
}

/// A cell of the result's `cuda` measures, [`Cell::Unknown`] on the simulated device.
fn cuda(r: &Row, cell: fn(&crate::backend::cuda::CudaMeasures) -> Cell) -> Cell {
    r.result.cuda.as_ref().map_or(Cell::Unknown, cell)
}

/// The columns a person reads first: the terminal table, Markdown and HTML summaries. Its
/// fragmentation is read when live bytes peak ([`FRAGMENTATION_AT_LIVE_PEAK`]): what the cache
/// wasted when it mattered, where the reserved peak may be a warm snapshot's recovered cache.
pub static SUMMARY: [&Column; 9] = [
    &POLICY,
    &PEAK_RESERVED,
    &PEAK_ALLOCATED,
    &PEAK_REQUESTED,
    &FRAGMENTATION_AT_LIVE_PEAK,
    &MALLOCS,
    &FREES,
    &OVER_BOUND,
    &FIRST_OOM,
];

/// The columns a summary of `results` shows: [`SUMMARY`], with `retries`
/// ([`ALLOC_RETRIES`]) before `over bound` when any policy flushed its cache and retried.
pub(crate) fn summary_for(results: &[PolicyResult]) -> Vec<&'static Column> {
    let mut columns: Vec<&'static Column> = SUMMARY.to_vec();
    if results.iter().any(|r| r.alloc_retries > 0) {
        let at = columns.iter().position(|c| c.key == OVER_BOUND.key).unwrap_or(columns.len());
        columns.insert(at, &ALLOC_RETRIES);
    }
    columns
}

/// A label per result that tells rows apart: the policy's name, and when several rows share
/// that name with different configurations, the configuration items (`key:value` or
/// `key=value`, split at commas outside brackets) that not all of them share, e.g.
/// `pytorch (max_split_size_mb:128)`. Five `pytorch:...` variants are five distinct rows. A
/// configuration with no item of its own (the plain `pytorch` beside `pytorch:...` variants) is
/// `(defaults)`.
pub(crate) fn labels(results: &[PolicyResult]) -> Vec<String> {
    results
        .iter()
        .map(|r| {
            let same: Vec<&PolicyResult> =
                results.iter().filter(|o| o.policy == r.policy).collect();
            if same.iter().all(|o| o.config == r.config) {
                return r.policy.clone();
            }
            let own = config_items(&r.config);
            let differing: Vec<&str> = own
                .iter()
                .copied()
                .filter(|item| !same.iter().all(|o| config_items(&o.config).contains(item)))
                .collect();
            // A configuration whose items all recur in the others' has nothing of its own to
            // show: what the others set, it leaves at the defaults.
            if differing.is_empty() {
                return format!("{} (defaults)", r.policy);
            }
            format!("{} ({})", r.policy, differing.join(","))
        })
        .collect()
}

/// `config` split at commas outside `[...]`, empty items left out.
fn config_items(config: &str) -> Vec<&str> {
    let mut items = crate::policy::pytorch::config::top_level_parts(config);
    items.retain(|i| !i.is_empty());
    items
}

/// `peak` over `bound` in percent (`None` without a positive bound).
pub(crate) fn over_bound(peak: u64, bound: Option<u64>) -> Option<f64> {
    match bound {
        Some(b) if b > 0 => Some((peak as f64 / b as f64 - 1.0) * 100.0),
        _ => None,
    }
}

/// `p` percent with one decimal and its sign, except that a value that rounds to zero is
/// `0.0%` (never `-0.0%` or `+0.0%`: two OOM runs at the same level are not "below bound").
pub(crate) fn signed_percent(p: f64) -> String {
    let text = format!("{p:+.1}%");
    if text.trim_start_matches(['+', '-']) == "0.0%" {
        "0.0%".to_string()
    } else {
        text
    }
}

/// The header of the column `vs_recorded` fills.
pub const VS_RECORDED: &str = "vs recorded";

/// A policy's peak reserved against the recorded run's, as a signed percentage.
pub(crate) fn vs_recorded(result: &PolicyResult, recorded: &RecordedRow) -> Cell {
    Cell::Percent(over_bound(result.peak_reserved_bytes, recorded.peak_reserved_bytes))
}

/// The cells of `columns` for the recorded run beside `results`: what the file cannot tell is
/// [`Cell::Unknown`] (a derived column is unknown when any key it is made from is).
pub(crate) fn recorded_cells(
    recorded: &RecordedRow,
    results: &[PolicyResult],
    columns: &[&Column],
) -> Vec<Cell> {
    let result = recorded.to_policy_result();
    let row = Row { result: &result, bound: bound_of(results) };
    // A replay's mallocs count the start state's; the recording's the same way: the segments it
    // held before the first event, which it never recorded allocating, are added.
    let counted = PolicyResult {
        device_malloc_count: result.device_malloc_count + result.start_malloc_count,
        map_count: result.map_count + result.start_map_count,
        ..result.clone()
    };
    let counted = Row { result: &counted, ..row };
    let json = serde_json::to_value(recorded).unwrap_or_default();
    let known = |key: &str| json.get(key).is_none_or(|v| !v.is_null());
    columns
        .iter()
        .map(|c| {
            let sources: &[&str] = match c.key {
                "mallocs" => {
                    &["device_malloc_count", "map_count", "start_malloc_count", "start_map_count"]
                }
                "frees" => &["device_free_count", "unmap_count"],
                "over_bound" => &["peak_reserved_bytes"],
                "replay_seconds" => &["replay_seconds"],
                key => &[key][..],
            };
            match (c.key, sources.iter().all(|k| known(k))) {
                ("first_oom_event", true) if recorded.oom.is_none() => Cell::Unknown,
                ("mallocs", true) => (c.value)(&counted),
                (_, true) => (c.value)(&row),
                (_, false) => Cell::Unknown,
            }
        })
        .collect()
}

/// The summary table as every writer shows it (terminal, Markdown, HTML): headers with their
/// units, and one labelled row per result; with the recorded run, its row comes first (`-`
/// where the file cannot tell) and a [`VS_RECORDED`] column gives each policy's peak reserved
/// against it. Each writer passes its own row labels (`labels`, one per result).
pub struct SummaryTable {
    /// `(header, unit)` per column.
    pub headers: Vec<(&'static str, &'static str)>,
    /// `(label, cells)` per row; the first cell is the policy's and is replaced by the label.
    pub rows: Vec<(String, Vec<Cell>)>,
}

/// Builds the [`SummaryTable`] of `results` labelled by `labels`, beside `recorded`.
pub(crate) fn summary_table(
    results: &[PolicyResult],
    labels: Vec<String>,
    recorded: Option<&RecordedRow>,
) -> SummaryTable {
    let columns = summary_for(results);
    let mut headers: Vec<(&'static str, &'static str)> =
        columns.iter().map(|c| (c.header, c.unit)).collect();
    let mut rows: Vec<(String, Vec<Cell>)> =
        labels.into_iter().zip(cells(results, &columns)).collect();
    if let Some(rec) = recorded {
        headers.push((VS_RECORDED, "peak reserved over the recorded peak, %"));
        for ((_, row), r) in rows.iter_mut().zip(results) {
            row.push(vs_recorded(r, rec));
        }
        let mut first = recorded_cells(rec, results, &columns);
        first.push(Cell::Unknown);
        rows.insert(0, (rec.policy.clone(), first));
    }
    SummaryTable { headers, rows }
}

/// The floor's peak among `results` (`bound`'s, [`Role::Floor`]), if it ran.
pub(crate) fn bound_of(results: &[PolicyResult]) -> Option<u64> {
    let floor = |r: &&PolicyResult| crate::policy::role_of(&r.policy) == Some(Role::Floor);
    results.iter().find(floor).map(|r| r.peak_reserved_bytes)
}

/// The cells of `columns` for each result, in order.
pub(crate) fn cells(results: &[PolicyResult], columns: &[&Column]) -> Vec<Vec<Cell>> {
    let bound = bound_of(results);
    results
        .iter()
        .map(|result| {
            let row = Row { result, bound };
            columns.iter().map(|c| (c.value)(&row)).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result that holds every key `replay --json` can write, each optional one included.
    pub(crate) fn full_result() -> PolicyResult {
        PolicyResult {
            policy: "pytorch".into(),
            start_state: Some(crate::backend::StartFit {
                segments: 3,
                bytes: 3 << 21,
                installed_segments: 1,
                installed_bytes: 2 << 20,
                limit_bytes: Some(4 << 20),
            }),
            start_assumed: Some(crate::backend::AssumedStart {
                reserved_bytes: 5 << 20,
                cached_bytes: 4 << 20,
                assumed: "free mapped pages".into(),
            }),
            gpu_memory_bytes: Some(8 << 30),
            capacity_bytes: Some(16 << 30),
            planning_seconds: Some(0.25),
            first_oom: Some(crate::metrics::OomDetail {
                event: 7,
                size: 1 << 20,
                stack: vec!["a.py:1 f".into()],
                ..Default::default()
            }),
            first_oom_event: Some(7),
            cuda: Some(crate::backend::cuda::CudaMeasures {
                device_total_bytes: 80 << 30,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Every scalar key of `v`, nested ones as `parent.key`, lists and `cuda.device_calls`
    /// left out (what [`RESULT`] says it leaves out).
    fn scalar_keys(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
        for (k, x) in v.as_object().unwrap() {
            let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match x {
                serde_json::Value::Array(_) => {}
                serde_json::Value::Object(_) if key == "cuda.device_calls" => {}
                serde_json::Value::Object(_) => scalar_keys(&key, x, out),
                _ => out.push(key),
            }
        }
    }

    #[test]
    fn result_columns_are_the_json_keys_in_order() {
        let json = serde_json::to_string(&full_result()).unwrap();
        let mut keys = Vec::new();
        scalar_keys("", &serde_json::from_str(&json).unwrap(), &mut keys);
        let mut ours: Vec<String> = RESULT.iter().map(|c| c.key.to_string()).collect();
        // In the written order: each column's `"parent":` then `"key":` after it comes later in
        // the text than the column before's.
        let mut last = 0;
        for key in &ours {
            let mut at = 0;
            for part in key.split('.') {
                let needle = format!("\"{part}\":");
                at += json[at..].find(&needle).unwrap_or_else(|| panic!("{key} in {json}"));
            }
            assert!(at > last || key == "policy", "{key} is out of the JSON's order");
            last = at;
        }
        keys.sort_unstable();
        ours.sort_unstable();
        assert_eq!(ours, keys);
        // Where the result does not hold an optional key, its cells are empty.
        let plain: Vec<String> =
            cells(&[PolicyResult::default()], &RESULT)[0].iter().map(Cell::raw).collect();
        let serde_json::Value::Object(written) =
            serde_json::to_value(PolicyResult::default()).unwrap()
        else {
            unreachable!()
        };
        for (c, raw) in RESULT.iter().zip(&plain) {
            if !written.contains_key(c.key) {
                assert_eq!(raw, "", "{}", c.key);
            }
        }
    }

    #[test]
    fn the_interface_document_lists_the_csv_columns_in_order() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/interface.md"))
                .unwrap();
        let section = doc.split("### Replay CSV columns").nth(1).unwrap();
        let list = section.split("\n\n").find(|p| p.starts_with("`policy`, `config`")).unwrap();
        let listed: Vec<&str> = list.split('`').skip(1).step_by(2).collect();
        let ours: Vec<&str> = RESULT.iter().map(|c| c.key).collect();
        assert_eq!(listed, ours);
    }

    #[test]
    fn cells_format_for_people_and_for_machines() {
        let r = PolicyResult {
            policy: "buddy".into(),
            peak_reserved_bytes: 3 << 30,
            fragmentation_at_peak: 0.5,
            fragmentation_at_peak_allocated: 0.25,
            device_malloc_count: 4,
            map_count: 6,
            first_oom_event: Some(812),
            ..Default::default()
        };
        let b = PolicyResult {
            policy: "bound".into(),
            peak_reserved_bytes: 2 << 30,
            ..Default::default()
        };
        let rows = cells(&[r, b], &SUMMARY);
        let human: Vec<String> = rows[0].iter().map(Cell::human).collect();
        assert_eq!(
            human,
            [
                "buddy",
                "3.00 GiB",
                "0 bytes",
                "0 bytes",
                "25.0%",
                "10",
                "0",
                "+50.0%",
                "at event 812"
            ]
        );
        assert_eq!(rows[1][7].human(), "0.0%");
        let raw: Vec<String> = cells(&[rows_result()], &RESULT)[0].iter().map(Cell::raw).collect();
        assert_eq!(raw[6], "0.5");
        assert_eq!(raw[7], "0");
        assert_eq!(raw[14], "");
        assert_eq!(raw[13], "false");
        assert_eq!(over_bound(10, None), None);
    }

    #[test]
    fn labels_tell_configs_of_one_policy_apart() {
        let r = |policy: &str, config: &str| PolicyResult {
            policy: policy.into(),
            config: config.into(),
            ..Default::default()
        };
        let results = [
            r("pytorch", "expandable_segments:False,max_split_size_mb:128,rp2:[256:1,512:2]"),
            r("pytorch", "expandable_segments:False,max_split_size_mb:256,rp2:[256:1,512:2]"),
            r("pytorch", "expandable_segments:False,max_split_size_mb:256,rp2:[>:8]"),
            r("bound", ""),
            r("buddy", "min_block=512"),
            r("buddy", "min_block=512"),
        ];
        assert_eq!(
            labels(&results),
            [
                "pytorch (max_split_size_mb:128,rp2:[256:1,512:2])",
                "pytorch (max_split_size_mb:256,rp2:[256:1,512:2])",
                "pytorch (max_split_size_mb:256,rp2:[>:8])",
                "bound",
                "buddy",
                "buddy"
            ]
        );
        // A configuration with nothing of its own leaves the others' settings at the defaults.
        let plain = "expandable_segments:False";
        let results = [r("pytorch", plain), r("pytorch", "expandable_segments:False,rp2:[>:4]")];
        assert_eq!(labels(&results), ["pytorch (defaults)", "pytorch (rp2:[>:4])"]);
    }

    #[test]
    fn retries_are_a_summary_column_only_when_a_policy_retried() {
        let none = [PolicyResult::default()];
        assert_eq!(summary_for(&none).len(), SUMMARY.len());
        let some = [PolicyResult { alloc_retries: 2, ..Default::default() }];
        let keys: Vec<&str> = summary_for(&some).iter().map(|c| c.key).collect();
        assert_eq!(&keys[6..9], ["frees", "alloc_retries", "over_bound"]);
    }

    fn rows_result() -> PolicyResult {
        PolicyResult { fragmentation_at_peak: 0.5, ..Default::default() }
    }
}
