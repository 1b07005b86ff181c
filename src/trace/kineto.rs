//! PyTorch profiler (Kineto) Chrome traces with memory events: reading and writing.
//!
//! `torch.profiler.profile(profile_memory=True)` exports a Chrome trace (`{"traceEvents": [...]}`,
//! or a bare array) in which every allocator call is an instant event named `[memory]`
//! (Kineto's `libkineto/src/output_json.cpp`, fed by PyTorch's `reportMemoryUsage`):
//!
//! ```text
//! {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 2,
//!  "ts": 1669783687464300, "args": {"Device Type": 1, "Device Id": 1, "Addr": 139926520725504,
//!  "Bytes": 5242880, "Total Allocated": 5435638784, "Total Reserved": 12782141440}}
//! ```
//!
//! - `Bytes` > 0 is an allocation, < 0 a free of `|Bytes|`; `Device Type` 0 is host (CPU)
//!   memory, which fragsim files as device -1; other types (CUDA's 1, ROCm's 6: c10's `HIP`)
//!   are GPUs and keep their `Device Id`. Type 6 shows the recording was made on ROCm
//!   ([`Platform::RocmDeviceType`]); so do ROCm's `deviceProperties` (Kineto writes
//!   `maxSharedMemoryPerMultiProcessor` for a ROCm GPU, `regsPerMultiprocessor` and
//!   `sharedMemPer*` for a CUDA one: [`Platform`]). Type 1 alone shows nothing: a ROCm build
//!   that reports its memory as CUDA's would write it too.
//! - `ts` is in microseconds (an integer or a float). Events come from several threads and are
//!   written per thread, so the reader sorts them by `ts` (stable: ties keep file order).
//! - Kineto records no streams (stream 0 here), no segment events and no `free_requested`: a free
//!   becomes [`Action::FreeCompleted`], so every free is one event.
//! - `Total Allocated` and `Total Reserved` are the real allocator's own counters after the event
//!   (PyTorch's `allocated_bytes` and `reserved_bytes`); they are kept in
//!   [`Trace::recorded_totals`] when every event of a device has both as non-negative integers.
//! - Where the addresses and those totals show that some requests were made into a pool of their
//!   own (a CUDA graph's), the reader names it in those events, as an inferred private pool
//!   ([`crate::trace::kineto_segments::infer_pools`]).
//!
//! The file is large (tens of MB unzipped, almost all of it kernels and operators), so the
//! reader streams it and deserialises each event into a small struct that only looks at `name`,
//! `ts` and `args`, skipping everything else without building a JSON tree or holding the file.

use super::lifetimes::free_action;
use super::limits;
use super::{
    Action, DeviceTotals, DeviceTrace, Event, Format, Platform, ReadOptions, RecordedTotals, Trace,
};
use crate::error::{Error, Place, Result};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::io::{BufRead, Write};

/// Kineto's `Device Type` for host memory (c10::DeviceType::CPU).
const DEVICE_TYPE_CPU: u64 = 0;
/// Kineto's `Device Type` for CUDA memory (c10::DeviceType::CUDA).
const DEVICE_TYPE_CUDA: u64 = 1;
/// Kineto's `Device Type` for memory of a ROCm build's GPU (c10::DeviceType::HIP).
const DEVICE_TYPE_HIP: u64 = 6;
/// Why a `[memory]` event without `Addr` cannot be replayed: 2021-era traces (PyTorch before
/// 1.10, whose Kineto memory events carry only `Bytes`, `Device Type` and `Device Id`; `Addr`
/// and the totals came with pytorch/pytorch#61282).
const MISSING_ADDR: &str = "missing 'Addr': this [memory] event records no block address, as \
     PyTorch's profiler wrote them before 1.10 (2021: only Bytes, Device Type and Device Id); fragsim needs the \
     address to tell which allocation each free releases, and the totals to know what was live \
     and reserved; PyTorch 1.10 and later record Addr, Total Allocated and Total Reserved \
     (torch.profiler.profile(profile_memory=True)): record the run again with one of them";
/// The device fragsim files host memory under (docs/interface.md).
pub const HOST_DEVICE: i32 = -1;

/// Reads a Kineto trace held in memory.
pub fn read(data: &[u8], options: &ReadOptions) -> Result<Trace> {
    read_from(&mut &data[..], options)
}

/// Reads a Kineto trace from a stream: memory is the `[memory]` events and serde_json's
/// buffer, whatever else the file holds.
pub(crate) fn read_from(input: &mut dyn BufRead, _options: &ReadOptions) -> Result<Trace> {
    // A byte order mark is skipped. The first buffer holds at least its three bytes whenever
    // the stream does: the file reader hands over the 64 KiB it detected the format from.
    if input.fill_buf().map_err(Error::from_io)?.starts_with(b"\xef\xbb\xbf") {
        input.consume(3);
    }
    let mut found = Vec::new();
    let mut props = PropsSeen::default();
    let saw_events = parse_stream(input, &mut found, &mut props)?;
    if !saw_events {
        return Err(Error::input(
            "no 'traceEvents' list: not a Chrome trace (expected {\"traceEvents\": [...]} or a bare array)",
        )
        .at(Place::Byte(0)));
    }
    // Events from several threads interleave: order by time; a stable sort keeps file order
    // among equal times.
    found.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let platform = props.platform(found.iter().any(|f| f.hip));
    let mut trace = Trace { format: Format::Kineto, has_times: true, platform, ..Trace::default() };
    // Per device (parallel to `trace.devices`): the totals, or `None` once an event lacks them.
    let mut totals: Vec<Option<Vec<RecordedTotals>>> = Vec::new();
    for m in found {
        let i = match trace.devices.binary_search_by_key(&m.device, |d| d.device) {
            Ok(i) => i,
            Err(i) => {
                trace.devices.insert(i, DeviceTrace { device: m.device, events: Vec::new() });
                totals.insert(i, Some(Vec::new()));
                i
            }
        };
        trace.devices[i].events.push(m.event);
        totals[i] = totals[i].take().and_then(|mut t| {
            t.push(m.totals?);
            Some(t)
        });
    }
    trace.recorded_totals = trace
        .devices
        .iter()
        .zip(totals)
        .filter_map(|(d, t)| Some(DeviceTotals { device: d.device, totals: t? }))
        .collect();
    // Which requests were made into a pool of their own, as their addresses and the recorded
    // reserve show it (docs/pytorch-model.md#kineto-addresses).
    let mut groups = 0;
    for t in &trace.recorded_totals {
        let host = t.device == HOST_DEVICE;
        if let Some(d) = trace.devices.iter_mut().find(|d| d.device == t.device && !host) {
            groups =
                groups.max(crate::trace::kineto_segments::infer_pools(&mut d.events, &t.totals));
        }
    }
    if groups > 0 {
        trace.entry_pools = Some(crate::trace::kineto_segments::inferred_pools(groups));
    }
    Ok(trace)
}

/// Writes `trace` as a Chrome trace holding one `[memory]` event per allocation and free.
///
/// Only allocations and frees (at the action where the trace's frees take effect, see
/// [`free_action`]) exist in Kineto's vocabulary; segment, `oom` and `snapshot` events are left
/// out (see [`losses`]). `Total Allocated` and `Total Reserved` are written only where the trace
/// records them for every event of the device ([`Trace::totals_of`]): they are the real
/// allocator's figures, which a reader shows as the recorded run, so none are made up (a
/// snapshot records its reserve but not the bytes of its blocks; a text trace neither); read
/// back, such a device has no recorded totals. Times that go
/// backwards within a device are written as the previous time, so that reading the file back
/// (which sorts by `ts`) keeps the order of events.
pub(crate) fn write(trace: &Trace, out: &mut impl Write) -> Result<()> {
    let io = Error::from_io;
    write!(out, "{{\"schemaVersion\": 1, \"profile_memory\": 1, \"traceEvents\": [").map_err(io)?;
    let mut first = true;
    for d in &trace.devices {
        let frees = free_action(&d.events);
        // A ROCm recording's GPU memory is written as ROCm builds write it (Device Type 6), so
        // that reading the file back shows the platform again.
        let gpu_type = match trace.platform {
            Some(p) if p.is_rocm() => DEVICE_TYPE_HIP,
            _ => DEVICE_TYPE_CUDA,
        };
        let (device_type, device_id) =
            if d.device == HOST_DEVICE { (DEVICE_TYPE_CPU, -1) } else { (gpu_type, d.device) };
        let mut last_ts = i64::MIN;
        let recorded = trace.totals_of(d.device);
        for (i, e) in d.events.iter().enumerate() {
            let bytes: i128 = match e.action {
                Action::Alloc => e.size as i128,
                a if a == frees => -(e.size as i128),
                _ => continue,
            };
            last_ts = last_ts.max(e.time_us);
            if !first {
                out.write_all(b",").map_err(io)?;
            }
            first = false;
            let totals = match recorded.map(|r| r[i]) {
                Some(t) => format!(
                    ", \"Total Allocated\": {}, \"Total Reserved\": {}",
                    t.allocated, t.reserved
                ),
                None => String::new(),
            };
            write!(
                out,
                "\n  {{\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": \"[memory]\", \
                 \"pid\": 0, \"tid\": 0, \"ts\": {last_ts}, \"args\": {{\"Device Type\": {device_type}, \
                 \"Device Id\": {device_id}, \"Addr\": {}, \"Bytes\": {bytes}{totals}}}}}",
                e.addr
            )
            .map_err(io)?;
        }
    }
    writeln!(out, "\n]}}").map_err(io)
}

/// What writing `trace` as Kineto JSON leaves out, one line each (empty when nothing is lost).
pub(crate) fn losses(trace: &Trace) -> Vec<String> {
    let mut out = Vec::new();
    for d in &trace.devices {
        let frees = free_action(&d.events);
        let dropped =
            d.events.iter().filter(|e| e.action != Action::Alloc && e.action != frees).count();
        if dropped > 0 {
            out.push(format!(
                "device {}: {dropped} events other than alloc and {} are not part of the Kineto format",
                d.device,
                frees.name()
            ));
        }
        let zero = d
            .events
            .iter()
            .filter(|e| e.size == 0 && (e.action == Action::Alloc || e.action == frees))
            .count();
        if zero > 0 {
            out.push(format!(
                "device {}: {zero} zero-byte alloc and free events are left out (Kineto records no zero-byte events)",
                d.device
            ));
        }
        // `write` clamps a time that goes backwards to the one before it.
        let mut last = i64::MIN;
        let earlier = d
            .events
            .iter()
            .filter(|e| e.action == Action::Alloc || e.action == frees)
            .filter(|e| {
                let before = last;
                last = last.max(e.time_us);
                before > e.time_us
            })
            .count();
        if earlier > 0 {
            out.push(format!(
                "device {}: {earlier} events earlier than the one before them are written at its \
                 time (Kineto events are ordered by time)",
                d.device
            ));
        }
        if d.events.iter().any(|e| e.stream != 0) {
            out.push(format!(
                "device {}: Kineto records no streams; all become stream 0",
                d.device
            ));
        }
        let snapshot = trace.source_format() == super::Format::PytorchSnapshot;
        if snapshot && trace.totals_of(d.device).is_none() && !d.events.is_empty() {
            out.push(format!(
                "device {}: no Total Allocated or Total Reserved are written: the snapshot records \
                 its reserved memory (segments) but not the bytes of its blocks, and made-up totals \
                 would read back as the recorded run; a replay of the output shows no recorded row",
                d.device
            ));
        }
    }
    if !trace.segments.is_empty() || trace.allocator_settings.is_some() {
        out.push("final segments and allocator settings are not part of the Kineto format".into());
    }
    // Kineto stamps every event, so read back the trace claims times it never had.
    if !trace.has_times && trace.devices.iter().any(|d| !d.events.is_empty()) {
        out.push(
            "the trace records no times: Kineto needs one on every event, so each event's index \
             is written as its time in microseconds"
                .into(),
        );
    }
    out.extend(trace.entry_pools_loss("Kineto"));
    out
}

/// One `[memory]` event, before events are sorted by time and split by device.
struct Found {
    ts: f64,
    device: i32,
    event: Event,
    /// `Total Allocated` and `Total Reserved`, when both are non-negative integers.
    totals: Option<RecordedTotals>,
    /// The event's `Device Type` is 6 (c10's `HIP`): a ROCm build's GPU memory.
    hip: bool,
}

/// What the trace's `deviceProperties` show of the platform: Kineto writes one object per GPU,
/// with fields of its own for a ROCm build and for a CUDA one (`libkineto/src/DeviceProperties.cpp`).
#[derive(Default)]
struct PropsSeen {
    /// Some GPU has `maxSharedMemoryPerMultiProcessor` (written with roctracer only).
    rocm: bool,
    /// Some GPU has `regsPerMultiprocessor`, `sharedMemPerBlockOptin` or
    /// `sharedMemPerMultiprocessor` (written with CUPTI only).
    cuda: bool,
}

impl PropsSeen {
    /// The platform the trace shows: ROCm where a memory event records HIP's device type
    /// (`hip`), else what the device properties show, ROCm's first.
    fn platform(&self, hip: bool) -> Option<Platform> {
        if hip {
            Some(Platform::RocmDeviceType)
        } else if self.rocm {
            Some(Platform::RocmDeviceProperties)
        } else if self.cuda {
            Some(Platform::CudaDeviceProperties)
        } else {
            None
        }
    }
}

/// Runs the deserializer over the whole input, keeping the `[memory]` events in `found`.
/// Returns whether a list of events was found.
fn parse<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    found: &mut Vec<Found>,
    props: &mut PropsSeen,
) -> serde_json::Result<bool> {
    (&mut de).deserialize_any(RootSeed { out: found, props }).and_then(|saw| de.end().map(|_| saw))
}

/// [`parse`] over a stream, its errors placed where parsing the stream held in memory places them.
fn parse_stream(
    input: &mut dyn BufRead,
    found: &mut Vec<Found>,
    props: &mut PropsSeen,
) -> Result<bool> {
    let mut tracked = Tracked::new(input);
    SKIPPING.with(|s| s.set(false));
    let parsed = parse(serde_json::Deserializer::from_reader(&mut tracked), found, props);
    parsed.map_err(|e| {
        let at = tracked.place_in_memory(&e);
        json_error(e, at)
    })
}

/// Turns a serde_json error into an input error at `(line, column)` (line 0: no place).
fn json_error(e: serde_json::Error, (line, column): (usize, usize)) -> Error {
    let text = e.to_string();
    let message = match text.rsplit_once(" at line ") {
        Some((m, _)) if line > 0 => format!("{m} (column {column})"),
        _ => text,
    };
    let message = if e.is_eof() { format!("truncated JSON: {message}") } else { message };
    let err = Error::input(message);
    if line > 0 {
        err.at(Place::Line(line as u64))
    } else {
        err
    }
}

/// The stream serde_json reads, byte by byte, knowing the lengths of the last lines it handed
/// out: so that an error names the place serde_json names when it parses the file in memory.
///
/// Reading a stream, serde_json counts the byte it looked ahead at, and for a few errors its
/// column is one byte past where its in-memory parser puts it ([`Tracked::place_in_memory`]).
struct Tracked<'a> {
    input: &'a mut dyn BufRead,
    /// The line (1-based) and column (bytes since the line began) after the bytes handed out.
    line: usize,
    column: usize,
    /// The lengths (without the `\n`) of the last [`Tracked::KEPT`] lines before `line`.
    lengths: std::collections::VecDeque<usize>,
    /// The last byte handed out, and whether the input has ended.
    last: Option<u8>,
    ended: bool,
    /// Bytes read from `input` and not yet handed out from `next` on.
    buffer: Vec<u8>,
    next: usize,
}

impl<'a> Tracked<'a> {
    /// Line lengths kept: after an error, serde_json reads on through white space (and a comma)
    /// before it reports; more blank lines than this leave serde_json's own place.
    const KEPT: usize = 1024;
    /// The most read from `input` at once.
    const BUFFER: usize = 64 << 10;

    fn new(input: &'a mut dyn BufRead) -> Self {
        let lengths = std::collections::VecDeque::new();
        let (buffer, next) = (Vec::new(), 0);
        Tracked { input, line: 1, column: 0, lengths, last: None, ended: false, buffer, next }
    }

    /// Where serde_json's in-memory parser places error `e` (line 0: no place).
    ///
    /// The errors for which serde_json's stream reader counts one byte more than its in-memory
    /// reader: a control character in a skipped string (taken, not looked at), and a map, or a number
    /// that more input follows (looked ahead at), where the top level or `traceEvents` needs a
    /// list. The tests check this against the in-memory parser byte by byte.
    fn place_in_memory(&self, e: &serde_json::Error) -> (usize, usize) {
        let (line, column) = (e.line(), e.column());
        let text = e.to_string();
        let not_a_list = text.contains(ROOT_EXPECTED) || text.contains(LIST_EXPECTED);
        let number = text.starts_with("invalid type: integer")
            || text.starts_with("invalid type: floating point");
        // A number at the end of the input: nothing was looked ahead at.
        let number_ended = self.ended
            && (line, column) == (self.line, self.column)
            && self.last.is_some_and(|b| b.is_ascii_digit());
        let skipped = SKIPPING.with(|s| s.get());
        let one_past = (skipped && text.starts_with("control character"))
            || (not_a_list && text.starts_with("invalid type: map"))
            || (not_a_list && number && !number_ended);
        if !one_past || line == 0 || line > self.line {
            return (line, column);
        }
        if column > 0 {
            return (line, column - 1);
        }
        // One byte back from the start of a line is the end of the line before.
        match self.lengths.len().checked_sub(self.line - line + 1) {
            Some(i) => (line - 1, self.lengths[i]),
            None => (line, column),
        }
    }
}

impl std::io::Read for Tracked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // serde_json asks for one byte at a time: served from a buffer of its own, so a byte
        // costs an index, not calls through the `dyn BufRead`.
        if self.next == self.buffer.len() {
            let available = self.input.fill_buf()?;
            let n = available.len().min(Self::BUFFER);
            self.buffer.clear();
            self.buffer.extend_from_slice(&available[..n]);
            self.input.consume(n);
            self.next = 0;
            if n == 0 {
                self.ended = !buf.is_empty();
                return Ok(0);
            }
        }
        let n = (self.buffer.len() - self.next).min(buf.len());
        buf[..n].copy_from_slice(&self.buffer[self.next..self.next + n]);
        self.next += n;
        for &b in &buf[..n] {
            if b == b'\n' {
                if self.lengths.len() == Self::KEPT {
                    self.lengths.pop_front();
                }
                self.lengths.push_back(self.column);
                self.line += 1;
                self.column = 0;
            } else {
                self.column += 1;
            }
        }
        if n > 0 {
            self.last = Some(buf[n - 1]);
        }
        Ok(n)
    }
}

thread_local! {
    /// Whether the value being read is skipped (its strings are not validated): set by
    /// [`skipping`], left set by a failure inside the skip, for [`Tracked::place_in_memory`].
    static SKIPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `skip`, which skips a value, noting that a failure came from inside a skipped value.
fn skipping<T, E>(skip: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    SKIPPING.with(|s| s.set(true));
    let done = skip()?;
    SKIPPING.with(|s| s.set(false));
    Ok(done)
}

/// What the top level must be, and what `traceEvents` must be.
const ROOT_EXPECTED: &str = "a Chrome trace object or an array of trace events";
const LIST_EXPECTED: &str = "a list of trace events";

/// The top level: `{"traceEvents": [...], ...}` or a bare array of events, visited by the
/// deserializer's `deserialize_any`. Yields whether a list of events was found.
struct RootSeed<'o> {
    out: &'o mut Vec<Found>,
    props: &'o mut PropsSeen,
}

impl<'de> Visitor<'de> for RootSeed<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(ROOT_EXPECTED)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        EventsSeed { out: self.out }.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut saw = false;
        while let Some(key) = map.next_key::<Key>()? {
            if key.0 == "traceEvents" && !saw {
                saw = map.next_value_seed(EventsSeed { out: &mut *self.out })?;
            } else if key.0 == "deviceProperties" {
                map.next_value_seed(PropsSeed { seen: &mut *self.props })?;
            } else {
                skipping(|| map.next_value::<IgnoredAny>())?;
            }
        }
        Ok(saw)
    }
}

/// The map keys the reader looks at; any other key is read as "" (skipped).
const KEYS: [&str; 15] = [
    "traceEvents",
    "name",
    "ts",
    "args",
    "Addr",
    "Bytes",
    "Device Type",
    "Device Id",
    "Total Allocated",
    "Total Reserved",
    // The device properties' keys last: they are looked at once a trace, the others per event.
    "deviceProperties",
    "maxSharedMemoryPerMultiProcessor",
    "regsPerMultiprocessor",
    "sharedMemPerBlockOptin",
    "sharedMemPerMultiprocessor",
];

/// A map key: one of [`KEYS`], or "" for any other, so reading keys allocates nothing.
struct Key(&'static str);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(KEYS.iter().find(|k| **k == v).copied().unwrap_or("")))
            }
        }
        d.deserialize_str(V)
    }
}

/// The `traceEvents` list: keeps the `[memory]` events, skips the rest.
struct EventsSeed<'o> {
    out: &'o mut Vec<Found>,
}

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(LIST_EXPECTED)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut index = 0u64;
        while let Some(found) = seq.next_element_seed(ElementSeed { index })? {
            if let Some(f) = found {
                self.out.push(f);
            }
            index += 1;
        }
        Ok(true)
    }
}

/// Visitor methods that accept any JSON value other than those a visitor handles itself,
/// skipping it (lists and objects without recursion) and yielding `$value`.
macro_rules! accept_other_values {
    ($value:expr; $($skip:ident),*) => {
        $(accept_other_values!(@one $skip, $value);)*
    };
    (@one str, $value:expr) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok($value) }
    };
    (@one u64, $value:expr) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok($value) }
    };
    (@one i64, $value:expr) => {
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok($value) }
    };
    (@one f64, $value:expr) => {
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok($value) }
    };
    (@one bool, $value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok($value) }
    };
    (@one unit, $value:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok($value) }
    };
    (@one seq, $value:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            skipping(|| IgnoredAny.visit_seq(seq)).map(|_| $value)
        }
    };
    (@one map, $value:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            skipping(|| IgnoredAny.visit_map(map)).map(|_| $value)
        }
    };
}

/// `deviceProperties`: a list of one object per GPU, whose keys show the platform
/// ([`PropsSeen`]). Any other value, or element, is skipped: the properties are a hint the
/// reader takes where Kineto wrote them, never a reason to refuse a trace.
struct PropsSeed<'o> {
    seen: &'o mut PropsSeen,
}

impl<'de> DeserializeSeed<'de> for PropsSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PropsSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("device properties")
    }
    accept_other_values!((); str, u64, i64, f64, bool, unit, map);

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(PropSeed { seen: &mut *self.seen })?.is_some() {}
        Ok(())
    }
}

/// One GPU's properties in `deviceProperties`: notes the keys that show the platform.
struct PropSeed<'o> {
    seen: &'o mut PropsSeen,
}

impl<'de> DeserializeSeed<'de> for PropSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PropSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a device's properties")
    }
    accept_other_values!((); str, u64, i64, f64, bool, unit, seq);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key>()? {
            match key.0 {
                "maxSharedMemoryPerMultiProcessor" => self.seen.rocm = true,
                "regsPerMultiprocessor"
                | "sharedMemPerBlockOptin"
                | "sharedMemPerMultiprocessor" => self.seen.cuda = true,
                _ => {}
            }
            skipping(|| map.next_value::<IgnoredAny>())?;
        }
        Ok(())
    }
}

/// One element of `traceEvents`: a `[memory]` event becomes a [`Found`], anything else `None`.
///
/// Validation happens inside the element's object, so serde_json reports the line where the
/// bad event ends.
struct ElementSeed {
    index: u64,
}

impl<'de> DeserializeSeed<'de> for ElementSeed {
    type Value = Option<Found>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Found>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementSeed {
    type Value = Option<Found>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event")
    }
    accept_other_values!(None; seq, str, u64, i64, f64, bool, unit);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Found>, A::Error> {
        let mut raw = RawEvent::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key.0 {
                "name" => raw.name = map.next_value()?,
                "ts" => raw.ts = map.next_value()?,
                "args" => raw.args = map.next_value()?,
                _ => {
                    skipping(|| map.next_value::<IgnoredAny>())?;
                }
            }
        }
        if !raw.name.0 {
            return Ok(None);
        }
        raw.to_found().map_err(|m| {
            de::Error::custom(format_args!("traceEvents[{}] ([memory]): {m}", self.index))
        })
    }
}

/// The fields of a trace event the reader looks at; all others are skipped unparsed.
#[derive(Default)]
struct RawEvent {
    name: IsMemory,
    ts: Scalar,
    args: RawArgs,
}

impl RawEvent {
    /// The event, `None` for a zero-byte event (no memory changes hands), or why it is invalid.
    fn to_found(&self) -> std::result::Result<Option<Found>, String> {
        let a = &self.args;
        let bytes = a.bytes.integer("Bytes")?;
        if bytes.unsigned_abs() >= limits::SIZE_LIMIT as u128 {
            // A free is a negative count: its size is the magnitude.
            let what = if bytes < 0 { "a free of" } else { "a request of" };
            return Err(format!(
                "Bytes {bytes}: {what} 2^60 bytes or more, beyond what any allocator accepts \
                 (PyTorch rejects such requests)"
            ));
        }
        if bytes == 0 {
            return Ok(None);
        }
        if a.addr == Scalar::Missing {
            return Err(MISSING_ADDR.to_string());
        }
        let raw = a.addr.integer("Addr")?;
        // Kineto writes pointers as int64: a negative value is an address above 2^63.
        let addr = if raw < 0 {
            i64::try_from(raw).ok().map(|v| v as u64)
        } else {
            u64::try_from(raw).ok()
        }
        .ok_or_else(|| format!("Addr {raw} does not fit 64 bits"))?;
        let device_type = a.device_type.integer("Device Type")?;
        let device = if device_type == DEVICE_TYPE_CPU as i128 {
            HOST_DEVICE
        } else {
            let id = a.device_id.integer("Device Id")?;
            i64::try_from(id)
                .ok()
                .filter(|&d| d >= 0)
                .ok_or_else(|| format!("Device Id {id} is not a device index"))
                .and_then(|d| {
                    limits::check_device(d)
                        .map_err(|m| format!("Device Id {id} is not a device index ({m})"))
                })?
        };
        let ts = self.ts.float("ts")?;
        if !ts.is_finite() || ts.abs() >= 9.0e18 {
            return Err(format!("ts {ts} is not a time in microseconds"));
        }
        let action = if bytes > 0 { Action::Alloc } else { Action::FreeCompleted };
        let event = Event::new(action, addr, bytes.unsigned_abs() as u64, 0, ts.round() as i64);
        limits::check_event(&event)?;
        let totals = match (
            total("Total Allocated", a.total_allocated)?,
            total("Total Reserved", a.total_reserved)?,
        ) {
            (Some(allocated), Some(reserved)) => Some(RecordedTotals { allocated, reserved }),
            _ => None,
        };
        let hip = device_type == DEVICE_TYPE_HIP as i128;
        Ok(Some(Found { ts, device, event, totals, hip }))
    }
}

/// A recorded total (`Total Allocated`, `Total Reserved`): `None` where the event lacks it (an
/// older profiler), or why it is no byte count. A value that is there but wrong (negative, not
/// an integer, 2^60 or more) is an error, not a total quietly dropped with the recorded row.
fn total(key: &str, v: Scalar) -> std::result::Result<Option<u64>, String> {
    if v == Scalar::Missing {
        return Ok(None);
    }
    let n = v.integer(key)?;
    u64::try_from(n)
        .ok()
        .filter(|&n| n < limits::SIZE_LIMIT)
        .map(Some)
        .ok_or_else(|| format!("'{key}' is {n}, not a byte count (0 to 2^60)"))
}

/// True for an event named `[memory]`; any other name or type is false (nothing is allocated).
#[derive(Default)]
struct IsMemory(bool);

impl<'de> Deserialize<'de> for IsMemory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IsMemory;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an event name")
            }
            accept_other_values!(IsMemory(false); u64, i64, f64, bool, unit, seq, map);
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IsMemory, E> {
                Ok(IsMemory(v == "[memory]"))
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON value the reader may need as a number; anything else is kept only as "not a number".
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum Scalar {
    /// The key was absent.
    #[default]
    Missing,
    /// An integer.
    Int(i128),
    /// A number with a fraction or exponent.
    Float(f64),
    /// A string, boolean, null, list or object.
    Other,
}

impl Scalar {
    fn integer(self, key: &str) -> std::result::Result<i128, String> {
        match self {
            Scalar::Int(v) => Ok(v),
            Scalar::Float(f) if f.fract() == 0.0 && f.abs() < 1.0e30 => Ok(f as i128),
            Scalar::Missing => Err(format!("missing '{key}'")),
            _ => Err(format!("'{key}' is not an integer")),
        }
    }

    fn float(self, key: &str) -> std::result::Result<f64, String> {
        match self {
            Scalar::Int(v) => Ok(v as f64),
            Scalar::Float(f) => Ok(f),
            Scalar::Missing => Err(format!("missing '{key}'")),
            Scalar::Other => Err(format!("'{key}' is not a number")),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            accept_other_values!(Scalar::Other; str, bool, unit, seq, map);
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v as i128))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v as i128))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `args` of an event: the memory fields when it is an object, nothing otherwise.
#[derive(Default)]
struct RawArgs {
    addr: Scalar,
    bytes: Scalar,
    device_type: Scalar,
    device_id: Scalar,
    total_allocated: Scalar,
    total_reserved: Scalar,
}

impl<'de> Deserialize<'de> for RawArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawArgs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("event args")
            }
            accept_other_values!(RawArgs::default(); seq, str, u64, i64, f64, bool, unit);
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawArgs, A::Error> {
                let mut args = RawArgs::default();
                while let Some(key) = map.next_key::<Key>()? {
                    let slot = match key.0 {
                        "Addr" => &mut args.addr,
                        "Bytes" => &mut args.bytes,
                        "Device Type" => &mut args.device_type,
                        "Device Id" => &mut args.device_id,
                        "Total Allocated" => &mut args.total_allocated,
                        "Total Reserved" => &mut args.total_reserved,
                        _ => {
                            skipping(|| map.next_value::<IgnoredAny>())?;
                            continue;
                        }
                    };
                    if *slot != Scalar::Missing {
                        return Err(de::Error::custom(format_args!(
                            "'{}' appears twice in one event's args",
                            key.0
                        )));
                    }
                    *slot = map.next_value()?;
                }
                Ok(args)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_total_that_is_there_but_no_byte_count_is_refused_naming_the_event() {
        let event = |totals: &str| {
            format!(
                r#"{{"traceEvents": [{{"ph":"i","name":"[memory]","ts":1,"args":{{"Device Type":1,"Device Id":0,"Addr":4096,"Bytes":512{totals}}}}}]}}"#
            )
        };
        let read_with = |totals: &str| read(event(totals).as_bytes(), &ReadOptions::default());
        let t = read_with(r#","Total Allocated":512,"Total Reserved":2097152"#).unwrap();
        assert_eq!(t.totals_of(0).unwrap()[0].reserved, 2097152);
        // An older profiler without totals: read, with no recorded totals.
        assert!(read_with("").unwrap().totals_of(0).is_none());
        for (totals, why) in [
            (
                r#","Total Allocated":512,"Total Reserved":-1"#,
                "'Total Reserved' is -1, not a byte count",
            ),
            (
                r#","Total Allocated":-7,"Total Reserved":0"#,
                "'Total Allocated' is -7, not a byte count",
            ),
            (r#","Total Allocated":512,"Total Reserved":1e30"#, "'Total Reserved' is"),
            (
                r#","Total Allocated":512,"Total Reserved":null"#,
                "'Total Reserved' is not an integer",
            ),
            (
                r#","Total Allocated":"512","Total Reserved":0"#,
                "'Total Allocated' is not an integer",
            ),
            (r#","Bytes":1024"#, "'Bytes' appears twice in one event's args"),
        ] {
            let e = read_with(totals).unwrap_err().to_string();
            assert!(e.contains(why), "{totals}: {e}");
        }
        let e = read_with(r#","Total Allocated":512,"Total Reserved":-1"#).unwrap_err();
        assert!(e.to_string().contains("traceEvents[0]"), "{e}");
    }

    fn mem(ts: &str, ty: u32, id: i32, addr: i64, bytes: i64) -> String {
        format!(
            r#"{{"ph":"i","name":"[memory]","ts":{ts},"args":{{"Device Type":{ty},"Device Id":{id},"Addr":{addr},"Bytes":{bytes},"Total Allocated":0,"Total Reserved":0}}}}"#
        )
    }

    #[test]
    fn orders_by_time_and_splits_devices() {
        let events = [
            mem("20", 1, 1, 4096, -512),
            r#"{"ph":"X","name":"aten::mm","ts":5,"dur":3,"args":{"Bytes":"x"}}"#.to_string(),
            mem("10.4", 1, 1, 4096, 512),
            mem("15", 0, -1, 77, 64),
        ];
        let json = format!("{{\"schemaVersion\":1,\"traceEvents\":[{}]}}", events.join(","));
        let t = read(json.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(t.format, Format::Kineto);
        assert!(t.has_times);
        assert_eq!(t.devices.len(), 2);
        assert_eq!(t.devices[0].device, -1);
        assert_eq!(t.devices[0].events, vec![Event::new(Action::Alloc, 77, 64, 0, 15)]);
        assert_eq!(
            t.devices[1].events,
            vec![
                Event::new(Action::Alloc, 4096, 512, 0, 10),
                Event::new(Action::FreeCompleted, 4096, 512, 0, 20),
            ]
        );
    }

    #[test]
    fn reads_a_bare_array_and_negative_addresses() {
        let json = format!("[{}]", mem("1", 1, 0, -4096, 8));
        let t = read(json.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(t.devices[0].events[0].addr, 0xffff_ffff_ffff_f000);
    }

    #[test]
    fn round_trips_through_write() {
        let json = format!(
            "[{},{},{}]",
            mem("1", 1, 2, 4096, 8),
            mem("3", 0, -1, 8, 100),
            mem("2", 1, 2, 4096, -8)
        );
        let t = read(json.as_bytes(), &ReadOptions::default()).unwrap();
        let mut out = Vec::new();
        write(&t, &mut out).unwrap();
        let back = read(&out, &ReadOptions::default()).unwrap();
        assert_eq!(back, t);
        assert!(losses(&t).is_empty());
    }

    /// ROCm builds report GPU memory with c10's HIP device type (6): the trace shows ROCm, and
    /// writing it keeps type 6, so reading it back shows ROCm again. CUDA's type (1) alone
    /// shows no platform: a ROCm build that reports CUDA's type would write it too.
    #[test]
    fn device_type_6_shows_rocm_and_survives_a_round_trip() {
        let json = format!(
            "[{},{},{}]",
            mem("1", 6, 3, 4096, 8),
            mem("2", 0, -1, 8, 100),
            mem("3", 6, 3, 4096, -8)
        );
        let t = read(json.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(t.platform, Some(Platform::RocmDeviceType));
        assert_eq!(t.devices.iter().map(|d| d.device).collect::<Vec<_>>(), [-1, 3]);
        let mut out = Vec::new();
        write(&t, &mut out).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.contains("\"Device Type\": 6, \"Device Id\": 3"), "{text}");
        assert!(
            text.contains("\"Device Type\": 0, \"Device Id\": -1"),
            "host memory stays host: {text}"
        );
        assert_eq!(read(&out, &ReadOptions::default()).unwrap(), t);
        let cuda = format!("[{}]", mem("1", 1, 0, 4096, 8));
        assert_eq!(read(cuda.as_bytes(), &ReadOptions::default()).unwrap().platform, None);
        // One event of type 6 among CUDA's type is enough.
        let mixed = format!("[{},{}]", mem("1", 1, 0, 4096, 8), mem("2", 6, 0, 8192, 8));
        let t = read(mixed.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(t.platform, Some(Platform::RocmDeviceType));
    }

    /// Kineto's `deviceProperties` show the platform by the fields it writes for each
    /// (`libkineto/src/DeviceProperties.cpp`); anything else there is skipped, never an error,
    /// and a memory event's type 6 wins over them.
    #[test]
    fn device_properties_show_the_platform_by_their_fields() {
        let with = |props: &str, ty: u32| {
            let json = format!(
                "{{\"schemaVersion\":1,\"deviceProperties\":{props},\"traceEvents\":[{}]}}",
                mem("1", ty, 0, 4096, 8)
            );
            read(json.as_bytes(), &ReadOptions::default()).unwrap().platform
        };
        let rocm = r#"[{"id":0,"name":"AMD Instinct MI300X","totalGlobalMem":206141652992,"numSms":304,"maxSharedMemoryPerMultiProcessor":65536}]"#;
        let cuda = r#"[{"id":0,"name":"Tesla V100-SXM2-32GB","regsPerMultiprocessor":65536,"sharedMemPerMultiprocessor":98304,"sharedMemPerBlockOptin":98304}]"#;
        assert_eq!(with(rocm, 1), Some(Platform::RocmDeviceProperties));
        assert_eq!(with(cuda, 1), Some(Platform::CudaDeviceProperties));
        assert_eq!(with(cuda, 6), Some(Platform::RocmDeviceType));
        // Fields both write, a name that reads like a vendor's, and values of any shape: nothing.
        for other in [
            r#"[{"id":0,"name":"AMD Instinct MI300X","totalGlobalMem":1,"numSms":304}]"#,
            r#"[]"#,
            r#"{"maxSharedMemoryPerMultiProcessor":1}"#,
            r#"[1,"x",null,[{"regsPerMultiprocessor":1}],{"a":{"regsPerMultiprocessor":1}}]"#,
            r#""rocm""#,
        ] {
            assert_eq!(with(other, 1), None, "{other}");
        }
        // After the events, too.
        let json = format!(
            "{{\"traceEvents\":[{}],\"deviceProperties\":{rocm}}}",
            mem("1", 1, 0, 4096, 8)
        );
        let t = read(json.as_bytes(), &ReadOptions::default()).unwrap();
        assert_eq!(t.platform, Some(Platform::RocmDeviceProperties));
    }

    #[test]
    fn rejects_bad_memory_events_with_their_index_and_line() {
        let json = format!(
            "{{\"traceEvents\":[\n{},\n{}\n]}}",
            mem("1", 1, 0, 16, 8),
            mem("2", 1, 0, 16, 1 << 61)
        );
        let err = read(json.as_bytes(), &ReadOptions::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "line 3: traceEvents[1] ([memory]): Bytes 2305843009213693952: a request of 2^60 bytes or more"
            ),
            "{text}"
        );
        let err = read(
            b"{\"traceEvents\":[{\"name\":\"[memory]\",\"ts\":1,\"args\":{}}]}",
            &ReadOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("missing 'Bytes'"), "{err}");
        let err = read(b"{\"traceEvents\":[", &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().contains("truncated JSON"), "{err}");
        let err = read(b"{\"foo\":1}", &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().contains("no 'traceEvents'"), "{err}");
    }

    /// The message of reading `data` through serde_json's in-memory parser, as the reader did
    /// before it streamed (`Ok` with the count of `[memory]` events found).
    fn parsed_whole(data: &[u8]) -> std::result::Result<(bool, usize), String> {
        let mut found = Vec::new();
        match parse(
            serde_json::Deserializer::from_slice(data),
            &mut found,
            &mut PropsSeen::default(),
        ) {
            Ok(saw) => Ok((saw, found.len())),
            Err(e) => {
                let at = (e.line(), e.column());
                Err(json_error(e, at).to_string())
            }
        }
    }

    #[test]
    fn streaming_reports_what_parsing_the_whole_file_reports() {
        // Every cut, every byte replaced by every byte, and a few bytes inserted everywhere, in
        // a trace with skipped and read strings, nested values, blank lines and a bare array.
        let json = format!(
            "{{\"traceEvents\":[\n{},\n{{\"name\":\"a\\u00e9\\\"\",\"ts\":[1,{{}}]}},\n\n{}\n], \"x\": [\"s\", -1.5]}}\n",
            mem("1.5", 1, 0, 16, 8),
            mem("2e0", 0, -1, 16, -8)
        );
        let bare = format!("[{}, 7, \"u\"]\n", mem("3", 1, 0, 32, 8));
        let mut checked = 0;
        let mut check = |bytes: &[u8]| {
            let whole = parsed_whole(bytes);
            let mut found = Vec::new();
            let streamed = parse_stream(&mut &bytes[..], &mut found, &mut PropsSeen::default());
            let streamed = streamed.map(|saw| (saw, found.len())).map_err(|e| e.to_string());
            assert_eq!(streamed, whole, "{}", String::from_utf8_lossy(bytes));
            checked += 1;
        };
        for data in [json.as_bytes(), bare.as_bytes()] {
            for at in 0..data.len() {
                check(&data[..at]);
                for b in 0..=255u8 {
                    let mut bad = data.to_vec();
                    bad[at] = b;
                    check(&bad);
                }
                for b in [b'\n', b'\x01', b'{', b'7', b' ', b','] {
                    let mut bad = data.to_vec();
                    bad.insert(at, b);
                    check(&bad);
                }
            }
        }
        assert_eq!(checked, (json.len() + bare.len()) * 263);
        assert_eq!(parsed_whole(json.as_bytes()), Ok((true, 2)));
        assert_eq!(parsed_whole(bare.as_bytes()), Ok((true, 1)));
    }
}
