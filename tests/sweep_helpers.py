"""What the sweep tests share: the repository's tiny spec, variants of it, the CLI in a fresh process, and a pool
that trains in this process."""

import subprocess
import sys
from pathlib import Path

import yaml

from jaxformer.sweep.worker import train_group_here

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "sweeps" / "tiny.yaml"


def jaxformer(*args, cwd=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "jaxformer.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, **kwargs)


def variant(tmp_path: Path, name: str, **changes) -> Path:
    """A copy of sweeps/tiny.yaml with top-level sections replaced."""
    spec = yaml.safe_load(TINY.read_text())
    spec.update(name=name, **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class InProcessPool:
    """A pool of one worker in this process (`train_group_here`), for `launch`."""

    def __init__(self) -> None:
        self.compiled: set[str] = set()

    def run(self, sweep_dir, queue, on_event):
        outcomes = []
        while (taken := queue.take(wait=False)) is not None:
            group, settled = taken
            trained = train_group_here(sweep_dir, group) if group else []
            queue.finish(trained)
            for outcome in settled + trained:
                on_event(outcome.name, "finished", outcome)
            outcomes += settled + trained
        return outcomes
