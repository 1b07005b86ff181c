//! Reading and writing a trace file of any supported format.
//!
//! The format is chosen by content (see [`detect`](super::detect)), not by extension, because
//! users rename files; gzip is undone first. Every error names the file and the format it was
//! read as, and the reader adds the place (byte, line or event).

use super::{detect, fst, kineto, limits, rmm, snapshot, text, Trace};
use crate::error::{Error, Place, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

/// A trace file format fragsim reads (and, for most, writes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Format {
    /// `torch.cuda.memory._dump_snapshot` pickle.
    #[default]
    PytorchSnapshot,
    /// PyTorch profiler (Kineto) Chrome trace JSON with `profile_memory=True`.
    Kineto,
    /// RAPIDS RMM `logging_resource_adaptor` CSV.
    RmmCsv,
    /// fragsim's own binary format (`.fst`).
    Fst,
    /// fragsim's plain text format, one event per line.
    Text,
}

/// One trace format: everything fragsim knows about it, as one row of [`FORMATS`].
///
/// Reading, writing, detection, the output extensions and what a conversion loses are all looked
/// up here, so adding a format means writing its module and adding its row (and its [`Format`]
/// variant), nothing else.
#[derive(Clone, Copy, Debug)]
pub struct FormatInfo {
    /// The format this row describes.
    pub format: Format,
    /// The name used in messages and in `info --json`, e.g. `pytorch-snapshot`.
    pub name: &'static str,
    /// What a user calls it, for the "unrecognised trace format" message, e.g. `Kineto JSON`.
    pub description: &'static str,
    /// Output extensions (lower case, no dot) that ask for this format; the first is the one
    /// messages suggest. `.gz` on top of any of them compresses.
    pub extensions: &'static [&'static str],
    /// Whether decompressed file content is in this format. Rows are tried in table order and
    /// the first match wins, so a loose signature (text) comes last.
    pub detect: fn(&[u8]) -> bool,
    /// Reads a trace from decompressed file content; errors name the place, the caller adds
    /// the file and format.
    pub read: fn(&[u8], &ReadOptions) -> Result<Trace>,
    /// Writes a trace in this format.
    pub write: fn(&Trace, &mut dyn Write) -> Result<()>,
    /// What writing a trace in this format leaves out, one line each (empty when nothing).
    pub losses: fn(&Trace) -> Vec<String>,
    /// Whether stack frames survive a write in this format (so a conversion should read them).
    pub keeps_frames: bool,
}

/// A [`FORMATS`] row for a format whose module `$module` has `read`, `write` and `losses`.
macro_rules! format_row {
    ($format:ident, $name:literal, $description:literal, ext $extensions:expr,
     detect $detect:path, module $module:ident, keeps_frames $frames:literal) => {
        FormatInfo {
            format: Format::$format,
            name: $name,
            description: $description,
            extensions: &$extensions,
            detect: $detect,
            read: $module::read,
            write: |t, mut out| $module::write(t, &mut out),
            losses: $module::losses,
            keeps_frames: $frames,
        }
    };
}

/// Every format fragsim reads and writes, in detection order: one row each.
pub const FORMATS: [FormatInfo; 5] = [
    format_row! { PytorchSnapshot, "pytorch-snapshot", "a PyTorch snapshot pickle",
    ext ["pickle", "pkl"], detect detect::is_pickle, module snapshot, keeps_frames true },
    format_row! { Kineto, "kineto", "Kineto JSON",
    ext ["json"], detect detect::is_kineto, module kineto, keeps_frames false },
    format_row! { RmmCsv, "rmm-csv", "RMM CSV",
    ext ["csv"], detect detect::is_rmm_csv, module rmm, keeps_frames false },
    format_row! { Fst, "fst", ".fst",
    ext ["fst"], detect detect::is_fst, module fst, keeps_frames true },
    format_row! { Text, "text", "fragsim text",
    ext ["txt", "trace"], detect detect::is_text, module text, keeps_frames false },
];

impl Format {
    /// This format's row of [`FORMATS`].
    pub fn info(self) -> &'static FormatInfo {
        // Every variant has a row: `every_format_has_one_row` checks it.
        FORMATS.iter().find(|f| f.format == self).expect("every Format has a row in FORMATS")
    }

    /// The name used in messages and in `info --json`.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The format an output path asks for, by its extension (`.gz` on top is ignored).
    pub fn from_extension(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let name = name.strip_suffix(".gz").unwrap_or(&name);
        let ext = name.rsplit('.').next()?;
        FORMATS.iter().find(|f| f.extensions.contains(&ext)).map(|f| f.format)
    }

    /// The output format `path`'s extension names, or a usage error listing the extensions.
    pub fn for_output(path: &Path) -> Result<Format> {
        Format::from_extension(path).ok_or_else(|| {
            let exts: Vec<String> =
                FORMATS.iter().map(|f| format!(".{}", f.extensions[0])).collect();
            Error::usage(format!(
                "cannot tell the output format from '{}': use {} (optionally .gz)",
                path.display(),
                or_list(&exts)
            ))
        })
    }
}

/// `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => items.concat(),
    }
}

/// What a reader should keep.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// Keep stack frames (costs memory and time; off unless a command needs them).
    pub keep_frames: bool,
    /// Show a progress bar on stderr for slow reads (only when stderr is a terminal).
    pub progress: bool,
    /// The most bytes the file may hold, raw or decompressed; `None` takes
    /// `FRAGSIM_MAX_INPUT_SIZE` from the environment, else
    /// [`limits::DEFAULT_MAX_INPUT_BYTES`]. A bound, so an endless or huge file fails with a
    /// message instead of exhausting memory.
    pub max_input_bytes: Option<u64>,
}

impl ReadOptions {
    /// The input cap in force: [`ReadOptions::max_input_bytes`], `FRAGSIM_MAX_INPUT_SIZE`, or
    /// the default; a malformed environment value is a usage error.
    pub fn input_cap(&self) -> Result<u64> {
        if let Some(n) = self.max_input_bytes {
            return Ok(n);
        }
        match std::env::var("FRAGSIM_MAX_INPUT_SIZE") {
            Ok(v) => crate::units::parse_size(&v).map_err(|e| {
                Error::usage(format!("FRAGSIM_MAX_INPUT_SIZE '{v}': {}", e.message()))
            }),
            Err(_) => Ok(limits::DEFAULT_MAX_INPUT_BYTES),
        }
    }
}

/// The largest file fragsim reads into memory by default, raw or decompressed (see
/// [`limits::DEFAULT_MAX_INPUT_BYTES`]).
pub const MAX_DECOMPRESSED_BYTES: u64 = limits::DEFAULT_MAX_INPUT_BYTES;

/// How much of a file is read before its format must be recognisable.
const SNIFF_BYTES: u64 = 64 << 10;

/// Reads the trace at `path`, detecting its format by content.
///
/// With [`ReadOptions::progress`], a spinner on stderr shows the file being read once the read
/// has taken more than a second (quick reads print nothing).
pub fn read_trace(path: &Path, options: &ReadOptions) -> Result<Trace> {
    if options.progress {
        with_progress(path, || read_path(path, options))
    } else {
        read_path(path, options)
    }
}

fn read_path(path: &Path, options: &ReadOptions) -> Result<Trace> {
    let cap = options.input_cap()?;
    let raw = read_capped(path, cap)?;
    let data = if raw.starts_with(&[0x1f, 0x8b]) {
        gunzip(&raw, cap).map_err(|e| e.in_file(path))?
    } else {
        raw
    };
    if data.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::input("empty file: no trace to read").in_file(path));
    }
    let format = detect::detect(&data).ok_or_else(|| unrecognised().in_file(path))?;
    read_bytes(&data, format, options).map_err(|e| e.in_format(format.name()).in_file(path))
}

/// Reads the file at `path`, at most `cap` bytes. The first [`SNIFF_BYTES`] must already look
/// like gzip or a trace format (or be blank so far), so an endless stream of junk such as
/// `/dev/zero` fails at once rather than after `cap` bytes.
fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    if let Ok(meta) = file.metadata() {
        if meta.is_file() && meta.len() > cap {
            return Err(too_big(meta.len(), cap).in_file(path));
        }
    }
    let mut reader = file.take(cap.saturating_add(1));
    let mut raw = Vec::new();
    (&mut reader).take(SNIFF_BYTES).read_to_end(&mut raw).map_err(|e| Error::io(path, e))?;
    let blank = raw.iter().all(|b| b.is_ascii_whitespace());
    if raw.len() as u64 == SNIFF_BYTES
        && !raw.starts_with(&[0x1f, 0x8b])
        && !blank
        && detect::detect(&raw).is_none()
    {
        return Err(unrecognised().in_file(path));
    }
    reader.read_to_end(&mut raw).map_err(|e| Error::io(path, e))?;
    if raw.len() as u64 > cap {
        return Err(Error::input(format!(
            "the file holds more than {cap} bytes, the input limit (raise it with --max-input-size or FRAGSIM_MAX_INPUT_SIZE)"
        ))
        .in_file(path));
    }
    Ok(raw)
}

/// The error for a file of `len` bytes over the input cap.
fn too_big(len: u64, cap: u64) -> Error {
    Error::input(format!(
        "the file holds {len} bytes, more than the input limit of {cap} (raise it with --max-input-size or FRAGSIM_MAX_INPUT_SIZE)"
    ))
}

/// The error for content no format recognises.
fn unrecognised() -> Error {
    let known: Vec<String> = FORMATS.iter().map(|f| f.description.to_string()).collect();
    Error::input(format!("unrecognised trace format (expected {})", or_list(&known)))
        .at(Place::Byte(0))
}

/// Runs `read` while a helper thread waits one second, then shows a spinner until it is done.
fn with_progress<T>(path: &Path, read: impl FnOnce() -> T) -> T {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    use std::time::Duration;
    let name = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let size =
        std::fs::metadata(path).map(|m| crate::units::format_bytes(m.len())).unwrap_or_default();
    let (done, wait) = channel::<()>();
    let start = std::time::Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            if wait.recv_timeout(Duration::from_secs(1)) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let bar = indicatif::ProgressBar::new_spinner().with_elapsed(start.elapsed());
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{spinner} reading {msg} {elapsed}")
            {
                bar.set_style(style);
            }
            bar.set_message(format!("{name} ({size})"));
            bar.enable_steady_tick(Duration::from_millis(100));
            let _ = wait.recv();
            bar.finish_and_clear();
        });
        let out = read();
        drop(done);
        out
    })
}

/// Reads a trace of a known format from memory; the result keeps every [limit](limits).
pub fn read_bytes(data: &[u8], format: Format, options: &ReadOptions) -> Result<Trace> {
    let trace = (format.info().read)(data, options)?;
    limits::check_trace(&trace)?;
    Ok(trace)
}

/// Writes `trace` to `path` in the format its extension names; `.gz` compresses.
pub fn write_trace(trace: &Trace, path: &Path) -> Result<()> {
    let format = Format::for_output(path)?;
    let mut buffer = Vec::new();
    write_to(trace, format, &mut buffer).map_err(|e| e.in_file(path))?;
    let bytes = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz")) {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&buffer).and_then(|_| enc.finish()).map_err(|e| Error::io(path, e))?
    } else {
        buffer
    };
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// Writes `trace` in `format` to `out`; a trace outside the [limits](limits) is refused, so
/// nothing is written that fragsim could not read back.
pub fn write_to(trace: &Trace, format: Format, out: &mut impl Write) -> Result<()> {
    limits::check_trace(trace).map_err(|e| {
        let message = format!("cannot write {}: {}", format.name(), e.message());
        let place = e.location().place;
        let err = Error::input(message);
        match place {
            Some(p) => err.at(p),
            None => err,
        }
    })?;
    (format.info().write)(trace, out)
}

/// Decompresses every member of a gzip file (`cat a.gz b.gz` makes a valid one), at most `cap`
/// bytes and at most [`decompression_limit`] of its compressed size.
fn gunzip(raw: &[u8], cap: u64) -> Result<Vec<u8>> {
    let limit = decompression_limit(raw.len() as u64).min(cap);
    let mut out = Vec::new();
    let mut decoder = flate2::read::MultiGzDecoder::new(raw).take(limit + 1);
    decoder.read_to_end(&mut out).map_err(|e| {
        // The decoder has produced `out.len()` bytes when it fails: name that place.
        Error::input(format!("corrupt or truncated gzip stream: {e}"))
            .at(Place::Byte(out.len() as u64))
            .in_format("gzip")
    })?;
    if out.len() as u64 > limit {
        return Err(Error::input(format!(
            "gzip stream expands to more than {limit} bytes ({}× its compressed size); refusing to read a likely decompression bomb",
            limit / (raw.len() as u64).max(1)
        ))
        .in_format("gzip"));
    }
    Ok(out)
}

/// How far a gzip file of `compressed` bytes may expand. Real traces compress 5–20×; a ratio
/// far beyond that is a decompression bomb, so memory stays in proportion to the file.
pub fn decompression_limit(compressed: u64) -> u64 {
    const RATIO: u64 = 200;
    const FLOOR: u64 = 64 << 20;
    compressed.saturating_mul(RATIO).clamp(FLOOR, MAX_DECOMPRESSED_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_one_row() {
        for f in
            [Format::PytorchSnapshot, Format::Kineto, Format::RmmCsv, Format::Fst, Format::Text]
        {
            assert_eq!(FORMATS.iter().filter(|row| row.format == f).count(), 1, "{f:?}");
        }
        let mut names: Vec<&str> = FORMATS.iter().map(|f| f.name).collect();
        names.dedup();
        assert_eq!(names.len(), FORMATS.len());
    }

    #[test]
    fn extensions_name_their_format() {
        let ext = |p: &str| Format::from_extension(Path::new(p));
        assert_eq!(ext("a.PKL"), Some(Format::PytorchSnapshot));
        assert_eq!(ext("a.json.gz"), Some(Format::Kineto));
        assert_eq!(ext("a.trace"), Some(Format::Text));
        assert_eq!(ext("a.fst"), Some(Format::Fst));
        assert_eq!(ext("a.xlsx"), None);
        assert_eq!(
            Format::for_output(Path::new("a.xlsx")).unwrap_err().to_string(),
            "cannot tell the output format from 'a.xlsx': use .pickle, .json, .csv, .fst or .txt (optionally .gz)"
        );
    }

    #[test]
    fn every_format_reads_back_what_it_writes() {
        let text = "alloc 0x1000 4096 s0\nfree_completed 0x1000 4096 s0\n";
        let trace = read_bytes(text.as_bytes(), Format::Text, &ReadOptions::default()).unwrap();
        for row in &FORMATS {
            let mut bytes = Vec::new();
            write_to(&trace, row.format, &mut bytes).unwrap();
            assert_eq!(detect::detect(&bytes), Some(row.format), "{}", row.name);
            let back = read_bytes(&bytes, row.format, &ReadOptions::default()).unwrap();
            assert_eq!(back.devices[0].events.len(), 2, "{}", row.name);
            assert!((row.losses)(&trace).is_empty(), "{}", row.name);
        }
    }
}
