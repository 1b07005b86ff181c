//! The flame graph of `blame --flamegraph`: live requested bytes at the moment by full stack,
//! drawn by `inferno` (the flame-graph crate of cargo-flamegraph).
//!
//! Stacks are shown as memory_viz shows them ([`sites::shown`]), outermost frame at the bottom;
//! an entry without frames is one bar named by its site.

use super::Attribution;
use crate::error::{Error, Result};
use crate::trace::sites;
use crate::trace::{FramesId, Trace};
use std::path::Path;

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
                "" | "??" => f.name.clone(),
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

/// Writes `a`'s flame graph as an SVG to `path`, titled `title`.
pub fn write_svg(a: &Attribution, trace: &Trace, title: &str, path: &Path) -> Result<()> {
    write_lines(&folded(a, trace), title, path)
}

/// Writes the flame graph of folded `lines` ([`folded`]) as an SVG to `path`, titled `title`.
pub fn write_lines(lines: &[String], title: &str, path: &Path) -> Result<()> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "bytes".to_string();
    options.name_type = "Site:".to_string();
    options.hash = true;
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::new(file);
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .map_err(|e| Error::io(path, std::io::Error::other(e.to_string())))?;
    use std::io::Write;
    out.flush().map_err(|e| Error::io(path, e))
}
