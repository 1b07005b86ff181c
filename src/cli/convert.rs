//! `fragsim convert`: a trace from one format into another.

use fragsim::error::Result;
use fragsim::trace::{self, Format};
use std::path::PathBuf;

/// Convert a trace between formats; the output format follows OUT's extension.
///
/// Extensions: .pickle/.pkl (PyTorch snapshot), .json (Kineto), .csv (RMM log), .fst (fragsim
/// binary: keeps everything, fastest to read again), .txt/.trace (fragsim text). Add .gz to
/// compress. A format that cannot hold part of the trace (Kineto has no segment events, an RMM
/// log holds one device) gets what it can, and a note on stderr says what was left out.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The trace to read (format detected by content; gzip accepted).
    #[arg(value_name = "IN")]
    input: PathBuf,

    /// The file to write.
    #[arg(value_name = "OUT")]
    output: PathBuf,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    // Check the output extension before a possibly long read.
    let format = Format::for_output(&args.output)?.info();
    fragsim::report::output::refuse_input(&args.output, "OUT", &[&args.input])?;
    let t = super::read_trace(io, &args.input, format.keeps_frames)?;
    fragsim::report::output::write_output(&args.output, "OUT", |w| {
        trace::write_trace_into(&t, &args.output, w, &io.cancel)
    })?;
    for note in format.loss_notes(&t, &args.output) {
        io.note(&note);
    }
    Ok(0)
}
