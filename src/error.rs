//! The one error type of the library.
//!
//! Every failure a user can cause (bad usage, a malformed trace, a missing CUDA driver) is an
//! [`Error`] with an [`ErrorKind`] that decides the process exit code, and, for input errors, a
//! [`Location`] naming the file, the format it was read as and the place inside it. Messages are
//! lower case without a final period, and quote the bad value, so the binary can print
//! `fragsim: {error}` and the user knows what to fix.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The most characters of a value from an input that an error message quotes ([`quoted`]).
pub const QUOTE_MAX: usize = 80;

/// `s`, a value read from an input, quoted for an error message: in single quotes, its control
/// characters written out (`\x1b`, `\0`: [`printable`]) so that no message acts on the
/// terminal, and cut to [`QUOTE_MAX`] characters, marked `…` and followed by the value's full
/// length in bytes, so that a 10 MB field still makes a one-line message. Every reader quotes
/// what it refuses through this one helper.
pub fn quoted(s: &str) -> String {
    // Only a prefix is escaped: the rest is never shown, however long.
    let prefix = match s.char_indices().nth(QUOTE_MAX) {
        Some((end, _)) => &s[..end],
        None => s,
    };
    let shown = printable(prefix);
    match shown.char_indices().nth(QUOTE_MAX) {
        None if prefix.len() == s.len() => format!("'{shown}'"),
        None => format!("'{shown}…' ({} bytes)", s.len()),
        Some((end, _)) => format!("'{}…' ({} bytes)", &shown[..end], s.len()),
    }
}

/// `s` with every character that a terminal, a CSV row or an XML document cannot show as itself
/// written out: `\n`, `\r`, `\t`, `\0`, other control characters as `\xHH` (C0, DEL, C1) and
/// the non-characters U+FFFE/U+FFFF, the bidirectional controls (U+202A–U+202E, U+2066–U+2069,
/// U+200E, U+200F, U+061C) and the line and paragraph separators (U+2028, U+2029) as
/// `\u{202e}`. Names from a trace are data: an ESC must not reach the terminal, a newline (or a
/// separator some viewers break at) must not split a table row, a right-to-left override must not
/// reorder what a terminal shows of a row ("Trojan Source"), and no byte XML forbids may reach an
/// SVG. Text without such characters is returned as is. Public for the command line, which
/// writes paths and names from the trace into its tables; `trace::sites` re-exports it.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| {
        c.is_control()
            || matches!(c, '\u{fffe}' | '\u{ffff}' | '\u{2028}' | '\u{2029}')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}')
    };
    if !s.chars().any(bad) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if (c as u32) < 0x100 && bad(c) => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if bad(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The reason of the I/O error `e` in fragsim's words: the common ones spelled out (`no space
/// left on the device`, `permission denied`), any other the OS's words without Rust's
/// `(os error N)` suffix. Reading and writing errors share it, so a full disk reads the same
/// whichever command met it.
pub fn os_reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::PermissionDenied => "permission denied".to_string(),
        K::AlreadyExists => "something else already stands there".to_string(),
        K::StorageFull => "no space left on the device".to_string(),
        K::ReadOnlyFilesystem => "the file system is read-only".to_string(),
        K::NotADirectory => "a part of the path is a file, not a folder".to_string(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(i) => text[..i].to_string(),
                None => text,
            }
        }
    }
}

/// What went wrong, coarsely: it decides the exit code (see `docs/interface.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad command-line usage or option value (exit code 2).
    Usage,
    /// An unreadable, malformed or unsupported input file (exit code 2).
    Input,
    /// An I/O failure while reading or writing a file (exit code 2).
    Io,
    /// A memory backend failed: no CUDA driver, a device error (exit code 3).
    Backend,
}

impl ErrorKind {
    /// The process exit code for an error of this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Usage | ErrorKind::Input | ErrorKind::Io => 2,
            ErrorKind::Backend => 3,
        }
    }
}

/// Where inside a file an input error was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A byte offset from the start of the (decompressed) file.
    Byte(u64),
    /// A 1-based line number.
    Line(u64),
    /// A 0-based index into a device's event list.
    Event(u64),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Byte(b) => write!(f, "byte {b}"),
            Place::Line(l) => write!(f, "line {l}"),
            Place::Event(e) => write!(f, "event {e}"),
        }
    }
}

/// The file, format and place an input error refers to; each part is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    /// The file being read.
    pub file: Option<PathBuf>,
    /// The format it was read as, e.g. `pytorch-snapshot`.
    pub format: Option<&'static str>,
    /// Where in the file.
    pub place: Option<Place>,
}

/// A fragsim error: a kind, a message and, for input, where.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    location: Location,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with `message` (lower case, no final period).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into(), location: Location::default(), source: None }
    }

    /// A usage error: a bad flag or option value.
    pub fn usage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Usage, message)
    }

    /// An input error: the file's content is malformed or unsupported.
    pub fn input(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Input, message)
    }

    /// A backend error: the memory backend failed or is unavailable.
    pub fn backend(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Backend, message)
    }

    /// An I/O error on `path`.
    pub fn io(path: &Path, err: std::io::Error) -> Error {
        let message = format!("{err}");
        Error {
            kind: ErrorKind::Io,
            message,
            location: Location::default(),
            source: Some(Box::new(err)),
        }
        .in_file(path)
    }

    /// An input `path` that cannot be opened or read: `cannot read the file: {reason}`, in
    /// fragsim's words ([`os_reason`]: `no such file`, `permission denied`), naming the file,
    /// as the outputs' errors do; `err` stays the source.
    pub fn reading(path: &Path, err: std::io::Error) -> Error {
        let reason = match err.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            _ => os_reason(&err),
        };
        Error::io_worded(format!("cannot read the file: {reason}"), err).in_file(path)
    }

    /// An I/O error worded by fragsim (`message`), keeping `err` as the source.
    pub fn io_worded(message: impl Into<String>, err: std::io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: message.into(),
            location: Location::default(),
            source: Some(Box::new(err)),
        }
    }

    /// An I/O error while writing `what` (`"CSV"`, `"to stdout"`): the message reads
    /// `writing {what}: {err}`, and `err` stays the [source](std::error::Error::source), so the
    /// binary can tell a closed pipe (see [`Error::is_broken_pipe`]) from a full disk.
    pub fn writing(what: &str, err: std::io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: format!("writing {what}: {err}"),
            location: Location::default(),
            source: Some(Box::new(err)),
        }
    }

    /// Whether this error is a write to a pipe whose reader has gone (`fragsim ... | head`):
    /// the reader got what it wanted, so the command ends quietly with exit code 0.
    pub fn is_broken_pipe(&self) -> bool {
        self.source
            .as_deref()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// An I/O error with no file to name (a writer the caller handed in); `err` stays the source,
    /// so a closed pipe is still recognised.
    pub fn from_io(err: std::io::Error) -> Error {
        Error {
            kind: ErrorKind::Io,
            message: err.to_string(),
            location: Location::default(),
            source: Some(Box::new(err)),
        }
    }

    /// The kind, which decides the exit code.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message without the location.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The location (file, format, place), as far as known.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Names the file, unless one is named already.
    pub fn in_file(mut self, path: &Path) -> Error {
        if self.location.file.is_none() {
            self.location.file = Some(path.to_path_buf());
        }
        self
    }

    /// The same error with `prefix` before its message (`pytorch: ...`), where it was and
    /// what caused it kept.
    pub fn prefixed(mut self, prefix: &str) -> Error {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    /// Names the format the file was read as, unless one is named already.
    pub fn in_format(mut self, format: &'static str) -> Error {
        if self.location.format.is_none() {
            self.location.format = Some(format);
        }
        self
    }

    /// Names the place in the file, unless one is named already.
    pub fn at(mut self, place: Place) -> Error {
        if self.location.place.is_none() {
            self.location.place = Some(place);
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let loc = &self.location;
        if let Some(file) = &loc.file {
            write!(f, "{}: ", printable(&file.display().to_string()))?;
        }
        if let Some(format) = loc.format {
            write!(f, "{format}: ")?;
        }
        if let Some(place) = loc.place {
            write!(f, "{place}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A flag that stops long work early: replays, validation, trace reading and writing, the
/// `offline` planner and `synth` look at it before they start and every [`Cancel::EVERY`]
/// items (events, blocks, or a reader's buffer of input), and then fail with an
/// interrupted error that whoever raised the flag discards, or, on the command
/// line, that ends the process with exit code 130.
///
/// It is raised in one of two ways, and every `Cancel` sees both:
/// - [`Cancel::cancel`] on a flag made by [`Cancel::new`]: clones share it, so the caller keeps
///   one and hands the others to the work (the Python package raises it when Ctrl-C interrupts
///   the call that started the work);
/// - Ctrl-C in a process that installed [`Cancel::interrupt`] as its SIGINT handler (opening
///   the `cuda` backend does, so that a replay stopped on a real GPU frees its memory before
///   the process ends; elsewhere Ctrl-C ends the process at once).
///
/// The default one is raised only by the second, so the command line pays one load of a
/// static for it.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Option<Arc<AtomicBool>>);

/// The process's flag (see [`Cancel`]): a static, because a signal handler can reach nothing else.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

impl Cancel {
    /// Items long work handles between two looks at the flag: a few milliseconds of work at
    /// most, and no cost per item (loops run in chunks of this many, or test a counter).
    pub const EVERY: usize = 1 << 16;

    /// A flag that [`Cancel::cancel`] can raise.
    pub fn new() -> Cancel {
        Cancel(Some(Arc::new(AtomicBool::new(false))))
    }

    /// Raises the flag: all work holding a clone stops at its next look.
    pub fn cancel(&self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// True once the flag was raised, or the process interrupted ([`Cancel::interrupt`]).
    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|flag| flag.load(Ordering::Relaxed))
            || INTERRUPTED.load(Ordering::Relaxed)
    }

    /// Raises the process's flag, which every `Cancel` sees: what a SIGINT handler calls. It
    /// only stores to an atomic, so it is async-signal-safe.
    pub fn interrupt() {
        INTERRUPTED.store(true, Ordering::Relaxed);
    }

    /// True once [`Cancel::interrupt`] was called: the process was interrupted, so the command
    /// line exits 130 rather than with the error's own code.
    pub fn interrupted() -> bool {
        INTERRUPTED.load(Ordering::Relaxed)
    }

    /// An error once the flag was raised (the work was abandoned; nobody reads its result):
    /// a usage error whose message says what was interrupted, `interrupted (Ctrl-C) while
    /// {doing}`. `doing` (e.g. `replaying policy 'bfc' at event 65536 of 200000`) is called
    /// only then, so the check costs one load of the flag.
    #[inline(always)]
    pub fn check<S: Into<String>>(&self, doing: impl FnOnce() -> S) -> Result<()> {
        if self.is_cancelled() {
            return Err(interrupted(doing().into()));
        }
        Ok(())
    }
}

/// The error of cancelled work, made out of line: a loop holds only the test.
#[cold]
#[inline(never)]
fn interrupted(doing: String) -> Error {
    Error::usage(format!("interrupted (Ctrl-C) while {doing}"))
}

impl Error {
    /// True for the error of work stopped by a raised [`Cancel`] flag.
    pub fn is_interrupted(&self) -> bool {
        self.kind == ErrorKind::Usage && self.message.starts_with("interrupted (Ctrl-C) while ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_format_and_place() {
        let e = Error::input("truncated pickle")
            .at(Place::Byte(42))
            .in_format("pytorch-snapshot")
            .in_file(Path::new("a.pickle"));
        assert_eq!(e.to_string(), "a.pickle: pytorch-snapshot: byte 42: truncated pickle");
        assert_eq!(e.kind().exit_code(), 2);
        assert_eq!(Error::backend("no driver").kind().exit_code(), 3);
        // A file's name is shown as text: a newline or an ESC in it cannot forge a line.
        let e = Error::input("x").in_file(Path::new("a\nfragsim: ok\u{1b}[2J.pickle"));
        assert_eq!(e.to_string(), "a\\nfragsim: ok\\x1b[2J.pickle: x");
    }

    #[test]
    fn writing_keeps_the_io_error_as_source() {
        use std::io::ErrorKind as Io;
        let e = Error::writing("CSV", std::io::Error::new(Io::BrokenPipe, "Broken pipe"));
        assert_eq!(e.to_string(), "writing CSV: Broken pipe");
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.is_broken_pipe());
        let source = std::error::Error::source(&e).unwrap();
        assert_eq!(source.downcast_ref::<std::io::Error>().unwrap().kind(), Io::BrokenPipe);
        assert!(
            !Error::writing("CSV", std::io::Error::new(Io::StorageFull, "full")).is_broken_pipe()
        );
        assert!(!Error::input("x").is_broken_pipe());
    }

    #[test]
    fn quoted_writes_control_characters_out_and_cuts_long_values() {
        assert_eq!(quoted("4096"), "'4096'");
        assert_eq!(quoted("4096\0"), "'4096\\0'");
        assert_eq!(quoted("x\u{1b}[2J\u{7}"), "'x\\x1b[2J\\x07'");
        let long = "9".repeat(10_000_000);
        assert_eq!(quoted(&long), format!("'{}…' (10000000 bytes)", "9".repeat(QUOTE_MAX)));
        // Escapes count toward the limit: of 80 ESCs, the first 20 are shown.
        let escs = quoted(&"\u{1b}".repeat(QUOTE_MAX));
        assert_eq!(escs, format!("'{}…' (80 bytes)", "\\x1b".repeat(QUOTE_MAX / 4)));
        // Exactly the limit is shown whole, without a mark.
        assert_eq!(quoted(&"é".repeat(QUOTE_MAX)), format!("'{}'", "é".repeat(QUOTE_MAX)));
    }

    #[test]
    fn first_location_wins() {
        let e = Error::input("x").at(Place::Line(3)).at(Place::Line(9));
        assert_eq!(e.location().place, Some(Place::Line(3)));
    }
}
