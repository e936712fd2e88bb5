"""Executors: where a sweep's runs train — on warm workers (`jaxformer.sweep.worker`).

``local``: one warm worker process per slot (sized to the cores by the launch layout), each
training runs back to back, fed by a supervising thread from one queue. ``ray``: the same
workers as Ray actors, each asking for its CPUs (and GPUs), on a local Ray instance or an
existing cluster (``ray_address``); the sweep directory must be on a filesystem every node sees.
A worker that dies is replaced and its run resumed (`WarmWorker`); the other runs go on.
Both take runs and groups of runs (a tuple of names: one request, trained together by one worker).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

from jaxformer.runtime import HOST_DEVICES
from jaxformer.sweep.runs import Outcome
from jaxformer.sweep.worker import WarmWorker


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


def _groups(names: Iterable[str | Sequence[str]]) -> list[tuple[str, ...]]:
    """Each item as a group: a name alone, or the names of runs to train together."""
    return [(item,) if isinstance(item, str) else tuple(item) for item in names]


def run_local(sweep_dir: Path, names: Iterable[str | Sequence[str]], workers: int, threads: int,
              on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
    """Trains ``names`` (run names, or tuples of names to train together) on ``workers`` warm worker processes;
    ``on_event(name, "running"|"finished", outcome)`` for each run."""
    queue, lock, outcomes = _groups(names), threading.Lock(), []
    env = thread_environment(threads)

    def supervise(slot: int) -> None:
        worker = WarmWorker(sweep_dir, env, sweep_dir / "logs" / f"worker-{slot}.log")
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    group = queue.pop(0)
                for name in group:
                    on_event(name, "running", None)
                finished = worker.train_group(group)
                with lock:
                    outcomes.extend(finished)
                for outcome in finished:
                    on_event(outcome.name, "finished", outcome)
        finally:
            worker.close()

    supervisors = [threading.Thread(target=supervise, args=(slot,)) for slot in range(min(workers, len(queue)))]
    for supervisor in supervisors:
        supervisor.start()
    for supervisor in supervisors:
        supervisor.join()
    return outcomes


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


class _RayWorker:
    """A Ray actor holding one `WarmWorker` on its node: the same warm process as a local worker."""

    def __init__(self, sweep_dir: str, threads: int, slot: int) -> None:
        self.worker = WarmWorker(Path(sweep_dir), thread_environment(threads),
                                 Path(sweep_dir) / "logs" / f"worker-ray-{slot}-{socket.gethostname()}.log")

    def train_group(self, names: tuple[str, ...]) -> list[Outcome]:
        return self.worker.train_group(names)

    def close(self) -> None:
        self.worker.close()


def run_ray(ray, sweep_dir: Path, names: Iterable[str | Sequence[str]], workers: int | None, threads: int,
            gpus_per_run: float, on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
    """Trains ``names`` (runs, or tuples of runs to train together) on Ray actors (``workers`` of them: default,
    as many as the cluster's CPUs allow), each asking for ``max(threads, 1)`` CPUs and ``gpus_per_run`` GPUs
    and keeping one warm worker."""
    queue = _groups(names)
    cpus = max(threads, 1)
    count = workers or max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
    actor = ray.remote(num_cpus=cpus, num_gpus=gpus_per_run, max_restarts=0)(_RayWorker)
    actors = [actor.remote(str(sweep_dir.resolve()), threads, slot) for slot in range(min(count, len(queue)))]
    pending, outcomes = {}, []
    for group in queue:
        for name in group:
            on_event(name, "submitted", None)
    for handle in actors:
        if queue:
            pending[handle.train_group.remote(queue.pop(0))] = handle
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        handle = pending.pop(ready[0])
        for outcome in ray.get(ready[0]):
            outcomes.append(outcome)
            on_event(outcome.name, "finished", outcome)
        if queue:
            group = queue.pop(0)
            for name in group:
                on_event(name, "running", None)
            pending[handle.train_group.remote(group)] = handle
    ray.get([handle.close.remote() for handle in actors])
    return outcomes
