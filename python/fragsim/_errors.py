"""The exceptions fragsim raises: one per exit code of the command line."""

from __future__ import annotations

from typing import Optional


class FragsimError(Exception):
    """Any failure of a fragsim command; ``exit_code`` is what the command line exits with."""

    exit_code: int = 2

    def __init__(self, message: str, *, line: Optional[str] = None) -> None:
        super().__init__(line if line is not None else message)
        #: The message without the file, format and place.
        self.message = message


class UsageError(FragsimError, ValueError):
    """A bad option value (exit code 2): a bad size, an unknown policy, a value a parameter does
    not take."""


class TraceError(FragsimError, ValueError):
    """A trace (or another input, such as a baseline) that is unreadable, malformed or unsupported
    (exit code 2).

    ``file`` names it (a path, or ``<dict>``/``<bytes>``/``<file>`` for one from memory),
    ``format`` the format it was read as, and ``place`` where inside it: ``byte N``, ``line N``,
    ``event N``, or for a snapshot dict the key path (``segments[3].blocks[0]``).
    """

    def __init__(
        self,
        message: str,
        *,
        file: Optional[str] = None,
        format: Optional[str] = None,
        place: Optional[str] = None,
        line: Optional[str] = None,
    ) -> None:
        super().__init__(message, line=line)
        self.file = file
        self.format = format
        self.place = place


class BackendError(FragsimError, RuntimeError):
    """A memory backend failed (exit code 3): no CUDA driver, a device error."""

    exit_code = 3


class InternalError(FragsimError, RuntimeError):
    """A bug in fragsim (a Rust panic, caught before it reached Python)."""

    exit_code = 101


def raise_for(kind: str, message: str, file, format, place, line: str) -> None:
    """Raises the exception for an error the native module reported."""
    if kind == "usage":
        raise UsageError(message, line=line)
    if kind in ("input", "io"):
        raise TraceError(message, file=file, format=format, place=place, line=line)
    if kind == "backend":
        raise BackendError(message, line=line)
    raise InternalError(message, line=line)
