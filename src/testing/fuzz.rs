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
