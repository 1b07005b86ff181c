//! The what-if commands end to end: `fit` is tight, `sweep`'s export line replays to its peak,
//! merged shards equal the unsharded sweep, `check` exits 0/1/2, `--jobs`/`--quiet` change
//! nothing but speed and noise.

use crate::util::*;
use fragsim::units::MIB;
use serde_json::Value;

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// The `replay --json` result of `spec` at `capacity` bytes.
fn replay_at(trace: &str, spec: &str, capacity: u64) -> Value {
    let cap = capacity.to_string();
    let v = json(&run(&["replay", trace, "-p", spec, "--capacity", &cap, "--json"]));
    v["results"][0].clone()
}

#[test]
fn a_policy_that_fits_on_no_device_is_a_row_and_the_others_keep_their_answers() {
    // bfc under its own 1 MiB memory_limit serves no 4 MiB request at any capacity. fit used to
    // exit 2 for it and drop the other policy's answer.
    let (_d, path) = temp_file("t.txt", b"# fragsim text trace v1\nalloc 0x7f0000000000 4194304\n");
    let t = path.to_str().unwrap();
    let never = "bfc:memory_limit=1MiB";
    let v = json(&run(&["fit", t, "-p", never, "-p", "bound", "--json"]));
    let r = &v["results"];
    assert!(r[0]["min_capacity_bytes"].is_null(), "{v}");
    assert!(r[0]["no_fit"].as_str().unwrap().contains("runs out of memory even with"), "{v}");
    assert_eq!(r[0]["cards"], serde_json::json!([]), "{v}");
    assert!(r[1]["min_capacity_bytes"].as_u64().is_some() && r[1]["no_fit"].is_null(), "{v}");
    let table = stdout(&run(&["fit", t, "-p", never, "-p", "bound"]));
    assert!(table.contains("fits on no device: runs out of memory"), "{table}");
    let csv = stdout(&run(&["fit", t, "-p", never, "--csv"]));
    assert!(csv.lines().nth(1).unwrap().starts_with("bfc:memory_limit=1MiB,"), "{csv}");
}

#[test]
fn fit_is_tight_for_the_default_policies() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let v = json(&run(&["fit", t, "--json"]));
    let results = v["results"].as_array().unwrap();
    let policies: Vec<&str> = results.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["pytorch", "pytorch-expandable", "bound"]);
    assert_eq!(v["outside_bytes"], 512 * MIB);
    for r in results {
        let (spec, need) =
            (r["policy"].as_str().unwrap(), r["min_capacity_bytes"].as_u64().unwrap());
        assert_eq!(replay_at(t, spec, need)["oom"], false, "{spec}: OOM at its answer {need}");
        assert_eq!(replay_at(t, spec, need - 2 * MIB)["oom"], true, "{spec}: no OOM below {need}");
        assert_eq!(r["cards"].as_array().unwrap().len(), 10);
        let on_16 = r["cards"][0]["fits"].as_bool().unwrap();
        assert_eq!(on_16, need + 512 * MIB <= 16 << 30, "{spec}");
    }
    let table = stdout(&run(&["fit", t]));
    assert!(
        table.contains("GiB (") && table.contains("GB)") && table.contains("16 GiB "),
        "{table}"
    );
    assert!(table.contains('✓') || table.contains('✗'), "{table}");
}

const GRID: &str = "pytorch:expandable_segments:{False,True},max_split_size_mb:{64,256}";

#[test]
fn the_sweep_export_line_replays_to_the_reported_peak() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let v = json(&run(&["sweep", t, "-p", GRID, "--json"]));
    assert_eq!(v["ranking"].as_array().unwrap().len(), 5, "the grid and the recorded settings");
    let best = &v["best"];
    let env = best["env"].as_str().expect("a PyTorch winner has an export line");
    let value = env.strip_prefix("export PYTORCH_CUDA_ALLOC_CONF=").unwrap().trim_matches('\'');
    let again = json(&run(&["replay", t, "-p", &format!("pytorch:{value}"), "--json"]));
    assert_eq!(again["results"][0]["peak_reserved_bytes"], best["peak_reserved_bytes"]);
    // The table ends with the line to paste, after the saving against the recorded settings.
    let table = stdout(&run(&["sweep", t, "-p", GRID]));
    assert_eq!(table.lines().last(), Some(env), "{table}");
    if best["spec"] != "pytorch" {
        assert!(table.contains("against pytorch (the trace's recorded settings)"), "{table}");
    }
}

#[test]
fn malformed_braces_are_usage_errors_naming_the_brace() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    for (spec, want) in [
        ("pytorch:max_split_size_mb:{64,128", "'{' at column 27 is never closed"),
        ("pytorch:max_split_size_mb:{64,{128}}", "nested braces are not supported"),
        ("pytorch:max_split_size_mb:64}", "'}' at column 29 closes no '{'"),
        ("pytorch:max_split_size_mb:{64,,128}", "alternative 2 of the '{' at column 27 is empty"),
    ] {
        let out = run(&["sweep", t, "-p", spec]);
        assert_eq!(out.status.code(), Some(2), "{spec}");
        assert!(stderr(&out).contains(want), "{spec}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{spec}");
    }
    let out = run(&["sweep", t, "--objective", "peak"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown result key 'peak'"), "{}", stderr(&out));
}

#[test]
fn merged_shards_equal_the_unsharded_sweep_and_other_grids_are_refused() {
    let a = real_trace("cs336-lm-step-c.pickle");
    let b = real_trace("cs336-medium-ctx512-infer.pickle");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let whole = json(&run(&["sweep", a, b, "-p", GRID, "-p", "bfc", "--json"]));
    let dir = tempfile::tempdir().unwrap();
    let mut parts = Vec::new();
    for i in [2, 3, 1] {
        let part = dir.path().join(format!("part{i}.json")).to_string_lossy().into_owned();
        let shard = format!("{i}/3");
        let out = run(&["sweep", a, b, "-p", GRID, "-p", "bfc", "--shard", &shard, "--out", &part]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stdout(&out).is_empty());
        parts.push(part);
    }
    let mut args = vec!["merge".to_string()];
    args.extend(parts.iter().cloned());
    args.push("--json".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let merged = json(&run(&args));
    assert_eq!(untimed(merged), untimed(whole.clone()));
    // The tables are the same too.
    let table = stdout(&run(&["sweep", a, b, "-p", GRID, "-p", "bfc"]));
    assert_eq!(stdout(&run(&args[..args.len() - 1])), table);

    // A part of another grid, or of other traces, is refused.
    let other = dir.path().join("other.json").to_string_lossy().into_owned();
    let out = run(&["sweep", a, b, "-p", "bfc", "--shard", "1/3", "--out", &other]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["merge", &other, &parts[0], &parts[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("different sweeps"), "{}", stderr(&out));
    let out = run(&["sweep", a, "-p", GRID, "-p", "bfc", "--shard", "1/3", "--out", &other]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["merge", &other, &parts[0], &parts[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("different traces"), "{}", stderr(&out));
    let out = run(&["merge", &parts[0], &parts[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("missing 1/3"), "{}", stderr(&out));
}

#[test]
fn a_sweep_of_all_policies_shards_and_merges_with_each_config_once() {
    // `-p all` holds `pytorch`, the recorded settings every sweep starts with: it runs once,
    // and each part lists the grid `merge` expects.
    let trace = real_trace("cs336-lm-step-b.pickle");
    let t = trace.to_str().unwrap();
    let whole = json(&run(&["sweep", t, "-p", "all", "--json"]));
    let ranked: Vec<&str> =
        whole["ranking"].as_array().unwrap().iter().map(|r| r["spec"].as_str().unwrap()).collect();
    assert_eq!(ranked.iter().filter(|s| **s == "pytorch").count(), 1, "{ranked:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["merge".to_string()];
    for i in [1, 2] {
        let part = dir.path().join(format!("part{i}.json")).to_string_lossy().into_owned();
        let shard = format!("{i}/2");
        let out = run(&["sweep", t, "-p", "all", "--shard", &shard, "--out", &part]);
        assert!(out.status.success(), "{}", stderr(&out));
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(&part).unwrap()).unwrap();
        let specs: Vec<&str> =
            written["grid_specs"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert_eq!(specs.iter().filter(|s| **s == "pytorch").count(), 1, "{specs:?}");
        args.push(part);
    }
    args.push("--json".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(untimed(json(&run(&args))), untimed(whole));
}

/// `check TRACE --baseline BASE` with `policies` and `extra` flags.
fn check_against(
    trace: &str,
    base: &str,
    policies: &[&str],
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec!["check", trace, "--baseline", base];
    args.extend_from_slice(policies);
    args.extend_from_slice(extra);
    run(&args)
}

/// A baseline `check --update` writes is one `check` reads back, on every bundled trace: a warm
/// profiler trace's rows carry `start_assumed`, which the baseline reader refused (exit 2), so
/// its first check failed on the file it had just written. A `replay --json` output is a
/// baseline too.
#[test]
fn every_baseline_check_writes_it_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut traces = vec![bundled("gpt-4l-512h.txt")];
    for name in ["cs336-lm-step-b.pickle", "kineto-ddp-v100-rank1.json.gz"] {
        traces.push(real_trace(name));
    }
    for (i, trace) in traces.iter().enumerate() {
        let t = trace.to_str().unwrap();
        let base = dir.path().join(format!("base-{i}.json"));
        let b = base.to_str().unwrap();
        let policies = ["-p", "pytorch", "-p", "pytorch-expandable", "-p", "bfc"];
        let with = |extra: &[&str]| check_against(t, b, &policies, extra);
        let out = with(&["--update"]);
        assert!(out.status.success(), "{t}: {}", stderr(&out));
        let out = with(&[]);
        assert_eq!(out.status.code(), Some(0), "{t}: {}{}", stdout(&out), stderr(&out));
        let replayed = dir.path().join(format!("replay-{i}.json"));
        let mut args = vec!["replay", t, "--json"];
        args.extend_from_slice(&policies);
        let out = run(&args);
        assert!(out.status.success(), "{t}: {}", stderr(&out));
        std::fs::write(&replayed, out.stdout).unwrap();
        let out = run(&["check", t, "--baseline", replayed.to_str().unwrap(), "-p", "bfc"]);
        assert_eq!(out.status.code(), Some(0), "{t}: {}{}", stdout(&out), stderr(&out));
    }
}

#[test]
fn check_exits_0_1_and_2() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.json");
    let b = base.to_str().unwrap();
    let policies = ["-p", "pytorch", "-p", "bound"];
    let with = |extra: &[&str]| check_against(t, b, &policies, extra);
    let out = with(&["--update"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = with(&[]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));

    // A baseline 10% better: exit 1, naming the metric.
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    for row in v["rows"].as_array_mut().unwrap() {
        let peak = row["peak_reserved_bytes"].as_u64().unwrap();
        row["peak_reserved_bytes"] = (peak * 9 / 10).into();
        // Where the peak happened is no metric: moving it is neither better nor worse.
        let at = row["peak_event"].as_u64().unwrap();
        row["peak_event"] = (at + 100).into();
    }
    std::fs::write(&base, v.to_string()).unwrap();
    let out = with(&[]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    let regressions: Vec<&str> = text.lines().filter(|l| l.starts_with("regression:")).collect();
    assert_eq!(regressions.len(), 2, "{text}");
    assert!(
        regressions.iter().all(|l| l.contains("peak_reserved_bytes") && l.contains(t)),
        "{text}"
    );
    // Sizes with their unit, the change in percent.
    assert!(regressions.iter().all(|l| l.contains(" GiB -> ") && l.ends_with("%)")), "{text}");
    assert!(!text.contains("peak_event"), "{text}");
    let out = with(&["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["regressions"][0]["metric"], "peak_reserved_bytes");
    assert!((report["regressions"][0]["change"].as_f64().unwrap() - 1.0 / 9.0).abs() < 1e-3);

    // A policy the baseline has no entry for: exit 2, naming the file.
    let out = run(&["check", t, "--baseline", b, "-p", "bfc"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no baseline entry") && stderr(&out).contains(b),
        "{}",
        stderr(&out)
    );
    let out = run(&["check", t, "--baseline", &format!("{b}.missing")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn jobs_and_quiet_change_neither_results_nor_stdout() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let table = stdout(&run(&["replay", t, "-p", "all"]));
    let out = run(&["replay", t, "-p", "all", "--jobs", "1", "--quiet"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), table);
    // Never a bar into a pipe: stderr stays empty on a pipe.
    let out =
        run(&["sweep", t, "-p", "pytorch:max_split_size_mb:{64,128}", "--jobs", "2", "--csv"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("rank,policy,config,spec,peak_reserved_bytes,oom_free\n"));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = run(&["report", t, "-p", "bfc", "--out", d, "-j", "1", "-q"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn sweep_and_check_replay_the_device_asked_for() {
    // The Kineto trace has a CUDA device (1, the default: most events) and host memory (-1).
    let k = real_trace("kineto-ddp-v100-rank1.json.gz");
    let k = k.to_str().unwrap();
    let peak = |v: &Value, key: &str| v[key][0]["peak_reserved_bytes"].as_u64().unwrap();
    let host = json(&run(&["replay", k, "-p", "bfc", "--device", "-1", "--json"]));
    let cuda = json(&run(&["replay", k, "-p", "bfc", "--json"]));
    assert_ne!(peak(&host, "results"), peak(&cuda, "results"));
    for (args, want) in [(&["--device", "-1"][..], &host), (&[][..], &cuda)] {
        let mut cmd = vec!["sweep", k, "-p", "bfc", "--json"];
        cmd.extend_from_slice(args);
        let swept = json(&run(&cmd));
        let bfc = swept["results"].as_array().unwrap().iter().find(|r| r["policy"] == "bfc");
        assert_eq!(bfc.unwrap()["peak_reserved_bytes"], want["results"][0]["peak_reserved_bytes"]);
    }
    // A device a trace lacks is a usage error naming that trace.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.json");
    let base = base.to_str().unwrap();
    let out = run(&["check", k, "--baseline", base, "--update", "--device", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("no device 7") && err.contains("kineto-ddp-v100-rank1"), "{err}");
}

/// `--capacity` reads the same in `sweep` as in `replay`: exact units, `none` for unlimited,
/// a one-letter unit refused with both readings; with no flag, each trace's recorded limit, so
/// on a recording that shows none the results are the unlimited ones, and `recorded` is refused
/// as `replay` refuses it there, naming the trace.
#[test]
fn sweep_capacity_reads_as_replay_s() {
    let trace = bundled("gpt-4l-512h.txt");
    let t = trace.to_str().unwrap();
    let sweep =
        |capacity: &str| run(&["sweep", t, "-p", "pytorch", "--capacity", capacity, "--json"]);
    let unlimited = sweep("none");
    assert!(unlimited.status.success(), "{}", stderr(&unlimited));
    let plain = run(&["sweep", t, "-p", "pytorch", "--json"]);
    let (unlimited, plain) = (untimed_sweep(&unlimited), untimed_sweep(&plain));
    assert_eq!(unlimited["results"], plain["results"]);
    assert_eq!(unlimited["ranking"], plain["ranking"]);
    assert_eq!(
        (&unlimited["capacity"], &plain["capacity"]),
        (&Value::from("none"), &Value::from("recorded"))
    );
    for (capacity, says) in [
        ("recorded", "the recording shows no device limit"),
        ("40G", "40GB (40000000000 B) or 40GiB"),
        ("0", "holds no allocation"),
    ] {
        let o = sweep(capacity);
        assert_eq!(o.status.code(), Some(2), "{capacity}");
        assert!(stderr(&o).contains(says), "{capacity}: {}", stderr(&o));
    }
    assert!(stderr(&sweep("recorded")).contains("gpt-4l-512h.txt"), "names the trace");
}

/// A sweep's JSON without its timings.
fn untimed_sweep(o: &std::process::Output) -> Value {
    let mut v: Value = serde_json::from_slice(&o.stdout).unwrap();
    strip_seconds(&mut v);
    v
}

fn strip_seconds(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.ends_with("seconds"));
            m.values_mut().for_each(strip_seconds);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_seconds),
        _ => {}
    }
}

/// `check --update` writes a run into the baseline: the entries it reran are replaced, new ones
/// added, and the entries of policies not run this time kept (and said), so refreshing one
/// policy's numbers never silently drops the others'.
#[test]
fn check_update_keeps_the_entries_it_did_not_rerun() {
    let trace = crate::util::bundled("gpt-4l-512h.txt");
    let t = trace.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.json");
    let b = base.to_str().unwrap();
    let rows = |v: &Value| -> Vec<String> {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["policy"].as_str().unwrap().to_string())
            .collect()
    };
    let read =
        || -> Value { serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap() };
    let out = run(&["check", t, "--baseline", b, "--update", "-p", "pytorch", "-p", "bfc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("wrote the baseline of 2 results"), "{}", stderr(&out));
    // The pytorch entry made 10% worse, then refreshed alone: bfc stays, pytorch is rewritten.
    let mut v = read();
    v["rows"][0]["peak_reserved_bytes"] = 1.into();
    std::fs::write(&base, v.to_string()).unwrap();
    let out = run(&["check", t, "--baseline", b, "--update", "-p", "pytorch", "-p", "buddy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stderr(&out);
    assert!(line.contains("1 replaced, 1 added, 1 kept (not run this time: bfc on"), "{line}");
    let after = read();
    assert_eq!(rows(&after), ["pytorch", "bfc", "buddy"], "replaced in place, added at the end");
    assert_ne!(after["rows"][0]["peak_reserved_bytes"], 1, "the rerun entry is this run's");
    let out = run(&["check", t, "--baseline", b, "-p", "pytorch", "-p", "bfc", "-p", "buddy"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    // A baseline it cannot read is not overwritten: the other entries would be lost.
    std::fs::write(&base, "garbage").unwrap();
    let out = run(&["check", t, "--baseline", b, "--update", "-p", "pytorch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("remove it to record a new baseline"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&base).unwrap(), "garbage");
}
