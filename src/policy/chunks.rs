//! A best-fit, coalescing chunk store shared by `bfc`, `rmm-pool` and `stitch`'s pools.
//!
//! All three model allocators that carve blocks ("chunks" in TF's vocabulary) out of regions
//! obtained from the device, pick the smallest free chunk that fits (lowest address on ties),
//! split off the tail, and merge a freed chunk with free neighbours of the same region. They differ
//! in rounding, when to split, how regions grow and which free lists may serve a request; those
//! rules stay in each policy's file. Here free chunks are kept in one ordered set keyed by
//! `(list, size, addr)`, so a best-fit query is one range lookup and every choice is
//! deterministic. `list` separates free lists: RMM's per-stream lists; 0 for a single list.
//!
//! Regions may have holes (the `stitch` policy unmaps pages of a reservation): chunks merge only
//! when they are exactly adjacent, in the same region and on the same list.

use crate::trace::{Block, BlockState, PoolKind, Segment};
use std::collections::{BTreeMap, BTreeSet};

/// Parses a boolean option value (`true`/`false`, `1`/`0`, any case), naming `key` on error.
pub fn parse_bool(key: &str, value: &str) -> crate::error::Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(crate::error::Error::usage(format!(
            "option '{key}': expected true or false, got '{value}'"
        ))),
    }
}

/// The error for an option key a policy does not know, listing the ones it accepts.
pub fn unknown_option(policy: &str, key: &str, accepted: &str) -> crate::error::Error {
    crate::error::Error::usage(format!(
        "unknown option '{key}' for {policy} (accepted: {accepted})"
    ))
}

/// `value` rounded up to a multiple of `align` (> 0).
pub fn round_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

/// One chunk of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Bytes.
    pub size: u64,
    /// Base address of the region holding it.
    pub region: u64,
    /// The free list it belongs to when free (RMM: the stream).
    pub list: u64,
    /// Handed out to the caller.
    pub in_use: bool,
    /// The request it serves (when in use), or served last.
    pub request: u64,
}

/// A region obtained from the backend (a segment, or a reservation for `stitch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Bytes of address space.
    pub size: u64,
    /// The stream of the request that created it (shown in segments).
    pub stream: u64,
}

/// Regions split into chunks; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct Chunks {
    chunks: BTreeMap<u64, Chunk>,
    free: BTreeSet<(u64, u64, u64)>,
    regions: BTreeMap<u64, Region>,
    allocated: u64,
    free_bytes: u64,
}

impl Chunks {
    /// Bytes in chunks handed out.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes in free chunks.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// The regions, by base address.
    pub fn regions(&self) -> &BTreeMap<u64, Region> {
        &self.regions
    }

    /// The chunk starting at `addr`.
    pub fn get(&self, addr: u64) -> Option<&Chunk> {
        self.chunks.get(&addr)
    }

    /// Records a new region (holding no chunks yet).
    pub fn add_region(&mut self, base: u64, size: u64, stream: u64) {
        self.regions.insert(base, Region { size, stream });
    }

    /// Adds a free chunk `[addr, addr + size)` of `region` to `list` and merges it with free
    /// neighbours; returns the merged chunk's address.
    pub fn add_free(&mut self, addr: u64, size: u64, region: u64, list: u64) -> u64 {
        self.chunks.insert(addr, Chunk { size, region, list, in_use: false, request: 0 });
        self.free.insert((list, size, addr));
        self.free_bytes += size;
        self.coalesce(addr)
    }

    /// The smallest free chunk on `list` with at least `size` bytes (lowest address on ties).
    pub fn best_fit(&self, list: u64, size: u64) -> Option<(u64, u64)> {
        self.free
            .range((list, size, 0)..=(list, u64::MAX, u64::MAX))
            .next()
            .map(|&(_, s, a)| (a, s))
    }

    /// The free chunks of `list`, smallest first.
    pub fn free_chunks(&self, list: u64) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        self.free.range((list, 0, 0)..=(list, u64::MAX, u64::MAX)).map(|&(_, s, a)| (a, s))
    }

    /// The lists that hold free chunks.
    pub fn lists(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        let mut next = self.free.iter().next().map(|&(l, _, _)| l);
        while let Some(l) = next {
            out.push(l);
            next = self.free.range((l + 1, 0, 0)..).next().map(|&(l, _, _)| l);
            if l == u64::MAX {
                break;
            }
        }
        out
    }

    /// Hands out the free chunk at `addr` to `owner` (kept in the in-use chunk's `list`, e.g.
    /// the allocating stream): when `split` and it is bigger than `size`, the tail beyond `size`
    /// stays free (on the chunk's list) as a new chunk. Returns the block size.
    pub fn take(&mut self, addr: u64, size: u64, request: u64, split: bool, owner: u64) -> u64 {
        let Some(c) = self.chunks.get(&addr).copied() else { return 0 };
        debug_assert!(!c.in_use && c.size >= size);
        self.free.remove(&(c.list, c.size, addr));
        self.free_bytes -= c.size;
        let block = if split && c.size > size {
            let rest = c.size - size;
            self.chunks.insert(
                addr + size,
                Chunk { size: rest, region: c.region, list: c.list, in_use: false, request: 0 },
            );
            self.free.insert((c.list, rest, addr + size));
            self.free_bytes += rest;
            size
        } else {
            c.size
        };
        self.chunks.insert(addr, Chunk { size: block, in_use: true, request, list: owner, ..c });
        self.allocated += block;
        block
    }

    /// Returns the in-use chunk at `addr` to `list`, merging it with free neighbours. Returns
    /// the merged chunk's address, or `None` when no in-use chunk starts at `addr`.
    pub fn release(&mut self, addr: u64, list: u64) -> Option<u64> {
        let c = self.chunks.get_mut(&addr).filter(|c| c.in_use)?;
        c.in_use = false;
        c.list = list;
        let size = c.size;
        self.allocated -= size;
        self.free_bytes += size;
        self.free.insert((list, size, addr));
        Some(self.coalesce(addr))
    }

    /// Removes the free chunk at `addr` (unmapped, or its region released); returns it.
    pub fn remove_free(&mut self, addr: u64) -> Option<Chunk> {
        let c = self.chunks.get(&addr).copied().filter(|c| !c.in_use)?;
        self.chunks.remove(&addr);
        self.free.remove(&(c.list, c.size, addr));
        self.free_bytes -= c.size;
        Some(c)
    }

    /// Moves every free chunk of list `from` to list `to`, merging as it goes (RMM's
    /// `merge_lists`).
    pub fn move_list(&mut self, from: u64, to: u64) {
        let moved: Vec<(u64, u64)> = self.free_chunks(from).collect();
        for &(addr, size) in &moved {
            self.free.remove(&(from, size, addr));
            if let Some(c) = self.chunks.get_mut(&addr) {
                c.list = to;
            }
            self.free.insert((to, size, addr));
        }
        // Chunks already on `to` were merged among themselves: only moved ones can merge now.
        for &(a, _) in &moved {
            if self.chunks.get(&a).is_some_and(|c| !c.in_use) {
                self.coalesce(a);
            }
        }
    }

    /// True when region `base` holds nothing in use.
    pub fn region_is_free(&self, base: u64) -> bool {
        let Some(r) = self.regions.get(&base) else { return false };
        !self.chunks.range(base..base + r.size).any(|(_, c)| c.in_use)
    }

    /// True when no chunk lies in region `base` (all its pages were unmapped).
    pub fn region_is_empty(&self, base: u64) -> bool {
        self.regions
            .get(&base)
            .is_some_and(|r| self.chunks.range(base..base + r.size).next().is_none())
    }

    /// Forgets region `base` and its (free) chunks; returns its size. Call only when
    /// [`Chunks::region_is_free`].
    pub fn remove_region(&mut self, base: u64) -> Option<u64> {
        let r = self.regions.remove(&base)?;
        let inside: Vec<u64> = self.chunks.range(base..base + r.size).map(|(&a, _)| a).collect();
        for a in inside {
            self.remove_free(a);
        }
        Some(r.size)
    }

    /// Merges the free chunk at `addr` with free, adjacent chunks of the same region and list.
    fn coalesce(&mut self, mut addr: u64) -> u64 {
        let Some(mut c) = self.chunks.get(&addr).copied() else { return addr };
        if let Some((&pa, &p)) = self.chunks.range(..addr).next_back() {
            if !p.in_use && p.region == c.region && p.list == c.list && pa + p.size == addr {
                self.free.remove(&(c.list, c.size, addr));
                self.free.remove(&(p.list, p.size, pa));
                self.chunks.remove(&addr);
                c.size += p.size;
                addr = pa;
                self.chunks.insert(addr, c);
                self.free.insert((c.list, c.size, addr));
            }
        }
        let next = addr + c.size;
        if let Some(&n) = self.chunks.get(&next) {
            if !n.in_use && n.region == c.region && n.list == c.list {
                self.free.remove(&(c.list, c.size, addr));
                self.free.remove(&(n.list, n.size, next));
                self.chunks.remove(&next);
                c.size += n.size;
                self.chunks.insert(addr, c);
                self.free.insert((c.list, c.size, addr));
            }
        }
        addr
    }

    /// The regions as PyTorch-style segments with their blocks (`is_expandable` for VMM ranges).
    pub fn segments(&self, device: i32, pool: PoolKind, is_expandable: bool) -> Vec<Segment> {
        self.regions
            .iter()
            .map(|(&base, r)| {
                let blocks: Vec<Block> = self
                    .chunks
                    .range(base..base + r.size)
                    .map(|(&a, c)| Block {
                        address: a,
                        size: c.size,
                        requested_size: c.request,
                        state: if c.in_use {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                    })
                    .collect();
                Segment {
                    device,
                    address: base,
                    total_size: blocks.iter().map(|b| b.size).sum(),
                    stream: r.stream,
                    pool,
                    is_expandable,
                    blocks,
                }
            })
            .collect()
    }

    /// Checks that chunks lie in their regions without overlap, the free set matches the free
    /// chunks, no two free neighbours were left unmerged, and the counters match.
    pub fn check(&self) -> std::result::Result<(), String> {
        let mut end = 0u64;
        let (mut allocated, mut free_bytes, mut free_count) = (0u64, 0u64, 0usize);
        let mut prev: Option<(u64, Chunk)> = None;
        for (&a, c) in &self.chunks {
            if a < end {
                return Err(format!("chunk {a:#x} overlaps the previous chunk"));
            }
            end = a + c.size;
            let Some(r) = self.regions.get(&c.region) else {
                return Err(format!("chunk {a:#x} names unknown region {:#x}", c.region));
            };
            if a < c.region || end > c.region + r.size || c.size == 0 {
                return Err(format!("chunk {a:#x}+{} outside region {:#x}", c.size, c.region));
            }
            if c.in_use {
                allocated += c.size;
            } else {
                free_bytes += c.size;
                free_count += 1;
                if !self.free.contains(&(c.list, c.size, a)) {
                    return Err(format!("free chunk {a:#x} missing from the free set"));
                }
                if let Some((pa, p)) = prev {
                    if !p.in_use && p.region == c.region && p.list == c.list && pa + p.size == a {
                        return Err(format!("free chunks {pa:#x} and {a:#x} were not merged"));
                    }
                }
            }
            prev = Some((a, *c));
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
