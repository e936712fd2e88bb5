"""A run's ``final.json``: what makes it a finished run's record, read without JAX.

A finished run's record is a JSON object with a finite ``val_loss`` (the loop writes it last, atomically), whose
other fields that the commands show or fit, where present, are what the loop writes: `COUNTS` positive numbers,
`MEASURES` non-negative finite numbers or null, and ``tokens`` the product of ``steps``, ``batch_size`` and
``seq_len`` where all four are there (a record written by hand may hold ``val_loss`` alone). Any other file there —
emptied, cut short, edited into text, a NaN loss, a token count as text or not its steps' — is *damaged*: a lone
`jaxformer train` trains the run again from its last checkpoint, or refuses when it has none
(`jaxformer.train.prepare`); a sweep counts the run as damaged, `jaxformer results` shows none of its values and
names the file and the field, a fit refuses it, and a relaunch trains it again (`jaxformer.sweep.runs`).
"""

from __future__ import annotations

import math
import reprlib
from pathlib import Path

from jaxformer.files import load_json

JSON_TYPES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
COUNTS = ("params", "params_non_embedding", "params_active", "tokens", "steps", "batch_size", "seq_len")
MEASURES = ("train_loss", "val_bits_per_byte", "flops_6nd", "flops_6nd_non_embedding", "flops_exact", "epochs",
            "wall_s")  # null: a train loss never logged, the bits per byte of a pre-tokenised corpus


def _finite(value: object) -> bool:
    """Whether ``value`` is a JSON number (not a boolean) and finite (an integer past a float's range is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)  # isfinite(10**400) raises


def finished_record(path: Path) -> dict:
    """The finished run's record in ``path``; a missing file raises ``FileNotFoundError`` and a damaged one
    ``ValueError``, each one line naming ``path`` and what is wrong with it."""
    record = load_json(path)
    if not isinstance(record, dict):
        raise ValueError(f"{path}: a JSON {JSON_TYPES[type(record)]}, not a run's record (a JSON object)")
    if "val_loss" not in record:
        raise ValueError(f"{path}: no val_loss, so not a finished run's record")
    if not _finite(record["val_loss"]):
        raise ValueError(f"{path}: val_loss is {reprlib.repr(record['val_loss'])}, not a finite number")
    for key in COUNTS:
        if key in record and not (_finite(record[key]) and record[key] > 0):
            raise ValueError(f"{path}: {key} is {reprlib.repr(record[key])}, not a positive number")
    for key in MEASURES:
        if record.get(key) is not None and not (_finite(record[key]) and record[key] >= 0):
            raise ValueError(f"{path}: {key} is {reprlib.repr(record[key])}, not a non-negative finite number")
    if all(key in record for key in ("tokens", "steps", "batch_size", "seq_len")):
        tokens = record["steps"] * record["batch_size"] * record["seq_len"]
        if record["tokens"] != tokens:
            raise ValueError(f"{path}: tokens is {reprlib.repr(record['tokens'])}, not steps × batch_size × seq_len "
                             f"= {tokens:,}")
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
