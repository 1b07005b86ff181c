//! Which recorded allocations were made into a private pool (a CUDA graph's, or a
//! `torch.cuda.MemPool`'s).
//!
//! PyTorch serves a malloc from a private pool while its stream is under graph capture or
//! inside `use_mem_pool`: the request searches only that pool's free blocks, and a segment it
//! needs joins the pool. The replay and `validate` hand the pool to the policy before the
//! malloc (`Policy::allocate_into`), as the request's stream is handed to it: a property of the
//! request, not of where any policy places it. Two sources say which pool it was:
//!
//! - **The entry itself**, where the file names each entry's pool (PyTorch ≈ 2.7+ writes
//!   `pool_id`, [`Trace::entry_pools`]): exact, failed requests (`oom`) and pools freed before
//!   the dump included.
//! - **Where it landed**, in older snapshots, which record no pool per allocation: their final
//!   `segments` say which private pool owns each segment (`segment_pool_id`), and every `alloc`
//!   records its address. An allocation whose recorded address lies in a segment that a private
//!   pool owns at the dump, while that segment is alive in the recording, was made into that
//!   pool: nothing else puts a block there. A failed request has no address to tell it by.
//!
//! Blocks live before the first event are routed by where they lie, either way.
//!
//! Where entries name their pools, a recorded `segment_free` (or `segment_unmap`) that names a
//! private pool usually says that the pool's graph or `MemPool` is gone: PyTorch's flushes
//! release a private pool's memory only once nothing uses it. The one release of a live private
//! pool is a request's own (`release_available_cached_blocks`, with `max_split_size_mb`, works
//! within the request's pool), so a release just before a request made into that pool does not
//! say it (`PoolRoutes::released`, `PoolRoutes::request`).
//!
//! A segment is alive from the start when its first segment event is not a `segment_alloc`
//! (the trace never created it), and then from each recorded `segment_alloc` of its address to
//! the next `segment_free`. A private pool freed before the dump leaves no segment to tell it
//! by: allocations made into it go to the default pools. A private pool's expandable pages are
//! routed by the dump's mapped ranges: a live pool never unmaps (only flushes and GC unmap, and
//! they skip a pool still in use), so its ranges at the dump hold every page it mapped in the
//! trace. Their `segment_map`s do not start at a range's address, so a range stays alive.

use crate::trace::lifetimes::Lifetimes;
pub use crate::trace::PoolId;
use crate::trace::{Action, Event, Trace};

/// One segment a private pool owns at the dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Route {
    start: u64,
    end: u64,
    pool: PoolId,
    /// Alive in the recording at the event the replay is at.
    alive: bool,
}

/// The private pools of one device: the pools its entries name, where the file names them,
/// and the private segments of the dump, by address; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolRoutes {
    routes: Vec<Route>,
    /// [`Trace::entry_pools`], where the file names them.
    named: Option<Vec<PoolId>>,
    /// The private pools releases showed gone ([`PoolRoutes::released`]).
    gone: Vec<PoolId>,
    /// Private pools released outside a flush the program called, before the next request:
    /// gone unless that request is made into them.
    pending: Vec<PoolId>,
    /// The private pool the last request routed to one went to ([`PoolRoutes::route`]).
    last_private: Option<PoolId>,
}

impl PoolRoutes {
    /// The routes of `device`, or `None` when neither its entries nor the dump name a private
    /// pool (every allocation then goes to the default pools, and the replay asks nothing per
    /// event). `events` and `lifetimes` are what the engine hands policies: the loaded events
    /// or a streamed replay's digest, which keeps each address's first segment event.
    pub(crate) fn new(
        trace: &Trace,
        device: i32,
        events: &[Event],
        lifetimes: &Lifetimes,
    ) -> Option<PoolRoutes> {
        let named = trace.entry_pools.clone();
        let mut routes: Vec<Route> = trace
            .segments_of(device)
            .filter_map(|s| {
                let pool = s.private_pool?;
                let end = s.address.checked_add(s.total_size)?;
                Some(Route { start: s.address, end, pool, alive: true })
            })
            .collect();
        if routes.is_empty() && named.as_ref().is_none_or(Vec::is_empty) {
            return None;
        }
        routes.sort_unstable_by_key(|r| r.start);
        // The dump's segments do not overlap; a malformed one that does is dropped, so lookups
        // stay a binary search.
        routes.dedup_by(|later, earlier| later.start < earlier.end);
        let mut routes =
            PoolRoutes { routes, named, gone: Vec::new(), pending: Vec::new(), last_private: None };
        let mut seen = vec![false; routes.routes.len()];
        for e in lifetimes.segment_events.iter().filter_map(|&i| events.get(i)) {
            if let Some(k) = routes.at_start(e.addr) {
                if !std::mem::replace(&mut seen[k], true) {
                    routes.routes[k].alive = e.action != Action::SegmentAlloc;
                }
            }
        }
        Some(routes)
    }

    /// The route that starts at `addr`, if any.
    fn at_start(&self, addr: u64) -> Option<usize> {
        self.routes.binary_search_by_key(&addr, |r| r.start).ok()
    }

    /// Follows a recorded segment event: a `segment_alloc` of a route's address makes it alive,
    /// a `segment_free` ends it. Other events change nothing.
    #[inline]
    pub(crate) fn follow(&mut self, e: &Event) {
        let alive = match e.action {
            Action::SegmentAlloc => true,
            Action::SegmentFree => false,
            _ => return,
        };
        if let Some(k) = self.at_start(e.addr) {
            self.routes[k].alive = alive;
        }
    }

    /// A recorded release `e` of a private pool's segment ([`PoolRoutes::released_by`]): in a
    /// flush the program called (`called`), the pool is gone, and it is returned the first time.
    /// Outside one, the release may be the next request's own, within its pool: that request
    /// decides ([`PoolRoutes::request`]).
    pub(crate) fn released(&mut self, e: &Event, called: bool) -> Option<PoolId> {
        let pool = self.released_by(e).filter(|p| !self.gone.contains(p))?;
        if !called {
            if !self.pending.contains(&pool) {
                self.pending.push(pool);
            }
            return None;
        }
        self.gone.push(pool);
        Some(pool)
    }

    /// The private pool the request `e` was made into ([`PoolRoutes::pool_for`]), after telling
    /// `gone` of each pool released just before it into which it was not made: its fallback
    /// released those as gone pools (a request releases only its own pool's live segments).
    pub(crate) fn request<E>(
        &mut self,
        e: &Event,
        mut gone: impl FnMut(PoolId) -> Result<(), E>,
    ) -> Result<Option<PoolId>, E> {
        let pool = self.route(e);
        for p in std::mem::take(&mut self.pending) {
            if Some(p) != pool && !self.gone.contains(&p) {
                self.gone.push(p);
                gone(p)?;
            }
        }
        Ok(pool)
    }

    /// The private pool the request `e` was made into, as [`PoolRoutes::pool_for`] tells it,
    /// kept as the last one routed where it is one.
    pub(crate) fn route(&mut self, e: &Event) -> Option<PoolId> {
        let pool = self.pool_for(e);
        if pool.is_some() {
            self.last_private = pool;
        }
        pool
    }

    /// For a request that failed (an `oom`) in a file that does not name pools, which has no
    /// address to route it by: the private pool it was made into, where the default pools
    /// could have served it from their cache (`served_by_default`), so the real allocator was
    /// not searching them. Taken to be the pool of the last request routed to one, else the
    /// dump's only private pool; `None` where neither exists or the default pools could not
    /// have served it.
    pub(crate) fn route_failed(
        &mut self,
        e: &Event,
        served_by_default: impl FnOnce() -> bool,
    ) -> Option<PoolId> {
        if e.action != Action::Oom || self.named.is_some() {
            return None;
        }
        let candidate = self.last_private.or_else(|| self.sole_pool())?;
        served_by_default().then(|| {
            self.last_private = Some(candidate);
            candidate
        })
    }

    #[cfg(test)]
    /// True when the entries name their pools: [`PoolRoutes::pool_for`] is then exact for
    /// every request, failed ones included.
    pub(crate) fn entries_name_pools(&self) -> bool {
        self.named.is_some()
    }

    /// The private pool the request of `e` (an `alloc` or an `oom`) was made into, or whose
    /// expandable pages a `segment_map` mapped; `None`: the default pools, or, for an `oom` of a
    /// file that does not name pools, not known. Without names, an `alloc` and a map go by
    /// where they lie at the dump (a live private pool never unmaps: only flushes and GC do, and
    /// they skip a pool still in use).
    #[inline]
    pub(crate) fn pool_for(&self, e: &Event) -> Option<PoolId> {
        match &self.named {
            Some(pools) => e.pool.private_in(pools),
            None if matches!(e.action, Action::Alloc | Action::SegmentMap) => self.pool_of(e.addr),
            None => None,
        }
    }

    /// The private pool whose segment or pages the recorded release `e` returned, where the
    /// entry names one: that pool is gone (PyTorch frees a private pool's memory only then).
    #[inline]
    pub(crate) fn released_by(&self, e: &Event) -> Option<PoolId> {
        match e.action {
            Action::SegmentFree | Action::SegmentUnmap => self.pool_for(e),
            _ => None,
        }
    }

    /// The private pool that owns every private segment of the dump, where there is one and
    /// only one.
    fn sole_pool(&self) -> Option<PoolId> {
        let first = self.routes.first()?.pool;
        self.routes.iter().all(|r| r.pool == first).then_some(first)
    }

    /// The private pool a block recorded at `addr` was allocated into, by where it lies now;
    /// `None`: the default pools.
    #[inline]
    pub(crate) fn pool_of(&self, addr: u64) -> Option<PoolId> {
        let k = self.routes.partition_point(|r| r.start <= addr).checked_sub(1)?;
        let r = &self.routes[k];
        (r.alive && addr < r.end).then_some(r.pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{BlockState, PoolKind, PoolRef, Segment};

    fn segment(address: u64, total_size: u64, private_pool: Option<PoolId>) -> Segment {
        Segment {
            device: 0,
            address,
            total_size,
            stream: 0,
            pool: PoolKind::Large,
            is_expandable: false,
            private_pool,
            blocks: vec![crate::trace::Block {
                address,
                size: total_size,
                requested_size: 0,
                state: BlockState::Inactive,
            }],
        }
    }

    #[test]
    fn a_failed_request_of_an_unnamed_file_goes_to_the_last_routed_or_the_only_pool() {
        let mb = 1u64 << 20;
        let (a, b) = (0x1000_0000, 0x2000_0000);
        let dump = |pools: [Option<PoolId>; 2]| Trace {
            segments: vec![segment(a, 20 * mb, pools[0]), segment(b, 20 * mb, pools[1])],
            ..Trace::default()
        };
        let oom = Event::new(Action::Oom, 0, 4 * mb, 0, 0);
        let alloc_in = |addr| Event::new(Action::Alloc, addr, mb, 0, 0);
        let lifetimes = crate::trace::lifetimes::scan(&[]);
        let routes = |t: &Trace| PoolRoutes::new(t, 0, &[], &lifetimes).expect("private pools");
        // One private pool in the dump: it, before any request was routed.
        let mut one = routes(&dump([Some((1, 0)), None]));
        assert_eq!(one.route_failed(&oom, || true), Some((1, 0)));
        assert_eq!(one.route_failed(&oom, || false), None, "the default pools would fail too");
        assert_eq!(one.route_failed(&alloc_in(b), || true), None, "an alloc has its address");
        // Two: none until a request is routed to one, then that one.
        let mut two = routes(&dump([Some((1, 0)), Some((2, 0))]));
        assert_eq!(two.route_failed(&oom, || true), None);
        assert_eq!(two.route(&alloc_in(b)), Some((2, 0)));
        assert_eq!(two.route(&alloc_in(0x3000_0000)), None, "the default pools");
        assert_eq!(two.route_failed(&oom, || true), Some((2, 0)), "the last one routed");
        // Where entries name their pools, an oom names its own.
        let mut named =
            routes(&Trace { entry_pools: Some(vec![(1, 0)]), ..dump([Some((1, 0)), None]) });
        assert_eq!(named.route_failed(&oom, || true), None);
    }

    #[test]
    fn a_segment_routes_while_the_recording_holds_it() {
        let mb = 1u64 << 20;
        let (a, b, c) = (0x1000_0000, 0x2000_0000, 0x3000_0000);
        let trace = Trace {
            segments: vec![
                segment(a, 20 * mb, Some((1, 0))),
                segment(b, 20 * mb, None),
                segment(c, 2 * mb, Some((1, 1))),
            ],
            ..Trace::default()
        };
        // `a` lived before the trace; `c` is freed, then allocated again (as the private
        // segment the dump shows).
        let events = vec![
            Event::new(Action::SegmentFree, c, 2 * mb, 0, 0),
            Event::new(Action::SegmentAlloc, c, 2 * mb, 0, 0),
        ];
        let lifetimes = crate::trace::lifetimes::scan(&events);
        let mut routes = PoolRoutes::new(&trace, 0, &events, &lifetimes).expect("private pools");
        assert_eq!(routes.pool_of(a), Some((1, 0)));
        assert_eq!(routes.pool_of(a + 20 * mb - 512), Some((1, 0)));
        assert_eq!(routes.pool_of(a + 20 * mb), None, "past its end");
        assert_eq!(routes.pool_of(b + 512), None, "a default pool's segment");
        assert_eq!(routes.pool_of(a - 1), None, "below every segment");
        assert_eq!(routes.pool_of(c), Some((1, 1)), "alive at the start: freed first");
        routes.follow(&events[0]);
        assert_eq!(routes.pool_of(c), None, "freed");
        routes.follow(&events[1]);
        assert_eq!(routes.pool_of(c + 512), Some((1, 1)), "allocated again");
        // A segment the trace allocates first did not exist at the start.
        let created = vec![Event::new(Action::SegmentAlloc, a, 20 * mb, 0, 0)];
        let lifetimes = crate::trace::lifetimes::scan(&created);
        let mut routes = PoolRoutes::new(&trace, 0, &created, &lifetimes).unwrap();
        assert_eq!(routes.pool_of(a), None);
        routes.follow(&created[0]);
        assert_eq!(routes.pool_of(a), Some((1, 0)));
    }

    #[test]
    fn entries_that_name_their_pool_route_by_it_failed_requests_too() {
        let mb = 1u64 << 20;
        let a = 0x1000_0000;
        let trace = Trace {
            // The dump says `a` is the graph's; the entries say otherwise, and they win.
            segments: vec![segment(a, 20 * mb, Some((1, 0)))],
            entry_pools: Some(vec![(0, 5), (2, 0)]),
            ..Trace::default()
        };
        let lifetimes = crate::trace::lifetimes::scan(&[]);
        let routes = PoolRoutes::new(&trace, 0, &[], &lifetimes).unwrap();
        assert!(routes.entries_name_pools());
        let named = |action, addr, pool| Event {
            pool: PoolRef(pool),
            ..Event::new(action, addr, 512, 0, 0)
        };
        assert_eq!(routes.pool_for(&named(Action::Alloc, a, 0)), None, "named default");
        assert_eq!(routes.pool_for(&named(Action::Alloc, 0x9000_0000, 2)), Some((2, 0)));
        assert_eq!(routes.pool_for(&named(Action::Oom, 1 << 30, 1)), Some((0, 5)));
        assert_eq!(routes.pool_for(&named(Action::Alloc, a, 9)), None, "a pool not listed");
        // A release that names a private pool; an alloc is none.
        assert_eq!(routes.released_by(&named(Action::SegmentFree, a, 2)), Some((2, 0)));
        assert_eq!(routes.released_by(&named(Action::SegmentFree, a, 0)), None);
        assert_eq!(routes.released_by(&named(Action::Alloc, a, 2)), None);
        // In a flush the program called, it says the pool is gone, once.
        let mut r = routes.clone();
        assert_eq!(r.released(&named(Action::SegmentFree, a, 2), true), Some((2, 0)));
        assert_eq!(r.released(&named(Action::SegmentFree, a, 2), true), None, "told once");
        // Before a request made into that pool, it is the request's own release: not gone.
        let mut r = routes.clone();
        let mut gone = Vec::new();
        assert_eq!(r.released(&named(Action::SegmentFree, a, 2), false), None);
        let into = r.request(&named(Action::Alloc, a, 2), |p| {
            gone.push(p);
            Ok::<_, ()>(())
        });
        assert_eq!((into, gone.as_slice()), (Ok(Some((2, 0))), &[][..]));
        // Before a request made elsewhere, it is a gone pool's.
        assert_eq!(r.released(&named(Action::SegmentFree, a, 1), false), None);
        let into = r.request(&named(Action::Oom, a, 0), |p| {
            gone.push(p);
            Ok::<_, ()>(())
        });
        assert_eq!((into, gone.as_slice()), (Ok(None), &[(0, 5)][..]));
        // Blocks live at the start still go by where they lie.
        assert_eq!(routes.pool_of(a), Some((1, 0)));
        // Without names: by address for an alloc, unknown for a failed request.
        let unnamed = Trace { entry_pools: None, ..trace.clone() };
        let routes = PoolRoutes::new(&unnamed, 0, &[], &lifetimes).unwrap();
        assert_eq!(routes.pool_for(&named(Action::Alloc, a, 0)), Some((1, 0)));
        assert_eq!(routes.pool_for(&named(Action::Oom, a, 1)), None);
        // Entries that name only the default pools, and a dump without private segments: none.
        let plain = Trace { entry_pools: Some(vec![]), segments: vec![], ..trace };
        assert_eq!(PoolRoutes::new(&plain, 0, &[], &lifetimes), None);
    }

    #[test]
    fn no_private_pool_means_no_routes() {
        let trace =
            Trace { segments: vec![segment(0x1000_0000, 2 << 20, None)], ..Trace::default() };
        let lifetimes = crate::trace::lifetimes::scan(&[]);
        assert_eq!(PoolRoutes::new(&trace, 0, &[], &lifetimes), None);
        // Nor when the private segments are another device's.
        let mut other = segment(0x1000_0000, 2 << 20, Some((3, 0)));
        other.device = 1;
        let trace = Trace { segments: vec![other], ..Trace::default() };
        assert_eq!(PoolRoutes::new(&trace, 0, &[], &lifetimes), None);
    }
}
