//! The allocated blocks by address (PyTorch's `active_blocks`), for frees by address alone (the
//! [`Policy::free`](crate::policy::Policy::free) API, `validate`): once built, every malloc
//! inserts one and every free removes one. A replay frees by handle and never builds it.
//!
//! Why not an [`AddrMap`](crate::trace::AddrMap): a general hash map's insert and remove cost
//! about 70 and 60 instructions here (SIMD group probing, control bytes, tombstone bookkeeping);
//! this table's cost about 25 and 45 (callgrind, the replay bench). It is open addressing with
//! linear probing over one array of (address, block id) pairs, Fibonacci hashing of the address
//! (addresses are 512-byte aligned, so the product's high bits are the index), at most half full,
//! and removal by backward shifting, so there are no tombstones and a probe ends at the first
//! empty slot.

/// Marks an empty slot: no block address reaches it (addresses stay below 2^56, `KEY_LIMIT`).
const EMPTY: u64 = u64::MAX;

/// Slots of a new table (a power of two).
const INITIAL_SLOTS: usize = 8192;

/// Block ids by block address; see the module docs.
#[derive(Clone, Debug)]
pub(super) struct ActiveMap {
    /// (address, block id); `EMPTY` addresses are free slots.
    slots: Vec<(u64, u32)>,
    /// `64 - log2(slots.len())`: the shift that turns a hash into a slot index.
    shift: u32,
    len: usize,
}

impl Default for ActiveMap {
    fn default() -> Self {
        ActiveMap::with_slots(INITIAL_SLOTS)
    }
}

impl ActiveMap {
    fn with_slots(n: usize) -> ActiveMap {
        debug_assert!(n.is_power_of_two() && n >= 2);
        ActiveMap { slots: vec![(EMPTY, 0); n], shift: 64 - n.trailing_zeros(), len: 0 }
    }

    /// The slot where `addr`'s probe starts.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `addr`, if any.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            match self.slots[i].0 {
                a if a == addr => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Maps `addr` to `id`; the id it had, if any.
    #[inline]
    pub(super) fn insert(&mut self, addr: u64, id: u32) -> Option<u32> {
        debug_assert!(addr != EMPTY);
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let slot = &mut self.slots[i];
            if slot.0 == EMPTY {
                *slot = (addr, id);
                self.len += 1;
                return None;
            }
            if slot.0 == addr {
                return Some(std::mem::replace(&mut slot.1, id));
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `addr`; its id, if it was there.
    #[inline(always)] // one caller, on the hot path
    pub(super) fn remove(&mut self, addr: u64) -> Option<u32> {
        let found = self.find(addr)?;
        let id = self.slots[found].1;
        // Backward shift: move each later entry of the run into the hole unless that would put
        // it before its home slot, so every entry stays reachable from its home.
        let mask = self.mask();
        let mut hole = found;
        let mut j = (found + 1) & mask;
        loop {
            let (a, _) = self.slots[j];
            if a == EMPTY {
                break;
            }
            let home = self.home(a);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole].0 = EMPTY;
        self.len -= 1;
        Some(id)
    }

    /// The id of the block at `addr`, if it is allocated.
    pub(super) fn get(&self, addr: u64) -> Option<u32> {
        self.find(addr).map(|i| self.slots[i].1)
    }

    /// Number of allocated blocks.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Doubles the table, reinserting every entry.
    #[cold]
    fn grow(&mut self) {
        let old = std::mem::replace(self, ActiveMap::with_slots(self.slots.len() * 2));
        for (addr, id) in old.slots {
            if addr != EMPTY {
                self.insert(addr, id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map_through_growth_and_removal() {
        for seed in 0..10 {
            let mut rng = Rng::new(seed);
            let mut map = ActiveMap::with_slots(4);
            let mut oracle: HashMap<u64, u32> = HashMap::new();
            // Few distinct addresses, so inserts replace and removes hit, and runs collide.
            let space = 1 + rng.below(5000);
            for step in 0..20_000u32 {
                let addr = 512 * rng.below(space);
                if rng.below(3) == 0 {
                    assert_eq!(map.remove(addr), oracle.remove(&addr), "seed {seed} step {step}");
                } else {
                    assert_eq!(map.insert(addr, step), oracle.insert(addr, step));
                }
                assert_eq!(map.len(), oracle.len());
                let probe = 512 * rng.below(space);
                assert_eq!(map.get(probe), oracle.get(&probe).copied(), "seed {seed} step {step}");
            }
            for (&addr, &id) in &oracle {
                assert_eq!(map.get(addr), Some(id));
            }
        }
    }

    #[test]
    fn stays_at_most_half_full() {
        let mut map = ActiveMap::with_slots(4);
        for k in 0..1000u64 {
            map.insert(k << 9, k as u32);
            assert!(2 * map.len() <= map.slots.len());
        }
        assert_eq!(map.len(), 1000);
    }
}
