"""A run's ``optimizer`` section and the step counts of its schedule, read without Optax or JAX (the sweep's
planner sizes warmups and cooldowns with them); the schedules and AdamW are `jaxformer.train.optimizer`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from jaxformer.configs import FRACTION, NON_NEGATIVE, POSITIVE, Range, Section, setting


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
    """AdamW with global-norm clipping on a schedule (see `jaxformer.train.optimizer`).

    lr: peak learning rate. schedule: cosine | wsd | constant. warmup_fraction: share of the
    run's steps spent warming up from 0, unless warmup_tokens (tokens, rounded to whole steps)
    is set. final_lr_fraction: the learning rate at the last step, as a fraction of ``lr``
    (cosine and wsd). cooldown_fraction, cooldown_shape: wsd's final decay, as a share of the
    run's steps and its shape. grad_clip: maximum global gradient norm (0 turns clipping off).
    Weight decay skips vectors.
    """

    SECTION = "optimizer"

    lr: float = setting(3e-3, POSITIVE)
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_fraction: float = setting(0.05, Range(0.0, 1.0, high_open=True))
    warmup_tokens: int | None = setting(None, NON_NEGATIVE)
    final_lr_fraction: float = setting(0.1, FRACTION)
    cooldown_fraction: float = setting(0.2, Range(0.0, 1.0, low_open=True))
    cooldown_shape: Literal["linear", "1-sqrt"] = "linear"
    weight_decay: float = setting(0.1, NON_NEGATIVE)
    beta1: float = setting(0.9, Range(0.0, 1.0, high_open=True))
    beta2: float = setting(0.95, Range(0.0, 1.0, high_open=True))
    eps: float = setting(1e-8, POSITIVE)
    grad_clip: float = setting(1.0, NON_NEGATIVE)


def warmup_steps(config: OptimizerConfig, total_steps: int, tokens_per_step: int | None = None) -> int:
    """Updates spent warming up: ``warmup_tokens`` in whole steps, else ``warmup_fraction`` of the run."""
    if config.warmup_tokens is None:
        steps = round(config.warmup_fraction * total_steps)
    elif tokens_per_step is None:
        raise ValueError("optimizer.warmup_tokens needs the run's tokens per step")
    else:
        steps = round(config.warmup_tokens / tokens_per_step)
    return min(steps, total_steps - 1)


def cooldown_steps(config: OptimizerConfig, total_steps: int) -> int:
    """Updates in wsd's final decay: ``cooldown_fraction`` of the run (at least one)."""
    return max(1, round(config.cooldown_fraction * total_steps))


def transformation_settings(config: OptimizerConfig) -> tuple[float, ...]:
    """What `make_optimizer` reads: runs that agree on these share one compiled step (the learning rate
    and its schedule are arguments of each step)."""
    return config.beta1, config.beta2, config.eps, config.weight_decay, config.grad_clip
