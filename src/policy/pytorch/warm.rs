//! The cache a warm profiler trace's allocator held before its first `[memory]` event
//! (docs/pytorch-model.md#kineto-warm-start).
//!
//! A Kineto trace of a running server starts mid-run: its first event's `Total Reserved` is
//! more than the segments its live blocks need. That difference is memory PyTorch had cached
//! (free blocks in segments it never released: no `empty_cache()` call shows in such a trace).
//! Kineto records no segment, so the sizes of those segments are unknown; the assumption is the
//! one that lets the window's requests reuse them as the real run did. A replay of the trace
//! from its live blocks shows which requests need new memory; where the recorded `Total
//! Reserved` did not grow at such a request, the real run found that memory cached, so the
//! segment the replay made (a 2 MiB small-pool segment, or a large one of the size the request
//! asked for) was in the cache. Where the recording grew, the request made its segment in the
//! real run too. What is left of the reserve is cached memory no request of the window takes:
//! large-pool segments each smaller than the least request that made the recording grow.

use super::config::{MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE};
use super::PyTorch;
use crate::backend::{BackendCall, Recording, SimDevice};
use crate::policy::{Policy, PolicyContext};
use crate::trace::{Action, Format};
use std::collections::HashMap;

/// The cached segments a warm Kineto trace starts with, as `plan` assumes them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WarmCache {
    /// The recorded `Total Reserved` at the first event, after it (the reserve to reach).
    pub(crate) reserved_bytes: u64,
    /// The segments the trace's requests find cached, in the order a replay of the trace from
    /// its live blocks makes them: (size, stream, small pool). The start takes as many as fit
    /// in the reserve left by the live blocks' own segments.
    pub(crate) segments: Vec<(u64, u64, bool)>,
    /// The largest segment the rest of the reserve is cut into: below the least block whose
    /// request made the recorded run reserve more (so no such request finds it cached, as the
    /// real run did not); `None` when no request did (the rest is one segment).
    pub(crate) piece_bytes: Option<u64>,
}

/// The most segments the rest of the reserve is cut into.
const MAX_PIECES: u64 = 1 << 16;

/// The warm cache of `context`'s device under `policy`'s settings, or `None` when there is none
/// to model: not a Kineto trace, no recorded totals for every event, or host memory (c10's CPU
/// allocator caches nothing). With expandable segments, only the reserve is planned (no
/// segments: the cache is mapped pages, see `PyTorch::start_warm`).
///
/// The trace is replayed from its live blocks on an unlimited device. A request that made a new
/// segment there, where the recorded `Total Reserved` did not grow, found that memory cached in
/// the real run: the segment joins [`WarmCache::segments`]. One where the recording grew made a
/// segment in the real run too, and is left to make it again.
pub(crate) fn plan<const D: bool>(
    policy: &PyTorch<D>,
    context: &PolicyContext,
) -> Option<WarmCache> {
    let trace = context.trace;
    if trace.source_format() != Format::Kineto || context.device < 0 {
        return None;
    }
    let totals = trace.totals_of(context.device)?;
    let first = totals.first()?;
    if totals.len() != context.events.len() {
        return None;
    }
    // With expandable segments the cache is mapped pages, not segments of sizes to choose:
    // [`PyTorch::start_warm`] maps the rest of the reserve at the end of a reservation.
    if policy.config.expandable_segments {
        return Some(WarmCache { reserved_bytes: first.reserved, ..WarmCache::default() });
    }
    let mut cold: PyTorch = PyTorch::new(policy.config.clone());
    cold.exact_blocks = policy.exact_blocks;
    let mut device: Recording<SimDevice> = Recording::new(SimDevice::new(None));
    // Recorded address -> the cold run's address, for the blocks live now.
    let mut live: HashMap<u64, u64> = HashMap::new();
    for b in context.live_at_start {
        let a = cold.malloc(&mut device, b.size.max(1), b.stream).ok()??;
        live.insert(b.addr, a.addr);
    }
    let mut segments = Vec::new();
    let mut least_growing: Option<u64> = None;
    let mut reserved = first.reserved;
    for (e, t) in context.events.iter().zip(totals) {
        let grew = t.reserved > reserved;
        reserved = t.reserved;
        match e.action {
            Action::Alloc => {
                let before = device.calls().len();
                let a = cold.malloc(&mut device, e.size.max(1), e.stream).ok()??;
                live.insert(e.addr, a.addr);
                if grew {
                    if e.size > SMALL_SIZE {
                        least_growing = Some(least_growing.map_or(e.size, |l| l.min(e.size)));
                    }
                    continue;
                }
                segments.extend(device.calls()[before..].iter().filter_map(|c| match *c {
                    BackendCall::SegmentAlloc { size, addr: Some(_) } => {
                        Some((size, e.stream, size == SMALL_BUFFER))
                    }
                    _ => None,
                }));
            }
            Action::FreeCompleted | Action::FreeRequested => {
                if let Some(a) = live.remove(&e.addr) {
                    cold.free(&mut device, a).ok()?;
                }
            }
            _ => {}
        }
    }
    let piece_bytes =
        least_growing.map(|l| (l - 1) & !(MIN_BLOCK_SIZE - 1)).filter(|&p| p >= MIN_BLOCK_SIZE);
    Some(WarmCache { reserved_bytes: first.reserved, segments, piece_bytes })
}

impl WarmCache {
    /// The segments to install when `reserved` bytes are already reserved (the live blocks'
    /// segments): the planned segments in order while they fit in what is left of the recorded
    /// reserve, then the rest (in 512-byte units) as large-pool segments of at most
    /// [`WarmCache::piece_bytes`] (one segment when that is `None`). Empty when the live
    /// blocks already reserve the recorded total.
    pub(crate) fn to_install(&self, reserved: u64) -> Vec<(u64, u64, bool)> {
        let mut left = self.reserved_bytes.saturating_sub(reserved);
        let mut out = Vec::new();
        for &(size, stream, small) in &self.segments {
            if size <= left {
                out.push((size, stream, small));
                left -= size;
            }
        }
        let mut rest = left & !(MIN_BLOCK_SIZE - 1);
        let piece = match self.piece_bytes {
            Some(p) => p.max(rest.div_ceil(MAX_PIECES).next_multiple_of(MIN_BLOCK_SIZE)),
            None => rest,
        };
        while rest > 0 {
            let size = piece.min(rest);
            out.push((size, 0, false));
            rest -= size;
        }
        out
    }
}

impl<const D: bool> PyTorch<D> {
    /// [`Policy::start`] for a warm Kineto trace: the blocks live at the start are malloc'd
    /// first (their segments made as a cold start makes them), then [`WarmCache::to_install`]'s
    /// segments are obtained from `backend` and installed free, up to the recorded reserve. A
    /// segment the backend or the memory fraction refuses is left out, and
    /// [`Policy::start_fit`] says so.
    pub(super) fn start_warm<B: crate::backend::Backend>(
        &mut self,
        backend: &mut B,
        live_at_start: &[crate::trace::LiveBlock],
        warm: &WarmCache,
    ) -> crate::error::Result<Vec<Option<crate::policy::Allocation>>> {
        let mut out = Vec::with_capacity(live_at_start.len());
        for b in live_at_start {
            out.push(self.malloc(backend, b.size.max(1), b.stream)?);
        }
        if self.config.expandable_segments {
            return self.start_warm_expandable(backend, warm, out);
        }
        let before = self.total_allocated;
        let limit = self.config.allowed_memory_maximum();
        let mut fit = crate::backend::StartFit::default();
        for (size, stream, small) in warm.to_install(self.total_allocated) {
            fit.segments += 1;
            fit.bytes += size;
            if limit.is_some_and(|l| self.total_allocated.saturating_add(size) > l) {
                continue;
            }
            let Some(base) = backend.segment_alloc(size)? else { continue };
            self.install_segment(base, size, stream, small, None, &[(base, size, None)])?;
            fit.installed_segments += 1;
            fit.installed_bytes += size;
        }
        self.start_fit = (fit.installed_segments < fit.segments).then(|| {
            fit.limit_bytes = limit;
            fit
        });
        self.assumed_start = Some(crate::backend::AssumedStart {
            reserved_bytes: warm.reserved_bytes,
            cached_bytes: self.total_allocated - before,
            assumed: "free cudaMalloc segments: those the trace's requests reuse without the \
                      recorded reserve growing, the rest in large-pool segments smaller than \
                      the least request that made it grow"
                .into(),
        });
        Ok(out)
    }

    /// [`PyTorch::start_warm`] with expandable segments: after the live blocks, the rest of the
    /// recorded reserve (rounded up to whole pages) is mapped at the end of the default stream's large-pool
    /// reservation and left free, as pages a caching allocator that never called
    /// `empty_cache()` keeps mapped. Which reservation held them, and on which stream, is not
    /// recorded: the assumption is one, on the default stream. Pages the backend, the memory
    /// fraction or the reservation's size refuse are left out, and [`Policy::start_fit`] says so.
    fn start_warm_expandable<B: crate::backend::Backend>(
        &mut self,
        backend: &mut B,
        warm: &WarmCache,
        out: Vec<Option<crate::policy::Allocation>>,
    ) -> crate::error::Result<Vec<Option<crate::policy::Allocation>>> {
        let before = self.total_allocated;
        let page = self.config.page_size(false).max(1);
        let size = warm.reserved_bytes.saturating_sub(before).div_ceil(page) * page;
        if size > 0 {
            let taken = self.malloc(backend, size, 0)?;
            if let Some(a) = taken {
                self.free_handle(backend, a.addr, a.handle)?;
            } else {
                self.start_fit = Some(crate::backend::StartFit {
                    segments: 1,
                    bytes: size,
                    limit_bytes: self.config.allowed_memory_maximum(),
                    ..Default::default()
                });
            }
        }
        self.assumed_start = Some(crate::backend::AssumedStart {
            reserved_bytes: warm.reserved_bytes,
            cached_bytes: self.total_allocated - before,
            assumed: "free mapped pages at the end of the default stream's large-pool \
                      expandable segment"
                .into(),
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_takes_planned_segments_in_order_then_one_segment_for_the_rest() {
        const MIB: u64 = 1 << 20;
        let mut w = WarmCache {
            reserved_bytes: 100 * MIB,
            segments: vec![(2 * MIB, 0, true), (20 * MIB, 0, false), (64 * MIB, 0, false)],
            piece_bytes: None,
        };
        // 30 MiB already reserved: 70 MiB left; the 64 MiB segment does not fit after the
        // first two (48 left), so the rest is one 48 MiB segment.
        assert_eq!(
            w.to_install(30 * MIB),
            vec![(2 * MIB, 0, true), (20 * MIB, 0, false), (48 * MIB, 0, false)]
        );
        assert_eq!(w.to_install(100 * MIB), vec![]);
        assert_eq!(w.to_install(0).iter().map(|s| s.0).sum::<u64>(), 100 * MIB);
        // Where a 30 MiB request made the recorded run grow, the rest is cut below it.
        w.piece_bytes = Some(30 * MIB - 512);
        assert_eq!(
            w.to_install(30 * MIB),
            vec![
                (2 * MIB, 0, true),
                (20 * MIB, 0, false),
                (30 * MIB - 512, 0, false),
                (18 * MIB + 512, 0, false)
            ]
        );
    }
}
