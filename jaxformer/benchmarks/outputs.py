"""Where a benchmark writes: each output path checked, and its directory created, before anything is measured.

A bad path is refused in one line naming the flag (``ValueError``: exit status 2), so no measurement is
thrown away at the end for want of a place to put it.
"""

from __future__ import annotations

import os
from pathlib import Path


def output_file(path: str | Path | None, flag: str) -> Path | None:
    """``path`` (None or empty: not asked for) as a `Path` whose directory exists, created here if need be;
    ``ValueError`` naming ``flag`` when ``path`` is a directory or its directory cannot be made or written."""
    if not path:
        return None
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory, not a file name")
    _make_directory(path.parent, flag, path)
    return path


def output_directory(path: str | Path | None, flag: str) -> Path | None:
    """``path`` (None or empty: not asked for) as a directory that exists, created here if need be;
    ``ValueError`` naming ``flag`` when it is a file or cannot be made or written."""
    if not path:
        return None
    path = Path(path)
    _make_directory(path, flag, path)
    return path


def _make_directory(directory: Path, flag: str, path: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{flag} {path}: {directory} is a file, not a directory") from None
    except OSError as error:
        raise ValueError(f"{flag} {path}: cannot create the directory {directory}: {error.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the directory {directory} is not writable")
