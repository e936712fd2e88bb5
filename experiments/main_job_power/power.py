"""How wide Approach 3's interval on a is for the main job's design, when the data follow a known law plus noise.

The law is the one fitted to the main job (`experiments/quick_sweep_spr/results.csv`, 22 runs). Each simulated sweep
draws losses at the design's (N, D) from it, with log-normal noise of one of two kinds:

- iid: every run independent, at the residuals' standard deviation (the "scale" column multiplies it);
- shape: one offset per model size (N), shared by its runs at every budget, plus independent noise within a size,
  each at the standard deviation measured in the main job's residuals.

Each sweep is fitted as the main job is (4,500 starts, 200 bootstrap resamples of runs), and the median 95%-interval
width over the sweeps is printed. Usage: python experiments/main_job_power/power.py [SWEEPS]
"""

import csv
import sys
from pathlib import Path

import numpy as np

from jaxformer.scaling.allocation import FlopsPerToken, ParametricLaw
from jaxformer.scaling.bootstrap import bootstrap_parametric
from jaxformer.scaling.parametric import fit_parametric
from jaxformer.scaling.table import RunTable

HERE = Path(__file__).resolve().parent


def load(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rows = list(csv.DictReader(path.open()))
    return tuple(np.array([float(r[k]) for r in rows]) for k in ("N", "D", "C", "loss"))


def width(N, D, C, loss) -> tuple[float, float]:
    """(a, width of its 95% interval) of the main job's Approach-3 fit to these runs."""
    table = RunTable.from_arrays(N, loss, D=D, C=C)
    fit = fit_parametric(table)
    interval = bootstrap_parametric(table, fit, resamples=200).stats["a"]
    return interval.value, interval.high - interval.low


def main(sweeps: int) -> None:
    N, D, C, loss = load(HERE.parent / "quick_sweep_spr" / "results.csv")
    fitted = fit_parametric(RunTable.from_arrays(N, loss, D=D, C=C)).law
    law = ParametricLaw(E=fitted.E, A=fitted.A, B=fitted.B, alpha=fitted.alpha, beta=fitted.beta,
                        flops=FlopsPerToken.fit(N, D, C))
    residual = np.log(loss / law.loss(N, D))
    sizes = np.unique(N)
    means = np.array([residual[N == n].mean() for n in sizes])
    repeated = np.array([(N == n).sum() > 1 for n in sizes])
    within = np.concatenate([residual[N == n] - m for n, m in zip(sizes, means) if (N == n).sum() > 1])
    sd_all, sd_between = residual.std(), means[repeated].std()
    sd_within = within.std() * np.sqrt(len(within) / (len(within) - repeated.sum()))
    print(f"law: E={law.E:.3f} A={law.A:.4g} alpha={law.alpha:.3f} B={law.B:.4g} beta={law.beta:.3f} a={law.a:.3f}; "
          f"residual sd {sd_all:.4f}, between sizes {sd_between:.4f}, within a size {sd_within:.4f}")
    fill_N, fill_D, fill_C, _ = load(HERE.parent / "quick_fill_icx" / "results.csv")
    designs = {"main job (22 runs, 9 sizes)": (N, D, C), "main job + fill (26 runs, 8 sizes)": (fill_N, fill_D, fill_C)}
    rng = np.random.default_rng(0)
    print(f"{'design':<36}{'noise':<8}{'scale':>6}{'median width':>14}{'  widths (sorted)'}")
    for name, noise, scale in [(list(designs)[0], "iid", 1.0), (list(designs)[0], "shape", 1.0),
                               (list(designs)[1], "iid", 1.0), (list(designs)[1], "shape", 1.0),
                               (list(designs)[0], "iid", 0.5), (list(designs)[0], "iid", 0.25)]:
        n, d, c = designs[name]
        widths = []
        for _ in range(sweeps):
            if noise == "iid":
                eps = scale * sd_all * rng.standard_normal(len(n))
            else:
                per_size = dict(zip(np.unique(n), sd_between * rng.standard_normal(len(np.unique(n)))))
                eps = np.array([per_size[x] for x in n]) + sd_within * rng.standard_normal(len(n))
            widths.append(width(n, d, c, law.loss(n, d) * np.exp(eps))[1])
        print(f"{name:<36}{noise:<8}{scale:>6}{np.median(widths):>14.3f}  {np.round(np.sort(widths), 3).tolist()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
