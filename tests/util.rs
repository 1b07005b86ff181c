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

/// `traces/real/NAME`: a real trace shipped with the repository (copied from `../shared/traces/`
/// with its license notice), if present.
pub fn shared_trace(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real").join(name);
    p.exists().then_some(p)
}

/// Every real trace in `traces/real/`.
pub fn shared_traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    out.retain(|p| {
        let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        n.ends_with(".pickle") || n.ends_with(".json.gz")
    });
    out.sort();
    out
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
