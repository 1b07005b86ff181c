//! What a replay measures, named as the JSON keys users' scripts read (`interface.md`).

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
    /// Wall-clock seconds the replay took.
    pub replay_seconds: f64,
    /// What the cuda backend measured (device call latencies, `cuMemGetInfo` at the peak);
    /// absent for the simulated device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<crate::backend::cuda::CudaMeasures>,
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
}
