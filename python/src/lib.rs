//! `fragsim._native`: the command line of the `fragsim` crate for Python.
//!
//! Two entry points, both running [`fragsim::cli`], the one implementation of every command:
//! [`main`] is the `fragsim` command the package installs (the process's stdout and stderr,
//! exactly as the binary), and [`call`] is what each Python function (`fragsim.replay(...)`)
//! runs: the argument list the function built, its output captured, traces from memory passed
//! by name, the GIL released while the command runs on a thread of its own (so Ctrl-C raises
//! `KeyboardInterrupt` at once, and the command's replays stop at their next look at the
//! [`Cancel`] flag it then raises, a few milliseconds later), and a panic turned into an error
//! instead of crossing into Python. The pure-Python layer (`python/fragsim/`) turns the outcome into results and
//! exceptions.

mod ask;
mod loaded;
mod snapshot_dict;

use fragsim::cli::{self, Failure, InMemory, Io};
use fragsim::replay::Cancel;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The name of the threads [`call`] runs commands on; the panic hook stays quiet on them.
const THREAD: &str = "fragsim-call";

/// How often a waiting [`call`] looks for a signal (Ctrl-C) Python has received.
const POLL: Duration = Duration::from_millis(50);

/// Runs the command line `argv` (program name first) on the process's stdout and stderr, as
/// the binary does; returns the exit code (101 after a panic, as a Rust binary exits).
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.allow_threads(|| {
        std::panic::catch_unwind(|| {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            cli::main(argv, &mut Io::stdio(&mut out, &mut err))
        })
        .unwrap_or(101)
    })
}

/// What a failed command or conversion tells Python: kind (`usage`, `input`, `io`, `backend`,
/// `internal`), message, file, format, place, and the whole line as the binary prints it.
type ErrorInfo = (String, String, Option<String>, Option<String>, Option<String>, String);

/// A command's outcome: exit code, stdout, stderr, and the error, if it failed.
type Outcome = (u8, String, String, Option<ErrorInfo>);

/// Runs the command line `argv` with its output captured. `memory` maps names used in `argv`
/// to traces held in memory: `bytes` (a trace file's content), a snapshot dict (read when the
/// command reads it, under the GIL, as its pickle file is streamed), or a [`loaded::Loaded`]
/// trace (read once, for every command given it). `progress` allows
/// progress bars on the process's stderr.
#[pyfunction]
fn call(
    py: Python<'_>,
    argv: Vec<OsString>,
    memory: Vec<(String, Bound<'_, PyAny>)>,
    progress: bool,
) -> PyResult<Outcome> {
    let mut held = std::collections::HashMap::new();
    let mut paths = Vec::new();
    for (name, obj) in memory {
        let item = if let Ok(loaded) = obj.downcast::<loaded::Loaded>() {
            let loaded = loaded.get();
            paths.push((name.clone(), loaded.names.clone()));
            InMemory::Shared(loaded.reader())
        } else if let Ok(b) = obj.downcast::<PyBytes>() {
            InMemory::Bytes(b.as_bytes().to_vec())
        } else if let Ok(b) = obj.downcast::<PyByteArray>() {
            InMemory::Bytes(b.to_vec())
        } else {
            // Converted when the command reads it, under the GIL again, knowing whether the
            // command keeps stack frames; the key paths stay here to name an error's place.
            let names = Arc::new(Mutex::new(None));
            paths.push((name.clone(), names.clone()));
            let obj = obj.unbind();
            InMemory::Reader(Box::new(move |options| snapshot_dict::read(obj, options, &names)))
        };
        held.insert(PathBuf::from(name), item);
    }
    let cancel = Cancel::new();
    let stop = cancel.clone();
    let job = move || {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut io = Io::buffers(&mut out, &mut err, progress);
        io.memory = held;
        io.cancel = cancel;
        let result = cli::run(argv, &mut io);
        (result, out, err)
    };
    let (result, out, err) = match off_thread(py, &stop, job)? {
        Ok((result, out, err)) => (Ok(result), out, err),
        Err(what) => (Err(what), Vec::new(), Vec::new()),
    };
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    let (out, err) = (text(out), text(err));
    Ok(match result {
        Ok(Ok(code)) => (code, out, err, None),
        Ok(Err(Failure::Clap(e))) if !e.use_stderr() => (0, e.render().to_string(), err, None),
        Ok(Err(Failure::Clap(e))) => {
            let message = e.render().to_string().trim_end().to_string();
            let message = message.strip_prefix("error: ").unwrap_or(&message).to_string();
            let info = ("usage".into(), message.clone(), None, None, None, message);
            (2, out, err, Some(info))
        }
        Ok(Err(Failure::Command(e))) => {
            let names = e.location().file.as_ref().and_then(|f| {
                paths.iter().find(|(n, _)| std::path::Path::new(n) == f).map(|(_, names)| names)
            });
            let names = names.and_then(|n| n.lock().ok());
            let code = e.kind().exit_code();
            (code, out, err, Some(error_info(&e, names.as_ref().and_then(|n| n.as_ref()))))
        }
        Err(what) => {
            let (code, info) = panicked(&what);
            (code, out, err, Some(info))
        }
    })
}

/// Runs `job` on a thread of its own with the GIL released, looking for a signal Python has
/// received (Ctrl-C) every [`POLL`]: a signal raises here and raises `stop`, so the job's replays
/// stop at their next look at it. A panic in `job` comes back as its message.
fn off_thread<T: Send + 'static>(
    py: Python<'_>,
    stop: &Cancel,
    job: impl FnOnce() -> T + Send + 'static,
) -> PyResult<std::result::Result<T, String>> {
    install_quiet_panic_hook();
    let (tx, rx) = channel();
    let job = move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        let _ = tx.send(result.map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into())
        }));
    };
    std::thread::Builder::new()
        .name(THREAD.into())
        .stack_size(8 << 20)
        .spawn(job)
        .map_err(|e| PyRuntimeError::new_err(format!("fragsim: cannot start a thread: {e}")))?;
    let mut rx = rx;
    loop {
        // The receiver travels into the GIL-free wait and back (it may not be shared).
        let (back, got) = py.allow_threads(move || {
            let got = rx.recv_timeout(POLL);
            (rx, got)
        });
        rx = back;
        match got {
            Ok(done) => return Ok(done),
            // Ctrl-C raises here; the job's replays stop at their next look at the flag, and
            // its thread ends unheard.
            Err(RecvTimeoutError::Timeout) => py.check_signals().inspect_err(|_| stop.cancel())?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err("fragsim: the command ended without a result"))
            }
        }
    }
}

/// A panic's exit code and error for Python: a bug, said as one.
fn panicked(what: &str) -> (u8, ErrorInfo) {
    let message = format!("internal error (a bug in fragsim, please report it): {what}");
    (101, ("internal".into(), message.clone(), None, None, None, message))
}

/// An error's parts for Python. For a snapshot dict (`names` given), a place the reader gives
/// as a pickle byte is a container number ([`snapshot_dict::Names`]): it becomes the
/// container's key path, and the message loses its "(pickle byte N)".
fn error_info(e: &fragsim::Error, names: Option<&snapshot_dict::Names>) -> ErrorInfo {
    let kind = match e.kind() {
        fragsim::ErrorKind::Usage => "usage",
        fragsim::ErrorKind::Input => "input",
        fragsim::ErrorKind::Io => "io",
        fragsim::ErrorKind::Backend => "backend",
        _ => "input",
    };
    let loc = e.location();
    let file = loc.file.as_ref().map(|f| f.display().to_string());
    let format = loc.format.map(str::to_string);
    let mut message = e.message().to_string();
    let mut place = loc.place.map(|p| p.to_string());
    if let Some(names) = names {
        let (text, byte) = snapshot_dict::strip_byte(&message);
        let byte = byte.or(match loc.place {
            Some(fragsim::error::Place::Byte(b)) => Some(b),
            _ => None,
        });
        if let Some(path) = byte.and_then(|b| names.path(b)) {
            place = Some(path);
            message = text;
        }
    }
    let mut whole = String::new();
    for part in [&file, &format, &place].into_iter().flatten() {
        whole.push_str(part);
        whole.push_str(": ");
    }
    whole.push_str(&message);
    (kind.into(), message, file, format, place, whole)
}

/// Keeps a panic on a [`call`] thread off stderr (it becomes the call's error); panics
/// elsewhere go to the hook that was there before.
fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(THREAD) {
                previous(info);
            }
        }));
    });
}

/// The version of the `fragsim` crate this module was built from (what `--version` prints).
#[pyfunction]
fn version() -> &'static str {
    cli::version()
}

/// The names of the command line's commands.
#[pyfunction]
fn commands() -> Vec<String> {
    cli::commands()
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(call, m)?)?;
    m.add_function(wrap_pyfunction!(ask::info, m)?)?;
    m.add_function(wrap_pyfunction!(ask::replay, m)?)?;
    m.add_function(wrap_pyfunction!(ask::explain, m)?)?;
    m.add_function(wrap_pyfunction!(ask::fit, m)?)?;
    m.add_function(wrap_pyfunction!(ask::blame, m)?)?;
    m.add_function(wrap_pyfunction!(ask::validate, m)?)?;
    m.add_function(wrap_pyfunction!(ask::diff, m)?)?;
    m.add_function(wrap_pyfunction!(ask::sweep, m)?)?;
    m.add_function(wrap_pyfunction!(ask::check, m)?)?;
    m.add_function(wrap_pyfunction!(ask::report, m)?)?;
    m.add_function(wrap_pyfunction!(ask::convert, m)?)?;
    m.add_function(wrap_pyfunction!(ask::merge, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(commands, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot_dict::convert_only, m)?)?;
    m.add_class::<loaded::Loaded>()?;
    m.add_class::<ask::On>()?;
    Ok(())
}
