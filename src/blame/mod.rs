//! Where the memory went: a moment of a replay, its reserved bytes broken down by the allocation
//! sites that caused them (`fragsim blame`), and two runs compared site by site (`fragsim diff`,
//! [`diff`]).
//!
//! At a [`Moment`] of one policy's replay, reserved bytes split exactly into
//!
//! - live requested bytes, by the site of each live block's request ([`crate::trace::sites`]);
//! - rounding (block size − request), by the same sites;
//! - cached-but-free bytes (the holes: memory the policy holds that no live block uses),
//!   attributed twice: to the site whose request obtained the memory they sit in (created the
//!   segment or mapped the pages), and to the site whose block was freed into the hole last.
//!
//! The policy never knows: the replay is watched from outside ([`observe`]) up to the moment, and
//! the sums add up by construction (holes are the memory obtained minus the live blocks).
//! Grouping ([`GroupBy`]) is by site, by the site's function or file, by stream, or by size class;
//! a trace without frames groups by size class and stream and says so ([`SiteRule`]).

pub mod diff;
pub mod flame;
pub mod fuzz;
pub mod observe;
pub mod recorded;

use crate::error::{Error, Result};
use crate::policy::{self, PolicyRunner, PolicySpec};
use crate::replay::{run_policy, run_spec, ReplayInput, ReplayOptions, ReplayOutput};
use crate::trace::sites::{self, SiteId, SiteTable};
use crate::trace::{Action, AddrMap, Event, FramesId};
use crate::units::short_size;
use observe::{Layout, Origin, Watched};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// `s` cut to `width` characters keeping its end (a site's file name, line and function), the
/// start elided with `…`: how tables and charts show long sites.
pub fn keep_end(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width || width == 0 {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - (width - 1)).collect();
    format!("…{tail}")
}

/// The moment of a run at which memory is broken down (`--at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The first event at which the policy's reserved memory reaches its maximum.
    Peak,
    /// The first event at which live requested bytes reach their maximum (the same for every
    /// policy that serves every request).
    PeakLive,
    /// The first request the policy could not serve under the capacity.
    Oom,
    /// Right after this event index.
    Event(u64),
}

impl Moment {
    /// Parses `--at`: `peak`, `peak-live`, `oom` or an event index.
    pub fn parse(text: &str) -> Result<Moment> {
        match text.trim() {
            "peak" => Ok(Moment::Peak),
            "peak-live" => Ok(Moment::PeakLive),
            "oom" => Ok(Moment::Oom),
            t => t.parse().map(Moment::Event).map_err(|_| {
                Error::usage(format!("--at {t}: expected peak, peak-live, oom or an event index"))
            }),
        }
    }

    /// The name JSON gives the kind of moment.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Moment::Peak => "peak",
            Moment::PeakLive => "peak-live",
            Moment::Oom => "oom",
            Moment::Event(_) => "event",
        }
    }
}

/// How sites are grouped (`--by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// The site rule (docs/interface.md, "Sites").
    #[default]
    Site,
    /// The site's function (`FILE:LINE:FUNCTION` → `FUNCTION`).
    Function,
    /// The site's file.
    File,
    /// The request's stream.
    Stream,
    /// The request's power-of-two size class.
    Size,
    /// The label a snapshot's `annotate` entry attached to the allocation (PyTorch 2.14+):
    /// [`ANNOTATION_NONE`] for allocations no entry labelled.
    Annotation,
}

/// The group of allocations no `annotate` entry labelled (`--by annotation`).
pub const ANNOTATION_NONE: &str = "(no annotation)";

impl GroupBy {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Site => "site",
            GroupBy::Function => "function",
            GroupBy::File => "file",
            GroupBy::Stream => "stream",
            GroupBy::Size => "size",
            GroupBy::Annotation => "annotation",
        }
    }

    /// Every grouping, in the order the command line lists them.
    pub const ALL: [GroupBy; 6] = [
        GroupBy::Site,
        GroupBy::Function,
        GroupBy::File,
        GroupBy::Stream,
        GroupBy::Size,
        GroupBy::Annotation,
    ];

    /// The grouping called `text` ([`GroupBy::name`]).
    pub fn parse(text: &str) -> std::result::Result<GroupBy, String> {
        let text = text.trim();
        Self::ALL.into_iter().find(|g| g.name() == text).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|g| g.name()).collect();
            format!("give one of {}", names.join(", "))
        })
    }
}

/// Refuses keys of no frames: a key is at least the site.
pub fn check_depth(depth: usize) -> Result<()> {
    if depth == 0 {
        return Err(Error::usage("--depth 0: give at least 1 frame"));
    }
    Ok(())
}

/// What names a site in this trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SiteRule {
    /// The stack frames the trace records.
    Frames,
    /// The trace records no frames (Kineto, RMM, text): sites are size classes and streams.
    SizeAndStream,
}

/// How to break a run down.
#[derive(Clone, Debug)]
pub struct BlameOptions {
    /// The moment.
    pub at: Moment,
    /// The grouping.
    pub by: GroupBy,
    /// How many groups to list before folding the rest into `(other)`; 0: all.
    pub top: usize,
    /// Keys of this many innermost user frames (1: the site).
    pub depth: usize,
    /// How to replay.
    pub replay: ReplayOptions,
}

impl Default for BlameOptions {
    fn default() -> Self {
        BlameOptions {
            at: Moment::Peak,
            by: GroupBy::Site,
            top: 15,
            depth: 1,
            replay: ReplayOptions::default(),
        }
    }
}

/// The group every group beyond `--top` folds into.
pub const OTHER: &str = "(other)";

/// The site of a hole nothing was ever freed into: memory obtained during the trace and never
/// handed out since.
pub const NEVER_ALLOCATED: &str = "(never allocated)";

/// The site of memory obtained outside any request.
pub const UNKNOWN: &str = "(unknown)";

/// The moment as JSON names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MomentAt {
    /// `peak`, `peak-live`, `oom` or `event`.
    pub kind: String,
    /// The event index right after which the breakdown is taken.
    pub event: u64,
}

/// One group's live bytes at the moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteBytes {
    /// The group's key (a site, function, file, stream or size class).
    pub site: String,
    /// Requested bytes of its live blocks.
    pub live_bytes: u64,
    /// Block bytes beyond the requests (the policy's rounding).
    pub rounding_bytes: u64,
    /// Live blocks.
    pub blocks: u64,
}

/// One group's share of the holes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HoleBytes {
    /// The group's key.
    pub site: String,
    /// Cached-but-free bytes attributed to it.
    pub cached_free_bytes: u64,
}

/// One run broken down at one moment: a `results` entry of `blame --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    /// The policy's name.
    pub policy: String,
    /// Its exact configuration.
    pub config: String,
    /// The moment.
    pub moment: MomentAt,
    /// Device memory the policy held.
    pub reserved_bytes: u64,
    /// Requested bytes of the live blocks.
    pub live_bytes: u64,
    /// Block bytes beyond the requests.
    pub rounding_bytes: u64,
    /// Held but not in a live block.
    pub cached_free_bytes: u64,
    /// Live and rounding bytes by group, largest live first.
    pub sites: Vec<SiteBytes>,
    /// Holes by the group whose request obtained the memory they sit in.
    pub holes_by_segment_site: Vec<HoleBytes>,
    /// Holes by the group whose block was freed into them last.
    pub holes_by_last_free_site: Vec<HoleBytes>,
    /// Live requested bytes by full stack (innermost frame first), for the flame graph.
    #[serde(skip)]
    pub stacks: Vec<(FramesId, u64)>,
    /// What a reader must know about the moment: at `--at peak`, that the state before the first
    /// event held more than the run ever did after (a snapshot recorded mid-run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `blame --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlameReport {
    /// The trace as named on the command line.
    pub trace: String,
    /// The device replayed.
    pub device: i32,
    /// The grouping.
    pub by: GroupBy,
    /// What names a site in this trace.
    pub site_rule: SiteRule,
    /// One entry per run.
    pub results: Vec<Attribution>,
}

/// The device's events, which attribution walks more than once and by index. Attribution asks for
/// an input whose events are loaded ([`ReplayInput::new`]); its entry points refuse one that
/// streams them, for which this is empty.
pub(crate) fn events<'a>(input: &ReplayInput<'a>) -> &'a [Event] {
    input.loaded_events().unwrap_or(&[])
}

/// The error for an input whose events stream from a file.
fn refuse_streamed(input: &ReplayInput) -> Result<()> {
    if input.is_streamed() {
        return Err(Error::usage("attribution needs the trace's events loaded, not streamed"));
    }
    Ok(())
}

/// The site rule of `input`'s trace: frames where it records any.
pub(crate) fn site_rule(input: &ReplayInput) -> SiteRule {
    if input.trace().frames.is_empty() {
        SiteRule::SizeAndStream
    } else {
        SiteRule::Frames
    }
}

/// Breaks each of `specs`' replays of `input` down at `options.at`.
pub(crate) fn blame(
    input: &ReplayInput,
    specs: &[PolicySpec],
    options: &BlameOptions,
) -> Result<Vec<Attribution>> {
    let keys = Keys::new(input, options.by, options.depth);
    let mut out: Vec<Attribution> = attribute_recorded(input, options, &keys).into_iter().collect();
    for spec in specs {
        out.push(attribute(input, spec, options, &keys)?);
    }
    Ok(out)
}

/// The recorded run broken down at `options.at` ([`recorded`]), where the trace records its
/// layout and the moment exists in it (`--at oom`: where it recorded an OOM); `None` also where
/// the recording contradicts itself (a block outside the recorded segments).
pub(crate) fn attribute_recorded(
    input: &ReplayInput,
    options: &BlameOptions,
    keys: &Keys,
) -> Option<Attribution> {
    if !recorded::available(input) {
        return None;
    }
    let mut start_note = None;
    let (stop, before_first) = match options.at {
        Moment::Peak => {
            // The highest reserved memory after an event: the start state is not a moment of
            // the run.
            let r = crate::recorded::recorded(input.trace(), input.device())?;
            let (mut at, mut during) = (0, 0);
            for (i, &b) in r.reserved_after.iter().enumerate() {
                if b > during {
                    (at, during) = (i as u64, b);
                }
            }
            start_note = higher_start(r.reserved_at_start_bytes, during, at);
            (at, false)
        }
        Moment::PeakLive => {
            let (at, before_first) = peak_live_moment(input);
            if before_first {
                start_note = Some(BEFORE_FIRST_LIVE.to_string());
            }
            (at, before_first)
        }
        Moment::Oom => {
            let r = crate::recorded::recorded(input.trace(), input.device())?;
            (r.first_oom_event?, false)
        }
        Moment::Event(n) => (n, false),
    };
    let layout = recorded::layout(input, stop, before_first);
    let mut a = breakdown(&layout, keys, options.top).ok()?;
    a.policy = crate::recorded::POLICY_NAME.to_string();
    a.moment = MomentAt { kind: options.at.kind().into(), event: stop };
    a.note = start_note;
    Some(a)
}

/// The note of `--at peak-live` where live bytes peak before the first event.
pub const BEFORE_FIRST_LIVE: &str = "live bytes peak before the first event (the blocks live when \
     the recording began): read there, before event 0, where bound's peak_requested_bytes is read";

/// The note for a run whose state before the first event (`start` bytes reserved) held at least
/// its highest reserved memory during the trace (`during`, first reached after event `at`): a
/// snapshot recorded mid-run, whose cache at the peak may be the one it started with.
pub(crate) fn higher_start(start: u64, during: u64, at: u64) -> Option<String> {
    let gb = crate::units::format_bytes;
    if start > during {
        Some(format!(
            "the state before the first event held more ({}) than any moment of the run: the \
             recording began mid-run with that cache; the peak here is the highest during the \
             trace ({} after event {at})",
            gb(start),
            gb(during)
        ))
    } else if start == during && start > 0 {
        Some(format!(
            "the run never reserved more than the cache it started with ({}): the recording \
             began mid-run; the peak here is the first event at that level (event {at}), and \
             its cached-free bytes may be that start cache",
            gb(start)
        ))
    } else {
        None
    }
}

/// The event right after which `at` falls in `spec`'s replay of `input`, with the plain replay's
/// output where one was needed to find it.
pub fn moment_of(
    input: &ReplayInput,
    spec: &PolicySpec,
    at: Moment,
    replay: &ReplayOptions,
) -> Result<(u64, Option<ReplayOutput>)> {
    let count = input.event_count();
    match at {
        Moment::Event(n) if n < count => Ok((n, None)),
        Moment::Event(n) => Err(Error::usage(format!(
            "--at {n}: the device has {count} events (0 to {})",
            count.saturating_sub(1)
        ))),
        Moment::PeakLive => Ok((peak_live_event(input), None)),
        Moment::Peak => {
            // The highest reserved memory during the trace, never the state before it.
            let out = run_spec(spec, input, replay)?;
            Ok((out.detail.peak_reserved_during_trace_event, Some(out)))
        }
        Moment::Oom => {
            let out = run_spec(spec, input, replay)?;
            match out.result.first_oom_event {
                Some(e) => Ok((e, Some(out))),
                None => Err(Error::usage(format!(
                    "--at oom: {} never runs out{}",
                    spec.display(),
                    match replay.capacity {
                        Some(c) => format!(" under a capacity of {c} B"),
                        None => " (give --capacity)".to_string(),
                    }
                ))
                .in_format(input.trace().format.name())),
            }
        }
    }
}

/// The first event after which live requested bytes reach their maximum (a walk over the
/// events: frees take effect at `input.frees_at()`, an alloc at a live address frees that block).
pub(crate) fn peak_live_event(input: &ReplayInput) -> u64 {
    peak_live_moment(input).0
}

/// The moment live requested bytes first reach their maximum: the event after which they do,
/// and whether it is the state before the first event (the blocks live when a snapshot's
/// recording began, more than any event leaves live: then the event is 0 and the moment is
/// before it, where `bound`'s `peak_requested_bytes` reads it too).
pub(crate) fn peak_live_moment(input: &ReplayInput) -> (u64, bool) {
    let mut live: AddrMap<u64> = AddrMap::default();
    let mut now: u64 = 0;
    for b in input.live_at_start() {
        now -= live.insert(b.addr, b.size).unwrap_or(0);
        now += b.size;
    }
    let (mut peak, mut at, mut before_first) = (now, 0, now > 0);
    for (i, e) in events(input).iter().enumerate() {
        match e.action {
            Action::Alloc if e.size > 0 => {
                now -= live.insert(e.addr, e.size).unwrap_or(0);
                now += e.size;
                if now > peak {
                    (peak, at, before_first) = (now, i as u64, false);
                }
            }
            a if a == input.frees_at() => now -= live.remove(&e.addr).unwrap_or(0),
            _ => {}
        }
    }
    (at, before_first)
}

/// Replays `spec` on `input` up to right after event `stop`, watched; the replay's output and
/// what the watch saw.
pub fn watch<'e>(
    input: &'e ReplayInput,
    spec: &PolicySpec,
    replay: &ReplayOptions,
    stop: u64,
) -> Result<(ReplayOutput, Layout<'e>)> {
    let options = ReplayOptions {
        stop_after: Some(stop),
        keep_series: false,
        record_events: false,
        ..replay.clone()
    };
    refuse_streamed(input)?;
    let info = policy::lookup(&spec.name)?;
    let built = info.build(spec, &input.context(&options))?;
    let mut layout = Layout::new(events(input), input.live_at_start());
    let out =
        built.run_with(&spec.name, Runner { input, options: &options, layout: &mut layout })?;
    layout.check()?;
    Ok((out, layout))
}

/// Runs a built policy watched by a [`Layout`].
struct Runner<'r, 'i, 'e> {
    input: &'r ReplayInput<'i>,
    options: &'r ReplayOptions,
    layout: &'r mut Layout<'e>,
}

impl PolicyRunner for Runner<'_, '_, '_> {
    type Output = Result<ReplayOutput>;
    fn run<P: policy::Policy>(self, name: &str, policy: P) -> Result<ReplayOutput> {
        let watched = Watched { inner: policy, layout: self.layout };
        run_policy(name, watched, self.input, self.options)
    }
}

/// One run of `spec` broken down at `options.at`.
fn attribute(
    input: &ReplayInput,
    spec: &PolicySpec,
    options: &BlameOptions,
    keys: &Keys,
) -> Result<Attribution> {
    refuse_streamed(input)?;
    let (stop, full) = moment_of(input, spec, options.at, &options.replay)?;
    let before_first = options.at == Moment::PeakLive && peak_live_moment(input).1;
    let replay = ReplayOptions { stop_before_first: before_first, ..options.replay.clone() };
    let (out, layout) = watch(input, spec, &replay, stop)?;
    let mut a = breakdown(&layout, keys, options.top)?;
    a.policy = out.result.policy.clone();
    a.config = out.result.config.clone();
    a.moment = MomentAt { kind: options.at.kind().into(), event: stop };
    if before_first {
        a.note = Some(BEFORE_FIRST_LIVE.to_string());
    }
    if let (Moment::Peak, Some(full)) = (options.at, &full) {
        if full.result.peak_at_start {
            let during = full.detail.peak_reserved_during_trace_bytes;
            a.note = higher_start(full.result.peak_reserved_bytes, during, stop);
        }
    }
    Ok(a)
}

/// Sums of one group.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    live: u64,
    rounding: u64,
    blocks: u64,
}

/// The breakdown of what `layout` holds, groups named by `keys`, the `top` largest listed.
pub(crate) fn breakdown(layout: &Layout, keys: &Keys, top: usize) -> Result<Attribution> {
    let mut by_key: HashMap<Key, Sums> = HashMap::new();
    let mut stacks: HashMap<FramesId, u64> = HashMap::new();
    let mut blocks: Vec<(u64, u64)> = Vec::with_capacity(layout.live.len());
    for (&addr, b) in &layout.live {
        let s = by_key.entry(keys.key(b.origin)).or_default();
        s.live += b.request;
        s.rounding += b.block.saturating_sub(b.request);
        s.blocks += 1;
        *stacks.entry(keys.frames(b.origin)).or_default() += b.request;
        blocks.push((addr, addr.saturating_add(b.block)));
    }
    blocks.sort_unstable();
    let live: u64 = by_key.values().map(|s| s.live).sum();
    let rounding: u64 = by_key.values().map(|s| s.rounding).sum();
    let reserved: u64 = layout.created.iter().map(|(&a, &(b, _))| b - a).sum();
    // Holes: each obtained range minus the live blocks in it.
    let mut by_segment: HashMap<Key, u64> = HashMap::new();
    let mut by_last_free: HashMap<Key, u64> = HashMap::new();
    let mut holes = 0u64;
    let mut next = 0; // the first block that may overlap the current range
    for (&start, &(end, made_by)) in &layout.created {
        while blocks.get(next).is_some_and(|&(_, e)| e <= start) {
            next += 1;
        }
        let mut at = start;
        let mut k = next;
        let mut hole = |a: u64, b: u64| {
            if b > a {
                holes += b - a;
                *by_segment.entry(keys.key(made_by)).or_default() += b - a;
                let last = match layout.last_freed_in(a, b) {
                    Some(o) => keys.key(o),
                    None if made_by == Origin::BeforeTrace => Key::Named(sites::BEFORE_THE_TRACE),
                    None => Key::Named(NEVER_ALLOCATED),
                };
                *by_last_free.entry(last).or_default() += b - a;
            }
        };
        while let Some(&(bs, be)) = blocks.get(k) {
            if bs >= end {
                break;
            }
            hole(at, bs.max(at).min(end));
            at = at.max(be.min(end));
            k += 1;
        }
        hole(at, end);
    }
    let allocated = live + rounding;
    if allocated + holes != reserved {
        // The recording contradicts itself (blocks it shows live outside the segments it
        // shows): a problem of the input, not of a backend.
        return Err(Error::input(format!(
            "attribution: live blocks of {allocated} B lie partly outside the {reserved} B the \
             policy holds ({holes} B of holes): the trace's blocks and segments disagree"
        )));
    }
    let mut stacks: Vec<(FramesId, u64)> = stacks.into_iter().collect();
    stacks.sort_unstable_by_key(|&(f, b)| (std::cmp::Reverse(b), f.0));
    Ok(Attribution {
        policy: String::new(),
        config: String::new(),
        moment: MomentAt { kind: "event".into(), event: 0 },
        reserved_bytes: reserved,
        live_bytes: live,
        rounding_bytes: rounding,
        cached_free_bytes: holes,
        sites: site_rows(keys, by_key, top),
        holes_by_segment_site: hole_rows(keys, by_segment, top),
        holes_by_last_free_site: hole_rows(keys, by_last_free, top),
        stacks,
        note: None,
    })
}

/// Groups' sums named, merged by name, largest live first, beyond `top` folded into `(other)`.
fn site_rows(keys: &Keys, by_key: HashMap<Key, Sums>, top: usize) -> Vec<SiteBytes> {
    let mut named: HashMap<String, Sums> = HashMap::new();
    for (k, s) in by_key {
        let t = named.entry(keys.name(k)).or_default();
        t.live += s.live;
        t.rounding += s.rounding;
        t.blocks += s.blocks;
    }
    let mut rows: Vec<SiteBytes> = named
        .into_iter()
        .map(|(site, s)| SiteBytes {
            site,
            live_bytes: s.live,
            rounding_bytes: s.rounding,
            blocks: s.blocks,
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.live_bytes + b.rounding_bytes, b.live_bytes)
            .cmp(&(a.live_bytes + a.rounding_bytes, a.live_bytes))
            .then_with(|| a.site.cmp(&b.site))
    });
    if top > 0 && rows.len() > top {
        let rest = rows.split_off(top);
        rows.push(SiteBytes {
            site: OTHER.to_string(),
            live_bytes: rest.iter().map(|r| r.live_bytes).sum(),
            rounding_bytes: rest.iter().map(|r| r.rounding_bytes).sum(),
            blocks: rest.iter().map(|r| r.blocks).sum(),
        });
    }
    rows
}

/// Hole bytes named, merged by name, largest first, beyond `top` folded into `(other)`.
fn hole_rows(keys: &Keys, by_key: HashMap<Key, u64>, top: usize) -> Vec<HoleBytes> {
    let mut named: HashMap<String, u64> = HashMap::new();
    for (k, b) in by_key {
        *named.entry(keys.name(k)).or_default() += b;
    }
    let mut rows: Vec<HoleBytes> = named
        .into_iter()
        .map(|(site, cached_free_bytes)| HoleBytes { site, cached_free_bytes })
        .collect();
    rows.sort_by(|a, b| b.cached_free_bytes.cmp(&a.cached_free_bytes).then(a.site.cmp(&b.site)));
    if top > 0 && rows.len() > top {
        let rest = rows.split_off(top);
        rows.push(HoleBytes {
            site: OTHER.to_string(),
            cached_free_bytes: rest.iter().map(|r| r.cached_free_bytes).sum(),
        });
    }
    rows
}

/// A group before it is named: cheap to hash for every live block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Site(SiteId),
    Stream(u64),
    Size(u32),
    SizeStream(u32, u64),
    Named(&'static str),
    /// An `annotate` label, by its index in [`Labels::names`].
    Label(u32),
}

/// The `annotate` labels of one device's allocations (`--by annotation`): each label belongs
/// to the allocation live at its `addr` when its entry was written, the last `alloc` at that
/// address before it (or the block live there at the start). An allocation labelled more than
/// once is grouped under its first label.
#[derive(Default)]
struct Labels {
    names: Vec<String>,
    /// The label of each labelled allocation's `alloc` event.
    of_event: std::collections::HashMap<u64, u32>,
    /// The label of each labelled block live at the start.
    of_start: std::collections::HashMap<u64, u32>,
}

impl Labels {
    fn new(input: &ReplayInput) -> Labels {
        let mut labels = Labels::default();
        let mut notes: Vec<&crate::trace::Annotation> = (input.trace().extras.annotations.iter())
            .filter(|a| a.device == input.device())
            .collect();
        if notes.is_empty() {
            return labels;
        }
        notes.sort_by_key(|a| a.event);
        let events = events(input);
        let mut index: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
        let mut last_alloc: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        let mut next = 0usize;
        for note in notes {
            let upto = (note.event as usize).min(events.len());
            while next < upto {
                if events[next].action == Action::Alloc {
                    last_alloc.insert(events[next].addr, next as u64);
                }
                next += 1;
            }
            let n = index.len() as u32;
            let id = *index.entry(note.label.as_str()).or_insert_with(|| {
                // A label is a name from the trace, shown as sites are: control characters
                // written out, so no table, CSV or chart gets an ESC or a NUL.
                labels.names.push(sites::printable(&note.label).into_owned());
                n
            });
            match last_alloc.get(&note.addr) {
                Some(&i) => labels.of_event.entry(i).or_insert(id),
                None => labels.of_start.entry(note.addr).or_insert(id),
            };
        }
        labels
    }
}

/// Names the group of each request for one trace and grouping: sites computed once per stack.
pub struct Keys<'i> {
    input: &'i ReplayInput<'i>,
    sites: SiteTable,
    by: GroupBy,
    rule: SiteRule,
    /// Name sites by the last two components of their file's path ([`sites::short_site`]).
    short: bool,
    /// The `annotate` labels, for [`GroupBy::Annotation`] (empty otherwise).
    labels: Labels,
}

impl<'i> Keys<'i> {
    /// The keys of `input`'s requests grouped `by`, with `depth` user frames per site key.
    pub(crate) fn new(input: &'i ReplayInput<'i>, by: GroupBy, depth: usize) -> Keys<'i> {
        Keys {
            input,
            sites: SiteTable::new(&input.trace().frames, depth),
            by,
            rule: site_rule(input),
            short: false,
            labels: if by == GroupBy::Annotation { Labels::new(input) } else { Labels::default() },
        }
    }

    /// The same keys, sites named by the last two components of their file's path
    /// ([`sites::short_site`]): how `diff` matches sites of runs recorded in different checkouts.
    pub(crate) fn short(mut self) -> Keys<'i> {
        self.short = true;
        self
    }

    /// The name of the group of `origin`'s request (a site, or what stands for one).
    pub(crate) fn name_of(&self, origin: Origin) -> String {
        self.name(self.key(origin))
    }

    /// The request behind `origin`: its stack, size and stream (`None`: no request).
    fn request(&self, origin: Origin) -> Option<(FramesId, u64, u64)> {
        match origin {
            Origin::Event(i) => {
                events(self.input).get(i as usize).map(|e| (e.frames, e.size, e.stream))
            }
            Origin::Start(k) => self.input.live_at_start().get(k as usize).map(|b| {
                (self.input.trace().frames.block(self.input.device(), b.addr), b.size, b.stream)
            }),
            Origin::BeforeTrace | Origin::Unknown => None,
        }
    }

    /// The stack behind `origin` ([`FramesId::NONE`] when none is known).
    fn frames(&self, origin: Origin) -> FramesId {
        self.request(origin).map_or(FramesId::NONE, |r| r.0)
    }

    /// The group of `origin`'s request.
    fn key(&self, origin: Origin) -> Key {
        let Some((frames, size, stream)) = self.request(origin) else {
            return Key::Named(match origin {
                Origin::Unknown => UNKNOWN,
                _ => sites::BEFORE_THE_TRACE,
            });
        };
        let class = 63 - size.max(1).leading_zeros();
        if self.by == GroupBy::Annotation {
            let label = match origin {
                Origin::Event(i) => self.labels.of_event.get(&u64::from(i)),
                Origin::Start(k) => (self.input.live_at_start().get(k as usize))
                    .and_then(|b| self.labels.of_start.get(&b.addr)),
                _ => None,
            };
            return label.map_or(Key::Named(ANNOTATION_NONE), |&l| Key::Label(l));
        }
        match self.by {
            GroupBy::Stream => Key::Stream(stream),
            GroupBy::Size => Key::Size(class),
            _ if self.rule == SiteRule::SizeAndStream => Key::SizeStream(class, stream),
            _ if frames == FramesId::NONE && matches!(origin, Origin::Start(_)) => {
                Key::Named(sites::BEFORE_THE_TRACE)
            }
            _ => Key::Site(self.sites.of(frames)),
        }
    }

    /// The name of group `key`.
    fn name(&self, key: Key) -> String {
        let class = |c: u32| {
            let lo = 1u64 << c;
            format!("{}–{}", short_size(lo), short_size(lo.saturating_mul(2)))
        };
        match key {
            Key::Site(id) => {
                let site = self.sites.name(id);
                match (self.by, self.short) {
                    (GroupBy::Function, _) => sites::site_parts(site).1.to_string(),
                    (GroupBy::File, false) => sites::site_parts(site).0.to_string(),
                    (GroupBy::File, true) => sites::short_file(sites::site_parts(site).0),
                    (_, false) => site.to_string(),
                    (_, true) => {
                        site.split(" < ").map(sites::short_site).collect::<Vec<_>>().join(" < ")
                    }
                }
            }
            Key::Stream(s) => format!("stream {s:#x}"),
            Key::Size(c) => format!("size {}", class(c)),
            Key::SizeStream(c, s) => format!("size {}, stream {s:#x}", class(c)),
            Key::Named(n) => n.to_string(),
            Key::Label(l) => self.labels.names[l as usize].clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grouping_parses_from_its_name_and_nothing_else() {
        for g in GroupBy::ALL {
            assert_eq!(GroupBy::parse(g.name()), Ok(g));
        }
        let e = GroupBy::parse("sites").unwrap_err();
        assert!(e.contains("site, function, file, stream, size, annotation"), "{e}");
        assert!(check_depth(0).is_err() && check_depth(1).is_ok());
    }
}
