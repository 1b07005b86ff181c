//! The dict `torch.cuda.memory._snapshot()` returns (or `pickle.load` of a dumped snapshot
//! gives), read as its pickle file is read, without pickling it: turned into the decoded form
//! of the file ([`fragsim::trace::pickle::objects::Builder`]) for the snapshot reader, with the
//! checks and limits a file gets. As a file's stream does, each device's trace entries go to
//! the reader [`BATCH`] at a time ([`EntryStream`]) and are then dropped, what was remembered of
//! them becoming what the reader kept (a frame list's stack, a frame); where a later object
//! refers back to a dropped entry (PyTorch's dicts never do), the dict is converted whole, then
//! read ([`read_dict`]).
//!
//! Objects are walked with an explicit stack (a hostile nesting depth cannot overflow the call
//! stack), each container and string once, however often it is referred to (PyTorch shares
//! frame lists between entries; sharing is kept, as the pickle memo keeps it, and a container
//! that holds itself stays a cycle). What the dict holds is counted against the input limit a
//! file has. Every container keeps how it was reached, so an error names its key path:
//! `segments[3].blocks[0]`.
//!
//! Where the command keeps no stack frames, `frames` values are left out unwalked, except those
//! the reader reads anyway ([`Walk::frames_read`]: a release's, one telling a private pool's
//! kind, and a torch_npu one): the reader would not look at the others (a file's are decoded,
//! then ignored), and they are most of the objects (each entry's list of shared frame dicts).
//!
//! Memos keep the walk as fast as reading the snapshot's pickle file (`scripts/dict-speed.py`
//! and the test suite print both): where PyTorch gives each entry a new `frames` list holding
//! the same shared frame dicts as an earlier one (in `cs336-lm-step-a`, 12,976 lists of 727,227
//! items name only 650 frame dicts), the list becomes that earlier list's value, found by the
//! identities of its items, without visiting them; the reader then knows its stack by the
//! list's number too. A `str` equal to one converted before (PyTorch makes a new `'N/A'` value
//! for each entry) takes that one's value, found by its hash and one comparison, without
//! encoding it. Containers and strings seen before are found by address (the last ones met
//! by address bits first, with no hashing), and only those that more than one reference holds
//! are remembered (an entry's own dict is reached once).

use fragsim::error::{Cancel, Error};
use fragsim::trace::pickle::objects::{Builder, Mark, Seq};
use fragsim::trace::pickle::{Pickle, Stop, Value};
use fragsim::trace::snapshot::EntryStream;
use fragsim::trace::{AddrHasher, ReadOptions};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyFloat, PyFrozenSet, PyInt, PySet, PyString};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Mutex;

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

/// The key path of every container of a converted dict still held, by container number.
pub struct Names {
    steps: Vec<(u64, u64, Step)>,
    keys: HashMap<u32, String>,
}

impl Names {
    /// The key path of container `n` (`segments[3].blocks[0]`; the root is `(the dict)`).
    pub fn path(&self, n: u64) -> Option<String> {
        let mut parts = Vec::new();
        let mut at = n;
        for _ in 0..self.steps.len() {
            let (_, parent, step) =
                self.steps.get(self.steps.binary_search_by_key(&at, |s| s.0).ok()?)?;
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

/// Where a container's walk stands. Items are borrowed from the container (the caller's
/// object keeps them alive, and no Python code runs while the walk holds the GIL), except a
/// set's, which are copied out first. A list's or tuple's `len` is its length when begun (an
/// item past a shrunk end reads as null, an error).
enum Cursor {
    Dict { pos: ffi::Py_ssize_t },
    List { next: ffi::Py_ssize_t, len: ffi::Py_ssize_t },
    Tuple { next: ffi::Py_ssize_t, len: ffi::Py_ssize_t },
    Owned { items: Vec<Py<PyAny>>, next: usize },
}

/// One container being walked: its object, its value, its number, and where its converted
/// items start on the walk's scratch stacks.
struct Frame {
    obj: *mut ffi::PyObject,
    value: Value,
    number: u64,
    cursor: Cursor,
    start: usize,
    role: Role,
}

/// What a container is to a streamed read ([`Walk::stream`]).
#[derive(Clone, Copy)]
enum Role {
    Other,
    /// The root's `device_traces` list.
    Traces,
    /// Item `index` of `within` (the `device_traces` list): its entries go to the reader a
    /// batch at a time. `mark` is the builder's state before the batch, `base` the number of
    /// entries handed over before it.
    Device {
        index: usize,
        within: Value,
        mark: Mark,
        base: usize,
    },
}

/// The trace entries handed to the reader at a time: as many as a file's stream holds.
const BATCH: usize = 1000;

/// The walk: the builder, the objects converted so far, and each container's way in.
struct Walk<'py> {
    py: Python<'py>,
    b: Builder,
    /// Strings and containers already converted, by object address.
    memo: HashMap<u64, Value, BuildHasherDefault<AddrHasher>>,
    /// The memo's strings found last, by address bits: the few objects met in every entry (its
    /// keys, its action, an empty string) are found here without hashing.
    hot: Box<[(usize, Value)]>,
    /// Strings already converted, by their Python hash: the first object with that hash (alive
    /// as long as the root is) and its value.
    strs: HashMap<u64, (usize, Value), BuildHasherDefault<AddrHasher>>,
    /// `frames` lists already converted, by their type's address and the addresses of their
    /// items.
    lists: HashMap<Box<[usize]>, Value, BuildHasherDefault<SeqHasher>>,
    /// The addresses of the items of the `frames` list being looked up.
    scratch: Vec<usize>,
    /// The string numbers of the `'frames'` strings converted (one, unless hashes collide).
    frames_keys: Vec<u32>,
    /// The string numbers of the `'action'` strings, and of the `'segment_free'` and
    /// `'segment_unmap'` ones, converted.
    action_keys: Vec<u32>,
    releases: Vec<u32>,
    /// How each container still held was reached: its number, its parent's, and the step
    /// (numbers only grow; a batch of dropped entries leaves a gap).
    steps: Vec<(u64, u64, Step)>,
    keys: HashMap<u32, String>,
    /// Bytes the converted objects take, against `cap`.
    held: u64,
    cap: u64,
    /// Leave out the `frames` values the reader, not keeping frames, would not look at.
    skip_frames: bool,
    /// What each frame dict looked at tells ([`FrameMarks`]), by address.
    looked: HashMap<usize, FrameMarks, BuildHasherDefault<AddrHasher>>,
    /// The frame dicts looked at last and what they tell, by address bits: PyTorch shares each
    /// frame dict between the stacks that hold it, so most items of an entry's `frames` are
    /// found here, with no hashing.
    recent_frames: Box<[(usize, FrameMarks)]>,
    /// A stack naming a torch_npu file was kept: no other needs looking at.
    npu_found: bool,
    /// The keys `'action'`, `'filename'` and `'name'`, as Python strings.
    action_key: Py<PyString>,
    filename_key: Py<PyString>,
    name_key: Py<PyString>,
    /// Converted items and entries of the containers on the stack, innermost last.
    items: Vec<Value>,
    entries: Vec<(Value, Value)>,
    /// Where trace entries go a batch at a time, when the read is streamed (then dropped from
    /// the builder, as a file's stream drops them).
    stream: Option<EntryStream>,
    /// The command's cancel flag (raised on Ctrl-C), looked at after each batch of a streamed
    /// read.
    cancel: Cancel,
    /// The objects remembered as containers since the last batch, and the `frames` sequences
    /// remembered since then: what the batch's end looks at.
    recent: Vec<u64>,
    recent_lists: Vec<Box<[usize]>>,
    /// The reader could not take the entries streamed (a later object needs a dropped one):
    /// the dict is read whole instead.
    refused: bool,
}

/// The slots of [`Walk::hot`] and [`Walk::recent_frames`] (a power of two).
const RECENT: usize = 1 << 12;

/// The slot of `p` in [`Walk::hot`] or [`Walk::recent_frames`]: Python objects are 16-byte aligned.
#[inline(always)]
fn slot(p: usize) -> usize {
    (p >> 4) & (RECENT - 1)
}

/// Bytes counted for one value or container item (a [`Value`] is 16 bytes).
const PER_VALUE: u64 = 16;

/// A converted object: a value, or a container begun whose items are still to walk.
enum Converted {
    Done(Value),
    Begun(Frame),
}

impl<'py> Walk<'py> {
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
            // A scalar's key is not in `keys` (only containers' are): the builder has it.
            Step::Key(k) => match self.b.str_bytes(*k).map(String::from_utf8_lossy) {
                Some(s) if !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                    format!(".{s}")
                }
                Some(s) => format!("[{s:?}]"),
                None => names.key(*k),
            },
        };
        let path = format!("{base}{tail}");
        path.strip_prefix('.').map(str::to_string).unwrap_or(path)
    }

    /// The value of `p` when it needs no conversion of its own: `None`, a 64-bit `int`, a
    /// `bool`, a `float`, or an object converted before. Most objects of a snapshot are one of
    /// these, and this path returns no [`Result`] (moving one costs more than the check).
    ///
    /// # Safety
    /// `p` is a live object and the GIL is held.
    #[inline(always)]
    unsafe fn quick(&mut self, p: *mut ffi::PyObject) -> Option<Value> {
        use std::ptr::addr_of_mut;
        let ty = ffi::Py_TYPE(p);
        if ty == addr_of_mut!(ffi::PyLong_Type) {
            return small_int(p).map(Value::Int);
        }
        if p == ffi::Py_None() {
            return Some(Value::None);
        }
        if ty == addr_of_mut!(ffi::PyBool_Type) {
            return Some(Value::Bool(p == ffi::Py_True()));
        }
        if ty == addr_of_mut!(ffi::PyFloat_Type) {
            return Some(Value::Float(ffi::PyFloat_AsDouble(p)));
        }
        if ffi::Py_REFCNT(p) == 1 {
            // Held by the one container that led here: it was not seen before, nor will be.
            return None;
        }
        // An address keeps its value for the whole walk (the root keeps every object alive).
        let hot = slot(p as usize);
        if self.hot[hot].0 == p as usize {
            return Some(self.hot[hot].1);
        }
        let v = self.memo.get(&(p as u64)).copied()?;
        if !container(v) {
            // Containers stay out: a batch's end would have to look for those it drops.
            self.hot[hot] = (p as usize, v);
        }
        Some(v)
    }

    /// Remembers that `p` became `v` where another reference holds it (`shared`: read before
    /// the conversion took references of its own). An object only its one container holds is
    /// reached once, so it is not remembered.
    #[inline(always)]
    fn remember(&mut self, p: *mut ffi::PyObject, v: Value, shared: bool) {
        if shared {
            self.memo.insert(p as u64, v);
            if self.stream.is_some() && container(v) {
                self.recent.push(p as u64);
            }
        }
    }

    /// Converts the object `p` (borrowed), reached from container `parent` by `step`: a scalar
    /// at once, a container begun unless it was converted before.
    ///
    /// # Safety
    /// `p` is a live object and the GIL is held.
    unsafe fn convert(
        &mut self,
        p: *mut ffi::PyObject,
        parent: u64,
        step: Step,
    ) -> Result<Converted, Error> {
        use std::ptr::addr_of_mut;
        if let Some(v) = self.quick(p) {
            return Ok(Converted::Done(v));
        }
        // Read before anything below takes a reference of its own (a `Bound` does): counted
        // after, every object would look shared, and each be remembered.
        let shared = ffi::Py_REFCNT(p) != 1;
        let ty = ffi::Py_TYPE(p);
        if ty == addr_of_mut!(ffi::PyLong_Type) {
            return Ok(Converted::Done(self.wide_int(p)));
        }
        if ty == addr_of_mut!(ffi::PyUnicode_Type) {
            let v = self.string(p)?;
            self.remember(p, v, shared);
            return Ok(Converted::Done(v));
        }
        let container = if ty == addr_of_mut!(ffi::PyDict_Type) || ffi::PyDict_Check(p) != 0 {
            Some((self.b.begin_dict(), Cursor::Dict { pos: 0 }, ffi::PyDict_Size(p)))
        } else if ty == addr_of_mut!(ffi::PyList_Type) || ffi::PyList_Check(p) != 0 {
            let len = ffi::PyList_Size(p);
            Some((self.b.begin_seq(Seq::List), Cursor::List { next: 0, len }, len))
        } else if ty == addr_of_mut!(ffi::PyTuple_Type) || ffi::PyTuple_Check(p) != 0 {
            let len = ffi::PyTuple_Size(p);
            Some((self.b.begin_seq(Seq::Tuple), Cursor::Tuple { next: 0, len }, len))
        } else {
            None
        };
        if let Some((value, cursor, len)) = container {
            self.charge((len.max(0) as u64 * 2 + 1) * PER_VALUE)?;
            return Ok(Converted::Begun(self.begin(p, value, cursor, parent, step, shared)));
        }
        let obj = Bound::from_borrowed_ptr(self.py, p);
        let v = if obj.downcast::<PyString>().is_ok() {
            self.string(p)?
        } else if let Ok(b) = obj.downcast::<PyBytes>() {
            self.charge(b.as_bytes().len() as u64 + PER_VALUE)?;
            self.b.bytes(b.as_bytes())
        } else if let Ok(b) = obj.downcast::<PyByteArray>() {
            let data = b.to_vec();
            self.charge(data.len() as u64 + PER_VALUE)?;
            self.b.bytes(&data)
        } else if obj.is_instance_of::<PyInt>() {
            return Ok(Converted::Done(self.wide_int(p)));
        } else if let Ok(f) = obj.downcast::<PyFloat>() {
            return Ok(Converted::Done(Value::Float(f.value())));
        } else if obj.is_instance_of::<PySet>() || obj.is_instance_of::<PyFrozenSet>() {
            let items: Vec<Py<PyAny>> = match obj.try_iter() {
                Ok(it) => it.filter_map(|x| x.ok()).map(|x| x.unbind()).collect(),
                Err(_) => Vec::new(),
            };
            self.charge((items.len() as u64 + 1) * PER_VALUE)?;
            let value = self.b.begin_seq(Seq::Set);
            let cursor = Cursor::Owned { items, next: 0 };
            return Ok(Converted::Begun(self.begin(p, value, cursor, parent, step, shared)));
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
        self.remember(p, v, shared);
        Ok(Converted::Done(v))
    }

    /// The value of the `str` `p`: that of an equal string converted before (same hash,
    /// and equal), else a new one. The first string of each hash is kept for later ones to
    /// compare with; a second, different string of the same hash is converted on its own.
    ///
    /// # Safety
    /// `p` is a live `str` that the root keeps alive, and the GIL is held.
    unsafe fn string(&mut self, p: *mut ffi::PyObject) -> Result<Value, Error> {
        let hash = ffi::PyObject_Hash(p);
        if hash == -1 {
            ffi::PyErr_Clear();
        } else if let Some(&(first, v)) = self.strs.get(&(hash as u64)) {
            if ffi::PyUnicode_Compare(p, first as *mut ffi::PyObject) == 0 {
                return Ok(v);
            }
        }
        let obj = Bound::from_borrowed_ptr(self.py, p);
        let s = obj.downcast_unchecked::<PyString>();
        let v = match s.encode_utf8() {
            Ok(b) => {
                let raw = b.as_bytes();
                self.charge(raw.len() as u64 + PER_VALUE)?;
                self.b.str(raw)
            }
            Err(_) => {
                // Lone surrogates, kept as Python's `surrogatepass` writes them, as in a pickle.
                let raw = surrogatepass(s);
                self.charge(raw.len() as u64 + PER_VALUE)?;
                self.b.str(&raw)
            }
        };
        match (v, self.b.str_bytes(v)) {
            (Value::Str(i), Some(b"frames")) => self.frames_keys.push(i),
            (Value::Str(i), Some(b"action")) => self.action_keys.push(i),
            (Value::Str(i), Some(b"segment_free" | b"segment_unmap")) => self.releases.push(i),
            _ => {}
        }
        if hash != -1 {
            self.strs.entry(hash as u64).or_insert((p as usize, v));
        }
        Ok(v)
    }

    /// The value of a `frames` list (or tuple) `p` not seen before by address that holds the
    /// very objects an earlier one held, in order: that list's value. Otherwise `None`, and the
    /// addresses stay in `scratch` for [`Walk::remember_list`].
    ///
    /// # Safety
    /// `p` is a live object and the GIL is held.
    unsafe fn same_list(&mut self, p: *mut ffi::PyObject) -> Option<Value> {
        use std::ptr::addr_of_mut;
        self.scratch.clear();
        let ty = ffi::Py_TYPE(p);
        // The type first: a tuple holding the same objects as a list stays a tuple.
        self.scratch.push(ty as usize);
        if ty == addr_of_mut!(ffi::PyList_Type) {
            for i in 0..ffi::PyList_Size(p) {
                self.scratch.push(ffi::PyList_GetItem(p, i) as usize);
            }
        } else if ty == addr_of_mut!(ffi::PyTuple_Type) {
            for i in 0..ffi::PyTuple_Size(p) {
                self.scratch.push(ffi::PyTuple_GetItem(p, i) as usize);
            }
        } else {
            self.scratch.clear();
            return None;
        }
        if self.scratch.contains(&0) {
            ffi::PyErr_Clear();
            self.scratch.clear();
            return None;
        }
        self.lists.get(&self.scratch[..]).copied()
    }

    /// Remembers that the `frames` list whose item addresses [`Walk::same_list`] left in
    /// `scratch` became `v` (the items are converted by identity, so any list holding the same
    /// objects becomes the same value).
    fn remember_list(&mut self, v: Value) {
        if !self.scratch.is_empty() && !self.lists.contains_key(self.scratch.as_slice()) {
            let key: Box<[usize]> = self.scratch.as_slice().into();
            if self.stream.is_some() {
                self.recent_lists.push(key.clone());
            }
            self.lists.insert(key, v);
        }
    }

    /// An int beyond 64 bits: its value if it fits in 128, else [`Value::HugeInt`].
    unsafe fn wide_int(&mut self, p: *mut ffi::PyObject) -> Value {
        match Bound::from_borrowed_ptr(self.py, p).extract::<i128>() {
            Ok(n) => self.b.int(n),
            Err(_) => Value::HugeInt,
        }
    }

    /// Begins the container `obj` as `value`, numbered and reached from `parent` by `step`
    /// (`shared`: held by more than that parent, so remembered).
    ///
    /// # Safety
    /// `obj` is a live object and the GIL is held.
    unsafe fn begin(
        &mut self,
        obj: *mut ffi::PyObject,
        value: Value,
        cursor: Cursor,
        parent: u64,
        step: Step,
        shared: bool,
    ) -> Frame {
        let number = self.b.containers() - 1;
        self.steps.push((number, parent, step));
        self.remember(obj, value, shared);
        let start = match cursor {
            Cursor::Dict { .. } => self.entries.len(),
            _ => self.items.len(),
        };
        Frame { obj, value, number, cursor, start, role: Role::Other }
    }

    /// A walk of `obj` holding at most `cap` bytes, with room for `items` sequence items and
    /// `entries` dict entries, its `frames` left out unless `keep_frames`; not streamed.
    fn new(
        obj: &Bound<'py, PyAny>,
        cap: u64,
        keep_frames: bool,
        (items, entries): (usize, usize),
    ) -> Walk<'py> {
        Walk {
            py: obj.py(),
            b: Builder::with_capacity(items, entries),
            memo: HashMap::default(),
            hot: vec![(0, Value::None); RECENT].into(),
            strs: HashMap::default(),
            lists: HashMap::default(),
            scratch: Vec::new(),
            frames_keys: Vec::new(),
            action_keys: Vec::new(),
            releases: Vec::new(),
            steps: Vec::new(),
            keys: HashMap::new(),
            held: 0,
            cap,
            skip_frames: !keep_frames,
            looked: Default::default(),
            recent_frames: vec![(0, FrameMarks::default()); RECENT].into(),
            npu_found: false,
            action_key: PyString::intern(obj.py(), "action").unbind(),
            filename_key: PyString::intern(obj.py(), "filename").unbind(),
            name_key: PyString::intern(obj.py(), "name").unbind(),
            items: Vec::new(),
            entries: Vec::new(),
            stream: None,
            cancel: Cancel::default(),
            recent: Vec::new(),
            recent_lists: Vec::new(),
            refused: false,
        }
    }

    /// Converts `root` and everything it holds: the root's value.
    fn walk_root(&mut self, root: &Bound<'py, PyAny>) -> Result<Value, Error> {
        // SAFETY: the GIL is held for the whole walk (`self.py`), `root` is alive, and every
        // pointer walked is borrowed from a container that `root` keeps alive; nothing here runs
        // Python code that could change them.
        unsafe {
            Ok(match self.convert(root.as_ptr(), 0, Step::Root)? {
                Converted::Done(v) => v,
                Converted::Begun(f) => {
                    let v = f.value;
                    self.walk(f)?;
                    v
                }
            })
        }
    }

    /// Converts `root` and everything it holds, whole.
    fn run(mut self, root: &Bound<'py, PyAny>) -> Result<(Pickle<'static>, Names), Error> {
        let root_value = self.walk_root(root)?;
        let names = Names { steps: self.steps, keys: self.keys };
        Ok((self.b.finish(root_value), names))
    }

    /// Walks `first` and the containers below it, with a stack of frames.
    unsafe fn walk(&mut self, first: Frame) -> Result<(), Error> {
        let mut stack = vec![first];
        while let Some(top) = stack.last_mut() {
            if matches!(top.role, Role::Device { .. }) && self.items.len() - top.start >= BATCH {
                self.flush(top)?;
            }
            let number = top.number;
            let is_list = matches!(top.cursor, Cursor::List { .. });
            let converted = match &mut top.cursor {
                Cursor::Dict { pos } => {
                    let (mut k, mut v) = (std::ptr::null_mut(), std::ptr::null_mut());
                    if ffi::PyDict_Next(top.obj, pos, &mut k, &mut v) == 0 {
                        None
                    } else {
                        let index = self.entries.len() - top.start;
                        let key = match self.quick(k) {
                            Some(key) => Converted::Done(key),
                            None => self.convert(k, number, Step::Index(index))?,
                        };
                        let key = match key {
                            Converted::Done(key) => key,
                            Converted::Begun(_) => {
                                let path = self.path_of(number, &Step::Index(index));
                                return Err(Error::input(format!(
                                    "{path}: a dict key that is a container, which a memory \
                                     snapshot never holds"
                                )));
                            }
                        };
                        let frames = matches!(key, Value::Str(i) if self.frames_keys.contains(&i));
                        let start = top.start;
                        if frames && self.skip_frames && !self.frames_read(top.obj, start, v) {
                            // The reader does not look at frames it does not keep.
                            self.entries.push((key, Value::None));
                            continue;
                        }
                        if let Some(value) = self.quick(v) {
                            self.entries.push((key, value));
                            continue;
                        }
                        if !frames {
                            self.scratch.clear();
                        } else if let Some(same) = self.same_list(v) {
                            self.entries.push((key, same));
                            continue;
                        }
                        let c = self.convert(v, number, Step::Key(key))?;
                        if let Converted::Begun(f) = &c {
                            self.remember_list(f.value);
                        }
                        if let (Converted::Begun(_), Value::Str(i)) = (&c, key) {
                            // A container's key names it in paths; scalars' keys are not kept.
                            if let Ok(s) =
                                Bound::from_borrowed_ptr(self.py, k).downcast::<PyString>()
                            {
                                self.keys.entry(i).or_insert_with(|| s.to_string());
                            }
                        }
                        let value = match &c {
                            Converted::Done(x) => *x,
                            Converted::Begun(f) => f.value,
                        };
                        self.entries.push((key, value));
                        Some(c)
                    }
                }
                Cursor::List { next, len } | Cursor::Tuple { next, len } => {
                    let base = match top.role {
                        Role::Device { base, .. } => base,
                        _ => 0,
                    };
                    let (obj, i) = (top.obj, base + self.items.len() - top.start);
                    if *next >= *len {
                        None
                    } else {
                        let item = if is_list {
                            ffi::PyList_GetItem(obj, *next)
                        } else {
                            ffi::PyTuple_GetItem(obj, *next)
                        };
                        *next += 1;
                        if !item.is_null() {
                            if let Some(v) = self.quick(item) {
                                self.items.push(v);
                                continue;
                            }
                        }
                        Some(self.item(item, number, i)?)
                    }
                }
                Cursor::Owned { items, next } => match items.get(*next) {
                    None => None,
                    Some(item) => {
                        let item = item.as_ptr();
                        *next += 1;
                        let i = self.items.len() - top.start;
                        Some(self.item(item, number, i)?)
                    }
                },
            };
            match converted {
                Some(Converted::Begun(mut frame)) => {
                    // Its items start after the entry or item that refers to it.
                    frame.start = match frame.cursor {
                        Cursor::Dict { .. } => self.entries.len(),
                        _ => self.items.len(),
                    };
                    if let Some(parent) = stack.last() {
                        frame.role = self.role(parent, &frame);
                    }
                    stack.push(frame)
                }
                Some(Converted::Done(_)) => {}
                None => {
                    if let Some(top) = stack.last_mut() {
                        self.flush(top)?;
                    }
                    let done = stack.pop().expect("a frame is on the stack");
                    if let Cursor::Dict { .. } = done.cursor {
                        self.b.extend_dict(done.value, &self.entries[done.start..]);
                        self.entries.truncate(done.start);
                    } else {
                        self.b.extend_seq(done.value, &self.items[done.start..]);
                        self.items.truncate(done.start);
                    }
                }
            }
        }
        Ok(())
    }

    /// What the container `frame`, just begun as an item of `parent`, is to a streamed read.
    fn role(&self, parent: &Frame, frame: &Frame) -> Role {
        if self.stream.is_none() || !matches!(frame.cursor, Cursor::List { .. }) {
            return Role::Other;
        }
        match parent.role {
            Role::Other if parent.number == 0 && matches!(parent.cursor, Cursor::Dict { .. }) => {
                let key = self.entries.last().map(|&(k, _)| k);
                if key.and_then(|k| self.b.str_bytes(k)) == Some(b"device_traces") {
                    Role::Traces
                } else {
                    Role::Other
                }
            }
            Role::Traces => Role::Device {
                index: self.items.len() - parent.start - 1,
                within: parent.value,
                mark: self.b.mark(),
                base: 0,
            },
            _ => Role::Other,
        }
    }

    /// Hands the entries of `top` converted so far to the reader, when it is a device's list
    /// of a streamed read, and drops them: what was remembered of them becomes what the reader
    /// keeps of it (a frame list's stack, a frame) for later references.
    fn flush(&mut self, top: &mut Frame) -> Result<(), Error> {
        let (Role::Device { index, within, mark, base }, Some(stream)) =
            (&mut top.role, self.stream.as_mut())
        else {
            return Ok(());
        };
        let p = self.b.pickle();
        let items = &self.items[top.start..];
        // The batch is Rust data now: the reader needs no Python object for it, so the GIL is
        // let go meanwhile, and a thread waiting for it (the caller's, looking for Ctrl-C)
        // takes it here rather than after the whole dict.
        let list = (*index, top.value, *within);
        if let Err(stop) = self.py.allow_threads(|| stream.entries(p, list, items)) {
            return Err(match stop {
                Stop::Error(e) => e,
                Stop::Refused { why, .. } => {
                    self.refused = true;
                    Error::input(why)
                }
            });
        }
        for key in self.recent.drain(..) {
            if let Some(v) = self.memo.get_mut(&key) {
                if mark.owns(*v) {
                    *v = stream.keep(p, *v);
                }
            }
        }
        for key in self.recent_lists.drain(..) {
            if let Some(v) = self.lists.get_mut(&key) {
                if mark.owns(*v) {
                    *v = stream.keep(p, *v);
                }
            }
        }
        *base += items.len();
        self.items.truncate(top.start);
        self.b.rollback(*mark);
        // The dropped containers' key paths go with them (their numbers are not taken again:
        // they stand where a file has byte offsets, which the frame budget reads).
        let held = self.steps.partition_point(|s| s.0 < mark.number());
        self.steps.truncate(held);
        let (seqs, dicts) = mark.containers();
        stream.discarded(seqs, dicts);
        *mark = self.b.mark();
        self.cancel.check(|| "reading a snapshot dict")
    }

    /// Whether the snapshot reader looks at the `frames` value `frames` of the dict `owner`
    /// even when it keeps no stack frames, as it does for a file: a release of cached memory
    /// (`segment_free`, `segment_unmap`), whose stack tells an `empty_cache()` call from a
    /// malloc's out-of-memory flush, a stack telling a private pool's kind
    /// ([`fragsim::trace::tells_pool_kind`]), and the first stack naming a torch_npu file (the
    /// recording's allocator). Leaving these out made a dict's flush counts, pools and
    /// `frame_lists` differ from its file's.
    ///
    /// # Safety
    /// `owner` and `frames` are live objects and the GIL is held.
    unsafe fn frames_read(
        &mut self,
        owner: *mut ffi::PyObject,
        start: usize,
        frames: *mut ffi::PyObject,
    ) -> bool {
        // The entry's action, converted already where it comes before `frames` (PyTorch's
        // order): equal strings are one value, so this is a comparison of numbers.
        let action = self.entries[start..].iter().find_map(|&(k, v)| match k {
            Value::Str(i) if self.action_keys.contains(&i) => Some(v),
            _ => None,
        });
        let release = match action {
            Some(Value::Str(i)) => self.releases.contains(&i),
            Some(_) => false,
            None => {
                // Another order: asked of the dict (with a key made once).
                let action = ffi::PyDict_GetItem(owner, self.action_key.as_ptr());
                !action.is_null()
                    && ffi::PyUnicode_Check(action) != 0
                    && [c"segment_free", c"segment_unmap"].iter().any(|name| {
                        ffi::PyUnicode_CompareWithASCIIString(action, name.as_ptr()) == 0
                    })
            }
        };
        if release {
            return true;
        }
        let ty = ffi::Py_TYPE(frames);
        let len = if ty == std::ptr::addr_of_mut!(ffi::PyList_Type) {
            ffi::PyList_Size(frames)
        } else {
            return false;
        };
        let mut marks = FrameMarks::default();
        for i in 0..len.max(0) {
            marks.0 |= self.frame_marks(ffi::PyList_GetItem(frames, i)).0;
        }
        ffi::PyErr_Clear();
        if marks.has(FrameMarks::POOL_KIND) {
            return true;
        }
        let first_npu = marks.has(FrameMarks::TORCH_NPU) && !self.npu_found;
        self.npu_found |= first_npu;
        first_npu
    }

    /// What the frame dict `f` tells, looked at once.
    ///
    /// # Safety
    /// `f` is a live object (or null) and the GIL is held.
    #[inline(always)]
    unsafe fn frame_marks(&mut self, f: *mut ffi::PyObject) -> FrameMarks {
        // Most are found among the recent ones.
        let recent = slot(f as usize);
        if self.recent_frames[recent].0 == f as usize {
            return self.recent_frames[recent].1;
        }
        if f.is_null() || ffi::PyDict_Check(f) == 0 {
            return FrameMarks::default();
        }
        let marks = match self.looked.get(&(f as usize)) {
            Some(&m) => m,
            None => {
                let text = |key: &Py<PyString>| {
                    let v = ffi::PyDict_GetItem(f, key.as_ptr());
                    if v.is_null() || ffi::PyUnicode_Check(v) == 0 {
                        return String::new();
                    }
                    let v = Bound::from_borrowed_ptr(self.py, v);
                    v.downcast::<PyString>().map_or(String::new(), |s| s.to_string_lossy().into())
                };
                let (name, filename) = (text(&self.name_key), text(&self.filename_key));
                let marks = FrameMarks::of(&name, &filename);
                self.looked.insert(f as usize, marks);
                marks
            }
        };
        self.recent_frames[recent] = (f as usize, marks);
        marks
    }

    /// Converts item `i` of container `number` and pushes its value.
    unsafe fn item(
        &mut self,
        item: *mut ffi::PyObject,
        number: u64,
        i: usize,
    ) -> Result<Converted, Error> {
        if item.is_null() {
            ffi::PyErr_Clear();
            return Err(Error::input("a container changed while it was read"));
        }
        let c = self.convert(item, number, Step::Index(i))?;
        self.items.push(match &c {
            Converted::Done(x) => *x,
            Converted::Begun(f) => f.value,
        });
        Ok(c)
    }
}

/// Whether `v` is a container.
fn container(v: Value) -> bool {
    matches!(v, Value::List(_) | Value::Tuple(_) | Value::Set(_) | Value::Dict(_))
}

/// The value of the exact `int` `p` if it fits in 64 bits (a wider one leaves no error set).
///
/// # Safety
/// `p` is a live `int` and the GIL is held.
#[inline(always)]
unsafe fn small_int(p: *mut ffi::PyObject) -> Option<i64> {
    // `PyLong_AsLong` reads the digits itself; `PyLong_AsLongLong` goes through a byte array
    // for every value of 2^30 and above (sizes, addresses). `long` is 64 bits on LP64 targets.
    #[cfg(all(unix, target_pointer_width = "64"))]
    let n = ffi::PyLong_AsLong(p) as i64;
    #[cfg(not(all(unix, target_pointer_width = "64")))]
    let n = ffi::PyLong_AsLongLong(p);
    if n == -1 && !ffi::PyErr_Occurred().is_null() {
        ffi::PyErr_Clear();
        return None;
    }
    Some(n)
}

/// The UTF-8 bytes of a `str` holding lone surrogates, as Python's `surrogatepass` writes them
/// (as a pickle holds them).
fn surrogatepass(s: &Bound<'_, PyString>) -> Vec<u8> {
    s.call_method1("encode", ("utf-8", "surrogatepass"))
        .and_then(|b| Ok(b.downcast_into::<PyBytes>()?.as_bytes().to_vec()))
        .unwrap_or_default()
}

/// Hashes the item addresses of a `frames` list a word at a time (a default hasher would
/// spend more on them than the walk it spares).
#[derive(Default)]
struct SeqHasher(u64);

impl std::hash::Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let w = u64::from_ne_bytes(w.try_into().unwrap_or([0; 8]));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        for &b in words.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
}

/// About how many sequence items and dict entries converting `obj` makes, from the number of
/// its trace entries (each a dict of about 8 keys, in a list), within what `cap` allows.
fn expected_size(obj: &Bound<'_, PyAny>, cap: u64) -> (usize, usize) {
    let traces = obj
        .downcast::<pyo3::types::PyDict>()
        .ok()
        .and_then(|d| d.get_item("device_traces").ok().flatten())
        .and_then(|t| t.downcast_into::<pyo3::types::PyList>().ok());
    let entries: usize = traces.map_or(0, |t| {
        t.iter().filter_map(|l| l.downcast::<pyo3::types::PyList>().ok().map(|l| l.len())).sum()
    });
    let most = (cap / (2 * PER_VALUE)).min(1 << 26) as usize;
    ((entries + 4096).min(most), (entries * 8 + 4096).min(most))
}

/// Converts a snapshot dict (or the list of a legacy `memory_snapshot()`) into the decoded
/// form of its pickle, holding at most `cap` bytes, its `frames` left out unless
/// `keep_frames`; errors name the key path.
pub fn convert(
    obj: &Bound<'_, PyAny>,
    cap: u64,
    keep_frames: bool,
) -> Result<(Pickle<'static>, Names), Error> {
    let walk = Walk::new(obj, cap, keep_frames, expected_size(obj, cap));
    walk.run(obj).map_err(|e| e.in_format(FORMAT))
}

/// Reads the snapshot dict `obj` (or the list of a legacy `memory_snapshot()`) into a trace as
/// `options` ask, as its pickle file is read: streamed, each device's trace entries handed to
/// the reader [`BATCH`] at a time and then dropped ([`EntryStream`]), so that the conversion
/// holds the events plus one batch and works in cache. Where the stream is refused (a later
/// object refers to an entry dropped, which PyTorch's dicts never do), the dict is converted
/// whole, then read. The key paths come back whatever the outcome, for the caller to name an
/// error's place.
pub fn read_dict(
    obj: &Bound<'_, PyAny>,
    options: &ReadOptions,
) -> (Result<fragsim::trace::Trace, Error>, Option<Names>) {
    let cap = match options.input_cap() {
        Ok(cap) => cap,
        Err(e) => return (Err(e), None),
    };
    let mut walk = Walk::new(obj, cap, options.keep_frames, (4 * BATCH, 16 * BATCH));
    walk.stream = Some(EntryStream::new(options));
    walk.cancel = options.cancel.clone();
    let root = walk.walk_root(obj);
    let mut refused = walk.refused;
    let names =
        Names { steps: std::mem::take(&mut walk.steps), keys: std::mem::take(&mut walk.keys) };
    let result = root.and_then(|root| {
        let stream = walk.stream.take().unwrap_or_else(|| EntryStream::new(options));
        let p = walk.b.finish(root);
        stream.finish(&p, options).map_err(|stop| match stop {
            Stop::Error(e) => e,
            Stop::Refused { why, .. } => {
                refused = true;
                Error::input(why)
            }
        })
    });
    if refused {
        return match convert(obj, cap, options.keep_frames) {
            Ok((p, names)) => (
                fragsim::trace::snapshot::read_decoded(&p, options)
                    .map_err(|e| e.in_format(FORMAT)),
                Some(names),
            ),
            Err(e) => (Err(e), None),
        };
    }
    (result.map_err(|e| e.in_format(FORMAT)), Some(names))
}

/// Reads the snapshot dict `obj` as the command that reads it asks (`options`), under the GIL
/// (taken on the command's thread): [`read_dict`]. The key paths go to `names`, for the caller
/// to name the place of an error.
pub fn read(
    obj: Py<PyAny>,
    options: &ReadOptions,
    names: &Mutex<Option<Names>>,
) -> Result<fragsim::trace::Trace, Error> {
    let (result, paths) = Python::with_gil(|py| read_dict(&obj.into_bound(py), options));
    if let (Some(paths), Ok(mut slot)) = (paths, names.lock()) {
        *slot = Some(paths);
    }
    result
}

/// The format a snapshot dict is read as.
const FORMAT: &str = "pytorch-snapshot";

/// Seconds to turn a snapshot dict into a trace ([`convert`], then the snapshot reader), or, for
/// a path, to read the file, keeping stack frames or not; for the comparison the test suite
/// prints.
#[pyfunction]
#[pyo3(signature = (obj, keep_frames = false))]
pub fn convert_only(py: Python<'_>, obj: &Bound<'_, PyAny>, keep_frames: bool) -> PyResult<f64> {
    let options = fragsim::trace::ReadOptions { keep_frames, ..Default::default() };
    let start = std::time::Instant::now();
    let read = if let Ok(path) = obj.extract::<std::path::PathBuf>() {
        py.allow_threads(|| fragsim::trace::read_trace(&path, &options))
    } else {
        read_dict(obj, &options).0
    };
    let seconds = start.elapsed().as_secs_f64();
    read.map(|_| seconds).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// What a frame dict tells the snapshot reader that keeps no frames ([`Walk::frames_read`]).
#[derive(Clone, Copy, Debug, Default)]
struct FrameMarks(u8);

impl FrameMarks {
    /// Names a file of torch_npu.
    const TORCH_NPU: u8 = 1;
    /// Tells a private pool's kind.
    const POOL_KIND: u8 = 2;

    fn of(name: &str, filename: &str) -> FrameMarks {
        let mut marks = 0;
        if fragsim::trace::is_torch_npu_file(filename) {
            marks |= Self::TORCH_NPU;
        }
        if fragsim::trace::tells_pool_kind(name, filename) {
            marks |= Self::POOL_KIND;
        }
        FrameMarks(marks)
    }

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}
