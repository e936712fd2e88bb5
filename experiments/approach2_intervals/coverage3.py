"""The same question for Approach 3: does its bootstrap interval on a cover the truth, drawing runs or whole trunks?

Same simulated studies as `coverage.py` (the study's own Approach-3 law at its own (N, D), three kinds of noise
measured in its residuals). Each is fitted as the sweep fits it (4,500 starts) and bootstrapped with 1,000 resamples
drawing single runs (the sweep's default) or whole trunks (`fit.bootstrap_groups: [N, seed]`: a trunk's branches
share its stable phase). Printed per noise and method: how often the 95% interval covers the true a, the median
width, and the spread of the point estimate over the studies.

Usage: python experiments/approach2_intervals/coverage3.py [STUDIES [STUDY]]   (output: coverage3_STUDY.txt)
"""

import sys
from pathlib import Path

import numpy as np

from coverage import HERE, Tee, load, noise_models, table
from jaxformer.scaling.allocation import load_law
from jaxformer.scaling.bootstrap import bootstrap_parametric
from jaxformer.scaling.parametric import fit_parametric


def simulate(study: Path, studies: int, out) -> None:
    cols = load(study)
    _, law = load_law(study / "fit.json", "3")  # Approach 3's law with the study's FLOPs per token
    print(f"law (Approach 3 on {study.name}): true a = {law.a:.4f}; {len(cols['N'])} runs, "
          f"{len(np.unique(cols['trunk']))} trunks; {studies} studies per noise", file=out)
    print(f"{'noise':<8}{'method':<10}{'covered':>9}{'median width':>14}{'point spread':>14}{'median a':>10}",
          file=out, flush=True)
    for name, draw in noise_models(cols, law, out).items():
        rng = np.random.default_rng(0)
        points, results = [], {"runs": [], "trunks": []}
        for s in range(studies):
            y = law.loss(cols["N"], cols["D"]) * np.exp(draw(rng))
            fit = fit_parametric(table(cols, y, False))
            points.append(fit.law.a)
            for method, grouped in (("runs", False), ("trunks", True)):
                a = bootstrap_parametric(table(cols, y, grouped), fit, resamples=1000, seed=s).stats["a"]
                results[method].append((a.low <= law.a <= a.high, a.high - a.low))
        spread = np.subtract(*np.percentile(points, [97.5, 2.5]))
        for method, rows in results.items():
            covered, widths = np.mean([r[0] for r in rows]), np.median([r[1] for r in rows])
            print(f"{name:<8}{method:<10}{covered:>8.0%} {widths:>13.3f} {spread:>13.3f}{np.median(points):>10.4f}",
                  file=out, flush=True)


if __name__ == "__main__":
    name = sys.argv[2] if len(sys.argv) > 2 else "cpu_chinchilla_ladder_beta2_wide_icx"
    with (HERE / f"coverage3_{name}.txt").open("w") as f:
        simulate(HERE.parent / name, int(sys.argv[1]) if len(sys.argv) > 1 else 100, Tee(sys.stdout, f))
