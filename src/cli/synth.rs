//! `fragsim synth` (not implemented yet).

use fragsim::error::{Error, Result};
use std::process::ExitCode;

/// Not implemented yet.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<ExitCode> {
    Err(Error::usage("'synth' is not implemented yet"))
}
