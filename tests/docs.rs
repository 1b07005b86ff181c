//! Integration tests: the documentation a clone holds is the documentation the code cites.
//!
//! Comments in the code explain a rule by pointing at a section of `docs/` (for example
//! `docs/pytorch-model.md#split-rule`); a reader of a fresh clone must be able to follow every
//! such pointer. So: no `§` section numbers and no file outside the repository are cited in
//! `src/`, `tests/`, `benches/` or `examples/`, every cited `docs/*.md` file and `#anchor` exists,
//! and every relative link in `README.md` and `docs/*.md` resolves, anchors included.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file of the code (`src/`, `tests/`, `benches/`, `examples/`) but this one, which
/// names what it forbids and shows what it parses, sorted.
fn sources() -> Vec<PathBuf> {
    let this = root().join("tests/docs.rs");
    let files = rust_files(&["src", "tests", "benches", "examples"]);
    files.into_iter().filter(|f| *f != this).collect()
}

/// Every `.rs` file under the given folders of the repository, sorted.
fn rust_files(dirs: &[&str]) -> Vec<PathBuf> {
    let dirs: Vec<PathBuf> = dirs.iter().map(|d| root().join(d)).collect();
    let out = crate::util::rust_files(&dirs);
    assert!(out.len() > 20, "only {} sources under {dirs:?}", out.len());
    out
}

/// The Markdown files whose links are checked: `README.md` and every `docs/*.md`.
fn markdown_files() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|x| x == "md") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors a Markdown text defines: explicit `<a id="...">` and its headings' slugs.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(h) = line.strip_prefix('#') {
            out.insert(slug(h.trim_start_matches('#')));
        }
        for (i, _) in line.match_indices("<a id=\"") {
            let rest = &line[i + 7..];
            out.insert(rest[..rest.find('"').expect("a closed id")].to_string());
        }
    }
    out
}

/// Words in `text` that end in `.md` or carry `.md#`, with the characters paths use.
fn md_references(text: &str) -> Vec<String> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || "_./#-".contains(c);
    text.split(|c: char| !is_path(c))
        .map(|w| w.trim_end_matches(['.', '-']))
        .filter(|w| w.ends_with(".md") || w.contains(".md#"))
        .map(str::to_string)
        .collect()
}

/// Checks that `target` (a path relative to `base`, optionally with `#anchor`) names a file in
/// the repository and, for Markdown, an anchor it defines; the problem otherwise.
fn resolve(base: &Path, target: &str) -> Result<(), String> {
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let path = if file.is_empty() { base.to_path_buf() } else { base.join(file) };
    let path = path.canonicalize().map_err(|_| format!("{target}: no such file"))?;
    if !path.starts_with(root().canonicalize().unwrap()) {
        return Err(format!("{target}: outside the repository"));
    }
    let markdown = path.is_file() && path.extension().is_some_and(|x| x == "md");
    match anchor {
        Some(anchor) if markdown && !anchors(&read(&path)).contains(anchor) => {
            Err(format!("{target}: {} has no anchor #{anchor}", path.display()))
        }
        _ => Ok(()),
    }
}

#[test]
fn the_code_cites_nothing_outside_the_repository() {
    // Section signs and the names of reference notes that never shipped with the code.
    let forbidden = [
        "§",
        "spec/",
        "../shared",
        "shared/spec",
        "pytorch-caching-allocator",
        "anchors.md",
        "rust-deps",
        "style.md",
    ];
    let mut bad = Vec::new();
    // The code's tests, benches and examples too; this file names what it forbids.
    for file in sources() {
        for (i, line) in read(&file).lines().enumerate() {
            if let Some(f) = forbidden.iter().find(|f| line.contains(*f)) {
                bad.push(format!("{}:{}: `{f}` in {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "references outside the repository:\n{}", bad.join("\n"));
}

#[test]
fn every_document_cited_in_the_code_exists_with_its_anchor() {
    let docs: BTreeSet<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect();
    let mut bad = Vec::new();
    let mut cited = 0;
    for file in sources() {
        for (i, line) in read(&file).lines().enumerate() {
            let Some(comment) = line.find("//").map(|at| &line[at..]) else { continue };
            for reference in md_references(comment) {
                let place = format!("{}:{}", file.display(), i + 1);
                if reference.contains('/') {
                    cited += 1;
                    if let Err(e) = resolve(root(), &reference) {
                        bad.push(format!("{place}: {e}"));
                    }
                } else if docs.contains(reference.split('#').next().unwrap()) {
                    // A bare name of a file in docs/ sends the reader searching; name the path.
                    bad.push(format!("{place}: write docs/{reference}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "broken citations:\n{}", bad.join("\n"));
    assert!(cited >= 50, "only {cited} citations of docs/ found: did their form change?");
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for file in markdown_files() {
        let text = read(&file);
        let base = file.parent().expect("a parent");
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let target = &rest[..rest.find(')').expect("a closed link")];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            seen += 1;
            let target = if target.starts_with('#') {
                format!("{}{target}", file.file_name().unwrap().to_string_lossy())
            } else {
                target.to_string()
            };
            if let Err(e) = resolve(base, &target) {
                bad.push(format!("{}: {e}", file.display()));
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
    assert!(seen >= 10, "only {seen} relative links found in README.md and docs/");
}

#[test]
fn the_readme_links_every_document_in_docs() {
    let readme = read(&root().join("README.md"));
    for file in markdown_files().iter().filter(|f| f.parent() == Some(&root().join("docs"))) {
        let name = format!("docs/{}", file.file_name().unwrap().to_string_lossy());
        assert!(readme.contains(&format!("]({name}")), "README.md does not link {name}");
    }
}

/// Words that look like commit hashes: 7 to 40 lowercase hex digits, with a digit and a letter.
fn commit_hashes(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| (7..=40).contains(&w.len()))
        .filter(|w| w.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)))
        .filter(|w| {
            w.chars().any(|c| c.is_ascii_digit()) && w.chars().any(|c| c.is_ascii_lowercase())
        })
        .collect()
}

/// The README and the docs say what is, for users and contributors; history (commit hashes,
/// figures per commit) belongs in git and `CHANGELOG.md`. The README stays a short tour.
#[test]
fn the_readme_and_the_docs_hold_no_commit_hashes_and_the_readme_stays_short() {
    for file in markdown_files() {
        let text = read(&file);
        let hashes = commit_hashes(&text);
        assert!(hashes.is_empty(), "{}: commit hashes {hashes:?}", file.display());
    }
    let lines = read(&root().join("README.md")).lines().count();
    assert!(lines <= 260, "README.md has {lines} lines: move detail to docs/guide.md");
}

#[test]
fn the_anchor_reader_sees_ids_and_headings() {
    let a = anchors("# A Title\n<a id=\"split-rule\"></a>\n## The `oom` entry\n```\n# not\n```\n");
    let want: BTreeSet<String> =
        ["a-title", "split-rule", "the-oom-entry"].iter().map(|s| s.to_string()).collect();
    assert_eq!(a, want);
    assert_eq!(
        md_references("// see docs/pytorch-model.md#split-rule. And interface.md, x.mdx"),
        ["docs/pytorch-model.md#split-rule", "interface.md"]
    );
    assert!(resolve(root(), "docs/pytorch-model.md#split-rule").is_ok());
    assert!(resolve(root(), "docs/pytorch-model.md#no-such-rule").is_err());
    assert!(resolve(root(), "docs/no-such-file.md").is_err());
    assert!(resolve(&root().join("docs"), "../../outside.md").is_err());
    assert_eq!(commit_hashes("at d64d82a, 0x7f0000 and 1634567890, cafe"), ["d64d82a"]);
}
