"""One run of a sweep on disk: its directory, its lock, its status.

Layout of a sweep directory::

    spec.yaml  plan.json                 the spec as launched and the planned runs (and trunks, with branches)
    configs/NAME.yaml                    each run's full training config
    runs/NAME/                           the run directory `jaxformer train` writes (final.json …; a
                                         branch's fork.json: `jaxformer.sweep.branches`)
    status/NAME.json                     the sweep's record: done / failed (with the reason)
    logs/NAME.log                        the run's stdout and stderr
    locks/NAME.lock                      held while a process trains the run

A run is *done* when ``runs/NAME/final.json`` holds a finished run's record (`jaxformer.train.final`: a JSON
object with a finite ``val_loss``), *damaged* when that file exists but does not (cut short, emptied:
the next launch trains the run again, from its last checkpoint if any), *failed* when its status record
says so (until ``--retry-failed``), *partial* when it has checkpoints, else *queued*.
The lock (``fcntl.flock``, released by the kernel if the holder dies) is what stops two
launches on one directory from training the same run twice.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator, Sequence

from jaxformer.configs import load_yaml
from jaxformer.files import read_json, write_json_atomic
from jaxformer.train.checkpoint_config import has_checkpoints
from jaxformer.train.final import final_record


TO_TRAIN = ("queued", "partial", "damaged")  # the states a launch trains (a failed run too with --retry-failed)


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
        """``done``, ``damaged``, ``failed``, ``partial`` or ``queued``."""
        if self.final.is_file():
            return "done" if final_record(self.final) is not None else "damaged"
        if self.status.is_file() and read_json(self.status).get("status") == "failed":
            return "failed"
        if has_checkpoints(self.run_dir):
            return "partial"
        return "queued"

    def record(self, status: str, **fields) -> None:
        self.status.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.status, {"status": status, "time": time.time(), **fields})


def saved_config(path: Path) -> dict:
    """A run's config as a sweep saved it (``configs/NAME.yaml``, a trunk's ``config.yaml``); raises ``ValueError``
    naming the file when it is empty or not a YAML mapping."""
    config = load_yaml(path)
    if not config:
        raise ValueError(f"{path}: empty, not a run's config")
    return config


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
    (`jaxformer.train.config.RESUMABLE_CHANGES`: logging, checkpoints, kernels, layout) are not compared. A begun
    run's damaged ``configs/NAME.yaml`` raises ``ValueError`` naming it.
    """
    from jaxformer.train.config import config_from_dict, config_to_dict, resume_conflict

    for run in runs:
        paths = RunPaths(sweep_dir, run.name)
        if not paths.config.is_file() or paths.state() == "queued":
            continue
        saved = saved_config(paths.config)
        try:
            before = config_to_dict(config_from_dict(saved))
        except ValueError as error:
            raise ValueError(f"{paths.config}: {error}") from None
        conflict = resume_conflict(before, config_from_dict(copy.deepcopy(run.config)))
        if conflict is not None:
            return f"{run.name}: {conflict.replace(' in the saved run', '')}"
    return None
