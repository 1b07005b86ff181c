//! Test support shared by the unit tests, the integration tests and the benches: one seeded
//! random generator, one random alloc/free workload, and one property checker that every
//! policy's tests call — and that a policy written outside the crate can call too.
//!
//! [`run_checked`] drives a policy with a [`workload`] over several streams, on a simulated
//! device wrapped so the checker knows every segment and mapped range, and asserts after every
//! call: live blocks never overlap, every live block lies in memory the policy holds,
//! reserved ≥ allocated ≥ requested, and the policy's own invariants hold. At the end it frees
//! everything, flushes, and asserts that reserved memory is back to zero.
//!
//! These are test helpers: they panic on the first violation, with the step index, as an
//! `assert!` does. Nothing in the replay path uses them.

use crate::backend::{Backend, BackendCall, Observed, Observer, SimDevice};
use crate::policy::{Allocation, Policy};
use std::collections::BTreeMap;

// The fuzz targets are a crate of their own (`fuzz/`), so the bodies they share with the
// hostile-input tests must be public; they are no API a library user should build on, so the
// documentation leaves them out.
#[doc(hidden)]
pub mod fuzz;

/// A small, seedable random generator (xorshift64*), so tests and benches need no extra crate
/// and every run sees the same numbers.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A value in `[0, n)` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// An index in `[0, len)` (0 when `len` is 0): [`Rng::below`] for lengths.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

/// Which ranges are memory the policy holds: segments and mapped pages, as the backend saw them.
#[derive(Debug, Default)]
struct Held(BTreeMap<u64, u64>);

impl Held {
    /// True when `[addr, addr + size)` lies in held memory (held ranges may be adjacent).
    fn holds(&self, addr: u64, size: u64) -> bool {
        let mut pos = addr;
        let end = addr + size;
        while pos < end {
            match self.0.range(..=pos).next_back() {
                Some((&a, &s)) if a + s > pos => pos = a + s,
                _ => return false,
            }
        }
        true
    }

    fn forget(&mut self, addr: u64, size: u64) {
        let end = addr + size;
        let touched: Vec<(u64, u64)> = self
            .0
            .range(..end)
            .rev()
            .take_while(|(&a, &s)| a + s > addr)
            .map(|(&a, &s)| (a, s))
            .collect();
        for (a, s) in touched {
            self.0.remove(&a);
            if a < addr {
                self.0.insert(a, addr - a);
            }
            if a + s > end {
                self.0.insert(end, a + s - end);
            }
        }
    }
}

impl Observer for Held {
    fn observe(&mut self, call: BackendCall) {
        match call {
            BackendCall::SegmentAlloc { size, addr: Some(addr) }
            | BackendCall::Map { addr, size, ok: true } => {
                self.0.insert(addr, size);
            }
            BackendCall::SegmentFree { addr, size } | BackendCall::Unmap { addr, size } => {
                self.forget(addr, size)
            }
            _ => {}
        }
    }
}

/// A simulated device that also knows which ranges are memory the policy holds.
type Tracked = Observed<SimDevice, Held>;

/// One step of a random workload (fields as named).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocate `size` bytes on `stream`; `id` names the block for its free.
    Alloc { id: usize, size: u64, stream: u64 },
    /// Free block `id`.
    Free { id: usize },
    /// Flush the cache (`empty_cache`).
    EmptyCache,
}

/// A seeded random workload of about `len` steps over 3 streams, with sizes from a few bytes to
/// tens of MiB (skewed small, like real training), some long-lived blocks and occasional flushes.
pub fn workload(seed: u64, len: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut steps = Vec::with_capacity(len);
    let mut live: Vec<usize> = Vec::new();
    let mut next_id = 0;
    for _ in 0..len {
        let r = rng.below(100);
        if r < 2 {
            steps.push(Step::EmptyCache);
        } else if r < 55 || live.is_empty() {
            let size = match rng.below(10) {
                0..=4 => 1 + rng.below(64 << 10),
                5..=7 => 1 + rng.below(4 << 20),
                8 => 1 + rng.below(40 << 20),
                _ => (1 + rng.below(16)) * (1 << 20),
            };
            steps.push(Step::Alloc { id: next_id, size, stream: rng.below(3) });
            live.push(next_id);
            next_id += 1;
        } else {
            let i = rng.below(live.len() as u64) as usize;
            steps.push(Step::Free { id: live.swap_remove(i) });
        }
    }
    steps.extend(live.into_iter().map(|id| Step::Free { id }));
    steps
}

/// What [`run_checked`] measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// Peak live requested bytes.
    pub peak_requested: u64,
    /// Requests that failed (only with a capacity).
    pub ooms: u64,
}

/// Runs `steps` through `policy`, asserting the properties in the module docs after every step.
/// Panics (this is a test helper) with the seed-independent step index on the first violation.
pub fn run_checked<P: Policy>(policy: &mut P, steps: &[Step], capacity: Option<u64>) -> Checked {
    let mut dev = Tracked::new(SimDevice::new(capacity));
    let mut blocks: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // addr -> (block_size, request)
    let mut by_id: Vec<Option<Allocation>> = Vec::new();
    let mut requested = 0u64;
    let mut out = Checked::default();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Alloc { id, size, stream } => {
                if by_id.len() <= id {
                    by_id.resize(id + 1, None);
                }
                match policy
                    .malloc(&mut dev, size, stream)
                    .expect("malloc must not fail with an error")
                {
                    Some(a) => {
                        assert!(
                            a.block_size >= size,
                            "step {i}: block {} smaller than request {size}",
                            a.block_size
                        );
                        if let Some((&prev, &(psize, _))) = blocks.range(..=a.addr).next_back() {
                            assert!(
                                prev + psize <= a.addr,
                                "step {i}: block {:#x} overlaps {prev:#x}+{psize}",
                                a.addr
                            );
                        }
                        if let Some((&next, _)) = blocks.range(a.addr..).next() {
                            assert!(
                                a.addr + a.block_size <= next,
                                "step {i}: block {:#x} overlaps {next:#x}",
                                a.addr
                            );
                        }
                        assert!(
                            dev.observer.holds(a.addr, a.block_size),
                            "step {i}: block {:#x}+{} outside held memory",
                            a.addr,
                            a.block_size
                        );
                        blocks.insert(a.addr, (a.block_size, size));
                        by_id[id] = Some(a);
                        requested += size;
                    }
                    None => out.ooms += 1,
                }
            }
            Step::Free { id } => {
                if let Some(a) = by_id.get_mut(id).and_then(Option::take) {
                    let (_, req) = blocks.remove(&a.addr).expect("live block is tracked");
                    requested -= req;
                    // Half the frees by address alone, half with the malloc's handle, so that a
                    // policy's two ways of finding a block are both used, and mixed.
                    let freed = match id % 2 {
                        0 => policy.free_handle(&mut dev, a.addr, a.handle),
                        _ => policy.free(&mut dev, a.addr),
                    };
                    freed.expect("free of a live block must succeed");
                }
            }
            Step::EmptyCache => policy.empty_cache(&mut dev).expect("empty_cache must succeed"),
        }
        let reserved = dev.reserved();
        let allocated = policy.allocated();
        assert!(reserved >= allocated, "step {i}: reserved {reserved} < allocated {allocated}");
        assert!(allocated >= requested, "step {i}: allocated {allocated} < requested {requested}");
        let block_sum: u64 = blocks.values().map(|&(b, _)| b).sum();
        assert_eq!(
            allocated, block_sum,
            "step {i}: allocated counter differs from the live blocks"
        );
        for (&addr, &(size, _)) in &blocks {
            assert!(
                dev.observer.holds(addr, size),
                "step {i}: live block {addr:#x}+{size} no longer in held memory"
            );
        }
        if let Err(m) = policy.check_invariants() {
            panic!("step {i}: invariant broken: {m}");
        }
        out.peak_reserved = out.peak_reserved.max(reserved);
        out.peak_requested = out.peak_requested.max(requested);
    }
    assert!(blocks.is_empty(), "the workload frees every block it allocates");
    policy.empty_cache(&mut dev).expect("empty_cache must succeed");
    assert_eq!(dev.reserved(), 0, "freeing everything then flushing must return reserved to 0");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bound::Bound;

    #[test]
    fn bound_passes_the_checker_and_its_peak_is_the_requested_peak() {
        for seed in 0..5 {
            let mut p = Bound::default();
            let c = run_checked(&mut p, &workload(seed, 2000), None);
            assert_eq!(c.peak_reserved, c.peak_requested);
            assert!(c.peak_requested > 0);
        }
    }

    #[test]
    fn capacity_makes_requests_fail_without_breaking_properties() {
        let mut p = Bound::default();
        let c = run_checked(&mut p, &workload(7, 3000), Some(64 << 20));
        assert!(c.ooms > 0);
        assert!(c.peak_reserved <= 64 << 20);
    }
}
