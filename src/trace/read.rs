//! Reading and writing a trace file of any supported format.
//!
//! The format is chosen by content (see [`detect`](super::detect)), not by extension, because
//! users rename files; gzip is undone first. Every error names the file and the format it was
//! read as, and the reader adds the place (byte, line or event).

use super::{detect, fst, kineto, rmm, snapshot, text, Trace};
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

impl Format {
    /// Every format.
    pub const ALL: [Format; 5] =
        [Format::PytorchSnapshot, Format::Kineto, Format::RmmCsv, Format::Fst, Format::Text];

    /// The name used in messages and in `info --json`.
    pub fn name(self) -> &'static str {
        match self {
            Format::PytorchSnapshot => "pytorch-snapshot",
            Format::Kineto => "kineto",
            Format::RmmCsv => "rmm-csv",
            Format::Fst => "fst",
            Format::Text => "text",
        }
    }

    /// The format an output path asks for, by its extension.
    pub fn from_extension(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let name = name.strip_suffix(".gz").unwrap_or(&name);
        let ext = name.rsplit('.').next()?;
        match ext {
            "pickle" | "pkl" => Some(Format::PytorchSnapshot),
            "json" => Some(Format::Kineto),
            "csv" => Some(Format::RmmCsv),
            "fst" => Some(Format::Fst),
            "txt" | "trace" => Some(Format::Text),
            _ => None,
        }
    }
}

/// What a reader should keep.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOptions {
    /// Keep stack frames (costs memory and time; off unless a command needs them).
    pub keep_frames: bool,
    /// Show a progress bar on stderr for slow reads (only when stderr is a terminal).
    pub progress: bool,
}

/// Sizes at or above 2^60 bytes are rejected by every reader: PyTorch's caching allocator refuses
/// such requests, so a trace that holds one is corrupt (and sums of them would overflow).
pub const MAX_EVENT_BYTES: u64 = 1 << 60;

/// The largest file fragsim will decompress into memory, to bound memory on hostile input.
pub const MAX_DECOMPRESSED_BYTES: u64 = 8 << 30;

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
    let raw = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let data = if raw.starts_with(&[0x1f, 0x8b]) {
        gunzip(&raw).map_err(|e| e.in_file(path))?
    } else {
        raw
    };
    if data.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(Error::input("empty file: no trace to read").in_file(path));
    }
    let format = detect::detect(&data).ok_or_else(|| {
        Error::input(
            "unrecognised trace format (expected a PyTorch snapshot pickle, Kineto JSON, RMM CSV, .fst or fragsim text)",
        )
        .at(Place::Byte(0))
        .in_file(path)
    })?;
    read_bytes(&data, format, options).map_err(|e| e.in_format(format.name()).in_file(path))
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
    std::thread::scope(|scope| {
        scope.spawn(move || {
            if wait.recv_timeout(Duration::from_secs(1)) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let bar = indicatif::ProgressBar::new_spinner();
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

/// Reads a trace of a known format from memory.
pub fn read_bytes(data: &[u8], format: Format, options: &ReadOptions) -> Result<Trace> {
    match format {
        Format::PytorchSnapshot => snapshot::read(data, options),
        Format::Kineto => kineto::read(data, options),
        Format::RmmCsv => rmm::read(data, options),
        Format::Fst => fst::read(data, options),
        Format::Text => text::read(data, options),
    }
}

/// Writes `trace` to `path` in the format its extension names; `.gz` compresses.
pub fn write_trace(trace: &Trace, path: &Path) -> Result<()> {
    let format = Format::from_extension(path).ok_or_else(|| {
        Error::usage(format!(
            "cannot tell the output format from '{}': use .pickle, .json, .csv, .fst or .txt (optionally .gz)",
            path.display()
        ))
    })?;
    let mut buffer = Vec::new();
    write_to(trace, format, &mut buffer)?;
    let bytes = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz")) {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&buffer).and_then(|_| enc.finish()).map_err(|e| Error::io(path, e))?
    } else {
        buffer
    };
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// Writes `trace` in `format` to `out`.
pub fn write_to(trace: &Trace, format: Format, out: &mut impl Write) -> Result<()> {
    match format {
        Format::PytorchSnapshot => snapshot::write(trace, out),
        Format::Kineto => kineto::write(trace, out),
        Format::RmmCsv => rmm::write(trace, out),
        Format::Fst => fst::write(trace, out),
        Format::Text => text::write(trace, out),
    }
}

fn gunzip(raw: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut decoder = flate2::read::GzDecoder::new(raw).take(MAX_DECOMPRESSED_BYTES + 1);
    decoder
        .read_to_end(&mut out)
        .map_err(|e| Error::input(format!("corrupt gzip stream: {e}")).in_format("gzip"))?;
    if out.len() as u64 > MAX_DECOMPRESSED_BYTES {
        return Err(Error::input("gzip stream expands to more than 8 GiB; refusing to read it")
            .in_format("gzip"));
    }
    Ok(out)
}
