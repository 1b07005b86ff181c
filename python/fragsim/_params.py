"""Every parameter's value checked, by the parameter's name, before a command sees it: one table
for every function and method, so a bad value is a :class:`UsageError` in fragsim's words that
names the parameter (``top=-1: expected a count, 0 or more``), never a conversion error of the
native module (``OverflowError``, ``TypeError: ... cannot be converted``) nor the command line's
usage text. Ints are Python's, of any size (or anything with ``__index__``, such as numpy's);
one out of range is refused here, not wrapped or truncated."""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Dict, List, Optional

from ._errors import UsageError

#: The largest count, event index or seed the native module takes (a 64-bit unsigned int).
U64_MAX = 2**64 - 1

#: The largest device number (a 32-bit signed int; -1 is host memory).
DEVICE_MAX = 2**31 - 1


def _shown(value: Any) -> str:
    # An int as written; anything else as Python shows it ('0' is a string, not the number).
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def _refuse(name: str, value: Any, expected: str) -> UsageError:
    return UsageError(f"{name}={_shown(value)}: expected {expected}")


def _int(name: str, value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise _refuse(name, value, f"{what}, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise _refuse(name, value, f"{what}, not {type(value).__name__}") from None
    if number < low:
        raise _refuse(name, number, f"{what}, {low} or more")
    if number > high:
        raise _refuse(name, number, f"{what}, at most {high}")
    return number


def count(name: str, value: Any) -> int:
    """A count (``top``, ``depth``, ``jobs``, synth's sizes): an int, 0 or more."""
    return _int(name, value, "a count", 0, U64_MAX)


def index(name: str, value: Any) -> int:
    """An event index or an event count (``empty_cache_every``): an int, 0 or more."""
    return _int(name, value, "an event index", 0, U64_MAX)


def device(name: str, value: Any) -> int:
    """A device number: -1 (host memory) or a CUDA device, 0 or more."""
    return _int(name, value, "a device number", -1, DEVICE_MAX)


def indices(name: str, value: Any) -> List[int]:
    """Event indices (``empty_cache_at``): a list (any iterable) of ints, each 0 or more; an
    item out of range is named by its place (``empty_cache_at[1]=-1``)."""
    if isinstance(value, (str, bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise _refuse(name, value, f"a list of event indices, not {type(value).__name__}")
    return [index(f"{name}[{i}]", v) for i, v in enumerate(value)]


def text(name: str, value: Any) -> str:
    """A string parameter (``by``, ``objective``, ``shard``, ``pytorch_version``, ...)."""
    if not isinstance(value, str):
        raise _refuse(name, value, f"a string, not {type(value).__name__}")
    return value


def moment(name: str, value: Any) -> str:
    """``at``: a moment's name (``"peak"``) or an event index as an int."""
    if isinstance(value, str):
        return value
    return str(_int(name, value, "a moment (peak, oom, ...) or an event index", 0, U64_MAX))


def flag(name: str, value: Any) -> bool:
    """A switch: ``True`` or ``False``."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy's
        return bool(value)
    raise _refuse(name, value, f"True or False, not {type(value).__name__}")


def path(name: str, value: Any) -> str:
    """A file or folder: a ``str`` or an ``os.PathLike`` of one."""
    if isinstance(value, (str, os.PathLike)):
        p = os.fspath(value)
        if isinstance(p, str):
            return p
    raise _refuse(name, value, f"a path (str or os.PathLike), not {type(value).__name__}")


def paths(name: str, value: Any) -> Any:
    """One path or a list of them (``merge``'s parts)."""
    if isinstance(value, (str, os.PathLike)):
        return path(name, value)
    if isinstance(value, (bytes, bytearray)) or not hasattr(value, "__iter__"):
        raise _refuse(name, value, f"a path or a list of paths, not {type(value).__name__}")
    return [path(f"{name}[{i}]", v) for i, v in enumerate(value)]


def size(name: str, value: Any) -> str:
    """A size: an int of bytes (of any size: fragsim says if it is too large) or a string
    fragsim reads (``"40GiB"``, ``"a100-40gb"``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise _refuse(name, value, "an int of bytes or a string such as '40GiB', not a bool")
    try:
        return str(operator.index(value))
    except TypeError:
        raise _refuse(
            name, value, f"an int of bytes or a string such as '40GiB', not {type(value).__name__}"
        ) from None


def percent(name: str, value: Any) -> str:
    """A percentage (``tolerance``): an int, a float or a string."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _refuse(name, value, f"a percentage (a number), not {type(value).__name__}")
    return str(value)


#: Each parameter's check, by its name: the same name means the same kind of value in every
#: function and method.
CHECKS: Dict[str, Callable[[str, Any], Any]] = {
    **{n: count for n in ("top", "depth", "jobs", "cuda_device", "layers", "hidden", "heads",
                          "vocab", "seq", "batch", "steps", "grad_accum", "seed", "streams")},
    "empty_cache_every": index,
    "empty_cache_at": indices,
    "device": device,
    "at": moment,
    **{n: text for n in ("by", "objective", "shard", "backend", "segment_map_policy",
                         "pytorch_version", "vary_seq")},
    **{n: flag for n in ("no_recorded_empty_cache", "touch", "update", "no_fixes", "verbose",
                         "mixed_precision", "checkpointing")},
    **{n: path for n in ("baseline", "out", "output", "export_snapshot", "flamegraph")},
    "parts": paths,
    **{n: size for n in ("capacity", "outside", "gpu_mem", "max_input_size")},
    "tolerance": percent,
}


def checked(name: str, value: Optional[Any]) -> Any:
    """``value`` as parameter ``name`` takes it (``None``: not given, as it is)."""
    check = CHECKS.get(name)
    if value is None or check is None:
        return value
    return check(name, value)
