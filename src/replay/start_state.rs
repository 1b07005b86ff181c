//! Blocks that were live before a trace began.
//!
//! Most snapshots start mid-run (the ring buffer, or recording enabled late): blocks allocated
//! before the first event show up only as frees (orphan frees) or as `active_allocated` blocks in
//! the final segments that no `alloc` event produced. A fair what-if replay must hold them too,
//! or every policy looks better than it could be. This module finds them; the PyTorch policy's
//! exact recovery of the whole allocator state (spec §14.7) builds on it.

use crate::trace::{Action, BlockState, Event, Trace};
use std::collections::HashSet;

/// A block live at the first event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// The address the recording knows it by.
    pub addr: u64,
    /// The request size, as far as known (the free's size, or the final block's requested size).
    pub size: u64,
    /// The allocation stream.
    pub stream: u64,
    /// True when the block is freed inside the trace (an orphan free); false when it lives on
    /// to the end (it appears only in the final segments).
    pub freed_in_trace: bool,
}

/// The blocks live at the first of `events`, in address order: orphan frees, and blocks that
/// the final segments of `device` show allocated but that no event allocated.
pub fn live_at_start(trace: &Trace, device: i32, events: &[Event]) -> Vec<LiveBlock> {
    let (mut out, touched) = scan_orphans(events);
    for seg in trace.segments_of(device) {
        for b in &seg.blocks {
            let live =
                matches!(b.state, BlockState::ActiveAllocated | BlockState::ActivePendingFree);
            if live && !touched.contains(&b.address) {
                out.push(LiveBlock {
                    addr: b.address,
                    size: b.requested_size.max(1),
                    stream: seg.stream,
                    freed_in_trace: false,
                });
            }
        }
    }
    out.sort_by_key(|b| b.addr);
    out
}

/// The blocks live at the first of `events` that the events alone show: frees of addresses
/// with no earlier alloc (orphan frees), in address order. [`live_at_start`] adds those that
/// only a snapshot's final segments show.
pub fn orphan_frees(events: &[Event]) -> Vec<LiveBlock> {
    let (mut out, _) = scan_orphans(events);
    out.sort_by_key(|b| b.addr);
    out
}

/// The orphan frees of `events` in trace order, and every address the events touch.
fn scan_orphans(events: &[Event]) -> (Vec<LiveBlock>, HashSet<u64>) {
    let frees_at = free_action(events);
    let mut seen_alloc = HashSet::new();
    let mut touched = HashSet::new();
    let mut out = Vec::new();
    for e in events {
        match e.action {
            Action::Alloc => {
                seen_alloc.insert(e.addr);
                touched.insert(e.addr);
            }
            a if a == frees_at && !seen_alloc.remove(&e.addr) && touched.insert(e.addr) => {
                out.push(LiveBlock {
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    freed_in_trace: true,
                });
            }
            _ => {}
        }
    }
    (out, touched)
}

/// The action at which a free takes effect in `events`: `free_completed` when the trace has
/// any (PyTorch snapshots), else `free_requested` (traces that record one kind of free).
pub fn free_action(events: &[Event]) -> Action {
    if events.iter().any(|e| e.action == Action::FreeCompleted) {
        Action::FreeCompleted
    } else {
        Action::FreeRequested
    }
}

/// For each event, true where the recorded program released cached memory on its own: a run of
/// `segment_free` / `segment_unmap` that is not part of a malloc's fallback, i.e. not followed
/// (after any `free_completed`) by a `segment_alloc`, `segment_map` or `oom` of the same malloc.
/// Spec §19.4: such runs are `empty_cache()` calls. Only the first event of each run is marked.
pub fn empty_cache_points(events: &[Event]) -> Vec<bool> {
    let mut marks = vec![false; events.len()];
    let mut i = 0;
    while i < events.len() {
        if !matches!(events[i].action, Action::SegmentFree | Action::SegmentUnmap) {
            i += 1;
            continue;
        }
        let start = i;
        while i < events.len()
            && matches!(
                events[i].action,
                Action::SegmentFree | Action::SegmentUnmap | Action::FreeCompleted
            )
        {
            i += 1;
        }
        let part_of_malloc = events.get(i).is_some_and(|e| {
            matches!(e.action, Action::SegmentAlloc | Action::SegmentMap | Action::Oom)
        });
        if !part_of_malloc {
            marks[start] = true;
        }
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{text, ReadOptions};

    fn events(src: &str) -> (Trace, Vec<Event>) {
        let t = text::read(src.as_bytes(), &ReadOptions::default()).unwrap();
        let e = t.devices[0].events.clone();
        (t, e)
    }

    #[test]
    fn orphan_frees_are_live_at_start() {
        let (t, e) = events("alloc 0x100 10 s0\nfree 0x100 10 s0\nfree 0x300 30 s1\nalloc 0x300 5 s0\nfree 0x300 5 s0\n");
        let live = live_at_start(&t, 0, &e);
        assert_eq!(
            live,
            vec![LiveBlock { addr: 0x300, size: 30, stream: 1, freed_in_trace: true }]
        );
    }

    #[test]
    fn flush_runs_outside_a_malloc_are_empty_cache_calls() {
        let (_, e) = events(
            "segment_free 0x0 2097152\nsegment_free 0x200000 2097152\nalloc 0x0 8\n\
             segment_free 0x400000 2097152\nsegment_alloc 0x800000 20971520\nalloc 0x800000 4096\n",
        );
        assert_eq!(empty_cache_points(&e), vec![true, false, false, false, false, false]);
    }
}
