"""`jaxformer train CONFIG.yaml [key=value ...] [--run-dir DIR]`: one training run.

The run directory is ``--run-dir``, else ``train.run_dir``, else ``runs/<config name>``.
Bad input (unknown keys, wrong types, missing corpus files, a corpus shorter than one
batch, ``seq_len`` past the model's positions, non-positive budgets, a run directory
holding a different run, or files a run writes where no run began, such as the config given being
``RUN_DIR/config.yaml``: `jaxformer.train.prepare.refuse_others_files`) exits 2 with one line naming the field and
value, after writing only ``RUN_DIR/error.json`` — and nothing at all into a directory holding a run or such files
(`jaxformer.train.attempt`). A loss that turns NaN/inf exits 1, keeping the last good checkpoint.
A finished run is reported, not trained again; a damaged ``final.json`` (`jaxformer.train.final`) trains the run
again from its last checkpoint, and without one exits 2 naming the file, which is left as it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxformer.configs import apply_overrides, load_yaml


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


def run(args: argparse.Namespace) -> int:
    from jaxformer.train.attempt import attempt_run

    run_dir = run_dir_for(args)
    attempt = attempt_run(args.config, args.overrides, run_dir)
    if attempt.status == "bad_input":
        raise attempt.error  # the dispatcher prints one line and exits 2
    if attempt.status == "failed":
        print(f"jaxformer train: error: {attempt.error}", file=sys.stderr)
        return 1
    print(summary(attempt.record, run_dir / "final.json"))
    return 0


def summary(record: dict, final: Path) -> str:
    """The line a run ends with, from its ``final.json`` record. Only a finite ``val_loss`` is sure to be there (a
    finished run's record, `jaxformer.train.final`, may be one written by hand): a field missing or null is left
    out."""

    def shown(key: str, template: str) -> str | None:
        value = record.get(key)
        return template.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    sizes = ", ".join(filter(None, (shown("steps", "{} steps"), shown("tokens", "D = {:,} tokens"),
                                    shown("params", "N = {:,} params"), shown("flops_6nd", "C = {:.3g} FLOPs (6ND)"))))
    loss = " ".join(filter(None, (shown("val_loss", "val loss {:.4f} nats/token"),
                                  shown("val_bits_per_byte", "({:.4f} bits/byte)"))))
    return f"done: {' | '.join(filter(None, (sizes, loss, shown('wall_s', '{:.1f} s'))))} -> {final}"
