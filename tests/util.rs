//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `fragsim` binary built for these tests.
pub fn fragsim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fragsim"))
}

/// Runs fragsim with `args`, returning its output.
pub fn run(args: &[&str]) -> Output {
    fragsim().args(args).output().expect("fragsim runs")
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `traces/real/NAME`: a real trace (or its notes) shipped with the repository, copied from
/// their authors' repositories with their license notices (`traces/real/README.md`). Panics when
/// the file is missing: it is part of the checkout, so a missing one is a broken checkout, not a
/// reason to skip.
pub fn real_trace(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real").join(name);
    assert!(p.is_file(), "{} is missing: it ships with the repository", p.display());
    p
}

/// Every real PyTorch snapshot in `traces/real/` (the `.pickle` files), sorted by name.
/// Panics when there are none, for the reason [`real_trace`] gives.
pub fn real_snapshots() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (it ships with the repository)", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "{} holds no snapshots: they ship with the repository", dir.display());
    out
}

/// `traces/real/expected-counts.json`: per-trace counts made independently with Python's own
/// `pickle` and `json` modules (`traces/real/README.md`), parsed.
pub fn expected_counts() -> serde_json::Value {
    let path = real_trace("expected-counts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A file in this repository's `traces/` folder.
pub fn bundled(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("traces").join(name)
}

/// Writes `contents` into a fresh temp dir and returns (dir guard, path).
pub fn temp_file(name: &str, contents: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, contents).expect("write temp file");
    (dir, path)
}

/// A `replay --json` or `sweep --json` output without its timings
/// ([`fragsim::whatif::check::TIMINGS`]), which differ from run to run of the same results.
pub fn untimed(mut v: serde_json::Value) -> serde_json::Value {
    for r in v["results"].as_array_mut().expect("results").iter_mut() {
        let r = r.as_object_mut().expect("a result object");
        for key in fragsim::whatif::check::TIMINGS {
            r.remove(*key);
        }
    }
    v
}

/// Splits one CSV line (RFC 4180 quoting) into cells.
pub fn csv_cells(line: &str) -> Vec<String> {
    let (mut cells, mut cell, mut quoted, mut chars) =
        (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cell.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => cells.push(std::mem::take(&mut cell)),
            (c, _) => cell.push(c),
        }
    }
    cells.push(cell);
    cells
}

/// A CSV's header and rows (no field of these outputs holds a line break).
pub fn csv_table(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header = csv_cells(lines.next().expect("a CSV header"));
    (header, lines.map(csv_cells).collect())
}

/// The value at `path` in `v`, a nested key as `parent.key`; `Null` where there is none.
pub fn json_at<'a>(v: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    path.split('.').fold(v, |v, part| &v[part])
}

/// Every scalar key of the object `v`, nested ones as `parent.key`, lists and the keys `skip`
/// names (with what is under them) left out.
pub fn scalar_keys(v: &serde_json::Value, skip: &[&str]) -> Vec<String> {
    fn walk(prefix: &str, v: &serde_json::Value, skip: &[&str], out: &mut Vec<String>) {
        for (k, x) in v.as_object().expect("an object") {
            let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match x {
                _ if skip.contains(&key.as_str()) => {}
                serde_json::Value::Array(_) => {}
                serde_json::Value::Object(_) => walk(&key, x, skip, out),
                _ => out.push(key),
            }
        }
    }
    let mut out = Vec::new();
    walk("", v, skip, &mut out);
    out
}

/// What `replay --format csv` leaves out of a result besides lists (docs/interface.md): the cuda
/// backend's table of call latencies.
pub const CSV_LEFT_OUT: [&str; 1] = ["cuda.device_calls"];

/// Checks that the CSV `text` holds the JSON `entries`, one row each in order: every scalar key
/// of every entry (`skip` aside) is a column, every cell is its entry's value as the JSON writes
/// it (a string unquoted, `null` or a key the entry lacks empty, a float equal as a number), and
/// a column no entry holds is empty throughout. The keys `timed` name (wall-clock timings, which
/// differ between two runs) need only parse as numbers where the entry has them.
pub fn assert_csv_holds_json(
    text: &str,
    entries: &[serde_json::Value],
    skip: &[&str],
    timed: &[&str],
) {
    let (header, rows) = csv_table(text);
    assert_eq!(rows.len(), entries.len(), "one row per entry: {text}");
    for e in entries {
        for key in scalar_keys(e, skip) {
            assert!(header.contains(&key), "{key} is not a CSV column: {header:?}");
        }
    }
    for (row, e) in rows.iter().zip(entries) {
        assert_eq!(row.len(), header.len(), "{row:?}");
        for (key, cell) in header.iter().zip(row) {
            let v = json_at(e, key);
            if timed.contains(&key.as_str()) && !v.is_null() {
                assert!(cell.parse::<f64>().is_ok(), "column {key}: {cell}");
            } else if v.is_f64() {
                // serde_json's default float parsing may be off by one ulp: compare as numbers.
                let (a, b) = (cell.parse::<f64>().unwrap(), v.as_f64().unwrap());
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "column {key}: {a} vs {b}");
            } else {
                let want = match v {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => String::new(),
                    other => other.to_string(),
                };
                assert_eq!(cell, &want, "column {key}");
            }
        }
    }
}

/// Every `.rs` file under the folders `dirs`, at any depth, sorted: the one walk over the sources
/// that the tests reading the code share. Panics on a folder it cannot read, so a missing one
/// is not taken for one without sources.
pub fn rust_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}
