//! `bound`: the peak of live requested bytes, the floor no allocator can go below.
//!
//! Every request gets a device allocation of exactly its size, released at its free, so reserved
//! memory always equals the live requested bytes. This is XLA's `NoFragmentationStatsHeap`
//! reference line: the overhead of any real policy over `bound` is what rounding, caching and
//! fragmentation cost. It takes no options.

use super::chunks::unknown_block;
use super::options::{self as opt, OptionKey};
use super::{Allocation, Policy, Registration, Role};
use crate::backend::Backend;
use crate::error::Result;
use crate::trace::AddrMap;
use crate::trace::{Block, BlockState, PoolKind, Segment};

/// The options `bound` accepts (none).
pub const KEYS: &[OptionKey<Bound>] = &[];

/// The policy's name in `--policy`.
pub const NAME: &str = "bound";

/// `bound`'s line in [`POLICIES`](super::POLICIES).
pub const POLICY: Registration<Bound> = Registration {
    name: NAME,
    summary: "the peak of live requested bytes: no allocator can reserve less",
    role: Role::Floor,
    options: || opt::help(KEYS),
    build: |options, _| Bound::from_options(options),
};

/// The lower bound; see the module docs.
#[derive(Debug, Default)]
pub struct Bound {
    live: AddrMap<(u64, u64)>,
    allocated: u64,
}

impl Bound {
    /// Builds the policy; it accepts no options.
    pub(crate) fn from_options(options: &str) -> Result<Bound> {
        let bound = opt::parse(NAME, options, KEYS)?;
        Ok(bound)
    }
}

impl Policy for Bound {
    fn config(&self) -> String {
        String::new()
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        let Some(addr) = backend.segment_alloc(size)? else { return Ok(None) };
        self.live.insert(addr, (size, stream));
        self.allocated += size;
        Ok(Some(Allocation::new(addr, size)))
    }

    fn free<B: Backend>(&mut self, backend: &mut B, addr: u64) -> Result<()> {
        let (size, _) = self.live.remove(&addr).ok_or_else(|| unknown_block(NAME, addr))?;
        self.allocated -= size;
        backend.segment_free(addr, size)
    }

    fn empty_cache<B: Backend>(&mut self, _backend: &mut B) -> Result<()> {
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Every live block is its own exactly-sized segment.
    fn segments(&self) -> Vec<Segment> {
        let mut out: Vec<Segment> = self
            .live
            .iter()
            .map(|(&address, &(size, stream))| Segment {
                device: 0,
                address,
                total_size: size,
                stream,
                pool: PoolKind::Large,
                is_expandable: false,
                private_pool: None,
                blocks: vec![Block {
                    address,
                    size,
                    requested_size: size,
                    state: BlockState::ActiveAllocated,
                }],
            })
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let sum: u64 = self.live.values().map(|&(size, _)| size).sum();
        if sum != self.allocated {
            return Err(format!(
                "allocated counter {} != sum of live blocks {sum}",
                self.allocated
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SimDevice;

    #[test]
    fn reserved_equals_live_requested() {
        let mut d = SimDevice::default();
        let mut p = Bound::from_options("").unwrap();
        let a = p.malloc(&mut d, 1000, 0).unwrap().unwrap();
        let b = p.malloc(&mut d, 3, 1).unwrap().unwrap();
        assert_eq!(d.reserved(), 1003);
        assert_eq!(p.segments().iter().map(|s| s.total_size).sum::<u64>(), 1003);
        p.free(&mut d, a.addr).unwrap();
        assert_eq!(d.reserved(), 3);
        assert_eq!(p.segments()[0].blocks[0].requested_size, 3);
        p.free(&mut d, b.addr).unwrap();
        assert_eq!((d.reserved(), p.allocated()), (0, 0));
        assert!(Bound::from_options("x=1").is_err());
    }
}
