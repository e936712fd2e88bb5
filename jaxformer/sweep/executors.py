"""Executors: where a sweep's runs train — on warm workers (`jaxformer.sweep.worker`).

``local``: one warm worker process per slot (sized to the cores, or one per GPU, by the launch layout), each
training runs back to back, fed by a supervising thread from one `WorkQueue`; a `LocalPool`
keeps the processes for every stage of a launch. ``ray``: the same workers as Ray actors, each
asking for its CPUs (and GPUs), on a local Ray instance or an existing cluster (``ray_address``);
the sweep directory must be on a filesystem every node sees. A worker that dies is replaced and
its run resumed (`WarmWorker`), and so is a Ray actor (`run_ray`); the other runs go on. Both take runs and
groups of runs (a tuple of names: one request, trained together by one worker), each once its dependency has
finished.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from jaxformer.runtime import HOST_DEVICES, without_ynn_fusion_on_one_device
from jaxformer.sweep.accelerators import local_accelerators, worker_environment
from jaxformer.sweep.queue import WorkQueue
from jaxformer.sweep.runs import Outcome, RunPaths, run_lock
from jaxformer.sweep.worker import ATTEMPTS, STOP_GRACE_S, WarmWorker


def thread_environment(threads: int) -> dict[str, str]:
    """Environment for a training process limited to ``threads`` CPU threads (0: no limit).

    A limited process also gets one JAX device per thread (`jaxformer.runtime`), not one per core.
    """
    env = dict(os.environ)
    if threads > 0:
        flags = " ".join(flag for flag in env.get("XLA_FLAGS", "").split() if not flag.startswith(HOST_DEVICES))
        # every entry a --flag: XLA reads none after a bare word (a device count after one was dropped)
        env["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} " \
                           f"{HOST_DEVICES}={threads}".strip()
        if env.get("JAXFORMER_TUNE") != "0":
            env["XLA_FLAGS"] = without_ynn_fusion_on_one_device(env["XLA_FLAGS"])
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(threads)
    return env


class LocalPool:
    """``workers`` warm worker processes of ``threads`` CPU threads each, kept for every stage of a launch (the
    tuning stage, trunks, branches, adapt rounds, held-out runs): each process starts once and keeps the programs
    it compiled. Started on first use; `close` ends them."""

    def __init__(self, workers: int, threads: int, log_dir: Path) -> None:
        env, accelerators = thread_environment(threads), local_accelerators()
        self.workers = [WarmWorker(worker_environment(env, slot, workers, accelerators),
                                   Path(log_dir) / "logs" / f"worker-{slot}.log") for slot in range(workers)]
        self.compiled: set[str] = set()  # the shapes these processes have compiled (`WorkQueue.compiled`)

    def run(self, sweep_dir: Path, queue: WorkQueue,
            on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
        """Trains ``queue``'s runs of ``sweep_dir``; ``on_event(name, "running"|"finished", outcome)`` for each.
        A queue made with ``compiled=self.compiled`` knows the shapes these processes compiled in earlier stages."""
        outcomes, errors, lock = [], [], threading.Lock()

        def supervise(worker: WarmWorker) -> None:
            try:
                while (taken := queue.take()) is not None:
                    group, finished = taken
                    if group:
                        for name in group:
                            on_event(name, "running", None)
                        trained = worker.train_group(sweep_dir, group)
                        queue.finish(trained)
                        finished = finished + trained
                    with lock:
                        outcomes.extend(finished)
                    for outcome in finished:
                        on_event(outcome.name, "finished", outcome)
            except BaseException as error:  # a bug here: the other supervisors stop after their runs, and it is raised
                errors.append(error)
                queue.abandon()

        supervisors = [threading.Thread(target=supervise, args=(worker,))
                       for worker in self.workers[:min(len(self.workers), len(queue))]]
        try:
            for supervisor in supervisors:
                supervisor.start()
            for supervisor in supervisors:
                supervisor.join()
        except KeyboardInterrupt:  # Ctrl-C: no run begins any more
            queue.abandon()
            self.interrupt()
            for supervisor in supervisors:
                if supervisor.ident is not None:
                    supervisor.join()
            raise
        if errors:
            raise errors[0]
        return outcomes

    def interrupt(self) -> None:
        """Ctrl-C: each worker's run stops (it resumes at a relaunch); a worker the terminal's Ctrl-C did not reach
        (a signal to the launching process alone) is sent one after a second, and one still running `STOP_GRACE_S`
        seconds after that is killed."""
        deadline = time.monotonic() + 1.0
        for worker in self.workers:
            worker.interrupt(deadline)
        for worker in self.workers:  # one that has not ended by then is killed
            worker.end_by(deadline + STOP_GRACE_S)

    def close(self) -> None:
        for worker in self.workers:  # all told first, so that they end side by side
            worker.stop()
        for worker in self.workers:
            worker.close()


def run_local(sweep_dir: Path, queue: WorkQueue, workers: int, threads: int,
              on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
    """Trains ``queue``'s runs on ``workers`` warm worker processes started for them (`LocalPool`)."""
    pool = LocalPool(workers, threads, sweep_dir)
    try:
        return pool.run(sweep_dir, queue, on_event)
    except KeyboardInterrupt:
        pool.interrupt()
        raise
    finally:
        pool.close()


def connect_ray(address: str | None, cpus: int | None):
    """Joins the Ray cluster at ``address``, or starts a local instance of ``cpus`` CPUs (None: the machine's) and
    the GPUs Ray finds; an unreachable address raises ``ValueError`` before any run starts."""
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
            ray.init(num_cpus=cpus, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    except Exception as error:  # Ray raises ConnectionError, RuntimeError, … for a bad address
        raise ValueError(f"cannot reach Ray at --ray-address {address!r}: {str(error).splitlines()[0]}") from None
    return ray


def local_ray_cpus(workers: int | None, threads: int) -> int:
    """The CPUs a local Ray instance needs: room for ``workers`` actors of ``max(threads, 1)`` CPUs each (default:
    the machine's cores, and room for one actor at least)."""
    cpus = max(threads, 1)
    return workers * cpus if workers else max(os.cpu_count() or 1, cpus)


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
        self.sweep_dir = Path(sweep_dir)
        self.worker = WarmWorker(thread_environment(threads),
                                 self.sweep_dir / "logs" / f"worker-ray-{slot}-{socket.gethostname()}.log")

    def train_group(self, names: tuple[str, ...]) -> list[Outcome]:
        return self.worker.train_group(self.sweep_dir, names)

    def close(self) -> None:
        self.worker.close()


def ray_nodes(ray) -> list[dict[str, float]]:
    """The resources of each live node of the cluster ``ray`` is connected to."""
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def ray_actor_count(nodes: list[dict[str, float]], cpus: int, gpus_per_run: float, workers: int | None = None) -> int:
    """How many actors of ``cpus`` CPUs and ``gpus_per_run`` GPUs to start on a cluster of ``nodes`` (each node's
    resources, `ray_nodes`): ``workers`` (default: as many as fit), at most as many as the nodes hold at once. An
    actor lives on one node, so each node holds whole actors of its own CPUs and GPUs (two nodes of 3 CPUs hold two
    actors of 2, not three); an actor that does not fit would wait for resources the others never free, and its runs
    with it. Raises ``ValueError`` when not even one fits."""

    def most(key: str) -> float:
        return max((node.get(key, 0.0) for node in nodes), default=0.0)

    def holds(node: dict[str, float]) -> int:
        fits = [node.get("CPU", 0.0) // cpus] + ([node.get("GPU", 0.0) // gpus_per_run] if gpus_per_run > 0 else [])
        return int(min(fits))

    if gpus_per_run > most("GPU"):
        raise ValueError(f"--gpus-per-run {gpus_per_run:g}: the largest Ray node has {most('GPU'):g} GPUs")
    if cpus > most("CPU"):
        raise ValueError(f"--threads {cpus}: each Ray actor asks for {cpus} CPUs, and the largest Ray node has "
                         f"{most('CPU'):g}")
    fit = sum(holds(node) for node in nodes)
    if fit == 0:
        raise ValueError(f"--threads {cpus} --gpus-per-run {gpus_per_run:g}: no Ray node has both the CPUs and "
                         f"the GPUs of one actor")
    return min(workers, fit) if workers else fit


def run_ray(ray, sweep_dir: Path, queue: WorkQueue, count: int, threads: int, gpus_per_run: float,
            on_event: Callable[[str, str, Outcome | None], None]) -> list[Outcome]:
    """Trains ``queue``'s runs on ``count`` Ray actors (`ray_actor_count`), each asking for ``max(threads, 1)`` CPUs
    and ``gpus_per_run`` GPUs and keeping one warm worker.

    An actor that dies (its process killed, its node lost) is replaced, and the group it was training goes to
    the replacement, which resumes its runs from their checkpoints; a group whose actors die `ATTEMPTS` times is
    recorded as failed. The other runs go on either way.
    """
    actor = ray.remote(num_cpus=max(threads, 1), num_gpus=gpus_per_run, max_restarts=0)(_RayWorker)
    slots = itertools.count()

    def start():
        return actor.remote(str(sweep_dir.resolve()), threads, next(slots))

    actors = [start() for _ in range(min(count, len(queue)))]
    for group in queue.waiting:
        for name in group:
            on_event(name, "submitted", None)
    pending, idle, outcomes = {}, list(actors), []  # pending: the task's reference -> (actor, group, attempt)

    def settle(finished: list[Outcome]) -> None:  # recorded in the queue already
        for outcome in finished:
            outcomes.append(outcome)
            on_event(outcome.name, "finished", outcome)

    while True:
        while idle and (taken := queue.take(wait=False)) is not None:
            group, settled = taken
            settle(settled)
            if group:
                for name in group:
                    on_event(name, "running", None)
                handle = idle.pop()
                pending[handle.train_group.remote(group)] = (handle, group, 1)
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1)
        handle, group, attempt = pending.pop(ready[0])
        try:
            trained = ray.get(ready[0])
        except ray.exceptions.RayActorError as error:
            actors.remove(handle)
            ray.kill(handle)  # one only unreachable (ActorUnavailableError) would keep its resources, and its run
            handle = start()
            actors.append(handle)
            _wait_released(sweep_dir, group)  # the dead actor's worker process, which Ray ends after it
            if attempt < ATTEMPTS:
                pending[handle.train_group.remote(group)] = (handle, group, attempt + 1)
                continue
            trained = [_actor_died(sweep_dir, name, error) for name in group]
        idle.append(handle)
        queue.finish(trained)
        settle(trained)
    for closed in [handle.close.remote() for handle in actors]:
        with contextlib.suppress(ray.exceptions.RayActorError):  # an idle actor lost with its node: nothing to end
            ray.get(closed)
    return outcomes


def _actor_died(sweep_dir: Path, name: str, error: Exception) -> Outcome:
    """The outcome of a run of a group whose Ray actors died `ATTEMPTS` times: ``done`` when it finished before,
    ``busy`` when another launch holds it, else ``failed`` (with its status record)."""
    paths = RunPaths(sweep_dir, name)
    with run_lock(paths) as free:
        if not free:
            return Outcome(name, "busy", "another launch holds its lock")
        if paths.state() == "done":
            return Outcome(name, "done")
        message = str(error).partition("\n")[0]
        reason = f"its Ray actor died {ATTEMPTS} times ({type(error).__name__}: {message})"
        paths.record("failed", reason=reason)
        return Outcome(name, "failed", reason)


def _wait_released(sweep_dir: Path, names: tuple[str, ...], timeout_s: float = 60.0) -> None:
    """Waits until no process holds the locks of the runs ``names`` (at most ``timeout_s``; a run still locked
    then is answered ``busy`` by the worker that tries it)."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        while time.monotonic() < deadline:
            with run_lock(RunPaths(sweep_dir, name)) as free:
                if free:
                    break
            time.sleep(0.2)
