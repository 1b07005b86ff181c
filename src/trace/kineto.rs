//! PyTorch profiler (Kineto) Chrome traces with memory events.

use super::{ReadOptions, Trace};
use crate::error::{Error, Result};
use std::io::Write;

/// Reads a Kineto trace.
pub fn read(_data: &[u8], _options: &ReadOptions) -> Result<Trace> {
    Err(Error::input("kineto reading is not implemented yet"))
}

/// Writes `trace` as Kineto memory events.
pub fn write(_trace: &Trace, _out: &mut impl Write) -> Result<()> {
    Err(Error::usage("kineto writing is not implemented yet"))
}
