//! Data flows one way: read → replay → measure → report. The trace model (`src/trace`) imports
//! none of the layers above it, and policies (`src/policy`) never name the replay engine that
//! drives them. A grep over the sources checks it; test modules (from a file's first
//! `#[cfg(test)]` on) may drive the engine and are not checked.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
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

/// The lines of non-test code under `src/<dir>` that name one of `forbidden`, as `file:line: text`.
fn offending(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let files = sources(&root);
    assert!(!files.is_empty(), "no sources under {}", root.display());
    let mut bad = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable source");
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            if forbidden.iter().any(|f| line.contains(f)) {
                bad.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    bad
}

#[test]
fn the_trace_model_imports_no_layer_above_it() {
    let bad = offending(
        "trace",
        &["crate::replay", "crate::policy", "crate::report", "crate::cli", "fragsim::"],
    );
    assert!(
        bad.is_empty(),
        "src/trace must not depend on replay, policy, report or cli:\n{}",
        bad.join("\n")
    );
}

#[test]
fn policies_never_name_the_replay_engine() {
    let bad = offending("policy", &["crate::replay", "crate::report", "crate::cli"]);
    assert!(
        bad.is_empty(),
        "src/policy must not depend on replay, report or cli:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_finds_an_offending_line() {
    // The same scan over the engine finds its (legitimate) use of the policies: the grep works.
    assert!(!offending("replay", &["crate::policy"]).is_empty());
}
