"""Approach 2 of Hoffmann et al. (2022): IsoFLOP profiles.

Runs are grouped by budget (the table's budget column, or C values within ``budget_tol`` of
the group's smallest). At each budget a parabola in x = ln N is fitted to the final losses;
its minimum gives N_opt(C) and L_opt(C). Power laws through the minima give N_opt ∝ C^a and
D_opt = C / F(N_opt) ∝ C^b, F the table's FLOPs per token (``powerlaw.py``). A minimum that is not bracketed by the sampled
sizes (the parabola's vertex outside them, or the lowest loss at the smallest or largest
size) does not locate the optimum: it is drawn, warned about, and left out of the power laws
(as Porian et al. 2024 and Open-Athena's analysis do), unless ``keep_edges``.

Uncertainty: every parabola and the power laws are refitted on resampled data (all resamples at once, in numpy),
giving standard errors and percentile intervals of a, b and the optimum at each budget. Each resample repeats the
point fit, the edge rule included: a budget's resampled minimum enters that resample's power laws only where the
sizes it holds bracket it (a vertex extrapolated beyond them would be left out of the point fit too).
``resample="runs"`` draws each budget's runs with replacement, or with bootstrap groups on the table the groups
themselves (whole groups, the same draw for every budget, as Approach 3); ``"residuals"`` holds the sizes fixed and
adds to each fitted parabola normal noise of the residuals' pooled standard deviation (a fixed-design bootstrap:
with five or so sizes per budget, a draw of runs often keeps only three distinct sizes, whose parabola can put its
vertex anywhere); ``"wild"`` holds the sizes fixed too but adds each run's own residual, leverage-adjusted, times a
random sign (Wu 1986; Rademacher weights as Davidson & Flachaire 2008), so a budget whose runs lie close to their
parabola is resampled with its own small scatter rather than the pooled one. With bootstrap groups on the table
(one WSD trunk's branches), the wild sign is drawn per group, so an offset a trunk gives to every budget it serves
moves them together (the cluster wild bootstrap of Cameron, Gelbach & Miller 2008); the residuals' noise is drawn
run by run, without groups (the fit warns when a table has them). How often each covers the true exponent, on the
designs of this project's studies: experiments/approach2_intervals/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from jaxformer.scaling.allocation import SIX_ND, FlopsPerToken, PowerLawAllocation, budget_labels
from jaxformer.scaling.bootstrap import Interval, group_count, resample_counts, summarize
from jaxformer.scaling.powerlaw import allocation_from_optima, power_law_samples
from jaxformer.scaling.table import RunTable


RESAMPLE = ("runs", "residuals", "wild")  # what Approach 2's bootstrap draws


@dataclass(frozen=True)
class Profile:
    """One budget: the sampled sizes, the parabola p0 + p1·u + p2·u² in u = ln N − center."""

    budget: float  # C, FLOPs
    N: np.ndarray  # [n] sizes
    loss: np.ndarray  # [n]
    coeffs: np.ndarray  # [3] (p0, p1, p2)
    center: float
    n_opt: float
    loss_opt: float
    bracketed: bool
    label: str  # the budget as the table's budgets are told apart (`budget_labels`): its key in the bootstrap

    def curve(self, N) -> np.ndarray:
        u = np.log(np.asarray(N, np.float64)) - self.center
        return self.coeffs[0] + self.coeffs[1] * u + self.coeffs[2] * u * u


@dataclass(frozen=True)
class IsoFLOPFit:
    profiles: list[Profile]
    allocation: PowerLawAllocation
    stats: dict[str, Interval] | None  # bootstrap intervals, if resampled
    warnings: list[str]
    samples: dict[str, np.ndarray] | None = None  # quantity -> [resamples] values over the valid resamples
    flops: FlopsPerToken = SIX_ND  # the table's compute per token, for D_opt = C / F(N_opt)

    def to_dict(self) -> dict:
        return {
            "budgets": [
                {"C": p.budget, "runs": len(p.N), "N_opt": p.n_opt, "D_opt": p.budget / float(self.flops(p.n_opt)),
                 "loss_opt": p.loss_opt, "bracketed": p.bracketed}
                for p in self.profiles
            ],
            "power_laws": self.allocation.to_dict(),
            "bootstrap": None if self.stats is None else {k: v.to_dict() for k, v in self.stats.items()},
            "warnings": self.warnings,
        }


def group_budgets(table: RunTable, budget_tol: float = 0.1) -> list[np.ndarray]:
    """Indices of the runs of each budget, budgets ascending."""
    if table.budget is not None:
        return [np.flatnonzero(table.budget == b) for b in np.unique(table.budget)]
    order = np.argsort(table.C, kind="stable")
    groups, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or table.C[order[i]] > table.C[order[start]] * (1 + budget_tol):
            groups.append(np.sort(order[start:i]))
            start = i
    return groups


def _parabolas(u: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares parabolas: u ``[Y]``, y ``[Y]`` or ``[resamples, Y]``, weights ``[resamples, Y]``
    → coefficients ``[resamples, 3]``.

    Resamples with fewer than three distinct sizes get NaN.
    """
    X = np.stack([np.ones_like(u), u, u * u], axis=1)  # [Y, 3]
    M = np.einsum("bn,ni,nj->bij", w, X, X)
    v = np.einsum("bn,ni,bn->bi", w, X, np.broadcast_to(y, w.shape))
    _, size_of = np.unique(u, return_inverse=True)
    ok = np.sum((w @ np.eye(size_of.max() + 1)[size_of]) > 0, axis=1) >= 3  # distinct sizes drawn
    M[~ok] = np.eye(3)
    coeffs = np.linalg.solve(M, v[..., None])[..., 0]
    coeffs[~ok] = np.nan
    return coeffs


def _vertex(coeffs: np.ndarray, center: float) -> tuple[np.ndarray, np.ndarray]:
    """(N_opt, L_opt) at the parabolas' minima; NaN where the parabola opens downward."""
    p0, p1, p2 = coeffs[..., 0], coeffs[..., 1], coeffs[..., 2]
    up = p2 > 0
    u = np.where(up, -p1 / (2 * np.where(up, p2, 1)), np.nan)
    with np.errstate(over="ignore"):  # a nearly flat resampled parabola's vertex: N_opt inf, outside any sizes
        return np.exp(center + u), p0 + p1 * u + p2 * u * u


def parabola_minimum(N: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, float, float, float]:
    """One budget's least-squares parabola p0 + p1·u + p2·u² in u = ln N − center through its runs
    (N: parameters ``[n]``, loss: nats/token ``[n]``): ``(coeffs, center, N_opt, L_opt)``, the last two
    NaN when it opens downward."""
    u = np.log(np.asarray(N, np.float64))
    center = float(u.mean())
    coeffs = _parabolas(u - center, np.asarray(loss, np.float64), np.ones((1, len(u))))[0]
    n_opt, loss_opt = _vertex(coeffs, center)
    return coeffs, center, float(n_opt), float(loss_opt)


def bracketed(N: np.ndarray, loss: np.ndarray, n_opt: np.ndarray, drawn: np.ndarray | None = None) -> np.ndarray:
    """Whether the sizes bracket a budget's minimum: the parabola's vertex ``n_opt`` strictly inside the sizes
    and the lowest loss at neither the smallest nor the largest size. N ``[n]``; loss ``[..., n]``; n_opt
    ``[...]``; drawn ``[..., n]``: the runs a resample holds (default all). Returns ``[...]`` bool."""
    N = np.asarray(N, np.float64)
    loss, drawn = np.broadcast_arrays(np.asarray(loss, np.float64), True if drawn is None else drawn)
    smallest = np.where(drawn, N, np.inf).min(-1)
    largest = np.where(drawn, N, -np.inf).max(-1)
    lowest = N[np.argmin(np.where(drawn, loss, np.inf), axis=-1)]
    return (smallest < n_opt) & (n_opt < largest) & (smallest < lowest) & (lowest < largest)


def minimum_edge(N: np.ndarray, loss: np.ndarray, n_opt: float) -> Literal["lower", "upper"] | None:
    """The edge of the sampled sizes N at which a budget's minimum lies, None when the sizes bracket it
    (`bracketed`): the edge of the lowest loss, else the side the vertex lies beyond, else (a parabola
    opening downward) the end with the lower loss.
    """
    N, loss = np.asarray(N, np.float64), np.asarray(loss, np.float64)
    sizes = np.unique(N)
    lowest = N[np.argmin(loss)]
    if bracketed(N, loss, n_opt):
        return None
    if lowest == sizes[0] or (lowest != sizes[-1] and n_opt <= sizes[0]):
        return "lower"
    if lowest == sizes[-1] or n_opt >= sizes[-1]:
        return "upper"
    return "lower" if loss[N == sizes[0]].min() < loss[N == sizes[-1]].min() else "upper"


def fit_isoflop(table: RunTable, *, budget_tol: float = 0.1, resamples: int = 0, seed: int = 0,
                level: float = 0.95, keep_edges: bool = False, resample: str = "runs") -> IsoFLOPFit:
    """Parabola per budget, power laws through the bracketed minima (every minimum with ``keep_edges``),
    bootstrap intervals if ``resamples`` (drawing ``runs``, ``residuals`` or ``wild``)."""
    if resample not in RESAMPLE:
        raise ValueError(f"Approach 2 resamples {', '.join(RESAMPLE)}, got {resample!r}")
    warnings, profiles, groups = [], [], []
    grouped = group_budgets(table, budget_tol)
    budgets = [float(table.budget[idx[0]]) if table.budget is not None else float(np.exp(np.log(table.C[idx]).mean()))
               for idx in grouped]
    for idx, C, label in zip(grouped, budgets, budget_labels(budgets)):
        sizes = np.unique(table.N[idx])
        if len(sizes) < 3:
            warnings.append(f"budget C={label}: {len(sizes)} distinct sizes, need 3 for a parabola; skipped")
            continue
        coeffs, center, n_opt, loss_opt = parabola_minimum(table.N[idx], table.loss[idx])
        if not np.isfinite(n_opt):
            warnings.append(f"budget C={label}: the parabola opens downward (no minimum); skipped")
            continue
        bracketed = minimum_edge(table.N[idx], table.loss[idx], n_opt) is None
        if not bracketed:
            warnings.append(f"budget C={label}: minimum at the edge of the sampled sizes "
                            f"(N_opt={n_opt:.3g}, sizes {sizes[0]:.3g}..{sizes[-1]:.3g}); "
                            f"{'kept' if keep_edges else 'left out of the power laws'}; widen the size range")
        profiles.append(Profile(C, table.N[idx], table.loss[idx], coeffs, center, n_opt, loss_opt, bracketed, label))
        groups.append(idx)
    used = [k for k, p in enumerate(profiles) if p.bracketed or keep_edges]
    if len(used) < 2:
        found = ", ".join(f"C={profiles[k].label}" for k in used) or "none"
        # every other budget's reason (too few sizes, no minimum, a minimum at an edge), so the user knows what to change
        raise ValueError(f"Approach 2 needs IsoFLOP profiles (3+ sizes) at 2 or more budgets, got {len(used)} "
                         f"({found})" + "".join(f"; {w}" for w in warnings))
    fitted = [profiles[k] for k in used]
    C = np.array([p.budget for p in fitted])
    flops = FlopsPerToken.fit(table.N, table.D, table.C)
    allocation = allocation_from_optima(C, np.array([p.n_opt for p in fitted]), np.array([p.loss_opt for p in fitted]),
                                        flops)
    stats = samples = None
    if resamples:
        stats, samples, kept = _bootstrap(table, profiles, groups, allocation, resamples, seed, level, resample,
                                          flops, keep_edges)
        if resample == "residuals" and table.group is not None:
            warnings.append("bootstrap: Approach 2's residuals are drawn run by run, not by the table's groups "
                            "(the runs and wild resamples draw by group)")
        if kept < resamples:
            warnings.append(f"bootstrap: {kept} of {resamples} resamples kept; the others had fewer than 2 budgets "
                            f"whose resampled parabola {'has a minimum' if keep_edges else 'brackets its minimum'}")
    return IsoFLOPFit(profiles, allocation, stats, warnings, samples, flops)


def _leverage(u: np.ndarray) -> np.ndarray:
    """``[Y]`` diagonal of the hat matrix of a least-squares parabola in u ``[Y]``."""
    X = np.stack([np.ones_like(u), u, u * u], axis=1)
    return np.einsum("ni,ij,nj->n", X, np.linalg.pinv(X.T @ X), X)


def _bootstrap(table, profiles, groups, allocation, resamples, seed, level, resample, flops, keep_edges):
    """``(intervals, samples, kept)`` of a, b, k_N and each budget's N_opt over resampled profiles, and how many
    resamples gave power laws.

    Each resample repeats the point fit: every budget's parabola is refitted, and its minimum enters that
    resample's power laws only where the point fit would take it (bracketed by the sizes the resample holds,
    unless ``keep_edges``); a resample needs two such budgets. Budgets the point fit left out at an edge are
    resampled too, and count where a resample brackets their minimum."""
    rng = np.random.default_rng(seed)
    n_opt = np.empty((resamples, len(profiles)))
    residuals = np.concatenate([table.loss[idx] - p.curve(table.N[idx]) for p, idx in zip(profiles, groups)])
    sigma = np.sqrt(np.sum(residuals**2) / max(len(residuals) - 3 * len(profiles), 1))
    if resample == "wild":  # one sign per run, or per group of runs
        clusters = table.group if table.group is not None else np.arange(len(table))
        signs = rng.choice([-1.0, 1.0], size=(resamples, group_count(clusters)))
    if resample == "runs" and table.group is not None:  # whole groups, one draw for every budget
        counts = resample_counts(len(table), resamples, seed, table.group)
    for k, (p, idx) in enumerate(zip(profiles, groups)):
        u, fitted = np.log(table.N[idx]) - p.center, p.curve(table.N[idx])
        if resample == "runs":
            w = (counts[:, idx] if table.group is not None else
                 rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)), size=resamples).astype(np.float64))
            y = table.loss[idx]
        elif resample == "residuals":
            w = np.ones((resamples, len(idx)))
            y = fitted + rng.normal(0.0, sigma, size=(resamples, len(idx)))
        else:
            w = np.ones((resamples, len(idx)))
            own = (table.loss[idx] - fitted) / np.sqrt(np.maximum(1.0 - _leverage(u), 1e-12))
            y = fitted + own * signs[:, clusters[idx]]
        coeffs = _parabolas(u, y, w)
        vertex = _vertex(coeffs, p.center)[0]
        taken = np.isfinite(vertex) & (keep_edges | bracketed(table.N[idx], y, vertex, w > 0))
        n_opt[:, k] = np.where(taken, vertex, np.nan)
    valid = np.sum(np.isfinite(n_opt), axis=1) >= 2
    C = np.array([p.budget for p in profiles])
    samples = power_law_samples(C, n_opt[valid], flops)
    point = {"a": allocation.a, "b": allocation.b, "k_N": allocation.k_N}
    for k, p in enumerate(profiles):
        if p.bracketed or keep_edges:  # the budgets of the point fit's power laws
            samples[f"N_opt@{p.label}"] = n_opt[valid, k]
            point[f"N_opt@{p.label}"] = p.n_opt
    return summarize(point, samples, level), samples, int(valid.sum())
