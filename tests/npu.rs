//! Integration tests: a recording made by torch_npu (Huawei Ascend) is replayed and validated
//! with torch_npu's allocator rules unless CUDA's are asked for (`-p pytorch-cuda`).

use crate::util::*;
use fragsim::trace::{
    snapshot, Action, Block, BlockState, DeviceTrace, Event, Format, Frame, PoolKind, ReadOptions,
    Segment, Trace,
};

const BASE: u64 = 0x12_0000_0000;
const MIB: u64 = 1 << 20;

/// A small snapshot as torch_npu records it: one 2 MiB small-pool segment holding a 16,384 B
/// and a 37,632 B tensor, which torch_npu's padding makes 16,896 B and 37,888 B blocks. Its
/// frames name `frame_file`.
fn snapshot_with_frames(frame_file: &str) -> Vec<u8> {
    let mut t = Trace { format: Format::PytorchSnapshot, has_times: true, ..Trace::default() };
    let frames =
        t.frames.intern(vec![Frame { filename: frame_file.into(), line: 7, name: "step".into() }]);
    let ev = |action, addr, size, time| Event { frames, ..Event::new(action, addr, size, 0, time) };
    let events = vec![
        ev(Action::SegmentAlloc, BASE, 2 * MIB, 1),
        ev(Action::Alloc, BASE, 16_384, 2),
        ev(Action::Alloc, BASE + 16_896, 37_632, 3),
    ];
    t.devices = vec![DeviceTrace { device: 0, events }];
    let block =
        |address, size, requested_size, state| Block { address, size, requested_size, state };
    t.segments = vec![Segment {
        device: 0,
        address: BASE,
        total_size: 2 * MIB,
        stream: 0,
        pool: PoolKind::Small,
        is_expandable: false,
        private_pool: None,
        blocks: vec![
            block(BASE, 16_896, 16_384, BlockState::ActiveAllocated),
            block(BASE + 16_896, 37_888, 37_632, BlockState::ActiveAllocated),
            block(BASE + 54_784, 2 * MIB - 54_784, 0, BlockState::Inactive),
        ],
    }];
    let mut bytes = Vec::new();
    snapshot::write(&t, &mut bytes).unwrap();
    bytes
}

const NPU_FRAME: &str = "/usr/lib/python3.10/site-packages/torch_npu/utils/_module.py";

#[test]
fn torch_npu_frames_mark_the_recording_even_when_frames_are_dropped() {
    for keep_frames in [false, true] {
        let options = ReadOptions { keep_frames, ..ReadOptions::default() };
        let npu = snapshot::read(&snapshot_with_frames(NPU_FRAME), &options).unwrap();
        assert!(npu.torch_npu, "keep_frames {keep_frames}");
        let cuda = snapshot::read(&snapshot_with_frames("/opt/train.py"), &options).unwrap();
        assert!(!cuda.torch_npu, "keep_frames {keep_frames}");
    }
    assert!(fragsim::trace::is_torch_npu_file("torch_npu/npu/memory.py"));
    assert!(!fragsim::trace::is_torch_npu_file("/src/my_torch_npu_tools/x.py"));
}

#[test]
fn validate_picks_torch_npus_rules_from_the_recording_and_pytorch_cuda_overrides() {
    let (_dir, path) = temp_file("npu.pickle", &snapshot_with_frames(NPU_FRAME));
    let path = path.to_str().unwrap();
    let out = run(&["validate", path]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out) + &stderr(&out);
    assert!(text.contains("recorded by torch_npu"), "{text}");
    let out = run(&["validate", "-p", "pytorch-cuda", path]);
    assert_eq!(out.status.code(), Some(1), "CUDA rules: {}", stderr(&out));
    let text = stdout(&out) + &stderr(&out);
    assert!(text.contains("CUDA's allocator rules as asked"), "{text}");
    let out = run(&["validate", "-p", "bfc", path]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // The same snapshot without torch_npu frames is CUDA's, and CUDA's rules do not match it.
    let (_dir, cuda) = temp_file("cuda.pickle", &snapshot_with_frames("/opt/train.py"));
    let out = run(&["validate", cuda.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["validate", "-p", "pytorch-npu", cuda.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
}

#[test]
fn replay_says_it_uses_torch_npus_rules_unless_told_otherwise() {
    let (_dir, path) = temp_file("npu.pickle", &snapshot_with_frames(NPU_FRAME));
    let path = path.to_str().unwrap();
    let out = run(&["replay", path, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("recorded by torch_npu"), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let config = json["results"][0]["config"].as_str().unwrap_or_default().to_string();
    assert!(config.contains("base_addr_aligned_kb:16"), "{json}");
    let out = run(&["replay", path, "--json", "-p", "pytorch-cuda"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("recorded by torch_npu"), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["results"][0]["config"], "expandable_segments:False", "{json}");
}

/// Issue 45: torch_npu records a run with expandable segments with `expandable_segments:False`
/// in its settings while its trace maps pages. Such a recording is made here by exporting a
/// replay (`--export-snapshot`, no frames) and writing `False` into its settings: it must be
/// told torch_npu's by its blocks' padding, replayed and validated as expandable, every address
/// matched; the same made by CUDA's rules stays CUDA's and validates too.
#[test]
fn an_expandable_recording_whose_settings_say_false_is_replayed_and_validated_as_expandable() {
    let dir = tempfile::tempdir().unwrap();
    let trace = bundled("gpt-4l-512h.txt");
    for (spec, npu) in
        [("pytorch-npu:expandable_segments:True", true), ("pytorch-expandable", false)]
    {
        let exported = dir.path().join("exported.pickle");
        let o = run(&[
            "replay",
            trace.to_str().unwrap(),
            "-p",
            spec,
            "--export-snapshot",
            exported.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{spec}: {}", stderr(&o));
        let mut t =
            snapshot::read(&std::fs::read(&exported).unwrap(), &ReadOptions::default()).unwrap();
        let settings = t.allocator_settings.as_mut().expect("exported settings");
        settings.expandable_segments = false;
        settings.conf = Some("expandable_segments:False".into());
        assert!(t.devices[0].events.iter().any(|e| e.action == Action::SegmentMap), "{spec}");
        let mut bytes = Vec::new();
        snapshot::write(&t, &mut bytes).unwrap();
        let (_d, path) = temp_file("recorded.pickle", &bytes);
        let path = path.to_str().unwrap();
        let read = snapshot::read(&bytes, &ReadOptions::default()).unwrap();
        assert_eq!(read.torch_npu, npu, "{spec}: told by its blocks");

        let o = run(&["validate", path, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{spec}: {}{}", stdout(&o), stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert!(v["allocs_total"].as_u64().unwrap() > 1000, "{spec}: {v}");
        assert_eq!(v["allocs_addr_matched"], v["allocs_total"], "{spec}: {v}");
        assert!(v["segment_events_recorded"].as_u64().unwrap() > 0, "{spec}");
        assert_eq!(v["segment_events_matched"], v["segment_events_recorded"], "{spec}: {v}");

        let o = run(&["replay", path, "-p", "pytorch", "--json"]);
        assert!(o.status.success(), "{spec}: {}", stderr(&o));
        assert_eq!(stderr(&o).contains("recorded by torch_npu"), npu, "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let rows = v["results"].as_array().unwrap();
        let peak = |name: &str| {
            rows.iter().find(|r| r["policy"] == name).unwrap()["peak_reserved_bytes"].clone()
        };
        assert_eq!(peak("pytorch"), peak("recorded"), "{spec}: {v}");
        let mallocs = rows.iter().find(|r| r["policy"] == "pytorch").unwrap()["map_count"].clone();
        assert!(mallocs.as_u64().unwrap() > 0, "{spec}: replayed with pages: {v}");

        // Converted to `.fst`, it stays torch_npu's (the file's head keeps the mark; before,
        // only a `torch_npu/` frame did) and validates as the snapshot does.
        let fst = dir.path().join(format!("recorded-{npu}.fst"));
        let o = run(&["convert", path, fst.to_str().unwrap()]);
        assert!(o.status.success(), "{spec}: {}", stderr(&o));
        let o = run(&["validate", fst.to_str().unwrap(), "--json"]);
        assert_eq!(o.status.code(), Some(0), "{spec}: {}{}", stdout(&o), stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["allocs_addr_matched"], v["allocs_total"], "{spec}: .fst: {v}");
        assert_eq!(v["segment_events_matched"], v["segment_events_recorded"], "{spec}: .fst");
    }
}
