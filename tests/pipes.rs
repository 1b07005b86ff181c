//! A reader that stops early (`fragsim ... | head -1`) ends fragsim quietly with exit code 0, as
//! ripgrep does: the output was wanted only up to there, so a closed pipe is no error.

use crate::util::*;
use std::process::Stdio;

/// Runs fragsim with `args`, its stdout a pipe whose read end is closed before fragsim writes
/// (it is closed at once, while fragsim still reads the trace), and returns its exit code and stderr.
fn run_with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let mut child = fragsim()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fragsim runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("fragsim ends");
    (out.status.code(), stderr(&out))
}

#[test]
fn replay_into_a_closed_pipe_exits_0_without_a_word() {
    let trace = bundled("gpt-4l-512h.txt");
    let trace = trace.to_str().unwrap();
    for format in [None, Some("--json"), Some("--csv")] {
        let mut args = vec!["replay", trace, "-p", "all"];
        args.extend(format);
        let (code, err) = run_with_closed_stdout(&args);
        assert_eq!((code, err.as_str()), (Some(0), ""), "replay {format:?}");
    }
}

#[test]
fn info_into_a_closed_pipe_exits_0_without_a_word() {
    let trace = bundled("gpt-4l-512h.txt");
    for json in [false, true] {
        let mut args = vec!["info", trace.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let (code, err) = run_with_closed_stdout(&args);
        assert_eq!((code, err.as_str()), (Some(0), ""), "info json={json}");
    }
}

/// Runs fragsim with `args` under `sh`, its stdout closed (`>&-`), and returns the exit code and
/// stderr.
#[cfg(unix)]
fn run_with_stdout_shut(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" \"$@\" >&-")
        .arg(env!("CARGO_BIN_EXE_fragsim"))
        .args(args)
        .output()
        .expect("sh runs");
    (out.status.code(), stderr(&out))
}

/// Every command that prints results, in every format it prints, with the inputs it needs.
fn every_printing_command(dir: &std::path::Path) -> Vec<Vec<String>> {
    let t = bundled("gpt-4l-512h.txt").to_string_lossy().into_owned();
    let snapshot = real_trace("cs336-lm-step-c.pickle").to_string_lossy().into_owned();
    let part = dir.join("part.json").to_string_lossy().into_owned();
    let o = run(&["sweep", &t, "-p", "bfc", "--out", &part]);
    assert!(o.status.success(), "{}", stderr(&o));
    let base = dir.join("base.json").to_string_lossy().into_owned();
    let o = run(&["check", &t, "-p", "bfc", "--baseline", &base, "--update", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();
    for f in ["table", "json", "csv"] {
        out.push(s(&["replay", &t, "-p", "bfc", "--format", f]));
        out.push(s(&["sweep", &t, "-p", "bfc", "--format", f]));
        out.push(s(&["merge", &part, "--format", f]));
    }
    for json in [None, Some("--json")] {
        let mut with = |v: Vec<String>| {
            let mut v = v;
            v.extend(json.map(String::from));
            out.push(v);
        };
        with(s(&["info", &t]));
        with(s(&["validate", &snapshot]));
        with(s(&["fit", &t, "-p", "bfc"]));
        with(s(&["check", &t, "-p", "bfc", "--baseline", &base]));
    }
    out
}

#[test]
fn every_command_into_a_closed_pipe_exits_0_without_a_word() {
    let dir = tempfile::tempdir().unwrap();
    for args in every_printing_command(dir.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = run_with_closed_stdout(&args);
        assert_eq!((code, err.as_str()), (Some(0), ""), "{args:?}");
    }
}

#[cfg(unix)]
#[test]
fn every_command_with_stdout_shut_or_full_exits_2_naming_stdout() {
    let dir = tempfile::tempdir().unwrap();
    for args in every_printing_command(dir.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = run_with_stdout_shut(&args);
        assert_eq!(code, Some(2), "{args:?} >&-: {err}");
        assert!(err.starts_with("fragsim: writing to stdout: stdout is closed"), "{args:?}: {err}");
        if std::path::Path::new("/dev/full").exists() {
            let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
            let o = fragsim().args(&args).stdout(full).output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{args:?} >/dev/full: {}", stderr(&o));
            let err = stderr(&o);
            assert!(err.contains("writing") && err.contains("No space left"), "{args:?}: {err}");
        }
    }
    // A command whose output is a file does not need stdout.
    let t = bundled("gpt-4l-512h.txt").to_string_lossy().into_owned();
    let part = dir.path().join("p.json").to_string_lossy().into_owned();
    let (code, err) = run_with_stdout_shut(&["sweep", &t, "-p", "bfc", "--out", &part, "-q"]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
}
