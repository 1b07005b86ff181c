//! What a replay on a real GPU measures besides the policy's own numbers: how long each kind of
//! device call took, and what the driver itself says is used at the policy's peak.
//!
//! The timings are taken around whole backend operations (a `map` of several pages is one sample
//! covering every `cuMemCreate`, `cuMemMap` and `cuMemSetAccess` it made), because that is what
//! a policy pays per decision. They are collected in [`Recorder`], which the backend owns, and
//! summarised into the serialisable [`CudaMeasures`] that `replay --json` writes under `cuda`.

use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The kinds of backend operation timed (the keys of `cuda.device_calls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `segment_alloc`: `cuMemAlloc_v2`.
    Malloc,
    /// `segment_free`: `cuMemFree_v2`.
    Free,
    /// `reserve`: `cuMemAddressReserve`.
    Reserve,
    /// `release`: `cuMemAddressFree`.
    Release,
    /// `map`: per page `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`.
    Map,
    /// `unmap`: per page `cuMemUnmap` + `cuMemRelease`.
    Unmap,
    /// `--touch`: `cuMemsetD8_v2` over a new segment or mapped range.
    Touch,
}

const KINDS: usize = 7;

/// Latency samples of one kind, in nanoseconds.
#[derive(Clone, Debug, Default)]
struct Samples(Vec<u64>);

impl Samples {
    fn summary(&self) -> CallStats {
        let mut v = self.0.clone();
        v.sort_unstable();
        // Nearest rank: the smallest sample with at least q of all samples at or below it.
        let rank = |q: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i] as f64 / 1e3
        };
        CallStats {
            count: v.len() as u64,
            total_seconds: v.iter().sum::<u64>() as f64 / 1e9,
            p50_us: rank(0.50),
            p99_us: rank(0.99),
            max_us: v.last().map_or(0.0, |&m| m as f64 / 1e3),
        }
    }
}

/// Collects timings and driver memory readings while a replay runs.
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    samples: [Samples; KINDS],
    total: u64,
    used_at_start: u64,
    peak: Option<(u64, u64)>,
    touch: bool,
}

impl Recorder {
    /// A recorder started now; `total` and `used_at_start` come from `cuMemGetInfo` at open.
    pub fn new(total: u64, used_at_start: u64, touch: bool) -> Recorder {
        Recorder {
            started: Instant::now(),
            samples: Default::default(),
            total,
            used_at_start,
            peak: None,
            touch,
        }
    }

    /// Adds one operation of `kind` that took `took`.
    pub fn time(&mut self, kind: CallKind, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.samples[kind as usize].0.push(ns);
    }

    /// The highest reserved bytes seen so far, to decide when to read `cuMemGetInfo` again.
    pub fn peak_reserved(&self) -> u64 {
        self.peak.map_or(0, |(r, _)| r)
    }

    /// Records the driver's used bytes when the backend's reserved bytes reach a new peak.
    pub fn peak_reading(&mut self, reserved: u64, device_used: u64) {
        self.peak = Some((reserved, device_used));
    }

    /// The measurements so far.
    pub fn summary(&self) -> CudaMeasures {
        let s = |k: CallKind| self.samples[k as usize].summary();
        CudaMeasures {
            device_calls: DeviceCalls {
                malloc: s(CallKind::Malloc),
                free: s(CallKind::Free),
                reserve: s(CallKind::Reserve),
                release: s(CallKind::Release),
                map: s(CallKind::Map),
                unmap: s(CallKind::Unmap),
                touch: s(CallKind::Touch),
            },
            wall_seconds: self.started.elapsed().as_secs_f64(),
            device_total_bytes: self.total,
            device_used_at_start_bytes: self.used_at_start,
            reserved_at_device_peak_bytes: self.peak.map_or(0, |(r, _)| r),
            device_used_at_peak_bytes: self.peak.map_or(self.used_at_start, |(_, u)| u),
            touched: self.touch,
        }
    }
}

/// Count and latency of one kind of device operation (`docs/interface.md`, `cuda.device_calls`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallStats {
    /// Operations made (successful or not).
    pub count: u64,
    /// Their summed wall time, in seconds.
    pub total_seconds: f64,
    /// Median latency, in microseconds (0 when none).
    pub p50_us: f64,
    /// 99th-percentile latency (nearest rank), in microseconds.
    pub p99_us: f64,
    /// Slowest operation, in microseconds.
    pub max_us: f64,
}

/// Per kind of device operation, its [`CallStats`].
#[allow(missing_docs)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceCalls {
    pub malloc: CallStats,
    pub free: CallStats,
    pub reserve: CallStats,
    pub release: CallStats,
    pub map: CallStats,
    pub unmap: CallStats,
    pub touch: CallStats,
}

/// What a replay on the cuda backend measured: the `cuda` object of a `replay --json` result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaMeasures {
    /// Count and latency per kind of device operation.
    pub device_calls: DeviceCalls,
    /// Wall time from opening the device to the end of the replay, in seconds.
    pub wall_seconds: f64,
    /// The device's total memory (`cuMemGetInfo`).
    pub device_total_bytes: u64,
    /// Memory the driver reported used before the first allocation (context, other processes).
    pub device_used_at_start_bytes: u64,
    /// The backend's reserved bytes at their highest, when `device_used_at_peak_bytes` was read.
    pub reserved_at_device_peak_bytes: u64,
    /// `cuMemGetInfo`'s used bytes (total − free) at that moment: what the GPU really gave.
    pub device_used_at_peak_bytes: u64,
    /// Whether `--touch` wrote every new segment and mapped range once.
    pub touched: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_microseconds() {
        let s = Samples((1..=100).map(|i| i * 1000).collect());
        let c = s.summary();
        assert_eq!((c.count, c.p50_us, c.p99_us, c.max_us), (100, 50.0, 99.0, 100.0));
        assert!((c.total_seconds - 5050e3 / 1e9).abs() < 1e-12);
        assert_eq!(Samples::default().summary(), CallStats::default());
        let one = Samples(vec![7000]).summary();
        assert_eq!((one.p50_us, one.p99_us, one.max_us), (7.0, 7.0, 7.0));
    }
}
