//! `fragsim replay`: one device's events against each policy, one row per policy.

use super::OutputFormat;
use fragsim::error::{Error, Result};
use fragsim::policy::PolicySpec;
use fragsim::replay::{BackendKind, ReplayOptions, RunSettings};
use fragsim::report::{csv, json, table};
use fragsim::session::{ReplayAnswer, ReplayRequest, Session};
use std::path::PathBuf;

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

    #[command(flatten)]
    control: super::progress::Control,
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
    pub(crate) fn output_format(&self) -> OutputFormat {
        self.output.format()
    }
}

/// The spec `--export-snapshot` writes: the first one given.
const EXPORTED: usize = 0;

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let specs = PolicySpec::parse_many(&args.source.policies(&["pytorch"])?)?;
    let empty_cache = args.source.empty_cache_plan()?;
    let path = &args.source.trace;
    if let Some(out) = &args.export_snapshot {
        fragsim::report::output::refuse_input(out, "--export-snapshot", &[path])?;
    }
    // Frames only matter for naming the stack of an OOM, which needs a capacity.
    let frames = args.source.capacity.get().is_some();
    let device = args.source.device;
    // An .fst file streams, but not for --export-snapshot, which keeps the whole run.
    let session = match &args.export_snapshot {
        Some(_) => args.control.session(io, path, device, frames)?,
        None => args.control.replay_session(io, path, device, &specs, frames)?,
    };
    if args.export_snapshot.is_some() && session.device() < 0 {
        return Err(Error::usage(format!(
            "--export-snapshot: device {} is host memory, which a CUDA memory snapshot cannot \
             hold; pick a GPU with --device",
            session.device()
        ))
        .in_file(path));
    }
    super::print_notes(&args.control, io, &session, &specs);
    let request = request(&args, io, &specs, empty_cache);
    let bar = args.control.bar(io, specs.len(), "replaying");
    let tick = bar.tick();
    let settings = RunSettings {
        jobs: args.control.jobs_for(io, specs.len()),
        progress: Some(&tick),
        ..RunSettings::default()
    };
    let mut answer = session.replay(&request, &settings)?;
    bar.finish();
    if !frames {
        name_stacks(&args, io, &mut answer)?;
    }
    if let Some(note) = answer.capacity.inferred_note() {
        if args.output_format() == OutputFormat::Table {
            io.note(&note);
        }
    }
    // The exported run starts cold (every block live at the start malloc'd, so that `validate`
    // can replay it from its own events), which a warm recording's replay does not: it runs
    // apart, so that an output flag never changes the numbers printed.
    if let Some(out) = &args.export_snapshot {
        export(&session, &request, &answer, out, io)?;
    }
    print(&args, &answer, io.out)?;
    Ok(0)
}

/// Names the stack of each OOM in `answer` that ran out under its own limit (a memory
/// fraction, bfc's memory_limit, the recorded limit), as one under `--capacity` is named: the
/// replay read no frames, so they are read now, only where an OOM needs them.
fn name_stacks(args: &Args, io: &mut super::Io, answer: &mut ReplayAnswer) -> Result<()> {
    let stackless = |o: &fragsim::metrics::OomDetail| o.stack.is_empty() && !o.before_first_event;
    if !answer.results.iter().filter_map(|r| r.first_oom.as_ref()).any(stackless) {
        return Ok(());
    }
    let (path, device) = (&args.source.trace, args.source.device);
    let with_frames = args.control.session(io, path, device, true)?;
    for oom in answer.results.iter_mut().filter_map(|r| r.first_oom.as_mut()) {
        if stackless(oom) {
            oom.stack = with_frames.stack_of(oom.event);
        }
    }
    Ok(())
}

/// The replay `args` ask for, of `specs` under the `empty_cache` what-if.
fn request(
    args: &Args,
    io: &super::Io,
    specs: &[PolicySpec],
    empty_cache: fragsim::replay::EmptyCachePlan,
) -> ReplayRequest {
    ReplayRequest {
        specs: specs.to_vec(),
        capacity: args.source.capacity.get().cloned(),
        options: ReplayOptions {
            empty_cache,
            outside_bytes: args.outside,
            backend: match args.backend {
                Backend::Sim => BackendKind::Sim,
                Backend::Cuda => BackendKind::Cuda,
            },
            cuda_ordinal: args.cuda_device,
            touch: args.touch,
            cancel: io.cancel.clone(),
            ..ReplayOptions::default()
        },
        empty_cache_price: args.output_format() == OutputFormat::Table,
    }
}

/// Prints `answer` in the format asked for.
fn print(args: &Args, answer: &ReplayAnswer, mut stdout: &mut dyn std::io::Write) -> Result<()> {
    let (results, recorded_row, whatif) =
        (&answer.results, answer.recorded.as_ref(), answer.empty_cache_effects.as_ref());
    let io = |e: std::io::Error| Error::writing("to stdout", e);
    match args.output_format() {
        OutputFormat::Json => {
            let path = args.source.trace.display().to_string();
            json::write(&answer.report(&path), &mut stdout)?
        }
        OutputFormat::Csv => csv::write_with_recorded(results, recorded_row, &mut stdout)?,
        OutputFormat::Table => {
            if let Some(line) =
                super::capacity_header(args.source.capacity.get(), answer.capacity.bytes)
            {
                writeln!(stdout, "{line}").map_err(io)?;
            }
            write!(stdout, "{}", table::render_with_recorded(results, recorded_row)).map_err(io)?;
            if answer.device < 0 && recorded_row.is_some() {
                writeln!(
                    stdout,
                    "\nhost memory (device {}): the CPU allocator keeps no cache and the profiler \
                     records 0 reserved bytes, so the recorded row's reserved bytes are the bytes \
                     it had allocated",
                    answer.device
                )
                .map_err(io)?;
            }
            if let Some(lines) = whatif {
                write!(stdout, "\n{lines}").map_err(io)?;
            }
        }
    }
    Ok(())
}

/// Writes the first spec's simulated run as a PyTorch snapshot (`--export-snapshot`), from a cold
/// cache, and says which run it is and where its peak differs from the table's.
fn export(
    session: &Session,
    request: &ReplayRequest,
    answer: &ReplayAnswer,
    out: &std::path::Path,
    io: &mut super::Io,
) -> Result<()> {
    let spec = request.specs.get(EXPORTED).ok_or_else(|| {
        Error::usage("--export-snapshot: the first policy given did not run".to_string())
    })?;
    let options = ReplayOptions {
        capacity: answer.capacity.bytes,
        capacity_kind: answer.capacity.kind,
        ..request.options.clone()
    };
    let run = session.replay_recorded(spec, &options)?;
    let notes = session.write_snapshot(&run, out)?;
    let printed = answer.comparison.run_of(EXPORTED).map(|r| r.output.result.peak_reserved_bytes);
    let peak = run.output.result.peak_reserved_bytes;
    let cold = if printed == Some(peak) {
        String::new()
    } else {
        format!(
            "; it starts from a cold cache (every block live at the start allocated anew), \
             so its peak reserved is {peak} B where the table's run, from the recorded \
             start state, has {} B",
            printed.unwrap_or(0)
        )
    };
    io.note(&format!(
        "wrote {}: the simulated run of {} ({}), the first policy given{cold}",
        out.display(),
        run.spec.display(),
        run.output.result.config
    ));
    for n in notes {
        io.note(&n);
    }
    Ok(())
}
