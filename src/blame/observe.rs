//! Watching a replay from outside the policy: which request each block, segment and hole came
//! from.
//!
//! [`Watched`] wraps any [`Policy`] and forwards every call to it unchanged, so the replay makes
//! exactly the decisions it makes unwatched. On the way it notes, in a [`Layout`]:
//!
//! - each block the policy hands out, with the request that asked for it ([`Origin`]): the engine
//!   asks for the blocks live at the start first (those [`Policy::start`] does not install), then
//!   for every `alloc` and recorded `oom` of non-zero size in event order (docs of
//!   [`crate::replay`]), so the n-th malloc serves the n-th such request. Each malloc's size and
//!   stream are checked against the request's, so a change to that order is an error, never a
//!   silent misattribution;
//! - each range of device memory the policy obtains (a segment, or pages mapped), with the request
//!   being served when it did (the backend calls are seen through a wrapper of the backend);
//! - each block freed, as a painted range with a sequence number, so the last block freed into
//!   any hole is known.
//!
//! Holes are the obtained ranges minus the live blocks, so the bytes add up by construction:
//! live requests + rounding + holes = reserved.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::policy::{Allocation, Handle, Policy};
use crate::trace::{Action, AddrMap, Event, LiveBlock, Segment};
use std::collections::{BTreeMap, VecDeque};

/// What a block, a range of device memory or a freed range came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// The request of event `n` (an `alloc`, or a recorded `oom` every policy tries).
    Event(u32),
    /// Block `k` of the blocks live at the start.
    Start(u32),
    /// The state a policy installed before the first event ([`Policy::start`]).
    BeforeTrace,
    /// Nothing the replay asked for (memory obtained outside any request).
    Unknown,
}

/// A live block: its size after rounding, its request size and where it came from.
#[derive(Clone, Copy, Debug)]
pub struct LiveEntry {
    /// Block size (≥ the request).
    pub(crate) block: u64,
    /// Request size.
    pub(crate) request: u64,
    /// Who asked for it.
    pub(crate) origin: Origin,
}

/// A freed range: where it ends, when it was freed (a sequence number) and whose block it was.
#[derive(Clone, Copy, Debug)]
struct Freed {
    end: u64,
    seq: u64,
    origin: Origin,
}

/// What a watched replay knows about the policy's memory, kept up to date call by call.
#[derive(Debug)]
pub struct Layout<'e> {
    events: &'e [Event],
    live_at_start: &'e [LiveBlock],
    /// The next event to look at for the request of the next malloc.
    cursor: usize,
    /// The live-at-start blocks the engine will malloc, in order.
    start_queue: VecDeque<u32>,
    /// The request being served while a policy call runs.
    serving: Origin,
    /// Live blocks by the policy's address.
    pub(crate) live: AddrMap<LiveEntry>,
    /// Device memory held: start → (end, the request served when it was obtained); disjoint.
    pub created: BTreeMap<u64, (u64, Origin)>,
    /// Freed ranges: start → the block freed there last; disjoint.
    freed: BTreeMap<u64, Freed>,
    seq: u64,
    /// The first inconsistency seen (the engine's call order was not the one expected).
    lost: Option<String>,
}

impl<'e> Layout<'e> {
    /// A layout for a replay of `events` starting with `live_at_start`.
    pub(crate) fn new(events: &'e [Event], live_at_start: &'e [LiveBlock]) -> Layout<'e> {
        Layout {
            events,
            live_at_start,
            cursor: 0,
            start_queue: VecDeque::new(),
            serving: Origin::Unknown,
            live: AddrMap::default(),
            created: BTreeMap::new(),
            freed: BTreeMap::new(),
            seq: 0,
            lost: None,
        }
    }

    /// An error if the replay's calls did not follow the expected order.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.lost {
            Some(why) => Err(Error::new(
                crate::error::ErrorKind::Backend,
                format!("attribution lost track of the replay: {why}"),
            )),
            None => Ok(()),
        }
    }

    /// The request the next malloc of `size` bytes on `stream` serves.
    fn next_request(&mut self, size: u64, stream: u64) -> Origin {
        if let Some(k) = self.start_queue.pop_front() {
            let b = &self.live_at_start[k as usize];
            if b.size.max(1) != size && self.lost.is_none() {
                self.lost = Some(format!("live-at-start block {k}: malloc of {size} B"));
            }
            return Origin::Start(k);
        }
        while let Some(e) = self.events.get(self.cursor) {
            let i = self.cursor;
            self.cursor += 1;
            if matches!(e.action, Action::Alloc | Action::Oom) && e.size > 0 {
                if (e.size, e.stream) != (size, stream) && self.lost.is_none() {
                    self.lost = Some(format!(
                        "event {i} asks for {} B on stream {:#x}, the malloc for {size} B on {stream:#x}",
                        e.size, e.stream
                    ));
                }
                return Origin::Event(i as u32);
            }
        }
        if self.lost.is_none() {
            self.lost = Some(format!("a malloc of {size} B after the last request"));
        }
        Origin::Unknown
    }

    /// The block `a` was handed out for `origin`'s request of `request` bytes.
    pub(super) fn placed(&mut self, a: Allocation, request: u64, origin: Origin) {
        self.live.insert(a.addr, LiveEntry { block: a.block_size, request, origin });
    }

    /// The block at `addr` is freed.
    pub(super) fn freed(&mut self, addr: u64) {
        if let Some(b) = self.live.remove(&addr) {
            self.seq += 1;
            let end = addr.saturating_add(b.block);
            paint(&mut self.freed, addr, end, |end| Freed { end, seq: self.seq, origin: b.origin });
        }
    }

    /// `[addr, addr + size)` of device memory was obtained, serving the current request.
    pub(super) fn obtained(&mut self, addr: u64, size: u64) {
        self.obtained_for(addr, size, self.serving);
    }

    /// `[addr, addr + size)` of device memory was obtained for `origin`.
    pub(super) fn obtained_for(&mut self, addr: u64, size: u64, origin: Origin) {
        paint(&mut self.created, addr, addr.saturating_add(size), |end| (end, origin));
    }

    /// `[addr, addr + size)` of device memory went back to the device.
    pub(super) fn returned(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        erase(&mut self.created, addr, end, |v| &mut v.0);
        erase(&mut self.freed, addr, end, |v| &mut v.end);
    }

    /// The block last freed into `[a, b)`, if any.
    pub(crate) fn last_freed_in(&self, a: u64, b: u64) -> Option<Origin> {
        let mut best: Option<(u64, Origin)> = None;
        for (_, f) in self.freed.range(..b).rev() {
            if f.end <= a {
                break;
            }
            if best.is_none_or(|(seq, _)| f.seq > seq) {
                best = Some((f.seq, f.origin));
            }
        }
        best.map(|(_, o)| o)
    }
}

/// Sets `[a, b)` of the disjoint range map `map` to `value(b)`, cutting the ranges it overlaps.
fn paint<V: Copy + HasEnd>(map: &mut BTreeMap<u64, V>, a: u64, b: u64, value: impl Fn(u64) -> V) {
    if a >= b {
        return;
    }
    erase(map, a, b, V::end_mut);
    map.insert(a, value(b));
}

/// Removes `[a, b)` from the disjoint range map `map` (`end` gives a value's end), keeping the
/// parts of ranges outside it.
fn erase<V: Copy>(map: &mut BTreeMap<u64, V>, a: u64, b: u64, end: impl Fn(&mut V) -> &mut u64) {
    // The range starting before `a` that reaches into [a, b): cut at `a`, its part past `b` kept.
    let mut past_b = None;
    if let Some((_, v)) = map.range_mut(..a).next_back() {
        let e = *end(v);
        if e > a {
            *end(v) = a;
            if e > b {
                let mut rest = *v;
                *end(&mut rest) = e;
                past_b = Some(rest);
            }
        }
    }
    if let Some(rest) = past_b {
        map.insert(b, rest);
        return; // it covered all of [a, b)
    }
    // Ranges starting inside [a, b).
    let inside: Vec<u64> = map.range(a..b).map(|(&s, _)| s).collect();
    for s in inside {
        if let Some(mut v) = map.remove(&s) {
            let e = *end(&mut v);
            if e > b {
                map.insert(b, v);
            }
        }
    }
}

/// A range map value with an end.
trait HasEnd {
    fn end_mut(&mut self) -> &mut u64;
}

impl HasEnd for (u64, Origin) {
    fn end_mut(&mut self) -> &mut u64 {
        &mut self.0
    }
}

impl HasEnd for Freed {
    fn end_mut(&mut self) -> &mut u64 {
        &mut self.end
    }
}

/// A backend seen by a [`Layout`]: every range obtained or returned is noted, with the request
/// being served.
struct Watch<'a, 'e, B> {
    inner: &'a mut B,
    layout: &'a mut Layout<'e>,
}

impl<B: Backend> Backend for Watch<'_, '_, B> {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        let addr = self.inner.segment_alloc(size)?;
        if let Some(a) = addr {
            self.layout.obtained(a, size);
        }
        Ok(addr)
    }
    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.segment_free(addr, size)?;
        self.layout.returned(addr, size);
        Ok(())
    }
    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        self.inner.reserve(size)
    }
    fn release(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.release(addr, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        let ok = self.inner.map(addr, size)?;
        if ok {
            self.layout.obtained(addr, size);
        }
        Ok(ok)
    }
    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.unmap(addr, size)?;
        self.layout.returned(addr, size);
        Ok(())
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }
}

/// A policy watched by a [`Layout`]: every call is forwarded unchanged. See the module docs.
pub struct Watched<'a, 'e, P> {
    /// The policy.
    pub(crate) inner: P,
    /// What is noted.
    pub(crate) layout: &'a mut Layout<'e>,
}

impl<P: Policy> Watched<'_, '_, P> {
    /// Runs `f` on the inner policy with `backend` watched, serving `origin`.
    fn with<B: Backend, T>(
        &mut self,
        backend: &mut B,
        origin: Origin,
        f: impl FnOnce(&mut P, &mut Watch<'_, '_, B>) -> T,
    ) -> T {
        self.layout.serving = origin;
        let mut watch = Watch { inner: backend, layout: self.layout };
        let out = f(&mut self.inner, &mut watch);
        self.layout.serving = Origin::Unknown;
        out
    }
}

impl<P: Policy> Policy for Watched<'_, '_, P> {
    fn config(&self) -> String {
        self.inner.config()
    }
    fn prepare(&mut self, events: &[Event]) -> Result<()> {
        self.inner.prepare(events)
    }
    fn start<B: Backend>(
        &mut self,
        backend: &mut B,
        live_at_start: &[LiveBlock],
    ) -> Result<Vec<Option<Allocation>>> {
        let placed = self.with(backend, Origin::BeforeTrace, |p, b| p.start(b, live_at_start))?;
        for (k, (a, b)) in placed.iter().zip(live_at_start).enumerate() {
            match a {
                Some(a) => self.layout.placed(*a, b.size, Origin::Start(k as u32)),
                None => self.layout.start_queue.push_back(k as u32),
            }
        }
        for k in placed.len()..live_at_start.len() {
            self.layout.start_queue.push_back(k as u32);
        }
        Ok(placed)
    }
    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        let origin = self.layout.next_request(size, stream);
        let placed = self.with(backend, origin, |p, b| p.malloc(b, size, stream))?;
        if let Some(a) = placed {
            let request = match origin {
                Origin::Start(k) => self.layout.live_at_start[k as usize].size,
                _ => size,
            };
            self.layout.placed(a, request, origin);
        }
        Ok(placed)
    }
    fn allocate_into(&mut self, pool: Option<(u64, u64)>) -> Result<()> {
        self.inner.allocate_into(pool)
    }
    fn release_pool(&mut self, pool: (u64, u64)) -> Result<()> {
        self.inner.release_pool(pool)
    }
    fn free<B: Backend>(&mut self, backend: &mut B, addr: u64) -> Result<()> {
        self.layout.freed(addr);
        self.with(backend, Origin::Unknown, |p, b| p.free(b, addr))
    }
    fn free_handle<B: Backend>(
        &mut self,
        backend: &mut B,
        addr: u64,
        handle: Handle,
    ) -> Result<()> {
        self.layout.freed(addr);
        self.with(backend, Origin::Unknown, |p, b| p.free_handle(b, addr, handle))
    }
    fn would_serve_from_cache(&self, size: u64, stream: u64) -> Option<bool> {
        self.inner.would_serve_from_cache(size, stream)
    }
    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.with(backend, Origin::Unknown, |p, b| p.empty_cache(b))
    }
    fn allocated(&self) -> u64 {
        self.inner.allocated()
    }
    fn alloc_retries(&self) -> u64 {
        self.inner.alloc_retries()
    }
    fn start_fit(&self) -> Option<crate::backend::StartFit> {
        self.inner.start_fit()
    }
    fn assumed_gpu_memory(&self) -> Option<u64> {
        self.inner.assumed_gpu_memory()
    }
    fn planning_seconds(&self) -> Option<f64> {
        self.inner.planning_seconds()
    }
    fn segments(&self) -> Vec<Segment> {
        self.inner.segments()
    }
    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.check_invariants()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(map: &BTreeMap<u64, (u64, Origin)>) -> Vec<(u64, u64)> {
        map.iter().map(|(&a, &(b, _))| (a, b)).collect()
    }

    #[test]
    fn painting_cuts_what_it_overlaps_and_erasing_keeps_the_outside() {
        let mut m: BTreeMap<u64, (u64, Origin)> = BTreeMap::new();
        paint(&mut m, 0, 100, |e| (e, Origin::Event(1)));
        paint(&mut m, 40, 60, |e| (e, Origin::Event(2)));
        assert_eq!(ranges(&m), [(0, 40), (40, 60), (60, 100)]);
        assert_eq!(m[&60].1, Origin::Event(1));
        paint(&mut m, 30, 70, |e| (e, Origin::Event(3)));
        assert_eq!(ranges(&m), [(0, 30), (30, 70), (70, 100)]);
        erase(&mut m, 20, 80, |v| &mut v.0);
        assert_eq!(ranges(&m), [(0, 20), (80, 100)]);
        erase(&mut m, 0, 1000, |v| &mut v.0);
        assert!(m.is_empty());
    }

    #[test]
    fn the_last_free_into_a_hole_wins() {
        let events = [];
        let mut l = Layout::new(&events, &[]);
        l.placed(Allocation::new(0, 100), 90, Origin::Event(1));
        l.freed(0);
        l.placed(Allocation::new(0, 40), 40, Origin::Event(2));
        l.placed(Allocation::new(40, 20), 20, Origin::Event(3));
        l.freed(40);
        assert_eq!(l.last_freed_in(40, 100), Some(Origin::Event(3)));
        assert_eq!(l.last_freed_in(60, 100), Some(Origin::Event(1)), "its older part survives");
        assert_eq!(l.last_freed_in(100, 200), None);
        l.returned(0, 100);
        assert_eq!(l.last_freed_in(0, 100), None, "a returned segment forgets its frees");
    }
}
