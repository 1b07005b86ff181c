//! The records of a chunked `.fst` file decoded straight from bincode's wire format: a chunk's
//! events and recorded totals, without serde.
//!
//! Why: a streamed replay reads the file three times (twice before the first policy runs), and
//! a loaded one once; through bincode's serde path the decoding was over half of a streamed
//! `pytorch` replay's time, each field going through a visitor and a limit check of its own.
//! The wire format is simple (bincode's `standard()` configuration: little-endian varints, a
//! sequence as its length and then its items, an enum as its variant's index), so the common
//! case, a well-formed chunk, is decoded here in a tight loop.
//!
//! This decoder takes no decision of its own about bad input. It accepts only what bincode
//! accepts, and returns what bincode would return; anything else (a varint wider than its
//! type, an unknown action, a length the bytes left cannot hold, the end of the input) gives
//! `None`, and the caller decodes the chunk with bincode instead, whose error names the
//! problem. The tests compare the two on valid and on damaged chunks.

use crate::trace::{Action, Event, FramesId, PoolRef, RecordedTotals};

/// A varint's first byte at or below this is the value itself.
const SINGLE_BYTE_MAX: u8 = 250;
/// First bytes that announce a 2-, 4- or 8-byte little-endian value.
const U16_BYTE: u8 = 251;
const U32_BYTE: u8 = 252;
const U64_BYTE: u8 = 253;

/// The fewest bytes an encoded event takes: one per field.
const MIN_EVENT_BYTES: usize = 7;

/// The events and recorded totals of one chunk (the encoding of a
/// `(Vec<Event>, Vec<RecordedTotals>)` tuple) at the start of `bytes`, and the bytes they took.
/// `None` where bincode must decode the chunk instead (see the module docs). `claim_limit` is
/// bincode's limit on the bytes a decode may claim: a chunk long enough to reach it is left to
/// bincode.
pub(super) fn decode(
    bytes: &[u8],
    claim_limit: usize,
) -> Option<(Vec<Event>, Vec<RecordedTotals>, usize)> {
    // Bincode claims at most 8 bytes per value, and every value takes at least one byte.
    if bytes.len() > claim_limit / 8 {
        return None;
    }
    let mut wire = Wire { bytes, at: 0 };
    let n = wire.len(MIN_EVENT_BYTES)?;
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(wire.event()?);
    }
    let n = wire.len(2)?;
    let mut totals = Vec::with_capacity(n);
    for _ in 0..n {
        totals.push(RecordedTotals { allocated: wire.u64()?, reserved: wire.u64()? });
    }
    Some((events, totals, wire.at))
}

/// A read position in a chunk's bytes.
struct Wire<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Wire<'_> {
    #[inline(always)]
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    #[inline(always)]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let taken = self.bytes.get(self.at..self.at + N)?;
        self.at += N;
        taken.try_into().ok()
    }

    /// A varint of a type whose widest form is announced by `WIDEST` ([`U16_BYTE`] for a
    /// `u16`, ...): bincode refuses a wider form, or a reserved first byte.
    #[inline(always)]
    fn varint<const WIDEST: u8>(&mut self) -> Option<u64> {
        match self.byte()? {
            b @ 0..=SINGLE_BYTE_MAX => Some(b as u64),
            U16_BYTE => Some(u16::from_le_bytes(self.array()?) as u64),
            U32_BYTE if WIDEST >= U32_BYTE => Some(u32::from_le_bytes(self.array()?) as u64),
            U64_BYTE if WIDEST >= U64_BYTE => Some(u64::from_le_bytes(self.array()?)),
            _ => None,
        }
    }

    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        self.varint::<U64_BYTE>()
    }

    // The narrower reads' values fit their types: `varint` reads at most their width.
    #[inline(always)]
    fn u32(&mut self) -> Option<u32> {
        self.varint::<U32_BYTE>().map(|v| v as u32)
    }

    #[inline(always)]
    fn u16(&mut self) -> Option<u16> {
        self.varint::<U16_BYTE>().map(|v| v as u16)
    }

    /// A zigzag-encoded signed value, as bincode writes one.
    #[inline(always)]
    fn i64(&mut self) -> Option<i64> {
        let n = self.u64()?;
        Some(if n % 2 == 0 { (n / 2) as i64 } else { !(n / 2) as i64 })
    }

    /// A sequence's length, when the bytes left can hold that many items of at least
    /// `min_item_bytes` each (so that a hostile length reserves nothing).
    #[inline(always)]
    fn len(&mut self, min_item_bytes: usize) -> Option<usize> {
        let n = usize::try_from(self.u64()?).ok()?;
        (n <= (self.bytes.len() - self.at) / min_item_bytes).then_some(n)
    }

    /// One event, its fields in the order of [`Event`]'s (serde writes them so).
    #[inline(always)]
    fn event(&mut self) -> Option<Event> {
        let action = *Action::ALL.get(self.u32()? as usize)?;
        Some(Event {
            action,
            addr: self.u64()?,
            size: self.u64()?,
            stream: self.u64()?,
            time_us: self.i64()?,
            frames: FramesId(self.u32()?),
            pool: PoolRef(self.u16()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{config, DECODE_LIMIT};
    use super::*;

    type Chunk = (Vec<Event>, Vec<RecordedTotals>);

    /// Values at every width boundary of bincode's varints.
    const EDGES: [u64; 12] = [
        0,
        1,
        250,
        251,
        255,
        65_535,
        65_536,
        u32::MAX as u64 - 1,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        u64::MAX - 1,
        u64::MAX,
    ];

    /// Events that use every action, every varint width of every field, and negative times.
    fn sample_events() -> Vec<Event> {
        let mut events = Vec::new();
        for (i, &v) in EDGES.iter().enumerate() {
            for (j, &action) in Action::ALL.iter().enumerate() {
                let w = EDGES[(i + j) % EDGES.len()];
                events.push(Event {
                    action,
                    addr: v,
                    size: w,
                    stream: EDGES[(i + 2 * j) % EDGES.len()],
                    time_us: if j % 2 == 0 { v as i64 } else { -(w as i64) },
                    frames: FramesId(w as u32),
                    pool: PoolRef(v as u16),
                });
            }
        }
        events.push(Event { time_us: i64::MIN, ..events[0] });
        events.push(Event { time_us: i64::MAX, ..events[1] });
        events
    }

    fn sample_totals() -> Vec<RecordedTotals> {
        EDGES
            .iter()
            .zip(EDGES.iter().rev())
            .map(|(&a, &r)| RecordedTotals { allocated: a, reserved: r })
            .collect()
    }

    /// What bincode makes of `bytes`: the chunk and the bytes it took, or `None` on an error.
    fn bincode_decode(bytes: &[u8]) -> Option<(Chunk, usize)> {
        bincode::serde::decode_from_slice::<Chunk, _>(bytes, config()).ok()
    }

    fn fast_decode(bytes: &[u8]) -> Option<(Chunk, usize)> {
        decode(bytes, DECODE_LIMIT).map(|(e, t, used)| ((e, t), used))
    }

    /// Encodings of sample chunks, as the writer makes them.
    fn encodings() -> Vec<Vec<u8>> {
        let (events, totals) = (sample_events(), sample_totals());
        vec![
            encode(&(events.clone(), totals)),
            encode(&(events, Vec::<RecordedTotals>::new())),
            encode(&(Vec::<Event>::new(), Vec::<RecordedTotals>::new())),
        ]
    }

    /// `value` as the writer encodes it.
    fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(value, config()).unwrap()
    }

    #[test]
    fn actions_are_numbered_as_declared() {
        // The decoder maps a variant index to `Action::ALL[index]`: serde numbers the variants
        // in declaration order, so the list must follow it.
        for (i, &action) in Action::ALL.iter().enumerate() {
            let bytes = bincode::serde::encode_to_vec(action, config()).unwrap();
            assert_eq!(bytes, vec![i as u8], "{action:?}");
        }
    }

    #[test]
    fn decodes_what_bincode_decodes() {
        for bytes in encodings() {
            let expected = bincode_decode(&bytes).expect("bincode reads its own encoding");
            assert_eq!(fast_decode(&bytes), Some(expected));
            // Bytes after the chunk are left for the caller, as bincode leaves them.
            let mut longer = bytes.clone();
            longer.extend([7, 7, 7]);
            assert_eq!(fast_decode(&longer).unwrap().1, bytes.len());
        }
        assert!(!sample_events().is_empty());
    }

    #[test]
    fn damaged_chunks_decode_as_bincode_decodes_them_or_go_to_bincode() {
        // Every truncation and many single-byte changes: what the fast decoder returns, bincode
        // returns too. It may give up where bincode decodes (the caller then uses bincode's
        // answer); it must never answer differently.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut agreed, mut gave_up) = (0, 0);
        for bytes in encodings() {
            let mut cases: Vec<Vec<u8>> = (0..bytes.len()).map(|n| bytes[..n].to_vec()).collect();
            for _ in 0..4000 {
                let mut damaged = bytes.clone();
                if damaged.is_empty() {
                    break;
                }
                let at = next() as usize % damaged.len();
                damaged[at] = match next() % 4 {
                    0 => 251 + (next() % 5) as u8, // a varint's width byte, or a reserved one
                    1 => damaged[at].wrapping_add(1),
                    _ => next() as u8,
                };
                cases.push(damaged);
            }
            for case in &cases {
                match fast_decode(case) {
                    Some(fast) => {
                        assert_eq!(bincode_decode(case), Some(fast), "{case:?}");
                        agreed += 1;
                    }
                    None => gave_up += 1,
                }
            }
        }
        // Both outcomes occur, so the comparison above is exercised.
        assert!(agreed > 1000 && gave_up > 1000, "{agreed} decoded, {gave_up} left to bincode");
    }

    #[test]
    fn hostile_lengths_reserve_nothing_and_go_to_bincode() {
        // A length beyond what the bytes left can hold is refused before anything is reserved.
        let mut bytes = vec![U64_BYTE];
        bytes.extend(u64::MAX.to_le_bytes());
        assert_eq!(fast_decode(&bytes), None);
        assert!(bincode_decode(&bytes).is_none());
        // A chunk long enough to reach bincode's claim limit is left to bincode.
        let bytes = encodings().remove(0);
        assert_eq!(decode(&bytes, 8 * (bytes.len() - 1)), None);
        assert!(decode(&bytes, 8 * bytes.len()).is_some());
    }
}
