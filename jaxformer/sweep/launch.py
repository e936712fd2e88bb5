"""Launching a sweep: the dry-run plan, the sweep directory, the executors, the closing fit.

Nothing here prints: `plan_table` returns its text, and `launch` hands every line it has for
the user to the ``report`` callback the command supplies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Callable, Iterator


from jaxformer.files import read_json, write_bytes_atomic
from jaxformer.sweep.accelerators import keep_launcher_on_cpu, local_accelerators
from jaxformer.sweep.branches import BranchCompute, train_branched, trunks_of
from jaxformer.sweep.executors import (LocalPool, connect_ray, local_ray_cpus, ray_actor_count, ray_nodes, run_local,
                                       run_ray)
from jaxformer.sweep.plan import PlannedRun, plan_run, repeated_data_note
from jaxformer.sweep.progress import SweepProgress
from jaxformer.sweep.queue import Prepare, WorkQueue
from jaxformer.sweep.directory import prepare_directory, write_configs, write_plan
from jaxformer.sweep.results import collect, render
from jaxformer.sweep.runs import TO_TRAIN, RunPaths
from jaxformer.sweep.spec import SweepSpec
from jaxformer.train.checkpoint_config import has_checkpoints
from jaxformer.train.final import final_record


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How `launch` trains the runs (the flags of `jaxformer sweep`).

    ``executor`` is ``"local"`` (worker processes here) or ``"ray"`` (tasks on ``ray_address``,
    else a local Ray instance, each asking for ``gpus_per_run`` GPUs). ``workers`` parallel runs of
    ``threads`` CPU threads each (0: no limit); both None: the layout `bench train --layout`
    measured, else one single-threaded run per core. ``retry_failed`` trains failed runs again.
    """

    executor: str = "local"
    workers: int | None = None
    threads: int | None = None
    retry_failed: bool = False
    ray_address: str | None = None
    gpus_per_run: float = 0.0
    spec_file: str | None = None  # the file the spec was read from (`prepare_directory` leaves it as written)

    def __post_init__(self) -> None:
        if self.executor not in ("local", "ray"):
            raise ValueError(f"--executor must be local or ray, got {self.executor!r}")


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """What a launch left: the results table's ``rows``, the runs that ``failed``, and those still
    training in another launch (``elsewhere``; then this launch wrote neither results.csv nor the fit)."""

    rows: list[dict]
    failed: list[str]
    elsewhere: list[str]


def plan_table(runs: list[PlannedRun], *, workers: int, probe: bool, adapt_limit: int | None = None,
               together: bool = False) -> str:
    """The table of runs with estimated minutes from a throughput probe of one run per distinct shape.

    ``adapt_limit``: the spec's ``isoflop.adapt_limit`` when ``isoflop.adapt`` is on (a line on what it may add).
    ``together``: the spec's ``together`` (a line on the groups that will train as one program each).
    """
    trunks = trunks_of(runs)  # with branches: trained first, then each run from its trunk's fork (steps: from → to)
    estimates = _estimate_minutes(trunks + runs) if probe else {}
    cells = [("run", "N", "D", "C", "D/N", "steps", "est. min")]
    for run in trunks + runs:
        minutes = estimates.get(run.name)
        cells.append((run.name, f"{run.N:,}", f"{run.D:.3g}", f"{run.C:.3g}", f"{run.tokens_per_param:.1f}",
                      f"{run.steps:,}" if run.fork_step is None else f"{run.fork_step:,}→{run.steps:,}",
                      "" if minutes is None else _minutes(minutes)))
    lines = _columns(cells)
    compute = BranchCompute.of(runs, trunks) if trunks else None
    total = compute.branched if compute else sum(run.C for run in runs)
    line = f"{len(runs)} runs" + (f" on {len(trunks)} trunks" if trunks else "") + f", total compute {total:.3g} FLOPs"
    if estimates:
        serial = sum(estimates.values())
        line += f", about {serial:.1f} run-minutes: ETA ≈ {serial / workers:.1f} min on {workers} workers"
    lines.append(line)
    if adapt_limit is not None:
        seeds = {run.budget: len({r.seed for r in runs if r.budget == run.budget}) for run in runs}
        lines.append(f"adapt: on, up to {adapt_limit} more sizes per budget beyond the edge where its minimum lies "
                     f"(at most {adapt_limit * sum(seeds.values())} more runs, about "
                     f"{adapt_limit * sum(b * n for b, n in seeds.items()):.3g} FLOPs), trained after these")
    if compute:
        lines.append(compute.line())
    if together:
        names = [run.name for run in trunks + runs]
        lines.append(_together_line(len(names), together_groups(trunks + runs, names)))
    note = repeated_data_note(runs)
    return "\n".join(lines + ([note] if note else []))


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as lines: each column as wide as its widest cell and two spaces from the next, the first
    left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                      for i, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _minutes(minutes: float) -> str:
    """A run's estimate, to a tenth of a minute, or to two digits when shorter (a short run is not 0.0)."""
    return f"{minutes:.1f}" if minutes >= 0.1 else f"{minutes:.2g}"


def _estimate_minutes(runs: list[PlannedRun]) -> dict[str, float]:
    """Probes each distinct model shape once (compile + a few steps) in this process."""
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.matmul_choice import choose_kernels
    from jaxformer.train.throughput import time_train_step

    timings = {}
    estimates = {}
    for run in runs:
        key = _shape(run.config)
        if key not in timings:
            timings[key] = time_train_step(choose_kernels(config_from_dict(run.config))[0], steps=3)
        timing = timings[key]
        estimates[run.name] = (timing.compile_s + (run.steps - (run.fork_step or 0)) * timing.step_s) / 60
    return estimates


def choose_layout(workers: int | None, threads: int | None) -> tuple[int, int, str]:
    """``(processes, threads per process, why)``: given flags, else one process per accelerator where JAX has
    some (each with every thread), else what `bench train --layout` measured here."""
    from jaxformer.runtime import LAYOUT_FILE

    cores = os.cpu_count() or 1
    accelerators = local_accelerators()
    if workers is not None or threads is not None:
        if accelerators is not None:
            return workers or accelerators.workers, threads or 0, "from the command line"
        return workers or cores, 1 if threads is None else threads, "from the command line"
    if accelerators is not None:
        return accelerators.workers, 0, f"one process per accelerator: {accelerators.describe()}"
    measured = read_json(LAYOUT_FILE)  # {} when absent or damaged: nothing measured
    processes, threads = measured.get("processes"), measured.get("threads")
    if _whole(processes, 1) and _whole(threads, 0):
        return processes, threads, f"fastest in `jaxformer bench train --layout`, {LAYOUT_FILE}"
    unusable = f" ({LAYOUT_FILE} holds no usable layout)" if LAYOUT_FILE.exists() else ""
    return cores, 1, (f"default one single-threaded run per core{unusable}; "
                      "measure with `jaxformer bench train --layout`")


def _whole(value, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@contextlib.contextmanager
def worker_pool(options: LaunchOptions, out: Path) -> Iterator[LocalPool | None]:
    """The warm local workers that every stage of a launch shares, their logs in ``out/logs`` (None for the Ray
    executor, whose actors live for one stage)."""
    if options.executor != "local":
        yield None
        return
    workers, threads, _ = choose_layout(options.workers, options.threads)
    pool = LocalPool(workers, threads, out)
    try:
        yield pool
    except KeyboardInterrupt:  # between stages too: a worker's run stops, not trained to its end first
        pool.interrupt()
        raise
    finally:
        pool.close()


def _shape(config: dict) -> str:
    """A key equal for runs whose train and eval programs are the same (`WorkQueue`'s ``shape``)."""
    train = config.get("train", {})
    return json.dumps([config.get("model"), config.get("kernel"), config.get("parallel"),
                       [train.get(key) for key in ("batch_size", "seq_len", "grad_accum", "compute_dtype")]],
                      sort_keys=True, default=str)


def launch(spec: SweepSpec, runs: list[PlannedRun], out: Path, options: LaunchOptions = LaunchOptions(), *,
           report: Callable[[str], None], pool: LocalPool | None = None) -> LaunchResult:
    """Trains every run not yet done, then (``isoflop.adapt``) the sizes that bracket each budget's minimum
    (`_adapt`), then writes results.csv and the fit; each line for the user goes to ``report``.

    Runs train even when some fail (see `LaunchResult.failed`); when another launch still holds
    runs, the table and the fit are left to it. ``pool``: local workers kept from an earlier stage
    (`worker_pool`; default: started for this launch).
    """
    if pool is None and options.executor == "local":
        with worker_pool(options, out) as pool:
            return launch(spec, runs, out, options, report=report, pool=pool)
    keep_launcher_on_cpu()  # before any worker starts: this process's fits run while the workers hold them
    workers, threads, why = choose_layout(options.workers, options.threads)
    ray = actors = None
    if options.executor == "ray":  # refused here, before anything is written, when not one actor fits
        ray = connect_ray(options.ray_address, local_ray_cpus(options.workers, threads))
        actors = ray_actor_count(ray_nodes(ray), max(threads, 1), options.gpus_per_run, options.workers)
    own = len(runs)
    runs = prepare_directory(spec, runs, out, spec_file=options.spec_file)
    states = {run.name: RunPaths(out, run.name).state() for run in runs}
    wanted = set(TO_TRAIN) | ({"failed"} if options.retry_failed else set())
    todo = [run.name for run in runs if states[run.name] in wanted]
    initial = {name: ("queued" if state in TO_TRAIN else state) for name, state in states.items()}
    report(f"sweep {spec.name}: {len(runs)} runs, {len(todo)} to train, {options.executor} executor → {out}")
    report(f"layout: {workers if ray is None else actors} {'processes' if ray is None else 'Ray actors'} × "
           f"{threads or 'all'} threads ({why})")
    damaged = [name for name, state in states.items() if state == "damaged"]
    if damaged:
        report(f"{len(damaged)} runs hold a damaged final.json and train again, from their last checkpoint where "
               f"they have one: {', '.join(damaged)}")
    note = repeated_data_note(runs)
    if note:
        report(note)

    def train(planned: list[PlannedRun], names: list[str], initial: dict[str, str], *,
              after: dict[str, str] | None = None, prepare: Prepare | None = None) -> list:
        """Trains ``names`` of ``planned``; ``after`` and ``prepare`` as `WorkQueue` takes them."""
        progress = SweepProgress(out, [dataclasses.asdict(run) for run in planned], initial, write=report)
        items = together_groups(planned, names) if spec.together else names
        if len(items) < len(names):
            report(_together_line(len(names), items))
        queue = WorkQueue(items, after=after, prepare=prepare, shape={run.name: _shape(run.config) for run in planned},
                          compiled=pool.compiled if pool is not None else None)
        with progress:
            if ray is not None:
                outcomes = run_ray(ray, out, queue, actors, threads, options.gpus_per_run, progress.event)
            elif len(items) == 1 and threads and lone_threads(out, names, workers, threads) > threads:
                outcomes = run_local(out, queue, 1, workers * threads, progress.event)
            else:
                outcomes = pool.run(out, queue, progress.event)
        report(progress.summary())
        return outcomes

    if any(run.trunk for run in runs):
        outcomes = train_branched(out, runs, trunks_of(runs), wanted, train, report)
    else:
        outcomes = train(runs, todo, initial)
    rows = collect(out)
    elsewhere = _elsewhere(rows, outcomes)
    if spec.isoflop is not None and spec.isoflop.adapt and not elsewhere:
        runs, added = _adapt(spec, runs, own, out, train, report)
        rows = collect(out)
        elsewhere = _elsewhere(rows, outcomes + added)
    failed = [row["run"] for row in rows if row["status"] == "failed"]
    if elsewhere:  # the launch that finishes last writes the table and the fit, on every run
        report(f"{len(elsewhere)} runs still training in another launch; results.csv and the fit are left to it "
               f"(or run `jaxformer results {out}` when it is done)")
        return LaunchResult(rows, failed, elsewhere)
    write_bytes_atomic(out / "results.csv", render(rows, "csv"))
    if spec.fit is not None:
        from jaxformer.sweep.fit import fit_sweep

        text, fitted = fit_sweep(out, rows, spec.fit)
        report(text)
        if spec.verify is not None and fitted is not None:
            failed += _verify(spec, runs, fitted, out, train, report, rows)
    return LaunchResult(rows, failed, elsewhere)


def lone_threads(out: Path, names: list[str], workers: int, threads: int) -> int:
    """CPU threads for ``names``, the one run (or group) left to train: every core the layout would have used
    (``workers × threads``) when they start afresh, a worker's ``threads`` when one resumes from its checkpoints
    (a branch from its trunk's): the count it began with unless it began alone, since a reduction's sum order
    follows the thread count and a resume on another count is not bit-exact."""
    resumes = any(has_checkpoints(RunPaths(out, name).run_dir) for name in names)
    return threads if resumes else workers * threads


def together_groups(planned: list[PlannedRun], names: list[str]) -> list[str | tuple[str, ...]]:
    """``names`` with the runs that can train as one program (`jaxformer.train.together`: the spec's
    ``together``) as tuples, in the order of each group's first run; a run without a partner stays a name."""
    from jaxformer.train.config import config_from_dict
    from jaxformer.train.together import together_groups as groups

    configs = {run.name: run.config for run in planned}
    return [group if len(group) > 1 else group[0]
            for group in groups({name: config_from_dict(configs[name]) for name in names})]


def _together_line(count: int, items: list[str | tuple[str, ...]]) -> str:
    """What ``together: true`` made of ``count`` runs (``items``, `together_groups`): how many worker requests."""
    groups = [item for item in items if isinstance(item, tuple)]
    if not groups:
        return f"together: no runs of the {count} can share a program (none differ only in lr schedule or seed)"
    sizes = sorted({len(group) for group in groups})
    size = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    return (f"together: {count} runs in {len(items)} worker requests, each group one program "
            f"({len(groups)} of {size} runs)")


def _elsewhere(rows: list[dict], outcomes: list) -> list[str]:
    """The runs another launch held when this one reached them and has not finished."""
    busy = {outcome.name for outcome in outcomes if outcome.status == "busy"}
    return [row["run"] for row in rows if row["run"] in busy and row["status"] != "done"]


def _adapt(spec: SweepSpec, runs: list[PlannedRun], own: int, out: Path, train,
           report: Callable[[str], None]) -> tuple[list[PlannedRun], list]:
    """The adapt rounds (``isoflop.adapt``, `jaxformer.sweep.adapt`): each size added beyond an edge is planned at
    every seed of its budget, appended to plan.json and trained like the others.

    ``own``: how many of ``runs`` the spec plans (the rest an earlier launch's rounds added). N is
    counted as the fit counts it. Returns every run and the rounds' training outcomes.
    """
    from jaxformer.sweep.adapt import BudgetState, Proposal, adapt

    isoflop, runs, outcomes = spec.isoflop, list(runs), []
    count = spec.fit.params if spec.fit else spec.shape.count

    def points(planned: list[PlannedRun]) -> list[tuple[float, float]]:
        finals = [(run, final_record(RunPaths(out, run.name).final)) for run in planned]
        return [(run.N if count == "total" else run.N_non_embedding, float(final["val_loss"]))
                for run, final in finals if final is not None]

    def add(proposals: list[Proposal]) -> dict[Proposal, list[tuple[float, float]]]:
        new: dict[Proposal, list[PlannedRun]] = {}
        for p in proposals:
            try:
                planned = [plan_run(spec, p.budget, p.target, seed, rule=isoflop.flops)
                           for seed in spec.seeds + isoflop.extra_seeds(p.budget)]
            except ValueError as error:
                report(f"adapt: C={p.budget:.3g}: no run of N≈{p.target:.2g}: {error}")
                continue
            if any(run.budget == p.budget and run.N == planned[0].N for run in runs):
                report(f"adapt: C={p.budget:.3g}: the size rule gives N≈{p.target:.2g} a shape it has "
                       f"(N={planned[0].N:,}); no new size beyond the {p.edge} edge")
                continue
            new[p] = planned
        added = [run for planned in new.values() for run in planned]
        if added:
            runs.extend(added)
            write_plan(spec, runs, out)
            todo = [run.name for run in added if RunPaths(out, run.name).state() != "done"]
            outcomes.extend(train(added, todo, {run.name: "queued" if run.name in todo else "done" for run in added}))
        return {p: points(planned) for p, planned in new.items()}

    states = [BudgetState(budget, sorted({run.target_params for run in runs if run.budget == budget}),
                          points([run for run in runs if run.budget == budget]),
                          len({run.target_params for run in runs[own:] if run.budget == budget}))
              for budget in sorted(isoflop.budgets)]
    adapt(states, step=isoflop.center.step, limit=isoflop.adapt_limit, train=add, report=report)
    return runs, outcomes


def _verify(spec: SweepSpec, runs: list[PlannedRun], fitted, out: Path, train, report: Callable[[str], None],
            rows: list[dict]) -> list[str]:
    """Plans, trains (those not done) and checks the held-out runs against the law and, where ``rows`` hold
    seed repeats, the seed noise; returns the names of those that failed."""
    from jaxformer.sweep.verify import plan_verify, verify_runs

    try:
        held_out = plan_verify(spec, runs, fitted)
    except ValueError as error:
        report(f"verify skipped: {error}")
        return []
    write_configs(out, held_out)
    todo = [run.name for run in held_out if RunPaths(out, run.name).state() != "done"]
    report(f"verify: {len(held_out)} held-out runs at C = {held_out[0].budget:.3g} ({held_out[0].name} the "
           f"compute-optimal one), {len(todo)} to train")
    if todo:
        train(held_out, todo, {run.name: "done" if run.name not in todo else "queued" for run in held_out})
    failed = [run.name for run in held_out if RunPaths(out, run.name).state() != "done"]
    if failed:
        report(f"verify: held-out runs did not finish: {', '.join(failed)} (see {out / 'logs'})")
        return failed
    report(verify_runs(out, held_out, fitted, spec, rows)[1])
    return []
