//! What the recorded run really did, read from the file, never simulated.
//!
//! Every what-if replay is measured against a baseline; the honest baseline is the real allocator's
//! own figures where the file carries them:
//!
//! - a PyTorch snapshot records every change of reserved memory (`segment_alloc`/`segment_free`,
//!   `segment_map`/`segment_unmap`; docs/pytorch-model.md#reserved-curve) and the final segments,
//!   so reserved memory at the first event is the final total minus the net of those events, and
//!   reserved over time follows exactly; request sizes (live-at-start blocks plus `alloc`/free
//!   events) give requested bytes. Block sizes are not recorded, so allocated bytes are unknown;
//! - a Kineto trace records the allocator's `Total Allocated` and `Total Reserved` after every
//!   `[memory]` event ([`Trace::recorded_totals`]); requests and segment calls are unknown. Host
//!   memory (device -1, a CPU profiler trace) records `Total Reserved` 0 throughout: c10's CPU
//!   allocator keeps no cache, so what it held is what it had allocated, and that is its
//!   reserved line (`host_reserves_what_it_allocates`).
//!
//! [`recorded`] gathers these as a [`Recorded`]; [`Recorded::row`] shapes them as a
//! [`RecordedRow`], the `replay --json` keys of [`PolicyResult`] with `null` for what the file
//! cannot tell; [`Recorded::series`] is reserved memory over time for the timeline.
//! [`limit`] infers the device limit the run had from its out-of-memory evidence, and
//! [`kineto_start`] the memory a Kineto trace's run held before its first event.

pub mod kineto_start;
pub mod limit;

pub use limit::CapacityKind;

use crate::error::Result;
use crate::metrics::{Point, PolicyResult, Series};
use crate::trace::lifetimes::{free_action, live_at_start, AddrMap, LiveBlock};
use crate::trace::{Action, Event, Format, Trace};
use serde::{Deserialize, Serialize};

/// The name the recorded run goes by beside the policies (`replay`, `report`, JSON).
pub const POLICY_NAME: &str = "recorded";

/// Where a trace's recorded figures come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// A PyTorch snapshot: final segments and segment events.
    SnapshotSegments,
    /// A Kineto trace: the `Total Allocated` / `Total Reserved` args of `[memory]` events.
    KinetoTotals,
}

/// The real allocator's figures for one device, as the file records them.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// The device.
    pub device: i32,
    /// Where the figures come from.
    pub source: Source,
    /// Reserved bytes before the first event.
    pub reserved_at_start_bytes: u64,
    /// Reserved bytes after each event, in event order (one per event of the device).
    pub reserved_after: Vec<u64>,
    /// The most device memory held at once.
    pub peak_reserved_bytes: u64,
    /// The event after which reserved memory first reached its peak; `None` when the peak is the
    /// state before the first event.
    pub peak_reserved_event: Option<u64>,
    /// Reserved bytes after the last event.
    pub reserved_at_end_bytes: u64,
    /// The largest sum of live block sizes, where recorded (Kineto's `Total Allocated`).
    pub peak_allocated_bytes: Option<u64>,
    /// Allocated bytes at the first moment of peak reserved, where recorded.
    pub allocated_at_peak_bytes: Option<u64>,
    /// The largest sum of live request sizes, where the file records every request size.
    pub peak_requested_bytes: Option<u64>,
    /// Segment and page events, where the file records them: `segment_alloc`, `segment_free`,
    /// `segment_map`, `segment_unmap` counts.
    pub segment_counts: Option<[u64; 4]>,
    /// The segments (`cudaMalloc`s, not expandable ranges) held before the first event, where
    /// the file tells: the final ones less those the segment events allocated, plus those they
    /// freed. A replay allocates them too when it places the start state.
    pub segments_at_start: Option<u64>,
    /// The page mappings held before the first event, where the file tells: 0 without
    /// expandable segments, unknown (`None`) with them (their mapped ranges are recorded, not
    /// the calls that mapped them).
    pub maps_at_start: Option<u64>,
    /// The event after which allocated bytes first reached their peak (`None` for the state
    /// before the first event), where allocated bytes are recorded.
    pub peak_allocated_event: Option<u64>,
    /// Reserved bytes at that moment, where recorded.
    pub reserved_at_peak_allocated_bytes: Option<u64>,
    /// Recorded `oom` entries.
    pub oom_count: u64,
    /// The index of the first `oom` entry.
    pub first_oom_event: Option<u64>,
    /// Where the recording contradicts itself (e.g. segment events that would take reserved
    /// memory below zero), one line each.
    pub warnings: Vec<String>,
}

/// The recorded run as a row beside the policies: the `replay --json` keys of [`PolicyResult`],
/// `None` (JSON `null`) where the file cannot tell.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordedRow {
    /// Always [`POLICY_NAME`].
    pub policy: String,
    /// Always empty: the recorded run has no fragsim configuration.
    pub config: String,
    /// See [`PolicyResult::peak_reserved_bytes`].
    pub peak_reserved_bytes: Option<u64>,
    /// See [`PolicyResult::peak_allocated_bytes`].
    pub peak_allocated_bytes: Option<u64>,
    /// See [`PolicyResult::peak_requested_bytes`].
    pub peak_requested_bytes: Option<u64>,
    /// See [`PolicyResult::reserved_at_end_bytes`].
    pub reserved_at_end_bytes: Option<u64>,
    /// See [`PolicyResult::fragmentation_at_peak`].
    pub fragmentation_at_peak: Option<f64>,
    /// See [`PolicyResult::device_malloc_count`].
    pub device_malloc_count: Option<u64>,
    /// See [`PolicyResult::device_free_count`].
    pub device_free_count: Option<u64>,
    /// See [`PolicyResult::map_count`].
    pub map_count: Option<u64>,
    /// See [`PolicyResult::unmap_count`].
    pub unmap_count: Option<u64>,
    /// See [`PolicyResult::alloc_retries`]; set by [`RecordedRow::with_limit`] when the device
    /// limit tells OOM flushes from `empty_cache()` calls.
    pub alloc_retries: Option<u64>,
    /// See [`PolicyResult::oom`]: whether the file records an `oom` entry (snapshots only).
    pub oom: Option<bool>,
    /// See [`PolicyResult::first_oom_event`].
    pub first_oom_event: Option<u64>,
    /// See [`PolicyResult::peak_event`]: the event after which the recorded reserved memory first
    /// reached its peak (0 when the peak is the state before the first event).
    pub peak_event: Option<u64>,
    /// Always `None`: nothing was replayed.
    pub replay_seconds: Option<f64>,
    /// See [`PolicyResult::peak_at_start`]: whether the recorded reserved memory was at its
    /// peak before the first event.
    pub peak_at_start: Option<bool>,
    /// See [`PolicyResult::peak_allocated_event`], where allocated bytes are recorded (Kineto).
    pub peak_allocated_event: Option<u64>,
    /// See [`PolicyResult::fragmentation_at_peak_allocated`], where allocated bytes are
    /// recorded (Kineto).
    pub fragmentation_at_peak_allocated: Option<f64>,
    /// The segments the recorded run held before the first event (a snapshot's recovered
    /// cache), which its `device_malloc_count` (the recorded `segment_alloc` events) leaves out
    /// while a replay's counts them: `device_malloc_count + start_malloc_count` is what to set
    /// beside a replay's `device_malloc_count`, and the table's `mallocs` shows that sum.
    pub start_malloc_count: Option<u64>,
    /// The page mappings held before the first event; `None` where the file cannot tell them
    /// (an expandable segment's mapped range is recorded, not the calls that mapped it).
    pub start_map_count: Option<u64>,
}

impl RecordedRow {
    /// The row as a [`PolicyResult`], for code that needs one: every unknown number becomes 0
    /// (and `oom` false), so show it only beside [`RecordedRow`]'s own `None`s.
    pub(crate) fn to_policy_result(&self) -> PolicyResult {
        PolicyResult {
            policy: self.policy.clone(),
            config: self.config.clone(),
            peak_reserved_bytes: self.peak_reserved_bytes.unwrap_or(0),
            peak_allocated_bytes: self.peak_allocated_bytes.unwrap_or(0),
            peak_requested_bytes: self.peak_requested_bytes.unwrap_or(0),
            reserved_at_end_bytes: self.reserved_at_end_bytes.unwrap_or(0),
            fragmentation_at_peak: self.fragmentation_at_peak.unwrap_or(0.0),
            device_malloc_count: self.device_malloc_count.unwrap_or(0),
            device_free_count: self.device_free_count.unwrap_or(0),
            map_count: self.map_count.unwrap_or(0),
            unmap_count: self.unmap_count.unwrap_or(0),
            alloc_retries: self.alloc_retries.unwrap_or(0),
            oom: self.oom.unwrap_or(false),
            first_oom_event: self.first_oom_event,
            start_state: None,
            start_assumed: None,
            gpu_memory_bytes: None,
            capacity_bytes: None,
            replay_seconds: 0.0,
            planning_seconds: None,
            first_oom: None,
            cuda: None,
            peak_event: self.peak_event.unwrap_or(0),
            peak_at_start: self.peak_at_start.unwrap_or(false),
            peak_allocated_event: self.peak_allocated_event.unwrap_or(0),
            fragmentation_at_peak_allocated: self.fragmentation_at_peak_allocated.unwrap_or(0.0),
            start_malloc_count: self.start_malloc_count.unwrap_or(0),
            start_map_count: self.start_map_count.unwrap_or(0),
        }
    }

    /// The row with `alloc_retries` filled from an inferred device limit: the number of flushes
    /// it proves were out-of-memory retries, when it classifies every candidate flush.
    pub fn with_limit(mut self, limit: &limit::DeviceLimit) -> RecordedRow {
        self.alloc_retries = limit.proven_retries();
        self
    }
}

/// The recorded figures of `device`, or `None` when the file records none for it (text traces,
/// RMM logs, Kineto traces without totals, a device the trace does not have).
pub fn recorded(trace: &Trace, device: i32) -> Option<Recorded> {
    let events = &trace.device(device)?.events;
    if let Some(totals) = trace.totals_of(device) {
        return Some(from_totals(trace, device, events, totals));
    }
    (trace.source_format() == Format::PytorchSnapshot).then(|| from_snapshot(trace, device, events))
}

/// The recorded run's row beside the policies and the device limit its recording shows, for
/// `device` of `trace`; both `None` when the file records no allocator figures. The row's
/// `alloc_retries` comes from the limit's flush classification (snapshots only).
pub fn row_and_limit(
    trace: &Trace,
    device: i32,
) -> (Option<RecordedRow>, Option<limit::DeviceLimit>) {
    recorded(trace, device).map(|r| r.row_and_limit(trace)).unzip()
}

/// [`row_and_limit`] for a snapshot's `device` whose events stream from a file instead of being
/// loaded: `walk` hands every event of the device, in order, with its index, each time it is
/// called (it is called once). `live_at_start` and `frees_at` are the replay input's.
///
/// Reserved memory changes only at segment events, and the limit's flush analysis reads only
/// the releases, the `free_completed`s inside a release run and the event right after a
/// non-`alloc`/free event; so the recording is recovered from those events alone (a handful
/// per segment event) and its event indices mapped back, while requested bytes are summed on
/// the way. The results equal [`row_and_limit`] on the loaded events; memory follows the
/// segment events and the live blocks, not the trace's length.
pub(crate) fn row_and_limit_streamed<W>(
    head: &Trace,
    device: i32,
    live_at_start: &[LiveBlock],
    frees_at: Action,
    walk: W,
) -> Result<(Option<RecordedRow>, Option<limit::DeviceLimit>)>
where
    W: FnOnce(&mut dyn FnMut(u64, &Event) -> Result<()>) -> Result<()>,
{
    if head.source_format() != Format::PytorchSnapshot || head.totals_of(device).is_some() {
        return Ok((None, None));
    }
    let plain =
        |a: Action| matches!(a, Action::Alloc | Action::FreeRequested | Action::FreeCompleted);
    let releases = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    let mut kept: Vec<Event> = Vec::new();
    let mut index: Vec<u64> = Vec::new();
    // Whether the next plain event is kept: right after a non-plain one, or inside a release run.
    let (mut after_other, mut in_run) = (false, false);
    let mut requested = Requested::new(live_at_start);
    walk(&mut |i, e| {
        if !plain(e.action) || after_other || (in_run && e.action == Action::FreeCompleted) {
            kept.push(*e);
            index.push(i);
        }
        after_other = !plain(e.action);
        in_run = releases(e.action) || (in_run && e.action == Action::FreeCompleted);
        requested.push(e, frees_at);
        Ok(())
    })?;
    let compact = Trace {
        format: head.format,
        converted_from: head.converted_from,
        devices: vec![crate::trace::DeviceTrace { device, events: kept }],
        segments: head.segments_of(device).cloned().collect(),
        allocator_settings: head.allocator_settings.clone(),
        has_times: head.has_times,
        ..Trace::default()
    };
    let events = &compact.devices[0].events;
    let mut r = from_snapshot(&compact, device, events);
    r.peak_requested_bytes = Some(requested.peak);
    let (mut row, mut l) = r.row_and_limit(&compact);
    let at = |k: u64| index.get(k as usize).copied().unwrap_or(k);
    row.peak_event =
        row.peak_event.map(|k| if r.peak_reserved_event.is_some() { at(k) } else { k });
    row.first_oom_event = row.first_oom_event.map(at);
    l.at_least_event = l.at_least_event.map(at);
    l.below_event = l.below_event.map(at);
    for f in &mut l.flushes {
        f.event = at(f.event);
        f.retry_event = f.retry_event.map(at);
    }
    for o in &mut l.oom_entries {
        o.event = at(o.event);
    }
    Ok((Some(row), Some(l)))
}

/// Reserved over time from a snapshot: final segments minus the net of segment events.
fn from_snapshot(trace: &Trace, device: i32, events: &[Event]) -> Recorded {
    let mut warnings = Vec::new();
    let final_reserved: u64 = trace.segments_of(device).map(|s| s.total_size).sum();
    let mut net: i128 = 0;
    let mut lowest: i128 = 0;
    let mut counts = [0u64; 4];
    let mut oom_count = 0;
    let mut first_oom_event = None;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc => (net, counts[0]) = (net + e.size as i128, counts[0] + 1),
            Action::SegmentFree => (net, counts[1]) = (net - e.size as i128, counts[1] + 1),
            Action::SegmentMap => (net, counts[2]) = (net + e.size as i128, counts[2] + 1),
            Action::SegmentUnmap => (net, counts[3]) = (net - e.size as i128, counts[3] + 1),
            Action::Oom => {
                oom_count += 1;
                first_oom_event.get_or_insert(i as u64);
            }
            _ => {}
        }
        lowest = lowest.min(net);
    }
    let mut start = final_reserved as i128 - net;
    if start + lowest < 0 {
        warnings.push(format!(
            "device {device}: the final segments hold {final_reserved} B, less than the segment \
             events add ({net} B net); reserved memory before the first event is taken as {} B, \
             the least that never goes below zero",
            -lowest
        ));
        start = -lowest;
    }
    let start = start as u64;
    let held = |expandable: bool| {
        trace.segments_of(device).filter(|s| s.is_expandable == expandable).count() as i128
    };
    let segments_at_start = (held(false) - counts[0] as i128 + counts[1] as i128).max(0) as u64;
    // Expandable ranges are recorded, not the map calls that made them: none, or unknown.
    let maps_known = held(true) == 0 && counts[2] == 0 && counts[3] == 0;
    let mut reserved = start as i128;
    let reserved_after = events
        .iter()
        .map(|e| {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => reserved += e.size as i128,
                Action::SegmentFree | Action::SegmentUnmap => reserved -= e.size as i128,
                _ => {}
            }
            reserved as u64
        })
        .collect();
    let mut r = Recorded {
        device,
        source: Source::SnapshotSegments,
        reserved_at_start_bytes: start,
        reserved_after,
        peak_reserved_bytes: 0,
        peak_reserved_event: None,
        reserved_at_end_bytes: 0,
        peak_allocated_bytes: None,
        allocated_at_peak_bytes: None,
        peak_requested_bytes: Some(peak_requested(trace, device, events)),
        segment_counts: Some(counts),
        segments_at_start: Some(segments_at_start),
        maps_at_start: maps_known.then_some(0),
        peak_allocated_event: None,
        reserved_at_peak_allocated_bytes: None,
        oom_count,
        first_oom_event,
        warnings,
    };
    r.find_peak();
    r
}

/// The largest sum of live request sizes: the blocks live at the first event, then every
/// `alloc` and free (an `alloc` at the address of a block still live frees that block first, as
/// the replay engine does).
fn peak_requested(trace: &Trace, device: i32, events: &[Event]) -> u64 {
    let frees_at = free_action(events);
    let mut requested = Requested::new(&live_at_start(trace, device, events));
    for e in events {
        requested.push(e, frees_at);
    }
    requested.peak
}

/// Live request bytes followed event by event, and their peak.
struct Requested {
    live: AddrMap<u64>,
    now: u64,
    peak: u64,
}

impl Requested {
    /// Starting with the blocks live at the first event.
    fn new(live_at_start: &[LiveBlock]) -> Requested {
        let mut live: AddrMap<u64> = AddrMap::default();
        let mut now = 0;
        for b in live_at_start {
            now -= live.insert(b.addr, b.size).unwrap_or(0);
            now += b.size;
        }
        Requested { live, now, peak: now }
    }

    /// Takes the next event; frees take effect at `frees_at`.
    fn push(&mut self, e: &Event, frees_at: Action) {
        match e.action {
            Action::Alloc if e.size > 0 => {
                self.now -= self.live.insert(e.addr, e.size).unwrap_or(0);
                self.now += e.size;
                self.peak = self.peak.max(self.now);
            }
            a if a == frees_at => self.now -= self.live.remove(&e.addr).unwrap_or(0),
            _ => {}
        }
    }
}

/// The figures from Kineto's recorded totals.
fn from_totals(
    trace: &Trace,
    device: i32,
    events: &[Event],
    totals: &[crate::trace::RecordedTotals],
) -> Recorded {
    let start = kineto_start::start_state(trace, device);
    let live_before = start.as_ref().map_or(0, |s| s.live_bytes);
    let host = host_reserves_what_it_allocates(device, totals);
    let reserved_at_start_bytes =
        if host { live_before } else { start.as_ref().map_or(0, |s| s.reserved_bytes) };
    let peak_allocated = totals.iter().map(|t| t.allocated).max().unwrap_or(0).max(live_before);
    let oom_count = events.iter().filter(|e| e.action == Action::Oom).count() as u64;
    let mut r = Recorded {
        device,
        source: Source::KinetoTotals,
        reserved_at_start_bytes,
        reserved_after: totals
            .iter()
            .map(|t| if host { t.allocated } else { t.reserved })
            .collect(),
        peak_reserved_bytes: 0,
        peak_reserved_event: None,
        reserved_at_end_bytes: 0,
        peak_allocated_bytes: Some(peak_allocated),
        allocated_at_peak_bytes: None,
        peak_requested_bytes: None,
        segment_counts: None,
        segments_at_start: None,
        maps_at_start: None,
        peak_allocated_event: None,
        reserved_at_peak_allocated_bytes: None,
        oom_count,
        first_oom_event: events.iter().position(|e| e.action == Action::Oom).map(|i| i as u64),
        warnings: start.map(|s| s.warnings).unwrap_or_default(),
    };
    r.find_peak();
    r.allocated_at_peak_bytes = Some(match r.peak_reserved_event {
        Some(i) => totals[i as usize].allocated,
        None => live_before,
    });
    // The first moment allocated bytes peak: the start state unless an event goes above it.
    let mut at = (None, r.reserved_at_start_bytes);
    let mut most = live_before;
    for (i, (t, &reserved)) in totals.iter().zip(&r.reserved_after).enumerate() {
        if t.allocated > most {
            (most, at) = (t.allocated, (Some(i as u64), reserved));
        }
    }
    (r.peak_allocated_event, r.reserved_at_peak_allocated_bytes) = (at.0, Some(at.1));
    r
}

/// True when `device` is host memory whose recorded `Total Reserved` is 0 at every event while
/// it allocates: the profiler's CPU allocator (c10's) keeps no cache and reports no reserved
/// bytes, so the memory it held is its `Total Allocated` at each moment. A GPU's reserved bytes
/// are always its own.
pub(crate) fn host_reserves_what_it_allocates(
    device: i32,
    totals: &[crate::trace::RecordedTotals],
) -> bool {
    device < 0 && totals.iter().all(|t| t.reserved == 0) && totals.iter().any(|t| t.allocated > 0)
}

impl Recorded {
    /// Sets the peak and end figures from `reserved_after`.
    fn find_peak(&mut self) {
        self.peak_reserved_bytes = self.reserved_at_start_bytes;
        self.peak_reserved_event = None;
        for (i, &r) in self.reserved_after.iter().enumerate() {
            if r > self.peak_reserved_bytes {
                self.peak_reserved_bytes = r;
                self.peak_reserved_event = Some(i as u64);
            }
        }
        self.reserved_at_end_bytes =
            self.reserved_after.last().copied().unwrap_or(self.reserved_at_start_bytes);
    }

    /// The row (with `alloc_retries` from the inferred limit where the recording's segment
    /// events prove them) and the device limit the recording implies: what [`row_and_limit`]
    /// gives, for a caller that also wants [`Recorded::series`] without recovering it twice.
    pub(crate) fn row_and_limit(&self, trace: &Trace) -> (RecordedRow, limit::DeviceLimit) {
        let l = limit::infer(trace, self);
        let row = match self.source {
            Source::SnapshotSegments => self.row().with_limit(&l),
            Source::KinetoTotals => self.row(),
        };
        (row, l)
    }

    /// The recorded run as a row beside the policies (see [`RecordedRow`]).
    pub fn row(&self) -> RecordedRow {
        let counts = self.segment_counts;
        let fragmentation_at_peak = self.allocated_at_peak_bytes.map(|a| {
            if self.peak_reserved_bytes == 0 {
                0.0
            } else {
                1.0 - a as f64 / self.peak_reserved_bytes as f64
            }
        });
        let snapshot = self.source == Source::SnapshotSegments;
        RecordedRow {
            policy: POLICY_NAME.to_string(),
            config: String::new(),
            peak_reserved_bytes: Some(self.peak_reserved_bytes),
            peak_allocated_bytes: self.peak_allocated_bytes,
            peak_requested_bytes: self.peak_requested_bytes,
            reserved_at_end_bytes: Some(self.reserved_at_end_bytes),
            fragmentation_at_peak,
            device_malloc_count: counts.map(|c| c[0]),
            device_free_count: counts.map(|c| c[1]),
            map_count: counts.map(|c| c[2]),
            unmap_count: counts.map(|c| c[3]),
            alloc_retries: None,
            oom: snapshot.then_some(self.oom_count > 0),
            first_oom_event: self.first_oom_event,
            peak_event: Some(self.peak_reserved_event.unwrap_or(0)),
            replay_seconds: None,
            peak_at_start: Some(self.peak_reserved_event.is_none() && self.peak_reserved_bytes > 0),
            peak_allocated_event: self
                .reserved_at_peak_allocated_bytes
                .map(|_| self.peak_allocated_event.unwrap_or(0)),
            fragmentation_at_peak_allocated: self
                .peak_allocated_bytes
                .zip(self.reserved_at_peak_allocated_bytes)
                .map(|(a, r)| if r == 0 { 0.0 } else { (1.0 - a as f64 / r as f64).max(0.0) }),
            start_malloc_count: self.segments_at_start,
            start_map_count: self.maps_at_start,
        }
    }

    /// Reserved memory over time, for the timeline: a point before the first event (at event
    /// 0) and one after every event that changes it, within `budget` points (peaks kept, see
    /// [`Series`]). `allocated` holds the recorded allocated bytes where known (Kineto), else 0;
    /// `requested` is always 0: only `reserved` is the recorded line.
    pub fn series(&self, trace: &Trace, budget: usize) -> Series {
        let mut s = Series::with_budget(budget);
        let events = trace.device(self.device).map_or(&[][..], |d| &d.events[..]);
        let totals = match self.source {
            Source::KinetoTotals => trace.totals_of(self.device),
            Source::SnapshotSegments => None,
        };
        let start_time = events.first().map_or(0, |e| e.time_us);
        let live = totals
            .and_then(|_| kineto_start::start_state(trace, self.device))
            .map_or(0, |k| k.live_bytes);
        let mut last = (self.reserved_at_start_bytes, live);
        s.push(Point {
            event: 0,
            time_us: start_time,
            reserved: last.0,
            allocated: last.1,
            requested: 0,
        });
        for (i, (&reserved, e)) in self.reserved_after.iter().zip(events).enumerate() {
            let allocated = totals.map_or(0, |t| t[i].allocated);
            if (reserved, allocated) != last {
                last = (reserved, allocated);
                s.push(Point {
                    event: i as u64,
                    time_us: e.time_us,
                    reserved,
                    allocated,
                    requested: 0,
                });
            }
        }
        s
    }
}

#[cfg(test)]
mod tests;
