//! A `.fst` replay streamed from the file (what `replay` does) gives exactly what the same file
//! replayed loaded gives: every policy's result (but its timing), its peak detail and its final
//! segments, on the real snapshots and on random workloads with blocks live at the start, orphan
//! and double frees, reused addresses, recorded `empty_cache()` runs, `--capacity` OOMs,
//! `--empty-cache-every` and `--stop-after`-style cuts.

use fragsim::policy::{PolicySpec, POLICIES};
use fragsim::replay::{EmptyCachePlan, ReplayInput, ReplayOptions, ReplayOutput};
use fragsim::testing::{workload, Step};
use fragsim::trace::fst::FstStream;
use fragsim::trace::{
    read_trace, write_trace, Action, Block, BlockState, DeviceTrace, Event, PoolKind, ReadOptions,
    Segment, Trace,
};
use std::path::Path;

const MIB: u64 = 1 << 20;

/// Every built-in policy's output on `input`, timings zeroed.
fn outputs(input: &ReplayInput, options: &ReplayOptions) -> Vec<ReplayOutput> {
    POLICIES
        .iter()
        .map(|info| {
            let spec = PolicySpec { name: info.name.into(), options: String::new() };
            let mut out = info.run(&spec, input, options).unwrap_or_else(|e| panic!("{e}"));
            out.result.replay_seconds = 0.0;
            out.result.planning_seconds = out.result.planning_seconds.map(|_| 0.0);
            out
        })
        .collect()
}

/// Replays the .fst at `path` loaded and streamed under each of `options` and asserts the same
/// outputs; returns the loaded outputs for further checks.
fn same_both_ways(path: &Path, options: &[ReplayOptions]) -> Vec<Vec<ReplayOutput>> {
    let trace = read_trace(path, &ReadOptions { keep_frames: true, ..ReadOptions::default() })
        .unwrap_or_else(|e| panic!("{e}"));
    let file = FstStream::open(path).unwrap().expect("an .fst of this version streams");
    let mut all = Vec::new();
    for device in trace.devices.iter().map(|d| d.device) {
        let loaded = ReplayInput::new(&trace, Some(device)).unwrap();
        let streamed = ReplayInput::streamed(&file, Some(device)).unwrap();
        assert!(streamed.is_streamed() && !loaded.is_streamed());
        assert_eq!(streamed.event_count(), loaded.event_count());
        assert_eq!(streamed.live_at_start(), loaded.live_at_start(), "{}", path.display());
        assert_eq!(streamed.empty_cache_at(), loaded.empty_cache_at());
        assert_eq!(streamed.captured_ooms(), loaded.captured_ooms());
        assert_eq!(streamed.frees_at(), loaded.frees_at());
        for o in options {
            let (a, b) = (outputs(&loaded, o), outputs(&streamed, o));
            for (a, b) in a.iter().zip(&b) {
                let what = format!("{} {} {o:?}", path.display(), a.result.policy);
                assert_eq!(a.result, b.result, "{what}");
                assert_eq!(a.detail, b.detail, "{what}");
                assert_eq!(a.segments, b.segments, "{what}");
            }
            all.push(a);
        }
    }
    all
}

/// The option sets every file is replayed under.
fn option_sets(capacity: u64) -> Vec<ReplayOptions> {
    let every = |n| EmptyCachePlan { every: Some(n), ..EmptyCachePlan::default() };
    vec![
        ReplayOptions::default(),
        ReplayOptions { capacity: Some(capacity), ..ReplayOptions::default() },
        ReplayOptions { empty_cache: every(97), ..ReplayOptions::default() },
        ReplayOptions {
            empty_cache: EmptyCachePlan { drop_recorded: true, at: vec![5, 40], ..every(0) },
            stop_after: Some(700),
            ..ReplayOptions::default()
        },
    ]
}

#[test]
fn real_snapshots_replay_the_same_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut names: Vec<_> = std::fs::read_dir(&real)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "the real snapshots are in traces/real");
    let mut ooms = 0;
    for pickle in names {
        let trace = read_trace(&pickle, &ReadOptions::default()).unwrap();
        let fst = dir.path().join(pickle.with_extension("fst").file_name().unwrap());
        write_trace(&trace, &fst).unwrap();
        // Half the bound's peak: every policy runs out of memory somewhere.
        let peak = {
            let input = ReplayInput::new(&trace, None).unwrap();
            let spec = PolicySpec { name: "bound".into(), options: String::new() };
            let bound = fragsim::policy::lookup("bound").unwrap();
            bound.run(&spec, &input, &ReplayOptions::default()).unwrap().result.peak_reserved_bytes
        };
        // The plain replay and the capacity one (the workloads below take every option set).
        let runs = same_both_ways(&fst, &option_sets(peak / 2)[..2]);
        ooms += runs.iter().flatten().filter(|o| o.result.oom).count();
    }
    assert!(ooms > 0, "the capacity runs hit OOMs");
}

/// `steps` as recorded events on fresh addresses, with segment events around `empty_cache()`
/// steps (a flush run, sometimes followed by a malloc's `segment_alloc`, which makes it no call),
/// an address reused while its block is live (its free unrecorded) and a double free.
fn recorded(steps: &[Step], seed: u64) -> Vec<Event> {
    let addr = |id: usize| 0x7f00_0000_0000 + id as u64 * 64 * MIB;
    let mut sizes = std::collections::HashMap::new();
    let mut out = Vec::new();
    let mut t = 0i64;
    let mut push = |out: &mut Vec<Event>, a, addr, size, stream| {
        t += 1;
        out.push(Event::new(a, addr, size, stream, t));
    };
    for (k, s) in steps.iter().enumerate() {
        match *s {
            Step::Alloc { id, size, stream } => {
                sizes.insert(id, (size, stream));
                push(&mut out, Action::Alloc, addr(id), size, stream);
            }
            Step::Free { id } => {
                let (size, stream) = sizes[&id];
                push(&mut out, Action::FreeRequested, addr(id), size, stream);
                push(&mut out, Action::FreeCompleted, addr(id), size, stream);
                if (k as u64 + seed) % 211 == 0 {
                    push(&mut out, Action::FreeCompleted, addr(id), size, stream);
                }
            }
            Step::EmptyCache => {
                push(
                    &mut out,
                    Action::SegmentFree,
                    0x10_0000_0000 + k as u64 * 2 * MIB,
                    2 * MIB,
                    0,
                );
                push(&mut out, Action::FreeCompleted, 0x20_0000_0000, 512, 0);
                if k % 3 == 0 {
                    push(&mut out, Action::SegmentAlloc, 0x10_0000_0000, 20 * MIB, 0);
                }
            }
        }
        if k % 389 == 17 {
            // An alloc at the address of a block still live: the recording lost its free.
            if let Some((&id, &(size, stream))) = sizes.iter().min_by_key(|(id, _)| **id) {
                push(&mut out, Action::Alloc, addr(id), size / 2 + 1, stream);
            }
        }
    }
    out
}

/// A trace from workload `seed` with its first third cut (orphan frees: blocks live at the
/// start), final segments holding two live blocks no event allocated, on two devices.
fn workload_trace(seed: u64, len: usize) -> Trace {
    let events = recorded(&workload(seed, len), seed);
    let cut = events.len() / 3;
    let events = events[cut..].to_vec();
    let block = |address, size, requested_size| Block {
        address,
        size,
        requested_size,
        state: BlockState::ActiveAllocated,
    };
    let segments = vec![Segment {
        device: 0,
        address: 0x30_0000_0000,
        total_size: 20 * MIB,
        stream: 0,
        pool: PoolKind::Large,
        is_expandable: false,
        private_pool: None,
        blocks: vec![
            block(0x30_0000_0000, 4 * MIB, 3 * MIB),
            block(0x30_0040_0000, 16 * MIB, 9 * MIB),
        ],
    }];
    let other = events.iter().take(300).copied().collect();
    Trace {
        devices: vec![DeviceTrace { device: 0, events }, DeviceTrace { device: 3, events: other }],
        segments,
        has_times: true,
        ..Trace::default()
    }
}

#[test]
fn workloads_replay_the_same_streamed() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..4 {
        let trace = workload_trace(seed, 6000);
        let fst = dir.path().join(format!("w{seed}.fst"));
        write_trace(&trace, &fst).unwrap();
        let runs = same_both_ways(&fst, &option_sets(600 * MIB));
        let first = &runs[0];
        assert!(first.iter().all(|o| o.detail.live_at_start > 2), "orphans and final blocks");
        assert!(first.iter().all(|o| o.detail.orphan_frees > 0), "double frees count as orphans");
        assert!(runs[1].iter().any(|o| o.result.oom), "the capacity runs hit OOMs");
        assert!(runs[2].iter().all(|o| o.detail.empty_cache_calls > 0));
    }
}

/// A snapshot recorded with expandable segments (a replay of the bundled trace exported as a
/// snapshot: 31 `segment_map` entries at several addresses) replays streamed as it does loaded.
/// Before, the streamed digest kept only the first mapping, so every range mapped later in the
/// trace was taken as mapped before it (2 ranges at the start and 3 mappings, not 0 and 31).
#[test]
fn an_expandable_snapshot_replays_the_same_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let exported = dir.path().join("expandable.pickle");
    let trace = crate::util::bundled("gpt-4l-512h.txt");
    let o = crate::util::run(&[
        "replay",
        trace.to_str().unwrap(),
        "-p",
        "pytorch-expandable",
        "--export-snapshot",
        exported.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", crate::util::stderr(&o));
    let snapshot = read_trace(&exported, &ReadOptions::default()).unwrap();
    let maps = snapshot.devices[0].events.iter().filter(|e| e.action == Action::SegmentMap);
    let addresses: std::collections::BTreeSet<u64> = maps.map(|e| e.addr).collect();
    assert!(addresses.len() > 2, "mappings at several addresses: {addresses:?}");
    let fst = dir.path().join("expandable.fst");
    write_trace(&snapshot, &fst).unwrap();
    let runs = same_both_ways(&fst, &option_sets(1 << 30));
    let pytorch = runs[0].iter().find(|o| o.result.policy == "pytorch").unwrap();
    assert_eq!(pytorch.result.start_map_count, 0, "nothing mapped before the first event");
}

#[test]
fn only_a_plain_fst_file_of_this_version_streams() {
    let dir = tempfile::tempdir().unwrap();
    let trace = workload_trace(7, 30_000); // more than one record
    let (fst, gz, txt) =
        (dir.path().join("a.fst"), dir.path().join("a.fst.gz"), dir.path().join("a.txt"));
    for p in [&fst, &gz, &txt] {
        write_trace(&trace, p).unwrap();
    }
    assert!(FstStream::open(&fst).unwrap().is_some());
    assert!(FstStream::open(&gz).unwrap().is_none(), "compressed: loaded");
    assert!(FstStream::open(&txt).unwrap().is_none(), "not .fst: loaded");
    // A cut file is refused by the first pass, as loading refuses it, naming the file.
    let data = std::fs::read(&fst).unwrap();
    let cut = dir.path().join("cut.fst");
    std::fs::write(&cut, &data[..data.len() - 5]).unwrap();
    let file = FstStream::open(&cut).unwrap().expect("the head is whole");
    let err = ReplayInput::streamed(&file, None).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("cut.fst") && err.contains("truncated"), "{err}");
    let err = ReplayInput::streamed(&file, Some(9)).map(|_| ()).unwrap_err().to_string();
    assert_eq!(err, "the trace has no device 9 (devices: 0, 3)");
}

/// `replay --json` output without what differs between runs of the same results (timings) and
/// between the two files (their names).
fn comparable(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", crate::util::stderr(o));
    let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    v["trace"] = serde_json::Value::Null;
    crate::util::untimed(v)
}

#[test]
fn the_cli_streams_an_fst_and_reports_what_loading_reports() {
    let dir = tempfile::tempdir().unwrap();
    let trace = workload_trace(11, 4000);
    let (fst, gz) = (dir.path().join("w.fst"), dir.path().join("w.fst.gz"));
    write_trace(&trace, &fst).unwrap();
    write_trace(&trace, &gz).unwrap();
    let (fst, gz) = (fst.to_str().unwrap(), gz.to_str().unwrap());
    for extra in
        [&[][..], &["--capacity", "300MiB"], &["--empty-cache-every", "50", "--device", "3"]]
    {
        let args = |path| [&["replay", path, "-p", "all", "--json"][..], extra].concat();
        let streamed = crate::util::run(&args(fst));
        let loaded = crate::util::run(&args(gz));
        assert_eq!(comparable(&streamed), comparable(&loaded), "{extra:?}");
        // A planner makes the .fst load (once, for every policy), and that is said; a file
        // that loads anyway needs no note.
        let note = "offline plans with every lifetime: the events of";
        assert!(
            crate::util::stderr(&streamed).contains(note),
            "{}",
            crate::util::stderr(&streamed)
        );
        assert!(!crate::util::stderr(&loaded).contains(note));
    }
    let online = crate::util::run(&["replay", fst, "-p", "pytorch", "-p", "bfc", "--json"]);
    assert!(crate::util::stderr(&online).is_empty(), "{}", crate::util::stderr(&online));
    // A corrupt file: the streamed replay refuses it with the loader's message and exit code.
    let mut data = std::fs::read(fst).unwrap();
    data[40] ^= 0x55;
    let bad = dir.path().join("bad.fst");
    std::fs::write(&bad, data).unwrap();
    let bad = bad.to_str().unwrap();
    let (replay, info) = (crate::util::run(&["replay", bad]), crate::util::run(&["info", bad]));
    assert_eq!(replay.status.code(), Some(2));
    assert_eq!(crate::util::stderr(&replay), crate::util::stderr(&info));
    assert!(crate::util::stderr(&replay).contains("checksum mismatch"));
}

/// A damaged `.fst` (a byte changed, or cut short, anywhere: head, record lengths, checksums,
/// bodies) never panics the streamed replay, and it refuses exactly the files the loader refuses;
/// what both accept replays the same both ways.
#[test]
fn damaged_files_stream_as_they_load() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.fst");
    // Several records (at most 16384 events each), so that damage past the head is read only
    // by the passes over the records.
    let trace = workload_trace(5, 60_000);
    assert!(trace.devices.iter().map(|d| d.events.len()).sum::<usize>() > 40_000);
    write_trace(&trace, &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let mut rng = fragsim::testing::Rng::new(12);
    let bad = dir.path().join("bad.fst");
    let (mut refused, mut replayed) = (0, 0);
    for round in 0..90 {
        let mut data = bytes.clone();
        match round % 3 {
            _ if round == 0 => {} // the undamaged file
            0 => data.truncate(rng.index(data.len())),
            1 => {
                let at = rng.index(data.len());
                data[at] ^= 1 << rng.below(8);
            }
            _ => {
                // Damage early (head, first lengths and checksums), where it matters most.
                let at = rng.index(data.len().min(64));
                data[at] = rng.below(256) as u8;
            }
        }
        std::fs::write(&bad, &data).unwrap();
        let loaded = read_trace(&bad, &ReadOptions::default());
        let Ok(Some(file)) = FstStream::open(&bad) else {
            continue; // refused at the head, or not an .fst file of this version: loaded, not streamed
        };
        for (device, _) in file.devices() {
            let streamed = ReplayInput::streamed(&file, Some(device));
            match (&loaded, streamed) {
                (Err(_), Err(_)) => refused += 1,
                (Ok(trace), Ok(streamed)) => {
                    let loaded = ReplayInput::new(trace, Some(device)).unwrap();
                    let options = [ReplayOptions::default()];
                    for (a, b) in
                        outputs(&loaded, &options[0]).iter().zip(outputs(&streamed, &options[0]))
                    {
                        assert_eq!(a.result, b.result, "round {round}");
                    }
                    replayed += 1;
                }
                (Err(e), Ok(_)) => {
                    panic!("round {round}: the loader refuses ({e}), streaming accepts")
                }
                (Ok(_), Err(e)) => {
                    panic!("round {round}: streaming refuses ({e}), the loader accepts")
                }
            }
        }
    }
    // Both outcomes are exercised: the undamaged file, and damage the passes find past the head.
    println!("damaged .fst: {refused} refused both ways, {replayed} replayed the same both ways");
    assert!(refused > 20 && replayed > 0, "refused {refused}, replayed {replayed}");
}

#[test]
fn replays_sharing_one_reader_match_the_loaded_replays() {
    // `run_specs` on a streamed file runs the online replays in lockstep (one reader decoding
    // the file once for all of them, a chunk at a time); a planner loads the events itself, on a
    // thread beside them (after them with one job). Every replay must be what the loaded trace
    // gives, with every jobs setting (groups of two make several passes; one job runs them one
    // after another) and option set (capacity OOMs, added flushes, a cut at --stop-after).
    use fragsim::replay::{run_specs, Jobs, RunSettings};
    let dir = tempfile::tempdir().unwrap();
    let trace = workload_trace(5, 60_000); // several chunks of 16,384 events
    let fst = dir.path().join("w.fst");
    write_trace(&trace, &fst).unwrap();
    let file = FstStream::open(&fst).unwrap().expect("an .fst of this version streams");
    let streamed = ReplayInput::streamed(&file, None).unwrap();
    let loaded = ReplayInput::new(&trace, None).unwrap();
    assert!(streamed.event_count() > 3 * 16_384, "{}", streamed.event_count());
    let mut specs: Vec<PolicySpec> = PolicySpec::parse_list("all").unwrap();
    assert!(specs.iter().any(|s| s.name == "offline"), "a planner beside the shared reader");
    specs.push(PolicySpec::parse_list("pytorch:max_split_size_mb:64").unwrap().remove(0));
    let jobs = [Jobs::AllCores, Jobs::from_count(Some(2)), Jobs::from_count(Some(1))];
    let sets = option_sets(600 * MIB);
    for options in [&sets[1], &sets[2], &sets[3]] {
        let settings = RunSettings { record_events_of: Some(1), ..RunSettings::default() };
        let want = run_specs(&specs, &loaded, options, &settings).unwrap();
        for jobs in jobs {
            let got = run_specs(&specs, &streamed, options, &RunSettings { jobs, ..settings })
                .unwrap_or_else(|e| panic!("{jobs:?}: {e}"));
            assert_eq!(got.runs.len(), specs.len());
            for (a, b) in want.runs.iter().zip(&got.runs) {
                let what = format!("{jobs:?} {} {options:?}", a.output.result.policy);
                assert_eq!(a.index, b.index, "{what}");
                let untimed = |o: &ReplayOutput| {
                    let mut r = o.result.clone();
                    r.replay_seconds = 0.0;
                    r.planning_seconds = r.planning_seconds.map(|_| 0.0);
                    r
                };
                assert_eq!(untimed(&a.output), untimed(&b.output), "{what}");
                assert_eq!(a.output.detail, b.output.detail, "{what}");
                assert_eq!(a.output.segments, b.output.segments, "{what}");
                assert_eq!(a.output.events, b.output.events, "{what}");
            }
        }
    }
}

#[test]
fn an_fst_of_a_snapshot_validates_as_the_snapshot_and_one_of_a_text_trace_is_refused() {
    use crate::util::{run, stderr, stdout, temp_file};
    // A warm snapshot: its window holds no segment event, yet it records the allocator's
    // decisions (its final segments); its .fst says it came from a snapshot.
    let pickle = crate::util::real_trace("cs336-medium-ctx512-infer.pickle");
    let dir = tempfile::tempdir().unwrap();
    let fst = dir.path().join("i.fst");
    let (pickle_s, fst_s) = (pickle.to_str().unwrap(), fst.to_str().unwrap());
    let o = run(&["convert", pickle_s, fst_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let validate = |path: &str| {
        let o = run(&["validate", path, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{path}: {}", stderr(&o));
        let mut v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v.as_object_mut().unwrap().remove("trace");
        v
    };
    let from_pickle = validate(pickle_s);
    assert_eq!(from_pickle["segment_events_recorded"], 0);
    assert_eq!(validate(fst_s), from_pickle);
    // A text trace records no decisions, in .fst as in text.
    let (tdir, text) = temp_file("t.txt", b"alloc 0x1000 4096\nfree_completed 0x1000 4096\n");
    let tfst = tdir.path().join("t.fst");
    let o = run(&["convert", text.to_str().unwrap(), tfst.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["validate", tfst.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("validate needs a PyTorch memory snapshot"), "{}", stderr(&o));
}
