//! Interned stack frames.
//!
//! PyTorch shares one frame list between every entry with the same traceback, so a snapshot with
//! 20,000 events may hold only a few hundred distinct stacks. Keeping one copy of each and letting
//! events refer to it by a 4-byte [`FramesId`] keeps an [`Event`](super::Event) small.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One Python or C++ stack frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// Source file.
    pub filename: String,
    /// Line number.
    pub line: u32,
    /// Function name.
    pub name: String,
}

/// A reference to an interned frame list; [`FramesId::NONE`] means no frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FramesId(pub u32);

impl FramesId {
    /// No frames recorded (or frames not kept).
    pub const NONE: FramesId = FramesId(0);
}

/// One copy of each distinct frame list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FrameTable {
    stacks: Vec<Vec<Frame>>,
    #[serde(skip)]
    index: HashMap<Vec<Frame>, u32>,
}

impl FrameTable {
    /// Interns `frames` and returns its id; an empty list is [`FramesId::NONE`].
    pub fn intern(&mut self, frames: Vec<Frame>) -> FramesId {
        if frames.is_empty() {
            return FramesId::NONE;
        }
        if let Some(&id) = self.index.get(&frames) {
            return FramesId(id);
        }
        self.stacks.push(frames.clone());
        let id = self.stacks.len() as u32;
        self.index.insert(frames, id);
        FramesId(id)
    }

    /// The frames behind `id` (empty for [`FramesId::NONE`] or an unknown id).
    pub fn get(&self, id: FramesId) -> &[Frame] {
        match id.0 {
            0 => &[],
            n => self.stacks.get(n as usize - 1).map(Vec::as_slice).unwrap_or(&[]),
        }
    }

    /// The number of distinct frame lists.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// True when no frames are kept.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_shares_equal_lists() {
        let mut t = FrameTable::default();
        let f = vec![Frame { filename: "a.py".into(), line: 3, name: "f".into() }];
        let a = t.intern(f.clone());
        let b = t.intern(f.clone());
        assert_eq!(a, b);
        assert_ne!(a, FramesId::NONE);
        assert_eq!(t.get(a), &f[..]);
        assert_eq!(t.intern(vec![]), FramesId::NONE);
        assert_eq!(t.len(), 1);
    }
}
