"""The held-out check of a fitted law (the sweep's ``verify:``): train the compute-optimal run it predicts
at a budget beyond the sweep's, and compare the loss it reaches with the loss the law predicted.

The run is planned after the fit, from the fit alone: its budget is ``verify.budget`` or
``verify.factor`` × the largest budget, counted as the fit counts FLOPs; its size the fitted
approach's N_opt there, shaped by the sweep's rule (counting parameters as the fit does); its
tokens those of the budget. Approach 3's law predicts its final validation loss at the shaped N
and the D it trains on, and each bootstrap resample's law gives the interval. The run lives with
the others (``runs/verify-…``) but is not in ``plan.json``, so no table or fit of the sweep reads it;
``fit/verify.json`` records the comparison.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from jaxformer.files import write_bytes_atomic
from jaxformer.scaling.report import FitReport, jsonable
from jaxformer.sweep.plan import PlannedRun, plan_run
from jaxformer.sweep.runs import RunPaths, read_json
from jaxformer.sweep.spec import SweepSpec

TOLERANCE = 0.01  # the relative error within which a prediction counts as met


def plan_verify(spec: SweepSpec, runs: list[PlannedRun], report: FitReport) -> PlannedRun:
    """The held-out run at the verify budget, sized by the fitted ``verify.approach``."""
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
    return plan_run(spec, budget, n_opt, verify.seed, rule=rule, isoflop=True, shape=shape, prefix="verify-")


def predict(report: FitReport, N: float, D: float) -> dict:
    """Approach 3's loss at (N, D) with its bootstrap percentile interval (None without a bootstrap)."""
    point = float(report.approach3.law.loss(N, D))
    interval = None
    if report.bootstrap3 is not None:
        s = report.bootstrap3.samples
        losses = s["E"] + s["A"] / N ** s["alpha"] + s["B"] / D ** s["beta"]
        losses = losses[np.isfinite(losses)]
        q = 100.0 * np.array([(1 - report.level) / 2, (1 + report.level) / 2])
        interval = [float(v) for v in np.percentile(losses, q)]
    return {"loss": point, "interval": interval, "level": report.level}


def verify_run(out: Path, run: PlannedRun, report: FitReport, spec: SweepSpec) -> tuple[dict, str]:
    """Compares the finished held-out run with the prediction; writes ``fit/verify.json``; returns it and its line."""
    N = run.N if spec.fit.params == "total" else run.N_non_embedding
    prediction = predict(report, N, run.D)
    final = read_json(RunPaths(out, run.name).final)
    measured = float(final["val_loss"])
    error = measured / prediction["loss"] - 1
    low_high = prediction["interval"]
    inside = None if low_high is None else bool(low_high[0] <= measured <= low_high[1])
    budget = run.C_exact if run.flops_rule == "exact" else run.C_6nd
    result = {"run": run.name, "approach": spec.verify.approach, "budget": run.budget, "C": budget, "N": N,
              "D": run.D, "tokens_per_param": run.D / N, "predicted": prediction, "measured_loss": measured,
              "relative_error": error, "within_tolerance": bool(abs(error) <= TOLERANCE), "tolerance": TOLERANCE,
              "inside_interval": inside}
    directory = out / "fit"
    directory.mkdir(exist_ok=True)
    write_bytes_atomic(directory / "verify.json", (json.dumps(jsonable(result), indent=1) + "\n").encode())
    where = ("no bootstrap interval" if inside is None else
             f"{'inside' if inside else 'outside'} its {100 * report.level:.0f}% interval "
             f"[{low_high[0]:.4f}, {low_high[1]:.4f}]")
    line = (f"held-out run {run.name} (C = {run.budget:.3g}, N = {N:,}, D = {run.D:.3g}): loss {measured:.4f} against "
            f"{prediction['loss']:.4f} predicted by Approach 3, {100 * error:+.2f}% "
            f"({'within' if abs(error) <= TOLERANCE else 'beyond'} {100 * TOLERANCE:.0f}%), {where}; "
            f"wrote {directory / 'verify.json'}")
    return result, line
