//! `stitch`: GMLake-style stitching (not implemented yet).

use super::{Allocation, Policy};
use crate::backend::Backend;
use crate::error::{Error, Result};

/// The options this policy accepts.
pub const OPTIONS: &str = "(not implemented yet)";

/// GMLake-style stitching.
#[derive(Debug, Default)]
pub struct Stitch;

impl Stitch {
    /// Builds the policy from `key=value` options.
    pub fn from_options(_options: &str) -> Result<Stitch> {
        Err(Error::usage("this policy is not implemented yet"))
    }
}

impl Policy for Stitch {
    fn config(&self) -> String {
        String::new()
    }
    fn malloc<B: Backend>(
        &mut self,
        _backend: &mut B,
        _size: u64,
        _stream: u64,
    ) -> Result<Option<Allocation>> {
        Ok(None)
    }
    fn free<B: Backend>(&mut self, _backend: &mut B, _addr: u64) -> Result<()> {
        Ok(())
    }
    fn empty_cache<B: Backend>(&mut self, _backend: &mut B) -> Result<()> {
        Ok(())
    }
    fn allocated(&self) -> u64 {
        0
    }
}
