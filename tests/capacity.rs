//! Capacity replays end and explain themselves: every policy on every real trace at 25%, 50%
//! and 90% of what it needs (its own unlimited peak reserved) terminates, and reports an OOM
//! with its details whenever the capacity is below what the trace keeps live.

use fragsim::metrics::PolicyResult;
use fragsim::policy::{self, PolicySpec};
use fragsim::replay::{run_spec, ReplayInput, ReplayOptions};
use fragsim::trace::{self, ReadOptions};
use rayon::prelude::*;

/// Every trace in traces/real/.
fn real_traces() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("traces/real")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".pickle") || name.ends_with(".json.gz")
        })
        .collect();
    paths.sort();
    paths
}

fn replay(input: &ReplayInput, spec: &PolicySpec, capacity: Option<u64>) -> PolicyResult {
    let options = ReplayOptions { capacity, ..ReplayOptions::default() };
    run_spec(spec, input, &options)
        .unwrap_or_else(|e| panic!("{} at {capacity:?}: {}", spec.display(), e.message()))
        .result
}

#[test]
fn every_policy_ends_on_every_real_trace_below_its_need() {
    let traces = real_traces();
    assert!(traces.len() >= 7, "{traces:?}");
    let specs: Vec<PolicySpec> =
        policy::names().iter().map(|n| PolicySpec::parse_list(n).unwrap().remove(0)).collect();
    for path in &traces {
        let trace = trace::read_trace(path, &ReadOptions::default()).unwrap();
        let input = ReplayInput::new(&trace, None).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        let needs: Vec<PolicyResult> = specs.par_iter().map(|s| replay(&input, s, None)).collect();
        let live_peak = needs[0].peak_requested_bytes;
        let jobs: Vec<(usize, u64)> = (0..specs.len())
            .flat_map(|k| {
                let need = needs[k].peak_reserved_bytes;
                [25, 50, 90].map(|pct| (k, need / 100 * pct))
            })
            .collect();
        let runs: Vec<PolicyResult> =
            jobs.par_iter().map(|&(k, cap)| replay(&input, &specs[k], Some(cap))).collect();
        for (&(k, cap), r) in jobs.iter().zip(&runs) {
            let what = format!("{name}: {} at {cap} bytes", specs[k].display());
            assert_eq!(r.oom, r.first_oom_event.is_some(), "{what}");
            if cap < live_peak {
                assert!(r.oom, "{what}: below the live peak {live_peak} yet no OOM");
            }
            if r.oom {
                let d = r.first_oom.as_ref().unwrap_or_else(|| panic!("{what}: no details"));
                assert_eq!(Some(d.event), r.first_oom_event, "{what}");
                assert_eq!(d.capacity_bytes, Some(cap), "{what}");
                assert!(d.size > 0, "{what}");
                assert!(d.reserved_bytes <= cap, "{what}: {d:?}");
                assert_eq!(d.free_bytes, Some(cap - d.reserved_bytes), "{what}");
            } else {
                assert_eq!(r.peak_requested_bytes, live_peak, "{what}: served all, same live peak");
            }
            assert!(r.peak_reserved_bytes <= cap, "{what}: held {}", r.peak_reserved_bytes);
        }
    }
}

/// A capacity far above anything a trace needs names a card, not a limit: `pytorch` and
/// `pytorch-expandable` make the same decisions with it as without it, on every real trace.
/// That includes every rule the trace calls for, such as a Kineto trace's exact blocks: the V100
/// trace's peak allocated bytes are the same under `--capacity 16GB` as without a capacity.
#[test]
fn a_capacity_that_cannot_bind_changes_no_pytorch_decision() {
    for path in real_traces() {
        let trace = trace::read_trace(&path, &ReadOptions::default()).unwrap();
        let input = ReplayInput::new(&trace, None).unwrap();
        for name in ["pytorch", "pytorch-expandable"] {
            let spec = PolicySpec::parse_list(name).unwrap().remove(0);
            let free = replay(&input, &spec, None);
            let roomy = replay(&input, &spec, Some(1 << 40));
            assert!(!roomy.oom, "{}: {name} under 1 TiB", path.display());
            for (what, a, b) in [
                ("peak allocated", free.peak_allocated_bytes, roomy.peak_allocated_bytes),
                ("peak reserved", free.peak_reserved_bytes, roomy.peak_reserved_bytes),
                ("cudaMallocs", free.device_malloc_count, roomy.device_malloc_count),
            ] {
                assert_eq!(a, b, "{}: {name}'s {what} moved under --capacity 1TiB", path.display());
            }
        }
    }
}

/// Under a capacity some policies fit and others run out: those that fit come first (each
/// group by peak reserved), and the table says where a run stopped in place of a peak it never
/// completed.
#[test]
fn runs_that_ran_out_of_memory_sort_last_and_say_where() {
    use crate::util::{bundled, run, stdout};
    let trace = bundled("gpt-4l-512h.txt");
    let t = trace.to_str().unwrap();
    let json = |capacity: &str| -> Vec<serde_json::Value> {
        let o = run(&["replay", t, "-p", "all", "--capacity", capacity, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["results"].as_array().unwrap().clone()
    };
    let unlimited = json("none");
    let mut mixed = 0;
    for r in &unlimited {
        let capacity = format!("{}B", r["peak_reserved_bytes"].as_u64().unwrap());
        let rows = json(&capacity);
        let ooms: Vec<bool> = rows.iter().map(|r| r["oom"].as_bool().unwrap()).collect();
        if !(ooms.contains(&true) && ooms.contains(&false)) {
            continue;
        }
        mixed += 1;
        let first_oom = ooms.iter().position(|&o| o).unwrap();
        assert!(ooms[first_oom..].iter().all(|&o| o), "{capacity}: {ooms:?}");
        for group in [&rows[..first_oom], &rows[first_oom..]] {
            let peaks: Vec<u64> =
                group.iter().map(|r| r["peak_reserved_bytes"].as_u64().unwrap()).collect();
            assert!(peaks.windows(2).all(|w| w[0] <= w[1]), "{capacity}: {peaks:?}");
        }
        let table = stdout(&run(&["replay", t, "-p", "all", "--capacity", &capacity]));
        for r in &rows[first_oom..] {
            let event = r["first_oom_event"].as_u64().unwrap();
            let policy = r["policy"].as_str();
            let line = table.lines().find(|l| l.split_whitespace().next() == policy);
            let line = line.unwrap_or_else(|| panic!("{table}"));
            assert!(line.contains(&format!("OOM at event {event}")), "{table}");
            // frag@peak only: no percentage over bound for a peak never reached.
            let percents = line.split_whitespace().filter(|c| c.ends_with('%')).count();
            assert_eq!(percents, 1, "{line}");
        }
    }
    assert!(mixed > 0, "no capacity made some policies fit and others run out");
}

/// `fit` marks each card it names ✓/✗ at the memory its driver reports, and `replay --capacity
/// CARD` replays that memory: with nothing outside the allocator the two agree card by card, on a
/// trace whose need falls among the card sizes.
#[test]
fn fit_agrees_with_replay_under_each_card_by_name() {
    let trace = crate::util::real_trace("cs336-lm-step-a.pickle");
    let t = trace.to_str().unwrap();
    let fit = crate::util::run(&["fit", t, "-p", "pytorch", "--outside", "0", "--json"]);
    assert!(fit.status.success(), "{}", crate::util::stderr(&fit));
    let v: serde_json::Value = serde_json::from_slice(&fit.stdout).unwrap();
    let sizes = v["results"][0]["cards"].as_array().unwrap();
    let named: Vec<&serde_json::Value> =
        sizes.iter().flat_map(|c| c["named"].as_array().unwrap()).collect();
    assert!(named.len() >= 10, "every card by name is listed under its size");
    let (mut fits, mut not) = (0, 0);
    for card in named {
        let name = card["card"].as_str().unwrap();
        let replay =
            crate::util::run(&["replay", t, "-p", "pytorch", "--capacity", name, "--json"]);
        assert!(replay.status.success(), "{name}: {}", crate::util::stderr(&replay));
        let r: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
        let run = r["results"].as_array().unwrap().iter().find(|x| x["policy"] == "pytorch");
        let oom = run.unwrap()["oom"].as_bool().unwrap();
        assert_eq!(card["fits"].as_bool(), Some(!oom), "{name}: fit and replay disagree");
        assert_eq!(r["capacity"]["bytes"], card["bytes"], "{name}: the same bytes");
        if oom {
            not += 1
        } else {
            fits += 1
        }
    }
    assert!(fits > 0 && not > 0, "the trace's need falls among the cards ({fits} fit, {not} not)");
}

/// The trap of nominal sizes: a run that fits in 24 GiB may not fit in what a "24 GB" card's
/// driver reports. The table says which cards, and the CSV lists each.
#[test]
fn fit_names_the_cards_a_nominal_size_overstates() {
    let trace = crate::util::real_trace("cs336-lm-step-a.pickle");
    let t = trace.to_str().unwrap();
    // 22.14 GiB needed + 1.5 GiB outside: over the A30's 23.53 GiB and the 4090's 23.64, under
    // 24 GiB and the 3090's 23.70.
    let o = crate::util::run(&["fit", t, "-p", "pytorch", "--outside", "1.5GiB"]);
    let text = crate::util::stdout(&o);
    // The label means the bytes --capacity reads for the same text (issue 46).
    assert!(text.contains("24 GiB ✓"), "{text}");
    let line = text.lines().find(|l| l.contains("but not on:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("a30 (23.53 GiB, not 24 GiB)"), "{line}");
    assert!(line.contains("rtx-4090") && !line.contains("rtx-3090"), "{line}");
    let csv =
        crate::util::stdout(&crate::util::run(&["fit", t, "-p", "pytorch", "--format", "csv"]));
    let header = csv.lines().next().unwrap();
    assert_eq!(header, "policy,config,min_capacity_bytes,exact,outside_bytes,card,bytes,fits");
    let a100 = csv.lines().find(|l| l.contains(",a100-40gb,")).unwrap_or_else(|| panic!("{csv}"));
    assert!(a100.ends_with(&format!(",{},true", 40_540u64 << 20)), "{a100}");
}

/// Cards by name on the command line: the header says which card and what it reports, a near
/// miss gets "did you mean", and sweep takes names too.
#[test]
fn capacity_takes_cards_by_name() {
    let t = crate::util::bundled("gpt-4l-512h.txt");
    let t = t.to_str().unwrap();
    let o = crate::util::run(&["replay", t, "-p", "pytorch", "--capacity", "A100-40GB"]);
    assert!(o.status.success(), "{}", crate::util::stderr(&o));
    assert!(
        crate::util::stdout(&o).starts_with(
            "capacity: a100-40gb (39.59 GiB, the total the A100 40GB's driver reports)"
        ),
        "{}",
        crate::util::stdout(&o)
    );
    let o = crate::util::run(&["replay", t, "--capacity", "h100"]);
    assert_eq!(o.status.code(), Some(2));
    let e = crate::util::stderr(&o);
    assert!(e.contains("unknown card 'h100': did you mean 'h100-80gb'?"), "{e}");
    let o = crate::util::run(&["sweep", t, "-p", "pytorch", "--capacity", "t4"]);
    assert!(o.status.success(), "{}", crate::util::stderr(&o));
}

/// A what-if's limit binds from the first event. `cs336-lm-step-c` starts from a recovered cache
/// of 13.21 GiB; under `per_process_memory_fraction:0.5` of 16 GiB (8 GiB) the replay installs
/// only the segments that fit, never reserves over the limit, and says so under the table and
/// in JSON (`start_state`); `:0` leaves nothing room, an OOM at event 0 that `sweep` ranks as
/// out of memory (not "+0.0%" against the recorded settings, and under their own label).
#[test]
fn a_limit_binds_from_the_first_event() {
    use crate::util::{real_trace, run, stdout};
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let half = "pytorch:per_process_memory_fraction:0.5";
    let none = "pytorch:per_process_memory_fraction:0";
    let o = run(&["replay", t, "--capacity", "16GiB", "-p", half, "-p", none, "--json"]);
    assert!(o.status.success(), "{}", crate::util::stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["results"].as_array().unwrap();
    let row = |config: &str| {
        rows.iter()
            .find(|r| r["config"].as_str().is_some_and(|c| c.split(',').any(|o| o == config)))
            .unwrap_or_else(|| panic!("{config}: {v}"))
    };
    let limit = 8u64 << 30;
    let r = row("per_process_memory_fraction:0.5");
    assert!(r["peak_reserved_bytes"].as_u64().unwrap() <= limit, "{r}");
    let fit = &r["start_state"];
    assert_eq!(fit["limit_bytes"].as_u64(), Some(limit), "{r}");
    assert_eq!(fit["bytes"].as_u64(), Some(14_180_941_824), "{r}");
    let installed = fit["installed_bytes"].as_u64().unwrap();
    assert!(installed > 0 && installed <= limit, "{r}");
    let r = row("per_process_memory_fraction:0");
    assert_eq!(r["first_oom_event"].as_u64(), Some(0), "{r}");
    assert_eq!(r["start_state"]["installed_bytes"].as_u64(), Some(0), "{r}");

    let table = stdout(&run(&["replay", t, "--capacity", "16GiB", "-p", half, "-p", none]));
    assert!(table.contains("OOM at event 0"), "{table}");
    let said = table.lines().filter(|l| l.starts_with("start state: ")).count();
    assert_eq!(said, 2, "{table}");
    assert!(table.contains("does not fit under the 8.00 GiB limit"), "{table}");

    let sweep = stdout(&run(&["sweep", t, "--capacity", "16GiB", "-p", none, "-p", "pytorch"]));
    let line = sweep.lines().find(|l| l.contains(none)).unwrap_or_else(|| panic!("{sweep}"));
    assert!(line.contains("OOM at event 0") && !line.contains('%'), "{sweep}");
    assert!(sweep.contains("(recorded settings)") && !sweep.contains("(recorded)"), "{sweep}");
    assert!(sweep.contains(&format!("ran out of memory at this capacity (ranked last): {none}")));
}

/// A setting that pays only on some card says which card it assumed: `per_process_memory_fraction`
/// with a `garbage_collection_threshold` is a share of the GPU's memory, so `sweep` names the GPU
/// memory its configs assumed (`--capacity`, here) and JSON carries it per result, and `fit` notes
/// that each capacity it tries is taken as the card's memory.
#[test]
fn a_setting_that_pays_on_some_card_says_the_card() {
    use crate::util::{real_trace, run, stdout};
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let gc = "pytorch:garbage_collection_threshold:0.6,per_process_memory_fraction:0.9";
    let sweep = stdout(&run(&["sweep", t, "--capacity", "24GiB", "-p", gc]));
    assert!(sweep.contains("these configs assume a GPU of 24.00 GiB"), "{sweep}");
    let o = run(&["replay", t, "--capacity", "24GiB", "-p", gc, "-p", "bfc", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["results"].as_array().unwrap();
    let gpu = |p: &str| rows.iter().find(|r| r["policy"] == p).unwrap()["gpu_memory_bytes"].clone();
    assert_eq!(gpu("pytorch").as_u64(), Some(24 << 30), "{v}");
    assert!(gpu("bfc").is_null(), "{v}");
    let fit = stdout(&run(&["fit", t, "-p", gc]));
    assert!(fit.contains("each capacity tried is taken as the card's whole memory"), "{fit}");
}

/// A run that ran out under its own limit (here a memory fraction, with no `--capacity`) names
/// its OOM's stack as one under `--capacity` does, though the replay read no frames.
#[test]
fn an_oom_under_the_policys_own_limit_names_its_stack() {
    use crate::util::{real_trace, run};
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let stack = |extra: &[&str]| -> Vec<serde_json::Value> {
        let mut args =
            vec!["replay", t, "-p", "pytorch:per_process_memory_fraction:0.05", "--json"];
        args.extend(extra);
        let o = run(&args);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let oom = &v["results"][0]["first_oom"];
        assert!(oom.is_object(), "{v}");
        oom["stack"].as_array().unwrap().clone()
    };
    let own = stack(&[]);
    assert!(!own.is_empty());
    assert_eq!(own, stack(&["--capacity", "80GiB"]), "the same OOM names the same stack");
}
