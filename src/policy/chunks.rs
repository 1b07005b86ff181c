//! A best-fit, coalescing chunk store shared by `bfc`, `rmm-pool` and `stitch`'s pools.
//!
//! All three model allocators that carve blocks ("chunks" in TF's vocabulary) out of regions
//! obtained from the device, pick the smallest free chunk that fits (lowest address on ties),
//! split off the tail, and merge a freed chunk with free neighbours of the same region. They differ
//! in rounding, when to split, how regions grow and which free lists may serve a request; those
//! rules stay in each policy's file. Here free chunks are kept in one set ordered by
//! `(list, size, addr)` (`free_set.rs`: bucketed by size class, as `pytorch`'s pools are), so a
//! best-fit query is one bucket lookup and every choice is deterministic. `list` separates free
//! lists: RMM's per-stream lists; 0 for a single list.
//!
//! Chunks live in an arena with links to their address neighbours, as TF's `ChunkHandle`s do, so
//! splitting and merging never search by address; a hash map finds a chunk by its address.
//! Regions may have holes (the `stitch` policy unmaps pages of a reservation): chunks are linked,
//! and merge, only when exactly adjacent; merging also needs the same list.

use super::free_set::FreeSet;
use crate::trace::AddrMap;
use crate::trace::{Block, BlockState, PoolKind, Segment};
use std::collections::BTreeMap;

/// The error for a free of an address the policy never handed out (or already took back): the
/// trace and the replay disagree, which is bad input, not a policy bug.
pub(crate) fn unknown_block(policy: &str, addr: u64) -> crate::error::Error {
    crate::error::Error::input(format!("{policy}: free of unknown block {addr:#x}"))
}

/// `value` rounded up to a multiple of `align` (> 0).
pub(crate) fn round_up(value: u64, align: u64) -> u64 {
    // Saturates near 2^64: such a size is refused by every backend, never wrapped to a small one.
    value.div_ceil(align).saturating_mul(align)
}

/// One chunk of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Bytes.
    pub(crate) size: u64,
    /// Base address of the region holding it.
    pub(crate) region: u64,
    /// The free list it belongs to when free (RMM: the stream); its owner when in use.
    pub(crate) list: u64,
    /// Handed out to the caller.
    pub(crate) in_use: bool,
    /// The request it serves (when in use), or served last.
    pub(crate) request: u64,
}

/// A region obtained from the backend (a segment, or a reservation for `stitch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Bytes of address space.
    pub(crate) size: u64,
    /// The stream of the request that created it (shown in segments).
    pub(crate) stream: u64,
    /// Chunks in it.
    chunks: u32,
    /// Chunks in it that are in use.
    in_use: u32,
}

const NONE: u32 = u32::MAX;

/// An arena slot: a chunk, its address and its adjacent neighbours.
#[derive(Clone, Copy, Debug)]
struct Node {
    addr: u64,
    chunk: Chunk,
    prev: u32,
    next: u32,
}

/// The free chunks by (list, size, address): a [`FreeSet`] whose list indices stand for the
/// lists' own values (RMM's streams), numbered on first sight. Lists are few (the streams of one
/// device), so a list's index is found by a scan.
#[derive(Clone, Debug, Default)]
struct FreeChunks {
    lists: Vec<u64>,
    set: FreeSet,
}

impl FreeChunks {
    /// The index of `list`, if it was seen.
    #[inline]
    fn index(&self, list: u64) -> Option<u32> {
        self.lists.iter().position(|&l| l == list).map(|i| i as u32)
    }

    #[inline]
    fn insert(&mut self, list: u64, size: u64, addr: u64) {
        let i = self.index(list).unwrap_or_else(|| {
            self.lists.push(list);
            (self.lists.len() - 1) as u32
        });
        self.set.insert(i, size, addr, 0);
    }

    #[inline]
    fn remove(&mut self, list: u64, size: u64, addr: u64) {
        if let Some(i) = self.index(list) {
            self.set.remove(i, size, addr);
        }
    }

    fn contains(&self, list: u64, size: u64, addr: u64) -> bool {
        self.index(list).and_then(|i| self.set.get(i, size, addr)).is_some()
    }

    /// The first chunk of `list` at or after (size, 0): (address, size).
    #[inline]
    fn first_from(&self, list: u64, size: u64) -> Option<(u64, u64)> {
        let (s, a, _) = self.set.first_from(self.index(list)?, size, 0)?;
        Some((a, s))
    }

    /// The chunks of `list`, smallest first (lowest address on ties): (address, size).
    fn of_list(&self, list: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let i = self.index(list);
        let first = i.and_then(|i| self.set.first_from(i, 0, 0));
        std::iter::successors(first, move |&(s, a, _)| self.set.next_after(i?, s, a))
            .map(|(s, a, _)| (a, s))
    }

    /// The lists holding chunks, in increasing order.
    fn nonempty_lists(&self) -> Vec<u64> {
        let mut out: Vec<u64> = (0..self.lists.len() as u32)
            .filter(|&i| !self.set.list_is_empty(i))
            .map(|i| self.lists[i as usize])
            .collect();
        out.sort_unstable();
        out
    }

    fn len(&self) -> usize {
        self.set.len()
    }
}

/// Regions split into chunks; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct Chunks {
    nodes: Vec<Node>,
    spare: Vec<u32>,
    by_addr: AddrMap<u32>,
    free: FreeChunks,
    regions: BTreeMap<u64, Region>,
    allocated: u64,
    free_bytes: u64,
}

impl Chunks {
    /// Bytes in chunks handed out.
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes in free chunks.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The regions, by base address.
    pub(crate) fn regions(&self) -> &BTreeMap<u64, Region> {
        &self.regions
    }

    /// The chunk starting at `addr`.
    pub(crate) fn get(&self, addr: u64) -> Option<&Chunk> {
        self.by_addr.get(&addr).map(|&i| &self.nodes[i as usize].chunk)
    }

    fn new_node(&mut self, addr: u64, chunk: Chunk, prev: u32, next: u32) -> u32 {
        let node = Node { addr, chunk, prev, next };
        let i = match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.by_addr.insert(addr, i);
        if let Some(r) = self.regions.get_mut(&chunk.region) {
            r.chunks += 1;
        }
        i
    }

    fn drop_node(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        self.by_addr.remove(&n.addr);
        if let Some(r) = self.regions.get_mut(&n.chunk.region) {
            r.chunks -= 1;
        }
        self.spare.push(i);
    }

    /// Records a new region (holding no chunks yet).
    pub(crate) fn add_region(&mut self, base: u64, size: u64, stream: u64) {
        self.regions.insert(base, Region { size, stream, chunks: 0, in_use: 0 });
    }

    /// Adds a free chunk `[addr, addr + size)` of `region` to `list`. The range must have no
    /// chunk adjacent to it in its region (a fresh region, or one whose pages around it are
    /// unmapped). Returns its address.
    pub(crate) fn add_free(&mut self, addr: u64, size: u64, region: u64, list: u64) -> u64 {
        let chunk = Chunk { size, region, list, in_use: false, request: 0 };
        self.new_node(addr, chunk, NONE, NONE);
        self.free.insert(list, size, addr);
        self.free_bytes += size;
        addr
    }

    /// The smallest free chunk on `list` with at least `size` bytes (lowest address on ties).
    pub(crate) fn best_fit(&self, list: u64, size: u64) -> Option<(u64, u64)> {
        self.free.first_from(list, size)
    }

    /// The free chunks of `list`, smallest first.
    pub(crate) fn free_chunks(&self, list: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.of_list(list)
    }

    /// The lists that hold free chunks.
    pub(crate) fn lists(&self) -> Vec<u64> {
        self.free.nonempty_lists()
    }

    /// Hands out the free chunk at `addr` to `owner` (kept in the in-use chunk's `list`, e.g.
    /// the allocating stream): when `split` and it is bigger than `size`, the tail beyond `size`
    /// stays free (on the chunk's list) as a new chunk. Returns the block size (0 when no free
    /// chunk starts at `addr`).
    pub(crate) fn take(
        &mut self,
        addr: u64,
        size: u64,
        request: u64,
        split: bool,
        owner: u64,
    ) -> u64 {
        let Some(&i) = self.by_addr.get(&addr) else { return 0 };
        let n = self.nodes[i as usize];
        if n.chunk.in_use || n.chunk.size < size {
            return 0;
        }
        let c = n.chunk;
        self.free.remove(c.list, c.size, addr);
        self.free_bytes -= c.size;
        let block = if split && c.size > size {
            let rest = c.size - size;
            let tail =
                Chunk { size: rest, region: c.region, list: c.list, in_use: false, request: 0 };
            let t = self.new_node(addr + size, tail, i, n.next);
            if n.next != NONE {
                self.nodes[n.next as usize].prev = t;
            }
            self.nodes[i as usize].next = t;
            self.free.insert(c.list, rest, addr + size);
            self.free_bytes += rest;
            size
        } else {
            c.size
        };
        self.nodes[i as usize].chunk =
            Chunk { size: block, in_use: true, request, list: owner, ..c };
        if let Some(r) = self.regions.get_mut(&c.region) {
            r.in_use += 1;
        }
        self.allocated += block;
        block
    }

    /// Returns the in-use chunk at `addr` to `list`, merging it with free neighbours. Returns
    /// the merged chunk's address, or `None` when no in-use chunk starts at `addr`.
    pub(crate) fn release(&mut self, addr: u64, list: u64) -> Option<u64> {
        let i = *self.by_addr.get(&addr)?;
        let c = &mut self.nodes[i as usize].chunk;
        if !c.in_use {
            return None;
        }
        c.in_use = false;
        c.list = list;
        let (size, region) = (c.size, c.region);
        if let Some(r) = self.regions.get_mut(&region) {
            r.in_use -= 1;
        }
        self.allocated -= size;
        self.free_bytes += size;
        Some(self.merge_free(i))
    }

    /// Merges the free node `i` (not yet in the free set) with free neighbours on its list, then
    /// puts the result in the free set; returns its address.
    fn merge_free(&mut self, mut i: u32) -> u64 {
        let n = self.nodes[i as usize];
        let list = n.chunk.list;
        let mut size = n.chunk.size;
        let p = n.prev;
        if p != NONE {
            let pn = self.nodes[p as usize];
            if !pn.chunk.in_use && pn.chunk.list == list {
                self.free.remove(list, pn.chunk.size, pn.addr);
                size += pn.chunk.size;
                self.nodes[p as usize].next = n.next;
                if n.next != NONE {
                    self.nodes[n.next as usize].prev = p;
                }
                self.drop_node(i);
                i = p;
            }
        }
        let next = self.nodes[i as usize].next;
        if next != NONE {
            let nn = self.nodes[next as usize];
            if !nn.chunk.in_use && nn.chunk.list == list {
                self.free.remove(list, nn.chunk.size, nn.addr);
                size += nn.chunk.size;
                self.nodes[i as usize].next = nn.next;
                if nn.next != NONE {
                    self.nodes[nn.next as usize].prev = i;
                }
                self.drop_node(next);
            }
        }
        let node = &mut self.nodes[i as usize];
        node.chunk.size = size;
        self.free.insert(list, size, node.addr);
        node.addr
    }

    /// Removes the free chunk at `addr` (unmapped, or its region released); returns it.
    pub(crate) fn remove_free(&mut self, addr: u64) -> Option<Chunk> {
        let i = *self.by_addr.get(&addr)?;
        let n = self.nodes[i as usize];
        if n.chunk.in_use {
            return None;
        }
        self.free.remove(n.chunk.list, n.chunk.size, addr);
        self.free_bytes -= n.chunk.size;
        if n.prev != NONE {
            self.nodes[n.prev as usize].next = NONE;
        }
        if n.next != NONE {
            self.nodes[n.next as usize].prev = NONE;
        }
        self.drop_node(i);
        Some(n.chunk)
    }

    /// Removes the first `by` bytes of the free chunk at `addr` (less than its size); the rest
    /// stays free at `addr + by`, with a hole before it. Returns false when there is no such chunk.
    pub(crate) fn trim_front(&mut self, addr: u64, by: u64) -> bool {
        let Some(&i) = self.by_addr.get(&addr) else { return false };
        let n = self.nodes[i as usize];
        if n.chunk.in_use || by == 0 || by >= n.chunk.size {
            return false;
        }
        self.free.remove(n.chunk.list, n.chunk.size, addr);
        let rest = n.chunk.size - by;
        self.free.insert(n.chunk.list, rest, addr + by);
        self.free_bytes -= by;
        if n.prev != NONE {
            self.nodes[n.prev as usize].next = NONE;
        }
        self.by_addr.remove(&addr);
        self.by_addr.insert(addr + by, i);
        let node = &mut self.nodes[i as usize];
        node.addr = addr + by;
        node.chunk.size = rest;
        node.prev = NONE;
        true
    }

    /// Moves every free chunk of list `from` to list `to`, merging as it goes (RMM's
    /// `merge_lists`).
    pub(crate) fn move_list(&mut self, from: u64, to: u64) {
        let moved: Vec<(u64, u64)> = self.free_chunks(from).collect();
        for &(addr, size) in &moved {
            self.free.remove(from, size, addr);
            if let Some(&i) = self.by_addr.get(&addr) {
                self.nodes[i as usize].chunk.list = to;
            }
        }
        // Merge each moved chunk with its neighbours (chunks already on `to` are merged among
        // themselves). A moved chunk absorbed by an earlier one is gone from the map.
        for &(addr, _) in &moved {
            let Some(&i) = self.by_addr.get(&addr) else { continue };
            let c = self.nodes[i as usize].chunk;
            if c.in_use || c.list != to {
                continue;
            }
            // It may be in the free set already, as the result of an earlier merge.
            self.free.remove(to, c.size, addr);
            self.merge_free(i);
        }
    }

    /// True when region `base` holds nothing in use.
    pub(crate) fn region_is_free(&self, base: u64) -> bool {
        self.regions.get(&base).is_some_and(|r| r.in_use == 0)
    }

    /// True when no chunk lies in region `base` (all its pages were unmapped).
    pub(crate) fn region_is_empty(&self, base: u64) -> bool {
        self.regions.get(&base).is_some_and(|r| r.chunks == 0)
    }

    /// Returns every region with nothing in use to the device (`segment_free`), forgetting it;
    /// returns the bytes released.
    pub(crate) fn release_idle_regions<B: crate::backend::Backend>(
        &mut self,
        backend: &mut B,
    ) -> crate::error::Result<u64> {
        let idle: Vec<u64> =
            self.regions.keys().copied().filter(|&b| self.region_is_free(b)).collect();
        let mut released = 0;
        for base in idle {
            if let Some(size) = self.remove_region(base) {
                released += size;
                backend.segment_free(base, size)?;
            }
        }
        Ok(released)
    }

    /// Forgets region `base` and its (free) chunks; returns its size. Call only when
    /// [`Chunks::region_is_free`].
    pub(crate) fn remove_region(&mut self, base: u64) -> Option<u64> {
        let r = *self.regions.get(&base)?;
        if r.chunks > 0 {
            let inside: Vec<u64> = self
                .by_addr
                .iter()
                .filter(|(_, &i)| self.nodes[i as usize].chunk.region == base)
                .map(|(&a, _)| a)
                .collect();
            for a in inside {
                self.remove_free(a);
            }
        }
        self.regions.remove(&base);
        Some(r.size)
    }

    /// Every chunk, in address order.
    fn sorted(&self) -> Vec<(u64, u32)> {
        let mut all: Vec<(u64, u32)> = self.by_addr.iter().map(|(&a, &i)| (a, i)).collect();
        all.sort_unstable();
        all
    }

    /// The regions as PyTorch-style segments with their blocks (`is_expandable` for VMM ranges).
    pub(crate) fn segments(
        &self,
        device: i32,
        pool: PoolKind,
        is_expandable: bool,
    ) -> Vec<Segment> {
        let all = self.sorted();
        self.regions
            .iter()
            .map(|(&base, r)| {
                let lo = all.partition_point(|&(a, _)| a < base);
                let hi = all.partition_point(|&(a, _)| a < base + r.size);
                let blocks: Vec<Block> = all[lo..hi]
                    .iter()
                    .map(|&(a, i)| {
                        let c = self.nodes[i as usize].chunk;
                        Block {
                            address: a,
                            size: c.size,
                            requested_size: c.request,
                            state: if c.in_use {
                                BlockState::ActiveAllocated
                            } else {
                                BlockState::Inactive
                            },
                        }
                    })
                    .collect();
                Segment {
                    device,
                    address: base,
                    total_size: blocks.iter().map(|b| b.size).sum(),
                    stream: r.stream,
                    pool,
                    is_expandable,
                    private_pool: None,
                    blocks,
                }
            })
            .collect()
    }

    /// [`Chunks::check`], then that `counted`, a policy's own running total of region bytes
    /// (called `counter` in the message, the regions `regions`), equals the regions' sizes summed.
    /// Returns that sum for the policy's further checks. Shared by `bfc` and `rmm-pool`.
    pub(crate) fn check_region_total(
        &self,
        counted: u64,
        counter: &str,
        regions: &str,
    ) -> std::result::Result<u64, String> {
        self.check()?;
        let sum: u64 = self.regions.values().map(|r| r.size).sum();
        if sum != counted {
            return Err(format!("{counter} {counted} != sum of {regions} {sum}"));
        }
        Ok(sum)
    }

    /// Checks that chunks lie in their regions without overlap, links join exactly the adjacent
    /// chunks of a region, the free set matches the free chunks, no two free neighbours on one
    /// list were left unmerged, and the counters match.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let all = self.sorted();
        let (mut allocated, mut free_bytes, mut free_count) = (0u64, 0u64, 0usize);
        let mut per_region: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        let mut prev: Option<(u64, u32)> = None;
        for &(a, i) in &all {
            let n = self.nodes[i as usize];
            let c = n.chunk;
            if n.addr != a {
                return Err(format!("chunk {a:#x} is filed under the wrong address"));
            }
            let Some(r) = self.regions.get(&c.region) else {
                return Err(format!("chunk {a:#x} names unknown region {:#x}", c.region));
            };
            if a < c.region || a + c.size > c.region + r.size || c.size == 0 {
                return Err(format!("chunk {a:#x}+{} outside region {:#x}", c.size, c.region));
            }
            let e = per_region.entry(c.region).or_default();
            e.0 += 1;
            e.1 += c.in_use as u32;
            let adjacent = prev.filter(|&(pa, pi)| {
                let p = self.nodes[pi as usize].chunk;
                p.region == c.region && pa + p.size == a
            });
            if let Some((pa, pi)) = prev {
                if pa + self.nodes[pi as usize].chunk.size > a {
                    return Err(format!("chunk {a:#x} overlaps the previous chunk"));
                }
            }
            let linked = n.prev != NONE;
            if linked != adjacent.is_some()
                || adjacent.is_some_and(|(_, pi)| n.prev != pi || self.nodes[pi as usize].next != i)
            {
                return Err(format!("chunk {a:#x}: links disagree with adjacency"));
            }
            if c.in_use {
                allocated += c.size;
            } else {
                free_bytes += c.size;
                free_count += 1;
                if !self.free.contains(c.list, c.size, a) {
                    return Err(format!("free chunk {a:#x} missing from the free set"));
                }
                if let Some((pa, pi)) = adjacent {
                    let p = self.nodes[pi as usize].chunk;
                    if !p.in_use && p.list == c.list {
                        return Err(format!("free chunks {pa:#x} and {a:#x} were not merged"));
                    }
                }
            }
            prev = Some((a, i));
        }
        if free_count != self.free.len() {
            return Err(format!(
                "free set has {} entries for {free_count} chunks",
                self.free.len()
            ));
        }
        if allocated != self.allocated || free_bytes != self.free_bytes {
            return Err(format!(
                "counters allocated {} free {} != recomputed {allocated} {free_bytes}",
                self.allocated, self.free_bytes
            ));
        }
        for (&base, r) in &self.regions {
            let (chunks, in_use) = per_region.get(&base).copied().unwrap_or_default();
            if (chunks, in_use) != (r.chunks, r.in_use) {
                return Err(format!("region {base:#x}: chunk counters disagree"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use std::collections::BTreeSet;

    #[test]
    fn free_chunks_answer_as_an_ordered_set_of_list_size_address() {
        // Lists are raw stream values (large, unordered by first sight); the set must order
        // them by value, as the BTreeSet it replaced did.
        let lists = [0x7f00_0000_1000u64, 0, 0x5500_0000_0000, 7];
        for seed in 0..10 {
            let mut rng = Rng::new(seed);
            let mut set = FreeChunks::default();
            let mut oracle: BTreeSet<(u64, u64, u64)> = BTreeSet::new();
            for step in 0..2000 {
                let list = lists[rng.below(lists.len() as u64) as usize];
                let range = if rng.below(2) == 0 { 8 } else { 1 << 14 };
                let size = 512 * (1 + rng.below(range));
                let addr = 512 * rng.below(1 << 16);
                if rng.below(3) < 2 {
                    set.insert(list, size, addr);
                    oracle.insert((list, size, addr));
                } else if let Some(&k) = oracle.range((list, size, 0)..).next() {
                    set.remove(k.0, k.1, k.2);
                    oracle.remove(&k);
                }
                let want = oracle
                    .range((list, size, 0)..=(list, u64::MAX, u64::MAX))
                    .next()
                    .map(|&(_, s, a)| (a, s));
                assert_eq!(set.first_from(list, size), want, "seed {seed} step {step}");
                assert_eq!(set.len(), oracle.len());
                assert!(set.contains(list, size, addr) == oracle.contains(&(list, size, addr)));
            }
            for list in lists {
                let want: Vec<(u64, u64)> = oracle
                    .range((list, 0, 0)..=(list, u64::MAX, u64::MAX))
                    .map(|&(_, s, a)| (a, s))
                    .collect();
                assert_eq!(set.of_list(list).collect::<Vec<_>>(), want);
            }
            let mut want: Vec<u64> = oracle.iter().map(|k| k.0).collect();
            want.dedup();
            assert_eq!(set.nonempty_lists(), want);
            assert_eq!(set.of_list(12345).count(), 0, "a list never seen is empty");
        }
    }

    #[test]
    fn best_fit_split_and_coalesce() {
        let mut c = Chunks::default();
        c.add_region(0, 1000, 0);
        c.add_free(0, 1000, 0, 0);
        assert_eq!(c.take(0, 100, 90, true, 0), 100);
        assert_eq!(c.take(100, 200, 200, true, 0), 200);
        assert_eq!(c.best_fit(0, 50), Some((300, 700)));
        c.release(0, 0);
        // 100 free at 0, 700 free at 300: best fit for 60 is the 100-byte chunk.
        assert_eq!(c.best_fit(0, 60), Some((0, 100)));
        c.release(100, 0);
        assert_eq!(c.best_fit(0, 1), Some((0, 1000)), "all three merged");
        assert!(c.region_is_free(0));
        c.check().unwrap();
    }

    #[test]
    fn lists_do_not_merge_until_moved() {
        let mut c = Chunks::default();
        c.add_region(0, 300, 0);
        c.add_free(0, 300, 0, 1);
        c.take(0, 100, 100, true, 1);
        c.take(100, 100, 100, true, 1);
        c.release(100, 2);
        assert_eq!(c.lists(), vec![1, 2]);
        assert_eq!(c.best_fit(1, 150), None);
        c.move_list(2, 1);
        assert_eq!(c.best_fit(1, 150), Some((100, 200)));
        c.check().unwrap();
    }
}
