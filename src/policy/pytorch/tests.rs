//! Unit tests of the PyTorch policy: each rule of docs/pytorch-model.md pinned with numbers derived
//! from PyTorch's source and the worked examples in docs/pytorch-model.md#worked-examples, not
//! from this code's output.

use super::*;
use crate::backend::{BackendCall, Recording, SimDevice};
use crate::testing::{run_checked, workload};
use crate::units::{GIB, MIB};

fn policy(conf: &str) -> PyTorch {
    PyTorch::new(Config::parse(conf, Version::CURRENT).unwrap())
}

fn device(capacity: Option<u64>) -> Recording<SimDevice> {
    Recording::new(SimDevice::new(capacity))
}

fn malloc(p: &mut PyTorch, d: &mut Recording<SimDevice>, size: u64) -> Allocation {
    let a = p.malloc(d, size, 0).unwrap().expect("allocation succeeds");
    p.check().unwrap();
    a
}

fn free(p: &mut PyTorch, d: &mut Recording<SimDevice>, a: Allocation) {
    p.free(d, a.addr).unwrap();
    p.check().unwrap();
}

/// The segment sizes the policy asked the device for, in order (failed ones included).
fn segment_allocs(d: &Recording<SimDevice>) -> Vec<u64> {
    d.calls()
        .iter()
        .filter_map(|c| match c {
            BackendCall::SegmentAlloc { size, .. } => Some(*size),
            _ => None,
        })
        .collect()
}

#[test]
fn segment_sizes_follow_get_allocation_size() {
    let mut p = policy("");
    let mut d = device(None);
    let small = malloc(&mut p, &mut d, MIB);
    assert_eq!(segment_allocs(&d), vec![2 * MIB], "exactly 1 MiB is small: a 2 MiB segment");
    // Each request on its own stream, so none fits into an earlier segment.
    p.malloc(&mut d, MIB + 1, 1).unwrap().unwrap();
    p.malloc(&mut d, 10 * MIB, 2).unwrap().unwrap();
    let whole = p.malloc(&mut d, 19 * MIB + MIB / 2, 3).unwrap().unwrap();
    assert_eq!(segment_allocs(&d), vec![2 * MIB, 20 * MIB, 10 * MIB, 20 * MIB]);
    assert_eq!(small.block_size, MIB);
    assert_eq!(whole.block_size, 20 * MIB, "0.5 MiB remainder is not split off");
    assert_eq!(p.reserved(), 52 * MIB);
}

#[test]
fn small_pool_splits_at_512_bytes_and_large_pool_only_above_1_mib() {
    let mut p = policy("");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 1000);
    let b = malloc(&mut p, &mut d, 1000);
    assert_eq!((a.block_size, b.addr), (1024, a.addr + 1024));
    let c = malloc(&mut p, &mut d, 5 * MIB);
    assert_eq!(c.block_size, 5 * MIB, "20 MiB segment split: 15 MiB remain");
    // 15 MiB free; a 14 MiB request leaves exactly 1 MiB, which is not > 1 MiB: no split.
    let e = malloc(&mut p, &mut d, 14 * MIB);
    assert_eq!((e.addr, e.block_size), (c.addr + 5 * MIB, 15 * MIB));
    assert_eq!(segment_allocs(&d), vec![2 * MIB, 20 * MIB]);
    free(&mut p, &mut d, e);
    let f = malloc(&mut p, &mut d, 14 * MIB - 512);
    assert_eq!(f.block_size, 14 * MIB - 512, "1 MiB + 512 remains: split");
}

#[test]
fn best_fit_then_lowest_address_then_merge_on_free() {
    let mut p = policy("");
    let mut d = device(None);
    // Carve a 20 MiB segment into 4, 2, 4, 2, 4 MiB blocks and free the 4 MiB ones.
    let blocks: Vec<Allocation> =
        [4, 2, 4, 2, 4].iter().map(|&m| malloc(&mut p, &mut d, m * MIB)).collect();
    let base = blocks[0].addr;
    for i in [4, 2, 0] {
        free(&mut p, &mut d, blocks[i]);
    }
    // Free: [0,4) [6,10) [12,20) (the last merged with the 4 MiB tail). Best fit for 3.5 MiB is
    // a 4 MiB block, and of the two the lowest address.
    let x = malloc(&mut p, &mut d, 3 * MIB + MIB / 2);
    assert_eq!(x.addr, base, "equal sizes: lowest address");
    assert_eq!(x.block_size, 4 * MIB, "0.5 MiB remainder not split");
    let y = malloc(&mut p, &mut d, 5 * MIB);
    assert_eq!(y.addr, base + 12 * MIB, "best fit, not first fit");
    free(&mut p, &mut d, blocks[1]);
    // [4,6) merges with its free neighbour [6,10) into one 6 MiB block.
    let z = malloc(&mut p, &mut d, 6 * MIB);
    assert_eq!((z.addr, z.block_size), (base + 4 * MIB, 6 * MIB));
    assert_eq!(segment_allocs(&d), vec![20 * MIB]);
}

#[test]
fn streams_never_share_free_blocks() {
    let mut p = policy("");
    let mut d = device(None);
    let a = p.malloc(&mut d, 4 * MIB, 7).unwrap().unwrap();
    p.free(&mut d, a.addr).unwrap();
    let b = p.malloc(&mut d, 4 * MIB, 9).unwrap().unwrap();
    assert_ne!(a.addr, b.addr);
    assert_eq!(segment_allocs(&d), vec![20 * MIB, 20 * MIB]);
    let c = p.malloc(&mut d, 4 * MIB, 7).unwrap().unwrap();
    assert_eq!(c.addr, a.addr);
}

#[test]
fn m1_oversize_reuse_and_boundaries() {
    let mut p = policy("max_split_size_mb:64");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 100 * MIB);
    assert_eq!(segment_allocs(&d), vec![100 * MIB]);
    assert_eq!((p.stats.oversize_segments, p.stats.oversize_allocations), (1, 1));
    free(&mut p, &mut d, a);
    let a2 = malloc(&mut p, &mut d, 85 * MIB);
    assert_eq!((a2.addr, a2.block_size), (a.addr, 100 * MIB), "100 < 85 + 20: taken whole");
    assert_eq!(p.allocated(), 100 * MIB);
    assert_eq!(p.stats.requested_bytes, 85 * MIB);
    free(&mut p, &mut d, a2);
    let b = malloc(&mut p, &mut d, 80 * MIB);
    assert_ne!(b.addr, a.addr, "100 >= 80 + 20: rejected");
    assert_eq!(segment_allocs(&d), vec![100 * MIB, 80 * MIB]);
    free(&mut p, &mut d, b);
    let c = malloc(&mut p, &mut d, 30 * MIB);
    assert_eq!(segment_allocs(&d), vec![100 * MIB, 80 * MIB, 30 * MIB], "80 is oversize for 30");
    assert_eq!(c.block_size, 30 * MIB);
    let e = malloc(&mut p, &mut d, 63 * MIB + 1);
    assert_eq!(segment_allocs(&d).last(), Some(&(64 * MIB)));
    assert_eq!(e.block_size, 64 * MIB, "remaining 1 MiB - 512 is not split");
    assert_eq!(p.stats.oversize_segments, 3, "100, 80, 64");
    assert_eq!(p.stats.oversize_allocations, 1, "the 64 MiB block counts although 63 MiB < 64");
}

#[test]
fn m2_max_split_20_makes_free_20_mib_segments_unusable() {
    let mut p = policy("max_split_size_mb:20");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 5 * MIB);
    assert_eq!(p.stats.oversize_segments, 1);
    let b = malloc(&mut p, &mut d, 12 * MIB);
    assert_eq!(b.addr, a.addr + 5 * MIB, "the 15 MiB remainder is < 20: usable, split");
    assert_eq!(b.block_size, 12 * MIB);
    free(&mut p, &mut d, a);
    free(&mut p, &mut d, b);
    let c = malloc(&mut p, &mut d, 5 * MIB);
    assert_ne!(c.addr, a.addr, "the whole 20 MiB S1 is oversize now");
    assert_eq!(segment_allocs(&d), vec![20 * MIB, 20 * MIB]);
    let e = malloc(&mut p, &mut d, 20 * MIB);
    assert_eq!((e.addr, e.block_size), (a.addr, 20 * MIB), "S1 taken whole");
    assert_eq!(p.stats.oversize_allocations, 1);
}

/// Whole free segments of 30, 70, 100 and 150 MiB on stream 0
/// (docs/pytorch-model.md#example-release-available).
fn m3_setup(capacity: u64) -> (PyTorch, Recording<SimDevice>, Vec<u64>) {
    let mut p = policy("max_split_size_mb:64");
    let mut d = device(Some(capacity));
    let a: Vec<Allocation> =
        [30, 70, 100, 150].iter().map(|&m| malloc(&mut p, &mut d, m * MIB)).collect();
    for &x in &a {
        free(&mut p, &mut d, x);
    }
    d.observer.clear();
    (p, d, a.iter().map(|x| x.addr).collect())
}

#[test]
fn m3_release_available_cached_blocks_order_and_result() {
    use BackendCall::*;
    let fail = |size| SegmentAlloc { size, addr: None };
    // 120 MiB: 150 rejected (150 >= 140); cudaMalloc fails; release 150 only; no retry counted.
    let (mut p, mut d, s) = m3_setup(400 * MIB);
    malloc(&mut p, &mut d, 120 * MIB);
    assert_eq!(&d.calls()[..2], &[fail(120 * MIB), SegmentFree { addr: s[3], size: 150 * MIB }]);
    assert!(matches!(d.calls()[2], SegmentAlloc { size, addr: Some(_) } if size == 120 * MIB));
    assert_eq!(p.alloc_retries(), 0);
    // 200 MiB: walk back from the end: 150, then 100 (250 >= 200); 70 and 30 stay.
    let (mut p, mut d, s) = m3_setup(400 * MIB);
    malloc(&mut p, &mut d, 200 * MIB);
    assert_eq!(
        &d.calls()[..3],
        &[
            fail(200 * MIB),
            SegmentFree { addr: s[3], size: 150 * MIB },
            SegmentFree { addr: s[2], size: 100 * MIB }
        ]
    );
    assert_eq!(d.calls().len(), 4);
    assert_eq!(p.reserved(), 300 * MIB);
    // 400 MiB: 150, 100, 70 released (320 < 400: false); then the full flush frees 30; retry.
    let (mut p, mut d, s) = m3_setup(400 * MIB);
    malloc(&mut p, &mut d, 400 * MIB);
    let frees: Vec<u64> = d
        .calls()
        .iter()
        .filter_map(|c| match c {
            SegmentFree { addr, .. } => Some(*addr),
            _ => None,
        })
        .collect();
    assert_eq!(frees, vec![s[3], s[2], s[1], s[0]]);
    assert_eq!(segment_allocs(&d), vec![400 * MIB, 400 * MIB], "a failed try, then the retry");
    assert_eq!(p.alloc_retries(), 1);
    // 50 MiB: 70 is rejected (50 < 64 <= 70); key is max(50, 64) = 64: release 70, not 30.
    let (mut p, mut d, s) = m3_setup(390 * MIB);
    malloc(&mut p, &mut d, 50 * MIB);
    assert_eq!(&d.calls()[..2], &[fail(50 * MIB), SegmentFree { addr: s[1], size: 70 * MIB }]);
    assert_eq!(p.alloc_retries(), 0);
}

#[test]
fn m3_blocks_of_other_streams_are_never_released() {
    let mut p = policy("max_split_size_mb:64");
    let mut d = device(Some(200 * MIB));
    let a = p.malloc(&mut d, 150 * MIB, 5).unwrap().unwrap();
    p.free(&mut d, a.addr).unwrap();
    d.observer.clear();
    assert!(!p.release_available_cached_blocks(&mut d, 0, 100 * MIB, false).unwrap());
    assert!(d.calls().is_empty());
}

#[test]
fn m4_tolerance_and_rounding_together() {
    let reuse = |conf: &str, cached: u64, request: u64| {
        let mut p = policy(&format!("max_split_size_mb:64{conf}"));
        let mut d = device(None);
        // The cached block is installed directly: with divisions, no request rounds to 80 MiB.
        let a = d.segment_alloc(cached).unwrap().unwrap();
        p.install_segment(a, cached, 0, false, None, &[(a, cached, None)]).unwrap();
        let b = malloc(&mut p, &mut d, request);
        (b.addr == a, b.block_size, segment_allocs(&d))
    };
    assert_eq!(reuse("", 100 * MIB, 70 * MIB), (false, 70 * MIB, vec![100 * MIB, 70 * MIB]));
    assert!(reuse(",max_non_split_rounding_mb:40", 100 * MIB, 70 * MIB).0);
    assert_eq!(reuse(",max_non_split_rounding_mb:40", 100 * MIB, 70 * MIB).1, 100 * MIB);
    assert!(reuse(",roundup_power2_divisions:2", 80 * MIB, 60 * MIB).0);
    let (hit, block, segs) = reuse(",roundup_power2_divisions:2", 84 * MIB, 60 * MIB);
    assert!(!hit);
    assert_eq!((block, segs), (64 * MIB, vec![84 * MIB, 64 * MIB]), "rounded to 64, unsplit");
}

#[test]
fn fallback_order_flushes_then_retries() {
    use BackendCall::*;
    let mut p = policy("");
    let mut d = device(Some(40 * MIB));
    let a = malloc(&mut p, &mut d, 15 * MIB);
    free(&mut p, &mut d, a);
    d.observer.clear();
    let b = malloc(&mut p, &mut d, 30 * MIB);
    assert_eq!(d.calls()[0], SegmentAlloc { size: 30 * MIB, addr: None });
    assert_eq!(d.calls()[1], SegmentFree { addr: a.addr, size: 16 * MIB });
    assert_eq!(d.calls()[2], SegmentAlloc { size: 30 * MIB, addr: Some(b.addr) });
    assert_eq!(p.alloc_retries(), 1);
    // Still too big after the flush: an OOM, with the flush kept.
    assert!(p.malloc(&mut d, 30 * MIB, 0).unwrap().is_none());
    assert_eq!(p.stats.num_ooms, 1);
    assert_eq!(p.alloc_retries(), 2);
}

#[test]
fn flush_returns_only_whole_free_segments() {
    let mut p = policy("");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 4 * MIB);
    let b = malloc(&mut p, &mut d, 4 * MIB);
    let c = malloc(&mut p, &mut d, 30 * MIB);
    free(&mut p, &mut d, a);
    free(&mut p, &mut d, c);
    p.empty_cache(&mut d).unwrap();
    assert_eq!(p.reserved(), 20 * MIB, "the split 20 MiB segment stays; 30 MiB goes");
    free(&mut p, &mut d, b);
    p.empty_cache(&mut d).unwrap();
    assert_eq!(p.reserved(), 0);
}

/// Builds the GC example's setup (docs/pytorch-model.md#example-gc): D 1, A 2, B 3, C 4 GiB whole
/// free segments with ages 0, 10, 2, 6 after the malloc's own tick, and an allocated filler so that
/// total_allocated is `total`.
fn gc_setup(total: u64) -> (PyTorch, Recording<SimDevice>, [u64; 4]) {
    let mut c = Config::parse(
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
        Version::CURRENT,
    )
    .unwrap();
    c.gpu_memory = 80 * GIB;
    let mut p = PyTorch::new(c);
    let mut d = device(None);
    let filler = total - 10 * GIB;
    let f = d.segment_alloc(filler).unwrap().unwrap();
    p.install_segment(f, filler, 0, false, None, &[(f, filler, Some(filler))]).unwrap();
    let mut addrs = [0; 4];
    let clock = 100u64;
    for (i, (gib, age)) in [(1, 0), (2, 10), (3, 2), (4, 6)].into_iter().enumerate() {
        let size = gib * GIB;
        let a = d.segment_alloc(size).unwrap().unwrap();
        p.install_segment(a, size, 0, false, None, &[(a, size, None)]).unwrap();
        let id = p.pools[0].blocks.get(0, size, a).unwrap();
        p.bm(id).gc_base = clock - age;
        addrs[i] = a;
    }
    p.pools[0].gc_count = clock - 1; // the malloc's get_free_block ticks it to `clock`
    d.observer.clear();
    (p, d, addrs)
}

#[test]
fn gc_frees_old_whole_segments_before_cudamalloc() {
    use BackendCall::*;
    let (mut p, mut d, [_d, a, _b, c]) = gc_setup(30 * GIB);
    malloc(&mut p, &mut d, 5 * GIB);
    assert_eq!(d.calls()[0], SegmentFree { addr: a, size: 2 * GIB });
    assert_eq!(d.calls()[1], SegmentFree { addr: c, size: 4 * GIB });
    assert!(matches!(d.calls()[2], SegmentAlloc { size, addr: Some(_) } if size == 5 * GIB));
    assert_eq!(d.calls().len(), 3);

    let (mut p, mut d, [_d, a, b, c]) = gc_setup(31 * GIB);
    malloc(&mut p, &mut d, 5 * GIB);
    let frees: Vec<u64> = d
        .calls()
        .iter()
        .filter_map(|x| match x {
            SegmentFree { addr, .. } => Some(*addr),
            _ => None,
        })
        .collect();
    assert_eq!(frees, vec![a, c, b], "second pass: avg 1.0 keeps D (age 0), frees B (age 2)");
}

#[test]
fn gc_needs_a_memory_fraction() {
    let p = policy("garbage_collection_threshold:0.6");
    assert!(!p.gc_enabled());
}

#[test]
fn expandable_maps_whole_pages_and_reuses_holes() {
    use BackendCall::*;
    let mut p = policy("expandable_segments:True");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 21 * MIB);
    let Reserve { size: va, addr: Some(base) } = d.calls()[0] else { panic!("{:?}", d.calls()) };
    assert_eq!(va, (80 * GIB + 10 * GIB).div_ceil(20 * MIB) * 20 * MIB, "9/8 of 80 GiB");
    assert_eq!(d.calls()[1], Map { addr: base, size: 40 * MIB, ok: true }, "21 MiB maps 40 MiB");
    assert_eq!((a.addr, a.block_size), (base, 21 * MIB), "512-byte splitting");
    assert_eq!(p.reserved(), 40 * MIB);
    free(&mut p, &mut d, a);
    let b = malloc(&mut p, &mut d, 30 * MIB);
    assert_eq!(b.addr, base, "the mapped free block is reused: nothing mapped");
    assert_eq!(d.calls().len(), 2);
    let c = malloc(&mut p, &mut d, 50 * MIB);
    assert_eq!(c.addr, base + 30 * MIB, "the free 10 MiB before the hole counts");
    assert_eq!(d.calls()[2], Map { addr: base + 40 * MIB, size: 40 * MIB, ok: true });
    assert_eq!(p.reserved(), 80 * MIB);
    // Free [0, 30 MiB): a flush unmaps only the whole page inside it, [0, 20 MiB).
    free(&mut p, &mut d, b);
    p.empty_cache(&mut d).unwrap();
    p.check().unwrap();
    assert_eq!(d.calls()[3], Unmap { addr: base, size: 20 * MIB });
    assert_eq!(p.reserved(), 60 * MIB);
    // The lowest hole is at the base again: a 10 MiB request fits the mapped [20, 30) first.
    let e = malloc(&mut p, &mut d, 10 * MIB);
    assert_eq!(e.addr, base + 20 * MIB);
    let f = malloc(&mut p, &mut d, 4 * MIB);
    assert_eq!(f.addr, base, "the hole at the base is mapped again");
    assert_eq!(d.calls()[4], Map { addr: base, size: 20 * MIB, ok: true });
    for x in [c, e, f] {
        free(&mut p, &mut d, x);
    }
    p.empty_cache(&mut d).unwrap();
    assert_eq!(p.reserved(), 0);
    assert_eq!(d.calls().last(), Some(&Release { addr: base, size: va }), "VA released when empty");
}

#[test]
fn expandable_small_pool_uses_2_mib_pages() {
    let mut p = policy("expandable_segments:True");
    let mut d = device(None);
    malloc(&mut p, &mut d, 3000);
    assert!(matches!(d.calls()[1], BackendCall::Map { size, .. } if size == 2 * MIB));
}

#[test]
fn segments_and_recorded_settings() {
    let mut p = policy("");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 4 * MIB);
    let segs = p.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].total_size, 20 * MIB);
    assert_eq!(segs[0].blocks.len(), 2);
    assert_eq!(segs[0].blocks[0].address, a.addr);
    assert_eq!(segs[0].blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(segs[0].blocks[1].state, BlockState::Inactive);
    assert_eq!(p.config(), "expandable_segments:False");
}

#[test]
fn property_checker_holds_for_every_configuration() {
    for conf in
        ["", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"]
    {
        for seed in 0..12 {
            let mut p = policy(conf);
            let c = run_checked(&mut p, &workload(seed, 1500), None);
            assert!(c.peak_reserved >= c.peak_requested, "{conf} seed {seed}");
        }
        // Under a capacity, fallbacks and OOMs must keep every property.
        for seed in 0..4 {
            let mut p = policy(conf);
            run_checked(&mut p, &workload(seed, 1500), Some(96 * MIB));
        }
    }
}

#[test]
fn flush_walks_streams_in_raw_value_order_not_first_sight() {
    let mut p = policy("");
    let mut d = device(None);
    let a = p.malloc(&mut d, 30 * MIB, 0x500).unwrap().unwrap();
    let b = p.malloc(&mut d, 40 * MIB, 0x300).unwrap().unwrap();
    p.free(&mut d, a.addr).unwrap();
    p.free(&mut d, b.addr).unwrap();
    d.observer.clear();
    p.empty_cache(&mut d).unwrap();
    assert_eq!(
        d.calls(),
        vec![
            BackendCall::SegmentFree { addr: b.addr, size: 40 * MIB },
            BackendCall::SegmentFree { addr: a.addr, size: 30 * MIB }
        ],
        "stream 0x300 sorts before 0x500"
    );
}

#[test]
fn frees_find_blocks_by_handle_or_by_address_alike() {
    let mut p = policy("");
    let mut d = device(None);
    let [a, b, c] = [2, 3, 4].map(|k| malloc(&mut p, &mut d, k * MIB));
    assert!([a, b, c].iter().all(|x| x.handle.index().is_some()), "blocks carry handles");
    p.free_handle(&mut d, a.addr, a.handle).unwrap();
    p.check().unwrap();
    // The first free by address alone finds a block allocated before it, handle frees between.
    free(&mut p, &mut d, b);
    // Allocated after the address index exists, freed by handle: the index forgets it too.
    let e = malloc(&mut p, &mut d, 5 * MIB);
    p.free_handle(&mut d, e.addr, e.handle).unwrap();
    p.check().unwrap();
    // A handle that names another block (here: a freed one's) is not trusted: the address is.
    p.free_handle(&mut d, c.addr, a.handle).unwrap();
    p.check().unwrap();
    assert_eq!(p.allocated(), 0);
    // What is not allocated is an error either way, and changes nothing.
    assert!(p.free_handle(&mut d, c.addr, c.handle).is_err());
    assert!(p.free(&mut d, c.addr).is_err());
    p.check().unwrap();
    // The same addresses come back as before: best fit in one 20 MiB segment.
    let again = malloc(&mut p, &mut d, 2 * MIB);
    assert_eq!(again.addr, a.addr);
    assert_eq!(segment_allocs(&d), vec![20 * MIB]);
}

/// New memory and splitting (docs/pytorch-model.md#new-segment and
/// docs/pytorch-model.md#split-rule) under expandable segments, for private pools: a CUDA graph's
/// pool maps pages of its own reservation (PyTorch ≈ 2.5+), before 2.5 it got a cudaMalloc segment,
/// and a MemPool with an allocator of its own gets a segment from it today, whose blocks split as
/// cudaMalloc blocks do (`is_expandable_segments_active` is false for it). A 19.5 MiB request
/// rounds to 19.5 MiB (≥ 10 MiB: 512-byte rounding) and its segment to 20 MiB (2 MiB multiples):
/// the 0.5 MiB rest is split off under the expandable rule (≥ 512 bytes), not under the cudaMalloc
/// rule (> 1 MiB).
#[test]
fn private_pools_under_expandable_segments_get_memory_by_version_and_allocator() {
    let request = 19 * MIB + MIB / 2;
    let run = |version: Version, own_allocator: bool| {
        let mut config = Config::parse("expandable_segments:True", version).unwrap();
        if own_allocator {
            config.own_allocator_pools = vec![(2, 9)];
        }
        let mut p = PyTorch::new(config);
        let mut d = device(None);
        p.allocate_into(Some((2, 9))).unwrap();
        let a = malloc(&mut p, &mut d, request);
        let mapped = d.calls().iter().any(|c| matches!(c, BackendCall::Map { ok: true, .. }));
        (mapped, segment_allocs(&d), a.block_size)
    };
    let old = Version { major: 2, minor: 4 };
    assert_eq!(run(Version::CURRENT, false), (true, vec![], request), "pages of its own");
    assert_eq!(run(old, false), (false, vec![20 * MIB], request), "cudaMalloc, split finely");
    assert_eq!(run(Version::CURRENT, true), (false, vec![20 * MIB], 20 * MIB), "not split");
    // The default pools map pages whatever the private pools do.
    let mut p = policy("expandable_segments:True");
    let mut d = device(None);
    malloc(&mut p, &mut d, request);
    assert!(segment_allocs(&d).is_empty());
}

#[test]
fn requests_round_as_the_configuration_says_with_or_without_divisions() {
    // The policy skips the interval look-up when no interval has divisions: it must round every
    // request as `Config::round_size` does, at the 512-byte and power-of-two edges.
    let sizes = [0, 1, 511, 512, 513, 1 << 20, (1 << 20) + 1, 3 << 20, (5 << 20) + 7, 1 << 34];
    for conf in [
        "",
        "roundup_power2_divisions:1",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:2,>:8]",
    ] {
        let p = policy(conf);
        for &size in &sizes {
            assert_eq!(p.round_size(size), p.config.round_size(size), "{conf}: {size}");
        }
    }
    assert_eq!(policy("").round_size(513), 1024);
    assert_eq!(policy("roundup_power2_divisions:4").round_size((5 << 20) + 7), 6 << 20);
}

/// A malloc's search of the cache (`get_free_block`, a fast path for the block it finds first)
/// takes the block that the what-if query (`find_free_block`, which `validate` and the replay's
/// undecided flushes ask through `would_hit_cache`) names, or none when it names none.
#[test]
fn the_mallocs_search_takes_the_block_the_query_names() {
    use crate::testing::Rng;
    for conf in [
        "",
        "max_split_size_mb:20",
        "expandable_segments:True",
        "expandable_segments:True,max_split_size_mb:20",
    ] {
        for seed in 0..4 {
            let mut rng = Rng::new(seed);
            let (mut p, mut d) = (policy(conf), device(None));
            let (mut live, mut hits) = (Vec::new(), 0);
            for step in 0..3000 {
                if !live.is_empty() && rng.below(2) == 0 {
                    let a: Allocation = live.swap_remove(rng.below(live.len() as u64) as usize);
                    p.free_handle(&mut d, a.addr, a.handle).unwrap();
                    continue;
                }
                let size = match rng.below(3) {
                    0 => 1 + rng.below(1 << 20),
                    1 => 1 + rng.below(32 << 20),
                    _ => 512 * (1 + rng.below(8)),
                };
                let stream = rng.below(2);
                let rounded = p.config.round_size(size);
                let small = rounded <= SMALL_SIZE;
                let named = p.find_free_block(stream, rounded, small);
                let taken = p.get_free_block(stream, rounded, small).map(|(id, size)| {
                    assert_eq!(size, p.b(id).size, "the size the search returns is the block's");
                    id
                });
                assert_eq!(taken, named, "{conf:?} seed {seed} step {step}: {size} B");
                if let Some(id) = taken {
                    p.insert_free(id); // put back: the malloc below takes it again
                    hits += 1;
                }
                p.check().unwrap();
                live.push(p.malloc(&mut d, size, stream).unwrap().expect("no capacity limit"));
            }
            assert!(hits > 100, "{conf:?} seed {seed}: only {hits} cache hits");
        }
    }
}

#[test]
fn default_rules_are_exactly_the_default_settings() {
    assert!(policy("").has_default_rules());
    // A GC threshold without a memory fraction leaves GC off in PyTorch, so it changes nothing.
    assert!(policy("garbage_collection_threshold:0.6").has_default_rules());
    for conf in [
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:4,>:1]",
        "expandable_segments:True",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
    ] {
        assert!(!policy(conf).has_default_rules(), "{conf}");
        assert!(policy(conf).with_default_rules().is_err(), "{conf}");
    }
    let mut kineto = policy("");
    kineto.exact_blocks = true; // what `reading_kineto` sets on a Kineto trace
    assert!(!kineto.has_default_rules());
}

/// Runs `steps` through `p`, half the frees by handle and half by address alone: every
/// allocation (address, block size, or none), then the backend's calls.
fn decisions<const D: bool>(
    p: &mut PyTorch<D>,
    steps: &[crate::testing::Step],
    capacity: Option<u64>,
) -> (Vec<Option<(u64, u64)>>, Vec<BackendCall>) {
    use crate::testing::Step;
    let mut d = device(capacity);
    let mut live: Vec<Option<Allocation>> = Vec::new();
    let mut placed = Vec::new();
    for step in steps {
        match *step {
            Step::Alloc { id, size, stream } => {
                let a = p.malloc(&mut d, size, stream).unwrap();
                placed.push(a.map(|a| (a.addr, a.block_size)));
                live.resize(live.len().max(id + 1), None);
                live[id] = a;
            }
            Step::Free { id } => {
                if let Some(a) = live.get_mut(id).and_then(Option::take) {
                    match id % 2 {
                        0 => p.free_handle(&mut d, a.addr, a.handle).unwrap(),
                        _ => p.free(&mut d, a.addr).unwrap(),
                    }
                }
            }
            Step::EmptyCache => p.empty_cache(&mut d).unwrap(),
        }
        p.check().unwrap();
    }
    (placed, d.calls().to_vec())
}

#[test]
fn the_default_rules_form_decides_as_the_general_form() {
    for seed in 0..6 {
        let steps = workload(seed, 3000);
        for capacity in [None, Some(96 * MIB)] {
            let mut general = policy("");
            let mut folded = policy("").with_default_rules().expect("the default settings");
            let want = decisions(&mut general, &steps, capacity);
            assert_eq!(decisions(&mut folded, &steps, capacity), want, "seed {seed}");
            assert!(want.0.iter().filter(|a| a.is_some()).count() > 1000, "seed {seed}");
            if capacity.is_some() {
                assert!(want.0.contains(&None), "seed {seed}: the capacity is never reached");
            }
        }
    }
}

#[test]
fn the_default_rules_form_frees_by_address_without_a_map_of_blocks() {
    let mut p = policy("").with_default_rules().expect("the default settings");
    let mut d = device(None);
    let a = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
    let b = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
    assert!(p.active.is_none());
    // An address inside a block, or of a block already freed, names no allocated block.
    assert!(p.free(&mut d, a.addr + 512).is_err());
    p.free(&mut d, a.addr).unwrap();
    assert!(p.free(&mut d, a.addr).is_err());
    assert!(p.active.is_none(), "no map is built for a free by address");
    p.free_handle(&mut d, b.addr, b.handle).unwrap();
    assert_eq!(p.allocated(), 0);
    p.check().unwrap();
    // Back in the general form, the map of allocated blocks is built from the blocks again.
    let mut general: PyTorch = p.retyped();
    let c = general.malloc(&mut d, MIB, 0).unwrap().unwrap();
    general.free(&mut d, c.addr).unwrap();
    assert!(general.active.is_some());
    general.check().unwrap();
}

fn npu(conf: &str) -> PyTorch {
    PyTorch::new(Config::parse_npu(conf).unwrap())
}

#[test]
fn npu_pads_every_request_by_32_bytes_before_rounding() {
    // Seen in real torch_npu snapshots: a 16,384 B request occupies 16,896 B, 37,632 B
    // occupies 37,888 B (request + 32, up to a multiple of 512).
    let npu_rules = Config::npu();
    let cuda = Config::default();
    for (request, npu_block, cuda_block) in [
        (16_384, 16_896, 16_384),
        (37_632, 37_888, 37_888),
        (1, 512, 512),
        (480, 512, 512),
        (481, 1024, 512),
        (512, 1024, 512),
        (MIB - 32, MIB, MIB),
        (MIB - 31, MIB + 512, MIB),
    ] {
        assert_eq!(npu_rules.round_size(request), npu_block, "npu {request}");
        assert_eq!(cuda.round_size(request), cuda_block, "cuda {request}");
    }
    let mut p = npu("");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 16_384);
    let b = malloc(&mut p, &mut d, 37_632);
    assert_eq!((a.block_size, b.block_size), (16_896, 37_888));
    assert_eq!(b.addr, a.addr + 16_896, "blocks tile the 2 MiB small segment");
    // 1 MiB − 32 rounds to exactly 1 MiB (small pool, the same segment); 1 MiB itself goes to
    // the large pool.
    malloc(&mut p, &mut d, MIB - 32);
    malloc(&mut p, &mut d, MIB);
    assert_eq!(segment_allocs(&d), vec![2 * MIB, 20 * MIB]);
    // Divisions are chosen by the padded size: 2 MiB − 16 pads past 2 MiB, into the next interval.
    let c = Config::parse_npu("roundup_power2_divisions:4").unwrap();
    assert_eq!(c.round_size(2 * MIB - 16), 2 * MIB + 512 * 1024);
    assert_eq!(c.round_size(MIB + 100), MIB + 256 * 1024);
}

#[test]
fn npu_segments_and_oversize_tolerance_keep_the_fixed_20_mib() {
    let mut p = npu("max_split_size_mb:64");
    let mut d = device(None);
    malloc(&mut p, &mut d, 5 * MIB);
    p.malloc(&mut d, 11 * MIB, 1).unwrap().unwrap();
    assert_eq!(segment_allocs(&d), vec![20 * MIB, 12 * MIB]);
    assert_eq!(p.settings().tolerance(), 20 * MIB);
    assert_eq!(
        p.config(),
        "expandable_segments:False,base_addr_aligned_kb:16,max_split_size_mb:64"
    );
}

#[test]
fn npu_aligns_large_blocks_to_16_kib_with_expandable_segments() {
    use BackendCall::*;
    let mut p = npu("expandable_segments:True");
    let mut d = device(None);
    let a = malloc(&mut p, &mut d, 3 * MIB);
    let Reserve { size: va, addr: Some(base) } = d.calls()[0] else { panic!("{:?}", d.calls()) };
    assert_eq!(va, (64 * GIB + 8 * GIB).div_ceil(20 * MIB) * 20 * MIB, "9/8 of 64 GiB");
    assert_eq!(base % (16 << 10), 0);
    // 3 MiB + 32 rounds to 3 MiB + 512: the next block starts 512 bytes past a 16 KiB line.
    assert_eq!((a.addr, a.block_size), (base, 3 * MIB + 512));
    let b = malloc(&mut p, &mut d, 2 * MIB);
    let aligned = base + 3 * MIB + (16 << 10);
    assert_eq!(b.addr, aligned, "moved up to the next 16 KiB line");
    assert_eq!(b.block_size, 2 * MIB + 512);
    // The 15.5 KiB in front stays cached, a free block of its own; the 1 MiB+ request below
    // does not fit it, so it goes after `b`.
    let gap = p.block_containing(base + 3 * MIB + 512).unwrap();
    assert_eq!(gap, (base + 3 * MIB + 512, (16 << 10) - 512, false));
    // Below 2 MiB nothing is aligned.
    let c = malloc(&mut p, &mut d, MIB + 100);
    assert_eq!(c.addr, aligned + 2 * MIB + 512);
    // Freeing `b` merges the gap back.
    free(&mut p, &mut d, b);
    assert_eq!(p.block_containing(base + 3 * MIB + 512).unwrap().1, (16 << 10) + 2 * MIB);
    // Off with base_addr_aligned_kb:0, and without expandable segments.
    for conf in ["expandable_segments:True,base_addr_aligned_kb:0", ""] {
        let mut p = npu(conf);
        let mut d = device(None);
        let a = malloc(&mut p, &mut d, 3 * MIB);
        let b = malloc(&mut p, &mut d, 2 * MIB);
        assert_eq!(b.addr, a.addr + 3 * MIB + 512, "{conf}");
    }
}

#[test]
fn npu_expandable_pages_follow_segment_size_mb_and_page_size() {
    use BackendCall::*;
    let mut p = npu("expandable_segments:True,segment_size_mb:64");
    let mut d = device(None);
    malloc(&mut p, &mut d, 21 * MIB);
    assert!(matches!(d.calls()[1], Map { size, .. } if size == 64 * MIB), "{:?}", d.calls());
    let mut p = npu("page_size:1g");
    let mut d = device(None);
    malloc(&mut p, &mut d, 3 * MIB);
    malloc(&mut p, &mut d, 3000);
    assert_eq!(segment_allocs(&d), vec![GIB, 2 * MIB], "1 GiB pages for the large pool only");
}

#[test]
fn npu_alloc_conf_is_parsed_by_torch_npu_rules() {
    let err = |s: &str| Config::parse_npu(s).unwrap_err().to_string();
    assert!(err("max_split_size_mb:20").contains("must be > 20"));
    assert!(Config::parse_npu("max_split_size_mb:21").is_ok());
    assert!(err("max_split_size_mb:-1").contains("invalid"));
    assert!(err("segment_size_mb:10").contains("[20, 512]"));
    assert!(err("base_addr_aligned_kb:17").contains("[0~16]"));
    assert!(err("page_size:2m").contains("Unsupported page_size"));
    assert!(err("large_segment_size_mb:40").contains("Unrecognized CachingAllocator option"));
    assert!(err("expandable_segments:True,max_split_size_mb:64").contains("cannot be enabled"));
    assert!(err("expandable_segments:True,garbage_collection_threshold:0.5")
        .contains("cannot be enabled"));
    assert!(err("max_split_size_mb,64").contains("expected ':'"), "torch_npu checks separators");
    let c = Config::parse_npu(
        "expandable_segments:True,base_addr_aligned_kb:4,segment_size_mb:40,pinned_mem_register:False",
    )
    .unwrap();
    assert_eq!((c.base_addr_aligned, c.npu_segment_size), (4096, 40 * MIB));
    assert_eq!(c.page_size(false), 40 * MIB);
    assert_eq!(c.allocation_size(5 * MIB), 20 * MIB, "segment_size_mb changes pages only");
    for conf in [
        "",
        "expandable_segments:True,base_addr_aligned_kb:4,segment_size_mb:40",
        "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8]",
        "page_size:1g,garbage_collection_threshold:0.5",
    ] {
        let c = Config::parse_npu(conf).unwrap();
        assert_eq!(Config::parse_npu(&c.to_conf_string()).unwrap(), c, "{conf}");
    }
}

#[test]
fn npu_property_checker_holds() {
    for conf in
        ["", "expandable_segments:True", "max_split_size_mb:64", "roundup_power2_divisions:4"]
    {
        for seed in 0..6 {
            let mut p = npu(conf);
            run_checked(&mut p, &workload(seed, 1500), None);
            let mut p = npu(conf);
            run_checked(&mut p, &workload(seed, 1500), Some(96 * MIB));
        }
    }
}

/// 2.12's `throw_on_cudamalloc_oom` (docs/pytorch-model.md#throw-on-oom): on a 100 MiB GPU
/// with `per_process_memory_fraction:0.5` (a 50 MiB limit), 30 MiB cached and 40 MiB asked
/// for: the default releases the cached segment and succeeds (40 MiB reserved); with the
/// option the request past the limit fails at once, the cache untouched (30 MiB reserved).
/// Before 2.12 the option changes nothing.
#[test]
fn throw_on_cudamalloc_oom_rejects_past_the_fraction_without_releasing_cache() {
    let run = |conf: &str, version: Version| {
        let mut config = Config::parse(conf, version).unwrap();
        config.gpu_memory = 100 * MIB;
        let mut p = PyTorch::new(config);
        let mut d = device(None);
        let a = malloc(&mut p, &mut d, 30 * MIB);
        free(&mut p, &mut d, a);
        let got = p.malloc(&mut d, 40 * MIB, 0).unwrap();
        p.check().unwrap();
        let stats = p.stats();
        (got.is_some(), p.reserved(), stats.num_ooms, stats.num_oom_rejections)
    };
    let fraction = "per_process_memory_fraction:0.5";
    let throw = "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True";
    assert_eq!(run(fraction, Version::V2_12), (true, 40 * MIB, 0, 0), "cache released");
    assert_eq!(run(throw, Version::V2_12), (false, 30 * MIB, 1, 1), "rejected at once");
    assert_eq!(run(throw, Version::NEWEST), (false, 30 * MIB, 1, 1));
    assert_eq!(run(throw, Version::CURRENT), (true, 40 * MIB, 0, 0), "2.11 has no such rule");
    // Without a fraction below 1 there is no limit to reject at.
    let whole = "per_process_memory_fraction:1.0,throw_on_cudamalloc_oom:True";
    assert_eq!(run(whole, Version::V2_12), (true, 70 * MIB, 0, 0));
}

/// 2.13's "a capture is not a pool" (docs/pytorch-model.md#capture-not-pool): a malloc into a
/// `use_mem_pool` pool `(0, 1)` that cannot get memory falls back to releasing the default
/// pools' cache from 2.13 (as a default-pool malloc does); before 2.13 it did not, and a graph
/// capture's pool `(1, 0)` never does.
#[test]
fn a_mem_pool_malloc_releases_cached_blocks_from_2_13_and_a_capture_never() {
    let run = |version: Version, pool: (u64, u64)| {
        let mut config = Config::parse("", version).unwrap();
        config.mem_pools = vec![(0, 1)];
        let mut p = PyTorch::new(config);
        let mut d = device(Some(100 * MIB));
        let a = malloc(&mut p, &mut d, 60 * MIB);
        free(&mut p, &mut d, a);
        p.allocate_into(Some(pool)).unwrap();
        let got = p.malloc(&mut d, 50 * MIB, 0).unwrap();
        p.check().unwrap();
        (got.is_some(), p.reserved())
    };
    assert_eq!(run(Version::V2_13, (0, 1)), (true, 50 * MIB), "60 MiB cache released");
    assert_eq!(run(Version::NEWEST, (0, 1)), (true, 50 * MIB));
    assert_eq!(run(Version::V2_12, (0, 1)), (false, 60 * MIB), "before 2.13: a capture");
    assert_eq!(run(Version::NEWEST, (1, 0)), (false, 60 * MIB), "a graph capture's pool");
    // A (0, n) pool the stacks do not show as use_mem_pool is taken to be a graph's.
    assert_eq!(run(Version::NEWEST, (0, 2)), (false, 60 * MIB));
}

/// A pool a profiler trace's addresses inferred (docs/pytorch-model.md#kineto-addresses) is
/// replayed as another stream of the default pools wherever it is not a matter of placement:
/// `empty_cache()` releases its wholly free segments, and a malloc into it that the device
/// cannot hold falls back to releasing every cached segment, in every release. Its free
/// blocks still serve only its own requests.
#[test]
fn an_inferred_pool_is_released_by_flushes_and_falls_back_as_a_stream() {
    use crate::trace::kineto_segments::INFERRED_POOL;
    let inferred = Some((INFERRED_POOL, 1));
    for version in [Version::V2_12, Version::NEWEST] {
        // Its free segment, released by a flush; a graph's pool keeps its own.
        for (pool, kept) in [(inferred, 0), (Some((1, 0)), 60 * MIB)] {
            let mut p = PyTorch::new(Config::parse("", version).unwrap());
            let mut d = device(None);
            p.allocate_into(pool).unwrap();
            let a = malloc(&mut p, &mut d, 60 * MIB);
            free(&mut p, &mut d, a);
            // Its free block is not for a default-pool request.
            p.allocate_into(None).unwrap();
            let b = malloc(&mut p, &mut d, 4 * MIB);
            assert!(b.addr < a.addr || b.addr >= a.addr + 60 * MIB, "{version:?}, {pool:?}");
            free(&mut p, &mut d, b);
            p.empty_cache(&mut d).unwrap();
            p.check().unwrap();
            assert_eq!(p.reserved(), kept, "{version:?}, {pool:?}");
        }
        // A malloc into it that the device cannot hold releases the default pools' cache.
        let mut p = PyTorch::new(Config::parse("", version).unwrap());
        let mut d = device(Some(100 * MIB));
        let a = malloc(&mut p, &mut d, 60 * MIB);
        free(&mut p, &mut d, a);
        p.allocate_into(inferred).unwrap();
        let got = p.malloc(&mut d, 50 * MIB, 0).unwrap();
        p.check().unwrap();
        assert_eq!((got.is_some(), p.reserved()), (true, 50 * MIB), "{version:?}");
    }
}

/// 2.15's `expandable_segments_reserve` (docs/pytorch-model.md#expandable-reserve) on a 1 GiB
/// GPU: reservations of 64 MiB, rounded up to whole 20 MiB pages (80 MiB). Two 50 MiB requests
/// map 60 MiB each: the second does not fit in the first reservation's remaining 30 MiB and
/// starts a new one (120 MiB reserved, where 9/8 of the GPU holds both in 100 MiB). One request
/// larger than the reservation fails. Clamped to 9/8 of the GPU's memory.
#[test]
fn expandable_segments_reserve_bounds_each_reservation() {
    let setup = |conf: &str, version: Version| {
        let mut config = Config::parse(conf, version).unwrap();
        config.gpu_memory = GIB;
        (PyTorch::new(config), device(None))
    };
    let two = |conf: &str, version: Version| {
        let (mut p, mut d) = setup(conf, version);
        malloc(&mut p, &mut d, 50 * MIB);
        malloc(&mut p, &mut d, 50 * MIB);
        let reservations =
            d.calls().iter().filter(|c| matches!(c, BackendCall::Reserve { .. })).count();
        (p.reserved(), reservations)
    };
    let reserve = "expandable_segments:True,expandable_segments_reserve:64M";
    assert_eq!(two("expandable_segments:True", Version::NEWEST), (100 * MIB, 1));
    assert_eq!(two(reserve, Version::NEWEST), (120 * MIB, 2), "a new segment");
    assert_eq!(two(reserve, Version::V2_13), (100 * MIB, 1), "2.13 has no such option");
    let (mut p, mut d) = setup(reserve, Version::NEWEST);
    assert!(p.malloc(&mut d, 100 * MIB, 0).unwrap().is_none(), "larger than a reservation");
    // A fraction of the GPU's memory; past 9/8 of it, clamped.
    let (p, _) =
        setup("expandable_segments:True,expandable_segments_reserve:0.25", Version::NEWEST);
    assert_eq!(p.settings().va_size(false), 260 * MIB, "256 MiB in whole 20 MiB pages");
    let (p, _) = setup("expandable_segments:True,expandable_segments_reserve:4G", Version::NEWEST);
    assert_eq!(p.settings().va_size(false), config::va_size_on(GIB, 20 * MIB));
}

/// `mallocWithAddress` (docs/pytorch-model.md#exact-address): a request asked at an address
/// inside a free block is placed there, the bytes before it cached as their own free block and
/// the rest split off; where no free block holds the address and the request, it is served by
/// best fit as any other.
#[test]
fn a_request_placed_by_address_takes_that_address_in_its_free_block() {
    let mut p = policy("");
    let mut d = device(None);
    let x1 = malloc(&mut p, &mut d, 4 * MIB);
    let k1 = malloc(&mut p, &mut d, 2 * MIB);
    let x2 = malloc(&mut p, &mut d, 14 * MIB);
    let base = x1.addr;
    assert_eq!((k1.addr, x2.addr), (base + 4 * MIB, base + 6 * MIB));
    free(&mut p, &mut d, x1);
    free(&mut p, &mut d, x2);
    // Best fit would take the 4 MiB block at the segment's start.
    p.place_next_at(base + 10 * MIB);
    let at = malloc(&mut p, &mut d, 2 * MIB);
    assert_eq!((at.addr, at.block_size), (base + 10 * MIB, 2 * MIB));
    assert_eq!(p.block_containing(base + 6 * MIB), Some((base + 6 * MIB, 4 * MIB, false)));
    assert_eq!(p.block_containing(base + 12 * MIB), Some((base + 12 * MIB, 8 * MIB, false)));
    assert_eq!(p.allocated(), 4 * MIB);
    // The hint is taken by that malloc: the next one is best fit again.
    assert_eq!(malloc(&mut p, &mut d, 4 * MIB).addr, base);
    // An address in an allocated block cannot be taken: best fit (the 4 MiB block after k1).
    p.place_next_at(k1.addr);
    assert_eq!(malloc(&mut p, &mut d, 4 * MIB).addr, base + 6 * MIB);
    assert_eq!(segment_allocs(&d), vec![20 * MIB], "no new segment");
}
