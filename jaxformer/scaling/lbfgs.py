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
compiled program. A modest pool (64 slots) keeps both the tail and the per-step cost small
on a CPU.

The L-BFGS direction (two-loop recursion, memory 10) is Optax's ``scale_by_lbfgs``, its
arithmetic op for op (``_direction``: the same bits, without importing Optax). The step is
backtracking on the Armijo condition from a unit step (to the minimiser of the quadratic
through the rejected trial, kept within 0.1–0.5 of the step); a pair with non-positive
curvature resets the memory, and a direction that does not descend is replaced by the capped
steepest-descent step.

With several devices (the `jaxformer` command makes each core an XLA:CPU device) each runs
its own pool, of the same number of slots, over a round-robin share of the jobs; the compiled
programs are kept by ``programs.load_or_compile`` while JAX's persistent compilation cache is on.

A job's result is the same bits whatever the number of jobs or devices and the slot it runs in.
XLA compiles the objective's sums over the runs differently for some widths of the pool (the
matrix-vector products of one or four slots are not those of two or 128), and XLA:CPU's YNNPACK
fusions, which the `jaxformer` command turns off and ``JAXFORMER_TUNE=0`` or a library user does
not, change them for wide pools: so the pool is ``slots`` wide on every device, never narrowed to
fewer jobs (slots without a job idle), and the program is compiled without those fusions in any
process.

Status codes (``Solution.status``): 0 gradient below ``gtol``, 1 relative reduction below
``ftol`` (scipy's ``factr`` test) — these two count as converged —, 2 the line search could
not decrease the objective, 3 iteration limit, 4 non-finite objective at the start.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.scaling import programs

STATUS = ("gradient", "reduction", "line search", "max iterations", "non-finite start")
CONVERGED = (0, 1)
MEMORY = 10  # L-BFGS pairs kept
NO_YNN_FUSION = {"xla_cpu_experimental_ynn_fusion_type": ""}  # the same program in every process (see above)

# value_and_grad(x_Q, row, data) -> (f, g_Q) for one slot
ValueAndGrad = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, jax.Array]]


@dataclass(frozen=True)
class Solution:
    """Per-job results, numpy arrays with leading dimension U (number of jobs)."""

    x: np.ndarray  # [U, Q] final iterate
    f: np.ndarray  # [U] objective there
    grad_max: np.ndarray  # [U] max |gradient| there
    iterations: np.ndarray  # [U] accepted L-BFGS steps
    evaluations: np.ndarray  # [U] objective evaluations
    status: np.ndarray  # [U] see STATUS

    @property
    def converged(self) -> np.ndarray:
        return np.isin(self.status, CONVERGED)


def minimize(
    value_and_grad: ValueAndGrad,
    x0_UQ: np.ndarray,
    rows_UY: np.ndarray,
    data: Any,
    *,
    slots: int = 64,
    max_iter: int = 1000,
    gtol: float = 1e-5,
    ftol: float = 2.2e-9,
    devices: int | None = None,
    pad_to: int | None = None,
) -> Solution:
    """Minimises ``value_and_grad(x, rows_UY[j], data)`` from ``x0_UQ[j]`` for every job j.

    The stopping tests and their defaults are scipy L-BFGS-B's: max |gradient| ≤ ``gtol``, or
    a relative reduction (f_k − f_k+1) / max(|f_k|, |f_k+1|, 1) ≤ ``ftol`` (factr = 1e7).

    ``rows_UY`` carries per-job data (e.g. bootstrap weights over the R points); ``data`` is
    shared by all jobs. Everything runs in float64, enabled only inside this call
    (``jax.enable_x64``), so global JAX state is left alone.

    With several local devices (XLA:CPU makes one per core when told to, as the `jaxformer`
    command does) the jobs are dealt out round-robin, each device running its own pool of
    ``slots`` slots over its share; ``devices`` caps how many are used (default: all, but no more
    than ⌈jobs / slots⌉). A job's result does not depend on the number of jobs or devices, nor on
    the device or slot it ran in (the module's docstring says why the pool's width is fixed).

    ``pad_to`` runs the jobs in the program of a call with that many (the others idle): the
    tolerances are arguments of the program, not part of it, so a few jobs polished more tightly
    (the point fit's best start, `parametric.fit_parametric`) take no compilation of their own.
    """
    x0_UQ = np.asarray(x0_UQ)
    if x0_UQ.ndim != 2 or len(x0_UQ) == 0:
        raise ValueError(f"x0 must be a non-empty [jobs, params] array, got shape {x0_UQ.shape}")
    J = len(x0_UQ)
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    shape = max(J, pad_to or 0)  # the jobs the program is compiled for
    n_dev = max(1, min(jax.local_device_count() if devices is None else devices, -(-shape // slots)))
    per = -(-shape // n_dev)  # a device's block of jobs
    x0_UQ, rows_UY = _deal(x0_UQ, n_dev, per), _deal(np.asarray(rows_UY), n_dev, per)
    active = np.array([len(range(d, J, n_dev)) for d in range(n_dev)], np.int32)  # the jobs in each block
    with jax.enable_x64(True):
        if n_dev > 1:  # each device's block goes straight to it: no resharding program to compile or load
            mesh = Mesh(np.array(jax.local_devices()[:n_dev]), ("jobs",))

            def put(a, spec=PartitionSpec("jobs"), dtype=np.float64):
                return jax.device_put(np.asarray(a, dtype), NamedSharding(mesh, spec))

            args = (put(x0_UQ), put(rows_UY), jax.tree.map(lambda a: put(a, PartitionSpec()), data),
                    put(active, dtype=np.int32), put([gtol, ftol], PartitionSpec()))
        else:
            cast = lambda a: jnp.asarray(a, jnp.float64)  # noqa: E731
            args = (cast(x0_UQ), cast(rows_UY), jax.tree.map(cast, data), jnp.asarray(active), cast([gtol, ftol]))
        statics = (slots, max_iter, n_dev)
        out = _program(value_and_grad, args, statics)(*args)
        x, f, gmax, iters, nfev, status = (_undeal(np.asarray(a), n_dev, J) for a in jax.device_get(out))
    return Solution(x, f, gmax, iters, nfev, status)


def _program(value_and_grad: ValueAndGrad, args: tuple, statics: tuple) -> Callable:
    """``_run`` for these arguments; with JAX's persistent cache on and an objective defined at the top of
    a module, the compiled program stored beside it (`programs`), so a later process neither traces nor
    lowers it. The stored program's key covers this file and the objective's module, not code the objective
    calls in other modules: after changing such code, empty the cache directory or bump ``programs.FORMAT``."""
    module = sys.modules.get(getattr(value_and_grad, "__module__", None) or "")
    name = getattr(value_and_grad, "__qualname__", "<unnamed>")
    if getattr(module, "__file__", None) and "<" not in name:
        compiled = programs.load_or_compile(
            lambda: _run.lower(value_and_grad, *args, *statics), args,
            parts=("lbfgs._run", f"{module.__name__}.{name}", repr(statics)), sources=(__file__, module.__file__),
            devices=jax.local_devices()[: statics[-1]])
        if compiled is not None:
            return compiled
    return lambda *a: _run(value_and_grad, *a, *statics)


def _deal(a: np.ndarray, n: int, per: int) -> np.ndarray:
    """Job j to block j % n, position j // n, the blocks filled to ``per`` jobs with copies of the last job:
    ``[n·per, …]``."""
    a = np.concatenate([a, np.repeat(a[-1:], per * n - len(a), axis=0)])
    return a.reshape(per, n, *a.shape[1:]).swapaxes(0, 1).reshape(per * n, *a.shape[1:])


def _undeal(a: np.ndarray, n: int, J: int) -> np.ndarray:
    """The inverse of ``_deal``: back in job order, padding dropped."""
    per = len(a) // n
    return a.reshape(n, per, *a.shape[1:]).swapaxes(0, 1).reshape(per * n, *a.shape[1:])[:J]


@partial(jax.jit, static_argnums=(0, 6, 7, 8), compiler_options=NO_YNN_FUSION)
def _run(value_and_grad, x0_UQ, rows_UY, data, active, tolerances, S, max_iter, n_dev):
    """One pool (``n_dev`` 1), or one pool per device over its block of jobs, the first ``active`` of them
    (``[n_dev]``); ``tolerances`` ``[2]``: gtol, ftol."""
    pool = partial(_pool, value_and_grad, S=S, max_iter=max_iter)
    if n_dev == 1:
        return pool(x0_UQ, rows_UY, data, active, tolerances)
    mesh = Mesh(np.array(jax.local_devices()[:n_dev]), ("jobs",))
    jobs, shared = PartitionSpec("jobs"), PartitionSpec()
    # the pools never communicate: each device loops until its own queue is empty
    return jax.shard_map(pool, mesh=mesh, in_specs=(jobs, jobs, shared, jobs, shared), out_specs=jobs,
                         check_vma=False)(x0_UQ, rows_UY, data, active, tolerances)


def _vdot(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.vdot(a, b, precision=jax.lax.Precision.HIGHEST)


def _direction_init(x_Q: jax.Array) -> dict:
    """An empty memory: Optax's ``ScaleByLBFGSState`` for one slot (pairs ``s``, ``y``, weights ``rho``)."""
    zeros = jnp.zeros((MEMORY,) + x_Q.shape, x_Q.dtype)
    return dict(count=jnp.asarray(0, jnp.int32), x=jnp.zeros_like(x_Q), g=jnp.zeros_like(x_Q), s=zeros, y=zeros,
                rho=jnp.zeros(MEMORY, x_Q.dtype))


def _direction(g_Q: jax.Array, state: dict, x_Q: jax.Array) -> tuple[jax.Array, dict]:
    """``optax.scale_by_lbfgs(memory_size=MEMORY).update(g, state, x)`` for one slot: the pair from the
    previous point enters the ring buffer (zeros at the first point), then ``H g`` by the two-loop recursion,
    newest pair first, from the initial scaling ``s·y / y·y`` (``min(1, 1/|g|)`` at the first point)."""
    count = state["count"]
    later = count > 0
    s_new, y_new = x_Q - state["x"], g_Q - state["g"]
    sy = jnp.real(_vdot(y_new, s_new))
    rho_new = jnp.where(sy == 0.0, 0.0, 1.0 / sy)
    s_new, y_new, rho_new = (jnp.where(later, v, jnp.zeros_like(v)) for v in (s_new, y_new, rho_new))
    at = (count - 1) % MEMORY
    s_mem, y_mem, rho = state["s"].at[at].set(s_new), state["y"].at[at].set(y_new), state["rho"].at[at].set(rho_new)
    yy = jnp.sum(jnp.square(y_new.real) + jnp.square(y_new.imag))
    scale = jnp.where(yy > 0.0, jnp.real(_vdot(y_new, s_new)) / yy, 1.0)
    g_norm = jnp.sqrt(jnp.sum(jnp.square(g_Q.real) + jnp.square(g_Q.imag)))
    scale = jnp.where(later, scale, jnp.minimum(1.0, 1.0 / g_norm))
    order = (count % MEMORY + jnp.arange(MEMORY)) % MEMORY  # oldest pair first

    def right(q, k):
        alpha = rho[k] * jnp.real(_vdot(s_mem[k], q))
        return q + (-alpha) * y_mem[k], alpha

    def left(r, k_alpha):
        k, alpha = k_alpha
        beta = rho[k] * jnp.real(_vdot(y_mem[k], r))
        return r + (alpha - beta) * s_mem[k], beta

    q, alphas = jax.lax.scan(right, g_Q, order, reverse=True)
    d, _ = jax.lax.scan(left, scale * q, (order, alphas))
    count = jnp.where(count < jnp.iinfo(jnp.int32).max, count + 1, count)
    return d, dict(count=count, x=x_Q, g=g_Q, s=s_mem, y=y_mem, rho=rho)


def _pool(value_and_grad, x0_UQ, rows_UY, data, active_1, tolerances, *, S, max_iter):
    J, P = x0_UQ.shape
    n = active_1[0]  # this block's jobs n and on are padding, never loaded
    gtol, ftol = tolerances[0], tolerances[1]
    dtype = x0_UQ.dtype
    eval_Z = jax.vmap(value_and_grad, in_axes=(0, 0, None))
    direction_Z = jax.vmap(_direction)
    init_Z = jax.vmap(_direction_init)

    def where_Z(m, a, b):
        return jax.tree.map(lambda u, v: jnp.where(m.reshape(m.shape + (1,) * (u.ndim - 1)), u, v), a, b)

    def load(job_Z):
        """Fresh slots: trial point = the job's start (step 0 along a zero direction)."""
        safe = jnp.minimum(job_Z, J - 1)
        return x0_UQ[safe], rows_UY[safe]

    def step(slot, glob):
        """One objective evaluation per slot: accept or backtrack; finished slots reload."""
        active = slot["job"] < n
        fresh = slot["fresh"]
        trial = slot["x"] + slot["step"][:, None] * slot["d"]
        ft, gt = eval_Z(trial, slot["row"], data)
        ft = jnp.where(jnp.isfinite(ft) & jnp.all(jnp.isfinite(gt), axis=1), ft, jnp.inf)
        slope = jnp.sum(slot["g"] * slot["d"], axis=1)  # < 0 along a descent direction
        accept = fresh | (jnp.isfinite(ft) & (ft <= slot["f"] + 1e-4 * slot["step"] * slope))
        nfev = slot["nfev"] + 1

        # Accepted: new iterate and direction; non-positive curvature resets the memory.
        s, y = trial - slot["x"], gt - slot["g"]
        curvature_ok = jnp.sum(s * y, axis=1) > 1e-12 * jnp.linalg.norm(s, axis=1) * jnp.linalg.norm(y, axis=1)
        fresh_state = init_Z(trial)
        state = where_Z(fresh | ~curvature_ok, fresh_state, slot["state"])
        d_new, state_new = direction_Z(gt, state, trial)
        # Not a descent direction (can follow a reset): steepest descent, capped at unit length
        # (Optax's own first step), and an empty memory.
        descent = jnp.sum(d_new * gt, axis=1) > 0
        gnorm = jnp.linalg.norm(gt, axis=1, keepdims=True)
        d_new = -jnp.where(descent[:, None], d_new, gt * jnp.minimum(1.0, 1.0 / gnorm))
        state_new = where_Z(descent, state_new, fresh_state)
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
        job = jnp.where(done, jnp.minimum(queued, n), slot["job"])
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
            state=where_Z(accept, state_new, slot["state"]),
            it=jnp.where(done, 0, it),
            nfev=jnp.where(done, 0, nfev),
        )
        return slot, glob

    job = jnp.arange(S)
    x, row = load(job)
    slot = dict(job=job, fresh=jnp.ones(S, bool), x=x, row=row, f=jnp.zeros(S, dtype), g=jnp.zeros_like(x),
                d=jnp.zeros_like(x), step=jnp.zeros(S, dtype), state=init_Z(x), it=jnp.zeros(S, jnp.int32),
                nfev=jnp.zeros(S, jnp.int32))
    glob = dict(results=jnp.zeros((J, P + 2), dtype), counts=jnp.zeros((J, 3), jnp.int32).at[:, 2].set(3),
                next_job=jnp.asarray(S))

    slot, glob = jax.lax.while_loop(lambda c: jnp.any(c[0]["job"] < n), lambda c: step(*c), (slot, glob))
    res, counts = glob["results"], glob["counts"]
    return res[:, :P], res[:, P], res[:, P + 1], counts[:, 0], counts[:, 1], counts[:, 2]
