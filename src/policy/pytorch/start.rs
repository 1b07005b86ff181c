//! The allocator state at a snapshot's first event, recovered by walking back from its final
//! `segments` (docs/pytorch-model.md#snapshot-start-state).
//!
//! A snapshot's ring buffer usually starts mid-run. Working backwards from the dump: segments
//! allocated during the trace did not exist at its start, segments freed during it did; blocks
//! live at the dump that no `alloc` produced were live at the start with their final size; blocks
//! freed but never allocated in the trace (*orphans*) were live with a size the trace does not
//! record; everything else in a segment was free, and free neighbours are one block
//! (docs/pytorch-model.md#free-and-merge).
//!
//! An orphan's block size is inferred (docs/pytorch-model.md#orphans): `round_size(request)` in the
//! small pool and in expandable segments (512-byte splitting leaves no tail); in the large pool,
//! when the room up to the next known boundary is at most 1 MiB the block fills it (a free
//! large-pool block is always larger than 1 MiB); otherwise `round_size(request)` is the default
//! and the block may be up to 1 MiB longer. Such an orphan is *ambiguous*, and the decisions that
//! depend on its size are undeterminable unless the trace later proves its size
//! (docs/pytorch-model.md#orphan-growth, `StartState::extend`). With `max_split_size`, an
//! oversize orphan was never split: it fills a room below the tolerance.
//!
//! Expandable segments (docs/pytorch-model.md#expandable-start): the mapped ranges at the start
//! follow from the dump's mapped ranges by undoing `segment_map` / `segment_unmap`; the ranges of
//! one (stream, pool) form one reservation of 9/8 of the GPU's memory (`Config::gpu_memory`), whose
//! base is its lowest mapped byte, or lower when the trace later maps below it (the VA there was
//! unmapped before recording).

use super::config::{Config, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use super::Tiling;
use crate::trace::lifetimes::{self, Lifetimes};
use crate::trace::pool_routes::PoolRoutes;
use crate::trace::{is_graph_capture_frame, is_mem_pool_frame, Action, BlockState, Event, Trace};
use std::collections::BTreeMap;

/// An expandable reservation at the first event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Its lowest address.
    pub(crate) base: u64,
    /// Its size (9/8 of the GPU's memory, in pages).
    pub(crate) va_size: u64,
    /// The stream it serves.
    pub(crate) stream: u64,
    /// The small pool's (2 MiB pages) or the large pool's.
    pub(crate) small: bool,
    /// The private pool it belongs to; `None`: the default pools.
    pub(crate) private_pool: Option<(u64, u64)>,
}

impl Reservation {
    /// Whether the mapped range `s` lies in this reservation.
    pub(crate) fn holds(&self, s: &StartSegment) -> bool {
        s.expandable
            && (s.stream, s.small, s.private_pool) == (self.stream, self.small, self.private_pool)
            && self.contains(s.addr)
    }

    /// Whether `addr` lies in this reservation.
    fn contains(&self, addr: u64) -> bool {
        self.base <= addr && addr < self.base + self.va_size
    }
}

/// A block live at the first event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveAtStart {
    /// Its address.
    pub(crate) addr: u64,
    /// Its block size (exact, or the current guess for an orphan).
    pub size: u64,
    /// Its request size.
    pub request: u64,
    /// For an orphan: the largest block size the trace allows (= `size` when exact).
    pub(crate) max_size: u64,
    /// True when freed inside the trace without an earlier alloc (an orphan free).
    pub orphan: bool,
    /// True when the trace proved this orphan's size (docs/pytorch-model.md#orphan-growth).
    pub(crate) proven: bool,
    /// The event that showed this orphan longer than its default guess, while the state was
    /// recovered: where `size` comes from ([`StartState::recover`]).
    pub(crate) shown_at: Option<usize>,
}

impl LiveAtStart {
    /// True when the size is a guess that could be up to `max_size`.
    pub(crate) fn ambiguous(&self) -> bool {
        self.orphan && !self.proven && self.max_size > self.size
    }
}

/// One segment as it stood at the first event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    /// Its address.
    pub(crate) addr: u64,
    /// Its cudaMalloc size.
    pub(crate) size: u64,
    /// The allocation stream.
    pub(crate) stream: u64,
    /// Small pool (2 MiB segments) or large.
    pub small: bool,
    /// A mapped range of an expandable segment (not a cudaMalloc segment).
    pub(crate) expandable: bool,
    /// The private pool that owns it (`segment_pool_id`), when the snapshot says so; `None`
    /// for the default pools, and for a segment the trace frees (the dump does not show it).
    pub(crate) private_pool: Option<(u64, u64)>,
    /// The blocks live in it, in address order.
    pub live: Vec<LiveAtStart>,
}

/// The recovered state; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments present at the first event, by address.
    pub segments: Vec<StartSegment>,
    /// Orphan frees that fall in no start segment (the state could not hold them).
    pub(crate) unplaced: Vec<u64>,
    /// The recorded trace uses expandable segments.
    pub(crate) expandable: bool,
    /// Expandable reservations at the start.
    pub(crate) reservations: Vec<Reservation>,
    /// Which recorded allocations were made into a private pool, as of the first event; `None`
    /// when the dump shows none. A replay follows a copy through the events.
    pub(crate) routes: Option<PoolRoutes>,
}

/// A cudaMalloc segment's or a mapped expandable piece's (size, stream, small pool, private
/// pool), as recovery tracks it.
type SegmentFacts = (u64, u64, bool, Option<(u64, u64)>);

impl StartState {
    /// Recovers the state of `device` at the first of `events` under `config`.
    pub fn recover(trace: &Trace, device: i32, events: &[Event], config: &Config) -> StartState {
        StartState::recover_from(trace, device, events, &lifetimes::scan(events), config)
    }

    /// [`StartState::recover`] with the events' lifetime [`scan`](lifetimes::scan) already done
    /// (a replay's [`PolicyContext::lifetimes`](crate::policy::PolicyContext::lifetimes)).
    pub(crate) fn recover_from(
        trace: &Trace,
        device: i32,
        events: &[Event],
        lifetimes: &Lifetimes,
        config: &Config,
    ) -> StartState {
        // Segments: undo segment events from the dump backwards.
        // addr -> (size, stream, small, private pool)
        let mut segs: BTreeMap<u64, SegmentFacts> = BTreeMap::new();
        // Mapped expandable bytes, page-granular pieces: addr -> (size, stream, small, pool).
        let mut mapped: BTreeMap<u64, SegmentFacts> = BTreeMap::new();
        let mut final_live: Vec<(u64, u64, u64)> = Vec::new(); // (addr, size, request)
        let mut expandable = false;
        // Ranges that would overflow the address space are malformed input: ignored here, so the
        // arithmetic below cannot overflow (validation then reports what they explain).
        let fits = |addr: u64, size: u64| addr.checked_add(size).is_some_and(|e| e < 1 << 62);
        for s in trace.segments_of(device).filter(|s| fits(s.address, s.total_size)) {
            if s.is_expandable {
                expandable = true;
                let small = s.pool == crate::trace::PoolKind::Small;
                mapped.insert(s.address, (s.total_size, s.stream, small, s.private_pool));
                for b in &s.blocks {
                    if matches!(
                        b.state,
                        BlockState::ActiveAllocated | BlockState::ActivePendingFree
                    ) {
                        final_live.push((b.address, b.size, b.requested_size));
                    }
                }
                continue;
            }
            let small = s.pool == crate::trace::PoolKind::Small;
            segs.insert(s.address, (s.total_size, s.stream, small, s.private_pool));
            for b in &s.blocks {
                if matches!(b.state, BlockState::ActiveAllocated | BlockState::ActivePendingFree) {
                    final_live.push((b.address, b.size, b.requested_size));
                }
            }
        }
        let segment_events: Vec<&Event> =
            lifetimes.segment_events.iter().filter_map(|&i| events.get(i)).collect();
        for e in segment_events.iter().rev().filter(|e| fits(e.addr, e.size)) {
            match e.action {
                Action::SegmentAlloc => {
                    segs.remove(&e.addr);
                }
                Action::SegmentFree => {
                    // Its pool, where the entry names one (a segment freed before the dump).
                    let pool = trace.entry_pool(e).flatten();
                    segs.insert(e.addr, (e.size, e.stream, e.size == SMALL_BUFFER, pool));
                }
                Action::SegmentMap => {
                    expandable = true;
                    cut(&mut mapped, e.addr, e.size);
                }
                Action::SegmentUnmap => {
                    expandable = true;
                    let named = trace.entry_pool(e);
                    let (small, near) = pool_near(&mapped, e, named, config);
                    mapped.insert(e.addr, (e.size, e.stream, small, named.unwrap_or(near)));
                }
                _ => {}
            }
        }
        // Live blocks: final blocks no alloc produced, and orphan frees.
        let allocated_in_trace = &lifetimes.allocated;
        let orphans = lifetimes.orphans.iter().map(|b| (b.addr, b.size));
        let mut segments: Vec<StartSegment> = segs
            .iter()
            .map(|(&addr, &(size, stream, small, private_pool))| StartSegment {
                addr,
                size,
                stream,
                small,
                expandable: false,
                private_pool,
                live: Vec::new(),
            })
            .collect();
        let (ranges, reservations) = reservations(trace, &mapped, &segment_events, config);
        segments.extend(ranges);
        segments.sort_by_key(|s| s.addr);
        let find = |segments: &[StartSegment], addr: u64| {
            let i = segments.partition_point(|s| s.addr <= addr);
            (i > 0 && addr < segments[i - 1].addr + segments[i - 1].size).then(|| i - 1)
        };
        for (addr, size, request) in final_live {
            if allocated_in_trace.contains(&addr) {
                continue;
            }
            if let Some(i) = find(&segments, addr) {
                segments[i].live.push(LiveAtStart {
                    addr,
                    size,
                    request,
                    max_size: size,
                    orphan: false,
                    proven: true,
                    shown_at: None,
                });
            }
        }
        let mut unplaced = Vec::new();
        for (addr, request) in orphans {
            match find(&segments, addr) {
                Some(i) => segments[i].live.push(LiveAtStart {
                    addr,
                    size: config.round_size(request),
                    request,
                    max_size: 0,
                    orphan: true,
                    proven: false,
                    shown_at: None,
                }),
                None => unplaced.push(addr),
            }
        }
        for s in &mut segments {
            s.live.sort_by_key(|b| b.addr);
            infer_orphan_sizes(s, config);
        }
        let routes = PoolRoutes::new(trace, device, events, lifetimes);
        // Where a request may have gone to a private pool, a miss says nothing of the default
        // pools' free blocks.
        let default_pools_only = routes.is_none()
            && trace.entry_pools.is_none()
            && segments.iter().all(|s| s.private_pool.is_none());
        let misses = default_pools_only && !config.expandable_segments;
        prove_orphan_sizes(&mut segments, events, lifetimes.frees_at, misses.then_some(config));
        StartState { segments, unplaced, expandable, reservations, routes }
    }

    /// The orphan at `addr`, if any.
    pub(crate) fn orphan(&self, addr: u64) -> Option<&LiveAtStart> {
        self.segments.iter().flat_map(|s| &s.live).find(|b| b.orphan && b.addr == addr)
    }

    /// Every ambiguous orphan's address.
    pub(crate) fn ambiguous(&self) -> Vec<u64> {
        self.segments
            .iter()
            .flat_map(|s| &s.live)
            .filter(|b| b.ambiguous())
            .map(|b| b.addr)
            .collect()
    }

    /// A recorded placement at `addr` shows that the ambiguous orphan ending just before it
    /// was longer. Extends that orphan to end at `addr` and returns its address, if one fits.
    pub(crate) fn extend(&mut self, addr: u64) -> Option<u64> {
        let seg = self.segments.iter_mut().find(|s| s.addr <= addr && addr < s.addr + s.size)?;
        let o = seg
            .live
            .iter_mut()
            .filter(|b| b.ambiguous() && b.addr + b.size < addr && addr <= b.addr + b.max_size)
            .max_by_key(|b| b.addr)?;
        o.size = addr - o.addr;
        o.proven = true;
        Some(o.addr)
    }

    /// A copy with the orphan at `addr` at its largest feasible size (for undeterminable checks).
    pub(crate) fn with_longest(&self, addr: u64) -> StartState {
        let mut s = self.clone();
        for b in s.segments.iter_mut().flat_map(|s| s.live.iter_mut()) {
            if b.addr == addr {
                b.size = b.max_size;
            }
        }
        s
    }

    /// A copy with the orphan at `addr` given `size` bytes.
    pub(crate) fn with_size(&self, addr: u64, size: u64) -> StartState {
        let mut s = self.clone();
        s.set_size(addr, size);
        s
    }

    /// Gives the orphan at `addr` `size` bytes: a new lower bound the trace showed
    /// (docs/pytorch-model.md#orphan-growth).
    pub(crate) fn set_size(&mut self, addr: u64, size: u64) {
        for b in self.segments.iter_mut().flat_map(|s| s.live.iter_mut()) {
            if b.addr == addr {
                b.size = size.min(b.max_size);
            }
        }
    }

    /// The ambiguous orphans in the segment that holds `addr`.
    pub(crate) fn ambiguous_near(&self, addr: u64) -> Vec<u64> {
        self.segments
            .iter()
            .filter(|s| s.addr <= addr && addr < s.addr + s.size)
            .flat_map(|s| &s.live)
            .filter(|b| b.ambiguous())
            .map(|b| b.addr)
            .collect()
    }

    /// Reserved bytes at the first event.
    pub(crate) fn reserved(&self) -> u64 {
        self.segments.iter().fold(0u64, |sum, s| sum.saturating_add(s.size))
    }

    /// The (start, size, live request) tiling of one segment or mapped range.
    pub(crate) fn tiling(s: &StartSegment) -> Tiling {
        let mut blocks = Vec::with_capacity(2 * s.live.len() + 1);
        let mut pos = s.addr;
        let end = s.addr + s.size;
        for b in &s.live {
            if b.addr < pos {
                continue; // overlapping evidence: the earlier block wins
            }
            if b.addr > pos {
                blocks.push((pos, b.addr - pos, None));
            }
            let size = b.size.min(end - b.addr);
            if size == 0 {
                continue; // two pieces of evidence for one address: the first wins
            }
            blocks.push((b.addr, size, Some(b.request)));
            pos = b.addr + size;
        }
        if pos < end {
            blocks.push((pos, end - pos, None));
        }
        blocks
    }
}

/// True when `device` of `trace` shows expandable segments in use, whatever its recorded
/// settings say: the dump holds an expandable range or an entry maps or unmaps pages. torch_npu
/// recordings made with expandable segments can record `expandable_segments:False` in their
/// settings (docs/pytorch-model.md#npu); a replay or validation of the recorded settings then
/// follows the pages, not the string. `events`: the device's events, or a streamed replay's
/// digest (which keeps the first segment events).
pub(crate) fn shows_expandable(trace: &Trace, device: i32, events: &[Event]) -> bool {
    trace.segments_of(device).any(|s| s.is_expandable)
        || events.iter().any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
}

/// What a recording with expandable segments shows of the memory its private pools got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrivatePoolMemory {
    /// `Some(true)`: private pools map pages of their own reservations (PyTorch ≈ 2.5+);
    /// `Some(false)`: they get cudaMalloc segments (before); `None`: the recording does not
    /// show it ([`Config::private_pools_expandable`]).
    pub expandable: Option<bool>,
    /// The private pools that got cudaMalloc segments where private pools map pages: MemPools
    /// with an allocator of their own ([`Config::own_allocator_pools`]).
    pub own_allocator: Vec<(u64, u64)>,
}

impl PrivatePoolMemory {
    /// Reads it from `device` of `trace` (`events`: its events, or a streamed replay's digest).
    /// A private pool mapped pages where the dump has an expandable range of it or a
    /// `segment_map` entry names it; it got cudaMalloc segments where the dump has such a segment
    /// of it or a `segment_alloc` names it. In a file that does not name pools, any
    /// `segment_alloc` was a private pool's: with expandable segments the default pools make
    /// none. Entries that name their pools come from PyTorch ≈ 2.7 and later, where private
    /// pools map pages unless their MemPool has an allocator of its own; so do pools that map
    /// where others do not. Nothing is shown where the recording did not use expandable
    /// segments.
    pub fn recorded(trace: &Trace, device: i32, events: &[Event]) -> PrivatePoolMemory {
        if !trace.allocator_settings.as_ref().is_some_and(|s| s.expandable_segments)
            && !trace.segments_of(device).any(|s| s.is_expandable)
        {
            return PrivatePoolMemory::default();
        }
        // Whether a private pool mapped pages, whether one got cudaMalloc segments, and which
        // did where the file tells.
        let (mut mapped, mut cudamalloc) = (false, false);
        let mut segment_pools: Vec<(u64, u64)> = Vec::new();
        for s in trace.segments_of(device) {
            match (s.private_pool, s.is_expandable) {
                (Some(_), true) => mapped = true,
                (Some(pool), false) => {
                    cudamalloc = true;
                    segment_pools.push(pool);
                }
                (None, _) => {}
            }
        }
        for e in events {
            match (e.action, trace.entry_pool(e)) {
                (Action::SegmentMap, Some(Some(_))) => mapped = true,
                (Action::SegmentAlloc, Some(Some(pool))) => {
                    cudamalloc = true;
                    segment_pools.push(pool);
                }
                (Action::SegmentAlloc, None) => cudamalloc = true,
                _ => {}
            }
        }
        let named = trace.entry_pools.is_some();
        if mapped || (named && cudamalloc) {
            segment_pools.sort_unstable();
            segment_pools.dedup();
            PrivatePoolMemory { expandable: Some(true), own_allocator: segment_pools }
        } else if cudamalloc {
            PrivatePoolMemory { expandable: Some(false), own_allocator: Vec::new() }
        } else {
            PrivatePoolMemory::default()
        }
    }

    /// Models what it shows in `config`.
    pub(crate) fn apply_to(&self, config: &mut Config) {
        config.private_pools_expandable = self.expandable;
        config.own_allocator_pools.clone_from(&self.own_allocator);
    }
}

/// Removes `[addr, addr + size)` from the mapped pieces (undoing a `segment_map`).
fn cut(mapped: &mut BTreeMap<u64, SegmentFacts>, addr: u64, size: u64) {
    let end = addr + size;
    let touched: Vec<(u64, SegmentFacts)> = mapped
        .range(..end)
        .rev()
        .take_while(|(&a, &(s, ..))| a + s > addr)
        .map(|(&a, &v)| (a, v))
        .collect();
    for (a, (s, stream, small, pool)) in touched {
        mapped.remove(&a);
        if a < addr {
            mapped.insert(a, (addr - a, stream, small, pool));
        }
        if a + s > end {
            mapped.insert(end, (a + s - end, stream, small, pool));
        }
    }
}

/// The pool of a range re-added by undoing the `segment_unmap` `e`: (small, private pool) of a
/// mapped neighbour of the same stream (and of the pool the entry names, where it names one:
/// `named`), else the small pool by page size (a multiple of the large page is taken as large)
/// and the default pools.
fn pool_near(
    mapped: &BTreeMap<u64, SegmentFacts>,
    e: &Event,
    named: Option<Option<(u64, u64)>>,
    config: &Config,
) -> (bool, Option<(u64, u64)>) {
    let (addr, end) = (e.addr, e.addr + e.size);
    let same = |&(_, stream, _, pool): &SegmentFacts| {
        stream == e.stream && named.is_none_or(|n| n == pool)
    };
    let before = mapped.range(..addr).next_back().filter(|(&a, f)| a + f.0 == addr && same(f));
    let after = mapped.get(&end).filter(|f| same(f));
    match (before.map(|(_, f)| f), after) {
        (Some(&(_, _, small, pool)), _) | (None, Some(&(_, _, small, pool))) => (small, pool),
        (None, None) => (e.size % config.page_size(false) != 0, None),
    }
}

/// Groups the mapped pieces into ranges (adjacent pieces of one stream and pool merge) and
/// reservations: one per (stream, pool) span of at most the VA size, based at its lowest mapped
/// byte or at the lowest address the trace later maps within reach below it.
fn reservations(
    trace: &Trace,
    mapped: &BTreeMap<u64, SegmentFacts>,
    segment_events: &[&Event],
    config: &Config,
) -> (Vec<StartSegment>, Vec<Reservation>) {
    let mut ranges: Vec<StartSegment> = Vec::new();
    for (&addr, &(size, stream, small, private_pool)) in mapped {
        match ranges.last_mut() {
            Some(r)
                if r.addr + r.size == addr
                    && (r.stream, r.small, r.private_pool) == (stream, small, private_pool) =>
            {
                r.size += size;
            }
            _ => ranges.push(StartSegment {
                addr,
                size,
                stream,
                small,
                expandable: true,
                private_pool,
                live: Vec::new(),
            }),
        }
    }
    let mut out: Vec<Reservation> = Vec::new();
    for r in &ranges {
        let va = config.va_size(r.small);
        if out.iter().any(|o| o.holds(r) && r.addr + r.size <= o.base + o.va_size) {
            continue;
        }
        let end = r.addr + r.size;
        // A map the entry says is another pool's is not in this reservation.
        let same_pool = |e: &Event| trace.entry_pool(e).is_none_or(|p| p == r.private_pool);
        let base = segment_events
            .iter()
            .filter(|e| {
                e.action == Action::SegmentMap
                    && e.stream == r.stream
                    && e.addr < r.addr
                    && end - e.addr <= va
                    && same_pool(e)
                    && !out.iter().any(|o| o.contains(e.addr))
            })
            .map(|e| e.addr)
            .min()
            .unwrap_or(r.addr);
        let (stream, small, private_pool) = (r.stream, r.small, r.private_pool);
        out.push(Reservation { base, va_size: va, stream, small, private_pool });
    }
    (ranges, out)
}

/// Sizes of ambiguous orphans that the trace proves (docs/pytorch-model.md#orphan-growth): while
/// an orphan is live, the room after it up to the next known block is one free block that starts
/// where the orphan ends, and every placement starts at the first byte of a free block. So the
/// first `alloc` recorded after the orphan's address and within its
/// [reach](lifetimes::orphan_reach), before the orphan's free, lands where the orphan ends, if it
/// lands in the room at all: at the default guess it confirms it, further on (up to the longest
/// feasible size) it shows the orphan was that long. With `misses` (the recorded settings, where
/// every request went to the default pools), each recorded cache miss bounds the orphans from
/// below ([`missed_fit`]).
fn prove_orphan_sizes(
    segments: &mut [StartSegment],
    events: &[Event],
    frees_at: Action,
    misses: Option<&Config>,
) {
    // The address of the segment just allocated: the malloc that places its block there missed
    // the cache.
    let mut new_segment: Option<u64> = None;
    // Ambiguous orphans still live and unproven: address -> (reach, segment, index in it).
    let mut open: BTreeMap<u64, (u64, usize, usize)> = BTreeMap::new();
    let mut widest = 0;
    for (i, s) in segments.iter().enumerate() {
        for (j, b) in s.live.iter().enumerate() {
            if b.ambiguous() {
                let reach = lifetimes::orphan_reach(b.request);
                widest = widest.max(reach);
                open.insert(b.addr, (reach, i, j));
            }
        }
    }
    for (k, e) in events.iter().enumerate() {
        if open.is_empty() {
            break;
        }
        let missed = match e.action {
            Action::SegmentAlloc => {
                new_segment = Some(e.addr);
                continue;
            }
            Action::Alloc if new_segment == Some(e.addr) => misses.map(|c| c.round_size(e.size)),
            Action::Oom if e.size > 0 => misses.map(|_| e.size),
            _ => None,
        };
        if !matches!(e.action, Action::FreeCompleted | Action::FreeRequested) {
            new_segment = None;
        }
        if let (Some(rounded), Some(config)) = (missed, misses) {
            if rounded > SMALL_SIZE {
                missed_fit(segments, &open, (k, e.stream), rounded, config);
            }
        }
        if e.action == frees_at {
            open.remove(&e.addr);
            continue;
        }
        if e.action != Action::Alloc {
            continue;
        }
        let within: Vec<u64> = open
            .range(e.addr.saturating_sub(widest)..e.addr)
            .filter(|(&o, &(reach, ..))| e.addr - o <= reach)
            .map(|(&o, _)| o)
            .collect();
        for o in within {
            let Some((_, i, j)) = open.remove(&o) else { continue };
            let seg = &segments[i];
            let boundary = seg.live.get(j + 1).map_or(seg.addr + seg.size, |n| n.addr);
            let b = &mut segments[i].live[j];
            if e.addr >= b.addr + b.size && e.addr <= b.addr + b.max_size && e.addr < boundary {
                if e.addr > b.addr + b.size {
                    b.shown_at = Some(k);
                }
                b.size = e.addr - b.addr;
                b.proven = true;
            }
        }
    }
}

/// A malloc of `rounded` bytes on `stream` missed the cache: every free large-pool block of its
/// stream was smaller (or refused as oversize). While an ambiguous orphan is live and nothing
/// has been placed after it, the room after it is such a block (or part of one, where the block
/// after the room was freed), so the orphan is at least long enough to leave less than `rounded`
/// there.
fn missed_fit(
    segments: &mut [StartSegment],
    open: &BTreeMap<u64, (u64, usize, usize)>,
    (event, stream): (usize, u64),
    rounded: u64,
    config: &Config,
) {
    for &(_, i, j) in open.values() {
        let seg = &segments[i];
        if seg.small || seg.expandable || seg.stream != stream {
            continue;
        }
        let boundary = seg.live.get(j + 1).map_or(seg.addr + seg.size, |n| n.addr);
        let b = &segments[i].live[j];
        let room = boundary.saturating_sub(b.addr + b.size);
        if room < rounded || super::oversize_refused(config, rounded, room) {
            continue;
        }
        let least = boundary - (rounded - MIN_BLOCK_SIZE) - b.addr;
        if least <= b.max_size {
            segments[i].live[j].size = least;
            segments[i].live[j].shown_at = Some(event);
        }
    }
}

/// Sizes of the orphans of one segment, from the boundaries the known blocks set.
fn infer_orphan_sizes(s: &mut StartSegment, config: &Config) {
    let end = s.addr + s.size;
    for i in 0..s.live.len() {
        if !s.live[i].orphan {
            continue;
        }
        let boundary = s.live.get(i + 1).map_or(end, |n| n.addr);
        let b = &mut s.live[i];
        let room = boundary.saturating_sub(b.addr);
        let rounded = b.size.min(room);
        let gap = room - rounded;
        let oversize = rounded >= config.max_split_size;
        b.size = rounded;
        b.max_size = rounded;
        if s.small || s.expandable || rounded <= SMALL_SIZE || config.expandable_segments {
            continue; // 512-byte splitting: round_size is exact
        }
        if oversize {
            if gap < config.tolerance() {
                b.size = room; // never split: it fills the room
                b.max_size = room;
            }
        } else if gap <= SMALL_SIZE {
            b.size = room; // the tail cannot be a free large-pool block
            b.max_size = room;
        } else {
            // Up to 1 MiB longer, leaving a free tail of more than 1 MiB.
            let longest = SMALL_SIZE.min(gap.saturating_sub(SMALL_SIZE + MIN_BLOCK_SIZE));
            b.max_size = rounded + longest;
        }
    }
}

/// The `(0, n)` private pools whose allocations' stacks show a
/// `torch.cuda.use_mem_pool` pool, not a graph capture ([`Config::mem_pools`],
/// docs/pytorch-model.md#capture-not-pool): a stack through `use_mem_pool` and none through
/// `torch/cuda/graphs.py` (`capture_begin`, `make_graphed_callables`). An allocation's pool is
/// the one its entry names, or in a file whose entries name none, the one whose segment at the
/// dump it lies in (`segment_pool_id`; the pool routes, `src/trace/pool_routes.rs`, tell it so
/// too). The reader keeps these stacks even where it keeps no other frames; a trace with none
/// (a format without stacks) has no `MemPool` here, every private pool taken to be a graph
/// capture's.
pub(crate) fn mem_pools_by_stacks(trace: &Trace, device: i32, events: &[Event]) -> Vec<(u64, u64)> {
    if trace.frames.is_empty() {
        return Vec::new();
    }
    // Without names: the dump's `(0, n)` segments by address.
    let mut segments: Vec<(u64, u64, (u64, u64))> = Vec::new();
    if trace.entry_pools.is_none() {
        segments = trace
            .segments_of(device)
            .filter_map(|s| {
                let pool = s.private_pool.filter(|p| p.0 == 0)?;
                Some((s.address, s.address.checked_add(s.total_size)?, pool))
            })
            .collect();
        segments.sort_unstable();
        if segments.is_empty() {
            return Vec::new();
        }
    }
    let in_segment = |addr: u64| {
        let k = segments.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        (addr < segments[k].1).then_some(segments[k].2)
    };
    // Per pool: (a stack names use_mem_pool, a stack names graph capture).
    let mut seen: BTreeMap<(u64, u64), (bool, bool)> = BTreeMap::new();
    for e in events.iter().filter(|e| e.action == Action::Alloc) {
        let pool = match trace.entry_pools {
            Some(_) => trace.entry_pool(e).flatten(),
            None => in_segment(e.addr),
        };
        let Some(id) = pool.filter(|id| id.0 == 0) else { continue };
        let frames = trace.frames.get(e.frames);
        let mem_pool = frames.iter().any(|f| is_mem_pool_frame(&f.name));
        let graph = frames.iter().any(|f| is_graph_capture_frame(&f.name, &f.filename));
        let s = seen.entry(id).or_default();
        s.0 |= mem_pool;
        s.1 |= graph;
    }
    seen.into_iter().filter(|(_, (m, g))| *m && !*g).map(|(id, _)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn seg(live: Vec<(u64, u64, bool)>) -> StartSegment {
        StartSegment {
            addr: 0,
            size: 20 * MIB,
            stream: 0,
            small: false,
            expandable: false,
            private_pool: None,
            live: live
                .into_iter()
                .map(|(addr, request, orphan)| LiveAtStart {
                    addr,
                    size: if orphan { Config::default().round_size(request) } else { request },
                    request,
                    max_size: 0,
                    orphan,
                    proven: !orphan,
                    shown_at: None,
                })
                .collect(),
        }
    }

    #[test]
    fn orphan_sizes_follow_section_19_1() {
        // Orphan of 5 MiB at 0, a known 4 MiB block at 5.5 MiB: the 0.5 MiB gap is part of it.
        let mut s = seg(vec![(0, 5 * MIB, true), (5 * MIB + MIB / 2, 4 * MIB, false)]);
        infer_orphan_sizes(&mut s, &Config::default());
        assert_eq!((s.live[0].size, s.live[0].max_size), (5 * MIB + MIB / 2, 5 * MIB + MIB / 2));
        // Orphan of 5 MiB at 0 with 15 MiB after it: default 5 MiB, up to 6 MiB.
        let mut s = seg(vec![(0, 5 * MIB, true)]);
        infer_orphan_sizes(&mut s, &Config::default());
        assert_eq!((s.live[0].size, s.live[0].max_size), (5 * MIB, 6 * MIB));
        assert!(s.live[0].ambiguous());
        // A gap of 1.5 MiB: at most 0.5 MiB - 512 longer (the free tail must exceed 1 MiB).
        let mut s = seg(vec![(0, 5 * MIB, true), (6 * MIB + MIB / 2, 4 * MIB, false)]);
        infer_orphan_sizes(&mut s, &Config::default());
        assert_eq!(s.live[0].max_size, 5 * MIB + MIB / 2 - 512);
        // Small pool: exact.
        let mut s = seg(vec![(0, 1000, true)]);
        s.small = true;
        infer_orphan_sizes(&mut s, &Config::default());
        assert_eq!((s.live[0].size, s.live[0].max_size), (1024, 1024));
    }

    #[test]
    fn a_later_placement_extends_the_orphan_before_it() {
        let mut s = seg(vec![(0, 5 * MIB, true)]);
        infer_orphan_sizes(&mut s, &Config::default());
        let mut st = StartState { segments: vec![s], ..StartState::default() };
        assert_eq!(st.extend(7 * MIB), None, "beyond the longest feasible size");
        assert_eq!(st.extend(5 * MIB + 4096), Some(0));
        assert_eq!(st.segments[0].live[0].size, 5 * MIB + 4096);
        assert!(!st.segments[0].live[0].ambiguous());
    }
}
