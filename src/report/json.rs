//! `replay --json`: one object per `interface.md`.

use crate::replay::PolicyResult;
use serde::Serialize;

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
