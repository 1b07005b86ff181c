//! Interned stack frames.
//!
//! PyTorch shares one frame list between every entry with the same traceback, so a snapshot with
//! 20,000 events may hold only a few hundred distinct stacks. Keeping one copy of each and letting
//! events refer to it by a 4-byte [`FramesId`] keeps an [`Event`](super::Event) small.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// True when `filename` is a file of torch_npu (`.../site-packages/torch_npu/...`, or a source
/// tree's `torch_npu/...`): a frame there shows that torch_npu, not CUDA's PyTorch, recorded the
/// trace.
pub fn is_torch_npu_file(filename: &str) -> bool {
    filename.starts_with("torch_npu/") || filename.contains("/torch_npu/")
}

/// True when a frame named `name` in file `filename` tells which kind of private pool an allocation
/// under it went to (docs/pytorch-model.md#capture-not-pool): `torch.cuda.use_mem_pool` (a
/// `MemPool`), or a graph capture (`capture_begin`, anything in `torch/cuda/graphs.py`). Such a
/// stack is read even where frames are not kept, since it decides whether a 2.13+ malloc into the
/// pool may release the cache.
pub fn tells_pool_kind(name: &str, filename: &str) -> bool {
    is_mem_pool_frame(name) || is_graph_capture_frame(name, filename)
}

/// A frame of `torch.cuda.use_mem_pool`: the allocation went to a `MemPool`.
pub(crate) fn is_mem_pool_frame(name: &str) -> bool {
    name == "use_mem_pool"
}

/// A frame of a CUDA graph capture: `capture_begin`, or any frame in `torch/cuda/graphs.py`
/// (`torch.cuda.graph`, `make_graphed_callables`), written with either path separator.
pub(crate) fn is_graph_capture_frame(name: &str, filename: &str) -> bool {
    name == "capture_begin"
        || filename.ends_with("torch/cuda/graphs.py")
        || filename.ends_with("torch\\cuda\\graphs.py")
}

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
///
/// Two tables are equal when they hold the same stacks in the same order: the final-segment block
/// stacks ([`FrameTable::block`]) are side information that not every format keeps.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FrameTable {
    stacks: Vec<Vec<Frame>>,
    #[serde(skip)]
    index: HashMap<Vec<Frame>, u32>,
    /// The stacks a snapshot's final segments record for their blocks (the allocation that last
    /// used each block), by device and block address: what names the site of a block live before
    /// the trace begins. Not kept by `.fst`.
    #[serde(skip)]
    blocks: HashMap<(i32, u64), FramesId>,
}

impl PartialEq for FrameTable {
    fn eq(&self, other: &FrameTable) -> bool {
        self.stacks == other.stacks
    }
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

    /// True when a frame names a file of torch_npu (Huawei Ascend's PyTorch backend), which
    /// made the recording then ([`is_torch_npu_file`]).
    pub(crate) fn names_torch_npu(&self) -> bool {
        self.stacks.iter().flatten().any(|f| is_torch_npu_file(&f.filename))
    }

    /// Records that the final-segment block at `address` of `device` has stack `id`.
    pub(crate) fn set_block(&mut self, device: i32, address: u64, id: FramesId) {
        if id != FramesId::NONE {
            self.blocks.insert((device, address), id);
        }
    }

    /// The stack the final segments record for the block at `address` of `device`, if any.
    pub fn block(&self, device: i32, address: u64) -> FramesId {
        self.blocks.get(&(device, address)).copied().unwrap_or(FramesId::NONE)
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
