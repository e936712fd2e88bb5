"""Executors: where a sweep's runs train. Each run is one `jaxformer train` process.

``local``: a pool of worker threads, each supervising one training subprocess at a time
(one run per process, sized to the cores). ``ray``: each run is a Ray task with its CPU
(and GPU) request, on a local Ray instance or an existing cluster (``ray_address``); the
task runs the same subprocess on whichever node Ray picks, so the sweep directory must be
on a filesystem every node sees.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

from jaxformer.runtime import HOST_DEVICES
from jaxformer.sweep.runs import RunPaths, failure_reason, run_lock


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one run: ``done``, ``failed``, ``skipped`` (done already) or ``busy`` (locked elsewhere)."""

    name: str
    status: str
    reason: str = ""
    wall_s: float = 0.0


def thread_environment(threads: int) -> dict[str, str]:
    """Environment for a training process limited to ``threads`` CPU threads (0: no limit).

    A limited process also gets one JAX device per thread (`jaxformer.runtime`), not one per core.
    """
    env = dict(os.environ)
    if threads > 0:
        flags = " ".join(flag for flag in env.get("XLA_FLAGS", "").split() if not flag.startswith(HOST_DEVICES))
        env["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} " \
                           f"intra_op_parallelism_threads={threads} {HOST_DEVICES}={threads}".strip()
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(threads)
    return env


def train_one(sweep_dir: str, name: str, threads: int) -> Outcome:
    """Trains run ``name`` in a subprocess under its lock; the unit both executors call."""
    paths = RunPaths(Path(sweep_dir), name)
    with run_lock(paths) as held:
        if not held:
            return Outcome(name, "busy", "another launch holds its lock")
        if paths.final.is_file():
            return Outcome(name, "skipped")
        paths.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        command = [sys.executable, "-m", "jaxformer.cli", "train", str(paths.config), "logging.progress=plain",
                   "--run-dir", str(paths.run_dir)]
        with open(paths.log, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            process = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=thread_environment(threads),
                                     stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        if process.returncode == 0 and paths.final.is_file():
            paths.record("done", wall_s=wall)
            return Outcome(name, "done", wall_s=wall)
        reason = failure_reason(paths, process.returncode)
        paths.record("failed", reason=reason, returncode=process.returncode, wall_s=wall)
        return Outcome(name, "failed", reason, wall)


def run_local(sweep_dir: Path, names: Iterable[str], workers: int, threads: int,
              on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
    """Runs ``names`` on ``workers`` parallel processes; ``on_event(name, "running"|"finished", outcome)``."""

    def supervised(name: str) -> Outcome:
        on_event(name, "running", None)
        outcome = train_one(str(sweep_dir), name, threads)
        on_event(name, "finished", outcome)
        return outcome

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(supervised, names))


def connect_ray(address: str | None, num_cpus: int | None):
    """Starts or joins Ray; an unreachable address raises ``ValueError`` before any run starts."""
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install 'jaxformer[ray]'") from None
    if address and address != "auto":
        _check_reachable(address)
    try:
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    except Exception as error:  # Ray raises ConnectionError, RuntimeError, … for a bad address
        raise ValueError(f"cannot reach Ray at --ray-address {address!r}: {str(error).splitlines()[0]}") from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connection to ``[ray://]host:port``; Ray itself would retry for minutes before failing."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot reach Ray at --ray-address {address!r}: {error}") from None


def run_ray(ray, sweep_dir: Path, names: Iterable[str], threads: int, gpus_per_run: float,
            on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
    """Runs ``names`` as Ray tasks, each asking for ``max(threads, 1)`` CPUs and ``gpus_per_run`` GPUs."""
    task = ray.remote(num_cpus=max(threads, 1), num_gpus=gpus_per_run, max_retries=0)(train_one)
    pending = {}
    for name in names:
        pending[task.remote(str(sweep_dir.resolve()), name, threads)] = name
        on_event(name, "submitted", None)
    outcomes = []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        outcome = ray.get(ready[0])
        pending.pop(ready[0])
        outcomes.append(outcome)
        on_event(outcome.name, "finished", outcome)
    return outcomes
