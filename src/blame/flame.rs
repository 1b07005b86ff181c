//! The flame graph of `blame --flamegraph` (and the report's `flame.svg`): live requested bytes
//! at the moment by full stack, drawn by fragsim itself as an SVG.
//!
//! Stacks are shown as memory_viz shows them (`sites::shown`), outermost frame at the bottom;
//! an entry without frames is one bar named by its site. Each frame is a rectangle as wide as the
//! bytes live under it, with a `<title>` tooltip (name, bytes, share); children sit on their
//! parent in name order. Rectangles narrower than [`MIN_WIDTH`] pixels are not drawn (their bytes
//! stay in their parent's width), so the file stays small however many stacks there are. Every
//! name is XML-escaped, with control characters written out (`sites::printable`), so the file
//! is well-formed whatever the trace holds.

use super::Attribution;
use crate::error::{Error, Result};
use crate::trace::sites;
use crate::trace::{FramesId, Trace};
use crate::units::format_bytes;
use std::collections::HashMap;
use std::fmt::Write as _;

/// The SVG's width in pixels.
const WIDTH: f64 = 1200.0;
/// The margin left and right of the bars.
const PAD: f64 = 10.0;
/// One frame's height.
const ROW: f64 = 16.0;
/// Space above the bars for the title.
const TOP: f64 = 40.0;
/// Space below the bars.
const BOTTOM: f64 = 24.0;
/// The narrowest rectangle drawn, in pixels.
pub const MIN_WIDTH: f64 = 0.1;
/// The width of one character of the bars' 12-pixel text, roughly.
const CHAR: f64 = 7.0;
/// The deepest stack drawn: deeper frames are folded into the last row's frame.
pub const MAX_DEPTH: usize = 256;

/// The folded lines (`outer;...;inner BYTES`) of `a`'s live bytes by stack.
pub fn folded(a: &Attribution, trace: &Trace) -> Vec<String> {
    let mut lines = Vec::with_capacity(a.stacks.len());
    for &(id, bytes) in &a.stacks {
        let frames = trace.frames.get(id);
        let mut names: Vec<String> = frames
            .iter()
            .rev()
            .filter(|f| sites::shown(f))
            .map(|f| match f.filename.as_str() {
                "" | "??" => sites::printable(&f.name).into_owned(),
                _ => sites::describe(f),
            })
            .map(|n| n.replace(';', ","))
            .collect();
        if names.is_empty() {
            names.push(if id == FramesId::NONE {
                sites::NO_FRAMES.to_string()
            } else {
                sites::site_of(frames)
            });
        }
        lines.push(format!("{} {bytes}", names.join(";")));
    }
    lines
}

/// `a`'s flame graph as an SVG document, titled `title`; an error when nothing is live.
pub(crate) fn svg_of(a: &Attribution, trace: &Trace, title: &str) -> Result<String> {
    svg(&folded(a, trace), title)
}

/// One frame of the merged stacks.
struct Node {
    name: String,
    bytes: u64,
    children: Vec<usize>,
}

/// The flame graph of folded `lines` ([`folded`]) as an SVG document, titled `title`. A line
/// that is not `STACK BYTES` is an error naming its number; no live bytes at all is an error
/// too, as there is nothing to draw.
pub fn svg(lines: &[String], title: &str) -> Result<String> {
    let mut nodes = vec![Node { name: "all".into(), bytes: 0, children: Vec::new() }];
    let mut index: HashMap<(usize, &str), usize> = HashMap::new();
    let mut depth = 0;
    for (i, line) in lines.iter().enumerate() {
        let (stack, count) = line.rsplit_once(' ').ok_or_else(|| {
            Error::input(format!("flame graph line {}: expected 'STACK BYTES'", i + 1))
        })?;
        let bytes: u64 = count.parse().map_err(|_| {
            Error::input(format!("flame graph line {}: '{count}' is not a byte count", i + 1))
        })?;
        if bytes == 0 {
            continue;
        }
        nodes[0].bytes = nodes[0].bytes.saturating_add(bytes);
        let mut at = 0;
        for (d, name) in stack.split(';').enumerate().take(MAX_DEPTH) {
            let next = match index.get(&(at, name)) {
                Some(&n) => n,
                None => {
                    nodes.push(Node { name: name.to_string(), bytes: 0, children: Vec::new() });
                    let n = nodes.len() - 1;
                    nodes[at].children.push(n);
                    index.insert((at, name), n);
                    n
                }
            };
            nodes[next].bytes = nodes[next].bytes.saturating_add(bytes);
            at = next;
            depth = depth.max(d + 1);
        }
    }
    let total = nodes[0].bytes;
    if total == 0 {
        return Err(Error::input(
            "no live requested bytes at this moment: there is no flame graph to draw",
        ));
    }
    for i in 0..nodes.len() {
        let mut children = std::mem::take(&mut nodes[i].children);
        children.sort_by(|&a, &b| nodes[a].name.cmp(&nodes[b].name));
        nodes[i].children = children;
    }
    let height = TOP + (depth + 1) as f64 * ROW + BOTTOM;
    let scale = (WIDTH - 2.0 * PAD) / total as f64;
    let mut out = String::new();
    let _ = write!(
        out,
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" \
         xmlns=\"http://www.w3.org/2000/svg\">\n\
         <style>text{{font-family:Verdana,sans-serif;font-size:12px;fill:#000}}\
         .t{{font-size:17px}}</style>\n\
         <rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#f8f8f0\"/>\n\
         <text class=\"t\" x=\"{}\" y=\"24\" text-anchor=\"middle\">{}</text>\n",
        WIDTH / 2.0,
        xml(title)
    );
    // Depth first from the root ("all", the bottom row); each entry: node, depth, left x.
    let mut stack = vec![(0usize, 0usize, PAD)];
    while let Some((n, d, x)) = stack.pop() {
        let node = &nodes[n];
        let w = node.bytes as f64 * scale;
        if w < MIN_WIDTH {
            continue;
        }
        let y = TOP + (depth - d) as f64 * ROW;
        let share = 100.0 * node.bytes as f64 / total as f64;
        let name = xml(&node.name);
        let _ = write!(
            out,
            "<g><title>{name} ({}, {share:.2}%)</title>\
             <rect x=\"{x:.2}\" y=\"{y}\" width=\"{w:.2}\" height=\"{}\" fill=\"{}\" rx=\"2\"/>",
            xml(&format_bytes(node.bytes)),
            ROW - 1.0,
            colour(&node.name)
        );
        let fits = ((w - 6.0) / CHAR).floor().max(0.0) as usize;
        if fits >= 3 {
            let label: String = if node.name.chars().count() <= fits {
                node.name.clone()
            } else {
                node.name.chars().take(fits - 2).collect::<String>() + ".."
            };
            let _ =
                write!(out, "<text x=\"{:.2}\" y=\"{}\">{}</text>", x + 3.0, y + 11.5, xml(&label));
        }
        out.push_str("</g>\n");
        let mut cx = x;
        let mut next = Vec::with_capacity(node.children.len());
        for &c in &node.children {
            next.push((c, d + 1, cx));
            cx += nodes[c].bytes as f64 * scale;
        }
        stack.extend(next.into_iter().rev());
    }
    out.push_str("</svg>\n");
    Ok(out)
}

/// `s` escaped for XML text and attribute values, control characters written out.
fn xml(s: &str) -> String {
    sites::xml_escape(s)
}

/// A warm colour for `name`, the same for the same name in every graph.
fn colour(name: &str) -> String {
    // FNV-1a: stable across runs and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let r = 205 + (h % 50);
    let g = (h >> 8) % 230;
    let b = (h >> 16) % 55;
    format!("rgb({r},{g},{b})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_are_proportional_to_bytes_and_names_are_escaped() {
        let lines = vec!["main;a\u{1b}<b> 300".to_string(), "main;c 100".into()];
        let s = svg(&lines, "t & \u{7}").unwrap();
        assert!(s.contains("a\\x1b&lt;b&gt;"), "{s}");
        assert!(s.contains("t &amp; \\x07"), "{s}");
        assert!(!s.contains('\u{1b}') && !s.contains('\u{7}'));
        // main spans the whole width; a takes three quarters of it.
        let inner = WIDTH - 2.0 * PAD;
        assert!(s.contains(&format!("width=\"{inner:.2}\"")), "{s}");
        assert!(s.contains(&format!("width=\"{:.2}\"", inner * 0.75)), "{s}");
        assert_eq!(s.matches("<g>").count(), 4, "all, main, a, c");
    }

    #[test]
    fn nothing_live_and_a_bad_line_are_errors() {
        let e = svg(&[], "t").unwrap_err().to_string();
        assert!(e.contains("no live requested bytes"), "{e}");
        let e = svg(&["a 0".into()], "t").unwrap_err().to_string();
        assert!(e.contains("no live requested bytes"), "{e}");
        let e = svg(&["a x".into()], "t").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("byte count"), "{e}");
    }

    #[test]
    fn narrow_frames_are_not_drawn() {
        let mut lines: Vec<String> = (0..100_000).map(|i| format!("f{i} 1")).collect();
        lines.push("big 1000000000000".into());
        let s = svg(&lines, "t").unwrap();
        assert!(s.len() < 10_000, "{} bytes", s.len());
    }
}
