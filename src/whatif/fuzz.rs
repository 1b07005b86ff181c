//! The bodies of the fuzz targets for the what-if commands' own inputs (`fuzz/fuzz_targets/`):
//! `merge`'s sweep parts, `check`'s baselines and `sweep`'s specs with braces. Kept in the library
//! (beside what they drive, as the testing module keeps the readers' fuzz bodies) so that a finding
//! becomes a regression test calling the very same function. Each panics only on a real defect;
//! errors are expected outcomes.

use crate::policy::PolicySpec;

/// Reads `data` as a `sweep --out` part and merges it (alone, and twice, as two files): an error,
/// or a merged sweep whose every result came from the part and whose ranking names each of the
/// part's specs once. Nothing may be sized by a number in the part.
pub fn merge_part(data: &[u8]) {
    use super::{input, sweep};
    let file = std::path::Path::new("part.json");
    let Ok(part) = input::read_part(data, file) else { return };
    let specs: std::collections::HashSet<&str> =
        part.results.iter().map(|r| r.spec.as_str()).collect();
    for n in [1, 2] {
        let parts = vec![sweep::Part { file: file.to_path_buf(), report: part.clone() }; n];
        let Ok(merged) = sweep::merge(parts) else { continue };
        assert_eq!(merged.results.len(), part.results.len(), "a merge of one part keeps its rows");
        assert_eq!(merged.ranking.len(), specs.len(), "each spec ranks once");
        assert!(merged.ranking.iter().all(|r| specs.contains(r.spec.as_str())));
        let _ = serde_json::to_string(&merged).expect("a merged sweep serialises");
    }
}

/// Reads `data` as a baseline and checks a row of each of its own rows against it: an error, or
/// a baseline whose rows compare equal to themselves (nothing regresses against itself) and whose
/// values are all in range.
pub fn check_baseline(data: &[u8]) {
    use super::check::{check, Baseline};
    let file = std::path::Path::new("base.json");
    let Ok(base) = Baseline::parse(data, file) else { return };
    for r in &base.rows {
        for key in ["peak_reserved_bytes", "device_malloc_count"] {
            let v = r.number(key).expect("a checked row has its sizes");
            assert!(v >= 0.0 && v.is_finite(), "{key} = {v}");
        }
    }
    let text = base.to_json();
    let back = Baseline::parse(text.as_bytes(), file).expect("a baseline reads back");
    assert_eq!(back.rows.len(), base.rows.len());
    // Rows whose trace names no other row's file name match themselves.
    match check(&base, file, &base.rows, 0.0, None) {
        Ok(report) => assert!(report.ok, "a baseline regresses against itself: {report:?}"),
        Err(e) => assert!(e.to_string().contains("no baseline entry"), "{e}"),
    }
}

/// Expands `data` (as UTF-8 lines, each a `-p` value with braces) as `sweep` does, then parses each
/// spec and, for `pytorch`, its `PYTORCH_CUDA_ALLOC_CONF` options: errors, never a panic, and
/// never more than the cap of configs.
pub fn policy_specs(data: &[u8]) {
    use super::grid;
    use crate::policy::pytorch::config::{Config, Version};
    let Ok(text) = std::str::from_utf8(data) else { return };
    let specs: Vec<String> = text.lines().take(16).map(str::to_string).collect();
    let Ok(all) = grid::expand_all(specs) else { return };
    assert!(all.len() <= grid::MAX_POINTS, "{} configs", all.len());
    for s in &all {
        let Ok(parsed) = PolicySpec::parse_list(s) else { continue };
        for p in parsed {
            if crate::policy::has_allocator_settings(&p.name) {
                if let Ok(c) = Config::parse(&p.options, Version::CURRENT) {
                    let again = Config::parse(&grid::conf_value(&c), Version::CURRENT);
                    assert!(again.is_ok(), "{s}: {} does not parse back", grid::conf_value(&c));
                }
            }
        }
    }
}
