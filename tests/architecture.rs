//! Data flows one way: read → replay → measure → report. Every top-level module of `src/` has a
//! place in [`LAYERS`] and may name only the modules it lists; a grep over the sources checks it
//! for every module, so an import that reaches back up a layer fails here. Test modules (from a
//! file's first `#[cfg(test)]` on, and `tests.rs` files) may drive anything and are not checked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each top-level module and the modules its non-test code may name (`crate::NAME`), lowest
/// layer first. See `docs/architecture.md`.
const LAYERS: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("units", &["error"]),
    // The trace model and its readers and writers.
    ("trace", &["error", "units"]),
    // Memory: the simulated device and the CUDA driver.
    ("backend", &["error", "units"]),
    // What a run measures: plain result types.
    ("metrics", &["backend", "error", "units"]),
    // The recording's own interpretation: its row, its limit, its start.
    ("recorded", &["trace", "metrics", "error", "units"]),
    // The allocator policies; they ask a backend for memory and never name the engine.
    ("policy", &["trace", "backend", "error", "units"]),
    // The one engine.
    ("replay", &["trace", "backend", "metrics", "recorded", "policy", "error", "units"]),
    (
        "validate",
        &["trace", "backend", "metrics", "recorded", "policy", "replay", "error", "units"],
    ),
    ("synth", &["trace", "error", "units"]),
    ("whatif", &["trace", "backend", "metrics", "recorded", "policy", "replay", "error", "units"]),
    // Attribution by call site: watched replays.
    ("blame", &["trace", "backend", "metrics", "recorded", "policy", "replay", "error", "units"]),
    // Why it ran out: one watched replay at the moment and replays of the fixes.
    (
        "explain",
        &["trace", "backend", "metrics", "recorded", "policy", "replay", "blame", "error", "units"],
    ),
    (
        "report",
        &[
            "trace", "backend", "metrics", "recorded", "policy", "replay", "whatif", "blame",
            "error", "units",
        ],
    ),
    // Helpers for tests, benches and fuzz targets.
    ("testing", &["trace", "backend", "metrics", "recorded", "policy", "replay", "error", "units"]),
    // The binary's thin CLI: it may name every module.
    (
        "cli",
        &[
            "trace", "backend", "metrics", "recorded", "policy", "replay", "validate", "synth",
            "whatif", "blame", "explain", "report", "error", "units",
        ],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file of the top-level module `name` (`src/NAME.rs` and `src/NAME/**`).
fn sources(name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let file = src().join(format!("{name}.rs"));
    if file.is_file() {
        out.push(file);
    }
    let dir = src().join(name);
    if dir.is_dir() {
        out.extend(crate::util::rust_files(&[dir]));
    }
    out
}

/// The top-level modules under `src/` (files and folders, `lib.rs` and `main.rs` aside).
fn top_level_modules() -> BTreeSet<String> {
    std::fs::read_dir(src())
        .expect("src/")
        .map(|e| e.expect("a directory entry").path())
        .filter_map(|p| {
            let stem = p.file_stem()?.to_str()?.to_string();
            (p.is_dir() || p.extension().is_some_and(|x| x == "rs")).then_some(stem)
        })
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

/// The modules named as `crate::NAME` in `line`.
fn named(line: &str) -> Vec<&str> {
    line.match_indices("crate::")
        .map(|(i, _)| {
            let rest = &line[i + "crate::".len()..];
            let end =
                rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// The lines of non-test code in `module` that name a module it may not, as `file:line: text`.
fn offending(module: &str, allowed: &[&str]) -> Vec<String> {
    let modules = top_level_modules();
    let files = sources(module);
    assert!(!files.is_empty(), "no sources for module {module}");
    let mut bad = Vec::new();
    for file in files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source");
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let reaches = named(line)
                .into_iter()
                .any(|m| m != module && modules.contains(m) && !allowed.contains(&m));
            // A library module never names the crate by its external name either.
            let external = module != "cli"
                && line.contains("fragsim::")
                && !line.trim_start().starts_with("//");
            if reaches || external {
                bad.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    bad
}

#[test]
fn every_module_names_only_the_layers_below_it() {
    let mut bad = Vec::new();
    for (module, allowed) in LAYERS {
        bad.extend(offending(module, allowed));
    }
    assert!(
        bad.is_empty(),
        "imports against the layering (tests/architecture.rs):\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let placed: BTreeSet<String> = LAYERS.iter().map(|(m, _)| m.to_string()).collect();
    let modules = top_level_modules();
    let unplaced: Vec<_> = modules.difference(&placed).collect();
    let gone: Vec<_> = placed.difference(&modules).collect();
    assert!(unplaced.is_empty(), "modules with no layer in tests/architecture.rs: {unplaced:?}");
    assert!(gone.is_empty(), "layers naming no module: {gone:?}");
}

#[test]
fn the_layers_admit_no_cycle() {
    // A module may name only modules listed before it: the table is an order.
    for (k, (module, allowed)) in LAYERS.iter().enumerate() {
        for a in *allowed {
            let at = LAYERS.iter().position(|(m, _)| m == a);
            assert!(
                at.is_some_and(|at| at < k),
                "{module} may name {a}, which is not a layer below it"
            );
        }
    }
}

#[test]
fn the_check_finds_an_offending_line() {
    // The policies may not name the engine; the engine names the policies: scanning the engine
    // with the policies' permissions must find lines, or the grep checks nothing.
    let policy_allowed = LAYERS.iter().find(|(m, _)| *m == "policy").expect("policy").1;
    assert!(!offending("replay", policy_allowed).is_empty());
    assert_eq!(named("use crate::replay::{a, b}; x(crate::trace::Y)"), ["replay", "trace"]);
}

#[test]
fn the_architecture_page_names_files_that_exist_and_every_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page =
        std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    // Every `src/...`, `tests/...`, `examples/...` or `fuzz/...` path it names exists, so the
    // "adding things" recipes point at real files.
    let mut named = 0;
    for word in page.split(|c: char| c.is_whitespace() || "`()[],;".contains(c)) {
        // Links from docs/ to sources are written `../src/...`.
        let word = word.trim_end_matches(['.', ':']).trim_start_matches("../");
        let Some(rest) =
            ["src/", "tests/", "examples/", "fuzz/"].iter().find(|p| word.starts_with(**p))
        else {
            continue;
        };
        if word.contains(['*']) || word.ends_with('/') && word.len() == rest.len() {
            continue;
        }
        // Placeholders in the recipes (`src/policy/NAME.rs`) name files to create.
        if word.chars().any(|c| c.is_ascii_uppercase()) {
            continue;
        }
        named += 1;
        assert!(
            root.join(word).exists(),
            "docs/architecture.md names {word}, which does not exist"
        );
    }
    assert!(named >= 20, "only {named} paths named: the check reads nothing");
    for (module, _) in LAYERS {
        assert!(
            page.contains(&format!("`{module}`")),
            "docs/architecture.md's layer table does not mention `{module}`"
        );
    }
}
