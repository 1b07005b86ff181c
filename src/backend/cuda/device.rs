//! The CUDA device itself: [`CudaDevice`] on the driver API (built with the `cuda` feature).

use super::interrupt;
use super::stats::{CallKind, CudaMeasures, Recorder};
use super::vmm::{self, Driver, Handle, PrimaryContext};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::units::format_bytes;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

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
    touch: bool,
    /// Live `cuMemAlloc` segments: address → size asked for.
    segments: BTreeMap<u64, u64>,
    /// Live reservations: address → size reserved (a multiple of the granularity).
    reservations: BTreeMap<u64, u64>,
    /// Mapped pages (one granularity each): address → physical handle.
    pages: BTreeMap<u64, Handle>,
    /// Handles unmapped but whose `cuMemRelease` failed: released again by [`Drop`].
    unreleased: Vec<Handle>,
    recorder: Rc<RefCell<Recorder>>,
}

/// Turns a failed driver call into a backend error naming the call and the `CUresult`.
fn driver_error(call: String) -> impl FnOnce(cudarc::driver::sys::CUresult) -> Error {
    move |r| Error::backend(format!("{call} failed: {}", vmm::name(r)))
}

/// A handle on a [`CudaDevice`]'s measurements that outlives the device (the replay engine
/// consumes the backend).
#[derive(Clone, Debug)]
pub struct Measures(Rc<RefCell<Recorder>>);

impl Measures {
    /// The measurements so far.
    pub(crate) fn summary(&self) -> CudaMeasures {
        self.0.borrow().summary()
    }
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
                "no CUDA device {ordinal} (the driver sees {count} device{}); pick one with --cuda-device",
                if count == 1 { "" } else { "s" }
            )));
        }
        let context = driver
            .retain_primary_context(ordinal)
            .map_err(driver_error(format!("retaining the primary context of device {ordinal}")))?;
        let probe = driver
            .granularity(context.device())
            .map_err(driver_error("cuMemGetAllocationGranularity".into()))
            .and_then(|g| match g {
                0 => Err(Error::backend("cuMemGetAllocationGranularity returned 0")),
                g => Ok(g),
            })
            .and_then(|g| {
                let info = driver.mem_get_info().map_err(driver_error("cuMemGetInfo_v2".into()))?;
                Ok((g, info))
            });
        let (granularity, (free, total)) = match probe {
            Ok(p) => p,
            Err(e) => {
                let _ = driver.release_primary_context(context);
                return Err(e);
            }
        };
        interrupt::install();
        let used = total.saturating_sub(free);
        Ok(CudaDevice {
            driver,
            context: Some(context),
            ordinal,
            capacity,
            granularity,
            reserved: 0,
            touch: false,
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            pages: BTreeMap::new(),
            unreleased: Vec::new(),
            recorder: Rc::new(RefCell::new(Recorder::new(total, used, false))),
        })
    }

    /// With `touch`, every new segment and mapped range is written once (`cuMemsetD8_v2`), so
    /// the driver really backs its pages (`--touch`).
    pub(crate) fn with_touch(mut self, touch: bool) -> CudaDevice {
        self.touch = touch;
        let (total, used) = {
            let s = self.recorder.borrow().summary();
            (s.device_total_bytes, s.device_used_at_start_bytes)
        };
        *self.recorder.borrow_mut() = Recorder::new(total, used, touch);
        self
    }

    /// The CUDA ordinal of the device.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// A handle on this device's measurements, readable after the device is gone.
    pub(crate) fn measures(&self) -> Measures {
        Measures(Rc::clone(&self.recorder))
    }

    /// `(free, total)` device memory as the driver reports it now.
    pub(crate) fn memory_info(&self) -> Result<(u64, u64)> {
        self.driver.mem_get_info().map_err(driver_error("cuMemGetInfo_v2".into()))
    }

    /// Refuses to start a replay that needs `needed` bytes (the trace's `bound` peak) when the
    /// device has less free, unless the capacity cap keeps the replay within the free memory.
    /// Taking all of a GPU that a training job shares would make that job fail instead.
    pub(crate) fn ensure_room(&self, needed: u64) -> Result<()> {
        let (free, total) = self.memory_info()?;
        if needed <= free || self.capacity.is_some_and(|cap| cap <= free) {
            return Ok(());
        }
        Err(Error::backend(format!(
            "the trace needs at least {} ({needed} bytes, the bound policy's peak) but CUDA device {} has only {} free ({free} of {total} bytes); free memory on the GPU, or replay as on a smaller GPU with --capacity {free} (or less): policies then run out of memory where they would on it",
            format_bytes(needed),
            self.ordinal,
            format_bytes(free),
        )))
    }

    fn device(&self) -> cudarc::driver::sys::CUdevice {
        self.context.map_or(self.ordinal, |c| c.device())
    }

    fn fits(&self, size: u64) -> bool {
        self.capacity.is_none_or(|cap| self.reserved.saturating_add(size) <= cap)
    }

    fn time(&self, kind: CallKind, since: Instant) {
        self.recorder.borrow_mut().time(kind, since.elapsed());
    }

    /// After reserved bytes grew: reads `cuMemGetInfo` when they reach a new peak, and writes
    /// the new memory once with `--touch`.
    fn grew(&mut self, addr: u64, size: u64) -> Result<()> {
        if self.touch {
            let t = Instant::now();
            let r = self.driver.memset_d8(addr, 0, size);
            self.time(CallKind::Touch, t);
            r.map_err(driver_error(format!("cuMemsetD8_v2({addr:#x}, 0, {size})")))?;
        }
        if self.reserved > self.recorder.borrow().peak_reserved() {
            let (free, total) = self.memory_info()?;
            self.recorder.borrow_mut().peak_reading(self.reserved, total.saturating_sub(free));
        }
        Ok(())
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

    /// Unmaps one page and releases its handle. When `cuMemUnmap` fails the page is still
    /// mapped (the caller keeps it for [`Drop`]); when only `cuMemRelease` fails the handle is
    /// kept in `unreleased`. The error names the failed call.
    fn drop_page(&mut self, page: u64, handle: Handle) -> Result<()> {
        let g = self.granularity;
        self.driver
            .mem_unmap(page, g)
            .map_err(driver_error(format!("cuMemUnmap({page:#x}, {g})")))?;
        self.release_handle(handle)
    }

    fn release_handle(&mut self, handle: Handle) -> Result<()> {
        self.driver.mem_release(handle).map_err(|e| {
            self.unreleased.push(handle);
            driver_error(format!("cuMemRelease({handle:#x})"))(e)
        })
    }

    /// Maps one page at `page` with a new handle; on failure nothing of it stays held.
    fn map_page(
        &mut self,
        page: u64,
    ) -> std::result::Result<Handle, (cudarc::driver::sys::CUresult, String)> {
        let (g, device) = (self.granularity, self.device());
        let handle =
            self.driver.mem_create(device, g).map_err(|e| (e, format!("cuMemCreate({g})")))?;
        if let Err(e) = self.driver.mem_map(page, g, handle) {
            let _ = self.release_handle(handle);
            return Err((e, format!("cuMemMap({page:#x}, {g})")));
        }
        if let Err(e) = self.driver.set_access(device, page, g) {
            if self.drop_page(page, handle).is_err() {
                // Still mapped: keep it, so that Drop tries again.
                self.pages.insert(page, handle);
                self.reserved += g;
            }
            return Err((e, format!("cuMemSetAccess({page:#x}, {g})")));
        }
        Ok(handle)
    }
}

impl Backend for CudaDevice {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        if size == 0 || !self.fits(size) {
            return Ok(None);
        }
        let t = Instant::now();
        let r = self.driver.mem_alloc(size);
        self.time(CallKind::Malloc, t);
        match r {
            Ok(addr) => {
                self.segments.insert(addr, size);
                self.reserved += size;
                self.grew(addr, size)?;
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
        let t = Instant::now();
        let r = self.driver.mem_free(addr);
        self.time(CallKind::Free, t);
        r.map_err(driver_error(format!("cuMemFree_v2({addr:#x})")))?;
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
        let t = Instant::now();
        let r = self.driver.address_reserve(aligned, self.granularity);
        self.time(CallKind::Reserve, t);
        match r {
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
        let t = Instant::now();
        let r = self.driver.address_free(addr, aligned);
        self.time(CallKind::Release, t);
        r.map_err(driver_error(format!("cuMemAddressFree({addr:#x}, {aligned})")))?;
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
        let t = Instant::now();
        let g = self.granularity;
        let mut mapped: Vec<(u64, Handle)> = Vec::new();
        let mut failure = None;
        for page in (addr..addr + size).step_by(g as usize) {
            match self.map_page(page) {
                Ok(handle) => mapped.push((page, handle)),
                Err(f) => {
                    failure = Some(f);
                    break;
                }
            }
        }
        if let Some((e, call)) = failure {
            // Nothing stays mapped after a failed map, as the contract requires; a page the
            // driver will not unmap is kept for Drop.
            for (page, handle) in mapped {
                if self.drop_page(page, handle).is_err() && !self.unreleased.contains(&handle) {
                    self.pages.insert(page, handle);
                    self.reserved += g;
                }
            }
            self.time(CallKind::Map, t);
            return if vmm::is_out_of_memory(e) { Ok(false) } else { Err(driver_error(call)(e)) };
        }
        self.pages.extend(mapped);
        self.reserved += size;
        self.time(CallKind::Map, t);
        self.grew(addr, size)?;
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
        let t = Instant::now();
        let mut result = Ok(());
        for (page, handle) in pages {
            let g = self.granularity;
            if let Err(e) = self.driver.mem_unmap(page, g) {
                // Still mapped: keep the page for Drop.
                result = Err(driver_error(format!("cuMemUnmap({page:#x}, {g})"))(e));
                break;
            }
            self.pages.remove(&page);
            self.reserved -= g;
            if let Err(e) = self.release_handle(handle) {
                result = Err(e);
                break;
            }
        }
        self.time(CallKind::Unmap, t);
        result
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
            let _ = self.drop_page(page, handle);
        }
        for handle in std::mem::take(&mut self.unreleased) {
            let _ = self.driver.mem_release(handle);
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
