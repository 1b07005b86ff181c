//! Replay speed per policy: events per second on a seeded synthetic workload and on a real
//! snapshot.
//!
//! `replay_policy`: 120,000 events built directly as [`Event`]s (allocs and frees over three
//! streams, sizes skewed small with some tens-of-MiB blocks and long-lived weights, frees
//! picked at random among the live blocks) and replayed through `policy::lookup(name).run`,
//! exactly as `fragsim replay` does, so the number includes the engine and, for `offline`, its
//! planning. `replay_policy_real`: the same for every policy on the largest real snapshot
//! (`traces/real/cs336-medium-ctx512-train.pickle`, shipped with the repository, 22,332 events),
//! whose lifetimes nest as a training step's do. `offline_plan`: the
//! `offline` planner alone on both, so its planning and its replay can be told apart.
//! Allocator quality (peaks) is a fragsim output, not a bench. Run with `cargo bench --bench
//! policies`; criterion reports time per iteration and elements (events) per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fragsim::policy::offline::Offline;
use fragsim::policy::{self, Policy, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::testing::Rng;
use fragsim::trace::{read_trace, Action, DeviceTrace, Event, ReadOptions, Trace};
use std::path::Path;

/// The real snapshot of `replay_policy_real`, relative to the crate.
const REAL: &str = "traces/real/cs336-medium-ctx512-train.pickle";

/// About `n` events: 300 long-lived "weights", then activations allocated and freed with a
/// bounded live set, sizes 512 B to 64 MiB.
fn workload(n: usize) -> Vec<Event> {
    let mut rng = Rng::new(0x5eed_1234_abcd_ef01);
    let mut events = Vec::with_capacity(n + 1024);
    let mut next_addr = 0x1000_0000u64;
    let mut live: Vec<(u64, u64, u64)> = Vec::new();
    let mut t = 0i64;
    let mut push = |events: &mut Vec<Event>, a, addr, size, stream| {
        events.push(Event::new(a, addr, size, stream, t));
        t += 1;
    };
    for _ in 0..300 {
        let size = (1 + rng.below(64)) * (256 << 10);
        push(&mut events, Action::Alloc, next_addr, size, 0);
        next_addr += 1 << 30;
    }
    while events.len() < n {
        let free = !live.is_empty() && (live.len() > 600 || rng.below(100) < 48);
        if free {
            let i = rng.index(live.len());
            let (addr, size, stream) = live.swap_remove(i);
            push(&mut events, Action::FreeRequested, addr, size, stream);
        } else {
            let size = match rng.below(10) {
                0..=4 => 1 + rng.below(64 << 10),
                5..=7 => 1 + rng.below(4 << 20),
                8 => 1 + rng.below(64 << 20),
                _ => (1 + rng.below(16)) << 20,
            };
            let stream = rng.below(3);
            push(&mut events, Action::Alloc, next_addr, size, stream);
            live.push((next_addr, size, stream));
            next_addr += 1 << 30;
        }
    }
    events
}

/// Every policy over `input`, as the group `name`.
fn bench_group(c: &mut Criterion, name: &str, input: &ReplayInput) {
    let options = ReplayOptions::default();
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(input.loaded_events().unwrap_or_default().len() as u64));
    group.sample_size(10);
    for info in policy::POLICIES {
        let spec = PolicySpec { name: info.name.to_string(), options: String::new() };
        group.bench_function(info.name, |b| {
            b.iter(|| {
                let out = policy::lookup(info.name)
                    .expect("built-in")
                    .run(&spec, input, &options)
                    .expect("replay runs");
                std::hint::black_box(out.result.peak_reserved_bytes)
            })
        });
    }
    group.finish();
}

fn bench_policies(c: &mut Criterion) {
    let events = workload(120_000);
    let trace = Trace { devices: vec![DeviceTrace { device: 0, events }], ..Trace::default() };
    let input = ReplayInput::new(&trace, Some(0)).expect("device 0");
    bench_group(c, "replay_policy", &input);

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(REAL);
    let real = read_trace(&path, &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let real_input = ReplayInput::new(&real, None).expect("a device");
    bench_group(c, "replay_policy_real", &real_input);

    // The planner alone: what `offline` spends before its first malloc.
    let mut group = c.benchmark_group("offline_plan");
    group.sample_size(10);
    for (name, input) in [("synthetic", &input), ("real", &real_input)] {
        group.throughput(Throughput::Elements(
            input.loaded_events().unwrap_or_default().len() as u64
        ));
        group.bench_function(name, |b| {
            b.iter(|| {
                // What the engine runs before the first event, on the policy `replay` builds.
                let mut p = Offline::from_input("", &input.context(&ReplayOptions::default()))
                    .expect("default options");
                p.prepare(input.loaded_events().unwrap_or_default()).expect("plans");
                std::hint::black_box(p.planned_peak())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_policies);
criterion_main!(benches);
