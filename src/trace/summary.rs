//! What is in a trace, at a glance: the numbers `fragsim info` prints.
//!
//! Before replaying a trace a user wants to know whether it is the trace they think it is: which
//! devices and streams, how many allocations, how large, whether it starts mid-run (orphan
//! frees: frees of blocks allocated before recording began) and how much memory the program
//! itself had live at most. None of this needs a policy: it is a single pass over the events.
//!
//! Frees take effect at the action the replay engine uses
//! ([`free_action`]): `free_completed` when a trace has
//! any, else `free_requested`. The serialised form is `info --json` (docs/interface.md: `format`,
//! `devices` with `device`, `events` and `by_action`, `orphan_frees`, `peak_live_bytes`).

use super::lifetimes::free_action;
use super::{Action, AllocatorSettings, DeviceTrace, Trace};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// The release a recording shows ([`Summary::pytorch_release`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Release {
    /// The release modelled, e.g. `2.15`.
    pub version: String,
    /// The least release the recording proves.
    pub at_least: String,
    /// What shows it (a phrase).
    pub why: String,
}

/// The GPU platform a recording shows ([`Summary::platform`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlatformShown {
    /// `rocm` or `cuda`.
    pub name: &'static str,
    /// What shows it (a phrase).
    pub why: &'static str,
}

/// The pinned host allocator's memory ([`Summary::host_segments`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HostMemory {
    /// Segments listed.
    pub segments: u64,
    /// Bytes of pinned host memory they hold.
    pub reserved_bytes: u64,
    /// Bytes live in them, where recorded.
    pub allocated_bytes: u64,
}

/// A whole trace's summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The format the trace was read as (`pytorch-snapshot`, `kineto`, `fst`, ...).
    pub format: &'static str,
    /// For an .fst file, the format it was converted from (absent from JSON otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub converted_from: Option<&'static str>,
    /// The device `--device` defaults to (the one with the most events); `None` without events.
    pub device: Option<i32>,
    /// Orphan frees of the default device (the same number is in its `devices` entry).
    pub orphan_frees: u64,
    /// Peak live bytes of the default device (the same number is in its `devices` entry).
    pub peak_live_bytes: u64,
    /// What the default device held before its first event (the same as in its `devices` entry).
    #[serde(flatten)]
    pub start: StartFigures,
    /// True when event times are real microseconds, false when they are event indices.
    pub has_times: bool,
    /// The GPU platform the recording shows it was made on ([`super::Platform`]), `null` where
    /// it shows none.
    pub platform: Option<PlatformShown>,
    /// Per device, by device index.
    pub devices: Vec<DeviceSummary>,
    /// Segments in the snapshot's final state (0 for formats without one).
    pub segments_at_dump: u64,
    /// Sum of those segments' sizes.
    pub reserved_at_dump_bytes: u64,
    /// Of those segments, the ones a private pool owns (a CUDA graph's or a
    /// `torch.cuda.MemPool`'s: `segment_pool_id` ≠ (0, 0)).
    pub private_pool_segments_at_dump: u64,
    /// Sum of those private-pool segments' sizes.
    pub private_pool_reserved_at_dump_bytes: u64,
    /// Where every entry names its pool (`pool_id`, PyTorch ≈ 2.7+): the private pools they
    /// name; `None` (JSON `null`) for a file whose entries do not.
    pub entry_private_pools: Option<u64>,
    /// Where entries name their pool: the `alloc` entries made into a private pool, on every
    /// device.
    pub private_pool_allocs: Option<u64>,
    /// True when those pools were inferred from a profiler trace's recorded addresses (requests
    /// that could not share blocks: a CUDA graph's private pool, another stream), not named by
    /// the entries (docs/pytorch-model.md#kineto-addresses).
    pub pools_inferred: bool,
    /// The PyTorch release the recording shows, where it shows one (`null` otherwise): what
    /// `info`'s "PyTorch release" line says (docs/pytorch-model.md#version-evidence).
    pub pytorch_release: Option<Release>,
    /// The pinned host allocator's segments at dump time (2.14+ `host_segments`), `null` where
    /// the snapshot has none.
    pub host_segments: Option<HostMemory>,
    /// Entries of `host_traces` (2.14+), `null` where the snapshot has none.
    pub host_trace_entries: Option<u64>,
    /// `annotate` entries (labels on live allocations).
    pub annotate_entries: u64,
    /// Exact-address allocations (`internal_metadata` naming `mallocWithAddress`): prefix entries.
    pub exact_address_entries: u64,
    /// Entries carrying `user_metadata`.
    pub user_metadata_entries: u64,
    /// True when the trace recorded its allocator settings (PyTorch ≈ 2.3+ snapshots).
    pub has_allocator_settings: bool,
    /// The recorded allocator settings, if any.
    pub allocator_settings: Option<AllocatorSettings>,
    /// Distinct stack-frame lists kept with the trace (0 unless frames were read).
    pub frame_lists: u64,
}

/// What a device held before its first event: the blocks live at the start as every replay
/// carries them (a snapshot's live blocks, a Kineto trace's opaque block), and the peak of live
/// bytes counting them, which is the `bound` policy's peak reserved. Reading them takes the
/// replay engine, which the trace model does not use: [`Summary::of`] leaves them `None` (JSON
/// `null`) and `fragsim info` fills them with [`Summary::set_start`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StartFigures {
    /// Blocks live at the first event.
    pub live_at_start_blocks: Option<u64>,
    /// Their bytes.
    pub live_at_start_bytes: Option<u64>,
    /// The largest sum of live request sizes counting them (`peak_live_bytes` does not).
    pub peak_live_with_start_bytes: Option<u64>,
}

/// One device's summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceSummary {
    /// The device index (-1 is host memory in Kineto traces).
    pub device: i32,
    /// Number of events.
    pub events: u64,
    /// Events per action, every PyTorch action name present (zeros included).
    pub by_action: ByAction,
    /// The action at which frees take effect here (`free_completed` or `free_requested`).
    pub free_action: &'static str,
    /// The distinct streams of the events, ascending (raw `cudaStream_t` values).
    pub streams: Vec<u64>,
    /// The smallest allocation request, if any.
    pub alloc_size_min: Option<u64>,
    /// The largest allocation request, if any.
    pub alloc_size_max: Option<u64>,
    /// The largest sum of live request sizes over the trace, counting blocks allocated in the
    /// trace (blocks live before the first event are not known in size until they are freed).
    pub peak_live_bytes: u64,
    /// What the device held before its first event, next to `peak_live_bytes`.
    #[serde(flatten)]
    pub start: StartFigures,
    /// Frees of addresses with no live earlier allocation in the trace: blocks allocated
    /// before recording began.
    pub orphan_frees: u64,
    /// Blocks allocated in the trace and not freed by its end.
    pub allocated_in_trace_live_at_end: u64,
    /// Their request sizes summed.
    pub live_at_end_bytes: u64,
    /// Allocation requests by power-of-two size class, smallest first, empty classes left out.
    pub size_histogram: Vec<SizeBucket>,
    /// The earliest event time (µs), when the trace records times.
    pub first_time_us: Option<i64>,
    /// The latest event time (µs), when the trace records times.
    pub last_time_us: Option<i64>,
    /// `last_time_us - first_time_us`, when the trace records times.
    pub time_span_us: Option<i64>,
    /// Segments of this device in the snapshot's final state.
    pub segments_at_dump: u64,
    /// Their sizes summed.
    pub reserved_at_dump_bytes: u64,
}

/// Counts per [`Action`], serialised as a JSON object keyed by PyTorch's action names in
/// [`Action::ALL`] order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByAction(pub [u64; 9]);

impl ByAction {
    /// The count of `action`.
    pub fn get(&self, action: Action) -> u64 {
        self.0[Self::slot(action)]
    }

    fn slot(action: Action) -> usize {
        Action::ALL.iter().position(|&a| a == action).unwrap_or(0)
    }
}

impl Serialize for ByAction {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(Action::ALL.len()))?;
        for (a, n) in Action::ALL.iter().zip(self.0) {
            map.serialize_entry(a.name(), &n)?;
        }
        map.end()
    }
}

/// Allocation requests of sizes `min_bytes ..= max_bytes` (one power-of-two class; size 0 has
/// a class of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    /// The smallest size in the class (a power of two, or 0).
    pub min_bytes: u64,
    /// The largest size in the class (`2 * min_bytes - 1`, or 0).
    pub max_bytes: u64,
    /// Requests in the class.
    pub count: u64,
    /// Their sizes summed.
    pub bytes: u64,
}

impl Summary {
    /// Fills every device's [`StartFigures`] (and the default device's at the top) from
    /// `figures`, called once per device.
    pub fn set_start(&mut self, figures: impl Fn(i32) -> StartFigures) {
        for d in &mut self.devices {
            d.start = figures(d.device);
            if Some(d.device) == self.device {
                self.start = d.start;
            }
        }
    }

    /// Summarises `trace`.
    pub fn of(trace: &Trace) -> Summary {
        let devices: Vec<DeviceSummary> =
            trace.devices.iter().map(|d| DeviceSummary::of(trace, d)).collect();
        let device = trace.default_device();
        let chosen = devices.iter().find(|d| Some(d.device) == device);
        let private = trace.segments.iter().filter(|s| s.private_pool.is_some());
        Summary {
            format: trace.format.name(),
            converted_from: trace.converted_from.map(super::Format::name),
            device,
            orphan_frees: chosen.map_or(0, |d| d.orphan_frees),
            peak_live_bytes: chosen.map_or(0, |d| d.peak_live_bytes),
            start: StartFigures::default(),
            has_times: trace.has_times,
            platform: trace.platform.map(|p| PlatformShown { name: p.name(), why: p.why() }),
            devices,
            segments_at_dump: trace.segments.len() as u64,
            reserved_at_dump_bytes: saturate(
                trace.segments.iter().map(|s| s.total_size as u128).sum(),
            ),
            private_pool_segments_at_dump: private.clone().count() as u64,
            private_pool_reserved_at_dump_bytes: saturate(
                private.map(|s| s.total_size as u128).sum(),
            ),
            entry_private_pools: trace.entry_pools.as_ref().map(|p| p.len() as u64),
            pools_inferred: trace.pools_inferred(),
            pytorch_release: None,
            host_segments: trace.extras.host_segments.map(|h| HostMemory {
                segments: h.count,
                reserved_bytes: h.reserved,
                allocated_bytes: h.allocated,
            }),
            host_trace_entries: trace.extras.host_trace_entries,
            annotate_entries: trace.extras.annotate_entries,
            exact_address_entries: trace.extras.malloc_with_address,
            user_metadata_entries: trace.extras.user_metadata,
            private_pool_allocs: trace.entry_pools.as_ref().map(|_| {
                let events = trace.devices.iter().flat_map(|d| &d.events);
                events.filter(|e| e.action == Action::Alloc && e.pool.0 != 0).count() as u64
            }),
            has_allocator_settings: trace.allocator_settings.is_some(),
            allocator_settings: trace.allocator_settings.clone(),
            frame_lists: trace.frames.len() as u64,
        }
    }
}

impl DeviceSummary {
    /// Summarises the events of `d` (and the final segments of its device in `trace`).
    pub fn of(trace: &Trace, d: &DeviceTrace) -> DeviceSummary {
        let frees = free_action(&d.events);
        let mut by_action = ByAction::default();
        let mut streams = BTreeSet::new();
        let (mut min, mut max) = (None::<u64>, None::<u64>);
        let mut live: HashMap<u64, u64> = HashMap::new();
        let (mut live_bytes, mut peak) = (0u128, 0u128);
        let mut orphans = 0;
        let mut classes = [(0u64, 0u128); 65];
        let (mut first, mut last) = (None::<i64>, None::<i64>);
        for e in &d.events {
            by_action.0[ByAction::slot(e.action)] += 1;
            streams.insert(e.stream);
            first = Some(first.map_or(e.time_us, |t| t.min(e.time_us)));
            last = Some(last.map_or(e.time_us, |t| t.max(e.time_us)));
            if e.action == Action::Alloc {
                min = Some(min.map_or(e.size, |m| m.min(e.size)));
                max = Some(max.map_or(e.size, |m| m.max(e.size)));
                let class = 64 - e.size.leading_zeros() as usize; // bit length; 0 for size 0
                classes[class].0 += 1;
                classes[class].1 += e.size as u128;
                // An address allocated twice without a free: the first block is gone.
                if let Some(old) = live.insert(e.addr, e.size) {
                    live_bytes -= old as u128;
                }
                live_bytes += e.size as u128;
                peak = peak.max(live_bytes);
            } else if e.action == frees {
                match live.remove(&e.addr) {
                    Some(size) => live_bytes -= size as u128,
                    None => orphans += 1,
                }
            }
        }
        let size_histogram = classes
            .iter()
            .enumerate()
            .filter(|(_, (count, _))| *count > 0)
            .map(|(class, &(count, bytes))| {
                let (min_bytes, max_bytes) = match class {
                    0 => (0, 0),
                    c => (1u64 << (c - 1), ((1u128 << c) - 1).min(u64::MAX as u128) as u64),
                };
                SizeBucket { min_bytes, max_bytes, count, bytes: saturate(bytes) }
            })
            .collect();
        let (first, last) = if trace.has_times { (first, last) } else { (None, None) };
        let segments: Vec<_> = trace.segments_of(d.device).collect();
        DeviceSummary {
            device: d.device,
            events: d.events.len() as u64,
            by_action,
            free_action: frees.name(),
            streams: streams.into_iter().collect(),
            alloc_size_min: min,
            alloc_size_max: max,
            peak_live_bytes: saturate(peak),
            start: StartFigures::default(),
            orphan_frees: orphans,
            allocated_in_trace_live_at_end: live.len() as u64,
            live_at_end_bytes: saturate(live_bytes),
            size_histogram,
            first_time_us: first,
            last_time_us: last,
            time_span_us: first.zip(last).map(|(f, l)| l.saturating_sub(f)),
            segments_at_dump: segments.len() as u64,
            reserved_at_dump_bytes: saturate(segments.iter().map(|s| s.total_size as u128).sum()),
        }
    }
}

fn saturate(v: u128) -> u64 {
    v.min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{text, ReadOptions};

    fn summary(src: &str) -> Summary {
        Summary::of(&text::read(src.as_bytes(), &ReadOptions::default()).unwrap())
    }

    #[test]
    fn counts_a_small_trace_by_hand() {
        // 0x10 (4096) and 0x20 (1000) live together: peak 5096; 0x30 is an orphan free;
        // 0x20 is freed, then 0x40 (3) is allocated and still live at the end.
        let s = summary(
            "alloc 0x10 4096 s1\nalloc 0x20 1000 s2\nfree 0x10 4096 s1\nfree 0x30 77 s1\n\
             free 0x20 1000 s2\nalloc 0x40 3 s1\nsegment_alloc 0x0 2097152 s1\n",
        );
        assert_eq!(s.format, "text");
        assert_eq!(s.device, Some(0));
        let d = &s.devices[0];
        assert_eq!(d.events, 10);
        assert_eq!(d.by_action.get(Action::Alloc), 3);
        assert_eq!(d.by_action.get(Action::FreeRequested), 3);
        assert_eq!(d.by_action.get(Action::FreeCompleted), 3);
        assert_eq!(d.by_action.get(Action::SegmentAlloc), 1);
        assert_eq!(d.free_action, "free_completed");
        assert_eq!(d.streams, vec![1, 2]);
        assert_eq!((d.alloc_size_min, d.alloc_size_max), (Some(3), Some(4096)));
        assert_eq!((s.peak_live_bytes, d.peak_live_bytes), (5096, 5096));
        assert_eq!((s.orphan_frees, d.orphan_frees), (1, 1));
        assert_eq!((d.allocated_in_trace_live_at_end, d.live_at_end_bytes), (1, 3));
        assert_eq!(
            d.size_histogram,
            vec![
                SizeBucket { min_bytes: 2, max_bytes: 3, count: 1, bytes: 3 },
                SizeBucket { min_bytes: 512, max_bytes: 1023, count: 1, bytes: 1000 },
                SizeBucket { min_bytes: 4096, max_bytes: 8191, count: 1, bytes: 4096 },
            ]
        );
        assert_eq!(d.time_span_us, None);
    }

    #[test]
    fn json_has_every_action_name_and_the_required_keys() {
        let s = summary("alloc 0x10 8 @100\nfree_requested 0x10 8 @250\n");
        let v = serde_json::to_value(&s).unwrap();
        let names: Vec<&str> =
            v["devices"][0]["by_action"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(names.len(), 9);
        assert_eq!(v["devices"][0]["by_action"]["free_requested"], 1);
        assert_eq!(v["devices"][0]["by_action"]["snapshot"], 0);
        assert_eq!(v["devices"][0]["free_action"], "free_requested");
        assert_eq!(v["devices"][0]["time_span_us"], 150);
        assert_eq!(v["orphan_frees"], 0);
        assert_eq!(v["peak_live_bytes"], 8);
        assert_eq!(v["format"], "text");
    }
}
