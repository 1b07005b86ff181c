//! How to replay: capacity, backend, what to keep, and the `empty_cache` what-if.

use crate::error::Cancel;
use crate::metrics::series;
use crate::recorded::CapacityKind;

/// Which memory a replay runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// The simulated device (default).
    #[default]
    Sim,
    /// Real GPU memory through the CUDA driver.
    Cuda,
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
    /// Stop before the first event, once the start state is placed (`stop_after` is then
    /// ignored): the state a snapshot recorded mid-run began with.
    pub stop_before_first: bool,
    /// Check the policy's invariants after every event (slow; tests and debugging).
    pub check_invariants: bool,
    /// Write each new segment and mapped range once on the cuda backend (`--touch`).
    pub touch: bool,
    /// Where `empty_cache()` is called beyond (or instead of) the recording's own calls.
    pub empty_cache: EmptyCachePlan,
    /// Raised by another thread to stop the replay early (the Python package raises it when
    /// Ctrl-C interrupts the call that started the replay); never raised by default.
    pub cancel: Cancel,
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
    /// Skip the calls the recording holds (`empty_cache_points`).
    pub drop_recorded: bool,
}

impl EmptyCachePlan {
    /// The plan of `every` N events, at the events `at`, and without the recorded calls when
    /// `drop_recorded`; refuses a call every 0 events.
    pub fn new(every: Option<u64>, at: Vec<u64>, drop_recorded: bool) -> crate::Result<Self> {
        if every == Some(0) {
            return Err(crate::Error::usage(
                "--empty-cache-every 0: give a number of events of at least 1",
            ));
        }
        Ok(EmptyCachePlan { every, at, drop_recorded })
    }

    /// True when the plan changes nothing: the recorded calls only.
    pub(crate) fn is_recorded_only(&self) -> bool {
        self.every.is_none_or(|n| n == 0) && self.at.is_empty() && !self.drop_recorded
    }

    /// The calls the plan adds, asked event by event in order ([`AddedCalls::after`]).
    pub(super) fn added_calls(&self) -> AddedCalls {
        let mut at = self.at.clone();
        at.sort_unstable();
        let mut calls = AddedCalls { every: self.every.filter(|&n| n > 0), at, next: 0, due: 0 };
        calls.due = calls.first_at_or_after(0);
        calls
    }

    /// Describes the plan for people, e.g. `empty_cache() every 1000 events, no recorded calls`.
    pub(crate) fn describe(&self) -> String {
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

/// The `empty_cache()` calls an [`EmptyCachePlan`] adds, for a replay that asks after each event
/// in order: a cursor into the sorted indices instead of a search per event.
pub(super) struct AddedCalls {
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
    pub(super) fn after(&mut self, index: u64) -> bool {
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
            stop_before_first: false,
            check_invariants: false,
            touch: false,
            empty_cache: EmptyCachePlan::default(),
            cancel: Cancel::default(),
        }
    }
}
