#!/usr/bin/env bash
# Every command that replays a trace runs in bounded memory on a large one: two 30 M-event .fst
# traces from `fragsim synth` (about 800 MB each), and each command under a 4 GiB address-space
# limit (prlimit --as), which aborts a run that tries to hold more. `.ci/run` calls it; run it by
# hand the same way (needs util-linux's prlimit and ~2 GB free in $TMPDIR).
#
#   scripts/bounded-memory.sh            # every command
#   scripts/bounded-memory.sh diff fit   # only these
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((4 * 1024 * 1024 * 1024))
cargo build --release --quiet
bin="$PWD/target/release/fragsim"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

shape=(--layers 24 --steps 5900 --seq 1024 --vary-seq 256:1024)
"$bin" synth "${shape[@]}" "$dir/a.fst" >/dev/null
"$bin" synth "${shape[@]}" --seed 7 "$dir/b.fst" >/dev/null
echo "traces: $(du -h "$dir/a.fst" | cut -f1) and $(du -h "$dir/b.fst" | cut -f1) (30,267,876 events each)"

# One command under the limit: says its time (and peak memory where GNU time is installed), and
# stops the script with its stderr when it fails.
bounded() {
  local name="$1"
  shift
  local start=$SECONDS
  local timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -f "%M" -o "$dir/rss")
  if ! "${timer[@]}" prlimit --as="$limit" "$bin" "$@" >"$dir/out" 2>"$dir/err"; then
    echo "FAIL $name under a 4 GiB address limit: fragsim $*" >&2
    tail -20 "$dir/err" >&2
    exit 1
  fi
  local rss=""
  [ -s "$dir/rss" ] && rss=", peak $(($(tail -1 "$dir/rss") / 1024)) MiB resident"
  echo "ok   $name: $((SECONDS - start)) s$rss"
}

wanted=("$@")
want() { [ ${#wanted[@]} -eq 0 ] || [[ " ${wanted[*]} " == *" $1 "* ]]; }

want replay && bounded replay replay "$dir/a.fst" -p pytorch -p bfc -p bound
want blame && bounded blame blame "$dir/a.fst"
want explain && bounded explain explain "$dir/a.fst"
want fit && bounded fit fit "$dir/a.fst"
want sweep && bounded sweep sweep "$dir/a.fst" -p pytorch -p pytorch-expandable -p bfc
if want check; then
  bounded check check "$dir/a.fst" --baseline "$dir/baseline.json" --update
  bounded check check "$dir/a.fst" --baseline "$dir/baseline.json"
fi
want diff && bounded diff diff "$dir/a.fst" "$dir/b.fst" --out "$dir/diff"
exit 0
