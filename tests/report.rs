//! `fragsim report`: the files it writes exist, are valid, and say what `replay` says.

use crate::util::*;
use std::path::Path;

/// A small text trace with times: two blocks live together (4096 + 1000 bytes), then a third
/// after the first is freed. Peak live requested bytes: 4096 + 1000 = 5096.
const SMALL: &str = "# fragsim text trace v1\n\
    alloc 0x1000 4096 s0 @1000000\n\
    alloc 0x3000 1000 s0 @1250000\n\
    free 0x1000 4096 s0 @1500000\n\
    alloc 0x5000 3000 s0 @1750000\n\
    free 0x3000 1000 s0 @2000000\n\
    free 0x5000 3000 s0 @2500000\n";

const CHARTS: [&str; 5] = ["timeline", "peaks", "fragmentation", "segments", "sizes"];

/// Checks the PNG signature and reads the IHDR width and height.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(b.len() > 2000, "{} is only {} bytes", path.display(), b.len());
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

/// Parses each SVG with Python's XML parser (python3 is on CI), or, without python3, checks
/// that it is one `<svg>` element.
fn assert_svgs_parse(dir: &Path) {
    let files: Vec<String> =
        CHARTS.iter().map(|c| dir.join(format!("{c}.svg")).display().to_string()).collect();
    let script = "import sys, xml.etree.ElementTree as E\n\
                  for f in sys.argv[1:]:\n    r = E.parse(f).getroot()\n    \
                  assert r.tag.endswith('svg'), f\nprint('ok')";
    match std::process::Command::new("python3").arg("-c").arg(script).args(&files).output() {
        Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            for f in &files {
                let s = std::fs::read_to_string(f).unwrap();
                assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{f}");
            }
        }
    }
}

/// Every `src="..."` and `href="..."` in the page names a file in `dir`.
fn assert_html_links_exist(dir: &Path) -> Vec<String> {
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    let mut links = Vec::new();
    for attr in ["src=\"", "href=\""] {
        for part in html.split(attr).skip(1) {
            let link = part.split('"').next().unwrap().to_string();
            assert!(!link.contains("://") && !link.starts_with('/'), "external link {link}");
            assert!(dir.join(&link).is_file(), "index.html links {link}, which is missing");
            links.push(link);
        }
    }
    links
}

/// Checks that results.json equals `replay --json` on the same trace and policies, and that
/// results.csv holds the same numbers under the same keys. Returns the JSON.
fn assert_results_agree_with_replay(trace: &Path, dir: &Path) -> serde_json::Value {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let mut args = vec!["replay".to_string(), trace.display().to_string(), "--json".into()];
    // The report ran each policy by its bare name (its defaults), as `replay --policy NAME` does.
    // The recorded run is read from the file, not a policy: replay adds it by itself.
    for r in json["results"].as_array().unwrap().iter().filter(|r| r["policy"] != "recorded") {
        args.push("--policy".into());
        args.push(r["policy"].as_str().unwrap().to_string());
    }
    let o = fragsim().args(&args).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let replayed: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(untimed(json.clone()), untimed(replayed));

    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let results = json["results"].as_array().unwrap();
    let (header, _) = csv_table(&csv);
    let keys: Vec<String> = results[0].as_object().unwrap().keys().cloned().collect();
    assert!(keys.iter().all(|k| header.contains(k)), "every JSON key is a CSV column: {header:?}");
    assert_csv_holds_json(&csv, results, &CSV_LEFT_OUT, &["replay_seconds", "planning_seconds"]);
    json
}

#[test]
fn report_on_a_small_trace_writes_valid_files_that_agree_with_replay() {
    let (dir, trace) = temp_file("small.txt", SMALL.as_bytes());
    let out = dir.path().join("out/report");
    let o = run(&["report", trace.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for chart in CHARTS {
        let (w, h) = png_size(&out.join(format!("{chart}.png")));
        assert!((1200..=2000).contains(&w) && (200..=4000).contains(&h), "{chart}: {w}x{h}");
    }
    assert_svgs_parse(&out);
    let links = assert_html_links_exist(&out);
    for chart in CHARTS {
        assert!(links.contains(&format!("{chart}.png")), "index.html shows {chart}.png");
    }
    let json = assert_results_agree_with_replay(&trace, &out);
    assert_eq!(json["format"], "text");
    assert_eq!(json["events"], 9); // 3 allocs + 3 frees, each free = requested + completed
    let bound = json["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["policy"] == "bound")
        .expect("bound always runs");
    assert_eq!(bound["peak_reserved_bytes"], 5096);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("| bound |") && md.contains("4.98 KiB"), "{md}");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains(env!("CARGO_PKG_VERSION")) && html.contains("free_completed: 3"));
}

#[test]
fn named_policies_and_segment_map_placeholder() {
    let (dir, trace) = temp_file("small.txt", SMALL.as_bytes());
    let out = dir.path().join("r");
    let o = run(&[
        "report",
        trace.to_str().unwrap(),
        "--policy",
        "bound",
        "--segment-map-policy",
        "bound",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["results"].as_array().unwrap().len(), 1);
    // bound shows each live block as its own segment: the map is drawn, no placeholder.
    png_size(&out.join("segments.png"));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(!html.contains("reports no segments"), "{html}");

    // A policy that holds nothing at its peak (only a zero-byte request, which never reaches
    // an allocator): the chart says so instead of failing.
    let (dir, trace) = temp_file("zero.txt", b"alloc 0x10 0 s0\nfree 0x10 0 s0\n");
    let out = dir.path().join("r");
    let o = run(&[
        "report",
        trace.to_str().unwrap(),
        "--policy",
        "bound",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    png_size(&out.join("segments.png"));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("none of the replayed policies (bound) reports its segments"), "{html}");
}

#[test]
fn bad_usage_fails_before_writing() {
    let (dir, trace) = temp_file("small.txt", SMALL.as_bytes());
    let out = dir.path().join("never");
    let o = run(&[
        "report",
        trace.to_str().unwrap(),
        "--policy",
        "tlsf",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown policy 'tlsf'"), "{}", stderr(&o));
    assert!(!out.exists());
    let o = run(&["report", trace.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "--out is required");
}

/// Real traces (`traces/real/README.md`): a PyTorch snapshot (device 0, 4,998 entries) and
/// a Kineto trace (CUDA device 1, 26,770 memory events; host memory is device -1).
#[test]
fn report_on_real_traces() {
    for (name, format, device, events) in [
        ("cs336-medium-ctx512-infer.pickle", "pytorch-snapshot", 0, 4998),
        ("kineto-ddp-v100-rank1.json.gz", "kineto", 1, 26770),
    ] {
        let trace = real_trace(name);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("r");
        let o = run(&["report", trace.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        for chart in CHARTS {
            png_size(&out.join(format!("{chart}.png")));
            let svg = std::fs::metadata(out.join(format!("{chart}.svg"))).unwrap().len();
            assert!(svg < 4 << 20, "{name}: {chart}.svg is {svg} bytes");
        }
        assert_svgs_parse(&out);
        assert_html_links_exist(&out);
        let json = assert_results_agree_with_replay(&trace, &out);
        assert_eq!(json["format"], format);
        assert_eq!(json["device"], device);
        assert_eq!(json["events"], events);
        assert_recorded_everywhere(name, &out, &json);
    }
}

/// Both real traces record the allocator's own figures: the `recorded` run is the first row of
/// summary.md and index.html (with a `vs recorded` column), a band in the timeline's legend and
/// a bar in the peaks chart, with the peak `results.json` gives. Neither file shows the path.
fn assert_recorded_everywhere(name: &str, out: &Path, json: &serde_json::Value) {
    let results = json["results"].as_array().unwrap();
    let recorded = results.iter().find(|r| r["policy"] == "recorded").expect(name);
    let peak = fragsim::units::format_bytes(recorded["peak_reserved_bytes"].as_u64().unwrap());
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    let table: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
    assert!(table[0].ends_with("| vs recorded |"), "{name}: {}", table[0]);
    assert!(table[2].starts_with(&format!("| recorded | {peak} |")), "{name}: {}", table[2]);
    assert_eq!(table.len(), 2 + 1 + results.len() - 1, "{name}: one row per run");
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("<th title=\"peak reserved over the recorded peak, %\">vs recorded</th>"));
    assert!(html.contains(&format!("<tr><td>recorded</td><td class=\"n\">{peak}</td>")), "{name}");
    let timeline = std::fs::read_to_string(out.join("timeline.svg")).unwrap();
    assert!(timeline.contains(&format!("recorded ({peak})")), "{name}: legend entry");
    assert!(timeline.contains(&format!("recorded {peak} peak")), "{name}: peak label");
    let peaks = std::fs::read_to_string(out.join("peaks.svg")).unwrap();
    assert!(peaks.contains("what the recorded run reserved"), "{name}");
    let trace = real_trace(name);
    let full = trace.to_str().unwrap();
    assert!(full.contains('/') && !md.contains(full) && !html.contains(full), "{name}");
    assert!(md.contains(&format!("Trace `{name}`")), "{name}");
}

/// A long trace (100,000 allocations, each freed 50 allocations later) makes charts of bounded
/// size: every series is down-sampled to a few thousand points, peaks kept.
#[test]
fn a_long_trace_makes_small_files() {
    let mut text = String::from("# fragsim text trace v1\n");
    let n: u64 = 100_000;
    for i in 0..n {
        // Sizes cycle through 1..=4 MiB in 1 KiB steps; time advances 10 µs per event.
        let size = (1 << 20) + (i * 7919 % 3072) * 1024;
        text += &format!("alloc {:#x} {size} s0 @{}\n", 0x1000_0000 + i * 0x40_0000, i * 20);
        if i >= 50 {
            let j = i - 50;
            let size_j = (1 << 20) + (j * 7919 % 3072) * 1024;
            text +=
                &format!("free {:#x} {size_j} s0 @{}\n", 0x1000_0000 + j * 0x40_0000, i * 20 + 10);
        }
    }
    let (dir, trace) = temp_file("long.txt", text.as_bytes());
    let out = dir.path().join("r");
    let o = run(&["report", trace.to_str().unwrap(), "-p", "bound", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for chart in CHARTS {
        for ext in ["png", "svg"] {
            let len = std::fs::metadata(out.join(format!("{chart}.{ext}"))).unwrap().len();
            assert!(len < 1 << 20, "{chart}.{ext} is {len} bytes");
        }
    }
    assert_svgs_parse(&out);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["events"], 100_000 + 2 * (100_000 - 50));
}

#[test]
fn a_time_far_back_lies_on_the_time_axis_and_is_drawn_in_bounded_time() {
    // The last event's time is a tenth of the others' (as a text line cut short leaves it): the
    // time axis spans the earliest to the latest time, so every point lies on the plot and
    // drawing walks its pixels, not the billions of pixels a point off the axis would be away.
    let mut t = String::from("# fragsim text trace v1\n");
    for i in 0..50u64 {
        t += &format!(
            "alloc {:#x} 4096 s0 @{}\n",
            0x1000_0000 + i * 4096,
            1_767_225_600_000_000 + i
        );
    }
    t += "alloc 0x20000000 4096 s0 @176722560000000\n";
    let (dir, trace) = temp_file("backwards.txt", t.as_bytes());
    let out = dir.path().join("report");
    let mut child = fragsim()
        .args(["report", trace.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("fragsim runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("report still drawing after 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "report exits 0: {status}");
    let (w, h) = png_size(&out.join("timeline.png"));
    assert!(w >= 1200 && h >= 200, "{w}x{h}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["events"], 51, "{json}");
}
