//! The recorded run broken down: the real allocator's layout, read from a snapshot's own events
//! at their recorded addresses, never simulated.
//!
//! The segments held at the first event are the final segments with the trace's segment events
//! undone (walking back); from there every `segment_alloc` / `segment_map` adds memory, obtained
//! for the request whose stack PyTorch recorded with it, and every release removes it. Blocks
//! are the trace's allocations at their recorded addresses. A snapshot does not record block
//! sizes, so each block is taken as its request rounded up to 512 bytes (PyTorch's smallest
//! rounding): the recorded run's `rounding_bytes` are a lower bound, and what PyTorch really
//! rounded beyond that counts as cached free.

use super::observe::{Layout, Origin};
use crate::policy::Allocation;
use crate::replay::ReplayInput;
use crate::trace::{Action, Event, Format};

/// The smallest block PyTorch hands out, and the multiple every block size is.
const MIN_BLOCK: u64 = 512;

/// A request's block as the recorded run is taken to have held it.
fn block_of(request: u64) -> u64 {
    request.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

/// True when `input`'s trace records the real allocator's segments (a PyTorch snapshot).
pub(crate) fn available(input: &ReplayInput) -> bool {
    input.trace().source_format() == Format::PytorchSnapshot && !input.is_streamed()
}

/// The recorded layout right after event `stop` (`before_first`: at the first event, before it).
pub(crate) fn layout<'e>(input: &'e ReplayInput, stop: u64, before_first: bool) -> Layout<'e> {
    let events: &[Event] = super::events(input);
    let mut l = Layout::new(events, input.live_at_start());
    // The memory held at the first event: the final segments with the trace's segment events
    // undone, last first.
    for s in input.trace().segments_of(input.device()) {
        l.obtained_for(s.address, s.total_size, Origin::BeforeTrace);
    }
    for e in events.iter().rev() {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => l.returned(e.addr, e.size),
            Action::SegmentFree | Action::SegmentUnmap => {
                l.obtained_for(e.addr, e.size, Origin::BeforeTrace)
            }
            _ => {}
        }
    }
    for (k, b) in input.live_at_start().iter().enumerate() {
        l.placed(Allocation::new(b.addr, block_of(b.size)), b.size, Origin::Start(k as u32));
    }
    if before_first {
        return l;
    }
    let last = (stop as usize).min(events.len().saturating_sub(1));
    for (i, e) in events.iter().enumerate().take(last + 1) {
        match e.action {
            Action::Alloc if e.size > 0 => {
                l.freed(e.addr); // a block still held there was freed unrecorded
                l.placed(
                    Allocation::new(e.addr, block_of(e.size)),
                    e.size,
                    Origin::Event(i as u32),
                );
            }
            a if a == input.frees_at() => l.freed(e.addr),
            Action::SegmentAlloc | Action::SegmentMap => {
                l.obtained_for(e.addr, e.size, Origin::Event(i as u32))
            }
            Action::SegmentFree | Action::SegmentUnmap => l.returned(e.addr, e.size),
            _ => {}
        }
    }
    l
}
