//! A replay's input: one device's events, where they come from (memory or an `.fst` file), the
//! blocks live before the first event, and what the recording says about flushes and pools —
//! prepared once, before any policy runs, and read-only after.

use super::lockstep;
use super::options::ReplayOptions;
use crate::error::{Error, Result};
use crate::policy::PolicyContext;
use crate::recorded::CapacityKind;
use crate::trace::fst::FstStream;
use crate::trace::lifetimes::{
    live_at_start_of, AddrMap, AddrSet, EmptyCacheRuns, FlushCauses, Lifetimes, LiveBlock, Retried,
};
use crate::trace::limits::STREAMS_PER_DEVICE;
use crate::trace::pool_routes::PoolRoutes;
use crate::trace::{Action, Event, Trace};

/// One device's events, ready to replay: built once by [`ReplayInput::new`] (loaded events) or
/// [`ReplayInput::streamed`] (an `.fst` file), then read by every policy's replay. Its parts are
/// derived from one another (the slots from the events and the live blocks, the live blocks from
/// the lifetimes), so they are private: read them through the accessors.
pub struct ReplayInput<'a> {
    /// The whole trace (policies may read its segments and recorded settings).
    trace: &'a Trace,
    /// The device replayed.
    device: i32,
    /// Where the events come from.
    source: Source<'a>,
    /// Blocks live before the first event (see [`live_at_start_of`]).
    live_at_start: Vec<LiveBlock>,
    /// Where the recorded program called `empty_cache()`: the index of each call's first event,
    /// in order (see [`EmptyCacheRuns`]).
    empty_cache_at: Vec<u64>,
    /// The events of a Kineto trace before which the recorded reserve fell: the program (or an
    /// out-of-memory retry) released cached memory there, which no event records
    /// ([`Trace::reserve_falls`]), in order. Empty for other formats.
    released_before: Vec<u64>,
    /// The runs of releases the recording leaves undecided between an `empty_cache()` call and
    /// an out-of-memory fallback, in order ([`EmptyCacheRuns::finish_with_undecided`]): a
    /// policy that models the recorded allocator decides each
    /// ([`Policy::would_serve_from_cache`](crate::policy::Policy::would_serve_from_cache)).
    undecided_flushes: Vec<Retried>,
    /// The recorded `oom` entries that show a graph capture underway: no release of their
    /// malloc precedes them, though the recorded cache held memory its fallback would have
    /// released ([`crate::trace::captures`]). Empty for a streamed replay.
    captured_ooms: Vec<u64>,
    /// The recording's exact-address allocations (`mallocWithAddress`,
    /// [`crate::trace::exact::pairs`]), placed where recorded. Empty for a streamed replay.
    exact_addresses: Vec<crate::trace::exact::ExactAddress>,
    /// Which recorded allocations were made into a private pool, as of the first event (`None`
    /// when the dump shows no private pool); each replay follows a copy through the events.
    pool_routes: Option<PoolRoutes>,
    /// The action at which frees take effect (see [`crate::trace::lifetimes::free_action`]).
    frees_at: Action,
    /// The lifetime scan of the events handed to policies (the loaded events, or a streamed
    /// replay's digest), from which `live_at_start` follows; kept for [`PolicyContext`].
    lifetimes: Lifetimes,
    /// The recorded peak of reserved bytes, found only where a policy needs it: for a snapshot
    /// whose settings record a `per_process_memory_fraction`, since the fraction's limit let that
    /// peak through and so bounds the GPU's memory from below
    /// ([`Config::least_gpu_memory_for`](crate::policy::pytorch::Config::least_gpu_memory_for)).
    recorded_peak_reserved: Option<u64>,
    /// What the recording's allocator added to each request before rounding it
    /// ([`Flavour::pad`](crate::policy::pytorch::Flavour::pad)): a failed request's `oom` entry
    /// records the rounded size, and the request behind it is that much smaller.
    oom_pad: u64,
}

/// Where a replay's events come from: one list in memory, or a file read record by record.
pub(super) enum Source<'a> {
    /// Held in memory, with the slot of every event the engine acts on, found once so that
    /// every policy's replay follows small indices instead of hashing addresses ([`Slots`]).
    Loaded {
        /// The device's events.
        events: &'a [Event],
        /// Their slots.
        slots: Slots,
    },
    /// Streamed from an `.fst` file; the replay keeps a map of the live blocks instead of slots
    /// ([`Keyed`](super::blocks::Keyed)).
    Streamed(Streamed<'a>),
}

/// What a replay streamed from a file knows of its events before the first policy runs.
pub(super) struct Streamed<'a> {
    /// The file.
    pub(super) file: &'a FstStream,
    /// The device's number of events.
    pub(super) events: u64,
    /// The first event's time.
    pub(super) first_time_us: i64,
    /// The events that decide the start state ([`digest`](crate::trace::lifetimes::digest)),
    /// handed to policies in place of the events.
    pub(super) digest: Vec<Event>,
    /// Who decodes the file for this replay.
    pub(super) reader: Reader,
}

/// Who decodes a streamed replay's file.
pub(super) enum Reader {
    /// The replay reads the file itself.
    Own,
    /// A reader shared with other replays decodes it once for all ([`lockstep`]).
    Shared(lockstep::Feed),
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
pub(super) struct Slots {
    /// The events the engine may act on, in order, each with its slot.
    pub(super) ops: Vec<Op>,
    /// Number of slots the replay uses.
    pub(super) count: usize,
}

/// An event the engine may act on ([`Slots::acts_on`]): its index and its slot, with its flag
/// ([`Slots::NONE`] for an event that names no block).
#[derive(Clone, Copy, Debug)]
pub(super) struct Op {
    pub(super) event: u32,
    pub(super) slot: u32,
}

impl Slots {
    /// No slot: not an alloc or a free that takes effect, or a free of an address not live.
    pub(super) const NONE: u32 = u32::MAX;
    /// On an alloc's slot: the slot still holds the block whose address the alloc reuses.
    pub(super) const DISPLACES: u32 = 1 << 31;

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
        let causes = FlushCauses::of(&trace.frames);
        let mut runs = EmptyCacheRuns::new(causes.clone());
        for (i, e) in events.iter().enumerate() {
            runs.push(i as u64, e);
        }
        let (empty_cache_at, undecided_flushes) =
            runs.finish_with_undecided(!crate::trace::lifetimes::may_collect_garbage(trace));
        let ooms_without_release =
            crate::trace::lifetimes::ooms_without_release(events, &causes, &empty_cache_at);
        let captured_ooms = crate::trace::captures::captures_proven(
            trace,
            device,
            events,
            &lifetimes,
            &live_at_start,
            &ooms_without_release,
            crate::policy::RecordedAllocator::of(trace).pages,
        );
        let pool_routes = PoolRoutes::new(trace, device, events, &lifetimes);
        let marked: Vec<u64> = (trace.extras.malloc_with_address_events.iter())
            .filter(|&&(d, _)| d == device)
            .map(|&(_, i)| i)
            .collect();
        let exact_addresses = crate::trace::exact::pairs(events, &marked);
        Ok(ReplayInput {
            trace,
            device,
            source: Source::Loaded { events, slots },
            live_at_start,
            empty_cache_at,
            released_before: trace.reserve_falls(device),
            undecided_flushes,
            captured_ooms,
            exact_addresses,
            pool_routes,
            frees_at,
            lifetimes,
            recorded_peak_reserved: records_fraction(trace)
                .then(|| crate::recorded::recorded(trace, device))
                .flatten()
                .map(|r| r.peak_reserved_bytes),
            oom_pad: oom_pad(trace),
        })
    }

    /// Picks `device` (default: the device with the most events) of an `.fst` file and prepares
    /// to stream its events: two passes over the file (the first also checks all of it as
    /// loading would; a third, up to the last candidate, when a free of an address not live
    /// may follow an alloc of it) find where frees take effect, the `empty_cache()` calls, and
    /// the `digest` from which the blocks live at the start follow. Every policy's replay then
    /// reads the file again; memory follows the live blocks, not the trace's length.
    pub fn streamed(file: &'a FstStream, device: Option<i32>) -> Result<ReplayInput<'a>> {
        let have = || file.devices().into_iter().map(|d| d.0).collect::<Vec<_>>();
        let device = pick_device(device, file.default_device(), have)?;
        let trace = file.head();
        let (mut completes, mut ooms) = (false, false);
        let causes = FlushCauses::of(&trace.frames);
        let mut runs = EmptyCacheRuns::new(causes.clone());
        let mut first_time_us = None;
        let mut streams = AddrSet::default();
        file.each_event(device, u64::MAX, true, |i, e| {
            completes |= e.action == Action::FreeCompleted;
            ooms |= e.action == Action::Oom;
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
            runs.finish_with_undecided(!crate::trace::lifetimes::may_collect_garbage(trace));
        // The digest keeps each address's first segment event, all the routes need.
        let pool_routes = PoolRoutes::new(trace, device, &digest, &lifetimes);
        let live_at_start = live_at_start_of(trace, device, &lifetimes);
        let captured_ooms = match ooms {
            true => {
                let calls = (&causes, &empty_cache_at[..]);
                captured_ooms_streamed(file, device, calls, &live_at_start, frees_at)?
            }
            false => Vec::new(),
        };
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
            source: Source::Streamed(Streamed {
                file,
                events: file.events_of(device).unwrap_or(0),
                first_time_us: first_time_us.unwrap_or(0),
                digest,
                reader: Reader::Own,
            }),
            live_at_start,
            empty_cache_at,
            released_before: Vec::new(),
            undecided_flushes,
            captured_ooms,
            exact_addresses: Vec::new(),
            pool_routes,
            frees_at,
            lifetimes,
            recorded_peak_reserved,
            oom_pad: oom_pad(trace),
        })
    }

    /// The request behind a recorded `oom` entry of `size` bytes: the entry records the request
    /// as the recording's allocator padded and rounded it, and some allocators pad
    /// ([`Flavour::pad`](crate::policy::pytorch::Flavour::pad)).
    pub(crate) fn oom_request(&self, size: u64) -> u64 {
        if size > self.oom_pad {
            size - self.oom_pad
        } else {
            size
        }
    }

    /// The trace the events come from (policies read its segments and recorded settings).
    pub fn trace(&self) -> &'a Trace {
        self.trace
    }

    /// The device replayed.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The device's events when they are held in memory; `None` when they stream from a file
    /// (`ReplayInput::load_events` reads them then).
    pub fn loaded_events(&self) -> Option<&'a [Event]> {
        match self.source {
            Source::Loaded { events, .. } => Some(events),
            Source::Streamed(_) => None,
        }
    }

    /// Where the events come from (for the engine's walk).
    pub(super) fn source(&self) -> &Source<'a> {
        &self.source
    }

    /// Blocks live before the first event, in address order: every policy carries them.
    pub fn live_at_start(&self) -> &[LiveBlock] {
        &self.live_at_start
    }

    /// The index of the first event of each `empty_cache()` call the recorded program made.
    pub fn empty_cache_at(&self) -> &[u64] {
        &self.empty_cache_at
    }

    /// The events before which a Kineto trace's recorded reserve fell (cached memory was
    /// released there), in order.
    pub fn released_before(&self) -> &[u64] {
        &self.released_before
    }

    /// The release runs the recording leaves undecided between an `empty_cache()` call and an
    /// out-of-memory fallback, in order.
    pub(crate) fn undecided_flushes(&self) -> &[Retried] {
        &self.undecided_flushes
    }

    /// The recorded `oom` entries made while a graph capture was underway, in order: no release
    /// of their malloc precedes them, where the recorded cache held memory to release
    /// (docs/pytorch-model.md#capture-oom).
    pub fn captured_ooms(&self) -> &[u64] {
        &self.captured_ooms
    }

    /// The recording's exact-address allocations, in order of their prefixes.
    pub(crate) fn exact_addresses(&self) -> &[crate::trace::exact::ExactAddress] {
        &self.exact_addresses
    }

    /// The action at which frees take effect (`free_completed`, or `free_requested` in formats
    /// that record one kind of free).
    pub fn frees_at(&self) -> Action {
        self.frees_at
    }

    /// Which recorded allocations went into a private pool, as of the first event.
    pub(super) fn pool_routes(&self) -> Option<&PoolRoutes> {
        self.pool_routes.as_ref()
    }

    /// The time of the first event.
    pub(super) fn first_time_us(&self) -> i64 {
        match &self.source {
            Source::Loaded { events, .. } => events.first().map_or(0, |e| e.time_us),
            Source::Streamed(s) => s.first_time_us,
        }
    }

    /// The device's number of events (loaded or streamed).
    pub fn event_count(&self) -> u64 {
        match &self.source {
            Source::Loaded { events, .. } => events.len() as u64,
            Source::Streamed(s) => s.events,
        }
    }

    /// True when the events stream from a file instead of being held.
    pub fn is_streamed(&self) -> bool {
        matches!(self.source, Source::Streamed(_))
    }

    /// The device's events, read from the file when streamed: for a policy that plans with
    /// all of them (`offline`).
    pub(crate) fn load_events(&self) -> Result<Vec<Event>> {
        let s = match &self.source {
            Source::Loaded { events, .. } => return Ok(events.to_vec()),
            Source::Streamed(s) => s,
        };
        let mut out = Vec::with_capacity(s.events.min(1 << 24) as usize);
        s.file.each_event(self.device, u64::MAX, false, |_, e| {
            out.push(*e);
            Ok(())
        })?;
        Ok(out)
    }

    /// The same input, streamed as `s` (its own source), with its events taken from `feed`, a
    /// reader shared with other replays, instead of read from the file: one replay of a
    /// [`lockstep`] group.
    pub(super) fn fed(&self, s: &Streamed<'a>, feed: lockstep::Feed) -> ReplayInput<'a> {
        ReplayInput {
            trace: self.trace,
            device: self.device,
            source: Source::Streamed(Streamed {
                file: s.file,
                events: s.events,
                first_time_us: s.first_time_us,
                digest: s.digest.clone(),
                reader: Reader::Shared(feed),
            }),
            live_at_start: self.live_at_start.clone(),
            empty_cache_at: self.empty_cache_at.clone(),
            released_before: self.released_before.clone(),
            undecided_flushes: self.undecided_flushes.clone(),
            captured_ooms: self.captured_ooms.clone(),
            exact_addresses: self.exact_addresses.clone(),
            pool_routes: self.pool_routes.clone(),
            frees_at: self.frees_at,
            lifetimes: self.lifetimes.clone(),
            recorded_peak_reserved: self.recorded_peak_reserved,
            oom_pad: self.oom_pad,
        }
    }
}

/// The recorded `oom` entries of `device` in a streamed file that prove a graph capture
/// ([`crate::trace::captures`]), as a loaded replay finds them: one pass finds the candidates
/// (those no release of their own malloc precedes, `calls` being the releases' causes and the
/// program's `empty_cache()` calls) and keeps the segment events, a second follows the recorded
/// cache up to the last candidate. Only a file with an `oom` entry pays.
fn captured_ooms_streamed(
    file: &FstStream,
    device: i32,
    (causes, empty_cache_at): (&FlushCauses, &[u64]),
    live_at_start: &[LiveBlock],
    frees_at: Action,
) -> Result<Vec<u64>> {
    use crate::trace::captures::{CaptureProof, Start};
    let trace = file.head();
    let mut candidates = crate::trace::lifetimes::OomsWithoutRelease::new(causes, empty_cache_at);
    let mut segment_events = Vec::new();
    file.each_event(device, u64::MAX, false, |i, e| {
        candidates.push(i, e);
        if e.action.is_segment_event() {
            segment_events.push(*e);
        }
        Ok(())
    })?;
    let candidates = candidates.finish();
    let Some(&last) = candidates.last() else { return Ok(Vec::new()) };
    let pages = crate::policy::RecordedAllocator::of(trace).pages;
    let start = Start { live_at_start, segment_events: segment_events.iter(), pages, frees_at };
    let mut proof = CaptureProof::new(trace, device, start, &candidates);
    file.each_event(device, last + 1, false, |i, e| {
        proof.push(i, e);
        Ok(())
    })?;
    Ok(proof.finish())
}

/// What the allocator that recorded `trace` added to each request before rounding it.
fn oom_pad(trace: &Trace) -> u64 {
    crate::policy::RecordedAllocator::of(trace).request_pad
}

/// Whether `trace`'s recorded allocator settings set a `per_process_memory_fraction`.
fn records_fraction(trace: &Trace) -> bool {
    crate::policy::RecordedAllocator::of(trace).memory_fraction
}

/// The device a replay runs on: `asked`, or the default; errors list the devices there are.
pub(crate) fn pick_device(
    asked: Option<i32>,
    default: Option<i32>,
    have: impl Fn() -> Vec<i32>,
) -> Result<i32> {
    let device = match asked {
        Some(d) => d,
        None => default.ok_or_else(|| {
            Error::input("the trace has no events").at(crate::error::Place::Event(0))
        })?,
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
    pub fn context<'s>(&'s self, options: &'s ReplayOptions) -> PolicyContext<'s> {
        PolicyContext {
            trace: self.trace,
            device: self.device,
            events: match &self.source {
                Source::Loaded { events, .. } => events,
                Source::Streamed(s) => &s.digest,
            },
            live_at_start: &self.live_at_start,
            lifetimes: &self.lifetimes,
            capacity: options.capacity,
            gpu_memory: match options.capacity_kind {
                CapacityKind::GpuMemory => options.capacity,
                CapacityKind::AllocatorLimit => None,
            },
            recorded_peak_reserved: self.recorded_peak_reserved,
            cancel: &options.cancel,
            exported: options.record_events,
        }
    }
}
