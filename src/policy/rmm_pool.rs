//! `rmm-pool`: RAPIDS RMM's `pool_memory_resource`, "a coalescing best-fit suballocator".
//!
//! Upstream: `rapidsai/rmm` `cpp/include/rmm/mr/pool_memory_resource.hpp` (`size_to_grow`,
//! `try_to_expand`, `expand_pool`, `allocate_from_block`, `free_block`),
//! `mr/detail/stream_ordered_memory_resource.hpp` (`get_block`, `get_block_from_other_stream`)
//! and `mr/detail/coalescing_free_list.hpp`. The rules modelled:
//!
//! - **Alignment**: requests are rounded up to `CUDA_ALLOCATION_ALIGNMENT` = 256 bytes.
//! - **Per-stream free lists**: a freed block goes to the free list of its stream (the engine frees
//!   on the allocation stream, as PyTorch does), merging with adjacent free blocks of that list
//!   that came from the same upstream allocation (a block is never merged across upstream
//!   allocations: RMM's `is_head`).
//! - **Best fit** (`coalescing_free_list::get_block`): the smallest block that fits, the lowest
//!   address on ties (the list is address-ordered and `min_element` keeps the first); the block is
//!   split and the remainder goes back to the list it came from.
//! - **Stream order** (`get_block`): first the request's own stream's list; then each other
//!   stream's list in turn *without* merging (RMM inserts a `cudaStreamWaitEvent` and leaves the
//!   remainder on that stream's list); then, one other stream at a time, that stream's whole list
//!   is merged into the request's list (`merge_lists`, after a sync) and best fit is retried; only
//!   then does the pool grow. Other streams are visited in ascending stream id (RMM: `std::map`
//!   order of `stream_event_pair`).
//! - **Growth** (`size_to_grow`): without `maximum`, `max(request, current pool size)`, i.e. the pool
//!   doubles; with `maximum`, `max(request, remaining / 2)` (remaining rounded up to 256), or
//!   nothing once the request exceeds what remains. `try_to_expand` halves a refused size down
//!   to the request before giving up; the new block serves the request and its remainder joins
//!   the request stream's list.
//! - **Initial pool**: `initial` bytes taken at the first request and put on the default stream's
//!   (0) list, as RMM's constructor does with `cuda_stream_legacy`.
//!
//! Options (`rmm-pool:key=value,...`): `initial` (default 0: RMM ≥ 24.x requires the caller to
//! pick one; older versions took half the free device memory, which a simulator without a device
//! size cannot know), `maximum` (default none: unlimited).
//!
//! Deviations: RMM never returns memory before the resource is destroyed and has no
//! `empty_cache`; here `empty_cache` returns every upstream allocation with nothing in use (what
//! `release()` does for an idle pool), so recorded `empty_cache()` calls and the final flush behave
//! as in PyTorch. An OOM releases nothing (RMM throws `out_of_memory`).

use super::chunks::{round_up, unknown_block, Chunks};
use super::options::{self as opt, OptionKey};
use super::{Allocation, Policy, Registration, Role};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::{PoolKind, Segment};

/// The policy's name in `--policy`.
pub const NAME: &str = "rmm-pool";

/// The option keys `rmm-pool` accepts: they drive the parser, the help and the errors.
pub const KEYS: &[OptionKey<RmmPoolOptions>] = &[
    OptionKey::size("initial", |o, v| o.initial = v),
    OptionKey::size("maximum", |o, v| o.maximum = Some(v)),
];

/// `rmm-pool`'s line in [`POLICIES`](super::POLICIES).
pub const POLICY: Registration<RmmPool> = Registration {
    name: NAME,
    summary: "RAPIDS RMM pool_memory_resource (coalescing best fit per stream)",
    role: Role::Online,
    options: || opt::help(KEYS),
    build: |options, _| RmmPool::from_options(options),
};

/// `CUDA_ALLOCATION_ALIGNMENT`.
pub const ALIGNMENT: u64 = 256;

/// `rmm-pool`'s options; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RmmPoolOptions {
    /// Bytes taken at the first request (`initial_pool_size`); 0 for none.
    pub(crate) initial: u64,
    /// The pool's size limit (`maximum_pool_size`); `None` is unlimited.
    pub(crate) maximum: Option<u64>,
}

/// The RMM pool; see the module docs.
#[derive(Debug, Default)]
pub struct RmmPool {
    options: RmmPoolOptions,
    chunks: Chunks,
    pool_size: u64,
    initialized: bool,
}

impl RmmPool {
    /// Builds the policy from `key=value` options (see [`KEYS`]).
    pub(crate) fn from_options(options: &str) -> Result<RmmPool> {
        let o = opt::parse(NAME, options, KEYS)?;
        if let Some(max) = o.maximum {
            if o.initial > max {
                return Err(Error::usage(format!(
                    "initial ({}) exceeds maximum ({max})",
                    o.initial
                )));
            }
        }
        Ok(RmmPool { options: o, ..RmmPool::default() })
    }

    /// `size_to_grow`.
    fn size_to_grow(&self, aligned: u64) -> u64 {
        match self.options.maximum {
            Some(max) => {
                let remaining = round_up(max.saturating_sub(self.pool_size), ALIGNMENT);
                if aligned <= remaining {
                    aligned.max(remaining / 2)
                } else {
                    0
                }
            }
            None => aligned.max(self.pool_size),
        }
    }

    /// `try_to_expand`: a new upstream block of `try_size`, halving down to `min_size`.
    fn try_to_expand<B: Backend>(
        &mut self,
        backend: &mut B,
        mut try_size: u64,
        min_size: u64,
        list: u64,
    ) -> Result<Option<u64>> {
        while try_size >= min_size && try_size > 0 {
            if let Some(base) = backend.segment_alloc(try_size)? {
                self.pool_size += try_size;
                self.chunks.add_region(base, try_size, list);
                self.chunks.add_free(base, try_size, base, list);
                return Ok(Some(base));
            }
            if try_size == min_size {
                break;
            }
            try_size = min_size.max(try_size / 2);
        }
        Ok(None)
    }

    fn serve(&mut self, addr: u64, aligned: u64, request: u64, stream: u64) -> Allocation {
        let block_size = self.chunks.take(addr, aligned, request, true, stream);
        Allocation::new(addr, block_size)
    }
}

impl Policy for RmmPool {
    fn config(&self) -> String {
        let max = self.options.maximum.map_or("none".to_string(), |m| m.to_string());
        format!("initial={},maximum={max}", self.options.initial)
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        if !self.initialized {
            self.initialized = true;
            if self.options.initial > 0 {
                let initial = self.options.initial;
                self.try_to_expand(backend, initial, initial, 0)?;
            }
        }
        let aligned = round_up(size.max(1), ALIGNMENT);
        // 1. The stream's own list.
        if let Some((addr, _)) = self.chunks.best_fit(stream, aligned) {
            return Ok(Some(self.serve(addr, aligned, size, stream)));
        }
        // 2. Other streams' lists, without merging.
        let others: Vec<u64> = self.chunks.lists().into_iter().filter(|&l| l != stream).collect();
        for &other in &others {
            if let Some((addr, _)) = self.chunks.best_fit(other, aligned) {
                return Ok(Some(self.serve(addr, aligned, size, stream)));
            }
        }
        // 3. Merge other streams' lists into ours, one at a time.
        for &other in &others {
            self.chunks.move_list(other, stream);
            if let Some((addr, _)) = self.chunks.best_fit(stream, aligned) {
                return Ok(Some(self.serve(addr, aligned, size, stream)));
            }
        }
        // 4. Grow the pool.
        let grow = self.size_to_grow(aligned);
        match self.try_to_expand(backend, grow, aligned, stream)? {
            Some(base) => Ok(Some(self.serve(base, aligned, size, stream))),
            None => Ok(None),
        }
    }

    fn free<B: Backend>(&mut self, _backend: &mut B, addr: u64) -> Result<()> {
        let owner = self
            .chunks
            .get(addr)
            .filter(|c| c.in_use)
            .map(|c| c.list)
            .ok_or_else(|| unknown_block(NAME, addr))?;
        self.chunks.release(addr, owner);
        Ok(())
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.pool_size -= self.chunks.release_idle_regions(backend)?;
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.chunks.allocated()
    }

    fn segments(&self) -> Vec<Segment> {
        self.chunks.segments(0, PoolKind::Large, false)
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.chunks.check_region_total(self.pool_size, "pool size", "upstream blocks")?;
        if let Some(max) = self.options.maximum {
            if self.pool_size > round_up(max, ALIGNMENT) {
                return Err(format!("pool size {} exceeds maximum {max}", self.pool_size));
            }
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
    fn grows_by_max_of_request_and_pool_size() {
        let mut d = Recording::<SimDevice>::default();
        let mut p = RmmPool::from_options("").unwrap();
        p.malloc(&mut d, 1000, 0).unwrap().unwrap(); // 1024: pool 0 → grow 1024
        p.malloc(&mut d, 3000, 0).unwrap().unwrap(); // 3072 > pool 1024 → grow 3072
        p.malloc(&mut d, 10_000, 0).unwrap().unwrap(); // 10240 > pool 4096 → grow 10240
        let small = p.malloc(&mut d, 100, 0).unwrap().unwrap(); // 256 < pool 14336 → grow 14336
        assert_eq!(d.segment_sizes(), vec![1024, 3072, 10_240, 14_336]);
        assert_eq!(small.block_size, 256);
        // The 14080-byte remainder serves the next requests: no growth.
        p.malloc(&mut d, 14_000, 0).unwrap().unwrap();
        assert_eq!(d.segment_sizes().len(), 4);
    }

    #[test]
    fn initial_and_maximum() {
        let mut d = Recording::<SimDevice>::default();
        let mut p = RmmPool::from_options("initial=16KiB,maximum=64KiB").unwrap();
        let a = p.malloc(&mut d, 1000, 0).unwrap().unwrap();
        // 20000 → 20224; 15360 free; remaining 49152 → grow max(20224, 24576).
        p.malloc(&mut d, 20_000, 0).unwrap().unwrap();
        assert_eq!(d.segment_sizes(), vec![16_384, 24_576]);
        // 30000 → 30208 > remaining 24576: no growth, OOM (the 4352 + 15360 free bytes don't fit).
        assert_eq!(p.malloc(&mut d, 30_000, 0).unwrap(), None);
        p.free(&mut d, a.addr).unwrap();
        assert_eq!(p.malloc(&mut d, 16_384, 0).unwrap().map(|b| b.addr), Some(a.addr));
        assert!(RmmPool::from_options("initial=2MiB,maximum=1MiB").is_err());
    }

    #[test]
    fn other_streams_are_used_before_growing_and_merged_last() {
        let mut d = Recording::<SimDevice>::default();
        let mut p = RmmPool::from_options("").unwrap();
        let big = p.malloc(&mut d, 1 << 20, 1).unwrap().unwrap();
        p.free(&mut d, big.addr).unwrap(); // 1 MiB free on stream 1's list
                                           // Stream 2 takes the front of stream 1's block; the remainder stays on stream 1.
        let x = p.malloc(&mut d, 512 << 10, 2).unwrap().unwrap();
        assert_eq!(x.addr, big.addr);
        let y = p.malloc(&mut d, 512 << 10, 1).unwrap().unwrap();
        assert_eq!(y.addr, big.addr + (512 << 10));
        p.free(&mut d, x.addr).unwrap(); // to stream 2's list
        p.free(&mut d, y.addr).unwrap(); // to stream 1's list: adjacent, but not merged
        assert_eq!(p.chunks.best_fit(1, 1 << 20), None);
        // Stream 3 needs 1 MiB: no single list has it; merging lists 1 and 2 into 3 does.
        let z = p.malloc(&mut d, 1 << 20, 3).unwrap().unwrap();
        assert_eq!(z.addr, big.addr);
        assert_eq!(d.segment_sizes(), vec![1 << 20]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn options_are_checked() {
        let e = RmmPool::from_options("max=1").unwrap_err();
        assert!(e.message().contains("maximum"), "{}", e.message());
    }

    #[test]
    fn property_checker() {
        for seed in 0..4 {
            run_checked(&mut RmmPool::from_options("").unwrap(), &workload(seed, 1500), None);
        }
        run_checked(
            &mut RmmPool::from_options("maximum=200MiB").unwrap(),
            &workload(5, 1500),
            Some(256 << 20),
        );
    }
}
