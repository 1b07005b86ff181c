//! Answers that read right at a glance (issue 35): a CPU profiler trace's host memory shows its
//! real recorded figures and no GPU card or CUDA knob; a warm snapshot says its peak is the start
//! state and reads fragmentation when live bytes peak; the recorded row and a replay count
//! cudaMallocs the same way.

use crate::util::*;
use serde_json::Value;

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// A Kineto trace of host memory as PyTorch's CPU profiler writes it: `Device Type` 0, `Device
/// Id` -1, `Total Reserved` 0 at every event (c10's CPU allocator keeps no cache). Returns the
/// JSON and the recorded peak of `Total Allocated`.
fn cpu_kineto() -> (String, u64) {
    const MIB: i64 = 1 << 20;
    // (address, bytes): positive allocates, negative frees.
    let steps: [(i64, i64); 8] = [
        (0x1000, 4 * MIB),
        (0x2000, 3 * MIB),
        (0x1000, -4 * MIB),
        (0x3000, 8 * MIB),
        (0x4000, MIB),
        (0x2000, -3 * MIB),
        (0x5000, 2 * MIB),
        (0x3000, -8 * MIB),
    ];
    let (mut total, mut peak) = (0i64, 0i64);
    let events: Vec<String> = steps
        .iter()
        .enumerate()
        .map(|(i, (addr, bytes))| {
            total += bytes;
            peak = peak.max(total);
            format!(
                r#"{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": {}, "args": {{"Device Type": 0, "Device Id": -1, "Addr": {addr}, "Bytes": {bytes}, "Total Allocated": {total}, "Total Reserved": 0}}}}"#,
                1000 + 10 * i
            )
        })
        .collect();
    (format!("{{\"traceEvents\": [\n{}\n]}}\n", events.join(",\n")), peak as u64)
}

#[test]
fn a_cpu_profiler_trace_shows_its_recorded_host_memory_and_no_gpu_cards_or_cuda_knobs() {
    let (text, peak) = cpu_kineto();
    assert_eq!(peak, 12 << 20);
    let (_dir, path) = temp_file("cpu.json", text.as_bytes());
    let t = path.to_str().unwrap();

    let v = json(&run(&["replay", t, "-p", "pytorch", "-p", "bound", "--json"]));
    assert_eq!(v["device"], -1);
    let results = v["results"].as_array().unwrap();
    let recorded = results.iter().find(|r| r["policy"] == "recorded").expect("a recorded row");
    assert_eq!(recorded["peak_reserved_bytes"], peak, "{recorded}");
    assert_eq!(recorded["peak_allocated_bytes"], peak, "{recorded}");
    assert_eq!(recorded["fragmentation_at_peak"], 0.0, "{recorded}");
    let bound = results.iter().find(|r| r["policy"] == "bound").unwrap();
    assert_eq!(bound["peak_reserved_bytes"], peak, "no cache: the recording is the bound");

    let out = run(&["replay", t, "-p", "pytorch", "-p", "bound"]);
    let table = stdout(&out);
    let row = table.lines().find(|l| l.starts_with("recorded")).expect(&table);
    assert!(row.contains("12.00 MiB") && !row.contains("0 bytes"), "{table}");
    assert!(!table.contains("-100.0%"), "{table}");
    assert!(table.contains("host memory (device -1)"), "{table}");

    // The peaks chart draws the recorded bar from the report's recorded row: its real height.
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["report", t, "-p", "pytorch", "--out", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let data: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("results.json")).unwrap())
            .unwrap();
    let rows = data["results"].as_array().expect("results");
    let recorded = rows.iter().find(|r| r["policy"] == "recorded").expect("recorded row");
    assert_eq!(recorded["peak_reserved_bytes"], peak, "{recorded}");

    let v = json(&run(&["fit", t, "-p", "pytorch", "--json"]));
    assert_eq!(v["host_memory"], true);
    assert!(v["results"][0]["cards"].as_array().unwrap().is_empty(), "{v}");
    let out = run(&["fit", t, "-p", "pytorch"]);
    let text = stdout(&out);
    assert!(text.contains("cards: none apply") && text.contains("host memory"), "{text}");
    assert!(!text.contains("GB ✓") && !text.contains("GB ✗"), "{text}");

    let out = run(&["sweep", t, "-p", "pytorch", "-p", "pytorch:expandable_segments:True"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!text.contains("export PYTORCH_CUDA_ALLOC_CONF"), "{text}");
    assert!(text.contains("CUDA allocator settings do not apply"), "{text}");
    let v = json(&run(&["sweep", t, "-p", "pytorch", "--json"]));
    assert_eq!(v["host_memory"], true);
    assert!(v["best"]["env"].is_null(), "{v}");
    // A GPU trace still gets its line.
    let k = real_trace("kineto-ddp-v100-rank1.json.gz");
    let out = run(&["sweep", k.to_str().unwrap(), "-p", "pytorch"]);
    assert!(stdout(&out).contains("export PYTORCH_CUDA_ALLOC_CONF="), "{}", stdout(&out));
}

#[test]
fn a_warm_snapshot_says_its_peak_is_the_start_and_reads_fragmentation_when_live_bytes_peak() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let v = json(&run(&["replay", t, "-p", "pytorch", "-p", "bound", "--json"]));
    let of = |p: &str| v["results"].as_array().unwrap().iter().find(|r| r["policy"] == p).cloned();
    let pytorch = of("pytorch").unwrap();
    let recorded = of("recorded").unwrap();
    assert_eq!(pytorch["peak_at_start"], true, "{pytorch}");
    assert_eq!(recorded["peak_at_start"], true, "{recorded}");
    assert_eq!(of("bound").unwrap()["peak_at_start"], false);
    // The recovered cache is 90% free at the start; when live bytes peak, 1.8% is.
    let at_peak = pytorch["fragmentation_at_peak"].as_f64().unwrap();
    let at_live = pytorch["fragmentation_at_peak_allocated"].as_f64().unwrap();
    assert!(at_peak > 0.8 && at_live < 0.05, "{pytorch}");
    let (reserved, allocated) = (
        pytorch["peak_reserved_bytes"].as_u64().unwrap(),
        pytorch["peak_allocated_bytes"].as_u64().unwrap(),
    );
    assert!((at_live - (1.0 - allocated as f64 / reserved as f64)).abs() < 1e-9, "{pytorch}");
    assert!(pytorch["peak_allocated_event"].as_u64().unwrap() > 0, "{pytorch}");

    let table = stdout(&run(&["replay", t, "-p", "pytorch", "-p", "bound"]));
    assert!(table.lines().next().unwrap().contains("frag@live peak"), "{table}");
    let row = table.lines().find(|l| l.starts_with("pytorch")).unwrap();
    assert!(row.contains("1.8%") && !row.contains("90.3%"), "{table}");
    let note = table.lines().find(|l| l.starts_with("peak at start:")).expect(&table);
    assert!(note.contains("recorded, pytorch") && !note.contains("bound"), "{table}");

    // A trace that starts empty peaks later, and says nothing of it.
    let cold = bundled("gpt-4l-512h.txt");
    let v = json(&run(&["replay", cold.to_str().unwrap(), "-p", "pytorch", "--json"]));
    assert_eq!(v["results"][0]["peak_at_start"], false);
    let table = stdout(&run(&["replay", cold.to_str().unwrap(), "-p", "pytorch"]));
    assert!(!table.contains("peak at start"), "{table}");
}

#[test]
fn the_recorded_row_and_a_replay_count_cudamallocs_the_same_way() {
    for path in real_snapshots() {
        let t = path.to_str().unwrap();
        let v = json(&run(&["replay", t, "-p", "pytorch", "--json"]));
        let of = |p: &str| v["results"].as_array().unwrap().iter().find(|r| r["policy"] == p);
        let (pytorch, recorded) = (of("pytorch").unwrap(), of("recorded").unwrap());
        let n = |r: &Value, k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{t}: {k}: {r}"));
        // The segments held before the first event: counted by the replay that places them,
        // and by the recorded row beside its recorded segment_alloc events.
        assert_eq!(n(pytorch, "start_malloc_count"), n(recorded, "start_malloc_count"), "{t}");
        assert_eq!(
            n(pytorch, "device_malloc_count"),
            n(recorded, "device_malloc_count") + n(recorded, "start_malloc_count"),
            "{t}"
        );
        let table = stdout(&run(&["replay", t, "-p", "pytorch"]));
        // The cell under the right-aligned "mallocs" header, in a row.
        let mallocs = |label: &str| -> String {
            let header = table.lines().next().unwrap();
            let end = header.find("mallocs").unwrap() + "mallocs".len();
            let row = table.lines().find(|l| l.starts_with(label)).unwrap();
            row[..end].split_whitespace().last().unwrap().to_string()
        };
        assert_eq!(mallocs("recorded"), mallocs("pytorch"), "{t}\n{table}");
    }
}
