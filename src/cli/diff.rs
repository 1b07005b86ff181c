//! `fragsim diff`: two runs side by side, and what changed by allocation site.

use super::blame::By;
use fragsim::blame::diff::{self, DiffReport, SideSummary};
use fragsim::blame::{keep_end, BlameOptions, Moment};
use fragsim::error::Result;
use fragsim::policy::PolicySpec;
use fragsim::report::overlay::SideLines;
use fragsim::session::Session;
use fragsim::trace::sites::printable;
use fragsim::units::format_bytes;
use std::path::{Path, PathBuf};

/// Two runs side by side: two traces, or one trace under two policies.
///
/// `diff A B` replays both traces (each under the -p given, pytorch by default, or the first -p
/// for A and the second for B); `diff TRACE -p X -p Y` replays one trace under two policies.
/// Prints both runs' peak reserved, allocated and live bytes, the deltas, and the live bytes
/// by site at each run's peak-live moment with their delta (which add up to the live delta),
/// sorted by |delta|; then the two allocation sequences aligned by site, and the matched pairs
/// whose sizes differ most.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trace A (the baseline).
    #[arg(value_name = "A")]
    a: PathBuf,

    /// Trace B; without it, A is replayed under two policies.
    #[arg(value_name = "B")]
    b: Option<PathBuf>,

    /// A policy as NAME or NAME:OPTIONS: one for both runs, or two (A's, then B's).
    #[arg(long = "policy", short = 'p', value_name = "SPEC")]
    policies: Vec<String>,

    /// The device to replay (default: each trace's device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,

    /// How to group: by site, the site's function or file, the request's stream or size class.
    #[arg(long, value_enum, default_value_t = By::Site)]
    by: By,

    /// List this many sites and matched pairs, the rest of the sites folded into (other); 0
    /// lists all.
    #[arg(long, value_name = "N", default_value_t = 15)]
    top: usize,

    /// Key sites by this many innermost user frames (1: the site alone).
    #[arg(long, value_name = "K", default_value_t = 1)]
    depth: usize,

    /// Also write both runs on one axis and the site deltas as charts (PNG and SVG), with
    /// diff.json and diff.html, into this directory.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,

    #[command(flatten)]
    format: super::FormatArgs,

    /// What-if: model PyTorch release V in the pytorch policies. With one trace and one policy
    /// (or none: pytorch), A is that policy as the recording has it and B the same under V:
    /// what upgrading PyTorch does to this run's memory.
    #[command(flatten)]
    version: super::VersionFlag,

    #[command(flatten)]
    control: super::progress::Control,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let policies = match (&args.b, args.policies.len()) {
        // One trace, one policy: as recorded against the release asked.
        (None, 0 | 1) if args.version.given() => {
            let a = args.policies.first().cloned().unwrap_or_else(|| "pytorch".into());
            let b = args.version.apply(std::slice::from_ref(&a), &[])?;
            std::iter::once(a).chain(b).collect()
        }
        _ => args.version.apply(&args.policies, &["pytorch"])?,
    };
    let (spec_a, spec_b) = diff::pair_specs(&policies, args.b.is_some())?;
    fragsim::blame::check_depth(args.depth)?;
    if let Some(dir) = &args.out {
        let inputs: Vec<&Path> =
            std::iter::once(args.a.as_path()).chain(args.b.as_deref()).collect();
        fragsim::report::output::refuse_input_in_folder(dir, "--out", &inputs)?;
    }
    let options = BlameOptions {
        at: Moment::PeakLive,
        by: args.by.group(),
        top: args.top,
        depth: args.depth,
        ..BlameOptions::default()
    };
    // One trace at a time: A is summarised and dropped before B is read, so two large traces
    // are never held at once.
    let charts = args.out.is_some();
    // B naming A's file again is read once (a FIFO's second open would wait forever).
    let b = match &args.b {
        Some(b) => {
            let paths = [args.a.clone(), b.clone()];
            let control = args.control.clone();
            let distinct =
                fragsim::report::output::distinct_inputs(&paths, |n| control.note(io, n));
            (distinct.len() == 2).then(|| b.clone())
        }
        None => None,
    };
    let session_a = args.control.session(io, &args.a, args.device, true)?;
    let (side_a, lines_a) = side(&args, io, &session_a, &spec_a, &options, charts)?;
    let (side_b, lines_b) = match &b {
        Some(path) => {
            drop(session_a);
            let session_b = args.control.session(io, path, args.device, true)?;
            side(&args, io, &session_b, &spec_b, &options, charts)?
        }
        None => side(&args, io, &session_a, &spec_b, &options, charts)?,
    };
    let (report, pairs) = diff::compare(&side_a, &side_b, &options);
    if let (Some(dir), Some(a), Some(b)) = (&args.out, lines_a, lines_b) {
        let data = fragsim::report::overlay::place(report.clone(), &a, &b, pairs);
        fragsim::report::overlay::write_dir(&data, dir)?;
        args.control.note(io, &format!("wrote the charts to {}", dir.join("diff.html").display()));
    }
    let table = |r: &DiffReport| table(r) + &note_line(r);
    super::print_as(&mut *io.out, args.format.format(), &report, csv, table)?;
    Ok(0)
}

/// One run of the diff on `session` under `spec`, and its memory over time when `charts`.
fn side(
    args: &Args,
    io: &mut super::Io,
    session: &Session,
    spec: &PolicySpec,
    options: &BlameOptions,
    charts: bool,
) -> Result<(SideSummary, Option<SideLines>)> {
    args.control.install(io, 1, || {
        let summary = session.diff_side(spec, options)?;
        let lines = if charts { Some(session.diff_lines(spec, options)?) } else { None };
        Ok((summary, lines))
    })?
}

/// `diff --format csv`: the site deltas, one row each (`kind` `site`), then the moved blocks,
/// one row per move (`kind` `moved`: `site` is where A allocated them, `to_site` where B did,
/// the same bytes in both runs).
pub(crate) fn csv(r: &DiffReport) -> String {
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut out = String::from("site,a_bytes,b_bytes,delta_bytes,only_in,kind,to_site,blocks\n");
    for s in &r.sites {
        out += &format!(
            "{},{},{},{},{},site,,\n",
            q(&s.site),
            s.a_bytes,
            s.b_bytes,
            s.delta_bytes,
            s.only_in.as_deref().unwrap_or("")
        );
    }
    for m in &r.moved {
        out += &format!(
            "{},{},{},0,,moved,{},{}\n",
            q(&m.from_site),
            m.bytes,
            m.bytes,
            q(&m.to_site),
            m.blocks
        );
    }
    out
}

/// The table's last line: the report's note (unlike site kinds), where it has one.
fn note_line(r: &DiffReport) -> String {
    r.note.as_ref().map(|n| format!("note: {n}\n")).unwrap_or_default()
}

/// Both runs' peaks and their deltas; the reserved peak split into the cache each run started
/// with and what it grew by during its trace, where a run started warm.
fn peak_lines(r: &DiffReport) -> String {
    let start = |p: &diff::RunPeaks| p.start_reserved_bytes.min(p.peak_reserved_bytes);
    let grown = |p: &diff::RunPeaks| p.peak_reserved_bytes - start(p);
    let warm = start(&r.a) > 0 || start(&r.b) > 0;
    let mut rows = vec![(
        "peak reserved",
        r.a.peak_reserved_bytes,
        r.b.peak_reserved_bytes,
        r.delta.peak_reserved_bytes,
    )];
    if warm {
        rows.push(("  cache at the start", start(&r.a), start(&r.b), r.delta.start_reserved_bytes));
        rows.push(("  grown during trace", grown(&r.a), grown(&r.b), r.delta.grown_reserved_bytes));
    }
    rows.push((
        "peak allocated",
        r.a.peak_allocated_bytes,
        r.b.peak_allocated_bytes,
        r.delta.peak_allocated_bytes,
    ));
    rows.push(("peak live", r.a.peak_live_bytes, r.b.peak_live_bytes, r.delta.peak_live_bytes));
    let mut out = format!("\n  {:<22} {:>14} {:>14} {:>14}\n", "", "A", "B", "B - A");
    for (name, a, b, d) in rows {
        out += &format!(
            "  {name:<22} {:>14} {:>14} {:>14}\n",
            format_bytes(a),
            format_bytes(b),
            signed_bytes(d)
        );
    }
    if warm {
        out += "  (the cache at the start is what each run had reserved before its trace began)\n";
    }
    out
}

/// The blocks that moved from one site to another, sites `w` wide; empty when none did.
fn moved_lines(r: &DiffReport, w: usize) -> String {
    if r.moved.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nmoved: blocks of the same size live in both runs under another site (left out above)\n",
    );
    let half = w / 2;
    for m in &r.moved {
        out += &format!(
            "  {:<half$} -> {:<half$} {:>12} {:>8} block{}\n",
            keep_end(&m.from_site, half),
            keep_end(&m.to_site, half),
            format_bytes(m.bytes),
            m.blocks,
            if m.blocks == 1 { "" } else { "s" }
        );
    }
    out
}

/// A signed byte count for people.
fn signed_bytes(d: i64) -> String {
    let sign = if d < 0 {
        "-"
    } else if d > 0 {
        "+"
    } else {
        ""
    };
    format!("{sign}{}", format_bytes(d.unsigned_abs()))
}

/// The table for people.
pub(crate) fn table(r: &DiffReport) -> String {
    let run = |name: &str, p: &diff::RunPeaks| {
        format!("{name}: {} under {} ({})\n", printable(&p.trace), p.policy, p.config)
    };
    let mut out = run("A", &r.a) + &run("B", &r.b) + &peak_lines(r);
    let w = 64;
    out += &format!(
        "\nlive bytes by {} at each run's peak-live moment (A: event {}, B: event {})\n",
        r.by.name(),
        r.a.peak_live_event,
        r.b.peak_live_event
    );
    out += &format!("  {:<w$} {:>12} {:>12} {:>13}\n", "site", "A", "B", "B - A");
    for s in &r.sites {
        let mark = match s.only_in.as_deref() {
            Some("a") => " (A only)",
            Some("b") => " (B only)",
            _ => "",
        };
        out += &format!(
            "  {:<w$} {:>12} {:>12} {:>13}{mark}\n",
            keep_end(&s.site, w),
            format_bytes(s.a_bytes),
            format_bytes(s.b_bytes),
            signed_bytes(s.delta_bytes)
        );
    }
    out += &moved_lines(r, w);
    out += &format!(
        "\nallocations aligned by {} ({}): {} matched, {} of them differ in size\n",
        r.by.name(),
        r.alignment,
        r.matched_count,
        if r.matched.is_empty() {
            "none".to_string()
        } else {
            format!("the {} largest shown", r.matched.len())
        }
    );
    for m in &r.matched {
        out += &format!(
            "  {:<w$} {:>12} {:>12}  (events {} / {})\n",
            keep_end(&m.site, w),
            format_bytes(m.a_size),
            format_bytes(m.b_size),
            m.a_event,
            m.b_event
        );
    }
    out
}
