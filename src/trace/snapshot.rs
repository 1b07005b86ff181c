//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`): reading and writing.
//!
//! Upstream: `torch/csrc/cuda/memory_snapshot.cpp` (`_memory_snapshot_pickled`, the dict builder)
//! and `torch/cuda/memory.py` (`_snapshot`, `_dump_snapshot`); the schema is in
//! docs/pytorch-model.md#snapshot-format. The opcode level lives in [`super::pickle`]; this file
//! only maps the schema onto the model, in one place:
//!
//! - `device_traces[i]` → `DeviceTrace { device: i }`, every index kept (even empty ones) so the
//!   numbering matches PyTorch's; each entry's `action` per `Action::from_name`, where the old
//!   single `free` becomes `free_requested` then `free_completed`, the markers that change no
//!   memory are skipped (`annotate`, 2.14+, whose label is kept in [`SnapshotExtras`];
//!   `user_defined`, which ≈ 2.4–2.5 wrote at the start and end of every
//!   `torch.profiler.record_function` while history was recorded), and any
//!   other action is an input error naming the device and entry index; `oom` entries carry
//!   `device_free` instead of `addr` (docs/pytorch-model.md#oom), which becomes the event's `addr`.
//! - `time_us` (≈ 2.2+) when every entry has it (`has_times`), else each entry's index.
//! - `segments` → [`Segment`]s with their [`Block`]s; 2.0-era blocks without `address` sit at the
//!   segment address plus the sizes of the blocks before them (their `history` is ignored).
//! - `allocator_settings` (≈ 2.3+) → [`AllocatorSettings`].
//! - A pickled bare list is the legacy `torch.cuda.memory_snapshot()` (segments only).
//! - Frames (`[{filename, line, name}, ...]`) are interned once per list object and once per
//!   sequence of frame dict objects (PyTorch shares both), and only when
//!   [`ReadOptions::keep_frames`] asks for them, but for the stacks that decide something: a
//!   release's (an `empty_cache()` call or an out-of-memory flush) and one telling a private
//!   pool's kind ([`super::tells_pool_kind`]), read always. While streaming, container indices
//!   are handed out again after a batch is dropped, so these caches forget the dropped ones
//!   (`Reader::forget`) and know the kept ones by handle instead.
//!
//! Reading streams ([`stream`]): each batch of `device_traces` entries becomes events as soon as
//! the decoder has it, and is then dropped, so reading holds the events plus one batch; the
//! segments and settings, small beside the entries, are decoded as a tree. With
//! frames, the frame lists and dicts of dropped entries that the file may refer back to are
//! kept as what they became (an interned stack, a decoded frame). The same per-entry conversion
//! serves the whole-pickle reader ([`read`]), which answers a file that refers back to an entry
//! the stream dropped.
//!
//! - With frames kept, each final block's `frames` (the allocation that last used it) →
//!   `FrameTable::set_block`, which names the site of a block live before the trace begins.
//! - Each entry's `pool_id` (≈ 2.7+), when every entry has one, → [`Event::pool`], the private
//!   pools in [`Trace::entry_pools`] (`(0, 0)`, the default pools, is [`PoolRef::DEFAULT`]).
//!
//! - Newer releases' keys → [`SnapshotExtras`]: entries' `internal_metadata` (2.15+) and
//!   `user_metadata`, `allocator_settings`' `max_round_threshold` / `max_cached_size` (2.13+),
//!   the pinned host allocator's `host_segments` / `host_traces` (2.14+), counted leniently.
//!
//! Other keys (`external_annotations`, `compile_context`, segment `frames`,
//! ...) are ignored. Sizes must be integers in `0..2^60`, addresses in `0..2^64` (see [`super::limits`]).
//!
//! The writer emits the same schema as protocol 4 with plain dicts and lists, which Python's
//! `pickle.load`, `torch.cuda._memory_viz` and pytorch.org/memory_viz read.

use super::pickle::{self, encode::Encoder, Pickle, Stop, StreamedList, Value};
use super::{
    limits, Action, AllocatorSettings, Annotation, Block, BlockState, DeviceTrace, Event, Format,
    Frame, FrameTable, FramesId, HostSegments, PoolId, PoolKind, PoolRef, ReadOptions, Segment,
    SnapshotExtras, Trace,
};
use crate::error::{quoted, Cancel, Error, Place, Result};
use std::collections::HashMap;
use std::io::{BufRead, Write};

/// The largest size or address accepted (2^60 bytes): anything above is corrupt input.
const MAX_BYTES: i128 = 1 << 60;

/// The size of a small-pool segment (`kSmallBuffer`), used to tell the pool of very old segments
/// that do not record their `segment_type`.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Reads a snapshot pickle held whole in memory.
pub fn read(data: &[u8], options: &ReadOptions) -> Result<Trace> {
    let p = pickle::decode(data)?;
    build(&p, options, None).map_err(refusal_error)
}

/// Reads a snapshot pickle from a stream (see [`stream`]); what cannot be streamed is an input
/// error naming the byte where the stream referred back to what it had discarded.
pub fn read_from(input: &mut dyn BufRead, options: &ReadOptions) -> Result<Trace> {
    stream(input, options).map_err(refusal_error)
}

/// Reads a snapshot already decoded (or built from objects in memory with
/// [`pickle::objects::Builder`]): the conversion, checks and limits of [`read`].
pub fn read_decoded(p: &Pickle, options: &ReadOptions) -> Result<Trace> {
    let trace = build(p, options, None).map_err(refusal_error)?;
    limits::check_trace(&trace)?;
    Ok(trace)
}

/// A snapshot built from objects in memory ([`pickle::objects::Builder`]) read as a file is
/// streamed ([`stream`]): the builder hands over each device's trace entries a batch at a time
/// ([`EntryStream::entries`]), then drops them (so reading holds the events plus one batch, and
/// stays in cache), making what it memoized of them into what [`EntryStream::keep`] says, and
/// ends with [`EntryStream::finish`] on what is left. The Python package reads a snapshot dict
/// this way.
#[derive(Debug, Default)]
pub struct EntryStream {
    sink: Streamer,
    lists: Vec<StreamedList>,
}

impl EntryStream {
    /// A stream read with `options` (whether stack frames are kept).
    pub fn new(options: &ReadOptions) -> EntryStream {
        let sink = Streamer { reader: Reader::new(options.keep_frames), ..Streamer::default() };
        EntryStream { sink, lists: Vec::new() }
    }

    /// Converts `items`, the next trace entries of `list`, which is item `device` of the
    /// `device_traces` list `within`. The builder drops them afterwards (`p` still has them
    /// now), and then calls [`EntryStream::discarded`].
    pub fn entries(
        &mut self,
        p: &Pickle<'_>,
        (device, list, within): (usize, Value, Value),
        items: &[Value],
    ) -> std::result::Result<(), Stop> {
        if !self.lists.iter().any(|l| l.list == list) {
            self.lists.push(StreamedList { list, device, within });
        }
        pickle::Sink::items(&mut self.sink, p, device, list, items)
    }

    /// What the container `v` (about to be dropped) becomes for a later reference to it: the
    /// handle of what the reader made of it (a frame list's stack, a frame), or
    /// [`Value::Dropped`].
    pub fn keep(&mut self, p: &Pickle<'_>, v: Value) -> Value {
        pickle::Sink::keep(&mut self.sink, p, v).map_or(Value::Dropped, Value::Handle)
    }

    /// The containers from index `seqs` (lists, tuples, sets) and `dicts` (dicts) on were
    /// dropped; the next ones take their indices again.
    pub fn discarded(&mut self, seqs: usize, dicts: usize) {
        pickle::Sink::discarded(&mut self.sink, seqs, dicts);
    }

    /// The trace: the entries converted so far and the rest of `p` (the snapshot without the
    /// dropped entries), with the checks and limits of [`read_decoded`].
    /// [`Stop::Refused`] where `p` refers to a dropped entry in a way the conversion needs (a
    /// snapshot from PyTorch never does): the caller reads it whole instead.
    pub fn finish(
        mut self,
        p: &Pickle<'_>,
        options: &ReadOptions,
    ) -> std::result::Result<Trace, Stop> {
        if let Some(at) = p.find_dropped(p.root()) {
            let why = "a dropped trace entry (or part of one) is used outside 'device_traces'";
            return Err(Stop::Refused { at: at.unwrap_or(0), why: why.into() });
        }
        let trace = build(p, options, Some((&self.lists, &mut self.sink)))?;
        limits::check_trace(&trace)?;
        Ok(trace)
    }
}

/// The error for a [`Stop`]: itself, or, for a refusal, what was refused and where.
pub fn refusal_error(stop: Stop) -> Error {
    match stop {
        Stop::Error(e) => e,
        Stop::Refused { at, why } => Error::input(format!(
            "cannot read this snapshot as a stream: {why} (fragsim reads it whole when it is a file)"
        ))
        .at(Place::Byte(at)),
    }
}

/// Reads a snapshot pickle from a stream, turning each `device_traces` entry into events as soon
/// as it is decoded and then discarding it ([`pickle::decode_stream`]), so that reading holds
/// the events plus one batch of entries, not the whole object tree. With
/// [`ReadOptions::keep_frames`], the frame lists and frame dicts of a dropped batch that the file
/// may refer back to (every memoized one) are kept as what they became: an interned stack, a
/// decoded frame.
///
/// [`Stop::Refused`] when the file refers back to a discarded entry in a way the conversion
/// needs (PyTorch's files never do); decoding the input whole ([`read`]) answers it. Any
/// [`Stop::Error`] is an error of the input, but not always the one [`read`] reports first
/// (the streamed reader sees the entries before the segments): callers that can read the input
/// again do so for the message.
pub fn stream(input: &mut dyn BufRead, options: &ReadOptions) -> std::result::Result<Trace, Stop> {
    let mut sink = Streamer { reader: Reader::new(options.keep_frames), ..Streamer::default() };
    let streamed = pickle::decode_stream(input, "device_traces", &mut sink)?;
    let p = &streamed.pickle;
    if let Some(at) = p.find_dropped(p.root()) {
        let why = "a discarded trace entry (or part of one) is used outside 'device_traces'";
        return Err(Stop::Refused { at: at.unwrap_or(0), why: why.into() });
    }
    build(p, options, Some((&streamed.lists, &mut sink)))
}

/// Builds the trace from a decoded pickle; `streamed` holds the lists whose entries were
/// already converted while decoding, and their events.
fn build(
    p: &Pickle,
    options: &ReadOptions,
    mut streamed: Option<(&[StreamedList], &mut Streamer)>,
) -> std::result::Result<Trace, Stop> {
    let root = p.root();
    let mut trace = Trace { format: Format::PytorchSnapshot, ..Trace::default() };
    // The frames and caches the streamed entries built (frame lists they dropped included).
    let (mut reader, mut pools) = match streamed.as_mut() {
        Some((_, sink)) => {
            trace.frames = std::mem::take(&mut sink.table);
            (std::mem::take(&mut sink.reader), std::mem::take(&mut sink.pools))
        }
        None => (Reader::new(options.keep_frames), EntryPools::default()),
    };
    let (segments, traces) = match root {
        Value::List(_) => (Some(root), None),
        Value::Dict(_) => match (p.get(root, "segments"), p.get(root, "device_traces")) {
            (None, None) => {
                return Err(schema_err(
                    "not a memory snapshot: the pickled dict has neither 'segments' nor 'device_traces'"
                        .into(),
                    p.offset_of(root),
                )
                .into())
            }
            found => found,
        },
        other => {
            return Err(Error::input(format!(
                "not a memory snapshot: the pickle holds {}, not a dict with 'segments' and 'device_traces'",
                other.a_type_name()
            ))
            // A scalar has no opcode of its own to point at: the pickle that holds it starts at 0.
            .at(crate::error::Place::Byte(p.offset_of(other).unwrap_or(0)))
            .into())
        }
    };
    if let Some(segments) = segments {
        trace.segments = read_segments(p, segments, root)?;
    }
    let mut used = vec![false; streamed.as_ref().map_or(0, |(lists, _)| lists.len())];
    match traces {
        Some(traces) => {
            let lists = p.items(traces).ok_or_else(|| {
                schema_err(
                    format!("'device_traces' is {}, not a list", traces.a_type_name()),
                    byte_of(p, traces, root),
                )
            })?;
            let mut all_timed = true;
            let mut any = false;
            let mut indices = Vec::with_capacity(lists.len());
            for (i, &list) in lists.iter().enumerate() {
                let device = limits::check_device(i as i64).map_err(|m| {
                    schema_err(
                        format!("'device_traces' has {} entries: {m}", lists.len()),
                        p.offset_of(traces),
                    )
                })?;
                let done = streamed.as_mut().and_then(|(streamed, sink)| {
                    let k = streamed.iter().position(|l| l.list == list)?;
                    Some((k, streamed[k], sink.take(i)))
                });
                let d = match done {
                    // Converted while decoding: it must still be where it was then.
                    Some((k, l, d)) => {
                        if l.device != i
                            || l.within != traces
                            || used[k]
                            || p.items(list) != Some(&[])
                        {
                            return Err(Stop::Refused {
                                at: p.offset_of(list).unwrap_or(0),
                                why: format!(
                                    "device_traces[{i}] was streamed as another list's entries"
                                ),
                            });
                        }
                        used[k] = true;
                        d
                    }
                    None => {
                        let at = (list, traces);
                        reader.device_trace(
                            p,
                            device,
                            at,
                            &mut trace,
                            &mut pools,
                            &options.cancel,
                        )?
                    }
                };
                any |= !d.events.is_empty();
                all_timed &= d.all_timed;
                trace.extras.absorb(device, d.extras);
                trace.devices.push(DeviceTrace { device, events: d.events });
                indices.push(d.index);
            }
            trace.has_times = any && all_timed;
            let mixed = pools.named && pools.unnamed;
            trace.entry_pools = pools.finish();
            if mixed {
                // Where only some entries name their pool, none is trusted (`entry_pools` is
                // `None`): no event may keep a reference into a table the trace does not hold.
                let events = trace.devices.iter_mut().flat_map(|d| &mut d.events);
                events.for_each(|e| e.pool = PoolRef::DEFAULT);
            }
            if !trace.has_times {
                // Some entries lack `time_us`: times are entry indices throughout, so that events
                // stay ordered and comparable.
                for (d, index) in trace.devices.iter_mut().zip(&indices) {
                    index.apply(&mut d.events);
                }
            }
        }
        None => {
            // Legacy or trace-less snapshots: one empty trace per device seen in the segments.
            let max = trace.segments.iter().map(|s| s.device).max().unwrap_or(-1);
            trace.devices =
                (0..=max).map(|device| DeviceTrace { device, events: vec![] }).collect();
        }
    }
    if let Some(k) = used.iter().position(|u| !u) {
        let at = streamed.as_ref().and_then(|(lists, _)| p.offset_of(lists[k].list));
        return Err(Stop::Refused {
            at: at.unwrap_or(0),
            why: "a list whose entries were streamed is not in the final 'device_traces'".into(),
        });
    }
    // After the entries', so that the entries' stacks are numbered alike however they were read.
    if let (Some(segments), true) = (segments, options.keep_frames) {
        read_block_frames(p, segments, &mut reader, &mut trace)?;
    }
    if let Value::Dict(_) = root {
        if let Some(settings) = p.get(root, "allocator_settings") {
            trace.allocator_settings = Some(read_settings(p, settings, root)?);
            trace.extras.settings_keys = newer_settings_keys(p, settings);
        }
        read_host_allocator(p, root, &mut trace.extras);
    }
    trace.torch_npu = reader.torch_npu
        || trace.frames.names_torch_npu()
        || (maps_pages_against_settings(&trace) && blocks_show_npu_padding(&trace));
    Ok(trace)
}

/// True when the trace maps pages (a `segment_map` or `segment_unmap` entry, or an expandable
/// range in the dump) while its settings say `expandable_segments:False`: how torch_npu records
/// a run with expandable segments (docs/pytorch-model.md#npu).
fn maps_pages_against_settings(trace: &Trace) -> bool {
    let maps = trace.segments.iter().any(|s| s.is_expandable)
        || trace
            .devices
            .iter()
            .flat_map(|d| &d.events)
            .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap));
    maps && !trace.allocator_settings.as_ref().is_some_and(|s| s.expandable_segments)
}

/// True when the dump's small-pool blocks show torch_npu's 32-byte padding and none shows its
/// absence: a small-pool block is split to its rounded size exactly, so a live block whose size
/// is `round(requested + 32)` where that differs from `round(requested)` was padded (torch_npu's
/// `AddPadSize`), and one of `round(requested)` where that differs was not (CUDA's). Asked of a
/// recording whose pages contradict its settings, which names no `torch_npu/` file in its
/// frames (docs/pytorch-model.md#npu).
/// Not asked where `roundup_power2_divisions` round up further (the sizes tell nothing then).
fn blocks_show_npu_padding(trace: &Trace) -> bool {
    let settings = trace.allocator_settings.as_ref();
    if settings.is_some_and(|s| s.roundup_power2_divisions.iter().any(|&d| d > 1)) {
        return false;
    }
    let round = |n: u64| n.div_ceil(512).max(1) * 512;
    let (mut padded, mut plain) = (0u64, 0u64);
    let small = trace.segments.iter().filter(|s| s.pool == super::PoolKind::Small);
    for b in small.flat_map(|s| &s.blocks) {
        if b.state != BlockState::ActiveAllocated || b.requested_size == 0 {
            continue;
        }
        let (cuda, npu) = (round(b.requested_size), round(b.requested_size.saturating_add(32)));
        if cuda == npu {
            continue;
        }
        padded += (b.size == npu) as u64;
        plain += (b.size == cuda) as u64;
    }
    padded > 0 && plain == 0
}

/// The entry index of each event, kept run-length coded (a run ends where an entry gives two
/// events or none), for when the trace turns out not to be timed throughout and times become
/// entry indices. Events before the first timed entry already carry their index as time, so
/// nothing is kept for them: an untimed 2.0-era trace keeps nothing at all.
#[derive(Debug, Default)]
struct EntryIndex {
    /// (first event, entry index minus event position) per run.
    runs: Vec<(usize, i64)>,
}

impl EntryIndex {
    fn push(&mut self, pos: usize, index: usize, timed: bool) {
        if !timed && self.runs.is_empty() {
            return;
        }
        let delta = index as i64 - pos as i64;
        if self.runs.last().map(|r| r.1) != Some(delta) {
            self.runs.push((pos, delta));
        }
    }

    /// Sets each event's time to its entry index.
    fn apply(&self, events: &mut [Event]) {
        for (k, &(start, delta)) in self.runs.iter().enumerate() {
            let end = self.runs.get(k + 1).map_or(events.len(), |r| r.0);
            for (pos, e) in events.iter_mut().enumerate().take(end).skip(start) {
                e.time_us = pos as i64 + delta;
            }
        }
    }
}

/// One device's events, as its entries are converted.
#[derive(Debug, Default)]
struct DeviceEvents {
    events: Vec<Event>,
    index: EntryIndex,
    /// Whether every entry so far had `time_us`.
    all_timed: bool,
    /// Entries converted so far.
    entries: usize,
    /// What its entries carry besides memory events (`internal_metadata`, `annotate`, ...).
    extras: EntryExtras,
}

/// One device's entries' keys and markers of newer releases ([`SnapshotExtras`]).
#[derive(Debug, Default)]
struct EntryExtras {
    internal_metadata: u64,
    malloc_with_address: u64,
    user_metadata: u64,
    annotate_entries: u64,
    /// (entry index, events before it, addr, label).
    annotations: Vec<(u64, u64, u64, String)>,
    /// The index of the first event of each entry tagged `mallocWithAddress`.
    malloc_with_address_events: Vec<u64>,
}

impl SnapshotExtras {
    /// Adds device `device`'s entry extras.
    fn absorb(&mut self, device: i32, e: EntryExtras) {
        self.internal_metadata += e.internal_metadata;
        self.malloc_with_address += e.malloc_with_address;
        self.user_metadata += e.user_metadata;
        self.annotate_entries += e.annotate_entries;
        for event in e.malloc_with_address_events {
            if self.malloc_with_address_events.len() < SnapshotExtras::MAX_ANNOTATIONS {
                self.malloc_with_address_events.push((device, event));
            }
        }
        for (entry, event, addr, label) in e.annotations {
            if self.annotations.len() < SnapshotExtras::MAX_ANNOTATIONS {
                self.annotations.push(Annotation { device, entry, event, addr, label });
            }
        }
    }
}

impl DeviceEvents {
    fn new(capacity: usize) -> Self {
        DeviceEvents { events: Vec::with_capacity(capacity), all_timed: true, ..Default::default() }
    }

    /// Converts `entry`, the next entry of `list` (device `device`'s trace); `frames` interns
    /// its frames, when they are kept.
    fn add(
        &mut self,
        p: &Pickle,
        device: i32,
        (entry, list): (Value, Value),
        frames: &mut dyn FnMut(
            Value,
            usize,
            Option<u64>,
            bool,
        ) -> std::result::Result<FramesId, Stop>,
        pools: &mut EntryPools,
    ) -> std::result::Result<(), Stop> {
        let index = self.entries;
        self.entries += 1;
        let Some(e) = read_entry(p, device, index, entry, list)? else { return Ok(()) };
        let x = &mut self.extras;
        x.internal_metadata += e.marks.internal as u64;
        x.malloc_with_address += e.marks.malloc_with_address as u64;
        x.user_metadata += e.marks.user as u64;
        if let Some(label) = e.marks.annotate {
            // A label on a live allocation: it changes no memory.
            x.annotate_entries += 1;
            if x.annotations.len() < SnapshotExtras::MAX_ANNOTATIONS {
                x.annotations.push((index as u64, self.events.len() as u64, e.addr, label));
            }
            return Ok(());
        }
        let at = byte_of(p, entry, list);
        // A release's stack says why the cache was flushed (`empty_cache()` or a malloc's
        // out-of-memory fallback): kept even when other frames are not.
        let release =
            e.actions.iter().any(|a| matches!(a, Action::SegmentFree | Action::SegmentUnmap));
        let frames = match e.frames {
            Some(f) => frames(f, index, at, release)?,
            None => FramesId::NONE,
        };
        let pool = pools.intern(e.pool).map_err(|m| entry_err(device, index, m, at))?;
        if e.marks.malloc_with_address
            && !e.actions.is_empty()
            && self.extras.malloc_with_address_events.len() < SnapshotExtras::MAX_ANNOTATIONS
        {
            self.extras.malloc_with_address_events.push(self.events.len() as u64);
        }
        self.all_timed &= e.time.is_some();
        let time_us = e.time.unwrap_or(index as i64);
        for &action in e.actions {
            let (addr, size, stream) = (e.addr, e.size, e.stream);
            let event = Event { action, addr, size, stream, time_us, frames, pool };
            limits::check_event(&event).map_err(|m| entry_err(device, index, m, at))?;
            self.index.push(self.events.len(), index, e.time.is_some());
            self.events.push(event);
        }
        Ok(())
    }
}

/// The private pools the entries name, numbered as [`PoolRef`]s in the order first named, and
/// whether every entry named one (a file from before `pool_id` names none).
#[derive(Debug, Default)]
struct EntryPools {
    table: Vec<PoolId>,
    index: HashMap<PoolId, PoolRef>,
    /// Some entry had no `pool_id`.
    unnamed: bool,
    /// Some entry had one.
    named: bool,
}

impl EntryPools {
    /// The [`PoolRef`] of an entry's `pool_id` (`None`: it had none, or named the default
    /// pools); an error when the file names more private pools than a [`PoolRef`] counts.
    fn intern(&mut self, pool: Option<Option<PoolId>>) -> std::result::Result<PoolRef, String> {
        let Some(pool) = pool else {
            self.unnamed = true;
            return Ok(PoolRef::DEFAULT);
        };
        self.named = true;
        let Some(id) = pool else { return Ok(PoolRef::DEFAULT) };
        if let Some(&r) = self.index.get(&id) {
            return Ok(r);
        }
        if self.table.len() >= PoolRef::MAX_POOLS {
            return Err(format!("names more than {} private pools", PoolRef::MAX_POOLS));
        }
        self.table.push(id);
        let r = PoolRef(self.table.len() as u16);
        self.index.insert(id, r);
        Ok(r)
    }

    /// [`Trace::entry_pools`]: the table, where every entry named its pool.
    fn finish(self) -> Option<Vec<PoolId>> {
        (self.named && !self.unnamed).then_some(self.table)
    }
}

/// The fields of one trace entry.
struct Entry {
    /// One action, or two for the old single `free`.
    actions: &'static [Action],
    addr: u64,
    size: u64,
    stream: u64,
    time: Option<i64>,
    /// The `frames` value, when it is there.
    frames: Option<Value>,
    /// The `pool_id`, when it is there: `None` inside for the default pools.
    pool: Option<Option<PoolId>>,
    /// Keys and markers of newer releases.
    marks: Marks,
}

/// What an entry carries of newer releases (docs/pytorch-model.md#version-evidence).
#[derive(Debug, Default)]
struct Marks {
    /// It has `internal_metadata` (2.15+).
    internal: bool,
    /// Its `internal_metadata` is `mallocWithAddress`.
    malloc_with_address: bool,
    /// It has a non-empty `user_metadata` string.
    user: bool,
    /// An `annotate` entry: its label (empty where unreadable).
    annotate: Option<String>,
}

/// Reads entry `index` of device `device`'s trace `list`; `None` for a `user_defined` marker,
/// an entry with no actions and [`Marks::annotate`] for an `annotate` one. A part of
/// the entry that the streamed decoder discarded and the conversion needs is refused.
fn read_entry(
    p: &Pickle,
    device: i32,
    index: usize,
    entry: Value,
    list: Value,
) -> std::result::Result<Option<Entry>, Stop> {
    let at = byte_of(p, entry, list);
    let err = |m: String| entry_err(device, index, m, at);
    let refuse = || {
        Stop::Refused {
        at: at.unwrap_or(0),
        why: format!(
            "device {device}: trace entry {index} refers back to an object discarded after an earlier entry"
        ),
    }
    };
    if gone(entry) {
        return Err(refuse());
    }
    let fields =
        p.entries(entry).ok_or_else(|| err(format!("is {}, not a dict", entry.a_type_name())))?;
    let mut action: Option<&[u8]> = None;
    let (mut addr, mut size, mut stream, mut time) = (None, None, None, None);
    let mut device_free = None;
    let mut frames = None;
    let mut pool = None;
    let mut marks = Marks::default();
    let mut user = None;
    for &(k, v) in fields {
        // A discarded key is not one read here: the streamed decoder keeps those.
        let Some(k) = p.str_bytes(k) else { continue };
        // By length first: one comparison per key instead of one per field read.
        match (k.len(), k) {
            (6, b"action") => match p.str_bytes(v) {
                Some(s) => action = Some(s),
                None if gone(v) => return Err(refuse()),
                None => return Err(err(format!("'action' is {}", v.a_type_name())).into()),
            },
            (4, b"addr") => addr = Some(v),
            (11, b"device_free") => device_free = Some(v),
            (4, b"size") => size = Some(v),
            (6, b"stream") => stream = Some(v),
            (7, b"time_us") => time = Some(v),
            (6, b"frames") => frames = Some(v),
            (7, b"pool_id") => pool = Some(v),
            (17, b"internal_metadata") => {
                marks.internal = true;
                marks.malloc_with_address = p.str_bytes(v) == Some(b"mallocWithAddress".as_slice());
            }
            (13, b"user_metadata") => {
                // PyTorch writes an empty one on every entry: only a label counts.
                marks.user = p.str_bytes(v).is_some_and(|b| !b.is_empty());
                user = Some(v);
            }
            _ => {}
        }
    }
    let action = action.ok_or_else(|| err("has no 'action'".into()))?;
    let actions: &'static [Action] = match action {
        b"alloc" => &[Action::Alloc],
        b"free_requested" => &[Action::FreeRequested],
        b"free_completed" => &[Action::FreeCompleted],
        b"free" => &[Action::FreeRequested, Action::FreeCompleted],
        b"segment_alloc" => &[Action::SegmentAlloc],
        b"segment_free" => &[Action::SegmentFree],
        b"segment_map" => &[Action::SegmentMap],
        b"segment_unmap" => &[Action::SegmentUnmap],
        b"oom" => &[Action::Oom],
        b"snapshot" => &[Action::Snapshot],
        b"annotate" => {
            // Never an error: a label whose address or text cannot be read is kept without it.
            let addr = addr.and_then(|v| p.int(v)).and_then(|a| u64::try_from(a).ok());
            let mut label = user.and_then(|v| p.text(v)).unwrap_or_default().into_owned();
            if label.len() > Annotation::MAX_LABEL {
                let mut end = Annotation::MAX_LABEL;
                while !label.is_char_boundary(end) {
                    end -= 1;
                }
                label.truncate(end);
            }
            marks.annotate = Some(label);
            let (size, stream, time, frames, pool) = (0, 0, None, None, None);
            let addr = addr.unwrap_or(0);
            return Ok(Some(Entry { actions: &[], addr, size, stream, time, frames, pool, marks }));
        }
        b"user_defined" => return Ok(None),
        other => {
            return Err(err(format!(
                "unknown action {} (accepted: {}, free, annotate, user_defined)",
                quoted(&String::from_utf8_lossy(other)),
                Action::ALL.map(Action::name).join(", ")
            ))
            .into())
        }
    };
    let (addr_key, addr) = if actions[0] == Action::Oom {
        ("device_free", device_free.or(addr))
    } else {
        ("addr", addr)
    };
    if [addr, size, stream, time, pool].into_iter().flatten().any(gone) {
        return Err(refuse());
    }
    let addr = bytes_field(p, addr_key, addr).map_err(err)?;
    let size = bytes_field(p, "size", size).map_err(err)?;
    let stream = match stream {
        None => 0,
        Some(v) => p
            .int(v)
            .and_then(|s| u64::try_from(s).ok())
            .ok_or_else(|| err(not_int(p, "stream", v, "a cudaStream_t value")))?,
    };
    let time = match time {
        Some(v) => Some(
            p.int(v)
                .and_then(|t| i64::try_from(t).ok())
                .filter(|t| *t >= 0)
                .ok_or_else(|| err(not_int(p, "time_us", v, "a time in microseconds")))?,
        ),
        None => None,
    };
    let pool = match pool {
        None => None,
        Some(v) => Some(pool_id(p, v).map_err(|m| err(format!("'pool_id' {m}")))?),
    };
    Ok(Some(Entry { actions, addr, size, stream, time, frames, pool, marks }))
}

/// A `MempoolId_t` (`segment_pool_id`, an entry's `pool_id`): `None` for the default pools
/// `(0, 0)`. Its two unsigned 64-bit ids are pickled as signed ints, and kept as their bits.
fn pool_id(p: &Pickle, v: Value) -> std::result::Result<Option<PoolId>, String> {
    let ids = p.items(v).map(|xs| xs.iter().map(|&x| p.int(x)).collect::<Vec<_>>());
    match ids.as_deref() {
        Some([Some(0), Some(0)]) => Ok(None),
        Some(&[Some(a), Some(b)]) if fits_u64_bits(a) && fits_u64_bits(b) => {
            Ok(Some((a as u64, b as u64)))
        }
        Some(&[Some(a), Some(b)]) => Err(format!("({a}, {b}) has an id beyond 64 bits")),
        _ => Err(format!("is not a pair of ints: {}", describe(p, v))),
    }
}

/// Whether `x` is an int64 or a uint64, as a `MempoolId_t` half may be pickled.
fn fits_u64_bits(x: i128) -> bool {
    (i64::MIN as i128..=u64::MAX as i128).contains(&x)
}

/// Whether `v` is an object the streamed decoder dropped, or kept only as what it became.
fn gone(v: Value) -> bool {
    matches!(v, Value::Dropped | Value::Handle(_))
}

/// The [`pickle::Sink`] of a streamed read: each device's events, converted as the decoder
/// completes batches of entries.
#[derive(Debug, Default)]
struct Streamer {
    /// By device index (at most [`limits`]' device count).
    devices: Vec<DeviceEvents>,
    /// Frames, when kept: the caches (valid for the objects not yet dropped) and the stacks.
    reader: Reader,
    table: FrameTable,
    /// The private pools the entries name.
    pools: EntryPools,
}

impl Streamer {
    /// Device `i`'s events, which leave the streamer.
    fn take(&mut self, i: usize) -> DeviceEvents {
        self.devices.get_mut(i).map(std::mem::take).unwrap_or_else(|| DeviceEvents::new(0))
    }
}

impl pickle::Sink for Streamer {
    fn items(
        &mut self,
        p: &Pickle<'_>,
        device: usize,
        list: Value,
        items: &[Value],
    ) -> std::result::Result<(), Stop> {
        let d = limits::check_device(device as i64).map_err(|m| {
            schema_err(format!("'device_traces' has more entries: {m}"), p.offset_of(list))
        })?;
        if self.devices.len() <= device {
            self.devices.resize_with(device + 1, || DeviceEvents::new(0));
        }
        let events = &mut self.devices[device];
        let (reader, table, pools) = (&mut self.reader, &mut self.table, &mut self.pools);
        let mut frames = |f: Value, index: usize, at: Option<u64>, release: bool| {
            reader.frames(p, f, table, (d, index, at), release)
        };
        for &entry in items {
            events.add(p, d, (entry, list), &mut frames, pools)?;
        }
        Ok(())
    }

    fn keeps(&self, bytes: &[u8]) -> bool {
        // What `read_entry` and `Reader::frame` compare a string with: the keys and the action
        // names.
        const READ: [&[u8]; 26] = [
            b"action",
            b"pool_id",
            b"addr",
            b"device_free",
            b"size",
            b"stream",
            b"time_us",
            b"frames",
            b"alloc",
            b"free_requested",
            b"free_completed",
            b"free",
            b"segment_alloc",
            b"segment_free",
            b"segment_map",
            b"segment_unmap",
            b"oom",
            b"snapshot",
            b"annotate",
            b"user_defined",
            b"filename",
            b"line",
            b"name",
            b"internal_metadata",
            b"user_metadata",
            b"mallocWithAddress",
        ];
        READ.contains(&bytes)
    }

    fn keep(&mut self, p: &Pickle<'_>, v: Value) -> Option<u32> {
        if !self.reader.keep_frames {
            // A release's stack is read even without frames (it tells an `empty_cache()` call
            // from an out-of-memory flush), and PyTorch shares each frame dict between stacks:
            // a frame dict a later release may name is kept as its frame, so the file reads the
            // stack the same snapshot's dict gives, wherever its batches were cut.
            return self.reader.keep_frame_dict(p, v);
        }
        self.reader.handle(v)
    }

    fn discarded(&mut self, seqs: usize, dicts: usize) {
        self.reader.forget(seqs, dicts);
    }
}

/// Frame lists and frame dicts decoded so far, by container index (while streaming, only those
/// not yet dropped: [`Reader::forget`]), and those of dropped batches by handle.
#[derive(Debug, Default)]
struct Reader {
    keep_frames: bool,
    /// Frame lists already interned, by their container id (PyTorch shares one list object per
    /// distinct traceback, so this is a pointer-identity cache).
    /// Indexed by list id; `None` until interned.
    frame_ids: Vec<Option<FramesId>>,
    /// One decoded [`Frame`] per frame dict, by dict id: PyTorch shares each frame dict between
    /// all the stacks that contain it, so its strings are decoded once.
    frame_cache: Vec<Option<Frame>>,
    /// Interned stacks by the ids of their frame dicts: PyTorch builds a new list object for many
    /// entries whose frames are the very same dict objects (in `cs336-medium-ctx512-train`, 14,961
    /// lists hold only 243 distinct sequences), so this cheap key spares most [`FrameTable`]
    /// lookups, which hash whole strings.
    ///
    /// Keys are dict indices, or [`HANDLE`] plus a handle's frame index.
    stacks: HashMap<Vec<u64>, FramesId>,
    /// The frames of dropped frame dicts the file may refer back to, each content once.
    handles: Vec<Frame>,
    /// The [`Reader::stacks`] key of the frame list being read, kept for its allocation.
    key: Vec<u64>,
    /// `handles` by content.
    handle_of: HashMap<Frame, u32>,
    /// A frame seen so far names a file of torch_npu ([`Trace::torch_npu`]).
    torch_npu: bool,
    /// What each frame dict tells ([`StackMarks`]), by dict id, while frames are not kept.
    dict_marks: Vec<StackMarks>,
    /// What each frame list tells, by sequence id: a list many entries share is walked once,
    /// not once per entry.
    list_marks: Vec<StackMarks>,
    /// The bytes of the frames interned so far, each stack's counted in full (see
    /// [`FRAME_BYTES_PER_INPUT_BYTE`]).
    frame_bytes: u64,
}

/// The most bytes the interned stacks may hold per byte of pickle read, past
/// [`FRAME_BYTES_FLOOR`]. Each stack keeps its frames' strings in full, while the file refers
/// to a frame dict (or to a string) in two bytes: a hostile file of many distinct stacks that
/// repeat one long frame would otherwise take memory quadratic in its size (170 KB held
/// 2.4 GB). The real snapshots hold under half a byte of frames per byte of file; a file
/// whose every entry has its own deep stack about 20.
const FRAME_BYTES_PER_INPUT_BYTE: u64 = 64;

/// The frame bytes any snapshot may intern, whatever its size.
const FRAME_BYTES_FLOOR: u64 = 64 << 20;

/// How [`Reader::frames_of`] names the owner of a frame list: an error about it at a byte, and its
/// name.
type Owner<'a> = (&'a dyn Fn(String, Option<u64>) -> Stop, &'a dyn Fn() -> String);

/// In a [`Value::Handle`] from [`Reader::handle`], the bit that marks a frame (the rest is its
/// index in [`Reader::handles`]); without it, the handle is a [`FramesId`]. In a
/// [`Reader::stacks`] key, the value above every dict index.
const HANDLE: u64 = 1 << 32;
const FRAME_HANDLE: u32 = 1 << 31;

/// An error about entry `index` of device `device`, whose nearest object was built at pickle
/// byte `at`: the place is the event index, and the message names the byte too.
fn entry_err(device: i32, index: usize, message: String, at: Option<u64>) -> Error {
    let byte = at.map(|b| format!(" (pickle byte {b})")).unwrap_or_default();
    Error::input(format!("device {device}: trace entry {index}: {message}{byte}"))
        .at(Place::Event(index as u64))
}

/// A schema error whose nearest object was built at pickle byte `at` (when known), which
/// becomes its place.
fn schema_err(message: String, at: Option<u64>) -> Error {
    match at {
        Some(b) => Error::input(message).at(Place::Byte(b)),
        None => Error::input(message),
    }
}

/// Where a schema error about `v` points: the opcode that built `v` or, when `v` is a scalar
/// (which has no object of its own), the one that built `parent`, the container holding it.
fn byte_of(p: &Pickle, v: Value, parent: Value) -> Option<u64> {
    p.offset_of(v).or_else(|| p.offset_of(parent))
}

impl Reader {
    fn new(keep_frames: bool) -> Self {
        Reader { keep_frames, ..Reader::default() }
    }

    /// What a memoized frame list or frame dict that streaming is about to drop becomes: an
    /// interned stack or a frame handle, when it was decoded (`None` otherwise).
    fn handle(&mut self, v: Value) -> Option<u32> {
        match v {
            Value::List(i) | Value::Tuple(i) => {
                let id = (*self.frame_ids.get(i as usize)?)?;
                (id.0 < FRAME_HANDLE).then_some(id.0)
            }
            Value::Dict(i) => {
                let frame = self.frame_cache.get(i as usize)?.as_ref()?;
                let next = self.handles.len() as u32;
                if next >= FRAME_HANDLE {
                    return None;
                }
                let k = *self.handle_of.entry(frame.clone()).or_insert(next);
                if k == next {
                    self.handles.push(frame.clone());
                }
                Some(FRAME_HANDLE | k)
            }
            _ => None,
        }
    }

    /// Without [`ReadOptions::keep_frames`]: the handle of `v` when it is a frame dict (a dict
    /// with a `filename` and no `action`), decoded now, within the bytes the stacks may take
    /// ([`FRAME_BYTES_PER_INPUT_BYTE`]); `None` otherwise (a release naming it then has no
    /// stack, as before).
    fn keep_frame_dict(&mut self, p: &Pickle, v: Value) -> Option<u32> {
        let Value::Dict(i) = v else { return None };
        if !matches!(self.frame_cache.get(i as usize), Some(Some(_))) {
            let keys = p.entries(v)?;
            let named = |name: &[u8]| keys.iter().any(|&(k, _)| p.str_bytes(k) == Some(name));
            if keys.len() > 8 || !named(b"filename") || named(b"action") {
                return None;
            }
            let frame = self.frame(p, v);
            let read = p.offset_of(v).unwrap_or(0);
            let allowed = read.saturating_mul(FRAME_BYTES_PER_INPUT_BYTE).max(FRAME_BYTES_FLOOR);
            let size = frame.filename.len() + frame.name.len() + size_of::<Frame>();
            self.frame_bytes = self.frame_bytes.saturating_add(size as u64);
            if self.frame_bytes > allowed {
                return None;
            }
        }
        self.handle(v)
    }

    /// Forgets what it knows of the containers from index `seqs` (lists) and `dicts` (dicts)
    /// on, which streaming dropped: their indices are handed out again.
    fn forget(&mut self, seqs: usize, dicts: usize) {
        self.frame_ids.truncate(seqs);
        self.frame_cache.truncate(dicts);
        self.dict_marks.truncate(dicts);
        self.list_marks.truncate(seqs);
        self.stacks.retain(|key, _| key.iter().all(|&d| d >= HANDLE || d < dicts as u64));
    }

    /// Reads one device's entries. `within` is the `device_traces` list that holds `list`, for
    /// errors.
    fn device_trace(
        &mut self,
        p: &Pickle,
        device: i32,
        (list, within): (Value, Value),
        trace: &mut Trace,
        pools: &mut EntryPools,
        cancel: &Cancel,
    ) -> Result<DeviceEvents> {
        let entries = p.items(list).ok_or_else(|| {
            schema_err(
                format!("device_traces[{device}] is {}, not a list", list.a_type_name()),
                byte_of(p, list, within),
            )
        })?;
        let mut events = DeviceEvents::new(entries.len().min(1 << 20));
        let mut frames = |f: Value, index: usize, at: Option<u64>, release: bool| {
            self.frames(p, f, &mut trace.frames, (device, index, at), release)
        };
        // A decoded pickle's entries are converted here (a streamed one's came through a reader
        // that looked at the flag): look at it between chunks of them.
        for chunk in entries.chunks(Cancel::EVERY) {
            let byte = p.offset_of(chunk[0]).unwrap_or(0);
            cancel.check(|| "reading").map_err(|e| e.at(Place::Byte(byte)))?;
            for &entry in chunk {
                events.add(p, device, (entry, list), &mut frames, pools).map_err(refusal_error)?;
            }
        }
        Ok(events)
    }

    /// Interns entry `index`'s frame list `v` (when frames are kept, or the entry is a
    /// `release` of cached memory, whose stack says why), once per list object.
    /// `(device, index, at)` name the entry for errors, which name the byte offset of the
    /// offending frame or of the list where there is one, else `at`. A release's frames read
    /// without [`ReadOptions::keep_frames`] are best effort: where streaming dropped them, the
    /// release has none.
    fn frames(
        &mut self,
        p: &Pickle,
        v: Value,
        table: &mut FrameTable,
        (device, index, at): (i32, usize, Option<u64>),
        release: bool,
    ) -> std::result::Result<FramesId, Stop> {
        if !self.keep_frames {
            let marks = self.stack_marks(p, v);
            self.torch_npu |= marks.has(StackMarks::TORCH_NPU);
            // Only the frames of a release and of a stack telling a private pool's kind are read
            // then, and only when all of them are at hand: the other entries cost a look at
            // their frame dicts, each once, and no decoding of their stacks.
            // A frame handle is a frame dict streaming dropped ([`Reader::keep_frame_dict`]).
            let dropped = |f: &Value| match f {
                Value::Handle(h) => h & FRAME_HANDLE == 0,
                _ => matches!(f, Value::Dropped),
            };
            let whole = || {
                matches!(v, Value::List(_) | Value::Tuple(_))
                    && !p.items(v).unwrap_or(&[]).iter().any(dropped)
            };
            if !(release || marks.has(StackMarks::POOL_KIND)) || !whole() {
                return Ok(FramesId::NONE);
            }
        }
        let err = |m: String, frame_at: Option<u64>| -> Stop {
            entry_err(device, index, m, frame_at.or(at)).into()
        };
        let whose = || format!("device {device}: trace entry {index}");
        self.frames_of(p, v, table, at, (&err, &whose))
    }

    /// Interns the frame list `v` of final segment `i`'s block `j` (when frames are kept).
    fn block_frames(
        &mut self,
        p: &Pickle,
        v: Value,
        table: &mut FrameTable,
        (i, j, at): (usize, usize, Option<u64>),
    ) -> std::result::Result<FramesId, Stop> {
        if !self.keep_frames {
            return Ok(FramesId::NONE);
        }
        let err = |m: String, frame_at: Option<u64>| -> Stop {
            schema_err(format!("segment {i}: block {j}: {m}"), frame_at.or(at)).into()
        };
        let whose = || format!("segment {i}: block {j}");
        self.frames_of(p, v, table, at, (&err, &whose))
    }

    /// [`Reader::frames`] for any owner of a frame list, whose caller decided to read it: `err`
    /// builds an error about it, `whose` names it.
    fn frames_of(
        &mut self,
        p: &Pickle,
        v: Value,
        table: &mut FrameTable,
        at: Option<u64>,
        (err, whose): Owner<'_>,
    ) -> std::result::Result<FramesId, Stop> {
        let refuse = || Stop::Refused {
            at: at.unwrap_or(0),
            why: format!("{}: its frames refer back to a discarded object", whose()),
        };
        let key = match v {
            Value::List(id) | Value::Tuple(id) => id as usize,
            Value::None => return Ok(FramesId::NONE),
            Value::Handle(h) if h & FRAME_HANDLE == 0 => return Ok(FramesId(h)),
            Value::Handle(_) | Value::Dropped => return Err(refuse()),
            other => {
                let message = format!("'frames' is {}, not a list", other.a_type_name());
                return Err(err(message, p.offset_of(other)));
            }
        };
        if let Some(&Some(id)) = self.frame_ids.get(key) {
            return Ok(id);
        }
        let items = p.items(v).unwrap_or(&[]);
        // The key is built in a buffer kept between entries: a stack seen before costs its
        // lookup, with no allocation.
        let mut dict_ids = std::mem::take(&mut self.key);
        dict_ids.clear();
        for &f in items {
            match f {
                Value::Dict(d) => dict_ids.push(d as u64),
                Value::Handle(h) if h & FRAME_HANDLE != 0 => {
                    dict_ids.push(HANDLE + (h & !FRAME_HANDLE) as u64)
                }
                Value::Handle(_) | Value::Dropped => return Err(refuse()),
                other => {
                    let message = format!(
                        "a frame is {}, not a dict with filename, line and name",
                        other.a_type_name()
                    );
                    return Err(err(message, byte_of(p, other, v)));
                }
            }
        }
        let id = match self.stacks.get(&dict_ids[..]) {
            Some(&id) => id,
            None => {
                // The list's items come after its opcode, a byte each at least.
                let read = p.offset_of(v).unwrap_or(0).saturating_add(items.len() as u64);
                let allowed =
                    read.saturating_mul(FRAME_BYTES_PER_INPUT_BYTE).max(FRAME_BYTES_FLOOR);
                let mut frames = Vec::with_capacity(items.len().min(4096));
                for &f in items {
                    // Counted before the frame is built, so a long string shared by many frames
                    // is refused before it is copied into them.
                    let size = self.frame_size(p, f) + size_of::<Frame>();
                    self.frame_bytes = self.frame_bytes.saturating_add(size as u64);
                    if self.frame_bytes > allowed {
                        let message = format!(
                            "the stacks' frames would take more than {allowed} bytes, over \
                             {FRAME_BYTES_PER_INPUT_BYTE} for each of the {read} bytes of pickle \
                             read so far (frame lists that repeat long strings)"
                        );
                        return Err(err(message, p.offset_of(v)));
                    }
                    frames.push(self.frame(p, f));
                }
                let id = table.intern(frames);
                self.stacks.insert(dict_ids.clone(), id);
                id
            }
        };
        self.key = dict_ids;
        // Container ids are dense and bounded by the input, so a vector is a safe cache.
        if self.frame_ids.len() <= key {
            self.frame_ids.resize(key + 1, None);
        }
        self.frame_ids[key] = Some(id);
        Ok(id)
    }

    /// What frame list `v` tells ([`StackMarks`]) while frames are not kept: frames that are
    /// not kept are not decoded, yet the recording's maker must be known, and a stack that tells
    /// a private pool's kind is kept. PyTorch shares one dict per distinct frame, so a long
    /// recording costs a look per frame list and a decode of the two names per distinct frame.
    fn stack_marks(&mut self, p: &Pickle, v: Value) -> StackMarks {
        let list = match v {
            Value::List(i) | Value::Tuple(i) => Some(i as usize),
            _ => None,
        };
        if let Some(&m) = list.and_then(|i| self.list_marks.get(i)) {
            if m.has(StackMarks::LOOKED) {
                return m;
            }
        }
        let Some(items) = p.items(v) else { return StackMarks::default() };
        let mut marks = StackMarks(StackMarks::LOOKED);
        for &f in items {
            marks.0 |= match f {
                Value::Dict(d) => self.dict_marks(p, f, d as usize),
                Value::Handle(h) if h & FRAME_HANDLE != 0 => {
                    let frame = self.handles.get((h & !FRAME_HANDLE) as usize);
                    frame.map_or(StackMarks::default(), |f| StackMarks::of(&f.name, &f.filename))
                }
                _ => StackMarks::default(),
            }
            .0;
        }
        if let Some(i) = list {
            set_mark(&mut self.list_marks, i, marks);
        }
        marks
    }

    /// What frame dict `f` (dict id `d`) tells, looked at once.
    fn dict_marks(&mut self, p: &Pickle, f: Value, d: usize) -> StackMarks {
        if let Some(&m) = self.dict_marks.get(d) {
            if m.has(StackMarks::LOOKED) {
                return m;
            }
        }
        // A name longer than a path can be (PATH_MAX) names no file or function looked for, and
        // is not decoded: one long name shared by every frame would cost its length per frame.
        let text = |key: &[u8]| {
            let (_, x) = p.entries(f)?.iter().find(|&&(k, _)| p.str_bytes(k) == Some(key))?;
            let bytes = p.str_bytes(*x).filter(|n| n.len() <= 4096)?;
            Some(String::from_utf8_lossy(bytes))
        };
        let (name, filename) = (text(b"name"), text(b"filename"));
        let marks =
            StackMarks::of(name.as_deref().unwrap_or(""), filename.as_deref().unwrap_or(""));
        set_mark(&mut self.dict_marks, d, marks);
        marks
    }

    /// The bytes of the strings of frame `f` ([`Self::frame`]) without building it.
    fn frame_size(&self, p: &Pickle, f: Value) -> usize {
        match f {
            Value::Dict(_) => p
                .entries(f)
                .unwrap_or(&[])
                .iter()
                .filter(|(k, _)| matches!(p.str_bytes(*k), Some(b"filename" | b"name")))
                .map(|&(_, x)| p.str_bytes(x).map_or(0, |s| limits::frame_string_len(s.len())))
                .sum(),
            Value::Handle(h) => self
                .handles
                .get((h & !FRAME_HANDLE) as usize)
                .map_or(0, |f| f.filename.len() + f.name.len()),
            _ => 0,
        }
    }

    /// One frame dict (or frame handle) as a [`Frame`], decoded once per dict object; the
    /// caller has checked that `f` is one.
    fn frame(&mut self, p: &Pickle, f: Value) -> Frame {
        let empty = || Frame { filename: String::new(), line: 0, name: String::new() };
        let key = match f {
            Value::Dict(key) => key as usize,
            Value::Handle(h) => {
                return self
                    .handles
                    .get((h & !FRAME_HANDLE) as usize)
                    .cloned()
                    .unwrap_or_else(empty)
            }
            _ => return empty(),
        };
        if let Some(Some(frame)) = self.frame_cache.get(key) {
            return frame.clone();
        }
        let mut frame = empty();
        for &(k, x) in p.entries(f).unwrap_or(&[]) {
            let Some(k) = p.str_bytes(k) else { continue };
            match k {
                b"filename" => {
                    frame.filename = p.str_bytes(x).map(limits::frame_string).unwrap_or_default()
                }
                b"name" => {
                    frame.name = p.str_bytes(x).map(limits::frame_string).unwrap_or_default()
                }
                b"line" => {
                    frame.line = p.int(x).and_then(|l| u32::try_from(l).ok()).unwrap_or_default()
                }
                _ => {}
            }
        }
        if self.frame_cache.len() <= key {
            self.frame_cache.resize(key + 1, None);
        }
        self.frame_cache[key] = Some(frame.clone());
        frame
    }
}

/// What a frame, or a frame list, tells the reader that keeps no frames
/// ([`Reader::stack_marks`]): bits, [`StackMarks::LOOKED`] set once it has been looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StackMarks(u8);

impl StackMarks {
    /// Looked at (an unset cache slot is not).
    const LOOKED: u8 = 1;
    /// Names a file of torch_npu ([`Trace::torch_npu`]).
    const TORCH_NPU: u8 = 2;
    /// Tells a private pool's kind ([`super::tells_pool_kind`]).
    const POOL_KIND: u8 = 4;

    /// What a frame named `name` in `filename` tells.
    fn of(name: &str, filename: &str) -> StackMarks {
        let mut marks = Self::LOOKED;
        if crate::trace::frames::is_torch_npu_file(filename) {
            marks |= Self::TORCH_NPU;
        }
        if super::tells_pool_kind(name, filename) {
            marks |= Self::POOL_KIND;
        }
        StackMarks(marks)
    }

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// Caches `marks` at container id `i` (ids are dense and bounded by the input).
fn set_mark(cache: &mut Vec<StackMarks>, i: usize, marks: StackMarks) {
    if cache.len() <= i {
        cache.resize(i + 1, StackMarks::default());
    }
    cache[i] = marks;
}

/// A size or address field: a present integer in `0..=2^60` (an address: `0..2^64`). The
/// [limits](super::limits) check the range it makes with its size once the event is built.
#[inline]
fn bytes_field(p: &Pickle, key: &str, v: Option<Value>) -> Result<u64, String> {
    let Some(v) = v else { return Err(format!("has no '{key}'")) };
    // The common case first: a small non-negative int, in range as a size and as an address.
    if let Value::Int(n @ 0..=MAX_BYTES_I64) = v {
        return Ok(n as u64);
    }
    let is_addr = matches!(key, "addr" | "address");
    match p.int(v) {
        Some(n) if is_addr && (0..=u64::MAX as i128).contains(&n) => Ok(n as u64),
        Some(n) if is_addr => Err(format!("'{key}' is {n}, outside 0..2^64")),
        Some(n) if (0..=MAX_BYTES).contains(&n) => Ok(n as u64),
        Some(n) => Err(format!("'{key}' is {n}, outside 0..=2^60")),
        None => Err(format!("'{key}' is {}, not an integer", v.a_type_name())),
    }
}

/// [`MAX_BYTES`] as an `i64`.
const MAX_BYTES_I64: i64 = MAX_BYTES as i64;

/// Interns the stacks the final segments `v` record for their blocks (each block's `frames`:
/// the allocation that last used it) into `trace.frames`, by device and block address; the
/// segments are already read ([`read_segments`] checked their shape).
fn read_block_frames(
    p: &Pickle,
    v: Value,
    reader: &mut Reader,
    trace: &mut Trace,
) -> std::result::Result<(), Stop> {
    let segments = p.items(v).unwrap_or(&[]);
    for ((i, &s), segment) in segments.iter().enumerate().zip(&trace.segments) {
        let Some(blocks) = p.get(s, "blocks").and_then(|b| p.items(b)) else { continue };
        for ((j, &b), block) in blocks.iter().enumerate().zip(&segment.blocks) {
            let Some(f) = p.get(b, "frames") else { continue };
            let id = reader.block_frames(p, f, &mut trace.frames, (i, j, byte_of(p, b, s)))?;
            trace.frames.set_block(segment.device, block.address, id);
        }
    }
    Ok(())
}

/// Reads the segment list `v`, which `root` holds (or is, in a legacy snapshot).
fn read_segments(p: &Pickle, v: Value, root: Value) -> Result<Vec<Segment>> {
    let items = p.items(v).ok_or_else(|| {
        schema_err(format!("'segments' is {}, not a list", v.a_type_name()), byte_of(p, v, root))
    })?;
    let mut out = Vec::with_capacity(items.len().min(1 << 16));
    // Every segment and block a snapshot lists is an object of its own. A pickle can name one
    // object many times (a back-reference costs two bytes), which would make a few kilobytes
    // into billions of blocks: a dict seen twice is refused before its copy is built.
    let mut seen = DictsSeen::default();
    for (i, &s) in items.iter().enumerate() {
        let at = byte_of(p, s, v);
        let err = |m: String| schema_err(format!("segment {i}: {m}"), at);
        if p.entries(s).is_none() {
            return Err(err(format!("is {}, not a dict", s.a_type_name())));
        }
        seen.first_time(s, i).map_err(|k| err(format!("is the dict of segment {k} again")))?;
        let address = bytes_field(p, "address", p.get(s, "address")).map_err(err)?;
        let device = match p.get(s, "device") {
            None => 0,
            Some(d) => p
                .int(d)
                .and_then(|d| i32::try_from(d).ok())
                .ok_or_else(|| err(not_int(p, "device", d, "a device index")))?,
        };
        let stream = match p.get(s, "stream") {
            None => 0,
            Some(x) => p
                .int(x)
                .and_then(|x| u64::try_from(x).ok())
                .ok_or_else(|| err(not_int(p, "stream", x, "a cudaStream_t value")))?,
        };
        let is_expandable = matches!(p.get(s, "is_expandable"), Some(Value::Bool(true)));
        let private_pool = match p.get(s, "segment_pool_id") {
            None | Some(Value::None) => None,
            Some(v) => pool_id(p, v).map_err(|m| err(format!("'segment_pool_id' {m}")))?,
        };
        let mut blocks = Vec::new();
        let mut next = address;
        if let Some(bv) = p.get(s, "blocks") {
            let bitems = p.items(bv).ok_or_else(|| {
                let message = format!("segment {i}: 'blocks' is {}, not a list", bv.a_type_name());
                schema_err(message, byte_of(p, bv, s))
            })?;
            for (j, &b) in bitems.iter().enumerate() {
                let bat = byte_of(p, b, bv);
                let berr = |m: String| schema_err(format!("segment {i}: block {j}: {m}"), bat);
                if p.entries(b).is_none() {
                    return Err(berr(format!("is {}, not a dict", b.a_type_name())));
                }
                let again = |k| berr(format!("is a block dict segment {k} listed before"));
                seen.first_time(b, i).map_err(again)?;
                let size = bytes_field(p, "size", p.get(b, "size")).map_err(berr)?;
                let address = match p.get(b, "address") {
                    Some(a) => bytes_field(p, "address", Some(a)).map_err(berr)?,
                    None => next, // 2.0-era block: segment address + earlier sizes
                };
                limits::check_range(address, size).map_err(berr)?;
                next = address.saturating_add(size);
                let requested_size = match p.get(b, "requested_size") {
                    Some(r) => bytes_field(p, "requested_size", Some(r)).map_err(berr)?,
                    None => legacy_requested(p, b).unwrap_or(size),
                };
                let state = match p.get(b, "state") {
                    Some(st) if p.is_str(st, "active_allocated") => BlockState::ActiveAllocated,
                    Some(st) if p.is_str(st, "active_pending_free") => BlockState::ActivePendingFree,
                    // The memory.py docstring's spelling of the same state.
                    Some(st) if p.is_str(st, "active_awaiting_free") => BlockState::ActivePendingFree,
                    Some(st) if p.is_str(st, "inactive") => BlockState::Inactive,
                    Some(st) => {
                        return Err(berr(format!(
                            "unknown state {} (accepted: active_allocated, active_pending_free, inactive)",
                            describe(p, st)
                        )))
                    }
                    None => return Err(berr("has no 'state'".into())),
                };
                blocks.push(Block { address, size, requested_size, state });
            }
        }
        let total_size = match p.get(s, "total_size") {
            Some(t) => bytes_field(p, "total_size", Some(t)).map_err(err)?,
            None => blocks.iter().fold(0u64, |sum, b| sum.saturating_add(b.size)),
        };
        let pool = match p.get(s, "segment_type") {
            Some(t) if p.is_str(t, "small") => PoolKind::Small,
            Some(t) if p.is_str(t, "large") => PoolKind::Large,
            Some(t) => {
                return Err(err(format!(
                    "unknown segment_type {} (accepted: small, large)",
                    describe(p, t)
                )))
            }
            None if total_size == SMALL_SEGMENT => PoolKind::Small,
            None => PoolKind::Large,
        };
        let segment = Segment {
            device,
            address,
            total_size,
            stream,
            pool,
            is_expandable,
            private_pool,
            blocks,
        };
        limits::check_segment(&segment).map_err(err)?;
        out.push(segment);
    }
    limits::check_segments_apart(&out).map_err(|m| schema_err(m, byte_of(p, v, root)))?;
    Ok(out)
}

/// The segment and block dicts read so far, by their place in the pickle's dict arena, each
/// with the segment that listed it.
#[derive(Default)]
struct DictsSeen {
    by_id: HashMap<u32, usize>,
}

impl DictsSeen {
    /// Notes `v` (a dict) as listed by segment `segment`; `Err` holds the segment that listed
    /// it before.
    fn first_time(&mut self, v: Value, segment: usize) -> std::result::Result<(), usize> {
        let Value::Dict(id) = v else { return Ok(()) };
        match self.by_id.insert(id, segment) {
            Some(k) => Err(k),
            None => Ok(()),
        }
    }
}

/// A 2.0-era block's request size: `history[0].real_size`.
fn legacy_requested(p: &Pickle, block: Value) -> Option<u64> {
    let history = p.items(p.get(block, "history")?)?;
    let real = p.int(p.get(*history.first()?, "real_size")?)?;
    u64::try_from(real).ok()
}

/// A value for an error message, as Python would write it: a number or `None`, `True`, `False`
/// as itself, a string quoted ([`quoted`]: escaped and cut short), anything else by its type
/// ("a list"). Never the reader's own form of the value (a string's index in its table).
fn describe(p: &Pickle, v: Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if b { "True" } else { "False" }.into(),
        Value::HugeInt => "an int wider than 128 bits".into(),
        Value::Float(f) => python_float(f),
        Value::Str(_) | Value::Bytes(_) => match p.str_bytes(v) {
            Some(b) => quoted(&String::from_utf8_lossy(b)),
            None => v.a_type_name().into(),
        },
        _ => match p.int(v) {
            Some(n) => n.to_string(),
            None => v.a_type_name().into(),
        },
    }
}

/// `f` as Python's `repr` writes it (`1.5`, `nan`, `inf`, `-inf`).
fn python_float(f: f64) -> String {
    match f {
        f if f.is_nan() => "nan".into(),
        f if f.is_infinite() => if f > 0.0 { "inf" } else { "-inf" }.into(),
        f => format!("{f:?}"),
    }
}

/// Why `v`, the value of `key`, is not `what` (an integer in some range, "a cudaStream_t
/// value"): an int as its value (`'stream' is 18446744073709551616, not a cudaStream_t value`),
/// anything else by its type and value (`'stream' is a str ('x'), not an integer`).
fn not_int(p: &Pickle, key: &str, v: Value, what: &str) -> String {
    let shown = describe(p, v);
    if p.int(v).is_some() || v == Value::HugeInt {
        return format!("'{key}' is {shown}, not {what}");
    }
    match v.a_type_name() {
        ty if ty == shown => format!("'{key}' is {ty}, not an integer"),
        ty => format!("'{key}' is {ty} ({shown}), not an integer"),
    }
}

/// The keys of the `allocator_settings` dict `v` that only newer releases write.
fn newer_settings_keys(p: &Pickle, v: Value) -> Vec<String> {
    const NEWER: [&str; 2] = ["max_round_threshold", "max_cached_size"];
    let Some(fields) = p.entries(v) else { return Vec::new() };
    let mut keys: Vec<String> = Vec::new();
    let named = fields.iter().filter_map(|&(k, _)| p.str_bytes(k));
    for n in named.filter_map(|k| NEWER.iter().find(|n| n.as_bytes() == k)) {
        // A forged dict may repeat a key: each is listed once.
        if !keys.iter().any(|k| k == n) {
            keys.push(n.to_string());
        }
    }
    keys
}

/// The pinned host allocator's `host_segments` and `host_traces` (2.14+), read leniently: a
/// shape this reader does not expect is counted as far as it can be, never an error. A size
/// at or past the limit on sizes (`limits::SIZE_LIMIT`) is no size a host held, and is read as
/// not given, so that no total shown is one no machine had.
fn read_host_allocator(p: &Pickle, root: Value, extras: &mut SnapshotExtras) {
    if let Some(segments) = p.get(root, "host_segments") {
        let mut h = HostSegments::default();
        for &s in p.items(segments).unwrap_or(&[]) {
            h.count += 1;
            let int = |key: &str| {
                (p.get(s, key).and_then(|v| p.int(v)).and_then(|x| u64::try_from(x).ok()))
                    .filter(|&x| x < super::limits::SIZE_LIMIT)
            };
            let size = int("size").unwrap_or(0);
            h.reserved = h.reserved.saturating_add(size).min(super::limits::SIZE_LIMIT - 1);
            // A pinned block is allocated or not (a bool); a count of bytes is read as one.
            let allocated = match p.get(s, "allocated") {
                Some(Value::Bool(b)) => u64::from(b) * size,
                _ => int("allocated").unwrap_or(0),
            };
            h.allocated = h.allocated.saturating_add(allocated).min(h.reserved);
        }
        extras.host_segments = Some(h);
    }
    if let Some(traces) = p.get(root, "host_traces") {
        let items = p.items(traces).unwrap_or(&[]);
        // A list of entries, or (as `device_traces`) a list of lists of entries.
        let n = items.iter().map(|&x| p.items(x).map_or(1, |inner| inner.len() as u64)).sum();
        extras.host_trace_entries = Some(n);
    }
}

/// Reads the `allocator_settings` dict `v`, which `root` holds.
fn read_settings(p: &Pickle, v: Value, root: Value) -> Result<AllocatorSettings> {
    let at = byte_of(p, v, root);
    let err = |m: String| schema_err(format!("allocator_settings: {m}"), at);
    if p.entries(v).is_none() {
        return Err(err(format!("is {}, not a dict", v.a_type_name())));
    }
    let mut s = AllocatorSettings { at, ..AllocatorSettings::default() };
    if let Some(c) = p.get(v, "PYTORCH_CUDA_ALLOC_CONF") {
        match c {
            Value::Str(_) => {
                let text = p.text(c).unwrap_or_default();
                if !text.is_empty() {
                    s.conf = Some(text.into_owned());
                }
            }
            Value::None => {}
            other => {
                return Err(err(format!(
                    "'PYTORCH_CUDA_ALLOC_CONF' is {}, not a str",
                    other.a_type_name()
                )))
            }
        }
    }
    if let Some(m) = p.get(v, "max_split_size") {
        s.max_split_size = match p.int(m) {
            Some(-1) => None,
            Some(n) if n >= 0 => Some(u64::try_from(n).unwrap_or(u64::MAX)),
            _ => return Err(err(format!("'max_split_size' is not a size: {}", describe(p, m)))),
        };
    }
    if let Some(g) = p.get(v, "garbage_collection_threshold") {
        s.garbage_collection_threshold = match g {
            Value::Float(f) => f,
            other => match p.int(other) {
                Some(n) => n as f64,
                None => {
                    return Err(err(format!(
                        "'garbage_collection_threshold' is {}, not a float",
                        other.a_type_name()
                    )))
                }
            },
        };
    }
    s.expandable_segments = truthy(p, p.get(v, "expandable_segments"));
    s.release_lock_on_cudamalloc = truthy(p, p.get(v, "release_lock_on_cudamalloc"));
    if let Some(r) = p.get(v, "roundup_power2_divisions") {
        let div = |x: Value| {
            p.int(x).and_then(|n| u64::try_from(n).ok()).ok_or_else(|| {
                err(format!("roundup_power2_divisions: {} is not a count", describe(p, x)))
            })
        };
        if let Some(pairs) = p.entries(r) {
            // {"1": v0, "2": v1, "4": v2, ..., "32768": v15}: keys are interval starts in MiB.
            for &(k, x) in pairs {
                let mib = p
                    .text(k)
                    .and_then(|t| t.parse::<u64>().ok())
                    .filter(|m| m.is_power_of_two() && *m <= 32768)
                    .ok_or_else(|| {
                        err(format!(
                            "roundup_power2_divisions key {} is not a power of two from 1 to 32768",
                            describe(p, k)
                        ))
                    })?;
                s.roundup_power2_divisions[mib.trailing_zeros() as usize] = div(x)?;
            }
        } else if let Some(items) = p.items(r) {
            for (slot, &x) in s.roundup_power2_divisions.iter_mut().zip(items) {
                *slot = div(x)?;
            }
        } else {
            // A single global value (PyTorch ≤ 1.13).
            s.roundup_power2_divisions = [div(r)?; 16];
        }
    }
    Ok(s)
}

fn truthy(p: &Pickle, v: Option<Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => b,
        Some(x) => p.int(x).is_some_and(|n| n != 0),
        None => false,
    }
}

/// Writes `trace` as a snapshot pickle that PyTorch's memory viewer opens.
///
/// Devices go into `device_traces` at their index (missing indices get empty lists); a negative
/// device (host memory, from Kineto) has no place in a CUDA snapshot and is left out. Events keep
/// their frames when the trace has them; times are written only when the trace has real ones.
pub fn write(trace: &Trace, out: &mut impl Write) -> Result<()> {
    let bytes = encode(trace)?;
    out.write_all(&bytes).map_err(Error::from_io)
}

/// What writing `trace` as a snapshot leaves out, one line each (empty when nothing is lost):
/// devices below 0 (host memory) have no place in `device_traces`, and a profiler trace's
/// recorded totals none in a snapshot.
pub(crate) fn losses(trace: &Trace) -> Vec<String> {
    let mut out: Vec<String> = trace
        .devices
        .iter()
        .filter(|d| d.device < 0 && !d.events.is_empty())
        .map(|d| {
            format!(
                "device {} (host memory) has no place in a snapshot's device_traces; its {} events are left out",
                d.device,
                d.events.len()
            )
        })
        .collect();
    out.extend(trace.totals_loss("snapshot", |d| d >= 0));
    out.extend(trace.platform_loss("snapshot"));
    out
}

/// The most device indices a written snapshot may hold (a guard against absurd device numbers).
const MAX_DEVICES: i32 = 4096;

fn encode(trace: &Trace) -> Result<Vec<u8>> {
    let mut e = Encoder::new();
    e.begin_dict();

    e.str("segments");
    e.begin_list();
    for s in &trace.segments {
        write_segment(&mut e, s);
    }
    e.end_list();

    e.str("device_traces");
    let max = trace.devices.iter().map(|d| d.device).max().unwrap_or(-1);
    if max >= MAX_DEVICES {
        return Err(Error::usage(format!(
            "device {max} cannot be written to a snapshot (at most {MAX_DEVICES} devices)"
        )));
    }
    let mut frames_memo: HashMap<FramesId, u32> = HashMap::new();
    let x = &trace.extras;
    // Entries get `internal_metadata` where the file's had it (2.15+): `mallocWithAddress` on
    // the first event of each tagged entry, empty on the rest.
    let tagged: std::collections::HashSet<(i32, u64)> =
        x.malloc_with_address_events.iter().copied().collect();
    e.begin_list();
    for device in 0..=max {
        e.begin_list();
        let mut notes: Vec<&Annotation> =
            x.annotations.iter().filter(|a| a.device == device).collect();
        notes.sort_by_key(|a| a.event);
        let mut notes = notes.into_iter().peekable();
        for d in trace.devices.iter().filter(|d| d.device == device) {
            for (i, ev) in d.events.iter().enumerate() {
                while let Some(a) = notes.next_if(|a| a.event <= i as u64) {
                    write_annotation(&mut e, trace, a, ev.time_us);
                }
                let tag = (x.internal_metadata > 0).then(|| {
                    if tagged.contains(&(device, i as u64)) {
                        "mallocWithAddress"
                    } else {
                        ""
                    }
                });
                write_event(&mut e, trace, ev, tag, &mut frames_memo);
            }
        }
        let last = trace.device(device).and_then(|d| d.events.last()).map_or(0, |ev| ev.time_us);
        for a in notes {
            write_annotation(&mut e, trace, a, last);
        }
        e.end_list();
    }
    e.end_list();

    if let Some(s) = &trace.allocator_settings {
        e.str("allocator_settings");
        write_settings(&mut e, s, &trace.extras.settings_keys);
    }
    e.end_dict();
    Ok(e.finish())
}

fn write_segment(e: &mut Encoder, s: &Segment) {
    let allocated: u64 =
        s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
    let active = s.blocks.iter().filter(|b| b.state != BlockState::Inactive);
    let active_size: u64 = active.clone().map(|b| b.size).sum();
    let requested: u64 = active.map(|b| b.requested_size).sum();
    e.begin_dict();
    e.str("device");
    e.int(s.device as i128);
    e.str("address");
    e.int(s.address as i128);
    e.str("total_size");
    e.int(s.total_size as i128);
    e.str("allocated_size");
    e.int(allocated as i128);
    e.str("active_size");
    e.int(active_size as i128);
    e.str("requested_size");
    e.int(requested as i128);
    e.str("stream");
    e.int(s.stream as i128);
    e.str("segment_type");
    e.str(match s.pool {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
    });
    e.str("segment_pool_id");
    let (a, b) = s.private_pool.unwrap_or((0, 0));
    e.pair(a as i64 as i128, b as i64 as i128);
    e.str("is_expandable");
    e.bool(s.is_expandable);
    e.str("frames");
    e.begin_list();
    e.end_list();
    e.str("blocks");
    e.begin_list();
    for b in &s.blocks {
        e.begin_dict();
        e.str("address");
        e.int(b.address as i128);
        e.str("size");
        e.int(b.size as i128);
        e.str("requested_size");
        e.int(b.requested_size as i128);
        e.str("state");
        e.str(b.state.name());
        e.str("frames");
        e.begin_list();
        e.end_list();
        e.end_dict();
    }
    e.end_list();
    e.end_dict();
}

/// An `annotate` entry (2.14+): `a`'s label on the allocation at its address, at `time_us`
/// (the next entry's time, where the trace has times).
fn write_annotation(e: &mut Encoder, trace: &Trace, a: &Annotation, time_us: i64) {
    e.begin_dict();
    e.str("action");
    e.str("annotate");
    e.str("addr");
    e.int(a.addr as i128);
    e.str("size");
    e.int(0);
    e.str("stream");
    e.int(0);
    if trace.has_times {
        e.str("time_us");
        e.int(time_us as i128);
    }
    e.str("user_metadata");
    e.str(&a.label);
    e.str("frames");
    e.begin_list();
    e.end_list();
    e.end_dict();
}

/// An entry for `ev`; `internal_metadata` written where `tag` is given.
fn write_event(
    e: &mut Encoder,
    trace: &Trace,
    ev: &Event,
    tag: Option<&str>,
    frames_memo: &mut HashMap<FramesId, u32>,
) {
    e.begin_dict();
    e.str("action");
    e.str(ev.action.name());
    e.str(if ev.action == Action::Oom { "device_free" } else { "addr" });
    e.int(ev.addr as i128);
    e.str("size");
    e.int(ev.size as i128);
    e.str("stream");
    e.int(ev.stream as i128);
    if trace.has_times {
        e.str("time_us");
        e.int(ev.time_us as i128);
    }
    if trace.entry_pools.is_some() {
        // As PyTorch pickles a MempoolId_t: two int64s.
        let (a, b) = trace.entry_pool(ev).flatten().unwrap_or((0, 0));
        e.str("pool_id");
        e.pair(a as i64 as i128, b as i64 as i128);
    }
    if let Some(tag) = tag {
        e.str("internal_metadata");
        e.str(tag);
    }
    e.str("frames");
    match frames_memo.get(&ev.frames) {
        Some(&memo) => e.reuse(memo),
        None => {
            let frames = trace.frames.get(ev.frames);
            if !frames.is_empty() {
                frames_memo.insert(ev.frames, e.next_memo());
            }
            e.begin_list();
            for f in frames {
                e.begin_dict();
                e.str("filename");
                e.str(&f.filename);
                e.str("line");
                e.int(f.line as i128);
                e.str("name");
                e.str(&f.name);
                e.end_dict();
            }
            e.end_list();
        }
    }
    e.end_dict();
}

/// Writes the allocator settings `s`, and the newer keys the recording's settings named
/// (`newer`: `max_round_threshold`, `max_cached_size`, 2.13+) with `None` for their values,
/// which fragsim does not keep: the keys are evidence of the release that recorded it
/// (docs/pytorch-model.md#version-evidence), which a written snapshot must not lose.
fn write_settings(e: &mut Encoder, s: &AllocatorSettings, newer: &[String]) {
    e.begin_dict();
    e.str("PYTORCH_CUDA_ALLOC_CONF");
    e.str(s.conf.as_deref().unwrap_or(""));
    e.str("max_split_size");
    e.int(s.max_split_size.map_or(-1, |m| m as i128));
    e.str("garbage_collection_threshold");
    e.float(s.garbage_collection_threshold);
    e.str("expandable_segments");
    e.bool(s.expandable_segments);
    e.str("pinned_num_register_threads");
    e.int(1);
    e.str("release_lock_on_cudamalloc");
    e.bool(s.release_lock_on_cudamalloc);
    e.str("pinned_use_cuda_host_register");
    e.bool(false);
    e.str("roundup_power2_divisions");
    e.begin_dict();
    for (i, &d) in s.roundup_power2_divisions.iter().enumerate() {
        e.str(&(1u64 << i).to_string());
        e.int(d as i128);
    }
    e.end_dict();
    for key in newer {
        e.str(key);
        e.none();
    }
    e.end_dict();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(keep_frames: bool) -> ReadOptions {
        ReadOptions { keep_frames, ..ReadOptions::default() }
    }

    /// A 2.0-era snapshot: no `time_us`, the single `free` action, blocks without `address`.
    fn legacy() -> Vec<u8> {
        let mut e = Encoder::new();
        e.begin_dict();
        e.str("segments");
        e.begin_list();
        e.begin_dict();
        for (k, v) in [("device", 1i128), ("address", 0x100000), ("total_size", 4096)] {
            e.str(k);
            e.int(v);
        }
        e.str("segment_type");
        e.str("small");
        e.str("blocks");
        e.begin_list();
        for (size, state, real) in [(1024, "active_allocated", 1000), (3072, "inactive", 0)] {
            e.begin_dict();
            e.str("size");
            e.int(size);
            e.str("state");
            e.str(state);
            e.str("history");
            e.begin_list();
            e.begin_dict();
            e.str("real_size");
            e.int(real);
            e.end_dict();
            e.end_list();
            e.end_dict();
        }
        e.end_list();
        e.end_dict();
        e.end_list();
        e.str("device_traces");
        e.begin_list();
        e.begin_list();
        e.end_list();
        e.begin_list();
        for (action, addr, size) in [("alloc", 0x100000, 1000), ("free", 0x100000, 1000)] {
            e.begin_dict();
            e.str("action");
            e.str(action);
            e.str("addr");
            e.int(addr);
            e.str("size");
            e.int(size);
            e.str("stream");
            e.int(0);
            e.end_dict();
        }
        e.end_list();
        e.end_list();
        e.end_dict();
        e.finish()
    }

    #[test]
    fn reads_a_2_0_era_snapshot() {
        let t = read(&legacy(), &opts(false)).unwrap();
        assert!(!t.has_times);
        assert_eq!(t.devices.len(), 2);
        assert!(t.devices[0].events.is_empty());
        let ev = &t.devices[1].events;
        // `free` is requested then completed, both at entry index 1.
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0], Event::new(Action::Alloc, 0x100000, 1000, 0, 0));
        assert_eq!(ev[1], Event::new(Action::FreeRequested, 0x100000, 1000, 0, 1));
        assert_eq!(ev[2], Event::new(Action::FreeCompleted, 0x100000, 1000, 0, 1));
        let s = &t.segments[0];
        assert_eq!((s.device, s.pool, s.stream), (1, PoolKind::Small, 0));
        // Block addresses: segment address, then + 1024; request sizes from history.
        assert_eq!(s.blocks[0].address, 0x100000);
        assert_eq!(s.blocks[1].address, 0x100400);
        assert_eq!(s.blocks[0].requested_size, 1000);
        assert_eq!(s.blocks[1].state, BlockState::Inactive);
        assert_eq!(t.allocator_settings, None);
    }

    fn one_entry(fields: &[(&str, i128)], action: &str) -> Vec<u8> {
        entry_with(action, |e| {
            for &(k, v) in fields {
                e.str(k);
                e.int(v);
            }
        })
    }

    /// A snapshot of a good entry, then one of `action` whose other fields `fields` writes.
    fn entry_with(action: &str, fields: impl Fn(&mut Encoder)) -> Vec<u8> {
        let mut e = Encoder::new();
        e.begin_dict();
        e.str("device_traces");
        e.begin_list();
        e.begin_list();
        // A good entry first, so the bad one is entry 1.
        e.begin_dict();
        e.str("action");
        e.str("alloc");
        for k in ["addr", "size", "stream"] {
            e.str(k);
            e.int(512);
        }
        e.end_dict();
        e.begin_dict();
        e.str("action");
        e.str(action);
        fields(&mut e);
        e.end_dict();
        e.end_list();
        e.end_list();
        e.end_dict();
        e.finish()
    }

    #[test]
    fn entries_that_name_their_pool_read_back_as_written() {
        let mb = 1u64 << 20;
        // A `graph_pool_handle()`'s or a MemPool's pool; a capture without a handle makes (n, 0).
        let graph = (0, 1);
        let named = |action, addr, size, pool| Event {
            pool: PoolRef(pool),
            ..Event::new(action, addr, size, 7, 0)
        };
        let mut t = Trace {
            format: Format::PytorchSnapshot,
            devices: vec![DeviceTrace {
                device: 0,
                events: vec![
                    named(Action::SegmentAlloc, 0x20_0000, 2 * mb, 1),
                    named(Action::Alloc, 0x20_0000, mb, 1),
                    named(Action::Alloc, 0x40_0000, mb, 0),
                    named(Action::Oom, 1 << 30, 8 << 30, 2),
                ],
            }],
            entry_pools: Some(vec![graph, (3, 0)]),
            has_times: true,
            ..Trace::default()
        };
        let mut data = Vec::new();
        write(&t, &mut data).unwrap();
        let whole = read(&data, &opts(false)).unwrap();
        let streamed = read_from(&mut &data[..], &opts(false)).unwrap();
        for back in [whole, streamed] {
            assert_eq!(back.entry_pools, t.entry_pools);
            assert_eq!(back.devices[0].events, t.devices[0].events);
            assert_eq!(back.entry_pool(&back.devices[0].events[3]), Some(Some((3, 0))));
        }
        // Entries without `pool_id` (before PyTorch wrote it) name none: `None`, not "all
        // default".
        t.entry_pools = None;
        t.devices[0].events.iter_mut().for_each(|e| e.pool = PoolRef::DEFAULT);
        let mut data = Vec::new();
        write(&t, &mut data).unwrap();
        assert_eq!(read(&data, &opts(false)).unwrap().entry_pools, None);
    }

    /// Without frames kept, the only stacks read are those that decide something: one through
    /// `use_mem_pool` or a graph capture tells a private pool's kind (and a release's says why
    /// it released); an ordinary allocation's is left unread. Whole and streamed alike.
    #[test]
    fn a_stack_telling_a_pool_s_kind_is_read_without_frames() {
        let frame = |filename: &str, name: &str| Frame {
            filename: filename.into(),
            line: 1,
            name: name.into(),
        };
        let mut t = Trace { format: Format::PytorchSnapshot, has_times: true, ..Trace::default() };
        let user = frame("train.py", "step");
        let stacks = [
            vec![user.clone()],
            vec![frame("torch/cuda/memory.py", "use_mem_pool"), user.clone()],
            vec![frame("/usr/lib/torch/cuda/graphs.py", "__enter__"), user.clone()],
            vec![frame("torch/cuda/graphs.py", "capture_begin")],
        ];
        let events = (stacks.iter().enumerate())
            .map(|(i, s)| Event {
                frames: t.frames.intern(s.clone()),
                ..Event::new(Action::Alloc, 0x20_0000 * (i as u64 + 1), 512, 0, i as i64)
            })
            .collect();
        t.devices = vec![DeviceTrace { device: 0, events }];
        let mut data = Vec::new();
        write(&t, &mut data).unwrap();
        let whole = read(&data, &opts(false)).unwrap();
        let streamed = read_from(&mut &data[..], &opts(false)).unwrap();
        for back in [whole, streamed] {
            let read: Vec<&[Frame]> =
                back.devices[0].events.iter().map(|e| back.frames.get(e.frames)).collect();
            assert_eq!(read, [&[][..], &stacks[1][..], &stacks[2][..], &stacks[3][..]]);
            assert_eq!(back.frames.len(), 3);
            assert!(!back.torch_npu);
        }
        assert_eq!(read(&data, &opts(true)).unwrap().frames.len(), 4, "all, where kept");
    }

    /// A file where only some entries name their pool names none the model trusts, and no
    /// event keeps a reference into the table it then does not hold: such a trace converts to
    /// `.fst` and reads back (before, the `.fst` was refused: "private pool 1 does not exist").
    #[test]
    fn a_file_where_some_entries_name_their_pool_names_none() {
        let data = entry_with("alloc", |e| {
            for k in ["addr", "size", "stream"] {
                e.str(k);
                e.int(1024);
            }
            e.str("pool_id");
            e.pair(0, 1);
        });
        for t in
            [read(&data, &opts(false)).unwrap(), read_from(&mut &data[..], &opts(false)).unwrap()]
        {
            assert_eq!(t.entry_pools, None);
            assert!(t.devices[0].events.iter().all(|e| e.pool == PoolRef::DEFAULT));
            let mut fst = Vec::new();
            crate::trace::fst::write(&t, &mut fst).unwrap();
            let back = crate::trace::fst::read(&fst, &opts(false)).unwrap();
            assert_eq!(back.devices[0].events, t.devices[0].events);
        }
    }

    #[test]
    fn a_pool_id_that_is_not_a_pair_of_ints_names_its_entry() {
        let data = one_entry(&[("addr", 512), ("size", 512), ("pool_id", 7)], "alloc");
        let err = read(&data, &opts(false)).unwrap_err().to_string();
        let want = "event 1: device 0: trace entry 1: 'pool_id' is not a pair of ints: ";
        assert!(err.starts_with(want), "{err}");
        let data = entry_with("alloc", |e| {
            for k in ["addr", "size"] {
                e.str(k);
                e.int(512);
            }
            e.str("pool_id");
            e.pair(1 << 64, 0);
        });
        let err = read(&data, &opts(false)).unwrap_err().to_string();
        assert!(
            err.contains("'pool_id' (18446744073709551616, 0) has an id beyond 64 bits"),
            "{err}"
        );
    }

    #[test]
    fn oom_takes_device_free_as_addr_and_annotate_is_skipped() {
        let data = one_entry(&[("device_free", 12345), ("size", 4 << 20), ("stream", 0)], "oom");
        let t = read(&data, &opts(false)).unwrap();
        assert_eq!(t.devices[0].events[1], Event::new(Action::Oom, 12345, 4 << 20, 0, 1));
        let data = one_entry(&[("addr", 512)], "annotate");
        assert_eq!(read(&data, &opts(false)).unwrap().devices[0].events.len(), 1);
        // A `record_function` marker of ≈ 2.4–2.5 (its name is in its frames): no event.
        let data = one_entry(&[("addr", 0), ("size", 0), ("stream", 0)], "user_defined");
        assert_eq!(read(&data, &opts(false)).unwrap().devices[0].events.len(), 1);
        assert_eq!(read_from(&mut &data[..], &opts(false)).unwrap().devices[0].events.len(), 1);
    }

    #[test]
    fn bad_entries_name_device_and_event() {
        for (fields, action, text) in [
            (&[("addr", 1), ("size", 1)][..], "malloc", "unknown action 'malloc'"),
            (&[("addr", 1), ("size", -5)], "alloc", "'size' is -5, outside 0..=2^60"),
            // Addresses use all 64 bits (as Kineto's do), and the range must not wrap.
            (&[("addr", 1 << 64), ("size", 1)], "alloc", "'addr' is 18446744073709551616"),
            (&[("addr", u64::MAX as i128), ("size", 2)], "alloc", "wraps past 2^64"),
            (&[("size", 1)], "alloc", "has no 'addr'"),
            (&[("addr", 1), ("size", 1), ("stream", -1)], "alloc", "'stream'"),
        ] {
            let data = one_entry(fields, action);
            let e = read(&data, &opts(false)).unwrap_err();
            assert_eq!(e.kind(), crate::error::ErrorKind::Input);
            assert_eq!(e.location().place, Some(Place::Event(1)), "{e}");
            assert!(e.to_string().starts_with("event 1: device 0: trace entry 1: "), "{e}");
            assert!(e.to_string().contains(text), "{e}");
            // The place stays the event; the message adds where entry 1's dict is built (the
            // last EMPTY_DICT: no field value here has a 0x7d byte).
            let dict = data.iter().rposition(|&b| b == b'}').unwrap();
            assert!(e.to_string().ends_with(&format!(" (pickle byte {dict})")), "{e}");
        }
    }

    /// A value of the wrong kind is shown as Python would write it, never as the reader's
    /// own form of it (`BigInt(0)`, a string's index `Str(33)`, `Float(NaN)`) (D10).
    #[test]
    fn bad_values_are_shown_as_python_writes_them() {
        let good = |e: &mut Encoder| {
            for k in ["addr", "size"] {
                e.str(k);
                e.int(512);
            }
        };
        type Write<'a> = &'a dyn Fn(&mut Encoder);
        let cases: [(&str, Write, &str); 7] = [
            (
                "stream",
                &|e| e.int(1 << 64),
                "'stream' is 18446744073709551616, not a cudaStream_t value",
            ),
            ("stream", &|e| e.str("0x\u{1b}"), "'stream' is a str ('0x\\x1b'), not an integer"),
            ("stream", &|e| e.float(1.5), "'stream' is a float (1.5), not an integer"),
            ("stream", &|e| e.none(), "'stream' is None, not an integer"),
            ("time_us", &|e| e.int(-5), "'time_us' is -5, not a time in microseconds"),
            ("time_us", &|e| e.float(f64::NAN), "'time_us' is a float (nan), not an integer"),
            (
                "time_us",
                &|e| e.float(f64::NEG_INFINITY),
                "'time_us' is a float (-inf), not an integer",
            ),
        ];
        for (key, value, want) in cases {
            let data = entry_with("alloc", |e| {
                good(e);
                e.str(key);
                value(e);
            });
            let err = read(&data, &opts(false)).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("event 1: device 0: trace entry 1: {want} (pickle byte ")),
                "{err}"
            );
            let streamed = read_from(&mut &data[..], &opts(false)).unwrap_err().to_string();
            assert_eq!(streamed, err);
        }
    }

    #[test]
    fn schema_errors_name_the_byte_of_the_offending_object() {
        // {'segments': [{'address': 0, 'blocks': [<block>]}]}, written opcode by opcode so the
        // offsets are known: the block is a list (its own EMPTY_LIST is the place) or an int
        // (a scalar has no opcode of its own: the place is the blocks list holding it).
        let key = |data: &mut Vec<u8>, k: &str| {
            data.extend_from_slice(&[0x8c, k.len() as u8]);
            data.extend_from_slice(k.as_bytes());
        };
        for (block, text) in [(&b"]"[..], "is a list"), (b"K\x07", "is an int")] {
            let mut data = b"\x80\x04}".to_vec();
            key(&mut data, "segments");
            data.push(b']');
            data.extend_from_slice(b"}(");
            key(&mut data, "address");
            data.extend_from_slice(b"K\x00");
            key(&mut data, "blocks");
            let blocks = data.len();
            data.push(b']');
            let list = data.len();
            data.extend_from_slice(block);
            // APPEND the block, SETITEMS the segment's pairs, APPEND it, SETITEM 'segments'.
            data.extend_from_slice(b"auas.");
            let e = read(&data, &opts(false)).unwrap_err();
            let at = if block == b"]" { list } else { blocks };
            assert_eq!(e.location().place, Some(Place::Byte(at as u64)), "{e}");
            assert_eq!(
                e.to_string(),
                format!("byte {at}: segment 0: block 0: {text}, not a dict"),
                "{data:?}"
            );
        }

        // A device trace entry that is a list keeps its event place and names the byte.
        let mut data = b"\x80\x04}".to_vec();
        key(&mut data, "device_traces");
        data.extend_from_slice(b"]]");
        let entry = data.len();
        data.extend_from_slice(b"]aas.");
        let e = read(&data, &opts(false)).unwrap_err();
        assert_eq!(e.location().place, Some(Place::Event(0)), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "event 0: device 0: trace entry 0: is a list, not a dict (pickle byte {entry})"
            )
        );
    }

    #[test]
    fn partly_timed_traces_use_entry_indices() {
        // Entry 0 has no time_us, entry 1 is an annotate (skipped), entry 2 has time_us 99.
        let mut e = Encoder::new();
        e.begin_dict();
        e.str("device_traces");
        e.begin_list();
        e.begin_list();
        for (action, time) in [("alloc", None), ("annotate", Some(98)), ("free", Some(99))] {
            e.begin_dict();
            e.str("action");
            e.str(action);
            for k in ["addr", "size"] {
                e.str(k);
                e.int(4096);
            }
            if let Some(t) = time {
                e.str("time_us");
                e.int(t);
            }
            e.end_dict();
        }
        e.end_list();
        e.end_list();
        e.end_dict();
        let t = read(&e.finish(), &opts(false)).unwrap();
        assert!(!t.has_times);
        let times: Vec<i64> = t.devices[0].events.iter().map(|e| e.time_us).collect();
        assert_eq!(times, [0, 2, 2]);
    }

    #[test]
    fn settings_map_onto_the_model() {
        let mut e = Encoder::new();
        e.begin_dict();
        e.str("segments");
        e.begin_list();
        e.end_list();
        e.str("allocator_settings");
        e.begin_dict();
        e.str("PYTORCH_CUDA_ALLOC_CONF");
        e.str("max_split_size_mb:64,roundup_power2_divisions:[256:8,>:2]");
        e.str("max_split_size");
        e.int(64 << 20);
        e.str("garbage_collection_threshold");
        e.float(0.6);
        e.str("expandable_segments");
        e.bool(true);
        e.str("roundup_power2_divisions");
        e.begin_dict();
        for (k, v) in [("1", 8), ("256", 8), ("512", 2), ("32768", 2)] {
            e.str(k);
            e.int(v);
        }
        e.end_dict();
        e.end_dict();
        e.end_dict();
        let t = read(&e.finish(), &opts(false)).unwrap();
        let s = t.allocator_settings.unwrap();
        assert_eq!(
            s.conf.as_deref(),
            Some("max_split_size_mb:64,roundup_power2_divisions:[256:8,>:2]")
        );
        assert_eq!(s.max_split_size, Some(64 << 20));
        assert_eq!(s.garbage_collection_threshold, 0.6);
        assert!(s.expandable_segments && !s.release_lock_on_cudamalloc);
        let mut want = [0; 16];
        (want[0], want[8], want[9], want[15]) = (8, 8, 2, 2);
        assert_eq!(s.roundup_power2_divisions, want);
    }

    #[test]
    fn a_bare_list_is_a_legacy_segment_list() {
        let mut e = Encoder::new();
        e.begin_list();
        e.begin_dict();
        for (k, v) in [("device", 0i128), ("address", 4096), ("total_size", 20 << 20)] {
            e.str(k);
            e.int(v);
        }
        e.end_dict();
        e.end_list();
        let t = read(&e.finish(), &opts(false)).unwrap();
        assert_eq!(t.segments.len(), 1);
        assert_eq!(t.segments[0].pool, PoolKind::Large);
        assert_eq!(t.devices.len(), 1);
        assert!(t.devices[0].events.is_empty());
    }

    #[test]
    fn not_a_snapshot() {
        for (data, text) in [
            (&b"\x80\x04N."[..], "holds None"),
            (b"\x80\x04}.", "neither 'segments' nor 'device_traces'"),
        ] {
            let e = read(data, &opts(false)).unwrap_err();
            assert!(e.to_string().contains(text), "{e}");
        }
    }
}
