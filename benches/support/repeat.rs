//! Large snapshots made from real ones: the trace entries of a real PyTorch snapshot repeated,
//! as a longer run of the same training step would record them, pickled the way Python's
//! `pickle.dump` (protocol 4) writes them.
//!
//! The real file is decoded (`fragsim::trace::pickle::decode`) and written again object by
//! object, with CPython's pickler rules: every `str`, `bytes`, list, dict and non-empty tuple is
//! memoized when first written and referred back to (`BINGET`/`LONG_BINGET`) when met again, so
//! whatever the real file shares (dict keys, action names, frame dicts) stays shared; containers
//! are written in batches of 1000 items; the output is cut into 64 KiB `FRAME`s. Each repetition
//! gets fresh copies of the objects that belong to one trace entry in the original (the entry
//! dict, its frame list, its own strings), as the allocator builds them anew for every event,
//! and shares the rest; its `time_us` values are shifted past the previous repetition's.
//!
//! Used by `benches/readers.rs` and by `examples/repeat_snapshot.rs` (which writes one to disk
//! for whole-process measurements).

use fragsim::trace::pickle::{self, Pickle, Value};
use std::collections::HashMap;

/// A snapshot pickle holding `data`'s trace entries `copies` times (its segments and settings
/// once). Errors when `data` is not a decodable pickle with a `device_traces` list.
pub fn repeat(data: &[u8], copies: usize) -> Result<Vec<u8>, String> {
    let p = pickle::decode(data).map_err(|e| e.to_string())?;
    let root = p.root();
    let traces = p.get(root, "device_traces").ok_or("no 'device_traces'")?;
    let lists = p.items(traces).ok_or("'device_traces' is not a list")?.to_vec();
    let owners = owners(&p, root, traces, &lists);
    let mut span = 1;
    for &list in &lists {
        let times: Vec<i128> = p
            .items(list)
            .unwrap_or(&[])
            .iter()
            .filter_map(|&e| p.get(e, "time_us").and_then(|t| p.int(t)))
            .collect();
        if let (Some(lo), Some(hi)) = (times.iter().min(), times.iter().max()) {
            span = span.max(hi - lo + 1);
        }
    }
    let mut w =
        Writer { p: &p, owners: &owners, memo: HashMap::new(), out: Vec::new(), frame: Vec::new() };
    w.out.extend_from_slice(&[0x80, 4]);
    w.write_root(root, traces, &lists, copies, span)?;
    w.frame.push(b'.');
    w.commit();
    Ok(w.out)
}

/// Where each memoizable object is referred to from: outside the trace entries, from one
/// entry, or from several.
type Owners = HashMap<Id, Owner>;

#[derive(Clone, Copy, PartialEq)]
enum Owner {
    Outside,
    Entry(usize, usize),
    Entries,
}

/// An object's identity: its type and its index in the decoded pickle's tables.
type Id = (u8, u32);

/// The identity of a value the pickler memoizes (`None` for the others).
fn id(v: Value) -> Option<Id> {
    match v {
        Value::Str(i) => Some((0, i)),
        Value::Bytes(i) => Some((1, i)),
        Value::List(i) => Some((2, i)),
        Value::Dict(i) => Some((3, i)),
        Value::Tuple(i) => Some((4, i)),
        Value::Set(i) => Some((5, i)),
        _ => None,
    }
}

fn owners(p: &Pickle, root: Value, traces: Value, lists: &[Value]) -> Owners {
    let mut owners = Owners::new();
    let mut walk = |start: Value, owner: Owner| {
        let mut todo = vec![start];
        let mut seen = std::collections::HashSet::new();
        while let Some(v) = todo.pop() {
            let Some(i) = id(v) else { continue };
            if !seen.insert(i) {
                continue;
            }
            let now = match owners.get(&i) {
                None => owner,
                Some(&o) if o == owner => o,
                Some(Owner::Outside) => Owner::Outside,
                Some(_) => Owner::Entries,
            };
            owners.insert(i, now);
            for &(k, x) in p.entries(v).unwrap_or(&[]) {
                todo.extend([k, x]);
            }
            todo.extend(p.items(v).unwrap_or(&[]).iter().copied());
        }
    };
    // What is reached from outside the entries is written once.
    for &(k, v) in p.entries(root).unwrap_or(&[]) {
        walk(k, Owner::Outside);
        if v != traces {
            walk(v, Owner::Outside);
        }
    }
    for (d, &list) in lists.iter().enumerate() {
        for (i, &e) in p.items(list).unwrap_or(&[]).iter().enumerate() {
            walk(e, Owner::Entry(d, i));
        }
    }
    owners
}

/// The pickler's size target for a frame (`_FRAME_SIZE_TARGET`).
const FRAME: usize = 64 << 10;
/// Items per `APPENDS`/`SETITEMS` (`_BATCHSIZE`).
const BATCH: usize = 1000;

struct Writer<'p, 'a> {
    p: &'p Pickle<'a>,
    owners: &'p Owners,
    /// Memo index by (repetition, object): repetition 0 for shared objects.
    memo: HashMap<(usize, Id), u32>,
    out: Vec<u8>,
    frame: Vec<u8>,
}

impl Writer<'_, '_> {
    /// Ends the current frame when it has reached its target size (the pickler checks after
    /// each object it saves).
    fn maybe_commit(&mut self) {
        if self.frame.len() >= FRAME {
            self.commit();
        }
    }

    fn commit(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        if self.frame.len() >= 4 {
            self.out.push(0x95);
            self.out.extend_from_slice(&(self.frame.len() as u64).to_le_bytes());
        }
        self.out.append(&mut self.frame);
    }

    /// The identity of `v` in repetition `copy`.
    /// An object that belongs to one entry is new in each repetition; so is a frame list
    /// (PyTorch makes one per traceback, which an alloc's free entries share); what several
    /// entries share (dict keys, action names, frame dicts, which PyTorch makes once per
    /// distinct frame) is written once.
    fn key(&self, copy: usize, v: Value) -> (usize, Id) {
        let i = id(v).unwrap_or((9, 0));
        match self.owners.get(&i) {
            Some(Owner::Entry(..)) => (copy, i),
            Some(Owner::Entries) if matches!(v, Value::List(_)) => (copy, i),
            _ => (0, i),
        }
    }

    /// Writes `v` (in repetition `copy`) or refers back to it; true when it was referred to.
    fn get(&mut self, key: (usize, Id)) -> bool {
        let hit = self.memo.get(&key).copied();
        match hit {
            Some(i) if i < 256 => self.frame.extend_from_slice(&[b'h', i as u8]),
            Some(i) => {
                self.frame.push(b'j');
                self.frame.extend_from_slice(&i.to_le_bytes());
            }
            None => return false,
        }
        // Python's pickler ends a frame after any object, referred back to or written.
        self.maybe_commit();
        true
    }

    fn memoize(&mut self, key: (usize, Id)) {
        let i = self.memo.len() as u32;
        self.memo.insert(key, i);
        self.frame.push(0x94);
    }

    fn int(&mut self, v: i128) {
        let f = &mut self.frame;
        if (0..256).contains(&v) {
            f.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            f.push(b'M');
            f.extend_from_slice(&(v as u16).to_le_bytes());
        } else if let Ok(i) = i32::try_from(v) {
            f.push(b'J');
            f.extend_from_slice(&i.to_le_bytes());
        } else {
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let (top, below) = (bytes[n - 1], bytes[n - 2] & 0x80 != 0);
                if (top == 0 && !below) || (top == 0xff && below) {
                    n -= 1;
                } else {
                    break;
                }
            }
            f.extend_from_slice(&[0x8a, n as u8]);
            f.extend_from_slice(&bytes[..n]);
        }
    }

    fn value(&mut self, copy: usize, v: Value, shift: i128) -> Result<(), String> {
        match v {
            Value::None => self.frame.push(b'N'),
            Value::Bool(b) => self.frame.push(if b { 0x88 } else { 0x89 }),
            Value::Int(_) | Value::BigInt(_) => {
                let n = self.p.int(v).ok_or("an int")?;
                self.int(n + shift)
            }
            Value::Float(x) => {
                self.frame.push(b'G');
                self.frame.extend_from_slice(&x.to_be_bytes());
            }
            Value::Str(_) | Value::Bytes(_) => {
                let key = self.key(copy, v);
                if self.get(key) {
                    return Ok(());
                }
                let (bytes, op) = match v {
                    Value::Str(_) => (self.p.str_bytes(v).ok_or("a str")?, [0x8c, b'X', 0x8d]),
                    _ => (self.p.bytes(v).ok_or("a bytes")?, [b'C', b'B', 0x8e]),
                };
                if bytes.len() < 256 {
                    self.frame.extend_from_slice(&[op[0], bytes.len() as u8]);
                } else if let Ok(n) = u32::try_from(bytes.len()) {
                    self.frame.push(op[1]);
                    self.frame.extend_from_slice(&n.to_le_bytes());
                } else {
                    self.frame.push(op[2]);
                    self.frame.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                }
                self.frame.extend_from_slice(bytes);
                self.memoize(key);
            }
            Value::List(_) | Value::Dict(_) => {
                let key = self.key(copy, v);
                if self.get(key) {
                    return Ok(());
                }
                let items: Vec<Value> = match v {
                    Value::List(_) => self.p.items(v).unwrap_or(&[]).to_vec(),
                    _ => {
                        self.p.entries(v).unwrap_or(&[]).iter().flat_map(|&(k, x)| [k, x]).collect()
                    }
                };
                let (empty, per, one, many) = if let Value::List(_) = v {
                    (b']', 1, b'a', b'e')
                } else {
                    (b'}', 2, b's', b'u')
                };
                self.frame.push(empty);
                self.memoize(key);
                self.batches(copy, &items, per, one, many)?;
            }
            Value::Tuple(_) => {
                let key = self.key(copy, v);
                if self.get(key) {
                    return Ok(());
                }
                let items = self.p.items(v).unwrap_or(&[]).to_vec();
                if items.is_empty() {
                    self.frame.push(b')');
                    return Ok(());
                }
                if items.len() > 3 {
                    self.frame.push(b'(');
                }
                for &x in &items {
                    self.value(copy, x, 0)?;
                }
                // A tuple that contains itself was memoized while its items were written.
                if self.get(key) {
                    return Ok(());
                }
                self.frame.push([b't', 0x85, 0x86, 0x87].get(items.len()).copied().unwrap_or(b't'));
                self.memoize(key);
            }
            other => return Err(format!("cannot write {}", other.a_type_name())),
        }
        self.maybe_commit();
        Ok(())
    }

    /// A container's items after its `EMPTY_LIST`/`EMPTY_DICT`: batches of `BATCH` (one item:
    /// `APPEND`/`SETITEM`, as CPython writes it).
    fn batches(
        &mut self,
        copy: usize,
        items: &[Value],
        per: usize,
        one: u8,
        many: u8,
    ) -> Result<(), String> {
        if items.len() == per {
            for &x in items {
                self.value(copy, x, 0)?;
            }
            self.frame.push(one);
            return Ok(());
        }
        for batch in items.chunks(BATCH * per) {
            self.frame.push(b'(');
            for &x in batch {
                self.value(copy, x, 0)?;
            }
            self.frame.push(many);
        }
        Ok(())
    }

    /// The root dict, with each device's entries written `copies` times.
    fn write_root(
        &mut self,
        root: Value,
        traces: Value,
        lists: &[Value],
        copies: usize,
        span: i128,
    ) -> Result<(), String> {
        let pairs = self.p.entries(root).ok_or("the root is not a dict")?.to_vec();
        self.frame.push(b'}');
        self.memoize(self.key(0, root));
        self.frame.push(b'(');
        for (k, v) in pairs {
            self.value(0, k, 0)?;
            if v != traces {
                self.value(0, v, 0)?;
                continue;
            }
            self.frame.push(b']');
            self.memoize(self.key(0, traces));
            let one = lists.len() == 1;
            if !one {
                self.frame.push(b'(');
            }
            for &list in lists {
                self.frame.push(b']');
                self.memoize(self.key(0, list));
                let entries = self.p.items(list).unwrap_or(&[]).to_vec();
                let all = (0..copies).flat_map(|c| entries.iter().map(move |&e| (c, e)));
                let all: Vec<(usize, Value)> = all.collect();
                if let [(c, e)] = all[..] {
                    self.entry(c, e, 0)?;
                    self.frame.push(b'a');
                }
                for batch in all.chunks(BATCH).filter(|_| all.len() != 1) {
                    self.frame.push(b'(');
                    for &(c, e) in batch {
                        self.entry(c, e, span * c as i128)?;
                    }
                    self.frame.push(b'e');
                }
                self.maybe_commit();
            }
            self.frame.push(if one { b'a' } else { b'e' });
            self.maybe_commit();
        }
        self.frame.push(b'u');
        Ok(())
    }

    /// One trace entry in repetition `copy`, its `time_us` moved by `shift`.
    fn entry(&mut self, copy: usize, e: Value, shift: i128) -> Result<(), String> {
        let key = self.key(copy, e);
        if self.get(key) {
            return Ok(());
        }
        let pairs = self.p.entries(e).ok_or("a trace entry is not a dict")?.to_vec();
        self.frame.push(b'}');
        self.memoize(key);
        self.frame.push(b'(');
        for (k, v) in pairs {
            self.value(copy, k, 0)?;
            let shift = if self.p.is_str(k, "time_us") { shift } else { 0 };
            self.value(copy, v, shift)?;
        }
        self.frame.push(b'u');
        self.maybe_commit();
        Ok(())
    }
}
