"""`jaxformer tune SWEEP.yaml [--out DIR] [--workers N]`: only a sweep's tuning stage (its ``tune:``).

Trains the learning-rate grid at the tuned sizes in ``DIR/tune`` and writes the rule the sweep's
runs then train with (`jaxformer.sweep.tune`); `jaxformer sweep` on the same ``--out`` reuses it.
Exits 1, writing no rule, when a tuning run failed without diverging (``--retry-failed`` trains it again).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep YAML with a tune: section")
    parser.add_argument("--out", help="sweep directory (default: runs/<sweep name>); the stage writes DIR/tune")
    parser.add_argument("--workers", type=int, help="parallel runs (default: the layout `bench train --layout` chose)")
    parser.add_argument("--threads", type=int, help="CPU threads per run, 0 = no limit (default: as --workers)")
    parser.add_argument("--retry-failed", action="store_true", help="train failed tuning runs again")


def run(args: argparse.Namespace) -> int:
    from jaxformer.commands.sweep import check_worker_flags, say
    from jaxformer.sweep.launch import LaunchOptions
    from jaxformer.sweep.spec import load_spec
    from jaxformer.sweep.tune import tune_stage

    check_worker_flags(args)
    spec = load_spec(args.spec)
    if spec.tune is None:
        raise ValueError(f"{args.spec} has no tune: section to run (see jaxformer/sweep/spec.py)")
    out = Path(args.out) if args.out else Path("runs") / spec.name
    options = LaunchOptions(workers=args.workers, threads=args.threads, retry_failed=args.retry_failed)
    _, failed = tune_stage(spec, out, options, report=say)
    return 1 if failed else 0
