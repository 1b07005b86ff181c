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

/// The C++ and Python frames PyTorch records for a release made by `torch.cuda.empty_cache()`.
fn empty_cache_stack() -> Vec<crate::trace::Frame> {
    let f = |filename: &str, name: &str| crate::trace::Frame {
        filename: filename.into(),
        line: 0,
        name: name.into(),
    };
    vec![
        f("??", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_cached_blocks(std::shared_ptr<c10::GatheredContext> const&)"),
        f("??", "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache()"),
        f("??", "THCPModule_emptyCache(_object*, _object*)"),
        f("/usr/lib/python3/site-packages/torch/cuda/memory.py", "empty_cache"),
        f("calibrate.py", "calibrate_layer"),
    ]
}

/// The frames of a release inside a malloc whose `cudaMalloc` failed (its out-of-memory
/// fallback): the stack of the allocation that failed.
fn oom_stack() -> Vec<crate::trace::Frame> {
    let f = |name: &str| crate::trace::Frame { filename: "??".into(), line: 0, name: name.into() };
    vec![
        f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_cached_blocks(std::shared_ptr<c10::GatheredContext> const&)"),
        f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
        f("at::empty_strided(...)"),
    ]
}

/// `src` as a snapshot whose releases at `stacks`' event indices carry those frames.
fn with_stacks(
    src: &str,
    segments: Vec<Segment>,
    stacks: &[(usize, Vec<crate::trace::Frame>)],
) -> Trace {
    let mut t = snapshot(src, segments);
    for (i, frames) in stacks {
        let id = t.frames.intern(frames.clone());
        t.devices[0].events[*i].frames = id;
    }
    t
}

/// Read back from a pickle as commands read it (frames not asked for): the releases' stacks
/// must survive, since they decide what each flush was.
fn through_pickle(t: &Trace) -> Trace {
    let mut bytes = Vec::new();
    crate::trace::snapshot::write(t, &mut bytes).unwrap();
    let back = crate::trace::snapshot::read(&bytes, &ReadOptions::default()).unwrap();
    let releases = |t: &Trace| -> Vec<crate::trace::FramesId> {
        t.devices[0]
            .events
            .iter()
            .filter(|e| e.action == crate::trace::Action::SegmentFree)
            .map(|e| e.frames)
            .collect()
    };
    assert!(releases(&back).iter().all(|f| *f != crate::trace::FramesId::NONE));
    assert_eq!(releases(&back).len(), releases(t).len());
    back
}

#[test]
fn a_release_whose_stack_shows_empty_cache_is_the_programs_call_whatever_the_levels() {
    // A 60 MiB segment cached at the start, a small segment for a small block; the program
    // calls empty_cache() (its stack says so) and then needs 50 MiB, a new segment: by the
    // levels (62 + 50 above the 62 MiB peak) this reads as an OOM flush and a retry; by the
    // stack it is the program's call.
    let src = "segment_alloc 0x30000000 2097152\nalloc 0x30000000 4096\n\
               segment_free 0x10000000 62914560\n\
               segment_alloc 0x20000000 52428800\nalloc 0x20000000 52428800\n";
    let segs = vec![segment(0x20000000, 50 * MIB), segment(0x30000000, 2 * MIB)];
    let frameless = snapshot(src, segs.clone());
    let l = limit::infer(&frameless, &recorded(&frameless, 0).unwrap());
    assert_eq!(l.flushes[0].kind, FlushKind::OutOfMemory, "the level rule alone: {l:?}");
    assert_eq!(l.limit_bytes, Some(62 * MIB));

    let t = through_pickle(&with_stacks(src, segs, &[(2, empty_cache_stack())]));
    let r = recorded(&t, 0).unwrap();
    let l = limit::infer(&t, &r);
    assert_eq!(l.flushes[0].kind, FlushKind::EmptyCacheByStack, "{l:?}");
    assert_eq!((l.limit_bytes, l.below_bytes), (None, None), "no memory pressure: {l:?}");
    assert_eq!(l.proven_retries(), Some(0));
    assert!(l.describe().contains("1 told by their stacks"), "{}", l.describe());
    let input = ReplayInput::new(&t, Some(0)).unwrap();
    assert_eq!(input.empty_cache_at(), [2]);
    assert!(input.undecided_flushes().is_empty());
    // Replayed with the call, the PyTorch policy reproduces the recording.
    let spec = &PolicySpec::parse_list("pytorch").unwrap()[0];
    let options = ReplayOptions { capacity: l.limit_bytes, ..ReplayOptions::default() };
    let out = policy::lookup(&spec.name).unwrap().run(spec, &input, &options).unwrap();
    assert_eq!(out.result.peak_reserved_bytes, r.peak_reserved_bytes);
    assert!(!out.result.oom);
}

#[test]
fn a_release_inside_a_malloc_is_an_oom_flush_whatever_the_levels() {
    // 200 MiB reached earlier; later, at 60 MiB, a flush and a 20 MiB retry: by the levels
    // (60 + 20 below the peak) a call, by the stack (release_cached_blocks under malloc) the
    // fallback of a malloc that ran out of memory. With garbage collection set, the levels
    // prove nothing, but the stack still does.
    let src = "segment_alloc 0x40000000 146800640\nsegment_free 0x40000000 146800640\n\
               alloc 0x1000 512\nsegment_free 0x10000000 62914560\n\
               segment_alloc 0x20000000 20971520\nalloc 0x20000000 20971520\n";
    let segs = vec![segment(0x20000000, 20 * MIB)];
    let calls = |t: &Trace| ReplayInput::new(t, Some(0)).unwrap().empty_cache_at().to_vec();
    let frameless = snapshot(src, segs.clone());
    assert_eq!(calls(&frameless), [1, 3], "the level rule alone");
    let t = through_pickle(&with_stacks(src, segs, &[(1, empty_cache_stack()), (3, oom_stack())]));
    assert_eq!(calls(&t), [1]);
    let l = limit::infer(&t, &recorded(&t, 0).unwrap());
    let kinds: Vec<FlushKind> = l.flushes.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FlushKind::EmptyCacheByStack, FlushKind::OutOfMemoryByStack]);
    assert_eq!(l.proven_retries(), Some(1));
    assert_eq!(l.below_event, Some(3));
}

#[test]
fn releases_with_different_stacks_back_to_back_are_two_flushes() {
    // empty_cache() releases one segment; the next malloc runs out of memory at once and
    // releases another: one run of releases, two flushes.
    let src = "alloc 0x1000 512\nsegment_free 0x10000000 20971520\n\
               segment_free 0x11000000 20971520\nsegment_alloc 0x20000000 104857600\n\
               alloc 0x20000000 104857600\n";
    let segs = vec![segment(0x20000000, 100 * MIB)];
    let t = with_stacks(src, segs, &[(1, empty_cache_stack()), (2, oom_stack())]);
    assert_eq!(ReplayInput::new(&t, Some(0)).unwrap().empty_cache_at(), [1]);
    let l = limit::infer(&t, &recorded(&t, 0).unwrap());
    let kinds: Vec<(u64, FlushKind)> = l.flushes.iter().map(|f| (f.event, f.kind)).collect();
    assert_eq!(kinds, [(1, FlushKind::EmptyCacheByStack), (2, FlushKind::OutOfMemoryByStack)]);
    assert_eq!(l.flushes[1].retry_bytes, Some(100 * MIB));
}
