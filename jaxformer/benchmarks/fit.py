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

scipy runs in a process of its own whose BLAS libraries (OpenBLAS, MKL, OpenMP) use one
thread (``--scipy-blas-threads``): L-BFGS-B makes thousands of tiny BLAS calls per start, and
OpenBLAS's default of a thread per core makes each of them wait for a second thread, which on
a machine shared with other work makes scipy several times slower and its time unrepeatable
(docs/fit-speed.md). ``--scipy-blas-threads 0`` runs it in this process with the libraries'
own defaults, as before.

``--command-runs N`` (default 5) also times what a user waits for: ``jaxformer fit DATA
--approach 3 --bootstrap 0`` end to end in fresh processes (Python start-up, imports, JAX
start-up, the solver's compilation or its load from the persistent cache, the fit, the
report), N times with an empty compilation cache (cold) and N times with the cache the first
cold run filled (warm). scipy then runs in N interleaved slices of its starts, one after each
cold/warm pair, and each round's ratio is its scipy slice (scaled to all starts) over its
command run. The children inherit this process's tuned environment, so they skip the
command's one re-execution into it (a few hundredths of a second).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxformer.arguments import integer
from jaxformer.benchmarks.environment import environment
from jaxformer.benchmarks.outputs import output_file
from jaxformer.files import write_json_atomic
from jaxformer.runtime import CACHE_DIR_ENV
from jaxformer.scaling.bootstrap import RESAMPLES, bootstrap_parametric
from jaxformer.scaling.parametric import HUBER_DELTA, fit_parametric, hoffmann_grid
from jaxformer.scaling.table import load_table

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "chinchilla_svg_extracted.csv"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="table of runs (default: the Chinchilla extraction)")
    parser.add_argument("--exclude-highest-loss", type=int, default=5, metavar="K")
    parser.add_argument("--scipy-stride", type=integer(1), default=1, metavar="K",
                        help="scipy runs every K-th start and its time is scaled by K (default 1: all starts)")
    parser.add_argument("--repeats", type=integer(1), default=3, help="warm JAX fits to time (median)")
    parser.add_argument("--bootstrap", type=integer(0), default=RESAMPLES,
                        help="resamples in the timed bootstrap (0: skip)")
    parser.add_argument("--scipy-blas-threads", type=int, default=1, metavar="N",
                        help="BLAS threads of the process scipy runs in (default 1; 0: in this process, as the "
                             "libraries default)")
    parser.add_argument("--command-runs", type=integer(0), default=5, metavar="N",
                        help="also time `jaxformer fit` end to end in fresh processes, N with an empty compilation "
                             "cache and N with a warm one, interleaved with N slices of the scipy run (0: skip)")
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


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def scipy_in_child(data: str, exclude: int, starts: np.ndarray, delta: float, threads: int):
    """``scipy_fit`` over ``starts`` in a child process with ``threads`` BLAS threads: its clock (solver
    only), best x, best objective and converged count."""
    env = {**os.environ, **{name: str(threads) for name in BLAS_THREAD_VARIABLES}}
    job = json.dumps({"data": data, "exclude": exclude, "starts": np.asarray(starts).tolist(), "delta": delta})
    done = subprocess.run([sys.executable, "-m", "jaxformer.benchmarks.fit"], input=job, env=env, capture_output=True,
                          text=True, check=True)
    out = json.loads(done.stdout)
    clock = _Clock()
    clock.wall, clock.cpu = out["wall"], out["cpu"]
    return clock, None if out["x"] is None else np.asarray(out["x"]), out["f"], out["converged"]


def _scipy_child() -> None:
    """The child of ``scipy_in_child``: the job as JSON on stdin, the answer as JSON on stdout."""
    job = json.loads(sys.stdin.read())
    table = load_table(job["data"]).exclude_highest_loss(job["exclude"])
    with _Clock() as clock:
        x, f, converged = scipy_fit(table, np.asarray(job["starts"], dtype=np.float64), job["delta"])
    print(json.dumps({"wall": clock.wall, "cpu": clock.cpu, "x": None if x is None else list(map(float, x)),
                      "f": f, "converged": converged}))


def command_timer(data: str, exclude: int):
    """A function ``cache_dir -> (wall s, CPU s)`` timing ``jaxformer fit DATA --approach 3 --bootstrap 0`` in a
    fresh process (its children included) with the persistent compilation cache in ``cache_dir``."""
    command = [sys.executable, "-m", "jaxformer.cli", "fit", data, "--approach", "3", "--bootstrap", "0",
               "--exclude-highest-loss", str(exclude)]

    def once(cache: Path) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, env={**os.environ, CACHE_DIR_ENV: str(cache)}, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    once.command = " ".join(["jaxformer", *command[3:]])
    return once


class _Clock:
    """Wall time and process CPU time (all threads) of a block: on a shared machine the CPU
    time is the steadier measure of work, the wall time what a user waits."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run(args: argparse.Namespace) -> int:
    table = load_table(args.data).exclude_highest_loss(args.exclude_highest_loss)
    out = output_file(args.out, "--out")
    grid = hoffmann_grid()
    machine = environment()
    print(f"{len(table)} runs from {args.data}; {len(grid)} starts; CPU: {machine['cpu_model']}, "
          f"{machine['cores']} cores", flush=True)

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

    # scipy in `rounds` interleaved slices of its starts, each after one cold and one warm run of the
    # command: a ratio of two times taken minutes apart means little on a shared machine
    stride, rounds = max(args.scipy_stride, 1), max(args.command_runs, 1)
    scipy_starts = grid[::stride]
    slices, cold_runs, warm_runs = [], [], []
    x_sp, f_sp, conv_sp = None, np.inf, 0
    timer = command_timer(args.data, args.exclude_highest_loss) if args.command_runs > 0 else None
    with tempfile.TemporaryDirectory(prefix="jaxformer-fit-cache-") as caches:
        for r in range(rounds):
            if timer:
                cold_runs.append(timer(Path(caches) / f"cold{r}"))  # an empty cache
                warm_runs.append(timer(Path(caches) / "cold0"))  # the cache the first cold run filled
            if args.scipy_blas_threads > 0:
                sp, x, f, conv = scipy_in_child(args.data, args.exclude_highest_loss, scipy_starts[r::rounds],
                                                HUBER_DELTA, args.scipy_blas_threads)
            else:
                with _Clock() as sp:
                    x, f, conv = scipy_fit(table, scipy_starts[r::rounds], HUBER_DELTA)
            slices.append(sp)
            conv_sp += conv
            if x is not None and f < f_sp:
                x_sp, f_sp = x, f
    scipy_wall, scipy_cpu = sum(c.wall for c in slices) * stride, sum(c.cpu for c in slices) * stride
    print(f"scipy L-BFGS-B: {scipy_wall:.1f} s wall, {scipy_cpu:.1f} s CPU"
          + (f" (every {stride}th start, times x{stride})" if stride > 1 else "")
          + (f", BLAS threads {args.scipy_blas_threads}" if args.scipy_blas_threads > 0 else ", BLAS as it defaults"),
          flush=True)

    result = {
        **machine,
        "runs": len(table),
        "starts": len(grid),
        "jax_first_s": first.wall,
        "jax_warm_s": jax_wall,
        "jax_warm_cpu_s": jax_cpu,
        "scipy_s": scipy_wall,
        "scipy_cpu_s": scipy_cpu,
        "scipy_stride": stride,
        "scipy_blas_threads": args.scipy_blas_threads or None,
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
    if timer:
        med = lambda xs: float(np.median(xs))  # noqa: E731
        # per round: scipy's slice scaled to all starts, over that round's command run
        paired = {kind: [sp.wall * rounds * stride / w for sp, (w, _) in zip(slices, runs)]
                  for kind, runs in (("cold", cold_runs), ("warm", warm_runs))}
        result["command"] = {
            "command": timer.command, "runs": rounds,
            "cold_s": med([w for w, _ in cold_runs]), "cold_cpu_s": med([c for _, c in cold_runs]),
            "warm_s": med([w for w, _ in warm_runs]), "warm_cpu_s": med([c for _, c in warm_runs]),
            "cold_runs_s": [w for w, _ in cold_runs], "warm_runs_s": [w for w, _ in warm_runs],
            "speedup_cold": scipy_wall / med([w for w, _ in cold_runs]),
            "speedup_warm": scipy_wall / med([w for w, _ in warm_runs]),
            "speedup_cold_paired": med(paired["cold"]), "speedup_warm_paired": med(paired["warm"]),
        }
        c = result["command"]
        print(f"`{c['command']}` end to end, median of {rounds} fresh processes: cold cache {c['cold_s']:.2f} s wall "
              f"({c['cold_cpu_s']:.2f} s CPU), warm cache {c['warm_s']:.2f} s wall ({c['warm_cpu_s']:.2f} s CPU); "
              f"scipy's solver time over these: cold {c['speedup_cold']:.1f}x, warm {c['speedup_warm']:.1f}x "
              f"(round by round: cold {c['speedup_cold_paired']:.1f}x, warm {c['speedup_warm_paired']:.1f}x)",
              flush=True)
    if args.bootstrap:
        with _Clock() as boot_clock:
            boot = bootstrap_parametric(table, fit, resamples=args.bootstrap)
        result.update(bootstrap_resamples=args.bootstrap, bootstrap_s=boot_clock.wall, bootstrap_cpu_s=boot_clock.cpu,
                      bootstrap_se={k: boot.stats[k].se for k in ("E", "alpha", "beta", "a")})
        print(f"bootstrap: {args.bootstrap} resamples in {boot_clock.wall:.1f} s wall, {boot_clock.cpu:.1f} s CPU "
              "(with compilation); SE " + ", ".join(f"{k} {v:.4f}" for k, v in result["bootstrap_se"].items()))
    if out is not None:
        write_json_atomic(out, result, indent=1)
    return 0


if __name__ == "__main__":
    _scipy_child()
