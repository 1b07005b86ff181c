//! RAPIDS RMM logging CSV.

use super::{ReadOptions, Trace};
use crate::error::{Error, Result};
use std::io::Write;

/// Reads an RMM log.
pub fn read(_data: &[u8], _options: &ReadOptions) -> Result<Trace> {
    Err(Error::input("rmm csv reading is not implemented yet"))
}

/// Writes `trace` as an RMM log.
pub fn write(_trace: &Trace, _out: &mut impl Write) -> Result<()> {
    Err(Error::usage("rmm csv writing is not implemented yet"))
}
