//! Replay speed: events per second through the PyTorch policy, with `bound` as a near-null
//! baseline (its per-event work is one map insert or remove plus one device call).
//!
//! Input: the largest real snapshot (`traces/real/cs336-medium-ctx512-train.pickle`, shipped with
//! the repository), its events repeated until there are at least 1 M, replayed by the same path
//! the CLI uses (`policy::lookup(..).run(..)`). Goal: ≥ 20 M events/s on one core for `pytorch`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::trace::{read_trace, DeviceTrace, ReadOptions, Trace};
use std::path::Path;

const TRACE: &str = "traces/real/cs336-medium-ctx512-train.pickle";
const MIN_EVENTS: usize = 1_000_000;

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

fn replay(c: &mut Criterion) {
    let trace = repeated();
    let input = ReplayInput::new(&trace, None).expect("the trace has a device");
    let options = ReplayOptions::default();
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(input.events.len() as u64));
    group.sample_size(10);
    for name in ["pytorch", "bound"] {
        let spec = PolicySpec::parse_list(name).expect("a built-in policy").remove(0);
        let info = policy::lookup(name).expect("a built-in policy");
        group.bench_function(name, |b| {
            b.iter(|| info.run(&spec, &input, &options).expect("replay succeeds"))
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
