"""Shared fixtures of the Python suite: the bundled traces, the `fragsim` command next to this
interpreter, and the rule that under CI every optional package must be there."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "traces" / "real"
SNAPSHOTS = sorted(REAL.glob("*.pickle"))
TEXT_TRACE = REPO / "traces" / "gpt-4l-512h.txt"
KINETO = REAL / "kineto-ddp-v100-rank1.json.gz"


def need(module: str):
    """Imports `module`; skips the test without it, except under CI (`CI=true`), where `.ci/run`
    installs it and its absence is a failure."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed, and CI installs it (.ci/run)")
        pytest.skip(f"{module} is not installed")


def fragsim_command() -> str:
    """The `fragsim` command `pip install` put beside this interpreter."""
    bindir = Path(sys.executable).parent
    for name in ("fragsim", "fragsim.exe"):
        if (bindir / name).exists():
            return str(bindir / name)
    pytest.fail(f"no fragsim command in {bindir}: is the package installed (pip install .)?")


def cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    """Runs the installed `fragsim` command; fails unless it exits with `expect`."""
    done = subprocess.run([fragsim_command(), *args], capture_output=True, text=True)
    assert done.returncode == expect, (args, done.returncode, done.stderr)
    return done


def cli_json(*args: str, expect: int = 0):
    """What the installed command prints with `--json`, parsed."""
    return json.loads(cli(*args, "--json", expect=expect).stdout)


def without_timings(value):
    """`value` with the keys that hold wall-clock times (`replay_seconds`, ...) left out."""
    if isinstance(value, dict):
        return {
            k: without_timings(v) for k, v in value.items() if not k.endswith("_seconds")
        }
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def renamed(value, old: str, new: str):
    """`value` with every string equal to `old` replaced by `new` (a trace's name)."""
    if isinstance(value, dict):
        return {k: renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, old, new) for v in value]
    return new if value == old else value
