"""Why the law misses the held-out run by −1.44%: E's profile, and the per-shape residuals beside it.

    python experiments/cpu_chinchilla_ladder_zen4/heldout_analysis.py

Reads this folder's results.csv (the 70 runs the committed fit used), fit.json and verify.json (the held-out
runs at 3e13: the compute-optimal one and, since session 12, its neighbours at 0.5× and 2× N_opt), and writes
heldout_analysis.json and heldout_analysis.png. Two questions, answered from the data already taken:

1. The E profile: with log E held at each value of a grid, Approach 3 is refitted over (log A, log B, α, β)
   from the same 4,500-start grid. What does each fit cost in-sample (the Huber objective), what does it
   predict for the held-out run, and what allocation exponent a (N_opt ∝ C^a, exact FLOPs) does it give?
2. The residuals by shape: log(measured / law) of every run, grouped by model size N. This shows whether the
   in-sample misfit is noise, or offsets that a size carries to every budget.
"""

import json
from pathlib import Path

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from jaxformer.scaling import lbfgs
from jaxformer.scaling.allocation import FlopsPerToken, ParametricLaw
from jaxformer.scaling.parametric import HUBER_DELTA, hoffmann_grid, log_data, value_and_grad
from jaxformer.scaling.table import load_table

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).resolve().parent
E_GRID = np.round(np.arange(0.55, 0.951, 0.025), 3)


def fixed_e(x_Q, weights_Y, data):
    """`value_and_grad` with log E held where it starts (its gradient zeroed, so L-BFGS never moves it)."""
    value, grad = value_and_grad(x_Q, weights_Y, data)
    return value, grad.at[2].set(0.0)


def law_loss(x, N, D):
    log_a, log_b, log_e, alpha, beta = x
    return np.exp(log_e) + np.exp(log_a) / N**alpha + np.exp(log_b) / D**beta


def main() -> None:
    table = load_table(HERE / "results.csv")
    verify = json.loads((HERE / "verify.json").read_text())
    fit = json.loads((HERE / "fit.json").read_text())["approach3"]
    data = log_data(table, HUBER_DELTA)
    grid = hoffmann_grid()
    starts = np.unique(np.delete(grid, 2, axis=1), axis=0)  # the grid's (log A, log B, α, β) combinations
    held_N, held_D, measured = verify["N"], verify["D"], verify["measured_loss"]
    flops = FlopsPerToken.fit(table.N, table.D, table.C)  # exact FLOPs, as the committed fit's allocation

    profile = []
    for E in E_GRID:
        x0 = np.insert(starts, 2, np.log(E), axis=1)
        sol = lbfgs.minimize(fixed_e, x0, np.ones((len(x0), len(table))), data)
        f = np.where(np.isfinite(sol.f), sol.f, np.inf)
        best = int(np.argmin(f))
        x = np.asarray(sol.x[best])
        residual = np.log(table.loss) - np.log(law_loss(x, table.N, table.D))
        predicted = float(law_loss(x, held_N, held_D))
        profile.append({"E": float(E), "objective": float(f[best]), "alpha": float(x[3]), "beta": float(x[4]),
                        "a": ParametricLaw.from_log_params(x, flops).a, "rms_log_residual": float(np.sqrt(np.mean(residual**2))),
                        "heldout_predicted": predicted, "heldout_error": measured / predicted - 1})
        print(f"E {E:.3f}: objective {f[best]:.3e}, a {profile[-1]['a']:.3f}, "
              f"held-out {predicted:.4f} ({profile[-1]['heldout_error']:+.2%})", flush=True)

    x_fit = np.array([fit["log_params"][k] for k in ("log_A", "log_B", "log_E", "alpha", "beta")])
    residual = np.log(table.loss) - np.log(law_loss(x_fit, table.N, table.D))
    by_size = {}
    for n, r in zip(table.N, residual):
        by_size.setdefault(int(n), []).append(float(r))
    sizes = {str(n): {"runs": len(rs), "mean": float(np.mean(rs)), "min": float(min(rs)), "max": float(max(rs)),
                      "same_sign": int(max(sum(r > 0 for r in rs), sum(r < 0 for r in rs)))}
             for n, rs in sorted(by_size.items())}
    means = np.array([v["mean"] for v in sizes.values()])
    within = residual - np.array([np.mean(by_size[int(n)]) for n in table.N])  # each run against its size's mean
    heldout = [verify, *verify.get("neighbours", [])]  # the compute-optimal run, then N_opt's neighbours
    errors = [run["relative_error"] for run in heldout]
    report = {
        "heldout": [{"N": run["N"], "D": run["D"], "measured": run["measured_loss"],
                     "predicted": run["predicted"]["loss"], "error": run["relative_error"]} for run in heldout],
        "heldout_mean_error": float(np.mean(errors)), "heldout_mean_abs_error": float(np.mean(np.abs(errors))),
        "fit": {"E": fit["params"]["E"], "objective": fit["objective"], "a": fit["a"]},
        "residuals": {"rms": float(np.sqrt(np.mean(residual**2))), "rms_of_size_means": float(np.sqrt(np.mean(means**2))),
                      "rms_within_size": float(np.sqrt(np.mean(within**2))), "by_size": sizes},
        "e_profile": profile,
    }
    (HERE / "heldout_analysis.json").write_text(json.dumps(report, indent=1) + "\n")

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    es = [p["E"] for p in profile]
    left.plot(es, [p["objective"] / fit["objective"] for p in profile], "o-", label="objective / best fit's")
    left.set_xlabel("E held at"), left.set_ylabel("in-sample objective (relative)")
    twin = left.twinx()
    twin.plot(es, [100 * p["heldout_error"] for p in profile], "s--", color="C1", label="held-out error (%)")
    twin.axhline(0, color="grey", lw=0.5), twin.axhspan(-1, 1, color="C1", alpha=0.1)
    twin.set_ylabel("measured / predicted − 1 (%)")
    left.axvline(fit["params"]["E"], color="grey", ls=":")
    left.set_title("Approach 3 with E held fixed")
    right.axhline(0, color="grey", lw=0.5)
    for n, rs in sorted(by_size.items()):
        right.plot([n] * len(rs), 100 * np.array(rs), "o", color="C0", alpha=0.5)
    right.plot([run["N"] for run in heldout],
               [100 * np.log(run["measured_loss"] / run["predicted"]["loss"]) for run in heldout], "*", color="C3",
               ms=12, label="held-out runs at 3e13")
    right.set_xscale("log"), right.set_xlabel("N (parameters)"), right.set_ylabel("log(measured / law) (%)")
    right.set_title("residuals of the committed fit, by size"), right.legend()
    fig.tight_layout()
    fig.savefig(HERE / "heldout_analysis.png", dpi=100)


if __name__ == "__main__":
    main()
