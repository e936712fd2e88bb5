"""The sweep's last step: fit its results (Chinchilla Approaches 2 and/or 3) and report the allocation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxformer.files import write_bytes_atomic
from jaxformer.sweep.spec import FitSpec


def fit_sweep(out: Path, rows: list[dict], spec: FitSpec) -> str:
    """Fits the finished runs, writes ``fit/`` and returns the report: the law and the compute-optimal allocation.

    A fit that the results cannot support (too few finished runs, one budget) writes nothing
    and returns one line; the trained runs are kept either way.
    """
    from jaxformer.scaling.allocation import allocate
    from jaxformer.scaling.report import fit_table, jsonable
    from jaxformer.sweep.table import sweep_table

    done = [row for row in rows if row["status"] == "done"]
    try:
        flops = spec.flops or (done[0]["flops_rule"] if done else "exact")
        table = sweep_table(out, params=spec.params, flops=flops)
        approaches = sorted({str(a) for a in spec.approaches}, reverse=True)
        report = fit_table(table, approaches[0], resamples=spec.bootstrap)
        for approach in approaches[1:]:
            extra = fit_table(table, approach, resamples=spec.bootstrap)
            report.approach1 = report.approach1 or extra.approach1
            report.approach2 = report.approach2 or extra.approach2
            report.approach3 = report.approach3 or extra.approach3
    except ValueError as error:
        return f"fit skipped ({len(done)} finished runs): {error}"
    budgets = np.geomspace(table.C.min(), table.C.max() * 100, 5)
    lines = ["", report.text(), "\ncompute-optimal allocation:",
             f"  {'law':<12}{'C (FLOPs)':>12}{'N_opt':>12}{'D_opt':>12}{'D/N':>8}{'loss':>8}"]
    allocations = {}
    for label, law in report.laws().items():
        allocations[label] = allocate(law, budgets).rows()
        for row in allocations[label]:
            loss = "" if row["loss"] is None else f"{row['loss']:.3f}"
            lines.append(f"  {label:<12}{row['flops']:>12.3g}{row['N_opt']:>12.4g}{row['D_opt']:>12.4g}"
                         f"{row['tokens_per_param']:>8.1f}{loss:>8}")
    directory = out / "fit"
    directory.mkdir(exist_ok=True)
    paths = report.write_plots(directory)
    write_bytes_atomic(directory / "fit.json",
                 (json.dumps(jsonable({**report.to_dict(), "allocation": allocations}), indent=1) + "\n").encode())
    lines.append(f"\nwrote {directory / 'fit.json'} and {len(paths)} figures to {directory}")
    return "\n".join(lines)
