//! `fragsim validate` (not implemented yet).

use fragsim::error::{Error, Result};
use std::process::ExitCode;

/// Not implemented yet.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<ExitCode> {
    Err(Error::usage("'validate' is not implemented yet"))
}
