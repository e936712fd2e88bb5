"""Writing files so that a reader never sees half of one: a temporary file in the same directory, then a rename
(`write_all_atomic`: all of several files, or none)."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

# what a path the user gave can be wrong with: missing, a file where a directory goes or the reverse, not permitted
# (bad input, exit 2; another OSError, a full disk say, is the machine's: exit 1)
PATH_ERRORS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.EROFS,
               errno.ENAMETOOLONG, errno.ENOTEMPTY}


def is_input_error(error: OSError) -> bool:
    """Whether ``error`` is the user's input (exit 2): a path of `PATH_ERRORS`, or no errno (a message of our
    own); otherwise the machine's (exit 1)."""
    return error.errno is None or error.errno in PATH_ERRORS


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Calls ``write(handle)`` on a temporary file beside ``path``, then renames it over ``path``.

    On any error the temporary file is removed and ``path`` is left as it was; an ``OSError`` names ``path``
    (a missing directory, a directory in its place), not the temporary file.
    """
    _write_all({Path(path): write})


def write_all_atomic(payloads: dict[Path, bytes]) -> None:
    """Writes every ``path: payload`` or none: each to a temporary file beside its path, then, once all are
    written, renames each over its path. A write that fails (a full disk, a directory turned read-only) removes
    the temporary files and leaves every path as it was; errors are named as `write_atomically` names them."""
    _write_all({Path(path): lambda handle, payload=payload: handle.write(payload)
                for path, payload in payloads.items()})


def _write_all(writes: dict[Path, Callable[[BinaryIO], object]]) -> None:
    """Each ``write(handle)`` into a temporary file beside its path, then the renames (`write_all_atomic`)."""
    written: list[tuple[str, Path]] = []
    try:
        for path, write in writes.items():
            written.append((_written_beside(path, write), path))
        # a rename within a directory fails only where a directory stands in a path's place (callers check first);
        # the paths renamed before it stay replaced
        for temporary, path in list(written):
            try:
                os.replace(temporary, path)
            except OSError as error:
                raise _naming(error, path) from None
            written.remove((temporary, path))
    finally:
        for temporary, _ in written:
            os.unlink(temporary)


def _written_beside(path: Path, write: Callable[[BinaryIO], object]) -> str:
    """The name of a temporary file beside ``path`` holding what ``write(handle)`` wrote (mode 0644); on any error
    it is removed, and an ``OSError`` names ``path`` (`_naming`)."""
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as error:
        raise _naming(error, path) from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
        os.chmod(temporary, 0o644)  # mkstemp creates 0600
    except BaseException as error:
        os.unlink(temporary)
        if isinstance(error, OSError):
            raise _naming(error, path) from None
        raise
    return temporary


def _naming(error: OSError, path: Path) -> OSError:
    """``error`` about ``path`` (the same kind and errno) when it named the temporary file beside it (or nothing);
    ``error`` itself otherwise (no errno, or another file: one the ``write`` callback read)."""
    about_temporary = error.filename is None or Path(str(error.filename)).name.startswith(f".{path.name}.")
    return type(error)(error.errno, error.strerror, str(path)) if error.errno and about_temporary else error


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    write_all_atomic({path: payload})


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: Path, payload: object, *, indent: int = 2, sort_keys: bool = False) -> None:
    """``payload`` as indented JSON and a final newline; ``sort_keys``: keys in order (files diffed or compared)."""
    write_text_atomic(path, json.dumps(payload, indent=indent, sort_keys=sort_keys) + "\n")


def load_json(path: Path) -> object:
    """The JSON value in ``path``; a missing, binary, empty or malformed file, or a directory, raises one line naming
    it."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a JSON file")
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8), so not JSON") from None
    if not text.strip():  # json's own words for it, 'Expecting value at line 1, column 1', say less
        raise ValueError(f"{path}: empty, not JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        where = f"at line {error.lineno}, column {error.colno}"  # some messages end in "at" ("… starting at")
        raise ValueError(f"{path}: not valid JSON ({error.msg.removesuffix(' at')} {where})") from None
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{path}: not valid JSON ({load_reason(error)})") from None


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
            except (ValueError, RecursionError) as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({load_reason(error)})") from None
    return records


def load_reason(error: ValueError | RecursionError) -> str:
    """What a JSON or YAML load refused besides its syntax, in one line: nesting past Python's recursion limit, or
    what a value's constructor raised (an integer of more than Python's 4300 digits, whose message goes on about
    sys.set_int_max_str_digits; a date such as 2001-02-30)."""
    return "nested too deeply" if isinstance(error, RecursionError) else str(error).split(";")[0]


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; {} when it is missing, unreadable, not JSON (binary, truncated) or not an object:
    for files whose absence or damage means "nothing recorded" (a per-machine cache, a run's status), where
    `load_json` is for files that must be there. The entries themselves are the caller's to check."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return {}
    return value if isinstance(value, dict) else {}


def write_cache(path: Path, cache: dict) -> None:
    """Writes a per-machine cache file; an unwritable cache is skipped (it only costs a later process a re-measure)."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(path), cache)
    except OSError:
        pass


def others_may_write(directory: Path) -> str | None:
    """Why files in ``directory`` could be another user's ("owned by user N", "writable by every user"), or None
    where only this user (and their group) can write it: a cache whose files run as code is used only then."""
    status = directory.stat()
    if status.st_uid != os.geteuid():
        return f"owned by user {status.st_uid}"
    return "writable by every user" if status.st_mode & stat.S_IWOTH else None
