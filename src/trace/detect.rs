//! Telling a trace's format from its first bytes.
//!
//! Users rename files and pipe them around, so the extension is only a hint for writing: reading
//! looks at the content. Each format has a cheap, unambiguous signature.

use super::{fst, Format, FORMATS};

/// The format `data` (already decompressed) is in, or `None` when no reader recognises it: the
/// first row of [`FORMATS`] whose signature matches.
pub fn detect(data: &[u8]) -> Option<Format> {
    FORMATS.iter().find(|f| (f.detect)(data)).map(|f| f.format)
}

/// fragsim's binary format starts with its magic.
pub(crate) fn is_fst(data: &[u8]) -> bool {
    data.starts_with(fst::MAGIC)
}

/// A pickle of protocol 2+ starts with PROTO (0x80) and its version.
pub(crate) fn is_pickle(data: &[u8]) -> bool {
    data.len() >= 2 && data[0] == 0x80 && (2..=5).contains(&data[1])
}

/// JSON (a Kineto trace) starts with `{` or `[`, after a byte-order mark and white space.
pub(crate) fn is_kineto(data: &[u8]) -> bool {
    let head = text_head(data);
    let head = head.trim_start_matches('\u{feff}').trim_start();
    head.starts_with('{') || head.starts_with('[')
}

/// An RMM log's first line is its header, `Thread,Time,Action,...` (any case, spaces allowed).
pub(crate) fn is_rmm_csv(data: &[u8]) -> bool {
    let head = text_head(data);
    let first_line = head.trim_start_matches('\u{feff}').trim_start().lines().next().unwrap_or("");
    first_line.replace(' ', "").to_ascii_lowercase().starts_with("thread,time,action")
}

/// fragsim text: see [`super::text::looks_like_text`].
pub(crate) fn is_text(data: &[u8]) -> bool {
    super::text::looks_like_text(text_head(data).trim_start_matches('\u{feff}').trim_start())
}

/// The first 4 KiB as text, enough for every text signature.
fn text_head(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&data[..data.len().min(4096)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_each_signature() {
        assert_eq!(detect(b"\x80\x04\x95"), Some(Format::PytorchSnapshot));
        assert_eq!(detect(b"  {\"traceEvents\": []}"), Some(Format::Kineto));
        assert_eq!(detect(b"Thread,Time,Action,Pointer,Size,Stream\n"), Some(Format::RmmCsv));
        assert_eq!(detect(b"# fragsim text trace\nalloc 0x10 4 s0\n"), Some(Format::Text));
        assert_eq!(detect(b"FRAGSIM\0\x01\0\0\0"), Some(Format::Fst));
        assert_eq!(detect("\u{feff}[{\"ph\": \"i\"}]".as_bytes()), Some(Format::Kineto));
        assert_eq!(
            detect(b"thread, time, action, pointer, size, stream\r\n"),
            Some(Format::RmmCsv)
        );
        assert_eq!(detect(b"# written by hand\n\n# nothing yet\n"), Some(Format::Text));
        assert_eq!(detect(b"\x00\x01garbage"), None);
        assert_eq!(detect(b""), None);
    }
}
