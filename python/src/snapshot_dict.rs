//! The dict `torch.cuda.memory._snapshot()` returns (or `pickle.load` of a dumped snapshot
//! gives), turned into the decoded form of its pickle file
//! ([`fragsim::trace::pickle::objects::Builder`]) without pickling it: the snapshot reader then
//! converts it with the checks and limits a file gets.
//!
//! Objects are walked with an explicit stack (a hostile nesting depth cannot overflow the call
//! stack), each container and string once, however often it is referred to (PyTorch shares
//! frame lists between entries; sharing is kept, as the pickle memo keeps it, and a container
//! that holds itself stays a cycle). What the dict holds is counted against the input limit a
//! file has. Every container keeps how it was reached, so an error names its key path:
//! `segments[3].blocks[0]`.

use fragsim::error::Error;
use fragsim::trace::pickle::objects::{Builder, Seq};
use fragsim::trace::pickle::{Pickle, Value};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString,
    PyTuple,
};
use std::collections::HashMap;
use std::ffi::OsString;

/// How a container was reached from its parent.
#[derive(Clone, Debug)]
enum Step {
    /// The root object.
    Root,
    /// The value of a dict key (as the builder holds it).
    Key(Value),
    /// Item `i` of a sequence.
    Index(usize),
}

/// The key path of every container of a converted dict, by container number.
pub struct Names {
    steps: Vec<(u64, Step)>,
    keys: HashMap<u32, String>,
}

impl Names {
    /// The key path of container `n` (`segments[3].blocks[0]`; the root is `(the dict)`).
    pub fn path(&self, n: u64) -> Option<String> {
        let mut parts = Vec::new();
        let mut at = n;
        for _ in 0..self.steps.len() {
            let (parent, step) = self.steps.get(at as usize)?;
            match step {
                Step::Root => break,
                Step::Index(i) => parts.push(format!("[{i}]")),
                Step::Key(k) => parts.push(self.key(*k)),
            }
            at = *parent;
        }
        if parts.is_empty() {
            return Some("(the dict)".into());
        }
        parts.reverse();
        let mut path = parts.concat();
        if let Some(rest) = path.strip_prefix('.') {
            path = rest.to_string();
        }
        Some(path)
    }

    fn key(&self, k: Value) -> String {
        match k {
            Value::Str(i) => match self.keys.get(&i) {
                Some(s) if !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                    format!(".{s}")
                }
                Some(s) => format!("[{s:?}]"),
                None => "[?]".into(),
            },
            Value::Int(n) => format!("[{n}]"),
            other => format!("[{}]", other.type_name()),
        }
    }
}

/// Splits " (pickle byte N)" off a snapshot reader's message: the message without it, and N.
pub fn strip_byte(message: &str) -> (String, Option<u64>) {
    const MARK: &str = " (pickle byte ";
    if let Some(start) = message.rfind(MARK) {
        let rest = &message[start + MARK.len()..];
        if let Some(end) = rest.find(')') {
            if let Ok(n) = rest[..end].parse() {
                let mut text = message[..start].to_string();
                text.push_str(&rest[end + 1..]);
                return (text, Some(n));
            }
        }
    }
    (message.to_string(), None)
}

/// The input limit a command line sets (`--max-input-size`, else `FRAGSIM_MAX_INPUT_SIZE`,
/// else the default); a malformed one is left to the command to report.
pub fn cap(argv: &[OsString]) -> u64 {
    let given = argv
        .iter()
        .position(|a| a == "--max-input-size")
        .and_then(|i| argv.get(i + 1))
        .and_then(|v| v.to_str())
        .or_else(|| {
            argv.iter().find_map(|a| a.to_str().and_then(|a| a.strip_prefix("--max-input-size=")))
        })
        .and_then(|v| fragsim::units::parse_size(v).ok());
    let options = fragsim::trace::ReadOptions { max_input_bytes: given, ..Default::default() };
    options.input_cap().unwrap_or(fragsim::trace::limits::DEFAULT_MAX_INPUT_BYTES)
}

/// What one container still has to walk.
struct Frame<'py> {
    value: Value,
    number: u64,
    children: Children<'py>,
    next: usize,
    items: Vec<Value>,
    entries: Vec<(Value, Value)>,
}

enum Children<'py> {
    Seq(Vec<Bound<'py, PyAny>>),
    Dict(Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>),
}

struct Walk {
    b: Builder,
    /// Strings and containers already converted, by object identity.
    memo: HashMap<usize, Value>,
    steps: Vec<(u64, Step)>,
    keys: HashMap<u32, String>,
    /// Bytes the converted objects take, against `cap`.
    held: u64,
    cap: u64,
}

/// Bytes counted for one value or container item (a [`Value`] is 16 bytes).
const PER_VALUE: u64 = 16;

impl Walk {
    fn charge(&mut self, bytes: u64) -> Result<(), Error> {
        self.held = self.held.saturating_add(bytes);
        if self.held > self.cap {
            return Err(Error::input(format!(
                "the dict holds more than the input limit of {} bytes (raise it with \
                 max_input_size or FRAGSIM_MAX_INPUT_SIZE)",
                self.cap
            )));
        }
        Ok(())
    }

    fn path_of(&self, parent: u64, step: &Step) -> String {
        let names = Names { steps: self.steps.clone(), keys: self.keys.clone() };
        let base = names.path(parent).unwrap_or_default();
        let base = if base == "(the dict)" { String::new() } else { base };
        let tail = match step {
            Step::Root => String::new(),
            Step::Index(i) => format!("[{i}]"),
            Step::Key(k) => names.key(*k),
        };
        let path = format!("{base}{tail}");
        path.strip_prefix('.').map(str::to_string).unwrap_or(path)
    }

    /// Converts `obj`, reached from container `parent` by `step`: a scalar at once, a container
    /// begun (and returned as a frame to fill) unless already converted.
    fn value<'py>(
        &mut self,
        obj: &Bound<'py, PyAny>,
        parent: u64,
        step: Step,
    ) -> Result<(Value, Option<Frame<'py>>), Error> {
        if obj.is_none() {
            return Ok((Value::None, None));
        }
        if let Ok(b) = obj.downcast::<PyBool>() {
            return Ok((Value::Bool(b.is_true()), None));
        }
        if let Ok(i) = obj.downcast::<PyInt>() {
            let v = match i.extract::<i64>() {
                Ok(n) => Value::Int(n),
                Err(_) => match i.extract::<i128>() {
                    Ok(n) => self.b.int(n),
                    Err(_) => Value::HugeInt,
                },
            };
            return Ok((v, None));
        }
        if let Ok(f) = obj.downcast::<PyFloat>() {
            return Ok((Value::Float(f.value()), None));
        }
        let id = obj.as_ptr() as usize;
        if let Some(&v) = self.memo.get(&id) {
            return Ok((v, None));
        }
        if let Ok(s) = obj.downcast::<PyString>() {
            let v = match s.to_cow() {
                Ok(text) => {
                    self.charge(text.len() as u64 + PER_VALUE)?;
                    self.b.str(text.as_bytes())
                }
                // Lone surrogates: kept as Python's `surrogatepass` writes them, as in a pickle.
                Err(_) => {
                    let raw = s
                        .call_method1("encode", ("utf-8", "surrogatepass"))
                        .and_then(|b| Ok(b.downcast_into::<PyBytes>()?.as_bytes().to_vec()))
                        .unwrap_or_default();
                    self.charge(raw.len() as u64 + PER_VALUE)?;
                    self.b.str(&raw)
                }
            };
            self.memo.insert(id, v);
            return Ok((v, None));
        }
        if let Ok(b) = obj.downcast::<PyBytes>() {
            self.charge(b.as_bytes().len() as u64 + PER_VALUE)?;
            let v = self.b.bytes(b.as_bytes());
            self.memo.insert(id, v);
            return Ok((v, None));
        }
        if let Ok(b) = obj.downcast::<PyByteArray>() {
            let data = b.to_vec();
            self.charge(data.len() as u64 + PER_VALUE)?;
            let v = self.b.bytes(&data);
            self.memo.insert(id, v);
            return Ok((v, None));
        }
        let children = if let Ok(d) = obj.downcast::<PyDict>() {
            Children::Dict(d.iter().collect())
        } else if let Ok(l) = obj.downcast::<PyList>() {
            Children::Seq(l.iter().collect())
        } else if let Ok(t) = obj.downcast::<PyTuple>() {
            Children::Seq(t.iter().collect())
        } else if let Ok(s) = obj.downcast::<PySet>() {
            Children::Seq(s.iter().collect())
        } else if let Ok(s) = obj.downcast::<PyFrozenSet>() {
            Children::Seq(s.iter().collect())
        } else {
            let type_name =
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into());
            let path = self.path_of(parent, &step);
            let at = if path.is_empty() { "the object".to_string() } else { path };
            return Err(Error::input(format!(
                "{at}: expected a dict, list, tuple, str, int, float, bool, bytes or None, got \
                 {type_name} (a memory snapshot holds plain data only)"
            )));
        };
        let n = match &children {
            Children::Seq(items) => items.len(),
            Children::Dict(entries) => 2 * entries.len(),
        };
        self.charge((n as u64 + 1) * PER_VALUE)?;
        let value = match &children {
            Children::Dict(_) => self.b.begin_dict(),
            Children::Seq(_) if obj.is_instance_of::<PyList>() => self.b.begin_seq(Seq::List),
            Children::Seq(_) if obj.is_instance_of::<PyTuple>() => self.b.begin_seq(Seq::Tuple),
            Children::Seq(_) => self.b.begin_seq(Seq::Set),
        };
        let number = self.b.containers() - 1;
        self.steps.push((parent, step));
        self.memo.insert(id, value);
        let frame =
            Frame { value, number, children, next: 0, items: Vec::new(), entries: Vec::new() };
        Ok((value, Some(frame)))
    }

    /// Converts `obj` and everything it holds.
    fn run(mut self, obj: &Bound<'_, PyAny>) -> Result<(Pickle<'static>, Names), Error> {
        let (root, first) = self.value(obj, 0, Step::Root)?;
        let mut stack: Vec<Frame> = first.into_iter().collect();
        while let Some(top) = stack.last_mut() {
            let number = top.number;
            let child = match &top.children {
                Children::Seq(items) => items.get(top.next).map(|x| (None, x.clone())),
                Children::Dict(entries) => {
                    entries.get(top.next).map(|(k, x)| (Some(k.clone()), x.clone()))
                }
            };
            let index = top.next;
            top.next += 1;
            let Some((key, obj)) = child else {
                let done = stack.pop().expect("a frame is on the stack");
                self.b.extend_seq(done.value, &done.items);
                self.b.extend_dict(done.value, &done.entries);
                continue;
            };
            let (step, key_value) = match key {
                None => (Step::Index(index), None),
                Some(k) => {
                    let (kv, frame) = self.value(&k, number, Step::Index(index))?;
                    if frame.is_some() {
                        let path = self.path_of(number, &Step::Index(index));
                        return Err(Error::input(format!(
                            "{path}: a dict key that is a container, which a memory snapshot \
                             never holds"
                        )));
                    }
                    (Step::Key(kv), Some((kv, k)))
                }
            };
            let (v, frame) = self.value(&obj, number, step)?;
            // A container's key names it in paths; keys of scalars are never needed.
            if let (Some(_), Some((Value::Str(i), k))) = (&frame, &key_value) {
                if let Ok(s) = k.downcast::<PyString>() {
                    self.keys.entry(*i).or_insert_with(|| s.to_string());
                }
            }
            let key_value = key_value.map(|(kv, _)| kv);
            let top = stack.last_mut().expect("the frame just read");
            match key_value {
                Some(k) => top.entries.push((k, v)),
                None => top.items.push(v),
            }
            if let Some(f) = frame {
                stack.push(f);
            }
        }
        let names = Names { steps: self.steps, keys: self.keys };
        Ok((self.b.finish(root), names))
    }
}

/// Converts a snapshot dict (or the list of a legacy `memory_snapshot()`) into the decoded
/// form of its pickle, holding at most `cap` bytes; errors name the key path.
pub fn convert(obj: &Bound<'_, PyAny>, cap: u64) -> Result<(Pickle<'static>, Names), Error> {
    let walk = Walk {
        b: Builder::new(),
        memo: HashMap::new(),
        steps: Vec::new(),
        keys: HashMap::new(),
        held: 0,
        cap,
    };
    walk.run(obj).map_err(|e| e.in_format("pytorch-snapshot"))
}

/// Seconds to turn a snapshot dict into a trace ([`convert`], then the snapshot reader), or, for
/// a path, to read the file; for the comparison the test suite prints.
#[pyfunction]
pub fn convert_only(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    let options = fragsim::trace::ReadOptions::default();
    let start = std::time::Instant::now();
    let read = if let Ok(path) = obj.extract::<std::path::PathBuf>() {
        py.allow_threads(|| fragsim::trace::read_trace(&path, &options))
    } else {
        let cap = options.input_cap().unwrap_or(u64::MAX);
        match convert(obj, cap) {
            Ok((p, _)) => py.allow_threads(|| fragsim::trace::snapshot::read_decoded(&p, &options)),
            Err(e) => Err(e),
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    read.map(|_| seconds).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}
