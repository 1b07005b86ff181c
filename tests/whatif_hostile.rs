//! The what-if commands' own inputs and outputs, attacked as a user could: hostile sweep parts and
//! baselines (exit 2 naming the file and key, never a panic, an abort or a ranking built on a
//! lie), thread counts far beyond the work, inputs named twice, outputs that are inputs, and
//! writers killed half-way (the old output or the new one, whole).

use crate::util::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn text_trace() -> String {
    bundled("gpt-4l-512h.txt").to_string_lossy().into_owned()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

/// Two parts of a sweep of `pytorch` (the reference), `bfc` and `nocache` on the text trace.
fn parts(dir: &Path) -> Vec<PathBuf> {
    let t = text_trace();
    (1..=2)
        .map(|i| {
            let part = dir.join(format!("part{i}.json"));
            let shard = format!("{i}/2");
            let p = part.to_str().unwrap();
            let out =
                run(&["sweep", &t, "-p", "bfc", "-p", "nocache", "--shard", &shard, "--out", p]);
            assert!(out.status.success(), "{}", stderr(&out));
            part
        })
        .collect()
}

/// `merge` of `parts`: exit code and stderr.
fn merge(parts: &[&Path]) -> (Option<i32>, String, String) {
    let mut args = vec!["merge".to_string()];
    args.extend(parts.iter().map(|p| p.to_string_lossy().into_owned()));
    args.push("--json".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run(&args);
    (o.status.code(), stdout(&o), stderr(&o))
}

#[test]
fn merge_refuses_parts_that_lie_and_sizes_nothing_by_them() {
    let dir = tempfile::tempdir().unwrap();
    let parts = parts(dir.path());
    let (code, out, err) = merge(&[&parts[0], &parts[1]]);
    assert_eq!(code, Some(0), "{err}");
    let merged: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(merged["ranking"].as_array().unwrap().len(), 3);
    assert!(merged.get("grid_specs").is_none(), "a merged sweep prints what sweep prints");

    let bad = dir.path().join("bad.json");
    let attack = |edit: &dyn Fn(&mut Value), want: &str| {
        let mut v = read_json(&parts[1]);
        edit(&mut v);
        write_json(&bad, &v);
        let started = Instant::now();
        let (code, _, err) = merge(&[&parts[0], &bad]);
        assert_eq!(code, Some(2), "{want}: {err}");
        assert!(err.starts_with(&format!("fragsim: {}: ", bad.display())), "{want}: {err}");
        assert!(err.contains(want), "{want}: {err}");
        assert!(err.len() < 2000, "a short message: {} bytes", err.len());
        assert!(!err.trim_end().chars().any(char::is_control), "written out: {err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{want}: took {:?}",
            started.elapsed()
        );
    };
    // A count no set of parts could fill sizes nothing: this part's shard of the grid is empty.
    for count in [u64::MAX, 1_000_000_000, 10_000_000] {
        attack(&|v| v["shard"]["count"] = count.into(), "its shard of the grid holds 0 specs");
    }
    attack(&|v| v["shard"]["index"] = 0.into(), "shard: index 0 of 2");
    for value in [serde_json::json!(-5), serde_json::json!(1e300)] {
        attack(
            &|v| v["results"][0]["peak_reserved_bytes"] = value.clone(),
            "results[0].peak_reserved_bytes: expected a non-negative integer below 2^64",
        );
    }
    // 2^64 + 5, written as JSON text (serde_json would read it as a float).
    let mut v = read_json(&parts[1]);
    v["results"][0]["peak_reserved_bytes"] = 0.into();
    let text = serde_json::to_string(&v).unwrap().replacen(
        "\"peak_reserved_bytes\":0",
        "\"peak_reserved_bytes\":18446744073709551621",
        1,
    );
    std::fs::write(&bad, text).unwrap();
    let (code, _, err) = merge(&[&parts[0], &bad]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("results[0].peak_reserved_bytes"), "{err}");
    attack(&|v| v["results"] = serde_json::json!([]), "0 results");
    attack(
        &|v| {
            let first = v["results"][0].clone();
            v["results"].as_array_mut().unwrap().push(first);
        },
        "results",
    );
    attack(&|v| v["results"][1]["spec"] = "pytorch:max_split_size_mb:128".into(), "results[1]");
    // A relabelled config: not what its spec builds (#46).
    attack(
        &|v| v["results"][0]["config"] = "allow_growth=false,memory_limit=none".into(),
        "results[0].config: 'allow_growth=false,memory_limit=none' is not the configuration of 'bfc'",
    );
    // A tampered config is quoted escaped and cut short, as is PyTorch's key in the reason (D12).
    attack(
        &|v| v["results"][1]["config"] = format!("\u{1b}[31m,{}", "y".repeat(100_000)).into(),
        "results[1].config: '\\x1b[31m,yyy",
    );
    attack(&|v| v["results"][1]["config"] = "\u{1b}[31m,<script>".into(), "'\\x1b[31m,<script>'");
    // The first part holds the reference, pytorch, whose reason quotes PyTorch's key.
    let mut v = read_json(&parts[0]);
    let rows = v["results"].as_array_mut().unwrap();
    let row = rows.iter_mut().find(|r| r["spec"] == "pytorch").expect("the reference's row");
    row["config"] = "\u{1b}[31m,<script>".into();
    write_json(&bad, &v);
    let (code, _, err) = merge(&[&bad, &parts[1]]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("Unrecognized key '\\x1b' in Accelerator allocator config"), "{err}");
    assert!(!err.trim_end().chars().any(char::is_control), "{err:?}");
    attack(&|v| v["grid_specs"][2] = "buddy".into(), "grid: ");
    attack(&|v| v["results"][0]["peak_reserved_bytes"] = "5".into(), "found the string \"5\"");
    attack(&|v| v["objective"] = "peak".into(), "objective");

    // The parts of another sweep name the file and the field.
    let t = text_trace();
    let other = dir.path().join("other.json");
    let o = run(&["sweep", &t, "-p", "buddy", "--shard", "2/2", "--out", other.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (code, _, err) = merge(&[&parts[0], &other]);
    assert_eq!(code, Some(2));
    assert!(err.contains("other.json: grid: ") && err.contains("part1.json"), "{err}");

    // The input cap applies to parts too.
    let o = run(&["--max-input-size", "100", "merge", parts[0].to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("the input limit"), "{}", stderr(&o));
}

/// A PyTorch config relabelled in a part (another value of an option its spec sets, an option
/// its spec sets dropped, not a configuration at all) is refused, naming the part and the row.
#[test]
fn merge_refuses_a_relabelled_pytorch_config() {
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("part.json");
    let t = text_trace();
    let grid = "pytorch:max_split_size_mb:{128,256}";
    let p = part.to_str().unwrap();
    let o =
        run(&["sweep", &t, "-p", grid, "-p", "pytorch-expandable", "--shard", "1/1", "--out", p]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (code, _, err) = merge(&[&part]);
    assert_eq!(code, Some(0), "the part as written merges: {err}");
    let v = read_json(&part);
    let rows = v["results"].as_array().unwrap();
    let index = |spec: &str| rows.iter().position(|r| r["spec"] == spec).unwrap();
    let config = |i: usize| rows[i]["config"].as_str().unwrap().to_string();
    let (at128, expandable) = (index("pytorch:max_split_size_mb:128"), index("pytorch-expandable"));
    let bad = dir.path().join("bad.json");
    for (i, relabelled) in [
        (at128, config(at128).replace("max_split_size_mb:128", "max_split_size_mb:256")),
        (at128, config(at128).replace(",max_split_size_mb:128", "")),
        (at128, "fast".to_string()),
        (
            expandable,
            config(expandable).replace("expandable_segments:True", "expandable_segments:False"),
        ),
    ] {
        assert_ne!(relabelled, config(i));
        let mut edited = v.clone();
        edited["results"][i]["config"] = relabelled.clone().into();
        write_json(&bad, &edited);
        let (code, _, err) = merge(&[&bad]);
        assert_eq!(code, Some(2), "{relabelled}: {err}");
        let want = format!("fragsim: {}: results[{i}].config: '{relabelled}'", bad.display());
        assert!(err.starts_with(&want), "{want}\n{err}");
        assert!(err.contains("relabelled"), "{err}");
    }
}

#[test]
fn check_refuses_baselines_that_hold_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let t = text_trace();
    let base = dir.path().join("base.json");
    let b = base.to_str().unwrap();
    let o = run(&["check", &t, "-p", "bfc", "--baseline", b, "--update", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(run(&["check", &t, "-p", "bfc", "--baseline", b]).status.code(), Some(0));
    let good = read_json(&base);
    let attack = |edit: &dyn Fn(&mut Value), want: &str| {
        let mut v = good.clone();
        edit(&mut v);
        let path = dir.path().join("bad.json");
        write_json(&path, &v);
        let o = run(&["check", &t, "-p", "bfc", "--baseline", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{want}: {}", stderr(&o));
        assert!(stderr(&o).contains(&format!("bad.json: {want}")), "{want}: {}", stderr(&o));
    };
    attack(
        &|v| {
            v["rows"][0]
                .as_object_mut()
                .unwrap()
                .retain(|k, _| ["trace", "policy", "config"].contains(&k.as_str()))
        },
        "rows[0]: the result has no",
    );
    for value in [
        serde_json::json!("1"),
        serde_json::json!(null),
        serde_json::json!({}),
        serde_json::json!(-1),
        serde_json::json!(true),
    ] {
        attack(
            &|v| v["rows"][0]["peak_reserved_bytes"] = value.clone(),
            "rows[0].peak_reserved_bytes: expected a non-negative integer",
        );
    }
    attack(
        &|v| {
            let first = v["rows"][0].clone();
            v["rows"].as_array_mut().unwrap().push(first);
        },
        "rows[1]: repeats rows[0]",
    );
    attack(&|v| v["version"] = "1".into(), "version: expected the integer 1, found \"1\"");
}

#[test]
fn jobs_are_bounded_by_the_work() {
    let t = text_trace();
    for jobs in ["100000", "18446744073709551615"] {
        let started = Instant::now();
        let o = run(&["replay", &t, "-p", "bfc", "-p", "nocache", "--jobs", jobs]);
        assert!(o.status.success(), "--jobs {jobs}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("note: --jobs {jobs}: running 2 at once")),
            "{}",
            stderr(&o)
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
        let o = run(&["sweep", &t, "-p", "bfc", "--jobs", jobs, "--csv"]);
        assert!(o.status.success(), "sweep --jobs {jobs}: {}", stderr(&o));
        let o = run(&["fit", &t, "-p", "bfc", "--jobs", jobs]);
        assert!(o.status.success(), "fit --jobs {jobs}: {}", stderr(&o));
        assert!(stderr(&o).contains("running 1 at once"), "{}", stderr(&o));
    }
    let o = run(&["replay", &t, "-p", "bfc", "--jobs", "100000", "-q"]);
    assert!(o.status.success() && stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn the_largest_input_cap_reads_files() {
    let t = text_trace();
    let o = run(&["--max-input-size", "18446744073709551615", "replay", &t, "-p", "bfc"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = fragsim()
        .args(["replay", &t, "-p", "bfc"])
        .env("FRAGSIM_MAX_INPUT_SIZE", "18446744073709551615")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn no_command_writes_over_its_own_input() {
    let (_dir, t) = temp_file("t.txt", &std::fs::read(bundled("gpt-4l-512h.txt")).unwrap());
    let before = std::fs::read(&t).unwrap();
    let p = t.to_str().unwrap();
    let same = t.parent().unwrap().join(".").join("t.txt");
    let s = same.to_str().unwrap();
    for args in [
        vec!["sweep", p, "-p", "bfc", "--out", p],
        vec!["sweep", p, "-p", "bfc", "--out", s],
        vec!["check", p, "-p", "bfc", "--baseline", p, "--update"],
        vec!["replay", p, "-p", "bfc", "--export-snapshot", s],
        vec!["report", p, "-p", "bfc", "--out", p],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("an input of this command") || err.contains("is a file, not a folder"),
            "{args:?}: {err}"
        );
        assert_eq!(std::fs::read(&t).unwrap(), before, "{args:?} wrote over its input");
    }
}

/// Runs fragsim with `args`, where `{fifo}` stands for a FIFO a writer fills once with the
/// bundled text trace (as a shell's `cat trace > fifo` or `<(...)` does): a second open of it
/// would wait for a writer that never comes, so a command that reads its input twice fails here.
#[cfg(unix)]
fn run_on_a_fifo(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("t.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let f = fifo.to_str().unwrap();
    let args: Vec<&str> = args.iter().map(|a| if *a == "{fifo}" { f } else { a }).collect();
    let child = fragsim()
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let text = std::fs::read(bundled("gpt-4l-512h.txt")).unwrap();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, text))
    };
    let o = finish_within_a_minute(child, &format!("{args:?} on a FIFO written once"));
    writer.join().unwrap().unwrap();
    o
}

/// Waits for `child`'s output, killing it and failing the test (`what` hangs) after a minute.
#[cfg(unix)]
fn finish_within_a_minute(mut child: std::process::Child, what: &str) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{what} hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Runs fragsim with `args` (`{fifo}` as in [`run_on_a_fifo`]) and its standard input open on
/// that FIFO, which a writer has filled with a short trace and left before fragsim starts (as in
/// `cat t > f & fragsim replay f < f`): the data is in the pipe, and only the descriptor already
/// open reaches it; opening the FIFO again by its name waits for a writer that never comes.
#[cfg(unix)]
fn run_with_a_fifo_as_stdin(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("t.fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let whole = std::fs::read_to_string(bundled("gpt-4l-512h.txt")).unwrap();
    // Well under a pipe's 64 KiB, so the writer finishes without a reader draining it.
    let short: String = whole.lines().take(600).map(|l| format!("{l}\n")).collect();
    assert!(short.len() < 60_000);
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, short))
    };
    let reader = std::fs::File::open(&fifo).unwrap();
    writer.join().unwrap().unwrap();
    let f = fifo.to_str().unwrap();
    let args: Vec<&str> = args.iter().map(|a| if *a == "{fifo}" { f } else { a }).collect();
    let child = fragsim()
        .args(&args)
        .stdin(reader)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    finish_within_a_minute(child, &format!("{args:?} on a FIFO that is its standard input"))
}

#[cfg(unix)]
#[test]
fn a_fifo_that_is_standard_input_is_read_through_it() {
    let o = run_with_a_fifo_as_stdin(&["replay", "{fifo}", "-p", "bfc", "--csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).lines().any(|l| l.starts_with("bfc,")), "{}", stdout(&o));
    let o = run_with_a_fifo_as_stdin(&["sweep", "{fifo}", "/dev/stdin", "-p", "bfc", "--csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("is named twice; it is read once"), "{}", stderr(&o));
    assert!(stdout(&o).contains(",bfc,"), "{}", stdout(&o));
}

#[cfg(unix)]
#[test]
fn a_fifo_named_twice_is_read_once() {
    let o = run_on_a_fifo(&["sweep", "{fifo}", "{fifo}", "-p", "bfc", "--csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("is named twice; it is read once"), "{}", stderr(&o));
    assert!(stdout(&o).contains(",bfc,"), "{}", stdout(&o));
}

#[cfg(unix)]
#[test]
fn a_diff_of_one_fifo_named_twice_reads_it_once() {
    let o = run_on_a_fifo(&["diff", "{fifo}", "{fifo}", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("is named twice; it is read once"), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["a"]["peak_reserved_bytes"], v["b"]["peak_reserved_bytes"], "{v}");
}

/// With no `-p`, the built-in grid is chosen by a look at the first trace; the sweep replays the
/// trace that look read (it opened the file again, and hung on a FIFO).
#[cfg(unix)]
#[test]
fn a_sweep_of_the_built_in_grid_reads_a_fifo_once() {
    let o = run_on_a_fifo(&["sweep", "{fifo}", "--csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let file = bundled("gpt-4l-512h.txt");
    let of_file = run(&["sweep", file.to_str().unwrap(), "--csv"]);
    assert!(of_file.status.success(), "{}", stderr(&of_file));
    assert_eq!(stdout(&o), stdout(&of_file), "the FIFO's sweep is the file's");
}

/// Whether `path` is a whole output file of its kind: a PNG to its IEND chunk, an SVG to its
/// closing tag, JSON that parses, CSV/Markdown/HTML ending in a newline.
fn whole(path: &Path) -> bool {
    let b = std::fs::read(path).unwrap();
    match path.extension().and_then(|e| e.to_str()) {
        Some("png") => b.starts_with(b"\x89PNG") && b.ends_with(&[0xae, 0x42, 0x60, 0x82]),
        Some("svg") => String::from_utf8_lossy(&b).trim_end().ends_with("</svg>"),
        Some("json") => serde_json::from_slice::<Value>(&b).is_ok(),
        _ => b.ends_with(b"\n") || b.ends_with(b">"),
    }
}

/// The visible files of `dir` and their bytes (staging folders are hidden).
fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .map(|p| {
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
        })
        .collect()
}

/// Starts `args` and kills it after `delay`, unless it ended before.
fn killed_after(args: &[&str], delay: Duration) {
    let mut child = fragsim()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < delay {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn writers_killed_half_way_leave_the_old_outputs_or_the_new_ones_whole() {
    let dir = tempfile::tempdir().unwrap();
    let t = text_trace();
    let report = dir.path().join("report");
    let r = report.to_str().unwrap();
    let o = run(&["report", &t, "-p", "bfc", "--out", r, "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let old = files(&report);
    assert!(old.len() >= 10 && old.keys().all(|f| whole(&report.join(f))), "{:?}", old.keys());
    // Which files the other policy changes (the size histogram, say, is the trace's own).
    let reference = dir.path().join("reference");
    let o = run(&["report", &t, "-p", "nocache", "--out", reference.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let new = files(&reference);
    std::fs::remove_dir_all(&reference).unwrap();
    let differ: Vec<&String> = old.keys().filter(|f| old[*f] != new[*f]).collect();
    assert!(differ.len() >= 5, "{differ:?}");
    let part = dir.path().join("part.json");
    let p = part.to_str().unwrap();
    assert!(run(&["sweep", &t, "-p", "bfc", "--out", p]).status.success());
    let old_part = std::fs::read(&part).unwrap();
    let base = dir.path().join("base.json");
    let b = base.to_str().unwrap();
    assert!(run(&["check", &t, "-p", "bfc", "--baseline", b, "--update", "-q"]).status.success());
    let old_base = std::fs::read(&base).unwrap();

    // Kill each writer at times spread over its run, replacing the outputs with another policy's.
    let mut saw_new = [false; 3];
    for step in 0..13u64 {
        // The last run is let finish.
        let delay = Duration::from_millis(if step == 12 { 120_000 } else { 5 + step * step * 20 });
        killed_after(&["report", &t, "-p", "nocache", "--out", r, "-q"], delay);
        let now = files(&report);
        for name in now.keys() {
            assert!(whole(&report.join(name)), "{name} is torn after a kill at {delay:?}");
            assert!(old.contains_key(name), "{name}: a file neither run writes");
        }
        assert_eq!(now.len(), old.len(), "every file is there after a kill at {delay:?}");
        if now["index.html"] != old["index.html"] {
            saw_new[0] = true;
            let stale: Vec<&&String> = differ.iter().filter(|f| now[**f] == old[**f]).collect();
            assert!(stale.is_empty(), "a new index.html beside old files {stale:?} ({delay:?})");
        }

        killed_after(&["sweep", &t, "-p", "nocache", "--out", p], delay);
        let now = std::fs::read(&part).unwrap();
        if now != old_part {
            saw_new[1] = true;
            let v: Value = serde_json::from_slice(&now).expect("a whole new part");
            assert_eq!(v["results"][1]["spec"], "nocache");
        }

        killed_after(&["check", &t, "-p", "nocache", "--baseline", b, "--update", "-q"], delay);
        let now = std::fs::read(&base).unwrap();
        if now != old_base {
            saw_new[2] = true;
            let v: Value = serde_json::from_slice(&now).expect("a whole new baseline");
            // The update adds this run's entry and keeps the one it did not rerun.
            let policies: Vec<&Value> =
                v["rows"].as_array().unwrap().iter().map(|r| &r["policy"]).collect();
            assert_eq!(policies, ["bfc", "nocache"], "{v}");
        }
        // No temporary is left where a reader would take it for an output.
        let visible: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        assert_eq!(visible.len(), 3, "{visible:?}");
    }
    // The last, longest runs finish: the kills did not all land before any write.
    assert!(saw_new.iter().all(|&s| s), "some writer never finished: {saw_new:?}");
}

#[test]
fn spec_values_follow_pytorchs_parsing_limits() {
    let t = text_trace();
    for spec in [
        "pytorch:max_split_size_mb:99999999999999999999",
        "pytorch:max_split_size_mb:64,max_split_size_mb:128",
        "buddy:min_block=512,min_block=1024",
    ] {
        let o = run(&["replay", &t, "-p", spec]);
        assert_eq!(o.status.code(), Some(2), "{spec}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(err.contains("out of range") || err.contains("given twice"), "{spec}: {err}");
    }
}

#[test]
fn fit_offers_only_the_formats_it_prints() {
    let t = text_trace();
    let help = stdout(&run(&["fit", "--help"]));
    assert!(help.contains("table") && help.contains("json") && help.contains("csv"), "{help}");
    let o = run(&["fit", &t, "-p", "bfc", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --csv is an alias of --format csv, as on every command that prints results.
    for args in [["--csv", ""], ["--format", "csv"]] {
        let mut argv = vec!["fit", &t, "-p", "bfc"];
        argv.extend(args.iter().filter(|a| !a.is_empty()));
        let o = run(&argv);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let text = stdout(&o);
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("policy,config,min_capacity_bytes,exact,outside_bytes,card,bytes,fits")
        );
        let rows: Vec<&str> = lines.collect();
        let whole =
            |l: &&str| l.starts_with("bfc,\"") && (l.ends_with(",true") || l.ends_with(",false"));
        assert!(rows.iter().all(whole), "one quoted config, a verdict per row: {text}");
        assert!(
            rows.iter().any(|l| l.contains(",16 GiB,")) && rows.iter().any(|l| l.contains(",t4,"))
        );
    }
    let o = run(&["fit", &t, "--format", "json", "--csv"]);
    assert_eq!(o.status.code(), Some(2), "two formats at once is a usage error");
}

#[test]
fn offline_past_2_56_names_the_file_format_and_event() {
    // Each free is two events (requested, completed): the third alloc is event 6.
    let size = 1u64 << 55;
    let mut text = String::new();
    for _ in 0..3 {
        text += &format!("alloc 0x0 {size} s0\nfree 0x0 {size} s0\n");
    }
    let (_dir, t) = temp_file("t.txt", text.as_bytes());
    let o = run(&["replay", t.to_str().unwrap(), "-p", "offline"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("t.txt: text: event 6: policy 'offline'"), "{}", stderr(&o));
}

#[test]
fn a_pickle_shorter_than_its_frame_is_truncated_even_from_a_pipe() {
    let mut data = b"\x80\x04\x95".to_vec();
    data.extend_from_slice(&(1u64 << 62).to_le_bytes());
    data.extend_from_slice(b"].");
    let mut child = fragsim()
        .args(["info", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&data).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("byte 2: truncated pickle: FRAME (0x95)"), "{}", stderr(&o));
    // A file reads the same.
    let (_dir, p) = temp_file("f.pickle", &data);
    let o = run(&["info", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("byte 2: truncated pickle: FRAME (0x95)"), "{}", stderr(&o));
}

#[test]
fn rejections_name_a_place() {
    let (_d1, none) = temp_file("none.pickle", b"\x80\x02N.");
    let (_d2, devices) = temp_file("devices.txt", b"device 0\ndevice 1\n");
    for (path, want) in [
        (&none, "pytorch-snapshot: byte 0: not a memory snapshot"),
        (&devices, "text: event 0: the trace has no events"),
    ] {
        let o = run(&["replay", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
}

// ---- Issue 46 ----

#[test]
fn own_json_inputs_stop_at_their_cap_while_reading_a_device() {
    let dir = tempfile::tempdir().unwrap();
    // Devices this test owns: a zero device (endless NULs) and a full device.
    let zero = dir.path().join("zero");
    let full = dir.path().join("full");
    for (p, minor) in [(&zero, "5"), (&full, "7")] {
        let st = std::process::Command::new("mknod")
            .args([p.to_str().unwrap(), "c", "1", minor])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let t = text_trace();
    let (z, f) = (zero.to_str().unwrap(), full.to_str().unwrap());
    let cases: [&[&str]; 4] = [
        &["check", &t, "--baseline", z],
        &["check", &t, "--baseline", f, "--update"],
        &["merge", z],
        &["merge", f],
    ];
    for args in cases {
        let start = Instant::now();
        let o = run(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(start.elapsed() < Duration::from_secs(10), "{args:?}: {:?}", start.elapsed());
        assert!(
            e.contains("byte 0") && e.contains("not a JSON file fragsim wrote"),
            "{args:?}: {e}"
        );
    }
}

#[test]
fn check_takes_a_replay_output_whose_recorded_row_has_no_value_for_a_metric() {
    let trace = real_trace("cs336-lm-step-c.pickle");
    let t = trace.to_str().unwrap();
    let o = run(&["replay", t, "-p", "pytorch", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let recorded = v["results"].as_array().unwrap().iter().find(|r| r["policy"] == "recorded");
    assert!(recorded.unwrap()["fragmentation_at_peak"].is_null(), "the case this covers");
    let (_dir, baseline) = temp_file("replay.json", &o.stdout);
    let o = run(&["check", t, "-p", "pytorch", "--baseline", baseline.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A part for merge keeps its stricter rule: null is no number there.
    let o = run(&["merge", baseline.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn diff_names_the_trace_that_lacks_the_device() {
    let a = real_trace("cs336-lm-step-c.pickle");
    let b = real_trace("cs336-lm-step-b.pickle");
    let o = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--device", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("cs336-lm-step-c.pickle") && e.contains("no device 1"), "{e}");
}

/// `v` without its timings (keys ending in `_seconds`), at any depth.
fn without_seconds(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.retain(|k, _| !k.ends_with("_seconds"));
            for x in m.values_mut() {
                *x = without_seconds(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_seconds(x.take());
            }
        }
        _ => {}
    }
    v
}

#[test]
fn blame_and_diff_take_json_and_csv_like_every_command_with_format() {
    let a = real_trace("cs336-lm-step-c.pickle");
    let b = real_trace("cs336-lm-step-b.pickle");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for cmd in [&["blame", a][..], &["diff", a, b]] {
        let mut json = cmd.to_vec();
        json.push("--json");
        let o = run(&json);
        assert_eq!(o.status.code(), Some(0), "{json:?}: {}", stderr(&o));
        let by_flag: Value = serde_json::from_slice(&o.stdout).unwrap();
        let mut long = cmd.to_vec();
        long.extend(["--format", "json"]);
        let by_format: Value = serde_json::from_slice(&run(&long).stdout).unwrap();
        assert_eq!(without_seconds(by_flag), without_seconds(by_format), "{cmd:?}");
        let mut csv = cmd.to_vec();
        csv.push("--csv");
        let o = run(&csv);
        assert_eq!(o.status.code(), Some(0), "{csv:?}: {}", stderr(&o));
        let mut long = cmd.to_vec();
        long.extend(["--format", "csv"]);
        assert_eq!(stdout(&o), stdout(&run(&long)), "{cmd:?}");
    }
}
