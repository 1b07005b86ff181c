//! `fragsim validate`: replays a PyTorch snapshot through the [`PyTorch`] policy from the
//! recovered start state and compares every decision with what the real allocator recorded.
//!
//! The replay is the engine's (`replay::run_guided`): the same loop as every replay, on a device that
//! follows the recording (`Guided`), with a guide that compares (`Checker`).
//!
//! See docs/pytorch-model.md#validation. The recording supplies what a snapshot cannot know, and
//! nothing else: a new segment takes the address recorded for it within the same malloc; a
//! `cudaMalloc` or page map succeeds exactly when the recording shows it did (a recorded release
//! after it, or an `oom`, means it failed); a recorded run of `segment_free` outside a malloc is an
//! `empty_cache()` that the simulated allocator performs itself. Compared: every `alloc` address,
//! every segment event (kind, size, address, in order), the peak of the reserved curve
//! (docs/pytorch-model.md#reserved-curve) from the start state's reserved bytes, and the final
//! layout against the snapshot's `segments` (docs/pytorch-model.md#validation-checks).
//!
//! Start-state guesses (docs/pytorch-model.md#snapshot-start-state): a mismatch that a longer
//! ambiguous orphan explains extends that orphan — to the recorded address when it lies inside the
//! free block after it (docs/pytorch-model.md#orphan-growth), or to the smallest feasible size that
//! reproduces every placement so far — and replays again. Then each remaining ambiguous orphan is
//! tried at its longest feasible size; the first decision where that start state — agreeing with
//! every recorded decision before — places a block elsewhere is *undeterminable*: counted apart,
//! never as matched.

use crate::backend::Backend;
use crate::backend::{Observed, Observer};
use crate::error::{Error, Result};
use crate::policy::pytorch::config::SMALL_SIZE;
use crate::policy::pytorch::config::{self, Config, Flavour, ModelledVersion, Version};
use crate::policy::pytorch::start::{self, StartState};
use crate::policy::pytorch::NAME;
use crate::policy::pytorch::{expandable, PyTorch};
use crate::policy::Policy;
use crate::replay::{run_guided, Cancel, Guide, ReplayInput, ReplayOptions, ReplayOutput};
use crate::trace::lifetimes::{free_action, FlushCauses};
use crate::trace::{Action, Event, Segment, Trace};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Sets `config.gpu_memory` from the recording's expandable layout
/// (docs/pytorch-model.md#expandable-va-size: it fixes every reservation's VA size and is recorded
/// nowhere) and says what was inferred, from which pages, or why it could not be; `None` when the
/// recording maps no expandable pages.
fn infer_gpu_memory(events: &[Event], start: &StartState, config: &mut Config) -> Option<Warning> {
    let fit = expandable::recorded_gpu_memory_fit(events, start, config)?;
    let fraction = config.per_process_memory_fraction.is_some();
    config.gpu_memory = fit.modelled(config.gpu_memory);
    let assumed = config.gpu_memory;
    Some(match (fit.inferred(), fit.max, fit.evidence) {
        (Some(bytes), _, Some((reservation, next))) => {
            Warning::InferredGpuMemory { bytes, min: fit.min, reservation, next, fraction }
        }
        (None, Some(max), _) => Warning::GpuMemoryConflict { min: fit.min, max, assumed },
        _ => Warning::GpuMemoryUnbounded { min: fit.min, assumed, fraction },
    })
}

/// How to validate.
#[derive(Clone, Debug, Default)]
pub struct ValidateOptions {
    /// The device (default: the one with the most events).
    pub device: Option<i32>,
    /// The GPU's total memory (`--gpu-mem`): the memory fraction's and the expandable
    /// reservation's base. Default: inferred from the expandable layout, else 80 GiB.
    pub gpu_memory: Option<u64>,
    /// The PyTorch version to model (`--pytorch-version`); default: current main.
    pub version: Option<Version>,
    /// Keep the simulated run as events (for `--export-snapshot`).
    pub record_events: bool,
    /// Check the policy's invariants after every event (slow; tests and debugging).
    pub check_invariants: bool,
    /// Whose allocator rules to replay (`-p pytorch-cuda` / `pytorch-npu`); default: those of
    /// the allocator that made the recording ([`Flavour::of_trace`]).
    pub flavour: Option<Flavour>,
    /// Raised to abandon the validation (Ctrl-C in Python): every replay it runs looks at it
    /// every [`Cancel::EVERY`] events and stops with an error naming the event it reached.
    pub cancel: Cancel,
}

/// One decision the simulation made differently from the recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// Index of the recorded event.
    pub event: u64,
    /// Its action, or `None` for the final segment layout (compared after the last event). JSON
    /// spells it as [`Mismatch::action_name`] does.
    #[serde(serialize_with = "serialize_action")]
    pub action: Option<Action>,
    /// What the recording shows.
    pub expected: String,
    /// What the simulation did.
    pub got: String,
    /// The likely cause.
    pub why: String,
}

/// The outcome of validating one device of a snapshot. Field names are `validate --json` keys.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Validation {
    /// The trace's path (set by the caller).
    pub trace: String,
    /// The device validated.
    pub device: i32,
    /// Recorded `alloc` events.
    pub allocs_total: u64,
    /// Allocs the simulation placed at the recorded address (undeterminable ones excluded).
    pub allocs_addr_matched: u64,
    /// Allocs of exact-address allocations (`mallocWithAddress`, PyTorch 2.13+: the prefix and
    /// the request), placed at the recorded address and counted apart: neither in
    /// `allocs_addr_matched` nor ever a mismatch (no placement rule chose their address).
    /// A JSON key only where the recording has any.
    #[serde(skip_serializing_if = "is_zero")]
    pub allocs_exact_address: u64,
    /// Recorded segment events (`segment_alloc/free/map/unmap`).
    pub segment_events_recorded: u64,
    /// Recorded segment events the simulation reproduced (kind, size, address, order).
    pub segment_events_matched: u64,
    /// Peak of the recorded reserved curve, from the start state's reserved bytes.
    pub peak_reserved_recorded_bytes: u64,
    /// Peak reserved bytes of the simulation.
    pub peak_reserved_simulated_bytes: u64,
    /// Decisions that depend on a start-state guess (docs/pytorch-model.md#undeterminable).
    pub undeterminable_events: u64,
    /// Every unexplained difference.
    pub mismatches: Vec<Mismatch>,
    /// The undeterminable decisions and why (shown with `--verbose`).
    #[serde(skip)]
    pub undeterminable: Vec<Mismatch>,
    /// What the validation assumed (version choices, learned orphan sizes, ...).
    #[serde(skip)]
    pub notes: Vec<Warning>,
    /// The settings replayed, in `PYTORCH_CUDA_ALLOC_CONF` syntax.
    #[serde(skip)]
    pub config: String,
    /// The simulated run, as a `pytorch` replay's output (for `--export-snapshot`; its events
    /// only when [`ValidateOptions::record_events`] asked for them).
    #[serde(skip)]
    pub output: ReplayOutput,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Mismatch {
    /// The action as PyTorch spells it (`alloc`, `oom`, ...), or `segments` for the final layout.
    pub fn action_name(&self) -> &'static str {
        action_name(self.action)
    }
}

/// `action`'s PyTorch name, `segments` for none (the final layout).
fn action_name(action: Option<Action>) -> &'static str {
    action.map_or("segments", Action::name)
}

fn serialize_action<S: serde::Serializer>(
    action: &Option<Action>,
    out: S,
) -> std::result::Result<S::Ok, S::Error> {
    out.serialize_str(action_name(*action))
}

/// Something validation assumed or could not place: not a mismatch, but worth knowing when
/// reading its result. `Display` gives the sentence `validate --verbose` prints after `note:`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// The snapshot records no `allocator_settings`, so PyTorch's defaults were replayed.
    NoAllocatorSettings,
    /// Whose allocator rules were replayed, said where torch_npu is involved: the recording
    /// was made by torch_npu (its rules by default), or its rules were asked for.
    AllocatorRules {
        /// The rules replayed.
        flavour: Flavour,
        /// The allocator that made the recording, as far as it shows.
        recorded_by: Flavour,
    },
    /// No `--pytorch-version` was given: the release modelled, and what in the recording
    /// chose it (docs/pytorch-model.md#versions).
    ModelledVersion {
        /// The version modelled and why.
        modelled: ModelledVersion,
    },
    /// Expandable segments reserve a share of GPU memory, and none was given (`--gpu-mem`).
    AssumedGpuMemory {
        /// The GPU memory assumed.
        gpu_memory_bytes: u64,
    },
    /// A block live before recording proved to be at least `size` bytes at event `event`.
    LearnedOrphanSize {
        /// The block's address.
        addr: u64,
        /// Its smallest size consistent with the recording.
        size: u64,
        /// The event that shows it.
        event: u64,
    },
    /// A free of a block allocated before recording lies in no segment known at the start.
    UnplacedOrphanFree {
        /// The freed address.
        addr: u64,
    },
    /// Expandable segments: the GPU memory (`bytes`, the largest value the layout allows; `min`
    /// the smallest) was inferred from the recorded address layout: the reservation at
    /// `reservation` must end by `next`, where another stream's or pool's pages start.
    InferredGpuMemory {
        /// The memory used.
        bytes: u64,
        /// The smallest memory the recording's mapped runs allow.
        min: u64,
        /// The reservation whose end bounds the memory.
        reservation: u64,
        /// Where the next stream's or pool's pages start.
        next: u64,
        /// Whether a `per_process_memory_fraction` depends on it.
        fraction: bool,
    },
    /// Expandable segments: no GPU memory fits the recording's layout.
    GpuMemoryConflict {
        /// What its mapped runs need at least.
        min: u64,
        /// What the gaps between reservations allow at most.
        max: u64,
        /// The memory assumed.
        assumed: u64,
    },
    /// The recorded `PYTORCH_CUDA_ALLOC_CONF` names options this fragsim does not know (a newer
    /// PyTorch's): they were left out of the replay ([`Config::unmodelled_options`]).
    UnmodelledOptions {
        /// The options' names.
        names: Vec<String>,
    },
    /// Segments at the dump belong to private pools (`segment_pool_id` ≠ (0, 0)).
    PrivatePools {
        /// How many segments.
        segments: u64,
        /// Their bytes.
        bytes: u64,
        /// How many pools.
        pools: u64,
        /// Whether the entries name their pools (`pool_id`), which then route each request.
        named: bool,
    },
    /// Every trace entry names its pool (`pool_id`, PyTorch ≈ 2.7+): each request was made
    /// into the pool its entry names.
    EntriesNamePools {
        /// The private pools they name.
        pools: u64,
        /// The `alloc` entries made into one.
        allocs: u64,
    },
    /// Expandable segments: the recording shows which memory private pools got
    /// ([`Config::expandable_in_private_pools`]), whatever the version modelled.
    PrivatePoolMemory {
        /// Pages of their own reservations (PyTorch ≈ 2.5+); else cudaMalloc segments.
        expandable: bool,
        /// How many pools got segments of their MemPool's own allocator instead.
        own_allocator: u64,
    },
    /// The recording reserved more than its `per_process_memory_fraction` allows of the GPU
    /// memory assumed: the GPU had at least `bytes` (the recorded peak over the fraction), so
    /// that was modelled instead.
    GpuMemoryFromPeak {
        /// The GPU memory modelled: the least that lets the recorded peak through.
        bytes: u64,
        /// The recorded peak of reserved bytes.
        peak: u64,
        /// The memory assumed before.
        assumed: u64,
    },
    /// The recorded settings say `expandable_segments:False` but the trace maps pages
    /// (`segment_map` entries or expandable ranges in the dump): replayed with expandable
    /// segments ([`start::shows_expandable`]).
    ExpandableFromTrace,
    /// Expandable segments: the recording bounds the GPU memory only from below.
    GpuMemoryUnbounded {
        /// The smallest memory that fits.
        min: u64,
        /// The memory assumed.
        assumed: u64,
        /// Whether a `per_process_memory_fraction` depends on it.
        fraction: bool,
    },
}

impl Warning {
    /// Whether the note says what was modelled without being recorded (the PyTorch version, the
    /// GPU's memory): shown even without `--verbose`.
    pub fn is_modelling_note(&self) -> bool {
        matches!(
            self,
            Warning::ModelledVersion { .. }
                | Warning::AllocatorRules { .. }
                | Warning::AssumedGpuMemory { .. }
                | Warning::InferredGpuMemory { .. }
                | Warning::GpuMemoryConflict { .. }
                | Warning::GpuMemoryUnbounded { .. }
                | Warning::GpuMemoryFromPeak { .. }
                | Warning::PrivatePools { .. }
                | Warning::EntriesNamePools { .. }
                | Warning::PrivatePoolMemory { .. }
                | Warning::UnmodelledOptions { .. }
                | Warning::ExpandableFromTrace
        )
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Warning::UnmodelledOptions { ref names } => write!(
                f,
                "the recorded PYTORCH_CUDA_ALLOC_CONF names option(s) this fragsim does not \
                 model, left out of the replay: {}",
                names.join(", ")
            ),
            Warning::NoAllocatorSettings => {
                f.write_str("the snapshot has no allocator_settings: PyTorch's defaults")
            }
            Warning::ExpandableFromTrace => f.write_str(
                "the recorded settings say expandable_segments:False but the trace maps pages \
                 (segment_map entries or expandable segments): replayed with expandable segments",
            ),
            Warning::AllocatorRules { flavour, recorded_by } => match (flavour, recorded_by) {
                (Flavour::Npu, Flavour::Npu) => f.write_str(
                    "recorded by torch_npu (Ascend NPU): replayed with torch_npu's allocator rules \
                     (pytorch-npu); -p pytorch-cuda replays CUDA's",
                ),
                (Flavour::Cuda, _) => f.write_str(
                    "recorded by torch_npu (Ascend NPU), replayed with CUDA's allocator rules as asked \
                     (pytorch-cuda)",
                ),
                (Flavour::Npu, Flavour::Cuda) => f.write_str(
                    "replayed with torch_npu's allocator rules as asked (pytorch-npu); the \
                     recording does not show torch_npu",
                ),
            },
            Warning::ModelledVersion { ref modelled } => write!(f, "{modelled}"),
            Warning::AssumedGpuMemory { gpu_memory_bytes } => write!(
                f,
                "expandable segments: reservations assumed 9/8 of {} of GPU memory (--gpu-mem)",
                crate::units::format_bytes(gpu_memory_bytes)
            ),
            Warning::LearnedOrphanSize { addr, size, event } => write!(
                f,
                "the block at {addr:#x}, live before recording, is at least {size} bytes: event {event} shows it"
            ),
            Warning::UnplacedOrphanFree { addr } => {
                write!(f, "the orphan free at {addr:#x} lies in no segment known at the start")
            }
            Warning::InferredGpuMemory { bytes, min, reservation, next, fraction } => write!(
                f,
                "expandable segments: GPU memory inferred as {} (the recording allows {} to {}): \
                 the reservation at {reservation:#x} ends by {next:#x}, where another stream's or pool's \
                 pages start{}; --gpu-mem overrides",
                exact_bytes(bytes),
                exact_bytes(min),
                exact_bytes(bytes),
                fraction_note(fraction)
            ),
            Warning::GpuMemoryConflict { min, max, assumed } => write!(
                f,
                "expandable segments: no GPU memory fits the recording's layout (its mapped runs need \
                 at least {}, the gaps between reservations allow at most {}); assumed {}: give the \
                 card's memory with --gpu-mem",
                exact_bytes(min),
                exact_bytes(max),
                exact_bytes(assumed)
            ),
            Warning::PrivatePools { segments, bytes, pools, named } => write!(
                f,
                "{segments} segment(s) ({}) at the dump belong to {pools} private pool(s) (CUDA \
                 graphs or torch.cuda.MemPool): those live from the start are kept apart, their \
                 free blocks given to no other allocation, as PyTorch does; {}",
                crate::units::format_bytes(bytes),
                if named {
                    "the entries name the pool each request was made into"
                } else {
                    "the trace does not mark the allocations made into a private pool, so one \
                     recorded inside such a segment is made into its pool"
                }
            ),
            Warning::EntriesNamePools { pools, allocs } => write!(
                f,
                "every entry names its pool (pool_id): {allocs} allocation(s) were made into \
                 {pools} private pool(s), and each request is made into the pool its entry names"
            ),
            Warning::PrivatePoolMemory { expandable: true, own_allocator } => {
                f.write_str(
                    "expandable segments: the recording shows private pools mapping pages of \
                     their own reservations (PyTorch ≈ 2.5 and later), as modelled",
                )?;
                if own_allocator > 0 {
                    write!(
                        f,
                        "; {own_allocator} got segments instead (a MemPool with an allocator of \
                         its own), which split as cudaMalloc segments do"
                    )?;
                }
                Ok(())
            }
            Warning::PrivatePoolMemory { expandable: false, .. } => f.write_str(
                "expandable segments: the recording shows private pools getting cudaMalloc \
                 segments (PyTorch before ≈ 2.5), as modelled",
            ),
            Warning::GpuMemoryFromPeak { bytes, peak, assumed } => write!(
                f,
                "the recorded per_process_memory_fraction let a peak of {} reserved through, so \
                 the GPU had at least {} of memory, more than the {} assumed; modelled {}: give \
                 the card's memory with --gpu-mem",
                crate::units::format_bytes(peak),
                exact_bytes(bytes),
                crate::units::format_bytes(assumed),
                crate::units::format_bytes(bytes)
            ),
            Warning::GpuMemoryUnbounded { min, assumed, fraction } => write!(
                f,
                "expandable segments: the recording does not fix the GPU's memory (any value of \
                 at least {} fits); assumed {}{}: give the card's memory with --gpu-mem",
                exact_bytes(min),
                exact_bytes(assumed),
                fraction_note(fraction)
            ),
        }
    }
}

/// `12.00 GiB (12884901888 B)`: a size to read and to pass back as `--gpu-mem`.
fn exact_bytes(v: u64) -> String {
    format!("{} ({v} B)", crate::units::format_bytes(v))
}

/// The clause a GPU-memory note adds when a memory fraction depends on it.
fn fraction_note(fraction: bool) -> &'static str {
    if fraction {
        "; per_process_memory_fraction is a fraction of it"
    } else {
        ""
    }
}

/// What happens at one recorded event.
#[derive(Clone, Debug)]
enum Op {
    /// A malloc, ending at an `alloc` (or an `oom` when `oom`), with its recorded segment events.
    Malloc { size: u64, stream: u64, oom: bool, script: Vec<usize> },
    /// A free taking effect.
    Free,
    /// An `empty_cache()`: a recorded release run outside any malloc.
    Flush { script: Vec<usize> },
    /// Nothing to do (free_requested, a segment event a malloc or flush owns, snapshot).
    Skip,
}

/// Assigns every recorded event its [`Op`] (the trace order inside one malloc,
/// docs/pytorch-model.md#malloc-order). The release runs a replay takes for the program's
/// `empty_cache()` calls (`calls`, the first index of each: [`ReplayInput::empty_cache_at`],
/// read by stacks and levels) are a flush even right before a malloc's new segment, so that
/// `validate` checks the program a replay runs; a run ends at a release whose stack names
/// another cause (`causes`, [`FlushCause`]).
fn plan(events: &[Event], causes: &FlushCauses, calls: &[u64]) -> Vec<Op> {
    let frees_at = free_action(events);
    let mut ops = vec![Op::Skip; events.len()];
    let mut i = 0;
    let release = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    while i < events.len() {
        let e = &events[i];
        if release(e.action) && calls.binary_search(&(i as u64)).is_ok() {
            let start = i;
            let mut segs = Vec::new();
            while i < events.len() {
                let x = &events[i];
                if causes.made_by_call(x) {
                    segs.push(i);
                } else if x.action == Action::FreeCompleted {
                    ops[i] = Op::Free;
                } else {
                    break;
                }
                i += 1;
            }
            ops[start] = Op::Flush { script: segs };
            continue;
        }
        if e.action.is_segment_event() {
            let start = i;
            let mut segs = Vec::new();
            while i < events.len()
                && (events[i].action.is_segment_event()
                    || events[i].action == Action::FreeCompleted)
            {
                if events[i].action.is_segment_event() {
                    segs.push(i);
                } else {
                    ops[i] = Op::Free;
                }
                i += 1;
            }
            let last = segs.last().map(|&j| events[j].action);
            let owner = events.get(i).map(|x| x.action);
            let malloc = match owner {
                Some(Action::Alloc) => {
                    matches!(last, Some(Action::SegmentAlloc | Action::SegmentMap))
                }
                Some(Action::Oom) => true,
                _ => false,
            };
            if malloc {
                let x = &events[i];
                ops[i] = Op::Malloc {
                    size: x.size,
                    stream: x.stream,
                    oom: x.action == Action::Oom,
                    script: segs,
                };
                i += 1;
            } else {
                ops[start] = Op::Flush { script: segs };
            }
            continue;
        }
        ops[i] = match e.action {
            Action::Alloc => {
                Op::Malloc { size: e.size, stream: e.stream, oom: false, script: vec![] }
            }
            Action::Oom => Op::Malloc { size: e.size, stream: e.stream, oom: true, script: vec![] },
            a if a == frees_at => Op::Free,
            _ => Op::Skip,
        };
        i += 1;
    }
    ops
}

/// The event indices at which `validate` makes the program's `empty_cache()` calls: the start of
/// every [`Op::Flush`] its plan gives the events of `device` in `trace`, in order. A replay
/// reads the same flushes by its own rules ([`ReplayInput::empty_cache_at`]); both readings
/// must agree, and this is exposed, hidden, only for the test that checks they do
/// (in `tests/pytorch.rs`).
#[doc(hidden)]
pub fn planned_empty_cache_calls(trace: &Trace, device: i32) -> Result<Vec<u64>> {
    let Some(d) = trace.device(device) else { return Ok(Vec::new()) };
    let input = ReplayInput::of_events(trace, device, &d.events)?;
    let ops = plan(&d.events, &FlushCauses::of(&trace.frames), input.empty_cache_at());
    let flush = |(i, op): (usize, &Op)| matches!(op, Op::Flush { .. }).then_some(i as u64);
    Ok(ops.iter().enumerate().filter_map(flush).collect())
}

/// Addresses for segments the recording does not show: far from any real GPU address.
const FRESH_BASE: u64 = 0xf000_0000_0000;

/// A device that follows the recording: see the module docs.
struct Guided<'a> {
    events: &'a [Event],
    /// The recorded segment events of the current operation.
    script: Vec<usize>,
    /// The current malloc ended in a recorded OOM.
    oom: bool,
    /// The simulated segment events of the current operation.
    log: Vec<Event>,
    segments: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, u64>,
    reserved: u64,
    /// While the start state is installed: the recorded addresses of its segments, then of its
    /// expandable reservations, in the order the policy obtains them ([`PyTorch`]'s
    /// `Policy::start`).
    installing: std::vec::IntoIter<u64>,
    fresh: u64,
    now: i64,
    /// The index of the event being replayed, and the stream of the malloc being served.
    at: usize,
    stream: u64,
    /// The page size of the malloc's pool, and whether it is the small pool: what its maps are
    /// made of (a small-pool malloc maps one page, a large-pool one whole pages).
    page: u64,
    small: bool,
    /// The private pool the malloc was made into (`None`: the default pools), and the routes
    /// that tell a recorded map's pool: a reservation is one pool's.
    pool: Option<(u64, u64)>,
    routes: Option<&'a crate::trace::pool_routes::PoolRoutes>,
}

impl<'a> Guided<'a> {
    /// A device that follows `events` (and looks ahead no further) from `start`, whose segments
    /// and reservations it hands out at their recorded addresses first.
    fn new(events: &'a [Event], start: &'a StartState) -> Guided<'a> {
        let segments = start.segments.iter().filter(|s| !s.expandable).map(|s| s.addr);
        let bases = start.reservations.iter().map(|r| r.base);
        let installing: Vec<u64> = segments.chain(bases).collect();
        Guided {
            events,
            script: Vec::new(),
            oom: false,
            log: Vec::new(),
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            reserved: 0,
            installing: installing.into_iter(),
            fresh: FRESH_BASE,
            now: 0,
            at: 0,
            stream: 0,
            page: 0,
            small: false,
            pool: None,
            routes: start.routes.as_ref(),
        }
    }

    /// Starts the operation of recorded event `at` (the start state is installed by then).
    fn begin(&mut self, at: usize) {
        self.at = at;
        self.now = self.events.get(at).map_or(self.now, |e| e.time_us);
        self.installing = Vec::new().into_iter();
    }

    /// Follows `script`, the recorded segment events of the operation about to run (`oom`: it
    /// ends in a recorded out-of-memory), with an empty log.
    fn follow(&mut self, script: &[usize], oom: bool) {
        self.script.clear();
        self.script.extend_from_slice(script);
        self.oom = oom;
        self.log.clear();
    }

    /// The recorded event at the position the next simulated one will take.
    fn expected(&self) -> Option<&Event> {
        self.script.get(self.log.len()).map(|&i| &self.events[i])
    }

    /// Whether the recording shows the next device call failing.
    fn fails(&self) -> bool {
        match self.expected() {
            Some(e) => matches!(e.action, Action::SegmentFree | Action::SegmentUnmap),
            None => self.oom,
        }
    }

    fn fresh(&mut self, size: u64) -> u64 {
        let a = self.fresh;
        self.fresh += size.div_ceil(2 << 20).max(1) * (2 << 20);
        a
    }

    fn hold(&mut self, delta: i64) {
        self.reserved = self.reserved.wrapping_add_signed(delta);
    }

    fn note(&mut self, action: Action, addr: u64, size: u64) {
        self.log.push(Event::new(action, addr, size, 0, self.now));
    }
}

impl Backend for Guided<'_> {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        if self.fails() {
            return Ok(None);
        }
        let addr = match (self.installing.next(), self.expected()) {
            (Some(a), _) => a,
            (None, Some(e)) if e.action == Action::SegmentAlloc && e.size == size => e.addr,
            _ => self.fresh(size),
        };
        self.segments.insert(addr, size);
        self.hold(size as i64);
        self.note(Action::SegmentAlloc, addr, size);
        Ok(Some(addr))
    }

    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        if self.segments.remove(&addr) != Some(size) {
            return Err(Error::backend(format!(
                "segment_free({addr:#x}, {size}): no such segment"
            )));
        }
        self.hold(-(size as i64));
        self.note(Action::SegmentFree, addr, size);
        Ok(())
    }

    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        if let Some(base) = self.installing.next() {
            self.reservations.insert(base, size);
            return Ok(Some(base));
        }
        // The first map of a new reservation is at its base (the lowest hole), possibly after a
        // failed first attempt and a flush within the same malloc. The whole script is searched:
        // the simulation may have logged a different number of events before this call (one
        // recorded unmap can be two of its own), and a map already made lies in a known
        // reservation.
        let new_map = |e: &&Event| {
            e.action == Action::SegmentMap
                && !self.reservations.iter().any(|(&a, &s)| a <= e.addr && e.addr < a + s)
        };
        // A malloc that fails after reserving (an OOM: no page could be mapped) keeps the
        // reservation, and a later malloc on its stream and pool maps into it: the first later
        // map on that stream, of that pool's pages, outside every known reservation shows where
        // it is.
        let (stream, page, small) = (self.stream, self.page.max(1), self.small);
        let same_private = |e: &Event| self.routes.is_none_or(|r| r.pool_for(e) == self.pool);
        let of_pool = |e: &&Event| {
            (if small { e.size == page } else { e.size % page == 0 }) && same_private(e)
        };
        let recorded = self
            .script
            .iter()
            .map(|&i| &self.events[i])
            .find(new_map)
            .or_else(|| {
                let later = self.events.get(self.at..)?;
                later.iter().find(|e| e.stream == stream && new_map(e) && of_pool(e))
            })
            .map(|e| e.addr);
        let addr = match recorded {
            Some(a) => a,
            None => self.fresh(size),
        };
        self.reservations.insert(addr, size);
        Ok(Some(addr))
    }

    fn release(&mut self, addr: u64, _size: u64) -> Result<()> {
        self.reservations.remove(&addr);
        Ok(())
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        if self.fails() {
            return Ok(false);
        }
        self.hold(size as i64);
        self.note(Action::SegmentMap, addr, size);
        Ok(true)
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        self.hold(-(size as i64));
        self.note(Action::SegmentUnmap, addr, size);
        Ok(())
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }
}

/// One replay from one start state: every decision the simulation made and how it compared.
#[derive(Default)]
struct Run {
    /// Per recorded event index of an alloc: the simulated address (None: the malloc failed).
    placed: Vec<(usize, Option<u64>)>,
    mismatches: Vec<Mismatch>,
    /// First alloc whose recorded address lies strictly inside a simulated free block.
    first_inside_free: Option<(usize, u64)>,
    /// First alloc placed elsewhere: (event, recorded address, simulated address).
    first_mismatch: Option<(usize, u64, Option<u64>)>,
    /// Allocs of exact-address allocations served (placed by address, not compared).
    exact_placed: u64,
    segment_events_matched: u64,
    /// The engine's output: peaks, the simulated run as events, the final segments.
    output: ReplayOutput,
}

/// How far a replay goes.
#[derive(Clone, Copy)]
enum Stop<'a> {
    /// To the end.
    Never,
    /// At the first alloc placed elsewhere than recorded.
    FirstMismatch,
    /// At the first alloc where the placement differs from this reference run's, or where both
    /// differ from the recording.
    Diverge(&'a [(usize, Option<u64>)]),
}

fn hex(a: u64) -> String {
    format!("{a:#x}")
}

/// Tells `policy` of every private pool that a release in `script` shows gone, before the flush
/// that made those releases runs: PyTorch's flush releases gone pools after the default ones,
/// so the first release of the run comes before the one that names the pool. For a malloc's
/// script, `request` is the pool the malloc was made into, whose releases are its own (within
/// its live pool), not a gone pool's.
fn release_gone_pools(
    policy: &mut PyTorch,
    routes: Option<&crate::trace::pool_routes::PoolRoutes>,
    events: &[Event],
    script: &[usize],
    request: Option<(u64, u64)>,
) -> Result<()> {
    let Some(routes) = routes else { return Ok(()) };
    for e in script.iter().filter_map(|&j| events.get(j)) {
        if let Some(pool) = routes.released_by(e).filter(|&p| Some(p) != request) {
            policy.release_pool(pool)?;
        }
    }
    Ok(())
}

/// Why the simulation placed a block elsewhere: what it holds at the recorded address. `routed`
/// says whether the malloc was made into a private pool.
fn explain(policy: &PyTorch, recorded: u64, placed: Option<u64>, routed: bool) -> String {
    match policy.private_pool_at(recorded) {
        Some((a, b)) if !routed => {
            return format!(
                "the recorded address is in a segment of the private pool ({a}, {b}), which the \
                 dump does not show owning it then: an allocation made into a CUDA graph's or \
                 MemPool's pool that could not be routed there"
            )
        }
        _ => {}
    }
    match policy.block_containing(recorded) {
        None => "the recorded address is in no simulated segment".into(),
        Some((start, size, true)) if Some(start) == placed => format!(
            "the recorded address was inside the free block the simulation split for this request ({start:#x}+{size}): a block boundary differs"
        ),
        Some((start, size, true)) => {
            format!("the recorded address is inside a live block {start:#x}+{size} in the simulation")
        }
        Some((start, size, false)) if start == recorded => {
            format!("a free block starts there ({size} bytes) but best fit chose another")
        }
        Some((start, size, false)) => format!(
            "the recorded address is inside the free block {start:#x}+{size}: a block boundary differs"
        ),
    }
}

/// The recording as validation replays it: the events of one device, what happens at each
/// ([`plan`]), and the same events prepared for the replay engine.
struct Recording<'a> {
    events: &'a [Event],
    ops: Vec<Op>,
    input: ReplayInput<'a>,
}

/// How to run one replay of a [`Recording`].
#[derive(Clone, Copy)]
struct RunOptions<'a> {
    stop: Stop<'a>,
    /// Replay events up to this index (inclusive) only.
    upto: Option<usize>,
    /// Keep the simulated run as events.
    record: bool,
    /// Check the policy's invariants after every event.
    check: bool,
    cancel: &'a Cancel,
}

impl<'a> RunOptions<'a> {
    fn new(stop: Stop<'a>, cancel: &'a Cancel) -> RunOptions<'a> {
        RunOptions { stop, upto: None, record: false, check: false, cancel }
    }
}

/// Replays `recording` from `start` under `config`: the replay engine, on a device that follows
/// the recording ([`Guided`]), with a guide that compares every decision ([`Checker`]).
fn replay(
    recording: &Recording,
    start: &StartState,
    config: &Config,
    how: RunOptions,
) -> Result<Run> {
    let events = match how.upto {
        Some(k) => &recording.events[..(k + 1).min(recording.events.len())],
        None => recording.events,
    };
    let mut checker = Checker {
        events: recording.events,
        ops: &recording.ops,
        captured_ooms: recording.input.ooms_without_release(),
        routes: start.routes.clone(),
        exact: crate::replay::ExactPlacer::new(recording.input.exact_addresses()),
        undecided: crate::replay::Undecided::new(&recording.input),
        stop: how.stop,
        ref_pos: 0,
        run: Run::default(),
        stopped: false,
    };
    let options = ReplayOptions {
        stop_after: how.upto.map(|k| k as u64),
        record_events: how.record,
        check_invariants: how.check,
        cancel: how.cancel.clone(),
        ..ReplayOptions::default()
    };
    let policy = PyTorch::new(config.clone()).starting_from(start.clone());
    let device = Guided::new(events, start);
    let output = run_guided(NAME, policy, device, &mut checker, &recording.input, &options)
        .map_err(|e| match e.kind() {
            crate::error::ErrorKind::Input if how.check => {
                Error::input(format!("the pytorch policy broke an invariant: {e}"))
            }
            _ => e,
        })?;
    let mut run = checker.run;
    run.output = output;
    Ok(run)
}

/// Validation's guide of the replay engine: before each malloc it tells the [`Guided`] device
/// which recorded segment events the malloc owns and routes the request to its recorded pool;
/// after it, it compares the address and the segment events with the recording; it performs
/// the recorded `empty_cache()` calls and compares what they released.
struct Checker<'a> {
    events: &'a [Event],
    ops: &'a [Op],
    /// The recorded `oom` entries made during a graph capture
    /// ([`ReplayInput::ooms_without_release`]).
    captured_ooms: &'a [u64],
    routes: Option<crate::trace::pool_routes::PoolRoutes>,
    /// The recording's exact-address allocations, placed where recorded.
    exact: crate::replay::ExactPlacer<'a>,
    /// The release runs the recording leaves undecided, decided as a replay decides them.
    undecided: crate::replay::Undecided<'a>,
    stop: Stop<'a>,
    /// The next placement of the reference run to compare with ([`Stop::Diverge`]).
    ref_pos: usize,
    run: Run,
    stopped: bool,
}

impl<'a> Guide<PyTorch, Guided<'a>> for Checker<'a> {
    /// Blocks the recovered start state does not hold have no segment: their frees are
    /// mismatches, not mallocs of fresh memory.
    const MALLOCS_UNHELD_START: bool = false;

    fn starts_cold(&self, _: &ReplayOptions) -> bool {
        false
    }

    fn before_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut PyTorch,
        backend: &mut Observed<Guided<'a>, O>,
    ) -> Result<()> {
        let i = index as usize;
        let Some(Op::Malloc { size, stream, oom, script }) = self.ops.get(i) else {
            return Ok(());
        };
        let (size, stream, oom) = (*size, *stream, *oom);
        let dev = &mut backend.inner;
        dev.begin(i);
        dev.stream = stream;
        dev.small = policy.settings().round_size(size) <= SMALL_SIZE;
        dev.page = policy.settings().page_size(dev.small);
        // The pool the entry names, or where the recording placed it, says whether it was made
        // into a private pool (during graph capture, or under use_mem_pool).
        let mut into = self.routes.as_mut().and_then(|r| r.route(e));
        policy.allocate_into(into)?;
        // An OOM of a file that names no pools has no address to tell its pool by.
        if into.is_none() {
            let cached = || policy.would_hit_cache(size, stream);
            if let Some(p) = self.routes.as_mut().and_then(|r| r.route_failed(e, cached)) {
                into = Some(p);
                policy.allocate_into(into)?;
            }
        }
        backend.inner.pool = into;
        // An OOM that no release preceded: PyTorch releases every cached segment before giving
        // up unless a graph capture is underway, so one was (or there was nothing to release,
        // which skipping the release reproduces as well). Read as a replay reads it.
        let events = self.events;
        let released =
            |j: &usize| matches!(events[*j].action, Action::SegmentFree | Action::SegmentUnmap);
        let captured = self.captured_ooms.binary_search(&index).is_ok();
        debug_assert_eq!(!oom || captured, !oom || !script.iter().any(released), "event {i}");
        policy.set_capture_underway(oom && captured);
        release_gone_pools(policy, self.routes.as_ref(), events, script, into)?;
        // A release run right before a malloc's new segment is either the malloc's own fallback
        // or an empty_cache() just before it: decided as a replay decides it.
        let releases = script.iter().take_while(|j| released(j)).count();
        let mut script = &script[..];
        if releases > 0 && self.undecided.called_before(index, &*policy) {
            backend.inner.follow(&script[..releases], false);
            policy.empty_cache(backend)?;
            compare_segments(events, &script[..releases], &backend.inner.log, i, &mut self.run);
            script = &script[releases..];
        }
        backend.inner.follow(script, oom);
        if self.exact.any() {
            self.exact.before(index, e, policy);
        }
        Ok(())
    }

    fn after_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        placed: Option<u64>,
        policy: &mut PyTorch,
        backend: &mut Observed<Guided<'a>, O>,
    ) -> Result<()> {
        let i = index as usize;
        let dev = &backend.inner;
        compare_segments(self.events, &dev.script, &dev.log, i, &mut self.run);
        if e.action == Action::Oom {
            if let Some(a) = placed {
                self.run.mismatches.push(Mismatch {
                    event: index,
                    action: Some(Action::Oom),
                    expected: "out of memory".into(),
                    got: hex(a),
                    why: "the simulation found memory where the real allocator did not".into(),
                });
            }
            return Ok(());
        }
        if self.exact.any() {
            self.exact.after(index, placed);
            if self.exact.is_placed(index) {
                // Placed by address: counted apart, never compared.
                self.run.exact_placed += 1;
                return Ok(());
            }
        }
        let run = &mut self.run;
        run.placed.push((i, placed));
        if placed != Some(e.addr) {
            let why = explain(policy, e.addr, placed, dev.pool.is_some());
            // Before this malloc, was the recorded address strictly inside a free block? Either
            // it still is, or the simulation carved its block from that one.
            if run.first_inside_free.is_none() {
                let inside = match policy.block_containing(e.addr) {
                    Some((s, _, false)) => s < e.addr,
                    Some((s, _, true)) => Some(s) == placed && s < e.addr,
                    None => false,
                };
                if inside {
                    run.first_inside_free = Some((i, e.addr));
                }
            }
            run.first_mismatch.get_or_insert((i, e.addr, placed));
            run.mismatches.push(Mismatch {
                event: index,
                action: Some(Action::Alloc),
                expected: hex(e.addr),
                got: placed.map_or_else(|| "out of memory".into(), hex),
                why,
            });
        }
        self.stopped = match self.stop {
            Stop::Never => false,
            Stop::FirstMismatch => run.first_mismatch.is_some(),
            Stop::Diverge(reference) => {
                let base = reference.get(self.ref_pos).map(|&(_, a)| a);
                self.ref_pos += 1;
                base != Some(placed) || placed != Some(e.addr)
            }
        };
        Ok(())
    }

    fn segment_event<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut PyTorch,
        backend: &mut Observed<Guided<'a>, O>,
    ) -> Result<bool> {
        if let Some(r) = &mut self.routes {
            r.follow(e);
        }
        let i = index as usize;
        let Some(Op::Flush { script }) = self.ops.get(i) else { return Ok(false) };
        release_gone_pools(policy, self.routes.as_ref(), self.events, script, None)?;
        backend.inner.begin(i);
        backend.inner.follow(script, false);
        policy.empty_cache(backend)?;
        compare_segments(self.events, script, &backend.inner.log, i, &mut self.run);
        Ok(true)
    }

    fn unheld_free(&mut self, index: u64, e: &Event) {
        self.run.mismatches.push(Mismatch {
            event: index,
            action: Some(e.action),
            expected: hex(e.addr),
            got: "no live block there".into(),
            why: "the start state lacks this block (its segment is unknown)".into(),
        });
    }

    fn stopped(&self) -> bool {
        self.stopped
    }

    fn doing(_: &str, index: u64, count: u64) -> String {
        format!("validating at event {index} of {count}")
    }
}

/// Compares the simulated segment events of one operation with the recorded ones.
fn compare_segments(events: &[Event], script: &[usize], log: &[Event], at: usize, run: &mut Run) {
    let n = script.len().max(log.len());
    for k in 0..n {
        let rec = script.get(k).map(|&j| (j, &events[j]));
        let sim = log.get(k);
        let same = matches!((rec, sim), (Some((_, r)), Some(s))
            if r.action == s.action && r.size == s.size && r.addr == s.addr);
        if same {
            run.segment_events_matched += 1;
            continue;
        }
        let show = |e: &Event| format!("{} {:#x} {}", e.action.name(), e.addr, e.size);
        run.mismatches.push(Mismatch {
            event: rec.map_or(at, |(j, _)| j) as u64,
            action: rec.map(|(_, r)| r.action).or(sim.map(|s| s.action)),
            expected: rec.map_or_else(|| "nothing".into(), |(_, r)| show(r)),
            got: sim.map_or_else(|| "nothing".into(), show),
            why: "the simulated allocator obtained or released different memory here".into(),
        });
    }
}

/// The orphan-growth rule (docs/pytorch-model.md#orphan-growth) generalised: the smallest longer
/// size of one ambiguous orphan, near the recorded or the simulated address, that makes every
/// placement up to event `k` match the recording.
fn longer_orphan(
    recording: &Recording,
    start: &StartState,
    config: &Config,
    k: usize,
    (recorded, simulated): (u64, Option<u64>),
    cancel: &Cancel,
) -> Result<Option<(u64, u64)>> {
    let mut candidates = start.ambiguous_near(recorded);
    if let Some(s) = simulated {
        candidates.extend(start.ambiguous_near(s));
    }
    candidates.sort_unstable();
    candidates.dedup();
    let passes = |o: u64, size: u64| -> Result<bool> {
        let v = start.with_size(o, size);
        let how = RunOptions { upto: Some(k), ..RunOptions::new(Stop::FirstMismatch, cancel) };
        Ok(replay(recording, &v, config, how)?.first_mismatch.is_none())
    };
    for o in candidates {
        let Some(b) = start.orphan(o) else { continue };
        let (mut lo, mut hi) = (b.size, b.max_size); // lo fails, hi is tested next
        if !passes(o, hi)? {
            continue;
        }
        while hi - lo > config::MIN_BLOCK_SIZE {
            let mid = lo + (hi - lo) / 2 / config::MIN_BLOCK_SIZE * config::MIN_BLOCK_SIZE;
            let mid = mid.max(lo + config::MIN_BLOCK_SIZE);
            if passes(o, mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        return Ok(Some((o, hi)));
    }
    Ok(None)
}

/// The simulated layout at the end must equal the snapshot's final `segments` (addresses,
/// sizes and states of every block). Reported as one mismatch at the event after the last.
fn compare_final_segments(
    trace: &Trace,
    device: i32,
    simulated_segments: &[Segment],
    at: usize,
) -> Option<Mismatch> {
    let layout = |segs: &mut dyn Iterator<Item = &crate::trace::Segment>| {
        let mut v: Vec<(u64, u64, u64, bool)> = segs
            .flat_map(|s| {
                s.blocks.iter().map(|b| {
                    let live = !matches!(b.state, crate::trace::BlockState::Inactive);
                    (s.address, b.address, b.size, live)
                })
            })
            .collect();
        v.sort_unstable();
        v
    };
    let recorded = layout(&mut trace.segments_of(device));
    let simulated = layout(&mut simulated_segments.iter());
    if recorded == simulated {
        return None;
    }
    let first = recorded.iter().zip(&simulated).position(|(r, s)| r != s);
    let show = |b: Option<&(u64, u64, u64, bool)>| {
        b.map_or_else(
            || "nothing".to_string(),
            |&(seg, a, size, live)| {
                format!(
                    "block {a:#x}+{size} {} in segment {seg:#x}",
                    if live { "live" } else { "free" }
                )
            },
        )
    };
    let k = first.unwrap_or(recorded.len().min(simulated.len()));
    Some(Mismatch {
        event: at as u64,
        action: None,
        expected: show(recorded.get(k)),
        got: show(simulated.get(k)),
        why: format!(
            "the final layout differs ({} recorded blocks, {} simulated)",
            recorded.len(),
            simulated.len()
        ),
    })
}

/// The recorded reserved curve's peak (docs/pytorch-model.md#reserved-curve), from `start` bytes.
fn recorded_peak(events: &[Event], start: u64) -> u64 {
    let mut cur = start;
    let mut peak = start;
    for e in events {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => cur = cur.saturating_add(e.size),
            Action::SegmentFree | Action::SegmentUnmap => cur = cur.saturating_sub(e.size),
            _ => {}
        }
        peak = peak.max(cur);
    }
    peak
}

/// Validates one device of `trace`; see the module docs.
pub fn validate(trace: &Trace, options: &ValidateOptions) -> Result<Validation> {
    let device = match options.device {
        Some(d) => d,
        None => trace.default_device().ok_or_else(|| {
            Error::input("the trace has no events").at(crate::error::Place::Event(0))
        })?,
    };
    let events = &trace
        .device(device)
        .ok_or_else(|| Error::usage(format!("the trace has no device {device}")))?
        .events;
    let modelled = match options.version {
        Some(v) => ModelledVersion::given(v),
        None => ModelledVersion::of_trace(trace),
    };
    let version = modelled.version;
    let mut notes = Vec::new();
    let recorded_by = Flavour::of_trace(trace);
    let flavour = options.flavour.unwrap_or(recorded_by);
    if flavour == Flavour::Npu || recorded_by == Flavour::Npu {
        notes.push(Warning::AllocatorRules { flavour, recorded_by });
    }
    let mut config = match &trace.allocator_settings {
        Some(s) => {
            let names = Config::unmodelled_options_as(s, flavour);
            if !names.is_empty() {
                notes.push(Warning::UnmodelledOptions { names });
            }
            Config::from_recorded_as(s, version, flavour)?
        }
        None => {
            notes.push(Warning::NoAllocatorSettings);
            Config { version, ..Config::default_for(flavour) }
        }
    };
    if let Some(g) = options.gpu_memory {
        config.gpu_memory = g;
    }
    if !config.expandable_segments && start::shows_expandable(trace, device, events) {
        config.expandable_segments = true;
        notes.push(Warning::ExpandableFromTrace);
    }
    let pool_memory = start::PrivatePoolMemory::recorded(trace, device, events);
    pool_memory.apply_to(&mut config);
    config.mem_pools = start::mem_pools_by_stacks(trace, events);
    if let Some(expandable) = pool_memory.expandable {
        let own_allocator = pool_memory.own_allocator.len() as u64;
        notes.push(Warning::PrivatePoolMemory { expandable, own_allocator });
    }
    if options.version.is_none() {
        notes.push(Warning::ModelledVersion { modelled });
    }
    let private: Vec<&Segment> =
        trace.segments_of(device).filter(|s| s.private_pool.is_some()).collect();
    if !private.is_empty() {
        let pools: BTreeSet<(u64, u64)> = private.iter().filter_map(|s| s.private_pool).collect();
        notes.push(Warning::PrivatePools {
            segments: private.len() as u64,
            bytes: private.iter().fold(0u64, |sum, s| sum.saturating_add(s.total_size)),
            pools: pools.len() as u64,
            named: trace.entry_pools.is_some(),
        });
    }
    if let Some(named) = &trace.entry_pools {
        let allocs = events.iter().filter(|e| e.action == Action::Alloc && e.pool.0 != 0);
        let allocs = allocs.count() as u64;
        if allocs > 0 {
            notes.push(Warning::EntriesNamePools { pools: named.len() as u64, allocs });
        }
    }
    let input = ReplayInput::of_events(trace, device, events)?;
    let mut ops = plan(events, &FlushCauses::of(&trace.frames), input.empty_cache_at());
    // An `oom` entry records the rounded size; the recording's allocator padded the request
    // first where it is torch_npu's, so the request that rounds to it is that much smaller.
    let pad = recorded_by.pad();
    for op in &mut ops {
        if let Op::Malloc { size, oom: true, .. } = op {
            if *size > pad {
                *size -= pad;
            }
        }
    }
    let mut start = StartState::recover(trace, device, events, &config);
    if options.gpu_memory.is_none() {
        // The memory fraction's limit let the recorded peak through: the GPU had at least that.
        let peak = recorded_peak(events, start.reserved());
        if let Some(least) = config.least_gpu_memory_for(peak).filter(|&g| g > config.gpu_memory) {
            notes.push(Warning::GpuMemoryFromPeak {
                bytes: least,
                peak,
                assumed: config.gpu_memory,
            });
            config.gpu_memory = least;
            start = StartState::recover(trace, device, events, &config);
        }
        if let Some(note) = infer_gpu_memory(events, &start, &mut config) {
            notes.push(note);
            start = StartState::recover(trace, device, events, &config);
        }
    }
    // Learn orphan sizes from placements that prove them (some the recovery already showed).
    let mut learned: Vec<(u64, u64, usize)> = start
        .segments
        .iter()
        .flat_map(|s| &s.live)
        .filter_map(|b| b.shown_at.map(|k| (b.addr, b.size, k)))
        .collect();
    let recording = Recording { events, ops, input };
    let cancel = &options.cancel;
    loop {
        let run =
            replay(&recording, &start, &config, RunOptions::new(Stop::FirstMismatch, cancel))?;
        let Some((k, recorded, simulated)) = run.first_mismatch else { break };
        if run.first_inside_free == Some((k, recorded)) {
            if let Some(orphan) = start.extend(recorded) {
                learned.push((orphan, recorded - orphan, k));
                continue;
            }
        }
        match longer_orphan(&recording, &start, &config, k, (recorded, simulated), cancel)? {
            Some((orphan, size)) => {
                start.set_size(orphan, size);
                learned.push((orphan, size, k));
            }
            None => break,
        }
    }
    let how = RunOptions {
        record: options.record_events,
        check: options.check_invariants,
        ..RunOptions::new(Stop::Never, cancel)
    };
    let base = replay(&recording, &start, &config, how)?;
    // Each orphan's last lower bound, in the order learned.
    let last = |o: u64| learned.iter().rposition(|l| l.0 == o);
    let shown: Vec<_> = learned.iter().enumerate().filter(|(i, l)| last(l.0) == Some(*i)).collect();
    for (_, (o, size, k)) in shown {
        notes.push(Warning::LearnedOrphanSize { addr: *o, size: *size, event: *k as u64 });
    }
    // Decisions (docs/pytorch-model.md#undeterminable) that depend on an ambiguous orphan's size.
    let mut undeterminable: BTreeMap<usize, Mismatch> = BTreeMap::new();
    for o in start.ambiguous() {
        let variant = start.with_longest(o);
        let run = replay(
            &recording,
            &variant,
            &config,
            RunOptions::new(Stop::Diverge(&base.placed), cancel),
        )?;
        let k = run.placed.len().checked_sub(1);
        let Some(k) = k else { continue };
        let (event, sim) = run.placed[k];
        let base_addr = base.placed.get(k).and_then(|&(_, a)| a);
        if sim != base_addr && !undeterminable.contains_key(&event) {
            let b = start.orphan(o).map_or((0, 0), |b| (b.size, b.max_size));
            undeterminable.insert(
                event,
                Mismatch {
                    event: event as u64,
                    action: Some(Action::Alloc),
                    expected: hex(events[event].addr),
                    got: base_addr.map_or_else(|| "out of memory".into(), hex),
                    why: format!(
                        "depends on the size of the block at {o:#x}, live before recording: {} bytes by default, up to {} (it places it at {})",
                        b.0,
                        b.1,
                        sim.map_or_else(|| "nothing".into(), hex)
                    ),
                },
            );
        }
    }
    let undetermined: BTreeSet<usize> = undeterminable.keys().copied().collect();
    // Only a snapshot records the final layout (a text trace without segments has no dump).
    let has_dump = trace.source_format() == crate::trace::Format::PytorchSnapshot
        || !trace.segments.is_empty();
    let final_layout = compare_final_segments(trace, device, &base.output.segments, events.len())
        .filter(|_| has_dump);
    let allocs_total = events.iter().filter(|e| e.action == Action::Alloc).count() as u64;
    let allocs_addr_matched = base
        .placed
        .iter()
        .filter(|&&(i, a)| a == Some(events[i].addr) && !undetermined.contains(&i))
        .count() as u64;
    let mismatches: Vec<Mismatch> = base
        .mismatches
        .iter()
        .filter(|m| {
            !(m.action == Some(Action::Alloc) && undetermined.contains(&(m.event as usize)))
        })
        .cloned()
        .chain(final_layout.filter(|_| base.mismatches.is_empty()))
        .collect();
    for a in &start.unplaced {
        notes.push(Warning::UnplacedOrphanFree { addr: *a });
    }
    let segment_events_recorded = events.iter().filter(|e| e.action.is_segment_event()).count();
    let peak_rec = recorded_peak(events, start.reserved());
    let mut output = base.output;
    output.segments.iter_mut().for_each(|s| s.device = device);
    if !options.record_events {
        output.events = None;
    }
    Ok(Validation {
        trace: String::new(),
        device,
        allocs_total,
        allocs_addr_matched,
        allocs_exact_address: base.exact_placed,
        segment_events_recorded: segment_events_recorded as u64,
        segment_events_matched: base.segment_events_matched,
        peak_reserved_recorded_bytes: peak_rec,
        peak_reserved_simulated_bytes: output.result.peak_reserved_bytes,
        undeterminable_events: undeterminable.len() as u64,
        mismatches,
        undeterminable: undeterminable.into_values().collect(),
        notes,
        config: output.result.config.clone(),
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{text, ReadOptions};

    fn trace(src: &str) -> Trace {
        text::read(src.as_bytes(), &ReadOptions::default()).unwrap()
    }

    /// [`plan`] of device 0 of `t`, with the calls a replay reads there.
    fn plan_of(t: &Trace) -> Vec<Op> {
        let events = &t.devices[0].events;
        let input = ReplayInput::of_events(t, t.devices[0].device, events).unwrap();
        plan(events, &FlushCauses::of(&t.frames), input.empty_cache_at())
    }

    #[test]
    fn a_run_of_releases_outside_a_malloc_is_a_flush_and_a_malloc_owns_its_segments() {
        let t = trace(
            "segment_free 0x0 2097152\nalloc 0x0 8\nsegment_free 0x400000 2097152\n\
             segment_alloc 0x800000 20971520\nalloc 0x800000 4096000\n",
        );
        let ops = plan_of(&t);
        assert!(matches!(&ops[0], Op::Flush { script } if script == &vec![0]));
        assert!(matches!(&ops[1], Op::Malloc { script, .. } if script.is_empty()));
        assert!(matches!(ops[2], Op::Skip));
        assert!(matches!(&ops[4], Op::Malloc { script, .. } if script == &vec![2, 3]));
    }

    #[test]
    fn real_snapshots_keep_every_invariant() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
        for name in ["cs336-lm-step-c.pickle", "cs336-medium-ctx512-infer.pickle"] {
            // The real traces ship with the repository (`traces/real/README.md`).
            let t = crate::trace::read_trace(&dir.join(name), &Default::default())
                .unwrap_or_else(|e| panic!("{e}"));
            let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
            let v = validate(&t, &options).unwrap();
            assert!(v.mismatches.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_cold_trace_validates_exactly() {
        // 5 MiB gets a 20 MiB segment at the recorded address; 3 MiB goes right after it; after
        // both are freed, a flush returns the whole segment.
        let t = trace(
            "segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\n\
             alloc 0x10500000 3145728\nfree_requested 0x10000000 5242880\n\
             free_completed 0x10000000 5242880\nfree_requested 0x10500000 3145728\n\
             free_completed 0x10500000 3145728\nsegment_free 0x10000000 20971520\n",
        );
        let v = validate(&t, &ValidateOptions::default()).unwrap();
        assert_eq!((v.allocs_total, v.allocs_addr_matched), (2, 2));
        assert_eq!((v.segment_events_recorded, v.segment_events_matched), (2, 2));
        assert_eq!(v.peak_reserved_recorded_bytes, 20 << 20);
        assert_eq!(v.peak_reserved_simulated_bytes, 20 << 20);
        assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    }

    #[test]
    fn the_final_layout_is_compared_with_the_dump() {
        use crate::trace::{Block, BlockState, PoolKind, Segment};
        let mut t = trace("segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\n");
        let seg = |blocks: Vec<Block>| Segment {
            device: 0,
            address: 0x1000_0000,
            total_size: 20 << 20,
            stream: 0,
            pool: PoolKind::Large,
            is_expandable: false,
            private_pool: None,
            blocks,
        };
        let block = |address, size, state| Block { address, size, requested_size: 0, state };
        // The dump as the real allocator leaves it: 5 MiB live, 15 MiB free.
        t.segments = vec![seg(vec![
            block(0x1000_0000, 5 << 20, BlockState::ActiveAllocated),
            block(0x1050_0000, 15 << 20, BlockState::Inactive),
        ])];
        assert!(validate(&t, &ValidateOptions::default()).unwrap().mismatches.is_empty());
        // A dump that disagrees (the block is 6 MiB) is a mismatch after the last event.
        t.segments = vec![seg(vec![
            block(0x1000_0000, 6 << 20, BlockState::ActiveAllocated),
            block(0x1060_0000, 14 << 20, BlockState::Inactive),
        ])];
        let v = validate(&t, &ValidateOptions::default()).unwrap();
        assert_eq!(v.mismatches.len(), 1);
        assert_eq!((v.mismatches[0].event, v.mismatches[0].action_name()), (2, "segments"));
    }

    /// A 20 MiB large-pool segment on stream 0 of the dump, tiled by (address, size, state).
    fn segment_of_20_mib(
        address: u64,
        private_pool: Option<(u64, u64)>,
        blocks: &[(u64, u64, crate::trace::BlockState)],
    ) -> crate::trace::Segment {
        crate::trace::Segment {
            device: 0,
            address,
            total_size: 20 << 20,
            stream: 0,
            pool: crate::trace::PoolKind::Large,
            is_expandable: false,
            private_pool,
            blocks: blocks
                .iter()
                .map(|&(address, size, state)| crate::trace::Block {
                    address,
                    size,
                    requested_size: 0,
                    state,
                })
                .collect(),
        }
    }

    #[test]
    fn a_private_pool_s_free_blocks_go_to_no_other_allocation() {
        // Two 20 MiB segments, live before recording, each wholly free: one of a CUDA graph's
        // private pool at the lower address, one of the default pool above it. A 4 MiB request
        // outside capture takes the default pool's block, as PyTorch does: in one shared pool,
        // best fit (equal sizes, lowest address) would take the private one.
        use crate::trace::{Block, BlockState};
        let (private, default) = (0x1000_0000u64, 0x2000_0000u64);
        let seg = |address, private_pool, blocks: Vec<(u64, u64, BlockState)>| {
            segment_of_20_mib(address, private_pool, &blocks)
        };
        let dump = |recorded: u64| {
            let mut t = trace(&format!("alloc {recorded:#x} 4194304\n"));
            t.segments = vec![
                seg(private, Some((1, 0)), vec![(private, 20 << 20, BlockState::Inactive)]),
                seg(
                    default,
                    None,
                    vec![
                        (default, 4 << 20, BlockState::ActiveAllocated),
                        (default + (4 << 20), 16 << 20, BlockState::Inactive),
                    ],
                ),
            ];
            // The dump after the alloc: where it was recorded, 4 MiB live, the rest free.
            if recorded == private {
                t.segments[0].blocks = vec![
                    Block {
                        address: private,
                        size: 4 << 20,
                        requested_size: 0,
                        state: BlockState::ActiveAllocated,
                    },
                    Block {
                        address: private + (4 << 20),
                        size: 16 << 20,
                        requested_size: 0,
                        state: BlockState::Inactive,
                    },
                ];
                t.segments[1].blocks = vec![Block {
                    address: default,
                    size: 20 << 20,
                    requested_size: 0,
                    state: BlockState::Inactive,
                }];
            }
            t
        };
        let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
        let v = validate(&dump(default), &options).unwrap();
        assert_eq!((v.allocs_total, v.allocs_addr_matched), (1, 1), "{:?}", v.mismatches);
        assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
        let note = Warning::PrivatePools { segments: 1, bytes: 20 << 20, pools: 1, named: false };
        assert!(v.notes.contains(&note), "{:?}", v.notes);
        assert!(note.is_modelling_note(), "shown without --verbose");
        // The same segments, none of them private: best fit takes the lower one, and the
        // recorded placement no longer reproduces (what the private pool changes).
        let mut shared = dump(default);
        shared.segments[0].private_pool = None;
        let v = validate(&shared, &options).unwrap();
        assert_eq!(v.allocs_addr_matched, 0);
        // An allocation recorded inside the private pool (made during capture, which the trace
        // does not mark) is routed there by where it landed: it takes the private block, and
        // the default pool's free block stays as the dump shows it.
        let v = validate(&dump(private), &options).unwrap();
        assert_eq!((v.allocs_total, v.allocs_addr_matched), (1, 1), "{:?}", v.mismatches);
        assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    }

    #[test]
    fn a_malloc_into_a_private_pool_makes_its_new_segment_and_only_it_reuses_the_pool() {
        // A private pool's 20 MiB segment, allocated in the trace by a malloc made into the
        // pool, then freed back to it. A later 4 MiB malloc at the segment's address (still
        // in capture) reuses it; an ordinary 4 MiB malloc must not, so it needs a segment of
        // its own.
        use crate::trace::BlockState;
        let (private, other) = (0x1000_0000u64, 0x3000_0000u64);
        let text = format!(
            "segment_alloc {private:#x} 20971520\n\
             alloc {private:#x} 20971520\n\
             free {private:#x} 20971520\n\
             alloc {private:#x} 4194304\n\
             segment_alloc {other:#x} 20971520\n\
             alloc {other:#x} 4194304\n"
        );
        let mut t = trace(&text);
        let block = |address, size, state| (address, size, state);
        let seg = |address, private_pool, blocks: Vec<(u64, u64, BlockState)>| {
            segment_of_20_mib(address, private_pool, &blocks)
        };
        t.segments = vec![
            seg(
                private,
                Some((7, 1)),
                vec![
                    block(private, 4 << 20, BlockState::ActiveAllocated),
                    block(private + (4 << 20), 16 << 20, BlockState::Inactive),
                ],
            ),
            seg(
                other,
                None,
                vec![
                    block(other, 4 << 20, BlockState::ActiveAllocated),
                    block(other + (4 << 20), 16 << 20, BlockState::Inactive),
                ],
            ),
        ];
        let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
        let v = validate(&t, &options).unwrap();
        assert_eq!((v.allocs_total, v.allocs_addr_matched), (3, 3), "{:?}", v.mismatches);
        assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
        // Without the pool at the dump nothing says the first two mallocs were made into it:
        // the ordinary malloc then reuses the cached block and the recorded segment_alloc of
        // the other segment is not reproduced.
        t.segments[0].private_pool = None;
        let v = validate(&t, &options).unwrap();
        assert_eq!(v.allocs_addr_matched, 2, "{:?}", v.mismatches);
        assert!(!v.mismatches.is_empty());
    }

    #[test]
    fn nonsense_recordings_never_panic() {
        use crate::testing::Rng;
        use crate::trace::{Block, BlockState, PoolKind, Segment};
        for seed in 0..40 {
            let mut rng = Rng::new(seed);
            let mut pick = |choices: &[u64]| choices[rng.below(choices.len() as u64) as usize];
            let addrs = [0, 0x1000_0000, 0x1000_0200, 0x1050_0000, u64::MAX - 5, 1 << 60];
            let sizes = [0, 1, 512, 5 << 20, 20 << 20, u64::MAX / 2];
            let mut events = Vec::new();
            for _ in 0..60 {
                let action = Action::ALL[pick(&[0, 1, 2, 3, 4, 5, 6, 7, 8]) as usize];
                events.push(Event::new(action, pick(&addrs), pick(&sizes), pick(&[0, 7]), 0));
            }
            let segments = vec![Segment {
                device: 0,
                address: pick(&addrs),
                total_size: pick(&sizes),
                stream: 0,
                pool: PoolKind::Large,
                is_expandable: pick(&[0, 1]) == 1,
                private_pool: None,
                blocks: vec![Block {
                    address: pick(&addrs),
                    size: pick(&sizes),
                    requested_size: pick(&sizes),
                    state: BlockState::ActiveAllocated,
                }],
            }];
            let t = Trace {
                devices: vec![crate::trace::DeviceTrace { device: 0, events }],
                segments,
                ..Trace::default()
            };
            let _ = validate(&t, &ValidateOptions::default()); // Ok or Err, never a panic
        }
    }

    #[test]
    fn a_wrong_recording_is_reported() {
        // A real allocator would put the 3 MiB block right after the 5 MiB one, not 8 MiB in.
        let t = trace(
            "segment_alloc 0x10000000 20971520\nalloc 0x10000000 5242880\n\
             alloc 0x10800000 3145728\n",
        );
        let v = validate(&t, &ValidateOptions::default()).unwrap();
        assert_eq!(v.allocs_addr_matched, 1);
        assert_eq!(v.mismatches.len(), 1);
        assert_eq!(v.mismatches[0].event, 2);
        assert_eq!(v.mismatches[0].got, "0x10500000");
    }

    /// A device that logs segment events as PyTorch's trace would record them, with the stream
    /// of the segment (or reservation) they belong to.
    struct Logged {
        inner: crate::backend::SimDevice,
        log: Vec<Event>,
        stream: u64,
        streams: BTreeMap<u64, (u64, u64)>,
    }

    impl Logged {
        fn stream_of(&self, addr: u64) -> u64 {
            self.streams.range(..=addr).next_back().map_or(0, |(_, &(_, s))| s)
        }
    }

    impl Backend for Logged {
        fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
            let r = self.inner.segment_alloc(size)?;
            if let Some(a) = r {
                self.streams.insert(a, (size, self.stream));
                self.log.push(Event::new(Action::SegmentAlloc, a, size, self.stream, 0));
            }
            Ok(r)
        }
        fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
            let s = self.stream_of(addr);
            self.log.push(Event::new(Action::SegmentFree, addr, size, s, 0));
            self.inner.segment_free(addr, size)
        }
        fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
            let r = self.inner.reserve(size)?;
            if let Some(a) = r {
                self.streams.insert(a, (size, self.stream));
            }
            Ok(r)
        }
        fn release(&mut self, addr: u64, size: u64) -> Result<()> {
            self.inner.release(addr, size)
        }
        fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
            let ok = self.inner.map(addr, size)?;
            if ok {
                let s = self.stream_of(addr);
                self.log.push(Event::new(Action::SegmentMap, addr, size, s, 0));
            }
            Ok(ok)
        }
        fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
            let s = self.stream_of(addr);
            self.log.push(Event::new(Action::SegmentUnmap, addr, size, s, 0));
            self.inner.unmap(addr, size)
        }
        fn reserved(&self) -> u64 {
            self.inner.reserved()
        }
    }

    /// A snapshot as the real allocator would record it: the policy itself driven by a seeded
    /// workload (with flushes and, under a capacity, fallbacks and OOMs), its final segments and
    /// settings. Validation must reproduce it exactly, from the start or from any point.
    fn generate(conf: &str, seed: u64, capacity: Option<u64>) -> Trace {
        generate_on(conf, seed, capacity, Config::default().gpu_memory)
    }

    /// [`generate`] on a GPU of `gpu_memory` bytes (the base of a memory fraction).
    fn generate_on(conf: &str, seed: u64, capacity: Option<u64>, gpu_memory: u64) -> Trace {
        let mut config = Config::parse(conf, Version::CURRENT).unwrap();
        config.gpu_memory = gpu_memory;
        generate_with(config, conf, seed, capacity)
    }

    /// [`generate`] as torch_npu records it: its allocator's rules, and its frames.
    fn generate_npu(conf: &str, seed: u64, capacity: Option<u64>) -> Trace {
        let config = Config::parse_npu(conf).unwrap();
        Trace { torch_npu: true, ..generate_with(config, conf, seed, capacity) }
    }

    /// [`generate`] under `config`, whose settings string is `conf`.
    fn generate_with(config: Config, conf: &str, seed: u64, capacity: Option<u64>) -> Trace {
        use crate::testing::{workload, Step};
        let mut p = PyTorch::new(config.clone());
        let mut dev = Logged {
            inner: crate::backend::SimDevice::new(capacity),
            log: Vec::new(),
            stream: 0,
            streams: BTreeMap::new(),
        };
        let mut events = Vec::new();
        let mut live = std::collections::HashMap::new();
        for step in workload(seed, 3000) {
            match step {
                Step::Alloc { id, size, stream } => {
                    dev.stream = stream;
                    let r = p.malloc(&mut dev, size, stream).unwrap();
                    events.append(&mut dev.log);
                    match r {
                        Some(a) => {
                            events.push(Event::new(Action::Alloc, a.addr, size, stream, 0));
                            live.insert(id, (a.addr, size, stream));
                        }
                        None => {
                            let rounded = config.round_size(size);
                            events.push(Event::new(Action::Oom, 0, rounded, stream, 0));
                        }
                    }
                }
                Step::Free { id } => {
                    if let Some((a, size, stream)) = live.remove(&id) {
                        events.push(Event::new(Action::FreeRequested, a, size, stream, 0));
                        events.push(Event::new(Action::FreeCompleted, a, size, stream, 0));
                        p.free(&mut dev, a).unwrap();
                    }
                }
                Step::EmptyCache => {
                    p.empty_cache(&mut dev).unwrap();
                    events.append(&mut dev.log);
                }
            }
        }
        for (i, e) in events.iter_mut().enumerate() {
            e.time_us = i as i64;
        }
        Trace {
            format: crate::trace::Format::PytorchSnapshot,
            converted_from: None,
            devices: vec![crate::trace::DeviceTrace { device: 0, events }],
            segments: p.segments(),
            allocator_settings: Some(crate::trace::AllocatorSettings {
                conf: Some(conf.to_string()),
                max_split_size: (config.max_split_size != u64::MAX)
                    .then_some(config.max_split_size),
                garbage_collection_threshold: config.garbage_collection_threshold,
                expandable_segments: config.expandable_segments,
                roundup_power2_divisions: config.roundup_power2_divisions,
                release_lock_on_cudamalloc: false,
            }),
            has_times: false,
            frames: Default::default(),
            recorded_totals: Vec::new(),
            entry_pools: None,
            torch_npu: false,
            extras: Default::default(),
        }
    }

    fn assert_exact(t: &Trace, what: &str) -> Validation {
        let options = ValidateOptions { check_invariants: true, ..ValidateOptions::default() };
        let v = validate(t, &options).unwrap();
        assert!(
            v.mismatches.is_empty(),
            "{what}: {:?}",
            &v.mismatches[..v.mismatches.len().min(3)]
        );
        assert_eq!(v.allocs_addr_matched + v.undeterminable_events, v.allocs_total, "{what}");
        assert_eq!(v.segment_events_matched, v.segment_events_recorded, "{what}");
        v
    }

    #[test]
    fn self_generated_snapshots_exercise_ooms_flushes_fallbacks_and_maps() {
        let count =
            |t: &Trace, a: Action| t.devices[0].events.iter().filter(|e| e.action == a).count();
        let t = generate("", 3, Some(96 << 20));
        let ops = plan_of(&t);
        assert!(count(&t, Action::Oom) > 0);
        assert!(ops.iter().any(|o| matches!(o, Op::Flush { script } if !script.is_empty())));
        assert!(ops.iter().any(|o| matches!(o, Op::Malloc { script, .. }
            if script.first().is_some_and(|&j| t.devices[0].events[j].action == Action::SegmentFree))));
        let t = generate("expandable_segments:True", 3, Some(96 << 20));
        assert!(count(&t, Action::SegmentMap) > 0 && count(&t, Action::SegmentUnmap) > 0);
    }

    #[test]
    fn a_replay_asks_about_every_release_run_that_validate_asks_about() {
        // With garbage collection on, the levels prove nothing of a release run before a
        // malloc's new segment: a replay asks the model about it, as `validate` does (a replay
        // once left such runs to no one and never made those `empty_cache()` calls).
        let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
        let t = generate_on(conf, 21, None, 256 << 20);
        let e = &t.devices[0].events;
        let input = ReplayInput::of_events(&t, t.devices[0].device, e).unwrap();
        let asked: Vec<u64> = input.undecided_flushes().iter().map(|r| r.request).collect();
        let released =
            |script: &[usize]| script.first().is_some_and(|&j| e[j].action == Action::SegmentFree);
        let runs: Vec<u64> = (plan_of(&t).iter().enumerate())
            .filter(|(_, o)| matches!(o, Op::Malloc { script, .. } if released(script)))
            .map(|(i, _)| i as u64)
            .collect();
        assert!(!runs.is_empty());
        assert_eq!(asked, runs);
    }

    #[test]
    fn garbage_collection_validates_with_the_gpu_memory_given() {
        // A 256 MiB GPU at fraction 0.5: 128 MiB allowed, GC above 0.6 of that.
        let conf = "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5";
        for seed in 20..24 {
            let t = generate_on(conf, seed, None, 256 << 20);
            let options = ValidateOptions {
                gpu_memory: Some(256 << 20),
                check_invariants: true,
                ..ValidateOptions::default()
            };
            let v = validate(&t, &options).unwrap();
            assert!(v.mismatches.is_empty(), "seed {seed}: {:?}", v.mismatches.first());
            assert_eq!(v.allocs_addr_matched, v.allocs_total);
            let e = &t.devices[0].events;
            let ops = plan_of(&t);
            let released_in_malloc = ops.iter().any(|o| {
                matches!(o, Op::Malloc { script, .. }
                if script.iter().any(|&j| e[j].action == Action::SegmentFree))
            });
            assert!(released_in_malloc, "seed {seed}: GC never released anything");
        }
    }

    #[test]
    fn self_generated_snapshots_validate_exactly_from_the_start() {
        for conf in
            ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"]
        {
            for (seed, capacity) in [(1, None), (2, Some(160 << 20)), (3, Some(96 << 20))] {
                let t = generate(conf, seed, capacity);
                let v = assert_exact(&t, &format!("{conf} seed {seed}"));
                assert_eq!(v.undeterminable_events, 0, "a cold start has nothing to guess");
                assert!(v.segment_events_recorded > 0);
                assert_eq!(v.peak_reserved_simulated_bytes, v.peak_reserved_recorded_bytes);
            }
        }
    }

    /// Drops device 0's events before its first alloc after the first third that does not follow
    /// a segment event, as a ring buffer would; returns the index of the cut.
    fn cut_after_first_third(t: &mut Trace) -> usize {
        let events = &t.devices[0].events;
        let cut = (events.len() / 3..events.len())
            .find(|&i| {
                events[i].action == Action::Alloc && !events[i - 1].action.is_segment_event()
            })
            .unwrap();
        t.devices[0].events.drain(..cut);
        cut
    }

    #[test]
    fn self_generated_snapshots_validate_from_the_middle() {
        // Cut the recording at an alloc after the first third: the start state must be recovered
        // from the final segments (orphans, segments freed later), as with a ring buffer.
        for conf in
            ["", "max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True"]
        {
            for seed in 4..16 {
                let mut t = generate(conf, seed, Some(200 << 20));
                let cut = cut_after_first_third(&mut t);
                assert_exact(&t, &format!("{conf} seed {seed} from event {cut}"));
            }
        }
    }

    #[test]
    fn torch_npu_self_recordings_validate_exactly() {
        // With and without expandable segments, under memory pressure (fallbacks and OOMs),
        // with the workload's empty_cache calls; the base-address alignment only acts with
        // expandable segments, and once with it turned off.
        for conf in [
            "",
            "max_split_size_mb:64",
            "roundup_power2_divisions:4",
            "expandable_segments:True",
            "expandable_segments:True,base_addr_aligned_kb:0",
            "expandable_segments:True,segment_size_mb:64",
        ] {
            for (seed, capacity) in [(1, None), (2, Some(160 << 20)), (3, Some(96 << 20))] {
                let t = generate_npu(conf, seed, capacity);
                let v = assert_exact(&t, &format!("npu {conf} seed {seed}"));
                assert_eq!(v.undeterminable_events, 0, "a cold start has nothing to guess");
                assert_eq!(v.peak_reserved_simulated_bytes, v.peak_reserved_recorded_bytes);
                assert!(v.notes.iter().any(|n| matches!(
                    n,
                    Warning::AllocatorRules { flavour: Flavour::Npu, recorded_by: Flavour::Npu }
                )));
            }
        }
    }

    #[test]
    fn torch_npu_self_recordings_validate_from_the_middle() {
        for conf in ["", "expandable_segments:True"] {
            for seed in 4..10 {
                let mut t = generate_npu(conf, seed, Some(200 << 20));
                let cut = cut_after_first_third(&mut t);
                assert_exact(&t, &format!("npu {conf} seed {seed} from event {cut}"));
            }
        }
    }

    #[test]
    fn a_raised_cancel_flag_stops_validation() {
        let t = generate("", 1, None);
        let cancel = Cancel::new();
        let options = ValidateOptions { cancel: cancel.clone(), ..ValidateOptions::default() };
        assert!(validate(&t, &options).is_ok(), "an unraised flag changes nothing");
        cancel.cancel();
        let e = validate(&t, &options).unwrap_err();
        let events = t.devices[0].events.len();
        assert!(e.is_interrupted());
        assert_eq!(
            e.message(),
            format!("interrupted (Ctrl-C) while validating at event 0 of {events}")
        );
    }

    #[test]
    fn torch_npu_recordings_differ_from_cuda_rules() {
        // The 32 bytes of padding move addresses: CUDA's rules cannot reproduce the recording,
        // and asking for them says so.
        let t = generate_npu("", 1, None);
        let options =
            ValidateOptions { flavour: Some(Flavour::Cuda), ..ValidateOptions::default() };
        let v = validate(&t, &options).unwrap();
        assert!(!v.mismatches.is_empty());
        assert!(v.notes.iter().any(|n| n.to_string().contains("CUDA's allocator rules as asked")));
        // A CUDA recording replayed with CUDA's rules carries no note about torch_npu.
        let v = validate(&generate("", 1, None), &ValidateOptions::default()).unwrap();
        assert!(!v.notes.iter().any(|n| matches!(n, Warning::AllocatorRules { .. })));
    }

    #[test]
    fn warnings_read_as_the_notes_always_did() {
        let shown = |w: Warning| w.to_string();
        assert_eq!(
            shown(Warning::NoAllocatorSettings),
            "the snapshot has no allocator_settings: PyTorch's defaults"
        );
        assert_eq!(
            shown(Warning::AssumedGpuMemory { gpu_memory_bytes: 80 << 30 }),
            "expandable segments: reservations assumed 9/8 of 80.00 GiB of GPU memory (--gpu-mem)"
        );
        assert_eq!(
            shown(Warning::LearnedOrphanSize { addr: 0x200, size: 1024, event: 7 }),
            "the block at 0x200, live before recording, is at least 1024 bytes: event 7 shows it"
        );
        assert_eq!(
            shown(Warning::UnplacedOrphanFree { addr: 0x400 }),
            "the orphan free at 0x400 lies in no segment known at the start"
        );
        // A recording that shows no later release: 2.11, said as a default, not as a fact.
        let plain = ModelledVersion::of_trace(&Trace::default());
        assert_eq!(
            shown(Warning::ModelledVersion { modelled: plain }),
            "modelled PyTorch 2.11: nothing in the recording shows a later release (absence \
             proves nothing; --pytorch-version X.Y models another)"
        );
        let mut newest = Trace::default();
        newest.extras.internal_metadata = 1;
        let modelled = ModelledVersion::of_trace(&newest);
        assert_eq!(
            shown(Warning::ModelledVersion { modelled }),
            "modelled PyTorch 2.15 (trace entries carry internal_metadata)"
        );
    }
}
