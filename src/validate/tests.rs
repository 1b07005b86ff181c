use super::checker::{plan, Op};
use super::*;
use crate::backend::Backend;
use crate::policy::Policy;
use crate::trace::lifetimes::FlushCauses;
use crate::trace::{text, ReadOptions};

fn trace(src: &str) -> Trace {
    text::read(src.as_bytes(), &ReadOptions::default()).unwrap()
}

/// [`plan`] of device 0 of `t`, with the calls a replay reads there.
fn plan_of(t: &Trace) -> Vec<Op> {
    let events = &t.devices[0].events;
    let input = ReplayInput::of_events(t, t.devices[0].device, events).unwrap();
    plan(events, &FlushCauses::of(&t.frames), input.empty_cache_at())
}

#[test]
fn a_run_of_releases_outside_a_malloc_is_a_flush_and_a_malloc_owns_its_segments() {
    let t = trace(
        "segment_free 0x0 2097152\nalloc 0x0 8\nsegment_free 0x400000 2097152\n\
             segment_alloc 0x800000 20971520\nalloc 0x800000 4096000\n",
    );
    let ops = plan_of(&t);
    assert!(matches!(&ops[0], Op::Flush { script } if script == &vec![0]));
    assert!(matches!(&ops[1], Op::Malloc { script, .. } if script.is_empty()));
    assert!(matches!(ops[2], Op::Skip));
    assert!(matches!(&ops[4], Op::Malloc { script, .. } if script == &vec![2, 3]));
}

#[test]
fn real_snapshots_keep_every_invariant() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    for name in ["cs336-lm-step-c.pickle", "cs336-medium-ctx512-infer.pickle"] {
        // The real traces ship with the repository (`traces/real/README.md`).
        let t = crate::trace::read_trace(&dir.join(name), &Default::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
        let v = validate(&t, &options).unwrap();
        assert!(v.mismatches.is_empty(), "{name}");
    }
}

#[test]
fn a_cold_trace_validates_exactly() {
    // 5 MiB gets a 20 MiB segment at the recorded address; 3 MiB goes right after it; after
    // both are freed, a flush returns the whole segment.
    let t = trace(
        "segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\n\
             alloc 0x10500000 3145728\nfree_requested 0x10000000 5242880\n\
             free_completed 0x10000000 5242880\nfree_requested 0x10500000 3145728\n\
             free_completed 0x10500000 3145728\nsegment_free 0x10000000 20971520\n",
    );
    let v = validate(&t, &ValidateOptions::default()).unwrap();
    assert_eq!((v.allocs_total, v.allocs_addr_matched), (2, 2));
    assert_eq!((v.segment_events_recorded, v.segment_events_matched), (2, 2));
    assert_eq!(v.peak_reserved_recorded_bytes, 20 << 20);
    assert_eq!(v.peak_reserved_simulated_bytes, 20 << 20);
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
}

#[test]
fn the_final_layout_is_compared_with_the_dump() {
    use crate::trace::{Block, BlockState, PoolKind, Segment};
    let mut t = trace("segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\n");
    let seg = |blocks: Vec<Block>| Segment {
        device: 0,
        address: 0x1000_0000,
        total_size: 20 << 20,
        stream: 0,
        pool: PoolKind::Large,
        is_expandable: false,
        private_pool: None,
        blocks,
    };
    let block = |address, size, state| Block { address, size, requested_size: 0, state };
    // The dump as the real allocator leaves it: 5 MiB live, 15 MiB free.
    t.segments = vec![seg(vec![
        block(0x1000_0000, 5 << 20, BlockState::ActiveAllocated),
        block(0x1050_0000, 15 << 20, BlockState::Inactive),
    ])];
    assert!(validate(&t, &ValidateOptions::default()).unwrap().mismatches.is_empty());
    // A dump that disagrees (the block is 6 MiB) is a mismatch after the last event.
    t.segments = vec![seg(vec![
        block(0x1000_0000, 6 << 20, BlockState::ActiveAllocated),
        block(0x1060_0000, 14 << 20, BlockState::Inactive),
    ])];
    let v = validate(&t, &ValidateOptions::default()).unwrap();
    assert_eq!(v.mismatches.len(), 1);
    assert_eq!((v.mismatches[0].event, v.mismatches[0].action_name()), (2, "segments"));
}

/// A 20 MiB large-pool segment on stream 0 of the dump, tiled by (address, size, state).
fn segment_of_20_mib(
    address: u64,
    private_pool: Option<(u64, u64)>,
    blocks: &[(u64, u64, crate::trace::BlockState)],
) -> crate::trace::Segment {
    crate::trace::Segment {
        device: 0,
        address,
        total_size: 20 << 20,
        stream: 0,
        pool: crate::trace::PoolKind::Large,
        is_expandable: false,
        private_pool,
        blocks: blocks
            .iter()
            .map(|&(address, size, state)| crate::trace::Block {
                address,
                size,
                requested_size: 0,
                state,
            })
            .collect(),
    }
}

#[test]
fn a_private_pool_s_free_blocks_go_to_no_other_allocation() {
    // Two 20 MiB segments, live before recording, each wholly free: one of a CUDA graph's
    // private pool at the lower address, one of the default pool above it. A 4 MiB request
    // outside capture takes the default pool's block, as PyTorch does: in one shared pool,
    // best fit (equal sizes, lowest address) would take the private one.
    use crate::trace::{Block, BlockState};
    let (private, default) = (0x1000_0000u64, 0x2000_0000u64);
    let seg = |address, private_pool, blocks: Vec<(u64, u64, BlockState)>| {
        segment_of_20_mib(address, private_pool, &blocks)
    };
    let dump = |recorded: u64| {
        let mut t = trace(&format!("alloc {recorded:#x} 4194304\n"));
        t.segments = vec![
            seg(private, Some((1, 0)), vec![(private, 20 << 20, BlockState::Inactive)]),
            seg(
                default,
                None,
                vec![
                    (default, 4 << 20, BlockState::ActiveAllocated),
                    (default + (4 << 20), 16 << 20, BlockState::Inactive),
                ],
            ),
        ];
        // The dump after the alloc: where it was recorded, 4 MiB live, the rest free.
        if recorded == private {
            t.segments[0].blocks = vec![
                Block {
                    address: private,
                    size: 4 << 20,
                    requested_size: 0,
                    state: BlockState::ActiveAllocated,
                },
                Block {
                    address: private + (4 << 20),
                    size: 16 << 20,
                    requested_size: 0,
                    state: BlockState::Inactive,
                },
            ];
            t.segments[1].blocks = vec![Block {
                address: default,
                size: 20 << 20,
                requested_size: 0,
                state: BlockState::Inactive,
            }];
        }
        t
    };
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let v = validate(&dump(default), &options).unwrap();
    assert_eq!((v.allocs_total, v.allocs_addr_matched), (1, 1), "{:?}", v.mismatches);
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    let note = Warning::PrivatePools { segments: 1, bytes: 20 << 20, pools: 1, named: false };
    assert!(v.notes.contains(&note), "{:?}", v.notes);
    assert!(note.is_modelling_note(), "shown without --verbose");
    // The same segments, none of them private: best fit takes the lower one, and the
    // recorded placement no longer reproduces (what the private pool changes).
    let mut shared = dump(default);
    shared.segments[0].private_pool = None;
    let v = validate(&shared, &options).unwrap();
    assert_eq!(v.allocs_addr_matched, 0);
    // An allocation recorded inside the private pool (made during capture, which the trace
    // does not mark) is routed there by where it landed: it takes the private block, and
    // the default pool's free block stays as the dump shows it.
    let v = validate(&dump(private), &options).unwrap();
    assert_eq!((v.allocs_total, v.allocs_addr_matched), (1, 1), "{:?}", v.mismatches);
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
}

#[test]
fn a_malloc_into_a_private_pool_makes_its_new_segment_and_only_it_reuses_the_pool() {
    // A private pool's 20 MiB segment, allocated in the trace by a malloc made into the
    // pool, then freed back to it. A later 4 MiB malloc at the segment's address (still
    // in capture) reuses it; an ordinary 4 MiB malloc must not, so it needs a segment of
    // its own.
    use crate::trace::BlockState;
    let (private, other) = (0x1000_0000u64, 0x3000_0000u64);
    let text = format!(
        "segment_alloc {private:#x} 20971520\n\
             alloc {private:#x} 20971520\n\
             free {private:#x} 20971520\n\
             alloc {private:#x} 4194304\n\
             segment_alloc {other:#x} 20971520\n\
             alloc {other:#x} 4194304\n"
    );
    let mut t = trace(&text);
    let block = |address, size, state| (address, size, state);
    let seg = |address, private_pool, blocks: Vec<(u64, u64, BlockState)>| {
        segment_of_20_mib(address, private_pool, &blocks)
    };
    t.segments = vec![
        seg(
            private,
            Some((7, 1)),
            vec![
                block(private, 4 << 20, BlockState::ActiveAllocated),
                block(private + (4 << 20), 16 << 20, BlockState::Inactive),
            ],
        ),
        seg(
            other,
            None,
            vec![
                block(other, 4 << 20, BlockState::ActiveAllocated),
                block(other + (4 << 20), 16 << 20, BlockState::Inactive),
            ],
        ),
    ];
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let v = validate(&t, &options).unwrap();
    assert_eq!((v.allocs_total, v.allocs_addr_matched), (3, 3), "{:?}", v.mismatches);
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    // Without the pool at the dump nothing says the first two mallocs were made into it:
    // the ordinary malloc then reuses the cached block and the recorded segment_alloc of
    // the other segment is not reproduced.
    t.segments[0].private_pool = None;
    let v = validate(&t, &options).unwrap();
    assert_eq!(v.allocs_addr_matched, 2, "{:?}", v.mismatches);
    assert!(!v.mismatches.is_empty());
}

#[test]
fn nonsense_recordings_never_panic() {
    use crate::testing::Rng;
    use crate::trace::{Block, BlockState, PoolKind, Segment};
    for seed in 0..40 {
        let mut rng = Rng::new(seed);
        let mut pick = |choices: &[u64]| choices[rng.below(choices.len() as u64) as usize];
        let addrs = [0, 0x1000_0000, 0x1000_0200, 0x1050_0000, u64::MAX - 5, 1 << 60];
        let sizes = [0, 1, 512, 5 << 20, 20 << 20, u64::MAX / 2];
        let mut events = Vec::new();
        for _ in 0..60 {
            let action = Action::ALL[pick(&[0, 1, 2, 3, 4, 5, 6, 7, 8]) as usize];
            events.push(Event::new(action, pick(&addrs), pick(&sizes), pick(&[0, 7]), 0));
        }
        let segments = vec![Segment {
            device: 0,
            address: pick(&addrs),
            total_size: pick(&sizes),
            stream: 0,
            pool: PoolKind::Large,
            is_expandable: pick(&[0, 1]) == 1,
            private_pool: None,
            blocks: vec![Block {
                address: pick(&addrs),
                size: pick(&sizes),
                requested_size: pick(&sizes),
                state: BlockState::ActiveAllocated,
            }],
        }];
        let t = Trace {
            devices: vec![crate::trace::DeviceTrace { device: 0, events }],
            segments,
            ..Trace::default()
        };
        let _ = validate(&t, &ValidateOptions::default()); // Ok or Err, never a panic
    }
}

#[test]
fn a_wrong_recording_is_reported() {
    // A real allocator would put the 3 MiB block right after the 5 MiB one, not 8 MiB in.
    let t = trace(
        "segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\n\
             alloc 0x10800000 3145728\n",
    );
    let v = validate(&t, &ValidateOptions::default()).unwrap();
    assert_eq!(v.allocs_addr_matched, 1);
    assert_eq!(v.mismatches.len(), 1);
    assert_eq!(v.mismatches[0].event, 2);
    assert_eq!(v.mismatches[0].got, "0x10500000");
}

/// A device that logs segment events as PyTorch's trace would record them, with the stream
/// of the segment (or reservation) they belong to.
struct Logged {
    inner: crate::backend::SimDevice,
    log: Vec<Event>,
    stream: u64,
    streams: BTreeMap<u64, (u64, u64)>,
}

impl Logged {
    fn stream_of(&self, addr: u64) -> u64 {
        self.streams.range(..=addr).next_back().map_or(0, |(_, &(_, s))| s)
    }
}

impl Backend for Logged {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        let r = self.inner.segment_alloc(size)?;
        if let Some(a) = r {
            self.streams.insert(a, (size, self.stream));
            self.log.push(Event::new(Action::SegmentAlloc, a, size, self.stream, 0));
        }
        Ok(r)
    }
    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        let s = self.stream_of(addr);
        self.log.push(Event::new(Action::SegmentFree, addr, size, s, 0));
        self.inner.segment_free(addr, size)
    }
    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        let r = self.inner.reserve(size)?;
        if let Some(a) = r {
            self.streams.insert(a, (size, self.stream));
        }
        Ok(r)
    }
    fn release(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.release(addr, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        let ok = self.inner.map(addr, size)?;
        if ok {
            let s = self.stream_of(addr);
            self.log.push(Event::new(Action::SegmentMap, addr, size, s, 0));
        }
        Ok(ok)
    }
    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        let s = self.stream_of(addr);
        self.log.push(Event::new(Action::SegmentUnmap, addr, size, s, 0));
        self.inner.unmap(addr, size)
    }
    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }
}

/// A snapshot as the real allocator would record it: the policy itself driven by a seeded
/// workload (with flushes and, under a capacity, fallbacks and OOMs), its final segments and
/// settings. Validation must reproduce it exactly, from the start or from any point.
fn generate(conf: &str, seed: u64, capacity: Option<u64>) -> Trace {
    generate_on(conf, seed, capacity, Config::default().gpu_memory)
}

/// [`generate`] on a GPU of `gpu_memory` bytes (the base of a memory fraction).
fn generate_on(conf: &str, seed: u64, capacity: Option<u64>, gpu_memory: u64) -> Trace {
    let mut config = Config::parse(conf, Version::CURRENT).unwrap();
    config.gpu_memory = gpu_memory;
    generate_with(config, conf, seed, capacity)
}

/// [`generate`] as torch_npu records it: its allocator's rules, and its frames.
fn generate_npu(conf: &str, seed: u64, capacity: Option<u64>) -> Trace {
    let config = Config::parse_npu(conf).unwrap();
    Trace { torch_npu: true, ..generate_with(config, conf, seed, capacity) }
}

/// [`generate`] under `config`, whose settings string is `conf`.
fn generate_with(config: Config, conf: &str, seed: u64, capacity: Option<u64>) -> Trace {
    use crate::testing::{workload, Step};
    let mut p = PyTorch::new(config.clone());
    let mut dev = Logged {
        inner: crate::backend::SimDevice::new(capacity),
        log: Vec::new(),
        stream: 0,
        streams: BTreeMap::new(),
    };
    let mut events = Vec::new();
    let mut live = std::collections::HashMap::new();
    for step in workload(seed, 3000) {
        match step {
            Step::Alloc { id, size, stream } => {
                dev.stream = stream;
                let r = p.malloc(&mut dev, size, stream).unwrap();
                events.append(&mut dev.log);
                match r {
                    Some(a) => {
                        events.push(Event::new(Action::Alloc, a.addr, size, stream, 0));
                        live.insert(id, (a.addr, size, stream));
                    }
                    None => {
                        let rounded = config.round_size(size);
                        events.push(Event::new(Action::Oom, 0, rounded, stream, 0));
                    }
                }
            }
            Step::Free { id } => {
                if let Some((a, size, stream)) = live.remove(&id) {
                    events.push(Event::new(Action::FreeRequested, a, size, stream, 0));
                    events.push(Event::new(Action::FreeCompleted, a, size, stream, 0));
                    p.free(&mut dev, a).unwrap();
                }
            }
            Step::EmptyCache => {
                p.empty_cache(&mut dev).unwrap();
                events.append(&mut dev.log);
            }
        }
    }
    for (i, e) in events.iter_mut().enumerate() {
        e.time_us = i as i64;
    }
    Trace {
        format: crate::trace::Format::PytorchSnapshot,
        converted_from: None,
        devices: vec![crate::trace::DeviceTrace { device: 0, events }],
        segments: p.segments(),
        allocator_settings: Some(crate::trace::AllocatorSettings {
            conf: Some(conf.to_string()),
            max_split_size: (config.max_split_size != u64::MAX).then_some(config.max_split_size),
            garbage_collection_threshold: config.garbage_collection_threshold,
            expandable_segments: config.expandable_segments,
            roundup_power2_divisions: config.roundup_power2_divisions,
            release_lock_on_cudamalloc: false,
            at: None,
        }),
        has_times: false,
        frames: Default::default(),
        recorded_totals: Vec::new(),
        entry_pools: None,
        torch_npu: false,
        platform: None,
        extras: Default::default(),
    }
}

fn assert_exact(t: &Trace, what: &str) -> Validation {
    let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
    let v = validate(t, &options).unwrap();
    assert!(v.mismatches.is_empty(), "{what}: {:?}", &v.mismatches[..v.mismatches.len().min(3)]);
    assert_eq!(v.allocs_addr_matched + v.undeterminable_events, v.allocs_total, "{what}");
    assert_eq!(v.segment_events_matched, v.segment_events_recorded, "{what}");
    v
}

#[test]
fn self_generated_snapshots_exercise_ooms_flushes_fallbacks_and_maps() {
    let count = |t: &Trace, a: Action| t.devices[0].events.iter().filter(|e| e.action == a).count();
    let t = generate("", 3, Some(96 << 20));
    let ops = plan_of(&t);
    assert!(count(&t, Action::Oom) > 0);
    assert!(ops.iter().any(|o| matches!(o, Op::Flush { script } if !script.is_empty())));
    assert!(ops.iter().any(|o| matches!(o, Op::Malloc { script, .. }
            if script.first().is_some_and(|&j| t.devices[0].events[j].action == Action::SegmentFree))));
    let t = generate("expandable_segments:True", 3, Some(96 << 20));
    assert!(count(&t, Action::SegmentMap) > 0 && count(&t, Action::SegmentUnmap) > 0);
}

#[test]
fn a_replay_asks_about_every_release_run_that_validate_asks_about() {
    // With garbage collection on, the levels prove nothing of a release run before a
    // malloc's new segment: a replay asks the model about it, as `validate` does (a replay
    // once left such runs to no one and never made those `empty_cache()` calls).
    let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
    let t = generate_on(conf, 21, None, 256 << 20);
    let e = &t.devices[0].events;
    let input = ReplayInput::of_events(&t, t.devices[0].device, e).unwrap();
    let asked: Vec<u64> = input.undecided_flushes().iter().map(|r| r.request).collect();
    let released =
        |script: &[usize]| script.first().is_some_and(|&j| e[j].action == Action::SegmentFree);
    let runs: Vec<u64> = (plan_of(&t).iter().enumerate())
        .filter(|(_, o)| matches!(o, Op::Malloc { script, .. } if released(script)))
        .map(|(i, _)| i as u64)
        .collect();
    assert!(!runs.is_empty());
    assert_eq!(asked, runs);
}

#[test]
fn garbage_collection_validates_with_the_gpu_memory_given() {
    // A 256 MiB GPU at fraction 0.5: 128 MiB allowed, GC above 0.6 of that.
    let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
    for seed in 20..24 {
        let t = generate_on(conf, seed, None, 256 << 20);
        let options = ValidateOptions {
            gpu_memory: Some(256 << 20),
            check_invariants: true,
            ..ValidateOptions::default()
        };
        let v = validate(&t, &options).unwrap();
        assert!(v.mismatches.is_empty(), "seed {seed}: {:?}", v.mismatches.first());
        assert_eq!(v.allocs_addr_matched, v.allocs_total);
        let e = &t.devices[0].events;
        let ops = plan_of(&t);
        let released_in_malloc = ops.iter().any(|o| {
            matches!(o, Op::Malloc { script, .. }
                if script.iter().any(|&j| e[j].action == Action::SegmentFree))
        });
        assert!(released_in_malloc, "seed {seed}: GC never released anything");
    }
}

#[test]
fn self_generated_snapshots_validate_exactly_from_the_start() {
    for conf in
        ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"]
    {
        for (seed, capacity) in [(1, None), (2, Some(160 << 20)), (3, Some(96 << 20))] {
            let t = generate(conf, seed, capacity);
            let v = assert_exact(&t, &format!("{conf} seed {seed}"));
            assert_eq!(v.undeterminable_events, 0, "a cold start has nothing to guess");
            assert!(v.segment_events_recorded > 0);
            assert_eq!(v.peak_reserved_simulated_bytes, v.peak_reserved_recorded_bytes);
        }
    }
}

/// Drops device 0's events before its first alloc after the first third that does not follow
/// a segment event, as a ring buffer would; returns the index of the cut.
fn cut_after_first_third(t: &mut Trace) -> usize {
    let events = &t.devices[0].events;
    let cut = (events.len() / 3..events.len())
        .find(|&i| events[i].action == Action::Alloc && !events[i - 1].action.is_segment_event())
        .unwrap();
    t.devices[0].events.drain(..cut);
    cut
}

#[test]
fn self_generated_snapshots_validate_from_the_middle() {
    // Cut the recording at an alloc after the first third: the start state must be recovered
    // from the final segments (orphans, segments freed later), as with a ring buffer.
    for conf in
        ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"]
    {
        for seed in 4..16 {
            let mut t = generate(conf, seed, Some(200 << 20));
            let cut = cut_after_first_third(&mut t);
            assert_exact(&t, &format!("{conf} seed {seed} from event {cut}"));
        }
    }
}

#[test]
fn torch_npu_self_recordings_validate_exactly() {
    // With and without expandable segments, under memory pressure (fallbacks and OOMs),
    // with the workload's empty_cache calls; the base-address alignment only acts with
    // expandable segments, and once with it turned off.
    for conf in [
        "",
        "max_split_size_mb:64",
        "roundup_power2_divisions:4",
        "expandable_segments:True",
        "expandable_segments:True,base_addr_aligned_kb:0",
        "expandable_segments:True,segment_size_mb:64",
    ] {
        for (seed, capacity) in [(1, None), (2, Some(160 << 20)), (3, Some(96 << 20))] {
            let t = generate_npu(conf, seed, capacity);
            let v = assert_exact(&t, &format!("npu {conf} seed {seed}"));
            assert_eq!(v.undeterminable_events, 0, "a cold start has nothing to guess");
            assert_eq!(v.peak_reserved_simulated_bytes, v.peak_reserved_recorded_bytes);
            assert!(v.notes.iter().any(|n| matches!(
                n,
                Warning::AllocatorRules { flavour: Flavour::Npu, recorded_by: Flavour::Npu }
            )));
        }
    }
}

#[test]
fn torch_npu_self_recordings_validate_from_the_middle() {
    for conf in ["", "expandable_segments:True"] {
        for seed in 4..10 {
            let mut t = generate_npu(conf, seed, Some(200 << 20));
            let cut = cut_after_first_third(&mut t);
            assert_exact(&t, &format!("npu {conf} seed {seed} from event {cut}"));
        }
    }
}

#[test]
fn a_raised_cancel_flag_stops_validation() {
    let t = generate("", 1, None);
    let cancel = Cancel::new();
    let options = ValidateOptions { cancel: cancel.clone(), ..ValidateOptions::default() };
    assert!(validate(&t, &options).is_ok(), "an unraised flag changes nothing");
    cancel.cancel();
    let e = validate(&t, &options).unwrap_err();
    let events = t.devices[0].events.len();
    assert!(e.is_interrupted());
    assert_eq!(
        e.message(),
        format!("interrupted (Ctrl-C) while validating at event 0 of {events}")
    );
}

#[test]
fn torch_npu_recordings_differ_from_cuda_rules() {
    // The 32 bytes of padding move addresses: CUDA's rules cannot reproduce the recording,
    // and asking for them says so.
    let t = generate_npu("", 1, None);
    let options = ValidateOptions { flavour: Some(Flavour::Cuda), ..ValidateOptions::default() };
    let v = validate(&t, &options).unwrap();
    assert!(!v.mismatches.is_empty());
    assert!(v.notes.iter().any(|n| n.to_string().contains("CUDA's allocator rules as asked")));
    // A CUDA recording replayed with CUDA's rules carries no note about torch_npu.
    let v = validate(&generate("", 1, None), &ValidateOptions::default()).unwrap();
    assert!(!v.notes.iter().any(|n| matches!(n, Warning::AllocatorRules { .. })));
}

#[test]
fn warnings_read_as_the_notes_always_did() {
    let shown = |w: Warning| w.to_string();
    assert_eq!(
        shown(Warning::NoAllocatorSettings),
        "the snapshot has no allocator_settings: PyTorch's defaults"
    );
    assert_eq!(
        shown(Warning::AssumedGpuMemory { gpu_memory_bytes: 80 << 30 }),
        "expandable segments: reservations assumed 9/8 of 80.00 GiB of GPU memory (--gpu-mem)"
    );
    assert_eq!(
        shown(Warning::LearnedOrphanSize { addr: 0x200, size: 1024, event: 7 }),
        "the block at 0x200, live before recording, is at least 1024 bytes: event 7 shows it"
    );
    assert_eq!(
        shown(Warning::UnplacedOrphanFree { addr: 0x400 }),
        "the orphan free at 0x400 lies in no segment known at the start"
    );
    // A recording that shows no later release: 2.11, said as a default, not as a fact.
    let plain = ModelledVersion::of_trace(&Trace::default());
    assert_eq!(
        shown(Warning::ModelledVersion { modelled: plain }),
        "modelled PyTorch 2.11: nothing in the recording shows a later release (absence \
             proves nothing; --pytorch-version X.Y models another)"
    );
    let mut newest = Trace::default();
    newest.extras.internal_metadata = 1;
    let modelled = ModelledVersion::of_trace(&newest);
    assert_eq!(
        shown(Warning::ModelledVersion { modelled }),
        "modelled PyTorch 2.15 (trace entries carry internal_metadata)"
    );
}
