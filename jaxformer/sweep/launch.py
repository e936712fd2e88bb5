"""Launching a sweep: the dry-run plan, the sweep directory, the executors, the closing fit."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import yaml

from jaxformer.configs import to_dict
from jaxformer.files import write_bytes_atomic
from jaxformer.sweep.executors import connect_ray, run_local, run_ray
from jaxformer.sweep.plan import PlannedRun
from jaxformer.sweep.progress import SweepProgress
from jaxformer.sweep.results import collect, load_plan, render
from jaxformer.sweep.runs import RunPaths
from jaxformer.sweep.spec import SweepSpec


def print_plan(runs: list[PlannedRun], *, workers: int, probe: bool) -> None:
    """The table of runs with estimated minutes from a throughput probe of one run per distinct shape."""
    estimates = _estimate_minutes(runs) if probe else {}
    print(f"{'run':<26}{'N':>10}{'D':>11}{'C':>10}{'D/N':>8}{'steps':>8}{'est. min':>10}")
    for run in runs:
        minutes = estimates.get(run.name)
        print(f"{run.name:<26}{run.N:>10,}{run.D:>11.3g}{run.C:>10.3g}{run.tokens_per_param:>8.1f}{run.steps:>8,}"
              f"{'' if minutes is None else f'{minutes:.1f}':>10}")
    total = sum(run.C for run in runs)
    line = f"{len(runs)} runs, total compute {total:.3g} FLOPs"
    if estimates:
        serial = sum(estimates.values())
        line += f", about {serial:.1f} run-minutes: ETA ≈ {serial / workers:.1f} min on {workers} workers"
    print(line)


def _estimate_minutes(runs: list[PlannedRun]) -> dict[str, float]:
    """Probes each distinct model shape once (compile + a few steps) in this process."""
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.throughput import time_train_step

    timings = {}
    estimates = {}
    for run in runs:
        config = config_from_dict(run.config)
        key = (json.dumps(run.config["model"], sort_keys=True), config.train.batch_size, config.train.seq_len)
        if key not in timings:
            timings[key] = time_train_step(config, steps=3)
        timing = timings[key]
        estimates[run.name] = (timing.compile_s + run.steps * timing.step_s) / 60
    return estimates


def choose_layout(workers: int | None, threads: int | None) -> tuple[int, int, str]:
    """``(processes, threads per process, why)``: given flags, else what `bench train --layout` measured here."""
    from jaxformer.benchmarks.train import LAYOUT_FILE

    cores = os.cpu_count() or 1
    if workers is not None or threads is not None:
        return workers or cores, 1 if threads is None else threads, "from the command line"
    if LAYOUT_FILE.is_file():
        measured = json.loads(LAYOUT_FILE.read_text())
        return measured["processes"], measured["threads"], f"fastest in `jaxformer bench train --layout`, {LAYOUT_FILE}"
    return cores, 1, "default one single-threaded run per core; measure with `jaxformer bench train --layout`"


def _prepare_directory(spec: SweepSpec, runs: list[PlannedRun], out: Path) -> None:
    """Writes spec, plan and per-run configs; refuses a directory that holds a different sweep."""
    plan = {"name": spec.name, "runs": [{k: v for k, v in dataclasses.asdict(run).items() if k != "config"}
                                        for run in runs]}
    if (out / "plan.json").is_file():
        previous = [run["name"] for run in load_plan(out)]
        if previous != [run.name for run in runs]:
            raise ValueError(f"--out {out} holds a different sweep (its plan.json lists other runs); "
                             "use a new --out")
    (out / "configs").mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out / "spec.yaml", yaml.safe_dump(to_dict(spec), sort_keys=False).encode())
    write_bytes_atomic(out / "plan.json", (json.dumps(plan, indent=1) + "\n").encode())
    for run in runs:
        write_bytes_atomic(RunPaths(out, run.name).config, yaml.safe_dump(run.config, sort_keys=False).encode())


def launch(spec: SweepSpec, runs: list[PlannedRun], out: Path, args: argparse.Namespace) -> int:
    """Trains every run not yet done; returns 1 when a run failed, else 0 (also when another launch holds runs)."""
    ray = connect_ray(args.ray_address, args.workers) if args.executor == "ray" else None
    _prepare_directory(spec, runs, out)
    states = {run.name: RunPaths(out, run.name).state() for run in runs}
    wanted = {"queued", "partial"} | ({"failed"} if args.retry_failed else set())
    todo = [run.name for run in runs if states[run.name] in wanted]
    initial = {name: ("queued" if state == "partial" else state) for name, state in states.items()}
    workers, threads, why = choose_layout(args.workers, args.threads)
    print(f"sweep {spec.name}: {len(runs)} runs, {len(todo)} to train, {args.executor} executor → {out}", flush=True)
    print(f"layout: {workers if ray is None else 'Ray-scheduled'} processes × {threads or 'all'} threads ({why})",
          flush=True)
    progress = SweepProgress(out, [dataclasses.asdict(run) for run in runs], initial)
    with progress:
        if ray is None:
            outcomes = run_local(out, todo, workers, threads, progress.event)
        else:
            outcomes = run_ray(ray, out, todo, threads, args.gpus_per_run, progress.event)
    print(progress.summary())
    rows = collect(out)
    busy = {outcome.name for outcome in outcomes if outcome.status == "busy"}
    elsewhere = [row["run"] for row in rows if row["run"] in busy and row["status"] != "done"]
    failed = [row["run"] for row in rows if row["status"] == "failed"]
    if elsewhere:  # the launch that finishes last writes the table and the fit, on every run
        print(f"{len(elsewhere)} runs still training in another launch; results.csv and the fit are left to it "
              f"(or run `jaxformer results {out}` when it is done)")
        return 1 if failed else 0
    write_bytes_atomic(out / "results.csv", render(rows, "csv"))
    if spec.fit is not None:
        from jaxformer.sweep.fit import fit_sweep

        fit_sweep(out, rows, spec.fit)
    return 1 if failed else 0
