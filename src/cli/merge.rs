//! `fragsim merge`: combines the parts of a sharded sweep into what the unsharded sweep prints.

use super::FormatArgs;
use fragsim::error::Result;
use fragsim::whatif::input;
use fragsim::whatif::sweep::{self, Part};
use std::path::PathBuf;

/// Combine `sweep --shard I/N --out PART.json` parts into the unsharded sweep's output.
///
/// Every part of one sweep exactly once, in any order; parts of different grids, traces,
/// capacities or objectives are refused.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The parts (`sweep --shard I/N --out PART.json`).
    #[arg(value_name = "PART.json", required = true)]
    parts: Vec<PathBuf>,

    #[command(flatten)]
    output: FormatArgs,
}

/// Runs the command on `io`; `Ok` carries the exit code.
pub(crate) fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let paths = fragsim::report::output::distinct_inputs(&args.parts, |n| io.note(n));
    let mut parts = Vec::with_capacity(paths.len());
    for path in paths {
        let data = super::read_capped(io, &path, "sweep part")?;
        let report = input::read_part(&data, &path)?;
        parts.push(Part { file: path, report });
    }
    let merged = sweep::merge(parts)?;
    super::sweep::print(&merged, args.output.format(), io.out)?;
    Ok(0)
}
