//! Integration tests: the README's commands work on a fresh clone. Every `traces/...` path in a
//! code block of `README.md` or `traces/README.md` names a file in the repository, every relative
//! link in `README.md` points at one, and the commands under "Examples on real traces" run.

use crate::util::*;
use std::path::Path;

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines inside the fenced code blocks of `markdown`, each with the block's language tag.
fn code_lines(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lang: Option<String> = None;
    for line in markdown.lines() {
        match (&lang, line.trim_start().strip_prefix("```")) {
            (None, Some(tag)) => lang = Some(tag.trim().to_string()),
            (Some(_), Some(_)) => lang = None,
            (Some(l), None) => out.push((l.clone(), line.to_string())),
            (None, None) => {}
        }
    }
    assert!(lang.is_none(), "an unclosed code block");
    out
}

#[test]
fn every_trace_path_in_the_readmes_is_in_the_repository() {
    let mut seen = 0;
    for readme in ["README.md", "traces/README.md"] {
        for (_, line) in code_lines(&repo_file(readme)) {
            for word in line.split_whitespace().filter(|w| w.starts_with("traces/")) {
                let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(word);
                assert!(
                    path.is_file(),
                    "{readme}: `{line}` names {word}, which is not in the repository"
                );
                seen += 1;
            }
        }
    }
    // The first command, five real-trace examples, the custom policy example, traces/README.md.
    assert!(seen >= 7, "only {seen} trace paths found: did the code blocks change shape?");
}

#[test]
fn every_relative_link_in_the_readme_is_in_the_repository() {
    let readme = repo_file("README.md");
    let mut seen = 0;
    for (i, _) in readme.match_indices("](") {
        let rest = &readme[i + 2..];
        let target = &rest[..rest.find(')').expect("a closed link")];
        if target.contains("://") || target.starts_with('#') {
            continue;
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(target);
        assert!(path.exists(), "README.md links {target}, which is not in the repository");
        seen += 1;
    }
    assert!(seen >= 2, "README.md links docs/interface.md and docs/peaks.png");
}

/// The block under "Examples on real traces", run as written (its `/tmp/` output goes to a temp
/// directory instead).
#[test]
fn the_readme_examples_on_real_traces_run() {
    let readme = repo_file("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Examples on real traces"))
        .expect("README.md has a section 'Examples on real traces'");
    let dir = tempfile::tempdir().expect("temp dir");
    let commands: Vec<String> = code_lines(section)
        .into_iter()
        .filter(|(lang, _)| lang == "sh")
        .map(|(_, line)| line)
        .collect();
    assert!(commands.len() >= 5, "{commands:?}");
    for command in &commands {
        let mut words = command.split_whitespace();
        assert_eq!(words.next(), Some("fragsim"), "{command}");
        let args: Vec<String> = words
            .map(|w| match w.strip_prefix("/tmp/") {
                Some(name) => dir.path().join(name).to_string_lossy().into_owned(),
                None => w.to_string(),
            })
            .collect();
        let out =
            fragsim().current_dir(env!("CARGO_MANIFEST_DIR")).args(&args).output().expect("runs");
        assert!(out.status.success(), "`{command}` failed: {}", stderr(&out));
        assert!(
            !stdout(&out).is_empty() || command.contains("convert"),
            "`{command}` printed nothing"
        );
    }
}
