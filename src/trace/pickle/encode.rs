//! A protocol-4 pickle encoder for plain data, the way CPython's `pickle.dump` writes it
//! (`Lib/pickle.py`, `_Pickler.save_*`), minus framing, which protocol 4 makes optional.
//!
//! The caller drives it like a tiny stack machine: open a dict, write key/value pairs, close it.
//! Containers are written as `EMPTY_DICT`/`EMPTY_LIST`, `MEMOIZE`, `MARK`, the items, then one
//! `SETITEMS`/`APPENDS` (CPython batches 1000 items at a time; TorchScript's pickler and the
//! unpickler accept any batch size), so the item count is never needed in advance. Repeated strings (dict keys, action names) are memoized once and
//! referenced with `BINGET`, which keeps files small and is what Python does for shared objects.

use std::collections::HashMap;

/// Writes a protocol-4 pickle into a byte buffer.
#[derive(Debug)]
pub struct Encoder {
    out: Vec<u8>,
    /// Containers opened and not yet closed.
    depth: usize,
    strings: HashMap<String, u32>,
    memo_len: u32,
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new()
    }
}

impl Encoder {
    /// A new pickle: `PROTO 4`.
    pub fn new() -> Encoder {
        Encoder { out: vec![0x80, 4], depth: 0, strings: HashMap::new(), memo_len: 0 }
    }

    /// Ends the pickle with `STOP` and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        debug_assert!(self.depth == 0, "unclosed container");
        self.out.push(b'.');
        self.out
    }

    fn open(&mut self, empty_op: u8) {
        self.out.push(empty_op);
        self.out.push(0x94); // MEMOIZE, as CPython does for every container
        self.memo_len += 1;
        self.out.push(b'(');
        self.depth += 1;
    }

    fn close(&mut self, op: u8) {
        debug_assert!(self.depth > 0, "close without open");
        self.out.push(op);
        self.depth = self.depth.saturating_sub(1);
    }

    /// Starts a `dict`; follow with alternating keys and values, then [`Encoder::end_dict`].
    pub fn begin_dict(&mut self) {
        self.open(b'}');
    }

    /// Ends the innermost dict.
    pub fn end_dict(&mut self) {
        self.close(b'u');
    }

    /// Starts a `list`; follow with its items, then [`Encoder::end_list`].
    pub fn begin_list(&mut self) {
        self.open(b']');
    }

    /// Ends the innermost list.
    pub fn end_list(&mut self) {
        self.close(b'e');
    }

    /// Writes an `int`.
    pub fn int(&mut self, v: i128) {
        if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if let Ok(i) = i32::try_from(v) {
            self.out.push(b'J');
            self.out.extend_from_slice(&i.to_le_bytes());
        } else {
            // LONG1: the shortest little-endian two's complement that keeps the sign.
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let top = bytes[n - 1];
                let below_sign = bytes[n - 2] & 0x80 != 0;
                if (top == 0 && !below_sign) || (top == 0xff && below_sign) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    /// Writes a `float`.
    pub fn float(&mut self, v: f64) {
        self.out.push(b'G');
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    /// Writes `True` or `False`.
    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { 0x88 } else { 0x89 });
    }

    /// Writes `None`.
    pub fn none(&mut self) {
        self.out.push(b'N');
    }

    /// Writes a `str`, memoized: a string written before is a `BINGET` of the first copy.
    pub fn str(&mut self, s: &str) {
        if let Some(&i) = self.strings.get(s) {
            self.get(i);
        } else {
            self.str_unshared(s);
            self.out.push(0x94);
            self.strings.insert(s.to_string(), self.memo_len);
            self.memo_len += 1;
        }
    }

    fn str_unshared(&mut self, s: &str) {
        let b = s.as_bytes();
        if b.len() < 256 {
            self.out.extend_from_slice(&[0x8c, b.len() as u8]);
        } else if let Ok(n) = u32::try_from(b.len()) {
            self.out.push(b'X');
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            self.out.push(0x8d);
            self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        }
        self.out.extend_from_slice(b);
    }

    fn get(&mut self, i: u32) {
        if i < 256 {
            self.out.extend_from_slice(&[b'h', i as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&i.to_le_bytes());
        }
    }

    /// Writes `(a, b)`: a two-int tuple (`segment_pool_id`).
    pub fn pair(&mut self, a: i128, b: i128) {
        self.int(a);
        self.int(b);
        self.out.push(0x86); // TUPLE2
        self.out.push(0x94);
        self.memo_len += 1;
    }

    /// Starts remembering the value about to be written, so [`Encoder::reuse`] can refer to it
    /// (used for frame lists shared by many entries). Returns the memo index it will have: the
    /// container opened next takes it.
    pub fn next_memo(&self) -> u32 {
        self.memo_len
    }

    /// Writes a reference to a container memoized earlier (its [`Encoder::next_memo`] index).
    pub fn reuse(&mut self, memo: u32) {
        self.get(memo);
    }
}
