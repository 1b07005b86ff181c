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
