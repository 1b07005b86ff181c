//! Memory over time, kept compactly for plots.
//!
//! The engine records a point whenever reserved, allocated or requested bytes change. Traces of
//! tens of millions of events would make that too large to keep or plot, so a [`Series`] has a point
//! budget: when it overflows, neighbouring points are merged window by window, keeping in each
//! window the points that hold its highest and lowest reserved and its highest allocated and
//! requested values. Every peak therefore survives every merge exactly, as a plot must show it.

use serde::{Deserialize, Serialize};

/// One moment of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// Index of the event after which these values hold.
    pub event: u64,
    /// The event's time (µs since the epoch, or the event index when the trace has no times).
    pub time_us: i64,
    /// Device memory held by the policy.
    pub reserved: u64,
    /// Bytes of live blocks, after the policy's rounding.
    pub allocated: u64,
    /// Bytes the program asked for and still holds.
    pub requested: u64,
}

/// A budgeted time series. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    points: Vec<Point>,
    budget: usize,
}

/// The default point budget: plenty for a chart, small enough for any trace.
pub const DEFAULT_BUDGET: usize = 20_000;

impl Default for Series {
    fn default() -> Self {
        Series::with_budget(DEFAULT_BUDGET)
    }
}

impl Series {
    /// An empty series that keeps about `budget` points (at least 16).
    pub(crate) fn with_budget(budget: usize) -> Series {
        Series { points: Vec::new(), budget: budget.max(16) }
    }

    /// Appends a point, merging old ones when over budget.
    pub(crate) fn push(&mut self, point: Point) {
        self.points.push(point);
        if self.points.len() >= 2 * self.budget {
            self.points = downsample(&self.points, self.budget);
        }
    }

    /// The points in time order.
    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The points, reduced to about `max_points` with every peak kept.
    pub fn downsampled(&self, max_points: usize) -> Vec<Point> {
        if self.points.len() <= max_points {
            self.points.clone()
        } else {
            downsample(&self.points, max_points)
        }
    }
}

/// Reduces `points` to at most about `max_points`, keeping in each window the points with the
/// highest and lowest reserved, allocated and requested (a min/max envelope, so a chart with one
/// window per pixel column still shows each step's rise and fall rather than a flat block of
/// maxima), in time order, plus the first and last.
pub(crate) fn downsample(points: &[Point], max_points: usize) -> Vec<Point> {
    let max_points = max_points.max(8);
    if points.len() <= max_points {
        return points.to_vec();
    }
    // Each window keeps up to 6 points, so the window length is 6 × len / max.
    let window = (6 * points.len()).div_ceil(max_points).max(2);
    let mut out = Vec::with_capacity(max_points + 2);
    for chunk in points.chunks(window) {
        let pick = |key: fn(&Point) -> i128| {
            chunk
                .iter()
                .enumerate()
                .max_by_key(|(i, p)| (key(p), -(*i as i128)))
                .map(|(i, _)| i)
                .unwrap_or(0)
        };
        let mut keep = [
            pick(|p| p.reserved as i128),
            pick(|p| -(p.reserved as i128)),
            pick(|p| p.allocated as i128),
            pick(|p| -(p.allocated as i128)),
            pick(|p| p.requested as i128),
            pick(|p| -(p.requested as i128)),
        ];
        keep.sort_unstable();
        let mut last = usize::MAX;
        for i in keep {
            if i != last {
                out.push(chunk[i]);
                last = i;
            }
        }
    }
    if out.first() != points.first() {
        out.insert(0, points[0]);
    }
    if out.last() != points.last() {
        out.push(*points.last().expect("points is longer than max_points"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: u64) -> Vec<Point> {
        (0..n)
            .map(|i| {
                let r = (i * 7919) % 1000 + if i == n / 3 { 5000 } else { 0 };
                Point {
                    event: i,
                    time_us: i as i64,
                    reserved: r,
                    allocated: r / 2 + (i % 13),
                    requested: r / 3,
                }
            })
            .collect()
    }

    #[test]
    fn downsampling_keeps_every_peak_exactly() {
        let pts = wave(100_000);
        let small = downsample(&pts, 1000);
        assert!(small.len() <= 1002, "{}", small.len());
        for key in [|p: &Point| p.reserved, |p: &Point| p.allocated, |p: &Point| p.requested] {
            assert_eq!(pts.iter().map(key).max(), small.iter().map(key).max());
        }
        assert_eq!(pts.iter().map(|p| p.reserved).min(), small.iter().map(|p| p.reserved).min());
        assert!(small.windows(2).all(|w| w[0].event < w[1].event), "order kept");
        assert_eq!(small.first(), pts.first());
        assert_eq!(small.last(), pts.last());
    }

    #[test]
    fn downsampling_keeps_each_windows_envelope() {
        // Training steps: live memory rises and falls every 50 events; 20 steps per window.
        let pts: Vec<Point> = (0..60_000u64)
            .map(|i| {
                let live = 1000 + (i % 50) * 10;
                Point {
                    event: i,
                    time_us: i as i64,
                    reserved: 2000,
                    allocated: live,
                    requested: live - 1,
                }
            })
            .collect();
        let max_points = 600;
        let small = downsample(&pts, max_points);
        assert!(small.len() <= max_points + 2, "{}", small.len());
        let window = (6 * pts.len()).div_ceil(max_points);
        let keys: [fn(&Point) -> u64; 3] = [|p| p.reserved, |p| p.allocated, |p| p.requested];
        for chunk in pts.chunks(window) {
            let kept: Vec<&Point> = small
                .iter()
                .filter(|p| chunk[0].event <= p.event && p.event <= chunk[chunk.len() - 1].event)
                .collect();
            for key in keys {
                let (lo, hi) = (chunk.iter().map(key).min(), chunk.iter().map(key).max());
                assert_eq!(kept.iter().map(|p| key(p)).min(), lo, "window at {}", chunk[0].event);
                assert_eq!(kept.iter().map(|p| key(p)).max(), hi, "window at {}", chunk[0].event);
            }
        }
        // The falls stay visible: the live curve goes down between windows' peaks.
        assert!(small.windows(2).any(|w| w[1].allocated < w[0].allocated));
    }

    #[test]
    fn a_budgeted_series_stays_small_and_keeps_the_peak() {
        let mut s = Series::with_budget(100);
        let pts = wave(50_000);
        for p in &pts {
            s.push(*p);
        }
        assert!(s.points().len() < 200);
        let peak = pts.iter().max_by_key(|p| p.reserved).unwrap();
        assert!(s.points().contains(peak));
    }
}
