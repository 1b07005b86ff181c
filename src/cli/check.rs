//! `fragsim check`: replays traces and compares with a committed baseline, for CI.

use super::progress::{Control, Targets};
use fragsim::error::{Error, Result};
use fragsim::policy::PolicySpec;
use fragsim::replay::ReplayOptions;
use fragsim::whatif::check::{self, Baseline, CheckReport};
use fragsim::whatif::Row;
use std::path::PathBuf;

/// Fail a CI job when memory got worse: replay traces and compare with a baseline.
///
/// Exit 0 when no metric got worse beyond the tolerance, 1 on a regression (one line each:
/// trace, policy, metric, baseline, now, change), 2 when a result has no baseline entry.
/// Improvements are reported and never fail. `--update` writes this run into the baseline:
/// entries it reran are replaced, new ones added, the others kept (and said). Each trace
/// replays under the limit its recording implies, as `replay` does, unless `--capacity` says
/// otherwise; a baseline entry compares only with a run under the same capacity (exit 2).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The traces to replay.
    #[arg(value_name = "TRACE", required = true)]
    traces: Vec<PathBuf>,

    /// The baseline: a file written by `check --update`, or a `replay --json` output.
    #[arg(long, value_name = "FILE")]
    baseline: PathBuf,

    /// How much worse a metric may get before it fails, in percent.
    #[arg(long, value_name = "PCT", default_value = "1%")]
    tolerance: String,

    /// A policy as NAME or NAME:OPTIONS (repeatable; default: pytorch, the recorded settings).
    #[arg(long = "policy", short = 'p', value_name = "SPEC")]
    policies: Vec<String>,

    /// The device to replay in every trace (default: each trace's device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,

    #[command(flatten)]
    capacity: super::CapacityFlag,

    /// Write this run's results into the baseline instead of comparing: its entries for the
    /// traces and policies run are replaced, the others kept; FILE is created if missing.
    #[arg(long)]
    update: bool,

    /// How to print the comparison (CSV: one row per regression or improvement).
    #[command(flatten)]
    format: super::FormatArgs,

    #[command(flatten)]
    version: super::VersionFlag,

    #[command(flatten)]
    control: Control,
}

impl Args {
    /// Whether the check prints on stdout (not with `--update`).
    pub(crate) fn prints_results(&self) -> bool {
        !self.update
    }
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let specs = PolicySpec::parse_many(&args.version.apply(&args.policies, &["pytorch"])?)?;
    let tolerance = check::parse_tolerance(&args.tolerance)?;
    // A broken baseline fails before the replays, not after.
    let control = args.control.clone();
    let traces = fragsim::report::output::distinct_inputs(&args.traces, |n| control.note(io, n));
    if args.update {
        let inputs: Vec<&std::path::Path> = traces.iter().map(PathBuf::as_path).collect();
        fragsim::report::output::refuse_input(&args.baseline, "--baseline", &inputs)?;
    }
    let (previous, baseline) = read_baselines(&args, io)?;
    let bar = args.control.bar(io, specs.len() * traces.len(), "checking");
    let options = ReplayOptions { cancel: io.cancel.clone(), ..ReplayOptions::default() };
    let replayed = args.control.replay_traces(
        io,
        Targets { traces: &traces, device: args.device, capacity: args.capacity.get() },
        &specs,
        &options,
        &bar,
        None,
    )?;
    bar.finish();
    note_inferred_capacities(&args.control, io, &replayed);
    let rows: Vec<Row> = traces
        .iter()
        .zip(&replayed)
        .flat_map(|(t, per)| per.results.iter().map(move |r| Row::new(t.display().to_string(), r)))
        .collect();

    let Some(baseline) = baseline else {
        update(&args, io, previous.as_ref(), &rows)?;
        return Ok(0);
    };
    let report = check::check(&baseline, &args.baseline, &rows, tolerance, None)?;
    super::print_as(&mut *io.out, args.format.format(), &report, csv, |r| table(r, rows.len()))?;
    Ok(if report.ok { 0 } else { 1 })
}

/// The baselines `run` needs before any replay, so that a broken one fails first: with
/// `--update`, the baseline to write over (when it exists: the run keeps the entries it does not
/// produce); without, the baseline to compare with.
fn read_baselines(args: &Args, io: &mut super::Io) -> Result<(Option<Baseline>, Option<Baseline>)> {
    if !args.update {
        let data =
            super::read_capped(io, &args.baseline, "baseline (record one with check --update)")?;
        return Ok((None, Some(Baseline::parse(&data, &args.baseline)?)));
    }
    if !args.baseline.exists() {
        return Ok((None, None));
    }
    let read = super::read_capped(io, &args.baseline, "baseline to update")
        .and_then(|data| Baseline::parse(&data, &args.baseline));
    let previous = read.map_err(|e| {
        let err = Error::new(
            e.kind(),
            format!(
                "{} (check --update keeps the baseline's other entries, so it must read the \
                 file; remove it to record a new baseline from scratch)",
                e.message()
            ),
        )
        .in_file(&args.baseline);
        match e.location().place {
            Some(p) => err.at(p),
            None => err,
        }
    })?;
    Ok((Some(previous), None))
}

/// Says, per trace replayed under the limit its recording implies, what that limit was.
fn note_inferred_capacities(
    control: &super::progress::Control,
    io: &mut super::Io,
    replayed: &[super::progress::Replayed],
) {
    for r in replayed {
        if let Some(bytes) = r.capacity.filter(|_| r.inferred) {
            control.note(io, &fragsim::session::several::inferred_capacity_note(&r.trace, bytes));
        }
    }
}

/// `--update`: writes `rows` into the baseline (over `previous`, keeping its other entries).
fn update(
    args: &Args,
    io: &mut super::Io,
    previous: Option<&Baseline>,
    rows: &[Row],
) -> Result<()> {
    let (written, line) = match previous {
        Some(old) => {
            let (new, update) = old.updated(rows);
            (
                new,
                format!("updated the baseline {}: {}", args.baseline.display(), update.describe()),
            )
        }
        None => (
            Baseline::new(rows),
            format!("wrote the baseline of {} results to {}", rows.len(), args.baseline.display()),
        ),
    };
    fragsim::report::output::write_bytes(&args.baseline, written.to_json().as_bytes())?;
    args.control.note(io, &line);
    Ok(())
}

/// `check --format csv`: one row per regression, then per improvement.
pub(crate) fn csv(report: &CheckReport) -> String {
    use fragsim::report::csv::field;
    let mut out = String::from("kind,trace,policy,config,metric,baseline,now,change\n");
    let changes = [("regression", &report.regressions), ("improvement", &report.improvements)];
    for (kind, list) in changes {
        for c in list.iter() {
            let change = c.change.map(|x| x.to_string()).unwrap_or_default();
            out += &format!(
                "{kind},{},{},{},{},{},{},{change}\n",
                field(&c.trace),
                field(&c.policy),
                field(&c.config),
                c.metric,
                c.baseline,
                c.now
            );
        }
    }
    out
}

/// The comparison for people: a line per regression and improvement, then the verdict over
/// `results` results.
fn table(report: &CheckReport, results: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for c in &report.regressions {
        let _ = writeln!(out, "regression: {}", c.line());
    }
    for c in &report.improvements {
        let _ = writeln!(out, "improvement: {}", c.line());
    }
    let n = report.regressions.len();
    let _ = writeln!(
        out,
        "check: {results} results against {} (tolerance {}%): {}",
        report.baseline,
        report.tolerance * 100.0,
        if n == 0 {
            "ok".to_string()
        } else {
            format!("{n} regression{}", if n == 1 { "" } else { "s" })
        }
    );
    out
}
