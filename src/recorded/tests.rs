use super::limit::{self, FlushKind};
use super::*;
use crate::policy::{self, PolicySpec};
use crate::replay::{ReplayInput, ReplayOptions};
use crate::trace::{text, ReadOptions, Segment};

const MIB: u64 = 1 << 20;

/// A snapshot-shaped trace: `events` (text syntax) on device 0 and the given final segments.
fn snapshot(src: &str, segments: Vec<Segment>) -> Trace {
    let t = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
    Trace { format: Format::PytorchSnapshot, segments, ..t }
}

fn segment(address: u64, total_size: u64) -> Segment {
    Segment {
        device: 0,
        address,
        total_size,
        stream: 0,
        pool: crate::trace::PoolKind::Large,
        is_expandable: false,
        private_pool: None,
        blocks: vec![],
    }
}

#[test]
fn snapshot_reserved_starts_from_final_segments_minus_segment_events() {
    // 40 MiB at the dump; the events add 20, free 20, add 20: 20 MiB at the start, peak 40.
    let t = snapshot(
        "segment_alloc 0x10000000 20971520\nalloc 0x10000000 1000\n\
         segment_free 0x20000000 20971520\nsegment_alloc 0x30000000 20971520\n\
         free 0x10000000 1000\n",
        vec![segment(0x10000000, 20 * MIB), segment(0x30000000, 20 * MIB)],
    );
    let r = recorded(&t, 0).unwrap();
    assert_eq!(r.reserved_at_start_bytes, 20 * MIB);
    assert_eq!(r.peak_reserved_bytes, 40 * MIB);
    assert_eq!(r.peak_reserved_event, Some(0));
    assert_eq!(r.reserved_at_end_bytes, 40 * MIB);
    assert!(r.warnings.is_empty());
    let row = r.row();
    assert_eq!(row.policy, "recorded");
    assert_eq!(row.peak_allocated_bytes, None, "a snapshot records no block sizes");
    assert_eq!(row.peak_requested_bytes, Some(1000));
    assert_eq!((row.device_malloc_count, row.device_free_count), (Some(2), Some(1)));
    assert_eq!(row.oom, Some(false));
    let json = serde_json::to_value(&row).unwrap();
    assert!(json["peak_allocated_bytes"].is_null());
    let points: Vec<u64> = r.series(&t, 100).points().iter().map(|p| p.reserved).collect();
    assert_eq!(points, [20 * MIB, 40 * MIB, 20 * MIB, 40 * MIB]);
}

#[test]
fn text_traces_have_no_recorded_figures() {
    let t = text::read(&b"alloc 0x1000 4096 s0\n"[..], &ReadOptions::default()).unwrap();
    assert_eq!(recorded(&t, 0), None);
}

#[test]
fn inconsistent_segment_events_are_a_warning_not_a_negative_level() {
    // 2 MiB at the dump, but the events add 20 MiB: the start cannot be -18 MiB.
    let t = snapshot("segment_alloc 0x0 20971520\n", vec![segment(0x0, 2 * MIB)]);
    let r = recorded(&t, 0).unwrap();
    assert_eq!(r.reserved_at_start_bytes, 0);
    assert_eq!(r.reserved_after, [20 * MIB]);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
}

/// A snapshot of the PyTorch policy's own run of `src` under `capacity`: what a real recording
/// on a device with that limit looks like.
fn simulated(src: &str, capacity: Option<u64>) -> (Trace, PolicyResult) {
    let input_trace = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&input_trace, Some(0)).unwrap();
    let spec = &PolicySpec::parse_list("pytorch").unwrap()[0];
    let options = ReplayOptions { capacity, record_events: true, ..ReplayOptions::default() };
    let out = policy::lookup(&spec.name).unwrap().run(spec, &input, &options).unwrap();
    let trace = Trace {
        format: Format::PytorchSnapshot,
        devices: vec![crate::trace::DeviceTrace { device: 0, events: out.events.unwrap() }],
        segments: out.segments,
        ..Trace::default()
    };
    (trace, out.result)
}

/// Steps that cache 60 MiB segments, then need 100 MiB: under a 200 MiB limit the cache must be
/// flushed (an OOM flush); an explicit `empty_cache()` at a low level comes first.
fn pressure_trace() -> String {
    let mut s = String::new();
    // A 60 MiB block, freed; empty_cache(); then allocations that need a new segment each.
    s += "alloc 0x1000 62914560\nfree 0x1000 62914560\nsegment_free 0x0 62914560\n";
    for k in 0..3u64 {
        s += &format!("alloc {:#x} 62914560\n", 0x10000 + k * 0x1000);
    }
    for k in 0..3u64 {
        s += &format!("free {:#x} 62914560\n", 0x10000 + k * 0x1000);
    }
    // 180 MiB cached in three segments; 100 MiB does not fit any: at 180 + 100 > 200 the
    // allocator flushes and retries.
    s += "alloc 0x20000 104857600\nfree 0x20000 104857600\n";
    s
}

#[test]
fn oom_flushes_bound_the_limit_and_low_flushes_are_empty_cache() {
    let capacity = 200 * MIB;
    let (t, replayed) = simulated(&pressure_trace(), Some(capacity));
    assert!(!replayed.oom);
    assert!(replayed.alloc_retries >= 1, "{replayed:?}");
    let r = recorded(&t, 0).unwrap();
    // The recorded figures of a simulated run are that run's own.
    assert_eq!(r.peak_reserved_bytes, replayed.peak_reserved_bytes);
    assert_eq!(r.reserved_at_end_bytes, replayed.reserved_at_end_bytes);
    let l = limit::infer(&t, &r);
    let kinds: Vec<FlushKind> = l.flushes.iter().map(|f| f.kind).collect();
    assert_eq!(kinds[0], FlushKind::EmptyCacheBelowPeak, "{l:?}");
    assert!(kinds.contains(&FlushKind::OutOfMemory), "{l:?}");
    assert!(l.consistent);
    assert!(l.at_least_bytes <= capacity && l.below_bytes.unwrap() > capacity, "{l:?}");
    assert_eq!(l.limit_bytes, Some(r.peak_reserved_bytes));
    assert_eq!(r.row().with_limit(&l).alloc_retries, Some(replayed.alloc_retries));
    assert!(l.describe().contains("1 empty_cache() flushes"), "{}", l.describe());

    // Replayed under the inferred limit, the PyTorch policy reproduces the recorded peak.
    let rerun = simulated(&pressure_trace(), l.limit_bytes).1;
    assert_eq!(rerun.peak_reserved_bytes, r.peak_reserved_bytes);
    assert_eq!(rerun.alloc_retries, replayed.alloc_retries);

    // Unlimited, the same program shows no pressure at all.
    let (free_run, _) = simulated(&pressure_trace(), None);
    let l = limit::infer(&free_run, &recorded(&free_run, 0).unwrap());
    assert_eq!(l.limit_bytes, None);
    assert!(l.flushes.iter().all(|f| f.kind != FlushKind::OutOfMemory), "{l:?}");
}

#[test]
fn oom_entries_give_the_limit_and_disagreeing_ones_give_bounds_per_point() {
    // 40 MiB reserved; an oom with 10 MiB free: the limit was 50 MiB.
    let segs = vec![segment(0x0, 40 * MIB)];
    let t = snapshot("oom 10485760 62914560\n", segs.clone());
    let r = recorded(&t, 0).unwrap();
    assert_eq!(r.row().oom, Some(true));
    let l = limit::infer(&t, &r);
    assert_eq!(l.limit_bytes, Some(50 * MIB));
    assert_eq!(l.oom_entries[0].limit_bytes(), 50 * MIB);
    // Two entries that disagree (another process grew): no single number.
    let t = snapshot("oom 10485760 62914560\noom 2097152 62914560\n", segs);
    let l = limit::infer(&t, &recorded(&t, 0).unwrap());
    assert!(!l.consistent);
    assert_eq!(l.limit_bytes, None);
    assert_eq!(l.oom_entries.len(), 2);
}

fn kineto(events: &[(i64, i64, u64, u64)]) -> Trace {
    let json: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(i, (addr, bytes, alloc, res))| {
            format!(
                r#"{{"ph":"i","name":"[memory]","ts":{i},"args":{{"Device Type":1,"Device Id":0,"Addr":{addr},"Bytes":{bytes},"Total Allocated":{alloc},"Total Reserved":{res}}}}}"#
            )
        })
        .collect();
    let data = format!("[{}]", json.join(","));
    crate::trace::kineto::read(data.as_bytes(), &ReadOptions::default()).unwrap()
}

#[test]
fn kineto_totals_give_the_figures_and_the_start_state() {
    // 1000 B live before the trace (500 of it freed at event 2), 4096 reserved.
    let t = kineto(&[
        (0x1000, 512, 1512, 4096),
        (0x2000, 1024, 2536, 8192),
        (0x9000, -500, 2036, 8192),
        (0x1000, -512, 1600, 8192), // 1524 by the running sum
    ]);
    let r = recorded(&t, 0).unwrap();
    assert_eq!(r.source, Source::KinetoTotals);
    assert_eq!((r.peak_reserved_bytes, r.peak_allocated_bytes), (8192, Some(2536)));
    assert_eq!(r.allocated_at_peak_bytes, Some(2536));
    let row = r.row();
    assert_eq!((row.device_malloc_count, row.oom, row.peak_requested_bytes), (None, None, None));
    let s = kineto_start::start_state(&t, 0).unwrap();
    assert_eq!((s.live_bytes, s.reserved_bytes, s.opaque_bytes), (1000, 4096, 500));
    assert_eq!(s.mismatches, 1, "{:?}", s.warnings);
    assert!(s.warnings[0].contains("event 3"), "{:?}", s.warnings);
    let b = kineto_start::opaque_live_block(&t, 0).unwrap();
    assert_eq!((b.size, b.freed_in_trace), (500, false));
    assert!(t.devices[0].events.iter().all(|e| e.addr != b.addr));
}

#[test]
fn kineto_events_without_totals_record_nothing() {
    let data = r#"[{"ph":"i","name":"[memory]","ts":1,"args":{"Device Type":1,"Device Id":0,"Addr":4096,"Bytes":512}}]"#;
    let t = crate::trace::kineto::read(data.as_bytes(), &ReadOptions::default()).unwrap();
    assert!(t.recorded_totals.is_empty());
    assert_eq!(recorded(&t, 0), None);
    assert_eq!(kineto_start::start_state(&t, 0), None);
}
