//! What a replay measures, named as the JSON keys users' scripts read (`docs/interface.md`):
//! one policy's numbers ([`PolicyResult`]) and its memory over time ([`Series`]). Plain data,
//! produced by the replay engine and by the recording's own row (the `recorded` module), read by
//! the report writers.

pub mod series;

pub use series::{Point, Series};

use serde::{Deserialize, Serialize};

/// One policy's result on one device's events. Field names are the `replay --json` keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// The policy's name, e.g. `pytorch`.
    pub policy: String,
    /// The exact configuration the policy ran with, in its own option syntax.
    pub config: String,
    /// The most device memory the policy held at once (segments plus mapped pages).
    pub peak_reserved_bytes: u64,
    /// The largest sum of live block sizes, after the policy's rounding.
    pub peak_allocated_bytes: u64,
    /// The largest sum of live request sizes: no policy can reserve less.
    pub peak_requested_bytes: u64,
    /// Device memory still held after the last event.
    pub reserved_at_end_bytes: u64,
    /// 1 − allocated ÷ reserved at the first moment reserved memory reached its peak.
    pub fragmentation_at_peak: f64,
    /// Index of the event after which reserved memory first reached its peak: the moment
    /// `fragmentation_at_peak` is read (the allocation that forced the last growth), not a later
    /// one on the plateau a caching allocator holds afterwards. 0 when nothing was reserved.
    pub peak_event: u64,
    /// Segment allocations (`cudaMalloc` calls that succeeded).
    pub device_malloc_count: u64,
    /// Segment releases (`cudaFree` calls).
    pub device_free_count: u64,
    /// Page mappings (virtual-memory policies).
    pub map_count: u64,
    /// Page unmappings (virtual-memory policies).
    pub unmap_count: u64,
    /// Mallocs that needed a full cache flush and retry (PyTorch's `num_alloc_retries`).
    pub alloc_retries: u64,
    /// True when some request could not be served under `--capacity`.
    pub oom: bool,
    /// Index of the first event that could not be served.
    pub first_oom_event: Option<u64>,
    /// True when reserved memory peaked at the start state, before the first event: a warm
    /// snapshot's recovered cache (its final segments less the trace's segment events) is often
    /// the most it ever held, and `fragmentation_at_peak` then measures that cache, not a moment
    /// the program needed memory ([`PolicyResult::fragmentation_at_peak_allocated`] does).
    #[serde(default)]
    pub peak_at_start: bool,
    /// Index of the event after which allocated bytes first reached their peak (0 for the start
    /// state): the moment [`PolicyResult::fragmentation_at_peak_allocated`] is read.
    #[serde(default)]
    pub peak_allocated_event: u64,
    /// 1 − allocated ÷ reserved at the first moment allocated (live) bytes reached their peak:
    /// what the cache wasted when the program held the most, which the table shows
    /// (`frag@live peak`). 0 when nothing was allocated.
    #[serde(default)]
    pub fragmentation_at_peak_allocated: f64,
    /// Of [`PolicyResult::device_malloc_count`], the segment allocations that placed the state
    /// before the first event (the blocks live at the start and the cache recovered with them):
    /// a replay counts them, the recording never recorded them (`recorded`'s own
    /// `start_malloc_count` counts the segments it held then).
    #[serde(default)]
    pub start_malloc_count: u64,
    /// Of [`PolicyResult::map_count`], the page mappings that placed the state before the first
    /// event.
    #[serde(default)]
    pub start_map_count: u64,
    /// The recorded start state (the cache a snapshot held at its first event) when not all of
    /// it fit under the replay's limit (`per_process_memory_fraction`, `--capacity`): what was
    /// installed and what was left out. Absent when the whole state was installed, or the
    /// policy installs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_state: Option<crate::backend::StartFit>,
    /// The start state the replay assumed rather than read (a warm profiler trace's cache
    /// before its first event): absent where it assumed none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_assumed: Option<crate::backend::AssumedStart>,
    /// The GPU memory the policy assumed where its limit is a share of it
    /// (`per_process_memory_fraction`): a setting that only pays on some card is only as good
    /// as this assumption. Absent when no limit depends on the GPU's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_bytes: Option<u64>,
    /// The device memory the replay ran under: `--capacity` (a size or a card), or the limit
    /// the recording implies when it shows the device running out. Absent when unlimited. A
    /// result is only comparable with another under the same capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Wall-clock seconds the replay took.
    pub replay_seconds: f64,
    /// Of [`PolicyResult::replay_seconds`], the seconds a planner (`offline`) spent planning
    /// before the first event; absent for online policies, which do not plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planning_seconds: Option<f64>,
    /// The first request that could not be served, as PyTorch's OOM message describes it;
    /// absent when every request was served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_oom: Option<OomDetail>,
    /// What the cuda backend measured (device call latencies, `cuMemGetInfo` at the peak);
    /// absent for the simulated device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<crate::backend::cuda::CudaMeasures>,
}

/// The moment a request could not be served: what PyTorch's `OutOfMemoryError` says ("Tried to
/// allocate X. GPU 0 has a total capacity of T of which F is free ... R is reserved by PyTorch
/// but unallocated"), as data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomDetail {
    /// Index of the event (0 for a block live before the first event).
    pub event: u64,
    /// The request size in bytes.
    pub size: u64,
    /// The request's stream.
    pub stream: u64,
    /// The device capacity (`--capacity`), if limited.
    pub capacity_bytes: Option<u64>,
    /// Device memory the policy held when the request failed.
    pub reserved_bytes: u64,
    /// Bytes of live blocks then (after rounding).
    pub allocated_bytes: u64,
    /// Device memory still free then: capacity − outside usage − reserved (`None` unlimited).
    pub free_bytes: Option<u64>,
    /// The allocation's stack as memory_viz shows it (docs/interface.md, "Sites"): the
    /// user's own frames first, then the others its filter keeps, innermost first, when the
    /// trace kept frames.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
    /// True when the request was a block live before the first event (installed from the start
    /// state), whose stack is no event's: `event` is 0 without being event 0.
    #[serde(skip)]
    pub before_first_event: bool,
}

impl OomDetail {
    /// One line in the words of PyTorch's message, e.g. `event 812: tried to allocate 2.00 GiB
    /// on stream 0; capacity 8.00 GiB of which 1.20 GiB is free; 6.50 GiB reserved, of which
    /// 300.00 MiB is reserved but unallocated`.
    pub(crate) fn describe(&self) -> String {
        use crate::units::format_bytes;
        let mut s = format!(
            "event {}: tried to allocate {} on stream {}",
            self.event,
            format_bytes(self.size),
            self.stream
        );
        if let (Some(c), Some(f)) = (self.capacity_bytes, self.free_bytes) {
            s += &format!("; capacity {} of which {} is free", format_bytes(c), format_bytes(f));
        }
        s += &format!(
            "; {} reserved, of which {} is reserved but unallocated",
            format_bytes(self.reserved_bytes),
            format_bytes(self.reserved_bytes.saturating_sub(self.allocated_bytes))
        );
        s
    }
}

/// Measurements beyond the JSON contract, kept for reports and plots.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeakDetail {
    /// Index of the event after which reserved memory first reached its peak.
    pub peak_reserved_event: u64,
    /// Time of that event (µs, or the event index).
    pub peak_reserved_time_us: i64,
    /// Allocated bytes at that moment.
    pub allocated_at_peak_bytes: u64,
    /// Requested bytes at that moment.
    pub requested_at_peak_bytes: u64,
    /// Number of requests that could not be served.
    pub oom_count: u64,
    /// Frees of addresses the replay never allocated (freed before recording began).
    pub orphan_frees: u64,
    /// Blocks live at the first event that the replay allocated before it (pre-existing).
    pub live_at_start: u64,
    /// Events replayed.
    pub events: u64,
    /// `empty_cache()` calls the what-if added (`replay --empty-cache-every` or `--empty-cache-at`).
    #[serde(default)]
    pub empty_cache_calls: u64,
    /// The highest reserved memory after an event (the state before the first event left out:
    /// a snapshot recorded mid-run can start with more cached than the run ever held after).
    #[serde(skip)]
    pub peak_reserved_during_trace_bytes: u64,
    /// The first event after which reserved memory reached
    /// [`PeakDetail::peak_reserved_during_trace_bytes`].
    #[serde(skip)]
    pub peak_reserved_during_trace_event: u64,
    /// Reserved memory before the first event: the cache the run started with (the recorded
    /// start state a snapshot taken mid-run holds, 0 for a cold start).
    #[serde(skip)]
    pub reserved_at_start_bytes: u64,
}
