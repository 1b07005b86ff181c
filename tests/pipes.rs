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
