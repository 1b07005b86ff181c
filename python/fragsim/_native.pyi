"""The extension module: the Rust crate's command line, and the questions the library's session
answers directly (see ``python/src/lib.rs`` and ``python/src/ask.rs``)."""

from typing import Any, List, Optional, Sequence, Tuple

_ErrorInfo = Tuple[str, str, Optional[str], Optional[str], Optional[str], str]

def main(argv: Sequence[str]) -> int:
    """Runs the command line on the process's stdout and stderr; returns the exit code."""

def call(
    argv: Sequence[str], memory: List[Tuple[str, Any]], progress: bool
) -> Tuple[int, str, str, Optional[_ErrorInfo]]:
    """Runs the command line with its output captured and traces from memory."""

_Answer = Tuple[int, Optional[str], List[str], Optional[_ErrorInfo]]

class On:
    """What a question is about: a loaded trace, its name in answers, the device, the read
    limit, and whether it is read for this question alone."""

    name: str
    def __init__(
        self, trace: "Loaded", name: str, *, device: Optional[int] = None,
        max_input_size: Optional[str] = None, once: bool = False,
    ) -> None: ...
    def same_trace(self, other: "On") -> bool:
        """Whether ``other`` is about the very same trace object."""

def info(on: On) -> _Answer:
    """What the trace holds: the JSON ``info --json`` prints."""

def replay(
    on: On, *, policies: Sequence[str], capacity: Optional[str] = None,
    empty_cache_every: Optional[int] = None, empty_cache_at: Sequence[int] = (),
    no_recorded_empty_cache: bool = False, outside: Optional[str] = None,
    jobs: Optional[int] = None, pytorch_version: Optional[str] = None,
) -> _Answer:
    """The session's replay of each policy: exit code, the JSON ``replay --json`` prints, the
    notes, the error."""

def explain(
    on: On, *, policy: Optional[str] = None, at: Optional[str] = None,
    capacity: Optional[str] = None, top: Optional[int] = None, fixes: bool = True,
    empty_cache_every: Optional[int] = None, empty_cache_at: Sequence[int] = (),
    no_recorded_empty_cache: bool = False, jobs: Optional[int] = None,
    pytorch_version: Optional[str] = None,
) -> _Answer:
    """The session's explanation: the JSON ``explain --format json`` prints."""

def fit(
    on: On, *, policies: Sequence[str], outside: Optional[str] = None,
    jobs: Optional[int] = None, pytorch_version: Optional[str] = None,
) -> _Answer:
    """The session's fit of each policy: the JSON ``fit --json`` prints."""

def blame(
    on: On, *, policies: Sequence[str], capacity: Optional[str] = None,
    at: Optional[str] = None, by: Optional[str] = None, top: Optional[int] = None,
    depth: Optional[int] = None, empty_cache_every: Optional[int] = None,
    empty_cache_at: Sequence[int] = (), no_recorded_empty_cache: bool = False,
    jobs: Optional[int] = None, pytorch_version: Optional[str] = None,
) -> _Answer:
    """The session's blame at a moment of each policy's replay: the JSON ``blame --format
    json`` prints."""

def diff(
    a: On, b: Optional[On] = None, *, policies: Sequence[str], by: Optional[str] = None,
    top: Optional[int] = None, depth: Optional[int] = None, jobs: Optional[int] = None,
    pytorch_version: Optional[str] = None,
) -> _Answer:
    """The session's diff of two runs: the JSON ``diff --format json`` prints."""

def sweep(
    traces: Sequence[On], *, policies: Sequence[str], objective: Optional[str] = None,
    capacity: Optional[str] = None, jobs: Optional[int] = None,
    pytorch_version: Optional[str] = None,
) -> _Answer:
    """The sessions' sweep of a grid of configs: the JSON ``sweep --json`` prints."""

def check(
    traces: Sequence[On], *, baseline: str, policies: Sequence[str],
    tolerance: Optional[str] = None, capacity: Optional[str] = None, jobs: Optional[int] = None,
    pytorch_version: Optional[str] = None,
) -> _Answer:
    """The sessions' check against a baseline: exit code 1 on a regression, the JSON ``check
    --json`` prints."""

def report(
    on: On, *, out: str, policies: Sequence[str], capacity: Optional[str] = None,
    empty_cache_every: Optional[int] = None, empty_cache_at: Sequence[int] = (),
    no_recorded_empty_cache: bool = False, segment_map_policy: Optional[str] = None,
    jobs: Optional[int] = None, pytorch_version: Optional[str] = None,
) -> _Answer:
    """Writes the session's report into ``out``: the answer's JSON is ``{}``."""

def convert(on: On, *, output: str) -> _Answer:
    """Writes the trace to ``output`` in the format its extension names: the answer's JSON is
    ``{}``."""

def merge(parts: Sequence[str], *, max_input_size: Optional[str] = None) -> _Answer:
    """The parts of a sharded sweep merged: the JSON ``merge --json`` prints."""

def validate(
    on: On, *, gpu_mem: Optional[str] = None, pytorch_version: Optional[str] = None,
    policy: Optional[str] = None,
) -> _Answer:
    """The session's validation: exit code 1 where a decision differs, the JSON ``validate
    --json`` prints."""

def version() -> str:
    """The version of the Rust crate the module was built from."""

def convert_only(obj: Any, keep_frames: bool = False) -> float:
    """Seconds to read a snapshot path, or to convert a snapshot dict, into a trace, keeping
    stack frames or not."""

def commands() -> List[str]:
    """The names of the command line's commands."""

class Loaded:
    """A trace held for the commands that read it (a path, bytes or a snapshot dict), read
    once per kind (with stack frames, without)."""

    def __init__(self, source: Any) -> None: ...
    @property
    def read(self) -> bool:
        """Whether a command has read the trace yet."""
