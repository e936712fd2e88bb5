"""What the sweep tests share: the repository's tiny spec, variants of it, and the CLI in a fresh process."""

import subprocess
import sys
from pathlib import Path

import yaml

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
