"""The build backend `pip install .` runs: maturin's, after one check.

Without `cargo` on PATH, maturin would quietly download and install a Rust toolchain (about 1 GB)
into a temporary folder before compiling. This backend stops first and says what to do instead;
`FRAGSIM_ALLOW_RUST_DOWNLOAD=1` lets maturin go ahead as it would.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional

import maturin

MESSAGE = (
    "fragsim: building the Python package compiles its Rust crate (about 6 minutes on 2 cores), "
    "and there is no `cargo` on PATH. Install Rust >= 1.85 first "
    "(https://rustup.rs: curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh), "
    "then run pip install again; or set FRAGSIM_ALLOW_RUST_DOWNLOAD=1 to let maturin download "
    "a temporary Rust toolchain (about 1 GB) for this build."
)


def _need_cargo() -> None:
    if shutil.which("cargo") is None and not os.environ.get("FRAGSIM_ALLOW_RUST_DOWNLOAD"):
        raise RuntimeError(MESSAGE)
    if os.environ.get("FRAGSIM_ALLOW_RUST_DOWNLOAD") is None:
        # maturin's own fallback stays off: the check above is the one answer.
        os.environ.setdefault("MATURIN_NO_INSTALL_RUST", "1")


Settings = Optional[Dict[str, Any]]


def get_requires_for_build_wheel(config_settings: Settings = None) -> List[str]:
    _need_cargo()
    return list(maturin.get_requires_for_build_wheel(config_settings))


def get_requires_for_build_editable(config_settings: Settings = None) -> List[str]:
    _need_cargo()
    return list(maturin.get_requires_for_build_editable(config_settings))


def get_requires_for_build_sdist(config_settings: Settings = None) -> List[str]:
    return list(maturin.get_requires_for_build_sdist(config_settings))


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Settings = None) -> str:
    _need_cargo()
    return str(maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings))


def prepare_metadata_for_build_editable(metadata_directory: str,
                                        config_settings: Settings = None) -> str:
    _need_cargo()
    return str(maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings))


def build_wheel(wheel_directory: str, config_settings: Settings = None,
                metadata_directory: Optional[str] = None) -> str:
    _need_cargo()
    return str(maturin.build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(wheel_directory: str, config_settings: Settings = None,
                   metadata_directory: Optional[str] = None) -> str:
    _need_cargo()
    return str(maturin.build_editable(wheel_directory, config_settings, metadata_directory))


def build_sdist(sdist_directory: str, config_settings: Settings = None) -> str:
    return str(maturin.build_sdist(sdist_directory, config_settings))
