//! Integration tests: the cuda backend (real GPU memory through the CUDA driver).
//!
//! Without a driver (CI, most dev machines) only the no-driver path runs; the GPU tests print
//! "skipped: no CUDA driver" and return.

use crate::util::*;
use fragsim::backend::cuda::{driver_present, CudaDevice};
use fragsim::backend::Backend;

/// A small trace whose `bound` peak is 8 MiB + 3 MiB (the two largest live together).
const TRACE: &str = "alloc 0x1000 8388608 s0\nalloc 0x2000 1048576 s0\nfree 0x2000 1048576 s0\n\
alloc 0x3000 3145728 s0\nfree 0x1000 8388608 s0\nalloc 0x4000 512 s0\nfree 0x3000 3145728 s0\n";

fn gpu() -> bool {
    if driver_present() {
        true
    } else {
        eprintln!("skipped: no CUDA driver");
        false
    }
}

#[test]
fn without_a_driver_the_cuda_backend_exits_3_with_a_clear_message() {
    if driver_present() {
        eprintln!("skipped: a CUDA driver is present");
        return;
    }
    let (_d, path) = temp_file("t.txt", TRACE.as_bytes());
    let o = run(&["replay", path.to_str().unwrap(), "--policy", "bound", "--backend", "cuda"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("fragsim: no CUDA driver found"), "{err}");
    assert!(err.contains("--backend sim"), "the message says what to do instead: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let e = CudaDevice::open(0, None).unwrap_err();
    assert_eq!(e.kind(), fragsim::ErrorKind::Backend);
}

#[test]
fn segments_and_pages_cycle_through_the_driver() {
    if !gpu() {
        return;
    }
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
fn the_capacity_cap_makes_a_big_gpu_run_out_like_a_small_one() {
    if !gpu() {
        return;
    }
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
fn a_replay_on_the_gpu_peaks_where_the_simulation_does() {
    if !gpu() {
        return;
    }
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

/// A stand-in libcuda for machines without a GPU: the driver calls the backend makes, keeping
/// the books a real driver keeps and enforcing the rules the CUDA docs state (sizes in multiples
/// of the granularity, `cuMemUnmap` only of a whole earlier `cuMemMap` range, no address freed
/// while mapped, out of memory past `FAKECUDA_CAP_MB`). At exit it reports what is still held.
const FAKE_LIBCUDA: &str = r#"
#include <stdio.h>
#include <stdlib.h>
typedef unsigned long long u64;
enum { N = 100000 };
static const u64 GRAN = 2ull << 20;
static u64 cap = 64ull << 20, used;
static u64 seg_a[N], seg_s[N], res_a[N], res_s[N], map_a[N], map_s[N], map_h[N], h_size[N];
static int nseg, nres, nmap, nh = 1, h_live[N], h_released[N], ctx_ref;
static u64 next_seg = 0x100000000000ull, next_va = 0x200000000000ull;
int cuInit(unsigned f) {
  const char *c = getenv("FAKECUDA_CAP_MB");
  if (c) cap = strtoull(c, 0, 10) << 20;
  return getenv("FAKECUDA_NODEV") ? 100 : 0;
}
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int o) { if (o != 0) return 101; *d = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)0x1234; ctx_ref++; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { if (ctx_ref <= 0) return 201; ctx_ref--; return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuMemAlloc_v2(u64 *p, size_t s) {
  if (used + s > cap) return 2;
  *p = next_seg; next_seg += (s + GRAN - 1) / GRAN * GRAN;
  seg_a[nseg] = *p; seg_s[nseg++] = s; used += s; return 0;
}
int cuMemFree_v2(u64 p) {
  for (int i = 0; i < nseg; i++) if (seg_a[i] == p) {
    used -= seg_s[i]; seg_a[i] = seg_a[--nseg]; seg_s[i] = seg_s[nseg]; return 0;
  }
  return 1;
}
int cuMemGetAllocationGranularity(size_t *g, const void *prop, int opt) { *g = GRAN; return 0; }
int cuMemAddressReserve(u64 *p, size_t s, size_t align, u64 addr, u64 flags) {
  if (s % GRAN || flags) return 1;
  *p = next_va; next_va += s + GRAN; res_a[nres] = *p; res_s[nres++] = s; return 0;
}
static int mapped_in(u64 a, u64 s) {
  for (int i = 0; i < nmap; i++) if (map_a[i] < a + s && map_a[i] + map_s[i] > a) return 1;
  return 0;
}
int cuMemAddressFree(u64 p, size_t s) {
  for (int i = 0; i < nres; i++) if (res_a[i] == p && res_s[i] == s) {
    if (mapped_in(p, s)) return 1;
    res_a[i] = res_a[--nres]; res_s[i] = res_s[nres]; return 0;
  }
  return 1;
}
static void maybe_free(u64 h) {
  if (!h_released[h] || !h_live[h]) return;
  for (int i = 0; i < nmap; i++) if (map_h[i] == h) return;
  h_live[h] = 0; used -= h_size[h];
}
int cuMemCreate(u64 *h, size_t s, const void *prop, u64 flags) {
  if (s % GRAN || flags) return 1;
  if (used + s > cap) return 2;
  *h = nh; h_size[nh] = s; h_live[nh] = 1; h_released[nh] = 0; nh++; used += s; return 0;
}
int cuMemMap(u64 p, size_t s, size_t off, u64 h, u64 flags) {
  if (off || flags || h >= (u64)nh || !h_live[h] || h_size[h] != s || p % GRAN) return 1;
  int inside = 0;
  for (int i = 0; i < nres; i++) if (p >= res_a[i] && p + s <= res_a[i] + res_s[i]) inside = 1;
  if (!inside || mapped_in(p, s)) return 1;
  map_a[nmap] = p; map_s[nmap] = s; map_h[nmap++] = h; return 0;
}
int cuMemSetAccess(u64 p, size_t s, const void *d, size_t n) {
  u64 covered = 0;
  for (int i = 0; i < nmap; i++) if (map_a[i] >= p && map_a[i] + map_s[i] <= p + s) covered += map_s[i];
  return covered == s && n == 1 ? 0 : 1;
}
int cuMemUnmap(u64 p, size_t s) {
  for (int i = 0; i < nmap; i++) if (map_a[i] == p) {
    if (map_s[i] != s) return 1;
    u64 h = map_h[i]; map_a[i] = map_a[--nmap]; map_s[i] = map_s[nmap]; map_h[i] = map_h[nmap];
    maybe_free(h); return 0;
  }
  return 1;
}
int cuMemRelease(u64 h) {
  if (h >= (u64)nh || !h_live[h] || h_released[h]) return 1;
  h_released[h] = 1; maybe_free(h); return 0;
}
int cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
int cuGetErrorString(int e, const char **s) { *s = "fake"; return 0; }
__attribute__((destructor)) static void report(void) {
  fprintf(stderr, "fakecuda at exit: used=%llu segments=%d reservations=%d mappings=%d contexts=%d\n",
          used, nseg, nres, nmap, ctx_ref);
}
"#;

/// Builds the fake libcuda into a temp dir with the system C compiler; `None` without one.
#[cfg(target_os = "linux")]
fn fake_libcuda() -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fake.c");
    std::fs::write(&src, FAKE_LIBCUDA).unwrap();
    let lib = dir.path().join("libcuda.so.1");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        eprintln!("skipped: no C compiler to build the fake libcuda");
        return None;
    }
    std::os::unix::fs::symlink(&lib, dir.path().join("libcuda.so")).unwrap();
    Some(dir)
}

#[cfg(target_os = "linux")]
#[test]
fn a_fake_driver_takes_every_driver_call_and_gets_everything_back() {
    let Some(fake) = fake_libcuda() else { return };
    let (_d, path) = temp_file("t.txt", TRACE.as_bytes());
    let replay = |policy: &str, env: &[(&str, &str)]| {
        let mut cmd = fragsim();
        cmd.args(["replay", path.to_str().unwrap(), "--policy", policy, "--backend", "cuda"]);
        cmd.arg("--json").env("LD_LIBRARY_PATH", fake.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    // bound takes the cudaMalloc path; pytorch-expandable the reserve/map/unmap path.
    for policy in ["bound", "pytorch-expandable"] {
        let sim = run(&["replay", path.to_str().unwrap(), "--policy", policy, "--json"]);
        if stderr(&sim).contains("not implemented") {
            eprintln!("skipped {policy}: not implemented in this build");
            continue;
        }
        assert!(sim.status.success(), "{policy}: {}", stderr(&sim));
        let o = replay(policy, &[]);
        assert!(o.status.success(), "{policy}: {}", stderr(&o));
        let json = |o: &std::process::Output| -> serde_json::Value {
            serde_json::from_str(&stdout(o)).unwrap()
        };
        let (cuda, sim) = (json(&o), json(&sim));
        let key = "peak_reserved_bytes";
        assert_eq!(cuda["results"][0][key], sim["results"][0][key], "{policy}");
        assert!(
            stderr(&o).contains(
                "fakecuda at exit: used=0 segments=0 reservations=0 mappings=0 contexts=0"
            ),
            "{policy}: Drop gives everything back: {}",
            stderr(&o)
        );
    }
    // The driver's own out-of-memory is an OOM of the replay, not an error: the 8 MiB alloc
    // does not fit in 4 MiB (and is the first event).
    let o = replay("bound", &[("FAKECUDA_CAP_MB", "4")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (v["results"][0]["oom"].as_bool(), v["results"][0]["first_oom_event"].as_u64()),
        (Some(true), Some(0))
    );
    // A driver without a GPU: exit code 3 naming the CUresult.
    let o = replay("bound", &[("FAKECUDA_NODEV", "1")]);
    assert_eq!(o.status.code(), Some(3));
    assert!(stderr(&o).contains("fragsim: cuInit failed: CUDA_ERROR_NO_DEVICE"), "{}", stderr(&o));
}
