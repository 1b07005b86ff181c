//! What validation assumed or could not place ([`Warning`]), and the sentences
//! `validate --verbose` prints for them.

use crate::policy::pytorch::config::{Flavour, ModelledVersion};
use crate::trace::{Action, Event, Segment, Trace};
use std::collections::BTreeSet;

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
    /// PyTorch's): they were left out of the replay (`Config::unmodelled_options`).
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
    /// (`Config::expandable_in_private_pools`), whatever the version modelled.
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
    /// segments (`start::shows_expandable`).
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

/// The notes on the recording's private pools: the segments the dump shows in them, and the
/// requests whose entries name their pool.
pub(super) fn pool_notes(trace: &Trace, device: i32, events: &[Event], notes: &mut Vec<Warning>) {
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
}
