//! `fit`: the smallest device capacity a policy replays without an OOM, and the GPU cards that
//! offers.
//!
//! The search only needs a way to replay at a capacity: [`fit`] takes a closure
//! `FnMut(capacity) -> Result<Probe>`, so the command decides how a replay runs (which policy,
//! which backend, in which thread pool).
//!
//! **Search.** Bisection on a 2 MiB grid between a failing and a passing capacity (the first
//! passing one is the caller's hint, doubled until it passes), then refinement to the byte: the
//! peak a passing replay reserved is itself a passing capacity candidate, and if one byte less
//! fails, it is exact. A policy can need less than the peak of a looser run (an OOM-triggered
//! flush frees cached blocks and retries), so a passing `peak − 1` is descended again, a few
//! times at most, before falling back to byte bisection.
//!
//! **Monotonicity.** OOM-freedom need not be monotonic in capacity: a flush taken at a small
//! capacity can leave a better layout than the one a larger capacity keeps. After the search a few
//! capacities above the answer are checked too, and every probe is remembered; a failure above a
//! pass is reported as [`NonMonotonic`], and the answer is raised to the smallest capacity above
//! every failure seen, the one that is safe to buy.

use crate::error::Result;
use crate::metrics::PolicyResult;
use crate::policy::PolicySpec;
use crate::replay::{run_specs, Cancel, Jobs, ReplayInput, ReplayOptions, RunSettings};
use crate::units::{GIB, MIB};
use serde::Serialize;

/// What one replay at a capacity gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Whether some request could not be served.
    pub oom: bool,
    /// The most memory the policy reserved at once.
    pub peak_reserved: u64,
}

/// How to search.
#[derive(Clone, Debug)]
pub struct FitOptions {
    /// The bisection's step (2 MiB: PyTorch's large-segment rounding).
    pub granularity: u64,
    /// A capacity likely to pass, e.g. the peak reserved of an unlimited replay; doubled until it
    /// passes.
    pub upper_hint: u64,
    /// A capacity known to fail, e.g. the peak requested bytes less one (no policy reserves less
    /// than it serves); 0 when unknown.
    pub known_failing: u64,
    /// Refine the 2 MiB answer to the byte.
    pub exact: bool,
    /// Capacities above the answer to check for non-monotonicity, as fractions of the answer
    /// (e.g. 0.01 = 1% more).
    pub checks_above: Vec<f64>,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            granularity: 2 * MIB,
            upper_hint: GIB,
            known_failing: 0,
            exact: true,
            checks_above: vec![0.01, 0.1, 0.5],
        }
    }
}

/// A capacity that passed below one that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NonMonotonic {
    /// The smallest capacity seen to pass.
    pub passes_at: u64,
    /// A larger capacity seen to fail.
    pub fails_at: u64,
}

/// The answer for one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fit {
    /// The smallest capacity with no OOM (above every failing capacity seen).
    /// `None` (JSON `null`) where no capacity was found: see [`Fit::no_fit`].
    pub min_capacity_bytes: Option<u64>,
    /// True when `min_capacity_bytes − 1` was replayed and ran out: the answer is exact to the
    /// byte, not only to the granularity.
    pub exact: bool,
    /// Replays the search took.
    pub probes: usize,
    /// Set when a capacity above a passing one ran out (see the module docs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub non_monotonic: Option<NonMonotonic>,
    /// Why no capacity was found (the policy runs out even with 1 PiB, or passes only below
    /// a capacity that fails): a result, so that one such policy leaves the others' answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_fit: Option<String>,
}

impl Fit {
    /// No capacity found, for `why`, after `probes` replays.
    fn none(why: String, probes: usize, non_monotonic: Option<NonMonotonic>) -> Fit {
        Fit { min_capacity_bytes: None, exact: false, probes, non_monotonic, no_fit: Some(why) }
    }
}

/// The largest capacity tried before giving up: far beyond any GPU.
const GIVE_UP: u64 = 1 << 50;
/// Descents from a passing peak before falling back to byte bisection.
const DESCENTS: usize = 4;

/// Every probe so far (each capacity is replayed once), and the closure.
struct Search<F> {
    run: F,
    seen: Vec<(u64, Probe)>,
}

impl<F: FnMut(u64) -> Result<Probe>> Search<F> {
    fn probe(&mut self, capacity: u64) -> Result<Probe> {
        if let Some(&(_, p)) = self.seen.iter().find(|s| s.0 == capacity) {
            return Ok(p);
        }
        let p = (self.run)(capacity)?;
        self.seen.push((capacity, p));
        Ok(p)
    }

    /// The largest failing capacity seen, or `floor`.
    fn highest_failure(&self, floor: u64) -> u64 {
        self.seen.iter().filter(|s| s.1.oom).map(|s| s.0).fold(floor, u64::max)
    }

    /// Smallest passing capacity in `(fail, pass]` on the grid of multiples of `step` (plus
    /// `pass` itself): `fail` is known to fail (or is the floor), `pass` to pass.
    fn bisect(&mut self, fail: u64, mut pass: u64, step: u64) -> Result<u64> {
        let mut fail_k = fail / step; // grid points at or below `fail` count as failing
        loop {
            let pass_k = pass.div_ceil(step);
            if pass_k <= fail_k + 1 {
                return Ok(pass);
            }
            let mid = (fail_k + (pass_k - fail_k) / 2) * step;
            if self.probe(mid)?.oom {
                fail_k = mid / step;
            } else {
                pass = mid;
            }
        }
    }
}

/// Finds the smallest capacity at which `run` reports no OOM (see the module docs). `run` is
/// called with capacities in bytes. An error from `run` ends the search; a policy that runs out
/// even at 1 PiB has no answer ([`Fit::no_fit`] names the last capacity tried).
pub fn fit<F: FnMut(u64) -> Result<Probe>>(run: F, options: &FitOptions) -> Result<Fit> {
    let g = options.granularity.max(1);
    let mut s = Search { run, seen: Vec::new() };
    // A passing upper bound.
    let mut hi = options.upper_hint.max(g);
    let mut hi_probe = s.probe(hi)?;
    while hi_probe.oom {
        if hi >= GIVE_UP {
            let why = format!(
                "runs out of memory even with {} of device memory",
                crate::units::format_bytes(hi)
            );
            return Ok(Fit::none(why, s.seen.len(), None));
        }
        hi = hi.saturating_mul(2).min(GIVE_UP);
        hi_probe = s.probe(hi)?;
    }
    let mut non_monotonic = None;
    let mut answer;
    let mut exact;
    let mut floor = options.known_failing.min(hi - 1);
    loop {
        // Grid points are multiples of g, so answers are round numbers of MiB.
        answer = s.bisect(s.highest_failure(floor), hi, g)?;
        exact = false;
        if options.exact {
            let fail = s.highest_failure(floor);
            (answer, exact) = refine(&mut s, fail, answer)?;
        }
        // Look above the answer for a failure the bisection stepped over.
        let mut failed_above = None;
        for f in &options.checks_above {
            let c = answer.saturating_add(((answer as f64) * f).ceil() as u64).max(answer + 1);
            if c < hi && s.probe(c)?.oom {
                failed_above = Some(c);
                break;
            }
        }
        let worst = s.seen.iter().filter(|&&(c, p)| p.oom && c > answer).map(|s| s.0).max();
        match failed_above.or(worst) {
            Some(fails_at) => {
                let passes_at = s
                    .seen
                    .iter()
                    .filter(|&&(c, p)| !p.oom && c < fails_at)
                    .map(|s| s.0)
                    .min()
                    .unwrap_or(answer);
                non_monotonic.get_or_insert(NonMonotonic { passes_at, fails_at });
                if fails_at >= hi {
                    let why = format!(
                        "passes at {hi} bytes but runs out at {fails_at}: no safe capacity found"
                    );
                    return Ok(Fit::none(why, s.seen.len(), non_monotonic));
                }
                floor = fails_at;
            }
            None => break,
        }
        if s.seen.len() > 400 {
            break; // a pathological policy; report what is known
        }
    }
    Ok(Fit {
        min_capacity_bytes: Some(answer),
        exact,
        probes: s.seen.len(),
        non_monotonic,
        no_fit: None,
    })
}

/// Refines a passing capacity to the byte: the run at `pass` reserved its peak, which also passes
/// if the run did not depend on the slack; one byte less failing proves it exact.
fn refine<F: FnMut(u64) -> Result<Probe>>(
    s: &mut Search<F>,
    fail: u64,
    mut pass: u64,
) -> Result<(u64, bool)> {
    for _ in 0..DESCENTS {
        let peak = s.probe(pass)?.peak_reserved;
        if peak > fail && peak < pass && !s.probe(peak)?.oom {
            pass = peak;
        }
        if pass - 1 <= fail {
            return Ok((pass, true));
        }
        let below = s.probe(pass - 1)?;
        if below.oom {
            return Ok((pass, true));
        }
        pass -= 1; // passes with less: descend from its own peak
    }
    let fail = s.highest_failure(fail);
    Ok((s.bisect(fail, pass, 1)?, true))
}

/// A common GPU memory size, for the `fit` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Card {
    /// The size in the unit it really is, e.g. `80 GiB` (vendors print "80 GB"): the text
    /// `--capacity` reads as the same bytes.
    pub label: &'static str,
    /// Cards sold with that size (examples, not a complete list).
    pub examples: &'static str,
    /// The memory in bytes the size stands for.
    pub bytes: u64,
}

/// The common card sizes (`fit`'s table). Vendors print "GB" but the memory is built from
/// power-of-two DRAM and the sizes are GiB: an A100 80GB or H100 80GB has 81,920 MiB
/// (85,899,345,920 B) of HBM, an A100 40GB 40,960 MiB, an RTX 4090's 24 GB is 24 GiB. So each
/// label N GB is taken as N GiB, the memory on the board. What a process can use is a little less
/// (ECC and the driver's reservations; `nvidia-smi` shows the board's total), which the
/// `--outside` estimate ([`DEFAULT_OUTSIDE`]) covers together with the CUDA context. Ascend
/// cards are listed by their nominal HBM size too (torch_npu's reservation base is what
/// `aclrtGetMemInfo` reports, a little less).
pub const CARDS: &[Card] = &[
    Card { label: "16 GiB", examples: "V100 16GB, T4, RTX A4000", bytes: 16 * GIB },
    Card { label: "24 GiB", examples: "RTX 3090/4090, A10, L4", bytes: 24 * GIB },
    Card { label: "32 GiB", examples: "V100 32GB, RTX 5090, Ascend 910, 910B4", bytes: 32 * GIB },
    Card { label: "40 GiB", examples: "A100 40GB", bytes: 40 * GIB },
    Card { label: "48 GiB", examples: "RTX A6000, L40S, RTX 6000 Ada", bytes: 48 * GIB },
    Card { label: "64 GiB", examples: "Ascend 910B1/B2/B3", bytes: 64 * GIB },
    Card { label: "80 GiB", examples: "A100 80GB, H100 80GB", bytes: 80 * GIB },
    Card { label: "94 GiB", examples: "H100 NVL", bytes: 94 * GIB },
    Card { label: "141 GiB", examples: "H200", bytes: 141 * GIB },
    Card { label: "192 GiB", examples: "B200, MI300X", bytes: 192 * GIB },
];

/// The default `--outside`: device memory a PyTorch process uses outside its caching allocator,
/// 512 MiB. That is the CUDA context with PyTorch's kernels loaded lazily (the default since
/// CUDA 11.7 / PyTorch 1.13: a few hundred MiB on A100/H100, more with cuDNN and NCCL loaded),
/// plus the gap between a board's nominal size and what the driver lets a process allocate.
/// cuBLAS workspaces are allocated through the caching allocator and are already in the trace.
/// It is an estimate: `--outside 0` compares the allocator's need with the bare card sizes.
pub const DEFAULT_OUTSIDE: u64 = 512 * MIB;

/// The policies `fit` answers for when none is given: the recorded settings, expandable
/// segments, and the floor no allocator beats.
pub const DEFAULT_POLICIES: &[&str] = &["pytorch", "pytorch-expandable", "bound"];

impl Card {
    /// The nominal size in GB (`80` for "80 GB"), which names the cards sold at it
    /// ([`crate::units::cards::of_nominal`]).
    pub(crate) fn nominal_gb(&self) -> u32 {
        u32::try_from(self.bytes >> 30).unwrap_or(u32::MAX)
    }
}

/// Whether a run needing `min_capacity` bytes of allocator memory fits on each of [`CARDS`], with
/// `outside` bytes used outside the allocator.
pub(crate) fn cards_fit(min_capacity: u64, outside: u64) -> Vec<(Card, bool)> {
    CARDS.iter().map(|c| (*c, fits(c.bytes, min_capacity, outside))).collect()
}

/// Whether a run needing `min_capacity` bytes of allocator memory fits in a device of `bytes`
/// with `outside` bytes used outside the allocator.
pub fn fits(bytes: u64, min_capacity: u64, outside: u64) -> bool {
    bytes.checked_sub(outside).is_some_and(|usable| usable >= min_capacity)
}

/// `min_capacity` in GiB and in GB, as the `fit` table prints it: `37.25 GiB (40.00 GB)`.
pub fn gib_and_gb(bytes: u64) -> String {
    format!("{:.2} GiB ({:.2} GB)", bytes as f64 / GIB as f64, bytes as f64 / 1e9)
}

/// One line of ✓/✗ per card: `16 GiB ✗  24 GiB ✓ ...`.
pub fn cards_line(min_capacity: u64, outside: u64) -> String {
    cards_fit(min_capacity, outside)
        .iter()
        .map(|(c, ok)| format!("{} {}", c.label, if *ok { "✓" } else { "✗" }))
        .collect::<Vec<_>>()
        .join("  ")
}

/// One card size and whether a policy fits on it, with the cards of that size by name.
#[derive(Clone, Debug, Serialize)]
pub struct CardFit {
    /// The size, e.g. `80 GiB`.
    pub card: &'static str,
    /// Its bytes.
    pub bytes: u64,
    /// Whether the need and `--outside` fit in it.
    pub fits: bool,
    /// The cards sold at this size that `--capacity` knows by name, at the memory their
    /// drivers report (a little less than the size).
    pub named: Vec<NamedFit>,
}

/// One card by name (`a100-40gb`) and whether a policy fits in what its driver reports.
#[derive(Clone, Debug, Serialize)]
pub struct NamedFit {
    /// Its name, as `--capacity` takes it.
    pub card: &'static str,
    /// The model, as sold.
    pub model: &'static str,
    /// The memory its driver reports.
    pub bytes: u64,
    /// Whether the need and `--outside` fit in it.
    pub fits: bool,
}

/// One policy's answer, as `fit --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyFit {
    /// The spec, as written.
    pub policy: String,
    /// Its configuration, as `replay` prints it.
    pub config: String,
    /// The search's answer.
    #[serde(flatten)]
    pub fit: Fit,
    /// The common sizes (empty for host memory, which no card holds).
    pub cards: Vec<CardFit>,
}

/// What `fit --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct FitReport {
    /// The trace.
    pub trace: String,
    /// The device replayed.
    pub device: i32,
    /// Memory used outside the allocator, added before comparing with the cards.
    pub outside_bytes: u64,
    /// True for host memory (device -1, a CPU profiler trace): no GPU card holds it, so every
    /// result's `cards` is empty.
    pub host_memory: bool,
    /// The device limit the recording implies, where it shows the device running out (the
    /// limit `replay`, `sweep` and `check` replay under by default); absent otherwise. Each
    /// policy's need is beside it: a need above it is a run that did not fit as recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_limit_bytes: Option<u64>,
    /// One per policy, in the order given.
    pub results: Vec<PolicyFit>,
}

/// One replay of `spec` at `capacity` (`None`: unlimited), stopped early when `cancel` is
/// raised.
fn replay_at(
    spec: &PolicySpec,
    input: &ReplayInput,
    capacity: Option<u64>,
    cancel: &Cancel,
) -> Result<PolicyResult> {
    let options = ReplayOptions { capacity, cancel: cancel.clone(), ..ReplayOptions::default() };
    let settings = RunSettings { jobs: Jobs::Sequential, ..RunSettings::default() };
    let mut c = run_specs(std::slice::from_ref(spec), input, &options, &settings)?;
    Ok(c.runs.remove(0).output.result)
}

/// The search for one policy on `input`: an unlimited replay bounds it (its peak passes; no
/// policy serves in less than the peak of live requests), then [`fit`] bisects; the answer is
/// set beside the cards with `outside` bytes used outside the allocator.
pub fn fit_policy(
    spec: &PolicySpec,
    input: &ReplayInput,
    outside: u64,
    cancel: &Cancel,
) -> Result<PolicyFit> {
    // Host memory (device -1) is no GPU's: no card applies to it.
    let host = input.device() < 0;
    let free = replay_at(spec, input, None, cancel)?;
    let options = FitOptions {
        upper_hint: free.peak_reserved_bytes.max(1),
        known_failing: free.peak_requested_bytes.saturating_sub(1),
        ..FitOptions::default()
    };
    let probe = |c| {
        let r = replay_at(spec, input, Some(c), cancel)?;
        Ok(Probe { oom: r.oom, peak_reserved: r.peak_reserved_bytes })
    };
    // Whatever ends the search is about this trace's run: the error names its file.
    let found = fit(probe, &options).map_err(|e| {
        e.prefixed(&spec.display().to_string()).in_format(input.trace().format.name())
    })?;
    let least = found.min_capacity_bytes;
    let cards = (least.map(|least| cards_fit(least, outside)).unwrap_or_default().into_iter())
        .filter(|_| !host)
        .map(|(c, fits_size)| CardFit {
            card: c.label,
            bytes: c.bytes,
            fits: fits_size,
            named: crate::units::cards::of_nominal(c.nominal_gb())
                .map(|n| NamedFit {
                    card: n.name,
                    model: n.model,
                    bytes: n.bytes(),
                    fits: least.is_some_and(|least| fits(n.bytes(), least, outside)),
                })
                .collect(),
        })
        .collect();
    Ok(PolicyFit { policy: spec.display(), config: free.config, fit: found, cards })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy that needs `need` bytes and reserves exactly that much when it can.
    fn threshold(need: u64) -> impl FnMut(u64) -> Result<Probe> {
        move |c| Ok(Probe { oom: c < need, peak_reserved: need.min(c) })
    }

    #[test]
    fn finds_the_exact_need_in_few_probes() {
        for need in [1, 2 * MIB, 2 * MIB + 1, 37 * GIB + 12_345, 3 * GIB] {
            let f = fit(threshold(need), &FitOptions::default()).unwrap();
            assert_eq!(f.min_capacity_bytes, Some(need), "{need}");
            assert!(f.exact);
            assert!(f.non_monotonic.is_none());
            assert!(f.probes <= 40, "{need}: {} probes", f.probes);
        }
    }

    #[test]
    fn without_refinement_the_answer_is_on_the_grid() {
        let o = FitOptions { exact: false, checks_above: vec![], ..FitOptions::default() };
        let f = fit(threshold(5 * MIB + 7), &o).unwrap();
        assert_eq!(f.min_capacity_bytes, Some(6 * MIB));
        assert!(!f.exact);
    }

    #[test]
    fn a_policy_that_needs_less_than_its_loose_peak_is_descended() {
        // Reserves all it is given (a flush on every OOM lets it live in less).
        let need = 600 * MIB + 12_345;
        let run = move |c: u64| Ok(Probe { oom: c < need, peak_reserved: c });
        let f = fit(run, &FitOptions::default()).unwrap();
        assert_eq!(f.min_capacity_bytes, Some(need));
        assert!(f.exact);
        // Reserves 1 GiB when it can, but lives in its need below that.
        let run = move |c: u64| {
            Ok(Probe { oom: c < need, peak_reserved: if c >= GIB { GIB } else { need } })
        };
        assert_eq!(fit(run, &FitOptions::default()).unwrap().min_capacity_bytes, Some(need));
    }

    #[test]
    fn non_monotonic_policies_are_detected_and_the_safe_answer_reported() {
        // Passes at [100 MiB, 104 MiB), fails again in [104, 150) MiB, passes from 150 MiB.
        let run = |c: u64| {
            let oom = c < 100 * MIB || (104 * MIB..150 * MIB).contains(&c);
            Ok(Probe { oom, peak_reserved: c.min(400 * MIB) })
        };
        let o = FitOptions { upper_hint: 400 * MIB, ..FitOptions::default() };
        let f = fit(run, &o).unwrap();
        let nm = f.non_monotonic.expect("detected");
        assert!(nm.passes_at < nm.fails_at);
        assert!(nm.fails_at >= 104 * MIB && nm.fails_at < 150 * MIB, "{nm:?}");
        assert_eq!(f.min_capacity_bytes, Some(150 * MIB));
    }

    #[test]
    fn grows_the_hint_and_gives_up_clearly() {
        let f = fit(threshold(10 * GIB), &FitOptions { upper_hint: MIB, ..Default::default() });
        assert_eq!(f.unwrap().min_capacity_bytes, Some(10 * GIB));
        let never = |_| Ok(Probe { oom: true, peak_reserved: 0 });
        let f = fit(never, &FitOptions::default()).unwrap();
        assert_eq!(f.min_capacity_bytes, None);
        let why = f.no_fit.unwrap();
        assert!(why.contains("runs out of memory even with"), "{why}");
    }

    #[test]
    fn errors_from_the_replay_end_the_search() {
        let fail = |_| Err(crate::Error::usage("boom"));
        assert_eq!(fit(fail, &FitOptions::default()).unwrap_err().to_string(), "boom");
    }

    #[test]
    fn each_card_label_is_the_bytes_capacity_reads_for_it() {
        for c in CARDS {
            let typed = c.label.replace(' ', "");
            assert_eq!(crate::units::parse_capacity(&typed).unwrap(), c.bytes, "{}", c.label);
        }
    }

    #[test]
    fn cards_subtract_the_outside_memory() {
        let need = 40 * GIB - 100 * MIB;
        let fits = cards_fit(need, 0);
        assert!(!fits[2].1 && fits[3].1, "32 GB no, 40 GB yes");
        let fits = cards_fit(need, DEFAULT_OUTSIDE);
        assert!(!fits[3].1 && fits[4].1, "40 GB no with 512 MiB outside, 48 GB yes");
        assert!(cards_fit(1, 200 * GIB).iter().all(|(_, ok)| !ok));
        assert_eq!(CARDS[5].bytes, 64 * GIB, "Ascend 910B: 64 GiB of HBM");
        assert_eq!(CARDS[6].bytes, 85_899_345_920, "80 GB is 81,920 MiB");
        let line = cards_line(need, 0);
        assert!(line.starts_with("16 GiB ✗") && line.contains("40 GiB ✓"), "{line}");
        assert_eq!(gib_and_gb(80 * GIB), "80.00 GiB (85.90 GB)");
    }
}
