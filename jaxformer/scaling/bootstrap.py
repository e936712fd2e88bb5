"""Bootstrap uncertainty for Approach 3: refit on runs resampled with replacement.

A resample is a vector of counts over the runs (multinomial, R draws), so the refit
minimises the count-weighted objective on the original arrays: no data is copied. Every
resample starts from the point fit's optimum and from the ``starts - 1`` grid starts that
ended lowest in the point fit, and its best end point is kept: the Huber objective has
local minima, and on the Chinchilla data the point optimum alone is the best start for
only a minority of resamples. All resamples × starts run as one pool of L-BFGS jobs
(``lbfgs.minimize``).

Reported for every parameter and for a = β/(α+β), b = α/(α+β), G and the tokens per
parameter at the requested budgets: the point estimate, the standard error (standard
deviation over resamples) and the percentile interval at the requested level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer.scaling import lbfgs
from jaxformer.scaling.allocation import FlopsPerToken, ParametricLaw, budget_labels
from jaxformer.scaling.parametric import POLISH, ParametricFit, log_data, value_and_grad
from jaxformer.scaling.table import RunTable

REFERENCE_BUDGET = 5.76e23  # Chinchilla's training compute, FLOPs
RESAMPLES = 4000  # the default resample count: Besiroglu et al.'s


@dataclass(frozen=True)
class Interval:
    value: float  # point estimate
    se: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return {"value": self.value, "se": self.se, "ci": [self.low, self.high]}

    @property
    def outside(self) -> bool:
        """Whether the point estimate lies outside its own interval (the resamples mostly ended elsewhere), by more
        than 1e-6 of their size: the precision of a solver stopping on a reduction of 1e-12 (`POLISH`)."""
        values = np.array([self.value, self.low, self.high])
        slack = 1e-6 * np.max(np.abs(values))
        return bool(np.isfinite(values).all() and not self.low - slack <= self.value <= self.high + slack)


@dataclass(frozen=True)
class BootstrapResult:
    samples: dict[str, np.ndarray]  # quantity -> [resamples] values
    stats: dict[str, Interval]
    level: float
    converged: int  # resamples whose best start converged
    groups: int | None = None  # clusters drawn per resample (None: runs were drawn one by one)

    def to_dict(self) -> dict:
        return {
            "resamples": len(next(iter(self.samples.values()))),
            "groups": self.groups,
            "level": self.level,
            "converged": self.converged,
            "stats": {k: v.to_dict() for k, v in self.stats.items()},
        }


def law_quantities(law: ParametricLaw, budgets) -> dict[str, np.ndarray]:
    """Parameters and derived quantities (the tokens per parameter at each budget keyed by `budget_labels`); the
    law's fields may be ``[resamples]`` arrays (one per resample)."""
    out = {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta, "a": law.a, "b": law.b,
           "G": law.G}
    for C, label in zip(budgets, budget_labels(budgets)):
        out[f"tokens_per_param@{label}"] = law.d_opt(C) / law.n_opt(C)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def percentiles(level: float) -> np.ndarray:
    """The ``[2]`` percentiles (0–100) bounding a central interval at ``level``."""
    return 100.0 * np.array([(1 - level) / 2, (1 + level) / 2])


def sample_laws(samples: dict[str, np.ndarray], flops: FlopsPerToken) -> ParametricLaw:
    """The resampled Approach-3 laws as one law of ``[resamples, 1]`` fields (broadcast against ``[budgets]`` or
    sizes), counting compute with the fit's ``flops``."""
    return ParametricLaw(*(samples[k][:, None] for k in ("E", "A", "B", "alpha", "beta")), flops=flops)


def summarize(point: dict[str, float], samples: dict[str, np.ndarray], level: float) -> dict[str, Interval]:
    q = percentiles(level)
    stats = {}
    for k, v in samples.items():
        v = v[np.isfinite(v)]
        low, high = np.percentile(v, q) if v.size else (np.nan, np.nan)
        se = float(np.std(v, ddof=1)) if v.size > 1 else np.nan
        stats[k] = Interval(float(point[k]), se, float(low), float(high))
    return stats


def group_count(groups: np.ndarray) -> int:
    """How many bootstrap groups ``groups`` (a cluster 0 … G−1 per run) holds; ``ValueError`` under two, where every
    resample would be all the runs (or, for wild signs, all of them flipped together) and its interval zero-wide."""
    clusters = int(groups.max()) + 1
    if clusters < 2:
        raise ValueError("a bootstrap drawing groups of runs needs 2 or more groups, got 1: every run has the same "
                         "value of the grouping columns (fit.bootstrap_groups, --bootstrap-groups)")
    return clusters


def resample_counts(n_runs: int, resamples: int, seed: int, groups: np.ndarray | None = None) -> np.ndarray:
    """``[resamples, n_runs]`` how often each run is drawn: R draws of runs with replacement or, with ``groups``
    (a cluster 0 … G−1 per run), G draws of clusters, each draw taking all of its cluster's runs (the cluster
    bootstrap: runs that share an error, as one trunk's branches do, are not counted as independent)."""
    rng = np.random.default_rng(seed)
    if groups is None:
        return rng.multinomial(n_runs, np.full(n_runs, 1.0 / n_runs), size=resamples).astype(np.float64)
    clusters = group_count(groups)
    drawn = rng.multinomial(clusters, np.full(clusters, 1.0 / clusters), size=resamples)
    return drawn[:, groups].astype(np.float64)


def bootstrap_parametric(table: RunTable, fit: ParametricFit, *, resamples: int = RESAMPLES, starts: int = 4,
                         seed: int = 0, level: float = 0.95, budgets=(REFERENCE_BUDGET,)) -> BootstrapResult:
    """Standard errors and percentile intervals of the Approach-3 fit by resampling runs (or the table's
    groups of runs, `RunTable.group`)."""
    if resamples < 2:
        raise ValueError(f"bootstrap resamples must be at least 2, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    x0 = np.concatenate([fit.x[None], fit.best_starts(max(starts - 1, 0))])  # [starts, Q]
    starts_used = len(x0)
    counts = resample_counts(len(table), resamples, seed, table.group)
    # a resample starts next to its optimum, as the point fit's polish does: the same tests
    sol = lbfgs.minimize(value_and_grad, np.tile(x0, (resamples, 1)), np.repeat(counts, starts_used, axis=0),
                         log_data(table, fit.delta), **POLISH)
    f = np.where(np.isfinite(sol.f), sol.f, np.inf).reshape(resamples, starts_used)
    best = np.argmin(f, axis=1)
    pick = np.arange(resamples) * starts_used + best
    x = sol.x[pick]
    laws = ParametricLaw(E=np.exp(x[:, 2]), A=np.exp(x[:, 0]), B=np.exp(x[:, 1]), alpha=x[:, 3], beta=x[:, 4],
                         flops=fit.law.flops)
    samples = law_quantities(laws, budgets)
    point = {k: float(v) for k, v in law_quantities(fit.law, budgets).items()}
    groups = None if table.group is None else int(table.group.max()) + 1
    return BootstrapResult(samples, summarize(point, samples, level), level, int(sol.converged[pick].sum()), groups)
