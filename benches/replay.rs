//! Replay speed: events per second through every online policy, next to a null replay.
//!
//! Input: the largest real snapshot (`traces/real/cs336-medium-ctx512-train.pickle`, shipped with
//! the repository), its events repeated until there are at least 1 M, replayed by the same path
//! the CLI uses (`policy::lookup(..).run(..)`, the input prepared once as `replay` does).
//!
//! `null` is the floor any replay pays: the same events through a hash map of live addresses
//! (insert at alloc, remove at the free that takes effect), with the running requested bytes and
//! their peak. Goals (issue 12): `pytorch` within 3× of `null`, every online policy within 3× of
//! `pytorch`. `bound` is the floor of reserved bytes, not of replay time: every request is its own
//! device allocation, so it pays the simulated device's ordered segment map (an insert and a
//! removal per block) besides its own map of live blocks, and costs more than `pytorch`. The
//! engine's own share is not a bench of its own: callgrind on `pytorch` separates it
//! (docs/performance.md#replay-speed).
//! Run with `cargo bench --bench replay`; criterion prints events per second per policy.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::trace::lifetimes::{free_action, AddrMap};
use fragsim::trace::{read_trace, Action, DeviceTrace, Event, ReadOptions, Trace};
use std::path::Path;
use std::time::Duration;

const TRACE: &str = "traces/real/cs336-medium-ctx512-train.pickle";
const MIN_EVENTS: usize = 1_000_000;

/// The policies timed: `bound` (the floor of reserved bytes) and every online policy.
const POLICIES: [&str; 8] =
    ["bound", "pytorch", "pytorch-expandable", "buddy", "bfc", "rmm-pool", "nocache", "stitch"];

/// The trace with its device-0 events repeated to at least [`MIN_EVENTS`].
fn repeated() -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    let trace = read_trace(&path, &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let device = trace.default_device().expect("the trace has events");
    let events = &trace.device(device).expect("its default device").events;
    let mut all = Vec::with_capacity(MIN_EVENTS + events.len());
    while all.len() < MIN_EVENTS {
        all.extend_from_slice(events);
    }
    Trace { devices: vec![DeviceTrace { device, events: all }], ..trace }
}

/// The null replay: live addresses in a hash map, requested bytes and their peak.
fn null_replay(events: &[Event], frees_at: Action) -> u64 {
    let mut live: AddrMap<u64> = AddrMap::default();
    let (mut requested, mut peak) = (0u64, 0u64);
    for e in events {
        if e.action == Action::Alloc && e.size > 0 {
            if let Some(old) = live.insert(e.addr, e.size) {
                requested -= old;
            }
            requested += e.size;
            peak = peak.max(requested);
        } else if e.action == frees_at {
            if let Some(size) = live.remove(&e.addr) {
                requested -= size;
            }
        }
    }
    peak
}

fn replay(c: &mut Criterion) {
    let trace = repeated();
    let input = ReplayInput::new(&trace, None).expect("the trace has a device");
    let options = ReplayOptions::default();
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(input.loaded_events().unwrap_or_default().len() as u64));
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let frees_at = free_action(input.loaded_events().unwrap_or_default());
    group.bench_function("null", |b| {
        b.iter(|| null_replay(input.loaded_events().unwrap_or_default(), frees_at))
    });
    for name in POLICIES {
        let spec = PolicySpec::parse_list(name).expect("a built-in policy").remove(0);
        let info = policy::lookup(name).expect("a built-in policy");
        group.bench_function(name, |b| {
            b.iter(|| {
                let out = info.run(&spec, &input, &options).expect("replay succeeds");
                std::hint::black_box(out.result.peak_reserved_bytes)
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = replay
}
criterion_main!(benches);
