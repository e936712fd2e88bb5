"""``kernel.attention_impl: auto``: the attention implementation measured fastest for this run on this machine.

Which implementation trains a model fastest depends on the machine as much as on the model: on
one CPU the fused kernel (`jaxformer.functional.fused_attention`) was 1.5–2.7× the plain step at
8-wide heads and level with it at d = 256, and another CPU of the same kind may differ. So a run
that asks for ``auto`` times the candidates' real train steps (`TrainStepRunner`: the run's own
program, layout and batch shape, on random tokens) and trains with the fastest. The answer is
kept per machine and program in ``~/.cache/jaxformer/kernel.json``, like the matmul peak
(`jaxformer.train.peak`) and the sweep layout, so every later run of that shape (a sweep's other
budgets, its relaunches, other workers) reads it instead of measuring; a worker that meets a
program another worker is timing waits for that answer (a lock file per program).

Candidates: ``naive`` (the reference) and, on a CPU where the kernel builds and the model is in
its scope (fp32 compute, no ALiBi or T5 bias), ``fused``; on other backends ``xla``
(`jax.nn.dot_product_attention`, cuDNN's fused attention on GPUs). Another implementation wins
only when it is at least `MARGIN` faster than ``naive``: the implementations compute the same
function, but only the reference is the reference. In a multi-process run process 0's cache and
timings decide for every process, so that all compile the same program.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import Iterator

import jax
import numpy as np

from jaxformer.configs import to_dict
from jaxformer.files import read_cache, write_cache
from jaxformer.functional import fused_attention
from jaxformer.train.config import TrainConfig
from jaxformer.train.peak import machine_key

KERNEL_FILE = Path("~/.cache/jaxformer/kernel.json").expanduser()
MARGIN = 0.03  # a candidate must be this much faster than naive (a fraction of naive's step time)
STEPS, REPEATS = 3, 3  # timed steps per repeat, alternating repeats per candidate (medians)


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """What ``auto`` became: the implementation, where the answer came from, and the timings behind it.

    source: ``measured`` (timed by this run), ``cache`` (read from `KERNEL_FILE`), ``only`` (one
    candidate, nothing to time) or ``set`` (the config named an implementation). step_s: seconds
    per train step of each candidate timed (median of `REPEATS`).
    """

    attention_impl: str
    source: str
    step_s: dict[str, float] = dataclasses.field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0  # spent choosing: compiling and timing the candidates

    def to_record(self) -> dict:
        return dataclasses.asdict(self)


def candidates(config: TrainConfig) -> tuple[list[str], str]:
    """``(implementations worth timing, why fused is not among them)`` for this run on this process's backend."""
    if jax.default_backend() != "cpu":
        return ["naive", "xla"], "not a CPU backend: fused is CPU-only"
    if config.train.compute_dtype != "float32":
        return ["naive"], f"fused computes fp32 only (train.compute_dtype={config.train.compute_dtype})"
    if config.model.position in ("alibi", "relative_bias"):
        return ["naive"], f"fused has no attention bias (model.position={config.model.position})"
    if config.model.head_dim > fused_attention.MAX_HEAD_DIM:
        return ["naive"], f"fused takes heads up to {fused_attention.MAX_HEAD_DIM} wide (head_dim {config.model.head_dim})"
    if not fused_attention.fused_available():
        return ["naive"], f"the fused kernel is unavailable: {fused_attention.unavailable_reason()}"
    return ["naive", "fused"], ""


def program_key(config: TrainConfig) -> str:
    """What the choice depends on: the machine and layout (`machine_key`), the model, the batch shape and
    the rest of the kernel config — not the seed, the learning rate or the run's length."""
    program = {"model": {k: v for k, v in to_dict(config.model).items() if k != "init_from"},
               "kernel": {k: v for k, v in to_dict(config.kernel).items() if k != "attention_impl"},
               "parallel": to_dict(config.parallel), "seq_len": config.train.seq_len,
               "micro_batch": config.micro_batch, "grad_accum": config.train.grad_accum}
    digest = hashlib.sha256(json.dumps(program, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{machine_key(config.train.compute_dtype)} | {digest}"


def fastest(step_s: dict[str, float], margin: float = MARGIN) -> str:
    """The implementation to train with: the fastest, unless it beats ``naive`` by less than ``margin``."""
    best = min(step_s, key=step_s.get)
    if "naive" in step_s and step_s[best] > (1 - margin) * step_s["naive"]:
        return "naive"
    return best


def measure(config: TrainConfig, impls: list[str], steps: int = STEPS, repeats: int = REPEATS) -> dict[str, float]:
    """Seconds per train step of ``config`` with each attention implementation, in alternating repeats."""
    from jaxformer.train.throughput import TrainStepRunner  # lazily: it builds models

    runners = {impl: TrainStepRunner(with_impl(config, impl)) for impl in impls}
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    for _ in range(repeats):
        for impl, runner in runners.items():
            times[impl].append(runner.run(steps) / steps)
    return {impl: statistics.median(values) for impl, values in times.items()}


def with_impl(config: TrainConfig, impl: str) -> TrainConfig:
    return dataclasses.replace(config, kernel=dataclasses.replace(config.kernel, attention_impl=impl))


def choose(config: TrainConfig, path: str | Path | None = None) -> tuple[TrainConfig, KernelChoice]:
    """``(config with a concrete attention_impl, the choice)``; measures and caches when ``auto`` meets a new
    program. A config that names an implementation is returned as it is."""
    if config.kernel.attention_impl != "auto":
        return config, KernelChoice(config.kernel.attention_impl, "set")
    path = KERNEL_FILE if path is None else Path(path)
    started = time.perf_counter()
    impls, reason = candidates(config)
    if len(impls) == 1:
        return with_impl(config, impls[0]), KernelChoice(impls[0], "only", reason=reason)
    key = program_key(config)
    with _timing_lock(path, key):  # a worker that meets a program another is timing waits for its answer
        cached = read_cache(path).get(key)
        if _from_process_0(cached is not None and set(cached["step_s"]) == set(impls)):
            chosen = _from_process_0(impls.index(cached["attention_impl"]) if jax.process_index() == 0 else 0)
            choice = KernelChoice(impls[chosen], "cache", cached["step_s"] if cached else {}, reason,
                                  time.perf_counter() - started)
        else:  # every process times the same global steps; process 0's timings decide for all
            step_s = measure(config, impls)
            chosen = _from_process_0(impls.index(fastest(step_s)))
            choice = KernelChoice(impls[chosen], "measured", step_s, reason, time.perf_counter() - started)
            cache = read_cache(path)  # re-read: another worker may have written meanwhile
            cache[key] = {"attention_impl": choice.attention_impl, "step_s": step_s, "measured_at": time.time()}
            write_cache(path, cache)
    return with_impl(config, choice.attention_impl), choice


@contextlib.contextmanager
def _timing_lock(path: Path, key: str) -> Iterator[None]:
    """Holds this machine's lock on timing program ``key`` (a file beside the cache); none where it cannot be made."""
    lock_path = path.parent / "kernel-locks" / hashlib.sha256(key.encode()).hexdigest()[:16]
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _from_process_0(value: int | bool) -> int:
    """Process 0's ``value`` in every process of a multi-process run, so that all compile the same program."""
    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))
