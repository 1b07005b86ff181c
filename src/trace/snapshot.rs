//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`): reading and writing.

use super::{ReadOptions, Trace};
use crate::error::{Error, Result};
use std::io::Write;

/// Reads a snapshot pickle.
pub fn read(_data: &[u8], _options: &ReadOptions) -> Result<Trace> {
    Err(Error::input("pytorch snapshot reading is not implemented yet"))
}

/// Writes `trace` as a snapshot pickle that PyTorch's memory viewer opens.
pub fn write(_trace: &Trace, _out: &mut impl Write) -> Result<()> {
    Err(Error::usage("pytorch snapshot writing is not implemented yet"))
}
