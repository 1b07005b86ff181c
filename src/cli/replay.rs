//! `fragsim replay`: one device's events against each policy, one row per policy.

use super::OutputFormat;
use fragsim::error::{Error, Result};
use fragsim::policy::PolicySpec;
use fragsim::replay::{run_specs, BackendKind, Jobs, ReplayInput, ReplayOptions, RunSettings};
use fragsim::report::{csv, json, table};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Replay a trace against allocator policies and compare peak reserved memory.
///
/// Each policy replays the same events from the same start (blocks live before the first event
/// are allocated first). Policies run in parallel (one after another on the cuda backend). With
/// `--capacity`, a policy that runs out reports the first event it could not serve, and the
/// replay goes on as PyTorch would after a caught OOM error.
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

    /// With --backend cuda: write every new segment and mapped range once, so the GPU really
    /// backs its pages.
    #[arg(long)]
    touch: bool,

    #[command(flatten)]
    output: super::FormatArgs,

    /// Write the simulated run of the first policy given (`-p` order; `all` starts with pytorch)
    /// as a PyTorch snapshot for pytorch.org/memory_viz. Not the first row: rows are sorted.
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

impl Args {
    /// The output format asked for (`--format`, `--json` or `--csv`).
    pub fn output_format(&self) -> OutputFormat {
        self.output.format()
    }
}

/// The spec `--export-snapshot` writes: the first one given.
const EXPORTED: usize = 0;

pub fn run(args: Args) -> Result<ExitCode> {
    let specs = PolicySpec::parse_many(&args.source.policies)?;
    let trace = super::read_trace(&args.source.trace, false)?;
    let named = super::in_trace(&args.source.trace, &trace);
    let input = ReplayInput::new(&trace, args.source.device).map_err(&named)?;
    let options = ReplayOptions {
        capacity: args.source.capacity,
        outside_bytes: args.outside,
        backend: match args.backend {
            Backend::Sim => BackendKind::Sim,
            Backend::Cuda => BackendKind::Cuda,
        },
        cuda_ordinal: args.cuda_device,
        touch: args.touch,
        ..ReplayOptions::default()
    };
    let settings = RunSettings {
        jobs: Jobs::AllCores,
        record_events_of: args.export_snapshot.is_some().then_some(EXPORTED),
        ..RunSettings::default()
    };
    let comparison = run_specs(&specs, &input, &options, &settings).map_err(&named)?;
    if let Some(path) = &args.export_snapshot {
        let run = comparison.run_of(EXPORTED).ok_or_else(|| {
            Error::usage("--export-snapshot: the first policy given did not run".to_string())
        })?;
        fragsim::report::snapshot_out::write_simulated(&trace, input.device, &run.output, path)?;
        eprintln!(
            "fragsim: wrote {}: the simulated run of {} ({}), the first policy given",
            path.display(),
            run.spec.display(),
            run.output.result.config
        );
    }
    let results = comparison.results();
    let mut stdout = std::io::stdout().lock();
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    match args.output_format() {
        OutputFormat::Json => {
            let path = args.source.trace.display().to_string();
            json::write(&json::ReplayReport::new(&path, &input, &results), &mut stdout)?
        }
        OutputFormat::Csv => csv::write_results(&results, &mut stdout)?,
        OutputFormat::Table => write!(stdout, "{}", table::render(&results)).map_err(io)?,
    }
    Ok(ExitCode::SUCCESS)
}
