"""Writing files so that a reader never sees half of one: a temporary file in the same directory, then a rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Calls ``write(handle)`` on a temporary file beside ``path``, then renames it over ``path``.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
        os.chmod(temporary, 0o644)  # mkstemp creates 0600
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    write_atomically(path, lambda handle: handle.write(payload))


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: Path, payload: object, *, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(payload, indent=indent) + "\n")


def load_json(path: Path) -> object:
    """The JSON value in ``path``; a missing, binary or malformed file raises one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8), so not JSON") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None


def load_jsonl(path: Path) -> list[object]:
    """One JSON value per non-blank line of ``path``; a bad line raises one line naming the file and its number."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8), so not JSON lines") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
    return records


def read_cache(path: Path) -> dict:
    """A per-machine cache file's entries (the matmul peak, kernel choices); {} when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_cache(path: Path, cache: dict) -> None:
    """Writes a per-machine cache file; an unwritable cache is skipped (it only costs a later process a re-measure)."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(path), cache)
    except OSError:
        pass
