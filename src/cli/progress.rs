//! Progress and control for every command that replays: `--jobs N`, `--quiet`, and the progress
//! bar on stderr. The one place the commands decide how many replays run at once and whether a
//! bar is drawn, so `replay`, `report`, `fit`, `sweep` and `check` behave alike.
//!
//! A bar is drawn only when stderr is a terminal and `--quiet` is not given, so it never reaches a
//! pipe, a log file or a `--json`/`--csv` consumer (those read stdout; the bar writes to stderr).
//! It stays hidden for its first second: a run that ends sooner draws nothing.

use super::Io;
use fragsim::error::Result;
use fragsim::policy::PolicySpec;
use fragsim::replay::{Jobs, ReplayOptions, RunSettings};
use fragsim::trace::fst::FstStream;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What [`Control::replay_traces`] replays: the traces, the device in each (`None`: each
/// trace's device with the most events) and the `--capacity` flag.
#[derive(Clone, Copy)]
pub struct Targets<'a> {
    /// The traces, in the order results come back.
    pub traces: &'a [PathBuf],
    /// `--device`.
    pub device: Option<i32>,
    /// `--capacity`, resolved per trace.
    pub capacity: Option<&'a super::CapacityArg>,
}

/// One trace's replays by [`Control::replay_traces`].
pub use fragsim::session::several::Replayed;

/// How long a run goes before its bar appears.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// The `--jobs` and `--quiet` flags.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Control {
    /// Replays run at once (default: every core; 1 runs them one after another).
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,

    /// No progress bar and no notes on stderr (errors are still printed).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl Control {
    /// The parallelism for `replays` replays: `--jobs N` bounded by the number of replays and by
    /// [`fragsim::replay::max_jobs`], with a note on `io` (once per command, unless `--quiet`) when it was
    /// lowered; never more threads than there is work for.
    pub(crate) fn jobs_for(&self, io: &mut Io, replays: usize) -> Jobs {
        let (jobs, lowered) = Jobs::bounded(self.jobs, replays);
        if let (Some(why), Some(asked), false) = (lowered, self.jobs, io.jobs_noted) {
            io.jobs_noted = true;
            let at_once = jobs.count().unwrap_or(asked);
            self.note(io, &format!("note: --jobs {asked}: running {at_once} at once ({why})"));
        }
        jobs
    }

    /// Whether progress may be drawn: `io` allows it (stderr is a terminal) and `--quiet` was
    /// not given.
    pub(crate) fn show_progress(&self, io: &Io) -> bool {
        !self.quiet && io.progress
    }

    /// Reads a trace, keeping its stack frames when `keep_frames` (for naming an OOM's stack).
    pub(crate) fn read_trace_with_frames(
        &self,
        io: &mut Io,
        path: &std::path::Path,
        keep_frames: bool,
    ) -> Result<std::sync::Arc<fragsim::trace::Trace>> {
        io.read_trace(path, keep_frames, !self.quiet)
    }

    /// A session on the trace at `path` (read as [`Control::read_trace_with_frames`] reads
    /// it) about `device` (default: its device with the most events).
    pub(crate) fn session(
        &self,
        io: &mut Io,
        path: &std::path::Path,
        device: Option<i32>,
        keep_frames: bool,
    ) -> Result<fragsim::session::Session> {
        let trace = self.read_trace_with_frames(io, path, keep_frames)?;
        fragsim::session::Session::of_trace(trace, path, device)
    }

    /// A session on `path` for replaying `specs`: an uncompressed `.fst` file streams (each
    /// replay reads it again, so memory follows the blocks live at once, not the trace's
    /// length), unless a planner among `specs` needs every lifetime (the events are loaded once
    /// for all, and a note says so) or `io` holds the bytes; any other trace is read whole.
    pub(crate) fn replay_session(
        &self,
        io: &mut Io,
        path: &std::path::Path,
        device: Option<i32>,
        specs: &[PolicySpec],
        keep_frames: bool,
    ) -> Result<fragsim::session::Session> {
        let planners = fragsim::policy::planners(specs);
        let file = if io.holds(path) { None } else { FstStream::open(path)? };
        match file {
            Some(file) if planners.is_empty() => {
                let session = fragsim::session::Session::streamed(file, path, device)?;
                io.note_no_history(session.no_history_note());
                return Ok(session);
            }
            Some(_) => {
                self.note(io, &fragsim::session::loaded_for_planners(&planners, path));
            }
            None => {}
        }
        self.session(io, path, device, keep_frames)
    }

    /// A progress bar of `total` steps described by `what` (hidden unless
    /// [`Control::show_progress`], and for its first second).
    pub(crate) fn bar(&self, io: &Io, total: usize, what: &str) -> Bar {
        Bar::new(self.show_progress(io), total, what)
    }

    /// A note for the user on `io`'s stderr, unless `--quiet`.
    pub(crate) fn note(&self, io: &mut Io, text: &str) {
        if !self.quiet {
            io.note(text);
        }
    }

    /// Replays every spec on every trace, the one loop `sweep` and `check` share: traces are read
    /// one at a time (one trace's events in memory at once) and each trace's specs run through
    /// [`fragsim::replay::run_specs`] with `--jobs`, advancing `bar` per replay, on `device` (default: each
    /// trace's device with the most events), under the capacity the `--capacity` flag resolves
    /// to for that trace (as `replay` does: with no flag, the limit the recording implies, if it
    /// shows one; [`fragsim::session::Session::capacity`]). Returns, per trace in order, its results in the
    /// order of `specs`, its device and its capacity.
    pub(crate) fn replay_traces(
        &self,
        io: &mut Io,
        targets: Targets,
        specs: &[PolicySpec],
        options: &ReplayOptions,
        bar: &Bar,
        mut first: Option<fragsim::session::Session>,
    ) -> Result<Vec<Replayed>> {
        let tick = bar.tick();
        let jobs = self.jobs_for(io, specs.len());
        let settings = RunSettings { jobs, progress: Some(&tick), ..Default::default() };
        let Targets { traces, device, capacity } = targets;
        // Both write to `io`, one after the other: the notes go out as they come.
        let io = std::cell::RefCell::new(io);
        let mut open = |path: &PathBuf| match first.take() {
            Some(session) => Ok(session),
            None => self.replay_session(&mut io.borrow_mut(), path, device, specs, false),
        };
        let mut note = |n: &str| self.note(&mut io.borrow_mut(), n);
        fragsim::session::several::replay_each(
            traces, specs, capacity, options, &settings, &mut open, &mut note,
        )
    }

    /// Runs `f`, which works through `tasks` items, where rayon's parallel iterators use at most
    /// `--jobs` threads (bounded by [`Control::jobs_for`]).
    pub(crate) fn install<T: Send>(
        &self,
        io: &mut Io,
        tasks: usize,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T> {
        self.jobs_for(io, tasks).install(f)
    }
}

/// A progress bar with an ETA that appears after [`SHOW_AFTER`]; safe to advance from any thread.
pub struct Bar {
    bar: ProgressBar,
    enabled: bool,
    started: Instant,
}

impl Bar {
    fn new(enabled: bool, total: usize, what: &str) -> Bar {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::hidden());
        let template = "{msg} [{bar:30}] {pos}/{len} ({elapsed}, ETA {eta})";
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_string());
        Bar { bar, enabled, started: Instant::now() }
    }

    /// One more step done.
    pub(crate) fn inc(&self) {
        self.bar.inc(1);
        if self.enabled && self.bar.is_hidden() && self.started.elapsed() >= SHOW_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    /// A callback for [`fragsim::replay::RunSettings::progress`]: each finished replay is a step
    /// (the callback's own counts are per call, so a bar shared by several calls ignores them).
    pub(crate) fn tick(&self) -> impl Fn(usize, usize) + Sync + '_ {
        move |_, _| self.inc()
    }

    /// Removes the bar from the terminal.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_map_to_the_replay_settings() {
        let c = |jobs| Control { jobs, quiet: false };
        assert_eq!(Jobs::from_count(None), Jobs::AllCores);
        assert_eq!(Jobs::from_count(Some(0)), Jobs::AllCores);
        assert_eq!(Jobs::from_count(Some(1)), Jobs::Sequential);
        assert_eq!(Jobs::from_count(Some(3)), Jobs::from_count(Some(3)));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut io = Io::buffers(&mut out, &mut err, false);
        let threads = c(Some(2)).install(&mut io, 2, rayon::current_num_threads).unwrap();
        assert_eq!(threads, 2);
        assert_eq!(c(Some(100_000)).jobs_for(&mut io, 3), Jobs::from_count(Some(3)));
        assert_eq!(
            c(Some(usize::MAX)).jobs_for(&mut io, usize::MAX),
            Jobs::from_count(Some(fragsim::replay::max_jobs()))
        );
        assert_eq!(c(Some(5)).jobs_for(&mut io, 1), Jobs::Sequential);
        assert_eq!(c(None).jobs_for(&mut io, 1), Jobs::AllCores);
        drop(io);
        let err = String::from_utf8(err).unwrap();
        assert_eq!(err.matches("note: --jobs").count(), 1, "one note per command: {err}");
        assert!(err.contains("note: --jobs 100000: running 3 at once (3 replays to run)"), "{err}");
    }

    #[test]
    fn quiet_never_draws_and_a_hidden_bar_counts() {
        let quiet = Control { jobs: None, quiet: true };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let io = Io::buffers(&mut out, &mut err, true);
        assert!(!quiet.show_progress(&io));
        let bar = quiet.bar(&io, 3, "x");
        let tick = bar.tick();
        tick(1, 3);
        tick(2, 3);
        assert_eq!(bar.bar.position(), 2);
        assert!(bar.bar.is_hidden());
    }
}
