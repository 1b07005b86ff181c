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
//!
//! Those sizes are one reading of the recording: a real cache may have held one larger segment
//! that the window split for several requests, which the replay from live blocks made one by
//! one, or segments that were busy when a request came. So the plan is checked against the
//! recording: the window is replayed from a few shapes of that cache (one of them the segments
//! the recorded addresses show the cache's requests shared), and each is mended where the replay
//! parts from the recorded `Total Reserved` (a request served from cache where the real run
//! reserved more, or where its address shows a segment the window made: the segment that served
//! it is cut below the request; one that reserved more where the real run did not: a segment of
//! that size is cached, in place of bytes no request used), as long as the replay comes closer;
//! the closest is kept, a miss of the recorded peak weighing as a miss at every event.
//!
//! What the recorded addresses show is taken as given rather than planned
//! (docs/pytorch-model.md#kineto-addresses): blocks live at the start that a request's range
//! shows shared a segment are installed in one ([`SharedSegment`], from the trace layer), and
//! every replay here routes each request to the pool the reader inferred for it, as the engine
//! does, so that the plan is checked against the same replay the user gets.

use super::config::{MIN_BLOCK_SIZE, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE};
use super::PyTorch;
use crate::backend::{Backend, BackendCall, Recording, SimDevice};
use crate::policy::{Allocation, Policy, PolicyContext};
use crate::trace::kineto_segments::{
    cached_spans, served_from_made, shared_segments, SharedSegment,
};
use crate::trace::{Action, Event, Format, LiveBlock, Trace};
use std::collections::HashMap;

/// A free segment to install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) size: u64,
    pub(crate) stream: u64,
    /// A small-pool segment (2 MiB, for requests of 1 MiB or less).
    pub(crate) small: bool,
    /// Kept through every release ([`PyTorch::unreleasable`]): the real cache held that memory
    /// in segments with blocks the trace does not show.
    pub(crate) kept: bool,
}

impl Segment {
    /// A free segment that releases give back.
    pub(crate) const fn new(size: u64, stream: u64, small: bool) -> Segment {
        Segment { size, stream, small, kept: false }
    }
}

/// The cached segments a warm Kineto trace starts with, as `plan` assumes them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WarmCache {
    /// The recorded `Total Reserved` at the first event, after it (the reserve to reach).
    pub(crate) reserved_bytes: u64,
    /// The free segments installed after the live blocks, in order: (size, stream, small
    /// pool). They fill the reserve the live blocks' segments leave (see
    /// [`WarmCache::to_install`]).
    pub(crate) segments: Vec<Segment>,
    /// The segments blocks live at the start shared, as the recorded addresses show them
    /// ([`shared_segments`]): installed with those blocks live in them, where the real cache
    /// had them.
    pub(crate) shared: Vec<SharedSegment>,
}

/// How the first plan cuts the reserve left by the live blocks into free segments, before it is
/// mended against the recording ([`plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// The segments the trace's requests made in a replay from the live blocks, in the order
    /// made, then the rest in pieces smaller than the least request that made the recording
    /// grow.
    AsMade,
    /// Those segments largest first, then the rest in pieces: where they do not all fit, the
    /// larger ones (which smaller requests can split) are kept.
    LargestFirst,
    /// Those segments in order, then the rest as one segment.
    RestWhole,
    /// Their small-pool segments, then the rest as one large-pool segment: a cache that held
    /// one large segment the window's large requests split among themselves.
    OneLarge,
    /// A large-pool segment for each range of the cache the recorded addresses show requests
    /// shared ([`cached_spans`]), its extent rounded up to 2 MiB (what the addresses prove
    /// comes first), then their small-pool segments, then the rest in pieces as
    /// [`Shape::AsMade`] cuts it.
    Addressed,
}

impl Shape {
    /// Every shape, in the order they are preferred where their replays follow the recording
    /// equally well.
    const ALL: [Shape; 5] =
        [Shape::AsMade, Shape::LargestFirst, Shape::RestWhole, Shape::OneLarge, Shape::Addressed];
}

/// The most mends [`plan`] tries on each cut of the cache, and the most events it replays
/// doing so (all replays together), so a long trace costs a bounded multiple of one replay.
const MAX_MENDS: usize = 64;
const MAX_PLANNED_EVENTS: u64 = 1 << 26;

/// The most places where a replay parts from the recording that [`plan`] tries to mend, first
/// first, before it keeps the cache it has.
const MAX_PARTINGS: usize = 8;

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
    let releases = trace.reserve_falls(context.device);
    let shared = shared_segments(context.live_at_start, context.events, totals);
    let spans: Vec<Segment> = cached_spans(context.live_at_start, context.events, totals)
        .into_iter()
        .map(|(start, end, stream)| {
            Segment::new((end - start).next_multiple_of(ROUND_LARGE), stream, false)
        })
        .collect();
    let mut cold: PyTorch = PyTorch::new(policy.config.clone());
    cold.exact_blocks = policy.exact_blocks;
    let mut device: Recording<SimDevice> = Recording::new(SimDevice::new(None));
    // Recorded address -> the cold run's address, for the blocks live now.
    let mut live: HashMap<u64, u64> = HashMap::new();
    let started = cold.start_live(&mut device, context.live_at_start, &shared).ok()?;
    for (b, a) in context.live_at_start.iter().zip(started) {
        live.insert(b.addr, a?.addr);
    }
    let live_reserved = device.reserved();
    let mut made = Vec::new();
    let mut least_growing: Option<u64> = None;
    let mut reserved = first.reserved;
    let mut released = releases.iter().peekable();
    for (i, (e, t)) in context.events.iter().zip(totals).enumerate() {
        if released.next_if_eq(&&(i as u64)).is_some() {
            cold.empty_cache(&mut device).ok()?;
        }
        let grew = t.reserved > reserved;
        reserved = t.reserved;
        match e.action {
            Action::Alloc => {
                let before = device.calls().len();
                cold.route(trace, e).ok()?;
                let a = cold.malloc(&mut device, e.size.max(1), e.stream).ok()??;
                live.insert(e.addr, a.addr);
                if grew {
                    if e.size > SMALL_SIZE {
                        least_growing = Some(least_growing.map_or(e.size, |l| l.min(e.size)));
                    }
                    continue;
                }
                made.extend(device.calls()[before..].iter().filter_map(|c| match *c {
                    BackendCall::SegmentAlloc { size, addr: Some(_) } => {
                        Some(Segment::new(size, e.stream, size == SMALL_BUFFER))
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
    let piece =
        least_growing.map(|l| (l - 1) & !(MIN_BLOCK_SIZE - 1)).filter(|&p| p >= MIN_BLOCK_SIZE);
    let left = first.reserved.saturating_sub(live_reserved);
    let from_made = served_from_made(context.events, totals);
    let window = Window {
        policy,
        context,
        totals,
        releases: &releases,
        shared: &shared,
        from_made: &from_made,
    };
    // Every shape replayed first (so a short budget still compares them), then each mended,
    // closest first, while that brings its replay closer; the closest kept.
    let mut budget = MAX_PLANNED_EVENTS;
    let mut cuts: Vec<(Outcome, Vec<Segment>)> = Vec::new();
    for shape in Shape::ALL {
        let segments = cut(shape, &made, &spans, left, piece);
        if let Some(outcome) = window.replay(&segments, &mut budget) {
            cuts.push((outcome, segments));
        }
    }
    cuts.sort_by_key(|(o, _)| o.deviation);
    let mut best: Option<(Outcome, Vec<Segment>)> = None;
    for (mut outcome, mut segments) in cuts {
        let mut tried = 0;
        'mending: while tried < MAX_MENDS {
            let candidates = (0..outcome.parted.len()).flat_map(|p| mends(&segments, &outcome, p));
            for mended in candidates.collect::<Vec<_>>() {
                tried += 1;
                let Some(next) = window.replay(&mended, &mut budget) else { break 'mending };
                if next.deviation < outcome.deviation {
                    (outcome, segments) = (next, mended);
                    continue 'mending;
                }
                if tried >= MAX_MENDS {
                    break 'mending;
                }
            }
            break;
        }
        if best.as_ref().is_none_or(|(b, _)| outcome.deviation < b.deviation) {
            best = Some((outcome, segments));
        }
    }
    // A window longer than the budget is not checked: the first cut stands.
    let Some((_, segments)) = best else {
        let segments = cut(Shape::AsMade, &made, &spans, left, piece);
        return Some(WarmCache { reserved_bytes: first.reserved, segments, shared });
    };
    Some(WarmCache { reserved_bytes: first.reserved, segments, shared })
}

/// The free segments of `shape` that fill `left` bytes: of `made` (the segments a replay from
/// the live blocks made for requests served from the real run's cache) those that fit, then
/// the rest (in 512-byte units) in pieces of at most `piece` bytes (one piece when `None`).
fn cut(
    shape: Shape,
    made: &[Segment],
    spans: &[Segment],
    left: u64,
    piece: Option<u64>,
) -> Vec<Segment> {
    let mut planned = made.to_vec();
    match shape {
        Shape::LargestFirst => planned.sort_by_key(|s| std::cmp::Reverse(s.size)),
        Shape::OneLarge => planned.retain(|s| s.small),
        Shape::Addressed => {
            planned.retain(|s| s.small);
            planned.splice(0..0, spans.iter().copied());
        }
        Shape::AsMade | Shape::RestWhole => {}
    }
    let (mut out, left) = fitting(planned, left);
    let piece = match shape {
        Shape::AsMade | Shape::LargestFirst | Shape::Addressed => piece,
        Shape::RestWhole | Shape::OneLarge => None,
    };
    out.extend(pieces(left & !(MIN_BLOCK_SIZE - 1), piece, 0));
    out
}

/// Of `segments`, in order, each that fits in what `left` bytes leave after those taken before
/// it (one that does not fit is passed over, a smaller one after it may still fit), and the bytes
/// left then.
fn fitting(segments: impl IntoIterator<Item = Segment>, mut left: u64) -> (Vec<Segment>, u64) {
    let mut out = Vec::new();
    for segment in segments {
        if segment.size <= left {
            out.push(segment);
            left -= segment.size;
        }
    }
    (out, left)
}

/// `bytes` (a multiple of 512) as free large-pool segments on `stream` of at most `piece`
/// bytes each (one when `None`), never more than [`MAX_PIECES`] of them.
fn pieces(bytes: u64, piece: Option<u64>, stream: u64) -> Vec<Segment> {
    let piece = match piece {
        Some(p) => p.max(bytes.div_ceil(MAX_PIECES).next_multiple_of(MIN_BLOCK_SIZE)),
        None => bytes,
    };
    let mut rest = bytes;
    let mut out = Vec::new();
    while rest > 0 {
        let size = piece.min(rest);
        out.push(Segment::new(size, stream, false));
        rest -= size;
    }
    out
}

/// What a warm trace's window is replayed against: the recorded totals after each event and
/// the releases the recording shows.
struct Window<'a, const D: bool> {
    policy: &'a PyTorch<D>,
    context: &'a PolicyContext<'a>,
    totals: &'a [crate::trace::RecordedTotals],
    releases: &'a [u64],
    shared: &'a [SharedSegment],
    /// For each event, whether the recorded addresses show it was served from a segment made
    /// in the window ([`served_from_made`]).
    from_made: &'a [bool],
}

/// How a replay from a planned cache followed the recording.
struct Outcome {
    /// The sum over events of the difference between the replay's reserved bytes and the
    /// recorded `Total Reserved` after each.
    deviation: u128,
    /// The first requests (at most [`MAX_PARTINGS`]) where the replay reserved more, or less,
    /// than the recording did, each with its event index.
    parted: Vec<(usize, Parted)>,
    /// For each planned segment, the index of the first event that took memory from it
    /// (`usize::MAX` where none did).
    first_use: Vec<usize>,
}

impl Outcome {
    /// Whether a request before event `at` took memory from planned segment `k`.
    fn used_before(&self, k: usize, at: usize) -> bool {
        self.first_use.get(k).is_none_or(|&u| u < at)
    }
}

/// The first request at which a replay parts from the recording.
enum Parted {
    /// The replay served a request of `size` bytes from planned segment `segment` where the
    /// recording reserved more, or where its address shows it served from a segment made in
    /// the window: the real cache had no free block for it.
    Served { size: u64, segment: usize },
    /// The replay reserved `bytes` more for a request on `stream` where the recording did
    /// not: the real cache held a segment for it.
    Grew { bytes: u64, stream: u64, small: bool },
    /// After a release the replay reserved `short` bytes less than the recording: the real
    /// cache kept that much free memory a release does not give back.
    Released { short: u64 },
}

impl<const D: bool> Window<'_, D> {
    /// The window replayed from the live blocks and `segments`, cached free; `None` where the
    /// replay fails or `budget` (events left to replay) runs out.
    fn replay(&self, segments: &[Segment], budget: &mut u64) -> Option<Outcome> {
        let events = self.context.events;
        *budget = budget.checked_sub(events.len() as u64)?;
        let mut run: PyTorch = PyTorch::new(self.policy.config.clone());
        run.exact_blocks = self.policy.exact_blocks;
        let mut device = SimDevice::new(None);
        let mut live: HashMap<u64, u64> = HashMap::new();
        let started = run.start_live(&mut device, self.context.live_at_start, self.shared).ok()?;
        for (b, a) in self.context.live_at_start.iter().zip(started) {
            live.insert(b.addr, a?.addr);
        }
        // Each planned segment's base, in address order with its index.
        let mut bases: Vec<(u64, u64, usize)> = Vec::with_capacity(segments.len());
        for (k, s) in segments.iter().enumerate() {
            let base = device.segment_alloc(s.size).ok()??;
            run.install_free(base, s).ok()?;
            bases.push((base, s.size, k));
        }
        bases.sort_unstable();
        let planned_at = |addr: u64| {
            let i = bases.partition_point(|&(b, _, _)| b <= addr).checked_sub(1)?;
            let (b, size, k) = bases[i];
            (addr < b + size).then_some(k)
        };
        let mut outcome = Outcome {
            deviation: 0,
            parted: Vec::new(),
            first_use: vec![usize::MAX; segments.len()],
        };
        // The replay's peak reserved bytes and the recording's.
        let mut peaks = (0u64, 0u64);
        let mut released = self.releases.iter().peekable();
        let mut recorded = self.totals.first().map_or(0, |t| t.reserved);
        for (i, (e, t)) in events.iter().zip(self.totals).enumerate() {
            let releasing = released.next_if_eq(&&(i as u64)).is_some();
            if releasing {
                run.empty_cache(&mut device).ok()?;
            }
            let recorded_grew = t.reserved > recorded;
            recorded = t.reserved;
            match e.action {
                Action::Alloc if e.size > 0 => {
                    let before = device.reserved();
                    run.route(self.context.trace, e).ok()?;
                    let a = run.malloc(&mut device, e.size, e.stream).ok()??;
                    live.insert(e.addr, a.addr);
                    let grew = device.reserved().saturating_sub(before);
                    let from = planned_at(a.addr);
                    let made = self.from_made.get(i).copied().unwrap_or(false);
                    let parted = match (recorded_grew || made, grew > 0, from) {
                        (true, false, Some(segment)) => {
                            Some(Parted::Served { size: e.size, segment })
                        }
                        (false, true, _) => Some(Parted::Grew {
                            bytes: grew,
                            stream: e.stream,
                            small: e.size <= SMALL_SIZE,
                        }),
                        _ => None,
                    };
                    match parted {
                        Some(p) if outcome.parted.len() < MAX_PARTINGS => {
                            outcome.parted.push((i, p))
                        }
                        _ => {}
                    }
                    if let Some(u) = from.and_then(|k| outcome.first_use.get_mut(k)) {
                        *u = (*u).min(i);
                    }
                }
                Action::FreeCompleted | Action::FreeRequested => {
                    if let Some(a) = live.remove(&e.addr) {
                        run.free(&mut device, a).ok()?;
                    }
                }
                _ => {}
            }
            let short = t.reserved.saturating_sub(device.reserved());
            if releasing && short > 0 && outcome.parted.len() < MAX_PARTINGS {
                outcome.parted.push((i, Parted::Released { short }));
            }
            outcome.deviation += u128::from(device.reserved().abs_diff(t.reserved));
            peaks = (peaks.0.max(device.reserved()), peaks.1.max(t.reserved));
        }
        // The peak is the answer read from a replay: missing it by Δ counts as missing every
        // event by Δ.
        outcome.deviation += u128::from(peaks.0.abs_diff(peaks.1)) * events.len() as u128;
        Some(outcome)
    }
}

/// `segment` cut so that no piece holds a request of `size` bytes: a small-pool segment
/// becomes a large-pool one of the same bytes (small requests never reach it), a large-pool one
/// pieces below `size`; `None` where that takes too many pieces.
fn cut_below(segment: Segment, size: u64) -> Option<Vec<Segment>> {
    let below = (size - 1) & !(MIN_BLOCK_SIZE - 1);
    let mut out = match segment.small {
        true => vec![Segment { small: false, ..segment }],
        false if below >= MIN_BLOCK_SIZE && segment.size / below < MAX_PIECES => {
            pieces(segment.size, Some(below), segment.stream)
        }
        false => return None,
    };
    for piece in &mut out {
        piece.kept = segment.kept;
    }
    Some(out)
}

/// The ways to mend `segments` where `outcome`'s replay parted from the recording at its
/// `parting`-th place (none where it cannot be mended), each to be tried in turn:
///
/// - a request served from a planned segment where the real run reserved more, or took a
///   segment made in the window: the real cache had no free block for it. That segment is cut
///   below the request ([`cut_below`]); then, as a second way, so is every large-pool segment
///   of at least that size no request had used yet (each was wholly free then, so the real
///   cache held none of them either, unless a larger block was the best fit);
/// - a request the real run found cached gets a segment of the size the replay reserved for
///   it, its bytes taken from segments no request had used, last first, then from those first
///   used latest.
fn mends(segments: &[Segment], outcome: &Outcome, parting: usize) -> Vec<Vec<Segment>> {
    let Some(&(at, ref parted)) = outcome.parted.get(parting) else { return Vec::new() };
    let mut out = segments.to_vec();
    match *parted {
        Parted::Served { size, segment } => {
            let Some(cut) = out.get(segment).and_then(|&s| cut_below(s, size)) else {
                return Vec::new();
            };
            out.splice(segment..=segment, cut);
            let mut every = Vec::with_capacity(segments.len());
            let mut more = false;
            for (k, &s) in segments.iter().enumerate() {
                let unused_fit = !s.small && s.size >= size && !outcome.used_before(k, at);
                match (k == segment || unused_fit).then(|| cut_below(s, size)).flatten() {
                    Some(cut) => {
                        more |= k != segment;
                        every.extend(cut);
                    }
                    None => every.push(s),
                }
            }
            return if more { vec![out, every] } else { vec![out] };
        }
        Parted::Released { short } => {
            // That many bytes of the plan, last first, kept through releases.
            let mut need = short;
            for k in (0..out.len()).rev() {
                if need == 0 {
                    break;
                }
                if out[k].kept {
                    continue;
                }
                let take = need.min(out[k].size);
                need -= take;
                if take == out[k].size {
                    out[k].kept = true;
                    continue;
                }
                out[k].size -= take;
                let kept = Segment { size: take, small: false, kept: true, ..out[k] };
                out[k].small = false;
                out.insert(k + 1, kept);
            }
            if need > 0 {
                return Vec::new();
            }
        }
        Parted::Grew { bytes, stream, small } => {
            // Segments no request had used, last first; then those first used latest.
            let mut order: Vec<usize> = (0..out.len()).rev().collect();
            order.sort_by_key(|&k| match outcome.used_before(k, at) {
                false => (0, 0),
                true => (1, usize::MAX - outcome.first_use.get(k).copied().unwrap_or(0)),
            });
            let mut need = bytes;
            for k in order {
                if need == 0 {
                    break;
                }
                let take = need.min(out[k].size);
                out[k].size -= take;
                need -= take;
            }
            if need > 0 {
                return Vec::new();
            }
            out.retain(|s| s.size > 0);
            // A small-pool segment is 2 MiB: one that gave bytes away is a large-pool one now.
            for s in &mut out {
                s.small &= s.size == SMALL_BUFFER;
            }
            out.insert(0, Segment::new(bytes, stream, small && bytes == SMALL_BUFFER));
        }
    }
    vec![out]
}

impl WarmCache {
    /// The segments to install when `reserved` bytes are already reserved (the live blocks'
    /// segments): the planned segments in order while they fit in what is left of the recorded
    /// reserve. Empty when the live blocks already reserve the recorded total.
    pub(crate) fn to_install(&self, reserved: u64) -> Vec<Segment> {
        fitting(self.segments.iter().copied(), self.reserved_bytes.saturating_sub(reserved)).0
    }
}

impl<const D: bool> PyTorch<D> {
    /// Makes the next malloc into the pool the trace says `e` was made into (the default pools
    /// where it names none), as the replay engine does before each request.
    fn route(&mut self, trace: &Trace, e: &Event) -> crate::error::Result<()> {
        self.allocate_into(trace.entry_pool(e).flatten())
    }

    /// Installs planned `segment` free at `base`, in the default pools; one kept through
    /// releases is marked so ([`PyTorch::unreleasable`]).
    fn install_free(&mut self, base: u64, segment: &Segment) -> crate::error::Result<()> {
        let Segment { size, stream, small, kept } = *segment;
        self.install_segment(base, size, stream, small, None, &[(base, size, None)])?;
        if kept {
            self.unreleasable.insert(base);
        }
        Ok(())
    }

    /// The blocks live at the start, in the default pools: each malloc'd in order (its
    /// segment made as a cold start makes it), but those of a `shared` segment, installed
    /// live in one segment at their recorded offsets after the others. A shared segment that
    /// cannot be installed so (blocks that do not tile it, or memory refused) has its blocks
    /// malloc'd too. Returns each block's allocation, in the order of `live`.
    pub(super) fn start_live<B: Backend>(
        &mut self,
        backend: &mut B,
        live: &[LiveBlock],
        shared: &[SharedSegment],
    ) -> crate::error::Result<Vec<Option<Allocation>>> {
        self.allocate_into(None)?;
        let mut in_shared = vec![false; live.len()];
        for k in shared.iter().flat_map(|s| &s.blocks) {
            if let Some(x) = in_shared.get_mut(*k) {
                *x = true;
            }
        }
        let mut out = vec![None; live.len()];
        for (k, b) in live.iter().enumerate() {
            if !in_shared[k] {
                out[k] = self.malloc(backend, b.size.max(1), b.stream)?;
            }
        }
        for s in shared {
            match self.install_shared(backend, live, s)? {
                Some(placed) => {
                    for (&k, a) in s.blocks.iter().zip(placed) {
                        out[k] = Some(a);
                    }
                }
                None => {
                    for &k in &s.blocks {
                        let b = &live[k];
                        out[k] = self.malloc(backend, b.size.max(1), b.stream)?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Installs shared segment `s` with its blocks live at their recorded offsets and free
    /// blocks between and after them: a small-pool segment (2 MiB) where every block is a
    /// small-pool one and they fit in one, else a large-pool one of their extent rounded up to
    /// 2 MiB (the least the real one can have been). `None` where the blocks do not tile it (not
    /// 512-byte aligned, on several streams), or the memory fraction or backend refuses it.
    fn install_shared<B: Backend>(
        &mut self,
        backend: &mut B,
        live: &[LiveBlock],
        s: &SharedSegment,
    ) -> crate::error::Result<Option<Vec<Allocation>>> {
        let Some(&first) = s.blocks.first() else { return Ok(None) };
        let stream = live.get(first).map_or(0, |b| b.stream);
        let extent = s.end.saturating_sub(s.start);
        let small = extent <= SMALL_BUFFER
            && s.blocks.iter().all(|&k| live.get(k).is_some_and(|b| b.size <= SMALL_SIZE));
        let size = if small { SMALL_BUFFER } else { extent.next_multiple_of(ROUND_LARGE) };
        let mut tiles = Vec::with_capacity(2 * s.blocks.len() + 1);
        let mut pos = 0u64;
        for &k in &s.blocks {
            let Some(b) = live.get(k) else { return Ok(None) };
            let Some(off) = b.addr.checked_sub(s.start) else { return Ok(None) };
            let aligned = off % MIN_BLOCK_SIZE == 0 && b.size % MIN_BLOCK_SIZE == 0;
            if !aligned || b.size == 0 || off < pos || b.stream != stream {
                return Ok(None);
            }
            if off > pos {
                tiles.push((pos, off - pos, None));
            }
            tiles.push((off, b.size, Some(b.size)));
            pos = off + b.size;
        }
        if pos > size {
            return Ok(None);
        }
        if size > pos {
            tiles.push((pos, size - pos, None));
        }
        let limit = self.config.allowed_memory_maximum();
        if limit.is_some_and(|l| self.total_allocated.saturating_add(size) > l) {
            return Ok(None);
        }
        let Some(base) = backend.segment_alloc(size)? else { return Ok(None) };
        let tiles: Vec<_> = tiles.into_iter().map(|(o, n, r)| (base + o, n, r)).collect();
        self.install_segment(base, size, stream, small, None, &tiles).map(Some)
    }

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
        let out = self.start_live(backend, live_at_start, &warm.shared)?;
        if self.config.expandable_segments {
            return self.start_warm_expandable(backend, warm, out);
        }
        let before = self.total_allocated;
        let limit = self.config.allowed_memory_maximum();
        let mut fit = crate::backend::StartFit::default();
        for segment in warm.to_install(self.total_allocated) {
            let size = segment.size;
            fit.segments += 1;
            fit.bytes += size;
            if limit.is_some_and(|l| self.total_allocated.saturating_add(size) > l) {
                continue;
            }
            let Some(base) = backend.segment_alloc(size)? else { continue };
            self.install_free(base, &segment)?;
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
                      recorded reserve growing, the rest, cut and mended so that a replay from \
                      them follows the recorded Total Reserved most closely"
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

    const MIB: u64 = 1 << 20;

    fn seg(size: u64, stream: u64, small: bool) -> Segment {
        Segment::new(size, stream, small)
    }

    #[test]
    fn each_shape_fills_the_reserve_with_the_made_segments_that_fit_then_the_rest() {
        let made = [seg(2 * MIB, 0, true), seg(20 * MIB, 0, false), seg(64 * MIB, 0, false)];
        let sizes = |v: Vec<Segment>| v.iter().map(|s| s.size / MIB).collect::<Vec<_>>();
        let spans = [seg(30 * MIB, 0, false), seg(12 * MIB, 0, false)];
        // 70 MiB left: the 64 MiB segment does not fit after the first two (48 left).
        assert_eq!(sizes(cut(Shape::AsMade, &made, &spans, 70 * MIB, None)), [2, 20, 48]);
        // Where a 30 MiB request made the recorded run grow, the rest is cut below it.
        let below_30 = Some(30 * MIB - 512);
        let as_made = cut(Shape::AsMade, &made, &spans, 70 * MIB, below_30);
        assert_eq!(as_made[2..], [seg(30 * MIB - 512, 0, false), seg(18 * MIB + 512, 0, false)]);
        let rest_whole = cut(Shape::RestWhole, &made, &spans, 70 * MIB, below_30);
        assert_eq!(sizes(rest_whole), [2, 20, 48]);
        // Largest first keeps the 64 MiB segment; one large keeps only the small pool's.
        let largest = cut(Shape::LargestFirst, &made, &spans, 70 * MIB, None);
        assert_eq!(sizes(largest), [64, 2, 4]);
        assert_eq!(sizes(cut(Shape::OneLarge, &made, &spans, 70 * MIB, below_30)), [2, 68]);
        // The addresses' segments first, then the small pool's, then the rest below 30 MiB.
        let addressed = cut(Shape::Addressed, &made, &spans, 70 * MIB, below_30);
        assert_eq!(
            addressed[..3],
            [seg(30 * MIB, 0, false), seg(12 * MIB, 0, false), seg(2 * MIB, 0, true)]
        );
        assert_eq!(sizes(addressed[3..].to_vec()), [26]);
        for shape in Shape::ALL {
            let total: u64 =
                cut(shape, &made, &spans, 70 * MIB, below_30).iter().map(|s| s.size).sum();
            assert_eq!(total, 70 * MIB, "{shape:?}");
        }
    }

    #[test]
    fn the_cache_installs_its_segments_while_they_fit_in_the_recorded_reserve() {
        let w = WarmCache {
            reserved_bytes: 100 * MIB,
            segments: vec![seg(2 * MIB, 0, true), seg(20 * MIB, 0, false), seg(48 * MIB, 0, false)],
            shared: Vec::new(),
        };
        assert_eq!(w.to_install(30 * MIB), w.segments);
        assert_eq!(w.to_install(40 * MIB), w.segments[..2]);
        assert_eq!(w.to_install(100 * MIB), vec![]);
    }

    #[test]
    fn a_cache_is_mended_where_its_replay_parts_from_the_recording() {
        let segments =
            vec![seg(2 * MIB, 0, true), seg(64 * MIB, 0, false), seg(40 * MIB, 0, false)];
        // Parted at event 10; `first_use` gives the event each segment was first used at.
        let outcome = |parted, first_use: [usize; 3]| Outcome {
            deviation: 1,
            parted: vec![(10, parted)],
            first_use: first_use.to_vec(),
        };
        const NEVER: usize = usize::MAX;
        // A 30 MiB request served from the 64 MiB segment where the real run reserved more:
        // that segment is cut below 30 MiB. As a second way, the 40 MiB segment no request had
        // used (wholly free then, so not in the real cache either) is cut too.
        let served = outcome(Parted::Served { size: 30 * MIB, segment: 1 }, [NEVER; 3]);
        let ways = mends(&segments, &served, 0);
        assert_eq!(ways.len(), 2);
        assert!(ways[0][1..4].iter().all(|s| s.size < 30 * MIB && !s.small), "{ways:?}");
        assert_eq!(ways[0].last(), Some(&seg(40 * MIB, 0, false)));
        assert!(ways[1].iter().all(|s| s.size < 30 * MIB), "{ways:?}");
        for way in &ways {
            assert_eq!(way.iter().map(|s| s.size).sum::<u64>(), 106 * MIB);
        }
        // Used before the parting, the 40 MiB segment may have been busy: one way only.
        let served = outcome(Parted::Served { size: 30 * MIB, segment: 1 }, [NEVER, NEVER, 3]);
        assert_eq!(mends(&segments, &served, 0).len(), 1);
        // A small request served from a small-pool segment: it becomes a large-pool one.
        let small = outcome(Parted::Served { size: 512, segment: 0 }, [NEVER; 3]);
        assert_eq!(mends(&segments, &small, 0)[0][0], seg(2 * MIB, 0, false));
        // A 50 MiB segment the replay made where the real run found one cached: taken from the
        // segments no request used (the 40 MiB one, then 10 of the 64), put first.
        let grew = || Parted::Grew { bytes: 50 * MIB, stream: 7, small: false };
        let mended = mends(&segments, &outcome(grew(), [3, NEVER, NEVER]), 0);
        assert_eq!(
            mended,
            [vec![seg(50 * MIB, 7, false), seg(2 * MIB, 0, true), seg(54 * MIB, 0, false)]]
        );
        // Not enough unused bytes: then from those first used latest (the 64 MiB segment, used
        // at event 5, before the small one, used at 3); a small one that gives bytes away is a
        // large-pool one.
        let mended = mends(&segments, &outcome(grew(), [3, 5, NEVER]), 0);
        assert_eq!(
            mended,
            [vec![seg(50 * MIB, 7, false), seg(2 * MIB, 0, true), seg(54 * MIB, 0, false)]]
        );
        let grew = Parted::Grew { bytes: 105 * MIB, stream: 7, small: false };
        let mended = mends(&segments, &outcome(grew, [3, 5, NEVER]), 0);
        assert_eq!(mended, [vec![seg(105 * MIB, 7, false), seg(MIB, 0, false)]]);
        // More bytes than the plan holds: nothing to mend; nor where it did not part.
        let grew = Parted::Grew { bytes: 200 * MIB, stream: 7, small: false };
        assert!(mends(&segments, &outcome(grew, [NEVER; 3]), 0).is_empty());
        let none = Outcome { deviation: 0, parted: vec![], first_use: vec![] };
        assert!(mends(&segments, &none, 0).is_empty());
    }

    #[test]
    fn memory_a_release_kept_is_taken_from_the_plan_s_last_segments_and_kept() {
        let segments =
            vec![seg(2 * MIB, 0, true), seg(64 * MIB, 0, false), seg(40 * MIB, 0, false)];
        let outcome = Outcome {
            deviation: 1,
            parted: vec![(10, Parted::Released { short: 50 * MIB })],
            first_use: vec![0; 3],
        };
        // The 40 MiB segment, then 10 MiB of the 64 (split off beside it), kept through
        // releases; the bytes the plan holds stay the same.
        let kept = |size| Segment { kept: true, ..seg(size, 0, false) };
        let want =
            vec![seg(2 * MIB, 0, true), seg(54 * MIB, 0, false), kept(10 * MIB), kept(40 * MIB)];
        assert_eq!(mends(&segments, &outcome, 0), std::slice::from_ref(&want));
        // Cut below a request, a kept segment's pieces stay kept.
        assert!(cut_below(kept(40 * MIB), 30 * MIB).unwrap().iter().all(|s| s.kept));
        // More than the plan holds apart: nothing to mend.
        let outcome =
            Outcome { parted: vec![(10, Parted::Released { short: 200 * MIB })], ..outcome };
        assert!(mends(&segments, &outcome, 0).is_empty());
        // Installed, a kept segment survives `empty_cache()`; the others go.
        let mut policy: PyTorch = PyTorch::new(super::super::Config::default());
        let mut device = SimDevice::new(None);
        for s in &want {
            let base = device.segment_alloc(s.size).unwrap().unwrap();
            policy.install_free(base, s).unwrap();
        }
        policy.empty_cache(&mut device).unwrap();
        assert_eq!(device.reserved(), 50 * MIB);
    }
}
