//! fragsim's own binary trace format (`.fst`), for fast repeated runs on the same trace.
//!
//! Reading a PyTorch snapshot or a Kineto trace means parsing a pickle or tens of MB of JSON;
//! an `.fst` file holds the parsed [`Trace`] (events, interned frames, final segments, allocator
//! settings, the format of origin, whether times are real) and decodes at memory speed.
//!
//! Layout (all integers little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | [`MAGIC`] `FRAGSIM\0` |
//! | 8..12 | format version ([`VERSION`]) as u32 |
//! | 12..20 | body length in bytes as u64 |
//! | 20..24 | CRC-32 of the body as u32 |
//! | 24.. | body: bincode 2.0.1 (`bincode::serde`, `config::standard()`, varint) of a private wire struct |
//!
//! The CRC catches corruption that would otherwise decode into wrong numbers (bincode is not
//! self-describing); the body length catches truncation. Decoding borrows strings from the input
//! and serde grows lists as elements arrive, so memory stays proportional to the file, and a
//! bincode size limit bounds it as well. A change to the model types must bump [`VERSION`].

use super::limits;
use super::{
    AllocatorSettings, DeviceTotals, DeviceTrace, Format, Frame, FrameTable, FramesId, ReadOptions,
    Segment, Trace,
};
use crate::error::{Error, ErrorKind, Place, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;

/// The first bytes of every `.fst` file.
pub const MAGIC: &[u8] = b"FRAGSIM\0";

/// The version of the body layout this build reads and writes.
pub const VERSION: u32 = 2;

/// Bytes before the body: magic, version, body length, CRC.
const HEADER_LEN: usize = 24;

/// The most memory (in bincode's accounting of decoded values) one file may claim: far above any
/// real trace (about 40 bytes per event: 800 million events), far below what would exhaust a
/// workstation.
const DECODE_LIMIT: usize = 32 << 30;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// What the body holds, as written (borrowing the trace).
#[derive(Serialize)]
struct WireOut<'a> {
    format: Format,
    has_times: bool,
    devices: &'a [DeviceTrace],
    frames: Vec<&'a [Frame]>,
    segments: &'a [Segment],
    allocator_settings: &'a Option<AllocatorSettings>,
    recorded_totals: &'a [DeviceTotals],
}

/// What the body holds, as read.
#[derive(Deserialize)]
struct WireIn {
    format: Format,
    has_times: bool,
    devices: Vec<DeviceTrace>,
    frames: Vec<Vec<Frame>>,
    segments: Vec<Segment>,
    allocator_settings: Option<AllocatorSettings>,
    recorded_totals: Vec<DeviceTotals>,
}

/// Reads an .fst file.
pub fn read(data: &[u8], _options: &ReadOptions) -> Result<Trace> {
    let header = |what: &str| {
        Error::input(format!("truncated header: the file ends before its {what}"))
            .at(Place::Byte(data.len() as u64))
    };
    if !data.starts_with(MAGIC) {
        return Err(
            Error::input("missing the FRAGSIM magic bytes: not an .fst file").at(Place::Byte(0))
        );
    }
    let version = u32::from_le_bytes(le_bytes(data, 8).ok_or_else(|| header("version"))?);
    if version != VERSION {
        return Err(Error::input(format!(
            "unsupported .fst version {version} (this fragsim reads version {VERSION}); \
             re-create the file from the original trace with 'fragsim convert'"
        ))
        .at(Place::Byte(8)));
    }
    let body_len = u64::from_le_bytes(le_bytes(data, 12).ok_or_else(|| header("body length"))?);
    let crc = u32::from_le_bytes(le_bytes(data, 20).ok_or_else(|| header("checksum"))?);
    let body = &data[HEADER_LEN.min(data.len())..];
    if (body.len() as u64) < body_len {
        return Err(Error::input(format!(
            "truncated: the header declares a {body_len}-byte body but only {} bytes follow",
            body.len()
        ))
        .at(Place::Byte(data.len() as u64)));
    }
    if (body.len() as u64) > body_len {
        return Err(Error::input(format!(
            "{} unexpected bytes after the {body_len}-byte body",
            body.len() as u64 - body_len
        ))
        .at(Place::Byte(HEADER_LEN as u64 + body_len)));
    }
    let mut hasher = flate2::Crc::new();
    hasher.update(body);
    if hasher.sum() != crc {
        return Err(Error::input(format!(
            "checksum mismatch (recorded {crc:#010x}, computed {:#010x}): the file is corrupt",
            hasher.sum()
        ))
        .at(Place::Byte(HEADER_LEN as u64)));
    }
    let (wire, used): (WireIn, usize) = bincode::serde::borrow_decode_from_slice(body, config())
        .map_err(|e| {
            Error::input(format!("undecodable body ({e}): written by an incompatible build?"))
                .at(Place::Byte(HEADER_LEN as u64))
        })?;
    if used != body.len() {
        return Err(Error::input(format!(
            "{} unexpected bytes after the encoded trace",
            body.len() - used
        ))
        .at(Place::Byte((HEADER_LEN + used) as u64)));
    }
    from_wire(wire)
}

/// Checks what the body decoded to and turns it into a [`Trace`].
fn from_wire(wire: WireIn) -> Result<Trace> {
    let mut frames = FrameTable::default();
    for (i, stack) in wire.frames.into_iter().enumerate() {
        if frames.intern(stack) != FramesId(i as u32 + 1) {
            return Err(Error::input(format!("frame list {} is empty or repeated", i + 1)));
        }
    }
    let mut devices = wire.devices;
    devices.sort_by_key(|d| d.device);
    if let Some(w) = devices.windows(2).find(|w| w[0].device == w[1].device) {
        return Err(Error::input(format!("device {} appears twice", w[0].device)));
    }
    for d in &devices {
        for (i, e) in d.events.iter().enumerate() {
            if e.frames.0 as usize > frames.len() {
                return Err(Error::input(format!(
                    "device {}: frame list {} does not exist (the file has {})",
                    d.device,
                    e.frames.0,
                    frames.len()
                ))
                .at(Place::Event(i as u64)));
            }
        }
    }
    let trace = Trace {
        format: Format::Fst,
        converted_from: Some(wire.format),
        devices,
        frames,
        segments: wire.segments,
        allocator_settings: wire.allocator_settings,
        has_times: wire.has_times,
        recorded_totals: wire.recorded_totals,
    };
    // Sizes, ranges, times, devices and streams: the one table every reader keeps.
    limits::check_trace(&trace)?;
    Ok(trace)
}

fn le_bytes<const N: usize>(data: &[u8], at: usize) -> Option<[u8; N]> {
    data.get(at..at + N)?.try_into().ok()
}

/// What writing `trace` as .fst leaves out: nothing, the format holds the whole model.
pub fn losses(_trace: &Trace) -> Vec<String> {
    Vec::new()
}

/// Writes `trace` as .fst (nothing is lost: the format holds the whole model).
pub fn write(trace: &Trace, out: &mut impl Write) -> Result<()> {
    let frames = (1..=trace.frames.len() as u32).map(|i| trace.frames.get(FramesId(i))).collect();
    let wire = WireOut {
        format: trace.source_format(),
        has_times: trace.has_times,
        devices: &trace.devices,
        frames,
        segments: &trace.segments,
        allocator_settings: &trace.allocator_settings,
        recorded_totals: &trace.recorded_totals,
    };
    let body = bincode::serde::encode_to_vec(&wire, config())
        .map_err(|e| Error::new(ErrorKind::Io, format!("encoding the .fst body: {e}")))?;
    let mut crc = flate2::Crc::new();
    crc.update(&body);
    let io = Error::from_io;
    out.write_all(MAGIC).map_err(io)?;
    out.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    out.write_all(&(body.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(&crc.sum().to_le_bytes()).map_err(io)?;
    out.write_all(&body).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Action, Block, BlockState, Event, PoolKind, RecordedTotals};

    fn sample() -> Trace {
        let mut frames = FrameTable::default();
        let f = frames.intern(vec![Frame {
            filename: "train.py".into(),
            line: 12,
            name: "step".into(),
        }]);
        let mut alloc = Event::new(Action::Alloc, 0x7f00_0000_0000, 4096, 7, 1_700_000_000_000_000);
        alloc.frames = f;
        Trace {
            format: Format::PytorchSnapshot,
            converted_from: None,
            devices: vec![
                DeviceTrace {
                    device: 0,
                    events: vec![
                        alloc,
                        Event::new(
                            Action::FreeCompleted,
                            0x7f00_0000_0000,
                            4096,
                            7,
                            1_700_000_000_000_009,
                        ),
                    ],
                },
                DeviceTrace {
                    device: 1,
                    events: vec![Event::new(Action::Oom, 123, 1 << 40, 0, 5)],
                },
            ],
            frames,
            segments: vec![Segment {
                device: 0,
                address: 0x7f00_0000_0000,
                total_size: 2 << 20,
                stream: 7,
                pool: PoolKind::Small,
                is_expandable: false,
                blocks: vec![Block {
                    address: 0x7f00_0000_0000,
                    size: 2 << 20,
                    requested_size: 0,
                    state: BlockState::Inactive,
                }],
            }],
            allocator_settings: Some(AllocatorSettings {
                conf: Some("expandable_segments:True".into()),
                max_split_size: None,
                garbage_collection_threshold: 0.6,
                expandable_segments: true,
                roundup_power2_divisions: [4; 16],
                release_lock_on_cudamalloc: false,
            }),
            has_times: true,
            recorded_totals: vec![DeviceTotals {
                device: 0,
                totals: vec![RecordedTotals { allocated: 4096, reserved: 2 << 20 }; 2],
            }],
        }
    }

    fn encode(t: &Trace) -> Vec<u8> {
        let mut out = Vec::new();
        write(t, &mut out).unwrap();
        out
    }

    #[test]
    fn round_trips_the_whole_model() {
        let t = sample();
        let back = read(&encode(&t), &ReadOptions::default()).unwrap();
        assert_eq!((back.format, back.converted_from), (Format::Fst, Some(t.format)));
        assert_eq!(Trace { format: t.format, converted_from: None, ..back.clone() }, t);
        let again = read(&encode(&back), &ReadOptions::default()).unwrap();
        assert_eq!(again, back, "an .fst of an .fst keeps the format of origin");
    }

    #[test]
    fn rejects_truncation_corruption_and_other_versions() {
        let data = encode(&sample());
        let opts = ReadOptions::default();
        for cut in [3, 10, 23, 24, data.len() - 1] {
            let err = read(&data[..cut], &opts).map(|_| ()).unwrap_err();
            assert!(
                err.to_string().contains("truncated") || err.to_string().contains("magic"),
                "{cut}: {err}"
            );
        }
        let mut bad = data.clone();
        bad[40] ^= 0x55;
        assert!(read(&bad, &opts).unwrap_err().to_string().contains("checksum mismatch"));
        let mut other = data.clone();
        other[8] = 3;
        assert_eq!(
            read(&other, &opts).unwrap_err().to_string(),
            "byte 8: unsupported .fst version 3 (this fragsim reads version 2); re-create the file from the original trace with 'fragsim convert'"
        );
        let mut longer = data.clone();
        longer.push(0);
        assert!(read(&longer, &opts).unwrap_err().to_string().contains("1 unexpected bytes"));
    }

    #[test]
    fn a_hostile_length_with_a_valid_checksum_fails_without_allocating() {
        // A body that declares a frame list of 2^62 entries, with a correct CRC.
        let mut body = Vec::new();
        body.extend([0u8, 0, 0]); // format, has_times, no devices
        body.push(0xfd); // varint marker for a u64 length...
        body.extend((1u64 << 62).to_le_bytes());
        let mut crc = flate2::Crc::new();
        crc.update(&body);
        let mut data = MAGIC.to_vec();
        data.extend(VERSION.to_le_bytes());
        data.extend((body.len() as u64).to_le_bytes());
        data.extend(crc.sum().to_le_bytes());
        data.extend(&body);
        let err = read(&data, &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().starts_with("byte 24: undecodable body"), "{err}");
    }
}
