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
    parser.add_argument("--output", help="write to this file (default: stdout; parquet needs a file)")


def run(args: argparse.Namespace) -> int:
    if args.format == "parquet" and not args.output:
        raise ValueError("--format parquet needs --output FILE")
    payload = render(collect(Path(args.sweep_dir)), args.format)
    if args.output:
        write_bytes_atomic(Path(args.output), payload)
    else:
        sys.stdout.write(payload.decode())
    return 0
