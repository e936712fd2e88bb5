"""A run's ``checkpoint`` section and the steps its checkpoint directory holds, read without Orbax or JAX.

The sweep's planner and supervisor read these in a process that never trains; the Orbax side is
`jaxformer.train.checkpoint`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxformer.configs import POSITIVE, Section, setting


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
    """Orbax checkpoints every ``interval`` steps (and at the end), the last ``keep`` kept.

    resume: continue from the run directory's latest readable checkpoint when there is one.
    max_overhead: if set, an interval's save is skipped while saving has already taken more than
      this fraction of the run's training time (the last step is always saved): short runs then
      spend a bounded share on checkpoints, at the cost of more steps to redo after a kill.
    steps: steps always saved, whatever ``interval`` and ``max_overhead`` say, and never rotated
      away by ``keep`` (a WSD trunk's fork points, `jaxformer.sweep.branches`).
    asynchronous: Orbax writes each save in a background thread (as MaxText's and Levanter's runs do),
      holding the arrays it was handed while training goes on. The next save, and the end of the run,
      wait for the write; a step counts as saved only once Orbax has renamed its finished directory.
    """

    SECTION = "checkpoint"

    interval: int = setting(100, POSITIVE)
    keep: int = setting(3, POSITIVE)
    resume: bool = True
    max_overhead: float | None = setting(None, POSITIVE)
    steps: list[int] = setting(factory=list)
    asynchronous: bool = True

    def check(self) -> None:
        if any(step < 1 for step in self.steps):
            raise ValueError(f"checkpoint.steps must be positive step numbers, got {self.steps}")


def has_checkpoints(run_dir: Path) -> bool:
    """Whether ``RUN_DIR/checkpoints`` holds at least one saved step."""
    return latest_saved_step(run_dir) is not None


def saved_steps(run_dir: Path) -> list[int]:
    """The steps saved in ``RUN_DIR/checkpoints`` (readable or not), oldest first."""
    directory = Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return []
    # isascii: str.isdigit holds for "²", which int() refuses
    return sorted(int(child.name) for child in directory.iterdir() if child.name.isascii() and child.name.isdigit())


def latest_saved_step(run_dir: Path) -> int | None:
    """The newest step saved in ``RUN_DIR/checkpoints`` (readable or not); None when there is none."""
    return max(saved_steps(run_dir), default=None)
