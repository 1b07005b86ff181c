//! `fragsim check`: replays traces and compares with a committed baseline, for CI.

use super::progress::Control;
use fragsim::error::{Error, Result};
use fragsim::policy::PolicySpec;
use fragsim::replay::ReplayOptions;
use fragsim::whatif::check::{self, Baseline};
use fragsim::whatif::Row;
use std::path::PathBuf;

/// Fail a CI job when memory got worse: replay traces and compare with a baseline.
///
/// Exit 0 when no metric got worse beyond the tolerance, 1 on a regression (one line each:
/// trace, policy, metric, baseline, now, change), 2 when a result has no baseline entry.
/// Improvements are reported and never fail. `--update` writes this run into the baseline:
/// entries it reran are replaced, new ones added, the others kept (and said).
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

    /// Write this run's results into the baseline instead of comparing: its entries for the
    /// traces and policies run are replaced, the others kept; FILE is created if missing.
    #[arg(long)]
    update: bool,

    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    control: Control,
}

impl Args {
    /// Whether the check prints on stdout (not with `--update`).
    pub fn prints_results(&self) -> bool {
        !self.update
    }
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let specs = PolicySpec::parse_many(&args.policies)?;
    let tolerance = check::parse_tolerance(&args.tolerance)?;
    // A broken baseline fails before the replays, not after.
    let control = args.control.clone();
    let traces = super::distinct_inputs(&args.traces, |n| control.note(io, n));
    if args.update {
        let inputs: Vec<&std::path::Path> = traces.iter().map(PathBuf::as_path).collect();
        fragsim::report::output::refuse_input(&args.baseline, "--baseline", &inputs)?;
    }
    // With --update, the baseline is read too (when it exists): the run is written over it,
    // keeping the entries this run does not produce.
    let previous = if args.update && args.baseline.exists() {
        let data = super::read_capped(io, &args.baseline, "baseline to update")?;
        Some(Baseline::parse(&data, &args.baseline).map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "{} (check --update keeps the baseline's other entries, so it must read the \
                     file; remove it to record a new baseline from scratch)",
                    e.message()
                ),
            )
            .in_file(&args.baseline)
        })?)
    } else {
        None
    };
    let baseline = if args.update {
        None
    } else {
        let data =
            super::read_capped(io, &args.baseline, "baseline (record one with check --update)")?;
        Some(Baseline::parse(&data, &args.baseline)?)
    };
    let bar = args.control.bar(io, specs.len() * traces.len(), "checking");
    let options = ReplayOptions { cancel: io.cancel.clone(), ..ReplayOptions::default() };
    let results = args.control.replay_traces(io, &traces, args.device, &specs, &options, &bar)?;
    bar.finish();
    let rows: Vec<Row> = traces
        .iter()
        .zip(&results)
        .flat_map(|(t, per)| per.iter().map(move |r| Row::new(t.display().to_string(), r)))
        .collect();

    let Some(baseline) = baseline else {
        let (written, line) = match &previous {
            Some(old) => {
                let (new, update) = old.updated(&rows);
                let line = format!(
                    "updated the baseline {}: {}",
                    args.baseline.display(),
                    update.describe()
                );
                (new, line)
            }
            None => (
                Baseline::new(&rows),
                format!(
                    "wrote the baseline of {} results to {}",
                    rows.len(),
                    args.baseline.display()
                ),
            ),
        };
        fragsim::report::output::write_bytes(&args.baseline, written.to_json().as_bytes())?;
        args.control.note(io, &line);
        return Ok(0);
    };
    let report = check::check(&baseline, &args.baseline, &rows, tolerance, None)?;
    let out = &mut *io.out;
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    if args.json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        writeln!(out, "{text}").map_err(io)?;
    } else {
        for c in &report.regressions {
            writeln!(out, "regression: {}", c.line()).map_err(io)?;
        }
        for c in &report.improvements {
            writeln!(out, "improvement: {}", c.line()).map_err(io)?;
        }
        let n = report.regressions.len();
        writeln!(
            out,
            "check: {} results against {} (tolerance {}%): {}",
            rows.len(),
            args.baseline.display(),
            tolerance * 100.0,
            if n == 0 {
                "ok".to_string()
            } else {
                format!("{n} regression{}", if n == 1 { "" } else { "s" })
            }
        )
        .map_err(io)?;
    }
    Ok(if report.ok { 0 } else { 1 })
}
