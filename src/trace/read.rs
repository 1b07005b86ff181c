//! Reading and writing a trace file of any supported format.
//!
//! The format is chosen by content (see [`detect`](super::detect)), not by extension, because
//! users rename files; gzip is undone first. Every error names the file and the format it was
//! read as, and the reader adds the place (byte, line or event).

use super::{detect, fst, kineto, limits, rmm, snapshot, text, Trace};
use crate::error::{Cancel, Error, Place, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

/// A trace file format fragsim reads (and, for most, writes). The numbers are the tags an `.fst`
/// file stores for its format of origin (docs/interface.md#fst-wire-layout): fixed, never
/// reordered, since what a replay does depends on that origin.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Format {
    /// `torch.cuda.memory._dump_snapshot` pickle.
    #[default]
    PytorchSnapshot = 0,
    /// PyTorch profiler (Kineto) Chrome trace JSON with `profile_memory=True`.
    Kineto = 1,
    /// RAPIDS RMM `logging_resource_adaptor` CSV.
    RmmCsv = 2,
    /// fragsim's own binary format (`.fst`).
    Fst = 3,
    /// fragsim's plain text format, one event per line.
    Text = 4,
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
    /// Reads a trace from decompressed file content, streamed: errors name the place, the
    /// caller adds the file and format. Readers that parse their input as a whole read it to
    /// the end first (`whole`; none does now); the others hold one bounded buffer beside the
    /// events.
    pub read: fn(&mut dyn BufRead, &ReadOptions) -> Result<Trace>,
    /// Writes a trace in this format.
    pub write: fn(&Trace, &mut dyn Write) -> Result<()>,
    /// What writing a trace in this format leaves out, one line each (empty when nothing).
    pub losses: fn(&Trace) -> Vec<String>,
    /// Whether stack frames survive a write in this format (so a conversion should read them).
    pub keeps_frames: bool,
}

impl FormatInfo {
    /// What writing `trace` in this format to `output` leaves out, as notes naming `output`.
    pub fn loss_notes(&self, trace: &Trace, output: &std::path::Path) -> Vec<String> {
        (self.losses)(trace).iter().map(|l| format!("note: {}: {l}", output.display())).collect()
    }
}

/// A [`FORMATS`] row for a format whose module `$module` has `read` (or, `reads stream`,
/// `read_from`), `write` and `losses`.
macro_rules! format_row {
    ($format:ident, $name:literal, $description:literal, ext $extensions:expr,
     detect $detect:path, module $module:ident, reads $how:ident, keeps_frames $frames:literal) => {
        FormatInfo {
            format: Format::$format,
            name: $name,
            description: $description,
            extensions: &$extensions,
            detect: $detect,
            read: format_row!(@read $how $module),
            write: |t, mut out| $module::write(t, &mut out),
            losses: $module::losses,
            keeps_frames: $frames,
        }
    };
    // A module whose `read` parses the whole input at once.
    (@read whole $module:ident) => {
        |input, options| $module::read(&whole(input)?, options)
    };
    // A module whose `read_from` streams.
    (@read stream $module:ident) => {
        $module::read_from
    };
}

/// Every format fragsim reads and writes, in detection order: one row each.
pub const FORMATS: [FormatInfo; 5] = [
    format_row! { PytorchSnapshot, "pytorch-snapshot", "a PyTorch snapshot pickle",
    ext ["pickle", "pkl"], detect detect::is_pickle, module snapshot, reads stream, keeps_frames true },
    format_row! { Kineto, "kineto", "Kineto JSON",
    ext ["json"], detect detect::is_kineto, module kineto, reads stream, keeps_frames false },
    format_row! { RmmCsv, "rmm-csv", "RMM CSV",
    ext ["csv"], detect detect::is_rmm_csv, module rmm, reads stream, keeps_frames false },
    format_row! { Fst, "fst", ".fst",
    ext ["fst"], detect detect::is_fst, module fst, reads stream, keeps_frames true },
    format_row! { Text, "text", "fragsim text",
    ext ["txt", "trace"], detect detect::is_text, module text, reads stream, keeps_frames false },
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
    pub(crate) fn from_extension(path: &Path) -> Option<Format> {
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

/// What a reader should keep, and how far it may read.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// Keep stack frames (costs memory and time; off unless a command needs them). Without it
    /// a snapshot still keeps the few stacks that decide a replay: a release's, and those
    /// telling a private pool's kind ([`super::tells_pool_kind`]).
    pub keep_frames: bool,
    /// Show a progress bar on stderr for slow reads (only when stderr is a terminal).
    pub progress: bool,
    /// The most bytes the file may hold, raw or decompressed; `None` takes
    /// `FRAGSIM_MAX_INPUT_SIZE` from the environment, else
    /// [`limits::DEFAULT_MAX_INPUT_BYTES`]. A bound, so an endless or huge file fails with a
    /// message instead of exhausting memory.
    pub max_input_bytes: Option<u64>,
    /// Raised by another thread to stop the read early (the Python package raises it on
    /// Ctrl-C): the reader looks at it once per buffer of input (256 KiB) and then fails with
    /// an error naming the file and the byte it reached. Never raised by default.
    pub cancel: Cancel,
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
    read_path_as(path, options, false)
}

/// A directory given as a trace: an error that lists the files in it that look like traces
/// (by name: fragsim reads formats by content, but a listing by content would read them all),
/// so the fix is one copy and paste away.
fn directory_error(path: &Path) -> Error {
    const SHOWN: usize = 8;
    let looks_like_trace = |name: &str| {
        [".pickle", ".pkl", ".json", ".json.gz", ".fst", ".txt", ".csv", ".gz"]
            .iter()
            .any(|ext| name.ends_with(ext))
    };
    let mut names: Vec<String> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| looks_like_trace(n))
        .collect();
    names.sort();
    let listing = match names.len() {
        0 => "it holds no file named like a trace (.pickle, .json, .json.gz, .fst, .txt, .csv)"
            .to_string(),
        n => {
            let shown: Vec<String> =
                names.iter().take(SHOWN).map(|n| path.join(n).display().to_string()).collect();
            let more = if n > SHOWN { format!(" and {} more", n - SHOWN) } else { String::new() };
            format!("give one of the traces in it: {}{more}", shown.join(", "))
        }
    };
    Error::usage(format!("is a directory, not a trace: {listing}")).in_file(path)
}

/// Opens an input file. A FIFO that is also this process's standard input (`f < f`, or
/// `/dev/stdin` naming a FIFO) is read through the descriptor already open: the writer may have
/// filled the pipe and gone, and opening the FIFO again by its name would wait for another
/// writer forever.
pub(crate) fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let fifo = std::fs::metadata(path).ok().filter(|m| m.file_type().is_fifo());
        let stdin = std::io::stdin();
        let held = stdin.as_fd().try_clone_to_owned().ok().map(std::fs::File::from);
        if let (Some(named), Some(held)) = (fifo, held) {
            let same =
                held.metadata().is_ok_and(|m| (m.dev(), m.ino()) == (named.dev(), named.ino()));
            if same {
                return Ok(held);
            }
        }
    }
    std::fs::File::open(path)
}

/// [`read_path`]; `whole_pickle` reads a snapshot pickle whole instead of streamed, for the
/// files whose stream refers back to what streaming discarded.
fn read_path_as(path: &Path, options: &ReadOptions, whole_pickle: bool) -> Result<Trace> {
    let cap = options.input_cap()?;
    if path.is_dir() {
        return Err(directory_error(path));
    }
    let file = open_input(path).map_err(|e| Error::reading(path, e))?;
    let length = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    if let Some(len) = length.filter(|&len| len > cap) {
        return Err(too_big(len, cap).in_file(path));
    }
    let compressed = length.unwrap_or(0);
    // Errors met below the format reader (the input cap, a broken gzip stream) are kept here
    // and reported as what they are, not as the format error they caused.
    let failure = std::rc::Rc::new(std::cell::RefCell::new(None));
    // The flag is looked at where the format reader's input is counted: in the decompressed
    // bytes for gzip, so the error's byte is one the reader saw.
    let capped = Capped {
        inner: file,
        read: 0,
        cap,
        what: "file",
        failure: failure.clone(),
        cancel: options.cancel.clone(),
    };
    let mut raw = BufReader::with_capacity(BUFFER, capped);
    // (A raised cancel flag stops this first read: its error is kept in `failure`.)
    let first = raw
        .fill_buf()
        .map_err(|e| failure.borrow_mut().take().unwrap_or_else(|| Error::io(path, e)));
    let is_gzip = first.map_err(|e| e.in_file(path))?.starts_with(&[0x1f, 0x8b]);
    let mut input: Box<dyn BufRead> = if is_gzip {
        raw.get_mut().cancel = Cancel::default();
        let inflate = Inflate {
            inner: flate2::read::MultiGzDecoder::new(raw),
            produced: 0,
            limit: decompression_limit(compressed),
            compressed,
            failure: failure.clone(),
        };
        let capped = Capped {
            inner: inflate,
            read: 0,
            cap,
            what: "decompressed input",
            failure: failure.clone(),
            cancel: options.cancel.clone(),
        };
        Box::new(BufReader::with_capacity(BUFFER, capped))
    } else {
        Box::new(raw)
    };
    // A gzip failure seen by the format reader is reported as what it is, not as the format
    // error it caused.
    let gzip_failure = |e: Error| failure.borrow_mut().take().unwrap_or(e).in_file(path);
    let head = peek(&mut input).map_err(|e| gzip_failure(e.in_file(path)))?;
    if head.is_empty() {
        return Err(Error::input("empty file: no trace to read").in_file(path));
    }
    let Some(format) = detect::detect(&head) else {
        // A broken or bomb gzip stream is the real problem, not the format: inflate the rest
        // (without holding it, and at most up to the caps) to find out. Plain input is not read
        // further: an endless stream of junk such as `/dev/zero` fails at once.
        if is_gzip {
            let _ = std::io::copy(&mut input, &mut std::io::sink());
        }
        return Err(gzip_failure(unrecognised()));
    };
    let mut input = std::io::Cursor::new(head).chain(input);
    let read = match format {
        // A regular file can be read again: a snapshot the stream cannot answer is read whole,
        // and so is one with an error, whose message then is the one the whole reader gives
        // (it checks the segments before the entries). The input limit or a broken gzip stream
        // would only fail again.
        Format::PytorchSnapshot if whole_pickle => {
            whole(&mut input).and_then(|data| snapshot::read(&data, options))
        }
        Format::PytorchSnapshot if length.is_some() => {
            match snapshot::stream(&mut input, options) {
                Ok(trace) => Ok(trace),
                Err(_) if failure.borrow().is_none() => return read_path_as(path, options, true),
                Err(stop) => Err(snapshot::refusal_error(stop)),
            }
        }
        _ => (format.info().read)(&mut input, options),
    };
    let mut trace = read.map_err(|e| gzip_failure(e.in_format(format.name())))?;
    if let Some(e) = failure.borrow_mut().take() {
        return Err(e.in_file(path));
    }
    limits::check_trace(&trace).map_err(|e| e.in_format(format.name()).in_file(path))?;
    // Vectors grew by doubling; what was never touched costs no memory, but give it back so
    // the trace holds what it uses (40 bytes an event).
    for d in &mut trace.devices {
        d.events.shrink_to_fit();
    }
    for t in &mut trace.recorded_totals {
        t.totals.shrink_to_fit();
    }
    Ok(trace)
}

/// The buffer between the file (or the inflater) and a reader: what reading holds beside the
/// trace it builds.
const BUFFER: usize = 256 << 10;

/// The bytes [`detect`] looks at: enough for every signature.
const HEAD: usize = 64 << 10;

/// Reads the first [`HEAD`] bytes of `input` (fewer at its end). Returns them, or nothing when
/// the whole input is white space (read through without holding it).
fn peek(input: &mut dyn BufRead) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(HEAD);
    input.take(HEAD as u64).read_to_end(&mut head).map_err(Error::from_io)?;
    if head.iter().all(|b| b.is_ascii_whitespace()) {
        loop {
            let buf = input.fill_buf().map_err(Error::from_io)?;
            if buf.is_empty() {
                return Ok(Vec::new());
            }
            if !buf.iter().all(|b| b.is_ascii_whitespace()) {
                break;
            }
            let n = buf.len();
            input.consume(n);
        }
    }
    Ok(head)
}

/// All of `input`, for the readers that parse a whole file at once (and a snapshot whose stream
/// was refused).
pub(crate) fn whole(input: &mut dyn BufRead) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    input.read_to_end(&mut data).map_err(Error::from_io)?;
    Ok(data)
}

/// A reader that fails once more than `cap` bytes have come through (the input limit), or once
/// `cancel` is raised, keeping the error so it is reported as what it is, not as whatever the
/// format reader made of the cut. It sits under a [`BUFFER`]-sized buffer, so it is called (and
/// looks at the flag) once per buffer of input, never per item.
struct Capped<R: Read> {
    inner: R,
    read: u64,
    cap: u64,
    what: &'static str,
    failure: std::rc::Rc<std::cell::RefCell<Option<Error>>>,
    cancel: Cancel,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Err(e) = self.cancel.check(|| "reading") {
            let e = e.at(Place::Byte(self.read));
            let message = e.to_string();
            self.failure.borrow_mut().get_or_insert(e);
            return Err(std::io::Error::other(message)); // not `Interrupted`: std retries that
        }
        let room =
            self.cap.saturating_add(1).saturating_sub(self.read).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room])?;
        self.read += n as u64;
        if self.read > self.cap {
            let e = Error::input(format!(
                "the {} holds more than {} bytes, the input limit (raise it with --max-input-size or FRAGSIM_MAX_INPUT_SIZE)",
                self.what, self.cap
            ));
            let message = e.to_string();
            self.failure.borrow_mut().get_or_insert(e);
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message));
        }
        Ok(n)
    }
}

/// A streamed gzip decoder that stops at the decompression limit and keeps the first failure, so
/// the error names gzip and the byte it reached rather than whatever the format reader made of
/// the cut.
struct Inflate<R: Read> {
    inner: R,
    produced: u64,
    limit: u64,
    compressed: u64,
    failure: std::rc::Rc<std::cell::RefCell<Option<Error>>>,
}

impl<R: Read> Read for Inflate<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let fail = |this: &mut Self, e: Error| {
            let message = e.to_string();
            this.failure.borrow_mut().get_or_insert(e);
            Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message))
        };
        let room = self.limit.saturating_add(1).saturating_sub(self.produced).min(buf.len() as u64)
            as usize;
        match self.inner.read(&mut buf[..room]) {
            Ok(n) => {
                self.produced += n as u64;
                if self.produced > self.limit {
                    let e = Error::input(format!(
                        "gzip stream expands to more than {} bytes ({}× its compressed size); refusing to read a likely decompression bomb (if it is a real trace, decompress it with gunzip -k and give fragsim the result)",
                        self.limit,
                        self.limit / self.compressed.max(1)
                    ))
                    .in_format("gzip");
                    return fail(self, e);
                }
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                // The decoder has produced `produced` bytes when it fails: name that place.
                let e = Error::input(format!("corrupt or truncated gzip stream: {e}"))
                    .at(Place::Byte(self.produced))
                    .in_format("gzip");
                fail(self, e)
            }
        }
    }
}

/// A writer that fails once `cancel` is raised, keeping the error so it is reported as what it
/// is, not as the write error it caused. It sits under a [`BUFFER`]-sized buffer, so it looks at
/// the flag once per buffer written.
struct Stoppable<W: Write> {
    inner: W,
    written: u64,
    cancel: Cancel,
    failure: std::rc::Rc<std::cell::RefCell<Option<Error>>>,
}

impl<W: Write> Write for Stoppable<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Err(e) = self.cancel.check(|| "writing") {
            let e = e.at(Place::Byte(self.written));
            let message = e.to_string();
            self.failure.borrow_mut().get_or_insert(e);
            return Err(std::io::Error::other(message)); // not `Interrupted`: std retries that
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
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

/// Without the `cli` feature nothing is drawn, so there is no spinner thread to start.
#[cfg(not(feature = "cli"))]
fn with_progress<T>(_path: &Path, read: impl FnOnce() -> T) -> T {
    read()
}

/// Runs `read` while a helper thread waits one second, then shows a spinner until it is done.
#[cfg(feature = "cli")]
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
            let bar = crate::progress::Bar::reading(&format!("{name} ({size})"), start);
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
    // Handed to the reader a buffer at a time, as a file is, so that it looks at the cancel
    // flag between buffers.
    let failure = std::rc::Rc::new(std::cell::RefCell::new(None));
    let input = || {
        let capped = Capped {
            inner: data,
            read: 0,
            cap: u64::MAX,
            what: "input",
            failure: failure.clone(),
            cancel: options.cancel.clone(),
        };
        BufReader::with_capacity(BUFFER, capped)
    };
    let read = match format {
        // Streamed like a file, and read whole again where the stream cannot answer (or fails,
        // for the whole reader's message), as `read_path` does; not once cancelled.
        Format::PytorchSnapshot => snapshot::stream(&mut input(), options).or_else(|stop| {
            if failure.borrow().is_some() {
                Err(snapshot::refusal_error(stop))
            } else {
                snapshot::read(data, options)
            }
        }),
        _ => (format.info().read)(&mut input(), options),
    };
    if let Some(e) = failure.borrow_mut().take() {
        return Err(e);
    }
    let trace = read?;
    limits::check_trace(&trace)?;
    Ok(trace)
}

/// Reads a trace file's content held in memory (the Python package's `bytes` and file objects)
/// as [`read_trace`] reads the file: gzip undone, the format detected by content, the same
/// input cap and limits; the caller names the source.
pub fn read_memory(data: &[u8], options: &ReadOptions) -> Result<Trace> {
    let cap = options.input_cap()?;
    if data.len() as u64 > cap {
        return Err(too_big(data.len() as u64, cap));
    }
    let inflated;
    let data = if data.starts_with(&[0x1f, 0x8b]) {
        let limit = decompression_limit(data.len() as u64).min(cap);
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(data)
            .take(limit + 1)
            .read_to_end(&mut out)
            .map_err(|e| Error::input(format!("broken gzip stream: {e}")))?;
        if out.len() as u64 > limit {
            return Err(Error::input(format!(
                "the gzip stream expands past {limit} bytes (the input limit, or {}x its \
                 compressed size)",
                limit / (data.len() as u64).max(1)
            )));
        }
        inflated = out;
        &inflated[..]
    } else {
        data
    };
    if data.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::input("empty file: no trace to read"));
    }
    let format = detect::detect(&data[..data.len().min(HEAD)]).ok_or_else(unrecognised)?;
    read_bytes(data, format, options).map_err(|e| e.in_format(format.name()))
}

/// Writes `trace` to `path` in the format its extension names; `.gz` compresses.
pub fn write_trace(trace: &Trace, path: &Path) -> Result<()> {
    write_trace_cancellable(trace, path, &Cancel::default())
}

/// [`write_trace`], looking at `cancel` once per buffer written (256 KiB of the file): once it
/// is raised, the write stops with an error naming the file and the byte it reached, and the
/// half-written file is removed.
pub fn write_trace_cancellable(trace: &Trace, path: &Path, cancel: &Cancel) -> Result<()> {
    let format = Format::for_output(path)?;
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let failure = std::rc::Rc::new(std::cell::RefCell::new(None));
    let file =
        Stoppable { inner: file, written: 0, cancel: cancel.clone(), failure: failure.clone() };
    // Streamed through a buffer: writing holds no copy of the encoded file.
    let out = std::io::BufWriter::with_capacity(BUFFER, file);
    let written = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz")) {
        let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        write_to(trace, format, &mut enc)
            .and_then(|_| enc.finish().map_err(Error::from_io))
            .and_then(|out| out.into_inner().map_err(|e| Error::from_io(e.into_error())))
    } else {
        let mut out = out;
        write_to(trace, format, &mut out)
            .and_then(|_| out.into_inner().map_err(|e| Error::from_io(e.into_error())))
    };
    written.map(drop).map_err(|e| {
        // No half-written trace is left behind; a failed write names the file, an encoding
        // error stays as the format writer worded it.
        let _ = std::fs::remove_file(path);
        if let Some(stopped) = failure.borrow_mut().take() {
            return stopped.in_file(path);
        }
        if std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) {
            e.in_file(path)
        } else {
            e
        }
    })
}

/// Writes `trace` into `out` in the format `path`'s extension names (`.gz` compresses), looking
/// at `cancel` once per buffer written (256 KiB): once it is raised, the write stops with an
/// error naming the byte it reached. `path` is only read for its name: where and how the bytes
/// land is the caller's (fragsim's commands write through `report::output`).
pub fn write_trace_into(
    trace: &Trace,
    path: &Path,
    out: &mut dyn Write,
    cancel: &Cancel,
) -> Result<()> {
    let format = Format::for_output(path)?;
    let failure = std::rc::Rc::new(std::cell::RefCell::new(None));
    let mut sink =
        Stoppable { inner: out, written: 0, cancel: cancel.clone(), failure: failure.clone() };
    let mut buffered = std::io::BufWriter::with_capacity(BUFFER, &mut sink);
    let written = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz")) {
        let mut enc = flate2::write::GzEncoder::new(&mut buffered, flate2::Compression::default());
        write_to(trace, format, &mut enc)
            .and_then(|_| enc.finish().map(drop).map_err(Error::from_io))
    } else {
        write_to(trace, format, &mut buffered)
    }
    .and_then(|_| buffered.flush().map_err(Error::from_io));
    drop(buffered);
    written.map_err(|e| failure.borrow_mut().take().unwrap_or(e))
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

/// How far a gzip file of `compressed` bytes may expand. Real traces compress 5–20×; a ratio
/// far beyond that is a decompression bomb, so memory stays in proportion to the file.
pub(crate) fn decompression_limit(compressed: u64) -> u64 {
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
        // Timed: Kineto notes made-up times for an untimed trace.
        let text = "alloc 0x1000 4096 s0 @1\nfree_completed 0x1000 4096 s0 @2\n";
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
