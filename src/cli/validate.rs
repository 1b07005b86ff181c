//! `fragsim validate`: replay a PyTorch snapshot with the PyTorch policy and its recorded settings,
//! and compare every decision with the recording (docs/pytorch-model.md#validation; the library
//! side is `fragsim::validate`).

use fragsim::error::{Error, Result};
use fragsim::policy::pytorch::{Flavour, Version};
use fragsim::session::Session;
use fragsim::units::format_bytes;
use fragsim::validate::ValidateOptions;
use std::path::PathBuf;

/// Check that fragsim's PyTorch policy makes the decisions the real allocator recorded.
///
/// Replays the snapshot from the allocator state recovered at its first event, with the
/// snapshot's own allocator settings, and compares every alloc address, every segment event and
/// the peak of reserved memory. Decisions that depend on a start-state guess are counted as
/// undeterminable, never as matches. Exits 1 on any unexplained mismatch.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The PyTorch memory snapshot (pickle from torch.cuda.memory._dump_snapshot).
    #[arg(value_name = "SNAPSHOT")]
    snapshot: PathBuf,

    /// The device to validate (default: the device with the most events).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,

    /// The GPU's total memory (base of the memory fraction and of expandable reservations).
    #[arg(long, value_name = "SIZE", value_parser = super::size_arg)]
    gpu_mem: Option<u64>,

    #[command(flatten)]
    output: super::FormatArgs,

    /// Write the validated replay as a PyTorch snapshot for pytorch.org/memory_viz.
    #[arg(long, value_name = "FILE")]
    export_snapshot: Option<PathBuf>,

    /// List every mismatch and undeterminable decision, and what was assumed.
    #[arg(long)]
    verbose: bool,

    /// Model PyTorch release V (2.0 … 2.15), e.g. 2.8 (default: the release the recording
    /// shows, else 2.11).
    #[arg(long, value_name = "V", value_parser = version_arg)]
    pytorch_version: Option<Version>,

    /// Whose allocator rules to replay: pytorch (the recording's: torch_npu's for a torch_npu
    /// snapshot, else CUDA's), pytorch-cuda or pytorch-npu.
    #[arg(short = 'p', long = "policy", value_name = "POLICY", value_parser = rules_arg)]
    policy: Option<Rules>,
}

/// `-p`'s value: whose allocator rules, `None` for the recording's own.
#[derive(Clone, Copy, Debug)]
struct Rules(Option<Flavour>);

fn rules_arg(text: &str) -> std::result::Result<Rules, String> {
    Flavour::rules(text).map(Rules)
}

fn version_arg(text: &str) -> std::result::Result<Version, String> {
    Version::parse(text).map_err(|e| e.message().to_string())
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    if let Some(out) = &args.export_snapshot {
        fragsim::report::output::refuse_input(out, "--export-snapshot", &[&args.snapshot])?;
    }
    let trace = super::read_trace(io, &args.snapshot, false)?;
    fragsim::validate::needs_decisions(&args.snapshot, &trace)?;
    let session = Session::of_trace(trace, &args.snapshot, args.device)?;
    let options = ValidateOptions {
        device: args.device,
        gpu_memory: args.gpu_mem,
        version: args.pytorch_version,
        record_events: args.export_snapshot.is_some(),
        check_invariants: false,
        flavour: args.policy.and_then(|r| r.0),
        cancel: io.cancel.clone(),
    };
    let v = session.validate(&options)?;
    if let Some(path) = &args.export_snapshot {
        let trace = session.trace();
        for n in fragsim::report::snapshot_out::write_simulated(trace, v.device, &v.output, path)? {
            io.note(&n);
        }
    }
    let out = &mut *io.out;
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    let format = args.output.format();
    if format == super::OutputFormat::Json {
        let text = serde_json::to_string_pretty(&v).map_err(|e| Error::usage(e.to_string()))?;
        writeln!(out, "{text}").map_err(io)?;
    } else if format == super::OutputFormat::Csv {
        // One row: the JSON object's numbers, strings and flags (its lists stay in the JSON).
        let json = serde_json::to_value(&v).map_err(|e| Error::usage(e.to_string()))?;
        let scalars: Vec<(&String, String)> = json
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, x)| match x {
                serde_json::Value::String(t) => Some((k, fragsim::report::csv::field(t))),
                serde_json::Value::Number(n) => Some((k, n.to_string())),
                serde_json::Value::Bool(b) => Some((k, b.to_string())),
                serde_json::Value::Null => Some((k, String::new())),
                _ => None,
            })
            .collect();
        let header: Vec<&str> = scalars.iter().map(|(k, _)| k.as_str()).collect();
        let values: Vec<&str> = scalars.iter().map(|(_, x)| x.as_str()).collect();
        writeln!(out, "{}\n{}", header.join(","), values.join(",")).map_err(io)?;
    } else {
        write!(out, "{}", table(&v, args.verbose)).map_err(io)?;
    }
    Ok(if v.mismatches.is_empty() { 0 } else { 1 })
}

/// The answer for people: the match counts, the mismatches (the first ten unless `verbose`)
/// and the verdict.
fn table(v: &fragsim::validate::Validation, verbose: bool) -> String {
    let pct = |a: u64, b: u64| if b == 0 { 100.0 } else { 100.0 * a as f64 / b as f64 };
    let determinable = v.allocs_total - v.undeterminable_events - v.allocs_exact_address;
    let mut s = String::new();
    s += &format!("{} (device {}), settings {}\n", v.trace, v.device, v.config);
    s += &format!(
        "allocs at the recorded address: {} of {} determinable ({:.2}%); {}\n",
        v.allocs_addr_matched,
        determinable,
        pct(v.allocs_addr_matched, determinable),
        undeterminable_and_exact(v)
    );
    s += &format!(
        "segment events reproduced:      {} of {}\n",
        v.segment_events_matched, v.segment_events_recorded
    );
    s += &format!(
        "peak reserved:                  {} recorded, {} simulated\n",
        format_bytes(v.peak_reserved_recorded_bytes),
        format_bytes(v.peak_reserved_simulated_bytes)
    );
    let shown = if verbose { v.mismatches.len() } else { v.mismatches.len().min(10) };
    for m in &v.mismatches[..shown] {
        s += &format!(
            "  mismatch at event {}: {} expected {}, got {}: {}\n",
            m.event,
            m.action_name(),
            m.expected,
            m.got,
            m.why
        );
    }
    if shown < v.mismatches.len() {
        s += &format!("  ... {} more (--verbose lists all)\n", v.mismatches.len() - shown);
    }
    if verbose {
        for m in &v.undeterminable {
            s += &format!("  undeterminable event {}: {}\n", m.event, m.why);
        }
        for n in &v.notes {
            s += &format!("  note: {n}\n");
        }
    } else {
        // What was modelled without being recorded: the PyTorch version and the GPU's memory.
        for n in v.notes.iter().filter(|n| n.is_modelling_note()) {
            s += &format!("note: {n}\n");
        }
    }
    s += if v.mismatches.is_empty() { "result: valid\n" } else { "result: MISMATCH\n" };
    s
}

/// `N undeterminable`, and how many allocs were placed by address (`mallocWithAddress`,
/// counted apart) where the recording has any.
fn undeterminable_and_exact(v: &fragsim::validate::Validation) -> String {
    match v.allocs_exact_address {
        0 => format!("{} undeterminable", v.undeterminable_events),
        n => format!(
            "{} undeterminable; {n} placed by address (mallocWithAddress, not compared)",
            v.undeterminable_events
        ),
    }
}
