//! The what-if library on real traces: `fit` is tight, `sweep`'s export line replays to the
//! reported peak.

use crate::util::real_trace;
use fragsim::metrics::PolicyResult;
use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{ReplayInput, ReplayOptions};
use fragsim::trace::{self, ReadOptions};
use fragsim::units::MIB;
use fragsim::whatif::fit::{fit, FitOptions, Probe};
use fragsim::whatif::sweep::{report, SweepRow};
use fragsim::whatif::{grid, Row};

/// The one place these tests replay.
fn replay(input: &ReplayInput, spec: &str, capacity: Option<u64>) -> PolicyResult {
    let spec = &PolicySpec::parse_list(spec).unwrap()[0];
    let opts = ReplayOptions { capacity, ..ReplayOptions::default() };
    policy::lookup(&spec.name).unwrap().run(spec, input, &opts).unwrap().result
}

#[test]
fn fit_is_tight_on_a_real_snapshot() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let trace = trace::read_trace(&path, &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&trace, None).unwrap();
    for spec in ["pytorch", "pytorch-expandable", "bound"] {
        let free = replay(&input, spec, None);
        let options = FitOptions {
            upper_hint: free.peak_reserved_bytes,
            known_failing: free.peak_requested_bytes.saturating_sub(1),
            ..FitOptions::default()
        };
        let run = |c| {
            let r = replay(&input, spec, Some(c));
            Ok(Probe { oom: r.oom, peak_reserved: r.peak_reserved_bytes })
        };
        let f = fit(run, &options).unwrap();
        let need = f.min_capacity_bytes.expect("a capacity is found");
        assert!(!replay(&input, spec, Some(need)).oom, "{spec}: OOM at its answer {need}");
        assert!(
            replay(&input, spec, Some(need - 2 * MIB)).oom,
            "{spec}: no OOM 2 MiB below {need}"
        );
        if f.exact {
            assert!(
                replay(&input, spec, Some(need - 1)).oom,
                "{spec}: exact but {need} - 1 passes"
            );
        }
        assert!(need <= free.peak_reserved_bytes, "{spec}: {need} > unlimited peak");
    }
}

#[test]
fn the_sweep_winner_replays_to_its_reported_peak() {
    let path = real_trace("cs336-lm-step-c.pickle");
    let trace = trace::read_trace(&path, &ReadOptions::default()).unwrap();
    let input = ReplayInput::new(&trace, None).unwrap();
    let name = path.display().to_string();
    let mut specs = vec!["pytorch".to_string()];
    specs.extend(
        grid::expand("pytorch:expandable_segments:{False,True},max_split_size_mb:{64,256}")
            .unwrap(),
    );
    let rows: Vec<SweepRow> = specs
        .iter()
        .map(|s| SweepRow {
            spec: s.clone(),
            row: Row::new(name.clone(), &replay(&input, s, None)),
        })
        .collect();
    let rep = report(vec![name], "peak_reserved_bytes", rows, Some("pytorch")).unwrap();
    let best = rep.best.unwrap();
    let env = best.env.expect("a PyTorch winner has an export line");
    let value = env.strip_prefix("export PYTORCH_CUDA_ALLOC_CONF=").unwrap().trim_matches('\'');
    let again = replay(&input, &format!("pytorch:{value}"), None);
    assert_eq!(
        Some(&serde_json::Value::from(again.peak_reserved_bytes)),
        best.objective.get("peak_reserved_bytes")
    );
}
