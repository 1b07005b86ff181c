//! `fragsim explain`: was it fragmentation, of which kind, and what would have fixed it.
//!
//! At one moment of one policy's replay (the first OOM, else the highest reserved memory during
//! the trace), [`explain`] answers in one [`Explanation`]:
//!
//! - the moment in numbers: the request, the limit, reserved, allocated, live requested bytes and
//!   the policy's rounding;
//! - the verdict ([`Verdict`]): `capacity` when the live requested bytes and the request exceed
//!   the limit (no allocator could have served it), `fragmentation` when they fit, `fits` at a
//!   peak with no OOM;
//! - the cached-free bytes (reserved − allocated) split by [`FreeKind`], exactly: each free block
//!   of the policy's segments is classified once, by the first kind that applies;
//! - the segments a few live blocks keep from being released ([`Stranded`]), with the sites of
//!   those blocks, and the top live sites (blame's observation of the same replay,
//!   [`crate::blame::watch`]);
//! - replays under the settings that target the kinds found ([`Fix`]), in parallel, each under the
//!   same capacity (a card fix under the card's memory), ranked: fits first, then lowest peak.
//!
//! The classification reads the policy's segments as the replay left them at the moment
//! ([`crate::policy::Policy::segments`]) and, for the `pytorch` policy, its configuration (the
//! request's rounding, its pool, the `max_split_size_mb` rule). A policy that shows no segments
//! counts every cached-free byte as `too_small`, and says so in [`Explanation::notes`].

use crate::blame::{self, GroupBy, Keys, Moment};
use crate::error::{Error, Result};
use crate::policy::pytorch::config::{shown_with_version, split_version, Config, SMALL_SIZE};
use crate::policy::PolicySpec;
use crate::replay::{run_spec, EmptyCachePlan, ReplayInput, ReplayOptions};
use crate::trace::{Action, BlockState, PoolKind, Segment};
use crate::units::cards::NAMED_CARDS;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// How to explain a run.
#[derive(Clone, Debug)]
pub struct ExplainOptions {
    /// The moment: `None` is the first OOM, else the highest reserved memory during the trace.
    pub at: Option<Moment>,
    /// The policy (the recorded settings: `pytorch`).
    pub spec: PolicySpec,
    /// How to replay: the capacity (the limit), the `empty_cache` what-if.
    pub replay: ReplayOptions,
    /// How many live sites and stranded segments to list.
    pub top: usize,
    /// Replay the fixes (false: `fixes` is empty).
    pub fixes: bool,
}

impl Default for ExplainOptions {
    fn default() -> Self {
        ExplainOptions {
            at: None,
            spec: PolicySpec { name: "pytorch".into(), options: String::new() },
            replay: ReplayOptions::default(),
            top: 10,
            fixes: true,
        }
    }
}

impl ExplainOptions {
    /// The one policy explained, of the specs given (`pytorch` when none): an explanation is of
    /// one replay.
    pub fn one_spec(values: &[String]) -> Result<PolicySpec> {
        let mut specs = PolicySpec::parse_many(values)?;
        if specs.len() != 1 {
            return Err(Error::usage(format!(
                "explain takes one --policy ({} given)",
                specs.len()
            )));
        }
        Ok(specs.remove(0))
    }

    /// The moment `--at` names (`None`: the first OOM, else the peak): `oom`, `peak` or an
    /// event index; `peak-live` is a moment of blame's, not of a replay.
    pub fn moment(text: Option<&str>) -> Result<Option<Moment>> {
        match text {
            None => Ok(None),
            Some(t) if t.trim() == "peak-live" => {
                Err(Error::usage("--at peak-live: explain takes oom, peak or an event index"))
            }
            Some(t) => Moment::parse(t).map(Some),
        }
    }
}

/// What it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The live requested bytes and the request exceed the limit: no allocator could serve it.
    Capacity,
    /// They fit: the allocator's cached memory could not serve the request.
    Fragmentation,
    /// A peak with no OOM.
    Fits,
}

impl Verdict {
    /// The name JSON gives it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Capacity => "capacity",
            Verdict::Fragmentation => "fragmentation",
            Verdict::Fits => "fits",
        }
    }
}

/// The kinds of cached-free memory, in their order of precedence (docs/guide.md defines each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreeKind {
    /// A free block the request could have used.
    Usable,
    /// Cached in a private pool (CUDA graphs, `torch.cuda.MemPool`) the request cannot use.
    PrivatePool,
    /// Cached for another stream.
    OtherStream,
    /// In the other pool: the small pool for a large request, or the reverse.
    OtherPool,
    /// Large enough, but the `max_split_size_mb` rule will not split it for this request.
    Oversize,
    /// Every other free block: smaller than the request.
    TooSmall,
}

/// Every kind, in order.
pub const KINDS: [FreeKind; 6] = [
    FreeKind::Usable,
    FreeKind::PrivatePool,
    FreeKind::OtherStream,
    FreeKind::OtherPool,
    FreeKind::Oversize,
    FreeKind::TooSmall,
];

impl FreeKind {
    /// The name JSON gives it.
    pub fn name(self) -> &'static str {
        match self {
            FreeKind::Usable => "usable",
            FreeKind::PrivatePool => "private_pool",
            FreeKind::OtherStream => "other_stream",
            FreeKind::OtherPool => "other_pool",
            FreeKind::Oversize => "oversize",
            FreeKind::TooSmall => "too_small",
        }
    }
}

/// The moment explained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainMoment {
    /// `oom`, `peak` or `event`.
    pub kind: String,
    /// The event index right after which the state is read (at an OOM: the request that failed,
    /// which never existed).
    pub event: u64,
    /// The request that failed (`None` at a peak or an event).
    pub request_bytes: Option<u64>,
    /// The stream of the event (the request's at an OOM).
    pub stream: Option<u64>,
}

/// The cached-free bytes of one kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FreeBytes {
    /// The kind's name ([`FreeKind::name`]).
    pub kind: FreeKind,
    /// Free bytes of that kind.
    pub bytes: u64,
    /// Free blocks of that kind.
    pub blocks: u64,
    /// The largest of them.
    pub largest_bytes: u64,
}

/// A segment a few live blocks keep from being released.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stranded {
    /// The site of its live blocks (the largest block's, when they differ).
    pub site: String,
    /// The segment's bytes (for expandable segments: one mapped range).
    pub segment_bytes: u64,
    /// Bytes of its live blocks (block sizes).
    pub live_bytes: u64,
    /// Its live blocks.
    pub blocks: u64,
}

/// Live requested bytes of one site.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteLive {
    /// The site (docs/interface.md, "Sites").
    pub site: String,
    /// Requested bytes of its live blocks.
    pub live_bytes: u64,
}

/// One replay under other settings, a bigger card or with `empty_cache()` calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fix {
    /// What it changes, in words.
    pub why: String,
    /// The policy spec `replay -p` takes.
    pub spec: String,
    /// Other replay flags it needs (`["--empty-cache-every", "500"]`), else empty.
    pub flags: Vec<String>,
    /// The capacity it was replayed under (`None`: unlimited).
    pub capacity_bytes: Option<u64>,
    /// The card it names, for a card fix.
    pub card: Option<String>,
    /// The replay had no OOM.
    pub fits: bool,
    /// Its peak reserved memory.
    pub peak_reserved_bytes: u64,
    /// Its first OOM, if any.
    pub first_oom_event: Option<u64>,
    /// The line to paste (`PYTORCH_CUDA_ALLOC_CONF=...`), for the pytorch policy.
    pub env: Option<String>,
}

/// `explain --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The trace as named on the command line.
    pub trace: String,
    /// The device replayed.
    pub device: i32,
    /// The policy's name.
    pub policy: String,
    /// Its exact configuration.
    pub config: String,
    /// The limit (`None`: unlimited).
    pub capacity_bytes: Option<u64>,
    /// The moment.
    pub moment: ExplainMoment,
    /// Device memory the policy held.
    pub reserved_bytes: u64,
    /// Bytes of live blocks (after rounding).
    pub allocated_bytes: u64,
    /// Requested bytes of the live blocks.
    pub live_requested_bytes: u64,
    /// allocated − live requested.
    pub rounding_bytes: u64,
    /// What it was.
    pub verdict: Verdict,
    /// reserved − allocated by kind, every kind listed in order.
    pub free: Vec<FreeBytes>,
    /// Segments a few live blocks keep from being released, largest first.
    pub stranded: Vec<Stranded>,
    /// Top live sites.
    pub sites: Vec<SiteLive>,
    /// Replays that target the kinds found, fits first, then lowest peak.
    pub fixes: Vec<Fix>,
    /// The least memory any allocator needs: the trace's peak of live requested bytes (`bound`'s
    /// peak), or live requested bytes + the request at the moment where that is more.
    pub needs_bytes: u64,
    /// What a reader must know to read the numbers (the start state was higher, ...).
    pub notes: Vec<String>,
}

/// Explains `options.spec`'s replay of `input` (named `trace` in the output).
pub fn explain(input: &ReplayInput, trace: &str, options: &ExplainOptions) -> Result<Explanation> {
    if input.is_streamed() {
        return Err(Error::usage("explain needs the trace's events loaded, not streamed"));
    }
    let spec = &options.spec;
    let full = run_spec(spec, input, &options.replay)?;
    let mut notes = Vec::new();
    let at = options.at.unwrap_or(if full.result.first_oom_event.is_some() {
        Moment::Oom
    } else {
        Moment::Peak
    });
    let (kind, stop) = moment_of(at, &full, input, options)?;
    if kind == "peak" && full.result.peak_at_start {
        let during = full.detail.peak_reserved_during_trace_bytes;
        notes.extend(blame::higher_start(full.result.peak_reserved_bytes, during, stop));
    }
    let events = blame::events(input);
    let event = events.get(stop as usize);
    let request = match (kind, &full.result.first_oom) {
        ("oom", Some(d)) => Some((d.size, d.stream)),
        _ => None,
    };
    let stream = request.map(|r| r.1).or(event.map(|e| e.stream));
    if let Some(r) = crate::recorded::recorded(input.trace(), input.device()) {
        if let (Some(rec), None) = (r.first_oom_event, full.result.first_oom_event) {
            notes.push(format!(
                "the recording ran out of memory at event {rec}; this replay did not under this \
                 capacity"
            ));
        }
    }

    let (out, layout) = blame::watch(input, spec, &options.replay, stop)?;
    let keys = Keys::new(input, GroupBy::Site, 1);
    let a = blame::breakdown(&layout, &keys, options.top)?;
    let allocated = a.live_bytes + a.rounding_bytes;
    // Host memory (device -1) has no allocator settings to change and no card to move to.
    let host = input.device() < 0;
    let config = (crate::policy::has_allocator_settings(&spec.name) && !host)
        .then(|| Config::parse_shown(&out.result.config).ok())
        .flatten();
    // The request the free blocks are judged against: at a peak, the pool and stream of the
    // event that made it.
    let judged = Judged::new(config.as_ref(), request, stream, event);
    let free = free_by_kind(&out, &a, &judged, spec, &mut notes);
    let stranded = stranded_segments(&out.segments, &layout, &keys, options.top);
    let request_bytes = request.map_or(0, |r| r.0);
    let at_moment = a.live_bytes.saturating_add(request_bytes);
    // What any allocator needs for the whole trace: the peak of live requested bytes, every
    // recorded OOM's request included (the `bound` policy, unlimited).
    let bound = PolicySpec { name: "bound".into(), options: String::new() };
    let (least, least_event) = {
        let b = run_spec(&bound, input, &ReplayOptions::default())?;
        (b.result.peak_requested_bytes, b.result.peak_event)
    };
    let needs_bytes = at_moment.max(least);
    let verdict = verdict(
        kind,
        options.replay.capacity,
        at_moment,
        (least, least_event),
        a.live_bytes,
        &mut notes,
    );
    if kind == "oom" && options.replay.capacity.is_none() {
        notes.push("the recording's own OOM, replayed without a limit".into());
    }
    let sites = a
        .sites
        .iter()
        .map(|s| SiteLive { site: s.site.clone(), live_bytes: s.live_bytes })
        .collect();
    let mut e = Explanation {
        trace: trace.to_string(),
        device: input.device(),
        policy: out.result.policy.clone(),
        config: out.result.config.clone(),
        capacity_bytes: options.replay.capacity,
        moment: ExplainMoment {
            kind: kind.into(),
            event: stop,
            request_bytes: request.map(|r| r.0),
            stream,
        },
        reserved_bytes: a.reserved_bytes,
        allocated_bytes: allocated,
        live_requested_bytes: a.live_bytes,
        rounding_bytes: a.rounding_bytes,
        verdict,
        free,
        stranded,
        sites,
        fixes: Vec::new(),
        needs_bytes,
        notes,
    };
    if options.fixes {
        e.fixes = fixes(input, options, config.as_ref(), &e, full.result.peak_reserved_bytes)?;
    }
    Ok(e)
}

/// The moment `at` names in the run `full`: its kind (`oom`, `peak`, `event`) and event.
fn moment_of(
    at: Moment,
    full: &crate::replay::ReplayOutput,
    input: &ReplayInput,
    options: &ExplainOptions,
) -> Result<(&'static str, u64)> {
    let spec = &options.spec;
    let count = input.event_count();
    Ok(match at {
        Moment::Oom => match full.result.first_oom_event {
            Some(e) => ("oom", e),
            None => {
                return Err(Error::usage(format!(
                    "--at oom: {} never runs out{}",
                    spec.display(),
                    match options.replay.capacity {
                        Some(c) => format!(" under a capacity of {c} B"),
                        None => " (give --capacity)".to_string(),
                    }
                ))
                .in_format(input.trace().format.name()))
            }
        },
        Moment::Peak | Moment::PeakLive => ("peak", full.detail.peak_reserved_during_trace_event),
        Moment::Event(n) if n < count => ("event", n),
        Moment::Event(n) => {
            return Err(Error::usage(format!(
                "--at {n}: the device has {count} events (0 to {})",
                count.saturating_sub(1)
            )))
        }
    })
}

/// The cached-free bytes of the run `out` at the moment, by kind, judged against `judged`
/// (every byte `too_small`, with a note, where the policy does not show its blocks).
fn free_by_kind(
    out: &crate::replay::ReplayOutput,
    a: &blame::Attribution,
    judged: &Judged,
    spec: &PolicySpec,
    notes: &mut Vec<String>,
) -> Vec<FreeBytes> {
    let allocated = a.live_bytes + a.rounding_bytes;
    let seg_reserved: u64 = out.segments.iter().map(|s| s.total_size).sum();
    let seg_allocated: u64 = out
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| b.size)
        .sum();
    let mut free: Vec<FreeBytes> = KINDS
        .iter()
        .map(|&kind| FreeBytes { kind, bytes: 0, blocks: 0, largest_bytes: 0 })
        .collect();
    if (seg_reserved, seg_allocated) == (a.reserved_bytes, allocated) {
        for s in &out.segments {
            for b in s.blocks.iter().filter(|b| b.state == BlockState::Inactive) {
                let k = judged.kind(s, b.size);
                let row = &mut free[KINDS.iter().position(|&x| x == k).unwrap_or(5)];
                row.bytes += b.size;
                row.blocks += 1;
                row.largest_bytes = row.largest_bytes.max(b.size);
            }
        }
    } else {
        notes.push(format!(
            "{} does not show its blocks at this moment: every cached-free byte is counted as \
             too_small",
            spec.display()
        ));
        let row = &mut free[5];
        row.bytes = a.cached_free_bytes;
        row.blocks = u64::from(a.cached_free_bytes > 0);
        row.largest_bytes = a.cached_free_bytes;
    }
    free
}

/// Capacity or fragmentation: whether the live bytes and the request at the moment exceed the
/// limit, or the live bytes of the whole trace do (`least`, at its event); `fits` at a peak.
fn verdict(
    kind: &str,
    capacity: Option<u64>,
    at_moment: u64,
    (least, least_event): (u64, u64),
    live_bytes: u64,
    notes: &mut Vec<String>,
) -> Verdict {
    match (kind, capacity) {
        ("oom", Some(c)) if at_moment > c => Verdict::Capacity,
        ("oom", Some(c)) if least > c => {
            notes.push(format!(
                "this OOM itself is fragmentation ({} live + the request fit in the limit), but \
                 live requested bytes reach {} at event {least_event}, above the limit: no \
                 allocator runs this trace in it",
                crate::units::format_bytes(live_bytes),
                crate::units::format_bytes(least),
            ));
            Verdict::Capacity
        }
        ("oom", _) => Verdict::Fragmentation,
        _ => Verdict::Fits,
    }
}

/// What free blocks are judged against: the request (or, at a peak, the event's stream and
/// pool) under the policy's rules.
struct Judged {
    /// The request's rounded size, if there is a request.
    rounded: Option<u64>,
    /// The stream it was made on.
    stream: Option<u64>,
    /// Whether it goes to the small pool (`None`: unknown).
    small: Option<bool>,
    /// `max_split_size` (`u64::MAX`: unlimited).
    max_split: u64,
    /// How much larger than an oversize request a block may be.
    tolerance: u64,
}

impl Judged {
    fn new(
        config: Option<&Config>,
        request: Option<(u64, u64)>,
        stream: Option<u64>,
        event: Option<&crate::trace::Event>,
    ) -> Judged {
        let round = |n: u64| match config {
            Some(c) => c.round_size(n),
            None => n.div_ceil(512).max(1) * 512,
        };
        let sized = request.map(|r| r.0).or_else(|| {
            event.filter(|e| matches!(e.action, Action::Alloc | Action::Oom)).map(|e| e.size)
        });
        Judged {
            rounded: request.map(|r| round(r.0)),
            stream,
            small: config.and(sized).map(|n| round(n) <= SMALL_SIZE),
            max_split: config.map_or(u64::MAX, |c| c.max_split_size),
            tolerance: config.map_or(u64::MAX, |c| c.tolerance()),
        }
    }

    /// The kind of a free block of `size` bytes in segment `s`.
    fn kind(&self, s: &Segment, size: u64) -> FreeKind {
        if s.private_pool.is_some() {
            return FreeKind::PrivatePool;
        }
        if self.stream.is_some_and(|st| st != s.stream) {
            return FreeKind::OtherStream;
        }
        if self.small.is_some_and(|small| small != (s.pool == PoolKind::Small)) {
            return FreeKind::OtherPool;
        }
        let Some(r) = self.rounded else {
            return FreeKind::TooSmall;
        };
        if size < r {
            return FreeKind::TooSmall;
        }
        // PyTorch's get_free_block: a request below max_split_size never takes a block at or
        // above it; an oversize request takes a block at most `tolerance` larger.
        let refused = (r < self.max_split && size >= self.max_split)
            || (r >= self.max_split && size >= r.saturating_add(self.tolerance));
        if refused {
            FreeKind::Oversize
        } else {
            FreeKind::Usable
        }
    }
}

/// Segments holding live blocks whose free bytes exceed those blocks' bytes: releasing a few
/// blocks would release the whole segment. Largest first, `top` at most (0: all).
fn stranded_segments(
    segments: &[Segment],
    layout: &blame::observe::Layout,
    keys: &Keys,
    top: usize,
) -> Vec<Stranded> {
    let mut out: Vec<Stranded> = segments
        .iter()
        .filter_map(|s| {
            let live: Vec<_> =
                s.blocks.iter().filter(|b| b.state != BlockState::Inactive).collect();
            let live_bytes: u64 = live.iter().map(|b| b.size).sum();
            if live.is_empty() || s.total_size - live_bytes <= live_bytes {
                return None;
            }
            let largest = live.iter().max_by_key(|b| b.size)?;
            let site = match layout.live.get(&largest.address) {
                Some(entry) => keys.name_of(entry.origin),
                None => blame::UNKNOWN.to_string(),
            };
            Some(Stranded {
                site,
                segment_bytes: s.total_size,
                live_bytes,
                blocks: live.len() as u64,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (b.segment_bytes - b.live_bytes)
            .cmp(&(a.segment_bytes - a.live_bytes))
            .then(a.site.cmp(&b.site))
    });
    if top > 0 {
        out.truncate(top);
    }
    out
}

/// One fix to replay.
struct Candidate {
    why: String,
    spec: PolicySpec,
    flags: Vec<String>,
    empty_cache: Option<u64>,
    capacity: Option<u64>,
    card: Option<String>,
    env: Option<String>,
}

/// The fixes that target what `e` found, replayed in parallel and ranked.
fn fixes(
    input: &ReplayInput,
    options: &ExplainOptions,
    config: Option<&Config>,
    e: &Explanation,
    unlimited_peak: u64,
) -> Result<Vec<Fix>> {
    let capacity = options.replay.capacity;
    let bytes_of = |k: FreeKind| e.free.iter().find(|f| f.kind == k).map_or(0, |f| f.bytes);
    let mut candidates: Vec<Candidate> = Vec::new();
    // A release asked for (`version=X.Y`) is kept in every fix's spec.
    let asked = split_version(&options.spec.options).ok().and_then(|(_, v)| v);
    if let Some(base) = config {
        let env_of = |c: &Config| format!("{}={}", c.flavour.env_var(), c.to_conf_string());
        let mut variant = |why: &str, change: &dyn Fn(&mut Config)| {
            let mut c = base.clone();
            change(&mut c);
            let settings = shown_with_version(c.to_conf_string(), asked);
            // A change the allocator would refuse with the other settings (max_split_size_mb
            // below a large_segment_size_mb) is no fix to offer.
            if &c != base && Config::parse_shown(&settings).is_ok() {
                candidates.push(Candidate {
                    why: why.into(),
                    // The policy asked, with the changed settings: `pytorch-npu`'s or
                    // `pytorch-cuda`'s rules stay those of the fixes' replays.
                    spec: PolicySpec { name: options.spec.name.clone(), options: settings },
                    flags: Vec::new(),
                    empty_cache: None,
                    capacity,
                    card: None,
                    env: Some(env_of(&c)),
                });
            }
        };
        let fragmented = e.verdict != Verdict::Capacity;
        if fragmented || !e.stranded.is_empty() {
            variant("expandable segments: no segment is stranded, free pages are unmapped", &|c| {
                c.expandable_segments = true
            });
        }
        if bytes_of(FreeKind::Oversize) > 0 {
            variant("no max_split_size_mb: oversize blocks split again", &|c| {
                c.max_split_size = u64::MAX
            });
            variant("max_split_size_mb doubled", &|c| {
                c.max_split_size = c.max_split_size.saturating_mul(2)
            });
        } else if fragmented && base.max_split_size == u64::MAX {
            for mb in [128u64, 512] {
                variant(&format!("max_split_size_mb:{mb}: large blocks kept whole"), &|c| {
                    c.max_split_size = mb << 20
                });
            }
        }
        if fragmented && base.per_process_memory_fraction.is_some() {
            variant("garbage_collection_threshold:0.6: old cached blocks freed early", &|c| {
                c.garbage_collection_threshold = 0.6
            });
        }
        if fragmented && base.roundup_power2_divisions.iter().all(|&d| d == 0) {
            variant("roundup_power2_divisions:4: sizes rounded to fewer classes", &|c| {
                c.roundup_power2_divisions = [4; 16]
            });
        }
        if fragmented {
            let every = (input.event_count() / 64).max(1);
            candidates.push(Candidate {
                why: format!("{} every {every} events", base.flavour.empty_cache_call()),
                spec: options.spec.clone(),
                flags: vec!["--empty-cache-every".into(), every.to_string()],
                empty_cache: Some(every),
                capacity,
                card: None,
                env: Some(env_of(base)),
            });
        }
    }
    // Cards: each named card larger than the limit, up to the first one the unlimited peak fits
    // in; the smallest that replays with no OOM is offered.
    let mut cards: Vec<Candidate> = Vec::new();
    for card in NAMED_CARDS.iter().filter(|_| input.device() >= 0) {
        let bytes = card.bytes();
        if capacity.is_some_and(|c| bytes <= c) || bytes < e.live_requested_bytes {
            continue;
        }
        cards.push(Candidate {
            why: format!("a {} ({} GiB)", card.model, card.reported_gib),
            spec: options.spec.clone(),
            flags: Vec::new(),
            empty_cache: None,
            capacity: Some(bytes),
            card: Some(card.name.to_string()),
            env: None,
        });
        if bytes >= unlimited_peak {
            break;
        }
    }
    let n_fixes = candidates.len();
    candidates.extend(cards);
    let results: Vec<Result<Fix>> = candidates
        .par_iter()
        .map(|c| {
            let replay = ReplayOptions {
                capacity: c.capacity,
                empty_cache: match c.empty_cache {
                    Some(every) => EmptyCachePlan { every: Some(every), ..Default::default() },
                    None => options.replay.empty_cache.clone(),
                },
                stop_after: None,
                keep_series: false,
                record_events: false,
                ..options.replay.clone()
            };
            let r = run_spec(&c.spec, input, &replay)?.result;
            Ok(Fix {
                why: c.why.clone(),
                spec: c.spec.display(),
                flags: c.flags.clone(),
                capacity_bytes: c.capacity,
                card: c.card.clone(),
                fits: !r.oom,
                peak_reserved_bytes: r.peak_reserved_bytes,
                first_oom_event: r.first_oom_event,
                env: c.env.clone(),
            })
        })
        .collect();
    let mut all = Vec::with_capacity(results.len());
    for r in results {
        all.push(r?);
    }
    let cards = all.split_off(n_fixes);
    let mut fixes = all;
    // The smallest card the settings fit on (cards are smallest first).
    fixes.extend(cards.into_iter().find(|f| f.fits));
    fixes.sort_by(|a, b| {
        (!a.fits, a.card.is_some(), a.peak_reserved_bytes).cmp(&(
            !b.fits,
            b.card.is_some(),
            b.peak_reserved_bytes,
        ))
    });
    Ok(fixes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(stream: u64, pool: PoolKind) -> Segment {
        Segment {
            device: 0,
            address: 0,
            total_size: 0,
            stream,
            pool,
            is_expandable: false,
            private_pool: None,
            blocks: Vec::new(),
        }
    }

    #[test]
    fn kinds_follow_their_order_of_precedence() {
        let c = Config { max_split_size: 64 << 20, ..Config::default() };
        let j = Judged::new(Some(&c), Some((30 << 20, 7)), Some(7), None);
        let large = seg(7, PoolKind::Large);
        assert_eq!(j.kind(&large, 40 << 20), FreeKind::Usable);
        assert_eq!(j.kind(&large, 20 << 20), FreeKind::TooSmall);
        assert_eq!(j.kind(&large, 100 << 20), FreeKind::Oversize);
        assert_eq!(j.kind(&seg(8, PoolKind::Large), 40 << 20), FreeKind::OtherStream);
        assert_eq!(j.kind(&seg(7, PoolKind::Small), 2 << 20), FreeKind::OtherPool);
        let private = Segment { private_pool: Some((1, 2)), ..seg(8, PoolKind::Small) };
        assert_eq!(j.kind(&private, 40 << 20), FreeKind::PrivatePool);
        // An oversize request takes a block at most the tolerance (20 MiB) larger.
        let big = Judged::new(Some(&c), Some((100 << 20, 7)), Some(7), None);
        assert_eq!(big.kind(&large, 110 << 20), FreeKind::Usable);
        assert_eq!(big.kind(&large, 130 << 20), FreeKind::Oversize);
    }
}
