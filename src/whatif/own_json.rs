//! Reading the JSON files fragsim itself wrote (a sweep part for `merge`, a baseline for
//! `check`): untrusted like every input, and small, so the cap is far below a trace's.

use crate::error::{Error, Result};
use std::path::Path;

/// The most bytes of a JSON file fragsim wrote (a sweep part, a baseline) that a command reads:
/// a sweep of thousands of configs is a few MB, so a file beyond this is no such file (and
/// `/dev/zero` or an endless pipe stops here, not at the trace cap of gigabytes).
pub const MAX_OWN_JSON_BYTES: u64 = 64 << 20;

/// Reads a JSON file fragsim wrote (a sweep part, a baseline) under a cap that binds while
/// reading: [`MAX_OWN_JSON_BYTES`], or `max_input_bytes` (`--max-input-size`) where lower. A file that does
/// not start as a JSON object (after white space) is refused at its first bytes, so a device or
/// a binary file fails at once. `what` names the file's role in errors, which name the file and
/// the byte.
pub fn read(path: &Path, what: &str, max_input_bytes: Option<u64>) -> Result<Vec<u8>> {
    use std::io::Read;
    let options = crate::trace::ReadOptions { max_input_bytes, ..Default::default() };
    let cap = options.input_cap()?.min(MAX_OWN_JSON_BYTES);
    let cannot = |e: std::io::Error| {
        let text = e.to_string();
        let reason = text.find(" (os error").map_or(text.as_str(), |i| &text[..i]).to_string();
        Error::input(format!("cannot read the {what}: {reason}")).in_file(path)
    };
    let too_big = || {
        Error::input(format!(
            "the {what} holds more than {cap} bytes, the input limit for a JSON file fragsim \
             wrote ({MAX_OWN_JSON_BYTES} bytes, or --max-input-size where lower)"
        ))
        .in_file(path)
        .at(crate::error::Place::Byte(cap))
    };
    let file = crate::trace::open_input(path).map_err(cannot)?;
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(Error::input(format!("cannot read the {what}: it is a folder")).in_file(path));
    }
    if file.metadata().is_ok_and(|m| m.is_file() && m.len() > cap) {
        return Err(too_big());
    }
    let mut input = file.take(cap.saturating_add(1));
    let mut data = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut checked = false;
    loop {
        let n = match input.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(cannot(e)),
        };
        data.extend_from_slice(&chunk[..n]);
        if !checked {
            checked = starts_as_json(&data, what, path)?;
        }
        if data.len() as u64 > cap {
            return Err(too_big());
        }
    }
    Ok(data)
}

/// Whether `data`, the first bytes of the `what` at `path`, tell yet that it is a JSON object
/// (its first byte past whitespace and a byte-order mark is `{`); an error where they tell it
/// is not, so that a binary file is refused at its first chunk, not read to the cap.
fn starts_as_json(data: &[u8], what: &str, path: &Path) -> Result<bool> {
    let Some(i) = data.iter().position(|b| !b.is_ascii_whitespace()) else { return Ok(false) };
    let skip = if data[i..].starts_with(b"\xef\xbb\xbf") { i + 3 } else { i };
    match data.get(skip) {
        Some(b'{') => Ok(true),
        Some(&b) => Err(Error::input(format!(
            "the {what} is not a JSON file fragsim wrote: it starts with byte 0x{b:02x}, not '{{'"
        ))
        .in_file(path)
        .at(crate::error::Place::Byte(skip as u64))),
        None => Ok(false),
    }
}
