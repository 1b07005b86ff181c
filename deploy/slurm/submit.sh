#!/usr/bin/env bash
# Submits a sharded fragsim sweep to Slurm: a job array of FRAGSIM_SHARDS tasks running
# deploy/slurm/sweep.sbatch, and a merge job that starts once every task succeeded
# (--dependency=afterok on the array). Prints the two job ids. Settings: the environment
# variables documented in sweep.sbatch; extra arguments go to both sbatch calls (e.g.
# --partition=cpu --time=01:00:00).
#
#   FRAGSIM_TRACES="$(echo traces/real/*.pickle)" \
#   FRAGSIM_SPECS='pytorch:max_split_size_mb:{64,128,256},roundup_power2_divisions:{1,4}' \
#   FRAGSIM_SHARDS=4 FRAGSIM_OUT=sweep-out deploy/slurm/submit.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shards="${FRAGSIM_SHARDS:-4}"
out="${FRAGSIM_OUT:-sweep-out}"
if ! [[ "$shards" =~ ^[1-9][0-9]*$ ]]; then
  echo "submit.sh: FRAGSIM_SHARDS must be a positive integer, not '$shards'" >&2
  exit 2
fi
if [ -z "${FRAGSIM_TRACES:-}" ]; then
  echo "submit.sh: FRAGSIM_TRACES is empty: set it to the traces to sweep" >&2
  exit 2
fi
mkdir -p "$out"
export FRAGSIM_SHARDS="$shards" FRAGSIM_OUT="$out"
array=$(FRAGSIM_STEP=shard sbatch --parsable --export=ALL --array="0-$((shards - 1))" \
  --output="$out/slurm-%A_%a.out" "$@" "$here/sweep.sbatch")
array="${array%%;*}" # --parsable prints JOBID[;CLUSTER]
merge=$(FRAGSIM_STEP=merge sbatch --parsable --export=ALL --dependency="afterok:$array" \
  --kill-on-invalid-dep=yes --job-name=fragsim-merge --output="$out/slurm-%j-merge.out" \
  "$@" "$here/sweep.sbatch")
merge="${merge%%;*}"
echo "array job $array ($shards shards), merge job $merge; results: $out/sweep.json, $out/sweep.txt"
