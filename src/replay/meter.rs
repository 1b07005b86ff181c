//! What one replay measures as it goes: the peaks, the series, and the backend calls.

use super::engine::LogOrigin;
use crate::backend::{BackendCall, Observer};
use crate::metrics::{PeakDetail, Point, Series};
use crate::trace::{Action, Event, PoolRef};

/// Counts what the policy asks of the backend and, when asked, records it as trace events: the
/// [`Observer`] of the backend a replay runs on.
pub(super) struct Metered {
    pub(super) mallocs: u64,
    pub(super) frees: u64,
    pub(super) maps: u64,
    pub(super) unmaps: u64,
    pub(super) log: Option<Vec<Event>>,
    /// Where each part of `log` came from, kept with it ([`super::ReplayOutput::log_origins`]).
    pub(super) origins: Vec<(LogOrigin, usize)>,
    pub(super) now: i64,
    pub(super) stream: u64,
    /// The pool the request being served names: the segments it obtains are that pool's.
    pub(super) pool: PoolRef,
}

impl Metered {
    pub(super) fn note(&mut self, action: Action, addr: u64, size: u64) {
        if let Some(log) = &mut self.log {
            let mut e = Event::new(action, addr, size, self.stream, self.now);
            e.pool = self.pool;
            log.push(e);
        }
    }

    /// Notes that what the log records from here on comes from `origin`, if the log is kept.
    pub(super) fn origin(&mut self, origin: LogOrigin) {
        if let Some(log) = &self.log {
            self.origins.push((origin, log.len()));
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

/// The measuring state of one replay.
pub(super) struct Meter {
    pub(super) requested: u64,
    pub(super) peak_reserved: u64,
    pub(super) peak_allocated: u64,
    pub(super) peak_requested: u64,
    pub(super) detail: PeakDetail,
    pub(super) series: Option<Series>,
    pub(super) last: (u64, u64, u64),
    /// The moments beyond the reserved peak: see [`Moments`].
    pub(super) moments: Moments,
}

/// What a replay notes beside its peaks: whether the reserved peak is the start state, the
/// moment allocated bytes peak and the reserved bytes then, and the device calls that placed the
/// start state. Filled by [`Meter`]; [`Moments::fill`] writes it into a result.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Moments {
    /// The reserved peak is the state before the first event.
    peak_at_start: bool,
    /// The event after which allocated bytes first reached their peak.
    peak_allocated_event: u64,
    /// Reserved bytes at that moment.
    reserved_at_peak_allocated: u64,
    /// Segment allocations and page mappings made placing the start state.
    start_calls: (u64, u64),
}

impl Moments {
    /// Writes these into `result`, whose peaks are already set.
    pub(super) fn fill(&self, result: &mut crate::metrics::PolicyResult) {
        result.peak_at_start = self.peak_at_start;
        result.peak_allocated_event = self.peak_allocated_event;
        result.fragmentation_at_peak_allocated = if self.reserved_at_peak_allocated == 0 {
            0.0
        } else {
            1.0 - result.peak_allocated_bytes as f64 / self.reserved_at_peak_allocated as f64
        };
        (result.start_malloc_count, result.start_map_count) = self.start_calls;
    }
}

impl Meter {
    /// Takes the state before the first event, once the start state is placed: the device
    /// calls `metered` made placing it, its `(reserved, allocated)` levels when there is a
    /// start state to observe (as [`Meter::observe`] at event 0), and the bytes reserved then
    /// (a warm start's cache, live blocks or not).
    pub(super) fn observe_start(
        &mut self,
        metered: &Metered,
        time_us: i64,
        levels: Option<(u64, u64)>,
        reserved: u64,
    ) {
        self.moments.start_calls = (metered.mallocs, metered.maps);
        self.detail.reserved_at_start_bytes = reserved;
        if let Some((reserved, allocated)) = levels {
            self.observe(0, time_us, reserved, allocated);
            self.moments.peak_at_start = reserved > 0 && self.peak_reserved == reserved;
        }
        // The start state is not a moment of the run: the peak during the trace starts over.
        self.detail.peak_reserved_during_trace_bytes = 0;
        self.detail.peak_reserved_during_trace_event = 0;
    }

    /// Takes the levels after `event`: the peaks, and a point of the series if one is kept.
    #[inline]
    pub(super) fn observe(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
        self.peaks(event, time_us, reserved, allocated);
        self.sample(event, time_us, reserved, allocated);
    }

    /// The peaks part of [`Meter::observe`]: all a plain replay needs ([`drive`]).
    #[inline(always)]
    pub(super) fn peaks(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
        self.reserved_peak(event, time_us, reserved, allocated);
        if allocated > self.peak_allocated {
            self.peak_allocated = allocated;
            self.moments.peak_allocated_event = event;
            self.moments.reserved_at_peak_allocated = reserved;
        }
        self.peak_requested = self.peak_requested.max(self.requested);
    }

    /// The reserved part of [`Meter::peaks`]: all that can rise on a free, which lowers the
    /// allocated and requested bytes.
    #[inline(always)]
    pub(super) fn reserved_peak(
        &mut self,
        event: u64,
        time_us: i64,
        reserved: u64,
        allocated: u64,
    ) {
        // The peak during the trace is never above the peak (which also counts the start
        // state), so a level that does not raise the first cannot raise the second: one
        // comparison an event, as before the first was kept.
        if reserved > self.detail.peak_reserved_during_trace_bytes {
            self.detail.peak_reserved_during_trace_bytes = reserved;
            self.detail.peak_reserved_during_trace_event = event;
            if reserved > self.peak_reserved {
                self.peak_reserved = reserved;
                self.moments.peak_at_start = false;
                self.detail.peak_reserved_event = event;
                self.detail.peak_reserved_time_us = time_us;
                self.detail.allocated_at_peak_bytes = allocated;
                self.detail.requested_at_peak_bytes = self.requested;
            }
        }
    }

    /// The series part of [`Meter::observe`].
    #[inline(always)]
    pub(super) fn sample(&mut self, event: u64, time_us: i64, reserved: u64, allocated: u64) {
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
