//! Streamed decoding: the items of `root[key][d]` go to a [`Sink`] as they complete, and what
//! they were built from is discarded.
//!
//! **Recognising the lists.** Python writes a dict's items right after it (`EMPTY_DICT MEMOIZE
//! MARK key value key value … SETITEMS`), and a list's the same way (`MARK … APPENDS`, or one
//! `APPEND`), so while `root[key][d]` is being filled the value stack is exactly `root, (key,
//! value pairs…), key, list of lists, (earlier lists…), list d, (its items…)` with marks only
//! where those batches start. [`Decoder::device_list_at`] checks that shape (a few comparisons,
//! made when a list is created and when one is appended to); anything else is decoded as usual.
//!
//! **Discarding.** When such a list is pushed, and after each batch of its items is converted, a
//! *region* begins: the fill of every arena and of the string table is marked. At the next
//! `APPENDS`/`APPEND` to the list, the items on the stack are handed to the sink, the stack is
//! cut back, and everything built since the mark is dropped: the marked arenas are truncated,
//! so memory stays at one batch. What could still reach the dropped objects is the memo, so the
//! memo entries stored in the region are looked at first: a string the sink [`keeps`] (a dict
//! key or an action name, which later items refer back to) is copied out once per distinct
//! content, a large integer is copied, and everything else becomes [`Value::Dropped`] at no cost
//! (the memo holds only the survivors, by index; a missing index reads as dropped). Container
//! indices past the mark are handed out again afterwards, which is why a sink must not key
//! anything on a dropped container's index.
//!
//! A region is given up, keeping what it built, whenever a container from before it is changed
//! (the new items could point into the region) or the stack below the list no longer matches,
//! so a discard never leaves a dangling index; a memo store out of order while streaming, or a
//! `BINGET` of a list whose items were already converted, is refused ([`Stop::Refused`]), as is
//! anything the sink cannot convert without what was dropped.
//!
//! [`keeps`]: Sink::keeps

use super::arena::Mark;
use super::decode::Decoder;
use super::input::Input;
use super::{Pickle, Value};
use crate::error::Error;
use crate::trace::AddrMap;
use std::collections::HashMap;

/// The memo entries of a streamed decode from index `base` to the last discard that survived
/// it, found by index in O(1) (every `BINGET` of a frame dict or a dict key stored while
/// streaming looks here). A bit per index says whether it survived, and each block of 64
/// indices knows how many survivors came before it, so the survivor's slot is that count plus
/// the bits below it in its block: under half a byte an index, besides the survivors
/// themselves. Survivors are added in increasing index order. Converted objects
/// ([`Value::Handle`], one per frame list where frames are kept) are apart, 4 bytes each.
#[derive(Debug, Default)]
pub(super) struct Past {
    base: u32,
    kept: Ranked<Value>,
    handles: Ranked<u32>,
}

impl From<u32> for Past {
    /// The table for entries from `base` on.
    fn from(base: u32) -> Past {
        Past { base, ..Past::default() }
    }
}

impl Past {
    /// Entry `idx` (at least `base`): what survived, the sink's handle, or [`Value::Dropped`].
    #[inline]
    pub(super) fn get(&self, idx: u32) -> Value {
        let off = idx.wrapping_sub(self.base) as usize;
        if let Some(v) = self.kept.get(off) {
            return v;
        }
        match self.handles.get(off) {
            Some(h) => Value::Handle(h),
            None => Value::Dropped,
        }
    }

    /// Entry `idx` survives as `v`; `idx` is above every index added so far.
    pub(super) fn push(&mut self, idx: u32, v: Value) {
        match v {
            Value::Dropped => {}
            Value::Handle(h) => self.handles.push(idx.wrapping_sub(self.base) as usize, h),
            v => self.kept.push(idx.wrapping_sub(self.base) as usize, v),
        }
    }
}

/// Values at some offsets, added in increasing order, found by offset in O(1) (see [`Past`]).
#[derive(Debug)]
struct Ranked<T> {
    /// Per block of 64 offsets: which have a value.
    bits: Vec<u64>,
    /// Per block: the values in the blocks before it.
    ranks: Vec<u32>,
    values: Vec<T>,
}

impl<T> Default for Ranked<T> {
    fn default() -> Self {
        Ranked { bits: Vec::new(), ranks: Vec::new(), values: Vec::new() }
    }
}

impl<T: Copy> Ranked<T> {
    #[inline]
    fn get(&self, off: usize) -> Option<T> {
        let (block, bit) = (off / 64, 1u64 << (off % 64));
        let bits = *self.bits.get(block)?;
        if bits & bit == 0 {
            return None;
        }
        let slot = *self.ranks.get(block)? as usize + (bits & (bit - 1)).count_ones() as usize;
        self.values.get(slot).copied()
    }

    /// Adds `v` at `off`, which is above every offset added so far (one that is not is ignored:
    /// it would break the ranks).
    fn push(&mut self, off: usize, v: T) {
        let (block, bit) = (off / 64, 1u64 << (off % 64));
        while self.bits.len() <= block {
            self.bits.push(0);
            self.ranks.push(self.values.len() as u32);
        }
        if self.bits[block] >= bit || self.bits.len() > block + 1 {
            debug_assert!(false, "memo survivors out of order");
            return;
        }
        self.bits[block] |= bit;
        self.values.push(v);
    }
}

/// Why a streamed decode stopped.
#[derive(Debug)]
pub enum Stop {
    /// The input is not a valid (plain-data) pickle, or the sink found an error in it.
    Error(Error),
    /// The stream refers back, at byte `at`, to something discarded, in a way that matters:
    /// decoding the whole input at once ([`super::decode`]) answers it.
    Refused {
        /// The byte offset of the opcode (or object) that needed what was discarded.
        at: u64,
        /// What it needed, for a message.
        why: String,
    },
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Error(e)
    }
}

/// What a streamed decode hands its items to.
pub trait Sink {
    /// Converts `items`, the next complete items of list `list`, which is `root[key][device]`.
    /// They are discarded afterwards (`p` still has them now).
    fn items(
        &mut self,
        p: &Pickle<'_>,
        device: usize,
        list: Value,
        items: &[Value],
    ) -> Result<(), Stop>;

    /// Whether every memoized string with these bytes must survive the discard of the objects
    /// that were built with it, because a later reference to any of them would matter (a dict
    /// key the sink reads, say). Besides these, the first string with each content is kept
    /// (up to a few MiB in all): Python shares a string object by memoizing it once, so
    /// a later part of the file refers back to that one (PyTorch's empty `user_metadata` string
    /// is also the empty `PYTORCH_CUDA_ALLOC_CONF`), while the fresh copies that every trace
    /// entry makes of the same text (`'N/A'`) are never referred to again. Any other string
    /// reads as [`Value::Dropped`] afterwards.
    fn keeps(&self, bytes: &[u8]) -> bool;

    /// What a memoized container `v` that is about to be discarded becomes, when the sink
    /// made something of it that a later reference needs (say, the interned stack of a frame
    /// list): a handle, which later reads as [`Value::Handle`]; `None` drops it
    /// ([`Value::Dropped`]).
    fn keep(&mut self, p: &Pickle<'_>, v: Value) -> Option<u32> {
        let _ = (p, v);
        None
    }

    /// The containers from index `seqs` (lists, tuples, sets) and `dicts` (dicts) on were
    /// discarded; the next ones take their indices again, so anything the sink knows by those
    /// indices must be forgotten.
    fn discarded(&mut self, seqs: usize, dicts: usize) {
        let _ = (seqs, dicts);
    }
}

/// A list whose items were streamed to the sink.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamedList {
    /// The list (it holds none of its streamed items).
    pub(crate) list: Value,
    /// Its index in `within` when it was streamed.
    pub(crate) device: usize,
    /// The list of lists (`root[key]`) it was an item of.
    pub(crate) within: Value,
}

/// The result of a streamed decode.
#[derive(Debug)]
pub struct Streamed {
    /// The pickle without the streamed items.
    pub(crate) pickle: Pickle<'static>,
    /// The lists whose items went to the sink, in the order they were first streamed. The
    /// caller checks they are where they were when the pickle ended (`root[key][device]`).
    pub(crate) lists: Vec<StreamedList>,
}

/// The objects built since a list was pushed or its last batch was converted.
#[derive(Clone, Copy, Debug)]
pub(super) struct Region {
    /// The list the region's items are for.
    list: u32,
    /// The stack height with the list on top.
    height: usize,
    seqs: Mark,
    dicts: Mark,
    strs: usize,
    bigs: usize,
}

impl Region {
    /// Whether `v` was built in the region.
    fn owns(&self, v: Value) -> bool {
        match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => i as usize >= self.seqs.containers,
            Value::Dict(i) => i as usize >= self.dicts.containers,
            Value::Str(i) | Value::Bytes(i) => i as usize >= self.strs,
            Value::BigInt(i) => i as usize >= self.bigs,
            _ => false,
        }
    }
}

/// The most bytes of strings kept only because they were the first with their content (see
/// [`Sink::keeps`]): a bound on what a file of ever-new strings can make streaming hold.
const KEEP_BYTES: usize = 4 << 20;

/// The streaming state of a [`Decoder`].
pub(super) struct Streaming<'s> {
    key: &'static str,
    sink: &'s mut dyn Sink,
    region: Option<Region>,
    lists: Vec<StreamedList>,
    /// `lists` by list index (a multiplicative hash: at most one list per device).
    ids: AddrMap<usize>,
    /// Strings copied out of discarded regions, by content, `bytes` then `str`: each is kept
    /// once.
    kept: [HashMap<Box<[u8]>, u32>; 2],
    /// The bytes of the strings in `kept`, up to [`KEEP_BYTES`].
    kept_bytes: usize,
    /// Where the current region first met a discarded object (`BINGET`), for a refusal.
    dropped_at: Option<u64>,
    /// The memo was not in the one-index-after-another shape when streaming would have begun
    /// (hand-made pickles only): decode everything as a whole.
    off: bool,
}

/// A memo entry that survives a discard.
enum Survivor {
    Same(Value),
    Text(bool, Box<[u8]>),
    Big(i128),
    /// What the sink made of a container ([`Sink::keep`]).
    Handle(u32),
}

impl<'s> Streaming<'s> {
    pub(super) fn new(key: &'static str, sink: &'s mut dyn Sink) -> Self {
        Streaming {
            key,
            sink,
            region: None,
            lists: Vec::new(),
            ids: AddrMap::default(),
            kept: [HashMap::new(), HashMap::new()],
            kept_bytes: 0,
            dropped_at: None,
            off: false,
        }
    }

    pub(super) fn finish(self) -> Vec<StreamedList> {
        self.lists
    }
}

impl<'a, I: Input<'a>> Decoder<'a, '_, I> {
    fn refused(&self, why: String) -> Stop {
        Stop::Refused { at: self.op_at, why }
    }

    /// If the stack holds `root, …, key, lists, (earlier lists…), list` with `list` at `j` (see
    /// the module docs), the list's index in `lists` and `lists`' container index.
    fn device_list_at(&self, j: usize, key: &str) -> Option<(usize, u32)> {
        let st = &self.stack;
        let Some(Value::List(_)) = st.get(j) else { return None };
        if self.marks.iter().any(|&m| m > j) {
            return None;
        }
        let (dt, offset) = match self.marks.last() {
            Some(&mk) if mk >= 3 && matches!(st.get(mk - 1), Some(Value::List(_))) => {
                (mk - 1, j - mk)
            }
            _ => (j.checked_sub(1)?, 0),
        };
        let Some(&Value::List(within)) = st.get(dt) else { return None };
        let k = dt.checked_sub(1)?;
        if k == 0 || (k - 1) % 2 != 0 || !self.out.is_str(st[k], key) {
            return None;
        }
        if !matches!(st.first(), Some(Value::Dict(_))) {
            return None;
        }
        // Marks only where the root's pairs (1) and the lists' items (dt + 1) start.
        if self.marks.iter().any(|&m| m != 1 && m != dt + 1)
            || (k != 1 && self.marks.first() != Some(&1))
        {
            return None;
        }
        let before = self.out.seqs.get(within as usize).map_or(0, <[Value]>::len);
        Some((before + offset, within))
    }

    /// A list was just pushed: when it is one of the streamed lists, a region begins.
    pub(super) fn list_pushed(&mut self) {
        let Some(s) = &self.stream else { return };
        if s.off {
            return;
        }
        let j = self.stack.len() - 1;
        let Value::List(list) = self.stack[j] else { return };
        if self.device_list_at(j, s.key).is_none() {
            return;
        }
        let memo = &mut self.memo;
        if !memo.streaming {
            if !memo.sparse.is_empty() || memo.dense.len() != memo.count as usize {
                if let Some(s) = &mut self.stream {
                    s.off = true;
                }
                return;
            }
            memo.streaming = true;
            memo.recent_start = memo.count;
            memo.past = Past::from(memo.count);
        }
        self.end_region();
        self.begin_region(list, j + 1);
    }

    fn begin_region(&mut self, list: u32, height: usize) {
        let region = Region {
            list,
            height,
            seqs: self.out.seqs.mark(),
            dicts: self.out.dicts.mark(),
            strs: self.out.strs.len(),
            bigs: self.out.bigs.len(),
        };
        if let Some(s) = &mut self.stream {
            s.region = Some(region);
            s.dropped_at = None;
        }
    }

    /// Gives up the current region, keeping everything it built and every memo entry.
    pub(super) fn end_region(&mut self) {
        let Some(s) = &mut self.stream else { return };
        if s.region.take().is_none() {
            return;
        }
        let memo = &mut self.memo;
        let start = memo.recent_start;
        for (k, v) in memo.recent.drain(..).enumerate() {
            memo.past.push(start + k as u32, v);
        }
        memo.recent_start = memo.count;
    }

    /// Whether appending to list `id` goes to the sink.
    #[inline]
    pub(super) fn streams_into(&self, id: u32) -> bool {
        match &self.stream {
            Some(s) => s.region.is_some_and(|r| r.list == id) || s.ids.contains_key(&(id as u64)),
            None => false,
        }
    }

    /// Container `id` (a list, tuple or set when `seq`, else a dict) is about to change: a
    /// container from before the region gives the region up.
    #[inline]
    pub(super) fn guard(&mut self, id: usize, seq: bool) {
        if let Some(Some(r)) = self.stream.as_ref().map(|s| s.region) {
            let mark = if seq { r.seqs } else { r.dicts };
            if id < mark.containers {
                self.end_region();
            }
        }
    }

    /// Pushes a value fetched from the memo, refusing a streamed list (its items are gone).
    #[inline]
    pub(super) fn push_got(&mut self, v: Value) -> Result<(), Stop> {
        if let Value::List(id) = v {
            if self.streams_into(id) {
                return Err(self.refused(format!(
                    "the pickle refers back to list {id}, whose items were streamed and discarded"
                )));
            }
        }
        if v == Value::Dropped {
            self.met_dropped(self.op_at);
        }
        self.stack.push(v);
        Ok(())
    }

    /// The opcode at byte `at` pushed a discarded object: the region remembers the first
    /// place, for a refusal.
    #[inline]
    pub(super) fn met_dropped(&mut self, at: u64) {
        if let Some(s) = &mut self.stream {
            s.dropped_at.get_or_insert(at);
        }
    }

    /// A memo store while streaming: only the next index, or one stored since the last discard.
    pub(super) fn memo_put_streaming(&mut self, idx: u32, v: Value) -> Result<(), Stop> {
        let memo = &mut self.memo;
        if idx == memo.count && idx < u32::MAX {
            memo.recent.push(v);
            memo.count += 1;
            return Ok(());
        }
        if idx >= memo.recent_start && idx < memo.count {
            memo.recent[(idx - memo.recent_start) as usize] = v;
            return Ok(());
        }
        Err(self.refused(format!(
            "memo entry {idx} is stored out of order while items are being streamed"
        )))
    }

    /// Hands `stack[base..]`, the new items of the list at `base - 1`, to the sink; then drops
    /// them and what they were built from, and begins the next region.
    pub(super) fn convert(&mut self, base: usize) -> Result<(), Stop> {
        let j = base - 1;
        let Value::List(id) = self.stack[j] else { return Ok(()) };
        let Some(s) = &self.stream else { return Ok(()) };
        let shape = self.device_list_at(j, s.key);
        let known = s.ids.get(&(id as u64)).map(|&k| s.lists[k]);
        let (device, within) = match (shape, known) {
            (Some((device, within)), None) => (device, within),
            (Some((device, within)), Some(l))
                if l.device == device && l.within == Value::List(within) =>
            {
                (device, within)
            }
            _ => {
                return Err(self.refused(format!(
                    "list {id}, whose items are being streamed, is appended to out of place"
                )))
            }
        };
        let Some(s) = &mut self.stream else { return Ok(()) };
        if known.is_none() {
            s.ids.insert(id as u64, s.lists.len());
            let list = StreamedList { list: Value::List(id), device, within: Value::List(within) };
            s.lists.push(list);
        }
        let items = s.sink.items(&self.out, device, Value::List(id), &self.stack[base..]);
        if let Err(Stop::Refused { at, why }) = items {
            // Where the stream referred back to what was discarded, when it did.
            return Err(Stop::Refused { at: s.dropped_at.unwrap_or(at), why });
        }
        items?;
        self.stack.truncate(base);
        match s.region {
            Some(r)
                if r.list == id && r.height == base && !self.stack.iter().any(|&v| r.owns(v)) =>
            {
                s.region = None;
                self.discard(r);
            }
            _ => self.end_region(),
        }
        self.begin_region(id, base);
        Ok(())
    }

    /// Drops everything region `r` built, keeping the memo entries that must survive.
    fn discard(&mut self, r: Region) {
        let Some(s) = &mut self.stream else { return };
        let memo = &mut self.memo;
        let mut survivors = Vec::new();
        // Strings kept in this pass for being the first with their content.
        let mut first: std::collections::HashSet<(bool, &[u8])> = Default::default();
        for (k, &v) in memo.recent.iter().enumerate() {
            let idx = memo.recent_start + k as u32;
            let survivor = match v {
                Value::Dropped => continue,
                v if !r.owns(v) => Survivor::Same(v),
                Value::Str(i) | Value::Bytes(i) => {
                    let is_str = matches!(v, Value::Str(_));
                    let bytes = self.out.strs.get(i as usize).unwrap_or_default();
                    let new = !s.kept[is_str as usize].contains_key(bytes)
                        && s.kept_bytes + bytes.len() <= KEEP_BYTES
                        && first.insert((is_str, bytes));
                    if new {
                        s.kept_bytes += bytes.len();
                    } else if !s.sink.keeps(bytes) {
                        continue;
                    }
                    Survivor::Text(is_str, Box::from(bytes))
                }
                Value::BigInt(i) => match self.out.bigs.get(i as usize) {
                    Some(&b) => Survivor::Big(b),
                    None => continue,
                },
                v => match s.sink.keep(&self.out, v) {
                    Some(h) => Survivor::Handle(h),
                    None => continue,
                },
            };
            // Added to `past` below, all in memo order: a handle met again and memoized again
            // (`Same`) must not go in after a later entry's new handle.
            survivors.push((idx, survivor));
        }
        drop(first);
        self.out.seqs.rollback(r.seqs);
        self.out.dicts.rollback(r.dicts);
        self.out.strs.truncate(r.strs);
        self.out.bigs.truncate(r.bigs);
        s.sink.discarded(r.seqs.containers, r.dicts.containers);
        for (idx, survivor) in survivors {
            let v = match survivor {
                Survivor::Same(v) => v,
                Survivor::Handle(h) => Value::Handle(h),
                Survivor::Big(b) => {
                    self.out.bigs.push(b);
                    Value::BigInt((self.out.bigs.len() - 1) as u32)
                }
                Survivor::Text(is_str, bytes) => {
                    let strs = &mut self.out.strs;
                    let id = *s.kept[is_str as usize].entry(bytes).or_insert_with_key(|b| {
                        strs.bytes_mut().extend_from_slice(b);
                        strs.close_owned();
                        (strs.len() - 1) as u32
                    });
                    if is_str {
                        Value::Str(id)
                    } else {
                        Value::Bytes(id)
                    }
                }
            };
            memo.past.push(idx, v);
        }
        memo.recent.clear();
        memo.recent_start = memo.count;
    }
}

#[cfg(test)]
mod tests {
    use super::super::encode::Encoder;
    use super::super::{decode, decode_stream};
    use super::*;

    /// Records each streamed item as (device, its 'addr'), or refuses a discarded one.
    #[derive(Default)]
    struct Record(Vec<(usize, i128)>);

    impl Sink for Record {
        fn items(
            &mut self,
            p: &Pickle<'_>,
            device: usize,
            _: Value,
            items: &[Value],
        ) -> Result<(), Stop> {
            for &item in items {
                let addr = p.get(item, "addr").and_then(|a| p.int(a));
                let addr = addr.ok_or(Stop::Refused { at: 0, why: "no addr".into() })?;
                self.0.push((device, addr));
            }
            Ok(())
        }
        fn keeps(&self, bytes: &[u8]) -> bool {
            bytes == b"addr"
        }
    }

    /// `{'segments': [], 'device_traces': [[n entries], [], [n entries]], 'x': 1}`.
    fn snapshot(n: i128) -> Vec<u8> {
        let mut e = Encoder::new();
        e.begin_dict();
        e.str("segments");
        e.begin_list();
        e.end_list();
        e.str("device_traces");
        e.begin_list();
        for device in [0, 1, 2] {
            e.begin_list();
            for i in 0..if device == 1 { 0 } else { n } {
                e.begin_dict();
                e.str("addr");
                e.int(device * 1_000_000 + i);
                e.str("note");
                e.str(&format!("entry {i}"));
                e.end_dict();
            }
            e.end_list();
        }
        e.end_list();
        e.str("x");
        e.int(1);
        e.end_dict();
        e.finish()
    }

    #[test]
    fn items_reach_the_sink_in_order_and_are_discarded() {
        let n = 2500;
        let data = snapshot(n);
        let mut sink = Record::default();
        let s = decode_stream(&mut &data[..], "device_traces", &mut sink).unwrap();
        let want: Vec<(usize, i128)> = [0, 2]
            .iter()
            .flat_map(|&d| (0..n).map(move |i| (d, d as i128 * 1_000_000 + i)))
            .collect();
        assert_eq!(sink.0, want);
        let p = &s.pickle;
        let lists: Vec<Value> = s.lists.iter().map(|l| l.list).collect();
        let traces = p.get(p.root(), "device_traces").unwrap();
        let items = p.items(traces).unwrap();
        // The encoder writes MARK … APPENDS even for the empty list: all three were streamed.
        assert_eq!(lists, items);
        assert!(s.lists.iter().enumerate().all(|(d, l)| l.device == d));
        assert!(s.lists.iter().all(|l| l.within == traces && p.items(l.list) == Some(&[])));
        assert_eq!(p.get(p.root(), "x"), Some(Value::Int(1)));
        // Nothing of the 5000 entries is left: the root, 'segments', the lists; the first
        // text of each content ('entry 0' ...) is kept, at most once each.
        assert!(p.dicts.len() == 1 && p.seqs.len() == 5, "{} {}", p.dicts.len(), p.seqs.len());
        assert!(p.find_dropped(p.root()).is_none());
        // The whole decoder sees the same pickle.
        let w = decode(&data).unwrap();
        assert_eq!(w.items(w.get(w.root(), "device_traces").unwrap()).unwrap().len(), 3);
    }

    #[test]
    fn a_reference_to_a_discarded_item_is_dropped_and_found() {
        // {'device_traces': [[{'addr': 5}]], 'again': <the entry>}: PROTO, EMPTY_DICT, MARK,
        // key, EMPTY_LIST, EMPTY_LIST, EMPTY_DICT, MEMOIZE (0), 'addr', 5, SETITEM, APPEND,
        // APPEND, 'again', BINGET 0, SETITEMS, STOP.
        let mut data = b"\x80\x04}(\x8c\x0ddevice_traces]]}\x94\x8c\x04addrK\x05saa".to_vec();
        data.extend_from_slice(b"\x8c\x05againh\x00u.");
        let mut sink = Record::default();
        let s = decode_stream(&mut &data[..], "device_traces", &mut sink).unwrap();
        assert_eq!(sink.0, [(0, 5)]);
        let p = &s.pickle;
        assert_eq!(p.get(p.root(), "again"), Some(Value::Dropped));
        assert_eq!(p.find_dropped(p.root()), Some(Some(2)), "the root dict holds it");
    }

    #[test]
    fn a_streamed_list_met_again_is_refused() {
        // {'device_traces': [L, L]} where L = [{'addr': 5}] and the second L is BINGET 1.
        let data = b"\x80\x04}(\x8c\x0ddevice_traces](]\x94}\x8c\x04addrK\x05sah\x00eu.";
        let e = decode_stream(&mut &data[..], "device_traces", &mut Record::default()).unwrap_err();
        let at = data.iter().position(|&b| b == b'h').unwrap() as u64;
        assert!(matches!(e, Stop::Refused { at: a, .. } if a == at), "{e:?}");
    }

    #[test]
    fn malformed_streams_fail_as_a_whole_input_does() {
        let mut truncated = snapshot(3);
        truncated.truncate(truncated.len() / 2);
        let long = [b"\x80\x04\x8d".as_slice(), &(1u64 << 62).to_le_bytes(), b"abc."].concat();
        for data in [
            &truncated[..],
            &long,
            b"\x80\x02cos\nsystem\nX\x07\x00\x00\x00echo hi\x85R.",
            b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
            b"\x80\x04h\x05.",
            b"\x80\x04]e.",
            b"\x80\x04K",
            b"\x80\x09.",
            b"",
        ] {
            let whole = decode(data).unwrap_err().to_string();
            match decode_stream(&mut &data[..], "device_traces", &mut Record::default()) {
                Err(Stop::Error(e)) => assert_eq!(e.to_string(), whole),
                other => panic!("{whole}: {other:?}"),
            }
        }
    }

    #[test]
    fn survivors_are_found_by_index_across_blocks() {
        // Entries 1000.. of a memo: every seventh survived as a value, every 64th beyond 1200
        // as a handle, the rest were dropped.
        let mut past = Past::from(1000);
        let kept = |i: u32| i % 7 == 0;
        let handle = |i: u32| !kept(i) && i >= 1200 && i % 64 == 0;
        for i in 1000..1500 {
            if kept(i) {
                past.push(i, Value::Int(i as i64));
            } else if handle(i) {
                past.push(i, Value::Handle(i * 2));
            }
        }
        for i in 1000..1600 {
            let want = match i {
                i if i < 1500 && kept(i) => Value::Int(i as i64),
                i if i < 1500 && handle(i) => Value::Handle(i * 2),
                _ => Value::Dropped,
            };
            assert_eq!(past.get(i), want, "entry {i}");
        }
        // 12 bytes per 64 indices in each table, up to the last survivor.
        assert_eq!(past.kept.bits.len(), 8);
        assert_eq!(past.handles.bits.len(), 8);
    }

    #[test]
    fn deep_nesting_streams_flat() {
        // 9000 lists nested with MARK … LIST: [[[...]]], no recursion.
        let n = 9000;
        let mut data = b"\x80\x04".to_vec();
        data.extend(std::iter::repeat_n(b'(', n));
        data.extend(std::iter::repeat_n(b'l', n));
        data.push(b'.');
        let s = decode_stream(&mut &data[..], "device_traces", &mut Record::default()).unwrap();
        assert_eq!(s.pickle.depth(s.pickle.root(), 1000), 1000);
        assert!(s.pickle.find_dropped(s.pickle.root()).is_none());
    }
}
