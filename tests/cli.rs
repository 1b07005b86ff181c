//! The command line as users and scripts run it.

use crate::util::*;

#[test]
fn replay_bound_on_a_text_trace_prints_the_live_peak() {
    let (_d, path) =
        temp_file("t.txt", b"alloc 0x1000 4096 s0\nalloc 0x2000 1000 s0\nfree 0x1000 4096 s0\n");
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["results"][0]["policy"], "bound");
    assert_eq!(v["results"][0]["peak_reserved_bytes"], 5096);
    assert_eq!(v["format"], "text");
    assert_eq!(v["events"], 4);
}

#[test]
fn format_flag_and_its_aliases_print_the_same_output() {
    let trace = bundled("gpt-4l-512h.txt");
    let t = trace.to_str().unwrap();
    let out = |args: &[&str]| {
        let mut argv = vec!["replay", t, "-p", "bound", "-p", "nocache"];
        argv.extend_from_slice(args);
        let o = run(&argv);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        // Everything but the timings, which differ from run to run.
        let text = stdout(&o);
        let timing =
            |l: &str| l.contains("\"replay_seconds\"") || l.contains("\"planning_seconds\"");
        let lines = text.lines().filter(|l| !timing(l));
        let csv = args.contains(&"csv") || args.contains(&"--csv");
        if !csv {
            return lines.collect::<Vec<_>>().join("\n");
        }
        let (header, rows) = csv_table(&text);
        let kept: Vec<usize> = (0..header.len())
            .filter(|&i| !["replay_seconds", "planning_seconds"].contains(&header[i].as_str()))
            .collect();
        let keep = |row: &[String]| kept.iter().map(|&i| row[i].clone()).collect::<Vec<_>>();
        std::iter::once(keep(&header))
            .chain(rows.iter().map(|r| keep(r)))
            .map(|r| r.join(","))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let json = out(&["--format", "json"]);
    assert!(json.starts_with('{') && json.contains("\"results\""), "{json}");
    assert_eq!(out(&["--json"]), json);
    let csv = out(&["--format", "csv"]);
    assert!(csv.starts_with("policy,config,"), "{csv}");
    assert_eq!(out(&["--csv"]), csv);
    let table = out(&["--format", "table"]);
    assert!(table.starts_with("policy "), "{table}");
    assert_eq!(out(&[]), table);
    let o = run(&["replay", t, "--json", "--format", "csv"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn unknown_policy_is_a_usage_error_listing_the_accepted_ones() {
    let (_d, path) = temp_file("t.txt", b"alloc 0x1000 4096 s0\n");
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "tlsf"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown policy 'tlsf'") && stderr(&o).contains("bound"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unreadable_input_names_the_file() {
    let (_d, path) = temp_file("junk.bin", b"\x00\x01\x02 not a trace");
    let o = run(&["replay", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("junk.bin") && stderr(&o).contains("unrecognised trace format"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn capacity_makes_the_first_request_that_does_not_fit_an_oom() {
    // Live: 4 MiB, then 4 MiB + (1 MiB + 1) > 5 MiB: event 1 fails; its free is then ignored,
    // and the third alloc (after the first is freed) fits again.
    let (_d, path) = temp_file(
        "t.txt",
        b"alloc 0x1000 4194304 s0\nalloc 0x600000 1048577 s3\nfree 0x600000 1048577 s3\n\
          free 0x1000 4194304 s0\nalloc 0x800000 5138022 s0\n",
    );
    let path = path.to_str().unwrap();
    let o = run(&["replay", path, "--policy", "bound", "--capacity", "5MiB", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let r = &v["results"][0];
    assert_eq!(r["oom"], true);
    assert_eq!(r["first_oom_event"], 1);
    assert_eq!(r["peak_reserved_bytes"], 5138022);
    assert_eq!(r["device_malloc_count"], 2);
    let d = &r["first_oom"];
    assert_eq!(d["event"], 1);
    assert_eq!(d["size"], 1048577);
    assert_eq!(d["stream"], 3);
    assert_eq!(d["capacity_bytes"], 5 << 20);
    assert_eq!(d["reserved_bytes"], 4 << 20);
    assert_eq!(d["free_bytes"], 1 << 20);

    let o = run(&["replay", path, "--policy", "bound", "--capacity", "5MiB"]);
    let out = stdout(&o);
    assert!(out.starts_with("capacity: 5MiB (0.00 GiB)\n"), "{out}");
    assert!(
        out.contains(
            "bound: out of memory at event 1: tried to allocate 1.00 MiB on stream 3; \
             capacity 5.00 MiB of which 1.00 MiB is free"
        ),
        "{out}"
    );
}

#[test]
fn a_capacity_without_a_unit_is_refused_with_a_suggestion() {
    let (_d, path) = temp_file("t.txt", b"alloc 0x1000 4096 s0\n");
    let o = run(&["replay", path.to_str().unwrap(), "--capacity", "40"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("40GB") && stderr(&o).contains("40GiB"), "{}", stderr(&o));
}

#[test]
fn the_empty_cache_what_if_lowers_pytorchs_peak_on_the_bundled_trace() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/gpt-4l-512h.txt");
    let o = run(&["replay", trace, "-p", "pytorch", "--empty-cache-every", "100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out.lines().find(|l| l.trim_start().starts_with("pytorch: ")).unwrap_or("");
    assert!(line.contains("peak reserved 2.04 GiB → 1.44 GiB"), "{out}");
    assert!(line.contains("device mallocs +16, frees +30"), "{out}");
    // The JSON holds the what-if's run, lower than the run without it.
    let json = |extra: &[&str]| {
        let mut args = vec!["replay", trace, "-p", "pytorch", "--json"];
        args.extend_from_slice(extra);
        let v: serde_json::Value = serde_json::from_str(&stdout(&run(&args))).unwrap();
        v["results"][0]["peak_reserved_bytes"].as_u64().unwrap()
    };
    let plain = json(&[]);
    let flushed = json(&["--empty-cache-every", "100"]);
    assert!(flushed < plain, "{flushed} < {plain}");
    // Flushing at every event of a list, or dropping the recorded calls, also runs.
    assert!(json(&["--empty-cache-at", "10,500,2000"]) <= plain);
    assert!(json(&["--no-recorded-empty-cache"]) >= plain);
}

#[test]
fn csv_header_is_the_json_keys() {
    let (_d, path) = temp_file("t.txt", b"alloc 0x1000 4096 s0\n");
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert!(lines.next().unwrap().starts_with("policy,config,peak_reserved_bytes,"));
    assert!(lines.next().unwrap().starts_with("bound,,4096,4096,4096,4096,0.0,0,1,0,"));
}

/// `replay --format csv` carries every scalar key of a JSON result: a start state cut to fit
/// under a limit (`start_state`, nested, as `start_state.KEY`), the GPU memory a fraction
/// assumed and the first OOM's detail, with the values the JSON has for the same run.
#[test]
fn replay_csv_carries_every_scalar_key_of_the_json_results() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let run_as = |format: &str| {
        let o = run(&[
            "replay",
            t,
            "--capacity",
            "16GiB",
            "-p",
            "pytorch:per_process_memory_fraction:0.5",
            "-p",
            "pytorch:per_process_memory_fraction:0",
            "-p",
            "bfc",
            "--format",
            format,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let json: serde_json::Value = serde_json::from_str(&run_as("json")).unwrap();
    let results = json["results"].as_array().unwrap();
    let csv = run_as("csv");
    let (header, rows) = csv_table(&csv);
    for key in ["start_state.bytes", "start_state.installed_bytes", "gpu_memory_bytes"] {
        assert!(header.iter().any(|h| h == key), "{key}: {header:?}");
    }
    // The run shows what the columns are for: both fractions cut the start state, and assumed
    // a GPU of the capacity's size; bfc holds neither key.
    let column = |key: &str| header.iter().position(|h| h == key).unwrap();
    for (row, r) in rows.iter().zip(results) {
        let cut = r["config"].as_str().unwrap_or("").contains("per_process_memory_fraction");
        assert_eq!(!row[column("start_state.bytes")].is_empty(), cut, "{row:?}");
        assert_eq!(r.get("start_state").is_some(), cut, "{r}");
        if cut {
            assert_eq!(row[column("gpu_memory_bytes")], (16u64 << 30).to_string());
        }
    }
    assert_csv_holds_json(&csv, results, &CSV_LEFT_OUT, &["replay_seconds", "planning_seconds"]);
}

/// `info --format csv` is one row per device with the numbers `info --json` has for it;
/// `--csv` is its alias, and `--json` is `--format json`.
#[test]
fn info_csv_is_a_row_per_device_agreeing_with_the_json() {
    let trace = real_trace("kineto-ddp-v100-rank1.json.gz");
    let t = trace.to_str().unwrap();
    let out = |args: &[&str]| {
        let mut argv = vec!["info", t];
        argv.extend_from_slice(args);
        let o = run(&argv);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let json = out(&["--json"]);
    assert_eq!(out(&["--format", "json"]), json);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let devices = v["devices"].as_array().unwrap();
    assert!(devices.len() > 1, "a trace of several devices: {json}");
    let csv = out(&["--format", "csv"]);
    assert_eq!(out(&["--csv"]), csv);
    let (header, rows) = csv_table(&csv);
    assert_eq!(&header[..2], ["device", "events"], "{csv}");
    assert!(header.iter().any(|h| h == "by_action.alloc"), "{csv}");
    let listed: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let want: Vec<String> = devices.iter().map(|d| d["device"].to_string()).collect();
    assert_eq!(listed, want, "{csv}");
    // The start figures are filled in, as in the JSON.
    assert!(rows
        .iter()
        .all(|r| !r[header.iter().position(|h| h == "live_at_start_bytes").unwrap()].is_empty()));
    assert_csv_holds_json(&csv, devices, &[], &[]);
    let o = run(&["info", t, "--json", "--format", "csv"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn an_address_reused_while_live_frees_the_old_block_first() {
    // The second alloc at 0x10 shows that the first block was freed (its free was not
    // recorded): it is freed before the new malloc, so live bytes never exceed 200.
    let (_d, path) = temp_file(
        "t.txt",
        b"alloc 0x10 100 s0\nalloc 0x10 200 s0\nfree 0x10 200 s0\nfree 0x99 7 s0\n",
    );
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let r = &v["results"][0];
    // 0x99 is an orphan free: live (7 bytes) from the start.
    assert_eq!(r["peak_requested_bytes"], 207);
    assert_eq!(r["peak_reserved_bytes"], 207);
    assert_eq!(r["reserved_at_end_bytes"], 0);
    assert_eq!(r["device_malloc_count"], 3);
    assert_eq!(r["device_free_count"], 3);
}

#[test]
fn offline_reports_its_planning_time_on_its_own() {
    let trace = bundled("gpt-4l-512h.txt");
    let o = run(&["replay", trace.to_str().unwrap(), "-p", "offline", "-p", "pytorch", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for r in v["results"].as_array().unwrap() {
        let replay = r["replay_seconds"].as_f64().unwrap();
        match r["policy"].as_str().unwrap() {
            "offline" => {
                let planning = r["planning_seconds"].as_f64().expect("offline plans");
                assert!(planning > 0.0 && planning <= replay, "{r}");
            }
            _ => assert!(r.get("planning_seconds").is_none(), "an online policy plans: {r}"),
        }
    }
}
