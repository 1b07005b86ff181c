//! `replay --json`: one object per `interface.md`; `report` writes the same object as
//! `results.json`.

use super::bundle::ReportData;
use crate::error::{Error, Result};
use crate::replay::PolicyResult;
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
            format: input.trace.format.name(),
            device: input.device,
            events: input.events.len() as u64,
            results,
        }
    }
}

/// Writes `report` as pretty JSON and a final newline.
pub fn write(report: &ReplayReport, out: &mut impl Write) -> Result<()> {
    let io = |e: std::io::Error| Error::writing("JSON", e);
    serde_json::to_writer_pretty(&mut *out, report).map_err(|e| io(e.into()))?;
    writeln!(out).map_err(io)
}

/// Writes a report's results as the `replay --json` object.
pub fn write_report(data: &ReportData, out: &mut impl Write) -> Result<()> {
    let results = data.results();
    write(
        &ReplayReport {
            trace: data.trace.path.clone(),
            format: data.trace.format,
            device: data.trace.device,
            events: data.trace.events,
            results: &results,
        },
        out,
    )
}
