//! Real GPU memory through the CUDA driver API (cudarc), behind the same
//! [`Backend`](super::Backend) trait as the simulated device, so a replay can check its simulated
//! peak against what the GPU really grants (`fragsim replay --backend cuda`).
//!
//! - Segments are `cuMemAlloc_v2` / `cuMemFree_v2`, as PyTorch's `cudaMalloc` path.
//! - Reservations are `cuMemAddressReserve` (size rounded up to, and aligned to, the driver's
//!   allocation granularity) / `cuMemAddressFree`.
//! - Mapping is done **one page (granularity) at a time**: `cuMemCreate` + `cuMemMap` +
//!   `cuMemSetAccess` per page, keeping each page's handle. The driver can only unmap a whole
//!   earlier mapping, so per-page mappings let `unmap` cover any page-aligned part of earlier
//!   maps, as PyTorch's expandable segments do (they also map one handle per segment-size page).
//! - Out of memory is not an error (the [`Backend`](super::Backend) contract): `CUDA_ERROR_OUT_OF_MEMORY`, or
//!   exceeding the optional `capacity` cap, gives `Ok(None)` / `Ok(false)` and leaves nothing
//!   allocated. The cap lets `--capacity` simulate a smaller GPU on a big one.
//! - Reserved bytes count what the policy asked for (segment sizes, mapped pages), exactly as
//!   [`SimDevice`](super::SimDevice) counts them, so both backends report the same peak.
//! - [`Drop`] unmaps, releases and frees everything still held, then releases the context: the
//!   engine relies on it on every exit path, including errors.
//!
//! - Safety: `CudaDevice::ensure_room` refuses, before the first allocation, a trace whose
//!   `bound` peak does not fit in the device's free memory (unless `--capacity` keeps the replay
//!   below it); no managed memory is ever allocated; the engine runs policies one at a time.
//! - Measuring: every operation is timed and `cuMemGetInfo` is read at each new reserved peak
//!   ([`stats`]); `--touch` writes each new segment and mapped range once (`cuMemsetD8_v2`) so
//!   its pages are really backed.
//! - Ctrl-C: opening the device installs a SIGINT handler ([`interrupt`]); the replay stops,
//!   drops the device (freeing everything) and the binary exits 130.
//!
//! The machine must have an NVIDIA driver: without libcuda, [`CudaDevice::open`] returns a
//! backend error (exit code 3) before any driver call, because cudarc panics on a missing library.
//! The driver is found as cudarc finds it: `dlopen("libcuda.so")` and then `libcuda.so.1` and the
//! other names cudarc tries, through the loader's search path (`LD_LIBRARY_PATH`). The tests put
//! a stand-in driver first on that path (`tests/cuda_stub/libcuda_stub.c`).

//!
//! The device needs the `cuda` cargo feature (on by default), which brings in `cudarc`; without it
//! the measurements' types and the Ctrl-C flag remain (results read from a GPU run still parse) and
//! a replay on `--backend cuda` is refused as a backend error naming the feature.

pub mod interrupt;
pub mod stats;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod vmm;

#[cfg(feature = "cuda")]
pub use device::{driver_present, CudaDevice, Measures};
pub use stats::{CallStats, CudaMeasures, DeviceCalls};
