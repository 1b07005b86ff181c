//! The decoding loop: one flat pass over the opcodes, a value stack, a mark stack and a memo.
//!
//! Opcode semantics follow CPython `Lib/pickle.py` (`_Unpickler.load_*`); names and numbers follow
//! `Lib/pickletools.py`. Every error is an input error at the byte offset of the opcode that
//! failed.

use super::arena::Arena;
use super::input::{Input, Short, Slice, Stream};
use super::stream::{Past, Streaming};
use super::{Pickle, Sink, Stop, Streamed, Value};
use crate::error::{Error, Place, Result};
use std::collections::HashMap;
use std::io::BufRead;

/// The deepest run of unclosed MARKs accepted. Real snapshots nest fewer than ten; the cap keeps a
/// hostile file from building a huge mark stack out of one-byte opcodes.
const MAX_MARKS: usize = 10_000;

/// Decodes one pickle from the start of `data` (bytes after its STOP are ignored, as
/// `pickle.load` ignores them).
pub fn decode(data: &[u8]) -> Result<Pickle<'_>> {
    let out = Pickle {
        // Real snapshots hold about one list item per 5 input bytes (BINGETs of shared frame
        // dicts) and one dict pair per 20: reserve that much, bounded by the input's size and
        // by a fixed cap (256 + 128 MiB), so a huge input never asks for a reservation the
        // system might refuse; past it, the pools grow as usual.
        seqs: Arena::with_capacity((data.len() / 4).min(1 << 24)),
        dicts: Arena::with_capacity((data.len() / 16).min(1 << 22)),
        ..Pickle::default()
    };
    let mut d = Decoder::new(Slice { data, pos: 0 }, out, None);
    match d.run() {
        Ok(()) => Ok(d.out),
        Err(Stop::Error(e)) => Err(e),
        // Only a streaming decoder refuses.
        Err(Stop::Refused { at, why }) => Err(Error::input(why).at(Place::Byte(at))),
    }
}

/// Decodes one pickle from `input`, handing every item of the lists `root[key][d]` (the
/// per-device lists of a dict's list of lists, such as a snapshot's `device_traces`) to `sink` as
/// soon as it is complete, and then discarding it: see [`Sink`] for what is kept. The rest of the
/// pickle is built as [`decode`] builds it, with its strings owned.
///
/// Memory is what the rest of the pickle holds, plus the items of one batch (`MARK … APPENDS`,
/// at most 1000 items in the files Python writes), plus the memo entries that survive a
/// discard; a discarded memo entry costs nothing. When the stream refers back to something
/// discarded where that matters, the sink or the decoder answers [`Stop::Refused`] rather than
/// anything approximate.
pub fn decode_stream(
    input: &mut dyn BufRead,
    key: &'static str,
    sink: &mut dyn Sink,
) -> std::result::Result<Streamed, Stop> {
    let streaming = Streaming::new(key, sink);
    let mut d = Decoder::new(Stream::new(input), Pickle::default(), Some(streaming));
    d.run()?;
    let lists = d.stream.take().map(Streaming::finish).unwrap_or_default();
    Ok(Streamed { pickle: d.out, lists })
}

pub(super) struct Decoder<'a, 's, I: Input<'a>> {
    pub(super) input: I,
    /// Offset of the opcode being executed, for errors.
    pub(super) op_at: u64,
    pub(super) stack: Vec<Value>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) out: Pickle<'a>,
    /// The streaming state, when decoding with [`decode_stream`].
    pub(super) stream: Option<Streaming<'s>>,
    /// The last FRAME: its opcode's offset, its declared length and where it ends.
    pub(super) frame: Option<(u64, u64, u64)>,
}

/// The memo: what `MEMOIZE`/`PUT` stored, by index.
#[derive(Debug, Default)]
pub(super) struct Memo {
    /// Dense memo (the normal case: MEMOIZE numbers entries 0, 1, 2, ...).
    pub(super) dense: Vec<Option<Value>>,
    /// Memo entries whose index is far beyond the dense part (only hand-made pickles do that).
    pub(super) sparse: HashMap<u32, Value>,
    /// Number of distinct memo keys, which is what MEMOIZE uses as the next index.
    pub(super) count: u32,
    /// Streamed decoding only: whether the entries from `dense.len()` on live in `past` and
    /// `recent` (see [`Streaming`]).
    pub(super) streaming: bool,
    /// Entries from `dense.len()` to `recent_start`: those that survived a discard (every
    /// other one there was discarded).
    pub(super) past: Past,
    /// The first index of `recent`.
    pub(super) recent_start: u32,
    /// The entries stored since the last discard, from `recent_start` on.
    pub(super) recent: Vec<Value>,
}

/// The name pickletools gives opcode `op`, for messages.
fn op_name(op: u8) -> &'static str {
    match op {
        0x80 => "PROTO",
        0x95 => "FRAME",
        b'.' => "STOP",
        b'(' => "MARK",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'}' => "EMPTY_DICT",
        b']' => "EMPTY_LIST",
        b')' => "EMPTY_TUPLE",
        b't' => "TUPLE",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        b'l' => "LIST",
        b'd' => "DICT",
        b'a' => "APPEND",
        b'e' => "APPENDS",
        b's' => "SETITEM",
        b'u' => "SETITEMS",
        0x94 => "MEMOIZE",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b'p' => "PUT",
        b'h' => "BINGET",
        b'j' => "LONG_BINGET",
        b'g' => "GET",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'M' => "BININT2",
        b'I' => "INT",
        b'L' => "LONG",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'G' => "BINFLOAT",
        b'F' => "FLOAT",
        b'N' => "NONE",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8c => "SHORT_BINUNICODE",
        b'X' => "BINUNICODE",
        0x8d => "BINUNICODE8",
        b'C' => "SHORT_BINBYTES",
        b'B' => "BINBYTES",
        0x8e => "BINBYTES8",
        0x96 => "BYTEARRAY8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        _ => "unknown",
    }
}

impl<'a, 's, I: Input<'a>> Decoder<'a, 's, I> {
    fn new(input: I, out: Pickle<'a>, stream: Option<Streaming<'s>>) -> Self {
        Decoder {
            input,
            op_at: 0,
            stack: Vec::with_capacity(64),
            marks: Vec::new(),
            memo: Memo::default(),
            out,
            stream,
            frame: None,
        }
    }

    /// At STOP: the input must hold the rest of the last FRAME, as Python's `pickle.load` reads
    /// a frame whole before decoding it. A stream cannot tell what remains, so the rest is read
    /// through (a file's own bytes, never more); a file shorter than its frame is truncated, at
    /// the FRAME's offset.
    fn frame_is_whole(&mut self) -> Result<(), Stop> {
        let Some((at, len, end)) = self.frame else { return Ok(()) };
        let mut scratch = [0u8; 4096];
        while self.input.pos() < end {
            let n = (end - self.input.pos()).min(scratch.len() as u64) as usize;
            if self.input.fill(&mut scratch[..n]).is_err() {
                return Err(Stop::from(
                    Error::input(format!(
                        "truncated pickle: FRAME (0x95) declares {len} bytes but the file ends first"
                    ))
                    .at(Place::Byte(at)),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn err(&self, message: String) -> Error {
        Error::input(message).at(Place::Byte(self.op_at))
    }

    pub(super) fn op_err(&self, op: u8, what: &str) -> Error {
        self.err(format!("{} (0x{op:02x}): {what}", op_name(op)))
    }

    /// The error for an argument the input could not give; `declared` when its length came
    /// from the file.
    #[cold]
    fn short(&self, op: u8, n: u64, declared: bool, short: Short) -> Error {
        match short {
            Short::End { remaining } if declared => self.err(format!(
                "truncated pickle: {} (0x{op:02x}) declares {n} bytes but only {remaining} remain",
                op_name(op)
            )),
            Short::End { remaining } => self.err(format!(
                "truncated pickle: {} (0x{op:02x}) needs {n} more bytes but only {remaining} remain",
                op_name(op)
            )),
            Short::NoEol => self
                .err(format!("truncated pickle: {} (0x{op:02x}) has no end of line", op_name(op))),
            Short::Io(e) => self.err(format!("cannot read the pickle: {e}")),
        }
    }

    #[inline]
    fn take_array<const N: usize>(&mut self, op: u8) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        match self.input.fill(&mut a) {
            Ok(()) => Ok(a),
            Err(e) => Err(self.short(op, N as u64, false, e)),
        }
    }

    /// Takes a body whose length the file declares, checked against what remains, into `buf`
    /// (at most 256 bytes: LONG1).
    #[inline]
    fn take_small<'b>(&mut self, op: u8, len: u8, buf: &'b mut [u8; 256]) -> Result<&'b [u8]> {
        let body = &mut buf[..len as usize];
        match self.input.fill(body) {
            Ok(()) => Ok(body),
            Err(e) => Err(self.short(op, len as u64, true, e)),
        }
    }

    /// Takes a body whose length the file declares, checked against what remains first.
    fn take_declared(&mut self, op: u8, len: u64) -> Result<Vec<u8>> {
        match self.input.vec(len) {
            Ok(v) => Ok(v),
            Err(e) => Err(self.short(op, len, true, e)),
        }
    }

    /// Takes a text argument up to (not including) the next newline (protocol 0 opcodes).
    fn take_line(&mut self, op: u8) -> Result<Vec<u8>> {
        match self.input.line() {
            Ok(v) => Ok(v),
            Err(e) => Err(self.short(op, 0, false, e)),
        }
    }

    #[inline]
    fn push(&mut self, v: Value) {
        self.stack.push(v);
    }

    /// The lowest stack index the current opcode may pop (the last MARK, or 0).
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, op: u8) -> Result<Value> {
        if self.stack.len() > self.floor() {
            if let Some(v) = self.stack.pop() {
                return Ok(v);
            }
        }
        Err(self.op_err(op, "stack underflow"))
    }

    #[inline]
    fn top(&self, op: u8) -> Result<Value> {
        match self.stack.last() {
            Some(&v) if self.stack.len() > self.floor() => Ok(v),
            _ => Err(self.op_err(op, "stack underflow")),
        }
    }

    /// Pops the last MARK and returns the stack index where its items start.
    #[inline]
    fn pop_mark(&mut self, op: u8) -> Result<usize> {
        self.marks.pop().ok_or_else(|| self.op_err(op, "no MARK before it"))
    }

    /// A new list, tuple or set holding the stack items from `base` up (which are popped).
    pub(super) fn new_seq(&mut self, base: usize) -> Result<u32> {
        if self.out.seqs.len() >= u32::MAX as usize {
            return Err(self.err("more than 2^32 containers".into()));
        }
        let id =
            self.out.seqs.add(self.op_at, self.stack.get(base..).unwrap_or(&[]).iter().copied());
        self.stack.truncate(base);
        Ok(id as u32)
    }

    /// A new dict holding the stack items from `base` up as key, value pairs (which are popped).
    fn new_dict(&mut self, base: usize) -> Result<u32> {
        if self.out.dicts.len() >= u32::MAX as usize {
            return Err(self.err("more than 2^32 containers".into()));
        }
        let items = self.stack.get(base..).unwrap_or(&[]);
        let id = self.out.dicts.add(self.op_at, items.chunks_exact(2).map(|c| (c[0], c[1])));
        self.stack.truncate(base);
        Ok(id as u32)
    }

    /// A `str` (or `bytes`) value of the next `len` input bytes (a length the file declares).
    #[inline]
    fn string(&mut self, op: u8, len: u64, is_str: bool) -> Result<Value> {
        let id = u32::try_from(self.out.strs.len())
            .map_err(|_| self.err("more than 2^32 strings".into()))?;
        if let Err(e) = self.input.string(len, &mut self.out.strs) {
            return Err(self.short(op, len, true, e));
        }
        Ok(if is_str { Value::Str(id) } else { Value::Bytes(id) })
    }

    fn int(&mut self, v: i128) -> Result<Value> {
        if let Ok(i) = i64::try_from(v) {
            return Ok(Value::Int(i));
        }
        let id = u32::try_from(self.out.bigs.len())
            .map_err(|_| self.err("more than 2^32 large integers".into()))?;
        self.out.bigs.push(v);
        Ok(Value::BigInt(id))
    }

    /// A little-endian two's-complement integer (LONG1 / LONG4 bodies).
    fn long(&mut self, bytes: &[u8]) -> Result<Value> {
        let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
        let fill = if negative { 0xff } else { 0 };
        if bytes.len() > 16 {
            // Wider than i128 unless the extra bytes are only sign extension.
            let (low, high) = bytes.split_at(16);
            let sign_ok = (low[15] & 0x80 != 0) == negative;
            if !(high.iter().all(|&b| b == fill) && sign_ok) {
                return Ok(Value::HugeInt);
            }
            return self.long(low);
        }
        let mut buf = [fill; 16];
        buf[..bytes.len()].copy_from_slice(bytes);
        self.int(i128::from_le_bytes(buf))
    }

    fn memo_put(&mut self, op: u8, idx: u32, v: Value) -> std::result::Result<(), Stop> {
        let i = idx as usize;
        let memo = &mut self.memo;
        if memo.streaming {
            // Streaming keeps entries past the dense part in `recent` only, in order: anything
            // else would hide a reference into what a discard drops.
            return self.memo_put_streaming(idx, v);
        }
        if let Some(slot) = memo.dense.get_mut(i) {
            if slot.is_none() {
                memo.count += 1;
            }
            *slot = Some(v);
        } else if i <= 2 * memo.count as usize + 64 {
            // Dense growth stays proportional to the entries actually stored.
            memo.dense.resize(i + 1, None);
            memo.dense[i] = Some(v);
            memo.count += 1;
        } else if memo.sparse.insert(idx, v).is_none() {
            match memo.count.checked_add(1) {
                Some(n) => memo.count = n,
                None => return Err(self.op_err(op, "memo is full (2^32 entries)").into()),
            }
        }
        Ok(())
    }

    /// The memo entry `idx`: in the dense part, or, while streaming, among the entries stored
    /// since the last discard or those that survived one, each found in O(1) (every `BINGET`
    /// of a frame dict comes here); `None` when it is in neither (see [`Self::memo_get`]).
    #[inline(always)]
    fn memo_lookup(&self, idx: u32) -> Option<Value> {
        let memo = &self.memo;
        if let Some(Some(v)) = memo.dense.get(idx as usize) {
            return Some(*v);
        }
        if memo.streaming && idx >= memo.dense.len() as u32 && idx < memo.count {
            if idx >= memo.recent_start {
                let v = memo.recent.get((idx - memo.recent_start) as usize);
                return Some(v.copied().unwrap_or(Value::Dropped));
            }
            return Some(memo.past.get(idx));
        }
        None
    }

    /// The memo entry `idx` ([`Self::memo_lookup`], else the sparse part), or an error.
    #[inline]
    fn memo_get(&self, op: u8, idx: u32) -> std::result::Result<Value, Stop> {
        match self.memo_lookup(idx) {
            Some(v) => Ok(v),
            None => self.memo_get_sparse(op, idx),
        }
    }

    /// A memo entry stored far past the dense part (hand-made pickles only), or an error.
    #[cold]
    fn memo_get_sparse(&self, op: u8, idx: u32) -> std::result::Result<Value, Stop> {
        self.memo
            .sparse
            .get(&idx)
            .copied()
            .ok_or_else(|| self.op_err(op, &format!("memo entry {idx} was never stored")).into())
    }

    fn parse_text_u32(&self, op: u8, text: &[u8]) -> Result<u32> {
        std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .ok_or_else(|| self.op_err(op, &format!("bad memo index {:?}", lossy(text))))
    }

    fn forbidden(&mut self, op: u8) -> Result<()> {
        let what = match op {
            b'c' => {
                let module = self.take_line(op)?;
                let name = self.take_line(op)?;
                format!("would import '{} {}'", lossy(&module), lossy(&name))
            }
            0x93 => {
                let name = self.stack.last().copied();
                let module = self.stack.len().checked_sub(2).and_then(|i| self.stack.get(i));
                match (module, name) {
                    (Some(&m), Some(n)) => match (self.out.str_bytes(m), self.out.str_bytes(n)) {
                        (Some(m), Some(n)) => format!("would import '{} {}'", lossy(m), lossy(n)),
                        _ => "would import a Python object".to_string(),
                    },
                    _ => "would import a Python object".to_string(),
                }
            }
            b'R' => "would call a Python function".to_string(),
            b'b' => "would set an object's state".to_string(),
            b'i' | b'o' | 0x81 | 0x92 => "would create a class instance".to_string(),
            0x82..=0x84 => "would import an object from the extension registry".to_string(),
            _ => "would load a persistent object".to_string(),
        };
        Err(self
            .err(format!("not a plain-data snapshot: opcode {} (0x{op:02x}) {what}", op_name(op))))
    }

    fn run(&mut self) -> std::result::Result<(), Stop> {
        loop {
            // Most opcodes of a snapshot are BINGET/LONG_BINGET (a frame list's frame dicts):
            // one whose argument is at hand in the buffer and whose entry is there takes this
            // short path; a missing entry, a list (which may be refused) and the end of a
            // buffer take the general one below.
            let (len, idx) = match *self.input.window() {
                [b'h', i, ..] => (2, i as u32),
                [b'j', a, b, c, d, ..] => (5, u32::from_le_bytes([a, b, c, d])),
                _ => (0, 0),
            };
            if len > 0 {
                match self.memo_lookup(idx) {
                    Some(Value::List(_)) | None => {}
                    Some(v) => {
                        if v == Value::Dropped {
                            self.met_dropped(self.input.pos());
                        }
                        self.input.skip(len);
                        self.stack.push(v);
                        continue;
                    }
                }
            }
            self.op_at = self.input.pos();
            let op = match self.input.byte() {
                Ok(Some(op)) => op,
                Ok(None) => {
                    return Err(Stop::from(
                        self.err("truncated pickle: it ends before its STOP opcode".into()),
                    ))
                }
                Err(e) => return Err(Stop::from(self.short(0, 1, false, e))),
            };
            match op {
                // Control.
                0x80 => {
                    let [v] = self.take_array::<1>(op)?;
                    if v > 5 {
                        return Err(Stop::from(self.err(format!(
                            "unsupported pickle protocol {v} (fragsim reads protocols 2 to 5)"
                        ))));
                    }
                }
                0x95 => {
                    // FRAME only groups opcodes for buffered readers; the opcodes inside are
                    // decoded as usual, but the declared length must fit.
                    let len = u64::from_le_bytes(self.take_array::<8>(op)?);
                    // A stream cannot tell what remains: a short frame is found at its end.
                    let remaining = self.input.remaining().unwrap_or(u64::MAX);
                    if len > remaining {
                        return Err(Stop::from(self.err(format!(
                            "truncated pickle: FRAME (0x95) declares {len} bytes but only {remaining} remain"
                        ))));
                    }
                    let start = self.input.pos();
                    self.frame = Some((self.op_at, len, start.saturating_add(len)));
                }
                b'.' => {
                    self.frame_is_whole()?;
                    let v = self.pop(op)?;
                    self.out.root = Some(v);
                    if self.stream.is_some() {
                        self.end_region();
                    }
                    return Ok(());
                }
                b'(' => {
                    if self.marks.len() >= MAX_MARKS {
                        return Err(Stop::from(self.op_err(op, "more than 10000 nested MARKs")));
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    // POP with nothing above the mark pops the mark (CPython does the same).
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else {
                        self.pop_mark(op)?;
                    }
                }
                b'1' => {
                    let base = self.pop_mark(op)?;
                    self.stack.truncate(base);
                }
                b'2' => {
                    let v = self.top(op)?;
                    self.push(v);
                }

                // Containers.
                b'}' => {
                    let id = self.new_dict(self.stack.len())?;
                    self.push(Value::Dict(id));
                }
                b']' => {
                    let id = self.new_seq(self.stack.len())?;
                    self.push(Value::List(id));
                    if self.stream.is_some() {
                        self.list_pushed();
                    }
                }
                b')' => {
                    let id = self.new_seq(self.stack.len())?;
                    self.push(Value::Tuple(id));
                }
                0x8f => {
                    let id = self.new_seq(self.stack.len())?;
                    self.push(Value::Set(id));
                }
                b't' | b'l' | 0x91 => {
                    let base = self.pop_mark(op)?;
                    let id = self.new_seq(base)?;
                    self.push(match op {
                        b't' => Value::Tuple(id),
                        b'l' => Value::List(id),
                        _ => Value::Set(id),
                    });
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < self.floor() + n {
                        return Err(Stop::from(self.op_err(op, "stack underflow")));
                    }
                    let id = self.new_seq(self.stack.len() - n)?;
                    self.push(Value::Tuple(id));
                }
                b'd' => {
                    let base = self.pop_mark(op)?;
                    if (self.stack.len() - base) % 2 != 0 {
                        return Err(Stop::from(self.op_err(op, "odd number of items (a key without a value)")));
                    }
                    let id = self.new_dict(base)?;
                    self.push(Value::Dict(id));
                }
                b'a' => {
                    let v = self.pop(op)?;
                    match self.top(op)? {
                        Value::List(id) if self.streams_into(id) => {
                            self.push(v);
                            self.convert(self.stack.len() - 1)?;
                        }
                        Value::List(id) => {
                            self.guard(id as usize, true);
                            self.out.seqs.extend(id as usize, std::iter::once(v))
                        }
                        t => {
                            return Err(Stop::from(self
                                .op_err(op, &format!("appends to {}, not a list", t.a_type_name()))))
                        }
                    }
                }
                b'e' | 0x90 => {
                    let base = self.pop_mark(op)?;
                    let target = base.checked_sub(1).and_then(|i| self.stack.get(i)).copied();
                    let id = match (op, target) {
                        (b'e', Some(Value::List(id))) | (0x90, Some(Value::Set(id))) => id,
                        (_, t) => {
                            let want = if op == b'e' { "list" } else { "set" };
                            let found = t.map_or("nothing", |t| t.type_name());
                            return Err(Stop::from(
                                self.op_err(op, &format!("adds to a {found}, not a {want}"))
                            ));
                        }
                    };
                    if op == b'e' && self.streams_into(id) {
                        self.convert(base)?;
                        continue;
                    }
                    self.guard(id as usize, true);
                    let items = self.stack.get(base..).unwrap_or(&[]).iter().copied();
                    self.out.seqs.extend(id as usize, items);
                    self.stack.truncate(base);
                }
                b's' => {
                    let v = self.pop(op)?;
                    let k = self.pop(op)?;
                    match self.top(op)? {
                        Value::Dict(id) => {
                            self.guard(id as usize, false);
                            self.out.dicts.extend(id as usize, std::iter::once((k, v)))
                        }
                        t => {
                            return Err(Stop::from(
                                self.op_err(op, &format!("sets an item of {}", t.a_type_name()))
                            ))
                        }
                    }
                }
                b'u' => {
                    let base = self.pop_mark(op)?;
                    let id = match base.checked_sub(1).and_then(|i| self.stack.get(i)) {
                        Some(Value::Dict(id)) => *id,
                        t => {
                            let found = t.map_or("nothing", |t| t.type_name());
                            return Err(Stop::from(
                                self.op_err(op, &format!("sets items of a {found}, not a dict"))
                            ));
                        }
                    };
                    if (self.stack.len() - base) % 2 != 0 {
                        return Err(Stop::from(self.op_err(op, "odd number of items (a key without a value)")));
                    }
                    self.guard(id as usize, false);
                    let items = self.stack.get(base..).unwrap_or(&[]);
                    self.out.dicts.extend(id as usize, items.chunks_exact(2).map(|c| (c[0], c[1])));
                    self.stack.truncate(base);
                }

                // Memo.
                0x94 => {
                    let v = self.top(op)?;
                    self.memo_put(op, self.memo.count, v)?;
                }
                b'q' => {
                    let [i] = self.take_array::<1>(op)?;
                    let v = self.top(op)?;
                    self.memo_put(op, i as u32, v)?;
                }
                b'r' => {
                    let i = u32::from_le_bytes(self.take_array::<4>(op)?);
                    let v = self.top(op)?;
                    self.memo_put(op, i, v)?;
                }
                b'p' => {
                    let text = self.take_line(op)?;
                    let i = self.parse_text_u32(op, &text)?;
                    let v = self.top(op)?;
                    self.memo_put(op, i, v)?;
                }
                b'h' => {
                    let [i] = self.take_array::<1>(op)?;
                    let v = self.memo_get(op, i as u32)?;
                    self.push_got(v)?;
                }
                b'j' => {
                    let i = u32::from_le_bytes(self.take_array::<4>(op)?);
                    let v = self.memo_get(op, i)?;
                    self.push_got(v)?;
                }
                b'g' => {
                    let text = self.take_line(op)?;
                    let i = self.parse_text_u32(op, &text)?;
                    let v = self.memo_get(op, i)?;
                    self.push_got(v)?;
                }

                // Numbers.
                b'J' => {
                    let v = i32::from_le_bytes(self.take_array::<4>(op)?);
                    self.push(Value::Int(v as i64));
                }
                b'K' => {
                    let [v] = self.take_array::<1>(op)?;
                    self.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.take_array::<2>(op)?);
                    self.push(Value::Int(v as i64));
                }
                b'I' | b'L' => {
                    let text = self.take_line(op)?;
                    let t = std::str::from_utf8(&text).unwrap_or("").trim();
                    let v = match t {
                        "00" if op == b'I' => Value::Bool(false),
                        "01" if op == b'I' => Value::Bool(true),
                        _ => {
                            let digits = if op == b'L' { t.strip_suffix('L').unwrap_or(t) } else { t };
                            match digits.parse::<i128>() {
                                Ok(n) => self.int(n)?,
                                Err(_)
                                    if !digits.is_empty()
                                        && digits
                                            .trim_start_matches(['-', '+'])
                                            .bytes()
                                            .all(|b| b.is_ascii_digit()) =>
                                {
                                    Value::HugeInt
                                }
                                Err(_) => {
                                    return Err(Stop::from(self
                                        .op_err(op, &format!("bad integer {:?}", lossy(&text)))))
                                }
                            }
                        }
                    };
                    self.push(v);
                }
                0x8a => {
                    let [n] = self.take_array::<1>(op)?;
                    let mut buf = [0u8; 256];
                    let body = self.take_small(op, n, &mut buf)?;
                    let v = self.long(body)?;
                    self.push(v);
                }
                0x8b => {
                    let n = i32::from_le_bytes(self.take_array::<4>(op)?);
                    if n < 0 {
                        return Err(Stop::from(self.op_err(op, &format!("negative length {n}"))));
                    }
                    let body = self.take_declared(op, n as u64)?;
                    let v = self.long(&body)?;
                    self.push(v);
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take_array::<8>(op)?);
                    self.push(Value::Float(v));
                }
                b'F' => {
                    let text = self.take_line(op)?;
                    let v = std::str::from_utf8(&text)
                        .ok()
                        .and_then(|t| t.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.op_err(op, &format!("bad float {:?}", lossy(&text))))?;
                    self.push(Value::Float(v));
                }

                // Singletons.
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),

                // Strings and bytes.
                0x8c | b'C' => {
                    let [n] = self.take_array::<1>(op)?;
                    let v = self.string(op, n as u64, op != b'C')?;
                    self.push(v);
                }
                b'X' | b'B' => {
                    let n = u32::from_le_bytes(self.take_array::<4>(op)?);
                    let v = self.string(op, n as u64, op == b'X')?;
                    self.push(v);
                }
                0x8d | 0x8e | 0x96 => {
                    let n = u64::from_le_bytes(self.take_array::<8>(op)?);
                    let v = self.string(op, n, op == 0x8d)?;
                    self.push(v);
                }

                // Code execution: never.
                b'c' | 0x93 | b'R' | b'b' | b'i' | b'o' | 0x81 | 0x92 | 0x82..=0x84 | b'P'
                | b'Q' => self.forbidden(op)?,
                0x97 | 0x98 => {
                    return Err(Stop::from(self.op_err(
                        op,
                        "out-of-band buffers are not supported (not a plain-data snapshot)",
                    )))
                }
                b'S' | b'T' | b'U' | b'V' => {
                    return Err(Stop::from(self.op_err(
                        op,
                        "protocol 0/1 strings are not supported (PyTorch snapshots use protocol 2 or later)",
                    )))
                }
                _ => return Err(Stop::from(self.err(format!("unknown pickle opcode 0x{op:02x}")))),
            }
        }
    }
}

fn lossy(bytes: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    if s.len() > 80 {
        let mut cut = 80;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn err(data: &[u8]) -> Error {
        match decode(data) {
            Ok(p) => panic!("decoded {:?}", p.root()),
            Err(e) => e,
        }
    }

    #[test]
    fn decodes_scalars_and_containers() {
        // pickle.dumps({'a': [1, -2, 300, 70000, None, True, 1.5], 'b': (b'x', 'é')}, 4),
        // assembled by hand.
        let data: &[u8] = b"\x80\x04}\x94(\x8c\x01a\x94](K\x01J\xfe\xff\xff\xffM,\x01J\x70\x11\x01\x00N\x88G\x3f\xf8\x00\x00\x00\x00\x00\x00e\x8c\x01b\x94C\x01x\x8c\x02\xc3\xa9\x86u.";
        let p = decode(data).unwrap();
        let root = p.root();
        let a = p.items(p.get(root, "a").unwrap()).unwrap();
        assert_eq!(
            a,
            &[
                Value::Int(1),
                Value::Int(-2),
                Value::Int(300),
                Value::Int(70000),
                Value::None,
                Value::Bool(true),
                Value::Float(1.5)
            ]
        );
        let b = p.get(root, "b").unwrap();
        assert!(matches!(b, Value::Tuple(_)));
        let b = p.items(b).unwrap();
        assert_eq!(p.bytes(b[0]), Some(&b"x"[..]));
        assert_eq!(p.text(b[1]).unwrap(), "é");
    }

    #[test]
    fn long1_covers_i64_u64_and_beyond() {
        // LONG1 of 2^63 (9 bytes: 00 .. 80 00), of -1 (ff), of 0 (no bytes), of 2^200.
        let mut data =
            b"\x80\x04(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x01\xff\x8a\x00".to_vec();
        data.extend_from_slice(b"\x8a\x1a");
        data.extend_from_slice(&[0u8; 25]);
        data.push(1);
        data.extend_from_slice(b"l.");
        let p = decode(&data).unwrap();
        let items = p.items(p.root()).unwrap();
        assert_eq!(p.int(items[0]), Some(1i128 << 63));
        assert_eq!(items[1], Value::Int(-1));
        assert_eq!(items[2], Value::Int(0));
        assert_eq!(items[3], Value::HugeInt);
    }

    #[test]
    fn memo_hits_share_the_container() {
        // fr = [1]; pickle.dumps({'x': fr, 'y': fr}, 4)
        let data = b"\x80\x04}\x94(\x8c\x01x\x94]\x94K\x01a\x8c\x01y\x94h\x02u.";
        let p = decode(data).unwrap();
        let x = p.get(p.root(), "x").unwrap();
        let y = p.get(p.root(), "y").unwrap();
        assert_eq!(x, y);
        assert!(matches!(x, Value::List(_)));
    }

    #[test]
    fn global_names_what_it_would_import() {
        // cos\nsystem\n(S'echo hi'\ntR.  (the classic os.system payload)
        let e = err(b"\x80\x02cos\nsystem\nX\x07\x00\x00\x00echo hi\x85R.");
        assert_eq!(e.kind(), ErrorKind::Input);
        assert_eq!(e.location().place, Some(Place::Byte(2)));
        assert!(e.to_string().contains("opcode GLOBAL (0x63) would import 'os system'"), "{e}");
        // STACK_GLOBAL with the names on the stack.
        let e = err(b"\x80\x04\x8c\x02os\x8c\x06system\x93.");
        assert!(e.to_string().contains("STACK_GLOBAL (0x93) would import 'os system'"), "{e}");
        assert_eq!(e.location().place, Some(Place::Byte(14)));
        let e = err(b"\x80\x04}\x94)b.");
        assert!(e.to_string().contains("BUILD (0x62)"), "{e}");
    }

    #[test]
    fn declared_lengths_are_checked_before_use() {
        let mut data = b"\x80\x04\x8d".to_vec();
        data.extend_from_slice(&(1u64 << 62).to_le_bytes());
        data.extend_from_slice(b"abc.");
        let e = err(&data);
        assert_eq!(e.location().place, Some(Place::Byte(2)));
        assert!(
            e.to_string().contains("declares 4611686018427387904 bytes but only 4 remain"),
            "{e}"
        );
        let e = err(b"\x80\x04\x95\xff\xff\x00\x00\x00\x00\x00\x00N.");
        assert!(e.to_string().contains("FRAME (0x95) declares 65535 bytes"), "{e}");
    }

    #[test]
    fn malformed_streams_are_errors_with_offsets() {
        for (data, place, text) in [
            (&b"\x80\x04N"[..], 3, "ends before its STOP"),
            (b"\x80\x04h\x05.", 2, "memo entry 5 was never stored"),
            (b"\x80\x04a.", 2, "APPEND (0x61): stack underflow"),
            (b"\x80\x04]e.", 3, "APPENDS (0x65): no MARK before it"),
            (b"\x80\x04K", 2, "BININT1 (0x4b) needs 1 more bytes but only 0 remain"),
            (b"\x80\x04\xff.", 2, "unknown pickle opcode 0xff"),
            (b"\x80\x09.", 0, "unsupported pickle protocol 9"),
            (b"\x80\x04N(K\x01u.", 6, "sets items of a None"),
            (b"", 0, "ends before its STOP"),
        ] {
            let e = err(data);
            assert_eq!(e.kind(), ErrorKind::Input);
            assert_eq!(e.location().place, Some(Place::Byte(place)), "{e}");
            assert!(e.to_string().contains(text), "{e}");
        }
    }

    #[test]
    fn a_mark_cannot_be_popped_through() {
        // MARK then APPEND: the list is below the mark, so APPEND underflows.
        let e = err(b"\x80\x04](K\x01a.");
        assert!(e.to_string().contains("APPEND (0x61)"), "{e}");
    }

    #[test]
    fn deep_nesting_is_flat_work() {
        // 100,000 nested lists: [[[...]]] built with EMPTY_LIST ... APPEND, no recursion.
        let n = 100_000;
        let mut data = b"\x80\x04".to_vec();
        data.extend(std::iter::repeat_n(b']', n));
        data.extend(std::iter::repeat_n(b'a', n - 1));
        data.push(b'.');
        let p = decode(&data).unwrap();
        assert_eq!(p.depth(p.root(), 1000), 1000);
        // Too many open MARKs is refused.
        let mut data = b"\x80\x04".to_vec();
        data.extend(std::iter::repeat_n(b'(', 20_000));
        assert!(err(&data).to_string().contains("nested MARKs"));
    }

    #[test]
    fn sparse_memo_indices_do_not_allocate_up_to_the_index() {
        // LONG_BINPUT 0xfffffff0, then LONG_BINGET of it.
        let data = b"\x80\x04Nr\xf0\xff\xff\xff0j\xf0\xff\xff\xff.";
        let p = decode(data).unwrap();
        assert_eq!(p.root(), Value::None);
    }
}
