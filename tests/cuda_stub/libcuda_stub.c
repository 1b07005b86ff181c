/*
 * A stand-in CUDA driver (libcuda.so.1) for machines without a GPU.
 *
 * fragsim's cuda backend loads libcuda through cudarc's dynamic loader (dlopen of "libcuda.so",
 * then the other names cudarc tries, found through LD_LIBRARY_PATH), and resolves each driver
 * symbol lazily on its first call. The test suite compiles this file with the system C compiler
 * into a directory as libcuda.so.1 (plus a libcuda.so link) and runs fragsim with LD_LIBRARY_PATH
 * pointing there, so fragsim loads it exactly as it would load the real driver.
 *
 * It keeps host-side books of what a real driver keeps and enforces the documented rules of the
 * calls fragsim makes (CUDA Driver API, "Memory Management" and "Virtual Memory Management"):
 *   - every call before cuInit fails with CUDA_ERROR_NOT_INITIALIZED; memory calls without a
 *     current, retained context fail with CUDA_ERROR_INVALID_CONTEXT;
 *   - cuMemAlloc_v2 of 0 bytes, cuMemFree_v2 of an address that is not a live allocation's base
 *     (double free included) are CUDA_ERROR_INVALID_VALUE;
 *   - VMM sizes and addresses must be multiples of the allocation granularity; cuMemMap must lie
 *     inside one reservation, not overlap a mapping, use offset 0 and a live handle at least as
 *     large; cuMemUnmap must name exactly one earlier mapping; cuMemAddressFree must name a whole
 *     reservation with nothing mapped in it; cuMemRelease of an unknown or released handle is
 *     CUDA_ERROR_INVALID_VALUE; physical memory is freed once released and unmapped;
 *   - cuMemSetAccess must cover mapped memory only; cuMemsetD8_v2 must stay inside one
 *     allocation or accessible mapping;
 *   - device memory (segments rounded up to the granularity, cuMemCreate handles) past the total
 *     is CUDA_ERROR_OUT_OF_MEMORY; cuMemGetInfo_v2 reports total and total - other - live.
 *
 * Environment:
 *   FRAGSIM_STUB_TOTAL_MB   device memory in MiB (default 81920)
 *   FRAGSIM_STUB_OTHER_MB   memory other processes use, in MiB (default 0)
 *   FRAGSIM_STUB_NODEV      when set, cuInit fails with CUDA_ERROR_NO_DEVICE
 *   FRAGSIM_STUB_HIGH_AFTER after this many cuMemAlloc_v2 calls, segments are placed above 2^56
 *                           (legal for a driver; fragsim's pytorch policy refuses such addresses
 *                           with an input error, which lets tests fail a replay midway)
 *   FRAGSIM_STUB_REPORT     file the at-exit report is written to (see report() below)
 *   FRAGSIM_STUB_FAIL       fault injection: CALL:N:WHAT[,CALL:N:WHAT...]: the Nth call (1-based)
 *                           of driver function CALL returns the error named WHAT (e.g.
 *                           CUDA_ERROR_UNKNOWN) and does nothing else; WHAT = SIGINT instead
 *                           raises SIGINT in the process and then performs the call normally.
 *
 * Single-threaded, as fragsim's cuda backend is. Addresses are never dereferenced.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long u64;
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

enum {
  SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
  INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_HANDLE = 400, ILLEGAL_ADDRESS = 700,
  LAUNCH_FAILED = 719, NOT_PERMITTED = 800, NOT_SUPPORTED = 801, UNKNOWN = 999
};

static const struct { int code; const char *name, *text; } ERRORS[] = {
  {SUCCESS, "CUDA_SUCCESS", "no error"},
  {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
  {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
  {LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
  {NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
  {NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
  {UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
#define NERRORS (sizeof ERRORS / sizeof ERRORS[0])

/* ---- a growable array of records, searched linearly or by binary search on `a` ---- */
typedef struct { u64 a, s, h; int flag; } rec;
typedef struct { rec *v; size_t n, cap; } vec;

static void push(vec *x, rec r) {
  if (x->n == x->cap) {
    x->cap = x->cap ? 2 * x->cap : 64;
    x->v = realloc(x->v, x->cap * sizeof(rec));
    if (!x->v) abort();
  }
  x->v[x->n++] = r;
}
/* Index of the first record with a >= key (records kept sorted by a). */
static size_t lower(const vec *x, u64 key) {
  size_t lo = 0, hi = x->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (x->v[mid].a < key) lo = mid + 1; else hi = mid;
  }
  return lo;
}
static void insert_sorted(vec *x, rec r) {
  size_t i = lower(x, r.a);
  push(x, r);
  memmove(&x->v[i + 1], &x->v[i], (x->n - 1 - i) * sizeof(rec));
  x->v[i] = r;
}
static void remove_at(vec *x, size_t i) {
  memmove(&x->v[i], &x->v[i + 1], (x->n - 1 - i) * sizeof(rec));
  x->n--;
}
/* The record whose range [a, a+s) contains p, or -1. */
static long containing(const vec *x, u64 p) {
  size_t i = lower(x, p + 1);
  if (i == 0) return -1;
  i--;
  return p < x->v[i].a + x->v[i].s ? (long)i : -1;
}
static int overlaps(const vec *x, u64 p, u64 s) {
  size_t i = lower(x, p);
  if (i < x->n && x->v[i].a < p + s) return 1;
  return i > 0 && x->v[i - 1].a + x->v[i - 1].s > p;
}

/* ---- driver state ---- */
static u64 granularity = 2ull << 20, total = 81920ull << 20, other, used;
static int inited, ctx_refs, current;
static u64 next_seg = 0x7f0000000000ull, next_va = 0x7e0000000000ull, next_handle = 1;
static vec segs;     /* cuMemAlloc: a = base, s = size asked, h = size charged */
static vec reserved; /* cuMemAddressReserve: a, s */
static vec maps;     /* cuMemMap: a, s, h = handle, flag = access granted */
static vec handles;  /* cuMemCreate: a = handle, s = size, flag = released */
static u64 calls;

/* ---- fault injection ---- */
typedef struct { char call[64]; u64 nth, seen; int what; } fault; /* what < 0: SIGINT */
static fault faults[16];
static int nfaults;
static struct { char name[64]; u64 n; } counts[64];
static int ncounts;

static int error_code(const char *name) {
  for (size_t i = 0; i < NERRORS; i++)
    if (!strcmp(ERRORS[i].name, name)) return ERRORS[i].code;
  return UNKNOWN;
}
static void parse_faults(void) {
  const char *spec = getenv("FRAGSIM_STUB_FAIL");
  static int parsed;
  if (parsed || !spec) return;
  parsed = 1;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", spec);
  for (char *save = 0, *item = strtok_r(buf, ",", &save); item && nfaults < 16;
       item = strtok_r(0, ",", &save)) {
    char call[64] = {0}, what[64] = {0};
    u64 nth = 0;
    if (sscanf(item, "%63[^:]:%llu:%63s", call, &nth, what) != 3) continue;
    fault *f = &faults[nfaults++];
    snprintf(f->call, sizeof f->call, "%s", call);
    f->nth = nth;
    f->what = strcmp(what, "SIGINT") ? error_code(what) : -1;
  }
}
/* Counts a call of `name`; returns the error to inject, or SUCCESS. */
static CUresult enter(const char *name) {
  calls++;
  parse_faults();
  int i = 0;
  while (i < ncounts && strcmp(counts[i].name, name)) i++;
  if (i == ncounts && ncounts < 64) snprintf(counts[ncounts++].name, 64, "%s", name);
  u64 n = i < 64 ? ++counts[i].n : 0;
  for (int k = 0; k < nfaults; k++) {
    if (strcmp(faults[k].call, name) || faults[k].nth != n) continue;
    if (faults[k].what < 0) {
      raise(SIGINT);
      return SUCCESS;
    }
    return faults[k].what;
  }
  return SUCCESS;
}
#define ENTER(name)                              \
  do {                                           \
    CUresult injected_ = enter(name);            \
    if (injected_ != SUCCESS) return injected_;  \
  } while (0)
#define NEED_INIT() do { if (!inited) return NOT_INITIALIZED; } while (0)
#define NEED_CONTEXT() do { NEED_INIT(); if (!current || ctx_refs <= 0) return INVALID_CONTEXT; } while (0)

static u64 env_mb(const char *name, u64 fallback) {
  const char *v = getenv(name);
  return v && *v ? strtoull(v, 0, 10) << 20 : fallback;
}
static u64 round_up(u64 x, u64 m) { return (x + m - 1) / m * m; }
static u64 free_bytes(void) { return total > other + used ? total - other - used : 0; }

/* ---- init, devices, contexts ---- */
CUresult cuInit(unsigned flags) {
  ENTER("cuInit");
  if (flags) return INVALID_VALUE;
  if (getenv("FRAGSIM_STUB_NODEV")) return NO_DEVICE;
  total = env_mb("FRAGSIM_STUB_TOTAL_MB", total);
  other = env_mb("FRAGSIM_STUB_OTHER_MB", 0);
  inited = 1;
  return SUCCESS;
}
CUresult cuDriverGetVersion(int *v) {
  ENTER("cuDriverGetVersion");
  if (!v) return INVALID_VALUE;
  *v = 12080;
  return SUCCESS;
}
CUresult cuDeviceGetCount(int *n) {
  ENTER("cuDeviceGetCount");
  NEED_INIT();
  if (!n) return INVALID_VALUE;
  *n = 1;
  return SUCCESS;
}
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  ENTER("cuDeviceGet");
  NEED_INIT();
  if (!d) return INVALID_VALUE;
  if (ordinal != 0) return INVALID_DEVICE;
  *d = 0;
  return SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  ENTER("cuDeviceGetName");
  NEED_INIT();
  if (d != 0) return INVALID_DEVICE;
  if (!name || len <= 0) return INVALID_VALUE;
  snprintf(name, (size_t)len, "fragsim stand-in driver");
  return SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
  ENTER("cuDeviceTotalMem_v2");
  NEED_INIT();
  if (d != 0) return INVALID_DEVICE;
  if (!bytes) return INVALID_VALUE;
  *bytes = total;
  return SUCCESS;
}
static int primary_context;
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  ENTER("cuDevicePrimaryCtxRetain");
  NEED_INIT();
  if (d != 0) return INVALID_DEVICE;
  if (!c) return INVALID_VALUE;
  *c = &primary_context;
  ctx_refs++;
  return SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  ENTER("cuDevicePrimaryCtxRelease_v2");
  NEED_INIT();
  if (d != 0) return INVALID_DEVICE;
  if (ctx_refs <= 0) return INVALID_CONTEXT;
  /* The context stays current on the thread, but becomes unusable once the last retain is gone. */
  ctx_refs--;
  return SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext c) {
  ENTER("cuCtxSetCurrent");
  NEED_INIT();
  if (c && c != (CUcontext)&primary_context) return INVALID_CONTEXT;
  current = c != 0;
  return SUCCESS;
}
CUresult cuCtxSynchronize(void) {
  ENTER("cuCtxSynchronize");
  NEED_CONTEXT();
  return SUCCESS;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
  if (!s) return INVALID_VALUE;
  for (size_t i = 0; i < NERRORS; i++)
    if (ERRORS[i].code == e) { *s = ERRORS[i].name; return SUCCESS; }
  *s = 0;
  return INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
  if (!s) return INVALID_VALUE;
  for (size_t i = 0; i < NERRORS; i++)
    if (ERRORS[i].code == e) { *s = ERRORS[i].text; return SUCCESS; }
  *s = 0;
  return INVALID_VALUE;
}

/* ---- plain device memory ---- */
CUresult cuMemGetInfo_v2(size_t *free_, size_t *total_) {
  ENTER("cuMemGetInfo_v2");
  NEED_CONTEXT();
  if (!free_ || !total_) return INVALID_VALUE;
  *free_ = free_bytes();
  *total_ = total;
  return SUCCESS;
}
CUresult cuMemAlloc_v2(u64 *p, size_t size) {
  ENTER("cuMemAlloc_v2");
  NEED_CONTEXT();
  if (!p || size == 0) return INVALID_VALUE;
  u64 charged = round_up(size, granularity);
  if (charged > free_bytes()) return OUT_OF_MEMORY;
  static u64 allocs;
  const char *high = getenv("FRAGSIM_STUB_HIGH_AFTER");
  if (high && ++allocs > strtoull(high, 0, 10) && next_seg < (1ull << 56)) next_seg = 1ull << 57;
  *p = next_seg;
  next_seg += charged;
  insert_sorted(&segs, (rec){*p, size, charged, 0});
  used += charged;
  return SUCCESS;
}
CUresult cuMemFree_v2(u64 p) {
  ENTER("cuMemFree_v2");
  NEED_CONTEXT();
  size_t i = lower(&segs, p);
  if (i == segs.n || segs.v[i].a != p) return INVALID_VALUE;
  used -= segs.v[i].h;
  remove_at(&segs, i);
  return SUCCESS;
}

/* ---- virtual memory management ---- */
typedef struct { int type, handle_types, loc_type, loc_id; } alloc_prop_head; /* CUmemAllocationProp */
typedef struct { int loc_type, loc_id; int flags; } access_desc;              /* CUmemAccessDesc */

static CUresult check_prop(const void *prop) {
  const alloc_prop_head *h = prop;
  if (!h) return INVALID_VALUE;
  if (h->type != 1 /* PINNED */ || h->loc_type != 1 /* DEVICE */) return INVALID_VALUE;
  if (h->loc_id != 0) return INVALID_DEVICE;
  return SUCCESS;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) {
  ENTER("cuMemGetAllocationGranularity");
  NEED_INIT();
  if (!g || (option != 0 && option != 1)) return INVALID_VALUE;
  CUresult r = check_prop(prop);
  if (r) return r;
  *g = granularity;
  return SUCCESS;
}
CUresult cuMemAddressReserve(u64 *p, size_t size, size_t align, u64 hint, u64 flags) {
  ENTER("cuMemAddressReserve");
  NEED_CONTEXT();
  (void)hint;
  if (!p || size == 0 || size % granularity || flags) return INVALID_VALUE;
  if (align & (align - 1)) return INVALID_VALUE;
  if (align < granularity) align = granularity;
  u64 a = round_up(next_va, align);
  if (a + size > 0x7effffffffffull) return OUT_OF_MEMORY; /* out of address space */
  next_va = a + size + granularity;                        /* a guard page between reservations */
  insert_sorted(&reserved, (rec){a, size, 0, 0});
  *p = a;
  return SUCCESS;
}
CUresult cuMemAddressFree(u64 p, size_t size) {
  ENTER("cuMemAddressFree");
  NEED_CONTEXT();
  size_t i = lower(&reserved, p);
  if (i == reserved.n || reserved.v[i].a != p || reserved.v[i].s != size) return INVALID_VALUE;
  if (overlaps(&maps, p, size)) return INVALID_VALUE;
  remove_at(&reserved, i);
  return SUCCESS;
}
static long find_handle(u64 h) {
  size_t i = lower(&handles, h);
  return i < handles.n && handles.v[i].a == h ? (long)i : -1;
}
/* Frees a handle's memory once it is released and no mapping uses it. */
static void maybe_free(u64 h) {
  long i = find_handle(h);
  if (i < 0 || !handles.v[i].flag) return;
  for (size_t k = 0; k < maps.n; k++)
    if (maps.v[k].h == h) return;
  used -= handles.v[i].s;
  remove_at(&handles, (size_t)i);
}
CUresult cuMemCreate(u64 *h, size_t size, const void *prop, u64 flags) {
  ENTER("cuMemCreate");
  NEED_CONTEXT();
  if (!h || size == 0 || size % granularity || flags) return INVALID_VALUE;
  CUresult r = check_prop(prop);
  if (r) return r;
  if (size > free_bytes()) return OUT_OF_MEMORY;
  *h = next_handle++ * 0x1000 + 0xc0de; /* opaque, never reused, never small integers */
  insert_sorted(&handles, (rec){*h, size, 0, 0});
  used += size;
  return SUCCESS;
}
CUresult cuMemRelease(u64 h) {
  ENTER("cuMemRelease");
  NEED_CONTEXT();
  long i = find_handle(h);
  if (i < 0 || handles.v[i].flag) return INVALID_VALUE;
  handles.v[i].flag = 1;
  maybe_free(h);
  return SUCCESS;
}
CUresult cuMemMap(u64 p, size_t size, size_t offset, u64 h, u64 flags) {
  ENTER("cuMemMap");
  NEED_CONTEXT();
  if (offset || flags || size == 0 || p % granularity || size % granularity) return INVALID_VALUE;
  long i = find_handle(h);
  if (i < 0 || handles.v[i].flag) return INVALID_HANDLE;
  if (size > handles.v[i].s) return INVALID_VALUE;
  long r = containing(&reserved, p);
  if (r < 0 || p + size > reserved.v[r].a + reserved.v[r].s) return INVALID_VALUE;
  if (overlaps(&maps, p, size)) return INVALID_VALUE;
  insert_sorted(&maps, (rec){p, size, h, 0});
  return SUCCESS;
}
CUresult cuMemSetAccess(u64 p, size_t size, const void *desc, size_t count) {
  ENTER("cuMemSetAccess");
  NEED_CONTEXT();
  const access_desc *d = desc;
  if (!d || count == 0 || size == 0) return INVALID_VALUE;
  for (size_t k = 0; k < count; k++) {
    if (d[k].loc_type != 1) return INVALID_VALUE;
    if (d[k].loc_id != 0) return INVALID_DEVICE;
  }
  /* Every byte of the range must be mapped. */
  u64 at = p;
  size_t i = lower(&maps, p);
  if (i > 0 && maps.v[i - 1].a + maps.v[i - 1].s > p) i--;
  size_t first = i;
  for (; i < maps.n && at < p + size; i++) {
    if (maps.v[i].a > at) return INVALID_VALUE;
    at = maps.v[i].a + maps.v[i].s;
  }
  if (at < p + size) return INVALID_VALUE;
  for (i = first; i < maps.n && maps.v[i].a < p + size; i++) maps.v[i].flag = d[0].flags != 0;
  return SUCCESS;
}
CUresult cuMemUnmap(u64 p, size_t size) {
  ENTER("cuMemUnmap");
  NEED_CONTEXT();
  size_t i = lower(&maps, p);
  if (i == maps.n || maps.v[i].a != p || maps.v[i].s != size) return INVALID_VALUE;
  u64 h = maps.v[i].h;
  remove_at(&maps, i);
  maybe_free(h);
  return SUCCESS;
}
CUresult cuMemsetD8_v2(u64 p, unsigned char value, size_t n) {
  ENTER("cuMemsetD8_v2");
  NEED_CONTEXT();
  (void)value;
  if (n == 0) return SUCCESS;
  long s = containing(&segs, p);
  if (s >= 0) return p + n <= segs.v[s].a + segs.v[s].h ? SUCCESS : ILLEGAL_ADDRESS;
  u64 at = p;
  size_t i = lower(&maps, p);
  if (i > 0 && maps.v[i - 1].a + maps.v[i - 1].s > p) i--;
  for (; i < maps.n && at < p + n; i++) {
    if (maps.v[i].a > at || !maps.v[i].flag) return ILLEGAL_ADDRESS;
    at = maps.v[i].a + maps.v[i].s;
  }
  return at >= p + n ? SUCCESS : ILLEGAL_ADDRESS;
}

/*
 * At exit (or unload) after cuInit: writes one line to $FRAGSIM_STUB_REPORT with what is still
 * held, e.g. "held segments=0 reservations=0 mappings=0 handles=0 contexts=0 bytes=0 calls=812".
 * A handle counts until it is both released and unmapped. Nothing is written when cuInit never
 * succeeded, so a probe that only loads the library leaves no report behind.
 */
__attribute__((destructor)) static void report(void) {
  const char *path = getenv("FRAGSIM_STUB_REPORT");
  if (!inited || !path) return;
  FILE *f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "held segments=%zu reservations=%zu mappings=%zu handles=%zu contexts=%d bytes=%llu calls=%llu\n",
          segs.n, reserved.n, maps.n, handles.n, ctx_refs, used, calls);
  fclose(f);
}
