//! What a Kineto trace's run held before its first `[memory]` event.
//!
//! The profiler starts mid-run: tensors allocated before profiling began are live but never
//! appear as allocations. Each `[memory]` event records the allocator's totals after it, so the
//! first event's `Total Allocated` minus its own `Bytes` is what was live before the trace, and
//! its `Total Reserved` (a single event cannot change reserved memory by more than its own
//! segment) is what was already reserved. A replay that ignores them compares policies on a
//! fraction of the real run; [`start_state`] recovers them, [`opaque_live_block`] turns the part
//! no event frees into a block every policy must carry, and [`StartState::warnings`] lists every
//! event where `live + running sum of Bytes` disagrees with the recorded `Total Allocated`.

use crate::trace::lifetimes::{orphan_frees, LiveBlock};
use crate::trace::{Action, Trace};

/// The memory a Kineto trace's device held before its first event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartState {
    /// Bytes live before the first event: its `Total Allocated` minus its own `Bytes`.
    pub live_bytes: u64,
    /// Bytes reserved before the first event, as its `Total Reserved` records it.
    pub reserved_bytes: u64,
    /// The part of `live_bytes` that no event frees (blocks freed inside the trace are orphan
    /// frees, which the replay already carries as live-at-start blocks).
    pub opaque_bytes: u64,
    /// Events (by index) where `live_bytes` plus the running sum of `Bytes` is not the recorded
    /// `Total Allocated`, one line each, naming the event and both values.
    pub warnings: Vec<String>,
    /// How many events disagree (`warnings` lists at most [`MAX_WARNINGS`]).
    pub mismatches: u64,
}

/// The most mismatching events [`StartState::warnings`] lists one by one.
pub const MAX_WARNINGS: usize = 20;

/// The start state of `device`, or `None` when the trace has no recorded totals for it (not a
/// Kineto trace, or one whose events lack `Total Allocated` / `Total Reserved`) or no events.
pub fn start_state(trace: &Trace, device: i32) -> Option<StartState> {
    let totals = trace.totals_of(device)?;
    let events = &trace.device(device)?.events;
    let (first, first_totals) = (events.first()?, totals.first()?);
    let signed = |e: &crate::trace::Event| match e.action {
        Action::Alloc => e.size as i128,
        Action::FreeCompleted | Action::FreeRequested => -(e.size as i128),
        _ => 0,
    };
    let live = first_totals.allocated as i128 - signed(first);
    let mut warnings = Vec::new();
    if live < 0 {
        warnings.push(format!(
            "device {device}: event 0: Total Allocated {} is less than its own Bytes {}: \
             nothing can have been live before the trace",
            first_totals.allocated,
            signed(first)
        ));
    }
    let live_bytes = live.max(0) as u64;
    let mut running = live_bytes as i128;
    let mut mismatches = 0u64;
    for (i, (e, t)) in events.iter().zip(totals).enumerate() {
        running += signed(e);
        if running != t.allocated as i128 {
            mismatches += 1;
            if warnings.len() < MAX_WARNINGS {
                warnings.push(format!(
                    "device {device}: event {i}: live at start plus the running sum of Bytes is \
                     {running} B but the recorded Total Allocated is {} B",
                    t.allocated
                ));
            }
            // Follow the recording from here, so one lost event is reported once.
            running = t.allocated as i128;
        }
    }
    if mismatches as usize > MAX_WARNINGS {
        warnings.push(format!(
            "device {device}: {} more events disagree with Total Allocated",
            mismatches as usize - MAX_WARNINGS
        ));
    }
    let orphaned: u64 = orphan_frees(events).iter().map(|b| b.size).sum();
    Some(StartState {
        live_bytes,
        reserved_bytes: first_totals.reserved,
        opaque_bytes: live_bytes.saturating_sub(orphaned),
        warnings,
        mismatches,
    })
}

/// The memory live before a Kineto trace that no event frees, as one block every policy must
/// carry, or `None` when there is none. Its address is one no event of `device` uses (512-byte
/// aligned, below the lowest recorded address where possible), so no free can release it.
///
/// The replay engine's live-at-start list (`crate::trace::lifetimes::live_at_start`) holds the orphan
/// frees; appending this block to it makes a Kineto replay start where the profiled run was.
pub fn opaque_live_block(trace: &Trace, device: i32) -> Option<LiveBlock> {
    let start = start_state(trace, device)?;
    if start.opaque_bytes == 0 {
        return None;
    }
    let events = &trace.device(device)?.events;
    let used: std::collections::HashSet<u64> = events.iter().map(|e| e.addr).collect();
    let lowest = events.iter().map(|e| e.addr).min().unwrap_or(0);
    let addr = (0..)
        .map(|k: u64| (lowest & !511).wrapping_sub((k + 1) * 512))
        .take(1024)
        .find(|a| !used.contains(a))?;
    Some(LiveBlock { addr, size: start.opaque_bytes, stream: 0, freed_in_trace: false })
}
