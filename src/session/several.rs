//! Questions asked of several traces at once (`sweep`, `check`): each trace is opened in turn,
//! one session at a time (memory follows the largest trace, not their sum), the same specs are
//! replayed on it, and what each replay found is kept. The face opens each trace (the command
//! line from its files or the traces it holds; the Python package from what the user handed it)
//! and says the notes as they come.

use super::{Capacity, ReplayRequest, Session};
use crate::error::Result;
use crate::metrics::PolicyResult;
use crate::policy::PolicySpec;
use crate::replay::{ReplayOptions, RunSettings};
use crate::whatif::grid;
use crate::whatif::sweep::{self, Shard, SweepReport, SweepRow};
use crate::whatif::Row;

/// One trace's replays by [`replay_each`].
#[derive(Clone, Debug)]
pub struct Replayed {
    /// The trace's name, as the face gave it.
    pub trace: String,
    /// The results, in the order of the specs.
    pub results: Vec<PolicyResult>,
    /// The device replayed: host memory (a CPU profiler trace) is device -1.
    pub device: i32,
    /// The capacity the replays ran under (`None`: unlimited).
    pub capacity: Option<u64>,
    /// Whether the capacity is the limit the recording implies (none asked, or `recorded`).
    pub inferred: bool,
    /// Under an inferred capacity, the event at which the recording itself first ran out of
    /// memory, if it did: replays that run out there reproduce it.
    pub recorded_oom: Option<u64>,
}

/// Replays `specs` on each of `traces` (opened by `open`, under `capacity`), saying through
/// `note` what each session's recording changes about its replays ([`Session::notes`]).
pub fn replay_each<T>(
    traces: &[T],
    specs: &[PolicySpec],
    capacity: Option<&Capacity>,
    options: &ReplayOptions,
    settings: &RunSettings,
    open: &mut dyn FnMut(&T) -> Result<Session>,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<Replayed>> {
    let mut out = Vec::with_capacity(traces.len());
    for trace in traces {
        let session = open(trace)?;
        for n in session.notes(specs) {
            note(&n);
        }
        let request = ReplayRequest {
            capacity: capacity.cloned(),
            options: options.clone(),
            ..ReplayRequest::new(specs.to_vec())
        };
        let answer = session.replay(&request, settings)?;
        let mut runs = answer.comparison.runs;
        runs.sort_by_key(|r| r.index);
        let inferred = answer.capacity.inferred.is_some();
        out.push(Replayed {
            trace: session.name().display().to_string(),
            results: runs.into_iter().map(|r| r.output.result).collect(),
            device: answer.device,
            capacity: answer.capacity.bytes,
            recorded_oom: answer.recorded.and_then(|r| r.first_oom_event).filter(|_| inferred),
            inferred,
        });
    }
    Ok(out)
}

/// A sweep to run: its configs and everything about them the report records.
#[derive(Clone, Debug)]
pub struct SweepPlan {
    /// Every config of the grid, the recorded settings first, each once.
    pub specs: Vec<PolicySpec>,
    /// The configs as the report names them.
    pub names: Vec<String>,
    /// The part of the grid this run replays.
    pub shard: Option<Shard>,
    /// The grid's id ([`sweep::grid_id`]) and the settings beside the specs it covers.
    pub grid_id: String,
    /// The settings beside the specs the id covers (capacity, device).
    pub grid_settings: Vec<String>,
    /// The result key minimised.
    pub objective: String,
    /// The capacity asked for, as the report labels it.
    pub capacity_label: String,
}

/// The spec savings are measured against: PyTorch with the trace's recorded settings.
pub const SWEEP_REFERENCE: &str = "pytorch";

impl SweepPlan {
    /// The plan of sweeping the grid `written` (specs with `{a,b}` alternatives; the recorded
    /// settings come first whatever is written) under `capacity` on `device`, minimising
    /// `objective`, part `shard` of it. Everything the user typed is checked here, before the
    /// first replay.
    pub fn new(
        written: Vec<String>,
        objective: &str,
        capacity: Option<&Capacity>,
        device: Option<i32>,
        shard: Option<&str>,
    ) -> Result<SweepPlan> {
        let specs = grid_specs(written)?;
        let names: Vec<String> = specs.iter().map(PolicySpec::display).collect();
        Row::new("", &PolicyResult::default()).number(objective)?;
        let shard = shard.map(Shard::parse).transpose()?;
        let (grid_id, grid_settings) = grid_identity(&names, capacity, device);
        let capacity_label = capacity_label(capacity);
        Ok(SweepPlan {
            specs,
            names,
            shard,
            grid_id,
            grid_settings,
            objective: objective.to_string(),
            capacity_label,
        })
    }

    /// The configs this part replays.
    pub fn mine(&self) -> std::ops::Range<usize> {
        self.shard.map_or(0..self.specs.len(), |s| s.range(self.specs.len()))
    }

    /// The report of this part's `replayed` traces (each replayed on [`SweepPlan::mine`]).
    pub fn report(&self, replayed: &[Replayed]) -> Result<SweepReport> {
        let names = &self.names[self.mine()];
        let traces: Vec<String> = replayed.iter().map(|r| r.trace.clone()).collect();
        let rows = rows(names, replayed);
        let mut report = sweep::report(traces, &self.objective, rows, Some(SWEEP_REFERENCE))?;
        report.grid = Some(self.grid_id.clone());
        report.shard = self.shard;
        report.capacity = Some(self.capacity_label.clone());
        // A CPU profiler trace's host memory: CUDA's allocator settings do not apply to it.
        if !replayed.is_empty() && replayed.iter().all(|r| r.device < 0) {
            report = report.on_host();
        }
        Ok(report)
    }

    /// What a report written for `merge` adds: the whole grid and what its id covers.
    pub fn for_merge(&self, mut report: SweepReport) -> SweepReport {
        report.grid_specs = Some(self.names.clone());
        report.grid_settings = Some(self.grid_settings.clone());
        report
    }
}

/// The grid of a sweep given no specs: the knobs users try, of the recording's allocator
/// (torch_npu refuses some of CUDA's points), read from `first` trace's session.
pub fn builtin_grid(first: Option<&Session>) -> Vec<String> {
    match first {
        Some(s) => grid::builtin_grid_for(crate::policy::pytorch::Flavour::of_trace(s.trace())),
        None => grid::builtin_grid(),
    }
}

/// The note for a trace whose recording ran out of memory under the limit it implies.
pub fn recorded_oom_note(trace: &str, event: u64) -> String {
    format!(
        "{trace}: the recording itself ran out of memory (first at event {event}) under the limit \
         it implies: configs that run out there reproduce it; --capacity none ranks them unlimited"
    )
}

/// The note for a trace a check replayed under the limit its recording implies.
pub fn inferred_capacity_note(trace: &str, bytes: u64) -> String {
    format!(
        "{trace}: replayed under {}, the limit the recording implies (`fragsim replay` says how \
         it was inferred); --capacity none replays unlimited",
        crate::units::format_bytes(bytes)
    )
}

/// The specs to sweep: the recorded settings first, then the grid as written, expanded, each
/// config once.
fn grid_specs(written: Vec<String>) -> Result<Vec<PolicySpec>> {
    let all = grid::expand_all(std::iter::once(SWEEP_REFERENCE.to_string()).chain(written))?;
    let mut specs: Vec<PolicySpec> = Vec::with_capacity(all.len());
    for text in &all {
        for spec in PolicySpec::parse_list(text)? {
            // A config written twice (`-p all` holds the recorded settings again) runs once,
            // so that each part of a sharded sweep lists the grid `merge` expects.
            if !specs.iter().any(|s| s.display() == spec.display()) {
                specs.push(spec);
            }
        }
    }
    Ok(specs)
}

/// One row per config and trace, spec-major: the parts of a sharded sweep concatenate into the
/// unsharded order.
fn rows(names: &[String], replayed: &[Replayed]) -> Vec<SweepRow> {
    let mut rows = Vec::with_capacity(names.len() * replayed.len());
    for (i, name) in names.iter().enumerate() {
        for per_trace in replayed {
            let row = Row::new(per_trace.trace.clone(), &per_trace.results[i]);
            rows.push(SweepRow { spec: name.clone(), row });
        }
    }
    rows
}

/// The report's `capacity`: as typed, `recorded` (also when none is asked) or `none`.
fn capacity_label(capacity: Option<&Capacity>) -> String {
    match capacity {
        None | Some(Capacity::Recorded) => "recorded".to_string(),
        Some(Capacity::Unlimited) => "none".to_string(),
        Some(Capacity::Size { typed, .. }) => typed.clone(),
    }
}

/// The grid's id and the settings beside its specs that the id covers: the capacity setting (a
/// size as bytes, so `40GiB` and `42949672960` shards merge; with none asked each trace runs
/// under the limit its recording implies) and the device, where given (parts of sweeps of
/// different devices must not merge; without one the id stays what older versions wrote).
fn grid_identity(
    names: &[String],
    capacity: Option<&Capacity>,
    device: Option<i32>,
) -> (String, Vec<String>) {
    let capacity_setting = match capacity {
        None | Some(Capacity::Recorded) => "capacity=recorded".to_string(),
        Some(Capacity::Unlimited) => "capacity=None".to_string(),
        Some(Capacity::Size { bytes, .. }) => format!("capacity={:?}", Some(bytes)),
    };
    let mut identity = names.to_vec();
    identity.push(capacity_setting);
    if let Some(device) = device {
        identity.push(format!("device={device}"));
    }
    let grid_id = sweep::grid_id(&identity);
    (grid_id, identity.split_off(names.len()))
}
