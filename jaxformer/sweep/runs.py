"""One run of a sweep on disk: its directory, its lock, its status.

Layout of a sweep directory::

    spec.yaml  plan.json                 the spec as launched and the planned runs (and trunks, with branches)
    configs/NAME.yaml                    each run's full training config
    runs/NAME/                           the run directory `jaxformer train` writes (final.json …; a
                                         branch's fork.json: `jaxformer.sweep.branches`)
    status/NAME.json                     the sweep's record: done / failed (with the reason)
    logs/NAME.log                        the run's stdout and stderr
    locks/NAME.lock                      held while a process trains the run

A run is *done* when ``runs/NAME/final.json`` exists, *failed* when its status record
says so (until ``--retry-failed``), *partial* when it has checkpoints, else *queued*.
The lock (``fcntl.flock``, released by the kernel if the holder dies) is what stops two
launches on one directory from training the same run twice.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator, Sequence

import yaml

from jaxformer.files import write_json_atomic
from jaxformer.train.checkpoint_config import has_checkpoints


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one run: ``done``, ``failed``, ``skipped`` (done already) or ``busy`` (locked elsewhere)."""

    name: str
    status: str
    reason: str = ""
    wall_s: float = 0.0


class RunPaths:
    def __init__(self, sweep_dir: Path, name: str) -> None:
        self.name = name
        self.config = sweep_dir / "configs" / f"{name}.yaml"
        self.run_dir = sweep_dir / "runs" / name
        self.status = sweep_dir / "status" / f"{name}.json"
        self.log = sweep_dir / "logs" / f"{name}.log"
        self.lock = sweep_dir / "locks" / f"{name}.lock"

    @property
    def final(self) -> Path:
        return self.run_dir / "final.json"

    def state(self) -> str:
        """``done``, ``failed``, ``partial`` or ``queued``."""
        if self.final.is_file():
            return "done"
        if self.status.is_file() and read_json(self.status).get("status") == "failed":
            return "failed"
        if has_checkpoints(self.run_dir):
            return "partial"
        return "queued"

    def record(self, status: str, **fields) -> None:
        self.status.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.status, {"status": status, "time": time.time(), **fields})


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
        return {}
    return value if isinstance(value, dict) else {}


@contextlib.contextmanager
def run_lock(paths: RunPaths) -> Iterator[bool]:
    """Yields True when this process holds the run's lock, False when another process does."""
    paths.lock.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode())
        try:
            yield True
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def failure_reason(paths: RunPaths, returncode: int) -> str:
    """The run's own error record if it wrote one, else the last line of its log."""
    error = read_json(paths.run_dir / "error.json")
    if error.get("message"):
        return f"{error.get('error', 'error')}: {error['message']}"
    lines = [line for line in (paths.log.read_text(errors="replace").splitlines() if paths.log.is_file() else [])
             if line.strip()]
    return lines[-1].strip() if lines else f"exit status {returncode}"


def changed_setting(sweep_dir: Path, runs: Sequence) -> str | None:
    """The first of ``runs`` (planned runs: ``name`` and ``config``) that has begun in ``sweep_dir`` under a config
    that its planned one changes, as ``"NAME: FIELD was …, now …"``; None when every begun run is planned as it was.

    Runs not begun may change (they train under the new plan); settings a resume may change
    (`jaxformer.train.config.RESUMABLE_CHANGES`: logging, checkpoints, kernels, layout) are not compared.
    """
    from jaxformer.train.config import config_from_dict, config_to_dict, resume_conflict

    for run in runs:
        paths = RunPaths(sweep_dir, run.name)
        if not paths.config.is_file() or paths.state() == "queued":
            continue
        before = config_to_dict(config_from_dict(yaml.safe_load(paths.config.read_text())))
        conflict = resume_conflict(before, config_from_dict(copy.deepcopy(run.config)))
        if conflict is not None:
            return f"{run.name}: {conflict.replace(' in the saved run', '')}"
    return None
