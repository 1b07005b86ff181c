//! The one table of limits every reader enforces and every writer can write.
//!
//! What one reader accepts, every reader accepts, and every writer can write it back, so
//! `convert` never writes a file fragsim cannot read. Each reader calls the `check_*` functions
//! below at the point it builds an [`Event`] or [`Segment`] (so the error names the line, byte or
//! entry), and [`check_trace`] runs once more over every trace read or written, so a reader that
//! forgot a field still cannot let a value past the table. Because sizes and address ranges are
//! checked here, once, at the boundary, the policies can trust that `addr + size` neither wraps
//! nor exceeds [`ADDRESS_LIMIT`]. `docs/interface.md` lists the same table ([`LIMITS`]).

use super::lifetimes::AddrSet;
use super::{Event, Segment, Trace};
use crate::error::{Error, Place, Result};

/// Every size (request, segment, block) is below 2^60 bytes: PyTorch's caching allocator refuses
/// larger requests, so a trace that holds one is corrupt, and sums of a few of them stay in u64.
pub const SIZE_LIMIT: u64 = 1 << 60;

/// Every address range ends at or below 2^64 − 1: `addr + size` never wraps (for an `oom`
/// event, whose `addr` holds the device's free bytes, the same sum is checked). Addresses use
/// the whole 64 bits because Kineto records host pointers with the top bits set as negative
/// int64 values; a policy that needs fewer bits (`pytorch` indexes 2^56) refuses the rest with
/// the event's place.
pub const ADDRESS_LIMIT: u64 = u64::MAX;

/// Event times are microseconds in `0..=2^53`: exact in the doubles Kineto JSON and RMM CSV
/// write, and 285 years past the Unix epoch.
pub const TIME_LIMIT: i64 = 1 << 53;

/// The lowest device index: -1 is host memory (Kineto's CPU events).
pub const DEVICE_MIN: i32 = -1;

/// The highest device index: a snapshot writes one `device_traces` list per index up to it, so
/// the bound keeps every table indexed by device small.
pub const DEVICE_MAX: i32 = 4095;

/// The most distinct streams one device may use (the pytorch policy indexes them in 16 bits).
pub const STREAMS_PER_DEVICE: usize = 1 << 16;

/// The most events one device may hold (event indices stay in 32 bits).
pub const EVENTS_PER_DEVICE: usize = 1 << 32;

/// The default cap on the bytes a trace file may hold, raw or decompressed (8 GiB);
/// `FRAGSIM_MAX_INPUT_SIZE` or `--max-input-size` changes it.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 8 << 30;

/// The most bytes of a frame's file name or function name that a reader keeps: a longer one is
/// cut at a character boundary and marked (`…[N bytes]`), so one long string that a pickle's
/// memo shares among many frames costs this much per frame, not its full length. No path is this
/// long (PATH_MAX is 4096), nor any function name a real trace records.
pub const FRAME_STRING_BYTES: usize = 8 << 10;

/// `bytes` (a frame's file or function name) as kept: UTF-8 (invalid sequences replaced), at most
/// [`FRAME_STRING_BYTES`] of it, with a mark giving the full length when cut.
pub(crate) fn frame_string(bytes: &[u8]) -> String {
    if bytes.len() <= FRAME_STRING_BYTES {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let head = String::from_utf8_lossy(&bytes[..FRAME_STRING_BYTES]);
    let head = head.trim_end_matches('\u{fffd}');
    format!("{head}…[{} bytes]", bytes.len())
}

/// The bytes [`frame_string`] keeps of a string of `len` bytes, about.
pub(crate) fn frame_string_len(len: usize) -> usize {
    if len <= FRAME_STRING_BYTES {
        len
    } else {
        FRAME_STRING_BYTES + 24
    }
}

/// One row of the table of limits, as `docs/interface.md` shows it.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// What is limited.
    pub what: &'static str,
    /// The rule, as the documentation spells it.
    pub rule: &'static str,
}

/// The table of limits, in the order `docs/interface.md` lists them (a test checks it does).
pub const LIMITS: [Limit; 8] = [
    Limit { what: "size", rule: "every size (request, segment, block) is below 2^60 bytes" },
    Limit { what: "address", rule: "every address range ends at or below 2^64 - 1: addr + size never wraps" },
    Limit { what: "time", rule: "event times are microseconds in 0..=2^53" },
    Limit { what: "device", rule: "device indices are in -1..=4095 (-1 is host memory)" },
    Limit { what: "streams", rule: "at most 65536 distinct streams per device" },
    Limit { what: "events", rule: "at most 2^32 events per device" },
    Limit {
        what: "input",
        rule: "a file holds at most 8 GiB, raw or decompressed (FRAGSIM_MAX_INPUT_SIZE, --max-input-size)",
    },
    Limit {
        what: "gzip",
        rule: "a `.gz` file expands to at most 200× its own size (and at least 64 MiB): real traces compress 5–20×, a bomb far more; decompress such a file yourself (`gunzip -k`) and give fragsim the result",
    },
];

/// Checks a size against [`SIZE_LIMIT`]; `what` names the field in the message.
#[inline]
pub(crate) fn check_size(what: &str, size: u64) -> Result<(), String> {
    if size >= SIZE_LIMIT {
        return Err(format!(
            "{what} {size} is 2^60 or more, beyond what any allocator accepts (PyTorch rejects such requests)"
        ));
    }
    Ok(())
}

/// Checks that `addr..addr + size` is a range fragsim accepts: a size below [`SIZE_LIMIT`] and
/// an end at or below [`ADDRESS_LIMIT`].
// `end <= ADDRESS_LIMIT` always holds while the limit is u64::MAX; it stays written out so the
// table is the one place to change should the limit ever come down.
#[allow(clippy::absurd_extreme_comparisons)]
#[inline]
pub(crate) fn check_range(addr: u64, size: u64) -> Result<(), String> {
    check_size("size", size)?;
    match addr.checked_add(size) {
        Some(end) if end <= ADDRESS_LIMIT => Ok(()),
        _ => Err(format!("address range {addr:#x}+{size} wraps past 2^64")),
    }
}

/// Checks a device index against [`DEVICE_MIN`]..=[`DEVICE_MAX`].
pub(crate) fn check_device(device: i64) -> Result<i32, String> {
    match i32::try_from(device) {
        Ok(d) if (DEVICE_MIN..=DEVICE_MAX).contains(&d) => Ok(d),
        _ => Err(format!("device {device} is outside {DEVICE_MIN}..={DEVICE_MAX}")),
    }
}

/// Checks a time in microseconds against `0..=`[`TIME_LIMIT`].
#[inline]
pub(crate) fn check_time(time_us: i64) -> Result<(), String> {
    if !(0..=TIME_LIMIT).contains(&time_us) {
        return Err(format!("time {time_us} µs is outside 0..=2^53"));
    }
    Ok(())
}

/// Checks one event: its address range and its time.
#[inline]
pub(crate) fn check_event(e: &Event) -> Result<(), String> {
    check_range(e.addr, e.size)?;
    check_time(e.time_us)
}

/// Checks one final segment: its device, its range and every block's range and request.
pub(crate) fn check_segment(s: &Segment) -> Result<(), String> {
    check_device(s.device as i64)?;
    check_range(s.address, s.total_size)?;
    for (j, b) in s.blocks.iter().enumerate() {
        check_range(b.address, b.size)
            .and_then(|_| check_size("requested size", b.requested_size))
            .map_err(|m| format!("block {j}: {m}"))?;
    }
    Ok(())
}

/// Checks that `segments` are apart, as memory the device handed out is: no two segments of a
/// device overlap, and a segment's blocks lie in it, in address order, apart from each other.
/// A snapshot that breaks this was not written by an allocator, and every number read from it
/// would count bytes twice.
pub(crate) fn check_segments_apart(segments: &[Segment]) -> Result<(), String> {
    for (i, s) in segments.iter().enumerate() {
        let end = s.address.saturating_add(s.total_size);
        let mut next = s.address;
        for (j, b) in s.blocks.iter().enumerate() {
            if b.address < next || b.address.saturating_add(b.size) > end {
                return Err(format!(
                    "segment {i}: block {j} at {:#x} (+{}) overlaps the block before it or \
                     lies outside the segment [{:#x}, {end:#x})",
                    b.address, b.size, s.address
                ));
            }
            next = b.address + b.size;
        }
    }
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_unstable_by_key(|&i| (segments[i].device, segments[i].address));
    for w in order.windows(2) {
        let (a, b) = (&segments[w[0]], &segments[w[1]]);
        if a.device == b.device && a.address.saturating_add(a.total_size) > b.address {
            return Err(format!(
                "segments {} and {} of device {} overlap: [{:#x}, +{}) and [{:#x}, +{})",
                w[0], w[1], a.device, a.address, a.total_size, b.address, b.total_size
            ));
        }
    }
    Ok(())
}

/// Checks a whole trace against the table: devices (each once), events, streams per device,
/// segments and recorded totals. The error names the device and event index or the segment.
pub fn check_trace(trace: &Trace) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for d in &trace.devices {
        check_device(d.device as i64).map_err(Error::input)?;
        if !seen.insert(d.device) {
            return Err(Error::input(format!("device {} appears twice", d.device)));
        }
        if d.events.len() > EVENTS_PER_DEVICE {
            return Err(Error::input(format!(
                "device {}: {} events, more than 2^32",
                d.device,
                d.events.len()
            )));
        }
        // Every event passes here on load: the fast address hasher, not SipHash.
        let mut streams = AddrSet::default();
        for (i, e) in d.events.iter().enumerate() {
            let err = |m: String| Error::input(format!("device {}: {m}", d.device));
            check_event(e).map_err(err).map_err(|x| x.at(Place::Event(i as u64)))?;
            if streams.len() < STREAMS_PER_DEVICE || streams.contains(&e.stream) {
                streams.insert(e.stream);
            } else {
                return Err(err(format!(
                    "stream {:#x} is more than {STREAMS_PER_DEVICE} distinct streams on one device",
                    e.stream
                ))
                .at(Place::Event(i as u64)));
            }
        }
    }
    for (i, s) in trace.segments.iter().enumerate() {
        check_segment(s).map_err(|m| Error::input(format!("segment {i}: {m}")))?;
    }
    check_segments_apart(&trace.segments).map_err(Error::input)?;
    for t in &trace.recorded_totals {
        for (i, r) in t.totals.iter().enumerate() {
            check_size("recorded allocated", r.allocated)
                .and_then(|_| check_size("recorded reserved", r.reserved))
                .map_err(|m| {
                    Error::input(format!("device {}: {m}", t.device)).at(Place::Event(i as u64))
                })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_frame_string_is_cut_and_marked() {
        assert_eq!(frame_string(b"model.py"), "model.py");
        let long = vec![b'x'; FRAME_STRING_BYTES * 3];
        let kept = frame_string(&long);
        assert!(
            kept.ends_with(&format!("…[{} bytes]", long.len())),
            "{}",
            &kept[kept.len() - 30..]
        );
        assert!(kept.len() <= frame_string_len(long.len()));
    }
    use crate::trace::{Action, DeviceTrace};

    #[test]
    fn ranges_are_checked_without_wrapping() {
        assert!(check_range(0, SIZE_LIMIT - 1).is_ok());
        assert!(check_range(u64::MAX - (SIZE_LIMIT - 1), SIZE_LIMIT - 1).is_ok());
        assert!(check_range(u64::MAX - (SIZE_LIMIT - 2), SIZE_LIMIT - 1).is_err());
        assert!(check_range(u64::MAX, 0).is_ok());
        assert!(check_range(u64::MAX, 1).is_err());
        assert!(check_range(0, SIZE_LIMIT).unwrap_err().contains("2^60 or more"));
        assert_eq!(check_device(4095), Ok(4095));
        assert!(check_device(4096).is_err());
        assert!(check_device(i32::MAX as i64).is_err());
        assert_eq!(check_device(-1), Ok(-1));
        assert!(check_device(-2).is_err());
        assert!(check_time(-1).is_err());
        assert!(check_time(TIME_LIMIT).is_ok());
    }

    #[test]
    fn trace_errors_name_device_and_event() {
        let mut t = Trace::default();
        let ok = Event::new(Action::Alloc, 0x100, 512, 0, 0);
        let bad = Event::new(Action::Alloc, u64::MAX - 10, 512, 0, 1);
        t.devices.push(DeviceTrace { device: 3, events: vec![ok, bad] });
        let e = check_trace(&t).unwrap_err();
        assert_eq!(
            e.to_string(),
            "event 1: device 3: address range 0xfffffffffffffff5+512 wraps past 2^64"
        );
        t.devices[0].events.pop();
        t.devices.push(DeviceTrace { device: 3, events: vec![] });
        assert_eq!(check_trace(&t).unwrap_err().to_string(), "device 3 appears twice");
    }

    #[test]
    fn too_many_streams_are_refused() {
        let events = (0..=STREAMS_PER_DEVICE as u64)
            .map(|s| Event::new(Action::Alloc, 0x100, 512, s, 0))
            .collect();
        let t = Trace { devices: vec![DeviceTrace { device: 0, events }], ..Trace::default() };
        let e = check_trace(&t).unwrap_err().to_string();
        assert!(e.starts_with("event 65536: device 0: stream 0x10000 is more than 65536"), "{e}");
    }
}
