//! Integration tests: the README's commands work on a fresh clone. Every `traces/...` path in a
//! code block of `README.md`, `docs/guide.md` or `traces/README.md` names a file in the repository,
//! every relative link in `README.md` points at one, and the commands under "Examples on real
//! traces" and the CI recipe run.

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
    for readme in ["README.md", "docs/guide.md", "traces/README.md"] {
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
    // The first command, five real-trace examples, the what-if recipes, the CI recipe, the
    // guide's examples, traces/README.md.
    assert!(seen >= 12, "only {seen} trace paths found: did the code blocks change shape?");
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
        // The file part; `tests/docs.rs` checks the `#anchor` part.
        let file = target.split('#').next().expect("a file part");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
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

/// The CI recipe under "Memory regressions in CI", run as written: its `fragsim` commands in
/// order (the baseline goes to a temp directory), then the check must also fail on a baseline 10%
/// better, as the pipeline would.
#[test]
fn the_readme_ci_recipe_runs() {
    let readme = repo_file("README.md");
    let section = readme
        .split("### ")
        .find(|s| s.starts_with("Memory regressions in CI"))
        .expect("README.md has a section 'Memory regressions in CI'");
    let recipe = section.split("<!-- ci-recipe").nth(1).expect("the recipe's marker");
    let commands: Vec<String> = code_lines(recipe)
        .into_iter()
        .take_while(|(lang, _)| lang == "sh")
        .map(|(_, line)| line.trim().to_string())
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(commands[0].ends_with("--update"), "{commands:?}");
    let dir = tempfile::tempdir().expect("temp dir");
    let baseline = dir.path().join("memory-baseline.json");
    let run_recipe = |command: &str| {
        let mut words = command.split_whitespace();
        assert_eq!(words.next(), Some("fragsim"), "{command}");
        let args: Vec<String> = words
            .map(|w| match w {
                "memory-baseline.json" => baseline.to_string_lossy().into_owned(),
                _ => w.to_string(),
            })
            .collect();
        fragsim().current_dir(env!("CARGO_MANIFEST_DIR")).args(&args).output().expect("runs")
    };
    let out = run_recipe(&commands[0]);
    assert!(out.status.success(), "`{}` failed: {}", commands[0], stderr(&out));
    assert!(baseline.is_file(), "--update wrote no baseline");
    let out = run_recipe(&commands[1]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains(": ok"), "{}", stdout(&out));
    // The pipeline fails when memory got worse than the committed baseline.
    let text = std::fs::read_to_string(&baseline).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let peak = v["rows"][0]["peak_reserved_bytes"].as_u64().unwrap();
    v["rows"][0]["peak_reserved_bytes"] = (peak * 9 / 10).into();
    std::fs::write(&baseline, v.to_string()).unwrap();
    let out = run_recipe(&commands[1]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("peak_reserved_bytes"), "{}", stdout(&out));
}
