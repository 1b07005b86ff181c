//! How the engine finds the policy's block for a recorded address: the slots of loaded events,
//! or a map of the live blocks when events stream.

use super::input::{Reader, ReplayInput, Slots, Source, Streamed};
use crate::error::Cancel;
use crate::error::Result;
use crate::policy::{Allocation, Handle};
use crate::trace::lifetimes::{AddrMap, LiveBlock};
use crate::trace::Event;

/// How the engine finds the policy's block for a recorded address: by the precomputed slots of
/// loaded events ([`Indexed`]), or in a map of the live blocks when the events stream
/// ([`Keyed`]). Both give the same answers; a block is the policy's address and the request size.
pub(super) trait Blocks {
    /// Where [`Blocks::walk`] reads the events: a lookup is built from its source, so that it is
    /// never handed events it was not built for.
    type Walk: Copy;

    /// True when [`Blocks::walk`] hands `f` every event, numbered from 0, from a reader's own
    /// loop, and does not call its `check`: the engine's closure then looks at the flag every
    /// [`Cancel::EVERY`]th event.
    const HANDS_EVERY_EVENT: bool;

    /// Hands `f` the first `limit` events of `source` ([`Blocks::source`]) in order with their
    /// index: from memory, or from the file when they stream. A method of the lookup so that each build of the
    /// engine walks one way only: a closure handed on to the file's reader escapes, and then
    /// every flag it reads is read from memory again after each policy call.
    ///
    /// Each event comes with its [`Slots`] slot and flag ([`Slots::NONE`] where this lookup
    /// keeps none). With `every` false, the walk may leave out events that the engine never
    /// acts on (see [`Slots::acts_on`]), as a plain replay does.
    ///
    /// The walk calls `check` with the index of the next event every [`Cancel::EVERY`] events,
    /// between chunks of that many, so the loop that calls `f` is the same as without it (the
    /// engine's `check` looks at the cancel flag); a walk that hands every event to `f` from a
    /// file's reader leaves that to `f` ([`Blocks::HANDS_EVERY_EVENT`]).
    fn walk(
        source: Self::Walk,
        limit: u64,
        every: bool,
        check: impl Fn(u64) -> Result<()>,
        f: impl FnMut(u64, &Event, u32) -> Result<()>,
    ) -> Result<()>;
    /// Where this lookup's events come from, for [`Blocks::walk`].
    fn source(&self) -> Self::Walk;
    /// Live-at-start block `k` was placed as `placed` (`None`: it did not fit).
    fn started(&mut self, k: usize, block: &LiveBlock, placed: Option<Allocation>);
    /// Alloc event `e`, of slot `slot`, reuses the address of a block the replay still holds
    /// (its free was not recorded): takes that block, if any.
    fn displaced(&mut self, slot: u32, e: &Event) -> Option<Held>;
    /// Alloc event `e`, of slot `slot`, was placed as `placed`.
    fn allocated(&mut self, slot: u32, e: &Event, placed: Allocation);
    /// Alloc event `e`, of slot `slot`, failed (out of memory): its free finds
    /// [`Freed::Never`].
    fn failed(&mut self, slot: u32, e: &Event);
    /// Free event `e`, of slot `slot`: the block it frees, [`Freed::Never`] when its alloc
    /// failed, or [`Freed::Orphan`] when the replay never allocated the address.
    fn freed(&mut self, slot: u32, e: &Event) -> Freed;
}

/// What a free finds ([`Blocks::freed`]).
pub(super) enum Freed {
    /// The policy's block.
    Block(Held),
    /// The block's alloc failed under `--capacity`: the block never existed.
    Never,
    /// No alloc or live-at-start block had the address.
    Orphan,
}

/// A block the replay holds: the policy's address and handle for it, and the request size.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) addr: u64,
    pub(super) request: u64,
    pub(super) handle: Handle,
}

impl Held {
    /// No block: never allocated, its alloc failed, or freed.
    const EMPTY: Held = Held { addr: u64::MAX, request: 0, handle: Handle::NONE };

    /// The block `placed` for a request of `request` bytes; [`Held::EMPTY`] when it failed.
    fn of(placed: Option<Allocation>, request: u64) -> Held {
        placed.map_or(Held::EMPTY, |a| Held::placed(a, request))
    }

    /// The block `a` for a request of `request` bytes.
    #[inline]
    fn placed(a: Allocation, request: u64) -> Held {
        Held { addr: a.addr, request, handle: a.handle }
    }

    fn is_empty(&self) -> bool {
        self.addr == u64::MAX
    }
}

/// [`Blocks`] of loaded events: per [`Slots`] slot, the block there ([`Held::EMPTY`] when none
/// is live).
pub(super) struct Indexed<'r> {
    table: Vec<Held>,
    events: &'r [Event],
    slots: &'r Slots,
}

impl<'r> Indexed<'r> {
    /// The table for `events` and their `slots`, every slot empty.
    pub(super) fn new(events: &'r [Event], slots: &'r Slots) -> Indexed<'r> {
        Indexed { table: vec![Held::EMPTY; slots.count], events, slots }
    }

    /// Empties slot `slot` (no flag): what it held.
    #[inline]
    fn take(&mut self, slot: u32) -> Option<Held> {
        let entry = self.table.get_mut(slot as usize)?;
        let held = *entry;
        entry.addr = Held::EMPTY.addr; // empty: `Held::is_empty` reads the address alone
        Some(held)
    }
}

/// The first `limit` of `events` (all of them when there are fewer).
#[inline(always)]
fn first_events(events: &[Event], limit: u64) -> &[Event] {
    &events[..usize::try_from(limit).unwrap_or(usize::MAX).min(events.len())]
}

/// The first `limit` of `events`, with their index.
#[inline(always)]
fn walk_loaded(
    events: &[Event],
    limit: u64,
    mut f: impl FnMut(u64, &Event) -> Result<()>,
) -> Result<()> {
    for (i, e) in first_events(events, limit).iter().enumerate() {
        f(i as u64, e)?;
    }
    Ok(())
}

impl<'a> Blocks for Indexed<'a> {
    type Walk = (&'a [Event], &'a Slots);
    const HANDS_EVERY_EVENT: bool = false;

    #[inline(always)]
    fn walk(
        (events, slots): Self::Walk,
        limit: u64,
        every: bool,
        check: impl Fn(u64) -> Result<()>,
        mut f: impl FnMut(u64, &Event, u32) -> Result<()>,
    ) -> Result<()> {
        let events = first_events(events, limit);
        let ops = &slots.ops;
        if !every {
            for chunk in ops.chunks(Cancel::EVERY) {
                check(chunk[0].event as u64)?;
                for op in chunk {
                    // In event order: past the limit, so are the rest.
                    let Some(e) = events.get(op.event as usize) else { return Ok(()) };
                    f(op.event as u64, e, op.slot)?;
                }
            }
            return Ok(());
        }
        let mut ops = ops.iter().peekable();
        for (c, chunk) in events.chunks(Cancel::EVERY).enumerate() {
            let first = c * Cancel::EVERY;
            check(first as u64)?;
            for (i, e) in chunk.iter().enumerate() {
                let i = first + i;
                let slot = match ops.next_if(|op| op.event as usize == i) {
                    Some(op) => op.slot,
                    None => Slots::NONE,
                };
                f(i as u64, e, slot)?;
            }
        }
        Ok(())
    }
    fn source(&self) -> Self::Walk {
        (self.events, self.slots)
    }
    fn started(&mut self, k: usize, block: &LiveBlock, placed: Option<Allocation>) {
        if let Some(entry) = self.table.get_mut(k) {
            *entry = Held::of(placed, block.size);
        }
    }
    #[inline]
    fn displaced(&mut self, slot: u32, _: &Event) -> Option<Held> {
        match slot {
            s if s != Slots::NONE && s & Slots::DISPLACES != 0 => {
                self.take(s & !Slots::DISPLACES).filter(|b| !b.is_empty())
            }
            _ => None,
        }
    }
    #[inline]
    fn allocated(&mut self, slot: u32, e: &Event, placed: Allocation) {
        if let Some(entry) = self.table.get_mut((slot & !Slots::DISPLACES) as usize) {
            *entry = Held::placed(placed, e.size);
        }
    }
    #[inline]
    fn failed(&mut self, slot: u32, _: &Event) {
        if let Some(entry) = self.table.get_mut((slot & !Slots::DISPLACES) as usize) {
            *entry = Held::EMPTY;
        }
    }
    #[inline]
    fn freed(&mut self, slot: u32, _: &Event) -> Freed {
        match self.take(slot) {
            None => Freed::Orphan,
            Some(b) if b.is_empty() => Freed::Never,
            Some(b) => Freed::Block(b),
        }
    }
}

/// [`Blocks`] of streamed events: recorded address → the block the recording holds there
/// ([`Held::EMPTY`] for one whose alloc failed). Sized by the live blocks, not by the events.
pub(super) struct Keyed<'r, 'a> {
    live: AddrMap<Held>,
    input: &'r ReplayInput<'a>,
}

impl<'r, 'a> Keyed<'r, 'a> {
    /// The map for `input`'s events, empty.
    pub(super) fn new(input: &'r ReplayInput<'a>) -> Keyed<'r, 'a> {
        Keyed { live: AddrMap::default(), input }
    }
}

impl<'i, 'a> Blocks for Keyed<'i, 'a> {
    type Walk = &'i ReplayInput<'a>;
    const HANDS_EVERY_EVENT: bool = true;

    fn walk(
        input: Self::Walk,
        limit: u64,
        _every: bool,
        _check: impl Fn(u64) -> Result<()>,
        mut f: impl FnMut(u64, &Event, u32) -> Result<()>,
    ) -> Result<()> {
        let f = |i: u64, e: &Event| f(i, e, Slots::NONE);
        match input.source() {
            // The engine's closure looks at the flag itself ([`Blocks::HANDS_EVERY_EVENT`]):
            // wrapped in another closure, it would no longer be inlined into the reader's loop.
            Source::Streamed(Streamed { file, reader: Reader::Own, .. }) => {
                file.each_event(input.device(), limit, false, f)
            }
            Source::Streamed(Streamed { reader: Reader::Shared(feed), events, .. }) => {
                feed.each_event(limit.min(*events), f)
            }
            // Loaded events, looked up by address as if streamed.
            Source::Loaded { events, .. } => walk_loaded(events, limit, f),
        }
    }
    fn source(&self) -> Self::Walk {
        self.input
    }
    fn started(&mut self, _: usize, block: &LiveBlock, placed: Option<Allocation>) {
        self.live.insert(block.addr, Held::of(placed, block.size));
    }
    #[inline]
    fn displaced(&mut self, _: u32, e: &Event) -> Option<Held> {
        self.live.remove(&e.addr).filter(|b| !b.is_empty())
    }
    #[inline]
    fn allocated(&mut self, _: u32, e: &Event, placed: Allocation) {
        self.live.insert(e.addr, Held::placed(placed, e.size));
    }
    #[inline]
    fn failed(&mut self, _: u32, e: &Event) {
        self.live.insert(e.addr, Held::EMPTY);
    }
    #[inline]
    fn freed(&mut self, _: u32, e: &Event) -> Freed {
        match self.live.remove(&e.addr) {
            None => Freed::Orphan,
            Some(b) if b.is_empty() => Freed::Never,
            Some(b) => Freed::Block(b),
        }
    }
}
