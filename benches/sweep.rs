//! Sweep parallelism: a 24-config sweep of PyTorch settings on the largest real snapshot
//! (`traces/real/cs336-medium-ctx512-train.pickle`), run through [`run_specs`] exactly as
//! `fragsim sweep` runs it, with `--jobs 1` and `--jobs 2`. On 2 idle cores the second should
//! take close to half the time of the first.

use criterion::{criterion_group, criterion_main, Criterion};
use fragsim::policy::PolicySpec;
use fragsim::replay::{run_specs, Jobs, ReplayInput, ReplayOptions, RunSettings};
use fragsim::trace::{read_trace, ReadOptions};
use fragsim::whatif::grid;
use std::path::Path;

const TRACE: &str = "traces/real/cs336-medium-ctx512-train.pickle";
/// 2 × 4 × 3 = 24 configs.
const GRID: &str = "pytorch:expandable_segments:{False,True},max_split_size_mb:{64,128,256,512},roundup_power2_divisions:{1,2,4}";

fn sweep(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TRACE);
    let trace = read_trace(&path, &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let input = ReplayInput::new(&trace, None).expect("the trace has a device");
    let specs: Vec<PolicySpec> = grid::expand(GRID)
        .expect("a well-formed grid")
        .iter()
        .map(|s| PolicySpec::parse_list(s).expect("a PyTorch spec").remove(0))
        .collect();
    assert_eq!(specs.len(), 24);
    let options = ReplayOptions::default();
    let mut group = c.benchmark_group("sweep-24");
    group.sample_size(10);
    for jobs in [1, 2] {
        let settings = RunSettings { jobs: Jobs::from_count(Some(jobs)), ..RunSettings::default() };
        group.bench_function(format!("jobs={jobs}"), |b| {
            b.iter(|| run_specs(&specs, &input, &options, &settings).expect("the sweep runs"))
        });
    }
    group.finish();
}

criterion_group!(benches, sweep);
criterion_main!(benches);
