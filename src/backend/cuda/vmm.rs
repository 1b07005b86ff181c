//! The CUDA driver calls the cuda backend makes, wrapped one by one in safe functions: the only
//! `unsafe` code of the backend, so it can be reviewed in one place.
//!
//! cudarc 0.19 offers no safe wrapper for the virtual-memory-management (VMM) API, so these call
//! `cudarc::driver::sys` directly (CUDA Driver API, "Virtual Memory Management" and "Memory
//! Management" groups). cudarc loads libcuda lazily and *panics* on the first call when it is
//! missing (it does not return an error), so every call is a method of [`Driver`], a token that
//! only [`Driver::init`] makes, after checking the library is present and `cuInit` succeeded.
//!
//! Why these calls are sound: every pointer passed to the driver is a live local out-parameter
//! or a property struct on the stack; device addresses are plain integers that the host never
//! dereferences, so a wrong one makes the driver return an error code, not corrupt host memory.
//! Errors come back as the raw `CUresult`; [`name`] spells it as the CUDA headers do.

use cudarc::driver::sys;

/// A driver result: the value, or the `CUresult` the call failed with.
pub type CuResult<T> = std::result::Result<T, sys::CUresult>;

/// A physical allocation made by `cuMemCreate`.
pub type Handle = sys::CUmemGenericAllocationHandle;

/// The CUDA headers' name of a result, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn name(result: sys::CUresult) -> String {
    format!("{result:?}")
}

/// True when `result` is `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn is_out_of_memory(result: sys::CUresult) -> bool {
    result == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// True when libcuda can be loaded (nothing is called in it).
pub(crate) fn library_present() -> bool {
    // SAFETY: only tries to dlopen libcuda (and closes it again); calls no driver function.
    unsafe { sys::is_culib_present() }
}

fn check(result: sys::CUresult) -> CuResult<()> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        err => Err(err),
    }
}

/// Proof that libcuda is loaded and initialised; every driver call is a method of it.
#[derive(Clone, Copy, Debug)]
pub struct Driver {
    _private: (),
}

/// A retained primary context of one device; released by [`Driver::release_primary_context`].
#[derive(Clone, Copy, Debug)]
pub struct PrimaryContext {
    device: sys::CUdevice,
    context: sys::CUcontext,
}

impl PrimaryContext {
    /// The device the context belongs to.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }
}

impl Driver {
    /// Loads libcuda and calls `cuInit(0)`. `None` when the library is missing (calling into
    /// cudarc then would panic); `Some(Err)` when the driver refuses, e.g. with no GPU.
    pub(crate) fn init() -> Option<CuResult<Driver>> {
        if !library_present() {
            return None;
        }
        // SAFETY: libcuda is present (checked above), so cudarc's lazy loader succeeds; cuInit
        // takes only a flags word.
        let result = unsafe { sys::cuInit(0) };
        Some(check(result).map(|()| Driver { _private: () }))
    }

    /// `cuDeviceGetCount`: devices the driver can see.
    pub(crate) fn device_count(self) -> CuResult<i32> {
        let mut count: std::ffi::c_int = 0;
        // SAFETY: the driver is initialised (a `Driver` exists); `count` is a live local.
        check(unsafe { sys::cuDeviceGetCount(&mut count) })?;
        Ok(count)
    }

    /// `cuDeviceGet` then `cuDevicePrimaryCtxRetain` and `cuCtxSetCurrent`: the device's primary
    /// context (the one the CUDA runtime and PyTorch use), current on this thread.
    pub(crate) fn retain_primary_context(self, ordinal: i32) -> CuResult<PrimaryContext> {
        let mut device: sys::CUdevice = 0;
        // SAFETY: initialised driver; `device` is a live local out-parameter.
        check(unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: initialised driver; `device` came from cuDeviceGet; `context` is a live local.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut context, device) })?;
        // SAFETY: `context` was just retained, so it is a valid context handle.
        if let Err(e) = check(unsafe { sys::cuCtxSetCurrent(context) }) {
            // SAFETY: undoes the retain above on the same device.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) };
            return Err(e);
        }
        Ok(PrimaryContext { device, context })
    }

    /// `cuCtxSetCurrent`: makes `context` current on this thread again (other code on the
    /// thread may have switched contexts since it was retained).
    pub(crate) fn make_current(self, context: PrimaryContext) -> CuResult<()> {
        // SAFETY: `context` is retained until `release_primary_context` consumes it.
        check(unsafe { sys::cuCtxSetCurrent(context.context) })
    }

    /// `cuDevicePrimaryCtxRelease_v2`: gives back one retain; the driver destroys the context
    /// when the last one is gone. It is not detached from the thread, so that another retain
    /// of the same primary context on this thread keeps working.
    pub(crate) fn release_primary_context(self, context: PrimaryContext) -> CuResult<()> {
        // SAFETY: releases the one retain `retain_primary_context` made on this device.
        check(unsafe { sys::cuDevicePrimaryCtxRelease_v2(context.device) })
    }

    /// `cuMemAlloc_v2`: `size` bytes of device memory (what `cudaMalloc` does).
    pub(crate) fn mem_alloc(self, size: u64) -> CuResult<u64> {
        let mut ptr: sys::CUdeviceptr = 0;
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        // SAFETY: initialised driver with a current context; `ptr` is a live local.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, size) })?;
        Ok(ptr)
    }

    /// `cuMemFree_v2`: frees memory from [`Driver::mem_alloc`].
    pub(crate) fn mem_free(self, ptr: u64) -> CuResult<()> {
        // SAFETY: `ptr` is a device address the host never dereferences; an address the driver
        // did not hand out is rejected with CUDA_ERROR_INVALID_VALUE.
        check(unsafe { sys::cuMemFree_v2(ptr) })
    }

    /// The pinned-device-memory properties `cuMemCreate` and the granularity query take, as
    /// PyTorch's expandable segments fill them (no shareable handle type).
    fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
        // SAFETY: the property struct is plain C data (integers, an enum whose 0 is
        // `..._INVALID`, a null pointer), for which all-zero bytes are a valid value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        prop
    }

    /// `cuMemGetAllocationGranularity(MINIMUM)`: the page size of [`Driver::mem_create`].
    pub(crate) fn granularity(self, device: sys::CUdevice) -> CuResult<u64> {
        let prop = Self::allocation_prop(device);
        let mut granularity: usize = 0;
        // SAFETY: `granularity` is a live local and `prop` a fully initialised struct on the stack.
        check(unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(granularity as u64)
    }

    /// `cuMemAddressReserve`: `size` bytes of virtual address space aligned to `alignment`.
    pub(crate) fn address_reserve(self, size: u64, alignment: u64) -> CuResult<u64> {
        let too_big = |_| sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        let size = usize::try_from(size).map_err(too_big)?;
        let alignment = usize::try_from(alignment).map_err(too_big)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live local; address 0 lets the driver choose; flags must be 0.
        check(unsafe { sys::cuMemAddressReserve(&mut ptr, size, alignment, 0, 0) })?;
        Ok(ptr)
    }

    /// `cuMemAddressFree`: releases a whole reservation (its pages must be unmapped).
    pub(crate) fn address_free(self, ptr: u64, size: u64) -> CuResult<()> {
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: device addresses only; the driver checks they name a reservation.
        check(unsafe { sys::cuMemAddressFree(ptr, size) })
    }

    /// `cuMemCreate`: `size` bytes (a multiple of the granularity) of physical memory.
    pub(crate) fn mem_create(self, device: sys::CUdevice, size: u64) -> CuResult<Handle> {
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let prop = Self::allocation_prop(device);
        let mut handle: Handle = 0;
        // SAFETY: `handle` is a live local, `prop` an initialised struct; flags must be 0.
        check(unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) })?;
        Ok(handle)
    }

    /// `cuMemMap`: backs `[ptr, ptr + size)` with all of `handle` (not yet accessible).
    pub(crate) fn mem_map(self, ptr: u64, size: u64, handle: Handle) -> CuResult<()> {
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: device addresses and a handle from cuMemCreate; offset and flags must be 0.
        check(unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })
    }

    /// `cuMemSetAccess`: read-write access for `device` to the mapped `[ptr, ptr + size)`.
    pub(crate) fn set_access(self, device: sys::CUdevice, ptr: u64, size: u64) -> CuResult<()> {
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: as for `allocation_prop`: all-zero bytes are a valid access descriptor.
        let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = device;
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: `access` is one initialised descriptor on the stack, and count is 1.
        check(unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) })
    }

    /// `cuMemGetInfo_v2`: (free, total) bytes of the current context's device, as the driver
    /// sees them (other processes' memory included).
    pub(crate) fn mem_get_info(self) -> CuResult<(u64, u64)> {
        let (mut free, mut total): (usize, usize) = (0, 0);
        // SAFETY: two live local out-parameters.
        check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemsetD8_v2`: writes `value` to `[ptr, ptr + size)` of device memory, so the pages
    /// behind it are really backed (`--touch`).
    pub(crate) fn memset_d8(self, ptr: u64, value: u8, size: u64) -> CuResult<()> {
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the host never dereferences `ptr`; the driver checks the range is device
        // memory this context owns and fails with an error code otherwise.
        check(unsafe { sys::cuMemsetD8_v2(ptr, value, size) })
    }

    /// `cuMemUnmap`: unmaps exactly one earlier [`Driver::mem_map`] range (the driver cannot
    /// unmap part of a mapping).
    pub(crate) fn mem_unmap(self, ptr: u64, size: u64) -> CuResult<()> {
        let size = usize::try_from(size).map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: device addresses only; the host never touched the mapped memory.
        check(unsafe { sys::cuMemUnmap(ptr, size) })
    }

    /// `cuMemRelease`: gives back a [`Driver::mem_create`] handle; the memory is freed once no
    /// mapping uses it.
    pub(crate) fn mem_release(self, handle: Handle) -> CuResult<()> {
        // SAFETY: the handle is an opaque integer the driver validates.
        check(unsafe { sys::cuMemRelease(handle) })
    }
}
