//! A [`Pickle`] built from objects already in memory instead of decoded from bytes: the Python
//! package hands the dict `torch.cuda.memory._snapshot()` returns to the snapshot reader this
//! way, so a dict and its pickle file go through the same conversion, checks and limits.
//!
//! Containers are numbered in the order they are begun, and that number stands where a decoded
//! pickle keeps the byte offset of the opcode that built the container
//! (`Pickle::offset_of`): an error the reader reports "at byte N" of such a pickle is about
//! container N, which the builder's caller can name by its key path. Containers dropped with
//! [`Builder::rollback`] (a streamed read drops each batch of trace entries once converted) give
//! their indices to the next ones, not their numbers.

use super::{Pickle, Value};

/// The kinds of sequence a [`Builder`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seq {
    /// A `list`.
    List,
    /// A `tuple`.
    Tuple,
    /// A `set` or `frozenset`.
    Set,
}

/// How full a [`Builder`]'s containers were at one moment ([`Builder::mark`]).
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    seqs: super::arena::Mark,
    dicts: super::arena::Mark,
    number: u64,
}

impl Mark {
    /// Whether `v` is a container begun since the mark.
    pub fn owns(&self, v: Value) -> bool {
        match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => i as usize >= self.seqs.containers,
            Value::Dict(i) => i as usize >= self.dicts.containers,
            _ => false,
        }
    }

    /// The first sequence and dict indices past the mark.
    pub fn containers(&self) -> (usize, usize) {
        (self.seqs.containers, self.dicts.containers)
    }

    /// The number of the first container begun after the mark ([`Builder::containers`] then).
    pub fn number(&self) -> u64 {
        self.number
    }
}

/// Builds a [`Pickle`] value by value. Containers are begun empty (so a container can hold
/// itself, as Python objects can) and filled with [`Builder::extend_seq`] and
/// [`Builder::extend_dict`].
#[derive(Debug, Default)]
pub struct Builder {
    pickle: Pickle<'static>,
    /// Containers begun so far: the next one's number.
    containers: u64,
}

impl Builder {
    /// An empty builder with room for `items` sequence items and `entries` dict entries before
    /// its pools first grow: a caller that can guess the sizes (from the objects it will add,
    /// bounded by its input limit) spares the copies of repeated doubling.
    pub fn with_capacity(items: usize, entries: usize) -> Builder {
        let mut b = Builder::default();
        b.pickle.seqs = super::arena::Arena::with_capacity(items);
        b.pickle.dicts = super::arena::Arena::with_capacity(entries);
        b
    }

    /// Containers begun so far (the next one's number).
    pub fn containers(&self) -> u64 {
        self.containers
    }

    /// A `str` with these UTF-8 bytes (Python's `surrogatepass` variant accepted).
    pub fn str(&mut self, bytes: &[u8]) -> Value {
        Value::Str(self.string(bytes))
    }

    /// A `bytes` object.
    pub fn bytes(&mut self, bytes: &[u8]) -> Value {
        Value::Bytes(self.string(bytes))
    }

    fn string(&mut self, bytes: &[u8]) -> u32 {
        let id = self.pickle.strs.len() as u32;
        self.pickle.strs.bytes_mut().extend_from_slice(bytes);
        self.pickle.strs.close_owned();
        id
    }

    /// The bytes of a `str` or `bytes` value made so far (`None` for any other value).
    pub fn str_bytes(&self, v: Value) -> Option<&[u8]> {
        match v {
            Value::Str(_) => self.pickle.str_bytes(v),
            _ => self.pickle.bytes(v),
        }
    }

    /// An `int` that fits in 128 bits (wider ones are [`Value::HugeInt`]).
    pub fn int(&mut self, n: i128) -> Value {
        match i64::try_from(n) {
            Ok(small) => Value::Int(small),
            Err(_) => {
                self.pickle.bigs.push(n);
                Value::BigInt(self.pickle.bigs.len() as u32 - 1)
            }
        }
    }

    /// An empty sequence, numbered [`Builder::containers`] before the call.
    pub fn begin_seq(&mut self, kind: Seq) -> Value {
        let number = self.number();
        let id = self.pickle.seqs.add(number, std::iter::empty()) as u32;
        match kind {
            Seq::List => Value::List(id),
            Seq::Tuple => Value::Tuple(id),
            Seq::Set => Value::Set(id),
        }
    }

    /// An empty dict, numbered [`Builder::containers`] before the call.
    pub fn begin_dict(&mut self) -> Value {
        let number = self.number();
        Value::Dict(self.pickle.dicts.add(number, std::iter::empty()) as u32)
    }

    fn number(&mut self) -> u64 {
        self.containers += 1;
        self.containers - 1
    }

    /// Appends `items` to the sequence `seq` (anything else is left alone).
    pub fn extend_seq(&mut self, seq: Value, items: &[Value]) {
        if let Value::List(i) | Value::Tuple(i) | Value::Set(i) = seq {
            self.pickle.seqs.extend(i as usize, items.iter().copied());
        }
    }

    /// Appends `entries` to the dict `dict` (anything else is left alone).
    pub fn extend_dict(&mut self, dict: Value, entries: &[(Value, Value)]) {
        if let Value::Dict(i) = dict {
            self.pickle.dicts.extend(i as usize, entries.iter().copied());
        }
    }

    /// How full the container arenas are now, to drop what comes after with
    /// [`Builder::rollback`].
    pub fn mark(&self) -> Mark {
        Mark {
            seqs: self.pickle.seqs.mark(),
            dicts: self.pickle.dicts.mark(),
            number: self.containers,
        }
    }

    /// Drops every container begun since `mark`: the next ones take their indices again, not
    /// their numbers (numbers stand for byte offsets, which only grow). No container begun
    /// before `mark` may have grown since. Strings stay.
    pub fn rollback(&mut self, mark: Mark) {
        self.pickle.seqs.rollback(mark.seqs);
        self.pickle.dicts.rollback(mark.dicts);
    }

    /// The pickle built so far (its root not yet set).
    pub fn pickle(&self) -> &Pickle<'static> {
        &self.pickle
    }

    /// The pickle whose root is `root`.
    pub fn finish(mut self, root: Value) -> Pickle<'static> {
        self.pickle.root = Some(root);
        self.pickle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_pickle_reads_like_a_decoded_one() {
        // Room made beforehand changes nothing but the copies.
        let mut b = Builder::with_capacity(1, 1);
        let root = b.begin_dict();
        let list = b.begin_seq(Seq::List);
        let (k, one, big) = (b.str(b"a"), b.int(1), b.int(1 << 70));
        b.extend_seq(list, &[one, big, list]);
        b.extend_dict(root, &[(k, list)]);
        assert_eq!(b.containers(), 2);
        assert_eq!(b.str_bytes(k), Some(&b"a"[..]));
        assert_eq!(b.str_bytes(one), None);
        let p = b.finish(root);
        let items = p.items(p.get(p.root(), "a").unwrap()).unwrap();
        assert_eq!(p.int(items[0]), Some(1));
        assert_eq!(p.int(items[1]), Some(1 << 70));
        assert_eq!(items[2], list, "a container may hold itself");
        assert_eq!((p.offset_of(root), p.offset_of(list)), (Some(0), Some(1)));
    }

    #[test]
    fn a_rollback_drops_the_containers_begun_since_the_mark() {
        let mut b = Builder::default();
        let root = b.begin_seq(Seq::List);
        let mark = b.mark();
        let (d, s) = (b.begin_dict(), b.str(b"kept"));
        let l = b.begin_seq(Seq::Tuple);
        b.extend_seq(l, &[s]);
        b.extend_dict(d, &[(s, l)]);
        assert!(mark.owns(d) && mark.owns(l) && !mark.owns(root) && !mark.owns(s));
        assert_eq!((mark.containers(), mark.number()), ((1, 0), 1));
        b.rollback(mark);
        assert_eq!(b.containers(), 3);
        let again = b.begin_seq(Seq::List);
        assert_eq!(again, Value::List(1), "indices are taken again");
        b.extend_seq(root, &[s, again]);
        let p = b.finish(root);
        assert_eq!(p.offset_of(again), Some(3), "numbers are not");
        assert_eq!(p.str_bytes(s), Some(&b"kept"[..]), "strings stay");
        assert_eq!(p.items(root), Some(&[s, again][..]));
    }
}
