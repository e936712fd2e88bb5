"""Timing the real train step: compile time and seconds per step, on random tokens.

The same jitted step `jaxformer train` runs (``make_train_step``, compiled for the run's
device layout ``parallel``), so the sweep planner's estimates and `jaxformer bench train`
measure what a run will actually do.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from jaxformer.accounting import training_flops_per_token
from jaxformer.parallel import Layout
from jaxformer.runtime import compile_program
from jaxformer.train.config import TrainConfig
from jaxformer.train.optimizer import make_optimizer
from jaxformer.train.step import build_state, make_train_step


def random_windows(config: TrainConfig, seed: int = 0) -> np.ndarray:
    """``[grad_accum, micro_batch, seq_len + 1]`` random token windows."""
    shape = (config.train.grad_accum, config.micro_batch, config.train.seq_len + 1)
    return np.random.default_rng(seed).integers(0, config.model.vocab_size, shape, dtype=np.int32)


class TrainStepRunner:
    """The compiled train step of ``config`` with its state, on the run's mesh, ready to be timed.

    ``devices``: how many devices the step runs on (data-parallel by default; ``one_device``: the first
    device alone, which has every core's intra-op threads for its matmuls).
    ``compile_s``: the first call (trace, compile, one step). ``run(steps)`` dispatches
    ``steps`` steps back to back and synchronises once, as the training loop does.
    """

    def __init__(self, config: TrainConfig, *, one_device: bool = False) -> None:
        layout = Layout.for_run(config.parallel, config.model, config.micro_batch,
                                jax.devices()[:1] if one_device else None)
        self.devices = layout.mesh.devices.size
        optimizer = make_optimizer(config.optimizer)
        graphdef, self.state = layout.materialize(lambda: build_state(config.model, config.train.seed, optimizer, config.kernel))
        windows = random_windows(config)
        batch_sharding = layout.batch_sharding(windows.shape, batch_dim=1)
        self.windows = jax.device_put(windows, batch_sharding)
        self.lr = np.float32(config.optimizer.lr)  # the step takes its learning rate as an argument
        self.tokens_per_step = config.tokens_per_step
        self.flops_per_step = training_flops_per_token(config.model, config.train.seq_len, "exact") * self.tokens_per_step
        started = time.perf_counter()
        self.step = compile_program(make_train_step(
            graphdef, optimizer, config.train.compute_dtype, state_sharding=layout.shardings(self.state),
            batch_sharding=batch_sharding).lower(self.state, self.windows, self.lr),
            loop_free=windows.shape[0] == 1)  # as `jaxformer.train.compiled` compiles the run's step
        self.state = jax.block_until_ready(self.step(self.state, self.windows, self.lr))
        self.compile_s = time.perf_counter() - started

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` more steps."""
        started = time.perf_counter()
        for _ in range(steps):
            self.state = self.step(self.state, self.windows, self.lr)
        jax.block_until_ready(self.state)
        return time.perf_counter() - started


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """compile_s: first call; step_s: seconds per later step (median of repeats)."""

    compile_s: float
    step_s: float
    tokens_per_step: int
    flops_per_step: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s


def time_train_step(config: TrainConfig, *, steps: int = 5) -> StepTiming:
    """Compiles ``config``'s train step and times ``steps`` more single steps."""
    runner = TrainStepRunner(config)
    step_s = float(np.median([runner.run(1) for _ in range(steps)]))
    return StepTiming(runner.compile_s, step_s, runner.tokens_per_step, runner.flops_per_step)
