//! Integration tests: the cuda backend (real GPU memory through the CUDA driver).
//!
//! The tests that need a real GPU are `#[ignore]`d: `scripts/gpu-check.sh` runs them with
//! `--include-ignored` where a GPU is, and they fail (not skip) without a driver. Everywhere
//! else, a stand-in `libcuda` built from `tests/cuda_stub/` with the system C compiler obeys the
//! driver's rules, and the backend's every path runs against it.

use crate::util::*;
use fragsim::backend::cuda::{driver_present, CudaDevice};
use fragsim::backend::Backend;

/// A small trace whose `bound` peak is 8 MiB + 3 MiB (the two largest live together).
const TRACE: &str = "alloc 0x1000 8388608 s0\nalloc 0x2000 1048576 s0\nfree 0x2000 1048576 s0\n\
alloc 0x3000 3145728 s0\nfree 0x1000 8388608 s0\nalloc 0x4000 512 s0\nfree 0x3000 3145728 s0\n";

/// Why the real-GPU tests are ignored by default.
const NEEDS_GPU: &str = "needs a CUDA GPU and driver (scripts/gpu-check.sh runs it)";

/// Asserts that a real driver is there: the ignored GPU tests fail without one.
fn require_gpu() {
    assert!(driver_present(), "no CUDA driver: this test {NEEDS_GPU}");
}

#[test]
fn without_a_driver_the_cuda_backend_exits_3_with_a_clear_message() {
    let (_d, path) = temp_file("t.txt", TRACE.as_bytes());
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--backend", "cuda"]);
    if driver_present() {
        // On a GPU machine the same command replays on the device.
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stdout(&o).contains("bound"), "{}", stdout(&o));
        return;
    }
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("fragsim: no CUDA driver found"), "{err}");
    assert!(err.contains("--backend sim"), "the message says what to do instead: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let e = CudaDevice::open(0, None).unwrap_err();
    assert_eq!(e.kind(), fragsim::ErrorKind::Backend);
}

#[test]
#[ignore = "needs a CUDA GPU and driver (scripts/gpu-check.sh runs it)"]
fn segments_and_pages_cycle_through_the_driver() {
    require_gpu();
    let mut d = CudaDevice::open(0, None).expect("device 0 opens");
    let g = d.granularity();
    assert!(g > 0 && g.is_power_of_two(), "granularity {g}");

    let seg = d.segment_alloc(1 << 20).unwrap().expect("1 MiB fits on any GPU");
    assert_eq!(d.reserved(), 1 << 20);
    assert!(d.segment_free(seg, 4096).is_err(), "wrong size is refused");
    d.segment_free(seg, 1 << 20).unwrap();
    assert!(d.segment_free(seg, 1 << 20).is_err(), "double free is an error, not a crash");
    assert_eq!(d.reserved(), 0);

    let va = d.reserve(3 * g).unwrap().expect("address space");
    assert_eq!(va % g, 0);
    assert!(d.map(va + 1, g).is_err(), "unaligned map is refused");
    assert!(d.map(va, 2 * g).unwrap());
    assert_eq!(d.reserved(), 2 * g);
    assert!(d.map(va + g, g).is_err(), "already mapped");
    d.unmap(va + g, g).unwrap(); // part of the earlier mapping
    assert_eq!(d.reserved(), g);
    assert!(d.map(va + g, 2 * g).unwrap());
    assert_eq!(d.reserved(), 3 * g);
    assert!(d.release(va, 3 * g).is_err(), "pages still mapped");
    assert!(d.unmap(va, 4 * g).is_err(), "more than is mapped");
    d.unmap(va, 3 * g).unwrap(); // spans both earlier maps
    assert_eq!(d.reserved(), 0);
    d.release(va, 3 * g).unwrap();

    // Held memory is freed by Drop.
    let va = d.reserve(g).unwrap().unwrap();
    assert!(d.map(va, g).unwrap());
    assert!(d.segment_alloc(g).unwrap().is_some());
    drop(d);
}

#[test]
#[ignore = "needs a CUDA GPU and driver (scripts/gpu-check.sh runs it)"]
fn the_capacity_cap_makes_a_big_gpu_run_out_like_a_small_one() {
    require_gpu();
    let mut d = CudaDevice::open(0, Some(3 << 20)).expect("device 0 opens");
    let g = d.granularity();
    assert_eq!(d.segment_alloc(4 << 20).unwrap(), None, "over the 3 MiB cap");
    let a = d.segment_alloc(2 << 20).unwrap().expect("under the cap");
    assert_eq!(d.segment_alloc(2 << 20).unwrap(), None, "2 + 2 MiB > 3 MiB");
    d.segment_free(a, 2 << 20).unwrap();
    let va = d.reserve(4 * g).unwrap().unwrap();
    let pages_in_cap = (3 << 20) / g;
    assert!(!d.map(va, (pages_in_cap + 1) * g).unwrap(), "over the cap");
    assert_eq!(d.reserved(), 0, "a failed map leaves nothing mapped");
    d.release(va, 4 * g).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and driver (scripts/gpu-check.sh runs it)"]
fn a_replay_on_the_gpu_peaks_where_the_simulation_does() {
    require_gpu();
    let (_d, path) = temp_file("t.txt", TRACE.as_bytes());
    let peak = |backend: &str| {
        let o = run(&[
            "replay",
            path.to_str().unwrap(),
            "--policy",
            "bound",
            "--backend",
            backend,
            "--json",
        ]);
        assert!(o.status.success(), "{backend}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["results"][0]["peak_reserved_bytes"].as_u64().unwrap()
    };
    assert_eq!(peak("sim"), (8 << 20) + (3 << 20));
    assert_eq!(peak("cuda"), peak("sim"));
}

/// The stand-in libcuda (`tests/cuda_stub/libcuda_stub.c`), built once per test run with the
/// system C compiler into a directory as `libcuda.so.1` + `libcuda.so`.
#[cfg(target_os = "linux")]
fn stub_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_stub/libcuda_stub.c");
        let lib = dir.path().join("libcuda.so.1");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&lib)
            .arg(&src)
            .status();
        // Building Rust on Linux needs a C compiler to link, so one is always there.
        match status {
            Err(e) => panic!("the stand-in CUDA driver needs a C compiler (cc: {e})"),
            Ok(s) => assert!(s.success(), "cc could not build {}: {s}", src.display()),
        }
        std::os::unix::fs::symlink(&lib, dir.path().join("libcuda.so")).unwrap();
        dir
    });
    dir.path()
}

/// One fragsim run against the stand-in driver, and the driver's at-exit report of what was
/// still held ("" when it wrote none).
#[cfg(target_os = "linux")]
struct StubRun {
    out: std::process::Output,
    held: String,
}

#[cfg(target_os = "linux")]
impl StubRun {
    fn new(stub: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> StubRun {
        let report_dir = tempfile::tempdir().unwrap();
        let report = report_dir.path().join("held.txt");
        let mut cmd = fragsim();
        cmd.args(args).env("LD_LIBRARY_PATH", stub).env("FRAGSIM_STUB_REPORT", &report);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let held = std::fs::read_to_string(&report).unwrap_or_default();
        StubRun { out, held }
    }

    /// Asserts the driver saw cuInit and that nothing was held at exit.
    fn assert_released(&self, what: &str) {
        assert!(
            self.held.starts_with(
                "held segments=0 reservations=0 mappings=0 handles=0 contexts=0 bytes=0 calls="
            ),
            "{what}: device memory left held at exit: {:?}; stderr: {}",
            self.held,
            stderr(&self.out)
        );
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&stdout(&self.out))
            .unwrap_or_else(|e| panic!("{e}: {} / {}", stdout(&self.out), stderr(&self.out)))
    }
}

/// The online policies, plus `bound`, as replayed on a GPU.
const ONLINE: [&str; 8] =
    ["pytorch", "pytorch-expandable", "buddy", "bfc", "rmm-pool", "nocache", "stitch", "bound"];

/// Two small real snapshots (1.9 and 12 GiB peaks).
const REAL: [&str; 2] = ["cs336-lm-step-b.pickle", "cs336-lm-step-c.pickle"];

fn policy_args<'a>(trace: &'a str, policies: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["replay", trace];
    for p in policies {
        args.extend(["--policy", p]);
    }
    args.push("--json");
    args
}

#[cfg(target_os = "linux")]
#[test]
fn every_online_policy_peaks_on_the_stand_in_driver_where_the_simulation_does() {
    let stub = stub_dir();
    for name in REAL {
        let path = real_trace(name);
        let trace = path.to_str().unwrap();
        let sim = run(&policy_args(trace, &ONLINE));
        assert!(sim.status.success(), "{name}: {}", stderr(&sim));
        let sim: serde_json::Value = serde_json::from_str(&stdout(&sim)).unwrap();
        let mut args = policy_args(trace, &ONLINE);
        args.extend(["--backend", "cuda"]);
        let cuda = StubRun::new(stub, &args, &[]);
        assert!(cuda.out.status.success(), "{name}: {}", stderr(&cuda.out));
        cuda.assert_released(name);
        let cuda = cuda.json();
        let by_policy = |v: &serde_json::Value, p: &str| -> serde_json::Value {
            v["results"].as_array().unwrap().iter().find(|r| r["policy"] == p).unwrap().clone()
        };
        for p in ONLINE {
            let (c, s) = (by_policy(&cuda, p), by_policy(&sim, p));
            for key in ["peak_reserved_bytes", "device_malloc_count", "map_count", "oom"] {
                assert_eq!(c[key], s[key], "{name} {p}: {key}");
            }
            assert!(s.get("cuda").is_none(), "the simulation has no cuda measures");
            let m = &c["cuda"];
            let peak = c["peak_reserved_bytes"].as_u64().unwrap();
            let calls = &m["device_calls"];
            let count = |k: &str| calls[k]["count"].as_u64().unwrap();
            assert_eq!(count("malloc"), c["device_malloc_count"].as_u64().unwrap(), "{p}");
            assert_eq!(count("map"), c["map_count"].as_u64().unwrap(), "{p}");
            assert_eq!(count("touch"), 0, "{p}: no --touch");
            for k in ["malloc", "free", "reserve", "release", "map", "unmap"] {
                let (p50, p99, max) = (
                    calls[k]["p50_us"].as_f64().unwrap(),
                    calls[k]["p99_us"].as_f64().unwrap(),
                    calls[k]["max_us"].as_f64().unwrap(),
                );
                assert!(p50 <= p99 && p99 <= max, "{p} {k}: {p50} {p99} {max}");
                assert_eq!(count(k) == 0, max == 0.0, "{p} {k}");
            }
            // The backend's own peak is at least the engine's (it also sees moments inside an
            // event), and the stand-in charges whole 2 MiB pages as the driver does.
            let at_peak = m["reserved_at_device_peak_bytes"].as_u64().unwrap();
            assert!(at_peak >= peak, "{p}: {at_peak} < {peak}");
            assert!(m["device_used_at_peak_bytes"].as_u64().unwrap() >= at_peak, "{p}");
            assert_eq!(m["device_used_at_start_bytes"], 0, "{p}");
            assert_eq!(m["device_total_bytes"], 81920u64 << 20, "{p}");
            assert!(m["wall_seconds"].as_f64().unwrap() > 0.0, "{p}");
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn out_of_memory_on_the_stand_in_gives_everything_back() {
    let stub = stub_dir();
    let path = real_trace("cs336-lm-step-c.pickle");
    let trace = path.to_str().unwrap();
    // Under --capacity: the backend's cap.
    let mut args = policy_args(trace, &["pytorch", "pytorch-expandable", "nocache"]);
    args.extend(["--backend", "cuda", "--capacity", "12.1GiB"]);
    let r = StubRun::new(stub, &args, &[]);
    assert!(r.out.status.success(), "{}", stderr(&r.out));
    r.assert_released("--capacity");
    let mut sim_args = policy_args(trace, &["pytorch", "pytorch-expandable", "nocache"]);
    sim_args.extend(["--capacity", "12.1GiB"]);
    let sim: serde_json::Value = serde_json::from_str(&stdout(&run(&sim_args))).unwrap();
    let v = r.json();
    let policies = |v: &serde_json::Value| {
        let all = v["results"].as_array().unwrap().clone();
        all.into_iter().filter(|r| r["policy"] != "recorded").collect::<Vec<_>>()
    };
    for (c, s) in policies(&v).iter().zip(&policies(&sim)) {
        assert_eq!(c["oom"], true, "{}", c["policy"]);
        assert_eq!(c["first_oom_event"], s["first_oom_event"], "{}", c["policy"]);
        assert_eq!(c["peak_reserved_bytes"], s["peak_reserved_bytes"], "{}", c["policy"]);
    }
    // The driver's own CUDA_ERROR_OUT_OF_MEMORY: 13,350 MiB holds the 12.97 GiB bound peak
    // (so the replay starts), not pytorch's 13.12 GiB.
    let args = ["replay", trace, "--policy", "pytorch", "--backend", "cuda", "--json"];
    let r = StubRun::new(stub, &args, &[("FRAGSIM_STUB_TOTAL_MB", "13350")]);
    assert!(r.out.status.success(), "{}", stderr(&r.out));
    r.assert_released("driver OOM");
    assert_eq!(r.json()["results"][0]["oom"], true);
}

#[cfg(target_os = "linux")]
#[test]
fn a_trace_that_does_not_fit_in_free_memory_is_refused_before_the_first_allocation() {
    let stub = stub_dir();
    let path = real_trace("cs336-lm-step-c.pickle");
    let trace = path.to_str().unwrap();
    let env = [("FRAGSIM_STUB_TOTAL_MB", "16384"), ("FRAGSIM_STUB_OTHER_MB", "8192")];
    let args = ["replay", trace, "--policy", "nocache", "--backend", "cuda"];
    let r = StubRun::new(stub, &args, &env);
    assert_eq!(r.out.status.code(), Some(3), "{}", stderr(&r.out));
    let err = stderr(&r.out);
    assert!(err.contains("bound policy's peak") && err.contains("--capacity"), "{err}");
    assert!(err.contains("8589934592 of 17179869184 bytes"), "free and total: {err}");
    r.assert_released("refused");
    assert!(!r.held.contains("cuMemAlloc"), "{}", r.held);
    // Under a cap that fits in free memory it runs, and runs out like a small GPU.
    let args = ["replay", trace, "--policy", "nocache", "--backend", "cuda", "--capacity", "6GiB"];
    let r = StubRun::new(stub, &[&args[..], &["--json"]].concat(), &env);
    assert!(r.out.status.success(), "{}", stderr(&r.out));
    r.assert_released("capped");
    assert_eq!(r.json()["results"][0]["oom"], true);
}

/// A small text trace whose recorded `segment_free` makes every policy empty its cache, so the
/// expandable policy unmaps and releases too.
const FLUSHING: &str = "alloc 0x1000 8388608 s0\nalloc 0x2000 1048576 s0\nfree 0x2000 1048576 s0\n\
alloc 0x3000 3145728 s0\nfree 0x1000 8388608 s0\nalloc 0x4000 512 s0\nfree 0x3000 3145728 s0\n\
segment_free 0x1000 8388608 s0\nalloc 0x5000 4194304 s1\nfree 0x5000 4194304 s1\nfree 0x4000 512 s0\n";

#[cfg(target_os = "linux")]
#[test]
fn an_injected_driver_failure_exits_3_naming_the_call_and_releases_everything() {
    let stub = stub_dir();
    let (_d, path) = temp_file("t.txt", FLUSHING.as_bytes());
    let trace = path.to_str().unwrap();
    let cases = [
        ("nocache", "cuMemAlloc_v2", 2, "CUDA_ERROR_UNKNOWN"),
        ("nocache", "cuMemFree_v2", 1, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        ("pytorch", "cuMemGetInfo_v2", 3, "CUDA_ERROR_LAUNCH_FAILED"),
        ("pytorch-expandable", "cuMemAddressReserve", 1, "CUDA_ERROR_NOT_PERMITTED"),
        ("pytorch-expandable", "cuMemCreate", 3, "CUDA_ERROR_UNKNOWN"),
        ("pytorch-expandable", "cuMemMap", 2, "CUDA_ERROR_INVALID_VALUE"),
        ("pytorch-expandable", "cuMemSetAccess", 3, "CUDA_ERROR_NOT_SUPPORTED"),
        ("pytorch-expandable", "cuMemUnmap", 1, "CUDA_ERROR_UNKNOWN"),
        ("pytorch-expandable", "cuMemRelease", 1, "CUDA_ERROR_INVALID_HANDLE"),
    ];
    for (policy, call, nth, error) in cases {
        let spec = format!("{call}:{nth}:{error}");
        let args = ["replay", trace, "--policy", policy, "--backend", "cuda"];
        let r = StubRun::new(stub, &args, &[("FRAGSIM_STUB_FAIL", &spec)]);
        let err = stderr(&r.out);
        assert_eq!(r.out.status.code(), Some(3), "{spec}: {err}");
        assert!(!err.contains("panicked"), "{spec}: {err}");
        assert_eq!(err.lines().count(), 1, "{spec}: one line: {err}");
        assert!(err.starts_with(&format!("fragsim: {call}")), "{spec}: names the call: {err}");
        assert!(err.trim_end().ends_with(&format!("failed: {error}")), "{spec}: {err}");
        r.assert_released(&spec);
    }
}

#[cfg(target_os = "linux")]
#[test]
fn an_input_error_midway_releases_everything() {
    let stub = stub_dir();
    let path = real_trace("cs336-lm-step-c.pickle");
    // The fourth segment lies above 2^56, which the pytorch policy refuses as an input error.
    let args = ["replay", path.to_str().unwrap(), "--policy", "pytorch", "--backend", "cuda"];
    let r = StubRun::new(stub, &args, &[("FRAGSIM_STUB_HIGH_AFTER", "3")]);
    let err = stderr(&r.out);
    assert_eq!(r.out.status.code(), Some(2), "{err}");
    assert!(err.contains("beyond 2^56") && !err.contains("panicked"), "{err}");
    r.assert_released("input error");
}

#[cfg(target_os = "linux")]
#[test]
fn sigint_stops_the_replay_releases_everything_and_exits_130() {
    let stub = stub_dir();
    let path = real_trace("cs336-lm-step-c.pickle");
    let trace = path.to_str().unwrap();
    for (policy, at) in
        [("nocache", "cuMemAlloc_v2:40:SIGINT"), ("pytorch-expandable", "cuMemMap:30:SIGINT")]
    {
        let args = ["replay", trace, "--policy", policy, "--policy", "bound", "--backend", "cuda"];
        let r = StubRun::new(stub, &args, &[("FRAGSIM_STUB_FAIL", at)]);
        let err = stderr(&r.out);
        assert_eq!(r.out.status.code(), Some(130), "{policy}: {err}");
        assert!(err.contains("interrupted") && !err.contains("panicked"), "{policy}: {err}");
        assert!(stdout(&r.out).is_empty(), "{policy}: no results after an interrupt");
        r.assert_released(policy);
    }
}

#[cfg(target_os = "linux")]
#[test]
fn touch_writes_every_segment_and_mapped_range_once() {
    let stub = stub_dir();
    let (_d, path) = temp_file("t.txt", FLUSHING.as_bytes());
    for policy in ["pytorch", "pytorch-expandable"] {
        let args =
            ["replay", path.to_str().unwrap(), "--policy", policy, "--backend", "cuda", "--json"];
        let r = StubRun::new(stub, &[&args[..], &["--touch"]].concat(), &[]);
        assert!(r.out.status.success(), "{policy}: {}", stderr(&r.out));
        r.assert_released(policy);
        let v = r.json();
        let res = &v["results"][0];
        let grown =
            res["device_malloc_count"].as_u64().unwrap() + res["map_count"].as_u64().unwrap();
        assert!(grown > 0);
        assert_eq!(res["cuda"]["touched"], true);
        assert_eq!(res["cuda"]["device_calls"]["touch"]["count"].as_u64(), Some(grown), "{policy}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_driver_without_a_gpu_exits_3_naming_the_result() {
    let stub = stub_dir();
    let (_d, path) = temp_file("t.txt", TRACE.as_bytes());
    let args = ["replay", path.to_str().unwrap(), "--policy", "bound", "--backend", "cuda"];
    let r = StubRun::new(stub, &args, &[("FRAGSIM_STUB_NODEV", "1")]);
    assert_eq!(r.out.status.code(), Some(3));
    let err = stderr(&r.out);
    assert_eq!(err, "fragsim: cuInit failed: CUDA_ERROR_NO_DEVICE\n");
}
