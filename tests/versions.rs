//! PyTorch releases as a setting (docs/pytorch-model.md#versions): which release a recording
//! shows, `--pytorch-version` / `version=` as a what-if, and the rules of 2.12 – 2.15 end to
//! end, on recordings built here.

use crate::util::*;
use fragsim::trace::pickle::encode::Encoder;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const A: u64 = 0x7f00_0000_0000;

/// Pickles a JSON value as Python would pickle the same dicts, lists, strings and numbers.
fn encode(e: &mut Encoder, v: &Value) {
    match v {
        Value::Null => e.none(),
        Value::Bool(b) => e.bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => e.int(i as i128),
            None => match n.as_u64() {
                Some(u) => e.int(u as i128),
                None => e.float(n.as_f64().unwrap_or(0.0)),
            },
        },
        Value::String(s) => e.str(s),
        Value::Array(xs) => {
            e.begin_list();
            for x in xs {
                encode(e, x);
            }
            e.end_list();
        }
        Value::Object(m) => {
            e.begin_dict();
            for (k, x) in m {
                e.str(k);
                encode(e, x);
            }
            e.end_dict();
        }
    }
}

fn pickle(v: &Value) -> Vec<u8> {
    let mut e = Encoder::new();
    encode(&mut e, v);
    e.finish()
}

fn entry(action: &str, addr: u64, size: u64, t: u64) -> Value {
    json!({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []})
}

fn with(mut v: Value, key: &str, x: Value) -> Value {
    v[key] = x;
    v
}

/// A 2.15 recording: a 20 MiB segment, 2 MiB live in it at the end, 4 MiB allocated and freed
/// after it, a label on the 2 MiB block; every key 2.12 – 2.15 added.
fn snapshot_2_15() -> Value {
    let tagged = |e: Value| with(e, "internal_metadata", json!(""));
    json!({
        "segments": [{
            "device": 0, "address": A, "total_size": 20 * MIB, "allocated_size": 2 * MIB,
            "active_size": 2 * MIB, "requested_size": 2 * MIB, "stream": 0,
            "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": false,
            "frames": [],
            "blocks": [
                {"address": A, "size": 2 * MIB, "requested_size": 2 * MIB,
                 "state": "active_allocated", "frames": []},
                {"address": A + 2 * MIB, "size": 18 * MIB, "requested_size": 0,
                 "state": "inactive", "frames": []}
            ]
        }],
        "device_traces": [[
            tagged(entry("segment_alloc", A, 20 * MIB, 1)),
            with(tagged(entry("alloc", A, 2 * MIB, 2)), "user_metadata", json!("{\"step\":1}")),
            with(entry("annotate", A, 0, 3), "user_metadata", json!("{\"layer\":\"mlp.0\"}")),
            tagged(entry("alloc", A + 2 * MIB, 4 * MIB, 4)),
            tagged(entry("free_requested", A + 2 * MIB, 4 * MIB, 5)),
            tagged(entry("free_completed", A + 2 * MIB, 4 * MIB, 6)),
        ]],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False,throw_on_cudamalloc_oom:False,\
                pinned_free_catch_all:True,pinned_max_round_threshold_mb:64,\
                pinned_max_cached_size_mb:128,expandable_segments_reserve:0.5,\
                expandable_segments_reserve_by_class:[serving:0.25,ads_sparse:8G]",
            "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": false, "roundup_power2_divisions": vec![0; 16],
            "release_lock_on_cudamalloc": false, "max_round_threshold": 1024,
            "max_cached_size": 0
        },
        "host_segments": [{"address": 0x5000_0000u64, "size": 4 * MIB, "allocated": MIB,
                           "active": true, "owner_private_pool_id": [0, 0], "frames": []}],
        "host_traces": [[{"action": "alloc", "addr": 0x5000_0000u64, "size": MIB, "time_us": 1}]]
    })
}

/// `validate` of `snapshot`: (exit code, JSON, the text with --verbose).
fn validate(snapshot: &Value, extra: &[&str]) -> (i32, Value, String) {
    let (_d, path) = temp_file("s.pickle", &pickle(snapshot));
    let p = path.to_str().unwrap();
    let mut args = vec!["validate", p, "--json"];
    args.extend(extra);
    let out = run(&args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let mut args = vec!["validate", p, "--verbose"];
    args.extend(extra);
    let text = stdout(&run(&args)) + &stderr(&run(&args));
    (out.status.code().unwrap_or(-1), v, text)
}

#[test]
fn a_snapshot_with_2_15_keys_validates_and_names_2_15() {
    let (code, v, text) = validate(&snapshot_2_15(), &[]);
    assert_eq!(code, 0, "{v} {text}");
    assert_eq!(v["allocs_total"], 2, "the annotate entry is no allocation: {v}");
    assert_eq!(v["allocs_addr_matched"], 2, "{v}");
    assert_eq!(v["peak_reserved_simulated_bytes"], v["peak_reserved_recorded_bytes"]);
    assert!(
        text.contains("modelled PyTorch 2.15 (trace entries carry internal_metadata)"),
        "{text}"
    );
    assert!(!text.contains("does not model"), "every 2.12 – 2.15 option is known: {text}");
    // `info` shows the pinned host allocator as its own device, and the labels.
    let (_d, path) = temp_file("s.pickle", &pickle(&snapshot_2_15()));
    let out = run(&["info", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let info = stdout(&out);
    assert!(
        info.contains("pinned host memory (host_segments): 1 segment, 4.00 MiB reserved, 1.00 MiB allocated; host_traces: 1 entry"),
        "{info}"
    );
    assert!(info.contains("annotate entries: 1"), "{info}");
    // The same in info's JSON.
    let out = run(&["info", path.to_str().unwrap(), "--json"]);
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["pytorch_release"]["version"], "2.15", "{j}");
    assert_eq!(
        j["host_segments"],
        json!({"segments": 1, "reserved_bytes": 4 * MIB, "allocated_bytes": MIB})
    );
    assert_eq!(
        (j["host_trace_entries"].as_u64(), j["annotate_entries"].as_u64()),
        (Some(1), Some(1))
    );
    // A pinned block's `allocated` as a bool (allocated or not) counts its size, not one byte.
    let mut by_flag = snapshot_2_15();
    by_flag["host_segments"][0]["allocated"] = Value::Bool(true);
    let (_d, flagged) = temp_file("b.pickle", &pickle(&by_flag));
    let flagged = stdout(&run(&["info", flagged.to_str().unwrap()]));
    assert!(flagged.contains("4.00 MiB reserved, 4.00 MiB allocated"), "{flagged}");
    // A size no host held (2^64 - 1) is read as not given, not summed into an impossible total.
    let mut huge = snapshot_2_15();
    let forged = json!({"address": 0x6000_0000u64, "size": u64::MAX, "allocated": u64::MAX});
    huge["host_segments"].as_array_mut().unwrap().push(forged);
    let (_d, huge) = temp_file("h.pickle", &pickle(&huge));
    let huge = stdout(&run(&["info", huge.to_str().unwrap()]));
    assert!(huge.contains("2 segments, 4.00 MiB reserved, 1.00 MiB allocated"), "{huge}");
    assert!(
        info.contains("PyTorch release: 2.15 (trace entries carry internal_metadata)"),
        "{info}"
    );
    // A replay says which release it modelled (on stderr; its JSON unchanged).
    let out = run(&["replay", path.to_str().unwrap(), "-p", "pytorch", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("modelled PyTorch 2.15"), "{}", stderr(&out));
}

/// Each piece of evidence alone, strongest first; none: 2.11, said as a default.
#[test]
fn the_modelled_release_follows_the_recordings_evidence() {
    let base = snapshot_2_15();
    let strip = |mut v: Value, keys: &[&str]| {
        let root = v.as_object_mut().unwrap();
        for k in keys {
            root.remove(*k);
        }
        for e in root["device_traces"][0].as_array_mut().unwrap() {
            e.as_object_mut().unwrap().remove("internal_metadata");
        }
        v
    };
    let conf = |mut v: Value, c: &str| {
        v["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = json!(c);
        v
    };
    let no_round = |mut v: Value| {
        let s = v["allocator_settings"].as_object_mut().unwrap();
        s.remove("max_round_threshold");
        s.remove("max_cached_size");
        v
    };
    let no_annotate = |mut v: Value| {
        v["device_traces"][0].as_array_mut().unwrap().retain(|e| e["action"] != "annotate");
        v
    };
    let annotated = conf(strip(base.clone(), &["host_segments", "host_traces"]), "");
    let round = no_annotate(annotated.clone());
    let throw = conf(no_round(round.clone()), "throw_on_cudamalloc_oom:False");
    let nothing = conf(no_round(round.clone()), "");
    for (v, says) in [
        (annotated, "PyTorch ≥ 2.14 (the trace has annotate entries); modelled 2.15"),
        (round, "PyTorch ≥ 2.13 (allocator_settings has max_round_threshold); modelled 2.15"),
        (throw, "PyTorch ≥ 2.12 (the settings string names throw_on_cudamalloc_oom), and allocator_settings lacks max_round_threshold, which 2.13+ write: modelled 2.12"),
        (nothing, "modelled PyTorch 2.11: nothing in the recording shows a later release"),
    ] {
        let (code, _, text) = validate(&v, &[]);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains(says), "{says}: {text}");
        // Converted to a snapshot, it shows the same release (before, the 2.13 keys of the
        // settings were dropped, and with them the evidence).
        let (dir, path) = temp_file("e.pickle", &pickle(&v));
        let out = dir.path().join("converted.pickle");
        let c = run(&["convert", path.to_str().unwrap(), out.to_str().unwrap()]);
        assert_eq!(c.status.code(), Some(0), "{}", stderr(&c));
        let o = run(&["validate", out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stdout(&o).contains(says), "converted: {says}: {}", stdout(&o));
    }
}

#[test]
fn pytorch_versions_2_12_to_2_15_are_accepted_and_later_ones_refused() {
    for v in ["2.12", "2.13", "2.14", "2.15", "2.15.1"] {
        let (code, out, text) = validate(&snapshot_2_15(), &["--pytorch-version", v]);
        assert_eq!(code, 0, "{v}: {out} {text}");
        // The notes name the release modelled, asked for or not.
        let named = format!("modelled PyTorch {} (as asked)", &v[..4]);
        assert!(text.contains(&named), "{v}: {text}");
    }
    let (code, _, text) = validate(&snapshot_2_15(), &["--pytorch-version", "2.16"]);
    assert_eq!(code, 2);
    assert!(text.contains("PyTorch 2.16 is newer than the newest modelled, 2.15"), "{text}");
    // As a what-if in a replay's spec.
    let (_d, path) = temp_file("s.pickle", &pickle(&snapshot_2_15()));
    let p = path.to_str().unwrap();
    for spec in ["pytorch:version=2.12", "pytorch:version=2.15", "pytorch:version=2.8"] {
        let out = run(&["replay", p, "-p", spec, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{spec}: {}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["results"][0]["oom"], false, "{spec}");
    }
    let out = run(&["replay", p, "-p", "pytorch:version=2.16"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("newer than the newest modelled"), "{}", stderr(&out));
    let out = run(&["replay", p, "-p", "pytorch:throw_on_cudamalloc_oom:True,version=2.11"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("throw_on_cudamalloc_oom is an option of PyTorch 2.12 and later"),
        "{}",
        stderr(&out)
    );
}

/// A text trace: 30 MiB allocated and freed, then 40 MiB.
const CACHE_THEN_MORE: &str = "# fragsim text trace v1\nalloc 0x7f0000000000 31457280\n\
    free 0x7f0000000000 31457280\nalloc 0x7f0004000000 41943040\n";

fn replay_json(trace: &str, args: &[&str]) -> Value {
    let (_d, path) = temp_file("t.txt", trace.as_bytes());
    let mut all = vec!["replay", path.to_str().unwrap(), "--json"];
    all.extend(args);
    let out = run(&all);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// 2.12's `throw_on_cudamalloc_oom` under a 0.5 memory fraction of a 100 MiB card (50 MiB):
/// the default frees the 30 MiB cache and serves 40 MiB; with the option the request fails
/// where it would pass the limit.
#[test]
fn throw_on_cudamalloc_oom_makes_a_replay_run_out_where_the_default_frees_cache() {
    let v = replay_json(
        CACHE_THEN_MORE,
        &[
            "--capacity",
            "100MiB",
            "-p",
            "pytorch:per_process_memory_fraction:0.5",
            "-p",
            "pytorch:per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True",
            "-p",
            "pytorch:per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True,version=2.15",
        ],
    );
    let r = &v["results"];
    assert_eq!(r[0]["oom"], false, "{v}");
    assert_eq!(r[0]["peak_reserved_bytes"], 40 * MIB);
    for k in [1, 2] {
        assert_eq!(r[k]["oom"], true, "{v}");
        assert_eq!(r[k]["first_oom_event"], 3, "the 40 MiB request: {v}");
        assert_eq!(r[k]["peak_reserved_bytes"], 30 * MIB, "nothing released: {v}");
    }
}

/// 2.15's `expandable_segments_reserve:64M` on a 1 GiB card: two 50 MiB requests need two
/// reservations (60 MiB mapped in each, 120 MiB), where one 9/8-of-the-card reservation holds
/// both in 100 MiB; a 100 MiB request does not fit in one and fails.
#[test]
fn expandable_segments_reserve_changes_a_replay() {
    let two =
        "# fragsim text trace v1\nalloc 0x7f0000000000 52428800\nalloc 0x7f0010000000 52428800\n";
    let v = replay_json(
        two,
        &[
            "--capacity",
            "1GiB",
            "-p",
            "pytorch:expandable_segments:True",
            "-p",
            "pytorch:expandable_segments:True,expandable_segments_reserve:64M",
        ],
    );
    assert_eq!(v["results"][0]["peak_reserved_bytes"], 100 * MIB, "{v}");
    assert_eq!(v["results"][1]["peak_reserved_bytes"], 120 * MIB, "{v}");
    let one = "# fragsim text trace v1\nalloc 0x7f0000000000 104857600\n";
    let v = replay_json(
        one,
        &[
            "--capacity",
            "1GiB",
            "-p",
            "pytorch:expandable_segments:True,expandable_segments_reserve:64M",
        ],
    );
    assert_eq!(v["results"][0]["oom"], true, "{v}");
}

/// A snapshot whose entries name their pools: 60 MiB allocated and freed in the default pools,
/// then 50 MiB allocated into private pool `pool`, its stack through `frame`.
fn pool_snapshot(pool: [u64; 2], frame: &str) -> Value {
    pool_snapshot_of(pool, frame, 50 * MIB)
}

/// [`pool_snapshot`] whose private-pool request is `request` bytes.
fn pool_snapshot_of(pool: [u64; 2], frame: &str, request: u64) -> Value {
    let stack = json!([{"filename": "torch/cuda/memory.py", "line": 1, "name": frame}]);
    let e = |action: &str, addr: u64, size: u64, t: u64, pool: Value, frames: &Value| {
        let mut v = entry(action, addr, size, t);
        v["pool_id"] = pool;
        v["frames"] = frames.clone();
        v
    };
    let none = json!([]);
    json!({
        "segments": [],
        "device_traces": [[
            e("alloc", A, 60 * MIB, 1, json!([0, 0]), &none),
            e("free_requested", A, 60 * MIB, 2, json!([0, 0]), &none),
            e("free_completed", A, 60 * MIB, 3, json!([0, 0]), &none),
            e("alloc", A + 0x1000_0000, request, 4, json!(pool), &stack),
        ]]
    })
}

/// Whether `replay -p pytorch:version=VERSION --capacity 100MiB` of `snapshot` runs out.
fn oom(snapshot: &Value, version: &str) -> bool {
    oom_under(snapshot, version, "100MiB")
}

/// Whether `replay -p pytorch:version=VERSION --capacity CAPACITY` of `snapshot` runs out.
fn oom_under(snapshot: &Value, version: &str, capacity: &str) -> bool {
    let (_d, path) = temp_file("pools.pickle", &pickle(snapshot));
    let spec = format!("pytorch:version={version}");
    let out =
        run(&["replay", path.to_str().unwrap(), "--capacity", capacity, "-p", &spec, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["results"][0]["oom"].as_bool().unwrap()
}

/// 2.13's "a capture is not a pool" end to end: under a 100 MiB card, the 50 MiB malloc into a
/// `use_mem_pool` pool `(0, 1)` needs the 60 MiB default-pool cache released. 2.13+ do that
/// fallback, 2.12 did not (the pool counted as a capture); a graph capture's pool `(1, 0)`, or a
/// `(0, n)` pool whose stacks do not show `use_mem_pool`, never does.
#[test]
fn a_mem_pool_malloc_is_no_capture_from_2_13_in_a_replay() {
    let mem_pool = pool_snapshot([0, 1], "use_mem_pool");
    assert!(!oom(&mem_pool, "2.13"), "cache released for a MemPool malloc");
    assert!(!oom(&mem_pool, "2.15"));
    assert!(oom(&mem_pool, "2.12"), "before 2.13 a pool was a capture");
    assert!(oom(&pool_snapshot([1, 0], "use_mem_pool"), "2.15"), "a graph's pool id");
    assert!(oom(&pool_snapshot([0, 1], "capture_begin"), "2.15"), "a graph's stack");
}

/// torch_npu's `test_mempool_release_cached_blocks_during_diversion` (its allocator took the same
/// fix), with that test's budget: 80 MiB allowed, 60 MiB cached in the default pool, then 60 MiB
/// into a `MemPool`. From 2.13 the malloc releases the default pool's cache and fits; before, the
/// pool counted as a capture, nothing was released and it ran out. 60 MiB cached and 20 MiB
/// asked fit under either rule.
#[test]
fn torch_npu_s_mem_pool_budget_holds_from_2_13() {
    let mem_pool = pool_snapshot_of([0, 1], "use_mem_pool", 60 * MIB);
    assert!(!oom_under(&mem_pool, "2.13", "80MiB"), "the default pool's 60 MiB released");
    assert!(oom_under(&mem_pool, "2.12", "80MiB"), "120 MiB asked of 80");
    let small = pool_snapshot_of([0, 1], "use_mem_pool", 20 * MIB);
    assert!(!oom_under(&small, "2.12", "80MiB"), "80 MiB asked of 80");
}

/// [`pool_snapshot`] as a 2.13+ file under a 100 MiB card whose entries name no pool: only the
/// dump's segment, which the private pool owns (`segment_pool_id`), holds the 50 MiB block the
/// request made, after the default pool's 60 MiB segment was released for it.
fn unnamed_pool_snapshot(pool: [u64; 2], frame: &str) -> Value {
    let stack = json!([{"filename": "torch/cuda/memory.py", "line": 1, "name": frame}]);
    let b = A + 0x1000_0000;
    json!({
        "segments": [{
            "device": 0, "address": b, "total_size": 50 * MIB, "stream": 0,
            "segment_type": "large", "segment_pool_id": pool,
            "allocated_size": 50 * MIB, "active_size": 50 * MIB, "requested_size": 50 * MIB,
            "blocks": [{"address": b, "size": 50 * MIB, "requested_size": 50 * MIB,
                        "state": "active_allocated", "frames": stack}],
        }],
        "device_traces": [[
            entry("segment_alloc", A, 60 * MIB, 0),
            entry("alloc", A, 60 * MIB, 1),
            entry("free_requested", A, 60 * MIB, 2),
            entry("free_completed", A, 60 * MIB, 3),
            entry("segment_free", A, 60 * MIB, 4),
            entry("segment_alloc", b, 50 * MIB, 4),
            with(entry("alloc", b, 50 * MIB, 5), "frames", stack),
        ]]
    })
}

/// Where the entries name no pool, the pool a request was made into is the one whose segment
/// at the dump it lies in, and its stacks tell a `use_mem_pool` pool from a graph's as they do
/// where entries name pools: the 2.13 rule holds for such files too (before, every private pool
/// of a file without `pool_id` entries was read as a graph capture's).
#[test]
fn a_mem_pool_is_told_by_its_segment_where_entries_name_no_pool() {
    let mem_pool = unnamed_pool_snapshot([0, 1], "use_mem_pool");
    assert!(!oom(&mem_pool, "2.15"), "cache released for a MemPool malloc");
    assert!(oom(&mem_pool, "2.12"), "before 2.13 a pool was a capture");
    assert!(oom(&unnamed_pool_snapshot([0, 1], "capture_begin"), "2.15"), "a graph's stack");
    // validate reads the stacks of a file with a `(0, n)` pool, and reproduces the recording:
    // the release, the segment the request made, its block's address.
    let (_d, path) = temp_file("pools.pickle", &pickle(&mem_pool));
    let out = run(&["validate", path.to_str().unwrap(), "--pytorch-version", "2.15"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
}

/// The stacks that tell a pool's kind are read by every command, frames asked for or not: a
/// replay under the recording's own limit (no `--capacity`, which reads no frames) releases the
/// cache for the `use_mem_pool` malloc as the recording did and peaks at its recorded 60 MiB,
/// where it took the pool for a capture's, released nothing and ran out; a graph's stack still
/// releases nothing.
#[test]
fn a_mem_pool_is_told_by_its_stacks_without_frames_asked() {
    let replay = |snapshot: &Value| {
        let (_d, path) = temp_file("pools.pickle", &pickle(snapshot));
        let args = ["replay", path.to_str().unwrap(), "-p", "pytorch:version=2.15", "--json"];
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows = v["results"].as_array().unwrap().clone();
        let row = |p: &str| rows.iter().find(|r| r["policy"] == p).unwrap().clone();
        (row("pytorch"), row("recorded"), v)
    };
    let (pytorch, recorded, v) = replay(&unnamed_pool_snapshot([0, 1], "use_mem_pool"));
    assert_eq!(recorded["peak_reserved_bytes"], 60 * MIB, "{v}");
    assert_eq!(pytorch["peak_reserved_bytes"], recorded["peak_reserved_bytes"], "{v}");
    assert_eq!(pytorch["oom"], false, "{v}");
    let (pytorch, _, v) = replay(&unnamed_pool_snapshot([0, 1], "capture_begin"));
    assert_eq!(pytorch["oom"], true, "a graph's pool releases nothing: {v}");
}

/// A 2.15 recording of `mallocWithAddress` (2.13+): 4 MiB freed at the segment's start and a
/// 14 MiB block freed after a live 2 MiB one; then a 2 MiB request asked at 10 MiB into the
/// segment. The allocator allocates the 4 MiB prefix from the free block's start (6 MiB in),
/// the request at the address, and frees the prefix, which 2.15 tags. Best fit would have put
/// the prefix at the segment's start.
fn malloc_with_address_snapshot() -> Value {
    let tag = |e: Value, t: &str| with(e, "internal_metadata", json!(t));
    let block = |addr: u64, size: u64, live: bool| {
        json!({"address": addr, "size": size, "requested_size": if live { size } else { 0 },
               "state": if live { "active_allocated" } else { "inactive" }, "frames": []})
    };
    json!({
        "segments": [{
            "device": 0, "address": A, "total_size": 20 * MIB, "allocated_size": 4 * MIB,
            "active_size": 4 * MIB, "requested_size": 4 * MIB, "stream": 0,
            "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": false,
            "frames": [],
            "blocks": [
                block(A, 4 * MIB, false), block(A + 4 * MIB, 2 * MIB, true),
                block(A + 6 * MIB, 4 * MIB, false), block(A + 10 * MIB, 2 * MIB, true),
                block(A + 12 * MIB, 8 * MIB, false)
            ]
        }],
        "device_traces": [[
            tag(entry("segment_alloc", A, 20 * MIB, 1), ""),
            tag(entry("alloc", A, 4 * MIB, 2), ""),
            tag(entry("alloc", A + 4 * MIB, 2 * MIB, 3), ""),
            tag(entry("alloc", A + 6 * MIB, 14 * MIB, 4), ""),
            tag(entry("free_requested", A, 4 * MIB, 5), ""),
            tag(entry("free_completed", A, 4 * MIB, 6), ""),
            tag(entry("free_requested", A + 6 * MIB, 14 * MIB, 7), ""),
            tag(entry("free_completed", A + 6 * MIB, 14 * MIB, 8), ""),
            tag(entry("alloc", A + 6 * MIB, 4 * MIB, 9), ""),
            tag(entry("alloc", A + 10 * MIB, 2 * MIB, 10), ""),
            tag(entry("free_requested", A + 6 * MIB, 4 * MIB, 11), "mallocWithAddress"),
            tag(entry("free_completed", A + 6 * MIB, 4 * MIB, 12), "mallocWithAddress"),
        ]],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": false,
            "roundup_power2_divisions": vec![0; 16], "release_lock_on_cudamalloc": false
        }
    })
}

/// `validate` places the prefix and the request where recorded and counts them apart (a key
/// and a line of their own), never as mismatches; every other decision is compared as before.
#[test]
fn exact_address_allocations_are_placed_where_recorded_and_counted_apart() {
    let (code, v, text) = validate(&malloc_with_address_snapshot(), &[]);
    assert_eq!(code, 0, "{v} {text}");
    assert_eq!(v["allocs_total"], 5, "{v}");
    assert_eq!(v["allocs_exact_address"], 2, "the prefix and the request: {v}");
    assert_eq!(v["allocs_addr_matched"], 3, "the other three: {v}");
    assert_eq!(v["mismatches"], json!([]), "{v}");
    assert_eq!(v["segment_events_matched"], v["segment_events_recorded"], "{v}");
    assert!(
        text.contains(
            "3 of 3 determinable (100.00%); 0 undeterminable; 2 placed by address \
             (mallocWithAddress, not compared)"
        ),
        "{text}"
    );
    // Without the tag (a 2.13 or 2.14 recording leaves none), nothing says the address was
    // asked for: the prefix is a best-fit decision, and a mismatch.
    let mut untagged = malloc_with_address_snapshot();
    for e in untagged["device_traces"][0].as_array_mut().unwrap() {
        e["internal_metadata"] = json!("");
    }
    let (code, v, _) = validate(&untagged, &[]);
    assert_eq!(code, 1, "{v}");
    assert!(v.get("allocs_exact_address").is_none(), "a key only where there are some: {v}");
    assert_eq!(v["mismatches"][0]["event"], 8, "the prefix's alloc: {v}");
    // A replay places them too, and its peak equals the recorded one.
    let (_d, path) = temp_file("s.pickle", &pickle(&malloc_with_address_snapshot()));
    let out = run(&["replay", path.to_str().unwrap(), "-p", "pytorch", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["results"][0]["peak_reserved_bytes"], 20 * MIB, "{r}");
}

/// `blame --by annotation`: the 2.15 recording's `annotate` entry labels the 2 MiB allocation
/// at its address; at event 2 (both allocations live) that label holds 2 MiB and the 4 MiB
/// allocation no entry labelled is `(no annotation)`; CSV and the table show the same groups.
#[test]
fn blame_by_annotation_groups_allocations_by_their_labels() {
    let (_d, path) = temp_file("s.pickle", &pickle(&snapshot_2_15()));
    let p = path.to_str().unwrap();
    let args = ["blame", p, "--at", "2", "--by", "annotation", "--top", "0"];
    let out = run(&[&args[..], &["--format", "json"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["by"], "annotation");
    let row = v["results"].as_array().unwrap().iter().find(|r| r["policy"] == "pytorch").unwrap();
    let groups: Vec<(String, u64)> = row["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["site"].as_str().unwrap().to_string(), s["live_bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        groups,
        vec![
            ("(no annotation)".to_string(), 4 * MIB),
            ("{\"layer\":\"mlp.0\"}".to_string(), 2 * MIB)
        ],
        "{v}"
    );
    for format in ["csv", "table"] {
        let out = run(&[&args[..], &["--format", format]].concat());
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(text.contains("mlp.0") && text.contains("(no annotation)"), "{format}: {text}");
    }
}

/// An `annotate` label is a name from the trace like a frame's: `blame --by annotation` and
/// `diff --by annotation` write its control characters out in the table, the CSV and the JSON,
/// and diff's site-delta chart stays well-formed XML (D4: an ESC and a NUL went out raw).
#[test]
fn annotation_labels_are_shown_with_control_characters_written_out() {
    let mut v = snapshot_2_15();
    v["device_traces"][0][2]["user_metadata"] = json!("<b>\u{1b}]]>\u{0}");
    let (dir, path) = temp_file("s.pickle", &pickle(&v));
    let p = path.to_str().unwrap();
    let raw = |text: &str| text.chars().any(|c| c.is_control() && c != '\n');
    let blame = ["blame", p, "--at", "2", "--by", "annotation", "--top", "0"];
    let diff = ["diff", p, "-p", "pytorch", "-p", "bfc", "--by", "annotation", "--top", "0"];
    for cmd in [&blame[..], &diff[..]] {
        for format in ["table", "csv", "json"] {
            let out = run(&[cmd, &["--format", format]].concat());
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            let text = stdout(&out);
            assert!(!raw(&text), "{cmd:?} {format}: {text:?}");
            let shown = if format == "json" { "<b>\\\\x1b]]>\\\\0" } else { "<b>\\x1b]]>\\0" };
            assert!(text.contains(shown), "{cmd:?} {format}: {text}");
        }
    }
    let out = dir.path().join("diff");
    let o = fragsim().args(diff).arg("--out").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let svg = std::fs::read_to_string(out.join("site-delta.svg")).unwrap();
    assert!(svg.contains("&lt;b&gt;\\x1b]]&gt;\\0"), "{svg}");
    roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("site-delta.svg: {e}"));
}

/// `convert` to a snapshot keeps what 2.14 – 2.15 entries carry that fragsim uses: the
/// `annotate` labels (so `blame --by annotation` groups alike), the `mallocWithAddress` tags
/// (so `validate` still places and counts those allocs apart) and `internal_metadata` (the
/// release evidence).
#[test]
fn a_snapshot_round_trip_keeps_annotations_and_exact_address_tags() {
    let (_d, path) = temp_file("s.pickle", &pickle(&snapshot_2_15()));
    let dir = tempfile::tempdir().unwrap();
    let blame = |p: &str| {
        let o = run(&["blame", p, "--at", "2", "--by", "annotation", "--format", "json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["results"].clone()
    };
    // To a snapshot and to fragsim's own .fst alike.
    for name in ["again.pickle", "again.fst"] {
        let out = dir.path().join(name);
        let (a, b) = (path.to_str().unwrap(), out.to_str().unwrap());
        let c = run(&["convert", a, b]);
        assert_eq!(c.status.code(), Some(0), "{}", stderr(&c));
        assert_eq!(blame(a), blame(b), "{name}");
        let info = stdout(&run(&["info", b]));
        assert!(info.contains("annotate entries: 1"), "{name}: {info}");
        assert!(info.contains("PyTorch release: 2.15"), "{name}: {info}");
    }
    // The exact-address recording, converted, validates and replays as the original does.
    let (_d2, path) = temp_file("m.pickle", &pickle(&malloc_with_address_snapshot()));
    for name in ["m2.pickle", "m2.fst"] {
        let out = dir.path().join(name);
        let c = run(&["convert", path.to_str().unwrap(), out.to_str().unwrap()]);
        assert_eq!(c.status.code(), Some(0), "{}", stderr(&c));
        let o = run(&["validate", out.to_str().unwrap(), "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(o.status.code(), Some(0), "{name}: {v}");
        assert_eq!(
            (v["allocs_exact_address"].as_u64(), v["allocs_addr_matched"].as_u64()),
            (Some(2), Some(3)),
            "{name}"
        );
        let replay = |p: &std::path::Path| {
            let o = run(&["replay", p.to_str().unwrap(), "-p", "all", "--json"]);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            let rows = v["results"].as_array().unwrap().iter();
            rows.map(|r| (r["policy"].clone(), r["peak_reserved_bytes"].clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(replay(&out), replay(&path), "{name}");
    }
}

/// `--pytorch-version V` on every command that replays: `version=V` added to each PyTorch
/// spec (shown in its configuration, so releases are told apart), the other policies left,
/// and a flag that would change nothing, or says another release than a spec, refused.
#[test]
fn pytorch_version_is_a_what_if_flag_of_every_replaying_command() {
    let fraction = "pytorch:per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True";
    let v = replay_json(
        CACHE_THEN_MORE,
        &["--capacity", "100MiB", "-p", fraction, "-p", "bfc", "--pytorch-version", "2.15"],
    );
    let r = &v["results"];
    let pytorch = r.as_array().unwrap().iter().find(|x| x["policy"] == "pytorch").unwrap();
    assert_eq!(pytorch["oom"], true, "{v}");
    assert!(pytorch["config"].as_str().unwrap().ends_with(",version=2.15"), "{v}");
    let bfc = r.as_array().unwrap().iter().find(|x| x["policy"] == "bfc").unwrap();
    assert!(!bfc["config"].as_str().unwrap().contains("version"), "{v}");

    let (_d, path) = temp_file("t.txt", CACHE_THEN_MORE.as_bytes());
    let p = path.to_str().unwrap();
    // 2.11 has no throw_on_cudamalloc_oom: the flag is the release modelled, not a floor.
    let out = run(&["replay", p, "-p", fraction, "--pytorch-version", "2.11"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is an option of PyTorch 2.12 and later"), "{}", stderr(&out));
    let out = run(&["replay", p, "-p", "bfc", "--pytorch-version", "2.15"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("none of the policies given (bfc) is PyTorch's"),
        "{}",
        stderr(&out)
    );
    let out = run(&["replay", p, "-p", "pytorch:version=2.12", "--pytorch-version", "2.15"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("give the version once"), "{}", stderr(&out));
    for bad in ["2.16", "2.015", "two"] {
        let out = run(&["replay", p, "--pytorch-version", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
    }

    // diff of one trace: the recording's release against the one asked, labelled apart.
    let out = run(&["diff", p, "--pytorch-version", "2.15", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!d["a"]["config"].as_str().unwrap().contains("version"), "{d}");
    assert!(d["b"]["config"].as_str().unwrap().ends_with("version=2.15"), "{d}");

    // sweep: every PyTorch config of the grid under the release, the reference as recorded,
    // and one note for the lot.
    let out = run(&[
        "sweep",
        p,
        "-p",
        "pytorch:max_split_size_mb:{64,128}",
        "--pytorch-version",
        "2.13",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    let configs: Vec<&str> =
        s["ranking"].as_array().unwrap().iter().map(|x| x["spec"].as_str().unwrap()).collect();
    assert!(configs.contains(&"pytorch:max_split_size_mb:64,version=2.13"), "{s}");
    assert!(configs.contains(&"pytorch"), "the reference: {s}");
    let notes = stderr(&out);
    assert_eq!(notes.matches("modelled PyTorch 2.13 (as asked)").count(), 1, "{notes}");

    // fit, check, blame, explain and report take it too.
    let dir = tempfile::tempdir().unwrap();
    let report_dir = dir.path().join("r");
    let baseline = dir.path().join("b.json");
    for args in [
        vec!["fit", p, "--pytorch-version", "2.15"],
        vec![
            "check",
            p,
            "--baseline",
            baseline.to_str().unwrap(),
            "--update",
            "--pytorch-version",
            "2.15",
        ],
        vec!["blame", p, "--pytorch-version", "2.15"],
        vec!["explain", p, "--pytorch-version", "2.15"],
        vec!["report", p, "--out", report_dir.to_str().unwrap(), "--pytorch-version", "2.15"],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("modelled PyTorch 2.15 (as asked)"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let written = std::fs::read_to_string(&baseline).unwrap();
    assert!(written.contains("version=2.15"), "{written}");
}

/// `replay --export-snapshot` of `snapshot`'s `pytorch` run: the file's path (in `dir`) and
/// stderr.
fn exported(dir: &tempfile::TempDir, snapshot: &Value, name: &str) -> (String, String) {
    let input = dir.path().join(format!("{name}.in.pickle"));
    std::fs::write(&input, pickle(snapshot)).unwrap();
    let out = dir.path().join(format!("{name}.pickle"));
    let o = run(&[
        "replay",
        input.to_str().unwrap(),
        "-p",
        "pytorch",
        "--export-snapshot",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    (out.to_str().unwrap().to_string(), stderr(&o))
}

/// The exported run of a 2.15 recording of `mallocWithAddress` keeps the prefix's tags on its
/// simulated entries: `validate` of the file places the prefix and the request where the run
/// did and counts them apart, as it does for the recording (the export used to drop the tags,
/// and the prefix became a best-fit decision that validate called a mismatch); the tags are the
/// 2.15 evidence, so `info` of the file names 2.15 as it does for the recording.
#[test]
fn an_exported_run_keeps_its_exact_address_allocations_apart() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = exported(&dir, &malloc_with_address_snapshot(), "m");
    let o = run(&["validate", &file, "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(v["allocs_exact_address"], 2, "the prefix and the request: {v}");
    assert_eq!(v["allocs_addr_matched"], 3, "{v}");
    assert_eq!(v["mismatches"], json!([]), "{v}");
    let info = stdout(&run(&["info", &file]));
    assert!(
        info.contains("PyTorch release: 2.15 (trace entries carry internal_metadata)"),
        "{info}"
    );
    assert!(info.contains("mallocWithAddress): 2 prefix entries"), "its free pair: {info}");
}

/// The exported run keeps the recording's `annotate` labels, each on the simulated allocation
/// it labels: `blame --by annotation` of the file groups its run's memory as it groups the
/// recording's replay, and `info` names the same release (2.15, from `internal_metadata`).
#[test]
fn an_exported_run_keeps_its_labels_for_blame_by_annotation() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = exported(&dir, &snapshot_2_15(), "s");
    let (_d, recording) = temp_file("s.pickle", &pickle(&snapshot_2_15()));
    let groups = |p: &str| {
        let o = run(&["blame", p, "--by", "annotation", "--at", "peak-live", "--format", "json"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let row = v["results"].as_array().unwrap().iter().find(|r| r["policy"] == "pytorch");
        let sites = row.unwrap()["sites"].as_array().unwrap().clone();
        let pairs: Vec<(String, u64)> = sites
            .iter()
            .map(|s| (s["site"].as_str().unwrap().to_string(), s["live_bytes"].as_u64().unwrap()))
            .collect();
        pairs
    };
    let want = groups(recording.to_str().unwrap());
    assert!(want.iter().any(|(s, b)| s.contains("mlp.0") && *b == 2 * MIB), "{want:?}");
    assert_eq!(groups(&file), want);
    let info = stdout(&run(&["info", &file]));
    assert!(info.contains("annotate entries: 1"), "{info}");
    assert!(info.contains("PyTorch release: 2.15"), "{info}");
}

/// Where the recording shows its release only by what the simulated run does not hold (the
/// pinned host allocator's `host_segments`), the export cannot show it: the command says so,
/// and how to model that release when replaying the file.
#[test]
fn an_export_that_cannot_show_the_recordings_release_says_so() {
    let mut v = snapshot_2_15();
    v["device_traces"][0].as_array_mut().unwrap().retain(|e| e["action"] != "annotate");
    for e in v["device_traces"][0].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("internal_metadata");
    }
    v["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = json!("");
    let s = v["allocator_settings"].as_object_mut().unwrap();
    s.remove("max_round_threshold");
    s.remove("max_cached_size");
    let dir = tempfile::tempdir().unwrap();
    let (file, notes) = exported(&dir, &v, "h");
    assert!(
        notes.contains(&format!(
            "note: {file} shows no PyTorch release past 2.11: the recording's evidence of 2.15 \
             (the snapshot has the pinned host allocator's host_segments)"
        )),
        "{notes}"
    );
    assert!(notes.contains("give --pytorch-version 2.15"), "{notes}");
    // Nothing to say where the export shows the recording's release.
    let (_, notes) = exported(&dir, &snapshot_2_15(), "s");
    assert!(!notes.contains("shows no PyTorch release"), "{notes}");
}

/// The exported run's entries name their pools as the recording's did (`pool_id`), so a
/// replay of the file routes each request into the pool its entry names.
#[test]
fn an_exported_run_keeps_the_pools_its_entries_name() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = exported(&dir, &pool_snapshot([1, 0], "capture_begin"), "p");
    let o = run(&["info", &file, "--json"]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (j["entry_private_pools"].as_u64(), j["private_pool_allocs"].as_u64()),
        (Some(1), Some(1)),
        "{j}"
    );
    let o = run(&["validate", &file, "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{v}");
}

/// A Kineto trace recorded on ROCm (`Device Type` 6, c10's HIP): 30 MiB allocated and freed,
/// then 40 MiB (`ty` the memory events' device type).
fn kineto_30_then_40(ty: u32) -> Vec<u8> {
    let e = |ts: u64, addr: u64, bytes: i64| {
        json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
               "tid": 1, "ts": ts, "args": {"Device Type": ty, "Device Id": 0, "Addr": addr,
               "Bytes": bytes}})
    };
    let v = json!({"schemaVersion": 1, "traceEvents": [
        e(1, A, 30 * MIB as i64), e(2, A, -(30 * MIB as i64)), e(3, A + 0x1000_0000, 40 * MIB as i64)
    ]});
    serde_json::to_vec(&v).unwrap()
}

/// The peaks of `-p` each of `specs` on the Kineto trace at `path` (plus `extra` arguments), and
/// stderr.
fn peaks(path: &str, specs: &[&str], extra: &[&str]) -> (Vec<(String, u64)>, String) {
    let mut args = vec!["replay", path, "--json"];
    for s in specs {
        args.extend(["-p", s]);
    }
    args.extend(extra);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["results"].as_array().unwrap().iter().filter(|r| r["policy"] != "recorded");
    let peaks = rows
        .map(|r| {
            (r["config"].as_str().unwrap().to_string(), r["peak_reserved_bytes"].as_u64().unwrap())
        })
        .collect();
    (peaks, stderr(&out))
}

/// PyTorch before 2.12 has no expandable segments on ROCm: `expandable_segments:True` warns and
/// the allocator runs without them (`CUDAAllocatorConfig::expandable_segments()`). A ROCm
/// trace (which shows no release: 2.11 is modelled) replays `pytorch-expandable` without them —
/// the 40 MiB request gets a segment of its own beside the cached 30 MiB — and says so; from
/// 2.12 they are in effect (with ROCm 7+, which the trace does not say, so a note says that);
/// `pytorch-cuda` is CUDA's allocator whatever made the recording; the same trace recorded on
/// CUDA replays them.
#[test]
fn rocm_replays_expandable_segments_only_from_2_12() {
    let (_d, rocm) = temp_file("rocm.json", &kineto_30_then_40(6));
    let rocm = rocm.to_str().unwrap();
    let info = stdout(&run(&["info", rocm]));
    assert!(info.contains("platform: ROCm (its memory events record Device Type 6"), "{info}");
    let j: Value = serde_json::from_slice(&run(&["info", rocm, "--json"]).stdout).unwrap();
    assert_eq!(j["platform"]["name"], "rocm", "{j}");

    let specs = ["pytorch", "pytorch-expandable", "pytorch:expandable_segments:True"];
    let (p, notes) = peaks(rocm, &specs, &[]);
    assert_eq!(p.iter().map(|x| x.1).collect::<Vec<_>>(), [70 * MIB; 3], "{p:?}");
    // The settings as set, as PyTorch's own allocator_settings string keeps them.
    assert!(p[1].0.starts_with("expandable_segments:True"), "{p:?}");
    assert!(
        notes.contains(
            "note: pytorch-expandable and 1 other config: recorded on ROCm (its memory events \
             record Device Type 6"
        ) && notes.contains("PyTorch 2.11 on ROCm does not have expandable segments")
            && notes.contains("--pytorch-version 2.12 models that"),
        "{notes}"
    );
    let (p, notes) = peaks(rocm, &specs[1..2], &["--pytorch-version", "2.12"]);
    assert_eq!(p[0].1, 40 * MIB, "{p:?}");
    assert!(
        notes.contains("only when built with ROCm 7 or later (ROCM_VERSION >= 70000)"),
        "{notes}"
    );
    let (p, notes) = peaks(rocm, &["pytorch-cuda:expandable_segments:True"], &[]);
    assert_eq!(p[0].1, 40 * MIB, "{p:?}");
    assert!(!notes.contains("ROCm"), "{notes}");
    let (_d, cuda) = temp_file("cuda.json", &kineto_30_then_40(1));
    let (p, notes) = peaks(cuda.to_str().unwrap(), &specs[1..2], &[]);
    assert_eq!(p[0].1, 40 * MIB, "{p:?}");
    assert!(!notes.contains("ROCm"), "{notes}");
}

/// The platform goes where the trace goes: `.fst` keeps it (the replay is the same), a Kineto
/// file writes Device Type 6 again, and a format without a place for it says it is lost. The
/// exported run of an ignored setting records it as PyTorch on ROCm does: asked in the string,
/// off in effect, so `validate` of the file replays it without expandable segments.
#[test]
fn a_rocm_trace_keeps_its_platform_where_its_format_can_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("rocm.json");
    std::fs::write(&src, kineto_30_then_40(6)).unwrap();
    let src = src.to_str().unwrap();
    for name in ["rocm.fst", "again.json"] {
        let out = dir.path().join(name);
        let o = run(&["convert", src, out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let (p, _) = peaks(out.to_str().unwrap(), &["pytorch-expandable"], &[]);
        assert_eq!(p[0].1, 70 * MIB, "{name}: {p:?}");
        assert!(
            stdout(&run(&["info", out.to_str().unwrap()])).contains("platform: ROCm"),
            "{name}"
        );
    }
    let out = dir.path().join("rocm.pickle");
    let o = run(&["convert", src, out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("the recording shows it was made on ROCm"), "{}", stderr(&o));

    let exported = dir.path().join("exported.pickle");
    let o = run(&[
        "replay",
        src,
        "-p",
        "pytorch-expandable",
        "--export-snapshot",
        exported.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The file is a snapshot: it records no platform, and says so.
    assert!(stderr(&o).contains("the recording shows it was made on ROCm"), "{}", stderr(&o));
    let j: Value =
        serde_json::from_slice(&run(&["info", exported.to_str().unwrap(), "--json"]).stdout)
            .unwrap();
    let s = &j["allocator_settings"];
    assert_eq!(s["expandable_segments"], false, "{j}");
    assert!(s["conf"].as_str().unwrap().starts_with("expandable_segments:True"), "{j}");
    let o = run(&["validate", exported.to_str().unwrap(), "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{v}");
    assert_eq!(v["peak_reserved_simulated_bytes"], 70 * MIB, "{v}");
}
