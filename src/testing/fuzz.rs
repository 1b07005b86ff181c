//! The bodies of the fuzz targets in `fuzz/`, kept in the library so that every finding becomes
//! a regression test in the normal suite that calls the very same function with the input that
//! failed. Each function panics (as an `assert!` does) only on a real defect: a reader that
//! accepts what the limits forbid, a writer that fails on a trace within them, a round trip that
//! changes events without saying so, or a policy that panics. Errors are expected outcomes.

use crate::policy::{self, PolicySpec};
use crate::replay::{run_spec, ReplayInput, ReplayOptions};
use crate::trace::{
    limits, read_bytes, write_to, Action, DeviceTrace, Event, Format, ReadOptions, Trace, FORMATS,
};

/// The options the fuzz targets read with: frames kept, no progress bar, a 64 MiB cap.
fn options() -> ReadOptions {
    ReadOptions { keep_frames: true, max_input_bytes: Some(64 << 20), ..ReadOptions::default() }
}

/// Reads `data` as `format`: an error, or a trace within the limits that every writer can write.
pub fn read(data: &[u8], format: Format) {
    let Ok(trace) = read_bytes(data, format, &options()) else { return };
    if let Err(e) = limits::check_trace(&trace) {
        panic!("the {} reader accepted a trace outside the limits: {e}", format.name());
    }
    for row in &FORMATS {
        let mut out = Vec::new();
        if let Err(e) = write_to(&trace, row.format, &mut out) {
            panic!("read as {}, cannot be written as {}: {e}", format.name(), row.name);
        }
    }
}

/// Reads `data[1..]` in the format `data[0]` picks, then writes it in every format and reads it
/// back: the events must be equal wherever the format's `losses` reports nothing lost.
pub fn round_trip(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let from = FORMATS[pick as usize % FORMATS.len()].format;
    let Ok(trace) = read_bytes(rest, from, &options()) else { return };
    for row in &FORMATS {
        if let Err(m) = round_trip_one(&trace, row.format) {
            panic!("{} -> {}: {m}", from.name(), row.name);
        }
    }
}

/// Writes `trace` as `to` and reads it back; `Err` says what changed without a loss note.
pub fn round_trip_one(trace: &Trace, to: Format) -> Result<(), String> {
    let mut bytes = Vec::new();
    write_to(trace, to, &mut bytes).map_err(|e| format!("write failed: {e}"))?;
    let back = read_bytes(&bytes, to, &options()).map_err(|e| format!("read back failed: {e}"))?;
    if !(to.info().losses)(trace).is_empty() {
        return Ok(());
    }
    let events = |t: &Trace| -> Vec<(i32, Vec<Event>)> {
        t.devices
            .iter()
            .filter(|d| !d.events.is_empty())
            .map(|d| {
                let mut ev = d.events.clone();
                if !to.info().keeps_frames {
                    ev.iter_mut().for_each(|e| e.frames = Default::default());
                }
                (d.device, ev)
            })
            .collect()
    };
    let (want, got) = (events(trace), events(&back));
    if want != got {
        let first = want.iter().zip(&got).find(|(a, b)| a != b);
        return Err(format!(
            "events differ with no loss note ({} devices before, {} after; first difference: {:?})",
            want.len(),
            got.len(),
            first.map(|(a, b)| (a.0, b.0, a.1.len(), b.1.len()))
        ));
    }
    if trace.has_times != back.has_times && want.iter().any(|(_, e)| !e.is_empty()) {
        return Err("has_times changed with no loss note".into());
    }
    Ok(())
}

/// A little-endian cursor over fuzz bytes that yields zeros once they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, i| v | (self.u8() as u64) << (8 * i))
    }

    /// A size or address that favours small values, powers of two and the limits' edges.
    fn amount(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => 0,
            1 => self.u8() as u64 * 512,
            2 => (self.u8() as u64 + 1) << 20,
            3 => 1 << (self.u8() % 61),
            4 => limits::SIZE_LIMIT - 1 - self.u8() as u64,
            5 => (1 << 59) + self.u8() as u64 * 512,
            6 => self.u64() % limits::SIZE_LIMIT,
            _ => self.u8() as u64 * 4096 + self.u8() as u64,
        }
    }
}

/// The most events one replay input holds, so one run stays fast.
const MAX_REPLAY_EVENTS: usize = 200;

/// Builds a one-device trace from `data` (an optional capacity, then events whose addresses reuse
/// earlier ones often) and replays it through every policy, checking invariants after each event.
pub fn replay(data: &[u8]) {
    let mut b = Bytes(data);
    let capacity = match b.u8() % 4 {
        0 => None,
        1 => Some(b.amount()),
        2 => Some((b.u8() as u64) << 20),
        _ => Some(b.u64()),
    };
    let mut addrs: Vec<u64> = Vec::new();
    let mut events = Vec::new();
    while !b.0.is_empty() && events.len() < MAX_REPLAY_EVENTS {
        let action = Action::ALL[b.u8() as usize % Action::ALL.len()];
        let addr = match (b.u8() % 3, addrs.is_empty()) {
            (0 | 1, false) => addrs[b.u8() as usize % addrs.len()],
            _ => b.amount(),
        };
        let size = b.amount();
        let stream = (b.u8() % 4) as u64;
        let event = Event::new(action, addr, size, stream, events.len() as i64);
        // The readers' boundary: what fails the limits never reaches a policy.
        if limits::check_event(&event).is_ok() {
            addrs.push(addr);
            events.push(event);
        }
    }
    let trace = Trace {
        format: Format::Text,
        devices: vec![DeviceTrace { device: 0, events }],
        ..Trace::default()
    };
    replay_trace(&trace, capacity);
}

/// Replays `trace`'s default device through every built-in policy (invariants checked after
/// every event) with `capacity`; errors are fine, panics are not.
pub fn replay_trace(trace: &Trace, capacity: Option<u64>) {
    let Ok(input) = ReplayInput::new(trace, None) else { return };
    let options = ReplayOptions { capacity, check_invariants: true, ..ReplayOptions::default() };
    for name in policy::names() {
        let spec = PolicySpec { name: name.to_string(), options: String::new() };
        let _ = run_spec(&spec, &input, &options);
    }
}

/// Writes `data` to a file and streams it as a `.fst` (what `replay` does with an uncompressed
/// file of this version): opening, the pre-passes and a streamed `pytorch` and `bfc` replay must never
/// panic, a file that streams must load, and both replays must give the same result.
pub fn stream_fst(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("fragsim-fuzz-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let path = dir.join("input.fst");
    if std::fs::write(&path, data).is_ok() {
        stream_fst_file(&path, data);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// [`stream_fst`] once `data` is at `path`.
fn stream_fst_file(path: &std::path::Path, data: &[u8]) {
    use crate::trace::fst::FstStream;
    let Ok(Some(file)) = FstStream::open(path) else { return };
    let Ok(streamed) = ReplayInput::streamed(&file, None) else { return };
    // The first pre-pass checks the whole file as loading does: what streams, loads.
    let loaded_trace = match read_bytes(data, Format::Fst, &options()) {
        Ok(t) => t,
        Err(e) => panic!("streamed, but the loader refuses the same bytes: {e}"),
    };
    let loaded = ReplayInput::new(&loaded_trace, Some(streamed.device())).ok();
    let options = ReplayOptions::default();
    for name in ["pytorch", "bfc"] {
        let spec = PolicySpec { name: name.to_string(), options: String::new() };
        let got = run_spec(&spec, &streamed, &options);
        if let (Ok(got), Some(loaded)) = (got, &loaded) {
            let Ok(want) = run_spec(&spec, loaded, &options) else { continue };
            let untimed = |mut r: crate::metrics::PolicyResult| {
                r.replay_seconds = 0.0;
                r
            };
            assert_eq!(untimed(got.result), untimed(want.result), "streamed and loaded {name}");
        }
    }
}

/// The trace `data[1..]` holds in the format `data[0]` picks (low bits), as the fuzz targets of
/// the commands that read one trace read it.
fn picked_trace(data: &[u8]) -> Option<(u8, Trace)> {
    let (&pick, rest) = data.split_first()?;
    let format = FORMATS[pick as usize % FORMATS.len()].format;
    read_bytes(rest, format, &options()).ok().map(|t| (pick, t))
}

/// Reads `data[1..]` in the format `data[0]` picks and breaks its replays down as `blame` does
/// (the recorded run, `pytorch` and `bfc`) at a moment and by a grouping `data[0]` picks: an
/// error, or a breakdown whose sums hold as `blame --format json` promises (live, rounding and
/// cached free bytes add up to reserved; the sites' and the holes' bytes add up to them).
/// True when a breakdown was made and checked.
pub fn blame(data: &[u8]) -> bool {
    let Some((pick, trace)) = picked_trace(data) else { return false };
    blame_trace(&trace, pick)
}

/// The groupings `blame --by` and `diff --by` offer.
const GROUPINGS: [crate::blame::GroupBy; 5] = {
    use crate::blame::GroupBy::*;
    [Site, Function, File, Stream, Size]
};

/// [`blame`] on a trace already read; `pick` chooses the moment and the grouping.
pub fn blame_trace(trace: &Trace, pick: u8) -> bool {
    use crate::blame::{BlameOptions, Moment};
    let Ok(input) = ReplayInput::new(trace, None) else { return false };
    // Every moment but `oom`, which a replay without a capacity never reaches.
    let events = crate::blame::events(&input).len().max(1) as u64;
    let at = match (pick >> 4) % 3 {
        0 => Moment::Peak,
        1 => Moment::PeakLive,
        _ => Moment::Event(u64::from(pick) % events),
    };
    let by = GROUPINGS[(pick >> 2) as usize % GROUPINGS.len()];
    let options = BlameOptions {
        at,
        by,
        top: (pick % 3) as usize,
        depth: 1 + (pick % 2) as usize,
        ..BlameOptions::default()
    };
    let specs: Vec<PolicySpec> = ["pytorch", "bfc"]
        .iter()
        .map(|n| PolicySpec { name: n.to_string(), options: String::new() })
        .collect();
    let Ok(results) = crate::blame::blame(&input, &specs, &options) else { return false };
    for r in &results {
        let what = format!("{} at {:?} by {}", r.policy, options.at, by.name());
        assert_eq!(
            r.live_bytes + r.rounding_bytes + r.cached_free_bytes,
            r.reserved_bytes,
            "{what}: live + rounding + cached free"
        );
        assert_eq!(
            r.sites.iter().map(|s| s.live_bytes).sum::<u64>(),
            r.live_bytes,
            "{what}: sites"
        );
        assert_eq!(
            r.sites.iter().map(|s| s.rounding_bytes).sum::<u64>(),
            r.rounding_bytes,
            "{what}: sites' rounding"
        );
        for holes in [&r.holes_by_segment_site, &r.holes_by_last_free_site] {
            let free: u64 = holes.iter().map(|h| h.cached_free_bytes).sum();
            assert_eq!(free, r.cached_free_bytes, "{what}: holes");
        }
    }
    true
}

/// Reads two traces from `data` as `diff A B` does — `data[0]` picks A's format (low bits) and
/// B's (high bits), `data[1]` the grouping and B's policy, `data[2..6]` (little-endian) how many
/// of the bytes after them are A's — and compares their replays: an error, or a diff whose sites'
/// deltas add up to the live delta, with a note exactly when the traces name sites differently
/// and the grouping needs frames. True when a diff was made and checked.
pub fn diff(data: &[u8]) -> bool {
    let [formats, pick, l0, l1, l2, l3, rest @ ..] = data else { return false };
    let len_a = (u32::from_le_bytes([*l0, *l1, *l2, *l3]) as usize).min(rest.len());
    let (a, b) = rest.split_at(len_a);
    let format = |p: u8| FORMATS[p as usize % FORMATS.len()].format;
    let Ok(ta) = read_bytes(a, format(formats & 0x0f), &options()) else { return false };
    let Ok(tb) = read_bytes(b, format(formats >> 4), &options()) else { return false };
    diff_traces(&ta, &tb, *pick)
}

/// `diff`'s fuzz input for traces `a` (in `FORMATS[format_a]`) and `b`: the inverse of
/// [`diff`]'s layout, for seeding a corpus and for tests.
pub fn diff_input(format_a: u8, a: &[u8], format_b: u8, b: &[u8], pick: u8) -> Vec<u8> {
    let mut out = vec![(format_a & 0x0f) | (format_b << 4), pick];
    out.extend_from_slice(&(a.len() as u32).to_le_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// [`diff`] on two traces already read; `pick` chooses the grouping and the policies.
pub fn diff_traces(a: &Trace, b: &Trace, pick: u8) -> bool {
    use crate::blame::diff::{diff, Side};
    use crate::blame::{BlameOptions, Moment};
    let (Ok(input_a), Ok(input_b)) = (ReplayInput::new(a, None), ReplayInput::new(b, None)) else {
        return false;
    };
    let by = GROUPINGS[pick as usize % GROUPINGS.len()];
    let spec = |n: &str| PolicySpec { name: n.to_string(), options: String::new() };
    let spec_b = if pick & 0x80 == 0 { spec("pytorch") } else { spec("bfc") };
    let side_a = Side { trace: "a".into(), input: &input_a, spec: spec("pytorch") };
    let side_b = Side { trace: "b".into(), input: &input_b, spec: spec_b };
    let options = BlameOptions {
        at: Moment::PeakLive,
        by,
        top: (pick >> 5) as usize % 3,
        ..BlameOptions::default()
    };
    let Ok(r) = diff(&side_a, &side_b, &options) else { return false };
    let delta: i64 = r.sites.iter().map(|s| s.delta_bytes).sum();
    assert_eq!(
        delta,
        r.delta.peak_live_bytes,
        "sites' deltas against the live delta by {}",
        by.name()
    );
    assert!(r.matched.len() as u64 <= r.matched_count, "matched pairs listed beyond those counted");
    let rule = |t: &Trace| t.frames.is_empty();
    let unlike = rule(a) != rule(b)
        && matches!(
            by,
            crate::blame::GroupBy::Site
                | crate::blame::GroupBy::Function
                | crate::blame::GroupBy::File
        );
    assert_eq!(r.note.is_some(), unlike, "a note exactly on unlike sites: {:?}", r.note);
    true
}
