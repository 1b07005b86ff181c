//! Expandable segments (`expandable_segments:True`): one VA reservation per (stream, pool), backed
//! page by page as requests need it.
//!
//! Upstream: `ExpandableSegment`, `find_expandable_block`, `try_allocate_expandable_block`,
//! `map_block`, `unmap_block` and `release_expandable_segment` in
//! `c10/cuda/CUDACachingAllocator.cpp`; see docs/pytorch-model.md#expandable-segments. Pages are 2
//! MiB in the small pool and `large_segment_size` (20 MiB) in the large pool; the reservation is
//! 9/8 of the GPU's memory (`Config::gpu_memory`), rounded up to pages. Reserving emits no trace
//! event; mapping and unmapping go through [`Backend::map`] / [`Backend::unmap`], which the replay
//! engine records as `segment_map` / `segment_unmap`.

use super::config::{va_size_on, Config};
use super::{unmapped_key, Block, ExpandableSegment, MappedRange, PyTorch, NIL};
use crate::backend::Backend;
use crate::error::Result;

impl<const DEFAULT_RULES: bool> PyTorch<DEFAULT_RULES> {
    /// Not allocated: free mapped or unmapped (PyTorch's "allocatable" test in
    /// `find_expandable_block`; there are no pending stream events in this model).
    fn allocatable(&self, id: u32) -> bool {
        id != NIL && !self.b(id).allocated
    }

    /// `find_expandable_block` (docs/pytorch-model.md#expandable-find): the lowest-address hole of
    /// this stream and pool that, together with a free mapped block just before it, holds `size`;
    /// else a new reservation.
    fn find_expandable_block<B: Backend>(
        &mut self,
        backend: &mut B,
        stream: u64,
        size: u64,
        small: bool,
    ) -> Result<Option<u32>> {
        let (owner, sid) = (self.into, self.intern(stream)?);
        for (&k, &id) in self.owner(owner, small).unmapped.range(unmapped_key(sid, 0)..) {
            if (k >> 64) as u32 != sid {
                break;
            }
            let mut c = id;
            let prev = self.b(c).prev;
            if self.allocatable(prev) {
                c = prev;
            }
            let mut sum = 0u64;
            let mut x = c;
            while self.allocatable(x) {
                sum += self.b(x).size;
                if sum >= size {
                    return Ok(Some(c));
                }
                x = self.b(x).next;
            }
        }
        let page = self.config.page_size(small);
        let va_size = self.config.va_size(small);
        // 2.15's expandable_segments_reserve: a request cannot span reservations.
        if self.config.reserve_limit().is_some() && size > va_size {
            return Ok(None);
        }
        let Some(base) = backend.reserve(va_size)? else { return Ok(None) };
        Self::check_range(base, va_size)?;
        let seg = self.expandable.len() as u32;
        self.expandable.push(ExpandableSegment { base, va_size, page, alive: true });
        let id = self.new_block(Block {
            ptr: base,
            size: va_size,
            requested: 0,
            stream,
            sid,
            prev: NIL,
            next: NIL,
            expandable: seg,
            gc_base: 0,
            pool: owner,
            small,
            allocated: false,
            mapped: false,
            in_use: true,
        });
        self.owner_mut(owner, small).unmapped.insert(unmapped_key(sid, base), id);
        Ok(Some(id))
    }

    /// `try_allocate_expandable_block` (docs/pytorch-model.md#expandable-map): map what the chosen
    /// hole lacks, page by page.
    pub(super) fn try_allocate_expandable_block<B: Backend>(
        &mut self,
        backend: &mut B,
        stream: u64,
        size: u64,
        small: bool,
    ) -> Result<Option<u32>> {
        let Some(mut c) = self.find_expandable_block(backend, stream, size, small)? else {
            return Ok(None);
        };
        if !self.b(c).mapped {
            let bytes = self.b(c).size.min(size);
            if !self.map_block(backend, c, bytes)? {
                return Ok(None);
            }
        }
        while self.b(c).size < size {
            let n = self.b(c).next;
            if n == NIL || self.b(n).mapped {
                return Ok(None); // cannot happen: find_expandable_block checked the room
            }
            let bytes = (size - self.b(c).size).min(self.b(n).size);
            if !self.map_block(backend, n, bytes)? {
                return Ok(None);
            }
            c = n;
        }
        self.remove_free(c);
        Ok(Some(c))
    }

    /// `map_block` (docs/pytorch-model.md#expandable-map): backs the first `bytes` of unmapped
    /// block `id` (rounded up to whole pages), merges it with free mapped neighbours and puts it in
    /// the free set.
    fn map_block<B: Backend>(&mut self, backend: &mut B, id: u32, bytes: u64) -> Result<bool> {
        if bytes == 0 {
            return Ok(false);
        }
        let b = *self.b(id);
        let seg = &self.expandable[b.expandable as usize];
        let page = seg.page;
        let mapped = bytes.div_ceil(page) * page;
        let mapped = mapped.min(b.size);
        if !backend.map(b.ptr, mapped)? {
            return Ok(false);
        }
        self.remove_free(id);
        if mapped < b.size {
            let rest = self.new_block(Block {
                ptr: b.ptr + mapped,
                size: b.size - mapped,
                prev: id,
                next: b.next,
                ..b
            });
            if b.next != NIL {
                self.bm(b.next).prev = rest;
            }
            self.bm(id).next = rest;
            self.owner_mut(b.pool, b.small)
                .unmapped
                .insert(unmapped_key(b.sid, b.ptr + mapped), rest);
        }
        let x = self.bm(id);
        x.mapped = true;
        x.size = mapped;
        let (prev, next) = (x.prev, x.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_free(id);
        self.total_allocated += mapped;
        self.stats.num_device_alloc += 1;
        Ok(true)
    }

    /// `unmap_block` (docs/pytorch-model.md#expandable-unmap): unmaps the whole pages inside free
    /// block `id`; partial pages at either end stay mapped as free blocks. Releases the reservation
    /// when nothing is left.
    pub(super) fn unmap_block<B: Backend>(&mut self, backend: &mut B, id: u32) -> Result<()> {
        let b = *self.b(id);
        let seg = self.expandable[b.expandable as usize].clone();
        let off = b.ptr - seg.base;
        let first = off.div_ceil(seg.page);
        let last = (off + b.size) / seg.page;
        if first >= last {
            return Ok(());
        }
        let start = seg.base + first * seg.page;
        let end = seg.base + last * seg.page;
        backend.unmap(start, end - start)?;
        self.remove_free(id);
        if b.ptr < start {
            let before = self.new_block(Block {
                ptr: b.ptr,
                size: start - b.ptr,
                requested: 0,
                next: id,
                ..b
            });
            if b.prev != NIL {
                self.bm(b.prev).next = before;
            }
            self.bm(id).prev = before;
            self.insert_free(before);
        }
        if end < b.ptr + b.size {
            let after = self.new_block(Block {
                ptr: end,
                size: b.ptr + b.size - end,
                requested: 0,
                prev: id,
                ..b
            });
            if b.next != NIL {
                self.bm(b.next).prev = after;
            }
            self.bm(id).next = after;
            self.insert_free(after);
        }
        let x = self.bm(id);
        x.ptr = start;
        x.size = end - start;
        x.mapped = false;
        let (prev, next) = (x.prev, x.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        let x = self.b(id);
        let (sid, ptr, small, owner) = (x.sid, x.ptr, x.small, x.pool);
        self.owner_mut(owner, small).unmapped.insert(unmapped_key(sid, ptr), id);
        self.total_allocated -= end - start;
        self.stats.num_device_free += 1;
        if self.b(id).prev == NIL && self.b(id).next == NIL {
            // release_expandable_segment: the whole VA is unmapped.
            self.owner_mut(owner, small).unmapped.remove(&unmapped_key(sid, ptr));
            backend.release(seg.base, seg.va_size)?;
            self.expandable[b.expandable as usize].alive = false;
            self.drop_block(id);
        }
        Ok(())
    }

    /// Installs an expandable segment as it stood before a trace (start-state recovery): a
    /// reservation of `va_size` bytes at `base` for (`stream`, pool) whose mapped ranges are
    /// `ranges`, each tiled by `(start, size, live request or None)` blocks in address order.
    /// Everything else in the reservation is unmapped. The pool is the small or large pool of
    /// `private_pool`, or of the default pools. Returns the live blocks as allocations (with
    /// their handles), in address order.
    pub(crate) fn install_expandable(
        &mut self,
        base: u64,
        va_size: u64,
        (stream, small, private_pool): (u64, bool, Option<(u64, u64)>),
        ranges: &[MappedRange],
    ) -> Result<Vec<crate::policy::Allocation>> {
        Self::check_range(base, va_size)?;
        let sid = self.intern(stream)?;
        let owner = self.pool_number(private_pool)?;
        let page = self.config.page_size(small);
        let seg = self.expandable.len() as u32;
        self.expandable.push(ExpandableSegment { base, va_size, page, alive: true });
        // The whole VA as a list of (start, size, mapped, live) pieces.
        let mut pieces: Vec<(u64, u64, bool, Option<u64>)> = Vec::new();
        let mut pos = base;
        for (addr, size, blocks) in ranges {
            if *addr < pos || addr + size > base + va_size {
                return Err(crate::error::Error::input(format!(
                    "expandable range {addr:#x}+{size} is outside the reservation at {base:#x} or overlaps"
                )));
            }
            if *addr > pos {
                pieces.push((pos, addr - pos, false, None));
            }
            let mut at = *addr;
            for &(a, s, live) in blocks {
                if a != at || s == 0 {
                    return Err(crate::error::Error::input(format!(
                        "expandable range {addr:#x}: block {a:#x}+{s} does not follow {at:#x}"
                    )));
                }
                pieces.push((a, s, true, live));
                at += s;
            }
            if at != addr + size {
                return Err(crate::error::Error::input(format!(
                    "expandable range {addr:#x}: blocks cover {} of {size} bytes",
                    at - addr
                )));
            }
            self.total_allocated += size;
            pos = addr + size;
        }
        if pos < base + va_size {
            pieces.push((pos, base + va_size - pos, false, None));
        }
        let mut prev = NIL;
        let mut installed = Vec::new();
        for (ptr, size, mapped, live) in pieces {
            let id = self.new_block(Block {
                ptr,
                size,
                requested: 0,
                stream,
                sid,
                prev,
                next: NIL,
                expandable: seg,
                gc_base: 0,
                pool: owner,
                small,
                allocated: false,
                mapped,
                in_use: true,
            });
            if prev != NIL {
                self.bm(prev).next = id;
            }
            prev = id;
            match (mapped, live) {
                (true, Some(request)) => {
                    installed.push(self.alloc_found_block(id, size, request, false));
                }
                (true, None) => self.free_block(id),
                (false, _) => {
                    let pv = self.b(id).prev;
                    if self.try_merge(id, pv) {
                        prev = id;
                    }
                    let key = unmapped_key(sid, self.b(id).ptr);
                    self.owner_mut(owner, small).unmapped.insert(key, id);
                }
            }
        }
        Ok(installed)
    }
}

/// What a recording's expandable layout says about the GPU's memory (`totalGlobalMem`), which
/// sets every reservation's VA size (docs/pytorch-model.md#expandable-va-size) and is recorded
/// nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuMemoryFit {
    /// The smallest GPU memory whose reservations hold every run of mapped pages seen.
    pub(crate) min: u64,
    /// The largest whose reservations end before the next (stream, pool)'s pages start; `None`
    /// when nothing above a reservation bounds it.
    pub(crate) max: Option<u64>,
    /// The tightest upper bound's evidence: (reservation base, next reservation's first page).
    pub(crate) evidence: Option<(u64, u64)>,
}

impl GpuMemoryFit {
    /// The value to model: the largest consistent one (real drivers place reservations back to
    /// back, so the gap to the next one is the VA size itself); `None` when the bounds conflict
    /// or nothing bounds it from above.
    pub(crate) fn inferred(&self) -> Option<u64> {
        self.max.filter(|&m| m >= self.min)
    }

    /// The GPU memory to model where `assumed` was assumed: the inferred value; the assumption
    /// where no value fits; else (nothing bounds it from above) the assumption raised to the
    /// smallest memory that holds the pages.
    pub(crate) fn modelled(&self, assumed: u64) -> u64 {
        match (self.inferred(), self.max) {
            (Some(g), _) => g,
            (None, Some(_)) => assumed,
            (None, None) => assumed.max(self.min),
        }
    }
}

/// [`gpu_memory_fit`] of a recording: the mapped ranges of its start state and its
/// `segment_map` events, each with its pool.
pub(crate) fn recorded_gpu_memory_fit(
    events: &[crate::trace::Event],
    start: &super::start::StartState,
    config: &Config,
) -> Option<GpuMemoryFit> {
    let large_page = config.page_size(false);
    let mut pieces: Vec<MappedPiece> = start
        .segments
        .iter()
        .filter(|s| s.expandable)
        .map(|s| (s.addr, s.size, s.stream, s.small, s.private_pool))
        .collect();
    let pool_of = |e: &crate::trace::Event| start.routes.as_ref().and_then(|r| r.pool_for(e));
    pieces.extend(
        events
            .iter()
            .filter(|e| e.action == crate::trace::Action::SegmentMap)
            .map(|e| (e.addr, e.size, e.stream, e.size % large_page != 0, pool_of(e))),
    );
    gpu_memory_fit(&pieces, config)
}

/// One mapped range of a recording, as [`gpu_memory_fit`] reads it: (address, size, stream,
/// small pool, private pool or `None` for the default pools).
pub type MappedPiece = (u64, u64, u64, bool, Option<(u64, u64)>);

/// Infers the bounds on the GPU's memory from the expandable pages of a recording: `pieces` are
/// every mapped range seen (start-state ranges and `segment_map` events). Pages of one (stream,
/// pool) that follow each other in address order share a reservation, so its VA holds them (a
/// lower bound); a reservation starting at its lowest page ends before the next (stream,
/// pool)'s first page (an upper bound). `None` when there are no expandable pages.
pub(crate) fn gpu_memory_fit(pieces: &[MappedPiece], config: &Config) -> Option<GpuMemoryFit> {
    let mut pieces = pieces.to_vec();
    pieces.sort_unstable();
    // Runs of one (stream, pool) in address order, as pieces whose second field is the end.
    let mut runs: Vec<MappedPiece> = Vec::new();
    for &(addr, size, stream, small, private) in &pieces {
        match runs.last_mut() {
            Some(r) if (r.2, r.3, r.4) == (stream, small, private) => {
                r.1 = r.1.max(addr.saturating_add(size));
            }
            _ => runs.push((addr, addr.saturating_add(size), stream, small, private)),
        }
    }
    if runs.is_empty() {
        return None;
    }
    // Per pool (index 1 = small): the largest run and the smallest gap to another run.
    let mut lower = [0u64; 2];
    let mut upper: [Option<(u64, u64, u64)>; 2] = [None, None];
    for (i, r) in runs.iter().enumerate() {
        let p = usize::from(r.3);
        lower[p] = lower[p].max(r.1 - r.0);
        if let Some(next) = runs.get(i + 1) {
            let gap = next.0 - r.0;
            if upper[p].is_none_or(|(g, _, _)| gap < g) {
                upper[p] = Some((gap, r.0, next.0));
            }
        }
    }
    let va = |gpu: u64, small: bool| va_size_on(gpu, config.page_size(small));
    let holds = |gpu: u64| (0..2).all(|p| va(gpu, p == 1) >= lower[p]);
    let fits = |gpu: u64| (0..2).all(|p| upper[p].is_none_or(|(g, _, _)| va(gpu, p == 1) <= g));
    // Both predicates are monotone in the GPU's memory: binary search up to 1 PiB.
    const TOP: u64 = 1 << 50;
    let (mut lo, mut hi) = (0u64, TOP);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let min = lo;
    let bounded = upper.iter().any(Option::is_some);
    let max = bounded.then(|| {
        let (mut lo, mut hi) = (0u64, TOP);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    });
    let evidence = upper.iter().flatten().min().map(|&(_, a, b)| (a, b));
    Some(GpuMemoryFit { min, max, evidence })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_gap_between_reservations_fixes_the_gpu_memory() {
        let config = Config::default();
        let gpu = 81559 * MIB;
        let (large, small) = (va_size_on(gpu, 20 * MIB), va_size_on(gpu, 2 * MIB));
        // The large pool's reservation at 0, the small pool's right after it.
        let pieces = [
            (0, 100 * MIB, 0, false, None),
            (large, 2 * MIB, 0, true, None),
            (40 * MIB, 20 * MIB, 0, false, None),
        ];
        let fit = gpu_memory_fit(&pieces, &config).unwrap();
        let g = fit.inferred().unwrap();
        assert!(g >= gpu && va_size_on(g, 20 * MIB) == large, "{fit:?}");
        assert!(va_size_on(g, 2 * MIB) >= small);
        assert_eq!(fit.evidence, Some((0, large)));
        assert_eq!(va_size_on(fit.min, 20 * MIB), 100 * MIB);
        // 80 GiB's reservation would cover the small pool's pages.
        assert!(va_size_on(80 << 30, 20 * MIB) > large);
    }

    #[test]
    fn one_reservation_bounds_the_memory_only_from_below() {
        let fit = gpu_memory_fit(&[(0, 200 * MIB, 0, false, None)], &Config::default()).unwrap();
        assert_eq!((fit.max, fit.inferred()), (None, None));
        assert_eq!(va_size_on(fit.min, 20 * MIB), 200 * MIB);
        assert!(va_size_on(fit.min - 1, 20 * MIB) < 200 * MIB);
        // Pages that need more VA than the gaps allow: no value fits.
        let pieces = [
            (0, 200 * MIB, 0, false, None),
            (100 * MIB, 2 * MIB, 0, true, None),
            (150 * MIB, 2 * MIB, 1, false, None),
        ];
        let fit = gpu_memory_fit(&pieces, &Config::default()).unwrap();
        assert_eq!(fit.inferred(), None, "{fit:?}");
        assert!(gpu_memory_fit(&[], &Config::default()).is_none());
    }
}
