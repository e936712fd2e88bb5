"""Many small L-BFGS minimisations at once: a fixed pool of slots fed from a queue of jobs.

Fitting a scaling law means minimising one tiny objective (5 parameters, a few hundred
points) from thousands of starts, and again for thousands of bootstrap resamples. Running
``optax.lbfgs`` with its zoom line search under ``vmap`` makes every start wait for the
slowest one at every iteration and every line-search step. Here instead a pool of ``S``
slots runs inside one ``lax.while_loop``: each loop step evaluates the objective exactly
once per slot (the trial point of a backtracking Armijo line search), a slot whose job has
finished writes its result and loads the next job from the queue. The work done is the sum
of the jobs' evaluations (as with a Python loop over scipy calls) plus the idle slots of the
last few jobs, with every evaluation vectorised over the slots, and the whole thing is one
compiled program. A modest pool (128 slots) keeps both the tail and the per-step cost small
on a CPU.

The L-BFGS direction (two-loop recursion, memory 10) is Optax's ``scale_by_lbfgs``. The
step is backtracking on the Armijo condition from a unit step (to the minimiser of the
quadratic through the rejected trial, kept within 0.1–0.5 of the step); a pair with
non-positive curvature resets the memory, and a direction that does not descend is replaced
by the capped steepest-descent step.

Status codes (``Solution.status``): 0 gradient below ``gtol``, 1 relative reduction below
``ftol`` (scipy's ``factr`` test) — these two count as converged —, 2 the line search could
not decrease the objective, 3 iteration limit, 4 non-finite objective at the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

STATUS = ("gradient", "reduction", "line search", "max iterations", "non-finite start")
CONVERGED = (0, 1)

# value_and_grad(x_P, row, data) -> (f, g_P) for one slot
ValueAndGrad = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, jax.Array]]


@dataclass(frozen=True)
class Solution:
    """Per-job results, numpy arrays with leading dimension J (number of jobs)."""

    x: np.ndarray  # [J, P] final iterate
    f: np.ndarray  # [J] objective there
    grad_max: np.ndarray  # [J] max |gradient| there
    iterations: np.ndarray  # [J] accepted L-BFGS steps
    evaluations: np.ndarray  # [J] objective evaluations
    status: np.ndarray  # [J] see STATUS

    @property
    def converged(self) -> np.ndarray:
        return np.isin(self.status, CONVERGED)


def minimize(
    value_and_grad: ValueAndGrad,
    x0_JP: np.ndarray,
    rows_JR: np.ndarray,
    data: Any,
    *,
    slots: int = 128,
    max_iter: int = 1000,
    gtol: float = 1e-5,
    ftol: float = 2.2e-9,
) -> Solution:
    """Minimises ``value_and_grad(x, rows_JR[j], data)`` from ``x0_JP[j]`` for every job j.

    The stopping tests and their defaults are scipy L-BFGS-B's: max |gradient| ≤ ``gtol``, or
    a relative reduction (f_k − f_k+1) / max(|f_k|, |f_k+1|, 1) ≤ ``ftol`` (factr = 1e7).

    ``rows_JR`` carries per-job data (e.g. bootstrap weights over the R points); ``data`` is
    shared by all jobs. Everything runs in float64, enabled only inside this call
    (``jax.enable_x64``), so global JAX state is left alone.
    """
    x0_JP = np.asarray(x0_JP)
    if x0_JP.ndim != 2 or len(x0_JP) == 0:
        raise ValueError(f"x0 must be a non-empty [jobs, params] array, got shape {x0_JP.shape}")
    slots = int(min(slots, len(x0_JP)))
    with jax.enable_x64(True):
        cast = lambda a: jnp.asarray(a, jnp.float64)  # noqa: E731
        out = _run(value_and_grad, cast(x0_JP), cast(rows_JR), jax.tree.map(cast, data), slots, max_iter, gtol, ftol)
        x, f, gmax, iters, nfev, status = (np.asarray(a) for a in jax.device_get(out))
    return Solution(x, f, gmax, iters, nfev, status)


@partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def _run(value_and_grad, x0_JP, rows_JR, data, S, max_iter, gtol, ftol):
    J, P = x0_JP.shape
    dtype = x0_JP.dtype
    lbfgs = optax.scale_by_lbfgs(memory_size=10)
    eval_S = jax.vmap(value_and_grad, in_axes=(0, 0, None))
    direction_S = jax.vmap(lbfgs.update)
    init_S = jax.vmap(lbfgs.init)

    def where_S(m, a, b):
        return jax.tree.map(lambda u, v: jnp.where(m.reshape(m.shape + (1,) * (u.ndim - 1)), u, v), a, b)

    def load(job_S):
        """Fresh slots: trial point = the job's start (step 0 along a zero direction)."""
        safe = jnp.minimum(job_S, J - 1)
        return x0_JP[safe], rows_JR[safe]

    def step(slot, glob):
        """One objective evaluation per slot: accept or backtrack; finished slots reload."""
        active = slot["job"] < J
        fresh = slot["fresh"]
        trial = slot["x"] + slot["step"][:, None] * slot["d"]
        ft, gt = eval_S(trial, slot["row"], data)
        ft = jnp.where(jnp.isfinite(ft) & jnp.all(jnp.isfinite(gt), axis=1), ft, jnp.inf)
        slope = jnp.sum(slot["g"] * slot["d"], axis=1)  # < 0 along a descent direction
        accept = fresh | (jnp.isfinite(ft) & (ft <= slot["f"] + 1e-4 * slot["step"] * slope))
        nfev = slot["nfev"] + 1

        # Accepted: new iterate and direction; non-positive curvature resets the memory.
        s, y = trial - slot["x"], gt - slot["g"]
        curvature_ok = jnp.sum(s * y, axis=1) > 1e-12 * jnp.linalg.norm(s, axis=1) * jnp.linalg.norm(y, axis=1)
        fresh_state = init_S(trial)
        state = where_S(fresh | ~curvature_ok, fresh_state, slot["state"])
        d_new, state_new = direction_S(gt, state, trial)
        # Not a descent direction (can follow a reset): steepest descent, capped at unit length
        # (Optax's own first step), and an empty memory.
        descent = jnp.sum(d_new * gt, axis=1) > 0
        gnorm = jnp.linalg.norm(gt, axis=1, keepdims=True)
        d_new = -jnp.where(descent[:, None], d_new, gt * jnp.minimum(1.0, 1.0 / gnorm))
        state_new = where_S(descent, state_new, fresh_state)
        it = slot["it"] + (accept & ~fresh)
        gmax = jnp.max(jnp.abs(gt), axis=1)
        scale = jnp.maximum(jnp.maximum(jnp.abs(slot["f"]), jnp.abs(ft)), 1.0)
        small_reduction = ~fresh & (slot["f"] - ft <= ftol * scale)

        # Rejected: backtrack (safeguarded quadratic interpolation); give up when the step vanishes.
        denom = 2.0 * (ft - slot["f"] - slot["step"] * slope)
        quad = jnp.where(jnp.isfinite(denom) & (denom > 0), -slope * slot["step"] ** 2 / denom, 0.0)
        step_back = jnp.clip(quad, 0.1 * slot["step"], 0.5 * slot["step"])

        status = jnp.select(
            [fresh & ~jnp.isfinite(ft), accept & (gmax <= gtol), accept & small_reduction,
             ~accept & (step_back < 1e-12), accept & (it >= max_iter)],
            [4, 0, 1, 2, 3],
            -1,
        )
        done = active & (status >= 0)
        x = jnp.where(accept[:, None], trial, slot["x"])
        f = jnp.where(accept, ft, slot["f"])
        g = jnp.where(accept[:, None], gt, slot["g"])

        # Finished slots write their results (others write out of range: dropped)...
        target = jnp.where(done, slot["job"], J)
        result = jnp.concatenate([x, f[:, None], jnp.max(jnp.abs(g), axis=1)[:, None]], axis=1)
        counts = jnp.stack([it, nfev, status], axis=1)
        # ...and take the next jobs from the queue.
        queued = glob["next_job"] + jnp.cumsum(done) - 1
        job = jnp.where(done, jnp.minimum(queued, J), slot["job"])
        glob = dict(
            results=glob["results"].at[target].set(result, mode="drop"),
            counts=glob["counts"].at[target].set(counts, mode="drop"),
            next_job=glob["next_job"] + jnp.sum(done),
        )
        x_load, row_load = load(job)
        slot = dict(
            job=job,
            fresh=done,
            x=jnp.where(done[:, None], x_load, x),
            row=jnp.where(done[:, None], row_load, slot["row"]),
            f=f,
            g=g,
            d=jnp.where((done | ~accept)[:, None], jnp.where(done[:, None], 0.0, slot["d"]), d_new),
            step=jnp.where(done, 0.0, jnp.where(accept, 1.0, step_back)),
            state=where_S(accept, state_new, slot["state"]),
            it=jnp.where(done, 0, it),
            nfev=jnp.where(done, 0, nfev),
        )
        return slot, glob

    job = jnp.arange(S)
    x, row = load(job)
    slot = dict(job=job, fresh=jnp.ones(S, bool), x=x, row=row, f=jnp.zeros(S, dtype), g=jnp.zeros_like(x),
                d=jnp.zeros_like(x), step=jnp.zeros(S, dtype), state=init_S(x), it=jnp.zeros(S, jnp.int32),
                nfev=jnp.zeros(S, jnp.int32))
    glob = dict(results=jnp.zeros((J, P + 2), dtype), counts=jnp.zeros((J, 3), jnp.int32).at[:, 2].set(3),
                next_job=jnp.asarray(S))

    slot, glob = jax.lax.while_loop(lambda c: jnp.any(c[0]["job"] < J), lambda c: step(*c), (slot, glob))
    res, counts = glob["results"], glob["counts"]
    return res[:, :P], res[:, P], res[:, P + 1], counts[:, 0], counts[:, 1], counts[:, 2]
