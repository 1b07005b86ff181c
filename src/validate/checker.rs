//! `Checker`: validation's guide of the replay engine. What each recorded event is ([`plan`]),
//! and, during the replay, which recorded segment events each malloc owns, the recorded flushes
//! made again, and every address and segment event compared with the recording.

use super::guided::Guided;
use super::Mismatch;
use crate::backend::{Observed, Observer};
use crate::error::Result;
use crate::policy::pytorch::config::SMALL_SIZE;
use crate::policy::pytorch::PyTorch;
use crate::policy::Policy;
use crate::replay::{Guide, ReplayInput, ReplayOptions, ReplayOutput};
use crate::trace::lifetimes::{free_action, FlushCauses};
use crate::trace::{Action, Event, Trace};

/// What happens at one recorded event.
#[derive(Clone, Debug)]
pub(super) enum Op {
    /// A malloc, ending at an `alloc` (or an `oom` when `oom`), with its recorded segment events.
    Malloc { size: u64, stream: u64, oom: bool, script: Vec<usize> },
    /// A free taking effect.
    Free,
    /// An `empty_cache()`: a recorded release run outside any malloc.
    Flush { script: Vec<usize> },
    /// Nothing to do (free_requested, a segment event a malloc or flush owns, snapshot).
    Skip,
}

/// Assigns every recorded event its [`Op`] (the trace order inside one malloc,
/// docs/pytorch-model.md#malloc-order). The release runs a replay takes for the program's
/// `empty_cache()` calls (`calls`, the first index of each: [`ReplayInput::empty_cache_at`],
/// read by stacks and levels) are a flush even right before a malloc's new segment, so that
/// `validate` checks the program a replay runs; a run ends at a release whose stack names
/// another cause (`causes`, [`FlushCause`](crate::trace::lifetimes::FlushCause)).
pub(super) fn plan(events: &[Event], causes: &FlushCauses, calls: &[u64]) -> Vec<Op> {
    let frees_at = free_action(events);
    let mut ops = vec![Op::Skip; events.len()];
    let mut i = 0;
    let release = |a: Action| matches!(a, Action::SegmentFree | Action::SegmentUnmap);
    while i < events.len() {
        let e = &events[i];
        if release(e.action) && calls.binary_search(&(i as u64)).is_ok() {
            let start = i;
            let mut segs = Vec::new();
            while i < events.len() {
                let x = &events[i];
                if causes.made_by_call(x) {
                    segs.push(i);
                } else if x.action == Action::FreeCompleted {
                    ops[i] = Op::Free;
                } else {
                    break;
                }
                i += 1;
            }
            ops[start] = Op::Flush { script: segs };
            continue;
        }
        if e.action.is_segment_event() {
            let start = i;
            let mut segs = Vec::new();
            while i < events.len()
                && (events[i].action.is_segment_event()
                    || events[i].action == Action::FreeCompleted)
            {
                if events[i].action.is_segment_event() {
                    segs.push(i);
                } else {
                    ops[i] = Op::Free;
                }
                i += 1;
            }
            let last = segs.last().map(|&j| events[j].action);
            let owner = events.get(i).map(|x| x.action);
            let malloc = match owner {
                Some(Action::Alloc) => {
                    matches!(last, Some(Action::SegmentAlloc | Action::SegmentMap))
                }
                Some(Action::Oom) => true,
                _ => false,
            };
            if malloc {
                let x = &events[i];
                ops[i] = Op::Malloc {
                    size: x.size,
                    stream: x.stream,
                    oom: x.action == Action::Oom,
                    script: segs,
                };
                i += 1;
            } else {
                ops[start] = Op::Flush { script: segs };
            }
            continue;
        }
        ops[i] = match e.action {
            Action::Alloc => {
                Op::Malloc { size: e.size, stream: e.stream, oom: false, script: vec![] }
            }
            Action::Oom => Op::Malloc { size: e.size, stream: e.stream, oom: true, script: vec![] },
            a if a == frees_at => Op::Free,
            _ => Op::Skip,
        };
        i += 1;
    }
    ops
}

/// [`plan`] of `events` (of `trace`) with the calls a replay reads there (`input`'s), and the
/// size each `oom` entry's request had: an `oom` entry records the rounded size; the recording's
/// allocator padded the request first where it is torch_npu's (by `pad`), so the request that
/// rounds to it is that much smaller.
pub(super) fn plan_recording(
    events: &[Event],
    trace: &Trace,
    input: &ReplayInput,
    pad: u64,
) -> Vec<Op> {
    let mut ops = plan(events, &FlushCauses::of(&trace.frames), input.empty_cache_at());
    for op in &mut ops {
        if let Op::Malloc { size, oom: true, .. } = op {
            if *size > pad {
                *size -= pad;
            }
        }
    }
    ops
}

/// The event indices at which `validate` makes the program's `empty_cache()` calls: the start of
/// every [`Op::Flush`] its plan gives the events of `device` in `trace`, in order. A replay
/// reads the same flushes by its own rules ([`ReplayInput::empty_cache_at`]); both readings
/// must agree, and this is exposed, hidden, only for the test that checks they do
/// (in `tests/pytorch.rs`).
#[doc(hidden)]
pub fn planned_empty_cache_calls(trace: &Trace, device: i32) -> Result<Vec<u64>> {
    let Some(d) = trace.device(device) else { return Ok(Vec::new()) };
    let input = ReplayInput::of_events(trace, device, &d.events)?;
    let ops = plan(&d.events, &FlushCauses::of(&trace.frames), input.empty_cache_at());
    let flush = |(i, op): (usize, &Op)| matches!(op, Op::Flush { .. }).then_some(i as u64);
    Ok(ops.iter().enumerate().filter_map(flush).collect())
}

/// One replay from one start state: every decision the simulation made and how it compared.
#[derive(Default)]
pub(super) struct Run {
    /// Per recorded event index of an alloc: the simulated address (None: the malloc failed).
    pub(super) placed: Vec<(usize, Option<u64>)>,
    pub(super) mismatches: Vec<Mismatch>,
    /// First alloc whose recorded address lies strictly inside a simulated free block.
    pub(super) first_inside_free: Option<(usize, u64)>,
    /// First alloc placed elsewhere: (event, recorded address, simulated address).
    pub(super) first_mismatch: Option<(usize, u64, Option<u64>)>,
    /// Allocs of exact-address allocations served (placed by address, not compared).
    pub(super) exact_placed: u64,
    pub(super) segment_events_matched: u64,
    /// The engine's output: peaks, the simulated run as events, the final segments.
    pub(super) output: ReplayOutput,
}

/// How far a replay goes.
#[derive(Clone, Copy)]
pub(super) enum Stop<'a> {
    /// To the end.
    Never,
    /// At the first alloc placed elsewhere than recorded.
    FirstMismatch,
    /// At the first alloc where the placement differs from this reference run's, or where both
    /// differ from the recording.
    Diverge(&'a [(usize, Option<u64>)]),
}

pub(super) fn hex(a: u64) -> String {
    format!("{a:#x}")
}

/// Tells `policy` of every private pool that a release in `script` shows gone, before the flush
/// that made those releases runs: PyTorch's flush releases gone pools after the default ones,
/// so the first release of the run comes before the one that names the pool. For a malloc's
/// script, `request` is the pool the malloc was made into, whose releases are its own (within
/// its live pool), not a gone pool's.
fn release_gone_pools(
    policy: &mut PyTorch,
    routes: Option<&crate::trace::pool_routes::PoolRoutes>,
    events: &[Event],
    script: &[usize],
    request: Option<(u64, u64)>,
) -> Result<()> {
    let Some(routes) = routes else { return Ok(()) };
    for e in script.iter().filter_map(|&j| events.get(j)) {
        if let Some(pool) = routes.released_by(e).filter(|&p| Some(p) != request) {
            policy.release_pool(pool)?;
        }
    }
    Ok(())
}

/// Why the simulation placed a block elsewhere: what it holds at the recorded address. `routed`
/// says whether the malloc was made into a private pool.
fn explain(policy: &PyTorch, recorded: u64, placed: Option<u64>, routed: bool) -> String {
    match policy.private_pool_at(recorded) {
        Some((a, b)) if !routed => {
            return format!(
                "the recorded address is in a segment of the private pool ({a}, {b}), which the \
                 dump does not show owning it then: an allocation made into a CUDA graph's or \
                 MemPool's pool that could not be routed there"
            )
        }
        _ => {}
    }
    match policy.block_containing(recorded) {
        None => "the recorded address is in no simulated segment".into(),
        Some((start, size, true)) if Some(start) == placed => format!(
            "the recorded address was inside the free block the simulation split for this request ({start:#x}+{size}): a block boundary differs"
        ),
        Some((start, size, true)) => {
            format!("the recorded address is inside a live block {start:#x}+{size} in the simulation")
        }
        Some((start, size, false)) if start == recorded => {
            format!("a free block starts there ({size} bytes) but best fit chose another")
        }
        Some((start, size, false)) => format!(
            "the recorded address is inside the free block {start:#x}+{size}: a block boundary differs"
        ),
    }
}

/// Validation's guide of the replay engine: before each malloc it tells the [`Guided`] device
/// which recorded segment events the malloc owns and routes the request to its recorded pool;
/// after it, it compares the address and the segment events with the recording; it performs
/// the recorded `empty_cache()` calls and compares what they released.
pub(super) struct Checker<'a> {
    pub(super) events: &'a [Event],
    pub(super) ops: &'a [Op],
    /// The recorded `oom` entries made during a graph capture
    /// ([`ReplayInput::captured_ooms`]).
    pub(super) captured_ooms: &'a [u64],
    pub(super) routes: Option<crate::trace::pool_routes::PoolRoutes>,
    /// The recording's exact-address allocations, placed where recorded.
    pub(super) exact: crate::replay::ExactPlacer<'a>,
    /// The release runs the recording leaves undecided, decided as a replay decides them.
    pub(super) undecided: crate::replay::Undecided<'a>,
    pub(super) stop: Stop<'a>,
    /// The next placement of the reference run to compare with ([`Stop::Diverge`]).
    pub(super) ref_pos: usize,
    pub(super) run: Run,
    pub(super) stopped: bool,
}

impl<'a> Guide<PyTorch, Guided<'a>> for Checker<'a> {
    /// Blocks the recovered start state does not hold have no segment: their frees are
    /// mismatches, not mallocs of fresh memory.
    const MALLOCS_UNHELD_START: bool = false;

    fn starts_cold(&self, _: &ReplayOptions) -> bool {
        false
    }

    fn before_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut PyTorch,
        backend: &mut Observed<Guided<'a>, O>,
    ) -> Result<()> {
        let i = index as usize;
        let Some(Op::Malloc { size, stream, oom, script }) = self.ops.get(i) else {
            return Ok(());
        };
        let (size, stream, oom) = (*size, *stream, *oom);
        let dev = &mut backend.inner;
        dev.begin(i);
        dev.stream = stream;
        dev.small = policy.settings().round_size(size) <= SMALL_SIZE;
        dev.page = policy.settings().page_size(dev.small);
        // The pool the entry names, or where the recording placed it, says whether it was made
        // into a private pool (during graph capture, or under use_mem_pool).
        let mut into = self.routes.as_mut().and_then(|r| r.route(e));
        policy.allocate_into(into)?;
        // An OOM of a file that names no pools has no address to tell its pool by.
        if into.is_none() {
            let cached = || policy.would_hit_cache(size, stream);
            if let Some(p) = self.routes.as_mut().and_then(|r| r.route_failed(e, cached)) {
                into = Some(p);
                policy.allocate_into(into)?;
            }
        }
        backend.inner.pool = into;
        // An OOM that no release preceded though the recorded cache held memory to release:
        // PyTorch releases every cached segment before giving up unless a graph capture is
        // underway, so one was. Where nothing was releasable, no capture is read (the model then
        // releases nothing either, or `validate` says where it would). Read as a replay reads it.
        let events = self.events;
        let released =
            |j: &usize| matches!(events[*j].action, Action::SegmentFree | Action::SegmentUnmap);
        let captured = oom && self.captured_ooms.binary_search(&index).is_ok();
        debug_assert!(!captured || !script.iter().any(released), "event {i}");
        policy.set_capture_underway(captured);
        release_gone_pools(policy, self.routes.as_ref(), events, script, into)?;
        // A release run right before a malloc's new segment is either the malloc's own fallback
        // or an empty_cache() just before it: decided as a replay decides it.
        let releases = script.iter().take_while(|j| released(j)).count();
        let mut script = &script[..];
        if releases > 0 && self.undecided.called_before(index, &*policy) {
            backend.inner.follow(&script[..releases], false);
            policy.empty_cache(backend)?;
            compare_segments(events, &script[..releases], &backend.inner.log, i, &mut self.run);
            script = &script[releases..];
        }
        backend.inner.follow(script, oom);
        if self.exact.any() {
            self.exact.before(index, e, policy);
        }
        Ok(())
    }

    fn after_request<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        placed: Option<u64>,
        policy: &mut PyTorch,
        backend: &mut Observed<Guided<'a>, O>,
    ) -> Result<()> {
        let i = index as usize;
        let dev = &backend.inner;
        compare_segments(self.events, &dev.script, &dev.log, i, &mut self.run);
        if e.action == Action::Oom {
            if let Some(a) = placed {
                self.run.mismatches.push(Mismatch {
                    event: index,
                    action: Some(Action::Oom),
                    expected: "out of memory".into(),
                    got: hex(a),
                    why: "the simulation found memory where the real allocator did not".into(),
                });
            }
            return Ok(());
        }
        if self.exact.any() {
            self.exact.after(index, placed);
            if self.exact.is_placed(index) {
                // Placed by address: counted apart, never compared.
                self.run.exact_placed += 1;
                return Ok(());
            }
        }
        let run = &mut self.run;
        run.placed.push((i, placed));
        if placed != Some(e.addr) {
            let why = explain(policy, e.addr, placed, dev.pool.is_some());
            // Before this malloc, was the recorded address strictly inside a free block? Either
            // it still is, or the simulation carved its block from that one.
            if run.first_inside_free.is_none() {
                let inside = match policy.block_containing(e.addr) {
                    Some((s, _, false)) => s < e.addr,
                    Some((s, _, true)) => Some(s) == placed && s < e.addr,
                    None => false,
                };
                if inside {
                    run.first_inside_free = Some((i, e.addr));
                }
            }
            run.first_mismatch.get_or_insert((i, e.addr, placed));
            run.mismatches.push(Mismatch {
                event: index,
                action: Some(Action::Alloc),
                expected: hex(e.addr),
                got: placed.map_or_else(|| "out of memory".into(), hex),
                why,
            });
        }
        self.stopped = match self.stop {
            Stop::Never => false,
            Stop::FirstMismatch => run.first_mismatch.is_some(),
            Stop::Diverge(reference) => {
                let base = reference.get(self.ref_pos).map(|&(_, a)| a);
                self.ref_pos += 1;
                base != Some(placed) || placed != Some(e.addr)
            }
        };
        Ok(())
    }

    fn segment_event<O: Observer>(
        &mut self,
        index: u64,
        e: &Event,
        policy: &mut PyTorch,
        backend: &mut Observed<Guided<'a>, O>,
    ) -> Result<bool> {
        if let Some(r) = &mut self.routes {
            r.follow(e);
        }
        let i = index as usize;
        let Some(Op::Flush { script }) = self.ops.get(i) else { return Ok(false) };
        release_gone_pools(policy, self.routes.as_ref(), self.events, script, None)?;
        backend.inner.begin(i);
        backend.inner.follow(script, false);
        policy.empty_cache(backend)?;
        compare_segments(self.events, script, &backend.inner.log, i, &mut self.run);
        Ok(true)
    }

    fn unheld_free(&mut self, index: u64, e: &Event) {
        self.run.mismatches.push(Mismatch {
            event: index,
            action: Some(e.action),
            expected: hex(e.addr),
            got: "no live block there".into(),
            why: "the start state lacks this block (its segment is unknown)".into(),
        });
    }

    fn stopped(&self) -> bool {
        self.stopped
    }

    fn doing(_: &str, index: u64, count: u64) -> String {
        format!("validating at event {index} of {count}")
    }
}

/// Compares the simulated segment events of one operation with the recorded ones.
fn compare_segments(events: &[Event], script: &[usize], log: &[Event], at: usize, run: &mut Run) {
    let n = script.len().max(log.len());
    for k in 0..n {
        let rec = script.get(k).map(|&j| (j, &events[j]));
        let sim = log.get(k);
        let same = matches!((rec, sim), (Some((_, r)), Some(s))
            if r.action == s.action && r.size == s.size && r.addr == s.addr);
        if same {
            run.segment_events_matched += 1;
            continue;
        }
        let show = |e: &Event| format!("{} {:#x} {}", e.action.name(), e.addr, e.size);
        run.mismatches.push(Mismatch {
            event: rec.map_or(at, |(j, _)| j) as u64,
            action: rec.map(|(_, r)| r.action).or(sim.map(|s| s.action)),
            expected: rec.map_or_else(|| "nothing".into(), |(_, r)| show(r)),
            got: sim.map_or_else(|| "nothing".into(), show),
            why: "the simulated allocator obtained or released different memory here".into(),
        });
    }
}
