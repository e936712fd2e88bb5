"""The optimum the held-out neighbours locate, with its spread from the seed noise, against the law's N_opt and its
bootstrap interval at 3e13 FLOPs (Approach 3 refitted from results.csv as neighbours.py does).

The spread: 20,000 draws of the three sizes' mean losses, each moved by the pooled seed noise of one run over √2
(two seeds), the vertex of the parabola in ln N through each draw (draws whose vertex leaves the sizes are counted).

    python experiments/cpu_chinchilla_2seeds_wholefiles/neighbours_optimum.py
"""

import json
from pathlib import Path

import numpy as np

from jaxformer.scaling.bootstrap import sample_laws
from jaxformer.scaling.report import fit_table
from jaxformer.scaling.table import load_table
from jaxformer.sweep.verify import measured_optimum  # the vertex that verify.json's measured_n_opt is

HERE = Path(__file__).resolve().parent
BUDGET = 3e13

table = load_table(HERE / "results.csv", group_by=("N", "seed"))
report = fit_table(table, "3", resamples=1000, resample2="wild")
n_opt = np.asarray(sample_laws(report.bootstrap3.samples, report.approach3.law.flops).n_opt(BUDGET)).ravel()
n_opt = n_opt[np.isfinite(n_opt)]
print(f"law: N_opt({BUDGET:.0e}) {float(report.approach3.law.n_opt(BUDGET)):,.0f}, "
      f"95% bootstrap [{np.percentile(n_opt, 2.5):,.0f}, {np.percentile(n_opt, 97.5):,.0f}]")

sizes = json.loads((HERE / "verify_neighbours.json").read_text())["sizes"]
means = np.array([s["measured_loss"] for s in sizes])
sigma = sizes[0]["predicted"]["seed_noise"] / np.sqrt(len(sizes[0]["losses"]))
rng = np.random.default_rng(0)
vertices = np.array([np.nan if found is None else found for found in (
    measured_optimum([{"N": s["N"], "measured_loss": loss} for s, loss in
                       zip(sizes, means * (1 + sigma * rng.standard_normal(len(means))))])
    for _ in range(20000))])
inside = np.isfinite(vertices)
low, mid, high = np.percentile(vertices[inside], [2.5, 50, 97.5])
print(f"measured: N_opt {mid:,.0f} (median of the draws), 95% [{low:,.0f}, {high:,.0f}]; "
      f"bracketed by the sizes in {inside.mean():.0%} of the draws")
