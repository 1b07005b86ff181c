//! Real GPU memory through the CUDA driver API (cudarc), behind the same
//! [`Backend`] trait as the simulated device, so a replay can check its simulated
//! peak against what the GPU really grants (`fragsim replay --backend cuda`).
//!
//! - Segments are `cuMemAlloc_v2` / `cuMemFree_v2`, as PyTorch's `cudaMalloc` path.
//! - Reservations are `cuMemAddressReserve` (size rounded up to, and aligned to, the driver's
//!   allocation granularity) / `cuMemAddressFree`.
//! - Mapping is done **one page (granularity) at a time**: `cuMemCreate` + `cuMemMap` +
//!   `cuMemSetAccess` per page, keeping each page's handle. The driver can only unmap a whole
//!   earlier mapping, so per-page mappings let `unmap` cover any page-aligned part of earlier
//!   maps, as PyTorch's expandable segments do (they also map one handle per segment-size page).
//! - Out of memory is not an error (the [`Backend`] contract): `CUDA_ERROR_OUT_OF_MEMORY`, or
//!   exceeding the optional `capacity` cap, gives `Ok(None)` / `Ok(false)` and leaves nothing
//!   allocated. The cap lets `--capacity` simulate a smaller GPU on a big one.
//! - Reserved bytes count what the policy asked for (segment sizes, mapped pages), exactly as
//!   [`SimDevice`](super::SimDevice) counts them, so both backends report the same peak.
//! - [`Drop`] unmaps, releases and frees everything still held, then releases the context: the
//!   engine relies on it on every exit path, including errors.
//!
//! The machine must have an NVIDIA driver: without libcuda, [`CudaDevice::open`] returns a
//! backend error (exit code 3) before any driver call, because cudarc panics on a missing library.

mod vmm;

use crate::backend::Backend;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use vmm::{CuResult, Driver, Handle, PrimaryContext};

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    vmm::library_present()
}

/// A CUDA device used as a memory backend. See the module docs.
#[derive(Debug)]
pub struct CudaDevice {
    driver: Driver,
    context: Option<PrimaryContext>,
    ordinal: i32,
    capacity: Option<u64>,
    granularity: u64,
    reserved: u64,
    /// Live `cuMemAlloc` segments: address → size asked for.
    segments: BTreeMap<u64, u64>,
    /// Live reservations: address → size reserved (a multiple of the granularity).
    reservations: BTreeMap<u64, u64>,
    /// Mapped pages (one granularity each): address → physical handle.
    pages: BTreeMap<u64, Handle>,
}

/// Turns a failed driver call into a backend error naming the call and the `CUresult`.
fn driver_error(call: String) -> impl FnOnce(cudarc::driver::sys::CUresult) -> Error {
    move |r| Error::backend(format!("{call} failed: {}", vmm::name(r)))
}

impl CudaDevice {
    /// Opens device `ordinal`: initialises the driver, retains and sets the primary context, and
    /// reads the allocation granularity. `capacity` caps the bytes this backend will hold.
    /// Fails with a backend error where no driver or no such GPU is present.
    pub fn open(ordinal: i32, capacity: Option<u64>) -> Result<CudaDevice> {
        let driver = match Driver::init() {
            None => {
                return Err(Error::backend(
                    "no CUDA driver found (libcuda.so could not be loaded): the cuda backend needs an NVIDIA GPU and driver; use --backend sim",
                ))
            }
            Some(r) => r.map_err(driver_error("cuInit".to_string()))?,
        };
        let count = driver.device_count().map_err(driver_error("cuDeviceGetCount".into()))?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::backend(format!(
                "no CUDA device {ordinal} (the driver sees {count} device{}); pick one with --device",
                if count == 1 { "" } else { "s" }
            )));
        }
        let context = driver
            .retain_primary_context(ordinal)
            .map_err(driver_error(format!("retaining the primary context of device {ordinal}")))?;
        let granularity = match driver.granularity(context.device()) {
            Ok(g) if g > 0 => g,
            Ok(_) => {
                let _ = driver.release_primary_context(context);
                return Err(Error::backend("cuMemGetAllocationGranularity returned 0"));
            }
            Err(e) => {
                let _ = driver.release_primary_context(context);
                return Err(driver_error("cuMemGetAllocationGranularity".into())(e));
            }
        };
        Ok(CudaDevice {
            driver,
            context: Some(context),
            ordinal,
            capacity,
            granularity,
            reserved: 0,
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            pages: BTreeMap::new(),
        })
    }

    /// The CUDA ordinal of the device.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn device(&self) -> cudarc::driver::sys::CUdevice {
        self.context.map_or(self.ordinal, |c| c.device())
    }

    fn fits(&self, size: u64) -> bool {
        self.capacity.is_none_or(|cap| self.reserved.saturating_add(size) <= cap)
    }

    fn check_pages(&self, call: &str, addr: u64, size: u64) -> Result<()> {
        let g = self.granularity;
        if addr % g != 0 || size % g != 0 {
            return Err(Error::backend(format!(
                "{call}({addr:#x}, {size}): not aligned to the device's {g}-byte granularity"
            )));
        }
        if addr.checked_add(size).is_none() {
            return Err(Error::backend(format!("{call}({addr:#x}, {size}): range overflows")));
        }
        Ok(())
    }

    /// Unmaps and releases one page; the page is forgotten even when the driver complains.
    fn unmap_page(&mut self, page: u64, handle: Handle) -> CuResult<()> {
        let unmapped = self.driver.mem_unmap(page, self.granularity);
        let released = self.driver.mem_release(handle);
        unmapped.and(released)
    }
}

impl Backend for CudaDevice {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        if size == 0 || !self.fits(size) {
            return Ok(None);
        }
        match self.driver.mem_alloc(size) {
            Ok(addr) => {
                self.segments.insert(addr, size);
                self.reserved += size;
                Ok(Some(addr))
            }
            Err(e) if vmm::is_out_of_memory(e) => Ok(None),
            Err(e) => Err(driver_error(format!("cuMemAlloc_v2({size})"))(e)),
        }
    }

    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        match self.segments.get(&addr) {
            Some(&s) if s == size => {}
            Some(&s) => {
                return Err(Error::backend(format!(
                    "segment_free({addr:#x}, {size}): the segment there has {s} bytes"
                )))
            }
            None => {
                return Err(Error::backend(format!(
                    "segment_free({addr:#x}): no segment starts there"
                )))
            }
        }
        self.driver.mem_free(addr).map_err(driver_error(format!("cuMemFree_v2({addr:#x})")))?;
        self.segments.remove(&addr);
        self.reserved -= size;
        Ok(())
    }

    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        if size == 0 {
            return Ok(None);
        }
        let Some(aligned) = size.checked_next_multiple_of(self.granularity) else {
            return Ok(None);
        };
        match self.driver.address_reserve(aligned, self.granularity) {
            Ok(addr) => {
                self.reservations.insert(addr, aligned);
                Ok(Some(addr))
            }
            Err(e) if vmm::is_out_of_memory(e) => Ok(None),
            Err(e) => Err(driver_error(format!("cuMemAddressReserve({aligned})"))(e)),
        }
    }

    fn release(&mut self, addr: u64, _size: u64) -> Result<()> {
        let Some(&aligned) = self.reservations.get(&addr) else {
            return Err(Error::backend(format!("release({addr:#x}): no reservation starts there")));
        };
        if self.pages.range(addr..addr + aligned).next().is_some() {
            return Err(Error::backend(format!("release({addr:#x}): pages are still mapped")));
        }
        self.driver
            .address_free(addr, aligned)
            .map_err(driver_error(format!("cuMemAddressFree({addr:#x}, {aligned})")))?;
        self.reservations.remove(&addr);
        Ok(())
    }

    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        let inside = self
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &s)| addr.checked_add(size).is_some_and(|end| end <= a + s));
        if !inside {
            return Err(Error::backend(format!(
                "map({addr:#x}, {size}): outside every reservation"
            )));
        }
        self.check_pages("map", addr, size)?;
        if self.pages.range(addr..addr + size).next().is_some() {
            return Err(Error::backend(format!("map({addr:#x}, {size}): already mapped")));
        }
        if size == 0 || !self.fits(size) {
            return Ok(false);
        }
        let (g, device) = (self.granularity, self.device());
        let mut mapped: Vec<(u64, Handle)> = Vec::new();
        let mut failure = None;
        for page in (addr..addr + size).step_by(g as usize) {
            let handle = match self.driver.mem_create(device, g) {
                Ok(h) => h,
                Err(e) => {
                    failure = Some((e, format!("cuMemCreate({g})")));
                    break;
                }
            };
            if let Err(e) = self.driver.mem_map(device, page, g, handle) {
                let _ = self.driver.mem_release(handle);
                failure = Some((e, format!("cuMemMap/cuMemSetAccess({page:#x}, {g})")));
                break;
            }
            mapped.push((page, handle));
        }
        if let Some((e, call)) = failure {
            // Nothing stays mapped after a failed map, as the contract requires.
            for (page, handle) in mapped {
                let _ = self.unmap_page(page, handle);
            }
            return if vmm::is_out_of_memory(e) { Ok(false) } else { Err(driver_error(call)(e)) };
        }
        self.pages.extend(mapped);
        self.reserved += size;
        Ok(true)
    }

    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        self.check_pages("unmap", addr, size)?;
        let held = self.pages.range(addr..addr + size).count() as u64 * self.granularity;
        if held != size {
            return Err(Error::backend(format!(
                "unmap({addr:#x}, {size}): only {held} bytes there are mapped"
            )));
        }
        let pages: Vec<(u64, Handle)> =
            self.pages.range(addr..addr + size).map(|(&p, &h)| (p, h)).collect();
        for (page, handle) in pages {
            self.pages.remove(&page);
            self.reserved -= self.granularity;
            self.unmap_page(page, handle).map_err(driver_error(format!(
                "cuMemUnmap/cuMemRelease({page:#x}, {})",
                self.granularity
            )))?;
        }
        Ok(())
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserved(&self) -> u64 {
        self.reserved
    }
}

impl Drop for CudaDevice {
    /// Frees everything still held, best effort (a failing driver call cannot be reported
    /// here, and the process is usually about to exit), then releases the primary context.
    fn drop(&mut self) {
        if let Some(context) = self.context {
            let _ = self.driver.make_current(context);
        }
        for (page, handle) in std::mem::take(&mut self.pages) {
            let _ = self.unmap_page(page, handle);
        }
        for (addr, size) in std::mem::take(&mut self.reservations) {
            let _ = self.driver.address_free(addr, size);
        }
        for (addr, _) in std::mem::take(&mut self.segments) {
            let _ = self.driver.mem_free(addr);
        }
        self.reserved = 0;
        if let Some(context) = self.context.take() {
            let _ = self.driver.release_primary_context(context);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_driver_is_a_backend_error_not_a_panic() {
        if driver_present() {
            eprintln!("skipped: a CUDA driver is present");
            return;
        }
        let err = CudaDevice::open(0, None).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Backend);
        assert!(err.message().starts_with("no CUDA driver found"), "{err}");
    }
}
