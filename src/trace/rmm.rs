//! RAPIDS RMM `logging_resource_adaptor` CSV logs: reading and writing.
//!
//! Upstream: `rapidsai/rmm` `cpp/src/mr/detail/logging_resource_adaptor_impl.cpp` (the writer) and
//! `cpp/benchmarks/utilities/log_parser.hpp` (RMM's own replay parser).
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140573312345856,14:03:07.123456,allocate,0x7f8a40000000,1024,0
//! 140573312345856,14:03:07.123789,free,0x7f8a40000000,1024,0
//! 140573312345856,14:03:07.124001,allocate failure,(nil),68719476736,0
//! ```
//!
//! - Actions: `allocate` → [`Action::Alloc`]; `free` (what the code writes) and `deallocate` (what
//!   the user guide shows) → [`Action::FreeCompleted`], one event per free, as RMM frees at once;
//!   `allocate failure` → [`Action::Oom`] with the request size (`addr` 0: RMM does not log the
//!   free bytes).
//! - Time: the code writes wall-clock `HH:MM:SS.ffffff` (no date), the user guide shows epoch
//!   seconds (`1634567890.123456`); both are read. A clock time that jumps back by more than 12
//!   hours is taken as passing midnight. An empty Time field makes the trace untimed.
//! - Pointer: hex as `%p` prints it (`0x7f8a40000000`, or `(nil)` for null).
//! - Stream: `format_stream` writes the `cudaStream_t` in hex; `0x…` or a value with hex letters
//!   is read as hex, plain digits as decimal (the default stream is `0` either way).
//! - An RMM log is one device: device 0.

use super::lifetimes::free_action;
use super::limits;
use super::{Action, DeviceTrace, Event, Format, ReadOptions, Trace};
use crate::error::{quoted, Error, Place, Result};
use std::io::{BufRead, Write};

/// The header RMM writes, exactly.
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

const DAY_US: i64 = 86_400_000_000;

/// Reads an RMM log held in memory.
pub fn read(data: &[u8], options: &ReadOptions) -> Result<Trace> {
    read_from(&mut &data[..], options)
}

/// Reads an RMM log from a stream, one line at a time: memory is the events plus one line.
pub(crate) fn read_from(input: &mut dyn BufRead, _options: &ReadOptions) -> Result<Trace> {
    let mut lines = Lines { input, buffer: Vec::new(), offset: 0, number: 0 };
    match lines.next_nonblank()? {
        Some((_, h)) if normalise_header(h) == normalise_header(HEADER) => {}
        Some((n, h)) => {
            return Err(Error::input(format!(
                "expected the header '{HEADER}', found {}",
                quoted(h)
            ))
            .at(Place::Line(n)))
        }
        None => return Err(Error::input(format!("empty file: expected the header '{HEADER}'"))),
    }
    let mut events = Vec::new();
    let mut clock = Clock::default();
    let mut timed = true;
    while let Some((n, line)) = lines.next_nonblank()? {
        let place = Place::Line(n);
        let row = parse_row(line, &mut clock).map_err(|m| Error::input(m).at(place))?;
        let time = match row.time {
            Some(t) => t,
            None => {
                timed = false;
                events.len() as i64
            }
        };
        let event = Event::new(row.action, row.addr, row.size, row.stream, time);
        limits::check_event(&event).map_err(|m| Error::input(m).at(place))?;
        events.push(event);
    }
    if !timed {
        for (i, e) in events.iter_mut().enumerate() {
            e.time_us = i as i64;
        }
    }
    Ok(Trace {
        format: Format::RmmCsv,
        devices: vec![DeviceTrace { device: 0, events }],
        has_times: timed,
        ..Trace::default()
    })
}

/// The lines of a stream as `str::lines` splits them (a `\n` or `\r\n` ends a line; a leading
/// byte order mark is dropped), one at a time in one reused buffer.
struct Lines<'a> {
    input: &'a mut dyn BufRead,
    buffer: Vec<u8>,
    /// Bytes of the stream before `buffer`.
    offset: u64,
    /// The 1-based number of the line in `buffer`.
    number: u64,
}

impl Lines<'_> {
    /// The next line that is not blank and its number, or `None` at the end of the stream.
    fn next_nonblank(&mut self) -> Result<Option<(u64, &str)>> {
        let (start, end) = loop {
            self.offset += self.buffer.len() as u64;
            self.buffer.clear();
            if self.input.read_until(b'\n', &mut self.buffer).map_err(Error::from_io)? == 0 {
                return Ok(None);
            }
            self.number += 1;
            let line = std::str::from_utf8(&self.buffer).map_err(|e| {
                // Worded as `Utf8Error` words it, with the index in the file, not in the line.
                let at = self.offset + e.valid_up_to() as u64;
                let what = match e.error_len() {
                    Some(n) => format!("invalid utf-8 sequence of {n} bytes from index {at}"),
                    None => format!("incomplete utf-8 byte sequence from index {at}"),
                };
                Error::input(format!("not UTF-8 text: {what}")).at(Place::Byte(at))
            })?;
            // The byte order mark starts the first line only; the line ending is not part of it.
            let bom = if self.number == 1 && line.starts_with('\u{feff}') { 3 } else { 0 };
            let mut rest = &line[bom..];
            if let Some(l) = rest.strip_suffix('\n') {
                rest = l.strip_suffix('\r').unwrap_or(l);
            }
            if !rest.trim().is_empty() {
                break (bom, bom + rest.len());
            }
        };
        // Validated above; borrowed again here, after the loop, to hand to the caller.
        let line = std::str::from_utf8(&self.buffer[start..end]).unwrap_or_default();
        Ok(Some((self.number, line)))
    }
}

/// Writes the events of the trace's device (the one with the most events, if several) as an
/// RMM log: allocations, frees (at the action where the trace's frees take effect) and OOMs.
/// Times are written as epoch seconds with six decimals, which RMM's user guide shows and which
/// keep the microseconds exactly; an untimed trace gets an empty Time field.
pub(crate) fn write(trace: &Trace, out: &mut impl Write) -> Result<()> {
    let io = Error::from_io;
    writeln!(out, "{HEADER}").map_err(io)?;
    let Some(device) = trace.default_device().and_then(|d| trace.device(d)) else {
        return Ok(());
    };
    let frees = free_action(&device.events);
    for e in &device.events {
        let (action, pointer) = match e.action {
            Action::Alloc => ("allocate", Some(e.addr)),
            a if a == frees => ("free", Some(e.addr)),
            Action::Oom => ("allocate failure", None),
            _ => continue,
        };
        let time = if trace.has_times { format_epoch(e.time_us) } else { String::new() };
        let pointer = match pointer {
            Some(p) if p != 0 => format!("{p:#x}"),
            _ => "(nil)".to_string(),
        };
        let stream = if e.stream == 0 { "0".to_string() } else { format!("{:#x}", e.stream) };
        writeln!(out, "0,{time},{action},{pointer},{},{stream}", e.size).map_err(io)?;
    }
    Ok(())
}

/// What writing `trace` as an RMM log leaves out, one line each (empty when nothing is lost).
pub(crate) fn losses(trace: &Trace) -> Vec<String> {
    let mut out = Vec::new();
    let chosen = trace.default_device();
    for d in &trace.devices {
        if Some(d.device) != chosen {
            if !d.events.is_empty() {
                out.push(format!(
                    "device {}: an RMM log holds one device; its {} events are left out",
                    d.device,
                    d.events.len()
                ));
            }
            continue;
        }
        if d.device != 0 {
            out.push(format!(
                "device {} becomes device 0: an RMM log has no device column",
                d.device
            ));
        }
        let frees = free_action(&d.events);
        let dropped = d
            .events
            .iter()
            .filter(|e| !matches!(e.action, Action::Alloc | Action::Oom) && e.action != frees)
            .count();
        if dropped > 0 {
            out.push(format!(
                "device {}: {dropped} events other than alloc, {} and oom are not part of an RMM log",
                d.device,
                frees.name()
            ));
        }
    }
    if !trace.segments.is_empty() || trace.allocator_settings.is_some() {
        out.push("final segments and allocator settings are not part of an RMM log".into());
    }
    out.extend(trace.entry_pools_loss("RMM log"));
    out.extend(trace.platform_loss("RMM log"));
    out.extend(trace.totals_loss("RMM log", |d| Some(d) == chosen));
    out
}

fn normalise_header(h: &str) -> String {
    h.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase()
}

/// One parsed line.
struct Row {
    action: Action,
    addr: u64,
    size: u64,
    stream: u64,
    time: Option<i64>,
}

/// Turns clock times (`HH:MM:SS.ffffff`, no date) into a monotone microsecond count.
#[derive(Default)]
struct Clock {
    day_offset: i64,
    last: Option<i64>,
}

impl Clock {
    fn clock_time(&mut self, of_day: i64) -> i64 {
        if let Some(last) = self.last {
            if of_day + self.day_offset < last - DAY_US / 2 {
                self.day_offset += DAY_US;
            }
        }
        let t = of_day + self.day_offset;
        self.last = Some(t);
        t
    }
}

fn parse_row(line: &str, clock: &mut Clock) -> std::result::Result<Row, String> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [_thread, time, action, pointer, size, stream] = fields[..] else {
        return Err(format!(
            "expected 6 comma-separated fields (Thread,Time,Action,Pointer,Size,Stream), found {}: {}",
            fields.len(),
            quoted(line)
        ));
    };
    let action = match action.to_ascii_lowercase().as_str() {
        "allocate" => Action::Alloc,
        "free" | "deallocate" => Action::FreeCompleted,
        "allocate failure" => Action::Oom,
        _ => {
            return Err(format!(
                "unknown action {} (accepted: allocate, free, deallocate, allocate failure)",
                quoted(action)
            ))
        }
    };
    let addr = parse_pointer(pointer).ok_or_else(|| format!("bad pointer {}", quoted(pointer)))?;
    let size: u64 = size.parse().map_err(|_| format!("bad size {}", quoted(size)))?;
    limits::check_range(addr, size)?;
    let stream = parse_stream(stream).ok_or_else(|| format!("bad stream {}", quoted(stream)))?;
    let time = if time.is_empty() {
        None
    } else if time.contains(':') {
        Some(clock.clock_time(parse_clock(time).ok_or_else(|| {
            format!("bad time {} (expected HH:MM:SS.ffffff or epoch seconds)", quoted(time))
        })?))
    } else {
        Some(parse_epoch(time).ok_or_else(|| {
            format!("bad time {} (expected HH:MM:SS.ffffff or epoch seconds)", quoted(time))
        })?)
    };
    Ok(Row { action, addr, size, stream, time })
}

fn parse_pointer(p: &str) -> Option<u64> {
    if p == "(nil)" || p == "0" {
        return Some(0);
    }
    let hex = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")).unwrap_or(p);
    u64::from_str_radix(hex, 16).ok()
}

fn parse_stream(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).ok();
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    u64::from_str_radix(s, 16).ok()
}

/// `HH:MM:SS[.ffffff]` → microseconds since midnight.
fn parse_clock(t: &str) -> Option<i64> {
    let mut parts = t.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let h: i64 = digits(h)?;
    let m: i64 = digits(m)?;
    let (sec, frac) = split_seconds(s)?;
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + frac)
}

/// `SECONDS[.ffffff]` since the epoch → microseconds, without going through a float.
fn parse_epoch(t: &str) -> Option<i64> {
    let (sec, frac) = split_seconds(t)?;
    sec.checked_mul(1_000_000)?.checked_add(frac)
}

/// Whole seconds and the fraction in microseconds (digits past the sixth are dropped).
fn split_seconds(s: &str) -> Option<(i64, i64)> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let whole: i64 = digits(whole)?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut us = 0i64;
    for i in 0..6 {
        us = us * 10 + frac.as_bytes().get(i).map_or(0, |b| (b - b'0') as i64);
    }
    Some((whole, us))
}

fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn format_epoch(us: i64) -> String {
    let sign = if us < 0 { "-" } else { "" };
    let a = us.unsigned_abs();
    format!("{sign}{}.{:06}", a / 1_000_000, a % 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(s: &str) -> Result<Trace> {
        read(s.as_bytes(), &ReadOptions::default())
    }

    #[test]
    fn reads_the_format_the_code_writes() {
        let t = read_str(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             140573312345856,14:03:07.123456,allocate,0x7f8a40000000,1024,0\n\
             140573312345856,14:03:07.123789,free,0x7f8a40000000,1024,0\n\
             140573312345856,14:03:07.124001,allocate failure,(nil),68719476736,0x5581a0\n",
        )
        .unwrap();
        assert_eq!(t.format, Format::RmmCsv);
        assert!(t.has_times);
        let base = (14 * 3600 + 3 * 60 + 7) * 1_000_000;
        assert_eq!(
            t.devices[0].events,
            vec![
                Event::new(Action::Alloc, 0x7f8a40000000, 1024, 0, base + 123_456),
                Event::new(Action::FreeCompleted, 0x7f8a40000000, 1024, 0, base + 123_789),
                Event::new(Action::Oom, 0, 68719476736, 0x5581a0, base + 124_001),
            ]
        );
    }

    #[test]
    fn reads_the_format_the_docs_show_and_passes_midnight() {
        let t = read_str(
            "Thread,Time,Action,Pointer,Size,Stream\n1,1634567890.123456,allocate,0x100,8,0\n1,1634567890.5,deallocate,0x100,8,0\n",
        )
        .unwrap();
        let e = &t.devices[0].events;
        assert_eq!(e[0].time_us, 1_634_567_890_123_456);
        assert_eq!(e[1].time_us, 1_634_567_890_500_000);
        assert_eq!(e[1].action, Action::FreeCompleted);
        let t = read_str("Thread,Time,Action,Pointer,Size,Stream\n1,23:59:59.9,allocate,0x100,8,0\n1,00:00:00.1,free,0x100,8,0\n").unwrap();
        assert_eq!(t.devices[0].events[1].time_us - t.devices[0].events[0].time_us, 200_000);
    }

    #[test]
    fn round_trips() {
        let src = "Thread,Time,Action,Pointer,Size,Stream\n0,12.000001,allocate,0x100,8,0\n0,13.000000,allocate failure,(nil),99,0x7\n0,14.500000,free,0x100,8,0\n";
        let t = read_str(src).unwrap();
        let mut out = Vec::new();
        write(&t, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), src);
        assert!(losses(&t).is_empty());
    }

    #[test]
    fn errors_name_the_line() {
        let err = read_str("Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1,8,0\n1,1.0,malloc,0x1,8,0\n").unwrap_err();
        assert!(err.to_string().starts_with("line 3: unknown action 'malloc'"), "{err}");
        let err = read_str("Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1,-8,0\n")
            .unwrap_err();
        assert_eq!(err.to_string(), "line 2: bad size '-8'");
        let err = read_str(
            "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1,1152921504606846976,0\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("2^60"), "{err}");
        let err = read_str("Thread,Time,Action\n").unwrap_err();
        assert!(err.to_string().starts_with("line 1: expected the header"), "{err}");
    }

    #[test]
    fn streamed_lines_keep_the_places_of_the_whole_file() {
        // A byte order mark, CRLF endings and blank lines: line numbers count every line.
        let t = read_str(
            "\u{feff}Thread,Time,Action,Pointer,Size,Stream\r\n\r\n  \n1,1.0,allocate,0x1,8,0\r\n",
        )
        .unwrap();
        assert_eq!(t.devices[0].events.len(), 1);
        let err = read_str("\n\u{feff}Thread,Time,Action,Pointer,Size,Stream\n").unwrap_err();
        assert!(err.to_string().starts_with("line 2: expected the header"), "{err}");
        let err = read_str("Thread,Time,Action,Pointer,Size,Stream\r\n\n1,1.0,alloc,0x1,8,0\r\n")
            .unwrap_err();
        assert!(err.to_string().starts_with("line 3: unknown action 'alloc'"), "{err}");
        // Non-UTF-8 bytes: the offset in the file, worded as `Utf8Error` words it.
        let data = b"Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1,8,\xff\n";
        let whole = String::from_utf8(data.to_vec()).unwrap_err().utf8_error();
        let err = read(data, &ReadOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("byte {}: not UTF-8 text: {whole}", whole.valid_up_to())
        );
        let data = b"Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1,8,\xe2\x82";
        let whole = String::from_utf8(data.to_vec()).unwrap_err().utf8_error();
        let err = read(data, &ReadOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("byte {}: not UTF-8 text: {whole}", whole.valid_up_to())
        );
    }
}
