"""The sweep's last step: fit its results (Chinchilla Approaches 2 and/or 3) and report the allocation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from jaxformer.files import write_all_atomic
from jaxformer.sweep.spec import FitSpec
from jaxformer.train.interrupts import deferred_interrupt

if TYPE_CHECKING:
    from jaxformer.scaling.report import FitReport
    from jaxformer.scaling.table import RunTable


def fit_sweep(out: Path, rows: list[dict], spec: FitSpec) -> tuple[str, FitReport | None]:
    """Fits the finished runs, writes ``fit/`` and returns the text for the user (the law, the seed noise,
    the compute-optimal allocation) with the fit. ``fit/`` is written whole, ``fit.json`` with its figures, or
    not at all: a Ctrl-C while the fit is computed or drawn leaves it as it was, one as they are written waits
    for their end (`jaxformer.train.interrupts.deferred_interrupt`).

    A fit that the results cannot support (too few finished runs, one budget) writes nothing
    and returns one line and None; the trained runs are kept either way.
    """
    from jaxformer.sweep.table import sweep_table

    done = [row for row in rows if row["status"] == "done"]
    try:
        flops = spec.flops or (done[0]["flops_rule"] if done else "exact")
        table = sweep_table(out, params=spec.params, flops=flops, group_by=spec.bootstrap_groups)
    except ValueError as error:
        return f"fit skipped ({len(done)} finished runs): {error}", None
    return fit_and_write(table, done, spec, out / "fit")


def fit_and_write(table: RunTable, done: list[dict], spec: FitSpec, directory: Path) -> tuple[str, FitReport | None]:
    """`fit_sweep` on a table of the finished runs ``done`` (their results rows): the approaches of
    ``spec``, each on its own, then fit.json and the figures in ``directory``."""
    from jaxformer.scaling.allocation import allocate
    from jaxformer.scaling.plots import render_all
    from jaxformer.scaling.report import fit_table, jsonable

    settings = {"resamples": spec.bootstrap, "resample2": spec.approach2_resample}
    report, skipped = None, []
    for approach in sorted({str(a) for a in spec.approaches}, reverse=True):
        try:
            fitted = fit_table(table, approach, **settings)
        except ValueError as error:  # one approach the runs cannot support leaves the others standing
            skipped.append(f"Approach {approach} skipped: {error}")
            continue
        if report is None:
            report = fitted
        report.approach1 = report.approach1 or fitted.approach1
        report.approach2 = report.approach2 or fitted.approach2
        report.approach3 = report.approach3 or fitted.approach3
        report.bootstrap3 = report.bootstrap3 or fitted.bootstrap3
    if report is None:
        return f"fit skipped ({len(done)} finished runs): {'; '.join(skipped)}", None
    report.notes += skipped
    budgets = np.geomspace(table.C.min(), table.C.max() * 100, 5)
    noise = seed_noise(done)
    lines = ["", report.text(), *([noise] if noise else []), "\ncompute-optimal allocation:",
             f"  {'law':<12}{'C (FLOPs)':>12}{'N_opt':>12}{'D_opt':>12}{'D/N':>8}{'loss':>8}"]
    allocations = {}
    for label, law in report.laws().items():
        allocations[label] = allocate(law, budgets).rows()
        for row in allocations[label]:
            loss = "" if row["loss"] is None else f"{row['loss']:.3f}"
            lines.append(f"  {label:<12}{row['flops']:>12.3g}{row['N_opt']:>12.4g}{row['D_opt']:>12.4g}"
                         f"{row['tokens_per_param']:>8.1f}{loss:>8}")
    fit_json = (json.dumps(jsonable({**report.to_dict(), "allocation": allocations}), indent=1) + "\n").encode()
    figures = render_all(report.figures(), directory)  # seconds of drawing, with nothing written
    with deferred_interrupt():  # a Ctrl-C waits for the writes: fit/ whole, or as it was (absent on a first fit)
        (directory / "verify.json").unlink(missing_ok=True)  # it judged the fit this one replaces (verify.py)
        directory.mkdir(exist_ok=True)
        write_all_atomic({directory / "fit.json": fit_json, **figures})  # fit.json first: a directory there stops all
    lines.append(f"\nwrote {directory / 'fit.json'} and {len(figures)} figures to {directory}")
    return "\n".join(lines), report


def _seed_groups(rows: list[dict]) -> list[np.ndarray]:
    """The final losses of each shape and budget trained with several seeds among the finished ``rows``."""
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if row["status"] == "done":
            groups.setdefault((row["N"], row["D"]), []).append(float(row["loss"]))
    return [np.asarray(losses) for losses in groups.values() if len(losses) > 1]


def seed_spreads(rows: list[dict]) -> list[float]:
    """The final loss's standard deviation across seeds over its mean, for each shape and budget trained with
    several seeds (the sweep's ``seeds`` or ``isoflop.repeat``) among the finished ``rows``."""
    return [float(np.std(losses, ddof=1) / np.mean(losses)) for losses in _seed_groups(rows)]


def pooled_seed_noise(rows: list[dict]) -> tuple[float, int] | None:
    """One run's relative standard deviation from its seed alone, pooled over every shape with seed repeats,
    and the degrees of freedom of that estimate: ``(sqrt(Σ (n_i − 1)·s_i² / Σ (n_i − 1)), Σ (n_i − 1))``, s_i a
    shape's relative standard deviation over its n_i seeds. None without repeats.

    The pooled variance is unbiased for σ²; the median of the shapes' s_i underestimates σ (with two seeds each
    s_i is σ·|z|, z standard normal, whose median is 0.674σ)."""
    groups = _seed_groups(rows)
    if not groups:
        return None
    degrees = np.array([len(losses) - 1 for losses in groups])
    variances = np.square(seed_spreads(rows))
    return float(np.sqrt(np.sum(degrees * variances) / np.sum(degrees))), int(np.sum(degrees))


def seed_noise(rows: list[dict]) -> str | None:
    """A line on how much the final loss moves with the seed alone (`pooled_seed_noise`, `seed_spreads`), or None
    when no shape was trained with several seeds."""
    spreads = seed_spreads(rows)
    if not spreads:
        return None
    pooled, degrees = pooled_seed_noise(rows)
    return (f"seed noise: {len(spreads)} shapes trained with several seeds; the final loss's standard deviation "
            f"across seeds is {100 * pooled:.2f}% of its mean (pooled over the shapes, {degrees} degrees of "
            f"freedom; median {100 * np.median(spreads):.2f}%, largest {100 * max(spreads):.2f}%)")
