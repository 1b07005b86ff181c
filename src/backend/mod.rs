//! Where a policy's memory comes from: a simulated device or real GPU memory.
//!
//! A policy never knows which backend it runs on. It asks for whole segments (`cudaMalloc`-like),
//! or reserves address space and maps pages into it (the CUDA virtual-memory API that expandable
//! segments and stitching use). The backend owns the accounting of reserved memory, so the replay
//! engine reads reserved bytes from the backend, not from the policy's own claims.
//!
//! # Contract
//! - Running out of device memory is not an error: [`Backend::segment_alloc`] and
//!   [`Backend::map`] return `Ok(None)` / `Ok(false)`, and the policy takes its fallback path
//!   (free cached memory, retry, report an OOM). `Err` means the backend itself failed.
//! - Every address range a backend hands out is owned by the policy until it gives it back.
//!   Giving back a range the backend did not hand out is an error.
//! - Reserved address space costs no device memory; mapped pages and segments do.

pub mod cuda;
pub mod sim;

pub use sim::SimDevice;

use crate::error::Result;

/// The memory a policy allocates from. See the module docs for the contract.
pub trait Backend {
    /// Allocates a segment of `size` bytes (`cudaMalloc`). `None` when the device is out of memory.
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>>;

    /// Frees a segment returned by [`Backend::segment_alloc`] (`cudaFree`).
    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()>;

    /// Reserves `size` bytes of virtual address space (`cuMemAddressReserve`); costs no memory.
    fn reserve(&mut self, size: u64) -> Result<Option<u64>>;

    /// Releases a reservation made by [`Backend::reserve`]; its pages must be unmapped first.
    fn release(&mut self, addr: u64, size: u64) -> Result<()>;

    /// Backs `[addr, addr + size)` of a reservation with physical memory (`cuMemCreate` +
    /// `cuMemMap`). `false` when the device is out of memory; then nothing was mapped.
    fn map(&mut self, addr: u64, size: u64) -> Result<bool>;

    /// Unmaps and frees the physical memory behind `[addr, addr + size)`.
    fn unmap(&mut self, addr: u64, size: u64) -> Result<()>;

    /// The page size [`Backend::map`] works in (2 MiB on current NVIDIA GPUs).
    fn granularity(&self) -> u64 {
        2 << 20
    }

    /// Bytes of device memory this backend currently holds for the policy: live segments plus
    /// mapped pages. This is PyTorch's "reserved".
    fn reserved(&self) -> u64;
}

/// How much of a recorded start state (the cache a snapshot held at its first event) a replay
/// installed under its limit. A what-if's limit binds from the first event: the segments that
/// would take reserved bytes over it are left out (in recorded order, each segment whole), and
/// the blocks live in them are allocated anew before the first event, an out-of-memory at event
/// 0 where they cannot be. It lives here, below both the policies (which fill it in
/// `Policy::start_fit`) and the results (which report it as `start_state`), because the limit it
/// describes is the one a backend enforces: one type serves both, serialised as those JSON keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartFit {
    /// Segments (and mapped ranges) the recorded start state holds.
    pub segments: u64,
    /// Bytes they reserve.
    pub bytes: u64,
    /// Of those, the segments installed.
    pub installed_segments: u64,
    /// Bytes the installed segments reserve.
    pub installed_bytes: u64,
    /// The limit that bound. A policy reports its own (`per_process_memory_fraction` × GPU
    /// memory); the replay's result holds the least of that and the device's capacity less
    /// outside usage (`StartFit::bound_by`); `None` if neither is known.
    pub limit_bytes: Option<u64>,
}

/// A start state the replay assumed rather than read from the recording: a warm profiler
/// trace's memory reserved before its first event, which the trace records only as a total
/// (docs/pytorch-model.md#kineto-warm-start). Filled in by the policy (`Policy::assumed_start`),
/// reported as the result's `start_assumed` key.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AssumedStart {
    /// The reserved bytes the recording shows at its first event (what the start reaches for).
    pub reserved_bytes: u64,
    /// Of those, bytes the replay installed as cached (free) memory before the first event.
    pub cached_bytes: u64,
    /// What was assumed of that cached memory's layout (its sizes are not recorded).
    pub assumed: String,
}

impl StartFit {
    /// This fit with its limit made the least of the policy's own and `device` (the device's
    /// capacity less outside usage, if limited): the limit a replay reports, since either one
    /// can leave a segment out.
    pub(crate) fn bound_by(self, device: Option<u64>) -> StartFit {
        let limit_bytes = match (self.limit_bytes, device) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        StartFit { limit_bytes, ..self }
    }
}

/// Sees every call a policy makes through an [`Observed`] backend, after the backend answered.
///
/// This is the one way to wrap a backend: [`Observed`] forwards each call to the backend it wraps
/// and then shows the call and its outcome to the observer, so a wrapper that counts, logs or
/// checks calls writes only what it does with them, never the forwarding. A call that failed
/// with an error is not shown (the error ends the replay).
pub trait Observer {
    /// Called after each successful backend call, with its arguments and result.
    fn observe(&mut self, call: BackendCall);
}

/// Keeps every call, in order: what [`Recording`] shows tests.
impl Observer for Vec<BackendCall> {
    fn observe(&mut self, call: BackendCall) {
        self.push(call);
    }
}

/// A backend that forwards every call to `inner` and shows it to `observer`. See [`Observer`].
#[derive(Debug, Default)]
pub struct Observed<B, O> {
    /// The backend doing the work.
    pub(crate) inner: B,
    /// What sees each call.
    pub(crate) observer: O,
}

impl<B, O: Default> Observed<B, O> {
    /// Wraps `inner`, with a fresh observer.
    pub fn new(inner: B) -> Self {
        Observed { inner, observer: O::default() }
    }
}

/// Allocates through a backend and records each call, so tests can see what a policy asked for.
pub type Recording<B> = Observed<B, Vec<BackendCall>>;

impl<B> Observed<B, Vec<BackendCall>> {
    /// Every call made, in order.
    pub fn calls(&self) -> &[BackendCall] {
        &self.observer
    }

    /// The sizes of the segments obtained, in order: what a policy's growth rule asked for.
    pub fn segment_sizes(&self) -> Vec<u64> {
        self.observer
            .iter()
            .filter_map(|c| match *c {
                BackendCall::SegmentAlloc { size, addr: Some(_) } => Some(size),
                _ => None,
            })
            .collect()
    }
}

/// One backend call with its outcome, as an [`Observer`] sees it; fields are the call's arguments
/// and result.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendCall {
    /// `segment_alloc(size)` and the address it returned, if any.
    SegmentAlloc { size: u64, addr: Option<u64> },
    /// `segment_free(addr, size)`.
    SegmentFree { addr: u64, size: u64 },
    /// `reserve(size)` and the address it returned, if any.
    Reserve { size: u64, addr: Option<u64> },
    /// `release(addr, size)`.
    Release { addr: u64, size: u64 },
    /// `map(addr, size)` and whether it succeeded.
    Map { addr: u64, size: u64, ok: bool },
    /// `unmap(addr, size)`.
    Unmap { addr: u64, size: u64 },
}

impl<B: Backend, O: Observer> Backend for Observed<B, O> {
    fn segment_alloc(&mut self, size: u64) -> Result<Option<u64>> {
        let addr = self.inner.segment_alloc(size)?;
        self.observer.observe(BackendCall::SegmentAlloc { size, addr });
        Ok(addr)
    }
    fn segment_free(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.segment_free(addr, size)?;
        self.observer.observe(BackendCall::SegmentFree { addr, size });
        Ok(())
    }
    fn reserve(&mut self, size: u64) -> Result<Option<u64>> {
        let addr = self.inner.reserve(size)?;
        self.observer.observe(BackendCall::Reserve { size, addr });
        Ok(addr)
    }
    fn release(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.release(addr, size)?;
        self.observer.observe(BackendCall::Release { addr, size });
        Ok(())
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<bool> {
        let ok = self.inner.map(addr, size)?;
        self.observer.observe(BackendCall::Map { addr, size, ok });
        Ok(ok)
    }
    fn unmap(&mut self, addr: u64, size: u64) -> Result<()> {
        self.inner.unmap(addr, size)?;
        self.observer.observe(BackendCall::Unmap { addr, size });
        Ok(())
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }
}
