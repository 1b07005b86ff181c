//! Real GPU memory through the CUDA driver API (cudarc), behind the same
//! [`Backend`](super::Backend) trait as the simulated device.

use crate::backend::Backend;
use crate::error::{Error, Result};

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; calls no driver function.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// A CUDA device used as a memory backend (not implemented yet).
#[derive(Debug)]
pub struct CudaDevice {
    _private: (),
}

impl CudaDevice {
    /// Opens device `ordinal`; fails with a backend error where no driver or GPU is present.
    pub fn open(_ordinal: i32, _capacity: Option<u64>) -> Result<CudaDevice> {
        if !driver_present() {
            return Err(Error::backend(
                "no CUDA driver found (libcuda.so could not be loaded): the cuda backend needs an NVIDIA GPU and driver; use --backend sim",
            ));
        }
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
}

impl Backend for CudaDevice {
    fn segment_alloc(&mut self, _size: u64) -> Result<Option<u64>> {
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
    fn segment_free(&mut self, _addr: u64, _size: u64) -> Result<()> {
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
    fn reserve(&mut self, _size: u64) -> Result<Option<u64>> {
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
    fn release(&mut self, _addr: u64, _size: u64) -> Result<()> {
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
    fn map(&mut self, _addr: u64, _size: u64) -> Result<bool> {
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
    fn unmap(&mut self, _addr: u64, _size: u64) -> Result<()> {
        Err(Error::backend("the cuda backend is not implemented yet"))
    }
    fn reserved(&self) -> u64 {
        0
    }
}
