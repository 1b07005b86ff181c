//! `nocache`: PyTorch with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: one `cudaMalloc` per request.
//!
//! Upstream: `c10/cuda/CUDACachingAllocator.cpp`, `forceUncachedAllocator()` and
//! `uncached_delete`: with the variable set, `malloc` calls `cudaMalloc(request)` directly and
//! `free` calls `cudaFree` at once; there is no rounding by PyTorch, no cache and no trace entries
//! (docs/pytorch-model.md#nocache). What remains to model is what the CUDA driver holds for each
//! `cudaMalloc`:
//!
//! - **Small requests share pages.** The driver sub-allocates requests smaller than a page from
//!   shared 2 MiB pages, at 512-byte granularity (consecutive small `cudaMalloc` pointers are 512 B
//!   apart; PyTorch's `kMinBlockSize` = 512 exists to match it). Charging each small request a whole
//!   2 MiB page would overstate a workload of small tensors up to 4096-fold, so a request below
//!   `page` costs its size rounded up to `align` (512 B). This treats the driver's packing of small
//!   requests as perfect, so it slightly understates them (the slack of partly filled pages).
//! - **Large requests take whole pages.** A request of at least `page` bytes is backed by its own
//!   physical 2 MiB pages (the granularity `cuMemGetAllocationGranularity` reports on current
//!   NVIDIA GPUs, and the step in which `cudaMemGetInfo`'s free memory falls), so it costs its size
//!   rounded up to `page`.
//!
//! Each request is one backend segment of that cost; the block handed out (allocated bytes) is the
//! request rounded up to `align`. Options (`nocache:key=value,...`): `align` (default 512 B),
//! `page` (default 2 MiB; `page=512` charges every request only its 512-byte rounding, the
//! lowest estimate). Streams are ignored, and `empty_cache` has nothing to release.

use super::chunks::{round_up, unknown_block};
use super::options::{self as opt, OptionKey};
use super::{Allocation, Policy, Registration, Role};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::AddrMap;
use crate::trace::{Block, BlockState, PoolKind, Segment};
use crate::units::MIB;

/// The policy's name in `--policy`.
pub const NAME: &str = "nocache";

/// The option keys `nocache` accepts: they drive the parser, the help and the errors.
pub const KEYS: &[OptionKey<NoCacheOptions>] =
    &[OptionKey::size("align", |o, v| o.align = v), OptionKey::size("page", |o, v| o.page = v)];

/// `nocache`'s line in [`POLICIES`](super::POLICIES).
pub const POLICY: Registration<NoCache> = Registration {
    name: NAME,
    summary: "no caching: one cudaMalloc per request (PYTORCH_NO_CUDA_MEMORY_CACHING=1)",
    role: Role::Online,
    options: || opt::help(KEYS),
    build: |options, _| NoCache::from_options(options),
};

/// `nocache`'s options; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoCacheOptions {
    /// The driver's allocation granularity for small requests (512 B).
    pub(crate) align: u64,
    /// The physical page size; requests of at least this size are rounded up to it (2 MiB).
    pub(crate) page: u64,
}

impl Default for NoCacheOptions {
    fn default() -> Self {
        NoCacheOptions { align: 512, page: 2 * MIB }
    }
}

/// A live block: (cost in device memory, block size, request, stream).
#[derive(Clone, Copy, Debug)]
struct Live {
    cost: u64,
    block: u64,
    request: u64,
    stream: u64,
}

/// No caching; see the module docs.
#[derive(Debug, Default)]
pub struct NoCache {
    options: NoCacheOptions,
    live: AddrMap<Live>,
    allocated: u64,
}

impl NoCache {
    /// Builds the policy from `key=value` options (see [`KEYS`]).
    pub(crate) fn from_options(options: &str) -> Result<NoCache> {
        let o = opt::parse(NAME, options, KEYS)?;
        if o.align == 0 || o.page == 0 || o.page % o.align != 0 {
            return Err(Error::usage(format!(
                "align ({}) and page ({}) must be positive and page a multiple of align",
                o.align, o.page
            )));
        }
        Ok(NoCache { options: o, ..NoCache::default() })
    }

    /// The device memory a `cudaMalloc(size)` costs under this model.
    pub(crate) fn cost(&self, size: u64) -> u64 {
        if size >= self.options.page {
            round_up(size, self.options.page)
        } else {
            round_up(size.max(1), self.options.align)
        }
    }
}

impl Policy for NoCache {
    fn config(&self) -> String {
        format!("align={},page={}", self.options.align, self.options.page)
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        let cost = self.cost(size);
        let Some(addr) = backend.segment_alloc(cost)? else { return Ok(None) };
        let block = round_up(size.max(1), self.options.align);
        self.live.insert(addr, Live { cost, block, request: size, stream });
        self.allocated += block;
        Ok(Some(Allocation::new(addr, block)))
    }

    fn free<B: Backend>(&mut self, backend: &mut B, addr: u64) -> Result<()> {
        let l = self.live.remove(&addr).ok_or_else(|| unknown_block(NAME, addr))?;
        self.allocated -= l.block;
        backend.segment_free(addr, l.cost)
    }

    fn empty_cache<B: Backend>(&mut self, _backend: &mut B) -> Result<()> {
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn segments(&self) -> Vec<Segment> {
        let mut out: Vec<Segment> = self
            .live
            .iter()
            .map(|(&addr, l)| {
                let mut blocks = vec![Block {
                    address: addr,
                    size: l.block,
                    requested_size: l.request,
                    state: BlockState::ActiveAllocated,
                }];
                if l.cost > l.block {
                    blocks.push(Block {
                        address: addr + l.block,
                        size: l.cost - l.block,
                        requested_size: 0,
                        state: BlockState::Inactive,
                    });
                }
                Segment {
                    device: 0,
                    address: addr,
                    total_size: l.cost,
                    stream: l.stream,
                    pool: if l.cost < self.options.page {
                        PoolKind::Small
                    } else {
                        PoolKind::Large
                    },
                    is_expandable: false,
                    private_pool: None,
                    blocks,
                }
            })
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let sum: u64 = self.live.values().map(|l| l.block).sum();
        if sum != self.allocated {
            return Err(format!("allocated {} != sum of live blocks {sum}", self.allocated));
        }
        match self.live.iter().find(|(_, l)| l.cost < l.block || l.block < l.request) {
            Some((a, _)) => Err(format!("block {a:#x}: cost < block or block < request")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SimDevice;
    use crate::testing::{run_checked, workload};

    #[test]
    fn small_requests_cost_512_byte_steps_large_ones_whole_pages() {
        let mut d = SimDevice::default();
        let mut p = NoCache::from_options("").unwrap();
        let a = p.malloc(&mut d, 1000, 0).unwrap().unwrap();
        assert_eq!((a.block_size, d.reserved()), (1024, 1024));
        let b = p.malloc(&mut d, 2 * MIB - 1, 0).unwrap().unwrap();
        assert_eq!(d.reserved(), 1024 + 2 * MIB, "below a page: 512-byte rounding");
        let c = p.malloc(&mut d, 2 * MIB + 1, 0).unwrap().unwrap();
        assert_eq!(c.block_size, 2 * MIB + 512);
        assert_eq!(d.reserved(), 1024 + 2 * MIB + 4 * MIB, "a page and one byte: two pages");
        for x in [a, b, c] {
            p.free(&mut d, x.addr).unwrap();
        }
        assert_eq!((d.reserved(), p.allocated()), (0, 0));
        let mut flat = NoCache::from_options("page=512").unwrap();
        flat.malloc(&mut d, 3 * MIB + 1, 0).unwrap().unwrap();
        assert_eq!(d.reserved(), 3 * MIB + 512);
    }

    #[test]
    fn options_are_checked() {
        assert!(NoCache::from_options("page=1000").is_err());
        let e = NoCache::from_options("granularity=2MiB").unwrap_err();
        assert!(e.message().contains("page"), "{}", e.message());
    }

    #[test]
    fn property_checker() {
        for seed in 0..3 {
            run_checked(&mut NoCache::from_options("").unwrap(), &workload(seed, 1500), None);
        }
    }
}
