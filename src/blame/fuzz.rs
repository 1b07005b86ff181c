//! The bodies of the `blame` and `diff` fuzz targets in `fuzz/`, kept in the library so that a
//! finding becomes a regression test calling the same function (`tests/hostile.rs`). Each
//! panics only on a real defect: a breakdown or a diff whose sums do not hold as
//! `blame`/`diff --format json` promise, or a note on unlike sites given wrongly. Errors are
//! expected outcomes.

use crate::policy::PolicySpec;
use crate::replay::ReplayInput;
use crate::trace::{read_bytes, ReadOptions, Trace, FORMATS};

/// The options the fuzz targets read with: frames kept, no progress bar, a 64 MiB cap.
fn options() -> ReadOptions {
    ReadOptions { keep_frames: true, max_input_bytes: Some(64 << 20), ..ReadOptions::default() }
}

/// The trace `data[1..]` holds in the format `data[0]` picks (low bits), as the fuzz targets of
/// the commands that read one trace read it.
fn picked_trace(data: &[u8]) -> Option<(u8, Trace)> {
    let (&pick, rest) = data.split_first()?;
    let format = FORMATS[pick as usize % FORMATS.len()].format;
    read_bytes(rest, format, &options()).ok().map(|t| (pick, t))
}

/// Reads `data[1..]` in the format `data[0]` picks and breaks its replays down as `blame` does
/// (the recorded run, `pytorch` and `bfc`) at a moment and by a grouping `data[0]` picks: an
/// error, or a breakdown whose sums hold as `blame --format json` promises (live, rounding and
/// cached free bytes add up to reserved; the sites' and the holes' bytes add up to them).
/// True when a breakdown was made and checked.
pub fn blame(data: &[u8]) -> bool {
    let Some((pick, trace)) = picked_trace(data) else { return false };
    blame_trace(&trace, pick)
}

/// The groupings `blame --by` and `diff --by` offer.
const GROUPINGS: [super::GroupBy; 5] = {
    use super::GroupBy::*;
    [Site, Function, File, Stream, Size]
};

/// [`blame`] on a trace already read; `pick` chooses the moment and the grouping.
pub(crate) fn blame_trace(trace: &Trace, pick: u8) -> bool {
    use super::{BlameOptions, Moment};
    let Ok(input) = ReplayInput::new(trace, None) else { return false };
    // Every moment but `oom`, which a replay without a capacity never reaches.
    let events = super::events(&input).len().max(1) as u64;
    let at = match (pick >> 4) % 3 {
        0 => Moment::Peak,
        1 => Moment::PeakLive,
        _ => Moment::Event(u64::from(pick) % events),
    };
    let by = GROUPINGS[(pick >> 2) as usize % GROUPINGS.len()];
    let options = BlameOptions {
        at,
        by,
        top: (pick % 3) as usize,
        depth: 1 + (pick % 2) as usize,
        ..BlameOptions::default()
    };
    let specs: Vec<PolicySpec> = ["pytorch", "bfc"]
        .iter()
        .map(|n| PolicySpec { name: n.to_string(), options: String::new() })
        .collect();
    let Ok(results) = super::blame(&input, &specs, &options) else { return false };
    for r in &results {
        let what = format!("{} at {:?} by {}", r.policy, options.at, by.name());
        assert_eq!(
            r.live_bytes + r.rounding_bytes + r.cached_free_bytes,
            r.reserved_bytes,
            "{what}: live + rounding + cached free"
        );
        assert_eq!(
            r.sites.iter().map(|s| s.live_bytes).sum::<u64>(),
            r.live_bytes,
            "{what}: sites"
        );
        assert_eq!(
            r.sites.iter().map(|s| s.rounding_bytes).sum::<u64>(),
            r.rounding_bytes,
            "{what}: sites' rounding"
        );
        for holes in [&r.holes_by_segment_site, &r.holes_by_last_free_site] {
            let free: u64 = holes.iter().map(|h| h.cached_free_bytes).sum();
            assert_eq!(free, r.cached_free_bytes, "{what}: holes");
        }
    }
    true
}

/// Reads two traces from `data` as `diff A B` does — `data[0]` picks A's format (low bits) and
/// B's (high bits), `data[1]` the grouping and B's policy, `data[2..6]` (little-endian) how many
/// of the bytes after them are A's — and compares their replays: an error, or a diff whose sites'
/// deltas add up to the live delta, with a note exactly when the traces name sites differently
/// and the grouping needs frames. True when a diff was made and checked.
pub fn diff(data: &[u8]) -> bool {
    let [formats, pick, l0, l1, l2, l3, rest @ ..] = data else { return false };
    let len_a = (u32::from_le_bytes([*l0, *l1, *l2, *l3]) as usize).min(rest.len());
    let (a, b) = rest.split_at(len_a);
    let format = |p: u8| FORMATS[p as usize % FORMATS.len()].format;
    let Ok(ta) = read_bytes(a, format(formats & 0x0f), &options()) else { return false };
    let Ok(tb) = read_bytes(b, format(formats >> 4), &options()) else { return false };
    diff_traces(&ta, &tb, *pick)
}

/// `diff`'s fuzz input for traces `a` (in `FORMATS[format_a]`) and `b`: the inverse of
/// [`diff`]'s layout, for seeding a corpus and for tests.
pub fn diff_input(format_a: u8, a: &[u8], format_b: u8, b: &[u8], pick: u8) -> Vec<u8> {
    let mut out = vec![(format_a & 0x0f) | (format_b << 4), pick];
    out.extend_from_slice(&(a.len() as u32).to_le_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// [`diff`] on two traces already read; `pick` chooses the grouping and the policies.
pub(crate) fn diff_traces(a: &Trace, b: &Trace, pick: u8) -> bool {
    use super::diff::{diff, Side};
    use super::{BlameOptions, Moment};
    let (Ok(input_a), Ok(input_b)) = (ReplayInput::new(a, None), ReplayInput::new(b, None)) else {
        return false;
    };
    let by = GROUPINGS[pick as usize % GROUPINGS.len()];
    let spec = |n: &str| PolicySpec { name: n.to_string(), options: String::new() };
    let spec_b = if pick & 0x80 == 0 { spec("pytorch") } else { spec("bfc") };
    let side_a = Side { trace: "a".into(), input: &input_a, spec: spec("pytorch") };
    let side_b = Side { trace: "b".into(), input: &input_b, spec: spec_b };
    let options = BlameOptions {
        at: Moment::PeakLive,
        by,
        top: (pick >> 5) as usize % 3,
        ..BlameOptions::default()
    };
    let Ok(r) = diff(&side_a, &side_b, &options) else { return false };
    let delta: i64 = r.sites.iter().map(|s| s.delta_bytes).sum();
    assert_eq!(
        delta,
        r.delta.peak_live_bytes,
        "sites' deltas against the live delta by {}",
        by.name()
    );
    assert!(r.matched.len() as u64 <= r.matched_count, "matched pairs listed beyond those counted");
    let rule = |t: &Trace| t.frames.is_empty();
    let unlike = rule(a) != rule(b)
        && matches!(by, super::GroupBy::Site | super::GroupBy::Function | super::GroupBy::File);
    assert_eq!(r.note.is_some(), unlike, "a note exactly on unlike sites: {:?}", r.note);
    true
}
