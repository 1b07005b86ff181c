#!/usr/bin/env bash
# The real-GPU path in one go (docs/guide.md, "Real GPU memory"): builds release, runs the GPU tests,
# replays two bundled real traces on the GPU next to the simulation, and, where PyTorch with CUDA
# is installed, records short training-like snapshots under several PYTORCH_CUDA_ALLOC_CONF
# settings and validates fragsim's PyTorch model on each. One summary line per check
# (PASS/FAIL/SKIP); exits 1 when a check fails. Meant to finish in under 5 minutes on one GPU.
#
# Usage: scripts/gpu-check.sh [CUDA_ORDINAL]   (default 0)
set -uo pipefail
cd "$(dirname "$0")/.."
ordinal="${1:-0}"
failed=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }
skip() { echo "SKIP $*"; }

if cargo build --release --quiet 2>"$work/build.log"; then
  pass "build: cargo build --release"
else
  fail "build: cargo build --release (see below)"; cat "$work/build.log"; exit 1
fi
bin=target/release/fragsim

# The GPU tests (ignored by default: they need a real driver) and the stand-in driver tests.
if cargo test --release --quiet --test integration cuda:: -- --include-ignored >"$work/test.log" 2>&1; then
  pass "tests: cuda:: (real GPU and stand-in driver)"
else
  fail "tests: cuda:: (the real-GPU tests fail without a driver)"; tail -30 "$work/test.log"
fi

printf 'alloc 0x1000 1048576 s0\nfree 0x1000 1048576 s0\n' >"$work/probe.txt"
if ! probe=$("$bin" replay "$work/probe.txt" --backend cuda --cuda-device "$ordinal" 2>&1 >/dev/null); then
  skip "gpu: $probe"
  exit "$failed"
fi

# Replays on the GPU: peaks must equal the simulation's; the line shows what the GPU measured.
for trace in traces/real/cs336-lm-step-b.pickle traces/real/cs336-lm-step-c.pickle; do
  for policy in pytorch pytorch-expandable nocache; do
    name="$(basename "$trace" .pickle) $policy"
    if ! "$bin" replay "$trace" --policy "$policy" --json >"$work/sim.json" 2>"$work/err"; then
      fail "replay $name: sim: $(head -1 "$work/err")"; continue
    fi
    if ! "$bin" replay "$trace" --policy "$policy" --backend cuda --cuda-device "$ordinal" --touch \
      --json >"$work/cuda.json" 2>"$work/err"; then
      fail "replay $name: cuda: $(head -1 "$work/err")"; continue
    fi
    if line=$(python3 - "$work/sim.json" "$work/cuda.json" <<'PY'
import json, sys
sim = json.load(open(sys.argv[1]))["results"][0]
cuda = json.load(open(sys.argv[2]))["results"][0]
m, gib = cuda["cuda"], 1 << 30
calls = m["device_calls"]
busy = "malloc" if calls["malloc"]["count"] else "map"
c = calls[busy]
print(f"sim {sim['peak_reserved_bytes'] / gib:.3f} GiB, gpu {cuda['peak_reserved_bytes'] / gib:.3f} GiB, "
      f"cuMemGetInfo used at peak {(m['device_used_at_peak_bytes'] - m['device_used_at_start_bytes']) / gib:.3f} GiB "
      f"over the start; {busy} x{c['count']} p50 {c['p50_us']:.0f} us p99 {c['p99_us']:.0f} us "
      f"max {c['max_us']:.0f} us; wall {m['wall_seconds']:.2f} s")
sys.exit(0 if sim["peak_reserved_bytes"] == cuda["peak_reserved_bytes"] else 1)
PY
    ); then
      pass "replay $name: $line"
    else
      fail "replay $name: peaks differ: $line"
    fi
  done
done

# Snapshots recorded by real PyTorch under settings no public snapshot exercises.
if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  skip "pytorch snapshots: no python3 with a CUDA build of torch"
  exit "$failed"
fi
cat >"$work/record.py" <<'PY'
# Records a short training-like run (a small MLP, varying batch sizes, some frees out of order)
# as a memory snapshot. PYTORCH_CUDA_ALLOC_CONF comes from the environment.
import os, sys, torch
out, fraction = sys.argv[1], float(sys.argv[2])
torch.cuda.set_device(int(os.environ.get("ORDINAL", "0")))
if fraction < 1:
    torch.cuda.set_per_process_memory_fraction(fraction)
torch.cuda.memory._record_memory_history(max_entries=200000)
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()
opt = torch.optim.AdamW(model.parameters())
keep = []
for step in range(30):
    batch = 64 + 96 * (step % 5)
    x = torch.randn(batch, 2048, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    keep.append(torch.empty(step * 37 * 1024 + 1, device="cuda"))
    if len(keep) > 6:
        keep.pop(step % 3)
    if step == 20:
        torch.cuda.empty_cache()
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(out)
PY
cat >"$work/summary.py" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
first = v["mismatches"][0] if v["mismatches"] else None
print(f"{v['allocs_addr_matched']}/{v['allocs_total']} allocs matched, "
      f"{v['segment_events_matched']}/{v['segment_events_recorded']} segment events matched, "
      f"{len(v['mismatches'])} mismatches" + (f", first: {first}" if first else ""))
PY
while IFS='|' read -r label conf fraction; do
  snap="$work/$label.pickle"
  if ! ORDINAL="$ordinal" PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 120 python3 "$work/record.py" "$snap" "$fraction" \
    >"$work/rec.log" 2>&1; then
    fail "validate $label ($conf): recording failed: $(tail -1 "$work/rec.log")"; continue
  fi
  if "$bin" validate "$snap" --json >"$work/val.json" 2>"$work/err"; then
    pass "validate $label ($conf): $(python3 "$work/summary.py" "$work/val.json")"
  else
    fail "validate $label ($conf): $(head -1 "$work/err") $(python3 "$work/summary.py" "$work/val.json" 2>/dev/null)"
  fi
done <<'CONFS'
default||1
max-split|max_split_size_mb:64|1
roundup|roundup_power2_divisions:4|1
gc-threshold|garbage_collection_threshold:0.6|0.5
expandable|expandable_segments:True|1
CONFS
exit "$failed"
