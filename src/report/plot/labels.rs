//! Where value labels go on a chart: out of the data's way.
//!
//! A label drawn at the point it names hides the lines around that point, and on a chart where
//! several policies peak at the same moment it hides the very peaks it labels. [`Occupancy`]
//! records which pixels of the plot hold data (lines, markers, filled areas, each with a weight);
//! `place` then puts each label box, one after another, where it covers the least data,
//! overlaps no box placed before it nor another label's anchor, stays inside the plot, and,
//! among equally clear places, sits nearest its anchor. A leader line joins box and anchor.

/// Which pixels of a plot area hold data, with a weight each, summed for fast box queries.
pub struct Occupancy {
    x0: i32,
    y0: i32,
    w: i32,
    h: i32,
    weight: Vec<u32>,
    /// Summed-area table of `weight`, `(w + 1) × (h + 1)`, built by [`Occupancy::finish`].
    sums: Vec<u64>,
}

impl Occupancy {
    /// An empty plot area spanning pixels `x0..x1` × `y0..y1`.
    pub(crate) fn new((x0, x1): (i32, i32), (y0, y1): (i32, i32)) -> Occupancy {
        let (w, h) = ((x1 - x0).max(1), (y1 - y0).max(1));
        Occupancy { x0, y0, w, h, weight: vec![0; (w * h) as usize], sums: Vec::new() }
    }

    /// Marks the pixels within `half` pixels of the path through `points` with `weight`. Only
    /// the part of each segment within reach of the area is walked, so a point far outside it
    /// (a hostile time, a value off the scale) costs no more than one across it.
    pub(crate) fn mark_path(&mut self, points: &[(i32, i32)], half: i32, weight: u32) {
        let lo = (self.x0 - half, self.y0 - half);
        let hi = (self.x0 + self.w - 1 + half, self.y0 + self.h - 1 + half);
        for pair in points.windows(2) {
            let Some(((ax, ay), (bx, by))) = clip(pair[0], pair[1], lo, hi) else { continue };
            let steps = (bx - ax).abs().max((by - ay).abs()).max(1);
            for k in 0..=steps {
                let x = ax + (bx - ax) * k / steps;
                let y = ay + (by - ay) * k / steps;
                self.mark_rect((x - half, y - half), (x + half, y + half), weight);
            }
        }
    }

    /// Marks every pixel of the rectangle `a..=b` with `weight` (the largest weight wins).
    pub(crate) fn mark_rect(&mut self, a: (i32, i32), b: (i32, i32), weight: u32) {
        let xs = (a.0.min(b.0) - self.x0).max(0)..=(a.0.max(b.0) - self.x0).min(self.w - 1);
        let ys = (a.1.min(b.1) - self.y0).max(0)..=(a.1.max(b.1) - self.y0).min(self.h - 1);
        for y in ys {
            for x in xs.clone() {
                let cell = &mut self.weight[(y * self.w + x) as usize];
                *cell = (*cell).max(weight);
            }
        }
    }

    /// Marks, in each pixel column, everything from `points`' path down to the bottom of the
    /// area: a filled area under a step line.
    pub(crate) fn mark_below(&mut self, points: &[(i32, i32)], weight: u32) {
        let bottom = self.y0 + self.h - 1;
        // The columns of the area, and every height a path above or below it may take.
        let lo = (self.x0, i32::MIN);
        let hi = (self.x0 + self.w - 1, i32::MAX);
        for pair in points.windows(2) {
            let Some(((ax, ay), (bx, by))) = clip(pair[0], pair[1], lo, hi) else { continue };
            let steps = i64::from((bx - ax).abs().max(1));
            for k in 0..=steps {
                let x = i64::from(ax) + i64::from(bx - ax) * k / steps;
                let y = i64::from(ay) + (i64::from(by) - i64::from(ay)) * k / steps;
                let y = y.clamp(i64::from(self.y0) - 1, i64::from(bottom) + 1) as i32;
                self.mark_rect((x as i32, y), (x as i32, bottom), weight);
            }
        }
    }

    /// Builds the sums [`Occupancy::cost`] reads; call once, after marking.
    pub(crate) fn finish(&mut self) {
        let (w, h) = (self.w as usize, self.h as usize);
        let mut sums = vec![0u64; (w + 1) * (h + 1)];
        for y in 0..h {
            let mut row = 0u64;
            for x in 0..w {
                row += u64::from(self.weight[y * w + x]);
                sums[(y + 1) * (w + 1) + x + 1] = sums[y * (w + 1) + x + 1] + row;
            }
        }
        self.sums = sums;
    }

    /// The summed weight of the pixels of the box `[x0, x1) × [y0, y1)` (clipped to the area).
    pub(crate) fn cost(&self, (x0, y0, x1, y1): (i32, i32, i32, i32)) -> u64 {
        let w1 = self.w as usize + 1;
        let cx = |x: i32| (x - self.x0).clamp(0, self.w) as usize;
        let cy = |y: i32| (y - self.y0).clamp(0, self.h) as usize;
        let (a, b, c, d) = (cx(x0), cx(x1), cy(y0), cy(y1));
        if self.sums.is_empty() || a >= b || c >= d {
            return 0;
        }
        self.sums[d * w1 + b] + self.sums[c * w1 + a]
            - self.sums[c * w1 + b]
            - self.sums[d * w1 + a]
    }

    /// The area's pixel bounds `(x0, y0, x1, y1)`.
    pub(crate) fn bounds(&self) -> (i32, i32, i32, i32) {
        (self.x0, self.y0, self.x0 + self.w, self.y0 + self.h)
    }
}

/// A box `(x0, y0, x1, y1)`, right and bottom edges exclusive.
pub type LabelBox = (i32, i32, i32, i32);

/// Places boxes of `sizes` (`(width, height)`) for labels of the points `anchors`, in the order
/// given (put the most important first), as the module docs say; `keep_clear` is the radius
/// around every anchor no other label may cover. Returns each box.
pub(crate) fn place(
    occupancy: &Occupancy,
    anchors: &[(i32, i32)],
    sizes: &[(i32, i32)],
    keep_clear: i32,
) -> Vec<LabelBox> {
    const GAP: i32 = 4;
    let (bx0, by0, bx1, by1) = occupancy.bounds();
    let mut placed: Vec<LabelBox> = Vec::new();
    let mut leaders: Vec<((i32, i32), (i32, i32))> = Vec::new();
    for (i, (&(ax, ay), &(w, h))) in anchors.iter().zip(sizes).enumerate() {
        let mut best: Option<(u64, i64, LabelBox)> = None;
        // Left edges: beside the anchor on either side, then further out in half-widths.
        let mut xs = vec![ax + keep_clear + 4, ax - keep_clear - 4 - w];
        for k in 1..=8 {
            xs.push(ax + keep_clear + 4 + k * w / 2);
            xs.push(ax - keep_clear - 4 - w - k * w / 2);
        }
        xs.push(ax - w / 2);
        for x in xs {
            let x = x.clamp(bx0 + 2, (bx1 - w - 2).max(bx0 + 2));
            let mut y = by0 + 2;
            while y + h <= by1 - 2 {
                let b = (x, y, x + w, y + h);
                let hits_box = placed.iter().any(|p| {
                    b.0 < p.2 + GAP && p.0 < b.2 + GAP && b.1 < p.3 + GAP && p.1 < b.3 + GAP
                });
                let hits_anchor = anchors.iter().enumerate().any(|(j, &(px, py))| {
                    j != i
                        && px + keep_clear > b.0
                        && px - keep_clear < b.2
                        && py + keep_clear > b.1
                        && py - keep_clear < b.3
                });
                if !hits_box && !hits_anchor {
                    let dx = (b.0 - ax).max(ax - b.2).max(0) as i64;
                    let dy = (b.1 - ay).max(ay - b.3).max(0) as i64;
                    // Leader lines that cross a label make it hard to tell whose it is.
                    let leader = ((ax, ay), nearest_edge(b, (ax, ay)));
                    let crossings = placed
                        .iter()
                        .zip(&leaders)
                        .filter(|(p, l)| crosses(leader, **p) || crosses(**l, b))
                        .count() as u64;
                    let key = (occupancy.cost(b) + crossings * CROSSING, dx * dx + dy * dy);
                    if best.is_none_or(|(c, d, _)| key < (c, d)) {
                        best = Some((key.0, key.1, b));
                    }
                }
                y += 2;
            }
        }
        // With no clear place at all (a plot too small for its labels), beside the anchor.
        let b =
            best.map(|(_, _, b)| b).unwrap_or((ax + keep_clear, ay - h / 2, ax + w, ay + h / 2));
        leaders.push(((ax, ay), nearest_edge(b, (ax, ay))));
        placed.push(b);
    }
    placed
}

/// What a leader line crossing another label costs, in units of covered data weight (about a
/// line's width across a label).
const CROSSING: u64 = 2_000;

/// True when the segment `a`–`b` passes through the inside of box `r` (Liang–Barsky clipping).
fn crosses(((ax, ay), (bx, by)): ((i32, i32), (i32, i32)), r: LabelBox) -> bool {
    let (dx, dy) = (f64::from(bx - ax), f64::from(by - ay));
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    // The box's inside, one pixel in from its edges: touching an edge is not crossing.
    let (x0, x1, y0, y1) = (r.0 + 1, r.2 - 2, r.1 + 1, r.3 - 2);
    let sides = [
        (-dx, f64::from(ax - x0)),
        (dx, f64::from(x1 - ax)),
        (-dy, f64::from(ay - y0)),
        (dy, f64::from(y1 - ay)),
    ];
    for (p, q) in sides {
        if p == 0.0 {
            if q < 0.0 {
                return false;
            }
        } else {
            let t = q / p;
            if p < 0.0 {
                t0 = t0.max(t);
            } else {
                t1 = t1.min(t);
            }
        }
    }
    t0 < t1
}

/// The point of `b`'s edge nearest to `p`: where a leader line from `p` meets the box.
pub(crate) fn nearest_edge(b: LabelBox, p: (i32, i32)) -> (i32, i32) {
    (p.0.clamp(b.0, b.2 - 1), p.1.clamp(b.1, b.3 - 1))
}

/// The part of the segment `a`–`b` inside the box `lo..=hi` (Liang–Barsky), its ends rounded to
/// pixels; `None` when the segment misses the box. Worked in `f64`, so ends anywhere in `i32`
/// neither overflow nor cost a step per pixel outside the box.
fn clip(
    a: (i32, i32),
    b: (i32, i32),
    lo: (i32, i32),
    hi: (i32, i32),
) -> Option<((i32, i32), (i32, i32))> {
    let (ax, ay) = (f64::from(a.0), f64::from(a.1));
    let (dx, dy) = (f64::from(b.0) - ax, f64::from(b.1) - ay);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    let edges = [
        (-dx, ax - f64::from(lo.0)),
        (dx, f64::from(hi.0) - ax),
        (-dy, ay - f64::from(lo.1)),
        (dy, f64::from(hi.1) - ay),
    ];
    for (p, q) in edges {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
            continue;
        }
        let r = q / p;
        if p < 0.0 {
            t0 = t0.max(r);
        } else {
            t1 = t1.min(r);
        }
        if t0 > t1 {
            return None;
        }
    }
    let at = |t: f64| ((ax + t * dx).round() as i32, (ay + t * dy).round() as i32);
    Some((at(t0), at(t1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_avoid_data_each_other_and_anchors() {
        // A horizontal line through the middle of a 200×100 area, two anchors on it.
        let mut occ = Occupancy::new((0, 200), (0, 100));
        occ.mark_path(&[(0, 50), (200, 50)], 1, 4);
        occ.finish();
        assert_eq!(occ.cost((0, 0, 200, 100)), 4 * 3 * 200);
        let anchors = [(100, 50), (104, 50)];
        let boxes = place(&occ, &anchors, &[(60, 16), (60, 16)], 7);
        for (i, b) in boxes.iter().enumerate() {
            assert_eq!(occ.cost(*b), 0, "box {i} on the line: {b:?}");
            assert!(b.0 >= 0 && b.2 <= 200 && b.1 >= 0 && b.3 <= 100, "{b:?}");
            for &(x, y) in &anchors {
                assert!(!(x >= b.0 && x < b.2 && y >= b.1 && y < b.3), "{b:?}");
            }
        }
        let (a, b) = (boxes[0], boxes[1]);
        assert!(a.2 <= b.0 || b.2 <= a.0 || a.3 <= b.1 || b.3 <= a.1, "{a:?} {b:?}");
        // The nearest clear place: just above or below the line, clear of the other anchor.
        assert!((a.3 - 50).abs() <= 10 || (a.1 - 50).abs() <= 10, "{a:?}");
        assert!(a.0 <= 100 + 30 && a.2 >= 100 - 30, "beside its anchor: {a:?}");
    }

    #[test]
    fn leader_lines_cross_boxes_only_through_their_inside() {
        let r = (10, 10, 20, 20);
        assert!(crosses(((0, 15), (30, 15)), r));
        assert!(!crosses(((0, 0), (30, 0)), r));
        assert!(!crosses(((15, 0), (15, 10)), r), "ends on the edge");
        assert!(crosses(((0, 0), (30, 30)), r));
    }

    #[test]
    fn paths_far_outside_the_area_cost_no_more_than_one_across_it() {
        // A hostile time puts points a billion pixels off the plot: only the columns of the
        // area are walked, and what lies in it is marked as for a path that stays inside.
        let area = || Occupancy::new((0, 100), (0, 50));
        let cost = |mark: &dyn Fn(&mut Occupancy), (x0, y0, x1, y1)| {
            let mut o = area();
            mark(&mut o);
            o.finish();
            (o.cost((x0, y0, x1, y1)), o.cost((0, 0, 100, 50)))
        };
        let below = |o: &mut Occupancy| o.mark_below(&[(-1_000_000_000, 20), (1 << 30, 20)], 1);
        assert_eq!(cost(&below, (0, 20, 100, 50)), (100 * 30, 100 * 30), "under the line");
        let row = |o: &mut Occupancy| o.mark_path(&[(i32::MIN, 10), (i32::MAX, 10)], 0, 2);
        assert_eq!(cost(&row, (0, 10, 100, 11)), (100 * 2, 100 * 2), "the row it crosses");
        let column = |o: &mut Occupancy| o.mark_path(&[(50, i32::MIN), (50, i32::MAX)], 0, 2);
        assert_eq!(cost(&column, (50, 0, 51, 50)), (50 * 2, 50 * 2), "the column it crosses");
        // y = x from corner to corner of i32: under it in the columns it crosses (50 - x
        // pixels in column x), and the bottom pixel where it runs below the area.
        let diagonal =
            |o: &mut Occupancy| o.mark_below(&[(i32::MIN, i32::MIN), (i32::MAX, i32::MAX)], 1);
        let crossed: u64 = (0..50).map(|x| 50 - x).sum();
        assert_eq!(cost(&diagonal, (0, 0, 50, 50)), (crossed, crossed + 50), "the diagonal");
    }

    #[test]
    fn areas_below_a_line_are_data_too() {
        let mut occ = Occupancy::new((0, 100), (0, 100));
        occ.mark_below(&[(0, 60), (100, 60)], 1);
        occ.finish();
        assert_eq!(occ.cost((0, 0, 100, 60)), 0);
        assert_eq!(occ.cost((0, 60, 100, 100)), 100 * 40);
    }
}
