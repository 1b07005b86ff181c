//! The trace model: what every reader produces and every replay consumes.
//!
//! A [`Trace`] holds, per device, the ordered list of allocator [`Event`]s as PyTorch names them
//! (`alloc`, `free_requested`, `free_completed`, `segment_*`, `oom`, `snapshot`), plus what a
//! PyTorch snapshot records beside its trace: the final [`Segment`]s with their blocks and the
//! [`AllocatorSettings`] the run used. The PyTorch policy needs both to recover the allocator state
//! at the first event (docs/pytorch-model.md#snapshot-start-state).
//!
//! An [`Event`] is a small `Copy` struct (40 bytes): stack frames are interned once per distinct
//! frame list in a [`FrameTable`] and referenced by [`FramesId`], and they are kept only when the
//! reader is asked to, because most replays never look at them.

pub(crate) mod captures;
pub mod detect;
pub mod exact;
pub mod fst;
pub mod kineto;
pub mod kineto_segments;
pub mod lifetimes;
pub mod limits;
pub mod pickle;
pub mod pool_routes;
pub mod rmm;
pub mod sites;
pub mod snapshot;
pub mod summary;
pub mod text;

mod frames;
mod read;

pub(crate) use frames::{is_graph_capture_frame, is_mem_pool_frame};
pub use frames::{is_torch_npu_file, tells_pool_kind, Frame, FrameTable, FramesId};
pub use lifetimes::{AddrHasher, AddrMap, LiveBlock};
pub(crate) use read::open_input;
pub use read::{
    read_bytes, read_memory, read_trace, write_to, write_trace, write_trace_cancellable,
    write_trace_into, Format, FormatInfo, ReadOptions, FORMATS, MAX_DECOMPRESSED_BYTES,
};

use serde::{Deserialize, Serialize};

/// One allocator action, spelled as PyTorch's `TraceEntry` spells it. Each variant's number is
/// its tag in an `.fst` file (docs/interface.md#fst-wire-layout): fixed, never reordered.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Action {
    /// A block was handed to the caller; `size` is the request size.
    Alloc = 0,
    /// The caller released the block; the allocator may not reuse it yet (pending stream uses).
    FreeRequested = 1,
    /// The block went back to the cache; from here on it can be reused or merged.
    FreeCompleted = 2,
    /// A new segment was obtained from the device (`cudaMalloc`).
    SegmentAlloc = 3,
    /// A whole segment was returned to the device (`cudaFree`).
    SegmentFree = 4,
    /// Pages of an expandable segment were mapped.
    SegmentMap = 5,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap = 6,
    /// An allocation failed; `addr` holds the device's free bytes, `size` the rounded request.
    Oom = 7,
    /// A `_snapshot()` call; `size` is the total active bytes at that moment.
    Snapshot = 8,
}

impl Action {
    /// Every action, in the order `info` lists them.
    pub const ALL: [Action; 9] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Oom,
        Action::Snapshot,
    ];

    /// PyTorch's name for the action (`"free_requested"`, ...), used in JSON and text traces.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
        }
    }

    /// The action PyTorch spells `name`, if any.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }

    /// True for the actions that change reserved memory (segment and page events).
    pub fn is_segment_event(self) -> bool {
        matches!(
            self,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        )
    }
}

/// One allocator event on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub action: Action,
    /// The block or segment address; for [`Action::Oom`], the device's free bytes.
    pub addr: u64,
    /// Bytes: the request size for block events, the segment size for segment events.
    pub size: u64,
    /// The allocation stream as the raw `cudaStream_t` value (0 = the legacy default stream).
    pub stream: u64,
    /// Microseconds since the Unix epoch where the file records it, else the event's index.
    pub time_us: i64,
    /// The interned stack of the event, or [`FramesId::NONE`].
    pub frames: FramesId,
    /// The private pool the entry names ([`Trace::entry_pools`]), or [`PoolRef::DEFAULT`].
    pub pool: PoolRef,
}

impl Event {
    /// An event without frames, in the default pools.
    pub fn new(action: Action, addr: u64, size: u64, stream: u64, time_us: i64) -> Event {
        Event {
            action,
            addr,
            size,
            stream,
            time_us,
            frames: FramesId::NONE,
            pool: PoolRef::DEFAULT,
        }
    }
}

/// A private pool's id as PyTorch writes it (`MempoolId_t`: a CUDA graph's pool, or a
/// `torch.cuda.MemPool`'s); `(0, 0)` is the default pools.
pub type PoolId = (u64, u64);

/// The pool a trace entry names (PyTorch's per-entry `pool_id`): [`PoolRef::DEFAULT`], or `k`
/// for private pool `k - 1` of [`Trace::entry_pools`]. Two bytes, so [`Event`] stays 40.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolRef(pub u16);

impl PoolRef {
    /// The default pools (`pool_id` `(0, 0)`), and every entry of a file that does not say.
    pub const DEFAULT: PoolRef = PoolRef(0);

    /// The most private pools one trace may name.
    pub const MAX_POOLS: usize = u16::MAX as usize;

    /// The private pool this names in `pools` ([`Trace::entry_pools`]); `None` for the default
    /// pools, or a number the table does not list.
    #[inline]
    pub(crate) fn private_in(self, pools: &[PoolId]) -> Option<PoolId> {
        self.0.checked_sub(1).and_then(|k| pools.get(k as usize)).copied()
    }
}

/// The events of one device, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceTrace {
    /// The device index: a CUDA ordinal, or -1 for host memory (Kineto).
    pub device: i32,
    /// The events in the order the allocator made them.
    pub events: Vec<Event>,
}

/// Which pool a segment belongs to. The numbers are `.fst` tags (docs/interface.md#fst-wire-layout).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PoolKind {
    /// Blocks of rounded size ≤ 1 MiB, in 2 MiB segments.
    Small = 0,
    /// Everything else.
    Large = 1,
}

/// The state of a block in a snapshot's final `segments`. The numbers are `.fst` tags
/// (docs/interface.md#fst-wire-layout).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockState {
    /// Handed out to the caller (`active_allocated`).
    ActiveAllocated = 0,
    /// Freed by the caller but waiting on stream events (`active_pending_free`).
    ActivePendingFree = 1,
    /// Free and cached (`inactive`).
    Inactive = 2,
}

impl BlockState {
    /// PyTorch's spelling of the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a final segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Start address.
    pub address: u64,
    /// Block size in bytes (a multiple of 512).
    pub size: u64,
    /// The request size of the last allocation that used this block.
    pub requested_size: u64,
    /// Allocated, pending free, or cached.
    pub state: BlockState,
}

/// One segment (or, for expandable segments, one contiguous mapped range) at the dump.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// The device index.
    pub device: i32,
    /// Start address.
    pub address: u64,
    /// Sum of the block sizes.
    pub total_size: u64,
    /// The allocation stream of the head block.
    pub stream: u64,
    /// Small or large pool.
    pub pool: PoolKind,
    /// True for a mapped range of an expandable segment.
    pub is_expandable: bool,
    /// The private pool that owns it, as PyTorch's `segment_pool_id` (a CUDA graph's pool or a
    /// `torch.cuda.MemPool`); `None` for the default pools (`(0, 0)`). Only allocations made
    /// into that pool (during graph capture, or under `use_mem_pool`) are ever placed in it.
    pub private_pool: Option<PoolId>,
    /// The blocks in address order.
    pub blocks: Vec<Block>,
}

/// The `allocator_settings` a PyTorch snapshot recorded (≈ 2.3+).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AllocatorSettings {
    /// The last `PYTORCH_CUDA_ALLOC_CONF` string, if any.
    pub conf: Option<String>,
    /// `max_split_size` in bytes; `None` when unlimited (PyTorch records -1).
    pub max_split_size: Option<u64>,
    /// `garbage_collection_threshold` (0 = off).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions` as its 16 interval slots (sizes 1, 2, 4, ... 32768 MiB).
    pub roundup_power2_divisions: [u64; 16],
    /// `release_lock_on_cudamalloc`.
    pub release_lock_on_cudamalloc: bool,
    /// Where the reader found them in its file (the byte of the `allocator_settings` dict), so
    /// that a settings string a policy refuses is refused at its place. Not a setting: not
    /// compared, not kept in `.fst`.
    #[serde(skip)]
    pub at: Option<u64>,
}

impl PartialEq for AllocatorSettings {
    /// The same settings, wherever they were read.
    fn eq(&self, other: &Self) -> bool {
        self.conf == other.conf
            && self.max_split_size == other.max_split_size
            && self.garbage_collection_threshold == other.garbage_collection_threshold
            && self.expandable_segments == other.expandable_segments
            && self.roundup_power2_divisions == other.roundup_power2_divisions
            && self.release_lock_on_cudamalloc == other.release_lock_on_cudamalloc
    }
}

/// A label a snapshot attached to a live allocation (`action: "annotate"`, PyTorch ≈ 2.14+):
/// it changes no memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotation {
    /// The device whose trace holds the entry.
    pub device: i32,
    /// The entry's index in that device's trace.
    pub entry: u64,
    /// How many of that device's events come before it: the allocation it labels is the last
    /// one at `addr` among them.
    #[serde(default)]
    pub event: u64,
    /// The allocation's base address (`addr`).
    pub addr: u64,
    /// The label (`user_metadata`, as text; JSON as written), cut to [`Annotation::MAX_LABEL`]
    /// bytes; empty where the entry has none or streaming dropped it.
    pub label: String,
}

impl Annotation {
    /// The longest label kept, in bytes (a hostile file must not make labels unbounded).
    pub const MAX_LABEL: usize = 256;
}

/// What a PyTorch snapshot records besides the allocator's memory events, from releases newer
/// than the model's first ones (docs/pytorch-model.md#version-evidence): read so that none of
/// it is an error, shown by `info`, and evidence of the release that wrote the file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotExtras {
    /// Trace entries carrying `internal_metadata` (2.15+).
    pub internal_metadata: u64,
    /// Of those, entries tagged `mallocWithAddress`: the prefix pair of an exact-address
    /// allocation (2.13+ allocates it; 2.15+ tags it).
    pub malloc_with_address: u64,
    /// The events of entries tagged `mallocWithAddress`, as (device, index in that device's
    /// events), in order; at most [`SnapshotExtras::MAX_ANNOTATIONS`]. Their allocations are
    /// placed where recorded (`exact::pairs`).
    #[serde(default)]
    pub malloc_with_address_events: Vec<(i32, u64)>,
    /// Trace entries carrying a non-empty `user_metadata` string (compact JSON from 2.15).
    pub user_metadata: u64,
    /// The `annotate` entries (2.14+), at most [`SnapshotExtras::MAX_ANNOTATIONS`] kept.
    pub annotations: Vec<Annotation>,
    /// `annotate` entries seen, kept or not.
    pub annotate_entries: u64,
    /// The pinned host allocator's segments (`host_segments`, 2.14+): `None` where the file
    /// has no such key.
    pub host_segments: Option<HostSegments>,
    /// Entries of `host_traces` (2.14+), `None` where the file has no such key.
    pub host_trace_entries: Option<u64>,
    /// Keys of `allocator_settings` that only newer releases write, in the file's order:
    /// `max_round_threshold`, `max_cached_size` (2.13+), each once. Not written back by the
    /// snapshot writer (which writes back only the annotations and `internal_metadata`); `.fst`
    /// keeps every extra.
    pub settings_keys: Vec<String>,
}

impl SnapshotExtras {
    /// The most `annotate` entries kept with their labels.
    pub const MAX_ANNOTATIONS: usize = 1 << 16;
}

/// The GPU platform a recording shows it was made on, and what shows it: a reader sets it only
/// from a field its format defines for the platform, never from a guess (a device name, an
/// address range). Each variant's number is its tag in an `.fst` file
/// (docs/interface.md#fst-wire-layout): fixed, never reordered.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Platform {
    /// ROCm: a Kineto `[memory]` event records `Device Type` 6, c10's `HIP`, with which
    /// PyTorch's caching allocator reports its memory on ROCm builds (pytorch/pytorch#168721).
    RocmDeviceType = 0,
    /// ROCm: Kineto's `deviceProperties` carry `maxSharedMemoryPerMultiProcessor`, which Kineto
    /// writes only when built with roctracer (`libkineto/src/DeviceProperties.cpp`).
    RocmDeviceProperties = 1,
    /// CUDA: Kineto's `deviceProperties` carry `regsPerMultiprocessor` /
    /// `sharedMemPerBlockOptin` / `sharedMemPerMultiprocessor`, which Kineto writes only when
    /// built with CUPTI.
    CudaDeviceProperties = 2,
}

impl Platform {
    /// True for ROCm (AMD GPUs, PyTorch's HIP build).
    pub fn is_rocm(self) -> bool {
        matches!(self, Platform::RocmDeviceType | Platform::RocmDeviceProperties)
    }

    /// The platform's name in `info --json` (`rocm`, `cuda`).
    pub fn name(self) -> &'static str {
        if self.is_rocm() {
            "rocm"
        } else {
            "cuda"
        }
    }

    /// The platform as people write it (`ROCm`, `CUDA`).
    pub fn display(self) -> &'static str {
        if self.is_rocm() {
            "ROCm"
        } else {
            "CUDA"
        }
    }

    /// What in the recording shows it (a phrase).
    pub fn why(self) -> &'static str {
        match self {
            Platform::RocmDeviceType => {
                "its memory events record Device Type 6, c10's HIP, which ROCm builds report"
            }
            Platform::RocmDeviceProperties => {
                "its deviceProperties carry maxSharedMemoryPerMultiProcessor, which Kineto \
                 writes on ROCm"
            }
            Platform::CudaDeviceProperties => {
                "its deviceProperties carry regsPerMultiprocessor, which Kineto writes on CUDA"
            }
        }
    }
}

/// The pinned host allocator's segments at dump time (`host_segments`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSegments {
    /// Segments listed.
    pub count: u64,
    /// Sum of their `size`s (bytes of pinned host memory the allocator held).
    pub reserved: u64,
    /// Sum of their `allocated` sizes (bytes live in them), where recorded.
    pub allocated: u64,
}

/// A whole trace: every device's events plus what a snapshot records beside them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// The format the trace was read from (`Fst` for an .fst file).
    pub format: Format,
    /// For a trace read from .fst, the format it was converted from (what its events and
    /// segments mean follows that format); `None` otherwise.
    #[serde(default)]
    pub converted_from: Option<Format>,
    /// Per device, ordered by device index.
    pub devices: Vec<DeviceTrace>,
    /// The interned stack frames that events refer to (empty unless frames were kept).
    pub frames: FrameTable,
    /// The final segments (PyTorch snapshots only; empty otherwise).
    pub segments: Vec<Segment>,
    /// The recorded allocator settings (PyTorch snapshots ≈ 2.3+ only).
    pub allocator_settings: Option<AllocatorSettings>,
    /// True when event times are real microseconds, false when they are event indices.
    pub has_times: bool,
    /// The real allocator's own running totals, per device, where the file records them
    /// (Kineto's `Total Allocated` / `Total Reserved`); empty otherwise. They are what the
    /// recorded run really held, so reports can show them beside every simulated policy.
    #[serde(default)]
    pub recorded_totals: Vec<DeviceTotals>,
    /// Where every trace entry names its pool (PyTorch ≈ 2.7+ writes `pool_id` in each entry):
    /// the private pools the events' [`PoolRef`]s index. `None` where entries do not say, and
    /// the pool of an allocation must be told otherwise (by where it landed:
    /// [`pool_routes`]).
    #[serde(default)]
    pub entry_pools: Option<Vec<PoolId>>,
    /// True when the recording was made by torch_npu (Huawei Ascend): a stack frame names a file
    /// under `torch_npu/`. Why it is kept even when frames are not: torch_npu's allocator follows
    /// rules of its own, and the `pytorch` policy replays a recording with its maker's rules.
    #[serde(default)]
    pub torch_npu: bool,
    /// What a snapshot records besides memory events ([`SnapshotExtras`]); empty for other
    /// formats and for `.fst` files (which do not keep it).
    #[serde(default)]
    pub extras: SnapshotExtras,
    /// The GPU platform the recording shows it was made on ([`Platform`]), `None` where it
    /// shows none (a PyTorch snapshot records no platform; absence proves nothing).
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The real allocator's totals right after one event, as the file records them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedTotals {
    /// Bytes of live blocks (PyTorch's `allocated_bytes.all.current`).
    pub allocated: u64,
    /// Device memory the allocator held (`reserved_bytes.all.current`).
    pub reserved: u64,
}

/// One device's recorded totals, one per event of that device, in event order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTotals {
    /// The device index, as in [`DeviceTrace::device`].
    pub device: i32,
    /// `totals[i]` holds right after `events[i]` of that device.
    pub totals: Vec<RecordedTotals>,
}

impl Trace {
    /// Where the trace is a PyTorch snapshot whose segments show memory but that holds no trace
    /// events (taken without `torch.cuda.memory._record_memory_history()`), what to tell the
    /// user who asked about it under `name`: every replay of it has nothing to replay.
    pub fn no_history_note(&self, name: &std::path::Path) -> Option<String> {
        let no_history = self.source_format() == Format::PytorchSnapshot
            && !self.segments.is_empty()
            && self.devices.iter().all(|d| d.events.is_empty());
        no_history.then(|| {
            format!(
                "{}: the snapshot has segments but no trace events: memory history was not \
                 recorded. Call torch.cuda.memory._record_memory_history() before the code to \
                 measure, then take the snapshot (torch.cuda.memory._snapshot() or \
                 _dump_snapshot(\"FILE.pickle\")); without it every replay has nothing to replay.",
                name.display()
            )
        })
    }

    /// The format the trace was first recorded in: [`Trace::converted_from`] when read from .fst,
    /// else [`Trace::format`].
    pub fn source_format(&self) -> Format {
        self.converted_from.unwrap_or(self.format)
    }

    /// The events of `device`, if the trace has that device.
    pub fn device(&self, device: i32) -> Option<&DeviceTrace> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// The device with the most events: the default of `--device`. Ties go to a GPU before
    /// host memory (device -1), then to the lowest number: fragsim answers for GPUs first.
    pub fn default_device(&self) -> Option<i32> {
        self.devices.iter().max_by_key(|d| device_rank(d.events.len(), d.device)).map(|d| d.device)
    }

    /// The recorded totals of `device`, one per event, if the file records them for every
    /// event of that device.
    pub fn totals_of(&self, device: i32) -> Option<&[RecordedTotals]> {
        let events = self.device(device)?.events.len();
        self.recorded_totals
            .iter()
            .find(|t| t.device == device && t.totals.len() == events)
            .map(|t| t.totals.as_slice())
    }

    /// What a format without recorded totals (`format`) loses of this trace: one line per device
    /// it `writes` whose events carry them (a profiler trace's `Total Allocated` and `Total
    /// Reserved`, from which the memory live and reserved before the first event follow).
    pub(crate) fn totals_loss(&self, format: &str, writes: impl Fn(i32) -> bool) -> Vec<String> {
        (self.recorded_totals.iter())
            .filter(|t| !t.totals.is_empty() && writes(t.device))
            .map(|t| {
                format!(
                    "device {}: the recorded Total Allocated and Total Reserved are not part of \
                     the {format} format: a replay of the output starts with nothing live or \
                     reserved before its first event",
                    t.device
                )
            })
            .collect()
    }

    /// The events of `device` before which the recorded run gave memory back: its recorded
    /// `Total Reserved` after the event is below the level after the one before. A caching
    /// allocator's reserve falls only when it releases cached segments (`empty_cache()`, or the
    /// release of an out-of-memory retry or of the garbage collector), and no Kineto event
    /// records that: the fall is all that shows it. Empty without recorded totals.
    pub fn reserve_falls(&self, device: i32) -> Vec<u64> {
        let Some(totals) = self.totals_of(device) else { return Vec::new() };
        let fell = |(i, w): (usize, &[RecordedTotals])| {
            (w[1].reserved < w[0].reserved).then_some(i as u64 + 1)
        };
        totals.windows(2).enumerate().filter_map(fell).collect()
    }

    /// The private pool event `e` names, where entries name one: `Some(None)` for the default
    /// pools, `None` where the file does not say (or names a pool it does not list).
    pub(crate) fn entry_pool(&self, e: &Event) -> Option<Option<PoolId>> {
        let pools = self.entry_pools.as_ref()?;
        match e.pool {
            PoolRef::DEFAULT => Some(None),
            named => named.private_in(pools).map(Some),
        }
    }

    /// True when the trace's pools were inferred from a profiler trace's recorded addresses
    /// (docs/pytorch-model.md#kineto-addresses), not named by its entries.
    pub fn pools_inferred(&self) -> bool {
        self.entry_pools.as_ref().is_some_and(|pools| {
            !pools.is_empty() && pools.iter().all(|p| p.0 == kineto_segments::INFERRED_POOL)
        })
    }

    /// What a format that records no platform (`format`) loses of this trace: one line where
    /// the trace shows ROCm, whose rules a replay follows ([`Platform`]).
    pub(crate) fn platform_loss(&self, format: &str) -> Option<String> {
        let p = self.platform.filter(|p| p.is_rocm())?;
        Some(format!(
            "the recording shows it was made on ROCm ({}), which the {format} format does not \
             hold: a replay of the output follows CUDA's rules (expandable segments before \
             PyTorch 2.12)",
            p.why()
        ))
    }

    /// What a format that cannot name pools loses of this trace: one line where some entry
    /// names a private pool (or was put in one inferred from recorded addresses).
    pub(crate) fn entry_pools_loss(&self, format: &str) -> Option<String> {
        let named = self.devices.iter().flat_map(|d| &d.events).filter(|e| e.pool.0 != 0).count();
        (named > 0).then(|| match self.pools_inferred() {
            true => format!(
                "{named} entries lie in a pool apart inferred from their recorded addresses \
                 (docs/pytorch-model.md#kineto-addresses), which the {format} format does not \
                 hold: a replay of the output infers it again only from a profiler trace"
            ),
            false => format!(
                "{named} entries name a private pool (pool_id), which the {format} format does \
                 not hold"
            ),
        })
    }

    /// The final segments of `device`.
    pub fn segments_of(&self, device: i32) -> impl Iterator<Item = &Segment> {
        self.segments.iter().filter(move |s| s.device == device)
    }
}

/// How [`Trace::default_device`] ranks a device with `events` events: most events, then a GPU
/// before host memory, then the lowest number.
pub(crate) fn device_rank(events: usize, device: i32) -> (usize, bool, i64) {
    (events, device >= 0, -(device as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_fits_the_memory_budget() {
        assert_eq!(std::mem::size_of::<Event>(), 40);
    }

    #[test]
    fn formats_without_pools_say_they_drop_the_entries_pools() {
        let named = Event { pool: PoolRef(1), ..Event::new(Action::Alloc, 0x1000, 512, 0, 0) };
        let mut t = Trace {
            devices: vec![DeviceTrace { device: 0, events: vec![named] }],
            entry_pools: Some(vec![(0, 1)]),
            ..Trace::default()
        };
        let want = "1 entries name a private pool (pool_id), which the text format does not hold";
        assert_eq!(text::losses(&t), [want]);
        assert!(kineto::losses(&t).iter().any(|l| l.contains("which the Kineto format")));
        assert!(rmm::losses(&t).iter().any(|l| l.contains("which the RMM log format")));
        t.devices[0].events[0].pool = PoolRef::DEFAULT;
        assert!(text::losses(&t).is_empty(), "the default pools lose nothing");
    }

    #[test]
    fn a_tie_for_the_default_device_goes_to_a_gpu() {
        let pick = |devices: &[(i32, usize)]| {
            devices.iter().max_by_key(|d| device_rank(d.1, d.0)).map(|d| d.0)
        };
        assert_eq!(pick(&[(-1, 15), (0, 15), (1, 15)]), Some(0));
        assert_eq!(pick(&[(1, 15), (-1, 15)]), Some(1));
        assert_eq!(pick(&[(-1, 16), (0, 15)]), Some(-1), "more events still win");
    }

    #[test]
    fn action_names_round_trip() {
        for a in Action::ALL {
            assert_eq!(Action::from_name(a.name()), Some(a));
        }
        assert_eq!(Action::from_name("free"), None);
    }
}
