//! `stitch`: GMLake-style virtual memory stitching of free physical granules.
//!
//! Upstream: "GMLake: Efficient and Transparent GPU Memory Defragmentation for Large-scale DNN
//! Training with Virtual Memory Stitching" (Guo et al., ASPLOS 2024; code in
//! `intelligent-machine-learning/glake`, `GMLake/`). GMLake keeps PyTorch's
//! caching allocator for small blocks and serves large ones from physical chunks in 2 MiB
//! granules (`cuMemCreate`), mapped into virtual ranges with the CUDA VMM API. When no single free
//! block fits, it maps several free, non-contiguous physical chunks into one new virtual range
//! ("stitching"), so free memory is never stranded between live blocks.
//!
//! Rules followed from the paper's allocation states (its Alg. 1):
//! - **S1/S2, exact match or single block**: the smallest free large block that fits (lowest
//!   address on ties) serves the request; a bigger one is split (GMLake's Split), at granule
//!   boundaries.
//! - **S3, multiple blocks**: when no single block fits but the free blocks together do, blocks
//!   are taken largest first (lowest address on ties; fewest pieces, so fewest mappings) until
//!   they cover the request, the last one split, and stitched into one new virtual range.
//! - **S4, insufficient blocks**: when all free blocks together are too small, a new physical
//!   chunk of the difference is created and stitched together with all of them.
//! - **S5, OOM**: GMLake's StitchFree drops cached stitched *virtual* ranges; that frees no
//!   physical memory, so here the only fallback is returning free small-pool segments before the
//!   new physical chunk is created again; then the request fails.
//! - **Small blocks** (≤ `small`, default 1 MiB, PyTorch's `kSmallSize`) go to a PyTorch-like small
//!   pool: 512-byte rounding, 2 MiB `cudaMalloc` segments, best fit, split when ≥ 512 B remain,
//!   coalescing. Large requests are rounded up to the granule ([`Backend::granularity`]).
//!
//! **How stitching is counted.** GMLake creates its physical memory as one handle per granule
//! (`cuMemCreate` of 2 MiB) and maps each handle with its own `cuMemMap`, since the driver maps one
//! allocation handle per call and unmaps only whole mappings. Here too every [`Backend::map`] and
//! [`Backend::unmap`] call of the large pool covers exactly one granule, so `map_count` and
//! `unmap_count` both count granule mappings: a range of k granules costs k maps, and no unmap
//! can undo more than one map. The simulated device counts mapped physical bytes as reserved.
//! GMLake maps the *same* physical handles a second time, into the stitched range, while keeping
//! the primitive mapping; a second mapping costs no physical memory, but `Backend::map` means
//! "create and map new physical memory". Rather than add an aliasing call to the `Backend` trait,
//! a stitch here *moves* the pieces: each granule is unmapped from its old range and one granule
//! is mapped at its place in the new range (any new physical memory is mapped first). Reserved
//! bytes are the same at every instant as GMLake's physical memory, and the peak never rises by a
//! stitch (each unmap comes before its map). What differs: `unmap_count` counts the moved
//! granules (GMLake keeps the primitive mapping) and the moved granules are no longer reachable
//! through their old range. GMLake's cache of stitched ranges (sPool) saves mapping calls, not
//! memory, so it is not modelled: a freed stitched block is simply a free block of its range,
//! which can be split or stitched again. A reservation whose pages have all moved away is
//! released.
//!
//! A large request over 1 TiB (more than any GPU holds) is refused as out of memory: mapping
//! it a granule per call would take over half a million calls.
//!
//! Options (`stitch:key=value,...`): `small` (default 1 MiB: requests up to this use the small
//! pool), `stitch` (default `true`; `false` gives plain VMM blocks, one physical chunk per
//! request that no free block fits, as an ablation). Streams are ignored (GMLake, like PyTorch,
//! keeps blocks per stream; a single stream is modelled).

use super::chunks::{round_up, unknown_block, Chunks};
use super::options::{self as opt, OptionKey};
use super::{Allocation, Policy, Registration, Role};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::{PoolKind, Segment};
use crate::units::MIB;

/// The policy's name in `--policy`.
pub const NAME: &str = "stitch";

/// The option keys `stitch` accepts: they drive the parser, the help and the errors.
pub const KEYS: &[OptionKey<StitchOptions>] =
    &[OptionKey::size("small", |o, v| o.small = v), OptionKey::flag("stitch", |o, v| o.stitch = v)];

/// `stitch`'s line in [`POLICIES`](super::POLICIES).
pub const POLICY: Registration<Stitch> = Registration {
    name: NAME,
    summary: "GMLake-style virtual-memory stitching of free 2 MiB granules",
    role: Role::Online,
    options: || opt::help(KEYS),
    build: |options, _| Stitch::from_options(options),
};

/// Small-pool rounding (PyTorch's `kMinBlockSize`).
const SMALL_ROUND: u64 = 512;
/// Small-pool segment size (PyTorch's `kSmallBuffer`).
const SMALL_SEGMENT: u64 = 2 * MIB;
/// The largest large block served (1 TiB, more than any GPU holds): a range is mapped one
/// granule per call, so a larger one is refused as out of memory rather than walked through.
const MAX_LARGE: u64 = 1 << 40;

/// `stitch`'s options; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StitchOptions {
    /// Requests up to this many bytes use the small pool.
    pub(crate) small: u64,
    /// Stitch free blocks together (false: plain VMM blocks).
    pub(crate) stitch: bool,
}

impl Default for StitchOptions {
    fn default() -> Self {
        StitchOptions { small: MIB, stitch: true }
    }
}

/// The stitching policy; see the module docs.
#[derive(Debug)]
pub struct Stitch {
    options: StitchOptions,
    small: Chunks,
    /// Large blocks: regions are reservations, chunks their mapped ranges.
    large: Chunks,
    granule: u64,
    stitches: u64,
}

impl Stitch {
    /// Builds the policy from `key=value` options (see [`KEYS`]).
    pub(crate) fn from_options(options: &str) -> Result<Stitch> {
        let o = opt::parse(NAME, options, KEYS)?;
        if o.small > SMALL_SEGMENT {
            return Err(Error::usage(format!(
                "small ({}) must be at most the 2 MiB small-pool segment",
                o.small
            )));
        }
        Ok(Stitch {
            options: o,
            small: Chunks::default(),
            large: Chunks::default(),
            granule: 2 * MIB,
            stitches: 0,
        })
    }

    /// How many stitched ranges were built.
    pub fn stitches(&self) -> u64 {
        self.stitches
    }

    /// Bytes of physical memory in large blocks (free and in use).
    fn large_mapped(&self) -> u64 {
        self.large.allocated() + self.large.free_bytes()
    }

    /// Returns every small segment with nothing in use.
    fn release_small<B: Backend>(&mut self, backend: &mut B) -> Result<bool> {
        Ok(self.small.release_idle_regions(backend)? > 0)
    }

    /// Unmaps every free large block and releases reservations left without pages.
    fn release_large<B: Backend>(&mut self, backend: &mut B) -> Result<bool> {
        let free: Vec<(u64, u64)> = self.large.free_chunks(0).collect();
        for &(addr, size) in &free {
            self.large.remove_free(addr);
            self.unmap_granules(backend, addr, size)?;
        }
        let all: Vec<u64> = self.large.regions().keys().copied().collect();
        self.release_empty_reservations(backend, &all)?;
        Ok(!free.is_empty())
    }

    /// Releases those of `bases` whose pages have all been unmapped.
    fn release_empty_reservations<B: Backend>(
        &mut self,
        backend: &mut B,
        bases: &[u64],
    ) -> Result<()> {
        for &base in bases {
            if self.large.region_is_empty(base) {
                if let Some(size) = self.large.remove_region(base) {
                    backend.release(base, size)?;
                }
            }
        }
        Ok(())
    }

    fn malloc_small<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        let rounded = round_up(size.max(1), SMALL_ROUND);
        if self.small.best_fit(0, rounded).is_none() {
            let mut base = backend.segment_alloc(SMALL_SEGMENT)?;
            if base.is_none() && self.release_large(backend)? {
                base = backend.segment_alloc(SMALL_SEGMENT)?;
            }
            let Some(base) = base else { return Ok(None) };
            self.small.add_region(base, SMALL_SEGMENT, stream);
            self.small.add_free(base, SMALL_SEGMENT, base, 0);
        }
        let Some((addr, chunk)) = self.small.best_fit(0, rounded) else { return Ok(None) };
        let split = chunk - rounded >= SMALL_ROUND;
        let block_size = self.small.take(addr, rounded, size, split, 0);
        Ok(Some(Allocation::new(addr, block_size)))
    }

    /// Maps `[addr, addr + size)` (whole granules) one granule per call, as GMLake maps one
    /// physical handle per `cuMemMap`. When the device runs out part way, the granules mapped so
    /// far are unmapped again and the answer is `false`: nothing stays mapped, as after a refused
    /// [`Backend::map`].
    fn map_granules<B: Backend>(&self, backend: &mut B, addr: u64, size: u64) -> Result<bool> {
        let g = self.granule;
        for page in (addr..addr + size).step_by(g as usize) {
            if !backend.map(page, g)? {
                self.unmap_granules(backend, addr, page - addr)?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Unmaps `[addr, addr + size)` (whole granules) one granule per call: each call undoes one
    /// mapping of [`Stitch::map_granules`].
    fn unmap_granules<B: Backend>(&self, backend: &mut B, addr: u64, size: u64) -> Result<()> {
        let g = self.granule;
        for page in (addr..addr + size).step_by(g as usize) {
            backend.unmap(page, g)?;
        }
        Ok(())
    }

    /// Maps `size` new bytes at `addr`, returning free small segments once if the device is full.
    fn map_new<B: Backend>(&mut self, backend: &mut B, addr: u64, size: u64) -> Result<bool> {
        if self.map_granules(backend, addr, size)? {
            return Ok(true);
        }
        if self.release_small(backend)? {
            return self.map_granules(backend, addr, size);
        }
        Ok(false)
    }

    fn malloc_large<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        self.granule = backend.granularity().max(1);
        if size > MAX_LARGE {
            return Ok(None);
        }
        let s = round_up(size, self.granule);
        // S1/S2: one free block.
        if let Some((addr, _)) = self.large.best_fit(0, s) {
            let block_size = self.large.take(addr, s, size, true, 0);
            return Ok(Some(Allocation::new(addr, block_size)));
        }
        // S3/S4: stitch free blocks, largest first, plus new memory for what they lack.
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        let mut covered = 0u64;
        if self.options.stitch {
            let mut free: Vec<(u64, u64)> = self.large.free_chunks(0).collect();
            free.sort_by_key(|&(a, len)| (std::cmp::Reverse(len), a));
            for (addr, len) in free {
                if covered >= s {
                    break;
                }
                let take = len.min(s - covered);
                pieces.push((addr, take));
                covered += take;
            }
        }
        let need = s - covered;
        let Some(va) = backend.reserve(s)? else { return Ok(None) };
        if need > 0 && !self.map_new(backend, va + covered, need)? {
            backend.release(va, s)?;
            return Ok(None);
        }
        let mut offset = 0;
        let mut touched: Vec<u64> = Vec::with_capacity(pieces.len());
        for &(addr, take) in &pieces {
            let Some(c) = self.large.get(addr).copied() else {
                return Err(Error::backend(format!("stitch: free block {addr:#x} vanished")));
            };
            touched.push(c.region);
            if c.size > take {
                self.large.trim_front(addr, take);
            } else {
                self.large.remove_free(addr);
            }
            // Granule by granule, each unmapped before its copy is mapped: the peak never rises.
            let g = self.granule;
            for at in (0..take).step_by(g as usize) {
                backend.unmap(addr + at, g)?;
                if !backend.map(va + offset + at, g)? {
                    return Err(Error::backend(format!(
                        "stitch: remapping {g} bytes just unmapped was refused"
                    )));
                }
            }
            offset += take;
        }
        if covered > 0 {
            self.stitches += 1;
        }
        debug_assert_eq!(offset, covered);
        self.release_empty_reservations(backend, &touched)?;
        self.large.add_region(va, s, stream);
        self.large.add_free(va, s, va, 0);
        let block_size = self.large.take(va, s, size, false, 0);
        Ok(Some(Allocation::new(va, block_size)))
    }
}

impl Policy for Stitch {
    fn config(&self) -> String {
        format!("small={},stitch={}", self.options.small, self.options.stitch)
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        if size <= self.options.small {
            self.malloc_small(backend, size, stream)
        } else {
            self.malloc_large(backend, size, stream)
        }
    }

    fn free<B: Backend>(&mut self, _backend: &mut B, addr: u64) -> Result<()> {
        if self.small.get(addr).is_some_and(|c| c.in_use) {
            self.small.release(addr, 0);
            return Ok(());
        }
        self.large.release(addr, 0).map(|_| ()).ok_or_else(|| unknown_block(NAME, addr))
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.release_small(backend)?;
        self.release_large(backend)?;
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.small.allocated() + self.large.allocated()
    }

    fn segments(&self) -> Vec<Segment> {
        let mut out = self.small.segments(0, PoolKind::Small, false);
        // A reservation may have holes where pages moved away: one segment per mapped run.
        for seg in self.large.segments(0, PoolKind::Large, true) {
            let mut run: Option<Segment> = None;
            for b in seg.blocks {
                match &mut run {
                    Some(r) if r.address + r.total_size == b.address => {
                        r.total_size += b.size;
                        r.blocks.push(b);
                    }
                    _ => {
                        out.extend(run.take());
                        run = Some(Segment {
                            device: seg.device,
                            address: b.address,
                            total_size: b.size,
                            stream: seg.stream,
                            pool: seg.pool,
                            is_expandable: true,
                            private_pool: None,
                            blocks: vec![b],
                        });
                    }
                }
            }
            out.extend(run);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.small.check().map_err(|e| format!("small pool: {e}"))?;
        self.large.check().map_err(|e| format!("large pool: {e}"))?;
        for (&base, r) in self.large.regions() {
            if r.size % self.granule != 0 || self.large.region_is_empty(base) {
                return Err(format!("reservation {base:#x} is not whole granules or is empty"));
            }
        }
        if self.large_mapped() % self.granule != 0 {
            return Err(format!("{} mapped bytes are not whole granules", self.large_mapped()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SimDevice;
    use crate::testing::{run_checked, workload};

    #[test]
    fn stitches_non_contiguous_free_blocks_without_new_memory() {
        let mut d = SimDevice::default();
        let mut p = Stitch::from_options("").unwrap();
        let a = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
        let b = p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap();
        let c = p.malloc(&mut d, 3 * MIB + 1, 0).unwrap().unwrap(); // rounds to 4 MiB
        assert_eq!(c.block_size, 4 * MIB);
        assert_eq!(d.reserved(), 10 * MIB);
        p.free(&mut d, a.addr).unwrap();
        p.free(&mut d, c.addr).unwrap();
        // 8 MiB: no single free block (4 + 4, separated by b); together they fit: stitch.
        let s = p.malloc(&mut d, 8 * MIB, 0).unwrap().unwrap();
        assert_eq!(s.block_size, 8 * MIB);
        assert_eq!(d.reserved(), 10 * MIB, "no new physical memory");
        assert_eq!(p.stitches(), 1);
        p.check_invariants().unwrap();
        // S4: free 8 MiB, ask for 10 MiB: 2 MiB new physical memory, stitched with the 8 MiB.
        p.free(&mut d, s.addr).unwrap();
        let t = p.malloc(&mut d, 10 * MIB, 0).unwrap().unwrap();
        assert_eq!((t.block_size, d.reserved()), (10 * MIB, 12 * MIB));
        p.free(&mut d, t.addr).unwrap();
        p.free(&mut d, b.addr).unwrap();
        p.empty_cache(&mut d).unwrap();
        assert_eq!(d.reserved(), 0);
    }

    /// Every map and unmap call covers one granule, so a stitch costs one unmap and one map per
    /// moved granule, and no unmap undoes more than one map: the 12 requests below once gave 3
    /// maps and 4 unmaps (an 8 MiB range mapped in one call, unmapped in four pieces).
    #[test]
    fn maps_and_unmaps_count_granules_so_unmaps_never_exceed_maps() {
        use crate::backend::{BackendCall, Recording};
        let count = |d: &Recording<SimDevice>| {
            let maps = d.calls().iter().filter(|c| matches!(c, BackendCall::Map { ok: true, .. }));
            let unmaps = d.calls().iter().filter(|c| matches!(c, BackendCall::Unmap { .. }));
            let granule = |c: &BackendCall| match *c {
                BackendCall::Map { size, .. } | BackendCall::Unmap { size, .. } => size == 2 * MIB,
                _ => true,
            };
            assert!(d.calls().iter().all(granule), "{:?}", d.calls());
            (maps.count(), unmaps.count())
        };
        let mut d: Recording<SimDevice> = Recording::new(SimDevice::default());
        let mut p = Stitch::from_options("").unwrap();
        let a = p.malloc(&mut d, 8 * MIB, 0).unwrap().unwrap();
        p.free(&mut d, a.addr).unwrap();
        let b: Vec<Allocation> =
            (0..4).map(|_| p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap()).collect();
        assert_eq!(count(&d), (4, 0), "one map per granule of the new 8 MiB");
        p.free(&mut d, b[0].addr).unwrap();
        p.free(&mut d, b[2].addr).unwrap();
        let c = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
        assert_eq!(count(&d), (6, 2), "two granules moved into the stitched range");
        p.free(&mut d, b[1].addr).unwrap();
        p.free(&mut d, b[3].addr).unwrap();
        let e = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
        assert_eq!(count(&d), (8, 4));
        assert_eq!((d.reserved(), d.inner.peak_reserved(), p.stitches()), (8 * MIB, 8 * MIB, 2));
        p.free(&mut d, c.addr).unwrap();
        p.free(&mut d, e.addr).unwrap();
        p.empty_cache(&mut d).unwrap();
        assert_eq!((count(&d), d.reserved()), ((8, 8), 0));
        p.check_invariants().unwrap();
    }

    #[test]
    fn without_stitching_a_new_block_is_mapped() {
        let mut d = SimDevice::default();
        let mut p = Stitch::from_options("stitch=false").unwrap();
        let a = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
        let _b = p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap();
        let c = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
        p.free(&mut d, a.addr).unwrap();
        p.free(&mut d, c.addr).unwrap();
        p.malloc(&mut d, 8 * MIB, 0).unwrap().unwrap();
        assert_eq!(d.reserved(), 18 * MIB);
    }

    #[test]
    fn largest_pieces_first_and_the_last_one_is_split() {
        let mut d = SimDevice::default();
        let mut p = Stitch::from_options("").unwrap();
        let a = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap();
        let _x = p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap();
        let b = p.malloc(&mut d, 6 * MIB, 0).unwrap().unwrap();
        p.free(&mut d, a.addr).unwrap();
        p.free(&mut d, b.addr).unwrap();
        // 8 MiB from free 6 + 4: all of b's 6 MiB, then 2 of a's 4; 2 MiB stay free at a + 2 MiB.
        let s = p.malloc(&mut d, 8 * MIB, 0).unwrap().unwrap();
        assert_eq!(d.reserved(), 12 * MIB);
        assert_eq!(p.large.best_fit(0, 1), Some((a.addr + 2 * MIB, 2 * MIB)));
        // The 2 MiB left over serves a 2 MiB request exactly (S1), with no new memory.
        let e = p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap();
        assert_eq!(e.addr, a.addr + 2 * MIB);
        assert_eq!(d.reserved(), 12 * MIB);
        p.free(&mut d, s.addr).unwrap();
        p.check_invariants().unwrap();
    }

    #[test]
    fn small_requests_use_a_small_pool() {
        let mut d = SimDevice::default();
        let mut p = Stitch::from_options("").unwrap();
        let a = p.malloc(&mut d, 1000, 0).unwrap().unwrap();
        let b = p.malloc(&mut d, 1 << 20, 0).unwrap().unwrap();
        assert_eq!((a.block_size, b.block_size), (1024, 1 << 20));
        assert_eq!(b.addr, a.addr + 1024);
        assert_eq!(d.reserved(), 2 * MIB);
        assert!(Stitch::from_options("small=4MiB").is_err());
        assert!(Stitch::from_options("granule=1").unwrap_err().message().contains("small"));
    }

    #[test]
    fn property_checker() {
        for seed in 0..4 {
            let mut p = Stitch::from_options("").unwrap();
            let c = run_checked(&mut p, &workload(seed, 1500), None);
            assert!(c.peak_reserved >= c.peak_requested);
        }
        run_checked(&mut Stitch::from_options("").unwrap(), &workload(3, 2000), Some(96 * MIB));
    }
}
