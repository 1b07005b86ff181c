//! `fragsim explain`: was it fragmentation, of which kind, and what would have fixed it.

use super::ReplaySource;
use fragsim::blame::keep_end;
use fragsim::error::Result;
use fragsim::explain::{ExplainOptions, Explanation, Verdict};
use fragsim::report::csv::field;
use fragsim::units::format_bytes;

/// Was it fragmentation, of which kind, and what would have fixed it.
///
/// At the first OOM (the recording's own, or the replay's under --capacity), else at the highest
/// reserved memory during the trace: the moment in numbers, the verdict (capacity: no allocator
/// could have served it; fragmentation: the cache could not), the cached-free memory by kind
/// (adding up to reserved − allocated), the segments a few live blocks strand, the top live
/// sites, and replays under the settings that target what was found, ranked, with the line to
/// paste. The policy is the recorded settings unless --policy says otherwise.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: ReplaySource,

    /// The moment: oom (the first OOM), peak (the highest reserved memory during the trace) or
    /// an event index; default: oom where there is one, else peak.
    #[arg(long, value_name = "oom|peak|EVENT")]
    at: Option<String>,

    /// List this many live sites and stranded segments (0: all).
    #[arg(long, value_name = "N", default_value_t = 10)]
    top: usize,

    /// Skip the replays of the fixes.
    #[arg(long)]
    no_fixes: bool,

    #[command(flatten)]
    format: super::FormatArgs,

    #[command(flatten)]
    control: super::progress::Control,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let spec = ExplainOptions::one_spec(&args.source.policies(&["pytorch"])?)?;
    let at = ExplainOptions::moment(args.at.as_deref())?;
    let path = &args.source.trace;
    let session = args.control.session(io, path, args.source.device, true)?;
    super::print_notes(&args.control, io, &session, std::slice::from_ref(&spec));
    let options = ExplainOptions {
        at,
        spec,
        replay: session
            .replay_options(args.source.capacity.get(), args.source.empty_cache_plan()?)?,
        top: args.top,
        fixes: !args.no_fixes,
    };
    let e = args.control.install(io, 8, || session.explain(&options))??;
    super::print_as(&mut *io.out, args.format.format(), &e, csv, table)?;
    Ok(0)
}

/// `explain --format csv`: one row per kind of free memory, stranded segment, site and fix;
/// `table` names which, the moment's numbers repeat on every row.
pub(crate) fn csv(e: &Explanation) -> String {
    let mut out = String::from(
        "verdict,moment,event,request_bytes,capacity_bytes,reserved_bytes,allocated_bytes,\
         live_requested_bytes,table,name,bytes,blocks,other_bytes,fits,flags,env\n",
    );
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let head = format!(
        "{},{},{},{},{},{},{},{}",
        e.verdict.name(),
        e.moment.kind,
        e.moment.event,
        opt(e.moment.request_bytes),
        opt(e.capacity_bytes),
        e.reserved_bytes,
        e.allocated_bytes,
        e.live_requested_bytes
    );
    for f in &e.free {
        out += &format!(
            "{head},free,{},{},{},{},,,\n",
            f.kind.name(),
            f.bytes,
            f.blocks,
            f.largest_bytes
        );
    }
    for s in &e.stranded {
        out += &format!(
            "{head},stranded,{},{},{},{},,,\n",
            field(&s.site),
            s.segment_bytes,
            s.blocks,
            s.live_bytes
        );
    }
    for s in &e.sites {
        out += &format!("{head},sites,{},{},,,,,\n", field(&s.site), s.live_bytes);
    }
    for f in &e.fixes {
        out += &format!(
            "{head},fixes,{},{},,{},{},{},{}\n",
            field(&f.spec),
            f.peak_reserved_bytes,
            opt(f.capacity_bytes),
            f.fits,
            field(&f.flags.join(" ")),
            field(f.env.as_deref().unwrap_or(""))
        );
    }
    out
}

/// The widest site shown.
const SITE_WIDTH: usize = 64;

/// The table for people: the verdict line first.
pub(crate) fn table(e: &Explanation) -> String {
    let gb = format_bytes;
    let limit =
        e.capacity_bytes.map_or("no limit".to_string(), |c| format!("a limit of {}", gb(c)));
    let at_moment = e.live_requested_bytes.saturating_add(e.moment.request_bytes.unwrap_or(0));
    let mut out = match (e.verdict, e.moment.request_bytes) {
        // What the trace holds live elsewhere is more than this moment needs.
        (Verdict::Capacity, r) if e.needs_bytes > at_moment => format!(
            "verdict: capacity — no allocator could run this in {limit}: it needs {}, the most \
             the trace ever holds live (bound's peak; at this OOM {} live + the {} request)\n",
            gb(e.needs_bytes),
            gb(e.live_requested_bytes),
            gb(r.unwrap_or(0)),
        ),
        (Verdict::Capacity, r) => format!(
            "verdict: capacity — no allocator could run this in {limit}: it needs {} ({} live + \
             the {} request at this OOM)\n",
            gb(e.needs_bytes),
            gb(e.live_requested_bytes),
            gb(r.unwrap_or(0)),
        ),
        (Verdict::Fragmentation, r) => format!(
            "verdict: fragmentation — {} live + the {} request fit in {limit}, but {} cached \
             free could not serve it\n",
            gb(e.live_requested_bytes),
            gb(r.unwrap_or(0)),
            gb(e.reserved_bytes - e.allocated_bytes)
        ),
        _ => format!(
            "verdict: fits — no OOM under {limit}; at the highest reserved memory {} of {} \
             reserved is cached free\n",
            gb(e.reserved_bytes - e.allocated_bytes),
            gb(e.reserved_bytes)
        ),
    };
    for n in &e.notes {
        out += &format!("note: {n}\n");
    }
    out + &moment_lines(e) + &fix_lines(e)
}

/// The moment in numbers: reserved memory split into live, rounding and cached free, the cached
/// free by kind, the stranded segments and the live sites.
fn moment_lines(e: &Explanation) -> String {
    let gb = format_bytes;
    let mut out = String::new();
    out += &format!(
        "{} at {} (event {}{}): reserved {} = live {} + rounding {} + cached free {}\n",
        e.policy,
        e.moment.kind,
        e.moment.event,
        e.moment.stream.map_or(String::new(), |s| format!(", stream {s:#x}")),
        gb(e.reserved_bytes),
        gb(e.live_requested_bytes),
        gb(e.rounding_bytes),
        gb(e.reserved_bytes - e.allocated_bytes)
    );
    out +=
        &format!("  {:<14}  {:>12}  {:>7}  {:>12}\n", "cached free", "bytes", "blocks", "largest");
    for f in &e.free {
        out += &format!(
            "  {:<14}  {:>12}  {:>7}  {:>12}\n",
            f.kind.name(),
            gb(f.bytes),
            f.blocks,
            gb(f.largest_bytes)
        );
    }
    let w = SITE_WIDTH;
    if !e.stranded.is_empty() {
        out += &format!(
            "  {:<w$}  {:>12}  {:>12}  {:>7}\n",
            "stranded segments, by the site of their live blocks", "segment", "live", "blocks"
        );
        for s in &e.stranded {
            out += &format!(
                "  {:<w$}  {:>12}  {:>12}  {:>7}\n",
                keep_end(&s.site, w),
                gb(s.segment_bytes),
                gb(s.live_bytes),
                s.blocks
            );
        }
    }
    out += &format!("  {:<w$}  {:>12}\n", "live, by site", "live");
    for s in &e.sites {
        out += &format!("  {:<w$}  {:>12}\n", keep_end(&s.site, w), gb(s.live_bytes));
    }
    out
}

/// The fixes replayed, fits first, each with the line to paste.
fn fix_lines(e: &Explanation) -> String {
    let gb = format_bytes;
    let mut out = String::new();
    if !e.fixes.is_empty() {
        out += "fixes, fits first, then lowest peak:\n";
        for f in &e.fixes {
            let cap = f.capacity_bytes.map_or("unlimited".to_string(), gb);
            let what = if f.fits {
                format!("fits in {cap}, peak {}", gb(f.peak_reserved_bytes))
            } else {
                format!("OOM at event {} under {cap}", f.first_oom_event.unwrap_or(0))
            };
            out += &format!("  {} {} — {what}\n", if f.fits { "✓" } else { "✗" }, f.why);
            match (&f.card, &f.env) {
                (Some(card), _) => out += &format!("      --capacity {card}\n"),
                (None, Some(env)) if f.flags.is_empty() => out += &format!("      {env}\n"),
                (None, env) => {
                    out += &format!(
                        "      {}{}\n",
                        env.as_ref().map_or(String::new(), |e| format!("{e}; ")),
                        f.flags.join(" ")
                    )
                }
            }
        }
    }
    out
}
