//! Every command's answer on the bundled traces, kept byte for byte: `replay -p all`, `info`,
//! `validate`, `blame`, `fit` on every trace in `traces/`, and `diff` and `sweep` on bundled
//! snapshots, each as `--format json` with its timings left out. A change of structure (moving
//! glue into the library, splitting a module) must leave every file in `tests/golden/` as it is.
//!
//! An answer that changes on purpose (a bug fixed, a key added) is written anew with
//! `FRAGSIM_BLESS=1 cargo test --test integration golden::`, and the diff of `tests/golden/` goes
//! into the commit that changed it, where a reviewer reads what moved.

use crate::util::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One command line whose JSON is kept: the file it is kept in, and its arguments.
struct Case {
    name: String,
    args: Vec<String>,
}

/// The traces every command runs on: each file of `traces/` and `traces/real/` that is a trace.
fn traces() -> Vec<PathBuf> {
    let mut out = vec![bundled("gpt-4l-512h.txt")];
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/real");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&real)
        .expect("traces/real")
        .map(|e| e.expect("an entry").path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.ends_with(".pickle") || n.ends_with(".json.gz")
        })
        .collect();
    files.sort();
    out.extend(files);
    out
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let case = |name: String, args: &[&str]| Case {
        name,
        args: args.iter().map(|a| a.to_string()).collect(),
    };
    for t in traces() {
        let n = t.file_name().and_then(|n| n.to_str()).expect("a file name").to_string();
        let p = t.to_str().expect("a UTF-8 path");
        out.push(case(format!("{n}.replay"), &["replay", "-p", "all", "--format", "json", p]));
        out.push(case(format!("{n}.info"), &["info", "--format", "json", p]));
        if n.ends_with(".pickle") {
            out.push(case(format!("{n}.validate"), &["validate", "--format", "json", p]));
            out.push(case(format!("{n}.blame"), &["blame", "--format", "json", p]));
            out.push(case(format!("{n}.fit"), &["fit", "--format", "json", p]));
        }
    }
    let a = real_trace("cs336-lm-step-a.pickle");
    let b = real_trace("cs336-lm-step-b.pickle");
    let c = real_trace("cs336-lm-step-c.pickle");
    let (a, b, c) = (a.to_str().unwrap(), b.to_str().unwrap(), c.to_str().unwrap());
    out.push(case("diff-a-b".into(), &["diff", "--format", "json", a, b]));
    out.push(case("sweep-c".into(), &["sweep", "--format", "json", c]));
    out
}

/// `v` without the keys that time the run (`*_seconds`), which differ from run to run.
fn untimed_everywhere(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(k, _)| !k.ends_with("_seconds"))
                .map(|(k, v)| (k, untimed_everywhere(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(untimed_everywhere).collect()),
        other => other,
    }
}

/// The kept form of a command's output: its JSON, untimed, keys sorted, one key a line, with
/// the checkout's own path taken out so the files read the same in every clone.
fn kept(case: &Case) -> String {
    let out = run(&case.args.iter().map(String::as_str).collect::<Vec<_>>());
    // A check that fails (validate's 1) still answers; only a usage or input error is a failure.
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{:?}: exit {:?}\n{}",
        case.args,
        out.status.code(),
        stderr(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{:?}: not JSON ({e}): {}", case.args, stdout(&out)));
    let text = serde_json::to_string_pretty(&untimed_everywhere(v)).expect("JSON");
    text.replace(env!("CARGO_MANIFEST_DIR"), "$REPO") + "\n"
}

#[test]
fn every_answer_on_the_bundled_traces_is_as_kept() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("FRAGSIM_BLESS").is_some_and(|v| v == "1");
    let cases = &cases();
    // Two at a time: each is a process of its own, and the machines this runs on have two cores.
    let mut answers: Vec<(usize, String)> = Vec::new();
    for pair in (0..cases.len()).collect::<Vec<_>>().chunks(2) {
        std::thread::scope(|s| {
            let handles: Vec<_> =
                pair.iter().map(|&k| (k, s.spawn(move || kept(&cases[k])))).collect();
            for (k, h) in handles {
                answers.push((k, h.join().expect("a case ran")));
            }
        });
    }
    let mut changed = Vec::new();
    for (k, text) in answers {
        let file = dir.join(format!("{}.json", cases[k].name));
        if bless {
            std::fs::create_dir_all(&dir).expect("tests/golden");
            std::fs::write(&file, &text).expect("write a kept answer");
            continue;
        }
        let kept = std::fs::read_to_string(&file).unwrap_or_default();
        if kept != text {
            let line = kept
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(kept.lines().count().min(text.lines().count()));
            changed.push(format!(
                "{} (fragsim {}): first difference at line {}: kept {:?}, now {:?}",
                file.display(),
                cases[k].args.join(" "),
                line + 1,
                kept.lines().nth(line).unwrap_or("(end)"),
                text.lines().nth(line).unwrap_or("(end)"),
            ));
        }
    }
    assert!(
        changed.is_empty(),
        "answers changed (if on purpose, FRAGSIM_BLESS=1 and commit tests/golden/):\n{}",
        changed.join("\n")
    );
}

#[test]
fn the_kept_answers_cover_every_case_and_nothing_else() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut want: Vec<String> = cases().into_iter().map(|c| format!("{}.json", c.name)).collect();
    want.sort();
    let mut have: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned()))
        .map(|it| it.collect())
        .unwrap_or_default();
    have.sort();
    assert_eq!(have, want, "tests/golden/ holds other files than the cases (FRAGSIM_BLESS=1)");
    assert!(want.len() >= 30, "only {} cases: the check keeps little", want.len());
}
