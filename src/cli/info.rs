//! `fragsim info`: what is in a trace, before replaying it.

use fragsim::error::Result;
use fragsim::trace::sites::printable;
use fragsim::trace::summary::{DeviceSummary, Summary};
use fragsim::trace::Action;
use fragsim::units::format_bytes;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Show what a trace holds: format, devices, streams, events by kind, sizes, peak live bytes.
///
/// Orphan frees are frees of blocks allocated before the recording began (a snapshot that
/// starts mid-run); peak live bytes counts the blocks allocated inside the trace.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace: PyTorch snapshot, Kineto JSON, RMM CSV, .fst or text (gzip accepted).
    #[arg(value_name = "TRACE")]
    trace: PathBuf,

    #[command(flatten)]
    output: super::FormatArgs,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let trace = super::read_trace(io, &args.trace, false)?;
    let format = args.output.format();
    // The table reads the start figures line by line with the recording's own (start_lines).
    let summary = match format {
        super::OutputFormat::Table => Summary::of(&trace),
        _ => fragsim::session::info(&trace),
    };
    let path = args.trace.display().to_string();
    super::print_as(&mut *io.out, format, &summary, csv, |s| {
        render(&path, s, &|d| start_lines(&trace, d)) + &newer_lines(&trace)
    })?;
    Ok(0)
}

/// The `info --format csv` header: every scalar key of a `devices` entry in the order the JSON
/// writes them, `by_action`'s counts as `by_action.NAME`; its lists (`streams`,
/// `size_histogram`) are left out, as a CSV field cannot hold one (the JSON has them).
fn csv_columns() -> Vec<String> {
    let mut out: Vec<String> = vec!["device".into(), "events".into()];
    out.extend(Action::ALL.iter().map(|a| format!("by_action.{}", a.name())));
    out.extend(
        [
            "free_action",
            "alloc_size_min",
            "alloc_size_max",
            "peak_live_bytes",
            "live_at_start_blocks",
            "live_at_start_bytes",
            "peak_live_with_start_bytes",
            "orphan_frees",
            "allocated_in_trace_live_at_end",
            "live_at_end_bytes",
            "first_time_us",
            "last_time_us",
            "time_span_us",
            "segments_at_dump",
            "reserved_at_dump_bytes",
        ]
        .map(String::from),
    );
    out
}

/// `info --format csv`: one row per device, [`csv_columns`] as header, each value as the JSON
/// writes it (`null` empty, text quoted where it must be), so the CSV and the JSON cannot
/// disagree on a number.
fn csv(summary: &Summary) -> String {
    let columns = csv_columns();
    let mut out = columns.join(",") + "\n";
    for d in &summary.devices {
        let json = serde_json::to_value(d).unwrap_or_default();
        let cells: Vec<String> = columns
            .iter()
            .map(|key| {
                let value = key.split('.').fold(&json, |v, part| &v[part]);
                match value {
                    serde_json::Value::String(t) => fragsim::report::csv::field(t),
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                }
            })
            .collect();
        out += &cells.join(",");
        out.push('\n');
    }
    out
}

/// What `device` held before its first event, next to peak live ([`fragsim::session::start_figures`]); then what
/// the recording says the real allocator held (Kineto's start totals, the recorded peaks).
fn start_lines(trace: &fragsim::trace::Trace, device: i32) -> Vec<String> {
    let start = fragsim::session::start_figures(trace, device);
    let (Some(blocks), Some(bytes)) = (start.live_at_start_blocks, start.live_at_start_bytes)
    else {
        return Vec::new();
    };
    let mut out = vec![format!("live at start: {} blocks, {}", count(blocks), format_bytes(bytes))];
    if let Some(peak) = start.peak_live_with_start_bytes {
        out.push(format!("peak live with them: {} (= bound's peak reserved)", format_bytes(peak)));
    }
    if let Some(k) = fragsim::recorded::kineto_start::start_state(trace, device) {
        out.push(format!(
            "kineto start:  {} allocated, {} reserved before the first event ({} in no event's free: one opaque block)",
            format_bytes(k.live_bytes),
            format_bytes(k.reserved_bytes),
            format_bytes(k.opaque_bytes)
        ));
        if k.mismatches > 0 {
            out.push(format!(
                "kineto check:  {} events where live at start plus the running sum of Bytes is not Total Allocated:",
                count(k.mismatches)
            ));
            out.extend(k.warnings.iter().map(|w| format!("  {w}")));
        }
    }
    if let Some(r) = fragsim::recorded::recorded(trace, device) {
        let allocated = r
            .peak_allocated_bytes
            .map_or(String::new(), |a| format!(", peak allocated {}", format_bytes(a)));
        out.push(format!(
            "recorded:      reserved {} at the first event, peak reserved {}{allocated}",
            format_bytes(r.reserved_at_start_bytes),
            format_bytes(r.peak_reserved_bytes)
        ));
        let limit = fragsim::recorded::limit::infer(trace, &r);
        if limit.limit_bytes.is_some() || !limit.consistent {
            out.push(format!("device limit:  {}", limit.describe()));
        }
    }
    out
}

/// What a snapshot records of releases after 2.11 (docs/pytorch-model.md#versions): the
/// release it shows, the pinned host allocator as a device of its own, labels, exact-address
/// allocations. Nothing for a recording without any of it.
fn newer_lines(trace: &fragsim::trace::Trace) -> String {
    use fragsim::policy::pytorch::config::ModelledVersion;
    let x = &trace.extras;
    let mut o = String::new();
    let m = ModelledVersion::of_trace(trace);
    if let Some(least) = m.at_least {
        let v = m.version;
        let _ = if least == v {
            writeln!(o, "PyTorch release: {v} ({})", m.why)
        } else {
            writeln!(o, "PyTorch release: ≥ {least} ({}); modelled {v}", m.why)
        };
    }
    if x.host_segments.is_some() || x.host_trace_entries.is_some() {
        let h = x.host_segments.unwrap_or_default();
        let plural =
            |n: u64, what: &str| format!("{} {what}{}", count(n), if n == 1 { "" } else { "s" });
        let _ = writeln!(
            o,
            "pinned host memory (host_segments): {}, {} reserved, {} allocated; host_traces: {}",
            plural(h.count, "segment"),
            format_bytes(h.reserved),
            format_bytes(h.allocated),
            x.host_trace_entries
                .map_or("none".to_string(), |n| plural(n, "entry").replace("entrys", "entries"))
        );
    }
    if x.annotate_entries > 0 {
        let _ = writeln!(
            o,
            "annotate entries: {} (labels on live allocations; they change no memory)",
            count(x.annotate_entries)
        );
    }
    if x.malloc_with_address > 0 {
        let _ = writeln!(
            o,
            "exact-address allocations (internal_metadata mallocWithAddress): {} prefix entries",
            count(x.malloc_with_address)
        );
    }
    if x.user_metadata > 0 {
        let _ = writeln!(o, "entries with user_metadata: {}", count(x.user_metadata));
    }
    o
}

/// The human summary.
fn render(path: &str, s: &Summary, extra: &dyn Fn(i32) -> Vec<String>) -> String {
    let mut o = render_head(path, s);
    for d in &s.devices {
        o.push('\n');
        render_device(&mut o, d, s.device == Some(d.device), &extra(d.device));
    }
    o.push('\n');
    if s.segments_at_dump > 0 || s.converted_from.unwrap_or(s.format) == "pytorch-snapshot" {
        let _ = writeln!(
            o,
            "segments at dump: {} ({} reserved)",
            count(s.segments_at_dump),
            format_bytes(s.reserved_at_dump_bytes)
        );
    }
    if s.private_pool_segments_at_dump > 0 {
        let _ = writeln!(
            o,
            "  in private pools (CUDA graphs, MemPool): {} ({} reserved)",
            count(s.private_pool_segments_at_dump),
            format_bytes(s.private_pool_reserved_at_dump_bytes)
        );
    }
    if let (Some(pools), Some(allocs), true) =
        (s.entry_private_pools, s.private_pool_allocs, s.pools_inferred)
    {
        let _ = writeln!(
            o,
            "pools inferred from recorded addresses: {} apart from the first, {} allocations in \
             them (requests that could not share its blocks: a CUDA graph's pool or another \
             stream; docs/pytorch-model.md#kineto-addresses)",
            count(pools),
            count(allocs)
        );
    } else if let (Some(pools), Some(allocs)) = (s.entry_private_pools, s.private_pool_allocs) {
        let _ = writeln!(
            o,
            "entries name their pool: {} private pools, {} allocations made into them",
            count(pools),
            count(allocs)
        );
    }
    render_settings(&mut o, s);
    o
}

/// The summary's first lines: the file, its format and size, and the platform it shows.
fn render_head(path: &str, s: &Summary) -> String {
    let mut o = String::new();
    let events: u64 = s.devices.iter().map(|d| d.events).sum();
    let _ = writeln!(o, "{}", printable(path));
    let _ = writeln!(
        o,
        "  format: {}{}, {} events on {} device{}, times {}",
        s.format,
        s.converted_from.map_or(String::new(), |f| format!(" (converted from {f})")),
        count(events),
        s.devices.len(),
        if s.devices.len() == 1 { "" } else { "s" },
        if s.has_times { "recorded" } else { "not recorded (event indices)" }
    );
    if let Some(p) = &s.platform {
        let shown = if p.name == "rocm" { "ROCm" } else { "CUDA" };
        let _ = writeln!(o, "  platform: {shown} ({})", p.why);
    }
    o
}

/// The allocator settings the trace recorded.
fn render_settings(o: &mut String, s: &Summary) {
    match &s.allocator_settings {
        Some(a) => {
            let split = a.max_split_size.map_or("unlimited".to_string(), format_bytes);
            let _ = writeln!(
                o,
                "allocator settings: conf {:?}, expandable_segments {}, max_split_size {split}, \
                 garbage_collection_threshold {}, roundup_power2_divisions {:?}",
                a.conf.as_deref().unwrap_or(""),
                a.expandable_segments,
                a.garbage_collection_threshold,
                a.roundup_power2_divisions
            );
        }
        None => {
            let _ = writeln!(o, "allocator settings: not recorded");
        }
    }
}

fn render_device(o: &mut String, d: &DeviceSummary, default: bool, extra: &[String]) {
    let name = if d.device == -1 {
        "device -1 (host)".to_string()
    } else {
        format!("device {}", d.device)
    };
    let _ = writeln!(
        o,
        "{name}{}: {} events",
        if default { " (default for --device)" } else { "" },
        count(d.events)
    );
    let kinds: Vec<String> = Action::ALL
        .iter()
        .filter(|&&a| d.by_action.get(a) > 0)
        .map(|&a| format!("{} {}", count(d.by_action.get(a)), a.name()))
        .collect();
    let _ = writeln!(o, "  events:        {}", kinds.join(", "));
    let streams: Vec<String> = d.streams.iter().map(|s| format!("{s:#x}")).collect();
    let _ = writeln!(o, "  streams:       {}", streams.join(", "));
    if let (Some(min), Some(max)) = (d.alloc_size_min, d.alloc_size_max) {
        let _ = writeln!(o, "  alloc sizes:   {} .. {}", format_bytes(min), format_bytes(max));
    }
    let _ = writeln!(
        o,
        "  peak live:     {} (blocks allocated in the trace, frees at {})",
        format_bytes(d.peak_live_bytes),
        d.free_action
    );
    for line in extra {
        let _ = writeln!(o, "  {line}");
    }
    let _ = writeln!(
        o,
        "  orphan frees:  {} (blocks allocated before the trace began)",
        count(d.orphan_frees)
    );
    let _ = writeln!(
        o,
        "  live at end:   {} blocks, {}",
        count(d.allocated_in_trace_live_at_end),
        format_bytes(d.live_at_end_bytes)
    );
    render_span(o, d);
}

/// When the device's events happened, and its segments at the dump.
fn render_span(o: &mut String, d: &DeviceSummary) {
    if let (Some(first), Some(span)) = (d.first_time_us, d.time_span_us) {
        let _ = writeln!(
            o,
            "  time span:     {:.6} s (from {first} µs to {} µs)",
            span as f64 / 1e6,
            d.last_time_us.unwrap_or(first)
        );
    }
    if d.segments_at_dump > 0 {
        let _ = writeln!(
            o,
            "  segments:      {} at dump, {} reserved",
            count(d.segments_at_dump),
            format_bytes(d.reserved_at_dump_bytes)
        );
    }
    render_histogram(o, d);
}

/// The device's allocation sizes by power of two, as bars.
fn render_histogram(o: &mut String, d: &DeviceSummary) {
    if !d.size_histogram.is_empty() {
        let _ = writeln!(o, "  alloc sizes by power of two:");
        let widest = d.size_histogram.iter().map(|b| b.count).max().unwrap_or(1).max(1);
        for b in &d.size_histogram {
            let bar = "#".repeat(((b.count * 30).div_ceil(widest)) as usize);
            let _ = writeln!(
                o,
                "    {:>12} .. <{:<12} {:>9} allocs {:>12}  {bar}",
                format_bytes(b.min_bytes),
                format_bytes(b.max_bytes.saturating_add(1)),
                count(b.count),
                format_bytes(b.bytes)
            );
        }
    }
}

/// `26770` → `26,770`.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a `devices` entry that `info --format csv` leaves out.
    const LISTS: [&str; 2] = ["streams", "size_histogram"];

    #[test]
    fn csv_columns_are_a_device_entrys_scalar_keys_in_order() {
        let text = b"alloc 0x1000 4096 s0\nfree 0x1000 4096 s0\nalloc 0x2000 100 s1\n";
        let trace = fragsim::trace::read_memory(text, &Default::default()).unwrap();
        let summary = Summary::of(&trace);
        let written = serde_json::to_string(&summary.devices[0]).unwrap();
        let entry: serde_json::Value = serde_json::from_str(&written).unwrap();
        let mut keys: Vec<String> = Vec::new();
        for (k, v) in entry.as_object().unwrap() {
            match v {
                serde_json::Value::Array(_) => assert!(LISTS.contains(&k.as_str()), "{k}"),
                serde_json::Value::Object(o) => {
                    keys.extend(o.keys().map(|n| format!("{k}.{n}")));
                }
                _ => keys.push(k.clone()),
            }
        }
        let mut columns = csv_columns();
        let mut last = 0;
        for c in &columns {
            let mut at = 0;
            for part in c.split('.') {
                at += written[at..].find(&format!("\"{part}\":")).unwrap();
            }
            assert!(at > last || c == "device", "{c} is out of the JSON's order");
            last = at;
        }
        keys.sort_unstable();
        columns.sort_unstable();
        assert_eq!(columns, keys);
        let csv = csv(&summary);
        let rows: Vec<&str> = csv.lines().collect();
        assert_eq!(rows.len(), 2, "{csv}");
        // Device 0: 4 events (the text free is requested and completed), 2 allocs.
        assert!(rows[1].starts_with("0,4,2,1,1,"), "{csv}");
    }

    #[test]
    fn the_interface_document_lists_the_csv_columns_in_order() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/interface.md"))
                .unwrap();
        let section = doc.split("`info --format csv` prints one row").nth(1).unwrap();
        let list = section.split(": ").nth(1).unwrap().split(". ").next().unwrap();
        let listed: Vec<&str> = list.split('`').skip(1).step_by(2).collect();
        assert_eq!(listed, csv_columns());
    }

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(26770), "26,770");
        assert_eq!(count(1234567), "1,234,567");
    }
}
