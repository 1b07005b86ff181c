//! fragsim binary traces (.fst).

use super::{ReadOptions, Trace};
use crate::error::{Error, Result};
use std::io::Write;

/// Reads an .fst file.
pub fn read(_data: &[u8], _options: &ReadOptions) -> Result<Trace> {
    Err(Error::input("fst reading is not implemented yet"))
}

/// Writes `trace` as .fst.
pub fn write(_trace: &Trace, _out: &mut impl Write) -> Result<()> {
    Err(Error::usage("fst writing is not implemented yet"))
}

/// The first bytes of every `.fst` file.
pub const MAGIC: &[u8] = b"FRAGSIM\0";
