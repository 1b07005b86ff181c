//! Allocator policies: the systems fragsim compares, all behind one small trait.
//!
//! A [`Policy`] sees the calls an allocator sees — malloc, free, `empty_cache` — and gets its
//! memory from a [`Backend`], never knowing whether that memory is simulated or real. Each policy
//! lives in its own file, which opens by naming the system it models, its upstream source, its
//! options and every deviation.
//!
//! The static [`POLICIES`] table, one registration line per policy, drives `--policy`, `all`,
//! the help text, error messages, tests and benches. A policy's file exports its
//! [`Registration`] (name, summary, options, constructor); the table turns each into a
//! [`PolicyInfo`] and a variant of [`BuiltPolicy`]. Data flows one way: the replay engine asks a
//! [`PolicyInfo`] to build its policy from a [`PolicyContext`] (what the engine hands a policy)
//! and then runs the concrete type through `BuiltPolicy::run_with`, so dispatch happens once
//! per run, not once per event, and this module never names the engine.

pub mod bfc;
pub mod bound;
pub mod buddy;
pub mod chunks;
mod free_set;
pub mod nocache;
pub mod offline;
pub mod options;
pub mod pytorch;
pub mod rmm_pool;
pub mod spec;
pub mod stitch;

pub use spec::PolicySpec;

use crate::backend::{Backend, StartFit};
use crate::error::{Cancel, Error, Result};
use crate::trace::lifetimes::Lifetimes;
use crate::trace::{AllocatorSettings, Event, LiveBlock, Segment, Trace};

/// What a successful malloc hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The block's address; the engine frees it by this address.
    pub addr: u64,
    /// The block's size after the policy's rounding (≥ the request).
    pub block_size: u64,
    /// The policy's own name for the block, which the engine hands back with the free
    /// ([`Policy::free_handle`]); [`Handle::NONE`] from a policy that finds blocks by address.
    pub handle: Handle,
}

impl Allocation {
    /// A block found again by its address alone (no [`Handle`]).
    pub fn new(addr: u64, block_size: u64) -> Allocation {
        Allocation { addr, block_size, handle: Handle::NONE }
    }
}

/// A policy's name for one of its blocks, given with the block by [`Policy::malloc`] and taken
/// back by [`Policy::free_handle`].
///
/// Why: every free must find its block, and a search by address (a hash table insert at every
/// malloc and a removal at every free) costs a tenth of the `pytorch` replay's instructions. The
/// engine already keeps each live block's address, so it keeps the handle beside it, and a
/// policy with an arena of blocks makes the handle the block's index: a free is then one
/// lookup and one check. A handle says which block, never more: the address stays the block's
/// identity, and a policy must check that the handle names the block at that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(u32);

impl Handle {
    /// No handle: the block is found by its address.
    pub const NONE: Handle = Handle(u32::MAX);

    /// Handle `index`; `u32::MAX` is [`Handle::NONE`].
    #[inline]
    pub(crate) fn new(index: u32) -> Handle {
        Handle(index)
    }

    /// The index, unless this is [`Handle::NONE`].
    #[inline]
    pub(crate) fn index(self) -> Option<u32> {
        (self != Handle::NONE).then_some(self.0)
    }
}

/// An allocator policy. Implementations must be deterministic: the same calls give the same
/// addresses. See the module docs.
pub trait Policy {
    /// The exact configuration, in the policy's own option syntax (shown in results).
    fn config(&self) -> String;

    /// The allocator settings a run of this policy had, as a PyTorch snapshot records them
    /// (`allocator_settings`), from the configuration its result shows ([`Policy::config`]):
    /// what a snapshot written of the run says. `None` (the default) for a policy that has no
    /// such settings.
    fn recorded_settings(shown_config: &str) -> Option<AllocatorSettings>
    where
        Self: Sized,
    {
        let _ = shown_config;
        None
    }

    /// Whether its configuration is an allocator's settings, as `PYTORCH_CUDA_ALLOC_CONF` holds
    /// them ([`Policy::recorded_settings`] reads them); false (the default) for other policies.
    fn has_allocator_settings() -> bool
    where
        Self: Sized,
    {
        false
    }

    /// Called once before the replay with every event it will see. Online policies ignore it;
    /// the clairvoyant `offline` policy plans with it.
    fn prepare(&mut self, _events: &[Event]) -> Result<()> {
        Ok(())
    }

    /// Called once before the first event with the blocks live at the start (in the engine's
    /// order): a policy that knows how the recorded allocator held them (the `pytorch` policy
    /// on a snapshot: its segments at the first event, cached free blocks included) installs that
    /// state through `backend` and returns where each block now lives. `None` for a block (the
    /// default for all) asks the engine to malloc it, as every other policy's start is built.
    fn start<B: Backend>(
        &mut self,
        _backend: &mut B,
        live_at_start: &[LiveBlock],
    ) -> Result<Vec<Option<Allocation>>> {
        Ok(vec![None; live_at_start.len()])
    }

    /// Serves a request of `size` bytes (> 0) on `stream`. `Ok(None)` means out of memory after
    /// every fallback the real allocator would try; the request then never existed.
    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        stream: u64,
    ) -> Result<Option<Allocation>>;

    /// Says whether a CUDA graph capture is underway while the next mallocs are served (the
    /// replay tells it from a recorded `oom` that no release preceded though the recorded cache
    /// held memory to release, `trace::captures`): a policy modelling PyTorch then skips its
    /// release-everything fallback. Ignored by default.
    fn set_capture_underway(&mut self, _underway: bool) {}

    /// Asks that the next malloc place its block at `addr`: one part of an exact-address
    /// allocation the recording shows (`mallocWithAddress`, PyTorch 2.13+:
    /// `UntypedStorage._resize_with_addr_`), which no placement rule chooses. A policy that
    /// models it (`pytorch`) places the block there when a free block it may use holds the
    /// address and the request, and serves the request as any other otherwise; every other
    /// policy ignores it (the default).
    fn place_next_at(&mut self, _addr: u64) {}

    /// Says which private pool (a CUDA graph's or a `torch.cuda.MemPool`'s `segment_pool_id`)
    /// the recorded allocator made the next mallocs into, or `None` for the default pools. The
    /// replay tells it from where each allocation was recorded
    /// ([`PoolRoutes`](crate::trace::pool_routes::PoolRoutes)), before every malloc on a trace
    /// whose dump shows private pools. A policy with no private pools ignores it (the default).
    fn allocate_into(&mut self, _pool: Option<(u64, u64)>) -> Result<()> {
        Ok(())
    }

    /// Says that private pool `pool` is gone (its CUDA graph or `torch.cuda.MemPool` was
    /// deleted): from now on every flush releases its free segments too, as PyTorch's
    /// `release_cached_blocks` does for a pool whose use count reached 0. The replay tells it
    /// from a recorded segment release whose entry names that pool. A policy with no private
    /// pools ignores it (the default).
    fn release_pool(&mut self, _pool: (u64, u64)) -> Result<()> {
        Ok(())
    }

    /// Returns the block at `addr` (from [`Policy::malloc`]) to the policy.
    fn free<B: Backend>(&mut self, backend: &mut B, addr: u64) -> Result<()>;

    /// Returns the block at `addr` that malloc (or [`Policy::start`]) handed out with `handle`:
    /// what the engine calls. The default ignores the handle and frees by address; a policy
    /// whose blocks carry handles finds the block from it (see [`Handle`]).
    fn free_handle<B: Backend>(
        &mut self,
        backend: &mut B,
        addr: u64,
        handle: Handle,
    ) -> Result<()> {
        let _ = handle;
        self.free(backend, addr)
    }

    /// Whether a request of `size` bytes on `stream` would be served from the policy's cache
    /// now, without new memory from the device. The replay asks where a recording cannot tell
    /// the program's `empty_cache()` from the recorded allocator's out-of-memory fallback (a run
    /// of releases, then an allocation needing new memory): only a request the cache could not
    /// serve falls back, so a policy that models the recorded allocator answers for it. `None`
    /// (the default): the policy does not, and the replay leaves the run alone.
    fn would_serve_from_cache(&self, _size: u64, _stream: u64) -> Option<bool> {
        None
    }

    /// Releases every cached segment the policy can (`torch.cuda.empty_cache()`).
    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()>;

    /// Bytes of live blocks, after rounding (PyTorch's `allocated_bytes`). A free never raises
    /// it, so the engine takes its peak after the other events only (a replay that checks
    /// invariants checks that too).
    fn allocated(&self) -> u64;

    /// How often a malloc needed a full flush and retry (PyTorch's `num_alloc_retries`).
    fn alloc_retries(&self) -> u64 {
        0
    }

    /// After [`Policy::start`], how much of a recorded start state fit under the limits, when
    /// not all of it did; `None` when the whole state was installed or the policy has none.
    fn start_fit(&self) -> Option<StartFit> {
        None
    }

    /// The start state the policy assumed where the recording shows only a total (a warm
    /// profiler trace's memory reserved before its first event); `None` (the default) where it
    /// assumed none.
    fn assumed_start(&self) -> Option<crate::backend::AssumedStart> {
        None
    }

    /// The GPU memory the policy's limit is a share of (`pytorch` with a
    /// `per_process_memory_fraction`), reported so that a what-if says which card it assumed;
    /// `None` when no limit depends on it.
    fn assumed_gpu_memory(&self) -> Option<u64> {
        None
    }

    /// Wall-clock seconds [`Policy::prepare`] spent planning, for a policy that plans before the
    /// first event (`offline`); `None` for an online policy. Reported on its own because a
    /// planner's cost is its planning, which no online allocator pays (it is part of the
    /// replay's time as well).
    fn planning_seconds(&self) -> Option<f64> {
        None
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

    /// Hands the policy to `runner`, which replays it: the one place a run picks the concrete
    /// type. A policy may hand over another type that makes the same decisions faster for its
    /// configuration (`pytorch`, with its default configuration's decisions made at compile
    /// time); by default it hands itself.
    fn run_by<R: PolicyRunner>(self, name: &str, runner: R) -> R::Output
    where
        Self: Sized,
    {
        runner.run(name, self)
    }
}

/// What the engine hands a policy's constructor: the device's events and what the trace knows
/// about them. Most policies need only their options; `pytorch` reads the recorded settings and
/// the capacity, `offline` the blocks live at the start.
#[derive(Clone, Copy, Debug)]
pub struct PolicyContext<'a> {
    /// The whole trace (its segments and recorded settings).
    pub trace: &'a Trace,
    /// The device replayed.
    pub device: i32,
    /// That device's events; when the replay streams them from a file, only the few that
    /// decide the state at the first event (the `digest`:
    /// orphan frees, first allocs of blocks live at the end, first segment events), from which
    /// the same start state is recovered. A policy that needs every event plans in
    /// [`Policy::prepare`] instead.
    pub events: &'a [Event],
    /// Blocks live before the first event, in address order (the engine allocates them first).
    pub live_at_start: &'a [LiveBlock],
    /// The lifetime `scan` of `events`, done once by the
    /// engine (it finds `live_at_start` from it) so that a policy recovering a start state does
    /// not scan every event again. Its `allocated` set is kept only where the trace has final
    /// segments for the device (the only case a start state is recovered from); elsewhere it is
    /// empty.
    pub lifetimes: &'a Lifetimes,
    /// Device capacity (`--capacity`); `None` is unlimited.
    pub capacity: Option<u64>,
    /// The GPU's total memory (`totalGlobalMem`) when the replay knows it: the capacity, where it
    /// names a card or the device memory a recording's `oom` entries measured (not where it is
    /// only the level a recorded allocator stopped at); `None`: the policy models it.
    pub gpu_memory: Option<u64>,
    /// The recording's peak reserved bytes, where a policy modelling the recorded allocator
    /// needs them (a snapshot that records a memory fraction, whose limit let that peak through).
    pub recorded_peak_reserved: Option<u64>,
    /// The replay's cancel flag (its options' `cancel`): a policy that plans in
    /// [`Policy::prepare`] looks at it while planning.
    pub cancel: &'a Cancel,
    /// The run is `--export-snapshot`'s ([`crate::replay::ReplayOptions::record_events`]): it
    /// starts cold and is written as a snapshot that `validate` replays from its own events, so
    /// a policy follows only rules such a snapshot shows (a profiler trace's sizes are requests
    /// there, not recorded blocks to split a larger one down to, and no warm cache is assumed).
    pub exported: bool,
}

/// What a policy stands for when results are compared: a real allocator, or one of the two
/// reference lines that bracket them. Tests and reports derive their subsets from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An allocator that serves each call as it comes, knowing nothing of later calls.
    Online,
    /// An online allocator that models the one the recording was made with, and replays it
    /// under the recorded settings unless options change them (`pytorch`): with no options, the
    /// run reports draw as "the recorded settings".
    Recorded,
    /// A reference that plans with every lifetime in advance (`offline`): a target, not an
    /// allocator.
    Clairvoyant,
    /// The floor no allocator can reserve less than (`bound`).
    Floor,
}

/// How a policy's file registers it: what [`POLICIES`] needs to list, document and build it.
pub struct Registration<P> {
    /// The name used in `--policy NAME[:OPTIONS]`.
    pub(crate) name: &'static str,
    /// One line for help and tables.
    pub(crate) summary: &'static str,
    /// Whether it is an allocator or a reference line.
    pub(crate) role: Role,
    /// The options it accepts, for help and error messages (usually `options::help` of the
    /// policy's key table).
    pub(crate) options: fn() -> String,
    /// Builds the policy from its option string and the engine's context.
    pub(crate) build: fn(&str, &PolicyContext) -> Result<P>,
}

/// What runs a built policy: the replay engine implements it, so that the engine is
/// instantiated for each concrete policy type without this module naming it.
pub trait PolicyRunner {
    /// What a run produces.
    type Output;
    /// Runs `policy`, registered as `name`.
    fn run<P: Policy>(self, name: &str, policy: P) -> Self::Output;
}

/// A built-in policy: its name, what it models and how to build it.
pub struct PolicyInfo {
    /// The name used in `--policy NAME[:OPTIONS]`.
    pub name: &'static str,
    /// One line for help and tables.
    pub summary: &'static str,
    /// Whether it is an allocator or a reference line.
    pub role: Role,
    options: fn() -> String,
    build: fn(&str, &PolicyContext) -> Result<BuiltPolicy>,
    recorded_settings: fn(&str) -> Option<AllocatorSettings>,
    has_allocator_settings: fn() -> bool,
}

impl PolicyInfo {
    /// The allocator settings a run of it had, from the configuration its result shows
    /// ([`Policy::recorded_settings`]).
    pub fn recorded_settings(&self, shown_config: &str) -> Option<AllocatorSettings> {
        (self.recorded_settings)(shown_config)
    }

    /// Whether its configuration is an allocator's settings ([`Policy::has_allocator_settings`]).
    pub fn has_allocator_settings(&self) -> bool {
        (self.has_allocator_settings)()
    }

    /// The options it accepts, for error messages and help.
    pub fn options(&self) -> String {
        (self.options)()
    }

    /// Builds the policy from `spec`'s options; errors name the policy, and one about the
    /// trace (a recorded setting the policy rejects) stays an input error and also names the
    /// trace's format, so the command can name its file: a policy `all` adds is skipped when it
    /// cannot run on the trace (a usage error), never when the trace itself is bad.
    pub fn build(&self, spec: &PolicySpec, context: &PolicyContext) -> Result<BuiltPolicy> {
        (self.build)(&spec.options, context).map_err(|e| {
            let message = format!("policy '{}': {}", spec.name, e.message());
            match (e.kind(), e.location().place) {
                (crate::error::ErrorKind::Input, place) => {
                    let err = Error::input(message).in_format(context.trace.format.name());
                    match place {
                        Some(p) => err.at(p),
                        None => err,
                    }
                }
                _ => Error::usage(message),
            }
        })
    }
}

/// Declares the table: one line per policy gives a [`BuiltPolicy`] variant and a [`PolicyInfo`].
macro_rules! registry {
    ($($variant:ident: $ty:ty = $reg:expr;)*) => {
        /// A built-in policy, built: one variant per registration, holding the concrete type.
        pub enum BuiltPolicy {
            $(
                #[doc = concat!("Built from `", stringify!($reg), "`.")]
                $variant($ty),
            )*
        }

        impl BuiltPolicy {
            /// Hands the concrete policy to `runner`: the one dispatch of a run.
            pub(crate) fn run_with<R: PolicyRunner>(self, name: &str, runner: R) -> R::Output {
                match self {
                    $(BuiltPolicy::$variant(p) => p.run_by(name, runner),)*
                }
            }
        }

        /// Every built-in policy, in the order `all` runs them.
        pub static POLICIES: &[PolicyInfo] = &[$(
            PolicyInfo {
                name: $reg.name,
                summary: $reg.summary,
                role: $reg.role,
                options: $reg.options,
                build: |options, context| ($reg.build)(options, context).map(BuiltPolicy::$variant),
                recorded_settings: <$ty as Policy>::recorded_settings,
                has_allocator_settings: <$ty as Policy>::has_allocator_settings,
            },
        )*];
    };
}

registry! {
    PyTorch: pytorch::PyTorch = pytorch::POLICY;
    PyTorchExpandable: pytorch::PyTorch = pytorch::EXPANDABLE;
    PyTorchNpu: pytorch::PyTorch = pytorch::NPU;
    PyTorchCuda: pytorch::PyTorch = pytorch::CUDA;
    Buddy: buddy::Buddy = buddy::POLICY;
    Bfc: bfc::Bfc = bfc::POLICY;
    RmmPool: rmm_pool::RmmPool = rmm_pool::POLICY;
    NoCache: nocache::NoCache = nocache::POLICY;
    Stitch: stitch::Stitch = stitch::POLICY;
    Offline: offline::Offline = offline::POLICY;
    Bound: bound::Bound = bound::POLICY;
}

/// The names of every built-in policy, in table order.
pub fn names() -> Vec<&'static str> {
    POLICIES.iter().map(|p| p.name).collect()
}

/// Whether the built-in policy called `name` is configured by an allocator's settings
/// (`PYTORCH_CUDA_ALLOC_CONF` for the pytorch policies): what the commands test, rather than
/// the name, before they read, show or export a configuration as settings.
pub fn has_allocator_settings(name: &str) -> bool {
    POLICIES.iter().any(|p| p.name == name && p.has_allocator_settings())
}

/// The role of the built-in policy called `name` (`None`: no such policy): what reports
/// compare results by, rather than by name.
pub fn role_of(name: &str) -> Option<Role> {
    POLICIES.iter().find(|p| p.name == name).map(|p| p.role)
}

/// The names of the policies among `specs` that plan with every lifetime ([`Role::Clairvoyant`]):
/// their replays need the whole trace in memory, so a session for them cannot stream it.
pub fn planners(specs: &[PolicySpec]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = specs
        .iter()
        .filter_map(|s| lookup(&s.name).ok())
        .filter(|p| p.role == Role::Clairvoyant)
        .map(|p| p.name)
        .collect();
    names.dedup();
    names
}

/// What the allocator that recorded `trace` did that a replay of it must know, read by the
/// policy that models that allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedAllocator {
    /// The bytes it added to each request before rounding (torch_npu's padding): an `oom`
    /// entry's recorded size is that much more than the request.
    pub(crate) request_pad: u64,
    /// Its recorded settings set a per-process memory fraction.
    pub(crate) memory_fraction: bool,
    /// The pages its expandable segments map and unmap, in the small and the large pool.
    pub(crate) pages: crate::trace::captures::Pages,
}

impl RecordedAllocator {
    /// What `trace`'s recorded allocator settings and frames say.
    pub fn of(trace: &Trace) -> RecordedAllocator {
        let memory_fraction = trace.allocator_settings.as_ref().is_some_and(|settings| {
            pytorch::Config::from_recorded(settings, pytorch::Version::CURRENT)
                .is_ok_and(|c| c.per_process_memory_fraction.is_some())
        });
        let flavour = pytorch::Flavour::of_trace(trace);
        let request_pad = flavour.pad();
        let version = pytorch::config::ModelledVersion::of_trace(trace).version;
        let config = (trace.allocator_settings.as_ref())
            .and_then(|s| pytorch::Config::from_recorded_as(s, version, flavour).ok())
            .unwrap_or_else(|| pytorch::Config {
                version,
                ..pytorch::Config::default_for(flavour)
            });
        let pages = crate::trace::captures::Pages {
            small: config.page_size(true),
            large: config.page_size(false),
        };
        RecordedAllocator { request_pad, memory_fraction, pages }
    }
}

/// The built-in policy called `name`.
pub fn lookup(name: &str) -> Result<&'static PolicyInfo> {
    POLICIES.iter().find(|p| p.name == name).ok_or_else(|| {
        let mut known = names();
        known.push("all");
        let hint = crate::units::spelling::closest(name, &known)
            .map(|n| format!(": did you mean '{n}'?"))
            .unwrap_or_default();
        Error::usage(format!("unknown policy '{name}'{hint} (accepted: {})", known.join(", ")))
    })
}

/// Every built-in policy with its options, one per line, for `--help`.
pub fn help() -> String {
    POLICIES
        .iter()
        .map(|p| format!("  {:<20} {}\n  {:<20} options: {}", p.name, p.summary, "", p.options()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_find_policies_by_their_declared_role_and_settings() {
        assert_eq!(role_of("bound"), Some(Role::Floor));
        assert_eq!(role_of("offline"), Some(Role::Clairvoyant));
        assert_eq!(role_of("no-such-policy"), None);
        let floors: Vec<&str> =
            POLICIES.iter().filter(|p| p.role == Role::Floor).map(|p| p.name).collect();
        assert_eq!(floors, ["bound"]);
        // The PyTorch policies, and only they, declare allocator settings, which a snapshot of
        // their run records as its own (`expandable_segments: True` for `pytorch-expandable`).
        for p in POLICIES {
            assert_eq!(p.has_allocator_settings(), p.name.starts_with("pytorch"), "{}", p.name);
        }
        let expandable = lookup("pytorch-expandable").unwrap();
        let settings = expandable.recorded_settings("expandable_segments:True").unwrap();
        assert!(settings.expandable_segments);
        assert!(lookup("bfc").unwrap().recorded_settings("").is_none());
    }

    #[test]
    fn the_recorded_allocator_says_whether_a_memory_fraction_was_set_and_its_pages() {
        let read = |conf: Option<&str>| {
            let src = b"alloc 0x0 512\n";
            let mut t = crate::trace::text::read(&src[..], &Default::default()).unwrap();
            let config = |c| pytorch::Config::parse(c, pytorch::Version::CURRENT).unwrap();
            t.allocator_settings = conf.map(|c| config(c).to_recorded());
            RecordedAllocator::of(&t)
        };
        let plain = read(None);
        assert_eq!((plain.request_pad, plain.memory_fraction), (0, false));
        // Expandable segments' pages, as the recorded settings size them.
        let mib = crate::units::MIB;
        assert_eq!((plain.pages.small, plain.pages.large), (2 * mib, 20 * mib));
        let larger = read(Some("expandable_segments:True,large_segment_size_mb:64")).pages;
        assert_eq!((larger.small, larger.large), (2 * mib, 64 * mib));
        assert!(!read(Some("max_split_size_mb:128")).memory_fraction);
        assert!(read(Some("per_process_memory_fraction:0.5")).memory_fraction);
    }
}
