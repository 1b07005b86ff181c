//! The device limit a recorded run had, inferred from its out-of-memory evidence.
//!
//! A snapshot does not say how much memory the GPU had for the allocator (capacity minus the CUDA
//! context, NCCL, other processes), but its events bound it (docs/pytorch-model.md#malloc-order):
//!
//! - **every success is a lower bound**: reserved memory reached its recorded peak, so the limit
//!   is at least that peak;
//! - **an OOM flush is an upper bound**: when `cudaMalloc` fails, the allocator releases cached
//!   segments (`segment_free` / `segment_unmap`, with `free_completed` from the synchronisation
//!   between them) and retries, so a run of releases followed by the retried `segment_alloc` (or
//!   `segment_map`s) of size S, started at reserved level R, shows `R + S > limit`;
//! - **an `oom` entry is a point**: it records the device's free bytes F (cudaMemGetInfo) at
//!   reserved level R, so the limit was `R + F` at that moment.
//!
//! A flush alone does not prove an OOM: a program's `empty_cache()` followed by an allocation that
//! needs a new segment records the same events. Where the releases carry stacks, the stacks tell
//! them apart ([`FlushCause`]): `empty_cache` / `emptyCache` frames are the program's call,
//! `release_cached_blocks` under `malloc` is an out-of-memory fallback, whatever the levels say.
//! Without stacks, the lower bound tells them apart: a flush whose
//! `R + S` is at most the peak reserved elsewhere in the run cannot have been an OOM (the device
//! served more than that), so it is an explicit `empty_cache()`. Above the peak the recording
//! cannot tell the two apart, and the flush is taken as an OOM. With `garbage_collection_threshold`
//! set, the allocator may release segments before its first attempt (docs/pytorch-model.md#gc), so
//! such flushes prove nothing and are [`FlushKind::Unproven`].
//!
//! When other processes' memory changed during the run, one number may not fit every failure
//! point: [`DeviceLimit::consistent`] is then false and each [`OomEntry`] and [`Flush`] keeps its
//! own bound.

use super::{Recorded, Source};
use crate::trace::lifetimes::{
    may_collect_garbage, read_run, AfterRun, FlushCause, FlushCauses, Levels, RunReading,
};
use crate::trace::{Action, Trace};
use serde::{Deserialize, Serialize};

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

/// What a run of recorded segment releases was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlushKind {
    /// No allocation follows it inside the same malloc: the program called `empty_cache()`.
    EmptyCache,
    /// A segment allocation follows, but the level it needed (reserved before the flush plus the
    /// retried segment) is at most the recorded peak: not an OOM, so `empty_cache()`.
    EmptyCacheBelowPeak,
    /// A segment allocation follows at a level above the recorded peak but at most the device
    /// limit the recording's `oom` entries measure: the first attempt could not have failed, so
    /// `empty_cache()`.
    EmptyCacheBelowLimit,
    /// A segment allocation follows at a level above the recorded peak (and above the limit the
    /// `oom` entries measure, if they agree on one): taken as a failed `cudaMalloc`, the cache
    /// flush, and the retry.
    OutOfMemory,
    /// Followed by an `oom` entry: the retry failed too.
    FailedRetry,
    /// Its stack shows the program's `empty_cache()` call (`empty_cache` in
    /// `torch/cuda/memory.py`, `THCPModule_emptyCache`, `emptyCache`), whatever follows it.
    EmptyCacheByStack,
    /// Its stack shows `release_cached_blocks` under `malloc`: a failed `cudaMalloc`, the cache
    /// flush and the retry, whatever the levels say.
    OutOfMemoryByStack,
    /// Its stack shows `garbage_collect_cached_blocks`: garbage collection before a malloc's
    /// first attempt, which proves nothing about the limit.
    GarbageCollectionByStack,
    /// A segment allocation follows, but `garbage_collection_threshold` is set, so the releases
    /// may be garbage collection before a first attempt that succeeded.
    Unproven,
}

/// One run of recorded segment releases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flush {
    /// The index of its first `segment_free` / `segment_unmap`.
    pub event: u64,
    /// The index of the segment allocation (or first `segment_map`) that follows it inside the
    /// same malloc, if any.
    pub retry_event: Option<u64>,
    /// Reserved bytes just before the flush.
    pub reserved_before: u64,
    /// Bytes the retry obtained (the `segment_alloc` size, or the sum of the `segment_map`s).
    pub retry_bytes: Option<u64>,
    /// What the flush was.
    pub kind: FlushKind,
}

impl FlushKind {
    /// True for a flush that was a malloc's out-of-memory fallback.
    pub(crate) fn is_out_of_memory(self) -> bool {
        matches!(
            self,
            FlushKind::OutOfMemory | FlushKind::OutOfMemoryByStack | FlushKind::FailedRetry
        )
    }

    /// True for a flush that was the program's `empty_cache()` call.
    pub fn is_empty_cache(self) -> bool {
        matches!(
            self,
            FlushKind::EmptyCache
                | FlushKind::EmptyCacheBelowPeak
                | FlushKind::EmptyCacheBelowLimit
                | FlushKind::EmptyCacheByStack
        )
    }
}

impl FlushKind {
    /// The kind of a run as [`read_run`] reads it with the levels known.
    fn of(reading: RunReading) -> FlushKind {
        match reading {
            RunReading::CalledByStack => FlushKind::EmptyCacheByStack,
            RunReading::Called => FlushKind::EmptyCache,
            RunReading::CalledBelowPeak => FlushKind::EmptyCacheBelowPeak,
            RunReading::CalledBelowLimit => FlushKind::EmptyCacheBelowLimit,
            RunReading::FallbackByStack { failed: true } | RunReading::Failed => {
                FlushKind::FailedRetry
            }
            RunReading::FallbackByStack { failed: false } => FlushKind::OutOfMemoryByStack,
            RunReading::CollectedByStack => FlushKind::GarbageCollectionByStack,
            // Above every level served: taken as an OOM (the levels cannot prove a call).
            RunReading::AboveLevels | RunReading::Retried { .. } => FlushKind::OutOfMemory,
            RunReading::Unproven => FlushKind::Unproven,
        }
    }
}

impl Flush {
    /// For an OOM flush, the level the failed attempt needed: the limit is below it.
    pub(crate) fn needed_bytes(&self) -> Option<u64> {
        self.retry_bytes.map(|s| self.reserved_before.saturating_add(s))
    }
}

/// One recorded `oom` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomEntry {
    /// Its event index.
    pub event: u64,
    /// Reserved bytes at that moment.
    pub reserved: u64,
    /// The device's free bytes the entry records.
    pub device_free: u64,
    /// The rounded request that failed.
    pub request: u64,
}

impl OomEntry {
    /// The limit at that moment: reserved plus the device's free bytes.
    pub(crate) fn limit_bytes(&self) -> u64 {
        self.reserved.saturating_add(self.device_free)
    }
}

/// What the recording says about the device limit (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceLimit {
    /// The device.
    pub device: i32,
    /// The limit is at least this: the recorded peak reserved.
    pub at_least_bytes: u64,
    /// The event after which that peak was first reached (`None`: before the first event).
    pub at_least_event: Option<u64>,
    /// The limit is below this (exclusive): the lowest level an OOM flush needed.
    pub below_bytes: Option<u64>,
    /// The OOM flush that gives `below_bytes`.
    pub below_event: Option<u64>,
    /// The single limit every piece of evidence fits, when there is out-of-memory evidence: the
    /// `oom` entries' common `reserved + device_free`, or else the smallest limit the bounds
    /// allow (`at_least_bytes`; any value below `below_bytes` reproduces the same failures).
    /// `None` when the run shows no memory pressure, or when the evidence conflicts.
    pub limit_bytes: Option<u64>,
    /// False when no single number fits every failure point (e.g. other processes' memory
    /// changed); each flush and `oom` entry then keeps its own bound.
    pub consistent: bool,
    /// Every run of segment releases, classified.
    pub flushes: Vec<Flush>,
    /// Every `oom` entry.
    pub oom_entries: Vec<OomEntry>,
}

impl DeviceLimit {
    /// What [`DeviceLimit::limit_bytes`] stands for as a replay's capacity: the GPU's memory
    /// where the recording's `oom` entries measured it (reserved plus the driver's free bytes);
    /// else only the level at which the allocator could reserve no more (the peak below an
    /// out-of-memory flush), which its own limit, a `per_process_memory_fraction`, may have set.
    pub fn capacity_kind(&self) -> CapacityKind {
        if self.limit_bytes.is_some() && !self.oom_entries.is_empty() {
            CapacityKind::GpuMemory
        } else {
            CapacityKind::AllocatorLimit
        }
    }

    /// The number of flushes that were out-of-memory retries (PyTorch's `num_alloc_retries`),
    /// when every candidate flush could be classified; `None` otherwise or for Kineto traces.
    pub(crate) fn proven_retries(&self) -> Option<u64> {
        if self.flushes.iter().any(|f| f.kind == FlushKind::Unproven) {
            return None;
        }
        Some(self.flushes.iter().filter(|f| f.kind.is_out_of_memory()).count() as u64)
    }

    /// One line saying what was inferred and from which events, for headers and notes.
    pub fn describe(&self) -> String {
        let ooms = self
            .flushes
            .iter()
            .filter(|f| matches!(f.kind, FlushKind::OutOfMemory | FlushKind::OutOfMemoryByStack))
            .count();
        let explicit = self.flushes.iter().filter(|f| f.kind.is_empty_cache()).count();
        let by_stack = self
            .flushes
            .iter()
            .filter(|f| {
                matches!(
                    f.kind,
                    FlushKind::EmptyCacheByStack
                        | FlushKind::OutOfMemoryByStack
                        | FlushKind::GarbageCollectionByStack
                )
            })
            .count();
        let at = |e: Option<u64>| e.map_or("the start".to_string(), |e| format!("event {e}"));
        let mut s = match (self.limit_bytes, self.consistent) {
            (Some(l), _) => format!("device limit {l} B"),
            (None, false) => "no single device limit fits the recording".to_string(),
            (None, true) => "no memory pressure recorded".to_string(),
        };
        s += &format!(
            ": at least {} B (peak reserved, {})",
            self.at_least_bytes,
            at(self.at_least_event)
        );
        if let (Some(b), Some(e)) = (self.below_bytes, self.below_event) {
            s += &format!(", below {b} B (OOM flush at event {e})");
        }
        if !self.oom_entries.is_empty() {
            let points: Vec<String> = self
                .oom_entries
                .iter()
                .map(|o| format!("{} B at event {}", o.limit_bytes(), o.event))
                .collect();
            s += &format!("; oom entries: {}", points.join(", "));
        }
        s += &format!("; {ooms} OOM flushes, {explicit} empty_cache() flushes");
        if by_stack > 0 {
            s += &format!(" ({by_stack} told by their stacks)");
        }
        s
    }
}

/// Infers the device limit of `recorded`'s device from `trace` (see the module docs).
pub fn infer(trace: &Trace, recorded: &Recorded) -> DeviceLimit {
    let mut limit = DeviceLimit {
        device: recorded.device,
        at_least_bytes: recorded.peak_reserved_bytes,
        at_least_event: recorded.peak_reserved_event,
        below_bytes: None,
        below_event: None,
        limit_bytes: None,
        consistent: true,
        flushes: Vec::new(),
        oom_entries: Vec::new(),
    };
    let events = trace.device(recorded.device).map_or(&[][..], |d| &d.events[..]);
    if recorded.source != Source::SnapshotSegments || events.len() != recorded.reserved_after.len()
    {
        return limit;
    }
    let reserved_before = |i: usize| {
        if i == 0 {
            recorded.reserved_at_start_bytes
        } else {
            recorded.reserved_after[i - 1]
        }
    };
    let causes = FlushCauses::of(&trace.frames);
    let releases = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    // Each run of releases, with what its stacks say and what follows it.
    let mut runs: Vec<(Flush, Option<FlushCause>, AfterRun)> = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let e = &events[i];
        if e.action == Action::Oom {
            limit.oom_entries.push(OomEntry {
                event: i as u64,
                reserved: recorded.reserved_after[i],
                device_free: e.addr,
                request: e.size,
            });
        }
        if !releases(e.action) {
            i += 1;
            continue;
        }
        let start = i;
        // The run's stack cause: its first release with a telling stack; a release whose stack
        // names another cause starts another flush (as [`EmptyCacheRuns`] splits them).
        let mut cause = causes.get(e.frames);
        i += 1;
        while i < events.len()
            && (releases(events[i].action) || events[i].action == Action::FreeCompleted)
        {
            if releases(events[i].action) {
                let next = causes.get(events[i].frames);
                if FlushCauses::ends_run(cause, next) {
                    break;
                }
                cause = cause.or(next);
            }
            i += 1;
        }
        let mut flush = Flush {
            event: start as u64,
            retry_event: None,
            reserved_before: reserved_before(start),
            retry_bytes: None,
            kind: FlushKind::EmptyCache,
        };
        let mut after = AfterRun::Nothing;
        match events.get(i).map(|e| e.action) {
            Some(Action::Oom) => after = AfterRun::Failed,
            Some(Action::SegmentAlloc) => {
                flush.retry_event = Some(i as u64);
                flush.retry_bytes = Some(events[i].size);
            }
            Some(Action::SegmentMap) => {
                flush.retry_event = Some(i as u64);
                let maps = events[i..].iter().take_while(|e| e.action == Action::SegmentMap);
                flush.retry_bytes = Some(maps.map(|e| e.size).sum());
            }
            _ => {}
        }
        if let Some(need) = flush.needed_bytes() {
            after = AfterRun::Retry { need: need as i128 };
        }
        runs.push((flush, cause, after));
    }
    // The oom entries measure the limit itself; where they agree, a flush whose retry needed no
    // more than it cannot have been an OOM.
    let points: Vec<u64> = limit.oom_entries.iter().map(OomEntry::limit_bytes).collect();
    let agreed = points.first().filter(|&&p| p >= limit.at_least_bytes);
    let agreed = agreed.filter(|&&p| points.iter().all(|&q| q == p));
    let levels = if may_collect_garbage(trace) {
        Levels::ProveNothing
    } else {
        Levels::Served { peak: limit.at_least_bytes as i128, limit: agreed.map(|&p| p as i128) }
    };
    for (mut flush, cause, after) in runs {
        let reading = read_run(cause, after, levels);
        flush.kind = FlushKind::of(reading);
        if matches!(reading, RunReading::Called | RunReading::CalledByStack) {
            // A call no retry belongs to.
            (flush.retry_event, flush.retry_bytes) = (None, None);
        }
        limit.flushes.push(flush);
    }
    let proven_oom =
        |k: FlushKind| matches!(k, FlushKind::OutOfMemory | FlushKind::OutOfMemoryByStack);
    for f in limit.flushes.iter().filter(|f| proven_oom(f.kind)) {
        let need = f.needed_bytes().unwrap_or(u64::MAX);
        if limit.below_bytes.is_none_or(|b| need < b) {
            limit.below_bytes = Some(need);
            limit.below_event = Some(f.event);
        }
    }
    let fits = |l: u64| l >= limit.at_least_bytes && limit.below_bytes.is_none_or(|b| l < b);
    match points.first() {
        Some(&p) => {
            limit.consistent = points.iter().all(|&q| q == p) && fits(p);
            limit.limit_bytes = limit.consistent.then_some(p);
        }
        None if limit.below_bytes.is_some() => limit.limit_bytes = Some(limit.at_least_bytes),
        None => {}
    }
    limit
}
