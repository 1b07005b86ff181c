"""The ``fragsim`` command the package installs: the command line of the Rust crate, run by the
same code as its binary (same flags, output and exit codes)."""

from __future__ import annotations

import signal
import sys

from . import _native


def main() -> None:
    """Runs ``fragsim`` with this process's arguments and exits with its exit code."""
    # Ctrl-C ends the command as it ends the binary (the cuda backend installs its own handler
    # to give device memory back first), not with a Python traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_native.main(["fragsim", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
