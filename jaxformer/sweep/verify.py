"""The held-out check of a fitted law (the sweep's ``verify:``): train the compute-optimal run it predicts
at a budget beyond the sweep's, and compare the loss it reaches with the loss the law predicted.

The run is planned after the fit, from the fit alone: its budget is ``verify.budget`` or
``verify.factor`` × the largest budget, counted as the fit counts FLOPs; its size the fitted
approach's N_opt there, shaped by the sweep's rule (counting parameters as the fit does); its
tokens those of the budget. ``verify.sizes`` adds neighbours (multiples of N_opt) at the same
budget, whose losses locate the measured optimum. Approach 3's law predicts each run's final
validation loss at its shaped N and the D it trains on, and each bootstrap resample's law gives
the interval. The runs live with the others (``runs/verify-…``) but are not in ``plan.json``, so no
table or fit of the sweep reads them; ``fit/verify.json`` records the comparison.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from jaxformer.files import write_bytes_atomic
from jaxformer.scaling.bootstrap import percentiles, sample_laws
from jaxformer.scaling.report import FitReport, jsonable
from jaxformer.sweep.plan import PlannedRun, plan_run
from jaxformer.sweep.runs import RunPaths, read_json
from jaxformer.sweep.spec import SweepSpec

TOLERANCE = 0.01  # the relative error within which a prediction counts as met


def plan_verify(spec: SweepSpec, runs: list[PlannedRun], report: FitReport) -> list[PlannedRun]:
    """The held-out runs at the verify budget: ``verify.sizes`` multiples of the fitted ``verify.approach``'s
    N_opt there (the compute-optimal run first; multiples the size rule maps to one shape train once)."""
    verify, fit = spec.verify, spec.fit
    laws = report.laws()
    missing = sorted({f"Approach {verify.approach}", "Approach 3"} - set(laws))
    if missing:
        raise ValueError(f"the fit has no {' or '.join(missing)}, which the held-out run needs")
    rule = fit.flops or runs[0].flops_rule
    largest = max(run.C_exact if rule == "exact" else run.C_6nd for run in runs)
    budget = verify.budget or verify.factor * (max(run.budget for run in runs) if spec.isoflop else largest)
    n_opt = float(laws[f"Approach {verify.approach}"].n_opt(budget))
    shape = dataclasses.replace(spec.shape, count=fit.params)
    planned: dict[str, PlannedRun] = {}
    for multiple in sorted(verify.sizes, key=lambda m: (m != 1, m)):
        run = plan_run(spec, budget, multiple * n_opt, verify.seed, rule=rule, isoflop=True, shape=shape,
                       prefix="verify-")
        planned.setdefault(run.name, run)
    return list(planned.values())


def predict(report: FitReport, N: float, D: float) -> dict:
    """Approach 3's loss at (N, D) with its bootstrap percentile interval (None without a bootstrap)."""
    point = float(report.approach3.law.loss(N, D))
    interval = None
    if report.bootstrap3 is not None:
        losses = sample_laws(report.bootstrap3.samples, report.approach3.law.flops).loss(N, D).ravel()
        interval = [float(v) for v in np.percentile(losses[np.isfinite(losses)], percentiles(report.level))]
    return {"loss": point, "interval": interval, "level": report.level}


def _compare(out: Path, run: PlannedRun, report: FitReport, spec: SweepSpec) -> dict:
    """One held-out run's measured final loss against Approach 3's prediction for its N and D."""
    N = run.N if spec.fit.params == "total" else run.N_non_embedding
    prediction = predict(report, N, run.D)
    measured = float(read_json(RunPaths(out, run.name).final)["val_loss"])
    error = measured / prediction["loss"] - 1
    low_high = prediction["interval"]
    return {"run": run.name, "N": N, "D": run.D, "tokens_per_param": run.D / N, "predicted": prediction,
            "measured_loss": measured, "relative_error": error, "within_tolerance": bool(abs(error) <= TOLERANCE),
            "inside_interval": None if low_high is None else bool(low_high[0] <= measured <= low_high[1])}


def _measured_optimum(compared: list[dict]) -> float | None:
    """N_opt from a parabola in ln N through the held-out runs' losses, when three or more sizes bracket it."""
    if len(compared) < 3:
        return None
    u = np.log([c["N"] for c in compared])
    p2, p1, _ = np.polyfit(u, [c["measured_loss"] for c in compared], 2)
    vertex = -p1 / (2 * p2) if p2 > 0 else np.nan
    return float(np.exp(vertex)) if u.min() < vertex < u.max() else None


def verify_runs(out: Path, held_out: list[PlannedRun], report: FitReport, spec: SweepSpec) -> tuple[dict, str]:
    """Compares the finished held-out runs with the law; writes ``fit/verify.json``; returns it and its lines.

    The top level describes the compute-optimal run; ``neighbours`` the other sizes; ``measured_n_opt``
    the optimum their losses locate (None unless three sizes bracket it) against ``predicted_n_opt``.
    """
    main, *others = [_compare(out, run, report, spec) for run in held_out]
    run = held_out[0]
    predicted_n_opt = float(report.laws()[f"Approach {spec.verify.approach}"].n_opt(run.budget))
    result = {**main, "approach": spec.verify.approach, "budget": run.budget, "C": run.C, "tolerance": TOLERANCE,
              "predicted_n_opt": predicted_n_opt, "neighbours": others,
              "measured_n_opt": _measured_optimum(sorted([main, *others], key=lambda c: c["N"]))}
    directory = out / "fit"
    directory.mkdir(exist_ok=True)
    write_bytes_atomic(directory / "verify.json", (json.dumps(jsonable(result), indent=1) + "\n").encode())
    lines = [_line(c, report.level) for c in (main, *others)]
    if others:
        found = result["measured_n_opt"]
        lines.append(f"held-out optimum at C = {run.budget:.3g}: N_opt {predicted_n_opt:,.0f} predicted, "
                     + ("not bracketed by the held-out sizes" if found is None else f"{found:,.0f} measured"))
    lines.append(f"wrote {directory / 'verify.json'}")
    return result, "\n".join(lines)


def _line(compared: dict, level: float) -> str:
    predicted, low_high, error = compared["predicted"], compared["predicted"]["interval"], compared["relative_error"]
    where = ("no bootstrap interval" if low_high is None else
             f"{'inside' if compared['inside_interval'] else 'outside'} its {100 * level:.0f}% interval "
             f"[{low_high[0]:.4f}, {low_high[1]:.4f}]")
    return (f"held-out run {compared['run']} (N = {compared['N']:,}, D = {compared['D']:.3g}): loss "
            f"{compared['measured_loss']:.4f} against {predicted['loss']:.4f} predicted by Approach 3, "
            f"{100 * error:+.2f}% ({'within' if compared['within_tolerance'] else 'beyond'} {100 * TOLERANCE:.0f}%), "
            f"{where}")
