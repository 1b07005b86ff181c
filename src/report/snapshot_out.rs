//! `--export-snapshot`: a simulated run as a PyTorch memory snapshot (not implemented yet).

use crate::error::{Error, Result};
use crate::replay::ReplayOutput;
use crate::trace::Trace;
use std::path::Path;

/// Writes `output`'s simulated events and segments as a snapshot pickle at `path`.
pub fn write_simulated(
    _trace: &Trace,
    _device: i32,
    _output: &ReplayOutput,
    _path: &Path,
) -> Result<()> {
    Err(Error::usage("--export-snapshot is not implemented yet"))
}
