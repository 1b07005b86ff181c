//! `Guided`: the simulated device of a validation, which follows the recording: a new segment
//! takes the address recorded for it within the same malloc, and a device call fails exactly
//! where the recording shows it failed.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::policy::pytorch::start::StartState;
use crate::trace::{Action, Event};
use std::collections::BTreeMap;

/// Addresses for segments the recording does not show: far from any real GPU address.
const FRESH_BASE: u64 = 0xf000_0000_0000;

/// A device that follows the recording: see the module docs.
pub(super) struct Guided<'a> {
    pub(super) events: &'a [Event],
    /// The recorded segment events of the current operation.
    pub(super) script: Vec<usize>,
    /// The current malloc ended in a recorded OOM.
    pub(super) oom: bool,
    /// The simulated segment events of the current operation.
    pub(super) log: Vec<Event>,
    pub(super) segments: BTreeMap<u64, u64>,
    pub(super) reservations: BTreeMap<u64, u64>,
    pub(super) reserved: u64,
    /// While the start state is installed: the recorded addresses of its segments, then of its
    /// expandable reservations, in the order the policy obtains them ([`PyTorch`](crate::policy::pytorch::PyTorch)'s
    /// `Policy::start`).
    pub(super) installing: std::vec::IntoIter<u64>,
    pub(super) fresh: u64,
    pub(super) now: i64,
    /// The index of the event being replayed, and the stream of the malloc being served.
    pub(super) at: usize,
    pub(super) stream: u64,
    /// The page size of the malloc's pool, and whether it is the small pool: what its maps are
    /// made of (a small-pool malloc maps one page, a large-pool one whole pages).
    pub(super) page: u64,
    pub(super) small: bool,
    /// The private pool the malloc was made into (`None`: the default pools), and the routes
    /// that tell a recorded map's pool: a reservation is one pool's.
    pub(super) pool: Option<(u64, u64)>,
    pub(super) routes: Option<&'a crate::trace::pool_routes::PoolRoutes>,
}

impl<'a> Guided<'a> {
    /// A device that follows `events` (and looks ahead no further) from `start`, whose segments
    /// and reservations it hands out at their recorded addresses first.
    pub(super) fn new(events: &'a [Event], start: &'a StartState) -> Guided<'a> {
        let segments = start.segments.iter().filter(|s| !s.expandable).map(|s| s.addr);
        let bases = start.reservations.iter().map(|r| r.base);
        let installing: Vec<u64> = segments.chain(bases).collect();
        Guided {
            events,
            script: Vec::new(),
            oom: false,
            log: Vec::new(),
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            reserved: 0,
            installing: installing.into_iter(),
            fresh: FRESH_BASE,
            now: 0,
            at: 0,
            stream: 0,
            page: 0,
            small: false,
            pool: None,
            routes: start.routes.as_ref(),
        }
    }

    /// Starts the operation of recorded event `at` (the start state is installed by then).
    pub(super) fn begin(&mut self, at: usize) {
        self.at = at;
        self.now = self.events.get(at).map_or(self.now, |e| e.time_us);
        self.installing = Vec::new().into_iter();
    }

    /// Follows `script`, the recorded segment events of the operation about to run (`oom`: it
    /// ends in a recorded out-of-memory), with an empty log.
    pub(super) fn follow(&mut self, script: &[usize], oom: bool) {
        self.script.clear();
        self.script.extend_from_slice(script);
        self.oom = oom;
        self.log.clear();
    }

    /// The recorded event at the position the next simulated one will take.
    fn expected(&self) -> Option<&Event> {
        self.script.get(self.log.len()).map(|&i| &self.events[i])
    }

    /// Whether the recording shows the next device call failing.
    fn fails(&self) -> bool {
        match self.expected() {
            Some(e) => matches!(e.action, Action::SegmentFree | Action::SegmentUnmap),
            None => self.oom,
        }
    }

    fn fresh(&mut self, size: u64) -> u64 {
        let a = self.fresh;
        self.fresh += size.div_ceil(2 << 20).max(1) * (2 << 20);
        a
    }

    fn hold(&mut self, delta: i64) {
        self.reserved = self.reserved.wrapping_add_signed(delta);
    }

    fn note(&mut self, action: Action, addr: u64, size: u64) {
        self.log.push(Event::new(action, addr, size, 0, self.now));
    }
}

impl Backend for Guided<'_> {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        if self.fails() {
            return Ok(None);
        }
        let addr = match (self.installing.next(), self.expected()) {
            (Some(a), _) => a,
            (None, Some(e)) if e.action == Action::SegmentAlloc && e.size == size => e.addr,
            _ => self.fresh(size),
        };
        self.segments.insert(addr, size);
        self.hold(size as i64);
        self.note(Action::SegmentAlloc, addr, size);
        Ok(Some(addr))
    }

    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        if self.segments.remove(&addr) != Some(size) {
            return Err(Error::backend(format!(
                "segment_free({addr:#x}, {size}): no such segment"
            )));
        }
        self.hold(-(size as i64));
        self.note(Action::SegmentFree, addr, size);
        Ok(())
    }

    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        if let Some(base) = self.installing.next() {
            self.reservations.insert(base, size);
            return Ok(Some(base));
        }
        // The first map of a new reservation is at its base (the lowest hole), possibly after a
        // failed first attempt and a flush within the same malloc. The whole script is searched:
        // the simulation may have logged a different number of events before this call (one
        // recorded unmap can be two of its own), and a map already made lies in a known
        // reservation.
        let new_map = |e: &&Event| {
            e.action == Action::SegmentMap
                && !self.reservations.iter().any(|(&a, &s)| a <= e.addr && e.addr < a + s)
        };
        // A malloc that fails after reserving (an OOM: no page could be mapped) keeps the
        // reservation, and a later malloc on its stream and pool maps into it: the first later
        // map on that stream, of that pool's pages, outside every known reservation shows where
        // it is.
        let (stream, page, small) = (self.stream, self.page.max(1), self.small);
        let same_private = |e: &Event| self.routes.is_none_or(|r| r.pool_for(e) == self.pool);
        let of_pool = |e: &&Event| {
            (if small { e.size == page } else { e.size % page == 0 }) && same_private(e)
        };
        let recorded = self
            .script
            .iter()
            .map(|&i| &self.events[i])
            .find(new_map)
            .or_else(|| {
                let later = self.events.get(self.at..)?;
                later.iter().find(|e| e.stream == stream && new_map(e) && of_pool(e))
            })
            .map(|e| e.addr);
        let addr = match recorded {
            Some(a) => a,
            None => self.fresh(size),
        };
        self.reservations.insert(addr, size);
        Ok(Some(addr))
    }

    fn release(&mut self, addr: u64, _size: u64) -> Result<()> {
        self.reservations.remove(&addr);
        Ok(())
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        if self.fails() {
            return Ok(false);
        }
        self.hold(size as i64);
        self.note(Action::SegmentMap, addr, size);
        Ok(true)
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        self.hold(-(size as i64));
        self.note(Action::SegmentUnmap, addr, size);
        Ok(())
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }
}
