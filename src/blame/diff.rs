//! Two runs side by side (`fragsim diff`): two traces, or one trace under two policies.
//!
//! Sites are named by the last two components of their file's path
//! (`crate::trace::sites::short_site`), so runs recorded in different checkouts or on
//! different machines (`C:\...\pkg\model.py`, `/home/.../pkg/model.py`) compare site by site.
//!
//! Each run is replayed once plainly (its peaks) and once watched up to its peak-live moment,
//! where its live bytes are broken down by site (`super::blame`); the site deltas are the
//! differences of those breakdowns, so they add up to the difference of the live bytes exactly.
//!
//! To put two traces on one axis, their allocation sequences are aligned by site (`align`): a
//! shortest edit script (Myers' greedy algorithm) over the sequence of sites, so that an
//! allocation of the same site that grew from 8 to 16 MiB is one matched pair, not a removal and
//! an addition. The matched pairs whose sizes differ most are reported. Where the two sequences
//! differ in more than [`MAX_EDITS`] places, Myers' search would cost too much; the alignment
//! then pairs the k-th allocation of each site in one run with the k-th of the same site in the
//! other, and says so.

use super::{events, BlameOptions, GroupBy, Keys, SiteRule, OTHER};
use crate::error::Result;
use crate::policy::PolicySpec;
use crate::replay::{run_spec, ReplayInput, ReplayOptions};
use crate::trace::Action;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The most differences `align` searches with Myers' algorithm before pairing by rank.
pub const MAX_EDITS: usize = 2_000;

/// One run of a diff.
pub struct Side<'r, 'i> {
    /// The trace's name (as given on the command line).
    pub trace: String,
    /// Its replay input.
    pub input: &'r ReplayInput<'i>,
    /// The policy it runs under.
    pub spec: PolicySpec,
}

/// One run's peaks: `a` and `b` of `diff --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunPeaks {
    /// The trace.
    pub trace: String,
    /// The policy.
    pub policy: String,
    /// Its configuration.
    pub config: String,
    /// See `replay --json`.
    pub peak_reserved_bytes: u64,
    /// See `replay --json`.
    pub peak_allocated_bytes: u64,
    /// Live requested bytes at the peak-live moment (`peak_requested_bytes` when every request
    /// is served).
    pub peak_live_bytes: u64,
    /// Reserved memory before the first event: the cache the run started with (a snapshot
    /// recorded mid-run starts with what the program had reserved by then).
    #[serde(default)]
    pub start_reserved_bytes: u64,
    /// The event at which reserved memory first peaks.
    pub peak_event: u64,
    /// The peak-live moment, at which `sites` are read.
    pub peak_live_event: u64,
}

/// B − A.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// Of `peak_reserved_bytes`.
    pub peak_reserved_bytes: i64,
    /// Of `peak_allocated_bytes`.
    pub peak_allocated_bytes: i64,
    /// Of `peak_live_bytes`; the sites' `delta_bytes` add up to it.
    pub peak_live_bytes: i64,
    /// Of `start_reserved_bytes`: the part of the reserved delta that is the cache each run
    /// started with.
    #[serde(default)]
    pub start_reserved_bytes: i64,
    /// Of the reserved memory each run grew by during its trace (`peak_reserved_bytes -
    /// start_reserved_bytes`, 0 where the peak is the start): `peak_reserved_bytes` is this plus
    /// `start_reserved_bytes`.
    #[serde(default)]
    pub grown_reserved_bytes: i64,
}

/// Blocks of the same size live in both runs at their peak-live moments under different sites:
/// the same tensors allocated by another op (under autocast, another kernel, another code path).
/// Left out of [`DiffReport::sites`], which then shows what changed in amount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    /// The site in A.
    pub from_site: String,
    /// The site in B.
    pub to_site: String,
    /// Their bytes (requested), the same in both runs.
    pub bytes: u64,
    /// How many blocks.
    pub blocks: u64,
}

/// One site's live bytes in both runs at their peak-live moments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteDelta {
    /// The site (or the `--by` group).
    pub site: String,
    /// Live bytes in A.
    pub a_bytes: u64,
    /// Live bytes in B.
    pub b_bytes: u64,
    /// `b_bytes - a_bytes`.
    pub delta_bytes: i64,
    /// `"a"` or `"b"` for a site found in one run only; `null` otherwise.
    pub only_in: Option<String>,
}

/// Two allocations the alignment matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matched {
    /// Their site.
    pub site: String,
    /// The request size in A.
    pub a_size: u64,
    /// The request size in B.
    pub b_size: u64,
    /// The alloc's event index in A.
    pub a_event: u64,
    /// The alloc's event index in B.
    pub b_event: u64,
}

/// `diff --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffReport {
    /// Run A.
    pub a: RunPeaks,
    /// Run B.
    pub b: RunPeaks,
    /// B − A.
    pub delta: Delta,
    /// The grouping of `sites` and of the alignment.
    pub by: GroupBy,
    /// Live bytes by site, largest |delta| first, the moved blocks left out.
    pub sites: Vec<SiteDelta>,
    /// Blocks that moved from one site to another, most bytes first (beyond `--top`, folded
    /// into one `(other)` → `(other)` entry).
    #[serde(default)]
    pub moved: Vec<Moved>,
    /// How the allocation sequences were aligned: `myers` or `site-rank`.
    pub alignment: String,
    /// Allocations aligned in both runs.
    pub matched_count: u64,
    /// Matched pairs whose sizes differ, largest difference first.
    pub matched: Vec<Matched>,
    /// Set when the two traces name sites differently (one records stack frames, the other
    /// none, so its sites are size classes and streams) and `by` groups by site, function or
    /// file: no site of one run can be a site of the other, so every site is in one run only and
    /// nothing is matched. Says so and which grouping compares them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The note of [`DiffReport::note`] for sides whose traces follow `rule_a` and `rule_b`, grouped
/// `by`; `None` where their sites can match.
pub(crate) fn unlike_sites_note(rule_a: SiteRule, rule_b: SiteRule, by: GroupBy) -> Option<String> {
    if rule_a == rule_b || !matches!(by, GroupBy::Site | GroupBy::Function | GroupBy::File) {
        return None;
    }
    let kind = |r: SiteRule| match r {
        SiteRule::Frames => "stack frames",
        SiteRule::SizeAndStream => "size classes and streams (it records no frames)",
    };
    Some(format!(
        "A's sites are {} and B's are {}: no {} can be in both runs, so none is matched; compare them with --by size or --by stream",
        kind(rule_a),
        kind(rule_b),
        by.name()
    ))
}

/// Compares `a` and `b`; `options.at` is ignored (sites are read at each run's peak-live
/// moment), `options.top` bounds both lists.
pub fn diff(a: &Side, b: &Side, options: &BlameOptions) -> Result<DiffReport> {
    Ok(compare(&summarize(a, options)?, &summarize(b, options)?, options).0)
}

/// One run of a diff, summarised: all `compare` needs of it, so that a trace can be dropped
/// before the other run's trace is read (two large traces are never held at once).
pub struct SideSummary {
    /// Its peaks.
    pub(crate) peaks: RunPeaks,
    /// Live bytes by site at its peak-live moment.
    sites: HashMap<String, u64>,
    /// How its sites are named.
    rule: SiteRule,
    /// Its site names, by the numbers in `allocs` (numbered in order of first allocation).
    names: Vec<String>,
    /// Its allocations as (site number, size, event).
    allocs: Vec<(u32, u64, u64)>,
    /// Its live blocks at the peak-live moment as (site, size) → count.
    blocks: BTreeMap<(String, u64), u64>,
}

/// Replays `side` and keeps what [`compare`] needs of it; an input problem names its trace.
pub(crate) fn summarize(side: &Side, options: &BlameOptions) -> Result<SideSummary> {
    let keys = Keys::new(side.input, options.by, options.depth).short();
    let path = std::path::PathBuf::from(&side.trace);
    let named = move |e: crate::error::Error| match e.kind() {
        crate::error::ErrorKind::Input | crate::error::ErrorKind::Usage => e.in_file(&path),
        _ => e,
    };
    let (peaks, sites, blocks) = run(side, &keys, &options.replay).map_err(named)?;
    let mut numbers: HashMap<String, u32> = HashMap::new();
    let allocs = allocations(side, &keys, &mut numbers);
    let mut names = vec![String::new(); numbers.len()];
    for (n, i) in numbers {
        names[i as usize] = n;
    }
    Ok(SideSummary { peaks, sites, rule: super::site_rule(side.input), names, allocs, blocks })
}

/// The two runs' policies, of the specs given: with two traces, one for both (default `pytorch`)
/// or two (A's, then B's); with one trace, exactly two.
pub fn pair_specs(policies: &[String], two_traces: bool) -> Result<(PolicySpec, PolicySpec)> {
    let mut specs = Vec::new();
    for p in policies {
        specs.extend(PolicySpec::parse_list(p)?);
    }
    match (specs.len(), two_traces) {
        (0, true) => {
            let p = PolicySpec::parse_list("pytorch")?.remove(0);
            Ok((p.clone(), p))
        }
        (1, true) => Ok((specs[0].clone(), specs[0].clone())),
        (2, _) => Ok((specs[0].clone(), specs[1].clone())),
        (n, true) => Err(crate::Error::usage(format!(
            "diff A B takes one policy for both runs or two (A's, then B's), not {n}"
        ))),
        (n, false) => Err(crate::Error::usage(format!(
            "diff TRACE compares two policies: give exactly two (-p X -p Y), not {n}"
        ))),
    }
}

/// The diff of two summarised runs, and the aligned allocation pairs as ordinals (`(i, j)`
/// matches A's i-th allocation with B's j-th, in A's order).
pub fn compare(
    a: &SideSummary,
    b: &SideSummary,
    options: &BlameOptions,
) -> (DiffReport, Vec<(usize, usize)>) {
    let (peaks_a, peaks_b) = (a.peaks.clone(), b.peaks.clone());
    let grown = |p: &RunPeaks| p.peak_reserved_bytes.saturating_sub(p.start_reserved_bytes);
    let delta = Delta {
        peak_reserved_bytes: signed(peaks_b.peak_reserved_bytes, peaks_a.peak_reserved_bytes),
        peak_allocated_bytes: signed(peaks_b.peak_allocated_bytes, peaks_a.peak_allocated_bytes),
        peak_live_bytes: signed(peaks_b.peak_live_bytes, peaks_a.peak_live_bytes),
        start_reserved_bytes: signed(
            peaks_b.start_reserved_bytes.min(peaks_b.peak_reserved_bytes),
            peaks_a.start_reserved_bytes.min(peaks_a.peak_reserved_bytes),
        ),
        grown_reserved_bytes: signed(grown(&peaks_b), grown(&peaks_a)),
    };
    let (moved, sites_a, sites_b) = moves(a, b);
    let sites = site_deltas(&sites_a, &sites_b, options.top);
    let moved = fold_moves(moved, options.top);
    let (alignment, pairs, matched) = align_runs(a, b);
    let matched_count = matched.len() as u64;
    let mut matched: Vec<Matched> = matched.into_iter().filter(|m| m.a_size != m.b_size).collect();
    matched.sort_by(|x, y| {
        let d = |m: &Matched| m.a_size.abs_diff(m.b_size);
        d(y).cmp(&d(x)).then(x.a_event.cmp(&y.a_event))
    });
    if options.top > 0 {
        matched.truncate(options.top);
    }
    let report = DiffReport {
        a: peaks_a,
        b: peaks_b,
        delta,
        by: options.by,
        sites,
        moved,
        alignment: alignment.to_string(),
        matched_count,
        matched,
        note: unlike_sites_note(a.rule, b.rule, options.by),
    };
    (report, pairs)
}

/// `x - y` as a signed number.
fn signed(x: u64, y: u64) -> i64 {
    (x as i128 - y as i128) as i64
}

/// One side's peaks and its live bytes by site at its peak-live moment.
type SiteBlocks = BTreeMap<(String, u64), u64>;

fn run(
    side: &Side,
    keys: &Keys,
    replay: &ReplayOptions,
) -> Result<(RunPeaks, HashMap<String, u64>, SiteBlocks)> {
    let out = run_spec(&side.spec, side.input, replay)?;
    let stop = super::peak_live_event(side.input);
    let (_, layout) = super::watch(side.input, &side.spec, replay, stop)?;
    let at = super::breakdown(&layout, keys, 0)?;
    let sites = at.sites.iter().map(|s| (s.site.clone(), s.live_bytes)).collect();
    let mut names: HashMap<super::Key, String> = HashMap::new();
    let mut blocks = SiteBlocks::new();
    for b in layout.live.values().filter(|b| b.request > 0) {
        let key = keys.key(b.origin);
        let site = names.entry(key).or_insert_with(|| keys.name(key)).clone();
        *blocks.entry((site, b.request)).or_default() += 1;
    }
    let peaks = RunPeaks {
        trace: side.trace.clone(),
        policy: out.result.policy.clone(),
        config: out.result.config.clone(),
        peak_reserved_bytes: out.result.peak_reserved_bytes,
        peak_allocated_bytes: out.result.peak_allocated_bytes,
        peak_live_bytes: at.live_bytes,
        start_reserved_bytes: out.detail.reserved_at_start_bytes,
        peak_event: out.result.peak_event,
        peak_live_event: stop,
    };
    Ok((peaks, sites, blocks))
}

/// The blocks that moved between sites (see [`Moved`]), and each run's live bytes by site
/// without them. Per size, the blocks a site holds in both runs stay; what one run holds more
/// of at one site and the other more of at another is paired, sites in name order, as moves.
fn moves(
    a: &SideSummary,
    b: &SideSummary,
) -> (Vec<Moved>, HashMap<String, u64>, HashMap<String, u64>) {
    let (mut sites_a, mut sites_b) = (a.sites.clone(), b.sites.clone());
    let mut by_pair: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    // Each run's blocks by size, then site (in name order).
    fn by_size(m: &SiteBlocks) -> BTreeMap<u64, BTreeMap<&str, u64>> {
        let mut out: BTreeMap<u64, BTreeMap<&str, u64>> = BTreeMap::new();
        for ((site, size), &n) in m {
            out.entry(*size).or_default().insert(site.as_str(), n);
        }
        out
    }
    // What `this` run holds more of at a site than `other`: the candidates to pair.
    fn more<'m>(this: &BTreeMap<&'m str, u64>, other: &BTreeMap<&str, u64>) -> Vec<(&'m str, u64)> {
        let count = |site: &str| other.get(site).copied().unwrap_or(0);
        this.iter().map(|(&s, &n)| (s, n.saturating_sub(count(s)))).filter(|x| x.1 > 0).collect()
    }
    let (sizes_a, sizes_b) = (by_size(&a.blocks), by_size(&b.blocks));
    for (&size, in_a) in &sizes_a {
        let Some(in_b) = sizes_b.get(&size) else { continue };
        let (more_a, more_b) = (more(in_a, in_b), more(in_b, in_a));
        let (mut i, mut j) = (0, 0);
        let (mut left_a, mut left_b) =
            (more_a.first().map_or(0, |x| x.1), more_b.first().map_or(0, |x| x.1));
        while i < more_a.len() && j < more_b.len() {
            let k = left_a.min(left_b);
            let (from, to) = (more_a[i].0, more_b[j].0);
            let entry = by_pair.entry((from, to)).or_default();
            entry.0 += k * size;
            entry.1 += k;
            left_a -= k;
            left_b -= k;
            if left_a == 0 {
                i += 1;
                left_a = more_a.get(i).map_or(0, |x| x.1);
            }
            if left_b == 0 {
                j += 1;
                left_b = more_b.get(j).map_or(0, |x| x.1);
            }
        }
    }
    let mut moved = Vec::with_capacity(by_pair.len());
    for ((from, to), (bytes, blocks)) in by_pair {
        for (sites, site) in [(&mut sites_a, from), (&mut sites_b, to)] {
            if let Some(v) = sites.get_mut(site) {
                *v -= bytes.min(*v);
                if *v == 0 {
                    sites.remove(site);
                }
            }
        }
        moved.push(Moved { from_site: from.to_string(), to_site: to.to_string(), bytes, blocks });
    }
    (moved, sites_a, sites_b)
}

/// Moves sorted by bytes, beyond `top` (0: all) folded into one `(other)` entry.
fn fold_moves(mut moved: Vec<Moved>, top: usize) -> Vec<Moved> {
    moved.sort_by(|x, y| {
        y.bytes
            .cmp(&x.bytes)
            .then_with(|| (&x.from_site, &x.to_site).cmp(&(&y.from_site, &y.to_site)))
    });
    if top > 0 && moved.len() > top {
        let rest = moved.split_off(top);
        moved.push(Moved {
            from_site: OTHER.to_string(),
            to_site: OTHER.to_string(),
            bytes: rest.iter().map(|m| m.bytes).sum(),
            blocks: rest.iter().map(|m| m.blocks).sum(),
        });
    }
    moved
}

/// Every site of either run with its bytes in both, largest |delta| first, beyond `top` folded
/// into `(other)` (which keeps the sums exact).
pub(crate) fn site_deltas(
    a: &HashMap<String, u64>,
    b: &HashMap<String, u64>,
    top: usize,
) -> Vec<SiteDelta> {
    let mut names: Vec<&String> =
        a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))).collect();
    names.sort();
    let mut rows: Vec<SiteDelta> = names
        .into_iter()
        .map(|site| {
            let (x, y) = (a.get(site), b.get(site));
            let (ab, bb) = (x.copied().unwrap_or(0), y.copied().unwrap_or(0));
            SiteDelta {
                site: site.clone(),
                a_bytes: ab,
                b_bytes: bb,
                delta_bytes: signed(bb, ab),
                only_in: match (x, y) {
                    (Some(_), None) => Some("a".into()),
                    (None, Some(_)) => Some("b".into()),
                    _ => None,
                },
            }
        })
        .collect();
    rows.sort_by(|x, y| {
        y.delta_bytes
            .unsigned_abs()
            .cmp(&x.delta_bytes.unsigned_abs())
            .then((y.a_bytes + y.b_bytes).cmp(&(x.a_bytes + x.b_bytes)))
            .then(x.site.cmp(&y.site))
    });
    if top > 0 && rows.len() > top {
        let rest = rows.split_off(top);
        let (ab, bb) = rest.iter().fold((0, 0), |(p, q), r| (p + r.a_bytes, q + r.b_bytes));
        rows.push(SiteDelta {
            site: OTHER.to_string(),
            a_bytes: ab,
            b_bytes: bb,
            delta_bytes: rest.iter().map(|r| r.delta_bytes).sum(),
            only_in: None,
        });
    }
    rows
}

/// One run's allocations as (site number, size, event), site numbers shared through `names`.
fn allocations(side: &Side, keys: &Keys, names: &mut HashMap<String, u32>) -> Vec<(u32, u64, u64)> {
    let mut cache: HashMap<super::Key, u32> = HashMap::new();
    let mut out = Vec::new();
    for (i, e) in events(side.input).iter().enumerate() {
        if e.action != Action::Alloc || e.size == 0 {
            continue;
        }
        let key = keys.key(super::observe::Origin::Event(i as u32));
        let id = *cache.entry(key).or_insert_with(|| {
            let next = names.len() as u32;
            *names.entry(keys.name(key)).or_insert(next)
        });
        out.push((id, e.size, i as u64));
    }
    out
}

/// Aligns the two runs' allocation sequences (see the module docs): the method, the ordinal
/// pairs and the matched allocations. B's site numbers are renumbered into A's, a site new in B
/// numbered after A's in order of its first allocation.
fn align_runs(
    a: &SideSummary,
    b: &SideSummary,
) -> (&'static str, Vec<(usize, usize)>, Vec<Matched>) {
    let mut numbers: HashMap<&str, u32> =
        a.names.iter().enumerate().map(|(i, n)| (n.as_str(), i as u32)).collect();
    let mut by_id: Vec<&str> = a.names.iter().map(String::as_str).collect();
    let b_to_global: Vec<u32> = b
        .names
        .iter()
        .map(|n| {
            *numbers.entry(n.as_str()).or_insert_with(|| {
                by_id.push(n);
                (by_id.len() - 1) as u32
            })
        })
        .collect();
    let sa: Vec<u32> = a.allocs.iter().map(|x| x.0).collect();
    let sb: Vec<u32> = b.allocs.iter().map(|y| b_to_global[y.0 as usize]).collect();
    let (how, pairs) = match align(&sa, &sb, MAX_EDITS) {
        Some(p) => ("myers", p),
        None => ("site-rank", align_by_rank(&sa, &sb)),
    };
    let matched = pairs
        .iter()
        .map(|&(i, j)| Matched {
            site: by_id[sa[i] as usize].to_string(),
            a_size: a.allocs[i].1,
            b_size: b.allocs[j].1,
            a_event: a.allocs[i].2,
            b_event: b.allocs[j].2,
        })
        .collect();
    (how, pairs, matched)
}

/// The matched index pairs of a shortest edit script between `a` and `b` (Myers' greedy
/// algorithm, after the common prefix and suffix); `None` when it needs more than `max_edits`
/// insertions and deletions.
pub(crate) fn align<T: PartialEq>(
    a: &[T],
    b: &[T],
    max_edits: usize,
) -> Option<Vec<(usize, usize)>> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (ra, rb) = (&a[prefix..], &b[prefix..]);
    let suffix = ra.iter().rev().zip(rb.iter().rev()).take_while(|(x, y)| x == y).count();
    let (ma, mb) = (&ra[..ra.len() - suffix], &rb[..rb.len() - suffix]);
    let middle = myers(ma, mb, max_edits)?;
    let mut out: Vec<(usize, usize)> = (0..prefix).map(|i| (i, i)).collect();
    out.extend(middle.into_iter().map(|(i, j)| (i + prefix, j + prefix)));
    let (ea, eb) = (prefix + ma.len(), prefix + mb.len());
    out.extend((0..suffix).map(|k| (ea + k, eb + k)));
    Some(out)
}

/// Myers' O((N+M)D) greedy search, each step's frontier kept for the walk back.
fn myers<T: PartialEq>(a: &[T], b: &[T], max_edits: usize) -> Option<Vec<(usize, usize)>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let limit = ((n + m) as usize).min(max_edits) as isize;
    let offset = limit + 1;
    // v[k + offset]: the furthest x on diagonal k (x - y = k).
    let mut v = vec![0isize; 2 * limit as usize + 3];
    // frontiers[d]: v on diagonals -d..=d before step d.
    let mut frontiers: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'search: for d in 0..=limit {
        frontiers.push(v[(offset - d) as usize..=(offset + d) as usize].to_vec());
        for k in (-d..=d).step_by(2) {
            let i = (k + offset) as usize;
            let mut x =
                if k == -d || (k != d && v[i - 1] < v[i + 1]) { v[i + 1] } else { v[i - 1] + 1 };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[i] = x;
            if x >= n && y >= m {
                found = Some(d);
                break 'search;
            }
        }
    }
    let d_end = found?;
    let mut pairs = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (1..=d_end).rev() {
        let f = &frontiers[d as usize];
        let at = |k: isize| f[(k + d) as usize];
        let k = x - y;
        let down = k == -d || (k != d && at(k - 1) < at(k + 1));
        let prev_k = if down { k + 1 } else { k - 1 };
        let (px, py) = (at(prev_k), at(prev_k) - prev_k);
        // After the edit, the path is at (mx, mx - k); then it follows the snake to (x, y).
        let mx = if down { px } else { px + 1 };
        while x > mx && y > mx - k {
            x -= 1;
            y -= 1;
            pairs.push((x as usize, y as usize));
        }
        (x, y) = (px, py);
    }
    while x > 0 && y > 0 {
        x -= 1;
        y -= 1;
        pairs.push((x as usize, y as usize));
    }
    pairs.reverse();
    Some(pairs)
}

/// Pairs the k-th occurrence of each value in `a` with the k-th in `b`, in `a`'s order.
pub(crate) fn align_by_rank<T: Eq + std::hash::Hash + Copy>(
    a: &[T],
    b: &[T],
) -> Vec<(usize, usize)> {
    let mut positions: HashMap<T, std::collections::VecDeque<usize>> = HashMap::new();
    for (j, y) in b.iter().enumerate() {
        positions.entry(*y).or_default().push_back(j);
    }
    let mut out = Vec::new();
    for (i, x) in a.iter().enumerate() {
        if let Some(j) = positions.get_mut(x).and_then(|q| q.pop_front()) {
            out.push((i, j));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The length of a longest common subsequence, by dynamic programming.
    fn lcs(a: &[u8], b: &[u8]) -> usize {
        let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 0..a.len() {
            for j in 0..b.len() {
                t[i + 1][j + 1] =
                    if a[i] == b[j] { t[i][j] + 1 } else { t[i][j + 1].max(t[i + 1][j]) };
            }
        }
        t[a.len()][b.len()]
    }

    #[test]
    fn myers_finds_a_longest_common_subsequence() {
        let cases: [(&[u8], &[u8]); 7] = [
            (b"ABCABBA", b"CBABAC"),
            (b"", b"abc"),
            (b"abc", b""),
            (b"abcdef", b"abcdef"),
            (b"xaybzc", b"abc"),
            (b"kitten", b"sitting"),
            (b"aaaabbbb", b"bbbbaaaa"),
        ];
        for (a, b) in cases {
            let pairs = align(a, b, 100).unwrap();
            assert_eq!(pairs.len(), lcs(a, b), "{a:?} {b:?}");
            for w in pairs.windows(2) {
                assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1, "increasing");
            }
            for &(i, j) in &pairs {
                assert_eq!(a[i], b[j]);
            }
        }
        // Pseudo-random sequences over a small alphabet.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 60) as u8 % 4
        };
        for _ in 0..50 {
            let a: Vec<u8> = (0..40).map(|_| next()).collect();
            let b: Vec<u8> = (0..33).map(|_| next()).collect();
            assert_eq!(align(&a, &b, 1000).unwrap().len(), lcs(&a, &b));
        }
        assert_eq!(align(b"abcd", b"wxyz", 3), None, "8 edits are more than 3");
    }

    #[test]
    fn rank_alignment_pairs_occurrences_in_order() {
        assert_eq!(align_by_rank(&[1, 2, 1, 3], &[2, 1, 1]), [(0, 1), (1, 0), (2, 2)]);
    }

    #[test]
    fn site_deltas_add_up_and_mark_one_sided_sites() {
        let a: HashMap<String, u64> = [("x".into(), 10), ("y".into(), 5), ("z".into(), 1)].into();
        let b: HashMap<String, u64> = [("x".into(), 4), ("w".into(), 9), ("z".into(), 1)].into();
        let rows = site_deltas(&a, &b, 0);
        assert_eq!(rows.iter().map(|r| r.delta_bytes).sum::<i64>(), 14 - 16);
        assert_eq!(rows[0].site, "w");
        assert_eq!(rows[0].only_in.as_deref(), Some("b"));
        let y = rows.iter().find(|r| r.site == "y").unwrap();
        assert_eq!(y.only_in.as_deref(), Some("a"));
        let folded = site_deltas(&a, &b, 2);
        assert_eq!(folded.len(), 3);
        assert_eq!(folded[2].site, OTHER);
        assert_eq!(folded.iter().map(|r| r.delta_bytes).sum::<i64>(), -2);
    }

    /// A side whose live blocks are `blocks` as (site, size, count), sites summed from them.
    fn summary(blocks: &[(&str, u64, u64)], start: u64, peak: u64) -> SideSummary {
        let mut sites: HashMap<String, u64> = HashMap::new();
        for &(site, size, n) in blocks {
            *sites.entry(site.to_string()).or_default() += size * n;
        }
        let live = sites.values().sum();
        SideSummary {
            peaks: RunPeaks {
                trace: "t".into(),
                policy: "pytorch".into(),
                config: String::new(),
                peak_reserved_bytes: peak,
                peak_allocated_bytes: live,
                peak_live_bytes: live,
                start_reserved_bytes: start,
                peak_event: 0,
                peak_live_event: 0,
            },
            sites,
            rule: SiteRule::Frames,
            names: Vec::new(),
            allocs: Vec::new(),
            blocks: blocks.iter().map(|&(s, size, n)| ((s.to_string(), size), n)).collect(),
        }
    }

    #[test]
    fn blocks_of_one_size_under_another_site_are_a_move_and_the_rows_still_add_up() {
        // The same three 100-byte gradients, allocated by Bmm in A and by ToCopy in B; one
        // more 50-byte block at Z in B; a 100-byte block at Z in both stays.
        let a = summary(&[("bmm", 100, 3), ("z", 100, 1), ("z", 50, 1)], 1000, 1500);
        let b = summary(&[("tocopy", 100, 3), ("z", 100, 1), ("z", 50, 2)], 400, 1200);
        let (r, _) = compare(&a, &b, &BlameOptions::default());
        assert_eq!(
            r.moved,
            vec![Moved {
                from_site: "bmm".into(),
                to_site: "tocopy".into(),
                bytes: 300,
                blocks: 3
            }]
        );
        let names: Vec<&str> = r.sites.iter().map(|s| s.site.as_str()).collect();
        assert_eq!(names, ["z"], "moved blocks are left out of the site rows");
        assert_eq!((r.sites[0].a_bytes, r.sites[0].b_bytes), (150, 200));
        let sum: i64 = r.sites.iter().map(|s| s.delta_bytes).sum();
        assert_eq!(sum, r.delta.peak_live_bytes);
        // The headline: reserved -300 of which the start cache -600 and growth +300.
        assert_eq!(r.delta.peak_reserved_bytes, -300);
        assert_eq!(r.delta.start_reserved_bytes, -600);
        assert_eq!(r.delta.grown_reserved_bytes, 300);
        assert_eq!(
            r.delta.start_reserved_bytes + r.delta.grown_reserved_bytes,
            r.delta.peak_reserved_bytes
        );
    }

    #[test]
    fn a_surplus_at_one_site_is_no_move_without_a_shortfall_of_the_same_size_elsewhere() {
        let a = summary(&[("x", 64, 2), ("y", 128, 1)], 0, 0);
        let b = summary(&[("x", 64, 5), ("w", 256, 1)], 0, 0);
        let (r, _) = compare(&a, &b, &BlameOptions::default());
        assert!(r.moved.is_empty(), "{:?}", r.moved);
        let sum: i64 = r.sites.iter().map(|s| s.delta_bytes).sum();
        assert_eq!(sum, r.delta.peak_live_bytes);
    }

    #[test]
    fn moves_beyond_top_fold_into_other() {
        let a = summary(&[("a1", 10, 1), ("a2", 20, 1), ("a3", 30, 1)], 0, 0);
        let b = summary(&[("b1", 10, 1), ("b2", 20, 1), ("b3", 30, 1)], 0, 0);
        let options = BlameOptions { top: 2, ..BlameOptions::default() };
        let (r, _) = compare(&a, &b, &options);
        let got: Vec<(&str, u64)> =
            r.moved.iter().map(|m| (m.from_site.as_str(), m.bytes)).collect();
        assert_eq!(got, [("a3", 30), ("a2", 20), (OTHER, 10)]);
        assert!(r.sites.is_empty());
    }
}
