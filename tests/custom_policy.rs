//! Integration tests: `examples/custom_policy.rs`, an allocator written outside the crate against
//! the public `Policy` trait. The example's own code is compiled in here (the module below), so
//! these tests run exactly what `cargo run --example custom_policy` runs.

#[path = "../examples/custom_policy.rs"]
#[allow(dead_code)] // the example's `main`
mod example;

use crate::util::*;
use example::{compare, default_trace, replay_all, table};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::trace::{self, Action, Format, ReadOptions};

const MIB: u64 = 1 << 20;

/// Hand-worked: a (1 MiB) and b (1 MiB) fill one 2 MiB segment; a is freed and c (512 KiB) takes
/// its place at the segment's start (first fit); d (1 MiB) fits nowhere and gets a new segment.
#[test]
fn first_fit_places_by_hand_worked_addresses() {
    let text = "alloc 0x10000000 1048576\nalloc 0x10100000 1048576\nfree 0x10000000 1048576\n\
                alloc 0x10000000 524288\nalloc 0x20000000 1048576\n";
    let t = trace::read_bytes(text.as_bytes(), Format::Text, &ReadOptions::default())
        .expect("the text trace reads");
    let input = ReplayInput::new(&t, None).expect("one device");
    let options =
        ReplayOptions { record_events: true, check_invariants: true, ..ReplayOptions::default() };
    let outputs = replay_all(&input, &[], &options).expect("first-fit replays");
    let first_fit = &outputs[0];
    assert_eq!(first_fit.result.policy, "first-fit");
    assert_eq!(first_fit.result.peak_reserved_bytes, 4 * MIB);
    assert_eq!(first_fit.result.device_malloc_count, 2);
    let allocs: Vec<u64> = first_fit
        .events
        .as_ref()
        .expect("events were recorded")
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .map(|e| e.addr)
        .collect();
    let base = allocs[0];
    assert_eq!(allocs[1..3], [base + MIB, base]);
    assert!(allocs[3] < base || allocs[3] >= base + 2 * MIB, "d is in a second segment");
}

/// The example's run on its bundled real trace: every invariant holds after every event, no
/// policy beats `bound`, and the `pytorch` row is the one `fragsim replay` prints.
#[test]
fn custom_policy_example_on_a_real_trace() {
    let path = default_trace();
    assert!(path.exists(), "{} ships with the repository", path.display());
    let options = ReplayOptions { check_invariants: true, ..ReplayOptions::default() };
    let outputs = compare(&path, &options).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = outputs.iter().map(|o| o.result.policy.as_str()).collect();
    assert_eq!(names, ["first-fit", "pytorch", "bound"]);
    let bound = outputs[2].result.peak_reserved_bytes;
    for o in &outputs {
        let r = &o.result;
        assert!(!r.oom, "{}", r.policy);
        assert!(r.peak_reserved_bytes >= bound, "{}: below bound", r.policy);
        assert_eq!(r.peak_requested_bytes, bound, "{}: the same requests", r.policy);
    }
    let first_fit = &outputs[0].result;
    assert_eq!(first_fit.peak_reserved_bytes % (2 * MIB), 0, "segments are 2 MiB multiples");

    let cli = run(&["replay", path.to_str().expect("utf-8"), "--policy", "pytorch", "--json"]);
    assert!(cli.status.success(), "{}", stderr(&cli));
    let v: serde_json::Value = serde_json::from_slice(&cli.stdout).expect("JSON");
    assert_eq!(v["results"][0]["peak_reserved_bytes"], outputs[1].result.peak_reserved_bytes);

    let printed = table(&outputs);
    assert_eq!(printed.lines().count(), 4, "{printed}");
    for name in names {
        assert!(printed.contains(name), "{printed}");
    }
}
