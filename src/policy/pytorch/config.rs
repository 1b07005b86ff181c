//! `PYTORCH_CUDA_ALLOC_CONF`: the options of PyTorch's caching allocator, parsed as PyTorch parses
//! them, and the size arithmetic they control (`round_size`, `get_allocation_size`).
//!
//! Upstream: `c10/core/AllocatorConfig.{h,cpp}` and `c10/cuda/CUDAAllocatorConfig.{h,cpp}` (the
//! parsers), `c10/cuda/CUDACachingAllocator.cpp` (`round_size`, `roundup_power2_next_division`,
//! `get_allocation_size`). See docs/pytorch-model.md#rounding and
//! docs/pytorch-model.md#alloc-conf.
//!
//! The baseline is 2.11 (what a recording showing no later release is modelled as); 2.12 – 2.15
//! add rules of their own ([`Version::NEWEST`], [`ModelledVersion`] for which one a recording
//! shows). [`Version`] selects older behaviour where it
//! changes a decision and the trace cannot tell: how `>` fills the divisions table (≤ 2.8 fills from
//! the last listed key itself), the lower limit of `max_split_size_mb` (≤ 2.8: > 20, later ≥ 20),
//! the oversize tolerance (< 2.6: the constant 20 MiB, no `max_non_split_rounding_mb`), and whether a
//! memory fraction of 1.0 sets a limit (2.5–2.8 did). Versions before 2.0 (one global divisions
//! value, `roundup_bypass_threshold_mb`) are not modelled.
//!
//! Parsing is as lenient as current main where a recorded settings string depends on it: the `:` and
//! `,` separators are not checked, numbers are read like `stoull` / `stod` (a numeric prefix; `-1`
//! wraps). Options that change nothing a simulator sees (`release_lock_on_cudamalloc`, `pinned_*`,
//! `graph_capture_record_stream_reuse`, ...) are accepted and kept only for display.

use crate::error::{quoted, Error, Result};
use crate::trace::{AllocatorSettings, Trace};
use crate::units::MIB;
use std::borrow::Cow;

/// Every block size is a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded sizes up to and including this go to the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool, and its expandable page size (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Rounded sizes below this get a `large_segment_size` segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// The default large segment size, expandable page size and tolerance (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Segments for rounded sizes ≥ 10 MiB are rounded up to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// `round_size` where no divisions apply: up to a multiple of [`MIN_BLOCK_SIZE`], at least one.
#[inline]
pub(crate) fn round_to_blocks(n: u64) -> u64 {
    n.max(1).div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
}

/// Number of `roundup_power2_divisions` intervals.
pub const INTERVALS: usize = 16;

/// Bytes torch_npu adds to every request before rounding it (`AddPadSize`): the Ascend runtime
/// wants 32 bytes past the end of each buffer (docs/pytorch-model.md#npu).
pub const NPU_PAD: u64 = 32;
/// torch_npu's default `base_addr_aligned_kb`, and its upper limit (`kAlignRoundLarge`).
pub const NPU_ALIGN_ROUND_LARGE: u64 = 16 * 1024;
/// torch_npu's huge page with `page_size:1g` (`kExtraLargeBuffer`).
pub const NPU_EXTRA_LARGE_BUFFER: u64 = 1 << 30;

/// Whose caching allocator the rules are: PyTorch's CUDA one, or torch_npu's fork of it for
/// Huawei Ascend NPUs. Why one type: the two make the same decisions almost everywhere, so the
/// policy is one, and the few rules that differ (docs/pytorch-model.md#npu) ask this.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flavour {
    /// `c10/cuda/CUDACachingAllocator.cpp`, configured by `PYTORCH_CUDA_ALLOC_CONF`.
    #[default]
    Cuda,
    /// torch_npu's `NPUCachingAllocator.cpp`, configured by `PYTORCH_NPU_ALLOC_CONF`.
    Npu,
}

/// True when `conf` names an option only torch_npu's allocator has.
fn names_npu_option(conf: &str) -> bool {
    tokenize(conf).iter().any(|t| {
        matches!(
            t.as_str(),
            "base_addr_aligned_kb" | "segment_size_mb" | "page_size" | "pinned_mem_register"
        )
    })
}

impl Flavour {
    /// Whose allocator rules a policy name asks `validate` for: `pytorch` the recording's own
    /// (`None`), `pytorch-cuda` CUDA's, `pytorch-npu` torch_npu's.
    pub fn rules(name: &str) -> std::result::Result<Option<Flavour>, String> {
        match name.trim() {
            "pytorch" => Ok(None),
            "pytorch-cuda" => Ok(Some(Flavour::Cuda)),
            "pytorch-npu" => Ok(Some(Flavour::Npu)),
            other => Err(format!(
                "validate replays PyTorch's allocator only: {other} is not one of pytorch, \
                 pytorch-cuda, pytorch-npu",
                other = quoted(other)
            )),
        }
    }

    /// The allocator that made `trace`: torch_npu's when a frame names torch_npu
    /// ([`Trace::torch_npu`]) or the recorded settings string holds an option only torch_npu
    /// has; CUDA's otherwise.
    pub fn of_trace(trace: &Trace) -> Flavour {
        let npu_conf = trace
            .allocator_settings
            .as_ref()
            .and_then(|s| s.conf.as_deref())
            .is_some_and(names_npu_option);
        if trace.torch_npu || npu_conf {
            Flavour::Npu
        } else {
            Flavour::Cuda
        }
    }

    /// Bytes this allocator adds to every request before rounding: 32 for torch_npu, none
    /// for CUDA. Why it is asked of a recording's maker: an `oom` entry records the rounded
    /// size, and the request behind it is that much smaller.
    pub(crate) fn pad(self) -> u64 {
        match self {
            Flavour::Cuda => 0,
            Flavour::Npu => NPU_PAD,
        }
    }

    /// The environment variable that configures this allocator.
    pub fn env_var(self) -> &'static str {
        match self {
            Flavour::Cuda => "PYTORCH_CUDA_ALLOC_CONF",
            Flavour::Npu => "PYTORCH_NPU_ALLOC_CONF",
        }
    }

    /// The call that releases this allocator's cached memory, as a program writes it.
    pub fn empty_cache_call(self) -> &'static str {
        match self {
            Flavour::Cuda => "torch.cuda.empty_cache()",
            Flavour::Npu => "torch.npu.empty_cache()",
        }
    }
}

/// A PyTorch release, as far as it changes a decision (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major number (2).
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl Version {
    /// The release modelled where nothing says which made a recording: 2.11, the last whose
    /// rules every later one keeps unless its own settings, keys or actions show
    /// (docs/pytorch-model.md#versions).
    pub const CURRENT: Version = Version { major: 2, minor: 11 };
    /// The newest release whose rules are modelled.
    pub const NEWEST: Version = Version { major: 2, minor: 15 };
    /// 2.12: `throw_on_cudamalloc_oom`.
    pub const V2_12: Version = Version { major: 2, minor: 12 };
    /// 2.13: a capture is not a pool; exact-address allocations.
    pub const V2_13: Version = Version { major: 2, minor: 13 };
    /// 2.14: `annotate` entries, the pinned host allocator's segments in snapshots.
    pub const V2_14: Version = Version { major: 2, minor: 14 };
    /// 2.15: `expandable_segments_reserve`, `internal_metadata`.
    pub const V2_15: Version = Version { major: 2, minor: 15 };

    /// Parses `2.8`, `2.8.1`, `v2.8` or what `torch.__version__` says (`2.8.0+cu128`,
    /// `2.9.0a0+git1234`). A number with a leading zero (`2.015`) is no release's name.
    pub fn parse(text: &str) -> Result<Version> {
        let t = text.trim().trim_start_matches('v');
        let t = t.split_once('+').map_or(t, |(release, _local)| release);
        let mut parts = t.split('.');
        let bad = || {
            Error::usage(format!(
                "invalid PyTorch version {text}: expected MAJOR.MINOR, e.g. 2.8 (supported: 2.0 and newer)", text = quoted(text)))
        };
        let number = |p: &str| -> Option<u32> {
            let plain = !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p == "0" || !p.starts_with('0'));
            plain.then(|| p.parse().ok()).flatten()
        };
        let major = parts.next().and_then(number).ok_or_else(bad)?;
        let minor = parts.next().and_then(number).ok_or_else(bad)?;
        // A patch release, perhaps a pre-release of it (`0a0`, `1rc1`).
        if let Some(patch) = parts.next() {
            let digits = patch.bytes().take_while(u8::is_ascii_digit).count();
            let suffix_ok = patch[digits..].bytes().all(|b| b.is_ascii_alphanumeric());
            if digits == 0 || !suffix_ok || parts.next().is_some() {
                return Err(bad());
            }
        }
        let v = Version { major, minor };
        if v < (Version { major: 2, minor: 0 }) {
            return Err(bad());
        }
        if v > Version::NEWEST {
            // A version past the newest modelled has rules nobody has read yet: modelling it as
            // the newest under its name would be a guess presented as a fact.
            return Err(Error::usage(format!(
                "PyTorch {v} is newer than the newest modelled, {}: the modelled versions are \
                 2.0 to {}, whose rules differ at 2.5, 2.6, 2.8, 2.12, 2.13 and 2.15; give one of \
                 them, or leave the version out to model what the recording shows",
                Version::NEWEST,
                Version::NEWEST
            )));
        }
        Ok(v)
    }

    fn at_most(self, major: u32, minor: u32) -> bool {
        self <= Version { major, minor }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Which release a recording shows it was made by, and so which release's rules are modelled
/// (docs/pytorch-model.md#versions). Absence proves nothing: a recording with none of the
/// evidence is modelled as [`Version::CURRENT`] (2.11), whose rules 2.12+ keep unless their
/// own settings, keys or actions show (which are then the evidence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelledVersion {
    /// The release whose rules are modelled.
    pub version: Version,
    /// The least release the recording shows, where it shows one past [`Version::CURRENT`].
    pub at_least: Option<Version>,
    /// What shows it (a phrase), or why the version is what it is.
    pub why: Cow<'static, str>,
    /// The version was given (`--pytorch-version`, `version=` in a spec), not inferred.
    pub given: bool,
}

impl ModelledVersion {
    /// `version`, as asked for.
    pub(crate) fn given(version: Version) -> ModelledVersion {
        ModelledVersion { version, at_least: None, why: Cow::Borrowed("as asked"), given: true }
    }

    /// The release `trace` shows (the evidence named in docs/pytorch-model.md#versions):
    /// `internal_metadata` on an entry or `expandable_segments_reserve` in the settings string
    /// ⇒ 2.15; `host_segments` / `host_traces` or an `annotate` entry ⇒ 2.14;
    /// `max_round_threshold` / `max_cached_size` in `allocator_settings` or a `pinned_max_*`
    /// option ⇒ 2.13; `throw_on_cudamalloc_oom` or `pinned_free_catch_all` ⇒ 2.12. A recording
    /// of 2.13 or later is modelled as the newest release ([`Version::NEWEST`]), whose rules
    /// only its own settings change; one showing 2.12 and recording `allocator_settings`
    /// without the keys 2.13 adds is modelled as 2.12.
    pub fn of_trace(trace: &Trace) -> ModelledVersion {
        let x = &trace.extras;
        let conf = trace.allocator_settings.as_ref().and_then(|s| s.conf.as_deref());
        let names = |keys: &[&str]| -> Option<String> {
            let tokens = tokenize(conf?);
            keys.iter().find(|k| tokens.iter().any(|t| t == *k)).map(|k| k.to_string())
        };
        let settings_key = |keys: &[&str]| {
            keys.iter().find(|k| x.settings_keys.iter().any(|s| s == *k)).map(|k| k.to_string())
        };
        let found: Option<(Version, String)> = if x.internal_metadata > 0 {
            Some((Version::V2_15, "trace entries carry internal_metadata".into()))
        } else if let Some(k) =
            names(&["expandable_segments_reserve", "expandable_segments_reserve_by_class"])
        {
            Some((Version::V2_15, format!("the settings string names {k}")))
        } else if x.host_segments.is_some() || x.host_trace_entries.is_some() {
            Some((
                Version::V2_14,
                "the snapshot has the pinned host allocator's host_segments".into(),
            ))
        } else if x.annotate_entries > 0 {
            Some((Version::V2_14, "the trace has annotate entries".into()))
        } else if let Some(k) = settings_key(&["max_round_threshold", "max_cached_size"]) {
            Some((Version::V2_13, format!("allocator_settings has {k}")))
        } else if let Some(k) =
            names(&["pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"])
        {
            Some((Version::V2_13, format!("the settings string names {k}")))
        } else {
            names(&["throw_on_cudamalloc_oom", "pinned_free_catch_all"])
                .map(|k| (Version::V2_12, format!("the settings string names {k}")))
        };
        match found {
            None => ModelledVersion {
                version: Version::CURRENT,
                at_least: None,
                why: Cow::Borrowed(
                    "nothing in the recording shows a later release (absence proves nothing; \
                     --pytorch-version X.Y models another)",
                ),
                given: false,
            },
            Some((at_least, why)) => {
                // 2.13+ write max_round_threshold in allocator_settings: a recording that has
                // allocator_settings without it is from 2.12.
                let exactly_2_12 = at_least == Version::V2_12 && trace.allocator_settings.is_some();
                let version = if exactly_2_12 { Version::V2_12 } else { Version::NEWEST };
                ModelledVersion {
                    version,
                    at_least: Some(at_least),
                    why: Cow::Owned(why),
                    given: false,
                }
            }
        }
    }
}

/// `options` split at its top-level commas, not those inside a `[...]` list (a divisions list
/// `[256:1,>:8]` is one option): how specs and shown configurations are read item by item.
pub(crate) fn top_level_parts(options: &str) -> Vec<&str> {
    let (mut depth, mut start) = (0i32, 0usize);
    let mut parts = Vec::new();
    for (i, c) in options.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth <= 0 => {
                parts.push(&options[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&options[start..]);
    parts
}

/// A shown configuration: the allocator `settings`, with the release a spec asked for
/// (`version=X.Y`) after them, so that runs of several releases are told apart.
pub(crate) fn shown_with_version(settings: String, asked: Option<Version>) -> String {
    match asked {
        Some(v) => format!("{settings},version={v}"),
        None => settings,
    }
}

/// Splits fragsim's own `version=X.Y` out of a `pytorch` policy's options (docs/interface.md,
/// "PyTorch versions"): the rest of the options (empty: the recorded settings) and the version
/// asked for, if any.
pub fn split_version(options: &str) -> Result<(String, Option<Version>)> {
    let mut rest = Vec::new();
    let mut asked = None;
    for part in top_level_parts(options) {
        match part.trim().strip_prefix("version=") {
            Some(v) => {
                if asked.is_some() {
                    return Err(Error::usage(format!(
                        "version= is given twice in {options}: give it once",
                        options = quoted(options)
                    )));
                }
                asked = Some(Version::parse(v)?);
            }
            None => rest.push(part),
        }
    }
    let rest = rest.join(",");
    let rest = if rest.trim().is_empty() { String::new() } else { rest };
    Ok((rest, asked))
}

/// The release a `pytorch` replay of `trace` models: `asked` where given (an error where
/// `options` name an option that release does not have), else what the recording shows
/// ([`ModelledVersion::of_trace`]), raised to the least release that has every option
/// `options` names.
pub fn modelled_version(
    options: &str,
    asked: Option<Version>,
    trace: &Trace,
) -> Result<ModelledVersion> {
    let needed = Config::newest_option_release(options);
    if let Some(v) = asked {
        if let Some((least, key)) = needed.filter(|(least, _)| *least > v) {
            return Err(Error::usage(format!(
                "{key} is an option of PyTorch {least} and later; version={v} does not have it"
            )));
        }
        return Ok(ModelledVersion::given(v));
    }
    let mut m = ModelledVersion::of_trace(trace);
    if let Some((least, key)) = needed.filter(|(least, _)| *least > m.version) {
        m = ModelledVersion {
            version: least,
            at_least: Some(least),
            why: Cow::Owned(format!("the options name {key}")),
            given: false,
        };
    }
    Ok(m)
}

/// What a PyTorch release does with `expandable_segments:True` on the platform a recording
/// shows, where that is not what it does on CUDA (docs/pytorch-model.md#rocm).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlatformExpandable {
    /// ROCm before 2.12: `CUDAAllocatorConfig::expandable_segments()` warns once
    /// ("expandable_segments not supported on this platform") and answers false, so the
    /// allocator runs without expandable segments; the setting is no error.
    Ignored,
    /// ROCm from 2.12: expandable segments where PyTorch was built with ROCm 7 or later
    /// (`ROCM_VERSION >= 70000`; with an older ROCm, ignored as before), which a recording does
    /// not say.
    NeedsRocm7,
}

impl PlatformExpandable {
    /// How release `version` treats expandable segments on the platform `trace` shows; `None`
    /// where it treats them as on CUDA (CUDA, or no platform shown).
    pub fn of(trace: &Trace, version: Version) -> Option<PlatformExpandable> {
        trace.platform.filter(|p| p.is_rocm())?;
        Some(if version < Version::V2_12 {
            PlatformExpandable::Ignored
        } else {
            PlatformExpandable::NeedsRocm7
        })
    }

    /// Whether the spec `name:options` of the recording's own allocator (`pytorch`,
    /// `pytorch-expandable`) asks for expandable segments on `trace`: `pytorch-expandable`
    /// always, `pytorch` where its options, or the recorded settings it replays, set them.
    pub fn asked(name: &str, options: &str, trace: &Trace) -> bool {
        match name {
            "pytorch-expandable" => true,
            "pytorch" => {
                let Ok((rest, _)) = split_version(options) else { return false };
                let o = rest.trim();
                if o.is_empty() || o == "recorded" {
                    return trace
                        .allocator_settings
                        .as_ref()
                        .is_some_and(|s| s.expandable_segments);
                }
                let mut c = Config::default_for(Flavour::of_trace(trace));
                c.apply(o).is_ok() && c.expandable_segments
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for ModelledVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.version;
        match self.at_least {
            _ if self.given => write!(f, "modelled PyTorch {v} (as asked)"),
            None => write!(f, "modelled PyTorch {v}: {}", self.why),
            Some(least) if v == Version::V2_12 => write!(
                f,
                "PyTorch ≥ {least} ({}), and allocator_settings lacks max_round_threshold, which \
                 2.13+ write: modelled {v}",
                self.why
            ),
            Some(least) if least == v => write!(f, "modelled PyTorch {v} ({})", self.why),
            Some(least) => write!(
                f,
                "PyTorch ≥ {least} ({}); modelled {v}, the newest release modelled",
                self.why
            ),
        }
    }
}

/// How much virtual address space each expandable segment reserves
/// (`expandable_segments_reserve`, 2.15).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpandableReserve {
    /// A fraction of the device's total memory.
    Fraction(f64),
    /// A size in bytes (`8G`).
    Bytes(u64),
}

impl std::fmt::Display for ExpandableReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpandableReserve::Fraction(x) => write!(f, "{x}"),
            ExpandableReserve::Bytes(b) => write!(f, "{b}"),
        }
    }
}

/// `garbage_collection_threshold`'s value: strictly between 0 and 1.
fn parse_gc_threshold(value: &str, key: &str) -> Result<f64> {
    let v = stod(value, key)?;
    if v <= 0.0 {
        return Err(Error::usage(format!(
            "garbage_collection_threshold too small ({v}), set it 0.0~1.0"
        )));
    }
    if v >= 1.0 {
        return Err(Error::usage(format!(
            "garbage_collection_threshold too big ({v}), set it 0.0~1.0"
        )));
    }
    Ok(v)
}

/// `backend`: `native` (the caching allocator fragsim models); `cudaMallocAsync` is refused
/// as another allocator.
fn check_backend(v: &str) -> Result<()> {
    if v == "cudaMallocAsync" {
        return Err(Error::usage(
            "backend:cudaMallocAsync replaces the caching allocator; fragsim models the native allocator only",
        ));
    }
    if v != "native" {
        return Err(Error::usage(format!(
            "unknown allocator backend {v} (accepted: native, cudaMallocAsync)",
            v = quoted(v)
        )));
    }
    Ok(())
}

/// Reads an `expandable_segments_reserve` value: a size with a unit (`8G`, `512M`, `64K`,
/// `1T`, an optional `B` / `iB` after it; powers of 1024) or a plain number, which is a
/// fraction of total memory when it is at most 1 and a byte count above.
fn parse_reserve(text: &str, key: &str) -> Result<ExpandableReserve> {
    let bad = || {
        Error::usage(format!(
            "invalid value {text} for {key}: expected a fraction of device memory (e.g. 0.5) or a size (e.g. 8G)", text = quoted(text)))
    };
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let stem = lower.trim_end_matches("ib").trim_end_matches('b');
    let (digits, shift) = match stem.chars().last() {
        Some('k') => (&stem[..stem.len() - 1], 10),
        Some('m') => (&stem[..stem.len() - 1], 20),
        Some('g') => (&stem[..stem.len() - 1], 30),
        Some('t') => (&stem[..stem.len() - 1], 40),
        _ => (stem, 0),
    };
    let x: f64 = digits.parse().map_err(|_| bad())?;
    if !x.is_finite() || x <= 0.0 {
        return Err(bad());
    }
    if shift == 0 && x <= 1.0 {
        return Ok(ExpandableReserve::Fraction(x));
    }
    let bytes = x * (1u64 << shift) as f64;
    if bytes >= (1u64 << 60) as f64 {
        return Err(bad());
    }
    Ok(ExpandableReserve::Bytes(bytes as u64))
}

/// The allocator's effective settings. `Default` is PyTorch's defaults on current main.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Blocks at least this large are never split and only serve oversize requests
    /// (`max_split_size_mb`); `u64::MAX` means unlimited.
    pub max_split_size: u64,
    /// How much larger than the request an oversize cached block may be
    /// (`max_non_split_rounding_mb`).
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval (`roundup_power2_divisions`); 0 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; INTERVALS],
    /// `garbage_collection_threshold` (0 = off; needs a memory fraction).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`, as in effect.
    pub expandable_segments: bool,
    /// `expandable_segments:True` was set, but the recording's platform has no expandable
    /// segments under the release modelled (ROCm before 2.12: PyTorch warns "expandable_segments
    /// not supported on this platform" and allocates without them; docs/pytorch-model.md#rocm):
    /// [`Config::expandable_segments`] is off, and the settings string still says `True`, as the
    /// user set it and as PyTorch's own `allocator_settings` record it beside the flag in effect.
    pub expandable_unsupported: bool,
    /// Segment size for 1–10 MiB requests and large expandable page size (`large_segment_size_mb`).
    pub large_segment_size: u64,
    /// `per_process_memory_fraction` (`None`: not set).
    pub per_process_memory_fraction: Option<f64>,
    /// The device's total memory (`totalGlobalMem`): the base of the memory fraction and of the
    /// expandable reservation (9/8 of it). Not in a snapshot; default 80 GiB (an H100/A100-80GB).
    pub gpu_memory: u64,
    /// The PyTorch version whose behaviour is modelled.
    pub version: Version,
    /// Whether, with `expandable_segments` on, a private pool's mallocs get expandable segments
    /// of their own, as a recording showed it (`Config::expandable_in_private_pools`); `None`:
    /// as [`Config::version`] has it.
    pub private_pools_expandable: Option<bool>,
    /// Private pools whose `torch.cuda.MemPool` has an allocator of its own, as a recording
    /// showed them: current main gives such a pool no expandable segments
    /// (`is_expandable_segments_active` is false for it), so its new memory is segments from its
    /// allocator and its blocks split as cudaMalloc blocks do, while other pools map pages.
    pub own_allocator_pools: Vec<(u64, u64)>,
    /// Options accepted but without effect on placement, kept for display (`key:value`).
    pub other: Vec<String>,
    /// Whose allocator: CUDA's or torch_npu's ([`Flavour`]).
    pub flavour: Flavour,
    /// torch_npu's `base_addr_aligned_kb` in bytes (default 16 KiB; 0 = off): with expandable
    /// segments, a block of 2 MiB or more starts at a multiple of it
    /// (docs/pytorch-model.md#npu-alignment). Always 0 for CUDA.
    pub base_addr_aligned: u64,
    /// torch_npu's `segment_size_mb` in bytes (0: not set): the large pool's expandable page
    /// size. Unlike CUDA's `large_segment_size_mb` it changes nothing else.
    pub npu_segment_size: u64,
    /// torch_npu's `page_size:1g`: the large pool gets 1 GiB pages (segments rounded up to
    /// 1 GiB, or 1 GiB expandable pages).
    pub page_size_1g: bool,
    /// `throw_on_cudamalloc_oom` (2.12+): with a memory fraction below 1, a request past its
    /// limit fails at once, without releasing cached memory first
    /// (docs/pytorch-model.md#throw-on-oom).
    pub throw_on_cudamalloc_oom: bool,
    /// `expandable_segments_reserve` (2.15+): each expandable segment's reservation
    /// (docs/pytorch-model.md#expandable-reserve); `None`: 9/8 of the device's memory.
    pub expandable_segments_reserve: Option<ExpandableReserve>,
    /// `expandable_segments_reserve_by_class` was set: a stream's class is not recorded, so
    /// the per-class reservations are unknown and the global one is modelled for every stream.
    pub reserve_by_class: bool,
    /// Private pools `(0, n)` that the recording's stacks show were `torch.cuda.use_mem_pool`
    /// pools, not graph captures (docs/pytorch-model.md#capture-not-pool): from 2.13 a malloc
    /// into one behaves as a default-pool malloc for the capture gates. A pool whose first
    /// number is non-zero is a graph capture's; a `(0, n)` pool the stacks do not show is taken
    /// to be a graph's (`graph_pool_handle()`), as before 2.13.
    pub mem_pools: Vec<(u64, u64)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            expandable_unsupported: false,
            large_segment_size: LARGE_BUFFER,
            per_process_memory_fraction: None,
            gpu_memory: 80 << 30,
            version: Version::CURRENT,
            private_pools_expandable: None,
            own_allocator_pools: Vec::new(),
            other: Vec::new(),
            flavour: Flavour::Cuda,
            base_addr_aligned: 0,
            npu_segment_size: 0,
            page_size_1g: false,
            throw_on_cudamalloc_oom: false,
            expandable_segments_reserve: None,
            reserve_by_class: false,
            mem_pools: Vec::new(),
        }
    }
}

impl Config {
    /// torch_npu's defaults (`PYTORCH_NPU_ALLOC_CONF` unset), on a GPU-sized device of 64 GiB
    /// (an Ascend 910B's HBM) until the replay names one.
    pub(crate) fn npu() -> Config {
        Config {
            flavour: Flavour::Npu,
            base_addr_aligned: NPU_ALIGN_ROUND_LARGE,
            gpu_memory: 64 << 30,
            ..Config::default()
        }
    }

    /// The defaults of `flavour`'s allocator.
    pub(crate) fn default_for(flavour: Flavour) -> Config {
        match flavour {
            Flavour::Cuda => Config::default(),
            Flavour::Npu => Config::npu(),
        }
    }

    /// Bytes added to every request before rounding: 32 for torch_npu, none for CUDA.
    #[inline]
    pub(crate) fn pad(&self) -> u64 {
        self.flavour.pad()
    }

    /// Whether torch_npu's base-address alignment applies to a request rounded to `rounded`:
    /// expandable segments on, `rounded` at least 2 MiB (`kRoundLarge`), and alignment not off.
    #[inline]
    pub(crate) fn aligns_base(&self, rounded: u64) -> bool {
        self.base_addr_aligned != 0 && self.expandable_segments && rounded >= ROUND_LARGE
    }
}

/// Splits a settings string into PyTorch's tokens: whitespace dropped, `, : [ ]` on their own.
fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() {
            continue;
        }
        if matches!(c, ',' | ':' | '[' | ']') {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            out.push(c.to_string());
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Reads an unsigned integer like C++ `stoull`: optional sign, then the longest digit prefix;
/// a minus sign wraps (`-1` is 2^64 − 1).
fn stoull(text: &str, key: &str) -> Result<u64> {
    let (neg, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(Error::usage(format!(
            "invalid value {text} for {key}: expected an integer",
            text = quoted(text)
        )));
    }
    // `stoull` throws `out_of_range` above 2^64 − 1 (either sign), and PyTorch with it.
    let v: u64 = rest[..digits].parse().map_err(|_| {
        Error::usage(format!(
            "invalid value {text} for {key}: out of range (PyTorch reads it with stoull, which refuses a number above 18446744073709551615)", text = quoted(text)))
    })?;
    Ok(if neg { v.wrapping_neg() } else { v })
}

/// Reads a floating-point number like C++ `stod`: the longest numeric prefix.
fn stod(text: &str, key: &str) -> Result<f64> {
    let end = (1..=text.len())
        .rev()
        .find(|&n| text.is_char_boundary(n) && text[..n].parse::<f64>().is_ok())
        .ok_or_else(|| {
            Error::usage(format!(
                "invalid value {text} for {key}: expected a number",
                text = quoted(text)
            ))
        })?;
    let v = text[..end].parse::<f64>().map_err(|_| {
        Error::usage(format!("invalid value {text} for {key}", text = quoted(text)))
    })?;
    // `stod` throws `out_of_range` where the number overflows a double.
    if !v.is_finite() {
        return Err(Error::usage(format!(
            "invalid value {text} for {key}: out of range (PyTorch reads it with stod, which refuses a number beyond a double)", text = quoted(text))));
    }
    Ok(v)
}

/// A cursor over the tokens of one settings string.
struct Tokens<'a> {
    tokens: &'a [String],
    i: usize,
    strict: bool,
}

impl Tokens<'_> {
    /// The value token after `key` (skipping the `:` separator, which current main does not check).
    fn value(&mut self, key: &str) -> Result<&str> {
        self.separator(":", key)?;
        let v = self
            .tokens
            .get(self.i)
            .ok_or_else(|| Error::usage(format!("expecting a value for {key}")))?;
        self.i += 1;
        Ok(v)
    }

    /// Skips the separator `sep`; older parsers (`strict`) insist on it.
    fn separator(&mut self, sep: &str, key: &str) -> Result<()> {
        match self.tokens.get(self.i) {
            Some(t) if t == sep => {}
            Some(t) if self.strict => {
                return Err(Error::usage(format!(
                    "expected '{sep}' after {key}, found {t}",
                    t = quoted(t)
                )))
            }
            None if self.strict => {
                return Err(Error::usage(format!("expected '{sep}' after {key}")))
            }
            _ => {}
        }
        self.i += 1;
        Ok(())
    }

    /// Skips the value of an option this parser does not know: `:` and one token, or a
    /// bracketed list.
    fn skip_value(&mut self) {
        if self.tokens.get(self.i).is_some_and(|t| t == ":") {
            self.i += 1;
        }
        if self.tokens.get(self.i).is_some_and(|t| t == "[") {
            while self.tokens.get(self.i).is_some_and(|t| t != "]") {
                self.i += 1;
            }
        }
        self.i += 1;
    }

    fn boolean(&mut self, key: &str) -> Result<bool> {
        match self.value(key)? {
            "True" => Ok(true),
            "False" => Ok(false),
            v => Err(Error::usage(format!(
                "expected a single True/False argument for {key}, found {v}",
                v = quoted(v)
            ))),
        }
    }
}

/// The keys torch_npu accepts, for the unknown-key message.
const NPU_KEYS: &str = "max_split_size_mb, garbage_collection_threshold, expandable_segments, \
pinned_mem_register, base_addr_aligned_kb, page_size, segment_size_mb, roundup_power2_divisions";

/// The keys PyTorch accepts, for the unknown-key message.
const KEYS: &str = "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, \
garbage_collection_threshold, expandable_segments, large_segment_size_mb, \
per_process_memory_fraction, release_lock_on_cudamalloc, backend, \
graph_capture_record_stream_reuse, throw_on_cudamalloc_oom, pinned_use_cuda_host_register, \
pinned_num_register_threads, pinned_use_background_threads, pinned_reserve_segment_size_mb";

impl Config {
    /// Refuses a spec that names an option twice (`max_split_size_mb:64,max_split_size_mb:128`):
    /// PyTorch applies each in turn, but a spec a user writes is a row's label, which would show
    /// both while one value is replayed. Recorded settings are parsed as PyTorch parses them.
    pub(crate) fn refuse_repeated_options(text: &str) -> Result<()> {
        let tokens = tokenize(text);
        let mut depth = 0usize;
        let mut seen: Vec<&str> = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            match t.as_str() {
                "[" => depth += 1,
                "]" => depth = depth.saturating_sub(1),
                "," | ":" => {}
                key if depth == 0 && (i == 0 || tokens[i - 1] == ",") => {
                    if seen.contains(&key) {
                        return Err(Error::usage(format!(
                            "option {key} is given twice in {text}: give each option once",
                            text = quoted(text)
                        )));
                    }
                    seen.push(key);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string on top of PyTorch's defaults for `version`.
    pub fn parse(text: &str, version: Version) -> Result<Config> {
        let mut c = Config { version, ..Config::default() };
        c.apply(text)?;
        Ok(c)
    }

    /// Re-parses `text` as `_set_allocator_settings` does: `max_split_size`, divisions and the GC
    /// threshold reset to their defaults, `max_non_split_rounding` to the large segment size;
    /// every other option keeps its value unless named.
    pub(crate) fn apply(&mut self, text: &str) -> Result<()> {
        self.apply_skipping(text, None)
    }

    /// [`Config::apply`]; with `skipped`, an option this parser does not know is left out (and
    /// named there) instead of refused.
    fn apply_skipping(&mut self, text: &str, mut skipped: Option<&mut Vec<String>>) -> Result<()> {
        if self.flavour == Flavour::Npu {
            return self.apply_npu(text, skipped);
        }
        let tokens = tokenize(text);
        self.max_split_size = u64::MAX;
        self.roundup_power2_divisions = [0; INTERVALS];
        self.garbage_collection_threshold = 0.0;
        let old = self.version.at_most(2, 8);
        // large_segment_size_mb is parsed first: other limits depend on it.
        if !old {
            if let Some(p) = tokens.iter().position(|t| t == "large_segment_size_mb") {
                let mut t = Tokens { tokens: &tokens, i: p + 1, strict: false };
                let mb = stoull(t.value("large_segment_size_mb")?, "large_segment_size_mb")?;
                if mb <= 10 {
                    return Err(Error::usage(format!(
                        "large_segment_size_mb too small ({mb}), must be > 10"
                    )));
                }
                self.large_segment_size = mb.min(u64::MAX / MIB) * MIB;
            }
        }
        self.max_non_split_rounding = self.large_segment_size;
        let mut t = Tokens { tokens: &tokens, i: 0, strict: old };
        while t.i < tokens.len() {
            let key = tokens[t.i].clone();
            t.i += 1;
            if !self.apply_option(&key, &mut t, old)? {
                match skipped.as_deref_mut() {
                    Some(names) => {
                        names.push(key.clone());
                        t.skip_value();
                    }
                    None => return Err(unknown(&key, self.version)),
                }
            }
            if t.i < tokens.len() {
                t.separator(",", &key)?;
            }
        }
        Ok(())
    }

    /// Reads the value of option `key` from `t` (just past the key) into this config, as
    /// PyTorch's parser (`old`: 2.8 or earlier, with its stricter syntax) reads it; false for
    /// an option this release does not know, its value left unread.
    fn apply_option(&mut self, key: &str, t: &mut Tokens, old: bool) -> Result<bool> {
        match key {
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                self.parse_split_limit(key, t, old)?
            }
            "roundup_power2_divisions" => self.parse_divisions(t)?,
            "garbage_collection_threshold" => {
                self.garbage_collection_threshold = parse_gc_threshold(t.value(key)?, key)?;
            }
            "expandable_segments" => self.expandable_segments = t.boolean(key)?,
            "large_segment_size_mb" if !old => {
                t.value(key)?; // parsed first
            }
            "per_process_memory_fraction" if self.version >= (Version { major: 2, minor: 9 }) => {
                let v = stod(t.value(key)?, key)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(Error::usage(format!(
                        "per_process_memory_fraction is invalid ({v}), set it in [0.0, 1.0]"
                    )));
                }
                self.per_process_memory_fraction = Some(v);
            }
            "release_lock_on_cudamalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_use_background_threads"
            | "graph_capture_record_stream_reuse"
            | "pinned_free_catch_all"
            | "throw_on_cudamalloc_oom" => {
                let v = t.boolean(key)?;
                if key == "throw_on_cudamalloc_oom" {
                    self.throw_on_cudamalloc_oom = v;
                }
                self.note_other(key, if v { "True" } else { "False" });
            }
            "expandable_segments_reserve" => {
                let v = parse_reserve(t.value(key)?, key)?;
                self.expandable_segments_reserve = Some(v);
                self.note_other(key, &v.to_string());
            }
            "expandable_segments_reserve_by_class" => self.parse_reserve_by_class(t, key)?,
            "pinned_num_register_threads"
            | "pinned_reserve_segment_size_mb"
            | "pinned_max_round_threshold_mb"
            | "pinned_max_cached_size_mb" => {
                let v = stoull(t.value(key)?, key)?;
                self.note_other(key, &v.to_string());
            }
            "backend" => check_backend(t.value(key)?)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `max_split_size_mb` or (2.6 on) `max_non_split_rounding_mb`: megabytes no smaller than a
    /// large segment (no smaller or equal, up to 2.8).
    fn parse_split_limit(&mut self, key: &str, t: &mut Tokens, old: bool) -> Result<()> {
        if key == "max_non_split_rounding_mb" && self.version < (Version { major: 2, minor: 6 }) {
            return Err(unknown(key, self.version));
        }
        let mb = stoull(t.value(key)?, key)?;
        let min_mb = self.large_segment_size / MIB;
        if old && mb <= min_mb {
            return Err(Error::usage(format!(
                "CachingAllocator option {key} too small, must be > {min_mb}"
            )));
        }
        if !old && mb < min_mb {
            return Err(Error::usage(format!(
                "CachingAllocator option {key} too small, must be >= {min_mb}"
            )));
        }
        let bytes = mb.min(u64::MAX / MIB) * MIB;
        if key == "max_split_size_mb" {
            self.max_split_size = bytes;
        } else {
            self.max_non_split_rounding = bytes;
        }
        Ok(())
    }

    /// `expandable_segments_reserve_by_class:[class:value,...]`: each value read as the global
    /// one is, the classes kept only for display (a stream's class is not recorded).
    fn parse_reserve_by_class(&mut self, t: &mut Tokens, key: &str) -> Result<()> {
        t.separator(":", key)?;
        let mut shown = Vec::new();
        if t.tokens.get(t.i).map(String::as_str) == Some("[") {
            t.i += 1;
            while let Some(class) = t.tokens.get(t.i).cloned() {
                t.i += 1;
                if class == "]" {
                    break;
                }
                if class == "," {
                    continue;
                }
                let v = parse_reserve(t.value(key)?, key)?;
                shown.push(format!("{class}:{v}"));
            }
        } else {
            let v = t.value(key)?.to_string();
            shown.push(v);
        }
        self.reserve_by_class = true;
        self.note_other(key, &format!("[{}]", shown.join(",")));
        Ok(())
    }

    /// Parses a configuration as [`Policy::config`](crate::policy::Policy::config) shows it:
    /// torch_npu's when it names an option only torch_npu has (its strings always do), else
    /// CUDA's on current main.
    /// A `version=X.Y` the configuration shows (a release asked for) is the release parsed.
    pub(crate) fn parse_shown(text: &str) -> Result<Config> {
        let (text, asked) = split_version(text)?;
        if names_npu_option(&text) {
            Config::parse_npu(&text)
        } else {
            Config::parse(&text, asked.unwrap_or(Version::CURRENT))
        }
    }

    /// Parses a `PYTORCH_NPU_ALLOC_CONF` string on top of torch_npu's defaults.
    pub fn parse_npu(text: &str) -> Result<Config> {
        let mut c = Config::npu();
        c.apply(text)?;
        Ok(c)
    }

    /// [`Config::apply_skipping`] for torch_npu (`NPUAllocatorConfig.cpp`, `parseArgs`): its own
    /// keys, its own limits, and its rule that expandable segments exclude `max_split_size_mb`
    /// and `garbage_collection_threshold` (docs/pytorch-model.md#npu-conf).
    fn apply_npu(&mut self, text: &str, mut skipped: Option<&mut Vec<String>>) -> Result<()> {
        let tokens = tokenize(text);
        self.max_split_size = u64::MAX;
        self.roundup_power2_divisions = [0; INTERVALS];
        self.garbage_collection_threshold = 0.0;
        self.max_non_split_rounding = LARGE_BUFFER;
        self.large_segment_size = LARGE_BUFFER;
        // torch_npu checks every separator (`consumeToken`).
        let mut t = Tokens { tokens: &tokens, i: 0, strict: true };
        let digits = |v: &str, key: &str| -> Result<u64> {
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(Error::usage(format!(
                    "CachingAllocator option {key} is invalid ({v})",
                    v = quoted(v)
                )));
            }
            v.parse::<u64>().map_err(|_| {
                Error::usage(format!(
                    "CachingAllocator option {key} is out of range ({v})",
                    v = quoted(v)
                ))
            })
        };
        while t.i < tokens.len() {
            let key = tokens[t.i].clone();
            t.i += 1;
            match key.as_str() {
                "max_split_size_mb" => {
                    let mb = digits(t.value(&key)?, &key)?;
                    let min_mb = LARGE_BUFFER / MIB;
                    if mb <= min_mb {
                        return Err(Error::usage(format!(
                            "CachingAllocator option max_split_size_mb too small, must be > {min_mb}"
                        )));
                    }
                    self.max_split_size = mb.min(u64::MAX / MIB) * MIB;
                }
                "garbage_collection_threshold" => {
                    let v = stod(t.value(&key)?, &key)?;
                    if v <= 0.0 || v >= 1.0 {
                        return Err(Error::usage(format!(
                            "garbage_collection_threshold must be between 0.0 and 1.0 (got {v})"
                        )));
                    }
                    self.garbage_collection_threshold = v;
                }
                "expandable_segments" => self.expandable_segments = t.boolean(&key)?,
                "pinned_mem_register" => {
                    let v = t.boolean(&key)?;
                    self.note_other(&key, if v { "True" } else { "False" });
                }
                "base_addr_aligned_kb" => {
                    let kb = digits(t.value(&key)?, &key)?;
                    if kb > NPU_ALIGN_ROUND_LARGE / 1024 {
                        return Err(Error::usage(format!(
                            "CachingAllocator option base_addr_aligned_kb error, must be [0~16] (got {kb})"
                        )));
                    }
                    self.base_addr_aligned = kb * 1024;
                }
                "page_size" => match t.value(&key)? {
                    "1g" => self.page_size_1g = true,
                    v => {
                        return Err(Error::usage(format!(
                            "Unsupported page_size value: {v} (accepted: 1g)"
                        )))
                    }
                },
                "segment_size_mb" => {
                    let mb = digits(t.value(&key)?, &key)?;
                    if !(20..=512).contains(&mb) {
                        return Err(Error::usage(format!(
                            "CachingAllocator option segment_size_mb error, must be [20, 512] (got {mb})"
                        )));
                    }
                    self.npu_segment_size = mb * MIB;
                }
                "roundup_power2_divisions" => self.parse_divisions(&mut t)?,
                _ => match skipped.as_deref_mut() {
                    Some(names) => {
                        names.push(key.clone());
                        t.skip_value();
                    }
                    None => {
                        return Err(Error::usage(format!(
                            "Unrecognized CachingAllocator option: {key} (accepted: {NPU_KEYS})"
                        )))
                    }
                },
            }
            if t.i < tokens.len() {
                t.separator(",", &key)?;
            }
        }
        // Expandable segments are off by default in current torch_npu, so on means named (now or
        // in an earlier settings string, which torch_npu also remembers).
        let limits = self.max_split_size != u64::MAX || self.garbage_collection_threshold != 0.0;
        if self.expandable_segments && limits {
            return Err(Error::usage(
                "`max_split_size_mb` or `garbage_collection_threshold`, cannot be enabled with \
                 `expandable_segments`, please set `expandable_segments` to `False`",
            ));
        }
        Ok(())
    }

    fn note_other(&mut self, key: &str, value: &str) {
        self.other.retain(|o| !o.starts_with(&format!("{key}:")));
        self.other.push(format!("{key}:{value}"));
    }

    /// `roundup_power2_divisions:N` or `roundup_power2_divisions:[K:V,...,>:V]`
    /// (docs/pytorch-model.md#divisions).
    fn parse_divisions(&mut self, t: &mut Tokens) -> Result<()> {
        const KEY: &str = "roundup_power2_divisions";
        t.separator(":", KEY)?;
        let first = t
            .tokens
            .get(t.i)
            .ok_or_else(|| Error::usage(format!("expecting a value for {KEY}")))?;
        if first != "[" {
            let v = stoull(first, KEY)?;
            t.i += 1;
            if !v.is_power_of_two() {
                return Err(Error::usage(format!(
                    "For roundups, the divisions has to be power of 2 (got {v} in {KEY})"
                )));
            }
            self.roundup_power2_divisions = [v; INTERVALS];
            return Ok(());
        }
        t.i += 1;
        let old = self.version.at_most(2, 8);
        let mut last = 0usize;
        let mut first_numeric = true;
        loop {
            let key = t
                .tokens
                .get(t.i)
                .ok_or_else(|| Error::usage(format!("unterminated list in {KEY}")))?
                .clone();
            t.i += 1;
            if key == "]" {
                break;
            }
            let value = stoull(t.value(KEY)?, KEY)?;
            if value != 0 && !value.is_power_of_two() {
                return Err(Error::usage(format!(
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup (got {value} in {KEY})"
                )));
            }
            if key == ">" {
                let from = if old { last } else { last + 1 };
                for slot in self.roundup_power2_divisions.iter_mut().skip(from) {
                    *slot = value;
                }
            } else {
                let interval = stoull(&key, KEY)?;
                if !interval.is_power_of_two() {
                    return Err(Error::usage(format!(
                        "For roundups, the intervals have to be power of 2 (got {interval} in {KEY})"
                    )));
                }
                let idx = (interval.ilog2() as usize).min(INTERVALS - 1);
                if first_numeric {
                    for slot in &mut self.roundup_power2_divisions[..idx] {
                        *slot = value;
                    }
                    first_numeric = false;
                }
                self.roundup_power2_divisions[idx] = value;
                last = idx;
            }
            match t.tokens.get(t.i).map(String::as_str) {
                Some(",") => t.i += 1,
                Some("]") => {}
                Some(other) if t.strict => {
                    return Err(Error::usage(format!(
                        "expected ',' or ']' in {KEY}, found {other}",
                        other = quoted(other)
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The settings a snapshot recorded: its settings string for the options it does not list
    /// separately, then its recorded values, which are what the allocator actually used. The
    /// PyTorch that recorded it accepted the string, so an option this parser does not know (a
    /// newer release's) is left out, not refused: [`Config::unmodelled_options_as`] names them.
    pub(crate) fn from_recorded(s: &AllocatorSettings, version: Version) -> Result<Config> {
        Config::from_recorded_as(s, version, Flavour::Cuda)
    }

    /// [`Config::from_recorded`] for `flavour`'s allocator (torch_npu's settings string is
    /// `PYTORCH_NPU_ALLOC_CONF`, parsed by its rules).
    pub(crate) fn from_recorded_as(
        s: &AllocatorSettings,
        version: Version,
        flavour: Flavour,
    ) -> Result<Config> {
        let mut c = Config { version, ..Config::default_for(flavour) };
        if let Some(conf) = s.conf.as_deref() {
            c.apply_skipping(conf, Some(&mut Vec::new())).map_err(|e| {
                let e =
                    Error::input(format!("the recorded {}: {}", flavour.env_var(), e.message()));
                match s.at {
                    Some(byte) => e.at(crate::error::Place::Byte(byte)),
                    None => e,
                }
            })?;
        }
        c.max_split_size = s.max_split_size.unwrap_or(u64::MAX);
        c.garbage_collection_threshold = s.garbage_collection_threshold;
        c.expandable_segments = s.expandable_segments;
        c.roundup_power2_divisions = s.roundup_power2_divisions;
        Ok(c)
    }

    /// The options of a recorded settings string that `flavour`'s parser does not know, which
    /// `Config::from_recorded` leaves out of the replay.
    pub fn unmodelled_options_as(s: &AllocatorSettings, flavour: Flavour) -> Vec<String> {
        let mut names = Vec::new();
        if let Some(conf) = s.conf.as_deref() {
            let mut scratch = Config::default_for(flavour);
            let _ = scratch.apply_skipping(conf, Some(&mut names));
        }
        names
    }

    /// The `allocator_settings` a snapshot of a run under this config records (for
    /// `--export-snapshot`), with the settings string that parses back to this config.
    pub fn to_recorded(&self) -> AllocatorSettings {
        AllocatorSettings {
            conf: Some(self.to_conf_string()),
            max_split_size: (self.max_split_size != u64::MAX).then_some(self.max_split_size),
            garbage_collection_threshold: self.garbage_collection_threshold,
            expandable_segments: self.expandable_segments,
            roundup_power2_divisions: self.roundup_power2_divisions,
            release_lock_on_cudamalloc: false,
            at: None,
        }
    }

    /// The effective settings in `PYTORCH_CUDA_ALLOC_CONF` syntax (parsing it gives this config,
    /// but for `expandable_segments:True` set where the platform ignores it, which it writes as
    /// set: [`Config::expandable_unsupported`]).
    pub(crate) fn to_conf_string(&self) -> String {
        let asked = self.expandable_segments || self.expandable_unsupported;
        let mut parts =
            vec![format!("expandable_segments:{}", if asked { "True" } else { "False" })];
        if self.flavour == Flavour::Npu {
            // Always written: it is torch_npu's alone, so the string says whose settings it holds.
            parts.push(format!("base_addr_aligned_kb:{}", self.base_addr_aligned / 1024));
            if self.npu_segment_size != 0 {
                parts.push(format!("segment_size_mb:{}", self.npu_segment_size / MIB));
            }
            if self.page_size_1g {
                parts.push("page_size:1g".into());
            }
        }
        if self.large_segment_size != LARGE_BUFFER {
            parts.push(format!("large_segment_size_mb:{}", self.large_segment_size / MIB));
        }
        if self.max_split_size != u64::MAX {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size / MIB));
        }
        if self.max_non_split_rounding != self.large_segment_size {
            parts.push(format!("max_non_split_rounding_mb:{}", self.max_non_split_rounding / MIB));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().any(|&v| v != 0) {
            if d.iter().all(|&v| v == d[0]) {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            } else {
                let list: Vec<String> =
                    d.iter().enumerate().map(|(i, v)| format!("{}:{v}", 1u64 << i)).collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if let Some(f) = self.per_process_memory_fraction {
            parts.push(format!("per_process_memory_fraction:{f}"));
        }
        parts.extend(self.other.iter().cloned());
        parts.join(",")
    }

    /// The divisions that apply to a request of `n` bytes (docs/pytorch-model.md#divisions: by the
    /// unrounded size).
    pub(crate) fn divisions_for(&self, n: u64) -> u64 {
        let idx = (n.max(1).ilog2() as i64 - 20).clamp(0, INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }

    /// `round_size`: the block size a request of `n` bytes asks for
    /// (docs/pytorch-model.md#rounding).
    pub fn round_size(&self, n: u64) -> u64 {
        // torch_npu pads first, and picks the divisions by the padded size.
        let n = n.saturating_add(self.pad());
        if n >= MIN_BLOCK_SIZE {
            let d = self.divisions_for(n);
            if d > 1 && n > MIN_BLOCK_SIZE.saturating_mul(d) {
                return roundup_power2_next_division(n, d);
            }
        }
        round_to_blocks(n)
    }

    /// `get_allocation_size`: the cudaMalloc size for a new segment serving `rounded`
    /// (docs/pytorch-model.md#segment-size).
    pub(crate) fn allocation_size(&self, rounded: u64) -> u64 {
        if self.page_size_1g && rounded > SMALL_SIZE {
            return rounded.div_ceil(NPU_EXTRA_LARGE_BUFFER).saturating_mul(NPU_EXTRA_LARGE_BUFFER);
        }
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            self.large_segment_size
        } else {
            rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
        }
    }

    /// The oversize tolerance: how much larger than an oversize request a cached block may be.
    pub(crate) fn tolerance(&self) -> u64 {
        if self.flavour == Flavour::Npu || self.version < (Version { major: 2, minor: 6 }) {
            LARGE_BUFFER
        } else {
            self.max_non_split_rounding
        }
    }

    /// `allowed_memory_maximum`: the memory-fraction limit, if one is set
    /// (docs/pytorch-model.md#memory-fraction).
    pub(crate) fn allowed_memory_maximum(&self) -> Option<u64> {
        let f = self.per_process_memory_fraction?;
        if f >= 1.0 && !self.version.at_most(2, 8) {
            return None;
        }
        Some((f * self.gpu_memory as f64) as u64)
    }

    /// The least GPU memory a run under these settings can have had if it reserved
    /// `peak_reserved` bytes at its peak: the memory fraction's limit (fraction × the GPU's
    /// memory, docs/pytorch-model.md#memory-fraction) let every reservation through, so the GPU had
    /// at least `peak_reserved` / fraction. `None` when no fraction limits the run.
    ///
    /// Why it matters: a snapshot does not record the GPU's memory, and the 80 GiB assumed
    /// without one is less than many cards have (141 GB, 192 GB, 288 GB). A recording made with a
    /// small fraction of such a card, replayed under 80 GiB, would fail below its own recorded
    /// peak. Capped at 2^48 bytes (a hostile fraction must not make a reservation size overflow).
    pub(crate) fn least_gpu_memory_for(&self, peak_reserved: u64) -> Option<u64> {
        const MOST: u64 = 1 << 48;
        let f = self.per_process_memory_fraction.filter(|f| *f > 0.0)?;
        self.allowed_memory_maximum()?;
        // As `allowed_memory_maximum` computes it: truncated to whole bytes.
        let allowed = |gpu: u64| (f * gpu as f64) as u64;
        let mut gpu = ((peak_reserved as f64 / f).ceil() as u64).max(peak_reserved).min(MOST);
        // Floating point may miss the least by a few bytes either way: step to it.
        for _ in 0..64 {
            if gpu >= MOST || allowed(gpu) >= peak_reserved {
                break;
            }
            gpu += 1;
        }
        for _ in 0..64 {
            if gpu == 0 || allowed(gpu - 1) < peak_reserved {
                break;
            }
            gpu -= 1;
        }
        Some(gpu)
    }

    /// Whether a malloc into a private pool (a CUDA graph's, or a `MemPool`'s) gets expandable
    /// segments of that pool's own. With `expandable_segments` on, PyTorch before ≈ 2.5 served
    /// private pools from cudaMalloc segments ("our checkpointing logic for private pools doesn't
    /// support the expandable_segments_ structure yet", `alloc_block`); PR #128068 (mid-2024)
    /// gave them expandable segments, one reservation per (stream, pool), as the default pools
    /// have. A recording shows which ([`Config::private_pools_expandable`]), and that wins over
    /// the version.
    pub(crate) fn expandable_in_private_pools(&self) -> bool {
        self.expandable_segments
            && self
                .private_pools_expandable
                .unwrap_or(self.version >= Version { major: 2, minor: 5 })
    }

    /// The expandable page size of a pool (docs/pytorch-model.md#expandable-va-size).
    pub(crate) fn page_size(&self, small: bool) -> u64 {
        if small {
            SMALL_BUFFER
        } else if self.page_size_1g {
            NPU_EXTRA_LARGE_BUFFER
        } else if self.npu_segment_size != 0 {
            self.npu_segment_size
        } else {
            self.large_segment_size
        }
    }

    /// The VA size of one expandable reservation in the given pool
    /// (docs/pytorch-model.md#expandable-va-size): PyTorch's `numSegments(totalGlobalMem +
    /// totalGlobalMem / 8)` pages, i.e. 9/8 of the GPU's memory (the `/ 8` rounds down) rounded up
    /// to whole pages.
    pub(crate) fn va_size(&self, small: bool) -> u64 {
        let page = self.page_size(small);
        let full = va_size_on(self.gpu_memory, page);
        match self.reserve_limit() {
            // Whole pages, at least one, never past the historical 9/8.
            Some(bytes) => bytes.div_ceil(page).max(1).saturating_mul(page).min(full),
            None => full,
        }
    }

    /// The bytes `expandable_segments_reserve` asks each reservation to hold (2.15+; `None`
    /// where it is not set or the modelled release has no such option).
    pub(crate) fn reserve_limit(&self) -> Option<u64> {
        if self.version < Version::V2_15 {
            return None;
        }
        Some(match self.expandable_segments_reserve? {
            ExpandableReserve::Fraction(f) => (f * self.gpu_memory as f64) as u64,
            ExpandableReserve::Bytes(b) => b,
        })
    }

    /// Whether a request past the memory fraction's limit fails at once
    /// (`throw_on_cudamalloc_oom`, 2.12+, with a fraction below 1).
    pub(crate) fn rejects_past_fraction(&self) -> bool {
        self.throw_on_cudamalloc_oom
            && self.version >= Version::V2_12
            && self.allowed_memory_maximum().is_some()
    }

    /// Whether a malloc into private pool `pool` (`None`: the default pools) runs as during a
    /// CUDA graph capture for the three capture gates (docs/pytorch-model.md#capture-not-pool):
    /// before 2.13 any private pool; from 2.13 only a graph capture's. Never a pool a profiler
    /// trace's addresses inferred, which is replayed as another stream of the default pools
    /// (docs/pytorch-model.md#kineto-addresses).
    pub(crate) fn pool_is_capture(&self, pool: Option<(u64, u64)>) -> bool {
        let Some(id) = pool else { return false };
        if id.0 == crate::trace::kineto_segments::INFERRED_POOL {
            return false;
        }
        self.version < Version::V2_13 || id.0 != 0 || !self.mem_pools.contains(&id)
    }

    /// The least release that has `key` (an option of 2.12+), if it is one.
    pub(crate) fn release_of_option(key: &str) -> Option<Version> {
        match key {
            "throw_on_cudamalloc_oom" | "pinned_free_catch_all" => Some(Version::V2_12),
            "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => Some(Version::V2_13),
            "expandable_segments_reserve" | "expandable_segments_reserve_by_class" => {
                Some(Version::V2_15)
            }
            _ => None,
        }
    }

    /// The newest release any option named in `conf` needs, with the option.
    pub(crate) fn newest_option_release(conf: &str) -> Option<(Version, String)> {
        tokenize(conf)
            .into_iter()
            .filter_map(|t| Config::release_of_option(&t).map(|v| (v, t)))
            .max_by_key(|(v, _)| *v)
    }
}

fn unknown(key: &str, version: Version) -> Error {
    if version.at_most(2, 8) {
        Error::usage(format!("Unrecognized CachingAllocator option: {key} (accepted: {KEYS})"))
    } else {
        Error::usage(format!(
            "Unrecognized key {key} in Accelerator allocator config. (accepted: {KEYS})",
            key = quoted(key)
        ))
    }
}

/// `roundup_power2_next_division`: `n` rounded up to the next of `d` steps of its power-of-two
/// interval.
pub(crate) fn roundup_power2_next_division(n: u64, d: u64) -> u64 {
    if n.is_power_of_two() {
        return n;
    }
    let floor = 1u64 << n.ilog2();
    let step = floor >> d.max(1).ilog2();
    if step == 0 {
        return floor << 1;
    }
    let lo = n & !(step - 1);
    if lo == n {
        n
    } else {
        lo + step
    }
}

/// The expandable reservation's VA size on a GPU of `gpu_memory` bytes with pages of `page`
/// bytes (docs/pytorch-model.md#expandable-va-size); at least one page. Saturating: `--capacity`
/// may be any u64, and the caller's range check refuses a reservation the address space cannot
/// hold.
pub(crate) fn va_size_on(gpu_memory: u64, page: u64) -> u64 {
    gpu_memory.saturating_add(gpu_memory / 8).div_ceil(page).max(1).saturating_mul(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ROCm has expandable segments from 2.12 (with ROCm 7+); before, PyTorch ignores the
    /// setting. A config whose expandable segments the platform ignores shows them as asked and
    /// records them as PyTorch does there: asked in the string, off in effect.
    #[test]
    fn rocm_has_expandable_segments_from_2_12_and_an_ignored_setting_shows_as_asked() {
        use crate::trace::Platform;
        let v2_11 = Version { major: 2, minor: 11 };
        let mut t = Trace::default();
        assert_eq!(PlatformExpandable::of(&t, v2_11), None, "no platform shown: CUDA's rules");
        t.platform = Some(Platform::CudaDeviceProperties);
        assert_eq!(PlatformExpandable::of(&t, v2_11), None);
        for p in [Platform::RocmDeviceType, Platform::RocmDeviceProperties] {
            t.platform = Some(p);
            assert_eq!(PlatformExpandable::of(&t, v2_11), Some(PlatformExpandable::Ignored));
            assert_eq!(
                PlatformExpandable::of(&t, Version::V2_12),
                Some(PlatformExpandable::NeedsRocm7)
            );
            assert_eq!(
                PlatformExpandable::of(&t, Version::NEWEST),
                Some(PlatformExpandable::NeedsRocm7)
            );
        }
        assert!(PlatformExpandable::asked("pytorch-expandable", "", &t));
        assert!(PlatformExpandable::asked("pytorch", "expandable_segments:True,version=2.11", &t));
        assert!(!PlatformExpandable::asked("pytorch", "", &t), "no recorded settings");
        assert!(!PlatformExpandable::asked("pytorch", "expandable_segments:False", &t));
        assert!(!PlatformExpandable::asked("pytorch-cuda", "expandable_segments:True", &t));
        let c = Config { expandable_unsupported: true, ..Config::default() };
        assert_eq!(c.to_conf_string(), "expandable_segments:True");
        let r = c.to_recorded();
        assert_eq!(
            (r.conf.as_deref(), r.expandable_segments),
            (Some("expandable_segments:True"), false)
        );
    }

    fn divisions(s: &str) -> [u64; INTERVALS] {
        Config::parse(&format!("roundup_power2_divisions:{s}"), Version::CURRENT)
            .unwrap()
            .roundup_power2_divisions
    }

    fn old(s: &str) -> [u64; INTERVALS] {
        Config::parse(&format!("roundup_power2_divisions:{s}"), Version { major: 2, minor: 8 })
            .unwrap()
            .roundup_power2_divisions
    }

    /// Builds a slot table from (value, count) runs, as docs/pytorch-model.md#divisions writes them
    /// (`1×9, 2, 8×6`).
    fn runs(r: &[(u64, usize)]) -> [u64; INTERVALS] {
        let v: Vec<u64> = r.iter().flat_map(|&(v, n)| std::iter::repeat_n(v, n)).collect();
        v.try_into().unwrap()
    }

    #[test]
    fn versions_are_read_as_torch_names_them_and_nothing_else() {
        let v = |t: &str| Version::parse(t).map(|v| v.to_string()).map_err(|e| e.to_string());
        for (text, want) in [
            ("2.8", "2.8"),
            ("v2.8", "2.8"),
            ("2.8.1", "2.8"),
            ("2.15.0+cu128", "2.15"),
            ("2.13.0a0+git1234", "2.13"),
            ("2.12.1rc1", "2.12"),
            ("2.0", "2.0"),
        ] {
            assert_eq!(v(text).as_deref(), Ok(want), "{text}");
        }
        for text in ["2.015", "02.8", "+2.8", "2.8.", "2.8.1.1", "2.8.x", "2", "2.-1", "", "2.16"] {
            assert!(v(text).is_err(), "{text} read as {:?}", v(text));
        }
    }

    #[test]
    fn the_least_gpu_memory_lets_the_recorded_peak_through_its_fraction() {
        let with = |conf: &str| Config::parse(conf, Version::CURRENT).unwrap();
        assert_eq!(with("").least_gpu_memory_for(1 << 30), None, "no fraction, no bound");
        assert_eq!(with("per_process_memory_fraction:1.0").least_gpu_memory_for(1 << 30), None);
        for (f, peak) in [(0.5, 1u64 << 30), (0.002, 590_558_003), (0.3, 1_000_000_007), (0.7, 3)] {
            let c = with(&format!("per_process_memory_fraction:{f}"));
            let least = c.least_gpu_memory_for(peak).unwrap();
            let allowed = |gpu| Config { gpu_memory: gpu, ..c.clone() }.allowed_memory_maximum();
            assert!(allowed(least).unwrap() >= peak, "{f}: {least} lets {peak} through");
            assert!(allowed(least - 1).unwrap() < peak, "{f}: {least} is the least");
        }
        // A hostile fraction cannot make the memory (and reservation sizes) overflow.
        let tiny = with("per_process_memory_fraction:0.0000000001");
        assert_eq!(tiny.least_gpu_memory_for(u64::MAX / 2), Some(1 << 48));
    }

    fn round(conf: &str, n: u64) -> u64 {
        Config::parse(&format!("roundup_power2_divisions:{conf}"), Version::CURRENT)
            .unwrap()
            .round_size(n)
    }

    #[test]
    fn round_size_vectors_r1_to_r18() {
        let c = Config::default();
        let l1 = "[256:1,512:2,>:8]";
        let l2 = "[64:8,128:2,256:4,512:2,1024:4,>:1]";
        let l3 = "[128:8,256:16,512:1,2048:8,>:2]";
        let cases: &[(&str, u64, u64)] = &[
            ("4", 1_200, 1_536),
            ("4", 300_000, 327_680),
            ("4", 4_194_304, 4_194_304),
            ("4", 5_242_881, 6_291_456),
            ("4", 9_961_472, 10_485_760),
            ("4", 1_153_433_600, 1_342_177_280),
            (l1, 314_572_801, 314_573_312),
            (l1, 629_145_600, 805_306_368),
            (l1, 1_258_291_200, 1_342_177_280),
            (l1, 42_949_672_961, 47_244_640_256),
            (l1, 107_374_182_400, 111_669_149_696),
            ("[>:4]", 1_572_865, 1_573_376),
            ("[>:4]", 3_145_729, 3_670_016),
            (l2, 34_603_013, 37_748_736),
            (l2, 209_715_200, 268_435_456),
            (l3, 1_610_612_737, 1_610_613_248),
            ("2", 62_914_560, 67_108_864),
            ("16", 8_000, 8_192),
        ];
        for (i, &(conf, n, want)) in cases.iter().enumerate() {
            assert_eq!(round(conf, n), want, "R{}: {conf} n={n}", i + 1);
        }
        assert_eq!(round(l1, 42_949_672_960), 42_949_672_960, "exactly 40 GiB stays");
        assert_eq!(roundup_power2_next_division(1_200, 4), 1_280, "the helper alone");
        // Segment sizes of the vectors (the "segment" column of
        // docs/pytorch-model.md#rounding-vectors).
        assert_eq!(c.allocation_size(1_536), 2 * MIB);
        assert_eq!(c.allocation_size(6_291_456), 20 * MIB);
        assert_eq!(c.allocation_size(10_485_760), 10 * MIB, "R5: exactly 10 MiB");
        assert_eq!(c.allocation_size(314_573_312), 302 * MIB);
        assert_eq!(c.allocation_size(37_748_736), 36 * MIB);
    }

    #[test]
    fn older_parser_fills_from_the_last_key() {
        let o = Version { major: 2, minor: 8 };
        let c = Config::parse("roundup_power2_divisions:[256:1,512:2,>:8]", o).unwrap();
        assert_eq!(c.round_size(629_145_600), 671_088_640, "R8 with the ≤ 2.8 parser");
        let c = Config::parse("roundup_power2_divisions:[>:4]", o).unwrap();
        assert_eq!(c.round_size(1_572_865), 1_835_008, "R12 with the ≤ 2.8 parser");
    }

    #[test]
    fn plain_rounding_and_pool_boundaries() {
        let c = Config::default();
        assert_eq!(c.round_size(1), 512);
        assert_eq!(c.round_size(512), 512);
        assert_eq!(c.round_size(513), 1024);
        assert_eq!(c.round_size(MIB), MIB, "exactly 1 MiB stays in the small pool");
        assert_eq!(c.allocation_size(MIB), 2 * MIB);
        assert_eq!(c.allocation_size(MIB + 512), 20 * MIB);
        assert_eq!(c.allocation_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(c.allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(c.allocation_size(10 * MIB + 1), 12 * MIB);
        let big = Config::parse("large_segment_size_mb:64", Version::CURRENT).unwrap();
        assert_eq!(big.allocation_size(5 * MIB), 64 * MIB);
        assert_eq!(big.tolerance(), 64 * MIB, "tolerance follows large_segment_size");
    }

    #[test]
    fn divisions_parse_vectors() {
        assert_eq!(divisions("[256:1,512:2,>:8]"), runs(&[(1, 9), (2, 1), (8, 6)]));
        assert_eq!(old("[256:1,512:2,>:8]"), runs(&[(1, 9), (8, 7)]));
        assert_eq!(divisions("[>:4]"), runs(&[(0, 1), (4, 15)]));
        assert_eq!(old("[>:4]"), runs(&[(4, 16)]));
        assert_eq!(divisions("[>:4,64:8,1024:2]"), runs(&[(8, 7), (4, 3), (2, 1), (4, 5)]));
        assert_eq!(divisions("[32:2]"), runs(&[(2, 6), (0, 10)]));
        let c = Config::parse(
            "roundup_power2_divisions:4,roundup_power2_divisions:[256:1]",
            Version::CURRENT,
        )
        .unwrap();
        assert_eq!(c.roundup_power2_divisions, runs(&[(1, 9), (4, 7)]));
        assert_eq!(
            divisions("[64:8,128:2,256:4,512:2,1024:4,>:1]"),
            runs(&[(8, 7), (2, 1), (4, 1), (2, 1), (4, 1), (1, 5)])
        );
        assert_eq!(
            divisions("[128:8,256:16,512:1,2048:8,>:2]"),
            runs(&[(8, 8), (16, 1), (1, 1), (0, 1), (8, 1), (2, 4)])
        );
    }

    #[test]
    fn divisions_errors_name_the_rule() {
        let err = |s: &str| {
            Config::parse(&format!("roundup_power2_divisions:{s}"), Version::CURRENT)
                .unwrap_err()
                .message()
                .to_string()
        };
        assert!(err("0").contains("For roundups, the divisions has to be power of 2"));
        assert!(err("3").contains("divisions has to be power of 2"));
        assert!(err("[3:4]").contains("For roundups, the intervals have to be power of 2"));
        assert!(err("[64:3]").contains("power of 2 or 0 to disable roundup"));
        assert_eq!(divisions("1"), [1; INTERVALS], "1 is accepted and means plain rounding");
        assert_eq!(round("1", 1_200), 1_536);
        assert_eq!(divisions("[64:0,>:2]")[6], 0, "0 is accepted in the list form");
    }

    #[test]
    fn max_split_limits_follow_the_version() {
        let cur = Config::parse("max_split_size_mb:20", Version::CURRENT).unwrap();
        assert_eq!(cur.max_split_size, 20 * MIB);
        let e = Config::parse("max_split_size_mb:20", Version { major: 2, minor: 8 }).unwrap_err();
        assert!(e.message().contains("max_split_size_mb too small, must be > 20"), "{e}");
        let e = Config::parse("max_split_size_mb:19", Version::CURRENT).unwrap_err();
        assert!(e.message().contains("max_split_size_mb"), "{e}");
        // stoull leniency: separators unchecked, a numeric prefix, and -1 wrapping.
        let c = Config::parse("max_split_size_mb,100", Version::CURRENT).unwrap();
        assert_eq!(c.max_split_size, 100 * MIB);
        let c = Config::parse("max_split_size_mb:20.5", Version::CURRENT).unwrap();
        assert_eq!(c.max_split_size, 20 * MIB);
        for huge in ["99999999999999999999", "-99999999999999999999"] {
            let e = Config::parse(&format!("max_split_size_mb:{huge}"), Version::CURRENT)
                .unwrap_err()
                .to_string();
            assert!(e.contains("out of range"), "{e}");
        }
        let e = Config::parse("garbage_collection_threshold:1e400", Version::CURRENT).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = Config::refuse_repeated_options("max_split_size_mb:64,max_split_size_mb:128")
            .unwrap_err()
            .to_string();
        assert!(Config::refuse_repeated_options("roundup_power2_divisions:[256:1,>:8]").is_ok());
        assert!(e.contains("max_split_size_mb is given twice"), "{e}");
        let c = Config::parse("max_split_size_mb:-1", Version::CURRENT).unwrap();
        assert_eq!(c.max_split_size, ((1u64 << 44) - 1) << 20, "2^64 - 2^20");
    }

    #[test]
    fn other_options_and_errors() {
        let c = Config::parse(
            " expandable_segments : True , garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
            Version::CURRENT,
        )
        .unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(c.allowed_memory_maximum(), Some(40 << 30));
        assert!(Config::parse("expandable_segments:true", Version::CURRENT).is_err());
        assert!(Config::parse("garbage_collection_threshold:1.0", Version::CURRENT).is_err());
        assert!(Config::parse("garbage_collection_threshold:0", Version::CURRENT).is_err());
        let e = Config::parse("max_spilt_size_mb:100", Version::CURRENT).unwrap_err();
        assert!(e.message().contains("Unrecognized key 'max_spilt_size_mb'"), "{e}");
        let e = Config::parse("foo:1", Version { major: 2, minor: 5 }).unwrap_err();
        assert!(e.message().contains("Unrecognized CachingAllocator option: foo"), "{e}");
        assert!(
            Config::parse("max_non_split_rounding_mb:40", Version { major: 2, minor: 5 }).is_err()
        );
        let one = Config::parse("per_process_memory_fraction:1.0", Version::CURRENT).unwrap();
        assert_eq!(one.allowed_memory_maximum(), None, "1.0 removes the limit on current main");
    }

    #[test]
    fn reparsing_resets_only_the_documented_options() {
        let mut c =
            Config::parse("max_split_size_mb:100,expandable_segments:True", Version::CURRENT)
                .unwrap();
        c.apply("garbage_collection_threshold:0.5").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert!(c.expandable_segments, "expandable persists");
    }

    #[test]
    fn conf_string_round_trips() {
        for s in [
            "max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8]",
            "expandable_segments:True,roundup_power2_divisions:4,max_non_split_rounding_mb:40",
            "",
        ] {
            let c = Config::parse(s, Version::CURRENT).unwrap();
            assert_eq!(Config::parse(&c.to_conf_string(), Version::CURRENT).unwrap(), c, "{s}");
        }
        assert_eq!(Config::default().to_conf_string(), "expandable_segments:False");
    }

    #[test]
    fn a_recorded_option_this_parser_does_not_know_is_left_out_and_named() {
        let recorded = AllocatorSettings {
            conf: Some(
                "max_split_size_mb:128,future_knob:3,future_list:[1:2,>:4],max_non_split_rounding_mb:40"
                    .into(),
            ),
            max_split_size: Some(128 * MIB),
            garbage_collection_threshold: 0.0,
            expandable_segments: true,
            roundup_power2_divisions: [0; INTERVALS],
            release_lock_on_cudamalloc: false,
            at: None,
        };
        let c = Config::from_recorded(&recorded, Version::CURRENT).unwrap();
        assert_eq!(c.max_split_size, 128 * MIB);
        assert_eq!(c.max_non_split_rounding, 40 * MIB, "the option after the skipped ones");
        assert_eq!(
            Config::unmodelled_options_as(&recorded, Flavour::Cuda),
            ["future_knob", "future_list"]
        );
        // Given by the user, the same string is refused, as PyTorch refuses it.
        assert!(Config::parse(recorded.conf.as_deref().unwrap(), Version::CURRENT).is_err());
    }

    #[test]
    fn recorded_settings_win_over_the_string_and_keep_its_other_options() {
        let mut divisions = [0; INTERVALS];
        divisions[3] = 4;
        let recorded = AllocatorSettings {
            conf: Some("max_split_size_mb:128,max_non_split_rounding_mb:40".into()),
            max_split_size: Some(64 * MIB),
            garbage_collection_threshold: 0.0,
            expandable_segments: true,
            roundup_power2_divisions: divisions,
            release_lock_on_cudamalloc: false,
            at: None,
        };
        let c = Config::from_recorded(&recorded, Version::CURRENT).unwrap();
        assert_eq!(c.max_split_size, 64 * MIB, "the recorded value, not the string's 128");
        assert_eq!(c.max_non_split_rounding, 40 * MIB, "only in the string");
        assert!(c.expandable_segments);
        assert_eq!(c.divisions_for(9 * MIB), 4);
        let unlimited = AllocatorSettings { conf: Some(String::new()), ..recorded };
        let c = Config::from_recorded(
            &AllocatorSettings { max_split_size: None, ..unlimited },
            Version::CURRENT,
        )
        .unwrap();
        assert_eq!(c.max_split_size, u64::MAX, "PyTorch records -1 for unlimited");
    }

    #[test]
    fn private_pools_get_expandable_segments_from_2_5_unless_the_recording_shows_otherwise() {
        let on = |minor| Config {
            expandable_segments: true,
            version: Version { major: 2, minor },
            ..Config::default()
        };
        assert!(!on(4).expandable_in_private_pools(), "cudaMalloc segments before #128068");
        assert!(on(5).expandable_in_private_pools());
        assert!(!Config { private_pools_expandable: Some(false), ..on(11) }
            .expandable_in_private_pools());
        assert!(
            Config { private_pools_expandable: Some(true), ..on(4) }.expandable_in_private_pools()
        );
        let off = Config { expandable_segments: false, ..on(11) };
        assert!(
            !Config { private_pools_expandable: Some(true), ..off }.expandable_in_private_pools()
        );
    }
}
