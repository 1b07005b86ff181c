#!/usr/bin/env python3
"""Times a snapshot dict's conversion against reading its pickle file (docs/performance.md,
"Snapshot dicts from Python"): for each snapshot, `pickle.load` gives the dict
`torch.cuda.memory._snapshot()` would have returned, then `fragsim._native.convert_only` times
the dict turned into a trace against the file read into one, without stack frames (what most
commands read) and with them (`convert`, `--capacity`). Best of --runs each, taken in turn.

    python3 scripts/dict-speed.py                      # the bundled snapshots
    python3 scripts/dict-speed.py --runs 3 /tmp/big.pickle

A million-event snapshot to try it on (with frames: a real one's entries repeated; without:
a synthetic one):

    cargo run --release --example repeat_snapshot -- \\
        traces/real/cs336-medium-ctx512-train.pickle 45 /tmp/big-frames.pickle
    fragsim synth --layers 24 --steps 200 /tmp/synth.pickle

It needs the package importable (`pip install .`, or `maturin develop --release`); the numbers
of a debug build say little.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def best(f, runs: int) -> float:
    return min(f() for _ in range(runs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshots", nargs="*", type=Path, help="pickle files (default: bundled)")
    ap.add_argument("--runs", type=int, default=5, help="best of this many (default 5)")
    args = ap.parse_args()
    from fragsim import _native

    paths = args.snapshots or sorted((REPO / "traces" / "real").glob("*.pickle"))
    print("snapshot | MB | frames | dict s | file s | dict/file")
    for path in paths:
        with open(path, "rb") as f:
            d = pickle.load(f)
        # The dict stays alive for the whole measurement; the collector would only add noise.
        gc.disable()
        for keep_frames in (False, True):
            dict_s = file_s = float("inf")
            for _ in range(args.runs):
                dict_s = min(dict_s, _native.convert_only(d, keep_frames))
                file_s = min(file_s, _native.convert_only(str(path), keep_frames))
            size = path.stat().st_size / 1e6
            print(f"{path.name} | {size:.1f} | {'with' if keep_frames else 'without'} | "
                  f"{dict_s:.4f} | {file_s:.4f} | {dict_s / file_s:.2f}", flush=True)
        gc.enable()
        del d
    return 0


if __name__ == "__main__":
    sys.exit(main())
