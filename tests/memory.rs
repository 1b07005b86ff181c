//! Memory while reading: every format is read from a file through a counting allocator, which
//! shows what reading holds at its peak and what the loaded trace holds after, per event. And
//! memory while replaying a streamed `.fst`: the peak does not grow with the trace's length.
//!
//! Its own test binary, because the counting allocator counts every thread of the process.
//! Run with `--nocapture` to see the bytes per event of each format.

use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::trace::fst::FstStream;
use fragsim::trace::{
    read_trace, write_trace, Action, DeviceTrace, Event, ReadOptions, RecordedTotals, Trace,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// The system allocator, counting the bytes it holds and the most it held.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = HELD.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as if the old and the new block coexist while the content moves.
        grew(new_size);
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        HELD.fetch_sub(layout.size(), Relaxed);
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each test while it measures: the counts are the whole process's.
static MEASURING: Mutex<()> = Mutex::new(());

/// `n` events on device 0: allocations and their two-step frees, with times.
fn trace(n: usize) -> Trace {
    let events = (0..n)
        .map(|i| {
            let block = (i / 3) as u64;
            let action = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted][i % 3];
            Event::new(action, 0x7f00_0000_0000 + block * 4096, 512 * (1 + block % 64), 0, i as i64)
        })
        .collect();
    Trace { devices: vec![DeviceTrace { device: 0, events }], has_times: true, ..Trace::default() }
}

/// What reading `path` held at its peak and what the trace holds after, in bytes, and the
/// number of events read.
/// The recorded totals (Kineto's own figures, 16 bytes an event) are not counted in what the
/// trace holds: like frames, they are what the file recorded beside the events.
fn measure(path: &std::path::Path) -> (usize, usize, usize) {
    let before = HELD.load(Relaxed);
    PEAK.store(before, Relaxed);
    let trace = read_trace(path, &ReadOptions::default()).expect("reads");
    let peak = PEAK.load(Relaxed) - before;
    let totals: usize = trace
        .recorded_totals
        .iter()
        .map(|t| t.totals.capacity() * std::mem::size_of::<RecordedTotals>())
        .sum();
    let held = HELD.load(Relaxed) - before - totals;
    let events = trace.devices.iter().map(|d| d.events.len()).sum();
    drop(trace);
    (peak, held, events)
}

/// What a streamed read may hold beside the events, whatever the trace's length: the file and
/// inflater buffers, the 64 KiB head, one .fst record, one text or CSV line, one batch of
/// snapshot entries, or serde_json's scratch buffer. Less than a 300,000-event text file (10 MB)
/// or snapshot pickle (22 MB), so a reader that held the file would fail.
const BUFFER: usize = 6 << 20;

#[test]
fn reading_holds_the_events_and_a_bounded_buffer() {
    let _alone = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    const N: usize = 300_000;
    let dir = tempfile::tempdir().expect("temp dir");
    let t = trace(N);
    println!("{:<10} {:>10} {:>14} {:>16}", "format", "events", "held B/event", "peak B/event");
    for name in ["t.fst", "t.fst.gz", "t.txt", "t.txt.gz", "t.pickle", "t.json", "t.csv"] {
        let path = dir.path().join(name);
        write_trace(&t, &path).expect("writes");
        let (peak, held, events) = measure(&path);
        // Kineto and RMM logs record a free once: their readers give the two-step free as one.
        assert!(events == N || events == N / 3 * 2, "{name}: {events} events");
        let (held_per, peak_per) = (held as f64 / events as f64, peak as f64 / events as f64);
        println!("{name:<10} {events:>10} {held_per:>14.1} {peak_per:>16.1}");
        assert!(held_per <= 40.5, "{name}: the loaded trace holds {held_per:.1} bytes an event");
        let bound = if name.contains("fst") {
            // The head declares the counts: the events, plus one record being decoded.
            held + BUFFER
        } else if name.contains("txt") || name.contains("csv") || name.contains("pickle") {
            // The count is known only at the end: the vector doubles as it grows, and holds
            // its old and new copy while it moves (1.5 × its last capacity), plus the buffers
            // (for a snapshot, one batch of 1000 entries as decoded, and the memo entries that
            // survive each batch, neither of which grows with the trace).
            3 * (events.next_power_of_two() * std::mem::size_of::<Event>()) / 2 + BUFFER
        } else if name.contains("json") {
            // Sorted by time before they are split by device: while read, each event is held
            // with its float time, device and totals (twice an event) in a doubling vector,
            // which is still there while the device vectors (doubling too) are filled.
            3 * (3 * events.next_power_of_two() * std::mem::size_of::<Event>()) / 2 + BUFFER
        } else {
            unreachable!("{name}: every format has its bound above");
        };
        assert!(peak <= bound, "{name}: reading held {peak} bytes at its peak, over {bound}");
    }
}

/// `n` events of a steady training-like run on fresh addresses (as `synth` records them): each
/// step allocates a block and frees the one allocated 64 steps before, in two steps; every 1000
/// events the program calls `empty_cache()` (a recorded `segment_free`). What is live stays the
/// same however long the run.
fn steady(n: usize) -> Trace {
    let mut events = Vec::with_capacity(n);
    let addr = |k: usize| 0x7f00_0000_0000 + k as u64 * 4096;
    let size = |k: usize| 512 * (1 + (k as u64 * 7) % 64);
    let mut k = 0;
    while events.len() < n {
        events.push(Event::new(Action::Alloc, addr(k), size(k), 0, events.len() as i64));
        if k >= 64 {
            for a in [Action::FreeRequested, Action::FreeCompleted] {
                events.push(Event::new(a, addr(k - 64), size(k - 64), 0, events.len() as i64));
            }
        }
        if k % 333 == 332 {
            events.push(Event::new(Action::SegmentFree, 0x10_0000_0000, 2 << 20, 0, k as i64));
        }
        k += 1;
    }
    events.truncate(n);
    Trace { devices: vec![DeviceTrace { device: 0, events }], has_times: true, ..Trace::default() }
}

/// The most a `pytorch` replay of the .fst at `path`, streamed, held at once (pre-passes
/// included), and the peak it found.
fn streamed_replay_peak(path: &std::path::Path) -> (usize, u64) {
    let before = HELD.load(Relaxed);
    PEAK.store(before, Relaxed);
    let file = FstStream::open(path).expect("opens").expect("streams");
    let input = ReplayInput::streamed(&file, None).expect("prepares");
    let spec = PolicySpec { name: "pytorch".into(), options: String::new() };
    let out = policy::lookup("pytorch")
        .and_then(|p| p.run(&spec, &input, &ReplayOptions::default()))
        .expect("replays");
    assert_eq!(out.detail.events, input.event_count());
    drop(input);
    drop(file);
    (PEAK.load(Relaxed) - before, out.result.peak_reserved_bytes)
}

/// What a streamed replay may hold more for a 10× longer trace: nothing grows with the events,
/// so only noise (hash tables meeting a growth point at another moment).
const STREAM_SLACK: usize = 256 << 10;

#[test]
fn a_streamed_replay_holds_the_same_for_any_length() {
    let _alone = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let mut peaks = Vec::new();
    for n in [100_000, 1_000_000] {
        let path = dir.path().join(format!("{n}.fst"));
        write_trace(&steady(n), &path).expect("writes");
        let (held, peak) = streamed_replay_peak(&path);
        println!(
            "{n:>9} events: replay held at most {held} bytes ({:.2} B/event)",
            held as f64 / n as f64
        );
        peaks.push((n, held, peak));
    }
    let (short, long) = (peaks[0], peaks[1]);
    assert_eq!(short.2, long.2, "the same steady state reaches the same peak");
    assert!(
        long.1 <= short.1 + STREAM_SLACK,
        "{} events held {} bytes, {} events {}: memory grows with the length",
        long.0,
        long.1,
        short.0,
        short.1
    );
    // Loading the longer trace alone would take 40 bytes an event.
    assert!(long.1 < long.0 * 40 / 10, "{} bytes for {} events", long.1, long.0);
}

/// The most a session opened to stream the .fst at `path` held at once while it answered a
/// replay of `pytorch` and `bfc` (the question `sweep` and `check` ask of each trace), and the
/// pytorch row's peak.
fn session_replay_peak(path: &std::path::Path) -> (usize, u64) {
    use fragsim::session::{OpenOptions, ReplayRequest, Session};
    let before = HELD.load(Relaxed);
    PEAK.store(before, Relaxed);
    let open = OpenOptions { stream: true, ..OpenOptions::default() };
    let session = Session::open(path, &open).expect("opens");
    assert!(session.is_streamed());
    let specs = PolicySpec::parse_many(&["pytorch".into(), "bfc".into()]).expect("specs");
    let answer = session.replay(&ReplayRequest::new(specs), &Default::default()).expect("replays");
    let peak =
        answer.results.iter().find(|r| r.policy == "pytorch").expect("row").peak_reserved_bytes;
    drop(answer);
    drop(session);
    (PEAK.load(Relaxed) - before, peak)
}

/// What the replays of a streamed session may hold in flight beside their own state: the
/// shared reader feeds each replay through a channel of at most 4 chunks of 16,384 events
/// (`replay::lockstep`), full or not depending on which thread runs ahead.
const IN_FLIGHT_PER_REPLAY: usize = 4 * 16_384 * std::mem::size_of::<Event>();

#[test]
fn a_streamed_session_answers_in_the_same_memory_for_any_length() {
    let _alone = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let mut seen = Vec::new();
    for n in [300_000, 3_000_000] {
        let path = dir.path().join(format!("{n}.fst"));
        write_trace(&steady(n), &path).expect("writes");
        seen.push((n, session_replay_peak(&path)));
    }
    let ((short_n, (short_held, short_peak)), (long_n, (long_held, long_peak))) =
        (seen[0], seen[1]);
    assert_eq!(short_peak, long_peak, "the same steady state reaches the same peak");
    let slack = STREAM_SLACK + 2 * IN_FLIGHT_PER_REPLAY;
    assert!(
        long_held <= short_held + slack,
        "{long_n} events held {long_held} bytes, {short_n} events {short_held}: memory grows"
    );
    // Loading the longer trace alone would take 40 bytes an event.
    assert!(long_held < long_n * 40 / 10, "{long_held} bytes for {long_n} events");
}
