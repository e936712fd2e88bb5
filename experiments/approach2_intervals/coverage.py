"""Do Approach 2's bootstrap intervals on a cover the truth? A simulation on the long study's own design and law.

The law is Approach 3's fit to the long study at beta2 0.99 (`cpu_chinchilla_ladder_beta2_wide_icx/`, 99 runs over
nine budgets, 1e11-1e13 FLOPs, 22 trunks), with its exact-FLOPs count per token, so its a = beta/(alpha + p*beta) is
the true exponent of N_opt(C). Each simulated study draws every run's loss at the study's own (N, D) from that law,
times log-normal noise of one of three kinds, all measured in the study's residuals against the law:

- iid: every run independent, at the residuals' standard deviation;
- budget: every run independent, at its budget's own residual standard deviation (the scatter falls with compute);
- trunk: one offset per trunk (a size and seed: its branches share the stable phase), shared by the trunk's runs at
  every budget, plus independent noise within a trunk.

Each study is fitted by Approach 2 as the sweep fits it (parabola per budget, power law through the bracketed
minima), with 1,000 bootstrap resamples drawing `runs`, `residuals` (normal noise of the pooled residuals' size),
`wild` (each run's own residual with a random sign) and `wild` with one sign per trunk. Printed per noise and method:
how often the 95% interval covers the true a, the median width, and the spread of the point estimate over the
studies (its 2.5-97.5 percentile width, what a calibrated interval's width should be near).

Then each method is applied to the committed studies' own results.

Usage: python experiments/approach2_intervals/coverage.py [STUDIES [STUDY]]   (output: coverage_STUDY.txt beside it;
STUDY, a folder of experiments/, defaults to the long study above)
"""

import csv
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jaxformer.scaling.allocation import ParametricLaw, load_law
from jaxformer.scaling.isoflop import fit_isoflop
from jaxformer.scaling.table import RunTable

HERE = Path(__file__).resolve().parent
METHODS = [("runs", False), ("residuals", False), ("wild", False), ("wild", True)]
COMMITTED = ["cpu_chinchilla_ladder_beta2_wide_icx", "cpu_chinchilla_ladder_beta2_icx", "cpu_chinchilla_ladder_icx",
             "cpu_chinchilla_ladder_zen4", "cpu_chinchilla_tuned", "quick_min2_beta2_icx", "quick_beta2_icx",
             "quick_sweep_icx"]


def load(study: Path) -> dict[str, np.ndarray]:
    rows = [r for r in csv.DictReader((study / "results.csv").open()) if r["status"] == "done"]
    cols = {k: np.array([float(r[k]) for r in rows]) for k in ("N", "D", "C", "budget", "loss", "seed")}
    cols["trunk"] = np.array([f"{int(n)}-{int(s)}" for n, s in zip(cols["N"], cols["seed"])])
    return cols


def table(cols: dict[str, np.ndarray], loss: np.ndarray, grouped: bool) -> RunTable:
    t = RunTable.from_arrays(cols["N"], loss, D=cols["D"], C=cols["C"], budget=cols["budget"])
    return t.with_groups(cols["trunk"]) if grouped else t


Draw = Callable[[np.random.Generator], np.ndarray]  # one simulated study's log-noise per run


def noise_models(cols: dict[str, np.ndarray], law: ParametricLaw, out) -> dict[str, Draw]:
    """name -> draw(rng) giving one study's log-noise per run, each scaled to the study's residuals."""
    residual = np.log(cols["loss"] / law.loss(cols["N"], cols["D"]))
    sd = residual.std()
    budgets = np.unique(cols["budget"])
    by_budget = {b: residual[cols["budget"] == b].std() for b in budgets}
    per_run = np.array([by_budget[b] for b in cols["budget"]])
    trunks, trunk_of = np.unique(cols["trunk"], return_inverse=True)
    means = np.array([residual[trunk_of == k].mean() for k in range(len(trunks))])
    within = residual - means[trunk_of]
    sd_between, sd_within = means.std(), within.std() * np.sqrt(len(within) / (len(within) - len(trunks)))
    print(f"residuals against the law: sd {sd:.4f}; per budget "
          + ", ".join(f"{b:.3g}: {by_budget[b]:.4f}" for b in budgets)
          + f"; between trunks {sd_between:.4f}, within a trunk {sd_within:.4f}", file=out)
    return {
        "iid": lambda rng: sd * rng.standard_normal(len(residual)),
        "budget": lambda rng: per_run * rng.standard_normal(len(residual)),
        "trunk": lambda rng: sd_between * rng.standard_normal(len(trunks))[trunk_of]
        + sd_within * rng.standard_normal(len(residual)),
    }


def simulate(study: Path, studies: int, out) -> None:
    cols = load(study)
    _, law = load_law(study / "fit.json", "3")  # Approach 3's law with the study's FLOPs per token
    print(f"law (Approach 3 on {study.name}): E={law.E:.4f} A={law.A:.4g} B={law.B:.4g} alpha={law.alpha:.4f} "
          f"beta={law.beta:.4f}; true a = {law.a:.4f}; {len(cols['N'])} runs, {len(np.unique(cols['trunk']))} trunks",
          file=out)
    exact = fit_isoflop(table(cols, law.loss(cols["N"], cols["D"]), False)).allocation.a
    print(f"Approach 2 on the law's noiseless losses: a = {exact:.4f} (the parabolas' own bias)", file=out)
    print(f"{'noise':<8}{'method':<16}{'covered':>9}{'median width':>14}{'point spread':>14}{'median a':>10}"
          f"{'dropped':>9}", file=out)
    for name, draw in noise_models(cols, law, out).items():
        rng = np.random.default_rng(0)
        losses = [law.loss(cols["N"], cols["D"]) * np.exp(draw(rng)) for _ in range(studies)]
        points = [fit_isoflop(table(cols, y, False)).allocation.a for y in losses]
        spread = np.subtract(*np.percentile(points, [97.5, 2.5]))
        for method, grouped in METHODS:
            covered, widths, dropped = 0, [], 0
            for s, y in enumerate(losses):
                fit = fit_isoflop(table(cols, y, grouped), resamples=1000, seed=s, resample=method)
                a = fit.stats["a"]
                covered += a.low <= law.a <= a.high
                widths.append(a.high - a.low)
                dropped += len(fit.profiles) - sum(p.bracketed for p in fit.profiles)
            label = method + (" by trunk" if grouped else "")
            print(f"{name:<8}{label:<16}{covered / studies:>8.0%} {np.median(widths):>13.3f} {spread:>13.3f}"
                  f"{np.median(points):>10.4f}{dropped:>9}", file=out, flush=True)


def committed(out) -> None:
    print(f"\n{'study':<40}{'a':>7}" + "".join(f"{m + (' by trunk' if g else ''):>24}" for m, g in METHODS), file=out)
    for name in COMMITTED:
        cols = load(HERE.parent / name)
        cells = []
        for method, grouped in METHODS:
            fit = fit_isoflop(table(cols, cols["loss"], grouped), resamples=1000, seed=0, resample=method)
            a = fit.stats["a"]
            cells.append(f"[{a.low:.3f}, {a.high:.3f}] {a.high - a.low:.3f}")
        print(f"{name:<40}{fit.allocation.a:>7.3f}" + "".join(f"{c:>24}" for c in cells), file=out, flush=True)


class Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)

    def flush(self):
        for s in self.streams:
            s.flush()


if __name__ == "__main__":
    name = sys.argv[2] if len(sys.argv) > 2 else "cpu_chinchilla_ladder_beta2_wide_icx"
    with (HERE / f"coverage_{name}.txt").open("w") as f:
        out = Tee(sys.stdout, f)
        simulate(HERE.parent / name, int(sys.argv[1]) if len(sys.argv) > 1 else 200, out)
        committed(out)
