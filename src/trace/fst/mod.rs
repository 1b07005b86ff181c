//! fragsim's own binary trace format (`.fst`), for fast repeated runs on the same trace.
//!
//! Reading a PyTorch snapshot or a Kineto trace means parsing a pickle or tens of MB of JSON;
//! an `.fst` file holds the parsed [`Trace`] (events, interned frames, final segments, allocator
//! settings, the format of origin, whether times are real) and decodes at memory speed.
//!
//! The layout is defined in docs/interface.md#fst-wire-layout (every enum by a fixed tag, so a
//! file means what that page says whatever the order of a Rust enum); version 8, in short:
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | [`MAGIC`] `FRAGSIM\0` |
//! | 8..12 | format version ([`VERSION`]) as u32 |
//! | 12.. | records, each: body length as u64, CRC-32 of the body as u32, body |
//!
//! Every body is bincode 2.0.1 (`bincode::serde`, `config::standard()`, varint). The first
//! record's body is the head (the format of origin, whether times are real, each device with its
//! event count, the interned frames, final segments, allocator settings, each device's count
//! of recorded totals, the private pools the entries name, and what a snapshot records beside
//! its memory events: [`SnapshotExtras`], the platform the recording shows: [`Platform`], and
//! whether torch_npu made it: [`Trace::torch_npu`]) followed by a chunk; every later body is a
//! chunk alone. A chunk is the next at most [`CHUNK`] events of the flat sequence "device 0's
//! events, device 1's, ..." and the next at most [`CHUNK`] recorded totals of the same kind of
//! sequence. So a small trace is one record, and a reader holds one record at a time: memory
//! while reading is the events plus one chunk.
//! A replay consumes the events record by record without loading them ([`FstStream`]): it reads
//! the head once, then the file from its start for each pass, holding one record at a time.
//!
//! Version 7 is version 8 without the torch_npu mark (a file of it reads as a trace whose frames
//! alone tell), version 6 version 7 without the platform (a file of it reads as a trace that
//! shows none), version 5 version 6 without the extras (a file of it reads as a trace that has
//! none).
//! A file of another version is refused: versions 1 to 4 were written by development builds
//! before this layout was fixed, and the message says to re-convert such a file from its source
//! trace. The CRC catches corruption that would otherwise decode into wrong numbers (bincode is
//! not self-describing); the body length catches truncation. Lists grow as elements arrive,
//! never from a declared length alone, and a bincode size limit bounds each record as well. A
//! change to the model types must bump [`VERSION`].

use super::limits;
use super::{
    AllocatorSettings, DeviceTotals, DeviceTrace, Event, Format, Frame, FrameTable, FramesId,
    Platform, PoolId, PoolRef, ReadOptions, RecordedTotals, Segment, SnapshotExtras, Trace,
};
use crate::error::{Error, ErrorKind, Place, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

mod chunk;

/// The first bytes of every `.fst` file.
pub const MAGIC: &[u8] = b"FRAGSIM\0";

/// The version of the layout this build writes.
pub const VERSION: u32 = 8;

/// The oldest version this build reads: version 5, which has no [`SnapshotExtras`] in its head.
pub const OLDEST_READ: u32 = 5;

/// Whether this build reads files of `version`.
fn reads(version: u32) -> bool {
    (OLDEST_READ..=VERSION).contains(&version)
}

/// The most events (and, separately, recorded totals) one record holds: about 250 KB encoded and
/// 650 KB decoded, the bound on what a reader buffers beside the events.
pub const CHUNK: usize = 1 << 14;

/// Bytes before the first record's body: magic, version, body length, CRC.
const HEADER_LEN: usize = 24;

/// The most memory (in bincode's accounting of decoded values) one record may claim: far above
/// any real trace (about 40 bytes per event: 800 million events), far below what would exhaust a
/// workstation.
const DECODE_LIMIT: usize = 32 << 30;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_LIMIT>()
}

/// The head of a version 8 file, as written (borrowing the trace).
#[derive(Serialize)]
struct HeadOut<'a> {
    format: Format,
    has_times: bool,
    devices: Vec<(i32, u64)>,
    frames: Vec<&'a [Frame]>,
    segments: &'a [Segment],
    allocator_settings: &'a Option<AllocatorSettings>,
    totals: Vec<(i32, u64)>,
    entry_pools: &'a Option<Vec<PoolId>>,
    extras: &'a SnapshotExtras,
    platform: Option<Platform>,
    torch_npu: bool,
}

/// The head of a version 8 file, as read: bincode writes a nested struct's fields in place,
/// so this reads what [`HeadOut`] writes.
#[derive(Deserialize)]
struct HeadIn {
    base: HeadBase,
    entry_pools: Option<Vec<PoolId>>,
    extras: SnapshotExtras,
    platform: Option<Platform>,
    torch_npu: bool,
}

/// The head of a version 7 file: a version 8 head without the torch_npu mark.
#[derive(Deserialize)]
struct HeadIn7 {
    base: HeadBase,
    entry_pools: Option<Vec<PoolId>>,
    extras: SnapshotExtras,
    platform: Option<Platform>,
}

/// The head of a version 6 file: a version 7 head without the platform.
#[derive(Deserialize)]
struct HeadIn6 {
    base: HeadBase,
    entry_pools: Option<Vec<PoolId>>,
    extras: SnapshotExtras,
}

/// The head of a version 5 file: a version 6 head without the extras.
#[derive(Deserialize)]
struct HeadIn5 {
    base: HeadBase,
    entry_pools: Option<Vec<PoolId>>,
}

/// All but the last field of a head.
#[derive(Deserialize)]
struct HeadBase {
    format: Format,
    has_times: bool,
    devices: Vec<(i32, u64)>,
    frames: Vec<Vec<Frame>>,
    segments: Vec<Segment>,
    allocator_settings: Option<AllocatorSettings>,
    totals: Vec<(i32, u64)>,
}

/// Reads an .fst file held in memory.
pub fn read(data: &[u8], options: &ReadOptions) -> Result<Trace> {
    read_from(&mut &data[..], options)
}

/// Reads an .fst file from a stream, one record at a time.
pub(crate) fn read_from(input: &mut dyn BufRead, _options: &ReadOptions) -> Result<Trace> {
    let mut head = [0u8; 12];
    let got = read_up_to(input, &mut head)?;
    if !head[..got].starts_with(MAGIC) {
        return Err(
            Error::input("missing the FRAGSIM magic bytes: not an .fst file").at(Place::Byte(0))
        );
    }
    if got < 12 {
        return Err(Error::input("truncated header: the file ends before its version")
            .at(Place::Byte(got as u64)));
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if !reads(version) {
        return Err(other_version(version));
    }
    Chunked { input, at: 12, body: Vec::new(), crc: 0 }.read(version)
}

/// The error for a file of a `version` this build does not read: one of the layouts
/// development builds wrote before the layout was fixed (1 to 4), or an unknown one. The reader
/// adds the file.
fn other_version(version: u32) -> Error {
    let message = if (1..OLDEST_READ).contains(&version) {
        format!(
            "written by an earlier build of fragsim: .fst version {version}, and this build reads \
             versions {OLDEST_READ} to {VERSION}; re-convert the file from its source trace with \
             'fragsim convert SOURCE FILE.fst'"
        )
    } else {
        format!(
            "unsupported .fst version {version} (this build reads versions {OLDEST_READ} to \
             {VERSION}); re-create the file from the original trace with 'fragsim convert'"
        )
    };
    Error::input(message).at(Place::Byte(8))
}

/// Fills `buf` as far as the input goes; returns how many bytes were read.
fn read_up_to(input: &mut dyn BufRead, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::from_io(e)),
        }
    }
    Ok(got)
}

/// A file after its version: the input, the byte offset reached, and a buffer for one record's
/// body.
struct Chunked<'r> {
    input: &'r mut dyn BufRead,
    at: u64,
    body: Vec<u8>,
    /// The checksum of the record read last.
    crc: u32,
}

impl Chunked<'_> {
    /// Reads the next record's body into `self.body` and checks its length and CRC; returns
    /// false at the end of the input. `what` names the record for a header cut short.
    fn next_record(&mut self) -> Result<bool> {
        let mut header = [0u8; 12];
        let got = read_up_to(self.input, &mut header)?;
        if got == 0 {
            return Ok(false);
        }
        if got < 12 {
            let what = if got < 8 { "body length" } else { "checksum" };
            return Err(Error::input(format!("truncated header: the file ends before its {what}"))
                .at(Place::Byte(self.at + got as u64)));
        }
        let len = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(header[8..].try_into().unwrap_or_default());
        let start = self.at + 12;
        self.body.clear();
        // Room for a record of usual size at once; beyond that the buffer grows as bytes
        // arrive, so a hostile length costs nothing until the bytes exist.
        self.body.reserve_exact(len.min(4 << 20) as usize);
        self.input.take(len).read_to_end(&mut self.body).map_err(Error::from_io)?;
        if (self.body.len() as u64) < len {
            return Err(Error::input(format!(
                "truncated: the header declares a {len}-byte body but only {} bytes follow",
                self.body.len()
            ))
            .at(Place::Byte(start + self.body.len() as u64)));
        }
        let mut hasher = flate2::Crc::new();
        hasher.update(&self.body);
        if hasher.sum() != crc {
            return Err(Error::input(format!(
                "checksum mismatch (recorded {crc:#010x}, computed {:#010x}): the file is corrupt",
                hasher.sum()
            ))
            .at(Place::Byte(start)));
        }
        self.at = start + len;
        self.crc = crc;
        Ok(true)
    }

    /// Reads the first record and decodes its head, as a file of `version` lays it out;
    /// returns the head and where its first chunk starts in the body.
    fn head(&mut self, version: u32) -> Result<(HeadIn, usize)> {
        if !self.next_record()? {
            return Err(Error::input("truncated header: the file ends before its body length")
                .at(Place::Byte(12)));
        }
        let at = self.body_start();
        let undecodable = |e| undecodable(e, at);
        let (head, used): (HeadIn, usize) = match version {
            5 => {
                let (HeadIn5 { base, entry_pools }, used): (HeadIn5, usize) =
                    bincode::serde::decode_from_slice(&self.body, config()).map_err(undecodable)?;
                let extras = SnapshotExtras::default();
                (HeadIn { base, entry_pools, extras, platform: None, torch_npu: false }, used)
            }
            6 => {
                let (HeadIn6 { base, entry_pools, extras }, used): (HeadIn6, usize) =
                    bincode::serde::decode_from_slice(&self.body, config()).map_err(undecodable)?;
                (HeadIn { base, entry_pools, extras, platform: None, torch_npu: false }, used)
            }
            7 => {
                let (HeadIn7 { base, entry_pools, extras, platform }, used): (HeadIn7, usize) =
                    bincode::serde::decode_from_slice(&self.body, config()).map_err(undecodable)?;
                (HeadIn { base, entry_pools, extras, platform, torch_npu: false }, used)
            }
            _ => bincode::serde::decode_from_slice(&self.body, config()).map_err(undecodable)?,
        };
        check_entry_pools(&head.entry_pools).map_err(|e| e.at(Place::Byte(at)))?;
        check_extras(&head.extras).map_err(|e| e.at(Place::Byte(at)))?;
        Ok((head, used))
    }

    /// The byte offset of the current record's body.
    fn body_start(&self) -> u64 {
        self.at - self.body.len() as u64
    }

    /// Decodes the chunk that fills the current record's body from `offset` on.
    fn chunk(&self, offset: usize) -> Result<(Vec<Event>, Vec<RecordedTotals>)> {
        let start = self.body_start();
        let rest = self.body.get(offset..).unwrap_or_default();
        let undecodable = |e| undecodable(e, start + offset as u64);
        let (chunk, used) = if let Some((events, totals, used)) = chunk::decode(rest, DECODE_LIMIT)
        {
            ((events, totals), used)
        } else {
            bincode::serde::decode_from_slice(rest, config()).map_err(undecodable)?
        };
        if used != rest.len() {
            return Err(Error::input(format!(
                "{} unexpected bytes after the encoded chunk",
                rest.len() - used
            ))
            .at(Place::Byte(start + (offset + used) as u64)));
        }
        Ok(chunk)
    }

    /// Reads the next record, where the head declares more events than were read.
    fn next_chunk(&mut self, read: u64, declared: u64) -> Result<()> {
        if self.next_record()? {
            return Ok(());
        }
        Err(Error::input(format!(
            "truncated: the file ends after {read} of the {declared} events its head declares"
        ))
        .at(Place::Byte(self.at)))
    }

    /// Checks that nothing follows the last record.
    fn end(&mut self) -> Result<()> {
        let mut rest = [0u8; 1];
        if read_up_to(self.input, &mut rest)? > 0 {
            let mut extra = Vec::new();
            self.input.read_to_end(&mut extra).map_err(Error::from_io)?;
            return Err(Error::input(format!(
                "{} unexpected bytes after the last record",
                extra.len() + 1
            ))
            .at(Place::Byte(self.at)));
        }
        Ok(())
    }

    /// Reads the records of a file of `version` into a trace.
    fn read(mut self, version: u32) -> Result<Trace> {
        let (HeadIn { base: head, entry_pools, extras, platform, torch_npu }, mut offset) =
            self.head(version)?;
        let frames = intern_frames(head.frames).map_err(at_head)?;
        let refs = Refs { frames: &frames, pools: pool_count(&entry_pools) };
        let mut fill = Fill::new(&head.devices, &head.totals);
        loop {
            let (events, totals) = self.chunk(offset)?;
            fill.add(events, totals, refs).map_err(|e| e.at(Place::Byte(self.body_start())))?;
            if fill.is_full() {
                break;
            }
            self.next_chunk(fill.events_read, fill.events_declared)?;
            offset = 0;
        }
        self.end()?;
        let mut devices = fill.devices;
        devices.sort_by_key(|d| d.device);
        check_devices(devices.iter().map(|d| d.device)).map_err(at_head)?;
        check_segments(&head.segments).map_err(at_head)?;
        let torch_npu = torch_npu || frames.names_torch_npu();
        Ok(Trace {
            format: Format::Fst,
            converted_from: Some(head.format),
            devices,
            frames,
            segments: head.segments,
            allocator_settings: head.allocator_settings,
            has_times: head.has_times,
            recorded_totals: fill.totals,
            entry_pools,
            torch_npu,
            extras,
            platform,
        })
    }
}

/// The error for a body bincode cannot decode, at byte `at`, in fragsim's words
/// ([`what_is_wrong`]): bincode's own text is its Debug form (`Utf8 { inner: ... }`).
fn undecodable(e: bincode::error::DecodeError, at: u64) -> Error {
    let what = what_is_wrong(&e);
    Error::input(format!(
        "undecodable body ({what}): damaged, or written by an incompatible build?"
    ))
    .at(Place::Byte(at))
}

/// What bincode found wrong in a body, in plain terms: a file whose CRC holds but whose body
/// does not decode was damaged before its CRC was made, or was written by another build, and
/// the user can act on "a string that is not UTF-8", not on a decoder's variant names.
fn what_is_wrong(e: &bincode::error::DecodeError) -> String {
    use bincode::error::DecodeError as D;
    match e {
        D::UnexpectedEnd { .. } | D::Io { .. } => "it ends inside a value".into(),
        D::LimitExceeded | D::OutsideUsizeRange(_) => "a length beyond the file".into(),
        D::InvalidIntegerType { .. } => "a number of the wrong width".into(),
        D::NonZeroTypeIsZero { .. } => "a zero where a number of at least 1 belongs".into(),
        D::UnexpectedVariant { found, .. } => format!("an unknown kind code {found}"),
        D::Utf8 { .. } | D::InvalidCharEncoding(_) => "a string that is not UTF-8".into(),
        D::InvalidBooleanValue(b) => format!("a flag of {b}, neither 0 nor 1"),
        D::ArrayLengthMismatch { required, found } => {
            format!("a list of {found} values where {required} belong")
        }
        // serde's words for an enum tag out of range: "invalid value: integer `72`, expected
        // variant index 0 <= i < 9".
        D::OtherString(s) if s.contains("variant index") => {
            let code = s.split('`').nth(1).filter(|c| c.bytes().all(|b| b.is_ascii_digit()));
            code.map_or_else(
                || "an unknown kind code".into(),
                |c| format!("an unknown kind code {c}"),
            )
        }
        _ => "a value this build does not know".into(),
    }
}

/// The frame table of a head's frame lists, numbered as written (each list once, none empty).
fn intern_frames(lists: Vec<Vec<Frame>>) -> Result<FrameTable> {
    let mut frames = FrameTable::default();
    for (i, stack) in lists.into_iter().enumerate() {
        if frames.intern(stack) != FramesId(i as u32 + 1) {
            return Err(Error::input(format!("frame list {} is empty or repeated", i + 1)));
        }
    }
    Ok(frames)
}

/// An `.fst` file opened to stream one device's events, record by
/// record, without loading them: what `replay` runs on. Opening reads the head (frames, final
/// segments, settings, each device's event count); `FstStream::each_event` then reads the file
/// again from its start for each pass, holding one record at a time, so memory does not grow with
/// the trace's length.
///
/// **One file, one identity.** The stream keeps the file it opened: every pass reads that open
/// file (by position, so passes may run at once), not whatever the path names by then. Each pass
/// first checks the file is still the one opened — the path still names it (not replaced by `mv`),
/// its size and modification time are unchanged (not rewritten in place) — and every record's
/// checksum is compared with the one the first pass read there, so a replay never mixes two
/// traces' events: a changed file is an error naming it.
#[derive(Debug)]
pub struct FstStream {
    path: PathBuf,
    file: std::fs::File,
    identity: Identity,
    head: Trace,
    devices: Vec<(i32, u64)>,
    first_chunk: usize,
    /// The file's layout version, which every pass checks again.
    version: u32,
    /// Each record's checksum as first read, in file order.
    checksums: std::sync::Mutex<Vec<u32>>,
}

/// What identifies the file a stream opened: size, modification time and (device, inode).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    len: u64,
    modified: Option<std::time::SystemTime>,
    node: Option<(u64, u64)>,
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        Identity { len: m.len(), modified: m.modified().ok(), node: node(m) }
    }
}

#[cfg(unix)]
fn node(m: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn node(_m: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// Reads an open file from a position of its own, leaving the file's shared offset alone, so
/// several passes over one descriptor can run at once.
struct At<'f> {
    file: &'f std::fs::File,
    pos: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        #[cfg(unix)]
        let n = std::os::unix::fs::FileExt::read_at(self.file, buf, self.pos)?;
        #[cfg(windows)]
        let n = std::os::windows::fs::FileExt::seek_read(self.file, buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The error for a streamed file that is no longer the one opened.
fn changed(what: &str) -> Error {
    Error::input(format!(
        "the file changed while it was replayed ({what}): rerun on a file that stays put, or copy it first"
    ))
    .in_format(Format::Fst.name())
}

impl FstStream {
    /// Opens `path` for streaming when it is an uncompressed chunked `.fst` file whose head
    /// declares no recorded totals (those belong beside every event: a trace with them is
    /// loaded); `Ok(None)` for any other file, which the caller reads as usual. Errors in the
    /// head name the file.
    pub fn open(path: &Path) -> Result<Option<FstStream>> {
        // Only a regular file can be read again from its start (not a pipe).
        if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            return Ok(None);
        }
        let file = std::fs::File::open(path).map_err(|e| Error::reading(path, e))?;
        let mut input = std::io::BufReader::new(file);
        let mut start = [0u8; 12];
        let got = read_up_to(&mut input, &mut start).map_err(|e| e.in_file(path))?;
        let version = u32::from_le_bytes([start[8], start[9], start[10], start[11]]);
        if got < 12 || !start.starts_with(MAGIC) || !reads(version) {
            return Ok(None); // read as usual: refused there, with the reader's message
        }
        let mut records = Chunked { input: &mut input, at: 12, body: Vec::new(), crc: 0 };
        let in_file = |e: Error| at_head(e).in_format(Format::Fst.name()).in_file(path);
        let (HeadIn { base: head, entry_pools, extras, platform, torch_npu }, first_chunk) =
            records.head(version).map_err(in_file)?;
        // Exact-address allocations are found among the events near each mark before a replay
        // starts: a trace with them is loaded.
        if !head.totals.is_empty() || !extras.malloc_with_address_events.is_empty() {
            return Ok(None);
        }
        let frames = intern_frames(head.frames).map_err(in_file)?;
        let mut devices = head.devices.clone();
        devices.sort_by_key(|d| d.0);
        if let Some(w) = devices.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(in_file(Error::input(format!("device {} appears twice", w[0].0))));
        }
        for &(device, n) in &devices {
            limits::check_device(device as i64).map_err(|m| in_file(Error::input(m)))?;
            if n > limits::EVENTS_PER_DEVICE as u64 {
                return Err(in_file(Error::input(format!(
                    "device {device}: {n} events, more than 2^32"
                ))));
            }
        }
        check_segments(&head.segments).map_err(in_file)?;
        let torch_npu = torch_npu || frames.names_torch_npu();
        let trace = Trace {
            format: Format::Fst,
            converted_from: Some(head.format),
            devices: Vec::new(),
            frames,
            segments: head.segments,
            allocator_settings: head.allocator_settings,
            has_times: head.has_times,
            recorded_totals: Vec::new(),
            entry_pools,
            torch_npu,
            extras,
            platform,
        };
        let file = input.into_inner();
        let identity = Identity::of(&file.metadata().map_err(|e| Error::io(path, e))?);
        Ok(Some(FstStream {
            path: path.to_path_buf(),
            file,
            identity,
            checksums: std::sync::Mutex::new(Vec::new()),
            head: trace,
            devices: head.devices,
            first_chunk,
            version,
        }))
    }

    /// Checks the path still names the file opened, unchanged (see the type's docs).
    fn same_file(&self) -> Result<()> {
        let now = self.file.metadata().map_err(|e| Error::io(&self.path, e))?;
        let held = Identity::of(&now);
        if held.len != self.identity.len {
            return Err(changed(&format!(
                "it held {} bytes and now holds {}",
                self.identity.len, held.len
            )));
        }
        if held.modified != self.identity.modified {
            return Err(changed("it was written to"));
        }
        match std::fs::metadata(&self.path) {
            Ok(m) if node(&m) == self.identity.node => Ok(()),
            Ok(_) => Err(changed("the path now names another file")),
            Err(e) => Err(changed(&format!("the path is gone: {e}"))),
        }
    }

    /// The trace without its events (no devices): format, frames, final segments, settings.
    pub(crate) fn head(&self) -> &Trace {
        &self.head
    }

    /// The file streamed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Each device with its number of events, in device order.
    pub fn devices(&self) -> Vec<(i32, u64)> {
        let mut d = self.devices.clone();
        d.sort_by_key(|d| d.0);
        d
    }

    /// The number of events of `device`, if the file has it.
    pub(crate) fn events_of(&self, device: i32) -> Option<u64> {
        self.devices.iter().find(|d| d.0 == device).map(|d| d.1)
    }

    /// The device with the most events, as [`Trace::default_device`] picks it from a loaded
    /// trace.
    pub(crate) fn default_device(&self) -> Option<i32> {
        self.devices.iter().max_by_key(|d| super::device_rank(d.1 as usize, d.0)).map(|d| d.0)
    }

    /// Reads the file from its start and hands `f` the first `limit` events of `device` in
    /// order, with their index, each checked as the loader checks it. With `whole`, it reads on
    /// to the end and checks the rest as the loader does (every event of every device, the
    /// declared counts, nothing after the last record): the first pass of a replay does, so a
    /// file the loader rejects is rejected here too. Errors name the file.
    pub(crate) fn each_event(
        &self,
        device: i32,
        limit: u64,
        whole: bool,
        mut f: impl FnMut(u64, &Event) -> Result<()>,
    ) -> Result<()> {
        let path = &self.path;
        self.same_file().map_err(|e| e.in_file(path))?;
        let mut input = std::io::BufReader::with_capacity(1 << 16, At { file: &self.file, pos: 0 });
        let mut start = [0u8; 12];
        read_up_to(&mut input, &mut start).map_err(|e| e.in_file(path))?;
        if !start.starts_with(MAGIC) || start[8..] != self.version.to_le_bytes() {
            return Err(Error::input("the file changed while it was replayed")
                .in_format(Format::Fst.name())
                .in_file(path));
        }
        let mut records = Chunked { input: &mut input, at: 12, body: Vec::new(), crc: 0 };
        let mut record = 0usize;
        // Each record's checksum against the one read there first (see the type's docs).
        let mut same_record = |crc: u32, at: u64| -> Result<()> {
            let mut seen = self.checksums.lock().unwrap_or_else(|p| p.into_inner());
            match seen.get(record) {
                Some(&first) if first != crc => {
                    return Err(changed(&format!(
                        "record {record} now has checksum {crc:#010x}, {first:#010x} before"
                    ))
                    .at(Place::Byte(at)))
                }
                Some(_) => {}
                None => seen.push(crc),
            }
            record += 1;
            Ok(())
        };
        let declared = self.devices.iter().fold(0u64, |s, d| s.saturating_add(d.1));
        // The flat sequence's bounds of each device, in file order.
        let mut bounds = Vec::with_capacity(self.devices.len());
        let mut at = 0u64;
        for &(d, n) in &self.devices {
            bounds.push((d, at, at + n));
            at += n;
        }
        let (from, to) = bounds
            .iter()
            .find(|b| b.0 == device)
            .map_or((0, 0), |&(_, from, to)| (from, to.min(from.saturating_add(limit))));
        let end = if whole { declared } else { to };
        let refs = Refs { frames: &self.head.frames, pools: pool_count(&self.head.entry_pools) };
        let mut flat = 0u64;
        let mut run = || -> Result<()> {
            if !records.next_record()? {
                return Err(Error::input("truncated header: the file ends before its body length")
                    .at(Place::Byte(12)));
            }
            same_record(records.crc, 12)?;
            let (mut offset, mut current) = (self.first_chunk, 0);
            loop {
                let (events, totals) = records.chunk(offset)?;
                offset = 0;
                let place = Place::Byte(records.body_start());
                let more = || Error::input("a record holds more than the head declares").at(place);
                if !totals.is_empty() {
                    return Err(more());
                }
                for e in &events {
                    while bounds.get(current).is_some_and(|b| flat >= b.2) {
                        current += 1;
                    }
                    let &(d, first, _) = bounds.get(current).ok_or_else(more)?;
                    if whole || d == device {
                        check_event(d, (flat - first) as usize, e, refs)?;
                    }
                    if flat >= from && flat < to {
                        f(flat - from, e)?;
                    }
                    flat += 1;
                }
                if flat >= end {
                    break;
                }
                if events.is_empty() {
                    return Err(Error::input("an empty record before the last").at(place));
                }
                let at = records.at;
                records.next_chunk(flat, declared)?;
                same_record(records.crc, at)?;
            }
            if whole {
                records.end()?;
            }
            Ok(())
        };
        run().map_err(|e| {
            // A file cut short or rewritten during this pass reads as damaged from where it
            // changed (a record length of 277 TB, a truncated body): when it is no longer the
            // file opened, say so, at the place the pass stopped, rather than blame its bytes.
            let e = match (e.kind(), self.same_file()) {
                (crate::error::ErrorKind::Input, Err(changed)) => match e.location().place {
                    Some(place) => changed.at(place),
                    None => changed,
                },
                _ => e,
            };
            e.in_format(Format::Fst.name()).in_file(path)
        })
    }
}

/// The devices' events and totals as chunks arrive, against the counts the head declares.
struct Fill {
    devices: Vec<DeviceTrace>,
    declared: Vec<u64>,
    totals: Vec<DeviceTotals>,
    totals_declared: Vec<u64>,
    events_read: u64,
    events_declared: u64,
}

impl Fill {
    fn new(devices: &[(i32, u64)], totals: &[(i32, u64)]) -> Fill {
        Fill {
            devices: devices
                .iter()
                .map(|&(device, n)| DeviceTrace { device, events: room_for(n) })
                .collect(),
            declared: devices.iter().map(|d| d.1).collect(),
            totals: totals
                .iter()
                .map(|&(device, n)| DeviceTotals { device, totals: room_for(n) })
                .collect(),
            totals_declared: totals.iter().map(|t| t.1).collect(),
            events_read: 0,
            events_declared: devices.iter().fold(0u64, |s, d| s.saturating_add(d.1)),
        }
    }

    fn is_full(&self) -> bool {
        self.devices.iter().zip(&self.declared).all(|(d, &n)| d.events.len() as u64 == n)
            && self
                .totals
                .iter()
                .zip(&self.totals_declared)
                .all(|(t, &n)| t.totals.len() as u64 == n)
    }

    /// Appends one chunk, checking each event as it lands.
    fn add(&mut self, events: Vec<Event>, totals: Vec<RecordedTotals>, refs: Refs) -> Result<()> {
        let mut events = events.into_iter();
        for (d, &n) in self.devices.iter_mut().zip(&self.declared) {
            while (d.events.len() as u64) < n {
                let Some(e) = events.next() else { break };
                check_event(d.device, d.events.len(), &e, refs)?;
                d.events.push(e);
                self.events_read += 1;
            }
        }
        let mut totals = totals.into_iter();
        for (t, &n) in self.totals.iter_mut().zip(&self.totals_declared) {
            let room = n.saturating_sub(t.totals.len() as u64) as usize;
            t.totals.extend(totals.by_ref().take(room));
        }
        if events.next().is_some() || totals.next().is_some() {
            return Err(Error::input("a record holds more than the head declares"));
        }
        Ok(())
    }
}

/// A vector with room for the `n` items the head declares, so loading never copies a growing
/// vector (which would hold the old and the new copy at once). The room is only reserved, not
/// touched, so a hostile count costs address space, not memory; a count beyond the decode limit,
/// or one the system refuses, starts at one chunk and grows as items arrive.
fn room_for<T>(n: u64) -> Vec<T> {
    let most = DECODE_LIMIT / std::mem::size_of::<T>().max(1);
    let n = usize::try_from(n).unwrap_or(usize::MAX);
    let mut v = Vec::new();
    if n > most || v.try_reserve_exact(n).is_err() {
        v.reserve(n.min(CHUNK));
    }
    v
}

/// What events refer to by index: the frame lists, and how many private pools the entries name.
#[derive(Clone, Copy)]
struct Refs<'a> {
    frames: &'a FrameTable,
    pools: usize,
}

/// The number of private pools the entries may name.
fn pool_count(entry_pools: &Option<Vec<PoolId>>) -> usize {
    entry_pools.as_ref().map_or(0, Vec::len)
}

/// Rejects a pool table that names the default pools, names a pool twice, or has more pools
/// than a [`PoolRef`] can name: what the snapshot reader never writes.
/// Checks a head's [`SnapshotExtras`] against the bounds the snapshot reader keeps: at most
/// [`SnapshotExtras::MAX_ANNOTATIONS`] annotations and exact-address marks, labels of at most
/// [`Annotation::MAX_LABEL`](super::Annotation::MAX_LABEL) bytes, marks in order.
fn check_extras(extras: &SnapshotExtras) -> Result<()> {
    let most = SnapshotExtras::MAX_ANNOTATIONS;
    let marks = &extras.malloc_with_address_events;
    if extras.annotations.len() > most || marks.len() > most {
        return Err(Error::input(format!(
            "{} annotations and {} exact-address marks, more than {most}",
            extras.annotations.len(),
            marks.len()
        )));
    }
    if let Some(a) =
        extras.annotations.iter().find(|a| a.label.len() > super::Annotation::MAX_LABEL)
    {
        return Err(Error::input(format!(
            "an annotation's label has {} bytes, more than {}",
            a.label.len(),
            super::Annotation::MAX_LABEL
        )));
    }
    if marks.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::input("the exact-address marks are not in order"));
    }
    if extras.settings_keys.len() > MAX_SETTINGS_KEYS
        || extras.settings_keys.iter().any(|k| k.len() > super::Annotation::MAX_LABEL)
    {
        return Err(Error::input(
            "more allocator settings keys, or longer ones, than a snapshot has",
        ));
    }
    Ok(())
}

/// The most `allocator_settings` keys a head may list as only newer releases write them.
const MAX_SETTINGS_KEYS: usize = 64;

fn check_entry_pools(entry_pools: &Option<Vec<PoolId>>) -> Result<()> {
    let Some(pools) = entry_pools else { return Ok(()) };
    if pools.len() > PoolRef::MAX_POOLS {
        return Err(Error::input(format!("{} private pools, more than 65535", pools.len())));
    }
    let mut sorted = pools.clone();
    sorted.sort_unstable();
    if sorted.first() == Some(&(0, 0)) || sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::input("the private pools name (0, 0) or one pool twice"));
    }
    Ok(())
}

/// Rejects an event no allocator could have made, or one naming a frame list or pool the file
/// lacks. Inlined, with the error made out of line: a streamed replay checks every event on each
/// of its passes, and as a call (its frame sized for the error) it was a sixth of those passes.
#[inline(always)]
fn check_event(device: i32, index: usize, e: &Event, refs: Refs) -> Result<()> {
    if let Err(m) = limits::check_event(e) {
        return Err(refused(device, index, format_args!("{m}")));
    }
    if e.frames.0 as usize > refs.frames.len() {
        return Err(refused(
            device,
            index,
            format_args!(
                "frame list {} does not exist (the file has {})",
                e.frames.0,
                refs.frames.len()
            ),
        ));
    }
    if e.pool.0 as usize > refs.pools {
        return Err(refused(
            device,
            index,
            format_args!(
                "private pool {} does not exist (the file names {})",
                e.pool.0, refs.pools
            ),
        ));
    }
    Ok(())
}

/// The error [`check_event`] returns for event `index` of `device`.
#[cold]
#[inline(never)]
fn refused(device: i32, index: usize, why: std::fmt::Arguments) -> Error {
    Error::input(format!("device {device}: {why}")).at(Place::Event(index as u64))
}

/// Checks the final segments against the [limits](limits) table, as every reader does.
/// Places an error in the head, the file's first record (its body starts at byte 24): the
/// devices, frames and final segments are declared there.
fn at_head(e: Error) -> Error {
    e.at(Place::Byte(HEADER_LEN as u64))
}

/// Refuses a device outside the limits or named twice; `devices` in sorted order.
fn check_devices(devices: impl Iterator<Item = i32>) -> Result<()> {
    let mut last = None;
    for d in devices {
        limits::check_device(d as i64).map_err(Error::input)?;
        if last == Some(d) {
            return Err(Error::input(format!("device {d} appears twice")));
        }
        last = Some(d);
    }
    Ok(())
}

fn check_segments(segments: &[Segment]) -> Result<()> {
    for (i, s) in segments.iter().enumerate() {
        limits::check_segment(s).map_err(|m| Error::input(format!("segment {i}: {m}")))?;
    }
    limits::check_segments_apart(segments).map_err(Error::input)
}

/// What writing `trace` as .fst leaves out: nothing, the format holds the whole model.
pub(crate) fn losses(_trace: &Trace) -> Vec<String> {
    Vec::new()
}

/// The head [`write`] writes for `trace`.
fn head_of(trace: &Trace) -> HeadOut<'_> {
    let frames = (1..=trace.frames.len() as u32).map(|i| trace.frames.get(FramesId(i))).collect();
    HeadOut {
        format: trace.source_format(),
        has_times: trace.has_times,
        devices: trace.devices.iter().map(|d| (d.device, d.events.len() as u64)).collect(),
        frames,
        segments: &trace.segments,
        allocator_settings: &trace.allocator_settings,
        totals: trace.recorded_totals.iter().map(|t| (t.device, t.totals.len() as u64)).collect(),
        entry_pools: &trace.entry_pools,
        extras: &trace.extras,
        platform: trace.platform,
        torch_npu: trace.torch_npu,
    }
}

/// Writes `trace` as .fst version 8 (nothing is lost: the format holds the whole model), one
/// record of at most [`CHUNK`] events and totals at a time.
pub fn write(trace: &Trace, out: &mut impl Write) -> Result<()> {
    let head = head_of(trace);
    let encoding = |e: bincode::error::EncodeError| {
        Error::new(ErrorKind::Io, format!("encoding the .fst body: {e}"))
    };
    let io = Error::from_io;
    out.write_all(MAGIC).map_err(io)?;
    out.write_all(&VERSION.to_le_bytes()).map_err(io)?;
    let mut events = trace.devices.iter().flat_map(|d| d.events.iter()).peekable();
    let mut totals = trace.recorded_totals.iter().flat_map(|t| t.totals.iter()).peekable();
    let mut body = bincode::serde::encode_to_vec(&head, config()).map_err(encoding)?;
    let mut first = true;
    while first || events.peek().is_some() || totals.peek().is_some() {
        let chunk: (Vec<&Event>, Vec<&RecordedTotals>) =
            (events.by_ref().take(CHUNK).collect(), totals.by_ref().take(CHUNK).collect());
        body.extend(bincode::serde::encode_to_vec(&chunk, config()).map_err(encoding)?);
        let mut crc = flate2::Crc::new();
        crc.update(&body);
        out.write_all(&(body.len() as u64).to_le_bytes()).map_err(io)?;
        out.write_all(&crc.sum().to_le_bytes()).map_err(io)?;
        out.write_all(&body).map_err(io)?;
        body.clear();
        first = false;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Action, Block, BlockState, PoolKind};

    fn sample() -> Trace {
        let mut frames = FrameTable::default();
        let f = frames.intern(vec![Frame {
            filename: "train.py".into(),
            line: 12,
            name: "step".into(),
        }]);
        let mut alloc = Event::new(Action::Alloc, 0x7f00_0000_0000, 4096, 7, 1_700_000_000_000_000);
        alloc.frames = f;
        alloc.pool = PoolRef(2); // made into the graph's pool, as the entry says
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
                private_pool: Some((1, u64::MAX)), // a graph pool id beyond i64: kept whole
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
                at: None,
            }),
            has_times: true,
            recorded_totals: vec![DeviceTotals {
                device: 0,
                totals: vec![RecordedTotals { allocated: 4096, reserved: 2 << 20 }; 2],
            }],
            entry_pools: Some(vec![(0, 3), (1, u64::MAX)]),
            torch_npu: false,
            platform: Some(Platform::RocmDeviceProperties),
            extras: crate::trace::SnapshotExtras {
                internal_metadata: 2,
                malloc_with_address: 2,
                // None: a file with marks is loaded, and most tests stream this one.
                malloc_with_address_events: Vec::new(),
                user_metadata: 1,
                annotations: vec![crate::trace::Annotation {
                    device: 0,
                    entry: 1,
                    event: 1,
                    addr: 0x7f00_0000_0000,
                    label: "{\"layer\":\"mlp.0\"}".into(),
                }],
                annotate_entries: 1,
                host_segments: Some(crate::trace::HostSegments {
                    count: 1,
                    reserved: 1 << 20,
                    allocated: 4096,
                }),
                host_trace_entries: Some(3),
                settings_keys: vec!["max_round_threshold".into()],
            },
        }
    }

    fn encode(t: &Trace) -> Vec<u8> {
        let mut out = Vec::new();
        write(t, &mut out).unwrap();
        out
    }

    #[test]
    fn round_trips_the_whole_model() {
        let mut t = sample();
        t.extras.malloc_with_address_events = vec![(0, 1)];
        // A torch_npu recording told by its blocks, not its frames, stays one.
        t.torch_npu = true;
        let back = read(&encode(&t), &ReadOptions::default()).unwrap();
        assert_eq!((back.format, back.converted_from), (Format::Fst, Some(t.format)));
        assert_eq!(Trace { format: t.format, converted_from: None, ..back.clone() }, t);
        let again = read(&encode(&back), &ReadOptions::default()).unwrap();
        assert_eq!(again, back, "an .fst of an .fst keeps the format of origin");
    }

    /// `t` as a file of an earlier `version`: a version 8 body less the head's last fields
    /// (the torch_npu mark; for version 6 the platform before it; for version 5 the extras
    /// before that, encoded last in the head).
    fn earlier(t: &Trace, version: u32) -> Vec<u8> {
        let v8 = encode(t);
        let head = bincode::serde::encode_to_vec(head_of(t), config()).unwrap();
        let mut tail = bincode::serde::encode_to_vec(t.torch_npu, config()).unwrap().len();
        if version <= 6 {
            tail += bincode::serde::encode_to_vec(t.platform, config()).unwrap().len();
        }
        if version == 5 {
            tail += bincode::serde::encode_to_vec(&t.extras, config()).unwrap().len();
        }
        let body = &v8[HEADER_LEN..];
        let body = [&body[..head.len() - tail], &body[head.len()..]].concat();
        framed(version, &body)
    }

    /// A version 5 file (written before the head held the extras) reads as the same trace
    /// without them, loaded and streamed; a version 6 file (before the platform) as the same
    /// trace showing no platform; a version 7 file (before the torch_npu mark) as one whose
    /// frames alone tell its maker.
    #[test]
    fn earlier_versions_read_as_the_trace_without_what_they_lack() {
        let t = Trace { recorded_totals: Vec::new(), torch_npu: true, ..sample() };
        let plain = Trace { torch_npu: false, ..t.clone() };
        for (version, want) in [
            (5, Trace { extras: Default::default(), platform: None, ..plain.clone() }),
            (6, Trace { platform: None, ..plain.clone() }),
            (7, plain.clone()),
        ] {
            let data = earlier(&t, version);
            let back = read(&data, &ReadOptions::default()).unwrap();
            assert_eq!(Trace { format: t.format, converted_from: None, ..back }, want, "{version}");
            // Written again, it is a file of this build's version.
            assert_eq!(encode(&want)[8..12], VERSION.to_le_bytes());
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("old.fst");
            std::fs::write(&path, &data).unwrap();
            let stream = FstStream::open(&path).unwrap().expect("an earlier version streams");
            let head = &stream.head;
            assert_eq!((&head.extras, head.platform), (&want.extras, want.platform));
            assert!(!head.torch_npu, "{version}");
        }
    }

    /// A file whose head marks exact-address allocations is loaded, not streamed: they are
    /// found among the events near each mark before a replay starts.
    #[test]
    fn a_file_with_exact_address_marks_is_loaded_not_streamed() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trace { recorded_totals: Vec::new(), ..sample() };
        t.extras.malloc_with_address_events = vec![(0, 1)];
        let path = dir.path().join("marked.fst");
        std::fs::write(&path, encode(&t)).unwrap();
        assert!(FstStream::open(&path).unwrap().is_none());
        let mut unmarked = t.clone();
        unmarked.extras.malloc_with_address_events.clear();
        std::fs::write(&path, encode(&unmarked)).unwrap();
        let stream = FstStream::open(&path).unwrap().expect("streams");
        assert_eq!(stream.head.extras, unmarked.extras, "the extras are in the head");
    }

    #[test]
    fn extras_beyond_a_snapshot_readers_bounds_are_refused_in_the_head() {
        let mut t = sample();
        t.extras.annotations[0].label = "x".repeat(crate::trace::Annotation::MAX_LABEL + 1);
        let err = read(&encode(&t), &ReadOptions::default()).unwrap_err().to_string();
        assert!(err.starts_with("byte 24: an annotation's label has 257 bytes"), "{err}");
        let mut t = sample();
        t.extras.malloc_with_address_events = vec![(0, 5), (0, 1)];
        let err = read(&encode(&t), &ReadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("byte 24: the exact-address marks are not in order"), "{err}");
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
        other[8] = 9;
        assert_eq!(
            read(&other, &opts).unwrap_err().to_string(),
            "byte 8: unsupported .fst version 9 (this build reads versions 5 to 8); re-create the file from the original trace with 'fragsim convert'"
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
        let data = framed(VERSION, &body);
        let err = read(&data, &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().starts_with("byte 24: undecodable body"), "{err}");
        assert!(err.to_string().contains("(it ends inside a value)"), "{err}");
    }

    /// A body damaged before its CRC was made says what is wrong in plain words at its byte,
    /// never bincode's Debug text (`Utf8 { inner: Utf8Error {...} }`, `OtherString(...)`).
    #[test]
    fn an_undecodable_body_says_what_is_wrong_in_plain_words() {
        let body = encode(&sample())[HEADER_LEN..].to_vec();
        let refused = |body: &[u8]| read(&framed(VERSION, body), &ReadOptions::default());
        // A frame's file name made invalid UTF-8.
        let mut bad = body.clone();
        let at = bad.windows(8).position(|w| w == b"train.py").expect("a frame's file name");
        bad[at] = 0xff;
        let err = refused(&bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "byte 24: undecodable body (a string that is not UTF-8): damaged, or written by an \
             incompatible build?"
        );
        // The format's tag (the body's first byte) beyond the formats there are.
        let mut bad = body.clone();
        bad[0] = 72;
        let err = refused(&bad).unwrap_err().to_string();
        assert!(err.starts_with("byte 24: undecodable body (an unknown kind code 72)"), "{err}");
        assert!(!err.contains("OtherString") && !err.contains("variant index"), "{err}");
    }
    /// `body` as the one record of a file of `version`: magic, version, length, CRC, body.
    fn framed(version: u32, body: &[u8]) -> Vec<u8> {
        let mut crc = flate2::Crc::new();
        crc.update(body);
        let mut data = MAGIC.to_vec();
        data.extend(version.to_le_bytes());
        data.extend((body.len() as u64).to_le_bytes());
        data.extend(crc.sum().to_le_bytes());
        data.extend(body);
        data
    }

    #[test]
    fn files_of_earlier_versions_are_refused_saying_to_re_convert_them() {
        // Development builds wrote versions 1 to 4 before the layout was fixed: however their
        // body looks, the version alone refuses them, naming the file and both versions.
        let dir = tempfile::tempdir().unwrap();
        for version in 1..OLDEST_READ {
            let mut data = encode(&sample());
            data[8..12].copy_from_slice(&version.to_le_bytes());
            let expected = format!(
                "byte 8: written by an earlier build of fragsim: .fst version {version}, and this \
                 build reads versions 5 to 8; re-convert the file from its source trace with \
                 'fragsim convert SOURCE FILE.fst'"
            );
            let err = read(&data, &ReadOptions::default()).unwrap_err();
            assert_eq!(err.to_string(), expected);
            // From a file: not streamed, and the reader's error names the file.
            let path = dir.path().join(format!("v{version}.fst"));
            std::fs::write(&path, &data).unwrap();
            assert!(FstStream::open(&path).unwrap().is_none(), "version {version}");
            let err = crate::trace::read_trace(&path, &ReadOptions::default()).unwrap_err();
            assert_eq!(err.to_string(), format!("{}: fst: {expected}", path.display()));
        }
    }

    #[test]
    fn an_event_naming_a_pool_the_head_lacks_is_refused() {
        let mut t = sample();
        t.devices[0].events[1].pool = PoolRef(3);
        let err = read(&encode(&t), &ReadOptions::default()).unwrap_err().to_string();
        assert!(
            err.contains("event 1: device 0: private pool 3 does not exist (the file names 2)"),
            "{err}"
        );
        let mut t = sample();
        t.entry_pools = Some(vec![(0, 3), (0, 3)]);
        let err = read(&encode(&t), &ReadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("byte 24: the private pools name (0, 0) or one pool twice"), "{err}");
    }

    #[test]
    fn an_event_beyond_the_limits_or_naming_missing_frames_is_refused_where_it_lies() {
        // Loaded and streamed alike, the first failing check names the event, in the order
        // the checks run: the limits, then the frame list, then the pool.
        type Damage = fn(&mut Event);
        let cases: [(Damage, &str); 4] = [
            (|e| e.size = 1 << 60, "event 1: device 0: size 1152921504606846976 is 2^60 or more"),
            (|e| e.time_us = -5, "event 1: device 0: time -5 µs is outside 0..=2^53"),
            (|e| e.frames = FramesId(99), "event 1: device 0: frame list 99 does not exist"),
            (
                |e| (e.frames, e.pool) = (FramesId(99), PoolRef(9)),
                "event 1: device 0: frame list 99 does not exist",
            ),
        ];
        for (damage, expected) in cases {
            // Without recorded totals, which only a loaded trace carries, so that it streams.
            let mut t = Trace { recorded_totals: Vec::new(), ..sample() };
            damage(&mut t.devices[0].events[1]);
            let data = encode(&t);
            let err = read(&data, &ReadOptions::default()).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.fst");
            std::fs::write(&path, &data).unwrap();
            let stream = FstStream::open(&path).unwrap().unwrap();
            let err = stream.each_event(0, u64::MAX, true, |_, _| Ok(())).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
    }

    /// A trace of `n` events on device 0 and 3 on device 2, every event with recorded totals.
    fn long(n: usize) -> Trace {
        let event = |i: usize| Event::new(Action::Alloc, i as u64 * 512, 512, 0, i as i64);
        let mut t = sample();
        t.devices = vec![
            DeviceTrace { device: 0, events: (0..n).map(event).collect() },
            DeviceTrace { device: 2, events: (0..3).map(event).collect() },
        ];
        t.recorded_totals = vec![DeviceTotals {
            device: 0,
            totals: (0..n as u64)
                .map(|i| RecordedTotals { allocated: i, reserved: 2 * i })
                .collect(),
        }];
        t
    }

    #[test]
    fn a_stream_refuses_a_file_that_changed_under_it() {
        let t = Trace { recorded_totals: Vec::new(), ..long(2 * CHUNK + 5) };
        let other = Trace { recorded_totals: Vec::new(), ..long(2 * CHUNK + 6) };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.fst");
        let pass = |file: &FstStream| file.each_event(0, u64::MAX, true, |_, _| Ok(()));
        let changed = |r: Result<()>, why: &str| {
            let e = r.unwrap_err();
            let m = e.to_string();
            assert!(
                m.contains("t.fst: fst: ") && m.contains("changed while it was replayed"),
                "{m}"
            );
            assert!(m.contains(why), "{m}");
        };

        // Replaced by another file (`mv`): the path names another inode.
        std::fs::write(&path, encode(&t)).unwrap();
        let file = FstStream::open(&path).unwrap().unwrap();
        pass(&file).unwrap();
        let new = dir.path().join("new.fst");
        std::fs::write(&new, encode(&other)).unwrap();
        std::fs::rename(&new, &path).unwrap();
        changed(pass(&file), "");

        // Rewritten in place, longer.
        std::fs::write(&path, encode(&t)).unwrap();
        let file = FstStream::open(&path).unwrap().unwrap();
        pass(&file).unwrap();
        std::fs::write(&path, encode(&other)).unwrap();
        changed(pass(&file), "bytes");

        // Rewritten in place with the same length and modification time: one record's body
        // changed (and its checksum with it) is caught by the checksum the first pass read.
        let bytes = encode(&t);
        std::fs::write(&path, &bytes).unwrap();
        let file = FstStream::open(&path).unwrap().unwrap();
        pass(&file).unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let first_len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
        let second = HEADER_LEN + first_len;
        let len = u64::from_le_bytes(bytes[second..second + 8].try_into().unwrap()) as usize;
        let body = second + 12;
        let mut edited = bytes.clone();
        edited[body + len / 2] ^= 0x40;
        let mut crc = flate2::Crc::new();
        crc.update(&edited[body..body + len]);
        edited[second + 8..second + 12].copy_from_slice(&crc.sum().to_le_bytes());
        {
            use std::io::{Seek, Write as _};
            let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.seek(std::io::SeekFrom::Start(0)).unwrap();
            f.write_all(&edited).unwrap();
            f.set_modified(mtime).unwrap();
        }
        changed(pass(&file), "record 1 now has checksum");

        // Cut short, or overwritten with other bytes of the same length, while a pass reads it
        // (in the first record, seven records before the end, beyond what the reader buffers):
        // the pass stops where it read a damaged record and says the file changed there, not
        // that its bytes are bad.
        let bytes = encode(&Trace { recorded_totals: Vec::new(), ..long(8 * CHUNK + 5) });
        let garbage = vec![0xffu8; bytes.len()];
        for (rewrite, why) in [(&bytes[..100], "now holds 100"), (&garbage[..], "written to")] {
            std::fs::write(&path, &bytes).unwrap();
            let file = FstStream::open(&path).unwrap().unwrap();
            pass(&file).unwrap();
            let r = file.each_event(0, u64::MAX, true, |i, _| {
                if i == 10 {
                    std::fs::write(&path, rewrite).unwrap();
                }
                Ok(())
            });
            changed(
                r.map_err(|e| {
                    assert!(e.location().place.is_some(), "located: {e}");
                    e
                }),
                why,
            );
        }
    }

    #[test]
    fn a_stream_hands_one_device_its_events_record_by_record() {
        // Without recorded totals: a trace with them is loaded, not streamed.
        let t = Trace { recorded_totals: Vec::new(), ..long(2 * CHUNK + 5) };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.fst");
        std::fs::write(&path, encode(&t)).unwrap();
        let file = FstStream::open(&path).unwrap().expect("the current version streams");
        assert!(file.head().devices.is_empty() && file.head().segments == t.segments);
        assert_eq!(file.devices(), vec![(0, 2 * CHUNK as u64 + 5), (2, 3)]);
        assert_eq!(file.default_device(), Some(0));
        let collect = |device, limit, whole| {
            let mut got = Vec::new();
            file.each_event(device, limit, whole, |i, e| {
                got.push((i, *e));
                Ok(())
            })
            .unwrap();
            got
        };
        let all: Vec<(u64, Event)> =
            t.devices[0].events.iter().copied().enumerate().map(|(i, e)| (i as u64, e)).collect();
        assert_eq!(collect(0, u64::MAX, true), all);
        assert_eq!(collect(0, CHUNK as u64 + 1, false), all[..CHUNK + 1]);
        assert_eq!(collect(2, u64::MAX, true).len(), 3);
        assert!(collect(7, u64::MAX, false).is_empty());
        std::fs::write(&path, encode(&long(5))).unwrap();
        assert!(FstStream::open(&path).unwrap().is_none(), "recorded totals: loaded");
        let mut other = encode(&t);
        other[8] = 4;
        std::fs::write(&path, other).unwrap();
        assert!(FstStream::open(&path).unwrap().is_none(), "another version: loaded (and refused)");
    }

    #[test]
    fn long_traces_are_cut_into_records_and_read_back_whole() {
        let t = long(2 * CHUNK + 5);
        let data = encode(&t);
        let records = {
            let (mut at, mut n) = (12, 0);
            while at < data.len() {
                at += 12 + u64::from_le_bytes(data[at..at + 8].try_into().unwrap()) as usize;
                n += 1;
            }
            assert_eq!(at, data.len());
            n
        };
        assert_eq!(records, 3, "{} events in chunks of {CHUNK}", 2 * CHUNK + 8);
        let back = read(&data, &ReadOptions::default()).unwrap();
        assert_eq!(Trace { format: t.format, converted_from: None, ..back }, t);
        // Cut at the end of the first record: the file ends before the events it declares.
        let first = 24 + u64::from_le_bytes(data[12..20].try_into().unwrap()) as usize;
        let err = read(&data[..first], &ReadOptions::default()).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("byte {first}: truncated: the file ends after 16384 of the {} events its head declares", 2 * CHUNK + 8)
        );
    }

    /// Every enum an `.fst` file stores is written as its explicit number (the tag table in
    /// docs/interface.md#fst-wire-layout), one byte: reordering or inserting a variant changes
    /// a number the files depend on and fails here, not in a user's replay.
    #[test]
    fn every_stored_enum_is_written_as_its_documented_tag() {
        fn wire<T: Serialize>(v: T) -> Vec<u8> {
            bincode::serde::encode_to_vec(v, bincode::config::standard()).unwrap()
        }
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interface.md"),
        )
        .unwrap();
        let mut checked = 0;
        let mut check = |name: &str, tag: u8, bytes: Vec<u8>| {
            assert_eq!(bytes, [tag], "{name}");
            let row = format!("| `{name}` | {tag} |");
            assert!(doc.contains(&row), "docs/interface.md lacks the tag row {row}");
            checked += 1;
        };
        for a in Action::ALL {
            check(a.name(), a as u8, wire(a));
        }
        for (name, k) in [("small", PoolKind::Small), ("large", PoolKind::Large)] {
            check(name, k as u8, wire(k));
        }
        for s in [BlockState::ActiveAllocated, BlockState::ActivePendingFree, BlockState::Inactive]
        {
            check(s.name(), s as u8, wire(s));
        }
        for info in crate::trace::FORMATS {
            check(info.name, info.format as u8, wire(info.format));
        }
        assert_eq!(checked, 9 + 2 + 3 + 5);
    }
}
