//! `fragsim report`: everything a report directory shows, gathered once, then written by format.
//!
//! [`collect`] runs the replays (through [`crate::replay::run_specs`], keeping each policy's memory-over-time series within
//! a plotting budget), re-runs one policy up to its peak for the segment map, and summarises the
//! trace; [`write_dir`] hands the resulting [`ReportData`] to one writer per file (charts in
//! [`super::plot`], tables in [`super::markdown`], [`super::csv`], [`super::json`], the page in
//! [`super::html`]). No writer re-reads the trace or re-runs a replay: one source for every output.

use super::plot;
use crate::error::{Error, Result};
use crate::policy::{self, role_of, PolicySpec, Role};
use crate::progress::Bar;
use crate::replay::{run_specs, ReplayInput, ReplayOptions, ReplayOutput, RunSettings};
use crate::trace::summary::{DeviceSummary, SizeBucket};
use crate::trace::{DeviceTrace, Segment, Trace};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// How many points each policy's plotted series keeps at most. Series are down-sampled to this
/// with `crate::metrics::series::downsample`, which keeps every peak, so a 10 M-event trace still
/// makes charts of a few hundred kilobytes.
pub const PLOT_POINTS: usize = 2_000;

/// What to report on, decided from the command line before any slow work.
#[derive(Clone, Debug, Default)]
pub struct ReportPlan {
    /// The trace path as the user gave it (shown in titles and `results.json`).
    pub trace_path: String,
    /// The policies to replay.
    pub policies: Vec<PlannedPolicy>,
    /// The device (`None`: the device with the most events).
    pub device: Option<i32>,
    /// Device capacity for OOM (`None`: unlimited).
    pub capacity: Option<u64>,
    /// When `capacity` was inferred from the recording: what was inferred and from which events.
    pub capacity_inferred: Option<String>,
    /// What `capacity` stands for: the GPU's memory, or only the recorded allocator's limit.
    pub capacity_kind: crate::recorded::CapacityKind,
    /// The policy whose segments are drawn at its peak (`None`: `pytorch`, else the first with
    /// segments). A name or a label (`NAME:OPTIONS`) of one of the replayed policies, or any spec.
    pub segment_map_policy: Option<String>,
    /// Show progress bars (only when stderr is a terminal).
    pub progress: bool,
    /// The `empty_cache` what-if every replay runs under (default: the recorded calls only).
    pub empty_cache: crate::replay::EmptyCachePlan,
    /// How many replays run at once (`--jobs`).
    pub jobs: crate::replay::Jobs,
    /// Stops the replays early when raised (see [`crate::replay::Cancel`]).
    pub cancel: crate::replay::Cancel,
}

/// One policy a report replays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPolicy {
    /// The spec.
    pub spec: PolicySpec,
    /// True when the user named this policy: then it must run. Policies of the default set or of
    /// `all` that cannot run (not implemented, or unusable on this trace) are skipped with a note.
    pub named: bool,
}

impl ReportPlan {
    /// The policies for `--policy` values as given (`all` expands to unnamed entries); with none,
    /// every built-in policy, unnamed.
    pub fn policies_from(values: &[String]) -> Result<Vec<PlannedPolicy>> {
        if values.is_empty() {
            return PolicySpec::parse_list("all").map(|specs| {
                specs.into_iter().map(|spec| PlannedPolicy { spec, named: false }).collect()
            });
        }
        let mut out = Vec::new();
        for v in values {
            let named = v.trim() != "all";
            out.extend(
                PolicySpec::parse_list(v)?.into_iter().map(|spec| PlannedPolicy { spec, named }),
            );
        }
        Ok(out)
    }
}

/// What the report says about the trace itself.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSummary {
    /// The path as given.
    pub path: String,
    /// The format name (`docs/interface.md`), e.g. `pytorch-snapshot`.
    pub format: &'static str,
    /// The device replayed.
    pub device: i32,
    /// Every device in the trace with its event count.
    pub devices: Vec<(i32, u64)>,
    /// Events of the replayed device.
    pub events: u64,
    /// True when event times are real microseconds (else they are event indices).
    pub has_times: bool,
    /// The earliest event time (µs, or 0): the first event's, unless times go backwards. The
    /// time axis starts here, so every event lies on it whatever order its times come in.
    pub first_time_us: i64,
    /// The latest event time: the time axis ends here.
    pub last_time_us: i64,
    /// What `fragsim info` says about the replayed device (counts by action, streams, sizes,
    /// orphan frees, peak live bytes, ...).
    pub info: DeviceSummary,
}

/// The unit a time axis spanning `span_us` microseconds is drawn in, so its ticks stay
/// readable: (µs per unit, unit name). A 14 ms trace is plotted in ms, not as a row of "0.01 s"
/// ticks, nor a row of "0" ones.
pub(crate) fn time_unit(span_us: i64) -> (f64, &'static str) {
    if span_us >= 2_000_000 {
        (1e6, "s")
    } else if span_us >= 2_000 {
        (1e3, "ms")
    } else {
        (1.0, "µs")
    }
}

impl TraceSummary {
    /// Summarises `device`'s events of `trace`.
    pub(crate) fn of(trace: &Trace, path: &str, device: i32) -> TraceSummary {
        let empty = DeviceTrace { device, events: Vec::new() };
        let d = trace.device(device).unwrap_or(&empty);
        let events = d.events.as_slice();
        let (earliest, latest) = events
            .iter()
            .fold((i64::MAX, i64::MIN), |(lo, hi), e| (lo.min(e.time_us), hi.max(e.time_us)));
        TraceSummary {
            path: path.to_string(),
            format: trace.format.name(),
            device,
            devices: trace.devices.iter().map(|d| (d.device, d.events.len() as u64)).collect(),
            events: events.len() as u64,
            has_times: trace.has_times,
            first_time_us: if events.is_empty() { 0 } else { earliest },
            last_time_us: if events.is_empty() { 0 } else { latest },
            info: DeviceSummary::of(trace, d),
        }
    }

    /// The file name of the trace, for chart titles.
    pub(crate) fn file_name(&self) -> String {
        Path::new(&self.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.clone())
    }

    /// Where a moment sits on a chart's x axis: seconds since the first event, or the event index
    /// when the trace records no times.
    pub(crate) fn x_of(&self, time_us: i64, event: u64) -> f64 {
        if self.has_times {
            (time_us as f64 - self.first_time_us as f64) / self.time_unit().0
        } else {
            event as f64
        }
    }

    /// The end of the x axis.
    pub(crate) fn x_end(&self) -> f64 {
        self.x_of(self.last_time_us, self.events.saturating_sub(1))
    }

    /// The unit of the time axis, chosen by the recorded span ([`time_unit`]).
    pub(crate) fn time_unit(&self) -> (f64, &'static str) {
        time_unit(self.last_time_us.saturating_sub(self.first_time_us))
    }

    /// The x axis description.
    pub(crate) fn x_desc(&self) -> &'static str {
        if self.has_times {
            match self.time_unit().1 {
                "s" => "time since the first event (s)",
                "ms" => "time since the first event (ms)",
                _ => "time since the first event (µs)",
            }
        } else {
            "event index (the trace records no times)"
        }
    }

    /// The recorded time span in words, e.g. `2.31 s`.
    pub(crate) fn span_text(&self) -> String {
        if self.has_times {
            format!("{:.3} s", (self.last_time_us as f64 - self.first_time_us as f64) / 1e6)
        } else {
            "unknown (no times recorded)".into()
        }
    }
}

/// One replayed policy.
#[derive(Clone, Debug)]
pub struct PolicyRun {
    /// The spec as the user would write it (`NAME` or `NAME:OPTIONS`): the label in charts.
    pub label: String,
    /// Its position in the report's policy order: decides its colour and marker in every chart.
    pub index: usize,
    /// What the replay measured (its series down-sampled to [`PLOT_POINTS`]).
    pub output: ReplayOutput,
}

impl PolicyRun {
    /// Whether it replays the recording's own allocator under the recorded settings: the policy
    /// of [`Role::Recorded`] with no options (`pytorch`), which reports draw first.
    pub(crate) fn runs_recorded_settings(&self) -> bool {
        let policy = &self.output.result.policy;
        role_of(policy) == Some(Role::Recorded) && self.label == *policy
    }
}

/// A policy left out of a default report, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The spec.
    pub label: String,
    /// The error message it failed with.
    pub reason: String,
}

/// The segments of one policy at the moment its reserved memory peaked.
#[derive(Clone, Debug, Default)]
pub struct SegmentMap {
    /// The policy's label (empty when none could be drawn).
    pub policy: String,
    /// The event after which reserved memory first peaked.
    pub event: u64,
    /// That event's time (µs or index).
    pub time_us: i64,
    /// The segments then, in address order.
    pub segments: Vec<Segment>,
    /// Why there is nothing to draw, when `segments` is empty.
    pub note: Option<String>,
}

/// The trace's allocation size classes (from [`DeviceSummary::size_histogram`]) from the
/// smallest occupied class to the largest, with the empty classes between them filled in so a
/// chart's axis is continuous. Zero-byte requests never reach an allocator and are left out.
pub(crate) fn size_bins(info: &DeviceSummary) -> Vec<SizeBucket> {
    let mut out: Vec<SizeBucket> = Vec::new();
    for b in info.size_histogram.iter().filter(|b| b.min_bytes > 0) {
        while let Some(last) = out.last().copied() {
            let next = last.min_bytes.checked_mul(2).filter(|&n| n < b.min_bytes);
            match next {
                Some(n) => out.push(SizeBucket {
                    min_bytes: n,
                    max_bytes: n.saturating_mul(2) - 1,
                    count: 0,
                    bytes: 0,
                }),
                None => break,
            }
        }
        out.push(*b);
    }
    out
}

/// Everything a report directory shows.
#[derive(Clone, Debug)]
pub struct ReportData {
    /// The trace.
    pub trace: TraceSummary,
    /// The replayed policies, sorted by peak reserved bytes (as `replay` prints them).
    pub runs: Vec<PolicyRun>,
    /// Policies of the default set that could not run.
    pub skipped: Vec<Skipped>,
    /// The segment map.
    pub segment_map: SegmentMap,
    /// Allocation size classes (`size_bins`).
    pub sizes: Vec<SizeBucket>,
    /// `--capacity`, if given.
    pub capacity: Option<u64>,
    /// The recorded run, when the trace carries the allocator's figures.
    pub recorded: Option<crate::recorded::RecordedRow>,
    /// The recorded run's reserved memory over time (within [`PLOT_POINTS`]), for the timeline;
    /// `None` when the trace records no allocator figures.
    pub recorded_series: Option<crate::metrics::Series>,
    /// The `capacity` key of `results.json`: the limit, whether inferred, what the recording says.
    pub capacity_note: Option<super::json::CapacityNote>,
    /// Each policy's breakdown by allocation site at its peak ([`crate::blame`]), by label, in
    /// report order: the "where the memory went" chart.
    pub sites: Vec<(String, crate::blame::Attribution)>,
    /// The flame graph of the segment-map policy's live bytes at its peak: its title and folded
    /// stacks ([`crate::blame::flame::folded`]); `None` when the trace records no frames.
    pub flame: Option<(String, Vec<String>)>,
    /// fragsim's version.
    pub version: &'static str,
}

impl ReportData {
    /// The notes of the policies the report skipped, one each, and why.
    pub fn skipped_notes(&self) -> Vec<String> {
        self.skipped
            .iter()
            .map(|s| format!("note: skipped policy '{}': {}", s.label, s.reason))
            .collect()
    }

    /// What a report written into `dir` says it wrote.
    pub fn written_note(&self, dir: &std::path::Path) -> String {
        let n = self.runs.len();
        let policies = if n == 1 { "policy" } else { "policies" };
        format!("wrote the report for {n} {policies} to {}", dir.join("index.html").display())
    }

    /// The floor's peak reserved bytes (the `bound` policy's, [`Role::Floor`]), if it ran: the
    /// floor overheads are measured from.
    pub(crate) fn bound(&self) -> Option<u64> {
        let floor = |r: &&PolicyRun| role_of(&r.output.result.policy) == Some(Role::Floor);
        self.runs.iter().find(floor).map(|r| r.output.result.peak_reserved_bytes)
    }

    /// The results in report order.
    pub(crate) fn results(&self) -> Vec<crate::metrics::PolicyResult> {
        self.runs.iter().map(|r| r.output.result.clone()).collect()
    }
}

fn bar(progress: bool, len: u64, what: &str) -> Bar {
    if progress {
        Bar::steps(len, what)
    } else {
        Bar::hidden()
    }
}

/// Runs the plan's replays on `trace` and gathers what the report shows. Skipped policies are
/// returned in [`ReportData::skipped`]; the caller tells the user.
pub fn collect(trace: &Trace, plan: &ReportPlan) -> Result<ReportData> {
    let input = ReplayInput::new(trace, plan.device)?;
    // Recovered once: the row, the limit and the timeline's line all come from it.
    let run = crate::recorded::recorded(trace, input.device());
    let (recorded, limit) = run.as_ref().map(|r| r.row_and_limit(trace)).unzip();
    let recorded_series = run.map(|r| r.series(trace, PLOT_POINTS));
    let options = ReplayOptions {
        capacity: plan.capacity,
        capacity_kind: plan.capacity_kind,
        empty_cache: plan.empty_cache.clone(),
        keep_series: true,
        series_budget: PLOT_POINTS,
        cancel: plan.cancel.clone(),
        ..ReplayOptions::default()
    };
    let specs: Vec<PolicySpec> = plan.policies.iter().map(|p| p.spec.clone()).collect();
    let optional: Vec<bool> = plan.policies.iter().map(|p| !p.named).collect();
    let progress = bar(plan.progress, specs.len() as u64, "replaying policies");
    let tick = |done: usize, _total: usize| progress.set_position(done as u64);
    let settings = RunSettings {
        jobs: plan.jobs,
        optional: &optional,
        progress: Some(&tick),
        ..Default::default()
    };
    let comparison = run_specs(&specs, &input, &options, &settings)?;
    progress.finish_and_clear();

    let skipped: Vec<Skipped> = comparison
        .skipped
        .into_iter()
        .map(|s| {
            let prefix = format!("policy '{}': ", s.spec.name);
            let message = s.error.message();
            let reason = message.strip_prefix(&prefix).unwrap_or(message).to_string();
            Skipped { label: s.spec.display(), reason }
        })
        .collect();
    // Colours and markers follow the order the policies ran in, as before sorting.
    let mut by_given: Vec<usize> = comparison.runs.iter().map(|r| r.index).collect();
    by_given.sort_unstable();
    let runs: Vec<PolicyRun> = comparison
        .runs
        .into_iter()
        .map(|r| {
            let mut output = r.output;
            if let Some(series) = &mut output.series {
                let points = series.downsampled(PLOT_POINTS);
                let mut small = crate::metrics::Series::with_budget(PLOT_POINTS);
                for p in points {
                    small.push(p);
                }
                *series = small;
            }
            let index = by_given.binary_search(&r.index).unwrap_or(r.index);
            PolicyRun { label: r.spec.display(), index, output }
        })
        .collect();
    if runs.is_empty() {
        return Err(Error::usage(format!(
            "no policy could run on this trace ({})",
            skipped
                .iter()
                .map(|s| format!("{}: {}", s.label, s.reason))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    let segment_map = segment_map(&input, &runs, plan, &options)?;
    let sites = sites_at_peaks(&input, &runs, &options)?;
    let flame = sites
        .iter()
        .find(|(label, _)| *label == segment_map.policy)
        .or(sites.first())
        .filter(|_| !trace.frames.is_empty())
        .map(|(label, a)| {
            let title = format!("live bytes at the peak of {label} (event {})", a.moment.event);
            (title, crate::blame::flame::folded(a, trace))
        });
    let summary = TraceSummary::of(trace, &plan.trace_path, input.device());
    Ok(ReportData {
        sizes: size_bins(&summary.info),
        trace: summary,
        runs,
        skipped,
        segment_map,
        capacity: plan.capacity,
        recorded,
        recorded_series,
        capacity_note: Some(super::json::CapacityNote {
            bytes: plan.capacity,
            inferred: plan.capacity_inferred.clone(),
            limit,
        }),
        sites,
        flame,
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// Each run broken down by allocation site at its peak (a watched replay up to it).
fn sites_at_peaks(
    input: &ReplayInput,
    runs: &[PolicyRun],
    options: &ReplayOptions,
) -> Result<Vec<(String, crate::blame::Attribution)>> {
    let keys = crate::blame::Keys::new(input, crate::blame::GroupBy::Site, 1);
    let plain = ReplayOptions { keep_series: false, ..options.clone() };
    let mut out = Vec::new();
    for run in runs {
        let spec = one_spec(&run.label)?;
        let peak = run.output.detail.peak_reserved_event;
        let (_, layout) = crate::blame::watch(input, &spec, &plain, peak)?;
        let mut a = crate::blame::breakdown(&layout, &keys, 0)?;
        a.policy = run.output.result.policy.clone();
        a.config = run.output.result.config.clone();
        a.moment = crate::blame::MomentAt { kind: "peak".into(), event: peak };
        out.push((run.label.clone(), a));
    }
    Ok(out)
}

/// Picks the segment-map policy and replays it up to its peak.
fn segment_map(
    input: &ReplayInput,
    runs: &[PolicyRun],
    plan: &ReportPlan,
    options: &ReplayOptions,
) -> Result<SegmentMap> {
    let chosen = match &plan.segment_map_policy {
        Some(wanted) => {
            let hit = runs
                .iter()
                .find(|r| r.label == *wanted)
                .or_else(|| runs.iter().find(|r| r.output.result.policy == *wanted));
            match hit {
                Some(r) => Some((one_spec(&r.label)?, Some(r.output.detail.peak_reserved_event))),
                None => Some((one_spec(wanted)?, None)),
            }
        }
        None => runs
            .iter()
            .find(|r| r.runs_recorded_settings())
            .or_else(|| runs.iter().find(|r| !r.output.segments.is_empty()))
            .map(|r| Ok((one_spec(&r.label)?, Some(r.output.detail.peak_reserved_event))))
            .transpose()?,
    };
    let Some((spec, peak_event)) = chosen else {
        return Ok(SegmentMap {
            note: Some(format!(
                "none of the replayed policies ({}) reports its segments",
                runs.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(", ")
            )),
            ..SegmentMap::default()
        });
    };
    let info = policy::lookup(&spec.name)?;
    // A policy that was not among the replays: run it whole first to find its peak.
    let peak_event = match peak_event {
        Some(e) => e,
        None => {
            info.run(&spec, input, &ReplayOptions { keep_series: false, ..options.clone() })?
                .detail
                .peak_reserved_event
        }
    };
    let at_peak =
        ReplayOptions { keep_series: false, stop_after: Some(peak_event), ..options.clone() };
    let out = info.run(&spec, input, &at_peak)?;
    let mut segments = out.segments;
    segments.sort_by_key(|s| s.address);
    let note = segments.is_empty().then(|| {
        format!(
            "policy '{}' reports no segments (it does not model them, or held none at its peak)",
            spec.display()
        )
    });
    Ok(SegmentMap {
        policy: spec.display(),
        event: peak_event,
        time_us: input
            .loaded_events()
            .unwrap_or_default()
            .get(peak_event as usize)
            .map_or(0, |e| e.time_us),
        segments,
        note,
    })
}

/// Parses exactly one policy spec (`all` is not one).
fn one_spec(text: &str) -> Result<PolicySpec> {
    let mut specs = PolicySpec::parse_list(text)?;
    match specs.len() {
        1 => Ok(specs.remove(0)),
        _ => Err(Error::usage(format!("--segment-map-policy takes one policy, not '{text}'"))),
    }
}

/// Writes every file of the report into `dir` (created if missing) and returns their paths.
pub fn write_dir(data: &ReportData, dir: &Path, progress: bool) -> Result<Vec<PathBuf>> {
    // Every file is built in a staging folder inside `dir`, then renamed into place with
    // index.html last: a run killed on the way leaves the old report whole, and a folder whose
    // index.html is new holds every new file.
    let staging = super::output::Staging::new(dir)?;
    let stage = staging.path();
    let bar = bar(progress, 11, "writing report");
    let mut files = Vec::new();
    let steps: [&dyn Fn() -> Result<Vec<PathBuf>>; 10] = [
        &|| plot::write_timeline(data, stage),
        &|| plot::write_peaks(data, stage),
        &|| plot::write_sites(data, stage),
        &|| match &data.flame {
            Some((title, lines)) => {
                // Nothing live at the peak: no flame graph, the rest of the report stands.
                let Ok(svg) = crate::blame::flame::svg(lines, title) else {
                    return Ok(Vec::new());
                };
                write_file(stage, "flame.svg", |w| {
                    w.write_all(svg.as_bytes()).map_err(|e| Error::writing("the flame graph", e))
                })
            }
            None => Ok(Vec::new()),
        },
        &|| plot::write_fragmentation(data, stage),
        &|| plot::write_segments(data, stage),
        &|| plot::write_sizes(data, stage),
        &|| write_file(stage, "results.json", |w| super::json::write_report(data, w)),
        &|| {
            write_file(stage, "results.csv", |w| {
                super::csv::write_with_recorded(&data.results(), data.recorded.as_ref(), w)
            })
        },
        &|| write_file(stage, "summary.md", |w| super::markdown::write_summary(data, w)),
    ];
    for step in steps {
        files.extend(step()?);
        bar.inc(1);
    }
    files.extend(write_file(stage, "index.html", |w| {
        super::html::write_index(data, &files, stage, w)
    })?);
    let files = staging.commit(&files, "index.html")?;
    bar.finish_and_clear();
    Ok(files)
}

/// Creates `dir/name`, lets `write` fill it, and flushes it.
fn write_file(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<()>,
) -> Result<Vec<PathBuf>> {
    use std::io::Write;
    let path = dir.join(name);
    let file = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
    let mut w = std::io::BufWriter::new(file);
    write(&mut w).map_err(|e| e.in_file(&path))?;
    w.flush().map_err(|e| Error::io(&path, e))?;
    Ok(vec![path])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testing::{text_trace, toy_report, training_text};

    /// The run reports draw first is the recording's own allocator with no options, whatever
    /// the order: not the same policy under other settings, nor another PyTorch variant.
    #[test]
    fn the_recorded_settings_run_is_the_recorded_allocator_without_options() {
        let run = |label: &str, policy: &str| {
            let mut output = ReplayOutput::default();
            output.result.policy = policy.into();
            PolicyRun { label: label.into(), index: 0, output }
        };
        assert!(run("pytorch", "pytorch").runs_recorded_settings());
        assert!(!run("pytorch:max_split_size_mb:128", "pytorch").runs_recorded_settings());
        assert!(!run("pytorch-expandable", "pytorch-expandable").runs_recorded_settings());
        assert!(!run("pytorch-cuda", "pytorch-cuda").runs_recorded_settings());
        assert!(!run("bfc", "bfc").runs_recorded_settings());
    }

    /// What `report` says of what it skipped and wrote: the command line and Python print these.
    #[test]
    fn a_report_names_what_it_skipped_and_where_it_wrote() {
        let mut data = toy_report(&text_trace(&training_text(4)), 2);
        data.skipped = vec![Skipped { label: "offline".into(), reason: "too big".into() }];
        assert_eq!(data.skipped_notes(), ["note: skipped policy 'offline': too big"]);
        let n = data.runs.len();
        assert_eq!(
            data.written_note(Path::new("out")),
            format!("wrote the report for {n} policies to out/index.html")
        );
        data.runs.truncate(1);
        assert_eq!(
            data.written_note(Path::new("d")),
            "wrote the report for 1 policy to d/index.html"
        );
    }

    /// The report directory for a test: a temp dir, or `$FRAGSIM_REPORT_PREVIEW/NAME` to keep it.
    fn out_dir(name: &str) -> (Option<tempfile::TempDir>, PathBuf) {
        match std::env::var_os("FRAGSIM_REPORT_PREVIEW") {
            Some(d) => (None, PathBuf::from(d).join(name)),
            None => {
                let t = tempfile::tempdir().unwrap();
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        }
    }

    /// Width and height from a PNG's IHDR chunk, after checking the signature.
    fn png_size(path: &Path) -> (u32, u32) {
        let b = std::fs::read(path).unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
        assert_eq!(&b[12..16], b"IHDR");
        let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        (be(16), be(20))
    }

    #[test]
    fn a_report_with_nine_policies_writes_every_file() {
        let trace = text_trace(&training_text(4));
        let data = toy_report(&trace, 8);
        let (_keep, dir) = out_dir("nine");
        let files = write_dir(&data, &dir, false).unwrap();
        let names: Vec<String> =
            files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        // Nine policies: the main timeline draws its focus (the best and bound here: no run is
        // named pytorch), and timeline-all every one of them.
        let main = plot::timeline::focus(&data);
        let labels: Vec<&str> = main.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(labels.contains(&"bound"), "{labels:?}");
        let best = data.runs.iter().filter(|r| r.label != "bound" && !r.output.result.oom);
        let best = best.min_by_key(|r| r.output.result.peak_reserved_bytes).unwrap();
        assert!(labels.contains(&best.label.as_str()), "{labels:?}");
        let main_svg = std::fs::read_to_string(dir.join("timeline.svg")).unwrap();
        let all_svg = std::fs::read_to_string(dir.join("timeline-all.svg")).unwrap();
        for run in &data.runs {
            let label = crate::report::html::escape(&run.label);
            assert!(all_svg.contains(&label), "timeline-all names {}", run.label);
            assert_eq!(
                main_svg.contains(&label),
                labels.contains(&run.label.as_str()),
                "{}",
                run.label
            );
        }
        for stem in ["timeline", "timeline-all", "peaks", "fragmentation", "segments", "sizes"] {
            assert!(
                names.contains(&format!("{stem}.png")) && names.contains(&format!("{stem}.svg"))
            );
            let (w, h) = png_size(&dir.join(format!("{stem}.png")));
            assert!(w >= 1200 && (300..4000).contains(&h), "{stem}: {w}x{h}");
            let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{stem}");
        }
        // One fragmentation panel and one peak bar per policy make those charts grow with them.
        assert_eq!(png_size(&dir.join("peaks.png")).1, 170 + 46 * 9);
        for name in ["results.json", "results.csv", "summary.md", "index.html"] {
            assert!(names.contains(&name.to_string()), "{name}");
        }
        let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
        assert_eq!(csv.lines().count(), 10);
    }

    #[test]
    fn the_plotted_series_keeps_every_peak_exactly() {
        // 40 steps × ~70 events: far more changes than the plotting budget.
        let trace = text_trace(&training_text(40));
        assert!(trace.devices[0].events.len() > 2 * PLOT_POINTS);
        let data = toy_report(&trace, 3);
        for run in &data.runs {
            let pts = plot::plotted_points(run);
            assert!(pts.len() <= PLOT_POINTS + 2, "{}", pts.len());
            let r = &run.output.result;
            assert_eq!(pts.iter().map(|p| p.reserved).max(), Some(r.peak_reserved_bytes));
            assert_eq!(pts.iter().map(|p| p.allocated).max(), Some(r.peak_allocated_bytes));
            assert_eq!(pts.iter().map(|p| p.requested).max(), Some(r.peak_requested_bytes));
            // The first moment of the peak is a plotted point, so the marker sits on the line.
            let d = &run.output.detail;
            assert!(
                pts.iter().any(
                    |p| p.event == d.peak_reserved_event && p.reserved == r.peak_reserved_bytes
                ),
                "{}",
                run.label
            );
        }
    }

    #[test]
    fn size_classes_are_continuous_and_skip_zero_byte_requests() {
        let trace = text_trace(
            "alloc 0x0 1 s0\nalloc 0x10 512 s0\nalloc 0x1000 1023 s0\nalloc 0x2000 1024 s0\n\
             alloc 0x3000 0 s0\n",
        );
        let bins = size_bins(&TraceSummary::of(&trace, "t", 0).info);
        // Classes 1, 2, 4, ..., 512, 1024: eleven, of which 2..=256 are empty.
        let mins: Vec<u64> = bins.iter().map(|b| b.min_bytes).collect();
        assert_eq!(mins, (0..11).map(|k| 1u64 << k).collect::<Vec<_>>());
        assert_eq!((bins[0].count, bins[0].bytes), (1, 1));
        assert_eq!((bins[9].count, bins[9].bytes, bins[9].max_bytes), (2, 1535, 1023));
        assert_eq!((bins[10].count, bins[10].bytes), (1, 1024));
        assert_eq!(bins[1..9].iter().map(|b| b.count).sum::<u64>(), 0);
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    #[test]
    fn only_policies_named_one_by_one_must_run() {
        let all = ReportPlan::policies_from(&[]).unwrap();
        assert_eq!(all.len(), policy::POLICIES.len());
        assert!(all.iter().all(|p| !p.named));
        let some =
            ReportPlan::policies_from(&["bound".into(), "all".into(), "buddy:x=1".into()]).unwrap();
        assert_eq!(some.len(), 2 + policy::POLICIES.len());
        assert!(some[0].named && some.last().unwrap().named);
        assert_eq!(some.last().unwrap().spec.options, "x=1");
        assert!(some[1..some.len() - 1].iter().all(|p| !p.named));
    }
}
