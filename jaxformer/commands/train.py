"""`jaxformer train CONFIG.yaml [key=value ...] [--run-dir DIR]`: one training run.

The run directory is ``--run-dir``, else ``train.run_dir``, else ``runs/<config name>``.
Bad input (unknown keys, wrong types, missing corpus files, a corpus shorter than one
batch, ``seq_len`` past the model's positions, non-positive budgets, a run directory
holding a different run) exits 2 with one line naming the field and value, after writing
only ``RUN_DIR/error.json`` — and nothing at all into a directory that already holds a run. A loss that turns NaN/inf exits 1, keeping the last good checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from jaxformer.configs import apply_overrides, load_yaml
from jaxformer.files import write_json_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML file with model/data/optimizer/train/checkpoint/logging sections")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides, e.g. model.d_model=256 train.tokens=2e6")
    parser.add_argument("--run-dir", help="run directory (default: train.run_dir, else runs/<config name>)")


def run_dir_for(args: argparse.Namespace) -> Path:
    """The run directory, found even when the config itself is invalid (for the error record)."""
    if args.run_dir:
        return Path(args.run_dir)
    try:
        section = apply_overrides(load_yaml(args.config), args.overrides).get("train") or {}
        if isinstance(section, dict) and isinstance(section.get("run_dir"), str):
            return Path(section["run_dir"])
    except (ValueError, FileNotFoundError):
        pass
    return Path("runs") / Path(args.config).stem


def write_error(run_dir: Path, error: BaseException, kind: str) -> None:
    """``RUN_DIR/error.json``: the one thing a failed run writes (best effort).

    Bad input aimed at a directory that already holds a run (a refused resume, say) writes
    nothing there: that run's files stay exactly as they were.
    """
    if kind == "bad_input" and (run_dir / "config.yaml").is_file():
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "error.json", {"error": kind, "message": str(error), "time": time.time()})
    except OSError:
        pass


def run(args: argparse.Namespace) -> int:
    from jaxformer.train.checkpoint import CheckpointError
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import NonFiniteLoss, train

    run_dir = run_dir_for(args)
    try:
        config = load_config(args.config, args.overrides)
        record = train(config, run_dir)
    except (ValueError, FileNotFoundError) as error:
        write_error(run_dir, error, "bad_input")
        raise  # the dispatcher prints one line and exits 2
    except (NonFiniteLoss, CheckpointError) as error:
        write_error(run_dir, error, type(error).__name__)
        print(f"jaxformer train: error: {error}", file=sys.stderr)
        return 1
    bpb = record["val_bits_per_byte"]
    print(
        f"done: {record['steps']} steps, D = {record['tokens']:,} tokens, N = {record['params']:,} params, "
        f"C = {record['flops_6nd']:.3g} FLOPs (6ND) | val loss {record['val_loss']:.4f} nats/token"
        + (f" ({bpb:.4f} bits/byte)" if bpb is not None else "")
        + f" | {record['wall_s']:.1f} s -> {run_dir / 'final.json'}"
    )
    return 0
