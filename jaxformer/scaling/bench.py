"""`jaxformer bench fit`: the pooled JAX L-BFGS fit against scipy's L-BFGS-B, side by side.

Both minimise the same Approach-3 objective (Huber δ = 1e-3 on log loss, summed) from the
same 4500-start grid on the same runs (default: the Chinchilla extraction, 5 highest-loss
runs excluded). scipy gets the objective and its analytic gradient in numpy (its fastest
form: no JAX dispatch per call) and its default tolerances, which ``lbfgs.minimize`` also
uses. Reported: wall and CPU time of each (JAX: first call with compilation, then the median of
warm calls), the speedups, the relative difference of the optima, and the time of the
Approach-3 bootstrap (default 4000 resamples, first call, compilation included). On a
shared machine prefer the CPU-time ratio: a Python loop of small numpy calls loses far more
wall time to other processes than one long vectorised computation does.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from jaxformer.files import write_json_atomic
from jaxformer.scaling.table import load_table

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "chinchilla_svg_extracted.csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="table of runs (default: the Chinchilla extraction)")
    parser.add_argument("--exclude-highest-loss", type=int, default=5, metavar="K")
    parser.add_argument("--scipy-stride", type=int, default=1, metavar="K",
                        help="scipy runs every K-th start and its time is scaled by K (default 1: all starts)")
    parser.add_argument("--repeats", type=int, default=3, help="warm JAX fits to time (median)")
    parser.add_argument("--bootstrap", type=int, default=4000, help="resamples in the timed bootstrap (0: skip)")
    parser.add_argument("--out", metavar="FILE.json", help="also write the numbers as JSON")


def numpy_value_and_grad(x, log_n, log_d, log_loss, delta):
    """The Approach-3 objective and its gradient in numpy, for scipy (same algebra as the JAX one)."""
    log_a, log_b, log_e, alpha, beta = x
    with np.errstate(over="ignore", invalid="ignore"):
        t1 = np.exp(log_a - log_e - alpha * log_n)
        t2 = np.exp(log_b - log_e - beta * log_d)
        r = log_e + np.log1p(t1 + t2) - log_loss
        dh = np.clip(r, -delta, delta)
        q = dh / (1.0 + t1 + t2)
        g1, g2 = q * t1, q * t2
        grad = np.array([g1.sum(), g2.sum(), q.sum(), -(g1 @ log_n), -(g2 @ log_d)])
        return float(np.sum(dh * (r - 0.5 * dh))), grad


def scipy_fit(table, starts: np.ndarray, delta: float) -> tuple[np.ndarray, float, int]:
    """Best (x, objective) over scipy L-BFGS-B runs from each start; also how many converged."""
    from scipy.optimize import minimize

    args = (np.log(table.N), np.log(table.D), np.log(table.loss), delta)
    best_x, best_f, converged = None, np.inf, 0
    for x0 in starts:
        res = minimize(numpy_value_and_grad, x0, args=args, jac=True, method="L-BFGS-B")
        converged += bool(res.success)
        if np.isfinite(res.fun) and res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    return best_x, best_f, converged


class _Clock:
    """Wall time and process CPU time (all threads) of a block: on a shared machine the CPU
    time is the steadier measure of work, the wall time what a user waits."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run(args: argparse.Namespace) -> int:
    from jaxformer.scaling.bootstrap import bootstrap_parametric
    from jaxformer.scaling.parametric import HUBER_DELTA, fit_parametric, hoffmann_grid

    table = load_table(args.data).exclude_highest_loss(args.exclude_highest_loss)
    grid = hoffmann_grid()
    print(f"{len(table)} runs from {args.data}; {len(grid)} starts", flush=True)

    with _Clock() as first:
        fit = fit_parametric(table, starts=grid)
    warm = []
    for _ in range(max(args.repeats, 1)):
        with _Clock() as clock:
            fit = fit_parametric(table, starts=grid)
        warm.append(clock)
    jax_wall = float(np.median([c.wall for c in warm]))
    jax_cpu = float(np.median([c.cpu for c in warm]))
    print(f"JAX pooled L-BFGS: first call {first.wall:.2f} s (with compilation), warm {jax_wall:.2f} s wall, "
          f"{jax_cpu:.2f} s CPU", flush=True)

    stride = max(args.scipy_stride, 1)
    with _Clock() as sp:
        x_sp, f_sp, conv_sp = scipy_fit(table, grid[::stride], HUBER_DELTA)
    scipy_wall, scipy_cpu = sp.wall * stride, sp.cpu * stride
    print(f"scipy L-BFGS-B: {scipy_wall:.1f} s wall, {scipy_cpu:.1f} s CPU"
          + (f" (every {stride}th start, times x{stride})" if stride > 1 else ""), flush=True)

    result = {
        "runs": len(table),
        "starts": len(grid),
        "jax_first_s": first.wall,
        "jax_warm_s": jax_wall,
        "jax_warm_cpu_s": jax_cpu,
        "scipy_s": scipy_wall,
        "scipy_cpu_s": scipy_cpu,
        "scipy_stride": stride,
        "speedup_wall": scipy_wall / jax_wall,
        "speedup_cpu": scipy_cpu / jax_cpu,
        "speedup_first_call": scipy_wall / first.wall,
        "objective_jax": fit.objective,
        "objective_scipy": f_sp,
        "objective_rel_diff": abs(fit.objective - f_sp) / abs(f_sp),
        "params_jax": fit.law.to_dict(),
        "params_scipy": {"E": float(np.exp(x_sp[2])), "A": float(np.exp(x_sp[0])), "B": float(np.exp(x_sp[1])),
                         "alpha": float(x_sp[3]), "beta": float(x_sp[4])},
        "converged_jax": fit.convergence["converged"],
        "converged_scipy": conv_sp * stride,
    }
    print(f"speedup {result['speedup_wall']:.1f}x wall, {result['speedup_cpu']:.1f}x CPU, "
          f"{result['speedup_first_call']:.1f}x against JAX's first call; objectives {fit.objective:.12g} (JAX) vs "
          f"{f_sp:.12g} (scipy), relative difference {result['objective_rel_diff']:.2e}")
    if args.bootstrap:
        with _Clock() as boot_clock:
            boot = bootstrap_parametric(table, fit, resamples=args.bootstrap)
        result.update(bootstrap_resamples=args.bootstrap, bootstrap_s=boot_clock.wall, bootstrap_cpu_s=boot_clock.cpu,
                      bootstrap_se={k: boot.stats[k].se for k in ("E", "alpha", "beta", "a")})
        print(f"bootstrap: {args.bootstrap} resamples in {boot_clock.wall:.1f} s wall, {boot_clock.cpu:.1f} s CPU "
              "(with compilation); SE " + ", ".join(f"{k} {v:.4f}" for k, v in result["bootstrap_se"].items()))
    if args.out:
        write_json_atomic(Path(args.out), result, indent=1)
    return 0
