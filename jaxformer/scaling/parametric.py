"""Approach 3 of Hoffmann et al. (2022): fit L(N, D) = E + A/N^α + B/D^β to every run.

As in the paper (and Besiroglu et al. 2024), the fit minimises, over x = (log A, log B,
log E, α, β), the Huber loss (δ = 1e-3) between the predicted and observed *log* loss,
summed over runs, with the prediction in log-sum-exp form:

    log L̂ = LSE(log A − α log N, log B − β log D, log E).

L-BFGS runs from every point of the grid α, β ∈ {0, 0.5, …, 2}, log E ∈ {−1, −0.5, …, 1},
log A, log B ∈ {0, 5, …, 25} (5·5·5·6·6 = 4500 starts), all at once (see ``lbfgs.py``), with
scipy's default stopping tests; the best end point, polished with the tighter tests ``POLISH``
(as every bootstrap resample is, `bootstrap.py`), is the fit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.scaling import lbfgs
from jaxformer.scaling.allocation import FlopsPerToken, ParametricLaw
from jaxformer.scaling.table import RunTable

HUBER_DELTA = 1e-3
PARAMS = ("log_A", "log_B", "log_E", "alpha", "beta")
# Stopping tests for a start next to its optimum (the point fit's polish, the bootstrap's resamples), tighter than
# scipy's: an absolute reduction test of 2.2e-9 (objective ~1e-3) would stop after a step or two.
POLISH = {"ftol": 1e-12, "gtol": 1e-8}


def hoffmann_grid() -> np.ndarray:
    """The 4500 starts ``[4500, 5]`` in (log A, log B, log E, α, β) order."""
    ab = np.arange(0.0, 30.0, 5.0)
    e = np.arange(-1.0, 1.5, 0.5)
    exponents = np.arange(0.0, 2.5, 0.5)
    return np.array(list(itertools.product(ab, ab, e, exponents, exponents)))


def huber(r: jax.Array, delta: float) -> jax.Array:
    """Huber loss: r²/2 inside ±δ, δ(|r| − δ/2) outside."""
    return jnp.where(jnp.abs(r) <= delta, 0.5 * r * r, delta * (jnp.abs(r) - 0.5 * delta))


def objective(x_Q: jax.Array, log_n: jax.Array, log_d: jax.Array, log_loss: jax.Array,
              weights: jax.Array | None = None, delta: float = HUBER_DELTA) -> jax.Array:
    """The reference objective (plain log-sum-exp), for one parameter vector; scalar."""
    log_a, log_b, log_e, alpha, beta = x_Q
    terms = jnp.stack([log_a - alpha * log_n, log_b - beta * log_d, jnp.broadcast_to(log_e, log_n.shape)])
    r = jax.nn.logsumexp(terms, axis=0) - log_loss
    w = jnp.ones_like(r) if weights is None else weights
    return jnp.sum(w * huber(r, delta))


def value_and_grad(x_Q: jax.Array, weights_Y: jax.Array, data: tuple) -> tuple[jax.Array, jax.Array]:
    """``objective`` and its gradient in closed form, for the solver's inner loop.

    Written as log L̂ = log E + log(1 + t₁ + t₂), t₁ = A/(E N^α), t₂ = B/(E D^β): two
    exponentials and one log1p per run instead of LSE's three and one (XLA's CPU float64
    log1p is also faster than its log), and the Huber
    derivative is clip(r, ±δ). Overflow gives inf, which the line search rejects.
    """
    log_n, log_d, log_loss, delta = data
    log_a, log_b, log_e, alpha, beta = x_Q
    t1 = jnp.exp(log_a - log_e - alpha * log_n)
    t2 = jnp.exp(log_b - log_e - beta * log_d)
    s = 1.0 + t1 + t2
    r = log_e + jnp.log1p(t1 + t2) - log_loss
    dh = jnp.clip(r, -delta, delta)
    value = jnp.sum(weights_Y * dh * (r - 0.5 * dh))
    q = weights_Y * dh / s
    g1, g2 = q * t1, q * t2
    grad = jnp.stack([jnp.sum(g1), jnp.sum(g2), jnp.sum(q), -jnp.dot(g1, log_n), -jnp.dot(g2, log_d)])
    return value, grad


@dataclass(frozen=True)
class ParametricFit:
    """The best of all starts, polished, with how the starts fared."""

    law: ParametricLaw
    x: np.ndarray  # [Q] (log A, log B, log E, α, β)
    objective: float
    starts: np.ndarray  # [starts, Q] grid used
    solution: lbfgs.Solution  # per start
    best: int  # index of the start that ended lowest
    delta: float
    polish: lbfgs.Solution  # the best start's end point polished (`POLISH`): x and objective above

    @property
    def convergence(self) -> dict:
        sol = self.solution
        best = sol.f[self.best]
        near = np.abs(sol.f - best) <= 1e-6 * abs(best)  # "reached the best" start's end (before its polish)
        return {
            "starts": int(len(sol.f)),
            "converged": int(sol.converged.sum()),
            "by_status": {name: int((sol.status == k).sum()) for k, name in enumerate(lbfgs.STATUS)},
            "reached_best": int(near.sum()),
            "best_status": lbfgs.STATUS[int(self.polish.status[0])],
            "best_grad_max": float(self.polish.grad_max[0]),
            "iterations_mean": float(sol.iterations.mean()),
            "iterations_max": int(sol.iterations.max()),
            "evaluations": int(sol.evaluations.sum()),
        }

    def best_starts(self, k: int) -> np.ndarray:
        """The k grid starts that ended lowest, ``[k, 5]`` (bootstrap initialisations)."""
        order = np.argsort(np.where(np.isfinite(self.solution.f), self.solution.f, np.inf), kind="stable")
        return self.starts[order[:k]]


def log_data(table: RunTable, delta: float) -> tuple:
    """What ``value_and_grad`` takes as ``data``: (log N, log D, log L, δ)."""
    return (np.log(table.N), np.log(table.D), np.log(table.loss), np.asarray(delta))


def _check(table: RunTable) -> None:
    """One line saying what the runs lack for the law's five parameters to be determined, if they do."""
    if len(table) <= len(PARAMS):
        raise ValueError(f"Approach 3 needs more runs than its {len(PARAMS)} parameters, got {len(table)}")
    points = len(np.unique(np.stack([table.N, table.D], axis=1), axis=0))
    if points <= len(PARAMS):
        raise ValueError(f"Approach 3 needs more distinct (N, D) points than its {len(PARAMS)} parameters, got "
                         f"{points} in {len(table)} runs")
    for name, values in (("sizes N", table.N), ("token counts D", table.D)):
        if np.ptp(values) == 0:
            raise ValueError(f"Approach 3 needs runs at 2 or more {name}, got one ({values[0]:.6g}) in every run")
    if np.ptp(table.loss) == 0:
        raise ValueError(f"Approach 3 needs losses that differ between runs, got {table.loss[0]:.6g} in every run")


def fit_parametric(table: RunTable, *, starts: np.ndarray | None = None, delta: float = HUBER_DELTA) -> ParametricFit:
    """Fits L = E + A/N^α + B/D^β from every start (default: the 4500-point Hoffmann grid); the law's
    allocation counts compute as the table does (`FlopsPerToken` fitted to its C/D)."""
    _check(table)
    starts = hoffmann_grid() if starts is None else np.asarray(starts, dtype=np.float64)
    data = log_data(table, delta)
    weights = np.ones((len(starts), len(table)))
    sol = lbfgs.minimize(value_and_grad, starts, weights, data)
    f = np.where(np.isfinite(sol.f), sol.f, np.inf)
    best = int(np.argmin(f))
    if not np.isfinite(f[best]):
        raise ValueError("Approach 3: no start reached a finite objective")
    # in the grid's program (no compilation of its own); L-BFGS never ends above its start
    polish = lbfgs.minimize(value_and_grad, sol.x[best][None], weights[:1], data, pad_to=len(starts), **POLISH)
    law = ParametricLaw.from_log_params(polish.x[0], FlopsPerToken.fit(table.N, table.D, table.C))
    return ParametricFit(law, polish.x[0], float(polish.f[0]), starts, sol, best, delta, polish)


def residuals(law: ParametricLaw, table: RunTable) -> np.ndarray:
    """log L_observed − log L_predicted per run ``[Y]``."""
    return np.log(table.loss) - np.log(law.loss(table.N, table.D))
