//! The replay engine: one device's events, in order, through one policy, measured as it goes.
//!
//! Data flows one way: a [`Trace`] is read, [`ReplayInput`] picks a device and finds the blocks
//! live before the first event, [`run_policy`] drives every event through a [`Policy`] on a
//! backend, and the [`ReplayOutput`] carries the measurements ([`PolicyResult`], [`PeakDetail`], a
//! [`Series`]) to the report writers. [`run_specs`] replays a set of policy specs on one input
//! (in parallel, sorted as `replay`'s table) for every command that compares policies.
//!
//! The events come from memory ([`ReplayInput::new`]) or stream from a version 3 `.fst` file
//! ([`ReplayInput::streamed`]), the same engine consuming them in order either way. Loaded
//! events are given slots once (each block a small index, shared by its alloc and its free) so
//! every policy's replay follows indices into a table as long as the most blocks live at once,
//! instead of hashing addresses. Streamed events are never all held: two pre-passes over
//! the file find where frees take effect, the recorded `empty_cache()` calls (as sorted indices)
//! and the few events that decide the blocks live at the start ([`digest`]), in memory that
//! follows the live blocks; each policy's replay then reads the file again and finds a free's
//! block in a map of the recording's live blocks (recorded address → the policy's address and
//! the request size). The results are the same number for number. `offline`, which plans with
//! every lifetime, loads a streamed input's events for its own replay.
//!
//! Semantics, following the PyTorch allocator (docs/pytorch-model.md#free-and-merge): an `alloc`
//! calls the policy's malloc with the request size and stream; a free takes effect at
//! `free_completed` (`free_requested` only marks the caller's intent) — or at `free_requested` in
//! formats that record one kind of free; a run of recorded `segment_free`s outside any malloc is
//! the program calling `empty_cache()`, so every policy is asked to flush there too (and so is one
//! before a retried allocation that the recorded levels, or the recorded allocator's model, show
//! was no OOM fallback: [`EmptyCacheRuns`]); an `oom` entry is a request every policy tries, and
//! frees at once if it is served. Blocks live before the first
//! event are allocated first, in address order, so every policy carries them (a policy that knows
//! how the recorded allocator held them installs that state instead, [`Policy::start`]). Frees of
//! addresses the replay never allocated are counted, never fatal. Reserved bytes are read from the backend,
//! so a policy cannot misreport them.

pub mod compare;
pub mod empty_cache;
mod lockstep;
pub mod metrics;
pub mod series;

pub use compare::{run_specs, Comparison, Jobs, RunSettings, SpecFailure, SpecRun};
pub use metrics::{OomDetail, PeakDetail, PolicyResult};
pub use series::{Point, Series};
// Trace semantics the engine reads, re-exported where callers have found them so far.
pub use crate::trace::lifetimes::{
    digest, empty_cache_points, free_action, live_at_start, live_at_start_of, orphan_frees,
    AddrHasher, AddrMap, AddrSet, EmptyCacheRuns, LiveBlock, Retried,
};
use crate::trace::lifetimes::{FlushCauses, Lifetimes};

use crate::backend::{Backend, BackendCall, Observed, Observer, SimDevice};
use crate::error::{Error, Result};
use crate::policy::{
    self, Allocation, Handle, Policy, PolicyContext, PolicyInfo, PolicyRunner, PolicySpec,
};
use crate::trace::fst::FstStream;
use crate::trace::limits::STREAMS_PER_DEVICE;
use crate::trace::pool_routes::PoolRoutes;
use crate::trace::{Action, Event, Segment, Trace};
use std::time::Instant;

/// One device's events, ready to replay.
pub struct ReplayInput<'a> {
    /// The whole trace (policies may read its segments and recorded settings).
    pub trace: &'a Trace,
    /// The device replayed.
    pub device: i32,
    /// That device's events when they are loaded; empty when a replay streams them from a file
    /// ([`ReplayInput::streamed`]; [`ReplayInput::event_count`] counts them either way).
    pub events: &'a [Event],
    /// Blocks live before the first event (see [`live_at_start`]).
    pub live_at_start: Vec<LiveBlock>,
    /// Where the recorded program called `empty_cache()`: the index of each call's first event,
    /// in order (see [`EmptyCacheRuns`]).
    pub empty_cache_at: Vec<u64>,
    /// The runs of releases the recording leaves undecided between an `empty_cache()` call and
    /// an out-of-memory fallback, in order ([`EmptyCacheRuns::finish_with_undecided`]): a
    /// policy that models the recorded allocator decides each
    /// ([`Policy::would_serve_from_cache`]).
    pub undecided_flushes: Vec<Retried>,
    /// Which recorded allocations were made into a private pool, as of the first event (`None`
    /// when the dump shows no private pool); each replay follows a copy through the events.
    pool_routes: Option<PoolRoutes>,
    /// The action at which frees take effect (see [`free_action`]).
    pub frees_at: Action,
    /// The lifetime scan of the events handed to policies (the loaded events, or a streamed
    /// replay's digest), from which `live_at_start` follows; kept for [`PolicyContext`].
    lifetimes: Lifetimes,
    /// The events the engine acts on, each with the slot of the block it refers to, found once
    /// so that every policy's replay of loaded events follows small indices instead of hashing
    /// addresses. See [`Slots`]. Empty when streamed: that replay keeps a map of the live blocks
    /// instead ([`Keyed`]).
    slots: Slots,
    /// The file the events stream from, if they are not loaded.
    stream: Option<Streamed<'a>>,
    /// The recorded peak of reserved bytes, found only where a policy needs it: for a snapshot
    /// whose settings record a `per_process_memory_fraction`, since the fraction's limit let that
    /// peak through and so bounds the GPU's memory from below
    /// ([`Config::least_gpu_memory_for`](crate::policy::pytorch::Config::least_gpu_memory_for)).
    recorded_peak_reserved: Option<u64>,
}

/// What a replay streamed from a file knows of its events before the first policy runs.
struct Streamed<'a> {
    /// The file.
    file: &'a FstStream,
    /// The device's number of events.
    events: u64,
    /// The first event's time.
    first_time_us: i64,
    /// The events that decide the start state ([`digest`]), handed to policies in place of the
    /// events.
    digest: Vec<Event>,
    /// Where the events come from when a reader shared with other replays decodes the file
    /// ([`lockstep`]); `None`: this replay reads the file itself.
    feed: Option<lockstep::Feed>,
}

/// Where each block of a loaded replay lives while it is live: a slot, numbered so that a
/// replay's table of slots is as long as the most blocks live at once, not as the trace.
/// Live-at-start block `k` starts in slot `k`; an alloc takes the slot released last (or a new
/// one); the free that takes effect releases it. An alloc that reuses the address of a block still
/// live (its free was not recorded) takes that block's slot, marked [`Slots::DISPLACES`]: the
/// engine frees the block there first.
///
/// Why slots and not the index of the alloc a free pairs with: a table indexed by event is as
/// long as the trace, and a free reads it (and the alloc event, for the request size) far from
/// where the replay is, a cache miss on every free of a long trace; the slot table stays small.
///
/// The slots come as a list of the events the engine acts on ([`Op`]), so that a plain replay
/// walks that list and never visits the others (a `free_requested` where frees take effect at
/// `free_completed`: a third of a snapshot's events).
#[derive(Default)]
struct Slots {
    /// The events the engine may act on, in order, each with its slot.
    ops: Vec<Op>,
    /// Number of slots the replay uses.
    count: usize,
}

/// An event the engine may act on ([`Slots::acts_on`]): its index and its slot, with its flag
/// ([`Slots::NONE`] for an event that names no block).
#[derive(Clone, Copy, Debug)]
struct Op {
    event: u32,
    slot: u32,
}

impl Slots {
    /// No slot: not an alloc or a free that takes effect, or a free of an address not live.
    const NONE: u32 = u32::MAX;
    /// On an alloc's slot: the slot still holds the block whose address the alloc reuses.
    const DISPLACES: u32 = 1 << 31;

    /// True for an event the engine may act on, other than an alloc or a free that takes
    /// effect: a recorded `oom` and the segment events (flushes, private pools).
    fn acts_on(e: &Event) -> bool {
        matches!(
            e.action,
            Action::Oom | Action::SegmentAlloc | Action::SegmentFree | Action::SegmentUnmap
        )
    }

    /// Assigns the slots of `events`, with the blocks of `live_at_start` live first.
    fn assign(events: &[Event], live_at_start: &[LiveBlock], frees_at: Action) -> Result<Slots> {
        if events.len() >= Slots::DISPLACES as usize
            || live_at_start.len() >= Slots::DISPLACES as usize
        {
            return Err(Error::input(format!(
                "{} events are more than one replay can index",
                events.len()
            )));
        }
        use std::collections::hash_map::Entry;
        let mut live: AddrMap<u32> = AddrMap::default();
        for (k, b) in live_at_start.iter().enumerate() {
            live.insert(b.addr, k as u32);
        }
        let mut count = live_at_start.len() as u32;
        // Released slots, the last released on top: reused while still in cache.
        let mut spare: Vec<u32> = Vec::new();
        let mut ops = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let slot = if e.action == Action::Alloc && e.size > 0 {
                match live.entry(e.addr) {
                    Entry::Occupied(held) => *held.get() | Slots::DISPLACES,
                    Entry::Vacant(place) => {
                        let slot = spare.pop().unwrap_or_else(|| {
                            count += 1;
                            count - 1
                        });
                        *place.insert(slot)
                    }
                }
            } else if e.action == frees_at {
                let slot = live.remove(&e.addr);
                spare.extend(slot);
                slot.unwrap_or(Slots::NONE) // none: an orphan free, which the engine counts
            } else if Slots::acts_on(e) {
                Slots::NONE
            } else {
                continue;
            };
            ops.push(Op { event: i as u32, slot });
        }
        Ok(Slots { ops, count: count as usize })
    }
}

impl<'a> ReplayInput<'a> {
    /// Picks `device` (default: the device with the most events) from `trace`.
    pub fn new(trace: &'a Trace, device: Option<i32>) -> Result<ReplayInput<'a>> {
        let have = || trace.devices.iter().map(|d| d.device).collect::<Vec<_>>();
        let device = pick_device(device, trace.default_device(), have)?;
        let events = &trace.device(device).map(|d| d.events.as_slice()).unwrap_or_default();
        ReplayInput::of_events(trace, device, events)
    }

    /// The replay of `events`, the events of `device` in `trace` (whose segments and settings
    /// the policies read; its own device list is not consulted).
    pub fn of_events(
        trace: &'a Trace,
        device: i32,
        events: &'a [Event],
    ) -> Result<ReplayInput<'a>> {
        let mut lifetimes = crate::trace::lifetimes::scan(events);
        let mut live_at_start = live_at_start_of(trace, device, &lifetimes);
        // Only a recorded start state is recovered from the scan again, and only where final
        // segments show one: elsewhere the set of every allocated address (as large as the
        // trace's distinct addresses) is freed before the slots are assigned.
        if trace.segments_of(device).next().is_none() {
            lifetimes.allocated = AddrSet::default();
        }
        // A Kineto trace's memory live before profiling that no event frees: one opaque block
        // every policy carries, so peaks compare with the profiler's `Total Allocated`.
        // Its address is below every recorded one: first, in address order.
        if let Some(b) = crate::recorded::kineto_start::opaque_live_block(trace, device) {
            live_at_start.insert(0, b);
        }
        let frees_at = lifetimes.frees_at;
        let slots = Slots::assign(events, &live_at_start, frees_at)?;
        let mut runs = EmptyCacheRuns::new(FlushCauses::of(&trace.frames));
        for (i, e) in events.iter().enumerate() {
            runs.push(i as u64, e);
        }
        let (empty_cache_at, undecided_flushes) =
            runs.finish_with_undecided(!may_collect_garbage(trace));
        let pool_routes = PoolRoutes::new(trace, device, events, &lifetimes);
        Ok(ReplayInput {
            trace,
            device,
            events,
            live_at_start,
            empty_cache_at,
            undecided_flushes,
            pool_routes,
            frees_at,
            lifetimes,
            slots,
            stream: None,
            recorded_peak_reserved: records_fraction(trace)
                .then(|| crate::recorded::recorded(trace, device))
                .flatten()
                .map(|r| r.peak_reserved_bytes),
        })
    }

    /// Picks `device` (default: the device with the most events) of an `.fst` file and prepares
    /// to stream its events: two passes over the file (the first also checks all of it as
    /// loading would; a third, up to the last candidate, when a free of an address not live
    /// may follow an alloc of it) find where frees take effect, the `empty_cache()` calls, and
    /// the [`digest`] from which the blocks live at the start follow. Every policy's replay then
    /// reads the file again; memory follows the live blocks, not the trace's length.
    pub fn streamed(file: &'a FstStream, device: Option<i32>) -> Result<ReplayInput<'a>> {
        let have = || file.devices().into_iter().map(|d| d.0).collect::<Vec<_>>();
        let device = pick_device(device, file.default_device(), have)?;
        let trace = file.head();
        let mut completes = false;
        let mut runs = EmptyCacheRuns::new(FlushCauses::of(&trace.frames));
        let mut first_time_us = None;
        let mut streams = AddrSet::default();
        file.each_event(device, u64::MAX, true, |i, e| {
            completes |= e.action == Action::FreeCompleted;
            runs.push(i, e);
            first_time_us.get_or_insert(e.time_us);
            if streams.len() >= STREAMS_PER_DEVICE && !streams.contains(&e.stream) {
                return Err(Error::input(format!(
                    "device {device}: stream {:#x} is more than {STREAMS_PER_DEVICE} distinct \
                     streams on one device",
                    e.stream
                ))
                .at(crate::error::Place::Event(i)));
            }
            streams.insert(e.stream);
            Ok(())
        })?;
        drop(streams);
        let frees_at = if completes { Action::FreeCompleted } else { Action::FreeRequested };
        let digest = crate::trace::lifetimes::digest(trace, device, frees_at, |limit, f| {
            file.each_event(device, limit, false, f)
        })?;
        let lifetimes = crate::trace::lifetimes::scan(&digest);
        let (empty_cache_at, undecided_flushes) =
            runs.finish_with_undecided(!may_collect_garbage(trace));
        // The digest keeps each address's first segment event, all the routes need.
        let pool_routes = PoolRoutes::new(trace, device, &digest, &lifetimes);
        let live_at_start = live_at_start_of(trace, device, &lifetimes);
        // One more pass, only where a memory fraction is recorded.
        let recorded_peak_reserved = if records_fraction(trace) {
            let walk = |f: &mut dyn FnMut(u64, &Event) -> Result<()>| {
                file.each_event(device, u64::MAX, false, f)
            };
            let (row, _) = crate::recorded::row_and_limit_streamed(
                trace,
                device,
                &live_at_start,
                frees_at,
                walk,
            )?;
            row.and_then(|r| r.peak_reserved_bytes)
        } else {
            None
        };
        Ok(ReplayInput {
            trace,
            device,
            events: &[],
            live_at_start,
            empty_cache_at,
            undecided_flushes,
            pool_routes,
            frees_at,
            lifetimes,
            slots: Slots::default(),
            stream: Some(Streamed {
                file,
                events: file.events_of(device).unwrap_or(0),
                first_time_us: first_time_us.unwrap_or(0),
                digest,
                feed: None,
            }),
            recorded_peak_reserved,
        })
    }

    /// The device's number of events (loaded or streamed).
    pub fn event_count(&self) -> u64 {
        self.stream.as_ref().map_or(self.events.len() as u64, |s| s.events)
    }

    /// True when the events stream from a file instead of being held.
    pub fn is_streamed(&self) -> bool {
        self.stream.is_some()
    }

    /// The device's events, read from the file when streamed: for a policy that plans with
    /// all of them (`offline`).
    pub fn load_events(&self) -> Result<Vec<Event>> {
        let Some(s) = &self.stream else { return Ok(self.events.to_vec()) };
        let mut out = Vec::with_capacity(s.events.min(1 << 24) as usize);
        s.file.each_event(self.device, u64::MAX, false, |_, e| {
            out.push(*e);
            Ok(())
        })?;
        Ok(out)
    }

    /// The same input, streamed as `s` (its own [`ReplayInput::stream`]), with its events taken
    /// from `feed` instead of read from the file: one replay of a [`lockstep`] group.
    fn fed(&self, s: &Streamed<'a>, feed: lockstep::Feed) -> ReplayInput<'a> {
        ReplayInput {
            trace: self.trace,
            device: self.device,
            events: self.events,
            live_at_start: self.live_at_start.clone(),
            empty_cache_at: self.empty_cache_at.clone(),
            undecided_flushes: self.undecided_flushes.clone(),
            pool_routes: self.pool_routes.clone(),
            frees_at: self.frees_at,
            lifetimes: self.lifetimes.clone(),
            slots: Slots::default(),
            stream: Some(Streamed {
                file: s.file,
                events: s.events,
                first_time_us: s.first_time_us,
                digest: s.digest.clone(),
                feed: Some(feed),
            }),
            recorded_peak_reserved: self.recorded_peak_reserved,
        }
    }
}

/// Whether `trace`'s recorded allocator settings set a `per_process_memory_fraction`.
fn records_fraction(trace: &Trace) -> bool {
    let Some(settings) = &trace.allocator_settings else { return false };
    crate::policy::pytorch::Config::from_recorded(
        settings,
        crate::policy::pytorch::Version::CURRENT,
    )
    .is_ok_and(|c| c.per_process_memory_fraction.is_some())
}

/// True when the recorded allocator had `garbage_collection_threshold` set, so that it may have
/// released cached memory before a malloc's first attempt (see [`EmptyCacheRuns::finish`]).
fn may_collect_garbage(trace: &Trace) -> bool {
    trace.allocator_settings.as_ref().is_some_and(|s| s.garbage_collection_threshold > 0.0)
}

/// The device a replay runs on: `asked`, or the default; errors list the devices there are.
fn pick_device(
    asked: Option<i32>,
    default: Option<i32>,
    have: impl Fn() -> Vec<i32>,
) -> Result<i32> {
    let device = match asked {
        Some(d) => d,
        None => default.ok_or_else(|| Error::input("the trace has no events"))?,
    };
    let devices = have();
    if !devices.contains(&device) {
        let have: Vec<String> = devices.iter().map(i32::to_string).collect();
        return Err(Error::usage(format!(
            "the trace has no device {device} (devices: {})",
            have.join(", ")
        )));
    }
    Ok(device)
}

impl<'a> ReplayInput<'a> {
    /// What a policy's constructor is handed for this replay under `options`.
    pub fn context(&self, options: &ReplayOptions) -> PolicyContext<'_> {
        PolicyContext {
            trace: self.trace,
            device: self.device,
            events: self.stream.as_ref().map_or(self.events, |s| &s.digest),
            live_at_start: &self.live_at_start,
            lifetimes: &self.lifetimes,
            capacity: options.capacity,
            gpu_memory: match options.capacity_kind {
                CapacityKind::GpuMemory => options.capacity,
                CapacityKind::AllocatorLimit => None,
            },
            recorded_peak_reserved: self.recorded_peak_reserved,
        }
    }
}

/// The engine side of running a table entry: the policy module's table builds the concrete
/// policy, the engine runs it. (An inherent impl here, beside the engine, so that `policy` never
/// names `replay`.)
impl PolicyInfo {
    /// Replays `input` with this policy built from `spec`'s options: one dispatch per run, then
    /// the generic engine instantiated for the concrete policy type.
    pub fn run(
        &self,
        spec: &PolicySpec,
        input: &ReplayInput,
        options: &ReplayOptions,
    ) -> Result<ReplayOutput> {
        if self.role == policy::Role::Clairvoyant && input.is_streamed() {
            // A planner needs every lifetime before the first event: it alone loads them.
            let events = input.load_events()?;
            let loaded = ReplayInput::of_events(input.trace, input.device, &events)?;
            return self.run(spec, &loaded, options);
        }
        let built = self.build(spec, &input.context(options))?;
        built.run_with(&spec.name, Engine { input, options })
    }
}

/// Replays `input` with the built-in policy `spec` names: [`policy::lookup`] then
/// [`PolicyInfo::run`].
pub fn run_spec(
    spec: &PolicySpec,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    policy::lookup(&spec.name)?.run(spec, input, options)
}

/// The engine as a [`PolicyRunner`]: what a built policy is handed to be run.
struct Engine<'r, 'a> {
    input: &'r ReplayInput<'a>,
    options: &'r ReplayOptions,
}

impl PolicyRunner for Engine<'_, '_> {
    type Output = Result<ReplayOutput>;
    fn run<P: Policy>(self, name: &str, policy: P) -> Result<ReplayOutput> {
        run_policy(name, policy, self.input, self.options)
    }
}

/// Which memory a replay runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// The simulated device (default).
    #[default]
    Sim,
    /// Real GPU memory through the CUDA driver.
    Cuda,
}

/// What a replay's `capacity` stands for besides the memory the backend hands out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapacityKind {
    /// The GPU's memory too (`totalGlobalMem`): a card of that size (`--capacity 40GB`, `fit`'s
    /// probes), or the device memory a recording's `oom` entries measured (reserved plus the
    /// driver's free bytes). PyTorch's `per_process_memory_fraction` and its expandable
    /// reservations are taken of it.
    #[default]
    GpuMemory,
    /// Only the level at which the recorded allocator could reserve no more (a capacity inferred
    /// from its out-of-memory flushes). That level may be a memory fraction's limit already, so
    /// taking the fraction of it again would fail far below the recording: the GPU's memory
    /// stays what the policy models.
    AllocatorLimit,
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Device capacity (`--capacity`); `None` is unlimited.
    pub capacity: Option<u64>,
    /// What `capacity` is: the GPU's memory (the default) or only the recorded allocator's limit.
    pub capacity_kind: CapacityKind,
    /// Device memory used outside the allocator (context, other processes).
    pub outside_bytes: u64,
    /// The memory backend.
    pub backend: BackendKind,
    /// The CUDA device ordinal the `cuda` backend allocates on (not the trace's device number,
    /// which names the GPU the recording ran on).
    pub cuda_ordinal: i32,
    /// Keep the memory-over-time series (for plots).
    pub keep_series: bool,
    /// The series' point budget.
    pub series_budget: usize,
    /// Record the simulated run as events (for `--export-snapshot`).
    pub record_events: bool,
    /// Stop after this event index (inclusive), e.g. at the peak, to look at the state there.
    pub stop_after: Option<u64>,
    /// Check the policy's invariants after every event (slow; tests and debugging).
    pub check_invariants: bool,
    /// Write each new segment and mapped range once on the cuda backend (`--touch`).
    pub touch: bool,
    /// Where `empty_cache()` is called beyond (or instead of) the recording's own calls.
    pub empty_cache: EmptyCachePlan,
}

/// The `empty_cache` what-if: where every policy releases its wholly free cached segments, as
/// `torch.cuda.empty_cache()` does, besides or instead of where the recorded program called it
/// (`--empty-cache-every`, `--empty-cache-at`, `--no-recorded-empty-cache`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmptyCachePlan {
    /// Call it after every `N`th event (after events N−1, 2N−1, ...); `None` or 0: never.
    pub every: Option<u64>,
    /// Call it after each of these event indices.
    pub at: Vec<u64>,
    /// Skip the calls the recording holds ([`empty_cache_points`]).
    pub drop_recorded: bool,
}

impl EmptyCachePlan {
    /// True when the plan changes nothing: the recorded calls only.
    pub fn is_recorded_only(&self) -> bool {
        self.every.is_none_or(|n| n == 0) && self.at.is_empty() && !self.drop_recorded
    }

    /// The calls the plan adds, asked event by event in order ([`AddedCalls::after`]).
    fn added_calls(&self) -> AddedCalls {
        let mut at = self.at.clone();
        at.sort_unstable();
        let mut calls = AddedCalls { every: self.every.filter(|&n| n > 0), at, next: 0, due: 0 };
        calls.due = calls.first_at_or_after(0);
        calls
    }

    /// Describes the plan for people, e.g. `empty_cache() every 1000 events, no recorded calls`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.every.filter(|&n| n > 0) {
            parts.push(format!("every {n} events"));
        }
        if !self.at.is_empty() {
            let at: Vec<String> = self.at.iter().map(u64::to_string).collect();
            parts.push(format!("after events {}", at.join(",")));
        }
        if self.drop_recorded {
            parts.push("without the recorded calls".to_string());
        }
        format!("empty_cache() {}", parts.join(", "))
    }
}

/// The recording's undecided release runs ([`ReplayInput::undecided_flushes`]), asked about
/// in event order.
struct Undecided<'r> {
    runs: &'r [Retried],
    next: usize,
}

impl Undecided<'_> {
    /// True when the run starting at event `index` was the program's `empty_cache()`: the
    /// policy models the recorded allocator and its cache would have served the retried
    /// request, which an out-of-memory fallback never follows.
    #[inline]
    fn called_at<P: Policy>(&mut self, index: u64, policy: &P) -> bool {
        while self.runs.get(self.next).is_some_and(|r| r.event < index) {
            self.next += 1;
        }
        match self.runs.get(self.next) {
            Some(r) if r.event == index => {
                policy.would_serve_from_cache(r.size, r.stream) == Some(true)
            }
            _ => false,
        }
    }
}

/// The `empty_cache()` calls an [`EmptyCachePlan`] adds, for a replay that asks after each event
/// in order: a cursor into the sorted indices instead of a search per event.
struct AddedCalls {
    every: Option<u64>,
    at: Vec<u64>,
    /// The first entry of `at` not yet passed.
    next: usize,
    /// The next event index with a call after it (`u64::MAX`: none): every event before it is
    /// answered by one comparison.
    due: u64,
}

impl AddedCalls {
    /// True when the plan adds a call after event `index`; indices must come in increasing order.
    #[inline]
    fn after(&mut self, index: u64) -> bool {
        if index < self.due {
            return false;
        }
        if index > self.due {
            self.due = self.first_at_or_after(index); // events were skipped
        }
        let call = index == self.due;
        if call {
            self.due = index.checked_add(1).map_or(u64::MAX, |i| self.first_at_or_after(i));
        }
        call
    }

    /// The first event index at or after `from` with a call after it.
    fn first_at_or_after(&mut self, from: u64) -> u64 {
        // After events n-1, 2n-1, ...: the first k·n - 1 at or after `from`.
        let every = match (self.every, from.checked_add(1)) {
            (Some(n), Some(f)) => f.div_ceil(n).saturating_mul(n) - 1,
            _ => u64::MAX,
        };
        while self.at.get(self.next).is_some_and(|&a| a < from) {
            self.next += 1;
        }
        let at = self.at.get(self.next).copied().unwrap_or(u64::MAX);
        every.min(at)
    }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            capacity: None,
            capacity_kind: CapacityKind::GpuMemory,
            outside_bytes: 0,
            backend: BackendKind::Sim,
            cuda_ordinal: 0,
            keep_series: false,
            series_budget: series::DEFAULT_BUDGET,
            record_events: false,
            stop_after: None,
            check_invariants: false,
            touch: false,
            empty_cache: EmptyCachePlan::default(),
        }
    }
}

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
    /// The policy's segments when the replay ended (or stopped).
    pub segments: Vec<Segment>,
}

impl From<crate::policy::pytorch::validate::SimulatedRun> for ReplayOutput {
    /// A validation's simulated run as a `pytorch` replay's output (for `--export-snapshot`).
    fn from(run: crate::policy::pytorch::validate::SimulatedRun) -> ReplayOutput {
        ReplayOutput {
            result: PolicyResult {
                policy: crate::policy::pytorch::NAME.into(),
                config: run.config,
                peak_reserved_bytes: run.peak_reserved_bytes,
                reserved_at_end_bytes: run.reserved_at_end_bytes,
                alloc_retries: run.alloc_retries,
                ..PolicyResult::default()
            },
            events: run.events,
            segments: run.segments,
            ..ReplayOutput::default()
        }
    }
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
        BackendKind::Cuda => {
            let needed = bound_peak(input)?;
            let device =
                crate::backend::cuda::CudaDevice::open(options.cuda_ordinal, cuda_cap(options))?
                    .with_touch(options.touch);
            device.ensure_room(needed)?;
            let measures = device.measures();
            let mut output = run(name, policy, device, input, options)?;
            output.result.cuda = Some(measures.summary());
            Ok(output)
        }
    }
}

/// The trace's `bound` peak (live requested bytes at their highest): what any policy needs at
/// least, checked against a real GPU's free memory before the first allocation.
fn bound_peak(input: &ReplayInput) -> Result<u64> {
    let bound = crate::policy::bound::Bound::default();
    Ok(run_policy("bound", bound, input, &ReplayOptions::default())?.result.peak_reserved_bytes)
}

/// The cap on the CUDA backend's memory: `--capacity` less what is counted as used outside the
/// allocator, so a big GPU can stand in for a smaller one.
fn cuda_cap(options: &ReplayOptions) -> Option<u64> {
    options.capacity.map(|c| c.saturating_sub(options.outside_bytes))
}

/// Counts what the policy asks of the backend and, when asked, records it as trace events: the
/// [`Observer`] of the backend a replay runs on.
struct Metered {
    mallocs: u64,
    frees: u64,
    maps: u64,
    unmaps: u64,
    log: Option<Vec<Event>>,
    now: i64,
    stream: u64,
}

impl Metered {
    fn note(&mut self, action: Action, addr: u64, size: u64) {
        if let Some(log) = &mut self.log {
            log.push(Event::new(action, addr, size, self.stream, self.now));
        }
    }
}

impl Observer for Metered {
    fn observe(&mut self, call: BackendCall) {
        match call {
            BackendCall::SegmentAlloc { size, addr: Some(addr) } => {
                self.mallocs += 1;
                self.note(Action::SegmentAlloc, addr, size);
            }
            BackendCall::SegmentFree { addr, size } => {
                self.frees += 1;
                self.note(Action::SegmentFree, addr, size);
            }
            BackendCall::Map { addr, size, ok: true } => {
                self.maps += 1;
                self.note(Action::SegmentMap, addr, size);
            }
            BackendCall::Unmap { addr, size } => {
                self.unmaps += 1;
                self.note(Action::SegmentUnmap, addr, size);
            }
            _ => {}
        }
    }
}

/// How the engine finds the policy's block for a recorded address: by the precomputed slots of
/// loaded events ([`Indexed`]), or in a map of the live blocks when the events stream
/// ([`Keyed`]). Both give the same answers; a block is the policy's address and the request size.
trait Blocks {
    /// Hands `f` the first `limit` events of `input` in order with their index: from memory,
    /// or from the file when they stream. A method of the lookup so that each build of the
    /// engine walks one way only: a closure handed on to the file's reader escapes, and then
    /// every flag it reads is read from memory again after each policy call.
    ///
    /// Each event comes with its [`Slots`] slot and flag ([`Slots::NONE`] where this lookup
    /// keeps none). With `every` false, the walk may leave out events that the engine never
    /// acts on (see [`Slots::acts_on`]), as a plain replay does.
    fn walk(
        input: &ReplayInput,
        limit: u64,
        every: bool,
        f: impl FnMut(u64, &Event, u32) -> Result<()>,
    ) -> Result<()>;
    /// Live-at-start block `k` was placed as `placed` (`None`: it did not fit).
    fn started(&mut self, k: usize, block: &LiveBlock, placed: Option<Allocation>);
    /// Alloc event `e`, of slot `slot`, reuses the address of a block the replay still holds
    /// (its free was not recorded): takes that block, if any.
    fn displaced(&mut self, slot: u32, e: &Event) -> Option<Held>;
    /// Alloc event `e`, of slot `slot`, was placed as `placed`.
    fn allocated(&mut self, slot: u32, e: &Event, placed: Allocation);
    /// Alloc event `e`, of slot `slot`, failed (out of memory): its free finds
    /// [`Freed::Never`].
    fn failed(&mut self, slot: u32, e: &Event);
    /// Free event `e`, of slot `slot`: the block it frees, [`Freed::Never`] when its alloc
    /// failed, or [`Freed::Orphan`] when the replay never allocated the address.
    fn freed(&mut self, slot: u32, e: &Event) -> Freed;
}

/// What a free finds ([`Blocks::freed`]).
enum Freed {
    /// The policy's block.
    Block(Held),
    /// The block's alloc failed under `--capacity`: the block never existed.
    Never,
    /// No alloc or live-at-start block had the address.
    Orphan,
}

/// A block the replay holds: the policy's address and handle for it, and the request size.
#[derive(Clone, Copy, Debug)]
struct Held {
    addr: u64,
    request: u64,
    handle: Handle,
}

impl Held {
    /// No block: never allocated, its alloc failed, or freed.
    const EMPTY: Held = Held { addr: u64::MAX, request: 0, handle: Handle::NONE };

    /// The block `placed` for a request of `request` bytes; [`Held::EMPTY`] when it failed.
    fn of(placed: Option<Allocation>, request: u64) -> Held {
        placed.map_or(Held::EMPTY, |a| Held::placed(a, request))
    }

    /// The block `a` for a request of `request` bytes.
    #[inline]
    fn placed(a: Allocation, request: u64) -> Held {
        Held { addr: a.addr, request, handle: a.handle }
    }

    fn is_empty(&self) -> bool {
        self.addr == u64::MAX
    }
}

/// [`Blocks`] of loaded events: per [`Slots`] slot, the block there ([`Held::EMPTY`] when none
/// is live).
struct Indexed {
    table: Vec<Held>,
}

impl Indexed {
    fn new(input: &ReplayInput) -> Indexed {
        Indexed { table: vec![Held::EMPTY; input.slots.count] }
    }

    /// Empties slot `slot` (no flag): what it held.
    #[inline]
    fn take(&mut self, slot: u32) -> Option<Held> {
        let entry = self.table.get_mut(slot as usize)?;
        let held = *entry;
        entry.addr = Held::EMPTY.addr; // empty: `Held::is_empty` reads the address alone
        Some(held)
    }
}

/// The first `limit` of `events` (all of them when there are fewer).
#[inline(always)]
fn first_events(events: &[Event], limit: u64) -> &[Event] {
    &events[..usize::try_from(limit).unwrap_or(usize::MAX).min(events.len())]
}

/// The first `limit` of `events`, with their index.
#[inline(always)]
fn walk_loaded(
    events: &[Event],
    limit: u64,
    mut f: impl FnMut(u64, &Event) -> Result<()>,
) -> Result<()> {
    for (i, e) in first_events(events, limit).iter().enumerate() {
        f(i as u64, e)?;
    }
    Ok(())
}

impl Blocks for Indexed {
    #[inline(always)]
    fn walk(
        input: &ReplayInput,
        limit: u64,
        every: bool,
        mut f: impl FnMut(u64, &Event, u32) -> Result<()>,
    ) -> Result<()> {
        let events = first_events(input.events, limit);
        let ops = &input.slots.ops;
        if !every {
            for op in ops {
                // In event order: past the limit, so are the rest.
                let Some(e) = events.get(op.event as usize) else { break };
                f(op.event as u64, e, op.slot)?;
            }
            return Ok(());
        }
        let mut ops = ops.iter().peekable();
        for (i, e) in events.iter().enumerate() {
            let slot = match ops.next_if(|op| op.event as usize == i) {
                Some(op) => op.slot,
                None => Slots::NONE,
            };
            f(i as u64, e, slot)?;
        }
        Ok(())
    }
    fn started(&mut self, k: usize, block: &LiveBlock, placed: Option<Allocation>) {
        if let Some(entry) = self.table.get_mut(k) {
            *entry = Held::of(placed, block.size);
        }
    }
    #[inline]
    fn displaced(&mut self, slot: u32, _: &Event) -> Option<Held> {
        match slot {
            s if s != Slots::NONE && s & Slots::DISPLACES != 0 => {
                self.take(s & !Slots::DISPLACES).filter(|b| !b.is_empty())
            }
            _ => None,
        }
    }
    #[inline]
    fn allocated(&mut self, slot: u32, e: &Event, placed: Allocation) {
        if let Some(entry) = self.table.get_mut((slot & !Slots::DISPLACES) as usize) {
            *entry = Held::placed(placed, e.size);
        }
    }
    #[inline]
    fn failed(&mut self, slot: u32, _: &Event) {
        if let Some(entry) = self.table.get_mut((slot & !Slots::DISPLACES) as usize) {
            *entry = Held::EMPTY;
        }
    }
    #[inline]
    fn freed(&mut self, slot: u32, _: &Event) -> Freed {
        match self.take(slot) {
            None => Freed::Orphan,
            Some(b) if b.is_empty() => Freed::Never,
            Some(b) => Freed::Block(b),
        }
    }
}

/// [`Blocks`] of streamed events: recorded address → the block the recording holds there
/// ([`Held::EMPTY`] for one whose alloc failed). Sized by the live blocks, not by the events.
#[derive(Default)]
struct Keyed(AddrMap<Held>);

impl Blocks for Keyed {
    fn walk(
        input: &ReplayInput,
        limit: u64,
        _every: bool,
        mut f: impl FnMut(u64, &Event, u32) -> Result<()>,
    ) -> Result<()> {
        let f = |i: u64, e: &Event| f(i, e, Slots::NONE);
        match &input.stream {
            Some(Streamed { file, feed: None, .. }) => {
                file.each_event(input.device, limit, false, f)
            }
            Some(Streamed { feed: Some(feed), events, .. }) => {
                feed.each_event(limit.min(*events), f)
            }
            // Loaded events, looked up by address as if streamed.
            None => walk_loaded(input.events, limit, f),
        }
    }
    fn started(&mut self, _: usize, block: &LiveBlock, placed: Option<Allocation>) {
        self.0.insert(block.addr, Held::of(placed, block.size));
    }
    #[inline]
    fn displaced(&mut self, _: u32, e: &Event) -> Option<Held> {
        self.0.remove(&e.addr).filter(|b| !b.is_empty())
    }
    #[inline]
    fn allocated(&mut self, _: u32, e: &Event, placed: Allocation) {
        self.0.insert(e.addr, Held::placed(placed, e.size));
    }
    #[inline]
    fn failed(&mut self, _: u32, e: &Event) {
        self.0.insert(e.addr, Held::EMPTY);
    }
    #[inline]
    fn freed(&mut self, _: u32, e: &Event) -> Freed {
        match self.0.remove(&e.addr) {
            None => Freed::Orphan,
            Some(b) if b.is_empty() => Freed::Never,
            Some(b) => Freed::Block(b),
        }
    }
}

/// The measuring state of one replay.
struct Meter {
    requested: u64,
    peak_reserved: u64,
    peak_allocated: u64,
    peak_requested: u64,
    detail: PeakDetail,
    series: Option<Series>,
    last: (u64, u64, u64),
}

impl Meter {
    /// Takes the levels after `event`: the peaks, and a point of the series if one is kept.
    #[inline]
    fn observe(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
        self.peaks(event, time_us, reserved, allocated);
        self.sample(event, time_us, reserved, allocated);
    }

    /// The peaks part of [`Meter::observe`]: all a plain replay needs ([`drive`]).
    #[inline(always)]
    fn peaks(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
        self.reserved_peak(event, time_us, reserved, allocated);
        self.peak_allocated = self.peak_allocated.max(allocated);
        self.peak_requested = self.peak_requested.max(self.requested);
    }

    /// The reserved part of [`Meter::peaks`]: all that can rise on a free, which lowers the
    /// allocated and requested bytes.
    #[inline(always)]
    fn reserved_peak(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
        if reserved > self.peak_reserved {
            self.peak_reserved = reserved;
            self.detail.peak_reserved_event = event;
            self.detail.peak_reserved_time_us = time_us;
            self.detail.allocated_at_peak_bytes = allocated;
            self.detail.requested_at_peak_bytes = self.requested;
        }
    }

    /// The series part of [`Meter::observe`].
    #[inline(always)]
    fn sample(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
        let requested = self.requested;
        if let Some(series) = &mut self.series {
            let now = (reserved, allocated, requested);
            if now != self.last {
                self.last = now;
                series.push(Point { event, time_us, reserved, allocated, requested });
            }
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

/// Records the policy's allocation at `addr` for `at` in the simulated run's log, if kept
/// (`logging`: it is, which the engine knows at no cost in a plain replay).
#[inline(always)]
fn log_alloc(logging: bool, log: &mut Option<Vec<Event>>, addr: u64, at: &Event) {
    if !logging {
        return;
    }
    if let Some(log) = log {
        log.push(Event::new(Action::Alloc, addr, at.size, at.stream, at.time_us));
    }
}

/// Counts the request of `at` that the policy could not serve, keeps the first such moment's
/// `detail`, and logs the `oom`, if the log is kept.
fn count_oom(
    meter: &mut Meter,
    first: &mut Option<OomDetail>,
    log: &mut Option<Vec<Event>>,
    at: &Event,
    detail: impl FnOnce() -> OomDetail,
) {
    meter.detail.oom_count += 1;
    if first.is_none() {
        *first = Some(detail());
    }
    if let Some(log) = log {
        log.push(Event::new(Action::Oom, 0, at.size, at.stream, at.time_us));
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
        log.push(Event::new(Action::FreeRequested, addr, request, at.stream, at.time_us));
        log.push(Event::new(Action::FreeCompleted, addr, request, at.stream, at.time_us));
    }
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
    if input.is_streamed() {
        drive::<_, _, _, false>(name, policy, backend, input, options, Keyed::default())
    } else if is_plain(input, options) {
        drive::<_, _, _, true>(name, policy, backend, input, options, Indexed::new(input))
    } else {
        drive::<_, _, _, false>(name, policy, backend, input, options, Indexed::new(input))
    }
}

/// True when a replay is plain: no log of the simulated run, no series, no invariant checks,
/// no `empty_cache()` calls added, no private pools to route. Such a replay (`replay`, `fit`,
/// `sweep`, `check`: nearly every one) runs the engine built with `PLAIN`, where each of those
/// tests is the constant `false` and leaves the loop: about 15 instructions an event.
fn is_plain(input: &ReplayInput, options: &ReplayOptions) -> bool {
    let adds_calls =
        options.empty_cache.every.is_some_and(|n| n > 0) || !options.empty_cache.at.is_empty();
    !options.record_events
        && !options.keep_series
        && !options.check_invariants
        && !adds_calls
        && input.pool_routes.is_none()
}

/// [`run`] with the block lookup `blocks`; `PLAIN`: the replay [`is_plain`]. Never inlined:
/// inlined into `run`, its builds were merged back into one loop that tests a flag again.
#[inline(never)]
fn drive<P: Policy, B: Backend, K: Blocks, const PLAIN: bool>(
    name: &str,
    mut policy: P,
    backend: B,
    input: &ReplayInput,
    options: &ReplayOptions,
    mut blocks: K,
) -> Result<ReplayOutput> {
    let started = Instant::now();
    let events = input.events;
    let count = input.event_count();
    let mut backend = Observed {
        inner: backend,
        observer: Metered {
            mallocs: 0,
            frees: 0,
            maps: 0,
            unmaps: 0,
            log: None,
            now: 0,
            stream: 0,
        },
    };
    if options.record_events {
        backend.observer.log = Some(Vec::new());
    }
    policy.prepare(events)?;
    let frees_at = input.frees_at;
    let mut meter = Meter {
        requested: 0,
        peak_reserved: 0,
        peak_allocated: 0,
        peak_requested: 0,
        detail: PeakDetail { events: count, ..PeakDetail::default() },
        series: options.keep_series.then(|| Series::with_budget(options.series_budget)),
        last: (u64::MAX, 0, 0),
    };
    let mut first_oom: Option<OomDetail> = None;
    // What PyTorch's OOM message says about the moment a request failed.
    let oom_detail = |event: u64, size: u64, e: Option<&Event>, reserved: u64, allocated: u64| {
        let stack = e
            .map(|e| input.trace.frames.get(e.frames))
            .unwrap_or_default()
            .iter()
            .map(|f| format!("{}:{} {}", f.filename, f.line, f.name))
            .collect();
        OomDetail {
            event,
            size,
            stream: e.map_or(0, |e| e.stream),
            capacity_bytes: options.capacity,
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            free_bytes: options
                .capacity
                .map(|c| c.saturating_sub(options.outside_bytes).saturating_sub(reserved)),
            stack,
        }
    };
    let start_time = match &input.stream {
        Some(s) => s.first_time_us,
        None => events.first().map_or(0, |e| e.time_us),
    };

    // Which recorded allocations were made into a private pool, where the dump shows any.
    let mut routes = input.pool_routes.clone();

    // Blocks live before the first event: every policy must carry them.
    backend.observer.now = start_time;
    // A recorded run (`--export-snapshot`) starts cold, every block malloc'd, so that `validate`
    // can replay it decision for decision from its own events.
    let installed = if options.record_events {
        vec![None; input.live_at_start.len()]
    } else {
        policy.start(&mut backend, &input.live_at_start)?
    };
    for (k, b) in input.live_at_start.iter().enumerate() {
        backend.observer.now = start_time;
        backend.observer.stream = b.stream;
        let placed = match installed.get(k).copied().flatten() {
            Some(a) => Some(a),
            None => {
                if let Some(r) = &routes {
                    policy.allocate_into(r.pool_of(b.addr))?;
                }
                malloc_cold(&mut policy, &mut backend, b.size.max(1), b.stream)?
            }
        };
        blocks.started(k, b, placed);
        match placed {
            Some(a) => {
                meter.requested += b.size;
                if let Some(log) = &mut backend.observer.log {
                    log.push(Event::new(Action::Alloc, a.addr, b.size, b.stream, start_time));
                }
                meter.detail.live_at_start += 1;
            }
            None => {
                meter.detail.oom_count += 1;
                if first_oom.is_none() {
                    let mut d = oom_detail(0, b.size, None, backend.reserved(), policy.allocated());
                    d.stream = b.stream;
                    first_oom = Some(d);
                }
            }
        }
    }
    if !input.live_at_start.is_empty() {
        meter.observe(0, start_time, backend.reserved(), policy.allocated());
    }

    let last = options.stop_after.map_or(count, |s| s.saturating_add(1).min(count));
    let mut added_calls = options.empty_cache.added_calls();
    let plan = &options.empty_cache;
    let recorded_flushes = &input.empty_cache_at;
    let mut undecided = Undecided { runs: &input.undecided_flushes, next: 0 };
    // Read once: the policy's calls go through `backend` and could change what it points to, so
    // the compiler would otherwise reload these on every event.
    let logging = !PLAIN && backend.observer.log.is_some();
    let check = !PLAIN && options.check_invariants;
    // The last event of the flush run the program called last (runs are consecutive releases).
    let mut flush_run_to = u64::MAX - 1;
    K::walk(input, last, !PLAIN, |index, e, slot| {
        // A policy's input error names the event it was replaying (a backend error names the
        // driver call instead, as docs/interface.md promises).
        let at = |err: Error| match err.kind() {
            crate::error::ErrorKind::Backend => err,
            _ => err.at(crate::error::Place::Event(index)),
        };
        if logging {
            // What the backend calls this event makes are logged with.
            backend.observer.now = e.time_us;
            backend.observer.stream = e.stream;
        }
        'event: {
            // `None`, or after a free `Some(its policy's allocated bytes before it)` (read only
            // when invariants are checked): a free lowers allocated and requested bytes, so
            // only reserved bytes can reach a new peak then.
            let after_free = match e.action {
                Action::Alloc => {
                    if e.size == 0 {
                        // Zero-byte requests never reach the allocator:
                        // docs/pytorch-model.md#zero-byte.
                        break 'event;
                    }
                    // The recording reused the address of a block we still hold: that block was
                    // freed before this alloc, though its free was not recorded.
                    if let Some(b) = blocks.displaced(slot, e) {
                        meter.requested -= b.request;
                        log_free(logging, &mut backend.observer.log, b.addr, b.request, e);
                        free_cold(&mut policy, &mut backend, b.addr, b.handle).map_err(at)?;
                    }
                    // (`!PLAIN` first: `routes` is in memory, where a policy call might change it.)
                    if !PLAIN {
                        if let Some(r) = &mut routes {
                            route(&mut policy, r, e).map_err(at)?;
                        }
                    }
                    let placed = policy.malloc(&mut backend, e.size, e.stream).map_err(at)?;
                    match placed {
                        Some(a) => {
                            blocks.allocated(slot, e, a);
                            meter.requested += e.size;
                            log_alloc(logging, &mut backend.observer.log, a.addr, e);
                        }
                        None => {
                            blocks.failed(slot, e);
                            let (r, a) = (backend.reserved(), policy.allocated());
                            let log = &mut backend.observer.log;
                            count_oom(&mut meter, &mut first_oom, log, e, || {
                                oom_detail(index, e.size, Some(e), r, a)
                            });
                        }
                    }
                    None
                }
                // A request the recorded allocator could not serve (`size` is its rounded size):
                // it is part of what the program asked for, so every policy tries it too. One
                // that fails counts as an OOM here, as it did in the recording; one that is
                // served is freed at once, since the program went on without it.
                Action::Oom if e.size > 0 => {
                    if let Some(r) = &mut routes {
                        route(&mut policy, r, e).map_err(at)?; // named, or the default pools
                    }
                    match malloc_cold(&mut policy, &mut backend, e.size, e.stream).map_err(at)? {
                        Some(a) => {
                            log_alloc(logging, &mut backend.observer.log, a.addr, e);
                            log_free(logging, &mut backend.observer.log, a.addr, e.size, e);
                            free_cold(&mut policy, &mut backend, a.addr, a.handle).map_err(at)?;
                        }
                        None => {
                            let (r, a) = (backend.reserved(), policy.allocated());
                            let log = &mut backend.observer.log;
                            count_oom(&mut meter, &mut first_oom, log, e, || {
                                oom_detail(index, e.size, Some(e), r, a)
                            });
                        }
                    }
                    None
                }
                a if a == frees_at => {
                    let b = match blocks.freed(slot, e) {
                        Freed::Block(b) => b,
                        Freed::Orphan => {
                            meter.detail.orphan_frees += 1;
                            break 'event;
                        }
                        // Its alloc failed under --capacity: the block never existed.
                        Freed::Never => break 'event,
                    };
                    meter.requested -= b.request;
                    log_free(logging, &mut backend.observer.log, b.addr, b.request, e);
                    let before = if check { policy.allocated() } else { u64::MAX };
                    policy.free_handle(&mut backend, b.addr, b.handle).map_err(at)?;
                    Some(before)
                }
                Action::SegmentFree | Action::SegmentUnmap
                    if !plan.drop_recorded
                        && (recorded_flushes.binary_search(&index).is_ok()
                            || undecided.called_at(index, &policy)) =>
                {
                    if let Some(r) = &mut routes {
                        follow(&mut policy, r, e, true).map_err(at)?;
                    }
                    policy.empty_cache(&mut backend).map_err(at)?;
                    flush_run_to = index;
                    None
                }
                Action::SegmentAlloc | Action::SegmentFree | Action::SegmentUnmap => {
                    let Some(r) = &mut routes else { break 'event };
                    // A release later in a flush the program called: that call released the
                    // pool too (PyTorch releases gone pools after the default ones).
                    let release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
                    let in_call = release && flush_run_to + 1 == index;
                    if in_call {
                        flush_run_to = index;
                    }
                    if !follow(&mut policy, r, e, in_call).map_err(at)? {
                        break 'event;
                    }
                    policy.empty_cache(&mut backend).map_err(at)?;
                    None
                }
                _ => break 'event,
            };
            let (reserved, allocated) = (backend.reserved(), policy.allocated());
            match after_free {
                None => meter.peaks(index, e.time_us, reserved, allocated),
                Some(before) => {
                    meter.reserved_peak(index, e.time_us, reserved, allocated);
                    if check && allocated > before {
                        return Err(Error::input(format!(
                            "policy '{name}' broke an invariant: a free raised its allocated \
                             bytes from {before} to {allocated}"
                        ))
                        .at(crate::error::Place::Event(index)));
                    }
                }
            }
            if !PLAIN {
                meter.sample(index, e.time_us, reserved, allocated);
            }
            if B::HOLDS_DEVICE_MEMORY && crate::backend::cuda::interrupt::requested() {
                return Err(Error::backend("interrupted").at(crate::error::Place::Event(index)));
            }
            if check {
                policy.check_invariants().map_err(|m| {
                    Error::input(format!("policy '{name}' broke an invariant: {m}"))
                        .at(crate::error::Place::Event(index))
                })?;
            }
        }
        if !PLAIN && added_calls.after(index) {
            policy.empty_cache(&mut backend).map_err(at)?;
            meter.detail.empty_cache_calls += 1;
            meter.observe(index, e.time_us, backend.reserved(), policy.allocated());
        }
        Ok(())
    })?;

    let reserved_at_end = backend.reserved();
    let segments = policy.segments();
    let fragmentation_at_peak = if meter.peak_reserved == 0 {
        0.0
    } else {
        1.0 - meter.detail.allocated_at_peak_bytes as f64 / meter.peak_reserved as f64
    };
    let result = PolicyResult {
        policy: name.to_string(),
        config: policy.config(),
        peak_reserved_bytes: meter.peak_reserved,
        peak_allocated_bytes: meter.peak_allocated,
        peak_requested_bytes: meter.peak_requested,
        reserved_at_end_bytes: reserved_at_end,
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
        cuda: None,
    };
    Ok(ReplayOutput {
        result,
        detail: meter.detail,
        series: meter.series,
        events: backend.observer.log,
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_calls_come_after_the_events_the_plan_names() {
        for (every, at) in
            [(None, vec![]), (Some(3), vec![]), (None, vec![0, 4, 4, 9]), (Some(4), vec![1, 3, 20])]
        {
            let plan = EmptyCachePlan { every, at: at.clone(), drop_recorded: false };
            let mut calls = plan.added_calls();
            let asked: Vec<u64> = (0..30).filter(|&i| calls.after(i)).collect();
            let want: Vec<u64> = (0..30u64)
                .filter(|&i| every.is_some_and(|n| (i + 1) % n == 0) || at.contains(&i))
                .collect();
            assert_eq!(asked, want, "every {every:?}, at {at:?}");
        }
        // Asked about some events only (the replay stops early or skips none), still in order.
        let plan = EmptyCachePlan { every: Some(5), at: vec![7], drop_recorded: false };
        let mut calls = plan.added_calls();
        let asked: Vec<u64> =
            [2, 4, 7, 8, 14, 15].into_iter().filter(|&i| calls.after(i)).collect();
        assert_eq!(asked, [4, 7, 14]);
    }
    use crate::policy::pytorch::{Config, PyTorch};
    use crate::trace::{text, ReadOptions};

    #[test]
    fn a_plain_replay_and_a_full_one_agree_number_for_number() {
        // Options that need the full build of the engine but change no decision: a series, the
        // invariant checks, and an added empty_cache() call after the last event (made when
        // nothing follows it, so only the call count may differ).
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/traces/real/cs336-medium-ctx512-infer.pickle");
        let trace = crate::trace::read_trace(path.as_ref(), &ReadOptions::default()).unwrap();
        let input = ReplayInput::new(&trace, None).unwrap();
        let last = input.event_count() - 1;
        let plain = ReplayOptions::default();
        let full = ReplayOptions {
            keep_series: true,
            check_invariants: true,
            empty_cache: EmptyCachePlan { at: vec![last], ..EmptyCachePlan::default() },
            ..ReplayOptions::default()
        };
        assert!(is_plain(&input, &plain) && !is_plain(&input, &full));
        for info in crate::policy::POLICIES.iter() {
            let spec = PolicySpec { name: info.name.into(), options: String::new() };
            let run = |options| {
                let mut out = info.run(&spec, &input, options).unwrap_or_else(|e| panic!("{e}"));
                out.result.replay_seconds = 0.0;
                out.result.planning_seconds = out.result.planning_seconds.map(|_| 0.0);
                out
            };
            let (a, mut b) = (run(&plain), run(&full));
            assert!(b.series.as_ref().is_some_and(|s| !s.points().is_empty()), "{}", info.name);
            assert_eq!(b.detail.empty_cache_calls, a.detail.empty_cache_calls + 1, "{}", info.name);
            b.detail.empty_cache_calls = a.detail.empty_cache_calls;
            // The call after the last event releases what the policy caches, as at the end.
            b.result.reserved_at_end_bytes = a.result.reserved_at_end_bytes;
            b.result.device_free_count = a.result.device_free_count;
            b.result.unmap_count = a.result.unmap_count;
            b.segments = a.segments.clone();
            assert_eq!(a.result, b.result, "{}", info.name);
            assert_eq!(a.detail, b.detail, "{}", info.name);
        }
    }

    /// `pytorch` as its registration builds it, in the general form (no default rules folded).
    fn general_pytorch(input: &ReplayInput, options: &ReplayOptions) -> PyTorch {
        let context = input.context(options);
        PyTorch::from_spec("", &context).unwrap().on_gpu(context.gpu_memory)
    }

    #[test]
    fn pytorch_default_rules_form_decides_as_the_general_form() {
        // `replay -p pytorch` runs the default-rules form where the settings allow it; it must
        // place every block where the general form does, on real snapshots (their recovered
        // start state installed), under a capacity that forces the release-and-retry fallbacks,
        // with added empty_cache() calls, and in the recorded run that logs every address.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/traces");
        let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(format!("{dir}/real"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
            .collect();
        paths.sort();
        paths.push(format!("{dir}/gpt-4l-512h.txt").into());
        let mut folded = 0;
        for path in &paths {
            let trace = crate::trace::read_trace(path, &ReadOptions::default()).unwrap();
            let input = ReplayInput::new(&trace, None).unwrap();
            let plain = ReplayOptions::default();
            if !general_pytorch(&input, &plain).has_default_rules() {
                continue; // recorded settings that the general form alone decides
            }
            folded += 1;
            let peak = run_policy("pytorch", general_pytorch(&input, &plain), &input, &plain)
                .unwrap()
                .result
                .peak_reserved_bytes;
            let cases = [
                plain.clone(),
                ReplayOptions { capacity: Some(peak / 10 * 9), ..plain.clone() },
                ReplayOptions {
                    empty_cache: EmptyCachePlan { every: Some(97), ..EmptyCachePlan::default() },
                    check_invariants: true,
                    ..plain.clone()
                },
                ReplayOptions { record_events: true, ..plain.clone() },
            ];
            let spec = PolicySpec { name: "pytorch".into(), options: String::new() };
            for options in &cases {
                let general =
                    run_policy("pytorch", general_pytorch(&input, options), &input, options);
                let folded_form = run_spec(&spec, &input, options);
                let (mut a, mut b) = (general.unwrap(), folded_form.unwrap());
                (a.result.replay_seconds, b.result.replay_seconds) = (0.0, 0.0);
                let what = format!("{} with {options:?}", path.display());
                assert_eq!(a.result, b.result, "{what}");
                assert_eq!(a.detail, b.detail, "{what}");
                assert_eq!(a.segments, b.segments, "{what}");
                assert_eq!(a.events, b.events, "{what}");
            }
            let capped = ReplayOptions { capacity: Some(peak / 10 * 9), ..plain.clone() };
            let squeezed = run_spec(&spec, &input, &capped).unwrap();
            assert!(
                squeezed.result.alloc_retries > 0 || squeezed.detail.oom_count > 0,
                "{}",
                path.display()
            );
        }
        assert!(folded >= 2, "only {folded} traces replay with PyTorch's default rules");
    }

    /// A policy that breaks [`Policy::allocated`]'s promise: a free raises its allocated bytes.
    struct FreeRaisesAllocated(u64, u64);

    impl Policy for FreeRaisesAllocated {
        fn config(&self) -> String {
            String::new()
        }
        fn malloc<B: Backend>(
            &mut self,
            _: &mut B,
            size: u64,
            _: u64,
        ) -> Result<Option<Allocation>> {
            self.0 += size;
            self.1 += 1 << 20;
            Ok(Some(Allocation::new(self.1, size)))
        }
        fn free<B: Backend>(&mut self, _: &mut B, _: u64) -> Result<()> {
            self.0 += 1;
            Ok(())
        }
        fn empty_cache<B: Backend>(&mut self, _: &mut B) -> Result<()> {
            Ok(())
        }
        fn allocated(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn a_replay_that_checks_invariants_refuses_a_free_that_raises_allocated_bytes() {
        // The engine takes no allocated peak after a free (it can only fall there); a replay
        // that checks invariants says so when a policy's free raises it after all.
        let t = text::read(
            &b"alloc 0x1000 4096 s0\nfree 0x1000 4096 s0\n"[..],
            &ReadOptions::default(),
        )
        .unwrap();
        let input = ReplayInput::new(&t, None).unwrap();
        let checked = ReplayOptions { check_invariants: true, ..ReplayOptions::default() };
        let err = run_policy("toy", FreeRaisesAllocated(0, 0), &input, &checked).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("a free raised its allocated bytes from 4096 to 4097"),
            "{message}"
        );
        // The text format's free is a free_requested (event 1) and a free_completed (event 2),
        // where the free takes effect.
        assert!(message.starts_with("event 2:"), "{message}");
        // Unchecked, the replay runs: its peak is the one after the alloc.
        let out = run_policy("toy", FreeRaisesAllocated(0, 0), &input, &ReplayOptions::default())
            .unwrap();
        assert_eq!(out.result.peak_allocated_bytes, 4096);
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn fragmentation_at_peak_is_read_when_reserved_first_reaches_its_peak() {
        // Reserved grows to 200 MiB at event 1 (both blocks live: nothing cached), then stays
        // there while a block is freed (event 2) and a smaller one reuses its cached memory
        // (event 3): a plateau whose later moments have a lower allocated share.
        let src = format!(
            "alloc 0x1000 {a} s0\nalloc 0x2000 {a} s0\nfree 0x1000 {a} s0\nalloc 0x3000 {b} s0\n",
            a = 100 * MIB,
            b = 50 * MIB
        );
        let t = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
        let input = ReplayInput::new(&t, None).unwrap();
        let opts = ReplayOptions { keep_series: true, ..ReplayOptions::default() };
        let out = run_policy("pytorch", PyTorch::new(Config::default()), &input, &opts).unwrap();
        let r = &out.result;
        assert_eq!(r.peak_reserved_bytes, 200 * MIB);
        // The plateau really has later moments with less allocated: a later reading would differ.
        let points = out.series.as_ref().unwrap().points();
        let later: Vec<&Point> =
            points.iter().filter(|p| p.reserved == 200 * MIB && p.event > 1).collect();
        assert!(!later.is_empty());
        assert!(later.iter().all(|p| p.allocated < 200 * MIB), "{later:?}");
        // The first moment of the peak is event 1, where everything reserved is allocated.
        assert_eq!(r.peak_event, 1);
        assert_eq!(out.detail.peak_reserved_event, 1);
        assert_eq!(out.detail.allocated_at_peak_bytes, 200 * MIB);
        assert_eq!(r.fragmentation_at_peak, 0.0);
    }
}
