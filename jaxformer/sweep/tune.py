"""The tuning stage (a sweep's ``tune:``): learning rates tuned at a few sizes, the rule the sweep then trains with.

Before the sweep's own runs are planned, every peak learning rate of ``tune.lr`` (× each ``beta2``
and ``batch_size`` listed) trains at each size of ``tune.params`` on ``tune.budget`` FLOPs. Each
size's best rate (`jaxformer.scaling.tuning`: the lowest final validation loss, refined by a
parabola in ln lr) gives the rule ``lr = c · (N / N0)^k``, whose formula becomes the sweep's
``hyperparameters.optimizer.lr``. Listed ``beta2`` and ``batch_size`` are chosen once for all sizes
(`best_settings`) and set for the sweep's runs too; the rule is fitted on that pair's runs. The tuning
runs are a sweep of their own, launched by `launch` (so resume, locks and failure isolation are the
sweep's), in ``SWEEP_DIR/tune/``::

    spec.yaml plan.json configs/ runs/ status/ logs/ results.csv   the tuning runs, as any sweep's
    tune.json        the runs' losses, each size's optimum (edge flags), the rule c, k, N0 and its formula,
                     the beta2 and batch size applied (``applied``) and each size's own best (``best_by_size``)
    tune.png / .svg  loss against lr per size; the optima and the rule against N

A later launch whose ``tune.json`` matches the spec (the same ``tune:`` and the same tuning runs)
reuses its rule without training; the sweep's ``plan.json`` records the formula and its source.
A run that diverged (a non-finite loss fails it) counts as worse than any finished one; a run that
failed otherwise (a crash, a worker that died, a damaged checkpoint) says nothing of its rate, so the
stage fits no rule until it trains (``--retry-failed``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Callable

import numpy as np

from jaxformer.configs import set_dotted, to_dict
from jaxformer.files import read_json, write_bytes_atomic
from jaxformer.sweep.executors import LocalPool
from jaxformer.sweep.launch import LaunchOptions, launch, plan_table
from jaxformer.sweep.directory import existing_runs
from jaxformer.sweep.plan import PlannedRun, plan_run, plan_runs
from jaxformer.sweep.runs import changed_setting
from jaxformer.sweep.spec import IsoFlopSpec, SweepSpec, evaluate_formula

TUNE_DIR = "tune"  # the tuning stage's directory inside the sweep directory
RECORD = "tune.json"


def _tuning_spec(spec: SweepSpec) -> SweepSpec:
    """The spec the tuning runs train under: one IsoFLOP budget, the tuned sizes and seed, no fit, and
    none of the sweep's hyperparameter formulas for the settings the grid sets."""
    tune = spec.tune
    tuned = {"optimizer.lr"} | ({"optimizer.beta2"} if tune.beta2 else set()) \
        | ({"train.batch_size"} if tune.batch_size else set())
    return dataclasses.replace(
        spec, name=f"{spec.name}-tune", grid=None, seeds=[tune.seed], fit=None, verify=None, tune=None,
        isoflop=IsoFlopSpec(budgets=[tune.budget], params=list(tune.params), flops=spec.flops_rule),
        hyperparameters={key: value for key, value in spec.hyperparameters.items() if key not in tuned})


def plan_tuning(spec: SweepSpec) -> list[PlannedRun]:
    """The tuning runs, sizes ascending then rates: ``tune-lr<lr>[-b<beta2>][-bs<batch>]-C…-N…-s<seed>``."""
    tune, tuning = spec.tune, _tuning_spec(spec)
    runs = []
    for target, lr, beta2, batch in itertools.product(sorted(tune.params), sorted(tune.lr), tune.beta2 or [None],
                                                      tune.batch_size or [None]):
        base, prefix = copy.deepcopy(spec.base), f"tune-lr{lr:.3g}-"
        set_dotted(base, "optimizer.lr", lr)
        if beta2 is not None:
            set_dotted(base, "optimizer.beta2", beta2)
            prefix += f"b{beta2:g}-"
        if batch is not None:
            set_dotted(base, "train.batch_size", batch)
            prefix += f"bs{batch}-"
        try:
            runs.append(plan_run(dataclasses.replace(tuning, base=base), tune.budget, target, tune.seed,
                                 rule=spec.flops_rule, isoflop=True, prefix=prefix))
        except ValueError as error:  # a tuning size or budget the planner cannot serve: say it is the stage's
            raise ValueError(f"tune: {error}") from None
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        duplicate = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"two tuning runs are the same run ({duplicate}): the size rule mapped two of "
                         "tune.params to one model, or two of tune.lr print alike")
    return runs


def _jsonable_tune(spec: SweepSpec) -> dict:
    return json.loads(json.dumps(to_dict(spec.tune)))


def matching_record(spec: SweepSpec, runs: list[PlannedRun], directory: Path) -> dict | None:
    """``directory``'s tune.json when it was written for this ``tune:`` and these tuning runs, trained as planned
    now, else None. One not whole (damaged, edited out of shape: no rule formula of the spec grammar) matches
    nothing, so the stage fits its runs again."""
    record = read_json(directory / RECORD)
    entries, rule = record.get("runs"), record.get("rule")
    names = [r.get("run") for r in entries if isinstance(r, dict)] if isinstance(entries, list) else None
    matches = _whole(rule, record.get("failed")) and _applicable(spec, record.get("applied", {})) \
        and record.get("tune") == _jsonable_tune(spec) and names == [r.name for r in runs]
    return record if matches and changed_setting(directory, runs) is None else None


def _applicable(spec: SweepSpec, applied) -> bool:
    """Whether a tune.json's ``applied`` sets exactly the settings ``tune:`` grids, each to one of its values
    (written before session 40 without it: nothing, for a stage that grids neither)."""
    grids = {"optimizer.beta2": spec.tune.beta2, "train.batch_size": spec.tune.batch_size}
    return isinstance(applied, dict) and set(applied) == {key for key, grid in grids.items() if grid} \
        and all(type(value) in (int, float) and value in grids[key] for key, value in applied.items())


def _whole(rule, failed) -> bool:
    """Whether a tune.json's ``rule`` and ``failed`` are as `write_record` writes them: a formula of the grammar
    every spec formula obeys, a list."""
    if not (isinstance(rule, dict) and isinstance(rule.get("formula"), str) and isinstance(failed, list)):
        return False
    try:
        evaluate_formula("optimizer.lr", rule["formula"], None)
    except ValueError:
        return False
    return True


def with_rule(spec: SweepSpec, record: dict) -> SweepSpec:
    """``spec`` whose runs train with the recorded rule as ``hyperparameters.optimizer.lr``, and with the
    ``beta2`` and ``batch_size`` the stage chose where it tuned them (``applied``)."""
    formula = record["rule"]["formula"]
    return dataclasses.replace(spec, hyperparameters={**spec.hyperparameters, "optimizer.lr": formula,
                                                      **record.get("applied", {})})


def diverged(row: dict) -> bool:
    """Whether a results row (`jaxformer.sweep.results.collect`) is a run that failed on a non-finite loss."""
    return row["status"] == "failed" and row["reason"].startswith("NonFiniteLoss:")


def unfinished(runs: list[PlannedRun], rows: list[dict]) -> list[str]:
    """The tuning runs with no loss to fit that did not diverge either: failed otherwise, or not trained."""
    status = {row["run"]: row for row in rows}
    return [run.name for run in runs if status[run.name]["status"] != "done" and not diverged(status[run.name])]


def _records(runs: list[PlannedRun], rows: list[dict]) -> list[dict]:
    """Every tuning run's record: its size, settings, final loss (None: diverged) and status."""
    rows_by_name = {row["run"]: row for row in rows}
    records = []
    for run in runs:
        row = rows_by_name[run.name]
        loss = row["loss"] if row["status"] == "done" else None  # None: diverged (`unfinished` refuses the rest)
        records.append({"run": run.name, "N": run.N, "lr": run.config["optimizer"]["lr"],
                        "beta2": run.config["optimizer"]["beta2"], "batch_size": run.config["train"]["batch_size"],
                        "loss": loss, "status": row["status"]})
    return records


def _best_loss(records: list[dict]) -> float:
    return min((r["loss"] for r in records if r["loss"] is not None), default=math.inf)


def best_settings(records: list[dict]) -> tuple[float, int]:
    """The (beta2, batch size) the sweep trains with: the lowest mean over sizes of each size's best loss
    across the learning rates. One pair for every size, so that the rule's rates are those of the runs' own
    settings; each size's own best pair is reported beside it (`write_record`)."""
    sizes = sorted({r["N"] for r in records})

    def mean_best(pair: tuple[float, int]) -> float:
        mine = [r for r in records if (r["beta2"], r["batch_size"]) == pair]
        return float(np.mean([_best_loss([r for r in mine if r["N"] == size]) for size in sizes]))

    pairs = sorted({(r["beta2"], r["batch_size"]) for r in records})
    return min(pairs, key=mean_best)  # ties: the first in sorted order, so a relaunch chooses alike


def write_record(spec: SweepSpec, runs: list[PlannedRun], rows: list[dict], directory: Path) -> tuple[dict, list[str]]:
    """Fits the finished tuning runs' ``rows``; writes tune.json and the figure; returns the record and its lines."""
    # here, not at the top: the fit needs JAX and the figure matplotlib, which the launcher would otherwise
    # import before its workers start
    from jaxformer.scaling.plots import plot_tuning, save
    from jaxformer.scaling.tuning import edge_notes, fit_tuning
    from jaxformer.scaling.tuning import to_dict as fit_to_dict

    records = _records(runs, rows)
    beta2, batch = best_settings(records)
    chosen = [r for r in records if (r["beta2"], r["batch_size"]) == (beta2, batch)]
    fit = fit_tuning(*(np.array([r[key] for r in chosen], dtype=float) for key in ("N", "lr", "loss")))  # None: NaN
    fitted = fit_to_dict(fit)
    applied = {**({"optimizer.beta2": beta2} if spec.tune.beta2 else {}),
               **({"train.batch_size": batch} if spec.tune.batch_size else {})}
    by_size = []  # each size's own best (beta2, batch size), which may differ from the one applied
    for size in sorted({r["N"] for r in records}):
        best = min((r for r in records if r["N"] == size), key=lambda r: math.inf if r["loss"] is None else r["loss"])
        by_size.append({key: best[key] for key in ("N", "beta2", "batch_size", "lr", "loss")})
    save(plot_tuning(fit), directory, "tune")
    failed = [r["run"] for r in records if r["status"] != "done"]
    record = {"tune": _jsonable_tune(spec), "flops_rule": spec.flops_rule, "runs": records, **fitted,
              "applied": applied, "best_by_size": by_size, "failed": failed, "plot": "tune.png"}
    write_bytes_atomic(directory / RECORD, (json.dumps(record, indent=1, allow_nan=False) + "\n").encode())
    lines = [f"tuning: N = {o['N']:,.0f}: best lr {o['lr']:.3g} "
             f"({'parabola through its neighbours' if o['refined'] else 'grid point'}), loss {o['loss']:.4f}"
             for o in fitted["optima"]]
    if applied:
        lines += [f"tuning: N = {b['N']:,.0f}: its own best is beta2 {b['beta2']:g}, batch size {b['batch_size']} "
                  f"(lr {b['lr']:.3g}, loss {b['loss']:.4f})" for b in by_size if b["loss"] is not None]
        lines.append("tuning: the sweep's runs train with " + ", ".join(f"{k} = {v:g}" for k, v in applied.items())
                     + " (the lowest mean over sizes of each size's best loss); the lr rule is fitted on its runs")
    lines += edge_notes(fit)
    if failed:
        lines.append(f"tuning: {len(failed)} of {len(records)} runs diverged, counted as worse than any "
                     f"finished one: {', '.join(failed)}")
    lines.append(f"tuning rule: optimizer.lr = {fit.rule.formula}; wrote {directory / RECORD} and "
                 f"{directory / 'tune.png'}")
    return record, lines


def tune_stage(spec: SweepSpec, out: Path, options: LaunchOptions = LaunchOptions(), *,
               report: Callable[[str], None], pool: LocalPool | None = None) -> tuple[SweepSpec | None, list[str]]:
    """Trains the tuning runs not yet done in ``out/tune`` and fits their rule, unless its tune.json already
    matches (and ``options.retry_failed`` has no diverged run to retry before the sweep's own runs are planned:
    once they are, they train with the rule, and a retried run that came out otherwise would change it under
    them); returns ``spec`` training with the
    rule and no names, else None (nothing is fitted) and the tuning runs that failed without diverging (none
    while another launch still trains some). ``pool``: the warm workers the sweep's own runs train on next
    (`jaxformer.sweep.launch.worker_pool`)."""
    planned = (Path(out) / "plan.json").is_file()
    runs = plan_tuning(spec)
    check_directories(spec, runs, Path(out))
    directory = Path(out) / TUNE_DIR
    record = matching_record(spec, runs, directory)
    if record is not None and not (options.retry_failed and record["failed"] and not planned):
        report(f"tuning stage: {directory / RECORD} matches the spec, nothing to train; "
               f"optimizer.lr = {record['rule']['formula']}")
        return with_rule(spec, record), []
    result = launch(_tuning_spec(spec), runs, directory, options, report=report, pool=pool)
    if result.elsewhere:
        report("tuning stage: runs still training in another launch; relaunch when they are done for the rule")
        return None, []
    broken = unfinished(runs, result.rows)
    if broken:
        report(f"tuning stage: {len(broken)} of {len(runs)} tuning runs failed without diverging, so their losses "
               f"are unknown and no rule is fitted (see {directory / 'logs'}); relaunch with --retry-failed: "
               f"{', '.join(broken)}")
        return None, broken
    record, lines = write_record(spec, runs, result.rows, directory)
    for line in lines:
        report(line)
    return with_rule(spec, record), []


def check_directories(spec: SweepSpec, tuning: list[PlannedRun], out: Path) -> None:
    """Refuses, as the stage's launch would and before a tuning run trains, a sweep directory ``out`` whose
    plan.json lists other runs than the spec's, or whose tuning stage (``out/tune``) lists other ``tuning`` runs or
    began them under other settings: one line naming ``out``, the ``--out`` to change. The sweep's own runs are
    compared by name only, since their learning rates are the rule's, fitted after the stage."""
    existing_runs(spec, plan_runs(spec), out, settings=False)
    existing_runs(_tuning_spec(spec), tuning, out / TUNE_DIR, sweep_dir=out)


def extrapolation_note(tuning: list[PlannedRun], runs: list[PlannedRun]) -> str | None:
    """A line when the sweep's ``runs`` reach sizes beyond those the rule was fitted on (the ``tuning`` runs'),
    where its lr is the power law extrapolated; else None."""
    low, high = min(run.N for run in tuning), max(run.N for run in tuning)
    smallest, largest = min(run.N for run in runs), max(run.N for run in runs)
    factor = max(largest / high, low / smallest)
    if factor <= 1:
        return None
    return (f"note: the tuned lr rule is extrapolated up to {factor:.3g}x beyond the sizes it is fitted on: the "
            f"sweep's runs have N = {smallest:,} to {largest:,}, the tuning runs {low:,} to {high:,} (tune.params)")


def dry_run(spec: SweepSpec, out: Path, *, workers: int, probe: bool) -> tuple[str, SweepSpec]:
    """The tuning stage's part of `jaxformer sweep --dry-run`: its text, and the spec to plan the sweep's runs
    with (the rule of a matching tune.json, else the spec as written: the base config's lr stands in)."""
    runs = plan_tuning(spec)
    path = Path(out) / TUNE_DIR / RECORD
    record = matching_record(spec, runs, path.parent)
    if record is not None:
        return f"optimizer.lr = {record['rule']['formula']} (the tuning stage's rule, {path})", with_rule(spec, record)
    return ("tuning stage, trained first:\n" + plan_table(runs, workers=workers, probe=probe)
            + f"\nthe sweep's runs take optimizer.lr from the tuning stage's rule (to be written to {path}); "
              "below they are planned with the base config's lr"), spec
