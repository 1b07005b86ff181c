//! `fragsim fit`: per policy, the smallest device capacity with no OOM, beside common GPU sizes.

use super::progress::Control;
use fragsim::error::Result;
use fragsim::policy::PolicySpec;
use fragsim::replay::RunSettings;
use fragsim::trace::sites::printable;
use fragsim::units::format_bytes;
use fragsim::whatif::fit::{self, FitReport};
use std::path::PathBuf;

/// Find the smallest GPU a run fits on: per policy, the least device memory with no OOM.
///
/// Bisects `--capacity` per policy (to 2 MiB, then to the byte) and shows which common cards
/// (16 to 192 GiB, the memory of boards sold as "16 GB" to "192 GB") hold it with `--outside` memory used outside
/// the allocator. Default policies: pytorch (the recorded settings), pytorch-expandable, bound.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace.
    #[arg(value_name = "TRACE")]
    trace: PathBuf,

    /// A policy as NAME or NAME:OPTIONS (repeatable; default: pytorch, pytorch-expandable, bound).
    #[arg(long = "policy", short = 'p', value_name = "SPEC")]
    policies: Vec<String>,

    /// The device to replay (default: the device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,

    /// Device memory used outside the allocator (CUDA context, NCCL), added before comparing
    /// with the cards. Default 512 MiB: a CUDA context with lazily loaded kernels.
    #[arg(long, value_name = "SIZE", value_parser = super::size_arg, default_value = "512MiB")]
    outside: u64,

    /// How to print the answer (CSV: one row per policy and card, nominal sizes then cards by
    /// name).
    #[command(flatten)]
    format: super::FormatArgs,

    #[command(flatten)]
    version: super::VersionFlag,

    #[command(flatten)]
    control: Control,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let written: Vec<String> = if args.policies.is_empty() {
        fragsim::whatif::fit::DEFAULT_POLICIES.iter().map(|s| s.to_string()).collect()
    } else {
        args.policies.clone()
    };
    let specs = PolicySpec::parse_many(&args.version.apply(&written, &[])?)?;
    // Loaded, not streamed: each policy's search replays the trace a score of times.
    let session = args.control.session(io, &args.trace, args.device, false)?;
    super::print_notes(&args.control, io, &session, &specs);
    let bar = args.control.bar(io, specs.len(), "fitting");
    let tick = bar.tick();
    let settings = RunSettings { progress: Some(&tick), ..RunSettings::default() };
    let cancel = io.cancel.clone();
    let report = args
        .control
        .install(io, specs.len(), || session.fit(&specs, args.outside, &cancel, &settings))??;
    bar.finish();
    super::print_as(&mut *io.out, args.format.format(), &report, csv, table)?;
    Ok(0)
}

/// One row per policy and card: the nominal sizes, then each card by name under its size.
fn csv(report: &FitReport) -> String {
    use fragsim::report::csv::field;
    let mut s =
        String::from("policy,config,min_capacity_bytes,exact,outside_bytes,card,bytes,fits\n");
    for r in &report.results {
        let head = format!(
            "{},{},{},{},{}",
            field(&r.policy),
            field(&r.config),
            r.fit.min_capacity_bytes.map(|b| b.to_string()).unwrap_or_default(),
            r.fit.exact,
            report.outside_bytes
        );
        if r.cards.is_empty() {
            // Host memory: the least capacity, and no card.
            s += &format!("{head},,,\n");
        }
        for c in &r.cards {
            s += &format!("{head},{},{},{}\n", field(c.card), c.bytes, c.fits);
            for n in &c.named {
                s += &format!("{head},{},{},{}\n", n.card, n.bytes, n.fits);
            }
        }
    }
    s
}

fn table(report: &FitReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "fit: {} (device {}): the least device memory each policy replays in without an OOM",
        printable(&report.trace),
        report.device
    );
    if report.host_memory {
        let _ = writeln!(
            s,
            "cards: none apply: device {} is host memory (a CPU profiler trace), which no GPU card \
             holds; the needs below are host memory",
            report.device
        );
    } else {
        let _ = writeln!(
            s,
            "cards: {} outside the allocator (--outside) is added; sizes are GiB, the memory on \
             a board sold as \"N GB\" (--capacity reads each label as the same bytes)",
            format_bytes(report.outside_bytes)
        );
    }
    if let Some(limit) = report.recorded_limit_bytes {
        let _ = writeln!(
            s,
            "recorded: a device limit of {} (inferred from the recording: replay, sweep and \
             check run under it): a need above it did not fit as recorded",
            format_bytes(limit)
        );
    }
    for r in &report.results {
        s += &policy_lines(report, r);
    }
    s
}

/// One policy's need, the cards it fits on and what to know about them.
fn policy_lines(report: &FitReport, r: &fragsim::whatif::fit::PolicyFit) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let f = &r.fit;
    let exact = if f.exact { "exact" } else { "to 2 MiB" };
    let config = if r.config.is_empty() { String::new() } else { format!("  ({})", r.config) };
    let replays = format!("{} replay{}", f.probes, if f.probes == 1 { "" } else { "s" });
    let Some(least) = f.min_capacity_bytes else {
        let why = f.no_fit.as_deref().unwrap_or("no capacity found");
        let _ = writeln!(s, "\n{}{config}\n  fits on no device: {why}, {replays}", r.policy);
        return s;
    };
    let _ = writeln!(
        s,
        "\n{}{config}\n  needs {}, {exact}, {replays}",
        r.policy,
        fit::gib_and_gb(least)
    );
    if !report.host_memory {
        let _ = writeln!(s, "  {}", fit::cards_line(least, report.outside_bytes));
    }
    // A size that holds the run while a card sold at that size does not: the trap of
    // nominal sizes, said per card.
    let short: Vec<String> = r
        .cards
        .iter()
        .filter(|c| c.fits)
        .flat_map(|c| c.named.iter().filter(|n| !n.fits).map(move |n| (c, n)))
        .map(|(c, n)| format!("{} ({}, not {})", n.card, format_bytes(n.bytes), c.card))
        .collect();
    if !short.is_empty() {
        let _ = writeln!(
            s,
            "  but not on: {} (the memory their drivers report; --capacity CARD replays it)",
            short.join(", ")
        );
    }
    // A share of the GPU's memory: the card assumed is the capacity tried.
    if r.config.split(',').any(|o| o.starts_with("per_process_memory_fraction:")) {
        let _ = writeln!(
            s,
            "  note: per_process_memory_fraction is a share of the GPU's memory: each capacity \
             tried is taken as the card's whole memory, so this need holds on a card of that \
             size, not on a larger card shared"
        );
    }
    if let Some(nm) = f.non_monotonic {
        let _ = writeln!(
            s,
            "  note: not monotonic: it passes at {} but runs out at {}; reported the least \
             capacity above every failure seen",
            format_bytes(nm.passes_at),
            format_bytes(nm.fails_at)
        );
    }
    s
}
