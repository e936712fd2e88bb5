"""``kernel.attention_impl: auto``: the attention implementation measured fastest for this run on this machine.

Which implementation trains a model fastest depends on the machine as much as on the model: on
one CPU the fused kernel (`jaxformer.functional.fused_attention`) was 1.5–2.7× the plain step at
8-wide heads and level with it at d = 256, and another CPU of the same kind may differ. So a run
that asks for ``auto`` times the candidates and trains with the fastest. Only attention differs
between the candidates' train steps, so what is timed is the run's attention call alone, forward
and backward (`AttentionCall`: its micro-batch, sequence, heads, window, scale and tiles, sharded
over the run's mesh as the step shards it): a program compiled in a fraction of a second, where
timing whole train steps compiled each candidate's step, which cost a sweep's workers a sixth of
their time. The answer is kept per machine and attention call in ``~/.cache/jaxformer/kernel.json``,
like the matmul peak (`jaxformer.train.peak`) and the sweep layout, so every later run with that
attention (a sweep's other budgets and widths, its relaunches, other workers) reads it instead of
measuring; a worker that meets a call another worker is timing waits for that answer (a lock file
per call).

Candidates: ``naive`` (the reference) and, on a CPU where the kernel builds and the model is in
its scope (no ALiBi or T5 bias, no sliding window, heads up to 128 wide), ``fused``; on other backends ``xla``
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
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxformer.configs import to_dict
from jaxformer.files import read_json, write_cache
from jaxformer.functional import attention, fused_attention
from jaxformer.parallel import Layout
from jaxformer.parallel.distributed import exchange, from_process_0
from jaxformer.parallel.rules import spec_for
from jaxformer.runtime import compile_program
from jaxformer.train.config import TrainConfig
from jaxformer.train.peak import machine_key

KERNEL_FILE = Path("~/.cache/jaxformer/kernel.json").expanduser()
MARGIN = 0.03  # a candidate must be this much faster than naive (a fraction of naive's attention time)
CALLS, REPEATS = 5, 5  # timed calls per repeat, alternating repeats per candidate (medians)


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """What ``auto`` became: the implementation, where the answer came from, and the timings behind it.

    source: ``measured`` (timed by this run), ``cache`` (read from `KERNEL_FILE`), ``only`` (one
    candidate, nothing to time) or ``set`` (the config named an implementation). call_s: seconds
    per attention call, forward and backward, of each candidate timed (median of `REPEATS`).
    """

    attention_impl: str
    source: str
    call_s: dict[str, float] = dataclasses.field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0  # spent choosing: compiling and timing the candidates

    def to_record(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """The self-attention call every layer of a run makes: ``q [B, T, H, D]``, ``k, v [B, T, K, D]``, causal.

    batch: sequences per micro-batch over the whole mesh; window, scale: the model's; block_size,
    query_block_size: the kernel config's tiles.
    """

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    scale: float | None
    block_size: int
    query_block_size: int | None

    @classmethod
    def of(cls, config: TrainConfig) -> AttentionCall:
        model, kernel = config.model, config.kernel
        return cls(config.micro_batch, config.train.seq_len, model.num_heads, model.num_kv_heads, model.head_dim,
                   model.sliding_window, model.attention_scale, kernel.attention_block_size,
                   kernel.attention_query_block_size)


def candidates(config: TrainConfig) -> tuple[list[str], str]:
    """``(implementations worth timing, why fused is not among them)`` for this run on this process's backend."""
    if jax.default_backend() != "cpu":
        return ["naive", "xla"], "not a CPU backend: fused is CPU-only"
    if config.model.position in ("alibi", "relative_bias"):
        return ["naive"], f"fused has no attention bias (model.position={config.model.position})"
    if config.model.sliding_window is not None:
        return ["naive"], f"fused has no sliding window (model.sliding_window={config.model.sliding_window})"
    if config.model.head_dim > fused_attention.MAX_HEAD_DIM:
        return ["naive"], f"fused takes heads up to {fused_attention.MAX_HEAD_DIM} wide (head_dim {config.model.head_dim})"
    if not fused_attention.fused_available():
        return ["naive"], f"the fused kernel is unavailable: {fused_attention.unavailable_reason()}"
    return ["naive", "fused"], ""


def call_key(config: TrainConfig) -> str:
    """What the choice depends on: the machine (`machine_key`), the mesh and the attention call — not the rest
    of the model, the seed, the learning rate or the run's length."""
    program = {"attention": dataclasses.asdict(AttentionCall.of(config)), "parallel": to_dict(config.parallel)}
    digest = hashlib.sha256(json.dumps(program, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{machine_key(config.train.compute_dtype)} | {digest}"


def fastest(call_s: dict[str, float], margin: float = MARGIN) -> str:
    """The implementation to train with: the fastest, unless it beats ``naive`` by less than ``margin``."""
    best = min(call_s, key=call_s.get)
    if "naive" in call_s and call_s[best] > (1 - margin) * call_s["naive"]:
        return "naive"
    return best


def attention_programs(config: TrainConfig, impls: list[str]) -> tuple[dict, tuple]:
    """``({impl: jitted (q, k, v, cotangent) → gradients of q, k, v}, those inputs)``: the run's attention call,
    forward and backward, by each implementation, as the train step computes it (on the run's mesh, batch and
    heads sharded as the step's rules shard them). One layout and one set of inputs serve every candidate."""
    call = AttentionCall.of(config)
    layout = Layout.for_run(config.parallel, config.model, config.micro_batch)
    shapes = {"q": (call.batch, call.seq_len, call.heads, call.head_dim),
              "kv": (call.batch, call.seq_len, call.kv_heads, call.head_dim)}
    heads = {"q": "heads", "kv": "kv_heads"}
    shardings = {name: NamedSharding(layout.mesh, spec_for(("batch", None, heads[name], None), shape, layout.mesh,
                                                           layout.rules)) for name, shape in shapes.items()}
    rng = np.random.default_rng(0)
    dtype = jnp.dtype(config.train.compute_dtype)  # the step casts q, k, v to its compute dtype
    inputs = tuple(jax.device_put(rng.standard_normal(shapes[name], np.float32).astype(dtype), shardings[name])
                   for name in ("q", "kv", "kv", "q"))
    grads = (shardings["q"], shardings["kv"], shardings["kv"])

    def program(impl: str):
        options = with_impl(config, impl).kernel.attention_options()

        def forward_backward(q, k, v, cotangent):
            _, pullback = jax.vjp(lambda q, k, v: attention(q, k, v, causal=True, window=call.window,
                                                            scale=call.scale, **options), q, k, v)
            return pullback(cotangent)

        return jax.jit(forward_backward, in_shardings=(*grads, shardings["q"]), out_shardings=grads)

    return {impl: program(impl) for impl in impls}, inputs


def measure(config: TrainConfig, impls: list[str], calls: int = CALLS, repeats: int = REPEATS) -> dict[str, float]:
    """Seconds per attention call (forward and backward) of ``config`` with each implementation, in alternating
    repeats after one call that compiles."""
    programs, inputs = attention_programs(config, impls)
    return time_programs(programs, inputs, calls, repeats)


def time_programs(programs: dict, inputs: tuple, calls: int = CALLS, repeats: int = REPEATS) -> dict[str, float]:
    """Median seconds per call of each candidate program on ``inputs``, compiled as the train step is
    (`compile_program`), in alternating repeats after one untimed call each."""
    programs = {impl: compile_program(program.lower(*inputs)) for impl, program in programs.items()}
    for program in programs.values():
        jax.block_until_ready(program(*inputs))
    times: dict[str, list[float]] = {impl: [] for impl in programs}
    for _ in range(repeats):
        for impl, program in programs.items():
            started = time.perf_counter()
            jax.block_until_ready([program(*inputs) for _ in range(calls)])
            times[impl].append((time.perf_counter() - started) / calls)
    return {impl: statistics.median(values) for impl, values in times.items()}


def with_impl(config: TrainConfig, impl: str) -> TrainConfig:
    return dataclasses.replace(config, kernel=dataclasses.replace(config.kernel, attention_impl=impl))


def choose(config: TrainConfig, path: str | Path | None = None) -> tuple[TrainConfig, KernelChoice]:
    """``(config with a concrete attention_impl, the choice)``; measures and caches when ``auto`` meets a new
    attention call. A config that names an implementation is returned as it is."""
    if config.kernel.attention_impl != "auto":
        return config, KernelChoice(config.kernel.attention_impl, "set")
    impls, reason = on_every_process(*candidates(config))
    impl, source, call_s, seconds = decide(KERNEL_FILE if path is None else Path(path), call_key(config), impls,
                                           lambda: measure(config, impls), fastest, "attention_impl")
    return with_impl(config, impl), KernelChoice(impl, source, call_s, reason, seconds)


def decide(path: Path, key: str, impls: list[str], timed, pick, field: str) -> tuple[str, str, dict[str, float], float]:
    """``(implementation, source, call_s, seconds spent)`` for the call ``key``: the only candidate, this machine's
    cached answer, or ``pick(timed())`` of the seconds per call ``timed()`` measures, cached under ``field``."""
    started = time.perf_counter()
    if len(impls) == 1:
        return impls[0], "only", {}, 0.0
    # a worker that meets a call another is timing waits for its answer; in a multi-process run process 0 alone
    # takes the lock (its peers on the same host would wait for it while it waits for them)
    with _timing_lock(path, key) if jax.process_index() == 0 else contextlib.nullcontext():
        cached = read_json(path).get(key)
        # an entry for other candidates, or one not written by this function (a corrupt file), is measured again
        usable = (isinstance(cached, dict) and cached.get(field) in impls and isinstance(cached.get("call_s"), dict)
                  and set(cached["call_s"]) == set(impls)
                  and all(isinstance(seconds, (int, float)) for seconds in cached["call_s"].values()))
        chosen = from_process_0("kernel-cached", impls.index(cached[field]) if usable else -1)  # process 0's entry
        if chosen >= 0:
            return impls[chosen], "cache", cached["call_s"] if usable else {}, time.perf_counter() - started
        # every process times the same global calls; process 0's timings decide for all
        call_s = timed()
        best = pick(call_s)
        impl = impls[from_process_0("kernel-choice", impls.index(best))]
        cache = read_json(path)  # re-read: another worker may have written meanwhile
        cache[key] = {field: impl, "call_s": call_s, "measured_at": time.time()}
        write_cache(path, cache)
    return impl, "measured", call_s, time.perf_counter() - started


def on_every_process(impls: list[str], reason: str) -> tuple[list[str], str]:
    """``(candidates, why some are not)``: those of ``impls`` that every process has (a host may lack the fused
    kernel), in process 0's order, and ``reason`` or what this process's were left out for."""
    lists = [json.loads(data) for data in exchange("kernel-candidates", json.dumps(impls).encode())]
    common = [impl for impl in lists[0] if all(impl in other for other in lists)]
    dropped = [impl for impl in impls if impl not in common]
    return common, reason or (f"{', '.join(dropped)}: not on every process of the run" if dropped else "")


@contextlib.contextmanager
def _timing_lock(path: Path, key: str) -> Iterator[None]:
    """Holds this machine's lock on timing attention call ``key`` (a file beside the cache); none where it cannot be made."""
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

