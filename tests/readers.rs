//! Integration tests: every reader against real traces and independent counts, round trips
//! between formats, and hand-written RMM logs.
//!
//! `traces/real/expected-counts.json` was made with Python's own `pickle`/`json` modules,
//! not with fragsim, so agreement here checks the readers and `info`, not their consistency with
//! themselves.

use crate::util::*;
use fragsim::trace::{read_trace, DeviceTrace, Event, Format, FramesId, ReadOptions, Trace};
use serde_json::Value;
use std::path::Path;

fn info_json(path: &Path) -> Value {
    let o = run(&["info", "--json", path.to_str().expect("utf-8 path")]);
    assert!(o.status.success(), "{}: {}", path.display(), stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("info --json prints JSON")
}

fn device(info: &Value, device: i64) -> &Value {
    info["devices"]
        .as_array()
        .and_then(|ds| ds.iter().find(|d| d["device"] == device))
        .unwrap_or_else(|| panic!("no device {device} in {info}"))
}

fn read(path: &Path, keep_frames: bool) -> Trace {
    read_trace(path, &ReadOptions { keep_frames, ..ReadOptions::default() })
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The devices with every event's frames dropped (for formats that hold no frames).
fn without_frames(devices: &[DeviceTrace]) -> Vec<DeviceTrace> {
    devices
        .iter()
        .map(|d| DeviceTrace {
            device: d.device,
            events: d.events.iter().map(|e| Event { frames: FramesId::NONE, ..*e }).collect(),
        })
        .collect()
}

fn convert(from: &Path, to: &Path) {
    let o = run(&["convert", from.to_str().expect("utf-8"), to.to_str().expect("utf-8")]);
    assert!(o.status.success(), "convert {} -> {}: {}", from.display(), to.display(), stderr(&o));
}

#[test]
fn kineto_counts_match_the_independent_count() {
    let (path, expected) = (real_trace("kineto-ddp-v100-rank1.json.gz"), expected_counts());
    let info = info_json(&path);
    assert_eq!(info["format"], "kineto");
    assert_eq!(info["devices"].as_array().map(Vec::len), Some(2));
    for want in expected["kineto-ddp-v100-rank1.json.gz"]["devices"].as_array().expect("devices") {
        let got = device(&info, want["device"].as_i64().expect("device"));
        assert_eq!(got["events"], want["events"], "device {}", want["device"]);
        assert_eq!(got["by_action"]["alloc"], want["allocs"], "device {}", want["device"]);
        assert_eq!(got["by_action"]["free_completed"], want["frees"], "device {}", want["device"]);
        assert_eq!(got["by_action"]["free_requested"], 0);
        assert_eq!(got["streams"], serde_json::json!([0]));
    }
    // Device 1 has the most events, so it is the default and its numbers are at the top level.
    assert_eq!(info["device"], 1);
    assert_eq!(info["devices"][1]["events"], 26_770);
    assert_eq!(info["orphan_frees"], device(&info, 1)["orphan_frees"]);
    assert_eq!(info["peak_live_bytes"], device(&info, 1)["peak_live_bytes"]);
}

#[test]
fn every_real_pickle_matches_the_independent_count() {
    let expected = expected_counts();
    let pickles = real_snapshots();
    assert_eq!(pickles.len(), 6);
    for path in pickles {
        let name = path.file_name().and_then(|n| n.to_str()).expect("name");
        let want = &expected[name];
        let info = info_json(&path);
        assert_eq!(info["format"], want["format"], "{name}");
        for key in ["segments_at_dump", "reserved_at_dump_bytes", "has_allocator_settings"] {
            assert_eq!(info[key], want[key], "{name}: {key}");
        }
        for w in want["devices"].as_array().expect("devices") {
            let got = device(&info, w["device"].as_i64().expect("device"));
            for key in [
                "events",
                "orphan_frees",
                "allocated_in_trace_live_at_end",
                "alloc_size_min",
                "alloc_size_max",
            ] {
                assert_eq!(got[key], w[key], "{name}: {key}");
            }
            // Every action is listed; those the independent count did not see are zero.
            let by_action = got["by_action"].as_object().expect("by_action");
            assert_eq!(by_action.len(), 9, "{name}");
            for (action, n) in by_action {
                let want_n = w["by_action"].get(action).cloned().unwrap_or(Value::from(0));
                assert_eq!(*n, want_n, "{name}: {action}");
            }
        }
    }
}

/// `t`, read from .fst, checked to name .fst as its format and `origin` as the one it was
/// converted from, then with those two as the original trace has them.
fn from_fst(t: Trace, origin: Format) -> Trace {
    assert_eq!((t.format, t.converted_from), (Format::Fst, Some(origin)));
    Trace { format: origin, converted_from: None, ..t }
}

#[test]
fn info_on_an_fst_names_fst_and_the_format_it_was_converted_from() {
    let (dir, txt) = temp_file("t.txt", b"alloc 0x1000 4096 s0\nfree_completed 0x1000 4096 s0\n");
    let fst = dir.path().join("t.fst");
    convert(&txt, &fst);
    let o = run(&["info", fst.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("  format: fst (converted from text), 2 events"), "{}", stdout(&o));
    let o = run(&["info", fst.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((v["format"].as_str(), v["converted_from"].as_str()), (Some("fst"), Some("text")));
    let o = run(&["info", txt.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((v["format"].as_str(), v.get("converted_from")), (Some("text"), None));
}

#[test]
fn pickle_to_fst_to_text_to_fst_keeps_every_event() {
    let pickle = real_trace("cs336-medium-ctx512-train.pickle");
    let dir = tempfile::tempdir().expect("temp dir");
    let (fst, txt, fst2) =
        (dir.path().join("a.fst"), dir.path().join("a.txt.gz"), dir.path().join("b.fst"));
    convert(&pickle, &fst);
    convert(&fst, &txt);
    convert(&txt, &fst2);
    let original = read(&pickle, true);
    assert_eq!(original.devices[0].events.len(), 22_332);
    // .fst holds the whole model: frames, final segments, settings, the format of origin.
    assert_eq!(from_fst(read(&fst, true), Format::PytorchSnapshot), original);
    // Text holds events only.
    let back = read(&fst2, true);
    assert_eq!(back.devices, without_frames(&original.devices));
    assert!(back.has_times);
}

#[test]
fn kineto_to_fst_to_json_keeps_every_event() {
    let kineto = real_trace("kineto-ddp-v100-rank1.json.gz");
    let dir = tempfile::tempdir().expect("temp dir");
    let (fst, json) = (dir.path().join("k.fst"), dir.path().join("k.json"));
    convert(&kineto, &fst);
    convert(&fst, &json);
    let original = read(&kineto, false);
    assert_eq!(original.devices.iter().map(|d| d.events.len()).sum::<usize>(), 28_010);
    assert_eq!(from_fst(read(&fst, false), Format::Kineto), original);
    // Kineto JSON keeps every event; of the platform, only ROCm's (Device Type 6): the device
    // properties that show this trace's CUDA are not written (their values are not kept).
    let back = read(&json, false);
    assert_eq!(back.platform, None);
    assert_eq!(Trace { platform: original.platform, ..back }, original);
}

const RMM_CLOCK: &str = "\
Thread,Time,Action,Pointer,Size,Stream
140573312345856,10:00:00.000001,allocate,0x7f0000000000,1024,0
140573312345856,10:00:00.000010,allocate,0x7f0000100000,4096,0x1f
140573312345857,10:00:00.000020,allocate failure,(nil),68719476736,0
140573312345856,10:00:00.000030,deallocate,0x7f0000000000,1024,0
140573312345856,10:00:00.500030,free,0x7f0000100000,4096,0x1f
";

#[test]
fn rmm_log_with_clock_times_nil_failure_and_deallocate() {
    let (_d, path) = temp_file("log.csv", RMM_CLOCK.as_bytes());
    let info = info_json(&path);
    assert_eq!(info["format"], "rmm-csv");
    let d = device(&info, 0);
    assert_eq!(d["events"], 5);
    assert_eq!(d["by_action"]["alloc"], 2);
    assert_eq!(d["by_action"]["free_completed"], 2);
    assert_eq!(d["by_action"]["oom"], 1);
    assert_eq!(d["streams"], serde_json::json!([0, 0x1f]));
    assert_eq!(d["peak_live_bytes"], 1024 + 4096);
    assert_eq!(d["orphan_frees"], 0);
    assert_eq!(d["allocated_in_trace_live_at_end"], 0);
    // 10:00:00.000001 to 10:00:00.500030.
    assert_eq!(d["time_span_us"], 500_029);
    // The failed request is not an allocation: the largest alloc is 4096.
    assert_eq!(d["alloc_size_max"], 4096);
}

#[test]
fn rmm_log_with_epoch_times_round_trips_through_fst_and_csv() {
    let src = "Thread,Time,Action,Pointer,Size,Stream\n\
               7,1634567890.123456,allocate,0x10000,512,0\n\
               7,1634567890.5,allocate,0x20000,100,0\n\
               7,1634567891.000001,free,0x10000,512,0\n";
    let (dir, path) = temp_file("docs.csv", src.as_bytes());
    let info = info_json(&path);
    let d = device(&info, 0);
    assert_eq!(d["first_time_us"], 1_634_567_890_123_456i64);
    assert_eq!(d["time_span_us"], 876_545);
    assert_eq!(d["allocated_in_trace_live_at_end"], 1);
    assert_eq!(d["live_at_end_bytes"], 100);
    let (fst, csv) = (dir.path().join("x.fst"), dir.path().join("y.csv"));
    convert(&path, &fst);
    convert(&fst, &csv);
    assert_eq!(read(&csv, false), read(&path, false));
}

#[test]
fn convert_names_what_a_format_cannot_hold() {
    let pickle = real_trace("cs336-medium-ctx512-train.pickle");
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("t.json");
    let o = run(&["convert", pickle.to_str().expect("utf-8"), out.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    // 7,370 free_requested and 1 segment_alloc have no Kineto spelling.
    assert!(
        stderr(&o).contains("device 0: 7371 events other than alloc and free_completed"),
        "{}",
        stderr(&o)
    );
    // The snapshot records its reserve, not Total Allocated: no totals are written, so read
    // back there is no recorded run (made-up totals read back as one that reserved 0 B).
    assert!(
        stderr(&o).contains("device 0: no Total Allocated or Total Reserved are written"),
        "{}",
        stderr(&o)
    );
    let back = read(&out, false);
    assert_eq!(back.devices[0].events.len(), 7_591 + 7_370);
    assert!(back.recorded_totals.is_empty());
    let o = run(&["replay", out.to_str().expect("utf-8"), "-p", "bound", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let replay: Value = serde_json::from_str(&stdout(&o)).expect("json");
    let rows: Vec<&str> = replay["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["bound"]);
    let o = run(&["convert", pickle.to_str().expect("utf-8"), "out.xlsx"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot tell the output format from 'out.xlsx'"), "{}", stderr(&o));
}

#[test]
fn info_prints_a_readable_summary() {
    let (_d, path) = temp_file("log.csv", RMM_CLOCK.as_bytes());
    let o = run(&["info", path.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "format: rmm-csv, 5 events on 1 device, times recorded",
        "events:        2 alloc, 2 free_completed, 1 oom",
        "streams:       0x0, 0x1f",
        "peak live:     5.00 KiB",
        "orphan frees:  0",
        "time span:     0.500029 s",
        "allocator settings: not recorded",
    ] {
        assert!(text.contains(want), "missing '{want}' in:\n{text}");
    }
}
