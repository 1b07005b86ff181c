//! Integration tests: PyTorch memory snapshots (reading real files, hostile input, writing).
//!
//! The real-data expectations come from `traces/real/expected-counts.json`, made
//! independently with Python's `pickle`; fixture pickles are generated at test time with
//! `python3` (present on CI), so they are Python's own output, not ours.

#[allow(unused_imports)]
use crate::util::*;
#[allow(unused_imports)]
use fragsim::error::{ErrorKind, Place};
#[allow(unused_imports)]
use fragsim::trace::{self, snapshot, Action, BlockState, Format, PoolKind, ReadOptions, Trace};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
#[allow(unused_imports)]
use std::process::Command;
#[allow(unused_imports)]
use std::time::{Duration, Instant};

fn read_file(path: &Path, keep_frames: bool) -> Trace {
    let options = ReadOptions { keep_frames, ..ReadOptions::default() };
    trace::read_trace(path, &options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Frees of addresses the trace never allocated, and trace allocations still live at the end.
fn orphans_and_live(events: &[fragsim::trace::Event]) -> (u64, u64) {
    let mut live = HashSet::new();
    let mut orphans = 0;
    for e in events {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr);
            }
            Action::FreeCompleted if !live.remove(&e.addr) => orphans += 1,
            _ => {}
        }
    }
    (orphans, live.len() as u64)
}

#[test]
fn every_real_snapshot_matches_the_python_counts() {
    let expected = expected_counts();
    let mut checked = 0;
    for (name, want) in expected.as_object().expect("an object") {
        if want["format"] != "pytorch-snapshot" {
            continue;
        }
        let path = real_trace(name);
        let t = read_file(&path, false);
        assert_eq!(t.format, Format::PytorchSnapshot);
        assert!(t.has_times, "{name}: these 2.5+ snapshots record time_us");
        let want_devices = want["devices"].as_array().expect("devices");
        assert_eq!(t.devices.len(), want_devices.len(), "{name}");
        for (d, w) in t.devices.iter().zip(want_devices) {
            assert_eq!(d.device as i64, w["device"].as_i64().unwrap(), "{name}");
            assert_eq!(d.events.len() as u64, w["events"].as_u64().unwrap(), "{name}");
            let mut by_action: BTreeMap<String, u64> = BTreeMap::new();
            for e in &d.events {
                *by_action.entry(e.action.name().to_string()).or_default() += 1;
            }
            let want_by: BTreeMap<String, u64> = w["by_action"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect();
            assert_eq!(by_action, want_by, "{name}");
            let sizes = d.events.iter().filter(|e| e.action == Action::Alloc).map(|e| e.size);
            assert_eq!(sizes.clone().min(), w["alloc_size_min"].as_u64(), "{name}");
            assert_eq!(sizes.max(), w["alloc_size_max"].as_u64(), "{name}");
            let (orphans, live) = orphans_and_live(&d.events);
            assert_eq!(orphans, w["orphan_frees"].as_u64().unwrap(), "{name}");
            assert_eq!(live, w["allocated_in_trace_live_at_end"].as_u64().unwrap(), "{name}");
            // Times are real and never go backwards within a device.
            assert!(d.events.windows(2).all(|w| w[0].time_us <= w[1].time_us), "{name}");
            assert!(d.events[0].time_us > 1_600_000_000_000_000, "{name}: µs since 1970");
        }
        assert_eq!(t.segments.len() as u64, want["segments_at_dump"].as_u64().unwrap(), "{name}");
        let reserved: u64 = t.segments.iter().map(|s| s.total_size).sum();
        assert_eq!(reserved, want["reserved_at_dump_bytes"].as_u64().unwrap(), "{name}");
        assert_eq!(
            t.allocator_settings.is_some(),
            want["has_allocator_settings"].as_bool().unwrap(),
            "{name}"
        );
        // Every segment's blocks tile it exactly, in address order.
        for s in &t.segments {
            let mut at = s.address;
            for b in &s.blocks {
                assert_eq!(b.address, at, "{name}: segment {:#x}", s.address);
                at += b.size;
            }
            assert_eq!(at - s.address, s.total_size, "{name}");
        }
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} snapshots checked");
}

#[test]
fn the_largest_snapshot_reads_its_settings_segments_and_frames() {
    let path = real_trace("cs336-medium-ctx512-train.pickle");
    let t = read_file(&path, true);
    let s = t.allocator_settings.as_ref().expect("settings");
    // From the file (checked with python3): conf '', max_split_size -1, all divisions 0.
    assert_eq!(s.conf, None);
    assert_eq!(s.max_split_size, None);
    assert_eq!(s.garbage_collection_threshold, 0.0);
    assert!(!s.expandable_segments);
    assert_eq!(s.roundup_power2_divisions, [0; 16]);
    // First segment: 0x703A00000 (30125588480), 20 MiB, large, first block 16 MiB allocated.
    let first = &t.segments[0];
    assert_eq!(first.address, 30_125_588_480);
    assert_eq!(first.total_size, 20 << 20);
    assert_eq!(first.pool, PoolKind::Large);
    assert_eq!(first.blocks[0].size, 16 << 20);
    assert_eq!(first.blocks[0].requested_size, 16 << 20);
    assert_eq!(first.blocks[0].state, BlockState::ActiveAllocated);
    // First event: alloc of 8 MiB at 33390854144, time 1783874667632574, frames kept.
    let e = t.devices[0].events[0];
    assert_eq!((e.action, e.addr, e.size, e.stream), (Action::Alloc, 33_390_854_144, 8 << 20, 0));
    assert_eq!(e.time_us, 1_783_874_667_632_574);
    let frames = t.frames.get(e.frames);
    assert_eq!(frames.len(), 58); // len(entry["frames"]) in Python
    assert_eq!(frames[0].name, "torch::unwind::unwind()");
    assert_eq!(frames[0].filename, "??");
    assert_eq!(frames[23].name, "forward");
    assert_eq!(frames[23].line, 54);
    assert!(frames[23].filename.ends_with("cs336_basics/model.py"));
    // Without frames, no event refers to any.
    let t2 = read_file(&path, false);
    assert!(t2.frames.is_empty());
    assert!(t2.devices[0].events.iter().all(|e| e.frames == fragsim::trace::FramesId::NONE));
}

#[test]
fn shared_frame_lists_are_interned_once() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let t = read_file(&path, true);
    let ids: HashSet<_> = t.devices[0].events.iter().map(|e| e.frames).collect();
    // Every distinct id is one interned list, and lists are shared by many events.
    assert_eq!(ids.len(), t.frames.len() + ids.contains(&fragsim::trace::FramesId::NONE) as usize);
    assert!(t.frames.len() * 2 < t.devices[0].events.len(), "{} stacks", t.frames.len());
}

/// Runs `python3 -c SCRIPT ARGS...`, returning stdout; fails the test if Python fails.
fn python(script: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 is installed (the snapshot tests need it to make fixtures)");
    assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A small snapshot in PyTorch's 2.5+ schema, with one frame list shared by three entries and a
/// segment block, a stream above 2^63, an oom, an annotate and a snapshot entry.
const FIXTURE: &str = r#"
import pickle, sys
fr = [{'filename': 'a.py', 'line': 3, 'name': 'f'}, {'filename': 'b.py', 'line': 7, 'name': 'g\u00e9'}]
base = 2**40
s = 2**63 + 5
snap = {
  'segments': [{'device': 1, 'address': base, 'total_size': 2097152, 'allocated_size': 512,
     'active_size': 512, 'requested_size': 100, 'stream': s, 'segment_type': 'small',
     'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],
     'blocks': [
        {'address': base, 'size': 512, 'requested_size': 100, 'state': 'active_allocated', 'frames': fr},
        {'address': base + 512, 'size': 2097152 - 512, 'requested_size': 0, 'state': 'inactive', 'frames': []}]}],
  'device_traces': [[], [
     {'action': 'segment_alloc', 'addr': base, 'size': 2097152, 'stream': s, 'time_us': 10, 'frames': fr},
     {'action': 'alloc', 'addr': base, 'size': 100, 'stream': s, 'time_us': 11, 'frames': fr},
     {'action': 'oom', 'device_free': 12345, 'size': 4194304, 'stream': 0, 'time_us': 12, 'frames': []},
     {'action': 'annotate', 'addr': base, 'size': 0, 'stream': 0, 'time_us': 13, 'user_metadata': 'x'},
     {'action': 'free_requested', 'addr': base, 'size': 100, 'stream': s, 'time_us': 14, 'frames': fr},
     {'action': 'free_completed', 'addr': base, 'size': 100, 'stream': s, 'time_us': 15},
     {'action': 'snapshot', 'addr': 0, 'size': 512, 'stream': 0, 'time_us': 16, 'compile_context': 'N/A'}]],
  'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': 'garbage_collection_threshold:0.6',
     'max_split_size': -1, 'garbage_collection_threshold': 0.6, 'expandable_segments': False,
     'pinned_num_register_threads': 1, 'release_lock_on_cudamalloc': True,
     'pinned_use_cuda_host_register': False,
     'roundup_power2_divisions': {str(2**i): (4 if i == 3 else 0) for i in range(16)}},
  'external_annotations': [{'device': 1, 'time_us': 13, 'stage': 'fwd'}],
}
sys.stdout.buffer.write(pickle.dumps(snap, protocol=int(sys.argv[1])))
"#;

#[test]
fn python_pickles_of_every_protocol_read_the_same() {
    let base = 1u64 << 40;
    let s = (1u64 << 63) + 5;
    let mut first: Option<Trace> = None;
    for protocol in ["2", "3", "4", "5"] {
        let data = python(FIXTURE, &[protocol]);
        assert_eq!(data[..2], [0x80, protocol.parse::<u8>().unwrap()]);
        let t = snapshot::read(&data, &ReadOptions { keep_frames: true, ..ReadOptions::default() })
            .unwrap_or_else(|e| panic!("protocol {protocol}: {e}"));
        assert!(t.has_times);
        assert_eq!(t.devices.len(), 2, "device 0 is kept although empty");
        assert!(t.devices[0].events.is_empty());
        let ev = &t.devices[1].events;
        let got: Vec<_> =
            ev.iter().map(|e| (e.action, e.addr, e.size, e.stream, e.time_us)).collect();
        assert_eq!(
            got,
            vec![
                (Action::SegmentAlloc, base, 2097152, s, 10),
                (Action::Alloc, base, 100, s, 11),
                (Action::Oom, 12345, 4194304, 0, 12),
                (Action::FreeRequested, base, 100, s, 14),
                (Action::FreeCompleted, base, 100, s, 15),
                (Action::Snapshot, 0, 512, 0, 16),
            ],
            "protocol {protocol}"
        );
        // One shared list object: one id, interned once.
        assert_eq!(t.frames.len(), 1);
        assert_eq!(ev[0].frames, ev[1].frames);
        assert_eq!(ev[0].frames, ev[3].frames);
        assert_eq!(ev[2].frames, fragsim::trace::FramesId::NONE);
        let f = t.frames.get(ev[0].frames);
        assert_eq!((f[1].filename.as_str(), f[1].line, f[1].name.as_str()), ("b.py", 7, "gé"));
        let seg = &t.segments[0];
        assert_eq!((seg.device, seg.address, seg.stream, seg.pool), (1, base, s, PoolKind::Small));
        assert_eq!(seg.blocks[1].address, base + 512);
        let st = t.allocator_settings.as_ref().unwrap();
        assert_eq!(st.conf.as_deref(), Some("garbage_collection_threshold:0.6"));
        assert_eq!(st.max_split_size, None);
        assert_eq!(st.garbage_collection_threshold, 0.6);
        assert!(st.release_lock_on_cudamalloc);
        assert_eq!(st.roundup_power2_divisions[3], 4);
        assert_eq!(st.roundup_power2_divisions.iter().sum::<u64>(), 4);
        match &first {
            None => first = Some(t),
            Some(f) => assert_eq!(&t, f, "protocol {protocol} reads differently"),
        }
    }
}

#[test]
fn a_real_snapshot_repickled_at_protocol_2_reads_the_same() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let p2 = python(
        "import pickle,sys; sys.stdout.buffer.write(pickle.dumps(pickle.load(open(sys.argv[1],'rb')), 2))",
        &[path.to_str().unwrap()],
    );
    let options = ReadOptions { keep_frames: true, ..ReadOptions::default() };
    let a = snapshot::read(&p2, &options).unwrap();
    let b = read_file(&path, true);
    assert_eq!(a, b);
}

fn assert_input_error_fast(data: &[u8], what: &str) -> fragsim::Error {
    let started = Instant::now();
    let result = snapshot::read(data, &ReadOptions { keep_frames: true, ..ReadOptions::default() });
    assert!(started.elapsed() < Duration::from_secs(5), "{what}: too slow");
    match result {
        Ok(_) => panic!("{what}: read as a snapshot"),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Input, "{what}: {e}");
            e
        }
    }
}

#[test]
fn code_execution_opcodes_are_refused() {
    // Python's own pickle of an object whose __reduce__ calls os.system (never unpickled here).
    let data = python(
        "import os,pickle,sys\nclass E:\n  def __reduce__(self): return (os.system, ('echo pwned',))\nsys.stdout.buffer.write(pickle.dumps({'segments': [E()]}, 4))",
        &[],
    );
    let e = assert_input_error_fast(&data, "os.system via STACK_GLOBAL");
    assert!(e.to_string().contains("STACK_GLOBAL (0x93) would import 'posix system'"), "{e}");
    assert!(matches!(e.location().place, Some(Place::Byte(_))), "{e}");
    // Protocol 2: GLOBAL then REDUCE, by hand: cos\nsystem\n then ('echo pwned',) R.
    let e = assert_input_error_fast(
        b"\x80\x02cos\nsystem\nX\x0a\x00\x00\x00echo pwned\x85R.",
        "GLOBAL + REDUCE",
    );
    assert_eq!(
        e.to_string(),
        "byte 2: not a plain-data snapshot: opcode GLOBAL (0x63) would import 'os system'"
    );
    // An OrderedDict: a class reference even though it is data-like.
    let data = python(
        "import collections,pickle,sys; sys.stdout.buffer.write(pickle.dumps(collections.OrderedDict(a=1), 4))",
        &[],
    );
    let e = assert_input_error_fast(&data, "OrderedDict");
    assert!(e.to_string().contains("would import 'collections OrderedDict'"), "{e}");
    // BUILD on a plain dict.
    let e = assert_input_error_fast(b"\x80\x04}\x94}b.", "BUILD");
    assert!(e.to_string().contains("BUILD (0x62) would set an object's state"), "{e}");
}

#[test]
fn truncated_snapshots_fail_with_a_byte_offset() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let framed = std::fs::read(&path).unwrap();
    // Without frames (protocol 2), truncation is found where the data stops, not at a FRAME.
    let unframed = python(
        "import pickle,sys; sys.stdout.buffer.write(pickle.dumps(pickle.load(open(sys.argv[1],'rb')), 2))",
        &[path.to_str().unwrap()],
    );
    for data in [&framed, &unframed] {
        let n = data.len();
        let mut cuts: Vec<usize> = (0..300).collect();
        cuts.extend((1..150).map(|i| i * n / 150));
        cuts.extend(n - 40..n);
        for cut in cuts {
            let e = assert_input_error_fast(&data[..cut], &format!("cut at {cut}"));
            match e.location().place {
                Some(Place::Byte(b)) => assert!(b as usize <= cut, "cut {cut}: {e}"),
                _ => panic!("cut {cut}: no byte offset: {e}"),
            }
        }
    }
}

#[test]
fn hostile_lengths_nesting_and_garbage_are_input_errors() {
    // BINUNICODE8 declaring 2^62 bytes.
    let mut data = b"\x80\x04\x8d".to_vec();
    data.extend_from_slice(&(1u64 << 62).to_le_bytes());
    data.extend_from_slice(b"abc.");
    let e = assert_input_error_fast(&data, "BINUNICODE8 2^62");
    assert_eq!(e.location().place, Some(Place::Byte(2)));
    assert!(e.to_string().contains("declares 4611686018427387904 bytes"), "{e}");

    // 100,000 nested lists as the legacy segment list, and inside device_traces.
    let n = 100_000;
    let mut data = b"\x80\x04".to_vec();
    data.extend(std::iter::repeat_n(b']', n));
    data.extend(std::iter::repeat_n(b'a', n - 1));
    data.push(b'.');
    let e = assert_input_error_fast(&data, "nested lists");
    // Segment 0 is the second list: its EMPTY_LIST is byte 3.
    assert!(e.to_string().contains("byte 3: segment 0: is a list, not a dict"), "{e}");
    let mut data = b"\x80\x04}\x8c\x0ddevice_traces".to_vec();
    data.extend(std::iter::repeat_n(b']', n));
    data.extend(std::iter::repeat_n(b'a', n - 1));
    data.extend_from_slice(b"s.");
    let e = assert_input_error_fast(&data, "nested device_traces");
    // Root dict at 2, its 15-byte key, device_traces at 18, device 0 at 19, entry 0 at 20.
    assert!(e.to_string().contains("trace entry 0: is a list, not a dict (pickle byte 20)"), "{e}");

    // Seeded garbage after a valid protocol header.
    let mut rng = fragsim::testing::Rng::new(1);
    for round in 0..300 {
        let mut data = vec![0x80, 4];
        for _ in 0..(round * 7 % 2000 + 1) {
            data.push(rng.next_u64() as u8);
        }
        let e = assert_input_error_fast(&data, &format!("garbage {round}"));
        assert!(!e.message().is_empty());
    }
}

#[test]
fn written_snapshots_load_in_python_with_pytorchs_keys_and_values() {
    let path = real_trace("cs336-medium-ctx512-train.pickle");
    let t = read_file(&path, true);
    let mut bytes = Vec::new();
    snapshot::write(&t, &mut bytes).unwrap();
    let (_dir, ours) = temp_file("ours.pickle", &bytes);
    // Python compares our file with the original, field by field, for everything we write.
    let out = python(
        r#"
import pickle, sys
a = pickle.load(open(sys.argv[1], 'rb'))
b = pickle.load(open(sys.argv[2], 'rb'))
assert set(b) == {'segments', 'device_traces', 'allocator_settings'}, set(b)
seg_keys = ['device', 'address', 'total_size', 'allocated_size', 'active_size', 'requested_size',
            'stream', 'segment_type', 'segment_pool_id', 'is_expandable']
assert len(a['segments']) == len(b['segments'])
for x, y in zip(a['segments'], b['segments']):
    assert set(y) == set(seg_keys) | {'frames', 'blocks'}, set(y)
    assert [x[k] for k in seg_keys] == [y[k] for k in seg_keys], (x, y)
    assert type(y['segment_pool_id']) is tuple and y['frames'] == []
    bk = ['address', 'size', 'requested_size', 'state']
    assert [[p[k] for k in bk] for p in x['blocks']] == [[p[k] for k in bk] for p in y['blocks']]
    assert all(set(p) == set(bk) | {'frames'} for p in y['blocks'])
ek = ['action', 'addr', 'size', 'stream', 'time_us', 'frames']
assert len(a['device_traces']) == len(b['device_traces'])
for x, y in zip(a['device_traces'], b['device_traces']):
    assert len(x) == len(y)
    assert all(set(e) == set(ek) for e in y)
    assert [[e[k] for k in ek] for e in x] == [[e[k] for k in ek] for e in y]
sa, sb = a['allocator_settings'], b['allocator_settings']
for k in ['PYTORCH_CUDA_ALLOC_CONF', 'max_split_size', 'garbage_collection_threshold',
          'expandable_segments', 'release_lock_on_cudamalloc', 'roundup_power2_divisions']:
    assert sa[k] == sb[k], k
print(sum(len(x) for x in b['device_traces']), len(b['segments']))
"#,
        &[path.to_str().unwrap(), ours.to_str().unwrap()],
    );
    assert_eq!(String::from_utf8_lossy(&out).trim(), "22332 400");
    // Shared frame lists stay shared: our file is not much larger than PyTorch's.
    let original = std::fs::metadata(&path).unwrap().len() as f64;
    assert!((bytes.len() as f64) < original * 1.2, "{} vs {original}", bytes.len());
}

#[test]
fn write_then_read_is_the_same_trace() {
    for name in ["cs336-lm-step-b.pickle", "cs336-medium-ctx512-infer.pickle"] {
        let path = real_trace(name);
        for keep_frames in [false, true] {
            let t = read_file(&path, keep_frames);
            let mut bytes = Vec::new();
            snapshot::write(&t, &mut bytes).unwrap();
            let options = ReadOptions { keep_frames, ..ReadOptions::default() };
            let back = snapshot::read(&bytes, &options).unwrap();
            assert_eq!(back, t, "{name}, keep_frames {keep_frames}");
        }
    }
    // An untimed trace in another format round-trips through the snapshot writer too.
    let text = b"device 1\nalloc 0x200000 1000 s7\nfree 0x200000 1000 s7\noom 777 2097152 s0\n";
    let t = trace::read_bytes(text, Format::Text, &ReadOptions::default()).unwrap();
    let mut bytes = Vec::new();
    snapshot::write(&t, &mut bytes).unwrap();
    let back = snapshot::read(&bytes, &ReadOptions::default()).unwrap();
    assert!(!back.has_times);
    assert!(back.devices[0].events.is_empty());
    assert_eq!(back.devices[1].events, t.devices[0].events);
}

/// `--export-snapshot` writes the first policy given, whatever the table's order, and says so.
#[test]
fn export_snapshot_writes_the_first_policy_given_and_names_it() {
    let trace = bundled("gpt-4l-512h.txt");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sim.pickle");
    let export = |policies: &[&str]| {
        let mut argv = vec!["replay", trace.to_str().unwrap(), "--json"];
        for p in policies {
            argv.extend(["-p", p]);
        }
        argv.extend(["--export-snapshot", out.to_str().unwrap()]);
        let o = run(&argv);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        (stderr(&o), v, read_file(&out, false))
    };
    let count = |t: &Trace, a: Action| t.devices[0].events.iter().filter(|e| e.action == a).count();

    // nocache is the worst row (last in the table) but the first given: it is what is written.
    let (err, v, t) = export(&["nocache", "bound"]);
    assert_eq!(v["results"][0]["policy"], "bound");
    assert!(err.contains("sim.pickle: the simulated run of nocache ("), "{err}");
    let nocache_mallocs = v["results"][1]["device_malloc_count"].as_u64().unwrap() as usize;
    assert_eq!(count(&t, Action::SegmentAlloc), nocache_mallocs);
    assert_eq!(count(&t, Action::SegmentAlloc), count(&t, Action::Alloc));

    // `all` expands in the built-in order, so it writes pytorch, not the table's first row.
    let (err, v, t) = export(&["all"]);
    assert_ne!(v["results"][0]["policy"], "pytorch");
    assert!(err.contains("the simulated run of pytorch ("), "{err}");
    let pytorch = v["results"].as_array().unwrap().iter().find(|r| r["policy"] == "pytorch");
    let mallocs = pytorch.unwrap()["device_malloc_count"].as_u64().unwrap() as usize;
    assert_eq!(count(&t, Action::SegmentAlloc), mallocs);
}

/// An output flag never changes a result: the exported run starts cold (so that `validate` can
/// replay it from its own events), but the table is the warm replay the same command prints
/// without the flag, and the note says how the file's run differs.
#[test]
fn export_snapshot_does_not_change_the_numbers_printed() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v.pickle");
    let p = path.to_str().unwrap();
    let replay = |extra: &[&str]| {
        let mut argv = vec!["replay", p, "-p", "pytorch", "--json"];
        argv.extend(extra);
        let o = run(&argv);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        (untimed(v), stderr(&o))
    };
    let (plain, _) = replay(&[]);
    let (exported, note) = replay(&["--export-snapshot", out.to_str().unwrap()]);
    assert_eq!(exported, plain);
    let pytorch = &plain["results"].as_array().unwrap()[0];
    assert_eq!(pytorch["policy"], "pytorch");
    // The warm replay peaks at its start state, the recorded one.
    assert_eq!(pytorch["peak_reserved_bytes"], 14_180_941_824u64);
    let written = read_file(&out, false);
    let cold = fragsim::recorded::recorded(&written, 0).unwrap().peak_reserved_bytes;
    assert_ne!(cold, 14_180_941_824, "this trace's cold run differs, so the test can fail");
    assert!(note.contains(&format!("its peak reserved is {cold} B")), "{note}");
}

#[test]
fn export_snapshot_writes_the_simulated_run() {
    let path = real_trace("cs336-medium-ctx512-infer.pickle");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sim.pickle");
    let o = run(&[
        "replay",
        path.to_str().unwrap(),
        "--policy",
        "bound",
        "--export-snapshot",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = read_file(&out, false);
    let input = read_file(&path, false);
    assert_eq!(t.devices.len(), 1);
    // bound: one alloc per input alloc plus one per block live before the first event (here the
    // dump's allocated blocks, since every alloc of this trace is freed in it), one free pair per
    // input free.
    let count = |a: Action| t.devices[0].events.iter().filter(|e| e.action == a).count();
    let live_at_start = input
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .count();
    assert_eq!(count(Action::Alloc), 1666 + live_at_start);
    assert_eq!(count(Action::FreeCompleted), 1666);
    // bound is not PyTorch's allocator: the input's recorded PyTorch settings would be a false
    // claim about the simulated run, so none are written.
    assert!(input.allocator_settings.is_some());
    assert_eq!(t.allocator_settings, None);
    let py = python(
        "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); print(sorted(d), len(d['device_traces'][0]))",
        &[out.to_str().unwrap()],
    );
    assert!(String::from_utf8_lossy(&py).starts_with("['device_traces', 'segments']"));
}

/// What the Python snapshot fixtures below share: one segment's, block's and trace entry's dicts
/// as PyTorch's `_snapshot()` builds them (a segment's sizes summed from its blocks), and `dump`,
/// which writes the snapshot as `_dump_snapshot` does.
const SNAPSHOT_HELPERS: &str = r#"
import pickle, sys
M = 2**20
def block(address, size, state):
    return {'address': address, 'size': size, 'requested_size': size, 'state': state, 'frames': []}
def seg(address, pool, blocks):
    active = sum(b['size'] for b in blocks if b['state'] != 'inactive')
    return {'device': 0, 'address': address, 'total_size': sum(b['size'] for b in blocks),
            'allocated_size': active, 'active_size': active, 'requested_size': active,
            'stream': 0, 'segment_type': 'large', 'segment_pool_id': pool, 'is_expandable': False,
            'frames': [], 'blocks': blocks}
def ev(action, addr, size, t):
    return {'action': action, 'addr': addr, 'size': size, 'stream': 0, 'time_us': t, 'frames': []}
def dump(snap):
    sys.stdout.buffer.write(pickle.dumps(snap, protocol=4))
"#;

/// The snapshot `body` makes with [`SNAPSHOT_HELPERS`] in scope, run with `args`.
fn python_snapshot(body: &str, args: &[&str]) -> Vec<u8> {
    python(&format!("{SNAPSHOT_HELPERS}{body}"), args)
}

/// A snapshot of PyTorch's schema where a CUDA graph's private pool owns the lower of two
/// wholly free 20 MiB segments (`segment_pool_id` (3, 0)) and one 4 MiB request, made outside
/// capture, went to the default pool's segment above it.
const PRIVATE_POOL_FIXTURE: &str = r#"
low, high = 2**40, 2**40 + 64 * M
snap = {
  'segments': [seg(low, (3, 0), [block(low, 20 * M, 'inactive')]),
               seg(high, (0, 0), [block(high, 4 * M, 'active_allocated'),
                                  block(high + 4 * M, 16 * M, 'inactive')])],
  'device_traces': [[ev('alloc', high, 4 * M, 1)]],
}
if sys.argv[1] == 'bad':
    snap['segments'][0]['segment_pool_id'] = 'graph'
dump(snap)
"#;

#[test]
fn private_pool_segments_are_read_kept_apart_and_written_back() {
    let data = python_snapshot(PRIVATE_POOL_FIXTURE, &["good"]);
    let t = snapshot::read(&data, &ReadOptions::default()).unwrap();
    let pools: Vec<_> = t.segments.iter().map(|s| s.private_pool).collect();
    assert_eq!(pools, vec![Some((3, 0)), None]);
    // Written back as PyTorch writes it: a tuple, (0, 0) for the default pools.
    let mut bytes = Vec::new();
    snapshot::write(&t, &mut bytes).unwrap();
    assert_eq!(snapshot::read(&bytes, &ReadOptions::default()).unwrap(), t);
    let (_dir, path) = temp_file("graph.pickle", &data);
    let (_dir2, ours) = temp_file("ours.pickle", &bytes);
    let out = python(
        "import pickle, sys\n\
         s = pickle.load(open(sys.argv[1], 'rb'))['segments']\n\
         print([x['segment_pool_id'] for x in s])",
        &[ours.to_str().unwrap()],
    );
    assert_eq!(String::from_utf8_lossy(&out).trim(), "[(3, 0), (0, 0)]");
    let p = path.to_str().unwrap();
    // info counts them.
    let info = run(&["info", p, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(v["private_pool_segments_at_dump"], 1);
    assert_eq!(v["private_pool_reserved_at_dump_bytes"], 20u64 << 20);
    assert!(stdout(&run(&["info", p])).contains("in private pools (CUDA graphs, MemPool): 1"));
    // validate reproduces the placement (one shared pool would not: best fit takes the lower
    // address), and says what it did with the private pool.
    let out = run(&["validate", p, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!((v["allocs_total"].as_u64(), v["allocs_addr_matched"].as_u64()), (Some(1), Some(1)));
    let text = stdout(&run(&["validate", p]));
    assert!(text.contains("belong to 1 private pool(s)"), "{text}");
    // A segment_pool_id that is not a pair of ints is refused, with the segment named.
    let bad = python_snapshot(PRIVATE_POOL_FIXTURE, &["bad"]);
    let err = snapshot::read(&bad, &ReadOptions::default()).unwrap_err().to_string();
    assert!(err.contains("segment 0: 'segment_pool_id' is not a pair of ints: 'graph'"), "{err}");
}

/// A snapshot recorded across a CUDA graph capture: the capture's two 4 MiB allocations
/// (at `low`) were made into the graph's private pool, whose 20 MiB segment the first of them
/// created, while an ordinary 4 MiB allocation went to the default pool's cached 20 MiB
/// segment (at `high`), live from before the trace. Nothing but the addresses marks the
/// capture.
const CAPTURE_FIXTURE: &str = r#"
low, high = 2**40, 2**40 + 64 * M
snap = {
  'segments': [seg(low, (1, 0), [block(low, 4 * M, 'active_allocated'),
                                 block(low + 4 * M, 16 * M, 'inactive')]),
               seg(high, (0, 0), [block(high, 4 * M, 'active_allocated'),
                                  block(high + 4 * M, 16 * M, 'inactive')])],
  'device_traces': [[ev('segment_alloc', low, 20 * M, 1), ev('alloc', low, 4 * M, 2),
                     ev('free_requested', low, 4 * M, 3), ev('free_completed', low, 4 * M, 4),
                     ev('alloc', high, 4 * M, 5), ev('alloc', low, 4 * M, 6)]],
}
dump(snap)
"#;

#[test]
fn allocations_recorded_in_a_private_pool_are_replayed_into_it() {
    let (_dir, path) = temp_file("capture.pickle", &python_snapshot(CAPTURE_FIXTURE, &[]));
    let p = path.to_str().unwrap();
    let fst = path.with_extension("fst");
    assert!(run(&["convert", p, fst.to_str().unwrap()]).status.success());
    for file in [p, fst.to_str().unwrap()] {
        // The capture's allocations make and reuse the private segment, as recorded: the
        // replay reserves both segments, as the recording did. In one shared pool the first
        // would have taken the cached default segment and nothing new would be reserved.
        let out = run(&["replay", file, "-p", "pytorch", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let row = |policy: &str| {
            v["results"].as_array().unwrap().iter().find(|r| r["policy"] == policy).cloned()
        };
        let (pytorch, recorded) = (row("pytorch").unwrap(), row("recorded").unwrap());
        assert_eq!(recorded["peak_reserved_bytes"].as_u64(), Some(40 << 20), "{file}");
        assert_eq!(pytorch["peak_reserved_bytes"], recorded["peak_reserved_bytes"], "{file}");
        // The default segment installed at the start, and the one the capture made.
        assert_eq!(pytorch["device_malloc_count"], 2, "{file}");
    }
    // validate routes them too: every placement and the segment_alloc reproduce.
    let out = run(&["validate", p, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!((v["allocs_total"].as_u64(), v["allocs_addr_matched"].as_u64()), (Some(3), Some(3)));
    assert_eq!(v["segment_events_matched"], v["segment_events_recorded"], "{v}");
}

/// A snapshot as PyTorch ≈ 2.4–2.5's `_snapshot()` builds it while `record_function` ranges
/// run: `user_defined` entries (address and size 0, the range's name in their frames) between
/// the allocator's own. Python's pickler writes the shared action string once and refers back
/// to it from later batches of 1,000 entries, as it does for PyTorch's one `user_defined`
/// string object.
const RECORD_FUNCTION_FIXTURE: &str = r#"
user_defined = 'user_defined'
def marker(name, stage, t):
    return {'action': user_defined, 'addr': 0, 'size': 0, 'stream': 0, 'time_us': t,
            'frames': [{'filename': stage, 'line': 0, 'name': name}]}
trace = []
for step in range(400):
    t = 10 * step
    trace += [marker('forward', 'START', t), ev('segment_alloc', 2**40, 2 * M, t + 1),
              ev('alloc', 2**40, 4096, t + 2), ev('free_requested', 2**40, 4096, t + 3),
              ev('free_completed', 2**40, 4096, t + 4), ev('segment_free', 2**40, 2 * M, t + 5),
              marker('forward', 'END', t + 6)]
dump({'segments': [], 'device_traces': [trace]})
"#;

#[test]
fn record_function_markers_are_skipped() {
    let (_dir, path) = temp_file("ranges.pickle", &python_snapshot(RECORD_FUNCTION_FIXTURE, &[]));
    let p = path.to_str().unwrap();
    let out = run(&["info", p, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["devices"][0]["events"], 2000, "{v}");
    assert_eq!(v["devices"][0]["by_action"]["alloc"], 400, "{v}");
    // Read as a stream (the back-references to the marker's action string kept), not refused.
    let t = fragsim::trace::snapshot::stream(
        &mut std::io::BufReader::new(std::fs::File::open(&path).unwrap()),
        &ReadOptions::default(),
    )
    .unwrap();
    assert_eq!(t.devices[0].events.len(), 2000);
    let out = run(&["validate", p]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
}

/// A snapshot whose recorded settings string names an option this fragsim does not know, as a
/// newer PyTorch may record: replayed and validated without it, and said so.
const FUTURE_OPTION_FIXTURE: &str = r#"
settings = {'PYTORCH_CUDA_ALLOC_CONF': 'max_split_size_mb:256,future_knob:[1:2,>:4]',
            'max_split_size': 256 * M, 'garbage_collection_threshold': 0.0,
            'expandable_segments': False, 'pinned_num_register_threads': 1,
            'release_lock_on_cudamalloc': False, 'pinned_use_cuda_host_register': False,
            'roundup_power2_divisions': {str(2**i): 0 for i in range(16)}}
segment = seg(2**40, (0, 0), [block(2**40, 4 * M, 'active_allocated'),
                              block(2**40 + 4 * M, 16 * M, 'inactive')])
dump({'segments': [segment],
      'device_traces': [[ev('segment_alloc', 2**40, 20 * M, 1), ev('alloc', 2**40, 4 * M, 2)]],
      'allocator_settings': settings})
"#;

#[test]
fn a_recorded_option_this_fragsim_does_not_know_is_left_out_and_said() {
    let (_dir, path) = temp_file("future.pickle", &python_snapshot(FUTURE_OPTION_FIXTURE, &[]));
    let p = path.to_str().unwrap();
    let out = run(&["replay", p, "-p", "pytorch"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("left out of the pytorch replays: future_knob"),
        "{}",
        stderr(&out)
    );
    let out = run(&["validate", p]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("left out of the replay: future_knob"), "{}", stdout(&out));
    // The same string given by the user is refused, as PyTorch refuses it.
    let out = run(&["replay", p, "-p", "pytorch:max_split_size_mb:256,future_knob:3"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A snapshot taken without memory history (segments, no trace entries) says how to record
/// it, and so does its `.fst` (before, only the snapshot itself did).
#[test]
fn a_snapshot_without_history_says_so_converted_too() {
    let real = real_snapshots();
    let mut t = read_file(&real[0], false);
    t.devices.iter_mut().for_each(|d| d.events.clear());
    let dir = tempfile::tempdir().unwrap();
    for name in ["nohistory.pickle", "nohistory.fst"] {
        let path = dir.path().join(name);
        trace::write_trace(&t, &path).unwrap();
        let o = run(&["replay", path.to_str().unwrap(), "-p", "pytorch"]);
        let err = stderr(&o);
        assert!(err.contains("torch.cuda.memory._record_memory_history()"), "{name}: {err}");
    }
}
