//! `bfc`: TensorFlow/XLA's best-fit-with-coalescing allocator.
//!
//! Upstream: `openxla/xla` `xla/tsl/framework/bfc_allocator.cc` (`AllocateRawInternal`,
//! `FindChunkPtr`, `Extend`, `DeallocateFreeRegions`, `FreeAndMaybeCoalesce`), the allocator
//! behind TensorFlow's GPU memory and JAX. The rules modelled:
//!
//! - **Rounding**: every request is rounded up to a multiple of `kMinAllocationSize` = 256 bytes.
//! - **Bins**: 21 bins; bin *b* holds free chunks of [256·2^b, 256·2^(b+1)), the last one everything
//!   bigger (`bin_for_size`). Each bin is ordered by (size, address) and a search starts at the
//!   request's bin and scans upward, taking the first chunk that fits. Because bins partition
//!   sizes in ascending order, that is exactly the smallest fitting chunk overall with the lowest
//!   address on ties, so one ordered set keyed by (size, address) gives the same choice.
//! - **Split** (`FindChunkPtr`): the chosen chunk is split when `chunk ≥ 2 × rounded` or when
//!   keeping it whole would waste `chunk − rounded ≥ max_internal_fragmentation_bytes` (128 MiB,
//!   the default when `fragmentation_fraction` is unset). The request takes the chunk's front.
//! - **Coalescing**: a freed chunk merges with free neighbours of the same region (never across
//!   regions: the GPU sub-allocator does not support region merging).
//! - **Growth** (`Extend`): with `allow_growth=true` the first region is `min(memory_limit, 2 MiB)`
//!   and the region size doubles after every extension; if a request is bigger, it doubles until
//!   the request fits and then does *not* double again. A region never exceeds what is left of
//!   `memory_limit`. When the device refuses, the size backs off by 0.9× (rounded to 256) until it
//!   drops below the request. With `allow_growth=false` the first region is the whole
//!   `memory_limit` (TF allocates it at the first request).
//! - **Garbage collection** (`DeallocateFreeRegions`): before reporting an OOM, regions with no
//!   chunk in use are returned to the device, then `Extend` is retried. On by default, as on GPU
//!   (`TF_ENABLE_GPU_GARBAGE_COLLECTION`).
//!
//! Options (`bfc:key=value,...`): `allow_growth` (default `true`: TF's default preallocates the
//! whole device, which a simulator without a device size cannot do; pass `allow_growth=false,
//! memory_limit=40GiB` for that), `memory_limit` (default none: unlimited; the device's
//! `--capacity` still applies), `garbage_collection` (default `true`).
//!
//! Deviations: streams are ignored (TF runs one compute stream per device; its timestamped
//! cross-stream merging is not modelled); `empty_cache` (which TF does not have) releases every
//! free region, as garbage collection would, so the trace's recorded `empty_cache()` calls and
//! the final flush behave as in PyTorch.

use super::chunks::{round_up, unknown_block, Chunks};
use super::options::{self as opt, OptionKey};
use super::{Allocation, Policy, Registration, Role};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::{PoolKind, Segment};
use crate::units::MIB;

/// The policy's name in `--policy`.
pub const NAME: &str = "bfc";

/// The option keys `bfc` accepts: they drive the parser, the help and the errors.
pub const KEYS: &[OptionKey<BfcOptions>] = &[
    OptionKey::flag("allow_growth", |o, v| o.allow_growth = v),
    OptionKey::size("memory_limit", |o, v| o.memory_limit = Some(v)),
    OptionKey::flag("garbage_collection", |o, v| o.garbage_collection = v),
];

/// `bfc`'s line in [`POLICIES`](super::POLICIES).
pub const POLICY: Registration<Bfc> = Registration {
    name: NAME,
    summary: "TensorFlow/XLA best-fit with coalescing (bfc_allocator.cc)",
    role: Role::Online,
    options: || opt::help(KEYS),
    build: |options, _| Bfc::from_options(options),
};

/// `kMinAllocationSize`: the rounding unit and minimum chunk.
pub const MIN_ALLOCATION: u64 = 256;
/// `kNumBins`.
pub const NUM_BINS: usize = 21;
/// The default `max_internal_fragmentation_bytes`.
pub const MAX_INTERNAL_FRAGMENTATION: u64 = 128 * MIB;
/// `kBackpedalFactor` in `Extend`.
const BACKPEDAL: f64 = 0.9;

#[cfg(test)]
/// The bin a chunk of `size` bytes lives in (`BinNumForSize`).
pub(crate) fn bin_for_size(size: u64) -> usize {
    let v = size.max(MIN_ALLOCATION) >> 8;
    (63 - v.leading_zeros() as usize).min(NUM_BINS - 1)
}

/// `bfc`'s options; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BfcOptions {
    /// Grow by doubling regions (true) or take `memory_limit` at once (false).
    pub(crate) allow_growth: bool,
    /// The most bytes of regions at once; `None` is unlimited.
    pub(crate) memory_limit: Option<u64>,
    /// Return free regions to the device before reporting an OOM.
    pub(crate) garbage_collection: bool,
}

impl Default for BfcOptions {
    fn default() -> Self {
        BfcOptions { allow_growth: true, memory_limit: None, garbage_collection: true }
    }
}

/// The BFC allocator; see the module docs.
#[derive(Debug)]
pub struct Bfc {
    options: BfcOptions,
    chunks: Chunks,
    memory_limit: u64,
    curr_region_allocation_bytes: u64,
    total_region_allocated_bytes: u64,
}

impl Bfc {
    /// Builds the policy from `key=value` options (see [`KEYS`]).
    pub(crate) fn from_options(options: &str) -> Result<Bfc> {
        let o = opt::parse(NAME, options, KEYS)?;
        Bfc::new(o)
    }

    /// Builds the policy from parsed options.
    pub(crate) fn new(options: BfcOptions) -> Result<Bfc> {
        if !options.allow_growth && options.memory_limit.is_none() {
            return Err(Error::usage(
                "allow_growth=false needs memory_limit=SIZE (the region taken up front)",
            ));
        }
        let memory_limit = options.memory_limit.unwrap_or(u64::MAX / 2);
        if memory_limit < MIN_ALLOCATION {
            return Err(Error::usage("memory_limit must be at least 256 bytes"));
        }
        let first = if options.allow_growth { memory_limit.min(2 * MIB) } else { memory_limit };
        Ok(Bfc {
            options,
            chunks: Chunks::default(),
            memory_limit,
            curr_region_allocation_bytes: round_up(first, MIN_ALLOCATION),
            total_region_allocated_bytes: 0,
        })
    }

    /// `FindChunkPtr`: best fit, split by the 2× / 128 MiB rule.
    fn find_chunk(&mut self, rounded: u64, request: u64) -> Option<u64> {
        let (addr, size) = self.chunks.best_fit(0, rounded)?;
        let split = size >= rounded * 2 || size - rounded >= MAX_INTERNAL_FRAGMENTATION;
        self.chunks.take(addr, rounded, request, split, 0);
        Some(addr)
    }

    /// `Extend`: adds a region big enough for `rounded` bytes; false when it cannot.
    fn extend<B: Backend>(&mut self, backend: &mut B, rounded: u64, stream: u64) -> Result<bool> {
        let available = self.memory_limit - self.total_region_allocated_bytes;
        let available = available / MIN_ALLOCATION * MIN_ALLOCATION;
        if rounded > available {
            return Ok(false);
        }
        // Region sizes double but never past the limit, so doubling cannot overflow (TF's
        // size_t would wrap after 43 extensions from 2 MiB; `rounded ≤ available` ends the loop).
        let limit = round_up(self.memory_limit, MIN_ALLOCATION);
        let mut increased = false;
        while rounded > self.curr_region_allocation_bytes {
            self.curr_region_allocation_bytes =
                self.curr_region_allocation_bytes.saturating_mul(2).min(limit);
            increased = true;
        }
        let mut bytes = self.curr_region_allocation_bytes.min(available);
        let mut addr = backend.segment_alloc(bytes)?;
        while addr.is_none() {
            // Back off by 0.9×, rounded to 256 bytes. Below 2,560 bytes the rounding can undo
            // the 0.9× (2,304 → 2,073.6 → 2,304): TF loops forever there when the device keeps
            // refusing; here every retry must shrink, else the request is out of memory.
            let next = round_up((bytes as f64 * BACKPEDAL) as u64, MIN_ALLOCATION);
            if next < rounded || next >= bytes {
                break;
            }
            bytes = next;
            addr = backend.segment_alloc(bytes)?;
        }
        let Some(base) = addr else { return Ok(false) };
        if !increased {
            self.curr_region_allocation_bytes =
                self.curr_region_allocation_bytes.saturating_mul(2).min(limit);
        }
        self.total_region_allocated_bytes += bytes;
        self.chunks.add_region(base, bytes, stream);
        self.chunks.add_free(base, bytes, base, 0);
        Ok(true)
    }

    /// Returns every region with no chunk in use to the device.
    fn release_free_regions<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.total_region_allocated_bytes -= self.chunks.release_idle_regions(backend)?;
        Ok(())
    }

    /// `DeallocateFreeRegions`: true when free regions were released and that may let the
    /// request fit under `memory_limit`.
    fn deallocate_free_regions<B: Backend>(
        &mut self,
        backend: &mut B,
        rounded: u64,
    ) -> Result<bool> {
        if !self.options.garbage_collection {
            return Ok(false);
        }
        let total_free: u64 = self
            .chunks
            .regions()
            .iter()
            .filter(|(&b, _)| self.chunks.region_is_free(b))
            .map(|(_, r)| r.size)
            .sum();
        if total_free == 0 {
            return Ok(false);
        }
        let available = self.memory_limit - self.total_region_allocated_bytes + total_free;
        if rounded > available {
            return Ok(false);
        }
        self.release_free_regions(backend)?;
        Ok(true)
    }
}

impl Policy for Bfc {
    fn config(&self) -> String {
        let limit = self.options.memory_limit.map_or("none".to_string(), |l| l.to_string());
        format!(
            "allow_growth={},memory_limit={limit},garbage_collection={}",
            self.options.allow_growth, self.options.garbage_collection
        )
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        let rounded = round_up(size.max(1), MIN_ALLOCATION);
        let found = match self.find_chunk(rounded, size) {
            Some(a) => Some(a),
            None if self.extend(backend, rounded, stream)? => self.find_chunk(rounded, size),
            None => None,
        };
        let found = match found {
            Some(a) => Some(a),
            None if self.deallocate_free_regions(backend, rounded)?
                && self.extend(backend, rounded, stream)? =>
            {
                self.find_chunk(rounded, size)
            }
            None => None,
        };
        Ok(found
            .map(|addr| Allocation::new(addr, self.chunks.get(addr).map_or(rounded, |c| c.size))))
    }

    fn free<B: Backend>(&mut self, _backend: &mut B, addr: u64) -> Result<()> {
        self.chunks.release(addr, 0).map(|_| ()).ok_or_else(|| unknown_block(NAME, addr))
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.release_free_regions(backend)
    }

    fn allocated(&self) -> u64 {
        self.chunks.allocated()
    }

    fn segments(&self) -> Vec<Segment> {
        self.chunks.segments(0, PoolKind::Large, false)
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let regions = self.chunks.check_region_total(
            self.total_region_allocated_bytes,
            "total_region_allocated_bytes",
            "regions",
        )?;
        if regions > self.memory_limit {
            return Err(format!("regions {regions} exceed memory_limit {}", self.memory_limit));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Recording, SimDevice};
    use crate::testing::{run_checked, workload};

    #[test]
    fn bins_follow_powers_of_two_from_256() {
        assert_eq!(bin_for_size(1), 0);
        assert_eq!(bin_for_size(511), 0);
        assert_eq!(bin_for_size(512), 1);
        assert_eq!(bin_for_size(1 << 20), 12); // 2^20 / 256 = 2^12
        assert_eq!(bin_for_size(256 << 20), 20);
        assert_eq!(bin_for_size(1 << 40), 20, "the last bin takes everything bigger");
    }

    #[test]
    fn rounding_and_the_two_times_split_rule() {
        let mut d = SimDevice::default();
        let mut p = Bfc::from_options("").unwrap();
        // 1000 B rounds to 1024; the first region is 2 MiB, split (2 MiB ≥ 2 × 1024).
        let a = p.malloc(&mut d, 1000, 0).unwrap().unwrap();
        assert_eq!(a.block_size, 1024);
        assert_eq!(d.reserved(), 2 * MIB);
        // Free chunk is now 2 MiB − 1024. A request of 1.5 MiB: chunk < 2 × request and the
        // waste (0.5 MiB − 1 KiB) < 128 MiB, so the whole chunk is handed out unsplit.
        let b = p.malloc(&mut d, 3 * MIB / 2, 0).unwrap().unwrap();
        assert_eq!(b.addr, a.addr + 1024);
        assert_eq!(b.block_size, 2 * MIB - 1024);
        assert_eq!(p.allocated(), 2 * MIB);
        p.check_invariants().unwrap();
    }

    #[test]
    fn the_128_mib_waste_rule_splits_chunks_under_two_times() {
        let mut d = SimDevice::default();
        let mut p = Bfc::from_options("allow_growth=false,memory_limit=400MiB").unwrap();
        // One 400 MiB region. A 250 MiB request: 400 < 2 × 250, but the waste 150 MiB ≥ 128 MiB.
        let a = p.malloc(&mut d, 250 * MIB, 0).unwrap().unwrap();
        assert_eq!(a.block_size, 250 * MIB);
        assert_eq!(d.reserved(), 400 * MIB);
        // The remaining 150 MiB chunk and a 100 MiB request: 150 < 200 and 50 < 128: no split.
        let b = p.malloc(&mut d, 100 * MIB, 0).unwrap().unwrap();
        assert_eq!(b.block_size, 150 * MIB);
        // Region full and memory_limit reached: OOM.
        assert_eq!(p.malloc(&mut d, 256, 0).unwrap(), None);
    }

    #[test]
    fn regions_double_and_stop_doubling_after_a_big_request() {
        let mut d = Recording::<SimDevice>::default();
        let mut p = Bfc::from_options("").unwrap();
        p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap(); // region 2 MiB, next 4 MiB
        p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap(); // region 4 MiB, next 8 MiB
        p.malloc(&mut d, 3 * MIB, 0).unwrap().unwrap(); // 2 MiB tail is too small: region 8 MiB
                                                        // 20 MiB > 16 MiB: doubles to 32 MiB, and does not double again.
        p.malloc(&mut d, 20 * MIB, 0).unwrap().unwrap();
        p.malloc(&mut d, 40 * MIB, 0).unwrap().unwrap(); // 64 MiB (doubled while too small)
                                                         // 60 MiB fits the 64 MiB region size: 64 MiB again, and now it doubles (to 128 MiB).
        p.malloc(&mut d, 60 * MIB, 0).unwrap().unwrap();
        p.malloc(&mut d, 70 * MIB, 0).unwrap().unwrap();
        assert_eq!(
            d.segment_sizes(),
            vec![2 * MIB, 4 * MIB, 8 * MIB, 32 * MIB, 64 * MIB, 64 * MIB, 128 * MIB]
        );
    }

    #[test]
    fn freed_neighbours_coalesce_within_a_region() {
        let mut d = SimDevice::new(Some(8 * MIB));
        let mut p = Bfc::from_options("").unwrap();
        let a = p.malloc(&mut d, MIB, 0).unwrap().unwrap(); // region A: 2 MiB
        let b = p.malloc(&mut d, MIB, 0).unwrap().unwrap(); // rest of A (no split: 1 MiB < 2 MiB)
        assert_eq!(b.addr, a.addr + MIB);
        let c = p.malloc(&mut d, 3 * MIB, 0).unwrap().unwrap(); // region B: 4 MiB
        p.free(&mut d, a.addr).unwrap();
        p.free(&mut d, b.addr).unwrap();
        // A is whole again: a 2 MiB request fits it exactly.
        let a2 = p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap();
        assert_eq!((a2.addr, a2.block_size), (a.addr, 2 * MIB));
        p.free(&mut d, a2.addr).unwrap();
        p.free(&mut d, c.addr).unwrap();
        p.empty_cache(&mut d).unwrap();
        assert_eq!(d.reserved(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn garbage_collection_lets_a_bigger_region_replace_free_ones() {
        let mut d = SimDevice::new(Some(10 * MIB));
        let mut p = Bfc::from_options("").unwrap();
        let a = p.malloc(&mut d, 2 * MIB, 0).unwrap().unwrap(); // region 2 MiB
        let b = p.malloc(&mut d, 4 * MIB, 0).unwrap().unwrap(); // region 4 MiB
        p.free(&mut d, a.addr).unwrap();
        p.free(&mut d, b.addr).unwrap();
        // 8 MiB: Extend tries 8 MiB with 6 MiB held on a 10 MiB device: fails, backs off to
        // 7.2 MiB < 8 MiB, gives up. GC frees both regions; Extend then gets 8 MiB.
        let c = p.malloc(&mut d, 8 * MIB, 0).unwrap().unwrap();
        assert_eq!(c.block_size, 8 * MIB);
        assert_eq!(d.reserved(), 8 * MIB);
        let mut off = Bfc::from_options("garbage_collection=false").unwrap();
        let mut d2 = SimDevice::new(Some(10 * MIB));
        let a = off.malloc(&mut d2, 2 * MIB, 0).unwrap().unwrap();
        let b = off.malloc(&mut d2, 4 * MIB, 0).unwrap().unwrap();
        off.free(&mut d2, a.addr).unwrap();
        off.free(&mut d2, b.addr).unwrap();
        assert_eq!(off.malloc(&mut d2, 8 * MIB, 0).unwrap(), None);
    }

    #[test]
    fn a_full_device_refuses_small_requests_without_looping() {
        // The device is full: every Extend fails, and the 0.9× back-off from the region size
        // reaches sizes where rounding to 256 bytes no longer shrinks them (2,304 B). The
        // malloc must end, out of memory, after a bounded number of device calls.
        let mut d = SimDevice::new(Some(2 * MIB));
        let mut p = Bfc::from_options("").unwrap();
        assert!(p.malloc(&mut d, 2 * MIB, 0).unwrap().is_some());
        for size in [1, 256, 2000, 2304, 2560, 4096, MIB] {
            assert_eq!(p.malloc(&mut d, size, 0).unwrap(), None, "{size} bytes");
        }
        assert_eq!(d.reserved(), 2 * MIB);
        p.check_invariants().unwrap();
    }

    #[test]
    fn region_sizes_stop_doubling_at_the_limit() {
        let mut d = SimDevice::default();
        let mut p = Bfc::from_options("memory_limit=8MiB").unwrap();
        let served = (0..16).filter(|_| p.malloc(&mut d, MIB, 0).unwrap().is_some()).count();
        assert_eq!(served, 8);
        assert_eq!(p.curr_region_allocation_bytes, 8 * MIB);
        p.check_invariants().unwrap();
    }

    #[test]
    fn options_are_checked() {
        assert!(Bfc::from_options("allow_growth=false").is_err());
        let e = Bfc::from_options("growth=1").unwrap_err();
        assert!(e.message().contains("allow_growth"), "{}", e.message());
        assert_eq!(
            Bfc::from_options("memory_limit=1GiB").unwrap().config(),
            "allow_growth=true,memory_limit=1073741824,garbage_collection=true"
        );
    }

    #[test]
    fn property_checker() {
        for seed in 0..4 {
            let c = run_checked(&mut Bfc::from_options("").unwrap(), &workload(seed, 1500), None);
            assert!(c.peak_reserved >= c.peak_requested);
        }
        run_checked(&mut Bfc::from_options("").unwrap(), &workload(9, 2000), Some(96 * MIB));
    }
}
