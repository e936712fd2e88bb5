"""Timing the real train step: compile time and seconds per step, on random tokens.

The same jitted step `jaxformer train` runs (``make_train_step``), so the sweep planner's
estimates and `jaxformer bench train` measure what a run will actually do.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from jaxformer.accounting import forward_flops_per_token
from jaxformer.models.pure import init_params
from jaxformer.train.config import TrainConfig
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.step import init_state, make_train_step


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """compile_s: first call (trace + compile + one step); step_s: median seconds per later step."""

    compile_s: float
    step_s: float
    tokens_per_step: int
    flops_per_step: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_step / self.step_s


def time_train_step(config: TrainConfig, *, steps: int = 5) -> StepTiming:
    """Compiles ``config``'s train step and times ``steps`` more calls (each synchronised)."""
    graphdef, params = init_params(config.model, config.train.seed)
    optimizer = make_optimizer(config.optimizer, max(config.total_steps, 1))
    state = init_state(params, optimizer)
    step = make_train_step(graphdef, optimizer, config.train.compute_dtype)
    micro = config.train.batch_size // config.train.grad_accum
    rng = np.random.default_rng(0)
    windows = rng.integers(0, config.model.vocab_size, (config.train.grad_accum, micro, config.train.seq_len + 1),
                           dtype=np.int32)
    started = time.perf_counter()
    state = jax.block_until_ready(step(state, windows))
    compile_s = time.perf_counter() - started
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        state = jax.block_until_ready(step(state, windows))
        times.append(time.perf_counter() - started)
    tokens = config.tokens_per_step
    flops = 3.0 * forward_flops_per_token(config.model, config.train.seq_len).total * tokens
    return StepTiming(compile_s=compile_s, step_s=float(np.median(times)), tokens_per_step=tokens, flops_per_step=flops)
