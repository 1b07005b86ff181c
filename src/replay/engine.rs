//! The one replay loop: every event of one device, in order, through one policy on one backend.

use super::blocks::{Blocks, Freed, Indexed, Keyed};
use super::guide::{Guide, Recorded};
use super::input::{ReplayInput, Source};
use super::meter::{Meter, Metered};
use super::options::{BackendKind, ReplayOptions};
use crate::backend::{Backend, Observed, SimDevice};
use crate::error::Cancel;
use crate::error::{Error, Result};
use crate::metrics::{OomDetail, PeakDetail, PolicyResult, Series};
use crate::policy::{Allocation, Handle, Policy};
use crate::trace::{Action, Event, PoolRef, Segment};
use std::time::Instant;

/// Everything one policy's replay produced.
#[derive(Clone, Debug, Default)]
pub struct ReplayOutput {
    /// The JSON-contract numbers.
    pub result: PolicyResult,
    /// More about the peak and the input's anomalies.
    pub detail: PeakDetail,
    /// Memory over time, if asked for.
    pub series: Option<Series>,
    /// The simulated run as events (policy addresses), if asked for.
    pub events: Option<Vec<Event>>,
    /// With [`ReplayOutput::events`]: where each part of them came from, as (origin, index in
    /// `events` of its first event), in order. The events from one origin's index up to the next
    /// one's are what the policy did for it (an input event's `alloc`, its free pair, the
    /// segments obtained or released meanwhile); events before the first are none's.
    pub log_origins: Option<Vec<(LogOrigin, usize)>>,
    /// The policy's segments when the replay ended (or stopped).
    pub segments: Vec<Segment>,
}

/// What a part of a simulated run's log was recorded for ([`ReplayOutput::log_origins`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogOrigin {
    /// A block live at the first event, which the recording knows by this address.
    Start {
        /// The recorded address.
        addr: u64,
    },
    /// The input's event of this index (on the replayed device).
    Event(u64),
}

/// Replays `input` through `policy` on the backend `options` names.
pub fn run_policy<P: Policy>(
    name: &str,
    policy: P,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    match options.backend {
        BackendKind::Sim => {
            let device = SimDevice::new(options.capacity).with_outside_usage(options.outside_bytes);
            run(name, policy, device, input, options)
        }
        BackendKind::Cuda => run_on_cuda(name, policy, input, options),
    }
}

/// Replays on a real GPU: checks the trace's `bound` peak fits in the device's free memory, then
/// runs the same loop on a [`CudaDevice`](crate::backend::cuda::CudaDevice) and adds what the
/// driver measured to the result.
#[cfg(feature = "cuda")]
fn run_on_cuda<P: Policy>(
    name: &str,
    policy: P,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    let needed = bound_peak(input)?;
    let device = crate::backend::cuda::CudaDevice::open(options.cuda_ordinal, cuda_cap(options))?
        .with_touch(options.touch);
    device.ensure_room(needed)?;
    let measures = device.measures();
    let mut output = run(name, policy, device, input, options)?;
    output.result.cuda = Some(measures.summary());
    Ok(output)
}

/// Without the `cuda` feature there is no device to replay on: a backend error (exit 3) saying
/// how to get one.
#[cfg(not(feature = "cuda"))]
fn run_on_cuda<P: Policy>(
    _name: &str,
    _policy: P,
    _input: &ReplayInput,
    _options: &ReplayOptions,
) -> Result<ReplayOutput> {
    Err(crate::Error::backend(
        "this fragsim was built without the `cuda` feature, so it cannot replay on a GPU: rebuild with `--features cuda`"
            .to_string(),
    ))
}

#[cfg(feature = "cuda")]
/// The trace's `bound` peak (live requested bytes at their highest): what any policy needs at
/// least, checked against a real GPU's free memory before the first allocation.
fn bound_peak(input: &ReplayInput) -> Result<u64> {
    let bound = crate::policy::bound::Bound::default();
    Ok(run_policy("bound", bound, input, &ReplayOptions::default())?.result.peak_reserved_bytes)
}

#[cfg(feature = "cuda")]
/// The cap on the CUDA backend's memory: `--capacity` less what is counted as used outside the
/// allocator, so a big GPU can stand in for a smaller one.
fn cuda_cap(options: &ReplayOptions) -> Option<u64> {
    options.capacity.map(|c| c.saturating_sub(options.outside_bytes))
}

/// Records the policy's allocation at `addr` for `at` in the simulated run's log, if kept
/// (`logging`: it is, which the engine knows at no cost in a plain replay).
#[inline(always)]
fn log_alloc(logging: bool, log: &mut Option<Vec<Event>>, addr: u64, at: &Event) {
    if !logging {
        return;
    }
    if let Some(log) = log {
        let mut e = Event::new(Action::Alloc, addr, at.size, at.stream, at.time_us);
        e.pool = at.pool;
        log.push(e);
    }
}

/// Records a free of the policy's block at `addr` in the simulated run's log, if kept (as
/// [`log_alloc`]).
#[inline(always)]
fn log_free(logging: bool, log: &mut Option<Vec<Event>>, addr: u64, request: u64, at: &Event) {
    if !logging {
        return;
    }
    if let Some(log) = log {
        for action in [Action::FreeRequested, Action::FreeCompleted] {
            let mut e = Event::new(action, addr, request, at.stream, at.time_us);
            e.pool = at.pool;
            log.push(e);
        }
    }
}

/// The pool of the block live at the start at recorded address `addr`, as the trace's entries
/// number pools ([`crate::trace::PoolRef`]): the pool its address lies in, where it lies in one.
fn start_pool(input: &ReplayInput, addr: u64) -> PoolRef {
    let pools = input.trace().entry_pools.as_deref().unwrap_or_default();
    let pool = input.pool_routes().and_then(|r| r.pool_of(addr));
    let at = pool.and_then(|p| pools.iter().position(|&q| q == p));
    at.map_or(PoolRef::DEFAULT, |i| PoolRef(i as u16 + 1))
}

/// [`Policy::malloc`] out of line, for the engine's rare calls (blocks live at the start, a
/// recorded `oom`). A policy's malloc may be inlined into the loop's one call for an alloc
/// event; inlined at every call, it made the loop so large that its state went to memory, and
/// `pytorch` ran 25% more instructions.
#[inline(never)]
fn malloc_cold<P: Policy, B: Backend>(
    policy: &mut P,
    backend: &mut B,
    size: u64,
    stream: u64,
) -> Result<Option<Allocation>> {
    policy.malloc(backend, size, stream)
}

/// [`Policy::free_handle`] out of line, for the engine's rare calls (a displaced block, the
/// free of a recorded `oom`'s request), as [`malloc_cold`].
#[inline(never)]
fn free_cold<P: Policy, B: Backend>(
    policy: &mut P,
    backend: &mut B,
    addr: u64,
    handle: Handle,
) -> Result<()> {
    policy.free_handle(backend, addr, handle)
}

/// The generic engine; see the module docs. Loaded events follow [`ReplayInput`]'s slots,
/// streamed ones a map of the live blocks.
fn run<P: Policy, B: Backend>(
    name: &str,
    policy: P,
    backend: B,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    let guide = &mut Recorded::new(input, options);
    let engine = Run { name, input, options };
    match input.source() {
        Source::Streamed(_) if is_plain(input, options) => {
            drive::<_, _, _, _, true>(engine, policy, backend, guide, Keyed::new(input))
        }
        Source::Streamed(_) => {
            drive::<_, _, _, _, false>(engine, policy, backend, guide, Keyed::new(input))
        }
        Source::Loaded { events, slots } if is_plain(input, options) => {
            drive::<_, _, _, _, true>(engine, policy, backend, guide, Indexed::new(events, slots))
        }
        Source::Loaded { events, slots } => {
            drive::<_, _, _, _, false>(engine, policy, backend, guide, Indexed::new(events, slots))
        }
    }
}

/// Replays `input` through `policy` on `backend`, following the recording as `guide` says
/// (where [`run_policy`] follows it as every replay does, [`Recorded`]): `validate`'s run.
pub(crate) fn run_guided<P: Policy, B: Backend, G: Guide<P, B>>(
    name: &str,
    policy: P,
    backend: B,
    guide: &mut G,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    let engine = Run { name, input, options };
    match input.source() {
        Source::Streamed(_) => {
            drive::<_, _, _, _, false>(engine, policy, backend, guide, Keyed::new(input))
        }
        Source::Loaded { events, slots } => {
            drive::<_, _, _, _, false>(engine, policy, backend, guide, Indexed::new(events, slots))
        }
    }
}

/// What every run of the engine is given besides its policy, backend, guide and block lookup.
#[derive(Clone, Copy)]
struct Run<'r, 'a> {
    name: &'r str,
    input: &'r ReplayInput<'a>,
    options: &'r ReplayOptions,
}

/// True when a replay is plain: no log of the simulated run, no series, no invariant checks,
/// no `empty_cache()` calls added, no private pools to route, no release run the recording
/// leaves undecided (decided before its request, [`super::guide::undecided_run_is_call`]), no
/// exact-address allocation to place where recorded (`mallocWithAddress`).
/// Such a replay (`replay`, `fit`,
/// `sweep`, `check`: nearly every one) runs the engine built with `PLAIN`, where each of those
/// tests is the constant `false` and leaves the loop: about 15 instructions an event.
pub(super) fn is_plain(input: &ReplayInput, options: &ReplayOptions) -> bool {
    let adds_calls =
        options.empty_cache.every.is_some_and(|n| n > 0) || !options.empty_cache.at.is_empty();
    !options.record_events
        && !options.keep_series
        && !options.check_invariants
        && !adds_calls
        && input.pool_routes().is_none()
        && input.undecided_flushes().is_empty()
        && input.exact_addresses().is_empty()
        && input.released_before().is_empty()
}

/// [`run`] with the block lookup `blocks`; `PLAIN`: the replay [`is_plain`]. Never inlined:
/// inlined into `run`, its builds were merged back into one loop that tests a flag again.
#[inline(never)]
fn drive<P: Policy, B: Backend, K: Blocks, G: Guide<P, B>, const PLAIN: bool>(
    run: Run,
    policy: P,
    backend: B,
    guide: &mut G,
    mut blocks: K,
) -> Result<ReplayOutput> {
    let Run { name, input, options } = run;
    let started = Instant::now();
    // A sweep of many short replays stops between them too.
    let count = input.event_count();
    // Copied into the walk and into its closure (it holds only references and a number).
    let stop_if_cancelled = |index: u64| options.cancel.check(|| G::doing(name, index, count));
    stop_if_cancelled(0)?;
    let mut d = Driver::new(run, policy, backend)?;
    d.start(guide, &mut blocks)?;
    let last = match options.stop_after {
        _ if options.stop_before_first => 0,
        Some(s) => s.saturating_add(1).min(count),
        None => count,
    };
    let mut added_calls = options.empty_cache.added_calls();
    // Where a profiler trace's reserve fell, the program released its cache: it does so again.
    let mut released_before = match options.empty_cache.drop_recorded {
        true => &[][..],
        false => input.released_before(),
    };
    // Read once: the policy's calls go through `backend` and could change what it points to, so
    // the compiler would otherwise reload these on every event.
    let logging = !PLAIN && d.backend.observer.log.is_some();
    let check = !PLAIN && options.check_invariants;
    let frees_at = input.frees_at();
    K::walk(blocks.source(), last, !PLAIN, stop_if_cancelled, |index, e, slot| {
        if K::HANDS_EVERY_EVENT && index % Cancel::EVERY as u64 == 0 {
            stop_if_cancelled(index)?;
        }
        if !PLAIN && guide.stopped() {
            return Ok(());
        }
        // A policy's input error names the event it was replaying (a backend error names the
        // driver call instead, as docs/interface.md promises).
        let at = |err: Error| match err.kind() {
            crate::error::ErrorKind::Backend => err,
            _ => err.at(crate::error::Place::Event(index)),
        };
        if logging {
            // What the backend calls this event makes are logged with.
            d.backend.observer.now = e.time_us;
            d.backend.observer.stream = e.stream;
            d.backend.observer.pool = e.pool;
            d.backend.observer.origin(LogOrigin::Event(index));
        }
        if !PLAIN && released_before.first() == Some(&index) {
            released_before = &released_before[1..];
            d.policy.empty_cache(&mut d.backend).map_err(at)?;
            let (reserved, allocated) = (d.backend.reserved(), d.policy.allocated());
            d.meter.observe(index, e.time_us, reserved, allocated);
        }
        // `None`: nothing to measure; else what to measure after the event ([`Step`]).
        let step = match e.action {
            // Zero-byte requests never reach the allocator: docs/pytorch-model.md#zero-byte.
            Action::Alloc if e.size == 0 => None,
            Action::Alloc => {
                d.alloc::<K, G, PLAIN>(index, e, slot, &mut blocks, guide, logging).map_err(at)?;
                Some(Step::Request)
            }
            Action::Oom if e.size > 0 => {
                d.recorded_oom(index, e, guide, logging).map_err(at)?;
                Some(Step::Request)
            }
            a if a == frees_at => {
                d.free(index, e, slot, &mut blocks, guide, logging, check).map_err(at)?
            }
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => {
                let changed = guide.segment_event(index, e, &mut d.policy, &mut d.backend);
                changed.map_err(at)?.then_some(Step::Request)
            }
            _ => None,
        };
        if let Some(step) = step {
            d.measure::<PLAIN>(index, e, step, check)?;
        }
        if !PLAIN && added_calls.after(index) {
            d.policy.empty_cache(&mut d.backend).map_err(at)?;
            d.meter.detail.empty_cache_calls += 1;
            let (reserved, allocated) = (d.backend.reserved(), d.policy.allocated());
            d.meter.observe(index, e.time_us, reserved, allocated);
        }
        Ok(())
    })?;
    Ok(d.finish(started))
}

/// What the engine measures after an event it replayed.
#[derive(Clone, Copy)]
enum Step {
    /// A request, or a change the guide made: any level may reach a new peak.
    Request,
    /// A free, with the policy's allocated bytes before it (read only when invariants are
    /// checked): a free lowers allocated and requested bytes, so only reserved bytes can reach a
    /// new peak.
    Free(u64),
}

/// One replay under way: its policy, the backend observed by the meter, and what was measured.
struct Driver<'r, 'a, P, B> {
    run: Run<'r, 'a>,
    policy: P,
    backend: Observed<B, Metered>,
    meter: Meter,
    /// The first request the policy could not serve.
    first_oom: Option<OomDetail>,
}

impl<'r, 'a, P: Policy, B: Backend> Driver<'r, 'a, P, B> {
    /// `policy` on `backend`, prepared for the run: the planner handed the events, the meter set.
    fn new(run: Run<'r, 'a>, mut policy: P, backend: B) -> Result<Self> {
        let Run { input, options, .. } = run;
        let observer = Metered {
            mallocs: 0,
            frees: 0,
            maps: 0,
            unmaps: 0,
            log: options.record_events.then(Vec::new),
            origins: Vec::new(),
            now: 0,
            stream: 0,
            pool: PoolRef::DEFAULT,
        };
        // Only a planner uses the events up front, and it is always handed loaded ones
        // ([`PolicyInfo::run`](crate::policy::PolicyInfo::run)).
        policy.prepare(input.loaded_events().unwrap_or_default())?;
        let meter = Meter {
            requested: 0,
            peak_reserved: 0,
            peak_allocated: 0,
            peak_requested: 0,
            detail: PeakDetail { events: input.event_count(), ..PeakDetail::default() },
            series: options.keep_series.then(|| Series::with_budget(options.series_budget)),
            last: (u64::MAX, 0, 0),
            moments: Default::default(),
        };
        let backend = Observed { inner: backend, observer };
        Ok(Driver { run, policy, backend, meter, first_oom: None })
    }

    /// Places the blocks live before the first event, which every policy must carry: in the
    /// policy's start state, or (a cold start, or blocks the start state did not hold) malloc'd.
    fn start<K: Blocks, G: Guide<P, B>>(&mut self, guide: &G, blocks: &mut K) -> Result<()> {
        let Run { input, options, .. } = self.run;
        let cold = guide.starts_cold(options);
        let start_time = input.first_time_us();
        self.backend.observer.now = start_time;
        let installed = if cold {
            vec![None; input.live_at_start().len()]
        } else {
            let installed = self.policy.start(&mut self.backend, input.live_at_start())?;
            // The log is of the run from the state installed: it holds no call that installed it.
            if let Some(log) = &mut self.backend.observer.log {
                log.clear();
                self.backend.observer.origins.clear();
            }
            installed
        };
        // A guide that follows a recorded start state leaves out the blocks it did not hold.
        let leaves_unheld = !cold && !G::MALLOCS_UNHELD_START;
        let logging = self.backend.observer.log.is_some();
        for (k, b) in input.live_at_start().iter().enumerate() {
            self.backend.observer.now = start_time;
            self.backend.observer.stream = b.stream;
            if logging {
                self.backend.observer.pool = start_pool(input, b.addr);
                self.backend.observer.origin(LogOrigin::Start { addr: b.addr });
            }
            let placed = match installed.get(k).copied().flatten() {
                Some(a) => Some(a),
                None if leaves_unheld => None,
                None => {
                    if let Some(r) = input.pool_routes() {
                        self.policy.allocate_into(r.pool_of(b.addr))?;
                    }
                    malloc_cold(&mut self.policy, &mut self.backend, b.size.max(1), b.stream)?
                }
            };
            blocks.started(k, b, placed);
            match placed {
                Some(a) => {
                    self.meter.requested += b.size;
                    let pool = self.backend.observer.pool;
                    if let Some(log) = self.backend.observer.log.as_mut().filter(|_| cold) {
                        let mut e = Event::new(Action::Alloc, a.addr, b.size, b.stream, start_time);
                        e.pool = pool;
                        log.push(e);
                    }
                    self.meter.detail.live_at_start += 1;
                }
                None if leaves_unheld => {}
                None => self.count_oom(0, b.size, b.stream, None),
            }
        }
        let levels = (!input.live_at_start().is_empty())
            .then(|| (self.backend.reserved(), self.policy.allocated()));
        let reserved = self.backend.reserved();
        self.meter.observe_start(&self.backend.observer, start_time, levels, reserved);
        Ok(())
    }

    /// Serves the request of alloc event `e`: first frees a block the recording displaced (its
    /// address reused though its free was not recorded), then asks the guide, then the policy.
    #[inline(always)]
    fn alloc<K: Blocks, G: Guide<P, B>, const PLAIN: bool>(
        &mut self,
        index: u64,
        e: &Event,
        slot: u32,
        blocks: &mut K,
        guide: &mut G,
        logging: bool,
    ) -> Result<()> {
        if let Some(b) = blocks.displaced(slot, e) {
            self.meter.requested -= b.request;
            log_free(logging, &mut self.backend.observer.log, b.addr, b.request, e);
            free_cold(&mut self.policy, &mut self.backend, b.addr, b.handle)?;
        }
        // (A plain replay routes no request: the guide is not asked.)
        if !PLAIN {
            guide.before_request(index, e, &mut self.policy, &mut self.backend)?;
        }
        let placed = self.policy.malloc(&mut self.backend, e.size, e.stream)?;
        match placed {
            Some(a) => {
                blocks.allocated(slot, e, a);
                self.meter.requested += e.size;
                log_alloc(logging, &mut self.backend.observer.log, a.addr, e);
            }
            None => {
                blocks.failed(slot, e);
                self.count_oom(index, e.size, e.stream, Some(e));
            }
        }
        if !PLAIN {
            let addr = placed.map(|a| a.addr);
            guide.after_request(index, e, addr, &mut self.policy, &mut self.backend)?;
        }
        Ok(())
    }

    /// A request the recorded allocator could not serve (`size` is its rounded size): it is
    /// part of what the program asked for, so every policy tries it too. One that fails counts
    /// as an OOM here, as it did in the recording; one that is served is freed at once, since
    /// the program went on without it. Routed as any request: to the pool it names, or the
    /// default pools.
    fn recorded_oom<G: Guide<P, B>>(
        &mut self,
        index: u64,
        e: &Event,
        guide: &mut G,
        logging: bool,
    ) -> Result<()> {
        guide.before_request(index, e, &mut self.policy, &mut self.backend)?;
        let request = self.run.input.oom_request(e.size);
        let placed = malloc_cold(&mut self.policy, &mut self.backend, request, e.stream)?;
        let addr = placed.map(|a| a.addr);
        guide.after_request(index, e, addr, &mut self.policy, &mut self.backend)?;
        match placed {
            Some(a) => {
                log_alloc(logging, &mut self.backend.observer.log, a.addr, e);
                log_free(logging, &mut self.backend.observer.log, a.addr, e.size, e);
                free_cold(&mut self.policy, &mut self.backend, a.addr, a.handle)
            }
            None => {
                self.count_oom(index, e.size, e.stream, Some(e));
                Ok(())
            }
        }
    }

    /// Frees the block of free event `e`; `None` where the replay holds none (its address was
    /// never allocated, or its alloc failed under `--capacity`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn free<K: Blocks, G: Guide<P, B>>(
        &mut self,
        index: u64,
        e: &Event,
        slot: u32,
        blocks: &mut K,
        guide: &mut G,
        logging: bool,
        check: bool,
    ) -> Result<Option<Step>> {
        let b = match blocks.freed(slot, e) {
            Freed::Block(b) => b,
            unheld => {
                if matches!(unheld, Freed::Orphan) {
                    self.meter.detail.orphan_frees += 1;
                }
                guide.unheld_free(index, e);
                return Ok(None);
            }
        };
        self.meter.requested -= b.request;
        log_free(logging, &mut self.backend.observer.log, b.addr, b.request, e);
        let before = if check { self.policy.allocated() } else { u64::MAX };
        self.policy.free_handle(&mut self.backend, b.addr, b.handle)?;
        Ok(Some(Step::Free(before)))
    }

    /// Measures the levels after event `e`, and checks the policy's invariants when asked.
    #[inline(always)]
    fn measure<const PLAIN: bool>(
        &mut self,
        index: u64,
        e: &Event,
        step: Step,
        check: bool,
    ) -> Result<()> {
        let (reserved, allocated) = (self.backend.reserved(), self.policy.allocated());
        match step {
            Step::Request => self.meter.peaks(index, e.time_us, reserved, allocated),
            Step::Free(before) => {
                self.meter.reserved_peak(index, e.time_us, reserved, allocated);
                if check && allocated > before {
                    return Err(self.broke(
                        index,
                        format!("a free raised its allocated bytes from {before} to {allocated}"),
                    ));
                }
            }
        }
        if !PLAIN {
            self.meter.sample(index, e.time_us, reserved, allocated);
        }
        if check {
            self.policy.check_invariants().map_err(|m| self.broke(index, m))?;
        }
        Ok(())
    }

    /// The error of a policy that broke an invariant at event `index`.
    #[cold]
    fn broke(&self, index: u64, what: String) -> Error {
        let name = self.run.name;
        Error::input(format!("policy '{name}' broke an invariant: {what}"))
            .at(crate::error::Place::Event(index))
    }

    /// Counts a request of `size` bytes on `stream` that the policy could not serve (at event
    /// `index`, `e`; a block live at the start has none), keeps the first such moment as
    /// PyTorch's OOM message describes it, and logs the `oom`, if the log is kept.
    fn count_oom(&mut self, index: u64, size: u64, stream: u64, e: Option<&Event>) {
        self.meter.detail.oom_count += 1;
        if self.first_oom.is_none() {
            self.first_oom = Some(self.oom_detail(index, size, stream, e));
        }
        if let (Some(log), Some(e)) = (&mut self.backend.observer.log, e) {
            log.push(Event::new(Action::Oom, 0, e.size, e.stream, e.time_us));
        }
    }

    /// What PyTorch's OOM message says about the moment a request failed.
    #[cold]
    fn oom_detail(&self, event: u64, size: u64, stream: u64, e: Option<&Event>) -> OomDetail {
        let Run { input, options, .. } = self.run;
        let reserved = self.backend.reserved();
        // The user's frames first, as memory_viz filters them.
        let stack = crate::trace::sites::display(
            e.map(|e| input.trace().frames.get(e.frames)).unwrap_or_default(),
        );
        OomDetail {
            event,
            size,
            stream,
            capacity_bytes: options.capacity,
            reserved_bytes: reserved,
            allocated_bytes: self.policy.allocated(),
            free_bytes: options
                .capacity
                .map(|c| c.saturating_sub(options.outside_bytes).saturating_sub(reserved)),
            stack,
            before_first_event: e.is_none(),
        }
    }

    /// The replay's result, from what was measured and the policy's state at the end.
    fn finish(self, started: Instant) -> ReplayOutput {
        let Driver { run, policy, backend, meter, first_oom } = self;
        let options = run.options;
        let fragmentation_at_peak = if meter.peak_reserved == 0 {
            0.0
        } else {
            1.0 - meter.detail.allocated_at_peak_bytes as f64 / meter.peak_reserved as f64
        };
        let cap = options.capacity.map(|c| c.saturating_sub(options.outside_bytes));
        let mut result = PolicyResult {
            policy: run.name.to_string(),
            config: policy.config(),
            peak_reserved_bytes: meter.peak_reserved,
            peak_allocated_bytes: meter.peak_allocated,
            peak_requested_bytes: meter.peak_requested,
            reserved_at_end_bytes: backend.reserved(),
            fragmentation_at_peak,
            peak_event: meter.detail.peak_reserved_event,
            device_malloc_count: backend.observer.mallocs,
            device_free_count: backend.observer.frees,
            map_count: backend.observer.maps,
            unmap_count: backend.observer.unmaps,
            alloc_retries: policy.alloc_retries(),
            oom: first_oom.is_some(),
            first_oom_event: first_oom.as_ref().map(|d| d.event),
            replay_seconds: started.elapsed().as_secs_f64(),
            planning_seconds: policy.planning_seconds(),
            first_oom,
            start_state: policy.start_fit().map(|f| f.bound_by(cap)),
            start_assumed: policy.assumed_start(),
            gpu_memory_bytes: policy.assumed_gpu_memory(),
            capacity_bytes: options.capacity,
            ..PolicyResult::default()
        };
        meter.moments.fill(&mut result);
        ReplayOutput {
            result,
            detail: meter.detail,
            series: meter.series,
            log_origins: backend.observer.log.is_some().then_some(backend.observer.origins),
            events: backend.observer.log,
            segments: policy.segments(),
        }
    }
}
