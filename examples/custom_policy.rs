//! Your own allocator, regression-tested on a real trace.
//!
//! This example writes an allocator *outside* the fragsim crate, against its public
//! [`fragsim::policy::Policy`] trait, replays a real PyTorch snapshot shipped in
//! `traces/real/` through it, and prints it beside fragsim's model of PyTorch's caching allocator
//! and `bound` (the live requested bytes, which no allocator can go below):
//!
//! ```sh
//! cargo run --example custom_policy                     # traces/real/cs336-lm-step-c.pickle
//! cargo run --example custom_policy -- path/to/run.pickle
//! ```
//!
//! The allocator, `first-fit`, is deliberately simple: requests are rounded up to 512 bytes and
//! placed at the lowest free address of the first segment with room; segments are at least
//! 2 MiB (a larger request gets its own segment, rounded up to 2 MiB); freed blocks merge with
//! their free neighbours; a fully free segment is kept as cache and given back to the device only
//! on `empty_cache()` or when the device is out of memory, after which the malloc is retried once.
//! Streams are ignored.
//!
//! The integration test `custom_policy` in `tests/` runs [`compare`] on the same trace with the
//! invariant checks on, so this file is also a test of the public API it uses.

use fragsim::backend::Backend;
use fragsim::policy::{self, Allocation, Policy, PolicySpec};
use fragsim::replay::{self, ReplayInput, ReplayOptions, ReplayOutput};
use fragsim::trace::{read_trace, ReadOptions};
use fragsim::units::format_bytes;
use fragsim::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Blocks are multiples of this (PyTorch's `kMinBlockSize`).
const ALIGN: u64 = 512;
/// The smallest segment, and the step segment sizes round up to.
const SEGMENT: u64 = 2 << 20;

/// One segment from the backend and its free ranges (address → length), in address order.
#[derive(Debug)]
struct Seg {
    size: u64,
    free: BTreeMap<u64, u64>,
}

/// A first-fit allocator over backend segments; see the module docs.
#[derive(Debug, Default)]
pub struct FirstFit {
    /// Segments by base address.
    segs: BTreeMap<u64, Seg>,
    /// Live blocks: address → block size.
    live: HashMap<u64, u64>,
    /// Sum of live block sizes.
    allocated: u64,
}

impl FirstFit {
    /// Takes `size` bytes from the first free range that holds them, if any.
    fn take(&mut self, size: u64) -> Option<u64> {
        let (addr, len) = self
            .segs
            .values()
            .find_map(|s| s.free.iter().find(|(_, &len)| len >= size).map(|(&a, &l)| (a, l)))?;
        let seg = self.seg_mut(addr);
        seg.free.remove(&addr);
        if len > size {
            seg.free.insert(addr + size, len - size);
        }
        Some(addr)
    }

    /// The segment holding `addr`.
    fn seg_mut(&mut self, addr: u64) -> &mut Seg {
        let (_, seg) = self.segs.range_mut(..=addr).next_back().expect("addr is in a segment");
        seg
    }

    /// Gives every fully free segment back to the backend.
    fn release_free_segments<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        let empty: Vec<(u64, u64)> = self
            .segs
            .iter()
            .filter(|(a, s)| s.free.get(a) == Some(&s.size))
            .map(|(&a, s)| (a, s.size))
            .collect();
        for (addr, size) in empty {
            backend.segment_free(addr, size)?;
            self.segs.remove(&addr);
        }
        Ok(())
    }
}

impl Policy for FirstFit {
    fn config(&self) -> String {
        format!("first-fit:align={ALIGN},segment={SEGMENT}")
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        _stream: u64,
    ) -> Result<Option<Allocation>> {
        let block = size.div_ceil(ALIGN) * ALIGN;
        let addr = match self.take(block) {
            Some(addr) => addr,
            None => {
                let seg_size = block.max(SEGMENT).div_ceil(SEGMENT) * SEGMENT;
                let mut base = backend.segment_alloc(seg_size)?;
                if base.is_none() {
                    // Out of memory: return the cache to the device and try once more.
                    self.release_free_segments(backend)?;
                    base = backend.segment_alloc(seg_size)?;
                }
                let Some(base) = base else { return Ok(None) };
                let free = BTreeMap::from([(base, seg_size)]);
                self.segs.insert(base, Seg { size: seg_size, free });
                self.take(block).expect("a new segment holds the block")
            }
        };
        self.live.insert(addr, block);
        self.allocated += block;
        Ok(Some(Allocation::new(addr, block)))
    }

    fn free<B: Backend>(&mut self, _backend: &mut B, addr: u64) -> Result<()> {
        let size = self
            .live
            .remove(&addr)
            .ok_or_else(|| Error::input(format!("first-fit: free of unknown block {addr:#x}")))?;
        self.allocated -= size;
        let seg = self.seg_mut(addr);
        let (mut start, mut len) = (addr, size);
        // Merge with the free range just after, then with the one just before.
        if let Some(next) = seg.free.remove(&(addr + size)) {
            len += next;
        }
        if let Some((&prev, &prev_len)) = seg.free.range(..addr).next_back() {
            if prev + prev_len == addr {
                seg.free.remove(&prev);
                (start, len) = (prev, prev_len + len);
            }
        }
        seg.free.insert(start, len);
        Ok(())
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        self.release_free_segments(backend)
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut free_total = 0;
        for (&base, seg) in &self.segs {
            let mut end = base;
            for (&a, &l) in &seg.free {
                if a < end || a + l > base + seg.size || l == 0 {
                    return Err(format!("free range {a:#x}+{l} is out of place in {base:#x}"));
                }
                if a == end && a != base {
                    return Err(format!("free range {a:#x} was not merged with the one before"));
                }
                end = a + l;
                free_total += l;
            }
        }
        let reserved: u64 = self.segs.values().map(|s| s.size).sum();
        if free_total + self.allocated != reserved {
            return Err(format!(
                "free {free_total} + allocated {} != reserved {reserved}",
                self.allocated
            ));
        }
        Ok(())
    }
}

/// Replays `input` through `first-fit` and the built-in `policies` (`--policy` values such as
/// `pytorch` or `pytorch:expandable_segments:True`).
///
/// These are the only calls into fragsim's replay engine in this example: `replay::run_policy`
/// for a policy of your own, and `policy::lookup(name)?.run(..)` for a built-in one.
pub fn replay_all(
    input: &ReplayInput,
    policies: &[&str],
    options: &ReplayOptions,
) -> Result<Vec<ReplayOutput>> {
    let mut outputs = vec![replay::run_policy("first-fit", FirstFit::default(), input, options)?];
    for text in policies {
        for spec in PolicySpec::parse_list(text)? {
            outputs.push(policy::lookup(&spec.name)?.run(&spec, input, options)?);
        }
    }
    Ok(outputs)
}

/// Reads `trace` and replays its default device through `first-fit`, `pytorch` and `bound`.
pub fn compare(trace: &Path, options: &ReplayOptions) -> Result<Vec<ReplayOutput>> {
    let trace = read_trace(trace, &ReadOptions::default())?;
    let input = ReplayInput::new(&trace, None)?;
    replay_all(&input, &["pytorch", "bound"], options)
}

/// The comparison as a text table, one row per policy, with each one's overhead over `bound`.
pub fn table(outputs: &[ReplayOutput]) -> String {
    let bound =
        outputs.iter().find(|o| o.result.policy == "bound").map(|o| o.result.peak_reserved_bytes);
    let mut out = format!(
        "{:<10} {:>12} {:>12} {:>10} {:>11}\n",
        "policy", "peak", "over bound", "frag@peak", "cudaMallocs"
    );
    for o in outputs {
        let r = &o.result;
        let over = match bound {
            Some(b) if b > 0 => {
                format!("{:+.1}%", (r.peak_reserved_bytes as f64 / b as f64 - 1.0) * 100.0)
            }
            _ => "-".to_string(),
        };
        out += &format!(
            "{:<10} {:>12} {:>12} {:>9.1}% {:>11}\n",
            r.policy,
            format_bytes(r.peak_reserved_bytes),
            over,
            r.fragmentation_at_peak * 100.0,
            r.device_malloc_count
        );
    }
    out
}

/// The real trace this example replays when given none.
pub fn default_trace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real/cs336-lm-step-c.pickle")
}

fn main() -> ExitCode {
    let path = std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(default_trace);
    match compare(&path, &ReplayOptions::default()) {
        Ok(outputs) => {
            println!("{}", path.display());
            print!("{}", table(&outputs));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("custom_policy: {e}");
            ExitCode::from(e.kind().exit_code())
        }
    }
}
