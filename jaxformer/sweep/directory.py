"""A sweep's directory: the spec, the plan and each run's config as a launch writes them, and the checks that
keep one directory to one sweep (`prepare_directory`): its planned runs, and the settings of every run begun."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import yaml

from jaxformer.configs import to_dict
from jaxformer.files import write_bytes_atomic
from jaxformer.sweep.branches import trunks_of
from jaxformer.sweep.plan import PlannedRun, plan_run
from jaxformer.sweep.results import load_plan
from jaxformer.sweep.runs import RunPaths, changed_setting
from jaxformer.sweep.spec import SweepSpec


def prepare_directory(spec: SweepSpec, runs: list[PlannedRun], out: Path, *,
                      spec_file: str | Path | None = None) -> list[PlannedRun]:
    """Writes spec, plan and per-run configs; refuses a directory that holds a different sweep (`existing_runs`).

    ``spec_file``, the file the spec was read from, is left as the user wrote it (comments, a ``tune:`` section)
    where it is ``out``'s own spec.yaml. Returns ``runs`` followed by those an earlier launch's adapt rounds
    appended to plan.json.
    """
    runs = existing_runs(spec, runs, out)
    (out / "configs").mkdir(parents=True, exist_ok=True)
    record = out / "spec.yaml"
    if not (spec_file is not None and record.exists() and os.path.samefile(spec_file, record)):
        write_bytes_atomic(record, yaml.safe_dump(to_dict(spec), sort_keys=False).encode())
    write_plan(spec, runs, out)
    return runs


def existing_runs(spec: SweepSpec, runs: list[PlannedRun], out: Path, *, sweep_dir: Path | None = None,
                  settings: bool = True) -> list[PlannedRun]:
    """``runs`` followed by those an earlier launch's adapt rounds appended to ``out``'s plan.json; reads only.

    Raises ``ValueError``, one line, where a launch must not write into ``out``: it is no directory, its plan.json
    lists other runs, or (``settings``) a run begun there was begun under settings its planned config changes.
    ``sweep_dir``: the sweep's ``--out`` when ``out`` is its tuning stage's directory, which the line then names
    as the stage's (the directory to change is the sweep's).
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is not a directory")
    if not (out / "plan.json").is_file():
        return runs
    other = OTHER_SWEEP.format(out=out) if sweep_dir is None else OTHER_TUNING.format(out=sweep_dir, stage=out)
    added = _added_runs(spec, planned_after(out, runs, other=other))
    if added is None:
        raise ValueError(other)
    runs = runs + added
    changed = changed_setting(out, runs + trunks_of(runs)) if settings else None
    if changed is not None:
        where = f"--out {out}" if sweep_dir is None else f"--out {sweep_dir} (its tuning stage, {out})"
        raise ValueError(f"{where} holds runs begun under other settings ({changed}); relaunch with the spec they "
                         "were begun with, or use a new --out")
    return runs


OTHER_SWEEP = "--out {out} holds a different sweep (its plan.json lists other runs); use a new --out"
# the tuning stage's directory inside the sweep's: the sweep's --out is what to change, and tune: what changed
OTHER_TUNING = ("--out {out} holds another tuning stage ({stage}/plan.json lists other tuning runs than this spec's "
                "tune: plans); use a new --out, or restore the tune: its runs were planned with")


def planned_after(out: Path, runs: list[PlannedRun], *, other: str) -> list[dict]:
    """The entries of ``out``'s plan.json after ``runs`` (those an adapt round added); raises ``ValueError``, the
    line ``other``, when its first runs are not ``runs``: the directory holds another sweep."""
    previous = load_plan(out)
    if [run["name"] for run in previous[:len(runs)]] != [run.name for run in runs]:
        raise ValueError(other)
    return previous[len(runs):]


def write_plan(spec: SweepSpec, runs: list[PlannedRun], out: Path) -> None:
    """plan.json (every run but its config; with branches, their trunks too) and each run's config file."""
    trunks = trunks_of(runs)
    plan = {"name": spec.name, "runs": [{k: v for k, v in dataclasses.asdict(run).items() if k != "config"}
                                        for run in runs]}
    if trunks:  # trained before their branches (jaxformer.sweep.branches); not runs of the results table
        plan["trunks"] = [{k: v for k, v in dataclasses.asdict(run).items() if k != "config"} for run in trunks]
    if spec.tune is not None:  # the learning rates come from the tuning stage (jaxformer.sweep.tune)
        plan["lr_rule"] = {"formula": spec.hyperparameters.get("optimizer.lr"), "source": "tune/tune.json"}
    write_bytes_atomic(out / "plan.json", (json.dumps(plan, indent=1) + "\n").encode())
    write_configs(out, runs + trunks)


def write_configs(out: Path, runs: list[PlannedRun]) -> None:
    """``configs/NAME.yaml``: each run's full training config, as its worker reads it."""
    for run in runs:
        write_bytes_atomic(RunPaths(out, run.name).config, yaml.safe_dump(run.config, sort_keys=False).encode())


def _added_runs(spec: SweepSpec, entries: list[dict]) -> list[PlannedRun] | None:
    """plan.json's runs after the spec's own (``entries``), planned again as the adapt rounds planned them;
    None when this spec would not have added them (no ``isoflop.adapt``, or they plan to other runs)."""
    if not entries:
        return []
    if spec.isoflop is None or not spec.isoflop.adapt:
        return None
    try:
        added = [plan_run(spec, entry["budget"], entry["target_params"], entry["seed"], rule=spec.isoflop.flops)
                 for entry in entries]
    except (KeyError, ValueError):
        return None
    return added if [run.name for run in added] == [entry["name"] for entry in entries] else None
