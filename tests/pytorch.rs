//! Integration tests: the PyTorch policy against real snapshots (`fragsim validate`) and the
//! `validate` command's contract (docs/interface.md: JSON keys, exit codes).

use crate::util::*;

/// `fragsim validate --json` on `path`, parsed.
fn validate_json(path: &std::path::Path) -> (i32, serde_json::Value) {
    let out = run(&["validate", path.to_str().expect("utf-8 path"), "--json"]);
    let code = out.status.code().unwrap_or(-1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{}: bad JSON ({e}): {}", path.display(), stderr(&out)));
    (code, v)
}

#[test]
fn every_real_snapshot_validates_exactly() {
    let counts = expected_counts();
    let snapshots = real_snapshots();
    for path in &snapshots {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let (code, v) = validate_json(path);
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{name}: missing {k}"));
        assert_eq!(code, 0, "{name}: {v}");
        assert!(v["mismatches"].as_array().is_some_and(|m| m.is_empty()), "{name}: {v}");
        // Every recorded alloc is counted, as Python's pickle counts them.
        let allocs = counts[name]["devices"][0]["by_action"]["alloc"].as_u64();
        assert_eq!(Some(n("allocs_total")), allocs, "{name}");
        // 100% of determinable allocs at the recorded address; few undeterminable (< 1%).
        let undeterminable = n("undeterminable_events");
        assert_eq!(n("allocs_addr_matched") + undeterminable, n("allocs_total"), "{name}");
        assert!(undeterminable * 100 < n("allocs_total"), "{name}: {undeterminable}");
        assert_eq!(n("segment_events_matched"), n("segment_events_recorded"), "{name}");
        assert_eq!(n("peak_reserved_simulated_bytes"), n("peak_reserved_recorded_bytes"), "{name}");
    }
}

#[test]
fn ctx512_train_reproduces_its_one_segment_alloc_and_learns_orphan_sizes() {
    let path = real_trace("cs336-medium-ctx512-train.pickle");
    let (_, v) = validate_json(&path);
    assert_eq!(v["segment_events_recorded"], 1, "the trace has one segment_alloc (64 MiB)");
    assert_eq!(v["segment_events_matched"], 1);
    assert_eq!(v["allocs_total"], 7591);
    // The placement at event 179 proves the orphan before it was longer
    // (docs/pytorch-model.md#orphan-growth).
    let out = run(&["validate", path.to_str().expect("utf-8"), "--verbose"]);
    let text = stdout(&out);
    assert!(text.contains("is at least"), "{text}");
    assert!(text.contains("result: valid"), "{text}");
}

#[test]
fn undeterminable_events_are_each_explained_with_verbose() {
    // (cs336-lm-step-b's six went when the start state took the sizes its placements prove.)
    let path = real_trace("cs336-medium-ctx512-train.pickle");
    let (_, v) = validate_json(&path);
    let out = run(&["validate", path.to_str().expect("utf-8"), "--verbose"]);
    let lines = stdout(&out).lines().filter(|l| l.contains("undeterminable event")).count();
    assert!(lines > 0, "{}", stdout(&out));
    assert_eq!(Some(lines as u64), v["undeterminable_events"].as_u64());
    assert!(stdout(&out).contains("live before recording"));
}

#[test]
fn a_hand_made_snapshot_that_breaks_best_fit_fails_with_exit_1() {
    // A 20 MiB segment; 5 MiB at its start, then 3 MiB recorded 8 MiB in — the real allocator
    // would have put it right after the 5 MiB block.
    let src =
        "segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\nalloc 0x10800000 3145728\n";
    let (_dir, path) = temp_file("bad.txt", src.as_bytes());
    let (code, v) = validate_json(&path);
    assert_eq!(code, 1);
    let m = &v["mismatches"][0];
    assert_eq!(m["event"], 2);
    assert_eq!(m["action"], "alloc");
    assert_eq!(m["expected"], "0x10800000");
    assert_eq!(m["got"], "0x10500000");
    for key in [
        "trace",
        "device",
        "allocs_total",
        "allocs_addr_matched",
        "segment_events_recorded",
        "segment_events_matched",
        "peak_reserved_recorded_bytes",
        "peak_reserved_simulated_bytes",
        "undeterminable_events",
        "mismatches",
    ] {
        assert!(v.get(key).is_some(), "missing key {key}");
    }
}

#[test]
fn bad_version_is_a_usage_error() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let out = run(&["validate", path.to_str().expect("utf-8"), "--pytorch-version", "1.13"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["validate", path.to_str().expect("utf-8"), "--pytorch-version", "2.8"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // A version past the newest modelled is refused with the ones that are.
    let out = run(&["validate", path.to_str().expect("utf-8"), "--pytorch-version", "2.99"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("PyTorch 2.99 is newer than the newest modelled") && err.contains("2.0 to"),
        "{err}"
    );
    let out = run(&["validate", path.to_str().expect("utf-8"), "--pytorch-version", "2.8.x"]);
    assert_eq!(out.status.code(), Some(2), "a patch number must be a number");
}

#[test]
fn pytorch_policy_runs_in_replay_with_options() {
    let path = real_trace("cs336-medium-ctx512-infer.pickle");
    let p = path.to_str().expect("utf-8");
    let out = run(&[
        "replay",
        p,
        "--json",
        "-p",
        "pytorch",
        "-p",
        "pytorch:max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4]",
        "-p",
        "pytorch-expandable",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let configs: Vec<String> =
        v["results"].as_array().expect("results").iter().map(|r| r["config"].to_string()).collect();
    assert!(configs.iter().any(|c| c.contains("max_split_size_mb:64")), "{configs:?}");
    assert!(configs.iter().any(|c| c.contains("expandable_segments:True")), "{configs:?}");
    let out = run(&["replay", p, "-p", "pytorch:max_split_size_mb:10"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("max_split_size_mb"), "{}", stderr(&out));
}

#[test]
fn the_exported_replay_validates_like_the_recording() {
    let path = real_trace("cs336-medium-ctx512-train.pickle");
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("sim.pickle");
    let p = path.to_str().expect("utf-8");
    let out = run(&["validate", p, "--export-snapshot", out_path.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The export holds every recorded event at the simulated addresses and the simulated final
    // segments; as those equal the recording, validating it gives the same numbers.
    let (code, exported) = validate_json(&out_path);
    let (_, original) = validate_json(&path);
    assert_eq!(code, 0, "{exported}");
    for key in
        ["allocs_total", "allocs_addr_matched", "segment_events_matched", "undeterminable_events"]
    {
        assert_eq!(exported[key], original[key], "{key}");
    }
}

#[test]
fn a_replay_exported_by_the_pytorch_policy_validates_from_a_cold_start() {
    // `replay --export-snapshot` records the policy's own decisions from an empty cache (blocks
    // live before the trace are allocated first); validating that snapshot must reproduce every
    // decision, segment events included.
    let path = real_trace("cs336-lm-step-c.pickle");
    let dir = tempfile::tempdir().expect("temp dir");
    let out_path = dir.path().join("replayed.pickle");
    let out = run(&[
        "replay",
        path.to_str().expect("utf-8"),
        "-p",
        "pytorch",
        "--export-snapshot",
        out_path.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (code, v) = validate_json(&out_path);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["allocs_addr_matched"], v["allocs_total"]);
    assert_eq!(v["undeterminable_events"], 0, "a cold start has nothing to guess");
    assert!(v["segment_events_recorded"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(v["segment_events_matched"], v["segment_events_recorded"]);
}

/// A what-if export carries the policy's own settings, so the exported run validates as the run
/// it claims to be (an expandable replay must record `expandable_segments: True`).
#[test]
fn exported_expandable_what_if_validates_under_its_own_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("what-if.pickle");
    let trace = bundled("gpt-4l-512h.txt");
    let o = run(&[
        "replay",
        trace.to_str().unwrap(),
        "--policy",
        "pytorch-expandable",
        "--export-snapshot",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["validate", out.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["allocs_total"], 1086);
    assert_eq!(v["allocs_addr_matched"], 1086);
    assert!(v["segment_events_recorded"].as_u64().unwrap() > 0);
    assert_eq!(v["segment_events_matched"], v["segment_events_recorded"]);
    let info = run(&["info", out.to_str().unwrap(), "--json"]);
    let i: serde_json::Value = serde_json::from_str(&stdout(&info)).unwrap();
    assert_eq!(i["allocator_settings"]["expandable_segments"], true, "{i}");
}

/// `--capacity` is the GPU's total memory for the PyTorch policy too: a memory fraction is taken
/// of it (docs/pytorch-model.md#memory-fraction: the limit is fraction × total memory, checked
/// before cudaMalloc).
#[test]
fn memory_fraction_is_taken_of_the_capacity() {
    // 60 MiB fits on a 100 MiB device, but not under half of it.
    let (_d, path) = temp_file("f.txt", b"alloc 0x1000 62914560 s0\nfree 0x1000 62914560 s0\n");
    let replay = |spec: &str| {
        let o =
            run(&["replay", path.to_str().unwrap(), "-p", spec, "--capacity", "100MiB", "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["results"][0]["oom"].as_bool().unwrap()
    };
    assert!(!replay("pytorch"));
    assert!(replay("pytorch:per_process_memory_fraction:0.5"));
    assert!(!replay("pytorch:per_process_memory_fraction:0.7"));
}

/// Issue 14.6: a snapshot laid out by expandable segments on an 80 GB card (81559 MiB) validates
/// without `--gpu-mem`: validate infers the GPU's memory from the gap between reservations and
/// says so; the true value given with `--gpu-mem` validates too, and a value that makes the large
/// reservation cover the small pool's pages (80 GiB) does not.
#[test]
fn expandable_snapshot_validates_without_gpu_mem() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = dir.path().join("t.fst");
    let snap = dir.path().join("x.pickle");
    let out = run(&["synth", trace.to_str().unwrap(), "--steps", "2", "--layers", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&[
        "replay",
        trace.to_str().unwrap(),
        "-p",
        "pytorch-expandable",
        "--capacity",
        "81559MiB",
        "--export-snapshot",
        snap.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = snap.to_str().unwrap();
    let out = run(&["validate", s]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("GPU memory inferred as"), "{text}");
    assert!(text.contains("result: valid"), "{text}");
    for (gpu, code) in [("81559MiB", 0), ("80GiB", 1)] {
        let out = run(&["validate", s, "--gpu-mem", gpu]);
        assert_eq!(out.status.code(), Some(code), "--gpu-mem {gpu}: {}", stdout(&out));
    }
}

/// How [`recording`] runs the PyTorch policy to make a trace.
#[derive(Clone, Copy)]
struct Run<'a> {
    /// `PYTORCH_CUDA_ALLOC_CONF`, recorded as the snapshot's `allocator_settings`.
    conf: &'a str,
    /// The device's memory; `None`: unlimited.
    capacity: Option<u64>,
    /// Stream 0's allocations in capture windows go to a CUDA graph's private pool.
    captures: bool,
    /// Leading entries dropped, as a snapshot's ring buffer drops them.
    cut: usize,
    /// Every entry names its pool (`pool_id`), as PyTorch ≈ 2.7+ writes it.
    names_pools: bool,
    /// The graph is deleted at this step (no capture after it), and the program calls
    /// `empty_cache()`: PyTorch then releases the graph's free segments too.
    graph_deleted_at: Option<usize>,
    /// The PyTorch whose allocator records (before 2.5, private pools get cudaMalloc segments
    /// under expandable segments).
    version: fragsim::policy::pytorch::Version,
    /// Stream 1's allocations in some windows go to a `MemPool` with an allocator of its own
    /// (pool `(2, 9)`, the second of `entry_pools`): under expandable segments, current main
    /// gives it segments from its allocator, not pages.
    mem_pool: bool,
    /// The GPU's memory (`totalGlobalMem`); `None`: the model's default, 80 GiB.
    gpu_memory: Option<u64>,
    /// Every release carries the stack PyTorch records with it: `empty_cache()`'s frames for
    /// the program's calls, `release_cached_blocks` under `malloc` for a malloc's fallback.
    stacks: bool,
    /// Recorded by torch_npu: its allocator's rules (`conf` is `PYTORCH_NPU_ALLOC_CONF`), and a
    /// snapshot its frames mark as torch_npu's.
    npu: bool,
    /// With `stacks`: every second `empty_cache()` call's releases carry no stack, as a real
    /// snapshot's call can (the levels then decide it).
    frameless_calls: bool,
}

impl Run<'static> {
    /// Default settings, no device limit, no capture, recorded whole, as older snapshots are.
    const PLAIN: Run<'static> = Run {
        conf: "",
        capacity: None,
        captures: false,
        cut: 0,
        names_pools: false,
        graph_deleted_at: None,
        version: fragsim::policy::pytorch::Version::CURRENT,
        mem_pool: false,
        gpu_memory: None,
        stacks: false,
        npu: false,
        frameless_calls: false,
    };
}

/// A recording of the PyTorch policy itself on a seeded workload, as a snapshot records one:
/// each call becomes the trace entries PyTorch writes (segment events at the addresses the
/// device gave, with the segment's stream, then the `alloc`, or an `oom` with the device's free
/// bytes; a free as `free_requested` and `free_completed`), the policy's own segments are the
/// dump, and its configuration the recorded settings.
fn recording(seed: u64, run: Run) -> fragsim::trace::Trace {
    recording_with_truth(seed, run).0
}

/// What the recorded allocator did in a [`recording`]: its out-of-memory flushes, its
/// cudaMallocs and releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Truth {
    /// The retries (`num_alloc_retries`) the recorded allocator made. A fallback that found
    /// nothing cached to release records only its `oom`, which shows no graph capture (the
    /// cache held nothing to release): a replay reads it as the fallback it was, one retry.
    retries: u64,
    /// Segments released (`segment_free`).
    releases: u64,
    mallocs: u64,
    /// `empty_cache()` calls that no recording can tell from an out-of-memory fallback: the next
    /// request could not be served from the cache before the call, and needed more than the
    /// device had left then, so without the call its malloc would have failed, released the
    /// same segments and retried. The releases carry no stack that tells.
    ambiguous: u64,
    /// Mallocs into the graph's pool that failed with nothing cached to release, where no
    /// recording shows the capture: the entry names no pool and the default pools could not
    /// have served it (so nothing routes it to the graph's pool). A replay reads each as a
    /// plain failure, whose fallback released nothing and retried once.
    unshown_captures: u64,
}

/// [`recording`] and the recorded allocator's own counts.
fn recording_with_truth(seed: u64, run: Run) -> (fragsim::trace::Trace, Truth) {
    use fragsim::backend::{Backend, BackendCall, Recording, SimDevice};
    use fragsim::policy::pytorch::{Config, PyTorch};
    use fragsim::policy::{Allocation, Policy};
    use fragsim::testing::{workload, Step};
    use fragsim::trace::{Action, DeviceTrace, Event, Format, Frame, FrameTable, FramesId, Trace};
    let mut config = if run.npu {
        Config::parse_npu(run.conf).unwrap()
    } else {
        Config::parse(run.conf, run.version).unwrap()
    };
    let mut frames = FrameTable::default();
    let mut stack = |names: &[&str]| {
        let f = |n: &&str| Frame { filename: "??".into(), line: 0, name: n.to_string() };
        if run.stacks {
            frames.intern(names.iter().map(f).collect())
        } else {
            FramesId::NONE
        }
    };
    let call_stack = stack(&[
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_cached_blocks()",
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache()",
        "THCPModule_emptyCache(_object*, _object*)",
    ]);
    let malloc_stack = stack(&[
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_cached_blocks()",
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
    ]);
    // torch_npu's allocations are made under its Python frames, which mark the snapshot.
    let npu_stack = if run.npu {
        frames.intern(vec![Frame {
            filename: "/usr/local/lib/python3.10/site-packages/torch_npu/utils/_module.py".into(),
            line: 1,
            name: "forward".into(),
        }])
    } else {
        FramesId::NONE
    };
    let settings = config.to_recorded();
    // Pool numbers: 0 the default pools, 1 the graph's, 2 the MemPool's.
    const POOLS: [Option<(u64, u64)>; 3] = [None, Some((1, 7)), Some((2, 9))];
    if run.mem_pool {
        config.own_allocator_pools = vec![(2, 9)];
    }
    if let Some(g) = run.gpu_memory {
        config.gpu_memory = g;
    }
    let mut p = PyTorch::new(config);
    let mut d: Recording<SimDevice> = Recording::new(SimDevice::new(run.capacity));
    let mut events = Vec::new();
    let mut live: Vec<Option<(Allocation, u64, u64, u16)>> = Vec::new();
    // A pool as the entries name it: `PoolRef(k)` for pool k, the k-th of `entry_pools`.
    let pool_of = |pool: u16| fragsim::trace::PoolRef(if run.names_pools { pool } else { 0 });
    // The private pools' segments, by address: their releases name the pool.
    let mut private_segments = std::collections::HashMap::new();
    let mut seen = 0;
    let mut streams = std::collections::HashMap::new();
    // (base, size, stream, pool) of every reservation.
    let mut reservations: Vec<(u64, u64, u64, u16)> = Vec::new();
    let mut calls_made = 0u64;
    // Before a call: reserved bytes, and whether the next request would have hit the cache.
    let mut before_call: Option<(u64, bool, bool)> = None;
    let mut ambiguous = 0;
    let mut retries = 0;
    let mut unshown_captures = 0;
    let steps = workload(seed, 700);
    for (k, step) in steps.iter().cloned().enumerate() {
        let called = before_call.take();
        let deleted = run.graph_deleted_at.is_some_and(|at| k >= at);
        let capture = run.captures && (k / 60) % 3 == 1 && !deleted;
        let time = events.len() as i64;
        let mut log = |d: &Recording<SimDevice>,
                       events: &mut Vec<Event>,
                       stream: u64,
                       pool,
                       released_by: FramesId| {
            for c in &d.calls()[seen..] {
                // Every segment event carries its segment's (or reservation's) stream.
                let (action, addr, size) = match *c {
                    BackendCall::SegmentAlloc { size, addr: Some(a) } => {
                        streams.insert(a, stream);
                        if pool != 0 {
                            private_segments.insert(a, pool);
                        }
                        (Action::SegmentAlloc, a, size)
                    }
                    BackendCall::Reserve { size, addr: Some(a) } => {
                        reservations.push((a, size, stream, pool));
                        continue;
                    }
                    BackendCall::SegmentFree { addr, size } => (Action::SegmentFree, addr, size),
                    BackendCall::Map { addr, size, ok: true } => (Action::SegmentMap, addr, size),
                    BackendCall::Unmap { addr, size } => (Action::SegmentUnmap, addr, size),
                    _ => continue,
                };
                let reservation =
                    || reservations.iter().rev().find(|&&(a, n, ..)| a <= addr && addr < a + n);
                let s = match action {
                    Action::SegmentAlloc => stream,
                    Action::SegmentFree => streams.remove(&addr).unwrap_or(0),
                    _ => reservation().map_or(stream, |r| r.2),
                };
                // A segment event names the pool of its segment or reservation (a release made
                // by a default pool's malloc or by a flush may return a gone graph's memory).
                let pool = match action {
                    Action::SegmentFree => private_segments.remove(&addr).unwrap_or(0),
                    Action::SegmentAlloc => pool,
                    _ => reservation().map_or(pool, |r| r.3),
                };
                let e = Event::new(action, addr, size, s, time);
                let frames = match action {
                    Action::SegmentFree | Action::SegmentUnmap => released_by,
                    _ => FramesId::NONE,
                };
                events.push(Event { pool: pool_of(pool), frames, ..e });
            }
            seen = d.calls().len();
        };
        if run.graph_deleted_at == Some(k) {
            p.release_pool((1, 7)).unwrap();
            p.empty_cache(&mut d).unwrap();
            log(&d, &mut events, 0, 0, call_stack);
        }
        match step {
            Step::Alloc { id, size, stream } => {
                let in_mem_pool = run.mem_pool && (k / 50) % 4 == 2 && stream == 1;
                let pool = if capture && stream == 0 { 1 } else { 2 * u16::from(in_mem_pool) };
                // Whether the default pools could serve it, as a replay asks of a failed
                // request that names no pool.
                p.allocate_into(None).unwrap();
                let unroutable = pool == 1 && !run.names_pools && !p.would_hit_cache(size, stream);
                p.allocate_into(POOLS[pool as usize]).unwrap();
                let calls_before = d.calls().len();
                let retries_before = p.alloc_retries();
                let got = p.malloc(&mut d, size, stream).unwrap();
                retries += p.alloc_retries() - retries_before;
                let unshown = got.is_none() && unroutable && !releasable(&p);
                unshown_captures += u64::from(unshown);
                if let (Some((reserved, hit, told)), Some(cap)) = (called, run.capacity) {
                    let new: u64 = d.calls()[calls_before..]
                        .iter()
                        .map(|c| match *c {
                            BackendCall::SegmentAlloc { size, addr: Some(_) } => size,
                            BackendCall::Map { size, ok: true, .. } => size,
                            _ => 0,
                        })
                        .sum();
                    let failed = got.is_none();
                    let beyond = failed || new > 0 && reserved + new > cap;
                    ambiguous += u64::from(!told && !hit && beyond);
                }
                log(&d, &mut events, stream, pool, malloc_stack);
                let named = |e: Event| Event { pool: pool_of(pool), ..e };
                match got {
                    Some(a) => {
                        let e = named(Event::new(Action::Alloc, a.addr, size, stream, time));
                        events.push(Event { frames: npu_stack, ..e });
                        live.resize(live.len().max(id + 1), None);
                        live[id] = Some((a, size, stream, pool));
                    }
                    None => {
                        // PyTorch's `oom` entry: the device's free bytes, the rounded size.
                        let free = run.capacity.unwrap_or(0).saturating_sub(d.reserved());
                        let rounded = p.settings().round_size(size);
                        events.push(named(Event::new(Action::Oom, free, rounded, stream, time)));
                    }
                }
            }
            Step::Free { id } => {
                if let Some((a, size, stream, pool)) = live.get_mut(id).and_then(Option::take) {
                    p.free_handle(&mut d, a.addr, a.handle).unwrap();
                    log(&d, &mut events, stream, pool, FramesId::NONE); // expandable segments unmap nothing
                    for action in [Action::FreeRequested, Action::FreeCompleted] {
                        let e = Event::new(action, a.addr, size, stream, time);
                        events.push(Event { pool: pool_of(pool), ..e });
                    }
                }
            }
            // PyTorch refuses empty_cache() during a capture; between captures it keeps the
            // graph's pool (the graph lives), as the policy does.
            Step::EmptyCache if !capture => {
                calls_made += 1;
                let frameless = run.frameless_calls && calls_made % 2 == 0;
                if let Some(&Step::Alloc { size, stream, .. }) = steps.get(k + 1) {
                    let told = run.stacks && !frameless;
                    before_call = Some((d.reserved(), p.would_hit_cache(size, stream), told));
                }
                p.empty_cache(&mut d).unwrap();
                log(&d, &mut events, 0, 0, if frameless { FramesId::NONE } else { call_stack });
            }
            Step::EmptyCache => {}
        }
        p.check_invariants().unwrap();
    }
    let mut segments = p.segments();
    segments.iter_mut().for_each(|s| s.device = 0);
    let mallocs = d.segment_sizes().len() as u64;
    let releases =
        d.calls().iter().filter(|c| matches!(c, BackendCall::SegmentFree { .. })).count() as u64;
    let truth = Truth { retries, releases, mallocs, ambiguous, unshown_captures };
    let trace = Trace {
        format: Format::PytorchSnapshot,
        devices: vec![DeviceTrace {
            device: 0,
            events: events.split_off(run.cut.min(events.len())),
        }],
        segments,
        frames,
        allocator_settings: Some(settings),
        entry_pools: run.names_pools.then(|| {
            POOLS[1..if run.mem_pool { 3 } else { 2 }].iter().flatten().copied().collect()
        }),
        torch_npu: run.npu,
        ..Trace::default()
    };
    (trace, truth)
}

/// Whether `release_cached_blocks` would return anything of `p`'s cache now: a whole free
/// cudaMalloc segment, or a whole free page of an expandable segment, of the default pools.
fn releasable(p: &fragsim::policy::pytorch::PyTorch) -> bool {
    use fragsim::policy::Policy;
    use fragsim::trace::{BlockState, PoolKind};
    p.segments().iter().filter(|s| s.private_pool.is_none()).any(|s| {
        let mut free = s.blocks.iter().filter(|b| b.state == BlockState::Inactive);
        if !s.is_expandable {
            return free.count() == s.blocks.len();
        }
        let page: u64 = if s.pool == PoolKind::Small { 2 << 20 } else { 20 << 20 };
        free.any(|b| {
            let first = s.address + (b.address - s.address).div_ceil(page) * page;
            first + page <= b.address + b.size
        })
    })
}

/// `t` as a snapshot older than PyTorch ≈ 2.7 records it: no entry names its pool.
fn unnamed(t: &fragsim::trace::Trace) -> fragsim::trace::Trace {
    let mut t = t.clone();
    t.entry_pools = None;
    t.devices
        .iter_mut()
        .flat_map(|d| &mut d.events)
        .for_each(|e| e.pool = fragsim::trace::PoolRef::DEFAULT);
    t
}

/// [`recording`] across CUDA graph captures, default settings, no device limit.
fn captured_recording(seed: u64, cut: usize) -> fragsim::trace::Trace {
    recording(seed, Run { captures: true, cut, ..Run::PLAIN })
}

/// `replay -p pytorch`'s peak reserved bytes on `t`, as the command runs it: under the device
/// limit the recording shows, if it shows one, which is the GPU's memory only where the
/// recording's `oom` entries measured it.
fn replayed_peak(t: &fragsim::trace::Trace) -> u64 {
    use fragsim::recorded::CapacityKind;
    use fragsim::replay::{ReplayInput, ReplayOptions};
    let limit = fragsim::recorded::row_and_limit(t, 0).1;
    let capacity = limit.as_ref().and_then(|l| l.limit_bytes);
    let capacity_kind = limit.map_or(CapacityKind::GpuMemory, |l| l.capacity_kind());
    let input = ReplayInput::new(t, None).unwrap();
    let spec = fragsim::policy::PolicySpec::parse_list("pytorch").unwrap().remove(0);
    let options = ReplayOptions {
        capacity,
        capacity_kind,
        check_invariants: true,
        ..ReplayOptions::default()
    };
    let out = fragsim::policy::lookup("pytorch").unwrap().run(&spec, &input, &options);
    out.unwrap().result.peak_reserved_bytes
}

/// `replay -p pytorch`'s result on `t` as the command runs it ([`replayed_peak`]).
fn replayed_as_recorded(t: &fragsim::trace::Trace) -> fragsim::metrics::PolicyResult {
    replayed_input_as_recorded(&fragsim::replay::ReplayInput::new(t, None).unwrap(), t)
}

/// [`replayed_as_recorded`] of a replay input, loaded or streamed, under the limit the loaded
/// trace `t` shows.
fn replayed_input_as_recorded(
    input: &fragsim::replay::ReplayInput,
    t: &fragsim::trace::Trace,
) -> fragsim::metrics::PolicyResult {
    use fragsim::recorded::CapacityKind;
    use fragsim::replay::ReplayOptions;
    let limit = fragsim::recorded::row_and_limit(t, input.device()).1;
    let capacity = limit.as_ref().and_then(|l| l.limit_bytes);
    let capacity_kind = limit.map_or(CapacityKind::GpuMemory, |l| l.capacity_kind());
    let spec = fragsim::policy::PolicySpec::parse_list("pytorch").unwrap().remove(0);
    let options = ReplayOptions {
        capacity,
        capacity_kind,
        check_invariants: true,
        ..ReplayOptions::default()
    };
    let out = fragsim::policy::lookup("pytorch").unwrap().run(&spec, input, &options);
    out.unwrap().result
}

/// Issue 45: wherever `validate` reproduces a recording exactly (every address and segment
/// event), the free replay (`replay -p pytorch`: the recorded settings, under the limit the
/// recording shows) takes the same decisions: the recorded peak reserved, the recorded
/// allocator's out-of-memory flushes and its cudaMallocs. Recordings under memory pressure with
/// `empty_cache()` calls whose releases carry stacks, carry none, or only some do.
#[test]
fn wherever_validate_is_exact_the_free_replay_reproduces_the_recorded_decisions() {
    use fragsim::validate::{validate, ValidateOptions};
    let options = ValidateOptions::default();
    let (mut exact, mut retries, mut failures) = (0, 0, Vec::new());
    for conf in
        ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"]
    {
        for capacity in [Some(300 << 20), Some(200 << 20), Some(150 << 20)] {
            for seed in 0..8 {
                let kinds = [(false, false, false), (true, false, false), (true, true, false)];
                for (stacks, frameless_calls, captures) in
                    kinds.into_iter().chain([(true, true, true), (false, false, true)])
                {
                    let run =
                        Run { conf, capacity, stacks, frameless_calls, captures, ..Run::PLAIN };
                    let (t, truth) = recording_with_truth(seed, run);
                    let v = validate(&t, &options).unwrap();
                    if !v.mismatches.is_empty()
                        || v.allocs_addr_matched != v.allocs_total
                        || v.segment_events_matched != v.segment_events_recorded
                    {
                        continue;
                    }
                    exact += 1;
                    retries += truth.retries;
                    let recorded = fragsim::recorded::recorded(&t, 0).expect("segment events");
                    let r = replayed_as_recorded(&t);
                    let got = (
                        r.peak_reserved_bytes,
                        r.alloc_retries,
                        r.device_malloc_count,
                        r.device_free_count,
                    );
                    let want = (
                        recorded.peak_reserved_bytes,
                        truth.retries + truth.unshown_captures,
                        truth.mallocs,
                        truth.releases,
                    );
                    // A call no recording can tell from a fallback may be read as either: the
                    // same memory, at most one more retry each.
                    let retries_fit = (want.1..=want.1 + truth.ambiguous).contains(&got.1);
                    // Expandable segments map pages: their cudaMallocs and frees are none.
                    let pages = conf == "expandable_segments:True";
                    if got.0 != want.0
                        || !retries_fit
                        || (!pages && (got.2, got.3) != (want.2, want.3))
                    {
                        failures.push(format!(
                            "{conf:?}, {capacity:?}, seed {seed}, stacks {stacks}, frameless \
                             calls {frameless_calls}, captures {captures}: (peak, retries, \
                             mallocs, frees) replayed {got:?}, recorded {want:?} ({} ambiguous)",
                            truth.ambiguous
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {exact}:\n{}", failures.len(), failures.join("\n"));
    assert!(exact > 200 && retries > 50, "enough to test: {exact} exact, {retries} retries");
}

/// `replay -p pytorch --capacity C`'s result on `t` (`None`: unlimited).
fn replayed_on(t: &fragsim::trace::Trace, capacity: Option<u64>) -> fragsim::metrics::PolicyResult {
    use fragsim::replay::{ReplayInput, ReplayOptions};
    let input = ReplayInput::new(t, None).unwrap();
    let spec = fragsim::policy::PolicySpec::parse_list("pytorch").unwrap().remove(0);
    let options = ReplayOptions { capacity, check_invariants: true, ..ReplayOptions::default() };
    let out = fragsim::policy::lookup("pytorch").unwrap().run(&spec, &input, &options);
    out.unwrap().result
}

/// Checks that `validate` finds no mismatch in `t` and that `replay -p pytorch` reaches its
/// recorded peak, which a recording cut mid-run must do too (there, decisions that depend on a
/// block live before it may be undeterminable); `at` names the run in a failure. The validation
/// and the recorded figures.
fn reproduces(
    t: &fragsim::trace::Trace,
    at: &str,
) -> (fragsim::validate::Validation, fragsim::recorded::Recorded) {
    use fragsim::validate::{validate, ValidateOptions};
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let v = validate(t, &options).unwrap();
    assert!(v.mismatches.is_empty(), "{at}: {:?}", &v.mismatches[..1]);
    assert_eq!(v.segment_events_matched, v.segment_events_recorded, "{at}");
    let recorded = fragsim::recorded::recorded(t, 0).expect("segment events");
    assert_eq!(replayed_peak(t), recorded.peak_reserved_bytes, "{at}: replayed peak");
    (v, recorded)
}

/// [`reproduces`], and every address of `t` is determinable and reproduced: a recording made
/// from the start. The recorded figures.
fn reproduces_exactly(t: &fragsim::trace::Trace, at: &str) -> fragsim::recorded::Recorded {
    let (v, recorded) = reproduces(t, at);
    assert_eq!(v.allocs_addr_matched, v.allocs_total, "{at}");
    recorded
}

#[test]
fn recordings_across_graph_captures_validate_and_replay_to_their_recorded_peak() {
    use fragsim::validate::{validate, ValidateOptions};
    // An explicit flush at a level above the recorded peak reads as an OOM: replayed under the
    // limit the recording shows, as `replay` does.
    let replayed = replayed_peak;
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let mut unrouted_differs = 0;
    for seed in 0..16 {
        let t = captured_recording(seed, 0);
        assert!(t.segments.iter().any(|s| s.private_pool == Some((1, 7))), "seed {seed}");
        let recorded = fragsim::recorded::recorded(&t, 0).expect("segment events");
        let v = validate(&t, &options).unwrap();
        assert!(v.mismatches.is_empty(), "seed {seed}: {:?}", &v.mismatches[..1]);
        assert_eq!(v.allocs_addr_matched, v.allocs_total, "seed {seed}");
        assert_eq!(v.segment_events_matched, v.segment_events_recorded, "seed {seed}");
        assert_eq!(replayed(&t), recorded.peak_reserved_bytes, "seed {seed}: replayed peak");
        // Recording begun mid-run: the private segments that exist then are recovered from the
        // dump, and what the trace determines still reproduces.
        let v = validate(&captured_recording(seed, 400), &options).unwrap();
        assert!(v.mismatches.is_empty(), "seed {seed}, cut: {:?}", &v.mismatches[..1]);
        // The control: the same recording with no private pool in the dump.
        let mut shared = t.clone();
        shared.segments.iter_mut().for_each(|s| s.private_pool = None);
        let v = validate(&shared, &ValidateOptions::default()).unwrap();
        let differs = !v.mismatches.is_empty() || replayed(&shared) != recorded.peak_reserved_bytes;
        unrouted_differs += differs as u32;
    }
    assert!(unrouted_differs >= 8, "the private pool changed only {unrouted_differs} of 16 runs");
    // Under memory pressure: requests that fail during a capture (no release before their
    // `oom`, no address to tell their pool by) validate too, down to 120 MiB, where one fails
    // before any routed request has shown the pool (the dump's only private pool is taken).
    for capacity in [300u64 << 20, 200 << 20, 150 << 20, 120 << 20] {
        for seed in 0..12 {
            let run = Run { capacity: Some(capacity), captures: true, ..Run::PLAIN };
            let t = recording(seed, run);
            let v = validate(&t, &options).unwrap();
            assert!(v.mismatches.is_empty(), "{capacity}, seed {seed}: {:?}", &v.mismatches[..1]);
            assert_eq!(v.allocs_addr_matched, v.allocs_total, "{capacity}, seed {seed}");
        }
    }
}

#[test]
fn recordings_under_memory_pressure_validate_and_replay_exactly() {
    let confs = [
        "",
        "max_split_size_mb:64",
        "roundup_power2_divisions:4",
        "max_split_size_mb:32,roundup_power2_divisions:[256:2,>:8]",
        "expandable_segments:True",
    ];
    let (mut ooms, mut flushes) = (0, 0);
    for conf in confs {
        // Unlimited, and two devices the workload outgrows (out-of-memory fallbacks, failed
        // requests, the program's empty_cache() near the limit).
        for capacity in [None, Some(300 << 20), Some(200 << 20)] {
            for seed in 0..12 {
                let run = Run { conf, capacity, ..Run::PLAIN };
                let t = recording(seed, run);
                let at = format!("{conf:?}, {capacity:?}, seed {seed}");
                let recorded = reproduces_exactly(&t, &at);
                ooms += recorded.oom_count;
                flushes += t.devices[0]
                    .events
                    .iter()
                    .filter(|e| e.action == fragsim::trace::Action::SegmentFree)
                    .count();
                // The same run recorded from its 500th entry on: the replay starts from the
                // state the dump and the trace recover, expandable reservations included.
                reproduces(&recording(seed, Run { cut: 500, ..run }), &format!("{at}, cut"));
            }
        }
    }
    assert!(
        ooms > 100 && flushes > 500,
        "pressure enough to test: {ooms} OOMs, {flushes} releases"
    );
}

/// Recordings made by torch_npu's allocator (padding, base alignment, its options) under memory
/// pressure, with and without expandable segments and with the workload's `empty_cache()` calls,
/// validate exactly and replay to their recorded peak with `pytorch` alone, which follows the
/// recording; across graph captures they reproduce too, and recorded from the middle they
/// validate. Written as a pickle and read back, the snapshot is still torch_npu's.
#[test]
fn torch_npu_recordings_validate_and_replay_exactly() {
    use fragsim::validate::{validate, ValidateOptions};
    let confs = [
        "",
        "max_split_size_mb:64",
        "roundup_power2_divisions:4",
        "expandable_segments:True",
        "expandable_segments:True,base_addr_aligned_kb:4,segment_size_mb:40",
    ];
    let mut ooms = 0;
    for conf in confs {
        for capacity in [None, Some(300 << 20), Some(200 << 20)] {
            for seed in 0..6 {
                let run = Run { conf, capacity, npu: true, ..Run::PLAIN };
                let t = recording(seed, run);
                let at = format!("npu {conf:?}, {capacity:?}, seed {seed}");
                ooms += reproduces_exactly(&t, &at).oom_count;
                // Cut mid-run, validation finds no mismatch and the replay reaches the recorded
                // peak: the orphans whose sizes it depends on are proven by the trace.
                reproduces(&recording(seed, Run { cut: 500, ..run }), &format!("{at}, cut"));
            }
        }
    }
    assert!(ooms > 20, "pressure enough to test: {ooms} OOMs");
    for seed in 0..4 {
        let t = recording(seed, Run { captures: true, npu: true, ..Run::PLAIN });
        reproduces_exactly(&t, &format!("npu captures, seed {seed}"));
    }
    // CUDA's rules do not reproduce a torch_npu recording: the padding alone moves addresses.
    let t = recording(1, Run { npu: true, ..Run::PLAIN });
    let cuda = ValidateOptions {
        flavour: Some(fragsim::policy::pytorch::Flavour::Cuda),
        ..ValidateOptions::default()
    };
    assert!(!validate(&t, &cuda).unwrap().mismatches.is_empty());
    // As a file: read back without its frames, it is still torch_npu's, and validates exactly.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("npu.pickle");
    let t = recording(2, Run { conf: "expandable_segments:True", npu: true, ..Run::PLAIN });
    fragsim::trace::write_trace(&t, &path).unwrap();
    let back = fragsim::trace::read_trace(&path, &Default::default()).unwrap();
    assert!(back.torch_npu);
    let o = crate::util::run(&["validate", path.to_str().unwrap()]);
    let out = crate::util::stdout(&o) + &crate::util::stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("recorded by torch_npu"), "{out}");
}

/// Recordings whose entries name their pool (`pool_id`, PyTorch ≈ 2.7+): with the dump's
/// segments not saying theirs, the entries alone route every request into the graph's pool,
/// failed ones included (which have no address to tell their pool by), under memory pressure
/// down to 120 MiB and with `max_split_size_mb` or `roundup_power2_divisions` set.
/// Recorded from the middle of a run (the dump then says which segments the pool held at the
/// start, as PyTorch's does), they reproduce too. Read back from a pickle, `validate` reproduces
/// them as well.
#[test]
fn recordings_whose_entries_name_their_pool_validate_and_replay_exactly() {
    use fragsim::validate::{validate, ValidateOptions};
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let (mut unnamed_differs, mut own_releases) = (0, 0);
    // With max_split_size_mb:32 on 200 MiB, a capture's malloc releases an oversize block of
    // the graph's own pool (release_available_cached_blocks): that pool is not gone.
    let confs = ["", "max_split_size_mb:64", "max_split_size_mb:32", "roundup_power2_divisions:4"];
    let capacities = [None, Some(300u64 << 20), Some(200 << 20), Some(120 << 20)];
    for (conf, capacity) in confs.into_iter().flat_map(|c| capacities.map(|m| (c, m))) {
        for seed in 0..12 {
            let run = Run { conf, capacity, captures: true, names_pools: true, ..Run::PLAIN };
            let mut t = recording(seed, run);
            let at = format!("{conf:?}, {capacity:?}, seed {seed}");
            assert!(t.segments.iter().any(|s| s.private_pool.is_some()), "{at}");
            t.segments.iter_mut().for_each(|s| s.private_pool = None);
            assert!(t.devices[0].events.iter().any(|e| e.pool.0 == 1), "{at}: entries name it");
            own_releases += t.devices[0]
                .events
                .iter()
                .filter(|e| e.action == fragsim::trace::Action::SegmentFree && e.pool.0 == 1)
                .count();
            reproduces_exactly(&t, &at);
            for cut in [150, 400] {
                let v = validate(&recording(seed, Run { cut, ..run }), &options).unwrap();
                assert!(v.mismatches.is_empty(), "{at}, cut {cut}: {:?}", &v.mismatches[..1]);
            }
            // The control: the same recording with neither names nor a private pool in the
            // dump.
            if capacity.is_none() && conf.is_empty() {
                let v = validate(&unnamed(&t), &ValidateOptions::default()).unwrap();
                unnamed_differs += !v.mismatches.is_empty() as u32;
            }
        }
    }
    assert!(unnamed_differs >= 6, "the names changed only {unnamed_differs} of 12 runs");
    assert!(own_releases >= 2, "the graph's pool released its own segments {own_releases} times");

    // As a user runs it: the recording as a pickle, validated by the command.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("graphs.pickle");
    let run = Run { capacity: Some(200 << 20), captures: true, names_pools: true, ..Run::PLAIN };
    fragsim::trace::write_trace(&recording(3, run), &path).unwrap();
    let o = crate::util::run(&["validate", path.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["allocs_addr_matched"], v["allocs_total"], "{v}");
    assert_eq!(v["segment_events_matched"], v["segment_events_recorded"], "{v}");
    let text = stdout(&crate::util::run(&["validate", path.to_str().unwrap()]));
    assert!(text.contains("every entry names its pool (pool_id): "), "{text}");
    assert!(text.contains("the entries name the pool each request was made into"), "{text}");
    // Converted to .fst, whose replay streams the events: the same result as the loaded pickle,
    // the named pools carried through. With the dump's pools erased, this recording's peak
    // needs them.
    let mut t = recording(3, Run { captures: true, names_pools: true, ..Run::PLAIN });
    t.segments.iter_mut().for_each(|s| s.private_pool = None);
    assert_ne!(replayed_peak(&unnamed(&t)), replayed_peak(&t), "the names matter here");
    fragsim::trace::write_trace(&t, &path).unwrap();
    let fst = dir.path().join("graphs.fst");
    let o = crate::util::run(&["convert", path.to_str().unwrap(), fst.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (loaded, recorded) = cli_peaks(&path);
    assert_eq!(loaded, recorded, "the loaded replay reaches the recorded peak");
    assert_eq!(cli_peaks(&fst), (loaded, recorded), "the streamed replay: the same");
}

/// `replay FILE -p pytorch --json` as a user runs it: the peak reserved bytes of its `pytorch`
/// row and of its `recorded` row.
fn cli_peaks(file: &std::path::Path) -> (serde_json::Value, serde_json::Value) {
    let o = crate::util::run(&["replay", file.to_str().unwrap(), "-p", "pytorch", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = v["results"].as_array().unwrap();
    let row =
        |p: &str| rows.iter().find(|r| r["policy"] == p).unwrap()["peak_reserved_bytes"].clone();
    (row("pytorch"), row("recorded"))
}

/// A recording whose graph is deleted mid-run (its entries name their pools): the program's
/// next `empty_cache()`, and every flush after it, releases the graph's free segments too, as
/// PyTorch releases a private pool once nothing uses it. The replay and `validate` learn it
/// from the first release that names the pool, though that release comes after the default
/// pools' in the same flush.
#[test]
fn a_deleted_graph_s_segments_are_released_by_the_next_flush() {
    let mut released = 0;
    for capacity in [None, Some(300u64 << 20)] {
        for seed in 0..10 {
            let deleted = Some(400);
            let run = Run {
                capacity,
                captures: true,
                names_pools: true,
                graph_deleted_at: deleted,
                ..Run::PLAIN
            };
            let t = recording(seed, run);
            let at = format!("{capacity:?}, seed {seed}");
            let events = &t.devices[0].events;
            let named_releases = events
                .iter()
                .filter(|e| e.action == fragsim::trace::Action::SegmentFree && e.pool.0 == 1)
                .count();
            released += named_releases;
            let recorded = reproduces_exactly(&t, &at);
            let input = fragsim::replay::ReplayInput::new(&t, None).unwrap();
            let spec = fragsim::policy::PolicySpec::parse_list("pytorch").unwrap().remove(0);
            let capacity = fragsim::recorded::row_and_limit(&t, 0).1.and_then(|l| l.limit_bytes);
            let options = fragsim::replay::ReplayOptions { capacity, ..Default::default() };
            let out = fragsim::policy::lookup("pytorch").unwrap().run(&spec, &input, &options);
            let out = out.unwrap().result;
            assert_eq!(out.reserved_at_end_bytes, recorded.reserved_at_end_bytes, "{at}: at end");
            let frees = recorded.segment_counts.map(|c| c[1]);
            assert_eq!(Some(out.device_free_count), frees, "{at}: cudaFrees");
        }
    }
    assert!(released >= 20, "the deleted graph released only {released} segments");
}

/// Expandable segments on devices the workload far outgrows: a request that fails after
/// reserving a new pool's address range maps nothing, and the range shows only where a later
/// malloc of that stream *and pool* maps into it (a small-pool malloc maps one 2 MiB page, a
/// large-pool one whole 20 MiB pages); the other pool's first map on the stream is elsewhere.
#[test]
fn expandable_recordings_on_small_devices_validate_exactly() {
    for capacity in [150u64 << 20, 120 << 20, 100 << 20] {
        for seed in 0..24 {
            let run =
                Run { conf: "expandable_segments:True", capacity: Some(capacity), ..Run::PLAIN };
            let t = recording(seed, run);
            reproduces_exactly(&t, &format!("{capacity}, seed {seed}"));
        }
    }
}

/// Expandable segments across graph captures. PyTorch ≈ 2.5+ gives the graph's pool expandable
/// segments of its own (one reservation per stream and pool, PR #128068); before, its requests
/// got cudaMalloc segments while the default pools mapped pages. Recordings of both validate
/// exactly and replay to their recorded peak, told apart by what they show: where the entries
/// name their pools, with the dump's pools erased; and, as in older snapshots, where only the
/// dump's ranges say which pages are the graph's. Recorded from the middle of a run, too. A
/// graph deleted mid-run has its free pages unmapped by the next flush.
#[test]
fn expandable_recordings_across_graph_captures_validate_and_replay_exactly() {
    use fragsim::policy::pytorch::{start::PrivatePoolMemory, Version};
    use fragsim::trace::Action;
    use fragsim::validate::{validate, ValidateOptions};
    let before = Version { major: 2, minor: 4 };
    let (mut unmapped_when_gone, mut unrouted_differs) = (0, 0);
    // (version, entries name pools, graph deleted at, a MemPool with its own allocator).
    let variants = [
        (Version::CURRENT, true, None, false),
        (Version::CURRENT, false, None, false),
        (Version::CURRENT, true, Some(400), false),
        (Version::CURRENT, true, None, true),
        (before, false, None, false),
    ];
    for (version, names_pools, graph_deleted_at, mem_pool) in variants {
        // Down to 120 MiB where the entries name the pool of each failed request too; an older
        // snapshot's failed request has no address to tell its pool by.
        let capacities =
            [None, Some(300u64 << 20), Some(200 << 20), Some(150 << 20), Some(120 << 20)];
        for capacity in capacities {
            for seed in 0..10 {
                let run = Run {
                    conf: "expandable_segments:True",
                    capacity,
                    captures: true,
                    names_pools,
                    graph_deleted_at,
                    version,
                    mem_pool,
                    ..Run::PLAIN
                };
                let mut t = recording(seed, run);
                let at = format!(
                    "{version}, named {names_pools}, deleted at {graph_deleted_at:?}, mem pool {mem_pool}, {capacity:?}, seed {seed}"
                );
                let events = &t.devices[0].events;
                let own = version >= (Version { major: 2, minor: 5 });
                // What each PyTorch makes for the graph: mapped pages, or cudaMalloc segments.
                let cudamallocs = events.iter().filter(|e| e.action == Action::SegmentAlloc);
                assert_eq!(cudamallocs.count() == 0, own && !mem_pool, "{at}");
                let memory = PrivatePoolMemory::recorded(&t, 0, events);
                assert_eq!(memory.expandable, Some(own), "{at}");
                assert_eq!(memory.own_allocator, if mem_pool { vec![(2, 9)] } else { vec![] });
                if graph_deleted_at.is_some() {
                    let unmaps = events.iter().filter(|e| e.action == Action::SegmentUnmap);
                    unmapped_when_gone += unmaps.filter(|e| e.pool.0 == 1).count();
                }
                if names_pools {
                    t.segments.iter_mut().for_each(|s| s.private_pool = None);
                } else if graph_deleted_at.is_none() {
                    assert!(t.segments.iter().any(|s| s.private_pool.is_some()), "{at}");
                }
                reproduces_exactly(&t, &at);
                reproduces(&recording(seed, Run { cut: 400, ..run }), &format!("{at}, cut"));
                // The control: no names and no private pool in the dump.
                if own && graph_deleted_at.is_none() && !mem_pool {
                    let mut unrouted = unnamed(&t);
                    unrouted.segments.iter_mut().for_each(|s| s.private_pool = None);
                    let v = validate(&unrouted, &ValidateOptions::default()).unwrap();
                    unrouted_differs += !v.mismatches.is_empty() as u32;
                }
            }
        }
    }
    assert!(unmapped_when_gone >= 10, "the deleted graph unmapped {unmapped_when_gone} ranges");
    assert!(unrouted_differs >= 40, "the pools changed only {unrouted_differs} of 80 runs");

    // As a user runs it: each kind as a pickle, validated and replayed by the commands, which
    // say what the recording showed.
    let dir = tempfile::tempdir().unwrap();
    let kinds = [
        (Version::CURRENT, true, "mapping pages of their own reservations"),
        (before, false, "getting cudaMalloc segments (PyTorch before ≈ 2.5)"),
    ];
    for (version, names_pools, says) in kinds {
        let run = Run {
            conf: "expandable_segments:True",
            capacity: Some(200 << 20),
            captures: true,
            names_pools,
            version,
            ..Run::PLAIN
        };
        let path = dir.path().join(format!("graphs-{version}.pickle"));
        fragsim::trace::write_trace(&recording(2, run), &path).unwrap();
        let file = path.to_str().unwrap();
        let o = crate::util::run(&["validate", file]);
        let text = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "{version}: {text}{}", stderr(&o));
        assert!(text.contains("result: valid") && text.contains(says), "{version}: {text}");
        let (replayed, recorded) = cli_peaks(&path);
        assert_eq!(replayed, recorded, "{version}: the replay's peak");
    }
}

/// An expandable recording on a GPU larger than the model's default (288 GiB, a B300's, where it
/// assumes 80 GiB) with a memory fraction whose limit the run never reaches there, but would on
/// 80 GiB. Where the recorded layout fixes the GPU's memory (`validate` infers it from the gap
/// between reservations), `replay` with no `--capacity` takes it from there too, so the fraction
/// limits the replay as it limited the recording: never (on 80 GiB every replay runs out of
/// memory); recorded from the middle of the run too. (A layout where one stream and pool
/// reserved twice, back to back, fixes nothing: no single size fits both.)
#[test]
fn replays_of_expandable_recordings_take_the_gpu_memory_from_their_layout() {
    use fragsim::validate::{validate, ValidateOptions, Warning};
    let conf = "expandable_segments:True,per_process_memory_fraction:0.002";
    let gpu = 288u64 << 30;
    let mut fixed = 0;
    for cut in [0, 400] {
        for seed in 0..12 {
            let run = Run { conf, gpu_memory: Some(gpu), cut, ..Run::PLAIN };
            let t = recording(seed, run);
            let at = format!("cut {cut}, seed {seed}");
            let recorded = fragsim::recorded::recorded(&t, 0).expect("segment events");
            assert_eq!(recorded.oom_count, 0, "{at}: 0.002 of 288 GiB is never reached");
            assert!(recorded.peak_reserved_bytes > (80u64 << 30) / 500, "{at}: 0.002 of 80 GiB is");
            let v = validate(&t, &ValidateOptions::default()).unwrap();
            let inferred = v
                .notes
                .iter()
                .any(|n| matches!(n, Warning::InferredGpuMemory { bytes, .. } if *bytes == gpu));
            if inferred {
                fixed += 1;
                let out = replayed_on(&t, None);
                assert!(!out.oom, "{at}: the fraction of 288 GiB limits the replay: {out:?}");
                assert!(out.peak_reserved_bytes > (80u64 << 30) / 500, "{at}");
            }
        }
    }
    assert!(fixed >= 8, "the layout fixed the GPU's memory in only {fixed} of 24 recordings");
}

/// A memory fraction of a card larger than the 80 GiB assumed without one (0.002 of a 288 GiB
/// card, 590 MB): every recording reserves more than 0.002 of 80 GiB (164 MiB) allows, which
/// proves the card larger. `validate` and `replay` model at least the memory that lets the
/// recorded peak through, so the recording reproduces; under 80 GiB, `validate` found 81 to 162
/// mismatches in these and `replay` failed below the recorded peak.
#[test]
fn recordings_under_a_memory_fraction_of_a_larger_card_reproduce() {
    use fragsim::validate::{validate, ValidateOptions, Warning};
    let conf = "per_process_memory_fraction:0.002";
    for seed in 0..6 {
        let t = recording(seed, Run { conf, gpu_memory: Some(288 << 30), ..Run::PLAIN });
        let at = format!("seed {seed}");
        let recorded = reproduces_exactly(&t, &at);
        let peak = recorded.peak_reserved_bytes;
        assert!(peak > (80u64 << 30) / 500, "{at}: 0.002 of 80 GiB is below the recorded peak");
        let v = validate(&t, &ValidateOptions::default()).unwrap();
        let least = v.notes.iter().find_map(|n| match n {
            Warning::GpuMemoryFromPeak { bytes, peak: p, assumed } => Some((*bytes, *p, *assumed)),
            _ => None,
        });
        let (bytes, noted_peak, assumed) = least.unwrap_or_else(|| panic!("{at}: {:?}", v.notes));
        assert_eq!((noted_peak, assumed), (peak, 80 << 30), "{at}");
        assert!(bytes / 500 <= peak && peak <= bytes * 2 / 1000, "{at}: {bytes} for {peak}");
        assert!(bytes <= 288 << 30, "{at}: more than the card had");
        // Given the card, nothing is raised.
        let given = ValidateOptions { gpu_memory: Some(288 << 30), ..ValidateOptions::default() };
        let v = validate(&t, &given).unwrap();
        assert!(v.mismatches.is_empty(), "{at}");
        assert!(!v.notes.iter().any(|n| matches!(n, Warning::GpuMemoryFromPeak { .. })), "{at}");
    }
    // As a user runs it, loaded and streamed: the replay reaches the recorded peak, and
    // `validate` says what it modelled.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fraction.pickle");
    fragsim::trace::write_trace(
        &recording(2, Run { conf, gpu_memory: Some(288 << 30), ..Run::PLAIN }),
        &path,
    )
    .unwrap();
    let fst = dir.path().join("fraction.fst");
    let o = crate::util::run(&["convert", path.to_str().unwrap(), fst.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for file in [&path, &fst] {
        let (replayed, recorded) = cli_peaks(file);
        assert_eq!(replayed, recorded, "{}", file.display());
    }
    let o = crate::util::run(&["validate", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o) + &stderr(&o);
    assert!(text.contains("the recorded per_process_memory_fraction let a peak of"), "{text}");
}

/// An `empty_cache()` the program called at a level above the recorded peak reads as an
/// out-of-memory flush, so `replay` infers a device limit at the peak. That limit is the level
/// the recorded allocator stopped at, not the card's memory: a recorded memory fraction taken of
/// it again (0.01 of 415 MB) failed every request, and `replay` printed a peak of 0 to 2 MiB.
/// Replayed as a user runs it (loaded and streamed), the recording reaches its recorded peak.
#[test]
fn a_limit_inferred_from_a_flush_is_not_the_memory_a_fraction_is_taken_of() {
    use fragsim::recorded::CapacityKind;
    let dir = tempfile::tempdir().unwrap();
    let mut inferred = 0;
    for conf in ["per_process_memory_fraction:0.005", "per_process_memory_fraction:0.01"] {
        for seed in 0..8 {
            let t = recording(seed, Run { conf, capacity: Some(80 << 30), ..Run::PLAIN });
            let limit = fragsim::recorded::row_and_limit(&t, 0).1.unwrap();
            if limit.limit_bytes.is_none() || limit.capacity_kind() == CapacityKind::GpuMemory {
                continue;
            }
            inferred += 1;
            let at = format!("{conf}, seed {seed}");
            let recorded = reproduces(&t, &at).1.peak_reserved_bytes;
            assert_eq!(limit.limit_bytes, Some(recorded), "{at}: inferred at the peak");
            let path = dir.path().join(format!("{seed}.pickle"));
            fragsim::trace::write_trace(&t, &path).unwrap();
            let fst = dir.path().join(format!("{seed}.fst"));
            let o = crate::util::run(&["convert", path.to_str().unwrap(), fst.to_str().unwrap()]);
            assert!(o.status.success(), "{}", stderr(&o));
            for file in [&path, &fst] {
                let (replayed, row) = cli_peaks(file);
                assert_eq!(replayed, recorded, "{at}: {}", file.display());
                assert_eq!(row, recorded, "{at}: the recorded row");
            }
        }
    }
    assert!(inferred >= 2, "only {inferred} recordings had a limit inferred from a flush");
}

/// Recordings whose releases carry the stacks PyTorch records (`emptyCache` for the program's
/// calls, `release_cached_blocks` under `malloc` for an out-of-memory fallback): the stacks,
/// not the levels, say which flush was which, so the device limit follows from the real
/// fallbacks only, every call is replayed as a call, and `replay -p pytorch` as a user runs it
/// (read back from a pickle, frames not asked for) reaches the recorded peak.
#[test]
fn recordings_whose_releases_carry_stacks_are_read_by_their_stacks() {
    use fragsim::recorded::limit::FlushKind;
    let dir = tempfile::tempdir().unwrap();
    let (mut calls, mut fallbacks, mut level_misread) = (0, 0, 0);
    for capacity in [None, Some(300 << 20), Some(200 << 20)] {
        for seed in 0..6 {
            let run = Run { capacity, stacks: true, ..Run::PLAIN };
            let t = recording(seed, run);
            let at = format!("{capacity:?}, seed {seed}");
            let recorded = reproduces_exactly(&t, &at);
            let limit = fragsim::recorded::row_and_limit(&t, 0).1.unwrap();
            for f in &limit.flushes {
                assert!(
                    matches!(
                        f.kind,
                        FlushKind::EmptyCacheByStack
                            | FlushKind::OutOfMemoryByStack
                            | FlushKind::FailedRetry
                    ),
                    "{at}: {f:?}"
                );
                calls += usize::from(f.kind == FlushKind::EmptyCacheByStack);
                fallbacks += usize::from(f.kind == FlushKind::OutOfMemoryByStack);
            }
            // Without the stacks, the levels read some calls as fallbacks (or the reverse).
            let mut frameless = t.clone();
            frameless.devices[0].events.iter_mut().for_each(|e| e.frames = Default::default());
            let by_levels = fragsim::recorded::row_and_limit(&frameless, 0).1.unwrap();
            level_misread += by_levels
                .flushes
                .iter()
                .zip(&limit.flushes)
                .filter(|(a, b)| a.kind.is_empty_cache() != b.kind.is_empty_cache())
                .count();
            if seed < 2 {
                let path = dir.path().join(format!("{seed}.pickle"));
                fragsim::trace::write_trace(&t, &path).unwrap();
                let (replayed, row) = cli_peaks(&path);
                assert_eq!(replayed, recorded.peak_reserved_bytes, "{at}");
                assert_eq!(row, recorded.peak_reserved_bytes, "{at}: the recorded row");
            }
        }
    }
    assert!(calls > 20 && fallbacks > 5, "{calls} calls, {fallbacks} fallbacks");
    assert!(level_misread > 0, "the stacks decided nothing the levels did not");
}

/// `validate` takes `--format table|json|csv` as every command printing results does: `--format
/// json` is `--json`, and the CSV's one row holds the JSON object's scalar fields.
#[test]
fn validate_takes_format_like_every_command() {
    let path = crate::util::real_trace("cs336-medium-ctx512-infer.pickle");
    let p = path.to_str().unwrap();
    let json = crate::util::run(&["validate", p, "--format", "json"]);
    assert!(json.status.success(), "{}", stderr(&json));
    assert_eq!(stdout(&json), stdout(&crate::util::run(&["validate", p, "--json"])));
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let csv = stdout(&crate::util::run(&["validate", p, "--format", "csv"]));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "{csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let row: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(header.len(), row.len(), "{csv}");
    let at =
        |k: &str| row[header.iter().position(|h| *h == k).unwrap_or_else(|| panic!("{k}: {csv}"))];
    assert_eq!(at("allocs_total"), v["allocs_total"].to_string());
    assert_eq!(at("allocs_addr_matched"), v["allocs_addr_matched"].to_string());
}

/// A program's `empty_cache()` right before a malloc that then runs out of memory records the
/// same entries as that malloc's own out-of-memory fallback (releases, then `oom`). Replayed as
/// a fallback, the malloc first finds the block the call released and takes it; the recorded
/// allocator's cache was empty by then. With torch_npu's padding and 4 divisions, 200 MiB
/// recordings show such calls; they replay to their recorded peak, from the start and cut
/// mid-run, with either allocator's rules.
#[test]
fn an_empty_cache_call_before_a_failed_malloc_is_replayed_as_a_call() {
    use fragsim::trace::Action;
    let mut calls_before_oom = 0;
    for npu in [false, true] {
        for seed in 0..24 {
            let conf = "roundup_power2_divisions:4";
            let run = Run { conf, capacity: Some(200 << 20), npu, ..Run::PLAIN };
            let t = recording(seed, run);
            let at = format!("npu {npu}, seed {seed}");
            reproduces_exactly(&t, &at);
            reproduces(&recording(seed, Run { cut: 500, ..run }), &format!("{at}, cut"));
            // The recording's own times tell the call (the step before) from the fallback.
            let e = &t.devices[0].events;
            calls_before_oom += (1..e.len())
                .filter(|&i| e[i].action == Action::SegmentFree && e[i - 1].time_us != e[i].time_us)
                .filter(|&i| {
                    let next = e[i..]
                        .iter()
                        .find(|x| !matches!(x.action, Action::SegmentFree | Action::FreeCompleted));
                    next.is_some_and(|x| x.action == Action::Oom && x.time_us != e[i].time_us)
                })
                .count();
        }
    }
    assert!(calls_before_oom > 0, "no empty_cache() call right before a failed malloc");
}

/// Recordings cut mid-run with `roundup_power2_divisions`: a block live before the cut (an
/// orphan) may have taken a cached block one division step larger than its request rounds to,
/// unsplit (at most 1 MiB left over). The start state's default guess then leaves a free room
/// after it that the recorded allocator did not have; a replay that places a request there
/// reserves less, or later more, than the recording. The trace proves such sizes (the first
/// placement after the orphan, a cache miss the room would have served), and the replay's
/// start state takes them: with torch_npu's rules (its padding makes these blocks common) and
/// CUDA's, the replay reaches the recorded peak, loaded and streamed from `.fst`.
#[test]
fn cut_recordings_with_divisions_replay_to_their_recorded_peak() {
    use fragsim::policy::pytorch::{start::StartState, Config};
    let mut longer = 0;
    for npu in [false, true] {
        for conf in ["roundup_power2_divisions:4", "roundup_power2_divisions:[256:2,>:8]"] {
            for seed in 0..12 {
                let run = Run { conf, npu, cut: 500, ..Run::PLAIN };
                let t = recording(seed, run);
                reproduces(&t, &format!("npu {npu}, {conf:?}, seed {seed}"));
                let config =
                    if npu { Config::parse_npu(conf) } else { Config::parse(conf, run.version) };
                let config = config.unwrap();
                let start = StartState::recover(&t, 0, &t.devices[0].events, &config);
                longer += start
                    .segments
                    .iter()
                    .filter(|s| !s.small)
                    .flat_map(|s| &s.live)
                    .filter(|b| b.orphan && b.size > config.round_size(b.request))
                    .count();
            }
        }
    }
    assert!(longer > 0, "no orphan longer than its rounded request");
    // As files: the streamed replay recovers the same start state from its digest.
    let dir = tempfile::tempdir().unwrap();
    for seed in [3, 7] {
        let run = Run { conf: "roundup_power2_divisions:4", npu: true, cut: 500, ..Run::PLAIN };
        let path = dir.path().join(format!("cut{seed}.pickle"));
        fragsim::trace::write_trace(&recording(seed, run), &path).unwrap();
        let fst = dir.path().join(format!("cut{seed}.fst"));
        let o = crate::util::run(&["convert", path.to_str().unwrap(), fst.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let (loaded, recorded) = cli_peaks(&path);
        assert_eq!(loaded, recorded, "seed {seed}: the loaded replay reaches the recorded peak");
        assert_eq!(cli_peaks(&fst), (loaded, recorded), "seed {seed}: streamed, the same");
    }
}

/// `sweep` and `check` replay under the limit a recording implies, as `replay` does: with no
/// `--capacity` (or `recorded`) the recorded settings reach the recorded peak and every result
/// says the capacity it ran under; `none` replays unlimited. A baseline recorded under one
/// capacity refuses a run under another (exit 2) instead of reading the difference as a
/// regression or an improvement.
#[test]
fn sweep_and_check_replay_under_the_limit_the_recording_implies() {
    let dir = tempfile::tempdir().unwrap();
    // A recording of a 200 MiB device with stacks: its out-of-memory flushes imply the limit.
    let (t, limit, ran_out) = (0..8)
        .map(|seed| recording(seed, Run { capacity: Some(200 << 20), stacks: true, ..Run::PLAIN }))
        .find_map(|t| {
            let (row, limit) = fragsim::recorded::row_and_limit(&t, 0);
            let (limit, ran_out) = (limit?.limit_bytes?, row?.oom?);
            Some((t, limit, ran_out))
        })
        .expect("a 200 MiB recording with an inferred limit");
    let recorded = reproduces_exactly(&t, "200 MiB").peak_reserved_bytes;
    let path = dir.path().join("limited.pickle");
    fragsim::trace::write_trace(&t, &path).unwrap();
    let p = path.to_str().unwrap();
    let (replayed, _) = cli_peaks(&path);
    assert_eq!(replayed, recorded, "replay reaches the recorded peak");

    let sweep = |extra: &[&str]| {
        let mut args = vec!["sweep", p, "-p", "pytorch-expandable", "--json"];
        args.extend_from_slice(extra);
        let o = crate::util::run(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let row = v["results"].as_array().unwrap().iter().find(|r| r["spec"] == "pytorch").cloned();
        (v["capacity"].clone(), row.unwrap())
    };
    let mut reference_oom = serde_json::Value::Null;
    for flags in [&[][..], &["--capacity", "recorded"][..]] {
        let (setting, reference) = sweep(flags);
        reference_oom = reference["first_oom_event"].clone();
        assert_eq!(setting, "recorded", "{flags:?}");
        assert_eq!(reference["capacity_bytes"], limit, "{flags:?}");
        assert_eq!(reference["peak_reserved_bytes"], recorded, "{flags:?}: the recorded settings");
        assert_eq!(reference["oom"], ran_out, "{flags:?}: out of memory where the recording was");
    }
    let (setting, unlimited) = sweep(&["--capacity", "none"]);
    assert_eq!(setting, "none");
    assert!(unlimited.get("capacity_bytes").is_none(), "{unlimited}");
    let o = crate::util::run(&["sweep", p, "-p", "pytorch-expandable"]);
    let table = stdout(&o);
    assert!(table.contains("inferred from the recording); --capacity none"), "{table}");
    // Where the recording itself ran out, the sweep says so: the reference runs out there too.
    let said = format!("the recording itself ran out of memory (first at event {reference_oom})");
    assert_eq!(stderr(&o).contains(&said), ran_out, "{}", stderr(&o));

    // check: the baseline records the capacity; another capacity does not compare.
    let base = dir.path().join("base.json");
    let b = base.to_str().unwrap();
    let o = crate::util::run(&["check", p, "--baseline", b, "--update"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    assert_eq!(saved["rows"][0]["capacity_bytes"], limit, "{saved}");
    let o = crate::util::run(&["check", p, "--baseline", b]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("the limit the recording implies"), "{}", stderr(&o));
    let o = crate::util::run(&["check", p, "--baseline", b, "--capacity", "none"]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("another capacity than the baseline's") && err.contains("unlimited"),
        "{err}"
    );
    let csv = stdout(&crate::util::run(&["check", p, "--baseline", b, "--format", "csv"]));
    assert_eq!(csv.lines().next(), Some("kind,trace,policy,config,metric,baseline,now,change"));

    // fit names the recording's limit beside the needs: the recorded settings need more than
    // it exactly when the recording ran out of memory under it.
    let o = crate::util::run(&["fit", p, "-p", "pytorch", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["recorded_limit_bytes"], limit, "{v}");
    let need = v["results"][0]["min_capacity_bytes"].as_u64().unwrap();
    assert_eq!(need > limit, ran_out, "need {need}, limit {limit}");
}

/// The recorded flushes `validate`'s plan makes as the program's `empty_cache()` calls are
/// exactly those a replay makes, event for event: otherwise `validate` would check the model on
/// another program than the one `replay` runs. The plan takes the calls a replay reads
/// (`EmptyCacheRuns`: stacks, then levels) and gives the other release runs to mallocs by its
/// own segment-run rule, which must add no call. Every real snapshot, read with and without
/// frames, and recordings with both kinds of flush, with and without the stacks that tell them
/// apart. (The runs the levels leave undecided are neither: a replay asks its policy about each
/// at run time, and `validate` gives each to its malloc, which checks the model on that.)
#[test]
fn validate_and_replay_take_the_same_flushes_for_empty_cache_calls() {
    use fragsim::replay::ReplayInput;
    use fragsim::trace::lifetimes::{FlushCause, FlushCauses};
    use fragsim::trace::{read_trace, ReadOptions, Trace};
    use fragsim::validate::planned_empty_cache_calls;
    let (mut traces, mut calls, mut fallbacks) = (0, 0, 0);
    let mut disagree = Vec::new();
    let mut check = |t: &Trace, at: &str| {
        traces += 1;
        let causes = FlushCauses::of(&t.frames);
        for d in &t.devices {
            let by_stack = |e: &&fragsim::trace::Event| causes.get(e.frames);
            fallbacks +=
                d.events.iter().filter(|e| by_stack(e) == Some(FlushCause::OutOfMemory)).count();
            let planned = planned_empty_cache_calls(t, d.device).unwrap();
            let input = ReplayInput::of_events(t, d.device, &d.events).unwrap();
            let replayed = input.empty_cache_at();
            let only = |a: &[u64], b: &[u64]| -> Vec<String> {
                let shown = |&i: &u64| format!("{i} ({})", d.events[i as usize].action.name());
                a.iter().filter(|i| !b.contains(i)).map(shown).collect()
            };
            if planned != replayed {
                disagree.push(format!(
                    "{at}, device {}: calls only validate's plan makes: {:?}; only replay's: {:?}",
                    d.device,
                    only(&planned, replayed),
                    only(replayed, &planned),
                ));
            }
            calls += planned.len();
        }
    };
    for path in &crate::util::real_snapshots() {
        for keep_frames in [false, true] {
            let t = read_trace(path, &ReadOptions { keep_frames, ..ReadOptions::default() });
            check(&t.unwrap(), &format!("{}, frames kept: {keep_frames}", path.display()));
        }
    }
    for conf in ["", "expandable_segments:True", "garbage_collection_threshold:0.5"] {
        for capacity in [None, Some(300 << 20), Some(200 << 20)] {
            for seed in 0..4 {
                for stacks in [false, true] {
                    let at = format!("{conf:?}, {capacity:?}, seed {seed}, stacks {stacks}");
                    let run = Run { conf, capacity, stacks, ..Run::PLAIN };
                    let t = recording(seed, run);
                    check(&t, &at);
                    check(&recording(seed, Run { cut: 500, ..run }), &format!("{at}, cut"));
                    let mut frameless = t.clone();
                    frameless.frames = Default::default();
                    frameless.devices[0]
                        .events
                        .iter_mut()
                        .for_each(|e| e.frames = Default::default());
                    check(&frameless, &format!("{at}, frames dropped"));
                }
            }
        }
    }
    assert!(disagree.is_empty(), "{} disagreements:\n{}", disagree.len(), disagree.join("\n"));
    assert!(
        traces > 100 && calls > 100 && fallbacks > 5,
        "{traces} traces, {calls} calls, {fallbacks} releases in a fallback: the check reads little"
    );
}

/// The events of `text` (fragsim's text format) as a PyTorch snapshot records them, its dump
/// one large-pool segment of the default pools at `segment` of 20 MiB tiled by `blocks`
/// (address, size, allocated), and no recorded settings.
fn snapshot_of_text(
    text: &str,
    segment: u64,
    blocks: &[(u64, u64, bool)],
) -> fragsim::trace::Trace {
    use fragsim::trace::{Block, BlockState, PoolKind, Segment};
    let mut t = fragsim::trace::text::read(text.as_bytes(), &Default::default()).unwrap();
    t.format = fragsim::trace::Format::PytorchSnapshot;
    let block = |&(address, size, allocated): &(u64, u64, bool)| Block {
        address,
        size,
        requested_size: if allocated { size } else { 0 },
        state: if allocated { BlockState::ActiveAllocated } else { BlockState::Inactive },
    };
    t.segments = vec![Segment {
        device: 0,
        address: segment,
        total_size: 20 << 20,
        stream: 0,
        pool: PoolKind::Large,
        is_expandable: false,
        private_pool: None,
        blocks: blocks.iter().map(block).collect(),
    }];
    t
}

/// Issue 45: a recorded `oom` that no release of its malloc precedes, where the recorded cache
/// held a wholly free segment of the default pool, shows a graph capture: outside one, PyTorch's
/// last fallback would have released that segment (and then found room for the request). Read
/// as a capture, `validate` reproduces the recording and the replay its peak; read as none, the
/// model would release the segment and serve the request.
#[test]
fn an_oom_with_a_free_segment_cached_and_no_release_is_read_as_a_capture() {
    use fragsim::validate::{validate, ValidateOptions};
    // A 20 MiB segment, its one block freed: wholly free. The 40 MiB request fails with 30 MiB
    // free on a 50 MiB device, and no release precedes its entry.
    let text = "segment_alloc 0x10000000 20971520\nalloc 0x10000000 9437184\n\
                free 0x10000000 9437184\noom 31457280 41943040\n";
    let t = snapshot_of_text(text, 0x1000_0000, &[(0x1000_0000, 20 << 20, false)]);
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let v = validate(&t, &options).unwrap();
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    assert_eq!(v.segment_events_matched, v.segment_events_recorded);
    let r = replayed_as_recorded(&t);
    assert_eq!(r.peak_reserved_bytes, 20 << 20, "the replay keeps the free segment");
    assert!(r.oom, "and the request fails, as recorded");
    assert_eq!(r.alloc_retries, 0, "no fallback ran during the capture");
}

/// A `.fst` of a recording whose `oom` entries show graph captures (no release before them while
/// the cache held a free segment) replays streamed, as `replay` of a `.fst` runs, exactly as it
/// does loaded: the same captured OOMs, and the same result under the recorded limit. Before, a
/// streamed replay found no capture, released the cache where the recording could not, and
/// served a request the recording failed.
#[test]
fn a_streamed_fst_finds_the_captured_ooms_the_loaded_trace_does() {
    use fragsim::replay::ReplayInput;
    use fragsim::trace::fst::FstStream;
    let text = "segment_alloc 0x10000000 20971520\nalloc 0x10000000 9437184\n\
                free 0x10000000 9437184\noom 31457280 41943040\n";
    let mut cases = vec![snapshot_of_text(text, 0x1000_0000, &[(0x1000_0000, 20 << 20, false)])];
    for capacity in [200u64 << 20, 150 << 20, 120 << 20] {
        for seed in 0..4 {
            let run = Run { capacity: Some(capacity), captures: true, ..Run::PLAIN };
            cases.push(recording(seed, run));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut captured = 0;
    for (k, t) in cases.iter().enumerate() {
        let path = dir.path().join(format!("{k}.fst"));
        fragsim::trace::write_trace(t, &path).unwrap();
        let back = fragsim::trace::read_trace(&path, &Default::default()).unwrap();
        let file = FstStream::open(&path).unwrap().expect("a .fst that streams");
        let loaded = ReplayInput::new(&back, Some(0)).unwrap();
        let streamed = ReplayInput::streamed(&file, Some(0)).unwrap();
        assert_eq!(streamed.captured_ooms(), loaded.captured_ooms(), "case {k}");
        captured += !loaded.captured_ooms().is_empty() as u32;
        let a = replayed_input_as_recorded(&loaded, &back);
        let b = replayed_input_as_recorded(&streamed, &back);
        assert_eq!(
            (a.peak_reserved_bytes, a.oom, a.alloc_retries),
            (b.peak_reserved_bytes, b.oom, b.alloc_retries),
            "case {k}"
        );
        assert_eq!(a.first_oom_event, b.first_oom_event, "case {k}");
    }
    assert!(captured >= 4, "only {captured} of {} cases show a capture", cases.len());
}

/// Issue 45: a recorded `oom` that no release of its malloc precedes, where the recorded cache
/// had nothing to release (its one segment holds a live block), shows no capture: the fallback
/// ran and found nothing. A what-if whose cache does hold a free segment there releases it, as
/// the real allocator would, and the request then fits. Here the what-if rounds by
/// `roundup_power2_divisions:2`: each 9 MiB request takes a 12 MiB segment of its own, the
/// first is wholly free when the 30 MiB request (32 MiB) comes, and on the recorded 48 MiB
/// device only its release makes room.
#[test]
fn an_oom_with_nothing_releasable_recorded_lets_a_what_if_release_its_free_segment() {
    use fragsim::replay::{ReplayInput, ReplayOptions};
    use fragsim::validate::{validate, ValidateOptions};
    let text = "segment_alloc 0x10000000 20971520\nalloc 0x10000000 9437184\n\
                alloc 0x10900000 9437184\nfree 0x10000000 9437184\noom 29360128 31457280\n";
    let blocks = [(0x1000_0000, 9 << 20, false), (0x1090_0000, 9 << 20, true)];
    let t =
        snapshot_of_text(text, 0x1000_0000, &[blocks[0], blocks[1], (0x1120_0000, 2 << 20, false)]);
    // As recorded: the fallback releases nothing, retries once and fails.
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let v = validate(&t, &options).unwrap();
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    let r = replayed_as_recorded(&t);
    assert_eq!((r.peak_reserved_bytes, r.oom, r.alloc_retries), (20 << 20, true, 1));
    // The what-if, on the same device.
    let input = ReplayInput::new(&t, None).unwrap();
    let spec = fragsim::policy::PolicySpec::parse_list("pytorch:roundup_power2_divisions:2")
        .unwrap()
        .remove(0);
    let options =
        ReplayOptions { capacity: Some(48 << 20), check_invariants: true, ..Default::default() };
    let out = fragsim::policy::lookup("pytorch").unwrap().run(&spec, &input, &options);
    let r = out.unwrap().result;
    assert!(!r.oom, "the what-if released its free segment and served the request: {r:?}");
    assert_eq!((r.alloc_retries, r.device_free_count), (1, 1));
    assert_eq!(r.peak_reserved_bytes, (12 + 32) << 20);
}
