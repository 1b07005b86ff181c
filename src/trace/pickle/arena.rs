//! Container storage for decoded pickles: one flat pool per item type instead of one heap
//! allocation per container.
//!
//! A real snapshot holds tens of thousands of small containers (a dict per trace entry, a list
//! per distinct traceback). Python's pickler emits each container's items in one batch
//! (`MARK … APPENDS`/`SETITEMS`, 1000 items at a time), so almost every container's items can sit
//! contiguously at the end of a shared pool. A container that grows again after other items were
//! pooled (a second batch, or single `APPEND`s interleaved with other containers) moves to its own
//! `Vec` once; every item is copied at most once, so work and memory stay linear in the input.

/// Where one container's items live.
#[derive(Debug)]
enum Span<T> {
    /// `pool[start..start + len]`.
    Pooled { start: usize, len: usize },
    /// Its own vector, after it grew away from the pool's end.
    Owned(Vec<T>),
}

/// Containers of `T` items, each named by its index.
#[derive(Debug)]
pub(crate) struct Arena<T> {
    pool: Vec<T>,
    spans: Vec<Span<T>>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { pool: Vec::new(), spans: Vec::new() }
    }
}

impl<T: Copy> Arena<T> {
    /// An arena whose pool has room for `items` before it first grows. Callers size this from
    /// the input's length (never from a length the input declares), so a large guess costs only
    /// untouched virtual memory, while a good one saves the copies of repeated doubling.
    pub(crate) fn with_capacity(items: usize) -> Self {
        Arena { pool: Vec::with_capacity(items), spans: Vec::new() }
    }

    /// The number of containers.
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Adds a container holding `items` and returns its index.
    pub(crate) fn add(&mut self, items: impl Iterator<Item = T>) -> usize {
        let start = self.pool.len();
        self.pool.extend(items);
        self.spans.push(Span::Pooled { start, len: self.pool.len() - start });
        self.spans.len() - 1
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
        let x = a.add([1, 2].into_iter());
        let y = a.add(std::iter::empty());
        let z = a.add([9].into_iter());
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
}
