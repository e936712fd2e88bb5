"""The environment of a measurement, recorded with every benchmark's figures (machines of one kind differ)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from jaxformer.train.peak import cpu_model

ROOT = Path(__file__).resolve().parents[2]


def package_version(package: str) -> str | None:
    """The installed version of ``package``; None if it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(ROOT), "log", "--oneline", "-1"], capture_output=True, text=True,
                                timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    line = result.stdout.strip()[:100]
    return (line + (" (with uncommitted changes)" if dirty else "")) if result.returncode == 0 and line else None


def environment() -> dict:
    """The machine and software a figure was measured on: `lscpu`'s CPU model, cores, date, versions, the
    repository's commit, and the variables that change the speed (the tuned environment's)."""
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "date": datetime.datetime.now().astimezone().isoformat(
        timespec="seconds"), "python": platform.python_version(), "jax_version": package_version("jax"),
        "jaxlib_version": package_version("jaxlib"), "torch_version": package_version("torch"), "commit": _commit(),
        "variables": {name: os.environ.get(name, "") for name in ("GLIBC_TUNABLES", "XLA_FLAGS")}}
