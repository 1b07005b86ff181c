//! fragsim's plain text trace format, for hand-written tests and bug reports.
//!
//! One event per line; `#` starts a comment; blank lines are ignored:
//!
//! ```text
//! # fragsim text trace v1
//! device 0
//! alloc 0x7f0000000000 4096 s0 @1700000000000000
//! free 0x7f0000000000 4096 s0
//! segment_alloc 0x7f0000000000 2097152 s0
//! ```
//!
//! - `ACTION ADDR SIZE [sSTREAM] [@TIME_US]`, where ACTION is a PyTorch trace action
//!   (`alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map`,
//!   `segment_unmap`, `oom`, `snapshot`), or `free`, which stands for `free_requested` followed by
//!   `free_completed` (as PyTorch's viewer merges them).
//! - ADDR and SIZE are decimal or `0x` hex; for `oom`, ADDR is the device's free bytes.
//! - STREAM defaults to 0 (decimal or `0x` hex after the `s`); TIME defaults to the event index.
//! - `device N` makes the following events belong to device N (default 0).

use super::{limits, Action, DeviceTrace, Event, Format, ReadOptions, Trace};
use crate::error::{quoted, Error, Place, Result};
use std::io::{BufRead, Write};

/// True when `head` (the start of a file) reads like a text trace.
pub(crate) fn looks_like_text(head: &str) -> bool {
    let mut commented = false;
    for line in head.lines() {
        let line = line.trim();
        if line.starts_with("# fragsim text trace") {
            return true;
        }
        if line.is_empty() || line.starts_with('#') {
            commented |= !line.is_empty();
            continue;
        }
        let word = line.split_whitespace().next().unwrap_or("");
        return word == "device" || word == "free" || Action::from_name(word).is_some();
    }
    // Only comments so far: no other format starts with `#`, so this is a text trace whose
    // events come later, or one with none, which the reader then reports as such.
    commented
}

/// What writing `trace` as text leaves out, one line each (empty when nothing is lost).
pub(crate) fn losses(trace: &Trace) -> Vec<String> {
    let mut out = Vec::new();
    if !trace.segments.is_empty() || trace.allocator_settings.is_some() {
        out.push("final segments and allocator settings are not part of the text format".into());
    }
    out.extend(trace.entry_pools_loss("text"));
    out.extend(trace.platform_loss("text"));
    out.extend(trace.totals_loss("text", |_| true));
    out
}

/// Reads a text trace held in memory.
pub fn read(data: &[u8], options: &ReadOptions) -> Result<Trace> {
    read_from(&mut &data[..], options)
}

/// Reads a text trace from a stream, one line at a time: memory is the events plus one line.
pub(crate) fn read_from(input: &mut dyn BufRead, _options: &ReadOptions) -> Result<Trace> {
    let mut trace = Trace { format: Format::Text, ..Trace::default() };
    let mut device = 0i32;
    // The index in `trace.devices` of each device seen, so a `device` line costs O(1) however
    // many devices there are (a linear search made 300,000 `device` lines take 28 s).
    let mut index: std::collections::HashMap<i32, usize> = std::collections::HashMap::new();
    let mut has_times = false;
    let mut buffer = Vec::new();
    let mut offset = 0u64;
    for n in 0u64.. {
        buffer.clear();
        if input.read_until(b'\n', &mut buffer).map_err(Error::from_io)? == 0 {
            break;
        }
        let line = std::str::from_utf8(&buffer).map_err(|e| {
            // Worded as `Utf8Error` words it, with the index in the file, not in the line.
            let at = offset + e.valid_up_to() as u64;
            let what = match e.error_len() {
                Some(n) => format!("invalid utf-8 sequence of {n} bytes from index {at}"),
                None => format!("incomplete utf-8 byte sequence from index {at}"),
            };
            Error::input(format!("not UTF-8 text: {what}")).at(Place::Byte(at))
        })?;
        offset += buffer.len() as u64;
        let place = Place::Line(n + 1);
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words[0] == "device" {
            device = match words.get(1).and_then(|w| w.parse::<i64>().ok()) {
                Some(d) if words.len() == 2 => {
                    limits::check_device(d).map_err(|m| Error::input(m).at(place))?
                }
                _ => {
                    return Err(Error::input(format!(
                        "expected 'device N', found {}",
                        quoted(line)
                    ))
                    .at(place))
                }
            };
            continue;
        }
        let rest = &words[1..];
        let actions: &[Action] = match words[0] {
            "free" => &[Action::FreeRequested, Action::FreeCompleted],
            w => match Action::ALL.iter().find(|a| a.name() == w) {
                Some(a) => std::slice::from_ref(a),
                None => {
                    return Err(Error::input(format!(
                        "unknown action {} (accepted: free, device, {})",
                        quoted(w),
                        Action::ALL.map(Action::name).join(", ")
                    ))
                    .at(place))
                }
            },
        };
        if rest.len() < 2 || rest.len() > 4 {
            return Err(Error::input(format!(
                "expected 'ACTION ADDR SIZE [sSTREAM] [@TIME]', found {}",
                quoted(line)
            ))
            .at(place));
        }
        let addr = parse_u64(rest[0])
            .ok_or_else(|| Error::input(format!("bad address {}", quoted(rest[0]))).at(place))?;
        let size = parse_u64(rest[1])
            .ok_or_else(|| Error::input(format!("bad size {}", quoted(rest[1]))).at(place))?;
        let mut stream = 0;
        let mut time = None;
        for w in &rest[2..] {
            if let Some(s) = w.strip_prefix('s') {
                stream = parse_u64(s)
                    .ok_or_else(|| Error::input(format!("bad stream {}", quoted(w))).at(place))?;
            } else if let Some(t) = w.strip_prefix('@') {
                time = Some(
                    t.parse::<i64>()
                        .map_err(|_| Error::input(format!("bad time {}", quoted(w))).at(place))?,
                );
            } else {
                return Err(Error::input(format!(
                    "unexpected field {} (expected sSTREAM or @TIME)",
                    quoted(w)
                ))
                .at(place));
            }
        }
        let events = device_events(&mut trace, &mut index, device);
        for &action in actions {
            let t = match time {
                Some(t) => {
                    has_times = true;
                    t
                }
                None => events.len() as i64,
            };
            let event = Event::new(action, addr, size, stream, t);
            limits::check_event(&event).map_err(|m| Error::input(m).at(place))?;
            events.push(event);
        }
    }
    trace.has_times = has_times;
    trace.devices.sort_by_key(|d| d.device);
    Ok(trace)
}

/// Writes `trace`'s events as text (segments, settings and frames are not part of this format).
pub(crate) fn write(trace: &Trace, out: &mut impl Write) -> Result<()> {
    let io = Error::from_io;
    writeln!(out, "# fragsim text trace v1").map_err(io)?;
    for d in &trace.devices {
        writeln!(out, "device {}", d.device).map_err(io)?;
        for e in &d.events {
            write!(out, "{} {:#x} {} s{}", e.action.name(), e.addr, e.size, e.stream)
                .map_err(io)?;
            if trace.has_times {
                write!(out, " @{}", e.time_us).map_err(io)?;
            }
            writeln!(out).map_err(io)?;
        }
    }
    Ok(())
}

/// The event list of `device`, created on its first event; `index` maps devices to positions.
fn device_events<'t>(
    trace: &'t mut Trace,
    index: &mut std::collections::HashMap<i32, usize>,
    device: i32,
) -> &'t mut Vec<Event> {
    let i = *index.entry(device).or_insert_with(|| {
        trace.devices.push(DeviceTrace { device, events: Vec::new() });
        trace.devices.len() - 1
    });
    &mut trace.devices[i].events
}

fn parse_u64(w: &str) -> Option<u64> {
    match w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => w.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_free_as_requested_then_completed() {
        let t =
            read(b"alloc 0x100 4096 s7\nfree 0x100 4096 s7\n", &ReadOptions::default()).unwrap();
        let e = &t.devices[0].events;
        assert_eq!(e.len(), 3);
        assert_eq!(e[0], Event::new(Action::Alloc, 0x100, 4096, 7, 0));
        assert_eq!(e[1].action, Action::FreeRequested);
        assert_eq!(e[2].action, Action::FreeCompleted);
        assert!(!t.has_times);
    }

    #[test]
    fn round_trips() {
        let src = "# fragsim text trace v1\ndevice 1\nalloc 0x100 4096 s0 @5\nfree_requested 0x100 4096 s0 @6\n";
        let t = read(src.as_bytes(), &ReadOptions::default()).unwrap();
        let mut out = Vec::new();
        write(&t, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), src);
    }

    #[test]
    fn errors_name_the_line() {
        let err = read(b"alloc 0x100 4096\nmalloc 1 2\n", &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().starts_with("line 2: unknown action 'malloc'"), "{err}");
        let err = read(b"alloc zz 4096\n", &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().contains("bad address 'zz'"), "{err}");
    }

    #[test]
    fn utf8_errors_name_the_byte_in_the_file_as_utf8error_does() {
        for data in [&b"alloc 0x100 4096\nalloc \xff 1\n"[..], b"alloc 0x100 4096\nalloc \xe2\x82"]
        {
            let whole = std::str::from_utf8(data).unwrap_err();
            let err = read(data, &ReadOptions::default()).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("byte {}: not UTF-8 text: {whole}", whole.valid_up_to())
            );
        }
    }
}
