//! The replay engine: one device's events, in order, through one policy, measured as it goes.
//!
//! Data flows one way: a [`Trace`](crate::trace::Trace) is read, [`ReplayInput`] picks a device and finds the blocks
//! live before the first event, [`run_policy`] drives every event through a [`Policy`] on a
//! backend, and the [`ReplayOutput`] carries the measurements ([`PolicyResult`](crate::metrics::PolicyResult), [`PeakDetail`](crate::metrics::PeakDetail), a
//! [`Series`](crate::metrics::Series)) to the report writers. [`run_specs`] replays a set of policy specs on one input
//! (in parallel, sorted as `replay`'s table) for every command that compares policies.
//!
//! The events come from memory ([`ReplayInput::new`]) or stream from an uncompressed `.fst` file
//! ([`ReplayInput::streamed`]), the same engine consuming them in order either way. Loaded
//! events are given slots once (each block a small index, shared by its alloc and its free) so
//! every policy's replay follows indices into a table as long as the most blocks live at once,
//! instead of hashing addresses. Streamed events are never all held: two pre-passes over
//! the file find where frees take effect, the recorded `empty_cache()` calls (as sorted indices)
//! and the few events that decide the blocks live at the start (`digest`), in memory that
//! follows the live blocks; each policy's replay then reads the file again and finds a free's
//! block in a map of the recording's live blocks (recorded address → the policy's address and
//! the request size). The results are the same number for number. `offline`, which plans with
//! every lifetime, loads a streamed input's events for its own replay.
//!
//! Semantics, following the PyTorch allocator (docs/pytorch-model.md#free-and-merge): an `alloc`
//! calls the policy's malloc with the request size and stream; a free takes effect at
//! `free_completed` (`free_requested` only marks the caller's intent) — or at `free_requested` in
//! formats that record one kind of free; a run of recorded `segment_free`s outside any malloc is
//! the program calling `empty_cache()`, so every policy is asked to flush there too (and so is one
//! before a retried allocation that the recorded levels, or the recorded allocator's model, show
//! was no OOM fallback: [`EmptyCacheRuns`](crate::trace::lifetimes::EmptyCacheRuns)); an `oom` entry is a request every policy tries, and
//! frees at once if it is served. Blocks live before the first
//! event are allocated first, in address order, so every policy carries them (a policy that knows
//! how the recorded allocator held them installs that state instead, [`Policy::start`]). Frees of
//! addresses the replay never allocated are counted, never fatal. Reserved bytes are read from the backend,
//! so a policy cannot misreport them.

mod blocks;
pub mod compare;
pub mod empty_cache;
mod engine;
mod guide;
pub(crate) mod input;
mod lockstep;
mod meter;
mod options;

pub use crate::error::Cancel;
pub use compare::{
    max_jobs, run_specs, Comparison, Jobs, RunSettings, SpecFailure, SpecRun, JOBS_PER_CORE,
};
pub(crate) use engine::run_guided;
pub use engine::{run_policy, LogOrigin, ReplayOutput};

pub(crate) use guide::Undecided;
pub(crate) use guide::{ExactPlacer, Guide};
pub use input::ReplayInput;
pub use options::{BackendKind, EmptyCachePlan, ReplayOptions};

use crate::error::Result;
use crate::policy::{self, Policy, PolicyInfo, PolicyRunner, PolicySpec};

/// The engine side of running a table entry: the policy module's table builds the concrete
/// policy, the engine runs it. (An inherent impl here, beside the engine, so that `policy` never
/// names `replay`.)
impl PolicyInfo {
    /// Replays `input` with this policy built from `spec`'s options: one dispatch per run, then
    /// the generic engine instantiated for the concrete policy type.
    pub fn run(
        &self,
        spec: &PolicySpec,
        input: &ReplayInput,
        options: &ReplayOptions,
    ) -> Result<ReplayOutput> {
        if self.role == policy::Role::Clairvoyant && input.is_streamed() {
            // A planner needs every lifetime before the first event: it alone loads them.
            let events = input.load_events()?;
            let loaded = ReplayInput::of_events(input.trace(), input.device(), &events)?;
            return self.run(spec, &loaded, options);
        }
        let built = self.build(spec, &input.context(options))?;
        built.run_with(&spec.name, Engine { input, options })
    }
}

/// Replays `input` with the built-in policy `spec` names: [`policy::lookup`] then
/// [`PolicyInfo::run`].
pub fn run_spec(
    spec: &PolicySpec,
    input: &ReplayInput,
    options: &ReplayOptions,
) -> Result<ReplayOutput> {
    policy::lookup(&spec.name)?.run(spec, input, options)
}

/// The engine as a [`PolicyRunner`]: what a built policy is handed to be run.
struct Engine<'r, 'a> {
    input: &'r ReplayInput<'a>,
    options: &'r ReplayOptions,
}

impl PolicyRunner for Engine<'_, '_> {
    type Output = Result<ReplayOutput>;
    fn run<P: Policy>(self, name: &str, policy: P) -> Result<ReplayOutput> {
        run_policy(name, policy, self.input, self.options)
    }
}

#[cfg(test)]
mod tests;
