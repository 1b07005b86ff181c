//! `--export-snapshot`: a simulated run as a PyTorch memory snapshot, so the simulated allocator's
//! layout can be opened in the same viewers as a real recording (`torch.cuda._memory_viz`,
//! pytorch.org/memory_viz).
//!
//! The snapshot holds the replayed device's simulated events (policy addresses, recorded by the
//! engine when `ReplayOptions::record_events` is set), the policy's segments at the end of the
//! replay, and the policy's `allocator_settings`; the wire format is [`snapshot::write`]
//! (docs/interface.md, `--export-snapshot`).
//!
//! What the recording's entries carry beside their memory events and a reader uses goes with the
//! simulated events they became ([`ReplayOutput::log_origins`] tells which): each entry's pool
//! (`pool_id`), the `mallocWithAddress` tags of exact-address allocations (so `validate` of the
//! file places them and counts them apart, as it does the recording), the `annotate` labels (at
//! the simulated address of the allocation they label, so `blame --by annotation` groups alike)
//! and `internal_metadata` (the release evidence).

use crate::error::{Error, Result};
use crate::replay::{LogOrigin, ReplayOutput};
use crate::trace::{snapshot, Action, Annotation, DeviceTrace, Event, Format, PoolRef};
use crate::trace::{SnapshotExtras, Trace};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

/// Writes `output`'s simulated events and segments for `device` as a snapshot pickle at `path`;
/// returns what the file cannot show of the recording, one line each (notes for the user): a
/// release its evidence does not reach (`lost_release`), a ROCm platform (a snapshot records
/// none).
///
/// Device numbering follows the input: `device_traces` has an (empty) entry for every other
/// device of `trace`. Event times are the input's, or event indices when the input has none (the
/// viewer needs some `time_us`).
pub fn write_simulated(
    trace: &Trace,
    device: i32,
    output: &ReplayOutput,
    path: &Path,
) -> Result<Vec<String>> {
    let sim = simulated_trace(trace, device, output)?;
    let mut bytes = Vec::new();
    snapshot::write(&sim, &mut bytes).map_err(|e| e.in_file(path))?;
    super::output::write_bytes(path, &bytes)?;
    let platform =
        trace.platform_loss("snapshot").map(|l| format!("note: {}: {l}", path.display()));
    Ok(lost_release(trace, &sim, path).into_iter().chain(platform).collect())
}

/// Where the recording shows a later PyTorch release than the export can (its evidence is in
/// what the simulated run does not hold: the pinned host allocator's `host_segments`, the 2.13
/// keys of `allocator_settings`), what to tell the user who reads the file at `path`.
fn lost_release(trace: &Trace, sim: &Trace, path: &Path) -> Option<String> {
    use crate::policy::pytorch::config::ModelledVersion;
    let (shown, kept) = (ModelledVersion::of_trace(trace), ModelledVersion::of_trace(sim));
    (shown.version != kept.version).then(|| {
        format!(
            "note: {} shows no PyTorch release past {}: the recording's evidence of {} ({}) is \
             not part of the simulated run; give --pytorch-version {} to a command that replays it",
            path.display(),
            kept.version,
            shown.version,
            shown.why,
            shown.version
        )
    })
}

/// The simulated run as a trace in PyTorch's device numbering.
fn simulated_trace(trace: &Trace, device: i32, output: &ReplayOutput) -> Result<Trace> {
    let events = output.events.as_ref().ok_or_else(|| {
        Error::usage(
            "--export-snapshot needs the replay's events, but the replay did not record them (ReplayOptions::record_events)",
        )
    })?;
    if device < 0 {
        return Err(Error::usage(format!(
            "device {device} is host memory, which a CUDA memory snapshot cannot hold; pick a GPU with --device"
        )));
    }
    let origins =
        Origins { of: output.log_origins.as_deref().unwrap_or_default(), len: events.len() };
    let recorded = trace.device(device).map_or(&[][..], |d| &d.events);
    let mut events = events.clone();
    if trace.entry_pools.is_some() {
        pools_of_released(&mut events);
    }
    let extras = carried_extras(trace, device, recorded, &events, &origins);
    let max = trace.devices.iter().map(|d| d.device).max().unwrap_or(device).max(device);
    let devices = (0..=max)
        .map(|d| DeviceTrace {
            device: d,
            events: if d == device { std::mem::take(&mut events) } else { Vec::new() },
        })
        .collect();
    let segments = output
        .segments
        .iter()
        .cloned()
        .map(|mut s| {
            s.device = device;
            s
        })
        .collect();
    Ok(Trace {
        format: Format::PytorchSnapshot,
        converted_from: None,
        devices,
        frames: Default::default(),
        segments,
        allocator_settings: settings_of(trace, output),
        has_times: true,
        recorded_totals: Vec::new(),
        // Each simulated event names the pool its entry named (a segment's, the pool that
        // obtained it), in the input's table of pools.
        entry_pools: trace.entry_pools.clone(),
        torch_npu: false,
        extras,
        platform: None,
    })
}

/// The `allocator_settings` of the simulated run, as its policy declares them
/// ([`crate::policy::Policy::recorded_settings`]: the PyTorch policy's own effective settings,
/// not the input's), and none for policies that have no such settings. Expandable segments that
/// the recording's platform did not have under the release modelled are recorded as PyTorch
/// records them there: asked in the settings string, off in effect.
fn settings_of(trace: &Trace, output: &ReplayOutput) -> Option<crate::trace::AllocatorSettings> {
    use crate::policy::pytorch::config::{modelled_version, split_version, PlatformExpandable};
    let r = &output.result;
    let policy = crate::policy::lookup(&r.policy).ok()?;
    let mut settings = policy.recorded_settings(&r.config)?;
    let own = matches!(r.policy.as_str(), "pytorch" | "pytorch-expandable");
    let version = split_version(&r.config)
        .and_then(|(options, asked)| modelled_version(&options, asked, trace))
        .map(|m| m.version);
    if own
        && version
            .is_ok_and(|v| PlatformExpandable::of(trace, v) == Some(PlatformExpandable::Ignored))
    {
        settings.expandable_segments = false;
    }
    Some(settings)
}

/// Where each part of the simulated run's log came from ([`ReplayOutput::log_origins`]).
struct Origins<'a> {
    of: &'a [(LogOrigin, usize)],
    /// The log's length.
    len: usize,
}

impl Origins<'_> {
    /// The log's events from the `k`-th origin on, up to the next one's.
    fn range(&self, k: usize) -> Range<usize> {
        self.of[k].1..self.of.get(k + 1).map_or(self.len, |o| o.1)
    }

    /// The log's events for the input's event `index`, if it was replayed.
    fn of_event(&self, index: u64) -> Option<Range<usize>> {
        let k = self.first_at_or_after(index);
        (self.of.get(k)?.0 == LogOrigin::Event(index)).then(|| self.range(k))
    }

    /// The first origin that is the input's event `index` or a later one (the origins' length
    /// where none is).
    fn first_at_or_after(&self, index: u64) -> usize {
        self.of.partition_point(|o| match o.0 {
            LogOrigin::Start { .. } => true,
            LogOrigin::Event(i) => i < index,
        })
    }

    /// Where in the log the input's event `index` begins: what was written before it comes
    /// before that (the log's end where it was not replayed).
    fn before_event(&self, index: u64) -> usize {
        self.of.get(self.first_at_or_after(index)).map_or(self.len, |o| o.1)
    }

    /// The log's events for the block live at the start that the recording knows by `addr`.
    fn of_start(&self, addr: u64) -> Option<Range<usize>> {
        let k = self.of.iter().position(|o| o.0 == LogOrigin::Start { addr })?;
        Some(self.range(k))
    }
}

/// The first event of `action` among `log[range]`.
fn first_in(log: &[Event], range: Range<usize>, action: Action) -> Option<usize> {
    range.into_iter().find(|&i| log.get(i).is_some_and(|e| e.action == action))
}

/// Gives each release of memory the pool that obtained it: a segment is freed, and pages are
/// unmapped, while serving whatever request the policy was serving (the engine names that
/// request's pool), and PyTorch records the pool of the memory released.
fn pools_of_released(log: &mut [Event]) {
    let mut obtained: BTreeMap<u64, (u64, PoolRef)> = BTreeMap::new();
    for e in log.iter_mut() {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                obtained.insert(e.addr, (e.addr.saturating_add(e.size), e.pool));
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let holder =
                    obtained.range(..=e.addr).next_back().map(|(&a, &(end, p))| (a, end, p));
                if let Some((start, end, pool)) = holder.filter(|&(_, end, _)| e.addr < end) {
                    e.pool = pool;
                    if e.action == Action::SegmentFree && start == e.addr && end <= e.addr + e.size
                    {
                        obtained.remove(&start);
                    }
                }
            }
            _ => {}
        }
    }
}

/// What the recording's entries carried on `device` beside its memory events (`recorded`), on
/// the simulated events (`log`) they became: the exact-address tags, the labels and the release
/// evidence (`internal_metadata`). The pinned host allocator's records and the newer keys of
/// `allocator_settings` are not part of the simulated run ([`lost_release`]).
fn carried_extras(
    trace: &Trace,
    device: i32,
    recorded: &[Event],
    log: &[Event],
    origins: &Origins,
) -> SnapshotExtras {
    let x = &trace.extras;
    let marks: Vec<u64> = (x.malloc_with_address_events.iter())
        .filter(|&&(d, _)| d == device)
        .filter_map(|&(_, i)| tagged_counterpart(recorded, i as usize, log, origins))
        .map(|i| i as u64)
        .collect::<std::collections::BTreeSet<u64>>()
        .into_iter()
        .collect();
    let annotations = carried_annotations(trace, device, recorded, log, origins);
    SnapshotExtras {
        internal_metadata: if x.internal_metadata > 0 { log.len() as u64 } else { 0 },
        malloc_with_address: marks.len() as u64,
        malloc_with_address_events: marks.into_iter().map(|i| (device, i)).collect(),
        user_metadata: annotations.len() as u64,
        annotate_entries: annotations.len() as u64,
        annotations,
        ..SnapshotExtras::default()
    }
}

/// The simulated event for the recording's entry `i` that carried a `mallocWithAddress` tag: an
/// `alloc`'s own, or for a free of the prefix the simulated free entry of the same action (the
/// engine logs a block's `free_requested` and `free_completed` together, where the recording's
/// frees take effect).
fn tagged_counterpart(
    recorded: &[Event],
    i: usize,
    log: &[Event],
    origins: &Origins,
) -> Option<usize> {
    let e = recorded.get(i)?;
    match e.action {
        Action::Alloc => first_in(log, origins.of_event(i as u64)?, Action::Alloc),
        Action::FreeRequested | Action::FreeCompleted => {
            let frees = crate::trace::lifetimes::free_action(recorded);
            let at = (i..recorded.len())
                .find(|&j| recorded[j].action == frees && recorded[j].addr == e.addr)?;
            first_in(log, origins.of_event(at as u64)?, e.action)
        }
        _ => None,
    }
}

/// The recording's `annotate` labels on `device`, each on the simulated allocation it labels
/// (the last `alloc` at its address before it, or the block live at the start there), written
/// where the recording's entry stood among its events. A label whose allocation the run did not
/// serve (it ran out of memory) has nothing to label and is left out.
fn carried_annotations(
    trace: &Trace,
    device: i32,
    recorded: &[Event],
    log: &[Event],
    origins: &Origins,
) -> Vec<Annotation> {
    let mut notes: Vec<&Annotation> =
        trace.extras.annotations.iter().filter(|a| a.device == device).collect();
    notes.sort_by_key(|a| a.event);
    let mut last_alloc: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut next = 0;
    let mut out: Vec<Annotation> = Vec::new();
    for a in notes {
        let upto = (a.event as usize).min(recorded.len());
        while next < upto {
            if recorded[next].action == Action::Alloc {
                last_alloc.insert(recorded[next].addr, next);
            }
            next += 1;
        }
        let range = match last_alloc.get(&a.addr) {
            Some(&k) => origins.of_event(k as u64),
            None => origins.of_start(a.addr),
        };
        let Some(m) = range.and_then(|r| first_in(log, r, Action::Alloc)) else { continue };
        let event = origins.before_event(a.event) as u64;
        let entry = event + out.len() as u64;
        out.push(Annotation { device, entry, event, addr: log[m].addr, label: a.label.clone() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Action, Block, BlockState, Event, PoolKind, ReadOptions, Segment};

    fn output(events: Option<Vec<Event>>) -> ReplayOutput {
        ReplayOutput {
            events,
            segments: vec![Segment {
                device: 0,
                address: 0x10000,
                total_size: 2 << 20,
                stream: 0,
                pool: PoolKind::Small,
                is_expandable: false,
                private_pool: None,
                blocks: vec![
                    Block {
                        address: 0x10000,
                        size: 512,
                        requested_size: 100,
                        state: BlockState::ActiveAllocated,
                    },
                    Block {
                        address: 0x10200,
                        size: (2 << 20) - 512,
                        requested_size: 0,
                        state: BlockState::Inactive,
                    },
                ],
            }],
            ..ReplayOutput::default()
        }
    }

    #[test]
    fn exports_the_simulated_device_at_its_index() {
        let input = crate::trace::text::read(
            b"device 0\nalloc 0x5 100 s0\ndevice 2\nalloc 0x7 100 s0\n",
            &ReadOptions::default(),
        )
        .unwrap();
        let events = vec![
            Event::new(Action::SegmentAlloc, 0x10000, 2 << 20, 0, 0),
            Event::new(Action::Alloc, 0x10000, 100, 0, 0),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.pickle");
        write_simulated(&input, 2, &output(Some(events.clone())), &path).unwrap();
        let back = snapshot::read(&std::fs::read(&path).unwrap(), &ReadOptions::default()).unwrap();
        assert_eq!(back.devices.len(), 3);
        assert!(back.devices[0].events.is_empty() && back.devices[1].events.is_empty());
        assert_eq!(back.devices[2].events, events);
        assert_eq!(back.segments.len(), 1);
        assert_eq!(back.segments[0].device, 2);
        assert_eq!(back.segments[0].blocks[0].requested_size, 100);
    }

    /// A release names the pool that obtained the memory, not the one of the request the policy
    /// was serving when it released it.
    #[test]
    fn a_release_names_the_pool_that_obtained_the_memory() {
        let ev = |action, addr, size, pool| {
            let mut e = Event::new(action, addr, size, 0, 0);
            e.pool = PoolRef(pool);
            e
        };
        let mut log = vec![
            ev(Action::SegmentAlloc, 0x1000, 0x1000, 1),
            ev(Action::SegmentAlloc, 0x3000, 0x1000, 0),
            ev(Action::SegmentFree, 0x1000, 0x1000, 0),
            ev(Action::SegmentMap, 0x10000, 0x2000, 2),
            ev(Action::SegmentUnmap, 0x11000, 0x1000, 0),
            ev(Action::SegmentAlloc, 0x1000, 0x1000, 0),
            ev(Action::SegmentFree, 0x1000, 0x1000, 3),
        ];
        pools_of_released(&mut log);
        let pools: Vec<u16> = log.iter().map(|e| e.pool.0).collect();
        assert_eq!(pools, [1, 0, 1, 2, 2, 0, 0]);
    }

    /// The parts of a log by origin: the blocks live at the start, then each input event's.
    #[test]
    fn origins_name_each_input_events_part_of_the_log() {
        let of = [
            (LogOrigin::Start { addr: 0x50 }, 0),
            (LogOrigin::Event(0), 2),
            (LogOrigin::Event(1), 2),
            (LogOrigin::Event(3), 5),
        ];
        let o = Origins { of: &of, len: 7 };
        assert_eq!(o.of_start(0x50), Some(0..2));
        assert_eq!(
            (o.of_event(0), o.of_event(1), o.of_event(3)),
            (Some(2..2), Some(2..5), Some(5..7))
        );
        assert_eq!(o.of_event(2), None, "not handed to the policy");
        assert_eq!((o.before_event(2), o.before_event(3), o.before_event(9)), (5, 5, 7));
    }

    #[test]
    fn refuses_without_events_or_for_host_memory() {
        let input = Trace::default();
        let path = Path::new("/nonexistent/x.pickle");
        let e = write_simulated(&input, 0, &output(None), path).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Usage);
        let e = write_simulated(&input, -1, &output(Some(vec![])), path).unwrap_err();
        assert!(e.to_string().contains("host memory"), "{e}");
        let e = write_simulated(&input, 0, &output(Some(vec![])), path).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.pickle"), "{e}");
    }
}
