//! Grids of policy specs: brace expansion (`sweep -p`), the built-in grid of PyTorch knobs
//! (`sweep` with no `-p`), and the `export PYTORCH_CUDA_ALLOC_CONF=...` line that names a winner.
//!
//! `pytorch:max_split_size_mb:{64,128,256},roundup_power2_divisions:{1,4}` expands into the
//! product of its braces, the first brace varying slowest (as a shell expands it): six specs.
//! Alternatives are split at commas outside `[...]`, so a brace may hold a PyTorch divisions list:
//! `roundup_power2_divisions:{4,[256:1,>:8]}`. Nested braces are rejected rather than expanded:
//! no allocator option is spelled with braces, and a nested brace is far more often a typo than a
//! wish, so the error names both braces and asks for the alternatives written out.

use crate::error::{Error, Result};
use crate::policy::pytorch::config::{Config, Flavour, INTERVALS};

/// The most specs one sweep may expand to: a grid this large already takes hours on real traces.
pub const MAX_POINTS: usize = 10_000;

/// The built-in grid `sweep` uses when no `-p` is given: the `PYTORCH_CUDA_ALLOC_CONF` knobs users
/// actually try, 32 points. `pytorch` (the trace's recorded settings) is the reference every
/// point is compared with and is added by the sweep, not listed here.
///
/// - expandable segments on and off, with the divisions PyTorch's docs suggest (1 = off, 2, 4, 8);
/// - `max_split_size_mb` from 64 to 512 (the values OOM messages and forum answers suggest), with
///   and without power-of-two rounding;
/// - `garbage_collection_threshold` 0.6 and 0.8 (PyTorch's doc example is 0.6), which only acts
///   under a memory limit, so with `per_process_memory_fraction` 0.9 and 0.95 (a fraction of 1.0
///   sets no limit on current PyTorch, so the threshold would do nothing). Those points may OOM
///   where the others do not: the fraction is a real limit.
pub const BUILTIN_GRID: &[&str] = &[
    "pytorch:expandable_segments:{False,True},roundup_power2_divisions:{1,2,4,8}",
    "pytorch:expandable_segments:{False,True},max_split_size_mb:{64,128,256,512},roundup_power2_divisions:{1,4}",
    "pytorch:expandable_segments:{False,True},garbage_collection_threshold:{0.6,0.8},per_process_memory_fraction:{0.9,0.95}",
];

/// The built-in grid for torch_npu recordings, 16 points: torch_npu refuses
/// `max_split_size_mb` and `garbage_collection_threshold` with expandable segments and has no
/// `per_process_memory_fraction` option, so only the points of [`BUILTIN_GRID`] it accepts
/// (which CUDA's allocator accepts as well).
pub const BUILTIN_NPU_GRID: &[&str] = &[
    "pytorch:expandable_segments:{False,True},roundup_power2_divisions:{1,2,4,8}",
    "pytorch:expandable_segments:False,max_split_size_mb:{64,128,256,512},roundup_power2_divisions:{1,4}",
];

/// The built-in grid, expanded (see [`BUILTIN_GRID`]).
pub fn builtin_grid() -> Vec<String> {
    builtin_grid_for(Flavour::Cuda)
}

/// The built-in grid for recordings of `flavour`'s allocator, expanded ([`BUILTIN_GRID`],
/// [`BUILTIN_NPU_GRID`]).
pub fn builtin_grid_for(flavour: Flavour) -> Vec<String> {
    let grid = match flavour {
        Flavour::Cuda => BUILTIN_GRID,
        Flavour::Npu => BUILTIN_NPU_GRID,
    };
    // Pinned by a test.
    expand_all(grid.iter().map(|s| s.to_string())).expect("the built-in grid is well formed")
}

/// One brace group found in a spec: where it is and what it offers.
struct Brace {
    /// Byte offset of `{`.
    open: usize,
    /// Byte offset of the matching `}`.
    close: usize,
    /// The alternatives, in order.
    alternatives: Vec<String>,
}

/// 1-based character column of byte offset `at` in `spec`, as an editor shows it.
fn column(spec: &str, at: usize) -> usize {
    spec[..at].chars().count() + 1
}

fn malformed(spec: &str, what: String) -> Error {
    Error::usage(format!("invalid spec '{spec}': {what}"))
}

/// Finds the brace groups of `spec` and splits each into its alternatives.
fn braces(spec: &str) -> Result<Vec<Brace>> {
    let mut out = Vec::new();
    let mut open: Option<usize> = None;
    for (i, c) in spec.char_indices() {
        match c {
            '{' => {
                if let Some(o) = open {
                    return Err(malformed(
                        spec,
                        format!(
                            "the '{{' at column {} is inside the '{{' at column {}; nested braces are not supported, write the alternatives out",
                            column(spec, i),
                            column(spec, o)
                        ),
                    ));
                }
                open = Some(i);
            }
            '}' => {
                let o = open.take().ok_or_else(|| {
                    malformed(
                        spec,
                        format!("the '}}' at column {} closes no '{{'", column(spec, i)),
                    )
                })?;
                let alternatives = alternatives(spec, o, i)?;
                out.push(Brace { open: o, close: i, alternatives });
            }
            _ => {}
        }
    }
    if let Some(o) = open {
        return Err(malformed(
            spec,
            format!("the '{{' at column {} is never closed", column(spec, o)),
        ));
    }
    Ok(out)
}

/// The alternatives between the braces at byte offsets `open` and `close`: split at commas
/// outside `[...]`; each must be non-empty.
fn alternatives(spec: &str, open: usize, close: usize) -> Result<Vec<String>> {
    let body = &spec[open + 1..close];
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in body.char_indices().chain(std::iter::once((body.len(), ','))) {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                let alt = body[start..i].trim();
                if alt.is_empty() {
                    let which = out.len() + 1;
                    return Err(malformed(
                        spec,
                        format!(
                            "alternative {which} of the '{{' at column {} is empty",
                            column(spec, open)
                        ),
                    ));
                }
                out.push(alt.to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    // An unclosed list would swallow the commas after it, and with them every alternative.
    if depth > 0 {
        return Err(malformed(
            spec,
            format!("a '[' in the '{{' at column {} is never closed", column(spec, open)),
        ));
    }
    Ok(out)
}

/// Expands the braces of one spec into the product of their alternatives, the first brace varying
/// slowest. A spec without braces expands to itself. Errors name the brace at fault by its
/// 1-based column: an unclosed `{`, a stray `}`, an empty alternative, a nested brace, or a
/// product above [`MAX_POINTS`].
pub fn expand(spec: &str) -> Result<Vec<String>> {
    let groups = braces(spec)?;
    let mut count: usize = 1;
    for g in &groups {
        count = count.saturating_mul(g.alternatives.len());
    }
    if count > MAX_POINTS {
        let sizes: Vec<String> = groups.iter().map(|g| g.alternatives.len().to_string()).collect();
        return Err(too_many(&format!("spec '{spec}' expands to {} configs", sizes.join(" × "))));
    }
    let mut out = vec![String::new()];
    let mut last = 0;
    for g in &groups {
        let literal = &spec[last..g.open];
        out = out
            .iter()
            .flat_map(|prefix| g.alternatives.iter().map(move |a| format!("{prefix}{literal}{a}")))
            .collect();
        last = g.close + 1;
    }
    for s in &mut out {
        s.push_str(&spec[last..]);
    }
    Ok(out)
}

fn too_many(what: &str) -> Error {
    Error::usage(format!(
        "{what}, more than the {MAX_POINTS} a sweep allows (with or without --shard, which splits a grid of at most that many): narrow a brace or drop one"
    ))
}

/// Expands several specs ([`expand`] each) into one list, in order, dropping repeats (the first
/// occurrence keeps its place); the total is capped at [`MAX_POINTS`].
pub fn expand_all(specs: impl IntoIterator<Item = String>) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for spec in specs {
        for s in expand(&spec)? {
            if seen.insert(s.clone()) {
                out.push(s);
            }
        }
        if out.len() > MAX_POINTS {
            return Err(too_many(&format!("the specs expand to more than {} configs", out.len())));
        }
    }
    Ok(out)
}

/// The shortest `PYTORCH_CUDA_ALLOC_CONF` value that gives `config`: only the options that differ
/// from PyTorch's defaults, in the order [`Config::to_conf_string`] writes them. Divisions of 1 are
/// PyTorch's plain rounding and are left out. A config equal to the defaults is written
/// `expandable_segments:False`, which states the defaults explicitly (an empty value would mean
/// "the recorded settings" to `-p pytorch:`, and `unset` would not override a value the user's
/// job script sets).
pub(crate) fn conf_value(config: &Config) -> String {
    let mut c = config.clone();
    if c.roundup_power2_divisions.iter().all(|&d| d <= 1) {
        c.roundup_power2_divisions = [0; INTERVALS];
    }
    let full = c.to_conf_string();
    let mut rest = match full.strip_prefix("expandable_segments:False") {
        Some(r) => r.trim_start_matches(','),
        None => full.as_str(),
    };
    // torch_npu's default alignment, which its strings always state.
    if c.flavour == Flavour::Npu {
        if let Some(r) = rest.strip_prefix("base_addr_aligned_kb:16") {
            rest = r.trim_start_matches(',');
        }
    }
    if rest.is_empty() {
        "expandable_segments:False".to_string()
    } else {
        rest.to_string()
    }
}

/// The exact shell line to paste: `export PYTORCH_CUDA_ALLOC_CONF=...` with [`conf_value`],
/// single-quoted when it holds characters a POSIX shell would interpret (`[`, `]` glob and `>`
/// redirects, from a divisions list). PyTorch 2.9 also reads `PYTORCH_ALLOC_CONF`; the CUDA name
/// works on every 2.x release.
pub(crate) fn export_line(config: &Config) -> String {
    let value = conf_value(config);
    let var = config.flavour.env_var();
    let plain = value.chars().all(|c| c.is_ascii_alphanumeric() || "_:,.=+-".contains(c));
    if plain {
        format!("export {var}={value}")
    } else {
        format!("export {var}='{value}'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pytorch::config::Version;

    #[test]
    fn expands_the_product_first_brace_slowest() {
        let got = expand("pytorch:max_split_size_mb:{64,128,256},roundup_power2_divisions:{1,4}")
            .unwrap();
        assert_eq!(got.len(), 6);
        assert_eq!(got[0], "pytorch:max_split_size_mb:64,roundup_power2_divisions:1");
        assert_eq!(got[1], "pytorch:max_split_size_mb:64,roundup_power2_divisions:4");
        assert_eq!(got[5], "pytorch:max_split_size_mb:256,roundup_power2_divisions:4");
        assert_eq!(expand("bfc").unwrap(), vec!["bfc"]);
        assert_eq!(expand("buddy:min_block={512}").unwrap(), vec!["buddy:min_block=512"]);
    }

    #[test]
    fn alternatives_keep_divisions_lists_whole() {
        let got = expand("pytorch:roundup_power2_divisions:{4, [256:1,>:8]}").unwrap();
        assert_eq!(
            got,
            vec![
                "pytorch:roundup_power2_divisions:4",
                "pytorch:roundup_power2_divisions:[256:1,>:8]"
            ]
        );
    }

    #[test]
    fn malformed_braces_name_the_brace_by_column() {
        let err = |s: &str| expand(s).unwrap_err().to_string();
        let e = err("pytorch:max_split_size_mb:{64,128");
        assert!(e.contains("'{' at column 27 is never closed"), "{e}");
        let e = err("pytorch:max_split_size_mb:64}");
        assert!(e.contains("'}' at column 29 closes no '{'"), "{e}");
        let e = err("pytorch:max_split_size_mb:{64,,128}");
        assert!(e.contains("alternative 2 of the '{' at column 27 is empty"), "{e}");
        let e = err("pytorch:max_split_size_mb:{[,300}");
        assert!(e.contains("a '[' in the '{' at column 27 is never closed"), "{e}");
        let e = err("pytorch:max_split_size_mb:{}");
        assert!(e.contains("alternative 1 of the '{' at column 27 is empty"), "{e}");
        let e = err("pytorch:max_split_size_mb:{64,{128,256}}");
        assert!(e.contains("'{' at column 31 is inside the '{' at column 27"), "{e}");
        assert!(e.contains("nested braces are not supported"), "{e}");
        assert!(e.starts_with("invalid spec 'pytorch:max_split_size_mb:{64,{128,256}}'"), "{e}");
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let e = expand("bfc:é={1").unwrap_err().to_string();
        assert!(e.contains("column 7"), "{e}");
    }

    #[test]
    fn the_cap_is_an_error_with_the_sizes() {
        let ten = "{0,1,2,3,4,5,6,7,8,9}";
        let e = expand(&format!("bfc:a={ten},b={ten},c={ten},d={ten},e={{1,2}}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("10 × 10 × 10 × 10 × 2"), "{e}");
        assert!(e.contains("10000"), "{e}");
        assert_eq!(expand(&format!("bfc:a={ten},b={ten},c={ten},d={ten}")).unwrap().len(), 10_000);
        let over = vec![format!("bfc:a={ten},b={ten},c={ten},d={ten}"), "nocache".into()];
        assert!(expand_all(over).unwrap_err().to_string().contains("10001"));
    }

    #[test]
    fn expand_all_keeps_order_and_drops_repeats() {
        let got = expand_all(["bfc".to_string(), "{bfc,nocache}".to_string()]).unwrap();
        assert_eq!(got, vec!["bfc", "nocache"]);
    }

    #[test]
    fn the_builtin_grid_is_small_and_every_point_parses() {
        let grid = builtin_grid();
        assert!((24..=48).contains(&grid.len()), "{}", grid.len());
        for spec in &grid {
            let options = spec.strip_prefix("pytorch:").expect("pytorch specs");
            Config::parse(options, Version::CURRENT).unwrap_or_else(|e| panic!("{spec}: {e}"));
        }
    }

    #[test]
    fn conf_value_keeps_only_what_differs_from_the_defaults() {
        let parse = |s: &str| Config::parse(s, Version::CURRENT).unwrap();
        assert_eq!(conf_value(&Config::default()), "expandable_segments:False");
        assert_eq!(
            conf_value(&parse("expandable_segments:False,roundup_power2_divisions:1")),
            "expandable_segments:False"
        );
        assert_eq!(
            conf_value(&parse("max_split_size_mb:128,expandable_segments:False")),
            "max_split_size_mb:128"
        );
        assert_eq!(
            conf_value(&parse("expandable_segments:True,roundup_power2_divisions:4")),
            "expandable_segments:True,roundup_power2_divisions:4"
        );
        let gc = parse("garbage_collection_threshold:0.6,per_process_memory_fraction:0.9");
        assert_eq!(
            conf_value(&gc),
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9"
        );
    }

    #[test]
    fn conf_value_parses_back_to_the_same_config() {
        for s in [
            "max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:8]",
            "expandable_segments:True,max_non_split_rounding_mb:40",
            "large_segment_size_mb:64,max_split_size_mb:128",
            "",
        ] {
            let c = Config::parse(s, Version::CURRENT).unwrap();
            assert_eq!(Config::parse(&conf_value(&c), Version::CURRENT).unwrap(), c, "{s}");
        }
    }

    #[test]
    fn export_line_quotes_only_when_the_shell_needs_it() {
        let parse = |s: &str| Config::parse(s, Version::CURRENT).unwrap();
        assert_eq!(
            export_line(&parse("expandable_segments:True")),
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        );
        let line = export_line(&parse("roundup_power2_divisions:[256:1,>:8]"));
        assert!(
            line.starts_with("export PYTORCH_CUDA_ALLOC_CONF='roundup_power2_divisions:["),
            "{line}"
        );
        assert!(line.ends_with("]'"), "{line}");
    }
}
