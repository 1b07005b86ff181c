//! Where the decoder's bytes come from: a whole input in memory ([`Slice`], whose strings are
//! borrowed) or a stream ([`Stream`], whose strings are copied out of a small buffer).
//!
//! Both give the same bytes and the same failures; only a stream cannot say how many bytes remain
//! before it reaches its end, so a declared length is checked while its body is read, never by
//! reserving it first.

use super::Strings;
use std::io::BufRead;

/// Why an input could not give what an opcode asked for.
#[derive(Debug)]
pub(crate) enum Short {
    /// The input ended; `remaining` bytes were left when the opcode's argument began.
    End { remaining: u64 },
    /// A protocol-0 argument has no end of line.
    NoEol,
    /// The underlying reader failed.
    Io(std::io::Error),
}

/// A source of pickle bytes.
pub(crate) trait Input<'a> {
    /// The offset of the next byte.
    fn pos(&self) -> u64;
    /// The bytes left, when known (a whole input); `None` for a stream.
    fn remaining(&self) -> Option<u64>;
    /// The next byte, or `None` at the end.
    fn byte(&mut self) -> Result<Option<u8>, Short>;
    /// The next bytes that are at hand (buffered), without consuming them: a few or none near
    /// a buffer's end, whatever the input holds beyond.
    fn window(&self) -> &[u8];
    /// Consumes `n` bytes of [`Input::window`] (at most its length).
    fn skip(&mut self, n: usize);
    /// Fills `buf` with the next bytes.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), Short>;
    /// Adds the next `n` bytes to `strs` as one string.
    fn string(&mut self, n: u64, strs: &mut Strings<'a>) -> Result<(), Short>;
    /// The next `n` bytes, in a vector that grows only as they arrive.
    fn vec(&mut self, n: u64) -> Result<Vec<u8>, Short>;
    /// The bytes up to the next newline, which is consumed and not returned.
    fn line(&mut self) -> Result<Vec<u8>, Short>;
}

/// A whole input in memory.
pub(crate) struct Slice<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Slice<'a> {
    #[inline]
    fn take(&mut self, n: u64) -> Result<&'a [u8], Short> {
        let data: &'a [u8] = self.data;
        let remaining = data.len().saturating_sub(self.pos);
        if n > remaining as u64 {
            return Err(Short::End { remaining: remaining as u64 });
        }
        let s = &data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
}

impl<'a> Input<'a> for Slice<'a> {
    #[inline]
    fn pos(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> Option<u64> {
        Some(self.data.len().saturating_sub(self.pos) as u64)
    }

    #[inline]
    fn byte(&mut self) -> Result<Option<u8>, Short> {
        let b = self.data.get(self.pos).copied();
        self.pos += b.is_some() as usize;
        Ok(b)
    }

    #[inline]
    fn window(&self) -> &[u8] {
        self.data.get(self.pos..).unwrap_or(&[])
    }

    #[inline]
    fn skip(&mut self, n: usize) {
        self.pos += n;
    }

    #[inline]
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), Short> {
        buf.copy_from_slice(self.take(buf.len() as u64)?);
        Ok(())
    }

    #[inline]
    fn string(&mut self, n: u64, strs: &mut Strings<'a>) -> Result<(), Short> {
        strs.push_borrowed(self.take(n)?);
        Ok(())
    }

    fn vec(&mut self, n: u64) -> Result<Vec<u8>, Short> {
        self.take(n).map(<[u8]>::to_vec)
    }

    fn line(&mut self) -> Result<Vec<u8>, Short> {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        let n = rest.iter().position(|&b| b == b'\n').ok_or(Short::NoEol)?;
        self.pos += n + 1;
        Ok(rest[..n].to_vec())
    }
}

/// The bytes a [`Stream`] reads at a time.
const CHUNK: usize = 64 << 10;

/// A stream read through a buffer of [`CHUNK`] bytes, which is all it holds besides what the
/// decoder keeps.
pub(crate) struct Stream<'r> {
    inner: &'r mut dyn BufRead,
    buf: Box<[u8]>,
    at: usize,
    len: usize,
    /// Bytes consumed before `buf[0]`.
    before: u64,
    /// Whether the reader has reported its end.
    ended: bool,
}

impl<'r> Stream<'r> {
    pub(crate) fn new(inner: &'r mut dyn BufRead) -> Self {
        Stream {
            inner,
            buf: vec![0; CHUNK].into_boxed_slice(),
            at: 0,
            len: 0,
            before: 0,
            ended: false,
        }
    }

    /// The buffered bytes not yet consumed, reading more when there are none; empty at the end.
    fn available(&mut self) -> Result<&[u8], Short> {
        if self.at == self.len && !self.ended {
            self.before += self.len as u64;
            self.at = 0;
            self.len = 0;
            loop {
                match self.inner.read(&mut self.buf) {
                    Ok(0) => self.ended = true,
                    Ok(n) => self.len = n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Short::Io(e)),
                }
                break;
            }
        }
        Ok(&self.buf[self.at..self.len])
    }

    /// Passes the next `n` bytes to `each` in pieces; `End` (with the bytes that were left) when
    /// the stream ends first.
    fn pieces(&mut self, n: u64, mut each: impl FnMut(&[u8])) -> Result<(), Short> {
        let mut left = n;
        while left > 0 {
            let piece = self.available()?;
            if piece.is_empty() {
                return Err(Short::End { remaining: n - left });
            }
            let k = piece.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            each(&piece[..k]);
            self.at += k;
            left -= k as u64;
        }
        Ok(())
    }
}

impl<'a> Input<'a> for Stream<'_> {
    #[inline]
    fn pos(&self) -> u64 {
        self.before + self.at as u64
    }

    fn remaining(&self) -> Option<u64> {
        None
    }

    #[inline]
    fn byte(&mut self) -> Result<Option<u8>, Short> {
        if self.at < self.len {
            let b = self.buf[self.at];
            self.at += 1;
            return Ok(Some(b));
        }
        let b = self.available()?.first().copied();
        self.at += b.is_some() as usize;
        Ok(b)
    }

    #[inline]
    fn window(&self) -> &[u8] {
        self.buf.get(self.at..self.len).unwrap_or(&[])
    }

    #[inline]
    fn skip(&mut self, n: usize) {
        self.at += n;
    }

    #[inline]
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), Short> {
        if let Some(s) =
            self.buf.get(self.at..self.at + buf.len()).filter(|_| self.at + buf.len() <= self.len)
        {
            buf.copy_from_slice(s);
            self.at += buf.len();
            return Ok(());
        }
        let mut filled = 0;
        self.pieces(buf.len() as u64, |p| {
            buf[filled..filled + p.len()].copy_from_slice(p);
            filled += p.len();
        })
    }

    fn string(&mut self, n: u64, strs: &mut Strings<'a>) -> Result<(), Short> {
        let start = strs.bytes_mut().len();
        let got = self.pieces(n, |p| strs.bytes_mut().extend_from_slice(p));
        if got.is_err() {
            strs.bytes_mut().truncate(start);
        }
        got?;
        strs.close_owned();
        Ok(())
    }

    fn vec(&mut self, n: u64) -> Result<Vec<u8>, Short> {
        let mut v = Vec::new();
        self.pieces(n, |p| v.extend_from_slice(p))?;
        Ok(v)
    }

    fn line(&mut self) -> Result<Vec<u8>, Short> {
        let mut v = Vec::new();
        loop {
            let piece = self.available()?;
            if piece.is_empty() {
                return Err(Short::NoEol);
            }
            match piece.iter().position(|&b| b == b'\n') {
                Some(n) => {
                    v.extend_from_slice(&piece[..n]);
                    self.at += n + 1;
                    return Ok(v);
                }
                None => {
                    let n = piece.len();
                    v.extend_from_slice(piece);
                    self.at += n;
                }
            }
        }
    }
}
