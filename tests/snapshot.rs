//! Integration tests: PyTorch memory snapshots (reading real files, hostile input, writing).
//!
//! The real-data expectations come from `../shared/traces/expected-counts.json`, made
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

fn expected() -> Option<serde_json::Value> {
    let path = shared_trace("expected-counts.json")?;
    let text = std::fs::read_to_string(path).expect("expected-counts.json is readable");
    Some(serde_json::from_str(&text).expect("expected-counts.json is JSON"))
}

fn read_file(path: &Path, keep_frames: bool) -> Trace {
    let options = ReadOptions { keep_frames, progress: false };
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
fn every_shared_snapshot_matches_the_python_counts() {
    let Some(expected) = expected() else { return };
    let mut checked = 0;
    for (name, want) in expected.as_object().expect("an object") {
        if want["format"] != "pytorch-snapshot" {
            continue;
        }
        let path = shared_trace(name).expect("listed trace exists");
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
    let Some(path) = shared_trace("cs336-medium-ctx512-train.pickle") else { return };
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
    let Some(path) = shared_trace("cs336-lm-step-c.pickle") else { return };
    let t = read_file(&path, true);
    let ids: HashSet<_> = t.devices[0].events.iter().map(|e| e.frames).collect();
    // Every distinct id is one interned list, and lists are shared by many events.
    assert_eq!(ids.len(), t.frames.len() + ids.contains(&fragsim::trace::FramesId::NONE) as usize);
    assert!(t.frames.len() * 2 < t.devices[0].events.len(), "{} stacks", t.frames.len());
}
