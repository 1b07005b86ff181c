"""fragsim: replay GPU allocation traces (PyTorch memory snapshots, Kineto traces, RMM logs)
against allocator policies and measure peak reserved memory and fragmentation.

Every command of the ``fragsim`` command line is a function of the same name taking its options
as keyword arguments and returning what ``--format json`` prints::

    import fragsim, torch
    r = fragsim.replay(torch.cuda.memory._snapshot(), policies=["all"])
    r["results"][0]["peak_reserved_bytes"]
    r.to_pandas()

A trace is a path, ``bytes``, a binary file object or a snapshot dict. Errors raise
:class:`TraceError` (a ``ValueError`` with ``file``, ``format`` and ``place``) or
:class:`UsageError`. The contract is ``docs/interface.md``.
"""

from . import _native
from ._api import (
    TraceLike,
    _json_command,
    check,
    convert,
    fit,
    info,
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
    "FragsimError",
    "InternalError",
    "Result",
    "TraceError",
    "TraceLike",
    "UsageError",
    "check",
    "convert",
    "fit",
    "info",
    "merge",
    "replay",
    "report",
    "sweep",
    "synth",
    "validate",
]

# Commands this build's command line has beyond the ones above (blame, diff), each a function of
# the same name and shape.
for _name in _native.commands():
    if _name not in globals() and _name.isidentifier():
        globals()[_name] = _json_command(_name)
        __all__.append(_name)
