//! `fragsim._native.Loaded`: a trace read once and handed to every command that asks for it
//! ([`fragsim::cli::InMemory::Shared`]). `fragsim.load` holds one; the module-level functions
//! make one per call for a trace from memory, so a command that reads its trace twice (a
//! sweep's built-in grid) converts a snapshot dict once.
//!
//! The trace is read when a command first asks for it, with that command's read options, and
//! kept by whether it has stack frames (the two reads differ: a trace without frames keeps only
//! a release's); each later read shares the one kept (nothing is copied).

use crate::snapshot_dict::{self, Names};
use fragsim::cli::SharedReader;
use fragsim::error::Error;
use fragsim::session::Session;
use fragsim::trace::fst::FstStream;
use fragsim::trace::{ReadOptions, Trace};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Where a loaded trace comes from.
enum Source {
    /// A trace file.
    Path(PathBuf),
    /// A trace file's content.
    Bytes(Vec<u8>),
    /// A snapshot dict (or a legacy segment list), converted under the GIL.
    Dict(Py<PyAny>),
}

/// The traces read so far (without, with stack frames), and a dict's key paths for errors.
#[derive(Default)]
struct Kept {
    traces: [Option<Arc<Trace>>; 2],
}

/// A trace held for the commands that read it: a path, `bytes` or a snapshot dict.
#[pyclass(module = "fragsim._native", frozen)]
#[derive(Clone)]
pub struct Loaded {
    source: Arc<Source>,
    kept: Arc<Mutex<Kept>>,
    /// The key paths of a converted dict, for the caller to name an error's place.
    pub names: Arc<Mutex<Option<Names>>>,
}

#[pymethods]
impl Loaded {
    /// Whether `other` holds the very same source (a clone of this `Loaded`).
    pub fn is(&self, other: &Loaded) -> bool {
        Arc::ptr_eq(&self.source, &other.source)
    }

    /// Holds `source`: a path (`str` or `os.PathLike`), `bytes`/`bytearray`, or a snapshot
    /// dict (or list). Nothing is read until a command asks for the trace.
    #[new]
    fn new(source: &Bound<'_, PyAny>) -> PyResult<Self> {
        let source = if let Ok(b) = source.downcast::<PyBytes>() {
            Source::Bytes(b.as_bytes().to_vec())
        } else if let Ok(b) = source.downcast::<PyByteArray>() {
            Source::Bytes(b.to_vec())
        } else if source.is_instance_of::<pyo3::types::PyDict>()
            || source.is_instance_of::<pyo3::types::PyList>()
        {
            Source::Dict(source.clone().unbind())
        } else if let Ok(p) = source.extract::<PathBuf>() {
            Source::Path(p)
        } else {
            return Err(PyTypeError::new_err(format!(
                "a trace is a path, bytes or a snapshot dict, not {}",
                source.get_type().name()?
            )));
        };
        Ok(Loaded { source: Arc::new(source), kept: Arc::default(), names: Arc::default() })
    }

    /// Whether a command has read the trace yet (with stack frames or without).
    #[getter]
    fn read(&self) -> bool {
        self.kept.lock().map(|k| k.traces.iter().any(Option::is_some)).unwrap_or(false)
    }
}

impl Loaded {
    /// A session on the trace under `name`, about `device`. Read for this question `once`, a
    /// trace given by path is read from its file and not kept (a `.fst` file streams when
    /// `stream`: its events stay in the file); else the kept trace is shared (read now, with
    /// stack frames when `frames`, if it is not kept yet).
    #[allow(clippy::too_many_arguments)]
    pub fn session(
        &self,
        name: &str,
        device: Option<i32>,
        frames: bool,
        once: bool,
        stream: bool,
        max_input_bytes: Option<u64>,
        cancel: &fragsim::replay::Cancel,
    ) -> fragsim::error::Result<Session> {
        if let (true, true, Source::Path(path)) = (once, stream, &*self.source) {
            if let Some(file) = FstStream::open(path)? {
                return Session::streamed(file, name, device);
            }
        }
        let trace = self.trace(name, once, frames, max_input_bytes, cancel)?;
        Session::of_trace(trace, name, device)
    }

    /// The trace itself, with stack frames when `frames`: from its file when read `once` (a
    /// path given to a function), else the kept one, shared.
    pub fn trace(
        &self,
        name: &str,
        once: bool,
        frames: bool,
        max_input_bytes: Option<u64>,
        cancel: &fragsim::replay::Cancel,
    ) -> fragsim::error::Result<Arc<Trace>> {
        let read = ReadOptions {
            keep_frames: frames,
            progress: false,
            max_input_bytes,
            cancel: cancel.clone(),
        };
        if let (true, Source::Path(path)) = (once, &*self.source) {
            return fragsim::trace::read_trace(path, &read).map(Arc::new);
        }
        (self.reader())(&read).map_err(|e| e.in_file(std::path::Path::new(name)))
    }

    /// Whether a session may stream the trace: it is a `.fst` file given by path.
    pub fn streams(&self) -> fragsim::error::Result<bool> {
        match &*self.source {
            Source::Path(path) => Ok(FstStream::open(path)?.is_some()),
            _ => Ok(false),
        }
    }

    /// The reader commands ask for the trace: the kept trace of that kind, else a read.
    pub fn reader(&self) -> SharedReader {
        let (source, kept, names) = (self.source.clone(), self.kept.clone(), self.names.clone());
        Arc::new(move |options: &ReadOptions| -> fragsim::error::Result<Arc<Trace>> {
            let slot = usize::from(options.keep_frames);
            // The lock is held while reading: two commands on one trace read it once.
            let mut kept =
                kept.lock().map_err(|_| Error::input("a command on this trace failed"))?;
            if let Some(trace) = &kept.traces[slot] {
                return Ok(trace.clone());
            }
            let trace = match &*source {
                Source::Path(p) => fragsim::trace::read_trace(p, options)?,
                Source::Bytes(data) => fragsim::trace::read_memory(data, options)?,
                Source::Dict(obj) => {
                    let obj = Python::with_gil(|py| obj.clone_ref(py));
                    snapshot_dict::read(obj, options, &names)?
                }
            };
            let trace = Arc::new(trace);
            kept.traces[slot] = Some(trace.clone());
            Ok(trace)
        })
    }
}
