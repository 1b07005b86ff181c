//! Greedy by size, how `offline` places its blocks: XLA's `GlobalDecreasingSizeBestFitHeap` over
//! known lifetimes. The parent module's docs give the rules and what each lookup costs.

use super::{Lifetime, NAME};
use crate::error::{Cancel, Result};

/// Places `items` greedily by decreasing size with best fit over lifetime overlaps; returns each
/// item's offset and the peak (the size of the planned range). Placing looks at `cancel`
/// every [`Cancel::EVERY`] blocks and fails once it is raised.
pub fn pack(items: &[Lifetime], cancel: &Cancel) -> Result<(Vec<u64>, u64)> {
    let order = Order::of(items);
    let lookup = if order.mean_overlaps() < LISTING_BELOW {
        Lookup::Listing
    } else {
        Lookup::Tree { cached: ABOVE_CACHED }
    };
    place(items, &order, lookup, cancel)
}

/// How [`place`] looks the placed blocks up.
#[derive(Clone, Copy, Debug)]
enum Lookup {
    /// By listing them ([`IntervalTree`]).
    Listing,
    /// In the segment tree ([`SkylineTree`]), its nodes down to depth `cached` keeping the
    /// union of their ancestors' `cover`.
    Tree { cached: u32 },
}

/// What placing needs before the first block: the greedy order and the sorted lifetime bounds.
/// Its three sorts are independent, so they run in parallel (rayon); what they produce is the
/// same either way.
struct Order {
    /// Item indices, the blocks live over the whole plan first (largest first), then the others
    /// by decreasing size, ties by earlier start, then by index.
    order: Vec<usize>,
    /// How many of `order`'s first entries live over the whole plan.
    whole: usize,
    /// The starts of the other non-empty lifetimes, sorted.
    starts: Vec<u64>,
    /// Their ends, sorted.
    ends: Vec<u64>,
}

impl Order {
    /// The order and bounds of `items`.
    fn of(items: &[Lifetime]) -> Order {
        // Blocks live over the whole plan overlap every other block: they are stacked at the
        // bottom and left out of every overlap query.
        let first = items.iter().map(|i| i.start).min().unwrap_or(0);
        let last = items.iter().map(|i| i.end).max().unwrap_or(0);
        let whole = |i: &Lifetime| i.start == first && i.end == last;
        let queried = || items.iter().filter(|i| i.start < i.end && !whole(i));
        let mut starts: Vec<u64> = queried().map(|i| i.start).collect();
        let mut ends: Vec<u64> = queried().map(|i| i.end).collect();
        let (order, _) = rayon::join(
            || {
                // Where starts never decrease with the index (as `lifetimes` makes them), ties
                // by start then index are ties by index, and the rest of the key fits one u64.
                let by_index = items.windows(2).all(|w| w[0].start <= w[1].start)
                    && items.iter().all(|i| i.block < 1 << 63);
                if by_index {
                    sorted_by(items, |i| (u64::from(!whole(i)) << 63) | ((1 << 63) - 1 - i.block))
                } else {
                    sorted_by(items, |i| (!whole(i), std::cmp::Reverse(i.block), i.start))
                }
            },
            || rayon::join(|| starts.sort_unstable(), || ends.sort_unstable()),
        );
        Order { whole: items.iter().filter(|i| whole(i)).count(), order, starts, ends }
    }

    /// The mean, over the non-empty lifetimes not spanning the plan, of the number of others
    /// among them that overlap it, halved (each block meets about half of its overlaps
    /// already placed): O(n log n), from the sorted starts and ends.
    fn mean_overlaps(&self) -> f64 {
        let (starts, ends) = (&self.starts, &self.ends);
        let n = starts.len();
        // Each lifetime's own start and end stand in for it: not overlapping it are the
        // lifetimes that start at or after its end, or end at or before its start. Summed over
        // all lifetimes, pairs = sum over starts s of (ends after s) - sum over ends e of
        // (starts at or after e), without pairing each start with its own end.
        let mut pairs = 0usize;
        let mut j = 0;
        for &s in starts {
            while j < n && ends[j] <= s {
                j += 1;
            }
            pairs += n - j;
        }
        let mut k = 0;
        for &e in ends {
            while k < n && starts[k] < e {
                k += 1;
            }
            pairs -= n - k;
        }
        // Each lifetime counted itself once (its end lies after its start).
        (pairs - n) as f64 / 2.0 / n.max(1) as f64
    }
}

/// The indices of `items` sorted by `key`, then by index. The keys are held by value while
/// sorting (not looked up through the index), and with the index they are distinct, so an
/// unstable sort gives the one order.
fn sorted_by<K: Ord>(items: &[Lifetime], key: impl Fn(&Lifetime) -> K) -> Vec<usize> {
    let mut keys: Vec<(K, usize)> = items.iter().enumerate().map(|(k, i)| (key(i), k)).collect();
    keys.sort_unstable();
    keys.into_iter().map(|(_, k)| k).collect()
}

/// [`pack`], looking the placed blocks up as `lookup` says.
#[cfg(test)]
fn pack_using(items: &[Lifetime], lookup: Lookup) -> (Vec<u64>, u64) {
    place(items, &Order::of(items), lookup, &Cancel::default()).expect("never cancelled")
}

/// Places `items` in `order`, looking the placed blocks up as `lookup` says, and at `cancel`
/// between chunks of [`Cancel::EVERY`] blocks.
fn place(
    items: &[Lifetime],
    order: &Order,
    lookup: Lookup,
    cancel: &Cancel,
) -> Result<(Vec<u64>, u64)> {
    let mut offsets = vec![0u64; items.len()];
    let mut floor = 0;
    for &i in &order.order[..order.whole] {
        offsets[i] = floor;
        floor += items[i].block;
    }
    let mut peak = floor;
    let mut tree = match lookup {
        Lookup::Listing => Overlaps::Listing(IntervalTree::new(items)),
        Lookup::Tree { cached } => {
            let bounds = clique_points(&order.starts, &order.ends);
            Overlaps::Skyline(SkylineTree::new(&bounds, items, cached))
        }
    };
    let mut found: Vec<(u64, u64)> = Vec::new();
    let rest = &order.order[order.whole..];
    for (c, chunk) in rest.chunks(Cancel::EVERY).enumerate() {
        cancel.check(|| {
            let (done, n) = (order.whole + c * Cancel::EVERY, items.len());
            format!("planning policy '{NAME}' at block {done} of {n}")
        })?;
        place_chunk(items, chunk, floor, &mut peak, &mut tree, &mut found, &mut offsets);
    }
    Ok((offsets, peak))
}

/// Places the blocks `chunk` (in greedy order) above `floor`, raising `peak`; `found` is
/// scratch.
fn place_chunk(
    items: &[Lifetime],
    chunk: &[usize],
    floor: u64,
    peak: &mut u64,
    tree: &mut Overlaps,
    found: &mut Vec<(u64, u64)>,
    offsets: &mut [u64],
) {
    for &i in chunk {
        let it = items[i];
        if it.start >= it.end {
            // An empty lifetime overlaps nothing.
            offsets[i] = floor;
            *peak = (*peak).max(floor + it.block);
            continue;
        }
        match tree {
            Overlaps::Listing(t) => {
                t.occupied(it, found);
                found.sort_unstable_by_key(|&(lo, _)| lo);
            }
            Overlaps::Skyline(t) => t.occupied(i, found),
        }
        let mut cur = floor;
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        for &(lo, hi) in found.iter() {
            if lo > cur {
                let gap = lo - cur;
                if gap >= it.block && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cur));
                    if gap == it.block {
                        break; // no gap fits tighter, and this one is the lowest of its size
                    }
                }
            }
            cur = cur.max(hi);
        }
        let at = best.map_or(cur, |(_, o)| o);
        offsets[i] = at;
        *peak = (*peak).max(at + it.block);
        match tree {
            Overlaps::Listing(t) => t.insert(i, at, it.block),
            Overlaps::Skyline(t) => t.insert(i, at, it.block),
        }
    }
}

/// Below this many overlapping blocks per block (on average), listing them is cheaper than
/// walking the segment tree's O(log n) nodes twice per block.
const LISTING_BELOW: f64 = 48.0;

/// Where the placed blocks are looked up; both give the same offsets (see the parent module's
/// docs).
enum Overlaps {
    Listing(IntervalTree),
    Skyline(SkylineTree),
}

/// XLA's `BufferIntervalTree`: an augmented interval tree over lifetimes (an implicit binary
/// search tree over the items sorted by start, each node holding the largest end placed below
/// it) that lists every placed block overlapping a lifetime.
struct IntervalTree {
    /// Per position (items by start): the item's lifetime.
    spans: Vec<(u64, u64)>,
    /// Per item: its position.
    pos_of: Vec<usize>,
    /// Per position: the largest end of the placed items at or below it.
    max_end: Vec<u64>,
    /// Per position: the placed item's offset range.
    placed: Vec<Option<(u64, u64)>>,
}

impl IntervalTree {
    fn new(items: &[Lifetime]) -> IntervalTree {
        let n = items.len();
        let mut by_start: Vec<usize> = (0..n).collect();
        by_start.sort_by_key(|&i| (items[i].start, i));
        let mut pos_of = vec![0usize; n];
        for (p, &i) in by_start.iter().enumerate() {
            pos_of[i] = p;
        }
        IntervalTree {
            spans: by_start.iter().map(|&i| (items[i].start, items[i].end)).collect(),
            pos_of,
            max_end: vec![0; n],
            placed: by_start.iter().map(|_| None).collect(),
        }
    }

    /// Sets `out` to the offset ranges of the placed items overlapping `it` (unsorted).
    fn occupied(&self, it: Lifetime, out: &mut Vec<(u64, u64)>) {
        out.clear();
        self.collect(0, self.spans.len(), it.start, it.end, out);
    }

    fn collect(&self, lo: usize, hi: usize, s: u64, e: u64, out: &mut Vec<(u64, u64)>) {
        if lo >= hi {
            return;
        }
        let mid = lo + (hi - lo) / 2;
        if self.max_end[mid] <= s {
            return; // nothing placed below ends after s
        }
        self.collect(lo, mid, s, e, out);
        if self.spans[mid].0 < e {
            if let Some(range) = self.placed[mid].filter(|_| self.spans[mid].1 > s) {
                out.push(range);
            }
            self.collect(mid + 1, hi, s, e, out);
        }
    }

    /// Places item `i` of `block` bytes at offset `at`.
    fn insert(&mut self, i: usize, at: u64, block: u64) {
        let p = self.pos_of[i];
        self.placed[p] = Some((at, at + block));
        self.mark(p, self.spans[p].1);
    }

    /// Raises `max_end` along the path down to position `p`.
    fn mark(&mut self, p: usize, end: u64) {
        let (mut lo, mut hi) = (0, self.spans.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            self.max_end[mid] = self.max_end[mid].max(end);
            if p == mid {
                break;
            }
            if p < mid {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
    }
}

/// A segment tree over the plan's time axis (the lifetimes' clique points, as elementary
/// slots) whose nodes hold the offset ranges placed blocks occupy, merged into disjoint sorted
/// runs: `cover` the blocks whose lifetime's canonical decomposition holds the node, `sub` every
/// block stored at the node or below it. The union of `sub` over a query's canonical nodes and
/// `cover` over their strict ancestors is exactly the union of the placed blocks that overlap it
/// in time (see the parent module's docs), in O(log n) sets that stay short because a tight
/// packing merges into few runs.
struct SkylineTree {
    /// Per item: the slots `[l, r)` its lifetime spans, the clique points `t` with
    /// `start <= t < end` (slot k is the k-th clique point, [`clique_points`]).
    slots: Vec<(usize, usize)>,
    /// Leaves: the first power of two at or above the number of slots.
    leaves: usize,
    /// Per node: the runs of blocks stored at it.
    cover: RunLists,
    /// Per inner node (below `leaves`): the runs of blocks stored at it or below it. A leaf's
    /// would be its `cover`, so leaves keep none.
    sub: RunLists,
    /// The depth down to which nodes keep `above` ([`ABOVE_CACHED`] but in tests).
    cached: u32,
    /// Per node at depth `cached` or less: the union of `cover` over its strict ancestors, as
    /// it stood at the stamp `above_at` holds ([`SkylineTree::refresh_above`]).
    above: Vec<Vec<(u64, u64)>>,
    /// Per node at depth `cached` or less: the stamp its `above` was computed at.
    above_at: Vec<u64>,
    /// Per node above depth `cached`: the stamp of the last change to its `cover`.
    changed: Vec<u64>,
    /// Counts the placements.
    stamp: u64,
    /// Scratch for [`SkylineTree::insert`]: canonical nodes.
    nodes: Vec<usize>,
    /// Scratch for [`SkylineTree::occupied`].
    scratch: Vec<(u64, u64)>,
}

impl SkylineTree {
    /// A tree over the clique points `bounds` ([`clique_points`]) of `items`, with no block
    /// placed. Each item's slots are two binary searches, independent of the others: they
    /// are found in parallel (rayon), before the first placement.
    fn new(bounds: &[u64], items: &[Lifetime], cached: u32) -> SkylineTree {
        use rayon::prelude::*;
        let leaves = bounds.len().max(1).next_power_of_two();
        let slot = |t: u64| bounds.partition_point(|&b| b < t);
        SkylineTree {
            slots: items.par_iter().map(|it| (slot(it.start), slot(it.end))).collect(),
            leaves,
            cover: RunLists::new(2 * leaves),
            sub: RunLists::new(leaves),
            cached,
            above: vec![Vec::new(); 2 << cached],
            above_at: vec![0; 2 << cached],
            changed: vec![0; 1 << cached],
            stamp: 0,
            nodes: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// The canonical nodes of slots `[l, r)` (l < r), then their strict ancestors at depth
    /// `deepest` or more, through `visit(node, canonical)`. Those ancestors lie on the paths to
    /// the root from the canonical nodes holding slots `l` and `r - 1` (the lowest on each side),
    /// which it returns.
    fn walk(
        &self,
        l: usize,
        r: usize,
        deepest: u32,
        mut visit: impl FnMut(usize, bool),
    ) -> (usize, usize) {
        let (mut a, mut b) = (l + self.leaves, r + self.leaves);
        // First and last canonical node found from the left end and from the right end.
        let (mut left, mut right) = ((0, 0), (0, 0));
        while a < b {
            if a & 1 == 1 {
                visit(a, true);
                left = (if left.0 == 0 { a } else { left.0 }, a);
                a += 1;
            }
            if b & 1 == 1 {
                b -= 1;
                visit(b, true);
                right = (if right.0 == 0 { b } else { right.0 }, b);
            }
            a >>= 1;
            b >>= 1;
        }
        // The canonical nodes holding slots l and r - 1.
        let at_l = if left.0 != 0 { left.0 } else { right.1 };
        let at_r = if right.0 != 0 { right.0 } else { left.1 };
        let mut x = at_l >> 1;
        while x > 0 && x.ilog2() >= deepest {
            visit(x, false);
            x >>= 1;
        }
        let depth_l = at_l.ilog2();
        let mut y = at_r >> 1;
        // Up to where the path from `at_r` joins the one from `at_l`.
        while y > 0
            && y.ilog2() >= deepest
            && !(y.ilog2() < depth_l && at_l >> (depth_l - y.ilog2()) == y)
        {
            visit(y, false);
            y >>= 1;
        }
        (at_l, at_r)
    }

    /// Sets `out` to the offset runs occupied at some time in item `i`'s (non-empty) lifetime.
    /// They come sorted and merged (touching runs joined).
    fn occupied(&mut self, i: usize, out: &mut Vec<(u64, u64)>) {
        out.clear();
        let (l, r) = self.slots[i];
        let mut scratch = std::mem::take(&mut self.scratch);
        let (at_l, at_r) = self.walk(l, r, self.cached, |v, canonical| {
            let runs =
                if canonical && v < self.leaves { self.sub.get(v) } else { self.cover.get(v) };
            if !runs.is_empty() {
                union_into(out, runs, &mut scratch);
            }
        });
        // The ancestors above depth `cached`, from the cache: those of the node at that depth
        // (or the canonical node itself, if higher) on each path.
        let cached = |v: usize| v >> v.ilog2().saturating_sub(self.cached);
        let (q_l, q_r) = (cached(at_l), cached(at_r));
        for q in [Some(q_l), (q_r != q_l).then_some(q_r)].into_iter().flatten() {
            self.refresh_above(q, &mut scratch);
            if !self.above[q].is_empty() {
                union_into(out, &self.above[q], &mut scratch);
            }
        }
        self.scratch = scratch;
    }

    /// Brings `above` up to date at node `q` (depth `cached` or less) and at its
    /// ancestors, from the top down: a node's list is recomputed from its parent's and the
    /// parent's `cover` when some strict ancestor's `cover` changed since it was computed.
    fn refresh_above(&mut self, q: usize, scratch: &mut Vec<(u64, u64)>) {
        let depth = q.ilog2();
        let mut newest = 0;
        for d in 1..=depth {
            let u = q >> (depth - d);
            let parent = u >> 1;
            newest = newest.max(self.changed[parent]);
            if self.above_at[u] < newest {
                let mut list = std::mem::take(&mut self.above[u]);
                list.clear();
                list.extend_from_slice(&self.above[parent]);
                union_into(&mut list, self.cover.get(parent), scratch);
                self.above[u] = list;
                self.above_at[u] = self.stamp;
            }
        }
    }

    /// Records item `i` (a non-empty lifetime of `block` bytes) as placed at offset `at`.
    fn insert(&mut self, i: usize, at: u64, block: u64) {
        let (l, r) = self.slots[i];
        let range = (at, at + block);
        let mut nodes = std::mem::take(&mut self.nodes);
        nodes.clear();
        self.stamp += 1;
        self.walk(l, r, u32::MAX, |v, canonical| {
            if canonical {
                nodes.push(v)
            }
        });
        for &v in &nodes {
            let changed = self.cover.merge(v, range);
            if changed && v < self.changed.len() {
                self.changed[v] = self.stamp;
            }
            // `sub` of a node holds its children's, so once a node already holds the range,
            // so does every node above it: stop climbing there. A leaf's `sub` is its `cover`.
            let mut x = if v < self.leaves {
                v
            } else if changed {
                v >> 1
            } else {
                0
            };
            while x > 0 && self.sub.merge(x, range) {
                x >>= 1;
            }
        }
        self.nodes = nodes;
    }
}

/// The deepest level of the segment tree whose nodes keep the union of their ancestors'
/// `cover` ([`SkylineTree::refresh_above`]): a query reads the ancestors' `cover` at this depth
/// or below one by one and the rest from that cache. On training traces the long lists are the
/// `cover` of nodes at depths 7 to 12 (blocks that live through a good part of a step), read by
/// most queries but changed far less often. On ctx512-train repeated to 1 M events, caching
/// down to depth 10 / 12 / 14 saves 20% / 33% / 38% of `offline`'s instructions, 12 and 14 at
/// 25 and 81 MB more peak memory, and deeper levels cost more in refreshes than they save; on
/// the synthetic workload, whose upper lists are short, it changes little.
const ABOVE_CACHED: u32 = 12;

/// Sets `acc` to the union of the sorted disjoint runs `acc` and `runs`, touching runs joined
/// (`tmp` is scratch space). Linear in both: a query unions O(log n) short lists this way
/// instead of sorting their concatenation. The run being built is kept in a local and written
/// once complete, and the tail left when one list runs out is copied whole.
fn union_into(acc: &mut Vec<(u64, u64)>, runs: &[(u64, u64)], tmp: &mut Vec<(u64, u64)>) {
    if acc.is_empty() || runs.is_empty() {
        acc.extend_from_slice(runs);
        return;
    }
    if covers(acc, runs) {
        return;
    }
    tmp.clear();
    tmp.reserve(acc.len() + runs.len());
    let (a, b) = (&acc[..], runs);
    let (mut i, mut j) = (0, 0);
    let mut cur = if a[0].0 <= b[0].0 {
        i = 1;
        a[0]
    } else {
        j = 1;
        b[0]
    };
    while i < a.len() && j < b.len() {
        let next = if a[i].0 <= b[j].0 {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        if next.0 <= cur.1 {
            cur.1 = cur.1.max(next.1);
        } else {
            tmp.push(cur);
            cur = next;
        }
    }
    // One list is left: join its runs that touch `cur`; the others cannot touch each other.
    let rest = if i < a.len() { &a[i..] } else { &b[j..] };
    let mut k = 0;
    while k < rest.len() && rest[k].0 <= cur.1 {
        cur.1 = cur.1.max(rest[k].1);
        k += 1;
    }
    tmp.push(cur);
    tmp.extend_from_slice(&rest[k..]);
    std::mem::swap(acc, tmp);
}

/// Whether every run of `runs` lies within one of `acc` (both sorted and disjoint): then
/// [`union_into`] has nothing to add.
fn covers(acc: &[(u64, u64)], runs: &[(u64, u64)]) -> bool {
    let mut i = 0;
    for &(lo, hi) in runs {
        // The only run of `acc` that can hold it is the first one ending at or after `hi`.
        while i < acc.len() && acc[i].1 < hi {
            i += 1;
        }
        if i == acc.len() || acc[i].0 > lo {
            return false;
        }
    }
    true
}

/// The clique points of the non-empty lifetimes whose sorted starts and ends are given, in
/// order: each tick where a run of starts ends (the next bound in time order is an end; at the
/// same tick ends come first, as a lifetime ending at t does not overlap one starting at t).
/// Every set of blocks live together at some tick is live together at one of these, so two
/// non-empty lifetimes overlap exactly when both hold a common clique point, and each holds at
/// least one. The segment tree's time axis needs only these: on the real traces 4–5 times
/// fewer slots than the distinct bounds.
fn clique_points(starts: &[u64], ends: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut j = 0; // the first end after the current start
    for (k, &s) in starts.iter().enumerate() {
        let next_start = starts.get(k + 1).copied();
        if next_start == Some(s) {
            continue; // followed by a start at the same tick
        }
        while j < ends.len() && ends[j] <= s {
            j += 1;
        }
        if ends.get(j).is_some_and(|&e| next_start.is_none_or(|n| e <= n)) {
            out.push(s);
        }
    }
    out
}

/// Sorted disjoint offset runs, one list per tree node, all in one buffer: a list's runs are
/// contiguous, with room for as many as its capacity, and a list that outgrows its room moves to
/// the buffer's end with twice the room (the old room stays unused). Against a `Vec` per node
/// this saves an allocation each time a list grows, and one free per list at the end; the room
/// left behind is at most what the lists use at the end.
struct RunLists {
    /// Per list: where its runs start in `runs`, how many it holds, and how many fit there.
    at: Vec<ListAt>,
    /// Every list's runs and room.
    runs: Vec<(u64, u64)>,
}

/// Where one of [`RunLists`]' lists lies.
#[derive(Clone, Copy, Default)]
struct ListAt {
    start: usize,
    len: u32,
    room: u32,
}

impl RunLists {
    /// `n` empty lists.
    fn new(n: usize) -> RunLists {
        RunLists { at: vec![ListAt::default(); n], runs: Vec::new() }
    }

    /// The runs of list `k`, sorted.
    #[inline]
    fn get(&self, k: usize) -> &[(u64, u64)] {
        let at = self.at[k];
        &self.runs[at.start..at.start + at.len as usize]
    }

    /// Adds `[lo, hi)` to list `k`, merging it with the runs it overlaps or touches; false when
    /// one run already held it (nothing changed).
    #[inline]
    fn merge(&mut self, k: usize, (lo, hi): (u64, u64)) -> bool {
        // Most new runs start in the last run or after it (with room left): settled here,
        // without a call.
        let at = self.at[k];
        if at.len > 0 {
            let end = at.start + at.len as usize - 1;
            let last = &mut self.runs[end];
            if last.0 <= lo && lo <= last.1 {
                let grows = hi > last.1;
                last.1 = last.1.max(hi);
                return grows;
            }
            if last.1 < lo && at.len < at.room {
                self.runs[end + 1] = (lo, hi);
                self.at[k].len += 1;
                return true;
            }
        }
        self.merge_before_last(k, (lo, hi))
    }

    /// [`RunLists::merge`] where the fast cases do not apply.
    #[inline(never)]
    fn merge_before_last(&mut self, k: usize, (lo, hi): (u64, u64)) -> bool {
        let at = self.at[k];
        let len = at.len as usize;
        let runs = &mut self.runs[at.start..at.start + len];
        // First run that ends at or after `lo` (it may touch or overlap the new one).
        let a = match runs.last() {
            Some(&(s, e)) if s <= lo => len - usize::from(e >= lo),
            _ => runs.partition_point(|&(_, e)| e < lo),
        };
        if let Some(&(s, e)) = runs.get(a) {
            if s <= lo && hi <= e {
                return false;
            }
            if hi >= s {
                // Runs a..b start at or before `hi`: they merge into one.
                let mut b = a + 1;
                while b < len && runs[b].0 <= hi {
                    b += 1;
                }
                runs[a] = (lo.min(s), hi.max(runs[b - 1].1));
                if b > a + 1 {
                    runs.copy_within(b.., a + 1);
                    self.at[k].len -= (b - a - 1) as u32;
                }
                return true;
            }
        }
        // It touches nothing: a new run at `a`.
        if at.len == at.room {
            self.move_to_end(k);
        }
        let at = &mut self.at[k];
        at.len += 1;
        let runs = &mut self.runs[at.start..at.start + len + 1];
        if a < len {
            runs.copy_within(a..len, a + 1);
        }
        runs[a] = (lo, hi);
        true
    }

    /// Moves list `k` to the end of the buffer, with twice its room (4 runs at first).
    #[cold]
    fn move_to_end(&mut self, k: usize) {
        let at = self.at[k];
        let room = (2 * at.room).max(4);
        let start = self.runs.len();
        self.runs.resize(start + room as usize, (0, 0));
        self.runs.copy_within(at.start..at.start + at.len as usize, start);
        self.at[k] = ListAt { start, len: at.len, room };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    fn lt(start: u64, end: u64, block: u64) -> Lifetime {
        Lifetime { start, end, block }
    }

    #[test]
    fn greedy_by_size_reaches_the_optimum_on_small_instances() {
        // x (1 KiB) [0,3), y (2 KiB) [1,6), z (2 KiB) [4,8). Live bytes peak at 4 KiB (y + z),
        // so 4 KiB is optimal. Online first fit in trace order would put x at 0, y at 1 KiB and,
        // with x freed, z (2 KiB) not in x's 1 KiB hole but at 3 KiB: 5 KiB.
        // Greedy by size: y at 0; z overlaps y → 2 KiB; x overlaps only y → on top of it, 2 KiB.
        let (offsets, peak) =
            pack(&[lt(0, 3, K), lt(1, 6, 2 * K), lt(4, 8, 2 * K)], &Cancel::default()).unwrap();
        assert_eq!((offsets, peak), (vec![2 * K, 0, 2 * K], 4 * K));
        // a (4K) [0,10) spans the plan: the floor. c (2K) [0,5) → 4K; b (1K) [0,2) → on top,
        // 6K; d (1K) [3,10) overlaps c only → 6K as well (b ended). Peak 7 KiB = a + b + c.
        let (offsets, peak) = pack(
            &[lt(0, 10, 4 * K), lt(0, 2, K), lt(0, 5, 2 * K), lt(3, 10, K)],
            &Cancel::default(),
        )
        .unwrap();
        assert_eq!((offsets, peak), (vec![0, 6 * K, 4 * K, 6 * K], 7 * K));
        // p (3K), q (1K), r (2K) live over the whole plan: stacked first, largest first: p 0,
        // r 3K, q 5K. s (2K) [0,1) and t (1K) [2,9) both sit on that 6 KiB floor (they never
        // overlap). Peak 8 KiB = p + q + r + s at t < 1, so optimal.
        let (offsets, peak) = pack(
            &[lt(0, 9, 3 * K), lt(0, 9, K), lt(0, 9, 2 * K), lt(0, 1, 2 * K), lt(2, 9, K)],
            &Cancel::default(),
        )
        .unwrap();
        assert_eq!(offsets, vec![0, 5 * K, 3 * K, 6 * K, 6 * K]);
        assert_eq!(peak, 8 * K);
    }

    #[test]
    fn best_fit_prefers_the_smallest_gap() {
        // Floor: g1 (1K) [0,10) and g2 (2K) [0,10) separated by holes from blocks that end.
        // Sizes decide order: A 4K [0,10) → 0; B 2K [0,1) → 4K; C 2K [0,10) → 6K;
        // D 1K [0,1) → 8K; E 1K [0,10) → 9K. After t=1, holes: [4K,6K) (2K) and [8K,9K) (1K).
        // F 1K [2,10): fits both; best fit takes the 1 KiB hole at 8K. G 1K [5,11) (which also
        // keeps any block from spanning the whole plan) then finds only the 2 KiB hole: 4K.
        let items = [
            lt(0, 10, 4 * K),
            lt(0, 1, 2 * K),
            lt(0, 10, 2 * K),
            lt(0, 1, K),
            lt(0, 10, K),
            lt(2, 10, K),
            lt(5, 11, K),
        ];
        let (offsets, peak) = pack(&items, &Cancel::default()).unwrap();
        assert_eq!(offsets, vec![0, 4 * K, 6 * K, 8 * K, 9 * K, 8 * K, 4 * K]);
        assert_eq!(peak, 10 * K);
    }

    #[test]
    fn clique_points_stand_for_every_overlap() {
        // x [0,3), y [1,6), z [4,8): x and y are live together at 1 (then x ends at 3), y and z
        // at 4 (then y ends at 6). So the points are 1 and 4; x holds only 1, z only 4 (they
        // never overlap), y both.
        let points = |items: &[Lifetime]| {
            let mut starts: Vec<u64> = items.iter().map(|i| i.start).collect();
            let mut ends: Vec<u64> = items.iter().map(|i| i.end).collect();
            starts.sort_unstable();
            ends.sort_unstable();
            clique_points(&starts, &ends)
        };
        let items = [lt(0, 3, K), lt(1, 6, K), lt(4, 8, K)];
        assert_eq!(points(&items), vec![1, 4]);
        let tree = SkylineTree::new(&points(&items), &items, ABOVE_CACHED);
        assert_eq!(tree.slots, [(0, 1), (0, 2), (1, 2)]);
        // A lifetime ending where another starts does not overlap it: [0,2) and [2,4) are two
        // cliques, not one.
        assert_eq!(points(&[lt(0, 2, K), lt(2, 4, K)]), vec![0, 2]);
        // Starts at the same tick make one point; an end at the next start's tick comes first.
        assert_eq!(points(&[lt(1, 5, K), lt(1, 3, K), lt(3, 6, K)]), vec![1, 3]);
    }

    #[test]
    fn clique_points_are_the_starts_followed_by_an_end() {
        // The definition, on all bounds sorted together (ends first at a tick), against the
        // merge of the separately sorted starts and ends, on random lifetimes with many ties.
        let mut rng = crate::testing::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = |n: u64| rng.below(n);
        for round in 0..300 {
            let items: Vec<(u64, u64)> = (0..1 + next(40))
                .map(|_| {
                    let start = next(30);
                    (start, start + 1 + next(8))
                })
                .collect();
            let mut bounds: Vec<(u64, bool)> =
                items.iter().flat_map(|&(s, e)| [(s, true), (e, false)]).collect();
            bounds.sort_unstable();
            let want: Vec<u64> =
                bounds.windows(2).filter(|w| w[0].1 && !w[1].1).map(|w| w[0].0).collect();
            let mut starts: Vec<u64> = items.iter().map(|i| i.0).collect();
            let mut ends: Vec<u64> = items.iter().map(|i| i.1).collect();
            starts.sort_unstable();
            ends.sort_unstable();
            assert_eq!(clique_points(&starts, &ends), want, "round {round}: {items:?}");
            // The mean overlap count from the same sorted bounds, against counting pairs (no
            // item spans these plans: each starts at 1 or later, and one at 0 ends at 1).
            let mut lts: Vec<Lifetime> = items.iter().map(|&(s, e)| lt(s + 1, e + 1, K)).collect();
            lts.push(lt(0, 1, K));
            let pairs = (0..lts.len())
                .flat_map(|a| (0..lts.len()).map(move |b| (a, b)))
                .filter(|&(a, b)| a != b && lts[a].start < lts[b].end && lts[b].start < lts[a].end)
                .count();
            let mean = pairs as f64 / 2.0 / lts.len() as f64;
            assert_eq!(Order::of(&lts).mean_overlaps(), mean, "round {round}");
        }
    }

    /// The greedy of [`pack`] done the plain way: every placed block whose lifetime overlaps,
    /// sorted by offset, scanned for the smallest gap. `pack`'s tree must find the same offsets.
    fn pack_by_scanning(items: &[Lifetime]) -> (Vec<u64>, u64) {
        let first = items.iter().map(|i| i.start).min().unwrap_or(0);
        let last = items.iter().map(|i| i.end).max().unwrap_or(0);
        let whole = |i: usize| items[i].start == first && items[i].end == last;
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by_key(|&i| (!whole(i), std::cmp::Reverse(items[i].block), items[i].start, i));
        let mut offsets = vec![0; items.len()];
        let mut floor = 0;
        for &i in order.iter().take_while(|&&i| whole(i)) {
            offsets[i] = floor;
            floor += items[i].block;
        }
        let mut peak = floor;
        let mut placed: Vec<usize> = Vec::new();
        for &i in order.iter().skip_while(|&&i| whole(i)) {
            let it = items[i];
            let mut found: Vec<(u64, u64)> = placed
                .iter()
                .filter(|&&j| items[j].start < it.end && items[j].end > it.start)
                .map(|&j| (offsets[j], items[j].block))
                .collect();
            found.sort();
            let (mut cur, mut best) = (floor, None::<(u64, u64)>);
            for (off, size) in found {
                if off > cur && off - cur >= it.block && best.is_none_or(|(g, _)| off - cur < g) {
                    best = Some((off - cur, cur));
                }
                cur = cur.max(off + size);
            }
            offsets[i] = best.map_or(cur, |(_, o)| o);
            peak = peak.max(offsets[i] + it.block);
            placed.push(i);
        }
        (offsets, peak)
    }

    #[test]
    fn union_joins_touching_runs_whichever_list_is_longer() {
        // Runs as sets of unit cells: the union must cover exactly the cells either list
        // covers, sorted, with touching runs joined.
        let cells = |runs: &[(u64, u64)]| -> Vec<u64> {
            let mut c: Vec<u64> = runs.iter().flat_map(|&(lo, hi)| lo..hi).collect();
            c.sort_unstable();
            c.dedup();
            c
        };
        let mut rng = crate::testing::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = |n: u64| rng.below(n);
        for round in 0..500 {
            let mut lists: Vec<Vec<(u64, u64)>> = Vec::new();
            for k in 0..2 {
                // One list long and the other short, either way round, or both alike.
                let mut runs = RunLists::new(1);
                for _ in 0..next(if (round + k) % 3 == 0 { 40 } else { 5 }) {
                    let lo = next(200);
                    runs.merge(0, (lo, lo + 1 + next(6)));
                }
                lists.push(runs.get(0).to_vec());
            }
            let (mut acc, mut tmp) = (lists[0].clone(), Vec::new());
            union_into(&mut acc, &lists[1], &mut tmp);
            let want = cells(&[lists[0].clone(), lists[1].clone()].concat());
            assert_eq!(cells(&acc), want, "round {round}");
            assert!(acc.windows(2).all(|w| w[0].1 < w[1].0), "round {round}: {acc:?}");
            // Each list is now covered: a second union changes nothing.
            let before = acc.clone();
            for list in &lists {
                assert!(covers(&acc, list), "round {round}");
                union_into(&mut acc, list, &mut tmp);
            }
            assert_eq!(acc, before, "round {round}");
            assert!(lists[0].is_empty() || !covers(&[], &lists[0]), "round {round}");
        }
    }

    #[test]
    fn run_lists_hold_exactly_the_merged_ranges() {
        // Ranges merged into several lists in turn (so lists outgrow their room and move while
        // others sit after them), against the set of unit cells each list should cover: same
        // cells, sorted disjoint runs that do not touch, and `merge` says whether cells changed.
        let mut rng = crate::testing::Rng::new(0x2545_f491_4f6c_dd1d);
        let mut next = |n: u64| rng.below(n);
        let mut lists = RunLists::new(5);
        let mut want: Vec<std::collections::BTreeSet<u64>> = vec![Default::default(); 5];
        for round in 0..4000 {
            let k = next(5) as usize;
            let lo = next(if round % 2 == 0 { 300 } else { 60 });
            let hi = lo + 1 + next(8);
            let grew = (lo..hi).fold(false, |grew, c| want[k].insert(c) | grew);
            assert_eq!(lists.merge(k, (lo, hi)), grew, "round {round}");
            let runs = lists.get(k);
            assert!(runs.windows(2).all(|w| w[0].1 < w[1].0), "round {round}: {runs:?}");
            let cells: Vec<u64> = runs.iter().flat_map(|&(lo, hi)| lo..hi).collect();
            assert_eq!(cells, want[k].iter().copied().collect::<Vec<_>>(), "round {round}");
        }
    }

    #[test]
    fn both_lookups_find_the_same_gaps_as_a_plain_scan() {
        // Random lifetimes over a short time axis with few distinct sizes, so blocks overlap a
        // lot, gaps tie and exact fits are common; some live over the whole plan (the floor).
        let mut rng = crate::testing::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: u64| rng.below(n);
        for round in 0..200 {
            let n = 1 + next(120) as usize;
            let items: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let (start, len) =
                        if next(10) == 0 { (0, 60) } else { (next(59), 1 + next(20)) };
                    lt(start, (start + len).min(60), (1 + next(6)) * 256)
                })
                .collect();
            let expected = pack_by_scanning(&items);
            // Starts in index order (as `lifetimes` makes them) take the other sort key.
            let mut by_start = items.clone();
            by_start.sort_by_key(|i| i.start);
            let packed = pack(&by_start, &Cancel::default()).unwrap();
            assert_eq!(packed, pack_by_scanning(&by_start), "round {round}, by start");
            assert_eq!(pack_using(&items, Lookup::Listing), expected, "round {round}, listing");
            // The trees here are at most 7 levels deep: caching fewer levels than that makes
            // queries read some ancestors' `cover` one by one and the rest from the cache.
            for cached in [0, 1, 3, ABOVE_CACHED] {
                let got = pack_using(&items, Lookup::Tree { cached });
                assert_eq!(got, expected, "round {round}, segment tree caching {cached} levels");
            }
        }
    }
}
