//! A simulated GPU: capacity, memory used outside the allocator, and address assignment.
//!
//! It answers the what-if questions: with `--capacity 40GiB`, a `cudaMalloc` fails exactly when
//! the device would have run out. Physical fragmentation does not matter to `cudaMalloc`
//! (docs/pytorch-model.md#capacity), so capacity is a plain byte count. Addresses are assigned by a
//! bump pointer in 2 MiB-aligned steps, never reused, so a stale pointer in a buggy policy can
//! never alias a new segment.
//!
//! Replaying a PyTorch snapshot, a new segment should land where the real run put it, so that
//! every later `alloc` address is comparable with the recording: [`SimDevice::expect_address`]
//! queues recorded segment addresses, and the next segment or reservation of that size takes it.

use super::Backend;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, VecDeque};

/// Where simulated addresses start: high, as on real GPUs, and far from typical recorded ones.
const FIRST_ADDRESS: u64 = 0x7e00_0000_0000;
/// Alignment of simulated segments and reservations.
const ALIGN: u64 = 2 << 20;
/// The end of the simulated address space (2^56 bytes, 64 PiB: more than any GPU's virtual
/// address range). A segment or reservation that would pass it is refused as out of memory, so
/// no policy ever holds a range whose `base + size` wraps, and reserved bytes cannot overflow.
pub const ADDRESS_LIMIT: u64 = 1 << 56;

/// A simulated device. See the module docs.
#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: Option<u64>,
    outside: u64,
    next_address: u64,
    reserved: u64,
    peak_reserved: u64,
    segments: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, u64>,
    mapped: BTreeMap<u64, u64>,
    expected: VecDeque<(u64, u64)>,
}

impl Default for SimDevice {
    fn default() -> Self {
        SimDevice::new(None)
    }
}

impl SimDevice {
    /// A device with `capacity` bytes (`None`: unlimited).
    pub fn new(capacity: Option<u64>) -> SimDevice {
        SimDevice {
            capacity,
            outside: 0,
            next_address: FIRST_ADDRESS,
            reserved: 0,
            peak_reserved: 0,
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            mapped: BTreeMap::new(),
            expected: VecDeque::new(),
        }
    }

    /// Counts `bytes` as used outside the allocator (CUDA context, NCCL buffers, other processes).
    pub(crate) fn with_outside_usage(mut self, bytes: u64) -> SimDevice {
        self.outside = bytes;
        self
    }

    /// Queues a recorded (size, address): the next segment or reservation of exactly `size`
    /// bytes gets `address`, unless that range is taken. Others get fresh addresses.
    pub fn expect_address(&mut self, size: u64, address: u64) {
        self.expected.push_back((size, address));
    }

    /// The most memory held at once so far.
    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// The capacity, if limited.
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    fn fits(&self, size: u64) -> bool {
        match self.capacity {
            // Without a capacity, only a count that would overflow does not fit.
            None => self.reserved.checked_add(size).is_some(),
            Some(cap) => self.reserved.saturating_add(self.outside).saturating_add(size) <= cap,
        }
    }

    fn overlaps(map: &BTreeMap<u64, u64>, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        map.range(..end).next_back().is_some_and(|(&a, &s)| a.saturating_add(s) > addr)
    }

    /// An address for a new range of `size` bytes, or `None` when the address space is spent.
    fn address_for(&mut self, size: u64) -> Option<u64> {
        let fits_space = |addr: u64| addr.checked_add(size).is_some_and(|e| e <= ADDRESS_LIMIT);
        if let Some(pos) = self.expected.iter().position(|&(s, _)| s == size) {
            let (_, addr) = self.expected.remove(pos).expect("position came from the queue");
            if fits_space(addr)
                && !Self::overlaps(&self.segments, addr, size)
                && !Self::overlaps(&self.reservations, addr, size)
            {
                return Some(addr);
            }
        }
        let addr = self.next_address;
        let step = size.div_ceil(ALIGN).max(1).checked_mul(ALIGN)?;
        let next = addr.checked_add(step).filter(|&n| n <= ADDRESS_LIMIT)?;
        self.next_address = next;
        Some(addr)
    }

    fn hold(&mut self, size: u64) {
        self.reserved += size;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }
}

impl Backend for SimDevice {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        if size == 0 || !self.fits(size) {
            return Ok(None);
        }
        let Some(addr) = self.address_for(size) else { return Ok(None) };
        self.segments.insert(addr, size);
        self.hold(size);
        Ok(Some(addr))
    }

    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        match self.segments.remove(&addr) {
            Some(s) if s == size => {
                self.reserved -= size;
                Ok(())
            }
            Some(s) => {
                self.segments.insert(addr, s);
                Err(Error::backend(format!(
                    "segment_free({addr:#x}, {size}): the segment there has {s} bytes"
                )))
            }
            None => {
                Err(Error::backend(format!("segment_free({addr:#x}): no segment starts there")))
            }
        }
    }

    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        if size == 0 {
            return Ok(None);
        }
        let Some(addr) = self.address_for(size) else { return Ok(None) };
        self.reservations.insert(addr, size);
        Ok(Some(addr))
    }

    fn release(&mut self, addr: u64, size: u64) -> Result<()> {
        if Self::overlaps(&self.mapped, addr, size) {
            return Err(Error::backend(format!("release({addr:#x}): pages are still mapped")));
        }
        match self.reservations.remove(&addr) {
            Some(_) => Ok(()),
            None => Err(Error::backend(format!("release({addr:#x}): no reservation starts there"))),
        }
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        let inside = self
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &s)| addr.checked_add(size).is_some_and(|end| end <= a + s));
        if !inside {
            return Err(Error::backend(format!(
                "map({addr:#x}, {size}): outside every reservation"
            )));
        }
        if Self::overlaps(&self.mapped, addr, size) {
            return Err(Error::backend(format!("map({addr:#x}, {size}): already mapped")));
        }
        if size == 0 || !self.fits(size) {
            return Ok(false);
        }
        self.mapped.insert(addr, size);
        self.hold(size);
        Ok(true)
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        // Most unmaps undo one earlier map exactly (maps never overlap): one lookup.
        if let std::collections::btree_map::Entry::Occupied(m) = self.mapped.entry(addr) {
            if *m.get() == size {
                m.remove();
                self.reserved -= size;
                return Ok(());
            }
        }
        // Unmapping may cover several earlier maps, or part of one (pages are independent).
        let end = addr + size;
        let touched: Vec<(u64, u64)> = self
            .mapped
            .range(..end)
            .rev()
            .take_while(|(&a, &s)| a + s > addr)
            .map(|(&a, &s)| (a, s))
            .collect();
        let covered: u64 = touched.iter().map(|&(a, s)| (a + s).min(end) - a.max(addr)).sum();
        if covered != size {
            return Err(Error::backend(format!(
                "unmap({addr:#x}, {size}): only {covered} bytes there are mapped"
            )));
        }
        for (a, s) in touched {
            self.mapped.remove(&a);
            if a < addr {
                self.mapped.insert(a, addr - a);
            }
            if a + s > end {
                self.mapped.insert(end, a + s - end);
            }
        }
        self.reserved -= size;
        Ok(())
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_limits_segments_and_counts_outside_usage() {
        let mut d = SimDevice::new(Some(10 << 20)).with_outside_usage(4 << 20);
        let a = d.segment_alloc(4 << 20).unwrap().unwrap();
        assert_eq!(d.segment_alloc(4 << 20).unwrap(), None, "4 + 4 + 4 MiB > 10 MiB");
        assert_eq!(d.reserved(), 4 << 20);
        d.segment_free(a, 4 << 20).unwrap();
        assert_eq!(d.reserved(), 0);
        assert_eq!(d.peak_reserved(), 4 << 20);
    }

    #[test]
    fn expected_addresses_are_used_once() {
        let mut d = SimDevice::default();
        d.expect_address(2 << 20, 0x1000_0000);
        assert_eq!(d.segment_alloc(20 << 20).unwrap(), Some(FIRST_ADDRESS));
        assert_eq!(d.segment_alloc(2 << 20).unwrap(), Some(0x1000_0000));
        assert_ne!(d.segment_alloc(2 << 20).unwrap(), Some(0x1000_0000));
    }

    #[test]
    fn map_and_partial_unmap() {
        let mut d = SimDevice::new(Some(100 << 20));
        let va = d.reserve(1 << 30).unwrap().unwrap();
        assert!(d.map(va, 40 << 20).unwrap());
        assert!(d.map(va + (40 << 20), 20 << 20).unwrap());
        d.unmap(va + (20 << 20), 40 << 20).unwrap();
        assert_eq!(d.reserved(), 20 << 20);
        assert!(d.release(va, 1 << 30).is_err(), "pages still mapped");
        d.unmap(va, 20 << 20).unwrap();
        d.release(va, 1 << 30).unwrap();
        assert!(d.unmap(va, 2 << 20).is_err());
        let va2 = d.reserve(1 << 30).unwrap().unwrap();
        assert!(!d.map(va2, 200 << 20).unwrap(), "over capacity");
    }

    #[test]
    fn the_address_space_ends_and_past_it_requests_are_refused_not_wrapped() {
        let mut d = SimDevice::default();
        let huge = 1u64 << 59;
        assert_eq!(d.segment_alloc(huge).unwrap(), None, "past 2^56");
        assert_eq!(d.reserve(huge).unwrap(), None);
        assert_eq!(d.segment_alloc(u64::MAX).unwrap(), None);
        let big = ADDRESS_LIMIT / 4;
        let n = (0..8).filter(|_| d.segment_alloc(big).unwrap().is_some()).count();
        assert_eq!(n, 3, "the space below 2^56 holds three quarters after the first address");
        assert_eq!(d.reserved(), 3 * big);
        d.expect_address(ALIGN, u64::MAX - 1);
        assert_eq!(d.segment_alloc(ALIGN).unwrap().map(|a| a < ADDRESS_LIMIT), Some(true));
    }

    #[test]
    fn freeing_an_unknown_segment_is_an_error_not_a_panic() {
        let mut d = SimDevice::default();
        assert!(d.segment_free(0x42, 1).is_err());
    }
}
