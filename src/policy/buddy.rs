//! `buddy`: a binary buddy allocator over power-of-two arenas.
//!
//! The classic scheme (Knowlton 1965; Knuth, TAOCP vol. 1, section 2.5; the Linux page allocator's
//! `__rmqueue_smallest` / `__free_one_page`; the `buddy_system_allocator` crate's `frame.rs`). No
//! mainstream GPU framework ships it as its default; it is here as the textbook point of
//! comparison for power-of-two rounding (which MXNet's `Round` pool also uses:
//! `src/storage/pooled_storage_manager.h` in `apache/mxnet`) against best-fit policies. The rules
//! modelled:
//!
//! - A request is rounded up to a power of two, at least `min_block`: a block of *order* k has
//!   `min_block · 2^k` bytes. Requests above `min_block · 2^max_order` fail.
//! - One free list per order, each ordered by address. A request of order k takes the
//!   lowest-addressed block of the smallest non-empty order j ≥ k and splits it down: each split
//!   keeps the lower half and puts the upper half (its buddy) on the free list of the order below.
//! - On free, a block merges with its buddy (the block whose offset in the arena differs only in
//!   bit k) as long as the buddy is free at the same order, climbing one order per merge.
//! - Memory comes from the device in arenas of `max(arena, block)` bytes, a power of two (default:
//!   the next power of two ≥ max(request, 2 MiB)). Block offsets are relative to the arena base,
//!   so arenas need no alignment beyond the device's. A wholly free arena is returned to the
//!   device by `empty_cache` and, when the device refuses a new arena, before reporting an OOM.
//!
//! Options (`buddy:key=value,...`): `min_block` (default 512 B, a power of two: PyTorch's
//! `kMinBlockSize`), `arena` (default 2 MiB, rounded up to a power of two: the smallest arena),
//! `max_order` (default 31: blocks up to 512 B · 2^31 = 1 TiB).
//!
//! Deviations: streams are ignored (a buddy allocator has no notion of them). Unlike the
//! `buddy_system_allocator` crate's trusting `dealloc`, freeing an unknown address is an error,
//! never a corruption of the free lists.

use super::chunks::unknown_block;
use super::options::{self as opt, OptionKey, Setter};
use super::{Allocation, Policy, Registration, Role};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::lifetimes::AddrMap;
use crate::trace::{Block, BlockState, PoolKind, Segment};
use crate::units::MIB;
use std::collections::BTreeMap;

/// The policy's name in `--policy`.
pub const NAME: &str = "buddy";

/// The option keys `buddy` accepts: they drive the parser, the help and the errors.
pub const KEYS: &[OptionKey<BuddyOptions>] = &[
    OptionKey::new("min_block", "SIZE (power of two)", Setter::Size(|o, v| o.min_block = v)),
    OptionKey::size("arena", |o, v| o.arena = v),
    OptionKey::count("max_order", |o, v| o.max_order = v),
];

/// `buddy`'s line in [`POLICIES`](super::POLICIES).
pub const POLICY: Registration<Buddy> = Registration {
    name: NAME,
    summary: "binary buddy allocator over power-of-two arenas",
    role: Role::Online,
    options: || opt::help(KEYS),
    build: |options, _| Buddy::from_options(options),
};

/// `buddy`'s options; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuddyOptions {
    /// The smallest block (order 0), a power of two.
    pub(crate) min_block: u64,
    /// The smallest arena taken from the device (rounded up to a power of two).
    pub(crate) arena: u64,
    /// The largest order: blocks up to `min_block << max_order`.
    pub(crate) max_order: u32,
}

impl Default for BuddyOptions {
    fn default() -> Self {
        BuddyOptions { min_block: 512, arena: 2 * MIB, max_order: 31 }
    }
}

/// An arena: `min_block << order` bytes from one device segment.
#[derive(Clone, Copy, Debug)]
struct Arena {
    order: u32,
    stream: u64,
}

/// The arena a block lies in: its base and order. Every block carries it, so that a free finds
/// its buddy without searching the arenas.
#[derive(Clone, Copy, Debug)]
struct Home {
    base: u64,
    order: u32,
}

/// A live block.
#[derive(Clone, Copy, Debug)]
struct Live {
    order: u32,
    request: u64,
    home: Home,
}

/// The buddy allocator; see the module docs.
///
/// Why a hash map of the live blocks and a mask of the non-empty orders: with B-trees a malloc
/// and a free each make three or four descents (the live map, the arena of the block, the free
/// list of every order tried), four fifths of the replay's instructions. Only the free lists need
/// their address order (the lowest block of an order is taken first).
#[derive(Debug)]
pub struct Buddy {
    options: BuddyOptions,
    arena_order: u32,
    arenas: BTreeMap<u64, Arena>,
    /// Free blocks per order, by address, each with its arena.
    free: Vec<BTreeMap<u64, Home>>,
    /// Bit `j`: the free list of order `j` is not empty (`max_order` < 64).
    nonempty: u64,
    /// Live blocks by address.
    live: AddrMap<Live>,
    allocated: u64,
}

impl Buddy {
    /// Builds the policy from `key=value` options (see [`KEYS`]).
    pub(crate) fn from_options(options: &str) -> Result<Buddy> {
        let o = opt::parse(NAME, options, KEYS)?;
        Buddy::new(o)
    }

    /// Builds the policy from parsed options.
    pub(crate) fn new(options: BuddyOptions) -> Result<Buddy> {
        if !options.min_block.is_power_of_two() {
            return Err(Error::usage(format!(
                "min_block must be a power of two, got {}",
                options.min_block
            )));
        }
        let top = options.min_block.leading_zeros();
        if options.max_order >= top {
            return Err(Error::usage(format!(
                "max_order {} is too large for min_block {} (at most {})",
                options.max_order,
                options.min_block,
                top - 1
            )));
        }
        let arena_order = Self::order_of(options.min_block, options.arena.max(1));
        if arena_order > options.max_order {
            return Err(Error::usage(format!(
                "arena {} exceeds the largest block min_block << max_order",
                options.arena
            )));
        }
        Ok(Buddy {
            free: vec![BTreeMap::new(); options.max_order as usize + 1],
            nonempty: 0,
            options,
            arena_order,
            arenas: BTreeMap::new(),
            live: AddrMap::default(),
            allocated: 0,
        })
    }

    /// The order of the smallest block of at least `size` bytes.
    fn order_of(min_block: u64, size: u64) -> u32 {
        let units = size.div_ceil(min_block).max(1);
        units.next_power_of_two().trailing_zeros()
    }

    fn block_size(&self, order: u32) -> u64 {
        self.options.min_block << order
    }

    /// The arena holding `addr`: (base, order).
    fn arena_of(&self, addr: u64) -> Option<(u64, u32)> {
        self.arenas
            .range(..=addr)
            .next_back()
            .filter(|(&b, a)| addr < b + self.block_size(a.order))
            .map(|(&b, a)| (b, a.order))
    }

    /// Puts the block at `addr` on the free list of `order`.
    fn put_free(&mut self, order: u32, addr: u64, home: Home) {
        self.free[order as usize].insert(addr, home);
        self.nonempty |= 1 << order;
    }

    /// Takes the block at `addr` off the free list of `order`, if it is there.
    fn take_free(&mut self, order: u32, addr: u64) -> Option<Home> {
        let list = &mut self.free[order as usize];
        let home = list.remove(&addr)?;
        if list.is_empty() {
            self.nonempty &= !(1 << order);
        }
        Some(home)
    }

    /// Returns every wholly free arena to the device.
    fn release_free_arenas<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        let idle: Vec<(u64, u32)> = self
            .arenas
            .iter()
            .filter(|(&b, a)| self.free[a.order as usize].contains_key(&b))
            .map(|(&b, a)| (b, a.order))
            .collect();
        for (base, order) in idle {
            self.take_free(order, base);
            self.arenas.remove(&base);
            backend.segment_free(base, self.block_size(order))?;
        }
        Ok(())
    }

    /// Takes a new arena big enough for a block of `order`.
    fn grow<B: Backend>(&mut self, backend: &mut B, order: u32, stream: u64) -> Result<bool> {
        let a = order.max(self.arena_order);
        let size = self.block_size(a);
        let mut base = backend.segment_alloc(size)?;
        if base.is_none() && !self.arenas.is_empty() {
            self.release_free_arenas(backend)?;
            base = backend.segment_alloc(size)?;
        }
        let Some(base) = base else { return Ok(false) };
        self.arenas.insert(base, Arena { order: a, stream });
        self.put_free(a, base, Home { base, order: a });
        Ok(true)
    }

    /// Takes the lowest free block of the smallest order ≥ `order` off its free list: (address,
    /// its order, its arena).
    fn take_smallest_free(&mut self, order: u32) -> Option<(u64, u32, Home)> {
        let orders = self.nonempty & (!0u64).checked_shl(order).unwrap_or(0);
        let j = orders.trailing_zeros();
        let list = self.free.get_mut(j as usize)?;
        let (addr, home) = list.pop_first()?;
        if list.is_empty() {
            self.nonempty &= !(1 << j);
        }
        Some((addr, j, home))
    }
}

impl Policy for Buddy {
    fn config(&self) -> String {
        format!(
            "min_block={},arena={},max_order={}",
            self.options.min_block,
            self.block_size(self.arena_order),
            self.options.max_order
        )
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        let k = Self::order_of(self.options.min_block, size);
        if k > self.options.max_order {
            return Ok(None);
        }
        let found = match self.take_smallest_free(k) {
            Some(f) => Some(f),
            None if self.grow(backend, k, stream)? => self.take_smallest_free(k),
            None => None,
        };
        let Some((addr, mut j, home)) = found else { return Ok(None) };
        while j > k {
            j -= 1;
            let half = self.block_size(j);
            self.put_free(j, addr + half, home);
        }
        self.live.insert(addr, Live { order: k, request: size, home });
        let block_size = self.block_size(k);
        self.allocated += block_size;
        Ok(Some(Allocation::new(addr, block_size)))
    }

    fn free<B: Backend>(&mut self, _backend: &mut B, addr: u64) -> Result<()> {
        let live = self.live.remove(&addr).ok_or_else(|| unknown_block(NAME, addr))?;
        let (mut k, home) = (live.order, live.home);
        self.allocated -= self.block_size(k);
        let mut addr = addr;
        while k < home.order {
            let buddy = home.base + ((addr - home.base) ^ self.block_size(k));
            if self.take_free(k, buddy).is_none() {
                break;
            }
            addr = addr.min(buddy);
            k += 1;
        }
        self.put_free(k, addr, home);
        Ok(())
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.release_free_arenas(backend)
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn segments(&self) -> Vec<Segment> {
        let mut free: BTreeMap<u64, u32> = BTreeMap::new();
        for (order, set) in self.free.iter().enumerate() {
            free.extend(set.keys().map(|&a| (a, order as u32)));
        }
        let live: BTreeMap<u64, Live> = self.live.iter().map(|(&a, &l)| (a, l)).collect();
        self.arenas
            .iter()
            .map(|(&base, a)| {
                let end = base + self.block_size(a.order);
                let mut blocks: Vec<Block> = live
                    .range(base..end)
                    .map(|(&addr, l)| Block {
                        address: addr,
                        size: self.block_size(l.order),
                        requested_size: l.request,
                        state: BlockState::ActiveAllocated,
                    })
                    .chain(free.range(base..end).map(|(&addr, &k)| Block {
                        address: addr,
                        size: self.block_size(k),
                        requested_size: 0,
                        state: BlockState::Inactive,
                    }))
                    .collect();
                blocks.sort_by_key(|b| b.address);
                Segment {
                    device: 0,
                    address: base,
                    total_size: self.block_size(a.order),
                    stream: a.stream,
                    pool: PoolKind::Large,
                    is_expandable: false,
                    private_pool: None,
                    blocks,
                }
            })
            .collect()
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut blocks: BTreeMap<u64, (u32, bool)> = BTreeMap::new();
        for (order, set) in self.free.iter().enumerate() {
            if set.is_empty() == (self.nonempty & 1 << order != 0) {
                return Err(format!("the mask of non-empty orders is wrong at order {order}"));
            }
            for (&a, home) in set {
                if blocks.insert(a, (order as u32, false)).is_some() {
                    return Err(format!("block {a:#x} is on two free lists"));
                }
                if self.arena_of(a) != Some((home.base, home.order)) {
                    return Err(format!("free block {a:#x} names the wrong arena"));
                }
            }
        }
        for (&a, l) in &self.live {
            if blocks.insert(a, (l.order, true)).is_some() {
                return Err(format!("live block {a:#x} is also free"));
            }
            if self.arena_of(a) != Some((l.home.base, l.home.order)) {
                return Err(format!("live block {a:#x} names the wrong arena"));
            }
        }
        let mut covered: BTreeMap<u64, u64> = BTreeMap::new();
        let mut end = 0;
        for (&a, &(k, used)) in &blocks {
            let size = self.block_size(k);
            if a < end {
                return Err(format!("block {a:#x} overlaps the previous block"));
            }
            end = a + size;
            let Some((base, top)) = self.arena_of(a) else {
                return Err(format!("block {a:#x} outside every arena"));
            };
            if k > top || (a - base) % size != 0 || a + size > base + self.block_size(top) {
                return Err(format!("block {a:#x} of order {k} misplaced in arena {base:#x}"));
            }
            if !used && k < top {
                let buddy = base + ((a - base) ^ size);
                if self.free[k as usize].contains_key(&buddy) {
                    return Err(format!("free buddies {a:#x} and {buddy:#x} were not merged"));
                }
            }
            *covered.entry(base).or_default() += size;
        }
        for (&base, a) in &self.arenas {
            if covered.get(&base).copied().unwrap_or(0) != self.block_size(a.order) {
                return Err(format!("arena {base:#x} is not covered exactly by its blocks"));
            }
        }
        let sum: u64 = self.live.values().map(|l| self.block_size(l.order)).sum();
        if sum != self.allocated {
            return Err(format!("allocated {} != sum of live blocks {sum}", self.allocated));
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
    fn split_down_and_coalesce_up() {
        let mut d = SimDevice::default();
        let mut p = Buddy::from_options("arena=4KiB").unwrap();
        // 100 B → order 0 (512 B). The 4 KiB arena splits 4K → 2K+2K → 1K+1K → 512+512.
        let a = p.malloc(&mut d, 100, 0).unwrap().unwrap();
        assert_eq!(a.block_size, 512);
        let base = a.addr;
        assert_eq!(d.reserved(), 4096);
        // 1000 B → 1 KiB: the free order-1 buddy at +1024.
        let b = p.malloc(&mut d, 1000, 0).unwrap().unwrap();
        assert_eq!((b.addr, b.block_size), (base + 1024, 1024));
        // 600 B → 1 KiB: no free order-1 block; the order-2 block at +2048 splits.
        let c = p.malloc(&mut d, 600, 0).unwrap().unwrap();
        assert_eq!(c.addr, base + 2048);
        assert_eq!(p.allocated(), 512 + 1024 + 1024);
        // Free a: merges with +512 into the order-1 block at base; its buddy (+1024) is live.
        p.free(&mut d, a.addr).unwrap();
        assert!(p.free[1].contains_key(&base) && p.free[1].contains_key(&(base + 3072)));
        p.free(&mut d, b.addr).unwrap(); // → order 2 at base; buddy +2048 is live
        assert!(p.free[2].contains_key(&base));
        p.free(&mut d, c.addr).unwrap(); // +2048 ⊕ +3072 → order 2; with base → the whole arena
        assert_eq!(p.free[3].keys().copied().collect::<Vec<_>>(), vec![base]);
        p.check_invariants().unwrap();
        p.empty_cache(&mut d).unwrap();
        assert_eq!(d.reserved(), 0);
    }

    #[test]
    fn arenas_grow_to_fit_big_requests() {
        let mut d = SimDevice::default();
        let mut p = Buddy::from_options("").unwrap();
        let a = p.malloc(&mut d, 3 * MIB, 0).unwrap().unwrap();
        assert_eq!((a.block_size, d.reserved()), (4 * MIB, 4 * MIB));
        let b = p.malloc(&mut d, 513, 0).unwrap().unwrap();
        assert_eq!(b.block_size, 1024);
        assert_eq!(d.reserved(), 6 * MIB, "a default 2 MiB arena");
    }

    #[test]
    fn free_arenas_are_released_before_an_oom() {
        let mut d = SimDevice::new(Some(8192));
        let mut p = Buddy::from_options("arena=4KiB").unwrap();
        let a = p.malloc(&mut d, 512, 0).unwrap().unwrap();
        p.free(&mut d, a.addr).unwrap();
        // An 8 KiB arena does not fit beside the idle 4 KiB one: that one goes first.
        let b = p.malloc(&mut d, 5000, 0).unwrap().unwrap();
        assert_eq!((b.block_size, d.reserved()), (8192, 8192));
        assert_eq!(p.malloc(&mut d, 1, 0).unwrap(), None);
    }

    #[test]
    fn options_are_checked() {
        assert!(Buddy::from_options("min_block=500").is_err());
        assert!(Buddy::from_options("max_order=2,arena=1MiB").is_err());
        let e = Buddy::from_options("order=3").unwrap_err();
        assert!(e.message().contains("min_block"), "{}", e.message());
        let p = Buddy::from_options("max_order=4,arena=1KiB").unwrap();
        assert_eq!(p.config(), "min_block=512,arena=1024,max_order=4");
        let mut p = p;
        let mut d = SimDevice::default();
        assert_eq!(p.malloc(&mut d, 8193, 0).unwrap(), None, "above 512 << 4");
    }

    #[test]
    fn property_checker() {
        for seed in 0..4 {
            let c = run_checked(&mut Buddy::from_options("").unwrap(), &workload(seed, 1500), None);
            assert!(c.peak_reserved >= c.peak_requested);
        }
        run_checked(&mut Buddy::from_options("").unwrap(), &workload(4, 1500), Some(128 * MIB));
    }
}
