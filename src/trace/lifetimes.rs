//! Block lifetimes as the trace itself shows them: where frees take effect, which frees have no
//! alloc before them, which blocks were live at the first event.
//!
//! Most snapshots start mid-run (the ring buffer, or recording enabled late): blocks allocated
//! before the first event show up only as frees (orphan frees) or as `active_allocated` blocks in
//! the final segments that no `alloc` event produced. These are facts about the recording, not
//! about any allocator, so they live beside the trace model: readers, `info`, the replay engine
//! and the policies that recover a start state all read them from here, and the orphan-free scan
//! is written once (`scan`).

use super::{Action, BlockState, DeviceTrace, Event, Frame, FrameTable, FramesId, Trace};
use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A block live at the first event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// The address the recording knows it by.
    pub addr: u64,
    /// The request size, as far as known (the free's size, or the final block's requested size).
    pub size: u64,
    /// The allocation stream.
    pub stream: u64,
    /// True when the block is freed inside the trace (an orphan free); false when it lives on
    /// to the end (it appears only in the final segments).
    pub freed_in_trace: bool,
}

/// What one pass over a device's events finds about block lifetimes (see `scan`).
#[derive(Clone, Debug)]
pub struct Lifetimes {
    /// The action at which frees take effect (see [`free_action`]).
    pub frees_at: Action,
    /// The orphan frees in trace order: the first free of each address that no earlier event
    /// allocated.
    pub orphans: Vec<LiveBlock>,
    /// Every address an `alloc` event names.
    pub allocated: AddrSet,
    /// The index of every segment event (`segment_alloc`, `_free`, `_map`, `_unmap`), in trace
    /// order: the few events a start-state recovery walks, found here so that it does not read
    /// every event again.
    pub segment_events: Vec<usize>,
}

/// How far past an orphan's address (request `size`) its block can end, whatever the allocator's
/// settings: its rounded size (padding and `roundup_power2_divisions` add at most half of it, and
/// 512 bytes) plus the up to 1 MiB of a large-pool block handed out unsplit, with room to spare.
/// The first `alloc` within it, before the orphan's free, can prove the orphan's block size, so a
/// [`digest`] keeps it.
pub(crate) fn orphan_reach(size: u64) -> u64 {
    size.saturating_mul(2).saturating_add(2 << 20)
}

/// The one orphan-free scan: finds where frees take effect, the orphan frees in trace order, and
/// every allocated address.
pub(crate) fn scan(events: &[Event]) -> Lifetimes {
    let frees_at = free_action(events);
    let mut allocated = AddrSet::default();
    let mut orphaned = AddrSet::default();
    let mut orphans = Vec::new();
    let mut segment_events = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                allocated.insert(e.addr);
            }
            a if a == frees_at && !allocated.contains(&e.addr) && orphaned.insert(e.addr) => {
                orphans.push(LiveBlock {
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    freed_in_trace: true,
                });
            }
            a if a.is_segment_event() => segment_events.push(i),
            _ => {}
        }
    }
    Lifetimes { frees_at, orphans, allocated, segment_events }
}

/// The blocks live at the first of `events`, in address order: orphan frees, and blocks that
/// the final segments of `device` in `trace` show allocated but that no event allocated.
pub(crate) fn live_at_start(trace: &Trace, device: i32, events: &[Event]) -> Vec<LiveBlock> {
    live_at_start_of(trace, device, &scan(events))
}

/// [`live_at_start`] from the [`scan`] of the events, for a caller that keeps the scan.
pub(crate) fn live_at_start_of(
    trace: &Trace,
    device: i32,
    lifetimes: &Lifetimes,
) -> Vec<LiveBlock> {
    let Lifetimes { orphans, allocated, .. } = lifetimes;
    let mut orphans = orphans.clone();
    let orphaned: AddrSet = orphans.iter().map(|b| b.addr).collect();
    for seg in trace.segments_of(device) {
        for b in &seg.blocks {
            let live =
                matches!(b.state, BlockState::ActiveAllocated | BlockState::ActivePendingFree);
            if live && !allocated.contains(&b.address) && !orphaned.contains(&b.address) {
                orphans.push(LiveBlock {
                    addr: b.address,
                    size: b.requested_size.max(1),
                    stream: seg.stream,
                    freed_in_trace: false,
                });
            }
        }
    }
    orphans.sort_by_key(|b| b.addr);
    orphans
}

/// The blocks live at the first of `events` that the events alone show: frees of addresses
/// with no earlier alloc (orphan frees), in address order. [`live_at_start`] adds those that
/// only a snapshot's final segments show.
pub(crate) fn orphan_frees(events: &[Event]) -> Vec<LiveBlock> {
    let mut out = scan(events).orphans;
    out.sort_by_key(|b| b.addr);
    out
}

/// The action at which a free takes effect in `events`: `free_completed` when the trace has
/// any (PyTorch snapshots), else `free_requested` (traces that record one kind of free).
pub fn free_action(events: &[Event]) -> Action {
    if events.iter().any(|e| e.action == Action::FreeCompleted) {
        Action::FreeCompleted
    } else {
        Action::FreeRequested
    }
}

/// Why the recorded allocator released cached segments, as the stack a release recorded says.
///
/// PyTorch records each `segment_free` / `segment_unmap` with the stack of the call that
/// released it: `torch.cuda.empty_cache()` shows `empty_cache` (Python, `torch/cuda/memory.py`)
/// and `THCPModule_emptyCache` / `NativeCachingAllocator::emptyCache` (C++); a malloc's
/// out-of-memory fallback shows `release_cached_blocks` (or `release_available_cached_blocks`)
/// under `malloc`; garbage collection shows `garbage_collect_cached_blocks`. Where a release
/// carries such a stack, it decides; where it carries none, the recorded levels do
/// ([`EmptyCacheRuns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlushCause {
    /// The program called `empty_cache()`.
    EmptyCacheCall,
    /// A malloc whose `cudaMalloc` failed released the cache to retry: out of memory.
    OutOfMemory,
    /// Garbage collection before a malloc's first attempt (`garbage_collection_threshold`).
    GarbageCollection,
}

impl FlushCause {
    /// What `frames` (one release's stack, innermost first or last) say, if anything.
    pub(crate) fn of_stack(frames: &[Frame]) -> Option<FlushCause> {
        let has = |pred: &dyn Fn(&Frame) -> bool| frames.iter().any(pred);
        if has(&|f| {
            f.name.contains("emptyCache")
                || (f.name == "empty_cache" && f.filename.ends_with("torch/cuda/memory.py"))
        }) {
            return Some(FlushCause::EmptyCacheCall);
        }
        if has(&|f| f.name.contains("garbage_collect_cached_blocks")) {
            return Some(FlushCause::GarbageCollection);
        }
        let releases = has(&|f| f.name.contains("release_cached_blocks"))
            || has(&|f| f.name.contains("release_available_cached_blocks"));
        let in_malloc = has(&|f| f.name.contains("malloc"));
        (releases && in_malloc).then_some(FlushCause::OutOfMemory)
    }
}

/// `FlushCause::of_stack` for every stack of a [`FrameTable`], looked up by [`FramesId`]:
/// what [`EmptyCacheRuns`] consults for each release.
#[derive(Clone, Debug, Default)]
pub struct FlushCauses(Vec<Option<FlushCause>>);

impl FlushCauses {
    /// Classifies each stack of `table` once.
    pub fn of(table: &FrameTable) -> FlushCauses {
        let ids = 1..=table.len() as u32;
        FlushCauses(ids.map(|i| FlushCause::of_stack(table.get(FramesId(i)))).collect())
    }

    /// What the stack `id` says (`None`: no stack, or one that says nothing).
    pub fn get(&self, id: FramesId) -> Option<FlushCause> {
        id.0.checked_sub(1).and_then(|k| self.0.get(k as usize)).copied().flatten()
    }
}

impl FlushCauses {
    /// Whether the release `e`, inside a run already read as the program's `empty_cache()` call
    /// ([`read_run`]), was made by that call: its stack says so, or says nothing. A release
    /// whose stack names another cause belongs to another flush (a malloc's fallback).
    pub(crate) fn made_by_call(&self, e: &Event) -> bool {
        matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
            && self.get(e.frames).is_none_or(|c| c == FlushCause::EmptyCacheCall)
    }

    /// Whether a release whose stack says `next` ends the run whose stacks said `run` so far
    /// and starts another flush: both stacks tell, and they name different causes
    /// (`empty_cache()`, then a malloc that ran out of memory).
    pub(crate) fn ends_run(run: Option<FlushCause>, next: Option<FlushCause>) -> bool {
        matches!((run, next), (Some(c), Some(d)) if c != d)
    }
}

/// Whether `trace`'s recorded allocator had `garbage_collection_threshold` set, so that it may
/// have released cached memory before a malloc's first attempt: a release run a retried
/// allocation follows then proves nothing ([`Levels::ProveNothing`]).
pub(crate) fn may_collect_garbage(trace: &Trace) -> bool {
    trace.allocator_settings.as_ref().is_some_and(|s| s.garbage_collection_threshold > 0.0)
}

/// What follows a run of recorded releases (and the `free_completed` among and after them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterRun {
    /// No allocation of the same malloc: another event, another flush, or the recording's end.
    Nothing,
    /// A retried allocation (a `segment_alloc`, or `segment_map`s) that needed the reserved
    /// level `need`: the level before the releases plus the retried bytes.
    Retry {
        /// The level the retry needed, in the frame of the [`Levels`] it is read with.
        need: i128,
    },
    /// An `oom` entry: the allocation failed.
    Failed,
}

/// What the recorded reserved levels can say of a release run a retried allocation follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Levels {
    /// Not known yet (a recording read one event at a time, before its end).
    Pending,
    /// Nothing: the allocator may release memory before its first attempt
    /// (`may_collect_garbage`), so a retry proves no failed one.
    ProveNothing,
    /// The highest reserved level the recording shows, and the device limit its `oom` entries
    /// agree on (reserved plus the device's free bytes), if they agree on one.
    Served {
        /// The recorded peak reserved level.
        peak: i128,
        /// The limit the `oom` entries measure.
        limit: Option<i128>,
    },
}

/// What a run of recorded releases was, as `read_run` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunReading {
    /// Its stack shows the program's `empty_cache()` call.
    CalledByStack,
    /// No allocation follows it: the program's `empty_cache()` call.
    Called,
    /// A retry follows at a level no higher than the recorded peak: the device served more, so
    /// no attempt failed; the program's call.
    CalledBelowPeak,
    /// A retry follows above the peak but at most at the limit the `oom` entries measure: the
    /// program's call.
    CalledBelowLimit,
    /// Its stack shows a malloc's out-of-memory fallback (`release_cached_blocks` under
    /// `malloc`); `failed` when an `oom` entry follows (the retry failed too).
    FallbackByStack {
        /// An `oom` entry follows.
        failed: bool,
    },
    /// Its stack shows garbage collection before a malloc's first attempt.
    CollectedByStack,
    /// A retry follows and the levels are not known yet ([`Levels::Pending`]): read it again
    /// with them.
    Retried {
        /// The level the retry needed.
        need: i128,
    },
    /// A retry follows above every level the recording shows the device serving: an
    /// out-of-memory fallback, or the program's call followed by an allocation needing new
    /// memory. The levels cannot tell; a model of the recorded allocator can
    /// (`replay::undecided_run_is_call`).
    AboveLevels,
    /// An `oom` entry follows and no stack tells: the malloc's own fallback, or the program's
    /// call right before a malloc that then found nothing. Only a model can tell.
    Failed,
    /// A retry follows but the levels prove nothing ([`Levels::ProveNothing`]).
    Unproven,
}

impl RunReading {
    /// True when the run was the program's `empty_cache()` call.
    pub(crate) fn is_call(self) -> bool {
        matches!(
            self,
            RunReading::CalledByStack
                | RunReading::Called
                | RunReading::CalledBelowPeak
                | RunReading::CalledBelowLimit
        )
    }

    /// True when neither the stacks nor the levels tell a call from a fallback (or from garbage
    /// collection): only a model of the recorded allocator can.
    pub(crate) fn is_undecided(self) -> bool {
        matches!(self, RunReading::AboveLevels | RunReading::Failed | RunReading::Unproven)
    }
}

/// Whether a run of recorded releases was the program's `empty_cache()` call or a malloc's
/// out-of-memory fallback: the one rule that a replay ([`EmptyCacheRuns`]), `validate` (which
/// takes a replay's calls) and the device-limit inference (`recorded::limit`) all follow
/// (docs/pytorch-model.md#recorded-flushes). `cause` is what the run's stacks say (the first
/// release with a telling stack, [`FlushCause`]), `after` what follows it, `levels` what the
/// recorded reserved levels can prove.
///
/// A telling stack decides. Without one, a run no allocation follows is a call; one a retried
/// allocation follows records what a fallback records (a failed `cudaMalloc`, the cache
/// released, the retry) and also what a call followed by an allocation needing a new segment
/// records, so the level the retry needed decides: at most the recorded peak, or the limit the
/// `oom` entries measure, the first attempt cannot have failed, so it was a call. Above them,
/// or before a failed allocation, the run is undecided.
pub(crate) fn read_run(cause: Option<FlushCause>, after: AfterRun, levels: Levels) -> RunReading {
    match (cause, after) {
        (Some(FlushCause::EmptyCacheCall), _) => RunReading::CalledByStack,
        (Some(FlushCause::OutOfMemory), a) => {
            RunReading::FallbackByStack { failed: a == AfterRun::Failed }
        }
        (Some(FlushCause::GarbageCollection), _) => RunReading::CollectedByStack,
        (None, AfterRun::Nothing) => RunReading::Called,
        (None, AfterRun::Failed) => RunReading::Failed,
        (None, AfterRun::Retry { need }) => match levels {
            Levels::Pending => RunReading::Retried { need },
            Levels::ProveNothing => RunReading::Unproven,
            Levels::Served { peak, .. } if need <= peak => RunReading::CalledBelowPeak,
            Levels::Served { limit: Some(l), .. } if need <= l => RunReading::CalledBelowLimit,
            Levels::Served { .. } => RunReading::AboveLevels,
        },
    }
}

#[cfg(test)]
/// For each event, true where the recorded program released cached memory on its own: a run of
/// `segment_free` / `segment_unmap` whose stack shows `empty_cache()` ([`FlushCause`]), or, with
/// no telling stack, that is not part of a malloc's fallback, i.e. not followed (after any
/// `free_completed`) by a `segment_alloc`, `segment_map` or `oom` of the same malloc.
/// Such runs are `empty_cache()` calls (see docs/pytorch-model.md#recorded-flushes). Only the
/// first event of each run is marked.
/// `causes` classifies the events' stacks ([`FlushCauses::of`] the trace's frames).
/// [`EmptyCacheRuns`] finds the same calls one event at a time, and also the calls a retried
/// allocation follows that the recording proves were no OOM.
pub(crate) fn empty_cache_points(events: &[Event], causes: &FlushCauses) -> Vec<bool> {
    let mut marks = vec![false; events.len()];
    let mut runs = EmptyCacheRuns::new(causes.clone());
    for (i, e) in events.iter().enumerate() {
        runs.push(i as u64, e);
    }
    for i in runs.finish(false) {
        marks[i as usize] = true;
    }
    marks
}

/// The `empty_cache()` calls of a recording, found one event at a time (for a trace streamed
/// from a file too): the index of each call's first event, in order.
///
/// A run of releases that no allocation follows is a call (`empty_cache_points`). One that a
/// `segment_alloc` (or `segment_map`s) follows records what an OOM fallback records, a failed
/// `cudaMalloc`, the cache released, the retry, and also what `empty_cache()` followed by an
/// allocation needing a new segment records. The reserved level tells them apart (the device
/// limit's module docs, `recorded::limit`): if the level the retry needed (reserved before the
/// releases plus the retried bytes) is at most the recording's peak reserved, the device served
/// more than that elsewhere, so it was no OOM but a call; and likewise up to the device limit
/// the `oom` entries measure (reserved plus the device's free bytes), where they all agree on
/// one. Levels are kept relative to the first event, which is all the comparisons need. It holds
/// the calls found, the candidates of the second kind and the run being read, nothing per event.
#[derive(Clone, Debug, Default)]
pub struct EmptyCacheRuns {
    /// What each release's stack says ([`FlushCause`]).
    causes: FlushCauses,
    /// The run being read: its first index and the reserved level before it.
    run: Option<(u64, i128)>,
    /// What the stacks of the run being read say (the first release with a telling stack).
    run_cause: Option<FlushCause>,
    /// A run followed by `segment_map`s, still summing them: its first index and the level the
    /// maps need so far.
    mapping: Option<(u64, i128)>,
    /// Runs followed by a retried (or failed) allocation: first index, what followed, and the
    /// request the retry served (the `alloc` after it, or the failed `oom`), once seen.
    retried: Vec<(u64, AfterRun, Option<Retried>)>,
    /// Whether the last of `retried` still waits for its `alloc`.
    awaiting_alloc: bool,
    calls: Vec<u64>,
    /// Reserved bytes relative to the first event, and their highest value (0 at the start).
    level: i128,
    peak: i128,
    /// The device limit the `oom` entries measure, relative as `level`: `None` before the first,
    /// `Some(None)` once two disagree.
    limit: Option<Option<i128>>,
}

impl EmptyCacheRuns {
    /// Finds the calls of a recording whose releases' stacks `causes` classifies
    /// ([`FlushCauses::of`] the trace's frames); [`EmptyCacheRuns::default`] for one without
    /// stacks.
    pub(crate) fn new(causes: FlushCauses) -> EmptyCacheRuns {
        EmptyCacheRuns { causes, ..EmptyCacheRuns::default() }
    }

    /// Takes the next event and its index.
    #[inline]
    pub(crate) fn push(&mut self, index: u64, e: &Event) {
        let action = e.action;
        let size = e.size as i128;
        if let Some((start, need)) = self.mapping.take() {
            match action {
                Action::SegmentMap => self.mapping = Some((start, need + size)),
                _ => self.push_retried(start, need),
            }
        }
        if self.awaiting_alloc && action == Action::Alloc {
            self.awaiting_alloc = false;
            if let Some(last) = self.retried.last_mut() {
                let (size, stream) = (e.size, e.stream);
                let request = index;
                last.2 = Some(Retried { event: last.0, request, size, stream, failed: false });
            }
        }
        let flush = matches!(action, Action::SegmentFree | Action::SegmentUnmap);
        let cause = if flush { self.causes.get(e.frames) } else { None };
        // Releases whose stacks name another cause than the run's so far are another flush
        // (`empty_cache()`, then a malloc that ran out of memory): the run ends before them.
        if let Some((start, _)) = self.run.filter(|_| FlushCauses::ends_run(self.run_cause, cause))
        {
            self.run = None;
            if read_run(self.run_cause.take(), AfterRun::Nothing, Levels::Pending).is_call() {
                self.calls.push(start);
            }
        }
        match self.run {
            Some(_) if flush && self.run_cause.is_none() => self.run_cause = cause,
            Some(_) if flush => {}
            Some(_) if action == Action::FreeCompleted => {}
            Some((start, before)) => {
                self.run = None;
                let after = match action {
                    Action::SegmentAlloc | Action::SegmentMap => {
                        AfterRun::Retry { need: before + size }
                    }
                    Action::Oom => AfterRun::Failed,
                    _ => AfterRun::Nothing,
                };
                match read_run(self.run_cause.take(), after, Levels::Pending) {
                    r if r.is_call() => self.calls.push(start),
                    // The `segment_map`s that follow add to what the retry needed.
                    RunReading::Retried { need } if action == Action::SegmentMap => {
                        self.mapping = Some((start, need))
                    }
                    RunReading::Retried { need } => self.push_retried(start, need),
                    // The malloc failed: its fallback released the cache, or the program
                    // called empty_cache() and the malloc then found nothing.
                    RunReading::Failed => {
                        let (size, stream) = (e.size, e.stream);
                        let failed =
                            Retried { event: start, request: index, size, stream, failed: true };
                        self.retried.push((start, AfterRun::Failed, Some(failed)));
                    }
                    _ => {}
                }
            }
            None if flush => {
                self.run = Some((index, self.level));
                self.run_cause = cause;
            }
            None => {}
        }
        match action {
            Action::SegmentAlloc | Action::SegmentMap => self.level += size,
            Action::SegmentFree | Action::SegmentUnmap => self.level -= size,
            Action::Oom => {
                let measured = self.level + e.addr as i128; // reserved + the device's free bytes
                self.limit = match self.limit {
                    None => Some(Some(measured)),
                    Some(l) => Some(l.filter(|&l| l == measured)),
                };
                return;
            }
            _ => return,
        }
        self.peak = self.peak.max(self.level);
    }

    fn push_retried(&mut self, start: u64, need: i128) {
        self.retried.push((start, AfterRun::Retry { need }, None));
        self.awaiting_alloc = true;
    }

    #[cfg(test)]
    /// The calls, in event order, once every event has been pushed: the runs no allocation
    /// follows, and with `below_limit` also those whose retried allocation needed at most the
    /// recorded peak, or the device limit the `oom` entries agree on. Leave `below_limit` off
    /// where the allocator may release memory before its first attempt
    /// (`garbage_collection_threshold`), which makes such a run prove nothing.
    pub(crate) fn finish(self, below_limit: bool) -> Vec<u64> {
        self.finish_with_undecided(below_limit).0
    }

    /// [`EmptyCacheRuns::finish`], and the runs it could not decide: those a retried
    /// allocation follows above every level the recording shows the device serving. Either
    /// the first attempt failed and the allocator released its cache (an OOM fallback), or the
    /// program called `empty_cache()` and the allocation then needed new memory; the levels
    /// cannot tell which. A model of the recorded allocator can: only a request its cache could
    /// not serve falls back. In event order; with `below_limit` off, every run a retried or
    /// failed allocation follows (the levels prove nothing, [`read_run`]).
    pub(crate) fn finish_with_undecided(mut self, below_limit: bool) -> (Vec<u64>, Vec<Retried>) {
        let cause = self.run_cause.take();
        let last = self
            .run
            .take()
            .filter(|_| read_run(cause, AfterRun::Nothing, Levels::Pending).is_call());
        self.calls.extend(last.map(|(start, _)| start));
        if let Some((start, need)) = self.mapping.take() {
            self.retried.push((start, AfterRun::Retry { need }, None));
        }
        let mut undecided = Vec::new();
        let levels = match below_limit {
            true => Levels::Served { peak: self.peak, limit: self.limit.flatten() },
            false => Levels::ProveNothing,
        };
        for &(start, after, request) in &self.retried {
            let reading = read_run(None, after, levels);
            match request {
                _ if reading.is_call() => self.calls.push(start),
                Some(r) if reading.is_undecided() => undecided.push(r),
                // No request followed (a cut-off trace): nothing to ask.
                _ => {}
            }
        }
        self.calls.sort_unstable();
        (self.calls, undecided)
    }
}

/// The recorded `oom` entries (event indices, in order) that no release of their own malloc
/// precedes. PyTorch skips its release-everything fallback before an out-of-memory error only
/// while a graph capture is underway, or finds nothing to release: such an entry shows a
/// capture only where the recorded cache held memory that fallback would have released, which
/// [`captures_proven`](super::captures::captures_proven) asks of each; the others are ambiguous
/// and read as no capture. A malloc's releases are those in the run of segment events and
/// completed frees right before its entry, where that run is not the program's `empty_cache()`
/// call (`calls`: the first index of each, whose run takes the releases `causes` does not give
/// another cause, and the completed frees among them). The candidates of the one reading of
/// capture that `replay` and `validate` both follow.
pub(crate) fn ooms_without_release(
    events: &[Event],
    causes: &FlushCauses,
    calls: &[u64],
) -> Vec<u64> {
    let mut ooms = OomsWithoutRelease::new(causes, calls);
    for (i, e) in events.iter().enumerate() {
        ooms.push(i as u64, e);
    }
    ooms.finish()
}

/// [`ooms_without_release`] told one event at a time, in order (a replay streamed from a file
/// has no slice of events).
pub(crate) struct OomsWithoutRelease<'c> {
    causes: &'c FlushCauses,
    calls: &'c [u64],
    run: ReleaseRun,
    out: Vec<u64>,
}

/// The run of events [`OomsWithoutRelease`] is in.
#[derive(Clone, Copy)]
enum ReleaseRun {
    None,
    /// The program's `empty_cache()` call: its releases and the frees completed among them.
    Call,
    /// A malloc's segment events and the frees completed among them; whether one released.
    Malloc {
        released: bool,
    },
}

impl<'c> OomsWithoutRelease<'c> {
    pub(crate) fn new(causes: &'c FlushCauses, calls: &'c [u64]) -> Self {
        OomsWithoutRelease { causes, calls, run: ReleaseRun::None, out: Vec::new() }
    }

    /// Event `i`, `e`.
    pub(crate) fn push(&mut self, i: u64, e: &Event) {
        let release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        let completed = e.action == Action::FreeCompleted;
        match self.run {
            ReleaseRun::Call if self.causes.made_by_call(e) || completed => return,
            ReleaseRun::Malloc { released } if e.action.is_segment_event() || completed => {
                self.run = ReleaseRun::Malloc { released: released || release };
                return;
            }
            ReleaseRun::Malloc { released } if e.action == Action::Oom => {
                // The malloc's own entry.
                self.run = ReleaseRun::None;
                if !released {
                    self.out.push(i);
                }
                return;
            }
            _ => self.run = ReleaseRun::None,
        }
        if release && self.causes.made_by_call(e) && self.calls.binary_search(&i).is_ok() {
            self.run = ReleaseRun::Call;
        } else if e.action.is_segment_event() {
            self.run = ReleaseRun::Malloc { released: release };
        } else if e.action == Action::Oom {
            self.out.push(i);
        }
    }

    /// The `oom` entries found, in order.
    pub(crate) fn finish(self) -> Vec<u64> {
        self.out
    }
}

/// A run of recorded releases followed by a retried allocation that the levels cannot classify
/// (`EmptyCacheRuns::finish_with_undecided`), or by an allocation that failed: where it starts
/// and the request after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retried {
    /// The index of the run's first release.
    pub(crate) event: u64,
    /// The index of the request after it: its `alloc`, or its `oom` when `failed`.
    pub(crate) request: u64,
    /// The request the retried allocation served (its `alloc` event's size), or, when
    /// `failed`, the rounded size its `oom` entry records.
    pub(crate) size: u64,
    /// That request's stream.
    pub(crate) stream: u64,
    /// The allocation failed (an `oom` entry follows the run). Why such a run is undecided too:
    /// a program's `empty_cache()` right before a malloc that then runs out of memory records
    /// the same entries as that malloc's own fallback, and only the first kind leaves the cache
    /// empty before the malloc searches it.
    pub(crate) failed: bool,
}

/// The few events of a device that decide what lifetimes and start states are derived from it:
/// each orphan free (the first free of an address no earlier event allocated), the first `alloc`
/// of each address the final segments show live, the first segment event (`segment_alloc` or
/// `segment_free`, within the address space) of each segment address, every `segment_map` and
/// `segment_unmap` (within the address space), and what can bound an orphan's size before the last
/// orphan's free: each orphan's first `alloc` within its [reach](orphan_reach) before its free,
/// and, where no request went to a private pool, the cache misses (each `segment_alloc` with the
/// `alloc` placed at its start, and each `oom`), in trace order. [`live_at_start`] and [`scan`]'s orphans
/// on the digest equal those on the whole events, and so does the start state the `pytorch`
/// policy recovers, cudaMalloc segments and mapped pages alike (the pages mapped at the first
/// event are the dump's with every later mapping undone, so every mapping is kept). It is what a
/// replay streamed from a file hands the policies in place of the events.
///
/// `walk(limit, f)` must hand `f` the device's first `limit` events in order, from the start,
/// each time it is called: it is called once, and again for the orphan candidates only when an
/// earlier alloc of one cannot be ruled out, and for the proving allocs only when there are
/// some or orphans to bound. Memory: the blocks live at a time, the final segments' live
/// blocks, the segment addresses, the mappings (an expandable segment maps as it grows and
/// unmaps when the cache is released: a handful per step at most), the candidate orphans, each
/// allocated address's first index and the cache misses before the last orphan's free; not the
/// other events.
pub(crate) fn digest<W>(
    trace: &Trace,
    device: i32,
    frees_at: Action,
    mut walk: W,
) -> Result<Vec<Event>>
where
    W: FnMut(u64, &mut dyn FnMut(u64, &Event) -> Result<()>) -> Result<()>,
{
    let first = first_walk(trace, device, frees_at, &mut walk)?;
    // The cache misses (a new segment and the alloc placed at its start, or an `oom`), where
    // every request went to the default pools: they bound the orphans' sizes too.
    let default_pools =
        trace.entry_pools.is_none() && trace.segments_of(device).all(|s| s.private_pool.is_none());
    let second = second_walk(&first.candidates, default_pools, &mut walk)?;
    Ok(first.keep(second))
}

/// What [`digest`]'s first walk over every event finds.
struct FirstWalk {
    /// Each orphan candidate (the first free of an address not live then): the free's index,
    /// the free, and whether no alloc of its address came before (its bit in the set is clear).
    candidates: Vec<(u64, Event, bool)>,
    /// The first `alloc` of each address the final segments show live.
    final_live: AddrMap<Option<(u64, Event)>>,
    /// The first segment event of each segment address.
    segments: AddrMap<(u64, Event)>,
    /// Every `segment_map` and `segment_unmap`.
    mappings: Vec<(u64, Event)>,
}

/// What [`digest`]'s second walk, up to the last candidate, finds.
struct SecondWalk {
    /// The candidates' addresses that an alloc came before (no orphans then).
    allocated_first: AddrSet,
    /// Per candidate: its first `alloc` within its reach before its free.
    proofs: Vec<Option<(u64, Event)>>,
    /// The cache misses before the last candidate's free.
    misses: Vec<(u64, Event)>,
}

/// [`digest`]'s first walk: the orphan candidates, the final blocks' first allocs, the first
/// event of each segment and every mapping.
fn first_walk<W>(trace: &Trace, device: i32, frees_at: Action, walk: &mut W) -> Result<FirstWalk>
where
    W: FnMut(u64, &mut dyn FnMut(u64, &Event) -> Result<()>) -> Result<()>,
{
    let fits = |e: &Event| e.addr.checked_add(e.size).is_some_and(|end| end < 1 << 62);
    let mut final_live: AddrMap<Option<(u64, Event)>> = AddrMap::default();
    for seg in trace.segments_of(device) {
        for b in &seg.blocks {
            if matches!(b.state, BlockState::ActiveAllocated | BlockState::ActivePendingFree) {
                final_live.insert(b.address, None);
            }
        }
    }
    let mut live = AddrSet::default();
    // Every allocated address, hashed into a fixed bit set: a candidate whose bit is clear was
    // never allocated before, so it is an orphan without a second pass.
    let mut seen = vec![0u64; SEEN_WORDS];
    let bit = |addr: u64| {
        let mut h = AddrHasher::default();
        h.write_u64(addr);
        let k = h.finish() as usize % (SEEN_WORDS * 64);
        (k / 64, 1u64 << (k % 64))
    };
    let mut candidates: Vec<(u64, Event, bool)> = Vec::new();
    let mut orphaned = AddrSet::default();
    let mut segments: AddrMap<(u64, Event)> = AddrMap::default();
    let mut mappings: Vec<(u64, Event)> = Vec::new();
    walk(u64::MAX, &mut |i, e| {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr);
                let (w, m) = bit(e.addr);
                seen[w] |= m;
                if let Some(first @ None) = final_live.get_mut(&e.addr) {
                    *first = Some((i, *e));
                }
            }
            // A free of an address not live now, the first such: an orphan unless the address
            // was allocated and freed before.
            a if a == frees_at && !live.remove(&e.addr) && orphaned.insert(e.addr) => {
                let (w, m) = bit(e.addr);
                candidates.push((i, *e, seen[w] & m == 0));
            }
            Action::SegmentAlloc | Action::SegmentFree if fits(e) => {
                segments.entry(e.addr).or_insert((i, *e));
            }
            Action::SegmentMap | Action::SegmentUnmap if fits(e) => mappings.push((i, *e)),
            _ => {}
        }
        Ok(())
    })?;
    Ok(FirstWalk { candidates, final_live, segments, mappings })
}

/// [`digest`]'s second walk, when there are candidates, does two jobs. A candidate the bit set
/// cannot clear is an orphan only if no alloc of its address came first. And each orphan's first
/// alloc within its reach before its free can prove the orphan's size, as the cache misses
/// before the last orphan's free can bound it: gathered here, once the candidates are known,
/// rather than on the first walk, where remembering every address's first alloc or every miss
/// would grow with the trace (a steady run misses the cache every step) though a trace with no
/// orphan needs none of them.
fn second_walk<W>(
    candidates: &[(u64, Event, bool)],
    default_pools: bool,
    walk: &mut W,
) -> Result<SecondWalk>
where
    W: FnMut(u64, &mut dyn FnMut(u64, &Event) -> Result<()>) -> Result<()>,
{
    let unsure: AddrMap<u64> =
        candidates.iter().filter(|c| !c.2).map(|c| (c.1.addr, c.0)).collect();
    let horizon = candidates.iter().map(|c| c.0).max().unwrap_or(0);
    let miss_horizon = if default_pools { horizon } else { 0 };
    // (window start, window end inclusive, the orphan's free, which candidate), by start.
    let mut windows: Vec<(u64, u64, u64, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(k, &(at, o, _))| {
            (o.addr.saturating_add(1), o.addr.saturating_add(orphan_reach(o.size)), at, k)
        })
        .collect();
    windows.sort_unstable();
    let widest = windows.iter().map(|w| w.1 - w.0).max().unwrap_or(0);
    let mut proofs: Vec<Option<(u64, Event)>> = vec![None; candidates.len()];
    let mut misses: Vec<(u64, Event)> = Vec::new();
    let mut allocated_first = AddrSet::default();
    let limit = unsure.values().copied().max().unwrap_or(0).max(horizon);
    if limit > 0 {
        let mut new_segment: Option<u64> = None;
        walk(limit, &mut |i, e| {
            if e.action == Action::Alloc {
                if unsure.get(&e.addr).is_some_and(|&at| i < at) {
                    allocated_first.insert(e.addr);
                }
                let after = windows.partition_point(|w| w.0 <= e.addr);
                for w in windows[..after].iter().rev() {
                    if w.0.saturating_add(widest) < e.addr {
                        break;
                    }
                    if e.addr <= w.1 && i < w.2 && proofs[w.3].is_none() {
                        proofs[w.3] = Some((i, *e));
                    }
                }
            }
            if i < miss_horizon {
                let miss = match e.action {
                    Action::SegmentAlloc => true,
                    Action::Alloc => new_segment == Some(e.addr),
                    Action::Oom => e.size > 0,
                    _ => false,
                };
                if miss {
                    misses.push((i, *e));
                }
                match e.action {
                    Action::SegmentAlloc => new_segment = Some(e.addr),
                    Action::FreeRequested | Action::FreeCompleted => {}
                    _ => new_segment = None,
                }
            }
            Ok(())
        })?;
    }
    Ok(SecondWalk { allocated_first, proofs, misses })
}

impl FirstWalk {
    /// The digest: the candidates no alloc came before, their proving allocs, the misses before
    /// the last orphan's free, the final blocks' first allocs, the segments' first events and
    /// every mapping, in trace order.
    fn keep(self, second: SecondWalk) -> Vec<Event> {
        let SecondWalk { allocated_first, proofs, mut misses } = second;
        let keep: Vec<bool> =
            self.candidates.iter().map(|c| c.2 || !allocated_first.contains(&c.1.addr)).collect();
        let candidates: Vec<(u64, Event, bool)> =
            self.candidates.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c).collect();
        let proving = proofs.into_iter().zip(&keep).filter_map(|(p, k)| p.filter(|_| *k));
        // Misses after the last orphan's free bound nothing.
        let last_free = candidates.iter().map(|c| c.0).max().unwrap_or(0);
        misses.retain(|m| m.0 < last_free);
        let mut out: Vec<(u64, Event)> = candidates
            .into_iter()
            .map(|c| (c.0, c.1))
            .chain(proving)
            .chain(misses)
            .chain(self.final_live.into_values().flatten())
            .chain(self.segments.into_values())
            .chain(self.mappings)
            .collect();
        out.sort_by_key(|p| p.0);
        out.dedup_by_key(|p| p.0); // a proving alloc may be a final block's first alloc too
        out.into_iter().map(|p| p.1).collect()
    }
}

/// The words of [`digest`]'s bit set of allocated addresses (128 KiB).
const SEEN_WORDS: usize = 1 << 14;

impl DeviceTrace {
    /// The action at which frees take effect on this device (see [`free_action`]).
    pub fn free_action(&self) -> Action {
        free_action(&self.events)
    }

    /// This device's orphan frees, in address order (see `orphan_frees`).
    pub fn orphan_frees(&self) -> Vec<LiveBlock> {
        orphan_frees(&self.events)
    }
}

impl Trace {
    /// The blocks live at the first event of `device` (see `live_at_start`); empty when the
    /// trace has no such device.
    pub fn live_at_start(&self, device: i32) -> Vec<LiveBlock> {
        self.device(device).map_or_else(Vec::new, |d| live_at_start(self, device, &d.events))
    }
}

/// A fast hasher for address keys: addresses are already well spread, so a multiply suffices.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fold the product's high half down: addresses are 512-byte aligned, so the product's
        // low bits alone (which hashbrown uses as the bucket index) would all be zero.
        let x = (n ^ (n >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }
}

/// A map keyed by addresses: what the replay engine and every policy use to find a block by
/// its address. It lives beside the trace model, the layer every other one may read.
pub type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// A set of addresses with [`AddrHasher`]: the lifetime scan's sets, several times cheaper per
/// lookup than the default SipHash on a million-event trace.
pub type AddrSet = HashSet<u64, BuildHasherDefault<AddrHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{text, ReadOptions};

    fn events(src: &str) -> (Trace, Vec<Event>) {
        let t = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
        let e = t.devices[0].events.clone();
        (t, e)
    }

    #[test]
    fn orphan_frees_are_live_at_start() {
        let (t, e) = events("alloc 0x100 10 s0\nfree 0x100 10 s0\nfree 0x300 30 s1\nalloc 0x300 5 s0\nfree 0x300 5 s0\n");
        let live = live_at_start(&t, 0, &e);
        assert_eq!(
            live,
            vec![LiveBlock { addr: 0x300, size: 30, stream: 1, freed_in_trace: true }]
        );
        assert_eq!(t.live_at_start(0), live);
        assert_eq!(t.devices[0].orphan_frees(), live);
    }

    #[test]
    fn a_double_free_is_not_an_orphan() {
        let (_, e) = events("alloc 0x100 10 s0\nfree 0x100 10 s0\nfree 0x100 10 s0\nfree 0x200 4 s0\nfree 0x200 4 s0\n");
        let l = scan(&e);
        assert_eq!(l.orphans.iter().map(|b| b.addr).collect::<Vec<_>>(), vec![0x200]);
        assert_eq!(l.frees_at, free_action(&e));
    }

    #[test]
    fn the_digest_gives_the_same_lifetimes_as_the_events() {
        // 0x100 freed twice after its alloc (not an orphan: a second pass rules it out), 0x200
        // an orphan, 0x300 allocated and live at the end, 0x400 live at the end and never
        // allocated, 0x500 an orphan freed again later, segment events at 0x1000 twice.
        let (mut t, e) = events(
            "alloc 0x100 10 s0\nfree 0x100 10 s0\nsegment_free 0x1000 2097152\nfree 0x100 10 s0\n\
             free 0x200 20 s1\nfree 0x500 5 s0\nalloc 0x300 30 s0\nsegment_alloc 0x1000 2097152\n\
             alloc 0x500 5 s0\nfree 0x500 5 s0\nfree 0x500 5 s0\n",
        );
        let live = |address| crate::trace::Block {
            address,
            size: 512,
            requested_size: 40,
            state: BlockState::ActiveAllocated,
        };
        t.segments.push(crate::trace::Segment {
            device: 0,
            address: 0x300,
            total_size: 0x300,
            stream: 0,
            pool: crate::trace::PoolKind::Small,
            is_expandable: false,
            private_pool: None,
            blocks: vec![live(0x300), live(0x400)],
        });
        let frees_at = free_action(&e);
        let mut passes = 0;
        let digest = digest(&t, 0, frees_at, |limit, f| {
            passes += 1;
            e.iter()
                .take(limit.min(e.len() as u64) as usize)
                .enumerate()
                .try_for_each(|(i, e)| f(i as u64, e))
        })
        .unwrap();
        assert_eq!(passes, 2, "the double free of 0x100 needs the second pass");
        assert_eq!(live_at_start(&t, 0, &digest), live_at_start(&t, 0, &e));
        assert_eq!(
            live_at_start(&t, 0, &e).iter().map(|b| b.addr).collect::<Vec<_>>(),
            vec![0x200, 0x400, 0x500]
        );
        assert_eq!(scan(&digest).orphans, scan(&e).orphans);
        let kept: Vec<(Action, u64)> = digest.iter().map(|e| (e.action, e.addr)).collect();
        assert_eq!(
            kept,
            vec![
                (Action::SegmentFree, 0x1000),
                (frees_at, 0x200),
                (frees_at, 0x500),
                (Action::Alloc, 0x300),
            ]
        );
    }

    #[test]
    fn flush_runs_outside_a_malloc_are_empty_cache_calls() {
        let (_, e) = events(
            "segment_free 0x0 2097152\nsegment_free 0x200000 2097152\nalloc 0x0 8\n\
             segment_free 0x400000 2097152\nsegment_alloc 0x800000 20971520\nalloc 0x800000 4096\n",
        );
        assert_eq!(
            empty_cache_points(&e, &FlushCauses::default()),
            vec![true, false, false, false, false, false]
        );
    }

    #[test]
    fn a_flush_before_a_retry_below_the_recorded_peak_is_a_call() {
        let calls = |src: &str, below_peak: bool| {
            let (_, e) = events(src);
            let mut runs = EmptyCacheRuns::default();
            for (i, e) in e.iter().enumerate() {
                runs.push(i as u64, e);
            }
            runs.finish(below_peak)
        };
        // 60 MiB at the peak, released by a call; later, at 20 MiB, a release and a retried
        // 20 MiB segment: the retry needed 20 + 20 MiB, below the peak, so no OOM but a call.
        let retried = |retry: &str| {
            format!(
                "segment_alloc 0x0 62914560\nsegment_free 0x0 62914560\nalloc 0x100 8\n\
                 segment_alloc 0x8000000 20971520\nsegment_free 0x8000000 20971520\n\
                 free_completed 0x100 8\n{retry}alloc 0x9000000 512\n"
            )
        };
        let below = retried("segment_alloc 0x9000000 20971520\n");
        assert_eq!(calls(&below, true), [1, 4]);
        assert_eq!(calls(&below, false), [1], "the runs no allocation follows");
        // A retry needing 20 + 50 MiB, above every level the device served: an OOM.
        assert_eq!(calls(&retried("segment_alloc 0x9000000 52428800\n"), true), [1]);
        // Mapped pages are summed into the level the retry needed: 20 + 10 + 10, or + 30 + 20.
        let maps = |a: u64, b: u64| {
            retried(&format!("segment_map 0x9000000 {a}\nsegment_map 0xb000000 {b}\n"))
        };
        assert_eq!(calls(&maps(10 << 20, 10 << 20), true), [1, 4]);
        assert_eq!(calls(&maps(30 << 20, 20 << 20), true), [1]);
        // A failed retry (an oom entry) is an OOM whatever the level; calls stay in order.
        let oom = "segment_alloc 0x0 20971520
segment_free 0x0 20971520
oom 0 41943040
                   segment_alloc 0x0 20971520
segment_free 0x0 20971520
alloc 0x0 8
";
        assert_eq!(calls(oom, true), [4]);
    }

    #[test]
    fn a_run_the_levels_cannot_read_is_left_to_a_model() {
        let undecided = |src: &str, below_limit: bool| {
            let (_, e) = events(src);
            let mut runs = EmptyCacheRuns::default();
            for (i, e) in e.iter().enumerate() {
                runs.push(i as u64, e);
            }
            let (calls, undecided) = runs.finish_with_undecided(below_limit);
            (calls, undecided.iter().map(|r| (r.event, r.request, r.failed)).collect::<Vec<_>>())
        };
        // A release and a retried segment above the peak, then a failed request.
        let src = "segment_alloc 0x0 20971520\nsegment_free 0x0 20971520\n\
                   segment_alloc 0x0 41943040\nalloc 0x0 41943040\n\
                   segment_free 0x0 41943040\noom 0 41943040\n";
        assert_eq!(undecided(src, true), (vec![], vec![(1, 3, false), (4, 5, true)]));
        // With garbage collection on, the levels prove nothing: both are still asked.
        assert_eq!(undecided(src, false), (vec![], vec![(1, 3, false), (4, 5, true)]));
    }

    #[test]
    fn a_telling_stack_decides_and_levels_decide_the_rest() {
        use RunReading as R;
        let served = Levels::Served { peak: 10, limit: Some(20) };
        let read = |cause, after| read_run(cause, after, served);
        let retry = |need| AfterRun::Retry { need };
        for after in [AfterRun::Nothing, retry(30), AfterRun::Failed] {
            assert_eq!(read(Some(FlushCause::EmptyCacheCall), after), R::CalledByStack);
            assert_eq!(read(Some(FlushCause::GarbageCollection), after), R::CollectedByStack);
        }
        let oom = Some(FlushCause::OutOfMemory);
        assert_eq!(read(oom, retry(5)), R::FallbackByStack { failed: false });
        assert_eq!(read(oom, AfterRun::Failed), R::FallbackByStack { failed: true });
        assert_eq!(read(None, AfterRun::Nothing), R::Called);
        assert_eq!(read(None, retry(10)), R::CalledBelowPeak);
        assert_eq!(read(None, retry(20)), R::CalledBelowLimit);
        assert_eq!(read(None, retry(21)), R::AboveLevels);
        assert_eq!(read(None, AfterRun::Failed), R::Failed);
        assert_eq!(read_run(None, retry(5), Levels::Pending), R::Retried { need: 5 });
        assert_eq!(read_run(None, retry(5), Levels::ProveNothing), R::Unproven);
        assert!(R::Unproven.is_undecided() && !R::Unproven.is_call());
    }
}
