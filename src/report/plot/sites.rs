//! `sites.*`: where the memory went, by allocation site, at each policy's peak: one panel per
//! policy, one horizontal bar per site (its largest first), split into the site's live requested
//! bytes, its rounding, and the cached-but-free bytes in the memory its requests obtained (the
//! holes by segment site of [`crate::blame`]). Bars share one byte scale across panels, so
//! policies compare at a glance; the sites beyond the first few of a panel are one `(other)` bar.
//!
//! Site names are long paths: each keeps its end (file name, line, function), and the names sit
//! in their own column left of the bars, never over them. Values are written right of each bar.

use super::style::{self, *};
use crate::blame::Attribution;
use crate::report::bundle::ReportData;
use crate::units::format_bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use std::collections::HashMap;

/// The chart; see the module docs.
pub struct Sites<'a> {
    /// What to draw.
    pub(crate) data: &'a ReportData,
}

/// Sites shown per panel before the rest fold into `(other)`.
pub const SITES_PER_PANEL: usize = 6;

const ROW: i32 = 30;
const PANEL_HEAD: i32 = 40;
const WIDTH: u32 = 1500;
const NAME_CHARS: usize = 64;

/// One bar: a site's live, rounding and cached-free bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteBar {
    /// The site.
    pub(crate) site: String,
    /// Live requested bytes.
    pub(crate) live: u64,
    /// Rounding.
    pub(crate) rounding: u64,
    /// Cached-free bytes in the memory its requests obtained.
    pub(crate) cached: u64,
}

impl SiteBar {
    fn total(&self) -> u64 {
        self.live + self.rounding + self.cached
    }
}

/// The bars of one policy's breakdown: every site's three parts, the largest `n` totals first,
/// the rest as one `(other)` bar, so the bars add up to the reserved bytes.
pub(crate) fn bars(a: &Attribution, n: usize) -> Vec<SiteBar> {
    let mut by: HashMap<&str, SiteBar> = HashMap::new();
    let bar = |site: &str| SiteBar { site: site.to_string(), live: 0, rounding: 0, cached: 0 };
    for s in &a.sites {
        let b = by.entry(&s.site).or_insert_with(|| bar(&s.site));
        b.live += s.live_bytes;
        b.rounding += s.rounding_bytes;
    }
    for h in &a.holes_by_segment_site {
        by.entry(&h.site).or_insert_with(|| bar(&h.site)).cached += h.cached_free_bytes;
    }
    let mut all: Vec<SiteBar> = by.into_values().collect();
    all.sort_by(|x, y| y.total().cmp(&x.total()).then(x.site.cmp(&y.site)));
    let other = all.iter().position(|b| b.site == crate::blame::OTHER);
    let mut folded = other.map(|i| all.remove(i));
    if all.len() > n {
        for b in all.split_off(n) {
            let o = folded.get_or_insert_with(|| bar(crate::blame::OTHER));
            o.live += b.live;
            o.rounding += b.rounding;
            o.cached += b.cached;
        }
    }
    all.extend(folded);
    all
}

impl Sites<'_> {
    /// The panels: each policy's label and bars, in report order (policies with nothing
    /// reserved at their peak left out).
    fn panels(&self) -> Vec<(String, Vec<SiteBar>)> {
        self.data
            .sites
            .iter()
            .filter(|(_, a)| a.reserved_bytes > 0)
            .map(|(label, a)| (label.clone(), bars(a, SITES_PER_PANEL)))
            .collect()
    }
}

impl Chart for Sites<'_> {
    fn size(&self) -> (u32, u32) {
        let rows: i32 = self.panels().iter().map(|(_, b)| PANEL_HEAD + ROW * b.len() as i32).sum();
        (WIDTH, (150 + rows).max(260) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> ChartResult {
        let (w, _) = self.size();
        let title = format!(
            "Where the memory went at each policy's peak, by allocation site: {}",
            truncate(&self.data.trace.file_name(), 50)
        );
        draw_title(root, &title, w)?;
        style::draw_parts_legend(
            root,
            (90, 52),
            [
                "live requested bytes",
                "rounding (block − request)",
                "cached free in the memory its requests obtained",
            ],
        )?;
        let panels = self.panels();
        if panels.is_empty() {
            root.draw(&Text::new(
                "no policy held memory at its peak",
                (w as i32 / 2, 140),
                anchored(text(LABEL), HPos::Center, VPos::Center),
            ))
            .or_draw_error()?;
            return Ok(());
        }
        let names: Vec<String> = panels
            .iter()
            .flat_map(|(_, b)| b.iter().map(|s| crate::blame::keep_end(&s.site, NAME_CHARS)))
            .collect();
        let name_w =
            names.iter().map(|n| text_width(n, SMALL)).max().unwrap_or(100).clamp(100, 620) + 20;
        let max = panels.iter().flat_map(|(_, b)| b.iter().map(SiteBar::total)).max().unwrap_or(1);
        let x0 = 16 + name_w;
        let value_room = 190;
        let x1 = w as i32 - 16 - value_room;
        let px =
            |bytes: u64| x0 + ((x1 - x0) as f64 * bytes as f64 / max.max(1) as f64).round() as i32;
        let mut y = 100;
        for (label, bars) in &panels {
            root.draw(&Text::new(
                label.clone(),
                (16, y + PANEL_HEAD / 2),
                anchored(bold(LABEL), HPos::Left, VPos::Center),
            ))
            .or_draw_error()?;
            root.draw(&PathElement::new(
                vec![(16, y + PANEL_HEAD - 4), (w as i32 - 16, y + PANEL_HEAD - 4)],
                GRID.stroke_width(1),
            ))
            .or_draw_error()?;
            y += PANEL_HEAD;
            for b in bars {
                let (top, bottom) = (y + 5, y + ROW - 5);
                let mut at = 0u64;
                for (bytes, color) in
                    [(b.live, REQUESTED), (b.rounding, ROUNDING), (b.cached, CACHED)]
                {
                    if bytes > 0 {
                        root.draw(&Rectangle::new(
                            [(px(at), top), (px(at + bytes).max(px(at) + 1), bottom)],
                            color.filled(),
                        ))
                        .or_draw_error()?;
                    }
                    at += bytes;
                }
                root.draw(&Rectangle::new(
                    [(x0, top), (px(at).max(x0 + 1), bottom)],
                    INK.stroke_width(1),
                ))
                .or_draw_error()?;
                root.draw(&Text::new(
                    crate::blame::keep_end(&b.site, NAME_CHARS),
                    (x0 - 10, y + ROW / 2),
                    anchored(text(SMALL), HPos::Right, VPos::Center),
                ))
                .or_draw_error()?;
                root.draw(&Text::new(
                    format_bytes(b.total()),
                    (px(at) + 8, y + ROW / 2),
                    anchored(text(SMALL), HPos::Left, VPos::Center),
                ))
                .or_draw_error()?;
                y += ROW;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blame::{HoleBytes, MomentAt, SiteBytes};

    #[test]
    fn bars_add_up_to_reserved_and_fold_the_rest() {
        let site = |s: &str, live, rounding| SiteBytes {
            site: s.into(),
            live_bytes: live,
            rounding_bytes: rounding,
            blocks: 1,
        };
        let hole = |s: &str, b| HoleBytes { site: s.into(), cached_free_bytes: b };
        let a = Attribution {
            policy: "p".into(),
            config: String::new(),
            moment: MomentAt { kind: "peak".into(), event: 3 },
            reserved_bytes: 175,
            live_bytes: 100,
            rounding_bytes: 10,
            cached_free_bytes: 65,
            sites: vec![site("a", 50, 5), site("b", 30, 5), site("c", 20, 0)],
            holes_by_segment_site: vec![hole("c", 60), hole("(never allocated)", 5)],
            holes_by_last_free_site: vec![],
            stacks: vec![],
            note: None,
        };
        let b = bars(&a, 2);
        assert_eq!(b.iter().map(|b| b.site.as_str()).collect::<Vec<_>>(), ["c", "a", "(other)"]);
        assert_eq!(b.iter().map(SiteBar::total).sum::<u64>(), 175);
    }
}
