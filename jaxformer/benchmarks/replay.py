"""What a finished ``jaxformer sweep`` trained, read back from its directory, for `jaxformer bench sweep`.

Both sides of the bench read it: the jaxformer side sums the trained runs' ``final.json``, and the PyTorch
twin (`jaxformer.benchmarks.torch_sweep`) trains the same runs in the same stages.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ReplayedRun:
    """A run a finished jaxformer sweep trained: its name, steps, config (a dict) and, for a branch, its fork."""

    name: str
    steps: int
    config: dict
    trunk: str | None = None
    fork_step: int | None = None
    directory: Path | None = None  # the sweep directory holding runs/<name> (the sweep's, or its tune/)


def replay_plan(sweep_dir: str | Path) -> list[list[ReplayedRun]]:
    """The runs of the jaxformer sweep in ``sweep_dir``, in the stages it trained them: its tuning stage
    (``tune/``), then its trunks and the runs it trained from scratch, then its branches (empty stages
    dropped). ``ValueError`` when ``sweep_dir`` holds no finished plan."""
    from jaxformer.configs import load_yaml

    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / "plan.json").is_file():
        raise ValueError(f"{sweep_dir} holds no plan.json: the twin replays a sweep jaxformer has run there")

    def runs_of(directory: Path, key: str) -> list[ReplayedRun]:
        if not (directory / "plan.json").is_file():
            return []
        entries = json.loads((directory / "plan.json").read_text()).get(key, [])
        return [ReplayedRun(entry["name"], int(entry["steps"]), load_yaml(directory / "configs" / f"{entry['name']}.yaml"),
                            entry.get("trunk"), entry.get("fork_step"), directory) for entry in entries]

    main = runs_of(sweep_dir, "runs")
    stages = [runs_of(sweep_dir / "tune", "runs"),
              runs_of(sweep_dir, "trunks") + [run for run in main if run.trunk is None],
              [run for run in main if run.trunk is not None]]
    return [stage for stage in stages if stage]
