//! `replay --json`: one object per `docs/interface.md`; `report` writes the same object as
//! `results.json`.

#[cfg(feature = "charts")]
use super::bundle::ReportData;
use crate::error::{Error, Result};
use crate::metrics::PolicyResult;
use crate::recorded::{limit::DeviceLimit, RecordedRow};
use serde::Serialize;
use std::io::Write;

/// The object `replay --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport<'a> {
    /// The trace path as given.
    pub trace: String,
    /// The format it was read as.
    pub format: &'static str,
    /// The device replayed.
    pub device: i32,
    /// Events of that device.
    pub events: u64,
    /// One entry per policy.
    pub results: &'a [PolicyResult],
    /// The recorded run, written as the last entry of `results` (`"policy": "recorded"`,
    /// `null` for what the file cannot tell) when the trace carries the allocator's figures.
    #[serde(skip)]
    pub recorded: Option<RecordedRow>,
    /// The capacity the policies replayed under and where it came from (`capacity` key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityNote>,
}

/// The `capacity` key: what limit every policy replayed under, and what the recording says.
#[derive(Clone, Debug, Serialize)]
pub struct CapacityNote {
    /// The capacity in bytes; `null` for unlimited.
    pub bytes: Option<u64>,
    /// When inferred from the recording (no `--capacity`, or `--capacity recorded`): what was
    /// inferred and from which events; `null` when given or unlimited.
    pub inferred: Option<String>,
    /// The device limit inferred from the recording, with every flush classified and every
    /// `oom` entry; `null` when the trace records no allocator figures.
    pub limit: Option<DeviceLimit>,
}

impl<'a> ReplayReport<'a> {
    /// The object for `results` of replaying `input`, read from the trace at `path`.
    pub fn new(
        path: &str,
        input: &crate::replay::ReplayInput,
        results: &'a [PolicyResult],
    ) -> ReplayReport<'a> {
        ReplayReport {
            trace: path.to_string(),
            format: input.trace().format.name(),
            device: input.device(),
            events: input.event_count(),
            results,
            recorded: None,
            capacity: None,
        }
    }
}

/// A `results` entry as written: a policy's result, or the recorded run.
#[derive(Serialize)]
#[serde(untagged)]
enum Entry<'a> {
    Policy(&'a PolicyResult),
    Recorded(&'a RecordedRow),
}

/// [`ReplayReport`] as written, keys in the same order, the recorded run among the results.
#[derive(Serialize)]
struct Written<'a> {
    trace: &'a str,
    format: &'a str,
    device: i32,
    events: u64,
    results: Vec<Entry<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<&'a CapacityNote>,
}

/// Writes `report` as pretty JSON and a final newline.
pub fn write(report: &ReplayReport, out: &mut impl Write) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("JSON", e);
    let mut results: Vec<Entry> = report.results.iter().map(Entry::Policy).collect();
    results.extend(report.recorded.as_ref().map(Entry::Recorded));
    let written = Written {
        trace: &report.trace,
        format: report.format,
        device: report.device,
        events: report.events,
        results,
        capacity: report.capacity.as_ref(),
    };
    serde_json::to_writer_pretty(&mut *out, &written).map_err(|e| io(e.into()))?;
    writeln!(out).map_err(io)
}

/// Writes a report's results as the `replay --json` object.
#[cfg(feature = "charts")]
pub(crate) fn write_report(data: &ReportData, out: &mut impl Write) -> Result<()> {
    let results = data.results();
    write(
        &ReplayReport {
            trace: data.trace.path.clone(),
            format: data.trace.format,
            device: data.trace.device,
            events: data.trace.events,
            results: &results,
            recorded: data.recorded.clone(),
            capacity: data.capacity_note.clone(),
        },
        out,
    )
}
