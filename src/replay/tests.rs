//! The engine's own tests: its builds agree, its cursors answer in order.

use super::engine::*;
use super::options::*;
use super::*;
use crate::backend::Backend;
use crate::metrics::Point;
use crate::policy::Allocation;

#[test]
fn added_calls_come_after_the_events_the_plan_names() {
    for (every, at) in
        [(None, vec![]), (Some(3), vec![]), (None, vec![0, 4, 4, 9]), (Some(4), vec![1, 3, 20])]
    {
        let plan = EmptyCachePlan { every, at: at.clone(), drop_recorded: false };
        let mut calls = plan.added_calls();
        let asked: Vec<u64> = (0..30).filter(|&i| calls.after(i)).collect();
        let want: Vec<u64> = (0..30u64)
            .filter(|&i| every.is_some_and(|n| (i + 1) % n == 0) || at.contains(&i))
            .collect();
        assert_eq!(asked, want, "every {every:?}, at {at:?}");
    }
    // Asked about some events only (the replay stops early or skips none), still in order.
    let plan = EmptyCachePlan { every: Some(5), at: vec![7], drop_recorded: false };
    let mut calls = plan.added_calls();
    let asked: Vec<u64> = [2, 4, 7, 8, 14, 15].into_iter().filter(|&i| calls.after(i)).collect();
    assert_eq!(asked, [4, 7, 14]);
}
use crate::policy::pytorch::{Config, PyTorch};
use crate::trace::{text, ReadOptions};

#[test]
fn a_plain_replay_and_a_full_one_agree_number_for_number() {
    // Options that need the full build of the engine but change no decision: a series, the
    // invariant checks, and an added empty_cache() call after the last event (made when
    // nothing follows it, so only the call count may differ).
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/real/cs336-medium-ctx512-infer.pickle");
    let trace = crate::trace::read_trace(path.as_ref(), &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&trace, None).unwrap();
    let last = input.event_count() - 1;
    let plain = ReplayOptions::default();
    let full = ReplayOptions {
        keep_series: true,
        check_invariants: true,
        empty_cache: EmptyCachePlan { at: vec![last], ..EmptyCachePlan::default() },
        ..ReplayOptions::default()
    };
    assert!(is_plain(&input, &plain) && !is_plain(&input, &full));
    for info in crate::policy::POLICIES.iter() {
        let spec = PolicySpec { name: info.name.into(), options: String::new() };
        let run = |options| {
            let mut out = info.run(&spec, &input, options).unwrap_or_else(|e| panic!("{e}"));
            out.result.replay_seconds = 0.0;
            out.result.planning_seconds = out.result.planning_seconds.map(|_| 0.0);
            out
        };
        let (a, mut b) = (run(&plain), run(&full));
        assert!(b.series.as_ref().is_some_and(|s| !s.points().is_empty()), "{}", info.name);
        assert_eq!(b.detail.empty_cache_calls, a.detail.empty_cache_calls + 1, "{}", info.name);
        b.detail.empty_cache_calls = a.detail.empty_cache_calls;
        // The call after the last event releases what the policy caches, as at the end.
        b.result.reserved_at_end_bytes = a.result.reserved_at_end_bytes;
        b.result.device_free_count = a.result.device_free_count;
        b.result.unmap_count = a.result.unmap_count;
        b.segments = a.segments.clone();
        assert_eq!(a.result, b.result, "{}", info.name);
        assert_eq!(a.detail, b.detail, "{}", info.name);
    }
}

/// `pytorch` as its registration builds it, in the general form (no default rules folded).
fn general_pytorch(input: &ReplayInput, options: &ReplayOptions) -> PyTorch {
    let context = input.context(options);
    PyTorch::from_spec("", &context).unwrap()
}

#[test]
fn pytorch_default_rules_form_decides_as_the_general_form() {
    // `replay -p pytorch` runs the default-rules form where the settings allow it; it must
    // place every block where the general form does, on real snapshots (their recovered
    // start state installed), under a capacity that forces the release-and-retry fallbacks,
    // with added empty_cache() calls, and in the recorded run that logs every address.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/traces");
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(format!("{dir}/real"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    paths.sort();
    paths.push(format!("{dir}/gpt-4l-512h.txt").into());
    let mut folded = 0;
    for path in &paths {
        let trace = crate::trace::read_trace(path, &ReadOptions::default()).unwrap();
        let input = ReplayInput::new(&trace, None).unwrap();
        let plain = ReplayOptions::default();
        if !general_pytorch(&input, &plain).has_default_rules() {
            continue; // recorded settings that the general form alone decides
        }
        folded += 1;
        let peak = run_policy("pytorch", general_pytorch(&input, &plain), &input, &plain)
            .unwrap()
            .result
            .peak_reserved_bytes;
        let cases = [
            plain.clone(),
            ReplayOptions { capacity: Some(peak / 10 * 9), ..plain.clone() },
            ReplayOptions {
                empty_cache: EmptyCachePlan { every: Some(97), ..EmptyCachePlan::default() },
                check_invariants: true,
                ..plain.clone()
            },
            ReplayOptions { record_events: true, ..plain.clone() },
        ];
        let spec = PolicySpec { name: "pytorch".into(), options: String::new() };
        for options in &cases {
            let general = run_policy("pytorch", general_pytorch(&input, options), &input, options);
            let folded_form = run_spec(&spec, &input, options);
            let (mut a, mut b) = (general.unwrap(), folded_form.unwrap());
            (a.result.replay_seconds, b.result.replay_seconds) = (0.0, 0.0);
            let what = format!("{} with {options:?}", path.display());
            assert_eq!(a.result, b.result, "{what}");
            assert_eq!(a.detail, b.detail, "{what}");
            assert_eq!(a.segments, b.segments, "{what}");
            assert_eq!(a.events, b.events, "{what}");
        }
        let capped = ReplayOptions { capacity: Some(peak / 10 * 9), ..plain.clone() };
        let squeezed = run_spec(&spec, &input, &capped).unwrap();
        assert!(
            squeezed.result.alloc_retries > 0 || squeezed.detail.oom_count > 0,
            "{}",
            path.display()
        );
    }
    assert!(folded >= 2, "only {folded} traces replay with PyTorch's default rules");
}

/// A policy that breaks [`Policy::allocated`]'s promise: a free raises its allocated bytes.
struct FreeRaisesAllocated(u64, u64);

impl Policy for FreeRaisesAllocated {
    fn config(&self) -> String {
        String::new()
    }
    fn malloc<B: Backend>(&mut self, _: &mut B, size: u64, _: u64) -> Result<Option<Allocation>> {
        self.0 += size;
        self.1 += 1 << 20;
        Ok(Some(Allocation::new(self.1, size)))
    }
    fn free<B: Backend>(&mut self, _: &mut B, _: u64) -> Result<()> {
        self.0 += 1;
        Ok(())
    }
    fn empty_cache<B: Backend>(&mut self, _: &mut B) -> Result<()> {
        Ok(())
    }
    fn allocated(&self) -> u64 {
        self.0
    }
}

#[test]
fn a_replay_that_checks_invariants_refuses_a_free_that_raises_allocated_bytes() {
    // The engine takes no allocated peak after a free (it can only fall there); a replay
    // that checks invariants says so when a policy's free raises it after all.
    let t =
        text::read(&b"alloc 0x1000 4096 s0\nfree 0x1000 4096 s0\n"[..], &ReadOptions::default())
            .unwrap();
    let input = ReplayInput::new(&t, None).unwrap();
    let checked = ReplayOptions { check_invariants: true, ..ReplayOptions::default() };
    let err = run_policy("toy", FreeRaisesAllocated(0, 0), &input, &checked).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("a free raised its allocated bytes from 4096 to 4097"), "{message}");
    // The text format's free is a free_requested (event 1) and a free_completed (event 2),
    // where the free takes effect.
    assert!(message.starts_with("event 2:"), "{message}");
    // Unchecked, the replay runs: its peak is the one after the alloc.
    let out =
        run_policy("toy", FreeRaisesAllocated(0, 0), &input, &ReplayOptions::default()).unwrap();
    assert_eq!(out.result.peak_allocated_bytes, 4096);
}

const MIB: u64 = 1 << 20;

#[test]
fn fragmentation_at_peak_is_read_when_reserved_first_reaches_its_peak() {
    // Reserved grows to 200 MiB at event 1 (both blocks live: nothing cached), then stays
    // there while a block is freed (event 2) and a smaller one reuses its cached memory
    // (event 3): a plateau whose later moments have a lower allocated share.
    let src = format!(
        "alloc 0x1000 {a} s0\nalloc 0x2000 {a} s0\nfree 0x1000 {a} s0\nalloc 0x3000 {b} s0\n",
        a = 100 * MIB,
        b = 50 * MIB
    );
    let t = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&t, None).unwrap();
    let opts = ReplayOptions { keep_series: true, ..ReplayOptions::default() };
    let out = run_policy("pytorch", PyTorch::new(Config::default()), &input, &opts).unwrap();
    let r = &out.result;
    assert_eq!(r.peak_reserved_bytes, 200 * MIB);
    // The plateau really has later moments with less allocated: a later reading would differ.
    let points = out.series.as_ref().unwrap().points();
    let later: Vec<&Point> =
        points.iter().filter(|p| p.reserved == 200 * MIB && p.event > 1).collect();
    assert!(!later.is_empty());
    assert!(later.iter().all(|p| p.allocated < 200 * MIB), "{later:?}");
    // The first moment of the peak is event 1, where everything reserved is allocated.
    assert_eq!(r.peak_event, 1);
    assert_eq!(out.detail.peak_reserved_event, 1);
    assert_eq!(out.detail.allocated_at_peak_bytes, 200 * MIB);
    assert_eq!(r.fragmentation_at_peak, 0.0);
}

/// A policy that raises a [`Cancel`] flag at its `at`th malloc, and counts its mallocs.
struct CancelsAt {
    at: u64,
    mallocs: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cancel: Cancel,
    next: u64,
}

impl Policy for CancelsAt {
    fn config(&self) -> String {
        String::new()
    }
    fn malloc<B: Backend>(&mut self, _: &mut B, size: u64, _: u64) -> Result<Option<Allocation>> {
        let n = self.mallocs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n == self.at {
            self.cancel.cancel();
        }
        self.next += 1 << 20;
        Ok(Some(Allocation::new(self.next, size)))
    }
    fn free<B: Backend>(&mut self, _: &mut B, _: u64) -> Result<()> {
        Ok(())
    }
    fn empty_cache<B: Backend>(&mut self, _: &mut B) -> Result<()> {
        Ok(())
    }
    fn allocated(&self) -> u64 {
        0
    }
}

#[test]
fn a_raised_cancel_flag_stops_a_replay_within_one_chunk_of_events() {
    // Nine chunks of events (alloc, free requested, free completed: three per pair); the flag
    // goes up a third of the way into the first chunk.
    let pairs = 3 * Cancel::EVERY as u64;
    let mut src = String::new();
    for i in 0..pairs {
        src.push_str(&format!(
            "alloc {:#x} 512 s0\nfree {:#x} 512 s0\n",
            0x1000 + i * 512,
            0x1000 + i * 512
        ));
    }
    let t = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&t, None).unwrap();
    let at = Cancel::EVERY as u64 / 3 + 1;
    for plain in [true, false] {
        let mallocs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let cancel = Cancel::new();
        let options = ReplayOptions {
            keep_series: !plain,
            cancel: cancel.clone(),
            ..ReplayOptions::default()
        };
        assert_eq!(is_plain(&input, &options), plain);
        let policy = CancelsAt { at, mallocs: mallocs.clone(), cancel: cancel.clone(), next: 0 };
        let err = run_policy("toy", policy, &input, &options).unwrap_err();
        // The error says what it stopped and where: the first look after the flag went up.
        assert!(err.is_interrupted(), "{err}");
        let message = err.to_string();
        let event = message
            .strip_prefix("interrupted (Ctrl-C) while replaying policy 'toy' at event ")
            .and_then(|m| m.strip_suffix(&format!(" of {}", 3 * pairs)))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{message}"));
        assert!(event > 3 * (at - 1) && event <= 3 * at + Cancel::EVERY as u64, "{message}");
        let made = mallocs.load(std::sync::atomic::Ordering::Relaxed);
        // At most one chunk of events (each malloc is 3 events: alloc, free requested,
        // completed) after the flag went up, and far fewer than the trace holds.
        assert!(
            made >= at && made <= at + Cancel::EVERY as u64 / 2,
            "{made} mallocs (plain: {plain})"
        );
        // A raised flag stops the next replay before its first event.
        let policy = CancelsAt { at: 0, mallocs: mallocs.clone(), cancel: cancel.clone(), next: 0 };
        assert!(run_policy("toy", policy, &input, &options).is_err());
        assert_eq!(mallocs.load(std::sync::atomic::Ordering::Relaxed), made);
    }
    // Never raised (the default), the replay runs to its end.
    let mallocs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let policy = CancelsAt { at: 0, mallocs: mallocs.clone(), cancel: Cancel::default(), next: 0 };
    run_policy("toy", policy, &input, &ReplayOptions::default()).unwrap();
    assert_eq!(mallocs.load(std::sync::atomic::Ordering::Relaxed), pairs);
}

/// A recording with an exact-address allocation (`mallocWithAddress`) is never replayed by the
/// plain build, which skips the guide that places it: `replay` and `replay --series` must make
/// the same decisions on it.
#[test]
fn exact_address_allocations_take_the_guided_build() {
    let src = "alloc 0x10000000 20971520 s0\nalloc 0x20000000 10485760 s0\n\
               free 0x10000000 20971520 s0\nfree 0x20000000 10485760 s0\n\
               alloc 0x10000000 8388608 s0\nalloc 0x10800000 4194304 s0\n\
               free 0x10000000 8388608 s0\n";
    let mut trace = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
    let plain = ReplayOptions::default();
    assert!(is_plain(&ReplayInput::new(&trace, None).unwrap(), &plain));
    let events = &trace.devices[0].events;
    let prefix =
        events.iter().position(|e| e.action == crate::trace::Action::Alloc && e.size == 8 << 20);
    trace.extras.malloc_with_address_events = vec![(0, prefix.unwrap() as u64)];
    let input = ReplayInput::new(&trace, None).unwrap();
    assert_eq!(input.exact_addresses().len(), 1);
    assert!(!is_plain(&input, &plain), "the guide places exact-address allocations");
}

/// A free replay's memory lies elsewhere than the recording's (fresh simulated addresses): an
/// exact-address request is placed where the run holds the address asked, found through the
/// block the program took it from, not at the recorded address, which the run never has. Here
/// the request asked 6 MiB into a freed 12 MiB block; best fit would have put the 6 MiB prefix
/// in the 6 MiB hole at the segment's start (so that the request, at the recorded distance from
/// it, would land on a live block and be served by best fit too) and left room for the last
/// 8 MiB request, which the recording served from a second segment.
#[test]
fn a_free_replay_places_an_exact_address_request_where_its_memory_holds_the_address() {
    let src = "alloc 0x10000000 20971520 s0\nfree 0x10000000 20971520 s0\n\
               alloc 0x10000000 6291456 s0\nalloc 0x10600000 2097152 s0\n\
               alloc 0x10800000 12582912 s0\nfree 0x10000000 6291456 s0\n\
               free 0x10800000 12582912 s0\n\
               alloc 0x10800000 6291456 s0\nalloc 0x10e00000 2097152 s0\n\
               free 0x10800000 6291456 s0\n\
               alloc 0x20000000 8388608 s0\n";
    let mut trace = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
    let spec = PolicySpec { name: "pytorch".into(), options: String::new() };
    let peak = |trace: &crate::trace::Trace| {
        let input = ReplayInput::new(trace, None).unwrap();
        let out = run_spec(&spec, &input, &ReplayOptions::default()).unwrap();
        out.result.peak_reserved_bytes
    };
    assert_eq!(peak(&trace), 20 << 20, "unmarked: best fit, one segment");
    let events = &trace.devices[0].events;
    let prefix =
        events.iter().rposition(|e| e.action == crate::trace::Action::Alloc && e.size == 6 << 20);
    trace.extras.malloc_with_address_events = vec![(0, prefix.unwrap() as u64)];
    assert_eq!(peak(&trace), 40 << 20, "placed as recorded: a second segment");
}
