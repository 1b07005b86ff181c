//! `fragsim replay`: one device's events against each policy, one row per policy.

use fragsim::error::{Error, Result};
use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{BackendKind, ReplayInput, ReplayOptions};
use fragsim::report::{json::ReplayReport, table};
use rayon::prelude::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Replay a trace against allocator policies and compare peak reserved memory.
///
/// Each policy replays the same events from the same start (blocks live before the first event
/// are allocated first). Policies run in parallel. With `--capacity`, a policy that runs out
/// reports the first event it could not serve, and the replay goes on as PyTorch would after a
/// caught OOM error.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: super::ReplaySource,

    /// Device memory used outside the allocator (CUDA context, NCCL), counted against --capacity.
    #[arg(long, value_name = "SIZE", value_parser = super::size_arg, default_value = "0")]
    outside: u64,

    /// Where the policy's memory comes from.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    backend: Backend,

    /// The GPU the cuda backend allocates on (its CUDA ordinal).
    #[arg(long, value_name = "N", default_value_t = 0)]
    cuda_device: i32,

    /// Print one JSON object (interface.md) instead of a table.
    #[arg(long)]
    json: bool,

    /// Print CSV, one row per policy, with the JSON keys as header.
    #[arg(long, conflicts_with = "json")]
    csv: bool,

    /// Write the first policy's simulated run as a PyTorch snapshot for pytorch.org/memory_viz.
    #[arg(long, value_name = "FILE")]
    export_snapshot: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Backend {
    /// The simulated device.
    Sim,
    /// Real GPU memory through the CUDA driver.
    Cuda,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let specs = PolicySpec::parse_many(&args.source.policies)?;
    let trace = super::read_trace(&args.source.trace, false)?;
    let input = ReplayInput::new(&trace, args.source.device)?;
    let options = ReplayOptions {
        capacity: args.source.capacity,
        outside_bytes: args.outside,
        backend: match args.backend {
            Backend::Sim => BackendKind::Sim,
            Backend::Cuda => BackendKind::Cuda,
        },
        cuda_ordinal: args.cuda_device,
        ..ReplayOptions::default()
    };
    // A real GPU is one device: run policies one after another there.
    let run_one = |(i, spec): (usize, &PolicySpec)| {
        let mut opts = options.clone();
        opts.record_events = i == 0 && args.export_snapshot.is_some();
        policy::lookup(&spec.name)?.run(spec, &input, &opts)
    };
    let outputs: Vec<_> = if matches!(args.backend, Backend::Cuda) {
        specs.iter().enumerate().map(run_one).collect::<Result<_>>()?
    } else {
        specs.par_iter().enumerate().map(run_one).collect::<Result<_>>()?
    };
    if let Some(path) = &args.export_snapshot {
        fragsim::report::snapshot_out::write_simulated(&trace, input.device, &outputs[0], path)?;
    }
    let mut results: Vec<_> = outputs.into_iter().map(|o| o.result).collect();
    if specs.len() > 1 {
        results.sort_by_key(|r| r.peak_reserved_bytes);
    }
    let mut stdout = std::io::stdout().lock();
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    if args.json {
        let report = ReplayReport {
            trace: args.source.trace.display().to_string(),
            format: trace.format.name(),
            device: input.device,
            events: input.events.len() as u64,
            results: &results,
        };
        let text =
            serde_json::to_string_pretty(&report).map_err(|e| Error::usage(e.to_string()))?;
        writeln!(stdout, "{text}").map_err(io)?;
    } else if args.csv {
        fragsim::report::csv::write_results(&results, &mut stdout)?;
    } else {
        write!(stdout, "{}", table::render(&results)).map_err(io)?;
    }
    Ok(ExitCode::SUCCESS)
}
