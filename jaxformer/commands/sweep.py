"""`jaxformer sweep SWEEP.yaml [--executor local|ray] [--workers N] [--dry-run] [--out DIR]`.

A spec with ``tune:`` runs its tuning stage first (`jaxformer.sweep.tune`, also `jaxformer tune`).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from jaxformer.arguments import number

if TYPE_CHECKING:  # the command imports the sweep only when it runs
    from jaxformer.sweep.plan import PlannedRun
    from jaxformer.sweep.spec import SweepSpec

# on success every file is written and every worker has exited (a Ray instance this command started is stopped
# in `run`): `jaxformer.cli` skips Python's teardown (of JAX, where the fit imported it)
EXIT_AT_ONCE = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep YAML (see sweeps/)")
    parser.add_argument("--executor", choices=("local", "ray"), default="local")
    parser.add_argument("--workers", type=int, help="parallel runs (default: the layout `bench train --layout` chose)")
    parser.add_argument("--threads", type=int, help="CPU threads per run, 0 = no limit (default: as --workers)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--out", help="sweep directory (default: runs/<sweep name>)")
    parser.add_argument("--retry-failed", action="store_true", help="train failed runs again")
    parser.add_argument("--ray-address", help="an existing Ray cluster (default: start a local instance)")
    parser.add_argument("--gpus-per-run", type=number(minimum=0), default=0.0, help="GPUs each Ray task asks for")
    parser.add_argument("--no-probe", action="store_true", help="dry run without the throughput probe")


def say(line: str) -> None:
    """The launch's reporter: each line at once, so a log of the sweep follows it live."""
    print(line, flush=True)


def check_worker_flags(args: argparse.Namespace) -> None:
    """``--workers`` (at least 1) and ``--threads`` (0: no limit), shared with `jaxformer tune`."""
    for name in ("workers", "threads"):
        value = getattr(args, name)
        if value is not None and value < (1 if name == "workers" else 0):
            raise ValueError(f"--{name} must be positive, got {value}")


def dry_run(args: argparse.Namespace, spec: SweepSpec, runs: list[PlannedRun], out: Path) -> int:
    """Prints the plan; then, where the launch would refuse ``out``, raises its one line (exit 2, as the dry run
    does for every input the launch refuses before training: a script's ``--dry-run && launch`` stops there). The
    plan is printed first: it is the spec's, whatever the directory. Reads only: nothing is written to ``out``."""
    from jaxformer.sweep.directory import existing_runs
    from jaxformer.sweep.launch import choose_layout, plan_table
    from jaxformer.sweep.plan import plan_runs

    workers = choose_layout(args.workers, args.threads)[0]  # the launch's own layout, for the ETA
    checks = [functools.partial(existing_runs, spec, runs, out)]
    if spec.tune is not None:
        from jaxformer.sweep.tune import check_directories, dry_run, extrapolation_note, plan_tuning

        tuning = plan_tuning(spec)
        text, tuned = dry_run(spec, out, workers=workers, probe=not args.no_probe)
        print(text)
        runs = plan_runs(tuned)
        note = extrapolation_note(tuning, runs)
        if note:
            print(note)
        checks = [functools.partial(check_directories, spec, tuning, out)]
        if tuned is not spec:  # a matching tune.json's rule: the sweep's runs' settings are known, and compared
            checks.append(functools.partial(existing_runs, tuned, runs, out))
        spec = tuned
    adapt_limit = spec.isoflop.adapt_limit if spec.isoflop is not None and spec.isoflop.adapt else None
    print(plan_table(runs, workers=workers, probe=not args.no_probe, adapt_limit=adapt_limit, together=spec.together))
    try:
        for check in checks:
            check()
    except ValueError as error:
        raise ValueError(f"the launch would refuse: {error}") from None
    return 0


def run(args: argparse.Namespace) -> int:
    from jaxformer.sweep.launch import LaunchOptions, launch, worker_pool
    from jaxformer.sweep.plan import plan_runs
    from jaxformer.sweep.spec import load_spec

    check_worker_flags(args)
    spec = load_spec(args.spec)
    runs = plan_runs(spec)  # every run is checked before any trains (a tuned sweep's again with its rule)
    out = Path(args.out) if args.out else Path("runs") / spec.name
    if args.dry_run:
        return dry_run(args, spec, runs, out)
    options = LaunchOptions(executor=args.executor, workers=args.workers, threads=args.threads,
                            retry_failed=args.retry_failed, ray_address=args.ray_address,
                            gpus_per_run=args.gpus_per_run, spec_file=args.spec)
    try:
        with worker_pool(options, out) as pool:  # one set of warm workers for the tuning stage and every later one
            if spec.tune is not None:  # the tuning stage first: its rule sets the runs' learning rates
                from jaxformer.sweep.tune import extrapolation_note, plan_tuning, tune_stage

                spec, failed = tune_stage(spec, out, options, report=say, pool=pool)
                if spec is None:
                    return 1 if failed else 0
                runs = plan_runs(spec)
                note = extrapolation_note(plan_tuning(spec), runs)
                if note:
                    say(note)
            result = launch(spec, runs, out, options, report=say, pool=pool)
    finally:
        if "ray" in sys.modules:  # what Ray's own exit handler would do (`EXIT_AT_ONCE` skips it)
            sys.modules["ray"].shutdown()
    return 1 if result.failed else 0
