//! Data flows one way: read → replay → measure → report. Every top-level module of `src/` has a
//! place in [`LAYERS`] and may name only the modules it lists; a grep over the sources checks it
//! for every module, so an import that reaches back up a layer fails here. Whole files are parsed
//! (with `syn`): only test code (an item under `#[cfg(test)]`, and `tests.rs` files) may drive
//! anything and is not checked. What cargo itself keeps apart (the command line, charts and the
//! CUDA device behind features) is checked by `.ci/run` with `cargo tree`, not here.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each top-level module and the modules its non-test code may name (`crate::NAME`), lowest
/// layer first. See `docs/architecture.md`.
const LAYERS: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("units", &["error"]),
    // Progress bars, drawn only where the `cli` feature brings indicatif.
    ("progress", &[]),
    // The trace model and its readers and writers.
    ("trace", &["error", "units", "progress"]),
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
            "error", "units", "progress",
        ],
    ),
    // Helpers for tests, benches and fuzz targets.
    ("testing", &["trace", "backend", "metrics", "recorded", "policy", "replay", "error", "units"]),
    // One trace read once and a method per question: what the CLI and Python are faces on.
    (
        "session",
        &[
            "trace", "backend", "metrics", "recorded", "policy", "replay", "validate", "whatif",
            "blame", "explain", "report", "error", "units",
        ],
    ),
    // The binary's thin CLI: it may name every module.
    (
        "cli",
        &[
            "trace", "backend", "metrics", "recorded", "policy", "replay", "validate", "synth",
            "whatif", "blame", "explain", "report", "session", "error", "units",
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

/// True when `attrs` hold `#[cfg(test)]`.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().trim() == "test")
    })
}

/// The items of a parsed file that are not test code: items under `#[cfg(test)]` are left out,
/// inline modules are opened and their items filtered the same way.
fn production_tokens(items: &[syn::Item], out: &mut TokenStream) {
    for item in items {
        match item {
            syn::Item::Mod(m) if is_test(&m.attrs) => {}
            syn::Item::Mod(syn::ItemMod { content: Some((_, inner)), .. }) => {
                production_tokens(inner, out)
            }
            syn::Item::Fn(f) if is_test(&f.attrs) => {}
            syn::Item::Use(u) if is_test(&u.attrs) => {}
            syn::Item::Impl(i) if is_test(&i.attrs) => {}
            syn::Item::Const(c) if is_test(&c.attrs) => {}
            syn::Item::Struct(s) if is_test(&s.attrs) => {}
            other => other.to_tokens(out),
        }
    }
}

/// The paths `crate::NAME` and `fragsim::...` in `tokens`, as (line, `NAME` or `fragsim`).
fn named_paths(tokens: TokenStream, out: &mut Vec<(usize, String)>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    for (k, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Group(g) => named_paths(g.stream(), out),
            TokenTree::Ident(id) if id == "crate" || id == "fragsim" => {
                let colons = matches!(trees.get(k + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':')
                    && matches!(trees.get(k + 2), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                if !colons {
                    continue;
                }
                let line = id.span().start().line;
                if id == "fragsim" {
                    out.push((line, "fragsim".to_string()));
                } else if let Some(TokenTree::Ident(next)) = trees.get(k + 3) {
                    out.push((line, next.to_string()));
                }
            }
            _ => {}
        }
    }
}

/// The modules named as `crate::NAME` (and the crate named as `fragsim::`) by the non-test code
/// of `text`, with their 1-based lines.
fn named_in(text: &str) -> Vec<(usize, String)> {
    let file = syn::parse_file(text).expect("a source file syn parses");
    let mut tokens = TokenStream::new();
    production_tokens(&file.items, &mut tokens);
    let mut out = Vec::new();
    named_paths(tokens, &mut out);
    out
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
        let lines: Vec<&str> = text.lines().collect();
        for (line, m) in named_in(&text) {
            let reaches = m != module && modules.contains(&m) && !allowed.contains(&m.as_str());
            // A library module never names the crate by its external name either.
            let external = module != "cli" && m == "fragsim";
            if reaches || external {
                let shown = lines.get(line.saturating_sub(1)).map_or("", |l| l.trim());
                bad.push(format!("{}:{line}: {shown}", file.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn test_code_is_left_out_and_everything_else_is_read() {
    let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    fn f() { let s = \"}\"; let c = '{'; }\n    use crate::b;\n}\nfn g() { crate::c::x(); }\n#[cfg(test)]\nuse crate::d;\nfn h<'a>(x: &'a str) -> u8 { fragsim::e::y(x) }\n/// [`crate::f`]\nmod inner { fn k() { crate::g::z(); } }\n";
    let named: Vec<(usize, String)> = named_in(text);
    let want = [(1, "a"), (7, "c"), (10, "fragsim"), (12, "g")];
    assert_eq!(named, want.map(|(l, m)| (l, m.to_string())));
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
    let named: Vec<String> = named_in("use crate::replay::{a, b}; fn f() { x(crate::trace::Y) }")
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(named, ["replay", "trace"]);
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

/// Every function of non-test code in `src/` with its length in lines, as
/// (`file:line name`, lines).
fn function_lengths() -> Vec<(String, PathBuf, usize)> {
    fn visit(items: &[syn::Item], file: &Path, out: &mut Vec<(String, PathBuf, usize)>) {
        use syn::spanned::Spanned;
        fn push(
            out: &mut Vec<(String, PathBuf, usize)>,
            file: &Path,
            name: &syn::Ident,
            span: proc_macro2::Span,
        ) {
            let lines = span.end().line - span.start().line + 1;
            let at = format!("{}:{} {name}", file.display(), span.start().line);
            out.push((at, file.into(), lines));
        }
        for item in items {
            match item {
                syn::Item::Mod(m) if is_test(&m.attrs) => {}
                syn::Item::Mod(syn::ItemMod { content: Some((_, inner)), .. }) => {
                    visit(inner, file, out)
                }
                syn::Item::Fn(f) if !is_test(&f.attrs) => push(out, file, &f.sig.ident, f.span()),
                syn::Item::Impl(i) if !is_test(&i.attrs) => {
                    for it in &i.items {
                        if let syn::ImplItem::Fn(f) = it {
                            push(out, file, &f.sig.ident, f.span());
                        }
                    }
                }
                syn::Item::Trait(t) => {
                    for it in &t.items {
                        if let syn::TraitItem::Fn(f) = it {
                            if f.default.is_some() {
                                push(out, file, &f.sig.ident, f.span());
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for file in crate::util::rust_files(&[src()]) {
        if file.file_name().is_some_and(|n| n == "tests.rs" || n == "testing.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source");
        let parsed = syn::parse_file(&text).expect("a source file syn parses");
        visit(&parsed.items, &file, &mut out);
    }
    out
}

/// The longest a function of the library may be, and of the command line, whose functions
/// read arguments, call the library and print.
const MOST_LINES: usize = 150;
const MOST_CLI_LINES: usize = 60;

/// Functions longer than the rule allows, each with the length it may not grow past: the
/// pickle opcode interpreter (one `match` over the opcodes, read best as one piece), and what is
/// left to split (each entry may only shrink; remove it once the function fits).
const LONGER: &[(&str, &str, usize)] = &[("src/trace/pickle/decode.rs", "run", 360)];

#[test]
fn no_function_is_longer_than_its_layer_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for (at, file, lines) in function_lengths() {
        let rel = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
        let name = at.rsplit(' ').next().unwrap_or("");
        let most = if rel.starts_with("src/cli/") { MOST_CLI_LINES } else { MOST_LINES };
        let allowed = LONGER
            .iter()
            .find(|(f, n, _)| *f == rel && *n == name)
            .map_or(most, |(_, _, l)| (*l).max(most));
        if lines > allowed {
            bad.push(format!("{at}: {lines} lines (at most {allowed})"));
        }
    }
    assert!(bad.is_empty(), "functions too long to read in one go:\n{}", bad.join("\n"));
    // Each exception still names a function that needs it, so the list only shrinks.
    let all = function_lengths();
    assert!(all.len() > 1000, "the check reads only {} functions", all.len());
    for (file, name, _) in LONGER {
        let most = if file.starts_with("src/cli/") { MOST_CLI_LINES } else { MOST_LINES };
        let needed = all.iter().any(|(at, f, lines)| {
            f.ends_with(file) && at.rsplit(' ').next() == Some(name) && *lines > most
        });
        assert!(needed, "{file} {name} fits the rule now: remove it from LONGER");
    }
}
