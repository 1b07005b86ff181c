//! What a session tells its user before replaying some specs: the facts about the recording that
//! change how its replays read (recorded by torch_npu, a profiler trace that starts warm, the
//! PyTorch version modelled, what a ROCm recording's platform does to expandable segments,
//! recorded allocator options this fragsim leaves out). The command
//! line prints them on stderr as `fragsim: note: ...`; the Python package hands them back as a
//! result's `notes`.

use super::Session;
use crate::policy::pytorch::config::{modelled_version, split_version};
use crate::policy::pytorch::{Config, Flavour, PlatformExpandable, Version};
use crate::policy::{has_allocator_settings, PolicySpec};
use crate::trace::Trace;
use crate::units::format_bytes;

impl Session {
    /// The notes a replay of `specs` on this trace warrants, each a line starting `note: `
    /// (none for specs without the allocator's settings).
    pub fn notes(&self, specs: &[PolicySpec]) -> Vec<String> {
        notes(self.trace(), specs)
    }
}

/// What to say when a file that could stream is loaded whole, because `planners` (the
/// policies that plan with every lifetime, [`crate::policy::planners`]) need all its events.
pub fn loaded_for_planners(planners: &[&str], name: &std::path::Path) -> String {
    format!(
        "{} plans with every lifetime: the events of {} are loaded (without it, the replay \
         streams them)",
        planners.join(", "),
        name.display()
    )
}

/// [`Session::notes`] of `trace`.
fn notes(trace: &Trace, specs: &[PolicySpec]) -> Vec<String> {
    let mut out = Vec::new();
    if !specs.iter().any(|s| has_allocator_settings(&s.name)) {
        return out;
    }
    let flavour = Flavour::of_trace(trace);
    let follows = |s: &PolicySpec| matches!(s.name.as_str(), "pytorch" | "pytorch-expandable");
    if flavour == Flavour::Npu && specs.iter().any(follows) {
        out.push(
            "note: recorded by torch_npu (Ascend NPU): pytorch replays torch_npu's allocator \
             rules (as pytorch-npu); -p pytorch-cuda replays CUDA's"
                .to_string(),
        );
    }
    if specs.iter().any(|s| follows(s) || s.name == "pytorch-cuda" || s.name == "pytorch-npu") {
        warm_start(trace, &mut out);
    }
    versions(trace, specs, &mut out);
    platform(trace, specs, &mut out);
    let Some(settings) = &trace.allocator_settings else { return out };
    let names = Config::unmodelled_options_as(settings, flavour);
    if !names.is_empty() {
        out.push(format!(
            "note: the recorded {} names option(s) this fragsim does not model, left out of the \
             pytorch replays: {}",
            flavour.env_var(),
            names.join(", ")
        ));
    }
    out
}

/// A profiler trace that starts with memory reserved beyond its live blocks, per device.
fn warm_start(trace: &Trace, out: &mut Vec<String>) {
    for d in trace.devices.iter().filter(|d| d.device >= 0) {
        let Some(k) = crate::recorded::kineto_start::start_state(trace, d.device) else {
            continue;
        };
        // The first event's own request may have made the segment beyond the live bytes: a
        // cold start whose Total Reserved, read after that event, looks warm.
        let first = d.events.first().filter(|e| e.action == crate::trace::Action::Alloc);
        // A small request makes a 2 MiB segment; a large one, its size in 2 MiB steps.
        use crate::policy::pytorch::config::{ROUND_LARGE, SMALL_BUFFER};
        let made = first.map_or(0, |e| {
            e.size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE).max(SMALL_BUFFER)
        });
        if k.reserved_bytes > k.live_bytes && k.reserved_bytes - k.live_bytes <= made {
            out.push(format!(
                "note: device {}: this profiler trace's first event leaves {} reserved, {} live \
                 before it: its first request ({}) may have made that segment (a cold start) or \
                 found it cached; the pytorch replays start with the difference cached as free \
                 segments whose sizes are assumed, which that request can take (each row's \
                 start_assumed; docs/pytorch-model.md#kineto-warm-start)",
                d.device,
                format_bytes(k.reserved_bytes),
                format_bytes(k.live_bytes),
                format_bytes(first.map_or(0, |e| e.size))
            ));
        } else if k.reserved_bytes > k.live_bytes {
            out.push(format!(
                "note: device {}: this profiler trace starts warm: {} reserved before its first \
                 event, {} of it live; the pytorch replays start with the rest cached as free \
                 segments whose sizes are assumed (the segments the trace's own requests make; \
                 with expandable segments, free mapped pages; each row's start_assumed; \
                 docs/pytorch-model.md#kineto-warm-start)",
                d.device,
                format_bytes(k.reserved_bytes),
                format_bytes(k.live_bytes)
            ));
        }
    }
}

/// What the platform the recording shows does to the expandable segments a spec of its own
/// allocator asks for (docs/pytorch-model.md#rocm): one line per release and reading, naming the
/// first spec, as [`versions`] groups them.
fn platform(trace: &Trace, specs: &[PolicySpec], out: &mut Vec<String>) {
    let Some(p) = trace.platform else { return };
    let lines = specs.iter().filter(|s| PlatformExpandable::asked(&s.name, &s.options, trace));
    let lines = lines.filter_map(|spec| {
        let (options, asked) = split_version(&spec.options).ok()?;
        let m = modelled_version(&options, asked, trace).ok()?;
        let rule = PlatformExpandable::of(trace, m.version)?;
        Some((platform_line(rule, m.version, p), spec.display()))
    });
    grouped(lines, out);
}

/// One note per reason (`(why, spec)` pairs, in order), naming the first spec it is given for
/// and counting the other specs.
fn grouped(lines: impl Iterator<Item = (String, String)>, out: &mut Vec<String>) {
    let mut seen: Vec<(String, String, usize)> = Vec::new();
    for (why, display) in lines {
        match seen.iter_mut().find(|(w, _, _)| *w == why) {
            Some((_, first, others)) => *others += usize::from(*first != display),
            None => seen.push((why, display, 0)),
        }
    }
    for (why, first, others) in seen {
        out.push(match others {
            0 => format!("note: {first}: {why}"),
            n => format!(
                "note: {first} and {n} other config{}: {why}",
                if n == 1 { "" } else { "s" }
            ),
        });
    }
}

/// The note on expandable segments asked for under release `v` on ROCm (`p` shows it).
fn platform_line(rule: PlatformExpandable, v: Version, p: crate::trace::Platform) -> String {
    match rule {
        PlatformExpandable::Ignored => format!(
            "recorded on ROCm ({}); PyTorch {v} on ROCm does not have expandable segments: it \
             warns \"expandable_segments not supported on this platform\" and allocates without \
             them, so this replays without them (2.12 added them for ROCm 7 and later: \
             --pytorch-version 2.12 models that)",
            p.why()
        ),
        PlatformExpandable::NeedsRocm7 => format!(
            "recorded on ROCm ({}); PyTorch {v} has expandable segments on ROCm only when built \
             with ROCm 7 or later (ROCM_VERSION >= 70000), which the recording does not say: \
             replayed with them; with an older ROCm, PyTorch ignores the setting (as -p pytorch \
             without it replays)",
            p.why()
        ),
    }
}

/// The PyTorch version each spec models, where the recording or the spec chose it: one line
/// per release and reason, naming the first spec (a sweep's grid under one release is one line).
fn versions(trace: &Trace, specs: &[PolicySpec], out: &mut Vec<String>) {
    let lines = specs.iter().filter(|s| has_allocator_settings(&s.name)).filter_map(|spec| {
        let (options, asked) = split_version(&spec.options).ok()?;
        let m = modelled_version(&options, asked, trace).ok()?;
        (m.at_least.is_some() || m.given).then(|| (m.to_string(), spec.display()))
    });
    grouped(lines, out);
}
