"""fragsim: replay GPU allocation traces (PyTorch memory snapshots, Kineto traces, RMM logs)
against allocator policies and measure peak reserved memory and fragmentation.

Load a trace once, then ask it questions; each answer is what the command of the same name
prints with ``--format json``, as a ``dict``::

    import fragsim, torch
    t = fragsim.load(torch.cuda.memory._snapshot())   # or a path, bytes, a binary file object
    r = t.replay(policies=["pytorch", "pytorch-expandable"], capacity="a100-40gb")
    r["results"][0]["peak_reserved_bytes"]
    r.to_pandas()

Every command is also a function taking the trace first (``fragsim.replay(trace, ...)``), with
the same typed keyword parameters. Errors raise :class:`TraceError` (a ``ValueError`` with
``file``, ``format`` and ``place``) or :class:`UsageError`. The contract is
``docs/interface.md``.
"""

from . import _native as _native
from ._api import (
    Capacity,
    Policies,
    PolicyLike,
    Size,
    Trace,
    TraceLike,
    blame,
    check,
    convert,
    diff,
    explain,
    fit,
    info,
    load,
    merge,
    replay,
    report,
    sweep,
    synth,
    validate,
)
from ._errors import BackendError, FragsimError, InternalError, TraceError, UsageError
from ._native import version as _version
from ._result import Result

__version__: str = _version()

__all__ = [
    "BackendError",
    "Capacity",
    "FragsimError",
    "InternalError",
    "PolicyLike",
    "Policies",
    "Result",
    "Size",
    "Trace",
    "TraceError",
    "TraceLike",
    "UsageError",
    "blame",
    "check",
    "convert",
    "diff",
    "explain",
    "fit",
    "info",
    "load",
    "merge",
    "replay",
    "report",
    "sweep",
    "synth",
    "validate",
]
