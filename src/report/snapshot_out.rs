//! `--export-snapshot`: a simulated run as a PyTorch memory snapshot, so the simulated allocator's
//! layout can be opened in the same viewers as a real recording (`torch.cuda._memory_viz`,
//! pytorch.org/memory_viz).
//!
//! The snapshot holds the replayed device's simulated events (policy addresses, recorded by the
//! engine when `ReplayOptions::record_events` is set), the policy's segments at the end of the
//! replay, and the input's `allocator_settings`; the wire format is
//! [`snapshot::write`] (docs/interface.md, `--export-snapshot`).

use crate::error::{Error, Result};
use crate::replay::ReplayOutput;
use crate::trace::{snapshot, DeviceTrace, Format, Trace};
use std::path::Path;

/// Writes `output`'s simulated events and segments for `device` as a snapshot pickle at `path`.
///
/// Device numbering follows the input: `device_traces` has an (empty) entry for every other
/// device of `trace`. Event times are the input's, or event indices when the input has none (the
/// viewer needs some `time_us`).
pub fn write_simulated(
    trace: &Trace,
    device: i32,
    output: &ReplayOutput,
    path: &Path,
) -> Result<()> {
    let sim = simulated_trace(trace, device, output)?;
    let mut bytes = Vec::new();
    snapshot::write(&sim, &mut bytes).map_err(|e| e.in_file(path))?;
    super::output::write_bytes(path, &bytes)
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
    let max = trace.devices.iter().map(|d| d.device).max().unwrap_or(device).max(device);
    let devices = (0..=max)
        .map(|d| DeviceTrace {
            device: d,
            events: if d == device { events.clone() } else { Vec::new() },
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
        // The simulated run's segment events do not say their pool; its segments do.
        entry_pools: None,
        torch_npu: false,
        extras: Default::default(),
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
