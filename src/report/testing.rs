//! Test support for the report: a toy caching policy with segments, and reports built from it, so
//! the charts can be drawn (and looked at) with many policies before the real ones exist.
//!
//! Set `FRAGSIM_REPORT_PREVIEW=DIR` when running the report tests to keep the files written.

use super::bundle::{size_bins, PolicyRun, ReportData, SegmentMap, TraceSummary, PLOT_POINTS};
use crate::backend::Backend;
use crate::error::Result;
use crate::policy::{Allocation, Policy};
use crate::replay::{run_policy, ReplayInput, ReplayOptions};
use crate::trace::{Block, BlockState, PoolKind, Segment, Trace};
use std::collections::{BTreeMap, BTreeSet};

/// Rounds each request up (to a multiple of `round`, or to a power of two when `round` is 0),
/// takes one segment per block, and, when `cache` is on, keeps freed blocks for reuse by any
/// request of the same rounded size.
#[derive(Debug, Default)]
pub struct Toy {
    round: u64,
    cache: bool,
    live: BTreeMap<u64, (u64, u64)>, // addr -> (block size, request)
    cached: BTreeSet<(u64, u64)>,    // (block size, addr)
    allocated: u64,
}

impl Toy {
    /// A toy policy; see the type docs.
    pub(crate) fn new(round: u64, cache: bool) -> Toy {
        Toy { round, cache, ..Toy::default() }
    }

    fn rounded(&self, size: u64) -> u64 {
        if self.round == 0 {
            size.next_power_of_two()
        } else {
            size.div_ceil(self.round) * self.round
        }
    }
}

impl Policy for Toy {
    fn config(&self) -> String {
        format!("round={},cache={}", self.round, self.cache)
    }

    fn malloc<B: Backend>(
        &mut self,
        backend: &mut B,
        size: u64,
        _: u64,
    ) -> Result<Option<Allocation>> {
        let block = self.rounded(size);
        let reuse = self.cached.range((block, 0)..(block + 1, 0)).next().copied();
        let addr = match reuse {
            Some(key) => {
                self.cached.remove(&key);
                key.1
            }
            None => match backend.segment_alloc(block)? {
                Some(a) => a,
                None => return Ok(None),
            },
        };
        self.live.insert(addr, (block, size));
        self.allocated += block;
        Ok(Some(Allocation::new(addr, block)))
    }

    fn free<B: Backend>(&mut self, backend: &mut B, addr: u64) -> Result<()> {
        if let Some((block, _)) = self.live.remove(&addr) {
            self.allocated -= block;
            if self.cache {
                self.cached.insert((block, addr));
            } else {
                backend.segment_free(addr, block)?;
            }
        }
        Ok(())
    }

    fn empty_cache<B: Backend>(&mut self, backend: &mut B) -> Result<()> {
        for (block, addr) in std::mem::take(&mut self.cached) {
            backend.segment_free(addr, block)?;
        }
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.allocated
    }

    fn segments(&self) -> Vec<Segment> {
        let seg = |address: u64, size: u64, requested_size: u64, state| Segment {
            device: 0,
            address,
            total_size: size,
            stream: 0,
            pool: if size <= 1 << 20 { PoolKind::Small } else { PoolKind::Large },
            is_expandable: false,
            private_pool: None,
            blocks: vec![Block { address, size, requested_size, state }],
        };
        let mut out: Vec<Segment> = self
            .live
            .iter()
            .map(|(&a, &(b, r))| seg(a, b, r, BlockState::ActiveAllocated))
            .chain(self.cached.iter().map(|&(b, a)| seg(a, b, 0, BlockState::Inactive)))
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }
}

/// A text trace of a training-like pattern: a stack of activations that grows and shrinks each
/// step, with small temporaries, over `steps` steps (times in µs).
pub(crate) fn training_text(steps: usize) -> String {
    let mut lines = vec!["# fragsim text trace v1".to_string()];
    let mut t: i64 = 1_700_000_000_000_000;
    let mut next = 0x7f00_0000_0000u64;
    let mut alloc = |lines: &mut Vec<String>, size: u64, t: i64| {
        next += 1 << 32;
        lines.push(format!("alloc {next:#x} {size} s0 @{t}"));
        next
    };
    let weights: Vec<u64> = (0..6).map(|i| alloc(&mut lines, 3_000_000 + i * 700_001, t)).collect();
    let _ = weights;
    for step in 0..steps {
        let mut stack = Vec::new();
        for layer in 0..12u64 {
            t += 900;
            let size = 5_000_000 + layer * 1_300_007 + (step as u64 % 3) * 400_003;
            let a = alloc(&mut lines, size, t);
            stack.push((a, size));
            let tmp_size = 70_000 + layer * 9_001;
            let tmp = alloc(&mut lines, tmp_size, t + 100);
            lines.push(format!("free {tmp:#x} {tmp_size} s0 @{}", t + 300));
        }
        while let Some((a, size)) = stack.pop() {
            t += 700;
            let g = alloc(&mut lines, size / 2 + 4097, t);
            lines.push(format!("free {a:#x} {size} s0 @{}", t + 200));
            lines.push(format!("free {g:#x} {} s0 @{}", size / 2 + 4097, t + 400));
        }
    }
    lines.join("\n") + "\n"
}

/// Reads `text` as a text trace.
pub(crate) fn text_trace(text: &str) -> Trace {
    crate::trace::read_bytes(text.as_bytes(), crate::trace::Format::Text, &Default::default())
        .expect("the test trace reads")
}

/// A report over `trace` with `n` toy policies (plus `bound` first), the segment map from the
/// first toy policy at its peak, as `collect` would build it.
pub(crate) fn toy_report(trace: &Trace, n: usize) -> ReportData {
    let input = ReplayInput::new(trace, None).expect("device");
    let options =
        ReplayOptions { keep_series: true, series_budget: PLOT_POINTS, ..ReplayOptions::default() };
    let configs = [
        (0, true),
        (512, true),
        (2 << 20, true),
        (0, false),
        (1 << 20, true),
        (4096, false),
        (20 << 20, true),
        (3 << 20, false),
        (8 << 20, true),
        (1000, true),
        (777, false),
    ];
    let mut runs = Vec::new();
    let bound = crate::policy::lookup("bound").expect("bound");
    let spec = crate::policy::PolicySpec { name: "bound".into(), options: String::new() };
    runs.push(PolicyRun {
        label: "bound".into(),
        index: 0,
        output: bound.run(&spec, &input, &options).expect("bound runs"),
    });
    for (i, &(round, cache)) in configs.iter().cycle().take(n).enumerate() {
        let label = format!("toy:round={round},cache={cache}");
        let output = run_policy("toy", Toy::new(round, cache), &input, &options).expect("toy runs");
        runs.push(PolicyRun { label, index: i + 1, output });
    }
    runs.sort_by_key(|r| r.output.result.peak_reserved_bytes);
    let first = runs.iter().find(|r| r.index == 1).expect("a toy policy");
    let peak = first.output.detail.peak_reserved_event;
    let map_label = first.label.clone();
    let at_peak = ReplayOptions { stop_after: Some(peak), ..ReplayOptions::default() };
    let (round, cache) = configs[0];
    let out = run_policy("toy", Toy::new(round, cache), &input, &at_peak).expect("toy runs");
    let summary = TraceSummary::of(trace, "/data/traces/toy-training.txt", input.device());
    ReportData {
        sizes: size_bins(&summary.info),
        trace: summary,
        runs,
        skipped: Vec::new(),
        segment_map: SegmentMap {
            policy: map_label,
            event: peak,
            time_us: input
                .loaded_events()
                .unwrap_or_default()
                .get(peak as usize)
                .map_or(0, |e| e.time_us),
            segments: out.segments,
            note: None,
        },
        capacity: None,
        recorded: None,
        recorded_series: None,
        capacity_note: None,
        sites: Vec::new(),
        flame: None,
        version: env!("CARGO_PKG_VERSION"),
    }
}
