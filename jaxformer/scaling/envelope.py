"""Approach 1 of Hoffmann et al. (2022): the lower envelope of training curves over FLOPs.

Each run's curve (tokens seen → loss) is put on a FLOPs axis (c = C_run · tokens / D_run,
i.e. 6·N·tokens for C = 6ND) and interpolated, linearly in log-log, onto ``points``
log-spaced FLOP values. At each value the run with the lowest loss is compute-optimal: its
N is N_opt(c), its loss L_opt(c); FLOP values where the smallest or largest run is best are
left out (the optimum is not bracketed there). Power laws through these give N_opt ∝ C^a, D_opt ∝ C^b
(``powerlaw.py``). It needs curves: a long-form table (a run column, one row per
evaluation) or ``metrics.jsonl`` files in the run directories.

Uncertainty: runs resampled with replacement (a run drawn at least once is in the
resample), or the table's bootstrap groups (`RunTable.group`: whole groups drawn, as Approach
3 does), the envelope and power laws recomputed per resample, in chunks; a resample with fewer
than two sizes on its envelope, which the point fit would refuse, is left out (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer.scaling.allocation import FlopsPerToken, PowerLawAllocation
from jaxformer.scaling.bootstrap import Interval, resample_counts, summarize
from jaxformer.scaling.powerlaw import allocation_from_optima, power_law_samples
from jaxformer.scaling.table import RunTable


@dataclass(frozen=True)
class EnvelopeFit:
    flops: np.ndarray  # [flops] FLOP values where the envelope is defined
    n_opt: np.ndarray  # [flops] size of the best run there
    loss_opt: np.ndarray  # [flops]
    allocation: PowerLawAllocation
    stats: dict[str, Interval] | None
    samples: dict[str, np.ndarray] | None = None  # a, b, k_N of each resample ``[resamples]`` (NaN: not fitted)

    def to_dict(self) -> dict:
        return {
            "envelope_points": int(len(self.flops)),
            "sizes_on_envelope": int(len(np.unique(self.n_opt))),
            "power_laws": self.allocation.to_dict(),
            "bootstrap": None if self.stats is None else {k: v.to_dict() for k, v in self.stats.items()},
        }


def _loss_grid(table: RunTable, points: int) -> tuple[np.ndarray, np.ndarray]:
    """FLOP values ``[flops]`` and each run's interpolated loss there ``[Y, flops]`` (inf off its curve)."""
    flops_per_token = table.C / table.D
    run, tokens, loss = table.curve_run, table.curve_tokens, table.curve_loss
    c = flops_per_token[run] * tokens
    grid = np.logspace(np.log10(c.min()), np.log10(c.max()), points)
    out = np.full((len(table), points), np.inf)
    for r in range(len(table)):
        mine = np.flatnonzero(run == r)
        if mine.size == 0:
            continue
        order = mine[np.argsort(c[mine])]
        lc, ll = np.log(c[order]), np.log(loss[order])
        inside = (grid >= c[order[0]]) & (grid <= c[order[-1]])
        out[r, inside] = np.exp(np.interp(np.log(grid[inside]), lc, ll))
    return grid, out


def fit_envelope(table: RunTable, *, points: int = 250, resamples: int = 0, seed: int = 0,
                 level: float = 0.95) -> EnvelopeFit:
    """N_opt(C) from the lower envelope of the runs' losses, and power laws through it."""
    if not table.has_curves:
        raise ValueError(f"{table.source}: Approach 1 needs training curves (a run column with one row per "
                         "evaluation, or metrics.jsonl in each run directory)")
    grid, L_RF = _loss_grid(table, points)
    best = np.argmin(L_RF, axis=0)
    # Where the smallest or largest run is best, the optimum lies outside the sampled sizes.
    interior = (table.N[best] > table.N.min()) & (table.N[best] < table.N.max())
    defined = np.isfinite(L_RF[best, np.arange(len(grid))]) & interior
    flops, n_opt, loss_opt = grid[defined], table.N[best[defined]], L_RF[best, np.arange(len(grid))][defined]
    if len(np.unique(n_opt)) < 2:
        raise ValueError(f"Approach 1 needs at least 2 model sizes on the loss envelope, got {len(np.unique(n_opt))}")
    per_token = FlopsPerToken.fit(table.N, table.D, table.C)
    allocation = allocation_from_optima(flops, n_opt, loss_opt, per_token)
    if not resamples:
        return EnvelopeFit(flops, n_opt, loss_opt, allocation, None)
    samples = _bootstrap(table, grid, L_RF, per_token, resamples, seed)
    stats = summarize({"a": allocation.a, "b": allocation.b, "k_N": allocation.k_N}, samples, level)
    return EnvelopeFit(flops, n_opt, loss_opt, allocation, stats, samples)


def _bootstrap(table, grid, L_RF, per_token, resamples, seed, chunk: int = 100) -> dict[str, np.ndarray]:
    """Each resample's power laws through its own envelope (the point fit's, on the runs it drew); NaN where it
    holds fewer than 2 sizes, which the point fit refuses (a line through one size would give it a = 0)."""
    counts = resample_counts(len(table), resamples, seed, table.group)
    n_opt_bF = np.empty((resamples, len(grid)))
    for s in range(0, resamples, chunk):
        drawn = counts[s:s + chunk] > 0  # [b, R]
        L_bRF = np.where(drawn[:, :, None], L_RF[None], np.inf)
        best = np.argmin(L_bRF, axis=1)  # [b, F]
        N_b = table.N[best]
        # as the point fit, against the sizes this resample drew: where its smallest or largest is best, no optimum
        smallest = np.where(drawn, table.N, np.inf).min(axis=1, keepdims=True)
        largest = np.where(drawn, table.N, -np.inf).max(axis=1, keepdims=True)
        interior = (N_b > smallest) & (N_b < largest)
        n_opt_bF[s:s + chunk] = np.where(np.isfinite(np.min(L_bRF, axis=1)) & interior, N_b, np.nan)
    sizes = np.isfinite(n_opt_bF)
    two_sizes = np.where(sizes, n_opt_bF, -np.inf).max(axis=1) > np.where(sizes, n_opt_bF, np.inf).min(axis=1)
    return power_law_samples(grid, np.where(two_sizes[:, None], n_opt_bF, np.nan), per_token)
