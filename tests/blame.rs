//! `blame` and `diff`: attribution by allocation site, checked against the replay's own numbers
//! and against a direct walk over the trace.

use crate::util::{real_snapshots, real_trace, run, stderr, stdout};
use fragsim::blame::diff::{self, Side};
use fragsim::blame::{self, BlameOptions, Moment};
use fragsim::policy::PolicySpec;
use fragsim::replay::{run_spec, ReplayInput, ReplayOptions};
use fragsim::trace::sites;
use fragsim::trace::{read_trace, Action, ReadOptions, Trace};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

fn with_frames(path: &Path) -> Trace {
    read_trace(path, &ReadOptions { keep_frames: true, ..ReadOptions::default() })
        .unwrap_or_else(|e| panic!("{e}"))
}

fn json_of(args: &[&str]) -> Value {
    let out = run(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a byte count: {v}"))
}

fn sum(list: &Value, key: &str) -> u64 {
    list.as_array().expect("a list").iter().map(|x| n(&x[key])).sum()
}

/// Every sum `blame --format json` promises, for one result.
fn assert_sums(r: &Value, what: &str) {
    let (live, rounding, free, reserved) = (
        n(&r["live_bytes"]),
        n(&r["rounding_bytes"]),
        n(&r["cached_free_bytes"]),
        n(&r["reserved_bytes"]),
    );
    assert_eq!(live + rounding + free, reserved, "{what}: live + rounding + cached free");
    assert_eq!(sum(&r["sites"], "live_bytes"), live, "{what}: sites' live bytes");
    assert_eq!(sum(&r["sites"], "rounding_bytes"), rounding, "{what}: sites' rounding");
    assert_eq!(sum(&r["holes_by_segment_site"], "cached_free_bytes"), free, "{what}: by segment");
    assert_eq!(
        sum(&r["holes_by_last_free_site"], "cached_free_bytes"),
        free,
        "{what}: by last free"
    );
}

#[test]
fn blame_sums_exactly_on_every_bundled_snapshot_and_reads_the_peaks_replay_reports() {
    for path in real_snapshots() {
        let p = path.to_str().unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let policies =
            ["pytorch", "pytorch-expandable", "bfc", "buddy", "stitch", "nocache", "bound"];
        let mut args = vec!["blame", p, "--format", "json", "--top", "4"];
        for q in &policies {
            args.extend(["-p", q]);
        }
        let blamed = json_of(&args);
        let mut replay = vec!["replay", p, "--json"];
        for q in &policies {
            replay.extend(["-p", q]);
        }
        let replayed = json_of(&replay);
        let peak_of = |policy: &str| {
            let rows = replayed["results"].as_array().unwrap();
            let row = rows.iter().find(|r| r["policy"] == policy).unwrap();
            n(&row["peak_reserved_bytes"])
        };
        let results = blamed["results"].as_array().unwrap();
        assert_eq!(results.len(), policies.len() + 1, "{name}: recorded and every policy");
        assert_eq!(results[0]["policy"], "recorded", "{name}");
        for r in results {
            let policy = r["policy"].as_str().unwrap();
            let what = format!("{name} {policy}");
            assert_sums(r, &what);
            assert_eq!(n(&r["reserved_bytes"]), peak_of(policy), "{what}: reserved at the peak");
            assert_eq!(r["moment"]["kind"], "peak");
            assert!(r["sites"].as_array().unwrap().len() <= 5, "{what}: --top 4 and (other)");
        }
    }
}

#[test]
fn blame_at_every_moment_sums_exactly_and_top_zero_lists_every_site() {
    let p = real_trace("cs336-lm-step-c.pickle");
    let p = p.to_str().unwrap();
    for at in ["peak-live", "100", "peak"] {
        for by in ["site", "function", "file", "stream", "size"] {
            let v =
                json_of(&["blame", p, "--at", at, "--by", by, "--top", "0", "--format", "json"]);
            assert_eq!(v["by"], by);
            for r in v["results"].as_array().unwrap() {
                assert_sums(r, &format!("--at {at} --by {by}"));
                let sites = r["sites"].as_array().unwrap();
                assert!(sites.iter().all(|s| s["site"] != blame::OTHER), "--top 0 folds nothing");
            }
        }
    }
    let csv = run(&["blame", p, "--format", "csv"]);
    assert!(csv.status.success());
    assert!(stdout(&csv).starts_with("policy,config,moment,event,table,site,"));
    let table = run(&["blame", p, "--depth", "2"]);
    assert!(stdout(&table).contains("live, by site"), "{}", stdout(&table));
    let bad = run(&["blame", p, "--at", "never"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("peak-live"), "{}", stderr(&bad));
    let past = run(&["blame", p, "--at", "99999999"]);
    assert_eq!(past.status.code(), Some(2), "{}", stderr(&past));
}

/// The live bytes by site at the first moment live requested bytes peak, by a direct walk over
/// the trace: no policy, no replay engine.
fn walk_peak_live(trace: &Trace, device: i32) -> (u64, u64, HashMap<String, u64>) {
    let events = &trace.device(device).unwrap().events;
    let frees_at = if events.iter().any(|e| e.action == Action::FreeCompleted) {
        Action::FreeCompleted
    } else {
        Action::FreeRequested
    };
    let mut live: HashMap<u64, (u64, String)> = HashMap::new();
    for b in trace.live_at_start(device) {
        let frames = trace.frames.get(trace.frames.block(device, b.addr));
        let site = if frames.is_empty() {
            sites::BEFORE_THE_TRACE.to_string()
        } else {
            sites::site_of(frames)
        };
        live.insert(b.addr, (b.size, site));
    }
    let total = |live: &HashMap<u64, (u64, String)>| live.values().map(|v| v.0).sum::<u64>();
    let mut best = (total(&live), 0u64, live.clone());
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc if e.size > 0 => {
                live.insert(e.addr, (e.size, sites::site_of(trace.frames.get(e.frames))));
            }
            a if a == frees_at => {
                live.remove(&e.addr);
            }
            _ => continue,
        }
        let now = total(&live);
        if now > best.0 {
            best = (now, i as u64, live.clone());
        }
    }
    let mut by_site: HashMap<String, u64> = HashMap::new();
    for (size, site) in best.2.values() {
        *by_site.entry(site.clone()).or_default() += size;
    }
    (best.0, best.1, by_site)
}

#[test]
fn sites_live_bytes_at_peak_live_equal_a_direct_walk_over_the_trace() {
    for name in ["cs336-lm-step-c.pickle", "cs336-medium-ctx512-infer.pickle"] {
        let path = real_trace(name);
        let trace = with_frames(&path);
        let device = trace.default_device().unwrap();
        let (peak, event, want) = walk_peak_live(&trace, device);
        let v = json_of(&[
            "blame",
            path.to_str().unwrap(),
            "--at",
            "peak-live",
            "--top",
            "0",
            "-p",
            "pytorch",
            "-p",
            "bfc",
            "--format",
            "json",
        ]);
        for r in v["results"].as_array().unwrap() {
            let what = format!("{name} {}", r["policy"]);
            assert_eq!(n(&r["moment"]["event"]), event, "{what}");
            assert_eq!(n(&r["live_bytes"]), peak, "{what}");
            let got: HashMap<String, u64> = r["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s["site"].as_str().unwrap().to_string(), n(&s["live_bytes"])))
                .collect();
            assert_eq!(got, want, "{what}");
        }
    }
}

fn replay_row(path: &str, policy: &str) -> Value {
    let v = json_of(&["replay", path, "-p", policy, "--json"]);
    v["results"].as_array().unwrap().iter().find(|r| r["policy"] == policy).unwrap().clone()
}

fn signed(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not a signed byte count: {v}"))
}

/// `diff`'s peaks equal `replay`'s, its deltas their differences, and its site deltas add up
/// to the live delta.
fn assert_diff_matches_replay(d: &Value, (a, pa): (&str, &str), (b, pb): (&str, &str)) {
    let (ra, rb) = (replay_row(a, pa), replay_row(b, pb));
    for (key, live_key) in [
        ("peak_reserved_bytes", "peak_reserved_bytes"),
        ("peak_allocated_bytes", "peak_allocated_bytes"),
        ("peak_live_bytes", "peak_requested_bytes"),
    ] {
        assert_eq!(n(&d["a"][key]), n(&ra[live_key]), "a {key}");
        assert_eq!(n(&d["b"][key]), n(&rb[live_key]), "b {key}");
        let want = n(&rb[live_key]) as i64 - n(&ra[live_key]) as i64;
        assert_eq!(signed(&d["delta"][key]), want, "delta {key}");
    }
    let sites = d["sites"].as_array().unwrap();
    let total: i64 = sites.iter().map(|s| signed(&s["delta_bytes"])).sum();
    assert_eq!(total, signed(&d["delta"]["peak_live_bytes"]), "site deltas add up");
    for s in sites {
        assert_eq!(signed(&s["delta_bytes"]), n(&s["b_bytes"]) as i64 - n(&s["a_bytes"]) as i64);
    }
    let by_delta: Vec<u64> =
        sites.iter().map(|s| signed(&s["delta_bytes"]).unsigned_abs()).collect();
    let folded = sites.last().is_some_and(|s| s["site"] == blame::OTHER);
    let listed = &by_delta[..by_delta.len() - usize::from(folded)];
    assert!(listed.windows(2).all(|w| w[0] >= w[1]), "sorted by |delta|: {listed:?}");
}

#[test]
fn diff_of_two_sizes_of_one_program_equals_the_replays_difference() {
    let a = real_trace("cs336-lm-step-c.pickle");
    let b = real_trace("cs336-lm-step-b.pickle");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let d = json_of(&["diff", a, b, "--format", "json"]);
    assert_diff_matches_replay(&d, (a, "pytorch"), (b, "pytorch"));
    assert!(n(&d["matched_count"]) > 0, "the same program aligns");
    let all = json_of(&["diff", a, b, "--format", "json", "--top", "0"]);
    assert_diff_matches_replay(&all, (a, "pytorch"), (b, "pytorch"));
    let table = run(&["diff", a, b]);
    assert!(stdout(&table).contains("peak reserved"), "{}", stdout(&table));
}

#[test]
fn diff_of_one_trace_under_two_policies_equals_the_replays_difference() {
    let a = real_trace("cs336-lm-step-a.pickle");
    let a = a.to_str().unwrap();
    let d = json_of(&["diff", a, "-p", "pytorch", "-p", "pytorch-expandable", "--format", "json"]);
    assert_diff_matches_replay(&d, (a, "pytorch"), (a, "pytorch-expandable"));
    assert_eq!(signed(&d["delta"]["peak_live_bytes"]), 0, "the same requests");
    assert!(d["matched"].as_array().unwrap().is_empty(), "the same sizes");
    let one = run(&["diff", a, "-p", "pytorch"]);
    assert_eq!(one.status.code(), Some(2), "one trace needs two policies");
}

#[test]
fn the_alignment_matches_scaled_allocations_and_skips_an_inserted_one() {
    let a = with_frames(&real_trace("cs336-lm-step-c.pickle"));
    let device = a.default_device().unwrap();
    let mut b = a.clone();
    let events = &mut b.devices.iter_mut().find(|d| d.device == device).unwrap().events;
    // Double every 7th allocation (and its frees), and insert one more allocation.
    let mut scaled: Vec<u64> = Vec::new();
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut k = 0;
    for (i, e) in events.iter_mut().enumerate() {
        match e.action {
            Action::Alloc if e.size > 0 => {
                k += 1;
                if k % 7 == 0 {
                    e.size *= 2;
                    scaled.push(i as u64);
                }
                sizes.insert(e.addr, e.size);
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(&s) = sizes.get(&e.addr) {
                    e.size = s;
                }
            }
            _ => {}
        }
    }
    let first = events.iter().position(|e| e.action == Action::Alloc).unwrap();
    let mut extra = events[first];
    extra.addr = 0x7fff_0000_0000;
    extra.size = 12345;
    extra.frames = fragsim::trace::FramesId::NONE; // a site no other allocation has
    events.insert(first + 1, extra);
    let (ia, ib) =
        (ReplayInput::new(&a, Some(device)).unwrap(), ReplayInput::new(&b, Some(device)).unwrap());
    let spec = PolicySpec::parse_list("bound").unwrap().remove(0);
    let side = |trace: &str, input| Side { trace: trace.into(), input, spec: spec.clone() };
    let options = BlameOptions { top: 0, ..BlameOptions::default() };
    let d = diff::diff(&side("a", &ia), &side("b", &ib), &options).unwrap();
    assert_eq!(d.alignment, "myers");
    let allocs = a
        .device(device)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc && e.size > 0)
        .count();
    assert_eq!(
        d.matched_count as usize, allocs,
        "every allocation of A matched, the extra one not"
    );
    assert_eq!(d.matched.len(), scaled.len(), "exactly the scaled ones differ");
    for m in &d.matched {
        assert_eq!(m.b_size, 2 * m.a_size, "{m:?}");
        assert!(scaled.contains(&m.a_event), "{m:?}");
        assert_eq!(m.b_event, m.a_event + u64::from(m.a_event > first as u64), "{m:?}");
    }
    let sizes: Vec<u64> = d.matched.iter().map(|m| m.b_size - m.a_size).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest difference first");
}

#[test]
fn attribution_is_the_same_replay_the_engine_runs() {
    // The watched replay makes the policy's decisions unchanged: its peak equals the plain one's.
    let trace = with_frames(&real_trace("cs336-medium-ctx512-infer.pickle"));
    let input = ReplayInput::new(&trace, None).unwrap();
    for name in fragsim::policy::names() {
        let spec = PolicySpec::parse_list(name).unwrap().remove(0);
        let plain = run_spec(&spec, &input, &ReplayOptions::default()).unwrap();
        let last = input.event_count() - 1;
        let (watched, layout) =
            blame::watch(&input, &spec, &ReplayOptions::default(), last).unwrap();
        assert_eq!(watched.result.peak_reserved_bytes, plain.result.peak_reserved_bytes, "{name}");
        assert_eq!(watched.result.device_malloc_count, plain.result.device_malloc_count, "{name}");
        let held: u64 = layout.created.iter().map(|(&a, &(b, _))| b - a).sum();
        assert_eq!(held, plain.result.reserved_at_end_bytes, "{name}: the memory held at the end");
        let at = blame::moment_of(&input, &spec, Moment::Peak, &ReplayOptions::default()).unwrap();
        assert_eq!(at.0, plain.result.peak_event, "{name}");
    }
}

#[test]
fn diff_out_and_report_write_the_attribution_charts() {
    let a = real_trace("cs336-lm-step-c.pickle");
    let b = real_trace("cs336-lm-step-b.pickle");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("diff");
    let o = run(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in
        ["overlay.png", "overlay.svg", "site-delta.png", "site-delta.svg", "diff.html", "diff.json"]
    {
        assert!(out.join(f).is_file(), "{f}");
    }
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("diff.json")).unwrap()).unwrap();
    assert!(n(&json["matched_count"]) > 0, "sites of the two machines' paths compare");
    let report = dir.path().join("report");
    let o = run(&[
        "report",
        a.to_str().unwrap(),
        "-p",
        "pytorch",
        "-p",
        "bfc",
        "--out",
        report.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(
        html.contains("sites.png") && html.contains("flame.svg"),
        "the section and its flame graph"
    );
    let flame = std::fs::read_to_string(report.join("flame.svg")).unwrap();
    assert!(flame.contains("<svg") && flame.contains("bytes"));
}

/// `diff` of a snapshot (frame sites) and a trace without frames (size-class sites) by site
/// says that no site can match, in the table and in JSON; by size class the sites compare and
/// no note is given (#46).
#[test]
fn diff_of_unlike_site_kinds_says_no_site_can_match() {
    let a = real_trace("cs336-lm-step-c.pickle");
    let b = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/gpt-4l-512h.txt");
    let a = a.to_str().unwrap();
    let d = json_of(&["diff", a, b, "--json"]);
    let note = d["note"].as_str().expect("a note on unlike sites");
    assert!(note.contains("A's sites are stack frames and B's are size classes"), "{note}");
    assert!(note.contains("--by size"), "{note}");
    assert_eq!(d["matched_count"], 0, "{d}");
    // Either way round, and in the table.
    let back = json_of(&["diff", b, a, "--json"]);
    assert!(back["note"].as_str().unwrap().contains("A's sites are size classes"), "{back}");
    let o = run(&["diff", a, b]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("note: {note}")), "{}", stdout(&o));
    // Groupings both traces share: no note, and allocations match.
    let by_size = json_of(&["diff", a, b, "--by", "size", "--json"]);
    assert!(by_size.get("note").is_none(), "{by_size}");
    assert!(by_size["matched_count"].as_u64().unwrap() > 0, "{by_size}");
    // Two snapshots: no note.
    let same = json_of(&["diff", a, a, "--json"]);
    assert!(same.get("note").is_none(), "{same}");
}

/// `diff --format csv` holds what the JSON holds: every site delta, then every moved block as a
/// row of its own (`kind` `moved`, from A's site to B's), so a spreadsheet of the CSV adds up as
/// the JSON does: moved rows leave live bytes unchanged.
#[test]
fn diff_csv_lists_the_site_deltas_and_the_moved_blocks() {
    let a = real_trace("cs336-lm-step-a.pickle");
    let b = real_trace("cs336-lm-step-b.pickle");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let json = run(&["diff", a, b, "--json"]);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let d: Value = serde_json::from_slice(&json.stdout).unwrap();
    let moved = d["moved"].as_array().unwrap();
    assert!(!moved.is_empty(), "the two steps move blocks between sites: {d}");
    let csv = run(&["diff", a, b, "--csv"]);
    assert_eq!(csv.status.code(), Some(0), "{}", stderr(&csv));
    let (header, rows) = crate::util::csv_table(&stdout(&csv));
    assert_eq!(
        header,
        ["site", "a_bytes", "b_bytes", "delta_bytes", "only_in", "kind", "to_site", "blocks"]
    );
    let sites = d["sites"].as_array().unwrap();
    assert_eq!(rows.len(), sites.len() + moved.len(), "{rows:?}");
    for (row, s) in rows.iter().zip(sites) {
        let only_in = s["only_in"].as_str().unwrap_or("");
        let want = [
            s["site"].as_str().unwrap().to_string(),
            s["a_bytes"].to_string(),
            s["b_bytes"].to_string(),
            s["delta_bytes"].to_string(),
            only_in.to_string(),
            "site".into(),
            String::new(),
            String::new(),
        ];
        assert_eq!(row[..], want[..]);
    }
    for (row, m) in rows[sites.len()..].iter().zip(moved) {
        let bytes = m["bytes"].to_string();
        let want = [
            m["from_site"].as_str().unwrap().to_string(),
            bytes.clone(),
            bytes,
            "0".into(),
            String::new(),
            "moved".into(),
            m["to_site"].as_str().unwrap().to_string(),
            m["blocks"].to_string(),
        ];
        assert_eq!(row[..], want[..]);
    }
    let delta: i64 = rows.iter().map(|r| r[3].parse::<i64>().unwrap()).sum();
    assert_eq!(delta, d["delta"]["peak_live_bytes"].as_i64().unwrap(), "rows add up as the JSON's");
}

/// `--flamegraph` draws the run the user asked about: with no `-p`, the first run (the recorded
/// one, where the snapshot records its layout); with `-p bfc` or `--pytorch-version`, that
/// policy's replay, whose peak and live bytes the graph's title and root then show.
#[test]
fn the_flame_graph_draws_the_policy_asked_for() {
    let t = real_trace("cs336-lm-step-c.pickle");
    let t = t.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let drawn = |args: &[&str]| {
        let svg = dir.path().join("f.svg");
        let mut all = vec!["blame", t, "-q", "--flamegraph", svg.to_str().unwrap()];
        all.extend(args);
        let o = run(&all);
        assert!(o.status.success(), "{all:?}: {}", stderr(&o));
        let text = std::fs::read_to_string(&svg).unwrap();
        let at = text.find("live bytes at ").unwrap_or_else(|| panic!("no title: {text}"));
        text[at..].split(':').next().unwrap().to_string()
    };
    let bfc = json_of(&["blame", t, "-p", "bfc", "--json"]);
    let results = bfc["results"].as_array().unwrap();
    assert_eq!(results[0]["policy"], "recorded", "the recorded run comes first");
    let event = &results[1]["moment"]["event"];
    assert_eq!(drawn(&["-p", "bfc"]), format!("live bytes at peak (event {event}), bfc"));
    assert!(drawn(&[]).ends_with(", recorded"));
    assert!(drawn(&["--pytorch-version", "2.15"]).ends_with(", pytorch"));
}
