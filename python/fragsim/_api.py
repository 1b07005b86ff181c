"""Every fragsim command as a function, and :class:`Trace`, a trace loaded once.

Each function names the options of its command as typed keyword parameters, builds the command
line they stand for (``policies=[...]`` is ``--policy`` given once per item, ``capacity="40GiB"``
is ``--capacity=40GiB``, ``True`` a bare flag, ``None``/``False`` leave it out) and runs it with
the Rust crate's own command line, in this process: the one implementation of every command.
What the command prints with ``--format json`` comes back as a :class:`Result`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import _native, _params
from ._errors import UsageError, raise_for
from ._result import Result

PathLike = Union[str, "os.PathLike[str]"]

#: What a trace argument may be: a path, a trace file's content (``bytes``), a binary file
#: object, the dict ``torch.cuda.memory._snapshot()`` returns (or ``pickle.load`` of a dumped
#: snapshot gives), or a :class:`Trace` from :func:`load`.
TraceLike = Union[
    str, "os.PathLike[str]", bytes, bytearray, memoryview, IO[bytes], Mapping[str, Any],
    List[Any], "Trace",
]

#: A size: an ``int`` of bytes, or a string fragsim reads (``"40GiB"``, ``"a100-40gb"``).
Size = Union[int, str]

#: A policy: a spec string (``"pytorch:expandable_segments:True"``), or the settings of the
#: PyTorch policy as a dict (``{"expandable_segments": True}``, ``PYTORCH_CUDA_ALLOC_CONF``'s
#: keys).
PolicyLike = Union[str, Mapping[str, Any]]

#: One policy or several.
Policies = Union[PolicyLike, Sequence[PolicyLike]]

#: A replay's memory limit: a size, ``"recorded"`` (the limit the recording implies, the
#: default) or ``"none"`` (unlimited).
Capacity = Union[int, str]

F = TypeVar("F", bound=Callable[..., Any])


def _suggesting(function: F) -> F:
    """Makes a keyword the function does not take a ``TypeError`` that names it and the closest
    one it takes (``did you mean 'policies'?``), and checks every value given by its parameter's
    name (:mod:`fragsim._params`: a bad one is a :class:`UsageError` naming it); the signature
    stays the function's own."""
    sig = inspect.signature(function)
    names = [
        n for n, p in sig.parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    qualname = function.__qualname__

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for key in kwargs:
            if key not in sig.parameters:
                raise TypeError(_unknown_keyword(qualname, key, names))
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return function(*args, **kwargs)  # Python's own words for a missing argument
        for name, value in bound.arguments.items():
            bound.arguments[name] = _params.checked(name, value)
        return function(*bound.args, **bound.kwargs)

    return checked  # type: ignore[return-value]


def _unknown_keyword(where: str, key: str, names: Sequence[str]) -> str:
    message = f"{where}() got an unexpected keyword argument '{key}'"
    close = difflib.get_close_matches(key, [n for n in names if n != "self"], n=1, cutoff=0.5)
    if close:
        message += f"; did you mean '{close[0]}'?"
    else:
        message += "; it takes " + ", ".join(f"'{n}'" for n in names if n != "self")
    return message


def _policy_text(policy: PolicyLike, name: str = "policy") -> str:
    if isinstance(policy, str):
        return policy
    if isinstance(policy, Mapping):
        settings = ",".join(f"{k}:{_setting(v)}" for k, v in policy.items())
        return "pytorch:" + settings if settings else "pytorch"
    raise UsageError(
        f"{name}={policy!r}: expected a policy spec string or a dict of PyTorch settings, not "
        f"{type(policy).__name__}"
    )


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def _policy_list(policies: Optional[Policies]) -> Optional[List[str]]:
    if policies is None:
        return None
    if isinstance(policies, (str, Mapping)):
        return [_policy_text(policies, "policies")]
    if not hasattr(policies, "__iter__"):
        return [_policy_text(policies, "policies")]  # type: ignore[arg-type]  # raises
    return [_policy_text(p, f"policies[{i}]") for i, p in enumerate(policies)]


def _size(name: str, value: Optional[Union[int, str]]) -> Optional[str]:
    return None if value is None else _params.size(name, value)


class _Call:
    """One command line being built: its arguments and the traces it takes from memory."""

    def __init__(self, command: str) -> None:
        self.argv: List[str] = ["fragsim", command]
        self.memory: List[Tuple[str, Any]] = []

    def source(self, trace: Any) -> None:
        """Adds a trace argument: a loaded trace under its name, a path as it is, anything
        else held under a name of its own, read once for the whole command."""
        if isinstance(trace, Trace):
            name = trace.name
            if any(n == name and held is not trace._native for n, held in self.memory):
                name = self._fresh(f"<{trace.kind}>")
            self.argv.append(name)
            if not any(n == name for n, _ in self.memory):
                self.memory.append((name, trace._native))
            return
        if isinstance(trace, (str, os.PathLike)):
            self.argv.append(os.fspath(trace))
            return
        kind, held = _held(trace)
        name = self._fresh(f"<{kind}>")
        self.argv.append(name)
        self.memory.append((name, _native.Loaded(held)))

    def _fresh(self, base: str) -> str:
        taken = {name for name, _ in self.memory} | set(self.argv)
        name, n = base, 2
        while name in taken:
            name = f"{base[:-1]} {n}>"
            n += 1
        return name

    def flag(self, name: str, value: Any) -> None:
        """Adds ``--name=value`` (``--name`` for ``True``; nothing for ``None``/``False``;
        once per item of a list)."""
        if value is None or value is False:
            return
        flag = "--" + name.replace("_", "-")
        if value is True:
            self.argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.argv.append(f"{flag}={_text(v)}")
        else:
            self.argv.append(f"{flag}={_text(value)}")

    def flags(self, **values: Any) -> None:
        for name, value in values.items():
            self.flag(name, value)

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
            _raise(error)
        return code, out, notes


def _raise(error: Tuple[str, str, Optional[str], Optional[str], Optional[str], str]) -> None:
    """Raises the exception for a failed command's or question's error parts; a usage error in
    the words of the functions (:func:`_usage_words`)."""
    kind, message, file, format, place, line = error
    if kind == "usage":
        message = line = _usage_words(message)
    raise_for(kind, message, file, format, place, line)


def _on(trace: Any, device: Optional[int] = None, max_input_size: Optional[Size] = None,
        taken: Sequence[Any] = ()) -> Any:
    """What the library's session is asked about (``_native.On``): the native trace, its name
    in answers and errors, the device, the read limit, and whether it is read for this question
    alone (a path given to a function: read from the file and not kept, a ``.fst`` file
    streamed where the question allows; a :class:`Trace` keeps what it read). A trace from
    memory whose name another of the question's traces (``taken``) holds is ``<dict 2>``,
    ``<dict 3>``, ... as the command line names them."""
    once = False
    if isinstance(trace, Trace):
        native, name = trace._native, trace.name
        if max_input_size is None:
            max_input_size = trace.max_input_size
    elif isinstance(trace, (str, os.PathLike)):
        name = os.fspath(trace)
        native, once = _native.Loaded(name), True
    else:
        kind, held = _held(trace)
        native, name = _native.Loaded(held), f"<{kind}>"
    limit = _size("max_input_size", max_input_size)
    on = _native.On(native, name, device=device, max_input_size=limit, once=once)
    others = {t.name for t in taken if not on.same_trace(t)}
    if name in others and name.startswith("<"):
        n = 2
        while f"{name[:-1]} {n}>" in others:
            n += 1
        on = _native.On(native, f"{name[:-1]} {n}>", device=device, max_input_size=limit,
                        once=once)
    return on


def _ons(traces: Any, device: Optional[int], max_input_size: Optional[Size]) -> List[Any]:
    """:func:`_on` of one trace or of each of a sequence of them (a list of dicts is a list of
    snapshots)."""
    if not (isinstance(traces, (list, tuple)) and traces and not _is_segment_list(traces)):
        traces = [traces]
    ons: List[Any] = []
    for t in traces:
        ons.append(_on(t, device, max_input_size, taken=ons))
    return ons


def _answer(question: str, outcome: Tuple[int, Optional[str], List[str], Any],
            verbose: bool) -> Result:
    """A question the library's session answered in this process, with no command line between
    (``_native.info``, ``replay``, ``explain``, ``fit``, ``blame``, ``diff``, ``sweep``,
    ``check``, ``validate``, ``merge``, and ``report`` and ``convert``, whose answer is the files
    they write): the JSON the command prints with ``--format json`` as a
    :class:`Result`, its notes as the command prints them on stderr."""
    code, text, notes, error = outcome
    notes = [f"fragsim: {n}" for n in notes]
    if verbose and notes:
        sys.stderr.write("".join(n + "\n" for n in notes))
    if error is not None or text is None:
        _raise(error or ("internal", "no answer", None, None, None, "no answer"))
    return Result(json.loads(text or "{}"), question, code, notes)


def _held(trace: Any) -> Tuple[str, Any]:
    """What a trace from memory is held as: its kind (``bytes``, ``dict``, ``file``) and the
    object the native module reads."""
    if isinstance(trace, (bytes, bytearray, memoryview)):
        return "bytes", bytes(trace)
    if isinstance(trace, (dict, list)):
        return "dict", trace
    if isinstance(trace, Mapping):
        return "dict", dict(trace)
    if hasattr(trace, "read"):
        data = trace.read()
        if not isinstance(data, (bytes, bytearray)):
            raise UsageError(
                f"a trace file object must be opened in binary mode ('rb'), got "
                f"{type(data).__name__} from read()"
            )
        return "file", bytes(data)
    raise UsageError(
        f"a trace is a path, bytes, a binary file object or a snapshot dict, not "
        f"{type(trace).__name__}"
    )


_FLAG = re.compile(r"'--([a-z0-9-]+)(?: <[^>]*>)?'")
_TYPED = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)[ =](\S+?):")
_BARE = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)\b")


def _usage_words(message: str) -> str:
    """A usage error in fragsim's own words for Python: the parameter's name (``by=``), not the
    command line's flag, and no usage line or ``--help`` hint."""
    lines = [
        ln for ln in message.splitlines()
        if ln.strip() and not ln.startswith("Usage:") and "--help" not in ln
        and not ln.strip().startswith("tip:")
    ]
    text = " ".join(ln.strip() for ln in lines)
    for cli_words, python_words in _BEFORE:
        text = re.sub(cli_words, python_words, text)

    def param(m: "re.Match[str]") -> str:
        name = m.group(1).replace("-", "_")
        return "policies" if name == "policy" else name

    text = _FLAG.sub(lambda m: param(m), text)
    text = re.sub(r"invalid value '([^']*)' for (\w+)", r"\2=\1 is not valid", text)
    # fragsim's own messages name the flag as typed: `--at nowhere: expected ...`.
    text = _TYPED.sub(lambda m: f"{param(m)}={m.group(2)}:", text)
    text = _BARE.sub(lambda m: f"{param(m)}=", text)
    text = text.replace("[possible values: ", "(one of: ").replace("]", ")")
    for cli_words, python_words in _PHRASES:
        text = text.replace(cli_words, python_words)
    return text


#: Messages that name a flag with its value and no colon, in the words of the functions (before
#: the flags are renamed).
_BEFORE = (
    (r"--pytorch-version (\S+) and", r"pytorch_version=\1 and"),
    (r"--pytorch-version models", "pytorch_version models"),
    (r": add -p pytorch", ": add 'pytorch' to policies"),
)

#: What the command line's messages say in its own syntax, in the words of the functions.
_PHRASES = (
    ("diff TRACE compares two policies: give exactly two (-p X -p Y)",
     "diff of one trace compares two policies: give policies=[X, Y], or a second trace,"),
    ("diff A B takes one policy", "diff(a, b) takes one policy"),
)


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


def _json(command: str, call: _Call, verbose: bool, flag: str = "--json") -> Result:
    call.argv.append(flag)
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


# ---------------------------------------------------------------------------------------------
# The commands. Each module-level function takes a trace first; Trace's methods call them.


@_suggesting
def info(trace: TraceLike, *, max_input_size: Optional[Size] = None,
         verbose: bool = False) -> Result:
    """``fragsim info TRACE --json``: what a trace holds (format, devices, events by kind, the
    recording's peaks and capacity hints).

    :param max_input_size: the most bytes the trace may hold (default 4 GiB).
    :param verbose: print the command's notes on stderr (they are in ``result.notes`` anyway).
    """
    outcome = _native.info(_on(trace, max_input_size=max_input_size))
    return _answer("info", outcome, verbose)


@_suggesting
def replay(
    trace: TraceLike,
    *,
    policies: Optional[Policies] = None,
    device: Optional[int] = None,
    capacity: Optional[Capacity] = None,
    empty_cache_every: Optional[int] = None,
    empty_cache_at: Optional[Sequence[int]] = None,
    no_recorded_empty_cache: bool = False,
    outside: Optional[Size] = None,
    backend: Optional[str] = None,
    cuda_device: Optional[int] = None,
    touch: bool = False,
    export_snapshot: Optional[PathLike] = None,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim replay TRACE --json``: one device's events against each policy; one row per
    policy in ``result["results"]``, and the recorded run's row.

    :param policies: policy specs (``["pytorch", "pytorch-expandable", "bfc"]``, ``"all"``) or
        PyTorch settings as a dict; default ``pytorch``.
    :param device: the device to replay (default: the one with the most events).
    :param capacity: the device's memory: bytes, ``"40GiB"``, a card (``"a100-40gb"``),
        ``"recorded"`` (the limit the recording's OOM flushes imply, the default) or ``"none"``.
    :param empty_cache_every: call ``empty_cache()`` every N events (a what-if).
    :param empty_cache_at: call ``empty_cache()`` at these event indices.
    :param no_recorded_empty_cache: leave out the program's recorded ``empty_cache()`` calls.
    :param outside: device memory used outside the allocator (CUDA context, NCCL).
    :param backend: ``"sim"`` (default) or ``"cuda"`` (real GPU memory).
    :param cuda_device: with ``backend="cuda"``, the GPU to use.
    :param touch: with ``backend="cuda"``, write every new segment once.
    :param export_snapshot: write the first policy's simulated run as a PyTorch snapshot here.
    :param jobs: policies replayed in parallel (default: the cores).
    :param max_input_size: the most bytes the trace may hold.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    :param verbose: print the command's notes on stderr.
    """
    if backend in (None, "sim") and cuda_device is None and not touch and export_snapshot is None:
        outcome = _native.replay(
            _on(trace, device, max_input_size), policies=_policy_list(policies) or [],
            capacity=_size("capacity", capacity), empty_cache_every=empty_cache_every,
            empty_cache_at=list(empty_cache_at or []),
            no_recorded_empty_cache=no_recorded_empty_cache, outside=_size("outside", outside),
            jobs=jobs, pytorch_version=pytorch_version,
        )
        return _answer("replay", outcome, verbose)
    call = _Call("replay")
    call.source(trace)
    call.flags(
        policy=_policy_list(policies), device=device, capacity=_size("capacity", capacity),
        empty_cache_every=empty_cache_every,
        empty_cache_at=None if empty_cache_at is None else ",".join(map(str, empty_cache_at)),
        no_recorded_empty_cache=no_recorded_empty_cache, outside=_size("outside", outside),
        backend=backend, cuda_device=cuda_device, touch=touch, export_snapshot=export_snapshot,
        jobs=jobs, max_input_size=_size("max_input_size", max_input_size),
        pytorch_version=pytorch_version,
    )
    return _json("replay", call, verbose)


@_suggesting
def validate(
    snapshot: TraceLike,
    *,
    device: Optional[int] = None,
    gpu_mem: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    policy: Optional[PolicyLike] = None,
    export_snapshot: Optional[PathLike] = None,
    max_input_size: Optional[Size] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim validate SNAPSHOT --json``: the PyTorch policy's decisions against the
    recording; ``result.exit_code`` is 1 when a decision differs (``result["mismatches"]``).

    :param device: the device to check (default: the one with the most events).
    :param gpu_mem: the device's memory, when the recording's OOMs depend on it.
    :param pytorch_version: the PyTorch version that recorded it (default: from the snapshot).
    :param policy: the policy to check (a spec or PyTorch settings; default ``pytorch``).
    :param export_snapshot: write the simulated run as a PyTorch snapshot here.
    :param max_input_size: the most bytes the snapshot may hold.
    :param verbose: print the command's notes on stderr.
    """
    if export_snapshot is None:
        outcome = _native.validate(
            _on(snapshot, device, max_input_size), gpu_mem=_size("gpu_mem", gpu_mem),
            pytorch_version=pytorch_version,
            policy=None if policy is None else _policy_text(policy),
        )
        return _answer("validate", outcome, verbose)
    call = _Call("validate")
    call.source(snapshot)
    call.flags(
        device=device, gpu_mem=_size("gpu_mem", gpu_mem), pytorch_version=pytorch_version,
        policy=None if policy is None else _policy_text(policy), export_snapshot=export_snapshot,
        max_input_size=_size("max_input_size", max_input_size),
    )
    return _json("validate", call, verbose)


@_suggesting
def fit(
    trace: TraceLike,
    *,
    policies: Optional[Policies] = None,
    device: Optional[int] = None,
    outside: Optional[Size] = None,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim fit TRACE --json``: per policy, the least device memory with no OOM, and which
    cards it fits.

    :param policies: policy specs or PyTorch settings (default: the built-in set).
    :param device: the device to replay.
    :param outside: device memory used outside the allocator.
    :param jobs: policies searched in parallel.
    :param max_input_size: the most bytes the trace may hold.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    :param verbose: print the command's notes on stderr.
    """
    outcome = _native.fit(
        _on(trace, device, max_input_size), policies=_policy_list(policies) or [],
        outside=_size("outside", outside), jobs=jobs, pytorch_version=pytorch_version,
    )
    return _answer("fit", outcome, verbose)


@_suggesting
def sweep(
    traces: Union[TraceLike, Sequence[TraceLike]],
    *,
    policies: Optional[Policies] = None,
    objective: Optional[str] = None,
    device: Optional[int] = None,
    capacity: Optional[Capacity] = None,
    shard: Optional[str] = None,
    out: Optional[PathLike] = None,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim sweep TRACE... --json``: policy specs (brace-expanded:
    ``"pytorch:max_split_size_mb:{64,256}"``) on every trace, ranked by the worst case;
    ``result["best"]["env"]`` is the line to paste. Without ``policies``, the built-in grid.

    :param objective: the JSON key to rank by (default ``peak_reserved_bytes``).
    :param device: the device to replay.
    :param capacity: as for :func:`replay`.
    :param shard: ``"I/N"``: run part I of N (with ``out``); :func:`merge` joins the parts.
    :param out: write the (part) result to this file and return an empty result.
    :param jobs: replays in parallel.
    :param max_input_size: the most bytes a trace may hold.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    :param verbose: print the command's notes on stderr.
    """
    if shard is not None and out is None:
        raise UsageError(
            f"shard={shard!r} needs out=: a shard's result is a part of the sweep, not its "
            f"ranking, and it is written to the file out= names for fragsim.merge() to join "
            f"with the other parts (sweep(..., shard={shard!r}, out='part.json'))"
        )
    if out is None:
        outcome = _native.sweep(
            _ons(traces, device, max_input_size), policies=_policy_list(policies) or [],
            objective=objective, capacity=_size("capacity", capacity), jobs=jobs,
            pytorch_version=pytorch_version,
        )
        return _answer("sweep", outcome, verbose)
    call = _Call("sweep")
    _sources(call, traces)
    call.flags(policy=_policy_list(policies), objective=objective, device=device,
               capacity=_size("capacity", capacity), shard=shard, out=out, jobs=jobs,
               max_input_size=_size("max_input_size", max_input_size),
               pytorch_version=pytorch_version)
    code, _, notes = call.run(verbose)
    return Result({}, "sweep", code, notes)


@_suggesting
def merge(parts: Union[PathLike, Sequence[PathLike]], *,
          max_input_size: Optional[Size] = None, verbose: bool = False) -> Result:
    """``fragsim merge PART.json... --json``: the parts of a sharded sweep, combined into
    exactly what the unsharded sweep returns."""
    paths = [os.fspath(p) for p in ([parts] if isinstance(parts, (str, os.PathLike)) else parts)]
    outcome = _native.merge(paths, max_input_size=_size("max_input_size", max_input_size))
    return _answer("merge", outcome, verbose)


@_suggesting
def check(
    traces: Union[TraceLike, Sequence[TraceLike]],
    *,
    baseline: PathLike,
    tolerance: Optional[float] = None,
    policies: Optional[Policies] = None,
    device: Optional[int] = None,
    capacity: Optional[Capacity] = None,
    update: bool = False,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim check TRACE... --baseline FILE --json``: replays and compares with a baseline;
    ``result["ok"]`` is false (and ``result.exit_code`` 1) on a regression beyond the tolerance.

    :param baseline: the baseline file (JSON).
    :param tolerance: the percentage a peak may grow before it is a regression.
    :param update: (re)write the baseline and return an empty result.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    """
    if not update:
        outcome = _native.check(
            _ons(traces, device, max_input_size), baseline=os.fspath(baseline),
            policies=_policy_list(policies) or [],
            tolerance=None if tolerance is None else _text(tolerance),
            capacity=_size("capacity", capacity), jobs=jobs, pytorch_version=pytorch_version,
        )
        return _answer("check", outcome, verbose)
    call = _Call("check")
    _sources(call, traces)
    call.flags(baseline=baseline, tolerance=tolerance, policy=_policy_list(policies),
               device=device, capacity=_size("capacity", capacity), update=update, jobs=jobs,
               max_input_size=_size("max_input_size", max_input_size),
               pytorch_version=pytorch_version)
    if update:
        code, _, notes = call.run(verbose)
        return Result({}, "check", code, notes)
    return _json("check", call, verbose)


@_suggesting
def blame(
    trace: TraceLike,
    *,
    policies: Optional[Policies] = None,
    device: Optional[int] = None,
    capacity: Optional[Capacity] = None,
    at: Optional[Union[str, int]] = None,
    by: Optional[str] = None,
    top: Optional[int] = None,
    depth: Optional[int] = None,
    empty_cache_every: Optional[int] = None,
    empty_cache_at: Optional[Sequence[int]] = None,
    no_recorded_empty_cache: bool = False,
    flamegraph: Optional[PathLike] = None,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim blame TRACE --format json``: who holds the memory at a moment, by site.

    :param at: ``"peak"`` (default), ``"peak-live"``, ``"oom"`` or an event index.
    :param by: ``"site"`` (default), ``"function"``, ``"file"``, ``"stream"`` or ``"size"``.
    :param top: the sites shown (0: all).
    :param depth: frames shown per site.
    :param flamegraph: write a flame graph SVG here.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    """
    if flamegraph is None:
        outcome = _native.blame(
            _on(trace, device, max_input_size), policies=_policy_list(policies) or [],
            capacity=_size("capacity", capacity), at=None if at is None else str(at), by=by,
            top=top, depth=depth, empty_cache_every=empty_cache_every,
            empty_cache_at=list(empty_cache_at or []),
            no_recorded_empty_cache=no_recorded_empty_cache, jobs=jobs,
            pytorch_version=pytorch_version,
        )
        return _answer("blame", outcome, verbose)
    call = _Call("blame")
    call.source(trace)
    call.flags(
        policy=_policy_list(policies), device=device, capacity=_size("capacity", capacity),
        empty_cache_every=empty_cache_every,
        empty_cache_at=None if empty_cache_at is None else ",".join(map(str, empty_cache_at)),
        no_recorded_empty_cache=no_recorded_empty_cache, at=at, by=by, top=top, depth=depth,
        flamegraph=flamegraph, jobs=jobs, max_input_size=_size("max_input_size", max_input_size),
        pytorch_version=pytorch_version,
    )
    return _json("blame", call, verbose, "--format=json")


@_suggesting
def diff(
    a: TraceLike,
    b: Optional[TraceLike] = None,
    *,
    policies: Optional[Policies] = None,
    device: Optional[int] = None,
    by: Optional[str] = None,
    top: Optional[int] = None,
    depth: Optional[int] = None,
    out: Optional[PathLike] = None,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim diff A [B] --format json``: two runs side by side, both peaks, the deltas and
    the live bytes by site at each run's peak-live moment. Without ``b``, ``a`` under two
    policies (``policies=[X, Y]``).

    :param by: how to group sites (as :func:`blame`).
    :param top: the sites shown (0: all).
    :param out: also write the charts and an HTML page in this folder.
    :param pytorch_version: a what-if: every PyTorch policy models this release. With one trace
        and one policy (or none: ``pytorch``), A is the policy as recorded and B the same under
        this release: what upgrading PyTorch does to the run.
    """
    if out is None:
        on_a = _on(a, device, max_input_size)
        on_b = None if b is None else _on(b, device, max_input_size, taken=[on_a])
        outcome = _native.diff(
            on_a, on_b, policies=_policy_list(policies) or [], by=by, top=top, depth=depth,
            jobs=jobs, pytorch_version=pytorch_version,
        )
        return _answer("diff", outcome, verbose)
    call = _Call("diff")
    call.source(a)
    if b is not None:
        call.source(b)
    call.flags(policy=_policy_list(policies), device=device, by=by, top=top, depth=depth,
               out=out, jobs=jobs, max_input_size=_size("max_input_size", max_input_size),
               pytorch_version=pytorch_version)
    return _json("diff", call, verbose, "--format=json")


@_suggesting
def explain(
    trace: TraceLike,
    *,
    at: Optional[Union[str, int]] = None,
    capacity: Optional[Capacity] = None,
    policy: Optional[PolicyLike] = None,
    device: Optional[int] = None,
    top: Optional[int] = None,
    no_fixes: bool = False,
    empty_cache_every: Optional[int] = None,
    empty_cache_at: Optional[Sequence[int]] = None,
    no_recorded_empty_cache: bool = False,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Result:
    """``fragsim explain TRACE --format json``: why the peak is what it is: the verdict, the
    kinds of free memory, the fixes.

    :param at: ``"oom"`` (the first OOM), ``"peak"`` or an event index; default: the OOM where
        there is one, else the peak.
    :param capacity: as for :func:`replay`.
    :param policy: the policy replayed (default ``pytorch``).
    :param device: the device to replay.
    :param top: the live sites and stranded segments listed (default 10; 0: all).
    :param no_fixes: skip the replays of the fixes (``result["fixes"]`` is empty).
    :param empty_cache_every: as for :func:`replay`.
    :param empty_cache_at: as for :func:`replay`.
    :param no_recorded_empty_cache: as for :func:`replay`.
    :param jobs: the fixes replayed in parallel.
    :param max_input_size: the most bytes the trace may hold.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    :param verbose: print the command's notes on stderr.
    """
    outcome = _native.explain(
        _on(trace, device, max_input_size),
        policy=None if policy is None else _policy_text(policy),
        at=None if at is None else str(at), capacity=_size("capacity", capacity), top=top,
        fixes=not no_fixes, empty_cache_every=empty_cache_every,
        empty_cache_at=list(empty_cache_at or []),
        no_recorded_empty_cache=no_recorded_empty_cache, jobs=jobs,
        pytorch_version=pytorch_version,
    )
    return _answer("explain", outcome, verbose)


@_suggesting
def convert(input: TraceLike, output: PathLike, *, max_input_size: Optional[Size] = None,
            verbose: bool = False) -> Path:
    """``fragsim convert IN OUT``: the output format follows OUT's extension (``.fst``,
    ``.pickle``, ``.json``, ``.txt``). Returns OUT."""
    outcome = _native.convert(_on(input, max_input_size=max_input_size), output=os.fspath(output))
    _answer("convert", outcome, verbose)
    return Path(output)


@_suggesting
def synth(
    out: PathLike,
    *,
    layers: Optional[int] = None,
    hidden: Optional[int] = None,
    heads: Optional[int] = None,
    vocab: Optional[int] = None,
    seq: Optional[int] = None,
    batch: Optional[int] = None,
    steps: Optional[int] = None,
    mixed_precision: bool = False,
    grad_accum: Optional[int] = None,
    checkpointing: bool = False,
    vary_seq: Optional[str] = None,
    seed: Optional[int] = None,
    streams: Optional[int] = None,
    verbose: bool = False,
) -> Path:
    """``fragsim synth OUT``: writes a synthetic transformer training trace (defaults: 4 layers,
    hidden 512, 8 heads, vocab 50257, seq 256, batch 8, 3 steps). ``vary_seq="MIN:MAX"`` varies
    the sequence length per step. Returns OUT."""
    call = _Call("synth")
    call.argv.append(os.fspath(out))
    call.flags(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, batch=batch,
               steps=steps, mixed_precision=mixed_precision, grad_accum=grad_accum,
               checkpointing=checkpointing, vary_seq=vary_seq, seed=seed, streams=streams)
    call.run(verbose)
    return Path(out)


@_suggesting
def report(
    trace: TraceLike,
    *,
    out: PathLike,
    policies: Optional[Policies] = None,
    device: Optional[int] = None,
    capacity: Optional[Capacity] = None,
    empty_cache_every: Optional[int] = None,
    empty_cache_at: Optional[Sequence[int]] = None,
    no_recorded_empty_cache: bool = False,
    segment_map_policy: Optional[str] = None,
    jobs: Optional[int] = None,
    max_input_size: Optional[Size] = None,
    pytorch_version: Optional[str] = None,
    verbose: bool = False,
) -> Dict[str, Path]:
    """``fragsim report TRACE --out DIR``: charts, tables and an index.html. Returns the files
    it wrote, by name (``paths["index.html"]``, ``paths["peaks.svg"]``, ...).

    :param segment_map_policy: the policy whose segment map is drawn.
    :param pytorch_version: a what-if: every PyTorch policy models this release (``"2.8"``),
        as ``version=`` in its spec does (default: the release the recording shows).
    """
    started = time.time() - 1.0
    outcome = _native.report(
        _on(trace, device, max_input_size), out=os.fspath(out),
        policies=_policy_list(policies) or [], capacity=_size("capacity", capacity),
        empty_cache_every=empty_cache_every, empty_cache_at=list(empty_cache_at or []),
        no_recorded_empty_cache=no_recorded_empty_cache, segment_map_policy=segment_map_policy,
        jobs=jobs, pytorch_version=pytorch_version,
    )
    _answer("report", outcome, verbose)
    folder = Path(out)
    return {
        p.name: p
        for p in sorted(folder.iterdir())
        if p.is_file() and p.stat().st_mtime >= started
    }


# ---------------------------------------------------------------------------------------------
# A trace loaded once.


class Trace:
    """A trace read once (from :func:`load`): every method asks it one question, on the same
    loaded trace, and returns what the function of the same name returns.

    ``name`` is what results call it (the path, or ``<dict>``/``<bytes>``/``<file>``);
    ``device`` the device its methods replay unless told otherwise; ``max_input_size`` the most
    bytes it may hold when it is read (``None``: the default, 4 GiB).
    """

    def __init__(self, native: Any, name: str, kind: str, device: Optional[int],
                 max_input_size: Optional[Size] = None) -> None:
        self._native = native
        self.name = name
        self.kind = kind
        self.device = device
        self.max_input_size = max_input_size
        self._info: Optional[Result] = None

    def __repr__(self) -> str:
        device = "" if self.device is None else f", device={self.device}"
        return f"fragsim.Trace({self.name!r}{device})"

    def _device(self, device: Optional[int]) -> Optional[int]:
        return self.device if device is None else device

    @property
    def info(self) -> Result:
        """What the trace holds (``fragsim info``), read once."""
        if self._info is None:
            self._info = info(self)
        return self._info

    @_suggesting
    def replay(
        self,
        *,
        policies: Optional[Policies] = None,
        device: Optional[int] = None,
        capacity: Optional[Capacity] = None,
        empty_cache_every: Optional[int] = None,
        empty_cache_at: Optional[Sequence[int]] = None,
        no_recorded_empty_cache: bool = False,
        outside: Optional[Size] = None,
        backend: Optional[str] = None,
        cuda_device: Optional[int] = None,
        touch: bool = False,
        export_snapshot: Optional[PathLike] = None,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """Replays the trace against each policy: :func:`fragsim.replay`'s parameters."""
        return replay(
            self, policies=policies, device=self._device(device), capacity=capacity,
            empty_cache_every=empty_cache_every, empty_cache_at=empty_cache_at,
            no_recorded_empty_cache=no_recorded_empty_cache, outside=outside, backend=backend,
            cuda_device=cuda_device, touch=touch, export_snapshot=export_snapshot, jobs=jobs,
            pytorch_version=pytorch_version, verbose=verbose,
        )

    @_suggesting
    def explain(
        self,
        *,
        at: Optional[Union[str, int]] = None,
        capacity: Optional[Capacity] = None,
        policy: Optional[PolicyLike] = None,
        device: Optional[int] = None,
        top: Optional[int] = None,
        no_fixes: bool = False,
        empty_cache_every: Optional[int] = None,
        empty_cache_at: Optional[Sequence[int]] = None,
        no_recorded_empty_cache: bool = False,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """Why the peak is what it is: :func:`fragsim.explain`'s parameters."""
        return explain(
            self, at=at, capacity=capacity, policy=policy, device=self._device(device), top=top,
            no_fixes=no_fixes, empty_cache_every=empty_cache_every,
            empty_cache_at=empty_cache_at, no_recorded_empty_cache=no_recorded_empty_cache,
            jobs=jobs, pytorch_version=pytorch_version, verbose=verbose,
        )

    @_suggesting
    def blame(
        self,
        *,
        policies: Optional[Policies] = None,
        device: Optional[int] = None,
        capacity: Optional[Capacity] = None,
        at: Optional[Union[str, int]] = None,
        by: Optional[str] = None,
        top: Optional[int] = None,
        depth: Optional[int] = None,
        empty_cache_every: Optional[int] = None,
        empty_cache_at: Optional[Sequence[int]] = None,
        no_recorded_empty_cache: bool = False,
        flamegraph: Optional[PathLike] = None,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """Who holds the memory at a moment: :func:`fragsim.blame`'s parameters."""
        return blame(
            self, policies=policies, device=self._device(device), capacity=capacity, at=at,
            by=by, top=top, depth=depth, empty_cache_every=empty_cache_every,
            empty_cache_at=empty_cache_at, no_recorded_empty_cache=no_recorded_empty_cache,
            flamegraph=flamegraph, jobs=jobs, pytorch_version=pytorch_version, verbose=verbose,
        )

    @_suggesting
    def diff(
        self,
        other: Optional[TraceLike] = None,
        *,
        policies: Optional[Policies] = None,
        device: Optional[int] = None,
        by: Optional[str] = None,
        top: Optional[int] = None,
        depth: Optional[int] = None,
        out: Optional[PathLike] = None,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """This trace (A) against ``other`` (B), or under two policies without ``other``:
        :func:`fragsim.diff`'s parameters."""
        return diff(self, other, policies=policies, device=self._device(device), by=by,
                    top=top, depth=depth, out=out, jobs=jobs, pytorch_version=pytorch_version,
                    verbose=verbose)

    @_suggesting
    def fit(
        self,
        *,
        policies: Optional[Policies] = None,
        device: Optional[int] = None,
        outside: Optional[Size] = None,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """The least memory each policy needs: :func:`fragsim.fit`'s parameters."""
        return fit(self, policies=policies, device=self._device(device), outside=outside,
                   jobs=jobs, pytorch_version=pytorch_version, verbose=verbose)

    @_suggesting
    def sweep(
        self,
        *,
        policies: Optional[Policies] = None,
        objective: Optional[str] = None,
        device: Optional[int] = None,
        capacity: Optional[Capacity] = None,
        shard: Optional[str] = None,
        out: Optional[PathLike] = None,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """The best setting of a grid (the built-in one by default): :func:`fragsim.sweep`'s
        parameters."""
        return sweep(self, policies=policies, objective=objective,
                     device=self._device(device), capacity=capacity, shard=shard, out=out,
                     jobs=jobs, pytorch_version=pytorch_version, verbose=verbose)

    @_suggesting
    def check(
        self,
        *,
        baseline: PathLike,
        tolerance: Optional[float] = None,
        policies: Optional[Policies] = None,
        device: Optional[int] = None,
        capacity: Optional[Capacity] = None,
        update: bool = False,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Result:
        """Compares with a baseline: :func:`fragsim.check`'s parameters."""
        return check(self, baseline=baseline, tolerance=tolerance, policies=policies,
                     device=self._device(device), capacity=capacity, update=update, jobs=jobs,
                     pytorch_version=pytorch_version, verbose=verbose)

    @_suggesting
    def validate(
        self,
        *,
        device: Optional[int] = None,
        gpu_mem: Optional[Size] = None,
        pytorch_version: Optional[str] = None,
        policy: Optional[PolicyLike] = None,
        export_snapshot: Optional[PathLike] = None,
        verbose: bool = False,
    ) -> Result:
        """The PyTorch policy against the recording: :func:`fragsim.validate`'s parameters."""
        return validate(self, device=self._device(device), gpu_mem=gpu_mem,
                        pytorch_version=pytorch_version, policy=policy,
                        export_snapshot=export_snapshot, verbose=verbose)

    @_suggesting
    def report(
        self,
        out: PathLike,
        *,
        policies: Optional[Policies] = None,
        device: Optional[int] = None,
        capacity: Optional[Capacity] = None,
        empty_cache_every: Optional[int] = None,
        empty_cache_at: Optional[Sequence[int]] = None,
        no_recorded_empty_cache: bool = False,
        segment_map_policy: Optional[str] = None,
        jobs: Optional[int] = None,
        pytorch_version: Optional[str] = None,
        verbose: bool = False,
    ) -> Dict[str, Path]:
        """Charts, tables and an index.html in ``out``: :func:`fragsim.report`'s parameters."""
        return report(
            self, out=out, policies=policies, device=self._device(device), capacity=capacity,
            empty_cache_every=empty_cache_every, empty_cache_at=empty_cache_at,
            no_recorded_empty_cache=no_recorded_empty_cache,
            segment_map_policy=segment_map_policy, jobs=jobs, pytorch_version=pytorch_version,
            verbose=verbose,
        )

    @_suggesting
    def export(self, out: PathLike, *, verbose: bool = False) -> Path:
        """Writes the trace to ``out`` in the format its extension names (``.fst``,
        ``.pickle``, ...): :func:`fragsim.convert`. Returns ``out``."""
        return convert(self, out, verbose=verbose)


@_suggesting
def load(trace: TraceLike, *, device: Optional[int] = None,
         max_input_size: Optional[Size] = None) -> Trace:
    """Loads a trace once for several questions: a path, ``bytes``, a binary file object, or
    the dict ``torch.cuda.memory._snapshot()`` returns. Nothing is read until the first
    question; each later one reuses what the first read (a snapshot dict is converted once).

    :param device: the device every method replays unless told otherwise.
    :param max_input_size: the most bytes the trace may hold (default 4 GiB; ``"8GiB"`` or an
        int), for every question asked of it.
    """
    _size("max_input_size", max_input_size)
    if isinstance(trace, Trace):
        if device is None and max_input_size is None:
            return trace
        return Trace(trace._native, trace.name, trace.kind, trace._device(device),
                     trace.max_input_size if max_input_size is None else max_input_size)
    if isinstance(trace, (str, os.PathLike)):
        path = os.fspath(trace)
        return Trace(_native.Loaded(path), path, "path", device, max_input_size)
    kind, held = _held(trace)
    return Trace(_native.Loaded(held), f"<{kind}>", kind, device, max_input_size)

