//! `fragsim validate`: replays a PyTorch snapshot through the [`PyTorch`] policy from the
//! recovered start state and compares every decision with what the real allocator recorded.
//!
//! The replay is the engine's (`replay::run_guided`): the same loop as every replay, on a device that
//! follows the recording (`Guided`), with a guide that compares (`Checker`).
//!
//! See docs/pytorch-model.md#validation. The recording supplies what a snapshot cannot know, and
//! nothing else: a new segment takes the address recorded for it within the same malloc; a
//! `cudaMalloc` or page map succeeds exactly when the recording shows it did (a recorded release
//! after it, or an `oom`, means it failed); a recorded run of `segment_free` outside a malloc is an
//! `empty_cache()` that the simulated allocator performs itself. Compared: every `alloc` address,
//! every segment event (kind, size, address, in order), the peak of the reserved curve
//! (docs/pytorch-model.md#reserved-curve) from the start state's reserved bytes, and the final
//! layout against the snapshot's `segments` (docs/pytorch-model.md#validation-checks).
//!
//! Start-state guesses (docs/pytorch-model.md#snapshot-start-state): a mismatch that a longer
//! ambiguous orphan explains extends that orphan — to the recorded address when it lies inside the
//! free block after it (docs/pytorch-model.md#orphan-growth), or to the smallest feasible size that
//! reproduces every placement so far — and replays again. Then each remaining ambiguous orphan is
//! tried at its longest feasible size; the first decision where that start state — agreeing with
//! every recorded decision before — places a block elsewhere is *undeterminable*: counted apart,
//! never as matched.

mod checker;
mod guided;
#[cfg(test)]
mod tests;
mod warnings;

pub use checker::planned_empty_cache_calls;
pub use warnings::Warning;

use crate::error::{Error, Result};
use crate::policy::pytorch::config::{self, Config, Flavour, ModelledVersion, Version};
use crate::policy::pytorch::start::{self, StartState};
use crate::policy::pytorch::NAME;
use crate::policy::pytorch::{expandable, PyTorch};
use crate::replay::{run_guided, Cancel, ReplayInput, ReplayOptions, ReplayOutput};
use crate::trace::{Action, Event, Segment, Trace};
use checker::{hex, Checker, Op, Run, Stop};
use guided::Guided;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Sets `config.gpu_memory` from the recording's expandable layout
/// (docs/pytorch-model.md#expandable-va-size: it fixes every reservation's VA size and is recorded
/// nowhere) and says what was inferred, from which pages, or why it could not be; `None` when the
/// recording maps no expandable pages.
fn infer_gpu_memory(events: &[Event], start: &StartState, config: &mut Config) -> Option<Warning> {
    let fit = expandable::recorded_gpu_memory_fit(events, start, config)?;
    let fraction = config.per_process_memory_fraction.is_some();
    config.gpu_memory = fit.modelled(config.gpu_memory);
    let assumed = config.gpu_memory;
    Some(match (fit.inferred(), fit.max, fit.evidence) {
        (Some(bytes), _, Some((reservation, next))) => {
            Warning::InferredGpuMemory { bytes, min: fit.min, reservation, next, fraction }
        }
        (None, Some(max), _) => Warning::GpuMemoryConflict { min: fit.min, max, assumed },
        _ => Warning::GpuMemoryUnbounded { min: fit.min, assumed, fraction },
    })
}

/// How to validate.
#[derive(Clone, Debug, Default)]
pub struct ValidateOptions {
    /// The device (default: the one with the most events).
    pub device: Option<i32>,
    /// The GPU's total memory (`--gpu-mem`): the memory fraction's and the expandable
    /// reservation's base. Default: inferred from the expandable layout, else 80 GiB.
    pub gpu_memory: Option<u64>,
    /// The PyTorch version to model (`--pytorch-version`); default: current main.
    pub version: Option<Version>,
    /// Keep the simulated run as events (for `--export-snapshot`).
    pub record_events: bool,
    /// Check the policy's invariants after every event (slow; tests and debugging).
    pub check_invariants: bool,
    /// Whose allocator rules to replay (`-p pytorch-cuda` / `pytorch-npu`); default: those of
    /// the allocator that made the recording (`Flavour::of_trace`).
    pub flavour: Option<Flavour>,
    /// Raised to abandon the validation (Ctrl-C in Python): every replay it runs looks at it
    /// every [`Cancel::EVERY`] events and stops with an error naming the event it reached.
    pub cancel: Cancel,
}

/// One decision the simulation made differently from the recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// Index of the recorded event.
    pub event: u64,
    /// Its action, or `None` for the final segment layout (compared after the last event). JSON
    /// spells it as [`Mismatch::action_name`] does.
    #[serde(serialize_with = "serialize_action")]
    pub action: Option<Action>,
    /// What the recording shows.
    pub expected: String,
    /// What the simulation did.
    pub got: String,
    /// The likely cause.
    pub why: String,
}

/// The outcome of validating one device of a snapshot. Field names are `validate --json` keys.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Validation {
    /// The trace's path (set by the caller).
    pub trace: String,
    /// The device validated.
    pub device: i32,
    /// Recorded `alloc` events.
    pub allocs_total: u64,
    /// Allocs the simulation placed at the recorded address (undeterminable ones excluded).
    pub allocs_addr_matched: u64,
    /// Allocs of exact-address allocations (`mallocWithAddress`, PyTorch 2.13+: the prefix and
    /// the request), placed at the recorded address and counted apart: neither in
    /// `allocs_addr_matched` nor ever a mismatch (no placement rule chose their address).
    /// A JSON key only where the recording has any.
    #[serde(skip_serializing_if = "is_zero")]
    pub allocs_exact_address: u64,
    /// Recorded segment events (`segment_alloc/free/map/unmap`).
    pub segment_events_recorded: u64,
    /// Recorded segment events the simulation reproduced (kind, size, address, order).
    pub segment_events_matched: u64,
    /// Peak of the recorded reserved curve, from the start state's reserved bytes.
    pub peak_reserved_recorded_bytes: u64,
    /// Peak reserved bytes of the simulation.
    pub peak_reserved_simulated_bytes: u64,
    /// Decisions that depend on a start-state guess (docs/pytorch-model.md#undeterminable).
    pub undeterminable_events: u64,
    /// Every unexplained difference.
    pub mismatches: Vec<Mismatch>,
    /// The undeterminable decisions and why (shown with `--verbose`).
    #[serde(skip)]
    pub undeterminable: Vec<Mismatch>,
    /// What the validation assumed (version choices, learned orphan sizes, ...).
    #[serde(skip)]
    pub notes: Vec<Warning>,
    /// The settings replayed, in `PYTORCH_CUDA_ALLOC_CONF` syntax.
    #[serde(skip)]
    pub config: String,
    /// The simulated run, as a `pytorch` replay's output (for `--export-snapshot`; its events
    /// only when [`ValidateOptions::record_events`] asked for them).
    #[serde(skip)]
    pub output: ReplayOutput,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Mismatch {
    /// The action as PyTorch spells it (`alloc`, `oom`, ...), or `segments` for the final layout.
    pub fn action_name(&self) -> &'static str {
        action_name(self.action)
    }
}

/// `action`'s PyTorch name, `segments` for none (the final layout).
fn action_name(action: Option<Action>) -> &'static str {
    action.map_or("segments", Action::name)
}

fn serialize_action<S: serde::Serializer>(
    action: &Option<Action>,
    out: S,
) -> std::result::Result<S::Ok, S::Error> {
    out.serialize_str(action_name(*action))
}

/// The recording as validation replays it: the events of one device, what happens at each
/// ([`plan`]), and the same events prepared for the replay engine.
struct Recording<'a> {
    events: &'a [Event],
    ops: Vec<Op>,
    input: ReplayInput<'a>,
}

/// How to run one replay of a [`Recording`].
#[derive(Clone, Copy)]
struct RunOptions<'a> {
    stop: Stop<'a>,
    /// Replay events up to this index (inclusive) only.
    upto: Option<usize>,
    /// Keep the simulated run as events.
    record: bool,
    /// Check the policy's invariants after every event.
    check: bool,
    cancel: &'a Cancel,
}

impl<'a> RunOptions<'a> {
    fn new(stop: Stop<'a>, cancel: &'a Cancel) -> RunOptions<'a> {
        RunOptions { stop, upto: None, record: false, check: false, cancel }
    }
}

/// Replays `recording` from `start` under `config`: the replay engine, on a device that follows
/// the recording ([`Guided`]), with a guide that compares every decision ([`Checker`]).
fn replay(
    recording: &Recording,
    start: &StartState,
    config: &Config,
    how: RunOptions,
) -> Result<Run> {
    let events = match how.upto {
        Some(k) => &recording.events[..(k + 1).min(recording.events.len())],
        None => recording.events,
    };
    let mut checker = Checker {
        events: recording.events,
        ops: &recording.ops,
        captured_ooms: recording.input.captured_ooms(),
        routes: start.routes.clone(),
        exact: crate::replay::ExactPlacer::new(recording.input.exact_addresses()),
        undecided: crate::replay::Undecided::new(&recording.input),
        stop: how.stop,
        ref_pos: 0,
        run: Run::default(),
        stopped: false,
    };
    let options = ReplayOptions {
        stop_after: how.upto.map(|k| k as u64),
        record_events: how.record,
        check_invariants: how.check,
        cancel: how.cancel.clone(),
        ..ReplayOptions::default()
    };
    let policy = PyTorch::new(config.clone()).starting_from(start.clone());
    let device = Guided::new(events, start);
    let output = run_guided(NAME, policy, device, &mut checker, &recording.input, &options)
        .map_err(|e| match e.kind() {
            crate::error::ErrorKind::Input if how.check => {
                Error::input(format!("the pytorch policy broke an invariant: {e}"))
            }
            _ => e,
        })?;
    let mut run = checker.run;
    run.output = output;
    Ok(run)
}

/// The orphan-growth rule (docs/pytorch-model.md#orphan-growth) generalised: the smallest longer
/// size of one ambiguous orphan, near the recorded or the simulated address, that makes every
/// placement up to event `k` match the recording.
fn longer_orphan(
    recording: &Recording,
    start: &StartState,
    config: &Config,
    k: usize,
    (recorded, simulated): (u64, Option<u64>),
    cancel: &Cancel,
) -> Result<Option<(u64, u64)>> {
    let mut candidates = start.ambiguous_near(recorded);
    if let Some(s) = simulated {
        candidates.extend(start.ambiguous_near(s));
    }
    candidates.sort_unstable();
    candidates.dedup();
    let passes = |o: u64, size: u64| -> Result<bool> {
        let v = start.with_size(o, size);
        let how = RunOptions { upto: Some(k), ..RunOptions::new(Stop::FirstMismatch, cancel) };
        Ok(replay(recording, &v, config, how)?.first_mismatch.is_none())
    };
    for o in candidates {
        let Some(b) = start.orphan(o) else { continue };
        let (mut lo, mut hi) = (b.size, b.max_size); // lo fails, hi is tested next
        if !passes(o, hi)? {
            continue;
        }
        while hi - lo > config::MIN_BLOCK_SIZE {
            let mid = lo + (hi - lo) / 2 / config::MIN_BLOCK_SIZE * config::MIN_BLOCK_SIZE;
            let mid = mid.max(lo + config::MIN_BLOCK_SIZE);
            if passes(o, mid)? {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        return Ok(Some((o, hi)));
    }
    Ok(None)
}

/// The simulated layout at the end must equal the snapshot's final `segments` (addresses,
/// sizes and states of every block). Reported as one mismatch at the event after the last.
fn compare_final_segments(
    trace: &Trace,
    device: i32,
    simulated_segments: &[Segment],
    at: usize,
) -> Option<Mismatch> {
    let layout = |segs: &mut dyn Iterator<Item = &crate::trace::Segment>| {
        let mut v: Vec<(u64, u64, u64, bool)> = segs
            .flat_map(|s| {
                s.blocks.iter().map(|b| {
                    let live = !matches!(b.state, crate::trace::BlockState::Inactive);
                    (s.address, b.address, b.size, live)
                })
            })
            .collect();
        v.sort_unstable();
        v
    };
    let recorded = layout(&mut trace.segments_of(device));
    let simulated = layout(&mut simulated_segments.iter());
    if recorded == simulated {
        return None;
    }
    let first = recorded.iter().zip(&simulated).position(|(r, s)| r != s);
    let show = |b: Option<&(u64, u64, u64, bool)>| {
        b.map_or_else(
            || "nothing".to_string(),
            |&(seg, a, size, live)| {
                format!(
                    "block {a:#x}+{size} {} in segment {seg:#x}",
                    if live { "live" } else { "free" }
                )
            },
        )
    };
    let k = first.unwrap_or(recorded.len().min(simulated.len()));
    Some(Mismatch {
        event: at as u64,
        action: None,
        expected: show(recorded.get(k)),
        got: show(simulated.get(k)),
        why: format!(
            "the final layout differs ({} recorded blocks, {} simulated)",
            recorded.len(),
            simulated.len()
        ),
    })
}

/// The recorded reserved curve's peak (docs/pytorch-model.md#reserved-curve), from `start` bytes.
fn recorded_peak(events: &[Event], start: u64) -> u64 {
    let mut cur = start;
    let mut peak = start;
    for e in events {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => cur = cur.saturating_add(e.size),
            Action::SegmentFree | Action::SegmentUnmap => cur = cur.saturating_sub(e.size),
            _ => {}
        }
        peak = peak.max(cur);
    }
    peak
}

/// Refuses a trace with no allocator decisions to check: a snapshot records them, and so does a
/// .fst written from one (whatever its events: a warm snapshot may hold no segment events) or a
/// text trace written from one that keeps its segment events; anything else (Kineto,
/// RMM, a bare alloc/free list) has nothing to validate against: a usage error naming `name`.
pub fn needs_decisions(name: &std::path::Path, trace: &Trace) -> Result<()> {
    let segment_events = trace.devices.iter().flat_map(|d| &d.events).any(|e| {
        use Action::*;
        matches!(e.action, SegmentAlloc | SegmentFree | SegmentMap | SegmentUnmap)
    });
    if trace.source_format() != crate::trace::Format::PytorchSnapshot && !segment_events {
        return Err(Error::usage(format!(
            "{}: validate needs a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot), \
             not a {} trace: only a snapshot records the allocator's own decisions",
            name.display(),
            trace.format.name()
        )));
    }
    Ok(())
}

/// Validates one device of `trace`; see the module docs.
pub fn validate(trace: &Trace, options: &ValidateOptions) -> Result<Validation> {
    let device = match options.device {
        Some(d) => d,
        None => trace.default_device().ok_or_else(|| {
            Error::input("the trace has no events").at(crate::error::Place::Event(0))
        })?,
    };
    let events = &trace
        .device(device)
        .ok_or_else(|| Error::usage(format!("the trace has no device {device}")))?
        .events;
    let mut notes = Vec::new();
    let recorded_by = Flavour::of_trace(trace);
    let mut config = configure(trace, device, events, options, recorded_by, &mut notes)?;
    warnings::pool_notes(trace, device, events, &mut notes);
    let input = ReplayInput::of_events(trace, device, events)?;
    let ops = checker::plan_recording(events, trace, &input, recorded_by.pad());
    let mut start = StartState::recover(trace, device, events, &config);
    if options.gpu_memory.is_none() {
        start = gpu_memory_from_recording(trace, device, events, &mut config, start, &mut notes);
    }
    let recording = Recording { events, ops, input };
    let cancel = &options.cancel;
    let learned = learn_orphan_sizes(&recording, &mut start, &config, cancel)?;
    let how = RunOptions {
        record: options.record_events,
        check: options.check_invariants,
        ..RunOptions::new(Stop::Never, cancel)
    };
    let base = replay(&recording, &start, &config, how)?;
    // Each orphan's last lower bound, in the order learned.
    let last = |o: u64| learned.iter().rposition(|l| l.0 == o);
    let shown: Vec<_> = learned.iter().enumerate().filter(|(i, l)| last(l.0) == Some(*i)).collect();
    for (_, (o, size, k)) in shown {
        notes.push(Warning::LearnedOrphanSize { addr: *o, size: *size, event: *k as u64 });
    }
    let undeterminable = undeterminable(&recording, &start, &config, &base, cancel)?;
    for a in &start.unplaced {
        notes.push(Warning::UnplacedOrphanFree { addr: *a });
    }
    let peak_rec = recorded_peak(events, start.reserved());
    Ok(summarise(trace, device, events, base, undeterminable, peak_rec, notes, options))
}

/// The model's settings for `trace`'s device: the recorded settings under the version and
/// allocator rules asked for (or recorded), the memory the recording shows, and notes saying
/// what was assumed.
fn configure(
    trace: &Trace,
    device: i32,
    events: &[Event],
    options: &ValidateOptions,
    recorded_by: Flavour,
    notes: &mut Vec<Warning>,
) -> Result<Config> {
    let modelled = match options.version {
        Some(v) => ModelledVersion::given(v),
        None => ModelledVersion::of_trace(trace),
    };
    let version = modelled.version;
    let flavour = options.flavour.unwrap_or(recorded_by);
    if flavour == Flavour::Npu || recorded_by == Flavour::Npu {
        notes.push(Warning::AllocatorRules { flavour, recorded_by });
    }
    let mut config = match &trace.allocator_settings {
        Some(s) => {
            let names = Config::unmodelled_options_as(s, flavour);
            if !names.is_empty() {
                notes.push(Warning::UnmodelledOptions { names });
            }
            Config::from_recorded_as(s, version, flavour)?
        }
        None => {
            notes.push(Warning::NoAllocatorSettings);
            Config { version, ..Config::default_for(flavour) }
        }
    };
    if let Some(g) = options.gpu_memory {
        config.gpu_memory = g;
    }
    if !config.expandable_segments && start::shows_expandable(trace, device, events) {
        config.expandable_segments = true;
        notes.push(Warning::ExpandableFromTrace);
    }
    let pool_memory = start::PrivatePoolMemory::recorded(trace, device, events);
    pool_memory.apply_to(&mut config);
    config.mem_pools = start::mem_pools_by_stacks(trace, device, events);
    if let Some(expandable) = pool_memory.expandable {
        let own_allocator = pool_memory.own_allocator.len() as u64;
        notes.push(Warning::PrivatePoolMemory { expandable, own_allocator });
    }
    // Named whether read from the recording or asked for (`modelled PyTorch 2.13 (as asked)`).
    notes.push(Warning::ModelledVersion { modelled });
    Ok(config)
}

/// Where no GPU memory was given: the memory the recording shows the GPU had (a memory
/// fraction's limit let the recorded peak through; the expandable layout fixes it), set in
/// `config`, and the start state recovered again under it.
fn gpu_memory_from_recording(
    trace: &Trace,
    device: i32,
    events: &[Event],
    config: &mut Config,
    mut start: StartState,
    notes: &mut Vec<Warning>,
) -> StartState {
    // The memory fraction's limit let the recorded peak through: the GPU had at least that.
    let peak = recorded_peak(events, start.reserved());
    if let Some(least) = config.least_gpu_memory_for(peak).filter(|&g| g > config.gpu_memory) {
        notes.push(Warning::GpuMemoryFromPeak { bytes: least, peak, assumed: config.gpu_memory });
        config.gpu_memory = least;
        start = StartState::recover(trace, device, events, config);
    }
    if let Some(note) = infer_gpu_memory(events, &start, config) {
        notes.push(note);
        start = StartState::recover(trace, device, events, config);
    }
    start
}

/// Learns orphan sizes from placements that prove them (some the recovery already showed):
/// replays to the first mismatch, grows the orphan that explains it, and again. Returns each
/// size learned (orphan, size, event), in order.
fn learn_orphan_sizes(
    recording: &Recording,
    start: &mut StartState,
    config: &Config,
    cancel: &Cancel,
) -> Result<Vec<(u64, u64, usize)>> {
    let mut learned: Vec<(u64, u64, usize)> = start
        .segments
        .iter()
        .flat_map(|s| &s.live)
        .filter_map(|b| b.shown_at.map(|k| (b.addr, b.size, k)))
        .collect();
    loop {
        let run = replay(recording, start, config, RunOptions::new(Stop::FirstMismatch, cancel))?;
        let Some((k, recorded, simulated)) = run.first_mismatch else { break };
        if run.first_inside_free == Some((k, recorded)) {
            if let Some(orphan) = start.extend(recorded) {
                learned.push((orphan, recorded - orphan, k));
                continue;
            }
        }
        match longer_orphan(recording, start, config, k, (recorded, simulated), cancel)? {
            Some((orphan, size)) => {
                start.set_size(orphan, size);
                learned.push((orphan, size, k));
            }
            None => break,
        }
    }
    Ok(learned)
}

/// The decisions (docs/pytorch-model.md#undeterminable) that depend on an ambiguous orphan's
/// size: where a replay with that orphan at its longest first places a block elsewhere than
/// `base`, by event.
fn undeterminable(
    recording: &Recording,
    start: &StartState,
    config: &Config,
    base: &Run,
    cancel: &Cancel,
) -> Result<BTreeMap<usize, Mismatch>> {
    let mut undeterminable: BTreeMap<usize, Mismatch> = BTreeMap::new();
    for o in start.ambiguous() {
        let variant = start.with_longest(o);
        let how = RunOptions::new(Stop::Diverge(&base.placed), cancel);
        let run = replay(recording, &variant, config, how)?;
        let k = run.placed.len().checked_sub(1);
        let Some(k) = k else { continue };
        let (event, sim) = run.placed[k];
        let base_addr = base.placed.get(k).and_then(|&(_, a)| a);
        if sim != base_addr && !undeterminable.contains_key(&event) {
            let b = start.orphan(o).map_or((0, 0), |b| (b.size, b.max_size));
            undeterminable.insert(
                event,
                Mismatch {
                    event: event as u64,
                    action: Some(Action::Alloc),
                    expected: hex(recording.events[event].addr),
                    got: base_addr.map_or_else(|| "out of memory".into(), hex),
                    why: format!(
                        "depends on the size of the block at {o:#x}, live before recording: {} bytes by default, up to {} (it places it at {})",
                        b.0,
                        b.1,
                        sim.map_or_else(|| "nothing".into(), hex)
                    ),
                },
            );
        }
    }
    Ok(undeterminable)
}

/// The validation's result from the base run, the undeterminable decisions (counted apart,
/// never as matched or mismatched) and the final layout compared with the dump.
#[allow(clippy::too_many_arguments)]
fn summarise(
    trace: &Trace,
    device: i32,
    events: &[Event],
    base: Run,
    undeterminable: BTreeMap<usize, Mismatch>,
    peak_rec: u64,
    notes: Vec<Warning>,
    options: &ValidateOptions,
) -> Validation {
    let undetermined: BTreeSet<usize> = undeterminable.keys().copied().collect();
    // Only a snapshot records the final layout (a text trace without segments has no dump).
    let has_dump = trace.source_format() == crate::trace::Format::PytorchSnapshot
        || !trace.segments.is_empty();
    let final_layout = compare_final_segments(trace, device, &base.output.segments, events.len())
        .filter(|_| has_dump);
    let allocs_total = events.iter().filter(|e| e.action == Action::Alloc).count() as u64;
    let allocs_addr_matched = base
        .placed
        .iter()
        .filter(|&&(i, a)| a == Some(events[i].addr) && !undetermined.contains(&i))
        .count() as u64;
    let mismatches: Vec<Mismatch> = base
        .mismatches
        .iter()
        .filter(|m| {
            !(m.action == Some(Action::Alloc) && undetermined.contains(&(m.event as usize)))
        })
        .cloned()
        .chain(final_layout.filter(|_| base.mismatches.is_empty()))
        .collect();
    let segment_events_recorded = events.iter().filter(|e| e.action.is_segment_event()).count();
    let mut output = base.output;
    output.segments.iter_mut().for_each(|s| s.device = device);
    if !options.record_events {
        output.events = None;
    }
    Validation {
        trace: String::new(),
        device,
        allocs_total,
        allocs_addr_matched,
        allocs_exact_address: base.exact_placed,
        segment_events_recorded: segment_events_recorded as u64,
        segment_events_matched: base.segment_events_matched,
        peak_reserved_recorded_bytes: peak_rec,
        peak_reserved_simulated_bytes: output.result.peak_reserved_bytes,
        undeterminable_events: undeterminable.len() as u64,
        mismatches,
        undeterminable: undeterminable.into_values().collect(),
        notes,
        config: output.result.config.clone(),
        output,
    }
}
