//! `pytorch`: PyTorch's CUDA caching allocator, decision for decision.
//!
//! Upstream: `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator`: `malloc`,
//! `get_free_block`, `should_split`, `alloc_found_block`, `free_block`, `try_merge_blocks`,
//! `alloc_block`, `release_available_cached_blocks`, `release_cached_blocks`,
//! `garbage_collect_cached_blocks`, expandable segments), as docs/pytorch-model.md describes it.
//! Options: [`config`].
//!
//! State: a block arena indexed by `u32` (neighbours are indices, as PyTorch's are pointers), and
//! per pool (small, large) a free set ordered by (stream, size, address) — the order of PyTorch's
//! `BlockPool::blocks` (see `policy/free_set.rs`; walks across streams sort by the raw stream
//! value) — and a `BTreeMap` of unmapped expandable ranges keyed by (stream, address). A free
//! finds its block by the [`Handle`] malloc gave it (the block's index), or, when freed by
//! address alone, in an open-addressing table (`active.rs`, PyTorch's `active_blocks`) built at
//! the first such free. Every choice is deterministic: best fit, then lowest address.
//!
//! Private pools (CUDA graphs, `torch.cuda.MemPool`): a recorded start state's segments that a
//! private pool owns are installed in that pool, whose free blocks only mallocs made into the
//! pool take ([`Policy::allocate_into`], which the replay and `validate` call from where each
//! allocation was recorded) and no flush releases, as in PyTorch while the graph or pool lives.
//! With expandable segments a private pool has reservations of its own, or cudaMalloc segments
//! as PyTorch before ≈ 2.5 gave it (`Config::expandable_in_private_pools`).
//!
//! Deviations: frees take effect when the engine calls [`Policy::free`] (at `free_completed`), so
//! `record_stream` delays come from the trace; a capture is taken to be underway only for a
//! malloc made into a private pool or one the caller says ran during a capture
//! (`PyTorch::set_capture_underway`; PyTorch skips the release-everything fallback for every
//! malloc while any capture is underway); a `MemPool` with a custom allocator is known only where
//! the recording shows it ([`Config::own_allocator_pools`]), else it is modelled as any private
//! pool; no IPC callbacks (the free-memory callback is taken to release nothing); `cudaMalloc`
//! and page mapping go through the [`Backend`], whose capacity decides when they fail.

mod active;
pub mod config;
pub(crate) mod expandable;
pub mod start;
pub mod warm;

pub use config::{Config, Flavour, PlatformExpandable, Version};

use super::chunks::unknown_block;
use super::{Allocation, Handle, Policy};
use super::{PolicyContext, Registration, Role};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::{Block as SnapBlock, BlockState, PoolKind, Segment};
use config::{MIN_BLOCK_SIZE, SMALL_SIZE};
use std::collections::BTreeMap;

/// A segment's or mapped range's blocks in address order: (start, size, live request or `None`
/// when free), as start-state recovery installs them.
pub type Tiling = Vec<(u64, u64, Option<u64>)>;

/// A mapped range of an expandable segment: (start, size, its blocks).
pub type MappedRange = (u64, u64, Tiling);

/// The policy's name in `--policy`.
pub const NAME: &str = "pytorch";

/// A line of [`POLICIES`](super::POLICIES) for one way of building [`PyTorch`]: each models an
/// allocator, so each is [`Role::Online`] (`pytorch`, the recording's own, is
/// [`Role::Recorded`]).
const fn online(
    name: &'static str,
    summary: &'static str,
    options: fn() -> String,
    build: fn(&str, &PolicyContext) -> Result<PyTorch>,
) -> Registration<PyTorch> {
    Registration { name, summary, role: Role::Online, options, build }
}

/// `pytorch`'s line in [`POLICIES`](super::POLICIES): the allocator that made the recording
/// ([`Role::Recorded`]), CUDA's or torch_npu's.
pub const POLICY: Registration<PyTorch> = Registration {
    role: Role::Recorded,
    ..online(
        NAME,
        "PyTorch's caching allocator: CUDA's, or torch_npu's for a torch_npu recording (default: recorded settings)",
        || "PYTORCH_CUDA_ALLOC_CONF syntax, e.g. max_split_size_mb:128,roundup_power2_divisions:4; or 'recorded'".into(),
        PyTorch::from_spec,
    )
};

/// `pytorch-npu`'s line in [`POLICIES`](super::POLICIES): torch_npu's allocator whatever made
/// the recording.
pub const NPU: Registration<PyTorch> = online(
    "pytorch-npu",
    "torch_npu's caching allocator for Huawei Ascend NPUs (PYTORCH_NPU_ALLOC_CONF options; default: recorded settings)",
    || "PYTORCH_NPU_ALLOC_CONF syntax, e.g. expandable_segments:True,base_addr_aligned_kb:16; or 'recorded'".into(),
    PyTorch::npu_from_spec,
);

/// `pytorch-cuda`'s line in [`POLICIES`](super::POLICIES): CUDA's allocator even for a
/// torch_npu recording, which `pytorch` replays with torch_npu's rules.
pub const CUDA: Registration<PyTorch> = online(
    "pytorch-cuda",
    "PyTorch's CUDA caching allocator, also for a torch_npu recording",
    || "PYTORCH_CUDA_ALLOC_CONF syntax, as for pytorch".into(),
    PyTorch::cuda_from_spec,
);

/// `pytorch-expandable`'s line in [`POLICIES`](super::POLICIES).
pub const EXPANDABLE: Registration<PyTorch> = online(
    "pytorch-expandable",
    "PyTorch's caching allocator with expandable_segments:True",
    || "PYTORCH_CUDA_ALLOC_CONF syntax (expandable_segments is forced on)".into(),
    PyTorch::expandable_from_spec,
);

const NIL: u32 = u32::MAX;

/// One block of a segment (PyTorch's `Block`).
#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    /// Request size of the last allocation that used this block object.
    requested: u64,
    stream: u64,
    /// The stream's index in `PyTorch::streams`, the leading part of the free-set keys.
    sid: u32,
    prev: u32,
    next: u32,
    /// Index of the expandable segment, or [`NIL`] for a cudaMalloc segment.
    expandable: u32,
    /// The pool's GC clock when the block was last inserted into the free set.
    gc_base: u64,
    /// 0: the default pools; `k > 0`: the private pool `PyTorch::private_pools[k - 1]`.
    pool: u16,
    small: bool,
    allocated: bool,
    mapped: bool,
    in_use: bool,
}

impl Block {
    /// True when this is the allocated block at `addr` (what a [`Handle`] must name).
    #[inline]
    fn is_allocated_at(&self, addr: u64) -> bool {
        self.in_use && self.allocated && self.ptr == addr
    }
}

/// One pool's free sets (PyTorch's `BlockPool`).
#[derive(Debug, Default)]
struct Pool {
    /// Free mapped blocks, by (stream, size, address).
    blocks: super::free_set::FreeSet,
    /// Unmapped expandable ranges, by (stream, address) packed into one [`unmapped_key`].
    unmapped: BTreeMap<u128, u32>,
    /// `get_free_blocks_call_count`, the GC clock.
    gc_count: u64,
    /// A private pool whose MemPool has an allocator of its own
    /// ([`Config::own_allocator_pools`]): no expandable segments for it.
    own_allocator: bool,
}

/// Addresses and sizes must stay below this (real ones are below 2^48).
const KEY_LIMIT: u64 = 1 << 56;

/// The unmapped-set key of a block: (stream index, address), as `BlockComparatorAddress`.
#[inline]
fn unmapped_key(sid: u32, ptr: u64) -> u128 {
    (sid as u128) << 64 | ptr as u128
}

/// A cudaMalloc segment: its size.
#[derive(Clone, Copy, Debug)]
struct SegmentInfo {
    size: u64,
}

/// One expandable segment: a VA reservation for one (stream, pool).
#[derive(Clone, Debug)]
struct ExpandableSegment {
    base: u64,
    va_size: u64,
    page: u64,
    alive: bool,
}

/// Counters PyTorch keeps in `DeviceStats` that the simulator reports or checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// `segment.all.current`: live cudaMalloc segments.
    pub segments: u64,
    /// `oversize_segments.current`.
    pub oversize_segments: u64,
    /// `oversize_allocations.current`.
    pub oversize_allocations: u64,
    /// `num_device_alloc`: cudaMalloc and map calls.
    pub num_device_alloc: u64,
    /// `num_device_free`: cudaFree and unmap calls.
    pub num_device_free: u64,
    /// `num_ooms`.
    pub num_ooms: u64,
    /// `num_oom_rejections` (2.12+): of `num_ooms`, requests `throw_on_cudamalloc_oom`
    /// rejected at once for passing the memory fraction's limit.
    pub num_oom_rejections: u64,
    /// `requested_bytes.all.current`.
    pub requested_bytes: u64,
}

/// PyTorch's caching allocator. See the module docs.
///
/// `DEFAULT_RULES` true is the same allocator with the decisions that PyTorch's default
/// configuration fixes made at compile time (`PyTorch::has_default_rules`): no garbage
/// collection, no `max_split_size`, no rounding divisions, no expandable segments, requests
/// that are requests. Those settings are read on every malloc and free, and most runs leave
/// them at their defaults, so the replay runs that form whenever it can
/// ([`Policy::run_by`]). It makes the same decisions (tested on every bundled snapshot) with
/// about 7% fewer instructions and 4–5% less wall time on the replay bench's workload.
#[derive(Debug)]
pub struct PyTorch<const DEFAULT_RULES: bool = false> {
    config: Config,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    /// The default pools. Index 0: large pool; 1: small pool.
    pools: [Pool; 2],
    /// Each private pool's large and small pools, in the order of `private_pools`.
    private: Vec<Pool>,
    /// The private pools (`segment_pool_id`), in order of first sight: a CUDA graph's or a
    /// `torch.cuda.MemPool`'s, from a recorded start state or [`Policy::allocate_into`]. Their
    /// free blocks go only to mallocs made into the pool, as the real allocator never hands them
    /// to an allocation outside it, and frees return blocks to their own pool. No flush
    /// releases them until their graph or pool is gone ([`PyTorch::freeable`]), as in PyTorch.
    private_pools: Vec<(u64, u64)>,
    /// The private pools (numbers as in [`Block::pool`]) whose graph or pool is gone
    /// ([`Policy::release_pool`]), in the order they went, and the pools a profiler trace's
    /// addresses inferred ([`PyTorch::pool_number`]): every flush releases them too.
    freeable: Vec<u16>,
    /// The pool mallocs allocate into: 0, the default pools; `k`, private pool `k`
    /// ([`PyTorch::allocate_into`], what `begin_allocate_to_pool` does during graph capture).
    into: u16,
    /// A CUDA graph capture is underway on some stream (set by [`PyTorch::set_capture_underway`];
    /// implied for a malloc into a private pool): no malloc falls back to releasing every
    /// cached segment.
    capture_underway: bool,
    /// Allocated blocks by address (PyTorch's `active_blocks`), for frees by address alone:
    /// built from the blocks at the first such free, then kept. A replay frees by
    /// [`Handle`] (the block's index) and never needs it.
    active: Option<active::ActiveMap>,
    segments: BTreeMap<u64, SegmentInfo>,
    expandable: Vec<ExpandableSegment>,
    /// Every stream seen, indexed by the `sid` in keys.
    streams: Vec<u64>,
    /// Each stream's index in `streams`, so a lookup costs the same with 50,000 streams as with
    /// one (the first stream, the usual only one, is found without hashing).
    stream_index: std::collections::HashMap<u64, u32>,
    allocated: u64,
    /// `total_allocated_memory`: cudaMalloc'd segments plus mapped pages.
    total_allocated: u64,
    alloc_retries: u64,
    stats: Stats,
    /// GC is on (threshold and memory fraction both set): fixed at construction.
    gc_on: bool,
    /// The recorded allocator's segments at a snapshot's first event, installed by
    /// [`Policy::start`] (see [`PyTorch::with_recorded_start`]); taken when installed.
    start: Option<Box<start::StartState>>,
    /// What of the start state did not fit under the limits when it was installed
    /// ([`Policy::start_fit`]).
    start_fit: Option<crate::backend::StartFit>,
    /// A warm Kineto trace's cache before its first event ([`warm::plan`]), installed by
    /// [`Policy::start`] after the live blocks; taken when installed.
    warm: Option<Box<warm::WarmCache>>,
    /// Bases of free segments a warm profiler trace's plan keeps through every release: memory
    /// the real cache held in segments with blocks the trace does not show (live throughout, or
    /// a live CUDA graph's), which serves requests but no release gives back
    /// (docs/pytorch-model.md#kineto-warm-start). Empty everywhere else.
    pub(crate) unreleasable: std::collections::HashSet<u64>,
    /// Requests are recorded block sizes (a Kineto trace, see [`PyTorch::reading_kineto`]): a
    /// block found larger is split down to the request whenever the rest can be a block.
    exact_blocks: bool,
    /// No `roundup_power2_divisions` interval has divisions (PyTorch's default): every request
    /// rounds up to a multiple of 512 bytes, with no look-up of its interval. Fixed at
    /// construction, as the configuration is.
    plain_rounding: bool,
    /// Where the next malloc places its block ([`Policy::place_next_at`]): an exact-address
    /// allocation (`mallocWithAddress`, PyTorch 2.13+). Taken by that malloc.
    place_at: Option<u64>,
    /// The warm cache [`Policy::start`] installed, as assumed ([`Policy::assumed_start`]).
    assumed_start: Option<crate::backend::AssumedStart>,
    /// The release a spec asked for (`version=X.Y`), shown in [`Policy::config`]; `None` where
    /// the release modelled is the recording's.
    shown_version: Option<Version>,
}

/// The oversize rules of `get_free_block` (docs/pytorch-model.md#oversize): a request below
/// `max_split_size` takes no oversize block, and an oversize request takes none more than the
/// tolerance above it.
#[inline(always)]
fn oversize_refused(config: &Config, size: u64, found: u64) -> bool {
    let max_split = config.max_split_size;
    if size < max_split {
        found >= max_split
    } else {
        found >= size.saturating_add(config.tolerance())
    }
}

/// [`PyTorch::owner_mut`] from the two fields that hold the pools, so that a caller can hold
/// the pool while it reads the blocks.
#[inline(always)]
fn pool_in<'a>(
    pools: &'a mut [Pool; 2],
    private: &'a mut [Pool],
    owner: u16,
    small: bool,
) -> &'a mut Pool {
    match owner {
        0 => &mut pools[pool_index(small)],
        k => &mut private[2 * (k as usize - 1) + small as usize],
    }
}

/// The index in `PyTorch::pools` of the default pool a request of this kind uses.
fn pool_index(small: bool) -> usize {
    small as usize
}

impl PyTorch {
    /// A policy with `config` and an empty cache.
    pub fn new(config: Config) -> PyTorch {
        PyTorch {
            blocks: Vec::with_capacity(1024),
            spare: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            private: Vec::new(),
            private_pools: Vec::new(),
            freeable: Vec::new(),
            into: 0,
            capture_underway: false,
            active: None,
            segments: BTreeMap::new(),
            expandable: Vec::new(),
            streams: Vec::new(),
            stream_index: std::collections::HashMap::new(),
            allocated: 0,
            total_allocated: 0,
            alloc_retries: 0,
            stats: Stats::default(),
            gc_on: config.garbage_collection_threshold > 0.0
                && config.allowed_memory_maximum().is_some(),
            plain_rounding: config.flavour == Flavour::Cuda
                && config.roundup_power2_divisions.iter().all(|&d| d <= 1),
            config,
            start: None,
            start_fit: None,
            warm: None,
            unreleasable: Default::default(),
            exact_blocks: false,
            place_at: None,
            assumed_start: None,
            shown_version: None,
        }
    }

    /// The same policy reading a Kineto trace's `[memory]` `Bytes` as what they are: the
    /// allocator reports `block->size` to the profiler (and sums block sizes into `Total
    /// Allocated`), so each recorded size is the block the real allocator handed out — already
    /// rounded, and already including any tail it chose not to split off. The request behind it is
    /// not recorded. Replaying the size as a fresh request would let the policy add another
    /// unsplit tail on top (a block up to 1 MiB larger in the large pool), counting bytes the real
    /// run never allocated; so the recorded size is honoured as the block: a larger free block is
    /// split down to it whenever the rest can be a block. Peak allocated bytes then equal the
    /// profiler's `Total Allocated` wherever the replay serves every request.
    ///
    /// A Kineto trace that starts warm (its first `Total Reserved` above what its live blocks'
    /// segments need) also starts with that memory cached, in free segments of assumed sizes
    /// ([`warm::plan`], docs/pytorch-model.md#kineto-warm-start).
    ///
    /// An exported run ([`PolicyContext::exported`]) does neither: its snapshot records each size
    /// as a request, and `validate` replays it with PyTorch's own split rule from a cold cache,
    /// which splits a large block only where more than 1 MiB is left.
    pub(crate) fn reading_kineto(mut self, context: &PolicyContext) -> PyTorch {
        if context.exported {
            return self;
        }
        self.exact_blocks = context.trace.source_format() == crate::trace::Format::Kineto;
        self.warm = warm::plan(&self, context).map(Box::new);
        self
    }

    /// The same policy starting from `state`, installed as [`PyTorch::with_recorded_start`]'s
    /// is: `validate` recovers the state itself and tries variants of it.
    pub(crate) fn starting_from(mut self, state: start::StartState) -> PyTorch {
        self.start = Some(Box::new(state));
        self
    }

    /// The same policy starting where the recorded allocator was at the first event of a
    /// PyTorch snapshot: every segment reserved then (recovered from the final segments walked
    /// back over the segment events, [`start::StartState`]), with its live blocks and its cached
    /// free blocks. Without this the replay would start from the live blocks alone and miss the
    /// cache the real run already held — its reserved memory would start, and usually peak, below
    /// the recording's. Kept only when the recovered state can be installed under this
    /// configuration: expandable segments in both or in neither (a recording's mapped pages
    /// cannot become cudaMalloc segments, nor its segments pages), and not for other formats
    /// (no final segments to walk back from). A recording's expandable layout also tells the
    /// GPU's memory, which sizes reservations and any `per_process_memory_fraction`: taken from
    /// it, as `validate` infers it, unless the replay knows the GPU's memory
    /// ([`PolicyContext::gpu_memory`]).
    pub(crate) fn with_recorded_start(mut self, context: &PolicyContext) -> PyTorch {
        self.start = None;
        let trace = context.trace;
        if trace.source_format() != crate::trace::Format::PytorchSnapshot
            || trace.segments_of(context.device).next().is_none()
        {
            return self;
        }
        let (events, lifetimes) = (context.events, context.lifetimes);
        let recover = |config: &Config| {
            start::StartState::recover_from(trace, context.device, events, lifetimes, config)
        };
        let mut start = recover(&self.config);
        // The GPU's memory sizes expandable reservations and any memory fraction, and only the
        // recorded layout tells it (as `validate` infers it), unless the replay knows it.
        if start.expandable && context.gpu_memory.is_none() {
            if let Some(fit) = expandable::recorded_gpu_memory_fit(events, &start, &self.config) {
                let gpu = fit.modelled(self.config.gpu_memory);
                if gpu != self.config.gpu_memory {
                    self.config.gpu_memory = gpu;
                    start = recover(&self.config);
                }
            }
        }
        if start.expandable == self.config.expandable_segments && !start.segments.is_empty() {
            self.start = Some(Box::new(start));
        }
        self
    }

    /// Builds the policy from `PYTORCH_CUDA_ALLOC_CONF` options (`recorded` or empty: the trace's
    /// recorded settings, else PyTorch's defaults), on the GPU the replay names
    /// ([`PolicyContext::gpu_memory`]), starting from the recorded start state where there is one.
    /// The allocator is the one that made the recording ([`Flavour::of_trace`]): torch_npu's
    /// for a torch_npu recording, else CUDA's.
    pub(crate) fn from_spec(options: &str, context: &PolicyContext) -> Result<PyTorch> {
        PyTorch::from_spec_as(options, context, None)
    }

    /// [`PyTorch::from_spec`] with CUDA's rules whatever made the recording (`pytorch-cuda`:
    /// what would this run do on a GPU).
    pub(crate) fn cuda_from_spec(options: &str, context: &PolicyContext) -> Result<PyTorch> {
        PyTorch::from_spec_as(options, context, Some(Flavour::Cuda))
    }

    /// [`PyTorch::from_spec`] with torch_npu's rules whatever made the recording
    /// (`pytorch-npu`; its options are `PYTORCH_NPU_ALLOC_CONF` syntax).
    pub(crate) fn npu_from_spec(options: &str, context: &PolicyContext) -> Result<PyTorch> {
        PyTorch::from_spec_as(options, context, Some(Flavour::Npu))
    }

    /// [`PyTorch::from_spec`] for `flavour`'s allocator (`None`: the recording's).
    fn from_spec_as(
        options: &str,
        context: &PolicyContext,
        flavour: Option<Flavour>,
    ) -> Result<PyTorch> {
        let config = settings_for(options, context, false, flavour)?;
        let shown = PyTorch::new(config).showing_version(options)?;
        Ok(shown.with_recorded_start(context).reading_kineto(context))
    }

    /// Like [`PyTorch::from_spec`] with `expandable_segments:True` forced, from an empty cache
    /// (a recording's cudaMalloc segments cannot become mapped pages).
    pub(crate) fn expandable_from_spec(options: &str, context: &PolicyContext) -> Result<PyTorch> {
        let config = settings_for(options, context, true, None)?;
        Ok(PyTorch::new(config).showing_version(options)?.reading_kineto(context))
    }

    /// The policy with the release `options` ask for (`version=X.Y`) shown in its
    /// configuration, so that runs of several releases are told apart in every result.
    fn showing_version(mut self, options: &str) -> Result<PyTorch> {
        self.shown_version = config::split_version(options)?.1;
        Ok(self)
    }
}

/// The settings a replay's `pytorch` policy runs with, decided once before the policy is built:
/// the options (or the recorded settings), `expandable_segments` when `force_expandable`, and
/// the GPU's memory — the replay's card where it names one (`--capacity`, the base of
/// `per_process_memory_fraction` and of expandable reservations), else at least what the
/// recording proves. Every other rule the policy follows (the recorded start state, Kineto's
/// exact blocks) is derived from the trace by the constructors, never dropped by a later step.
/// The recording's own allocator (`flavour` `None`) keeps its platform's rules: on ROCm before
/// 2.12, expandable segments asked for are not in effect ([`PlatformExpandable::Ignored`]).
fn settings_for(
    options: &str,
    context: &PolicyContext,
    force_expandable: bool,
    flavour: Option<Flavour>,
) -> Result<Config> {
    let own_platform = flavour.is_none();
    let flavour = flavour.unwrap_or_else(|| Flavour::of_trace(context.trace));
    let (options, asked) = config::split_version(options)?;
    let version = config::modelled_version(&options, asked, context.trace)?.version;
    let mut config = config_for(&options, context, version, flavour)?;
    if force_expandable {
        config.expandable_segments = true;
    }
    let ignored =
        PlatformExpandable::of(context.trace, version) == Some(PlatformExpandable::Ignored);
    if own_platform && ignored && config.expandable_segments {
        config.expandable_segments = false;
        config.expandable_unsupported = true;
    }
    Ok(match context.gpu_memory {
        Some(total) => Config { gpu_memory: total, ..config },
        None => at_least_recorded_gpu_memory(config, context),
    })
}

impl<const DEFAULT_RULES: bool> PyTorch<DEFAULT_RULES> {
    /// True when this configuration decides every malloc and free as PyTorch's default one
    /// does: then [`PyTorch::with_default_rules`] makes the same decisions.
    pub(crate) fn has_default_rules(&self) -> bool {
        !self.gc_on
            && self.plain_rounding
            && !self.exact_blocks
            && self.config.max_split_size == u64::MAX
            && !self.config.expandable_segments
            && self.config.flavour == Flavour::Cuda
    }

    /// The same policy in the form that makes the default configuration's decisions at compile
    /// time, when it [`has_default_rules`](PyTorch::has_default_rules); else itself, unchanged.
    // Both variants are the policy itself, moved once per replay; boxing it would buy nothing.
    #[allow(clippy::result_large_err)]
    pub(crate) fn with_default_rules(self) -> std::result::Result<PyTorch<true>, Self> {
        if self.has_default_rules() {
            Ok(self.retyped())
        } else {
            Err(self)
        }
    }

    /// The same state as the form `TO` of the policy.
    fn retyped<const TO: bool>(self) -> PyTorch<TO> {
        // A struct update (`..self`) cannot change the type, so every field is moved by name,
        // each named once here; the destructuring (no `..`) makes a new field a compile error
        // until it is carried over.
        macro_rules! carry {
            ($this:expr; $($field:ident),* $(,)?) => {{
                let PyTorch { $($field,)* active } = $this;
                // The default-rules form keeps no map of allocated blocks
                // ([`PyTorch::allocated_at`]); the general form builds it again at its first free
                // by address.
                PyTorch { $($field,)* active: if TO { None } else { active } }
            }};
        }
        carry!(self;
            config, blocks, spare, pools, private, private_pools, freeable, into, capture_underway,
            segments, expandable, streams, stream_index, allocated, total_allocated, alloc_retries, stats, gc_on,
            start, start_fit, warm, exact_blocks, plain_rounding, place_at, assumed_start,
            shown_version, unreleasable,
        )
    }

    /// `round_size` (docs/pytorch-model.md#rounding), without the interval look-up when no interval
    /// has divisions.
    #[inline(always)]
    fn round_size(&self, size: u64) -> u64 {
        if DEFAULT_RULES || self.plain_rounding {
            config::round_to_blocks(size)
        } else {
            self.config.round_size(size)
        }
    }

    /// The oversize rules of `get_free_block` ([`oversize_refused`]); never, by default.
    #[inline(always)]
    fn refuses_oversize(&self, size: u64, found: u64) -> bool {
        !DEFAULT_RULES && oversize_refused(&self.config, size, found)
    }

    /// A block of `size` bytes is oversize (`max_split_size` or more); never, by default.
    #[inline(always)]
    fn is_oversize(&self, size: u64) -> bool {
        !DEFAULT_RULES && size >= self.config.max_split_size
    }

    /// The effective settings.
    pub fn settings(&self) -> &Config {
        &self.config
    }

    /// PyTorch's counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// `total_allocated_memory` (= `reserved_bytes.all.current`).
    pub fn reserved(&self) -> u64 {
        self.total_allocated
    }

    #[inline]
    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.spare.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    #[inline]
    fn drop_block(&mut self, id: u32) {
        self.blocks[id as usize].in_use = false;
        self.spare.push(id);
    }

    /// The pool that owns a block of private pool number `owner` (0: the default pools) and
    /// size class `small`.
    #[inline(always)]
    fn owner_mut(&mut self, owner: u16, small: bool) -> &mut Pool {
        pool_in(&mut self.pools, &mut self.private, owner, small)
    }

    /// [`PyTorch::owner_mut`], to read.
    #[inline(always)]
    fn owner(&self, owner: u16, small: bool) -> &Pool {
        match owner {
            0 => &self.pools[pool_index(small)],
            k => &self.private[2 * (k as usize - 1) + small as usize],
        }
    }

    #[inline]
    fn b(&self, id: u32) -> &Block {
        &self.blocks[id as usize]
    }

    #[inline]
    fn bm(&mut self, id: u32) -> &mut Block {
        &mut self.blocks[id as usize]
    }

    /// The index of `stream`, if it was seen.
    #[inline]
    fn sid_of(&self, stream: u64) -> Option<u32> {
        if self.streams.first() == Some(&stream) {
            return Some(0);
        }
        self.stream_index.get(&stream).copied()
    }

    /// The index of `stream`, assigned on first sight.
    fn intern(&mut self, stream: u64) -> Result<u32> {
        if let Some(i) = self.sid_of(stream) {
            return Ok(i);
        }
        if self.streams.len() > u16::MAX as usize {
            return Err(Error::input("more than 65536 streams on one device"));
        }
        self.streams.push(stream);
        let i = (self.streams.len() - 1) as u32;
        self.stream_index.insert(stream, i);
        Ok(i)
    }

    /// Checks that a range from the backend fits the packed keys.
    fn check_range(ptr: u64, size: u64) -> Result<()> {
        if ptr.checked_add(size).is_none_or(|end| end >= KEY_LIMIT) {
            return Err(Error::input(format!(
                "address range {ptr:#x}+{size} is beyond 2^56, which the pytorch policy cannot index"
            )));
        }
        Ok(())
    }

    /// A pool's free blocks in PyTorch's (stream, size, address) order. Keys order streams by
    /// first sight, so walks that cross streams (flush, GC) sort by the raw stream value.
    fn free_blocks_in_order(&self, pool: &Pool) -> Vec<u32> {
        let mut ids: Vec<u32> = pool.blocks.ids().collect();
        ids.sort_by_key(|&id| {
            let b = self.b(id);
            (b.stream, b.size, b.ptr)
        });
        ids
    }

    fn gc_enabled(&self) -> bool {
        !DEFAULT_RULES && self.gc_on
    }

    /// Puts a free mapped block into its pool's free set (GC base reset).
    #[inline(always)]
    fn insert_free(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        let pool = pool_in(&mut self.pools, &mut self.private, b.pool, b.small);
        pool.blocks.insert(b.sid, b.size, b.ptr, id);
        // The clock stands at 0 without GC (it ticks only with GC on), as does every base.
        if !DEFAULT_RULES {
            b.gc_base = pool.gc_count;
        }
    }

    #[inline(always)]
    fn remove_free(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let pool = pool_in(&mut self.pools, &mut self.private, b.pool, b.small);
        if b.mapped {
            pool.blocks.remove(b.sid, b.size, b.ptr);
        } else {
            pool.unmapped.remove(&unmapped_key(b.sid, b.ptr));
        }
    }

    fn is_split(&self, id: u32) -> bool {
        let b = self.b(id);
        b.prev != NIL || b.next != NIL
    }

    /// `expandable_size`: a block's size plus the unmapped range right after it.
    fn expandable_size(&self, id: u32) -> u64 {
        let b = self.b(id);
        match b.next {
            NIL => b.size,
            n if !self.b(n).mapped => b.size + self.b(n).size,
            _ => b.size,
        }
    }

    /// `get_free_block` (docs/pytorch-model.md#best-fit): best fit on the request's stream, then
    /// the oversize rules.
    ///
    /// Most mallocs of a training step find a block of a cudaMalloc segment first, and take
    /// it: that path reaches the pool once (the GC clock, the search and the removal) and the
    /// block once. Reaching them twice would cost about 4% of `pytorch`'s instructions.
    ///
    /// The block's id and its size (the free set's key, so that the split rule need not read
    /// the block).
    #[inline(always)]
    fn get_free_block(&mut self, stream: u64, size: u64, small: bool) -> Option<(u32, u64)> {
        let sid = self.sid_of(stream);
        let gc = self.gc_enabled();
        let pool = pool_in(&mut self.pools, &mut self.private, self.into, small);
        // The GC clock ticks on every search, found or not, and for a stream not seen yet.
        if gc {
            pool.gc_count += 1;
        }
        let sid = sid?;
        let ((found, ptr, id), spot) = pool.blocks.first_at(sid, size, 0)?;
        if self.blocks[id as usize].expandable != NIL {
            return self.take_past_expandable(sid, size, small, (found, ptr, id));
        }
        // (Not `refuses_oversize`: `pool` holds `self` mutably here.)
        if !DEFAULT_RULES && oversize_refused(&self.config, size, found) {
            return None;
        }
        pool.blocks.remove_at(sid, spot);
        Some((id, found))
    }

    /// [`PyTorch::get_free_block`] when the first block found, `first` (size, address, id), is
    /// in an expandable segment: the rule's step on from it, and the removal of what it found.
    #[inline(always)] // the common path with expandable segments on
    fn take_past_expandable(
        &mut self,
        sid: u32,
        size: u64,
        small: bool,
        first: (u64, u64, u32),
    ) -> Option<(u32, u64)> {
        let blocks = &self.owner(self.into, small).blocks;
        let (found, ptr, id) = self.past_expandable(blocks, sid, first)?;
        if self.refuses_oversize(size, found) {
            return None;
        }
        self.owner_mut(self.into, small).blocks.remove(sid, found, ptr);
        Some((id, found))
    }

    /// The search of `get_free_block`, without its side effects: the block it would take.
    fn find_free_block(&self, stream: u64, size: u64, small: bool) -> Option<u32> {
        let sid = self.sid_of(stream)?;
        let blocks = &self.owner(self.into, small).blocks;
        let (first, _) = blocks.first_at(sid, size, 0)?;
        let (found, _, id) = match self.b(first.2).expandable {
            NIL => first,
            _ => self.past_expandable(blocks, sid, first)?,
        };
        (!self.refuses_oversize(size, found)).then_some(id)
    }

    /// From `first` (size, address, id), the first block a search found, in an expandable
    /// segment: the block the search takes instead (docs/pytorch-model.md#best-fit). With
    /// expandable segments on, it steps forward while the expandable size keeps going down; with
    /// them off, it skips the stream's expandable blocks.
    #[inline(always)]
    fn past_expandable(
        &self,
        blocks: &super::free_set::FreeSet,
        sid: u32,
        first: (u64, u64, u32),
    ) -> Option<(u64, u64, u32)> {
        let (mut found, mut ptr, mut id) = first;
        if self.config.expandable_segments {
            while let Some((s, p, next)) = blocks.next_after(sid, found, ptr) {
                if self.b(id).expandable != NIL
                    && self.expandable_size(next) < self.expandable_size(id)
                {
                    (found, ptr, id) = (s, p, next);
                } else {
                    break;
                }
            }
        } else {
            loop {
                (found, ptr, id) = blocks.next_after(sid, found, ptr)?;
                if self.b(id).expandable == NIL {
                    break;
                }
            }
        }
        Some((found, ptr, id))
    }

    /// True when a request of `size` bytes on `stream` would be served from the cache now.
    pub fn would_hit_cache(&self, size: u64, stream: u64) -> bool {
        let rounded = self.config.round_size(size);
        self.find_free_block(stream, rounded, rounded <= SMALL_SIZE).is_some()
    }

    /// Whether new memory of pool `owner` (0: the default pools) is pages of its expandable
    /// segments rather than a cudaMalloc segment (`alloc_block`,
    /// docs/pytorch-model.md#new-segment): expandable segments are active for it, and a private
    /// pool has them in this PyTorch (a pool a profiler trace's addresses inferred is replayed
    /// as another stream of the default pools, which has them).
    fn maps_pages(&self, owner: u16, small: bool) -> bool {
        self.expandable_active(owner, small)
            && (owner == 0 || self.config.expandable_in_private_pools() || self.inferred(owner))
    }

    /// Whether pool `owner` is one a profiler trace's addresses inferred
    /// (docs/pytorch-model.md#kineto-addresses).
    fn inferred(&self, owner: u16) -> bool {
        let id = owner.checked_sub(1).and_then(|k| self.private_pools.get(k as usize));
        id.is_some_and(|p| p.0 == crate::trace::kineto_segments::INFERRED_POOL)
    }

    /// `is_expandable_segments_active` for pool `owner`: expandable segments are on and the
    /// pool is not a MemPool with an allocator of its own. (PyTorch before ≈ 2.9 read the flag
    /// alone; a pool with its own allocator could not use expandable segments then.)
    #[inline]
    fn expandable_active(&self, owner: u16, small: bool) -> bool {
        self.config.expandable_segments && (owner == 0 || !self.owner(owner, small).own_allocator)
    }

    /// `should_split` (docs/pytorch-model.md#split-rule) of a block of `block_size` bytes, of size
    /// class `small`, for a request of `size`, in the pool mallocs allocate into (where every block
    /// a malloc takes lies).
    #[inline]
    fn should_split(&self, block_size: u64, size: u64, small: bool) -> bool {
        let remaining = block_size - size;
        if DEFAULT_RULES {
            return if small { remaining >= MIN_BLOCK_SIZE } else { remaining > SMALL_SIZE };
        }
        if small || self.expandable_active(self.into, small) || self.exact_blocks {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// torch_npu's base-address alignment (docs/pytorch-model.md#npu-alignment): the block `id`
    /// of `block_size` bytes found for a request rounded to `rounded` starts past a multiple of
    /// `base_addr_aligned`; when the request still fits from the next multiple on, the bytes
    /// before it stay cached as a free block of their own and the request takes the rest. Why:
    /// Ascend kernels run faster on large buffers aligned so, and torch_npu cuts them so. The
    /// block the request takes, and its size.
    #[inline(never)]
    fn align_base(&mut self, id: u32, block_size: u64, rounded: u64) -> (u32, u64) {
        let align = self.config.base_addr_aligned;
        let b = *self.b(id);
        let offset = (align - b.ptr % align) % align;
        if offset == 0 || offset.saturating_add(rounded) > block_size {
            return (id, block_size);
        }
        self.cut_front(id, offset, block_size)
    }

    /// Cuts the first `offset` bytes off block `id` (of `block_size` bytes, taken off the free
    /// lists), which stay cached as a free block of their own: the block after them, which the
    /// request takes, and its size.
    fn cut_front(&mut self, id: u32, offset: u64, block_size: u64) -> (u32, u64) {
        let b = *self.b(id);
        let rest = block_size - offset;
        let high = self.new_block(Block {
            ptr: b.ptr + offset,
            size: rest,
            requested: 0,
            prev: id,
            in_use: true,
            allocated: false,
            ..b
        });
        if b.next != NIL {
            self.bm(b.next).prev = high;
        }
        let front = self.bm(id);
        front.next = high;
        front.size = offset;
        self.insert_free(id);
        (high, rest)
    }

    /// `mallocWithAddress` (PyTorch 2.13+, docs/pytorch-model.md#exact-address): a request of
    /// `size` bytes on `stream` placed at `addr`, in the free block of the pool mallocs allocate
    /// into that holds `addr` and the rounded request after it. The bytes before `addr` stay
    /// cached as a free block of their own (PyTorch allocates them as a prefix and frees it
    /// again); the rest is split off by the split rule. `None` where no such free block is
    /// there: the caller serves the request as any other.
    #[inline(never)]
    fn malloc_at(&mut self, addr: u64, size: u64, stream: u64) -> Option<Allocation> {
        let rounded = self.round_size(size);
        let sid = self.sid_of(stream)?;
        let mut id = self.head_containing(addr)?;
        while id != NIL && !(self.b(id).ptr <= addr && addr < self.b(id).ptr + self.b(id).size) {
            id = self.b(id).next;
        }
        if id == NIL {
            return None;
        }
        let b = *self.b(id);
        let offset = addr - b.ptr;
        let fits = !b.allocated
            && b.mapped
            && b.expandable == NIL
            && b.sid == sid
            && b.pool == self.into
            && offset.checked_add(rounded).is_some_and(|end| end <= b.size);
        if !fits {
            return None;
        }
        self.remove_free(id);
        let (id, block_size) =
            if offset == 0 { (id, b.size) } else { self.cut_front(id, offset, b.size) };
        let split = self.should_split(block_size, rounded, b.small);
        Some(self.alloc_found_block(id, rounded, size, split))
    }

    /// `alloc_found_block` (docs/pytorch-model.md#split-rule): splits off the low part if asked and
    /// hands it out.
    #[inline(always)]
    fn alloc_found_block(&mut self, id: u32, size: u64, request: u64, split: bool) -> Allocation {
        let mut id = id;
        if split {
            let old = *self.b(id);
            let low = self.new_block(Block {
                ptr: old.ptr,
                size,
                requested: 0,
                next: id,
                in_use: true,
                allocated: false,
                ..old
            });
            if old.prev != NIL {
                self.bm(old.prev).next = low;
            }
            let rest = self.bm(id);
            rest.prev = low;
            rest.ptr += size;
            rest.size -= size;
            self.insert_free(id);
            id = low;
        }
        let oversize = self.is_oversize(self.b(id).size);
        let b = self.bm(id);
        b.allocated = true;
        b.requested = request;
        let (ptr, block_size) = (b.ptr, b.size);
        if !DEFAULT_RULES {
            if let Some(active) = &mut self.active {
                active.insert(ptr, id);
            }
        }
        self.allocated += block_size;
        self.stats.requested_bytes += request;
        if oversize {
            self.stats.oversize_allocations += 1;
        }
        Allocation { addr: ptr, block_size, handle: Handle::new(id) }
    }

    /// `free`'s bookkeeping of the allocated block `id`, then `free_block`.
    #[inline(always)]
    fn free_allocated(&mut self, id: u32) {
        let b = self.bm(id);
        b.allocated = false;
        let (size, request, mapped, prev, next) = (b.size, b.requested, b.mapped, b.prev, b.next);
        self.allocated -= size;
        self.stats.requested_bytes -= request;
        if self.is_oversize(size) {
            self.stats.oversize_allocations -= 1;
        }
        self.free_block_of(id, mapped, prev, next);
    }

    /// The allocated block at `addr`, found without the map of allocated blocks: what a free by
    /// address does in the default-rules form, which keeps no such map (a replay frees by
    /// handle, so the map would cost every malloc and free for a search that never comes).
    #[cold]
    fn allocated_at(&self, addr: u64) -> Option<u32> {
        self.blocks.iter().position(|b| b.is_allocated_at(addr)).map(|id| id as u32)
    }

    /// The allocated blocks by address, built from the blocks on first use.
    #[cold]
    fn active_map(&mut self) -> &mut active::ActiveMap {
        let blocks = &self.blocks;
        self.active.get_or_insert_with(|| {
            let mut map = active::ActiveMap::default();
            for (id, b) in blocks.iter().enumerate().filter(|(_, b)| b.in_use && b.allocated) {
                map.insert(b.ptr, id as u32);
            }
            map
        })
    }

    /// `try_merge_blocks`: merges `src` into `dst` if it is free with the same mapping state.
    /// (Always inlined: most frees have no free neighbour, and the test is a few instructions;
    /// inside the inlined free, a plain `#[inline]` was not taken.)
    #[inline(always)]
    fn try_merge(&mut self, dst: u32, src: u32) -> bool {
        let mapped = self.b(dst).mapped;
        self.try_merge_into(dst, mapped, src)
    }

    /// [`PyTorch::try_merge`] into `dst`, whose mapping state is `mapped`.
    #[inline(always)]
    fn try_merge_into(&mut self, dst: u32, mapped: bool, src: u32) -> bool {
        if src == NIL {
            return false;
        }
        let s = self.b(src);
        if s.allocated || s.mapped != mapped {
            return false;
        }
        self.merge(dst, src);
        true
    }

    /// Merges the free block `src` into its neighbour `dst`.
    fn merge(&mut self, dst: u32, src: u32) {
        let s = *self.b(src);
        self.remove_free(src);
        let d = self.bm(dst);
        if s.next == dst {
            d.ptr = s.ptr;
            d.prev = s.prev;
            d.size += s.size;
            if s.prev != NIL {
                self.bm(s.prev).next = dst;
            }
        } else {
            d.next = s.next;
            d.size += s.size;
            if s.next != NIL {
                self.bm(s.next).prev = dst;
            }
        }
        self.drop_block(src);
    }

    /// `free_block` (docs/pytorch-model.md#free-and-merge): merge with free neighbours and return
    /// to the free set.
    #[inline(always)]
    fn free_block(&mut self, id: u32) {
        let b = self.b(id);
        self.free_block_of(id, b.mapped, b.prev, b.next);
    }

    /// [`PyTorch::free_block`] of block `id`, whose mapping state and neighbours its caller
    /// has read already: a free reaches the block once when it has no free neighbour.
    #[inline(always)]
    fn free_block_of(&mut self, id: u32, mapped: bool, prev: u32, next: u32) {
        self.try_merge_into(id, mapped, prev);
        self.try_merge_into(id, mapped, next);
        self.insert_free(id);
    }

    /// The part of `malloc` for a request the cache cannot serve
    /// (docs/pytorch-model.md#malloc-order): GC, new memory, and the fallbacks that release cached
    /// segments and try again. The block for the request, or `None` (out of memory).
    #[inline(never)]
    fn malloc_new_memory<B: Backend>(
        &mut self,
        backend: &mut B,
        stream: u64,
        rounded: u64,
        small: bool,
    ) -> Result<Option<u32>> {
        let alloc_size = self.config.allocation_size(rounded);
        // 2.12's throw_on_cudamalloc_oom: past the fraction's limit, out of memory at once
        // (no garbage collection, no release of cached blocks).
        if self.config.rejects_past_fraction() {
            let max = self.config.allowed_memory_maximum().unwrap_or(u64::MAX);
            if self.total_allocated.saturating_add(alloc_size) > max {
                self.stats.num_ooms += 1;
                self.stats.num_oom_rejections += 1;
                return Ok(None);
            }
        }
        if self.gc_enabled() {
            self.garbage_collect(backend)?;
        }
        let mut found = self.alloc_block(backend, stream, rounded, small, alloc_size, false)?;
        if found.is_none()
            && self.release_available_cached_blocks(backend, stream, rounded, small)?
        {
            found = self.alloc_block(backend, stream, rounded, small, alloc_size, false)?;
        }
        // Not while a capture is underway: one told so, or a malloc into a private pool (from
        // 2.13 only a graph capture's, docs/pytorch-model.md#capture-not-pool).
        if found.is_none() && !self.capture_underway && !self.allocating_in_capture() {
            self.release_cached_blocks(backend)?;
            found = self.alloc_block(backend, stream, rounded, small, alloc_size, true)?;
        }
        if found.is_none() {
            self.stats.num_ooms += 1;
        }
        Ok(found)
    }

    /// Whether mallocs now go into a private pool that counts as a capture's
    /// ([`Config::pool_is_capture`]).
    fn allocating_in_capture(&self) -> bool {
        let pool = self.into.checked_sub(1).map(|k| self.private_pools[k as usize]);
        self.config.pool_is_capture(pool)
    }

    /// Whether a release may give back block `id`'s segment: not one a warm trace's plan keeps
    /// ([`PyTorch::unreleasable`]).
    #[inline]
    fn releasable(&self, id: u32) -> bool {
        self.unreleasable.is_empty() || !self.unreleasable.contains(&self.b(id).ptr)
    }

    /// `release_block` (docs/pytorch-model.md#release-segment): cudaFree one whole cudaMalloc
    /// segment.
    fn release_block<B: Backend>(&mut self, backend: &mut B, id: u32) -> Result<()> {
        let b = *self.b(id);
        debug_assert!(b.prev == NIL && b.next == NIL && b.expandable == NIL && !b.allocated);
        backend.segment_free(b.ptr, b.size)?;
        self.remove_free(id);
        self.segments.remove(&b.ptr);
        self.total_allocated -= b.size;
        self.stats.segments -= 1;
        self.stats.num_device_free += 1;
        if b.size >= self.config.max_split_size {
            self.stats.oversize_segments -= 1;
        }
        self.drop_block(id);
        Ok(())
    }

    /// `alloc_block` (docs/pytorch-model.md#new-segment): a new segment (or pages of an expandable
    /// one) for the request.
    #[allow(clippy::too_many_arguments)]
    fn alloc_block<B: Backend>(
        &mut self,
        backend: &mut B,
        stream: u64,
        size: u64,
        small: bool,
        alloc_size: u64,
        retry: bool,
    ) -> Result<Option<u32>> {
        if retry {
            self.alloc_retries += 1;
        }
        if let Some(max) = self.config.allowed_memory_maximum() {
            if self.total_allocated.saturating_add(alloc_size) > max {
                return Ok(None);
            }
        }
        if self.maps_pages(self.into, small) {
            return self.try_allocate_expandable_block(backend, stream, size, small);
        }
        let Some(ptr) = backend.segment_alloc(alloc_size)? else { return Ok(None) };
        Ok(Some(self.add_segment(ptr, alloc_size, stream, small)?))
    }

    /// Records a new cudaMalloc segment as one block that is in no set yet.
    fn add_segment(&mut self, ptr: u64, size: u64, stream: u64, small: bool) -> Result<u32> {
        Self::check_range(ptr, size)?;
        let sid = self.intern(stream)?;
        self.total_allocated += size;
        self.stats.segments += 1;
        self.stats.num_device_alloc += 1;
        if size >= self.config.max_split_size {
            self.stats.oversize_segments += 1;
        }
        self.segments.insert(ptr, SegmentInfo { size });
        Ok(self.new_block(Block {
            ptr,
            size,
            requested: 0,
            stream,
            sid,
            prev: NIL,
            next: NIL,
            expandable: NIL,
            gc_base: 0,
            pool: self.into,
            small,
            allocated: false,
            mapped: true,
            in_use: true,
        }))
    }

    /// `release_available_cached_blocks` (docs/pytorch-model.md#release-available): with
    /// `max_split_size` set, free the smallest oversize block that is large enough, else oversize
    /// blocks from the largest down.
    fn release_available_cached_blocks<B: Backend>(
        &mut self,
        backend: &mut B,
        stream: u64,
        size: u64,
        small: bool,
    ) -> Result<bool> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let p = self.into;
        let target = size.max(max_split);
        let Some(sid) = self.sid_of(stream) else { return Ok(false) };
        // Only a whole segment can be cudaFree'd. A run under constant settings never splits a
        // block of max_split_size or more, but a what-if that sets max_split_size_mb on a
        // recorded start state can find such a block split: it is skipped, not freed.
        let whole = |b: &Block| b.expandable == NIL && b.prev == NIL && b.next == NIL;
        if let Some((_, _, id)) = self.owner(p, small).blocks.first_from(sid, target, 0) {
            if whole(self.b(id)) && self.releasable(id) {
                self.release_block(backend, id)?;
                return Ok(true);
            }
        }
        let mut released = 0u64;
        let mut cursor = (target, 0);
        while released < target {
            let Some((size, ptr, id)) =
                self.owner(p, small).blocks.last_before(sid, cursor.0, cursor.1)
            else {
                break;
            };
            if size < max_split {
                break;
            }
            cursor = (size, ptr);
            if whole(self.b(id)) && self.releasable(id) {
                released += size;
                self.release_block(backend, id)?;
            }
        }
        Ok(released >= target)
    }

    /// `release_cached_blocks` (docs/pytorch-model.md#empty-cache): `empty_cache()`; the default
    /// large pool first, then small; then every private pool whose graph or pool is gone, small
    /// first.
    fn release_cached_blocks<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.release_blocks(backend, 0, false)?;
        self.release_blocks(backend, 0, true)?;
        for k in 0..self.freeable.len() {
            let owner = self.freeable[k];
            self.release_blocks(backend, owner, true)?;
            self.release_blocks(backend, owner, false)?;
        }
        Ok(())
    }

    /// `release_blocks(pool)` of pool `owner` (0: the default pools): every whole free
    /// cudaMalloc segment, then unmap free expandable pages, in (stream, size, address) order.
    fn release_blocks<B: Backend>(
        &mut self,
        backend: &mut B,
        owner: u16,
        small: bool,
    ) -> Result<()> {
        let ids = self.free_blocks_in_order(self.owner(owner, small));
        let mut expandable = Vec::new();
        for id in ids {
            let b = self.b(id);
            if b.expandable != NIL {
                expandable.push(id);
            } else if b.prev == NIL && b.next == NIL && self.releasable(id) {
                self.release_block(backend, id)?;
            }
        }
        for id in expandable {
            self.unmap_block(backend, id)?;
        }
        Ok(())
    }

    /// `garbage_collect_cached_blocks` (docs/pytorch-model.md#gc): free old whole segments of the
    /// default large pool until reserved memory is back under the threshold.
    fn garbage_collect<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        let Some(allowed) = self.config.allowed_memory_maximum() else { return Ok(()) };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated <= threshold {
            return Ok(());
        }
        let target = self.total_allocated - threshold;
        let p = pool_index(false);
        let clock = self.pools[p].gc_count;
        let age = |b: &Block| clock.wrapping_sub(b.gc_base) as i64 as f64;
        let mut total_age = 0.0;
        let mut count = 0u64;
        for id in self.pools[p].blocks.ids() {
            if !self.is_split(id) {
                total_age += age(self.b(id));
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let avg = total_age / count as f64;
            freed_any = false;
            let ids = self.free_blocks_in_order(&self.pools[p]);
            for id in ids {
                let b = self.b(id);
                let whole = b.prev == NIL && b.next == NIL && b.expandable == NIL;
                if whole && age(b) >= avg && self.releasable(id) {
                    let (a, s) = (age(b), b.size);
                    reclaimed += s;
                    total_age -= a;
                    count -= 1;
                    self.release_block(backend, id)?;
                    freed_any = true;
                }
            }
        }
        Ok(())
    }

    /// Looks at the block containing `addr`: (start, size, allocated), if any.
    pub(crate) fn block_containing(&self, addr: u64) -> Option<(u64, u64, bool)> {
        // Blocks are few per segment; find the segment, then walk it.
        let head = self.head_containing(addr)?;
        let mut id = head;
        while id != NIL {
            let b = self.b(id);
            if b.ptr <= addr && addr < b.ptr + b.size {
                return Some((b.ptr, b.size, b.allocated));
            }
            id = b.next;
        }
        None
    }

    /// The private pool (`segment_pool_id`) owning the segment that holds `addr`, if it is one.
    pub(crate) fn private_pool_at(&self, addr: u64) -> Option<(u64, u64)> {
        let pool = self.b(self.head_containing(addr)?).pool;
        pool.checked_sub(1).map(|k| self.private_pools[k as usize])
    }

    fn head_containing(&self, addr: u64) -> Option<u32> {
        let inside = match self.segments.range(..=addr).next_back() {
            Some((&base, info)) if addr < base + info.size => {
                self.blocks.iter().position(|b| b.in_use && b.expandable == NIL && b.ptr == base)
            }
            _ => {
                let seg = self
                    .expandable
                    .iter()
                    .position(|s| s.alive && s.base <= addr && addr < s.base + s.va_size)?
                    as u32;
                self.blocks.iter().position(|b| b.in_use && b.expandable == seg)
            }
        };
        let mut id = inside? as u32;
        while self.b(id).prev != NIL {
            id = self.b(id).prev;
        }
        Some(id)
    }

    /// Installs a whole cudaMalloc segment as it stood before a trace (start-state recovery):
    /// `blocks` tile `[addr, addr + size)` in address order as (start, size, live request or
    /// `None` when free). Free neighbours are merged. A segment of a `private_pool` goes to that
    /// pool, whose free blocks only mallocs made into it take (see `PyTorch::private_pools`).
    /// Returns the live blocks as allocations (with their handles), in address order.
    pub(crate) fn install_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        small: bool,
        private_pool: Option<(u64, u64)>,
        blocks: &[(u64, u64, Option<u64>)],
    ) -> Result<Vec<Allocation>> {
        let mut pos = addr;
        for &(a, s, _) in blocks {
            if a != pos || s == 0 {
                return Err(Error::input(format!(
                    "segment {addr:#x}: block at {a:#x} (+{s}) does not follow {pos:#x}"
                )));
            }
            pos += s;
        }
        if pos != addr + size {
            return Err(Error::input(format!(
                "segment {addr:#x}: blocks cover {} of {size} bytes",
                pos - addr
            )));
        }
        let pool = self.pool_number(private_pool)?;
        let head = self.add_segment(addr, size, stream, small)?;
        self.stats.num_device_alloc -= 1; // not a call made during the replay
        self.bm(head).pool = pool;
        let mut prev = NIL;
        let mut installed = Vec::new();
        for (i, &(a, s, live)) in blocks.iter().enumerate() {
            let id = if i == 0 {
                head
            } else {
                let h = *self.b(head);
                self.new_block(Block { ptr: a, size: s, prev, allocated: false, requested: 0, ..h })
            };
            let b = self.bm(id);
            b.ptr = a;
            b.size = s;
            b.prev = prev;
            b.next = NIL;
            if prev != NIL {
                self.bm(prev).next = id;
            }
            prev = id;
            match live {
                Some(request) => installed.push(self.alloc_found_block(id, s, request, false)),
                None => self.free_block(id),
            }
        }
        Ok(installed)
    }

    /// Says whether a CUDA graph capture is underway while the next mallocs are served, on any
    /// stream: PyTorch then skips the release-every-cached-segment fallback for every malloc,
    /// not only for those made into the capture's pool. The trace does not mark capture;
    /// `validate` tells it from an `oom` that no release preceded, where the recorded cache held
    /// memory to release.
    pub(crate) fn set_capture_underway(&mut self, underway: bool) {
        self.capture_underway = underway;
    }

    /// The `pool` number ([`Block::pool`]) of private pool `pool`, given on first sight; 0 for
    /// `None`, the default pools. A pool a profiler trace's addresses inferred (a graph's pool or
    /// another stream of the default pools, docs/pytorch-model.md#kineto-addresses) is freeable
    /// from the start: every flush releases its free segments, as a stream's.
    fn pool_number(&mut self, pool: Option<(u64, u64)>) -> Result<u16> {
        let Some(id) = pool else { return Ok(0) };
        let k = match self.private_pools.iter().position(|&p| p == id) {
            Some(k) => k,
            None => {
                if self.private_pools.len() >= u16::MAX as usize - 1 {
                    return Err(Error::input("more than 65534 private pools on one device"));
                }
                self.private_pools.push(id);
                let own_allocator = self.config.own_allocator_pools.contains(&id);
                let pool = || Pool { own_allocator, ..Pool::default() };
                self.private.extend([pool(), pool()]);
                if self.inferred(self.private_pools.len() as u16) {
                    self.freeable.push(self.private_pools.len() as u16);
                }
                self.private_pools.len() - 1
            }
        };
        Ok(k as u16 + 1)
    }

    /// Checks every invariant in the module docs; see [`Policy::check_invariants`].
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let mut allocated = 0u64;
        let mut requested = 0u64;
        let mut free_mapped = 0usize;
        let mut free_unmapped = 0usize;
        let mut mapped_bytes = 0u64;
        let mut seg_bytes = 0u64;
        for (i, b) in self.blocks.iter().enumerate() {
            if !b.in_use {
                continue;
            }
            let id = i as u32;
            if b.size == 0 {
                return Err(format!("block {:#x} has size 0", b.ptr));
            }
            if b.next != NIL {
                let n = self.b(b.next);
                if !n.in_use || n.prev != id || b.ptr + b.size != n.ptr {
                    return Err(format!(
                        "block {:#x}: next {:#x} does not follow it",
                        b.ptr, n.ptr
                    ));
                }
                if !b.allocated && !n.allocated && b.mapped == n.mapped {
                    return Err(format!("free blocks {:#x} and {:#x} not merged", b.ptr, n.ptr));
                }
            }
            if b.expandable != NIL && b.mapped {
                mapped_bytes += b.size;
            }
            if b.allocated {
                allocated += b.size;
                requested += b.requested;
                if self.active.as_ref().is_some_and(|a| a.get(b.ptr) != Some(id)) {
                    return Err(format!("allocated block {:#x} is not active", b.ptr));
                }
            } else if b.mapped {
                free_mapped += 1;
                if self.owner(b.pool, b.small).blocks.get(b.sid, b.size, b.ptr) != Some(id) {
                    return Err(format!(
                        "free block {:#x} (+{}) not in its free set",
                        b.ptr, b.size
                    ));
                }
            } else {
                free_unmapped += 1;
                if self.owner(b.pool, b.small).unmapped.get(&unmapped_key(b.sid, b.ptr))
                    != Some(&id)
                {
                    return Err(format!("unmapped block {:#x} not in its set", b.ptr));
                }
            }
            if b.prev == NIL && b.expandable == NIL {
                let Some(info) = self.segments.get(&b.ptr) else {
                    return Err(format!("segment head {:#x} is not a segment", b.ptr));
                };
                let mut sum = 0;
                let mut id = id;
                while id != NIL {
                    sum += self.b(id).size;
                    id = self.b(id).next;
                }
                if sum != info.size {
                    return Err(format!(
                        "segment {:#x}: blocks sum to {sum}, not {}",
                        b.ptr, info.size
                    ));
                }
                seg_bytes += info.size;
            }
        }
        let sets: usize = self.pools.iter().chain(&self.private).map(|p| p.blocks.len()).sum();
        let unmapped: usize =
            self.pools.iter().chain(&self.private).map(|p| p.unmapped.len()).sum();
        if sets != free_mapped || unmapped != free_unmapped {
            return Err(format!(
                "free sets hold {sets}+{unmapped} blocks, {free_mapped}+{free_unmapped} are free"
            ));
        }
        let live = self.blocks.iter().filter(|b| b.in_use && b.allocated).count();
        if self.active.as_ref().is_some_and(|a| a.len() != live) {
            return Err("active map and allocated blocks differ".into());
        }
        if allocated != self.allocated {
            return Err(format!("allocated counter {} != sum {allocated}", self.allocated));
        }
        if requested != self.stats.requested_bytes {
            return Err(format!("requested counter {} != {requested}", self.stats.requested_bytes));
        }
        if seg_bytes + mapped_bytes != self.total_allocated {
            return Err(format!(
                "reserved {} != segments {seg_bytes} + mapped {mapped_bytes}",
                self.total_allocated
            ));
        }
        if self.segments.len() as u64 != self.stats.segments {
            return Err("segment counter differs".into());
        }
        Ok(())
    }
}

/// Joins adjacent free pieces of a tiling into one block, as the allocator holds them.
fn merge_free_neighbours(tiling: &mut Tiling) {
    let mut merged: Tiling = Vec::with_capacity(tiling.len());
    for &(a, s, live) in tiling.iter() {
        match merged.last_mut() {
            Some(last) if last.2.is_none() && live.is_none() => last.1 += s,
            _ => merged.push((a, s, live)),
        }
    }
    *tiling = merged;
}

/// The tiling of start segment or mapped range `s` at the backend's addresses (`shift` moves a
/// recorded address there). Each live block the engine hands over (found in `index`, by its
/// recorded address) is pushed to `placed` as (its index, its new address), in address order;
/// a live block the engine will not free is cached (free) instead.
fn placed_tiling(
    s: &start::StartSegment,
    shift: impl Fn(u64) -> u64,
    index: &std::collections::HashMap<u64, usize>,
    placed: &mut Vec<(usize, u64)>,
) -> Tiling {
    let mut tiling = start::StartState::tiling(s);
    for t in &mut tiling {
        let recorded = t.0;
        t.0 = shift(t.0);
        match (t.2, index.get(&recorded)) {
            (Some(_), Some(&k)) => placed.push((k, t.0)),
            (Some(_), None) => t.2 = None, // no block the engine will free: cached
            _ => {}
        }
    }
    tiling
}

/// The configuration `options` asks for: `recorded` or empty means the trace's recorded
/// settings (else PyTorch's defaults); anything else is `PYTORCH_CUDA_ALLOC_CONF` syntax.
/// Either way, whether private pools get expandable segments of their own is what the recording
/// shows of the PyTorch that made it, where it shows it
/// ([`start::PrivatePoolMemory`]).
pub(crate) fn config_for(
    options: &str,
    context: &PolicyContext,
    version: Version,
    flavour: Flavour,
) -> Result<Config> {
    let o = options.trim();
    let mut config = if o.is_empty() || o == "recorded" {
        let mut c = match &context.trace.allocator_settings {
            Some(s) => Config::from_recorded_as(s, version, flavour)?,
            None => Config { version, ..Config::default_for(flavour) },
        };
        // Pages the trace maps show expandable segments on, whatever the settings string says.
        c.expandable_segments |=
            start::shows_expandable(context.trace, context.device, context.events);
        c
    } else {
        Config::refuse_repeated_options(o)?;
        let mut c = Config { version, ..Config::default_for(flavour) };
        c.apply(o)?;
        c
    };
    start::PrivatePoolMemory::recorded(context.trace, context.device, context.events)
        .apply_to(&mut config);
    config.mem_pools = start::mem_pools_by_stacks(context.trace, context.device, context.events);
    Ok(config)
}

/// `config` with its GPU memory raised, where the replay does not know the GPU's memory
/// ([`PolicyContext::gpu_memory`]), to the least the recording proves: a recorded
/// `per_process_memory_fraction` let the recorded peak through ([`Config::least_gpu_memory_for`]).
/// The bound is the recorded run's, so it holds whatever `config` replays; an explicit capacity
/// names the card and is kept.
fn at_least_recorded_gpu_memory(mut config: Config, context: &PolicyContext) -> Config {
    let recorded = context.trace.allocator_settings.as_ref();
    let least = recorded
        .and_then(|s| Config::from_recorded_as(s, config.version, config.flavour).ok())
        .zip(context.recorded_peak_reserved)
        .and_then(|(recorded, peak)| recorded.least_gpu_memory_for(peak));
    if let (None, Some(least)) = (context.gpu_memory, least) {
        config.gpu_memory = config.gpu_memory.max(least);
    }
    config
}

impl<const DEFAULT_RULES: bool> Policy for PyTorch<DEFAULT_RULES> {
    fn config(&self) -> String {
        config::shown_with_version(self.config.to_conf_string(), self.shown_version)
    }

    /// Its own effective settings (not the input's: a `pytorch-expandable` what-if says
    /// `expandable_segments: True`).
    fn recorded_settings(shown_config: &str) -> Option<crate::trace::AllocatorSettings> {
        Config::parse_shown(shown_config).ok().map(|c| c.to_recorded())
    }

    fn has_allocator_settings() -> bool {
        true
    }

    /// Runs `PyTorch::with_default_rules` where the configuration allows it.
    fn run_by<R: super::PolicyRunner>(self, name: &str, runner: R) -> R::Output {
        if DEFAULT_RULES {
            return runner.run(name, self);
        }
        match self.with_default_rules() {
            Ok(fast) => runner.run(name, fast),
            Err(general) => runner.run(name, general),
        }
    }

    /// Installs the recorded start state (`PyTorch::with_recorded_start`): each segment, and
    /// each expandable reservation with its mapped ranges, is obtained from `backend` (at the
    /// backend's address, the recorded layout shifted with it) and tiled as it stood; the blocks
    /// of `live_at_start` found there are handed back at their new addresses. A segment or
    /// reservation the backend refuses (a capacity below the recorded start), or one whose
    /// mapped ranges outgrow this run's reservation size (it follows the GPU's memory), is left
    /// out and its blocks are malloc'd by the engine, as are blocks the state does not hold.
    fn start<B: Backend>(
        &mut self,
        backend: &mut B,
        live_at_start: &[crate::trace::LiveBlock],
    ) -> Result<Vec<Option<Allocation>>> {
        let mut out = vec![None; live_at_start.len()];
        if let Some(warm) = self.warm.take() {
            return self.start_warm(backend, live_at_start, &warm);
        }
        let Some(state) = self.start.take() else { return Ok(out) };
        let index: std::collections::HashMap<u64, usize> =
            live_at_start.iter().enumerate().map(|(k, b)| (b.addr, k)).collect();
        // A what-if's limit binds from the first event: a segment that would take reserved
        // bytes over `per_process_memory_fraction`'s limit is left out, as one the device has
        // no room for; the engine allocates its live blocks anew.
        let limit = self.config.allowed_memory_maximum();
        let fits = |total: u64, more: u64| limit.is_none_or(|l| total.saturating_add(more) <= l);
        let mut fit = crate::backend::StartFit::default();
        for s in state.segments.iter().filter(|s| !s.expandable) {
            fit.segments += 1;
            fit.bytes += s.size;
            if !fits(self.total_allocated, s.size) {
                continue;
            }
            let Some(base) = backend.segment_alloc(s.size)? else { continue };
            fit.installed_segments += 1;
            fit.installed_bytes += s.size;
            let mut placed = Vec::new();
            let mut tiling = placed_tiling(s, |a| a - s.addr + base, &index, &mut placed);
            merge_free_neighbours(&mut tiling);
            let installed =
                self.install_segment(base, s.size, s.stream, s.small, s.private_pool, &tiling)?;
            // The live blocks, in address order as `placed` lists them.
            for ((k, addr), a) in placed.into_iter().zip(installed) {
                debug_assert_eq!(addr, a.addr);
                out[k] = Some(a);
            }
        }
        for r in &state.reservations {
            let va = self.config.va_size(r.small);
            let ranges: Vec<&start::StartSegment> =
                state.segments.iter().filter(|s| r.holds(s)).collect();
            if ranges.iter().any(|s| s.addr + s.size > r.base.saturating_add(va)) {
                continue;
            }
            let mapped_bytes: u64 = ranges.iter().map(|s| s.size).sum();
            fit.segments += ranges.len() as u64;
            fit.bytes += mapped_bytes;
            if !fits(self.total_allocated, mapped_bytes) {
                continue;
            }
            let Some(base) = backend.reserve(va)? else { continue };
            let shift = |a: u64| a - r.base + base;
            let mut mapped = 0;
            while mapped < ranges.len()
                && backend.map(shift(ranges[mapped].addr), ranges[mapped].size)?
            {
                mapped += 1;
            }
            if mapped < ranges.len() {
                for s in &ranges[..mapped] {
                    backend.unmap(shift(s.addr), s.size)?;
                }
                backend.release(base, va)?;
                continue;
            }
            fit.installed_segments += ranges.len() as u64;
            fit.installed_bytes += mapped_bytes;
            let mut placed = Vec::new();
            let shifted: Vec<MappedRange> = ranges
                .iter()
                .map(|s| (shift(s.addr), s.size, placed_tiling(s, shift, &index, &mut placed)))
                .collect();
            let pool = (r.stream, r.small, r.private_pool);
            let installed = self.install_expandable(base, va, pool, &shifted)?;
            for ((k, addr), a) in placed.into_iter().zip(installed) {
                debug_assert_eq!(addr, a.addr);
                out[k] = Some(a);
            }
        }
        self.start_fit = (fit.installed_segments < fit.segments).then(|| {
            fit.limit_bytes = limit;
            fit
        });
        Ok(out)
    }

    /// Always inlined, into the replay loop's one call for an alloc event (the engine's rare
    /// calls go through one copy out of line): most mallocs are served from the cache, a
    /// search and a few stores, and the call itself (six registers saved and restored, the
    /// result returned through memory) cost about a sixth of them. A plain `#[inline]` was
    /// not taken. The rest of malloc is out of line (`malloc_new_memory`).
    #[inline(always)]
    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>> {
        if let Some(addr) = self.place_at.take() {
            if let Some(placed) = self.malloc_at(addr, size, stream) {
                return Ok(Some(placed));
            }
        }
        let rounded = self.round_size(size);
        let small = rounded <= SMALL_SIZE;
        let (id, block_size) = match self.get_free_block(stream, rounded, small) {
            Some(found) => found,
            None => match self.malloc_new_memory(backend, stream, rounded, small)? {
                Some(id) => (id, self.b(id).size),
                None => return Ok(None),
            },
        };
        debug_assert!(self.b(id).pool == self.into && self.b(id).small == small);
        let (id, block_size) = if !DEFAULT_RULES && self.config.aligns_base(rounded) {
            self.align_base(id, block_size, rounded)
        } else {
            (id, block_size)
        };
        let split = self.should_split(block_size, rounded, small);
        Ok(Some(self.alloc_found_block(id, rounded, size, split)))
    }

    /// The next mallocs allocate into private pool `pool` (`None`: the default pools), as
    /// PyTorch's do for a stream under graph capture or `use_mem_pool`: they search only that
    /// pool's free blocks, a new segment belongs to it, and none falls back to releasing every
    /// cached segment (PyTorch skips that while a capture is underway). With expandable
    /// segments, the pool's new memory is pages of its own reservations, or cudaMalloc segments
    /// in PyTorch before ≈ 2.5 (`Config::expandable_in_private_pools`).
    fn allocate_into(&mut self, pool: Option<(u64, u64)>) -> Result<()> {
        self.into = self.pool_number(pool)?;
        Ok(())
    }

    fn assumed_start(&self) -> Option<crate::backend::AssumedStart> {
        self.assumed_start.clone()
    }

    fn place_next_at(&mut self, addr: u64) {
        self.place_at = Some(addr);
    }

    fn set_capture_underway(&mut self, underway: bool) {
        self.capture_underway = underway;
    }

    fn release_pool(&mut self, pool: (u64, u64)) -> Result<()> {
        if let Some(k) = self.private_pools.iter().position(|&p| p == pool) {
            let owner = k as u16 + 1;
            if !self.freeable.contains(&owner) {
                self.freeable.push(owner);
            }
        }
        Ok(())
    }

    #[inline(never)]
    fn free<B: Backend>(&mut self, _backend: &mut B, addr: u64) -> Result<()> {
        let id =
            if DEFAULT_RULES { self.allocated_at(addr) } else { self.active_map().remove(addr) };
        self.free_allocated(id.ok_or_else(|| unknown_block(NAME, addr))?);
        Ok(())
    }

    /// Always inlined into the replay loop, as [`PyTorch::malloc`] is; a free by address
    /// alone (no handle) is out of line.
    #[inline(always)]
    fn free_handle<B: Backend>(
        &mut self,
        backend: &mut B,
        addr: u64,
        handle: Handle,
    ) -> Result<()> {
        let id = match handle.index() {
            Some(id) if self.blocks.get(id as usize).is_some_and(|b| b.is_allocated_at(addr)) => id,
            _ => return self.free(backend, addr),
        };
        if !DEFAULT_RULES {
            if let Some(active) = &mut self.active {
                active.remove(addr);
            }
        }
        self.free_allocated(id);
        Ok(())
    }

    fn would_serve_from_cache(&self, size: u64, stream: u64) -> Option<bool> {
        Some(self.would_hit_cache(size, stream))
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.release_cached_blocks(backend)
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn start_fit(&self) -> Option<crate::backend::StartFit> {
        self.start_fit
    }

    fn assumed_gpu_memory(&self) -> Option<u64> {
        self.config.allowed_memory_maximum().map(|_| self.config.gpu_memory)
    }

    fn alloc_retries(&self) -> u64 {
        self.alloc_retries
    }

    fn segments(&self) -> Vec<Segment> {
        let mut out = Vec::new();
        for (i, b) in self.blocks.iter().enumerate() {
            if !b.in_use || b.prev != NIL {
                continue;
            }
            // Walk the segment; an expandable one shows each mapped run as a segment
            // (docs/pytorch-model.md#expandable-reporting).
            let mut id = i as u32;
            let mut current: Option<Segment> = None;
            while id != NIL {
                let x = self.b(id);
                if x.mapped {
                    let seg = current.get_or_insert_with(|| Segment {
                        device: 0,
                        address: x.ptr,
                        total_size: 0,
                        stream: x.stream,
                        pool: if x.small { PoolKind::Small } else { PoolKind::Large },
                        is_expandable: x.expandable != NIL,
                        private_pool: x.pool.checked_sub(1).map(|k| self.private_pools[k as usize]),
                        blocks: Vec::new(),
                    });
                    seg.total_size += x.size;
                    seg.blocks.push(SnapBlock {
                        address: x.ptr,
                        size: x.size,
                        requested_size: x.requested,
                        state: if x.allocated {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                    });
                } else if let Some(seg) = current.take() {
                    out.push(seg);
                }
                id = x.next;
            }
            out.extend(current);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.check()
    }
}

#[cfg(test)]
mod tests;
