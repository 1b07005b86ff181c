//! Which recorded `oom` entries prove that a CUDA graph capture was underway
//! (docs/pytorch-model.md#capture-oom).
//!
//! PyTorch gives up on a malloc without its last fallback, `release_cached_blocks`, only while a
//! graph capture is underway. An `oom` entry that no release of its own malloc precedes
//! ([`ooms_without_release`](super::lifetimes::ooms_without_release)) therefore shows a capture
//! only where the recorded cache held something that fallback would have returned: a wholly free
//! cudaMalloc segment, or a whole free page of an expandable segment, of the default pools or of
//! a private pool whose graph or `MemPool` is gone. Outside a capture the fallback would have
//! written a `segment_free` or `segment_unmap` first. Where the cache held nothing to return, the
//! entry reads the same either way, and it is taken as no capture: a replay of other settings,
//! whose cache may hold free memory there, then releases it as the real allocator would.
//!
//! The cache is followed from the events alone: the segments and mapped pages of the dump, with
//! the trace's segment events undone back to the first event, then done forward; the blocks live
//! at the first event, then every `alloc` and free. A block counts as far as its request reaches
//! (its block may be a little longer), a block whose free is requested but not completed as free
//! (the fallback first waits for every pending free), a segment or page whose pool is unknown as
//! the default pools', and a private pool as gone once any release names it: each errs towards
//! proving a capture, which reproduces the recording either way, where the other error would have
//! a replay release what the recorded allocator kept.

use super::lifetimes::{Lifetimes, LiveBlock};
use super::{Action, Event, PoolId, Trace};
use std::collections::BTreeMap;

/// The page sizes the recorded allocator unmaps by: its small pool's and its large pool's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pages {
    pub(crate) small: u64,
    pub(crate) large: u64,
}

impl Pages {
    /// The page of a mapped piece of `size` bytes: a large-pool piece is whole large pages (a
    /// small-pool malloc maps one small page).
    fn of_size(&self, size: u64) -> (bool, u64) {
        let small = self.large == 0 || size % self.large != 0;
        (small, self.page(small))
    }

    fn page(&self, small: bool) -> u64 {
        if small { self.small } else { self.large }.max(1)
    }
}

/// A cudaMalloc segment, or a mapped piece of an expandable segment.
#[derive(Clone, Copy, Debug)]
struct Piece {
    size: u64,
    pool: Option<PoolId>,
    /// The small pool's (expandable pieces only; pages by [`Pages::page`]).
    small: bool,
}

/// The recorded cache as the events show it; see the module docs.
struct Cache<'t> {
    trace: &'t Trace,
    /// The dump's private segments and mapped ranges (start, end, pool), by start: in a file
    /// whose entries do not name their pools, where the pool of a segment made in the trace is
    /// told.
    private: Vec<(u64, u64, PoolId)>,
    segments: BTreeMap<u64, Piece>,
    mapped: BTreeMap<u64, Piece>,
    /// Live blocks: request size, and whether their free is requested (pending).
    live: BTreeMap<u64, (u64, bool)>,
    /// Private pools a release has named.
    gone: Vec<PoolId>,
    pages: Pages,
}

/// The entries of `candidates` (event indices of `oom` entries, in order) at which the recorded
/// cache of `device` held something `release_cached_blocks` would have returned: those a graph
/// capture explains and no other reading does. `live_at_start` are the blocks live before the
/// first event; `lifetimes` the events' scan.
pub(crate) fn captures_proven(
    trace: &Trace,
    device: i32,
    events: &[Event],
    lifetimes: &Lifetimes,
    live_at_start: &[LiveBlock],
    candidates: &[u64],
    pages: Pages,
) -> Vec<u64> {
    let Some(&last) = candidates.last() else { return Vec::new() };
    let segment_events = lifetimes.segment_events.iter().filter_map(|&i| events.get(i));
    let start = Start { live_at_start, segment_events, pages, frees_at: lifetimes.frees_at };
    let mut proof = CaptureProof::new(trace, device, start, candidates);
    for (i, e) in events.iter().enumerate().take(last as usize + 1) {
        proof.push(i as u64, e);
    }
    proof.finish()
}

/// What [`CaptureProof`] starts from: the blocks live at the first event, the trace's segment
/// events in order (undone from the dump back to the first event), the recorded allocator's
/// pages, and the action at which frees take effect.
pub(crate) struct Start<'a, I> {
    pub(crate) live_at_start: &'a [LiveBlock],
    pub(crate) segment_events: I,
    pub(crate) pages: Pages,
    pub(crate) frees_at: Action,
}

/// [`captures_proven`] told one event at a time, in order, up to the last candidate (a replay
/// streamed from a file has no slice of events).
pub(crate) struct CaptureProof<'t, 'c> {
    cache: Cache<'t>,
    frees_at: Action,
    next: std::iter::Peekable<std::slice::Iter<'c, u64>>,
    out: Vec<u64>,
}

impl<'t, 'c> CaptureProof<'t, 'c> {
    pub(crate) fn new<'e, I>(
        trace: &'t Trace,
        device: i32,
        start: Start<'_, I>,
        candidates: &'c [u64],
    ) -> Self
    where
        I: DoubleEndedIterator<Item = &'e Event>,
    {
        let frees_at = start.frees_at;
        let cache = Cache::at_start(trace, device, start);
        CaptureProof { cache, frees_at, next: candidates.iter().peekable(), out: Vec::new() }
    }

    /// Event `i`, `e`.
    pub(crate) fn push(&mut self, i: u64, e: &Event) {
        if self.next.peek() == Some(&&i) {
            self.next.next();
            if self.cache.releasable() {
                self.out.push(i);
            }
        }
        self.cache.follow(e, self.frees_at);
    }

    /// The candidates proven, in order.
    pub(crate) fn finish(self) -> Vec<u64> {
        self.out
    }
}

impl<'t> Cache<'t> {
    /// The cache at the first event: the dump's segments and mapped ranges with the trace's
    /// segment events undone, and the blocks live then.
    fn at_start<'e, I>(trace: &'t Trace, device: i32, start: Start<'_, I>) -> Cache<'t>
    where
        I: DoubleEndedIterator<Item = &'e Event>,
    {
        let mut private = Vec::new();
        let mut cache = Cache {
            trace,
            private: Vec::new(),
            segments: BTreeMap::new(),
            mapped: BTreeMap::new(),
            live: start.live_at_start.iter().map(|b| (b.addr, (b.size, false))).collect(),
            gone: Vec::new(),
            pages: start.pages,
        };
        for s in trace.segments_of(device) {
            let small = s.pool == super::PoolKind::Small;
            let piece = Piece { size: s.total_size, pool: s.private_pool, small };
            match s.is_expandable {
                true => cache.mapped.insert(s.address, piece),
                false => cache.segments.insert(s.address, piece),
            };
            if let Some(pool) = s.private_pool {
                private.push((s.address, s.address.saturating_add(s.total_size), pool));
            }
        }
        private.sort_unstable();
        cache.private = private;
        for e in start.segment_events.rev() {
            match e.action {
                Action::SegmentAlloc => {
                    cache.segments.remove(&e.addr);
                }
                Action::SegmentFree => {
                    let pool = trace.entry_pool(e).flatten();
                    cache.segments.insert(e.addr, Piece { size: e.size, pool, small: false });
                }
                Action::SegmentMap => cut(&mut cache.mapped, e.addr, e.size),
                Action::SegmentUnmap => {
                    let piece = cache.new_piece(e);
                    cache.mapped.insert(e.addr, piece);
                }
                _ => {}
            }
        }
        cache
    }

    /// The pool of the segment or mapped piece a segment event names: the one its entry
    /// names, else the dump's private segment or range there, else the default pools.
    fn pool_of(&self, e: &Event) -> Option<PoolId> {
        if let Some(named) = self.trace.entry_pool(e) {
            return named;
        }
        let k = self.private.partition_point(|&(start, ..)| start <= e.addr).checked_sub(1)?;
        let (start, end, pool) = self.private[k];
        let here = match e.action {
            Action::SegmentAlloc => start == e.addr,
            _ => e.addr < end,
        };
        here.then_some(pool)
    }

    /// The mapped piece a `segment_map` or `segment_unmap` names.
    fn new_piece(&self, e: &Event) -> Piece {
        let (small, _) = self.pages.of_size(e.size);
        Piece { size: e.size, pool: self.pool_of(e), small }
    }

    /// Follows event `e` (frees take effect at `frees_at`).
    fn follow(&mut self, e: &Event, frees_at: Action) {
        match e.action {
            Action::Alloc if e.size > 0 => {
                self.live.insert(e.addr, (e.size, false));
            }
            _ if e.action == frees_at => {
                self.live.remove(&e.addr);
            }
            Action::FreeRequested => {
                if let Some(b) = self.live.get_mut(&e.addr) {
                    b.1 = true;
                }
            }
            Action::SegmentAlloc => {
                let piece = Piece { size: e.size, pool: self.pool_of(e), small: false };
                self.segments.insert(e.addr, piece);
            }
            Action::SegmentFree => {
                self.segments.remove(&e.addr);
                self.released(e);
            }
            Action::SegmentMap => {
                let piece = self.new_piece(e);
                self.mapped.insert(e.addr, piece);
            }
            Action::SegmentUnmap => {
                cut(&mut self.mapped, e.addr, e.size);
                self.released(e);
            }
            _ => {}
        }
    }

    /// A release that names a private pool: that pool may be gone.
    fn released(&mut self, e: &Event) {
        if let Some(Some(pool)) = self.trace.entry_pool(e) {
            if !self.gone.contains(&pool) {
                self.gone.push(pool);
            }
        }
    }

    /// Whether `release_cached_blocks` would return anything now.
    fn releasable(&self) -> bool {
        let freeable = |pool: Option<PoolId>| pool.is_none_or(|p| self.gone.contains(&p));
        let held = |start: u64, end: u64| {
            self.live
                .range(start..end)
                .filter(|(_, &(_, pending))| !pending)
                .map(|(&a, &(n, _))| (a, a.saturating_add(n.max(1))))
        };
        let whole = self
            .segments
            .iter()
            .any(|(&a, s)| freeable(s.pool) && held(a, a.saturating_add(s.size)).next().is_none());
        whole
            || self.runs().any(|(start, end, piece)| {
                freeable(piece.pool)
                    && has_free_page(start, end, self.pages.page(piece.small), held(start, end))
            })
    }

    /// The mapped pieces joined into runs of one pool and page size, as (start, end, piece).
    fn runs(&self) -> impl Iterator<Item = (u64, u64, Piece)> + '_ {
        let mut pieces = self.mapped.iter().peekable();
        std::iter::from_fn(move || {
            let (&start, &piece) = pieces.next()?;
            let mut end = start.saturating_add(piece.size);
            while let Some((&a, p)) = pieces.peek() {
                if a != end || (p.pool, p.small) != (piece.pool, piece.small) {
                    break;
                }
                end = a.saturating_add(p.size);
                pieces.next();
            }
            Some((start, end, piece))
        })
    }
}

/// Whether the mapped run `start..end`, whose pages of `page` bytes start at `start`, has a page
/// that no block of `held` (its live blocks' extents, in address order) touches.
fn has_free_page(start: u64, end: u64, page: u64, held: impl Iterator<Item = (u64, u64)>) -> bool {
    let fits = |from: u64, to: u64| {
        let first = start + (from - start).div_ceil(page) * page;
        first.checked_add(page).is_some_and(|e| e <= to)
    };
    let mut cursor = start;
    for (a, b) in held {
        if a > cursor && fits(cursor, a) {
            return true;
        }
        cursor = cursor.max(b);
    }
    cursor < end && fits(cursor, end)
}

/// Removes `addr..addr + size` from the mapped pieces, keeping what lies either side.
fn cut(mapped: &mut BTreeMap<u64, Piece>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let overlapping: Vec<(u64, Piece)> = mapped
        .range(..end)
        .rev()
        .take_while(|(&a, p)| a.saturating_add(p.size) > addr)
        .map(|(&a, &p)| (a, p))
        .collect();
    for (a, p) in overlapping {
        mapped.remove(&a);
        let piece_end = a.saturating_add(p.size);
        if a < addr {
            mapped.insert(a, Piece { size: addr - a, ..p });
        }
        if piece_end > end {
            mapped.insert(end, Piece { size: piece_end - end, ..p });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::lifetimes::{live_at_start_of, ooms_without_release, scan, FlushCauses};
    use crate::trace::{text, Block, BlockState, PoolKind, PoolRef, Segment};

    const MIB: u64 = 1 << 20;
    const PAGES: Pages = Pages { small: 2 * MIB, large: 20 * MIB };

    fn trace(src: &str) -> Trace {
        text::read(src.as_bytes(), &Default::default()).unwrap()
    }

    /// The candidates of `t`'s device 0 that prove a capture.
    fn proven(t: &Trace) -> Vec<u64> {
        let events = &t.devices[0].events;
        let lifetimes = scan(events);
        let live = live_at_start_of(t, 0, &lifetimes);
        let candidates = ooms_without_release(events, &FlushCauses::default(), &[]);
        captures_proven(t, 0, events, &lifetimes, &live, &candidates, PAGES)
    }

    #[test]
    fn a_wholly_free_default_segment_proves_a_capture_and_a_live_block_none() {
        let t = trace(
            "segment_alloc 0x10000000 20971520\nalloc 0x10000000 9437184\n\
             alloc 0x10900000 9437184\noom 0 41943040\nfree 0x10000000 9437184\n\
             oom 0 41943040\nfree 0x10900000 9437184\noom 0 41943040\n",
        );
        assert_eq!(proven(&t), vec![9]);
    }

    #[test]
    fn a_free_whose_completion_is_pending_counts_as_done() {
        // The fallback first waits for every pending free: the segment would be free then.
        let t = trace(
            "segment_alloc 0x10000000 20971520\nalloc 0x10000000 9437184\n\
             free_requested 0x10000000 9437184\noom 0 41943040\n\
             free_completed 0x10000000 9437184\n",
        );
        assert_eq!(proven(&t), vec![3]);
    }

    #[test]
    fn a_private_pool_s_free_segment_proves_nothing_until_a_release_names_the_pool() {
        let mut t = trace(
            "segment_alloc 0x10000000 20971520\nalloc 0x10000000 9437184\n\
             segment_alloc 0x20000000 20971520\nalloc 0x20000000 9437184\n\
             free 0x10000000 9437184\noom 0 41943040\nsegment_free 0x10000000 20971520\n\
             free 0x20000000 9437184\noom 0 41943040\n",
        );
        // Every entry but the `oom`s names the graph's pool.
        t.entry_pools = Some(vec![(1, 7)]);
        for e in t.devices[0].events.iter_mut().filter(|e| e.action != Action::Oom) {
            e.pool = PoolRef(1);
        }
        assert_eq!(proven(&t), vec![10]);
        // Where nothing names the pools, the dump's private segment at the address tells it;
        // no release names a pool then, so the pool is never taken to be gone.
        let mut unnamed = t.clone();
        unnamed.entry_pools = None;
        unnamed.devices[0].events.iter_mut().for_each(|e| e.pool = PoolRef::DEFAULT);
        let private = |address| Segment {
            device: 0,
            address,
            total_size: 20 * MIB,
            stream: 0,
            pool: PoolKind::Large,
            is_expandable: false,
            private_pool: Some((1, 7)),
            blocks: vec![Block {
                address,
                size: 20 * MIB,
                requested_size: 0,
                state: BlockState::Inactive,
            }],
        };
        unnamed.segments = vec![private(0x1000_0000), private(0x2000_0000)];
        assert_eq!(proven(&unnamed), Vec::<u64>::new());
        // The same segments in the default pools prove it at both entries.
        unnamed.segments.iter_mut().for_each(|s| s.private_pool = None);
        assert_eq!(proven(&unnamed), vec![6, 10]);
    }

    #[test]
    fn an_expandable_segment_proves_it_by_a_whole_free_page() {
        // Two 20 MiB pages; blocks at 0..15 MiB and 15..25 MiB. With the first freed, no
        // whole page is free (0..15 and 25..40); with both freed, both are.
        let t = trace(
            "segment_map 0x10000000 41943040\nalloc 0x10000000 15728640\n\
             alloc 0x10F00000 10485760\nfree 0x10000000 15728640\noom 0 62914560\n\
             free 0x10F00000 10485760\noom 0 62914560\n",
        );
        assert_eq!(proven(&t), vec![8]);
        // A page unmapped is no longer there to release.
        let t = trace(
            "segment_map 0x10000000 41943040\nalloc 0x10000000 15728640\n\
             segment_unmap 0x10000000 20971520\nalloc 0x11400000 1048576\noom 0 62914560\n",
        );
        assert_eq!(proven(&t), Vec::<u64>::new());
    }

    #[test]
    fn a_warm_snapshot_s_segments_and_blocks_from_before_the_trace_count() {
        // The dump's segment has no event of its own: it was there at the start, holding the
        // block freed in the trace (an orphan), and wholly free after that free.
        let mut t = trace("oom 0 41943040\nfree 0x10000000 9437184\noom 0 41943040\n");
        t.segments = vec![Segment {
            device: 0,
            address: 0x1000_0000,
            total_size: 20 * MIB,
            stream: 0,
            pool: PoolKind::Large,
            is_expandable: false,
            private_pool: None,
            blocks: vec![Block {
                address: 0x1000_0000,
                size: 20 * MIB,
                requested_size: 0,
                state: BlockState::Inactive,
            }],
        }];
        assert_eq!(proven(&t), vec![3]);
    }
}
