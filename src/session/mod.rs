//! A session: one trace read once (or opened to stream), its device chosen, and what the
//! recording says about it at hand, with one method per question. The command line and the
//! Python package are faces on it: each turns its arguments into a session and a request, and
//! prints or wraps the typed answer.
//!
//! ```
//! use fragsim::policy::PolicySpec;
//! use fragsim::session::{ReplayRequest, Session};
//!
//! let text = "alloc 0x1000 4096 s0\nalloc 0x2000 1000 s0\nfree 0x1000 4096 s0\n";
//! let trace = fragsim::trace::read_bytes(
//!     text.as_bytes(),
//!     fragsim::trace::Format::Text,
//!     &Default::default(),
//! )?;
//! let session = Session::of_trace(trace, "steps.txt", None)?;
//! let request = ReplayRequest::new(PolicySpec::parse_list("bound")?);
//! let answer = session.replay(&request, &Default::default())?;
//! assert_eq!(answer.results[0].peak_reserved_bytes, 5096);
//! # Ok::<(), fragsim::Error>(())
//! ```
//!
//! A session holds the trace, not a [`ReplayInput`]: the input borrows the trace, so each
//! question builds its own (one pass over a loaded device's events, two over a streamed file)
//! and drops it with its answer. What every question reads — the device, the recorded row and
//! the device limit the recording implies — is found once and kept.

pub mod capacity;
mod info;
mod notes;
pub mod several;

pub use info::{info, start_figures};
pub use notes::loaded_for_planners;

pub use capacity::{Capacity, Resolved};

use crate::blame::diff::{Side, SideSummary};
use crate::blame::{self, BlameOptions, BlameReport};
use crate::error::{Error, ErrorKind, Result};
use crate::explain::{ExplainOptions, Explanation};
use crate::metrics::PolicyResult;
use crate::policy::PolicySpec;
use crate::recorded::limit::DeviceLimit;
use crate::recorded::RecordedRow;
use crate::replay::{
    empty_cache, run_specs, Cancel, Comparison, EmptyCachePlan, Jobs, ReplayInput, ReplayOptions,
    RunSettings, SpecRun,
};
use crate::trace::fst::FstStream;
use crate::trace::{ReadOptions, Trace};
use crate::validate::{ValidateOptions, Validation};
use crate::whatif::fit::{FitReport, PolicyFit};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// One trace and the device its questions are about.
pub struct Session {
    /// The trace's name, as given (a path, or what stands for an in-memory trace): errors and
    /// answers name it.
    name: PathBuf,
    /// The events, in memory or in a file read again for each pass.
    data: Data,
    /// The device asked about.
    device: i32,
    /// What the recording says of the device, found when first asked.
    recording: OnceLock<Recording>,
}

/// Where a session's events are.
enum Data {
    /// Read once, held in memory; shared with whoever else holds it (a Python `Trace` keeps one
    /// for all its questions), never copied.
    Loaded(Arc<Trace>),
    /// An uncompressed `.fst` file, read again for each pass: memory follows the blocks live at
    /// once, not the trace's length.
    Streamed(Box<FstStream>),
}

/// What a recording says of its device: the recorded run as a row beside the policies', and the
/// device limit it implies.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// The recorded run, where the trace carries the allocator's figures.
    pub row: Option<RecordedRow>,
    /// The device limit the recording implies, where it records allocator figures.
    pub limit: Option<DeviceLimit>,
}

/// How [`Session::open`] reads a trace.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// The device (default: the one with the most events).
    pub device: Option<i32>,
    /// Keep stack frames (sites for `blame`, `diff`, `explain`; an OOM's stack).
    pub keep_frames: bool,
    /// Stream an uncompressed `.fst` file instead of loading it, where the file allows it.
    pub stream: bool,
    /// How the reader is bounded and told to stop.
    pub read: ReadOptions,
}

impl Session {
    /// Reads the trace at `path` (any format; an uncompressed `.fst` is streamed when
    /// `options.stream`) and picks the device.
    pub fn open(path: &Path, options: &OpenOptions) -> Result<Session> {
        if options.stream {
            if let Some(file) = FstStream::open(path)? {
                return Session::streamed(file, path, options.device);
            }
        }
        let read = ReadOptions { keep_frames: options.keep_frames, ..options.read.clone() };
        let trace = crate::trace::read_trace(path, &read)?;
        Session::of_trace(trace, path, options.device)
    }

    /// A session on a trace already read, under `name`: a [`Trace`], or an `Arc<Trace>` its
    /// holder keeps for other sessions (nothing is copied).
    pub fn of_trace(
        trace: impl Into<Arc<Trace>>,
        name: impl Into<PathBuf>,
        device: Option<i32>,
    ) -> Result<Session> {
        let (trace, name) = (trace.into(), name.into());
        let have = || trace.devices.iter().map(|d| d.device).collect::<Vec<_>>();
        let device = crate::replay::input::pick_device(device, trace.default_device(), have)
            .map_err(|e| name_error(&name, &trace, e).in_file(&name))?;
        Ok(Session { name, data: Data::Loaded(trace), device, recording: OnceLock::new() })
    }

    /// A session streaming an opened `.fst` file.
    pub fn streamed(
        file: FstStream,
        name: impl Into<PathBuf>,
        device: Option<i32>,
    ) -> Result<Session> {
        let name = name.into();
        let have = || file.devices().into_iter().map(|d| d.0).collect::<Vec<_>>();
        let device = crate::replay::input::pick_device(device, file.default_device(), have)
            .map_err(|e| name_error(&name, file.head(), e).in_file(&name))?;
        Ok(Session {
            name,
            data: Data::Streamed(Box::new(file)),
            device,
            recording: OnceLock::new(),
        })
    }

    /// The trace's name, as given.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// The device the questions are about.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The trace: everything but a streamed file's events (which stay in the file).
    pub fn trace(&self) -> &Trace {
        match &self.data {
            Data::Loaded(t) => t,
            Data::Streamed(f) => f.head(),
        }
    }

    /// [`Trace::no_history_note`] of the session's trace under its name, a streamed file's too
    /// (whose events stay in the file: it has none where the file counts none).
    pub fn no_history_note(&self) -> Option<String> {
        match &self.data {
            Data::Loaded(t) => t.no_history_note(&self.name),
            Data::Streamed(f) => f
                .devices()
                .iter()
                .all(|&(_, events)| events == 0)
                .then(|| f.head().no_history_note(&self.name))
                .flatten(),
        }
    }

    /// Whether the events stay in a file, read again for each pass.
    pub fn is_streamed(&self) -> bool {
        matches!(self.data, Data::Streamed(_))
    }

    /// The device's events ready to replay: built for each question (see the module docs).
    pub fn input(&self) -> Result<ReplayInput<'_>> {
        match &self.data {
            Data::Loaded(t) => ReplayInput::new(t, Some(self.device)),
            Data::Streamed(f) => ReplayInput::streamed(f, Some(self.device)),
        }
        .map_err(|e| self.named(e))
    }

    /// Names the trace (and its format, for an input problem) on an error raised by a question,
    /// so every message says where.
    pub(crate) fn named(&self, e: Error) -> Error {
        name_error(&self.name, self.trace(), e)
    }

    /// What the recording says of the device (read once; a streamed file is read once more).
    pub(crate) fn recording(&self) -> Result<&Recording> {
        if let Some(r) = self.recording.get() {
            return Ok(r);
        }
        let found = match &self.data {
            Data::Loaded(t) => {
                let (row, limit) = crate::recorded::row_and_limit(t, self.device);
                Recording { row, limit }
            }
            Data::Streamed(_) => {
                let input = self.input()?;
                self.recording_streamed(&input)?
            }
        };
        Ok(self.recording.get_or_init(|| found))
    }

    /// [`Session::recording`] of a streamed file with its input already built (one pass fewer).
    fn recording_of(&self, input: &ReplayInput) -> Result<&Recording> {
        if let (Data::Streamed(_), None) = (&self.data, self.recording.get()) {
            let found = self.recording_streamed(input)?;
            return Ok(self.recording.get_or_init(|| found));
        }
        self.recording()
    }

    fn recording_streamed(&self, input: &ReplayInput) -> Result<Recording> {
        let Data::Streamed(file) = &self.data else { return Ok(Recording::default()) };
        let (row, limit) = crate::recorded::row_and_limit_streamed(
            file.head(),
            input.device(),
            input.live_at_start(),
            input.frees_at(),
            |f| file.each_event(input.device(), u64::MAX, false, f),
        )
        .map_err(|e| self.named(e))?;
        Ok(Recording { row, limit })
    }

    /// The capacity `asked` resolves to on this recording (`Resolved::of`); the recording is
    /// read only where the answer depends on it.
    pub fn capacity(&self, asked: Option<&Capacity>) -> Result<Resolved> {
        let limit =
            if Capacity::reads_recording(asked) { self.recording()?.limit.as_ref() } else { None };
        Resolved::of(asked, limit).map_err(|e| e.in_file(&self.name))
    }

    /// The replay options of a question asked under `asked` capacity with the `empty_cache`
    /// what-if `plan`, as `replay` resolves them.
    pub fn replay_options(
        &self,
        asked: Option<&Capacity>,
        plan: EmptyCachePlan,
    ) -> Result<ReplayOptions> {
        let c = self.capacity(asked)?;
        Ok(ReplayOptions {
            capacity: c.bytes,
            capacity_kind: c.kind,
            empty_cache: plan,
            ..ReplayOptions::default()
        })
    }

    /// The stack of the session device's event `event` as an OOM shows it (memory_viz's order,
    /// the user's frames first); empty where the trace was read without frames or has none.
    /// A replay read without frames (they cost time on a large snapshot) fills its OOMs'
    /// stacks from a session read with them, once one ran out.
    pub fn stack_of(&self, event: u64) -> Vec<String> {
        let trace = self.trace();
        let found = trace.device(self.device).and_then(|d| d.events.get(event as usize));
        found.map(|e| crate::trace::sites::display(trace.frames.get(e.frames))).unwrap_or_default()
    }

    fn loaded(&self, question: &str) -> Result<&Trace> {
        match &self.data {
            Data::Loaded(t) => Ok(t),
            Data::Streamed(_) => Err(Error::usage(format!(
                "{question} reads the events more than once by index: open the trace without \
                 streaming"
            ))
            .in_file(&self.name)),
        }
    }

    /// Replays the request's specs on the device: one row per spec, the recorded run beside
    /// them, under the capacity the request resolves to.
    pub fn replay(&self, request: &ReplayRequest, settings: &RunSettings) -> Result<ReplayAnswer> {
        let input = self.input()?;
        let recording = self.recording_of(&input)?;
        let capacity = Resolved::of(request.capacity.as_ref(), recording.limit.as_ref())
            .map_err(|e| e.in_file(&self.name))?;
        let options = ReplayOptions {
            capacity: capacity.bytes,
            capacity_kind: capacity.kind,
            ..request.options.clone()
        };
        let comparison =
            run_specs(&request.specs, &input, &options, settings).map_err(|e| self.named(e))?;
        // The what-if's price: the same specs with the recorded empty_cache() calls only.
        let empty_cache_effects = if request.empty_cache_price
            && !options.empty_cache.is_recorded_only()
        {
            let plain = ReplayOptions { empty_cache: EmptyCachePlan::default(), ..options.clone() };
            let baseline = RunSettings { jobs: settings.jobs, ..RunSettings::default() };
            let base =
                run_specs(&request.specs, &input, &plain, &baseline).map_err(|e| self.named(e))?;
            Some(empty_cache::describe(
                &options.empty_cache,
                &empty_cache::effects(&base, &comparison),
            ))
        } else {
            None
        };
        Ok(ReplayAnswer {
            format: input.trace().format.name(),
            device: input.device(),
            events: input.event_count(),
            results: comparison.results(),
            comparison,
            recorded: recording.row.clone(),
            limit: recording.limit.clone(),
            capacity,
            empty_cache_effects,
        })
    }

    /// The simulated run of `spec` under `options`, recorded as events, from a cold cache (every
    /// block live at the start allocated anew): what `--export-snapshot` writes.
    pub fn replay_recorded(&self, spec: &PolicySpec, options: &ReplayOptions) -> Result<SpecRun> {
        let input = self.input()?;
        let settings = RunSettings {
            jobs: Jobs::Sequential,
            record_events_of: Some(0),
            ..RunSettings::default()
        };
        let mut runs = run_specs(std::slice::from_ref(spec), &input, options, &settings)
            .map_err(|e| self.named(e))?;
        runs.runs.pop().ok_or_else(|| Error::usage(format!("{} did not run", spec.display())))
    }

    /// Writes the simulated run `run` of this session's device as a PyTorch snapshot; returns
    /// what the file cannot show of the recording, one note each
    /// ([`crate::report::snapshot_out::write_simulated`]).
    pub fn write_snapshot(&self, run: &SpecRun, out: &Path) -> Result<Vec<String>> {
        crate::report::snapshot_out::write_simulated(self.trace(), self.device, &run.output, out)
    }

    /// Per spec, the least device memory it replays in without an OOM, beside the common cards
    /// with `outside` bytes used outside the allocator ([`crate::whatif::fit::fit_policy`]).
    /// The specs are searched in parallel (in rayon's current pool); `settings.progress` is
    /// told as each search ends.
    pub fn fit(
        &self,
        specs: &[PolicySpec],
        outside: u64,
        cancel: &Cancel,
        settings: &RunSettings,
    ) -> Result<FitReport> {
        use rayon::prelude::*;
        let input = self.input()?;
        let done = std::sync::atomic::AtomicUsize::new(0);
        let outcomes: Vec<Result<PolicyFit>> = specs
            .par_iter()
            .map(|s| {
                let r = crate::whatif::fit::fit_policy(s, &input, outside, cancel);
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if let Some(progress) = settings.progress {
                    progress(n, specs.len());
                }
                r
            })
            .collect();
        // A recorded setting the policy cannot read names the trace's file.
        let results =
            outcomes.into_iter().collect::<Result<Vec<_>>>().map_err(|e| self.named(e))?;
        Ok(FitReport {
            trace: self.name.display().to_string(),
            device: input.device(),
            outside_bytes: outside,
            host_memory: input.device() < 0,
            recorded_limit_bytes: self
                .recording_of(&input)?
                .limit
                .as_ref()
                .and_then(|l| l.limit_bytes),
            results,
        })
    }

    /// At a moment of each spec's replay, reserved bytes by allocation site
    /// (`blame::blame`), the recorded run first where the trace records its layout.
    pub fn blame(&self, specs: &[PolicySpec], options: &BlameOptions) -> Result<BlameReport> {
        self.loaded("blame")?;
        let input = self.input()?;
        let results = blame::blame(&input, specs, options).map_err(|e| self.named(e))?;
        Ok(BlameReport {
            trace: self.name.display().to_string(),
            device: input.device(),
            by: options.by,
            site_rule: blame::site_rule(&input),
            results,
        })
    }

    /// The live bytes of one of `blame`'s runs by full stack as a flame graph (SVG), titled: the
    /// first run, or with `replayed` the first policy's replay (the recorded run, which comes
    /// first, is drawn only where it is the one run: a user who named policies asked about them).
    pub fn flame_graph(&self, report: &BlameReport, replayed: bool) -> Result<Option<String>> {
        let is_recorded = |r: &&blame::Attribution| r.policy == crate::recorded::POLICY_NAME;
        let drawn = match replayed {
            true => report.results.iter().find(|r| !is_recorded(r)),
            false => None,
        };
        let Some(first) = drawn.or(report.results.first()) else { return Ok(None) };
        let title = format!(
            "live bytes at {} (event {}), {}: {}",
            first.moment.kind,
            first.moment.event,
            first.policy,
            self.name.display()
        );
        blame::flame::svg_of(first, self.trace(), &title).map(Some).map_err(|e| self.named(e))
    }

    /// One run of a `diff`: this trace replayed under `spec`, summarised
    /// (`crate::blame::diff::summarize`) so that the session can be dropped before the other
    /// run's trace is read. Sites are read at the run's peak-live moment.
    pub fn diff_side(&self, spec: &PolicySpec, options: &BlameOptions) -> Result<SideSummary> {
        self.with_side(spec, |side| crate::blame::diff::summarize(side, options))
    }

    /// One run of a `diff`'s charts: its memory over time ([`crate::report::overlay::side`]).
    #[cfg(feature = "charts")]
    pub fn diff_lines(
        &self,
        spec: &PolicySpec,
        options: &BlameOptions,
    ) -> Result<crate::report::overlay::SideLines> {
        self.with_side(spec, |side| crate::report::overlay::side(side, options))
    }

    /// Calls `f` with this trace as a side of a diff under `spec` (an input problem names the
    /// trace, whatever its kind: a diff has two).
    fn with_side<T>(&self, spec: &PolicySpec, f: impl FnOnce(&Side) -> Result<T>) -> Result<T> {
        self.loaded("diff")?;
        let input = self.input().map_err(|e| e.in_file(&self.name))?;
        let side =
            Side { trace: self.name.display().to_string(), input: &input, spec: spec.clone() };
        f(&side)
    }

    /// What `fragsim report` shows of this trace ([`crate::report::collect`]): the replays of
    /// the plan's policies, the segment map, the sizes and the sites at the peaks.
    #[cfg(feature = "charts")]
    pub fn report(&self, plan: &crate::report::ReportPlan) -> Result<crate::report::ReportData> {
        let trace = self.loaded("report")?;
        let plan = crate::report::ReportPlan { device: Some(self.device), ..plan.clone() };
        crate::report::collect(trace, &plan).map_err(|e| self.named(e))
    }

    /// Whether the run ran out of memory from fragmentation or capacity, of which kinds, and
    /// what would have fixed it ([`crate::explain::explain`]).
    pub fn explain(&self, options: &ExplainOptions) -> Result<Explanation> {
        self.loaded("explain")?;
        let input = self.input()?;
        crate::explain::explain(&input, &self.name.display().to_string(), options)
            .map_err(|e| self.named(e))
    }

    /// Replays the recording under its own settings and checks every decision against it
    /// ([`crate::validate::validate`]); the session's device is validated.
    pub fn validate(&self, options: &ValidateOptions) -> Result<Validation> {
        let trace = self.loaded("validate")?;
        crate::validate::needs_decisions(&self.name, trace)?;
        // As `--capacity`: a GPU with less than 1 MiB holds no segment PyTorch would make.
        if let Some(g) = options.gpu_memory.filter(|&g| g < 1 << 20) {
            return Err(Error::usage(format!(
                "the GPU memory given, {g} bytes, is less than 1 MiB: give the card's total \
                 (e.g. 80GiB), or leave it out to infer it from the recording"
            )));
        }
        let options = ValidateOptions { device: Some(self.device), ..options.clone() };
        let mut v = crate::validate::validate(trace, &options).map_err(|e| self.named(e))?;
        v.trace = self.name.display().to_string();
        Ok(v)
    }
}

/// What to replay: the specs and how ([`Session::replay`]).
#[derive(Clone, Debug)]
pub struct ReplayRequest {
    /// The policies, in the order given.
    pub specs: Vec<PolicySpec>,
    /// The capacity asked for (`None`: the limit the recording implies, if any).
    pub capacity: Option<Capacity>,
    /// Everything else about the replay; its capacity is the request's, resolved.
    pub options: ReplayOptions,
    /// Under an `empty_cache` what-if, replay the specs again without it and say what the
    /// what-if changed ([`ReplayAnswer::empty_cache_effects`]).
    pub empty_cache_price: bool,
}

impl ReplayRequest {
    /// The specs, under the recorded limit, with default options.
    pub fn new(specs: Vec<PolicySpec>) -> ReplayRequest {
        ReplayRequest {
            specs,
            capacity: None,
            options: ReplayOptions::default(),
            empty_cache_price: false,
        }
    }
}

/// A replay's answer: the rows, the recorded run, and the capacity they ran under.
pub struct ReplayAnswer {
    /// The trace's format.
    pub format: &'static str,
    /// The device replayed.
    pub device: i32,
    /// Its events.
    pub events: u64,
    /// One row per spec that ran, those that fit first, sorted by peak reserved bytes.
    pub results: Vec<PolicyResult>,
    /// The runs behind the rows (with the skipped optional specs).
    pub comparison: Comparison,
    /// The recorded run, where the trace carries the allocator's figures.
    pub recorded: Option<RecordedRow>,
    /// The device limit the recording implies.
    pub limit: Option<DeviceLimit>,
    /// The capacity the specs ran under.
    pub capacity: Resolved,
    /// What an `empty_cache` what-if changed, in lines for people (with
    /// [`ReplayRequest::empty_cache_price`]).
    pub empty_cache_effects: Option<String>,
}

impl ReplayAnswer {
    /// The `replay --format json` object of this answer for the trace named `trace`.
    pub fn report<'a>(&'a self, trace: &str) -> crate::report::json::ReplayReport<'a> {
        crate::report::json::ReplayReport {
            trace: trace.to_string(),
            format: self.format,
            device: self.device,
            events: self.events,
            results: &self.results,
            recorded: self.recorded.clone(),
            capacity: Some(crate::report::json::CapacityNote {
                bytes: self.capacity.bytes,
                inferred: self.capacity.inferred.clone(),
                limit: self.limit.clone(),
            }),
        }
    }
}

/// Names `trace`'s file (and format, for an input problem) on `e`.
fn name_error(name: &Path, trace: &Trace, e: Error) -> Error {
    match e.kind() {
        ErrorKind::Input => e.in_format(trace.format.name()).in_file(name),
        _ if e.location().format.is_some() => e.in_file(name),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_on_a_shared_trace_holds_that_trace_not_a_copy() {
        let text = "alloc 0x1000 4096 s0\nalloc 0x2000 1000 s0\nfree 0x1000 4096 s0\n";
        let format = crate::trace::Format::Text;
        let trace = crate::trace::read_bytes(text.as_bytes(), format, &Default::default()).unwrap();
        let shared = Arc::new(trace);
        let one = Session::of_trace(shared.clone(), "a.txt", None).unwrap();
        let two = Session::of_trace(shared.clone(), "a.txt", None).unwrap();
        assert!(std::ptr::eq(one.trace(), &*shared));
        assert!(std::ptr::eq(two.trace(), &*shared));
        let request = ReplayRequest::new(PolicySpec::parse_list("bound").unwrap());
        let answer = one.replay(&request, &Default::default()).unwrap();
        assert_eq!(answer.results[0].peak_reserved_bytes, 5096);
    }
}
