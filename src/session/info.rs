//! `info`'s answer: what a trace holds, and what each device held before its first event.

use crate::policy::PolicySpec;
use crate::replay::{run_spec, ReplayInput};
use crate::trace::summary::{StartFigures, Summary};
use crate::trace::Trace;

/// What `trace` holds ([`Summary::of`]), with each device's [`start_figures`].
pub fn info(trace: &Trace) -> Summary {
    let mut summary = Summary::of(trace);
    summary.set_start(|device| start_figures(trace, device));
    let m = crate::policy::pytorch::config::ModelledVersion::of_trace(trace);
    summary.pytorch_release = m.at_least.map(|least| crate::trace::summary::Release {
        version: m.version.to_string(),
        at_least: least.to_string(),
        why: m.why.to_string(),
    });
    summary
}

/// What `device` held before its first event: the blocks live at the start (allocated before the
/// trace, freed during it), as every replay carries them, and the peak of live bytes counting
/// them, `bound`'s peak reserved. All `None` when the device cannot be replayed.
pub fn start_figures(trace: &Trace, device: i32) -> StartFigures {
    let Ok(input) = ReplayInput::new(trace, Some(device)) else {
        return StartFigures::default();
    };
    let bound = PolicySpec::parse_list("bound")
        .ok()
        .and_then(|specs| run_spec(&specs[0], &input, &Default::default()).ok())
        .map(|o| o.result.peak_reserved_bytes);
    StartFigures {
        live_at_start_blocks: Some(input.live_at_start().len() as u64),
        live_at_start_bytes: Some(input.live_at_start().iter().map(|b| b.size).sum()),
        peak_live_with_start_bytes: bound,
    }
}
