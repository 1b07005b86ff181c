//! Container storage for decoded pickles: one flat pool per item type instead of one heap
//! allocation per container.
//!
//! A real snapshot holds tens of thousands of small containers (a dict per trace entry, a list
//! per distinct traceback). Python's pickler emits each container's items in one batch
//! (`MARK … APPENDS`/`SETITEMS`, 1000 items at a time), so almost every container's items can sit
//! contiguously at the end of a shared pool. A container that grows again after other items were
//! pooled (a second batch, or single `APPEND`s interleaved with other containers) moves to its own
//! `Vec` once; every item is copied at most once, so work and memory stay linear in the input.
//!
//! Each container also keeps the byte offset of the opcode that built it, so that schema errors
//! found long after decoding can still say where in the file the offending object is. Offsets
//! cost 4 bytes a container: containers are added in file order, so offsets only grow with the
//! index, and the high bits are kept once per 4 GiB as the first index past each boundary.

/// Where one container's items live.
#[derive(Debug)]
enum Span<T> {
    /// `pool[start..start + len]`.
    Pooled { start: usize, len: usize },
    /// Its own vector, after it grew away from the pool's end.
    Owned(Vec<T>),
}

/// How full an [`Arena`] was at one moment, to go back to (streamed decoding discards what came
/// after).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    /// Containers then; a container index at or past it came later.
    pub(crate) containers: usize,
    pool: usize,
}

/// Containers of `T` items, each named by its index.
#[derive(Debug)]
pub(crate) struct Arena<T> {
    pool: Vec<T>,
    spans: Vec<Span<T>>,
    /// The low 32 bits of each container's opcode offset, by index.
    low: Vec<u32>,
    /// `wraps[k]` is the first index whose offset is at least `(k + 1) << 32`.
    wraps: Vec<usize>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { pool: Vec::new(), spans: Vec::new(), low: Vec::new(), wraps: Vec::new() }
    }
}

impl<T: Copy> Arena<T> {
    /// An arena whose pool has room for `items` before it first grows. Callers size this from
    /// the input's length (never from a length the input declares), so a large guess costs only
    /// untouched virtual memory, while a good one saves the copies of repeated doubling.
    pub(crate) fn with_capacity(items: usize) -> Self {
        Arena { pool: Vec::with_capacity(items), ..Arena::default() }
    }

    /// The number of containers.
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Adds a container holding `items`, built by the opcode at byte `offset`, and returns its
    /// index. Offsets must not decrease from one container to the next (the decoder adds them in
    /// file order).
    pub(crate) fn add(&mut self, offset: u64, items: impl Iterator<Item = T>) -> usize {
        let id = self.spans.len();
        while (self.wraps.len() as u64) < offset >> 32 {
            self.wraps.push(id);
        }
        self.low.push(offset as u32);
        let start = self.pool.len();
        self.pool.extend(items);
        self.spans.push(Span::Pooled { start, len: self.pool.len() - start });
        id
    }

    /// How full the arena is now.
    pub(crate) fn mark(&self) -> Mark {
        Mark { containers: self.spans.len(), pool: self.pool.len() }
    }

    /// Drops every container added since `mark`, whose indices the next ones take again. The
    /// caller makes sure no container older than `mark` grew since (it would have grown into
    /// the pool past the mark).
    pub(crate) fn rollback(&mut self, mark: Mark) {
        self.spans.truncate(mark.containers);
        self.low.truncate(mark.containers);
        while self.wraps.last().is_some_and(|&first| first >= mark.containers) {
            self.wraps.pop();
        }
        self.pool.truncate(mark.pool);
    }

    /// The byte offset of the opcode that built container `id`.
    pub(crate) fn offset(&self, id: usize) -> Option<u64> {
        let low = *self.low.get(id)?;
        let high = self.wraps.partition_point(|&first| first <= id) as u64;
        Some(high << 32 | low as u64)
    }

    /// Appends `items` to container `id` (which must exist).
    pub(crate) fn extend(&mut self, id: usize, items: impl Iterator<Item = T>) {
        let Some(span) = self.spans.get_mut(id) else { return };
        match span {
            Span::Pooled { start, len } if *start + *len == self.pool.len() => {
                self.pool.extend(items);
                *len = self.pool.len() - *start;
            }
            Span::Pooled { start, len } if *len == 0 => {
                *start = self.pool.len();
                self.pool.extend(items);
                *len = self.pool.len() - *start;
            }
            Span::Pooled { start, len } => {
                let mut own = Vec::with_capacity(*len * 2);
                own.extend_from_slice(self.pool.get(*start..*start + *len).unwrap_or(&[]));
                own.extend(items);
                *span = Span::Owned(own);
            }
            Span::Owned(v) => v.extend(items),
        }
    }

    /// The items of container `id`.
    pub(crate) fn get(&self, id: usize) -> Option<&[T]> {
        match self.spans.get(id)? {
            Span::Pooled { start, len } => self.pool.get(*start..*start + *len),
            Span::Owned(v) => Some(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_keep_their_items_however_they_grow() {
        let mut a = Arena::default();
        let x = a.add(0, [1, 2].into_iter());
        let y = a.add(0, std::iter::empty());
        let z = a.add(0, [9].into_iter());
        a.extend(y, [5, 6].into_iter()); // empty: moves to the end
        a.extend(y, [7].into_iter()); // at the end: grows in place
        a.extend(x, [3].into_iter()); // not at the end: moves to its own vec
        a.extend(x, [4].into_iter());
        assert_eq!(a.get(x), Some(&[1, 2, 3, 4][..]));
        assert_eq!(a.get(y), Some(&[5, 6, 7][..]));
        assert_eq!(a.get(z), Some(&[9][..]));
        assert_eq!(a.get(3), None);
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn a_rollback_forgets_what_came_after_the_mark() {
        let mut a = Arena::default();
        let x = a.add(3, [1, 2].into_iter());
        let mark = a.mark();
        a.add(5, [3].into_iter());
        a.add(6 + (1 << 32), std::iter::empty());
        a.rollback(mark);
        assert_eq!(a.len(), 1);
        let y = a.add(7, [4].into_iter());
        assert_eq!(y, 1, "indices past the mark are taken again");
        assert_eq!(a.get(x), Some(&[1, 2][..]));
        assert_eq!(a.get(y), Some(&[4][..]));
        assert_eq!((a.offset(x), a.offset(y)), (Some(3), Some(7)));
    }

    #[test]
    fn offsets_past_4_gib_keep_their_high_bits() {
        let mut a = Arena::<u8>::default();
        let at = [7, (1 << 32) - 1, 1 << 32, (3 << 32) + 5, (3 << 32) + 5, 1 << 40];
        let ids: Vec<usize> = at.iter().map(|&o| a.add(o, std::iter::empty())).collect();
        for (&id, &o) in ids.iter().zip(&at) {
            assert_eq!(a.offset(id), Some(o), "container {id}");
        }
        assert_eq!(a.offset(ids.len()), None);
    }
}
