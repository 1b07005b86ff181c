//! A protocol-4 pickle encoder for plain data, the way CPython's `pickle.dump` writes it
//! (`Lib/pickle.py`, `_Pickler.save_*`), minus framing, which protocol 4 makes optional.
//!
//! The caller drives it like a tiny stack machine: open a dict, write key/value pairs, close it.
//! Containers are written as `EMPTY_DICT`/`EMPTY_LIST`, `MEMOIZE`, then batches of at most 1000
//! items (`MARK … SETITEMS` / `MARK … APPENDS`), as CPython batches them, so the item count is
//! never needed in advance. The batch limit matters beyond Python: PyTorch's web viewer
//! (`torch/utils/viz/MemoryViz.js`, which has its own small unpickler for protocols 2–4 and the
//! opcodes used here) applies each batch with one spread call, which fails for very large batches.
//! Repeated strings (dict keys, action names) are memoized once and referenced with `BINGET`,
//! which keeps files small and is what Python does for shared objects.

use std::collections::HashMap;

/// The items CPython writes per `APPENDS`/`SETITEMS` batch (`_BATCHSIZE`).
const BATCH: usize = 1000;

/// Writes a protocol-4 pickle into a byte buffer.
#[derive(Debug)]
pub struct Encoder {
    out: Vec<u8>,
    /// Per open container: its closing opcode and the values written in its current batch.
    open: Vec<(u8, usize)>,
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
        Encoder { out: vec![0x80, 4], open: Vec::new(), strings: HashMap::new(), memo_len: 0 }
    }

    /// Ends the pickle with `STOP` and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        debug_assert!(self.open.is_empty(), "unclosed container");
        self.out.push(b'.');
        self.out
    }

    /// Counts one finished value in the innermost open container and ends a full batch.
    #[inline]
    fn wrote(&mut self) {
        if let Some((op, n)) = self.open.last_mut() {
            *n += 1;
            // A dict's batch holds BATCH key/value pairs.
            let limit = if *op == b'u' { 2 * BATCH } else { BATCH };
            if *n == limit {
                *n = 0;
                let op = *op;
                self.out.extend_from_slice(&[op, b'(']);
            }
        }
    }

    fn open(&mut self, empty_op: u8, close_op: u8) {
        self.out.push(empty_op);
        self.out.push(0x94); // MEMOIZE, as CPython does for every container
        self.memo_len += 1;
        self.out.push(b'(');
        self.open.push((close_op, 0));
    }

    fn close(&mut self) {
        debug_assert!(!self.open.is_empty(), "close without open");
        if let Some((op, _)) = self.open.pop() {
            self.out.push(op);
        }
        self.wrote();
    }

    /// Starts a `dict`; follow with alternating keys and values, then [`Encoder::end_dict`].
    pub fn begin_dict(&mut self) {
        self.open(b'}', b'u');
    }

    /// Ends the innermost dict.
    pub fn end_dict(&mut self) {
        self.close();
    }

    /// Starts a `list`; follow with its items, then [`Encoder::end_list`].
    pub fn begin_list(&mut self) {
        self.open(b']', b'e');
    }

    /// Ends the innermost list.
    pub fn end_list(&mut self) {
        self.close();
    }

    /// Writes an `int`.
    pub fn int(&mut self, v: i128) {
        self.int_uncounted(v);
        self.wrote();
    }

    /// The opcodes of an `int`, without counting it as a container item.
    fn int_uncounted(&mut self, v: i128) {
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
        self.wrote();
    }

    /// Writes `True` or `False`.
    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { 0x88 } else { 0x89 });
        self.wrote();
    }

    /// Writes `None`.
    pub fn none(&mut self) {
        self.out.push(b'N');
        self.wrote();
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
        self.wrote();
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
    pub(crate) fn pair(&mut self, a: i128, b: i128) {
        self.int_uncounted(a);
        self.int_uncounted(b);
        self.out.push(0x86); // TUPLE2
        self.out.push(0x94);
        self.memo_len += 1;
        self.wrote();
    }

    /// Starts remembering the value about to be written, so [`Encoder::reuse`] can refer to it
    /// (used for frame lists shared by many entries). Returns the memo index it will have: the
    /// container opened next takes it.
    pub(crate) fn next_memo(&self) -> u32 {
        self.memo_len
    }

    /// Writes a reference to a container memoized earlier (its [`Encoder::next_memo`] index).
    pub(crate) fn reuse(&mut self, memo: u32) {
        self.get(memo);
        self.wrote();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::pickle::{decode, Value};

    #[test]
    fn batches_hold_at_most_1000_items() {
        let mut e = Encoder::new();
        e.begin_list();
        for _ in 0..2500 {
            e.none();
        }
        e.end_list();
        let bytes = e.finish();
        // PROTO 4, EMPTY_LIST, MEMOIZE, then 3 batches: ( N*1000 e ( N*1000 e ( N*500 e, STOP.
        let body = &bytes[4..bytes.len() - 1];
        assert_eq!(body.iter().filter(|&&b| b == b'(').count(), 3);
        assert_eq!(body.iter().filter(|&&b| b == b'e').count(), 3);
        assert_eq!(&bytes[4..5], b"(");
        assert_eq!(bytes[4 + 1001], b'e');
        let p = decode(&bytes).unwrap();
        assert_eq!(p.items(p.root()).unwrap().len(), 2500);
    }

    #[test]
    fn dict_batches_count_pairs_and_tuples_count_once() {
        let mut e = Encoder::new();
        e.begin_dict();
        for i in 0..1500 {
            e.int(i);
            e.pair(i, -i);
        }
        e.end_dict();
        let bytes = e.finish();
        let p = decode(&bytes).unwrap();
        let entries = p.entries(p.root()).unwrap();
        assert_eq!(entries.len(), 1500);
        let (k, v) = entries[1499];
        assert_eq!(k, Value::Int(1499));
        let t = p.items(v).unwrap();
        assert_eq!(t, &[Value::Int(1499), Value::Int(-1499)]);
    }

    #[test]
    fn ints_use_the_shortest_opcode() {
        let mut e = Encoder::new();
        e.begin_list();
        for v in [0, 255, 256, 65535, 65536, -1, 1 << 40, (1 << 63) + 5, -(1 << 63)] {
            e.int(v);
        }
        e.end_list();
        let bytes = e.finish();
        let p = decode(&bytes).unwrap();
        let got: Vec<_> = p.items(p.root()).unwrap().iter().map(|&v| p.int(v).unwrap()).collect();
        assert_eq!(got, [0, 255, 256, 65535, 65536, -1, 1 << 40, (1 << 63) + 5, -(1 << 63)]);
        // 2^40 is LONG1 with 6 bytes; 2^63 + 5 needs 9 (a zero sign byte); -2^63 needs 8.
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert!(hex.contains("8a06000000000001"), "{hex}");
        assert!(hex.contains("8a09050000000000008000"), "{hex}");
        assert!(hex.contains("8a080000000000000080"), "{hex}");
    }
}
