//! What a Kineto trace's addresses and recorded `Total Reserved` say about the segments its
//! allocator held (docs/pytorch-model.md#kineto-addresses).
//!
//! Kineto records no segment, pool or stream: each `[memory]` event has a block's address and
//! size and the allocator's totals after it. Two facts of PyTorch's caching allocator make the
//! addresses speak anyway:
//!
//! - a block lies inside one segment, so two blocks whose address ranges overlap (at different
//!   times) lie in the same segment; [`shared_segments`] finds, from the window's requests, which
//!   blocks live before the trace shared a segment, and how far that segment reached at least;
//! - a request that made the recorded reserve grow by `Δ` made a new segment of `Δ` bytes, and
//!   its block is that segment's first (a new segment's first block starts at its base). Later
//!   requests whose addresses fall in it were served from it, in its pool and on its stream. Such
//!   a request grew although a segment made in the window had, by its recorded blocks, a free
//!   gap large enough for it: that segment was in a pool (or on a stream) the request could not
//!   take from, such as a CUDA graph's private pool. [`infer_pools`] groups segments so and
//!   names each group but the first a private pool of its own, in every request made into it.
//!   (The `pytorch` policy places such a pool's blocks apart but releases its free segments as a
//!   stream's: the addresses cannot tell a live graph's pool from another stream.)
//!
//! Both are inferences from untrusted numbers: hostile addresses, overlapping ranges and huge
//! counts are bounded (segments tracked, groups, and the work of looking for free gaps), and a
//! contradiction leaves things as they were rather than failing the read.

use crate::trace::lifetimes::LiveBlock;
use crate::trace::{Action, Event, PoolId, PoolRef, RecordedTotals};
use std::collections::{BTreeMap, HashMap};

/// Requests of at most this many bytes are served from the small pool (`kSmallSize`).
const SMALL_SIZE: u64 = 1 << 20;

/// The most segments [`infer_pools`] follows at once, and the most groups it names.
const MAX_SEGMENTS: usize = 1 << 16;
const MAX_GROUPS: u16 = 64;

/// The most recorded blocks [`infer_pools`] looks at while looking for free gaps, all requests
/// together, so a long trace costs a bounded amount.
const MAX_GAP_WORK: u64 = 1 << 26;

/// The pool every inferred group after the first is named (`(INFERRED_POOL, group)`): no pool
/// id PyTorch hands out (graph pools are `(0, n)` or `(1, n)`).
pub const INFERRED_POOL: u64 = u64::MAX;

/// The starts of the ranges in `map` (keyed by start, `end_of` giving each one's end, none
/// overlapping another) that overlap `[start, end)`, highest first.
fn overlapping<V>(
    map: &BTreeMap<u64, V>,
    start: u64,
    end: u64,
    end_of: impl Fn(&V) -> u64,
) -> Vec<u64> {
    map.range(..end).rev().take_while(|(_, v)| end_of(v) > start).map(|(&s, _)| s).collect()
}

/// A segment made in the window, as the recording shows it.
struct Made {
    end: u64,
    group: u16,
    small: bool,
    /// Its recorded blocks live now: start -> end.
    live: BTreeMap<u64, u64>,
}

/// What [`infer_pools`] knows of the memory at one point of the window.
#[derive(Default)]
struct Known {
    /// The segments made in the window, by base.
    made: BTreeMap<u64, Made>,
    /// Recorded block address -> base of the segment made in the window it lies in (where
    /// that segment is gone, a stale entry its free removes).
    in_made: HashMap<u64, u64>,
    /// Blocks freed in memory the trace did not see made (so in the default pools, where
    /// nothing was routed elsewhere), free since: start -> (end, small pool).
    free: BTreeMap<u64, (u64, bool)>,
    /// The sizes of `free`, for the small pool and the large, with how many of each.
    free_sizes: [BTreeMap<u64, u32>; 2],
    /// Blocks of `work` left to look at for free gaps.
    work: u64,
}

impl Known {
    /// Forgets the free blocks outside made segments that overlap `[start, end)`.
    fn occupy(&mut self, start: u64, end: u64) {
        for s in overlapping(&self.free, start, end, |&(e, _)| e) {
            if let Some((e, small)) = self.free.remove(&s) {
                let sizes = &mut self.free_sizes[usize::from(small)];
                if let Some(n) = sizes.get_mut(&(e - s)) {
                    *n -= 1;
                    if *n == 0 {
                        sizes.remove(&(e - s));
                    }
                }
            }
        }
    }

    /// A release: the segments with nothing live went back, those of every group (a group may
    /// be another stream of the default pools, whose free segments a flush releases; a graph's
    /// pool is read so too, docs/pytorch-model.md#kineto-addresses), and any free block outside
    /// the made segments may have gone with its segment.
    /// Past the budget of work, every segment is forgotten instead.
    fn release(&mut self) {
        match self.work.checked_sub(self.made.len() as u64) {
            Some(left) => {
                self.work = left;
                self.made.retain(|_, m| !m.live.is_empty());
            }
            None => self.made.clear(),
        }
        self.free.clear();
        self.free_sizes = Default::default();
    }

    /// The group a request of `size` bytes (`small`: the small pool's) that made a new segment
    /// was made into: the first of the `groups + 1` known (or a new one) in which no free
    /// block of `size` bytes shows, which the request would have taken from its own pool.
    fn group_for(&mut self, size: u64, small: bool, groups: u16) -> u16 {
        let mut excluded = vec![false; usize::from(groups) + 1];
        excluded[0] = self.free_sizes[usize::from(small)].range(size..).next().is_some();
        for (&base, m) in &self.made {
            let Some(left) = self.work.checked_sub(1) else { return 0 };
            self.work = left;
            if m.small != small || excluded[usize::from(m.group)] {
                continue;
            }
            let Some(left) = self.work.checked_sub(m.live.len() as u64) else { return 0 };
            self.work = left;
            let mut pos = base;
            let mut fits = false;
            for (&start, &end) in &m.live {
                if start.saturating_sub(pos) >= size {
                    fits = true;
                    break;
                }
                pos = pos.max(end);
            }
            if fits || m.end.saturating_sub(pos) >= size {
                excluded[usize::from(m.group)] = true;
            }
        }
        match excluded.iter().position(|&x| !x) {
            Some(g) => g as u16,
            None if groups < MAX_GROUPS => groups + 1,
            None => 0,
        }
    }
}

/// Groups the requests of one device's `events` (with their recorded `totals`, one each) into
/// pools, by the segments their addresses fall in; see the module docs. Each request made into
/// a group other than the first gets `PoolRef(group)`, naming pool `(INFERRED_POOL, group)`.
/// Returns how many groups past the first were named (0: every request is left in the default
/// pools, and no event is changed).
///
/// A request that grew the reserve and could not have been served in the first group (a free
/// block of its size shows there) starts a group, or joins the first later one where none
/// shows. Memory the trace did not see made (the cache it started with) is the first group's.
pub fn infer_pools(events: &mut [Event], totals: &[RecordedTotals]) -> u16 {
    if events.len() != totals.len() {
        return 0;
    }
    let mut known = Known { work: MAX_GAP_WORK, ..Known::default() };
    let mut groups = 0u16;
    let mut before = totals.first().map_or(0, |t| t.reserved);
    for (e, t) in events.iter_mut().zip(totals) {
        let delta = i128::from(t.reserved) - i128::from(before);
        before = t.reserved;
        if delta < 0 {
            known.release();
        }
        let small = e.size <= SMALL_SIZE;
        match e.action {
            Action::Alloc if e.size > 0 => {}
            Action::FreeCompleted | Action::FreeRequested => {
                match known.in_made.remove(&e.addr) {
                    Some(base) => {
                        if let Some(m) = known.made.get_mut(&base) {
                            m.live.remove(&e.addr);
                        }
                    }
                    None if known.free.len() < MAX_SEGMENTS => {
                        let Some(end) = e.addr.checked_add(e.size.max(1)) else { continue };
                        known.occupy(e.addr, end);
                        known.free.insert(e.addr, (end, small));
                        *known.free_sizes[usize::from(small)].entry(end - e.addr).or_default() += 1;
                    }
                    None => {}
                }
                continue;
            }
            _ => continue,
        }
        let Some(end) = e.addr.checked_add(e.size) else { continue };
        known.occupy(e.addr, end);
        let grew = u64::try_from(delta).unwrap_or(0);
        if grew >= e.size && known.made.len() < MAX_SEGMENTS {
            if let Some(seg_end) = e.addr.checked_add(grew) {
                let group = known.group_for(e.size, small, groups);
                groups = groups.max(group);
                // A new segment over an old one's addresses shows the old one was released.
                known.occupy(e.addr, seg_end);
                for b in overlapping(&known.made, e.addr, seg_end, |m| m.end) {
                    known.made.remove(&b);
                }
                let live = BTreeMap::new();
                known.made.insert(e.addr, Made { end: seg_end, group, small, live });
            }
        }
        let Some((&base, m)) = known.made.range_mut(..=e.addr).next_back() else { continue };
        if e.addr >= m.end {
            continue;
        }
        m.live.insert(e.addr, end);
        known.in_made.insert(e.addr, base);
        if m.group > 0 {
            e.pool = PoolRef(m.group);
        }
    }
    groups
}

/// The pools [`infer_pools`] names for `groups` groups past the first, in [`PoolRef`] order.
pub fn inferred_pools(groups: u16) -> Vec<PoolId> {
    (1..=u64::from(groups)).map(|g| (INFERRED_POOL, g)).collect()
}

/// A segment blocks live before the trace shared, as far as the window's requests show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedSegment {
    /// The lowest recorded address known to lie in it.
    pub start: u64,
    /// One past the highest.
    pub end: u64,
    /// The blocks live at the start that lie in it (indices into the list given), in address
    /// order.
    pub blocks: Vec<usize>,
}

/// Which of the blocks `live` before one device's `events` shared a segment, and how far that
/// segment reached at least: blocks and requests whose address ranges overlap lie in one
/// segment. Only requests before the first fall of the recorded reserve (`totals`), that did
/// not make it grow, are looked at: until a release, no segment the trace started with is gone,
/// and a request that grew made a segment of its own. A segment is returned where it holds two
/// blocks live at the start or reaches past the one it holds; blocks whose ranges overlap each
/// other (a recording that contradicts itself) give none. Blocks not freed in the trace are
/// left out: their addresses are not recorded. So are segments of small-pool blocks: a 2 MiB
/// segment holds more than the blocks the trace frees, and what else it held is not known
/// (blocks live throughout, or free), so they are left to be packed as a cold start packs them.
///
/// Every segment returned is covered end to end by the blocks and requests that joined it
/// (ranges join only where they overlap), so no byte of it is a guess but the rounding of its
/// size and where its base lies.
pub fn shared_segments(
    live: &[LiveBlock],
    events: &[Event],
    totals: &[RecordedTotals],
) -> Vec<SharedSegment> {
    if events.len() != totals.len() {
        return Vec::new();
    }
    // start -> (end, live blocks in it).
    let mut spans: BTreeMap<u64, (u64, Vec<usize>)> = BTreeMap::new();
    let mut order: Vec<usize> = (0..live.len()).collect();
    order.sort_by_key(|&k| live[k].addr);
    let mut last_end = 0u64;
    // Only blocks the trace frees have an address and size it records (a Kineto trace's
    // memory that no event frees is one opaque block of no real address).
    for k in order.into_iter().filter(|&k| live[k].freed_in_trace) {
        let b = &live[k];
        let Some(end) = b.addr.checked_add(b.size.max(1)) else { continue };
        if b.addr < last_end {
            // Overlapping live blocks: the recording contradicts itself there.
            return Vec::new();
        }
        last_end = end;
        spans.insert(b.addr, (end, vec![k]));
    }
    let mut before = totals.first().map_or(0, |t| t.reserved);
    for (e, t) in events.iter().zip(totals) {
        let prev = std::mem::replace(&mut before, t.reserved);
        if t.reserved < prev {
            break;
        }
        if e.action != Action::Alloc || e.size == 0 || t.reserved > prev {
            continue;
        }
        let Some(end) = e.addr.checked_add(e.size) else { continue };
        let touched = overlapping(&spans, e.addr, end, |(s_end, _)| *s_end);
        let Some(&lowest) = touched.last() else { continue };
        let mut merged = (end, Vec::new());
        for s in &touched {
            let (s_end, blocks) = spans.remove(s).unwrap_or_default();
            merged.0 = merged.0.max(s_end);
            merged.1.extend(blocks);
        }
        spans.insert(lowest.min(e.addr), merged);
    }
    spans
        .into_iter()
        .filter_map(|(start, (end, mut blocks))| {
            let reaches_past = blocks.len() == 1 && {
                let b = &live[blocks[0]];
                start < b.addr || end > b.addr + b.size.max(1)
            };
            blocks.sort_by_key(|&k| live[k].addr);
            let large = blocks.iter().all(|&k| live[k].size > SMALL_SIZE);
            let shows = blocks.len() > 1 || reaches_past;
            (large && shows).then_some(SharedSegment { start, end, blocks })
        })
        .collect()
}

/// For each of one device's `events`, whether it is a request the recorded addresses show was
/// served from a segment made in the window rather than from the cache the trace started with:
/// its range lies in `[addr, addr + Δ)` of an earlier request that grew the recorded reserve by
/// `Δ` (a new segment's first block starts at its base). Only requests before the first fall
/// of the reserve are told (a release may have given back made segments, and later ones may lie
/// where they were); every other event is `false`, as are all where the totals do not match.
pub fn served_from_made(events: &[Event], totals: &[RecordedTotals]) -> Vec<bool> {
    let mut out = vec![false; events.len()];
    if events.len() != totals.len() {
        return out;
    }
    // base -> end of the segments made so far.
    let mut made: BTreeMap<u64, u64> = BTreeMap::new();
    let mut before = totals.first().map_or(0, |t| t.reserved);
    for ((e, t), told) in events.iter().zip(totals).zip(&mut out) {
        let prev = std::mem::replace(&mut before, t.reserved);
        if t.reserved < prev {
            break;
        }
        if e.action != Action::Alloc || e.size == 0 {
            continue;
        }
        let Some(end) = e.addr.checked_add(e.size) else { continue };
        let grew = t.reserved - prev;
        if grew >= e.size {
            if let Some(seg_end) = e.addr.checked_add(grew) {
                made.insert(e.addr, seg_end);
            }
            continue;
        }
        *told = made.range(..=e.addr).next_back().is_some_and(|(_, &seg_end)| end <= seg_end);
    }
    out
}

/// Address ranges of the cache a warm trace started with that its large requests took, each
/// within one free segment of that cache: the window's requests for more than 1 MiB that did
/// not make the recorded reserve grow, before its first fall, whose ranges neither meet a block
/// live at the start (those are [`shared_segments`]' business) nor a segment made in the window
/// (a request that grew by `Δ` made `[addr, addr + Δ)`). Requests whose ranges overlap lie in
/// one segment, so each range returned (start, end, the stream of its first request) is the
/// least extent of a segment the cache held free, or held with blocks live throughout that the
/// trace does not show. Distinct ranges may still have lain in one segment: only overlap proves
/// sharing. Empty where the totals do not match the events or the recording contradicts
/// itself (blocks live at once that overlap).
pub fn cached_spans(
    live: &[LiveBlock],
    events: &[Event],
    totals: &[RecordedTotals],
) -> Vec<(u64, u64, u64)> {
    /// What a range of addresses is known to hold.
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Held {
        /// Only requests served from the cache the trace started with.
        Cache,
        /// A block live at the start, or a segment made in the window, or a small request.
        Other,
    }
    if events.len() != totals.len() {
        return Vec::new();
    }
    // start -> (end, what it holds, stream of its first request).
    let mut spans: BTreeMap<u64, (u64, Held, u64)> = BTreeMap::new();
    for b in live.iter().filter(|b| b.freed_in_trace) {
        let Some(end) = b.addr.checked_add(b.size.max(1)) else { continue };
        if spans.range(..end).next_back().is_some_and(|(_, &(e, _, _))| e > b.addr) {
            return Vec::new();
        }
        spans.insert(b.addr, (end, Held::Other, b.stream));
    }
    let mut before = totals.first().map_or(0, |t| t.reserved);
    for (e, t) in events.iter().zip(totals) {
        let prev = std::mem::replace(&mut before, t.reserved);
        if t.reserved < prev {
            break;
        }
        if e.action != Action::Alloc || e.size == 0 {
            continue;
        }
        let grew = t.reserved - prev;
        let (end, held) = match grew {
            0 => (e.addr.checked_add(e.size), Held::Cache),
            g => (e.addr.checked_add(g.max(e.size)), Held::Other),
        };
        let Some(end) = end else { continue };
        let held = if e.size <= SMALL_SIZE { Held::Other } else { held };
        let touched = overlapping(&spans, e.addr, end, |&(s_end, _, _)| s_end);
        let mut merged = (end, held, e.stream);
        let mut start = e.addr;
        for s in touched {
            let Some((s_end, s_held, stream)) = spans.remove(&s) else { continue };
            merged = (merged.0.max(s_end), merged.1.max(s_held), stream);
            start = start.min(s);
        }
        spans.insert(start, merged);
    }
    spans
        .into_iter()
        .filter(|(_, (_, held, _))| *held == Held::Cache)
        .map(|(start, (end, _, stream))| (start, end, stream))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    fn alloc(addr: u64, size: u64) -> Event {
        Event::new(Action::Alloc, addr, size, 0, 0)
    }

    fn free(addr: u64, size: u64) -> Event {
        Event::new(Action::FreeCompleted, addr, size, 0, 0)
    }

    fn reserves(r: &[u64]) -> Vec<RecordedTotals> {
        r.iter().map(|&reserved| RecordedTotals { allocated: 0, reserved }).collect()
    }

    #[test]
    fn a_request_that_grew_beside_a_free_block_it_fits_was_made_into_another_pool() {
        let (a, b, c) = (0x1000 * MIB, 0x2000 * MIB, 0x3000 * MIB);
        let mut events = vec![
            alloc(0x10 * MIB, 4 * MIB),     // event 0: its growth is not seen
            alloc(a, 100 * MIB),            // grows: a segment of the first group
            free(a, 100 * MIB),             // its block is free in it
            alloc(b, 100 * MIB),            // grows beside it: another pool
            alloc(a, 60 * MIB),             // lands in the first segment: the first group
            alloc(b + 100 * MIB, 40 * MIB), // not in a known segment: the default pools
            alloc(c, 30 * MIB),             // grows; 40 MiB free in the first group: the second's
        ];
        let totals = reserves(&[500, 600, 600, 700, 700, 700, 730].map(|m| m * MIB));
        assert_eq!(infer_pools(&mut events, &totals), 1);
        let pools: Vec<u16> = events.iter().map(|e| e.pool.0).collect();
        assert_eq!(pools, [0, 0, 0, 1, 0, 0, 1]);
        assert_eq!(inferred_pools(2), [(INFERRED_POOL, 1), (INFERRED_POOL, 2)]);
    }

    #[test]
    fn a_release_forgets_every_group_s_segments_with_nothing_live() {
        // The second group's segment is free at the fall of the reserve: a flush releases it
        // as another stream's, so a request that later grows beside the first group's free
        // block joins the second group again rather than starting a third.
        let (a, b, c, d, x) =
            (0x1000 * MIB, 0x2000 * MIB, 0x3000 * MIB, 0x4000 * MIB, 0x5000 * MIB);
        let mut events = vec![
            alloc(0x10 * MIB, 4 * MIB),
            alloc(a, 100 * MIB), // grows: the first group
            free(a, 100 * MIB),
            alloc(b, 100 * MIB), // grows beside it: the second group
            free(b, 100 * MIB),
            alloc(x, 512), // the reserve fell (both released), then grew by a small segment
            alloc(c, 100 * MIB), // grows: the first group
            free(c, 100 * MIB),
            alloc(d, 100 * MIB), // grows beside it: the second group
        ];
        let totals = reserves(&[500, 600, 600, 700, 700, 502, 602, 602, 702].map(|m| m * MIB));
        assert_eq!(infer_pools(&mut events, &totals), 1);
        let pools: Vec<u16> = events.iter().map(|e| e.pool.0).collect();
        assert_eq!(pools, [0, 0, 0, 1, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn a_free_block_of_memory_the_trace_started_with_tells_a_pool_too() {
        // A block the trace did not see made is freed; a request of its size grows.
        let mut events =
            vec![alloc(0, 100 * MIB), free(0, 100 * MIB), alloc(0x100 * MIB, 100 * MIB)];
        let totals = reserves(&[500 * MIB, 500 * MIB, 600 * MIB]);
        assert_eq!(infer_pools(&mut events, &totals), 1);
        assert_eq!(events[2].pool, PoolRef(1));
        // After a release the free block may be gone with its segment: nothing is told.
        let mut events = vec![alloc(0, 100 * MIB), free(0, 100 * MIB), alloc(1, 512)];
        events.push(alloc(0x100 * MIB, 100 * MIB));
        let totals = reserves(&[500 * MIB, 500 * MIB, 400 * MIB, 500 * MIB]);
        assert_eq!(infer_pools(&mut events, &totals), 0);
        assert!(events.iter().all(|e| e.pool == PoolRef::DEFAULT));
    }

    #[test]
    fn hostile_addresses_and_totals_neither_panic_nor_grow_without_bound() {
        let mut events = Vec::new();
        let mut totals = Vec::new();
        for k in 0..3 * MAX_SEGMENTS as u64 {
            let addr = u64::MAX - (k % 7) * 512;
            events.push(alloc(addr, u64::MAX / (1 + k % 3)));
            events.push(free(addr ^ k, u64::MAX));
            totals.extend(reserves(&[k * MIB, u64::MAX - k]));
        }
        let groups = infer_pools(&mut events, &totals);
        assert!(groups <= MAX_GROUPS);
        // Totals that do not match the events are not read.
        assert_eq!(infer_pools(&mut events, &totals[1..]), 0);
        let live =
            [LiveBlock { addr: u64::MAX - 512, size: u64::MAX, stream: 0, freed_in_trace: true }];
        assert_eq!(shared_segments(&live, &events, &totals), []);
    }

    #[test]
    fn blocks_that_a_request_overlaps_shared_a_segment_at_least_that_wide() {
        let live = |addr, size| LiveBlock { addr, size, stream: 0, freed_in_trace: true };
        let blocks = [
            live(0, 100 * MIB),
            live(100 * MIB, 100 * MIB),
            live(400 * MIB, 50 * MIB),
            live(600 * MIB, 4 * KIB), // small pool: left alone
            LiveBlock { freed_in_trace: false, ..live(0, 900 * MIB) }, // opaque: no address
        ];
        let events = [
            free(0, 100 * MIB),
            free(100 * MIB, 100 * MIB),
            alloc(0, 180 * MIB), // over both: one segment of 200 MiB at least
            alloc(420 * MIB, 60 * MIB), // past the third: its segment reaches 480 MiB
            alloc(600 * MIB, 8 * KIB),
        ];
        let totals = reserves(&[900 * MIB; 5]);
        let shared = shared_segments(&blocks, &events, &totals);
        let want = [
            SharedSegment { start: 0, end: 200 * MIB, blocks: vec![0, 1] },
            SharedSegment { start: 400 * MIB, end: 480 * MIB, blocks: vec![2] },
        ];
        assert_eq!(shared, want);
        // A request that grew made a segment of its own; one after a release may lie where a
        // released segment was: neither joins.
        let grown = reserves(&[900 * MIB, 900 * MIB, 1080 * MIB, 1140 * MIB, 1140 * MIB]);
        assert_eq!(shared_segments(&blocks, &events, &grown), []);
        let released = reserves(&[900 * MIB, 700 * MIB, 700 * MIB, 700 * MIB, 700 * MIB]);
        assert_eq!(shared_segments(&blocks, &events, &released), []);
        // Blocks live at once whose ranges overlap: the recording contradicts itself.
        assert_eq!(shared_segments(&[live(0, 2 * MIB), live(MIB, 2 * MIB)], &events, &totals), []);
    }

    #[test]
    fn requests_the_cache_served_show_its_segments_by_where_they_landed() {
        let live = [LiveBlock { addr: 0, size: 40 * MIB, stream: 0, freed_in_trace: true }];
        let events = [
            alloc(100 * MIB, 86 * MIB), // from the cache: a segment of 86 MiB at least
            free(100 * MIB, 86 * MIB),
            alloc(100 * MIB, 54 * MIB), // the same segment, split
            alloc(190 * MIB, 20 * MIB), // overlaps nothing cached yet: its own range...
            alloc(184 * MIB, 8 * MIB),  // ...until this one joins the two
            alloc(300 * MIB, 30 * MIB), // grew: a segment the window made (300..330)
            alloc(310 * MIB, 12 * MIB), // within it: not the cache's
            alloc(10 * MIB, 20 * MIB),  // over a block live at the start: shared_segments'
            alloc(500 * MIB, 4 * KIB),  // small pool: left alone
            alloc(600 * MIB, 24 * MIB), // on stream 3
        ];
        let mut events = events.to_vec();
        events[9].stream = 3;
        let mut reserved = [900 * MIB; 10];
        for r in &mut reserved[5..] {
            *r += 30 * MIB;
        }
        let spans = cached_spans(&live, &events, &reserves(&reserved));
        assert_eq!(spans, [(100 * MIB, 210 * MIB, 0), (600 * MIB, 624 * MIB, 3)]);
        // A request after the first fall of the reserve is not read (a release may have made
        // room for a new segment where a cached one was); totals that do not match, nothing.
        let mut fell = reserved;
        fell[9] = 800 * MIB;
        assert_eq!(cached_spans(&live, &events, &reserves(&fell)), [(100 * MIB, 210 * MIB, 0)]);
        assert_eq!(cached_spans(&live, &events, &reserves(&reserved[1..])), []);
        // Made segments' requests are told apart from the cache's, until the first fall.
        let told = served_from_made(&events, &reserves(&reserved));
        assert_eq!(told, [false, false, false, false, false, false, true, false, false, false]);
        let mut past = events.clone();
        past.push(alloc(305 * MIB, 4 * MIB));
        let mut totals = reserved.to_vec();
        totals.push(100 * MIB);
        assert!(!served_from_made(&past, &reserves(&totals))[10]);
    }
}
