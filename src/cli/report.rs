//! `fragsim report`: replay a trace against policies and write charts, tables and a web page.

use fragsim::error::Result;
use fragsim::policy::PolicySpec;
use fragsim::report::{self, ReportPlan};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Write a report: charts (PNG and SVG), the results as Markdown, JSON and CSV, and an index.html.
///
/// Replays one device's events against each policy (default: every built-in policy that runs;
/// ones that cannot are skipped with a note) and writes into DIR: timeline, peaks,
/// fragmentation, segment map at the peak and allocation sizes, each as .png and .svg;
/// results.json (the `replay --json` object), results.csv, summary.md and index.html.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace: PyTorch snapshot, Kineto JSON, RMM CSV, .fst or text (gzip accepted).
    #[arg(value_name = "TRACE")]
    trace: PathBuf,

    /// A policy as NAME or NAME:OPTIONS (repeatable; `all` for every built-in policy).
    #[arg(long = "policy", short = 'p', value_name = "SPEC")]
    policies: Vec<String>,

    /// The device to replay (default: the device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,

    /// Device memory, e.g. 40GiB or 80GB: allocations beyond it fail as OOM.
    #[arg(long, value_name = "SIZE", value_parser = super::size_arg)]
    capacity: Option<u64>,

    /// The directory to write into (created if missing; files in it are overwritten).
    #[arg(long, short = 'o', value_name = "DIR")]
    out: PathBuf,

    /// The policy whose segments are drawn at its peak (default: pytorch, else the first
    /// replayed policy that reports segments).
    #[arg(long, value_name = "NAME")]
    segment_map_policy: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let policies = ReportPlan::policies_from(&args.policies)?;
    if let Some(name) = &args.segment_map_policy {
        PolicySpec::parse_list(name)?;
    }
    let progress = std::io::stderr().is_terminal();
    let plan = ReportPlan {
        trace_path: args.trace.display().to_string(),
        policies,
        device: args.device,
        capacity: args.capacity,
        segment_map_policy: args.segment_map_policy,
        progress,
    };
    let trace = super::read_trace(&args.trace, false)?;
    let data = report::collect(&trace, &plan)?;
    for s in &data.skipped {
        eprintln!("fragsim: note: skipped policy '{}': {}", s.label, s.reason);
    }
    report::write_dir(&data, &args.out, progress)?;
    let n = data.runs.len();
    eprintln!(
        "fragsim: wrote the report for {n} {} to {}",
        if n == 1 { "policy" } else { "policies" },
        args.out.join("index.html").display()
    );
    Ok(ExitCode::SUCCESS)
}
