"""A run's ``final.json``: what makes it a finished run's record, read without JAX.

A finished run's record is a JSON object with a finite ``val_loss`` (the loop writes it last, atomically). Any
other file there — emptied, cut short, edited into text, a NaN loss — is *damaged*: a lone `jaxformer train`
trains the run again from its last checkpoint, or refuses when it has none (`jaxformer.train.prepare`); a sweep
counts the run as damaged and a relaunch trains it again (`jaxformer.sweep.runs`).
"""

from __future__ import annotations

import math
import reprlib
from pathlib import Path

from jaxformer.files import load_json

JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def finished_record(path: Path) -> dict:
    """The finished run's record in ``path``; a missing file raises ``FileNotFoundError`` and a damaged one
    ``ValueError``, each one line naming ``path`` and what is wrong with it."""
    record = load_json(path)
    if not isinstance(record, dict):
        raise ValueError(f"{path}: a JSON {JSON_TYPES[type(record)]}, not a run's record (a JSON object)")
    if "val_loss" not in record:
        raise ValueError(f"{path}: no val_loss, so not a finished run's record")
    loss = record["val_loss"]
    finite = isinstance(loss, int) or isinstance(loss, float) and math.isfinite(loss)  # isfinite(10**400) raises
    if isinstance(loss, bool) or not finite:
        raise ValueError(f"{path}: val_loss is {reprlib.repr(loss)}, not a finite number")
    return record


def damage(path: Path) -> str | None:
    """What is wrong with ``path`` as a finished run's record, in `finished_record`'s words without the path that
    begins them (for a line that names it already); None when it holds one."""
    try:
        finished_record(path)
    except (OSError, ValueError) as error:
        return str(error).removeprefix(f"{path}: ")
    return None


def final_record(path: Path) -> dict | None:
    """`finished_record` of ``path``; None when it is missing or damaged."""
    try:
        return finished_record(path)
    except (OSError, ValueError):
        return None
