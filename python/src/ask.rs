//! The questions Python asks the library directly, with typed parameters and no command line
//! between: `fragsim.info`, `replay`, `explain`, `fit`, `blame`, `diff`, `sweep`, `check`,
//! `validate`, `merge`, `report` and `convert` (and `Trace`'s methods of those names). Each
//! builds a [`Session`] on a [`Loaded`] trace (shared, not copied), asks it, and hands back the
//! answer as the JSON the command prints with `--format json` (`{}` for those whose answer is the
//! files they write), the notes the command prints on stderr, or the error; the pure-Python layer
//! wraps them as it wraps a command's.

use crate::loaded::Loaded;
use crate::snapshot_dict::Names;
use crate::{error_info, off_thread, panicked, ErrorInfo};
use fragsim::blame::diff::{compare, pair_specs};
use fragsim::blame::{BlameOptions, GroupBy, Moment};
use fragsim::error::{Error, Result};
use fragsim::explain::ExplainOptions;
use fragsim::policy::pytorch::config::{Flavour, Version};
use fragsim::policy::{planners, PolicySpec};
use fragsim::replay::{Cancel, EmptyCachePlan, Jobs, ReplayOptions, RunSettings};
use fragsim::report::ReportPlan;
use fragsim::session::several::{self, SweepPlan};
use fragsim::session::{loaded_for_planners, Capacity, ReplayRequest, Session};
use fragsim::validate::ValidateOptions;
use fragsim::whatif::check::{parse_tolerance, Baseline};
use fragsim::whatif::fit::{DEFAULT_OUTSIDE, DEFAULT_POLICIES};
use fragsim::whatif::sweep::DEFAULT_OBJECTIVE;
use fragsim::whatif::{own_json, Row};
use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A question's answer: the exit code, the JSON text, the notes, and the error, if it failed.
type Answer = (u8, Option<String>, Vec<String>, Option<ErrorInfo>);

/// A question's answer as the question gives it: exit code, JSON, notes.
struct Answered {
    code: u8,
    json: String,
    notes: Vec<String>,
}

impl Answered {
    /// An answer with exit code 0: the typed answer as the JSON the command prints with
    /// `--format json`.
    fn of(answer: &impl serde::Serialize, notes: Vec<String>) -> Result<Answered> {
        Ok(Answered { code: 0, json: json(answer)?, notes })
    }
}

/// What a question is about: the trace, its name in answers and errors, the device (`None`: the
/// one with the most events), the most bytes it may read (as the user wrote it: its error is the
/// question's), and whether it is read for this question alone (a path given to a function, not
/// a loaded trace: read from the file, not kept, and a `.fst` file may stream).
#[pyclass(module = "fragsim._native", frozen)]
#[derive(Clone)]
pub struct On {
    trace: Loaded,
    #[pyo3(get)]
    name: String,
    device: Option<i32>,
    max_input_size: Option<String>,
    once: bool,
}

#[pymethods]
impl On {
    #[new]
    #[pyo3(signature = (trace, name, *, device=None, max_input_size=None, once=false))]
    fn new(
        trace: &Bound<'_, Loaded>,
        name: String,
        device: Option<i32>,
        max_input_size: Option<String>,
        once: bool,
    ) -> On {
        On { trace: trace.get().clone(), name, device, max_input_size, once }
    }

    /// Whether `other` is about the very same trace object (not a copy or the same path).
    fn same_trace(&self, other: &On) -> bool {
        self.trace.is(&other.trace)
    }
}

/// A question being answered, on its own thread: what it is about, the read limit in bytes,
/// and the flag Ctrl-C raises.
struct Asked {
    on: On,
    max_input: Option<u64>,
    cancel: Cancel,
    /// Whether a trace's want of memory history was noted: once per question, as the command
    /// line notes it once per command.
    history_noted: std::cell::Cell<bool>,
}

impl Asked {
    /// The session on the trace, read (with stack frames when `frames`) if it is not kept yet;
    /// a `.fst` file read once streams when `stream`.
    fn session(&self, frames: bool, stream: bool) -> Result<Session> {
        self.session_on(&self.on, frames, stream)
    }

    /// A session on `on` for replaying `specs` (frames kept when `frames`), as the command line
    /// opens it: a `.fst` file read once streams unless a planner needs every lifetime (and a
    /// note says so); the snapshot's want of memory history is noted too.
    fn replay_session(
        &self,
        on: &On,
        specs: &[PolicySpec],
        frames: bool,
        notes: &mut Vec<String>,
    ) -> Result<Session> {
        let planners = planners(specs);
        if on.once && !planners.is_empty() && on.trace.streams()? {
            notes.push(loaded_for_planners(&planners, Path::new(&on.name)));
        }
        let session = self.session_on(on, frames, planners.is_empty())?;
        self.note_session_history(&session, notes);
        Ok(session)
    }

    /// The notes the command line prints before the answer: no memory history, and the
    /// session's own ([`Session::notes`]), each as `fragsim: ...` would end.
    fn notes_of(&self, session: &Session, specs: &[PolicySpec]) -> Vec<String> {
        let mut notes = Vec::new();
        self.note_session_history(session, &mut notes);
        notes.extend(session.notes(specs));
        notes
    }

    /// Notes, once per question, that the session's trace is a snapshot taken without memory
    /// history ([`Session::no_history_note`]: a streamed file's events are counted in the file).
    fn note_session_history(&self, session: &Session, notes: &mut Vec<String>) {
        self.note_once(session.no_history_note(), notes);
    }

    /// Notes, once per question, that `trace` (loaded, called `name`) is a snapshot taken
    /// without memory history.
    fn note_history(&self, trace: &fragsim::trace::Trace, name: &Path, notes: &mut Vec<String>) {
        self.note_once(trace.no_history_note(name), notes);
    }

    /// Adds `note` to `notes`, where there is one, the first time a question has one.
    fn note_once(&self, note: Option<String>, notes: &mut Vec<String>) {
        if let Some(note) = note.filter(|_| !self.history_noted.get()) {
            self.history_noted.set(true);
            notes.push(note);
        }
    }

    /// [`several::replay_each`] of `specs` on `traces` under `capacity`, with `jobs` threads
    /// (bounded), opening each as the command line does (the first from `first` when the
    /// question already opened it); `notes` so far, and the replays'.
    fn replay_each(
        &self,
        traces: &[On],
        specs: &[PolicySpec],
        capacity: Option<Capacity>,
        jobs: Option<usize>,
        mut notes: Vec<String>,
        mut first: Option<Session>,
    ) -> Result<(Vec<several::Replayed>, Vec<String>)> {
        let jobs = bounded_jobs(jobs, specs.len(), &mut notes);
        let options = ReplayOptions { cancel: self.cancel.clone(), ..ReplayOptions::default() };
        let settings = RunSettings { jobs, ..RunSettings::default() };
        let notes = std::cell::RefCell::new(notes);
        let mut open = |on: &On| match first.take() {
            Some(session) => Ok(session),
            None => self.replay_session(on, specs, false, &mut notes.borrow_mut()),
        };
        let mut note = |n: &str| notes.borrow_mut().push(n.to_string());
        let capacity = capacity.as_ref();
        let replayed = several::replay_each(
            traces, specs, capacity, &options, &settings, &mut open, &mut note,
        )?;
        Ok((replayed, notes.into_inner()))
    }

    /// [`Asked::session`] on another trace of the question (`diff`'s B).
    fn session_on(&self, on: &On, frames: bool, stream: bool) -> Result<Session> {
        let (max, cancel) = (self.max_input, &self.cancel);
        on.trace.session(&on.name, on.device, frames, on.once, stream, max, cancel)
    }
}

/// `fragsim replay`'s answer: each spec replayed on the device, the recorded row beside them.
#[pyfunction]
#[pyo3(signature = (
    on, *, policies, capacity=None, empty_cache_every=None,
    empty_cache_at=Vec::new(), no_recorded_empty_cache=false, outside=None, jobs=None,
    pytorch_version=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn replay(
    py: Python<'_>,
    on: &Bound<'_, On>,
    policies: Vec<String>,
    capacity: Option<String>,
    empty_cache_every: Option<u64>,
    empty_cache_at: Vec<u64>,
    no_recorded_empty_cache: bool,
    outside: Option<String>,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let written = versioned(&policies, &["pytorch"], pytorch_version.as_deref())?;
        let specs = PolicySpec::parse_many(&written)?;
        let capacity = capacity_of(capacity.as_deref())?;
        let outside = outside.as_deref().map(|o| size("outside", o)).transpose()?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let mut notes = Vec::new();
        let session = asked.replay_session(&asked.on, &specs, capacity.is_some(), &mut notes)?;
        notes.extend(session.notes(&specs));
        let bounded = bounded_jobs(jobs, specs.len(), &mut notes);
        let request = ReplayRequest {
            specs,
            capacity,
            options: ReplayOptions {
                empty_cache,
                outside_bytes: outside.unwrap_or(0),
                cancel: asked.cancel.clone(),
                ..ReplayOptions::default()
            },
            empty_cache_price: false,
        };
        let settings = RunSettings { jobs: bounded, ..RunSettings::default() };
        let answer = session.replay(&request, &settings)?;
        let mut json = Vec::new();
        fragsim::report::json::write(&answer.report(&asked.on.name), &mut json)?;
        Ok(Answered { code: 0, json: String::from_utf8_lossy(&json).into_owned(), notes })
    })
}

/// `fragsim explain`'s answer: the verdict at the moment, the free memory by kind, the fixes.
#[pyfunction]
#[pyo3(signature = (
    on, *, policy=None, at=None, capacity=None, top=None, fixes=true, empty_cache_every=None,
    empty_cache_at=Vec::new(), no_recorded_empty_cache=false, jobs=None, pytorch_version=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn explain(
    py: Python<'_>,
    on: &Bound<'_, On>,
    policy: Option<String>,
    at: Option<String>,
    capacity: Option<String>,
    top: Option<usize>,
    fixes: bool,
    empty_cache_every: Option<u64>,
    empty_cache_at: Vec<u64>,
    no_recorded_empty_cache: bool,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let written = versioned(policy.as_slice(), &["pytorch"], pytorch_version.as_deref())?;
        let spec = ExplainOptions::one_spec(&written)?;
        let at = ExplainOptions::moment(at.as_deref())?;
        let capacity = capacity_of(capacity.as_deref())?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let session = asked.session(true, false)?;
        let mut notes = asked.notes_of(&session, std::slice::from_ref(&spec));
        let mut replay = session.replay_options(capacity.as_ref(), empty_cache)?;
        replay.cancel = asked.cancel.clone();
        let top = top.unwrap_or(ExplainOptions::default().top);
        let options = ExplainOptions { at, spec, replay, top, fixes };
        // The fixes' replays, as many at once as the command line runs them.
        let jobs = bounded_jobs(jobs, EXPLAIN_REPLAYS, &mut notes);
        Answered::of(&jobs.install(|| session.explain(&options))??, notes)
    })
}

/// The replays `explain` runs at most (its fixes), as the command line bounds `--jobs` by.
const EXPLAIN_REPLAYS: usize = 8;

/// `fragsim info`'s answer: what the trace holds.
#[pyfunction]
#[pyo3(signature = (on))]
pub fn info(py: Python<'_>, on: &Bound<'_, On>) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let on = &asked.on;
        let trace = on.trace.trace(&on.name, on.once, false, asked.max_input, &asked.cancel)?;
        let mut notes = Vec::new();
        asked.note_history(&trace, Path::new(&on.name), &mut notes);
        Answered::of(&fragsim::session::info(&trace), notes)
    })
}

/// `fragsim report`: the charts, tables and web page of each policy's replay, written into `out`;
/// the answer is empty (the files are it).
#[pyfunction]
#[pyo3(signature = (
    on, *, out, policies, capacity=None, empty_cache_every=None, empty_cache_at=Vec::new(),
    no_recorded_empty_cache=false, segment_map_policy=None, jobs=None, pytorch_version=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn report(
    py: Python<'_>,
    on: &Bound<'_, On>,
    out: PathBuf,
    policies: Vec<String>,
    capacity: Option<String>,
    empty_cache_every: Option<u64>,
    empty_cache_at: Vec<u64>,
    no_recorded_empty_cache: bool,
    segment_map_policy: Option<String>,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let mut policies = ReportPlan::policies_from(&policies)?;
        if pytorch_version.is_some() {
            // One spec per planned policy, so the default set stays optional.
            let written: Vec<String> = policies.iter().map(|p| p.spec.display()).collect();
            let versioned = versioned(&written, &[], pytorch_version.as_deref())?;
            for (planned, text) in policies.iter_mut().zip(versioned) {
                planned.spec = PolicySpec::parse_list(&text)?.remove(0);
            }
        }
        if let Some(name) = &segment_map_policy {
            PolicySpec::parse_list(name)?;
        }
        let capacity = capacity_of(capacity.as_deref())?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let name = Path::new(&asked.on.name);
        fragsim::report::output::refuse_input_in_folder(&out, "--out", &[name])?;
        // Frames name the allocation sites of the "where the memory went" chart.
        let session = asked.session(true, false)?;
        let mut notes = Vec::new();
        asked.note_session_history(&session, &mut notes);
        let resolved = session.capacity(capacity.as_ref())?;
        notes.extend(resolved.inferred_note());
        let jobs = bounded_jobs(jobs, policies.len(), &mut notes);
        let plan = ReportPlan {
            trace_path: asked.on.name.clone(),
            policies,
            device: asked.on.device,
            capacity: resolved.bytes,
            capacity_inferred: resolved.inferred,
            capacity_kind: resolved.kind,
            empty_cache,
            segment_map_policy,
            progress: false,
            jobs,
            cancel: asked.cancel.clone(),
        };
        let data = session.report(&plan)?;
        notes.extend(data.skipped_notes());
        fragsim::report::write_dir(&data, &out, false)?;
        notes.push(data.written_note(&out));
        Ok(Answered { code: 0, json: "{}".into(), notes })
    })
}

/// `fragsim convert`: the trace written to `output` in the format its extension names; the answer
/// is empty (the file is it).
#[pyfunction]
#[pyo3(signature = (on, *, output))]
pub fn convert(py: Python<'_>, on: &Bound<'_, On>, output: PathBuf) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        // The output's format is known before a possibly long read.
        let format = fragsim::trace::Format::for_output(&output)?.info();
        let on = &asked.on;
        fragsim::report::output::refuse_input(&output, "OUT", &[Path::new(&on.name)])?;
        let (frames, max) = (format.keeps_frames, asked.max_input);
        let trace = on.trace.trace(&on.name, on.once, frames, max, &asked.cancel)?;
        let mut notes = Vec::new();
        asked.note_history(&trace, Path::new(&on.name), &mut notes);
        fragsim::report::output::write_output(&output, "OUT", |w| {
            fragsim::trace::write_trace_into(&trace, &output, w, &asked.cancel)
        })?;
        notes.extend(format.loss_notes(&trace, &output));
        Ok(Answered { code: 0, json: "{}".into(), notes })
    })
}

/// `fragsim fit`'s answer: per policy, the least device memory with no OOM, and the cards.
#[pyfunction]
#[pyo3(signature = (on, *, policies, outside=None, jobs=None, pytorch_version=None))]
pub fn fit(
    py: Python<'_>,
    on: &Bound<'_, On>,
    policies: Vec<String>,
    outside: Option<String>,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let policies = if policies.is_empty() {
            DEFAULT_POLICIES.iter().map(|s| s.to_string()).collect()
        } else {
            policies
        };
        let specs =
            PolicySpec::parse_many(&versioned(&policies, &[], pytorch_version.as_deref())?)?;
        let outside = outside.as_deref().map(|o| size("outside", o)).transpose()?;
        let session = asked.session(false, false)?;
        let mut notes = asked.notes_of(&session, &specs);
        let jobs = bounded_jobs(jobs, specs.len(), &mut notes);
        let outside = outside.unwrap_or(DEFAULT_OUTSIDE);
        let settings = RunSettings::default();
        let cancel = &asked.cancel;
        let report = jobs.install(|| session.fit(&specs, outside, cancel, &settings))??;
        Answered::of(&report, notes)
    })
}

/// `fragsim blame`'s answer: who holds the memory at a moment of each policy's replay.
#[pyfunction]
#[pyo3(signature = (
    on, *, policies, capacity=None, at=None, by=None, top=None,
    depth=None, empty_cache_every=None, empty_cache_at=Vec::new(),
    no_recorded_empty_cache=false, jobs=None, pytorch_version=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn blame(
    py: Python<'_>,
    on: &Bound<'_, On>,
    policies: Vec<String>,
    capacity: Option<String>,
    at: Option<String>,
    by: Option<String>,
    top: Option<usize>,
    depth: Option<usize>,
    empty_cache_every: Option<u64>,
    empty_cache_at: Vec<u64>,
    no_recorded_empty_cache: bool,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let written = versioned(&policies, &["pytorch"], pytorch_version.as_deref())?;
        let specs = PolicySpec::parse_many(&written)?;
        let grouped = grouping(by.as_deref(), top, depth)?;
        let at = at.as_deref().map(Moment::parse).transpose()?.unwrap_or(grouped.at);
        let capacity = capacity_of(capacity.as_deref())?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let session = asked.session(true, false)?;
        let mut notes = asked.notes_of(&session, &specs);
        let mut replay = session.replay_options(capacity.as_ref(), empty_cache)?;
        replay.cancel = asked.cancel.clone();
        let options = BlameOptions { at, replay, ..grouped };
        let jobs = bounded_jobs(jobs, specs.len(), &mut notes);
        let report = jobs.install(|| session.blame(&specs, &options))??;
        Answered::of(&report, notes)
    })
}

/// `fragsim diff`'s answer: two runs side by side (two traces, or one under two policies),
/// each at its peak-live moment, and what changed by site.
#[pyfunction]
#[pyo3(signature = (
    a, b=None, *, policies, by=None, top=None, depth=None, jobs=None, pytorch_version=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn diff(
    py: Python<'_>,
    a: &Bound<'_, On>,
    b: Option<&Bound<'_, On>>,
    policies: Vec<String>,
    by: Option<String>,
    top: Option<usize>,
    depth: Option<usize>,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    let on_b = b.map(|b| b.get().clone());
    let others: Vec<On> = on_b.iter().cloned().collect();
    ask(py, a, &others, move |asked| {
        let version = pytorch_version.as_deref();
        let policies = match (&on_b, policies.len(), version) {
            // One trace, one policy: as recorded against the release asked.
            (None, 0 | 1, Some(_)) => {
                let a = policies.first().cloned().unwrap_or_else(|| "pytorch".into());
                let b = versioned(std::slice::from_ref(&a), &[], version)?;
                std::iter::once(a).chain(b).collect()
            }
            _ => versioned(&policies, &["pytorch"], version)?,
        };
        let (spec_a, spec_b) = pair_specs(&policies, on_b.is_some())?;
        let options = BlameOptions { at: Moment::PeakLive, ..grouping(by.as_deref(), top, depth)? };
        let mut notes = Vec::new();
        // B naming A's file again is read once, as the command line reads it.
        let on_b = match on_b {
            Some(on_b) => distinct(vec![asked.on.clone(), on_b], &mut notes).into_iter().nth(1),
            None => None,
        };
        let jobs = bounded_jobs(jobs, 1, &mut notes);
        let side = |session: &Session, spec: &PolicySpec| {
            jobs.install(|| session.diff_side(spec, &options))?
        };
        // One trace at a time: A is summarised and dropped before B is read, as the command
        // line does, so two large traces are never held at once.
        let session_a = asked.session(true, false)?;
        asked.note_session_history(&session_a, &mut notes);
        let side_a = side(&session_a, &spec_a)?;
        let side_b = match on_b {
            Some(on_b) => {
                drop(session_a);
                let session_b = asked.session_on(&on_b, true, false)?;
                asked.note_session_history(&session_b, &mut notes);
                side(&session_b, &spec_b)?
            }
            None => side(&session_a, &spec_b)?,
        };
        let (report, _) = compare(&side_a, &side_b, &options);
        Answered::of(&report, notes)
    })
}

/// The first of a question's `traces` (the one it is asked on), the others, and all of them, or
/// `None` when there is none.
fn first_and_others<'a, 'py>(
    traces: &'a [Bound<'py, On>],
) -> Option<(&'a Bound<'py, On>, Vec<On>, Vec<On>)> {
    let (first, rest) = traces.split_first()?;
    let others: Vec<On> = rest.iter().map(|o| o.get().clone()).collect();
    let all = std::iter::once(first.get().clone()).chain(others.iter().cloned()).collect();
    Some((first, others, all))
}

/// `fragsim sweep`'s answer: a grid of configs replayed on every trace, ranked by the worst case.
#[pyfunction]
#[pyo3(signature = (
    traces, *, policies, objective=None, capacity=None, jobs=None, pytorch_version=None,
))]
pub fn sweep(
    py: Python<'_>,
    traces: Vec<Bound<'_, On>>,
    policies: Vec<String>,
    objective: Option<String>,
    capacity: Option<String>,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    let Some((first, others, all)) = first_and_others(&traces) else {
        return Ok(usage_answer("sweep takes at least one trace"));
    };
    ask(py, first, &others, move |asked| {
        let mut notes = Vec::new();
        let capacity = capacity_of(capacity.as_deref())?;
        // The session the built-in grid is read from is the sweep's first trace's: replayed,
        // not read again.
        let (written, first) = if policies.is_empty() {
            let session = asked.session(false, true)?;
            asked.note_session_history(&session, &mut notes);
            (several::builtin_grid(Some(&session)), Some(session))
        } else {
            (policies, None)
        };
        let written = versioned(&written, &[], pytorch_version.as_deref())?;
        let objective = objective.as_deref().unwrap_or(DEFAULT_OBJECTIVE);
        let plan = SweepPlan::new(written, objective, capacity.as_ref(), asked.on.device, None)?;
        let traces = distinct(all, &mut notes);
        let (replayed, mut notes) =
            asked.replay_each(&traces, &plan.specs, capacity, jobs, notes, first)?;
        for r in &replayed {
            notes.extend(r.recorded_oom.map(|event| several::recorded_oom_note(&r.trace, event)));
        }
        Answered::of(&plan.report(&replayed)?, notes)
    })
}

/// `fragsim check`'s answer: the traces replayed and compared with a baseline; exit code 1 on a
/// regression beyond the tolerance.
#[pyfunction]
#[pyo3(signature = (
    traces, *, baseline, policies, tolerance=None, capacity=None, jobs=None,
    pytorch_version=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn check(
    py: Python<'_>,
    traces: Vec<Bound<'_, On>>,
    baseline: PathBuf,
    policies: Vec<String>,
    tolerance: Option<String>,
    capacity: Option<String>,
    jobs: Option<usize>,
    pytorch_version: Option<String>,
) -> PyResult<Answer> {
    let Some((first, others, all)) = first_and_others(&traces) else {
        return Ok(usage_answer("check takes at least one trace"));
    };
    ask(py, first, &others, move |asked| {
        let written = versioned(&policies, &["pytorch"], pytorch_version.as_deref())?;
        let specs = PolicySpec::parse_many(&written)?;
        let tolerance = parse_tolerance(tolerance.as_deref().unwrap_or("1%"))?;
        let capacity = capacity_of(capacity.as_deref())?;
        let mut notes = Vec::new();
        let traces = distinct(all, &mut notes);
        let what = "baseline (record one with check --update)";
        let data = own_json::read(&baseline, what, asked.max_input)?;
        let base = Baseline::parse(&data, &baseline)?;
        let (replayed, mut notes) =
            asked.replay_each(&traces, &specs, capacity, jobs, notes, None)?;
        for r in &replayed {
            let inferred = r.capacity.filter(|_| r.inferred);
            notes.extend(inferred.map(|bytes| several::inferred_capacity_note(&r.trace, bytes)));
        }
        let rows: Vec<Row> = replayed
            .iter()
            .flat_map(|r| r.results.iter().map(|x| Row::new(r.trace.clone(), x)))
            .collect();
        let report = fragsim::whatif::check::check(&base, &baseline, &rows, tolerance, None)?;
        Ok(Answered { code: u8::from(!report.ok), ..Answered::of(&report, notes)? })
    })
}

/// An answer that is a usage error, found before any question was asked.
fn usage_answer(message: &str) -> Answer {
    let info = ("usage".into(), message.to_string(), None, None, None, message.to_string());
    (2, None, Vec::new(), Some(info))
}

/// `fragsim merge`'s answer: the parts of a sharded sweep combined into what the unsharded sweep
/// answers.
#[pyfunction]
#[pyo3(signature = (parts, *, max_input_size=None))]
pub fn merge(
    py: Python<'_>,
    parts: Vec<PathBuf>,
    max_input_size: Option<String>,
) -> PyResult<Answer> {
    if parts.is_empty() {
        return Ok(usage_answer("merge takes at least one sweep part"));
    }
    answer(py, Vec::new(), move |_| {
        let max = max_input_size.as_deref().map(|m| size("max_input_size", m)).transpose()?;
        let mut notes = Vec::new();
        let paths = fragsim::report::output::distinct_inputs(&parts, |n| notes.push(n.into()));
        let mut read = Vec::with_capacity(paths.len());
        for path in paths {
            let data = own_json::read(&path, "sweep part", max)?;
            let report = fragsim::whatif::input::read_part(&data, &path)?;
            read.push(fragsim::whatif::sweep::Part { file: path, report });
        }
        Answered::of(&fragsim::whatif::sweep::merge(read)?, notes)
    })
}

/// `traces`, each once: one named again (the same trace object, or the same file by another
/// path) is dropped with a note, as the command line drops a file named twice.
fn distinct(traces: Vec<On>, notes: &mut Vec<String>) -> Vec<On> {
    let file = |on: &On| {
        let m = std::fs::metadata(&on.name).ok().filter(|_| on.once)?;
        fragsim::report::output::identity(&m)
    };
    let mut kept: Vec<On> = Vec::with_capacity(traces.len());
    for on in traces {
        let twice = kept.iter().any(|k| {
            k.trace.is(&on.trace)
                || (on.once && k.once && k.name == on.name)
                || file(k).is_some_and(|f| Some(f) == file(&on))
        });
        if twice {
            notes.push(format!("note: {} is named twice; it is read once", on.name));
        } else {
            kept.push(on);
        }
    }
    kept
}

/// `fragsim validate`'s answer: the PyTorch policy's decisions against the recording's; exit
/// code 1 where one differs.
#[pyfunction]
#[pyo3(signature = (on, *, gpu_mem=None, pytorch_version=None, policy=None))]
pub fn validate(
    py: Python<'_>,
    on: &Bound<'_, On>,
    gpu_mem: Option<String>,
    pytorch_version: Option<String>,
    policy: Option<String>,
) -> PyResult<Answer> {
    ask(py, on, &[], move |asked| {
        let gpu_memory = gpu_mem.as_deref().map(|g| size("gpu_mem", g)).transpose()?;
        let version = pytorch_version.as_deref().map(|v| {
            param("pytorch_version", v, |t| Version::parse(t).map_err(|e| e.message().into()))
        });
        let version = version.transpose()?;
        let flavour = policy.as_deref().map(|p| param("policy", p, Flavour::rules)).transpose()?;
        let session = asked.session(false, false)?;
        let notes = asked.notes_of(&session, &[]);
        let options = ValidateOptions {
            device: asked.on.device,
            gpu_memory,
            version,
            record_events: false,
            check_invariants: false,
            flavour: flavour.flatten(),
            cancel: asked.cancel.clone(),
        };
        let v = session.validate(&options)?;
        let code = u8::from(!v.mismatches.is_empty());
        Ok(Answered { code, ..Answered::of(&v, notes)? })
    })
}

/// The parallelism for `replays` replays when `asked` threads were asked for, with a note where
/// it was lowered (as the command line's `--jobs` note says it).
fn bounded_jobs(asked: Option<usize>, replays: usize, notes: &mut Vec<String>) -> Jobs {
    let (bounded, lowered) = Jobs::bounded(asked, replays);
    notes.extend(lowered.map(|why| {
        let at_once = bounded.count().unwrap_or(1);
        format!("note: jobs={}: running {at_once} at once ({why})", asked.unwrap_or(0))
    }));
    bounded
}

/// A typed answer as the JSON the command prints with `--format json`.
fn json(answer: &impl serde::Serialize) -> Result<String> {
    let text = serde_json::to_string_pretty(answer)
        .map_err(|e| Error::input(format!("the answer as JSON: {e}")))?;
    Ok(text + "\n")
}

/// Asks `question` about `on` (and `others`, the question's other traces): [`answer`], with the
/// read limit parsed on the question's thread (its error is the question's).
fn ask(
    py: Python<'_>,
    on: &Bound<'_, On>,
    others: &[On],
    question: impl FnOnce(Asked) -> Result<Answered> + Send + 'static,
) -> PyResult<Answer> {
    let on = on.get().clone();
    let names: Vec<(String, Arc<Mutex<Option<Names>>>)> = std::iter::once(&on)
        .chain(others)
        .map(|o| (o.name.clone(), o.trace.names.clone()))
        .collect();
    answer(py, names, move |cancel| {
        let max = on.max_input_size.as_deref().map(|m| size("max_input_size", m)).transpose()?;
        question(Asked { on, max_input: max, cancel, history_noted: Default::default() })
    })
}

/// Runs `job` on a thread of its own (the GIL released, Ctrl-C heard and passed on through the
/// [`Cancel`] it is given, a panic caught) and turns its outcome into an [`Answer`], naming a
/// snapshot dict's places by their keys (`names`: each trace's name and key paths).
fn answer(
    py: Python<'_>,
    names: Vec<(String, Arc<Mutex<Option<Names>>>)>,
    job: impl FnOnce(Cancel) -> Result<Answered> + Send + 'static,
) -> PyResult<Answer> {
    let cancel = Cancel::new();
    let stop = cancel.clone();
    Ok(match off_thread(py, &stop, move || job(cancel))? {
        Ok(Ok(Answered { code, json, notes })) => (code, Some(json), notes, None),
        Ok(Err(e)) => {
            let file = e.location().file.as_ref();
            let names = names.iter().find(|(n, _)| file.is_some_and(|f| Path::new(n) == f));
            let names = names.and_then(|(_, names)| names.lock().ok());
            let info = error_info(&e, names.as_ref().and_then(|n| n.as_ref()));
            (e.kind().exit_code(), None, Vec::new(), Some(info))
        }
        Err(what) => {
            let (code, info) = panicked(&what);
            (code, None, Vec::new(), Some(info))
        }
    })
}

/// The capacity a replaying question is asked under (`None`: the recorded limit).
fn capacity_of(capacity: Option<&str>) -> Result<Option<Capacity>> {
    capacity.map(|c| param("capacity", c, Capacity::parse)).transpose()
}

/// How `blame` and `diff` group live bytes: `by`, the `top` groups listed, keys of `depth` frames
/// (each default as the command's), at blame's default moment.
fn grouping(by: Option<&str>, top: Option<usize>, depth: Option<usize>) -> Result<BlameOptions> {
    let defaults = BlameOptions::default();
    let by = by.map(|b| choice("by", b, GroupBy::parse)).transpose()?;
    let depth = depth.unwrap_or(defaults.depth);
    fragsim::blame::check_depth(depth)?;
    Ok(BlameOptions {
        by: by.unwrap_or(defaults.by),
        top: top.unwrap_or(defaults.top),
        depth,
        ..defaults
    })
}

/// A parameter parsed by `parse`; its error names the parameter as Python spells it.
fn param<T>(
    name: &str,
    text: &str,
    parse: impl FnOnce(&str) -> std::result::Result<T, String>,
) -> Result<T> {
    parse(text).map_err(|e| Error::usage(format!("{name}={text}: {e}")))
}

/// A parameter that names one of a few choices: its error says the value is not one of them.
fn choice<T>(
    name: &str,
    text: &str,
    parse: impl FnOnce(&str) -> std::result::Result<T, String>,
) -> Result<T> {
    parse(text).map_err(|e| Error::usage(format!("{name}={text} is not valid: {e}")))
}

/// `written` (`default` where empty) with `pytorch_version=` applied to each PyTorch spec, as
/// the command line's `--pytorch-version` applies it ([`PolicySpec::at_version`]); `written` as
/// it is without one. A version fragsim does not model is an error naming the parameter.
fn versioned(written: &[String], default: &[&str], version: Option<&str>) -> Result<Vec<String>> {
    let Some(v) = version else { return Ok(written.to_vec()) };
    param("pytorch_version", v, |t| Version::parse(t).map_err(|e| e.message().into()))?;
    PolicySpec::at_version(written, default, v)
}

/// A size parameter (`"40GiB"`, or an int of bytes as text).
fn size(name: &str, text: &str) -> Result<u64> {
    param(name, text, |t| fragsim::units::parse_size(t).map_err(|e| e.message().to_string()))
}
