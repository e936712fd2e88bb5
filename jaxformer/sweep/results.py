"""A sweep's table of runs — N, D, C, final losses, status — that the fits read as is (`jaxformer results`)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from jaxformer.files import read_json
from jaxformer.sweep.runs import RunPaths
from jaxformer.train.final import damage, final_record

COLUMNS = ("run", "status", "N", "N_non_embedding", "D", "C", "C_exact", "C_6nd", "flops_rule", "budget",
           "tokens_per_param", "loss", "train_loss", "val_bits_per_byte", "epochs", "seed", "wall_s", "reason")


# {why}: `jaxformer.train.final.damage`, e.g. "val_loss is nan, not a finite number"
NOT_FINISHED = "{final} holds no finished run's record: {why}"
DAMAGED = NOT_FINISHED + "; a relaunch trains it again"  # a sweep's run


def load_plan(sweep_dir: Path) -> list[dict]:
    plan = sweep_dir / "plan.json"
    if not plan.is_file():
        raise FileNotFoundError(f"not a sweep directory (no plan.json): {sweep_dir}")
    runs = read_json(plan).get("runs")
    fields = ("name", "N", "N_non_embedding", "D", "C", "budget", "seed")
    if not (isinstance(runs, list) and all(isinstance(run, dict) and all(f in run for f in fields) for run in runs)):
        raise ValueError(f"{plan}: not a sweep's plan (a list of runs, each with {', '.join(fields)})")
    return runs


def collect(sweep_dir: Path) -> list[dict]:
    """One row per planned run; finished runs carry their measured losses (``loss`` = final validation loss), failed
    and damaged ones the reason."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for planned in load_plan(sweep_dir):
        paths = RunPaths(sweep_dir, planned["name"])
        state = paths.state()
        final = (final_record(paths.final) if state == "done" else None) or {}
        status = read_json(paths.status)
        reasons = {"failed": status.get("reason", "")}
        if state == "damaged":
            reasons["damaged"] = DAMAGED.format(final=paths.final, why=damage(paths.final))
        row = {
            "run": planned["name"], "status": state, "N": planned["N"], "N_non_embedding": planned["N_non_embedding"],
            "D": final.get("tokens", planned["D"]), "C": planned["C"], "C_exact": planned.get("C_exact"),
            "C_6nd": planned.get("C_6nd"), "flops_rule": planned.get("flops_rule", "6ND"), "budget": planned["budget"],
            "tokens_per_param": planned["D"] / planned["N"], "loss": final.get("val_loss"),
            "train_loss": final.get("train_loss"), "val_bits_per_byte": final.get("val_bits_per_byte"),
            "epochs": final.get("epochs"), "seed": planned["seed"], "wall_s": final.get("wall_s", status.get("wall_s")),
            "reason": reasons.get(state, ""),
        }
        rows.append(row)
    return rows


def render(rows: list[dict], fmt: str) -> bytes:
    """The table as ``csv``, ``json`` (a list of records) or ``parquet`` bytes."""
    if fmt == "json":
        return (json.dumps(rows, indent=1) + "\n").encode()
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({key: ("" if row[key] is None else row[key]) for key in COLUMNS} for row in rows)
        return buffer.getvalue().encode()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buffer)
        return buffer.getvalue()
    raise ValueError(f"--format must be csv, parquet or json, got {fmt!r}")

