"""`jaxformer results SWEEP_DIR`: one table of a sweep's runs — N, D, C, final losses, status.

The table (`jaxformer.sweep.results`) is what `jaxformer fit` reads as is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxformer.files import write_bytes_atomic
from jaxformer.sweep.results import collect, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep_dir")
    parser.add_argument("--format", default="csv", choices=("csv", "parquet", "json"))
    parser.add_argument("--output", help="write to this new file (default: stdout; parquet needs a file)")
    parser.add_argument("--force", action="store_true", help="let --output replace an existing file")


def run(args: argparse.Namespace) -> int:
    sweep_dir = Path(args.sweep_dir)
    if args.format == "parquet" and not args.output:
        raise ValueError("--format parquet needs --output FILE")
    if args.output and Path(args.output).exists() and not args.force:
        raise ValueError(f"--output {args.output} exists; give --force to replace it")
    if (sweep_dir / "plan.json").is_file() and not (sweep_dir / "runs").is_dir() and (sweep_dir / "results.csv").is_file():
        raise ValueError(f"{sweep_dir} holds no run directories (runs/), so its results.csv, written when they were "
                         "there, is its table")  # a committed study: every run would read as queued
    payload = render(collect(sweep_dir), args.format)
    if args.output:
        write_bytes_atomic(Path(args.output), payload)
    else:
        sys.stdout.write(payload.decode())
    return 0
