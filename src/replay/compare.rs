//! Running a set of policy specs on one input: the one place every command that compares
//! policies (`replay`, `report`, and the what-if commands built on them) replays them.
//!
//! [`run_specs`] replays each [`PolicySpec`] on the same [`ReplayInput`] with the same
//! [`ReplayOptions`], in parallel or one after another ([`Jobs`]), and returns a [`Comparison`]:
//! the runs sorted as `replay`'s table prints them, those that fit before those that ran out of
//! memory, each by peak reserved bytes (ties keep the order
//! the specs were given in), the `bound` row when it ran, and the specs that were allowed to fail
//! and did. The result does not depend on the parallelism: the same specs give the same order,
//! and when several specs fail the error returned is the first one in the order given.

use super::{BackendKind, ReplayInput, ReplayOptions, ReplayOutput};
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::PolicyResult;
use crate::policy::{self, PolicySpec};
use rayon::prelude::*;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many replays run at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Jobs {
    /// One after another on the calling thread.
    Sequential,
    /// On rayon's global pool: every core (the default).
    #[default]
    AllCores,
    /// On a pool of at most this many threads (`--jobs N`).
    AtMost(NonZeroUsize),
}

impl Jobs {
    /// The setting for a `--jobs N` flag: `None` or `0` is every core, `1` is sequential.
    pub fn from_count(jobs: Option<usize>) -> Jobs {
        match jobs.and_then(NonZeroUsize::new) {
            None => Jobs::AllCores,
            Some(n) if n.get() == 1 => Jobs::Sequential,
            Some(n) => Jobs::AtMost(n),
        }
    }

    /// Runs `f` where rayon's parallel iterators use this many threads: on the global pool for
    /// every core, else on a pool of its own.
    pub fn install<T: Send>(self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let threads = match self {
            Jobs::AllCores => return Ok(f()),
            Jobs::Sequential => 1,
            Jobs::AtMost(n) => n.get(),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::usage(format!("--jobs {threads}: {e}")))?;
        Ok(pool.install(f))
    }

    /// How many threads run replays: `None` for every core.
    pub fn count(self) -> Option<usize> {
        match self {
            Jobs::Sequential => Some(1),
            Jobs::AllCores => None,
            Jobs::AtMost(n) => Some(n.get()),
        }
    }

    /// The setting for `asked` threads running `replays` replays: never more threads than
    /// there is work for, nor than [`max_jobs`]; with why, when it asked for more.
    pub fn bounded(asked: Option<usize>, replays: usize) -> (Jobs, Option<String>) {
        let Some(asked) = asked.filter(|&n| n > 1) else { return (Jobs::from_count(asked), None) };
        let (ceiling, work) = (max_jobs(), replays.max(1));
        let bounded = asked.min(work).min(ceiling);
        let why = (bounded < asked).then(|| {
            if bounded == work {
                format!("{replays} replay{} to run", if replays == 1 { "" } else { "s" })
            } else {
                format!(
                    "at most {JOBS_PER_CORE} per core on this machine's {} cores",
                    ceiling / JOBS_PER_CORE
                )
            }
        });
        (Jobs::from_count(Some(bounded)), why)
    }
}

/// The most replays run at once per core, whatever `--jobs` says: replays are CPU-bound, so
/// more threads than this only cost memory (and, by the thousand, the OS's thread limit).
pub const JOBS_PER_CORE: usize = 4;

/// The ceiling on the threads replays run on: [`JOBS_PER_CORE`] times the cores.
pub fn max_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).saturating_mul(JOBS_PER_CORE)
}

/// A callback told `(finished, total)` after each replay ends (from any thread), e.g. to move a
/// progress bar.
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// How [`run_specs`] runs the specs, beyond what each replay is told by [`ReplayOptions`].
#[derive(Clone, Copy, Default)]
pub struct RunSettings<'a> {
    /// The parallelism. A replay on the `cuda` backend always runs sequentially: the GPU is one
    /// device, and replays sharing it would count each other's memory.
    pub jobs: Jobs,
    /// The index (into the specs) of the one replay that records its simulated run as events
    /// ([`ReplayOptions::record_events`], for `--export-snapshot`); the others never record,
    /// which would cost memory for nothing.
    pub record_events_of: Option<usize>,
    /// Per spec (by index), true when the spec is optional: a usage error (the policy cannot be
    /// built or cannot be used on this input) skips it into [`Comparison::skipped`] instead of
    /// failing the whole run. Specs past the end of the slice are required.
    pub optional: &'a [bool],
    /// Told after each replay ends.
    pub progress: Option<Progress<'a>>,
}

impl std::fmt::Debug for RunSettings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSettings")
            .field("jobs", &self.jobs)
            .field("record_events_of", &self.record_events_of)
            .field("optional", &self.optional)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// One spec's replay.
#[derive(Clone, Debug)]
pub struct SpecRun {
    /// The spec's position in the slice given to [`run_specs`].
    pub index: usize,
    /// The spec.
    pub spec: PolicySpec,
    /// What the replay measured.
    pub output: ReplayOutput,
}

/// An optional spec that could not run, and why.
#[derive(Debug)]
pub struct SpecFailure {
    /// The spec's position in the slice given to [`run_specs`].
    pub index: usize,
    /// The spec.
    pub spec: PolicySpec,
    /// The usage error it failed with.
    pub error: Error,
}

/// What [`run_specs`] returns.
#[derive(Debug, Default)]
pub struct Comparison {
    /// The replays, those that fit first, each group sorted by peak reserved bytes, ties in the
    /// order the specs were given.
    pub runs: Vec<SpecRun>,
    /// The optional specs that could not run, in the order given.
    pub skipped: Vec<SpecFailure>,
}

impl Comparison {
    /// The `bound` policy's result, if it ran: the floor every overhead is measured from.
    pub fn bound(&self) -> Option<&PolicyResult> {
        self.runs
            .iter()
            .map(|r| &r.output.result)
            .find(|r| crate::policy::role_of(&r.policy) == Some(crate::policy::Role::Floor))
    }

    /// The results in table order.
    pub(crate) fn results(&self) -> Vec<PolicyResult> {
        self.runs.iter().map(|r| r.output.result.clone()).collect()
    }

    /// The run of the spec given at `index`, if it ran.
    pub fn run_of(&self, index: usize) -> Option<&SpecRun> {
        self.runs.iter().find(|r| r.index == index)
    }
}

/// Replays every spec in `specs` on `input` with `options`; see the module docs.
///
/// Fails with the first error, in the order the specs were given, of a spec that is not optional
/// ([`RunSettings::optional`]); errors other than usage errors (a broken trace, a backend
/// failure) fail the run even for optional specs.
pub fn run_specs(
    specs: &[PolicySpec],
    input: &ReplayInput,
    options: &ReplayOptions,
    settings: &RunSettings,
) -> Result<Comparison> {
    let total = specs.len();
    let finished = AtomicUsize::new(0);
    let run_on = |index: usize, input: &ReplayInput| {
        let spec = &specs[index];
        let mut opts = options.clone();
        opts.record_events = settings.record_events_of == Some(index);
        let out = policy::lookup(&spec.name).and_then(|p| p.run(spec, input, &opts));
        let done = finished.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(progress) = settings.progress {
            progress(done, total);
        }
        out
    };
    let run_one = |(index, _): (usize, &PolicySpec)| run_on(index, input);
    let jobs = if options.backend == BackendKind::Cuda { Jobs::Sequential } else { settings.jobs };
    // In parallel, each replay is its own job, started longest first (see `start_order`), and
    // the outcomes go back into the order given.
    let order = start_order(specs);
    // Events streamed from a file: the online replays share one reader (`lockstep`), at most as
    // many at once as the jobs allow. A planner loads the events itself, on a thread of its own
    // beside the shared reader's replays (one after the other with `--jobs 1`): it takes longer
    // than all of them, so run first and alone it would set the wall time by itself.
    let in_lockstep = || -> Result<Vec<Result<ReplayOutput>>> {
        let (planners, online): (Vec<usize>, Vec<usize>) =
            order.iter().partition(|&&i| plans(&specs[i]));
        let group = match jobs {
            Jobs::AtMost(n) => n.get().min(online.len().max(1)),
            _ => super::lockstep::GROUP,
        };
        let limit = options.stop_after.map_or(u64::MAX, |s| s.saturating_add(1));
        let plan_all = || -> Vec<(usize, Result<ReplayOutput>)> {
            planners.iter().map(|&i| (i, run_on(i, input))).collect()
        };
        let replay_online = || super::lockstep::run(input, &online, limit, group, run_on);
        let (mut ran, online_ran) = if group == 1 || planners.is_empty() || online.is_empty() {
            (plan_all(), replay_online())
        } else {
            std::thread::scope(|scope| {
                let planned = scope.spawn(plan_all);
                let online_ran = replay_online();
                let planned =
                    planned.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                (planned, online_ran)
            })
        };
        ran.extend(online_ran?);
        ran.sort_by_key(|&(index, _)| index);
        Ok(ran.into_iter().map(|(_, outcome)| outcome).collect())
    };
    let in_parallel = || {
        let mut ran: Vec<(usize, Result<ReplayOutput>)> = order
            .par_iter()
            .with_max_len(1)
            .map(|&index| (index, run_one((index, &specs[index]))))
            .collect();
        ran.sort_by_key(|&(index, _)| index);
        ran.into_iter().map(|(_, outcome)| outcome).collect()
    };
    let outcomes: Vec<Result<ReplayOutput>> = match jobs {
        Jobs::Sequential => specs.iter().enumerate().map(run_one).collect(),
        _ if input.is_streamed() => in_lockstep()?,
        Jobs::AllCores => in_parallel(),
        // Never more threads than replays, whatever was asked.
        Jobs::AtMost(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n.get().min(specs.len().max(1)))
            .build()
            .map_err(|e| Error::new(ErrorKind::Usage, format!("--jobs {n}: {e}")))?
            .install(in_parallel),
    };

    let mut comparison = Comparison::default();
    for ((index, spec), outcome) in specs.iter().enumerate().zip(outcomes) {
        match outcome {
            Ok(output) => comparison.runs.push(SpecRun { index, spec: spec.clone(), output }),
            Err(error)
                if error.kind() == ErrorKind::Usage
                    && settings.optional.get(index).copied().unwrap_or(false) =>
            {
                comparison.skipped.push(SpecFailure { index, spec: spec.clone(), error })
            }
            Err(error) => return Err(error),
        }
    }
    // Runs that ran out of memory never reached a comparable peak: after those that fit.
    comparison.runs.sort_by_key(|r| (r.output.result.oom, r.output.result.peak_reserved_bytes));
    Ok(comparison)
}

/// True when `spec` names a policy that plans with every event before its first malloc.
fn plans(spec: &PolicySpec) -> bool {
    policy::lookup(&spec.name).is_ok_and(|p| p.role == policy::Role::Clairvoyant)
}

/// The order the replays of `specs` start in when they run in parallel: the clairvoyant
/// policies (`offline`) first, the others as given. `offline` plans the whole trace before its
/// replay, which makes it several times longer than any online policy's replay (its module docs
/// give the numbers); started last, it would run alone after the others had finished, while
/// started first it runs alongside them.
fn start_order(specs: &[PolicySpec]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| !plans(&specs[i]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Trace;
    use std::sync::Mutex;

    fn trace() -> Trace {
        let text = "alloc 0x0 3000000 s0\nalloc 0x400000 1000 s0\nfree 0x0 3000000 s0\n\
                    alloc 0x800000 5000000 s0\nfree 0x400000 1000 s0\nfree 0x800000 5000000 s0\n";
        crate::trace::read_bytes(text.as_bytes(), crate::trace::Format::Text, &Default::default())
            .unwrap()
    }

    fn specs(text: &str) -> Vec<PolicySpec> {
        let values: Vec<String> = text.split(' ').map(String::from).collect();
        PolicySpec::parse_many(&values).unwrap()
    }

    #[test]
    fn sorts_by_peak_reserved_and_finds_the_bound_whatever_the_parallelism() {
        let trace = trace();
        let input = ReplayInput::new(&trace, None).unwrap();
        let specs = specs("all");
        let mut orders = Vec::new();
        for jobs in [Jobs::Sequential, Jobs::AllCores, Jobs::from_count(Some(2))] {
            let settings = RunSettings { jobs, ..RunSettings::default() };
            let c = run_specs(&specs, &input, &ReplayOptions::default(), &settings).unwrap();
            assert_eq!(c.runs.len(), specs.len());
            let peaks: Vec<u64> =
                c.runs.iter().map(|r| r.output.result.peak_reserved_bytes).collect();
            assert!(peaks.windows(2).all(|w| w[0] <= w[1]), "{peaks:?}");
            let bound = c.bound().unwrap();
            assert_eq!(bound.policy, "bound");
            assert_eq!(bound.peak_reserved_bytes, 5_001_000);
            assert!(c.runs.iter().all(|r| r.output.events.is_none()));
            orders.push(c.runs.iter().map(|r| r.index).collect::<Vec<_>>());
        }
        assert!(orders.windows(2).all(|w| w[0] == w[1]), "{orders:?}");
    }

    #[test]
    fn ties_keep_the_order_given_and_only_the_chosen_spec_records() {
        let trace = trace();
        let input = ReplayInput::new(&trace, None).unwrap();
        let specs = specs("bound bound bound");
        let settings = RunSettings { record_events_of: Some(1), ..RunSettings::default() };
        let c = run_specs(&specs, &input, &ReplayOptions::default(), &settings).unwrap();
        assert_eq!(c.runs.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1, 2]);
        let recorded: Vec<usize> =
            c.runs.iter().filter(|r| r.output.events.is_some()).map(|r| r.index).collect();
        assert_eq!(recorded, [1]);
        assert_eq!(c.run_of(1).unwrap().index, 1);
    }

    #[test]
    fn planners_start_first_and_the_others_keep_their_order() {
        let given = specs("bound pytorch offline buddy offline:align=512 nocache");
        assert_eq!(start_order(&given), [2, 4, 0, 1, 3, 5]);
        let all = specs("all");
        let order: Vec<&str> = start_order(&all).iter().map(|&i| all[i].name.as_str()).collect();
        let online: Vec<&str> =
            all.iter().map(|s| s.name.as_str()).filter(|&n| n != "offline").collect();
        assert_eq!(order, [&["offline"][..], &online].concat());
    }

    #[test]
    fn optional_specs_are_skipped_on_usage_errors_and_required_ones_fail_first_in_order() {
        let trace = trace();
        let input = ReplayInput::new(&trace, None).unwrap();
        let specs = specs("bound buddy:nonsense=1 nocache:bad=2");
        let settings = RunSettings { optional: &[false, true, true], ..RunSettings::default() };
        let c = run_specs(&specs, &input, &ReplayOptions::default(), &settings).unwrap();
        assert_eq!(c.runs.len(), 1);
        let skipped: Vec<usize> = c.skipped.iter().map(|s| s.index).collect();
        assert_eq!(skipped, [1, 2]);
        assert!(c.skipped[0].error.message().contains("nonsense"), "{:?}", c.skipped[0].error);

        let required = RunSettings { optional: &[false, false, false], ..settings };
        let e = run_specs(&specs, &input, &ReplayOptions::default(), &required).unwrap_err();
        assert!(e.message().contains("nonsense"), "{}", e.message());
    }

    #[test]
    fn progress_counts_every_replay_once() {
        let trace = trace();
        let input = ReplayInput::new(&trace, None).unwrap();
        let specs = specs("all");
        let seen = Mutex::new(Vec::new());
        let progress = |done: usize, total: usize| seen.lock().unwrap().push((done, total));
        let settings = RunSettings { progress: Some(&progress), ..RunSettings::default() };
        run_specs(&specs, &input, &ReplayOptions::default(), &settings).unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        let n = specs.len();
        assert_eq!(seen, (1..=n).map(|d| (d, n)).collect::<Vec<_>>());
    }
}
