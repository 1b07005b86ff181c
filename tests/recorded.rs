//! The recorded run's own figures on the real traces, cross-checked against an independent
//! reading of each file (Python's `pickle` summing segments and segment events; `json` summing
//! Kineto's `[memory]` args), and the device limit they imply.

use crate::util::real_trace;
use fragsim::recorded::{self, kineto_start, limit, Source};
use fragsim::trace::{read_trace, ReadOptions};

/// (file, peak reserved, reserved before the first event, peak requested), computed
/// independently with Python.
const SNAPSHOTS: [(&str, u64, u64, u64); 6] = [
    ("cs336-lm-step-a.pickle", 23_842_521_088, 23_842_521_088, 22_827_925_508),
    ("cs336-lm-step-b.pickle", 4_238_344_192, 4_238_344_192, 3_849_232_640),
    ("cs336-lm-step-c.pickle", 14_180_941_824, 14_180_941_824, 13_923_997_700),
    ("cs336-medium-ctx128-train.pickle", 7_235_174_400, 7_235_174_400, 7_013_335_044),
    ("cs336-medium-ctx512-infer.pickle", 1_981_808_640, 1_981_808_640, 1_949_343_744),
    ("cs336-medium-ctx512-train.pickle", 12_660_506_624, 12_593_397_760, 12_426_629_128),
];

#[test]
fn snapshots_recorded_peaks_match_the_independent_reading() {
    for (name, peak, start, requested) in SNAPSHOTS {
        let path = real_trace(name);
        let trace = read_trace(&path, &ReadOptions::default()).expect(name);
        let r = recorded::recorded(&trace, 0).expect(name);
        assert_eq!(r.source, Source::SnapshotSegments, "{name}");
        assert_eq!(r.peak_reserved_bytes, peak, "{name}");
        assert_eq!(r.reserved_at_start_bytes, start, "{name}");
        assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);
        let row = r.row();
        assert_eq!(row.peak_requested_bytes, Some(requested), "{name}");
        assert_eq!(row.peak_allocated_bytes, None, "{name}");
        // The final segments are the state at the dump.
        let at_dump: u64 = trace.segments_of(0).map(|s| s.total_size).sum();
        assert_eq!(row.reserved_at_end_bytes, Some(at_dump), "{name}");
        // No flush and no oom entry: no memory pressure, so no limit beyond the peak.
        let l = limit::infer(&trace, &r);
        assert_eq!((l.at_least_bytes, l.limit_bytes, l.below_bytes), (peak, None, None), "{name}");
        assert!(l.consistent && l.flushes.is_empty(), "{name}");
        assert_eq!(row.with_limit(&l).alloc_retries, Some(0), "{name}");
    }
}

#[test]
fn the_one_segment_alloc_of_ctx512_train_is_the_peak() {
    let path = real_trace("cs336-medium-ctx512-train.pickle");
    let trace = read_trace(&path, &ReadOptions::default()).expect("read");
    let r = recorded::recorded(&trace, 0).expect("recorded");
    let i = r.peak_reserved_event.expect("the peak is after an event") as usize;
    assert_eq!(trace.devices[0].events[i].action, fragsim::trace::Action::SegmentAlloc);
    assert_eq!(r.row().device_malloc_count, Some(1));
    let series = r.series(&trace, 1000);
    let reserved: Vec<u64> = series.points().iter().map(|p| p.reserved).collect();
    assert_eq!(reserved, [12_593_397_760, 12_660_506_624]);
}

#[test]
fn kineto_recorded_figures_and_start_state() {
    let path = real_trace("kineto-ddp-v100-rank1.json.gz");
    let trace = read_trace(&path, &ReadOptions::default()).expect("read");
    let r = recorded::recorded(&trace, 1).expect("recorded");
    assert_eq!(r.source, Source::KinetoTotals);
    let row = r.row();
    assert_eq!(row.peak_reserved_bytes, Some(12_782_141_440));
    assert_eq!(row.peak_allocated_bytes, Some(6_629_508_096));
    assert_eq!((row.device_malloc_count, row.oom, row.peak_requested_bytes), (None, None, None));
    // First event: Total Allocated 4,121,780,224 after its own 25,165,824 B.
    let s = kineto_start::start_state(&trace, 1).expect("start state");
    assert_eq!(s.live_bytes, 4_096_614_400);
    assert_eq!(s.reserved_bytes, 12_782_141_440);
    assert_eq!(s.mismatches, 0, "{:?}", s.warnings);
    assert!(s.opaque_bytes <= s.live_bytes && s.opaque_bytes > 0);
    let b = kineto_start::opaque_live_block(&trace, 1).expect("opaque block");
    assert_eq!(b.size, s.opaque_bytes);
    // The host device has totals too, but no CUDA figures are mixed into it.
    assert!(trace.totals_of(-1).is_some());
    let l = limit::infer(&trace, &r);
    assert_eq!((l.limit_bytes, l.at_least_bytes), (None, 12_782_141_440));
}

/// Replays `name`'s default device with the given policy and no flags.
fn replay(trace: &fragsim::trace::Trace, policy: &str) -> fragsim::metrics::PolicyResult {
    use fragsim::policy::PolicySpec;
    use fragsim::replay::{run_spec, ReplayInput, ReplayOptions};
    let input = ReplayInput::new(trace, None).expect("input");
    let spec = &PolicySpec::parse_list(policy).expect("spec")[0];
    run_spec(spec, &input, &ReplayOptions::default()).expect("replay").result
}

#[test]
fn kineto_replay_carries_the_start_state_and_reads_bytes_as_block_sizes() {
    let path = real_trace("kineto-ddp-v100-rank1.json.gz");
    let trace = read_trace(&path, &ReadOptions::default()).expect("read");
    let r = recorded::recorded(&trace, 1).expect("recorded");
    assert_eq!(r.peak_reserved_bytes, 12_782_141_440);
    assert_eq!(r.peak_allocated_bytes, Some(6_629_508_096));
    // The engine carries the opaque block itself; Kineto's `Bytes` are block sizes, so the
    // PyTorch policy's live block sizes peak exactly where the profiler's Total Allocated did.
    assert_eq!(replay(&trace, "pytorch").peak_allocated_bytes, 6_629_508_096);
    assert_eq!(replay(&trace, "bound").peak_reserved_bytes, 6_629_508_096);
}

/// With no flags, the unguided `pytorch` replay starts from the recovered start state (cached
/// free segments included) and so reserves what the real allocator did, to the byte, on every
/// shared snapshot (none records memory pressure, so no capacity is inferred).
#[test]
fn pytorch_replays_reproduce_the_recorded_peak_reserved() {
    for (name, peak, _, _) in SNAPSHOTS {
        let path = real_trace(name);
        let trace = read_trace(&path, &ReadOptions::default()).expect(name);
        let r = recorded::recorded(&trace, 0).expect(name);
        assert_eq!(limit::infer(&trace, &r).limit_bytes, None, "{name}");
        assert_eq!(replay(&trace, "pytorch").peak_reserved_bytes, peak, "{name}");
    }
}

/// A program that caches three 60 MiB segments, then needs 100 MiB: on a device with a 200 MiB
/// limit the allocator must flush its cache and retry (an OOM-driven flush). An explicit
/// `empty_cache()` at a low level comes first (the same events, but no OOM). The library's own
/// test of the limit (`src/recorded/tests.rs`) replays the same program.
fn pressure_program() -> String {
    let mut s =
        String::from("alloc 0x1000 62914560\nfree 0x1000 62914560\nsegment_free 0x0 62914560\n");
    for k in 0..3u64 {
        s += &format!("alloc {:#x} 62914560\n", 0x10000 + k * 0x1000);
    }
    for k in 0..3u64 {
        s += &format!("free {:#x} 62914560\n", 0x10000 + k * 0x1000);
    }
    s + "alloc 0x20000 104857600\nfree 0x20000 104857600\n"
}

/// What a real recording of [`pressure_program`] on a 200 MiB device looks like: the PyTorch
/// policy's own run of it under that capacity, written as a snapshot with the library's writer.
fn pressure_snapshot(path: &std::path::Path) {
    use fragsim::replay::{ReplayInput, ReplayOptions};
    use fragsim::trace::{DeviceTrace, Format, Trace};
    let program =
        fragsim::trace::text::read(pressure_program().as_bytes(), &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&program, Some(0)).unwrap();
    let spec = &fragsim::policy::PolicySpec::parse_list("pytorch").unwrap()[0];
    let options =
        ReplayOptions { capacity: Some(200 << 20), record_events: true, ..Default::default() };
    let out = fragsim::policy::lookup("pytorch").unwrap().run(spec, &input, &options).unwrap();
    assert!(out.result.alloc_retries >= 1 && !out.result.oom, "{:?}", out.result);
    let recording = Trace {
        format: Format::PytorchSnapshot,
        devices: vec![DeviceTrace { device: 0, events: out.events.unwrap() }],
        segments: out.segments,
        ..Trace::default()
    };
    fragsim::trace::write_trace(&recording, path).unwrap();
}

/// `replay --json` on a recording with OOM-driven flushes replays every policy under the device
/// limit it infers (the PyTorch policy then reproduces the recorded peak and retries);
/// `--capacity none` removes the limit.
#[test]
fn the_inferred_limit_is_the_default_capacity_and_none_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pressure.pickle");
    pressure_snapshot(&path);
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["replay", path.to_str().unwrap(), "-p", "all", "--json"];
        args.extend(extra);
        let o = crate::util::run(&args);
        assert!(o.status.success(), "{}", crate::util::stderr(&o));
        serde_json::from_str(&crate::util::stdout(&o)).unwrap()
    };
    let find = |v: &serde_json::Value, policy: &str| {
        v["results"].as_array().unwrap().iter().find(|r| r["policy"] == policy).unwrap().clone()
    };

    let inferred = json(&[]);
    let capacity = &inferred["capacity"];
    assert!(capacity["inferred"].is_string(), "{capacity}");
    let limit = capacity["bytes"].as_u64().expect("an inferred limit");
    assert_eq!(Some(limit), capacity["limit"]["limit_bytes"].as_u64(), "{capacity}");
    assert!(limit <= 200 << 20, "at most the device the recording ran on: {limit}");
    let recorded = find(&inferred, "recorded");
    assert_eq!(recorded["peak_reserved_bytes"].as_u64(), Some(limit));
    let results = inferred["results"].as_array().unwrap();
    assert!(results.len() > 2);
    for r in results.iter().filter(|r| r["policy"] != "recorded") {
        let peak = r["peak_reserved_bytes"].as_u64().unwrap();
        if r["oom"] == true {
            assert_eq!(r["first_oom"]["capacity_bytes"].as_u64(), Some(limit), "{r}");
        } else {
            assert!(peak <= limit, "{}: {peak} over the limit {limit}", r["policy"]);
        }
    }
    let pytorch = find(&inferred, "pytorch");
    assert_eq!(pytorch["peak_reserved_bytes"].as_u64(), Some(limit), "{pytorch}");
    assert!(pytorch["alloc_retries"].as_u64() >= Some(1), "{pytorch}");

    let unlimited = json(&["--capacity", "none"]);
    assert!(unlimited["capacity"]["bytes"].is_null(), "{}", unlimited["capacity"]);
    assert!(unlimited["capacity"]["inferred"].is_null(), "{}", unlimited["capacity"]);
    let pytorch = find(&unlimited, "pytorch");
    assert_eq!(pytorch["alloc_retries"], 0, "{pytorch}");
    assert!(pytorch["peak_reserved_bytes"].as_u64() > Some(limit), "{pytorch}");
}

/// `info --json` tells the whole story on real snapshots: the blocks live before the first
/// event and the peak of live bytes counting them, which is `bound`'s peak reserved and the
/// peak requested Python computed independently; `peak_live_bytes` leaves them out.
#[test]
fn info_json_carries_the_live_at_start_blocks_and_the_peak_with_them() {
    for (name, _, _, python_peak_requested) in [SNAPSHOTS[2], SNAPSHOTS[5]] {
        let trace = real_trace(name);
        let path = trace.to_str().unwrap();
        let o = crate::util::run(&["info", path, "--json"]);
        assert!(o.status.success(), "{name}: {}", crate::util::stderr(&o));
        let info: serde_json::Value = serde_json::from_str(&crate::util::stdout(&o)).unwrap();
        let o = crate::util::run(&["replay", path, "-p", "bound", "--json"]);
        let replay: serde_json::Value = serde_json::from_str(&crate::util::stdout(&o)).unwrap();
        let bound = replay["results"][0]["peak_reserved_bytes"].as_u64().unwrap();
        let device = &info["devices"][0];
        for v in [&info, device] {
            assert_eq!(v["peak_live_with_start_bytes"].as_u64(), Some(bound), "{name}");
            assert_eq!(bound, python_peak_requested, "{name}");
            let blocks = v["live_at_start_blocks"].as_u64().unwrap();
            let bytes = v["live_at_start_bytes"].as_u64().unwrap();
            assert!(blocks > 0 && bytes > 0, "{name}: a snapshot taken mid-run");
            let in_trace = v["peak_live_bytes"].as_u64().unwrap();
            assert!(in_trace < bound && bound <= in_trace + bytes, "{name}");
        }
    }
}

/// A `.fst` is the same trace read faster: converted from a snapshot or a Kineto trace, it
/// replays to the same results, recorded row and inferred device limit included (the recorded
/// start state and Kineto's block sizes follow the format the trace was recorded in, not the
/// file's; a snapshot's `.fst` streams, and its recording is recovered as it streams).
#[test]
fn a_converted_fst_replays_exactly_as_its_source() {
    use crate::util::{run, stderr, stdout, untimed};
    let dir = tempfile::tempdir().unwrap();
    let json = |path: &str, policies: &[&str]| {
        let mut args = vec!["replay", path, "--json", "--quiet"];
        for p in policies {
            args.extend(["-p", p]);
        }
        let out = run(&args);
        assert!(out.status.success(), "{path}: {}", stderr(&out));
        let mut v = untimed(serde_json::from_str(&stdout(&out)).unwrap());
        let v = v.as_object_mut().unwrap();
        v.remove("trace");
        v.remove("format");
        v.clone()
    };
    let pressure = dir.path().join("pressure.pickle");
    pressure_snapshot(&pressure);
    let sources = [
        (real_trace("cs336-lm-step-c.pickle"), &["pytorch", "bfc"][..]),
        (real_trace("kineto-ddp-v100-rank1.json.gz"), &["pytorch", "bfc"][..]),
        (pressure, &["all"][..]),
    ];
    for (source, policies) in sources {
        let name = source.file_name().unwrap().to_string_lossy().into_owned();
        let fst = dir.path().join(format!("{name}.fst"));
        let (source, fst) = (source.to_str().unwrap(), fst.to_str().unwrap());
        let out = run(&["convert", source, fst]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let want = json(source, policies);
        let rows = want["results"].as_array().unwrap();
        assert!(rows.iter().any(|r| r["policy"] == "recorded"), "{name}: no recorded row");
        assert_eq!(json(fst, policies), want, "{name}");
    }
}
