"""``kernel.matmul_impl: auto``: the projections' matmul measured fastest for this run on this machine.

On a CPU, oneDNN's matmul (`jaxformer.functional.onednn_matmul`) reaches the bf16 units that
XLA:CPU's bf16 dot does not, and its fp32 kernels beat XLA:CPU's dot on some shapes; how much that
buys depends on the CPU (its vector width, bf16 instructions, AMX tiles) and on the shapes. So, as
for attention (`jaxformer.train.kernel_choice`), a run that asks for ``auto`` times the candidates on
its own projection, the feed-forward input
``x [B, T, E] · w [E, F]`` forward and backward, sharded over the run's mesh as the step shards it,
and keeps the answer per machine and call in the same cache file, so later runs read it.

Candidates: ``xla`` always; ``onednn`` on a CPU where the kernel builds and oneDNN multiplies the run's
compute dtype (no bf16 matmul on an AVX2-only CPU). The
reference ``xla`` is kept unless oneDNN is at least `kernel_choice.MARGIN` faster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from jaxformer.configs import to_dict
from jaxformer.functional import dense, onednn_matmul
from jaxformer.parallel import Layout
from jaxformer.parallel.rules import spec_for
from jaxformer.train.config import TrainConfig
from jaxformer.train import kernel_choice
from jaxformer.train.kernel_choice import CALLS, MARGIN, REPEATS, KernelChoice, decide, on_every_process, time_programs
from jaxformer.train.kernel_choice import choose as choose_attention
from jaxformer.train.peak import machine_key


@dataclasses.dataclass(frozen=True)
class MatmulChoice:
    """What ``auto`` became (``source`` and ``call_s`` as in `kernel_choice.KernelChoice`; call_s: seconds per
    projection, forward and backward)."""

    matmul_impl: str
    source: str
    call_s: dict[str, float] = dataclasses.field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0

    def to_record(self) -> dict:
        return dataclasses.asdict(self)


def candidates(config: TrainConfig) -> tuple[list[str], str]:
    """``(implementations worth timing, why onednn is not among them)``."""
    if jax.default_backend() != "cpu":
        return ["xla"], "not a CPU backend: onednn is CPU-only"
    reason = onednn_matmul.unsupported_reason(config.train.compute_dtype)
    return (["xla"], reason) if reason else (["xla", "onednn"], "")


def call_key(config: TrainConfig) -> str:
    """The machine, the mesh and the projection's shape: ``(micro-batch, T, E, F)``."""
    program = {"matmul": [config.micro_batch, config.train.seq_len, config.model.d_model, config.model.d_ff],
               "parallel": to_dict(config.parallel)}
    digest = hashlib.sha256(json.dumps(program, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"matmul | {machine_key(config.train.compute_dtype)} | {digest}"


def measure(config: TrainConfig, impls: list[str], calls: int = CALLS, repeats: int = REPEATS) -> dict[str, float]:
    """Seconds per projection call (forward and backward) with each implementation, in alternating repeats."""
    model = config.model
    layout = Layout.for_run(config.parallel, model, config.micro_batch)
    x_shape, w_shape = (config.micro_batch, config.train.seq_len, model.d_model), (model.d_model, model.d_ff)
    x_sharding = NamedSharding(layout.mesh, spec_for(("batch", None, "embed"), x_shape, layout.mesh, layout.rules))
    w_sharding = NamedSharding(layout.mesh, spec_for(("embed", "mlp"), w_shape, layout.mesh, layout.rules))
    rng = np.random.default_rng(0)
    dtype = jnp.dtype(config.train.compute_dtype)
    x = jax.device_put(rng.standard_normal(x_shape, np.float32).astype(dtype), x_sharding)
    w = jax.device_put(rng.standard_normal(w_shape, np.float32).astype(dtype), w_sharding)

    def program(impl: str):
        def forward_backward(x, w):
            y, pullback = jax.vjp(lambda x, w: dense(x, w, impl=impl), x, w)
            return pullback(y)
        return jax.jit(forward_backward, out_shardings=(x_sharding, w_sharding))

    return time_programs({impl: program(impl) for impl in impls}, (x, w), calls, repeats)


def fastest(call_s: dict[str, float]) -> str:
    """``onednn`` only when it beats the reference ``xla`` by at least `MARGIN`."""
    best = min(call_s, key=call_s.get)
    return best if call_s[best] <= (1 - MARGIN) * call_s["xla"] else "xla"


def choose_kernels(config: TrainConfig) -> tuple[TrainConfig, KernelChoice, MatmulChoice]:
    """Both ``auto`` choices of a run: attention (`kernel_choice.choose`), then the projections' matmul."""
    config, kernel_choice = choose_attention(config)
    config, matmul_choice = choose(config)
    return config, kernel_choice, matmul_choice


def choose(config: TrainConfig, path: str | Path | None = None) -> tuple[TrainConfig, MatmulChoice]:
    """``(config with a concrete matmul_impl, the choice)``; a config that names one is returned as it is."""
    if config.kernel.matmul_impl != "auto":
        return config, MatmulChoice(config.kernel.matmul_impl, "set")
    impls, reason = on_every_process(*candidates(config))
    path = kernel_choice.KERNEL_FILE if path is None else Path(path)
    impl, source, call_s, seconds = decide(path, call_key(config), impls, lambda: measure(config, impls), fastest,
                                           "matmul_impl")
    chosen = dataclasses.replace(config, kernel=dataclasses.replace(config.kernel, matmul_impl=impl))
    return chosen, MatmulChoice(impl, source, call_s, reason, seconds)
