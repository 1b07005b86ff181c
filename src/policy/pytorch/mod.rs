//! `pytorch`: PyTorch's CUDA caching allocator (not implemented yet).

use super::{Allocation, Policy};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::replay::ReplayInput;

/// PyTorch's caching allocator.
#[derive(Debug, Default)]
pub struct PyTorch;

impl PyTorch {
    /// Builds the policy from `PYTORCH_CUDA_ALLOC_CONF` options (`recorded` or empty: the trace's
    /// recorded settings, else PyTorch's defaults).
    pub fn from_spec(_options: &str, _input: &ReplayInput) -> Result<PyTorch> {
        Err(Error::usage("this policy is not implemented yet"))
    }

    /// Like [`PyTorch::from_spec`] with `expandable_segments:True` forced.
    pub fn expandable_from_spec(_options: &str, _input: &ReplayInput) -> Result<PyTorch> {
        Err(Error::usage("this policy is not implemented yet"))
    }
}

impl Policy for PyTorch {
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
