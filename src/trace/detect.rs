//! Telling a trace's format from its first bytes.
//!
//! Users rename files and pipe them around, so the extension is only a hint for writing: reading
//! looks at the content. Each format has a cheap, unambiguous signature.

use super::{fst, Format};

/// The format `data` (already decompressed) is in, or `None` when no reader recognises it.
pub fn detect(data: &[u8]) -> Option<Format> {
    if data.starts_with(fst::MAGIC) {
        return Some(Format::Fst);
    }
    // A pickle of protocol 2+ starts with PROTO (0x80) and its version.
    if data.len() >= 2 && data[0] == 0x80 && (2..=5).contains(&data[1]) {
        return Some(Format::PytorchSnapshot);
    }
    let head = &data[..data.len().min(4096)];
    let text = String::from_utf8_lossy(head);
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return Some(Format::Kineto);
    }
    let first_line = trimmed.lines().next().unwrap_or("");
    if first_line.replace(' ', "").to_ascii_lowercase().starts_with("thread,time,action") {
        return Some(Format::RmmCsv);
    }
    if super::text::looks_like_text(trimmed) {
        return Some(Format::Text);
    }
    None
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
        assert_eq!(detect(b"\x00\x01garbage"), None);
        assert_eq!(detect(b""), None);
    }
}
