//! A set of free blocks ordered by (list, size, address), with the queries best-fit allocators
//! make: the first block at or after (list, size, 0), the next one after a block, the last one
//! before a bound. `pytorch`'s pools use it with a list per stream (the order of PyTorch's
//! `BlockComparatorSize`, `c10/cuda/CUDACachingAllocator.cpp`); the chunk store of `bfc`,
//! `rmm-pool` and `stitch` ([`chunks`](super::chunks)) with RMM's per-stream free lists or one.
//! Lists are small indices the caller assigns.
//!
//! Why not a `BTreeSet`: every malloc and free touches this set two or three times, and a B-tree
//! descent per touch makes the set the replay's hot spot (in `bfc`, `rmm-pool` and `stitch`
//! half of their instructions). Blocks are bucketed per list by size class (TLSF-style: the power
//! of two and the next three bits, so bucket order is size order), each bucket a short vector
//! sorted by (size, address), with a bitmap of non-empty buckets. A query is one bucket search
//! plus, when the bucket has nothing large enough, one bitmap scan.
//!
//! Each bucket is sorted in *descending* order, so its smallest entry is its last: most mallocs
//! take a cached block of exactly their size at the lowest address, which is then the bucket's
//! last entry, found by one comparison and removed without moving the others (in ascending
//! order every such removal would shift the whole bucket).

/// Buckets per list: 64 powers of two × 8 sub-classes.
const BUCKETS: usize = 64 * 8;

/// The size class of `size`; monotonic in `size`, and below [`BUCKETS`].
#[inline]
fn bucket(size: u64) -> usize {
    if size < 8 {
        return size as usize; // classes 0..8 of the first powers; below every class ≥ 8 bytes
    }
    let fl = 63 - size.leading_zeros() as usize;
    let sl = ((size >> (fl - 3)) & 7) as usize;
    // At most 63 · 8 + 7 already; the mask says so to the compiler, so that indexing the
    // buckets and their bitmap by a class is never checked at run time.
    (fl * 8 + sl) & (BUCKETS - 1)
}

/// One entry: (size, address, block id).
type Entry = (u64, u64, u32);

/// Where an entry a query found lies in its list ([`FreeSet::first_at`]), so that taking it
/// ([`FreeSet::remove_at`]) searches nothing again. Valid until the set next changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spot {
    bucket: u32,
    index: u32,
}

/// The free blocks of one list.
#[derive(Debug, Clone)]
struct List {
    /// A fixed array, indexed by [`bucket`] without bounds checks.
    buckets: Box<[Vec<Entry>; BUCKETS]>,
    nonempty: [u64; BUCKETS / 64],
}

impl Default for List {
    fn default() -> Self {
        List { buckets: Box::new(std::array::from_fn(|_| Vec::new())), nonempty: [0; BUCKETS / 64] }
    }
}

impl List {
    /// The first non-empty bucket at or after `b`.
    fn next_nonempty(&self, b: usize) -> Option<usize> {
        let mut word = b / 64;
        if word >= self.nonempty.len() {
            return None;
        }
        let mut bits = self.nonempty[word] & (!0u64 << (b % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word == self.nonempty.len() {
                return None;
            }
            bits = self.nonempty[word];
        }
    }

    /// The last non-empty bucket before `b`.
    fn prev_nonempty(&self, b: usize) -> Option<usize> {
        if b == 0 {
            return None;
        }
        let last = b - 1;
        let mut word = last / 64;
        let mut bits = self.nonempty[word] & (!0u64 >> (63 - last % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + 63 - bits.leading_zeros() as usize);
            }
            if word == 0 {
                return None;
            }
            word -= 1;
            bits = self.nonempty[word];
        }
    }

    /// The first entry ≥ (size, ptr).
    #[inline(always)]
    fn first_from(&self, size: u64, ptr: u64) -> Option<Entry> {
        self.first_at(size, ptr).map(|(e, _)| e)
    }

    /// The first entry ≥ (size, ptr), and where it lies.
    #[inline(always)] // the core of every malloc's search
    fn first_at(&self, size: u64, ptr: u64) -> Option<(Entry, Spot)> {
        let b = bucket(size);
        let v = &self.buckets[b];
        let spot =
            |bucket: usize, index: usize| Spot { bucket: bucket as u32, index: index as u32 };
        // Descending: the entries ≥ the key are a prefix, and the answer is its last.
        match v.last() {
            Some(&e) if (e.0, e.1) >= (size, ptr) => return Some((e, spot(b, v.len() - 1))),
            Some(_) => {
                let i = at_or_after(v, size, ptr);
                if i > 0 {
                    return Some((v[i - 1], spot(b, i - 1)));
                }
            }
            None => {}
        }
        let n = self.next_nonempty(b + 1)?;
        let v = &self.buckets[n];
        v.last().map(|&e| (e, spot(n, v.len() - 1)))
    }

    /// The last entry < (size, ptr).
    fn last_before(&self, size: u64, ptr: u64) -> Option<Entry> {
        let b = bucket(size);
        let v = &self.buckets[b];
        if let Some(&e) = v.get(at_or_after(v, size, ptr)) {
            return Some(e);
        }
        let n = self.prev_nonempty(b)?;
        self.buckets[n].first().copied()
    }
}

/// Puts (size, ptr, id) in its place in bucket `v`, where it is not the smallest entry; false
/// when the bucket had (size, ptr) already (its id is replaced). Out of line: the less common
/// path of [`FreeSet::insert`] (a quarter of the inserts on a training trace).
#[inline(never)]
fn insert_sorted(v: &mut Vec<Entry>, size: u64, ptr: u64, id: u32) -> bool {
    let i = at_or_after(v, size, ptr);
    if i > 0 && (v[i - 1].0, v[i - 1].1) == (size, ptr) {
        v[i - 1].2 = id;
        return false;
    }
    v.insert(i, (size, ptr, id));
    true
}

/// Removes (size, ptr) from bucket `v`, where it is not the last entry: its id, if it was
/// there. Out of line, as [`insert_sorted`].
#[inline(never)]
fn remove_sorted(v: &mut Vec<Entry>, size: u64, ptr: u64) -> Option<u32> {
    let i = at_or_after(v, size, ptr).checked_sub(1)?;
    if v[i].0 != size || v[i].1 != ptr {
        return None;
    }
    Some(v.remove(i).2)
}

/// Removes entry `i` of bucket `v`, moving those after it: its id. Out of line, as
/// [`insert_sorted`].
#[inline(never)]
fn remove_index(v: &mut Vec<Entry>, i: usize) -> Option<u32> {
    (i < v.len()).then(|| v.remove(i).2)
}

/// In a bucket sorted in descending order, the number of entries ≥ (size, ptr): the index of
/// the first one below it.
#[inline]
fn at_or_after(v: &[Entry], size: u64, ptr: u64) -> usize {
    v.partition_point(|&(s, p, _)| (s, p) >= (size, ptr))
}

/// Free blocks by (list, size, address), each with an id; see the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeSet {
    lists: Vec<List>,
    len: usize,
}

impl FreeSet {
    /// Adds block `id` of `size` bytes at `ptr` on list `sid`.
    #[inline(always)] // every free and every split: the common case is a few instructions
    pub(crate) fn insert(&mut self, sid: u32, size: u64, ptr: u64, id: u32) {
        let sid = sid as usize;
        if self.lists.len() <= sid {
            self.add_lists(sid);
        }
        let s = &mut self.lists[sid];
        let b = bucket(size);
        let v = &mut s.buckets[b];
        if v.last().is_none_or(|&(sz, p, _)| (sz, p) > (size, ptr)) {
            // The new smallest entry: it goes last, with no search and nothing moved.
            v.push((size, ptr, id));
        } else if !insert_sorted(v, size, ptr, id) {
            return; // already there: its id replaced
        }
        s.nonempty[b / 64] |= 1 << (b % 64);
        self.len += 1;
    }

    /// Makes room for list `sid`: the first block of a new list.
    #[cold]
    #[inline(never)]
    fn add_lists(&mut self, sid: usize) {
        self.lists.resize_with(sid + 1, List::default);
    }

    /// Removes the block of `size` bytes at `ptr` on list `sid`; its id, if it was there.
    #[inline(always)] // every malloc takes a block with it
    pub(crate) fn remove(&mut self, sid: u32, size: u64, ptr: u64) -> Option<u32> {
        let s = self.lists.get_mut(sid as usize)?;
        let b = bucket(size);
        let v = &mut s.buckets[b];
        // The block a malloc takes is usually the bucket's smallest: its last entry, popped
        // without moving the others.
        let id = match v.last() {
            Some(&(sz, p, id)) if (sz, p) == (size, ptr) => {
                v.pop();
                id
            }
            _ => remove_sorted(v, size, ptr)?,
        };
        if v.is_empty() {
            s.nonempty[b / 64] &= !(1 << (b % 64));
        }
        self.len -= 1;
        Some(id)
    }

    /// Removes the entry at `spot` of list `sid`, found by [`FreeSet::first_at`] since the set
    /// last changed: its id. (A malloc takes the block its search found: searching again for
    /// it was a tenth of `pytorch`'s malloc.)
    #[inline(always)]
    pub(crate) fn remove_at(&mut self, sid: u32, spot: Spot) -> Option<u32> {
        let s = self.lists.get_mut(sid as usize)?;
        let b = spot.bucket as usize % BUCKETS;
        let v = &mut s.buckets[b];
        let i = spot.index as usize;
        // Usually the bucket's last entry (its smallest), popped without moving the others.
        let id = if i + 1 == v.len() { v.pop()?.2 } else { remove_index(v, i)? };
        if v.is_empty() {
            s.nonempty[b / 64] &= !(1 << (b % 64));
        }
        self.len -= 1;
        Some(id)
    }

    /// The id of the block of `size` bytes at `ptr` on list `sid`, if present.
    pub(crate) fn get(&self, sid: u32, size: u64, ptr: u64) -> Option<u32> {
        self.lists
            .get(sid as usize)?
            .first_from(size, ptr)
            .and_then(|(s, p, id)| ((s, p) == (size, ptr)).then_some(id))
    }

    /// The first block of list `sid` at or after (size, ptr): `lower_bound`.
    #[inline]
    pub(crate) fn first_from(&self, sid: u32, size: u64, ptr: u64) -> Option<(u64, u64, u32)> {
        self.lists.get(sid as usize)?.first_from(size, ptr)
    }

    /// [`FreeSet::first_from`], and where the block lies, for [`FreeSet::remove_at`].
    #[inline(always)]
    pub(crate) fn first_at(&self, sid: u32, size: u64, ptr: u64) -> Option<(Entry, Spot)> {
        self.lists.get(sid as usize)?.first_at(size, ptr)
    }

    /// The next block of list `sid` after the one of `size` bytes at `ptr`.
    pub(crate) fn next_after(&self, sid: u32, size: u64, ptr: u64) -> Option<(u64, u64, u32)> {
        let s = self.lists.get(sid as usize)?;
        match ptr.checked_add(1) {
            Some(p) => s.first_from(size, p),
            None => s.first_from(size.checked_add(1)?, 0),
        }
    }

    /// The last block of list `sid` before (size, ptr).
    pub(crate) fn last_before(&self, sid: u32, size: u64, ptr: u64) -> Option<(u64, u64, u32)> {
        self.lists.get(sid as usize)?.last_before(size, ptr)
    }

    /// True when list `sid` holds no block.
    pub(crate) fn list_is_empty(&self, sid: u32) -> bool {
        self.lists.get(sid as usize).is_none_or(|l| l.nonempty.iter().all(|&w| w == 0))
    }

    /// Every block id, in no particular order. Only non-empty buckets are visited (by their
    /// bitmap): with thousands of streams, most lists are empty, and a walk over every bucket of
    /// every list on each release of cached blocks made a run with 50,000 streams crawl.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.lists.iter().flat_map(|s| {
            s.nonempty.iter().enumerate().flat_map(move |(w, &word)| {
                let mut bits = word;
                std::iter::from_fn(move || {
                    if bits == 0 {
                        return None;
                    }
                    let b = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    Some(b)
                })
                .flat_map(move |b| s.buckets[b].iter().map(|&(_, _, id)| id))
            })
        })
    }

    /// Number of blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use std::collections::BTreeMap;

    #[test]
    fn size_classes_are_monotonic() {
        for size in 1..200_000u64 {
            assert!(bucket(size) <= bucket(size + 1), "{size}");
        }
        for shift in 3..63 {
            let s = 1u64 << shift;
            assert!(bucket(s - 1) <= bucket(s) && bucket(s) <= bucket(s + (s >> 3)), "{s}");
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }

    #[test]
    fn queries_agree_with_a_btreemap() {
        for seed in 0..20 {
            let mut rng = Rng::new(seed);
            let mut set = FreeSet::default();
            let mut oracle: BTreeMap<(u32, u64, u64), u32> = BTreeMap::new();
            for step in 0..3000u32 {
                let sid = rng.below(3) as u32;
                let size = match rng.below(3) {
                    0 => 512 * (1 + rng.below(8)),
                    1 => 512 * (1 + rng.below(4096)),
                    _ => (1 + rng.below(64)) << 20,
                };
                let ptr = 512 * rng.below(1 << 20);
                match rng.below(4) {
                    0 | 1 => {
                        set.insert(sid, size, ptr, step);
                        oracle.insert((sid, size, ptr), step);
                    }
                    2 => {
                        // Remove an existing element (or a missing one).
                        let key = oracle.range((sid, size, 0)..).next().map(|(k, _)| *k);
                        if let Some(k) = key.filter(|k| k.0 == sid) {
                            assert_eq!(set.remove(k.0, k.1, k.2), oracle.remove(&k));
                        } else {
                            assert_eq!(set.remove(sid, size, ptr), None);
                        }
                    }
                    _ => {
                        // Take the first block ≥ (size, ptr) where the query found it.
                        let want = oracle
                            .range((sid, size, ptr)..)
                            .next()
                            .filter(|(k, _)| k.0 == sid)
                            .map(|(k, &v)| (*k, v));
                        let found = set.first_at(sid, size, ptr);
                        assert_eq!(found.map(|(e, _)| e), want.map(|(k, v)| (k.1, k.2, v)));
                        if let (Some((_, spot)), Some((k, v))) = (found, want) {
                            assert_eq!(set.remove_at(sid, spot), Some(v));
                            oracle.remove(&k);
                        }
                    }
                }
                let want = oracle
                    .range((sid, size, ptr)..)
                    .next()
                    .filter(|(k, _)| k.0 == sid)
                    .map(|(k, &v)| (k.1, k.2, v));
                assert_eq!(set.first_from(sid, size, ptr), want, "seed {seed} step {step}");
                let want = oracle
                    .range(..(sid, size, ptr))
                    .next_back()
                    .filter(|(k, _)| k.0 == sid)
                    .map(|(k, &v)| (k.1, k.2, v));
                assert_eq!(set.last_before(sid, size, ptr), want, "seed {seed} step {step}");
                if let Some((s, p, _)) = set.first_from(sid, size, ptr) {
                    let want = oracle
                        .range((sid, s, p + 1)..)
                        .next()
                        .filter(|(k, _)| k.0 == sid)
                        .map(|(k, &v)| (k.1, k.2, v));
                    assert_eq!(set.next_after(sid, s, p), want);
                    assert!(set.get(sid, s, p).is_some());
                }
                assert_eq!(set.len(), oracle.len());
            }
            let mut ids: Vec<u32> = set.ids().collect();
            let mut want: Vec<u32> = oracle.values().copied().collect();
            ids.sort_unstable();
            want.sort_unstable();
            assert_eq!(ids, want);
        }
    }
}
