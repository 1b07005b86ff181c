//! `fragsim merge`: combines the parts of a sharded sweep into what the unsharded sweep prints.

use super::FormatArgs;
use fragsim::error::{Error, Result};
use fragsim::whatif::sweep::{self, SweepReport};
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
pub fn run(args: Args, io: &mut super::Io) -> Result<u8> {
    let mut parts = Vec::with_capacity(args.parts.len());
    for path in &args.parts {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::input(format!("cannot read: {e}")).in_file(path))?;
        let part: SweepReport = serde_json::from_str(&text).map_err(|e| {
            Error::input(format!(
                "not a sweep part: {e} (line {}, column {}); write parts with sweep --shard I/N --out FILE",
                e.line(),
                e.column()
            ))
            .in_file(path)
        })?;
        parts.push(part);
    }
    let merged = sweep::merge(parts)?;
    super::sweep::print(&merged, args.output.format(), io.out)?;
    Ok(0)
}
