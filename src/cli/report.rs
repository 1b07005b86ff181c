//! `fragsim report`: replay a trace against policies and write charts, tables and a web page.

use fragsim::error::Result;
use fragsim::policy::PolicySpec;
use fragsim::report::{self, ReportPlan};
use std::path::PathBuf;

/// Write a report: charts (PNG and SVG), the results as Markdown, JSON and CSV, and an index.html.
///
/// Replays one device's events against each policy (default: every built-in policy that runs;
/// ones that cannot are skipped with a note) and writes into DIR: timeline, peaks, where the
/// memory went by allocation site (with flame.svg), fragmentation, segment map at the peak and
/// allocation sizes, each as .png and .svg;
/// results.json (the `replay --json` object), results.csv, summary.md and index.html.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: super::ReplaySource,

    /// The directory to write into (created if missing; files in it are overwritten).
    #[arg(long, short = 'o', value_name = "DIR")]
    out: PathBuf,

    /// The policy whose segments are drawn at its peak (default: pytorch, else the first
    /// replayed policy that reports segments).
    #[arg(long, value_name = "NAME")]
    segment_map_policy: Option<String>,

    #[command(flatten)]
    control: super::progress::Control,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let mut policies = ReportPlan::policies_from(&args.source.policies)?;
    if args.source.version.given() {
        // One spec per planned policy, so the default set stays optional.
        let written: Vec<String> = policies.iter().map(|p| p.spec.display()).collect();
        let versioned = args.source.version.apply(&written, &[])?;
        for (planned, text) in policies.iter_mut().zip(versioned) {
            planned.spec = PolicySpec::parse_list(&text)?.remove(0);
        }
    }
    let policies_count = policies.len();
    if let Some(name) = &args.segment_map_policy {
        PolicySpec::parse_list(name)?;
    }
    let progress = args.control.show_progress(io);
    fragsim::report::output::refuse_input_in_folder(&args.out, "--out", &[&args.source.trace])?;
    // Frames name the allocation sites of the "where the memory went" chart.
    let session = args.control.session(io, &args.source.trace, args.source.device, true)?;
    let specs: Vec<PolicySpec> = policies.iter().map(|p| p.spec.clone()).collect();
    super::print_notes(&args.control, io, &session, &specs);
    let resolved = session.capacity(args.source.capacity.get())?;
    if let Some(note) = resolved.inferred_note() {
        io.note(&note);
    }
    let plan = ReportPlan {
        trace_path: args.source.trace.display().to_string(),
        policies,
        device: args.source.device,
        capacity: resolved.bytes,
        capacity_inferred: resolved.inferred,
        capacity_kind: resolved.kind,
        empty_cache: args.source.empty_cache_plan()?,
        segment_map_policy: args.segment_map_policy,
        progress,
        jobs: args.control.jobs_for(io, policies_count),
        cancel: io.cancel.clone(),
    };
    let data = session.report(&plan)?;
    for note in data.skipped_notes() {
        args.control.note(io, &note);
    }
    report::write_dir(&data, &args.out, progress)?;
    args.control.note(io, &data.written_note(&args.out));
    Ok(0)
}
