"""Synthetic sweeps drawn from a known law, to check that the fits recover it.

``isoflop_sweep(law, budgets)`` places sizes log-uniformly around the law's N_opt at each
budget (D = C / 6N) and gives each run an idealised training curve: the law's loss at every
prefix of its tokens, as if each prefix were a run of its own length (what the envelope of
Approach 1 assumes), with multiplicative log-normal noise. (`jaxformer.sweep.table.write_sweep`
lays such a table out as a sweep directory.)
"""

from __future__ import annotations

import numpy as np

from jaxformer.scaling.allocation import SIX_ND, ParametricLaw
from jaxformer.scaling.table import RunTable


def isoflop_sweep(law: ParametricLaw, budgets, *, sizes: int = 9, span: float = 0.8, noise: float = 0.002,
                  curve_points: int = 40, seed: int = 0) -> RunTable:
    """``sizes`` runs per budget over N_opt·10^[−span, span]; curves from 1% of D to D."""
    rng = np.random.default_rng(seed)
    N, C, B = [], [], []
    for c in budgets:
        n = law.n_opt(c) * np.logspace(-span, span, sizes)
        N += list(n)
        C += [c] * sizes
        B += [c] * sizes
    N, C = np.array(N), np.array(C, dtype=np.float64)
    D = C / SIX_ND(N)
    curve_run = np.repeat(np.arange(len(N)), curve_points)
    curve_tokens = (D[:, None] * np.geomspace(0.01, 1.0, curve_points)[None]).ravel()
    curve_loss = law.loss(N[curve_run], curve_tokens) * np.exp(noise * rng.standard_normal(len(curve_run)))
    final = curve_loss.reshape(len(N), curve_points)[:, -1]
    table = RunTable.from_arrays(N, final, D=D, C=C, budget=np.array(B, dtype=np.float64), source="synthetic")
    return table.with_curves(curve_run, curve_tokens, curve_loss)
