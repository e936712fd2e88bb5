"""A sweep directory as a scaling table: what `jaxformer.scaling` fits, handed over by the sweep.

`jaxformer.scaling` works on any table and knows nothing of how a sweep lays out its files;
this module does. ``sweep_table(DIR)`` reads one sub-directory per run (under ``runs/``, as
``jaxformer sweep`` writes it, or directly in ``DIR``) with ``final.json`` (``params``,
``tokens``, ``val_loss``…), the run's curve from its ``metrics.jsonl`` rows with a validation
loss, and each run's IsoFLOP budget from ``plan.json``; with a plan, only the runs it lists. A
``final.json`` that holds no finished run's record (cut short, emptied, a loss that is not a
finite number) is refused, naming it and what is wrong with it, with a plan or without: a directory of
runs trained apart is fitted as a sweep is. ``write_sweep`` lays a table out the same way (synthetic sweeps for tests
and notebooks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxformer.files import load_json, load_jsonl
from jaxformer.scaling.table import RunTable, columns_table, find_column, records_to_columns
from jaxformer.sweep.results import DAMAGED, NOT_FINISHED
from jaxformer.train.final import damage, final_record

CURVE_FILE = "metrics.jsonl"


PARAMS = {"total": "params", "non_embedding": "params_non_embedding"}
FLOPS = {"exact": "flops_exact", "6ND": "flops_6nd"}


def sweep_table(path: str | Path, *, params: str = "total", flops: str | None = None,
                loss_col: str | None = None, group_by: Sequence[str] = ()) -> RunTable:
    """The finished runs of the sweep at ``path``, with budgets and curves where recorded.

    params: ``total`` or ``non_embedding`` parameter counts as N; flops: ``exact`` (attention and
    the head included) or ``6ND`` training FLOPs as C, by default the rule the sweep planned with
    (``exact`` without a plan). An IsoFLOP sweep's budgets hold under its own rule only (under the
    other, the runs of one budget differ in C by the ratio of the two counts, which depends on N),
    so another rule is refused there. The table's source names the columns used.
    group_by: fields of the runs' ``plan.json`` entries (``N``, ``seed``…) that label their bootstrap
    groups (`RunTable.with_groups`).
    """
    if params not in PARAMS or flops not in (None, *FLOPS):
        raise ValueError(f"params must be one of {', '.join(PARAMS)} and flops one of {', '.join(FLOPS)}, "
                         f"got {params!r} and {flops!r}")
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such sweep directory")
    root = path / "runs" if (path / "runs").is_dir() else path
    run_dirs = sorted(p.parent for p in root.glob("*/final.json"))
    planned = load_json(path / "plan.json")["runs"] if (path / "plan.json").is_file() else None
    if planned is not None:  # the plan's runs only: a held-out run (`jaxformer.sweep.verify`) is not the sweep's
        budgets = {r["name"]: r.get("budget") for r in planned}
        run_dirs = [d for d in run_dirs if d.name in budgets]
        planned_rule = next((r["flops_rule"] for r in planned if r.get("flops_rule")), None)
        if flops is None:
            flops = planned_rule or "exact"
        elif planned_rule not in (None, flops) and any(r.get("budget") is not None for r in planned):
            raise ValueError(f"--flops {flops}: {path} planned its IsoFLOP budgets in {planned_rule} FLOPs, and "
                             f"the runs of one budget share its compute only when counted that way; fit with "
                             f"--flops {planned_rule}")
    elif group_by:
        raise ValueError(f"{path}: bootstrap groups are read from plan.json, and there is none")
    flops = flops or "exact"
    if not run_dirs:
        raise ValueError(f"{path}: no run sub-directories with final.json")
    records = [final_record(d / "final.json") for d in run_dirs]
    if None in records:  # not a finished run's (`jaxformer.sweep.runs`), though its run finished once: never fitted
        damaged = run_dirs[records.index(None)] / "final.json"
        raise ValueError((DAMAGED if planned is not None else NOT_FINISHED).format(final=damaged, why=damage(damaged)))
    if planned is not None and all(budgets[d.name] is not None for d in run_dirs):  # budgets live in the plan
        for record, d in zip(records, run_dirs):
            record.setdefault("budget", budgets[d.name])
    n_col, c_col = PARAMS[params], FLOPS[flops]
    source = f"{path} (N: {n_col}, C: {c_col})"
    table = columns_table(records_to_columns(records, path), source, N=n_col, C=c_col, loss=loss_col)
    if group_by:
        entries = {r["name"]: r for r in planned}
        missing = [field for field in group_by if field not in entries[run_dirs[0].name]]
        if missing:
            raise ValueError(f"{path}: plan.json's runs have no field {missing[0]!r} to group by")
        table = table.with_groups(tuple(entries[d.name][field] for field in group_by) for d in run_dirs)
    run, tokens, loss = [], [], []
    for i, d in enumerate(run_dirs):
        if not (d / CURVE_FILE).is_file():
            continue
        rows = load_jsonl(d / CURVE_FILE)
        cols = records_to_columns(rows, d / CURVE_FILE)
        t_col = find_column(list(cols), "D", None, str(d / CURVE_FILE))
        l_col = find_column(list(cols), "loss", loss_col, str(d / CURVE_FILE))
        keep = [j for j, v in enumerate(cols[l_col]) if v is not None and v == v]  # rows with a loss
        run += [i] * len(keep)
        tokens += [float(cols[t_col][j]) for j in keep]
        loss += [float(cols[l_col][j]) for j in keep]
    if not run:
        return table
    return table.with_curves(np.array(run), np.array(tokens), np.array(loss))


def write_sweep(table: RunTable, directory: str | Path) -> Path:
    """Writes ``table`` as a sweep directory that `sweep_table` reads back; returns ``directory``."""
    directory = Path(directory)
    plan = []
    for r in range(len(table)):
        name = f"run{r:03d}"
        run_dir = directory / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        record = {"params": float(table.N[r]), "params_non_embedding": float(table.N[r]), "tokens": float(table.D[r]),
                  "flops_6nd": float(table.C[r]), "flops_exact": float(table.C[r]),
                  "val_loss": float(table.loss[r])}
        (run_dir / "final.json").write_text(json.dumps(record))
        if table.has_curves:
            mine = np.flatnonzero(table.curve_run == r)
            rows = [{"step": i + 1, "tokens": float(table.curve_tokens[k]), "val_loss": float(table.curve_loss[k])}
                    for i, k in enumerate(mine)]
            (run_dir / CURVE_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
        plan.append({"name": name, "budget": None if table.budget is None else float(table.budget[r])})
    (directory / "plan.json").write_text(json.dumps({"runs": plan}))
    return directory
