//! What the `empty_cache` what-if buys and costs: each policy replayed with the recorded
//! `empty_cache()` calls only and again under an [`EmptyCachePlan`], compared.
//!
//! Releasing wholly free cached segments can lower the peak (memory cached for one size is
//! returned and reused for another) but costs device calls: every released segment is a
//! `cudaFree` now and often a `cudaMalloc` later. `effects` pairs the two runs of each spec;
//! `describe` says, per policy, the change in peak reserved and in device mallocs and frees,
//! and when the peak does not move, why.

use super::{Comparison, EmptyCachePlan, SpecRun};
use crate::units::format_bytes;

/// One policy's result with and without the what-if.
#[derive(Clone, Debug, PartialEq)]
pub struct EmptyCacheEffect {
    /// The spec as given (`NAME[:OPTIONS]`).
    pub label: String,
    /// Peak reserved bytes with the recorded calls only.
    pub peak_before: u64,
    /// Peak reserved bytes under the plan.
    pub peak_after: u64,
    /// Device mallocs (segment allocations plus page mappings) added by the plan (negative
    /// when it saved some).
    pub extra_mallocs: i64,
    /// Device frees (segment releases plus page unmappings) added by the plan.
    pub extra_frees: i64,
    /// `empty_cache()` calls the plan added.
    pub calls: u64,
    /// Reserved minus allocated bytes at the baseline's peak: what a flush there could at most
    /// have released.
    pub free_at_peak_before: u64,
    /// The event at which the baseline's reserved memory peaked.
    pub peak_event_before: u64,
}

/// Pairs the runs of each spec in `baseline` (recorded calls only) and `whatif` (under the
/// plan), in `whatif`'s order.
pub(crate) fn effects(baseline: &Comparison, whatif: &Comparison) -> Vec<EmptyCacheEffect> {
    let device_calls = |r: &SpecRun| {
        let x = &r.output.result;
        ((x.device_malloc_count + x.map_count) as i64, (x.device_free_count + x.unmap_count) as i64)
    };
    whatif
        .runs
        .iter()
        .filter_map(|after| {
            let before = baseline.run_of(after.index)?;
            let (m0, f0) = device_calls(before);
            let (m1, f1) = device_calls(after);
            let b = &before.output;
            Some(EmptyCacheEffect {
                label: after.spec.display(),
                peak_before: b.result.peak_reserved_bytes,
                peak_after: after.output.result.peak_reserved_bytes,
                extra_mallocs: m1 - m0,
                extra_frees: f1 - f0,
                calls: after.output.detail.empty_cache_calls,
                free_at_peak_before: b
                    .result
                    .peak_reserved_bytes
                    .saturating_sub(b.detail.allocated_at_peak_bytes),
                peak_event_before: b.detail.peak_reserved_event,
            })
        })
        .collect()
}

impl EmptyCacheEffect {
    /// One line: the change in peak and in device calls, and why the peak did not move.
    pub(crate) fn describe(&self) -> String {
        let change = self.peak_after as i128 - self.peak_before as i128;
        let peak = if change == 0 {
            format!("peak reserved unchanged at {}", format_bytes(self.peak_after))
        } else {
            let sign = if change < 0 { "−" } else { "+" };
            format!(
                "peak reserved {} → {} ({sign}{})",
                format_bytes(self.peak_before),
                format_bytes(self.peak_after),
                format_bytes(change.unsigned_abs() as u64)
            )
        };
        let mut s = format!(
            "{}: {peak}; device mallocs {:+}, frees {:+}",
            self.label, self.extra_mallocs, self.extra_frees
        );
        if change > 0 {
            s += " (higher: segments released early were allocated again in other sizes)";
        } else if change == 0 {
            s += &format!(" ({})", self.why_not());
        }
        s
    }

    /// Why the plan did not lower the peak.
    fn why_not(&self) -> String {
        if self.calls == 0 && self.extra_frees == 0 {
            return "no empty_cache() call was added within the replayed events".to_string();
        }
        if self.extra_frees <= 0 {
            return "no call found a wholly free cached segment to release".to_string();
        }
        if self.free_at_peak_before == 0 {
            return format!(
                "at its peak (event {}) every reserved byte is allocated: nothing cached to release",
                self.peak_event_before
            );
        }
        format!(
            "the peak (event {}) holds {} cached but free in segments that also hold live \
             blocks or that were cached after the last call; empty_cache() releases only \
             wholly free segments",
            self.peak_event_before,
            format_bytes(self.free_at_peak_before)
        )
    }
}

/// The lines printed under the table: the plan, then one line per policy.
pub(crate) fn describe(plan: &EmptyCachePlan, effects: &[EmptyCacheEffect]) -> String {
    let mut s = format!("what-if: {} (against the recorded calls only)\n", plan.describe());
    for e in effects {
        s += "  ";
        s += &e.describe();
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(before: u64, after: u64, frees: i64, calls: u64) -> EmptyCacheEffect {
        EmptyCacheEffect {
            label: "pytorch".into(),
            peak_before: before,
            peak_after: after,
            extra_mallocs: 1,
            extra_frees: frees,
            calls,
            free_at_peak_before: 1 << 20,
            peak_event_before: 9,
        }
    }

    #[test]
    fn lines_say_what_it_buys_costs_and_why_not() {
        assert_eq!(
            effect(5 << 20, 3 << 20, 2, 5).describe(),
            "pytorch: peak reserved 5.00 MiB → 3.00 MiB (−2.00 MiB); device mallocs +1, frees +2"
        );
        assert!(effect(4 << 20, 4 << 20, 0, 0).describe().contains("no empty_cache() call"));
        assert!(effect(4 << 20, 4 << 20, 0, 3).describe().contains("no call found"));
        assert!(effect(4 << 20, 4 << 20, 2, 3).describe().contains("wholly free segments"));
        assert!(effect(3 << 20, 5 << 20, 2, 3).describe().contains("(+2.00 MiB)"));
    }
}
