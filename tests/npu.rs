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
