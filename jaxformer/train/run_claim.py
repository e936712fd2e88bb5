"""One process at a time trains a run directory: an exclusive ``flock`` on the directory itself.

`claimed` is held by `jaxformer.train.loop.train` and `jaxformer.train.together.train_together` from before
they read a run's state until they return, so a second `jaxformer train` on the same directory (or one aimed
at a run a sweep worker is training) is refused with one line instead of training it again beside the first,
both rotating one ``checkpoints/`` and rewriting one ``metrics.jsonl``. The kernel releases the lock when its
holder dies, so a killed run never leaves a stale claim. Locking the directory writes nothing into it (a
missing one is created, empty).
In a multi-process run only process 0 claims (every process trains the same directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

import jax

from jaxformer.parallel import initialize as initialize_distributed
from jaxformer.parallel.config import DistributedConfig

_HELD: set[Path] = set()  # directories this process has claimed: train_together may train one of them alone


class RunBusy(ValueError):
    """The run directory is claimed by another process."""


@contextlib.contextmanager
def claimed(run_dir: Path, distributed: DistributedConfig) -> Iterator[None]:
    """Holds ``run_dir`` (created if missing) for this process; raises `RunBusy` if another process holds it."""
    initialize_distributed(distributed)  # process_index needs it; a no-op once done
    key = Path(run_dir).absolute()
    if jax.process_index() != 0 or key in _HELD:
        yield
        return
    if key.exists() and not key.is_dir():
        raise ValueError(f"run directory {run_dir} is a file, not a directory")
    try:
        key.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise ValueError(f"run directory {run_dir}: {error.strerror}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(f"run directory {run_dir} is being trained by another process; wait for it to end, "
                          "or give another run directory") from None
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
    finally:
        os.close(descriptor)  # releases the lock
