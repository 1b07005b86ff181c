//! A plain-data pickle decoder and encoder that never executes anything.
//!
//! PyTorch writes memory snapshots with Python's `pickle.dump` (protocol 4 on Python 3.8–3.13, 5
//! from 3.14; TorchScript's C++ pickler writes protocol 2), and the content is only dicts, lists,
//! strings, ints, floats, bools, one tuple and None (docs/pytorch-model.md#snapshot-pickle).
//! Python's own `pickle.load` is slow on these files and, worse, runs arbitrary code from a hostile
//! one; `serde-pickle` fails on the shared frame lists PyTorch writes (memo references to one list
//! from many frames). So fragsim decodes the data opcodes of protocols 2–5 itself (upstream
//! reference: CPython `Lib/pickle.py` and `Lib/pickletools.py`):
//!
//! - **Nothing is executed.** GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ(_EX), EXT1/2/4
//!   and PERSID/BINPERSID are input errors naming the opcode, its byte offset and, for imports,
//!   what it would import.
//! - **Sharing is kept.** Containers live in arenas inside [`Pickle`] and a [`Value`] refers to
//!   them by index, so a memo hit (`BINGET`) is a copy of a small `Copy` value and a frame list
//!   shared by thousands of trace entries is one container with one id: the snapshot reader
//!   interns frames by that id.
//! - **Strings are borrowed** from a whole input ([`decode`]); UTF-8 is checked only when a
//!   caller asks for text, so frame strings cost nothing when frames are not kept. A streamed
//!   input ([`decode_stream`]) owns its strings in one buffer.
//! - **Bounded by the input.** Nothing is pre-allocated from a declared length: a whole input
//!   checks it against the bytes that remain first, a stream reads the body into a buffer that
//!   grows only as bytes arrive (and the reader beneath caps the input); every stack slot, memo
//!   slot and container item costs an opcode byte, so memory is a small multiple of the input
//!   size; decoding is a flat loop with no recursion, and containers are dropped flat, so a
//!   hostile nesting depth cannot overflow the call stack. The recursive helper
//!   (`Pickle::depth`) is capped; `Pickle::find_dropped` walks with its own stack.
//! - **Streamed when asked.** [`decode_stream`] runs the same loop on a `BufRead` and hands the
//!   items of `root[key][d]` (a snapshot's trace entries) to a [`Sink`] one batch at a time,
//!   then discards them (see `stream.rs`): memory is the rest of the pickle plus one batch.
//!   Where the file refers back to something discarded in a way that matters, it stops with
//!   [`Stop::Refused`] and the byte offset, never with approximate data.
//!
//! [`encode`] is the matching writer: it emits protocol 4 that Python's `pickle.load` reads.

mod arena;
mod decode;
pub mod encode;
mod input;
pub mod objects;
mod stream;

pub use decode::{decode, decode_stream};
pub use stream::{Sink, Stop, Streamed, StreamedList};

/// One pickled value (16 bytes). Strings and containers are indices into their [`Pickle`]'s
/// tables, so copying a value never copies its content, just as Python shares objects.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` that fits in 64 signed bits.
    Int(i64),
    /// An `int` outside `i64` but inside `i128` (e.g. a `cudaStream_t` ≥ 2^63); read it with
    /// [`Pickle::int`].
    BigInt(u32),
    /// An `int` wider than 128 bits; its value is not kept.
    HugeInt,
    /// A `float`.
    Float(f64),
    /// A `str`: index into the string table; its bytes are UTF-8, or Python's `surrogatepass`
    /// variant (see `Pickle::text` and [`Pickle::str_bytes`]).
    Str(u32),
    /// A `bytes` or `bytearray`: index into the string table (see [`Pickle::bytes`]).
    Bytes(u32),
    /// A `list`: index into the sequence arena.
    List(u32),
    /// A `tuple`: index into the sequence arena.
    Tuple(u32),
    /// A `set` or `frozenset`: index into the sequence arena.
    Set(u32),
    /// A `dict`: index into the dict arena.
    Dict(u32),
    /// An object the streaming decoder ([`decode_stream`]) discarded after its consumer had
    /// converted it, met again through the memo (`BINGET`). Its content is gone: a consumer
    /// that needs it must refuse ([`Stop::Refused`]). The whole-input decoder never makes one.
    Dropped,
    /// An object the streaming decoder discarded but whose [`Sink`] kept what it had made of it
    /// ([`Sink::keep`]), met again through the memo: the sink's own handle. The whole-input
    /// decoder never makes one.
    Handle(u32),
}

impl Value {
    /// The Python type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) | Value::HugeInt => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Set(_) => "set",
            Value::Dict(_) => "dict",
            Value::Dropped => "discarded object",
            Value::Handle(_) => "converted object",
        }
    }

    /// The type name with its article ("an int", "a dict", "None"), for messages that say
    /// what a value is.
    pub fn a_type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::BigInt(_) | Value::HugeInt => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a str",
            Value::Bytes(_) => "a bytes object",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Set(_) => "a set",
            Value::Dict(_) => "a dict",
            Value::Dropped => "a discarded object",
            Value::Handle(_) => "a converted object",
        }
    }
}

/// The string table of a [`Pickle`]: bodies borrowed from a whole input, or, for a streamed
/// input, owned in one byte buffer (strings are added in file order, so each one's end is
/// enough to find it, and discarding the newest strings is a truncation).
#[derive(Debug, Default)]
pub(crate) struct Strings<'a> {
    borrowed: Vec<&'a [u8]>,
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl<'a> Strings<'a> {
    /// The number of strings.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.borrowed.len() + self.ends.len()
    }

    /// Adds a string borrowed from the input (whole-input decoding only).
    #[inline]
    pub(crate) fn push_borrowed(&mut self, s: &'a [u8]) {
        self.borrowed.push(s);
    }

    /// Adds an owned string whose bytes the caller appends with [`Strings::bytes_mut`] first.
    #[inline]
    pub(crate) fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Closes the owned string whose bytes were appended since the last one.
    #[inline]
    pub(crate) fn close_owned(&mut self) {
        self.ends.push(self.bytes.len());
    }

    /// String `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        if let Some(s) = self.borrowed.get(i) {
            return Some(s);
        }
        let i = i - self.borrowed.len();
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.bytes.get(start..end)
    }

    /// Drops the owned strings from index `len` on (streamed decoding discards them).
    pub(crate) fn truncate(&mut self, len: usize) {
        let owned = len.saturating_sub(self.borrowed.len());
        self.ends.truncate(owned);
        self.bytes.truncate(self.ends.last().copied().unwrap_or(0));
    }
}

/// A decoded pickle: the root value and the arenas its containers live in.
#[derive(Debug, Default)]
pub struct Pickle<'a> {
    pub(crate) seqs: arena::Arena<Value>,
    pub(crate) dicts: arena::Arena<(Value, Value)>,
    pub(crate) bigs: Vec<i128>,
    /// The bodies of `str` and `bytes` values: borrowed from the input, or owned when the input
    /// was streamed.
    pub(crate) strs: Strings<'a>,
    pub(crate) root: Option<Value>,
}

impl<'a> Pickle<'a> {
    /// The object the pickle holds (what `pickle.load` returns).
    pub fn root(&self) -> Value {
        self.root.unwrap_or(Value::None)
    }

    /// The items of a list, tuple or set; `None` for any other value.
    pub fn items(&self, v: Value) -> Option<&[Value]> {
        match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => self.seqs.get(i as usize),
            _ => None,
        }
    }

    /// The (key, value) pairs of a dict in insertion order (a repeated key appears twice; the
    /// later one is what Python keeps); `None` for any other value.
    pub fn entries(&self, v: Value) -> Option<&[(Value, Value)]> {
        match v {
            Value::Dict(i) => self.dicts.get(i as usize),
            _ => None,
        }
    }

    /// The byte offset in the input of the opcode that built container `v` (`EMPTY_LIST`,
    /// `DICT`, `TUPLE2`, ...), so errors found in the decoded data can point into the file;
    /// `None` for a scalar, which has no object of its own to point at.
    pub(crate) fn offset_of(&self, v: Value) -> Option<u64> {
        match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => self.seqs.offset(i as usize),
            Value::Dict(i) => self.dicts.offset(i as usize),
            _ => None,
        }
    }

    /// `dict[key]` for a string key; `None` when `dict` is not a dict or lacks the key.
    pub fn get(&self, dict: Value, key: &str) -> Option<Value> {
        self.entries(dict)?.iter().rev().find(|(k, _)| self.is_str(*k, key)).map(|&(_, v)| v)
    }

    /// The encoded bytes of a `str` (no UTF-8 check); `None` for any other value.
    #[inline]
    pub fn str_bytes(&self, v: Value) -> Option<&[u8]> {
        match v {
            Value::Str(i) => self.strs.get(i as usize),
            _ => None,
        }
    }

    /// The content of a `bytes` or `bytearray`; `None` for any other value.
    pub fn bytes(&self, v: Value) -> Option<&[u8]> {
        match v {
            Value::Bytes(i) => self.strs.get(i as usize),
            _ => None,
        }
    }

    /// True when `v` is a `str` equal to `key` (compared as bytes, no UTF-8 check needed).
    #[inline]
    pub fn is_str(&self, v: Value, key: &str) -> bool {
        self.str_bytes(v) == Some(key.as_bytes())
    }

    /// The value of an `int` (or `bool`, which Python treats as an int), if it fits in `i128`.
    pub fn int(&self, v: Value) -> Option<i128> {
        match v {
            Value::Int(i) => Some(i as i128),
            Value::Bool(b) => Some(b as i128),
            Value::BigInt(i) => self.bigs.get(i as usize).copied(),
            _ => None,
        }
    }

    /// A `str` as text: borrowed when it is valid UTF-8, else decoded lossily (Python writes lone
    /// surrogates, which UTF-8 cannot hold, with `surrogatepass`).
    pub(crate) fn text(&self, v: Value) -> Option<std::borrow::Cow<'_, str>> {
        self.str_bytes(v).map(String::from_utf8_lossy)
    }

    /// Whether a [`Value::Dropped`] or [`Value::Handle`] is reachable from `v`: `Some` with the
    /// byte offset of the container holding the first one found (when known). Each container is visited once, with
    /// an explicit stack (no recursion), so cycles and hostile depths stay cheap.
    pub(crate) fn find_dropped(&self, v: Value) -> Option<Option<u64>> {
        let gone = |x: Value| matches!(x, Value::Dropped | Value::Handle(_));
        if gone(v) {
            return Some(None);
        }
        let mut seen_seqs = vec![false; self.seqs.len()];
        let mut seen_dicts = vec![false; self.dicts.len()];
        let mut todo = vec![v];
        while let Some(c) = todo.pop() {
            let seen = match c {
                Value::List(i) | Value::Tuple(i) | Value::Set(i) => seen_seqs.get_mut(i as usize),
                Value::Dict(i) => seen_dicts.get_mut(i as usize),
                _ => None,
            };
            match seen {
                Some(s) if !*s => *s = true,
                _ => continue,
            }
            let pairs = self.entries(c).unwrap_or(&[]).iter().flat_map(|&(k, x)| [k, x]);
            let items = self.items(c).unwrap_or(&[]).iter().copied();
            for x in pairs.chain(items) {
                if gone(x) {
                    return Some(self.offset_of(c));
                }
                todo.push(x);
            }
        }
        None
    }

    #[cfg(test)]
    /// The nesting depth of `v` (a scalar is 0, `[]` is 1, `[[1]]` is 2), counting at most `cap`
    /// levels, so cycles (`l.append(l)`) and hostile depths stay cheap. It goes level by level,
    /// each container once per level, so shared objects (`l = [m, m]`, `m = [k, k]`, ...) cost
    /// at most `cap` passes over the containers, never one walk per path.
    pub(crate) fn depth(&self, v: Value, cap: usize) -> usize {
        let key = |x: Value| match x {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => Some((false, i)),
            Value::Dict(i) => Some((true, i)),
            _ => None,
        };
        let mut level: Vec<Value> = key(v).map(|_| v).into_iter().collect();
        let mut depth = 0;
        while !level.is_empty() && depth < cap {
            depth += 1;
            let mut seen = std::collections::HashSet::new();
            let mut next = Vec::new();
            for c in level {
                let pairs = self.entries(c).unwrap_or(&[]).iter().flat_map(|&(k, x)| [k, x]);
                let items = self.items(c).unwrap_or(&[]).iter().copied();
                for x in pairs.chain(items) {
                    if key(x).is_some_and(|k| seen.insert(k)) {
                        next.push(x);
                    }
                }
            }
            level = next;
        }
        depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_small() {
        // Every stack slot, memo slot and container item is one Value: keep it two words.
        assert_eq!(std::mem::size_of::<Value>(), 16);
    }

    #[test]
    fn depth_is_capped_on_cycles() {
        // A list containing itself: pickle.dumps(l) for l = []; l.append(l), protocol 4.
        let data = b"\x80\x04]\x94h\x00a.";
        let p = decode(data).unwrap();
        assert!(matches!(p.root(), Value::List(0)));
        assert_eq!(p.items(p.root()).unwrap(), &[Value::List(0)]);
        assert_eq!(p.depth(p.root(), 50), 50);
        // A list holding itself twice: one walk per path took 2^cap steps.
        let data = b"\x80\x04]\x94(h\x00h\x00e.";
        let p = decode(data).unwrap();
        let start = std::time::Instant::now();
        assert_eq!(p.depth(p.root(), 1000), 1000);
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        // Scalars, empty containers and dicts.
        let p = decode(b"\x80\x04}(K\x01](]eu.").unwrap();
        assert_eq!(p.depth(p.root(), 10), 3);
        assert_eq!(p.depth(Value::Int(1), 10), 0);
        assert_eq!(p.depth(p.root(), 0), 0);
    }

    #[test]
    fn containers_know_the_offset_of_their_opcode() {
        // PROTO 4, EMPTY_DICT, 'a', MARK, EMPTY_LIST, NONE, TUPLE1, LIST, SETITEM, STOP:
        // {'a': [[], (None,)]}.
        let data = b"\x80\x04}\x8c\x01a(]N\x85ls.";
        let p = decode(data).unwrap();
        let root = p.root();
        assert_eq!(p.offset_of(root), Some(2));
        let outer = p.get(root, "a").unwrap();
        assert_eq!(p.offset_of(outer), Some(10), "LIST, not its MARK");
        let items = p.items(outer).unwrap();
        assert_eq!(p.offset_of(items[0]), Some(7));
        assert_eq!(p.offset_of(items[1]), Some(9));
        assert_eq!(p.offset_of(Value::Int(1)), None);
        assert_eq!(p.offset_of(Value::List(9)), None);
    }
}
