//! `fragsim sweep`: replays the product of brace-expanded specs on every trace, ranks them and
//! names the `PYTORCH_CUDA_ALLOC_CONF` to set; `print` is shared with `merge`.

use super::progress::{Control, Targets};
use super::{FormatArgs, OutputFormat};
use fragsim::error::{Error, Result};
use fragsim::replay::ReplayOptions;
use fragsim::session::several::{self, SweepPlan};
use fragsim::session::Session;
use fragsim::units::format_bytes;
use fragsim::whatif::row::as_number;
use fragsim::whatif::sweep::{self, SweepReport};
use std::io::Write;
use std::path::PathBuf;

/// The spec savings are measured against: PyTorch with the trace's recorded settings.
pub const REFERENCE: &str = several::SWEEP_REFERENCE;

/// Find the allocator settings that use the least memory: replay a grid of configs on traces.
///
/// `-p` takes specs with braces, expanded into their product:
/// `pytorch:max_split_size_mb:{64,128,256},roundup_power2_divisions:{1,4}` is six configs.
/// Without `-p`, a built-in grid of the PyTorch knobs users try. `pytorch` (the recorded
/// settings) is always swept as the reference. Every (trace, config) is replayed in parallel;
/// configs rank by the objective's worst value across the traces, and the winner is printed as
/// the `export PYTORCH_CUDA_ALLOC_CONF=...` line to paste.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The traces (each config is replayed on every one).
    #[arg(value_name = "TRACE", required = true)]
    traces: Vec<PathBuf>,

    /// A spec, with `{a,b,...}` alternatives (repeatable; default: the built-in grid).
    #[arg(long = "policy", short = 'p', value_name = "SPEC")]
    policies: Vec<String>,

    /// The result key to minimise (any numeric key of `replay --json`).
    #[arg(long, value_name = "KEY", default_value = sweep::DEFAULT_OBJECTIVE)]
    objective: String,

    /// The device to replay in every trace (default: each trace's device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,

    #[command(flatten)]
    capacity: super::CapacityFlag,

    /// Run only part I of N of the configs (1-based), for a job array; merge the parts with
    /// `fragsim merge`.
    #[arg(long, value_name = "I/N", requires = "out")]
    shard: Option<String>,

    /// Write the sweep's JSON to FILE instead of printing it (what `fragsim merge` reads).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,

    #[command(flatten)]
    output: FormatArgs,

    #[command(flatten)]
    version: super::VersionFlag,

    #[command(flatten)]
    control: Control,
}

impl Args {
    /// Whether the sweep prints on stdout (not with `--out`).
    pub(crate) fn prints_results(&self) -> bool {
        self.out.is_none()
    }
}

/// The policies as written: the `-p` values, or the built-in grid, which is the recording's
/// allocator's (torch_npu refuses some of CUDA's points). Telling which costs a look at the first
/// trace, only when no `-p` is given; the session that look opened is returned, for the sweep to
/// replay rather than read the trace again (the built-in grid has no planner that would want
/// it opened otherwise).
fn written_grid(args: &Args, io: &mut super::Io) -> Result<(Vec<String>, Option<Session>)> {
    if !args.policies.is_empty() {
        return Ok((args.policies.clone(), None));
    }
    // An .fst file's head says it: its events stay in the file.
    let first = match args.traces.first() {
        Some(first) => Some(args.control.replay_session(io, first, args.device, &[], false)?),
        None => None,
    };
    Ok((several::builtin_grid(first.as_ref()), first))
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    // Everything the user typed is checked before the first replay.
    if args.out.is_some() && args.output.format() == OutputFormat::Csv {
        return Err(Error::usage(
            "sweep --out writes the sweep's JSON, which fragsim merge reads; --csv prints the \
             ranking only without --out",
        ));
    }
    let (written, first) = written_grid(&args, io)?;
    let written = args.version.apply(&written, &[])?;
    let capacity = args.capacity.get();
    let plan =
        SweepPlan::new(written, &args.objective, capacity, args.device, args.shard.as_deref())?;
    let control = args.control.clone();
    let traces = fragsim::report::output::distinct_inputs(&args.traces, |n| control.note(io, n));
    if let Some(out) = &args.out {
        let inputs: Vec<&std::path::Path> = traces.iter().map(PathBuf::as_path).collect();
        fragsim::report::output::refuse_input(out, "--out", &inputs)?;
    }
    let specs = &plan.specs[plan.mine()];
    let options = ReplayOptions { cancel: io.cancel.clone(), ..ReplayOptions::default() };
    let bar = args.control.bar(io, specs.len() * traces.len(), "sweeping");
    let targets = Targets { traces: &traces, device: args.device, capacity };
    let replayed = args.control.replay_traces(io, targets, specs, &options, &bar, first)?;
    bar.finish();
    for r in &replayed {
        if let Some(event) = r.recorded_oom {
            args.control.note(io, &several::recorded_oom_note(&r.trace, event));
        }
    }
    let report = plan.report(&replayed)?;
    match &args.out {
        Some(path) => {
            // What `merge` checks each part against: the whole grid and what its hash covers.
            let mut text =
                serde_json::to_string_pretty(&plan.for_merge(report)).unwrap_or_default();
            text.push('\n');
            fragsim::report::output::write_bytes(path, text.as_bytes())?;
            let part =
                plan.shard.map(|s| format!(" (part {}/{})", s.index, s.count)).unwrap_or_default();
            let done =
                format!("wrote the sweep of {} configs{part} to {}", specs.len(), path.display());
            args.control.note(io, &done);
        }
        None => print(&report, args.output.format(), io.out)?,
    }
    Ok(0)
}

/// Prints a sweep report in `format`: `sweep` and `merge` print the same way, so a merged sweep
/// prints exactly what the unsharded one does.
pub(crate) fn print(report: &SweepReport, format: OutputFormat, out: &mut dyn Write) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    match format {
        OutputFormat::Json => {
            let text = serde_json::to_string_pretty(report).unwrap_or_default();
            writeln!(out, "{text}").map_err(io)
        }
        OutputFormat::Csv => {
            writeln!(out, "rank,policy,config,spec,{},oom_free", report.objective).map_err(io)?;
            for (i, r) in report.ranking.iter().enumerate() {
                let cells = [r.policy.as_str(), r.config.as_str(), r.spec.as_str()]
                    .map(fragsim::report::csv::field);
                let line = format!("{},{},{},{}", i + 1, cells[0], cells[1], cells[2]);
                writeln!(out, "{line},{},{}", r.worst, r.oom_free).map_err(io)?;
            }
            Ok(())
        }
        OutputFormat::Table => write!(out, "{}", table(report)).map_err(io),
    }
}

/// A value of the objective for people: bytes with a unit, other numbers as they are.
fn show(objective: &str, v: &serde_json::Value) -> String {
    match (objective.ends_with("_bytes"), v.as_u64()) {
        (true, Some(b)) => format_bytes(b),
        _ => v.to_string(),
    }
}

/// The capacity each trace was replayed under, as the header says it: one line for one trace
/// (none when unlimited), a line per limited trace for several.
fn capacity_lines(report: &SweepReport) -> Vec<String> {
    let limits: Vec<(&str, u64)> = report
        .traces
        .iter()
        .filter_map(|t| {
            let row = report.results.iter().find(|r| r.row.trace == *t)?;
            Some((t.as_str(), row.row.result.get("capacity_bytes")?.as_u64()?))
        })
        .collect();
    let inferred = matches!(report.capacity.as_deref(), None | Some("recorded"));
    let described = |bytes: u64| match report.capacity.as_deref() {
        Some(typed) if !inferred => fragsim::units::describe_capacity(typed, bytes),
        _ => format!("{}; --capacity none replays unlimited", super::inferred_capacity(bytes)),
    };
    if report.traces.len() == 1 {
        return limits.iter().map(|&(_, b)| format!("capacity: {}", described(b))).collect();
    }
    let mut lines: Vec<String> =
        limits.iter().map(|&(t, b)| format!("capacity of {t}: {}", described(b))).collect();
    if inferred && !lines.is_empty() && limits.len() < report.traces.len() {
        lines.push("the other traces: unlimited (their recordings show no device limit)".into());
    }
    lines
}

/// The ranked table, then the winner, its saving and the line to paste.
fn table(report: &SweepReport) -> String {
    use std::fmt::Write as _;
    let obj = &report.objective;
    let mut s = String::new();
    let traces = report.traces.len();
    let across = if traces == 1 { String::new() } else { format!(", worst of {traces} traces") };
    let _ = writeln!(
        s,
        "sweep: {} configs ranked by {obj}{across}{}",
        report.ranking.len(),
        report.shard.map(|p| format!(" (part {}/{})", p.index, p.count)).unwrap_or_default()
    );
    for line in capacity_lines(report) {
        let _ = writeln!(s, "{line}");
    }
    s += &ranking_lines(report);
    s += &assumed_card_line(report);
    s += &best_lines(report);
    s
}

/// The ranking, one line per config, and which ran out of memory.
fn ranking_lines(report: &SweepReport) -> String {
    use std::fmt::Write as _;
    let (obj, traces) = (&report.objective, report.traces.len());
    let mut s = String::new();
    let reference = report.reference.as_deref().unwrap_or(REFERENCE);
    let ref_worst =
        report.ranking.iter().find(|r| r.spec == reference).and_then(|r| as_number(&r.worst));
    let width = report.ranking.iter().map(|r| r.spec.len()).max().unwrap_or(4).max(6);
    // Where each config that ran out of memory first did: its value is no peak it reached.
    let oom_at = |spec: &str| -> Option<String> {
        report.results.iter().filter(|r| r.spec == spec).find_map(|r| {
            let event = r.row.result.get("first_oom_event")?.as_u64()?;
            let on = if traces == 1 { String::new() } else { format!(" of {}", r.row.trace) };
            Some(format!("event {event}{on}"))
        })
    };
    let vs_header = "vs recorded settings";
    let _ = writeln!(s, "{:>4}  {:<width$}  {:>16}  {vs_header}", "rank", "config", obj);
    let mut ran_out = Vec::new();
    for (i, r) in report.ranking.iter().enumerate() {
        let at = (!r.oom_free).then(|| oom_at(&r.spec)).flatten();
        let vs = match (ref_worst, as_number(&r.worst)) {
            _ if r.spec == reference => "(recorded settings)".to_string(),
            _ if !r.oom_free => "-".to_string(),
            (Some(b), Some(x)) if b > 0.0 => format!("{:+.1}%", (x / b - 1.0) * 100.0),
            _ => String::new(),
        };
        let value = match &at {
            Some(at) if traces == 1 => format!("OOM at {at}"),
            _ => show(obj, &r.worst),
        };
        let oom = if r.oom_free || traces == 1 && at.is_some() { "" } else { "  OOM" };
        if !r.oom_free {
            ran_out.push(match &at {
                Some(at) => format!("{} (at {at})", r.spec),
                None => r.spec.clone(),
            });
        }
        let w = vs_header.len();
        let _ = writeln!(s, "{:>4}  {:<width$}  {:>16}  {:>w$}{oom}", i + 1, r.spec, value, vs);
    }
    if !ran_out.is_empty() {
        let _ = writeln!(
            s,
            "\nran out of memory at this capacity (ranked last): {}",
            ran_out.join(", ")
        );
    }
    s
}

/// A share of the GPU's memory pays only on a card of that size: which card was assumed.
fn assumed_card_line(report: &SweepReport) -> String {
    let mut assumed: Vec<u64> = report
        .results
        .iter()
        .filter_map(|r| r.row.result.get("gpu_memory_bytes")?.as_u64())
        .collect();
    assumed.sort_unstable();
    assumed.dedup();
    if assumed.is_empty() {
        return String::new();
    }
    let cards: Vec<String> = assumed.iter().map(|&b| format_bytes(b)).collect();
    format!(
        "\nper_process_memory_fraction (and a garbage_collection_threshold with it) is a share \
         of the GPU's memory: these configs assume a GPU of {}; give --capacity CARD to model \
         another card\n",
        cards.join(" / ")
    )
}

/// The best config, what it saves against the recorded settings, and the line to set it.
fn best_lines(report: &SweepReport) -> String {
    use std::fmt::Write as _;
    let obj = &report.objective;
    let mut s = String::new();
    let reference = report.reference.as_deref().unwrap_or(REFERENCE);
    let Some(best) = &report.best else { return s };
    let value = best.objective.get(obj.as_str()).map(|v| show(obj, v)).unwrap_or_default();
    let _ = writeln!(s, "\nbest: {} ({obj} {value})", best.spec);
    if best.spec == reference {
        let _ = writeln!(s, "the recorded settings are already the best of this grid");
    } else if let Some(saving) = &best.saving {
        let amount = if obj.ends_with("_bytes") {
            format_bytes(saving.amount.max(0.0) as u64)
        } else {
            format!("{}", saving.amount)
        };
        let _ = writeln!(
            s,
            "saves {amount} ({:.1}%) of {obj} against {} (the trace's recorded settings)",
            saving.fraction * 100.0,
            saving.reference
        );
    }
    if !report.ranking.first().is_some_and(|r| r.oom_free) {
        let _ = writeln!(s, "every config ran out of memory at this capacity on some trace");
    }
    let line = match &best.env {
        Some(env) => env.as_str(),
        None if report.host_memory => {
            "(host memory, device -1: CUDA allocator settings do not apply to it, so there is \
             no PYTORCH_CUDA_ALLOC_CONF to set; the ranking says how each policy would hold it)"
        }
        None if fragsim::policy::has_allocator_settings(&best.policy) => {
            "(the recorded settings differ per trace: no single export line)"
        }
        None => "(not a PyTorch config: there is no PYTORCH_CUDA_ALLOC_CONF to set)",
    };
    let _ = writeln!(s, "{line}");
    s
}
