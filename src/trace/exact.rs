//! Exact-address allocations (`mallocWithAddress`, PyTorch 2.13+): a request placed at an
//! address the program chose (`UntypedStorage._resize_with_addr_`), which no placement rule
//! reproduces. The allocator finds the free block holding the address, allocates a prefix
//! from the block's start up to the address, allocates the request at the address, and frees
//! the prefix; from 2.15 the prefix's entries carry `internal_metadata: "mallocWithAddress"`,
//! which is how a recording shows one (earlier releases leave no mark).
//!
//! The address a program asks for is one it was handed before: a storage put back where it
//! lived. A replay whose memory lies elsewhere than the recording's (any run but `validate`'s)
//! finds that address through the block that held it: `ExactAddress::source`.

use super::{Action, Event};
use std::collections::BTreeMap;

/// How far from a marked entry the prefix's and the request's `alloc` may lie, in events: the
/// allocator makes the three steps back to back, under its lock.
const NEAR: usize = 8;

/// One exact-address allocation in a device's events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactAddress {
    /// The index of the prefix's `alloc` (at the start of the free block that held the address).
    pub(crate) prefix: u64,
    /// The index of the request's `alloc`, at the address asked.
    pub(crate) alloc: u64,
    /// The request's recorded address less the prefix's.
    pub(crate) offset: u64,
    /// The last `alloc` before the prefix whose recorded block held the request's address (the
    /// block the program took the address from), when the trace shows one: a replay places the
    /// request where it placed that block, at the same distance into it (`source_offset`).
    pub(crate) source: Option<u64>,
    /// The request's recorded address less the `source` block's.
    pub(crate) source_offset: u64,
}

/// The exact-address allocations in `events`, from the indices of the events whose entries
/// carry the `mallocWithAddress` mark (`marked`, in order): for each, the prefix's `alloc` (the
/// marked `alloc`, or the last `alloc` at the marked address before the mark) and the next
/// `alloc` after it at a higher address. Marks that show no such pair are passed over. In the
/// order of their prefixes, without repeats.
pub(crate) fn pairs(events: &[Event], marked: &[u64]) -> Vec<ExactAddress> {
    let mut out: Vec<ExactAddress> = Vec::new();
    for &m in marked {
        let m = m as usize;
        let Some(e) = events.get(m) else { continue };
        let prefix = (m.saturating_sub(NEAR)..=m)
            .rev()
            .find(|&i| events[i].action == Action::Alloc && events[i].addr == e.addr);
        let Some(prefix) = prefix else { continue };
        if out.last().is_some_and(|p| p.prefix >= prefix as u64) {
            continue;
        }
        let end = (prefix + 1 + NEAR).min(events.len());
        let alloc = (prefix + 1..end).find(|&i| events[i].action == Action::Alloc);
        let Some(alloc) = alloc.filter(|&i| events[i].addr > e.addr) else { continue };
        out.push(ExactAddress {
            prefix: prefix as u64,
            alloc: alloc as u64,
            offset: events[alloc].addr - e.addr,
            source: None,
            source_offset: 0,
        });
    }
    find_sources(events, &mut out);
    out
}

/// Fills in each pair's [`ExactAddress::source`]: one pass over the events up to the last
/// prefix, keeping the last `alloc` at each recorded address; the block holding a request's
/// address is the one starting nearest below it, if it reaches that far.
fn find_sources(events: &[Event], pairs: &mut [ExactAddress]) {
    let mut last_alloc: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut next = 0;
    for (i, e) in events.iter().enumerate() {
        while let Some(p) = pairs.get_mut(next).filter(|p| p.prefix == i as u64) {
            let asked = events[p.alloc as usize].addr;
            let holder = last_alloc.range(..=asked).next_back();
            if let Some((&addr, &(index, size))) = holder {
                if asked - addr < size {
                    (p.source, p.source_offset) = (Some(index), asked - addr);
                }
            }
            next += 1;
        }
        if next == pairs.len() {
            return;
        }
        if e.action == Action::Alloc {
            last_alloc.insert(e.addr, (i as u64, e.size));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_prefix_pair_names_the_prefix_and_the_request_after_it() {
        let ev = |action, addr, size| Event::new(action, addr, size, 0, 0);
        let events = [
            ev(Action::SegmentAlloc, 0x1000_0000, 20 << 20),
            ev(Action::Alloc, 0x1000_0000, 4096),
            ev(Action::Alloc, 0x1000_1000, 1 << 20),
            ev(Action::FreeRequested, 0x1000_0000, 4096),
            ev(Action::FreeCompleted, 0x1000_0000, 4096),
        ];
        let want = vec![ExactAddress {
            prefix: 1,
            alloc: 2,
            offset: 4096,
            source: None,
            source_offset: 0,
        }];
        // Marked on the prefix's free pair (and on its alloc, or not): one allocation.
        assert_eq!(pairs(&events, &[3, 4]), want);
        assert_eq!(pairs(&events, &[1, 3, 4]), want);
        // A mark with no alloc at its address before it, or out of range: none.
        assert_eq!(pairs(&events, &[0, 9]), vec![]);
    }

    #[test]
    fn the_source_is_the_last_block_before_the_prefix_that_held_the_address() {
        let ev = |action, addr, size| Event::new(action, addr, size, 0, 0);
        let events = [
            ev(Action::Alloc, 0x1000_0000, 8 << 20),
            ev(Action::FreeCompleted, 0x1000_0000, 8 << 20),
            // Not the holder: it ends below the address asked.
            ev(Action::Alloc, 0x1000_0000, 1 << 20),
            ev(Action::FreeCompleted, 0x1000_0000, 1 << 20),
            // The prefix, then the request at 2 MiB into the block of event 0.
            ev(Action::Alloc, 0x1000_0000, 2 << 20),
            ev(Action::Alloc, 0x1020_0000, 1 << 20),
            ev(Action::FreeCompleted, 0x1000_0000, 2 << 20),
            // A request at an address no earlier block held.
            ev(Action::Alloc, 0x3000_0000, 4096),
            ev(Action::Alloc, 0x3000_1000, 4096),
            ev(Action::FreeCompleted, 0x3000_0000, 4096),
        ];
        let found = pairs(&events, &[6, 9]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].source, found[0].source_offset), (None, 0), "{found:?}");
        let events = [&events[..2], &events[4..]].concat();
        let found = pairs(&events, &[4, 7]);
        assert_eq!((found[0].source, found[0].source_offset), (Some(0), 2 << 20), "{found:?}");
        assert_eq!(found[1].source, None, "{found:?}");
    }
}
