//! `fragsim blame`: at a moment of each policy's replay, reserved bytes by allocation site.

use super::ReplaySource;
use fragsim::blame::{keep_end, Attribution, BlameOptions, BlameReport, GroupBy, Moment, SiteRule};
use fragsim::error::{Error, Result};
use fragsim::policy::PolicySpec;
use fragsim::units::format_bytes;
use std::path::PathBuf;

/// Where did the memory go: reserved bytes at a moment, split by allocation site.
///
/// At the moment (default: each policy's peak reserved memory), reserved bytes are live
/// requested bytes by the site of each live block, the policy's rounding by the same sites, and
/// cached-but-free bytes (fragmentation), attributed both to the site whose request created the
/// segment (or mapped the pages) they sit in and to the site of the block last freed into the
/// hole. Sums are exact. A site is the innermost frame of the user's own Python code (see
/// docs/interface.md, "Sites"); a trace without frames groups by size class and stream.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: ReplaySource,

    /// The moment: peak (each policy's peak reserved), peak-live (the first moment live
    /// requested bytes peak), oom (the first OOM under --capacity) or an event index.
    #[arg(long, value_name = "peak|peak-live|oom|EVENT", default_value = "peak")]
    at: String,

    /// How to group: by site, the site's function or file, the request's stream or size class.
    #[arg(long, value_enum, default_value_t = By::Site)]
    by: By,

    /// List this many groups, the rest folded into (other); 0 lists all.
    #[arg(long, value_name = "N", default_value_t = 15)]
    top: usize,

    /// Key sites by this many innermost user frames (1: the site alone).
    #[arg(long, value_name = "K", default_value_t = 1)]
    depth: usize,

    /// Write the live bytes at the first policy's moment by full stack as a flame graph (SVG).
    #[arg(long, value_name = "OUT.svg")]
    flamegraph: Option<PathBuf>,

    #[command(flatten)]
    format: super::FormatArgs,

    #[command(flatten)]
    control: super::progress::Control,
}

/// `--by`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum By {
    /// The site rule.
    Site,
    /// The site's function.
    Function,
    /// The site's file.
    File,
    /// The request's stream.
    Stream,
    /// The request's power-of-two size class.
    Size,
    /// The `annotate` label on the allocation (PyTorch 2.14+ snapshots).
    Annotation,
}

impl By {
    /// The library's grouping.
    pub(crate) fn group(self) -> GroupBy {
        match self {
            By::Site => GroupBy::Site,
            By::Function => GroupBy::Function,
            By::File => GroupBy::File,
            By::Stream => GroupBy::Stream,
            By::Size => GroupBy::Size,
            By::Annotation => GroupBy::Annotation,
        }
    }
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let specs = PolicySpec::parse_many(&args.source.policies(&["pytorch"])?)?;
    let at = Moment::parse(&args.at)?;
    fragsim::blame::check_depth(args.depth)?;
    let path = &args.source.trace;
    if let Some(out) = &args.flamegraph {
        fragsim::report::output::refuse_input(out, "--flamegraph", &[path])?;
    }
    let session = args.control.session(io, path, args.source.device, true)?;
    super::print_notes(&args.control, io, &session, &specs);
    let options = BlameOptions {
        at,
        by: args.by.group(),
        top: args.top,
        depth: args.depth,
        replay: session
            .replay_options(args.source.capacity.get(), args.source.empty_cache_plan()?)?,
    };
    let report = args.control.install(io, specs.len(), || session.blame(&specs, &options))??;
    if let Some(out) = &args.flamegraph {
        // Drawn whole before the file is touched: a graph that cannot be drawn leaves an
        // existing file as it was.
        let named = !args.source.policies.is_empty() || args.source.version.given();
        if let Some(svg) = session.flame_graph(&report, named)? {
            fragsim::report::output::write_output(out, "--flamegraph", |w| {
                w.write_all(svg.as_bytes()).map_err(|e| Error::writing("the flame graph", e))
            })?;
            args.control.note(io, &format!("wrote the flame graph to {}", out.display()));
        }
    }
    super::print_as(&mut *io.out, args.format.format(), &report, csv, table)?;
    Ok(0)
}

/// `blame --format csv`: one row per listed group of each table of each run.
pub(crate) fn csv(report: &BlameReport) -> String {
    let mut out = String::from(
        "policy,config,moment,event,table,site,live_bytes,rounding_bytes,blocks,cached_free_bytes\n",
    );
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    for r in &report.results {
        let head =
            format!("{},{},{},{}", q(&r.policy), q(&r.config), r.moment.kind, r.moment.event);
        for s in &r.sites {
            out += &format!(
                "{head},live,{},{},{},{},\n",
                q(&s.site),
                s.live_bytes,
                s.rounding_bytes,
                s.blocks
            );
        }
        for (table, rows) in [
            ("holes_by_segment_site", &r.holes_by_segment_site),
            ("holes_by_last_free_site", &r.holes_by_last_free_site),
        ] {
            for h in rows {
                out += &format!("{head},{table},{},,,,{}\n", q(&h.site), h.cached_free_bytes);
            }
        }
    }
    out
}

/// The widest site shown in a table; longer ones keep their end (the file name, line and
/// function), their start elided.
const SITE_WIDTH: usize = 72;

/// The table for people.
pub(crate) fn table(report: &BlameReport) -> String {
    let mut out = String::new();
    if report.site_rule == SiteRule::SizeAndStream {
        out += "note: this trace records no stack frames: sites are size classes and streams\n";
    }
    for (i, r) in report.results.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out += &run_table(r, report.by);
    }
    out
}

/// One run's tables.
fn run_table(r: &Attribution, by: GroupBy) -> String {
    let pct = |b: u64| {
        if r.reserved_bytes == 0 {
            0.0
        } else {
            100.0 * b as f64 / r.reserved_bytes as f64
        }
    };
    let mut out = format!(
        "{} at {} (event {}): reserved {} = live {} + rounding {} + cached free {} ({:.1}%)\n",
        r.policy,
        r.moment.kind,
        r.moment.event,
        format_bytes(r.reserved_bytes),
        format_bytes(r.live_bytes),
        format_bytes(r.rounding_bytes),
        format_bytes(r.cached_free_bytes),
        pct(r.cached_free_bytes),
    );
    if let Some(note) = &r.note {
        out += &format!("  note: {note}\n");
    }
    let w = SITE_WIDTH;
    out += &format!(
        "  {:<w$}  {:>12}  {:>12}  {:>7}\n",
        format!("live, by {}", by.name()),
        "live",
        "rounding",
        "blocks"
    );
    for s in &r.sites {
        out += &format!(
            "  {:<w$}  {:>12}  {:>12}  {:>7}\n",
            keep_end(&s.site, w),
            format_bytes(s.live_bytes),
            format_bytes(s.rounding_bytes),
            s.blocks
        );
    }
    for (title, rows) in [
        ("cached free, by the site that created its segment", &r.holes_by_segment_site),
        ("cached free, by the site last freed into the hole", &r.holes_by_last_free_site),
    ] {
        if rows.is_empty() {
            continue;
        }
        out += &format!("  {title:<w$}  {:>12}\n", "bytes");
        for h in rows.iter() {
            out += &format!(
                "  {:<w$}  {:>12}\n",
                keep_end(&h.site, w),
                format_bytes(h.cached_free_bytes)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_sites_keep_their_end() {
        assert_eq!(keep_end("abc", 5), "abc");
        assert_eq!(keep_end("/very/long/path/model.py:75:forward", 12), "…:75:forward");
        assert_eq!(keep_end("/very/long/path/model.py:75:forward", 12).chars().count(), 12);
    }
}
