//! The questions Python asks the library's [`Session`] directly, with typed parameters and no
//! command line between: `fragsim.info`, `replay`, `explain`, `fit`, `blame`, `diff` and
//! `validate` (and `Trace`'s methods of those names). Each builds a session on a [`Loaded`] trace (shared, not copied), asks it, and hands
//! back the answer as the JSON the command prints with `--format json`, the notes the command
//! prints on stderr, or the error; the pure-Python layer wraps them as it wraps a command's.

use crate::loaded::Loaded;
use crate::{error_info, off_thread, panicked, ErrorInfo};
use fragsim::blame::diff::{compare, pair_specs};
use fragsim::blame::{BlameOptions, GroupBy, Moment};
use fragsim::error::{Error, Result};
use fragsim::explain::ExplainOptions;
use fragsim::policy::pytorch::config::{Flavour, Version};
use fragsim::policy::{planners, PolicySpec};
use fragsim::replay::{Cancel, EmptyCachePlan, Jobs, ReplayOptions, RunSettings};
use fragsim::session::{loaded_for_planners, Capacity, ReplayRequest, Session};
use fragsim::validate::ValidateOptions;
use fragsim::whatif::fit::{DEFAULT_OUTSIDE, DEFAULT_POLICIES};
use pyo3::prelude::*;
use std::path::Path;

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

/// Where a question's session comes from: the trace, its name in answers and errors, the device,
/// the most bytes it may read, and whether it is read for this question alone (a path given to a
/// function, not a loaded trace: read from the file, not kept, and a `.fst` file may stream).
struct On {
    trace: Loaded,
    name: String,
    device: Option<i32>,
    max_input: Option<u64>,
    once: bool,
}

impl On {
    /// The session, reading the trace (with stack frames when `frames`) if it is not kept yet;
    /// a `.fst` file read once streams when `stream`.
    fn session(&self, frames: bool, stream: bool, cancel: &Cancel) -> Result<Session> {
        let (name, max) = (&self.name, self.max_input);
        self.trace.session(name, self.device, frames, self.once, stream, max, cancel)
    }
}

/// `fragsim replay`'s answer: each spec replayed on the device, the recorded row beside them.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, policies, device=None, capacity=None, empty_cache_every=None,
    empty_cache_at=Vec::new(), no_recorded_empty_cache=false, outside=None, jobs=None,
    max_input_size=None, once=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn replay(
    py: Python<'_>,
    trace: &Bound<'_, Loaded>,
    name: String,
    policies: Vec<String>,
    device: Option<i32>,
    capacity: Option<String>,
    empty_cache_every: Option<u64>,
    empty_cache_at: Vec<u64>,
    no_recorded_empty_cache: bool,
    outside: Option<String>,
    jobs: Option<usize>,
    max_input_size: Option<String>,
    once: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), once);
    ask(py, on, move |on, cancel| {
        let specs = PolicySpec::parse_many(&policies)?;
        let capacity = capacity.as_deref().map(|c| param("capacity", c, Capacity::parse));
        let capacity = capacity.transpose()?;
        let outside = outside.as_deref().map(|o| size("outside", o)).transpose()?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let planners = planners(&specs);
        let mut notes = Vec::new();
        if on.once && !planners.is_empty() && on.trace.streams()? {
            notes.push(loaded_for_planners(&planners, Path::new(&on.name)));
        }
        let session = on.session(capacity.is_some(), planners.is_empty(), &cancel)?;
        notes.extend(notes_of(&session, &specs));
        let bounded = bounded_jobs(jobs, specs.len(), &mut notes);
        let request = ReplayRequest {
            specs,
            capacity,
            options: ReplayOptions {
                empty_cache,
                outside_bytes: outside.unwrap_or(0),
                cancel,
                ..ReplayOptions::default()
            },
            empty_cache_price: false,
        };
        let settings = RunSettings { jobs: bounded, ..RunSettings::default() };
        let answer = session.replay(&request, &settings)?;
        let mut json = Vec::new();
        fragsim::report::json::write(&answer.report(&on.name), &mut json)?;
        Ok(Answered { code: 0, json: String::from_utf8_lossy(&json).into_owned(), notes })
    })
}

/// `fragsim explain`'s answer: the verdict at the moment, the free memory by kind, the fixes.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, policy=None, at=None, capacity=None, device=None, top=10, fixes=true,
    max_input_size=None, once=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn explain(
    py: Python<'_>,
    trace: &Bound<'_, Loaded>,
    name: String,
    policy: Option<String>,
    at: Option<String>,
    capacity: Option<String>,
    device: Option<i32>,
    top: usize,
    fixes: bool,
    max_input_size: Option<String>,
    once: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), once);
    ask(py, on, move |on, cancel| {
        let spec = ExplainOptions::one_spec(policy.as_slice())?;
        let at = ExplainOptions::moment(at.as_deref())?;
        let capacity = capacity.as_deref().map(|c| param("capacity", c, Capacity::parse));
        let capacity = capacity.transpose()?;
        let session = on.session(true, false, &cancel)?;
        let notes = notes_of(&session, std::slice::from_ref(&spec));
        let mut replay = session.replay_options(capacity.as_ref(), EmptyCachePlan::default())?;
        replay.cancel = cancel;
        let options = ExplainOptions { at, spec, replay, top, fixes };
        Answered::of(&session.explain(&options)?, notes)
    })
}

/// `fragsim info`'s answer: what the trace holds.
#[pyfunction]
#[pyo3(signature = (trace, name, *, max_input_size=None, once=false))]
pub fn info(
    py: Python<'_>,
    trace: &Bound<'_, Loaded>,
    name: String,
    max_input_size: Option<String>,
    once: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, None, max_input_size.as_deref(), once);
    ask(py, on, move |on, cancel| {
        let trace = on.trace.trace(&on.name, on.once, on.max_input, &cancel)?;
        let notes = trace.no_history_note(Path::new(&on.name)).into_iter().collect();
        Answered::of(&fragsim::session::info(&trace), notes)
    })
}

/// `fragsim fit`'s answer: per policy, the least device memory with no OOM, and the cards.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, policies, device=None, outside=None, jobs=None, max_input_size=None, once=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn fit(
    py: Python<'_>,
    trace: &Bound<'_, Loaded>,
    name: String,
    policies: Vec<String>,
    device: Option<i32>,
    outside: Option<String>,
    jobs: Option<usize>,
    max_input_size: Option<String>,
    once: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), once);
    ask(py, on, move |on, cancel| {
        let policies = if policies.is_empty() {
            DEFAULT_POLICIES.iter().map(|s| s.to_string()).collect()
        } else {
            policies
        };
        let specs = PolicySpec::parse_many(&policies)?;
        let outside = outside.as_deref().map(|o| size("outside", o)).transpose()?;
        let session = on.session(false, false, &cancel)?;
        let mut notes = notes_of(&session, &specs);
        let jobs = bounded_jobs(jobs, specs.len(), &mut notes);
        let outside = outside.unwrap_or(DEFAULT_OUTSIDE);
        let settings = RunSettings::default();
        let report = jobs.install(|| session.fit(&specs, outside, &cancel, &settings))??;
        Answered::of(&report, notes)
    })
}

/// `fragsim blame`'s answer: who holds the memory at a moment of each policy's replay.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, policies, device=None, capacity=None, at=None, by=None, top=None,
    depth=None, empty_cache_every=None, empty_cache_at=Vec::new(),
    no_recorded_empty_cache=false, jobs=None, max_input_size=None, once=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn blame(
    py: Python<'_>,
    trace: &Bound<'_, Loaded>,
    name: String,
    policies: Vec<String>,
    device: Option<i32>,
    capacity: Option<String>,
    at: Option<String>,
    by: Option<String>,
    top: Option<usize>,
    depth: Option<usize>,
    empty_cache_every: Option<u64>,
    empty_cache_at: Vec<u64>,
    no_recorded_empty_cache: bool,
    jobs: Option<usize>,
    max_input_size: Option<String>,
    once: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), once);
    ask(py, on, move |on, cancel| {
        let specs = PolicySpec::parse_many(&policies)?;
        let defaults = BlameOptions::default();
        let at = at.as_deref().map(Moment::parse).transpose()?.unwrap_or(defaults.at);
        let by = by.as_deref().map(|b| choice("by", b, GroupBy::parse)).transpose()?;
        let depth = depth.unwrap_or(defaults.depth);
        fragsim::blame::check_depth(depth)?;
        let capacity = capacity.as_deref().map(|c| param("capacity", c, Capacity::parse));
        let capacity = capacity.transpose()?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let session = on.session(true, false, &cancel)?;
        let mut notes = notes_of(&session, &specs);
        let mut replay = session.replay_options(capacity.as_ref(), empty_cache)?;
        replay.cancel = cancel;
        let options = BlameOptions {
            at,
            by: by.unwrap_or(defaults.by),
            top: top.unwrap_or(defaults.top),
            depth,
            replay,
        };
        let jobs = bounded_jobs(jobs, specs.len(), &mut notes);
        let report = jobs.install(|| session.blame(&specs, &options))??;
        Answered::of(&report, notes)
    })
}

/// `fragsim diff`'s answer: two runs side by side (two traces, or one under two policies),
/// each at its peak-live moment, and what changed by site.
#[pyfunction]
#[pyo3(signature = (
    a, name_a, b=None, name_b=None, *, policies, device=None, by=None, top=None, depth=None,
    jobs=None, max_input_size=None, once_a=false, once_b=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn diff(
    py: Python<'_>,
    a: &Bound<'_, Loaded>,
    name_a: String,
    b: Option<&Bound<'_, Loaded>>,
    name_b: Option<String>,
    policies: Vec<String>,
    device: Option<i32>,
    by: Option<String>,
    top: Option<usize>,
    depth: Option<usize>,
    jobs: Option<usize>,
    max_input_size: Option<String>,
    once_a: bool,
    once_b: bool,
) -> PyResult<Answer> {
    let on_b = b.map(|b| {
        let name = name_b.unwrap_or_else(|| "<B>".into());
        On { trace: b.get().clone(), name, device, max_input: None, once: once_b }
    });
    let on_a = on(a, name_a, device, max_input_size.as_deref(), once_a);
    ask(py, on_a, move |on_a, cancel| {
        let (spec_a, spec_b) = pair_specs(&policies, on_b.is_some())?;
        let defaults = BlameOptions::default();
        let by = by.as_deref().map(|b| choice("by", b, GroupBy::parse)).transpose()?;
        let depth = depth.unwrap_or(defaults.depth);
        fragsim::blame::check_depth(depth)?;
        let options = BlameOptions {
            at: Moment::PeakLive,
            by: by.unwrap_or(defaults.by),
            top: top.unwrap_or(defaults.top),
            depth,
            ..defaults
        };
        let mut notes = Vec::new();
        let jobs = bounded_jobs(jobs, 1, &mut notes);
        let side = |session: &Session, spec: &PolicySpec| {
            jobs.install(|| session.diff_side(spec, &options))?
        };
        // One trace at a time: A is summarised and dropped before B is read, as the command
        // line does, so two large traces are never held at once.
        let session_a = on_a.session(true, false, &cancel)?;
        notes.extend(session_a.trace().no_history_note(session_a.name()));
        let side_a = side(&session_a, &spec_a)?;
        let side_b = match on_b {
            Some(on_b) => {
                drop(session_a);
                let on_b = On { max_input: on_a.max_input, ..on_b };
                let session_b = on_b.session(true, false, &cancel)?;
                notes.extend(session_b.trace().no_history_note(session_b.name()));
                side(&session_b, &spec_b)?
            }
            None => side(&session_a, &spec_b)?,
        };
        let (report, _) = compare(&side_a, &side_b, &options);
        Answered::of(&report, notes)
    })
}

/// `fragsim validate`'s answer: the PyTorch policy's decisions against the recording's; exit
/// code 1 where one differs.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, device=None, gpu_mem=None, pytorch_version=None, policy=None,
    max_input_size=None, once=false,
))]
#[allow(clippy::too_many_arguments)]
pub fn validate(
    py: Python<'_>,
    trace: &Bound<'_, Loaded>,
    name: String,
    device: Option<i32>,
    gpu_mem: Option<String>,
    pytorch_version: Option<String>,
    policy: Option<String>,
    max_input_size: Option<String>,
    once: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), once);
    ask(py, on, move |on, cancel| {
        let gpu_memory = gpu_mem.as_deref().map(|g| size("gpu_mem", g)).transpose()?;
        let version = pytorch_version.as_deref().map(|v| {
            param("pytorch_version", v, |t| Version::parse(t).map_err(|e| e.message().into()))
        });
        let version = version.transpose()?;
        let flavour = policy.as_deref().map(|p| param("policy", p, Flavour::rules)).transpose()?;
        let session = on.session(false, false, &cancel)?;
        let notes = notes_of(&session, &[]);
        let options = ValidateOptions {
            device,
            gpu_memory,
            version,
            record_events: false,
            check_invariants: false,
            flavour: flavour.flatten(),
            cancel,
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

/// What a question reads, the size limit parsed later (its error is the question's).
fn on(
    trace: &Bound<'_, Loaded>,
    name: String,
    device: Option<i32>,
    max_input_size: Option<&str>,
    once: bool,
) -> (On, Option<String>) {
    let on = On { trace: trace.get().clone(), name, device, max_input: None, once };
    (on, max_input_size.map(str::to_string))
}

/// Asks `question` on a thread of its own (the GIL released, Ctrl-C heard, a panic caught) and
/// turns its outcome into an [`Answer`], naming a snapshot dict's places by their keys.
fn ask(
    py: Python<'_>,
    (on, max_input): (On, Option<String>),
    question: impl FnOnce(On, Cancel) -> Result<Answered> + Send + 'static,
) -> PyResult<Answer> {
    let names = on.trace.names.clone();
    let cancel = Cancel::new();
    let stop = cancel.clone();
    let job = move || -> Result<Answered> {
        let max_input = max_input.as_deref().map(|m| size("max_input_size", m)).transpose()?;
        question(On { max_input, ..on }, cancel)
    };
    Ok(match off_thread(py, &stop, job)? {
        Ok(Ok(Answered { code, json, notes })) => (code, Some(json), notes, None),
        Ok(Err(e)) => {
            let names = names.lock().ok();
            let info = error_info(&e, names.as_ref().and_then(|n| n.as_ref()));
            (e.kind().exit_code(), None, Vec::new(), Some(info))
        }
        Err(what) => {
            let (code, info) = panicked(&what);
            (code, None, Vec::new(), Some(info))
        }
    })
}

/// The notes the command line prints before the answer: no memory history, and the session's
/// own ([`Session::notes`]), each as `fragsim: ...` would end.
fn notes_of(session: &Session, specs: &[PolicySpec]) -> Vec<String> {
    let history = session.trace().no_history_note(session.name());
    history.into_iter().chain(session.notes(specs)).collect()
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

/// A size parameter (`"40GiB"`, or an int of bytes as text).
fn size(name: &str, text: &str) -> Result<u64> {
    param(name, text, |t| fragsim::units::parse_size(t).map_err(|e| e.message().to_string()))
}
