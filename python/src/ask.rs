//! The questions Python asks the library's [`Session`] directly, with typed parameters and no
//! command line between: `fragsim.replay` and `fragsim.explain` (and `Trace`'s methods of those
//! names). Each builds a session on a [`Loaded`] trace (shared, not copied), asks it, and hands
//! back the answer as the JSON the command prints with `--format json`, the notes the command
//! prints on stderr, or the error; the pure-Python layer wraps them as it wraps a command's.

use crate::loaded::Loaded;
use crate::{error_info, off_thread, panicked, ErrorInfo};
use fragsim::error::{Error, Result};
use fragsim::explain::ExplainOptions;
use fragsim::policy::{planners, PolicySpec};
use fragsim::replay::{Cancel, EmptyCachePlan, Jobs, ReplayOptions, RunSettings};
use fragsim::session::{loaded_for_planners, Capacity, ReplayRequest, Session};
use pyo3::prelude::*;
use std::path::Path;

/// A question's answer: the exit code, the JSON text, the notes, and the error, if it failed.
type Answer = (u8, Option<String>, Vec<String>, Option<ErrorInfo>);

/// Where a question's session comes from: the trace, its name in answers and errors, the device,
/// the most bytes it may read, and whether a `.fst` file may stream.
struct On {
    trace: Loaded,
    name: String,
    device: Option<i32>,
    max_input: Option<u64>,
    stream: bool,
}

impl On {
    /// The session, reading the trace (with stack frames when `frames`) if it is not kept yet.
    fn session(&self, frames: bool, cancel: &Cancel) -> Result<Session> {
        self.trace.session(&self.name, self.device, frames, self.stream, self.max_input, cancel)
    }
}

/// `fragsim replay`'s answer: each spec replayed on the device, the recorded row beside them.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, policies, device=None, capacity=None, empty_cache_every=None,
    empty_cache_at=Vec::new(), no_recorded_empty_cache=false, outside=None, jobs=None,
    max_input_size=None, stream=false,
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
    stream: bool,
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), stream);
    ask(py, on, move |on, cancel| {
        let specs = PolicySpec::parse_many(&policies)?;
        let capacity = capacity.as_deref().map(|c| param("capacity", c, Capacity::parse));
        let capacity = capacity.transpose()?;
        let outside = outside.as_deref().map(|o| size("outside", o)).transpose()?;
        let empty_cache =
            EmptyCachePlan::new(empty_cache_every, empty_cache_at, no_recorded_empty_cache)?;
        let planners = planners(&specs);
        let mut notes = Vec::new();
        if on.stream && !planners.is_empty() && on.trace.streams()? {
            notes.push(loaded_for_planners(&planners, Path::new(&on.name)));
        }
        let on = On { stream: on.stream && planners.is_empty(), ..on };
        let session = on.session(capacity.is_some(), &cancel)?;
        notes.extend(notes_of(&session, &specs));
        let (bounded, lowered) = Jobs::bounded(jobs, specs.len());
        notes.extend(lowered.map(|why| {
            let at_once = bounded.count().unwrap_or(1);
            format!("note: jobs={}: running {at_once} at once ({why})", jobs.unwrap_or(0))
        }));
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
        Ok((String::from_utf8_lossy(&json).into_owned(), notes))
    })
}

/// `fragsim explain`'s answer: the verdict at the moment, the free memory by kind, the fixes.
#[pyfunction]
#[pyo3(signature = (
    trace, name, *, policy=None, at=None, capacity=None, device=None, top=10, fixes=true,
    max_input_size=None,
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
) -> PyResult<Answer> {
    let on = on(trace, name, device, max_input_size.as_deref(), false);
    ask(py, on, move |on, cancel| {
        let spec = ExplainOptions::one_spec(policy.as_slice())?;
        let at = ExplainOptions::moment(at.as_deref())?;
        let capacity = capacity.as_deref().map(|c| param("capacity", c, Capacity::parse));
        let capacity = capacity.transpose()?;
        let session = on.session(true, &cancel)?;
        let notes = notes_of(&session, std::slice::from_ref(&spec));
        let mut replay = session.replay_options(capacity.as_ref(), EmptyCachePlan::default())?;
        replay.cancel = cancel;
        let options = ExplainOptions { at, spec, replay, top, fixes };
        let e = session.explain(&options)?;
        let json = serde_json::to_string_pretty(&e)
            .map_err(|e| Error::input(format!("the answer as JSON: {e}")))?;
        Ok((json + "\n", notes))
    })
}

/// What a question reads, the size limit parsed later (its error is the question's).
fn on(
    trace: &Bound<'_, Loaded>,
    name: String,
    device: Option<i32>,
    max_input_size: Option<&str>,
    stream: bool,
) -> (On, Option<String>) {
    let on = On { trace: trace.get().clone(), name, device, max_input: None, stream };
    (on, max_input_size.map(str::to_string))
}

/// Asks `question` on a thread of its own (the GIL released, Ctrl-C heard, a panic caught) and
/// turns its outcome into an [`Answer`], naming a snapshot dict's places by their keys.
fn ask(
    py: Python<'_>,
    (on, max_input): (On, Option<String>),
    question: impl FnOnce(On, Cancel) -> Result<(String, Vec<String>)> + Send + 'static,
) -> PyResult<Answer> {
    let names = on.trace.names.clone();
    let cancel = Cancel::new();
    let stop = cancel.clone();
    let job = move || -> Result<(String, Vec<String>)> {
        let max_input = max_input.as_deref().map(|m| size("max_input_size", m)).transpose()?;
        question(On { max_input, ..on }, cancel)
    };
    Ok(match off_thread(py, &stop, job)? {
        Ok(Ok((json, notes))) => (0, Some(json), notes, None),
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

/// A size parameter (`"40GiB"`, or an int of bytes as text).
fn size(name: &str, text: &str) -> Result<u64> {
    param(name, text, |t| fragsim::units::parse_size(t).map_err(|e| e.message().to_string()))
}
