//! What a replay follows of the recording beyond its requests and frees.
//!
//! The engine ([`super::engine`]) serves every request and free the same way in every run. What
//! differs between runs is what the recording's other events mean and what is done around each
//! request: a plain replay ([`Recorded`]) flushes the cache where the program called
//! `empty_cache()` and routes requests into the private pools the dump shows; `validate`'s guide
//! also steers a backend to the recorded addresses and compares every decision with the
//! recording. A guide is handed the policy and the backend at those moments, so that the one loop
//! runs both.

use super::input::ReplayInput;
use super::options::ReplayOptions;
use crate::backend::{Backend, Observed, Observer};
use crate::error::Result;
use crate::policy::Policy;
use crate::trace::exact::ExactAddress;
use crate::trace::lifetimes::Retried;
use crate::trace::pool_routes::PoolRoutes;
use crate::trace::{Action, Event};

/// How one replay follows its recording: the engine asks it at every event that is not a
/// request or a free, and around each request. `P` is the policy replayed, `B` the backend it
/// runs on (wrapped in the engine's observer, `O` in the methods).
pub trait Guide<P: Policy, B: Backend> {
    /// Whether blocks live before the trace that the policy's start state did not hold
    /// ([`Policy::start`]) are malloc'd before the first event (a guide that follows a
    /// recorded start state leaves them out, and finds their frees unheld).
    const MALLOCS_UNHELD_START: bool = true;

    /// Whether the replay starts from an empty cache (every block live before the trace
    /// malloc'd) rather than the policy's start state.
    fn starts_cold(&self, options: &ReplayOptions) -> bool;

    /// Before the policy serves the request of event `e` (an `alloc` or a recorded `oom`).
    fn before_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut P,
        backend: &mut Observed<B, O>,
    ) -> Result<()>;

    /// After the policy served the request of `e` at `placed` (`None`: it could not). A served
    /// recorded `oom` is freed by the engine after this.
    fn after_request<O: Observer>(
        &mut self,
        _index: u64,
        _e: &Event,
        _placed: Option<u64>,
        _policy: &mut P,
        _backend: &mut Observed<B, O>,
    ) -> Result<()> {
        Ok(())
    }

    /// At a recorded segment event (`segment_alloc/free/map/unmap`): true when the guide
    /// changed the policy's state (a flush), so the engine measures after it.
    fn segment_event<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut P,
        backend: &mut Observed<B, O>,
    ) -> Result<bool>;

    /// A free that finds no block the replay holds: its address was never allocated, or its
    /// alloc failed.
    fn unheld_free(&mut self, _index: u64, _e: &Event) {}

    /// What a run with this guide does, said when it is interrupted at event `index` of `count`
    /// (`replaying policy 'bfc' at event 65536 of 200000`).
    fn doing(name: &str, index: u64, count: u64) -> String {
        format!("replaying policy '{name}' at event {index} of {count}")
    }

    /// True once the guide has seen enough: every later event is passed over.
    fn stopped(&self) -> bool {
        false
    }
}

/// The guide of every replay of a recording: the program's `empty_cache()` calls that the
/// recording shows are made again, and requests made into a private pool (a CUDA graph's, a
/// `MemPool`'s) go to the policy's pool of the same identity.
pub struct Recorded<'r> {
    /// The recorded `empty_cache()` calls (the event indices that start them), sorted.
    calls: &'r [u64],
    /// The release runs that the recorded levels leave undecided.
    undecided: Undecided<'r>,
    /// The plan drops the recorded calls (`--no-recorded-empty-cache`).
    drop_recorded: bool,
    routes: Option<PoolRoutes>,
    /// The last event of the flush run the program called last (runs are consecutive releases).
    flush_run_to: u64,
    /// The recorded `oom` entries made while a graph capture was underway, sorted.
    captured_ooms: &'r [u64],
    /// The recording's exact-address allocations.
    exact: ExactPlacer<'r>,
}

impl<'r> Recorded<'r> {
    /// The guide for replaying `input` with `options`.
    pub(super) fn new(input: &'r ReplayInput, options: &ReplayOptions) -> Recorded<'r> {
        Recorded {
            calls: input.empty_cache_at(),
            undecided: Undecided::new(input),
            drop_recorded: options.empty_cache.drop_recorded,
            routes: input.pool_routes().cloned(),
            flush_run_to: u64::MAX - 1,
            captured_ooms: input.captured_ooms(),
            exact: ExactPlacer::new(input.exact_addresses()),
        }
    }
}

impl<P: Policy, B: Backend> Guide<P, B> for Recorded<'_> {
    /// A recorded run (`--export-snapshot`) starts cold, every block malloc'd, so that
    /// `validate` can replay it decision for decision from its own events.
    fn starts_cold(&self, options: &ReplayOptions) -> bool {
        options.record_events
    }

    #[inline(always)]
    fn before_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut P,
        backend: &mut Observed<B, O>,
    ) -> Result<()> {
        // A recorded `oom` that no release preceded, though the recorded cache held memory to
        // release, failed during a graph capture, which skips the release-everything fallback:
        // as `validate` reads it (until `after_request`).
        if e.action == Action::Oom && self.captured_ooms.binary_search(&index).is_ok() {
            policy.set_capture_underway(true);
        }
        if let Some(r) = &mut self.routes {
            route(policy, r, e)?;
        }
        if self.exact.any() {
            self.exact.before(index, e, policy);
        }
        // A release run the recording leaves undecided before this request: decided now, with
        // the request routed to its pool, as `validate` decides it.
        if !self.drop_recorded && self.undecided.called_before(index, &*policy) {
            policy.empty_cache(backend)?;
        }
        Ok(())
    }

    /// Ends the capture a recorded `oom` was read to have failed in.
    fn after_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        placed: Option<u64>,
        policy: &mut P,
        _backend: &mut Observed<B, O>,
    ) -> Result<()> {
        if self.exact.any() {
            self.exact.after(index, placed);
        }
        if e.action == Action::Oom {
            policy.set_capture_underway(false);
        }
        Ok(())
    }

    #[inline(always)]
    fn segment_event<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut P,
        backend: &mut Observed<B, O>,
    ) -> Result<bool> {
        let release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        if release && !self.drop_recorded && self.calls.binary_search(&index).is_ok() {
            if let Some(r) = &mut self.routes {
                follow(policy, r, e, true)?;
            }
            policy.empty_cache(backend)?;
            self.flush_run_to = index;
            return Ok(true);
        }
        let Some(r) = &mut self.routes else { return Ok(false) };
        if e.action == Action::SegmentMap {
            return Ok(false);
        }
        // A release later in a flush the program called: that call released the pool too
        // (PyTorch releases gone pools after the default ones).
        let in_call = release && self.flush_run_to + 1 == index;
        if in_call {
            self.flush_run_to = index;
        }
        if !follow(policy, r, e, in_call)? {
            return Ok(false);
        }
        policy.empty_cache(backend)?;
        Ok(true)
    }
}

/// Places a recording's exact-address allocations (`mallocWithAddress`,
/// [`crate::trace::exact`]) where recorded, for any guide. The address asked is found through
/// the block the program took it from ([`ExactAddress::source`]): where this run placed that
/// block, at the same distance into it; the prefix goes that far below it, as recorded, and the
/// request at the address. In `validate`, whose memory lies as the recording's, that is the
/// recorded address; in any other run it is where the address lies in the run's own memory.
/// Without a source (the address came from before the trace), the recorded addresses are
/// asked. A policy that cannot place a block there serves it as any request
/// ([`Policy::place_next_at`]).
#[derive(Clone, Debug)]
pub struct ExactPlacer<'r> {
    pairs: &'r [ExactAddress],
    /// The pairs' sources, sorted: (event index, pair).
    sources: Vec<(u64, usize)>,
    /// The first of `sources` not yet served.
    next_source: usize,
    /// Where this run placed each pair's source (`None`: not yet, or nowhere).
    source_at: Vec<Option<u64>>,
    /// The first pair whose request is not yet served.
    next: usize,
    /// Where this run placed that pair's prefix (`None`: not yet, or nowhere).
    prefix_at: Option<u64>,
}

impl<'r> ExactPlacer<'r> {
    /// The placer of `pairs` (in order of their prefixes).
    pub(crate) fn new(pairs: &'r [ExactAddress]) -> ExactPlacer<'r> {
        let mut sources: Vec<(u64, usize)> =
            pairs.iter().enumerate().filter_map(|(k, p)| Some((p.source?, k))).collect();
        sources.sort_unstable();
        ExactPlacer {
            pairs,
            sources,
            next_source: 0,
            source_at: vec![None; pairs.len()],
            next: 0,
            prefix_at: None,
        }
    }

    /// Whether the recording has any.
    #[inline(always)]
    pub(crate) fn any(&self) -> bool {
        !self.pairs.is_empty()
    }

    /// Whether event `index` is the `alloc` of a prefix or of a request placed by address.
    pub(crate) fn is_placed(&self, index: u64) -> bool {
        let k = self.pairs.partition_point(|p| p.alloc < index);
        self.pairs.get(k).is_some_and(|p| p.alloc == index || p.prefix == index)
    }

    /// Where this run holds the address pair `k` asks for, if its source was placed.
    fn asked_in_run(&self, k: usize) -> Option<u64> {
        let p = &self.pairs[k];
        self.source_at[k]?.checked_add(p.source_offset)
    }

    /// Before the request of event `index` (`e`): asks `policy` to place it, when it is part of
    /// an exact-address allocation.
    #[inline(never)]
    pub(crate) fn before<P: Policy>(&mut self, index: u64, e: &Event, policy: &mut P) {
        while self.pairs.get(self.next).is_some_and(|p| p.alloc < index) {
            self.next += 1;
            self.prefix_at = None;
        }
        let Some(p) = self.pairs.get(self.next) else { return };
        if e.action != Action::Alloc {
            return;
        }
        let asked = self.asked_in_run(self.next);
        if p.prefix == index {
            let at = match asked {
                Some(a) => a.checked_sub(p.offset),
                None => Some(e.addr),
            };
            if let Some(at) = at {
                policy.place_next_at(at);
            }
        } else if p.alloc == index {
            let at = asked.or_else(|| self.prefix_at.and_then(|a| a.checked_add(p.offset)));
            if let Some(at) = at {
                policy.place_next_at(at);
            }
        }
    }

    /// After the request of event `index` was served at `placed`.
    #[inline(never)]
    pub(crate) fn after(&mut self, index: u64, placed: Option<u64>) {
        while let Some(&(source, k)) = self.sources.get(self.next_source) {
            if source > index {
                break;
            }
            if source == index {
                self.source_at[k] = placed;
            }
            self.next_source += 1;
        }
        if self.pairs.get(self.next).is_some_and(|p| p.prefix == index) {
            self.prefix_at = placed;
        }
    }
}

/// Whether a run of recorded releases right before a request of `size` bytes on `stream` (the
/// request its `alloc` served, or the one its `oom` entry failed, less the recording
/// allocator's padding) was the program's `empty_cache()` call rather than that request's
/// out-of-memory fallback, where neither the releases' stacks nor the recorded levels tell
/// ([`ReplayInput::undecided_flushes`]): a call when `policy`, modelling the recorded allocator,
/// would serve the request from its cache now, since a fallback follows only a request the
/// cache could not serve. The one rule that decides such runs, asked by a replay
/// (the `Recorded` guide) and by `validate` at the same point: before the request the run precedes,
/// routed to its pool, after the frees completed between them. A run it calls a fallback where the real program called
/// `empty_cache()` (the device would have refused the request without it) records the same
/// events either way: the reading costs one counted retry, never memory.
pub(crate) fn undecided_run_is_call<P: Policy>(policy: &P, size: u64, stream: u64) -> bool {
    policy.would_serve_from_cache(size, stream) == Some(true)
}

/// The recording's undecided release runs ([`ReplayInput::undecided_flushes`]), asked about
/// in event order: by a replay (the `Recorded` guide) and by `validate`, so that both make
/// the same calls.
pub(crate) struct Undecided<'r> {
    runs: &'r [Retried],
    next: usize,
    /// The recording (a failed request's `oom` entry records more than was asked,
    /// [`ReplayInput::oom_request`]).
    input: &'r ReplayInput<'r>,
}

impl<'r> Undecided<'r> {
    /// The undecided runs of `input`, none asked yet.
    pub(crate) fn new(input: &'r ReplayInput<'r>) -> Undecided<'r> {
        Undecided { runs: input.undecided_flushes(), next: 0, input }
    }

    /// True when an undecided run ends right before the request at event `index` and was the
    /// program's `empty_cache()` ([`undecided_run_is_call`]).
    #[inline]
    pub(crate) fn called_before<P: Policy>(&mut self, index: u64, policy: &P) -> bool {
        while self.runs.get(self.next).is_some_and(|r| r.request < index) {
            self.next += 1;
        }
        match self.runs.get(self.next) {
            Some(r) if r.request == index => {
                let size = if r.failed { self.input.oom_request(r.size) } else { r.size };
                undecided_run_is_call(policy, size, r.stream)
            }
            _ => false,
        }
    }
}

/// Tells `policy` which pool the request of `e` was made into, and of the private pools the
/// releases before it showed gone ([`PoolRoutes::request`]). Out of line: only traces with
/// private pools take this path, and the replay loop stays as small without it.
#[inline(never)]
fn route<P: Policy>(policy: &mut P, routes: &mut PoolRoutes, e: &Event) -> Result<()> {
    let pool = routes.request(e, |gone| policy.release_pool(gone))?;
    policy.allocate_into(pool)
}

/// Follows the recorded segment event `e` in `routes` (in a flush the program `called`, or
/// not), and tells `policy` of a private pool that `e` shows gone; true then.
#[inline(never)]
fn follow<P: Policy>(
    policy: &mut P,
    routes: &mut PoolRoutes,
    e: &Event,
    called: bool,
) -> Result<bool> {
    routes.follow(e);
    match routes.released(e, called) {
        Some(pool) => policy.release_pool(pool).map(|()| true),
        None => Ok(false),
    }
}
