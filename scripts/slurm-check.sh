#!/usr/bin/env bash
# The Slurm deployment end to end on this one machine (docs/guide.md, "Sweeps on a cluster"): installs
# Slurm and MUNGE from the Debian packages when they are missing, starts a one-node cluster
# (munged, slurmctld and slurmd run directly, not through systemd), submits
# deploy/slurm/submit.sh's job array and dependent merge job on three real snapshots in
# traces/real/ with a 12-point grid in 4 shards, waits for both, and compares the merged sweep
# with the unsharded one: the JSON equal apart from `replay_seconds`, the tables byte-equal.
# Prints PASS/FAIL lines; exits 1 when a check fails, 2 when the cluster cannot be set up.
# Stops the daemons it started, whatever happens. Needs root (apt-get, daemons).
#
# Usage: scripts/slurm-check.sh        FRAGSIM=PATH uses that binary instead of a release build.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
work="$(mktemp -d /tmp/fragsim-slurm-check.XXXXXX)"
failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }
die() { echo "FAIL $*"; exit 2; }

started=() # pids of the daemons this script started, stopped in reverse order at exit
cleanup() {
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ]; then
    scancel --quiet --user="$(id -un)" 2>/dev/null || true
  fi
  for ((i = ${#started[@]} - 1; i >= 0; i--)); do
    kill "${started[i]}" 2>/dev/null && wait "${started[i]}" 2>/dev/null
  done
  if [ -n "${munged_pid:-}" ]; then kill "$munged_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

[ "$(id -u)" -eq 0 ] || die "setup: run as root (installs packages, starts daemons)"

# 1. Slurm and MUNGE from the Debian packages.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  echo "== apt-get install slurm-wlm munge"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq slurm-wlm munge; } >"$work/apt.log" 2>&1 ||
    { tail -20 "$work/apt.log"; die "setup: apt-get install slurm-wlm munge"; }
fi
pass "setup: $(slurmctld -V) and $(munged -V 2>&1 | head -1)"

# 2. MUNGE: the key the package made (or a new one), munged running as the munge user.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- munged --force || die "setup: munged did not start"
  munged_pid="$(cat /run/munge/munged.pid 2>/dev/null)"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null 2>&1 || die "setup: munge credentials do not round-trip"

# 3. A one-node cluster with its own config, state and ports (nothing under /etc/slurm changes).
export SLURM_CONF="$work/slurm.conf"
mkdir -p "$work/state" "$work/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=fragsimcheck
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=check Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i >"$work/slurmctld.out" 2>&1 &
started+=($!)
slurmd -D -N localhost >"$work/slurmd.out" 2>&1 &
started+=($!)
state=""
for _ in $(seq 60); do
  state="$(sinfo -h -n localhost -o %T 2>/dev/null)"
  [ "$state" = idle ] && break
  sleep 1
done
if [ "$state" != idle ]; then
  tail -20 "$work/slurmctld.log" "$work/slurmd.log" 2>/dev/null
  die "setup: the node is '${state:-unreachable}' after 60 s, not idle"
fi
pass "cluster: slurmctld and slurmd up, node localhost idle with $(nproc) CPUs"

# 4. fragsim, release.
if [ -n "${FRAGSIM:-}" ]; then
  bin="$FRAGSIM"
elif command -v cargo >/dev/null; then
  cargo build --release --quiet 2>"$work/build.log" || { cat "$work/build.log"; die "build: cargo build --release"; }
  bin="$repo/target/release/fragsim"
else
  bin="$repo/target/release/fragsim"
fi
[ -x "$bin" ] || die "build: no fragsim binary at $bin"
pass "build: $bin"

# 5. The sharded sweep through Slurm: a 4-task array and the merge job that waits for it.
traces="traces/real/cs336-lm-step-b.pickle traces/real/cs336-lm-step-c.pickle traces/real/cs336-medium-ctx512-infer.pickle"
specs='pytorch:max_split_size_mb:{64,128,256,512},roundup_power2_divisions:{1,4,8}'
out="$work/out"
if ! submitted=$(FRAGSIM="$bin" FRAGSIM_TRACES="$traces" FRAGSIM_SPECS="$specs" FRAGSIM_SHARDS=4 \
  FRAGSIM_OUT="$out" deploy/slurm/submit.sh 2>&1); then
  echo "$submitted"
  die "submit: deploy/slurm/submit.sh"
fi
echo "$submitted"
start=$SECONDS
while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $((SECONDS - start)) -lt 1200 ]; do sleep 2; done
if [ -n "$(squeue -h -o %i)" ]; then
  squeue
  fail "slurm: jobs still queued after 1200 s"
  exit 1
fi
elapsed=$((SECONDS - start))
parts=$(find "$out" -name 'part-*-of-4.json' | wc -l)
if [ "$parts" -eq 4 ] && [ -s "$out/sweep.json" ]; then
  pass "slurm: 4 array tasks wrote their parts and the merge job merged them (${elapsed} s)"
else
  for log in "$out"/slurm-*.out; do echo "--- $log"; tail -5 "$log"; done
  fail "slurm: $parts of 4 parts, merged result $( [ -s "$out/sweep.json" ] && echo present || echo missing)"
  exit 1
fi

# 6. The unsharded sweep on this machine, and the comparison.
read -ra trace_args <<<"$traces"
"$bin" sweep "${trace_args[@]}" -p "$specs" --quiet --json >"$work/whole.json" ||
  die "sweep: the unsharded run failed"
"$bin" sweep "${trace_args[@]}" -p "$specs" --quiet >"$work/whole.txt"
untimed() {
  python3 -c 'import json,sys
v=json.load(open(sys.argv[1]))
for r in v["results"]: r.pop("replay_seconds", None)
print(json.dumps(v, sort_keys=True, indent=1))' "$1"
}
configs=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["ranking"]))' "$work/whole.json")
if diff <(untimed "$work/whole.json") <(untimed "$out/sweep.json") >"$work/json.diff"; then
  pass "merge: merged JSON == unsharded JSON apart from replay_seconds (3 traces x $configs configs)"
else
  head -40 "$work/json.diff"
  fail "merge: merged JSON differs from the unsharded sweep"
fi
if cmp -s "$work/whole.txt" "$out/sweep.txt"; then
  pass "merge: merged table == unsharded table"
else
  diff "$work/whole.txt" "$out/sweep.txt" | head -20
  fail "merge: merged table differs from the unsharded sweep"
fi
grep -m1 '^export PYTORCH_CUDA_ALLOC_CONF' "$out/sweep.txt" || true
[ "$failed" -eq 0 ] && echo "PASS slurm-check" || echo "FAIL slurm-check"
exit "$failed"
