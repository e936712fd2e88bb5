"""Learning-rate tuning on any table of (N, lr, loss): each size's optimum and the power law across sizes.

Each size N has a curve of final losses over a grid of peak learning rates. Its optimum is the
grid point of lowest loss, refined by the vertex of the parabola in ln lr through that point and
its two neighbours when it is interior (an exact recovery where the loss is quadratic in ln lr
near the optimum); a best point at either end of the grid is kept as is and flagged, since the
true optimum may lie beyond it. The optima then give

    lr_opt(N) = c · (N / N0)^k

by least squares of ln lr_opt on ln N (`jaxformer.scaling.powerlaw.loglog_fit`), N0 being a
round reference size in the middle of the tuned ones, so c is the rate there. Runs that diverged
carry a loss of NaN or inf: they are worse than any finite loss and never a parabola's point.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.scaling.isoflop import parabola_minimum
from jaxformer.scaling.powerlaw import loglog_fit


@dataclasses.dataclass(frozen=True)
class LROptimum:
    """One size's best learning rate.

    N: parameters; lr: the optimum (refined, else the grid point); grid_lr: the grid point of
    lowest loss; loss: the final loss there (the parabola's value at its vertex when refined);
    edge: ``"low"`` or ``"high"`` when the best grid point is the smallest or largest rate (the
    optimum may lie beyond it), else None; refined: whether the parabola gave ``lr``.
    """

    N: float
    lr: float
    grid_lr: float
    loss: float
    edge: str | None
    refined: bool


@dataclasses.dataclass(frozen=True)
class LRRule:
    """lr_opt(N) = c · (N / N0)^k: c a learning rate, N0 parameters, k dimensionless."""

    c: float
    k: float
    N0: float

    def lr(self, N: float | np.ndarray) -> float | np.ndarray:
        return self.c * (np.asarray(N, dtype=float) / self.N0) ** self.k

    @property
    def formula(self) -> str:
        """The rule as a sweep hyperparameter formula of N (`jaxformer.sweep.formula` grammar), c and k to six
        significant figures: within 2e-5 of the rule, relative, for N within a factor 100 of N0 and |k| < 1."""
        return f"{self.c:.6g} * (N / {self.N0:.6g}) ** {self.k:.6g}"


@dataclasses.dataclass(frozen=True)
class TuneFit:
    """The tuned points (``N``, ``lr``, ``loss``, one entry per run), each size's optimum, the fitted rule."""

    N: np.ndarray
    lr: np.ndarray
    loss: np.ndarray
    optima: list[LROptimum]
    rule: LRRule


def lr_optimum(N: float, lr: np.ndarray, loss: np.ndarray) -> LROptimum:
    """The optimum of one size's curve: ``lr`` ``[rates]`` distinct rates, ``loss`` ``[rates]`` final losses
    (NaN: diverged)."""
    order = np.argsort(lr)
    lr, loss = np.asarray(lr, dtype=float)[order], np.where(np.isfinite(loss), loss, np.inf)[order]
    if not np.isfinite(loss).any():
        raise ValueError(f"every tuning run of N={N:,.0f} diverged or failed; no learning rate to pick")
    best = int(np.argmin(loss))
    edge = "low" if best == 0 else "high" if best == len(lr) - 1 else None
    grid_point = LROptimum(float(N), float(lr[best]), float(lr[best]), float(loss[best]), edge, False)
    if edge is not None or not np.isfinite(loss[best - 1:best + 2]).all():  # beside a diverged run: as is
        return grid_point
    # the parabola in ln lr that Approach 2 fits in ln N; its vertex lies between the outer two points,
    # the middle one being the lowest of the three
    _, _, lr_opt, loss_opt = parabola_minimum(lr[best - 1:best + 2], loss[best - 1:best + 2])
    if not np.isfinite(lr_opt):  # three equal losses: no curvature to locate a vertex
        return grid_point
    return LROptimum(float(N), lr_opt, float(lr[best]), loss_opt, None, True)


def reference_size(N: np.ndarray) -> float:
    """The geometric mean of the sizes rounded to two significant figures (the rule's N0)."""
    mean = float(np.exp(np.mean(np.log(N))))
    return float(f"{mean:.2g}")


def fit_lr_rule(N: np.ndarray, lr_opt: np.ndarray, N0: float | None = None) -> LRRule:
    """The least-squares line of ln lr_opt on ln N through two or more sizes ``[sizes]``."""
    N, lr_opt = np.asarray(N, dtype=float), np.asarray(lr_opt, dtype=float)
    if len(np.unique(N)) < 2:
        raise ValueError(f"a learning-rate rule needs optima at two or more sizes, got {len(np.unique(N))}")
    N0 = reference_size(N) if N0 is None else N0
    k, log_c = loglog_fit(N / N0, lr_opt)
    return LRRule(c=float(np.exp(log_c)), k=float(k), N0=N0)


def fit_tuning(N: np.ndarray, lr: np.ndarray, loss: np.ndarray) -> TuneFit:
    """Each size's optimum and the rule across sizes, from one run per entry of ``N``, ``lr``, ``loss`` ``[Y]``."""
    N, lr, loss = (np.asarray(x, dtype=float) for x in (N, lr, loss))
    optima = []
    for size in np.unique(N):
        here = N == size
        if len(np.unique(lr[here])) != here.sum():
            raise ValueError(f"N={size:,.0f} has two runs at one learning rate; pass one curve per size")
        optima.append(lr_optimum(size, lr[here], loss[here]))
    rule = fit_lr_rule(np.array([o.N for o in optima]), np.array([o.lr for o in optima]))
    return TuneFit(N=N, lr=lr, loss=loss, optima=optima, rule=rule)


def edge_notes(fit: TuneFit) -> list[str]:
    """One warning line per size whose best rate is at an end of the grid."""
    return [f"warning: N={o.N:,.0f}: the best learning rate {o.grid_lr:.3g} is the grid's "
            f"{'smallest' if o.edge == 'low' else 'largest'}; the optimum may lie beyond it (widen tune.lr)"
            for o in fit.optima if o.edge is not None]


def to_dict(fit: TuneFit) -> dict:
    """The JSON-ready record of the fit: per-size optima and the rule with its formula."""
    return {"optima": [dataclasses.asdict(o) for o in fit.optima],
            "rule": {"c": fit.rule.c, "k": fit.rule.k, "N0": fit.rule.N0, "formula": fit.rule.formula}}
