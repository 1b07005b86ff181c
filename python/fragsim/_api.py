"""Every fragsim command as a function.

Each function builds the command line its keyword arguments stand for (``policies=[...]`` is
``--policy`` given once per item, ``capacity="40GiB"`` is ``--capacity=40GiB``, ``jobs=4`` is
``--jobs=4``, ``True`` is a bare flag, ``None``/``False`` leave it out) and runs it with the Rust
crate's own command line, in this process: the one implementation of every command. What the
command prints with ``--format json`` comes back as a :class:`Result`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from . import _native
from ._errors import raise_for
from ._result import Result

#: What a trace argument may be: a path, a trace file's content (``bytes``), a binary file
#: object, or the dict ``torch.cuda.memory._snapshot()`` returns (or ``pickle.load`` of a
#: dumped snapshot gives).
TraceLike = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Any, Mapping[str, Any]]


class _Call:
    """One command line being built: its arguments and the traces it takes from memory."""

    def __init__(self, command: str) -> None:
        self.argv: List[str] = ["fragsim", command]
        self.memory: List[Tuple[str, Any]] = []

    def source(self, trace: Any) -> None:
        """Adds a trace argument: a path as it is, anything else under a name of its own."""
        if isinstance(trace, (str, os.PathLike)):
            self.argv.append(os.fspath(trace))
            return
        if isinstance(trace, (bytes, bytearray, memoryview)):
            kind, held = "bytes", bytes(trace)
        elif isinstance(trace, (dict, list)) or isinstance(trace, Mapping):
            kind, held = "dict", trace if isinstance(trace, (dict, list)) else dict(trace)
        elif hasattr(trace, "read"):
            data = trace.read()
            if not isinstance(data, (bytes, bytearray)):
                from ._errors import UsageError

                raise UsageError(
                    f"a trace file object must be opened in binary mode ('rb'), got "
                    f"{type(data).__name__} from read()"
                )
            kind, held = "file", bytes(data)
        else:
            from ._errors import UsageError

            raise UsageError(
                f"a trace is a path, bytes, a binary file object or a snapshot dict, not "
                f"{type(trace).__name__}"
            )
        taken = {name for name, _ in self.memory}
        name = f"<{kind}>"
        n = 2
        while name in taken:
            name = f"<{kind} {n}>"
            n += 1
        self.argv.append(name)
        self.memory.append((name, held))

    def options(self, options: Mapping[str, Any]) -> None:
        """Adds ``--flag=value`` per keyword argument."""
        for key, value in options.items():
            if value is None or value is False:
                continue
            flag = "--policy" if key in ("policies", "policy") else "--" + key.replace("_", "-")
            if value is True:
                self.argv.append(flag)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    self.argv.append(f"{flag}={_text(v)}")
            else:
                self.argv.append(f"{flag}={_text(value)}")

    def run(self, verbose: bool) -> Tuple[int, str, List[str]]:
        """Runs the command line: exit code, stdout and the notes of stderr; raises its error.
        ``verbose`` prints the notes on ``sys.stderr`` (and allows progress bars where stderr is
        a terminal)."""
        progress = bool(verbose) and _isatty(sys.stderr)
        code, out, err, error = _native.call(self.argv, self.memory, progress)
        notes = [line for line in err.splitlines() if line]
        if verbose and err:
            sys.stderr.write(err)
        if error is not None:
            raise_for(*error)
        return code, out, notes


def _text(value: Any) -> str:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _json(command: str, call: _Call, verbose: bool) -> Result:
    code, out, notes = call.run(verbose)
    return Result(json.loads(out), command, code, notes)


def _sources(call: _Call, traces: Any) -> None:
    """Adds one trace or each of a sequence of them (a list of dicts is a list of snapshots)."""
    if isinstance(traces, (list, tuple)) and traces and not _is_segment_list(traces):
        for t in traces:
            call.source(t)
    else:
        call.source(traces)


def _is_segment_list(value: Sequence[Any]) -> bool:
    # A legacy `torch.cuda.memory_snapshot()` is a list of segment dicts, one trace.
    return all(isinstance(v, dict) and "blocks" in v for v in value)


def info(trace: TraceLike, *, verbose: bool = False, **options: Any) -> Result:
    """``fragsim info TRACE --json``: what a trace holds (format, devices, events by kind, ...)."""
    call = _Call("info")
    call.source(trace)
    call.options(options)
    call.argv.append("--json")
    return _json("info", call, verbose)


def replay(trace: TraceLike, *, verbose: bool = False, **options: Any) -> Result:
    """``fragsim replay TRACE --json``: one device's events against each policy
    (``policies=["pytorch", "pytorch:expandable_segments:True"]``, ``capacity="40GiB"``,
    ``device=0``, ``jobs=4``, ...); one row per policy in ``result["results"]``."""
    call = _Call("replay")
    call.source(trace)
    call.options(options)
    call.argv.append("--json")
    return _json("replay", call, verbose)


def validate(snapshot: TraceLike, *, verbose: bool = False, **options: Any) -> Result:
    """``fragsim validate SNAPSHOT --json``: the PyTorch policy's decisions against the recording;
    ``result.exit_code`` is 1 when a decision differs (``result["mismatches"]``)."""
    call = _Call("validate")
    call.source(snapshot)
    call.options(options)
    call.argv.append("--json")
    return _json("validate", call, verbose)


def fit(trace: TraceLike, *, verbose: bool = False, **options: Any) -> Result:
    """``fragsim fit TRACE --json``: per policy, the least device memory with no OOM."""
    call = _Call("fit")
    call.source(trace)
    call.options(options)
    call.argv.append("--json")
    return _json("fit", call, verbose)


def sweep(traces: Union[TraceLike, Sequence[TraceLike]], *, verbose: bool = False,
          **options: Any) -> Result:
    """``fragsim sweep TRACE... --json``: brace-expanded policy specs on every trace, ranked by
    the worst case; ``result["best"]["env"]`` is the line to paste. With ``out=...`` and
    ``shard="I/N"`` it writes a part and returns an empty result."""
    call = _Call("sweep")
    _sources(call, traces)
    call.options(options)
    if options.get("out") is not None:
        code, _, notes = call.run(verbose)
        return Result({}, "sweep", code, notes)
    call.argv.append("--json")
    return _json("sweep", call, verbose)


def merge(parts: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]], *,
          verbose: bool = False, **options: Any) -> Result:
    """``fragsim merge PART.json... --json``: the parts of a sharded sweep, combined into exactly
    what the unsharded sweep returns."""
    call = _Call("merge")
    for p in [parts] if isinstance(parts, (str, os.PathLike)) else parts:
        call.argv.append(os.fspath(p))
    call.options(options)
    call.argv.append("--json")
    return _json("merge", call, verbose)


def check(traces: Union[TraceLike, Sequence[TraceLike]], *, baseline: Union[str, "os.PathLike[str]"],
          verbose: bool = False, **options: Any) -> Result:
    """``fragsim check TRACE... --baseline FILE --json``: replays and compares with a baseline;
    ``result["ok"]`` is false (and ``result.exit_code`` 1) on a regression beyond the tolerance.
    ``update=True`` (re)writes the baseline and returns an empty result."""
    call = _Call("check")
    _sources(call, traces)
    call.options({"baseline": baseline, **options})
    if options.get("update"):
        code, _, notes = call.run(verbose)
        return Result({}, "check", code, notes)
    call.argv.append("--json")
    return _json("check", call, verbose)


def convert(input: TraceLike, output: Union[str, "os.PathLike[str]"], *, verbose: bool = False,
            **options: Any) -> Path:
    """``fragsim convert IN OUT``: the output format follows OUT's extension. Returns OUT."""
    call = _Call("convert")
    call.source(input)
    call.argv.append(os.fspath(output))
    call.options(options)
    call.run(verbose)
    return Path(output)


def synth(out: Union[str, "os.PathLike[str]"], *, verbose: bool = False, **options: Any) -> Path:
    """``fragsim synth OUT``: writes a synthetic training trace (``layers=``, ``hidden=``,
    ``steps=``, ...). Returns OUT."""
    call = _Call("synth")
    call.argv.append(os.fspath(out))
    call.options(options)
    call.run(verbose)
    return Path(out)


def report(trace: TraceLike, *, out: Union[str, "os.PathLike[str]"], verbose: bool = False,
           **options: Any) -> Dict[str, Path]:
    """``fragsim report TRACE --out DIR``: charts, tables and an index.html. Returns the files it
    wrote, by name (``paths["index.html"]``, ``paths["peaks.svg"]``, ...)."""
    call = _Call("report")
    call.source(trace)
    call.options({"out": out, **options})
    started = time.time() - 1.0
    call.run(verbose)
    folder = Path(out)
    return {
        p.name: p
        for p in sorted(folder.iterdir())
        if p.is_file() and p.stat().st_mtime >= started
    }


def _json_command(name: str):
    """A function for a command that prints ``--format json`` (``blame``, ``diff``)."""

    def command(*traces: TraceLike, verbose: bool = False, **options: Any) -> Result:
        call = _Call(name)
        for t in traces:
            call.source(t)
        call.options(options)
        call.argv.append("--format=json")
        return _json(name, call, verbose)

    command.__name__ = name
    command.__doc__ = f"``fragsim {name} ... --format json``, as a :class:`Result`."
    return command
