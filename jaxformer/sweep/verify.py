"""The held-out check of a fitted law (the sweep's ``verify:``): train the compute-optimal run it predicts
at a budget beyond the sweep's, and compare the loss it reaches with the loss the law predicted.

The run is planned after the fit, from the fit alone: its budget is ``verify.budget`` or
``verify.factor`` × the largest budget, counted as the fit counts FLOPs; its size the fitted
approach's N_opt there, shaped by the sweep's rule (counting parameters as the fit does); its
tokens those of the budget. ``verify.sizes`` adds neighbours (multiples of N_opt) at the same
budget, whose losses locate the measured optimum. Each size trains at every seed of
``verify.seeds`` (by default the sweep's): the law fitted on those seeds predicts their mean loss,
so the mean is what is measured. Approach 3's law predicts each size's final validation loss at its
shaped N and the D it trains on, and each bootstrap resample's law gives the interval: how well the
law's mean loss there is known. The mean of k runs also carries their seeds' noise, so where the
sweep trained seed repeats (``seeds:`` or ``isoflop.repeat``) a prediction interval adds that noise
(one run's relative standard deviation from its seed, pooled over the sweep's repeated shapes, over
√k) to each resample's loss; since that standard deviation is itself estimated, from ν degrees of
freedom, each draw scales it by √(ν/χ²_ν), which makes the noise Student's t with ν degrees of
freedom (a few repeated shapes give a much wider interval than many). The runs live with the others (``runs/verify-…``) but are not in
``plan.json``, so no table or fit of the sweep reads them; ``fit/verify.json`` records the comparison.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from jaxformer.files import write_bytes_atomic
from jaxformer.scaling.bootstrap import percentiles, sample_laws
from jaxformer.scaling.report import FitReport, jsonable
from jaxformer.sweep.fit import pooled_seed_noise
from jaxformer.sweep.plan import PlannedRun, plan_run
from jaxformer.sweep.runs import RunPaths
from jaxformer.sweep.spec import SweepSpec
from jaxformer.train.final import final_record

TOLERANCE = 0.01  # the relative error within which a prediction counts as met
NOISE_DRAWS = 64  # seed-noise draws per bootstrap law in the prediction interval


def plan_verify(spec: SweepSpec, runs: list[PlannedRun], report: FitReport) -> list[PlannedRun]:
    """The held-out runs at the verify budget: ``verify.sizes`` multiples of the fitted ``verify.approach``'s
    N_opt there, each at every seed of ``verify.seeds`` (the compute-optimal size first, a size's seeds
    together; multiples the size rule maps to one shape train once)."""
    verify, fit = spec.verify, spec.fit
    laws = report.laws()
    missing = sorted({f"Approach {verify.approach}", "Approach 3"} - set(laws))
    if missing:
        raise ValueError(f"the fit has no {' or '.join(missing)}, which the held-out run needs")
    rule = fit.flops or runs[0].flops_rule
    largest = max(run.C_exact if rule == "exact" else run.C_6nd for run in runs)
    budget = verify.budget or verify.factor * (max(run.budget for run in runs) if spec.isoflop else largest)
    n_opt = float(laws[f"Approach {verify.approach}"].n_opt(budget))
    if not (np.isfinite(n_opt) and n_opt > 0):  # e.g. an Approach 3 law whose loss does not fall with N
        raise ValueError(f"the fitted Approach {verify.approach} gives no compute-optimal size at C = {budget:.3g} "
                         f"(N_opt {n_opt:g}), so there is no held-out run to train")
    shape = dataclasses.replace(spec.shape, count=fit.params)
    planned: dict[str, PlannedRun] = {}
    for multiple in sorted(verify.sizes, key=lambda m: (m != 1, m)):
        for seed in verify.seeds or spec.seeds:
            run = plan_run(spec, budget, multiple * n_opt, seed, rule=rule, isoflop=True, shape=shape,
                           prefix="verify-")
            planned.setdefault(run.name, run)
    return list(planned.values())


def predict(report: FitReport, N: float, D: float, noise: float | None = None, runs: int = 1,
            noise_degrees: int | None = None) -> dict:
    """Approach 3's loss at (N, D) with its bootstrap percentile interval, and with ``noise`` (one run's
    relative standard deviation) the prediction interval for the mean of ``runs`` runs (seeds): each
    resample's loss times 1 + noise·t/√runs, t standard normal where ``noise`` is known (``noise_degrees``
    None) and Student's t with ``noise_degrees`` degrees of freedom where it was estimated from them.
    Intervals are None without a bootstrap (or without ``noise``)."""
    point = float(report.approach3.law.loss(N, D))
    interval = prediction = None
    if report.bootstrap3 is not None:
        losses = sample_laws(report.bootstrap3.samples, report.approach3.law.flops).loss(N, D).ravel()
        losses = losses[np.isfinite(losses)]
        interval = [float(v) for v in np.percentile(losses, percentiles(report.level))]
        if noise is not None:
            rng = np.random.default_rng(0)
            t = rng.standard_normal((losses.size, NOISE_DRAWS))
            if noise_degrees is not None:  # z / sqrt(χ²_ν / ν) is Student's t with ν degrees of freedom
                t *= np.sqrt(noise_degrees / rng.chisquare(noise_degrees, t.shape))
            means = losses[:, None] * (1 + noise / np.sqrt(runs) * t)
            prediction = [float(v) for v in np.percentile(means, percentiles(report.level))]
    return {"loss": point, "interval": interval, "level": report.level, "seed_noise": noise,
            "seed_noise_degrees": noise_degrees, "prediction_runs": runs, "prediction_interval": prediction}


def inside(measured: float, low_high: list[float] | None) -> bool | None:
    """Whether ``measured`` lies in the closed interval ``low_high``; None when there is no interval."""
    return None if low_high is None else bool(low_high[0] <= measured <= low_high[1])


def compare_held_out(out: Path, repeats: list[PlannedRun], report: FitReport, spec: SweepSpec,
             noise: tuple[float, int] | None) -> dict:
    """One held-out size's measured final loss, the mean over its ``repeats`` (its runs, one per seed), against
    Approach 3's prediction for its N and D; ``noise``: the seed noise and its degrees of freedom
    (`pooled_seed_noise`). ``run`` names the first seed's run, ``runs`` all of them."""
    run = repeats[0]
    N = run.N if spec.fit.params == "total" else run.N_non_embedding
    sigma, degrees = noise or (None, None)
    prediction = predict(report, N, run.D, sigma, len(repeats), degrees)
    losses = [float(final_record(RunPaths(out, each.name).final)["val_loss"]) for each in repeats]  # done runs
    measured = float(np.mean(losses))
    error = measured / prediction["loss"] - 1
    return {"run": run.name, "runs": [each.name for each in repeats], "seeds": [each.seed for each in repeats],
            "losses": losses, "relative_errors": [loss / prediction["loss"] - 1 for loss in losses],
            "N": N, "D": run.D, "tokens_per_param": run.D / N, "predicted": prediction,
            "measured_loss": measured, "relative_error": error, "within_tolerance": bool(abs(error) <= TOLERANCE),
            "inside_interval": inside(measured, prediction["interval"]),
            "inside_prediction_interval": inside(measured, prediction["prediction_interval"])}


def measured_optimum(compared: list[dict]) -> float | None:
    """N_opt from a parabola in ln N through the held-out runs' losses, when three or more sizes bracket it."""
    if len(compared) < 3:
        return None
    u = np.log([c["N"] for c in compared])
    p2, p1, _ = np.polyfit(u, [c["measured_loss"] for c in compared], 2)
    vertex = -p1 / (2 * p2) if p2 > 0 else np.nan
    return float(np.exp(vertex)) if u.min() < vertex < u.max() else None


def verify_runs(out: Path, held_out: list[PlannedRun], report: FitReport, spec: SweepSpec,
                rows: list[dict]) -> tuple[dict, str]:
    """Compares the finished held-out runs, each size's seeds averaged, with the law (and, where the sweep's
    results ``rows`` hold seed repeats, with the prediction interval for that many runs); writes
    ``fit/verify.json``; returns it and its lines.

    The top level describes the compute-optimal size; ``neighbours`` the other sizes; ``measured_n_opt``
    the optimum their losses locate (None unless three sizes bracket it) against ``predicted_n_opt``.
    """
    noise = pooled_seed_noise(rows)
    sizes: dict[tuple[int, int], list[PlannedRun]] = {}
    for run in held_out:
        sizes.setdefault((run.N, run.D), []).append(run)
    main, *others = [compare_held_out(out, repeats, report, spec, noise) for repeats in sizes.values()]
    run = held_out[0]
    predicted_n_opt = float(report.laws()[f"Approach {spec.verify.approach}"].n_opt(run.budget))
    result = {**main, "approach": spec.verify.approach, "budget": run.budget, "C": run.C, "tolerance": TOLERANCE,
              "predicted_n_opt": predicted_n_opt, "neighbours": others,
              "measured_n_opt": measured_optimum(sorted([main, *others], key=lambda c: c["N"]))}
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
    with_noise, k = predicted["prediction_interval"], len(compared["runs"])
    if with_noise is not None:
        where += (f"; {'inside' if compared['inside_prediction_interval'] else 'outside'} the {100 * level:.0f}% "
                  f"prediction interval for {'one run' if k == 1 else f'the mean of {k} runs'} "
                  f"[{with_noise[0]:.4f}, {with_noise[1]:.4f}] (seed noise {100 * predicted['seed_noise']:.2f}%, "
                  f"{predicted['seed_noise_degrees']} degrees of freedom)")
    runs = (f"run {compared['run']}" if k == 1 else
            f"runs {', '.join(compared['runs'])} (each {', '.join(f'{e:+.2%}' for e in compared['relative_errors'])})")
    return (f"held-out {runs} (N = {compared['N']:,}, D = {compared['D']:.3g}): {'mean ' * (k > 1)}loss "
            f"{compared['measured_loss']:.4f} against {predicted['loss']:.4f} predicted by Approach 3, "
            f"{100 * error:+.2f}% ({'within' if compared['within_tolerance'] else 'beyond'} {100 * TOLERANCE:.0f}%), "
            f"{where}")
