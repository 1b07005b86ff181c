//! Allocator policies: the systems fragsim compares, all behind one small trait.
//!
//! A [`Policy`] sees the calls an allocator sees — malloc, free, `empty_cache` — and gets its
//! memory from a [`Backend`], never knowing whether that memory is simulated or real. Each policy
//! lives in its own file, which opens by naming the system it models, its upstream source, its
//! options and every deviation.
//!
//! The static [`POLICIES`] table drives `--policy`, `all`, the help text and error messages;
//! [`run`] builds the concrete policy once and instantiates the generic replay engine for it, so
//! dispatch happens once per run, not once per event.

pub mod bfc;
pub mod bound;
pub mod buddy;
pub mod chunks;
pub mod nocache;
pub mod offline;
pub mod pytorch;
pub mod rmm_pool;
pub mod spec;
pub mod stitch;

pub use spec::PolicySpec;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::replay::{self, ReplayInput, ReplayOptions, ReplayOutput};
use crate::trace::{Event, Segment};

/// What a successful malloc hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The block's address; the engine frees it by this address.
    pub addr: u64,
    /// The block's size after the policy's rounding (≥ the request).
    pub block_size: u64,
}

/// An allocator policy. Implementations must be deterministic: the same calls give the same
/// addresses. See the module docs.
pub trait Policy {
    /// The exact configuration, in the policy's own option syntax (shown in results).
    fn config(&self) -> String;

    /// Called once before the replay with every event it will see. Online policies ignore it;
    /// the clairvoyant `offline` policy plans with it.
    fn prepare(&mut self, _events: &[Event]) -> Result<()> {
        Ok(())
    }

    /// Serves a request of `size` bytes (> 0) on `stream`. `Ok(None)` means out of memory after
    /// every fallback the real allocator would try; the request then never existed.
    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>>;

    /// Returns the block at `addr` (from [`Policy::malloc`]) to the policy.
    fn free<B: Backend>(&mut self, backend: &mut B, addr: u64) -> Result<()>;

    /// Releases every cached segment the policy can (`torch.cuda.empty_cache()`).
    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()>;

    /// Bytes of live blocks, after rounding (PyTorch's `allocated_bytes`).
    fn allocated(&self) -> u64;

    /// How often a malloc needed a full flush and retry (PyTorch's `num_alloc_retries`).
    fn alloc_retries(&self) -> u64 {
        0
    }

    /// The policy's memory as segments of blocks, for `--export-snapshot` and the segment map.
    fn segments(&self) -> Vec<Segment> {
        Vec::new()
    }

    /// Checks internal invariants (blocks inside segments, no overlap, counters); run after every
    /// event in tests. Returns a description of the first broken one.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// A built-in policy: its name, what it models and how to run it.
pub struct PolicyInfo {
    /// The name used in `--policy NAME[:OPTIONS]`.
    pub name: &'static str,
    /// One line for help and tables.
    pub summary: &'static str,
    /// The options it accepts, for error messages and help.
    pub options: &'static str,
    run: fn(&PolicySpec, &ReplayInput, &ReplayOptions) -> Result<ReplayOutput>,
}

impl PolicyInfo {
    /// Replays `input` with this policy built from `spec`'s options.
    pub fn run(
        &self,
        spec: &PolicySpec,
        input: &ReplayInput,
        options: &ReplayOptions,
    ) -> Result<ReplayOutput> {
        (self.run)(spec, input, options)
    }
}

/// Builds the policy from its options and runs the generic engine on it.
fn run_with<P: Policy>(
    policy: Result<P>,
    spec: &PolicySpec,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    let policy =
        policy.map_err(|e| Error::usage(format!("policy '{}': {}", spec.name, e.message())))?;
    replay::run_policy(&spec.name, policy, input, options)
}

/// Every built-in policy, in the order `all` runs them.
pub static POLICIES: &[PolicyInfo] = &[
    PolicyInfo {
        name: "pytorch",
        summary: "PyTorch's CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF options; default: recorded settings)",
        options: "PYTORCH_CUDA_ALLOC_CONF syntax, e.g. max_split_size_mb:128,roundup_power2_divisions:4; or 'recorded'",
        run: |spec, input, opts| {
            let policy = pytorch::PyTorch::from_spec(&spec.options, input).map(|p| p.on_gpu(opts.capacity));
            run_with(policy, spec, input, opts)
        },
    },
    PolicyInfo {
        name: "pytorch-expandable",
        summary: "PyTorch's caching allocator with expandable_segments:True",
        options: "PYTORCH_CUDA_ALLOC_CONF syntax (expandable_segments is forced on)",
        run: |spec, input, opts| {
            let policy =
                pytorch::PyTorch::expandable_from_spec(&spec.options, input).map(|p| p.on_gpu(opts.capacity));
            run_with(policy, spec, input, opts)
        },
    },
    PolicyInfo {
        name: "buddy",
        summary: "binary buddy allocator over power-of-two arenas",
        options: buddy::OPTIONS,
        run: |spec, input, opts| run_with(buddy::Buddy::from_options(&spec.options), spec, input, opts),
    },
    PolicyInfo {
        name: "bfc",
        summary: "TensorFlow/XLA best-fit with coalescing (bfc_allocator.cc)",
        options: bfc::OPTIONS,
        run: |spec, input, opts| run_with(bfc::Bfc::from_options(&spec.options), spec, input, opts),
    },
    PolicyInfo {
        name: "rmm-pool",
        summary: "RAPIDS RMM pool_memory_resource (coalescing best fit per stream)",
        options: rmm_pool::OPTIONS,
        run: |spec, input, opts| run_with(rmm_pool::RmmPool::from_options(&spec.options), spec, input, opts),
    },
    PolicyInfo {
        name: "nocache",
        summary: "no caching: one cudaMalloc per request (PYTORCH_NO_CUDA_MEMORY_CACHING=1)",
        options: nocache::OPTIONS,
        run: |spec, input, opts| run_with(nocache::NoCache::from_options(&spec.options), spec, input, opts),
    },
    PolicyInfo {
        name: "stitch",
        summary: "GMLake-style virtual-memory stitching of free 2 MiB granules",
        options: stitch::OPTIONS,
        run: |spec, input, opts| run_with(stitch::Stitch::from_options(&spec.options), spec, input, opts),
    },
    PolicyInfo {
        name: "offline",
        summary: "clairvoyant packing that knows every lifetime in advance",
        options: offline::OPTIONS,
        run: |spec, input, opts| run_with(offline::Offline::from_input(&spec.options, input), spec, input, opts),
    },
    PolicyInfo {
        name: "bound",
        summary: "the peak of live requested bytes: no allocator can reserve less",
        options: bound::OPTIONS,
        run: |spec, input, opts| run_with(bound::Bound::from_options(&spec.options), spec, input, opts),
    },
];

/// The built-in policy called `name`.
pub fn lookup(name: &str) -> Result<&'static PolicyInfo> {
    POLICIES.iter().find(|p| p.name == name).ok_or_else(|| {
        Error::usage(format!(
            "unknown policy '{name}' (accepted: {}, all)",
            POLICIES.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// Parses `key=value,key=value` options, calling `set(key, value)` for each; shared by every
/// policy except `pytorch`, whose options follow `PYTORCH_CUDA_ALLOC_CONF`.
pub fn parse_key_values(
    options: &str,
    mut set: impl FnMut(&str, &str) -> Result<()>,
) -> Result<()> {
    for item in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| Error::usage(format!("option '{item}' is not of the form key=value")))?;
        set(key.trim(), value.trim())?;
    }
    Ok(())
}
